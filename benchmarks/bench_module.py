"""benchmarks/benchmark.py's attention-module sections: ``module`` (time,
peak memory and error of fairseq's attention and this plugin's schemes) and
``crossover`` (the dense against the fused or Triton path by length)."""

import contextlib
import copy

import torch

import bench_common as common
from bench_common import DTYPES, SCHEME_CASES, CpuLoad, attention_path, log, peak_memory_bytes, timed_rounds
from fairseq_dnas.attention import kernels


def module_batch(length, tokens, seed=0):
    """(T, B, C) input sizes: B = tokens // T sentences, left-padded, lengths
    drawn from [3T/4, T] (the first sentence full), as fairseq batches sources."""
    batch = max(1, tokens // length)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3 * length // 4, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = torch.arange(length)[None, :] < (length - lengths)[:, None]  # True at padding (left)
    return batch, mask.to(common.DEVICE)


def build_modules(dim, heads, dropout, cases, dtype=torch.float32):
    from fairseq.modules import MultiheadAttention

    from fairseq_dnas.modules import DNASMultiheadAttention

    base = MultiheadAttention(dim, heads, dropout=dropout, self_attention=True)
    mods = {"fairseq": base}
    for name in cases:
        scheme, iters = SCHEME_CASES[name]
        m = DNASMultiheadAttention(dim, heads, dropout=dropout, scheme=scheme, sinkhorn_iters=iters,
                                   hybrid_init=0.1)
        missing, unexpected = m.load_state_dict(base.state_dict(), strict=False)  # same weights
        assert not unexpected and set(missing) <= {"hybrid_logit"}, (missing, unexpected)
        mods[name] = m
    for m in mods.values():
        m.to(device=common.DEVICE, dtype=dtype).train()
    return mods


def fwd_bwd(module, x, mask, grad, path=None):
    def reset():
        module.zero_grad(set_to_none=True)
        x.grad = None

    def run():
        reset()  # frees the previous gradients before anything is allocated
        with attention_path(path):
            out, _ = module(x, x, x, key_padding_mask=mask, need_weights=False)
            out.backward(grad)

    run.reset = reset
    return run


def attention_error(module, x, mask, path=None):
    """Max |attention output - float64 Algorithm 1| over real positions, for
    the q, k, v that ``module`` computes from ``x`` (attention core only)."""
    from fairseq_dnas.reference import reference_probs

    module = copy.deepcopy(module).float()  # half-precision outputs differ by their rounding
    x = x.float()
    t, b, c = x.shape
    h, d = module.num_heads, module.head_dim
    with torch.no_grad():
        q = (module.q_proj(x) * module.scaling).view(t, b, h, d).permute(1, 2, 0, 3)
        k = module.k_proj(x).view(t, b, h, d).permute(1, 2, 0, 3)
        v = module.v_proj(x).view(t, b, h, d).permute(1, 2, 0, 3)
        u = module.hybrid_weight
        with attention_path(path):
            out, _ = kernels.attend(q, k, v, scheme=module.scheme, padding_mask=mask, hybrid_weight=u,
                                    sinkhorn_iters=module.sinkhorn_iters)
        worst = 0.0
        mask, out = mask.cpu(), out.cpu()
        for bi in range(min(b, 2)):  # one head at a time keeps the float64 T x T small
            real = ~mask[bi]
            for hi in range(h):
                qd, kd, vd = (t_[bi:bi + 1, hi:hi + 1].double().cpu() for t_ in (q, k, v))
                uh = None if u is None else u[hi:hi + 1].double().cpu()
                p = reference_probs(qd @ kd.transpose(-1, -2), module.scheme, mask[bi:bi + 1],
                                    mask[bi:bi + 1], uh, module.sinkhorn_iters)
                ref = (p @ vd)[0, 0]
                worst = max(worst, (out[bi, hi].double() - ref)[real].abs().max().item())
    return worst


def materialized_bytes(batch, heads, length):
    return batch * heads * length * length * 4


def available_bytes():
    if common.DEVICE.type == "cuda":
        return torch.cuda.mem_get_info()[0]
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/meminfo") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable"))
    return None


def module_settings(args):
    """(length, attention dropout, dtype name) of every module case."""
    if common.DEVICE.type == "cuda":
        return [(t, p, dt) for dt in args.dtypes for p in (0.0, 0.1) for t in args.lengths]
    return [(t, p, dt) for dt in args.dtypes for t, p in
            [(t, 0.0) for t in args.lengths] + [(args.lengths[0], 0.1)]]


