"""benchmarks/benchmark.py --quick runs end to end and writes sane JSON.

No timing is asserted (timings belong to the benchmark, not the tests): only
that every section ran, ratios are finite and positive, the paths are the
ones ``auto`` should pick and the attention stayed exact.
"""

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

SCRIPT = os.path.join(ROOT, "benchmarks", "benchmark.py")


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_benchmark_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["machine"]["torch"] and res["machine"]["torch_threads"] >= 1
    assert res["settings"]["quick"] is True and res["complete"] is True

    module = [r for r in res["module"] if "skipped" not in r]
    cases = {r["case"] for r in module}
    assert cases == {"fairseq", "unas", "dnas", "hnas", "sinkhorn3"}
    for r in module:
        assert _positive(r["median_ms"]) and _positive(r["time_ratio"]), r
        assert _positive(r["peak_mib"]) and _positive(r["memory_ratio"]), r
        if r["case"] == "fairseq":
            assert r["memory_ratio"] == 1.0
        if "max_abs_error" in r:
            assert r["max_abs_error"] <= 1e-5, r
    # Every DNAS/HNAS row at dropout 0 was checked against the float64 reference.
    checked = [r for r in module if r["case"] in ("dnas", "hnas", "sinkhorn3") and r["dropout"] == 0.0]
    assert checked and all("max_abs_error" in r for r in checked)
    assert {r["path"] for r in module if r["case"] == "sinkhorn3"} == {"materialized"}
    assert {r["path"] for r in module if r["case"] == "dnas" and r["dropout"] > 0} == {"dense"}

    assert {r["case"] for r in res["crossover"]} == {"fairseq", "dnas-dense", "dnas-fused", "hnas-dense",
                                                     "hnas-fused"}
    for section in ("model", "generate"):
        rows = res[section]
        assert {r["model"] for r in rows} == {"transformer", "transformer_dnas", "transformer_hnas"}
        assert all(_positive(r["time_ratio"]) for r in rows)
    assert all(_positive(r["target_words_per_s"]) for r in res["model"])
    assert all(_positive(r["sentences_per_s"]) for r in res["generate"])
    names = {t["target"] for t in res["targets"]}
    assert {"module_128_dnas_time", "long_dnas_memory", "long_exact", "model_dnas_time"} <= names

    # --render turns the JSON back into the tables of docs/results/.
    md = subprocess.run([sys.executable, SCRIPT, "--render", str(out)], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert md.returncode == 0, md.stderr[-2000:]
    assert "| dtype | T | batch |" in md.stdout and "| transformer_dnas |" in md.stdout
    assert md.stdout.count("| sinkhorn3 |") == len(res["settings"]["lengths"]) + 1

    # Sections from separate runs (--sections) render together, targets recomputed.
    first = {k: v for k, v in res.items() if k not in ("model", "generate", "targets")}
    second = {k: v for k, v in res.items() if k not in ("module", "crossover", "targets")}
    (tmp_path / "a.json").write_text(json.dumps(first))
    (tmp_path / "b.json").write_text(json.dumps(second))
    merged = subprocess.run([sys.executable, SCRIPT, "--render", str(tmp_path / "a.json"),
                             str(tmp_path / "b.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr[-2000:]
    assert merged.stdout == md.stdout


@pytest.mark.parametrize("args, message", [
    (["--sections", "module,nonsense"], "unknown section"),
    (["--dtypes", "fp8"], "--dtypes takes"),
])
def test_bad_arguments_exit_2(args, message):
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused():
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--device", "cuda"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr


def test_peak_memory_counts_the_benchmark_device_not_the_gpu():
    """A CPU run on a GPU machine used to read the CUDA allocator's counters
    (peak memory 0 for CPU work): the device decides, not the machine."""
    import benchmark

    assert benchmark.DEVICE.type == "cpu"
    peak = benchmark.peak_memory_bytes(lambda: torch.ones(1 << 20).sum())
    assert peak >= 4 << 20


def test_quick_roberta_benchmark_writes_json(tmp_path):
    """benchmarks/bench_roberta.py --quick: the three masked-LM encoders timed
    on one update each, the DNAS/HNAS outputs differing from roberta's."""
    out = tmp_path / "roberta.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_roberta.py"), "--quick",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["arch"] for r in rows] == ["roberta", "roberta_dnas", "roberta_hnas"]
    for r in rows:
        assert _positive(r["median_s"]) and _positive(r["cpu_ratio"]) and _positive(r["memory_ratio"]), r
    assert rows[0]["max_abs_diff_to_roberta"] == 0 and all(r["max_abs_diff_to_roberta"] > 0 for r in rows[1:])
    assert "target roberta_hnas: CPU time x" in proc.stdout


def test_quick_discrete_roberta_benchmark_writes_json(tmp_path):
    """bench_roberta.py --discrete --quick: the four classifiers timed on one
    training step each (padded sentences), each discrete model's output
    differing from its soft model's; the noise timings and the targets."""
    out = tmp_path / "discrete.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_roberta.py"), "--discrete",
                           "--quick", "--threads", "1", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    models = [r for r in rows if "arch" in r]
    assert [r["arch"] for r in models] == ["roberta_thesis", "roberta_two_stream_thesis",
                                           "roberta_discrete_single_thesis", "roberta_discrete_thesis"]
    for r in models:
        assert _positive(r["cpu_median_s"]) and _positive(r["cpu_ratio"]) and r["tokens"] < 4 * 32, r
    assert [r["max_abs_diff_to_soft"] > 0 for r in models] == [False, False, True, True]
    assert [r.get("target_baseline") for r in models] == [None, None, "roberta", "roberta_two_stream"]
    assert all(_positive(ms) for ms in rows[-1]["noise_cpu_ms"].values())
    assert "target roberta_discrete: CPU time x" in proc.stdout and "of roberta_two_stream (target 1.1)" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU stand-in for the GPU run")
@pytest.mark.full  # about a minute on the interpreter; the kernels are proved in tests/test_triton*.py
def test_quick_kernels_section_times_long_short_and_sdpa(tmp_path):
    """--sections kernels under Triton's interpreter (conftest sets TRITON_INTERPRET=1):
    SDPA, DNAS and HNAS on the long and the one-tile kernels (short: T 32 is short), dropout 0 and 0.1,
    the operation-count floor
    beside each (DNAS 9 matmuls and 4 exponentials a score against
    FlashAttention-2's 7 and 2, an exponential weighed as 1.5 matmuls)."""
    from bench_kernels import floor

    assert floor("dnas") == pytest.approx((9 / 7, 15 / 10))
    out = tmp_path / "kernels.json"
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--sections", "kernels", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["kernels"]
    assert [(r["dropout"], r["case"]) for r in rows] == [(p, c) for p in (0.0, 0.1) for c in (
        "sdpa", "dnas long", "hnas long", "dnas short", "hnas short")]
    assert all(_positive(r["wall_ms"]) and _positive(r["wall_ratio"]) for r in rows)
    assert all(r["floor"] == pytest.approx(floor(r["case"].split()[0])) for r in rows if r["case"] != "sdpa")
    md = subprocess.run([sys.executable, SCRIPT, "--render", str(out)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
    assert md.returncode == 0 and "| 32 | 0.1 | hnas short |" in md.stdout, md.stdout + md.stderr[-2000:]


GPU_QUICK = os.path.join(ROOT, "benchmarks", "gpu_quick.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_quick_refuses_without_a_gpu_and_names_its_parts(tmp_path):
    """benchmarks/gpu_quick.py (behind gpu_session.sh): a bad part is
    a usage error naming the parts; without CUDA it exits 2 and writes nothing."""
    run = dict(cwd=ROOT, capture_output=True, text=True, timeout=120)
    bad = subprocess.run([sys.executable, GPU_QUICK, "--parts", "exact,speed"], **run)
    assert bad.returncode == 2 and "unknown part(s) speed" in bad.stderr and "exact, kernels, module" in bad.stderr
    out = tmp_path / "quick"
    proc = subprocess.run([sys.executable, GPU_QUICK, "--out", str(out)], **run)
    assert proc.returncode == 2 and "torch sees no CUDA device" in proc.stderr, proc.stdout + proc.stderr
    assert not out.exists()


def test_gpu_targets_read_the_kernels_alone_at_1024_positions():
    """bench_report's GPU targets (docs/performance.md#targets): the kernels-alone rows at T 1024,
    dropout 0, each kernel set against its limit; SDPA rows, other lengths and
    CPU rows without kernel times are left out."""
    import bench_report

    def row(case, length=1024, dropout=0.0, kernel=1.0, wall=1.0):
        return dict(case=case, length=length, dropout=dropout, kernel_ratio=kernel, wall_ratio=wall)

    res = {"settings": {"device": "cuda"}, "kernels": [
        row("sdpa"), row("dnas long", kernel=3.5, wall=6.75), row("dnas short", kernel=1.9, wall=2.4),
        row("hnas short", kernel=2.7, wall=2.9), row("dnas short", length=512, kernel=9.0),
        row("dnas short", dropout=0.1, kernel=9.0), row("hnas long", kernel=None, wall=5.0)]}
    got = {(t["target"], t["where"].split()[0]): (t["measured"], t["met"])
           for t in bench_report.target_report(res, long_lengths=())}
    assert got == {
        ("kernels_dnas_kernel_time", "long"): (3.5, False), ("kernels_dnas_wall_time", "long"): (6.75, False),
        ("kernels_dnas_kernel_time", "short"): (1.9, True), ("kernels_dnas_wall_time", "short"): (2.4, True),
        ("kernels_hnas_kernel_time", "short"): (2.7, False), ("kernels_hnas_wall_time", "short"): (2.9, True),
        ("kernels_hnas_wall_time", "long"): (5.0, False),
    }
