"""examples/masked_lm: the whole chain on the real data (quickstart.sh:
prepare -> pretrain roberta_hnas -> u per layer -> fine-tune on SST-2 ->
score -> classify), and the one-line refusals of bad input by every step."""

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from helpers import ROOT, run

RECIPE = os.path.join(ROOT, "examples", "masked_lm")
DATA_TOOL = ["-m", "fairseq_dnas.recipes.masked_lm_data"]
CLASSIFY = ["-m", "fairseq_dnas.commands.sentence_classify"]
TEST_SENTENCES = 200  # quickstart's MAX_EVAL: SST-2 test sentences scored and classified


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, wikitext_dir, gigaword_dir, multi30k_dir, glue_dir):
    """quickstart.sh run once for this file: (CompletedProcess, its OUT folder)."""
    out = tmp_path_factory.mktemp("masked_lm") / "qs"
    env = {**os.environ, "OUT": str(out), "DEVICE": "cpu", "WIKITEXT_DIR": wikitext_dir,
           "GIGAWORD_DIR": gigaword_dir, "MULTI30K_DIR": multi30k_dir, "GLUE_DIR": glue_dir}
    proc = subprocess.run(["bash", os.path.join(RECIPE, "quickstart.sh")], capture_output=True, text=True,
                          timeout=1200, env=env)
    return proc, out


def _valid_loss(log):
    """The last masked-LM validation loss (bits per masked token) of a train.log."""
    losses = [float(line.split("| loss ")[1].split()[0]) for line in _lines(log)
              if "valid on 'valid' subset" in line]
    assert losses, f"no validation line in {log}"
    return losses[-1]


def test_quickstart_chain_on_real_data(quickstart):
    proc, out = quickstart
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    # Progress of both trainings on the console (stderr, not a terminal).
    assert "[train] update 30/30 (100%) loss " in proc.stderr, proc.stderr[-3000:]
    assert "[train] update 20/20 (100%) loss " in proc.stderr, proc.stderr[-3000:]
    # Pretraining learned something: below the uniform distribution over the
    # dictionary (log2 |V| bits per masked token) by a margin.
    vocab = len(_lines(out / "data/bin/pretrain/dict.txt")) + 4  # + <s> <pad> </s> <unk>
    loss = _valid_loss(out / "pretrain/train.log")
    assert loss < math.log2(vocab) - 0.5, (loss, vocab)
    # HNAS ran in every layer: fairseq logs u per layer, and the weights moved from --hybrid-init.
    log = (out / "pretrain/train.log").read_text()
    assert all(f"hnas_u_L{i:02d}" in log for i in range(4)), log[-2000:]
    with open(out / "pretrain/hybrid_weights.csv") as f:
        rows = list(csv.DictReader(f))
    u = [float(r["u"]) for r in rows]
    assert len(u) == 4 * 4 and all(0 < x < 1 for x in u) and any(abs(x - 0.5) > 1e-5 for x in u), rows
    assert "hybrid weight u per layer" in proc.stderr
    # Scored and classified the same 200 sentences; the labels classify writes
    # give exactly the accuracy score reports (the same model, same order).
    with open(out / "sst2/score.json") as f:
        score = json.load(f)
    assert score["n"] == TEST_SENTENCES
    assert score["accuracy_ci95"][0] <= score["accuracy"] <= score["accuracy_ci95"][1]
    assert -1 <= score["mcc_ci95"][0] <= score["mcc"] <= score["mcc_ci95"][1] <= 1
    labels = _lines(out / "sst2/test.labels")
    gold = _lines(out / "data/text/sst2/test.label")
    assert len(labels) == len(gold) == TEST_SENTENCES
    predicted = [line.split("\t") for line in labels]
    assert all(p in ("0", "1") and 0.5 <= float(prob) <= 1 for p, prob in predicted), labels[:5]
    agree = sum(p == g for (p, _), g in zip(predicted, gold)) / len(gold)
    assert agree == pytest.approx(score["accuracy"], abs=1e-12)
    assert "accuracy" in proc.stderr and "MCC" in proc.stderr


def _classify(*args):
    return run([sys.executable, *CLASSIFY, *args], check=False)  # a fork of the test fork server


