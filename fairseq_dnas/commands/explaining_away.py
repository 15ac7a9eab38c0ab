#!/usr/bin/env python
"""Measure "explaining away" in trained models (the paper's Figure 1,
Definition 1 and Theorem 2).

For every attention module, every sentence of a binarized split and every
head, this sums the attention each real key j receives from the real
queries i, sum_i pi_ij (padding excluded), and reports per layer:

- the fraction of keys that are epsilon-"explained away" (sum < 1e-8,
  Definition 1): their information reaches no query;
- the minimum of T * sum_i pi_ij, T the number of real keys (= queries in
  self-attention). Theorem 2: DNAS gives at least 1 (at least u for HNAS);
  UNAS has no bound;
- histograms of log_e(sum_i pi_ij), several checkpoints overlaid (e.g. a
  UNAS and a DNAS model): encoder_self.png, decoder_cross.png,
  decoder_self.png.

Translation checkpoints (transformer, transformer_dnas, transformer_hnas)
run in eval mode with teacher forcing (the reference target feeds the
decoder). Encoder self-attention uses the model's scheme; an HNAS layer is
reported as the mixture it uses (component 'mixture', with its u per head)
and as its DNAS and UNAS parts. The decoder is always UNAS: its
cross-attention (target queries over source keys) shows which source tokens
the decoder ignores; its self-attention is causal, so the last positions can
only be attended by few queries and small sums there are partly the mask.

RoBERTa checkpoints (roberta, roberta_dnas, roberta_hnas; --task masked_lm or
sentence_prediction) have encoder self-attention only. Each line of the split
is fed as "<s> sentence </s>", what RoBERTa reads (a sentence_prediction
model: its --init-token first), without masking (the model's own features;
no LM or classification head runs); a sentence longer than the model's
maximum positions (counting <s> and </s>) is skipped, not truncated, and the
count is printed and kept in summary.json. --data is the masked-LM data
folder (fairseq-preprocess --only-source: dict.txt, valid.bin/.idx) or a
sentence_prediction folder (its input0/ sentences are read; of a sentence
pair only the first). A sentence_prediction checkpoint needs its own
fine-tuning folder (input0/, label/).

Examples:
    python -m fairseq_dnas.commands.explaining_away --path unas/checkpoint_best.pt dnas/checkpoint_best.pt \\
        --data data-bin/gigaword --subset valid --out analysis/explaining_away
    python -m fairseq_dnas.commands.explaining_away --labels UNAS DNAS HNAS --path \\
        checkpoints/masked_lm/{roberta,roberta_dnas,roberta_hnas}-small-seed1/checkpoint_last.pt \\
        --data data/masked_lm/bin/pretrain --subset valid --out analysis/explaining_away_mlm

Writes into --out: summary.csv, summary.json, histograms.csv and the PNGs.
Exit status: 0 on success; 1 for a missing checkpoint, data folder or split,
an empty split, a truncated or corrupt checkpoint or data file, a checkpoint
that does not fit the data, or data of the wrong kind (translation data for a
RoBERTa checkpoint or the reverse), with one line saying what to give; 2 for
bad arguments. Nothing is written unless every checkpoint was analysed.
"""

import argparse
import os
import sys
import time

from fairseq_dnas.analysis.column_sums import BIN_WIDTH, EDGES, EPSILON
from fairseq_dnas.analysis.explaining_away import (
    EncoderInputs,
    SplitError,
    load_split,
    run_split,
    summary_rows,
)
from fairseq_dnas.errors import BadFile

SUMMARY_FIELDS = [
    "model", "checkpoint", "attention", "layer", "scheme", "component", "hybrid_u_mean",
    "hybrid_u_per_head", "keys", "explained_away", "fraction_explained_away", "zero_sums",
    "min_T_times_sum", "min_log_sum", "median_log_sum", "max_log_sum",
]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", nargs="+", action="extend", required=True, metavar="CHECKPOINT",
                        help="checkpoint(s) to compare (repeat or list several)")
    parser.add_argument("--data", required=True, metavar="DATA-BIN",
                        help="fairseq-preprocess output folder: the translation data of translation checkpoints; "
                             "for RoBERTa checkpoints the --only-source folder (dict.txt) or a "
                             "sentence_prediction folder (input0/)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the pictures and tables")
    parser.add_argument("--subset", default="valid", help="split to analyse (default: valid)")
    parser.add_argument("--labels", nargs="+", metavar="LABEL", help="one legend label per checkpoint")
    parser.add_argument("--max-sentences", type=int, metavar="N",
                        help="analyse only the first N sentences of the split (by id)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="B", help="sentences per forward pass")
    parser.add_argument("--epsilon", type=float, default=EPSILON, help="explained-away threshold (paper: 1e-8)")
    parser.add_argument("--no-decoder", action="store_true",
                        help="encoder self-attention only (RoBERTa models have nothing else)")
    parser.add_argument("--cpu", action="store_true", help="run on CPU even when CUDA is available")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.path):
        parser.error(f"--labels needs one label per checkpoint ({len(args.path)}), got {len(args.labels)}")
    if args.max_sentences is not None and args.max_sentences < 1:
        parser.error("--max-sentences must be at least 1")
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1")
    if not 0 < args.epsilon < 1:
        parser.error("--epsilon must lie in (0, 1)")
    return args


