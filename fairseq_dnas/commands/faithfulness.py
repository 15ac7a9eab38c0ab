#!/usr/bin/env python
"""Is attention an explanation? Kendall's tau between the attention each
token receives and its gradient importance, per test sentence, for a
fine-tuned sentence classifier (--task sentence_prediction: roberta,
roberta_dnas, roberta_hnas, and the discrete and two-stream encoders). The thesis's metric (J. Kinley, 2020,
Chapter 6; Jain & Wallace, 2019); the definitions are in
fairseq_dnas/analysis/faithfulness.py and docs/analysis.md.

    faithfulness.py CHECKPOINT [CHECKPOINT ...] --test TEST.tsv
            [--importance grad|grad-x-input] [--detach-attention]
            [--attention model|controller]
            [--json FILE [FILE ...]] [--plot FIGURE.png] [--labels NAME ...]
            [--data BIN] [--spm sp.model] [--batch 64] [--max-examples N]
        TEST.tsv: "sentence<TAB>label" a line (a "sentence<TAB>label" header is
        skipped), read and encoded as sentence_classify.py does. Prints per
        model the accuracy, tau mean +- standard deviation and the count of
        examples left out (tau undefined), and one JSON line (stdout);
        --json writes one line per example (one file per checkpoint);
        --plot draws the histograms of tau, the models overlaid.
    faithfulness.py --from-json FILE [FILE ...] --plot FIGURE.png [--labels NAME ...]
        The summary and the picture from --json files written before.

Discrete encoders (argmax attention at inference: roberta_discrete_single,
roberta_discrete) also report the receptive field of <s>, the position the
classification head reads: its mean size per layer over the sentences, in
positions and as a fraction of the sentence's length (<s> and </s>
included), as `receptive_field_size` and `receptive_field_fraction` in the
summary line, and per sentence in --json as `receptive_field`, the positions
(indices into `tokens`) of the final layer's field.

Every encoder also reports attention's share of the residual stream per
layer (bottom first): over the non-padding tokens of TEST, the mean and the
median of ||attention output|| / ||layer input|| (what the self-attention
sub-layer adds before the residual add, over the residual stream it is
added to), as `attention_share` and `attention_share_median`; a two-stream
encoder reports its model stream h there (the one the classifier reads) and
its controller g as `controller_attention_share` and
`controller_attention_share_median`. Definition: docs/analysis.md.

--detach-attention takes the gradient with the attention probabilities
held constant (Jain & Wallace's code detaches them); the default follows
the thesis (Section 5.4), whose gradient runs through the attention too.
Whose definition each option is, and why the default: docs/analysis.md.

--attention picks the stream of a two-stream encoder ('model': the model
stream's S, 'controller': the controller's A); a single-stream encoder has
one attention, used for both. Bad input (a missing file, a label the model
does not know, a checkpoint that is not a sentence classifier) stops with one
line and exit status 1; no --json file is written then.
"""

import argparse
import json
import os
import sys
import time

from fairseq_dnas.commands import sentence_classify
from fairseq_dnas.commands.sentence_classify import BadInput


