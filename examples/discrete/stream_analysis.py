#!/usr/bin/env python
"""What each stream learns (J. Kinley 2020, section 6.2: Table 6.4, Figure
6.2, Table 6.3), from English -> German translation models' encoders:

1. the CoNLL-2000 chunking probe: a linear classifier (multinomial logistic
   regression, ``fairseq_dnas.analysis.chunking.train_probe``) on the frozen
   final encoder states of each word's first piece, one per model and stream
   (a single-stream encoder has one, a two-stream encoder its model stream
   and its controller), scored with conlleval's chunk F1 next to the
   majority-chunk-tag-per-POS baseline;
2. a t-SNE picture (scikit-learn's, installed as one of fairseq's runtime
   requirements) of those states for test-set words of eight frequent POS
   tags (the thesis's legend), one panel per model and stream;
3. the nearest neighbours (cosine) of a few words among the word types'
   mean states over the CoNLL-2000 text.

    python examples/discrete/stream_analysis.py --conll CONLL2000_DIR --data BIN --spm sp.model \\
        --out OUT NAME=CHECKPOINT [NAME=CHECKPOINT ...] [--max-train-words 60000] [--tsne-words 1500]
        [--neighbours slightly,company,said] [--pictures-of NAME[,NAME]]

Writes OUT/probe.jsonl (one line per model and stream: accuracy, precision,
recall, F1), OUT/table.md, and, for the models named by --pictures-of (default:
every model), OUT/tsne.png and OUT/neighbours.md. The encoder reads each
CoNLL sentence as the translation models read English: SentencePiece pieces
and </s>. Bad input stops with one line and exit status 1.
"""

import argparse
import itertools
import json
import os
import sys

from fairseq_dnas.commands.sentence_classify import BadInput, exit_status
from fairseq_dnas.commands.translation_faithfulness import load as load_translation

# The POS tags of the thesis's Figure 6.2 legend.
POS_TAGS = ("NN", "NNS", "NNP", "JJ", "RB", "VB", "VBG", "VBN")


def streams_of(model):
    """('encoder',) for a single-stream encoder, ('model', 'controller') for a two-stream one."""
    from fairseq_dnas.modules.two_stream import TwoStreamEncoder

    return ("model", "controller") if isinstance(model.encoder, TwoStreamEncoder) else ("encoder",)


def word_states(model, dictionary, sentences, encode_word, batch=64):
    """{stream: list per sentence of (words, D) final encoder states at each
    word's first piece}. Unknown pieces map to <unk>, as fairseq does."""
    import torch
    from fairseq.data import data_utils

    from fairseq_dnas.analysis.chunking import first_pieces

    out = {s: [] for s in streams_of(model)}
    for start in range(0, len(sentences), batch):
        rows, firsts = [], []
        for sentence in sentences[start:start + batch]:
            pieces, first = first_pieces([w for w, _, _ in sentence], encode_word)
            rows.append(torch.tensor([dictionary.index(p) for p in pieces] + [dictionary.eos()]))
            firsts.append(first)
        src = data_utils.collate_tokens(rows, dictionary.pad(), dictionary.eos(), left_pad=False)
        lengths = torch.tensor([len(r) for r in rows])
        with torch.no_grad():
            enc = model.encoder(src, lengths)
        named = {"encoder": enc["encoder_out"][0], "model": enc["encoder_out"][0],
                 "controller": enc.get("controller_out", [None])[0]}
        for stream in out:
            states = named[stream].transpose(0, 1)  # B x T x C
            for b, first in enumerate(firsts):
                out[stream].append(states[b, first].float())
    return out


def probe_scores(train_feats, train_sents, test_feats, test_sents, tags, max_train_words):
    """Chunk scores of a probe trained on the first ``max_train_words`` train words."""
    import torch

    from fairseq_dnas.analysis.chunking import chunk_scores, train_probe

    x = torch.cat(train_feats)
    y = torch.tensor([tags.index(t) for s in train_sents for _, _, t in s])
    if max_train_words:
        x, y = x[:max_train_words], y[:max_train_words]
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)  # standardized with the training words' statistics
    probe = train_probe((x - mean) / std, y, len(tags))
    predicted = []
    with torch.no_grad():
        for feats in test_feats:
            predicted.append([tags[i] for i in probe(((feats - mean) / std).double()).argmax(-1).tolist()])
    gold = [[t for _, _, t in s] for s in test_sents]
    return chunk_scores(gold, predicted)


def tsne_panels(panels, test_sents, n_words, path, seed=1):
    """One t-SNE panel per (name, states of the test sentences): the first
    ``n_words`` test words whose POS is in POS_TAGS, coloured by POS."""
    import matplotlib
    import numpy as np
    import torch
    from sklearn.manifold import TSNE

    matplotlib.use("Agg")
    import logging

    import matplotlib.pyplot as plt

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging lets its font search through

    where = [(i, j, pos) for i, s in enumerate(test_sents) for j, (_, pos, _) in enumerate(s) if pos in POS_TAGS]
    where = where[:n_words]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, (name, states) in zip(axes[0], panels):
        x = torch.stack([states[i][j] for i, j, _ in where]).numpy().astype(np.float64)
        perplexity = min(30.0, max(2.0, (len(x) - 1) / 3))  # sklearn needs perplexity < samples
        xy = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity).fit_transform(x)
        for k, tag in enumerate(POS_TAGS):
            m = np.array([pos == tag for _, _, pos in where])
            ax.scatter(xy[m, 0], xy[m, 1], s=4, color=colours(k), label=tag)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(markerscale=3, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"t-SNE of final encoder states, {len(where)} CoNLL-2000 test words, coloured by POS")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def neighbours(states, sentences, queries, k=10, min_count=5):
    """{query: its k nearest word types by cosine of mean states} over the
    types seen at least ``min_count`` times (a query seen less: absent)."""
    import torch

    sums, counts = {}, {}
    for feats, sentence in zip(states, sentences):
        for vec, (word, _, _) in zip(feats, sentence):
            w = word.lower()
            sums[w] = sums.get(w, 0) + vec
            counts[w] = counts.get(w, 0) + 1
    words = [w for w in sums if counts[w] >= min_count]
    matrix = torch.nn.functional.normalize(torch.stack([sums[w] / counts[w] for w in words]), dim=-1)
    out = {}
    for q in queries:
        if q not in words:
            continue
        sim = matrix @ matrix[words.index(q)]
        order = sim.argsort(descending=True).tolist()
        out[q] = [words[i] for i in order if words[i] != q][:k]
    return out


