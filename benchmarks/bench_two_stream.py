#!/usr/bin/env python
"""Speed of the two-stream Transformer (J. Kinley, 2020) against fairseq's
``transformer`` of the same size, in one run (CPU or CUDA):

- a training update (forward, label-smoothed loss, backward, Adam step) of
  ``transformer``, ``transformer_two_stream`` (soft: S = A) and
  ``transformer_discrete`` (Gumbel-softmax S): median seconds and the median
  per-round ratio to ``transformer`` (target <= 2.1x);
- generation with beam 4 (``transformer_discrete``: argmax S, incremental
  decoding in both streams): sentences per second and the ratio.

    .venv/bin/python benchmarks/bench_two_stream.py --size small --json /tmp/bench_two_stream.json
    .venv/bin/python benchmarks/bench_two_stream.py --device cuda --size iwslt   # float16 on the GPU

The floor: the model stream repeats, per layer, the value and output
projections, the feed-forward block, the layer norms and the S V' product
of the controller; only the queries, keys, logits and softmax, the
embeddings and the output projection with the loss are computed once. So a
two-stream update costs a little under two transformer updates when the
per-layer work dominates (``soft`` measures that structural cost); the
discrete model adds the Gumbel noise and the relaxed softmax on top. Both
streams start from fairseq's transformer weights (the model stream a copy
of the controller), so the three models see the same numbers.
"""

import sys

import torch

import bench_common as common
from bench_common import CpuLoad, log, timed_rounds
from bench_discrete import SIZES, parser, set_device, write_json  # SIZES: tiny, small, iwslt (fairseq's transformer_iwslt_de_en)
from bench_model import build_models, generation_calls, model_args, synthetic_batch, training_steps

ARCHS = {"transformer": "transformer", "two_stream_soft": "transformer_two_stream",
         "two_stream_discrete": "transformer_discrete"}
TARGET = 2.1


def transformer_name(name):
    """The transformer's parameter that a two-stream parameter starts from:
    the model stream's ``model_*`` modules and the controller's own
    embeddings (``controller_embed_tokens``, ``controller_embed_positions``,
    ...) copy the transformer's module of the name without the prefix."""
    return ".".join(part.removeprefix("model_").removeprefix("controller_") for part in name.split("."))


def build(args, extra):
    """{name: model} with shared weights: the two-stream models' streams both hold the transformer's."""
    base, task, d = build_models(args, {"transformer": "transformer"}, extra, args.vocab)
    models = {"transformer": base["transformer"][0]}
    weights = models["transformer"].state_dict()
    for name, arch in ARCHS.items():
        if name != "transformer":
            m = task.build_model(model_args(arch, extra)).to(common.DEVICE)
            m.load_state_dict({k: weights[transformer_name(k)] for k in m.state_dict()})
            models[name] = m.half() if common.DEVICE.type == "cuda" else m
    return models, task, d


def report(section, args, timing, load, fields):
    """One row per model; ``fields(name, t)`` gives the section's own columns and log text."""
    rows = []
    for name, t in timing.items():
        extra, text = fields(name, t)
        rows.append({"section": section, "model": name, "arch": ARCHS[name], "size": args.size,
                     "median_s": t["median_s"], "time_ratio": t["ratio"], "foreign_cpu": load.foreign_fraction,
                     **extra})
        log(f"  {name:20s} {text}  x{t['ratio']:.3f}")
    return rows


def update_section(args):
    models, task, d = build(args, [*SIZES[args.size], "--attention-dropout", "0.1"])
    sample = synthetic_batch(d, args.batch, args.src_len, args.tgt_len)
    steps = training_steps({name: (m, None) for name, m in models.items()}, task, sample)
    log(f"training update, size {args.size}, batch {args.batch} x {args.src_len}/{args.tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(steps, 1, args.rounds, "transformer")
    return report("update", args, timing, load, lambda name, t: (
        {"times_s": t["times_s"], "target": None if name == "transformer" else TARGET},
        f"{t['median_s']:7.3f} s/update"))


def generate_section(args):
    models, task, d = build(args, [*SIZES[args.size], "--dropout", "0"])
    models = {k: models[k] for k in ("transformer", "two_stream_discrete")}
    sample = synthetic_batch(d, args.gen_batch, args.src_len, args.tgt_len, seed=3)
    calls = generation_calls({name: (m, None) for name, m in models.items()}, d, sample, args.tgt_len)
    log(f"generation, beam 4, size {args.size}, {args.gen_batch} sentences x {args.tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(calls, 1, args.rounds, "transformer")
    return report("generate", args, timing, load, lambda name, t: (
        {"sentences_per_s": args.gen_batch / t["median_s"]}, f"{args.gen_batch / t['median_s']:7.2f} sentences/s"))


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--no-generate", action="store_true", help="the training update only")
    args = p.parse_args(argv)
    set_device(p, args)
    torch.manual_seed(0)
    rows = update_section(args) + ([] if args.no_generate else generate_section(args))
    if args.json:
        write_json(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
