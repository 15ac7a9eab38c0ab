"""examples/translation/gpu_multi30k.py, the one-GPU driver of both Multi30k tables, on
CPU: its checks (missing data, no GPU: one line, exit 1), --dry-run, the wall
budget, the parsing of fairseq's log; on real Multi30k a tiny run where one
model finishes and one fails (reported, left out of the tables) and a
re-run that skips the finished one; the whole tiny form (all six models, the
tables, the probe) in the full tier."""

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time

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


def test_budget_too_short_for_a_wave_starts_none_of_it_and_reports(tmp_path):
    data = fake_data(tmp_path / "d", "tiny")
    work = tmp_path / "w"
    r = drive("run", "--size", "tiny", "--data", data, "--work", str(work), "--budget-s", "5")
    assert r.returncode == 3, r.stderr
    assert "plan: not starting 3 de-en runs" in r.stderr and "plan: not starting 3 en-de runs" in r.stderr
    meta = json.load(open(work / "runs.json"))
    assert meta["finished"] == 0 and len(meta["runs"]) == 6
    assert all(f["status"] == "not started" and "wave needs up to" in f["reason"] for f in meta["runs"])
    tables = open(work / "tables.md").read()
    assert "0 of 6 runs finished" in tables and "(no de-en run has finished)" in tables
    assert os.path.isfile(work / "runs.tar.gz") and os.path.isfile(work / "driver.log")


def _speed_file(path, size="small", **measured):
    path.write_text(json.dumps({"measured": dict(size=size, **measured)}))
    return str(path)


def test_plan_starts_a_wave_only_when_its_worst_case_fits(tmp_path):
    """The dry run's plan: with the assumed speed a 440 s call starts de-en only (the en-de wave, with
    its analysis, would not fit after it); with a measured faster speed both; wrong-size speed refused."""
    data = fake_data(tmp_path / "d", "gpu")
    size = gpu_multi30k.SIZES["gpu"]
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"), "--dry-run", "--budget-s", "440")
    assert r.returncode == 0, r.stderr
    worst = gpu_multi30k.worst_wave_s(size, "de-en", 9, gpu_multi30k.assumed_speed(size))
    # worst case by hand: start + 2,000 updates + 17 validations + 2 test sets
    a = size.assumed
    assert worst == pytest.approx(a["startup_s"] + 2000 * a["ms_per_update"] / 1000 + 17 * a["validation_s"]
                                  + 2 * a["translate_s"])
    assert f"plan: de-en wave of 9 runs, up to {worst:.0f} s" in r.stderr and "starts with 425 s left" in r.stderr
    assert "plan: en-de wave of 9 runs" in r.stderr and "does not start" in r.stderr
    fast = _speed_file(tmp_path / "speed.json", jobs=9, ms_per_update=40.0, validation_s=2.0, startup_s=10.0,
                       translate_s=15.0, faith_s=10.0, analysis_s=60.0)
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"), "--dry-run", "--budget-s", "440",
              "--speed", fast)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("starts with") == 2 and "does not start" not in r.stderr
    assert "measured by an earlier command" in r.stderr
    other = _speed_file(tmp_path / "tiny.json", size="mini", jobs=3, ms_per_update=100.0)
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w"), "--dry-run", "--speed", other)
    assert r.returncode == 1 and "measured with SIZE=mini, not small" in r.stderr


def test_speed_is_shared_not_assumed_faster():
    speed = gpu_multi30k.Speed(jobs=9, ms_per_update=90.0, validation_s=4.0, startup_s=15.0, translate_s=30.0,
                               faith_s=10.0, analysis_s=100.0, source="measured by this command")
    assert speed.ms_at(9) == 90.0 and speed.ms_at(18) == 180.0 and speed.ms_at(3) == 90.0


