"""Patches ``file_checks`` and ``one_line_errors``: bad checkpoint and data
files, and bad plugin flags, end in one line.

fairseq meets a truncated checkpoint, a checkpoint of another architecture, or
an empty or truncated binarized file with a long traceback (or, for a
truncated ``.bin``, with garbage batches or an error many updates later).
``install()`` wraps the few fairseq functions that read those files so that
each problem is raised as ``BadFile("<path>: <what is wrong>")``;
``fairseq_dnas/recipes/run_fairseq.py`` (what the Gigaword recipe runs) and the analysis
scripts print that one line and exit with status 1. Nothing changes for a
good file.

fairseq's own commands (``fairseq-train``, ``fairseq-generate``,
``fairseq-interactive``, ``fairseq-validate``, also as ``python -m
fairseq_cli.<command>``) import the plugin with ``--user-dir fairseq_dnas``
before they read any checkpoint or data file; ``fairseq_patches.install()``
then installs these checks and (``install_excepthook``) a ``sys.excepthook``
that prints an uncaught ``BadFile`` or ``BadFlag`` as its one line ``error:
<message>`` (exit status 1, as for any uncaught exception) and hands every
other exception to the previous hook, so fairseq's own output for anything
else is unchanged. In Python (a notebook or a script of your own) neither is
installed unless asked for (``install(command_line=True)``): fairseq raises
its own exceptions there.
"""

import os
import pickle
import re
import struct
import sys
import zipfile

from fairseq_dnas.errors import BadFile, BadFlag
from fairseq_dnas.fairseq_patches.checkpoint_load import REFUSED, TRUST_ENV

MMAP_MAGIC = b"MMIDIDX\x00\x00"  # fairseq's MMapIndexedDataset index header


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return " ".join(text.splitlines()[0].split())[:300]


def read_checkpoint(load, path, *args, **kwargs):
    """``load(path)`` (fairseq's ``load_checkpoint_to_cpu``) with its failures
    turned into BadFile."""
    if not os.path.exists(path):
        raise BadFile(path, "no such checkpoint")
    if os.path.getsize(path) == 0:
        raise BadFile(path, "empty file (0 bytes), not a checkpoint")
    try:
        state = load(path, *args, **kwargs)
    except pickle.UnpicklingError as err:
        if REFUSED in str(err):  # checkpoint_load's weights-only refusal
            raise BadFile(path, "refused to unpickle: it holds a type fairseq never writes into a "
                                "checkpoint (corrupt, or not a fairseq checkpoint); set "
                                f"{TRUST_ENV}=1 only if you trust the file") from None
        raise BadFile(path, f"not a readable checkpoint, truncated or corrupt ({_first_line(err)})") from None
    except (PermissionError, IsADirectoryError) as err:
        raise BadFile(path, f"cannot read ({err.strerror})") from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, struct.error) as err:
        raise BadFile(path, f"not a readable checkpoint, truncated or corrupt ({_first_line(err)})") from None
    except (KeyError, TypeError, AttributeError) as err:  # fairseq's upgrade of what it read
        raise BadFile(path, f"a torch file, but not a fairseq checkpoint (no {_first_line(err)} entry)") from None
    if not isinstance(state, dict) or "model" not in state:
        raise BadFile(path, "a torch file, but not a fairseq checkpoint (no 'model' entry)")
    return state


def _mismatch(err: BaseException) -> str:
    """The first concrete line of torch's load_state_dict error (a size
    mismatch, or missing / unexpected parameter names)."""
    while err.__cause__ is not None or err.__context__ is not None:
        if "Error(s) in loading state_dict" in str(err):
            break
        err = err.__cause__ or err.__context__
    lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
    keys = {kind: re.findall(r'"([^"]+)"', line) for line in lines
            for kind in ("Missing", "Unexpected") if line.startswith(f"{kind} key(s) in state_dict:")}
    if keys:  # whole key names only, never a line cut inside one
        parts = []
        for kind, names in keys.items():
            shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
            parts.append(f"{kind.lower()} keys {shown}")
        return "; ".join(parts)
    detail = lines[0] if lines else _first_line(err)
    return detail if len(detail) <= 300 else detail[:300].rsplit(" ", 1)[0] + " ..."


def _architecture_error(path, err):
    return BadFile(path, "its parameters do not fit the model being built (a checkpoint of another "
                         f"architecture, size or dictionary?): {_mismatch(err)}")


def check_indexed_dataset(path):
    """Check fairseq's binarized ``path``.idx / ``path``.bin before they are
    opened: present, not empty, the index readable, the data as long as the
    index says. BadFile otherwise."""
    idx, bin_ = path + ".idx", path + ".bin"
    if not (os.path.exists(idx) and os.path.exists(bin_)):
        return  # fairseq itself reports a missing split
    if os.path.getsize(idx) == 0:
        raise BadFile(idx, "empty file (0 bytes), not a fairseq index")
    with open(idx, "rb") as f:
        if f.read(len(MMAP_MAGIC)) != MMAP_MAGIC:
            return  # another dataset implementation: fairseq's own checks apply
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    try:
        index = MMapIndexedDataset.Index(idx)
        sizes, pointers, itemsize = index.sizes, index._pointers, index.dtype().itemsize
        expected = int(pointers[-1]) + int(sizes[-1]) * itemsize if len(index) else 0
        del index
    except (AssertionError, struct.error, ValueError, KeyError) as err:
        raise BadFile(idx, f"truncated or corrupt index ({_first_line(err)})") from None
    have = os.path.getsize(bin_)
    if have < expected:
        raise BadFile(bin_, f"truncated: {have} bytes, its index {os.path.basename(idx)} "
                            f"needs {expected} (for {len(sizes)} sentences)")


