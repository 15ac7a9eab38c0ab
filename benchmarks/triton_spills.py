#!/usr/bin/env python
"""Compile every Triton kernel the attention runs for an H100 (sm_90) on any
machine, the way Triton's JIT specializes a real call, and report what ptxas
made of it: registers, register spills, shared memory, which tensor-core
instructions its matmuls use, and the instructions of its loop over key (or
query) blocks. This is how ``GPU_TILES`` in
``fairseq_dnas/attention/triton/tiles.py`` were chosen without a GPU.

No GPU is needed: Triton's NVIDIA backend and ptxas run on the CPU. The
script runs the real forward and backward (``triton_attention``) on CPU
tensors laid out as the fairseq module lays them out ((T, B, H, D) projections
viewed as (B, H, T, D): stride 1 on the head dimension, every other stride a
multiple of 16), DNAS and HNAS, attention dropout 0 and 0.1, with and without
Sinkhorn iterations, and replaces each kernel launch with what the JIT does
before it launches: bind the arguments, specialize them (an integer equal to 1
becomes a constant, a pointer or integer divisible by 16 carries
``tt.divisibility = 16``: Triton's ``specialize_impl``) and compile that
``ASTSource`` for sm_90. The kernels never run, so their outputs are garbage;
what matters is that the compiled code is the code a GPU would load.

The report reads the cubin with cuobjdump: registers and stack bytes (spills)
from --dump-resource-usage, the matmul instructions from the SASS (HGMMA:
Hopper's warpgroup MMA, wgmma; HMMA: the older mma.sync, which Triton falls
back to when a tile's M side is under 64 rows a warpgroup), shared memory from
Triton's metadata, and the loop body: the instructions between a backward
branch and its target, for the innermost loop that holds a matmul (the loop
over key or query blocks; float32's exact products are FFMA, so there the
innermost loop with an FFMA). Instructions per score element = loop-body
instructions x threads / (BLOCK_M x BLOCK_N): the issue cost of one score.
Where a kernel holds several such loops, "loop" is the longest and each
loop's instructions and MUFU.EX2 (exponentials) are listed too.
Each variant is compiled afresh (Triton's cache bypassed) so that ptxas's log
tells whether it serialized the wgmma instructions (advisory C7515: each then
waits for the one before; "wgmma serialized by ptxas" on the variant's line).
--dump DIR writes each variant's TTGIR, PTX and SASS, to read where a loop's
instructions come from.

    python benchmarks/triton_spills.py                         # fp16/bf16/fp32 x head size 64/128
    python benchmarks/triton_spills.py --cases fp16:64 --table # + the dropout table (docs/results/)
    python benchmarks/triton_spills.py --cases fp16:64 --no-report
    python benchmarks/triton_spills.py --cases fp16:64 --tiles backward_kv=16,128,8   # try a tile
    python benchmarks/triton_spills.py --short 0               # the long kernels at every length
    python benchmarks/triton_spills.py --sinkhorn 1 --cases fp16:64,bf16:128
                                                               # at length 100 what selection.py picks:
                                                               # the one-tile kernels where SHORT_MAX allows
    python benchmarks/triton_spills.py --compare before.json after.json   # two --json runs side by side
    python benchmarks/triton_spills.py --short 0 --lean 1 --sinkhorn 1 --json lean.json   # the lean kernels
    python benchmarks/triton_spills.py --sets long.json lean.json       # instructions a score, set by set
    python benchmarks/triton_spills.py --cases fp16:64 --short 0 --lean 1 --sinkhorn 1 --bias   # lean with T5's bias
    python benchmarks/triton_spills.py --cases fp16:64 --lean-candidates benchmarks/lean_tile_candidates.json
                                        # the lean tile candidates without spills (triton_tiles.py --lean times them)

Under another Triton (e.g. 3.6, torch 2.11's: the newest GPU record's) put
its package first on the path: ``pip install --no-deps --target .triton36
triton==3.6.0`` and ``PYTHONPATH=$PWD/.triton36:$PWD python
benchmarks/triton_spills.py``; every run prints the version and --json
stores it.

Prints one line per compiled specialization (kernel, tile, flags), then
"compiled N variants, ..."; exits 1 if a variant spills more than --max-stack
bytes, takes more than --max-shared bytes of shared memory, makes its loop
with dropout more than --max-dropout-ratio times its loop without, or does
not compile. All of it depends on the Triton version; timing on a GPU
(benchmarks/triton_tiles.py, benchmarks/benchmark.py --device cuda) decides in
the end.
"""

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU, before attention/triton/ is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, without its warning

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

