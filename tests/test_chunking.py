"""fairseq_dnas.analysis.chunking: conlleval's chunks and F1, the POS baseline, the linear probe."""

import os

import pytest
import torch

from fairseq_dnas.analysis import chunking as C

def test_chunks_as_conlleval_reads_them():
    tags = ["B-NP", "I-NP", "O", "I-VP", "I-VP", "B-NP", "B-NP", "I-PP", "I-NP"]
    # I-VP after O starts a chunk; B-NP after B-NP starts another; I-NP after I-PP starts another
    assert C.chunks(tags) == [("NP", 0, 1), ("VP", 3, 4), ("NP", 5, 5), ("NP", 6, 6), ("PP", 7, 7), ("NP", 8, 8)]
    assert C.chunks([]) == [] and C.chunks(["O", "O"]) == []


def test_scores_by_hand():
    gold = [["B-NP", "I-NP", "B-VP", "O"], ["B-PP", "B-NP"]]
    pred = [["B-NP", "I-NP", "B-NP", "O"], ["B-PP", "I-PP"]]
    # gold chunks: NP(0,1) VP(2,2) | PP(0,0) NP(1,1) = 4; predicted: NP(0,1) NP(2,2) | PP(0,1) = 3; correct: NP(0,1)
    s = C.chunk_scores(gold, pred)
    assert s["precision"] == pytest.approx(100 / 3) and s["recall"] == pytest.approx(25.0)
    assert s["f1"] == pytest.approx(2 * (100 / 3) * 25 / (100 / 3 + 25))
    assert s["accuracy"] == pytest.approx(100 * 4 / 6)
    with pytest.raises(ValueError, match="2 gold tags and 1 predicted"):
        C.chunk_scores([["O", "O"]], [["O"]])


def test_read_conll_and_bad_line(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("Confidence NN B-NP\nin IN B-PP\n\nRockwell NNP B-NP\n")
    assert C.read_conll(str(f)) == [[("Confidence", "NN", "B-NP"), ("in", "IN", "B-PP")], [("Rockwell", "NNP", "B-NP")]]
    f.write_text("Confidence NN\n")
    with pytest.raises(ValueError, match=r"a.txt:1: expected 'word POS chunk'"):
        C.read_conll(str(f))


def test_majority_per_pos():
    train = [[("a", "DT", "B-NP"), ("dog", "NN", "I-NP"), ("runs", "VBZ", "B-VP")],
             [("the", "DT", "B-NP"), ("cat", "NN", "I-NP"), ("cat", "NN", "B-NP")]]
    test = [[("a", "DT", "?"), ("x", "NN", "?"), ("y", "JJ", "?")]]
    # NN: I-NP twice, B-NP once; JJ unseen: the most frequent tag overall (B-NP: 3)
    assert C.majority_per_pos(train, test) == [["B-NP", "I-NP", "B-NP"]]


def test_probe_separates_separable_classes_and_matches_a_float64_optimum():
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[3.0, 0.0], [0.0, 3.0], [-3.0, -3.0]])
    y = torch.randint(0, 3, (300,), generator=g)
    x = centres[y] + 0.5 * torch.randn(300, 2, generator=g)
    probe = C.train_probe(x, y, 3, l2=1e-3)
    assert (probe(x.double()).argmax(1) == y).float().mean() == 1.0
    # at the optimum the gradient of the objective vanishes
    loss = torch.nn.functional.cross_entropy(probe(x.double()), y) + 1e-3 * probe.weight.pow(2).sum()
    grads = torch.autograd.grad(loss, list(probe.parameters()))
    assert max(float(t.abs().max()) for t in grads) < 1e-6


def test_the_baseline_on_the_real_data(conll2000_dir):
    """Table 6.4's baseline row reads precision 72.58, recall 82.14, F1 77.07 (from the
    majority tag per POS); ours on the same files, computed here, must be close."""
    train_path, test_path = os.path.join(conll2000_dir, "train.txt"), os.path.join(conll2000_dir, "test.txt")
    train, test = C.read_conll(train_path), C.read_conll(test_path)
    assert (len(train), len(test)) == (8936, 2012)
    s = C.chunk_scores([[t for _, _, t in s] for s in test], C.majority_per_pos(train, test))
    assert s["precision"] == pytest.approx(72.58, abs=0.01)
    assert s["recall"] == pytest.approx(82.14, abs=0.01)
    assert s["f1"] == pytest.approx(77.07, abs=0.01)
