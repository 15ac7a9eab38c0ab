"""examples/gigaword/run_seeds.sh with JOBS=2 on CPU: two
train+decode jobs at once, stopped midway and resumed to the same table."""

import os
import shutil
import signal
import subprocess
import time

import pytest
from recipe_data import make_binarized

from helpers import ROOT

RUN_SEEDS = os.path.join(ROOT, "examples", "gigaword", "run_seeds.sh")
ARCHS = ("transformer_dnas", "transformer_hnas")
TINY = {"SIZE": "tiny", "DEVICE": "cpu", "BATCH_SENTENCES": "32", "MAX_UPDATE": "24", "LR": "1e-3",
        "WARMUP_UPDATES": "2", "VALIDATE_INTERVAL_UPDATES": "3", "EVAL_ROUGE": "0", "LOG_INTERVAL": "1",
        "BEAM": "2", "LEAD_WORDS": "3", "JOBS": "2", "SEEDS": "1", "ARCHS": " ".join(ARCHS)}


@pytest.fixture
def setup(tmp_path):
    data = tmp_path / "data"
    make_binarized(str(data))
    (data / "raw").mkdir()
    for side in ("article", "title"):  # the test set as released (lead baseline, references)
        shutil.copy(data / "text" / f"test.{side}", data / "raw" / f"test.{side}")
    env = {**os.environ, **TINY, "DATA_DIR": str(data), "RESULTS": str(tmp_path / "results"),
           "CKPT_ROOT": str(tmp_path / "ckpt")}
    return tmp_path, env


def _running(path):
    """Processes whose command line mentions ``path`` (read-only look at ps)."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if str(path) in line and "ps -eo" not in line]


def test_two_jobs_at_once_stopped_and_resumed(setup):
    tmp_path, env = setup
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(["bash", RUN_SEEDS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # Stop the whole run once one job has written a checkpoint (the first comes
    # at update 3 of 24, so both jobs are still training when it is stopped,
    # however fast the machine).
    deadline = time.time() + 300
    while not list(ckpt.glob("*/checkpoint_last.pt")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "interrupted: running jobs stopped" in err, err
    # Both jobs were running at once: both started before either finished.
    started = [line for line in err.splitlines() if ": started (CPU, 1 threads" in line]
    assert len(started) == 2 and "finished" not in err, err
    time.sleep(1)
    assert _running(ckpt) == [], _running(ckpt)  # no job left behind
    assert not (tmp_path / "results" / "table.md").exists()

    again = subprocess.run(["bash", RUN_SEEDS], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    logs = "".join((tmp_path / "results" / arch / "seed1.log").read_text() for arch in ARCHS)
    assert "resuming from" in logs, logs[-3000:]
    # Each job's console: training and decoding progress (21 test sentences).
    assert logs.count("[train] update 24/24 (100%)") == 2, logs[-3000:]
    assert logs.count("[generate] 21/21 sentences (100%)") == 2, logs[-3000:]
    table = (tmp_path / "results" / "table.md").read_text()
    for name in ("DNAS encoder | 1 |", "HNAS encoder | 1 |", "lead-3 | 1 |"):
        assert name in table, table
