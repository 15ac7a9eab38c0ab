"""The test tiers themselves (tests/conftest.py, docs/testing.md): tests marked
``full`` are skipped by default with a reason naming ``--full``, run under
``--full``, selected alone by ``-m full`` and dropped by ``-m "not full"``;
under pytest-xdist each worker gets its share of the cores.

Each case runs pytest in a subprocess on a tiny test file beside a copy of this
suite's conftest.py, so what is checked is the real hook code.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)

SAMPLE = '''
import os
import pytest
import torch


def test_default():
    pass


@pytest.mark.full
def test_exhaustive():
    pass


def test_threads():
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:  # each worker's share of the cores, in torch and in subprocesses
        share = max(1, (os.cpu_count() or 1) // int(workers))
        assert os.environ["OMP_NUM_THREADS"] == str(share)
        assert torch.get_num_threads() == share
'''


RUNS = {  # name -> pytest arguments; all started at once (each mostly waits on imports)
    "default": [],
    "m_full": ["-m", "full"],
    "m_not_full": ["-m", "not full"],
    "full_xdist": ["--full", "-n", "2"],  # the option reaches the workers
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name -> (exit code, {outcome: count}, output) of pytest on the sample."""
    folder = tmp_path_factory.mktemp("tiers")
    shutil.copy(os.path.join(TESTS, "conftest.py"), folder / "conftest.py")
    shutil.copy(os.path.join(ROOT, "pytest.ini"), folder / "pytest.ini")
    (folder / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTEST_XDIST_WORKER",
                        "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS")}
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", "test_sample.py", *args],
            cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        for name, args in RUNS.items()
    }
    results = {}
    for name, proc in procs.items():
        out = proc.communicate()[0]
        counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|deselected|failed|errors?)", out)}
        results[name] = (proc.returncode, counts, out)
    return results


def test_full_tests_skip_by_default_with_the_option_named(runs):
    rc, counts, out = runs["default"]
    assert rc == 0, out
    assert counts == {"passed": 2, "skipped": 1}, out
    assert "full tier: run with pytest --full" in out, out


def test_full_option_runs_everything_in_every_worker(runs):
    rc, counts, out = runs["full_xdist"]
    assert rc == 0, out
    # 3 passed, test_threads among them: each of the 2 workers saw its share
    # of the cores in OMP_NUM_THREADS and torch.get_num_threads()
    assert counts == {"passed": 3}, out


def test_m_full_selects_only_the_full_tier(runs):
    rc, counts, out = runs["m_full"]
    assert rc == 0, out
    assert counts == {"passed": 1, "deselected": 2}, out


def test_m_not_full_is_the_default_tier_without_skips(runs):
    rc, counts, out = runs["m_not_full"]
    assert rc == 0, out
    assert counts == {"passed": 2, "deselected": 1}, out
