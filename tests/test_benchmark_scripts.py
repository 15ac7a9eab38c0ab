"""Every script in benchmarks/ runs: each at its smallest size on CPU, or,
where it needs CUDA, its --help, its argument checks and its refusal without
a GPU.

No timing is asserted (a benchmark's figures belong to the benchmark): only
that each script exits 0 and prints or writes the figures it promises (its
rows, ratios, JSON keys), and that bad input is one clear line with a
non-zero exit. ``SCRIPTS`` says which test runs each file, and the first test
fails when a file in benchmarks/ has no test or no line in
benchmarks/README.md.
"""

import json
import math
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers import ROOT, run, write_parallel_data

BENCH = os.path.join(ROOT, "benchmarks")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")

# file in benchmarks/ -> "test file::test" that runs it (benchmark.py's sections are its modules)
SCRIPTS = {
    "benchmark.py": "test_benchmark.py::test_quick_benchmark_writes_json",
    "bench_common.py": "test_benchmark.py::test_quick_benchmark_writes_json",
    "bench_module.py": "test_benchmark.py::test_quick_benchmark_writes_json",
    "bench_model.py": "test_benchmark.py::test_quick_benchmark_writes_json",
    "bench_report.py": "test_benchmark.py::test_gpu_targets_read_the_kernels_alone_at_1024_positions",
    "bench_kernels.py": "test_benchmark.py::test_quick_kernels_section_times_long_short_and_sdpa",
    "bench_roberta.py": "test_benchmark.py::test_quick_roberta_benchmark_writes_json",
    "bench_update.py": "test_benchmark_scripts.py::test_bench_update_smallest_command_writes_a_row_per_case",
    "bench_discrete.py": "test_bench_discrete.py::test_tiny_run_times_both_sections",
    "bench_two_stream.py": "test_benchmark_scripts.py::test_bench_two_stream_smallest_size",
    "bench_hf.py": "test_benchmark_scripts.py::test_bench_hf_quick",
    "bench_compile.py": "test_hf_compile.py::test_bench_compile_quick",
    "gpu_quick.py": "test_benchmark_scripts.py::test_gpu_quick_dry_run_prints_the_plan_of_every_part",
    "gpu_lean.py": "test_lean.py::test_gpu_lean_stand_in_writes_every_file",
    "gpu_dropout_mask.py": "test_benchmark_scripts.py::test_gpu_dropout_mask_interpreter_masks_on_cpu",
    "gpu_train_fp16.sh": "test_benchmark_scripts.py::test_gpu_train_fp16_on_cpu_at_tiny_size",
    "gpu_session.sh": "test_benchmark_scripts.py::test_gpu_session_dry_run_prints_the_plan",
    "bench_cpu_threads.py": "test_machine_defaults.py::test_bench_cpu_threads_smallest_run",
    "triton_spills.py": "test_triton_tiles.py::test_kernels_compile_for_an_h100_within_the_tile_rule",
    "triton_tiles.py": "test_triton_tiles.py::test_tuner_times_every_candidate_and_the_kernels_read_its_file",
}


