#!/usr/bin/env python
"""Build the paper's Table 3 form from rouge_eval.py JSON results: mean +-
standard error over runs of ROUGE-1/2/L F1, one row per system.

    python -m fairseq_dnas.commands.seed_table results/*/seed*.rouge.json
    python -m fairseq_dnas.commands.seed_table --order transformer,transformer_dnas,transformer_hnas results/*/*.json

Runs are grouped by the JSON's ``label`` (``rouge_eval.py --label``), else by
the name of the folder holding the file. Standard error = sample standard
deviation (ddof 1) / sqrt(runs), as the paper reports over 5 runs. A system
with a single run shows its bootstrap 95% interval over test sentences
instead (it says nothing about seed-to-seed variation).

Every file must be a rouge_eval.py result of the same test set (sentence
count, reference file names, multi-reference and truncation settings): a file
that is not, or that scored another test set, is named and nothing is
printed (exit status 1).
"""

import argparse
import json
import os
import sys
from collections import Counter, OrderedDict

from fairseq_dnas.stats import mean_se_cell

TYPES = (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L"))
NAMES = {
    "transformer": "UNAS encoder (baseline)",
    "transformer_dnas": "DNAS encoder",
    "transformer_hnas": "HNAS encoder",
}


class ResultError(ValueError):
    """A results file that cannot go into the table; str() names it."""


def read_json(path):
    """The JSON object in path; ResultError naming the file if it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise ResultError(f"{path}: cannot read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ResultError(f"{path}: not valid JSON, truncated or corrupt ({err})") from None


def _read(path):
    result = read_json(path)
    try:
        if not isinstance(result["sentences"], int) or result["sentences"] < 1:
            raise TypeError("sentences")
        for variant in ("stemmed", "unstemmed"):
            for rouge_type, _ in TYPES:
                f = result[variant][rouge_type]["fmeasure"]
                if not all(isinstance(f[k], (int, float)) for k in ("mean", "low", "high")):
                    raise TypeError(f"{variant}.{rouge_type}")
    except (KeyError, TypeError) as err:
        raise ResultError(f"{path}: not a rouge_eval.py result (no usable {err} entry)") from None
    return result


def _setting(result):
    """What must be equal for results to share a table: the same test set, scored alike."""
    refs = result.get("ref") or []
    return (result["sentences"], tuple(os.path.basename(r) for r in refs), result.get("references"),
            result.get("multi_ref"), result.get("max_bytes"))


def _describe(setting):
    sentences, refs, *_ = setting
    return f"{sentences} sentences" + (f" against {', '.join(refs)}" if refs else "")


def load(paths, read=None):
    """label -> results. ResultError (naming the file) for a file that is not
    a rouge_eval.py result (or what ``read`` accepts: bleu_table.py's BLEU
    results), or that scored another test set than the others (another run's
    results mixed in)."""
    results = [(path, (read or _read)(path)) for path in paths]
    settings = Counter(_setting(r) for _, r in results)
    common = settings.most_common(1)[0][0]
    for path, result in results:
        if _setting(result) != common:
            raise ResultError(
                f"{path}: scored {_describe(_setting(result))} (or with other settings), the other "
                f"results {_describe(common)}; a result of another run or test set")
    groups = OrderedDict()
    for path, result in results:
        label = result.get("label") or os.path.basename(os.path.dirname(os.path.abspath(path)))
        groups.setdefault(label, []).append(result)
    return groups


def cell(results, rouge_type, variant):
    values = [r[variant][rouge_type]["fmeasure"]["mean"] for r in results]
    f = results[0][variant][rouge_type]["fmeasure"]
    return mean_se_cell(values, interval=(f["low"], f["high"]))


def table(groups, variant, order=()):
    labels = [l for l in order if l in groups] + [l for l in groups if l not in order]
    sizes = {r["sentences"] for rs in groups.values() for r in rs}
    lines = [
        f"ROUGE F1 (%), {variant}, {'/'.join(map(str, sorted(sizes)))} test sentences; "
        "mean ± standard error over runs ([bootstrap 95% interval] for a single run)",
        "",
        "| system | runs | " + " | ".join(name for _, name in TYPES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in TYPES) + " |",
    ]
    for label in labels:
        results = groups[label]
        cells = [cell(results, t, variant) for t, _ in TYPES]
        lines.append(f"| {NAMES.get(label, label)} | {len(results)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="rouge_eval.py --json outputs")
    p.add_argument("--variant", choices=("stemmed", "unstemmed"), default="stemmed")
    p.add_argument("--order", default="", help="comma-separated labels to list first")
    args = p.parse_args(argv)
    try:
        groups = load(args.results)
    except ResultError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(table(groups, args.variant, [o for o in args.order.split(",") if o]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
