"""What the Triton kernels share: tiles, tile loads and stores, the grid,
the dropout mask, the call's argument handling, and the column log-sum-exp pass.

``flash.py`` (the long-sequence kernels), ``short.py`` (one tile a head) and
``sinkhorn.py`` (the extra Sinkhorn rounds) import their shared helpers from
here and no private helper of each other.

Grid: every kernel runs on a one-dimensional grid of
``cdiv(T, BLOCK) * B * H`` programs, the block index fastest (programs of one
head run side by side and share its keys in L2). Axis 0 allows 2**31 - 1
programs, so no batch size reaches a grid limit (axes 1 and 2 stop at
65,535).

Offsets: Triton passes integers below 2**31 as int32, and a pointer offset
``row * stride`` is computed in the type of its operands. When some element
of a tensor a kernel touches lies 2**31 or more elements from its start
(``needs_int64``), the kernels are compiled with ``INT64`` and compute every
offset in int64; otherwise in int32 (fewer instructions and registers).

Attention dropout (``_dropout_bytes``, ``_keep``, ``_dropped``): keep/drop
decisions come 16 from one call of Philox4x32 with 7 rounds, key 0 and counter
(row i * ceil(T_k / 16) + key group j // 16, batch * head, low 32 bits of the
seed, high 32 bits), in 32-bit words (the first wraps modulo 2**32). Its four
outputs r_0..r_3 are 16 bytes: key j, with j % 16 = 8 h + 4 a + 2 e + b (h, a,
e, b each 0 or 1), is decided by byte 2 e + b of r_{2a + h}. The order follows
the matmul layouts: of each group of a row, a thread of the forward and q
kernels holds keys 2 t + b and 8 + 2 t + b (t = 2 a + e), half e of r_{2a} and
of r_{2a+1}, so each thread receives one 64-bit word pair per group, and each
pair of neighbouring keys (b = 0, 1) is two bytes of one word.
Decisions are therefore a function of the absolute (batch * head, i, j) and
the seed only: the forward kernel and both backward kernels draw the same mask
whatever their tiles. An element is dropped when its byte is below the
threshold t = round(256 p) (at most 255 for p < 1, 256 for p = 1), so the drop
probability is exactly p_eff = t / 256 (|p_eff - p| <= 1/512; FlashAttention-2
also thresholds 8 bits, keep <= floor(255 (1 - p)), and scales by 1 / (1 - p));
kept elements are scaled by 1 / (1 - p_eff) = 256 / (256 - t), so E[Z'] = 1
exactly. p = 1 drops everything and gives zeros, as torch's dropout (the
kernels compare with t = 255 and scale by 0). Philox runs 7 rounds, as
FlashAttention-2's (Philox4x32-7 passes BigCrush, Salmon et al. 2011; 10 is
their margin and Triton's default); the seed is in the counter, not the key,
so that every round key is a constant the compiler folds into instructions.
"""

import contextlib
import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

# Triton reads TRITON_INTERPRET when the kernels are decorated (at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128

# Tiles per kernel: (BLOCK_M queries, BLOCK_N keys, warps), by input kind
# (half: float16/bfloat16; float32, whose exact products take far more
# registers) and head size. Chosen without a GPU to time them, from what
# ptxas makes of each tile for sm_90, compiled as the JIT specializes a real
# call (benchmarks/triton_spills.py prints it), in every variant (HYBRID x DROPOUT x SINKHORN x HAS_BIAS, STAGES pipeline
# stages) under Triton 3.6 (torch 2.11's, the lent H100's) and 3.9 (what CI
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
GPU_TILES = {
    # timed on an H100 (benchmarks/triton_tiles.py; the figures: docs/results/)
    ("half", 64): dict(column=(64, 128, 8), forward=(64, 64, 4), backward_kv=(32, 128, 8),
                       backward_q=(64, 32, 4), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 4)),
    ("half", 128): dict(column=(128, 128, 8), forward=(64, 32, 8), backward_kv=(32, 32, 8),
                        backward_q=(128, 16, 8), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 8)),
    ("float32", 64): dict(column=(64, 32, 8), forward=(16, 32, 8), backward_kv=(16, 32, 8),
                          backward_q=(32, 32, 8), sinkhorn_reduce=(64, 32, 8), sinkhorn_ds=(64, 32, 8)),
    ("float32", 128): dict(column=(16, 32, 8), forward=(16, 16, 8), backward_kv=(16, 16, 8),
                           backward_q=(32, 32, 8), sinkhorn_reduce=(16, 32, 8), sinkhorn_ds=(64, 16, 8)),
}
INTERPRETER_TILES = dict.fromkeys(GPU_TILES["half", 64], (16, 16, 1))
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


