"""Tier 3: ``python -m fairseq_dnas.check``, the command a GPU user runs once.

On CPU: without ``--interpret`` it says there is nothing to check (exit 0);
with it, the kernels run under Triton's interpreter on tiny inputs (a few
configurations here, to stay fast). A configuration made to disagree (the
kernels' output shifted by a monkeypatch) or to fail gives exit status 1.
"""

import os
import subprocess
import sys

import pytest
import torch

from fairseq_dnas import check

pytest.importorskip("triton", reason="triton is not installed (scripts/install.sh installs it)")

CUDA = torch.cuda.is_available()
SMALL = ["--heads", "64", "--sinkhorn", "1"]


def _run(*args, env=None):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "fairseq_dnas.check", *args], capture_output=True, text=True,
                          env=full_env, timeout=300)


@pytest.mark.skipif(CUDA, reason="on a GPU there is something to check")
def test_without_cuda_there_is_nothing_to_check():
    r = _run()
    assert r.returncode == 0, r.stderr
    assert "versions: torch " in r.stdout and "triton " in r.stdout and "fairseq " in r.stdout
    assert "Nothing to check" in r.stdout and "--interpret" in r.stdout
    assert "scheme" not in r.stdout  # no table


@pytest.mark.skipif(CUDA, reason="the interpreter run is the CPU stand-in for the GPU run")
def test_interpret_checks_the_kernels_and_skips_bfloat16():
    r = _run("--interpret", "--dtypes", "float16,bfloat16", "--schemes", "dnas,hnas", "--dropout", "on", *SMALL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bfloat16: skipped: Triton's interpreter computes bfloat16 tl.dot wrongly" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith(("dnas ", "hnas "))]
    assert all(line.endswith(" ok") and " float16 " in line for line in rows), r.stdout
    # float16 at head size 64: the one-tile kernels (short inputs) beside the lean kernels (selection.LEAN_CHOSEN)
    assert [line.split()[:1] + line.split()[5:6] for line in rows] == [
        ["dnas", "short"], ["dnas", "lean"], ["hnas", "short"], ["hnas", "lean"]], r.stdout
    assert "all 4 configurations agree with the float64 reference" in r.stdout


@pytest.mark.skipif(CUDA, reason="the interpreter run is the CPU stand-in for the GPU run")
def test_a_disagreeing_configuration_fails_the_command(monkeypatch, capsys):
    from fairseq_dnas.attention.triton import long

    kernels = long.triton_attention

    def off_by_a_tenth_for_hnas(*args, **kwargs):  # HNAS: the calls with a hybrid weight
        out = kernels(*args, **kwargs)
        return out + 0.1 if kwargs.get("hybrid_weight") is not None else out

    monkeypatch.setattr(long, "triton_attention", off_by_a_tenth_for_hnas)
    rc = check.main(["--interpret", "--dtypes", "float32", "--dropout", "off", *SMALL])
    out = capsys.readouterr().out
    assert rc == 1, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("dnas ", "hnas "))}
    assert rows["dnas"].endswith(" ok")
    assert rows["hnas"].endswith("DISAGREES") and "1.00e-01" in rows["hnas"]
    assert "1 of 2 configurations DISAGREE" in out


def test_a_kernel_that_fails_to_run_fails_the_command(monkeypatch, capsys):
    from fairseq_dnas.attention.triton import long

    def fail(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory")

    monkeypatch.setattr(long, "triton_attention", fail)
    args = [] if CUDA else ["--interpret"]
    rc = check.main([*args, "--dtypes", "float32", "--schemes", "dnas", "--dropout", "off", "--no-speed", *SMALL])
    out = capsys.readouterr().out
    assert rc == 1
    assert "ERROR RuntimeError: out of resource: shared memory" in out
    assert "1 of 1 configurations DISAGREE or fail to run" in out


def test_bad_arguments_say_what_to_change():
    r = _run("--dtypes", "float8")
    assert r.returncode == 2
    assert "--dtypes must be a comma-separated subset of float16,bfloat16,float32" in r.stderr


def test_speed_and_memory_line():
    """The measurement code (on CPU under the interpreter: the numbers mean nothing)."""
    device = torch.device("cuda" if CUDA else "cpu")
    sizes = dict(batch=1, heads=1, length=16, head_dim=16)
    figures = check.speed_and_memory(device, torch.float16 if CUDA else torch.float32, repeats=1, **sizes)
    assert set(figures) == {"torch SDPA", "DNAS", "HNAS"}
    assert all(f["ms"] > 0 for f in figures.values())
    lines = check.speed_lines(figures, torch.float16, sizes, 1)
    assert lines[0].startswith("speed  (float16, B 1 x H 1 x T 16 x D 16") and "DNAS" in lines[0] and "x)" in lines[0]
    assert len(lines) == (2 if CUDA else 1)
