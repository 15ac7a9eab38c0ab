"""Patch ``atomic_copy``: ``checkpoint_last.pt`` is never left half-written.

fairseq writes the first checkpoint of a save atomically (to
``X.tmp``, then a rename) but makes ``checkpoint_last.pt`` and
``checkpoint_best.pt`` as *copies* of it with ``shutil.copyfile``, in place.
A job killed during that copy (a few seconds for a 2.6 GB Gigaword
checkpoint) leaves a truncated ``checkpoint_last.pt``, and the restarted job
then fails to resume. ``fairseq.checkpoint_utils`` is given a ``PathManager``
whose ``copy`` of local files writes a temporary file beside the target and
renames it over the target, so the previous file stays whole until the new
one is complete.
"""

import os
import shutil
import tempfile


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
    """Give fairseq's checkpoint writer the atomic copy (idempotent)."""
    from fairseq import checkpoint_utils

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if not is_patched(checkpoint_utils.PathManager):
        checkpoint_utils.PathManager = mark(_path_manager_with_atomic_copy(checkpoint_utils.PathManager),
                                            "atomic_copy")
