"""Cross-attention on every execution path of ``attend``: T_q != T_k, separate
key and query padding masks (left and right), against the float64 reference,
forward and gradients. The self-attention cases are in test_kernels.py."""

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_probs

from fairseq_dnas.attention.kernels import attend

PATHS = ["materialized", "dense", "flash", "blockwise"]
SHAPES = [(7, 10), (10, 4)]  # (T_q, T_k): more keys than queries, and fewer
Q_LENGTHS, K_LENGTHS = (7, 3, 1), (4, 2, 3)


def _inputs(t_q, t_k, dtype=torch.float64, batch=3, heads=4, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, t_q, d, generator=g, dtype=torch.float64) * 1.5
    k = torch.randn(batch, heads, t_k, d, generator=g, dtype=torch.float64) * 1.5
    v = torch.randn(batch, heads, t_k, d, generator=g, dtype=torch.float64)
    u = torch.linspace(0.15, 0.85, heads, dtype=torch.float64)
    return [x.to(dtype).requires_grad_() for x in (q, k, v, u)]


def _masks(t_q, t_k, k_side, q_side):
    kpad = None if k_side == "none" else padding_mask(K_LENGTHS, t_k, k_side == "left")
    qpad = None if q_side == "none" else padding_mask([min(n, t_q) for n in Q_LENGTHS], t_q, q_side == "left")
    return kpad, qpad


def _attend(q, k, v, u, scheme, kpad, qpad, path):
    if qpad is None:  # no padded query: an all-False mask (None would mean "same as the keys")
        qpad = torch.zeros(q.shape[0], q.shape[2], dtype=torch.bool)
    out, _ = attend(q, k, v, scheme=scheme, padding_mask=kpad, query_padding_mask=qpad,
                    hybrid_weight=u if scheme == "hnas" else None, path=path)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("t_q, t_k", SHAPES)
@pytest.mark.parametrize("k_side, q_side", [("left", "right"), ("right", "left"), ("none", "left"),
                                            ("right", "none")])
def test_cross_attention_forward_matches_float64_reference(path, scheme, t_q, t_k, k_side, q_side):
    q, k, v, u = _inputs(t_q, t_k, torch.float32)
    kpad, qpad = _masks(t_q, t_k, k_side, q_side)
    out = _attend(q, k, v, u, scheme, kpad, qpad, path)
    p = reference_probs(q.double() @ k.double().transpose(-1, -2), scheme, kpad, qpad, u.detach())
    assert out.shape == q.shape
    torch.testing.assert_close(out.double(), p @ v.detach().double(), atol=1e-5, rtol=0)
    if qpad is not None:
        assert (out.transpose(1, 2)[qpad] == 0).all()


@pytest.mark.parametrize("path", ["dense", "flash", "blockwise"])
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("t_q, t_k", SHAPES)
def test_cross_attention_gradients_match_materialized_autograd(path, scheme, t_q, t_k):
    kpad, qpad = _masks(t_q, t_k, "left", "right")
    grads = []
    for p in ("materialized", path):
        q, k, v, u = _inputs(t_q, t_k)
        out = _attend(q, k, v, u, scheme, kpad, qpad, p)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        inputs = (q, k, v, u) if scheme == "hnas" else (q, k, v)
        grads.append(torch.autograd.grad(out, inputs, g))
    for name, a, b in zip("qkvu", *grads):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8, msg=f"d{name} differs on path {path}")


@pytest.mark.parametrize("path", ["dense", "flash", "blockwise"])
def test_cross_attention_gradcheck(path):
    q, k, v, u = _inputs(3, 5, batch=1, heads=2, d=3)
    kpad, qpad = padding_mask((3,), 5, True), padding_mask((2,), 3, False)
    assert torch.autograd.gradcheck(
        lambda q, k, v, u: _attend(q, k, v, u, "hnas", kpad, qpad, path), (q, k, v, u), eps=1e-6, atol=1e-6
    )


def test_padded_queries_leave_the_real_outputs_unchanged():
    """DNAS column sums run over real queries only: appending padded queries
    (any values) changes nothing for the real ones."""
    q, k, v, u = _inputs(4, 6, torch.float32)
    extra = torch.randn(3, 4, 5, 5) * 10
    q_long = torch.cat([q.detach(), extra], dim=2)
    qpad = torch.zeros(3, 9, dtype=torch.bool)
    qpad[:, 4:] = True
    for path in PATHS:
        short = _attend(q, k, v, u, "dnas", None, None, path)
        long = _attend(q_long, k, v, u, "dnas", None, qpad, path)
        torch.testing.assert_close(long[:, :, :4], short, atol=1e-5, rtol=0)
        assert not torch.allclose(_attend(q_long, k, v, u, "dnas", None, None, path)[:, :, :4], short,
                                  atol=1e-3)  # the same queries unmasked do change them


def test_cross_attention_without_a_query_mask_is_refused():
    q, k, v, _ = _inputs(3, 5)
    with pytest.raises(ValueError, match="needs query_padding_mask"):
        attend(q, k, v, scheme="dnas", padding_mask=torch.zeros(3, 5, dtype=torch.bool))
