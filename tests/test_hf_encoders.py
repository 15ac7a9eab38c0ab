"""fairseq_dnas.hf on the encoders that do not read text: Whisper's audio
encoder, the vision encoders ViT, DINOv2, SigLIP and CLIP (vision towers),
and the speech encoders wav2vec 2.0 and HuBERT, each built from a tiny
config (no downloads).

Each family against the same model in float64 whose bidirectional
self-attention is the scheme's reference (``reference_probs``; discrete: the
argmax by hand), with padding where the family takes a padding mask
(wav2vec 2.0, HuBERT, SigLIP's text tower), forward and gradients (discrete
also in training, its Gumbel noise fixed); its output is not softmax's and
each self-attention call reaches the scheme's code (the scheme runs); a
padded example gives what it gives alone; the decoders (Whisper's, CLIP's
causal text tower) give what ``sdpa`` gives; HNAS u survives
``save_pretrained`` / ``hf.from_pretrained``; Whisper's ``generate()``
decodes from the DNAS encoder.
"""

import copy

import pytest
import torch
import transformers
from test_hf_discrete import FixedNoise
from test_hf_discrete import reference as discrete_reference
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from fairseq_dnas import hf
from fairseq_dnas.attention import discrete as DA
from fairseq_dnas.attention import kernels
from fairseq_dnas.hf.attention import ROLE_ATTR
from fairseq_dnas.reference import reference_probs

TOWER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
IMAGE = dict(TOWER, image_size=16, patch_size=4, num_channels=3)
TEXT = dict(TOWER, vocab_size=99, max_position_embeddings=16)
AUDIO = dict(TOWER, vocab_size=12, conv_dim=(8, 8), conv_kernel=(8, 4), conv_stride=(4, 2), conv_bias=True,
             num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
             feat_extract_norm="layer", do_stable_layer_norm=True,  # the kind that takes a padding mask
             hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0)
WHISPER = dict(vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=8,
               max_source_positions=12, max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
               decoder_start_token_id=1, dropout=0.0, attention_dropout=0.0)
