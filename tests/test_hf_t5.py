"""fairseq_dnas.hf on the T5 family: DNAS/HNAS/discrete over S + B.

T5 adds a relative position bias B to its unscaled scores S = q k^T
(transformers passes ``scaling`` = 1 and ``position_bias``); the encoder's
self-attention runs the scheme over S + B, padding by the mask
(docs/math.md#a-biased-score). Tier 1: the attention function against a
float64 reference, forward and gradients (q, k, v, u and B), with padding,
on each CPU path. Tier 2: tiny T5/mT5/UMT5 models built from configs: the
encoder against a float64 reference implementation of its own attention,
the decoder unchanged, ``generate()``. Bad use gets a one-line error.
"""

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForSeq2SeqLM
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fairseq_dnas import hf
from fairseq_dnas.attention import kernels
from fairseq_dnas.attention.gumbel_noise import gumbel_noise
from fairseq_dnas.hf.attention import attention_forward
from fairseq_dnas.reference import reference_probs

T5_SMALL = dict(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=99,
                dropout_rate=0.0, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0)


class _Module(torch.nn.Module):  # what transformers passes as `module` (an encoder self-attention)
    is_causal = False

    def __init__(self, heads):
        super().__init__()
        self.hybrid_logit = torch.nn.Parameter(torch.linspace(-1.0, 1.5, heads))


def _inputs(heads=3, t=6, d=4):
    """q, k, v (B, H, T, D), a (1, H, T, T) bias, padding (the second sequence
    right-padded) and transformers' boolean 4D mask."""
    g = torch.Generator().manual_seed(3)
    q, k, v = ((torch.randn(2, heads, t, d, generator=g) * 1.5).requires_grad_() for _ in range(3))
    bias = (torch.randn(1, heads, t, t, generator=g) * 2).requires_grad_()
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, 4:] = True
    mask = (~pad)[:, None, None, :].expand(-1, 1, t, t)
    return q, k, v, bias, pad, mask


# Tier 1: the attention function ---------------------------------------------

@pytest.mark.parametrize("scheme,path", [("dnas", "auto"), ("hnas", "auto"), ("dnas", "materialized"),
                                         ("dnas", "flash"), ("hnas", "blockwise"),
                                         pytest.param("hnas", "materialized", marks=pytest.mark.full),
                                         pytest.param("hnas", "flash", marks=pytest.mark.full),
                                         pytest.param("dnas", "blockwise", marks=pytest.mark.full)])
def test_biased_scores_match_float64_reference(scheme, path, monkeypatch):
    """scaling = 1 as T5 passes it: the scheme over q k^T + B, no 1/sqrt(d)."""
    if path != "auto":
        monkeypatch.setenv(kernels.PATH_ENV, path)
    q, k, v, bias, pad, mask = _inputs()
    module = _Module(3)
    out, _ = attention_forward(scheme, module, q, k, v, mask, scaling=1.0, position_bias=bias)
    u = torch.sigmoid(module.hybrid_logit.detach().double())
    s = q.double() @ k.double().transpose(-1, -2) + bias.double()  # S + B, unscaled
    ref = (reference_probs(s, scheme, pad, pad, u) @ v.double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)
    unbiased, _ = attention_forward(scheme, module, q, k, v, mask, scaling=1.0)
    assert (out - unbiased).abs().max() > 0.1  # the bias is used
    # gradients (q, k, v, B, u) against autograd through the materialized path in float64
    g = torch.randn(out.shape)
    wrt = [q, k, v, bias] + ([module.hybrid_logit] if scheme == "hnas" else [])
    grads = torch.autograd.grad(out, wrt, g)
    w64 = [t.detach().double().requires_grad_() for t in wrt]
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    ref_out, _ = kernels.attend(w64[0], w64[1], w64[2], scheme=scheme, padding_mask=pad, score_bias=w64[3],
                                hybrid_weight=torch.sigmoid(w64[4]) if scheme == "hnas" else None,
                                path="materialized")
    ref_grads = torch.autograd.grad(ref_out.transpose(1, 2), w64, g.double())
    for name, a, b in zip(["q", "k", "v", "bias", "u"], grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4, msg=name)
    assert grads[3][..., 4:].abs().sum() > 0 and grads[3].abs().sum() > 0


