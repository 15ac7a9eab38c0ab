#!/usr/bin/env python
"""Use a fine-tuned sentence classifier (examples/masked_lm/finetune.sh).

    sentence_classify.py score CHECKPOINT TEST.tsv [--data BIN] [--spm sp.model]
        TEST.tsv: "sentence<TAB>label" a line (a "sentence<TAB>label" header is
        skipped). Prints accuracy and Matthews correlation (MCC, GLUE's CoLA
        metric) with bootstrap 95% intervals, and one JSON line (--json FILE too).
    sentence_classify.py classify CHECKPOINT TEXT.txt [-o OUT]
        One sentence a line -> "label<TAB>probability" a line (stdout or OUT).

The dictionaries come from the fine-tuning data (the checkpoint's --data,
or --data BIN = prepare.sh's OUT_DIR/bin/<task>), the SentencePiece model
from BIN/../sp.model (or --spm). Text is lowercased as prepare.sh does.
Bad input (a missing column, a label the model does not know, an empty file,
a checkpoint that is not a sentence classifier) stops with one line and exit
status 1; nothing is written then.
"""

import argparse
import json
import os
import sys

import numpy as np

HEAD = "sentence_classification_head"


class BadInput(Exception):
    pass


def exit_status(tag, action, *args) -> int:
    """Run ``action(*args)``: 0; on BadInput its message as one line
    ``[tag] error: ...`` on stderr and 1 (the scripts' bad-input contract)."""
    try:
        action(*args)
    except BadInput as err:
        print(f"[{tag}] error: {err}", file=sys.stderr)
        return 1
    return 0


def load(checkpoint, data=None):
    """(model, task) of a sentence_prediction checkpoint, in eval mode on CPU."""
    import fairseq_dnas.plugin  # noqa: F401  (registers the plugin; checkpoints under torch >= 2.6)
    from fairseq import checkpoint_utils

    from fairseq_dnas.errors import BadFile
    from fairseq_dnas.fairseq_patches.file_checks import read_checkpoint

    try:
        state = read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, checkpoint)
    except BadFile as err:
        raise BadInput(str(err)) from None
    cfg = state.get("cfg") or {}
    task_name = (cfg.get("task") or {}).get("_name") if cfg else None
    if task_name is None and state.get("args") is not None:
        task_name = getattr(state["args"], "task", None)
    if task_name != "sentence_prediction":
        raise BadInput(f"{checkpoint}: a checkpoint of --task {task_name}, not a fine-tuned sentence "
                       "classifier (--task sentence_prediction); fine-tune it first with examples/masked_lm/finetune.sh")
    data = data or cfg["task"]["data"]
    for sub in ("input0", "label"):
        if not os.path.isfile(os.path.join(data, sub, "dict.txt")):
            raise BadInput(f"{data}: no {sub}/dict.txt; give the fine-tuning data with --data (prepare.sh's OUT_DIR/bin/<task>)")
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data}, state=state)
    model = models[0].eval()
    if HEAD not in getattr(model, "classification_heads", {}):
        raise BadInput(f"{checkpoint}: the model has no {HEAD}")
    return model, task, data


def labels_of(task):
    """The classes, in the order of the classifier's outputs: the label
    dictionary's first --num-classes symbols after its specials (the rest is
    fairseq-preprocess's padding of the dictionary to a multiple of 8)."""
    d = task.label_dictionary
    return [d[i] for i in range(d.nspecial, d.nspecial + task.cfg.num_classes)]


def encode(model, task, sp, sentences):
    """The token ids each sentence is fed to the model as (a 1-D LongTensor
    each): lowercased, SentencePiece pieces cut to the model's positions,
    ``--init-token`` (``<s>``) first and ``</s>`` last."""
    import torch

    d = task.source_dictionary
    init = task.cfg.init_token
    max_pieces = model.max_positions() - 2
    rows = []
    for s in sentences:
        pieces = sp.encode(s.lower(), out_type=str)[:max_pieces]
        ids = d.encode_line(" ".join(pieces), append_eos=True, add_if_not_exist=False).long()
        rows.append(torch.cat([torch.tensor([init]), ids]) if init is not None else ids)
    return rows


def pad_batch(rows, pad):
    """(B, T) right-padded batch of the 1-D id tensors ``rows``."""
    import torch

    x = torch.full((len(rows), max(len(r) for r in rows)), pad, dtype=torch.long)
    for b, r in enumerate(rows):
        x[b, :len(r)] = r
    return x


def predict(model, task, sp, sentences, batch=64):
    """(label index, probabilities) for each sentence."""
    import torch

    rows = encode(model, task, sp, sentences)
    probs = []
    with torch.no_grad():
        for i in range(0, len(rows), batch):
            x = pad_batch(rows[i:i + batch], task.source_dictionary.pad())
            logits, _ = model(x, features_only=True, classification_head_name=HEAD)
            probs.append(torch.softmax(logits.float(), -1))
    p = torch.cat(probs).numpy()
    return p.argmax(1), p