from fairseq_dnas.attention import selection  # noqa: E402
from fairseq_dnas.attention.triton import tiles as F  # noqa: E402
from fairseq_dnas.attention.triton import short  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)  # H100 (warp size 32)
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MAX_SHARED = 99 * 1024  # bytes a block may use on sm_86/sm_89 (H100: 227 KB)
DEFAULT_CASES = "fp16:64,bf16:64,fp32:64,fp16:128,bf16:128,fp32:128"
FLAGS = ("HYBRID", "DROPOUT", "SINKHORN", "HAS_BIAS")


def parse_tile(text: str):
    """KERNEL=BLOCK_M,BLOCK_N,WARPS[,STAGES] (a GPU_TILES entry, e.g. forward=128,64,8)."""
    name, _, tile = text.partition("=")
    entries = set(F.GPU_TILES["half", 64])
    parts = tile.split(",")
    if name not in entries or len(parts) not in (3, 4) or not all(x.isdigit() for x in parts):
        raise argparse.ArgumentTypeError(
            f"--tiles takes KERNEL=BLOCK_M,BLOCK_N,WARPS[,STAGES] with KERNEL one of "
            f"{', '.join(sorted(entries))}, e.g. forward=128,64,8; got {text!r}")
    return name, tuple(int(x) for x in parts)


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


