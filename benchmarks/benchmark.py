#!/usr/bin/env python
"""Cost of DNAS/HNAS next to fairseq's own attention, measured in one run.

Sections (all timings are medians over interleaved rounds after warm-up;
ratios are to fairseq's ``MultiheadAttention`` or ``transformer`` measured in
the same rounds):

module    attention module forward+backward (training mode) at hidden 768,
          12 heads and 128 / 512 / 2048 / 4096 positions with about 4096
          tokens per batch (CPU; 16,384 on CUDA): time, peak memory, and the
          output error of the attention against the float64 reference
          (tests/reference.py; on CUDA measured on a float32 copy of the
          module, since half-precision outputs differ by their rounding).
          Rows: fairseq (``F.multi_head_attention_forward``, as fairseq's
          encoder runs it), unas (this plugin's module in 'unas' mode, which
          hands over to fairseq: a noise gauge), dnas, hnas, sinkhorn3 (DNAS
          with 3 Sinkhorn iterations); on CPU at 128 positions also with the
          Gigaword preset's attention dropout 0.1, on CUDA attention dropout
          0 and 0.1 at every length, for each of --dtypes (fp16, bf16).
crossover dnas/hnas forced onto the dense and the fused path from 64 to 512
          positions: where ``auto`` should switch (kernels.DENSE_MAX_LEN).
model     whole-model training time per update (forward, backward, Adam step)
          and target words per second for transformer / transformer_dnas /
          transformer_hnas at the paper's Gigaword sizes (12+12 layers,
          hidden 768, 128 source and 64 target positions; synthetic tokens
          over a 30,522-type vocabulary), with the preset's attention dropout
          0.1 and with 0.
generate  beam search (beam 4) sentences per second, every hypothesis forced
          to 64 tokens so all models do the same decoder work.

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
import contextlib
import copy
import json
import os
import platform
import resource
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # reference.py: the float64 Algorithm 1

from fairseq_dnas.analysis.files import write_json  # noqa: E402  (temporary file, then rename)
from fairseq_dnas.attention import kernels  # noqa: E402

USER_DIR = os.path.join(ROOT, "fairseq_dnas")
SCHEME_CASES = {  # case name -> (scheme, sinkhorn_iters)
    "unas": ("unas", 1),
    "dnas": ("dnas", 1),
    "hnas": ("hnas", 1),
    "sinkhorn3": ("dnas", 3),
}
TARGETS = {
    "module_128_dnas_time": 1.3,
    "module_128_hnas_time": 1.6,
    "model_dnas_time": 1.03,
    "model_hnas_time": 1.05,
    "long_dnas_memory": 1.2,
    "long_hnas_memory": 1.2,
    "long_exact": 1e-5,
}
# The GPU issue's targets (H100, against fairseq in the same run): every
# length, dropout and dtype of the module section.
CUDA_TARGETS = {
    "module_dnas_time": 1.5,
    "module_hnas_time": 2.0,
    "module_dnas_memory": 1.2,
    "module_hnas_memory": 1.2,
    "exact_float32": 1e-5,
    "model_dnas_time": 1.03,
    "model_hnas_time": 1.05,
    "generate_dnas_time": 1.03,
    "generate_hnas_time": 1.03,
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


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
                   help="comma-separated subset of: module, crossover, model, generate (default: all)")
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
    bad = set(sections) - {"module", "crossover", "model", "generate"}
    if bad:
        p.error(f"unknown section(s) {sorted(bad)}; choose from module, crossover, model, generate")
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


# --- measuring -----------------------------------------------------------------


def log(msg):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def machine():
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        cpu = names[0] if names else cpu
    mem = None
    with contextlib.suppress(OSError):
        with open("/proc/meminfo") as f:
            mem = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemTotal"))
    import fairseq

    return {
        "cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "memory_gib": None if mem is None else round(mem / 2**30, 1),
        "torch": torch.__version__, "fairseq": fairseq.__version__, "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "triton_tiles": triton_tiles(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def triton_tiles():
    """The Triton path's tiles in effect (built in, or FAIRSEQ_DNAS_TRITON_TILES's file)."""
    try:
        from fairseq_dnas.attention import triton_flash
    except ImportError:
        return None
    tiles = {f"{kind}:{d}": {n: list(t) for n, t in entry.items()}
             for (kind, d), entry in triton_flash.GPU_TILES.items()}
    return {"file": os.environ.get(triton_flash.TILES_ENV) or None, "tiles": tiles}


class CpuLoad:
    """CPU time used by other processes while a section ran, as a fraction of
    all cores: the benchmark is only as clean as this is small."""

    @staticmethod
    def _busy():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        idle = v[3] + (v[4] if len(v) > 4 else 0)
        return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self.t, self.busy = time.perf_counter(), self._busy()
        r = resource.getrusage(resource.RUSAGE_SELF)
        self.own = r.ru_utime + r.ru_stime
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t
        r = resource.getrusage(resource.RUSAGE_SELF)
        foreign = (self._busy() - self.busy) - (r.ru_utime + r.ru_stime - self.own)
        self.foreign_fraction = max(0.0, foreign) / (wall * os.cpu_count())
        self.wall_s = wall


DEVICE = torch.device("cpu")  # set by main() from --device


def synchronize():
    """Wait for the GPU (no-op on CPU), so that wall-clock time covers the work."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def peak_memory_bytes(fn):
    """High-water mark of allocations (bytes above the level at the call) on
    the benchmark's device.

    ``fn.reset``, if there, runs first (outside the measurement): the
    profiler cannot credit frees of blocks allocated before it started."""
    if hasattr(fn, "reset"):
        fn.reset()
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    level = peak = 0
    for e in events:
        level += e.nbytes()
        peak = max(peak, level)
    return peak