@pytest.mark.parametrize("scheme,path", [("hnas", "flash"), ("dnas", "blockwise")])
def test_fused_paths_take_a_bias_per_sentence_and_one_for_all_heads(scheme, path, monkeypatch):
    """The fused CPU paths with a bias (B, H, T_q, T_k) and one (1, 1, T_q,
    T_k) shared by the batch and the heads, cross-attention (T_q 5 != T_k 7)
    with key and query padding, in float64: output and gradients (q, k, v,
    B, u) equal the materialized path's; dB summed over what B is shared by.
    Blockwise in blocks of 2 queries (the bias's rows sliced per block); the
    fused function runs (no fallback)."""
    from fairseq_dnas.attention import primitives

    monkeypatch.setattr(primitives, "BLOCKWISE", primitives.Blockwise(block=2))
    calls = []
    fused = getattr(kernels, f"fused_{scheme}")
    monkeypatch.setattr(kernels, f"fused_{scheme}", lambda *a: calls.append(a[-2].name) or fused(*a))
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    u = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64, requires_grad=True)
    kpad = torch.zeros(2, 7, dtype=torch.bool)
    kpad[1, 4:] = True
    qpad = torch.zeros(2, 5, dtype=torch.bool)
    qpad[1, 3:] = True
    do = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) * (~qpad)[:, None, :, None]
    for shape in ((2, 3, 5, 7), (1, 1, 5, 7)):
        bias = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).requires_grad_()
        wrt = (q, k, v, bias) + ((u,) if scheme == "hnas" else ())
        results = []
        for run in (path, "materialized"):
            out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=kpad, query_padding_mask=qpad,
                                    hybrid_weight=u if scheme == "hnas" else None, path=run, score_bias=bias)
            results.append((out, *torch.autograd.grad(out, wrt, do)))
        for name, a, b in zip(("out", "q", "k", "v", "bias", "u"), *results):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0, msg=name)
        assert results[0][4].abs().amax() > 1e-3
    assert calls == [primitives.FLASH_CPU.name if path == "flash" else "blockwise"] * 2


def test_inside_a_compiled_graph_a_bias_takes_the_score_matrix(monkeypatch):
    """While traced, 'auto' with a bias takes 'dense' ('materialized' for
    Sinkhorn rounds); a forced fused path is refused in one line."""
    monkeypatch.setattr(kernels, "compiling", lambda: True)
    assert kernels._biased_path("auto", 1) == "dense"
    assert kernels._biased_path("auto", 3) == "materialized"
    for path in ("fused", "flash", "blockwise"):
        with pytest.raises(ValueError, match=f"attention path '{path}' takes no score bias.*inside a compiled graph"):
            kernels._biased_path(path, 1)
    monkeypatch.setattr(kernels, "compiling", lambda: False)
    assert kernels._biased_path("flash", 1) == "flash"  # eagerly the fused paths take it


def test_discrete_takes_the_bias():
    """Discrete: the argmax of S + B at inference; in training the relaxed
    sample softmax(S + B + G) (tau = 1) with the same noise G."""
    q, k, v, bias, pad, mask = _inputs()
    module = _Module(3)
    module.gumbel_temperature, module.gumbel_hard = 1.0, False
    s = q.double() @ k.double().transpose(-1, -2) + bias.double()
    s = s.masked_fill(pad[:, None, None, :], float("-inf"))
    module.eval()
    out, _ = attention_forward("discrete", module, q, k, v, mask, scaling=1.0, position_bias=bias)
    pick = s.argmax(dim=-1)  # (B, H, T)
    ref = torch.gather(v.double(), 2, pick[..., None].expand(-1, -1, -1, v.shape[-1])).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=0)
    module.train()
    torch.manual_seed(7)
    out, _ = attention_forward("discrete", module, q, k, v, mask, scaling=1.0, position_bias=bias)
    torch.manual_seed(7)
    noise = gumbel_noise(s.shape).double()
    ref = (torch.softmax(s + noise, dim=-1) @ v.double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=0)
    (db,) = torch.autograd.grad(out.sum(), [bias])
    assert db.abs().sum() > 0  # B is learned through the sample


def test_biases_that_cannot_be_dnas_are_refused(monkeypatch):
    q, k, v, bias, pad, mask = _inputs()
    with pytest.raises(ValueError, match="position bias of shape"):
        attention_forward("dnas", _Module(3), q, k, v, mask, scaling=1.0, position_bias=bias[:, :, :5])
    local = torch.ones(6, 6).triu(-1).tril(1).bool()[None, None].expand(2, 1, 6, 6)  # a sliding window
    with pytest.raises(ValueError, match="not a key padding mask"):
        attention_forward("dnas", _Module(3), q, k, v, local, scaling=1.0, position_bias=bias)
    # the Triton kernels take a bias only in their lean set (short inputs: the short set)
    for path, message in (("triton", "only on the lean kernels"),):
        monkeypatch.setenv(kernels.PATH_ENV, path)
        with pytest.raises(ValueError, match=message) as err:
            attention_forward("dnas", _Module(3), q, k, v, mask, scaling=1.0, position_bias=bias)
        assert "\n" not in str(err.value)


