"""The GPU figures that decide the attention defaults, in one short command.

Three parts, each a list of JSON lines on stdout (and, with --out, in
OUT/quick.jsonl, plus OUT/quick.md):

- ``exact``: every kernel configuration ``auto`` runs in half precision (the
  one-tile kernels at a ragged 128 tile for both schemes, head sizes 64 and
  128, dropout off and on; the long kernels at two ragged tiles, also with
  Sinkhorn rounds and in float32) against the float64 math, with padding,
  forward and the q, k, v (u) gradients (``selfcheck.compare``).
- ``kernels``: the kernel sets alone against SDPA, fp16, forward + backward,
  wall time and GPU-kernel time (torch.profiler), at T 64 and 128 (one-tile
  and long kernels, head sizes 64 and 128) and T 1024 (long kernels).
- ``module``: fairseq's ``MultiheadAttention`` against
  ``DNASMultiheadAttention`` on its default path, D 768, 12 heads, 16,384
  tokens a batch, left padding, fp16 and bf16, attention dropout 0 and 0.1,
  T 64 to 2048: time (CUDA events, median) and GPU-kernel time per step, and
  peak memory, each as a ratio to fairseq's.

- ``breakdown``: where the GPU time of one forward + backward goes, kernel
  by kernel: the long kernels (DNAS, HNAS) and SDPA at T 1024 (B 8, H 16,
  head size 64, fp16, the ``kernels`` part's long case), attention dropout 0
  and 0.1. Each kernel's own GPU time comes from the torch profiler (CUPTI
  records every kernel's start and end on the device, so no kernel has to
  be wrapped by hand: CUDA events only time what lies between two points the
  host records, and a forward + backward launches its 6 to 16 kernels from
  inside autograd); the mean over --breakdown-steps profiled steps, launches
  a step and each kernel's share. A total row per case sets the sum of the
  kernels beside the step's CUDA-event time (median): the difference is
  time the GPU waited for the host.

The default parts (exact, kernels, module) take about five minutes on an
H100, compilation included (``benchmarks/gpu_session.sh`` runs them as its steps);
``breakdown`` is not in the default. Needs CUDA and fairseq, except
``--dry-run``, which prints the plan of the chosen parts anywhere.

    python benchmarks/gpu_quick.py --out gpu-results            # the default parts
    python benchmarks/gpu_quick.py --parts exact,kernels
    python benchmarks/gpu_quick.py --parts breakdown --breakdown-steps 20
    python benchmarks/gpu_quick.py --parts exact,breakdown --dry-run
"""

import argparse
import collections
import json
import os
import statistics
import sys
import time
import warnings

import torch

PARTS = ("exact", "kernels", "module", "breakdown")
DEFAULT_PARTS = ("exact", "kernels", "module")
KERNEL_CASES = [(64, 64, 128, 16), (64, 128, 128, 16), (128, 128, 128, 8), (64, 1024, 8, 16)]  # (head size, T, B, H)
MODULE = dict(dim=768, heads=12, tokens=16384, lengths=(64, 128, 512, 2048), dtypes=("float16", "bfloat16"))
BREAKDOWN = dict(head_dim=64, T=1024, B=8, H=16)  # the kernels part's long case
DROPOUTS = (0.0, 0.1)


def emit(rows, **row):
    rows.append(row)
    print(json.dumps(row), flush=True)


def exact_configs():
    """Every configuration ``auto`` runs in half precision, and the long kernels'."""
    from fairseq_dnas.attention import selection, selfcheck

    configs = []
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            for scheme in ("dnas", "hnas"):
                for dropout in (False, True):
                    configs.append(selfcheck.Config("cuda", dtype, d, scheme, dropout, 1, True, False,
                                                    selection.kernel_set(1, 100, 100, d, dtype, scheme)))
    for scheme in ("dnas", "hnas"):
        for dropout in (False, True):
            configs.append(selfcheck.Config("cuda", torch.float16, 64, scheme, dropout, 1, True, False, "long"))
    configs.append(selfcheck.Config("cuda", torch.float16, 64, "dnas", False, 3, True, False, "long"))
    configs.append(selfcheck.Config("cuda", torch.float32, 64, "hnas", True, 1, True, False, "long"))
    return configs


def exact(rows):
    from fairseq_dnas.attention import selection, selfcheck

    for config in exact_configs():
        size = selfcheck.sizes(config)
        result = selfcheck.compare(config, selection.attention_function(config.kernels), **size)
        ok = result.error is None and result.forward_error <= result.forward_tol and result.grad_error <= result.grad_tol
        emit(rows, part="exact", kernels=config.kernels, dtype=str(config.dtype).replace("torch.", ""),
             head_dim=config.head_dim, scheme=config.scheme, dropout=config.dropout,
             sinkhorn_iters=config.sinkhorn_iters, length=size["length"],
             forward_error=result.forward_error, forward_tol=result.forward_tol, grad_error=result.grad_error,
             grad_name=result.grad_name, grad_tol=result.grad_tol, error=result.error, ok=bool(ok))


