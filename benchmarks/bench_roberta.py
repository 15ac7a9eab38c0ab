#!/usr/bin/env python
"""CPU cost of a masked-LM training update: roberta_dnas / roberta_hnas next
to fairseq's roberta of the same size, in one run.

One update = fairseq's masked_lm criterion forward + backward + Adam step on a
batch of --batch blocks of --length tokens (15% of them masked, as
fairseq's masked_lm task does), the same weights in the three models (HNAS:
u at --hybrid-init), attention dropout 0.1 as the recipe trains. Times are
medians over interleaved rounds after warm-up, ratios the medians of the
per-round ratio to roberta, in wall clock and in process CPU time (the
steadier one on a shared machine); peak memory is the profiler's high-water
mark of PyTorch's allocator over one update (bench_common.peak_memory_bytes).
Targets (issue 17): time 1.05x (DNAS) and 1.10x (HNAS) of roberta.

    python benchmarks/bench_roberta.py                  # the recipe's small size, a few minutes on 2 cores
    python benchmarks/bench_roberta.py --size base --batch 8
    python benchmarks/bench_roberta.py --quick          # smoke run, < 1 min
"""

import argparse
import json
import os
import sys

import torch

import bench_common as common
from bench_hf import timed_rounds  # wall and CPU time, interleaved

TARGETS = {"roberta_dnas": 1.05, "roberta_hnas": 1.10}
ARCHS = ("roberta", "roberta_dnas", "roberta_hnas")
QUICK_SIZES = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "4"]


def build(size, vocab, length, extra):
    """{arch: (model, criterion)} with the same weights; the masked_lm task."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.masked_lm import MaskedLMTask

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"wp{i}")
    d.add_symbol("<mask>")
    models = {}
    import fairseq_dnas.plugin  # noqa: F401  (--user-dir registers nothing: fairseq_dnas is already imported)

    for arch in ARCHS:
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [
            "unused-data", "--task", "masked_lm", "--criterion", "masked_lm", "--arch", f"{arch}_{size}",
            "--user-dir", common.USER_DIR, "--tokens-per-sample", str(length), "--max-positions", str(length),
            "--attention-dropout", "0.1", *extra])
        task = MaskedLMTask(args, d)
        torch.manual_seed(0)
        m = task.build_model(args)
        if models:  # the same weights as roberta (HNAS: u at its init)
            missing, unexpected = m.load_state_dict(models["roberta"][0].state_dict(), strict=False)
            if unexpected or any(not k.endswith("hybrid_logit") for k in missing):
                raise RuntimeError(f"{arch}: weights do not match roberta's ({missing}, {unexpected})")
        models[arch] = (m.train(), task.build_criterion(args))
    return models, d


def masked_batch(d, batch, length, seed=0):
    """<s> w ... </s> blocks with 15% of the inner tokens replaced by <mask>;
    targets are the original tokens there, pad elsewhere (the masked_lm task's
    form of a sample)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(d.nspecial, len(d) - 1, (batch, length), generator=g)
    tokens[:, 0], tokens[:, -1] = d.bos(), d.eos()
    masked = torch.rand(batch, length, generator=g) < 0.15
    masked[:, 0] = masked[:, -1] = False
    src = tokens.masked_fill(masked, d.index("<mask>"))
    target = tokens.masked_fill(~masked, d.pad())
    return {"net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), length)},
            "target": target, "ntokens": batch * length, "nsentences": batch}


def update(model, criterion, sample):
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)

    def reset():
        opt.zero_grad(set_to_none=True)

    def run():
        reset()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        opt.step()

    run.reset = reset
    return run


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="small", choices=("small", "base", "large"),
                   help="the roberta*_SIZE presets (small: 4 layers, 128 wide, the recipe's CPU size)")
    p.add_argument("--batch", type=int, default=32, help="blocks per update (the recipe: 32)")
    p.add_argument("--length", type=int, default=128, help="tokens per block (the recipe: 128)")
    p.add_argument("--vocab", type=int, default=8000, help="dictionary size (the recipe: 8,000 pieces)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int)
    p.add_argument("--quick", action="store_true", help="a tiny model, 1 round: a smoke run")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    extra = []
    if args.quick:
        extra, args.batch, args.length, args.vocab, args.rounds, args.warmup = QUICK_SIZES, 4, 32, 200, 1, 0
    if args.threads:
        torch.set_num_threads(args.threads)
    models, d = build(args.size, args.vocab, args.length, extra)
    sample = masked_batch(d, args.batch, args.length)
    with torch.no_grad():  # proof that the schemes run: their outputs differ from roberta's
        for m, _ in models.values():
            m.eval()
        out = {a: m(**sample["net_input"])[0] for a, (m, _) in models.items()}
        for m, _ in models.values():
            m.train()
    differs = {a: (out[a] - out["roberta"]).abs().max().item() for a in ARCHS}
    if not (differs["roberta_dnas"] > 0 and differs["roberta_hnas"] > 0):
        sys.exit(f"a DNAS/HNAS model gives roberta's output: the scheme did not run ({differs})")
    cases = {a: update(m, c, sample) for a, (m, c) in models.items()}
    common.log(f"{args.size}{' (quick)' if args.quick else ''}: {args.batch} x {args.length} tokens per update, "
               f"{args.rounds} rounds, {torch.get_num_threads()} threads")
    with common.CpuLoad() as load:
        times = timed_rounds(cases, args.warmup, args.rounds, "roberta")
    memory = {a: common.peak_memory_bytes(fn) for a, fn in cases.items()}
    rows = []
    for a in ARCHS:
        rows.append({"arch": a, "size": args.size, "batch": args.batch, "length": args.length,
                     "median_s": times[a]["median_s"], "ratio": times[a]["ratio"],
                     "cpu_median_s": times[a]["cpu_median_s"], "cpu_ratio": times[a]["cpu_ratio"],
                     "times_s": times[a]["times_s"], "peak_mib": memory[a] / 2**20,
                     "memory_ratio": memory[a] / memory["roberta"], "max_abs_diff_to_roberta": differs[a],
                     "foreign_cpu_fraction": load.foreign_fraction})
    print("\n| model | s / update | wall x roberta | CPU s | CPU x roberta | peak MiB | memory x roberta |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['median_s']:.3f} | {r['ratio']:.3f} | {r['cpu_median_s']:.3f} | "
              f"{r['cpu_ratio']:.3f} | {r['peak_mib']:.0f} | {r['memory_ratio']:.2f} |")
    print(f"(other processes used {load.foreign_fraction:.0%} of the CPU during the timing)")
    for r in rows:
        if r["arch"] in TARGETS:
            ok = r["cpu_ratio"] <= TARGETS[r["arch"]]
            print(f"target {r['arch']}: CPU time x{r['cpu_ratio']:.3f} (wall x{r['ratio']:.3f}; target "
                  f"{TARGETS[r['arch']]}): {'met' if ok else 'MISSED'}; memory x{r['memory_ratio']:.2f}")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump({"machine": common.machine(), "settings": vars(args), "rows": rows}, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
