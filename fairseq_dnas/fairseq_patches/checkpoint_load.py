"""Patch ``checkpoint_load``: fairseq 0.12 loads its checkpoints under torch >= 2.6.

torch 2.6 made ``torch.load(weights_only=True)`` the default, and fairseq 0.12
checkpoints hold an ``argparse.Namespace`` (and sometimes numpy scalars), so
``fairseq-generate``, ``fairseq-interactive``, ``--restore-file`` and the hub
interface all fail with "Unsupported global: argparse.Namespace".

The fix is scoped, not global:
- Only fairseq's checkpoint reader sees a different ``torch.load``: the name
  ``torch`` inside ``fairseq.checkpoint_utils`` is replaced by a stand-in that
  is torch in every respect except ``load``. Every other ``torch.load`` in the
  process keeps torch's default.
- That ``load`` stays ``weights_only=True`` and allow-lists exactly the types
  fairseq writes into a checkpoint (``FAIRSEQ_CHECKPOINT_GLOBALS``), inside a
  ``torch.serialization.safe_globals`` block, so a malicious pickle is still
  refused.
- A checkpoint holding anything else is refused with a message that names the
  type; ``FAIRSEQ_DNAS_TRUST_CHECKPOINTS=1`` loads such trusted files fully.
- ``fairseq.distributed.utils`` unpickles objects that rank 0 of the same job
  just pickled (checkpoint state broadcast to the other ranks); there the
  stand-in loads fully, as fairseq did before torch 2.6 and as its
  ``all_gather_list`` still does with ``pickle.loads``.
"""

import argparse
import os
import pickle
import types

import torch

TRUST_ENV = "FAIRSEQ_DNAS_TRUST_CHECKPOINTS"
REFUSED = "fairseq-dnas refused to unpickle"  # how file_checks tells this refusal from corruption


def _numpy_scalar_globals():
    try:
        import numpy as np
    except ImportError:
        return []
    core = getattr(np, "_core", None) or np.core
    # _reconstruct and ndarray: the small integer arrays that --eval-bleu logs
    # (n-gram counts) and fairseq saves with the metrics.
    found = [core.multiarray.scalar, core.multiarray._reconstruct, np.ndarray, np.dtype]
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        found += [
            getattr(dtypes, name)
            for name in ("Float64DType", "Float32DType", "Int64DType", "Int32DType", "BoolDType")
            if hasattr(dtypes, name)
        ]
    return found


# What fairseq 0.12 puts in a checkpoint besides tensors and builtins: the
# legacy ``args`` Namespace, and numpy scalars and arrays in logged/best metric values.
FAIRSEQ_CHECKPOINT_GLOBALS = [argparse.Namespace] + _numpy_scalar_globals()


def load_fairseq_checkpoint(f, *args, **kwargs):
    """``torch.load`` for fairseq checkpoint files: weights-only plus fairseq's types."""
    if os.environ.get(TRUST_ENV) == "1":
        kwargs["weights_only"] = False
        return torch.load(f, *args, **kwargs)
    kwargs.setdefault("weights_only", True)
    try:
        with torch.serialization.safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS):
            return torch.load(f, *args, **kwargs)
    except pickle.UnpicklingError as err:
        name = getattr(f, "name", f)
        raise pickle.UnpicklingError(
            f"{REFUSED} {name}: it holds a type outside "
            f"the ones fairseq writes into checkpoints ({err}). If you trust "
            f"this file, set {TRUST_ENV}=1 to load it fully."
        ) from err


def _load_in_process_object(f, *args, **kwargs):
    """``torch.load`` for bytes another rank of this job pickled (trusted)."""
    kwargs["weights_only"] = False
    return torch.load(f, *args, **kwargs)


class _TorchWithLoad(types.ModuleType):
    """torch in every respect, except for its ``load``."""

    def __init__(self, load):
        super().__init__("torch")
        self.load = load
        self.__wrapped__ = torch

    def __getattr__(self, name):
        return getattr(torch, name)


def install() -> None:
    """Give fairseq's checkpoint reader (and its rank-to-rank broadcast) the
    loads above. Idempotent; a no-op on torch < 2.6, where nothing broke."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if not hasattr(torch.serialization, "safe_globals"):
        return
    for module, load in (
        (checkpoint_utils, load_fairseq_checkpoint),
        (distributed_utils, _load_in_process_object),
    ):
        if not is_patched(module.torch):
            module.torch = mark(_TorchWithLoad(load), "checkpoint_load")
