#!/usr/bin/env python
"""Test time of the appendix's dependency experiment (J. Kinley, 2020,
Appendix, Figure 4.1): the receptive field of every prediction of a
language model trained on the parenthesis language
(``examples/discrete/parentheses.py``) against its true dependency.

    python examples/discrete/dependencies_eval.py --data TEXT_DIR --bin BIN_DIR \\
        --discrete CKPT [--soft CKPT] --out result.json [--plot figure.png] [--example 0]

reads TEXT_DIR/{split}.txt and .dep (the generator's), runs each checkpoint
on every sequence (``</s> w_0 .. w_{T-1}``, what fairseq's
``language_modeling`` task with ``--sample-break-mode eos`` feeds), and
writes one JSON object (also printed): for the discrete model (and the soft
one) ``precision``, ``recall``, ``test_perplexity`` and the mean sizes,
with the discrete model's three at the top level; the thesis's figures
beside them (``thesis``).

Decided here:
- **The field of a prediction.** The target w_t is predicted at input
  position t, from the decoder's state there after the last layer, so its
  receptive field is r(t, L) (``fairseq_dnas.analysis.receptive_field``:
  R^0 = I, R^l = R^{l-1} OR G^l R^{l-1}, G^l the union over heads of the
  layer's argmax attention, the model in eval mode). Its true dependency is
  the input positions s_t .. t (the generator's docstring).
- **Precision and recall** are pooled over every scored (sequence, target)
  pair of the split (micro averages): precision = sum |R n D| / sum |R|,
  recall = sum |R n D| / sum |D|. Per-prediction means (macro) are written
  as ``precision_macro`` / ``recall_macro``. The 30 word targets are scored;
  the final ``</s>`` target is not (its position alone decides it).
- **Precision without the sink** (``precision_without_sink``, a
  diagnostic): the same pooled precision with ``</s>`` (input position 0)
  counted in a field only where it belongs to the true dependency (before
  the first number); the thesis does not say whether its sequences start
  with a symbol every head can attend to.
- **Test perplexity** is exp of the mean negative log-likelihood per
  target over every target, the final ``</s>`` included (what fairseq's
  ``eval_lm`` reports), with the model in eval mode: for the discrete model
  that is the argmax attention, the model the fields describe.
- **The soft model's aggregated attention** ("via Eq. 7.1": the appendix's
  recursion, the only aggregation it gives) is the same recursion on the
  softmax probabilities summed over heads, s^l = min(s^{l-1} + Z^l
  s^{l-1}, 1) (``soft_receptive_fields``), values in [0, 1]; a position is in
  its field, for precision and recall, where s^L >= ``--soft-threshold``
  (0.5). The soft model is the same architecture with ``--discrete-sampler
  soft`` (S = softmax(L): fairseq's ``transformer_lm``).
- **The picture** (Figure 4.1): one test sequence (``--example``), a
  panel each for the true dependency, the discrete model's argmax field and
  (with ``--soft``) the soft model's aggregated s^L; rows are the predicted
  words, columns the input words.
"""

import argparse
import json
import math
import os
import sys
from typing import List, Sequence

import torch

THESIS = {"precision": 0.959, "recall": 0.920}
SCORED_TARGETS = "words"  # the final </s> target is not scored


def read_split(data: str, split: str):
    """(lines of words, dependency starts) of one split of the generator's output."""
    with open(os.path.join(data, split + ".txt")) as f:
        lines = [line.split() for line in f if line.strip()]
    with open(os.path.join(data, split + ".dep")) as f:
        starts = [[int(x) for x in line.split()] for line in f if line.strip()]
    if len(lines) != len(starts) or any(len(a) != len(b) for a, b in zip(lines, starts)):
        raise SystemExit(f"error: {data}/{split}.txt and .dep do not match line by line")
    return lines, starts