def _one_line_error(proc, tool, message):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"[{tool}] error: ") and message in last, proc.stderr[-2000:]


@pytest.mark.parametrize("content, message", [
    ("a fine film\t1\nno label here\n", "expected 'sentence<TAB>label', found 1 column"),
    ("a fine film\t1\nawful\t2\n", "label '2' is not one the model knows"),
    ("", "empty file"),
])
def test_score_refuses_bad_test_files(quickstart, tmp_path, content, message):
    proc, out = quickstart
    assert proc.returncode == 0, proc.stderr[-3000:]
    test = tmp_path / "test.tsv"
    test.write_text(content)
    result = _classify("score", out / "sst2/checkpoint_last.pt", test, "--json", tmp_path / "s.json")
    _one_line_error(result, "sentence_classify", message)
    assert not (tmp_path / "s.json").exists()


def test_classify_refuses_a_checkpoint_of_another_task_and_damaged_files(quickstart, tmp_path):
    proc, out = quickstart
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = tmp_path / "in.txt"
    text.write_text("a fine film\n")
    # The masked-LM checkpoint is no classifier.
    result = _classify("classify", out / "pretrain/checkpoint_last.pt", text, "-o", tmp_path / "o.txt")
    _one_line_error(result, "sentence_classify", "not a fine-tuned sentence classifier")
    # A truncated checkpoint.
    cut = tmp_path / "cut.pt"
    data = (out / "sst2/checkpoint_last.pt").read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    _one_line_error(_classify("classify", cut, text, "-o", tmp_path / "o.txt"), "sentence_classify", str(cut))
    # An empty input file, and an empty line among sentences.
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    _one_line_error(_classify("classify", out / "sst2/checkpoint_last.pt", empty), "sentence_classify",
                    "empty file")
    text.write_text("a fine film\n\nbad\n")
    _one_line_error(_classify("classify", out / "sst2/checkpoint_last.pt", text, "-o", tmp_path / "o.txt"),
                    "sentence_classify", "empty line")
    assert not (tmp_path / "o.txt").exists()


def _glue_dir(root, train, header=True):
    sst = root / "SST-2"
    sst.mkdir(parents=True)
    head = "sentence\tlabel\n" if header else ""
    (sst / "train.tsv").write_text(head + train)
    for name in ("dev.tsv", "test.tsv"):
        (sst / name).write_text(head + "a fine film\t1\nawful\t0\n")
    return root


@pytest.mark.parametrize("train, message", [
    ("a fine film\t1\njust words\n", "train.tsv:3: expected 'sentence<TAB>label', found 1 column"),
    ("a fine film\t1\nawful\tneg\n", "train.tsv:3: label 'neg' is not one of 0, 1"),
    ("", "no labelled sentence in the file (empty)"),
])
def test_prepare_refuses_bad_glue_files(tmp_path, train, message):
    glue = _glue_dir(tmp_path / "glue", train)
    result = subprocess.run([sys.executable, *DATA_TOOL, "glue", "--task", "sst2", "--glue-dir", glue,
                             "--out", tmp_path / "out"], capture_output=True, text=True, timeout=60)
    _one_line_error(result, "masked_lm_data", message)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")


