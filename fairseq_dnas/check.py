"""``python -m fairseq_dnas.check``: are the Triton kernels right on this machine?

Run once on a GPU machine before training. Prints the device and versions,
then one table: every configuration the kernels compile for (float16,
bfloat16, float32 x head size 64, 128 x DNAS, HNAS x dropout off, on x
Sinkhorn iterations 1, 3; all with padding; the one-tile kernels of short
inputs beside the long ones where ``selection.kernel_sets`` runs them)
checked against Algorithm 1 in float64 (``selfcheck.compare``: the same
comparison the first-use check
makes, forward and gradients), then a speed and a memory line against
torch's ``scaled_dot_product_attention``. Exit status 1 if any configuration
disagrees or fails to run, 0 otherwise.

Without CUDA there is nothing to check (the kernels run on CUDA only) and
the command says so; ``--interpret`` runs the kernels on CPU under Triton's
interpreter on tiny inputs instead (slow: about 2-5 s per configuration;
float16 and float32 only, since the interpreter's bfloat16 ``tl.dot`` is
wrong).
"""

import argparse
import importlib.metadata
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

import torch

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
HEADS = (64, 128)
KERNEL_SCHEMES = ("dnas", "hnas")  # what the Triton kernels compute (unas is torch's own attention)
SINKHORN = (1, 3)
SPEED_SIZES = dict(batch=8, heads=16, length=1024, head_dim=64)  # a long-ish encoder batch


def _list(kind, choices):
    def parse(text):
        items = [x for x in text.split(",") if x]
        bad = [x for x in items if x not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{kind} must be a comma-separated subset of {','.join(choices)}")
        return items
    return parse


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m fairseq_dnas.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--interpret", action="store_true",
                        help="without CUDA: run the kernels on CPU under Triton's interpreter (tiny sizes, slow)")
    parser.add_argument("--dtypes", type=_list("--dtypes", tuple(DTYPES)), default=list(DTYPES),
                        help="comma-separated (default: all)")
    parser.add_argument("--heads", type=_list("--heads", tuple(map(str, HEADS))), default=list(map(str, HEADS)),
                        help="head sizes, comma-separated (default: 64,128)")
    parser.add_argument("--schemes", type=_list("--schemes", KERNEL_SCHEMES), default=list(KERNEL_SCHEMES),
                        help="comma-separated (default: dnas,hnas)")
    parser.add_argument("--sinkhorn", type=_list("--sinkhorn", tuple(map(str, SINKHORN))),
                        default=list(map(str, SINKHORN)), help="Sinkhorn iterations, comma-separated (default: 1,3)")
    parser.add_argument("--dropout", type=_list("--dropout", ("off", "on")), default=["off", "on"],
                        help="comma-separated (default: off,on)")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed and memory line")
    return parser.parse_args(argv)


def _version(*names: str) -> str:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions() -> str:
    return (f"torch {torch.__version__}, triton {_version('triton')}, fairseq {_version('fairseq', 've-fairseq')}, "
            f"fairseq-dnas {_version('fairseq-dnas')}, CUDA {torch.version.cuda or 'none'}")


def device_line(device: torch.device) -> str:
    if device.type != "cuda":
        return "CPU, kernels under Triton's interpreter (TRITON_INTERPRET=1)"
    props = torch.cuda.get_device_properties(device)
    return (f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.1f} GiB, "
            f"{device})")


def configurations(dtypes, heads, schemes, dropouts, sinkhorns, device: torch.device):
    """Every configuration to check: each kernel set ``auto`` may run for it
    (``selection.kernel_sets``: the one-tile kernels for short inputs beside
    the long kernels where they apply)."""
    from fairseq_dnas.attention.selection import kernel_sets
    from fairseq_dnas.attention.selfcheck import Config

    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    for dtype in dtypes:
        for head in heads:
            for scheme in schemes:
                for dropout in dropouts:
                    for iters in sinkhorns:
                        for kernels in kernel_sets(int(iters), int(head), DTYPES[dtype], scheme):
                            yield Config(str(device), DTYPES[dtype], int(head), scheme, dropout == "on", int(iters),
                                         True, tf32 and dtype == "float32", kernels)


