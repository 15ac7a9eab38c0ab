#!/usr/bin/env python
"""Markdown table of examples/hf/run_experiment.sh's JSON results: per run and per scheme."""

import glob
import json
import os
import statistics
import sys


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "examples/hf/results"
    runs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(folder, "*.json")))]
    if not runs:
        sys.exit(f"error: no results in {folder}: run examples/hf/run_experiment.sh first")
    print("| scheme | seed | test accuracy [95% bootstrap] | ms/step | u per layer (mean over heads) |")
    print("|---|---|---|---|---|")
    order = {"unas": 0, "dnas": 1, "hnas": 2}
    for r in sorted(runs, key=lambda r: (order[r["scheme"]], r["seed"])):
        u = ", ".join(f"{sum(x) / len(x):.3f}" for x in r["u"]) if r.get("u") else "-"
        print(f"| {r['scheme']} | {r['seed']} | {r['accuracy']:.4f} [{r['ci95'][0]:.4f}, {r['ci95'][1]:.4f}] "
              f"| {r['seconds_per_step'] * 1000:.0f} | {u} |")
    print()
    print("| scheme | runs | mean accuracy | min-max | median ms/step |")
    print("|---|---|---|---|---|")
    for scheme in sorted({r["scheme"] for r in runs}, key=order.get):
        rs = [r for r in runs if r["scheme"] == scheme]
        acc = [r["accuracy"] for r in rs]
        print(f"| {scheme} | {len(rs)} | {statistics.mean(acc):.4f} | {min(acc):.4f}-{max(acc):.4f} "
              f"| {statistics.median(r['seconds_per_step'] for r in rs) * 1000:.0f} |")


if __name__ == "__main__":
    main()
