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


# --- kernels.attend with a score bias -------------------------------------------------------------------------


def test_attend_runs_the_lean_kernels_with_a_bias(monkeypatch):
    """``kernels.attend(score_bias=B)`` on the Triton path with the lean set:
    the lean kernels run (no dense score matrix), output and gradients (q, k,
    v, B, u) equal the 'dense' path's, itself held to float64 in
    tests/test_hf_t5.py; the probabilities it returns are those of S + B."""
    from launches import count_launches

    from fairseq_dnas.attention import kernels, selection

    monkeypatch.setenv(selection.SHORT_ENV, "0")
    monkeypatch.setenv(selection.LEAN_ENV, "1")
    q, k, v, do, u, bias = _inputs(F32, 1, tq=19, tk=19)
    kmask = padding_mask([19, 6], 19, False).to(DEVICE)
    inputs = (q, k, v, bias, u)

    def run(path):
        out, probs = kernels.attend(q, k, v, scheme="hnas", padding_mask=kmask, hybrid_weight=u, path=path,
                                    score_bias=bias, need_weights=True)
        return out, probs, torch.autograd.grad(out, inputs, do)

    with count_launches() as launches:
        out, probs, grads = run("triton")
    assert "_lean_backward_kernel" in launches.triton, launches.describe()
    ref, ref_probs, ref_grads = run("dense")
    real = ~kmask[:, None, :, None]
    torch.testing.assert_close(out * real, ref * real, atol=1e-5, rtol=0)
    torch.testing.assert_close(probs, ref_probs, atol=1e-6, rtol=0)
    for name, a, b in zip(("dq", "dk", "dv", "dB", "du"), grads, ref_grads):
        torch.testing.assert_close(a, b, atol=_grad_tol(b), rtol=0, msg=name)


def test_a_forced_triton_path_without_the_lean_set_is_refused_in_one_line(monkeypatch):
    from fairseq_dnas.attention import kernels, selection

    monkeypatch.setenv(selection.SHORT_ENV, "0")
    monkeypatch.setenv(selection.LEAN_ENV, "0")  # the long kernels
    q, k, v, _, _, bias = _inputs(F32, 1, tq=5, tk=5)
    with pytest.raises(ValueError, match="only on the lean kernels.*long kernel set") as err:
        kernels.attend(q, k, v, scheme="dnas", path="triton", score_bias=bias)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"score_bias must be .*\(1 or 2, 1 or 2, 5, 5\)"):
        lean.triton_attention(q, k, v, score_bias=bias[:, :, :4])


def test_auto_with_a_bias_takes_the_lean_set_where_it_may(monkeypatch):
    """Where 'auto' resolved the short or long kernels (as on a GPU), a biased
    call runs the lean set (checked on first use as the lean set); with
    deterministic algorithms or FAIRSEQ_DNAS_TRITON_LEAN=0 it takes 'dense';
    where 'auto' resolved a fused CPU path, that path (it takes B too)."""
    import dataclasses

    from fairseq_dnas.attention import dispatch, kernels, selection, selfcheck

    q = torch.zeros(1, 2, 200, 64, dtype=F16)
    for kernel_set in ("short", "long"):
        config = selfcheck.config_of(q, "dnas", padding=True, dropout=False, sinkhorn_iters=1, kernels=kernel_set)
        decision = dispatch.Decision("triton", kernel_set, selection.attention_function(kernel_set), 0.0, config,
                                     "flash")
        monkeypatch.delenv(selection.LEAN_ENV, raising=False)
        chosen = kernels._biased_decision(decision, "auto", 1)
        assert chosen.kernels == "lean" and chosen.function is lean.triton_attention
        assert chosen.checked == dataclasses.replace(config, kernels="lean")
        assert kernels._biased_decision(decision, "auto", 2).path == "materialized"  # Sinkhorn rounds
        monkeypatch.setenv(selection.LEAN_ENV, "0")
        assert kernels._biased_decision(decision, "auto", 1).path == "dense"
        monkeypatch.delenv(selection.LEAN_ENV)
        before = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            assert kernels._biased_decision(decision, "auto", 1).path == "dense"  # lean's dq sums are atomic
        finally:
            torch.use_deterministic_algorithms(before)
    assert kernels._biased_decision(dispatch.Decision("flash"), "auto", 1).path == "flash"  # takes B too


def test_biased_kernels_take_the_layouts_callers_pass():
    """q, k, v as views of one packed projection (B, T, 3, H, D) -> (B, H, T, D),
    as transformers' and fairseq's attention hand them over, and T5's bias as a
    non-contiguous view (a slice of a larger bias, broadcast over the batch
    with stride 0): the same outputs and gradients as float64."""
    batch, heads, t, d = 2, 2, 19, 16
    g = torch.Generator().manual_seed(3)
    packed = (torch.randn(batch, t, 3, heads, d, generator=g, dtype=torch.float64) * 1.2).to(DEVICE, F32)
    packed.requires_grad_()
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, D), not contiguous
    big = (torch.randn(1, heads, t + 4, t, generator=g, dtype=torch.float64) * 2.0).to(DEVICE, F32)
    big.requires_grad_()
    bias = big[:, :, 4:, :].expand(batch, -1, -1, -1)  # rows sliced, batch stride 0
    assert not q.is_contiguous() and not bias.is_contiguous() and bias.stride(0) == 0
    u = torch.tensor([0.3, 0.7], device=DEVICE, requires_grad=True)
    kmask = padding_mask([t, t * 2 // 5], t, True).to(DEVICE)
    out = lean.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=kmask, query_padding_mask=kmask,
                                score_bias=bias)
    do = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE, F32)
    grads = torch.autograd.grad(out, (packed, big, u), do)
    pd, bd, ud = (x.detach().cpu().double().requires_grad_() for x in (packed, big, u))
    qd, kd, vd = (pd[:, :, i].transpose(1, 2) for i in range(3))
    km, qm = AF.broadcast_masks(kmask.cpu(), kmask.cpu())
    ref = AF.hnas_probs(qd @ kd.transpose(-1, -2) + bd[:, :, 4:, :], ud, km, qm, 1) @ vd
    ref_grads = torch.autograd.grad(ref, (pd, bd, ud), do.cpu().double())
    torch.testing.assert_close(out.detach().double().cpu(), ref.detach(), atol=TOL[F32], rtol=0)
    for name, a, b in zip(("d(packed q, k, v)", "dB", "du"), grads, ref_grads):
        torch.testing.assert_close(a.double().cpu(), b, atol=_grad_tol(b, TOL[F32]), rtol=0, msg=name)
    assert grads[1][:, :, 4:].abs().amax() > 0.01 and grads[1][:, :, :4].abs().amax() == 0
