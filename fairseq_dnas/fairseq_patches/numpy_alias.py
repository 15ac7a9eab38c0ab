"""Patch ``numpy_alias``: fairseq 0.12's datasets run under NumPy >= 2.0, where ``np.compat`` is gone.

Two fairseq call sites still name ``np.compat.long`` (NumPy 1.x's alias of
Python's ``int``, i.e. int64 on the platforms fairseq runs on):

- ``fairseq.data.token_block_dataset``: ``TokenBlockDataset`` with
  ``--sample-break-mode eos`` (the sentence-per-sample mode of ``masked_lm``,
  ``language_modeling``, ...) fails with
  ``AttributeError: module 'numpy' has no attribute 'compat'``;
- ``fairseq.data.language_pair_dataset``: ``--num-batch-buckets`` fails the same way.

The fix is scoped, as in ``checkpoint_load``: the name ``np`` inside those
two fairseq modules only is replaced by a stand-in that is numpy in every
respect except that it has ``compat.long = numpy.int64``. numpy itself, and
every other module, are untouched. A no-op under NumPy 1.x.
"""

import types

import numpy

COMPAT = types.SimpleNamespace(long=numpy.int64)  # NumPy 1.x: np.compat.long is int -> int64


class _NumpyWithCompat(types.ModuleType):
    """numpy in every respect, plus the ``compat.long`` alias NumPy 2 removed."""

    def __init__(self):
        super().__init__("numpy")
        self.compat = COMPAT
        self.__wrapped__ = numpy

    def __getattr__(self, name):
        return getattr(numpy, name)


# The fairseq modules that still call np.compat.long.
MODULES = ("fairseq.data.token_block_dataset", "fairseq.data.language_pair_dataset")


def install() -> None:
    """Idempotent; nothing to do when numpy still has ``compat``."""
    if hasattr(numpy, "compat"):
        return
    import importlib

    from fairseq_dnas.fairseq_patches import is_patched, mark

    for name in MODULES:
        module = importlib.import_module(name)
        if not is_patched(module.np):
            module.np = mark(_NumpyWithCompat(), "numpy_alias")
