#!/usr/bin/env python
"""Speed of the single-stream discrete Transformer (J. Kinley, 2020) against
fairseq's ``transformer`` of the same size and weights, in one run:

- a training update (forward with Gumbel noise, backward, Adam step), median
  seconds and the median per-round ratio to ``transformer`` (target <= 1.15x);
- generation with beam 4 (argmax attention, incremental decoding), sentences
  per second and the ratio (target <= 1.05x), for the discrete model as it
  runs (each row's value gathered at its argmax) and, as ``discrete_product``,
  the same model with the one-hot product in its place (the inference path
  before 2026-11-28), interleaved in the same rounds.

    .venv/bin/python benchmarks/bench_discrete.py --size small --json /tmp/bench_discrete.json
    .venv/bin/python benchmarks/bench_discrete.py --sections generate --size iwslt --device cuda

Sizes: ``tiny`` (fairseq's transformer_tiny), ``small`` (3 + 3 layers, 256
wide, FFN 1,024, 4 heads; the default, a minute or two on a laptop CPU),
``iwslt`` (the thesis's IWSLT model: 6 + 6 layers, 512 wide, FFN 1,024, 4
heads). ``--device cuda`` runs both models on the GPU in float16. Rounds are interleaved (bench_common.timed_rounds), so a load change
during the run hits both models alike; ``foreign_cpu`` reports the load of
other processes.
"""

import argparse
import contextlib
import json
import sys

import torch

import bench_common as common
from bench_common import CpuLoad, log, timed_rounds
from bench_model import build_models, generation_calls, synthetic_batch, training_steps

from fairseq_dnas.attention import discrete as DA

ARCHS = {"transformer": "transformer", "discrete_single": "transformer_discrete_single"}
# generation also times the discrete model with the one-hot product (the path before inference by index)
PRODUCT = "discrete_product"
GENERATE_ARCHS = {**ARCHS, PRODUCT: "transformer_discrete_single"}
SECTIONS = ("update", "generate")
SIZES = {
    "tiny": ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
             "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"],
    "small": ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "256",
              "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
    "iwslt": ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512",
              "--decoder-embed-dim", "512", "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"],
}


def parser(doc):
    """The command line of this benchmark and of bench_two_stream.py."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=SIZES, default="small")
    p.add_argument("--batch", type=int, default=32, help="sentences per training update")
    p.add_argument("--gen-batch", type=int, default=16, help="sentences per generation call")
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the models run (default cpu); cuda runs them in float16, as fairseq-train --fp16")
    p.add_argument("--json", help="write the rows and the machine here")
    return p


def one_hot_product(logits, v, *, need_weights):
    """``argmax_attention`` as the models computed it before the gather: one-hot(argmax L) @ v."""
    s = DA.argmax_one_hot(logits)
    return torch.matmul(s.to(v.dtype), v), (s if need_weights else None)


@contextlib.contextmanager
def one_hot_inference():
    """The discrete model's inference with the one-hot product instead of the gather."""
    gather = DA.argmax_attention
    DA.argmax_attention = one_hot_product
    try:
        yield
    finally:
        DA.argmax_attention = gather


def with_one_hot_product(calls):
    """``calls`` with the PRODUCT model's call run under ``one_hot_inference``."""
    product = calls[PRODUCT]

    def call():
        with one_hot_inference():
            product()

    return {**calls, PRODUCT: call}


def set_device(p, args):
    """``common.DEVICE`` from --device (the bench_* helpers read it); cuda without a GPU is a usage error."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device")
    common.DEVICE = torch.device(args.device)


def write_json(path, args, rows):
    with open(path, "w") as f:
        json.dump({"machine": common.machine(), "settings": vars(args), "rows": rows}, f, indent=1)


def timed_section(args, section, build, extra, archs=ARCHS):
    """Time ``build(models, task, d)``'s calls of the models, interleaved."""
    models, task, d = build_models(args, archs, [*SIZES[args.size], *extra], args.vocab)
    with CpuLoad() as load:
        timing = timed_rounds(build(models, task, d), 1, args.rounds, "transformer")
    rows = []
    fastest_base = min(timing["transformer"]["times_s"])
    for name, t in timing.items():
        # the fastest rounds' ratio too: on a shared machine the least disturbed figure
        rows.append({"section": section, "model": name, "arch": archs[name], "size": args.size,
                     "median_s": t["median_s"], "times_s": t["times_s"], "time_ratio": t["ratio"],
                     "min_s": min(t["times_s"]), "min_ratio": min(t["times_s"]) / fastest_base,
                     "foreign_cpu": load.foreign_fraction})
    return rows


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated subset of {', '.join(SECTIONS)} (default: both)")
    args = p.parse_args(argv)
    sections = args.sections.split(",")
    if not sections or set(sections) - set(SECTIONS):
        p.error(f"--sections {args.sections!r}: choose from {', '.join(SECTIONS)}")
    set_device(p, args)
    torch.manual_seed(0)
    rows = []
    if "update" in sections:
        rows += update_section(args)
    if "generate" in sections:
        rows += generate_section(args)
    if args.json:
        write_json(args.json, args, rows)
    return 0


def update_section(args):
    log(f"training update, size {args.size}, batch {args.batch} x {args.src_len}/{args.tgt_len} tokens")
    rows = timed_section(args, "update", lambda models, task, d: training_steps(
        models, task, synthetic_batch(d, args.batch, args.src_len, args.tgt_len)), ["--attention-dropout", "0.1"])
    for r in rows:
        log(f"  {r['model']:16s} {r['median_s']:7.3f} s/update  x{r['time_ratio']:.3f} (target <= 1.15); "
            f"fastest {r['min_s']:.3f} s, x{r['min_ratio']:.3f}")
    log(f"other processes' CPU load during the updates: {rows[0]['foreign_cpu']:.0%}")
    return rows


def generate_section(args):
    log(f"generation, beam 4, size {args.size}, {args.gen_batch} sentences x {args.tgt_len} tokens")
    gen = timed_section(args, "generate", lambda models, task, d: with_one_hot_product(generation_calls(
        models, d, synthetic_batch(d, args.gen_batch, args.src_len, args.tgt_len, seed=3), args.tgt_len)),
        ["--dropout", "0"], GENERATE_ARCHS)
    for r in gen:
        r["sentences_per_s"] = args.gen_batch / r["median_s"]
        log(f"  {r['model']:16s} {r['sentences_per_s']:7.2f} sentences/s  x{r['time_ratio']:.3f} (time); "
            f"fastest {r['min_s']:.3f} s, x{r['min_ratio']:.3f}" + (" (target <= 1.05)" if r["model"] != PRODUCT else ""))
    log(f"other processes' CPU load during generation: {gen[0]['foreign_cpu']:.0%}")
    return gen


if __name__ == "__main__":
    sys.exit(main())
