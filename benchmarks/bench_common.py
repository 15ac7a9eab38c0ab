"""benchmarks/benchmark.py's measuring: the device, timed rounds, peak
memory, the load of other processes, the machine's description, and the
settings every section shares."""

import contextlib
import os
import platform
import resource
import statistics
import time

import torch

from fairseq_dnas.attention import kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USER_DIR = os.path.join(ROOT, "fairseq_dnas")
SCHEME_CASES = {  # case name -> (scheme, sinkhorn_iters)
    "unas": ("unas", 1),
    "dnas": ("dnas", 1),
    "hnas": ("hnas", 1),
    "sinkhorn3": ("dnas", 3),
}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}



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
        "triton": triton_version(), "cuda_version": torch.version.cuda,
        "platform": platform.platform(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "triton_tiles": triton_tiles(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def triton_version():
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def triton_tiles():
    """The Triton path's tiles in effect (built in, or FAIRSEQ_DNAS_TRITON_TILES's file)."""
    try:
        from fairseq_dnas.attention.triton import tiles as triton_common
    except ImportError:
        return None
    tiles = {f"{kind}:{d}": {n: list(t) for n, t in entry.items()}
             for (kind, d), entry in triton_common.GPU_TILES.items()}
    return {"file": os.environ.get(triton_common.TILES_ENV) or None, "tiles": tiles}


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
