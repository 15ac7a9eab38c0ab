#!/usr/bin/env python
"""Time tile sizes of the Triton kernels on this GPU and write the fastest as a
JSON file for ``FAIRSEQ_DNAS_TRITON_TILES``.

``GPU_TILES`` in ``fairseq_dnas/attention/triton/tiles.py`` were chosen for
an H100 from what the compiler makes of each tile (benchmarks/triton_spills.py),
not from timings; other GPUs want other tiles. This script decides by time:

    python benchmarks/triton_tiles.py --json tiles.json                 # fp16, head size 64
    python benchmarks/triton_tiles.py --cases fp16:64,bf16:128 --sinkhorn 3 --json tiles.json
    FAIRSEQ_DNAS_TRITON_TILES=tiles.json fairseq-train ...          # use them

For each case (dtype:head size) it tunes one kernel at a time, starting from
the current tiles (coordinate descent): every candidate tile of that kernel
is timed on every workload (T in --lengths at --tokens tokens a batch, left
padding with lengths in [3T/4, T], --hidden 768 = heads x head size, DNAS and
HNAS, attention dropout 0 and 0.1), candidates interleaved within each round
so they see the same machine state; the score is the geometric mean over the
workloads of the median time relative to the current tile. A candidate
replaces it when faster by more than --min-gain; the winner's pipeline
stages (1 to 4) are then timed the same way. The forward kernels
(column, forward) are timed on the forward, the others on the backward
(with --sinkhorn N > 1 also the Sinkhorn kernels, on N rounds). A candidate
whose results differ from the current tile's by more than rounding is
rejected and reported; one that does not compile or launch (shared memory)
is skipped. If the current tile itself does not launch on this GPU, the
first candidate that does takes its place as the baseline.

The tiles are those of the long kernels (``attention/triton/long.py``,
run directly at every length); the one-tile kernels of short inputs have
no tiles to tune.

--lean times the lean kernels' entries instead (``attention/triton/lean.py``:
lean_column, lean_forward, lean_forward_hnas, lean_backward,
lean_backward_hnas), each on the workloads that run it (DNAS's entries on
DNAS, HNAS's on HNAS, the column pass on both; dropout 0), over the
candidates that the compiler left (``--candidates``: what
``benchmarks/triton_spills.py --lean-candidates`` wrote on CPU, under the
Triton version of the GPU record; the committed file by default), stages
included in each candidate. --deadline-s stops starting new kernels when
the time is spent and writes what was measured (the rest listed as
"unfinished"). The one command of a GPU session:

    python benchmarks/triton_tiles.py --lean --json OUT/lean_tiles.json --deadline-s 90

Its winners become ``GPU_TILES``' lean_* entries through a dated record
(``tiles.LEAN_TILES_RECORD``), as ``selection.LEAN_CHOSEN`` does.

Without CUDA it runs under Triton's interpreter (TRITON_INTERPRET=1, CPU
tensors): the timings then mean nothing; tests use it to check the script.
Exit status 0 on success, 1 if no candidate of a kernel ran, 2 for bad arguments.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path


import torch  # noqa: E402
import triton  # noqa: E402

from fairseq_dnas.attention.triton import tiles as C  # noqa: E402
from fairseq_dnas.attention.triton import long as F  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
HIDDEN = 768
# Candidates per kernel (BLOCK_M queries, BLOCK_N keys, warps), tried with C.STAGES pipeline
# stages; the current tile is always one. The winner is then tried with STAGE_CANDIDATES.
CANDIDATES = {
    "column": [(64, 64, 4), (64, 128, 8), (128, 64, 8), (128, 128, 8), (32, 128, 8)],
    "forward": [(64, 32, 4), (64, 64, 4), (64, 64, 8), (128, 32, 8), (128, 64, 8), (128, 16, 8)],
    "backward_kv": [(16, 64, 4), (16, 128, 8), (32, 64, 8), (32, 128, 8), (64, 32, 8), (32, 32, 8)],
    "backward_q": [(64, 16, 4), (64, 32, 4), (64, 32, 8), (128, 16, 8), (128, 32, 8), (32, 64, 8)],
    "sinkhorn_reduce": [(64, 64, 4), (64, 128, 8), (128, 64, 8), (64, 32, 4)],
    "sinkhorn_ds": [(64, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8)],
}
STAGE_CANDIDATES = (1, 2, 3, 4)
LEAN_CANDIDATES_FILE = Path(__file__).with_name("lean_tile_candidates.json")
LEAN_LENGTHS = [1024, 4096]
FORWARD_KERNELS = ("column", "forward")
SINKHORN_KERNELS = ("sinkhorn_reduce", "sinkhorn_ds")


def log(msg):
    print(f"[tiles] {msg}", file=sys.stderr, flush=True)


def parse_cases(text):
    cases = []
    for item in text.split(","):
        dtype, _, head = item.partition(":")
        if dtype not in DTYPES or not head.isdigit() or int(head) not in (32, 64, 128):
            raise argparse.ArgumentTypeError(
                f"--cases takes DTYPE:HEAD_SIZE items ({', '.join(DTYPES)}; head size 32, 64 or 128), "
                f"e.g. fp16:64,bf16:128; got {item!r}")
        cases.append((dtype, int(head)))
    return cases


def parse_ints(text):
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=parse_cases, default=parse_cases("fp16:64"),
                   help="DTYPE:HEAD_SIZE list (default fp16:64; bf16 shares fp16's tiles)")
    p.add_argument("--lengths", type=parse_ints, default=[128, 512, 2048], help="T values (default 128,512,2048)")
    p.add_argument("--tokens", type=int, default=16384, help="tokens a batch (default 16384)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help=f"heads x head size (default {HIDDEN})")
    p.add_argument("--rounds", type=int, default=10, help="timed rounds a workload (default 10)")
    p.add_argument("--sinkhorn", type=int, default=1, metavar="N",
                   help="also tune the Sinkhorn kernels on N > 1 rounds (default 1: not)")
    p.add_argument("--min-gain", type=float, default=0.02,
                   help="a candidate must be this much faster to replace the current tile (default 0.02)")
    p.add_argument("--kernels", default=None,
                   help=f"comma-separated subset of {','.join(CANDIDATES)} (default: all that apply)")
    p.add_argument("--json", required=True, help="where to write the tiles (FAIRSEQ_DNAS_TRITON_TILES reads it)")
    p.add_argument("--lean", action="store_true",
                   help="time the lean kernels' candidates (lengths 1024,4096 unless --lengths says)")
    p.add_argument("--candidates", default=str(LEAN_CANDIDATES_FILE),
                   help="with --lean: the candidates file of benchmarks/triton_spills.py --lean-candidates "
                        f"(default {LEAN_CANDIDATES_FILE.name}, beside this script)")
    p.add_argument("--deadline-s", type=float, default=None, metavar="N",
                   help="start no new kernel after N seconds; write what was measured (default: none)")
    args = p.parse_args(argv)
    if args.lean:
        if "--lengths" not in " ".join(argv if argv is not None else sys.argv[1:]):
            args.lengths = list(LEAN_LENGTHS)
        try:
            args.lean_file = json.loads(Path(args.candidates).read_text())
            args.lean_candidates = {k: [tuple(t) for t in v] for k, v in args.lean_file["candidates"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            p.error(f"--candidates {args.candidates}: cannot read its candidates ({e}); write it with "
                    "python benchmarks/triton_spills.py --cases fp16:64 --lean-candidates FILE")
        if args.kernels is not None:
            unknown = set(args.kernels.split(",")) - set(args.lean_candidates)
            if unknown:
                p.error(f"unknown --kernels {sorted(unknown)} with --lean; "
                        f"choose from {', '.join(args.lean_candidates)}")
    if args.deadline_s is not None and args.deadline_s <= 0:
        p.error("--deadline-s must be > 0")
    if args.tokens < max(args.lengths):
        p.error(f"--tokens {args.tokens} is less than the longest length {max(args.lengths)}")
    if any(args.hidden % head for _, head in args.cases):
        p.error(f"--hidden {args.hidden} is not a multiple of every head size in --cases")
    if args.rounds < 1 or args.sinkhorn < 1 or args.min_gain < 0:
        p.error("--rounds and --sinkhorn must be >= 1 and --min-gain >= 0")
    if args.kernels is not None and not args.lean:
        unknown = set(args.kernels.split(",")) - set(CANDIDATES)
        if unknown:
            p.error(f"unknown --kernels {sorted(unknown)}; choose from {', '.join(CANDIDATES)}")
        if args.sinkhorn == 1 and set(args.kernels.split(",")) & set(SINKHORN_KERNELS):
            p.error(f"--kernels {', '.join(SINKHORN_KERNELS)} run only with Sinkhorn rounds: add --sinkhorn 3")
    return args


def tile_table(dtype, head):
    """The dict the kernels read for this case (the interpreter's own under TRITON_INTERPRET)."""
    if C.INTERPRETED:
        return C.INTERPRETER_TILES
    return C.GPU_TILES[C.tile_case(head, dtype)]


def current_tile(kernel, head, dtype):
    """(BLOCK_M, BLOCK_N, warps, stages) that ``kernel`` runs now."""
    return C.kernel_tile(kernel, head, dtype)


def workloads(args, dtype, head, device):
    """(name, inputs) for every length x scheme x dropout: the arguments of F._forward."""
    heads = args.hidden // head
    for t in args.lengths:
        bsz = max(1, args.tokens // t)
        g = torch.Generator().manual_seed(t)
        lens = torch.randint(max(1, 3 * t // 4), t + 1, (bsz,), generator=g)
        pad = (torch.arange(t)[None, :] < (t - lens)[:, None]).to(device)  # left padding
        q, k, v = (torch.randn(bsz, heads, t, head, generator=g).mul(0.5).to(device, dtype) for _ in range(3))
        for hybrid in (False, True):
            u = torch.rand(heads, generator=g).to(device) if hybrid else None
            for p_drop in (0.0, 0.1):
                seed = torch.tensor([1234 + t], dtype=torch.int64, device=device)
                name = f"T={t} {'hnas' if hybrid else 'dnas'} p={p_drop}"
                yield name, (q, k, v, u, pad, pad, p_drop, seed, args.sinkhorn)


def lean_workloads(args, dtype, head, device, kernel):
    """The workloads of ``workloads`` that run a lean entry: its scheme, dropout 0."""
    for name, inputs in workloads(args, dtype, head, device):
        hybrid = inputs[3] is not None
        if inputs[6] == 0.0 and (kernel == "lean_column" or hybrid == kernel.endswith("_hnas")):
            yield name, inputs


def runner(kernel, inputs):
    """A call that runs the pass containing ``kernel`` and returns its results."""
    if kernel.startswith("lean_"):
        from fairseq_dnas.attention.triton import lean
        lean_inputs = inputs[:8]
        if kernel in ("lean_column", "lean_forward", "lean_forward_hnas"):
            return lambda: lean._forward(*lean_inputs)[:1]
        q, k, v, u, kpad, qpad, p_drop, seed = lean_inputs
        saved = lean._forward(*lean_inputs)
        do = torch.randn_like(saved[0])
        return lambda: lean._backward(do, q, k, v, u, qpad, p_drop, seed, *saved)[:3]
    if kernel in FORWARD_KERNELS:
        return lambda: F._forward(*inputs)[:2]
    q, k, v, u, kpad, qpad, p_drop, seed, n = inputs
    out, o_d, c, r_d, r_u, normalizers = F._forward(*inputs)
    do = torch.randn_like(out)
    return lambda: F._backward(do, q, k, v, u, kpad, qpad, p_drop, seed, out, o_d, c, r_d, r_u, normalizers)[:3]


def label(tile):
    return "%dx%d/%dw/%ds" % tuple(tile)


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def close(a, b):
    """Same results up to the rounding of a different summation order."""
    scale = max(float(b.float().abs().max()), 1e-6)
    return float((a.float() - b.float()).abs().max()) <= 2e-2 * scale


def time_candidates(kernel, table, candidates, inputs, rounds, device):
    """Median seconds per candidate (None: did not compile/launch; 'wrong': results differ)."""
    current = table[kernel]
    run = runner(kernel, inputs)
    reference = None  # the results of the first candidate that runs (the current tile, if it launches here)
    times = {}
    for tile in candidates:
        table[kernel] = tile
        try:
            got = run()  # compiles this variant
            synchronize(device)
        except Exception as e:  # noqa: BLE001 - compile errors, out of shared memory: skip the tile
            log(f"  {kernel} {label(tile)}: skipped ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            times[tile] = None
            continue
        reference = got if reference is None else reference
        ok = all(close(a, b) for a, b in zip(got, reference) if a is not None and b is not None)
        times[tile] = [] if ok else "wrong"
        if not ok:
            log(f"  {kernel} {label(tile)}: REJECTED, results differ from {label(candidates[0])}'s beyond rounding")
    live = [t for t in candidates if isinstance(times[t], list)]
    for _ in range(rounds):
        for tile in live:
            table[kernel] = tile
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            times[tile].append(time.perf_counter() - start)
    table[kernel] = current
    return {t: (statistics.median(v) if isinstance(v, list) else v) for t, v in times.items()}


def pick(args, kernel, table, candidates, loads, device, measured):
    """Time ``candidates`` (the first is the current tile) on every workload;
    set and return the fastest by the geometric mean of times relative to
    the first candidate that ran on every workload."""
    per_load = {name: time_candidates(kernel, table, candidates, inputs, args.rounds, device)
                for name, inputs in loads}
    ran = [t for t in candidates if all(isinstance(v[t], float) for v in per_load.values())]
    if not ran:
        sys.exit(f"triton_tiles.py: no candidate tile of {kernel} ran on every workload (see the log above)")
    current = ran[0]
    scores = {}
    for tile in candidates:
        ratios = [per_load[n][tile] / per_load[n][current] for n in per_load
                  if isinstance(per_load[n][tile], float)]
        if len(ratios) == len(per_load):  # timed on every workload
            scores[tile] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    best = min(scores, key=scores.get)
    if scores[best] > 1 - args.min_gain:
        best = current
    table[kernel] = best
    log(f"  {kernel}: " + ", ".join(f"{label(t)} {scores[t]:.3f}x" if t in scores else f"{label(t)} -"
                                    for t in candidates) + f" -> {label(best)}")
    measured["steps"].append(dict(
        baseline=label(current), chosen=label(best),
        relative_time={label(t): round(v, 4) for t, v in scores.items()},
        median_seconds={n: {label(t): s for t, s in v.items() if isinstance(s, float)} for n, v in per_load.items()},
    ))
    return best


def tune_case(args, dtype_name, head, device, kernels):
    dtype = DTYPES[dtype_name]
    table = tile_table(dtype, head)
    loads = list(workloads(args, dtype, head, device))
    report = {}
    for kernel in kernels:
        log(f"{dtype_name} d={head} {kernel}")
        current = current_tile(kernel, head, dtype)
        table[kernel] = current
        measured = dict(previous=list(current), steps=[])  # step 1: tiles and warps, step 2: stages
        tiles = [current] + [(*t, C.STAGES) for t in CANDIDATES[kernel] if (*t, C.STAGES) != current]
        best = pick(args, kernel, table, tiles, loads, device, measured)
        stages = [best] + [(*best[:3], s) for s in STAGE_CANDIDATES if s != best[3]]
        best = pick(args, kernel, table, stages, loads, device, measured)
        report[kernel] = dict(tile=list(best), **measured)
    return report


def tune_lean(args, dtype_name, head, device, kernels, start):
    """Time each lean entry's candidates (stages included) on its workloads;
    entries not started before the deadline are returned as unfinished."""
    dtype = DTYPES[dtype_name]
    table = tile_table(dtype, head)
    report, unfinished = {}, []
    for kernel in kernels:
        if args.deadline_s is not None and time.perf_counter() - start > args.deadline_s:
            unfinished.append(kernel)
            continue
        log(f"{dtype_name} d={head} {kernel} (lean)")
        current = current_tile(kernel, head, dtype)
        table[kernel] = current
        measured = dict(previous=list(current), steps=[])
        # under the interpreter the GPU candidates are too large to run: the interpreter's tile with 1-2 stages
        pool = [(16, 16, 1, 1)] if C.INTERPRETED else args.lean_candidates.get(kernel, [])
        tiles = [current] + [t for t in pool if t != current]
        best = pick(args, kernel, table, tiles, list(lean_workloads(args, dtype, head, device, kernel)), device,
                    measured)
        report[kernel] = dict(tile=list(best), **measured)
    return report, unfinished


def main(argv=None):
    start = time.perf_counter()
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not C.INTERPRETED:
        sys.exit("triton_tiles.py: no CUDA device; on CPU set TRITON_INTERPRET=1 (the timings then mean nothing)")
    kernels = [k for k in CANDIDATES if args.sinkhorn > 1 or k not in SINKHORN_KERNELS]
    if args.lean:
        kernels = list(args.lean_candidates)
    if args.kernels is not None:
        kernels = [k for k in kernels if k in args.kernels.split(",")]
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (Triton interpreter)"
    log(f"{where}, torch {torch.__version__}, triton {triton.__version__}; kernels: {', '.join(kernels)}")
    result = dict(device=where, torch=torch.__version__, triton=triton.__version__,
                  settings=dict(lengths=args.lengths, tokens=args.tokens, rounds=args.rounds,
                                sinkhorn=args.sinkhorn, min_gain=args.min_gain, lean=args.lean,
                                deadline_s=args.deadline_s),
                  tiles={}, measured={})
    if args.lean:
        result["candidates"] = dict(file=args.candidates, triton=args.lean_file.get("triton"),
                                    case=args.lean_file.get("case"))
        if args.lean_file.get("triton") != triton.__version__:
            log(f"note: the candidates were pruned under Triton {args.lean_file.get('triton')}, "
                f"this is Triton {triton.__version__}")
        result["unfinished"] = []
    for dtype_name, head in args.cases:
        key = "%s:%d" % C.tile_case(head, DTYPES[dtype_name])
        if args.lean:
            report, unfinished = tune_lean(args, dtype_name, head, device, kernels, start)
            result["unfinished"] += [f"{dtype_name}:{head} {k}" for k in unfinished]
        else:
            report = tune_case(args, dtype_name, head, device, kernels)
        result["measured"][f"{dtype_name}:{head}"] = report
        result["tiles"].setdefault(key, {}).update({k: r["tile"] for k, r in report.items()})
    tmp = Path(args.json).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, args.json)
    for key, entry in result["tiles"].items():
        print(f"{key}: {json.dumps(entry)}")
    if result.get("unfinished"):
        log(f"deadline: not timed: {', '.join(result['unfinished'])}")
    log(f"wrote {args.json}; use it with {C.TILES_ENV}={args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
