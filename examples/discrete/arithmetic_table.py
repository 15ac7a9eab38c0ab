#!/usr/bin/env python
"""The Table 6.5 form (Kinley 2020, Section 6.3) from finished table65.sh
runs: accuracy (%) on the test expressions, all depths and per depth, per
model and view, mean +- standard error over seeds, the thesis's rows beside.

    python examples/discrete/arithmetic_table.py OUT [--out OUT/table.md]

Reads OUT/data/test.{infix,prefix}.tsv (the gold values), OUT/data/test.depth
and OUT/<model>-seed<N>/predictions.json (arithmetic_eval.py); a run without
predictions is not counted. Writes the table to --out (through a temporary
file) and prints it. Bad input: one line, exit status 1.
"""

import argparse
import glob
import json
import os
import re
import sys

from fairseq_dnas.stats import mean_se

DEPTHS = (1, 2, 3)
MODELS = ("infix", "prefix", "multiview")
VIEWS = ("infix", "prefix")
# The thesis's Table 6.5 (accuracy %, all depths, depth 1, 2, 3); its "0.75"
# for the prefix model at depth 1 is read as 75.0: a share written as a
# fraction among percentages (0.75% would be far below chance, 20%).
THESIS = {
    ("prefix", "prefix"): ("TS TRANSFORMER prefix", 45.9, 75.0, 33.6, 29.2),
    ("infix", "infix"): ("TS TRANSFORMER infix", 66.0, 97.6, 63.7, 36.8),
    ("multiview", "prefix"): ("MULTIVIEW TS TRANSF prefix", 65.3, 97.9, 62.6, 35.5),
    ("multiview", "infix"): ("MULTIVIEW TS TRANSF infix", 68.3, 97.9, 66.9, 40.1),
}


class BadInput(Exception):
    pass


def accuracy_by_depth(predictions, gold, depths):
    """{"all": %, 1: %, 2: %, 3: %}: the share of predictions equal to gold,
    over all examples and over those of each depth (None for a depth with
    no example)."""
    if not len(predictions) == len(gold) == len(depths):
        raise BadInput(f"{len(predictions)} predictions, {len(gold)} gold values, {len(depths)} depths: "
                       "they must be parallel")
    if not gold:
        raise BadInput("no examples")
    out = {"all": 100.0 * sum(p == g for p, g in zip(predictions, gold)) / len(gold)}
    for d in DEPTHS:
        pairs = [(p, g) for p, g, k in zip(predictions, gold, depths) if k == d]
        out[d] = 100.0 * sum(p == g for p, g in pairs) / len(pairs) if pairs else None
    return out


def read_gold(path):
    """The label column of a 'sentence<TAB>label' file (header skipped)."""
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file (run table65.sh's data step)")
    lines = open(path).read().splitlines()
    if not lines or lines[0] != "sentence\tlabel":
        raise BadInput(f"{path}: not a 'sentence<TAB>label' file")
    return [line.split("\t")[1] for line in lines[1:]]


def majority_baseline(out, depths, gold):
    """accuracy_by_depth of always predicting the training set's most
    frequent value (0: x * 0 = 0 makes it about twice as frequent as the
    others), the floor that learning must clear (not chance, 20%)."""
    train = read_gold(os.path.join(out, "data", "train.infix.tsv"))
    top = max(sorted(set(train)), key=train.count)
    return accuracy_by_depth([top] * len(gold), gold, depths), top


def collect(out):
    """({(model, view): [accuracy_by_depth per seed]} of the finished runs,
    (majority baseline, its value))."""
    depths = [int(x) for x in open(os.path.join(out, "data", "test.depth")).read().split()] \
        if os.path.isfile(os.path.join(out, "data", "test.depth")) else None
    if depths is None:
        raise BadInput(f"{out}/data/test.depth: no such file (run table65.sh's data step)")
    gold = {v: read_gold(os.path.join(out, "data", f"test.{v}.tsv")) for v in VIEWS}
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, "*-seed*", "predictions.json"))):
        m = re.fullmatch(r"(\w+)-seed(\d+)", os.path.basename(os.path.dirname(path)))
        if not m or m.group(1) not in MODELS:
            continue
        views = json.load(open(path))["views"]
        for view, preds in views.items():
            if view not in gold:
                raise BadInput(f"{path}: unknown view {view!r} (choose from {', '.join(VIEWS)})")
            runs.setdefault((m.group(1), view), []).append(accuracy_by_depth(preds, gold[view], depths))
    return runs, majority_baseline(out, depths, gold["infix"])


def cell(values):
    if any(v is None for v in values):
        return "-"
    m, se = mean_se(values)
    return f"{m:.1f}" if se != se else f"{m:.1f} +- {se:.1f}"  # se is nan with one seed


def table(runs, baseline=None):
    lines = ["| model | view | seeds | all depths | depth 1 | depth 2 | depth 3 | thesis: all | depth 1 | depth 2 | depth 3 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in MODELS:
        for view in VIEWS:
            seeds = runs.get((model, view))
            if not seeds:
                continue
            ours = [cell([s[k] for s in seeds]) for k in ("all", *DEPTHS)]
            thesis = THESIS[(model, view)]
            name = "two-stream (one view)" if model != "multiview" else "multiview two-stream"
            lines.append(f"| {name} | {view} | {len(seeds)} | " + " | ".join(ours) + " | "
                         + " | ".join(f"{x:.1f}" for x in thesis[1:]) + " |")
    if len(lines) == 2:
        raise BadInput("no finished run (no <model>-seed<N>/predictions.json)")
    if baseline is not None:
        acc, top = baseline
        lines.append(f"| majority value ({top}) of training | - | - | "
                     + " | ".join(cell([acc[k]]) for k in ("all", *DEPTHS)) + " | - | - | - | - |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", help="table65.sh's OUT")
    p.add_argument("--out", help="the table file (default OUT/table.md)")
    args = p.parse_args(argv)
    try:
        if not os.path.isdir(args.out_dir):
            raise BadInput(f"{args.out_dir}: no such folder")
        text = table(*collect(args.out_dir))
    except BadInput as err:
        print(f"arithmetic_table.py: error: {err}", file=sys.stderr)
        return 1
    path = args.out or os.path.join(args.out_dir, "table.md")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
