import os
import re
import sys

import pytest

# Under pytest-xdist (the README's ``-n 2``) each worker gets its share of the
# cores: two workers on 2 cores, each with torch's default of one thread per
# core, would oversubscribe them. xdist sets the variable before a worker
# imports this file; set here, before torch starts its thread pool, and
# inherited by the fairseq-* subprocesses the tests start.
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _WORKERS:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // int(_WORKERS))))

import torch  # noqa: E402 (after the thread settings)

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
# The one place that edits sys.path: the tests import their helpers
# (helpers.py, ...) and the example and benchmark files that are scripts, not
# package modules, by name, as those files import the files beside them.
for _folder in (TESTS, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "examples", "discrete"),
                os.path.join(ROOT, "examples", "masked_lm")):
    sys.path.insert(0, _folder)

# Without a GPU the Triton kernels run on CPU tensors under Triton's
# interpreter. Triton reads the variable when the kernels are defined, so it
# is set before any test imports fairseq_dnas.attention.triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Test tiers (docs/testing.md). The default run proves every path, scheme,
# dtype and recipe on a representative, seeded subset; tests marked
# ``@pytest.mark.full`` repeat the same proofs exhaustively (every size or
# variant, more property examples, longer recipe chains) and run only when
# asked for:
#   pytest --full          the default tier plus the full tier (everything)
#   pytest -m full         only the full tier: an -m expression that names
#                          'full' decides on its own which full tests run
#   pytest -m "not full"   only the default tier, without listing the skips
FULL_OPTION = "--full"


def pytest_addoption(parser):
    parser.addoption(
        FULL_OPTION, action="store_true", default=False,
        help="also run the tests marked 'full' (the exhaustive tier: every size and variant, "
             "more property examples); see docs/testing.md",
    )


def _full_by_markexpr(config):
    return re.search(r"\bfull\b", config.getoption("markexpr") or "") is not None


# The order in which the README's ``-n 2 --dist loadfile`` hands files to
# the two workers: the longest first (longest-processing-time-first
# scheduling), so that no long recipe chain starts while the other worker
# runs out of work. xdist's own order (files with more tests first, kept out
# by ``--no-loadscope-reorder`` in pytest.ini) put the one-test chains last.
# By measured seconds of the default tier
# (docs/results/2026-11-25-test-times-third-change.md); files not named follow
# in collection order.
LONG_FILES_FIRST = (
    "test_gigaword_recipe.py", "test_triton.py", "test_translation_recipe.py", "test_resume.py",
    "test_triton_tiles.py", "test_masked_lm_recipe.py", "test_bad_files.py", "test_plain_commands.py",
    "test_run_seeds.py", "test_triton_safety.py", "test_cli.py", "test_analysis_explaining_away.py",
    "test_distributed.py",
)


# The full tier alone (``-m full``, CI's second part) has six files, one of
# them a single 740-s test (the 1,500-update Gigaword chain). xdist gives a
# worker the next file while two or fewer of its tests are pending
# (LoadScopeScheduling._reschedule), so the chain's worker takes the third
# file along at the start, and the compile sweep's worker (two tests) the
# fourth: short files there, so that the long ones go to the worker that is
# free (the full tier took 1,005 s before, 643 s after this change and the
# others of the third change: docs/results/2026-11-25-test-times-third-change.md).
FULL_TIER_ORDER = (
    "test_gigaword_recipe.py", "test_triton_tiles.py", "test_plain_commands.py", "test_triton_safety.py",
    "test_triton.py", "test_resume.py",
)


def _file_rank(item, order=LONG_FILES_FIRST):
    name = os.path.basename(str(item.path))
    return order.index(name) if name in order else len(order)


def pytest_collection_modifyitems(config, items):
    if _full_by_markexpr(config):
        items.sort(key=lambda item: _file_rank(item, FULL_TIER_ORDER))
    else:
        items.sort(key=_file_rank)  # stable: a file's tests keep their order
    if config.getoption("full") or _full_by_markexpr(config):
        return
    skip = pytest.mark.skip(reason=f"full tier: run with pytest {FULL_OPTION} (docs/testing.md)")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


def padding_mask(lengths, total, left_pad):
    """(B, T) bool mask, True at padding; left padding as fairseq's sources."""
    mask = torch.ones(len(lengths), total, dtype=torch.bool)
    for b, n in enumerate(lengths):
        if left_pad:
            mask[b, total - n:] = False
        else:
            mask[b, :n] = False
    return mask


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def check_verdicts(monkeypatch):
    """The first-use check's decisions (``selfcheck._verdicts``), empty for
    this test and restored after it; ``.clear()`` forgets them mid-test."""
    from fairseq_dnas.attention import selfcheck

    monkeypatch.setattr(selfcheck, "_verdicts", {})
    return selfcheck._verdicts


@pytest.fixture
def auto_triton_on_cpu(monkeypatch, check_verdicts):
    """``auto`` takes the Triton kernels, and the first-use check runs, for
    CPU tensors too (under Triton's interpreter), with no earlier verdicts."""
    from fairseq_dnas.attention import selection

    monkeypatch.setattr(selection, "kernels_by_default", lambda device: device.type in ("cuda", "cpu"))
    return check_verdicts


def _shared_data(env, hint):
    """The folder in $env; CI sets FAIRSEQ_DNAS_REQUIRE_DATA=1 so that a
    missing folder fails instead of skipping."""
    path = os.environ.get(env)
    if path and os.path.isdir(path):
        return os.path.abspath(path)
    msg = f"{env} not set or missing ({path!r}); set it to {hint}"
    if os.environ.get("FAIRSEQ_DNAS_REQUIRE_DATA") == "1":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def gigaword_dir():
    """The shared Gigaword sample (``GIGAWORD_DIR``)."""
    return _shared_data("GIGAWORD_DIR", "../shared/data/gigaword/sumdata")


@pytest.fixture(scope="session")
def multi30k_dir():
    """The shared Multi30k German-English data (``MULTI30K_DIR``)."""
    return _shared_data("MULTI30K_DIR", "../shared/data/multi30k")


@pytest.fixture(scope="session")
def wikitext_dir():
    """The shared WikiText-2 valid/test text (``WIKITEXT_DIR``)."""
    return _shared_data("WIKITEXT_DIR", "../shared/data/wikitext-2")


@pytest.fixture(scope="session")
def glue_dir():
    """The shared SST-2 and CoLA files (``GLUE_DIR``)."""
    return _shared_data("GLUE_DIR", "../shared/data/glue")


@pytest.fixture(scope="session")
def conll2000_dir():
    """The CoNLL-2000 chunking files (``CONLL2000_DIR``)."""
    return _shared_data("CONLL2000_DIR", "../shared/data/conll2000")


@pytest.fixture(scope="session")
def sst_binary_dir():
    """SST in Jain & Wallace's binary split (``SST_BINARY_DIR``)."""
    return _shared_data("SST_BINARY_DIR", "../shared/data/sst-binary")