def _tiles(kernel: str, d: int, dtype: torch.dtype):
    """(BLOCK_M, BLOCK_N, warps, pipeline stages) of ``kernel``; an entry of
    three gives STAGES stages (a tuned file may name its own)."""
    tile = INTERPRETER_TILES[kernel] if INTERPRETED else GPU_TILES[tile_case(d, dtype)][kernel]
    return (*tile, STAGES) if len(tile) == 3 else tuple(tile)


NEG_INIT = tl.constexpr(-1.0e30)  # start of running maxima: finite, so NEG_INIT - NEG_INIT = 0, never NaN
DROPOUT_ROUNDS = tl.constexpr(7)  # Philox rounds of the dropout mask (module docstring)
IS_INTERPRETED = tl.constexpr(INTERPRETED)  # device helpers with inline PTX take another path under it
# The inline PTX of the dropout helpers (tests/test_triton_safety.py models each instruction):
# bytes 2e and 2e + 1 of a word ($1) into the low and high 16 bits (selector BYTE_PAIR + 0x202 e)
BYTE_PAIR_PTX = tl.constexpr("prmt.b32 $0, $1, 0, $2;")
BYTE_PAIR = tl.constexpr(0x4140)
# a pair of 16-bit values ($1) kept where t ($3, in both halves) <= their bytes ($2), as float16
DROP_HALF_PAIR_PTX = tl.constexpr("{ .reg .b32 m; set.le.u32.f16x2 m, $3, $2; and.b32 $0, $1, m; }")
# a pair of float32 ($2, $3) kept where t ($5) <= their bytes ($4: low half for $2), as float16
DROP_FLOAT_PAIR_PTX = tl.constexpr(
    "{ .reg .pred p, q; setp.le.f16x2 p|q, $5, $4; selp.b32 $0, $2, 0, p; selp.b32 $1, $3, 0, q; }")
DROP_BITS = 8  # bits per keep/drop decision: 16 decisions per Philox call


# --------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------


LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = 2^(x log2 e): the one-tile kernels' exp2 domain


@triton.jit
def _dropout_setup(SEED, drop_threshold, DROPOUT: tl.constexpr):
    """(seed, 1 / (1 - p_eff), ``_threshold_pair``) of a kernel that drops;
    (0, 1.0, 0) without dropout."""
    if DROPOUT:
        return tl.load(SEED), _dropout_scale(drop_threshold), _threshold_pair(drop_threshold)
    else:
        return 0, 1.0, 0


@triton.jit
def _program(T, H, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """(block index, batch * head, batch, head) of this program on the 1-D
    grid of cdiv(T, BLOCK) * B * H programs, block index fastest."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(T, BLOCK)
    bh = pid // n_blocks
    blk = pid - bh * n_blocks
    if INT64:
        bh = bh.to(tl.int64)
    return blk, bh, bh // H, bh % H


@triton.jit
def _offsets(start, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """start + [0, BLOCK), in int64 when a tensor's offsets may pass 2**31."""
    offs = start + tl.arange(0, BLOCK)
    if INT64:
        offs = offs.to(tl.int64)
    return offs


@triton.jit
def _real(PAD, b, offs, T, HAS_PAD: tl.constexpr):
    """True at positions inside [0, T) that are not padding (PAD is (B, T) uint8)."""
    inside = offs < T
    if HAS_PAD:
        padded = tl.load(PAD + b * T + offs, mask=inside, other=1)
        inside = inside & (padded == 0)
    return inside


@triton.jit
def _load_tile(base, offs_t, offs_d, stride_t, stride_d, rows_ok, D):
    """A (len(offs_t), BLOCK_D) tile; rows where rows_ok is False and columns >= D read 0."""
    ptrs = base + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=rows_ok[:, None] & (offs_d[None, :] < D), other=0.0)


@triton.jit
def _store_tile(base, x, offs_t, offs_d, stride_t, stride_d, T, D):
    """Store a (len(offs_t), BLOCK_D) tile with the strides of the tensor written."""
    ptrs = base + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d
    tl.store(ptrs, x, mask=(offs_t[:, None] < T) & (offs_d[None, :] < D))


