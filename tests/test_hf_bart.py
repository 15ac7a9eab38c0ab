"""fairseq_dnas.hf on sequence-to-sequence summarizers (BART, mBART, PEGASUS).

A tiny BartForConditionalGeneration built from a config here (no
downloads), saved, loaded and switched with one ``hf.enable`` call: every
saved weight loads exactly (the HNAS logits are the only new parameters),
only the encoder self-attention changes role, and ``generate()`` (greedy,
two sentences, one padded) gives the tokens of a float64 greedy search
written out here, with full forwards and no cache. mBART and PEGASUS switch
and generate too.
"""

import pytest
import torch
from test_hf_faithfulness import _bart_layer, _norm
from transformers import AutoConfig, AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration

from fairseq_dnas import hf
from fairseq_dnas.attention import kernels

TINY = dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def saved_bart(path):
    """A plain (sdpa) tiny BART with weights of std 0.3 (attention far from
    uniform), saved as a pretrained checkpoint is."""
    torch.manual_seed(0)
    model = BartForConditionalGeneration(BartConfig(**TINY, forced_bos_token_id=None, forced_eos_token_id=None))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return model


def test_enable_loads_the_pretrained_weights_exactly(tmp_path):
    plain = saved_bart(tmp_path)
    model = hf.enable(BartForConditionalGeneration.from_pretrained(tmp_path), scheme="hnas", hybrid_init=0.01)
    before, after = plain.state_dict(), model.state_dict()
    new = set(after) - set(before)
    assert new == {f"model.encoder.layers.{i}.self_attn.hybrid_logit" for i in range(2)}
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    roles = {name: role for name, _, role in hf.attention_modules(model)}
    assert roles == {"model.encoder.layers.0.self_attn": "self", "model.encoder.layers.1.self_attn": "self",
                     "model.decoder.layers.0.self_attn": "causal", "model.decoder.layers.0.encoder_attn": "cross",
                     "model.decoder.layers.1.self_attn": "causal", "model.decoder.layers.1.encoder_attn": "cross"}
    assert all(abs(u - 0.01) < 1e-8 for layer in hf.callback.layer_weights(model) for u in layer)


def _greedy_reference(model, ids, steps):
    """Greedy decoding of one unpadded sentence in float64: BART's encoder
    with the model's scheme (HNAS, u from its logits), a softmax decoder,
    the tied output layer plus final_logits_bias; every step a full forward."""
    bart, cfg = model.model, model.config
    enc, dec = bart.encoder, bart.decoder

    def embed(stack, tokens):
        scale = getattr(stack.embed_tokens, "embed_scale", 1.0)
        x = stack.embed_tokens.weight[tokens] * scale + stack.embed_positions.weight[2 + torch.arange(len(tokens))]
        return _norm(x.detach().double(), stack.layernorm_embedding)

    x = embed(enc, ids)
    for layer in enc.layers:
        x, _ = _bart_layer(layer, x, None, layer.self_attn.num_heads, "hnas", detach=False)
    out = [cfg.decoder_start_token_id]
    for _ in range(steps):
        y = embed(dec, torch.tensor(out))
        for layer in dec.layers:
            y, _ = _bart_layer(layer, y, x, layer.self_attn.num_heads, "unas", detach=False, causal=True)
        logits = y[-1] @ bart.shared.weight.detach().double().T + model.final_logits_bias[0].double()
        out.append(int(logits.argmax()))
        if out[-1] == cfg.eos_token_id:
            break
    return out


def test_generate_is_a_float64_greedy_search_written_out(tmp_path):
    saved_bart(tmp_path)
    model = hf.enable(BartForConditionalGeneration.from_pretrained(tmp_path), scheme="hnas", hybrid_init=0.3)
    torch.manual_seed(1)
    with torch.no_grad():  # distinct u per layer and head
        for name, p in model.named_parameters():
            if name.endswith("hybrid_logit"):
                p.copy_(torch.randn_like(p))
    model = model.double().eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 90, (2, 9), generator=g)
    ids[:, -1] = model.config.eos_token_id
    ids[1, 6:] = model.config.pad_token_id  # the second sentence: 5 tokens and </s>, right padded
    ids[1, 5] = model.config.eos_token_id
    mask = ids.ne(model.config.pad_token_id).long()
    calls = []
    attend = kernels.attend

    def counting(*args, **kwargs):
        calls.append(kwargs.get("scheme"))
        return attend(*args, **kwargs)

    kernels.attend = counting
    try:
        out = model.generate(input_ids=ids, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=8,
                             min_length=0, no_repeat_ngram_size=0, forced_bos_token_id=None,
                             forced_eos_token_id=None)
    finally:
        kernels.attend = attend
    # the encoder ran once, HNAS in each of its 2 layers; the decoder never reached the plugin
    assert calls == ["hnas", "hnas"]
    for b in range(2):
        real = ids[b][mask[b].bool()]
        ref = _greedy_reference(model, real, steps=8)
        got = out[b].tolist()
        got = got[:got.index(model.config.eos_token_id) + 1] if model.config.eos_token_id in got[1:] else got
        assert got[:len(ref)] == ref and len(got) == len(ref), (b, got, ref)
    assert len(ref) > 3  # a real search, not an immediate </s>

    # the scheme matters for this model: softmax encoder states differ
    with torch.no_grad():
        hnas = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
        model.set_attn_implementation("sdpa")
        sdpa = model.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (hnas[mask.bool()] - sdpa[mask.bool()]).abs().max() > 1e-2


@pytest.mark.parametrize("family", ["mbart", "pegasus"])
def test_other_summarizers_switch_and_generate(family):
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model(family, **TINY)).eval()
    hf.enable(model, scheme="dnas")
    roles = [role for _, _, role in hf.attention_modules(model)]
    assert roles.count("self") == 2 and roles.count("causal") == 2 and roles.count("cross") == 2
    out = model.generate(input_ids=torch.randint(5, 90, (2, 7)), max_new_tokens=4, num_beams=2)
    assert out.shape[0] == 2


def test_hnas_bart_saved_after_enable_loads_back(tmp_path):
    saved_bart(tmp_path / "plain")
    model = hf.enable(BartForConditionalGeneration.from_pretrained(tmp_path / "plain"), scheme="hnas")
    with torch.no_grad():
        model.model.encoder.layers[1].self_attn.hybrid_logit.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
    model.save_pretrained(tmp_path / "hnas")
    loaded = hf.from_pretrained(BartForConditionalGeneration, str(tmp_path / "hnas")).eval()
    assert hf.callback.layer_weights(loaded) == hf.callback.layer_weights(model)
    ids = torch.randint(5, 90, (1, 8))
    torch.testing.assert_close(loaded.generate(input_ids=ids, max_new_tokens=5, num_beams=1),
                               model.eval().generate(input_ids=ids, max_new_tokens=5, num_beams=1))


def test_bad_hybrid_init_is_one_line(tmp_path):
    saved_bart(tmp_path)
    model = BartForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(ValueError) as err:
        hf.enable(model, scheme="hnas", hybrid_init=1.0)
    assert "hybrid_init must lie in (0, 1)" in str(err.value) and "\n" not in str(err.value)
