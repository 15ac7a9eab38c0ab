"""What the README's two commands choose for the machine they run on:
scripts/install.sh's torch build (a CUDA build when nvidia-smi sees a GPU)
and its last check, examples/gigaword/quickstart.sh's budget (GPU: fp16, the
small model, a larger budget; CPU: the tiny smoke run) and its CPU threads
(fairseq_dnas/recipes/cpu_threads.py). GPU detection is stubbed: a fake
nvidia-smi on PATH, a torch that reports a GPU (sitecustomize)."""

import os
import subprocess
import sys

import pytest
import torch

from fairseq_dnas.recipes.cpu_threads import default_threads, main as cpu_threads_main
from helpers import ROOT

INSTALL = os.path.join(ROOT, "scripts", "install.sh")
QUICKSTART = os.path.join(ROOT, "examples", "gigaword", "quickstart.sh")


def _stub(folder, name, text):
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)
    return folder


def _install_dry_run(tmp_path, nvidia_smi, **env):
    stub = _stub(tmp_path / "bin", "nvidia-smi", nvidia_smi)
    return subprocess.run(["bash", INSTALL], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "DRY_RUN": "1",
                               "VENV": str(tmp_path / "venv"), **env})


def test_install_takes_the_cuda_build_when_nvidia_smi_sees_a_gpu(tmp_path):
    proc = _install_dry_run(tmp_path, '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-1234)"\n')
    assert proc.returncode == 0, proc.stderr
    assert "torch===2.13.0 (nvidia-smi sees a GPU: the CUDA build)" in proc.stdout
    assert not (tmp_path / "venv").exists()  # a dry run installs nothing