CONFIGS = {
    "whisper": lambda: transformers.WhisperConfig(**WHISPER),
    "vit": lambda: transformers.ViTConfig(**IMAGE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "dinov2": lambda: transformers.Dinov2Config(**IMAGE, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "siglip": lambda: transformers.SiglipConfig(text_config=TEXT, vision_config=IMAGE),
    "clip": lambda: transformers.CLIPConfig(text_config=dict(TEXT, eos_token_id=2), vision_config=IMAGE,
                                            projection_dim=16),
    "wav2vec2": lambda: transformers.Wav2Vec2Config(**AUDIO),
    "hubert": lambda: transformers.HubertConfig(**AUDIO),
}
CLASSES = {"whisper": transformers.WhisperForConditionalGeneration, "vit": transformers.ViTModel,
           "dinov2": transformers.Dinov2Model, "siglip": transformers.SiglipModel, "clip": transformers.CLIPModel,
           "wav2vec2": transformers.Wav2Vec2Model, "hubert": transformers.HubertModel}


def build(family):
    """The family's tiny model in eval mode, weights of std 0.3 (attention far
    from uniform, where DNAS and softmax differ)."""
    torch.manual_seed(0)
    model = CLASSES[family](CONFIGS[family]()).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model


def inputs(family):
    """Two examples; where the family takes a padding mask, the second padded."""
    g = torch.Generator().manual_seed(1)
    if family == "whisper":  # Whisper pads audio to its fixed length itself: its encoder takes no mask
        return {"input_features": torch.randn(2, 8, 24, generator=g)}
    if family in ("wav2vec2", "hubert"):
        mask = torch.ones(2, 120, dtype=torch.long)
        mask[1, 80:] = 0
        return {"input_values": torch.randn(2, 120, generator=g) * mask, "attention_mask": mask}
    batch = {"pixel_values": torch.randn(2, 3, 16, 16, generator=g)}
    if family == "siglip":  # its text tower is bidirectional too
        mask = torch.ones(2, 7, dtype=torch.long)
        mask[1, 4:] = 0
        batch.update(input_ids=torch.randint(3, 99, (2, 7), generator=g), attention_mask=mask)
    return batch


def encode(model, family, batch):
    """The hidden states of every encoder the scheme switches, at real (not padded) positions, (N, D)."""
    if family == "whisper":
        return model.get_encoder()(**batch).last_hidden_state.flatten(0, 1)
    if family in ("wav2vec2", "hubert"):
        out = model(**batch).last_hidden_state
        real = model._get_feature_vector_attention_mask(out.shape[1], batch["attention_mask"])
        assert not bool(real.all())  # the padding reaches the attention
        return out[real]
    vision = model.vision_model if family in ("siglip", "clip") else model
    out = [vision(pixel_values=batch["pixel_values"]).last_hidden_state.flatten(0, 1)]
    if family == "siglip":
        text = model.text_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        out.append(text.last_hidden_state[batch["attention_mask"].bool()])
    return torch.cat(out)


def _audio_padding(model, batch):
    """(the padded second example's real frames, the same example alone and unpadded)."""
    real = int(batch["attention_mask"][1].sum())
    alone = model(input_values=batch["input_values"][1:, :real]).last_hidden_state[0]
    return model(**batch).last_hidden_state[1, :len(alone)], alone


def _text_padding(model, batch):
    """SigLIP's text tower: the padded second sentence's real tokens, and it alone."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    real = int(mask[1].sum())
    alone = model.text_model(input_ids=ids[1:, :real]).last_hidden_state[0]
    return model.text_model(input_ids=ids, attention_mask=mask).last_hidden_state[1, :real], alone


PADDED = {"wav2vec2": _audio_padding, "hubert": _audio_padding, "siglip": _text_padding}


def _ref64(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """float64: the scheme's reference in bidirectional self-attention, softmax elsewhere."""
    if getattr(module, ROLE_ATTR, None) != "self" or kwargs.get("is_causal"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    pad = hf.key_padding_mask(attention_mask, query.shape[0], query.shape[2])
    scheme = module.scheme_under_test
    if scheme == "discrete":  # in training with the noise the model drew (FixedNoise), in order
        noise = module.noise_under_test.next() if module.training else None
        out, _ = discrete_reference(query, key, value, pad, scaling, module.gumbel_temperature, module.training, noise)
        return out.transpose(1, 2), None
    u = torch.sigmoid(module.hybrid_logit.detach().double()) if scheme == "hnas" else None
    p = reference_probs((query * scaling) @ key.transpose(-1, -2), scheme, pad, pad, u)
    return (p @ value).transpose(1, 2), None


transformers.AttentionInterface.register("encoders_ref64", _ref64)
transformers.masking_utils.AttentionMaskInterface.register("encoders_ref64", transformers.masking_utils.sdpa_mask)
SETTINGS = {"dnas": {}, "hnas": {"hybrid_init": 0.3}, "discrete": {"gumbel_temperature": 0.7}}
# one scheme per family in the default tier, every scheme in every family in the full tier
DEFAULT = {"whisper": "hnas", "vit": "dnas", "dinov2": "hnas", "siglip": "dnas", "clip": "hnas",
           "wav2vec2": "dnas", "hubert": "discrete"}
GRID = [pytest.param(f, s, marks=() if DEFAULT[f] == s else pytest.mark.full)
        for f in CLASSES for s in ("dnas", "hnas", "discrete")]


@pytest.mark.parametrize("family,scheme", GRID)
def test_family_matches_float64_reference(family, scheme, monkeypatch):
    batch = inputs(family)
    model = build(family)
    with torch.no_grad():
        sdpa = encode(model, family, batch)
    hf.enable(model, scheme=scheme, **SETTINGS[scheme])
    selfs = [m for _, m, role in hf.attention_modules(model) if role == "self"]
    assert len(selfs) == (4 if family == "siglip" else 2)  # two layers (SigLIP: both towers)
    # the scheme runs: each self-attention call reaches the project's code (not sdpa), with its padding
    calls, pad_name = [], "key_padding_mask" if scheme == "discrete" else "padding_mask"
    owner, function = (hf.attention, "discrete_attention") if scheme == "discrete" else (kernels, "attend")
    original = getattr(owner, function)
    monkeypatch.setattr(owner, function, lambda *a, **k: calls.append(k[pad_name] is not None) or original(*a, **k))
    out = encode(model, family, batch)
    assert len(calls) == len(selfs)
    assert any(calls) == (family in PADDED)
    assert (out - sdpa).abs().max() > 1e-3  # not softmax's output
    if family in PADDED:
        with torch.no_grad():
            padded, alone = PADDED[family](model, batch)
        torch.testing.assert_close(padded, alone, atol=2e-5, rtol=1e-5)  # padding changes nothing
    ref = copy.deepcopy(model).double()
    for _, module, role in hf.attention_modules(ref):
        module.scheme_under_test = scheme
    ref.set_attn_implementation("encoders_ref64")
    batch64 = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    with torch.no_grad():
        want = encode(ref, family, batch64)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    # gradients: float32 (the automatic path) against float64 (the materialized path; discrete: the reference)
    # (a fixed random direction: the sum of squares after a final layer norm barely depends on the weights)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * g).sum().backward()
    if scheme != "discrete":
        ref.set_attn_implementation(scheme)
        monkeypatch.setenv(kernels.PATH_ENV, "materialized")
    (encode(ref, family, batch64) * g.double()).sum().backward()
    params, checked = dict(ref.named_parameters()), 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            scale = max(1.0, params[name].grad.abs().max().item())  # float32's error grows with the gradient's size
            torch.testing.assert_close(p.grad.double(), params[name].grad, atol=1e-4 * scale, rtol=1e-3,
                                       msg=lambda m, name=name: f"{name}: {m}")
            checked += 1
    assert checked > 10
    assert scheme != "hnas" or all(m.hybrid_logit.grad.abs().sum() > 0 for m in selfs)


def _greedy(model, encoder_outputs, steps):
    """Greedy decoding written out: a full decoder forward per step, no cache; (tokens, logits of each step)."""
    seq, scores = torch.full((encoder_outputs.last_hidden_state.shape[0], 1), model.config.decoder_start_token_id), []
    for _ in range(steps):
        scores.append(model(encoder_outputs=encoder_outputs, decoder_input_ids=seq).logits[:, -1])
        seq = torch.cat([seq, scores[-1].argmax(-1, keepdim=True)], 1)
    return seq[:, 1:], torch.stack(scores, 1)


def test_whisper_decoder_stays_sdpa_and_generate_reads_the_dnas_encoder():
    model, batch = build("whisper"), inputs("whisper")
    with torch.no_grad():
        softmax_encoder = model.get_encoder()(**batch)
    hf.enable(model, scheme="dnas")
    roles = {name: role for name, _, role in hf.attention_modules(model)}
    assert roles == {"model.encoder.layers.0.self_attn": "self", "model.encoder.layers.1.self_attn": "self",
                     "model.decoder.layers.0.self_attn": "causal", "model.decoder.layers.0.encoder_attn": "cross",
                     "model.decoder.layers.1.self_attn": "causal", "model.decoder.layers.1.encoder_attn": "cross"}
    # Whisper's default logits processors suppress token ids of its real vocabulary: none here
    model.generation_config.suppress_tokens = model.generation_config.begin_suppress_tokens = None
    with torch.no_grad():
        dnas_encoder = model.get_encoder()(**batch)
        generated = model.generate(**batch, max_new_tokens=5, do_sample=False, output_scores=True,
                                   return_dict_in_generate=True)
        decoder = model(encoder_outputs=dnas_encoder, decoder_input_ids=generated.sequences[:, :3]).logits
        model.set_attn_implementation("sdpa")  # the decoder as it was: softmax throughout
        want_tokens, want_scores = _greedy(model, dnas_encoder, 5)
        _, softmax_scores = _greedy(model, softmax_encoder, 5)
        want_decoder = model(encoder_outputs=dnas_encoder, decoder_input_ids=generated.sequences[:, :3]).logits
    torch.testing.assert_close(decoder, want_decoder)  # the decoder is unchanged
    assert torch.equal(generated.sequences[:, -5:], want_tokens)
    torch.testing.assert_close(torch.stack(generated.scores, 1), want_scores, atol=1e-5, rtol=1e-5)
    assert (want_scores - softmax_scores).abs().max() > 1e-3  # generate() decodes the DNAS encoder's output


def test_clip_text_tower_stays_sdpa():
    model = build("clip")
    g = torch.Generator().manual_seed(5)
    ids, mask = torch.randint(3, 99, (2, 7), generator=g), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    with torch.no_grad():
        want = model.text_model(input_ids=ids, attention_mask=mask).last_hidden_state
    hf.enable(model, scheme="hnas")
    roles = {name.split(".")[0]: role for name, _, role in hf.attention_modules(model)}
    assert roles == {"text_model": "causal", "vision_model": "self"}  # one attention class, told apart by its calls
    assert not any("text_model" in n for n, _ in model.named_parameters() if n.endswith("hybrid_logit"))
    with torch.no_grad():
        out = model.text_model(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out, want)
    text_alone = transformers.CLIPTextModel(model.config.text_config)
    with pytest.raises(ValueError, match="no bidirectional self-attention") as e:
        hf.enable(text_alone, scheme="dnas")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("family", [f if f in ("vit", "whisper", "wav2vec2") else pytest.param(f, marks=pytest.mark.full)
                                    for f in CLASSES])
def test_hnas_u_survives_save_and_load(family, tmp_path):
    model, batch = hf.enable(build(family), scheme="hnas"), inputs(family)
    with torch.no_grad():
        for i, (_, p) in enumerate(n_p for n_p in model.named_parameters() if n_p[0].endswith("hybrid_logit")):
            p.copy_(torch.linspace(-2.0, 1.5, p.numel()) + i)  # u of each layer and head its own
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(CLASSES[family], str(tmp_path)).eval()
    assert loaded.config.dnas["scheme"] == "hnas"
    saved = {n: p for n, p in model.named_parameters() if n.endswith("hybrid_logit")}
    restored = {n: p for n, p in loaded.named_parameters() if n.endswith("hybrid_logit")}
    assert saved.keys() == restored.keys() and len(saved) == (4 if family == "siglip" else 2)
    for name, p in saved.items():
        assert torch.equal(restored[name], p), name
    with torch.no_grad():
        assert torch.equal(encode(loaded, family, batch), encode(model, family, batch))


def test_modules_are_found_without_dummy_inputs(monkeypatch):
    """The probe forward builds its inputs from the config: a model whose
    ``dummy_inputs`` fails (as Whisper's and the vision models' did) switches."""
    def fails(self):
        raise AttributeError("'NoneType' object has no attribute 'dtype'")

    monkeypatch.setattr(transformers.PreTrainedModel, "dummy_inputs", property(fails))
    for family in ("vit", "whisper"):
        roles = [role for _, _, role in hf.attention_modules(build(family))]
        assert roles.count("self") == 2, family
    bert = transformers.BertModel(transformers.BertConfig(**TEXT))
    assert [role for _, _, role in hf.attention_modules(bert)] == ["self", "self"]


HEADS = [("wav2vec2", "Wav2Vec2ForCTC"), ("wav2vec2", "Wav2Vec2ForSequenceClassification"), ("hubert", "HubertForCTC"),
         ("whisper", "WhisperForAudioClassification"), ("whisper", "WhisperModel"),
         ("vit", "ViTForImageClassification"), ("dinov2", "Dinov2ForImageClassification"),
         ("siglip", "SiglipForImageClassification"), ("clip", "CLIPForImageClassification")]


@pytest.mark.full
@pytest.mark.parametrize("family,name", HEADS)
def test_task_heads_switch(family, name):
    """The families' task models (CTC, classification heads, Whisper without its LM head) switch:
    the probe builds their inputs too, and the switched model runs the scheme."""
    torch.manual_seed(0)
    model = getattr(transformers, name)(CONFIGS[family]()).eval()
    with torch.no_grad():
        before = model(**_head_inputs(family, model))
    hf.enable(model, scheme="dnas")
    assert [role for _, _, role in hf.attention_modules(model)].count("self") == 2
    with torch.no_grad():
        after = model(**_head_inputs(family, model))
    assert model.config._attn_implementation == "dnas"
    assert not torch.equal(before[0], after[0])  # the scheme changed the output


def _head_inputs(family, model):
    batch = inputs(family)
    if family == "siglip":  # the image classifier takes images only
        batch = {"pixel_values": batch["pixel_values"]}
    if isinstance(model, transformers.WhisperModel):
        batch["decoder_input_ids"] = torch.ones(2, 3, dtype=torch.long)
    return batch


@pytest.mark.parametrize("family", ["vit", pytest.param("siglip", marks=pytest.mark.full)])
def test_discrete_in_training_matches_float64_reference(family, monkeypatch):
    """The relaxed sample of training (Gumbel noise fixed, drawn in the model's order), forward and gradients."""
    batch = inputs(family)
    model = hf.enable(build(family), scheme="discrete", gumbel_temperature=0.7).train()
    noise = FixedNoise()
    monkeypatch.setattr(DA, "gumbel_noise", noise)
    out = encode(model, family, batch)
    selfs = [m for _, m, role in hf.attention_modules(model) if role == "self"]
    assert len(noise.drawn) == len(selfs)  # one sample per self-attention call: the scheme runs
    ref = copy.deepcopy(model).double().train()
    for _, module, role in hf.attention_modules(ref):
        module.scheme_under_test, module.noise_under_test = "discrete", noise
    ref.set_attn_implementation("encoders_ref64")
    want = encode(ref, family, {k: v.double() if v.is_floating_point() else v for k, v in batch.items()})
    assert noise.used == len(selfs)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    (out * g).sum().backward()
    (want * g.double()).sum().backward()
    params, checked = dict(ref.named_parameters()), 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            scale = max(1.0, params[name].grad.abs().max().item())
            torch.testing.assert_close(p.grad.double(), params[name].grad, atol=1e-4 * scale, rtol=1e-3,
                                       msg=lambda m, name=name: f"{name}: {m}")
            checked += 1
    assert checked > 10


def _graph_breaks(family, scheme):
    """Graph breaks of the family's encoder forward in training mode under torch.compile."""
    import torch._dynamo

    model = build(family)
    if scheme != "sdpa":
        hf.enable(model, scheme=scheme)
    model.train()
    batch = inputs(family)
    if family == "whisper":
        encoder = model.get_encoder()

        def run(**b):
            return encoder(**b).last_hidden_state.sum()
    elif family in ("siglip", "clip"):
        def run(**b):
            out = model.vision_model(pixel_values=b["pixel_values"]).last_hidden_state.sum()
            if "input_ids" in b:
                out = out + model.text_model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]) \
                    .last_hidden_state.sum()
            return out
    else:
        def run(**b):
            return model(**b).last_hidden_state.sum()
    torch._dynamo.reset()
    return torch._dynamo.explain(run)(**batch).graph_break_count


@pytest.mark.full
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_compiled_encoder_breaks_no_more_than_sdpa(family):
    """Under torch.compile in training, each scheme adds no graph break to the
    family's encoder: as many as sdpa's, which is 0 except for wav2vec 2.0 and
    HuBERT, whose training forward (transformers' own feature-encoder and
    masking code) breaks the sdpa graph too; in eval mode they have none."""
    baseline = _graph_breaks(family, "sdpa")
    if family not in ("wav2vec2", "hubert"):
        assert baseline == 0
    for scheme in ("dnas", "hnas", "discrete"):
        assert _graph_breaks(family, scheme) == baseline, scheme