TRAIN_LOG = """INFO:fairseq_cli.train:begin dry-run validation on "valid" subset
INFO:train_inner:epoch 001:     25 / 73 loss=9.1, ups=5.00, num_updates=25, lr=1e-4, wall=9
INFO:train_inner:epoch 001:     50 / 73 loss=8.1, ups=20.00, num_updates=50, lr=1e-4, wall=10
INFO:fairseq_cli.train:begin validation on "valid" subset
INFO:valid:epoch 001 | valid on 'valid' subset | loss 7.4 | bleu 1.2 | num_updates 50 | best_bleu 1.2
INFO:fairseq.checkpoint_utils:Saved checkpoint x/checkpoint_1_50.pt (epoch 1 @ 50 updates, score 1.2) (writing took 0.25 seconds)
INFO:train_inner:epoch 001:     75 / 73 loss=7.1, ups=5.00, num_updates=75, lr=1e-4, wall=15
INFO:train_inner:epoch 002:     27 / 73 loss=6.1, ups=25.00, num_updates=100, lr=1e-4, wall=16
INFO:fairseq_cli.train:done training in 16.5 seconds
"""


def test_log_progress_separates_training_from_validation(tmp_path):
    """The update time from the intervals without a validation (after the first, the warm-up); a
    validation's time is its interval's time less its updates at that rate."""
    (tmp_path / "train.log").write_text(TRAIN_LOG)
    p = gpu_multi30k.log_progress(str(tmp_path))
    assert p["updates"] == 100 and p["validations"] == 1 and p["intervals"] == 4 and p["train_s"] == 16.5
    # pure intervals after the first: 25 updates at 20/s and at 25/s -> 50 and 40 ms, median 45 ms
    assert p["ms_per_update"] == pytest.approx(45.0)
    # the interval with the validation: 25 / 5 = 5 s, less 25 x 45 ms
    assert p["validation_s"] == [pytest.approx(5.0 - 25 * 0.045)] and p["write_s"] == [0.25]
    (tmp_path / "train.log").write_text("\n".join(TRAIN_LOG.splitlines()[:2]) + "\n")
    assert gpu_multi30k.log_progress(str(tmp_path))["ms_per_update"] is None  # the warm-up alone: no rate


def _run(tmp_path, seed, arch="transformer", trained=False):
    folder = tmp_path / f"{arch}-seed{seed}"
    folder.mkdir(exist_ok=True)
    (folder / "train.log").write_text(TRAIN_LOG.replace("done training", "x") if not trained else TRAIN_LOG)
    run = gpu_multi30k.Run("de-en", arch, seed, str(folder), "", [], str(tmp_path))
    if trained:
        run.step_s["train"] = 20.0
    return run


def test_seed_to_stop_gives_up_the_highest_seed_only_on_a_measured_overrun(tmp_path):
    size = gpu_multi30k.SIZES["gpu"]
    runs = [_run(tmp_path, seed, arch) for seed in (1, 2, 3) for arch in ("transformer", "transformer_dnas")]
    measured = gpu_multi30k.Speed(jobs=6, ms_per_update=45.0, validation_s=4.0, startup_s=15.0, translate_s=30.0,
                                  faith_s=10.0, analysis_s=100.0, source="measured by this command")
    # 1,900 updates left at 45 ms, 16 of 17 validations left at 4 s, two test sets at 30 s
    end = gpu_multi30k.project_end(runs[0], size, measured, 6, now=1000.0)
    assert end == pytest.approx(1000.0 + 1900 * 0.045 + 16 * 4.0 + 2 * 30.0)
    assert gpu_multi30k.seed_to_stop(runs, [], size, measured, 1000.0, deadline=end + 1)[0] is None
    seed, why = gpu_multi30k.seed_to_stop(runs, [], size, measured, 1000.0, deadline=end - 10)
    assert seed == 3 and "seed 3 of every model is stopped" in why and "10 s after the deadline" in why
    assumed = gpu_multi30k.Speed(**dict(measured.__dict__, source="assumed (no measurement yet)"))
    assert gpu_multi30k.seed_to_stop(runs, [], size, assumed, 1000.0, deadline=end - 10)[0] is None
    for r in runs:
        if r.seed > 1:
            r.stop_reason = "stopped"
    assert gpu_multi30k.seed_to_stop(runs, [], size, measured, 1000.0, deadline=end - 10)[0] is None  # the last seed


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
    run = gpu_multi30k.Run("de-en", "transformer", 1, str(tmp_path), "", [], str(tmp_path))
    assert (gpu_multi30k._finite_training(run) == "") == finite
    (tmp_path / "train.log").write_text(LOG.splitlines()[1] + "\n")
    assert gpu_multi30k.train_summary(str(tmp_path))["stopped_by"] == "max_update"


