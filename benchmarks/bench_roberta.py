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
The project's targets: time 1.05x (DNAS) and 1.10x (HNAS) of roberta.

``--discrete``: the discrete classifiers of J. Kinley (2020) instead, at the
thesis's size (Section 5.3: 6 layers, 64 wide, FFN 128, 4 heads) unless
--size says otherwise: ``roberta``, ``roberta_two_stream`` (soft),
``roberta_discrete_single`` and ``roberta_discrete``, one training step
each (the sentence_prediction criterion's forward + backward, 2 classes,
no optimizer step) on a batch of --batch sentences of --length tokens
(default 32 x 100). The discrete models hold the weights of their soft
counterparts (roberta, roberta_two_stream). Ratios: to roberta, and for
roberta_discrete also to the soft two-stream model (the median of the
per-round ratios). The targets: single-stream discrete <= 1.15x of
roberta, two-stream discrete <= 1.1x of the soft two-stream model.

    python benchmarks/bench_roberta.py                  # the recipe's small size, a few minutes on 2 cores
    python benchmarks/bench_roberta.py --size base --batch 8
    python benchmarks/bench_roberta.py --quick          # smoke run, < 1 min
    OMP_NUM_THREADS=1 python benchmarks/bench_roberta.py --discrete --threads 1 --rounds 15   # about 3 min
    python benchmarks/bench_roberta.py --device cuda --size base --length 512 --batch 16 --rounds 10

``--device cuda`` runs the models on the GPU in float16 (as fairseq-train
--fp16 runs them; the Adam step, fused, on the float16 weights), the DNAS/HNAS
attention on its default CUDA path, where a fallback to another path is an
error; the time is wall clock with the GPU synchronized around each update,
and the targets read the wall-clock ratio (the process's CPU time says
nothing about GPU work); peak memory is the CUDA allocator's high-water mark.
The Gumbel noise's CPU timing of --discrete is left out there.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

import bench_common as common
from bench_discrete import set_device  # --device: common.DEVICE; cuda without a GPU is a usage error
from bench_hf import timed_rounds  # wall and CPU time, interleaved

TARGETS = {"roberta_dnas": 1.05, "roberta_hnas": 1.10}
ARCHS = ("roberta", "roberta_dnas", "roberta_hnas")
# --discrete: model -> (arch, the model whose weights it takes, the baseline of its target, target)
DISCRETE = {
    "roberta": ("roberta", None, None, None),
    "roberta_two_stream": ("roberta_two_stream", None, None, None),
    "roberta_discrete_single": ("roberta_discrete_single", "roberta", "roberta", 1.15),
    "roberta_discrete": ("roberta_discrete", "roberta_two_stream", "roberta_two_stream", 1.10),
}
QUICK_SIZES = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--encoder-attention-heads", "4"]


def on_device(model):
    """The model on --device: float16 on CUDA (as fairseq-train --fp16 runs it), float32 on CPU."""
    model = model.to(common.DEVICE)
    return model.half() if common.DEVICE.type == "cuda" else model


def to_device(sample):
    """A batch's tensors on --device."""
    if isinstance(sample, dict):
        return {k: to_device(v) for k, v in sample.items()}
    return sample.to(common.DEVICE) if torch.is_tensor(sample) else sample


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
        models[arch] = (on_device(m).train(), task.build_criterion(args))
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
    return to_device({"net_input": {"src_tokens": src, "src_lengths": torch.full((batch,), length)},
                      "target": target, "ntokens": batch * length, "nsentences": batch})


def update(model, criterion, sample):
    # On CUDA the fused Adam: it computes in float32 on float16 weights (the unfused one adds eps = 1e-8 in
    # float16, where it is 0, and a weight without gradient becomes 0 / 0).
    opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=common.DEVICE.type == "cuda")

    def reset():
        opt.zero_grad(set_to_none=True)

    def run():
        reset()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        opt.step()

    run.reset = reset
    return run


