#!/usr/bin/env python
"""Plot the learned HNAS weights u per encoder layer (the paper's Figures 3-5,
and Figure 4 for a pretrained masked-LM encoder).

HNAS attention is pi = u * pi_DNAS + (1 - u) * pi_UNAS (Eq. 12), with one
trainable u per encoder layer and head. This draws, for each checkpoint, the
mean of u over the heads of every layer (a line) with the spread over heads
(a band from min to max, a dot per head), and prints the numbers. Give several
checkpoints of one run (checkpoint1.pt, checkpoint2.pt, ...) to see u move
during training, or the checkpoints of several models to compare them.

Works on transformer_hnas (translation, summarization) and roberta_hnas
(masked_lm pretraining or sentence_prediction fine-tuning) checkpoints. Only
the checkpoint files are read (no data folder needed).

Examples:
    python -m fairseq_dnas.commands.plot_hybrid_weights $(ls -v checkpoints/hnas/checkpoint[0-9]*.pt) \\
        --out hybrid_weights.png --csv hybrid_weights.csv
    python -m fairseq_dnas.commands.plot_hybrid_weights checkpoints/masked_lm/roberta_hnas-small-seed1/checkpoint_last.pt \\
        --labels "HNAS encoder after pretraining" --out figure4.png --csv figure4.csv

Exit status: 0 on success; 1 when a checkpoint is missing, unreadable
(truncated, corrupt) or has no hybrid weights (e.g. a plain transformer or
roberta, or a DNAS model), with one line naming it; 2 for bad arguments.
"""

import argparse
import sys

from fairseq_dnas.analysis.files import write_csv
from fairseq_dnas.analysis.hybrid import NoHybridWeights
from fairseq_dnas.errors import BadFile
from fairseq_dnas.loading import read_hybrid_weights


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                        help="fairseq checkpoint files of HNAS models (transformer_hnas or roberta_hnas)")
    parser.add_argument("--out", required=True, metavar="FILE.png", help="picture to write")
    parser.add_argument("--labels", nargs="+", metavar="LABEL",
                        help="legend label per checkpoint (default: folder/file (update N))")
    parser.add_argument("--csv", metavar="FILE.csv", help="also write every u (checkpoint, layer, head) as CSV")
    args = parser.parse_args(argv)
    if args.labels and len(args.labels) != len(args.checkpoints):
        parser.error(f"--labels needs one label per checkpoint ({len(args.checkpoints)}), got {len(args.labels)}")
    return args


def format_table(weights, labels) -> str:
    """Rows: encoder layers; columns: checkpoints; cells: mean [min, max] over heads."""
    width = max(22, *(len(label) for label in labels))
    lines = ["HNAS weight u of DNAS per encoder layer: mean over heads [min, max]"]
    lines.append("layer  " + "  ".join(label.ljust(width) for label in labels))
    for layer in range(max(len(w.layers) for w in weights)):
        cells = []
        for w in weights:
            if layer < len(w.layers):
                heads = w.layers[layer]
                cells.append(f"{sum(heads) / len(heads):.4f} [{min(heads):.4f}, {max(heads):.4f}]".ljust(width))
            else:
                cells.append("-".ljust(width))
        lines.append(f"{layer + 1:>5}  " + "  ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    weights = []
    for path in args.checkpoints:
        try:
            weights.append(read_hybrid_weights(path))
        except (FileNotFoundError, NoHybridWeights, BadFile) as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    labels = args.labels or [w.label() for w in weights]
    print(format_table(weights, labels))
    from fairseq_dnas.analysis.plots import plot_hybrid_weights  # matplotlib only when drawing

    plot_hybrid_weights(weights, labels, args.out)
    print(f"wrote {args.out}")
    if args.csv:
        rows = [
            {"label": label, "checkpoint": w.path, "num_updates": w.num_updates, "layer": layer + 1,
             "head": head + 1, "u": round(u, 6)}
            for w, label in zip(weights, labels)
            for layer, heads in enumerate(w.layers)
            for head, u in enumerate(heads)
        ]
        write_csv(args.csv, rows, ["label", "checkpoint", "num_updates", "layer", "head", "u"])
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
