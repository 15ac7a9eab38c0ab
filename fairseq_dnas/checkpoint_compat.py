"""Let fairseq 0.12 load its checkpoints under torch >= 2.6, and write
``checkpoint_last.pt`` so that a kill never leaves it half-written.

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

Atomic copies: fairseq writes the first checkpoint of a save atomically (to
``X.tmp``, then a rename) but makes ``checkpoint_last.pt`` and
``checkpoint_best.pt`` as *copies* of it with ``shutil.copyfile``, in place.
A job killed during that copy (a few seconds for a 2.6 GB Gigaword
checkpoint) leaves a truncated ``checkpoint_last.pt``, and the restarted job
then fails to resume. ``fairseq.checkpoint_utils`` is given a ``PathManager``
whose ``copy`` of local files writes a temporary file beside the target and
renames it over the target, so the previous file stays whole until the new
one is complete.
"""

import argparse
import os
import pickle
import shutil
import tempfile
import types

import torch

TRUST_ENV = "FAIRSEQ_DNAS_TRUST_CHECKPOINTS"


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
            f"fairseq-dnas refused to unpickle {name}: it holds a type outside "
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


def atomic_copy(src: str, dst: str) -> None:
    """Copy ``src`` to ``dst`` through a temporary file and a rename: ``dst``
    is at every moment either its old content or the complete new one."""
    folder = os.path.dirname(os.path.abspath(dst))
    # A dot name that fairseq's checkpoint patterns (checkpoint_\d+_\d+.pt) never match.
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(dst)}.tmp-", dir=folder)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
            fout.flush()
            os.fsync(fout.fileno())  # the data is on disk before the name points at it
        shutil.copymode(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _path_manager_with_atomic_copy(path_manager):
    """fairseq's PathManager, except that ``copy`` of local files is atomic."""

    class AtomicCopyPathManager(path_manager):
        @staticmethod
        def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
            if path_manager.path_requires_pathmanager(src_path) or path_manager.path_requires_pathmanager(dst_path):
                return path_manager.copy(src_path, dst_path, overwrite)  # remote storage: its own rules
            if os.path.exists(dst_path) and not overwrite:
                return False
            atomic_copy(src_path, dst_path)
            return True

    AtomicCopyPathManager.wrapped = path_manager
    return AtomicCopyPathManager


def install() -> None:
    """Give fairseq's checkpoint reader (and its rank-to-rank broadcast) the
    loads above, and its checkpoint writer an atomic copy. Idempotent; the
    loads are a no-op on torch < 2.6, where nothing broke."""
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    if not hasattr(checkpoint_utils.PathManager, "wrapped"):
        checkpoint_utils.PathManager = _path_manager_with_atomic_copy(checkpoint_utils.PathManager)
    if not hasattr(torch.serialization, "safe_globals"):
        return

    for module, load in (
        (checkpoint_utils, load_fairseq_checkpoint),
        (distributed_utils, _load_in_process_object),
    ):
        if not isinstance(module.torch, _TorchWithLoad):
            module.torch = _TorchWithLoad(load)

from fairseq_dnas import register_with_fairseq  # noqa: E402

register_with_fairseq()  # now complete: see fairseq_dnas._register_with_fairseq
