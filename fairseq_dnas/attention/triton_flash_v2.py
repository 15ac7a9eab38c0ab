"""DNAS/HNAS attention as Triton kernels, second version: four launches a step.

Selected by ``FAIRSEQ_DNAS_TRITON_KERNELS=v2`` (``kernels.triton_kernels``,
the one place that chooses; ``auto`` keeps ``triton_flash.py``, v1, until a
GPU has timed this file's kernels faster). Same function, same interface
(``triton_attention``), same dropout mask (``triton_common._dropout_bytes``,
a function of (seed, batch * head, i, j) only) as v1; Sinkhorn iterations > 1
stay on v1. Equations: ``docs/math.md#the-triton-kernels-pass-by-pass``;
notation as in ``triton_flash.py`` (s = q_i . k_j, c the DNAS column
normalizer, r the row log-sum-exp, pi_D = exp(s - c - r_d), xi = exp(s - c),
G = Z' (dO_i . v_j), E_D, E_U the D_i of flash attention per part).

What changes against v1 (issue 28):

- Launches. v1 runs 5 kernels and 7 (DNAS) or 8 (HNAS) computing torch
  operations a step (a dummy zeros or the seed draw, the query mean's mask
  negation, cast, sum, clamp, division and matmul, HNAS's du sum). Here: 4
  kernels, and only the seed draw with dropout: the query mean rides in the column pass, D_i in
  the kv pass, du's sum in the q pass; no buffer is zeroed, nothing is cast
  (``tests/test_triton_v2.py`` counts them with ``launches.count_launches``).
- The backward's dk has one accumulator. v1's kv loop accumulated
  sum_i t q_i and sum_i xi q_i side by side because dc[j] is known only at
  its end. Here the column pass, which already sweeps every query of a key
  block, also accumulates X_j = sum_i xi[i, j] (q_i - mu) (an online
  column softmax with the queries as values), so that
      dk_j = sum_i t[i, j] (q_i - mu) + dc[j] X_j  (+ tu[j] mu, HNAS)
  and the kv loop is the tutorial's dk/dv loop: four matmuls, two
  accumulators (v1: five and three).
- dq without atomics: the q pass stays (three matmuls). The alternative,
  FlashAttention-2's atomic dq with a key-major pre-pass for dc, spends one
  matmul fewer per block pair but needs a zeroed float32 dq buffer and a
  cast back to the input dtype (two more launches: 6 with dropout, over the
  budget of 5) and is not deterministic; this shape is deterministic by
  construction (``torch.use_deterministic_algorithms(True)`` changes
  nothing here, and the test checks bitwise repeatability under it).
- q centred once per head: the column pass's first program of each head
  writes qc = q - mu (mu the mean real query, rounded once to the input
  dtype) and the kv pass reads it for dk, instead of v1's rebuilding and
  converting it every iteration. Scores are still q . k with the raw q
  (half-precision products are exact in float32), so DNAS and HNAS see no
  rounding of qc and the UNAS half needs no key bias mu . k_j. (mu itself is
  float32; qc is rounded once, to the input dtype.)
- HNAS's pi_U from pi_D (``PU_FROM_PD``, where the compiler's figures say
  so): pi_U = pi_D 2^(r_d - r_u - gamma) 2^(c2 + gamma), a row and a key
  factor that the kv pass writes (RF, FK, GAMMA) and both backward loops
  load, instead of an exponential per score; a guard checked once per
  program (``triton_flash.PU_GUARD``) sends the programs where pi_D may
  underflow while pi_U counts to a copy of the loop with the direct
  exponential (docs/math.md#hnas-pi_u-from-pi_d).
- The exp2 domain: scores are scaled once by log2(e) (``LOG2E``) after
  their matmul and every normalizer (c2, r2) is kept in log2 units, so each
  probability is one ex2 (v1: a multiply and an ex2 inside tl.exp).

Passes (one program per block; grid and offsets as v1, ``triton_common``):
    1. ``_column_kernel`` (key block): mu (a first sweep over the queries),
       c2[j] = log2 sum_i 2^(s2[i, j]) over real queries, X_j; writes qc
       (first key block only).
    2. ``triton_flash._forward_kernel`` (query block): v1's, with EXP2
       (log2 units).
    3. ``_backward_kv_kernel`` (key block): E_D, E_U from dO and the outputs
       (every key block writes the same values, which pass 4 reads), dv, dc,
       dk, du's partial sum per key block; its tile, mixture and stores are
       v1's helpers (``_kv_tile``, ``_kv_mixture``, ``_kv_store``) with EXP2.
    4. ``triton_flash._backward_q_kernel`` (query block): v1's, with EXP2 and
       SUM_DU (the first query block of batch 0 adds up du for its head).
"""

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton_common import (  # noqa: F401 (effective_dropout_p: the tests read it here)
    INTERPRETED, LOG2E, NEG_INIT, STAGES, TILES_ENV, _block_d, _pad_arg, _dropout_setup, _load_tile, _offsets,
    _precision, _program, _real, _strides, _tiles,
    effective_dropout_p, grid, needs_int64, on_device, read_tiles, tile_case)
