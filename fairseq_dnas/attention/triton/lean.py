"""DNAS/HNAS attention as Triton kernels, two launches forward and three
backward: the lean kernel set (any length, one normalization round).

The same results as ``long.py`` (the same dropout mask for the same seed),
computed with fewer passes: 2 launches forward, 3 backward, against long.py's
2 and 3 plus 8 torch operations. The backward is one key-major program per
key block with two loops over the query blocks, and dq accumulated across
programs with float32 atomic adds (as FlashAttention-2 does), so its sums are
not bitwise repeatable: ``torch.use_deterministic_algorithms(True)`` runs the
long kernels (``selection.py``). The derivation of the backward:
``docs/math.md#the-lean-backward-two-loops-in-one-key-major-program``.

Notation as in ``long.py``: scaled queries q_i (i < T_q), keys k_j, values
v_j (j < T_k), scores s[i, j] = q_i . k_j. The kernels work in the exp2
domain: with L = log2(e), every normalizer below is stored times L (c2 = L c,
r2 = L r) and every probability is one exp2 of an FMA, 2^(L s - c2 - r2).

Forward (2 launches)
    1. ``_lean_column_kernel`` (one program per key block):
           c2[j] = log2 sum_{real i} 2^(L s[i, j])        (Algorithm 1, step 4)
       and, in the program of key block 0 (a second loop over the queries,
       out of the hot one),
           mu = mean of the real q_i                      (the centring of dk)
       so that no torch operation computes it.
    2. ``_lean_forward_kernel`` (one program per query block): online softmax of
       L s - c2 over the key blocks (DNAS, row lse r2) and, for HNAS, of L s
       (UNAS, r2_u), HNAS's two from one exp2 a score (``column_factors``);
       out = u O_D + (1 - u) O_U (step 5, Eq. 12), and for the
       backward O_D - O_U in float32, 2^r2 and HNAS's row factor 2^(r2_u - r2). Dropout as in long.py (``dropout.py``:
       the mask of (seed, b H + h, i, j)).

Backward (3 launches; dO the upstream gradient, Z' = Z / (1 - p),
G = Z' (dO V^T), E_D[i] = u dO_i . O_D,i, E_U[i] = dO_i . out_i - E_D[i])
    0. ``_lean_preprocess_kernel``: E_D, E_U, a zeroed float32 dq and, for
       HNAS, each query's share of dL/du = sum_i dO_i . (O_D - O_U)_i (out is
       linear in u; O_D = out + (1 - u) (O_D - O_U) gives E_D).
    1. ``_lean_backward_kernel`` (one program per key block), two loops over
       the query blocks:
         loop 1: pi_D = 2^(L s - c2 - r2) (the normalizers known: no running
           max), dv_D += (Z pi_D)^T dO and pe[j] += sum_i pi_D[i, j] E_D[i];
           after it, dc[j] = -(u v_j . dv_D,j - pe[j])   (= -sum_i t[i, j])
         loop 2: pi_D and dP again, and
           ds = pi_D (u G - E_D + 2^r2 dc)  [+ pi_U ((1 - u) G - E_U)]
           dk += ds^T (Q - mu), dq += ds K  (float32 atomic add)
           HNAS: dv += (1 - u) (Z pi_U)^T dO, and the UNAS part's column
           sum of ds for dk's mu term.
         Loop 2 reads 2^r2 from the forward (ER) and, HNAS, takes pi_U and
         pi_D from one exp2 with a factor per key and one per query
         (``column_factors``); odd key blocks walk the query blocks backwards,
         so that neighbouring key blocks of a head do not add to the same dq
         rows at once.
       Six matmuls per block pair (K Q^T and (Z P)^T dO; K Q^T, V dO^T, ds^T Q
       and ds K), one exp2 a loop for DNAS and HNAS alike; no dc buffer, no
       query-major pass.
    2. dq to the input dtype (one torch copy; none for float32), and HNAS's
       dL/du summed over the queries and the batch (one torch sum).

A score bias B (1 or B, 1 or H, T_q, T_k; T5's position bias) is read as
a tile in every pass and added to q . k before the factor L, so every
formula above holds for s = q . k + B; the backward adds loop 2's ds (dL/dS
= dL/dB) into a float32 dB of B's shape with atomic adds (stride 0 where B
is broadcast: the batch rows of a shared bias sum there, in memory the size
of B). ``docs/math.md#a-biased-score``.

Padding, strides and tiles as in long.py: c2 = +inf at padded keys and past
T_k, r2 = +inf at padded queries, so no mask is loaded in the loops; every
tensor is read and written with its own strides; tiles from ``tiles.py``
(entries ``lean_column``, ``lean_forward``, ``lean_backward``, and
``lean_forward_hnas``, ``lean_backward_hnas`` for HNAS's larger register need).
"""

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton.call import call_facts, output_buffer, prepare_call
from fairseq_dnas.attention.triton.column import NEG_INIT
from fairseq_dnas.attention.triton.dropout import (dropout_bytes, dropout_scale, dropout_setup, dropout_threshold,
                                                   dropped, threshold_pair)
