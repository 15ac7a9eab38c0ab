#!/usr/bin/env python
"""Is attention an explanation, in translation? Kendall's tau between the
attention each source token receives and its gradient importance, per test
sentence, for a translation checkpoint (--task translation: transformer,
transformer_dnas/hnas, transformer_discrete_single, transformer_discrete,
transformer_two_stream). The translation form of the thesis's metric
(J. Kinley, 2020, Table 6.2; Jain & Wallace, 2019), defined in
fairseq_dnas/analysis/faithfulness.py (``explain_translation_batch``) and
docs/analysis.md:

- the model translates each source sentence itself (beam search, --beam);
- y_hat = the teacher-forced log-probability of that hypothesis;
- importance of source token j: || d y_hat / d h0_j || (or gradient x input),
  h0_j the input of the encoder's first layer at j (thesis Section 5.4);
  with --detach-attention every attention probability of the model (encoder
  self-attention, decoder self- and cross-attention) is a constant for that
  gradient (Jain & Wallace's code);
- two attentions, reported apart: the encoder self-attention each source
  token receives (all encoder layers, heads, real queries) and the decoder
  cross-attention it receives (all decoder layers, heads, target positions).

    translation_faithfulness.py CHECKPOINT [CHECKPOINT ...] --data BIN
            [--subset test] [--beam 5] [--batch 32] [--max-examples N]
            [--importance grad|grad-x-input] [--detach-attention] [--attention model|controller]
            [--json FILE [FILE ...]] [--plot FIGURE.png] [--labels NAME ...]

Prints per model and attention the tau mean +- standard deviation and the
count left out (tau undefined: fewer than 2 real source tokens, or a constant
vector), and one JSON line per model (stdout); --json writes one line per
sentence (one file per checkpoint): index (the sentence's line in the test
set), tokens (source ids, </s> included, padding left out), hypothesis (ids),
logprob, attention_encoder, attention_cross, importance (lists over the real
source tokens, in order), tau_encoder, tau_cross. Bad input stops with one
line and exit status 1, and no --json file is written.
"""

import argparse
import json
import os
import sys
import time

from fairseq_dnas.commands.faithfulness import add_metric_options, check_counts, finish, metric_name
from fairseq_dnas.commands.sentence_classify import BadInput, exit_status

ATTENTIONS = ("encoder", "cross")


def load(checkpoint, data):
    from fairseq_dnas.analysis.checkpoints import DataMismatch
    from fairseq_dnas.loading import load_model
    from fairseq_dnas.errors import BadFile

    try:
        model, _, task = load_model(checkpoint, data)
    except (FileNotFoundError, DataMismatch, BadFile) as err:
        raise BadInput(str(err)) from None
    if getattr(model, "decoder", None) is None or not hasattr(task, "source_dictionary") \
            or getattr(task.cfg, "source_lang", None) is None:
        raise BadInput(f"{checkpoint}: not a translation checkpoint (use fairseq_dnas/commands/faithfulness.py "
                       "for sentence classifiers)")
    return model, task


def batches(task, subset, batch, max_examples):
    """fairseq's batches of the binarized ``subset`` (source left-padded, as
    the task collates them), the first ``max_examples`` sentences if > 0."""
    try:
        task.load_dataset(subset)
    except FileNotFoundError as err:
        raise BadInput(f"{err} (give the fairseq-preprocess folder and a subset it holds: "
                       f"test, test1, valid)") from None
    dataset = task.dataset(subset)
    indices = range(len(dataset)) if not max_examples else range(min(max_examples, len(dataset)))
    for start in range(0, len(indices), batch):
        yield dataset.collater([dataset[i] for i in indices[start:start + batch]])


