"""fairseq_dnas.hf: DNAS/HNAS in Hugging Face transformers encoders.

Tier 1: the attention function against the float64 reference (forward, and
gradients against autograd through the materialized path in float64), with
padding. Tier 2: whole tiny models of every supported family, built from
configs (no downloads): 'unas' through the adapter equals transformers'
sdpa; DNAS/HNAS change the output (the scheme runs) and are padding
invariant; HNAS weights survive save_pretrained/from_pretrained. Bad use
gets a one-line error.
"""

import json
import os

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModel, BertConfig, BertForSequenceClassification, BertModel

from fairseq_dnas import hf
from fairseq_dnas.attention import kernels
from fairseq_dnas.hf.attention import attention_forward
from fairseq_dnas.reference import reference_probs

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=99,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
SEQ2SEQ = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=2,
               encoder_ffn_dim=37, decoder_ffn_dim=37, dropout=0.0, attention_dropout=0.0)
FAMILIES = {
    "bert": {},
    "roberta": {},
    "xlm-roberta": {},
    "albert": dict(embedding_size=16),
    "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=37, dropout=0.0, attention_dropout=0.0),
    "electra": dict(embedding_size=16),
    "bart": SEQ2SEQ,
    "mbart": SEQ2SEQ,
}


def sharpen(model):
    """Weights of std 0.3 instead of 0.02: attention far from uniform, where
    DNAS and softmax differ (at initialization they nearly agree)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def build(family, attn="sdpa"):
    torch.manual_seed(0)
    config = AutoConfig.for_model(family, **SMALL, **FAMILIES[family])
    return sharpen(AutoModel.from_config(config, attn_implementation=attn).eval())


def batch(family):
    """Two sequences, the second right-padded (lengths 9 and 6)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 90, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    return ids, mask


def encode(model, family, ids, mask):
    """The encoder's last hidden states (BART/mBART: the encoder's)."""
    if family in ("bart", "mbart"):
        return model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    return model(input_ids=ids, attention_mask=mask).last_hidden_state


def _qkv(dtype=torch.float64, heads=3, t=6, d=4):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(2, heads, t, d, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_() for _ in range(3)]


class _Module(torch.nn.Module):  # what transformers passes as `module`
    is_causal = False

    def __init__(self, heads):
        super().__init__()
        self.hybrid_logit = torch.nn.Parameter(torch.linspace(-1.0, 1.5, heads))


def _bool_mask(pad):  # sdpa_mask's form: (B, 1, T, T), True where a query may see a key
    t = pad.shape[1]
    return (~pad)[:, None, None, :].expand(-1, 1, t, t)


# Tier 1: the attention function ---------------------------------------------

@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("form,path", [("bool", "auto"), ("additive", "auto"), ("none", "auto"),
                                       ("bool", "fused"), ("bool", "triton")])
def test_function_matches_float64_reference(scheme, form, path, monkeypatch):
    """Every execution path of kernels.attend behind the adapter (triton: under
    Triton's interpreter on CPU, as tests/test_triton.py runs it)."""
    if path != "auto":
        monkeypatch.setenv(kernels.PATH_ENV, path)
    q, k, v = _qkv(torch.float32)
    module = _Module(3)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    if form != "none":
        pad[1, 4:] = True
    mask = _bool_mask(pad)
    if form == "additive":
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    scaling = 0.37
    out, _ = attention_forward(scheme, module, q, k, v, None if form == "none" else mask, scaling=scaling)
    assert out.shape == (2, 6, 3, 4)  # transformers' (B, T, H, D)
    u = torch.sigmoid(module.hybrid_logit.detach().double())
    p = reference_probs((q.double() * scaling) @ k.double().transpose(-1, -2), scheme, pad, pad, u)
    ref = (p @ v.double()).transpose(1, 2)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=0)
    # Gradients against autograd through the materialized path in float64.
    g = torch.randn(out.shape)
    n = 3 if scheme == "dnas" else 4
    grads = torch.autograd.grad(out, [q, k, v, module.hybrid_logit][:n], g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    logit64 = module.hybrid_logit.detach().double().requires_grad_()
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    ref_out, _ = kernels.attend(q64 * scaling, k64, v64, scheme=scheme, padding_mask=pad if pad.any() else None,
                                hybrid_weight=torch.sigmoid(logit64), path="materialized")
    ref_grads = torch.autograd.grad(ref_out.transpose(1, 2), [q64, k64, v64, logit64][:n], g.double())
    for name, a, b in zip("qkvu", grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4, msg=name)


def test_function_refuses_masks_that_are_not_padding():
    q, k, v = _qkv(torch.float32)
    local = torch.ones(6, 6).triu(-1).tril(1).bool()[None, None].expand(2, 1, 6, 6)  # a sliding window
    with pytest.raises(ValueError, match="not a key padding mask"):
        attention_forward("dnas", _Module(3), q, k, v, local)
    bias = torch.randn(2, 1, 6, 6)
    with pytest.raises(ValueError, match="bias"):
        attention_forward("dnas", _Module(3), q, k, v, bias)


def test_causal_and_cross_attention_stay_softmax():
    q, k, v = _qkv(torch.float32)
    module = _Module(3)
    module.is_causal = True
    out, _ = attention_forward("dnas", module, q, k, v, None, scaling=0.5)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5).transpose(1, 2)
    torch.testing.assert_close(out, sdpa)