def measure(checkpoint, args):
    """(summary dict, per-example rows, encoder scheme) of one checkpoint."""
    import torch

    from fairseq_dnas.analysis import attention_share as AS
    from fairseq_dnas.analysis import faithfulness as F
    from fairseq_dnas.analysis.checkpoints import encoder_scheme

    model, task, data = sentence_classify.load(checkpoint, args.data)
    known = sentence_classify.labels_of(task)
    sentences, gold = sentence_classify.read_labelled(args.test, known)
    if args.max_examples:
        sentences, gold = sentences[:args.max_examples], gold[:args.max_examples]
    sp = sentence_classify.spm_model(args, data)
    rows = sentence_classify.encode(model, task, sp, sentences)
    pad = task.source_dictionary.pad()
    t0 = time.time()
    # Batches of similar lengths (less padding; the numbers do not depend on it).
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    out = [None] * len(rows)
    field_sizes = []  # discrete encoders: per example, |r(<s>, l)| for every layer l
    shares = {}  # stream -> per layer, one flat tensor of r_lt per batch
    for start in range(0, len(order), args.batch):
        idx = order[start:start + args.batch]
        x = sentence_classify.pad_batch([rows[i] for i in idx], pad)
        try:
            with AS.ResidualAttention(model) as residual:
                r = F.explain_batch(model, x, sentence_classify.HEAD, task.cfg.init_token, args.attention,
                                    detach_attention=args.detach_attention)
        except ValueError as err:  # an --attention stream the encoder does not report
            raise BadInput(f"{checkpoint}: {err}") from None
        for stream, layers in residual.shares(x.eq(pad)).items():
            for n, ratios in enumerate(layers):
                shares.setdefault(stream, [[] for _ in layers])[n].append(ratios)
        for b, i in enumerate(idx):
            real = r["real"][b]
            a = r["attention"][b][real].tolist()
            g = r["importance"][args.importance][b][real].tolist()
            out[i] = {"index": i, "tokens": rows[i].tolist(), "attention": a, "importance": g,
                      "tau": F.kendall_tau(a, g), "label": known[int(gold[i])],
                      "prediction": known[int(r["prediction"][b])]}
            if r["receptive_field"] is not None:
                field = r["receptive_field"][:, b, :len(rows[i])]  # (L, T): padding is never in it
                out[i]["receptive_field"] = field[-1].nonzero().flatten().tolist()
                field_sizes.append((field.sum(-1).tolist(), len(rows[i])))
    seconds = time.time() - t0
    summary = F.summarize([o["tau"] for o in out], gold, [known.index(o["prediction"]) for o in out])
    summary.update({"checkpoint": checkpoint, "test": args.test, "attention": args.attention,
                    "importance": args.importance, "detach_attention": args.detach_attention,
                    "seconds": round(seconds, 2),
                    "threads": torch.get_num_threads()})
    if field_sizes:
        summary.update(F.receptive_field_summary(field_sizes))
    summary.update(share_keys(shares))
    return summary, out, encoder_scheme(model)


# The summary keys of attention's share of the residual stream, per stream:
# the one of a single-stream encoder and a two-stream encoder's model stream
# (the one the classification head reads) unprefixed, its controller apart.
SHARE_PREFIX = {"self": "", "model": "", "controller": "controller_"}


def share_keys(shares) -> dict:
    """{'attention_share': per-layer means, 'attention_share_median': ...,
    and 'controller_attention_share...' for a two-stream encoder}."""
    from fairseq_dnas.analysis import attention_share as AS

    out = {}
    for stream, per_layer in shares.items():
        s = AS.share_summary(per_layer)
        prefix = SHARE_PREFIX[stream]
        out[f"{prefix}attention_share"], out[f"{prefix}attention_share_median"] = s["mean"], s["median"]
    return out


def from_json(path):
    """(summary, rows) of a --json file."""
    from fairseq_dnas.analysis import faithfulness as F

    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                rows.append({k: row[k] for k in ("tau", "label", "prediction")})
            except (ValueError, KeyError, TypeError):
                raise BadInput(f"{path}:{i}: not a line of faithfulness.py --json") from None
    if not rows:
        raise BadInput(f"{path}: empty file")
    summary = F.summarize([r["tau"] for r in rows], [r["label"] for r in rows], [r["prediction"] for r in rows])
    summary["json"] = path
    return summary, rows


def write_rows(path, rows):
    from fairseq_dnas.analysis.files import atomic_path

    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


def report(label, s):
    print(f"{label}: {s['n']} sentences, accuracy {100 * s['accuracy']:.1f}%, Kendall tau "
          f"{s['tau_mean']:.3f} +- {s['tau_std']:.3f} (std), {s['left_out']} left out (tau undefined)"
          + (f", {s['seconds']:.1f} s" if "seconds" in s else ""), file=sys.stderr)
    if "receptive_field_size" in s:
        print(f"{label}: receptive field of <s> per layer (mean over sentences): "
              + ", ".join(f"{n:.2f}" for n in s["receptive_field_size"]) + " positions, "
              + ", ".join(f"{q:.3f}" for q in s["receptive_field_fraction"]) + " of the length", file=sys.stderr)
    for prefix, stream in (("", "attention"), ("controller_", "controller attention")):
        if f"{prefix}attention_share" in s:
            print(f"{label}: {stream}'s share of the residual stream per layer, ||attention out|| / "
                  "||layer input|| over the tokens: mean " + ", ".join(f"{r:.3f}" for r in s[f"{prefix}attention_share"])
                  + "; median " + ", ".join(f"{r:.3f}" for r in s[f"{prefix}attention_share_median"]),
                  file=sys.stderr)
    print(json.dumps({"label": label, **s}))