def run(args):
    import sentencepiece as spm
    import torch

    from fairseq_dnas.analysis.chunking import chunk_scores, majority_per_pos, read_conll
    from fairseq_dnas.analysis.files import atomic_path

    for name in ("train.txt", "test.txt"):
        if not os.path.isfile(os.path.join(args.conll, name)):
            raise BadInput(f"--conll {args.conll}: no {name} (give the CoNLL-2000 folder)")
    if not os.path.isfile(args.spm):
        raise BadInput(f"--spm {args.spm}: no such file (the translation data's SentencePiece model)")
    models = []
    for item in args.models:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"{item!r}: give models as NAME=CHECKPOINT")
        if not os.path.isfile(path):
            raise BadInput(f"{path}: no such file")
        models.append((name, path))
    pictures = set(args.pictures_of.split(",")) if args.pictures_of else {n for n, _ in models}
    unknown = pictures - {n for n, _ in models}
    if unknown:
        raise BadInput(f"--pictures-of {','.join(sorted(unknown))}: not among the models given")
    try:
        train, test = (read_conll(os.path.join(args.conll, f)) for f in ("train.txt", "test.txt"))
    except ValueError as err:
        raise BadInput(str(err)) from None
    tags = sorted({t for s in train + test for _, _, t in s})
    if args.max_train_words:  # the sentences that hold the first N training words
        total = list(itertools.accumulate(len(s) for s in train))
        train = train[:next((i + 1 for i, n in enumerate(total) if n >= args.max_train_words), len(train))]
    sp = spm.SentencePieceProcessor(model_file=args.spm)
    encode_word = lambda w: sp.encode(w, out_type=str)  # noqa: E731
    rows = [{"model": "baseline", "stream": "-", **chunk_scores([[t for _, _, t in s] for s in test],
                                                                majority_per_pos(train, test))}]
    panels, neighbour_rows = [], []
    for name, path in models:
        model, task = load_translation(path, args.data)
        print(f"[stream_analysis] {name}: encoding {len(train)} + {len(test)} sentences", file=sys.stderr, flush=True)
        d = task.source_dictionary
        train_states = word_states(model, d, train, encode_word)
        test_states = word_states(model, d, test, encode_word)
        for stream in streams_of(model):
            scores = probe_scores(train_states[stream], train, test_states[stream], test, tags, args.max_train_words)
            rows.append({"model": name, "stream": stream, "checkpoint": path, **scores})
            print(f"[stream_analysis] {name} {stream}: accuracy {scores['accuracy']:.2f}, F1 {scores['f1']:.2f}",
                  file=sys.stderr, flush=True)
            if name in pictures:
                label = name if stream == "encoder" else f"{name} {stream}"
                panels.append((label, test_states[stream]))
                found = neighbours(train_states[stream] + test_states[stream], train + test, args.neighbours)
                neighbour_rows.append((label, found))
    os.makedirs(args.out, exist_ok=True)
    with atomic_path(os.path.join(args.out, "probe.jsonl")) as tmp:
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    lines = ["| model | stream | accuracy | precision | recall | F1 |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['model']} | {r['stream']} | {r['accuracy']:.2f} | {r['precision']:.2f} | {r['recall']:.2f} | "
              f"{r['f1']:.2f} |" for r in rows]
    with atomic_path(os.path.join(args.out, "table.md")) as tmp:
        open(tmp, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if panels:
        with atomic_path(os.path.join(args.out, "tsne.png")) as tmp:
            tsne_panels(panels, test, args.tsne_words, tmp)
        md = ["| model | word | nearest neighbours (cosine of mean final states) |", "| --- | --- | --- |"]
        for label, found in neighbour_rows:
            md += [f"| {label} | {q} | {', '.join(ns)} |" for q, ns in found.items()]
        with atomic_path(os.path.join(args.out, "neighbours.md")) as tmp:
            open(tmp, "w").write("\n".join(md) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", help="NAME=CHECKPOINT of English-source translation models")
    p.add_argument("--conll", required=True, help="CoNLL-2000 folder (train.txt, test.txt)")
    p.add_argument("--data", required=True, help="the translation models' fairseq-preprocess folder")
    p.add_argument("--spm", required=True, help="their SentencePiece model")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--max-train-words", type=int, default=60000,
                   help="probe training words (the first N of train.txt; 0: all 211,727)")
    p.add_argument("--tsne-words", type=int, default=1500)
    p.add_argument("--neighbours", type=lambda s: s.split(","), default="slightly,company,said,quickly,new")
    p.add_argument("--pictures-of", help="models (comma-separated) for the t-SNE picture and neighbours")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(max(args.threads, 1))
    return exit_status("stream_analysis", run, args)


if __name__ == "__main__":
    sys.exit(main())
