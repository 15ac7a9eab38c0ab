#!/usr/bin/env python
"""What each stream learns (J. Kinley 2020, section 6.2: Table 6.4, Figure
6.2, Table 6.3), from English -> German translation models' encoders:

1. the CoNLL-2000 chunking probe: a linear classifier (multinomial logistic
   regression, ``fairseq_dnas.analysis.chunking.train_probe``) on the frozen
   final encoder states of each word's first piece, one per model and stream
   (a single-stream encoder has one, a two-stream encoder its model stream
   and its controller), scored with conlleval's chunk F1 next to the
   majority-chunk-tag-per-POS baseline;
2. Figure 6.2 and Table 6.3 as the thesis draws them, from the learned word
   embeddings of each stream (the embedding view), and the same two from
   the final encoder states (the final-state view):

   - embedding view: each stream's encoder token table (``embed_tokens``;
     the controller's own ``controller_embed_tokens``; with
     ``--share-stream-embeddings`` both streams read one table, and the
     outputs say so instead of drawing it twice). The token table alone is
     "the embedding": the thesis compares word embeddings, positions are
     the same for every word, the embedding LayerNorm would mix position
     into the word's vector, and fairseq's scale sqrt(D) changes no cosine.
     A word's vector is the mean of its SentencePiece pieces' rows
     (``--embedding-word mean``, the default) or its first piece's row
     (``first``, the thesis's rule for the probe). The thesis does not say
     which for its embeddings; with its WMT vocabulary the frequent words
     are one piece, where both agree, while with a small vocabulary the
     first piece gives every word that starts with the same piece the same
     vector (cosine 1). Words with an unknown piece are left out. Word types
     are case-sensitive (the thesis's list holds both "light" and "Light"),
     over the whole CoNLL-2000 text; a type's POS is its most frequent one.
     The picture: the ``--tsne-words`` most frequent types whose POS is one
     of the eight of the thesis's legend; the neighbours: the 10 nearest
     types (cosine) seen at least 5 times;
   - final-state view: t-SNE of the final states of the first
     ``--tsne-words`` test words of those POS tags, and the nearest word
     types (lowercased) by cosine of their mean states over the CoNLL-2000
     text the probe encodes.

   t-SNE is scikit-learn's (installed as one of fairseq's runtime
   requirements), one panel per model and stream.

    python examples/discrete/stream_analysis.py --conll CONLL2000_DIR --data BIN --spm sp.model \\
        --out OUT NAME=CHECKPOINT [NAME=CHECKPOINT ...] [--max-train-words 60000] [--tsne-words 1500]
        [--neighbours slightly,company,said] [--pictures-of NAME[,NAME]] [--embedding-word mean|first]

Writes OUT/probe.jsonl (one line per model and stream: accuracy, precision,
recall, F1), OUT/table.md, and, for the models named by --pictures-of (default:
every model): the embedding view OUT/tsne-embeddings.png and
OUT/neighbours-embeddings.md, the final-state view OUT/tsne.png and
OUT/neighbours.md, and OUT/table63.md, both views' neighbours side by side.
The encoder reads each CoNLL sentence as the translation models read
English: SentencePiece pieces and </s>. Bad input stops with one line and
exit status 1.
"""

import argparse
import itertools
import json
import os
import sys
import textwrap

from fairseq_dnas.commands.sentence_classify import BadInput, exit_status
from fairseq_dnas.commands.translation_faithfulness import load as load_translation

# The POS tags of the thesis's Figure 6.2 legend.
POS_TAGS = ("NN", "NNS", "NNP", "JJ", "RB", "VB", "VBG", "VBN")
# The embedding view's neighbours are word types seen at least this often in CoNLL-2000.
EMBEDDING_MIN_COUNT = 5


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