def read_dictionary(load, f):
    """``load(f)`` (fairseq's ``Dictionary.load``) with a malformed or empty
    dictionary file turned into BadFile."""
    try:
        d = load(f)
    except (ValueError, RuntimeError, UnicodeError) as err:
        raise BadFile(f, f"not a fairseq dictionary ({_first_line(err)})") from None
    except Exception as err:  # fairseq raises a bare Exception for a bad encoding
        if "Incorrect" not in str(err):
            raise
        raise BadFile(f, f"not a fairseq dictionary ({_first_line(err)})") from None
    if isinstance(f, str) and len(d) <= d.nspecial:
        raise BadFile(f, "empty dictionary (no entries besides the special symbols)")
    return d


def _load_checkpoint_layer(load, trainer, filename, *args, **kwargs):
    """The layer of ``Trainer.load_checkpoint``: a checkpoint whose
    parameters do not fit the model is a BadFile naming it."""
    try:
        return load(filename, *args, **kwargs)
    except BadFile:
        raise
    except Exception as err:
        if "Cannot load model parameters from checkpoint" not in str(err):
            raise
        raise _architecture_error(filename, err) from None


def check_data_paths(cfg) -> None:
    """BadFile for a data path (fairseq's positional DATA; several joined by
    ':') that does not exist: fairseq would fail with a FileNotFoundError
    traceback from deep inside the task."""
    data = getattr(cfg, "data", None)
    if not isinstance(data, str) or not data:
        return
    for path in data.split(os.pathsep):
        if path and not os.path.exists(path):
            raise BadFile(path, "no such data folder (give the folder fairseq-preprocess wrote, its --destdir)")


def install() -> None:
    """Wrap fairseq's checkpoint and data readers (idempotent)."""
    from fairseq import checkpoint_utils, tasks, trainer
    from fairseq.data import Dictionary, data_utils

    from fairseq_dnas.fairseq_patches import add_load_checkpoint_layer, is_patched, mark

    add_load_checkpoint_layer(trainer.Trainer, "file_checks", _load_checkpoint_layer)
    if is_patched(checkpoint_utils.load_checkpoint_to_cpu):
        return

    load_to_cpu = checkpoint_utils.load_checkpoint_to_cpu

    def load_checkpoint_to_cpu(path, *args, **kwargs):
        return read_checkpoint(load_to_cpu, path, *args, **kwargs)

    load_ensemble = checkpoint_utils.load_model_ensemble_and_task

    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        try:
            return load_ensemble(filenames, *args, **kwargs)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            raise _architecture_error(", ".join(map(str, filenames)), err) from None

    load_indexed = data_utils.load_indexed_dataset

    def load_indexed_dataset(path, *args, **kwargs):
        check_indexed_dataset(path)
        return load_indexed(path, *args, **kwargs)

    load_dictionary = Dictionary.load.__func__

    def load(cls, f):
        return read_dictionary(lambda path: load_dictionary(cls, path), f)

    setup = tasks.setup_task

    def setup_task(cfg, *args, **kwargs):
        check_data_paths(cfg)
        return setup(cfg, *args, **kwargs)

    for wrapper, wrapped in ((load_checkpoint_to_cpu, load_to_cpu), (load_model_ensemble_and_task, load_ensemble),
                             (load_indexed_dataset, load_indexed), (load, load_dictionary), (setup_task, setup)):
        wrapper.__wrapped__ = wrapped
        mark(wrapper, "file_checks")
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task
    data_utils.load_indexed_dataset = load_indexed_dataset
    Dictionary.load = classmethod(load)
    tasks.setup_task = setup_task


# fairseq's command-line tools that get the one-line errors (console script
# fairseq-<name>, or python -m fairseq_cli.<name>).
COMMANDS = ("train", "generate", "interactive", "validate")


def fairseq_command():
    """The fairseq command this process runs (one of COMMANDS), else None."""
    main = sys.modules.get("__main__")
    module = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if module.startswith("fairseq_cli."):  # python -m fairseq_cli.train
        name = module[len("fairseq_cli."):]
    else:  # the console script (a wrapper that imports fairseq_cli.<name>)
        program = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv else ""))[0]
        name = program[len("fairseq-"):] if program.startswith("fairseq-") else None
    return name if name in COMMANDS else None


def error_line(err: Exception) -> str:
    """What a command prints for a bad file or a bad plugin flag (and the
    recipes grep for)."""
    return f"error: {err}"


def _raised_by_fairseq_cli(tb) -> bool:
    """Whether the innermost frame of ``tb`` is in fairseq's command code
    (fairseq_cli/), where its asserts are checks of the command line."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}fairseq_cli{os.sep}" in tb.tb_frame.f_code.co_filename


def _excepthook_with_bad_files(previous):
    def excepthook(exc_type, exc, tb):
        if isinstance(exc, (BadFile, BadFlag)):
            print(error_line(exc), file=sys.stderr, flush=True)
            return  # the interpreter then exits with status 1, as after any uncaught exception
        if isinstance(exc, AssertionError) and str(exc).strip() and _raised_by_fairseq_cli(tb):
            # e.g. "Must specify batch size either with --max-tokens or --batch-size"
            print(error_line(" ".join(str(exc).split())), file=sys.stderr, flush=True)
            return
        previous(exc_type, exc, tb)

    excepthook.__wrapped__ = previous
    return excepthook


def install_excepthook() -> None:
    """An uncaught BadFile or BadFlag printed as its one line instead of a
    traceback (idempotent; other exceptions reach the previous hook)."""
    from fairseq_dnas.fairseq_patches import is_patched, mark

    if not is_patched(sys.excepthook):
        sys.excepthook = mark(_excepthook_with_bad_files(sys.excepthook), "one_line_errors")