def dependency_mask(starts: Sequence[Sequence[int]], length: int) -> torch.Tensor:
    """(B, T_w, T) bool: D[b, t, q] = [s_t <= q <= t], the true dependency of
    word target t over the T = T_w + 1 input positions."""
    s = torch.tensor(starts)  # (B, T_w)
    q = torch.arange(length)
    t = torch.arange(s.size(1))
    return (q[None, None, :] >= s[:, :, None]) & (q[None, None, :] <= t[None, :, None])


def precision_recall(fields: torch.Tensor, truth: torch.Tensor) -> dict:
    """Pooled and per-prediction precision and recall of predicted fields
    against true dependencies, both (N, ..., T) bool over input positions
    (the last dimension)."""
    fields, truth = fields.bool(), truth.bool()
    hit = (fields & truth).sum(-1).double()
    size, need = fields.sum(-1).double(), truth.sum(-1).double()
    return {
        "precision": float(hit.sum() / size.sum().clamp(min=1)),
        "recall": float(hit.sum() / need.sum().clamp(min=1)),
        "precision_macro": float((hit / size.clamp(min=1)).mean()),
        "recall_macro": float((hit / need.clamp(min=1)).mean()),
        "mean_field_size": float(size.mean()),
        "mean_dependency_size": float(need.mean()),
        "predictions": int(hit.numel()),
    }


