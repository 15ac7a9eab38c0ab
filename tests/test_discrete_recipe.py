"""examples/discrete/: the Table 6.1 driver's bad input and its table (mean +- standard error over seeds)."""

import json
import math
import os
import subprocess
import sys

from helpers import ROOT, run

TABLE = os.path.join(ROOT, "examples", "discrete", "faithfulness_table.py")
DRIVER = os.path.join(ROOT, "examples", "discrete", "table61.sh")


def _summary(folder, arch, seed, acc, taus, stds):
    run_dir = folder / f"{arch}-seed{seed}"
    run_dir.mkdir(parents=True)
    for form, tau, std in zip(("grad", "grad-x-input"), taus, stds):
        (run_dir / f"summary-{form}.json").write_text(json.dumps(
            {"n": 10, "accuracy": acc, "tau_mean": tau, "tau_std": std, "left_out": 0}))


def test_table_is_mean_and_standard_error_over_seeds(tmp_path):
    sst = tmp_path / "sst"
    _summary(sst, "roberta_discrete", 1, 0.80, (0.30, 0.10), (0.2, 0.1))
    _summary(sst, "roberta_discrete", 2, 0.70, (0.50, 0.20), (0.4, 0.3))
    _summary(sst, "roberta", 1, 0.90, (0.05, 0.01), (0.1, 0.1))
    (sst / "roberta-seed2").mkdir()  # unfinished: not counted
    out = tmp_path / "table.md"
    proc = run([sys.executable, TABLE, "--out", out, f"sst={sst}"])
    rows = out.read_text().splitlines()
    assert proc.stdout == out.read_text()
    # order: roberta before roberta_discrete; s.e. of (0.3, 0.5) = sqrt(0.02 / 2) = 0.1
    assert rows[2] == "| sst | roberta | 1 | 90.0 +- nan | 0.050 +- nan | 0.100 | 0.010 +- nan | 0.100 |"
    se_acc = 100 * math.sqrt(((0.8 - 0.75) ** 2 + (0.7 - 0.75) ** 2) / 1 / 2)
    assert rows[3] == f"| sst | roberta_discrete | 2 | 75.0 +- {se_acc:.1f} | 0.400 +- 0.100 | 0.300 | 0.150 +- 0.050 | 0.200 |"


def test_table_refuses_a_missing_folder(tmp_path):
    proc = run([sys.executable, TABLE, "--out", tmp_path / "t.md", f"sst={tmp_path / 'nothing'}"], check=False)
    assert proc.returncode == 1 and proc.stderr.strip().startswith("faithfulness_table.py: error:")
    assert not (tmp_path / "t.md").exists()


def test_driver_refuses_a_missing_data_folder_in_one_line(tmp_path):
    env = {**os.environ, "SST_BINARY_DIR": str(tmp_path / "none"), "OUT": str(tmp_path / "out"), "DATASETS": "sst"}
    proc = subprocess.run(["bash", DRIVER], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    (line,) = proc.stderr.strip().splitlines()
    assert "SST_BINARY_DIR=" in line and "is not a folder" in line
    assert not list((tmp_path / "out").glob("sst/*-seed*"))
