"""Attention dropout inside the Triton kernels: the Philox keep/drop
decisions, their application to a tile, and the published mask.

Attention dropout (``dropout_bytes``, ``_keep``, ``dropped``): keep/drop
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

Every kernel set draws its mask here (``dropout_bytes``, ``dropped``);
``dropout_mask`` replays it for the first-use check, tests and anyone who
wants the pattern.
"""

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton.launch import grid, on_device, program
from fairseq_dnas.attention.triton.tiles import INTERPRETED, kernel_tile

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


@triton.jit
def dropout_setup(SEED, drop_threshold, DROPOUT: tl.constexpr):
    """(seed, 1 / (1 - p_eff), ``threshold_pair``) of a kernel that drops;
    (0, 1.0, 0) without dropout."""
    if DROPOUT:
        return tl.load(SEED), dropout_scale(drop_threshold), threshold_pair(drop_threshold)
    else:
        return 0, 1.0, 0


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
def dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr = False):
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
        # register pair, so that the compiler passes z itself to dropped
        x = (z[:, :, :, :, :, None] >> (16 * one).to(tl.uint32)[None, None, None, None, None, :]) & 0xFFFF
        return tl.reshape(x, (M, BLOCK_N)).to(tl.int16)


@triton.jit
def _keep(seed, bh, offs_m, start_n, TK, threshold, BLOCK_N: tl.constexpr, TRANSPOSED: tl.constexpr = False):
    """Dropout mask Z (True = kept), shaped as ``dropout_bytes``: the byte is
    at least the threshold t (t = 256, p = 1, compares with 255: the kernels'
    scale is then 0)."""
    return dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N, TRANSPOSED) >= tl.minimum(threshold, 255)


@triton.jit
def threshold_pair(drop_threshold):
    """min(t, 255) in both 16-bit halves, the form ``dropped`` compares with."""
    return tl.minimum(drop_threshold, 255) * 0x10001


@triton.jit
def dropped(x, byte, t_pair):
    """x where the element is kept (its byte >= t), else 0; ``byte`` from
    ``dropout_bytes``, ``t_pair`` from ``threshold_pair``.

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


@triton.jit
def dropout_scale(drop_threshold):
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


def new_seed(device: torch.device) -> Tensor:
    """A dropout seed drawn from torch's generator on ``device`` (no host sync),
    so ``torch.manual_seed`` makes the masks reproducible."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


@triton.jit
def _dropout_mask_kernel(SEED, KEEP, H, TQ, TK, drop_threshold, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, bh, _, _ = program(TQ, H, BLOCK_M, True)
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
    bm, bn = kernel_tile("column", 64, torch.float16)[:2]
    with on_device(seed):
        _dropout_mask_kernel[grid(tq, bm, bsz, heads)](seed, keep, heads, tq, tk, dropout_threshold(p),
                                                       BLOCK_M=bm, BLOCK_N=bn)
    return keep.bool()
