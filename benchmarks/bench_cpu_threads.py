#!/usr/bin/env python
"""Training speed of the Gigaword quickstart's model on CPU by thread count,
on the machine as it is and with busy processes added: what
``CPU_THREADS`` (examples/common.sh, fairseq_dnas/recipes/cpu_threads.py)
should default to.

    python benchmarks/bench_cpu_threads.py --data WORK_DIR/data/bin --threads 1,2 --busy 0,2 --updates 60

--data is a binarized Gigaword folder (examples/gigaword/prepare.sh's
OUT_DIR/bin; the quickstart's is WORK_DIR/data/bin). Each case runs
examples/gigaword/train.sh as the quickstart does (tiny transformer_hnas,
64 headlines an update, no validation) for --updates updates
and reads fairseq's updates a second from its log (median over the logged
intervals after the first). --busy N starts N processes that spin on the CPU
while the case runs: a machine with other work. The one-minute load average
is recorded before and after each case, and the fraction of CPU time the
hypervisor gave to other machines (steal, /proc/stat) during it, since the
machine may have other work of its own: the figures are only as idle as
those say. Cases are taken
in --rounds rounds, each round every case once, so that a change of the
machine's load hits every case alike; the table gives each case's median.
"""

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from fairseq_dnas.recipes.cpu_threads import default_threads, usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

UPS = re.compile(r"\bups=([0-9.]+)")


def cpu_times():
    """(busy, steal, total) CPU seconds of the whole machine so far (/proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    idle = v[3] + v[4]
    steal = v[7] if len(v) > 7 else 0
    return (sum(v[:8]) - idle - steal) / tick, steal / tick, sum(v[:8]) / tick


def _spin():
    while True:
        pass


def run_case(data, threads, updates, work):
    """examples/gigaword/train.sh with the quickstart's settings; returns
    (median updates/s after the first log interval, wall seconds)."""
    save = os.path.join(work, f"t{threads}-{time.monotonic_ns()}")
    env = dict(os.environ, DATA=data, ARCH="transformer_hnas", SIZE="tiny", PRESET="fast", SEED="1", DEVICE="cpu",
               BATCH_SENTENCES="64", MAX_SENTENCES_PER_PROC="64", MAX_UPDATE=str(updates), LR="1e-3",
               WARMUP_UPDATES="100", EVAL_ROUGE="0", LOG_INTERVAL="10", SAVE_DIR=save,
               CPU_THREADS=str(threads), PROGRESS="0", PYTHON=sys.executable)
    env.pop("OMP_NUM_THREADS", None)
    t = time.perf_counter()
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "gigaword", "train.sh"),
                           "--disable-validation"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    log = os.path.join(save, "train.log")
    text = open(log).read() if os.path.exists(log) else ""
    if proc.returncode != 0:
        raise RuntimeError(f"train.sh failed ({proc.returncode}): {(proc.stderr or text)[-2000:]}")
    ups = [float(x) for x in UPS.findall(text)]
    if len(ups) < 2:
        raise RuntimeError(f"fewer than 2 logged intervals in {log}: give more --updates")
    return statistics.median(ups[1:]), wall


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="binarized Gigaword (prepare.sh's OUT_DIR/bin)")
    p.add_argument("--threads", default="1,2", help="CPU_THREADS values, comma-separated")
    p.add_argument("--busy", default="0,2", help="spinning processes added, comma-separated")
    p.add_argument("--updates", type=int, default=60, help="updates a case (logged every 10)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json", metavar="OUT", help="write the cases and the machine here")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.data, "dict.article.txt")):
        p.error(f"--data {args.data}: no binarized Gigaword there (run examples/gigaword/prepare.sh; use OUT_DIR/bin)")
    try:
        threads = [int(x) for x in args.threads.split(",")]
        busy = [int(x) for x in args.busy.split(",")]
    except ValueError:
        p.error("--threads and --busy take comma-separated whole numbers, e.g. 1,2")
    if min(threads) < 1 or min(busy) < 0 or args.updates < 20 or args.rounds < 1:
        p.error("--threads >= 1, --busy >= 0, --updates >= 20 and --rounds >= 1")

    cases = []
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.rounds):
            for b in busy:
                spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(b)]
                for s in spinners:
                    s.start()
                try:
                    if b:
                        time.sleep(5)  # let the load average see them
                    for t in threads:
                        before, times = os.getloadavg()[0], cpu_times()
                        ups, wall = run_case(args.data, t, args.updates, work)
                        after, times_after = os.getloadavg()[0], cpu_times()
                        # steal: time the hypervisor gave this machine's cores to others
                        steal = None if times is None else round(
                            (times_after[1] - times[1]) / max(1e-9, times_after[2] - times[2]), 3)
                        case = {"round": r + 1, "busy": b, "threads": t, "updates_per_s": ups, "wall_s": round(wall, 1),
                                "load_before": round(before, 2), "load_after": round(after, 2), "steal_fraction": steal,
                                "default_would_pick": default_threads(usable_cores(), before)}
                        cases.append(case)
                        print(json.dumps(case), flush=True)
                finally:
                    for s in spinners:
                        s.terminate()
                    for s in spinners:
                        s.join()

    print(f"\n| busy processes added | CPU_THREADS | updates/s (median of {args.rounds}) | load before / after |")
    print("| --- | --- | --- | --- |")
    for b in busy:
        for t in threads:
            mine = [c for c in cases if c["busy"] == b and c["threads"] == t]
            ups = statistics.median(c["updates_per_s"] for c in mine)
            loads = ", ".join(f"{c['load_before']} / {c['load_after']}" for c in mine)
            print(f"| {b} | {t} | {ups:.2f} | {loads} |")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"cores": usable_cores(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cases": cases}, f,
                      indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