def tsne_picture(panels, title, path, seed=1):
    """One t-SNE panel per (name, (N, D) points, their N POS tags), each
    point coloured by its tag (one of POS_TAGS)."""
    import matplotlib
    import numpy as np
    from sklearn.manifold import TSNE

    matplotlib.use("Agg")
    import logging

    import matplotlib.pyplot as plt

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging lets its font search through

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.4), squeeze=False)
    colours = plt.get_cmap("tab10")
    for ax, (name, points, pos) in zip(axes[0], panels):
        x, tags = np.asarray(points, dtype=np.float64), np.array(pos)
        perplexity = min(30.0, max(2.0, (len(x) - 1) / 3))  # sklearn needs perplexity < samples
        xy = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity).fit_transform(x)
        for k, tag in enumerate(POS_TAGS):
            m = tags == tag
            ax.scatter(xy[m, 0], xy[m, 1], s=4, color=colours(k), label=tag)
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(markerscale=3, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(textwrap.fill(title, 60 * len(panels)), fontsize=9)  # fits the panels' width
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tsne_panels(panels, test_sents, n_words, path, seed=1):
    """The final-state view's picture: one t-SNE panel per (name, states of
    the test sentences): the first ``n_words`` test words whose POS is in
    POS_TAGS, coloured by POS."""
    import torch

    where = [(i, j, pos) for i, s in enumerate(test_sents) for j, (_, pos, _) in enumerate(s) if pos in POS_TAGS]
    where = where[:n_words]
    pos = [p for _, _, p in where]
    points = [(name, torch.stack([states[i][j] for i, j, _ in where]).numpy(), pos) for name, states in panels]
    tsne_picture(points, f"t-SNE of final encoder states, {len(where)} CoNLL-2000 test words, coloured by POS",
                 path, seed)


def nearest(matrix, words, queries, k=10):
    """{query: the k rows of ``matrix`` (N, D), named by ``words``, of the
    highest cosine with the query's row, the query itself left out}; a query
    not among ``words`` is absent. Ties keep the order of ``words``."""
    import torch

    unit = torch.nn.functional.normalize(matrix.double(), dim=-1)  # cos(a, b) = a.b / (|a| |b|)
    out = {}
    for q in queries:
        if q not in words:
            continue
        sim = unit @ unit[words.index(q)]
        order = torch.sort(sim, descending=True, stable=True).indices.tolist()
        out[q] = [words[i] for i in order if words[i] != q][:k]
    return out


def neighbours(states, sentences, queries, k=10, min_count=5):
    """{query: its k nearest word types by cosine of mean states} over the
    types (lowercased) seen at least ``min_count`` times (a query seen less:
    absent)."""
    import torch

    sums, counts = {}, {}
    for feats, sentence in zip(states, sentences):
        for vec, (word, _, _) in zip(feats, sentence):
            w = word.lower()
            sums[w] = sums.get(w, 0) + vec
            counts[w] = counts.get(w, 0) + 1
    words = [w for w in sums if counts[w] >= min_count]
    if not words:
        return {}
    return nearest(torch.stack([sums[w] / counts[w] for w in words]), words, queries, k)


# --- the embedding view --------------------------------------------------------


def word_types(sentences):
    """{word: (count, its most frequent POS)} over CoNLL sentences, case
    kept, most frequent word first (ties: first seen first); a POS tie goes
    to the tag seen first."""
    from collections import Counter

    counts, tags = Counter(), {}
    for sentence in sentences:
        for word, pos, _ in sentence:
            counts[word] += 1
            tags.setdefault(word, Counter())[pos] += 1
    return {w: (n, tags[w].most_common(1)[0][0]) for w, n in counts.most_common()}


def word_vector(table, ids, how="mean"):
    """A word's vector from the token table (V, D) and its pieces' ids:
    ``first``: the first piece's row E[i_1] (the thesis's rule for words split
    into several tokens, section 6.2); ``mean``: (1/n) sum_j E[i_j]."""
    if not len(ids):
        raise ValueError("a word has no piece")
    if how == "first":
        return table[ids[0]]
    if how == "mean":
        return table[list(ids)].mean(0)
    raise ValueError(f"how={how!r}: give 'first' or 'mean'")


def embedding_tables(model):
    """[(stream, its encoder token table (V, D))]: ('encoder', E) for a
    single-stream encoder; ('model', E), ('controller', E_c) for a two-stream
    one with its own controller table; ('shared', E) when both streams read
    one table (``--share-stream-embeddings``, or a controller table that is
    the model stream's)."""
    enc = model.encoder
    if streams_of(model) == ("encoder",):
        return [("encoder", enc.embed_tokens.weight.detach())]
    own = getattr(enc, "controller_embed_tokens", None)
    if own is None or own.weight is enc.embed_tokens.weight:
        return [("shared", enc.embed_tokens.weight.detach())]
    return [("model", enc.embed_tokens.weight.detach()), ("controller", own.weight.detach())]


def embedding_words(types, dictionary, encode_word):
    """[(word, its pieces' ids)] of the word types whose pieces are all in
    ``dictionary`` (a word with an unknown piece would be <unk>'s row), in
    the order of ``types``."""
    out = []
    for word in types:
        ids = [dictionary.index(p) for p in encode_word(word)]
        if ids and dictionary.unk() not in ids:
            out.append((word, ids))
    return out


def embedding_matrix(table, words, how):
    """(N, D) float64: one row per (word, ids) of ``words``, by ``word_vector``."""
    import torch

    return torch.stack([word_vector(table.double(), ids, how) for _, ids in words])


def stream_label(name, stream):
    """A panel's and a table row's name for ``name``'s ``stream``."""
    return {"encoder": name, "shared": f"{name} model = controller (one shared table)"}.get(stream, f"{name} {stream}")


def embedding_view(name, model, dictionary, types, encode_word, args):
    """[(stream, t-SNE points (N, D), their POS, {query: neighbours})] of
    ``model``'s encoder token tables (one for a shared table) over the word
    ``types`` (``word_types``) whose pieces ``dictionary`` knows."""
    words = embedding_words(types, dictionary, encode_word)
    shown = [(w, ids) for w, ids in words if types[w][1] in POS_TAGS][:args.tsne_words]
    candidates = [(w, ids) for w, ids in words if types[w][0] >= EMBEDDING_MIN_COUNT]
    if len(shown) < 5 or not candidates:
        raise BadInput(f"{name}: only {len(words)} CoNLL-2000 word types have all their pieces in the model's "
                       "dictionary; give --spm the SentencePiece model of the data the model was trained on")
    print(f"[stream_analysis] {name}: embeddings of {len(words)} CoNLL-2000 word types with known pieces "
          f"({sum(len(ids) == 1 for _, ids in words)} of one piece), {len(candidates)} seen "
          f">= {EMBEDDING_MIN_COUNT} times", file=sys.stderr, flush=True)
    out = []
    for stream, table in embedding_tables(model):
        out.append((stream, embedding_matrix(table, shown, args.embedding_word).numpy(),
                    [types[w][1] for w, _ in shown],
                    nearest(embedding_matrix(table, candidates, args.embedding_word), [w for w, _ in candidates],
                            args.neighbours)))
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
    train_all = train
    tags = sorted({t for s in train + test for _, _, t in s})
    if args.max_train_words:  # the sentences that hold the first N training words
        total = list(itertools.accumulate(len(s) for s in train))
        train = train[:next((i + 1 for i, n in enumerate(total) if n >= args.max_train_words), len(train))]
    sp = spm.SentencePieceProcessor(model_file=args.spm)
    encode_word = lambda w: sp.encode(w, out_type=str)  # noqa: E731
    rows = [{"model": "baseline", "stream": "-", **chunk_scores([[t for _, _, t in s] for s in test],
                                                                majority_per_pos(train, test))}]
    types = word_types(train_all + test)  # the embedding view: the whole CoNLL-2000 text
    panels, neighbour_rows, final_found = [], [], {}
    embedding_panels, embedding_found, stream_rows = [], {}, []
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
                label = stream_label(name, stream)
                panels.append((label, test_states[stream]))
                found = neighbours(train_states[stream] + test_states[stream], train + test, args.neighbours)
                neighbour_rows.append((label, found))
                final_found[name, stream] = found
                stream_rows.append((name, stream))
        if name in pictures:
            for stream, points, pos, found in embedding_view(name, model, d, types, encode_word, args):
                embedding_panels.append((stream_label(name, stream), points, pos))
                embedding_found[name, stream] = found
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
    if not panels:
        return
    word_rule = {"mean": "the mean of its pieces' rows", "first": "its first piece's row"}[args.embedding_word]
    with atomic_path(os.path.join(args.out, "tsne.png")) as tmp:
        tsne_panels(panels, test, args.tsne_words, tmp)
    with atomic_path(os.path.join(args.out, "tsne-embeddings.png")) as tmp:
        tsne_picture(embedding_panels, f"t-SNE of encoder token embeddings, {len(embedding_panels[0][1])} frequent "
                     f"CoNLL-2000 word types (a word: {word_rule}), coloured by POS", tmp)
    md = ["| model | word | nearest neighbours (cosine of mean final states) |", "| --- | --- | --- |"]
    for label, found in neighbour_rows:
        md += [f"| {label} | {q} | {', '.join(ns)} |" for q, ns in found.items()]
    with atomic_path(os.path.join(args.out, "neighbours.md")) as tmp:
        open(tmp, "w").write("\n".join(md) + "\n")
    md = ["| model | word | nearest neighbours (cosine of token embeddings) |", "| --- | --- | --- |"]
    for (name, stream), found in embedding_found.items():
        md += [f"| {stream_label(name, stream)} | {q} | {', '.join(ns)} |" for q, ns in found.items()]
    with atomic_path(os.path.join(args.out, "neighbours-embeddings.md")) as tmp:
        open(tmp, "w").write("\n".join(md) + "\n")
    with atomic_path(os.path.join(args.out, "table63.md")) as tmp:
        open(tmp, "w").write(table63(args.neighbours, stream_rows, embedding_found, final_found, word_rule))


def table63(queries, stream_rows, embedding_found, final_found, word_rule):
    """Table 6.3's form, both views side by side: for each query word and each
    (model, stream), its nearest neighbours among the token embeddings and
    among the mean final states; a stream that shares its table says so."""
    lines = [
        "Nearest neighbours (cosine) of each word, per model and encoder stream: from the token embeddings "
        f"(the thesis's Table 6.3; a word: {word_rule}; case-sensitive CoNLL-2000 word types seen at least "
        f"{EMBEDDING_MIN_COUNT} times; picture: tsne-embeddings.png) and from the final encoder states (mean over the "
        "CoNLL-2000 text, lowercased types; picture: tsne.png). '-': the word is not among those types.",
        "",
        "| word | model | stream | token embeddings | final states |",
        "| --- | --- | --- | --- | --- |",
    ]
    for q in queries:
        for name, stream in stream_rows:
            if (name, "shared") in embedding_found:
                found = embedding_found[name, "shared"].get(q)
                emb = ("= the model stream's (one shared table)" if stream == "controller"
                       else ", ".join(found) + " (one table for both streams)" if found else "-")
            else:
                found = embedding_found.get((name, stream), {}).get(q)
                emb = ", ".join(found) if found else "-"
            final = final_found[name, stream].get(q)
            lines.append(f"| {q} | {name} | {stream} | {emb} | {', '.join(final) if final else '-'} |")
    return "\n".join(lines) + "\n"


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
    p.add_argument("--pictures-of", help="models (comma-separated) for the t-SNE pictures and neighbours")
    p.add_argument("--embedding-word", choices=("mean", "first"), default="mean",
                   help="the embedding view's vector of a word split into pieces: the mean of its pieces' "
                        "embeddings, or its first piece's")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(max(args.threads, 1))
    return exit_status("stream_analysis", run, args)


if __name__ == "__main__":
    sys.exit(main())