from fairseq_dnas.attention.triton.launch import (block_d, grid, load_tile, needs_int64, offsets, on_device,
                                                  pad_arg, precision, program, real, store_tile, strides)
from fairseq_dnas.attention.triton.tiles import STAGES, kernel_tile

LOG2E = tl.constexpr(1.4426950408889634)  # L = log2(e): exp(x) = 2^(L x)


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@triton.jit
def bias_tile(base, offs_r, offs_c, stride_r, stride_c, R, C):
    """The score bias at rows offs_r and columns offs_c of one (batch, head)
    plane starting at ``base``, in float32; 0 outside [0, R) x [0, C) (those
    scores are masked by c2, r2 = +inf). A (keys, queries) tile passes the
    key offsets and stride first."""
    ptrs = base + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
    return tl.load(ptrs, mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0).to(tl.float32)


@triton.jit
def _lean_column_kernel(
    Q, K, C2, CB, MU, QPAD, KPAD, BIAS,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sb_b, sb_h, sb_q, sb_k,
    H, TQ, TK, D,
    HYBRID: tl.constexpr, HAS_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """c2[j] = L c[j] = log2 sum over real queries i of 2^(L s[i, j]) (+inf at
    padded keys and keys no real query sees), as ``column.py``'s pass in base
    2; the program of key block 0 also writes mu (B, H, D) float32, the mean
    of the real queries (0 where there is none). HNAS: also CB (B, H, 3, T_k),
    the key terms w, f_U, f_D of ``column_factors``."""
    pid_n, bh, b, h = program(TK, H, BLOCK_N, INT64)
    offs_n = offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    m = tl.full([BLOCK_N], NEG_INIT, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = offsets(start_m, BLOCK_M, INT64)
        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        # padded queries and rows past T_q stay out of c: a bias of -inf, added in the FMA with L
        q_bias = tl.where(real(QPAD, b, offs_m, TQ, HAS_PAD), 0.0, float("-inf"))
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M)
        if HAS_BIAS:  # S + B (docs/math.md#a-biased-score), then into the log2 domain with it
            s_t += bias_tile(BIAS + b * sb_b + h * sb_h, offs_n, offs_m, sb_k, sb_q, TK, TQ)
        s_t = s_t * LOG2E + q_bias[None, :]  # L (s + b)^T
        m_new = tl.maximum(m, tl.max(s_t, 1))
        l = l * tl.exp2(m - m_new) + tl.sum(tl.exp2(s_t - m_new[:, None]), 1)
        m = m_new
    ok = real(KPAD, b, offs_n, TK, HAS_PAD) & (l > 0)
    c2 = tl.where(ok, m + tl.log2(tl.where(ok, l, 1.0)), float("inf"))
    tl.store(C2 + bh * TK + offs_n, c2, mask=offs_n < TK)
    if HYBRID:
        w, f_u, f_d = column_factors(c2)
        tl.store(CB + (3 * bh) * TK + offs_n, w, mask=offs_n < TK)
        tl.store(CB + (3 * bh + 1) * TK + offs_n, f_u, mask=offs_n < TK)
        tl.store(CB + (3 * bh + 2) * TK + offs_n, f_d, mask=offs_n < TK)
    if pid_n == 0:  # this program's head: the mean real query, in a loop of its own (not in the one above)
        q_sum = tl.zeros([BLOCK_D], tl.float32)
        n_real = tl.zeros([BLOCK_M], tl.float32)
        for start_m in range(0, TQ, BLOCK_M):
            offs_m = offsets(start_m, BLOCK_M, INT64)
            real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
            q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, real_q, D)  # padded rows read 0
            q_sum += tl.sum(q.to(tl.float32), 0)
            n_real += real_q.to(tl.float32)
        tl.store(MU + bh * D + offs_d, q_sum / tl.maximum(tl.sum(n_real, 0), 1.0), mask=offs_d < D)


