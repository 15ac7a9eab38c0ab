"""Tier 1: ``fairseq_dnas.attention_probs`` against the float64 Algorithm 1."""

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_probs

from fairseq_dnas import SCHEMES, attention_probs


def _case(batch=3, heads=4, t=7, lengths=(7, 5, 2), left_pad=True, scale=3.0, dtype=torch.float32):
    scores = (torch.randn(batch, heads, t, t, dtype=torch.float64) * scale).to(dtype)
    mask = padding_mask(lengths, t, left_pad) if lengths is not None else None
    u = torch.rand(heads, dtype=torch.float64)
    return scores, mask, u


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_matches_float64_algorithm_1(scheme, padding):
    lengths = None if padding == "none" else (7, 5, 2)
    scores, mask, u = _case(lengths=lengths, left_pad=padding == "left")
    got = attention_probs(scores, scheme, key_padding_mask=mask, query_padding_mask=mask,
                          hybrid_weight=u.float())
    ref = reference_probs(scores, scheme, mask, mask, u.float())
    assert got.dtype == torch.float32
    assert got.shape == scores.shape
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_separate_query_and_key_padding(scheme):
    """Cross-attention shapes: T_q != T_k with independent masks."""
    scores = torch.randn(2, 3, 5, 8, dtype=torch.float64) * 2
    qmask = padding_mask([5, 3], 5, left_pad=False)
    kmask = padding_mask([8, 4], 8, left_pad=True)
    u = torch.tensor([0.1, 0.5, 0.9])
    got = attention_probs(scores.float(), scheme, key_padding_mask=kmask,
                          query_padding_mask=qmask, hybrid_weight=u)
    torch.testing.assert_close(got.double(), reference_probs(scores, scheme, kmask, qmask, u),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("iters", [1, 2, 3, 7])
def test_k_iterations_are_k_sinkhorn_steps(iters):
    scores, mask, u = _case()
    for scheme in ("dnas", "hnas"):
        got = attention_probs(scores, scheme, key_padding_mask=mask, query_padding_mask=mask,
                              hybrid_weight=u.float(), sinkhorn_iters=iters)
        ref = reference_probs(scores, scheme, mask, mask, u.float(), sinkhorn_iters=iters)
        torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)
    one = attention_probs(scores, "dnas", key_padding_mask=mask, query_padding_mask=mask)
    if iters > 1:  # more rounds really change the result
        many = attention_probs(scores, "dnas", key_padding_mask=mask, query_padding_mask=mask,
                               sinkhorn_iters=iters)
        assert (one - many).abs().max() > 1e-4


def test_many_iterations_are_doubly_stochastic():
    scores, mask, _ = _case(scale=1.0)
    p = attention_probs(scores, "dnas", key_padding_mask=mask, query_padding_mask=mask,
                        sinkhorn_iters=300)
    real = ~mask
    col = p.sum(dim=2)  # (B, H, T_k)
    torch.testing.assert_close(col[real[:, None, :].expand_as(col)],
                               torch.ones(int(real.sum()) * p.shape[1]), atol=1e-4, rtol=0)
    # One round (the paper's DNAS) is not doubly stochastic.
    p1 = attention_probs(scores, "dnas", key_padding_mask=mask, query_padding_mask=mask)
    assert (p1.sum(dim=2)[real[:, None, :].expand_as(col)] - 1).abs().max() > 1e-2