def measure(checkpoint, args):
    """(summary dict, per-sentence rows) of one checkpoint."""
    import torch
    from fairseq.data import data_utils

    from fairseq_dnas.analysis import faithfulness as F

    model, task = load(checkpoint, args.data)
    generator = task.build_generator([model], argparse.Namespace(beam=args.beam, max_len_a=1.2, max_len_b=10))
    pad, eos = task.target_dictionary.pad(), task.target_dictionary.eos()
    rows, t0 = [], time.time()
    for sample in batches(task, args.subset, args.batch, args.max_examples):
        net = sample["net_input"]
        with torch.no_grad():
            hypos = task.inference_step(generator, [model], sample)
        hyps = [h[0]["tokens"] for h in hypos]
        target = data_utils.collate_tokens(hyps, pad, eos, left_pad=False)
        prev = data_utils.collate_tokens(hyps, pad, eos, left_pad=False, move_eos_to_beginning=True)
        try:
            r = F.explain_translation_batch(model, net["src_tokens"], net["src_lengths"], prev, target,
                                           args.attention, detach_attention=args.detach_attention)
        except ValueError as err:  # an --attention stream the model does not report
            raise BadInput(f"{checkpoint}: {err}") from None
        for b, index in enumerate(sample["id"].tolist()):
            real = r["real"][b]
            g = r["importance"][args.importance][b][real].tolist()
            row = {"index": index, "tokens": net["src_tokens"][b][net["src_tokens"][b].ne(pad)].tolist(),
                   "hypothesis": hyps[b].tolist(), "logprob": float(r["logprob"][b])}
            for kind in ATTENTIONS:
                row[f"attention_{kind}"] = r["attention"][kind][b][real].tolist()
            row["importance"] = g
            for kind in ATTENTIONS:
                row[f"tau_{kind}"] = F.kendall_tau(row[f"attention_{kind}"], g)
            rows.append(row)
        print(f"[translation_faithfulness] {len(rows)} sentences", file=sys.stderr, flush=True)
    if not rows:
        raise BadInput(f"{args.data}: subset {args.subset} is empty")
    rows.sort(key=lambda r: r["index"])
    summary = {"checkpoint": checkpoint, "subset": args.subset, "beam": args.beam,
               "attention_stream": args.attention, "importance": args.importance,
               "detach_attention": args.detach_attention,
               "mean_logprob": sum(r["logprob"] for r in rows) / len(rows),
               "seconds": round(time.time() - t0, 2), "threads": torch.get_num_threads()}
    for kind in ATTENTIONS:
        summary[kind] = F.tau_summary([r[f"tau_{kind}"] for r in rows])
    return summary, rows


def report(label, s):
    for kind in ATTENTIONS:
        t = s[kind]
        print(f"{label}: {kind} attention: {t['n']} sentences, Kendall tau {t['tau_mean']:.3f} +- "
              f"{t['tau_std']:.3f} (std), {t['left_out']} left out (tau undefined)", file=sys.stderr)
    print(json.dumps({"label": label, **s}))


def run(args):
    check_counts(args, args.checkpoints)
    for path in args.checkpoints:
        if not os.path.isfile(path):
            raise BadInput(f"{path}: no such file")
    if not os.path.isdir(args.data):
        raise BadInput(f"--data {args.data}: no such folder (give the fairseq-preprocess folder)")
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(c))) for c in args.checkpoints]
    series, per_model = [], []
    for label, path in zip(labels, args.checkpoints):
        summary, rows = measure(path, args)
        report(label, summary)
        per_model.append(rows)
        for kind in ATTENTIONS:
            series.append((f"{label} ({kind})", None, [r[f"tau_{kind}"] for r in rows if r[f"tau_{kind}"] is not None]))
    finish(args, per_model, series, f" (translation, {metric_name(args)})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", help="translation checkpoints")
    p.add_argument("--data", required=True, help="the fairseq-preprocess folder (dict.<lang>.txt, <subset>.*)")
    p.add_argument("--subset", default="test", help="test (default), test1, valid, ...")
    p.add_argument("--beam", type=int, default=5)
    add_metric_options(p, "sentence")
    p.add_argument("--batch", type=int, default=32, help="sentences per forward and backward pass")
    p.add_argument("--max-examples", type=int, default=0, help="the first N sentences only (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = p.parse_args(argv)
    if args.batch < 1 or args.beam < 1:
        p.error("--batch and --beam must be at least 1")
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    return exit_status("translation_faithfulness", run, args)


if __name__ == "__main__":
    sys.exit(main())
