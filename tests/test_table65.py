"""examples/discrete/table65.sh (multiview arithmetic, Kinley 2020 Table 6.5):
the per-depth accuracy against a hand-computed case, the table (mean +-
standard error over seeds, majority baseline, the thesis's rows), bad input
refused in one line, and a tiny end-to-end run of the driver."""

import json
import math
import os
import subprocess
import sys

import pytest
from helpers import ROOT, run

import arithmetic_table as T  # examples/discrete/ (tests/conftest.py puts it on sys.path)

HERE = os.path.join(ROOT, "examples", "discrete")
TABLE = os.path.join(HERE, "arithmetic_table.py")
DRIVER = os.path.join(HERE, "table65.sh")


def test_accuracy_by_depth_hand_computed():
    preds = ["0", "1", "2", "3", "4", "0", "1"]
    gold = ["0", "1", "0", "3", "0", "0", "4"]
    depths = [1, 1, 1, 2, 2, 3, 3]
    # all: 0,1,3,0(6th) right = 4 of 7; depth 1: 2 of 3; depth 2: 1 of 2; depth 3: 1 of 2
    assert T.accuracy_by_depth(preds, gold, depths) == {"all": 400 / 7, 1: 200 / 3, 2: 50.0, 3: 50.0}
    assert T.accuracy_by_depth(["1"], ["1"], [2]) == {"all": 100.0, 1: None, 2: 100.0, 3: None}
    with pytest.raises(T.BadInput, match="parallel"):
        T.accuracy_by_depth(["1", "2"], ["1"], [1])