def test_install_takes_the_plain_spec_without_a_gpu(tmp_path):
    # nvidia-smi present but failing (no driver) counts as no GPU
    proc = _install_dry_run(tmp_path, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert proc.returncode == 0 and "torch==2.13.0 (no GPU found by nvidia-smi)" in proc.stdout, proc.stdout


def test_install_with_a_gpu_and_an_index_or_a_spec_takes_what_is_given(tmp_path):
    gpu = '#!/bin/sh\necho "GPU 0: NVIDIA H200"\n'
    proc = _install_dry_run(tmp_path, gpu, TORCH_INDEX_URL="https://wheels.example/cu128")
    assert "torch==2.13.0 (nvidia-smi sees a GPU: the build TORCH_INDEX_URL offers) from " \
           "https://wheels.example/cu128" in proc.stdout, proc.stdout
    proc = _install_dry_run(tmp_path, gpu, TORCH_SPEC="torch==2.5.1")
    assert "torch==2.5.1 (TORCH_SPEC)" in proc.stdout, proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the warning of a torch that sees no GPU")
def test_install_check_says_which_setting_to_change_when_torch_cannot_use_the_gpu():
    proc = subprocess.run([sys.executable, "-m", "fairseq_dnas.recipes.install_check", "--gpu"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("[install] ok: torch ") and "(CPU)" in lines[0]
    assert lines[1].startswith("[install] warning: nvidia-smi sees a GPU but torch ") and "set TORCH_SPEC" in lines[1]
    # fairseq's import-time note about tensorboardX (its speech models) is not shown
    assert "tensorboardX" not in proc.stdout + proc.stderr and not proc.stderr.strip(), proc.stderr
    plain = subprocess.run([sys.executable, "-m", "fairseq_dnas.recipes.install_check"],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert plain.returncode == 0 and len(plain.stdout.splitlines()) == 1


# -- the quickstart's plan ------------------------------------------------------------------------

def _quickstart_plan(tmp_path, fake_gpu=False, **env):
    env = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", "WORK_DIR": str(tmp_path / "work"), **env}
    if fake_gpu:  # torch reports one GPU in every Python the script starts
        _stub(tmp_path / "site", "sitecustomize.py",
              "import torch\ntorch.cuda.is_available = lambda: True\ntorch.cuda.device_count = lambda: 1\n")
        env["PYTHONPATH"] = f"{tmp_path / 'site'}:{ROOT}"
    return subprocess.run(["bash", QUICKSTART], capture_output=True, text=True, timeout=300, env=env)


def test_quickstart_on_a_gpu_machine_plans_fp16_and_the_larger_budget(tmp_path):
    proc = _quickstart_plan(tmp_path, fake_gpu=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("plan: transformer_hnas, small, 8000 updates of 256 headlines on gpu; 500000 training pairs, "
            "all test pairs") in proc.stderr
    assert "[threads]" not in proc.stderr and not (tmp_path / "work").exists()
    # train.sh with the quickstart's GPU settings runs fairseq-train with --fp16
    env = {**os.environ, "PYTHON": sys.executable, "DRY_RUN": "1", "DEVICE": "gpu", "NPROC": "1", "SIZE": "small",
           "PRESET": "fast", "BATCH_SENTENCES": "256", "MAX_SENTENCES_PER_PROC": "256", "DATA": str(tmp_path)}
    (tmp_path / "dict.article.txt").write_text("a 1\n")
    cmd = subprocess.run(["bash", os.path.join(ROOT, "examples", "gigaword", "train.sh")], capture_output=True,
                         text=True, timeout=120, env=env)
    assert cmd.returncode == 0 and " --fp16" in cmd.stdout and "--cpu" not in cmd.stdout, cmd.stderr[-2000:]


def test_quickstart_on_cpu_plans_the_smoke_run_with_the_free_cores(tmp_path):
    proc = _quickstart_plan(tmp_path, DEVICE="auto" if not torch.cuda.is_available() else "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    threads = default_threads(len(os.sched_getaffinity(0)), os.getloadavg()[0])
    assert "plan: transformer_hnas, tiny, 1500 updates of 64 headlines on CPU, " in proc.stderr
    assert "10000 training pairs, the first 500 test pairs" in proc.stderr
    assert "[threads] " in proc.stderr and "CPU_THREADS=N to choose" in proc.stderr
    chosen = int(proc.stderr.split("on CPU, ")[1].split(" thread")[0])
    assert abs(chosen - threads) <= 1  # the load average may move between the two readings
    fixed = _quickstart_plan(tmp_path, DEVICE="cpu", CPU_THREADS="3")
    assert "on CPU, 3 thread(s)" in fixed.stderr and "[threads]" not in fixed.stderr


@pytest.mark.parametrize("setting, line", [
    ({"CPU_THREADS": "two"}, "CPU_THREADS=two: give a whole number >= 1"),
    ({"CPU_THREADS": "0"}, "CPU_THREADS=0: give a whole number >= 1"),
    ({"MAX_UPDATE": "0"}, "MAX_UPDATE=0: give a whole number >= 1"),
    ({"DEVICE": "tpu"}, "DEVICE=tpu: choose cpu, gpu or auto"),
])
def test_quickstart_bad_settings_are_one_line(tmp_path, setting, line):
    proc = _quickstart_plan(tmp_path, **{"DEVICE": "cpu", **setting})
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"[quickstart] error: {line}", \
        proc.stderr


# -- the thread count ------------------------------------------------------------------------------

@pytest.mark.parametrize("cores, load, threads", [
    (2, 0.0, 2), (2, 0.25, 2), (2, 0.3, 1), (2, 1.2, 1), (2, 1.3, 1), (2, 5.0, 1),  # 2 cores, idle to busy
    (16, 0.0, 16), (16, 3.6, 12), (16, 40.0, 1), (1, 0.0, 1), (4, -1.0, 4),
])
def test_default_threads_are_the_cores_not_already_busy(cores, load, threads):
    assert default_threads(cores, load) == threads


def test_cpu_threads_command(capsys):
    assert cpu_threads_main(["--cores", "8", "--load", "2.2", "--explain"]) == 0
    out, err = capsys.readouterr()
    assert out == "6\n" and "8 usable core(s), load 2.20" in err
    with pytest.raises(SystemExit):
        cpu_threads_main(["--cores", "0"])
    assert "--cores 0: give a whole number >= 1" in capsys.readouterr().err


@pytest.mark.full  # about 30 CPU s (prepare.sh, then 20 updates through train.sh)
def test_bench_cpu_threads_smallest_run(tmp_path):
    """benchmarks/bench_cpu_threads.py on a synthetic Gigaword folder: one case, its
    updates a second from fairseq's log, the load beside it; bad input in one line."""
    import json

    from test_gigaword_recipe import make_sumdata, prepare

    assert prepare(make_sumdata(tmp_path / "sumdata"), tmp_path / "data", PYTHON=sys.executable).returncode == 0
    script = os.path.join(ROOT, "benchmarks", "bench_cpu_threads.py")
    out = tmp_path / "threads.json"
    proc = subprocess.run([sys.executable, script, "--data", str(tmp_path / "data" / "bin"), "--threads", "1",
                           "--busy", "0", "--updates", "20", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    case, = json.loads(out.read_text())["cases"]
    assert case["threads"] == 1 and case["busy"] == 0 and case["updates_per_s"] > 0
    assert {"load_before", "load_after", "steal_fraction", "default_would_pick"} <= set(case)
    assert "| 0 | 1 | " in proc.stdout
    bad = subprocess.run([sys.executable, script, "--data", str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "no binarized Gigaword there" in bad.stderr.splitlines()[-1]


def test_current_load_is_the_cores_busy_now():
    """Measured over half a second from /proc/stat: between 0 and the CPUs (not the one-minute average,
    which still counts the install that ran just before the quickstart)."""
    from fairseq_dnas.recipes.cpu_threads import current_load

    load = current_load(0.2)
    assert 0.0 <= load <= (os.cpu_count() or 1)