def _recipe(script, tmp_path, **settings):
    env = {**os.environ, "FAIRSEQ_DNAS_CHECKED_PYTHON": sys.executable, "PYTHON": sys.executable,
           "DEVICE": "cpu", **settings}
    return subprocess.run(["bash", os.path.join(RECIPE, script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env)


@pytest.mark.parametrize("script, settings, message", [
    ("pretrain.sh", {"DATA": "nowhere"}, "no binarized data in DATA=nowhere"),
    ("pretrain.sh", {"ARCH": "bert"}, "ARCH=bert: choose roberta (UNAS baseline), roberta_dnas or roberta_hnas"),
    ("pretrain.sh", {"SIZE": "huge"}, "SIZE=huge: choose small, base, large or bert"),
    ("pretrain.sh", {"BREAK_MODE": "line"}, "BREAK_MODE=line: choose none, complete, complete_doc or eos"),
    ("pretrain.sh", {"MAX_UPDATE": "0"}, "MAX_UPDATE=0: give a whole number >= 1"),
    ("pretrain.sh", {"BATCH_SEQUENCES": "7", "DEVICE": "cpu", "NPROC": "2"},
     "BATCH_SEQUENCES=7 cannot be split evenly over 2 processes"),
    ("finetune.sh", {"TASK": "mnli"}, "TASK=mnli: choose sst2 (accuracy), cola (Matthews correlation) or tsv (any sentence<TAB>label set: accuracy)"),
    ("finetune.sh", {"PRETRAINED": ""}, "PRETRAINED is not set"),
    ("finetune.sh", {"PRETRAINED": "missing.pt"}, "PRETRAINED=missing.pt: no such checkpoint"),
    ("finetune.sh", {"LR_SCHEDULE": "cosine"},
     "LR_SCHEDULE=cosine: choose polynomial_decay (to 0 at MAX_UPDATE) or constant (after WARMUP_UPDATES)"),
    ("finetune.sh", {"PATIENCE": "-1"}, "PATIENCE=-1: give a whole number >= 0"),
    ("finetune.sh", {"VALIDATE_INTERVAL": "0"}, "VALIDATE_INTERVAL=0: give a whole number >= 1"),
    ("prepare.sh", {"TASKS": "sst2 mrpc"}, "TASKS=sst2 mrpc: choose among sst2 and cola"),
    ("prepare.sh", {"WIKITEXT_DIR": "nowhere"}, "no folder nowhere"),
])
def test_recipe_scripts_refuse_bad_settings_in_one_line(tmp_path, wikitext_dir, gigaword_dir, multi30k_dir,
                                                        glue_dir, script, settings, message):
    (tmp_path / "pretrain").mkdir()
    (tmp_path / "pretrain/dict.txt").write_text("a 1\n")
    base = {"DATA": str(tmp_path / "pretrain"), "WIKITEXT_DIR": wikitext_dir, "GIGAWORD_DIR": gigaword_dir,
            "MULTI30K_DIR": multi30k_dir, "GLUE_DIR": glue_dir, "OUT_DIR": str(tmp_path / "out")}
    if script == "finetune.sh":
        (tmp_path / "pre.pt").write_bytes(b"x")
        base["PRETRAINED"] = str(tmp_path / "pre.pt")
    result = _recipe(script, tmp_path, **{**base, **settings})
    name = script[:-3]
    _one_line_error(result, name, message)
    assert not (tmp_path / "checkpoints").exists()


def test_experiment_table_reports_mean_se_range_and_whether_differences_exceed_the_spread():
    import experiment  # examples/masked_lm/ (tests/conftest.py puts it on sys.path)

    results = [{"stage": "pretrain", "arch": a, "seed": 1, "valid_ppl": p, "seconds": 600.0, "updates": 1200}
               for a, p in zip(experiment.ARCHS, (40.0, 41.0, 39.0))]
    scores = [{"arch": a, "task": t, "seed": s, "accuracy": 0.70 + 0.01 * s + (0.10 if a == "roberta_hnas" else 0),
               "mcc": 0.1 * s} for a in experiment.ARCHS for t in experiment.TASKS for s in (1, 2, 3)]
    rows = experiment.summarize(results, scores)
    hnas = rows[2]["sst2"]
    assert hnas["values"] == pytest.approx([81.0, 82.0, 83.0])
    assert hnas["mean"] == pytest.approx(82.0) and hnas["se"] == pytest.approx(1 / 3 ** 0.5)
    assert rows[0]["seconds_per_update"] == [0.5]
    table = experiment.markdown_table(rows)
    assert "| HNAS (roberta_hnas) | 39.0 | 0.50 | 82.00 +- 0.58 (81.00 to 83.00, n=3) |" in table
    assert "HNAS (roberta_hnas) vs UNAS, SST-2 accuracy (%): +10.00; exceeds the spread" in table
    assert "DNAS (roberta_dnas) vs UNAS, CoLA MCC: +0.00; does not exceed the spread" in table
    # A missing run is said, not averaged away.
    assert "not run" in experiment.markdown_table(experiment.summarize(results, scores[:3]))
