#!/usr/bin/env python
"""How many CPU threads a recipe's training gives each process by default.

    python -m fairseq_dnas.recipes.cpu_threads            # prints e.g. 2
    python -m fairseq_dnas.recipes.cpu_threads --explain  # ... and why, on stderr

The recipes read ``CPU_THREADS`` (the threads shared by the training
processes of one run); when it is not set, examples/common.sh asks this
module. PyTorch's OpenMP threads wait for each other at every operation, so a
thread that has no free core stalls all the others: on a 2-core machine with
other work running, two threads trained the quickstart's model several times
slower than one (docs/results/2026-11-28-cpu-threads-under-load.md). The
default is therefore the cores this process may use (``os.sched_getaffinity``,
which honours ``taskset`` and container limits) minus the load already on
them (the cores busy over half a second, from /proc/stat; see
``current_load`` and ``default_threads``), at least one: all cores on an idle
machine, fewer as other work appears, one on a busy one.
``CPU_THREADS=N`` overrides it.
"""

import argparse
import math
import os
import sys
import time


def usable_cores():
    """The cores this process may run on (affinity mask), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _cpu_times():
    """(busy, total) jiffies of all CPUs from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def current_load(seconds=0.5):
    """The cores busy now: the CPUs' busy share over SECONDS (/proc/stat) times the CPUs, so that work
    that has just ended (the install before the quickstart) does not count, as it would in the
    one-minute load average; that average where /proc/stat is missing, else 0.0."""
    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
        if total1 > total0:
            return (busy1 - busy0) / (total1 - total0) * (os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def default_threads(cores, load):
    """Threads for a new job: the cores not already busy, at least 1.

    ``load`` is the number of cores busy with other work. A core counts as busy once more than a quarter of it is (the
    load rounded up after subtracting 0.25): a thread too many costs far more
    than a thread too few (two threads on a 2-core machine with one busy core
    trained several times slower than one thread), while a quarter of a core
    is background noise on an idle machine."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, not {cores}")
    busy = max(0, math.ceil(load - 0.25))
    return max(1, min(cores, cores - busy))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, help="usable cores (default: this process's affinity mask)")
    p.add_argument("--load", type=float, help="cores busy with other work (default: measured over half a second)")
    p.add_argument("--explain", action="store_true", help="also say on stderr how the number was chosen")
    args = p.parse_args(argv)
    cores = usable_cores() if args.cores is None else args.cores
    load = current_load() if args.load is None else args.load
    if cores < 1:
        p.error(f"--cores {cores}: give a whole number >= 1")
    threads = default_threads(cores, load)
    if args.explain:
        print(f"[threads] {threads} CPU thread(s): {cores} usable core(s), load {load:.2f} from other work "
              "(CPU_THREADS=N to choose)", file=sys.stderr)
    print(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
