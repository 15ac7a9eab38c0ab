"""DNAS/HNAS attention as Triton kernels: no T_q x T_k matrix, forward and backward.

The GPU execution path (``kernels.py`` chooses it on CUDA). The same kernels
run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``), which
is how CI tests them without a GPU. Written after the structure of Triton's
fused-attention tutorial (online softmax over key blocks, a key-major and a
query-major backward pass that recompute the probabilities from the saved
row log-sum-exp); the algorithm is the paper's Algorithm 1 through the
log-domain identity of ``../shared/docs/attention-math.md``.

Notation: scaled queries q_i (i < T_q), keys k_j and values v_j (j < T_k),
scores s[i, j] = q_i . k_j; "real" positions are those that are not padding.

Forward
    1. ``_column_lse_kernel`` (one program per key block): the DNAS column
       normalizer over the real queries, Algorithm 1 step 4,
           c[j] = logsumexp_i s[i, j].
       One matmul (K Q^T) per (key block, query block).
    2. ``_forward_kernel`` (one program per query block): online softmax over
       the key blocks with the key bias -c[j],
           pi_D[i, j] = softmax_j(s[i, j] - c[j]),  r[i] its row log-sum-exp,
       and, for HNAS, a second online softmax of the same scores (UNAS, step 3,
       row lse r_u[i]) with its own accumulator; the output is
           out_i = u O_D,i + (1 - u) O_U,i                     (step 5, Eq. 12).
       Attention dropout multiplies the final probabilities (the HNAS
       mixture, one mask for both parts) by Z[i, j] / (1 - p), Z ~ Bernoulli(1 - p)
       drawn by Philox from (seed, (b H + h) T_q T_k + i T_k + j), so that the
       backward replays the very same mask without storing it.

Backward (dO the upstream gradient, Z' = Z / (1 - p) or 1 without dropout,
G[i, j] = Z'[i, j] (dO_i . v_j) = dL/dpi before dropout):
    0. ``_backward_preprocess_kernel``: E_D[i] = u dO_i . O_D,i and
       E_U[i] = dO_i . out_i - E_D[i] (= (1 - u) dO_i . O_U,i), the D_i of
       flash attention per part, weighted so that nothing is divided by u or
       1 - u. DNAS: u = 1, E_D[i] = dO_i . out_i.
    1. ``_backward_kv_kernel`` (one program per key block), with
           t[i, j]  = pi_D[i, j] (u G[i, j] - E_D[i])       (softmax gradient at fixed c)
           dc[j]    = -sum_i t[i, j]                         (gradient through c)
           xi[i, j] = pi_D[i, j] exp(r[i])                   (= exp(s - c), d c[j] / d s[i, j])
           ds[i, j] = t[i, j] + xi[i, j] dc[j] + pi_U[i, j] ((1 - u) G[i, j] - E_U[i])
       accumulates dv_j = sum_i Z'[i, j] pi_H[i, j] dO_i, dc[j], and
       dk_j = sum_i ds[i, j] q_i = sum_i (t + hnas term)[i, j] q_i + dc[j] sum_i xi[i, j] q_i
       (the two sums accumulate side by side since dc[j] is known only at the
       end), and dL/du = sum_ij G[i, j] (pi_D - pi_U)[i, j] per key block.
       Five matmuls per block pair: K Q^T, V dO^T, and three into dv / dk.
    2. ``_backward_q_kernel`` (one program per query block): dq_i = sum_j ds[i, j] k_j
       with the dc from step 1. Three matmuls per block pair.

So DNAS costs 3 + 8 matmuls per block pair against 2 + 7 for the tutorial's
softmax attention (2 + 5 for FlashAttention-2, whose dq uses atomics), and
keeps O(T) extra memory per head: c, dc, r (and r_u, E_U) in float32, plus,
for HNAS, O_D in the input dtype (so that its D_i needs no extra pass).

Padding: one mask for keys and one for queries (the same tensor for
self-attention). Padded keys get probability 0; padded queries are left out
of c and their output rows are 0 (their dO is ignored). Scores and every
reduction are float32 (``tl.dot`` accumulates in float32; float32 inputs are
multiplied exactly, ``input_precision="ieee"``, unless torch's own float32
matmuls use TF32: ``_precision``), probabilities are cast to the dtype of v
before the products with v, as fairseq does.

Sinkhorn iterations (``sinkhorn_iters`` > 1): ``triton_sinkhorn.py`` computes
the earlier normalizers with the column pass above (``lse_pass``) and the
gradient through them; these kernels take the last ones as c and xi's row bias.
"""

