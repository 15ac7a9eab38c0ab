"""fairseq_dnas.nn.MultiheadAttention: a drop-in torch.nn.MultiheadAttention.

Against the float64 reference (self- and cross-attention, left and right
padding on keys and queries, every execution path, forward and gradients),
against torch's module for 'unas' and for the state dict, and the refusals."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, padding_mask
from fairseq_dnas.reference import reference_probs

from fairseq_dnas.nn import MultiheadAttention

E, H = 12, 3
PATHS = ["materialized", "dense", "flash", "blockwise"]


def _module(scheme, dtype=torch.float64, **kw):
    torch.manual_seed(0)
    m = MultiheadAttention(E, H, scheme=scheme, hybrid_init=0.3, dtype=dtype, **kw)
    with torch.no_grad():  # non-zero biases and u away from its start, so both are tested
        m.in_proj_bias.normal_()
        m.out_proj.bias.normal_()
        if m.hybrid_logit is not None:
            m.hybrid_logit.copy_(torch.linspace(-1.0, 1.5, H))
    return m


def _reference(m, query, key, value, kpad, qpad):
    """m's output in float64 with reference_probs; inputs (T, B, E)."""
    def proj(x, which):
        w = (m.in_proj_weight.chunk(3)[which] if m._qkv_same_embed_dim
             else (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)[which])
        y = x.double() @ w.detach().double().T + m.in_proj_bias.chunk(3)[which].detach().double()
        return y.view(x.shape[0], x.shape[1], H, E // H).permute(1, 2, 0, 3)

    q, k, v = proj(query, 0) * (E // H) ** -0.5, proj(key, 1), proj(value, 2)
    u = None if m.hybrid_weight is None else m.hybrid_weight.detach().double()
    p = reference_probs(q @ k.transpose(-1, -2), m.scheme, kpad, qpad, u, m.sinkhorn_iters)
    out = (p @ v).permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], E)
    return out @ m.out_proj.weight.detach().double().T + m.out_proj.bias.detach().double()


def _inputs(t_q, t_k, batch=3, dtype=torch.float64, kdim=E):
    g = torch.Generator().manual_seed(1)
    query = torch.randn(t_q, batch, E, generator=g, dtype=torch.float64).to(dtype)
    key = torch.randn(t_k, batch, kdim, generator=g, dtype=torch.float64).to(dtype)
    return query, key


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_self_attention_matches_float64_reference(path, scheme, side, monkeypatch):
    """query is key: the key padding mask pads the queries too."""
    monkeypatch.setenv("FAIRSEQ_DNAS_ATTENTION_PATH", path)
    m = _module(scheme, torch.float32)
    x, _ = _inputs(8, 8, dtype=torch.float32)
    pad = padding_mask((8, 5, 1), 8, side == "left")
    out, _ = m(x, x, x, key_padding_mask=pad, need_weights=False)
    torch.testing.assert_close(out.double(), _reference(m, x, x, x, pad, pad), atol=2e-5, rtol=0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("t_q, t_k, k_side, q_side", [(6, 9, "left", "right"), (9, 4, "right", "left")])
def test_cross_attention_matches_float64_reference(path, scheme, t_q, t_k, k_side, q_side, monkeypatch):
    monkeypatch.setenv("FAIRSEQ_DNAS_ATTENTION_PATH", path)
    m = _module(scheme, torch.float32, kdim=7, vdim=5)  # separate q/k/v projection weights
    query, key = _inputs(t_q, t_k, dtype=torch.float32, kdim=7)
    value = torch.randn(t_k, 3, 5)
    kpad = padding_mask((t_k, 3, 1), t_k, k_side == "left")
    qpad = padding_mask((t_q - 1, 2, t_q), t_q, q_side == "left")
    out, _ = m(query, key, value, key_padding_mask=kpad, query_padding_mask=qpad, need_weights=False)
    torch.testing.assert_close(out.double(), _reference(m, query, key, value, kpad, qpad), atol=2e-5, rtol=0)


@pytest.mark.parametrize("path", ["dense", "flash", "blockwise"])
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_gradients_match_float64_autograd_of_the_reference_math(path, scheme, monkeypatch):
    """Gradients of every parameter and input on a fast path equal autograd
    through the materialized math (functional.py, checked against the reference
    in test_kernels.py), in float64, for padded cross-attention."""
    grads = []
    for p in ("materialized", path):
        monkeypatch.setenv("FAIRSEQ_DNAS_ATTENTION_PATH", p)
        m = _module(scheme)
        query, key = _inputs(6, 9)
        query.requires_grad_()
        kpad, qpad = padding_mask((9, 3, 1), 9, True), padding_mask((5, 2, 6), 6, False)
        out, _ = m(query, key, key, key_padding_mask=kpad, query_padding_mask=qpad, need_weights=False)
        out.pow(2).sum().backward()
        grads.append([query.grad] + [t.grad for t in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, atol=1e-10, rtol=1e-8)
    assert scheme == "dnas" or grads[1][-1].abs().sum() > 0  # u is trained


def test_padded_queries_do_not_change_the_real_outputs():
    m = _module("dnas", torch.float32)
    query, key = _inputs(5, 7, dtype=torch.float32)
    longer = torch.cat([query, 10 * torch.randn(4, 3, E)])
    qpad = torch.zeros(3, 9, dtype=torch.bool)
    qpad[:, 5:] = True
    out, _ = m(query, key, key)
    out_long, _ = m(longer, key, key, query_padding_mask=qpad)
    torch.testing.assert_close(out_long[:5], out, atol=1e-5, rtol=0)
    unmasked, _ = m(longer, key, key)
    assert not torch.allclose(unmasked[:5], out, atol=1e-3)


def test_batch_first_unbatched_and_weights():
    m = _module("hnas", torch.float32, batch_first=True)
    query, key = _inputs(5, 7, dtype=torch.float32)
    kpad = padding_mask((7, 4, 2), 7, False)
    out, w = m(query.transpose(0, 1), key.transpose(0, 1), key.transpose(0, 1), key_padding_mask=kpad,
               average_attn_weights=False)
    ref = _reference(m, query, key, key, kpad, None).transpose(0, 1)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)
    assert w.shape == (3, H, 5, 7) and (w[kpad[:, None, None, :].expand_as(w)] == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, H, 5))
    one, w1 = m(query[:, 0], key[:, 0], key[:, 0], key_padding_mask=kpad[0])
    torch.testing.assert_close(one, out[0], atol=1e-6, rtol=0)
    assert w1.shape == (5, 7)