@triton.jit
def _dropout_words(seed, bh, offs_m, start_n, TK, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The Philox outputs r_0..r_3 of rows offs_m and of the BLOCK_N // 16 key
    groups from start_n (a multiple of 16), as 64-bit pairs r_{2a} | r_{2a+1} << 32:
    (M, G, 2) with pair a last, or (G, M, 2) with TRANSPOSED (module docstring)."""
    G: tl.constexpr = BLOCK_N // 16
    offs_g = start_n // 16 + tl.arange(0, G)  # key groups
    groups = tl.cdiv(TK, 16)
    if TRANSPOSED:
        c0 = (offs_m[None, :] * groups + offs_g[:, None]).to(tl.uint32)  # (G, M): row, group
    else:
        c0 = (offs_m[:, None] * groups + offs_g[None, :]).to(tl.uint32)  # (M, G)
    seed = seed.to(tl.uint64)
    c1 = tl.zeros_like(c0) + bh.to(tl.uint32)
    c2 = tl.zeros_like(c0) + (seed & 0xFFFFFFFF).to(tl.uint32)
    c3 = tl.zeros_like(c0) + (seed >> 32).to(tl.uint32)
    # key 0: every round key is a constant the compiler folds into the instructions (the seed as
    # key would keep 14 round keys in registers across the key loop)
    r0, r1, r2, r3 = tl.philox(0, c0, c1, c2, c3, DROPOUT_ROUNDS)
    # One 64-bit join, not four 32-bit words: Triton then moves the words to the threads that
    # hold their keys in a single shared-memory round trip (with four words it makes two).
    return tl.join(r0.to(tl.uint64) | (r1.to(tl.uint64) << 32), r2.to(tl.uint64) | (r3.to(tl.uint64) << 32))


@triton.jit
def _byte_pair(word, e):
    """Bytes 2e and 2e + 1 of each word as two 16-bit integers (low half: byte 2e)."""
    if IS_INTERPRETED:
        half = word >> (16 * e).to(tl.uint32)
        return (half & 0xFF) | ((half & 0xFF00) << 8)
    else:  # one PRMT (bytes 2e, 2e + 1 of word and zeros); opaque to LLVM, which would otherwise
        # extract each byte on its own and pack them again (four instructions a pair, not one)
        return tl.inline_asm_elementwise(BYTE_PAIR_PTX, "=r,r,r", [word, (BYTE_PAIR + 0x202 * e).to(tl.uint32)],
                                         dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """The decision byte (0..255, int16) of every element: (M, BLOCK_N) for
    rows offs_m and the BLOCK_N keys from start_n (a multiple of 16), or
    (BLOCK_N, M) with TRANSPOSED. Key j of row i, j % 16 = 8 h + 4 a + 2 e + b,
    is decided by byte 2 e + b of r_{2a + h} of the Philox call of (i, j // 16)
    (module docstring): the same in every kernel and for every tile."""
    M: tl.constexpr = offs_m.shape[0]
    pairs = _dropout_words(seed, bh, offs_m, start_n, TK, BLOCK_N, TRANSPOSED)
    one = tl.arange(0, 2)
    if TRANSPOSED:  # (G, h, a, e, b, M) -> (BLOCK_N, M)
        pairs = tl.permute(pairs, (0, 2, 1))  # (G, a, M)
        words = (pairs[:, None, :, :] >> (32 * one).to(tl.uint64)[None, :, None, None]).to(tl.uint32)  # (G, h, a, M)
        shift = (16 * one[:, None] + 8 * one[None, :]).to(tl.uint32)  # (e, b): byte 2 e + b
        x = (words[:, :, :, None, None, :] >> shift[None, None, None, :, :, None]) & 0xFF
        return tl.reshape(x, (BLOCK_N, M)).to(tl.int16)
    else:  # (M, G, h, a, e, b) -> (M, BLOCK_N)
        words = (pairs[:, :, None, :] >> (32 * one).to(tl.uint64)[None, None, :, None]).to(tl.uint32)  # (M, G, h, a)
        z = _byte_pair(words[:, :, :, :, None], one[None, None, None, None, :])  # (M, G, h, a, e)
        # the pair's halves, b = 0 and 1: neighbouring keys, which the matmul layouts hold in one
        # register pair, so that the compiler passes z itself to _dropped
        x = (z[:, :, :, :, :, None] >> (16 * one).to(tl.uint32)[None, None, None, None, None, :]) & 0xFFFF
        return tl.reshape(x, (M, BLOCK_N)).to(tl.int16)


@triton.jit
def _keep(seed, bh, offs_m, start_n, TK, threshold, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Dropout mask Z (True = kept), shaped as ``_dropout_bytes``: the byte is
    at least the threshold t (t = 256, p = 1, compares with 255: the kernels'
    scale is then 0)."""
    return _dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N, TRANSPOSED) >= tl.minimum(threshold, 255)


@triton.jit
def _threshold_pair(drop_threshold):
    """min(t, 255) in both 16-bit halves, the form ``_dropped`` compares with."""
    return tl.minimum(drop_threshold, 255) * 0x10001


@triton.jit
def _dropped(x, byte, t_pair):
    """x where the element is kept (its byte >= t), else 0; ``byte`` from
    ``_dropout_bytes``, ``t_pair`` from ``_threshold_pair``.

    On the GPU two elements at a time, after FlashAttention-2's dropout
    (csrc/flash_attn/src/dropout.h): the two bytes, zero-extended to 16 bits,
    are compared with t as float16 (values below 256 are float16 subnormals,
    which order as the integers do) by one ``set.le.u32.f16x2``, whose 0xFFFF
    halves mask a pair of 16-bit values with one AND; a pair of float32 takes
    the two predicates of ``setp.le.f16x2`` and two selects. The two elements
    are consecutive ones of the thread, and Triton packs element k of each
    16-bit operand into half k of its register (lane k of a vector, little
    endian), so each half of ``byte`` meets its own value of ``x``; a float32
    pair is two registers, the first ($2) taking the low half's predicate p.
    The interpreter runs the same comparison as integers
    (tests/test_triton_safety.py checks the two against each other on a model
    of the instructions)."""
    if IS_INTERPRETED:
        return tl.where(byte >= (t_pair & 0xFFFF), x, 0.0).to(x.dtype)
    elif x.dtype.primitive_bitwidth == 16:  # float16 or bfloat16: the AND does not look at the values
        return tl.inline_asm_elementwise(DROP_HALF_PAIR_PTX, "=r,r,r,r,r", [x, byte, t_pair],
                                         dtype=x.dtype, is_pure=True, pack=2)
    else:
        tl.static_assert(x.dtype.primitive_bitwidth == 32)
        return tl.inline_asm_elementwise(DROP_FLOAT_PAIR_PTX, "=r,=r,r,r,r,r,r", [x, byte, t_pair],
                                         dtype=x.dtype, is_pure=True, pack=2)


# --------------------------------------------------------------------------
# Host helpers
# --------------------------------------------------------------------------


def _strides(x: Tensor):
    return tuple(x.stride())


def _pad_arg(pad: Optional[Tensor], like: Tensor) -> Tensor:
    """(B, T) bool -> uint8 view for the kernels; without a mask ``like``
    itself: the kernels never read it (HAS_PAD False), so nothing is allocated
    or written for it."""
    if pad is None:
        return like
    return pad.contiguous().view(torch.uint8)


def _precision(dtype: torch.dtype) -> str:
    """How tl.dot multiplies float32 inputs: as torch's own float32 matmuls do.
    torch's default is exact float32 ("ieee", which the 1e-5 target needs);
    torch.backends.cuda.matmul.allow_tf32 = True (or
    torch.set_float32_matmul_precision("high")) turns TF32 on for both.
    Half-precision inputs ignore it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def _block_d(d: int) -> int:
    return max(16, next_power_of_2(d))


INT32_LIMIT = 2**31


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are
# constexpr functions whose Python call goes through Triton's JIT machinery
# (about 10 us each on a 2-core CPU); a step calls them several times, and at
# Gigaword's sizes a step on a GPU is bound by the host.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def needs_int64(*tensors: Tensor) -> bool:
    """True if a kernel may address an element 2**31 or more elements from
    the start of one of ``tensors`` (the largest offset its strides reach),
    so that offsets must be computed in int64 (``INT64``)."""
    return any(sum((n - 1) * s for n, s in zip(t.shape, t.stride())) >= INT32_LIMIT - 1 or t.numel() >= INT32_LIMIT
               for t in tensors if t is not None)


def grid(t: int, block: int, bsz: int, heads: int) -> Tuple[int]:
    """The 1-D grid of ``_program``; refuses a launch beyond axis 0's limit."""
    programs = cdiv(t, block) * bsz * heads
    if programs >= INT32_LIMIT:
        raise ValueError(f"attention path 'triton': {programs} programs (B * H * cdiv(T, {block})) exceed "
                         "the 2**31 - 1 a grid allows; split the batch")
    return (programs,)


def on_device(x: Tensor):
    """Launch on x's device, not the current one (a model on cuda:1 without
    torch.cuda.set_device); nothing to do on CPU (the interpreter)."""
    if x.device.type == "cuda":
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()


@triton.jit
def _dropout_scale(drop_threshold):
    """1 / (1 - p_eff) = 256 / (256 - t); 0 for p = 1 (t = 256), where everything is dropped."""
    return tl.where(drop_threshold < 256, 256.0 / tl.maximum(256 - drop_threshold, 1).to(tl.float32), 0.0)


def dropout_threshold(p: float) -> int:
    """The 8-bit threshold t of drop probability p: bytes below t drop, so
    exactly t / 256 of them (module docstring). 0 <= p <= 1, else ValueError."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"attention dropout must be a probability in [0, 1], got {p}")
    if p == 1.0:
        return 256
    return min(int(round(p * 256)), 255)


def effective_dropout_p(p: float) -> float:
    """The drop probability the kernels apply for ``p``: round(256 p) / 256
    (at most 255/256 for p < 1); kept values are scaled by 1 / (1 - it)."""
    return dropout_threshold(p) / 256


# --------------------------------------------------------------------------
# The column pass (DNAS's c, and every Sinkhorn normalizer)
# --------------------------------------------------------------------------


@triton.jit
def _column_lse_kernel(
    Q, K, C, BIAS, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    H, TQ, TK, D,
    HAS_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """c[j] = logsumexp over real queries i of s[i, j] (Algorithm 1, step 4's
    column normalizer); +inf for a padded key and for a key no real query
    sees, so that exp(s - c) = 0 there with no mask: the later kernels take
    key padding from c (a padded position's normalizer, which excludes
    nothing, could be any size; the kernels never compute exp(+c)). Computed as the row
    lse of the transposed scores K Q^T, so the reduction runs along axis 1.

    With HAS_BIAS, c[j] = logsumexp_i (s[i, j] - BIAS[i]); called with the
    roles of Q and K exchanged it gives row normalizers. Sinkhorn iterations
    (``sinkhorn.py``) are made of such passes; their biases are
    earlier outputs of this kernel, +inf at padded positions, which leaves
    those out without the query mask."""
    pid_n, bh, b, h = _program(TK, H, BLOCK_N, INT64)
    offs_n = _offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = _offsets(0, BLOCK_D, INT64)
    k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    m = tl.full([BLOCK_N], NEG_INIT, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = _offsets(start_m, BLOCK_M, INT64)
        q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M): s[i, j] transposed
        if HAS_BIAS:  # a normalizer of this pass's: +inf at padded queries and past T_q, no mask to load
            s_t -= tl.load(BIAS + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))[None, :]
        else:
            real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
            s_t = tl.where(real_q[None, :], s_t, float("-inf"))  # padded queries stay out of c
        m_new = tl.maximum(m, tl.max(s_t, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s_t - m_new[:, None]), 1)
        m = m_new
    ok = _real(KPAD, b, offs_n, TK, HAS_PAD) & (l > 0)
    c = tl.where(ok, m + tl.log(tl.where(ok, l, 1.0)), float("inf"))
    tl.store(C + bh * TK + offs_n, c, mask=offs_n < TK)


def lse_pass(rows: Tensor, over: Tensor, rows_pad: Optional[Tensor], over_pad: Optional[Tensor],
             out: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """out[b, h, a] = logsumexp over the real n of (rows_a . over_n - bias[b, h, n])
    (+inf at padded a and where no n is real: ``_column_lse_kernel``): ``_column_lse_kernel`` with
    rows = K, over = Q gives DNAS's c; with rows = Q, over = K a row
    normalizer. The masks are the uint8 ones of ``_pad_arg``, both or none;
    ``out`` a contiguous float32 (B, H, T_rows)."""
    bsz, heads, t_rows, d = rows.shape
    t_over = over.shape[2]
    bm, bn, warps, stages = _tiles("column", d, rows.dtype)
    with on_device(rows):
        _column_lse_kernel[grid(t_rows, bn, bsz, heads)](
            over, rows, out, out if bias is None else bias,
            *((over_pad, rows_pad) if over_pad is not None else (_pad_arg(None, rows),) * 2),
            *_strides(over), *_strides(rows), heads, t_over, t_rows, d,
            HAS_PAD=over_pad is not None, HAS_BIAS=bias is not None, PRECISION=_precision(rows.dtype),
            INT64=needs_int64(rows, over, out), BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_block_d(d),
            num_warps=warps, num_stages=stages,
        )
    return out


# --------------------------------------------------------------------------
# What every kernel set's call shares
# --------------------------------------------------------------------------


def _output_buffer(q: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, H, T, D) laid out as (T, B, H, D): the fairseq module's reshape of
    the output to (T, B, C) is then a view (as in fused.py)."""
    b, h, t, d = q.shape
    return q.new_empty((t, b, h, d), dtype=dtype).permute(1, 2, 0, 3)


def call_facts(q: Tensor, k: Tensor, u: Optional[Tensor], kpad: Optional[Tensor], p_drop: float):
    """((B, H, T_q, T_k, D), the dropout threshold, (HNAS?, dropout?, padding?)) of a call."""
    threshold = dropout_threshold(p_drop)
    return (*q.shape[:3], k.shape[2], q.shape[3]), threshold, (u is not None, threshold > 0, kpad is not None)


def new_seed(device: torch.device) -> Tensor:
    """A dropout seed drawn from torch's generator on ``device`` (no host sync),
    so ``torch.manual_seed`` makes the masks reproducible."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def prepare_call(q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], query_padding_mask: Optional[Tensor],
                 dropout_p: float, seed: Optional[Tensor]):
    """The masks and seed a kernel set's autograd function takes: both masks
    or none (a missing one completed with no padding), a seed drawn with
    ``new_seed`` when dropout needs one; ``dropout_p`` checked (ValueError)."""
    dropout_threshold(dropout_p)  # a probability, else ValueError
    if (key_padding_mask is None) != (query_padding_mask is None):
        bsz = q.shape[0]
        if key_padding_mask is None:
            key_padding_mask = torch.zeros((bsz, k.shape[2]), dtype=torch.bool, device=q.device)
        else:
            query_padding_mask = torch.zeros((bsz, q.shape[2]), dtype=torch.bool, device=q.device)
    if dropout_p > 0 and seed is None:
        seed = new_seed(q.device)
    return key_padding_mask, query_padding_mask, seed


@triton.jit
def _dropout_mask_kernel(SEED, KEEP, H, TQ, TK, drop_threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh, _, _ = _program(TQ, H, BLOCK_M, True)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    seed = tl.load(SEED)
    for start_n in range(0, TK, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        keep = _keep(seed, bh, offs_m, start_n, TK, drop_threshold, BLOCK_N)
        ptrs = KEEP + (bh * TQ + offs_m[:, None]) * TK + offs_n[None, :]
        tl.store(ptrs, keep.to(tl.int8), mask=(offs_m[:, None] < TQ) & (offs_n[None, :] < TK))


def dropout_mask(seed: Tensor, shape, p: float) -> Tensor:
    """The (B, H, T_q, T_k) keep-mask the kernels draw for ``seed`` and drop
    probability ``p`` (True = kept; kept values are scaled by
    1 / (1 - ``effective_dropout_p(p)``)), the same for every kernel set and
    tile: for the first-use check, tests and anyone who wants to replay a
    dropout pattern. Drawn in the column pass's tiles."""
    bsz, heads, tq, tk = shape
    if dropout_threshold(p) == 256:  # p = 1: everything dropped (the kernels scale by 0)
        return torch.zeros(shape, dtype=torch.bool, device=seed.device)
    keep = torch.empty(shape, dtype=torch.int8, device=seed.device)
    bm, bn = _tiles("column", 64, torch.float16)[:2]
    with on_device(seed):
        _dropout_mask_kernel[grid(tq, bm, bsz, heads)](seed, keep, heads, tq, tk, dropout_threshold(p),
                                                       BLOCK_M=bm, BLOCK_N=bn)
    return keep.bool()
