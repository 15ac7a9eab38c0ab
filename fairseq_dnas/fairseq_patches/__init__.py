"""Every change this plugin makes to fairseq's (or the interpreter's)
behaviour, in one place.

``PATCHES`` below is the table: for each patch, the fairseq symbols it
replaces or wraps, why, the fairseq versions it was written against, and the
environment variable that turns it off (``FAIRSEQ_DNAS_PATCH_<NAME>=0``;
``FAIRSEQ_DNAS_PATCHES=0`` turns them all off). The switches are read when
the patches are installed.

When they are installed:
- by fairseq loading the plugin: ``--user-dir fairseq_dnas`` imports
  ``fairseq_dnas.tasks`` and ``fairseq_dnas.models``, whose ``__init__``
  calls ``install()``;
- by ``import fairseq_dnas.plugin`` (what ``--user-dir`` does; for a process
  that imported ``fairseq_dnas`` before fairseq read its ``--user-dir``,
  fairseq only checks the package's ``__path__``, which then imports the
  plugin: ``fairseq_dnas/__init__.py``);
- by an explicit ``fairseq_dnas.fairseq_patches.install()``.

Never by importing ``fairseq_dnas``, ``fairseq_dnas.nn``,
``fairseq_dnas.attention``, ``fairseq_dnas.hf`` or ``fairseq_dnas.errors``
(torch only), nor by importing this package or one of its modules: only
``install()`` changes anything.

The patches marked ``command_line`` (bad files and flags as one line) are
installed only inside fairseq's own commands (``fairseq-train``,
``-generate``, ``-interactive``, ``-validate``, also as ``python -m
fairseq_cli.<command>``, and ``fairseq_dnas/recipes/run_fairseq.py``) or with
``install(command_line=True)``: in a notebook or a script of your own, fairseq
raises its own exceptions.

Installing is idempotent: each wrapper carries a mark (``MARK``), and a second
``install()`` wraps nothing again. ``Trainer.load_checkpoint`` is the one
symbol two patches change; it gets a single wrapper whose layers run in the
order ``LOAD_CHECKPOINT_LAYERS`` gives, whatever order the patches were
installed in.
"""

import functools
import importlib
import os
from dataclasses import dataclass

ALL_OFF_ENV = "FAIRSEQ_DNAS_PATCHES"
MARK = "_fairseq_dnas_patch"  # on every wrapper and stand-in: the patch's name
WRITTEN_AGAINST = "fairseq 0.12.2 (PyPI), ve-fairseq 0.12.3"


@dataclass(frozen=True)
class Patch:
    name: str
    symbols: tuple  # the fairseq (or sys) attributes replaced or wrapped, as dotted paths
    why: str
    installer: str  # "module:function" inside this package
    command_line: bool = False  # only inside fairseq's commands (or install(command_line=True))
    written_against: str = WRITTEN_AGAINST

    @property
    def env(self) -> str:
        """The variable that turns this patch off (``=0``)."""
        return f"FAIRSEQ_DNAS_PATCH_{self.name.upper()}"


PATCHES = (
    Patch(
        "checkpoint_load",
        ("fairseq.checkpoint_utils.torch", "fairseq.distributed.utils.torch"),
        "torch >= 2.6 loads weights-only by default and refuses the argparse.Namespace (and numpy "
        "scalars) in every fairseq 0.12 checkpoint; fairseq's reader gets a torch whose load allow-lists "
        "exactly those types (FAIRSEQ_DNAS_TRUST_CHECKPOINTS=1: load fully)",
        "checkpoint_load:install",
    ),
    Patch(
        "atomic_copy",
        ("fairseq.checkpoint_utils.PathManager",),
        "fairseq copies checkpoint_last.pt / checkpoint_best.pt in place; a kill during the copy leaves "
        "a truncated checkpoint_last.pt that the restarted job cannot resume from",
        "atomic_copy:install",
    ),
    Patch(
        "numpy_alias",
        ("fairseq.data.token_block_dataset.np", "fairseq.data.language_pair_dataset.np"),
        "fairseq still calls np.compat.long, removed in NumPy 2.0 (--sample-break-mode eos, "
        "--num-batch-buckets)",
        "numpy_alias:install",
    ),
    Patch(
        "exact_resume",
        ("fairseq.trainer.Trainer.get_train_iterator", "fairseq.trainer.Trainer.lr_step",
         "fairseq.trainer.Trainer.load_checkpoint", "fairseq.trainer.Trainer.save_checkpoint"),
        "a run resumed in epoch >= 2 rebuilds its batches with another seed, one resumed at an "
        "epoch's end steps the scheduler without the validation loss, and a resumed run counts "
        "--patience from zero again (the count is in no checkpoint); all three now do what the run "
        "left alone did (applies to every architecture, plain transformer included)",
        "exact_resume:install",
    ),
    Patch(
        "bpe_files",
        ("fairseq.data.encoders.build_bpe",),
        "a BPE file path that does not exist here (a checkpoint trained elsewhere or fine-tuned without "
        "--bpe, fairseq#2874) fails deep in the BPE reader; it is now BadFile('<path>: no such BPE file; "
        "pass <keyword>=PATH ...') naming what to pass (from_pretrained and the commands)",
        "bpe_files:install",
    ),
    Patch(
        "inference_batches",
        ("fairseq.data.data_utils.batch_by_size", "fairseq.trainer.Trainer.get_valid_iterator"),
        "batch_by_size ends 'if bsz_mult > 1 and len(b[-1]) % bsz_mult != 0: b = b[:-1]': with the default "
        "--required-batch-size-multiple 8, fairseq-generate, fairseq-validate and the validation inside "
        "fairseq-train silently lose their last batch; batches built in fairseq-generate / -validate and by "
        "Trainer.get_valid_iterator now keep it (training unchanged)",
        "inference_batches:install",
    ),
    Patch(
        "ngram_block",
        ("fairseq.ngram_repeat_block.NGramRepeatBlock._no_repeat_ngram",),
        "the Python n-gram blocker (used without fairseq's CUDA extension) compares the last n-1 positions "
        "of the whole token buffer ('cpu_tokens[bbsz_idx][-(self.no_repeat_ngram_size - 1) :]'), padding, "
        "so --no-repeat-ngram-size blocks nothing; it now sees the generated tokens only",
        "ngram_block:install",
    ),
    Patch(
        "restore_file",
        ("fairseq.checkpoint_utils.load_checkpoint",),
        "a --restore-file naming a missing file ('checkpoint_path = cfg.restore_file') trains from random "
        "weights after an INFO line; it is now BadFile('<path>: no such checkpoint (--restore-file) ...'); "
        "the default checkpoint_last.pt in --save-dir still resumes or starts fresh",
        "restore_file:install",
    ),
    Patch(
        "file_checks",
        ("fairseq.checkpoint_utils.load_checkpoint_to_cpu", "fairseq.checkpoint_utils.load_model_ensemble_and_task",
         "fairseq.trainer.Trainer.load_checkpoint", "fairseq.data.data_utils.load_indexed_dataset",
         "fairseq.data.Dictionary.load", "fairseq.tasks.setup_task"),
        "a truncated or foreign checkpoint, an empty or truncated .idx/.bin, a malformed dictionary, "
        "a data folder that does not exist raise BadFile('<path>: <what is wrong>') instead of a "
        "traceback or garbage batches",
        "file_checks:install",
        command_line=True,
    ),
    Patch(
        "one_line_errors",
        ("sys.excepthook",),
        "an uncaught BadFile or BadFlag, or an assert of fairseq_cli's own command-line checks (no "
        "--max-tokens or --batch-size), prints one line 'error: <message>' (exit status 1) instead of "
        "a traceback; every other exception reaches the previous hook",
        "file_checks:install_excepthook",
        command_line=True,
    ),
)

