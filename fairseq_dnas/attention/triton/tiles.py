"""Which tile each Triton kernel runs: the tile table, its JSON override, the
inputs the kernels take (dtypes, head sizes) and whether Triton interprets.

``kernel_tile`` is what every launch asks: (BLOCK_M, BLOCK_N, warps,
pipeline stages) of one kernel for a head size and an input dtype.
"""

import os
from typing import Tuple

import torch

# Triton reads TRITON_INTERPRET when the kernels are decorated (at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128

# Tiles per kernel: (BLOCK_M queries, BLOCK_N keys, warps), by input kind
# (half: float16/bfloat16; float32, whose exact products take far more
# registers) and head size. Chosen without a GPU to time them, from what
# ptxas makes of each tile for sm_90, compiled as the JIT specializes a real
# call (benchmarks/triton_spills.py prints it), in every variant (HYBRID x DROPOUT x SINKHORN x HAS_BIAS, STAGES pipeline
# stages) under Triton 3.6 (torch 2.11's, the H100's of the record) and 3.9 (what CI
# installs). The rule, in this order:
#   1. half precision: every matmul on Hopper's warpgroup MMA (wgmma, SASS
#      HGMMA) wherever a tile allows it with at most 64 bytes of register
#      spills in every variant; Triton falls back to mma.sync (HMMA) when a
#      matmul's M side has fewer than 64 rows a warpgroup (e.g. a 32-key
#      block in the kv pass, whose products are (keys x queries));
#   2. at most 64 bytes of spills in any variant, 99 KB of shared memory (so
#      that the tiles launch on sm_86/sm_89 GPUs too);
#   3. the largest tile (BLOCK_M x BLOCK_N) that remains.
# At head size 128 the kv pass has no wgmma tile within the bound (its three
# (BLOCK_N, D) float32 accumulators spill beyond it; the figures: docs/results/),
# so it stays on mma.sync. float32 (exact products by default: FMA, no tensor
# cores) keeps the tiles with no spills at all. These are guesses until
# timed: benchmarks/triton_tiles.py times candidates on a GPU (also their
# pipeline stages: a fourth number, STAGES when absent) and writes a file
# for FAIRSEQ_DNAS_TRITON_TILES (below), which replaces any of these entries.
# Under the interpreter: 16 x 16 tiles (tl.dot's minimum), so that short test
# sequences span several blocks and ragged tails.
# lean_*: the lean kernels (triton/lean.py), untimed: chosen by the same rule
# from benchmarks/triton_spills.py --lean 1 under Triton 3.9, the largest
# tile by fewest instructions a score (docs/results/2026-11-28-sm90-compiler-lean.md),
# until a GPU record of benchmarks/triton_tiles.py --lean names its winners
# (LEAN_TILES_RECORD, below);
# HNAS's forward and backward have entries of their own (*_hnas), since their
# second accumulator takes the registers DNAS's larger tiles need.
GPU_TILES = {
    # timed on an H100 (benchmarks/triton_tiles.py; the figures: docs/results/)
    ("half", 64): dict(column=(64, 128, 8), forward=(64, 64, 4), backward_kv=(32, 128, 8),
                       backward_q=(64, 32, 4), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 4),
                       lean_column=(128, 64, 4), lean_forward=(128, 128, 8), lean_backward=(64, 128, 8),
                       lean_forward_hnas=(128, 64, 8), lean_backward_hnas=(32, 128, 8)),
    ("half", 128): dict(column=(128, 128, 8), forward=(64, 32, 8), backward_kv=(32, 32, 8),
                        backward_q=(128, 16, 8), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 8),
                        lean_column=(128, 64, 4), lean_forward=(64, 64, 4), lean_backward=(64, 32, 4),
                        lean_forward_hnas=(128, 32, 8), lean_backward_hnas=(16, 64, 4)),
    ("float32", 64): dict(column=(64, 32, 8), forward=(16, 32, 8), backward_kv=(16, 32, 8),
                          backward_q=(32, 32, 8), sinkhorn_reduce=(64, 32, 8), sinkhorn_ds=(64, 32, 8),
                          lean_column=(64, 32, 8), lean_forward=(16, 32, 8), lean_backward=(16, 32, 8),
                          lean_forward_hnas=(16, 32, 8), lean_backward_hnas=(16, 32, 8)),
    ("float32", 128): dict(column=(16, 32, 8), forward=(16, 16, 8), backward_kv=(16, 16, 8),
                           backward_q=(32, 32, 8), sinkhorn_reduce=(16, 32, 8), sinkhorn_ds=(64, 16, 8),
                           lean_column=(16, 32, 8), lean_forward=(16, 16, 8), lean_backward=(16, 16, 8),
                           lean_forward_hnas=(16, 16, 8), lean_backward_hnas=(16, 16, 8)),
}
INTERPRETER_TILES = dict.fromkeys(GPU_TILES["half", 64], (16, 16, 1))