# Tier 2: whole models ---------------------------------------------------------

def test_bert_model_matches_float64_reference():
    """A BERT stack with DNAS/HNAS against the same stack in float64 whose
    attention is the reference (forward) and the materialized path (gradients)."""
    def ref64(module, query, key, value, attention_mask, scaling=None, **kwargs):
        pad = hf.key_padding_mask(attention_mask, query.shape[0], query.shape[2])
        u = torch.sigmoid(module.hybrid_logit.detach().double()) if hasattr(module, "hybrid_logit") else None
        p = reference_probs((query * scaling) @ key.transpose(-1, -2), module.dnas_scheme_under_test, pad, pad, u)
        return (p.to(value.dtype) @ value).transpose(1, 2), None

    transformers.AttentionInterface.register("ref64_test", ref64)
    transformers.masking_utils.AttentionMaskInterface.register("ref64_test", transformers.masking_utils.sdpa_mask)
    ids, mask = batch("bert")
    for scheme in ("dnas", "hnas"):
        settings = {"hybrid_init": 0.3} if scheme == "hnas" else {}
        model = hf.enable(sharpen(BertModel(BertConfig(**SMALL)).eval()), scheme=scheme, **settings)
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        ref = hf.enable(BertModel(BertConfig(**SMALL)).eval(), scheme=scheme).double()
        ref.load_state_dict(model.state_dict())
        for _, module, _ in hf.attention_modules(ref):
            module.dnas_scheme_under_test = scheme
        ref.set_attn_implementation("ref64_test")
        with torch.no_grad():
            expected = ref(input_ids=ids, attention_mask=mask).last_hidden_state
        real = mask.bool()
        torch.testing.assert_close(out.double()[real], expected[real], atol=1e-5, rtol=1e-5)
        # gradients: float32 (auto path) against float64 materialized
        out[real].pow(2).sum().backward()
        ref.set_attn_implementation(scheme)
        os.environ[kernels.PATH_ENV] = "materialized"
        try:
            ref(input_ids=ids, attention_mask=mask).last_hidden_state[real].pow(2).sum().backward()
        finally:
            del os.environ[kernels.PATH_ENV]
        params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(p.grad.double(), params[name].grad, atol=1e-4, rtol=1e-3, msg=name)
        assert scheme != "hnas" or model.encoder.layer[0].attention.self.hybrid_logit.grad.abs().sum() > 0


@pytest.mark.parametrize("family", list(FAMILIES))
def test_unas_equals_sdpa_and_dnas_is_padding_invariant(family):
    ids, mask = batch(family)
    real = mask.bool()
    model = build(family)
    sdpa = encode(model, family, ids, mask)
    hf.enable(model, scheme="unas")
    torch.testing.assert_close(encode(model, family, ids, mask)[real], sdpa[real], atol=1e-5, rtol=1e-5)
    for scheme in ("dnas", "hnas"):
        hf.enable(model, scheme=scheme)
        padded = encode(model, family, ids, mask)
        alone = encode(model, family, ids[1:, :6], mask[1:, :6])
        torch.testing.assert_close(padded[1, :6], alone[0], atol=2e-5, rtol=1e-5)
        # the scheme runs: not softmax's output
        assert (padded[real] - sdpa[real]).abs().max() > 1e-3, scheme
    logits = [n for n, _ in model.named_parameters() if n.endswith("hybrid_logit")]
    assert len(logits) == (1 if family == "albert" else 2), logits  # ALBERT shares one module


