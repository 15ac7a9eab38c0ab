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
    "bench_roberta.py": "test_benchmark_scripts.py::test_bench_roberta_session_command_on_cpu_at_tiny_size",
    "bench_discrete.py": "test_bench_discrete.py::test_tiny_run_times_both_sections",
    "bench_two_stream.py": "test_benchmark_scripts.py::test_bench_two_stream_smallest_size",
    "bench_hf.py": "test_benchmark_scripts.py::test_bench_hf_quick",
    "bench_compile.py": "test_hf_compile.py::test_bench_compile_quick",
    "gpu_quick.py": "test_benchmark_scripts.py::test_gpu_quick_dry_run_prints_the_plan_of_every_part",
    "gpu_lean.py": "test_lean.py::test_gpu_lean_stand_in_writes_every_file",
    "gpu_dropout_mask.py": "test_benchmark_scripts.py::test_gpu_dropout_mask_interpreter_masks_on_cpu",
    "gpu_measure.sh": "test_benchmark.py::test_gpu_measure_names_its_steps_and_refuses_without_a_gpu",
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


@pytest.mark.parametrize("script", ["bench_two_stream.py", "bench_discrete.py", "bench_roberta.py"])
@NO_GPU
def test_device_cuda_without_a_gpu_is_a_usage_error(script):
    proc = _script(script, "--device", "cuda", check=False)
    assert proc.returncode == 2 and "--device cuda: torch sees no CUDA device" in proc.stderr, proc.stderr[-2000:]


def _session_dry_run(**env):
    return subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh"), "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHON=sys.executable, **env))


@pytest.mark.full  # about 10 CPU s; the default tier runs bench_roberta.py --quick (tests/test_benchmark.py)
def test_bench_roberta_session_command_on_cpu_at_tiny_size(tmp_path):
    """gpu_session.sh's masked-LM command (roberta*_base, 512 tokens a block)
    with --device cpu --quick: the base presets' names at 2 layers, 32 wide,
    4 blocks of 512 tokens; each DNAS/HNAS model computes something else than
    roberta, the targets read CPU time here (wall clock on CUDA)."""
    with open(os.path.join(BENCH, "gpu_session.sh")) as f:  # its setting, as --dry-run prints it
        args = re.search(r'^ROBERTA_ARGS="\$\{ROBERTA_ARGS:-(.*)\}"', f.read(), re.M).group(1).split()
    assert args[args.index("--size") + 1] == "base" and args[args.index("--length") + 1] == "512"
    out = tmp_path / "roberta.json"
    proc = _script("bench_roberta.py", "--device", "cpu", *args, "--quick", "--json", out)
    res = json.loads(out.read_text())
    assert res["settings"]["length"] == 512 and res["settings"]["size"] == "base"
    rows = res["rows"]
    assert [r["arch"] for r in rows] == ["roberta", "roberta_dnas", "roberta_hnas"]
    assert all(r["length"] == 512 and r["measure"] == "cpu" for r in rows)
    assert all(_positive(r["median_s"]) and _positive(r["ratio"]) and _positive(r["memory_ratio"]) for r in rows)
    assert rows[0]["max_abs_diff_to_roberta"] == 0 and all(r["max_abs_diff_to_roberta"] > 0 for r in rows[1:])
    assert re.search(r"^target roberta_dnas: CPU time x[\d.]+ \(wall x", proc.stdout, re.M), proc.stdout


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
    ("gpu_session.sh", "One prepared command for a GPU machine without a package registry"),
    ("gpu_measure.sh", "Take the GPU figures"), ("gpu_train_fp16.sh", "fairseq-train --fp16 of the Gigaword"),
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