# The lean kernels' tiles by the clock. GPU_TILES' lean_* entries above were chosen on CPU by
# instruction count; a GPU run of ``benchmarks/triton_tiles.py --lean`` times the candidates
# below (those that survive the compiler's pruning on CPU: no register spills for sm_90 under the
# Triton version of the GPU record, ``benchmarks/triton_spills.py --lean-candidates``) and its
# winners replace those entries, as selection.LEAN_CHOSEN is filled from a dated record.
# No GPU has run the sweep yet: the entries above stand until a record names its winners here.
LEAN_TILES_RECORD = None  # the dated record whose winners the lean_* entries are (none yet)
# (BLOCK_M, BLOCK_N, warps, stages) per lean entry, half precision at head size 64 (the case of the
# performance targets). Besides the largest tiles: occupancy candidates - 4 warps, tiles small
# enough for two blocks an SM (at most 32,768 registers and about 113 KB of shared memory each on
# sm_90), 3 pipeline stages - and for the column pass 128-key blocks.
LEAN_CANDIDATES = {
    "lean_column": [(128, 64, 4, 2), (64, 128, 4, 2), (128, 128, 8, 2), (64, 128, 8, 3), (128, 64, 4, 3),
                    (64, 64, 4, 2)],
    "lean_forward": [(128, 128, 8, 2), (128, 64, 8, 2), (128, 64, 4, 2), (64, 64, 4, 2), (64, 64, 4, 3),
                     (128, 128, 8, 3), (64, 128, 4, 2)],
    "lean_forward_hnas": [(128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 3),
                          (64, 32, 4, 2)],
    "lean_backward": [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (64, 64, 4, 2), (64, 64, 4, 3),
                      (32, 64, 4, 2), (128, 128, 8, 2)],
    "lean_backward_hnas": [(32, 128, 8, 2), (64, 128, 8, 2), (32, 128, 8, 3), (64, 64, 4, 2), (32, 64, 4, 2),
                           (32, 64, 4, 3)],
}
STAGES = 2
TILES_ENV = "FAIRSEQ_DNAS_TRITON_TILES"


def read_tiles(path: str) -> dict:
    """Tiles from a JSON file (what benchmarks/triton_tiles.py writes):
    {"tiles": {"half:64": {"forward": [128, 64, 8, 3], ...}, "float32:128": ...}}
    (the fourth number, pipeline stages, may be left out: STAGES).
    Returns {(kind, head size): {kernel: (BLOCK_M, BLOCK_N, warps[, stages])}} with
    only the entries the file names; raises ValueError saying what to fix."""
    import json

    def bad(what):
        return ValueError(f"{TILES_ENV}={path}: {what}. Write the file with benchmarks/triton_tiles.py, "
                          "or unset the variable to use the built-in tiles.")

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise bad(f"cannot read it as JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tiles"), dict):
        raise bad('expected an object with a "tiles" object')
    table = {}
    for key, entry in data["tiles"].items():
        kind, _, head = key.partition(":")
        if (kind, int(head) if head.isdigit() else head) not in GPU_TILES:
            raise bad(f"unknown case {key!r} (known: {', '.join(f'{k}:{d}' for k, d in GPU_TILES)})")
        if not isinstance(entry, dict):
            raise bad(f"{key!r} must map kernel names to [BLOCK_M, BLOCK_N, warps]")
        for kernel, tile in entry.items():
            if kernel not in GPU_TILES["half", 64]:
                raise bad(f"unknown kernel {kernel!r} in {key!r} (known: {', '.join(GPU_TILES['half', 64])})")
            ok = (isinstance(tile, list) and len(tile) in (3, 4) and all(isinstance(x, int) for x in tile)
                  and all(x >= 16 and x & (x - 1) == 0 for x in tile[:2]) and tile[2] in (1, 2, 4, 8, 16)
                  and (len(tile) == 3 or 1 <= tile[3] <= 6))
            if not ok:
                raise bad(f"{key!r} {kernel!r}: {tile!r} is not [BLOCK_M, BLOCK_N, warps(, stages)] with "
                          "blocks powers of two >= 16, warps 1, 2, 4, 8 or 16 and stages 1 to 6")
            table.setdefault((kind, int(head)), {})[kernel] = tuple(tile)
    return table


if os.environ.get(TILES_ENV):  # replace the entries the file names (e.g. tuned on this GPU)
    for _case, _entry in read_tiles(os.environ[TILES_ENV]).items():
        GPU_TILES[_case].update(_entry)


def tile_case(d: int, dtype: torch.dtype) -> Tuple[str, int]:
    """The GPU_TILES key of head size d and an input dtype: ("half" or "float32", 64 or 128)."""
    return ("float32" if dtype == torch.float32 else "half", 64 if d <= 64 else 128)


def kernel_tile(kernel: str, d: int, dtype: torch.dtype):
    """(BLOCK_M, BLOCK_N, warps, pipeline stages) of ``kernel``; an entry of
    three gives STAGES stages (a tuned file may name its own)."""
    tile = INTERPRETER_TILES[kernel] if INTERPRETED else GPU_TILES[tile_case(d, dtype)][kernel]
    return (*tile, STAGES) if len(tile) == 3 else tuple(tile)
