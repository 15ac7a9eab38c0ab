"""The ``kernels`` section of benchmark.py: the attention kernels alone,
forward + backward, against PyTorch's scaled_dot_product_attention (SDPA:
cuDNN or FlashAttention-2 on an H100), both Triton kernel sets side by side.

B 8, H 16, D 64, float16, T 512 to 4096, attention dropout 0 and 0.1, no
padding; then short inputs, B 128, H 16 (2,048 heads a call, Gigaword's
sources), T 64 and 128, where the one-tile kernels (``triton/short.py``,
"short") run beside the long kernels (``triton/long.py``) wherever
``selection.short_max`` lets them (up to 128 in half precision). Per case: wall milliseconds a step (median over rounds,
synchronized), kernel milliseconds (the sum of the GPU kernels' own times in
one profiled step, torch.profiler), kernels a step, and both as ratios to
SDPA measured in the same run; beside them the floor that operation counts
allow (``floor``): matmuls and exponentials per score element of the
algorithm against FlashAttention-2's, an exponential weighed as 1.5 matmuls
when they do not overlap (the 1.3x / 1.5x targets for DNAS, docs/performance.md#targets). On CPU the
section runs only under Triton's interpreter with --quick (tiny sizes: it
checks that the code runs; the numbers mean nothing).
"""

import statistics
import time

import torch

import bench_common as common
from bench_common import log

SIZES = dict(batch=8, heads=16, head_dim=64, lengths=(512, 1024, 2048, 4096))
SHORT_SIZES = dict(batch=128, heads=16, head_dim=64, lengths=(64, 128))  # the one-tile kernels' inputs
QUICK = dict(batch=1, heads=1, head_dim=16, lengths=(32,))
EXP_WEIGHT = 1.5  # an exponential per score, in matmuls per score, where the two do not overlap
# (matmuls, exponentials) per score element, forward + backward
OPS = {
    "fa2": (7, 2),        # FlashAttention-2: QK^T, PV | QK^T, dO V^T, dV, dK, dQ; one exp each way
    "dnas": (9, 4),       # the lean DNAS: + the column pass (K Q^T) | + the pre-pass (QK^T, P^T dO)
    "hnas": (10, 5),      # + HNAS's second P V product and its exp in the forward
    "dnas long": (11, 4),  # triton/long.py: column (1) + forward (2) + kv (5) + q (3)
    "hnas long": (12, 7),  # + P_U V in the forward, P_U recomputed in both backward passes
    "dnas short": (8, 3),   # triton/short.py: K Q^T, S, PV | S, dO V^T, dq, dk, dv; exps: column, row | pi_D
    "hnas short": (8, 5),   # the mixture before its one PV; exps: + pi_U forward and backward
}


def floor(name: str):
    """(overlapped, serial) ratio of ``name``'s operation count to FlashAttention-2's."""
    mm, ex = OPS[name]
    fa_mm, fa_ex = OPS["fa2"]
    return mm / fa_mm, (mm + EXP_WEIGHT * ex) / (fa_mm + EXP_WEIGHT * fa_ex)


def _kernel_ms(step):
    """(GPU kernel milliseconds, kernels) of one step; (None, None) on CPU."""
    if common.DEVICE.type != "cuda":
        return None, None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / 1e3, len(kernels)


