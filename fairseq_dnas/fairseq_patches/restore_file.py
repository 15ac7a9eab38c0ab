"""Patch ``restore_file``: a ``--restore-file`` that names a missing file is
an error, not a run from random weights.

fairseq's ``checkpoint_utils.load_checkpoint`` (fairseq 0.12.2 and
ve-fairseq 0.12.3) resolves a non-default ``--restore-file`` to the path as
given (``checkpoint_path = cfg.restore_file``) and hands it to
``Trainer.load_checkpoint``, which, for a path that does not exist, logs
"No existing checkpoint found" at INFO level and trains from scratch. A typo
in ``--restore-file bart.large/model.pt`` thus fine-tunes nothing and exits 0.

Here such a path raises ``BadFile("<path>: no such checkpoint (--restore-file)
...")``: in fairseq's commands one line ``error: ...`` and exit status 1.
fairseq's own default, ``checkpoint_last.pt`` (looked up in ``--save-dir``),
is untouched: it resumes when the file is there and starts fresh when it is
not; so are ``--finetune-from-model`` and ``--continue-once``, which fairseq
checks itself.
"""

import os

from fairseq_dnas.errors import BadFile

DEFAULT = "checkpoint_last.pt"  # fairseq's default --restore-file: resumes --save-dir's own


def restore_path(cfg, suffix):
    """The path fairseq reads for a non-default ``--restore-file`` (as
    ``load_checkpoint`` builds it), else None."""
    restore = getattr(cfg, "restore_file", DEFAULT)
    if not restore or restore == DEFAULT:
        return None
    return restore.replace(".pt", suffix + ".pt") if suffix is not None else restore


def check_restore_file(cfg, trainer) -> None:
    path = restore_path(cfg, getattr(trainer, "checkpoint_suffix", None))
    if path is not None and not os.path.exists(path):
        raise BadFile(path, "no such checkpoint (--restore-file); fix the path, or leave --restore-file out "
                            "to resume --save-dir's checkpoint_last.pt or start fresh")


def install() -> None:
    """Idempotent."""
    from fairseq import checkpoint_utils

    from fairseq_dnas.fairseq_patches import is_patched, mark

    if is_patched(checkpoint_utils.load_checkpoint):
        return
    load_checkpoint = checkpoint_utils.load_checkpoint

    def checked_load_checkpoint(cfg, trainer, **passthrough_args):
        check_restore_file(cfg, trainer)
        return load_checkpoint(cfg, trainer, **passthrough_args)

    checked_load_checkpoint.__wrapped__ = load_checkpoint
    checked_load_checkpoint.__doc__ = load_checkpoint.__doc__
    checkpoint_utils.load_checkpoint = mark(checked_load_checkpoint, "restore_file")
