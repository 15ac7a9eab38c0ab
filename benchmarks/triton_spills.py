#!/usr/bin/env python
"""Compile every Triton kernel variant for an H100 (sm_90) on any machine, and
report what ptxas made of it: registers, register spills, shared memory and
which tensor-core instructions its matmuls use. This is how ``GPU_TILES`` in
``fairseq_dnas/attention/triton_flash.py`` were chosen without a GPU.

No GPU is needed: Triton's NVIDIA backend and ptxas run on the CPU. The
interpreter (which CI uses to run the kernels) accepts code that the compiler
rejects, so compiling closes that gap; ``tests/test_triton.py`` runs this
script with ``--no-report``. The report reads the cubin Triton built (what
the GPU loads: ptxas with Triton's own options) with cuobjdump: registers and
stack bytes (spills) from --dump-resource-usage, the matmul instructions from
the SASS (HGMMA: Hopper's warpgroup MMA, wgmma; HMMA: the older mma.sync,
which Triton falls back to when a tile's M side is under 64 rows a
warpgroup), shared memory from Triton's metadata.

    python benchmarks/triton_spills.py                         # fp16/bf16/fp32 x head size 64/128
    python benchmarks/triton_spills.py --cases fp16:64 --no-report
    python benchmarks/triton_spills.py --cases fp16:64 --tiles backward_kv=16,128,8   # try a tile

Prints one line per kernel, tile and variant (HYBRID, DROPOUT, SINKHORN,
HAS_BIAS flags), then "compiled N variants, ..."; exits 1 if a variant
spills more than --max-stack bytes, takes more than --max-shared bytes of
shared memory, or does not compile. All of it depends on the Triton version;
timing on a GPU (benchmarks/triton_tiles.py, benchmarks/benchmark.py --device
cuda) decides in the end.
"""

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, before triton_flash is imported
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from fairseq_dnas.attention import triton_flash as F  # noqa: E402
from fairseq_dnas.attention import triton_sinkhorn as S  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # H100
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MAX_SHARED = 99 * 1024  # bytes a block may use on sm_86/sm_89 (H100: 227 KB)
DEFAULT_CASES = "fp16:64,bf16:64,fp32:64,fp16:128,bf16:128,fp32:128"

# kernel -> its GPU_TILES entry
KERNELS = {
    "column_lse": (F._column_lse_kernel, "column"),
    "forward": (F._forward_kernel, "forward"),
    "backward_preprocess": (F._backward_preprocess_kernel, "forward"),
    "backward_kv": (F._backward_kv_kernel, "backward_kv"),
    "backward_q": (F._backward_q_kernel, "backward_q"),
    "bias_gradient": (S._bias_gradient_kernel, S.REDUCE_TILES),
    "normalizer_ds": (S._normalizer_ds_kernel, S.DS_TILES),
}
GPU_ENTRIES = sorted({tiles for _, tiles in KERNELS.values()})
FLAGS = ("HYBRID", "DROPOUT", "SINKHORN", "HAS_BIAS")
DATA = ("Q", "K", "V", "OUT", "OD", "DO", "DQ", "DK", "DV", "A", "B")  # pointers in the input dtype
FLOAT32 = ("C", "BIAS", "XB", "U", "RD", "RU", "ED", "EU", "DC", "DU", "XA", "YB", "WA", "WB")
OTHER = {"SEED": "*i64", "QPAD": "*u8", "KPAD": "*u8", "PADA": "*u8", "PADB": "*u8", "p_drop": "fp32"}


def signature(kernel, dtype: str, constexprs: dict) -> dict:
    types = dict.fromkeys(DATA, "*" + dtype)
    types.update(dict.fromkeys(FLOAT32, "*fp32"), **OTHER)
    if kernel is S._bias_gradient_kernel:
        types["OUT"] = "*fp32"  # a vector of normalizer gradients
    return {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in kernel.arg_names}


def variants(kernel):
    flags = [f for f in FLAGS if f in kernel.arg_names]
    for values in itertools.product((False, True), repeat=len(flags)):
        yield dict(zip(flags, values))