import os
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.functional import check_sinkhorn_iters

# Triton reads TRITON_INTERPRET when the kernels are decorated (at import).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128

# Tiles per kernel: (BLOCK_M queries, BLOCK_N keys, warps), by input kind
# (half: float16/bfloat16; float32, whose exact products take far more
# registers) and head size. Chosen without a GPU to time them, from what
# ptxas makes of each tile for sm_90 (benchmarks/triton_spills.py prints it) in
# every variant (HYBRID x DROPOUT x SINKHORN x HAS_BIAS, STAGES pipeline
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
# (BLOCK_N, D) float32 accumulators: 240 bytes of spills and more), so it
# stays on mma.sync. float32 (exact products by default: FMA, no tensor
# cores) keeps the tiles with no spills at all. These are guesses until
# timed: benchmarks/triton_tiles.py times candidates on a GPU (also their
# pipeline stages: a fourth number, STAGES when absent) and writes a file
# for FAIRSEQ_DNAS_TRITON_TILES (below), which replaces any of these entries.
# Under the interpreter: 16 x 16 tiles (tl.dot's minimum), so that short test
# sequences span several blocks and ragged tails.
GPU_TILES = {
    ("half", 64): dict(column=(128, 128, 8), forward=(128, 32, 8), backward_kv=(16, 128, 8),
                       backward_q=(128, 32, 8), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 4)),
    ("half", 128): dict(column=(128, 128, 8), forward=(64, 32, 8), backward_kv=(32, 32, 8),
                        backward_q=(128, 16, 8), sinkhorn_reduce=(64, 64, 4), sinkhorn_ds=(64, 64, 8)),
    ("float32", 64): dict(column=(64, 32, 8), forward=(16, 32, 8), backward_kv=(16, 32, 8),
                          backward_q=(64, 32, 8), sinkhorn_reduce=(64, 32, 8), sinkhorn_ds=(64, 32, 8)),
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


# --------------------------------------------------------------------------
# Small device helpers
# --------------------------------------------------------------------------


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
    ptrs = base + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d
    tl.store(ptrs, x, mask=(offs_t[:, None] < T) & (offs_d[None, :] < D))


@triton.jit
def _keep(seed, bh, offs_m, offs_n, TQ, TK, p_drop):
    """Dropout mask Z[i, j] (True = kept) for rows offs_m, columns offs_n: one
    Philox draw per (batch * head, i, j), the same in every kernel."""
    offsets = (bh.to(tl.int64) * TQ + offs_m[:, None]) * TK + offs_n[None, :]
    return tl.rand(seed, offsets) >= p_drop


