"""pytest plugin: wall and CPU seconds of every test, written as it goes.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests -p tests.times_plugin \
        --test-times=/tmp/times.tsv

(Not named test_*.py, so pytest does not collect it as a test file; loaded
only with -p, so a run without it is untouched.)

Why CPU seconds: on a shared or loaded machine the wall time of a test says
more about its neighbours than about the test (the same suite took 900 s and
2,450 s on two 2-core machines of one kind). The CPU seconds of the test's
process plus the subprocesses it waited for (fairseq-train, the recipes'
scripts) barely move with the load, so they rank the tests and add up to what
the suite costs; docs/testing.md uses both.

Each line of the TSV (appended when a test's teardown ends, so a run cut
short still leaves what it measured): node id, outcome, wall seconds
(setup + call + teardown), CPU seconds, the worker ('-' without xdist).
Session fixtures are charged to the first test that uses them, as in
``--durations``. At the end the plugin prints the files by CPU seconds.
"""

import collections
import os
import resource
import time

import pytest


def _cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pytest_addoption(parser):
    parser.addoption("--test-times", metavar="TSV", default=None,
                     help="append each test's wall and CPU seconds to TSV (tests/times_plugin.py)")


_START = pytest.StashKey()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_START] = (time.perf_counter(), _cpu_seconds())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "teardown" and _START in item.stash:
        wall0, cpu0 = item.stash[_START]
        # user_properties travel from xdist workers to the controller
        report.user_properties.append(("times", (time.perf_counter() - wall0, _cpu_seconds() - cpu0)))
    return report


class _Recorder:
    def __init__(self, path):
        self.path = path
        self.outcome = {}
        self.per_file = collections.defaultdict(lambda: [0.0, 0.0, 0])

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcome[report.nodeid] = report.outcome
        times = dict(report.user_properties).get("times") if report.when == "teardown" else None
        if times is None:
            return
        wall, cpu = times
        worker = getattr(report, "node", None)
        worker = getattr(worker, "gateway", None)
        with open(self.path, "a") as f:
            f.write(f"{report.nodeid}\t{self.outcome.get(report.nodeid, '?')}\t{wall:.2f}\t{cpu:.2f}\t"
                    f"{getattr(worker, 'id', '-')}\n")
        entry = self.per_file[report.nodeid.split("::")[0]]
        entry[0] += wall
        entry[1] += cpu
        entry[2] += 1

    def pytest_terminal_summary(self, terminalreporter):
        rows = sorted(self.per_file.items(), key=lambda kv: -kv[1][1])
        terminalreporter.section(f"test times by file (CPU seconds; per test: {self.path})")
        for name, (wall, cpu, n) in rows:
            terminalreporter.write_line(f"{cpu:8.1f} cpu-s {wall:8.1f} wall-s {n:4d} tests  {name}")
        total = [sum(v[i] for v in self.per_file.values()) for i in (0, 1)]
        terminalreporter.write_line(f"{total[1]:8.1f} cpu-s {total[0]:8.1f} wall-s (sum over tests)")


def pytest_configure(config):
    path = config.getoption("test_times")
    # Only the process that reports (the xdist controller, or the only one) writes.
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(os.path.abspath(path)), "test-times-recorder")