BY_NAME = {patch.name: patch for patch in PATCHES}

# Trainer.load_checkpoint: the layers of its one wrapper, outermost first.
# file_checks outside, so that a failure anywhere in the load (exact_resume's
# scheduler step included) is reported as the file's.
LOAD_CHECKPOINT_LAYERS = ("file_checks", "exact_resume")


def enabled(patch: Patch) -> bool:
    """Whether the environment lets ``patch`` be installed."""
    return os.environ.get(ALL_OFF_ENV, "1") != "0" and os.environ.get(patch.env, "1") != "0"


def install(command_line=None, only=None) -> list:
    """Install every patch of ``PATCHES`` that its switch allows; the
    ``command_line`` ones only inside a fairseq command (``None``: detect it).
    ``only``: these patch names only (their switches still apply).
    Idempotent. Returns the names of the patches installed (now or before)."""
    if only is not None:
        unknown = set(only) - set(BY_NAME)
        if unknown:
            raise ValueError(f"no patch named {sorted(unknown)}; the patches: {sorted(BY_NAME)}")
        command_line = True
    elif command_line is None:
        from fairseq_dnas.fairseq_patches.file_checks import fairseq_command

        command_line = fairseq_command() is not None
    done = []
    for patch in PATCHES:
        if (only is not None and patch.name not in only) or (patch.command_line and not command_line) \
                or not enabled(patch):
            continue
        module, function = patch.installer.split(":")
        getattr(importlib.import_module(f"{__name__}.{module}"), function)()
        done.append(patch.name)
    return done


def mark(obj, patch_name: str):
    """Tag a wrapper or stand-in with the patch that made it."""
    setattr(obj, MARK, patch_name)
    return obj


def is_patched(obj) -> bool:
    """Whether ``obj`` (a function, classmethod's function or stand-in) is one of ours."""
    return getattr(getattr(obj, "__func__", obj), MARK, None) is not None


def add_load_checkpoint_layer(trainer_class, patch_name: str, layer) -> None:
    """Make ``layer(load, trainer, *args, **kwargs)`` part of
    ``trainer_class.load_checkpoint``. The first call wraps it once; later
    calls add their layer to that wrapper, which runs them in the order of
    ``LOAD_CHECKPOINT_LAYERS`` (``load`` is the next layer inward, at the
    end fairseq's own method). Idempotent per ``patch_name``."""
    current = trainer_class.load_checkpoint
    layers = getattr(current, "_fairseq_dnas_layers", None)
    if layers is None:
        original, layers = current, {}

        def load_checkpoint(self, *args, **kwargs):
            call = functools.partial(original, self)
            for name in reversed(LOAD_CHECKPOINT_LAYERS):
                if name in layers:
                    call = functools.partial(layers[name], call, self)
            return call(*args, **kwargs)

        load_checkpoint._fairseq_dnas_layers = layers
        load_checkpoint.__wrapped__ = original
        load_checkpoint.__doc__ = original.__doc__
        mark(load_checkpoint, "load_checkpoint_layers")
        trainer_class.load_checkpoint = load_checkpoint
    layers.setdefault(patch_name, layer)