def _positive(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def _script(name, *args, check=True, env=None):
    """benchmarks/NAME with ``args`` (through the tests' fork server: torch and fairseq imported once)."""
    return run([sys.executable, os.path.join(BENCH, name), *map(str, args)], cwd=ROOT, check=check, env=env)


def test_every_benchmark_script_is_run_by_a_test_and_listed_in_the_readme():
    files = sorted(f for f in os.listdir(BENCH) if f.endswith((".py", ".sh")))
    assert sorted(SCRIPTS) == files, "a file in benchmarks/ without a test here, or a test of a file now gone"
    for name, where in SCRIPTS.items():
        test_file, test = where.split("::")
        with open(os.path.join(ROOT, "tests", test_file)) as f:
            assert re.search(rf"^def {test}\(", f.read(), re.M), f"{name}: {where} does not exist"
    with open(os.path.join(BENCH, "README.md")) as f:
        listed = set(re.findall(r"^\| `([\w.]+)` \|", f.read(), re.M))
    assert set(files) <= listed, f"benchmarks/README.md does not list {sorted(set(files) - listed)}"


# -- whole models on CPU at their smallest size ---------------------------------------------------------

TINY_TRANSLATION = ["--size", "tiny", "--batch", "2", "--gen-batch", "2", "--src-len", "8", "--tgt-len", "8",
                    "--rounds", "1", "--vocab", "50"]


def test_bench_two_stream_smallest_size(tmp_path):
    """The weight copy into each stream's own embeddings (the KeyError of
    2026-11-28) is strict: every two-stream parameter comes from one of the
    transformer's; both sections write their rows."""
    out = tmp_path / "two_stream.json"
    _script("bench_two_stream.py", *TINY_TRANSLATION, "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["section"], r["model"]) for r in rows] == [
        ("update", "transformer"), ("update", "two_stream_soft"), ("update", "two_stream_discrete"),
        ("generate", "transformer"), ("generate", "two_stream_discrete")]
    assert all(_positive(r["median_s"]) and _positive(r["time_ratio"]) for r in rows)
    assert [r["target"] for r in rows if r["section"] == "update"] == [None, 2.1, 2.1]
    assert all(_positive(r["sentences_per_s"]) for r in rows if r["section"] == "generate")


def test_two_stream_parameters_take_the_transformers_of_the_same_name():
    from bench_two_stream import transformer_name

    assert transformer_name("encoder.controller_embed_tokens.weight") == "encoder.embed_tokens.weight"
    assert transformer_name("decoder.controller_layernorm_embedding.bias") == "decoder.layernorm_embedding.bias"
    assert transformer_name("encoder.layers.0.self_attn.model_v_proj.weight") == (
        "encoder.layers.0.self_attn.v_proj.weight")
    assert transformer_name("decoder.layers.1.model_fc1.weight") == "decoder.layers.1.fc1.weight"
    assert transformer_name("encoder.layers.0.self_attn.q_proj.weight") == "encoder.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize("script", ["bench_two_stream.py", "bench_discrete.py", "bench_roberta.py", "bench_update.py"])
@NO_GPU
def test_device_cuda_without_a_gpu_is_a_usage_error(script):
    proc = _script(script, "--device", "cuda", check=False)
    assert proc.returncode == 2 and "--device cuda: torch sees no CUDA device" in proc.stderr, proc.stderr[-2000:]


def _session_dry_run(**env):
    return subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh"), "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHON=sys.executable, **env))


def test_bench_update_smallest_command_writes_a_row_per_case(tmp_path):
    """bench_update.py --quick (its README row): one row per DNAS/HNAS model
    and source length, each with its baseline, a ratio, attention's share of
    its update and of the baseline's, the ms fields; each DNAS/HNAS model
    computes something else than its baseline; the machine names the versions."""
    out = tmp_path / "update.json"
    proc = _script("bench_update.py", "--quick", "--json", out)
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["part"], r["arch"], r["baseline"], r["src_len"]) for r in rows] == [
        ("model", "bart_dnas_large", "bart_large", 32), ("model", "bart_hnas_large", "bart_large", 32),
        ("model", "roberta_dnas_base", "roberta_base", 32), ("model", "roberta_hnas_base", "roberta_base", 32)]
    for r in rows:
        assert all(_positive(r[k]) for k in ("ratio", "wall_ratio", "ms", "baseline_ms", "profiled_attention_ms",
                                              "profiled_update_ms", "baseline_profiled_attention_ms")), r
        assert r["profiled_attention_ms"] < r["profiled_update_ms"], r
        assert 0 < r["attention_share"] < 1 and 0 < r["baseline_attention_share"] < 1, r
        assert r["max_abs_diff_to_baseline"] > 0 and r["dtype"] == "float32" and r["measure"] == "cpu time"
    assert rows[0]["tgt_len"] == 8 and rows[2]["tgt_len"] is None
    assert {"torch", "triton", "cuda_version", "fairseq"} <= set(res["machine"])
    assert re.search(r"^\| bart_hnas_large \| bart_large \| 32 \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+% \|",
                     proc.stdout, re.M), proc.stdout


