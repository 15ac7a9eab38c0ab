"""Tier 1: the lean Triton kernels with a score bias B (T5's relative
position bias): the scheme runs over S + B (docs/math.md#a-biased-score).
Forward and gradients (q, k, v, B and HNAS's u) against the float64 autograd
of the materialized math, with padding, for a bias broadcast over the batch
(T5's (1, H, T_q, T_k)) and one per batch row and head; and
``kernels.attend(score_bias=...)`` running the kernels.

Without a GPU under Triton's interpreter (conftest sets TRITON_INTERPRET=1;
16 x 16 tiles, so T = 21 spans two tiles, the second ragged). bfloat16 is
left to the GPU (the interpreter's bfloat16 ``tl.dot`` is wrong).
"""

import pytest
import torch
from conftest import padding_mask

from fairseq_dnas.attention import functional as AF

lean = pytest.importorskip("fairseq_dnas.attention.triton.lean", reason="triton is not installed")
from fairseq_dnas.attention.triton import dropout as triton_dropout  # noqa: E402 (after the skip)
from test_triton import TOL, _grad_tol  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, F16 = torch.float32, torch.float16


def _inputs(dtype, bias_batch, tq=21, tk=21, d=16, batch=2, heads=2, seed=0):
    """q (mean query away from 0), k, v, the upstream gradient, u, and a bias
    (bias_batch, H, T_q, T_k) of the size of T5's (a few units)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64) * 1.3 + 0.5
    k = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64) * 1.3
    v = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64)
    do = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64)
    bias = torch.randn(bias_batch, heads, tq, tk, generator=g, dtype=torch.float64) * 2.0
    q, k, v, bias = (x.to(DEVICE, dtype).requires_grad_() for x in (q, k, v, bias))
    u = torch.linspace(0.3, 0.7, heads, device=DEVICE).requires_grad_()
    return q, k, v, do.to(DEVICE, dtype), u, bias


def _float64(q, k, v, u, bias, scheme, kmask, qmask, keep, p):
    qd, kd, vd, bd = (x.detach().cpu().double().requires_grad_() for x in (q, k, v, bias))
    ud = u.detach().cpu().double().requires_grad_() if scheme == "hnas" else None
    km, qm = AF.broadcast_masks(kmask.cpu(), qmask.cpu())
    s = qd @ kd.transpose(-1, -2) + bd  # S + B
    probs = AF.dnas_probs(s, km, qm, 1) if scheme == "dnas" else AF.hnas_probs(s, ud, km, qm, 1)
    if keep is not None:  # the kernels' own mask, at p rounded to a multiple of 1/256
        probs = probs * keep.double() / (1.0 - triton_dropout.effective_dropout_p(p))
    inputs = (qd, kd, vd, bd) + (() if ud is None else (ud,))
    return probs @ vd, inputs


def check_biased(scheme, dtype, bias_batch, p=0.0, left=True, tq=21, tk=21):
    q, k, v, do, u, bias = _inputs(dtype, bias_batch, tq=tq, tk=tk)
    kmask = padding_mask([tk, tk * 2 // 5], tk, left).to(DEVICE)
    qmask = padding_mask([tq, max(1, tq * 2 // 5)], tq, left).to(DEVICE)
    seed = torch.tensor([20201], dtype=torch.int64, device=DEVICE)
    hybrid = u if scheme == "hnas" else None
    out = lean.triton_attention(q, k, v, hybrid_weight=hybrid, key_padding_mask=kmask, query_padding_mask=qmask,
                                dropout_p=p, seed=seed, score_bias=bias)
    inputs = (q, k, v, bias) + (() if hybrid is None else (u,))
    grads = torch.autograd.grad(out, inputs, do)
    keep = triton_dropout.dropout_mask(seed, tuple(q.shape[:3]) + (tk,), p).cpu() if p > 0 else None
    ref, ref_inputs = _float64(q, k, v, u, bias, scheme, kmask, qmask, keep, p)
    ref_grads = torch.autograd.grad(ref, ref_inputs, do.cpu().double())
    tol = TOL[dtype]
    torch.testing.assert_close(out.detach().double().cpu(), ref.detach(), atol=tol, rtol=0)
    if p == 0:  # the bias is used: the same scheme without it is far from the output
        unbiased = lean.triton_attention(q, k, v, hybrid_weight=hybrid, key_padding_mask=kmask,
                                         query_padding_mask=qmask).detach()
        assert (out.detach() - unbiased).abs().double().amax() > 20 * tol
    for name, a, b in zip(("dq", "dk", "dv", "dB", "du"), grads, ref_grads):
        assert a.dtype == inputs[("dq", "dk", "dv", "dB", "du").index(name)].dtype, name
        torch.testing.assert_close(a.double().cpu(), b, atol=_grad_tol(b, tol), rtol=0, msg=name)
    db = grads[3].double().cpu()
    assert db.abs().amax() > 0.01  # B's gradient is not zero (then the check above could not fail)
    return grads


def _param(*values, full=False):
    return pytest.param(*values, marks=pytest.mark.full) if full else pytest.param(*values)


@pytest.mark.parametrize("scheme,dtype,bias_batch,p", [
    _param("dnas", F32, 1, 0.0), _param("hnas", F16, 1, 0.0),
    _param("dnas", F16, 2, 0.0, full=True), _param("hnas", F32, 2, 0.0, full=True),
    _param("dnas", F32, 2, 0.25, full=True), _param("hnas", F16, 1, 0.25, full=True),
    _param("hnas", F32, 1, 0.0, full=True), _param("dnas", F16, 1, 0.0, full=True),
], ids=lambda x: str(x).replace("torch.", ""))
def test_biased_forward_and_gradients_match_float64(scheme, dtype, bias_batch, p):
    """21 positions (two tiles, the second ragged), left padding; a bias
    broadcast over the batch (T5's, its dB summed over the batch rows by the
    kernels' atomic adds) or one per batch row; dropout with the kernels' mask."""
    check_biased(scheme, dtype, bias_batch, p)


@pytest.mark.full
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_biased_cross_attention_right_padding(scheme):
    """T_q != T_k, right padding, a bias per batch row."""
    check_biased(scheme, F32, 2, left=False, tq=13, tk=19)