def gpu_ms(step):
    """(GPU-kernel milliseconds, kernels launched) of one call of ``step``."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    by_kernel = per_kernel(prof.events(), steps=1)
    return sum(ms for _, ms in by_kernel.values()), round(sum(n for n, _ in by_kernel.values()))


def event_ms(fn, rounds):
    """Median CUDA-event milliseconds of ``fn`` over ``rounds`` calls, after 3 untimed ones."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def per_kernel(events, steps, device_type=None):
    """{kernel name: (launches a step, device ms a step)} from a profiler's
    ``events()`` over ``steps`` steps, the kernels of ``device_type`` (CUDA
    by default), largest time first."""
    device_type = torch.autograd.DeviceType.CUDA if device_type is None else device_type
    totals = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.device_type == device_type:
            totals[e.name][0] += 1
            totals[e.name][1] += e.device_time / 1e3  # the profiler gives microseconds
    return dict(sorted(((name, (n / steps, ms / steps)) for name, (n, ms) in totals.items()),
                       key=lambda kv: -kv[1][1]))


def breakdown_steps(q, k, v, u, g, p):
    """{case: one forward + backward} of the breakdown: SDPA and the long kernels."""
    from fairseq_dnas.attention.triton import long

    runs = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p),
            "dnas long": lambda: long.triton_attention(q, k, v, dropout_p=p),
            "hnas long": lambda: long.triton_attention(q, k, v, hybrid_weight=u, dropout_p=p)}
    return {n: (lambda f=f, n=n: torch.autograd.grad(f(), (q, k, v, u) if n.startswith("hnas") else (q, k, v), g))
            for n, f in runs.items()}


def breakdown(rows, steps=20, rounds=30):
    from torch.profiler import ProfilerActivity, profile

    d, t, b, h = (BREAKDOWN[key] for key in ("head_dim", "T", "B", "H"))
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn((b, h, t, d), generator=gen).to("cuda", torch.float16) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    u = torch.full((h,), 0.5, device="cuda", requires_grad=True)
    for p in DROPOUTS:
        base = None
        for case, step in breakdown_steps(q, k, v, u, g, p).items():
            step_ms = event_ms(step, rounds)  # also the warm-up (compilation) before profiling
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(steps):
                    step()
                torch.cuda.synchronize()
            by_kernel = per_kernel(prof.events(), steps)
            total = sum(ms for _, ms in by_kernel.values())
            base = total if base is None else base
            shape = dict(head_dim=d, T=t, B=b, H=h, dropout=p, case=case)
            for name, (launches, ms) in by_kernel.items():
                emit(rows, part="breakdown", **shape, kernel=name, launches=round(launches, 2), gpu_ms=round(ms, 4),
                     share=round(ms / total, 3))
            emit(rows, part="breakdown", **shape, kernel="(all kernels)", launches=round(sum(
                n for n, _ in by_kernel.values()), 2), gpu_ms=round(total, 4), share=1.0, gpu_x=round(total / base, 3),
                event_ms=round(step_ms, 4), steps=steps)


def kernels(rows, rounds=30):
    from fairseq_dnas.attention.triton import long, short

    gen = torch.Generator().manual_seed(0)
    for d, t, b, h in KERNEL_CASES:
        q, k, v, g = (torch.randn((b, h, t, d), generator=gen).to("cuda", torch.float16) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        u = torch.full((h,), 0.5, device="cuda", requires_grad=True)
        for p in DROPOUTS:
            runs = {"sdpa": lambda p=p: torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=p)}
            for name, module in (("long", long), ("short", short)):
                if name == "short" and t > short.BLOCK_MAX:
                    continue
                runs[f"dnas {name}"] = lambda p=p, m=module: m.triton_attention(q, k, v, dropout_p=p)
                runs[f"hnas {name}"] = lambda p=p, m=module: m.triton_attention(q, k, v, hybrid_weight=u, dropout_p=p)
            steps = {n: (lambda f=f, n=n: torch.autograd.grad(f(), (q, k, v, u) if n.startswith("hnas") else (q, k, v), g))
                     for n, f in runs.items()}
            times = {n: [] for n in steps}
            for _ in range(3):
                for step in steps.values():
                    step()
            for _ in range(rounds):  # interleaved: drift hits every case alike
                for n, step in steps.items():
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    step()
                    torch.cuda.synchronize()
                    times[n].append((time.perf_counter() - start) * 1e3)
            base_wall = statistics.median(times["sdpa"])
            base_gpu, _ = gpu_ms(steps["sdpa"])
            for n, step in steps.items():
                wall = statistics.median(times[n])
                gpu, launched = gpu_ms(step)
                emit(rows, part="kernels", head_dim=d, T=t, B=b, H=h, dropout=p, case=n, wall_ms=round(wall, 4),
                     wall_x=round(wall / base_wall, 3), gpu_ms=round(gpu, 4), gpu_x=round(gpu / base_gpu, 3),
                     launches=launched)