def test_attention_share_counts_the_ranges_forward_and_backward():
    """share_of_ranges on a real profile: the range's forward and the backward
    nodes of the operators run inside it (matched by sequence number), not the
    rest; no range is an error."""
    from torch.profiler import profile, record_function

    import bench_update

    torch.manual_seed(0)
    inside, outside = torch.nn.Linear(128, 128), torch.nn.Linear(128, 1)
    x = torch.randn(32, 128)

    def update():
        outside(inside(x).relu()).sum().backward()

    update()
    with bench_update.AttentionRanges([inside]), profile() as prof:
        with record_function("update"):
            update()
    events = prof.events()
    share, attention, total = bench_update.share_of_ranges(events, "cpu")
    forward = sum(e.cpu_time_total for e in events if e.name == bench_update.ATTENTION_RANGE)
    backward = [e for e in events if e.name.startswith(bench_update.BACKWARD_PREFIX)]
    inner, outer = sorted((e for e in backward if e.name.endswith("AddmmBackward0")), key=lambda e: e.sequence_nr)
    # inside ran first: its addmm has the smaller sequence number; outside's backward is not attention
    assert attention >= forward + inner.cpu_time_total
    assert attention <= forward + sum(e.cpu_time_total for e in backward) - outer.cpu_time_total + 1e-6
    assert 0 < share < 1 and share == pytest.approx(attention / total)
    with profile() as bare:
        with record_function("update"):
            update()
    with pytest.raises(RuntimeError, match="no encoder self-attention range"):
        bench_update.share_of_ranges(bare.events(), "cpu")


def test_attention_share_on_cuda_counts_each_kernel_once():
    """On CUDA the share is GPU-kernel time: the range's kernels (through its
    operators) and its backward nodes' over every kernel of the update,
    each counted through the operator that launched it and not again as the
    device-side event the profiler also lists."""
    from torch.autograd import DeviceType

    import bench_update

    def event(name, seq=-1, own=0.0, children=(), kind=DeviceType.CPU):
        total = own + sum(c.device_time_total for c in children)
        return SimpleNamespace(name=name, sequence_nr=seq, self_device_time_total=own, device_time_total=total,
                               cpu_children=list(children), device_type=kind, cpu_time_total=0.0)

    inside = event("aten::mm", seq=5, own=30.0)
    events = [event("update"), event(bench_update.ATTENTION_RANGE, children=[inside]), inside,
              event("aten::mm", seq=6, own=50.0),
              event(bench_update.BACKWARD_PREFIX + "MmBackward0", seq=5, own=20.0),
              event(bench_update.BACKWARD_PREFIX + "MmBackward0", seq=6, own=40.0),
              *(event("gemm kernel", own=t, kind=DeviceType.CUDA) for t in (30.0, 50.0, 20.0, 40.0))]
    share, attention, total = bench_update.share_of_ranges(events, "cuda")
    assert (attention, total) == (50.0, 140.0) and share == pytest.approx(50 / 140)


