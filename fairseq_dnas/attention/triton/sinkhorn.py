"""Sinkhorn iterations (``sinkhorn_iters`` > 1) on the Triton path, no T_q x T_k matrix.

DNAS is one Sinkhorn iteration, column step first (Algorithm 1, step 4;
``docs/math.md#sinkhorn-rounds-in-the-kernels``); ``sinkhorn_iters = n`` repeats it, as
``functional.dnas_log_probs`` does. In the log domain each iterate is a pair
of bias vectors. With b_0 = 0 and s[i, j] = q_i . k_j,

    a_k[j] = logsumexp over real i of (s[i, j] - b_{k-1}[i])     (columns over queries)
    b_k[i] = logsumexp over real j of (s[i, j] - a_k[j])         (rows over keys)

for k = 1 .. n, and pi_D = exp(s - a_n - b_n) = softmax_j(s - a_n): the
forward kernel of ``long.py`` with the key bias a_n (its row lse is
b_n). Every normalizer is a row log-sum-exp of K Q^T or Q K^T with a bias,
``column.lse_pass``: 2n - 1 passes of one matmul per block pair, and
O(n T) memory for the stacks a (n, B, H, T_k) and b (n - 1, B, H, T_q).

Backward. ``long.py``'s kernels, given the row bias b_{n-1} of
xi_n = exp(s - b_{n-1} - a_n), treat the final row softmax and the last
column step: they return g_a_n = dL/da_n (their ``dc``) and put
P (G - E) + xi_n g_a_n into dq and dk. What remains is the chain through
the earlier normalizers; the derivative of a log-sum-exp is its softmax, so
for k = n - 1 .. 1, with rho_k = exp(s - a_k - b_k) (row-stochastic) and
xi_k = exp(s - b_{k-1} - a_k) (column-stochastic),

    g_b_k[i] = -sum_j g_a_{k+1}[j] xi_{k+1}[i, j]
    g_a_k[j] = -sum_i g_b_k[i] rho_k[i, j]                 (``_bias_gradient_kernel``)
    ds[i, j] += g_b_k[i] rho_k[i, j] + g_a_k[j] xi_k[i, j]  (``_normalizer_ds_kernel``)

and dq += ds K, dk += ds^T Q. Each g is one pass of one matmul per block
pair; the ds pass runs query-major for dq and key-major for dk (two matmuls
per block pair each), every term recomputed from the same scores. Padded
queries and keys take part in no sum, so their g are 0. Attention dropout
and HNAS's UNAS part act only on the final probabilities: the main kernels
handle them.

The same pattern with any number of rounds is FlashSinkhorn's (Ye et al.,
2026: IO-aware Sinkhorn iterations without the n x m matrix); this is written from the formulas
above.
"""

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton.column import lse_pass
from fairseq_dnas.attention.triton.launch import (block_d, grid, load_tile, needs_int64, offsets, on_device, precision,
                                                  program, real, store_tile, strides)
from fairseq_dnas.attention.triton.tiles import kernel_tile

# Tiles: entries of tiles.GPU_TILES (spill-free, untimed, like all of them).
REDUCE_TILES, DS_TILES = "sinkhorn_reduce", "sinkhorn_ds"


@triton.jit
def _pair_scores(rows, real_a, B, b, sb_t, sb_d, offs_n, offs_d, PADB, TB, D,
                 HAS_PAD: tl.constexpr, PRECISION: tl.constexpr):
    """Scores A_a . B_b of a row block against the column block offs_n (and
    that block of B), -inf at every pair with a padded side: a padded pair's
    exponent s - x - y may overflow, since its normalizers x, y exclude it."""
    real_b = real(PADB, b, offs_n, TB, HAS_PAD)
    cols = load_tile(B, offs_n, offs_d, sb_t, sb_d, offs_n < TB, D)
    s = tl.dot(rows, tl.trans(cols), input_precision=PRECISION)  # (M, N)
    return tl.where(real_a[:, None] & real_b[None, :], s, float("-inf")), cols


