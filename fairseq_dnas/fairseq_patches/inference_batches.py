"""Patch ``inference_batches``: evaluation and generation see every example.

fairseq's ``data_utils.batch_by_size`` (fairseq 0.12.2 and ve-fairseq 0.12.3)
ends with::

    if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0:
        b = b[:-1]

so with fairseq's default ``--required-batch-size-multiple 8`` the last batch
is dropped whenever its size is not a multiple of 8. For training that is a
choice (every batch a multiple of 8 for tensor cores). For inference it
silently loses examples: ``fairseq-generate`` on 21 test sentences with
``--batch-size 16`` writes 16 hypotheses and exits 0, ``fairseq-validate``
and the validation inside ``fairseq-train`` score a subset (with 20 sentences
and a batch size of 20 nothing at all: a ``ZeroDivisionError``).

The fix keeps fairseq's batches and adds back the tail it dropped, but only
where batches are built for inference: in a ``fairseq-generate`` or
``fairseq-validate`` process (also as ``python -m fairseq_cli.<command>``;
such a process never trains) and inside ``Trainer.get_valid_iterator`` (the
validation inside ``fairseq-train``). Training batches are fairseq's own.
``fairseq-interactive`` and the hub interface already ask for a multiple of
1. (``fairseq_cli.validate`` configures logging when imported, so it is not
imported here; a script of your own that calls ``fairseq_cli.generate.main``
can wrap the call in ``inference()``.)
"""

import contextlib
import functools
import threading

_STATE = threading.local()


@contextlib.contextmanager
def inference():
    """Batches built inside keep every example."""
    depth = getattr(_STATE, "depth", 0)
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth


INFERENCE_COMMANDS = ("generate", "validate")  # fairseq commands that never train


def in_inference() -> bool:
    if getattr(_STATE, "depth", 0) > 0:
        return True
    from fairseq_dnas.fairseq_patches.file_checks import fairseq_command

    return fairseq_command() in INFERENCE_COMMANDS


def with_remainder(batches, indices):
    """``batches`` (fairseq's, in the order of ``indices``) plus, as one
    more batch, the tail of ``indices`` fairseq dropped."""
    covered = sum(len(b) for b in batches)
    if covered >= len(indices):
        return batches
    import numpy

    tail = numpy.asarray(indices[covered:], dtype=numpy.int64)
    return [*batches, tail]


def _inference_context(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with inference():
            return function(*args, **kwargs)

    wrapper.__wrapped__ = function
    return wrapper


def install() -> None:
    """Idempotent."""
    import numpy
    from fairseq import trainer
    from fairseq.data import data_utils

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if not is_patched(data_utils.batch_by_size):
        batch_by_size = data_utils.batch_by_size

        def batch_by_size_keeping_the_tail(indices, *args, **kwargs):
            fixed_shapes = kwargs.get("fixed_shapes", args[5] if len(args) > 5 else None)
            if not in_inference() or fixed_shapes is not None:
                return batch_by_size(indices, *args, **kwargs)
            if not isinstance(indices, numpy.ndarray):  # read once: it may be an iterator
                indices = numpy.fromiter(indices, dtype=numpy.int64, count=-1)
            return with_remainder(batch_by_size(indices, *args, **kwargs), indices)

        batch_by_size_keeping_the_tail.__wrapped__ = batch_by_size
        data_utils.batch_by_size = mark(batch_by_size_keeping_the_tail, "inference_batches")
    if not is_patched(trainer.Trainer.get_valid_iterator):
        trainer.Trainer.get_valid_iterator = mark(_inference_context(trainer.Trainer.get_valid_iterator),
                                                  "inference_batches")