@pytest.mark.parametrize("args, message", [
    (["--cases", "bart,t5"], "--cases takes bart, roberta"),
    (["--src-lens", "512,x"], "--src-lens takes comma-separated integers"),
    (["--tokens", "0"], "--tokens takes a positive integer; got 0"),
    (["--attention-dropout", "1"], "--attention-dropout takes a probability"),
])
def test_bench_update_bad_arguments_are_one_line(args, message):
    proc = _script("bench_update.py", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


def test_kernel_rows_report_tflops_and_the_ratio_to_sdpa():
    """gpu_lean.py's kernel lines: TFLOP/s from the algorithm's matrix products
    (SDPA 7, DNAS 9, HNAS 11 a score element, 2 x head size flops each) and
    the GPU time over SDPA's of the same dtype, head size, dropout and T."""
    import gpu_lean

    assert gpu_lean.tflops("sdpa", 8, 16, 1024, 64, 1.0) == pytest.approx(7 * 2 * 64 * 8 * 16 * 1024**2 / 1e9)
    assert gpu_lean.tflops("hnas", 1, 1, 10, 4, 2.0) == pytest.approx(11 * 2 * 4 * 100 / 2e-3 / 1e12)
    row = dict(part="time", dtype="float16", head=64, dropout=0.0, T=1024)
    rows = [dict(row, set="lean", scheme="dnas", gpu_ms=2.4, tflops=201.0),
            dict(row, set="sdpa", scheme="-", gpu_ms=1.0, tflops=374.0),
            dict(row, set="long", scheme="hnas", T=4096, gpu_ms=9.0, tflops=100.0)]
    lines = gpu_lean.kernel_lines(rows)
    assert lines[0] == "lean: float16 head 64 dropout 0 T 1024 lean dnas: 2.400 ms, 201 TFLOP/s, x2.40 SDPA"
    assert lines[2].endswith("x? SDPA")  # no SDPA row at that T


@pytest.mark.parametrize("args, message", [
    (["--batch", "0"], "--batch takes a positive number; got 0"),
    (["--length", "-4"], "--length takes a positive number; got -4"),
    (["--size", "huge"], "invalid choice: 'huge'"),
])
def test_bench_roberta_bad_arguments_are_one_line(args, message):
    proc = _script("bench_roberta.py", *args, check=False)
    assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


@pytest.mark.full  # about 10 CPU s: one BERT-base-wide layer, three implementations
def test_bench_hf_quick(tmp_path):
    out = tmp_path / "hf.json"
    _script("bench_hf.py", "--quick", "--json", out)
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["sdpa", "dnas", "hnas"] and all(r["length"] == 64 for r in rows)
    assert all(_positive(r["median_s"]) and _positive(r["cpu_ratio"]) and _positive(r["memory_ratio"])
               for r in rows)
    assert rows[0]["max_abs_diff_to_sdpa"] == 0 and all(r["max_abs_diff_to_sdpa"] > 0 for r in rows[1:])


# -- the GPU scripts without a GPU ----------------------------------------------------------------------

@pytest.mark.parametrize("script, expected", [
    ("gpu_quick.py", "--breakdown-steps N"), ("gpu_dropout_mask.py", "--interpreter FILE"),
    ("bench_roberta.py", "--device {cpu,cuda}"), ("bench_two_stream.py", "--device {cpu,cuda}"),
    ("triton_tiles.py", "FAIRSEQ_DNAS_TRITON_TILES"),
    ("gpu_session.sh", "The one prepared command for a GPU machine"), ("bench_update.py", "--deadline-s"),
    ("gpu_train_fp16.sh", "fairseq-train --fp16 of the Gigaword"),
])
def test_gpu_scripts_answer_help_without_cuda(script, expected):
    """Each script that needs CUDA says what it does without one, exit 0."""
    path = os.path.join(BENCH, script)
    if script.endswith(".sh"):
        proc = subprocess.run(["bash", path, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "set -euo" not in proc.stdout, proc.stderr
    else:
        proc = _script(script, "--help")
    assert expected in proc.stdout


def test_gpu_quick_dry_run_prints_the_plan_of_every_part():
    """--dry-run needs no GPU and imports what the parts import; its plan
    comes from the settings the parts run (the exact configurations, the
    kernels part's shapes, the breakdown at T 1024)."""
    import gpu_quick

    proc = _script("gpu_quick.py", "--parts", "exact,kernels,module,breakdown", "--breakdown-steps", "7",
                   "--dry-run")
    lines = proc.stdout.splitlines()
    parts = [line.split(":")[0] for line in lines if not line.startswith(" ")]
    assert parts == ["exact", "kernels", "module", "breakdown"]
    n = len(gpu_quick.exact_configs())
    assert f"exact: {n} configurations" in proc.stdout and sum("kernels" in l for l in lines if l.startswith("  ")) >= n
    assert "head size 64, T 1024, B 8, H 16: sdpa, long" in proc.stdout
    assert "torch profiler over 7 steps; sdpa, dnas long, hnas long; head size 64, T 1024, B 8, H 16" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--parts", "exact,speed"], "unknown part(s) speed; choose from exact, kernels, module, breakdown"),
    (["--parts", ","], "unknown part(s) (none given)"),
    (["--parts", "breakdown", "--breakdown-steps", "0"], "--breakdown-steps takes a positive number of steps; got 0"),
])
def test_gpu_quick_bad_arguments_are_usage_errors(args, message):
    proc = _script("gpu_quick.py", *args, "--dry-run", check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


@NO_GPU
def test_gpu_quick_breakdown_refuses_without_a_gpu(tmp_path):
    proc = _script("gpu_quick.py", "--parts", "breakdown", "--out", tmp_path / "q", check=False)
    assert proc.returncode == 2 and "torch sees no CUDA device" in proc.stderr
    assert not (tmp_path / "q").exists()


def test_per_kernel_sums_each_kernels_device_time_per_step():
    """The breakdown's arithmetic: launches and device time a step, by kernel
    name, largest first, only the device asked for."""
    from gpu_quick import per_kernel

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [SimpleNamespace(name=n, device_type=d, device_time=us) for n, d, us in [
        ("fwd", cuda, 300.0), ("bwd", cuda, 500.0), ("fwd", cuda, 100.0), ("bwd", cuda, 700.0),
        ("aten::mm", cpu, 9999.0), ("memset", cuda, 2.0)]]
    assert per_kernel(events, steps=2) == {"bwd": (1.0, 0.6), "fwd": (1.0, 0.2), "memset": (0.5, 0.001)}
    assert list(per_kernel(events, steps=2)) == ["bwd", "fwd", "memset"]


def test_per_kernel_reads_the_profilers_events():
    """The profiler's events carry what per_kernel reads (name, device_type,
    device_time): profiled here on CPU, where the device is the CPU."""
    from torch.profiler import ProfilerActivity, profile

    from gpu_quick import per_kernel

    a = torch.randn(64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            torch.mm(a, a)
    got = per_kernel(prof.events(), steps=3, device_type=torch.autograd.DeviceType.CPU)
    assert got["aten::mm"][0] == 1.0


def test_gpu_dropout_mask_help_and_refusal():
    helped = _script("gpu_dropout_mask.py", "--help")
    assert "--interpreter FILE" in helped.stdout and "--reference FILE" in helped.stdout
    if not torch.cuda.is_available():
        proc = _script("gpu_dropout_mask.py", check=False)
        assert proc.returncode == 1 and proc.stderr.strip() == (
            "gpu_dropout_mask.py: torch sees no CUDA device; run it on a GPU machine "
            "(or --interpreter FILE on any machine)")


@pytest.mark.full  # about 10 CPU s on Triton's interpreter
def test_gpu_dropout_mask_interpreter_masks_on_cpu(tmp_path):
    """--interpreter: the masks the GPU's are compared with, computed on CPU
    tensors; each keeps about 1 - p of its elements (within 5 standard deviations)."""
    from gpu_dropout_mask import CASES

    out = tmp_path / "masks.pt"
    _script("gpu_dropout_mask.py", "--interpreter", out)
    masks = torch.load(out)
    assert len(masks) == len(CASES)
    for (shape, _, p), mask in zip(CASES, masks):
        assert tuple(mask.shape) == shape and mask.dtype == torch.bool
        n = mask.numel()
        assert abs(mask.float().mean().item() - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n), (shape, p)


FIRST_STEPS = ["kernels", "tiles", "model"]
REST_STEPS = ["exact", "lean", "breakdown", "short", "module", "tests", "benchmark", "mask", "train"]


def test_gpu_session_dry_run_prints_the_plan():
    """benchmarks/gpu_session.sh --dry-run: the first steps (kernels alone,
    lean tiles, whole models) within their 5-minute deadline, then the rest,
    each with its timeout and log under OUT; the whole-model cases and
    gpu_quick.py's plan; nothing is written."""
    proc = _session_dry_run(OUT="/nonexistent/out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = re.findall(r"^step (\w+): timeout (\d+) s(?: \(first, by (\d+) s\))?: (.*) > /nonexistent/out/\1\.log$",
                       proc.stdout, re.M)
    assert [s[0] for s in steps] == FIRST_STEPS + REST_STEPS
    assert all(s[2] == "300" for s in steps[:3]) and not any(s[2] for s in steps[3:])
    first = sum(int(s[1]) for s in steps[:3])
    assert first <= 300 and f"first steps: timeouts {first} s, deadline 300 s" in proc.stdout
    commands = {name: cmd for name, _, _, cmd in steps}
    assert "gpu_lean.py --no-exact --dtypes float16 --heads 64 --dropouts 0 --lengths 512,1024,2048,4096" \
        in commands["kernels"] and "--out /nonexistent/out/kernels" in commands["kernels"]
    assert re.search(r"triton_tiles\.py --lean --json /nonexistent/out/tiles\.json --deadline-s \d+$", commands["tiles"])
    assert "bench_update.py --device cuda" in commands["model"] and "--json /nonexistent/out/model.json" in commands["model"]
    assert "gpu_quick.py --parts breakdown" in commands["breakdown"] and "gpu_quick.py --parts kernels" in commands["short"]
    assert "bart_dnas_large, bart_hnas_large against bart_large: 8 x 1024 source + 128 target tokens" in proc.stdout
    assert "roberta_dnas_base, roberta_hnas_base against roberta_base: 16 x 512 tokens" in proc.stdout
    assert "(cuda: float16, wall clock;" in proc.stdout
    assert "breakdown: GPU time of each kernel" in proc.stdout and "exact: 22 configurations" in proc.stdout
    only_first = _session_dry_run(OUT="/nonexistent/out", STEPS="tiles,kernels")  # (no Python: no model step)
    assert re.findall(r"^step (\w+):", only_first.stdout, re.M) == ["kernels", "tiles"]
    assert "gpu_quick.py's parts" not in only_first.stdout and "model's cases" not in only_first.stdout


@NO_GPU
@pytest.mark.parametrize("wheels, message", [
    (["ve_fairseq-0.12.3-py3-none-any"], "no wheel hydra_core-*.whl in"),
    (["ve_fairseq-0.12.3-x", "hydra_core-1", "omegaconf-2", "antlr4_python3_runtime-4", "bitarray-3"],
     "torch sees no CUDA device"),
    (None, "torch sees no CUDA device"),  # no wheel folder: this Python has fairseq
])
def test_gpu_session_checks_wheels_then_the_gpu_in_one_line(tmp_path, wheels, message):
    folder = tmp_path / "whl"
    if wheels is not None:
        folder.mkdir()
        for name in wheels:
            (folder / f"{name}.whl").write_text("")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env=dict(os.environ, PYTHON=sys.executable, WHEELS=str(folder), OUT=str(out)))
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr and proc.stdout == ""
    assert not out.exists()


def test_gpu_session_without_wheels_needs_a_python_with_fairseq(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text("#!/usr/bin/env bash\nexit 1\n")  # imports nothing
    fake.chmod(0o755)
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHON=str(fake), WHEELS=str(tmp_path / "none"),
                                               OUT=str(tmp_path / "out")))
    assert proc.returncode == 1 and "no wheel folder" in proc.stderr and "scripts/install.sh" in proc.stderr
    assert not (tmp_path / "out").exists()


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for the GPU machine's python3: each call answers as the real one would, in no time.
case "$1" in
  -) if [ $# -gt 1 ]; then echo "gpu X torch 0 triton 0 cuda 12 fairseq 0"; echo '{"torch": "0"}' > "$2"
     else cat >/dev/null; fi ;;                              # the versions / the GPU check (program on stdin)
  -m) echo "$@" >> "$(dirname "$0")/pip.args" ;;            # pip install, pytest
  benchmarks/gpu_lean.py) echo '{"part": "meta"}'; echo "lean: float16 head 64 dropout 0 T 1024 lean dnas: 1 ms" ;;
  benchmarks/triton_tiles.py) sleep 30 ;;                   # cut at its timeout
  benchmarks/bench_update.py) echo "| bart_dnas_large | bart_large | 1024 | 1 | 1 | 1.0 | 10% | 9% |" ;;
  benchmarks/gpu_quick.py)
    case "$3" in
      exact) echo '{"part": "exact", "ok": true}'; echo '{"part": "exact", "ok": true}'
             echo '{"part": "exact done", "seconds": 1}' ;;
      breakdown) echo '{"part": "breakdown", "kernel": "(all kernels)", "case": "sdpa"}' ;;
      kernels) echo '{"part": "kernels done", "seconds": 1}' ;;
      module) echo '{"part": "module done", "seconds": 1}' ;;
    esac ;;
  benchmarks/benchmark.py|benchmarks/gpu_dropout_mask.py) echo "ran $1" ;;
  *) exit 3 ;;
