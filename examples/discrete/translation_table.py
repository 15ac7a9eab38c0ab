#!/usr/bin/env python
"""The Table 6.2 and Table 6.4 forms (Kinley 2020) from a finished
table62.sh folder: per encoder, over seeds, mean +- standard error of BLEU,
chrF and the mean Kendall tau of the encoder self-attention and of the
cross-attention (with the mean within-run standard deviation of tau beside
each); then the CoNLL-2000 chunking probe per encoder and stream.

    python examples/discrete/translation_table.py OUT [--subset test] [--out OUT/table.md]

Reads OUT/runs/<arch>-seed<N>/{SUBSET.bleu.json, faithfulness.json} (a run
without both is not counted) and OUT/streams/probe.jsonl. Writes the tables
to --out (through a temporary file) and prints them.
"""

import argparse
import glob
import json
import os
import re
import sys

from fairseq_dnas.stats import mean_se_cell

ORDER = ("transformer", "transformer_dnas", "transformer_hnas", "transformer_discrete_single",
         "transformer_discrete", "transformer_two_stream")


def _rank(arch):
    return (ORDER.index(arch) if arch in ORDER else len(ORDER), arch)


def _cell(xs, digits):
    return mean_se_cell(xs, digits, "+-")  # one seed: the mean alone (a standard error needs two)


def runs(folder, subset):
    """{arch: [(bleu json, faithfulness summary) per seed]} of the finished runs."""
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "runs", "*-seed*"))):
        m = re.fullmatch(r"(.+)-seed(\d+)", os.path.basename(path))
        bleu, faith = os.path.join(path, f"{subset}.bleu.json"), os.path.join(path, "faithfulness.json")
        if not m or not (os.path.isfile(bleu) and os.path.isfile(faith)):
            continue
        lines = [json.loads(line) for line in open(faith) if line.startswith("{")]
        out.setdefault(m.group(1), []).append((json.load(open(bleu)), lines[-1]))
    return out


def translation_table(folder, subset):
    lines = ["| encoder | seeds | BLEU | chrF | tau, encoder self-attention | (std within run) "
             "| tau, cross-attention | (std within run) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    found = runs(folder, subset)
    for arch in sorted(found, key=_rank):
        seeds = found[arch]
        cells = [_cell([b["bleu"]["score"] for b, _ in seeds], 2), _cell([b["chrf"]["score"] for b, _ in seeds], 1)]
        for kind in ("encoder", "cross"):
            cells += [_cell([f[kind]["tau_mean"] for _, f in seeds], 3),
                      f"{sum(f[kind]['tau_std'] for _, f in seeds) / len(seeds):.3f}"]
        lines.append(f"| {arch} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def probe_table(folder):
    path = os.path.join(folder, "streams", "probe.jsonl")
    if not os.path.isfile(path):
        return []
    groups = {}
    for line in open(path):
        r = json.loads(line)
        arch = re.sub(r"-seed\d+$", "", r["model"])
        groups.setdefault((arch, r["stream"]), []).append(r)
    lines = ["| encoder | stream | seeds | accuracy | precision | recall | F1 |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for (arch, stream), rows in sorted(groups.items(), key=lambda kv: (kv[0][0] != "baseline", _rank(kv[0][0]),
                                                                       kv[0][1])):
        cells = [_cell([r[k] for r in rows], 2) for k in ("accuracy", "precision", "recall", "f1")]
        lines.append(f"| {arch} | {stream} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    from fairseq_dnas.analysis.files import atomic_path

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="table62.sh's OUT")
    p.add_argument("--subset", default="test")
    p.add_argument("--out", help="markdown file (default: print only)")
    args = p.parse_args(argv)
    if not os.path.isdir(os.path.join(args.folder, "runs")):
        print(f"[translation_table] error: {args.folder} has no runs/ folder (give table62.sh's OUT)", file=sys.stderr)
        return 1
    text = "\n".join(translation_table(args.folder, args.subset)) + "\n"
    probe = probe_table(args.folder)
    if probe:
        text += "\n" + "\n".join(probe) + "\n"
    if args.out:
        with atomic_path(args.out) as tmp:
            open(tmp, "w").write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
