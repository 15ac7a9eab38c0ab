"""Tier 2: the attention module against fairseq and the float64 reference."""

import pytest
import torch
from conftest import padding_mask
from fairseq.modules import MultiheadAttention
from fairseq_dnas.reference import reference_probs, reference_self_attention

from fairseq_dnas.modules import DNASMultiheadAttention
from fairseq_dnas.modules.dnas_multihead_attention import exact_logit

EMBED, HEADS = 32, 4


def _inputs(lengths=(9, 6, 3), total=9, left_pad=True):
    x = torch.randn(total, len(lengths), EMBED)
    return x, padding_mask(lengths, total, left_pad)


@pytest.mark.parametrize("training", [False, True])
def test_unas_equals_fairseq_multihead_attention(training):
    ours = DNASMultiheadAttention(EMBED, HEADS, scheme="unas")
    theirs = MultiheadAttention(EMBED, HEADS, self_attention=True)
    theirs.load_state_dict(ours.state_dict())  # same parameter names
    ours.train(training), theirs.train(training)
    x, mask = _inputs()
    out_a, w_a = ours(x, x, x, key_padding_mask=mask, need_weights=True)
    out_b, w_b = theirs(x, x, x, key_padding_mask=mask, need_weights=True)
    torch.testing.assert_close(out_a, out_b, atol=0, rtol=0)
    torch.testing.assert_close(w_a, w_b, atol=0, rtol=0)


def test_parameter_names_are_fairseqs():
    names = set(DNASMultiheadAttention(EMBED, HEADS, scheme="hnas").state_dict())
    fairseq_names = set(MultiheadAttention(EMBED, HEADS, self_attention=True).state_dict())
    assert names - fairseq_names == {"hybrid_logit"}
    assert fairseq_names <= names