def _fake_out(tmp_path, runs):
    """OUT with data/ (6 test expressions, 2 per depth; the training values
    make 3 the majority) and <model>-seed<N>/predictions.json from ``runs``."""
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    gold = ["1", "2", "3", "4", "0", "3"]
    for view in T.VIEWS:
        (out / "data" / f"test.{view}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"e{i}\t{g}\n" for i, g in enumerate(gold)))
    (out / "data" / "train.infix.tsv").write_text("sentence\tlabel\n" + "x\t3\nx\t3\nx\t0\n")
    (out / "data" / "test.depth").write_text("1\n1\n2\n2\n3\n3\n")
    for (model, seed), views in runs.items():
        (out / f"{model}-seed{seed}").mkdir()
        (out / f"{model}-seed{seed}" / "predictions.json").write_text(json.dumps({"views": views}))
    return out


def test_table_is_mean_and_standard_error_over_seeds(tmp_path):
    right = ["1", "2", "3", "4", "0", "3"]
    out = _fake_out(tmp_path, {
        ("infix", 1): {"infix": right},                                      # 100, depths 100 100 100
        ("infix", 2): {"infix": ["1", "0", "3", "0", "0", "0"]},             # 50, depths 50 50 50
        ("multiview", 1): {"infix": right, "prefix": ["0"] * 6},             # prefix: 1 of 6 (depth 3: 50)
    })
    (out / "prefix-seed1").mkdir()  # unfinished: not counted
    proc = run([sys.executable, TABLE, out])
    rows = (out / "table.md").read_text().splitlines()
    assert proc.stdout == (out / "table.md").read_text()
    se = math.sqrt(((100 - 75) ** 2 + (50 - 75) ** 2) / 1 / 2)  # = 25
    cells = " | ".join([f"75.0 +- {se:.1f}"] * 4)
    assert rows[2] == f"| two-stream (one view) | infix | 2 | {cells} | 66.0 | 97.6 | 63.7 | 36.8 |"
    assert rows[3] == "| multiview two-stream | infix | 1 | 100.0 | 100.0 | 100.0 | 100.0 | 68.3 | 97.9 | 66.9 | 40.1 |"
    assert rows[4] == f"| multiview two-stream | prefix | 1 | {100 / 6:.1f} | 0.0 | 0.0 | 50.0 | 65.3 | 97.9 | 62.6 | 35.5 |"
    # always 3 (the training majority): test values 3 at depth 2 and depth 3
    assert rows[5] == f"| majority value (3) of training | - | - | {100 / 3:.1f} | 0.0 | 50.0 | 50.0 | - | - | - | - |"
    assert len(rows) == 6


def test_table_refuses_bad_input_in_one_line(tmp_path):
    proc = run([sys.executable, TABLE, tmp_path / "nothing"], check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == f"arithmetic_table.py: error: {tmp_path / 'nothing'}: no such folder"
    out = _fake_out(tmp_path, {("infix", 1): {"infix": ["1", "2"]}})  # 2 predictions for 6 expressions
    proc = run([sys.executable, TABLE, out], check=False)
    assert proc.returncode == 1 and "must be parallel" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (out / "table.md").exists()


@pytest.mark.parametrize("setting,message", [
    ({"MODELS": "infix postfix"}, "MODEL=postfix: choose infix, prefix or multiview"),
    ({"N_TRAIN": "ten"}, "N_TRAIN=ten: give a whole number >= 1"),
    ({"N_VALID": "50", "N_TRAIN": "20"}, "N_VALID=50: at most N_TRAIN=20"),
    ({"ARCH_SIZE": "huge"}, "ARCH_SIZE=huge: choose thesis, small or base"),
    ({"SPLIT": "random"}, "SPLIT=random: choose iid or disjoint"),
    ({"SCHEDULE": "cosine"}, "SCHEDULE=cosine: choose fixed or polynomial_decay"),
])
def test_driver_refuses_bad_settings_in_one_line(tmp_path, setting, message):
    env = {**os.environ, "OUT": str(tmp_path / "out"), **setting}
    proc = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("[table65] error: ") and message in line
    assert not (tmp_path / "out").exists()


@pytest.mark.full  # fairseq start-up dominates: 40-80 s on the busy 2-core machine
def test_driver_end_to_end_tiny(tmp_path):
    """Data, binarized views, one multiview run (2 updates, 1 layer), its
    predictions and the table; a second call skips what is done."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "FAIRSEQ_DNAS_CHECKED_PYTHON": sys.executable, "PYTHONPATH": ROOT,
           "OUT": str(out), "N_TRAIN": "60", "N_TEST": "12", "N_VALID": "6",
           "MODELS": "multiview", "SEEDS": "1", "LAYERS": "1", "MAX_UPDATE": "2", "WARMUP": "1",
           "VALIDATE_INTERVAL": "2", "LOG_INTERVAL": "1", "PROGRESS": "0"}
    proc = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (out / "table.md").read_text().splitlines()
    assert [r.split(" | ")[:3] for r in rows[2:4]] == [["| multiview two-stream", "infix", "1"],
                                                      ["| multiview two-stream", "prefix", "1"]]
    assert rows[4].startswith("| majority value (")
    preds = json.loads((out / "multiview-seed1" / "predictions.json").read_text())["views"]
    assert set(preds) == {"infix", "prefix"} and all(len(p) == 12 and set(p) <= set("01234") for p in preds.values())
    # The two views of line k are one expression: the binarized test splits hold 12 parallel lines.
    for view in ("infix", "prefix"):
        assert (out / "text" / f"test.{view}").read_text().count("\n") == 12
    again = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "multiview seed 1 done" in again.stderr
    assert "3/5" not in again.stderr and (out / "table.md").read_text().splitlines() == rows
    # A finished training is not resumed (fairseq, resumed at --max-update,
    # takes one more update): only the predictions are made again.
    (out / "multiview-seed1" / "predictions.json").unlink()
    redo = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True, timeout=600)
    assert redo.returncode == 0 and "multiview seed 1: trained already" in redo.stderr, redo.stderr[-3000:]
    import torch

    state = torch.load(out / "multiview-seed1" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert (out / "table.md").read_text().splitlines() == rows
    # An unfinished run is not resumed under another schedule.
    (out / "multiview-seed1" / "predictions.json").unlink()
    changed = subprocess.run(["bash", DRIVER], env={**env, "MAX_UPDATE": "3"}, capture_output=True, text=True,
                             timeout=600)
    assert changed.returncode == 1 and "multiview-seed1 was prepared with other settings" in changed.stderr
    assert "MAX_UPDATE=2 " in changed.stderr and "MAX_UPDATE=3 " in changed.stderr
