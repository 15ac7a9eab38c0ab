"""examples/translation/gpu_multi30k.py, the one-GPU driver of both Multi30k tables, on
CPU: its checks (missing data, no GPU: one line, exit 1), --dry-run, the wall
budget, the parsing of fairseq's log; on real Multi30k a tiny run where one
model finishes and one fails (reported, left out of the tables) and a
re-run that skips the finished one; the whole tiny form (all six models, the
tables, the probe) in the full tier."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT

DRIVER = os.path.join(ROOT, "examples", "translation", "gpu_multi30k.py")
spec = importlib.util.spec_from_file_location("gpu_multi30k", DRIVER)
gpu_multi30k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_multi30k)


def drive(*args, timeout=900, **env):
    return subprocess.run([sys.executable, DRIVER, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHON": sys.executable, **env})


def fake_data(root, size):
    """What check_data looks for, as empty files: enough for the checks, the plan and --dry-run."""
    for pair, (src, tgt, _) in gpu_multi30k.PAIRS.items():
        for rel in (f"bin/dict.{src}.txt", "spm/sentencepiece.model", f"spm/test.{src}", f"spm/test1.{src}",
                    f"text/test.{tgt}", f"text/test1.{tgt}"):
            path = os.path.join(root, pair, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
    os.makedirs(os.path.join(root, "conll2000"))
    open(os.path.join(root, "conll2000", "train.txt"), "w").close()
    with open(os.path.join(root, "size.txt"), "w") as f:
        f.write(size + "\n")
    return str(root)


def test_missing_data_is_one_line(tmp_path):
    r = drive("run", "--size", "tiny", "--data", str(tmp_path / "nothing"), "--work", str(tmp_path / "w"))
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "no prepared data" in r.stderr and "prepare --size tiny" in r.stderr
    assert not os.path.exists(tmp_path / "w")


def test_data_of_another_size_or_incomplete_is_refused(tmp_path):
    data = fake_data(tmp_path / "d", "tiny")
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"))
    assert r.returncode == 1 and "prepared for --size tiny, not gpu" in r.stderr
    os.remove(os.path.join(data, "en-de", "text", "test.de"))
    r = drive("run", "--size", "tiny", "--data", data, "--work", str(tmp_path / "w"))
    assert r.returncode == 1 and "en-de/text/test.de is missing" in r.stderr
    assert r.stderr.strip().count("\n") == 0, r.stderr


def test_prepare_without_corpus_is_one_line(tmp_path):
    r = drive("prepare", "--size", "tiny", "--data", str(tmp_path / "d"), MULTI30K_DIR=str(tmp_path))
    assert r.returncode == 1 and "MULTI30K_DIR" in r.stderr and r.stderr.strip().count("\n") == 0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the message of a machine without GPU")
def test_gpu_size_without_gpu_is_one_line_and_dry_run_prints_every_command(tmp_path):
    data = fake_data(tmp_path / "d", "gpu")
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"))
    assert r.returncode == 1 and "no CUDA device" in r.stderr and r.stderr.strip().count("\n") == 0

    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"), "--dry-run",
              PYTHONPATH="/tmp/site")  # the GPU machine's wheels: every step must keep them
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stderr  # said, not hidden
    size = gpu_multi30k.SIZES["gpu"]
    trains = [l for l in r.stdout.splitlines() if f"train.sh --patience {size.patience} --validate-after-updates" in l]
    assert len(trains) == 6 * len(size.seeds) == 18
    assert all(f"MAX_UPDATE={size.max_update}" in l and "DEVICE=gpu" in l and "SIZE=small" in l for l in trains)
    assert sum(l.endswith("generate.sh") for l in r.stdout.splitlines()) == 9 * 2 + 9  # de-en: 2 test sets
    faith = [l for l in r.stdout.splitlines() if "translation_faithfulness" in l]
    assert len(faith) == 9 and all(f"PYTHONPATH={ROOT}:/tmp/site " in l for l in faith)
    assert not os.path.exists(tmp_path / "w" / "de-en" / "runs")  # nothing ran


def test_budget_stops_launching_and_reports(tmp_path):
    data = fake_data(tmp_path / "d", "tiny")
    work = tmp_path / "w"
    r = drive("run", "--size", "tiny", "--data", data, "--work", str(work), "--budget-s", "5")
    assert r.returncode == 3, r.stderr
    assert "budget: 6 runs not started" in r.stderr
    meta = json.load(open(work / "runs.json"))
    assert meta["finished"] == 0 and len(meta["runs"]) == 6
    assert all(f["status"] == "not started" and "training deadline" in f["reason"] for f in meta["runs"])
    tables = open(work / "tables.md").read()
    assert "0 of 6 runs finished" in tables and "(no de-en run finished)" in tables


def test_python_without_fairseq_is_one_line(tmp_path):
    data = fake_data(tmp_path / "d", "tiny")
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'fairseq: not installed'\nexit 1\n")
    fake.chmod(0o755)
    r = drive("run", "--size", "tiny", "--data", data, "--work", str(tmp_path / "w"), PYTHON=str(fake))
    assert r.returncode == 1 and "lacks what the recipes need (fairseq: not installed)" in r.stderr
    assert "install the wheels" in r.stderr and r.stderr.strip().count("\n") == 0
    assert not os.path.exists(tmp_path / "w")


def test_models_filter_is_checked(tmp_path):
    data = fake_data(tmp_path / "d", "tiny")
    r = drive("run", "--size", "tiny", "--data", data, "--models", "de-en:transformer_discrete", "--dry-run")
    assert r.returncode == 1 and "not one of de-en:transformer," in r.stderr


LOG = """INFO:fairseq_cli.train:begin training
INFO:valid:epoch 002 | valid on 'valid' subset | loss 3.9 | nll_loss 2.3 | ppl 4.9 | bleu 30.1 | wps 1 | num_updates 700 | best_bleu 31.5
INFO:fairseq.trainer:early stop since valid performance hasn't improved for last 5 runs
INFO:fairseq_cli.train:early stop since valid performance hasn't improved for last 5 runs
INFO:valid:epoch 003 | valid on 'valid' subset | loss {loss} | nll_loss 2.2 | ppl 4.6 | bleu 30.9 | wps 1 | num_updates 800 | best_bleu 31.5
"""


@pytest.mark.parametrize("loss,finite", [("3.8", True), ("nan", False), ("inf", False)])
def test_train_summary_reads_fairseq_log(tmp_path, loss, finite):
    (tmp_path / "train.log").write_text(LOG.format(loss=loss))
    s = gpu_multi30k.train_summary(str(tmp_path))
    assert s["updates"] == 800 and s["stopped_by"] == "patience" and s["validations"] == 2
    assert s["best_valid_bleu"] == 31.5
    run = gpu_multi30k.Run("de-en", "transformer", 1, str(tmp_path), "", [])
    assert (gpu_multi30k._finite_training(run) == "") == finite
    (tmp_path / "train.log").write_text(LOG.splitlines()[1] + "\n")
    assert gpu_multi30k.train_summary(str(tmp_path))["stopped_by"] == "max_update"


def _prepare(tmp_path, multi30k_dir, conll2000_dir, models):
    data = str(tmp_path / "data")
    r = drive("prepare", "--size", "tiny", "--data", data, "--models", models, MULTI30K_DIR=multi30k_dir,
              CONLL2000_DIR=conll2000_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    return data


def test_tiny_run_reports_a_failed_run_and_skips_finished_ones(tmp_path, multi30k_dir, conll2000_dir):
    models = "de-en:transformer,de-en:transformer_dnas"
    data = _prepare(tmp_path, multi30k_dir, conll2000_dir, models)
    work = tmp_path / "work"
    # A damaged checkpoint to resume from: fairseq-train of that run exits 1.
    bad = work / "de-en" / "runs" / "transformer_dnas-seed1"
    bad.mkdir(parents=True)
    (bad / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    args = ("run", "--size", "tiny", "--data", data, "--work", str(work), "--models", models)
    r = drive(*args)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "NOT IN THE TABLES: de-en transformer_dnas seed 1: failed (train exited with status 1" in r.stderr
    meta = json.load(open(work / "runs.json"))
    status = {f["arch"]: f for f in meta["runs"]}
    assert status["transformer"]["status"] == "ok" and status["transformer_dnas"]["status"] == "failed"
    ok = status["transformer"]
    assert 0 < ok["updates"] <= gpu_multi30k.SIZES["tiny"].max_update and ok["stopped_by"] in ("patience",
                                                                                              "max_update")
    assert ok["test2016"]["bleu"]["signature"].startswith("nrefs:1|") and "test2017" in ok
    tables = open(work / "tables.md").read()
    assert "| test2016 | UNAS encoder (baseline) | 1 |" in tables
    assert "| test2017 | UNAS encoder (baseline) | 1 |" in tables
    assert "DNAS encoder |" not in tables  # the failed run is left out ...
    assert "| de-en | transformer_dnas | 1 | failed" in tables  # ... and listed

    # Re-run: the finished run is not redone; the failed one is tried again (and fails again).
    r = drive(*args)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "2 runs (1 finished already)" in r.stderr
    assert "de-en transformer seed 1: started" not in r.stderr
    assert "de-en transformer_dnas seed 1: started" in r.stderr
    rows = [l for l in tables.splitlines() if l.startswith("| test201")]
    assert [l for l in open(work / "tables.md").read().splitlines() if l.startswith("| test201")] == rows


@pytest.mark.full
def test_tiny_form_writes_both_tables(tmp_path, multi30k_dir, conll2000_dir):
    data = _prepare(tmp_path, multi30k_dir, conll2000_dir, ",".join(
        f"{p}:{a}" for p, (_, _, archs) in gpu_multi30k.PAIRS.items() for a in archs))
    work, report = tmp_path / "work", tmp_path / "report"
    r = drive("run", "--size", "tiny", "--data", data, "--work", str(work), "--report", str(report))
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.load(open(report / "runs.json"))
    assert meta["finished"] == meta["total"] == 6 and meta["stream_analysis"] == "ok"
    hnas = [f for f in meta["runs"] if f["arch"] == "transformer_hnas"][0]
    assert len(hnas["u_per_layer"]) == 2 and all(0 < u < 1 for u in hnas["u_per_layer"])
    discrete = [f for f in meta["runs"] if f["arch"] == "transformer_discrete"][0]
    assert set(discrete["faithfulness"]) == {"encoder", "cross"}
    tables = open(report / "tables.md").read()
    for system in ("UNAS encoder (baseline)", "DNAS encoder", "HNAS encoder"):
        for test_set in ("test2016", "test2017"):
            assert f"| {test_set} | {system} | 1 |" in tables
    for arch in ("transformer", "transformer_discrete_single", "transformer_discrete"):
        assert f"\n| {arch} | 1 |" in tables  # Table 6.2 / 6.4 form
    assert "| transformer_discrete | syntactic |" in tables or "| transformer_discrete |" in tables
    assert "| 1 | 1 |" in tables and "| 2 | 1 |" in tables  # HNAS u per layer
    assert os.path.isfile(report / "table63.md")


def _bleu_result(path, label, bleu, chrf):
    entry = lambda s, sig: {"score": s, "signature": sig, "low": s - 1, "high": s + 1}  # noqa: E731
    path.write_text(json.dumps({"sentences": 1000, "references": 1, "label": label,
                                "bleu": entry(bleu, "nrefs:1|bleu"), "chrf": entry(chrf, "nrefs:1|chrf")}))
    return str(path)


def test_bleu_table_reads_bleu_eval_results(tmp_path):
    """The de-en table: bleu_eval.py results grouped by label and test set, mean +- s.e. and spread."""
    from fairseq_dnas.commands.bleu_table import table
    from fairseq_dnas.commands.seed_table import ResultError

    paths = [_bleu_result(tmp_path / f"{label}{seed}.test2016.bleu.json", label, bleu, 50.0 + seed)
             for label, seed, bleu in (("transformer", 1, 30.0), ("transformer", 2, 32.0),
                                       ("transformer_dnas", 1, 31.0))]
    lines = table(paths, ("transformer", "transformer_dnas")).splitlines()
    assert lines[2] == "| test2016 | UNAS encoder (baseline) | 2 | 31.00 ± 1.00 | 2.00 | 51.50 ± 0.50 | 1.00 |"
    assert lines[3].startswith("| test2016 | DNAS encoder | 1 | 31.00 [30.00, 32.00] |")
    assert lines[-1] == "sacreBLEU signatures: BLEU `nrefs:1|bleu`, chrF `nrefs:1|chrf`"
    (tmp_path / "rouge.bleu.json").write_text(json.dumps({"sentences": 3, "stemmed": {}}))
    with pytest.raises(ResultError, match="not a bleu_eval.py result"):
        table([str(tmp_path / "rouge.bleu.json")])