def build_classifiers(size, vocab, length, extra):
    """{name: (model, criterion)} of ``DISCRETE`` for the sentence_prediction
    task (2 classes), each discrete model with its soft counterpart's weights."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.sentence_prediction import SentencePredictionTask

    import fairseq_dnas.plugin  # noqa: F401

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"wp{i}")
    labels = Dictionary()
    for label in ("0", "1"):
        labels.add_symbol(label)
    models = {}
    for name, (arch, weights_of, _, _) in DISCRETE.items():
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser, [
            "unused-data", "--task", "sentence_prediction", "--criterion", "sentence_prediction",
            "--num-classes", "2", "--arch", f"{arch}_{size}", "--user-dir", common.USER_DIR,
            "--max-positions", str(max(length, 128)), "--attention-dropout", "0.1", *extra])
        task = SentencePredictionTask(args, d, labels)
        torch.manual_seed(0)
        m = task.build_model(args)
        if weights_of is not None:  # the same parameters, so the same numbers as the soft model
            m.load_state_dict(models[weights_of][0].state_dict(), strict=True)
        models[name] = (on_device(m).train(), task.build_criterion(args))
    return models, d


def classification_batch(d, batch, length, min_length, seed=0):
    """<s> w ... </s> sentences of min_length..length tokens, right-padded to
    ``length`` (fairseq's sentence_prediction batches), random 0/1 labels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, length + 1, (batch,), generator=g)
    tokens = torch.randint(d.nspecial, len(d), (batch, length), generator=g)
    tokens[:, 0] = d.bos()
    for b, n in enumerate(lengths.tolist()):
        tokens[b, n - 1] = d.eos()
        tokens[b, n:] = d.pad()
    return to_device({"net_input": {"src_tokens": tokens, "src_lengths": lengths},
                      "target": torch.randint(0, 2, (batch,), generator=g), "ntokens": int(lengths.sum()),
                      "nsentences": batch})


def train_step(model, criterion, sample):
    """The criterion's forward and the backward (the timed training step: no optimizer step)."""

    def reset():
        model.zero_grad(set_to_none=True)

    def run():
        reset()
        loss, _, _ = criterion(model, sample)
        loss.backward()

    run.reset = reset
    return run


def measured():
    """(the timing key the targets read, its name): process CPU time on CPU,
    wall clock on CUDA (the CPU time of a GPU run is the host's, not the work's)."""
    return ("cpu", "CPU time") if common.DEVICE.type == "cpu" else ("wall", "wall time")


def per_round_ratio(times, name, baseline):
    """Median over rounds of name's time / baseline's in the same round (the measure of ``measured``)."""
    key = "cpu_times_s" if measured()[0] == "cpu" else "times_s"
    return statistics.median(a / b for a, b in zip(times[name][key], times[baseline][key]))


def noise_times(shape, rounds=25):
    """Median process CPU ms to draw float32 Gumbel noise of ``shape`` (one
    thread's share of a training step's layer), interleaved: the chains this
    project has used, and the draw of E = -log U alone (the two-stream path)."""
    from fairseq_dnas.attention import gumbel_noise as D

    cases = {  # name -> a call that returns the noise
        "exponential_ then -log (until 2026-11-27)":
            lambda: torch.empty(shape).exponential_().clamp_(D.E_LOW, D.E_HIGH).log_().neg_(),
        "uniform_ then -log(-log U)": lambda: D.gumbel_from_uniform(torch.empty(shape).uniform_()),
        "gumbel_noise (this tree)": lambda: D.gumbel_noise(shape),
    }
    if hasattr(D, "exponential_noise"):  # (not in trees before 2026-11-27)
        cases["exponential_noise, E only (this tree)"] = lambda: D.exponential_noise(shape)
    times = {n: [] for n in cases}
    for fn in cases.values():
        fn()
    for _ in range(rounds):
        for name, fn in cases.items():
            c = time.process_time()
            fn()
            times[name].append(time.process_time() - c)
    return {n: 1e3 * statistics.median(t) for n, t in times.items()}


def discrete_main(args, extra):
    size = args.size or "thesis"
    models, d = build_classifiers(size, args.vocab, args.length, extra)
    sample = classification_batch(d, args.batch, args.length, args.min_length or args.length)
    with torch.no_grad():  # proof that the discrete schemes run: their eval outputs differ from the soft ones'
        out = {}
        for name, (m, _) in models.items():
            m.eval()
            out[name] = m(**sample["net_input"], features_only=True,
                          classification_head_name="sentence_classification_head")[0]
            m.train()
    differs = {name: 0.0 if w is None else (out[name] - out[w]).abs().max().item()
               for name, (_, w, _, _) in DISCRETE.items()}
    if not all(differs[n] > 0 for n, (_, w, _, _) in DISCRETE.items() if w is not None):
        sys.exit(f"a discrete model gives its soft model's output: the sampling did not run ({differs})")
    cases = {name: train_step(m, c, sample) for name, (m, c) in models.items()}
    common.log(f"{size}{' (quick)' if args.quick else ''}: training step (forward + backward), "
               f"{args.batch} x {args.length} tokens ({sample['ntokens']} real), {args.rounds} rounds, "
               f"{torch.get_num_threads()} threads")
    with common.CpuLoad() as load:
        times = timed_rounds(cases, args.warmup, args.rounds, "roberta")
    rows = []
    for name, (arch, weights_of, baseline, target) in DISCRETE.items():
        t = times[name]
        row = {"arch": f"{arch}_{size}", "model": name, "batch": args.batch, "length": args.length,
               "tokens": sample["ntokens"], "median_s": t["median_s"], "ratio": t["ratio"],
               "cpu_median_s": t["cpu_median_s"], "cpu_ratio": t["cpu_ratio"], "cpu_times_s": t["cpu_times_s"],
               "times_s": t["times_s"], "max_abs_diff_to_soft": differs[name],
               "foreign_cpu_fraction": load.foreign_fraction, "measure": measured()[0]}
        if target is not None:
            row.update(target=target, target_baseline=baseline,
                       ratio_to_target_baseline=per_round_ratio(times, name, baseline))
        rows.append(row)
    print(f"\n| model | CPU s / step | CPU x roberta | {measured()[1]} x target's baseline (target) | wall s | "
          f"wall x roberta |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        tgt = (f"{r['ratio_to_target_baseline']:.3f} x {r['target_baseline']} (<= {r['target']})"
               if "target" in r else "")
        print(f"| {r['arch']} | {r['cpu_median_s']:.3f} | {r['cpu_ratio']:.3f} | {tgt} | "
              f"{r['median_s']:.3f} | {r['ratio']:.3f} |")
    print(f"(other processes used {load.foreign_fraction:.0%} of the CPU during the timing)")
    if common.DEVICE.type == "cpu":  # the noise draw in process CPU time: a figure of CPU runs only
        shape = (args.batch, models["roberta"][0].args.encoder_attention_heads, args.length, args.length)
        noise = noise_times(shape)
        print(f"\nGumbel noise of shape {shape}, median CPU ms:")
        for name, ms in noise.items():
            print(f"  {name:42s} {ms:7.2f}")
        rows.append({"noise_shape": list(shape), "noise_cpu_ms": noise})
    for r in rows:
        if "target" in r:
            ok = r["ratio_to_target_baseline"] <= r["target"]
            print(f"target {r['model']}: {measured()[1]} x{r['ratio_to_target_baseline']:.3f} of "
                  f"{r['target_baseline']} (target {r['target']}): {'met' if ok else 'MISSED'}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=("small", "base", "large", "thesis"),
                   help="the roberta*_SIZE presets (small: 4 layers, 128 wide, the recipe's CPU size; "
                        "thesis: 6 layers, 64 wide); default small, with --discrete thesis")
    p.add_argument("--discrete", action="store_true",
                   help="the discrete classifiers (roberta, roberta_two_stream, roberta_discrete_single, "
                        "roberta_discrete): a sentence_prediction training step")
    p.add_argument("--batch", type=int, default=32, help="blocks per update (the recipe: 32)")
    p.add_argument("--length", type=int, help="tokens per block (default: the recipe's 128; with --discrete 100)")
    p.add_argument("--min-length", type=int,
                   help="--discrete: the shortest sentence (lengths uniform in [MIN, LENGTH], padded); "
                        "default LENGTH, no padding")
    p.add_argument("--vocab", type=int, default=8000, help="dictionary size (the recipe: 8,000 pieces)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int)
    p.add_argument("--quick", action="store_true",
                   help="a tiny model (the --size preset's names, 2 layers 32 wide), 4 blocks of --length "
                        "(default 32) tokens, 1 round: a smoke run")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the models run (default cpu); cuda runs them in float16")
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    for name in ("batch", "length", "vocab", "rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} takes a positive number; got {getattr(args, name)}")
    set_device(p, args)
    extra = []
    if args.quick:
        extra, args.batch, args.vocab, args.rounds, args.warmup = QUICK_SIZES, 4, 200, 1, 0
        args.length = args.length or 32
        args.min_length = min(24, args.length)  # --discrete: some padding, so the masks run too
    if args.length is None:
        args.length = 100 if args.discrete else 128
    if args.threads:
        torch.set_num_threads(args.threads)
    if common.DEVICE.type == "cuda":  # the default CUDA path or nothing: a fallback would time another path
        from fairseq_dnas.attention import selfcheck

        warnings.simplefilter("error", selfcheck.TritonFallbackWarning)
    if args.discrete:
        rows = discrete_main(args, extra)
        if args.json:
            write_json(args.json, args, rows)
        return
    args.size = args.size or "small"
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
                     "foreign_cpu_fraction": load.foreign_fraction, "measure": measured()[0]})
    print("\n| model | s / update | wall x roberta | CPU s | CPU x roberta | peak MiB | memory x roberta |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['median_s']:.3f} | {r['ratio']:.3f} | {r['cpu_median_s']:.3f} | "
              f"{r['cpu_ratio']:.3f} | {r['peak_mib']:.0f} | {r['memory_ratio']:.2f} |")
    print(f"(other processes used {load.foreign_fraction:.0%} of the CPU during the timing)")
    key, what = measured()
    for r in rows:
        if r["arch"] in TARGETS:
            ratio = r["cpu_ratio"] if key == "cpu" else r["ratio"]
            ok = ratio <= TARGETS[r["arch"]]
            print(f"target {r['arch']}: {what} x{ratio:.3f} (wall x{r['ratio']:.3f}, CPU x{r['cpu_ratio']:.3f}; "
                  f"target {TARGETS[r['arch']]}): {'met' if ok else 'MISSED'}; memory x{r['memory_ratio']:.2f}")
    if args.json:
        write_json(args.json, args, rows)


def write_json(path, args, rows):
    with open(path + ".tmp", "w") as f:
        json.dump({"machine": common.machine(), "settings": vars(args), "rows": rows}, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