def check_counts(args, models, sources=None):
    """One --json file per model measured and one --labels name per model
    shown (``sources``: the models and --from-json files; default: ``models``)."""
    sources = models if sources is None else sources
    if args.json and len(args.json) != len(models):
        raise BadInput(f"--json: {len(args.json)} file(s) for {len(models)} checkpoint(s); give one each")
    if args.labels and len(args.labels) != len(sources):
        raise BadInput(f"--labels: {len(args.labels)} name(s) for {len(sources)} model(s); give one each")


def check_args(args, p):
    sources = args.from_json or args.checkpoints
    if bool(args.from_json) == bool(args.checkpoints):
        p.error("give checkpoints (with --test) or --from-json files, not both")
    if args.checkpoints and not args.test:
        p.error("--test TEST.tsv is required with checkpoints")
    check_counts(args, args.checkpoints, sources)
    for path in sources:
        if not os.path.isfile(path):
            raise BadInput(f"{path}: no such file")
    if args.test and not os.path.isfile(args.test):
        raise BadInput(f"{args.test}: no such file")
    return sources


def run(args, p):
    sources = check_args(args, p)
    labels = args.labels or [os.path.basename(os.path.dirname(os.path.abspath(s))) or s for s in sources]
    series, per_example = [], []
    for k, path in enumerate(sources):
        if args.from_json:
            summary, rows = from_json(path)
            scheme = None
        else:
            summary, rows, scheme = measure(path, args)
        report(labels[k], summary)
        per_example.append(rows)
        series.append((labels[k], scheme, [r["tau"] for r in rows if r["tau"] is not None]))
    finish(args, per_example, series, "" if args.from_json else f" ({metric_name(args)}, {args.attention} attention)")


def finish(args, per_model, series, what):
    """The --json files (one per model) and the --plot histograms, written
    when every model is done: bad input leaves no file behind."""
    for path, rows in zip(args.json or [], per_model):
        write_rows(path, rows)
    if args.plot:
        from fairseq_dnas.analysis.plots import plot_tau_histograms

        plot_tau_histograms(series, args.plot, what)


def metric_name(args) -> str:
    """The importance in words, for plot titles: 'grad importance', 'grad-x-input importance, attention detached'."""
    return f"{args.importance} importance" + (", attention detached" if args.detach_attention else "")


def add_metric_options(p, unit, streams=True):
    """The options the classification, translation and Hugging Face forms
    share; ``unit`` names what a --json line is ('example', 'sentence');
    ``streams``: offer --attention (the fairseq two-stream encoders)."""
    p.add_argument("--importance", choices=("grad", "grad-x-input"), default="grad",
                   help="the gradient's norm at h0 (the thesis's, default) or |gradient . input|")
    p.add_argument("--detach-attention", action="store_true",
                   help="the attention probabilities are constants for the gradient (Jain & Wallace's code); "
                        "default: the gradient runs through them too (the thesis)")
    if streams:
        p.add_argument("--attention", choices=("model", "controller"), default="model",
                       help="the stream of a two-stream model; the same attention for a single-stream one")
    p.add_argument("--json", nargs="+", help=f"one line per {unit}, one file per checkpoint")
    p.add_argument("--plot", help="histograms of tau (PNG or PDF)")
    p.add_argument("--labels", nargs="+", help="a name per model (default: the checkpoint's folder)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="*", help="fine-tuned sentence_prediction checkpoints")
    p.add_argument("--test", help="sentence<TAB>label file")
    p.add_argument("--from-json", nargs="+", help="--json files of earlier runs instead of checkpoints")
    add_metric_options(p, "example")
    p.add_argument("--data", help="fine-tuning data (OUT_DIR/bin/<task>); default: the checkpoint's")
    p.add_argument("--spm", help="SentencePiece model; default: DATA/../sp.model")
    add_run_options(p, batch=64)
    args = parse_run_args(p, argv)
    return sentence_classify.exit_status("faithfulness", run, args, p)


def add_run_options(p, batch):
    """--batch (default ``batch``), --max-examples and --threads."""
    p.add_argument("--batch", type=int, default=batch, help="sentences per forward and backward pass")
    p.add_argument("--max-examples", type=int, default=0, help="the first N sentences only (0: all)")
    # The matrices are small (thesis-size encoders): intra-op threads gain
    # little, and on a busy machine 2 threads took 15 times longer than 1.
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")


def parse_run_args(p, argv):
    """The parsed arguments, --batch checked and torch's threads set."""
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error("--batch must be at least 1")
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    return args


if __name__ == "__main__":
    sys.exit(main())
