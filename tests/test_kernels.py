"""Tier 1: every execution path of ``attend`` against the float64 reference.

Forward outputs against Algorithm 1 in float64 (``reference.py``), gradients
against autograd through the materialized path in float64 and by
``torch.autograd.gradcheck``, with left and right padding; plus the automatic
path choice and its error messages.
"""

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_probs, reference_self_attention

from fairseq_dnas.attention import SCHEMES, fused, kernels, primitives, selection
from fairseq_dnas.attention.kernels import attend, choose_path
from fairseq_dnas.modules import DNASMultiheadAttention

FAST_PATHS = ["dense", "flash", "blockwise"]
PATHS = ["materialized", *FAST_PATHS]
LENGTHS = (9, 6, 1)  # a one-token sentence: its only key column is its only query


def _qkv(dtype=torch.float64, batch=3, heads=4, t=9, d=5, scale=1.5, seed=0):
    """q, k with entries of size ``scale`` (scores of size scale^2 sqrt(d)); v of size 1."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch, heads, t, d, generator=g, dtype=torch.float64) * s).to(dtype).requires_grad_()
        for s in (scale, scale, 1.0)
    ]


def _u(heads=4, dtype=torch.float64):
    return torch.linspace(0.15, 0.85, heads, dtype=dtype).requires_grad_()


def _mask(padding, t=9):
    return None if padding == "none" else padding_mask(LENGTHS, t, padding == "left")


def _reference_output(q, k, v, scheme, mask, u):
    p = reference_probs(q @ k.transpose(-1, -2), scheme, mask, mask, None if u is None else u.detach())
    return p @ v.detach().double()


def _run(q, k, v, scheme, mask, u, path, **kw):
    out, _ = attend(q, k, v, scheme=scheme, padding_mask=mask,
                    hybrid_weight=u if scheme == "hnas" else None, path=path, **kw)
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_forward_matches_float64_reference(path, scheme, padding):
    q, k, v = _qkv(torch.float32)
    u = _u(dtype=torch.float32)
    mask = _mask(padding)
    out = _run(q, k, v, scheme, mask, u, path)
    ref = _reference_output(q.double(), k.double(), v, scheme, mask, u)
    assert out.shape == q.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
    if mask is not None:  # padded query rows are 0, as rows of the probabilities
        assert (out.transpose(1, 2)[mask] == 0).all()


@pytest.mark.parametrize("path", FAST_PATHS)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("padding", ["none", "left", "right"])
def test_gradients_match_materialized_autograd(path, scheme, padding):
    mask = _mask(padding)
    results = []
    for p in ("materialized", path):
        q, k, v = _qkv()
        u = _u()
        out = _run(q, k, v, scheme, mask, u, p)
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
        inputs = (q, k, v, u) if scheme == "hnas" else (q, k, v)
        results.append(torch.autograd.grad(out, inputs, g))
    for name, a, b in zip("qkvu", *results):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8, msg=f"d{name} differs on path {path}")


@pytest.mark.parametrize("path", FAST_PATHS)
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_gradcheck(path, scheme, padding):
    q, k, v = _qkv(batch=2, heads=2, t=5, d=3)
    u = _u(heads=2)
    mask = padding_mask((5, 2), 5, padding == "left")

    def f(q, k, v, u):
        return _run(q, k, v, scheme, mask, u, path)

    assert torch.autograd.gradcheck(f, (q, k, v, u), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("path", FAST_PATHS)
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_extreme_scores_stay_finite_and_exact(path, scheme):
    # Scores of +-300: a query can be explained away entirely (sum_j xi[i, j]
    # underflows in float32); nothing may become NaN. At |s| = 300 one float32
    # rounding step of a score is 3e-5, and the fused paths compute c from a
    # second product k.q (transposed, rounded differently), so allow 3e-5
    # (with |v| = 1); ordinary scores are held to 1e-5 above.
    q, k, v = _qkv(torch.float32, scale=6.0)
    u = _u(dtype=torch.float32)
    mask = _mask("left")
    out = _run(q, k, v, scheme, mask, u, path)
    ref = _reference_output(q.double(), k.double(), v, scheme, mask, u)
    torch.testing.assert_close(out.double(), ref, atol=3e-5, rtol=0)
    out.pow(2).sum().backward()
    for t in (q, k, v, u):
        assert t.grad is None or torch.isfinite(t.grad).all()


@pytest.mark.parametrize("path", ["flash", "blockwise"])
def test_head_groups_and_repeated_backward(path, monkeypatch):
    """Fused paths loop over head groups; a second backward of the same graph
    (retain_graph) must give the same gradients (no saved tensor is changed)."""
    monkeypatch.setattr(fused, "HEADS_PER_CALL", 3)
    mask = _mask("left")
    q, k, v = _qkv(heads=4)
    u = _u()
    out = _run(q, k, v, "hnas", mask, u, path)
    first = torch.autograd.grad(out.sum(), (q, k, v, u), retain_graph=True)
    second = torch.autograd.grad(out.sum(), (q, k, v, u))
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    q_ref, k_ref, v_ref = _qkv(heads=4)
    u_ref = _u()
    ref = torch.autograd.grad(_run(q_ref, k_ref, v_ref, "hnas", mask, u_ref, "materialized").sum(),
                              (q_ref, k_ref, v_ref, u_ref))
    for a, b in zip(first, ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_dense_dropout_equals_materialized_dropout():
    """With the same seed both paths drop the same probabilities."""
    drop = torch.nn.Dropout(0.3).train()
    q, k, v = _qkv(torch.float32)
    mask = _mask("left")
    outs = []
    for path in ("materialized", "dense"):
        torch.manual_seed(5)
        outs.append(_run(q, k, v, "dnas", mask, None, path, dropout=drop))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=0)
    torch.manual_seed(5)
    assert not torch.allclose(outs[0], _run(q, k, v, "dnas", mask, None, "dense"))


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_dense_returns_the_probabilities(scheme):
    q, k, v = _qkv(torch.float32)
    u = _u(dtype=torch.float32)
    mask = _mask("right")
    _, probs = attend(q, k, v, scheme=scheme, padding_mask=mask, hybrid_weight=u if scheme == "hnas" else None,
                      need_weights=True)
    ref = reference_probs(q @ k.transpose(-1, -2), scheme, mask, mask, u.detach())
    torch.testing.assert_close(probs.double(), ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_blockwise_half_precision_runs(dtype, scheme):
    q, k, v = _qkv(torch.float32)
    u = _u(dtype=torch.float32)
    mask = _mask("left")
    ref = _run(q, k, v, scheme, mask, u, "materialized")
    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    out = _run(*low, scheme, mask, u, "blockwise")
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)
    out.float().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in low)


# --- path choice ---------------------------------------------------------------


def _q(t, dtype=torch.float32):
    return torch.zeros(2, 2, t, 4, dtype=dtype)


def test_auto_path_choice(monkeypatch):
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    short, long = selection.DENSE_MAX_LEN, selection.DENSE_MAX_LEN + 1
    assert choose_path(_q(short)) == "dense"
    assert choose_path(_q(long)) == "flash"
    assert choose_path(_q(long, torch.float64)) == "flash"
    assert choose_path(_q(long), dropout=True) == "dense"
    assert choose_path(_q(long), need_weights=True) == "dense"
    assert choose_path(_q(long, torch.bfloat16)) == "blockwise"  # c stays float32
    assert choose_path(_q(short, torch.bfloat16)) == "dense"
    assert choose_path(_q(long), sinkhorn_iters=3) == "materialized"
    assert choose_path(_q(short), path="fused") == "flash"
    assert choose_path(_q(short, torch.bfloat16), path="fused") == "blockwise"
    monkeypatch.setenv(kernels.PATH_ENV, "blockwise")
    assert choose_path(_q(short)) == "blockwise"
    assert choose_path(_q(short), path="dense") == "dense"  # the argument wins


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(path="fast"), "unknown attention path"),
        (dict(path="flash", dropout=True), "attention dropout"),
        (dict(path="blockwise", need_weights=True), "need_weights"),
        (dict(path="dense", sinkhorn_iters=2), "sinkhorn_iters=2"),
        (dict(path="flash", q=_q(4, torch.bfloat16)), "float32/float64"),
    ],
)
def test_impossible_paths_say_what_to_change(kwargs, message):
    q = kwargs.pop("q", _q(4))
    with pytest.raises(ValueError, match=message):
        choose_path(q, **kwargs)


def test_old_torch_falls_back_without_the_cpu_flash_kernels(monkeypatch):
    """torch < 2.2 has no CPU flash-attention ops: ``auto``/``fused`` take the
    plain-torch kernel and still compute DNAS/HNAS."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.setattr(primitives.FlashCPU, "available", False)
    long = selection.DENSE_MAX_LEN + 1
    assert choose_path(_q(long)) == "blockwise"
    with pytest.raises(ValueError, match="torch >= 2.2"):
        choose_path(_q(long), path="flash")
    calls = []
    blockwise_forward = primitives.BLOCKWISE.forward
    monkeypatch.setattr(primitives.BLOCKWISE, "forward", lambda *a: calls.append(1) or blockwise_forward(*a))
    q, k, v = _qkv(torch.float32)
    mask = _mask("left")
    for scheme in SCHEMES:
        calls.clear()
        u = _u(dtype=torch.float32)
        out = _run(q, k, v, scheme, mask, u, "fused")
        ref = _reference_output(q.double(), k.double(), v, scheme, mask, u)
        torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)
        assert bool(calls) == (scheme != "unas"), scheme  # unas: the materialized path


