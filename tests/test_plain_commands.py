"""fairseq's own commands with --user-dir fairseq_dnas report bad files in one line.

``fairseq-train``, ``fairseq-generate``, ``fairseq-interactive`` and
``fairseq-validate`` run as a user types them (no recipe script around them),
given a truncated checkpoint or another bad file that ``file_checks`` knows,
must exit with status 1 and one line ``error: <file>: <what is wrong>`` on
stderr, no traceback; any other error must still show fairseq's own output
(its traceback and message), and without ``--user-dir`` nothing changes.
"""

import os
import shutil
import subprocess

import pytest
from recipe_data import make_binarized

from helpers import BIN, ROOT, USER_DIR

# A tiny model (fairseq's flags; the architecture is the plugin's).
MODEL = ["--arch", "transformer_hnas", "--encoder-layers", "1", "--decoder-layers", "1",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
LANGS = ["--source-lang", "article", "--target-lang", "title"]


def _run(command, *args, user_dir=True, stdin=""):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    flags = ["--user-dir", USER_DIR] if user_dir else []
    return subprocess.run([os.path.join(BIN, f"fairseq-{command}"), *args, *flags], env=env, input=stdin,
                          capture_output=True, text=True, timeout=300)


def _train_args(data, save_dir, *extra):
    return [str(data), *LANGS, *MODEL, "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16",
            "--max-update", "2", "--save-dir", str(save_dir), "--cpu", "--no-epoch-checkpoints", *extra]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """Tiny binarized data and a checkpoint trained on it with plain fairseq-train."""
    root = tmp_path_factory.mktemp("plain")
    data = make_binarized(str(root / "data"), sizes=(("train", 32), ("valid", 8), ("test", 8)))
    proc = _run("train", *_train_args(data, root / "ckpt"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return {"data": data, "checkpoint": root / "ckpt" / "checkpoint_last.pt"}


def _truncated_checkpoint(good, folder):
    cut = folder / "cut.pt"
    content = good["checkpoint"].read_bytes()
    cut.write_bytes(content[: len(content) // 2])
    return cut


def _damaged_data(good, folder, name, how):
    """A copy of the data folder with ``name`` truncated (or emptied)."""
    data = folder / "bin"
    shutil.copytree(good["data"], data)
    content = (data / name).read_bytes()
    (data / name).write_bytes(b"" if how == "empty" else content[: len(content) // 2 - 3])
    return data, data / name


def _args(command, data, checkpoint, folder):
    """A normal invocation of ``command`` on ``data`` with ``checkpoint``."""
    if command == "train":
        return _train_args(data, folder / "save", "--restore-file", str(checkpoint))
    common = [str(data), *LANGS, "--path", str(checkpoint), "--cpu"]
    if command == "generate":
        return [*common, "--gen-subset", "valid", "--beam", "2", "--batch-size", "8"]
    if command == "validate":
        return [*common, "--task", "translation", "--valid-subset", "valid", "--batch-size", "8"]
    return [*common, "--beam", "2"]  # interactive (the sentences come on stdin)


def _assert_one_error_line(proc, bad, problem):
    err = proc.stderr
    assert proc.returncode == 1, (proc.returncode, err[-3000:])
    assert "Traceback" not in err + proc.stdout, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], err[-3000:]
    assert errors[0].startswith(f"error: {bad}: ") and problem in errors[0], errors[0]


# (command, bad file, what the line says): a truncated checkpoint for each
# command, and a bad data file each command reads (interactive reads only the
# dictionaries, the others a truncated .bin of the split they load).
CASES = [
    ("train", "checkpoint", "truncated or corrupt"),
    ("generate", "checkpoint", "truncated or corrupt"),
    ("interactive", "checkpoint", "truncated or corrupt"),
    ("validate", "checkpoint", "truncated or corrupt"),
    ("train", "train.article-title.title.bin", "truncated: "),
    ("interactive", "dict.title.txt", "empty dictionary"),
    # The same data-file check as train's (fairseq's load_indexed_dataset), on the split they read.
    pytest.param("generate", "valid.article-title.article.bin", "truncated: ", marks=pytest.mark.full),
    pytest.param("validate", "valid.article-title.title.bin", "truncated: ", marks=pytest.mark.full),
]


def _case_id(case):
    command, bad, _ = case.values if hasattr(case, "values") else case
    return f"{command}-{bad}"


@pytest.mark.parametrize("command,bad,problem", CASES, ids=[_case_id(c) for c in CASES])
def test_bad_file_ends_in_one_line(good, tmp_path, command, bad, problem):
    if bad == "checkpoint":
        data, checkpoint = good["data"], _truncated_checkpoint(good, tmp_path)
        bad_path = checkpoint
    else:
        data, bad_path = _damaged_data(good, tmp_path, bad, "empty" if bad.startswith("dict") else "truncated")
        checkpoint = good["checkpoint"]
    proc = _run(command, *_args(command, data, checkpoint, tmp_path), stdin="w1 w2 w3\n")
    _assert_one_error_line(proc, bad_path, problem)
    if command == "train":  # refused before any update: no checkpoint written
        assert not list(tmp_path.glob("save/*.pt"))


def test_without_user_dir_fairseq_output_is_unchanged(good, tmp_path):
    """The same truncated checkpoint without the plugin: fairseq's traceback,
    as before (the plugin changes nothing unless it is loaded)."""
    cut = _truncated_checkpoint(good, tmp_path)
    # (The checkpoint is of the plugin's architecture, but fairseq fails
    # while reading the file, before the architecture matters.)
    proc = _run("validate", *_args("validate", good["data"], cut, tmp_path), user_dir=False)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert "PytorchStreamReader failed" in proc.stderr.rstrip().splitlines()[-1], proc.stderr[-2000:]


# Errors that are not a bad file: fairseq's own message and traceback, exit
# status unchanged (fairseq raises; Python exits with 1).
UNRELATED = [
    ("generate", "missing-checkpoint", "Model file not found"),
    ("train", "missing-valid-split", "Dataset not found"),
    pytest.param("interactive", "missing-checkpoint", "Model file not found", marks=pytest.mark.full),
]


@pytest.mark.full
def test_a_command_line_assert_of_fairseq_is_one_line(good, tmp_path):
    """fairseq_cli's own checks of the command line (an assert: "Must specify batch size ...")
    end in one line with the plugin, exit status 1, no traceback."""
    args = _args("validate", good["data"], good["checkpoint"], tmp_path)
    i = args.index("--batch-size")
    del args[i:i + 2]
    proc = _run("validate", *args)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.rstrip().splitlines()[-1].startswith("error: Must specify batch size"), proc.stderr[-3000:]


@pytest.mark.parametrize("command,case,message", UNRELATED)
def test_other_errors_keep_fairseqs_output(good, tmp_path, command, case, message):
    args = _args(command, good["data"], good["checkpoint"], tmp_path)
    if case == "missing-checkpoint":
        args[args.index("--path") + 1] = str(tmp_path / "no-such.pt")
    elif case == "missing-valid-split":
        args = _train_args(good["data"], tmp_path / "save", "--valid-subset", "nosuch")
    proc = _run(command, *args, stdin="w1 w2 w3\n")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback (most recent call last)" in proc.stderr, proc.stderr[-3000:]
    assert message in proc.stderr.rstrip().splitlines()[-1], proc.stderr[-3000:]
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error: ")], proc.stderr[-3000:]
