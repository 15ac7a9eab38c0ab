"""What each stream learns (examples/discrete/stream_analysis.py): the
first-piece alignment, the nearest neighbours (final states and token
embeddings), a word's vector from its pieces, each stream's token table, and
the script end to end (chunking probe, both views' t-SNE and neighbours) on
tiny trained translation models."""

import json
import os
import random
import sys
from collections import Counter

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from helpers import ROOT, WORDS, build_model, run, tiny_dictionary, train_tiny_translation, write_parallel_data

from fairseq_dnas.analysis.chunking import first_pieces, read_conll

SCRIPT = os.path.join(ROOT, "examples", "discrete", "stream_analysis.py")
import stream_analysis  # examples/discrete/ (tests/conftest.py puts it on sys.path)


def test_first_pieces_marks_each_words_first_piece():
    split = {"unbelievable": ["▁un", "believ", "able"], "cats": ["▁cat", "s"], "a": ["▁a"]}
    pieces, first = first_pieces(["a", "unbelievable", "cats", "a"], split.get)
    assert pieces == ["▁a", "▁un", "believ", "able", "▁cat", "s", "▁a"]
    assert first == [0, 1, 4, 6]
    with pytest.raises(ValueError, match="no piece"):
        first_pieces(["x"], lambda w: [])


def test_neighbours_by_cosine_of_mean_states():
    # "b" points like "a" on average; "c" is orthogonal; "rare" is seen once.
    s = [("a", "NN", "O"), ("b", "NN", "O"), ("c", "NN", "O"), ("b", "NN", "O"), ("rare", "NN", "O")]
    v = torch.tensor([[1.0, 0.0], [1.0, 0.2], [0.0, 1.0], [1.0, -0.1], [1.0, 0.0]])
    found = stream_analysis.neighbours([v], [s], ["a", "c", "rare"], k=2, min_count=1)
    assert found["a"] == ["rare", "b"]  # rare: cosine 1; b: mean (1, 0.05)
    assert found["c"][0] == "b"
    found = stream_analysis.neighbours([v], [s], ["a", "rare"], k=5, min_count=2)
    assert found == {}  # "a" and "rare" are seen once: not types at min_count 2


def test_nearest_by_cosine_with_ties_in_word_order():
    m = torch.tensor([[1.0, 0.0], [2.0, 0.1], [0.0, 3.0], [-1.0, 0.0], [4.0, 0.0]])
    words = ["q", "near", "orthogonal", "opposite", "same"]
    found = stream_analysis.nearest(m, words, ["q", "orthogonal", "absent"], k=3)
    assert found["q"] == ["same", "near", "orthogonal"]  # cosines 1, 0.9988, 0 (scale does not count)
    assert found["orthogonal"] == ["near", "q", "opposite"]  # 0.05, then q and opposite at 0 in word order
    assert "absent" not in found
    tied = stream_analysis.nearest(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 2.0]]), ["a", "b", "c"], ["a"], k=2)
    assert tied == {"a": ["b", "c"]}  # both at cosine 0: the order of the words


def test_word_vector_first_piece_or_mean_of_pieces():
    table = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, 6.0], [5.0, -4.0]])
    assert torch.equal(stream_analysis.word_vector(table, [2, 3], "first"), torch.tensor([3.0, 6.0]))
    assert torch.equal(stream_analysis.word_vector(table, [1, 2, 3], "mean"), torch.tensor([3.0, 4.0 / 3]))
    assert torch.equal(stream_analysis.word_vector(table, [3], "mean"), table[3])  # one piece: both rules agree
    with pytest.raises(ValueError, match="'first' or 'mean'"):
        stream_analysis.word_vector(table, [1], "last")
    with pytest.raises(ValueError, match="no piece"):
        stream_analysis.word_vector(table, [], "mean")


def test_word_types_keep_case_and_take_the_most_frequent_pos():
    s = [[("Light", "NNP", "B-NP"), ("light", "JJ", "I-NP"), ("light", "NN", "I-NP")],
         [("light", "NN", "B-NP"), ("runs", "VBZ", "B-VP"), ("runs", "NNS", "B-NP")]]
    types = stream_analysis.word_types(s)
    assert types == {"light": (3, "NN"), "runs": (2, "VBZ"), "Light": (1, "NNP")}  # runs: a tie, first seen
    assert list(types) == ["light", "runs", "Light"]  # most frequent first


