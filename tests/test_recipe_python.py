"""The recipe scripts take PYTHON as a path or as a command name on PATH
(issue 11, part 5: PYTHON=python3 used to be refused with "no Python found")."""

import os
import subprocess
import sys

from helpers import ROOT

TRAIN = os.path.join(ROOT, "examples", "gigaword", "train.sh")
VENV_BIN = os.path.dirname(sys.executable)


def _dry_run(tmp_path, python):
    (tmp_path / "dict.article.txt").write_text("w 1\n")
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PYTHON": python, "DRY_RUN": "1",
           "DATA": str(tmp_path), "DEVICE": "cpu", "SIZE": "tiny"}
    return subprocess.run(["bash", TRAIN], env=env, capture_output=True, text=True, timeout=300)


def test_train_accepts_a_command_name_on_path(tmp_path):
    # (A path is what every other recipe test passes.)
    proc = _dry_run(tmp_path, "python3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The command runs the interpreter found on PATH, by its full path.
    launcher = proc.stdout.split()[0]
    assert os.path.isabs(launcher) and os.path.samefile(os.path.dirname(launcher), VENV_BIN), proc.stdout


def test_an_unknown_python_is_refused_in_one_line(tmp_path):
    proc = _dry_run(tmp_path, "no-such-python3")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "[train] error: no Python found at PYTHON=no-such-python3 (a path or a command on PATH); "
        "run 'bash scripts/install.sh' or set PYTHON"]