esac
"""


def test_gpu_session_runs_each_step_under_its_timeout_and_logs_it(tmp_path):
    """The session's driver on a stand-in python (no GPU here): the wheels
    installed, the versions recorded, each step's output in its own log, a
    step cut at its timeout reported and the others still run, the first
    steps held to their deadline, train skipped without data, exit 1."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name in ("ve_fairseq-0.12.3-x", "hydra_core-1", "omegaconf-2", "antlr4_python3_runtime-4", "bitarray-3"):
        (wheels / f"{name}.whl").write_text("")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=str(fake), WHEELS=str(wheels), OUT=str(out), SITE=str(tmp_path / "site"),
               T_TILES="30", FIRST_S="3", TRAIN_DATA=str(tmp_path / "no-data"))
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (out / "session.log").read_text()
    assert log == proc.stdout
    assert "--target " + str(tmp_path / "site") in (fake.parent / "pip.args").read_text()
    assert "torch 0 triton 0 cuda 12" in log and json.loads((out / "versions.json").read_text()) == {"torch": "0"}
    assert re.findall(r"^== \[\d+ s\] (\w+) \(timeout", log, re.M) == [
        "kernels", "tiles", *REST_STEPS[:-1]]
    assert re.search(r"tiles \(timeout [1-3] s\)", log)  # the first steps' deadline, not T_TILES
    assert "tiles: cut at its timeout" in log and "model: not started (the first steps' deadline of 3 s" in log
    assert "lean: float16 head 64 dropout 0 T 1024 lean dnas" in log
    assert "exact: 2 configurations ok, 0 not" in log and '"kernel": "(all kernels)"' in log
    assert '"part": "kernels done"' in log and '"part": "module done"' in log and "module: exit 0" in log
    assert "train: skipped (no TRAIN_DATA folder" in log
    assert log.rstrip().endswith("done; steps that failed or were cut: tiles model")
    logs = sorted(p.name for p in out.iterdir())
    assert logs == sorted(["session.log", "versions.json", *(f"{s}.log" for s in ["kernels", "tiles", *REST_STEPS[:-1]])])


