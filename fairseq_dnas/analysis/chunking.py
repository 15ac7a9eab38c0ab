"""CoNLL-2000 chunking as a probe of what an encoder's states hold (Kinley
2020, section 6.2, Table 6.4): a linear classifier (multinomial logistic
regression) on frozen per-word states, scored with conlleval's chunk F1, next
to the majority-chunk-tag-per-POS baseline.

Pure functions over lists and tensors (torch only); the driver that extracts
states from a trained model lives with the experiments (examples/discrete/).

Chunk F1 follows the ``conlleval`` script of the CoNLL shared tasks: a chunk
starts at ``B-X``, at ``I-X`` after a tag of another type or after ``O`` (an
IOB1-style start, counted as a chunk as conlleval does), and ends before the
next start or ``O``; a predicted chunk is correct when its type, first and
last word equal a gold chunk's. Precision, recall and F1 are in percent.
"""

from collections import Counter, defaultdict
from typing import Dict, List, Sequence, Tuple

import torch

Sentence = List[Tuple[str, str, str]]  # (word, POS, chunk tag) a token


def read_conll(path: str) -> List[Sentence]:
    """Sentences of a CoNLL-2000 file (``word POS chunk`` a line, a blank line
    after each sentence). A line with another number of fields raises
    ValueError naming the file and line."""
    sentences, current = [], []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields:
                if current:
                    sentences.append(current)
                    current = []
                continue
            if len(fields) != 3:
                raise ValueError(f"{path}:{number}: expected 'word POS chunk', got {line.strip()!r}")
            current.append((fields[0], fields[1], fields[2]))
    if current:
        sentences.append(current)
    return sentences


def _split(tag: str) -> Tuple[str, str]:
    """('B' | 'I' | 'O', type)."""
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def chunks(tags: Sequence[str]) -> List[Tuple[str, int, int]]:
    """The chunks (type, first, last) of one sentence's tags, as conlleval reads them."""
    found, start, kind = [], None, ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, this = _split(tag)
        starts = prefix == "B" or (prefix == "I" and (start is None or this != kind))
        if start is not None and (prefix == "O" or starts):
            found.append((kind, start, i - 1))
            start = None
        if starts:
            start, kind = i, this
    return found


def chunk_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> Dict[str, float]:
    """Token accuracy and chunk precision, recall, F1 (percent) over sentences."""
    correct = n_pred = n_gold = right_tokens = tokens = 0
    for g, p in zip(gold, predicted, strict=True):
        if len(g) != len(p):
            raise ValueError(f"a sentence has {len(g)} gold tags and {len(p)} predicted")
        gc, pc = set(chunks(g)), set(chunks(p))
        correct += len(gc & pc)
        n_pred += len(pc)
        n_gold += len(gc)
        right_tokens += sum(a == b for a, b in zip(g, p))
        tokens += len(g)
    precision = 100.0 * correct / n_pred if n_pred else 0.0
    recall = 100.0 * correct / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return dict(accuracy=100.0 * right_tokens / tokens if tokens else 0.0,
                precision=precision, recall=recall, f1=f1)


def majority_per_pos(train: List[Sentence], test: List[Sentence]) -> List[List[str]]:
    """The baseline: each word gets the chunk tag most frequent for its POS tag
    in ``train`` (ties: the tag first seen; an unseen POS: the most frequent tag overall)."""
    by_pos: Dict[str, Counter] = defaultdict(Counter)
    overall: Counter = Counter()
    for sentence in train:
        for _, pos, tag in sentence:
            by_pos[pos][tag] += 1
            overall[tag] += 1
    fallback = overall.most_common(1)[0][0]
    best = {pos: counts.most_common(1)[0][0] for pos, counts in by_pos.items()}
    return [[best.get(pos, fallback) for _, pos, _ in sentence] for sentence in test]


def first_pieces(words: Sequence[str], encode_word) -> Tuple[List[str], List[int]]:
    """The word pieces of a tokenized sentence and the index of each word's
    first piece (the thesis's probe reads "the vectors from the first token"
    of a word broken into several). ``encode_word(word)`` gives one word's
    pieces; encoding word by word keeps the boundaries exact (SentencePiece
    splits at whitespace, so the pieces equal those of the whole line)."""
    pieces, first = [], []
    for word in words:
        parts = encode_word(word)
        if not parts:
            raise ValueError(f"the word {word!r} encodes to no piece")
        first.append(len(pieces))
        pieces.extend(parts)
    return pieces, first


def train_probe(features: torch.Tensor, labels: torch.Tensor, classes: int, *, l2: float = 1e-4,
                max_iter: int = 200) -> torch.nn.Linear:
    """Multinomial logistic regression on frozen ``features`` (N, D): a linear
    layer fitted with L-BFGS to the mean cross-entropy plus ``l2`` times the
    squared weights (bias not penalized), in float64 for a deterministic
    optimum. Features are used as given (standardize before if needed)."""
    x = features.double()
    probe = torch.nn.Linear(x.shape[1], classes).double()
    torch.nn.init.zeros_(probe.weight)
    torch.nn.init.zeros_(probe.bias)
    opt = torch.optim.LBFGS(probe.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(probe(x), labels) + l2 * probe.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return probe