def test_unas_is_torchs_module_and_state_dicts_move_both_ways():
    torch_mha = torch.nn.MultiheadAttention(E, H, kdim=7, vdim=5, batch_first=True)
    ours = MultiheadAttention(E, H, kdim=7, vdim=5, batch_first=True, scheme="unas")
    assert ours.load_state_dict(torch_mha.state_dict()) is not None
    assert list(ours.state_dict()) == list(torch_mha.state_dict())
    q, k, v = torch.randn(2, 4, E), torch.randn(2, 6, 7), torch.randn(2, 6, 5)
    causal = torch.ones(4, 6, dtype=torch.bool).triu(1)  # UNAS takes any mask, as torch
    for kw in ({}, {"attn_mask": causal}, {"key_padding_mask": padding_mask((6, 3), 6, True)}):
        a, wa = ours(q, k, v, **kw)
        b, wb = torch_mha(q, k, v, **kw)
        assert torch.equal(a, b) and torch.equal(wa, wb)
    dnas = MultiheadAttention(E, H, kdim=7, vdim=5, batch_first=True, scheme="dnas")
    dnas.load_state_dict(ours.state_dict())  # strict, both ways
    torch_mha.load_state_dict(dnas.state_dict())
    hnas = MultiheadAttention(E, H, scheme="hnas", hybrid_init=0.1)
    with torch.no_grad():
        hnas.hybrid_logit.fill_(3.0)
    hnas.load_state_dict(torch.nn.MultiheadAttention(E, H).state_dict())  # no hybrid weights: u = init
    torch.testing.assert_close(hnas.hybrid_weight, torch.full((H,), 0.1))


def test_hybrid_weight_per_head_and_per_layer():
    per_head = MultiheadAttention(E, H, scheme="hnas", hybrid_init=0.25)
    per_layer = MultiheadAttention(E, H, scheme="hnas", hybrid_init=0.25, hybrid_per="layer")
    assert per_head.hybrid_logit.shape == (H,) and per_layer.hybrid_logit.shape == (1,)
    for m in (per_head, per_layer):
        assert m.hybrid_weight.shape == (H,)
        torch.testing.assert_close(m.hybrid_weight, torch.full((H,), 0.25))
    assert MultiheadAttention(E, H, scheme="dnas").hybrid_weight is None