def test_embedding_words_leave_out_words_with_an_unknown_piece():
    d = tiny_dictionary()
    split = {"w1": ["w1"], "w2w3": ["w2", "w3"], "odd": ["w4", "zz"], "none": []}
    words = stream_analysis.embedding_words(["w2w3", "odd", "w1", "none"], d, split.get)
    assert words == [("w2w3", [d.index("w2"), d.index("w3")]), ("w1", [d.index("w1")])]
    table = torch.randn(len(d), 4)
    m = stream_analysis.embedding_matrix(table, words, "mean")
    assert m.dtype == torch.float64 and torch.allclose(m[0], table[[d.index("w2"), d.index("w3")]].double().mean(0))


def test_embedding_tables_of_each_encoder():
    plain = stream_analysis.embedding_tables(build_model("transformer_discrete_single"))
    assert [s for s, _ in plain] == ["encoder"]
    model = build_model("transformer_discrete")
    own = dict(stream_analysis.embedding_tables(model))
    assert list(own) == ["model", "controller"]
    assert own["model"] is not own["controller"]
    assert torch.equal(own["model"], model.encoder.embed_tokens.weight)
    assert torch.equal(own["controller"], model.encoder.controller_embed_tokens.weight)
    assert not torch.equal(own["model"], own["controller"])  # two initializations
    shared = build_model("transformer_discrete", ["--share-stream-embeddings"])
    assert shared.encoder.controller_embed_tokens is None
    tables = stream_analysis.embedding_tables(shared)
    assert [s for s, _ in tables] == ["shared"] and torch.equal(tables[0][1], shared.encoder.embed_tokens.weight)


def test_embedding_view_reads_each_table_and_refuses_a_foreign_vocabulary():
    import argparse

    from fairseq_dnas.commands.sentence_classify import BadInput

    model, d = build_model("transformer_discrete"), tiny_dictionary()
    s = [[(w, "NN" if i % 2 else "VB", "O") for i, w in enumerate(WORDS[:12])]] * 5  # each word 5 times
    types = stream_analysis.word_types(s)
    args = argparse.Namespace(tsne_words=8, embedding_word="mean", neighbours=["w3", "absent"])
    view = stream_analysis.embedding_view("m", model, d, types, lambda w: [w], args)
    assert [stream for stream, *_ in view] == ["model", "controller"]
    for (stream, points, pos, found), table in zip(view, (model.encoder.embed_tokens.weight,
                                                          model.encoder.controller_embed_tokens.weight)):
        assert points.shape == (8, table.shape[1]) and pos == ["VB", "NN"] * 4
        assert torch.allclose(torch.from_numpy(points[3]), table[d.index("w3")].double())
        assert list(found) == ["w3"] and found["w3"] == stream_analysis.nearest(
            table[[d.index(w) for w in WORDS[:12]]], WORDS[:12], ["w3"])["w3"]
    with pytest.raises(BadInput, match="give --spm the SentencePiece model"):
        stream_analysis.embedding_view("m", model, d, types, lambda w: ["x" + w], args)


def test_table63_both_views_and_a_shared_table_said_once():
    emb = {("own", "model"): {"a": ["b", "c"]}, ("own", "controller"): {"a": ["c", "d"]},
           ("shared", "shared"): {"a": ["e"]}}
    final = {("own", "model"): {"a": ["x"]}, ("own", "controller"): {}, ("shared", "model"): {"a": ["y"]},
             ("shared", "controller"): {"a": ["z"]}}
    rows = [("own", "model"), ("own", "controller"), ("shared", "model"), ("shared", "controller")]
    md = stream_analysis.table63(["a"], rows, emb, final, "its first piece's row").splitlines()
    assert "| a | own | model | b, c | x |" in md
    assert "| a | own | controller | c, d | - |" in md
    assert "| a | shared | model | e (one table for both streams) | y |" in md
    assert "| a | shared | controller | = the model stream's (one shared table) | z |" in md
    assert "its first piece's row" in md[0]


