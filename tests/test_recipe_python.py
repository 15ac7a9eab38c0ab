"""The recipe scripts take PYTHON as a path or as a command name on PATH
(PYTHON=python3 used to be refused with "no Python found")."""

import os
import shutil
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


# examples/check_python.py: check_python's import check, remembered per installation.
CHECK = os.path.join(ROOT, "examples", "check_python.py")
MODULES = ("fairseq", "fairseq_dnas", "sentencepiece", "rouge_score")


def _fake_modules(folder, broken=None):
    """Stand-ins for the four modules that log each import (fast: no torch)."""
    for name in MODULES:
        (folder / name).mkdir(parents=True, exist_ok=True)
        body = "import os\nopen(os.environ['IMPORT_LOG'], 'a').write(__name__ + '\\n')\n"
        if name == broken:
            body += "raise ImportError('boom: built for another Python')\n"
        (folder / name / "__init__.py").write_text(body)


def _check(tmp_path, **env):
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "IMPORT_LOG": str(tmp_path / "imports.log"), **env}
    # -S: without site-packages, so that only the stand-ins can be found
    return subprocess.run([sys.executable, "-S", CHECK], env=env, capture_output=True, text=True, timeout=60)


def _imports(tmp_path):
    log = tmp_path / "imports.log"
    return log.read_text().split() if log.exists() else []


def test_check_remembers_a_passed_check_until_a_module_changes(tmp_path):
    _fake_modules(tmp_path / "site")
    assert _check(tmp_path).returncode == 0
    assert _imports(tmp_path) == list(MODULES)
    assert len(os.listdir(tmp_path / "cache/fairseq-dnas/checked")) == 1
    # the same installation again: nothing imported
    assert _check(tmp_path).returncode == 0
    assert _imports(tmp_path) == list(MODULES)
    # a reinstalled module (new file, new modification time): imported again
    init = tmp_path / "site/sentencepiece/__init__.py"
    os.utime(init, ns=(os.stat(init).st_atime_ns, os.stat(init).st_mtime_ns + 10**9))
    assert _check(tmp_path).returncode == 0
    assert _imports(tmp_path) == list(MODULES) * 2
    # with the memory turned off: imported every time
    assert _check(tmp_path, FAIRSEQ_DNAS_CHECK_CACHE="0").returncode == 0
    assert _imports(tmp_path) == list(MODULES) * 3


def test_check_names_a_module_that_fails_to_import_and_remembers_nothing(tmp_path):
    _fake_modules(tmp_path / "site", broken="fairseq")
    for _ in range(2):  # a failed check is not remembered: it fails again
        proc = _check(tmp_path)
        assert proc.returncode == 1
        assert proc.stdout.strip() == "fairseq: ImportError: boom: built for another Python"
    assert not (tmp_path / "cache/fairseq-dnas/checked").exists()


def test_check_fails_on_a_missing_module_even_after_a_passed_check(tmp_path):
    _fake_modules(tmp_path / "site")
    assert _check(tmp_path).returncode == 0
    shutil.rmtree(tmp_path / "site/rouge_score")
    proc = _check(tmp_path)
    assert proc.returncode == 1 and proc.stdout.strip() == "rouge_score: not installed"


def test_a_recipe_refuses_a_python_whose_fairseq_does_not_import_in_one_line(tmp_path):
    _fake_modules(tmp_path / "site", broken="fairseq")
    (tmp_path / "dict.article.txt").write_text("w 1\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "IMPORT_LOG": str(tmp_path / "imports.log"), "PYTHON": sys.executable, "DRY_RUN": "1",
           "DATA": str(tmp_path), "DEVICE": "cpu", "SIZE": "tiny"}
    env.pop("FAIRSEQ_DNAS_CHECKED_PYTHON", None)
    proc = subprocess.run(["bash", TRAIN], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"[train] error: {sys.executable} lacks fairseq, fairseq_dnas, sentencepiece or rouge-score "
        "(fairseq: ImportError: boom: built for another Python); run 'bash scripts/install.sh' "
        "(or set PYTHON to the environment that has them)"]
