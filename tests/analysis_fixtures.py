"""Tiny data and checkpoints shared by tests/test_analysis_*.py.

Made once per test session (memoized here, so that the modules that import
these share them; under pytest-xdist the workers share one copy through a
file lock, see ``_once``): fairseq-preprocess on the tiny copy task, then a
few updates of fairseq-train for a plain ``transformer`` (UNAS), a DNAS and an
HNAS model. The HNAS run logs every update as JSON and goes through a
stand-in TensorBoard writer, so the logging tests read its records.
"""

import json
import os
import shutil
import sys
from pathlib import Path

from filelock import FileLock
from helpers import TINY, USER_DIR, run, write_parallel_data

TRAIN = [
    "--user-dir", USER_DIR, *TINY, "--cpu", "--optimizer", "adam", "--lr", "3e-3",
    "--max-tokens", "1000", "--no-progress-bar", "--seed", "1", "--max-epoch", "3",
    "--log-format", "json", "--log-interval", "1",
]  # keeps checkpoint1.pt .. checkpoint3.pt
HYBRID_INIT = 0.3

# fairseq-train in a Python that swaps TensorBoard's SummaryWriter for a
# recorder (tensorboard is not a dependency); fairseq's TensorBoard wrapper
# then hands it exactly what it would write to TensorBoard.
_TB_RUNNER = r"""
import json, sys
import fairseq.logging.progress_bar as progress_bar

OUT = sys.argv.pop(1)
RECORDS = []


class RecordingWriter:
    def __init__(self, logdir):
        self.logdir = logdir

    def add_scalar(self, key, value, step):
        RECORDS.append({"logdir": self.logdir, "key": key, "value": float(value), "step": int(step)})

    def add_text(self, *args, **kwargs):
        pass

    def flush(self):
        with open(OUT, "w") as f:
            json.dump(RECORDS, f)

    close = flush


progress_bar.SummaryWriter = RecordingWriter
from fairseq_cli.train import cli_main

sys.argv[0] = "fairseq-train"
cli_main()
"""

_CACHE = {}


def _once(tmp_path_factory, name, build):
    """build(folder) -> JSON-able result, made once per test session.

    Without xdist: in a fresh temporary folder. Under pytest-xdist each worker
    has its own base temporary folder; their common parent belongs to this run
    only, so the workers build there in turn under a file lock: the first
    builds and writes the result beside the folder, the others read it (the
    files are only read by the tests). A worker that failed halfway leaves no
    result, and the next one starts over."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent
    folder, result = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if result.exists():
            return json.loads(result.read_text())
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        value = build(folder)
        result.write_text(json.dumps(value))
        return value


def _build_data(raw):
    write_parallel_data(raw)
    for lang in ("src", "tgt"):
        open(raw / f"empty.{lang}", "w").close()
    dest = raw / "bin"
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref",
         f"{raw / 'test'},{raw / 'empty'}", "--destdir", dest, "--joined-dictionary",
         "--workers", "1"])
    # fairseq names the second test prefix test1: call it 'empty'.
    for f in os.listdir(dest):
        if f.startswith("test1."):
            os.rename(dest / f, dest / f.replace("test1.", "empty.", 1))
    return str(dest)


def tiny_data(tmp_path_factory):
    """Binarized tiny copy task (train/valid/test) plus an empty 'empty' split."""
    if "data" not in _CACHE:
        _CACHE["data"] = Path(_once(tmp_path_factory, "analysis_raw", _build_data))
    return _CACHE["data"]


def _build_runs(folder, data):
    runs = {}
    for name, arch, extra in [
        ("unas", "transformer", []),
        ("dnas", "transformer_dnas", []),
        ("hnas", "transformer_hnas", ["--hybrid-init", str(HYBRID_INIT)]),
    ]:
        save = folder / f"analysis_{name}"
        save.mkdir()
        args = [data, "--arch", arch, *TRAIN, *extra, "--save-dir", save]
        if name == "hnas":
            tb_out = save / "tensorboard_records.json"
            proc = run([sys.executable, "-c", _TB_RUNNER, tb_out, *args,
                        "--tensorboard-logdir", save / "tb"])
            with open(tb_out) as f:
                tb = json.load(f)
        else:
            proc = run(["fairseq-train", *args])
            tb = None
        log = proc.stdout + proc.stderr
        assert "done training" in log, log[-2000:]
        runs[name] = {"dir": str(save), "log": log, "tb": tb}
    return runs


def tiny_runs(tmp_path_factory):
    """name -> {'dir': save dir, 'log': training stdout+stderr, 'tb': TensorBoard records}."""
    if "runs" not in _CACHE:
        data = tiny_data(tmp_path_factory)
        runs = _once(tmp_path_factory, "analysis_runs", lambda folder: _build_runs(folder, data))
        for entry in runs.values():
            entry["dir"] = Path(entry["dir"])
        _CACHE["runs"] = runs
    return _CACHE["runs"]