def module_section(args, dim, heads):
    rows = []
    for length, dropout, dtype_name in module_settings(args):
        dtype = DTYPES[dtype_name]
        batch, mask = module_batch(length, args.tokens)
        cases = ["unas", "dnas", "hnas", "sinkhorn3"]
        avail = available_bytes()
        # A stand-in for the modules' per-head queries: which path each case takes.
        q = torch.empty(batch, heads, length, dim // heads, device=common.DEVICE, dtype=dtype)
        sinkhorn_path = kernels.choose_path(q, sinkhorn_iters=3, dropout=dropout > 0)
        # Sinkhorn > 1 off the triton path is materialized: autograd keeps about a dozen T x T tensors.
        if (sinkhorn_path == "materialized" and avail
                and 12 * materialized_bytes(batch, heads, length) > args.sinkhorn_memory_fraction * avail):
            cases.remove("sinkhorn3")
            rows.append({"length": length, "batch": batch, "dropout": dropout, "dtype": dtype_name,
                         "case": "sinkhorn3", "skipped": "its T x T tensors would not fit in memory"})
        mods = build_modules(dim, heads, dropout, cases, dtype)
        x = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(1)).to(common.DEVICE, dtype)
        x.requires_grad_()
        grad = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(2)).to(common.DEVICE, dtype)
        runs = {n: fwd_bwd(m, x, mask, grad) for n, m in mods.items()}
        log(f"module T={length} B={batch} dropout={dropout} {dtype_name}: timing {', '.join(runs)}")
        with CpuLoad() as load:
            timing = timed_rounds(runs, args.warmup, args.rounds, "fairseq")
        mem = {n: peak_memory_bytes(run) for n, run in runs.items()}
        for name in runs:
            row = {"length": length, "batch": batch, "dropout": dropout, "dtype": dtype_name, "case": name,
                   "median_ms": 1e3 * timing[name]["median_s"], "time_ratio": timing[name]["ratio"],
                   "times_ms": [1e3 * t for t in timing[name]["times_s"]],
                   "peak_mib": mem[name] / 2**20, "memory_ratio": mem[name] / mem["fairseq"],
                   "foreign_cpu": load.foreign_fraction}
            if name != "fairseq":
                m = mods[name]
                row["path"] = "fairseq" if m.scheme == "unas" else kernels.choose_path(
                    q, sinkhorn_iters=m.sinkhorn_iters, dropout=kernels.dropout_active(m.dropout_module))
                if m.scheme != "unas" and dropout == 0.0:
                    row["max_abs_error"] = attention_error(m.eval(), x.detach(), mask)
                    m.train()
            rows.append(row)
            log(f"  {name:9s} {row['median_ms']:9.1f} ms  x{row['time_ratio']:.2f}  "
                f"peak {row['peak_mib']:8.1f} MiB  x{row['memory_ratio']:.2f}  "
                f"err {row.get('max_abs_error', float('nan')):.1e}  ({row.get('path', '')})")
        del mods, runs
    return rows


def crossover_section(args, dim, heads):
    rows = []
    lengths = [16, 32] if args.quick else [64, 128, 192, 256, 384, 512]
    dtype = DTYPES[args.dtypes[0]]
    fast = "triton" if common.DEVICE.type == "cuda" else "fused"
    for length in lengths:
        batch, mask = module_batch(length, args.tokens)
        mods = build_modules(dim, heads, 0.0, ["dnas", "hnas"], dtype)
        x = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(1)).to(common.DEVICE, dtype)
        x.requires_grad_()
        grad = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(2)).to(common.DEVICE, dtype)
        runs = {"fairseq": fwd_bwd(mods["fairseq"], x, mask, grad)}
        for scheme in ("dnas", "hnas"):
            for path in ("dense", fast):
                runs[f"{scheme}-{path}"] = fwd_bwd(mods[scheme], x, mask, grad, path)
        log(f"crossover T={length} B={batch}")
        with CpuLoad() as load:
            timing = timed_rounds(runs, args.warmup, args.rounds, "fairseq")
        for name, t in timing.items():
            rows.append({"length": length, "batch": batch, "case": name, "median_ms": 1e3 * t["median_s"],
                         "time_ratio": t["ratio"], "foreign_cpu": load.foreign_fraction})
            log(f"  {name:11s} {1e3 * t['median_s']:9.1f} ms  x{t['ratio']:.2f}")
    return rows
