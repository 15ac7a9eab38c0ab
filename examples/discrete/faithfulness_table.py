#!/usr/bin/env python
"""The Table 6.1 form (Kinley 2020) from finished classify.sh runs: per
dataset and encoder, over seeds, mean +- standard error of accuracy and of
the mean Kendall tau (both importance forms), with the mean within-run
standard deviation of tau beside it, and the seeds counted.

    python examples/discrete/faithfulness_table.py --out table.md sst=OUT/sst news20=OUT/news20

Reads OUT/<dataset>/<arch>-seed<N>/summary-{grad,grad-x-input}.json (the
runs classify.sh wrote); a run without both files is not counted. Writes the
table to --out (through a temporary file) and prints it.
"""

import argparse
import glob
import json
import os
import re
import sys

from fairseq_dnas.stats import mean_se_cell

FORMS = ("grad", "grad-x-input")
ORDER = ("roberta", "roberta_dnas", "roberta_hnas", "roberta_discrete_single", "roberta_discrete", "roberta_two_stream")


def collect(folder):
    """{arch: [ {form: summary} per seed ]} of the finished runs under folder."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-seed*"))):
        m = re.fullmatch(r"(.+)-seed(\d+)", os.path.basename(path))
        files = {f: os.path.join(path, f"summary-{f}.json") for f in FORMS}
        if not m or not all(os.path.isfile(p) for p in files.values()):
            continue
        runs.setdefault(m.group(1), []).append({f: json.load(open(p)) for f, p in files.items()})
    return runs


def table(datasets):
    lines = ["| dataset | encoder | seeds | accuracy (%) | tau, gradient | (std within run) | tau, gradient x input | (std within run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, folder in datasets:
        runs = collect(folder)
        for arch in sorted(runs, key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a)):
            seeds = runs[arch]
            # one seed: the mean alone (a standard error needs two)
            acc = mean_se_cell([100 * s["grad"]["accuracy"] for s in seeds], 1, "+-")
            cells = []
            for form in FORMS:
                tau = mean_se_cell([s[form]["tau_mean"] for s in seeds], 3, "+-")
                std = sum(s[form]["tau_std"] for s in seeds) / len(seeds)
                cells += [tau, f"{std:.3f}"]
            lines.append(f"| {name} | {arch} | {len(seeds)} | {acc} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("datasets", nargs="+", metavar="NAME=FOLDER")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    datasets = []
    for item in args.datasets:
        name, _, folder = item.partition("=")
        if not folder or not os.path.isdir(folder):
            print(f"faithfulness_table.py: error: {item!r}: give NAME=FOLDER with an existing folder", file=sys.stderr)
            return 1
        datasets.append((name, folder))
    text = table(datasets)
    with open(args.out + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.out + ".tmp", args.out)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