def test_dropout_activity():
    drop = torch.nn.Dropout(0.1)
    assert kernels.dropout_active(drop.train())
    assert not kernels.dropout_active(drop.eval())
    assert not kernels.dropout_active(torch.nn.Dropout(0.0).train())
    assert not kernels.dropout_active(None)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("left_pad", [True, False])
def test_module_on_the_fused_path(scheme, left_pad, monkeypatch):
    """The fairseq module, long enough for ``auto`` to pick the fused path."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.setattr(selection, "DENSE_MAX_LEN", 4)
    m = DNASMultiheadAttention(32, 4, scheme=scheme, hybrid_init=0.3).train()  # attention dropout 0
    if m.hybrid_logit is not None:
        m.hybrid_logit.data = torch.linspace(-2, 2, 4)
    x = torch.randn(9, 3, 32, requires_grad=True)
    mask = padding_mask(LENGTHS, 9, left_pad)
    assert choose_path(torch.zeros(3, 4, 9, 8)) == "flash"
    out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    real = ~mask.T
    torch.testing.assert_close(out.double()[real], reference_self_attention(m, x, mask)[real], atol=1e-5, rtol=0)
    out[real].pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    monkeypatch.setenv(kernels.PATH_ENV, "materialized")
    out2, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    out2[real].pow(2).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_dense_falls_back_to_log_domain_for_an_explained_away_query(scheme, monkeypatch):
    """Query 0 scores 200 below query 1 on every key: its row of
    xi = exp(s - c) underflows in float32. The dense path's one-exp forward
    must notice and recompute in the log domain (rows still sum to 1)."""
    from fairseq_dnas.attention import dense

    calls = []
    log_ = dense._dnas_log_
    monkeypatch.setattr(dense, "_dnas_log_", lambda *a: calls.append(1) or log_(*a))
    t = 6
    q = torch.zeros(2, 2, t, 1)
    q[:, :, 0], q[:, :, 1] = -100.0, 100.0
    k = torch.ones(2, 2, t, 1)
    v = torch.randn(2, 2, t, 3)
    u = torch.tensor([0.3, 0.7])
    mask = padding_mask((6, 4), t, left_pad=False)
    out = _run(q, k, v, scheme, mask, u, "dense")
    assert calls, "the log-domain fallback did not run"
    ref = _reference_output(q.double(), k.double(), v, scheme, mask, u)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("path", ["auto", *PATHS, "fused", "triton"])
def test_hnas_without_a_hybrid_weight_is_an_error_on_every_path(path):
    """Without u, HNAS is undefined; the Triton kernels would have run DNAS
    (they take u=None for DNAS). Every path refuses, saying what to pass."""
    q, k, v = _qkv(torch.float32)
    with pytest.raises(ValueError, match=r"scheme 'hnas' needs hybrid_weight.*shape \(H,\) = \(4,\)"):
        attend(q, k, v, scheme="hnas", hybrid_weight=None, path=path)
    with pytest.raises(ValueError, match=r"hybrid_weight must be a tensor of shape \(H,\) = \(4,\); got \(3,\)"):
        attend(q, k, v, scheme="hnas", hybrid_weight=_u(heads=3), path=path)