def _prepare(tmp_path, multi30k_dir, conll2000_dir, models):
    data = str(tmp_path / "data")
    r = drive("prepare", "--size", "tiny", "--data", data, "--models", models, MULTI30K_DIR=multi30k_dir,
              CONLL2000_DIR=conll2000_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    return data


# Full tier: the default tier's SIGKILL test already proves that finished runs
# are skipped when a report is continued; this one adds a failed run's report.
@pytest.mark.full
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


def _kill_tree(proc):
    """SIGKILL the driver and everything under it at once, as a machine taken away would."""
    pids, todo = [], [proc.pid]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
        todo += [int(x) for x in out.split()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _start(*args):
    return subprocess.Popen([sys.executable, DRIVER, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHON": sys.executable})


def _wait_for(report, condition, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = report / "runs.json"
        if path.is_file():
            meta = json.load(open(path))
            if condition(meta):
                return meta
        time.sleep(0.2)
    raise AssertionError(f"runs.json never met the condition in {timeout} s")


def _check_report(report, names):
    """Whatever moment the command was killed at: every run listed with a status, every finished run
    with its figures in runs.json and in tables.md, the logs archive readable."""
    meta = json.load(open(report / "runs.json"))
    assert sorted(f"{f['arch']}-seed{f['seed']}" for f in meta["runs"]) == sorted(names)
    assert all(f["status"] in ("ok", "running", "not started", "failed", "stopped by the budget",
                               "stopped by the plan") for f in meta["runs"])
    ok = [f for f in meta["runs"] if f["status"] == "ok"]
    assert meta["finished"] == len(ok)
    tables = open(report / "tables.md").read()
    assert f"{len(ok)} of {len(names)} runs finished" in tables
    for f in ok:
        assert f["test2016"]["bleu"]["signature"].startswith("nrefs:1|") and f["updates"] > 0
    with tarfile.open(report / "runs.tar.gz") as tar:
        names_in = tar.getnames()
    for f in ok:
        assert f"de-en/runs/{f['arch']}-seed{f['seed']}/test2016.bleu.json" in names_in
    return meta


@pytest.fixture(scope="module")
def tiny_de_en(tmp_path_factory, multi30k_dir, conll2000_dir):
    return _prepare(tmp_path_factory.mktemp("tiny"), multi30k_dir, conll2000_dir, "de-en:transformer")


KILL_NAMES = ["transformer-seed1", "transformer_dnas-seed1"]


def _kill_run_args(tmp_path, data, jobs):
    """The two tiny de-en runs the SIGKILL tests drive, and their report folder."""
    report = tmp_path / "report"
    return ("run", "--size", "tiny", "--data", data, "--work", str(tmp_path / "work"), "--report", str(report),
            "--models", "de-en:transformer,de-en:transformer_dnas", "--jobs", str(jobs)), report


def test_sigkill_at_start_and_after_a_run_leaves_a_report_and_the_next_machine_continues(tmp_path, tiny_de_en):
    args, report = _kill_run_args(tmp_path, tiny_de_en, jobs=2)
    names = KILL_NAMES
    # killed as soon as the runs have started
    proc = _start(*args)
    _wait_for(report, lambda m: any(f["status"] == "running" for f in m["runs"]))
    _kill_tree(proc)
    meta = _check_report(report, names)
    assert meta["finished"] == 0 and {f["status"] for f in meta["runs"]} <= {"running", "not started"}
    # killed as soon as one run has finished (the same command resumes the interrupted runs)
    proc = _start(*args)
    _wait_for(report, lambda m: m["finished"] >= 1)
    _kill_tree(proc)
    meta = _check_report(report, names)
    assert meta["finished"] >= 1
    done = [f for f in meta["runs"] if f["status"] == "ok"]
    assert "driver.log" in os.listdir(report) and "started" in open(report / "driver.log").read()

    # Another machine: only the report travels; the finished runs are taken from it, not redone.
    keep = ",".join(f"de-en:{f['arch']}" for f in done)
    r = drive("run", "--size", "tiny", "--data", tiny_de_en, "--work", str(tmp_path / "work2"), "--models", keep,
              "--continue-from", str(report), "--report", str(tmp_path / "report2"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{len(done)} finished runs taken from it" in r.stderr and "started" not in r.stderr
    meta2 = json.load(open(tmp_path / "report2" / "runs.json"))
    assert [f["test2016"] for f in meta2["runs"]] == [f["test2016"] for f in done]


def test_a_budget_that_ends_midway_stops_the_runs_and_says_so(tmp_path, tiny_de_en):
    """A speed file that promises too much starts a wave the budget cannot hold: the deadline stops
    its runs during training, and the report says so (no table from a stopped run)."""
    fast = _speed_file(tmp_path / "speed.json", size="mini", jobs=2, ms_per_update=1.0, validation_s=0.1,
                       startup_s=0.1, translate_s=0.1)
    work = tmp_path / "work"
    r = drive("run", "--size", "tiny", "--data", tiny_de_en, "--work", str(work), "--models", "de-en:transformer",
              "--speed", fast, "--budget-s", "25")
    assert r.returncode == 3, r.stderr[-3000:]
    assert "plan: de-en wave of 1 runs" in r.stderr and "budget: deadline reached; stopping 1 running runs" in r.stderr
    meta = json.load(open(work / "runs.json"))
    assert [(f["status"], f["reason"]) for f in meta["runs"]] == [("stopped by the budget", "during train")]
    assert "(no de-en run has finished)" in open(work / "tables.md").read()


@pytest.mark.full
def test_sigkill_at_three_random_moments_then_the_command_finishes(tmp_path, tiny_de_en):
    args, report = _kill_run_args(tmp_path, tiny_de_en, jobs=1)
    names = KILL_NAMES
    rng = random.Random(49)
    finished_before = set()
    for delay in sorted(rng.uniform(2, 70) for _ in range(3)):
        proc = _start(*args)
        _wait_for(report, lambda m: m.get("elapsed_s") is not None)
        time.sleep(delay)
        _kill_tree(proc)
        meta = _check_report(report, names)
        finished_now = {f["arch"] for f in meta["runs"] if f["status"] == "ok"}
        assert finished_before <= finished_now  # what finished stays finished
        finished_before = finished_now
    r = drive(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    for arch in finished_before:
        assert f"de-en {arch} seed 1: started" not in r.stderr  # never redone
    assert _check_report(report, names)["finished"] == 2


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


H200_REPORT = os.path.join(ROOT, "docs", "results", "2026-11-28-h200-multi30k-de-en.raw")


def test_the_h200_report_continues_on_the_next_machine(tmp_path):
    """The report the first GPU command brought back (its record: 2026-11-28-h200-multi30k-de-en.md)
    is what the next command continues from: its six finished runs are unpacked and not redone, the
    table made from them is the record's, and the plan starts the missing de-en seed at its speed."""
    data = fake_data(tmp_path / "d", "gpu")
    work = tmp_path / "w"
    runs = gpu_multi30k.plan(argparse.Namespace(
        data=data, work=str(work), size="gpu", models=None), gpu_multi30k.SIZES["gpu"])
    assert gpu_multi30k.continue_from(H200_REPORT, str(work), runs) == 6
    assert sorted(r.name for r in runs if r.finished()) == sorted(
        f"de-en {a} seed {s}" for a in ("transformer", "transformer_dnas", "transformer_hnas") for s in (1, 2))
    (work / "runs.json").write_text(open(os.path.join(H200_REPORT, "runs.json")).read())
    r = drive("table", "--size", "gpu", "--data", data, "--work", str(work))
    assert r.returncode == 0, r.stderr
    record = open(os.path.join(ROOT, "docs", "results", "2026-11-28-h200-multi30k-de-en.md")).read()
    rows = [l for l in r.stdout.splitlines() if l.startswith("| test201")]
    assert len(rows) == 6 and all(row in record for row in rows)
    r = drive("run", "--size", "gpu", "--data", data, "--work", str(tmp_path / "w2"), "--budget-s", "450",
              "--continue-from", H200_REPORT, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "18 runs (6 finished already)" in r.stderr and "plan: de-en wave of 3 runs" in r.stderr
    assert "measured by an earlier command" in r.stderr