def test_theorem_2_every_key_keeps_at_least_one_over_t_q():
    # Adversarial scores: one key dominates every row, the others are far below.
    t = 9
    scores = torch.full((2, 3, t, t), -30.0)
    scores[..., 0] = 30.0
    scores += torch.randn_like(scores)
    mask = padding_mask([9, 6], t, left_pad=True)
    real_q = (~mask).sum(dim=1).double()  # T_q per sentence
    col_d = attention_probs(scores, "dnas", key_padding_mask=mask, query_padding_mask=mask).double().sum(dim=2)
    col_u = attention_probs(scores, "unas", key_padding_mask=mask, query_padding_mask=mask).double().sum(dim=2)
    real_k = (~mask)[:, None, :].expand_as(col_d)
    bound = (1.0 / real_q)[:, None, None].expand_as(col_d)
    assert (col_d[real_k] >= bound[real_k] * (1 - 1e-6)).all()
    # UNAS gives no such bound: here keys are explained away (sum < 1e-8).
    assert (col_u[real_k] < 1e-8).any()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_probability_invariants_and_no_nan(scheme):
    scores, mask, u = _case(scale=50.0)  # large scores: exp overflows without log domain
    mask[2] = True  # a sentence with no real token at all
    p = attention_probs(scores, scheme, key_padding_mask=mask, query_padding_mask=mask,
                        hybrid_weight=u.float())
    assert torch.isfinite(p).all()
    real = ~mask
    rows = p.sum(dim=-1)  # (B, H, T_q)
    real_rows = real[:, None, :].expand_as(rows)
    torch.testing.assert_close(rows[real_rows], torch.ones(int(real_rows.sum())), atol=1e-5, rtol=0)
    assert (rows[~real_rows] == 0).all()  # padded query rows are all 0
    assert (p.masked_select(mask[:, None, None, :]) == 0).all()  # padded keys get 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_gradcheck_float64(scheme):
    scores = (torch.randn(2, 2, 5, 5, dtype=torch.float64) * 2).requires_grad_()
    mask = padding_mask([5, 3], 5, left_pad=True)
    u = torch.tensor([0.3, 0.8], dtype=torch.float64, requires_grad=True)

    def fn(s, w):
        return attention_probs(s, scheme, key_padding_mask=mask, query_padding_mask=mask,
                               hybrid_weight=w, sinkhorn_iters=2)

    assert fn(scores, u).dtype == torch.float64
    assert torch.autograd.gradcheck(fn, (scores, u), eps=1e-6, atol=1e-6)


def test_gradients_stay_finite_with_empty_sentences():
    scores, mask, u = _case()
    mask[1] = True
    scores.requires_grad_()
    w = u.float().requires_grad_()
    p = attention_probs(scores, "hnas", key_padding_mask=mask, query_padding_mask=mask, hybrid_weight=w)
    (p * torch.randn_like(p)).sum().backward()
    assert torch.isfinite(scores.grad).all() and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_low_precision_inputs_normalize_in_float32(dtype, scheme):
    scores, mask, u = _case(scale=20.0)
    low = scores.to(dtype)
    p = attention_probs(low, scheme, key_padding_mask=mask, query_padding_mask=mask,
                        hybrid_weight=u.float())
    assert p.dtype == torch.float32 and torch.isfinite(p).all()
    # Same result as the float64 reference on the (rounded) low-precision scores.
    ref = reference_probs(low.double(), scheme, mask, mask, u.float())
    torch.testing.assert_close(p.double(), ref, atol=1e-5, rtol=0)


def test_schemes_really_differ():
    scores, mask, u = _case()
    kw = dict(key_padding_mask=mask, query_padding_mask=mask)
    pu = attention_probs(scores, "unas", **kw)
    pd = attention_probs(scores, "dnas", **kw)
    ph = attention_probs(scores, "hnas", hybrid_weight=torch.full((4,), 0.5), **kw)
    assert (pu - pd).abs().max() > 1e-2
    torch.testing.assert_close(ph, 0.5 * pu + 0.5 * pd, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scheme="softmax"), "unknown attention scheme"),
        (dict(scheme="dnas", sinkhorn_iters=0), "sinkhorn_iters"),
        (dict(scheme="dnas", sinkhorn_iters=1.5), "sinkhorn_iters"),
        (dict(scheme="hnas"), "needs hybrid_weight"),
        (dict(scheme="hnas", hybrid_weight=torch.full((4,), 1.5)), r"\[0, 1\]"),
        (dict(scheme="hnas", hybrid_weight=torch.full((4,), -0.1)), r"\[0, 1\]"),
        (dict(scheme="hnas", hybrid_weight=torch.full((3,), 0.5)), "shape"),
        (dict(scheme="dnas", key_padding_mask=torch.zeros(3, 6, dtype=torch.bool)), "key_padding_mask"),
    ],
)
def test_bad_arguments_raise_value_error(kwargs, message):
    scores, _, _ = _case(lengths=None)
    scheme = kwargs.pop("scheme")
    with pytest.raises(ValueError, match=message):
        attention_probs(scores, scheme, **kwargs)
