"""tests/fork_server.py, the tests' way to start fairseq-* commands and Python
scripts without paying their imports each time: a child behaves as a real
process would, compared with one started by subprocess."""

import subprocess
import sys

import pytest

import fork_server

SCRIPT = '''
import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("FORK_TEST"), "path0", sys.path[0] == os.path.dirname(os.path.abspath(__file__)))
print("stdin", sys.stdin.read().strip(), "main", __name__)
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "raise":
    raise ValueError("broken file")
if how == "exit-text":
    sys.exit("one line error")
if how == "exit-3":
    sys.exit(3)
import atexit
atexit.register(lambda: print("atexit ran"))
'''


@pytest.mark.parametrize("how", ["ok", "raise", "exit-text", "exit-3"])
def test_a_forked_script_behaves_as_a_real_process(tmp_path, how):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {"PATH": "/usr/bin:/bin", "FORK_TEST": "yes"}
    real = subprocess.run([sys.executable, str(script), how], cwd=tmp_path, input="hello\n", env=env,
                          capture_output=True, text=True, timeout=60)
    forked = fork_server.run(script, [how], cwd=tmp_path, input="hello\n", env=env, timeout=60)
    assert forked.returncode == real.returncode == {"ok": 0, "raise": 1, "exit-text": 1, "exit-3": 3}[how]
    assert forked.stdout == real.stdout and f"['{how}'] cwd {tmp_path} env yes path0 True" in real.stdout
    assert forked.stderr == real.stderr, (forked.stderr, real.stderr)
    assert ("atexit ran" in forked.stdout) == (how == "ok")


def test_a_command_past_its_timeout_is_killed(tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        fork_server.run(script, [], timeout=1)
    # the server goes on serving
    script.write_text("print('next')\n")
    assert fork_server.run(script, [], timeout=30).stdout == "next\n"