@pytest.mark.parametrize("argv, env, status, message", [
    (["--bogus"], {}, 2, "unknown argument '--bogus'"),
    ([], {"T_MODULE": "0"}, 2, "take positive integers; got '0'"),
    ([], {"STEPS": "kernels,quick"}, 2, "unknown step 'quick' in STEPS=kernels,quick"),
    ([], {"T_MODEL": "40"}, 2, "T_MODEL must be more than 45 s"),
])
def test_gpu_session_bad_input(argv, env, status, message):
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh"), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, **env))
    assert proc.returncode == status and message in proc.stderr


@pytest.mark.full  # two fairseq-train runs through examples/gigaword/train.sh (about 30 CPU s)
def test_gpu_train_fp16_on_cpu_at_tiny_size(tmp_path):
    """gpu_train_fp16.sh's chain with SIZE=tiny DEVICE=cpu on a tiny
    article/title set: each model trains, the loss table and the speed line
    come out."""
    raw = tmp_path / "raw"
    raw.mkdir()
    write_parallel_data(raw, sizes=(("train", 120), ("valid", 20), ("test", 10)))
    for f in raw.iterdir():
        f.rename(f.with_suffix({".src": ".article", ".tgt": ".title"}[f.suffix]))
    run(["fairseq-preprocess", "--source-lang", "article", "--target-lang", "title", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--destdir", tmp_path / "bin", "--joined-dictionary", "--workers", "1"])
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_train_fp16.sh")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=dict(
                              os.environ, DATA=str(tmp_path / "bin"), OUT_DIR=str(out), PYTHON=sys.executable,
                              SIZE="tiny", DEVICE="cpu", KERNEL_PATH="auto", MAX_UPDATE="4", LOG_INTERVAL="1",
                              BATCH_SENTENCES="16", ARCHS="transformer transformer_dnas"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| update | transformer | transformer_dnas |" in proc.stdout
    assert re.search(r"^\| 4 \| [\d.]+ \| [\d.]+ \|$", proc.stdout, re.M), proc.stdout[-2000:]
    assert "| updates/s (median, first interval left out) |" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["train-transformer.log", "train-transformer_dnas.log"]


def test_times_plugin_writes_each_tests_seconds(tmp_path):
    """tests/times_plugin.py (moved from benchmarks/) loads with -p tests.times_plugin and writes its TSV."""
    (tmp_path / "test_sample.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    assert False\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    tsv = tmp_path / "times.tsv"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.times_plugin",
                           f"--test-times={tsv}", "-c", str(tmp_path / "pytest.ini"), str(tmp_path / "test_sample.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # test_b fails on purpose
    rows = [line.split("\t") for line in tsv.read_text().splitlines()]
    assert [(r[0].split("::")[1], r[1]) for r in rows] == [("test_a", "passed"), ("test_b", "failed")]
    assert all(float(r[2]) >= 0 and float(r[3]) >= 0 for r in rows)
    assert "test times by file (CPU seconds" in proc.stdout