@pytest.mark.parametrize("scheme", ["dnas", "discrete"])
@pytest.mark.parametrize("family", ["bart", "mbart"])
def test_seq2seq_decoder_stays_softmax(family, scheme):
    model = build(family)
    roles = {name: role for name, _, role in hf.attention_modules(hf.enable(model, scheme=scheme))}
    assert roles["encoder.layers.0.self_attn"] == "self"
    assert roles["decoder.layers.0.self_attn"] == "causal"
    assert roles["decoder.layers.0.encoder_attn"] == "cross"
    ids, mask = batch(family)
    dec = ids[:, :5]
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=ids, attention_mask=mask)
        out = model(encoder_outputs=enc, attention_mask=mask, decoder_input_ids=dec).last_hidden_state
        model.set_attn_implementation("sdpa")
        ref = model(encoder_outputs=enc, attention_mask=mask, decoder_input_ids=dec).last_hidden_state
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("model_class", [BertForSequenceClassification, BertModel])
def test_hnas_weights_survive_save_and_load(tmp_path, model_class):
    model = hf.enable(BertForSequenceClassification(BertConfig(**SMALL)).eval(), scheme="hnas", per="head")
    with torch.no_grad():
        model.bert.encoder.layer[1].attention.self.hybrid_logit.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(model_class, str(tmp_path)).eval()
    assert loaded.config._attn_implementation == "hnas"
    assert hf.callback.layer_weights(loaded) == hf.callback.layer_weights(model)
    ids, mask = batch("bert")
    base = loaded if model_class is BertModel else loaded.bert
    torch.testing.assert_close(base(input_ids=ids, attention_mask=mask).last_hidden_state,
                               model.bert(input_ids=ids, attention_mask=mask).last_hidden_state)
    # plotted with the plugin's tool
    from fairseq_dnas.analysis.plots import plot_hybrid_weights
    plot_hybrid_weights([hf.hybrid_weights(loaded, "bert")], ["bert"], str(tmp_path / "u.png"))
    assert (tmp_path / "u.png").stat().st_size > 0


def test_trainer_logs_u(tmp_path):
    model = hf.enable(BertForSequenceClassification(BertConfig(**SMALL, num_labels=2)), scheme="hnas", per="layer")
    ids, _ = batch("bert")
    data = [{"input_ids": ids[i % 2], "labels": i % 2} for i in range(8)]
    callback = hf.HybridWeightCallback(str(tmp_path / "u.jsonl"))
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=3, logging_steps=1, report_to=[],
                                          save_strategy="no", use_cpu=True, per_device_train_batch_size=4,
                                          learning_rate=0.1, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert len(callback.history) >= 3 and len(callback.history[-1]["u"]) == 2
    assert callback.history[-1]["u"] != [[0.5], [0.5]]  # u trains
    assert any("u/layer0" in log for log in trainer.state.log_history)
    assert len((tmp_path / "u.jsonl").read_text().splitlines()) == len(callback.history)


# Bad use: one-line errors that say what to do ------------------------------

def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_bad_use():
    bert = BertModel(BertConfig(**SMALL))
    with pytest.raises(ValueError, match="unknown scheme 'dans'") as e:
        hf.enable(bert, scheme="dans")
    _one_line(e)
    deberta = AutoModel.from_config(AutoConfig.for_model("deberta-v2", **SMALL))
    with pytest.raises(ValueError, match="does not route its attention through") as e:
        hf.enable(deberta, scheme="dnas")
    _one_line(e)
    gpt2 = AutoModel.from_config(AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=2, vocab_size=99))
    with pytest.raises(ValueError, match="no bidirectional self-attention") as e:
        hf.enable(gpt2, scheme="hnas")
    _one_line(e)
    modern = AutoModel.from_config(AutoConfig.for_model(
        "modernbert", **SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2))
    with pytest.raises(ValueError, match="sliding-window") as e:
        hf.enable(modern, scheme="dnas")
    _one_line(e)
    plain = BertModel(BertConfig(**SMALL))
    plain.set_attn_implementation("hnas")  # the name alone: no HNAS weights
    ids, mask = batch("bert")
    with pytest.raises(ValueError, match="enable") as e:
        plain(input_ids=ids, attention_mask=mask)
    _one_line(e)


def test_loading_without_hnas_weights_says_what_to_do(tmp_path):
    model = hf.enable(BertModel(BertConfig(**SMALL)), scheme="dnas")
    model.save_pretrained(tmp_path / "dnas")
    config = json.loads((tmp_path / "dnas" / "config.json").read_text())
    config["dnas"]["scheme"] = "hnas"  # claims HNAS, has no hybrid_logit
    (tmp_path / "dnas" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="lacks the HNAS weights") as e:
        hf.from_pretrained(BertModel, str(tmp_path / "dnas"))
    _one_line(e)
    BertModel(BertConfig(**SMALL)).save_pretrained(tmp_path / "plain")
    with pytest.raises(ValueError, match="not saved after fairseq_dnas.hf.enable") as e:
        hf.from_pretrained(BertModel, str(tmp_path / "plain"))
    _one_line(e)