class Progress:
    """'analysed k/N sentences' on stderr, about every 10 %."""

    def __init__(self, label):
        self.label, self.next, self.start = label, 0.0, time.time()

    def __call__(self, done, total):
        if done / total >= self.next or done == total:
            print(f"  {self.label}: {done}/{total} sentences ({time.time() - self.start:.0f} s)",
                  file=sys.stderr, flush=True)
            self.next = done / total + 0.1


def default_label(path, scheme):
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return f"{scheme.upper()} ({folder})"


def format_table(rows) -> str:
    head = f"{'model':<26} {'attention':<13} {'layer':>5} {'component':<9} {'keys':>9} {'% < eps':>8} {'min T*sum':>10} {'median log':>10}  u"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['model'][:26]:<26} {r['attention']:<13} {r['layer'] + 1:>5} {r['component']:<9} "
            f"{r['keys']:>9} {100 * r['fraction_explained_away']:>8.3f} {r['min_T_times_sum']:>10.4g} "
            f"{r['median_log_sum']:>10.2f}  {r['hybrid_u_mean']}"
        )
    return "\n".join(lines)


def histogram_rows(label, rec):
    rows = []
    for (kind, layer, comp), st in rec.stats.items():
        counts = st.pooled_counts()
        if st.zeros.sum():
            rows.append({"model": label, "attention": kind, "layer": layer + 1, "component": comp,
                         "log_sum_from": "-inf", "log_sum_to": "-inf", "count": int(st.zeros.sum())})
        for b in counts.nonzero()[0]:
            rows.append({"model": label, "attention": kind, "layer": layer + 1, "component": comp,
                         "log_sum_from": round(float(EDGES[b]), 4), "log_sum_to": round(float(EDGES[b]) + BIN_WIDTH, 4),
                         "count": int(counts[b])})
    return rows


def input_description(dataset, max_positions) -> str:
    """What an encoder-only model reads (empty for translation data)."""
    if not isinstance(dataset, EncoderInputs):
        return ""
    folder = os.path.normpath(dataset.folder)
    pairs = os.path.basename(folder) == "input0" and os.path.isdir(os.path.join(os.path.dirname(folder), "input1"))
    return (f"inputs: '{dataset.shape}' per line of {dataset.folder}, unmasked; sentences longer than "
            f"{max_positions} tokens (counted as fed) are skipped, not truncated"
            + ("; sentence pairs: only the first sentences (input0), not input1" if pairs else ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from fairseq_dnas.analysis.checkpoints import DataMismatch, encoder_scheme
    from fairseq_dnas.loading import load_model

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    results = []  # (label, scheme, recorder, info)
    for i, path in enumerate(args.path):
        try:
            model, _, task = load_model(path, args.data, device)
            dataset = load_split(task, args.subset, args.data)
        except (FileNotFoundError, SplitError, BadFile, DataMismatch) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        scheme = encoder_scheme(model)
        label = args.labels[i] if args.labels else default_label(path, scheme)
        print(f"{label}: {path}, encoder {scheme.upper()}, split '{args.subset}' ({len(dataset)} sentences)",
              file=sys.stderr)
        inputs = input_description(dataset, model.max_positions())
        if inputs:
            print(f"  {inputs}", file=sys.stderr)
        try:
            rec, n_done, n_skipped = run_split(
                model, dataset, batch_size=args.batch_size, max_sentences=args.max_sentences,
                decoder=not args.no_decoder, epsilon=args.epsilon, progress=Progress(label),
            )
        except SplitError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        if n_skipped:
            print(f"  skipped {n_skipped} sentences longer than the model's maximum positions", file=sys.stderr)
        info = {"label": label, "checkpoint": path, "scheme": scheme, "sentences": n_done,
                "skipped_too_long": n_skipped}
        if inputs:
            info["inputs"] = inputs
        results.append((label, scheme, rec, info))

    rows = [row for label, _, rec, info in results for row in summary_rows(label, info["checkpoint"], rec)]
    print(format_table(rows))

    from fairseq_dnas.analysis.files import write_csv, write_json
    from fairseq_dnas.analysis.plots import plot_column_sums

    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "summary.csv"), rows, SUMMARY_FIELDS)
    hist = [row for label, _, rec, _ in results for row in histogram_rows(label, rec)]
    write_csv(os.path.join(args.out, "histograms.csv"), hist,
              ["model", "attention", "layer", "component", "log_sum_from", "log_sum_to", "count"])
    write_json(os.path.join(args.out, "summary.json"), {
        "data": args.data, "subset": args.subset, "epsilon": args.epsilon,
        "models": [info for *_, info in results], "rows": rows,
    })
    models = [(label, scheme, rec) for label, scheme, rec, _ in results]
    for kind in ("encoder_self", "decoder_cross", "decoder_self"):
        path = os.path.join(args.out, f"{kind}.png")
        if plot_column_sums(models, kind, path, args.epsilon):
            print(f"wrote {path}")
    print(f"wrote {args.out}/summary.csv, summary.json, histograms.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