def kernels_section(args):
    """Rows: length, dropout, case (sdpa, dnas long, hnas long, and dnas
    short, hnas short where they apply), wall and kernel milliseconds,
    kernels a step, ratios to SDPA, floor."""
    from fairseq_dnas.attention import selection
    from fairseq_dnas.attention.triton import tiles as triton_common
    from fairseq_dnas.attention.triton import long, short

    if common.DEVICE.type != "cuda" and not (args.quick and triton_common.INTERPRETED):
        log("kernels: skipped (needs CUDA; on CPU only with --quick under TRITON_INTERPRET=1)")
        return [{"skipped": "needs CUDA (or --quick under TRITON_INTERPRET=1)"}]
    dtype = torch.float16
    gen = torch.Generator().manual_seed(0)
    rows = []
    for sizes, length in [(sizes, length) for sizes in ([QUICK] if args.quick else [SIZES, SHORT_SIZES])
                          for length in sizes["lengths"]]:
        shape = (sizes["batch"], sizes["heads"], length, sizes["head_dim"])
        q, k, v, grad = (torch.randn(shape, generator=gen).to(common.DEVICE, dtype) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        u = torch.full((sizes["heads"],), 0.5, device=common.DEVICE, requires_grad=True)
        for p in (0.0, 0.1):
            runs = {
                "sdpa": lambda p=p: torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p),
                "dnas long": lambda p=p: long.triton_attention(q, k, v, dropout_p=p),
                "hnas long": lambda p=p: long.triton_attention(q, k, v, hybrid_weight=u, dropout_p=p),
            }
            for scheme in ("dnas", "hnas"):  # the one-tile kernels where selection.py would run them
                if length <= selection.short_max(sizes["head_dim"], dtype, scheme):
                    runs[f"{scheme} short"] = lambda p=p, w=(u if scheme == "hnas" else None): (
                        short.triton_attention(q, k, v, hybrid_weight=w, dropout_p=p))
            inputs = {name: (q, k, v, u) if name.startswith("hnas") else (q, k, v) for name in runs}
            steps = {name: (lambda f=f, name=name: torch.autograd.grad(f(), inputs[name], grad))
                     for name, f in runs.items()}
            times = {name: [] for name in steps}
            for _ in range(args.warmup):
                for step in steps.values():
                    step()
            for _ in range(args.rounds):  # interleaved rounds: drift hits every case alike
                for name, step in steps.items():
                    common.synchronize()
                    start = time.perf_counter()
                    step()
                    common.synchronize()
                    times[name].append((time.perf_counter() - start) * 1e3)
            base_wall = statistics.median(times["sdpa"])
            base_kernel, _ = _kernel_ms(steps["sdpa"])
            for name, step in steps.items():
                wall = statistics.median(times[name])
                kernel, launched = _kernel_ms(step)
                scheme = name.split()[0]
                row = dict(length=length, dropout=p, case=name, wall_ms=wall, wall_ratio=wall / base_wall,
                           kernel_ms=kernel, kernels=launched,
                           kernel_ratio=None if kernel is None else kernel / base_kernel, **sizes)
                row.pop("lengths")
                if scheme != "sdpa":
                    row["floor"] = floor(scheme)
                    row["floor_as_built"] = floor(name)
                rows.append(row)
                kernel_text = "-" if kernel is None else f"{kernel:.3f} ms ({row['kernel_ratio']:.2f}x, {launched} kernels)"
                floor_text = ("" if scheme == "sdpa" else
                              f"  floor {row['floor'][0]:.2f}-{row['floor'][1]:.2f}x FA2")
                log(f"kernels T={length} p={p} {name:10s} wall {wall:.3f} ms ({row['wall_ratio']:.2f}x)  "
                    f"kernels {kernel_text}{floor_text}")
    return rows


def render(rows):
    """Markdown table of the section."""
    lines = ["| T | dropout | case | wall ms | x SDPA | kernel ms | x SDPA | kernels | floor x FA2 "
             "(overlap-serial) | as built |", "|" + " --- |" * 10]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| - | - | skipped: {r['skipped']} | | | | | | | |")
            continue
        kernel = "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.3f}"
        kratio = "-" if r["kernel_ratio"] is None else f"{r['kernel_ratio']:.2f}"
        fl, built = (f"{r[key][0]:.2f}-{r[key][1]:.2f}" if key in r else "-" for key in ("floor", "floor_as_built"))
        lines.append(f"| {r['length']} | {r['dropout']} | {r['case']} | {r['wall_ms']:.3f} | {r['wall_ratio']:.2f} "
                     f"| {kernel} | {kratio} | {r['kernels'] if r['kernels'] is not None else '-'} | {fl} | {built} |")
    lines.append("")
    return lines
