"""Bad checkpoint and data files end in one line that names the file.

fairseq meets a truncated checkpoint, a checkpoint of another architecture, or
an empty or truncated binarized file with a long traceback (or, for a
truncated ``.bin``, with garbage batches or an error many updates later).
``install()`` wraps the few fairseq functions that read those files so that
each problem is raised as ``BadFile("<path>: <what is wrong>")``;
``scripts/run_fairseq.py`` (what the Gigaword recipe runs) and the analysis
scripts print that one line and exit with status 1. Nothing changes for a
good file.

fairseq's own commands (``fairseq-train``, ``fairseq-generate``,
``fairseq-interactive``, ``fairseq-validate``, also as ``python -m
fairseq_cli.<command>``) import the plugin with ``--user-dir fairseq_dnas``
before they read any checkpoint or data file; the plugin then calls
``install_for_command_line()``: the same checks, and a ``sys.excepthook``
that prints an uncaught ``BadFile`` as its one line ``error: <path>: <what is
wrong>`` (exit status 1, as for any uncaught exception) and hands every other
exception to the previous hook, so fairseq's own output for anything else is
unchanged. In Python (``import fairseq_dnas`` in a notebook or a script of
your own) nothing is installed: fairseq raises its own exceptions there.
"""

import os
import pickle
import struct
import sys
import zipfile

MMAP_MAGIC = b"MMIDIDX\x00\x00"  # fairseq's MMapIndexedDataset index header


class BadFile(Exception):
    """A checkpoint or data file that cannot be used; str() is the one line."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = path


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
        if "fairseq-dnas refused" in str(err):  # checkpoint_compat's weights-only refusal
            # (imported here: checkpoint_compat registers the plugin with fairseq,
            # which imports this module; a module-level import would be circular)
            from fairseq_dnas.checkpoint_compat import TRUST_ENV

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
    detail = lines[0] if lines else _first_line(err)
    return detail[:300]


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


def install() -> None:
    """Wrap fairseq's checkpoint and data readers (idempotent)."""
    from fairseq import checkpoint_utils, trainer
    from fairseq.data import Dictionary, data_utils

    if getattr(checkpoint_utils, "_dnas_file_checks", False):
        return
    checkpoint_utils._dnas_file_checks = True

    load_to_cpu = checkpoint_utils.load_checkpoint_to_cpu

    def load_checkpoint_to_cpu(path, *args, **kwargs):
        return read_checkpoint(load_to_cpu, path, *args, **kwargs)

    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu

    load_ensemble = checkpoint_utils.load_model_ensemble_and_task

    def load_model_ensemble_and_task(filenames, *args, **kwargs):
        try:
            return load_ensemble(filenames, *args, **kwargs)
        except RuntimeError as err:
            if "Error(s) in loading state_dict" not in str(err):
                raise
            raise _architecture_error(", ".join(map(str, filenames)), err) from None

    checkpoint_utils.load_model_ensemble_and_task = load_model_ensemble_and_task

    trainer_load = trainer.Trainer.load_checkpoint

    def load_checkpoint(self, filename, *args, **kwargs):
        try:
            return trainer_load(self, filename, *args, **kwargs)
        except BadFile:
            raise
        except Exception as err:
            if "Cannot load model parameters from checkpoint" not in str(err):
                raise
            raise _architecture_error(filename, err) from None

    trainer.Trainer.load_checkpoint = load_checkpoint

    load_indexed = data_utils.load_indexed_dataset

    def load_indexed_dataset(path, *args, **kwargs):
        check_indexed_dataset(path)
        return load_indexed(path, *args, **kwargs)

    data_utils.load_indexed_dataset = load_indexed_dataset

    load_dictionary = Dictionary.load.__func__

    def load(cls, f):
        return read_dictionary(lambda path: load_dictionary(cls, path), f)

    Dictionary.load = classmethod(load)


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


def _excepthook_with_bad_files(previous):
    from fairseq_dnas.errors import BadFlag

    def excepthook(exc_type, exc, tb):
        if isinstance(exc, (BadFile, BadFlag)):
            print(error_line(exc), file=sys.stderr, flush=True)
            return  # the interpreter then exits with status 1, as after any uncaught exception
        previous(exc_type, exc, tb)

    excepthook.dnas_bad_files = True
    return excepthook


def install_for_command_line() -> None:
    """``install()``, and an uncaught BadFile printed as its one line instead
    of a traceback (idempotent; other exceptions reach the previous hook)."""
    install()
    if not getattr(sys.excepthook, "dnas_bad_files", False):
        sys.excepthook = _excepthook_with_bad_files(sys.excepthook)
