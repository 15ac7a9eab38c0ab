#!/usr/bin/env python
"""Predictions of a trained multiview-arithmetic classifier (table65.sh) on
a binarized split, per view, in the split's line order.

    python examples/discrete/arithmetic_eval.py CHECKPOINT --data BIN --views infix[,prefix] --out PRED.json

CHECKPOINT: a ``--task sentence_prediction`` classifier of one view (then
one name in --views) or a ``--task sentence_prediction_multiview`` model
(two names: view 0's, view 1's; each view read by its own controller and
head). BIN: the folder it was trained on (input0[, input1], label). Writes
``{"views": {name: [predicted value, ...]}, "split": ..., "checkpoint": ...}``
through a temporary file; the predicted value is the label string the class
stands for (here the expression's value mod 5), so arithmetic_table.py can
score it against the text files without the binarized labels. The model runs
in eval mode (no dropout). Bad input: one line, exit status 1.
"""

import argparse
import json
import os
import sys


class BadInput(Exception):
    pass


def load(checkpoint, data):
    """(model, task) in eval mode on CPU."""
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq import checkpoint_utils

    from fairseq_dnas.errors import BadFile
    from fairseq_dnas.fairseq_patches.file_checks import read_checkpoint

    if not os.path.isfile(checkpoint):
        raise BadInput(f"{checkpoint}: no such checkpoint")
    try:
        state = read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, checkpoint)
    except BadFile as err:
        raise BadInput(str(err)) from None
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data}, state=state)
    return models[0].eval(), task


def predict(model, task, split, n_views, batch=256):
    """[[predicted label string per example, in line order] per view]."""
    import torch

    from fairseq_dnas.models.roberta_two_stream import view_head_names

    task.load_dataset(split)
    dataset = task.dataset(split)
    heads = view_head_names(task.cfg.classification_head_name)
    labels = task.label_dictionary
    out = [[None] * len(dataset) for _ in range(n_views)]
    with torch.no_grad():
        for start in range(0, len(dataset), batch):
            sample = dataset.collater([dataset[i] for i in range(start, min(start + batch, len(dataset)))])
            for view in range(n_views):
                key = "net_input" if view == 0 else "net_input1"
                extra = {"view": view} if n_views == 2 else {}
                logits, _ = model(**sample[key], features_only=True, classification_head_name=heads[view], **extra)
                for i, k in zip(sample["id"].tolist(), logits.argmax(-1).tolist()):
                    out[view][i] = labels[k + labels.nspecial]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="the binarized folder the model was trained on")
    p.add_argument("--views", required=True, help="view names, comma-separated: one per view the model reads")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    views = args.views.split(",")
    try:
        model, task = load(args.checkpoint, args.data)
        multiview = getattr(task, "multiview", False)
        if len(views) != (2 if multiview else 1):
            raise BadInput(f"--views {args.views}: the checkpoint reads {2 if multiview else 1} view(s); "
                           "name each once, view 0 first")
        preds = predict(model, task, args.split, len(views))
    except (BadInput, FileNotFoundError) as err:
        print(f"arithmetic_eval.py: error: {err}", file=sys.stderr)
        return 1
    with open(args.out + ".tmp", "w") as f:
        json.dump({"checkpoint": args.checkpoint, "split": args.split, "views": dict(zip(views, preds))}, f)
    os.replace(args.out + ".tmp", args.out)
    print(f"[arithmetic_eval] {args.checkpoint}: {len(preds[0])} {args.split} predictions per view "
          f"({', '.join(views)}) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
