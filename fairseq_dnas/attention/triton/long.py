"""DNAS/HNAS attention as Triton kernels: no T_q x T_k matrix, forward and backward.

The GPU execution path (``kernels.py`` chooses it on CUDA). The same kernels
run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``), which
is how CI tests them without a GPU. Written after the structure of Triton's
fused-attention tutorial (online softmax over key blocks, a key-major and a
query-major backward pass that recompute the probabilities from the saved
row log-sum-exp); the algorithm is the paper's Algorithm 1 through the
log-domain identity (``docs/math.md#the-log-domain-identity``). The equations
below, with their derivation: ``docs/math.md#the-triton-kernels-pass-by-pass``.

Notation: scaled queries q_i (i < T_q), keys k_j and values v_j (j < T_k),
scores s[i, j] = q_i . k_j; "real" positions are those that are not padding.

Forward
    1. ``_column_lse_kernel`` (``column.py``; one program per key block): the DNAS column
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
       drawn by Philox from (seed, b H + h, i, j // 16), 16 decisions a call
       (``dropout.dropout_bytes``), so that the backward replays the
       very same mask without storing it, whatever the tiles; p is applied
       rounded to a multiple of 1/256 (``effective_dropout_p``). The mask
       zeroes the probabilities once rounded to the dtype of v, right before
       their product with v (``dropped``: two half-precision values an
       instruction), and 1 / (1 - p) scales the output once at the end.

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
       end; q_i is replaced by q_i - mu, the mean real query, which the DNAS
       part's ds, summing to 0 over i, does not see: ``_backward_kv_kernel``),
       and dL/du = sum_ij G[i, j] (pi_D - pi_U)[i, j] per key block.
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
matmuls use TF32: ``precision``), probabilities are cast to the dtype of v
before the products with v, as fairseq does.

Strides: every tensor is read and written with its own strides (inputs may
be views of a packed projection or expanded; each gradient is a fresh buffer
written with its strides). Grid, 64-bit offsets and
tile loads: ``launch.py``; tiles: ``tiles.py``; the dropout mask:
``dropout.py``; all shared with ``short.py`` and ``sinkhorn.py``.

Sinkhorn iterations (``sinkhorn_iters`` > 1): ``sinkhorn.py`` computes
the earlier normalizers with the column pass above (``lse_pass``) and the
gradient through them; these kernels take the last ones as c and xi's row bias.
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.functional import check_sinkhorn_iters
from fairseq_dnas.attention.triton import sinkhorn
from fairseq_dnas.attention.triton.call import call_facts, output_buffer, prepare_call
from fairseq_dnas.attention.triton.column import NEG_INIT, lse_pass
from fairseq_dnas.attention.triton.dropout import (dropout_bytes, dropout_scale, dropout_setup, dropout_threshold,
                                                   dropped, threshold_pair)
from fairseq_dnas.attention.triton.launch import (block_d, cdiv, grid, load_tile, needs_int64, offsets, on_device,
                                                  pad_arg, precision, program, real, store_tile, strides)
from fairseq_dnas.attention.triton.tiles import STAGES, kernel_tile


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@triton.jit
def _online_softmax_step(m, l, acc, s, v, byte, t_pair, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of an online softmax (FlashAttention): running row max m,
    row sum l of exp(s - m) (dropout does not change the normalizer) and
    accumulator sum_j exp(s_j - m) Z_j v_j, all rescaled to the new max.
    Also returns the new max and the
    block's exp(s - m_new) (HNAS's UNAS part follows from them: ``_forward_kernel``)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    l, acc = _online_accumulate(l, acc, p, alpha, v, byte, t_pair, DROPOUT, PRECISION)
    return m_new, l, acc, p


@triton.jit
def _online_accumulate(l, acc, p, alpha, v, byte, t_pair, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """The sums of an online softmax step given the block's p = exp(s - m_new)
    and alpha = exp(m - m_new): l alpha + sum_j p, acc alpha + (Z p) V."""
    l = l * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)
    if DROPOUT:  # on the rounded p, where a pair of keys is one 32-bit register (dropped)
        p = dropped(p, byte, t_pair)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return l, acc


@triton.jit
def _forward_tile(q, K, V, C, b, h, bh, offs_m, start_n, offs_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
                  TK, D, seed, INT64: tl.constexpr, BLOCK_N: tl.constexpr, DROPOUT: tl.constexpr,
                  PRECISION: tl.constexpr):
    """What the forward reads and computes first for one key block: v, c
    (+inf at padded keys and past T_k: s - c = -inf, weight 0), the scores
    s = Q K^T and the dropout bytes (0 without)."""
    offs_n = offsets(start_n, BLOCK_N, INT64)
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    v = load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
    c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (M, N)
    byte = 0
    if DROPOUT:
        byte = dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N)
    return v, c, s, byte


@triton.jit
def _forward_kernel(
    Q, K, V, C, U, SEED, OUT, OD, RD, RU, QPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    so_b, so_h, so_t, so_d,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, PRECISION: tl.constexpr,
    INT64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out = pi V for one query block: DNAS (softmax with key bias -c), and for
    HNAS the UNAS softmax of the same scores in a second accumulator. OUT and
    OD share the strides so_*. Key padding comes with c (+inf at padded keys,
    ``_column_lse_kernel``): no mask is loaded in the loop. Rows with no
    weight (padded queries, no real key) get r = +inf, which zeroes their
    probabilities in the backward kernels without a mask either."""
    pid_m, bh, b, h = program(TQ, H, BLOCK_M, INT64)
    offs_m = offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    seed = 0
    t_pair = 0
    if DROPOUT:
        seed = tl.load(SEED)
        t_pair = threshold_pair(drop_threshold)
    m_d = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    l_d = tl.zeros([BLOCK_M], tl.float32)
    acc_d = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HYBRID:
        m_u = tl.full([BLOCK_M], NEG_INIT, tl.float32)
        l_u = tl.zeros([BLOCK_M], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, TK, BLOCK_N):
        v, c, s, byte = _forward_tile(q, K, V, C, b, h, bh, offs_m, start_n, offs_d, sk_b, sk_h, sk_t, sk_d,
                                      sv_b, sv_h, sv_t, sv_d, TK, D, seed, INT64, BLOCK_N, DROPOUT, PRECISION)
        # DNAS: softmax of s - c (step 4 as a key bias).
        m_d, l_d, acc_d, p_d = _online_softmax_step(m_d, l_d, acc_d, s - c[None, :], v, byte, t_pair, DROPOUT,
                                                    PRECISION)
        if HYBRID:  # UNAS: softmax of the same scores (step 3), padded keys (c = inf) left out
            s_u = tl.where(c[None, :] < float("inf"), s, float("-inf"))
            m_u, l_u, acc_u, _ = _online_softmax_step(m_u, l_u, acc_u, s_u, v, byte, t_pair, DROPOUT, PRECISION)
    # Rows without a real key (an all-padding sentence) have l = 0: output 0.
    ok_d = real_q & (l_d > 0)
    if DROPOUT:
        scale = dropout_scale(drop_threshold)  # 1 / (1 - p_eff); 0 for p = 1
    else:
        scale = 1.0
    l_d = tl.where(ok_d, l_d, 1.0)
    o_d = tl.where(ok_d[:, None], acc_d * (scale / l_d)[:, None], 0.0)
    tl.store(RD + bh * TQ + offs_m, tl.where(ok_d, m_d + tl.log(l_d), float("inf")), mask=offs_m < TQ)
    out_base = OUT + b * so_b + h * so_h
    if HYBRID:
        u = tl.load(U + h)
        ok_u = real_q & (l_u > 0)
        l_u = tl.where(ok_u, l_u, 1.0)
        o_u = tl.where(ok_u[:, None], acc_u * (scale / l_u)[:, None], 0.0)
        tl.store(RU + bh * TQ + offs_m, tl.where(ok_u, m_u + tl.log(l_u), float("inf")), mask=offs_m < TQ)
        store_tile(OD + b * so_b + h * so_h, o_d.to(OD.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)
        out = u * o_d + (1.0 - u) * o_u  # step 5 (Eq. 12)
    else:
        out = o_d
    store_tile(out_base, out.to(OUT.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@triton.jit
def _backward_preprocess_kernel(
    OUT, OD, DO, U, ED, EU, QPAD,
    so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d,
    H, TQ, D,
    HYBRID: tl.constexpr, HAS_PAD: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """E_D[i] = u dO_i . O_D,i and E_U[i] = dO_i . out_i - E_D[i] (0 at padded rows)."""
    pid_m, bh, b, h = program(TQ, H, BLOCK_M, INT64)
    offs_m = offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D).to(tl.float32)
    out = load_tile(OUT + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
    delta = tl.sum(do * out, 1)  # D_i = dO_i . out_i
    if HYBRID:
        u = tl.load(U + h)
        o_d = load_tile(OD + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
        e_d = u * tl.sum(do * o_d, 1)
        tl.store(EU + bh * TQ + offs_m, delta - e_d, mask=offs_m < TQ)
    else:
        e_d = delta
    tl.store(ED + bh * TQ + offs_m, e_d, mask=offs_m < TQ)


@triton.jit
def _key_block(K, V, C, KPAD, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TK, D,
               HAS_PAD: tl.constexpr, INT64: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """What a key-major program holds through its loop: (block, batch * head,
    batch, head, key offsets, head-dimension offsets, real keys, k, v, c; c =
    +inf at padded keys and past T_k)."""
    pid_n, bh, b, h = program(TK, H, BLOCK_N, INT64)
    offs_n = offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_k = real(KPAD, b, offs_n, TK, HAS_PAD)
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    v = load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
    c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))
    return pid_n, bh, b, h, offs_n, offs_d, real_k, k, v, c


@triton.jit
def _kv_tile(k, v, q, do, c, r_d, e_d, u_g, seed, t_pair, bh, offs_m, start_n, TK, BLOCK_N: tl.constexpr,
             DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """One (keys, queries) tile of the key-major backward: scores s^T, pi_D^T (0 at padded keys and queries: c, r = inf), G / scale
    = Z (dO V^T), the dropout bytes (0 without dropout) and the softmax
    gradient of the DNAS part at fixed c, t = pi_D (u G - E_D)."""
    s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M)
    p_d = tl.exp(s_t - c[:, None] - r_d[None, :])
    g = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dO_i . v_j
    byte = 0
    if DROPOUT:
        byte = dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N, True)  # (N, M)
        g = dropped(g, byte, t_pair)
    return s_t, p_d, g, byte, p_d * (u_g * g - e_d[None, :])


@triton.jit
def _kv_mixture(RU, EU, bh, TQ, offs_m, p_d, s_t, real_k, u, scale, g, t, tu, du, dv, do, byte, t_pair,
                HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """HNAS's UNAS part added to t (its column sum to tu, dL/du's to du), and
    dv += (Z pi_H)^T dO (times scale at the end; pi_H = pi_D for DNAS)."""
    if HYBRID:
        t_u, du_j, p = _unas_backward(RU, EU, bh, TQ, offs_m, p_d, s_t, real_k, u, scale, g)
        tu += tl.sum(t_u, 1)
        t += t_u
        du += du_j
    else:
        p = p_d
    p = p.to(do.dtype)
    if DROPOUT:
        p = dropped(p, byte, t_pair)
    return t, tu, du, dv + tl.dot(p, do, input_precision=PRECISION)


@triton.jit
def _unas_backward(RU, EU, bh, TQ, offs_m, p_d, s_t, real_k, u, scale, g):
    """HNAS's UNAS part of a key-major tile (keys, queries): t_U = pi_U ((1 - u) G - E_U),
    this tile's dL/du = sum_i G (pi_D - pi_U) (times scale at the end) and the mixture
    pi_H = u pi_D + (1 - u) pi_U. pi_U^T is 0 at padded keys (real_k) and queries (r_u = inf)."""
    r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
    e_u = tl.load(EU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    p_u = tl.where(real_k[:, None], tl.exp(s_t - r_u[None, :]), 0.0)
    t_u = p_u * ((1.0 - u) * scale * g - e_u[None, :])
    return t_u, tl.sum(g * (p_d - p_u), 1), u * p_d + (1.0 - u) * p_u


@triton.jit
def _backward_kv_kernel(
    Q, K, V, C, XB, U, SEED, DO, RD, RU, ED, EU, QM, DK, DV, DC, DU, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d, sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, SINKHORN: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk, dv, dc (and this block's share of dL/du) for one key block; every
    tile is held transposed, (keys, queries). With SINKHORN, c is the last
    column normalizer a_n and XB the row normalizer b_{n-1} before it, so
    that xi = exp(s - b_{n-1} - c) (``sinkhorn.py``).

    dk uses the queries less QM, their mean over the real queries of this
    (batch, head): the DNAS part of ds sums to 0 over the real queries of
    every key (sum_i t[i, j] = -dc[j] and sum_i xi[i, j] = 1), so
    sum_i ds[i, j] q_i = sum_i ds[i, j] (q_i - mu) exactly, and the products
    (each rounded to the input dtype before the matmul) no longer carry the
    mean query, which the sum dk_t + dc dk_x would cancel only up to their
    rounding (large with a q_proj bias). HNAS's UNAS part does not sum to 0:
    its sum_i t_u[i, j] mu is added back in float32.

    Padding: c = +inf at padded keys and r = +inf at padded queries (the
    forward's convention) zero pi_D and pi_U without a mask in the loop; the
    key mask, loaded once, keeps pi_U's padded keys out."""
    pid_n, bh, b, h, offs_n, offs_d, real_k, k, v, c = _key_block(
        K, V, C, KPAD, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TK, D, HAS_PAD, INT64, BLOCK_N, BLOCK_D)
    mu = tl.load(QM + bh * D + offs_d, mask=offs_d < D, other=0.0)  # float32 mean query
    if HYBRID:
        u = tl.load(U + h)
    else:
        u = 1.0
    # G = Z' (dO V^T) = scale Z (dO V^T): the scale goes into u, 1 - u and the final dv, du
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    u_g = u * scale
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dk_t = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i (ds - xi dc)[i, j] (q_i - mu)
    dk_x = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i xi[i, j] (q_i - mu)
    dc = tl.zeros([BLOCK_N], tl.float32)
    du = tl.zeros([BLOCK_N], tl.float32)
    tu = tl.zeros([BLOCK_N], tl.float32)  # HNAS: sum_i t_u[i, j], the UNAS part's column sum
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = offsets(start_m, BLOCK_M, INT64)
        r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
        real_q = r_d < float("inf")  # padded queries have r_d = +inf
        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
        e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        s_t, p_d, g, byte, t = _kv_tile(k, v, q, do, c, r_d, e_d, u_g, seed, t_pair, bh, offs_m, pid_n * BLOCK_N,
                                         TK, BLOCK_N, DROPOUT, PRECISION)
        dc -= tl.sum(t, 1)  # dc[j] = -sum_i t[i, j]
        if SINKHORN:  # exp(s - b_{n-1} - c) = p_d exp(r_d - b_{n-1})
            r_x = r_d - tl.load(XB + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        else:
            r_x = r_d
        exp_r = tl.where(real_q, tl.exp(r_x), 0.0)  # not 0 * exp(inf) = NaN at padded rows
        xi = p_d * exp_r[None, :]  # column softmax exp(s - c) = d c[j] / d s[i, j]
        # q - mu, rounded once to the input dtype (rows with p_d = 0 contribute nothing)
        qc = (q.to(tl.float32) - mu[None, :]).to(q.dtype)
        dk_x += tl.dot(xi.to(q.dtype), qc, input_precision=PRECISION)
        t, tu, du, dv = _kv_mixture(RU, EU, bh, TQ, offs_m, p_d, s_t, real_k, u, scale, g, t, tu, du, dv, do, byte,
                                    t_pair, HYBRID, DROPOUT, PRECISION)
        dk_t += tl.dot(t.to(q.dtype), qc, input_precision=PRECISION)
    # dk_j = sum_i ds[i, j] q_i, ds[i, j] = t[i, j] + xi[i, j] dc[j]: the sum over (q_i - mu),
    # plus mu times the column sum of ds, which only HNAS's UNAS part leaves
    dk = dk_t + dc[:, None] * dk_x
    if HYBRID:
        dk += tu[:, None] * mu[None, :]
    _kv_store(DK, DV, DC, DU, dk, dv, dc, du, scale, b, h, bh, pid_n, offs_n, offs_d,
              sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d, TK, D, BLOCK_N, HYBRID, DROPOUT)


@triton.jit
def _kv_store(DK, DV, DC, DU, dk, dv, dc, du, scale, b, h, bh, pid_n, offs_n, offs_d,
              sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d, TK, D, BLOCK_N: tl.constexpr,
              HYBRID: tl.constexpr, DROPOUT: tl.constexpr):
    """The key-major pass's results for one key block: dk, dv (times the dropout
    scale), dc and, for HNAS, the block's share of dL/du (times the scale)."""
    if DROPOUT:
        dv *= scale
        du *= scale
    store_tile(DK + b * sdk_b + h * sdk_h, dk.to(DK.dtype.element_ty), offs_n, offs_d, sdk_t, sdk_d, TK, D)
    store_tile(DV + b * sdv_b + h * sdv_h, dv.to(DV.dtype.element_ty), offs_n, offs_d, sdv_t, sdv_d, TK, D)
    tl.store(DC + bh * TK + offs_n, dc, mask=offs_n < TK)
    if HYBRID:
        tl.store(DU + bh * tl.cdiv(TK, BLOCK_N) + pid_n, tl.sum(du, 0))


@triton.jit
def _q_loop(q, do, K, V, C, DC, r_d, r_u, e_d, e_u, exp_r, u, u_g, scale, seed, t_pair, b, h, bh, offs_m, offs_d,
            sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, TK, D,
            HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The query-major loop over the key blocks: dq of one query block
    (``_backward_q_kernel``)."""
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_end = TK
    if DROPOUT:  # At least one pass (for T_k = 0 it adds 0: every key is past T_k, c = inf), so that
        # LLVM drops the path that skips the loop: with dropout it zeroes dq's registers again on that
        # path, and ptxas, finding them defined between a wgmma and its wait, serializes every wgmma
        n_end = tl.maximum(TK, 1)
    for start_n in range(0, n_end, BLOCK_N):
        offs_n = offsets(start_n, BLOCK_N, INT64)
        k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
        v = load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
        c = tl.load(C + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))
        dc = tl.load(DC + bh * TK + offs_n, mask=offs_n < TK, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (M, N)
        p_d = tl.exp(s - c[None, :] - r_d[:, None])  # 0 at padded keys (c = inf) and queries (r_d = inf)
        g = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if DROPOUT:
            g = dropped(g, dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N), t_pair)  # G / scale
        # ds = pi_D (u G - E_D) + xi dc  [+ pi_U ((1 - u) G - E_U)]
        ds = p_d * (u_g * g - e_d[:, None] + exp_r[:, None] * dc[None, :])
        if HYBRID:
            p_u = tl.where(c[None, :] < float("inf"), tl.exp(s - r_u[:, None]), 0.0)  # padded keys: 0
            ds += p_u * ((1.0 - u) * scale * g - e_u[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


@triton.jit
def _backward_q_kernel(
    Q, K, V, C, XB, U, SEED, DO, RD, RU, ED, EU, DC, DQ,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d, sdq_b, sdq_h, sdq_t, sdq_d,
    B, H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, SINKHORN: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dq_i = sum_j ds[i, j] k_j for one query block, with dc from the kv pass.

    B (the batch size) is not read: it keeps the integer parameters where
    they were, so that ptxas loads them as before (without it, one more
    load in the loop: the compiled code would no longer be the one timed).

    ds is float32 and rounded to the input dtype only for the matmul. Bound
    (float16): with G_max = max |G| = max |dO_i . v_j| / (1 - p) (dO carries
    the loss scale), |E_D| <= u G_max, |t| <= 2 u G_max pi_D, |dc[j]| <=
    2 u G_max colsum_j(pi_D) and xi <= 1, so
        |ds| <= 2 G_max (u (1 + max_j colsum_j(pi_D)) + 1 - u),
    colsum <= T_q (Theorem 2 bounds it from below by 1 / T_k). fairseq's
    loss scale has no ceiling (init 2**7, --fp16-init-scale; doubled every
    --fp16-scale-window updates without an overflow), so some scale always
    overflows float16: ds then becomes inf, dq inf or NaN, and fairseq's
    overflow check skips the update and halves the scale, as for any float16
    gradient (fairseq's own attention rounds G itself to float16).

    Padding, as in the kv kernel: c = +inf at padded keys, r = +inf at
    padded queries; no mask is loaded."""
    pid_m, bh, b, h = program(TQ, H, BLOCK_M, INT64)
    offs_m = offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
    real_q = r_d < float("inf")  # padded queries have r_d = +inf
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
    e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    if SINKHORN:  # xi = exp(s - b_{n-1} - c) = p_d exp(r_d - b_{n-1})
        r_x = r_d - tl.load(XB + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    else:
        r_x = r_d
    exp_r = tl.where(real_q, tl.exp(r_x), 0.0)  # not 0 * exp(inf) = NaN at padded rows
    if HYBRID:
        u = tl.load(U + h)
        r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
        e_u = tl.load(EU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    else:
        u = 1.0
        r_u = r_d
        e_u = e_d
    # G = scale Z (dO V^T): the scale goes into u and 1 - u
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    u_g = u * scale
    dq = _q_loop(q, do, K, V, C, DC, r_d, r_u, e_d, e_u, exp_r, u, u_g, scale, seed, t_pair, b, h, bh, offs_m,
                 offs_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, TK, D, HYBRID, DROPOUT,
                 PRECISION, INT64, BLOCK_M, BLOCK_N, BLOCK_D)
    store_tile(DQ + b * sdq_b + h * sdq_h, dq.to(DQ.dtype.element_ty), offs_m, offs_d, sdq_t, sdq_d, TQ, D)


# --------------------------------------------------------------------------
# Launchers and autograd
# --------------------------------------------------------------------------


def _gradient_buffer(x: Tensor) -> Tensor:
    """A fresh tensor for x's gradient: x's layout when x is dense (e.g. the
    fairseq module's permuted (T, B, H, D) projections), else contiguous (a
    chunk of a packed projection, an expanded tensor with stride 0). The
    kernels write it with its own strides, whatever x's are."""
    return torch.empty_like(x)


def query_mean(q: Tensor, qpad: Optional[Tensor]) -> Tensor:
    """(B, H, D) float32 mean of the real queries of each (batch, head) (0
    where there is none): the mu of ``_backward_kv_kernel``. Any mu gives
    the same dk in exact arithmetic; the mean makes q - mu small. One
    matmul of the real positions' weights with q, accumulated in float32
    and rounded to q's dtype (a rounded mean is as good a mu)."""
    bsz, heads, tq, d = q.shape
    real = torch.ones((bsz, tq), dtype=torch.float32, device=q.device) if qpad is None else (~qpad).float()
    w = real / real.sum(1, keepdim=True).clamp(min=1.0)  # (B, T): 1 / n_real at real positions
    mean = torch.matmul(w.to(q.dtype)[:, None, None, :], q.detach())  # (B, 1, 1, T) @ (B, H, T, D)
    return mean.reshape(bsz, heads, d).float().contiguous()


def _forward(q, k, v, u, kpad, qpad, p_drop, seed, sinkhorn_iters):
    """Output, HNAS's O_D, the key bias c (DNAS: the column normalizer; with
    Sinkhorn iterations the last one, a_n), row lse's r_d (r_u) and, with
    Sinkhorn iterations, the normalizer stacks (a, b) of sinkhorn.py."""
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, has_pad) = call_facts(q, k, u, kpad, p_drop)
    f32 = dict(dtype=torch.float32, device=q.device)
    r_d = torch.empty((bsz, heads, tq), **f32)
    r_u = torch.empty((bsz, heads, tq), **f32) if hybrid else r_d
    out = output_buffer(q, v.dtype)
    o_d = output_buffer(q, v.dtype) if hybrid else out
    qpad_arg, kpad_arg = pad_arg(qpad, q), pad_arg(kpad, q)
    int64 = needs_int64(q, k, v, out)
    meta = dict(HAS_PAD=has_pad, PRECISION=precision(q.dtype), INT64=int64, BLOCK_D=block_d(d))
    if sinkhorn_iters == 1:
        pads = (kpad_arg, qpad_arg) if has_pad else (None, None)
        c = lse_pass(k, q, *pads, torch.empty((bsz, heads, tk), **f32))
        normalizers = None
    else:
        normalizers = sinkhorn.normalizers(q, k, qpad_arg, kpad_arg, has_pad, sinkhorn_iters)
        c = normalizers[0][-1]
    bm, bn, warps, stages = kernel_tile("forward", d, q.dtype)
    with on_device(q):
        _forward_kernel[grid(tq, bm, bsz, heads)](
            q, k, v, c, u if hybrid else c, seed, out, o_d, r_d, r_u, qpad_arg,
            *strides(q), *strides(k), *strides(v), *strides(out),
            heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
        )
    return out, o_d, c, r_d, r_u, normalizers


def backward_buffers(q: Tensor, k: Tensor, hybrid: bool, kv_block: int):
    """E_D, E_U (B, H, T_q; E_U only for HNAS, else E_D again), dc (B, H, T_k)
    and HNAS's per-key-block sums of dL/du (B, H, cdiv(T_k, kv_block); else dc
    again): float32, uninitialized (the kernels write every element)."""
    bsz, heads, tq, _ = q.shape
    tk = k.shape[2]
    f32 = dict(dtype=torch.float32, device=q.device)
    e_d = torch.empty((bsz, heads, tq), **f32)
    dc = torch.empty((bsz, heads, tk), **f32)
    if not hybrid:
        return e_d, e_d, dc, dc
    return e_d, torch.empty((bsz, heads, tq), **f32), dc, torch.empty((bsz, heads, cdiv(tk, kv_block)), **f32)


def _backward(do, q, k, v, u, kpad, qpad, p_drop, seed, out, o_d, c, r_d, r_u, normalizers=None):
    """dq, dk, dv (each in a buffer of its own layout, ``_gradient_buffer``)
    and du."""
    bsz, heads, tq, d = q.shape
    tk = k.shape[2]
    threshold = dropout_threshold(p_drop)
    hybrid, dropout, has_pad = u is not None, threshold > 0, kpad is not None
    kv_m, kv_n, kv_warps, kv_stages = kernel_tile("backward_kv", d, q.dtype)
    e_d, e_u, dc, du_part = backward_buffers(q, k, hybrid, kv_n)
    dq, dk, dv = _gradient_buffer(q), _gradient_buffer(k), _gradient_buffer(v)
    mu = query_mean(q, qpad)
    qpad_arg, kpad_arg = pad_arg(qpad, q), pad_arg(kpad, q)
    u_arg = u if hybrid else c
    rounds = normalizers is not None  # Sinkhorn iterations > 1
    x_b = normalizers[1][-1] if rounds else c  # b_{n-1}, the row bias of xi_n
    int64 = needs_int64(q, k, v, do, out, dq, dk, dv)
    meta = dict(HAS_PAD=has_pad, INT64=int64, BLOCK_D=block_d(d))
    flags = dict(HYBRID=hybrid, DROPOUT=dropout, SINKHORN=rounds, PRECISION=precision(q.dtype), **meta)
    bm, _, warps, _ = kernel_tile("forward", d, q.dtype)
    with on_device(q):
        _backward_preprocess_kernel[grid(tq, bm, bsz, heads)](
            out, o_d, do, u_arg, e_d, e_u, qpad_arg, *strides(out), *strides(do), heads, tq, d,
            HYBRID=hybrid, BLOCK_M=bm, num_warps=warps, num_stages=STAGES, **meta,  # no loop to pipeline
        )
        _backward_kv_kernel[grid(tk, kv_n, bsz, heads)](
            q, k, v, c, x_b, u_arg, seed, do, r_d, r_u, e_d, e_u, mu, dk, dv, dc, du_part, kpad_arg,
            *strides(q), *strides(k), *strides(v), *strides(do), *strides(dk), *strides(dv),
            heads, tq, tk, d, threshold,
            BLOCK_M=kv_m, BLOCK_N=kv_n, num_warps=kv_warps, num_stages=kv_stages, **flags,
        )
        bm, bn, warps, stages = kernel_tile("backward_q", d, q.dtype)
        _backward_q_kernel[grid(tq, bm, bsz, heads)](
            q, k, v, c, x_b, u_arg, seed, do, r_d, r_u, e_d, e_u, dc, dq,
            *strides(q), *strides(k), *strides(v), *strides(do), *strides(dq),
            bsz, heads, tq, tk, d, threshold,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages,
            **{key: value for key, value in flags.items() if key != "HAS_PAD"},  # padding comes with c and r
        )
        if rounds:  # the chain through the earlier normalizers, added into dq and dk
            sinkhorn.backward_through_normalizers(
                q, k, qpad_arg, kpad_arg, has_pad, *normalizers, dc, dq, dk)
    du = du_part.sum(dim=(0, 2)) if hybrid else None
    return dq, dk, dv, du


class TritonLongAttention(torch.autograd.Function):
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

    q, k, v may have any strides (views of a packed projection, expanded
    tensors); the gradients come back in buffers of their own. Masks are
    (B, T) bool, True at padding; for self-attention pass the same tensor
    twice. ``dropout_p`` in [0, 1] drops the final probabilities with the
    Philox stream of ``seed`` (an int64 tensor of one element on q's device;
    drawn with ``dropout.new_seed`` when None), at the rate
    ``dropout.effective_dropout_p`` (p rounded to a multiple of 1/256); p = 1
    gives zeros. ``sinkhorn_iters`` > 1 repeats the (column, row)
    normalization of DNAS (``sinkhorn.py``).
    """
    check_sinkhorn_iters(sinkhorn_iters)
    kpad, qpad, seed = prepare_call(q, k, key_padding_mask, query_padding_mask, dropout_p, seed)
    if seed is None:
        seed = torch.zeros((1,), dtype=torch.int64, device=q.device)
    return TritonLongAttention.apply(q, k, v, hybrid_weight, kpad, qpad, float(dropout_p), seed, sinkhorn_iters)
