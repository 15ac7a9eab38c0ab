"""benchmarks/bench_discrete.py runs at its smallest size and writes sane
JSON; no timing is asserted (timings belong to the benchmark)."""

import json
import math
import os
import subprocess
import sys

import torch
from helpers import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "bench_discrete.py")
TINY = ["--size", "tiny", "--rounds", "1", "--batch", "2", "--gen-batch", "2", "--src-len", "6", "--tgt-len", "5",
        "--vocab", "64"]


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=os.path.join(ROOT, "benchmarks"), capture_output=True,
                          text=True, timeout=300)


def test_tiny_run_times_both_sections(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run(*TINY, "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    got = {(r["section"], r["model"]) for r in rows}
    assert got == {("update", "transformer"), ("update", "discrete_single"), ("generate", "transformer"),
                   ("generate", "discrete_single"), ("generate", "discrete_product")}
    for r in rows:
        assert math.isfinite(r["time_ratio"]) and r["time_ratio"] > 0 and r["median_s"] > 0, r
    assert {r["arch"] for r in rows if r["model"] != "transformer"} == {"transformer_discrete_single"}
    assert all(r["sentences_per_s"] > 0 for r in rows if r["section"] == "generate")
    assert json.loads(out.read_text())["settings"]["device"] == "cpu"


def test_sections_and_device_are_checked():
    proc = _run(*TINY, "--sections", "generate,beam")
    assert proc.returncode == 2 and "--sections" in proc.stderr.strip().splitlines()[-1]
    if not torch.cuda.is_available():
        proc = _run(*TINY, "--device", "cuda")
        assert proc.returncode == 2 and "torch sees no CUDA device" in proc.stderr.strip().splitlines()[-1]