# Tier 2: whole models ---------------------------------------------------------

REF = "t5_float64_reference"


def _reference_attention(module, query, key, value, attention_mask, scaling=None, position_bias=None, **kwargs):
    """The DNAS encoder attention recomputed in float64 with ``reference_probs``
    (decoder attention: transformers' sdpa, as the adapter's)."""
    if getattr(module, "dnas_role", "self") != "self":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      position_bias=position_bias, **kwargs)
    pad = None if attention_mask is None else ~attention_mask[:, 0, 0, :]
    s = query.double() @ key.double().transpose(-1, -2) * scaling + position_bias.double()
    out = reference_probs(s, "dnas", pad, pad) @ value.double()
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _model(family, attn="sdpa"):
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **T5_SMALL)
    model = AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attn).eval()
    with torch.no_grad():  # sharper attention than at initialization, where DNAS and softmax nearly agree
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 90, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return ids, mask


@pytest.mark.parametrize("family", ["t5", pytest.param("mt5", marks=pytest.mark.full),
                                    pytest.param("umt5", marks=pytest.mark.full)])
def test_encoder_matches_float64_reference_and_decoder_is_unchanged(family):
    ids, mask = _batch()
    model = hf.enable(_model(family), scheme="dnas")
    roles = {name: m.dnas_role for name, m in model.named_modules() if hasattr(m, "dnas_role")}
    assert roles["encoder.block.0.layer.0.SelfAttention"] == "self"
    assert roles["decoder.block.0.layer.0.SelfAttention"] == "causal"
    assert roles["decoder.block.0.layer.1.EncDecAttention"] == "cross"
    enc = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    # the same weights in float64 through the reference implementation
    AttentionInterface.register(REF, _reference_attention)
    AttentionMaskInterface.register(REF, sdpa_mask)
    ref_model = _model(family).double()
    ref_model.load_state_dict(model.state_dict())
    for name, m in ref_model.named_modules():
        if name in roles:
            m.dnas_role = roles[name]
    ref_model.set_attn_implementation(REF)
    ref = ref_model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(enc[0].double(), ref[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(enc[1, :6].double(), ref[1, :6], atol=1e-4, rtol=1e-4)
    sdpa = _model(family)
    plain = sdpa.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (plain[0] - enc[0]).abs().max() > 1e-2  # the scheme runs in the encoder
    # the decoder, given the same encoder states, is sdpa's (self- and cross-attention unchanged)
    dec_ids = ids[:, :5]
    args = dict(decoder_input_ids=dec_ids, encoder_outputs=(enc,), attention_mask=mask)
    with torch.no_grad():
        torch.testing.assert_close(model(**args).logits, sdpa(**args).logits, atol=0, rtol=0)
    # generate() runs, with its cache, on the DNAS encoder
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] > 1


@pytest.mark.parametrize("scheme", ["hnas", "discrete"])
def test_other_schemes_run_in_t5(scheme, tmp_path):
    ids, mask = _batch()
    model = hf.enable(_model("t5"), scheme=scheme)
    model.train()
    out = model(input_ids=ids, attention_mask=mask, labels=ids[:, :4].contiguous())
    out.loss.backward()
    bias_grad = model.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight.grad
    assert bias_grad is not None and bias_grad.abs().sum() > 0  # B learns through the scheme
    if scheme == "hnas":
        u = model.encoder.block[0].layer[0].SelfAttention.hybrid_logit
        assert u.grad is not None and u.grad.abs().sum() > 0
        model.save_pretrained(tmp_path)
        back = hf.from_pretrained(AutoModelForSeq2SeqLM, str(tmp_path))
        torch.testing.assert_close(back.encoder.block[1].layer[0].SelfAttention.hybrid_logit,
                                   model.encoder.block[1].layer[0].SelfAttention.hybrid_logit)
    model.eval()
    assert model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3).shape[0] == 2


def test_longt5_is_refused_in_one_line():
    """LongT5's encoder runs its local (or transient-global) attention in its
    own code, not through transformers' AttentionInterface (its local bias is
    no padding mask DNAS could normalize over either): only its decoder's
    causal and cross-attention reach the interface, so nothing is switched."""
    config = AutoConfig.for_model("longt5", **T5_SMALL, encoder_attention_type="local", local_radius=2)
    model = AutoModelForSeq2SeqLM.from_config(config)
    with pytest.raises(ValueError) as err:
        hf.enable(model, scheme="dnas")
    assert "\n" not in str(err.value) and "no bidirectional self-attention" in str(err.value)
    assert model.config._attn_implementation != "dnas"
