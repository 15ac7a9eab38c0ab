"""Run the tests' fairseq-* commands and Python scripts without paying their
imports each time: a fork server.

Every fairseq-* process spends about 7 CPU seconds importing (torch 2.9 s,
scikit-learn 1.75 s through two of fairseq's own modules, fairseq itself)
before it reads its first argument, and the tests start dozens of them. The
server (one per pytest worker, started on first use) imports torch and
fairseq once, then forks a child per command. The child is a process of its
own: its pid, working directory, environment, stdin/stdout/stderr files and
exit status. It runs the script's own file as ``__main__`` (a console script
such as ``.venv/bin/fairseq-train``, a script's file, or a module as
``python -m fairseq_dnas.commands.X`` runs it) and ends the way the
interpreter ends a script: an uncaught exception through ``sys.excepthook``
(exit status 1), ``SystemExit`` codes, atexit handlers, flushed streams.

What the child does not get fresh are the modules imported before the fork.
The server imports only torch and the ``fairseq`` package (its registries),
and the child resets the root logger to a fresh interpreter's (fairseq_cli.*
configure it before they import fairseq);
``fairseq_cli.*``, the plugin (``--user-dir``) and the scripts' own modules
are imported in the child, so their import-time code (logging setup,
excepthooks, registrations) runs there, as in a real command. Environment
variables read at import by torch or fairseq are the server's (the pytest
worker's); the thread count follows the child's ``OMP_NUM_THREADS``. Seen
differences from a real process, compared line by line on a fairseq-train
run: the log lacks fairseq's import-time line "Please install tensorboardX"
(logged in the server), and a warning raised through the script's top level
names ``<frozen runpy>`` instead of ``sys`` as its place.

``tests/test_plain_commands.py`` keeps real processes (it is about what a
plain command prints), so does every recipe (shell scripts), and
``FAIRSEQ_DNAS_TEST_FORK=0`` turns the server off for all.
"""

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile

ENABLED = os.environ.get("FAIRSEQ_DNAS_TEST_FORK", "1") != "0"


def _exit_code(e: SystemExit) -> int:
    """The status the interpreter gives ``raise SystemExit(code)``."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(req) -> None:
    """In the forked child: become the command, run it, exit. Never returns."""
    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in ((0, req["stdin"], os.O_RDONLY), (1, req["stdout"], os.O_WRONLY),
                                (2, req["stderr"], os.O_WRONLY)):
            f = os.open(path, flags)
            os.dup2(f, fd)
            os.close(f)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import logging
        import runpy

        # A fresh interpreter's root logger: fairseq_cli.* configure it before
        # importing fairseq (logging.basicConfig is a no-op once the root has a
        # handler), but importing fairseq in the server already gave it one.
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)

        import torch
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        if req.get("module"):
            # as `python -m module`: the working directory first on sys.path,
            # sys.argv[0] the module's file
            import importlib.util

            sys.path[0] = os.getcwd()
            spec = importlib.util.find_spec(req["module"])
            if spec is None or spec.origin is None:
                print(f"{sys.executable}: No module named {req['module']}", file=sys.stderr)
                os._exit(1)
            req["script"] = spec.origin
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(req["script"]))  # as `python script` sets it
        sys.argv = [req["script"], *req["args"]]
        try:
            if req.get("module"):
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(req["script"], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = _exit_code(e)
        except BaseException:  # noqa: BLE001 (what the interpreter does with an uncaught exception)
            etype, value, tb = sys.exc_info()
            # the traceback from the script's first frame, as `python script` prints it
            first = tb
            while first is not None and first.tb_frame.f_code.co_filename != req["script"]:
                first = first.tb_next
            sys.excepthook(etype, value.with_traceback(first or tb), first or tb)
            code = 1
        try:
            atexit._run_exitfuncs()
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
    finally:
        os._exit(code)


def serve() -> None:
    """The server's loop: one JSON request a line on stdin, one JSON answer a
    line on stdout (the child's exit status, and whether it was killed at
    its timeout)."""
    import torch  # noqa: F401 (the point: imported once, before every fork)
    import fairseq  # noqa: F401

    channel = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray output of imports never reaches the channel
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req)
        with os.fdopen(os.pidfd_open(pid)) as exited:  # readable once the child has ended
            timed_out = not select.select([exited], [], [], req["timeout"])[0]
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        channel.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out}) + "\n")
        channel.flush()


class ForkServer:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=dict(os.environ))

    def run(self, script, args, cwd=None, input=None, env=None, timeout=None, module=None):
        """Like subprocess.run([python, script, *args], capture_output=True, text=True),
        or [python, -m, module, *args] when ``module`` is given."""
        with tempfile.TemporaryDirectory(prefix="fork-") as tmp:
            paths = {name: os.path.join(tmp, name) for name in ("stdin", "stdout", "stderr")}
            with open(paths["stdin"], "w") as f:
                f.write(input or "")
            for name in ("stdout", "stderr"):
                open(paths[name], "w").close()
            req = dict(script=str(script), args=[str(a) for a in args], cwd=str(cwd or os.getcwd()),
                       env=dict(env if env is not None else os.environ), timeout=timeout, module=module,
                       **paths)
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the test fork server ended (see the output above)")
            done = json.loads(line)
            if done["timed_out"]:
                raise subprocess.TimeoutExpired([script, *args], timeout)
            out, err = (open(paths[n], errors="replace").read() for n in ("stdout", "stderr"))
        return subprocess.CompletedProcess([script, *args], done["returncode"], out, err)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_server = None


def run(script, args, **kwargs):
    """Run ``script`` (a Python file; or with ``module=``, ``python -m module``)
    with ``args`` in a fork of the server."""
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
        atexit.register(_server.close)
    return _server.run(script, args, **kwargs)


if __name__ == "__main__":
    serve()
