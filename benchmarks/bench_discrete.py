#!/usr/bin/env python
"""Speed of the single-stream discrete Transformer (J. Kinley, 2020) against
fairseq's ``transformer`` of the same size and weights, in one run:

- a training update (forward with Gumbel noise, backward, Adam step), median
  seconds and the median per-round ratio to ``transformer`` (target <= 1.15x);
- generation with beam 4 (argmax attention, incremental decoding), sentences
  per second and the ratio.

    .venv/bin/python benchmarks/bench_discrete.py --size small --json /tmp/bench_discrete.json

Sizes: ``tiny`` (fairseq's transformer_tiny), ``small`` (3 + 3 layers, 256
wide, FFN 1,024, 4 heads; the default, a minute or two on a laptop CPU),
``iwslt`` (the thesis's IWSLT model: 6 + 6 layers, 512 wide, FFN 1,024, 4
heads). Rounds are interleaved (bench_common.timed_rounds), so a load change
during the run hits both models alike; ``foreign_cpu`` reports the load of
other processes.
"""

import argparse
import json
import sys

import torch

import bench_common as common
from bench_common import CpuLoad, log, timed_rounds
from bench_model import build_models, synthetic_batch

ARCHS = {"transformer": "transformer", "discrete_single": "transformer_discrete_single"}
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


def update_section(args):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    models, task, d = build_models(args, ARCHS, [*SIZES[args.size], "--attention-dropout", "0.1"], args.vocab)
    sample = synthetic_batch(d, args.batch, args.src_len, args.tgt_len)
    steps = {}
    for name, (m, _) in models.items():
        m.train()
        crit = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
        opt = torch.optim.Adam(m.parameters(), lr=1e-5)

        def step(m=m, crit=crit, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss, _, _ = crit(m, sample)
            loss.backward()
            opt.step()

        steps[name] = step
    log(f"training update, size {args.size}, batch {args.batch} x {args.src_len}/{args.tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(steps, 1, args.rounds, "transformer")
    rows = []
    for name, t in timing.items():
        rows.append({"section": "update", "model": name, "arch": ARCHS[name], "size": args.size,
                     "median_s": t["median_s"], "times_s": t["times_s"], "time_ratio": t["ratio"],
                     "target": 1.15 if name != "transformer" else None, "foreign_cpu": load.foreign_fraction})
        log(f"  {name:16s} {t['median_s']:7.3f} s/update  x{t['ratio']:.3f}")
    return rows


def generate_section(args):
    from fairseq.sequence_generator import SequenceGenerator

    models, task, d = build_models(args, ARCHS, [*SIZES[args.size], "--dropout", "0"], args.vocab)
    sample = synthetic_batch(d, args.gen_batch, args.src_len, args.tgt_len, seed=3)
    calls = {}
    for name, (m, _) in models.items():
        m.eval()
        # min_len = max_len: every hypothesis runs the same number of decoder steps
        gen = SequenceGenerator([m], d, beam_size=4, max_len_a=0, max_len_b=args.tgt_len - 1,
                                min_len=args.tgt_len - 1)

        def call(gen=gen, m=m):
            with torch.no_grad():
                gen.generate([m], sample)

        calls[name] = call
    log(f"generation, beam 4, size {args.size}, {args.gen_batch} sentences x {args.tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(calls, 1, args.rounds, "transformer")
    rows = []
    for name, t in timing.items():
        rows.append({"section": "generate", "model": name, "arch": ARCHS[name], "size": args.size,
                     "median_s": t["median_s"], "sentences_per_s": args.gen_batch / t["median_s"],
                     "time_ratio": t["ratio"], "foreign_cpu": load.foreign_fraction})
        log(f"  {name:16s} {args.gen_batch / t['median_s']:7.2f} sentences/s  x{t['ratio']:.3f}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=SIZES, default="small")
    p.add_argument("--batch", type=int, default=32, help="sentences per training update")
    p.add_argument("--gen-batch", type=int, default=16, help="sentences per generation call")
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", help="write the rows and the machine here")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    rows = update_section(args) + generate_section(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": common.machine(), "settings": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
