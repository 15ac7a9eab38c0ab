#!/usr/bin/env python
"""Translation results table from bleu_eval.py JSON files: BLEU and chrF per
system and test set, mean +- standard error over seeds.

    python -m fairseq_dnas.commands.bleu_table --order transformer,transformer_dnas,transformer_hnas \
        results/translation/*/seed*.test2016.bleu.json results/translation/*/seed*.test2017.bleu.json

Runs are grouped by the JSON's ``label`` (the system) and by the test set,
taken from the file name (``...<name>.bleu.json``: the part before
``.bleu.json`` after the last dot). Standard error = sample standard
deviation (ddof 1) / sqrt(runs); a single run shows its bootstrap 95%
interval over sentences instead (which says nothing about seeds). The
``spread`` column is max - min over seeds, to set differences between
systems against.
"""

import argparse
import os
import sys
from collections import OrderedDict

from fairseq_dnas.commands.seed_table import NAMES, ResultError, load, read_json
from fairseq_dnas.stats import mean_se_cell


def _test_set(path):
    name = os.path.basename(path)
    return name[: -len(".bleu.json")].rsplit(".", 1)[-1] if name.endswith(".bleu.json") else "?"


def _read(path):
    """A bleu_eval.py result (seed_table.load's checks of the test set apply too)."""
    result = read_json(path)
    try:
        for metric in ("bleu", "chrf"):
            if not isinstance(result[metric]["score"], (int, float)):
                raise TypeError(metric)
        if not isinstance(result["sentences"], int):
            raise TypeError("sentences")
    except (KeyError, TypeError) as err:
        raise ResultError(f"{path}: not a bleu_eval.py result (no usable {err} entry)") from None
    return result


def cell(results, metric):
    values = [r[metric]["score"] for r in results]
    r = results[0][metric]
    spread = f"{max(values) - min(values):.2f}" if len(values) > 1 else ""
    return mean_se_cell(values, interval=(r["low"], r["high"])), spread


def table(paths, order=()):
    by_set = OrderedDict()
    for path in paths:
        by_set.setdefault(_test_set(path), []).append(path)
    lines = ["| test set | system | seeds | BLEU | BLEU spread | chrF | chrF spread |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for test_set, files in by_set.items():
        groups = load(files, _read)
        for label in [l for l in order if l in groups] + [l for l in groups if l not in order]:
            runs = groups[label]
            (bleu, bleu_spread), (chrf, chrf_spread) = cell(runs, "bleu"), cell(runs, "chrf")
            lines.append(f"| {test_set} | {NAMES.get(label, label)} | {len(runs)} | {bleu} | {bleu_spread} "
                         f"| {chrf} | {chrf_spread} |")
    first = load(paths[:1], _read).popitem()[1][0]
    lines += ["", f"sacreBLEU signatures: BLEU `{first['bleu']['signature']}`, chrF `{first['chrf']['signature']}`"]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="bleu_eval.py --json-out files")
    p.add_argument("--order", default="transformer,transformer_dnas,transformer_hnas",
                   help="comma-separated labels, listed first in this order")
    args = p.parse_args(argv)
    try:
        print(table(args.results, args.order.split(",")))
    except (OSError, ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