def test_query_independent_attn_mask_is_a_key_mask():
    m = _module("dnas", torch.float32)
    query, key = _inputs(5, 7, dtype=torch.float32)
    blocked = torch.zeros(7, dtype=torch.bool)
    blocked[[1, 4]] = True
    kpad = blocked.expand(3, 7)
    expected, _ = m(query, key, key, key_padding_mask=kpad)
    as_bool, _ = m(query, key, key, attn_mask=blocked.expand(5, 7))
    as_float, _ = m(query, key, key, attn_mask=torch.zeros(3 * H, 5, 7).masked_fill(blocked, float("-inf")))
    torch.testing.assert_close(as_bool, expected)
    torch.testing.assert_close(as_float, expected)


@pytest.mark.parametrize("kwargs, message", [
    ({"attn_mask": torch.ones(5, 5, dtype=torch.bool).triu(1)}, "query-dependent mask"),
    ({"is_causal": True, "attn_mask": torch.ones(5, 5, dtype=torch.bool).triu(1)}, "is_causal=True"),
    ({"attn_mask": torch.full((5, 5), -1.0)}, "values other than 0 and -inf"),
    ({"key_padding_mask": torch.zeros(3, 4, dtype=torch.bool)}, r"key_padding_mask must have shape \(3, 5\)"),
    ({"query_padding_mask": torch.zeros(5, 3, dtype=torch.bool)}, r"query_padding_mask must have shape \(3, 5\)"),
])
def test_refusals_say_why(kwargs, message):
    m = MultiheadAttention(E, H, scheme="hnas")
    x = torch.randn(5, 3, E)
    with pytest.raises(ValueError, match=message):
        m(x, x, x, **kwargs)


@pytest.mark.parametrize("kwargs, message", [
    ({"scheme": "softmax"}, "unknown attention scheme"),
    ({"scheme": "hnas", "hybrid_init": 1.0}, r"hybrid_init must lie in \(0, 1\)"),
    ({"scheme": "dnas", "add_bias_kv": True}, "add_bias_kv and add_zero_attn"),
    ({"scheme": "hnas", "hybrid_per": "block"}, "hybrid_per must be one of"),
])
def test_constructor_refusals(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiheadAttention(E, H, **kwargs)


def test_torch_encoder_layer_fast_path_does_not_bypass_dnas():
    """nn.TransformerEncoderLayer in eval mode without grad runs torch's fused
    softmax from the attention's weights unless something stops it."""
    layer = torch.nn.TransformerEncoderLayer(E, 4, 24, dropout=0.0, batch_first=True).eval()
    ours = MultiheadAttention(E, 4, batch_first=True, dropout=0.0, scheme="dnas")
    ours.load_state_dict(layer.self_attn.state_dict())
    x = torch.randn(2, 6, E)
    with torch.no_grad():
        plain = layer(x)
        layer.self_attn = ours
        swapped = layer(x)
        # What the layer must compute: its slow path around our module.
        h = layer.norm1(x + ours(x, x, x, need_weights=False)[0])
        expected = layer.norm2(h + layer.linear2(layer.activation(layer.linear1(h))))
    torch.testing.assert_close(swapped, expected, atol=1e-5, rtol=0)
    assert not torch.allclose(swapped, plain, atol=1e-3)


def _python(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()


def test_importing_fairseq_dnas_nn_neither_needs_nor_imports_fairseq():
    without = _python(
        "import sys; sys.modules['fairseq'] = None\n"  # any 'import fairseq' now fails
        "import torch\n"
        "from fairseq_dnas.nn import MultiheadAttention\n"
        "x = torch.randn(3, 2, 8)\n"
        "print(tuple(MultiheadAttention(8, 2, scheme='hnas')(x, x, x)[0].shape))\n"
    )
    assert without == ["(3,", "2,", "8)"]
    # fairseq installed (as here): not imported by fairseq_dnas.nn, and not
    # changed by it when imported later (tests/test_fairseq_patches.py checks
    # every patched symbol); ``import fairseq_dnas.plugin`` registers the
    # plugin and installs its patches.
    later = _python(
        "import sys\n"
        "import fairseq_dnas.nn\n"
        "print('fairseq' in sys.modules)\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "from fairseq import checkpoint_utils\n"
        "print('transformer_hnas' in ARCH_MODEL_REGISTRY, type(checkpoint_utils.torch).__name__)\n"
        "import fairseq_dnas.plugin\n"
        "print('transformer_hnas' in ARCH_MODEL_REGISTRY, type(checkpoint_utils.torch).__name__)\n"
    )
    assert later == ["False", "False", "module", "True", "_TorchWithLoad"]