from fairseq_dnas.attention import triton_flash
from fairseq_dnas.attention.triton_flash import (  # noqa: F401 (dropout_mask: the same mask as v1)
    _backward_q_kernel, _forward_kernel, _key_block, _kv_mixture, _kv_store, _kv_tile, _output_buffer, _row_gap,
    backward_buffers, call_facts, dropout_mask)


# v2's tiles where they differ from v1's (``triton_common.GPU_TILES``, which a
# FAIRSEQ_DNAS_TRITON_TILES file tunes; these entries take precedence). The
# key-major pass has two accumulators here, not three: in half precision a
# 32 x 128 wgmma tile with one pipeline stage compiles for sm_90 without
# spills (head size 64: 155 registers, 17.3 instructions a score for DNAS
# against v1's 205 and 29.6; head size 128: 238 registers, 22.1 against
# v1's 32 x 32 mma.sync at 99.5; docs/performance.md#the-v2-kernels).
# At head size 128, where no GPU has timed any tile (v1's there are the
# compiler's too), the forward and query-major passes take the tiles with the
# fewest instructions a score that compile without spills under Triton 3.9
# (the GPU's 3.6 spills at most 32 bytes, HNAS with dropout): forward
# 64 x 64 / 4 warps / 1 stage (DNAS 17.1 instructions a score against 38.6 on
# v1's 64 x 32 / 8 warps), query-major 128 x 32 / 8 warps / 1 stage (18.7
# against 29.9 on 128 x 16). Head size 64 keeps the tiles an H100 timed for v1
# there: the compiler's larger ones were slower (triton_common.GPU_TILES).
# Untimed: benchmarks/gpu_measure.sh STEPS=kernels times them.
V2_GPU_TILES = {
    ("half", 64): dict(backward_kv=(32, 128, 8, 1)),
    ("half", 128): dict(forward=(64, 64, 4, 1), backward_kv=(32, 128, 8, 1), backward_q=(128, 32, 8, 1)),
}
if os.environ.get(TILES_ENV):  # a file's "tiles_v2" (benchmarks/triton_tiles.py --version v2) replaces these
    for _case, _entry in read_tiles(os.environ[TILES_ENV], "tiles_v2").items():
        V2_GPU_TILES.setdefault(_case, {}).update(_entry)


def _v2_tiles(kernel: str, d: int, dtype: torch.dtype):
    """(BLOCK_M, BLOCK_N, warps, stages) of a v2 kernel: ``V2_GPU_TILES``, else v1's."""
    tile = None if INTERPRETED else V2_GPU_TILES.get(tile_case(d, dtype), {}).get(kernel)
    if tile is None:
        return _tiles(kernel, d, dtype)
    return (*tile, STAGES) if len(tile) == 3 else tuple(tile)