def timed_rounds(cases, warmup, rounds, baseline):
    """Wall-clock seconds of each case, interleaved: every round runs every
    case once, starting at a different case each round. Returns per case the
    median and the median of its per-round ratio to ``baseline``."""
    names = list(cases)
    for name in names:
        for _ in range(warmup):
            cases[name]()
    times = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(i + r) % len(names)]
            synchronize()
            t = time.perf_counter()
            cases[name]()
            synchronize()
            times[name].append(time.perf_counter() - t)
    out = {}
    for n in names:
        ratios = [a / b for a, b in zip(times[n], times[baseline])]
        out[n] = {"median_s": statistics.median(times[n]), "times_s": times[n],
                  "ratio": statistics.median(ratios)}
    return out


@contextlib.contextmanager
def attention_path(path):
    """Force ``kernels.attend``'s path (None: leave the choice to 'auto')."""
    old = os.environ.get(kernels.PATH_ENV)
    if path is not None:
        os.environ[kernels.PATH_ENV] = path
    else:
        os.environ.pop(kernels.PATH_ENV, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(kernels.PATH_ENV, None)
        else:
            os.environ[kernels.PATH_ENV] = old


# --- attention module ----------------------------------------------------------


def module_batch(length, tokens, seed=0):
    """(T, B, C) input sizes: B = tokens // T sentences, left-padded, lengths
    drawn from [3T/4, T] (the first sentence full), as fairseq batches sources."""
    batch = max(1, tokens // length)
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3 * length // 4, length + 1, (batch,), generator=g)
    lengths[0] = length
    mask = torch.arange(length)[None, :] < (length - lengths)[:, None]  # True at padding (left)
    return batch, mask.to(DEVICE)


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
        m.to(device=DEVICE, dtype=dtype).train()
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
    from reference import reference_probs

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
    if DEVICE.type == "cuda":
        return torch.cuda.mem_get_info()[0]
    with contextlib.suppress(OSError, StopIteration):
        with open("/proc/meminfo") as f:
            return next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable"))
    return None


def module_settings(args):
    """(length, attention dropout, dtype name) of every module case."""
    if DEVICE.type == "cuda":
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
        q = torch.empty(batch, heads, length, dim // heads, device=DEVICE, dtype=dtype)
        sinkhorn_path = kernels.choose_path(q, sinkhorn_iters=3, dropout=dropout > 0)
        # Sinkhorn > 1 off the triton path is materialized: autograd keeps about a dozen T x T tensors.
        if (sinkhorn_path == "materialized" and avail
                and 12 * materialized_bytes(batch, heads, length) > args.sinkhorn_memory_fraction * avail):
            cases.remove("sinkhorn3")
            rows.append({"length": length, "batch": batch, "dropout": dropout, "dtype": dtype_name,
                         "case": "sinkhorn3", "skipped": "its T x T tensors would not fit in memory"})
        mods = build_modules(dim, heads, dropout, cases, dtype)
        x = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
        x.requires_grad_()
        grad = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
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
    fast = "triton" if DEVICE.type == "cuda" else "fused"
    for length in lengths:
        batch, mask = module_batch(length, args.tokens)
        mods = build_modules(dim, heads, 0.0, ["dnas", "hnas"], dtype)
        x = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
        x.requires_grad_()
        grad = torch.randn(length, batch, dim, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
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


# --- whole model -------------------------------------------------------------


def model_args(arch, extra):
    from fairseq import options

    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["unused-data", "--task", "translation", "--arch", arch, "--user-dir", USER_DIR,
                 "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", *extra])


def build_models(args, archs, extra, vocab):
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask

    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"wp{i}")
    models, task = {}, None
    for name, arch in archs.items():
        a = model_args(arch, extra)
        task = TranslationTask(a, d, d)
        torch.manual_seed(0)
        m = task.build_model(a).to(DEVICE)
        if DEVICE.type == "cuda":
            m.half()  # as fairseq-train --fp16 runs the model (its fp32 master copy lives in the optimizer)
        if models:  # the same weights as fairseq's transformer (HNAS: u at its init)
            missing, unexpected = m.load_state_dict(next(iter(models.values()))[0].state_dict(), strict=False)
            if unexpected or any(not k.endswith("hybrid_logit") for k in missing):
                raise RuntimeError(f"{arch}: weights do not match fairseq's transformer "
                                   f"(missing {missing}, unexpected {unexpected})")
        models[name] = (m, a)
    return models, task, d


def synthetic_batch(d, batch, src_len, tgt_len, seed=0):
    """Source left-padded with lengths in [src_len/2, src_len], target
    right-padded with lengths in [tgt_len/2, tgt_len], tokens uniform over
    the vocabulary (the first sentence of each side at full length)."""
    g = torch.Generator().manual_seed(seed)
    pad, eos, n = d.pad(), d.eos(), len(d)

    def lengths(full):
        ls = torch.randint(full // 2, full + 1, (batch,), generator=g)
        ls[0] = full
        return ls

    src_l, tgt_l = lengths(src_len), lengths(tgt_len)
    src = torch.full((batch, src_len), pad)
    tgt = torch.full((batch, tgt_len), pad)
    prev = torch.full((batch, tgt_len), pad)
    for i in range(batch):
        s = torch.randint(d.nspecial, n, (int(src_l[i]),), generator=g)
        s[-1] = eos
        src[i, src_len - len(s):] = s
        t = torch.randint(d.nspecial, n, (int(tgt_l[i]),), generator=g)
        t[-1] = eos
        tgt[i, :len(t)] = t
        prev[i, 0] = eos
        prev[i, 1:len(t)] = t[:-1]
    return {"net_input": {"src_tokens": src.to(DEVICE), "src_lengths": src_l.to(DEVICE),
                          "prev_output_tokens": prev.to(DEVICE)},
            "target": tgt.to(DEVICE), "ntokens": int(tgt_l.sum()), "nsentences": batch,
            "src_ntokens": int(src_l.sum())}


def model_sizes(args):
    if args.quick:
        tiny = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
                "--encoder-attention-heads", "4", "--decoder-attention-heads", "2"]
        archs = {"transformer": "transformer", "transformer_dnas": "transformer_dnas",
                 "transformer_hnas": "transformer_hnas"}
        return archs, tiny, 200, 16, 8, "tiny (2+1 layers, hidden 32)"
    archs = {"transformer": "transformer_gigaword", "transformer_dnas": "transformer_dnas_gigaword",
             "transformer_hnas": "transformer_hnas_gigaword"}
    return archs, [], 30522, 128, 64, "Gigaword preset (12+12 layers, hidden 768, 12 heads)"


def model_section(args):
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    archs, sizes, vocab, src_len, tgt_len, preset = model_sizes(args)
    rows = []
    for attn_dropout in (0.1, 0.0):
        extra = [*sizes, "--attention-dropout", str(attn_dropout)]
        models, task, d = build_models(args, archs, extra, vocab)
        sample = synthetic_batch(d, args.model_batch, src_len, tgt_len)
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
        log(f"model {preset}, attention dropout {attn_dropout}, batch {args.model_batch}: "
            f"timing {', '.join(steps)}")
        with CpuLoad() as load:
            timing = timed_rounds(steps, 1, args.model_rounds, "transformer")
        for name, t in timing.items():
            row = {"model": name, "arch": archs[name], "preset": preset, "attention_dropout": attn_dropout,
                   "batch_sentences": args.model_batch, "target_tokens": sample["ntokens"],
                   "source_tokens": sample["src_ntokens"], "median_update_s": t["median_s"],
                   "update_times_s": t["times_s"], "time_ratio": t["ratio"],
                   "target_words_per_s": sample["ntokens"] / t["median_s"],
                   "foreign_cpu": load.foreign_fraction}
            rows.append(row)
            log(f"  {name:17s} {t['median_s']:8.2f} s/update  x{t['ratio']:.3f}  "
                f"{row['target_words_per_s']:8.1f} target words/s")
        del models, steps
    return rows


def generate_section(args):
    from fairseq.sequence_generator import SequenceGenerator

    archs, sizes, vocab, src_len, tgt_len, preset = model_sizes(args)
    models, task, d = build_models(args, archs, [*sizes, "--dropout", "0"], vocab)
    sample = synthetic_batch(d, args.gen_batch, src_len, tgt_len, seed=3)
    calls = {}
    for name, (m, _) in models.items():
        m.eval()
        # min_len = max_len: every hypothesis runs the full decoder steps
        # (tgt_len - 1 tokens and </s>: the decoder's positions end at tgt_len).
        gen = SequenceGenerator([m], d, beam_size=4, max_len_a=0, max_len_b=tgt_len - 1, min_len=tgt_len - 1)

        def call(gen=gen, m=m):
            with torch.no_grad():
                gen.generate([m], sample)

        calls[name] = call
    log(f"generate {preset}, beam 4, {args.gen_batch} sentences x {tgt_len} tokens")
    with CpuLoad() as load:
        timing = timed_rounds(calls, 1, max(1, args.model_rounds - 2), "transformer")
    rows = []
    for name, t in timing.items():
        rows.append({"model": name, "arch": archs[name], "preset": preset, "sentences": args.gen_batch,
                     "median_s": t["median_s"], "sentences_per_s": args.gen_batch / t["median_s"],
                     "time_ratio": t["ratio"], "foreign_cpu": load.foreign_fraction})
        log(f"  {name:17s} {args.gen_batch / t['median_s']:7.2f} sentences/s  x{t['ratio']:.3f}")
    return rows


# --- summary -------------------------------------------------------------------


def _device(res):
    runs = [res.get("settings", {})] + res.get("runs", [])
    return "cuda" if any(r.get("device") == "cuda" for r in runs) else "cpu"


def cuda_target_report(res):
    """The GPU issue's targets: the worst case of every module setting."""
    out = []

    def add(name, measured, where):
        if measured is not None:
            limit = CUDA_TARGETS[name]
            out.append({"target": name, "limit": limit, "measured": measured, "met": measured <= limit,
                        "where": where})

    mod = [r for r in res.get("module", []) if "skipped" not in r]
    for scheme in ("dnas", "hnas"):
        rows = [r for r in mod if r["case"] == scheme]
        for key, what in (("time_ratio", "time"), ("memory_ratio", "memory")):
            if rows:
                w = max(rows, key=lambda r: r[key])
                add(f"module_{scheme}_{what}", w[key], f"worst of {len(rows)} cases: T={w['length']}, "
                    f"attention dropout {w['dropout']}, {w.get('dtype', 'fp32')}")
    errs = [r["max_abs_error"] for r in mod if "max_abs_error" in r and r["case"] in ("dnas", "hnas")]
    if errs:
        add("exact_float32", max(errs), "float32 copy of each module vs the float64 reference, every length")
    for r in res.get("model", []):
        if r["model"] != "transformer" and r["attention_dropout"] == 0.1:
            add(f"model_{r['model'].split('_')[1]}_time", r["time_ratio"], "half precision, attention dropout 0.1")
    for r in res.get("generate", []):
        if r["model"] != "transformer":
            add(f"generate_{r['model'].split('_')[1]}_time", r["time_ratio"], "beam 4, half precision")
    return out


def target_report(res, long_lengths):
    if _device(res) == "cuda":
        return cuda_target_report(res)
    out = []

    def add(name, measured, where):
        if measured is None:
            return
        target = TARGETS[name]
        out.append({"target": name, "limit": target, "measured": measured, "met": measured <= target,
                    "where": where})

    mod = [r for r in res.get("module", []) if "skipped" not in r]
    first = min((r["length"] for r in mod), default=None)
    for scheme in ("dnas", "hnas"):
        at = [r for r in mod if r["case"] == scheme and r["length"] == first and r["dropout"] == 0.0]
        if at:
            add(f"module_{128}_{scheme}_time", at[0]["time_ratio"], f"T={first}, attention dropout 0")
        longs = [r for r in mod if r["case"] == scheme and r["length"] in long_lengths]
        if longs:
            add(f"long_{scheme}_memory", max(r["memory_ratio"] for r in longs),
                "worst of T=" + ",".join(str(r["length"]) for r in longs))
    errs = [r["max_abs_error"] for r in mod if r["length"] in long_lengths and "max_abs_error" in r
            and r["case"] in ("dnas", "hnas")]
    if errs:
        add("long_exact", max(errs), "max |out - float64 reference|, dnas/hnas at the long lengths")
    for r in res.get("model", []):
        if r["model"] != "transformer" and r["attention_dropout"] == 0.1:
            add(f"model_{r['model'].split('_')[1]}_time", r["time_ratio"], "attention dropout 0.1 (preset)")
    return out


def render_markdown(res):
    """The tables of docs/performance.md from a result dict."""
    lines = []
    mod = res.get("module")
    if mod:
        lines += ["| dtype | T | batch | attn dropout | case | path | fwd+bwd ms | x fairseq | peak MiB "
                  "| x fairseq | max abs err |", "|" + " --- |" * 11]
        for r in mod:
            dt = r.get("dtype", "fp32")
            if "skipped" in r:
                lines.append(f"| {dt} | {r['length']} | {r['batch']} | {r['dropout']} | {r['case']} | - | "
                             f"skipped: {r['skipped']} | | | | |")
                continue
            err = f"{r['max_abs_error']:.1e}" if "max_abs_error" in r else "-"
            lines.append(f"| {dt} | {r['length']} | {r['batch']} | {r['dropout']} | {r['case']} | {r.get('path', '-')} "
                         f"| {r['median_ms']:.1f} | {r['time_ratio']:.2f} | {r['peak_mib']:.1f} "
                         f"| {r['memory_ratio']:.2f} | {err} |")
        lines.append("")
    cross = res.get("crossover")
    if cross:
        lengths = sorted({r["length"] for r in cross})
        cases = [c for c in dict.fromkeys(r["case"] for r in cross) if c != "fairseq"]
        lines += ["| case | " + " | ".join(f"T={t}" for t in lengths) + " |", "|" + " --- |" * (len(lengths) + 1)]
        for c in cases:
            cells = [next((f"{r['time_ratio']:.2f}" for r in cross if r["case"] == c and r["length"] == t), "-")
                     for t in lengths]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
        lines.append("")
    model = res.get("model")
    if model:
        lines += ["| model | attn dropout | s / update | x transformer | target words/s |", "|" + " --- |" * 5]
        for r in model:
            lines.append(f"| {r['model']} | {r['attention_dropout']} | {r['median_update_s']:.2f} "
                         f"| {r['time_ratio']:.3f} | {r['target_words_per_s']:.1f} |")
        lines.append("")
    gen = res.get("generate")
    if gen:
        lines += ["| model | sentences/s | time x transformer |", "|" + " --- |" * 3]
        for r in gen:
            lines.append(f"| {r['model']} | {r['sentences_per_s']:.2f} | {r['time_ratio']:.3f} |")
        lines.append("")
    if res.get("targets"):
        lines += ["| target | limit | measured | met | where |", "|" + " --- |" * 5]
        for t in res["targets"]:
            lines.append(f"| {t['target']} | {t['limit']} | {t['measured']:.3g} | {'yes' if t['met'] else 'NO'} "
                         f"| {t['where']} |")
        lines.append("")
    loads = [r["foreign_cpu"] for sec in ("module", "crossover", "model", "generate") for r in res.get(sec, [])
             if "foreign_cpu" in r]
    if loads:
        lines.append(f"CPU time of other processes during the timed rounds: {100 * min(loads):.0f}% to "
                     f"{100 * max(loads):.0f}% of the machine.")
    return "\n".join(lines) + "\n"


def merge_results(paths):
    """One result dict from --json files of runs with different --sections."""
    runs = []
    for path in paths:
        try:
            with open(path) as f:
                runs.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"benchmark: cannot read {path}: {e}")
    res = {"machine": runs[0]["machine"], "runs": [r.get("settings", {}) for r in runs]}
    for name in ("module", "crossover", "model", "generate"):
        found = next((r[name] for r in runs if r.get(name)), None)
        if found is not None:
            res[name] = found
    lengths = sorted({r["length"] for r in res.get("module", [])})
    quick = any(r.get("settings", {}).get("quick") for r in runs)
    res["targets"] = target_report(res, [t for t in lengths if t >= (2048 if not quick else lengths[-1])])
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        sys.stdout.write(render_markdown(merge_results(args.render)))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    global DEVICE
    DEVICE = torch.device(args.device)
    dim, heads = (32, 4) if args.quick else (768, 12)
    res = {"machine": machine(), "settings": {
        "device": args.device, "dtypes": args.dtypes, "quick": args.quick, "hidden": dim, "heads": heads, "lengths": args.lengths, "tokens": args.tokens,
        "rounds": args.rounds, "warmup": args.warmup, "model_batch": args.model_batch,
        "model_rounds": args.model_rounds, "gen_batch": args.gen_batch,
        "dense_max_len": kernels.DENSE_MAX_LEN, "command": " ".join([sys.argv[0], *(argv or sys.argv[1:])])}}
    log(f"machine: {res['machine']['cpu']}, {res['machine']['logical_cpus']} CPUs, "
        f"{res['machine']['torch_threads']} torch threads, torch {res['machine']['torch']}")
    res["complete"] = False  # until every section has run
    sections = {"module": lambda: module_section(args, dim, heads),
                "crossover": lambda: crossover_section(args, dim, heads),
                "model": lambda: model_section(args), "generate": lambda: generate_section(args)}
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
