"""The column log-sum-exp pass: DNAS's column normalizer c, and every
normalizer of the Sinkhorn rounds (``sinkhorn.py``), one kernel.

Used by the long kernels (``long.py``) and the Sinkhorn rounds; the one-tile
kernels (``short.py``) reduce the columns of a tile they already hold.
"""

from typing import Optional

import triton
import triton.language as tl
from torch import Tensor

from fairseq_dnas.attention.triton.launch import (block_d, grid, load_tile, needs_int64, offsets, on_device,
                                                  pad_arg, precision, program, real, strides)
from fairseq_dnas.attention.triton.tiles import kernel_tile

NEG_INIT = tl.constexpr(-1.0e30)  # start of running maxima: finite, so NEG_INIT - NEG_INIT = 0, never NaN


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
    pid_n, bh, b, h = program(TK, H, BLOCK_N, INT64)
    offs_n = offsets(pid_n * BLOCK_N, BLOCK_N, INT64)
    offs_d = offsets(0, BLOCK_D, INT64)
    k = load_tile(K + b * sk_b + h * sk_h, offs_n, offs_d, sk_t, sk_d, offs_n < TK, D)
    m = tl.full([BLOCK_N], NEG_INIT, tl.float32)
    l = tl.zeros([BLOCK_N], tl.float32)
    for start_m in range(0, TQ, BLOCK_M):
        offs_m = offsets(start_m, BLOCK_M, INT64)
        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, offs_d, sq_t, sq_d, offs_m < TQ, D)
        s_t = tl.dot(k, tl.trans(q), input_precision=PRECISION)  # (N, M): s[i, j] transposed
        if HAS_BIAS:  # a normalizer of this pass's: +inf at padded queries and past T_q, no mask to load
            s_t -= tl.load(BIAS + bh * TQ + offs_m, mask=offs_m < TQ, other=float("inf"))[None, :]
        else:
            real_q = real(QPAD, b, offs_m, TQ, HAS_PAD)
            s_t = tl.where(real_q[None, :], s_t, float("-inf"))  # padded queries stay out of c
        m_new = tl.maximum(m, tl.max(s_t, 1))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s_t - m_new[:, None]), 1)
        m = m_new
    ok = real(KPAD, b, offs_n, TK, HAS_PAD) & (l > 0)
    c = tl.where(ok, m + tl.log(tl.where(ok, l, 1.0)), float("inf"))
    tl.store(C + bh * TK + offs_n, c, mask=offs_n < TK)


def lse_pass(rows: Tensor, over: Tensor, rows_pad: Optional[Tensor], over_pad: Optional[Tensor],
             out: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """out[b, h, a] = logsumexp over the real n of (rows_a . over_n - bias[b, h, n])
    (+inf at padded a and where no n is real: ``_column_lse_kernel``): ``_column_lse_kernel`` with
    rows = K, over = Q gives DNAS's c; with rows = Q, over = K a row
    normalizer. The masks are the uint8 ones of ``pad_arg``, both or none;
    ``out`` a contiguous float32 (B, H, T_rows)."""
    bsz, heads, t_rows, d = rows.shape
    t_over = over.shape[2]
    bm, bn, warps, stages = kernel_tile("column", d, rows.dtype)
    with on_device(rows):
        _column_lse_kernel[grid(t_rows, bn, bsz, heads)](
            over, rows, out, out if bias is None else bias,
            *((over_pad, rows_pad) if over_pad is not None else (pad_arg(None, rows),) * 2),
            *strides(over), *strides(rows), heads, t_over, t_rows, d,
            HAS_PAD=over_pad is not None, HAS_BIAS=bias is not None, PRECISION=precision(rows.dtype),
            INT64=needs_int64(rows, over, out), BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d(d),
            num_warps=warps, num_stages=stages,
        )
    return out