def _conll(path, n, rng):
    """Tiny CoNLL files over the copy task's words: a word's POS and chunk
    tag follow from the word (NN words open a chunk, the others are outside)."""
    tags = list(stream_analysis.POS_TAGS)
    with open(path, "w") as f:
        for _ in range(n):
            for _ in range(rng.randint(3, 9)):
                w = rng.choice(WORDS[:20])
                pos = tags[int(w[1:]) % len(tags)]
                chunk = "B-NP" if pos.startswith("NN") else "O"
                f.write(f"{w} {pos} {chunk}\n")
            f.write("\n")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """SentencePiece pieces (one a word, so that a word's first piece names
    it), binarized copy-task data and two tiny models (plain and two-stream
    discrete) trained 1 epoch."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("stream_analysis")
    write_parallel_data(root / "raw")
    spm.SentencePieceTrainer.train(input=str(root / "raw" / "train.src"), model_prefix=str(root / "sp"),
                                   vocab_size=40, hard_vocab_limit=False, model_type="word",
                                   character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "sp.model"))
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            lines = open(root / "raw" / f"{split}.{side}").read().splitlines()
            with open(root / "raw" / f"sp.{split}.{side}", "w") as f:
                f.writelines(" ".join(sp.encode(line, out_type=str)) + "\n" for line in lines)
    ckpt = train_tiny_translation(root, f"{root}/raw/sp.")["ckpt"]
    rng = random.Random(0)
    os.makedirs(root / "conll")
    _conll(root / "conll" / "train.txt", 60, rng)
    _conll(root / "conll" / "test.txt", 20, rng)
    return {"root": root, "ckpt": ckpt}


def _script(models, out, *extra, check=True):
    root = models["root"]
    return run([sys.executable, SCRIPT, "--conll", root / "conll", "--data", root / "bin", "--spm", root / "sp.model",
                "--out", out, *map(str, extra)], check=check)


@pytest.mark.full  # trains two tiny models; the quickstart (full tier) runs the script on real data too
def test_probe_table_pictures_and_neighbours(models, tmp_path):
    ck = models["ckpt"]
    _script(models, tmp_path, f"plain={ck['transformer_tiny']}", f"discrete={ck['transformer_discrete_tiny']}",
            "--tsne-words", "60", "--neighbours", "w1,w2")
    rows = [json.loads(line) for line in open(tmp_path / "probe.jsonl")]
    assert [(r["model"], r["stream"]) for r in rows] == [
        ("baseline", "-"), ("plain", "encoder"), ("discrete", "model"), ("discrete", "controller")]
    for r in rows:
        assert 0 <= r["accuracy"] <= 100 and 0 <= r["f1"] <= 100
    # The tiny task's chunk tags follow from the word, which the states
    # hold: the probe must find them (the majority tag alone gets about 62%).
    assert rows[0]["accuracy"] == 100.0  # the baseline: POS gives the tag
    assert min(r["accuracy"] for r in rows[1:]) > 90
    assert (tmp_path / "tsne.png").stat().st_size > 0
    table = open(tmp_path / "table.md").read()
    assert "| discrete | controller |" in table
    md = open(tmp_path / "neighbours.md").read()
    assert "| discrete controller | w1 |" in md and "| plain | w2 |" in md
    # The embedding view: each stream's own token table, read back from the
    # checkpoint and searched here by numpy (the words are one piece each).
    assert (tmp_path / "tsne-embeddings.png").stat().st_size > 0
    emb_md = open(tmp_path / "neighbours-embeddings.md").read().splitlines()
    table63 = open(tmp_path / "table63.md").read().splitlines()
    state = torch.load(ck["transformer_discrete_tiny"], map_location="cpu", weights_only=False)["model"]
    d = Dictionary.load(str(models["root"] / "bin" / "dict.src.txt"))
    counts = Counter(w for s in read_conll(models["root"] / "conll" / "train.txt")
                     + read_conll(models["root"] / "conll" / "test.txt") for w, _, _ in s)
    words = [w for w, n in counts.most_common() if n >= stream_analysis.EMBEDDING_MIN_COUNT]
    for stream, key in (("model", "encoder.embed_tokens.weight"),
                        ("controller", "encoder.controller_embed_tokens.weight")):
        e = state[key].double().numpy()[[d.index(f"\u2581{w}") for w in words]]
        e /= np.linalg.norm(e, axis=1, keepdims=True)
        cos = e @ e[words.index("w1")]
        expected = [words[i] for i in np.argsort(-cos, kind="stable") if words[i] != "w1"][:10]
        assert f"| discrete {stream} | w1 | {', '.join(expected)} |" in emb_md
        final = next(line for line in md.splitlines() if line.startswith(f"| discrete {stream} | w1 |"))
        final = final.split(" | ")[2].removesuffix(" |")
        assert f"| w1 | discrete | {stream} | {', '.join(expected)} | {final} |" in table63
    assert any(line.startswith("| w2 | plain | encoder | w") for line in table63)


@pytest.mark.full
def test_bad_input_gives_one_line_and_exit_1(models, tmp_path):
    ck = models["ckpt"]["transformer_tiny"]
    cases = [
        ((f"plain={tmp_path / 'missing.pt'}",), "no such file"),
        ((str(ck),), "NAME=CHECKPOINT"),
        ((f"plain={ck}", "--pictures-of", "other"), "not among the models"),
    ]
    for args, message in cases:
        proc = _script(models, tmp_path / "out", *args, check=False)
        assert proc.returncode == 1, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("[stream_analysis] error")]
        assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "out" / "probe.jsonl").exists()