def module(rows, rounds=15, lengths=MODULE["lengths"]):
    from fairseq.modules import MultiheadAttention

    from fairseq_dnas.attention import selection, selfcheck
    from fairseq_dnas.modules import DNASMultiheadAttention

    os.environ["FAIRSEQ_DNAS_TRITON_CHECK"] = "0"  # part exact checks the kernels; here every call runs them
    warnings.simplefilter("error", selfcheck.TritonFallbackWarning)  # a fallback is a failure here
    dim, heads, tokens = MODULE["dim"], MODULE["heads"], MODULE["tokens"]

    def peak_mib(fn):
        fn()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    for dtype_name in MODULE["dtypes"]:
        dtype = getattr(torch, dtype_name)
        for dropout in DROPOUTS:
            base = MultiheadAttention(dim, heads, dropout=dropout, self_attention=True)
            mods = {"fairseq": base}
            for scheme in ("dnas", "hnas"):
                m = DNASMultiheadAttention(dim, heads, dropout=dropout, scheme=scheme, hybrid_init=0.1)
                m.load_state_dict(base.state_dict(), strict=False)
                mods[scheme] = m
            mods = {name: m.to("cuda", dtype).train() for name, m in mods.items()}
            for t in lengths:
                b = max(1, tokens // t)
                gen = torch.Generator().manual_seed(0)
                real = torch.randint(3 * t // 4, t + 1, (b,), generator=gen)
                real[0] = t
                mask = (torch.arange(t)[None, :] < (t - real)[:, None]).to("cuda")
                x = torch.randn(t, b, dim, generator=gen).to("cuda", dtype).requires_grad_()
                gy = torch.randn_like(x)
                row = dict(part="module", dtype=dtype_name, dropout=dropout, T=t, B=b)
                for name, m in mods.items():
                    def step(m=m):
                        x.grad = None
                        m.zero_grad(set_to_none=True)
                        out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
                        out.backward(gy)

                    row[f"{name}_ms"] = round(event_ms(step, rounds), 4)
                    row[f"{name}_gpu_ms"] = round(gpu_ms(step)[0], 4)
                    row[f"{name}_mib"] = round(peak_mib(step), 1)
                    if name != "fairseq":
                        row[f"{name}_kernels"] = selection.kernel_set(1, t, t, dim // heads, dtype, name)
                for name in ("dnas", "hnas"):
                    row[f"{name}_x"] = round(row[f"{name}_ms"] / row["fairseq_ms"], 3)
                    row[f"{name}_gpu_x"] = round(row[f"{name}_gpu_ms"] / row["fairseq_gpu_ms"], 3)
                    row[f"{name}_mem_x"] = round(row[f"{name}_mib"] / row["fairseq_mib"], 3)
                emit(rows, **row)
            del mods
            torch.cuda.empty_cache()


def markdown(rows) -> str:
    lines = []
    exact_rows = [r for r in rows if r["part"] == "exact"]
    if exact_rows:
        lines += ["| kernels | dtype | head size | scheme | dropout | rounds | output error (tol) | gradient error (tol) | ok |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in exact_rows:
            lines.append(f"| {r['kernels']} | {r['dtype']} | {r['head_dim']} | {r['scheme']} | {r['dropout']} | "
                         f"{r['sinkhorn_iters']} | {r['forward_error']:.1e} ({r['forward_tol']:g}) | "
                         f"{r['grad_error']:.1e} {r['grad_name']} ({r['grad_tol']:g}) | {'ok' if r['ok'] else 'FAIL'} |")
        lines.append("")
    kernel_rows = [r for r in rows if r["part"] == "kernels"]
    if kernel_rows:
        lines += ["| head size | T | B x H | dropout | case | wall ms | wall / SDPA | GPU ms | GPU / SDPA | launches |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in kernel_rows:
            lines.append(f"| {r['head_dim']} | {r['T']} | {r['B']} x {r['H']} | {r['dropout']} | {r['case']} | "
                         f"{r['wall_ms']:.3f} | {r['wall_x']:.2f} | {r['gpu_ms']:.3f} | {r['gpu_x']:.2f} | {r['launches']} |")
        lines.append("")
    module_rows = [r for r in rows if r["part"] == "module"]
    if module_rows:
        lines += ["| dtype | dropout | T | fairseq ms | DNAS x (GPU x) | HNAS x (GPU x) | memory DNAS / HNAS | kernels |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in module_rows:
            lines.append(f"| {r['dtype']} | {r['dropout']} | {r['T']} | {r['fairseq_ms']:.2f} | "
                         f"{r['dnas_x']:.2f} ({r['dnas_gpu_x']:.2f}) | {r['hnas_x']:.2f} ({r['hnas_gpu_x']:.2f}) | "
                         f"{r['dnas_mem_x']:.2f} / {r['hnas_mem_x']:.2f} | {r['dnas_kernels']}, {r['hnas_kernels']} |")
    breakdown_rows = [r for r in rows if r["part"] == "breakdown"]
    if breakdown_rows:
        lines += ["", "| T | dropout | case | kernel | launches a step | GPU ms a step | share | x SDPA (event ms) |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in breakdown_rows:
            total = f"{r['gpu_x']:.2f} ({r['event_ms']:.3f})" if "gpu_x" in r else ""
            lines.append(f"| {r['T']} | {r['dropout']} | {r['case']} | {r['kernel'][:70]} | {r['launches']:g} | "
                         f"{r['gpu_ms']:.4f} | {r['share']:.2f} | {total} |")
    return "\n".join(lines) + "\n"


def plan(parts, breakdown_steps) -> list:
    """What each chosen part will run, from the same settings the parts use
    (--dry-run prints it; it imports what the parts import, so a renamed
    module fails here too, on any machine)."""
    from fairseq.modules import MultiheadAttention  # noqa: F401  (the module part's baseline)

    from fairseq_dnas.attention.triton import long, short  # noqa: F401  (the kernels the parts time)
    from fairseq_dnas.modules import DNASMultiheadAttention  # noqa: F401

    lines = []
    for part in parts:
        if part == "exact":
            configs = exact_configs()
            lines.append(f"exact: {len(configs)} configurations against float64, forward and gradients, padding")
            lines += [f"  {c.describe()}" for c in configs]
        elif part == "kernels":
            lines.append(f"kernels: SDPA, DNAS and HNAS kernels alone, fp16, forward + backward, dropout "
                         f"{' and '.join(map(str, DROPOUTS))}")
            lines += [f"  head size {d}, T {t}, B {b}, H {h}: sdpa, long{', short' if t <= short.BLOCK_MAX else ''}"
                      for d, t, b, h in KERNEL_CASES]
        elif part == "module":
            lines.append(f"module: fairseq MultiheadAttention against DNASMultiheadAttention (dnas, hnas), "
                         f"D {MODULE['dim']}, {MODULE['heads']} heads, {MODULE['tokens']} tokens a batch, "
                         f"{' and '.join(MODULE['dtypes'])}, dropout {' and '.join(map(str, DROPOUTS))}, "
                         f"T {', '.join(map(str, MODULE['lengths']))}")
        elif part == "breakdown":
            lines.append(f"breakdown: GPU time of each kernel in one forward + backward, torch profiler over "
                         f"{breakdown_steps} steps; sdpa, dnas long, hnas long; head size {BREAKDOWN['head_dim']}, "
                         f"T {BREAKDOWN['T']}, B {BREAKDOWN['B']}, H {BREAKDOWN['H']}, fp16, dropout "
                         f"{' and '.join(map(str, DROPOUTS))}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                        help=f"comma-separated, from {', '.join(PARTS)} (default {','.join(DEFAULT_PARTS)})")
    parser.add_argument("--breakdown-steps", type=int, default=20, metavar="N",
                        help="breakdown: profiled steps per case, averaged (default 20)")
    parser.add_argument("--out", help="folder for quick.jsonl and quick.md (created)")
    parser.add_argument("--dry-run", action="store_true", help="print what the chosen parts would run and exit "
                                                                "(no GPU needed)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"unknown part(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(PARTS)}")
    if args.breakdown_steps < 1:
        parser.error(f"--breakdown-steps takes a positive number of steps; got {args.breakdown_steps}")
    if args.dry_run:
        print("\n".join(plan(parts, args.breakdown_steps)))
        return 0
    if not torch.cuda.is_available():
        print("gpu_quick.py: torch sees no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    rows = []
    emit(rows, part="device", name=torch.cuda.get_device_name(), torch=torch.__version__)
    failed = False
    for part in parts:
        start = time.time()
        if part == "breakdown":
            breakdown(rows, steps=args.breakdown_steps)
        else:
            {"exact": exact, "kernels": kernels, "module": module}[part](rows)
        emit(rows, part=f"{part} done", seconds=round(time.time() - start, 1))
    failed = any(r["part"] == "exact" and not r["ok"] for r in rows)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        for name, text in (("quick.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("quick.md", markdown(rows))):
            tmp = os.path.join(args.out, name + ".tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(args.out, name))
    if failed:
        print("gpu_quick.py: some kernel configuration disagrees with float64 (rows with ok false)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