# --------------------------------------------------------------------------
# Forward
# --------------------------------------------------------------------------


@triton.jit
def _column_kernel(
    Q, K, C2, XC, QC, MU, QPAD, KPAD, sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, H, TQ, TK, D,
    HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """For one key block: c2[j] = log2 sum_{i real} 2^(s2[i, j]) (s2 = s log2 e;
    +inf at padded keys and keys no real query sees, so that 2^(s2 - c2) = 0
    there with no mask later) and X_j = sum_i xi[i, j] qc_i (0 there). The
    mean real query mu comes from a first sweep (every program computes it
    the same way, so all agree bit for bit); the first key block writes MU
    and QC = q - mu in the dtype of q, which the kv pass reads."""
    pid_n, bh, b, h = _program(TK, H, BLOCK_N, INT64)
    offs_n = _offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = _offsets(0, BLOCK_D, INT64)
    q_base = Q + b * sq_b + h * sq_h
    total = tl.zeros([BLOCK_D], tl.float32)
    count = tl.zeros([BLOCK_M], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):  # sweep 1: the mean real query
        offs_m = _offsets(start_m, BLOCK_M, INT64)
        real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
        total += tl.sum(_load_tile(q_base, offs_m, offs_d, sq_t, sq_d, real_q, D).to(tl.float32), 0)
        count += real_q.to(tl.float32)
    mu = total / tl.maximum(tl.sum(count, 0), 1.0)
    first = pid_n == 0
    if first:
        tl.store(MU + bh * D + offs_d, mu, mask=offs_d < D)
    k = _load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    m = tl.full([BLOCK_N], NEG_INIT, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    x = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):  # sweep 2: the online column softmax, queries as values
        offs_m = _offsets(start_m, BLOCK_M, INT64)
        real_q = _real(QPAD, b, offs_m, TQ, HAS_PAD)
        q = _load_tile(q_base, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        qc = (q.to(tl.float32) - mu[None, :]).to(q.dtype)
        if first:  # stored contiguous (B, H, T_q, D)
            tl.store(QC + (bh * TQ + offs_m[:, None]) * D + offs_d[None, :], qc,
                     mask=(offs_m[:, None] < TQ) & (offs_d[None, :] < D))
        s2 = tl.dot(k, tl.trans(q), input_precision=PRECISION) * LOG2E  # (N, M)
        s2 = tl.where(real_q[None, :], s2, float("-inf"))  # padded queries stay out of c
        m_new = tl.maximum(m, tl.max(s2, 1))
        p = tl.exp2(s2 - m_new[:, None])
        alpha = tl.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        x = x * alpha[:, None] + tl.dot(p.to(q.dtype), qc, input_precision=PRECISION)
        m = m_new
    ok = _real(KPAD, b, offs_n, TK, HAS_PAD) & (l > 0)
    l = tl.where(ok, l, 1.0)
    tl.store(C2 + bh * TK + offs_n, tl.where(ok, m + tl.log2(l), float("inf")), mask=offs_n < TK)
    x = tl.where(ok[:, None], x / l[:, None], 0.0)
    tl.store(XC + (bh * TK + offs_n[:, None]) * D + offs_d[None, :], x,
             mask=(offs_n[:, None] < TK) & (offs_d[None, :] < D))


# --------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------


@triton.jit
def _row_terms(OUT, OD, DO, u, b, h, offs_m, offs_d, real_q, so_b, so_h, so_t, so_d, sdo_b, sdo_h, sdo_t, sdo_d,
               D, HYBRID: tl.constexpr):
    """(dO tile, E_D, E_U) of rows offs_m: E_D = u dO_i . O_D,i and
    E_U = dO_i . out_i - E_D (DNAS: E_D = dO_i . out_i); 0 at padded rows."""
    do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
    out = _load_tile(OUT + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D)
    delta = tl.sum(do.to(tl.float32) * out.to(tl.float32), 1)
    if HYBRID:
        o_d = _load_tile(OD + b * so_b + h * so_h, offs_m, offs_d, so_t, so_d, real_q, D)
        e_d = u * tl.sum(do.to(tl.float32) * o_d.to(tl.float32), 1)
        e_u = delta - e_d
    else:
        e_d = delta
        e_u = delta
    return do, e_d, e_u


@triton.jit
def _kv_loop(Q, QC, DO, RD, RU, ED, EU, RF, k, v, c2, real_k, u, u_g, scale, seed, t_pair, b, h, bh, pid_n, offs_d,
             sq_b, sq_h, sq_t, sq_d, sdo_b, sdo_h, sdo_t, sdo_d, TQ, TK, D, f_key,
             HYBRID: tl.constexpr, DROPOUT: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PU_FROM_PD: tl.constexpr):
    """The key-major loop over the query blocks: (dv, dk, dc, du, tu) of one key
    block (``_backward_kv_kernel``); PU_FROM_PD: pi_U = (pi_D RF[i]) f_key[j]."""
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)  # sum_i (t + t_U)[i, j] qc_i
    dc = tl.zeros([BLOCK_N], tl.float32)
    du = tl.zeros([BLOCK_N], tl.float32)
    tu = tl.zeros([BLOCK_N], tl.float32)
    m_end = TQ
    if DROPOUT:  # at least one pass (adds 0 for T_q = 0: r_d = inf): see _backward_q_kernel
        m_end = tl.maximum(TQ, 1)
    for start_m in range(0, m_end, BLOCK_M):
        offs_m = _offsets(start_m, BLOCK_M, INT64)
        r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
        real_q = r_d < float("inf")  # padded queries have r_d = +inf
        do = _load_tile(DO + b * sdo_b + h * sdo_h, offs_m, offs_d, sdo_t, sdo_d, real_q, D)
        e_d = tl.load(ED + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        f_row = 0.0
        if PU_FROM_PD:
            f_row = tl.load(RF + bh * TQ + offs_m, mask=offs_m < TQ, other=0.0)
        q = _load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        qc = tl.load(QC + (bh * TQ + offs_m[:, None]) * D + offs_d[None, :],
                     mask=(offs_m[:, None] < TQ) & (offs_d[None, :] < D), other=0.0)
        s2, p_d, g, byte, t = _kv_tile(k, v, q, do, c2, r_d, e_d, u_g, seed, t_pair, bh, offs_m, pid_n * BLOCK_N,
                                       TK, BLOCK_N, DROPOUT, PRECISION, True)  # log2 units
        dc -= tl.sum(t, 1)
        t, tu, du, dv = _kv_mixture(RU, EU, bh, TQ, offs_m, p_d, s2, real_k, u, scale, g, t, tu, du, dv, do, byte,
                                    t_pair, HYBRID, DROPOUT, PRECISION, True, f_key, f_row, PU_FROM_PD)
        dk += tl.dot(t.to(qc.dtype), qc, input_precision=PRECISION)
    return dv, dk, dc, du, tu


@triton.jit
def _backward_kv_kernel(
    Q, QC, K, V, C2, XC, MU, U, SEED, DO, OUT, OD, RD, RU, ED, EU, RF, FK, GAMMA, DK, DV, DC, DU, KPAD,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d,
    sdo_b, sdo_h, sdo_t, sdo_d, so_b, so_h, so_t, so_d, sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d,
    H, TQ, TK, D, drop_threshold,
    HYBRID: tl.constexpr, DROPOUT: tl.constexpr, HAS_PAD: tl.constexpr,
    PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PU_FACTORS: tl.constexpr = False, PU_FROM_PD: tl.constexpr = False,
    PU_GUARD: tl.constexpr = triton_flash.PU_GUARD,
):
    """dk, dv, dc and this block's share of dL/du for one key block; tiles
    held transposed, (keys, queries):
        t[i, j]  = pi_D (u G - E_D)           dc[j] = -sum_i t[i, j]
        dv_j     = sum_i Z' pi_H[i, j] dO_i
        dk_j     = sum_i (t + t_U)[i, j] qc_i + dc[j] X_j + (sum_i t_U[i, j]) mu
    (t_U = pi_U ((1 - u) G - E_U), HNAS), since ds = t + xi dc + t_U and
    sum_i xi[i, j] qc_i = X_j (column pass), sum_i (t + xi dc)[i, j] = 0.
    Every key block first computes E_D, E_U of all queries into ED, EU (the
    q pass reads them too). PU_FACTORS (HNAS): it also writes pi_U's factors,
    RF[i] = 2^(r_d - r_u - gamma) (every key block the same bits), FK[j] =
    2^(c2 + gamma) for its keys and GAMMA (gamma = the largest real
    r_d - r_u, rounded up to an integer); PU_FROM_PD: its loop takes
    pi_U = (pi_D RF[i]) FK[j] where the guard holds for its keys
    (docs/math.md#hnas-pi_u-from-pi_d)."""
    pid_n, bh, b, h, offs_n, offs_d, real_k, k, v, c2 = _key_block(
        K, V, C2, KPAD, sk_b, sk_h, sk_t, sk_d, sv_b, sv_h, sv_t, sv_d, H, TK, D, HAS_PAD, INT64, BLOCK_N, BLOCK_D)
    u = 1.0
    if HYBRID:
        u = tl.load(U + h)
    # G = scale Z (dO V^T): the scale goes into u, 1 - u and the final dv, du
    seed, scale, t_pair = _dropout_setup(SEED, drop_threshold, DROPOUT)
    u_g = u * scale
    # E_D, E_U of every query, before the loop over them: computed inside that loop, their row sums
    # (laid out as the rows of dO) meet the score tiles' layout only through shared memory between the
    # matmuls, and ptxas then serializes every wgmma (23 instructions a score instead of 19, fp16:64).
    # Every key block writes the same bits (the same computation), so the buffer is exact whichever
    # program's store lands last; the barrier makes this program's own stores visible to its threads.
    worst = NEG_INIT  # PU_FACTORS: gamma, the largest r_d - r_u of a real query
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = _offsets(start_m, BLOCK_M, INT64)
        r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
        real_q = r_d < float("inf")
        if HYBRID and PU_FACTORS:
            r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
            worst = tl.maximum(worst, tl.max(tl.where(real_q, _row_gap(r_d, r_u, real_q), NEG_INIT), 0))
        _, e_d, e_u = _row_terms(OUT, OD, DO, u, b, h, offs_m, offs_d, real_q, so_b, so_h, so_t, so_d,
                                 sdo_b, sdo_h, sdo_t, sdo_d, D, HYBRID)
        tl.store(ED + bh * TQ + offs_m, e_d, mask=offs_m < TQ)
        if HYBRID:
            tl.store(EU + bh * TQ + offs_m, e_u, mask=offs_m < TQ)
    f_key = 0.0
    if HYBRID and PU_FACTORS:  # pi_U = pi_D 2^(r_d - r_u - gamma) 2^(c2 + gamma), both factors stored
        # gamma: the largest real r_d - r_u rounded up to an integer, so that c2 + gamma and gap - gamma round
        # less (exact within c2's binade): the factors' errors are shared by a column or a row, and add up in du
        worst = tl.ceil(worst)
        for start_m in range(0, TQ, BLOCK_M):  # every key block writes the same row factors (as ED, EU)
            offs_m = _offsets(start_m, BLOCK_M, INT64)
            r_d = tl.load(RD + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
            r_u = tl.load(RU + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))
            real_q = r_d < float("inf")
            f_row = tl.exp2(tl.where(real_q, _row_gap(r_d, r_u, real_q) - worst, float("-inf")))  # <= 1; 0 padded
            tl.store(RF + bh * TQ + offs_m, f_row, mask=offs_m < TQ)
        real_c = c2 < float("inf")
        top = tl.max(tl.where(real_c, c2, NEG_INIT), 0) + worst
        f_key = tl.exp2(tl.where(real_c, tl.minimum(c2 + worst, PU_GUARD), float("-inf")))  # 0 at padded keys
        tl.store(FK + bh * TK + offs_n, f_key, mask=offs_n < TK)  # for the query-major pass
        if pid_n == 0:
            tl.store(GAMMA + bh, worst)
    tl.debug_barrier()
    if HYBRID and PU_FROM_PD:  # (PU_FROM_PD implies PU_FACTORS)
        # chosen once per program: a branch inside the loop makes ptxas serialize its wgmma
        if top <= PU_GUARD:  # the guard (docs/math.md#hnas-pi_u-from-pi_d)
            dv, dk, dc, du, tu = _kv_loop(
                Q, QC, DO, RD, RU, ED, EU, RF, k, v, c2, real_k, u, u_g, scale, seed, t_pair, b, h, bh, pid_n, offs_d,
                sq_b, sq_h, sq_t, sq_d, sdo_b, sdo_h, sdo_t, sdo_d, TQ, TK, D, f_key,
                HYBRID, DROPOUT, PRECISION, INT64, BLOCK_M, BLOCK_N, BLOCK_D, True)
        else:
            dv, dk, dc, du, tu = _kv_loop(
                Q, QC, DO, RD, RU, ED, EU, RF, k, v, c2, real_k, u, u_g, scale, seed, t_pair, b, h, bh, pid_n, offs_d,
                sq_b, sq_h, sq_t, sq_d, sdo_b, sdo_h, sdo_t, sdo_d, TQ, TK, D, f_key,
                HYBRID, DROPOUT, PRECISION, INT64, BLOCK_M, BLOCK_N, BLOCK_D, False)
    else:
        dv, dk, dc, du, tu = _kv_loop(
            Q, QC, DO, RD, RU, ED, EU, RF, k, v, c2, real_k, u, u_g, scale, seed, t_pair, b, h, bh, pid_n, offs_d,
            sq_b, sq_h, sq_t, sq_d, sdo_b, sdo_h, sdo_t, sdo_d, TQ, TK, D, f_key,
            HYBRID, DROPOUT, PRECISION, INT64, BLOCK_M, BLOCK_N, BLOCK_D, False)
    x = tl.load(XC + (bh * TK + offs_n[:, None]) * D + offs_d[None, :],
                mask=(offs_n[:, None] < TK) & (offs_d[None, :] < D), other=0.0)
    dk += dc[:, None] * x
    if HYBRID:  # the UNAS part does not sum to 0 over i: its sum times mu
        mu = tl.load(MU + bh * D + offs_d, mask=offs_d < D, other=0.0)
        dk += tu[:, None] * mu[None, :]
    _kv_store(DK, DV, DC, DU, dk, dv, dc, du, scale, b, h, bh, pid_n, offs_n, offs_d,
              sdk_b, sdk_h, sdk_t, sdk_d, sdv_b, sdv_h, sdv_t, sdv_d, TK, D, BLOCK_N, HYBRID, DROPOUT)


# --------------------------------------------------------------------------
# Launchers and autograd
# --------------------------------------------------------------------------


# HNAS's pi_U from pi_D (PU_FROM_PD, docs/math.md#hnas-pi_u-from-pi_d): on for the (tile case, dropout)
# pairs where the compiler's figures for sm_90 improve (docs/results/2026-11-26-sm90-compiler-hnas-pu.md), True
# for every call (the tests). Forward: off (a key factor per tile, the guard's running maximum and the redo loop
# cost more instructions than the exponential saves, with spills). Key-major: half precision head size 64 (half
# the MUFU.EX2, 2-7% fewer instructions); at head size 128 it spills past the tile rule; float32 keeps the direct
# exponential, whose rounding is not shared along a row or a column (the product's is: dL/du, a sum over
# B T_q T_k terms, doubles its float32 error). Query-major: with dropout only (without, ptxas serializes its
# wgmma in the kernel that holds both loops), head size 64 (at 128 it saves 1.5% and the kv pass that writes
# the factors then spills past the tile rule).
PU_FROM_PD = {
    "forward": set(),
    "backward_kv": {(("half", 64), False), (("half", 64), True)},
    "backward_q": {(("half", 64), True)},
}


def pu_from_pd(kernel: str, d: int, dtype: torch.dtype, dropout: bool) -> bool:
    """Whether ``kernel`` runs with PU_FROM_PD for this call (``PU_FROM_PD``)."""
    on = PU_FROM_PD[kernel]
    return on is True or (tile_case(d, dtype), dropout) in on


def pu_meta(kernel: str, d: int, dtype: torch.dtype, dropout: bool) -> dict:
    """The PU_FROM_PD flag of ``kernel`` for this call and the guard
    (``triton_flash.PU_GUARD``), read at each call so that the tests can move them."""
    return dict(PU_FROM_PD=pu_from_pd(kernel, d, dtype, dropout), PU_GUARD=triton_flash.PU_GUARD)


def _forward(q, k, v, u, kpad, qpad, p_drop, seed):
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, has_pad) = call_facts(q, k, u, kpad, p_drop)
    f32 = dict(dtype=torch.float32, device=q.device)
    c2 = torch.empty((bsz, heads, tk), **f32)
    xc = torch.empty((bsz, heads, tk, d), **f32)
    qc = torch.empty((bsz, heads, tq, d), dtype=q.dtype, device=q.device)
    mu = torch.empty((bsz, heads, d), **f32)
    r_d = torch.empty((bsz, heads, tq), **f32)
    r_u = torch.empty((bsz, heads, tq), **f32) if hybrid else r_d
    out = _output_buffer(q, v.dtype)
    o_d = _output_buffer(q, v.dtype) if hybrid else out
    qpad_arg, kpad_arg = _pad_arg(qpad, q), _pad_arg(kpad, q)
    meta = dict(HAS_PAD=has_pad, PRECISION=_precision(q.dtype), INT64=needs_int64(q, k, v, out, xc),
                BLOCK_D=_block_d(d))
    with on_device(q):
        bm, bn, warps, stages = _v2_tiles("column", d, q.dtype)
        _column_kernel[grid(tk, bn, bsz, heads)](
            q, k, c2, xc, qc, mu, qpad_arg, kpad_arg, *_strides(q), *_strides(k), heads, tq, tk, d,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, **meta,
        )
        bm, bn, warps, stages = _v2_tiles("forward", d, q.dtype)
        _forward_kernel[grid(tq, bm, bsz, heads)](  # v1's forward in log2 units
            q, k, v, c2, u if hybrid else c2, seed if dropout else c2, out, o_d, r_d, r_u, qpad_arg,
            *_strides(q), *_strides(k), *_strides(v), *_strides(out), heads, tq, tk, d, threshold,
            HYBRID=hybrid, DROPOUT=dropout, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, EXP2=True,
            **pu_meta("forward", d, q.dtype, dropout), **meta,
        )
    return out, o_d, c2, xc, qc, mu, r_d, r_u


def _backward(do, q, k, v, u, kpad, p_drop, seed, out, o_d, c2, xc, qc, mu, r_d, r_u):
    """dq, dk, dv (fresh buffers in the layouts of q, k, v) and du."""
    (bsz, heads, tq, tk, d), threshold, (hybrid, dropout, has_pad) = call_facts(q, k, u, kpad, p_drop)
    kv_m, kv_n, kv_warps, kv_stages = _v2_tiles("backward_kv", d, q.dtype)
    e_d, e_u, dc, du_part = backward_buffers(q, k, hybrid, kv_n)
    du = torch.empty((heads,), dtype=torch.float32, device=q.device) if hybrid else dc
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    # PU_FROM_PD: the row and key factors of pi_U = pi_D RF[i] FK[j] and their offset GAMMA, written by the
    # key-major pass, read by the query-major one
    pu = hybrid and any(pu_from_pd(kernel, d, q.dtype, dropout) for kernel in ("backward_kv", "backward_q"))
    rf, fk, gamma = (torch.empty(shape, dtype=torch.float32, device=q.device)
                     for shape in ((bsz, heads, tq), (bsz, heads, tk), (bsz, heads))) if pu else (c2, c2, c2)
    u_arg = u if hybrid else c2
    seed_arg = seed if dropout else c2
    flags = dict(HYBRID=hybrid, DROPOUT=dropout, PRECISION=_precision(q.dtype),
                 INT64=needs_int64(q, k, v, do, out, dq, dk, dv, xc), BLOCK_D=_block_d(d))
    with on_device(q):
        _backward_kv_kernel[grid(tk, kv_n, bsz, heads)](
            q, qc, k, v, c2, xc, mu, u_arg, seed_arg, do, out, o_d, r_d, r_u, e_d, e_u, rf, fk, gamma, dk, dv, dc,
            du_part,
            _pad_arg(kpad, q),
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(out), *_strides(dk), *_strides(dv),
            heads, tq, tk, d, threshold,
            HAS_PAD=has_pad, BLOCK_M=kv_m, BLOCK_N=kv_n, num_warps=kv_warps, num_stages=kv_stages,
            PU_FACTORS=pu, **pu_meta("backward_kv", d, q.dtype, dropout), **flags,
        )
        bm, bn, warps, stages = _v2_tiles("backward_q", d, q.dtype)
        _backward_q_kernel[grid(tq, bm, bsz, heads)](  # v1's, in log2 units, adding up du
            q, k, v, c2, c2, u_arg, seed_arg, do, r_d, r_u, e_d, e_u, dc, dq, du_part, du, rf, fk, gamma,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
            bsz, heads, tq, tk, d, threshold,
            BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, SINKHORN=False, EXP2=True,
            SUM_DU=hybrid, KV_BLOCK_N=kv_n, **pu_meta("backward_q", d, q.dtype, dropout), **flags,
        )
    return dq, dk, dv, (du if hybrid else None)


class TritonAttentionV2(torch.autograd.Function):
    """pi V for scaled q (B, H, T_q, D), k and v (B, H, T_k, D): DNAS, or
    HNAS when u (H,) is given; padded query rows give 0."""

    @staticmethod
    def forward(ctx, q, k, v, u, kpad, qpad, p_drop, seed):
        u32 = None if u is None else u.detach().float().contiguous()
        out, o_d, c2, xc, qc, mu, r_d, r_u = _forward(q, k, v, u32, kpad, qpad, p_drop, seed)
        ctx.p_drop = p_drop
        ctx.u_dtype = None if u is None else u.dtype
        ctx.save_for_backward(q, k, v, u32, kpad, seed, out, o_d, c2, xc, qc, mu, r_d, r_u)
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, u32, kpad, seed, out, o_d, c2, xc, qc, mu, r_d, r_u = ctx.saved_tensors
        dq, dk, dv, du = _backward(do, q, k, v, u32, kpad, ctx.p_drop, seed, out, o_d, c2, xc, qc, mu, r_d, r_u)
        du = None if du is None else du.to(ctx.u_dtype)
        return dq, dk, dv, du, None, None, None, None


def triton_attention(q: Tensor, k: Tensor, v: Tensor, **options) -> Tensor:
    """``triton_flash.triton_attention`` (the same keyword arguments and result,
    the same dropout mask for the same seed) on the v2 kernels;
    ``sinkhorn_iters`` > 1 runs v1's (``kernels.triton_kernels`` never sends
    them here)."""
    return triton_flash.triton_attention(q, k, v, function=TritonAttentionV2, **options)