@triton.jit
def _online_step2(m, l, acc, x, v, byte, t_pair, DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of an online softmax in base 2 (x = L s - bias): running
    row max m, row sum l of 2^(x - m) (dropout does not change it) and
    acc = sum_j 2^(x_j - m) Z_j v_j, rescaled to the new max."""
    m_new = tl.maximum(m, tl.max(x, 1))
    p = tl.exp2(x - m_new[:, None])
    alpha = tl.exp2(m - m_new)
    l = l * alpha + tl.sum(p, 1)
    p = p.to(v.dtype)
    if DROPOUT:  # on the rounded p (dropout.dropped: two half-precision values an instruction)
        p = dropped(p, byte, t_pair)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l, acc


@triton.jit
def column_factors(c2):
    """HNAS's key terms (w, f_U, f_D) for one exponential a score: with
    e = 2^(L s + w_j - m) for a row's m,
        pi_U's term 2^(L s - m) = e f_U,   pi_D's 2^(L s - c2 - m) = e f_D,
    w_j = max(0, -c2_j), f_U = 2^(-w_j) = 2^(min(c2_j, 0)), f_D = 2^(-max(c2_j, 0)):
    both factors in (0, 1]. The forward takes m = m_u (the row maximum of
    L s) and scales DNAS's terms by 2^(m_u - m_d), so that each softmax's
    largest term is 1; the backward takes m = r2u and scales by the row
    factor 2^(r2u - r2). Where either probability is not negligible, e, the
    factors and the row factor stay within 2^+-(L max|s| + 2 log2 T_k): float32's
    range holds for |s| up to about 80. Padded keys (c2 = +inf): w = -inf
    (e = 0), factors 0."""
    ok = c2 < float("inf")
    w = tl.where(ok, tl.maximum(-c2, 0.0), float("-inf"))
    f_u = tl.where(ok, tl.exp2(tl.minimum(c2, 0.0)), 0.0)
    f_d = tl.where(ok, tl.exp2(-tl.maximum(c2, 0.0)), 0.0)
    return w, f_u, f_d


@triton.jit
def _lean_forward_kernel(
    Q, K, V, C2, CB, U, SEED, OUT, OD, R2, R2U, ER, AR, QPAD, BIAS,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    so_b, so_h, so_t, so_d, sb_b, sb_h, sb_q, sb_k,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr, HAS_BIAS: tl.constexpr,
    PRECISION: tl.constexpr,
    INT64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out = pi V for one query block (long.py's forward in base 2): DNAS, the
    softmax of L s - c2; HNAS, also the UNAS softmax of L s, and OD = O_D - O_U
    in float32 (with OUT's strides). Rows without weight (padded queries, no real key)
    get r2 = +inf and output 0. For the backward: ER = 2^r2 (0 at those rows)
    and, HNAS, AR the row factor 2^(r2u - r2) (1 there).

    HNAS takes one exponential a score for both softmaxes (``column_factors``,
    w and the factors from the column pass, CB): with the running maxima m_u
    of L s and m_d of L s - c2, e = 2^(L s + w - m_u), UNAS's terms
    e f_U = 2^(L s - m_u) and DNAS's e f_D 2^(m_u - m_d) = 2^(L s - c2 - m_d),
    each softmax's largest term 1 (its half-precision matmul keeps full
    precision), at the price of one more row exponential a block (2^(m_u - m_d))."""
    pid_m, bh, b, h = program(TQ, H, BLOCK_M, INT64)
    offs_m = offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    m_d = tl.full([BLOCK_M], NEG_INIT, tl.float32)
    l_d = tl.zeros([BLOCK_M], tl.float32)
    acc_d = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if HYBRID:
        m_u = tl.full([BLOCK_M], NEG_INIT, tl.float32)
        l_u = tl.zeros([BLOCK_M], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_end = TK
    if DROPOUT:  # at least one pass (adding 0 for T_k = 0), as long.py's _q_loop: no path that skips the
        # loop, where LLVM would zero the accumulators again and ptxas then serializes every wgmma
        n_end = tl.maximum(TK, 1)
    for start_n in range(0, n_end, BLOCK_N):
        offs_n = offsets(start_n, BLOCK_N, INT64)
        k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
        v = load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # (M, N)
        if HAS_BIAS:  # S + B: every term below is of the biased score
            s += bias_tile(BIAS + b * sb_b + h * sb_h, offs_m, offs_n, sb_q, sb_k, TQ, TK)
        byte = 0
        if DROPOUT:
            byte = dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N)
        if HYBRID:  # UNAS and DNAS from one exponential a score (column_factors); padded keys: e = 0
            c2 = tl.load(C2 + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))
            w = tl.load(CB + (3 * bh) * TK + offs_n, mask=offs_n < TK, other=float("-inf"))
            f_u = tl.load(CB + (3 * bh + 1) * TK + offs_n, mask=offs_n < TK, other=0.0)
            f_d = tl.load(CB + (3 * bh + 2) * TK + offs_n, mask=offs_n < TK, other=0.0)
            x_u = s * LOG2E + tl.where(c2 < float("inf"), 0.0, float("-inf"))[None, :]
            m_u_new = tl.maximum(m_u, tl.max(x_u, 1))  # each softmax its own maximum: in half precision
            m_new = tl.maximum(m_d, tl.max(s * LOG2E - c2[None, :], 1))  # both matmuls' largest term is 1
            alpha_u = tl.exp2(m_u - m_u_new)
            alpha = tl.exp2(m_d - m_new)
            e = tl.exp2(x_u + w[None, :] - m_u_new[:, None])  # 2^(L s + w - m_u)
            p_u = e * f_u[None, :]  # 2^(L s - m_u) <= 1: UNAS's terms
            p_d = e * (f_d[None, :] * tl.exp2(m_u_new - m_new)[:, None])  # 2^(L s - c2 - m_d) <= 1: DNAS's
            m_u = m_u_new
            l_u = l_u * alpha_u + tl.sum(p_u, 1)
            l_d = l_d * alpha + tl.sum(p_d, 1)
            p_u = p_u.to(v.dtype)
            p_d = p_d.to(v.dtype)
            if DROPOUT:
                p_u = dropped(p_u, byte, t_pair)
                p_d = dropped(p_d, byte, t_pair)
            acc_u = acc_u * alpha_u[:, None] + tl.dot(p_u, v, input_precision=PRECISION)
            acc_d = acc_d * alpha[:, None] + tl.dot(p_d, v, input_precision=PRECISION)
            m_d = m_new
        else:
            c2 = tl.load(C2 + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))
            m_d, l_d, acc_d = _online_step2(m_d, l_d, acc_d, s * LOG2E - c2[None, :], v, byte, t_pair, DROPOUT,
                                            PRECISION)
    ok_d = real_q & (l_d > 0)
    l_d = tl.where(ok_d, l_d, 1.0)
    o_d = tl.where(ok_d[:, None], acc_d * (scale / l_d)[:, None], 0.0)
    r2 = m_d + tl.log2(l_d)
    tl.store(R2 + bh * TQ + offs_m, tl.where(ok_d, r2, float("inf")), mask=offs_m < TQ)
    tl.store(ER + bh * TQ + offs_m, tl.where(ok_d, tl.exp2(r2), 0.0), mask=offs_m < TQ)  # loop 2's 2^r2
    if HYBRID:
        u = tl.load(U + h)
        ok_u = real_q & (l_u > 0)
        l_u = tl.where(ok_u, l_u, 1.0)
        o_u = tl.where(ok_u[:, None], acc_u * (scale / l_u)[:, None], 0.0)
        r2u = m_u + tl.log2(l_u)
        tl.store(R2U + bh * TQ + offs_m, tl.where(ok_u, r2u, float("inf")), mask=offs_m < TQ)
        ok = ok_u & ok_d  # the backward's row factor 2^(r2u - r2) (1 at rows without weight)
        tl.store(AR + bh * TQ + offs_m, tl.exp2(tl.where(ok, r2u - r2, 0.0)), mask=offs_m < TQ)
        # O_D - O_U = d out / du: the backward's dL/du and E_D come from it (``_lean_preprocess_kernel``)
        store_tile(OD + b * so_b + h * so_h, (o_d - o_u).to(OD.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)
        out = u * o_d + (1.0 - u) * o_u  # step 5 (Eq. 12)
    else:
        out = o_d
    store_tile(OUT + b * so_b + h * so_h, out.to(OUT.dtype.element_ty), offs_m, offs_d, so_t, so_d, TQ, D)


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@triton.jit
def _lean_preprocess_kernel(
    OUT, OD, DO, U, ED, EU, DU, DQ, QPAD,
    so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d, sdq_b, sdq_h, sdq_t, sdq_d,
    H, TQ, D,
    HYBRID: tl.constexpr, HAS_PAD: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """E_D[i] = u dO_i . O_D,i, E_U[i] = dO_i . out_i - E_D[i] (0 at padded
    rows), and dq's float32 rows set to 0 for the atomic adds. HNAS: from
    OD = O_D - O_U, O_D = out + (1 - u) OD, and DU[i] = dO_i . (O_D - O_U)_i,
    row i's share of dL/du (out = u O_D + (1 - u) O_U, O_D and O_U not
    depending on u; dropout's Z' is inside both)."""
    pid_m, bh, b, h = program(TQ, H, BLOCK_M, INT64)
    offs_m = offsets(pid_m * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D).to(tl.float32)
    out = load_tile(OUT + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
    delta = tl.sum(do * out, 1)  # D_i = dO_i . out_i
    if HYBRID:
        u = tl.load(U + h)
        diff = load_tile(OD + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D).to(tl.float32)
        du = tl.sum(do * diff, 1)  # dO_i . (O_D - O_U)_i
        e_d = u * (delta + (1.0 - u) * du)  # u dO_i . O_D,i
        tl.store(EU + bh * TQ + offs_m, delta - e_d, mask=offs_m < TQ)
        tl.store(DU + bh * TQ + offs_m, du, mask=offs_m < TQ)
    else:
        e_d = delta
    tl.store(ED + bh * TQ + offs_m, e_d, mask=offs_m < TQ)
    store_tile(DQ + b * sdq_b + h * sdq_h, tl.zeros([BLOCK_M, BLOCK_D], tl.float32), offs_m, offs_d,
               sdq_t, sdq_d, TQ, D)


@triton.jit
def _query_block(Q, DO, R2, ED, b, h, bh, start_m, sq_b, sq_h, sq_t, sq_d, sdo_b, sdo_h, sdo_t, sdo_d, TQ, D,
                 offs_d, INT64: tl.constexpr, BLOCK_M: tl.constexpr):
    """What both loops read of one query block: offsets, r2 (+inf at padded
    rows and past T_q), q, dO (0 at padded rows) and E_D."""
    offs_m = offsets(start_m, BLOCK_M, INT64)
    r2 = tl.load(R2 + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
    q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
    do = load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, r2 < float("inf"), D)
    e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
    return offs_m, r2, q, do, e_d


@triton.jit
def _lean_backward_kernel(
    Q, K, V, C2, U, SEED, DO, R2, R2U, ER, AR, ED, EU, MU, DQ, DK, DV, BIAS, DB,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d, sdq_b, sdq_h, sdq_t, sdq_d, sdk_b, sdk_h, sdk_t, sdk_d,
    sdv_b, sdv_h, sdv_t, sdv_d, sb_b, sb_h, sb_q, sb_k, sdb_b, sdb_h, sdb_q, sdb_k,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_BIAS: tl.constexpr, BIAS_GRAD: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """dk and dv of one key block, and its share of dq added into the float32
    DQ; tiles held as (keys, queries).

    Loop 1 needs no dP: sum_i t[i, j] = u v_j . dv_D,j - pe[j] (module
    docstring), so dc comes from two per-key sums. Loop 2 has every factor
    of ds, so dk and dq need no second accumulator (long.py keeps three).
    dk uses q - mu: the DNAS part of ds sums to 0 over i, so the mean query
    (large with a q_proj bias) does not pass through the rounded products;
    HNAS's UNAS part does not sum to 0 and adds its column sum times mu."""
    pid_n, bh, b, h = program(TK, H, BLOCK_N, INT64)
    offs_n = offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    v = load_tile(V + b * sv_b + h * sv_h, offs_n, offs_d, sv_t, sv_d, offs_n < TK, D)
    c2 = tl.load(C2 + bh * TK + offs_n, mask=offs_n < TK, other=float("inf"))  # +inf: padded, past T_k
    mu = tl.load(MU + bh * D + offs_d, mask=offs_d < D, other=0.0)
    if HYBRID:
        u = tl.load(U + h)
    else:
        u = 1.0
    seed, scale, t_pair = dropout_setup(SEED, drop_threshold, DROPOUT)
    start_n = pid_n * BLOCK_N
    # at least one pass (adding 0 for T_q = 0): no path that skips a loop, where ptxas would serialize
    # every wgmma (as the forward with dropout)
    m_end = tl.maximum(TQ, 1)

    # Loop 1: dv_D = sum_i Z pi_D[i, j] dO_i (times scale after it), pe[j] = sum_i pi_D[i, j] E_D[i].
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    pe = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, m_end, BLOCK_M):
        offs_m, r2, q, do, e_d = _query_block(Q, DO, R2, ED, b, h, bh, start_m, sq_b, sq_h, sq_t, sq_d,
                                              sdo_b, sdo_h, sdo_t, sdo_d, TQ, D, offs_d, INT64, BLOCK_M)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M)
        if HAS_BIAS:  # S + B, as in the forward
            s_t += bias_tile(BIAS + b * sb_b + h * sb_h, offs_n, offs_m, sb_k, sb_q, TK, TQ)
        p = tl.exp2(s_t * LOG2E - c2[:, None] - r2[None, :])  # pi_D^T: 0 at padded keys and queries
        pe += tl.sum(p * e_d[None, :], 1)
        p = p.to(do.dtype)
        if DROPOUT:
            p = dropped(p, dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N, True), t_pair)
        dv += tl.dot(p, do, input_precision=PRECISION)
    dc = pe - u * scale * tl.sum(v.to(tl.float32) * dv, 1)  # dc[j] = -sum_i t[i, j] = pe[j] - u v_j . dv_D,j
    if HYBRID:
        dv *= u  # dv = u dv_D + (1 - u) dv_U: loop 2 adds the UNAS part
        tu = tl.zeros([BLOCK_N], tl.float32)  # sum_i of the UNAS part of ds
        one_minus_u = 1.0 - u
        w, f_u, f_d = column_factors(c2)  # w = -inf at padded keys: e = 0 there

    # Loop 2: ds, dk += ds^T (Q - mu), dq += ds K (atomic). Odd key blocks walk the query blocks from the
    # last one back, so that neighbouring key blocks of a head do not add to the same dq rows at the same
    # time (a rotation, program n starting at block n, holds one more register: 8 bytes of spills at
    # fp16:64 under Triton 3.9).
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    u_g = u * scale
    last = (tl.cdiv(m_end, BLOCK_M) - 1) * BLOCK_M
    backwards = (pid_n % 2) == 1
    for start in range(0, m_end, BLOCK_M):
        start_m = tl.where(backwards, last - start, start)
        offs_m, r2, q, do, e_d = _query_block(Q, DO, R2, ED, b, h, bh, start_m, sq_b, sq_h, sq_t, sq_d,
                                              sdo_b, sdo_h, sdo_t, sdo_d, TQ, D, offs_d, INT64, BLOCK_M)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M)
        if HAS_BIAS:  # S + B, as in the forward
            s_t += bias_tile(BIAS + b * sb_b + h * sb_h, offs_n, offs_m, sb_k, sb_q, TK, TQ)
        # xi = pi_D e^r = pi_D 2^r2: 2^r2 from the forward (0 at padded rows), no exponential here
        exp_r = tl.load(ER + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        if HYBRID:  # pi_U and pi_D from one exponential (column_factors with m = r2u; rows past T_q: e = 0)
            r2u = tl.load(R2U + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
            e_u = tl.load(EU + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
            a_row = tl.load(AR + bh * TQ + offs_m, mask=offs_m < TQ, other=1.0)  # 2^(r2u - r2)
            e = tl.exp2(s_t * LOG2E + w[:, None] - r2u[None, :])
            p_u = e * f_u[:, None]  # 2^(L s - r2u)
            p = e * (f_d[:, None] * a_row[None, :])  # 2^(L s - c2 - r2)
        else:
            p = tl.exp2(s_t * LOG2E - c2[:, None] - r2[None, :])
        g = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # dO_i . v_j
        byte = 0
        if DROPOUT:
            byte = dropout_bytes(seed, bh, offs_m, start_n, TK, BLOCK_N, True)
            g = dropped(g, byte, t_pair)  # G / scale
        ds = p * (u_g * g - e_d[None, :] + dc[:, None] * exp_r[None, :])
        if HYBRID:
            ds_u = p_u * (one_minus_u * scale * g - e_u[None, :])
            tu += tl.sum(ds_u, 1)
            ds += ds_u
            pz = (one_minus_u * p_u).to(do.dtype)
            if DROPOUT:
                pz = dropped(pz, byte, t_pair)
            dv += tl.dot(pz, do, input_precision=PRECISION)
        if BIAS_GRAD:  # dL/dB = dL/dS (B is added to S); a bias broadcast over the batch or the heads (stride
            # 0) gathers the programs of every batch row and head into one float32 sum
            db_ptrs = DB + b * sdb_b + h * sdb_h + offs_n[:, None] * sdb_k + offs_m[None, :] * sdb_q
            tl.atomic_add(db_ptrs, ds, mask=(offs_n[:, None] < TK) & (offs_m[None, :] < TQ), sem="relaxed")
        ds = ds.to(q.dtype)
        qc = (q.to(tl.float32) - mu[None, :]).to(q.dtype)  # rows with ds = 0 add nothing
        dk += tl.dot(ds, qc, input_precision=PRECISION)
        dq = tl.dot(tl.trans(ds), k, input_precision=PRECISION)  # (M, D)
        dq_ptrs = DQ + b * sdq_b + h * sdq_h + offs_m[:, None] * sdq_t + offs_d[None, :] * sdq_d
        tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < TQ) & (offs_d[None, :] < D), sem="relaxed")
    if HYBRID:
        dk += tu[:, None] * mu[None, :]
    if DROPOUT:
        dv *= scale
    store_tile(DK + b * sdk_b + h * sdk_h, dk.to(DK.dtype.element_ty), offs_n, offs_d, sdk_t, sdk_d, TK, D)
    store_tile(DV + b * sdv_b + h * sdv_h, dv.to(DV.dtype.element_ty), offs_n, offs_d, sdv_t, sdv_d, TK, D)


# --------------------------------------------------------------------------
# Launchers and autograd
# --------------------------------------------------------------------------


def _bias_args(bias, q, k):
    """The score bias as the kernels read it: (pointer, its four strides over
    (B, H, T_q, T_k), 0 along a broadcast dimension); without one, q and zeros
    (never read: HAS_BIAS False)."""
    if bias is None:
        return q, (0, 0, 0, 0)
    full = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return bias, tuple(full.stride())


def _forward(q, k, v, u, kpad, qpad, p_drop, seed, bias=None):
    """Output, HNAS's O_D - O_U, c2, r2 (r2_u), mu, 2^r2 and HNAS's row factors
    (``_lean_forward_kernel``). ``seed`` is None without dropout (the kernels
    then read no seed: c2 stands in for the pointer, as for HNAS's buffers
    under DNAS). ``bias``: the score bias B added to every score (S + B)."""
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, has_pad) = call_facts(q, k, u, kpad, p_drop)
    f32 = dict(dtype=torch.float32, device=q.device)
    c2 = torch.empty((bsz, heads, tk), **f32)
    mu = torch.empty((bsz, heads, d), **f32)
    r2 = torch.empty((bsz, heads, tq), **f32)
    r2u = torch.empty((bsz, heads, tq), **f32) if hybrid else r2
    er = torch.empty((bsz, heads, tq), **f32)
    ar = torch.empty((bsz, heads, tq), **f32) if hybrid else r2  # row factors 2^(r2u - r2)
    cb = torch.empty((bsz, heads, 3, tk), **f32) if hybrid else c2  # key terms w, f_U, f_D (column_factors)
    out = output_buffer(q, v.dtype)
    # HNAS: O_D - O_U in float32 (rounded to half precision, dL/du = sum_i dO_i . (O_D - O_U)_i would lose
    # the float16 rounding of every term: 1e-2 of |dL/du| in the tests)
    o_d = output_buffer(q, torch.float32) if hybrid else out
    qpad_arg, kpad_arg = pad_arg(qpad, q), pad_arg(kpad, q)
    bias_arg, bias_strides = _bias_args(bias, q, k)
    meta = dict(PRECISION=precision(q.dtype), INT64=needs_int64(q, k, v, out, bias), BLOCK_D=block_d(d),
                HAS_BIAS=bias is not None)
    with on_device(q):
        bm, bn, warps, stages = kernel_tile("lean_column", d, q.dtype)
        _lean_column_kernel[grid(tk, bn, bsz, heads)](
            q, k, c2, cb, mu, qpad_arg, kpad_arg, bias_arg, *strides(q), *strides(k), *bias_strides,
            heads, tq, tk, d,
            HYBRID=hybrid, HAS_PAD=has_pad, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
        )
        # a bias tile holds as many registers as HNAS's second softmax: DNAS with a bias takes HNAS's tiles
        # (fp16:64 on sm90, Triton 3.9: DNAS's own spill 224 bytes, docs/results/2026-11-29-lean-bias-spills.md)
        bm, bn, warps, stages = kernel_tile("lean_forward_hnas" if hybrid or bias is not None else "lean_forward", d,
                                            q.dtype)
        _lean_forward_kernel[grid(tq, bm, bsz, heads)](
            q, k, v, c2, cb, u if hybrid else c2, c2 if seed is None else seed, out, o_d, r2, r2u, er, ar,
            qpad_arg, bias_arg,
            *strides(q), *strides(k), *strides(v), *strides(out), *bias_strides, heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, HAS_PAD=has_pad, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps,
            num_stages=stages, **meta,
        )
    return out, o_d, c2, r2, r2u, mu, er, ar