def cubin_usage(binary):
    """(registers, stack bytes, matmul instructions) of the cubin Triton built,
    as the GPU would load it: cuobjdump --dump-resource-usage (register spills
    live on the stack) and the SASS's tensor-core instructions ("wgmma" when
    every one is HGMMA, "mma.sync" when every one is HMMA, "mixed", or "-"
    for none: a kernel without matmuls, or float32's exact products, which
    run on the FMA units)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        sys.exit(f"triton_spills.py: no cuobjdump at {tool}; use --no-report")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary.asm["cubin"])
        f.flush()
        res = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True)
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res.stdout)
    if res.returncode != 0 or sass.returncode != 0 or usage is None:
        raise RuntimeError(f"cuobjdump failed: {res.stdout[-1000:]}{res.stderr[-1000:]}{sass.stderr[-1000:]}")
    wgmma, mma = len(re.findall(r"\bHGMMA", sass.stdout)), len(re.findall(r"\bHMMA", sass.stdout))
    kind = {(True, False): "wgmma", (False, True): "mma.sync", (True, True): "mixed"}.get((wgmma > 0, mma > 0), "-")
    return int(usage.group(1)), int(usage.group(2)), kind


def parse_tile(text: str):
    """KERNEL=BLOCK_M,BLOCK_N,WARPS[,STAGES] (a GPU_TILES entry, e.g. forward=128,64,8)."""
    name, _, tile = text.partition("=")
    entries = set(GPU_ENTRIES)
    parts = tile.split(",")
    if name not in entries or len(parts) not in (3, 4) or not all(x.isdigit() for x in parts):
        raise argparse.ArgumentTypeError(
            f"--tiles takes KERNEL=BLOCK_M,BLOCK_N,WARPS[,STAGES] with KERNEL one of "
            f"{', '.join(sorted(entries))}, e.g. forward=128,64,8; got {text!r}")
    parts = [int(x) for x in parts]
    return name, tuple(parts if len(parts) == 4 else parts + [F.STAGES])


def parse_cases(text: str):
    cases = []
    for item in text.split(","):
        dtype, _, head = item.partition(":")
        if dtype not in DTYPES or not head.isdigit() or not 16 <= int(head) <= F.MAX_HEAD_DIM:
            raise argparse.ArgumentTypeError(
                f"--cases takes DTYPE:HEAD_SIZE items ({', '.join(DTYPES)}; head size 16 to "
                f"{F.MAX_HEAD_DIM}), e.g. fp16:64,fp32:128; got {item!r}")
        cases.append((dtype, int(head)))
    return cases


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=parse_cases, default=parse_cases(DEFAULT_CASES),
                   help=f"DTYPE:HEAD_SIZE list (default {DEFAULT_CASES})")
    p.add_argument("--tiles", type=parse_tile, action="append", default=[],
                   metavar="KERNEL=M,N,WARPS[,STAGES]", help="compile this tile instead of GPU_TILES' (repeatable)")
    p.add_argument("--no-report", action="store_true", help="only compile (no register report)")
    p.add_argument("--max-stack", type=int, default=64, metavar="BYTES",
                   help="exit 1 if a variant spills more than this (default 64: GPU_TILES' rule)")
    p.add_argument("--max-shared", type=int, default=MAX_SHARED, metavar="BYTES",
                   help=f"exit 1 if a variant needs more shared memory (default {MAX_SHARED}: "
                        "what a block may use on sm_86/sm_89 GPUs)")
    args = p.parse_args(argv)
    overrides = dict(args.tiles)

    compiled = spilled = largest = shared_max = 0
    kinds = {}
    for dtype, head in args.cases:
        for name, (kernel, tiles) in KERNELS.items():
            bm, bn, warps, stages = overrides.get(tiles) or F._tiles(tiles, head, DTYPES[dtype])
            for flags in variants(kernel):
                c = dict(HAS_PAD=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=F._block_d(head),
                         PRECISION=F._precision(DTYPES[dtype]), **flags)
                c = {k: v for k, v in c.items() if k in kernel.arg_names}
                src = ASTSource(fn=kernel, signature=signature(kernel, dtype, c), constexprs=c)
                binary = triton.compile(src, target=TARGET, options=dict(num_warps=warps, num_stages=stages))
                compiled += 1
                label = " ".join(f"{k}={int(v)}" for k, v in flags.items()) or "-"
                if args.no_report:
                    print(f"{dtype} d={head} {name} {bm}x{bn}/{warps}w/{stages}s {label}", flush=True)
                    continue
                regs, stack, kind = cubin_usage(binary)
                shared = binary.metadata.shared
                spilled += stack > 0
                largest = max(largest, stack)
                shared_max = max(shared_max, shared)
                kinds[kind] = kinds.get(kind, 0) + 1
                print(f"{dtype} d={head} {name} {bm}x{bn}/{warps}w/{stages}s {label}: {regs} registers, "
                      f"{stack} bytes of stack, {shared} bytes shared, {kind}", flush=True)
    if args.no_report:
        print(f"compiled {compiled} variants (Triton {triton.__version__})")
        return 0
    print(f"compiled {compiled} variants, {spilled} with a stack (register spills), the largest "
          f"{largest} bytes; shared memory up to {shared_max} bytes; matmuls: "
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) + f" (Triton {triton.__version__})")
    return 1 if largest > args.max_stack or shared_max > args.max_shared else 0


if __name__ == "__main__":
    sys.exit(main())
