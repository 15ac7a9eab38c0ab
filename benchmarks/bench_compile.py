#!/usr/bin/env python
"""CPU time of one training step of a compiled DNAS model against the
compiled ``sdpa`` model, in one run.

Both models are the same ``BertForSequenceClassification`` (same weights,
dropout 0) compiled with ``torch.compile(fullgraph=True)``; one training step
is forward, backward and an SGD update on a batch of right-padded sentences
(lengths 3T/4..T). After --warmup steps (the compiles happen there), --rounds
interleaved rounds time one step of each model; medians of the step times and
of the per-round ratio to sdpa, in wall-clock and process CPU time (the
steadier one on a shared machine), with the share of the CPU other processes
took meanwhile.

    python benchmarks/bench_compile.py --json /tmp/bench_compile.json   # a few minutes on 2 cores
    python benchmarks/bench_compile.py --quick                          # smoke run
"""

import argparse
import copy
import json
import statistics
import time

import torch

import bench_common as common  # the project's timing helpers (beside this file)

SCHEMES = ("sdpa", "dnas", "hnas", "discrete")


def build(args):
    from transformers import BertConfig, BertForSequenceClassification

    from fairseq_dnas import hf

    config = BertConfig(hidden_size=args.hidden, num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
                        num_hidden_layers=args.layers, vocab_size=1000, max_position_embeddings=args.length,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
    torch.manual_seed(0)
    base = BertForSequenceClassification(copy.deepcopy(config)).train()
    base.set_attn_implementation("sdpa")
    models = {"sdpa": base}
    for scheme in args.schemes:
        if scheme == "sdpa":
            continue
        m = BertForSequenceClassification(copy.deepcopy(config)).train()
        m.load_state_dict(base.state_dict())
        models[scheme] = hf.enable(m, scheme=scheme)
    for name, m in models.items():  # each model runs its own scheme
        assert m.config._attn_implementation == name, (name, m.config._attn_implementation)
    return models


def batch(args):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(3 * args.length // 4, args.length + 1, (args.batch,), generator=g)
    lengths[0] = args.length
    ids = torch.randint(5, 1000, (args.batch, args.length), generator=g)
    mask = (torch.arange(args.length)[None, :] < lengths[:, None]).long()
    labels = torch.randint(0, 2, (args.batch,), generator=g)
    return dict(input_ids=ids, attention_mask=mask, labels=labels)


def step_fn(model, inputs, backend):
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad(set_to_none=True)
        compiled(**inputs).loss.backward()
        optimizer.step()
    return step


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--schemes", default="sdpa,dnas", help="comma-separated, among " + ",".join(SCHEMES))
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--backend", default="inductor", help="torch.compile's backend (aot_eager: a quick check)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 warm-up step, 3 rounds")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    args.schemes = args.schemes.split(",")
    bad = [s for s in args.schemes if s not in SCHEMES]
    if bad or "sdpa" not in args.schemes:
        p.error(f"--schemes takes sdpa and any of {', '.join(SCHEMES[1:])}; got {','.join(args.schemes)}")
    if args.quick:
        args.layers, args.hidden, args.length, args.batch, args.warmup, args.rounds = 1, 32, 16, 2, 1, 3
    if min(args.layers, args.hidden, args.heads, args.length, args.batch, args.rounds) < 1 or args.warmup < 1:
        p.error("sizes, --rounds and --warmup must be >= 1 (the first step compiles)")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")

    models = build(args)
    inputs = batch(args)
    steps = {name: step_fn(m, inputs, args.backend) for name, m in models.items()}
    common.log(f"compiling and warming up ({args.warmup} step(s) each)")
    for _ in range(args.warmup):
        for step in steps.values():
            step()
    wall = {n: [] for n in steps}
    cpu = {n: [] for n in steps}
    with common.CpuLoad() as load:
        for _ in range(args.rounds):
            for name, step in steps.items():
                w, c = time.perf_counter(), time.process_time()
                step()
                wall[name].append(time.perf_counter() - w)
                cpu[name].append(time.process_time() - c)
    rows = {}
    for name in steps:
        rows[name] = {
            "median_s": statistics.median(wall[name]), "median_cpu_s": statistics.median(cpu[name]),
            "ratio": statistics.median(a / b for a, b in zip(wall[name], wall["sdpa"])),
            "cpu_ratio": statistics.median(a / b for a, b in zip(cpu[name], cpu["sdpa"])),
        }
        common.log(f"  {name:8s} {rows[name]['median_s'] * 1000:8.1f} ms a step  x{rows[name]['ratio']:.3f} "
                      f"(CPU time {rows[name]['median_cpu_s'] * 1000:.1f} ms, x{rows[name]['cpu_ratio']:.3f})")
    common.log(f"other processes took {load.foreign_fraction:.0%} of the CPU meanwhile")
    result = {"machine": common.machine(), "settings": vars(args), "threads": torch.get_num_threads(),
              "foreign_cpu_fraction": load.foreign_fraction, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
