"""The repository's layout holds: the commands a user runs are
modules of ``fairseq_dnas.commands`` that answer ``--help`` from any
directory; scripts/ holds only what a user runs; nothing edits sys.path
outside tests/conftest.py; imports only go down (the analysis library never
registers the plugin; the package's library never imports its commands or
the recipes' internals)."""

import ast
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT

from fairseq_dnas.commands import COMMANDS

SYS_PATH_EXEMPT = {"tests/conftest.py"}


def _tracked(suffix=""):
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p.endswith(suffix) and os.path.isfile(os.path.join(ROOT, p))]


def _imports(path):
    """Every module name ``path`` imports (absolute), at any depth."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


def test_every_command_module_is_listed_and_has_a_main():
    files = {p[len("fairseq_dnas/commands/"):-3] for p in _tracked(".py") if p.startswith("fairseq_dnas/commands/")}
    assert files - {"__init__"} == set(COMMANDS)
    for name in COMMANDS:
        assert "def main(argv=None)" in open(os.path.join(ROOT, "fairseq_dnas", "commands", f"{name}.py")).read()


def test_every_command_answers_help_from_any_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT}
    for name in COMMANDS:
        proc = subprocess.run([sys.executable, "-m", f"fairseq_dnas.commands.{name}", "--help"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("usage:"), (name, proc.stderr[-2000:])


def test_scripts_holds_only_what_a_user_runs():
    assert sorted(p for p in _tracked() if p.startswith("scripts/")) == [
        "scripts/install.sh", "scripts/make_analysis_pictures.sh"]


def test_nothing_edits_sys_path_outside_conftest():
    offenders = [p for p in _tracked() if p.endswith((".py", ".sh")) and p not in SYS_PATH_EXEMPT
                 and re.search(r"sys\.path\.(insert|append)\(", open(os.path.join(ROOT, p)).read())]
    assert offenders == []
    assert all(os.path.isfile(os.path.join(ROOT, p)) for p in SYS_PATH_EXEMPT)  # no stale exemption


@pytest.mark.parametrize("layer, forbidden", [
    # the analysis library works on loaded models; fairseq_dnas.loading registers the plugin
    ("fairseq_dnas/analysis/", ("fairseq_dnas.plugin", "fairseq_dnas.loading", "fairseq_dnas.commands",
                                "fairseq_dnas.recipes")),
    # the library under the commands and the recipes
    ("fairseq_dnas/attention/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/hf/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/fairseq_patches/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/models/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/modules/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/tasks/", ("fairseq_dnas.commands", "fairseq_dnas.recipes", "fairseq_dnas.loading")),
    ("fairseq_dnas/stats.py", ("fairseq_dnas.", "torch")),
    ("fairseq_dnas/reference.py", ("fairseq_dnas.",)),
    ("fairseq_dnas/commands/", ("fairseq_dnas.recipes",)),
])
def test_imports_only_go_down(layer, forbidden):
    files = [p for p in _tracked(".py") if p.startswith(layer)]
    assert files
    wrong = sorted({(p, m) for p in files for m in _imports(p) if m.startswith(forbidden)})
    assert wrong == []


def test_importing_the_package_imports_no_torch():
    """``python -m fairseq_dnas.recipes.progress`` and the table commands start
    in a fraction of a second: the package's __init__ imports nothing heavy."""
    code = "import sys, fairseq_dnas, fairseq_dnas.stats, fairseq_dnas.recipes.progress; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


def test_setup_installs_a_console_script_per_command(monkeypatch):
    """setup.py's console scripts are the commands (read without installing)."""
    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    monkeypatch.chdir(ROOT)
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        exec(compile(f.read(), "setup.py", "exec"), {"__name__": "setup"})
    scripts = captured["entry_points"]["console_scripts"]
    assert scripts == [f"fairseq-dnas-{n.replace('_', '-')} = fairseq_dnas.commands.{n}:main" for n in COMMANDS]
    assert {"fairseq_dnas.commands", "fairseq_dnas.recipes"} <= set(captured["packages"])