def read_lines(path):
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file")
    with open(path, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    if not any(line.strip() for line in lines):
        raise BadInput(f"{path}: empty file, nothing to classify")
    return lines


def read_labelled(path, known):
    lines = read_lines(path)
    head = [x.strip() for x in lines[0].split("\t")]
    start = 1 if "label" in (head[0], head[-1]) else 0
    sentences, gold = [], []
    for i, line in enumerate(lines[start:], start + 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 2 or not parts[0].strip():
            raise BadInput(f"{path}:{i}: expected 'sentence<TAB>label', found {len(parts)} column(s)")
        label = parts[-1].strip()
        if label not in known:
            if len(parts) == 2 and parts[0].strip() in known:
                raise BadInput(f"{path}:{i}: the columns look swapped: {parts[0].strip()!r} first is a label the "
                               "model knows; give 'sentence<TAB>label' a line")
            raise BadInput(f"{path}:{i}: label {label!r} is not one the model knows ({', '.join(known)})")
        sentences.append("\t".join(parts[:-1]).strip())
        gold.append(known.index(label))
    if not sentences:
        raise BadInput(f"{path}: no labelled sentence in the file")
    return sentences, np.array(gold)


def accuracy(gold, pred):
    return float((gold == pred).mean())


def mcc(gold, pred):
    """Matthews correlation of binary labels (0 when a margin is empty, as GLUE/sklearn)."""
    tp = float(((pred == 1) & (gold == 1)).sum()); tn = float(((pred == 0) & (gold == 0)).sum())
    fp = float(((pred == 1) & (gold == 0)).sum()); fn = float(((pred == 0) & (gold == 1)).sum())
    den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return (tp * tn - fp * fn) / den if den else 0.0


def bootstrap(metric, gold, pred, samples=1000, seed=0):
    """Percentile 95% interval of ``metric`` over test sentences resampled with replacement."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(gold), size=(samples, len(gold)))
    values = np.array([metric(gold[i], pred[i]) for i in idx])
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def spm_model(args, data):
    import sentencepiece as spm

    path = args.spm or os.path.join(os.path.dirname(os.path.abspath(data)), "sp.model")
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no SentencePiece model; give prepare.sh's OUT_DIR/bin/sp.model with --spm")
    return spm.SentencePieceProcessor(model_file=path)


def score(args):
    model, task, data = load(args.checkpoint, args.data)
    known = labels_of(task)
    if sorted(known) != ["0", "1"]:
        raise BadInput(f"{args.checkpoint}: labels {known}; score handles the binary 0/1 tasks (SST-2, CoLA)")
    sentences, gold_idx = read_labelled(args.test, known)
    sp = spm_model(args, data)
    pred_idx, _ = predict(model, task, sp, sentences)
    # Metrics on the labels themselves (1 = positive / acceptable).
    gold = np.array([int(known[i]) for i in gold_idx]); pred = np.array([int(known[i]) for i in pred_idx])
    out = {"checkpoint": args.checkpoint, "test": args.test, "n": len(gold),
           "accuracy": accuracy(gold, pred), "accuracy_ci95": bootstrap(accuracy, gold, pred),
           "mcc": mcc(gold, pred), "mcc_ci95": bootstrap(mcc, gold, pred)}
    print(f"{args.test}: {len(gold)} sentences, accuracy {100 * out['accuracy']:.1f}% "
          f"(95% CI {100 * out['accuracy_ci95'][0]:.1f}-{100 * out['accuracy_ci95'][1]:.1f}), "
          f"MCC {out['mcc']:.3f} (95% CI {out['mcc_ci95'][0]:.3f} to {out['mcc_ci95'][1]:.3f})", file=sys.stderr)
    print(json.dumps(out))
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(args.json + ".tmp", args.json)


def classify(args):
    lines = read_lines(args.input)
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise BadInput(f"{args.input}:{i}: empty line; give one sentence a line")
    model, task, data = load(args.checkpoint, args.data)
    sp = spm_model(args, data)
    known = labels_of(task)
    pred, probs = predict(model, task, sp, lines)
    text = "".join(f"{known[p]}\t{probs[i, p]:.4f}\n" for i, p in enumerate(pred))
    if args.output:
        with open(args.output + ".tmp", "w") as f:
            f.write(text)
        os.replace(args.output + ".tmp", args.output)
    else:
        sys.stdout.write(text)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("score", "classify"):
        s = sub.add_parser(name)
        s.add_argument("checkpoint")
        s.add_argument("test" if name == "score" else "input")
        s.add_argument("--data", help="fine-tuning data (OUT_DIR/bin/<task>); default: the checkpoint's")
        s.add_argument("--spm", help="SentencePiece model; default: DATA/../sp.model")
        if name == "score":
            s.add_argument("--json", help="also write the result here")
        else:
            s.add_argument("-o", "--output", help="write here instead of stdout")
    args = p.parse_args(argv)
    return exit_status("sentence_classify", score if args.command == "score" else classify, args)


if __name__ == "__main__":
    sys.exit(main())