def without_sink(fields: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """``fields`` with input position 0 (``</s>``, where a head attends when
    nothing else pays) taken out wherever it is not part of the true
    dependency: a diagnostic beside precision (``precision_without_sink``),
    since every head must attend somewhere and ``</s>`` carries nothing. Hits
    are unchanged, so recall is too; a field of ``</s>`` and the position
    itself scores 1.0 on it, so it reads only beside recall."""
    out = fields.bool().clone()
    out[..., 0] &= truth.bool()[..., 0]
    return out


def load(checkpoint: str, bin_dir: str):
    """(model in eval mode, dictionary) from a fairseq checkpoint."""
    import fairseq_dnas.plugin  # noqa: F401  (registers the architectures)
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": bin_dir})
    model = models[0].eval()
    return model, task.source_dictionary


def encode(lines: List[List[str]], dictionary):
    """(input (B, T+1): </s> w_0 .. w_{T-1}, target (B, T+1): w_0 .. w_{T-1} </s>)."""
    rows = []
    for words in lines:
        ids = [dictionary.index(w) for w in words]
        if dictionary.unk() in ids:
            raise SystemExit(f"error: a word outside the dictionary in {' '.join(words)!r}")
        rows.append(ids)
    w = torch.tensor(rows)
    eos = torch.full((w.size(0), 1), dictionary.eos(), dtype=w.dtype)
    return torch.cat([eos, w], 1), torch.cat([w, eos], 1)


@torch.no_grad()
def run_model(model, inputs, targets, batch: int = 500):
    """(per-layer attention (H, B, T, T) each, bottom first; total NLL; target count)."""
    mods = [layer.self_attn for layer in model.decoder.layers]
    per_layer = [[] for _ in mods]
    nll = 0.0
    for i in range(0, inputs.size(0), batch):
        x, y = inputs[i:i + batch], targets[i:i + batch]
        for m in mods:
            m.keep_sample, m.kept_sample = True, None
        try:
            out = model(x)
            for k, m in enumerate(mods):
                per_layer[k].append(m.kept_sample.transpose(0, 1).float())  # (B, H, T, T) -> (H, B, T, T)
        finally:
            for m in mods:
                m.keep_sample, m.kept_sample = False, None
        lprobs = model.get_normalized_probs(out, log_probs=True)
        nll -= float(lprobs.gather(-1, y.unsqueeze(-1)).sum())
    return [torch.cat(p, 1) for p in per_layer], nll, targets.numel()


def evaluate(checkpoint: str, bin_dir: str, lines, starts, soft_threshold: float = 0.5):
    """The figures of one checkpoint and its fields (B, T, T) (bool for a
    discrete model, the soft s^L in [0, 1] for a soft one)."""
    from fairseq_dnas.analysis.receptive_field import receptive_fields, soft_receptive_fields

    model, dictionary = load(checkpoint, bin_dir)
    sampler = getattr(model.decoder.layers[0].self_attn, "sampler", "soft")
    inputs, targets = encode(lines, dictionary)
    samples, nll, count = run_model(model, inputs, targets)
    length = inputs.size(1)
    if sampler == "gumbel":
        fields = receptive_fields(samples)[-1]  # (B, T, T) bool: R^L
        member = fields
    else:
        fields = soft_receptive_fields(samples)[-1]  # (B, T, T): s^L, Eq. 7.1 on softmax
        member = fields >= soft_threshold
    truth = dependency_mask(starts, length)
    words = len(lines[0])
    result = precision_recall(member[:, :words, :], truth)  # word targets t = 0 .. T_w - 1
    result["precision_without_sink"] = precision_recall(without_sink(member[:, :words, :], truth), truth)["precision"]
    result["test_perplexity"] = math.exp(nll / count)
    result["sampler"] = sampler
    if sampler != "gumbel":
        result["soft_threshold"] = soft_threshold
    # No prediction may read a later position (causal attention).
    if bool(torch.triu(fields.float(), diagonal=1).abs().sum() > 0):
        raise SystemExit(f"error: {checkpoint}: a receptive field reaches a later position")
    return result, fields


def plot(path: str, words: List[str], starts: List[int], panels, title: str = "") -> None:
    """Figure 4.1: the true dependency and each model's field of one sequence."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging config lets its DEBUG lines through
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    length = len(words) + 1
    truth = dependency_mask([starts], length)[0].float()
    grids = [("true dependency", truth)] + [(name, f[: len(words)].float()) for name, f in panels]
    fig, axes = plt.subplots(1, len(grids), figsize=(5.2 * len(grids), 5.4), squeeze=False)
    cols = ["</s>"] + words
    for ax, (name, grid) in zip(axes[0], grids):
        ax.imshow(grid.numpy(), cmap="Greys", vmin=0, vmax=1, aspect="equal")
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(length))
        ax.set_xticklabels(cols, fontsize=6)
        ax.set_yticks(range(len(words)))
        ax.set_yticklabels(words, fontsize=6)
        ax.set_xlabel("input word")
        ax.set_ylabel("predicted word")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the generator's folder ({split}.txt, {split}.dep)")
    parser.add_argument("--bin", required=True, help="fairseq-preprocess's folder (the dictionary)")
    parser.add_argument("--discrete", required=True, help="checkpoint of the discrete model")
    parser.add_argument("--soft", help="checkpoint of the soft model (--discrete-sampler soft)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--soft-threshold", type=float, default=0.5,
                        help="s^L at or above which a position is in the soft model's field (default 0.5)")
    parser.add_argument("--out", required=True, help="result JSON")
    parser.add_argument("--plot", help="Figure 4.1 as PNG")
    parser.add_argument("--example", type=int, default=0, help="the test sequence the picture shows (default 0)")
    args = parser.parse_args(argv)

    torch.set_grad_enabled(False)
    lines, starts = read_split(args.data, args.split)
    discrete, discrete_fields = evaluate(args.discrete, args.bin, lines, starts)
    result = {k: discrete[k] for k in ("precision", "recall", "test_perplexity")}
    result.update(split=args.split, sequences=len(lines), discrete=discrete, thesis=THESIS,
                  scored_targets=SCORED_TARGETS)
    panels = [("discrete: argmax receptive field", discrete_fields[args.example])]
    if args.soft:
        soft, soft_fields = evaluate(args.soft, args.bin, lines, starts, args.soft_threshold)
        result["soft"] = soft
        panels.append(("soft: aggregated attention s^L", soft_fields[args.example]))
    with open(args.out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    if args.plot:
        plot(args.plot, lines[args.example], starts[args.example], panels,
             f"{args.split} sequence {args.example}: precision {discrete['precision']:.3f}, "
             f"recall {discrete['recall']:.3f} (thesis 0.959, 0.920)")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