@triton.jit
def _bias_gradient_kernel(
    A, B, XA, YB, WB, OUT, PADA, PADB,
    sa_b, sa_h, sa_t, sa_d, sb_b, sb_h, sb_t, sb_d,
    H, TA, TB, D,
    HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """out[a] = -sum over real b of w[b] exp(A_a . B_b - x[a] - y[b]), for one
    block of rows a (0 at padded a): the gradient reaching the normalizer x
    through a log-sum-exp whose softmax is exp(s - x - y) (w: dL/dy)."""
    pid, bh, b, h = program(TA, H, BLOCK_M, INT64)
    offs_m = offsets(pid * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_a = real(PADA, b, offs_m, TA, HAS_PAD)
    rows = load_tile(A + b * sa_b + h * sa_h, offs_m, offs_d, sa_t, sa_d, offs_m < TA, D)
    x = tl.load(XA + bh * TA + offs_m, mask=offs_m < TA, other=0.0)
    acc = tl.zeros([BLOCK_M], tl.float32)
    for start_n in range(0, TB, BLOCK_N):
        offs_n = offsets(start_n, BLOCK_N, INT64)
        s, _ = _pair_scores(rows, real_a, B + b * sb_b + h * sb_h, b, sb_t, sb_d, offs_n, offs_d, PADB, TB, D,
                            HAS_PAD, PRECISION)
        y = tl.load(YB + bh * TB + offs_n, mask=offs_n < TB, other=0.0)
        w = tl.load(WB + bh * TB + offs_n, mask=offs_n < TB, other=0.0)
        acc -= tl.sum(tl.exp(s - x[:, None] - y[None, :]) * w[None, :], 1)
    tl.store(OUT + bh * TA + offs_m, acc, mask=offs_m < TA)


@triton.jit
def _normalizer_ds_kernel(
    A, B, XA, YB, WA, WB, OUT, PADA, PADB,
    sa_b, sa_h, sa_t, sa_d, sb_b, sb_h, sb_t, sb_d, so_b, so_h, so_t, so_d,
    H, TA, TB, D, NT, st_a, st_b,
    HAS_PAD: tl.constexpr, PRECISION: tl.constexpr, INT64: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """OUT_a += sum_b ds[a, b] B_b for one block of rows a, with
        ds[a, b] = sum_{t < NT} (wa_t[a] + wb_t[b]) exp(A_a . B_b - xa_t[a] - yb_t[b])
    over real (a, b); term t's vectors lie st_a (st_b) floats after term t-1's.
    OUT (dq or dk, already holding the main kernels' part) has its own strides so_*."""
    pid, bh, b, h = program(TA, H, BLOCK_M, INT64)
    offs_m = offsets(pid * BLOCK_M, BLOCK_M, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    real_a = real(PADA, b, offs_m, TA, HAS_PAD)
    rows = load_tile(A + b * sa_b + h * sa_h, offs_m, offs_d, sa_t, sa_d, offs_m < TA, D)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, TB, BLOCK_N):
        offs_n = offsets(start_n, BLOCK_N, INT64)
        s, cols = _pair_scores(rows, real_a, B + b * sb_b + h * sb_h, b, sb_t, sb_d, offs_n, offs_d, PADB, TB, D,
                               HAS_PAD, PRECISION)
        ds = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for t in range(NT):
            xa = tl.load(XA + t * st_a + bh * TA + offs_m, mask=offs_m < TA, other=0.0)
            wa = tl.load(WA + t * st_a + bh * TA + offs_m, mask=offs_m < TA, other=0.0)
            yb = tl.load(YB + t * st_b + bh * TB + offs_n, mask=offs_n < TB, other=0.0)
            wb = tl.load(WB + t * st_b + bh * TB + offs_n, mask=offs_n < TB, other=0.0)
            ds += tl.exp(s - xa[:, None] - yb[None, :]) * (wa[:, None] + wb[None, :])
        acc += tl.dot(ds.to(cols.dtype), cols, input_precision=PRECISION)
    out_base = OUT + b * so_b + h * so_h
    total = load_tile(out_base, offs_m, offs_d, so_t, so_d, offs_m < TA, D).to(tl.float32) + acc
    store_tile(out_base, total.to(OUT.dtype.element_ty), offs_m, offs_d, so_t, so_d, TA, D)


def normalizers(q: Tensor, k: Tensor, qpad_arg: Tensor, kpad_arg: Tensor, has_pad: bool,
                sinkhorn_iters: int) -> Tuple[Tensor, Tensor]:
    """The stacks a (n, B, H, T_k) = a_1 .. a_n and b (n - 1, B, H, T_q) = b_1 .. b_{n-1}."""
    bsz, heads, tq, _ = q.shape
    tk = k.shape[2]
    n = sinkhorn_iters
    a = torch.empty((n, bsz, heads, tk), dtype=torch.float32, device=q.device)
    b = torch.empty((n - 1, bsz, heads, tq), dtype=torch.float32, device=q.device)
    qpad, kpad = (qpad_arg, kpad_arg) if has_pad else (None, None)
    for i in range(n):  # round i + 1
        lse_pass(k, q, kpad, qpad, a[i], bias=None if i == 0 else b[i - 1])  # a_{i+1}: columns
        if i < n - 1:
            lse_pass(q, k, qpad, kpad, b[i], bias=a[i])  # b_{i+1}: rows
    return a, b


def _bias_gradient(rows, cols, x, y, w, pad_rows, pad_cols, has_pad) -> Tensor:
    bsz, heads, t_rows, d = rows.shape
    out = torch.empty((bsz, heads, t_rows), dtype=torch.float32, device=rows.device)
    bm, bn, warps, stages = kernel_tile(REDUCE_TILES, d, rows.dtype)
    with on_device(rows):
        _bias_gradient_kernel[grid(t_rows, bm, bsz, heads)](
            rows, cols, x, y, w, out, pad_rows, pad_cols, *strides(rows), *strides(cols),
            heads, t_rows, cols.shape[2], d,
            HAS_PAD=has_pad, PRECISION=precision(rows.dtype), INT64=needs_int64(rows, cols),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d(d), num_warps=warps, num_stages=stages,
        )
    return out


def _add_ds(rows, cols, xa, yb, wa, wb, out, pad_rows, pad_cols, has_pad) -> None:
    bsz, heads, t_rows, d = rows.shape
    stack = [torch.stack(x).contiguous() for x in (xa, yb, wa, wb)]
    bm, bn, warps, stages = kernel_tile(DS_TILES, d, rows.dtype)
    with on_device(rows):
        _normalizer_ds_kernel[grid(t_rows, bm, bsz, heads)](
            rows, cols, *stack, out, pad_rows, pad_cols, *strides(rows), *strides(cols), *strides(out),
            heads, t_rows, cols.shape[2], d, len(xa), stack[0][0].numel(), stack[1][0].numel(),
            HAS_PAD=has_pad, PRECISION=precision(rows.dtype), INT64=needs_int64(rows, cols, out, *stack),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d(d), num_warps=warps, num_stages=stages,
        )


def backward_through_normalizers(
    q: Tensor, k: Tensor, qpad_arg: Tensor, kpad_arg: Tensor, has_pad: bool,
    a: Tensor, b: Tensor, g_a_last: Tensor, dq: Tensor, dk: Tensor,
) -> None:
    """Add the gradient that flows through b_{n-1}, a_{n-1}, ..., a_1 into dq
    and dk (in place), given g_a_last = dL/da_n from the main kernels."""
    n = a.shape[0]
    g_a: list = [None] * n
    g_b: list = [None] * (n - 1)
    g_a[n - 1] = g_a_last
    for i in range(n - 2, -1, -1):  # round k = i + 1 = n - 1 .. 1
        # g_b_k = -sum_j g_a_{k+1}[j] xi_{k+1}[i, j],  xi_{k+1} = exp(s - b_k - a_{k+1})
        g_b[i] = _bias_gradient(q, k, b[i], a[i + 1], g_a[i + 1], qpad_arg, kpad_arg, has_pad)
        # g_a_k = -sum_i g_b_k[i] rho_k[i, j],  rho_k = exp(s - a_k - b_k)
        g_a[i] = _bias_gradient(k, q, a[i], b[i], g_b[i], kpad_arg, qpad_arg, has_pad)
    zq, zk = torch.zeros_like(b[0]), torch.zeros_like(a[0])
    b_prev = [zq] + [b[i - 1] for i in range(1, n - 1)]  # b_{k-1}, with b_0 = 0
    rounds = range(n - 1)
    # ds = sum_k g_b_k[i] rho_k + g_a_k[j] xi_k: terms (row bias, column bias, row weight, column weight)
    _add_ds(q, k,
            [b[i] for i in rounds] + [b_prev[i] for i in rounds],
            [a[i] for i in rounds] * 2,
            [g_b[i] for i in rounds] + [zq] * (n - 1),
            [zk] * (n - 1) + [g_a[i] for i in rounds],
            dq, qpad_arg, kpad_arg, has_pad)
    # The same ds, transposed (rows are keys): dk_j += sum_i ds[i, j] q_i
    _add_ds(k, q,
            [a[i] for i in rounds] * 2,
            [b[i] for i in rounds] + [b_prev[i] for i in rounds],
            [zk] * (n - 1) + [g_a[i] for i in rounds],
            [g_b[i] for i in rounds] + [zq] * (n - 1),
            dk, kpad_arg, qpad_arg, has_pad)