@pytest.mark.parametrize("scheme", ["unas", "dnas", "hnas"])
@pytest.mark.parametrize("left_pad", [True, False])
@pytest.mark.parametrize("iters", [1, 3])
def test_module_output_matches_float64_reference(scheme, left_pad, iters):
    m = DNASMultiheadAttention(EMBED, HEADS, scheme=scheme, sinkhorn_iters=iters, hybrid_init=0.3).eval()
    if m.hybrid_logit is not None:  # distinct weights per head
        m.hybrid_logit.data = torch.linspace(-2, 2, HEADS)
    x, mask = _inputs(left_pad=left_pad)
    out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    ref = reference_self_attention(m, x, mask)
    real = ~mask.T  # (T, B)
    torch.testing.assert_close(out.double()[real], ref[real], atol=1e-5, rtol=0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_head_weights_are_the_scheme_probabilities(scheme):
    m = DNASMultiheadAttention(EMBED, HEADS, scheme=scheme, hybrid_init=0.2).eval()
    x, mask = _inputs()
    _, w = m(x, x, x, key_padding_mask=mask, need_head_weights=True)  # (H, B, T, T)
    _, avg = m(x, x, x, key_padding_mask=mask, need_weights=True)  # (B, T, T)
    q = (m.q_proj(x) * m.scaling).view(9, 3, HEADS, -1).permute(1, 2, 0, 3)
    k = m.k_proj(x).view(9, 3, HEADS, -1).permute(1, 2, 0, 3)
    u = m.hybrid_weight.detach() if m.hybrid_weight is not None else None
    ref = reference_probs(q @ k.transpose(-1, -2), scheme, mask, mask, u)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(avg, w.mean(0))


def test_dnas_differs_from_softmax():
    m = DNASMultiheadAttention(EMBED, HEADS, scheme="dnas").eval()
    plain = MultiheadAttention(EMBED, HEADS, self_attention=True).eval()
    plain.load_state_dict(m.state_dict())
    x, mask = _inputs()
    diff = (m(x, x, x, key_padding_mask=mask)[0] - plain(x, x, x, key_padding_mask=mask)[0]).abs()
    assert diff[~mask.T].max() > 1e-3


@pytest.mark.parametrize("u0", [0.1, 0.5, 0.3, 0.9, 0.999])
@pytest.mark.parametrize("per, n", [("head", HEADS), ("layer", 1)])
def test_hybrid_weight_starts_exactly_at_init(u0, per, n):
    m = DNASMultiheadAttention(EMBED, HEADS, scheme="hnas", hybrid_init=u0, hybrid_per=per)
    assert m.hybrid_logit.shape == (n,)
    assert m.hybrid_weight.shape == (HEADS,)
    assert (m.hybrid_weight == torch.tensor(u0, dtype=torch.float32)).all()


@pytest.mark.parametrize("u0", [0.01, 0.001, 0.02, 0.77])
def test_hybrid_init_is_the_closest_float32_sigmoid(u0):
    # Near 0 a float32 logit cannot hit every float32 u; the nearest one is
    # within a relative 1e-6 and no neighbouring logit is closer.
    x = torch.tensor(exact_logit(u0))
    err = (torch.sigmoid(x).double() - u0).abs()
    assert err <= 1e-6 * u0
    for nb in (torch.nextafter(x, torch.tensor(9.0)), torch.nextafter(x, torch.tensor(-9.0))):
        assert err <= (torch.sigmoid(nb).double() - u0).abs()


def test_hybrid_weight_stays_in_unit_interval_while_training():
    m = DNASMultiheadAttention(EMBED, HEADS, scheme="hnas", hybrid_init=0.1)
    # Absurd steps on the hybrid logits alone push u to its limits.
    opt = torch.optim.SGD([m.hybrid_logit], lr=1e3)
    x, mask = _inputs()
    for sign in (1.0, -1.0):
        for _ in range(5):
            opt.zero_grad()
            out, _ = m(x, x, x, key_padding_mask=mask)
            (sign * out[~mask.T].sum()).backward()
            opt.step()
            u = m.hybrid_weight
            assert torch.isfinite(u).all() and (u >= 0).all() and (u <= 1).all()
    assert m.hybrid_logit.grad is not None and m.hybrid_logit.grad.abs().sum() > 0


def test_gradients_reach_every_parameter():
    m = DNASMultiheadAttention(EMBED, HEADS, scheme="hnas")
    x, mask = _inputs()
    out, _ = m(x, x, x, key_padding_mask=mask)
    out[~mask.T].pow(2).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_low_precision_module_is_finite_and_close(dtype, scheme):
    m = DNASMultiheadAttention(EMBED, HEADS, scheme=scheme).eval()
    x, mask = _inputs()
    ref, _ = m(x, x, x, key_padding_mask=mask)
    low = m.to(dtype)
    out, w = low(x.to(dtype), x.to(dtype), x.to(dtype), key_padding_mask=mask, need_head_weights=True)
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert w.dtype == torch.float32  # normalization ran in float32
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-2
    torch.testing.assert_close(out.float()[~mask.T], ref[~mask.T], atol=tol, rtol=tol)
    # A half-precision training step (what --fp16 / --bf16 run) has finite gradients.
    low.train()
    x_low = x.to(dtype).requires_grad_()
    out, _ = low(x_low, x_low, x_low, key_padding_mask=mask)
    out[~mask.T].float().pow(2).sum().backward()
    for name, p in low.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_incremental_or_masked_calls_are_refused():
    m = DNASMultiheadAttention(EMBED, HEADS, scheme="dnas")
    x, mask = _inputs()
    with pytest.raises(RuntimeError, match="incrementally"):
        m(x, x, x, key_padding_mask=mask, incremental_state={})
    with pytest.raises(RuntimeError, match="attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(9, 9))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(scheme="softmax"), "unknown attention scheme"),
        (dict(scheme="dnas", sinkhorn_iters=0), "sinkhorn_iters"),
        (dict(scheme="hnas", hybrid_init=1.5), r"\(0, 1\)"),
        (dict(scheme="hnas", hybrid_init=0.0), r"\(0, 1\)"),
        (dict(scheme="hnas", hybrid_per="block"), "hybrid_per"),
        (dict(scheme="dnas", self_attention=False), "self-attention only"),
    ],
)
def test_bad_module_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DNASMultiheadAttention(EMBED, HEADS, **kwargs)
