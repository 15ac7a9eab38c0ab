"""Checks every Triton kernel set passes, shared by tests/test_triton_short.py
and tests/test_triton.py: each runs them on its module (``triton_attention``).

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(conftest sets TRITON_INTERPRET=1). Import after ``pytest.importorskip`` of
triton.
"""

import torch
from conftest import padding_mask
from test_triton import TOL, _float64_autograd, _grad_tol

from fairseq_dnas.attention.triton import dropout as triton_dropout
from fairseq_dnas.attention.triton import long

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, F16 = torch.float32, torch.float16
LENGTHS = (37, 20, 1)  # a one-token sentence: its only key is its only query


def _inputs(dtype, tq=37, tk=37, d=20, batch=3, heads=1, seed=0, mean=0.7):
    """q (with a mean query away from 0: the q_proj bias that centring is for),
    k, v, an upstream gradient and u."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.5 * (20 / d) ** 0.25
    q = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64) * scale + mean
    k = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64)
    do = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64)
    q, k, v = (x.to(DEVICE, dtype).requires_grad_() for x in (q, k, v))
    u = torch.linspace(0.2, 0.8, heads, device=DEVICE).requires_grad_()
    return q, k, v, do.to(DEVICE, dtype), u


def _masks(left, tq=37, tk=37, batch=3):
    lengths_q = [min(n, tq) for n in LENGTHS][:batch]
    lengths_k = [min(n, tk) for n in LENGTHS][:batch]
    return padding_mask(lengths_k, tk, left).to(DEVICE), padding_mask(lengths_q, tq, left).to(DEVICE)


def check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, p=0.0, seed=None):
    """Output and gradients of ``module``'s kernels against the float64 autograd
    of the materialized math, with the kernels' own dropout mask."""
    seed = torch.tensor([20201], dtype=torch.int64, device=DEVICE) if seed is None else seed
    hybrid = u if scheme == "hnas" else None
    out = module.triton_attention(q, k, v, hybrid_weight=hybrid, key_padding_mask=kmask, query_padding_mask=qmask,
                                  dropout_p=p, seed=seed)
    inputs = (q, k, v) if hybrid is None else (q, k, v, u)
    grads = torch.autograd.grad(out, inputs, do)
    keep = triton_dropout.dropout_mask(seed, tuple(q.shape[:3]) + (k.shape[2],), p).cpu() if p > 0 else None
    ref, ref_inputs = _float64_autograd(*(x.cpu() for x in (q, k, v)), None if hybrid is None else u.cpu(), scheme,
                                        None if kmask is None else kmask.cpu(),
                                        None if qmask is None else qmask.cpu(), keep, p)
    ref_grads = torch.autograd.grad(ref, ref_inputs, do.cpu().double())
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.detach().double().cpu(), ref.detach(), atol=tol, rtol=0)
    if p == 0:  # the scheme ran, not plain softmax: softmax attention is far from the output
        s = q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2)
        if kmask is not None:
            s = s.masked_fill(kmask.cpu()[:, None, None, :], float("-inf"))
        softmax_out = s.softmax(-1) @ v.detach().double().cpu()
        real = torch.ones(q.shape[:3], dtype=torch.bool) if qmask is None else ~qmask.cpu()[:, None, :]
        gap = (out.detach().double().cpu() - softmax_out).abs().amax(-1)[real.expand(q.shape[:3])].max()
        assert gap > 20 * tol, f"the output is within {gap:.2e} of plain softmax attention"
    for name, a, b in zip(("dq", "dk", "dv", "du"), grads, ref_grads):
        assert a.dtype == inputs[("dq", "dk", "dv", "du").index(name)].dtype, name
        torch.testing.assert_close(a.double().cpu(), b, atol=_grad_tol(b, tol), rtol=0, msg=name)
    return out, grads


def check_exactness(module, scheme, dtype, p):
    """37 positions, head size 20, left padding with a one-token sentence, a
    mean query far from 0, dropout with the common mask for the same seed."""
    q, k, v, do, u = _inputs(dtype)
    kmask, qmask = _masks(left=True)
    check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, p)


def check_head_size(module, scheme, d, heads=1):
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, d=d, batch=2, heads=heads)
    kmask, qmask = _masks(left=False, tq=20, tk=20, batch=2)
    check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, 0.25 if d == 64 else 0.0)


def check_strided_views(module, scheme, tq=19, tk=33):
    """q, k, v as views of packed projections in fairseq's (T, B, H, D) order,
    v with a transposed head dimension; T_q != T_k with separate masks.
    Returns the output and the gradients."""
    g = torch.Generator().manual_seed(3)
    bsz, heads, d = 2, 2, 16
    packed_q = (torch.randn(tq, bsz, heads, d, generator=g) + 0.5).to(DEVICE)
    packed_kv = torch.randn(tk, bsz, 2, heads, d, generator=g).to(DEVICE)
    q = packed_q.permute(1, 2, 0, 3).requires_grad_()
    kv = packed_kv.permute(1, 2, 3, 0, 4).requires_grad_()  # (B, 2, H, T, D)
    k, v = kv[:, 0], kv[:, 1].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not q.is_contiguous() and not k.is_contiguous() and v.stride(-1) != 1
    do = torch.randn(bsz, heads, tq, d, generator=g).to(DEVICE)
    u = torch.tensor([0.3, 0.7], device=DEVICE, requires_grad=True)
    real_q = (tq + 1) // 4
    kmask = padding_mask([tk, tk * 4 // 11], tk, False).to(DEVICE)
    qmask = padding_mask([tq, real_q], tq, False).to(DEVICE)
    out, grads = check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask)
    assert (out[1, :, real_q:] == 0).all()  # padded queries give 0
    return out, grads


def check_same_as_long(module, scheme):
    """The same output and gradients as long.py's kernels for the same dropout seed (the same mask)."""
    q, k, v, do, u = _inputs(F32, tq=20, tk=20, batch=2, heads=2)
    kmask, qmask = _masks(left=False, tq=20, tk=20, batch=2)
    seed = torch.tensor([7], dtype=torch.int64, device=DEVICE)
    inputs = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    results = []
    for kernels_module in (long, module):
        out = kernels_module.triton_attention(q, k, v, hybrid_weight=u if scheme == "hnas" else None,
                                              key_padding_mask=kmask, query_padding_mask=qmask, dropout_p=0.3,
                                              seed=seed)
        results.append((out, *torch.autograd.grad(out, inputs, do)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=_grad_tol(b.detach()), rtol=0)


def check_bitwise_repeatable(module, deterministic):
    """The same bits every run, with and without torch.use_deterministic_algorithms."""
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, batch=2, heads=2)
    kmask, qmask = _masks(left=True, tq=20, tk=20, batch=2)
    seed = torch.tensor([11], dtype=torch.int64, device=DEVICE)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        runs = []
        for _ in range(2):
            out = module.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=kmask,
                                          query_padding_mask=qmask, dropout_p=0.2, seed=seed)
            runs.append((out, *torch.autograd.grad(out, (q, k, v, u), do)))
    finally:
        torch.use_deterministic_algorithms(before)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