def test_gpu_session_dry_run_prints_the_plan():
    """benchmarks/gpu_session.sh --dry-run: the five steps in order, each with
    its timeout and log under OUT, the timeouts within 8 minutes, and
    gpu_quick.py's plan of its parts; nothing is written."""
    proc = _session_dry_run(OUT="/nonexistent/out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = re.findall(r"^step (\w+): timeout (\d+) s: (.*) > /nonexistent/out/\1\.log$", proc.stdout, re.M)
    assert [s[0] for s in steps] == ["exact", "lean", "breakdown", "roberta", "kernels", "module"]
    total = sum(int(s[1]) for s in steps)
    lean = int(dict((s[0], s[1]) for s in steps)["lean"])
    assert lean <= 200 and total - lean <= 450 and f"timeouts in all: {total} s" in proc.stdout
    commands = {name: cmd for name, _, cmd in steps}
    assert f"gpu_lean.py --budget-s {lean - 40}" in commands["lean"]
    assert "gpu_quick.py --parts breakdown" in commands["breakdown"]
    assert "bench_roberta.py --device cuda --size base --length 512" in commands["roberta"]
    assert "--json /nonexistent/out/roberta.json" in commands["roberta"]
    assert "breakdown: GPU time of each kernel" in proc.stdout and "exact: 22 configurations" in proc.stdout
    assert "roberta args: --size base --length 512 --batch 16 --rounds 10 --warmup 3" in proc.stdout


@NO_GPU
@pytest.mark.parametrize("wheels, message", [
    (None, "no wheel folder"),
    (["ve_fairseq-0.12.3-py3-none-any"], "no wheel hydra_core-*.whl in"),
    (["ve_fairseq-0.12.3-x", "hydra_core-1", "omegaconf-2", "antlr4_python3_runtime-4", "bitarray-3"],
     "torch sees no CUDA device"),
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


FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for the GPU machine's python3: each call answers as the real one would, in no time.
case "$1" in
  -) cat >/dev/null ;;                                      # the GPU check (its program on stdin): a GPU
  -m) echo "$@" >> "$(dirname "$0")/pip.args" ;;            # pip install
  -c) echo "torch 0 triton 0 fairseq 0" ;;
  benchmarks/gpu_quick.py)
    case "$3" in
      exact) echo '{"part": "exact", "ok": true}'; echo '{"part": "exact", "ok": true}'
             echo '{"part": "exact done", "seconds": 1}' ;;
      breakdown) echo '{"part": "breakdown", "kernel": "(all kernels)", "case": "sdpa"}' ;;
      kernels) sleep 30 ;;                                  # cut at its timeout
      module) echo '{"part": "module done", "seconds": 1}' ;;
    esac ;;
  benchmarks/bench_roberta.py) echo "| roberta | 0.1 |"; echo "target roberta_dnas: wall time x1.0" ;;
  benchmarks/gpu_lean.py) echo '{"part": "meta"}'; echo "lean: exact 16 of 16 ok; timed 160 cases" ;;
  *) exit 3 ;;
esac
"""


def test_gpu_session_runs_each_step_under_its_timeout_and_logs_it(tmp_path):
    """The session's driver on a stand-in python (no GPU here): the wheels
    installed, each step's output in its own log, a step cut at its timeout
    reported and the others still run, summaries in session.log, exit 1, at
    most 8 files."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name in ("ve_fairseq-0.12.3-x", "hydra_core-1", "omegaconf-2", "antlr4_python3_runtime-4", "bitarray-3"):
        (wheels / f"{name}.whl").write_text("")
    out = tmp_path / "out"
    proc = subprocess.run(["bash", os.path.join(BENCH, "gpu_session.sh")], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHON=str(fake), WHEELS=str(wheels), OUT=str(out),
                                                SITE=str(tmp_path / "site"), T_KERNELS="1"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = (out / "session.log").read_text()
    assert log == proc.stdout
    assert "--target " + str(tmp_path / "site") in (fake.parent / "pip.args").read_text()
    assert [s for s in re.findall(r"^== \[\d+ s\] (\w+) \(timeout", log, re.M)] == [
        "exact", "lean", "breakdown", "roberta", "kernels", "module"]
    assert "lean: exact 16 of 16 ok" in log
    assert "exact: 2 configurations ok, 0 not" in log and '"kernel": "(all kernels)"' in log
    assert "target roberta_dnas: wall time x1.0" in log and '"part": "module done"' in log
    assert "kernels: cut at its timeout of 1 s" in log and "module: exit 0" in log
    assert log.rstrip().endswith("done; steps that failed or were cut: kernels")
    files = sorted(p.name for p in out.iterdir())
    assert files == ["breakdown.log", "exact.log", "kernels.log", "lean.log", "module.log", "roberta.log",
                     "session.log"]


@pytest.mark.parametrize("argv, env, status, message", [
    (["--bogus"], {}, 2, "unknown argument '--bogus'"),
    ([], {"T_MODULE": "0"}, 2, "take positive integers; got '0'"),
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
