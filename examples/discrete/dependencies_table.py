#!/usr/bin/env python
"""The appendix's dependency experiment over seeds: one Markdown table from
the run folders of ``examples/discrete/dependencies.sh``.

    python examples/discrete/dependencies_table.py OUT [OUT ...] [--out table.md]

Each OUT holds ``result.json`` (``dependencies_eval.py``) and
``discrete/train.cmd`` (the training command the driver ran). Runs are
grouped by their training settings, read from that command: the penalty
coefficient, the update it starts at, the layers it reads, the number of
updates (the seed is what varies inside a group). A row per group and model
(the discrete model, and the soft one where the run trained it): seeds,
then precision, recall, precision without the sink (``dependencies_eval.py``'s
diagnostic; "-" for a result written before it), test perplexity and the
mean field size as mean +-
standard error over the seeds (``fairseq_dnas.stats.mean_se``; the mean
alone for one seed), the thesis's figures on a row of their own.
"""

import argparse
import json
import os
import shlex
import sys

from fairseq_dnas.errors import BadFile
from fairseq_dnas.stats import mean_se_cell

THESIS = {"precision": 0.959, "recall": 0.920}
SETTINGS = (("--receptive-field-penalty", "0.1"), ("--receptive-field-penalty-start", "0"),
            ("--receptive-field-layers", "final"), ("--max-update", None))
METRICS = ("precision", "recall", "precision_without_sink", "test_perplexity", "mean_field_size")


def read_settings(cmd_path: str):
    """(settings tuple, seed) from a fairseq-train command line; the
    criterion's defaults where a flag is absent (older runs had no
    --receptive-field-penalty-start)."""
    with open(cmd_path) as f:
        words = shlex.split(f.read())
    flags = {}
    for i, word in enumerate(words[:-1]):
        if word.startswith("--"):
            flags[word] = words[i + 1]
    settings = []
    for flag, default in SETTINGS:
        value = flags.get(flag, default)
        if value is None:
            raise BadFile(cmd_path, f"no {flag}")
        settings.append(value)
    if "--seed" not in flags:
        raise BadFile(cmd_path, "no --seed")
    return tuple(settings), int(flags["--seed"])


def collect(outs):
    """{(settings, model): [(seed, figures)]} over the run folders."""
    groups = {}
    for out in outs:
        result, cmd = os.path.join(out, "result.json"), os.path.join(out, "discrete", "train.cmd")
        for path in (result, cmd):
            if not os.path.isfile(path):
                raise BadFile(path, f"missing (is {out} a finished dependencies.sh OUT?)")
        with open(result) as f:
            r = json.load(f)
        settings, seed = read_settings(cmd)
        for model in ("discrete", "soft"):
            if model in r:
                runs = groups.setdefault((settings, model), [])
                if any(s == seed for s, _ in runs):
                    raise BadFile(out, f"seed {seed} twice with the same settings")
                runs.append((seed, r[model]))
    return groups


def cell(values, digits):
    """mean +- se (the mean alone for one seed); "-" where a run lacks the figure."""
    return "-" if None in values else mean_se_cell(values, digits, plus_minus="+-")


def table(groups) -> str:
    lines = ["| model | C | penalty from update | layers | updates | seeds | precision | recall "
             "| precision without the sink | test perplexity | mean field |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
             f"| thesis (discrete) | 0.1 | - | final | - | - | **{THESIS['precision']:.3f}** "
             f"| **{THESIS['recall']:.3f}** | - | - | - |"]
    for (settings, model), runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        penalty, start, layers, updates = settings
        seeds = ", ".join(str(s) for s, _ in sorted(runs, key=lambda r: r[0]))
        cells = [cell([fig.get(k) for _, fig in runs], 2 if k == "mean_field_size" else 3) for k in METRICS]
        lines.append(f"| {model} | {penalty} | {start} | {layers} | {updates} | {len(runs)} ({seeds}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outs", nargs="+", metavar="OUT", help="dependencies.sh run folders")
    p.add_argument("--out", help="write the table here too")
    args = p.parse_args(argv)
    try:
        text = table(collect(args.outs))
    except (BadFile, ValueError, KeyError) as err:
        print(f"dependencies_table.py: error: {err}", file=sys.stderr)
        return 1
    if args.out:
        with open(args.out + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.out + ".tmp", args.out)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