@triton.jit
def _keep_t(seed, bh, offs_n, offs_m, TQ, TK, p_drop):
    """The same mask, transposed: rows are keys offs_n, columns queries offs_m."""
    offsets = (bh.to(tl.int64) * TQ + offs_m[None, :]) * TK + offs_n[:, None]
    return tl.rand(seed, offsets) >= p_drop


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@triton.jit
def _online_softmax_step(m, l, acc, s, v, keep, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of an online softmax (FlashAttention): running row max m,
    row sum l of exp(s - m) (dropout does not change the normalizer) and
    accumulator sum_j exp(s_j - m) Z_j v_j, all rescaled to the new max."""
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    l = l * alpha + tl.sum(p, 1)
    if DROPOUT:
        p = tl.where(keep, p, 0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def _column_lse_kernel(
    Q, K, C, BIAS, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    H, TQ, TK, D,
    HAS_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """c[j] = logsumexp over real queries i of s[i, j] (Algorithm 1, step 4's
    column normalizer); 0 for a padded key and for a key no real query sees
    (as ``functional.dnas_key_bias``: a padded position's normalizer, which
    excludes nothing, could be any size and must not reach a product with a
    zero probability as exp(-c) = inf). Computed as the row
    lse of the transposed scores K Q^T, so the reduction runs along axis 1.

    With HAS_BIAS, c[j] = logsumexp_i (s[i, j] - BIAS[i]); called with the
    roles of Q and K exchanged it gives row normalizers. Sinkhorn iterations
    (``triton_sinkhorn.py``) are made of such passes."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    m = tl.full([BLOCK_N], NEG_INIT, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M): s[i, j] transposed
        if HAS_BIAS:
            s_t -= tl.load(BIAS + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)[None, :]
        s_t = tl.where(real_q[None, :], s_t, float("-inf"))  # padded queries stay out of c
        m_new = tl.maximum(m, tl.max(s_t, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s_t - m_new[:, None]), 1)
        m = m_new
    ok = _real(KPAD, b, offs_n, TK, HAS_PAD) & (l > 0)
    c = tl.where(ok, m + tl.log(tl.where(ok, l, 1.0)), 0.0)
    tl.store(C + bh * TK + offs_n, c, mask=offs_n < TK)


@triton.jit
def _forward_kernel(
    Q, K, V, C, U, SEED, OUT, OD, RD, RU, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    so_b, so_h, so_t, so_d,
    H, TQ, TK, D, p_drop,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out = pi V for one query block: DNAS (softmax with key bias -c), and for
    HNAS the UNAS softmax of the same scores in a second accumulator."""
    pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
    q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    if DROPOUT:
        seed = tl.load(SEED)
    m_d = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    l_d = tl.zeros([BLOCK_M], tl.float32)
    acc_d = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HYBRID:
        m_u = tl.full([BLOCK_M], NEG_INIT, tl.float32)
        l_u = tl.zeros([BLOCK_M], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, TK, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        real_k = _real(KPAD, b, offs_n, TK, HAS_PAD)
        k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
        v = _load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
        c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (M, N)
        s = tl.where(real_k[None, :], s, float("-inf"))  # padded keys: weight 0
        keep = None
        if DROPOUT:
            keep = _keep(seed, bh, offs_m, offs_n, TQ, TK, p_drop)
        # DNAS: softmax of s - c (step 4 as a key bias).
        m_d, l_d, acc_d = _online_softmax_step(m_d, l_d, acc_d, s - c[None, :], v, keep, DROPOUT, PRECISION)
        if HYBRID:  # UNAS: softmax of the same scores (step 3)
            m_u, l_u, acc_u = _online_softmax_step(m_u, l_u, acc_u, s, v, keep, DROPOUT, PRECISION)
    # Rows without a real key (an all-padding sentence) have l = 0: output 0.
    ok_d = real_q & (l_d > 0)
    scale = 1.0 / (1.0 - p_drop) if DROPOUT else 1.0
    l_d = tl.where(ok_d, l_d, 1.0)
    o_d = tl.where(ok_d[:, None], acc_d * (scale / l_d)[:, None], 0.0)
    tl.store(RD + bh * TQ + offs_m, tl.where(ok_d, m_d + tl.log(l_d), 0.0), mask=offs_m < TQ)
    out_base = OUT + b * so_b + h * so_h
    if HYBRID:
        u = tl.load(U + h)
        ok_u = real_q & (l_u > 0)
        l_u = tl.where(ok_u, l_u, 1.0)
        o_u = tl.where(ok_u[:, None], acc_u * (scale / l_u)[:, None], 0.0)
        tl.store(RU + bh * TQ + offs_m, tl.where(ok_u, m_u + tl.log(l_u), 0.0), mask=offs_m < TQ)
        _store_tile(OD + b * so_b + h * so_h, o_d.to(OD.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)
        out = u * o_d + (1.0 - u) * o_u  # step 5 (Eq. 12)
    else:
        out = o_d
    _store_tile(out_base, out.to(OUT.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@triton.jit
def _backward_preprocess_kernel(
    OUT, OD, DO, U, ED, EU, QPAD,
    so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d,
    H, TQ, D,
    HYBRID: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """E_D[i] = u dO_i . O_D,i and E_U[i] = dO_i . out_i - E_D[i] (0 at padded rows)."""
    pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
    do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D).to(tl.float32)
    out = _load_tile(OUT + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
    delta = tl.sum(do * out, 1)  # D_i = dO_i . out_i
    if HYBRID:
        u = tl.load(U + h)
        o_d = _load_tile(OD + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
        e_d = u * tl.sum(do * o_d, 1)
        tl.store(EU + bh * TQ + offs_m, delta - e_d, mask=offs_m < TQ)
    else:
        e_d = delta
    tl.store(ED + bh * TQ + offs_m, e_d, mask=offs_m < TQ)


@triton.jit
def _backward_kv_kernel(
    Q, K, V, C, XB, U, SEED, DO, RD, RU, ED, EU, DK, DV, DC, DU, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    H, TQ, TK, D, p_drop,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, SINKHORN: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk, dv, dc (and this block's share of dL/du) for one key block; every
    tile is held transposed, (keys, queries). With SINKHORN, c is the last
    column normalizer a_n and XB the row normalizer b_{n-1} before it, so
    that xi = exp(s - b_{n-1} - c) (``triton_sinkhorn.py``)."""
    pid_n, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    real_k = _real(KPAD, b, offs_n, TK, HAS_PAD)
    k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    v = _load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
    c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=0.0)
    if HYBRID:
        u = tl.load(U + h)
    else:
        u = 1.0
    if DROPOUT:
        seed = tl.load(SEED)
        scale = 1.0 / (1.0 - p_drop)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dk_t = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i (ds - xi dc)[i, j] q_i
    dk_x = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i xi[i, j] q_i
    dc = tl.zeros([BLOCK_N], tl.float32)
    du = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
        q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
        r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        valid = real_k[:, None] & real_q[None, :]
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M)
        p_d = tl.where(valid, tl.exp(s_t - c[:, None] - r_d[None, :]), 0.0)  # pi_D^T
        g = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dO_i . v_j
        if DROPOUT:
            keep = _keep_t(seed, bh, offs_n, offs_m, TQ, TK, p_drop)
            g = tl.where(keep, g * scale, 0.0)  # G = Z' (dO V^T)
        t = p_d * (u * g - e_d[None, :])  # softmax gradient of the DNAS part at fixed c
        dc -= tl.sum(t, 1)  # dc[j] = -sum_i t[i, j]
        if SINKHORN:  # exp(s - b_{n-1} - c) = p_d exp(r_d - b_{n-1}) (both 0 at padded rows)
            r_x = r_d - tl.load(XB + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        else:
            r_x = r_d
        xi = p_d * tl.exp(r_x)[None, :]  # column softmax exp(s - c) = d c[j] / d s[i, j]
        dk_x += tl.dot(xi.to(q.dtype), q, input_precision=PRECISION)
        if HYBRID:
            r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
            e_u = tl.load(EU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
            p_u = tl.where(valid, tl.exp(s_t - r_u[None, :]), 0.0)  # pi_U^T
            t += p_u * ((1.0 - u) * g - e_u[None, :])
            du += tl.sum(g * (p_d - p_u), 1)  # dL/du = <G, pi_D - pi_U>
            p = u * p_d + (1.0 - u) * p_u
        else:
            p = p_d
        if DROPOUT:
            p = tl.where(keep, p * scale, 0.0)
        dv += tl.dot(p.to(do.dtype), do, input_precision=PRECISION)  # dv_j = sum_i Z' pi_H dO_i
        dk_t += tl.dot(t.to(q.dtype), q, input_precision=PRECISION)
    dk = dk_t + dc[:, None] * dk_x  # ds[i, j] = t[i, j] + xi[i, j] dc[j]
    _store_tile(DK + b * sk_b + h * sk_h, dk.to(DK.dtype.element_ty), offs_n, offs_d, sk_t, sk_d, TK, D)
    _store_tile(DV + b * sv_b + h * sv_h, dv.to(DV.dtype.element_ty), offs_n, offs_d, sv_t, sv_d, TK, D)
    tl.store(DC + bh * TK + offs_n, dc, mask=offs_n < TK)
    if HYBRID:
        tl.store(DU + bh * tl.num_programs(0) + pid_n, tl.sum(du, 0))


@triton.jit
def _backward_q_kernel(
    Q, K, V, C, XB, U, SEED, DO, RD, RU, ED, EU, DC, DQ, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d,
    H, TQ, TK, D, p_drop,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, SINKHORN: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq_i = sum_j ds[i, j] k_j for one query block, with dc from the kv pass."""
    pid_m, h, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = b * H + h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
    q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
    r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    if SINKHORN:  # xi = exp(s - b_{n-1} - c) = p_d exp(r_d - b_{n-1})
        exp_r = tl.exp(r_d - tl.load(XB + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0))
    else:
        exp_r = tl.exp(r_d)
    if HYBRID:
        u = tl.load(U + h)
        r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        e_u = tl.load(EU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    else:
        u = 1.0
    if DROPOUT:
        seed = tl.load(SEED)
        scale = 1.0 / (1.0 - p_drop)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, TK, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        real_k = _real(KPAD, b, offs_n, TK, HAS_PAD)
        k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
        v = _load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
        c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=0.0)
        dc = tl.load(DC + bh * TK + offs_n, mask=offs_n < TK, other=0.0)
        valid = real_q[:, None] & real_k[None, :]
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (M, N)
        p_d = tl.where(valid, tl.exp(s - c[None, :] - r_d[:, None]), 0.0)
        g = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            g = tl.where(_keep(seed, bh, offs_m, offs_n, TQ, TK, p_drop), g * scale, 0.0)
        # ds = pi_D (u G - E_D) + xi dc  [+ pi_U ((1 - u) G - E_U)]
        ds = p_d * (u * g - e_d[:, None] + exp_r[:, None] * dc[None, :])
        if HYBRID:
            p_u = tl.where(valid, tl.exp(s - r_u[:, None]), 0.0)
            ds += p_u * ((1.0 - u) * g - e_u[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    _store_tile(DQ + b * sq_b + h * sq_h, dq.to(DQ.dtype.element_ty), offs_m, offs_d, sq_t, sq_d, TQ, D)


# --------------------------------------------------------------------------
# Launchers and autograd
# --------------------------------------------------------------------------


def _strides(x: Tensor):
    return tuple(x.stride())


def _pad_arg(pad: Optional[Tensor], like: Tensor) -> Tensor:
    """(B, T) bool -> uint8 view for the kernels (a dummy when there is none)."""
    if pad is None:
        return like.new_zeros((1,), dtype=torch.uint8)
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
    return max(16, triton.next_power_of_2(d))


def _output_buffer(q: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, H, T, D) laid out as (T, B, H, D): the fairseq module's reshape of
    the output to (T, B, C) is then a view (as in fused.py)."""
    b, h, t, d = q.shape
    return q.new_empty((t, b, h, d), dtype=dtype).permute(1, 2, 0, 3)


def lse_pass(rows: Tensor, over: Tensor, rows_pad: Optional[Tensor], over_pad: Optional[Tensor],
             out: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """out[b, h, a] = logsumexp over the real n of (rows_a . over_n - bias[b, h, n])
    (0 at padded a and where no n is real): ``_column_lse_kernel`` with
    rows = K, over = Q gives DNAS's c; with rows = Q, over = K a row
    normalizer. The masks are the uint8 ones of ``_pad_arg``, both or none;
    ``out`` a contiguous float32 (B, H, T_rows)."""
    bsz, heads, t_rows, d = rows.shape
    t_over = over.shape[2]
    bm, bn, warps, stages = _tiles("column", d, rows.dtype)
    _column_lse_kernel[(triton.cdiv(t_rows, bn), heads, bsz)](
        over, rows, out, out if bias is None else bias,
        *((over_pad, rows_pad) if over_pad is not None else (_pad_arg(None, rows),) * 2),
        *_strides(over), *_strides(rows), heads, t_over, t_rows, d,
        HAS_PAD=over_pad is not None, HAS_BIAS=bias is not None, PRECISION=_precision(rows.dtype),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=_block_d(d), num_warps=warps, num_stages=stages,
    )
    return out


def _forward(q, k, v, u, kpad, qpad, p_drop, seed, sinkhorn_iters):
    """Output, HNAS's O_D, the key bias c (DNAS: the column normalizer; with
    Sinkhorn iterations the last one, a_n), row lse's r_d (r_u) and, with
    Sinkhorn iterations, the normalizer stacks (a, b) of triton_sinkhorn."""
    bsz, heads, tq, d = q.shape
    tk = k.shape[2]
    f32 = dict(dtype=torch.float32, device=q.device)
    hybrid, dropout, has_pad = u is not None, p_drop > 0, kpad is not None
    r_d = torch.empty((bsz, heads, tq), **f32)
    r_u = torch.empty((bsz, heads, tq), **f32) if hybrid else r_d
    out = _output_buffer(q, v.dtype)
    o_d = _output_buffer(q, v.dtype) if hybrid else out
    qpad_arg, kpad_arg = _pad_arg(qpad, q), _pad_arg(kpad, q)
    meta = dict(HAS_PAD=has_pad, PRECISION=_precision(q.dtype), BLOCK_D=_block_d(d))
    if sinkhorn_iters == 1:
        pads = (kpad_arg, qpad_arg) if has_pad else (None, None)
        c = lse_pass(k, q, *pads, torch.empty((bsz, heads, tk), **f32))
        normalizers = None
    else:
        from fairseq_dnas.attention import triton_sinkhorn  # imports this module: not at the top

        normalizers = triton_sinkhorn.normalizers(q, k, qpad_arg, kpad_arg, has_pad, sinkhorn_iters)
        c = normalizers[0][-1]
    bm, bn, warps, stages = _tiles("forward", d, q.dtype)
    _forward_kernel[(triton.cdiv(tq, bm), heads, bsz)](
        q, k, v, c, u if hybrid else c, seed, out, o_d, r_d, r_u, qpad_arg, kpad_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(out),
        heads, tq, tk, d, float(p_drop),
        HYBRID=hybrid, DROPOUT=dropout, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
    )
    return out, o_d, c, r_d, r_u, normalizers


def _backward(do, q, k, v, u, kpad, qpad, p_drop, seed, out, o_d, c, r_d, r_u, normalizers=None):
    bsz, heads, tq, d = q.shape
    tk = k.shape[2]
    hybrid, dropout, has_pad = u is not None, p_drop > 0, kpad is not None
    f32 = dict(dtype=torch.float32, device=q.device)
    e_d = torch.empty((bsz, heads, tq), **f32)
    e_u = torch.empty((bsz, heads, tq), **f32) if hybrid else e_d
    dc = torch.empty((bsz, heads, tk), **f32)
    kv_m, kv_n, kv_warps, kv_stages = _tiles("backward_kv", d, q.dtype)
    n_kblocks = triton.cdiv(tk, kv_n)
    du_part = torch.empty((bsz, heads, n_kblocks), **f32) if hybrid else dc
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    qpad_arg, kpad_arg = _pad_arg(qpad, q), _pad_arg(kpad, q)
    u_arg = u if hybrid else c
    sinkhorn = normalizers is not None
    x_b = normalizers[1][-1] if sinkhorn else c  # b_{n-1}, the row bias of xi_n
    meta = dict(HAS_PAD=has_pad, BLOCK_D=_block_d(d))
    flags = dict(HYBRID=hybrid, DROPOUT=dropout, SINKHORN=sinkhorn, PRECISION=_precision(q.dtype), **meta)
    bm, _, warps, _ = _tiles("forward", d, q.dtype)
    _backward_preprocess_kernel[(triton.cdiv(tq, bm), heads, bsz)](
        out, o_d, do, u_arg, e_d, e_u, qpad_arg, *_strides(out), *_strides(do), heads, tq, d,
        HYBRID=hybrid, BLOCK_M=bm, num_warps=warps, num_stages=STAGES, **meta,  # no loop to pipeline
    )
    _backward_kv_kernel[(n_kblocks, heads, bsz)](
        q, k, v, c, x_b, u_arg, seed, do, r_d, r_u, e_d, e_u, dk, dv, dc, du_part, qpad_arg, kpad_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), heads, tq, tk, d, float(p_drop),
        BLOCK_M=kv_m, BLOCK_N=kv_n, num_warps=kv_warps, num_stages=kv_stages, **flags,
    )
    bm, bn, warps, stages = _tiles("backward_q", d, q.dtype)
    _backward_q_kernel[(triton.cdiv(tq, bm), heads, bsz)](
        q, k, v, c, x_b, u_arg, seed, do, r_d, r_u, e_d, e_u, dc, dq, qpad_arg, kpad_arg,
        *_strides(q), *_strides(k), *_strides(v), *_strides(do), heads, tq, tk, d, float(p_drop),
        BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **flags,
    )
    if sinkhorn:  # the chain through the earlier normalizers, added into dq and dk
        from fairseq_dnas.attention import triton_sinkhorn

        triton_sinkhorn.backward_through_normalizers(
            q, k, qpad_arg, kpad_arg, has_pad, *normalizers, dc, dq, dk)
    du = du_part.sum(dim=(0, 2)) if hybrid else None
    return dq, dk, dv, du


class TritonAttention(torch.autograd.Function):
    """pi V for scaled q (B, H, T_q, D), k and v (B, H, T_k, D); pi is DNAS
    (``sinkhorn_iters`` rounds), or HNAS when u (H,) is given; padded query
    rows give 0."""

    @staticmethod
    def forward(ctx, q, k, v, u, kpad, qpad, p_drop, seed, sinkhorn_iters=1):
        u32 = None if u is None else u.detach().float().contiguous()
        out, o_d, c, r_d, r_u, normalizers = _forward(q, k, v, u32, kpad, qpad, p_drop, seed, sinkhorn_iters)
        ctx.p_drop = p_drop
        ctx.u_dtype = None if u is None else u.dtype
        a, b = normalizers if normalizers is not None else (None, None)
        ctx.save_for_backward(q, k, v, u32, kpad, qpad, seed, out, o_d, c, r_d, r_u, a, b)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, u32, kpad, qpad, seed, out, o_d, c, r_d, r_u, a, b = ctx.saved_tensors
        normalizers = None if a is None else (a, b)
        dq, dk, dv, du = _backward(do, q, k, v, u32, kpad, qpad, ctx.p_drop, seed, out, o_d, c, r_d, r_u,
                                   normalizers)
        du = None if du is None else du.to(ctx.u_dtype)
        return dq, dk, dv, du, None, None, None, None, None


def new_seed(device: torch.device) -> Tensor:
    """A dropout seed drawn from torch's generator on ``device`` (no host sync),
    so ``torch.manual_seed`` makes the masks reproducible."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


def triton_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    hybrid_weight: Optional[Tensor] = None,
    key_padding_mask: Optional[Tensor] = None,
    query_padding_mask: Optional[Tensor] = None,
    dropout_p: float = 0.0,
    seed: Optional[Tensor] = None,
    sinkhorn_iters: int = 1,
) -> Tensor:
    """DNAS (or, with ``hybrid_weight``, HNAS) attention output (B, H, T_q, D).

    Masks are (B, T) bool, True at padding; for self-attention pass the same
    tensor twice. ``dropout_p`` > 0 drops the final probabilities with the
    Philox stream of ``seed`` (an int64 tensor of one element on q's device;
    drawn with ``new_seed`` when None). ``sinkhorn_iters`` > 1 repeats the
    (column, row) normalization of DNAS (``triton_sinkhorn.py``).
    """
    check_sinkhorn_iters(sinkhorn_iters)
    if (key_padding_mask is None) != (query_padding_mask is None):
        # The kernels take both masks or none; complete the missing one.
        bsz = q.shape[0]
        if key_padding_mask is None:
            key_padding_mask = torch.zeros((bsz, k.shape[2]), dtype=torch.bool, device=q.device)
        else:
            query_padding_mask = torch.zeros((bsz, q.shape[2]), dtype=torch.bool, device=q.device)
    if dropout_p > 0 and seed is None:
        seed = new_seed(q.device)
    if seed is None:
        seed = torch.zeros((1,), dtype=torch.int64, device=q.device)
    return TritonAttention.apply(q, k, v, hybrid_weight, key_padding_mask, query_padding_mask,
                                 float(dropout_p), seed, sinkhorn_iters)


@triton.jit
def _dropout_mask_kernel(SEED, KEEP, TQ, TK, p_drop, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m, pid_n, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = _keep(tl.load(SEED), bh, offs_m, offs_n, TQ, TK, p_drop)
    ptrs = KEEP + (bh.to(tl.int64) * TQ + offs_m[:, None]) * TK + offs_n[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(offs_m[:, None] < TQ) & (offs_n[None, :] < TK))


def dropout_mask(seed: Tensor, shape: Tuple[int, int, int, int], p: float) -> Tensor:
    """The (B, H, T_q, T_k) keep-mask the kernels draw for ``seed``: for tests
    and for anyone who wants to replay a dropout pattern."""
    bsz, heads, tq, tk = shape
    keep = torch.empty(shape, dtype=torch.int8, device=seed.device)
    bm, bn, _, _ = _tiles("column", 64, torch.float16)
    grid = (triton.cdiv(tq, bm), triton.cdiv(tk, bn), bsz * heads)
    _dropout_mask_kernel[grid](seed, keep, tq, tk, float(p), BLOCK_M=bm, BLOCK_N=bn)
    return keep.bool()
