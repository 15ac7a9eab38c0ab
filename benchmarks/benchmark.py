#!/usr/bin/env python
"""Cost of DNAS/HNAS next to fairseq's own attention, measured in one run.

Sections (all timings are medians over interleaved rounds after warm-up;
ratios are to fairseq's ``MultiheadAttention`` or ``transformer`` measured in
the same rounds):

module    attention module forward+backward (training mode) at hidden 768,
          12 heads and 128 / 512 / 2048 / 4096 positions with about 4096
          tokens per batch (CPU; 16,384 on CUDA): time, peak memory, and the
          output error of the attention against the float64 reference
          (fairseq_dnas/reference.py; on CUDA measured on a float32 copy of the
          module, since half-precision outputs differ by their rounding).
          Rows: fairseq (``F.multi_head_attention_forward``, as fairseq's
          encoder runs it), unas (this plugin's module in 'unas' mode, which
          hands over to fairseq: a noise gauge), dnas, hnas, sinkhorn3 (DNAS
          with 3 Sinkhorn iterations); on CPU at 128 positions also with the
          Gigaword preset's attention dropout 0.1, on CUDA attention dropout
          0 and 0.1 at every length, for each of --dtypes (fp16, bf16).
crossover dnas/hnas forced onto the dense and the fused path from 64 to 512
          positions: where ``auto`` should switch (selection.DENSE_MAX_LEN).
model     whole-model training time per update (forward, backward, Adam step)
          and target words per second for transformer / transformer_dnas /
          transformer_hnas at the paper's Gigaword sizes (12+12 layers,
          hidden 768, 128 source and 64 target positions; synthetic tokens
          over a 30,522-type vocabulary), with the preset's attention dropout
          0.1 and with 0.
generate  beam search (beam 4) sentences per second, every hypothesis forced
          to 64 tokens so all models do the same decoder work.
kernels   the attention kernels alone (bench_kernels.py), forward+backward at
          B 8, H 16, D 64, float16, T 512-4096, dropout 0 and 0.1: wall and
          GPU-kernel time and kernels a step for SDPA and the long and
          short Triton kernels, ratios to SDPA, and the floor from operation counts
          beside them. CUDA only (on CPU: --quick under TRITON_INTERPRET=1).
          Not in the default sections: --sections kernels.

--device cuda runs every section on the GPU (timings with
``torch.cuda.synchronize()`` around each call; the model and generation in
half precision, as ``fairseq-train --fp16`` runs them; the crossover section
compares the dense and the Triton path) and checks the GPU targets of
docs/performance.md.

Peak memory is the high-water mark of PyTorch's CPU allocator during one
forward+backward, from the profiler's allocation events
(``torch.profiler.profile(profile_memory=True)``): every tensor and kernel
workspace allocated through PyTorch, above what was live before the call. It
does not see memory that MKL/oneDNN allocate on their own; RSS is not used
because glibc reuses freed blocks, which makes RSS deltas meaningless at
these sizes. With --device cuda, ``torch.cuda.max_memory_allocated`` is used
instead (only then: a CPU run on a GPU machine still measures the CPU).

Examples:
    python benchmarks/benchmark.py --quick --json /tmp/bench.json     # CI, < 1 min
    python benchmarks/benchmark.py --json bench-cpu.json               # about 30 min on 2 cores
    python benchmarks/benchmark.py --device cuda --json bench-gpu.json # H100

Exit status 0 on success, 2 for bad arguments.
"""

import argparse
import os
import sys

import torch

# The bench_* modules beside this file import as `python benchmarks/benchmark.py`
# puts this folder first on sys.path.
import bench_common as common
from bench_common import DTYPES, log, machine
from bench_kernels import kernels_section
from bench_model import generate_section, model_section
from bench_module import crossover_section, module_section
from bench_report import merge_results, render_markdown, target_report
from fairseq_dnas.analysis.files import write_json  # temporary file, then rename
from fairseq_dnas.attention import selection