class JitCapture:
    """Stands in for JITFunction.run: specializes the launch's arguments as the
    JIT does (its own binder and _pack_args, so the same rules in every Triton
    version that has them) and keeps one ASTSource per distinct specialization."""

    def __init__(self):
        self.backend = make_backend(TARGET)
        self.jobs = {}  # key -> (kernel, signature, constexprs, attrs, options)

    def run(self, kernel, *args, grid, warmup, **kwargs):
        binder = create_function_from_signature(kernel.signature, kernel.params, self.backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(self.backend, kwargs, bound, specialization,
                                                                  options)
        key = (kernel.__name__, repr(sorted(signature.items())), repr(sorted(constexprs.items())),
               repr(sorted(attrs.items())), repr(sorted(options.__dict__.items())))
        self.jobs.setdefault(key, (kernel, signature, constexprs, attrs, options))


def capture(case, args, sinkhorn_iters):
    """The kernels' specializations of one (dtype, head size): the forward and
    backward of DNAS and HNAS, dropout 0 and 0.1, one and ``sinkhorn_iters``
    Sinkhorn rounds, with padding, in the fairseq module's layout, on the
    kernels ``selection.kernel_set`` picks with ``args.short`` at this
    length (short inputs may run the one-tile kernels)."""
    dtype, head = case
    torch_dtype = DTYPES[dtype]
    heads, length, bsz = max(args.hidden // head, 2), args.length, args.batch
    saved = {k: dict(v) for k, v in F.GPU_TILES.items()}
    saved_short = {k: {block: dict(w) for block, w in v.items()} for k, v in short.SHORT_WARPS.items()}
    if args.short_warps:  # every tile of this case
        for warps in short.SHORT_WARPS[F.tile_case(head, torch_dtype)].values():
            warps.update(forward=args.short_warps, backward=args.short_warps)
    saved_env = os.environ.get(selection.SHORT_ENV)
    os.environ[selection.SHORT_ENV] = args.short
    saved_lean = os.environ.get(selection.LEAN_ENV)
    os.environ[selection.LEAN_ENV] = args.lean
    F.GPU_TILES[F.tile_case(head, torch_dtype)].update(args.tiles)
    jit = JitCapture()
    original = JITFunction.run
    JITFunction.run = lambda kernel, *a, **kw: jit.run(kernel, *a, **kw)
    try:
        gen = torch.Generator().manual_seed(0)
        pad = torch.zeros(bsz, length, dtype=torch.bool)
        pad[1:, : length // 4] = True  # left padding, as fairseq's encoder
        for hybrid in (False, True):
            for p in (0.0, 0.1):
                for iters in sorted({1, sinkhorn_iters}):
                    # (T, B, H*D) projections viewed as (B, H, T, D), as the module passes them
                    q, k, v = (torch.randn(length, bsz, heads * head, generator=gen).to(torch_dtype)
                               .view(length, bsz, heads, head).permute(1, 2, 0, 3).requires_grad_()
                               for _ in range(3))
                    u = torch.full((heads,), 0.5, requires_grad=True) if hybrid else None
                    scheme = "hnas" if hybrid else "dnas"
                    kernel_set = selection.kernel_set(iters, length, length, head, torch_dtype, scheme)
                    attention = selection.attention_function(kernel_set)
                    extra = {}
                    if getattr(args, "bias", False) and kernel_set == "lean":  # T5's (1, H, T, T), learned
                        extra["score_bias"] = torch.randn(1, heads, length, length, generator=gen).to(
                            torch_dtype).requires_grad_()
                    out = attention(q, k, v, hybrid_weight=u, key_padding_mask=pad,
                                    query_padding_mask=pad, dropout_p=p, sinkhorn_iters=iters, **extra)
                    out.float().sum().backward()
    finally:
        JITFunction.run = original
        for key, value in saved.items():
            F.GPU_TILES[key].clear()
            F.GPU_TILES[key].update(value)
        short.SHORT_WARPS.clear()
        short.SHORT_WARPS.update(saved_short)
        if saved_env is None:
            os.environ.pop(selection.SHORT_ENV, None)
        else:
            os.environ[selection.SHORT_ENV] = saved_env
        if saved_lean is None:
            os.environ.pop(selection.LEAN_ENV, None)
        else:
            os.environ[selection.LEAN_ENV] = saved_lean
    return list(jit.jobs.values())


def inner_loops(sass: str):
    """(instructions, MUFU.EX2 instructions) of each innermost loop that holds
    a matmul, in address order: spans from a backward branch's target to the
    branch (a BRA to a lower address), the smallest ones that contain a
    tensor-core instruction (HGMMA/HMMA), or, where there is none, an FFMA
    (float32's exact products). MUFU.EX2 is the exponential (Hopper's SFU
    issues 16 a cycle per SM against 128 FMAs): each counts once per
    thread, so ex2 x threads / (BLOCK_M x BLOCK_N) is exponentials a score."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    code = [(int(addr, 16), text.strip()) for addr, text in lines]
    spans = []
    for addr, text in code:
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", text)
        if m and m.group(1) is not None and int(m.group(1), 16) < addr:
            spans.append((int(m.group(1), 16), addr))
    for pattern in (r"\b(HGMMA|HMMA)\b", r"\bFFMA\b"):
        hits = [a for a, t in code if re.search(pattern, t)]
        holding = [(lo, hi) for lo, hi in spans if any(lo <= a <= hi for a in hits)]
        inner = [s for s in holding if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in holding)]
        if inner:  # 16 bytes an instruction on sm_90
            return [((hi - lo) // 16 + 1, sum(1 for a, t in code if lo <= a <= hi and re.search(r"\bMUFU\.EX2\b", t)))
                    for lo, hi in sorted(inner)]
    return []


def straight_length(sass: str):
    """[(instructions, MUFU.EX2 instructions)] of a kernel without a loop (the
    one-tile kernels: every instruction runs once a program), up to its last
    EXIT (the NOPs and the branch-to-self after it are padding)."""
    lines = re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)
    exits = [i for i, (_, text) in enumerate(lines) if re.search(r"\bEXIT\b", text)]
    end = exits[-1] + 1 if exits else len(lines)
    return [(end, sum(1 for _, text in lines[:end] if re.search(r"\bMUFU\.EX2\b", text)))]


def cubin_report(binary, straight=False):
    """(registers, stack bytes, matmul kind, ``inner_loops``) of the cubin
    Triton built, as the GPU would load it (``straight``, a one-tile kernel
    without a loop: ``straight_length``, all its instructions): cuobjdump
    --dump-resource-usage (register spills live on the stack) and the SASS
    ("wgmma" when every tensor-core instruction is HGMMA, "mma.sync" when
    every one is HMMA, "mixed", or "-" for none: a kernel without matmuls, or
    float32's exact products, which run on the FMA units)."""
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
    loops = straight_length(sass.stdout) if straight else inner_loops(sass.stdout)
    return int(usage.group(1)), int(usage.group(2)), kind, loops


SERIALIZED = "wgmma.mma_async instructions are serialized"  # ptxas's C7515 advisory


def compile_variant(src, options):
    """triton.compile of one specialization, bypassing Triton's cache, and
    whether ptxas serialized its wgmma instructions (its C7515 advisory in the
    log Triton prints with ``dump_ptxas_log``; None where this Triton has no
    such knob): every wgmma then waits for the one before, a stall per
    instruction, and the loop gains a warpgroup arrive and wait per wgmma."""
    knobs = getattr(triton, "knobs", None)
    if knobs is None or not hasattr(knobs.nvidia, "dump_ptxas_log"):
        return triton.compile(src, target=TARGET, options=options.__dict__), None
    log = io.StringIO()
    saved = knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log
    knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = True, True
    try:
        with contextlib.redirect_stdout(log):
            binary = triton.compile(src, target=TARGET, options=options.__dict__)
    finally:
        knobs.compilation.always_compile, knobs.nvidia.dump_ptxas_log = saved
    return binary, SERIALIZED in log.getvalue()


def dump(binary, stem: Path):
    """stem.ttgir, stem.ptx and stem.sass of one compiled variant."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".ttgir").write_text(binary.asm["ttgir"])
    stem.with_suffix(".ptx").write_text(binary.asm["ptx"])
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True)
    stem.with_suffix(".sass").write_text(sass.stdout)


def describe(kernel, constexprs, options):
    """(kernel name, tile text, {flag: value}) of one specialization."""
    by_name = {kernel.arg_names[path[0]]: value for path, value in constexprs.items()}
    flags = {f: bool(by_name[f]) for f in FLAGS if f in by_name}
    bm, bn = by_name.get("BLOCK_M", by_name.get("BLOCK")), by_name.get("BLOCK_N", by_name.get("BLOCK"))
    tile = f"{bm}x{bn}" if bn is not None else f"{bm}"
    return kernel.__name__.strip("_").removesuffix("_kernel"), tile, flags


def dropout_pairs(rows):
    """(row without dropout, row with) for every kernel and flag combination
    that has both."""
    index = {(r["case"], r["kernel"], r["tile"], tuple(sorted((k, v) for k, v in r["flags"].items()
                                                                 if k != "DROPOUT"))): r
             for r in rows if not r["flags"].get("DROPOUT", True)}
    pairs = []
    for r in rows:
        if r["flags"].get("DROPOUT"):
            key = (r["case"], r["kernel"], r["tile"],
                   tuple(sorted((k, v) for k, v in r["flags"].items() if k != "DROPOUT")))
            if key in index:
                pairs.append((index[key], r))
    return pairs


def markdown_table(rows):
    """The per-kernel table of the compiler figures in docs/results/: each kernel that draws
    dropout, DNAS/HNAS (without Sinkhorn), its loop without and with dropout."""
    out = ["| case | kernel | scheme | tile | registers | spills (B) | shared (KB) | matmuls "
           "| loop instr. p=0 | loop instr. p=0.1 | ratio | instr./score p=0 | instr./score p=0.1 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for off, on in dropout_pairs(rows):
        if off["flags"].get("SINKHORN"):
            continue
        ratio = on["loop"] / off["loop"] if on["loop"] and off["loop"] else None
        out.append(
            f"| {off['case']} | {off['kernel']} | {'HNAS' if off['flags'].get('HYBRID') else 'DNAS'} "
            f"| {off['tile']}/{off['warps']}w | {off['registers']} / {on['registers']} "
            f"| {off['stack']} / {on['stack']} | {off['shared'] / 1024:.0f} / {on['shared'] / 1024:.0f} "
            f"| {off['kind']} | {off['loop']} | {on['loop']} | {ratio:.2f} "
            f"| {off['per_score']:.2f} | {on['per_score']:.2f} |")
    return "\n".join(out)


KERNEL_ORDER = ("column", "forward", "backward_preprocess", "backward_kv", "backward_q", "short_forward",
                "short_backward", "lean_column", "lean_forward", "lean_preprocess", "lean_backward")
# Kernels whose every loop runs in full in each program (the lean backward's two
# loops over the query blocks): their instructions a score are the sum of the
# loops', where other kernels count their longest loop.
EVERY_LOOP_RUNS = ("lean_backward",)


def score_cost(row):
    """(instructions, MUFU.EX2) a score element of one kernel variant: its
    longest loop's, or the sum over its loops for ``EVERY_LOOP_RUNS``; (0, 0)
    for a kernel without a loop over scores (the preprocess)."""
    loops = row.get("loops_per_score") or []
    if not loops:
        return 0.0, 0.0
    if row["kernel"] in EVERY_LOOP_RUNS:
        return sum(n for n, _ in loops), sum(e for _, e in loops)
    return max((tuple(x) for x in loops), key=lambda x: x[0])


def set_of(kernel):
    kernel = kernel.replace("column_lse", "column")
    if kernel.startswith("lean_"):
        return "lean"
    return "short" if kernel.startswith("short_") else "long"


def sets_table(rows):
    """Markdown: per case, scheme and dropout, each kernel set's instructions
    and exponentials a score element summed over its kernels (forward +
    backward, one normalization round), the largest register count and
    spill, and whether every matmul is on wgmma; then each kernel's
    figures. The column pass, shared by both schemes, counts in both."""
    sums = {}
    for r in rows:
        if r["flags"].get("SINKHORN") or r["flags"].get("HAS_BIAS"):
            continue
        kernel = r["kernel"].replace("column_lse", "column")
        schemes = ("DNAS", "HNAS") if "HYBRID" not in r["flags"] else (("HNAS",) if r["flags"]["HYBRID"] else ("DNAS",))
        dropouts = (False, True) if "DROPOUT" not in r["flags"] else (bool(r["flags"]["DROPOUT"]),)
        n, e = score_cost(r)
        for scheme in schemes:
            for dropout in dropouts:
                entry = sums.setdefault((r["case"], scheme, dropout, set_of(kernel)), dict(
                    instr=0.0, ex2=0.0, regs=0, stack=0, kinds=set(), kernels=[]))
                entry["instr"] += n
                entry["ex2"] += e
                entry["regs"] = max(entry["regs"], r["registers"])
                entry["stack"] = max(entry["stack"], r["stack"])
                entry["kinds"].add(r["kind"])
                entry["kernels"].append(f"{kernel} {r['tile']}/{r['warps']}w {n:.1f}")
    out = ["| case | scheme | dropout | set | instr./score (all kernels) | ex2/score | max registers "
           "| max spill (B) | matmuls | each kernel: tile, instr./score |", "|" + " --- |" * 10]
    for key in sorted(sums):
        s = sums[key]
        kinds = "/".join(sorted(k for k in s["kinds"] if k != "-")) or "-"
        out.append(f"| {key[0]} | {key[1]} | {'0.1' if key[2] else '0'} | {key[3]} | {s['instr']:.1f} "
                   f"| {s['ex2']:.2f} | {s['regs']} | {s['stack']} | {kinds} | {'; '.join(s['kernels'])} |")
    return "\n".join(out)


def compare_table(before, after):
    """Markdown: each kernel variant (without Sinkhorn) of two --json runs side
    by side (e.g. before and after a change): tile, registers, spills,
    instructions a score in its loops (summed), and each loop's instructions
    and MUFU.EX2 a score (a kernel one side lacks, or a run before the
    per-loop figures, shows '-')."""
    def index(rows):
        out = {}
        for r in rows:
            if r["flags"].get("SINKHORN"):
                continue
            kernel = r["kernel"].replace("column_lse", "column")
            scheme = "both" if kernel == "column" else ("HNAS" if r["flags"].get("HYBRID") else "DNAS")
            out[(r["case"], kernel, scheme, bool(r["flags"].get("DROPOUT")))] = r
        return out

    def cells(r):
        if r is None:
            return "- | - | - | - | -"
        score = f"{r['per_score']:.1f}" if r["per_score"] else "-"
        serial = " (wgmma serialized)" if r.get("serialized") else ""
        each = " + ".join(f"{n:.1f}/{e:.2f}" for n, e in r.get("loops_per_score", [])) or "-"
        return (f"{r['tile']}/{r['warps']}w/{r['stages']}s {r['kind']} | {r['registers']} | {r['stack']} "
                f"| {score}{serial} | {each}")

    old, new = index(before), index(after)
    keys = sorted(set(old) | set(new), key=lambda k: (k[0], KERNEL_ORDER.index(k[1]), k[2], k[3]))
    out = ["| case | kernel | scheme | dropout | before: tile | registers | spills (B) | instr./score "
           "| each loop: instr./ex2 a score | after: tile | registers | spills (B) | instr./score "
           "| each loop: instr./ex2 a score |", "|" + " --- |" * 14]
    for key in keys:
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {'0.1' if key[3] else '0'} | {cells(old.get(key))} "
                   f"| {cells(new.get(key))} |")
    return "\n".join(out)


# Each lean entry of GPU_TILES: the kernel that runs it and its variants (--kernels, --where).
LEAN_ENTRIES = {"lean_column": ("lean_column", None), "lean_forward": ("lean_forward", "HYBRID=0"),
                "lean_forward_hnas": ("lean_forward", "HYBRID=1"), "lean_backward": ("lean_backward", "HYBRID=0"),
                "lean_backward_hnas": ("lean_backward", "HYBRID=1")}


def prune_lean_candidates(case, out):
    """Compile each candidate of ``F.LEAN_CANDIDATES`` (every variant that runs
    its tile, dropout 0 and 0.1) and keep those whose every variant compiles
    without a stack (register spills); write {"triton", "case", "candidates":
    {entry: [[BLOCK_M, BLOCK_N, warps, stages], ...]}, "pruned": [...]} to
    ``out``. The compiler only prunes: the GPU's clock chooses among the
    survivors (benchmarks/triton_tiles.py --lean)."""
    label_case = f"{case[0]}:{case[1]}"
    kept, pruned = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for entry, tiles in F.LEAN_CANDIDATES.items():
            kernel, where = LEAN_ENTRIES[entry]
            for tile in tiles:
                rows_path = Path(tmp) / "rows.json"
                argv = ["--cases", label_case, "--short", "0", "--lean", "1", "--sinkhorn", "1", "--kernels", kernel,
                        "--tiles", f"{entry}={','.join(map(str, tile))}", "--max-stack", "100000",
                        "--max-shared", "10000000", "--json", str(rows_path)] + (["--where", where] if where else [])
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        main(argv)
                    rows = json.loads(rows_path.read_text())["rows"]
                except Exception as e:  # noqa: BLE001 - a tile the compiler refuses (shared memory, layout)
                    rows, why = [], f"does not compile ({type(e).__name__})"
                if rows and max(r["stack"] for r in rows) == 0:
                    kept.setdefault(entry, []).append(list(tile))
                    why = "kept"
                elif rows:
                    why = f"spills {max(r['stack'] for r in rows)} bytes"
                    pruned.append(dict(entry=entry, tile=list(tile), why=why))
                else:
                    pruned.append(dict(entry=entry, tile=list(tile), why=why))
                extra = f", {max(r['registers'] for r in rows)} registers, {max(r['shared'] for r in rows)} bytes " \
                        "shared" if rows else ""
                print(f"{label_case} {entry} {'%dx%d/%dw/%ds' % tuple(tile)}: {why}{extra}", flush=True)
    Path(out).write_text(json.dumps(dict(triton=triton.__version__, case=label_case, candidates=kept,
                                         pruned=pruned), indent=1) + "\n")
    print(f"kept {sum(map(len, kept.values()))} of {sum(map(len, F.LEAN_CANDIDATES.values()))} candidates "
          f"(Triton {triton.__version__}); wrote {out}")
    return 0 if all(entry in kept for entry in F.LEAN_CANDIDATES) else 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=parse_cases, default=parse_cases(DEFAULT_CASES),
                   help=f"DTYPE:HEAD_SIZE list (default {DEFAULT_CASES})")
    p.add_argument("--tiles", type=parse_tile, action="append", default=[],
                   metavar="KERNEL=M,N,WARPS[,STAGES]", help="compile this tile instead of GPU_TILES' (repeatable)")
    p.add_argument("--sinkhorn", type=int, default=3, metavar="N",
                   help="also compile the Sinkhorn kernels with N rounds (default 3; 1: none)")
    p.add_argument("--short", choices=selection.SHORT_MODES, default="auto",
                   help="FAIRSEQ_DNAS_TRITON_SHORT for the calls: auto (default: lengths up to "
                        "selection.SHORT_MAX run the one-tile kernels, triton/short.py) or 0 (never)")
    p.add_argument("--lean", choices=selection.LEAN_MODES, default="auto",
                   help="FAIRSEQ_DNAS_TRITON_LEAN for the calls: 1 compiles the lean kernels (triton/lean.py) "
                        "where the long ones would run, 0 never, auto (default) as selection.LEAN_CHOSEN says")
    p.add_argument("--bias", action="store_true",
                   help="the calls of the lean kernels add a score bias (1, H, T, T), as T5's position bias "
                        "(the other sets take none)")
    p.add_argument("--sets", nargs="+", metavar="RUN.json",
                   help="only print each kernel set's instructions a score summed over its kernels, from "
                        "--json runs (e.g. one with --short 0 --lean 0 and one with --short 0 --lean 1)")
    p.add_argument("--short-warps", type=int, choices=(4, 8),
                   help="compile the one-tile kernels with this many warps instead of SHORT_WARPS'")
    p.add_argument("--length", type=int, default=100,
                   help="sequence length of the calls (default 100: not a multiple of 16, as most batches)")
    p.add_argument("--batch", type=int, default=8, help="sentences of the calls (default 8)")
    p.add_argument("--hidden", type=int, default=768, help="model width: heads = hidden / head size (default 768)")
    p.add_argument("--kernels", help="compile only these kernels (comma-separated names as printed, e.g. "
                                      "forward,backward_kv)")
    p.add_argument("--where", help="compile only the variants with these flags, e.g. HYBRID=1,DROPOUT=1")
    p.add_argument("--no-report", action="store_true", help="only compile (no register report)")
    p.add_argument("--table", action="store_true", help="also print the dropout table (markdown)")
    p.add_argument("--json", metavar="PATH", help="write every row of the report to this JSON file")
    p.add_argument("--dump", metavar="DIR", help="write each variant's TTGIR, PTX and SASS to DIR "
                                                  "(to read where a loop's instructions come from)")
    p.add_argument("--max-stack", type=int, default=64, metavar="BYTES",
                   help="exit 1 if a variant spills more than this (default 64: GPU_TILES' rule)")
    p.add_argument("--max-shared", type=int, default=MAX_SHARED, metavar="BYTES",
                   help=f"exit 1 if a variant needs more shared memory (default {MAX_SHARED}: "
                        "what a block may use on sm_86/sm_89 GPUs)")
    p.add_argument("--max-dropout-ratio", type=float, metavar="X",
                   help="exit 1 if a kernel's loop with dropout has more than X times its instructions without")
    p.add_argument("--lean-candidates", metavar="OUT.json",
                   help="compile every candidate tile of tiles.LEAN_CANDIDATES (the lean kernels, the first "
                        "case of --cases, dropout 0 and 0.1) and write those without register spills to "
                        "OUT.json: what benchmarks/triton_tiles.py --lean times on a GPU")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE.json", "AFTER.json"),
                   help="only print the side-by-side table of two --json runs")
    args = p.parse_args(argv)
    if args.compare:
        before, after = (json.loads(Path(path).read_text())["rows"] for path in args.compare)
        print(compare_table(before, after))
        return 0
    if args.sets:
        print(sets_table([row for path in args.sets for row in json.loads(Path(path).read_text())["rows"]]))
        return 0
    if args.lean_candidates:
        return prune_lean_candidates(args.cases[0], args.lean_candidates)
    if args.sinkhorn < 1 or args.length < 2 or args.batch < 2 or args.hidden < 16:
        p.error("--sinkhorn >= 1, --length >= 2, --batch >= 2 (1 would become a constant) and --hidden >= 16")
    args.tiles = dict(args.tiles)
    only = set(args.kernels.split(",")) if args.kernels else None
    where = dict(item.split("=") for item in args.where.split(",")) if args.where else {}

    rows, kinds = [], {}
    for case in args.cases:
        label_case = f"{case[0]}:{case[1]}"
        for kernel, signature, constexprs, attrs, options in capture(case, args, args.sinkhorn):
            name, tile, flags = describe(kernel, constexprs, options)
            if (only and name not in only) or any(str(int(flags.get(k, -1))) != v for k, v in where.items()):
                continue
            src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
            binary, serialized = compile_variant(src, options)
            flag_text = " ".join(f"{k}={int(v)}" for k, v in flags.items()) or "-"
            head = f"{label_case} {name} {tile}/{options.num_warps}w/{options.num_stages}s {flag_text}"
            if args.dump:
                dump(binary, Path(args.dump) / re.sub(r"[^A-Za-z0-9=._-]+", "_", head))
            if args.no_report:
                rows.append(dict(case=label_case))
                print(head, flush=True)
                continue
            straight = name.startswith("short_")  # the one-tile kernels (triton/short.py): no loop
            regs, stack, kind, loops = cubin_report(binary, straight)
            # the longest (a kernel may hold loops that no program runs all of); "loops" lists each
            loop = max((n for n, _ in loops), default=None)
            by_name = {kernel.arg_names[path[0]]: value for path, value in constexprs.items()}
            score = by_name.get("BLOCK_M", by_name.get("BLOCK", 0)) * by_name.get("BLOCK_N", by_name.get("BLOCK", 0))
            per_score = loop * 32 * options.num_warps / score if loop and score else None
            # each loop alone: [instructions a score, exponentials a score]
            each = [[n * 32 * options.num_warps / score, e * 32 * options.num_warps / score] if score else [n, e]
                    for n, e in loops]
            rows.append(dict(case=label_case, kernel=name, tile=tile, warps=options.num_warps,
                             stages=options.num_stages, flags=flags, registers=regs, stack=stack,
                             shared=binary.metadata.shared, kind=kind, loop=loop, per_score=per_score,
                             serialized=serialized, loops=[list(x) for x in loops], loops_per_score=each))
            kinds[kind] = kinds.get(kind, 0) + 1
            what = "kernel" if straight else "loop"
            loop_text = f", {what} {loop} instructions ({per_score:.2f} a score)" if per_score else (
                f", loop {loop} instructions" if loop else "")
            if loops:
                loop_text += "; " + ", ".join(f"{n} instr. {e} ex2" for n, e in loops) + (
                    " (each loop)" if len(loops) > 1 else "")
            print(f"{head}: {regs} registers, {stack} bytes of stack, {binary.metadata.shared} bytes shared, "
                  f"{kind}{loop_text}" + (", wgmma serialized by ptxas" if serialized else ""), flush=True)
    version = f"Triton {triton.__version__}"
    if args.no_report:
        print(f"compiled {len(rows)} variants ({version})")
        return 0
    if not rows:
        sys.exit("triton_spills.py: no kernel matches --kernels/--where")
    largest = max(r["stack"] for r in rows)
    shared_max = max(r["shared"] for r in rows)
    pairs = [(off, on) for off, on in dropout_pairs(rows) if off["loop"] and on["loop"]]
    worst = max(pairs, key=lambda pair: pair[1]["loop"] / pair[0]["loop"], default=None)
    if args.table:
        print(markdown_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(triton=triton.__version__, length=args.length,
                                                   rows=rows), indent=1))
    ratio = worst[1]["loop"] / worst[0]["loop"] if worst else 0.0
    print(f"compiled {len(rows)} variants, {sum(r['stack'] > 0 for r in rows)} with a stack (register spills), "
          f"the largest {largest} bytes; shared memory up to {shared_max} bytes; matmuls: "
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
          + (f", {sum(bool(r['serialized']) for r in rows)} with wgmma serialized by ptxas"
             if any(r["serialized"] is not None for r in rows) else "")
          + (f"; dropout makes a loop at most {ratio:.2f}x as long ({worst[1]['case']} {worst[1]['kernel']} "
             + " ".join(f"{k}={int(v)}" for k, v in worst[1]["flags"].items()) + ")" if worst else "")
          + f" ({version})")
    failed = largest > args.max_stack or shared_max > args.max_shared
    return 1 if failed or (args.max_dropout_ratio is not None and ratio > args.max_dropout_ratio) else 0


if __name__ == "__main__":
    sys.exit(main())
