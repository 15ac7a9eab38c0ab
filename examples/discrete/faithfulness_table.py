#!/usr/bin/env python
"""The Table 6.1 form (Kinley 2020) from finished classify.sh runs: per
dataset and encoder, over seeds, mean +- standard error of the test
accuracy (with the thesis's beside it and the gap to it) and of the mean
Kendall tau (both importance forms, and the gradient's form with the
attention detached, Jain & Wallace's code's, where the run has it), with
the mean within-run standard deviation of tau beside it, the seeds counted, the updates each seed took
(best dev checkpoint / updates run) and attention's share of the residual
stream (first / last layer); then a second table with that share per layer.

    python examples/discrete/faithfulness_table.py --out table.md sst=OUT/sst news20=OUT/news20
    python examples/discrete/faithfulness_table.py --row OUT/sst/roberta-seed1

Reads OUT/<dataset>/<arch>-seed<N>/summary-{grad,grad-x-input}.json (the
runs classify.sh wrote; a run without both files is not counted),
summary-grad-detached.json where there is one (faithfulness.py
--detach-attention, which table61.sh runs on every finished run; '-' where
no seed has it, 'k of n seeds' where some have) and row.json where there is
one (older runs: '-'). Writes the table to --out
(through a temporary file) and prints it.

--row RUN: the row of one finished run, from its summary files and its
checkpoints (checkpoint_last.pt: updates run and the training settings;
checkpoint_best.pt: the update of the best dev accuracy, which is the
checkpoint the summaries scored): RUN/row.json and RUN/row.md, printed.

The thesis's accuracies (Table 6.1: TRANSFORMER, DISC TRANSF) stand beside
roberta (the soft transformer) and roberta_discrete (the two-stream
discrete transformer), under the dataset names table61.sh uses (sst,
news20); the other encoders have none ('-').
"""

import argparse
import glob
import json
import os
import re
import sys

from fairseq_dnas.analysis.files import write_json, write_text
from fairseq_dnas.stats import mean_se_cell

FORMS = ("grad", "grad-x-input")
DETACHED = "grad-detached"  # summary-grad-detached.json: --importance grad --detach-attention
ORDER = ("roberta", "roberta_dnas", "roberta_hnas", "roberta_discrete_single", "roberta_discrete", "roberta_two_stream")
# Kinley (2020), Table 6.1: task accuracy (%) of TRANSFORMER and DISC TRANSF.
THESIS_ACCURACY = {("sst", "roberta"): 79.6, ("sst", "roberta_discrete"): 76.1,
                   ("news20", "roberta"): 88.2, ("news20", "roberta_discrete"): 89.3}
# The share keys of faithfulness.py's summary, and the stream each names.
SHARE_STREAMS = (("attention_share", "model"), ("controller_attention_share", "controller"))


# --- one run: row.json and row.md -------------------------------------------------


