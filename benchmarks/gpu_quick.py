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

About five minutes on an H100, compilation included
(``benchmarks/gpu_measure.sh``'s default step). Needs CUDA and fairseq.

    python benchmarks/gpu_quick.py --out gpu-results            # all parts
    python benchmarks/gpu_quick.py --parts exact,kernels
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

PARTS = ("exact", "kernels", "module")


def emit(rows, **row):
    rows.append(row)
    print(json.dumps(row), flush=True)


def exact(rows):
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
    for config in configs:
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
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in events) / 1e3, len(events)


def kernels(rows, rounds=30):
    from fairseq_dnas.attention.triton import long, short

    gen = torch.Generator().manual_seed(0)
    cases = [(64, 64, 128, 16), (64, 128, 128, 16), (128, 128, 128, 8), (64, 1024, 8, 16)]
    for d, t, b, h in cases:
        q, k, v, g = (torch.randn((b, h, t, d), generator=gen).to("cuda", torch.float16) for _ in range(4))
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        u = torch.full((h,), 0.5, device="cuda", requires_grad=True)
        for p in (0.0, 0.1):
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


def module(rows, rounds=15, lengths=(64, 128, 512, 2048)):
    from fairseq.modules import MultiheadAttention

    from fairseq_dnas.attention import selection, selfcheck
    from fairseq_dnas.modules import DNASMultiheadAttention

    os.environ["FAIRSEQ_DNAS_TRITON_CHECK"] = "0"  # part exact checks the kernels; here every call runs them
    warnings.simplefilter("error", selfcheck.TritonFallbackWarning)  # a fallback is a failure here
    dim, heads, tokens = 768, 12, 16384

    def timed(fn):
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

    def peak_mib(fn):
        fn()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20

    for dtype_name in ("float16", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        for dropout in (0.0, 0.1):
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

                    row[f"{name}_ms"] = round(timed(step), 4)
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
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {', '.join(PARTS)}")
    parser.add_argument("--out", help="folder for quick.jsonl and quick.md (created)")
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if not torch.cuda.is_available():
        print("gpu_quick.py: torch sees no CUDA device; run it on a GPU machine", file=sys.stderr)
        return 2
    rows = []
    emit(rows, part="device", name=torch.cuda.get_device_name(), torch=torch.__version__)
    failed = False
    for part in parts:
        start = time.time()
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