def _backward(do, q, k, v, u, qpad, p_drop, seed, out, o_d, c2, r2, r2u, mu, er, ar, bias=None, bias_grad=False):
    """dq, dk, dv (in buffers of their inputs' layouts), du and, when
    ``bias_grad``, dB = dL/dS summed over the dimensions B is broadcast along
    (float32 atomic adds into a buffer of B's shape: O(H T^2) memory, the size
    of B itself, where a per-batch dS would take B times that)."""
    bsz, heads, tq, d = q.shape
    tk = k.shape[2]
    threshold = dropout_threshold(p_drop)
    hybrid, dropout = u is not None, threshold > 0
    f32 = dict(dtype=torch.float32, device=q.device)
    e_d = torch.empty((bsz, heads, tq), **f32)
    e_u = torch.empty((bsz, heads, tq), **f32) if hybrid else e_d
    du_rows = torch.empty((bsz, heads, tq), **f32) if hybrid else e_d  # dL/du's share of each query
    # dq's float32 sums in q's layout when q is dense (as long.py's gradient buffers)
    dq32 = torch.empty_like(q, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    u_arg = u if hybrid else c2
    bias_arg, bias_strides = _bias_args(bias, q, k)
    db32 = torch.zeros(bias.shape, **f32) if bias_grad else None
    db_arg, db_strides = _bias_args(db32, q, k)
    int64 = needs_int64(q, k, v, do, out, dq32, dk, dv, bias, db32)
    with on_device(q):
        bm, _, warps, _ = kernel_tile("lean_forward", d, q.dtype)
        _lean_preprocess_kernel[grid(tq, bm, bsz, heads)](
            out, o_d, do, u_arg, e_d, e_u, du_rows, dq32, pad_arg(qpad, q),
            *strides(out), *strides(do), *strides(dq32), heads, tq, d,
            HYBRID=hybrid, HAS_PAD=qpad is not None, INT64=int64, BLOCK_M=bm, BLOCK_D=block_d(d),
            num_warps=warps, num_stages=STAGES,
        )
        bm, bn, warps, stages = kernel_tile("lean_backward_hnas" if hybrid or bias is not None else "lean_backward",
                                            d, q.dtype)
        _lean_backward_kernel[grid(tk, bn, bsz, heads)](
            q, k, v, c2, u_arg, c2 if seed is None else seed, do, r2, r2u, er, ar, e_d, e_u, mu, dq32, dk, dv,
            bias_arg, db_arg,
            *strides(q), *strides(k), *strides(v), *strides(do), *strides(dq32), *strides(dk), *strides(dv),
            *bias_strides, *db_strides, heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, HAS_BIAS=bias is not None, BIAS_GRAD=bias_grad,
            PRECISION=precision(q.dtype), INT64=int64,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d(d), num_warps=warps, num_stages=stages,
        )
    dq = dq32 if q.dtype == torch.float32 else dq32.to(q.dtype)
    du = du_rows.sum(dim=(0, 2)) if hybrid else None
    db = None if db32 is None else db32.to(bias.dtype)
    return dq, dk, dv, du, db


class TritonLeanAttention(torch.autograd.Function):
    """pi V for scaled q (B, H, T_q, D), k and v (B, H, T_k, D); DNAS, or HNAS
    when u (H,) is given; padded query rows give 0."""

    @staticmethod
    def forward(ctx, q, k, v, u, kpad, qpad, p_drop, seed, bias=None):
        u32 = None if u is None else u.detach().float().contiguous()
        out, o_d, c2, r2, r2u, mu, er, ar = _forward(q, k, v, u32, kpad, qpad, p_drop, seed, bias)
        ctx.p_drop = p_drop
        ctx.u_dtype = None if u is None else u.dtype
        ctx.save_for_backward(q, k, v, u32, qpad, seed, out, o_d, c2, r2, r2u, mu, er, ar, bias)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, u32, qpad, seed, out, o_d, c2, r2, r2u, mu, er, ar, bias = ctx.saved_tensors
        bias_grad = bias is not None and ctx.needs_input_grad[8]
        dq, dk, dv, du, db = _backward(do, q, k, v, u32, qpad, ctx.p_drop, seed, out, o_d, c2, r2, r2u, mu, er, ar,
                                       bias, bias_grad)
        du = None if du is None else du.to(ctx.u_dtype)
        return dq, dk, dv, du, None, None, None, None, db


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
    score_bias: Optional[Tensor] = None,
) -> Tensor:
    """DNAS (or, with ``hybrid_weight``, HNAS) attention output (B, H, T_q, D):
    the arguments and result of ``long.triton_attention`` (the same dropout
    mask for the same seed), one normalization round only
    (``sinkhorn_iters`` > 1: the long kernels). ``score_bias`` (1 or B, 1 or H,
    T_q, T_k), e.g. T5's relative position bias, is added to the scores: the
    scheme runs over S + B (``docs/math.md#a-biased-score``), with its
    gradient summed over the dimensions it is broadcast along."""
    if sinkhorn_iters != 1:
        raise ValueError(f"the lean Triton kernels run one normalization round; sinkhorn_iters={sinkhorn_iters} "
                         "runs the long kernels (attention/triton/long.py)")
    kpad, qpad, seed = prepare_call(q, k, key_padding_mask, query_padding_mask, dropout_p, seed)
    if score_bias is not None:
        check_score_bias(score_bias, q, k)
    return TritonLeanAttention.apply(q, k, v, hybrid_weight, kpad, qpad, float(dropout_p), seed, score_bias)


def check_score_bias(bias: Tensor, q: Tensor, k: Tensor) -> None:
    """A score bias the kernels can read: (1 or B, 1 or H, T_q, T_k) on q's device (ValueError)."""
    bsz, heads, tq = q.shape[:3]
    shape = tuple(bias.shape)
    if (bias.dim() != 4 or shape[0] not in (1, bsz) or shape[1] not in (1, heads) or shape[2:] != (tq, k.shape[2])
            or bias.device != q.device or not bias.is_floating_point()):
        raise ValueError(f"score_bias must be a floating-point tensor of shape (1 or B, 1 or H, T_q, T_k) = "
                         f"(1 or {bsz}, 1 or {heads}, {tq}, {k.shape[2]}) on {q.device}; got {shape} "
                         f"{bias.dtype} on {bias.device}")