def __getattr__(name):
    """The helpers of the bench_* modules as ``benchmark.X`` (e.g. DEVICE,
    peak_memory_bytes), read at the time of use: main() sets common.DEVICE."""
    import bench_model
    import bench_module
    import bench_report

    for module in (common, bench_module, bench_model, bench_report):
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module 'benchmark' has no attribute {name!r}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where everything runs (default: cpu); cuda needs a GPU")
    p.add_argument("--dtypes", help="module section input/weight dtypes, comma-separated from fp16, bf16, fp32 "
                                    "(default: fp32 on cpu, fp16,bf16 on cuda)")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and one round: checks that everything runs (CI); numbers mean nothing")
    p.add_argument("--json", metavar="OUT", help="write all results here (written to a temp file, then renamed)")
    p.add_argument("--markdown", metavar="OUT", help="also write the result tables as Markdown")
    p.add_argument("--render", metavar="JSON", nargs="+",
                   help="only print the Markdown tables of earlier --json files; with several, each section "
                        "comes from the first file that has it, and the targets are recomputed")
    p.add_argument("--sections", default="module,crossover,model,generate",
                   help="comma-separated subset of: module, crossover, model, generate, kernels "
                        "(default: module,crossover,model,generate)")
    p.add_argument("--lengths", help="module section positions (default: 128,512,2048,4096)")
    p.add_argument("--tokens", type=int, help="tokens per module batch; batch = tokens // length (default: 4096)")
    p.add_argument("--rounds", type=int, help="timed rounds per case after warm-up (default: 7; quick: 1)")
    p.add_argument("--warmup", type=int, help="untimed runs per case first (default: 2; quick: 1)")
    p.add_argument("--model-batch", type=int, help="sentences per training update (default: 8)")
    p.add_argument("--model-rounds", type=int, help="timed updates per model (default: 5)")
    p.add_argument("--gen-batch", type=int, help="sentences per beam search call (default: 8)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--sinkhorn-memory-fraction", type=float, default=0.5,
                   help="skip Sinkhorn (materialized) cases whose T x T tensors would exceed this "
                        "fraction of available memory (default: 0.5)")
    args = p.parse_args(argv)
    sections = [s for s in args.sections.split(",") if s]
    bad = set(sections) - {"module", "crossover", "model", "generate", "kernels"}
    if bad:
        p.error(f"unknown section(s) {sorted(bad)}; choose from module, crossover, model, generate, kernels")
    args.sections = sections
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here (torch.cuda.is_available() is False); "
                "run on a GPU machine or use --device cpu")
    q, gpu = args.quick, args.device == "cuda"
    args.dtypes = (args.dtypes or ("fp16,bf16" if gpu else "fp32")).split(",")
    if set(args.dtypes) - set(DTYPES):
        p.error(f"--dtypes takes {', '.join(DTYPES)}; got {','.join(args.dtypes)}")
    args.lengths = [int(x) for x in (args.lengths or ("16,48" if q else "128,512,2048,4096")).split(",")]
    defaults = dict(tokens=96 if q else (16384 if gpu else 4096), rounds=1 if q else (20 if gpu else 7),
                    warmup=1 if q else (3 if gpu else 2), model_batch=2 if q else (128 if gpu else 8),
                    model_rounds=1 if q else (10 if gpu else 5), gen_batch=2 if q else (128 if gpu else 8))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for name in ("tokens", "rounds", "model_batch", "model_rounds", "gen_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or any(t < 2 for t in args.lengths):
        p.error("--warmup must be >= 0 and every length >= 2")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        sys.stdout.write(render_markdown(merge_results(args.render)))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    common.DEVICE = torch.device(args.device)
    dim, heads = (32, 4) if args.quick else (768, 12)
    res = {"machine": machine(), "settings": {
        "device": args.device, "dtypes": args.dtypes, "quick": args.quick, "hidden": dim, "heads": heads, "lengths": args.lengths, "tokens": args.tokens,
        "rounds": args.rounds, "warmup": args.warmup, "model_batch": args.model_batch,
        "model_rounds": args.model_rounds, "gen_batch": args.gen_batch,
        "dense_max_len": selection.DENSE_MAX_LEN, "command": " ".join([sys.argv[0], *(argv or sys.argv[1:])])}}
    log(f"machine: {res['machine']['cpu']}, {res['machine']['logical_cpus']} CPUs, "
        f"{res['machine']['torch_threads']} torch threads, torch {res['machine']['torch']}")
    res["complete"] = False  # until every section has run
    sections = {"module": lambda: module_section(args, dim, heads),
                "crossover": lambda: crossover_section(args, dim, heads),
                "model": lambda: model_section(args), "generate": lambda: generate_section(args),
                "kernels": lambda: kernels_section(args)}
    for name in args.sections:
        res[name] = sections[name]()
        if args.json:  # a killed run leaves the finished sections, marked incomplete
            write_json(args.json, res)
    long_lengths = [t for t in args.lengths if t >= (2048 if not args.quick else args.lengths[-1])]
    res["targets"] = target_report(res, long_lengths)
    for t in res["targets"]:
        log(f"target {t['target']:22s} {t['measured']:.3g} (limit {t['limit']}): "
            f"{'met' if t['met'] else 'NOT met'}  [{t['where']}]")
    res["complete"] = True
    if args.json:
        write_json(args.json, res)
        log(f"wrote {args.json}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(render_markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
