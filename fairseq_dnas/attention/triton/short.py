"""DNAS/HNAS attention for short inputs: one tile a head, two launches a step.

For T_q, T_k <= 128 (Gigaword's sources) one program (CTA) per batch * head
holds the head's whole score block: BLOCK = the next power of two >=
max(T_q, T_k, 16) queries and keys (``block_size``). The DNAS column
normalizer, the row normalization and the backward's column term are then
reductions of register tiles, with no column pass and no second backward
pass: 3 matmuls forward (FlashAttention-2's 2, plus K Q^T for the column
normalizer; HNAS's mixture is formed before its one product with V) and
FlashAttention-2's 5 backward. ``selection.py`` (the one place that
chooses) sends short calls here (``SHORT_MAX``; ``FAIRSEQ_DNAS_TRITON_SHORT=0``
never); longer inputs and Sinkhorn iterations > 1 run ``long.py``.

Same function, interface (``triton_attention``) and dropout mask
(``dropout.dropout_bytes``: a function of (seed, batch * head, i, j // 16)
only) as ``long.py``. Notation as ``long.py``: s = q_i . k_j (q scaled),
everything in the exp2 domain (s2 = s log2 e, scaled once after the matmul;
c2, r2 in log2 units). Equations with their derivation: ``docs/math.md``
(the one-tile kernels).

Forward (``_short_forward_kernel``, Algorithm 1 steps 3-5):
    S2      = Q K^T log2 e                                     one matmul (and K Q^T, for c2's reductions)
    c2[j]   = log2 sum_{i real} 2^S2[i, j]                     (step 4; +inf at padded keys)
    pi_D    = row softmax of S2 - c2 (base 2), r2[i] its row lse
    pi_U    = row softmax of S2 over the real keys, ru2[i]     (HNAS, step 3)
    out     = Z' (u pi_D + (1 - u) pi_U) V                     (step 5, Eq. 12; one matmul)
Stored: out, and c2, r2 (ru2) in float32 (4 bytes a position each), so that
the backward recomputes each probability with one exponential: without them
it would redo the column and row reductions, one more ex2 a score element
for each (2 instead of 1 for DNAS, 3 instead of 2 for HNAS), to save
O(T) bytes. Nothing else: no O_D, no E_D buffer (the backward forms the
D_i of flash attention as row sums of its own tile).

Backward (``_short_backward_kernel``; G = Z' (dO V^T), dL/dpi before dropout):
    pi_D    = 2^(S2 - c2 - r2),  xi = pi_D 2^r2 (= exp(s - c) = dc_j / ds_ij)
    E_D[i]  = sum_j pi_D u G,   t = pi_D (u G - E_D)           (softmax gradient at fixed c)
    dc[j]   = -sum_i t[i, j]
    ds      = t + xi dc  [+ t_U = pi_U ((1 - u) G - E_U), E_U[i] = sum_j pi_U (1 - u) G]
    dq      = ds K,   dk = ds^T (q - mu) [+ (sum_i t_U[i, j]) mu],   dv = (Z' pi_H)^T dO
    dL/du   = sum_ij G (pi_D - pi_U)                           (per batch * head, HNAS)
Five matmuls (S, dO V^T, dq, dk, dv). mu is the mean real query of the head
(computed from the tile in registers): the DNAS part of ds sums to 0 over i
(sum_i t = -dc, sum_i xi = 1), so subtracting mu changes nothing in exact
arithmetic and keeps the products, rounded to the input dtype, from
carrying the mean query (a q_proj bias); HNAS's UNAS part does not sum to
0, so its column sum times mu is added back in float32 (as
``long._backward_kv_kernel``).

Launches: the forward and the backward kernel, plus the seed draw with
dropout (``dropout.new_seed``) and, for HNAS, the sum of dL/du over the
batch (``torch.sum`` of a (B, H) float32 tensor: deterministic, no atomics;
one launch cannot order its programs, so the programs of a head cannot add
up their shares in a fixed order within it). No atomics anywhere: bitwise
repeatable with or without ``torch.use_deterministic_algorithms``.

Padding: the forward loads the key and query masks; c2 = +inf at padded keys
(and keys no real query sees) and r2 = +inf at padded queries (and queries
with no real key) zero every probability there, so the backward loads no
mask. Padded query rows output 0 and get dq = 0.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton.call import call_facts, output_buffer, prepare_call
from fairseq_dnas.attention.triton.dropout import dropout_bytes, dropout_setup, dropped
from fairseq_dnas.attention.triton.launch import (block_d, grid, load_tile, needs_int64, next_power_of_2, offsets,
                                                  on_device, pad_arg, precision, program, real, store_tile, strides)
from fairseq_dnas.attention.triton.tiles import INTERPRETED, tile_case

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = 2^(x log2 e): the one-tile kernels' exp2 domain

BLOCK_MAX = 128  # the largest tile: a 128 x 128 float32 score block a CTA
# Warps per CTA by (input kind, head size class) and tile side (32: 16 and
# 32; 64; 128): the fewest instructions a score without register spills in
# what ptxas makes of each kernel for sm_90 (benchmarks/triton_spills.py; the
# figures: docs/results/). float32 never runs these kernels on a GPU
# (selection.SHORT_MAX). Untimed.
SHORT_WARPS = {
    ("half", 64): {32: dict(forward=2, backward=2), 64: dict(forward=4, backward=4),
                   128: dict(forward=8, backward=8)},
    ("half", 128): {32: dict(forward=2, backward=4), 64: dict(forward=4, backward=8),
                    128: dict(forward=8, backward=8)},
    ("float32", 64): {32: dict(forward=4, backward=4), 64: dict(forward=8, backward=8),
                      128: dict(forward=8, backward=8)},
    ("float32", 128): {32: dict(forward=4, backward=4), 64: dict(forward=8, backward=8),
                       128: dict(forward=8, backward=8)},
}


def block_size(tq: int, tk: int) -> int:
    """The tile's side: the next power of two >= max(T_q, T_k), at least 16 (tl.dot's minimum)."""
    return max(16, next_power_of_2(max(tq, tk, 1)))


def _warps(kernel: str, d: int, dtype: torch.dtype, block: int) -> int:
    return 1 if INTERPRETED else SHORT_WARPS[tile_case(d, dtype)][max(block, 32)][kernel]


# --------------------------------------------------------------------------
# Device helpers
# --------------------------------------------------------------------------


@triton.jit
def _finite_max(x, axis: tl.constexpr):
    """max along ``axis``, 0 where every entry is -inf (so that x - max stays -inf, never NaN)."""
    m = tl.max(x, axis)
    return tl.where(m > float("-inf"), m, 0.0)


@triton.jit
def _column_lse2(s2_t, real_q, real_k):
    """c2[j] = log2 sum_{i real} 2^s2[i, j] (Algorithm 1 step 4, log2 units)
    from the transposed scores s2_t (keys, queries) = K Q^T log2 e: a third
    matmul, which makes the column reductions row reductions of a matmul
    tile (within a thread and a quad of lanes, not across the warps through
    shared memory: the compiler's figures in docs/results/). +inf at padded
    keys, keys past T_k and keys no real query sees."""
    sc = tl.where(real_q[None, :], s2_t, float("-inf"))  # padded queries stay out of c
    m = _finite_max(sc, 1)
    l = tl.sum(tl.exp2(sc - m[:, None]), 1)
    ok = real_k & (l > 0)
    return tl.where(ok, m + tl.log2(tl.where(ok, l, 1.0)), float("inf"))


@triton.jit
def _row_softmax2(x, real_q):
    """(probabilities, row log2-sum-exp r2) of the base-2 row softmax of x;
    rows of padded queries and rows without a finite entry: probabilities 0, r2 = +inf."""
    m = _finite_max(x, 1)
    p = tl.exp2(x - m[:, None])
    l = tl.sum(p, 1)
    ok = real_q & (l > 0)
    l = tl.where(ok, l, 1.0)
    return p * tl.where(ok, 1.0 / l, 0.0)[:, None], tl.where(ok, m + tl.log2(l), float("inf"))


@triton.jit
def _head_tiles(Q, K, V, sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TQ, TK, D,
                PRECISION: tl.constexpr, INT64: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """(batch * head, batch, head, position offsets, head-dimension offsets, q, k, v,
    S2 = Q K^T log2 e) of this program's head: rows past T_q / T_k read 0."""
    _, bh, b, h = program(1, H, 1, INT64)  # one program per batch * head
    offs = offsets(0, BLOCK, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    q = load_tile(Q + b * sq_b + h * sq_h, offs, offs_d, sq_t, sq_d, offs < TQ, D)
    k = load_tile(K + b * sk_b + h * sk_h, offs, offs_d, sk_t, sk_d, offs < TK, D)
    v = load_tile(V + b * sv_b + h * sv_h, offs, offs_d, sv_t, sv_d, offs < TK, D)
    s2 = tl.dot(q, tl.trans(k), input_precision=PRECISION) * LOG2E  # (queries, keys), log2 units
    return bh, b, h, offs, offs_d, q, k, v, s2


# --------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------


@triton.jit
def _short_forward_kernel(
    Q, K, V, U, SEED, OUT, C2, R2, RU2, QPAD, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, so_b, so_h, so_t, so_d,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, PRECISION: tl.constexpr,
    INT64: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out = Z' pi_H V for one head (module docstring); writes c2, r2 (and ru2)."""
    bh, b, h, offs, offs_d, q, k, v, s2 = _head_tiles(
        Q, K, V, sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TQ, TK, D,
        PRECISION, INT64, BLOCK, BLOCK_D)
    real_q = real(QPAD, b, offs, TQ, HAS_PAD)
    real_k = real(KPAD, b, offs, TK, HAS_PAD)
    c2 = _column_lse2(tl.dot(k, tl.trans(q), input_precision=PRECISION) * LOG2E, real_q, real_k)  # step 4
    p, r2 = _row_softmax2(s2 - c2[None, :], real_q)  # pi_D: c2 = inf zeroes padded keys
    if HYBRID:  # UNAS (step 3): the row softmax of the same scores over the keys DNAS keeps
        p_u, ru2 = _row_softmax2(tl.where(c2[None, :] < float("inf"), s2, float("-inf")), real_q)
        u = tl.load(U + h)
        p = u * p + (1.0 - u) * p_u  # step 5 (Eq. 12), before the product: one matmul with V
        tl.store(RU2 + bh * TQ + offs, ru2, mask=offs < TQ)
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    p = p.to(v.dtype)
    if DROPOUT:  # the common mask for (seed, bh, i, j), on the rounded probabilities
        p = dropped(p, dropout_bytes(seed, bh, offs, 0, TK, BLOCK), t_pair)
    out = tl.dot(p, v, input_precision=PRECISION)
    if DROPOUT:
        out *= scale  # 1 / (1 - p_eff); 0 for p = 1
    tl.store(C2 + bh * TK + offs, c2, mask=offs < TK)
    tl.store(R2 + bh * TQ + offs, r2, mask=offs < TQ)
    store_tile(OUT + b * so_b + h * so_h, out.to(OUT.dtype.element_ty), offs, offs_d, so_t, so_d, TQ, D)


@triton.jit
def _short_backward_kernel(
    Q, K, V, U, SEED, DO, C2, R2, RU2, DQ, DK, DV, DU,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, sdo_b, sdo_h, sdo_t, sdo_d,
    sdq_b, sdq_h, sdq_t, sdq_d, sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr,
    INT64: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq, dk, dv and (HNAS) this head's dL/du for one batch entry (module
    docstring). No mask is loaded: c2 = +inf at padded keys, r2 = +inf at
    padded queries zero the probabilities there."""
    bh, b, h, offs, offs_d, q, k, v, s2 = _head_tiles(
        Q, K, V, sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TQ, TK, D,
        PRECISION, INT64, BLOCK, BLOCK_D)
    c2 = tl.load(C2 + bh * TK + offs, mask=offs < TK, other=float("inf"))
    r2 = tl.load(R2 + bh * TQ + offs, mask=offs < TQ, other=float("inf"))
    real_q = r2 < float("inf")
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs, offs_d, sdo_t, sdo_d, real_q, D)
    u = 1.0
    if HYBRID:
        u = tl.load(U + h)
    # G = scale Z (dO V^T): the scale goes into u, 1 - u and the final dv, du.
    # The order keeps few (BLOCK, BLOCK) float32 tiles alive at once (64 registers each at 8 warps):
    # s2 dies into the probabilities; dv is finished before G exists; t and t_U are never held
    # (their sums are taken as they are formed) and ds replaces pi_D, pi_U and G element by element.
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    p_d = tl.exp2(s2 - c2[None, :] - r2[:, None])  # 0 at padded keys (c2 = inf) and queries (r2 = inf)
    if HYBRID:
        ru2 = tl.load(RU2 + bh * TQ + offs, mask=offs < TQ, other=float("inf"))
        p_u = tl.where(c2[None, :] < float("inf"), tl.exp2(s2 - ru2[:, None]), 0.0)  # padded keys: 0
        p = (u * p_d + (1.0 - u) * p_u).to(do.dtype)
    else:
        p = p_d.to(do.dtype)
    if DROPOUT:
        byte = dropout_bytes(seed, bh, offs, 0, TK, BLOCK)
        p = dropped(p, byte, t_pair)
    dv = tl.dot(tl.trans(p), do, input_precision=PRECISION)  # (keys, D)
    if DROPOUT:
        dv *= scale
    store_tile(DV + b * sdv_b + h * sdv_h, dv.to(DV.dtype.element_ty), offs, offs_d, sdv_t, sdv_d, TK, D)
    g = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # dO_i . v_j
    if DROPOUT:
        g = dropped(g, byte, t_pair)
    g_d = (u * scale) * g  # dL/dpi_D
    o_d = tl.sum(p_d * g, 1)  # dO_i . O_D,i / scale (dropout in G), a row sum of the tile
    e_d = (u * scale) * o_d  # E_D[i] = u dO_i . O_D,i
    dc = -tl.sum(p_d * (g_d - e_d[:, None]), 0)  # -sum_i t[i, j]
    xi_row = tl.where(real_q, tl.exp2(r2), 0.0)  # xi = pi_D 2^r2 = exp(s - c); not 0 * inf at padded rows
    if HYBRID:
        g_u = ((1.0 - u) * scale) * g  # dL/dpi_U
        o_u = tl.sum(p_u * g, 1)
        e_u = ((1.0 - u) * scale) * o_u
        # dL/du = sum_ij G (pi_D - pi_U) = scale sum_i (O_D - O_U)_i . dO_i
        tl.store(DU + bh, scale * tl.sum(o_d - o_u, 0))
        tu = tl.sum(p_u * (g_u - e_u[:, None]), 0)  # the UNAS part's column sum, which does not vanish
        # ds = t + xi dc + t_U
        ds = p_d * (g_d - e_d[:, None] + xi_row[:, None] * dc[None, :]) + p_u * (g_u - e_u[:, None])
    else:
        ds = p_d * (g_d - e_d[:, None] + xi_row[:, None] * dc[None, :])  # t + xi dc
    dq = tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    store_tile(DQ + b * sdq_b + h * sdq_h, dq.to(DQ.dtype.element_ty), offs, offs_d, sdq_t, sdq_d, TQ, D)
    # dk over q - mu, mu the mean real query: the DNAS part of ds sums to 0 over i
    count = tl.maximum(tl.sum(real_q.to(tl.float32), 0), 1.0)
    mu = tl.sum(tl.where(real_q[:, None], q.to(tl.float32), 0.0), 0) / count
    qc = (q.to(tl.float32) - mu[None, :]).to(q.dtype)
    dk = tl.dot(tl.trans(ds.to(q.dtype)), qc, input_precision=PRECISION)
    if HYBRID:
        dk += tu[:, None] * mu[None, :]
    store_tile(DK + b * sdk_b + h * sdk_h, dk.to(DK.dtype.element_ty), offs, offs_d, sdk_t, sdk_d, TK, D)


# --------------------------------------------------------------------------
# Launchers and autograd
# --------------------------------------------------------------------------


def _check_short(tq: int, tk: int) -> int:
    block = block_size(tq, tk)
    if block > BLOCK_MAX:
        raise ValueError(f"the one-tile kernels take T_q, T_k <= {BLOCK_MAX} (got {tq}, {tk}); "
                         "longer inputs run long.py (selection.py chooses)")
    return block


def _forward(q, k, v, u, kpad, qpad, p_drop, seed):
    """Output and the normalizers c2, r2 (ru2: HNAS; else r2 again), float32 log2 units."""
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, has_pad) = call_facts(q, k, u, kpad, p_drop)
    block = _check_short(tq, tk)
    f32 = dict(dtype=torch.float32, device=q.device)
    c2 = torch.empty((bsz, heads, tk), **f32)
    r2 = torch.empty((bsz, heads, tq), **f32)
    ru2 = torch.empty((bsz, heads, tq), **f32) if hybrid else r2
    out = output_buffer(q, v.dtype)
    with on_device(q):
        _short_forward_kernel[grid(1, 1, bsz, heads)](
            q, k, v, u if hybrid else c2, seed if dropout else c2, out, c2, r2, ru2, pad_arg(qpad, q),
            pad_arg(kpad, q), *strides(q), *strides(k), *strides(v), *strides(out), heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, HAS_PAD=has_pad, PRECISION=precision(q.dtype),
            INT64=needs_int64(q, k, v, out), BLOCK=block, BLOCK_D=block_d(d),
            num_warps=_warps("forward", d, q.dtype, block), num_stages=1,
        )
    return out, c2, r2, ru2


def _backward(do, q, k, v, u, p_drop, seed, c2, r2, ru2):
    """dq, dk, dv (fresh buffers in the layouts of q, k, v) and du (H,) float32."""
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, _) = call_facts(q, k, u, None, p_drop)
    block = block_size(tq, tk)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    du_part = torch.empty((bsz, heads), dtype=torch.float32, device=q.device) if hybrid else c2
    with on_device(q):
        _short_backward_kernel[grid(1, 1, bsz, heads)](
            q, k, v, u if hybrid else c2, seed if dropout else c2, do, c2, r2, ru2, dq, dk, dv, du_part,
            *strides(q), *strides(k), *strides(v), *strides(do), *strides(dq), *strides(dk), *strides(dv),
            heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, PRECISION=precision(q.dtype),
            INT64=needs_int64(q, k, v, do, dq, dk, dv), BLOCK=block, BLOCK_D=block_d(d),
            num_warps=_warps("backward", d, q.dtype, block), num_stages=1,
        )
    # dL/du: the batch's shares added in a fixed order (torch's reduction; no atomics)
    return dq, dk, dv, (du_part.sum(0) if hybrid else None)


class TritonShortAttention(torch.autograd.Function):
    """pi V for scaled q (B, H, T_q, D), k and v (B, H, T_k, D), T_q, T_k <= 128:
    DNAS, or HNAS when u (H,) is given; padded query rows give 0. The
    interface of ``long.TritonLongAttention`` with one Sinkhorn round."""

    @staticmethod
    def forward(ctx, q, k, v, u, kpad, qpad, p_drop, seed):
        u32 = None if u is None else u.detach().float().contiguous()
        out, c2, r2, ru2 = _forward(q, k, v, u32, kpad, qpad, p_drop, seed)
        ctx.p_drop = p_drop
        ctx.u_dtype = None if u is None else u.dtype
        ctx.save_for_backward(q, k, v, u32, seed, c2, r2, ru2)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, u32, seed, c2, r2, ru2 = ctx.saved_tensors
        dq, dk, dv, du = _backward(do, q, k, v, u32, ctx.p_drop, seed, c2, r2, ru2)
        du = None if du is None else du.to(ctx.u_dtype)
        return dq, dk, dv, du, None, None, None, None


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
    """``long.triton_attention`` (the same keyword arguments and result, the
    same dropout mask for the same seed) on the one-tile kernels: T_q, T_k
    <= ``BLOCK_MAX`` and one Sinkhorn round (else ValueError; ``selection.py``
    sends nothing else here). No seed tensor without dropout."""
    _check_short(q.shape[2], k.shape[2])
    if sinkhorn_iters != 1:
        raise ValueError(f"the one-tile kernels run one normalization round (got sinkhorn_iters={sinkhorn_iters}); "
                         "more rounds run long.py")
    kpad, qpad, seed = prepare_call(q, k, key_padding_mask, query_padding_mask, dropout_p, seed)
    return TritonShortAttention.apply(q, k, v, hybrid_weight, kpad, qpad, float(dropout_p), seed)
