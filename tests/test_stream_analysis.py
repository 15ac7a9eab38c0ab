"""What each stream learns (examples/discrete/stream_analysis.py): the
first-piece alignment, the nearest neighbours, and the script end to end
(chunking probe, t-SNE, neighbours) on tiny trained translation models."""

import json
import os
import random
import sys

import pytest
import torch
from helpers import ROOT, WORDS, run, train_tiny_translation, write_parallel_data

from fairseq_dnas.analysis.chunking import first_pieces

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