def training_record(run):
    """How the run trained, read from its checkpoints: updates run, the
    update and dev accuracy (%) of checkpoint_best.pt, why training stopped
    ('patience' before the cap, else 'max_update'), and the settings that
    decide it."""
    import torch

    def state(name):
        path = os.path.join(run, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such checkpoint (has classify.sh finished training?)")
        return torch.load(path, map_location="cpu", weights_only=False)

    last, best = state("checkpoint_last.pt"), state("checkpoint_best.pt")
    cfg = last["cfg"]
    updates = int(last["optimizer_history"][-1]["num_updates"])
    cap = int(cfg["optimization"]["max_update"])
    return {
        "updates_run": updates,
        "best_update": int(best["optimizer_history"][-1]["num_updates"]),
        "best_dev_accuracy": float(best["extra_state"]["val_loss"]),  # the criterion logs accuracy in %
        "stopped": "patience" if updates < cap else "max_update",
        "max_update": cap,
        "validate_interval": int(cfg["dataset"]["validate_interval_updates"]),
        "patience": int(cfg["checkpoint"]["patience"]),
        "lr_scheduler": cfg["lr_scheduler"]["_name"],
    }


def run_row(run):
    """row.json's content for a finished run folder <arch>-seed<N>."""
    m = re.fullmatch(r"(.+)-seed(\d+)", os.path.basename(os.path.normpath(run)))
    if not m:
        raise ValueError(f"{run}: not a run folder (<arch>-seed<N>)")
    s = {}
    for form in FORMS:
        path = os.path.join(run, f"summary-{form}.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such file (run faithfulness.py first)")
        with open(path) as f:
            s[form] = json.load(f)
    row = {"encoder": m.group(1), "seed": int(m.group(2)), "n": s["grad"]["n"], "accuracy": s["grad"]["accuracy"],
           "left_out": s["grad"]["left_out"]}
    for form in FORMS:
        row[f"tau_{form}"], row[f"tau_std_{form}"] = s[form]["tau_mean"], s[form]["tau_std"]
    for key, _ in SHARE_STREAMS:
        for k in (key, f"{key}_median"):
            if k in s["grad"]:
                row[k] = s["grad"][k]
    row.update(training_record(run))
    return row


def share_cell(shares, digits=3):
    """'first / last' of one run's per-layer shares."""
    return f"{shares[0]:.{digits}f} / {shares[-1]:.{digits}f}"


def row_markdown(row):
    head = ("| encoder | accuracy (%) | tau, gradient | tau, gradient x input | left out | best dev (%) "
            "| best dev update / updates run | attention share, first / last layer |")
    share = share_cell(row["attention_share"]) if "attention_share" in row else "-"
    if "controller_attention_share" in row:
        share += f" (controller {share_cell(row['controller_attention_share'])})"
    cells = [row["encoder"], f"{100 * row['accuracy']:.1f}"]
    cells += [f"{row[f'tau_{f}']:.3f} +- {row[f'tau_std_{f}']:.3f}" for f in FORMS]
    cells += [f"{row['left_out']} of {row['n']}", f"{row['best_dev_accuracy']:.1f}",
              f"{row['best_update']} / {row['updates_run']} ({row['stopped']})", share]
    return "\n".join([head, "|" + " --- |" * len(cells), "| " + " | ".join(cells) + " |"]) + "\n"


def write_row(run):
    row = run_row(run)
    write_json(os.path.join(run, "row.json"), row)
    text = row_markdown(row)
    write_text(os.path.join(run, "row.md"), text)  # last: table61.sh counts a run done by it
    return text


# --- the table ------------------------------------------------------------------


def collect(folder):
    """{arch: [ {form: summary, 'row': row.json or None} per seed ]} of the finished runs under folder."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*-seed*"))):
        m = re.fullmatch(r"(.+)-seed(\d+)", os.path.basename(path))
        files = {f: os.path.join(path, f"summary-{f}.json") for f in FORMS}
        if not m or not all(os.path.isfile(p) for p in files.values()):
            continue
        run = {f: json.load(open(p)) for f, p in files.items()}
        detached = os.path.join(path, f"summary-{DETACHED}.json")
        run[DETACHED] = json.load(open(detached)) if os.path.isfile(detached) else None
        row = os.path.join(path, "row.json")
        run["row"] = json.load(open(row)) if os.path.isfile(row) else None
        run["seed"] = int(m.group(2))
        runs.setdefault(m.group(1), []).append(run)
    return runs


def ordered(runs):
    return sorted(runs, key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a))


def updates_cell(seeds):
    """'best / run' per seed, in seed order; '-' for a run without row.json."""
    parts = [f"{s['row']['best_update']} / {s['row']['updates_run']}" if s["row"] else "-"
             for s in sorted(seeds, key=lambda s: s["seed"])]
    return ", ".join(parts)


def mean_per_layer(seeds, key):
    """The per-layer share averaged over the seeds that report it, or None."""
    lists = [s["grad"][key] for s in seeds if key in s["grad"]]
    if not lists or len({len(x) for x in lists}) != 1:
        return None
    return [sum(v) / len(v) for v in zip(*lists)]


def detached_cells(seeds):
    """[tau, std within run] of the detached form over the seeds that have
    it ('k of n seeds' added when some lack it), or ['-', '-']."""
    have = [s[DETACHED] for s in seeds if s[DETACHED] is not None]
    if not have:
        return ["-", "-"]
    tau = mean_se_cell([d["tau_mean"] for d in have], 3, "+-")
    if len(have) < len(seeds):
        tau += f" ({len(have)} of {len(seeds)} seeds)"
    return [tau, f"{sum(d['tau_std'] for d in have) / len(have):.3f}"]


def table(datasets):
    lines = ["| dataset | encoder | seeds | accuracy (%) | thesis (%) | gap | tau, gradient | (std within run) "
             "| tau, gradient x input | (std within run) | tau, gradient, attention detached | (std within run) "
             "| updates: best dev / run, per seed | attention share, first / last layer |",
             "|" + " --- |" * 14]
    layers = []  # (dataset, arch, stream, per-layer mean over seeds)
    for name, folder in datasets:
        runs = collect(folder)
        for arch in ordered(runs):
            seeds = runs[arch]
            accuracies = [100 * s["grad"]["accuracy"] for s in seeds]
            # one seed: the mean alone (a standard error needs two)
            acc = mean_se_cell(accuracies, 1, "+-")
            thesis = THESIS_ACCURACY.get((name, arch))
            gap = "-" if thesis is None else f"{sum(accuracies) / len(accuracies) - thesis:+.1f}"
            cells = [acc, "-" if thesis is None else f"{thesis:.1f}", gap]
            for form in FORMS:
                tau = mean_se_cell([s[form]["tau_mean"] for s in seeds], 3, "+-")
                std = sum(s[form]["tau_std"] for s in seeds) / len(seeds)
                cells += [tau, f"{std:.3f}"]
            cells += detached_cells(seeds)
            cells.append(updates_cell(seeds))
            share = "-"
            for key, stream in SHARE_STREAMS:
                per_layer = mean_per_layer(seeds, key)
                if per_layer is None:
                    continue
                layers.append((name, arch, stream, per_layer))
                share = share_cell(per_layer) if stream == "model" else f"{share} (controller {share_cell(per_layer)})"
            cells.append(share)
            lines.append(f"| {name} | {arch} | {len(seeds)} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if layers:
        depth = max(len(x) for *_, x in layers)
        text += ("\nAttention's share of the residual stream per layer, ||attention output|| / ||layer input|| "
                 "(mean over the test tokens, then over seeds; 'model': the stream the classifier reads, "
                 "the only one of a single-stream encoder):\n\n")
        text += "| dataset | encoder | stream | " + " | ".join(f"layer {i + 1}" for i in range(depth)) + " |\n"
        text += "|" + " --- |" * (3 + depth) + "\n"
        for name, arch, stream, per_layer in layers:
            cells = [f"{r:.3f}" for r in per_layer] + ["-"] * (depth - len(per_layer))
            text += f"| {name} | {arch} | {stream} | " + " | ".join(cells) + " |\n"
    return text


def fail(message):
    print(f"faithfulness_table.py: error: {message}", file=sys.stderr)
    return 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("datasets", nargs="*", metavar="NAME=FOLDER")
    p.add_argument("--out", help="the table (with NAME=FOLDER)")
    p.add_argument("--row", metavar="RUN", help="write RUN/row.json and RUN/row.md of one finished run")
    args = p.parse_args(argv)
    if args.row:
        if args.datasets or args.out:
            return fail("--row RUN takes no NAME=FOLDER and no --out")
        try:
            text = write_row(args.row)
        except (OSError, ValueError, KeyError) as err:
            return fail(f"--row {args.row}: {err}")
        print(text, end="")
        return 0
    if not args.datasets or not args.out:
        return fail("give --out TABLE.md and one NAME=FOLDER or more (or --row RUN)")
    datasets = []
    for item in args.datasets:
        name, _, folder = item.partition("=")
        if not folder or not os.path.isdir(folder):
            return fail(f"{item!r}: give NAME=FOLDER with an existing folder")
        datasets.append((name, folder))
    text = table(datasets)
    write_text(args.out, text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
