import os
import sys

import pytest
import torch

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)  # tests import reference.py and helpers.py directly

# Without a GPU the Triton kernels run on CPU tensors under Triton's
# interpreter. Triton reads the variable when the kernels are defined, so it
# is set before any test imports fairseq_dnas.attention.triton_flash.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


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