HEADER = (f"{'scheme':6} {'dtype':9} {'head':>4} {'dropout':7} {'sinkhorn':>8} {'kernels':8} {'T':>3}  "
          f"{'output err':>10} {'tol':>7}  {'grad err':>8} {'':2} {'tol':>7}  result")


def row(result) -> str:
    c = result.config
    dtype = str(c.dtype).replace("torch.", "") + ("+tf32" if c.tf32 else "")
    from fairseq_dnas.attention.selfcheck import sizes

    head = (f"{c.scheme:6} {dtype:9} {c.head_dim:>4} {'on' if c.dropout else 'off':7} {c.sinkhorn_iters:>8} "
            f"{c.kernels:8} {sizes(c)['length']:>3}  ")
    if result.error is not None:
        return head + f"{'-':>10} {'':7}  {'-':>8} {'':2} {'':7}  ERROR {result.error}"
    verdict = "ok" if result.ok else "DISAGREES"
    return head + (f"{result.forward_error:>10.2e} {result.forward_tol:>7.0e}  {result.grad_error:>8.2e} "
                   f"{result.grad_name[1:]:2} {result.grad_tol:>7.0e}  {verdict}")


def _median_ms(fn, device: torch.device, repeats: int) -> float:
    times = []
    for i in range(repeats + 2):  # two warm-up runs (compilation, caches)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _peak_mib(fn, device: torch.device) -> Optional[float]:
    """Peak memory above what was allocated before ``fn`` (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def speed_and_memory(device: torch.device, dtype: torch.dtype, *, batch: int, heads: int, length: int,
                     head_dim: int, repeats: int = 20) -> Dict[str, Dict[str, Optional[float]]]:
    """Forward + backward of torch's scaled_dot_product_attention, DNAS and
    HNAS (Triton kernels, no padding, no dropout): median milliseconds and
    peak MiB (CUDA only; None elsewhere). The kernels are those ``auto``
    selects at this length (``selection.kernel_set``)."""
    from fairseq_dnas.attention.selection import attention_function, kernel_set

    g = torch.Generator().manual_seed(0)
    shape = (batch, heads, length, head_dim)
    q, k, v, grad = (torch.randn(shape, generator=g).to(device, dtype) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    u = torch.full((heads,), 0.5, device=device, requires_grad=True)
    dnas, hnas = (attention_function(kernel_set(1, length, length, head_dim, dtype, scheme))
                  for scheme in ("dnas", "hnas"))
    runs = {
        "torch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v),
        "DNAS": lambda: dnas(q, k, v),
        "HNAS": lambda: hnas(q, k, v, hybrid_weight=u),
    }
    out = {}
    for name, forward in runs.items():
        def step(forward=forward):
            for x in (q, k, v, u):
                x.grad = None
            forward().backward(grad)
        out[name] = dict(ms=_median_ms(step, device, repeats), mib=_peak_mib(step, device))
    return out


def speed_lines(figures, dtype: torch.dtype, sizes: Dict[str, int], repeats: int) -> List[str]:
    base = figures["torch SDPA"]
    what = (f"{str(dtype).replace('torch.', '')}, B {sizes['batch']} x H {sizes['heads']} x "
            f"T {sizes['length']} x D {sizes['head_dim']}, no padding, forward+backward")
    speed = ", ".join(f"{n} {f['ms']:.2f} ms" + ("" if f is base else f" ({f['ms'] / base['ms']:.2f}x)")
                      for n, f in figures.items())
    lines = [f"speed  ({what}, median of {repeats}): {speed}"]
    if base["mib"] is not None:
        mem = ", ".join(f"{n} {f['mib']:.1f} MiB" + ("" if f is base else f" ({f['mib'] / max(base['mib'], 1e-9):.2f}x)")
                        for n, f in figures.items())
        lines.append(f"memory (peak above the inputs, same run): {mem}")
    return lines


def longer_kernels(selection) -> str:
    """Which kernel set runs the inputs the one-tile kernels do not take: the
    long kernels, or the lean ones where ``FAIRSEQ_DNAS_TRITON_LEAN`` or a
    GPU's measurements (``selection.LEAN_CHOSEN``) choose them."""
    env = selection.LEAN_ENV
    if selection.deterministic():
        return ("long (any length, any Sinkhorn iterations; torch.use_deterministic_algorithms(True) "
                "runs them, bitwise repeatable, and never the lean kernels)")
    mode = selection.lean_mode()
    if mode == "1":
        return f"lean (${env}=1; long for Sinkhorn iterations > 1)"
    if mode == "0":
        return f"long (any length, any Sinkhorn iterations; ${env}=0: never the lean kernels)"
    if selection.LEAN_CHOSEN:
        chosen = sorted(k for k, name in selection.LEAN_CHOSEN.items() if name == "lean")
        return ("lean where selection.LEAN_CHOSEN chose it (" + ", ".join(f"{kind}:{head} {scheme} T<={band}"
                for kind, head, scheme, band in chosen) + "), else long")
    return f"long (any length, any Sinkhorn iterations; the lean kernels run when ${env}=1 asks)"


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    print("fairseq_dnas.check: the Triton attention kernels against Algorithm 1 in float64")
    print(f"versions: {versions()}")
    if args.interpret:
        # Triton reads this when the kernels are defined: before attention/triton/ is imported.
        os.environ["TRITON_INTERPRET"] = "1"
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        print("device: CPU only (no CUDA device). Nothing to check: the Triton kernels run on CUDA GPUs, "
              "and CPU runs take the dense/fused paths, which the test suite checks. "
              "`python -m fairseq_dnas.check --interpret` runs the kernels under Triton's interpreter "
              "instead (slow, tiny sizes).")
        return 0
    print(f"device: {device_line(device)}")
    from fairseq_dnas.attention import selection, selfcheck

    short = ("short for inputs up to selection.SHORT_MAX (T <= 128, half precision)"
             if selection.short_mode() == "auto" else f"no one-tile kernels (${selection.SHORT_ENV}=0)")
    print(f"kernels: {short}, else {longer_kernels(selection)}")

    dtypes = list(args.dtypes)
    if args.interpret and "bfloat16" in dtypes:
        dtypes.remove("bfloat16")
        print("bfloat16: skipped: Triton's interpreter computes bfloat16 tl.dot wrongly (docs/performance.md); "
              "on a GPU the command checks it")
    sizes = selfcheck.CUDA_SIZES if device.type == "cuda" else selfcheck.INTERPRETER_SIZES
    print(f"each row: B {sizes['batch']} x H {sizes['heads']} x T (column T), padding on, forward and "
          f"gradients (dq, dk, dv, du; the worst, relative to max(1, |grad|)) against float64; dropout "
          f"p = {selfcheck.DROPOUT_P} with the kernels' own mask")
    print(HEADER)
    results = []
    for config in configurations(dtypes, args.heads, args.schemes, args.dropout, args.sinkhorn, device):
        result = selfcheck.compare(config, selection.attention_function(config.kernels), **selfcheck.sizes(config))
        results.append(result)
        print(row(result), flush=True)
    bad = [r for r in results if not r.ok]
    if device.type == "cuda" and not args.no_speed:
        repeats = 20
        for dtype in (torch.float16,):
            try:
                figures = speed_and_memory(device, dtype, repeats=repeats, **SPEED_SIZES)
                print("\n".join(speed_lines(figures, dtype, SPEED_SIZES, repeats)))
            except Exception as e:  # noqa: BLE001 (a report line, the verdict is the table's)
                print(f"speed: not measured ({type(e).__name__}: {selfcheck.first_line(e)})")
    elif device.type != "cuda":
        print("speed: not measured under the interpreter (its times measure Python, not a GPU)")
    if bad:
        print(f"{len(bad)} of {len(results)} configurations DISAGREE or fail to run: the 'auto' path will run "
              f"them without the Triton kernels (dense/blockwise, slower). Please report this output.")
        return 1
    print(f"all {len(results)} configurations agree with the float64 reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
