"""Tier 2 and 3: the single-stream discrete Transformer (J. Kinley, 2020,
Section 4.1), its attention module, models built in-process, and tiny CLI
runs (translation and sentence classification)."""

import re

import pytest
import torch
from fairseq.logging import metrics
from fairseq.modules import MultiheadAttention
from helpers import TINY, build_model, random_tokens, tiny_args
from test_discrete import (assert_beam_search_by_index_is_the_product, by_index_and_by_product, causal_mask,
                           reference_sample)

from fairseq_dnas.analysis.capture import attention_sites, head_probs
from fairseq_dnas.attention import discrete as DA
from fairseq_dnas.attention import gumbel_noise as N
from fairseq_dnas.modules.discrete_attention import DiscreteMultiheadAttention

ARCH = "transformer_discrete_single"

# --- the module -----------------------------------------------------------------

KINDS = ["encoder_self", "decoder_self", "cross"]


def _pair(kind, sampler="soft", dropout=0.0, **kw):
    """A fairseq MultiheadAttention and a DiscreteMultiheadAttention with the
    same weights, in float64."""
    torch.manual_seed(0)
    opts = dict(self_attention=True) if kind != "cross" else dict(kdim=24, vdim=24, encoder_decoder_attention=True)
    plain = MultiheadAttention(16, 4, dropout=dropout, **opts).double()
    disc = DiscreteMultiheadAttention(16, 4, dropout=dropout, sampler=sampler, **opts, **kw).double()
    disc.load_state_dict(plain.state_dict(), strict=True)
    return plain, disc


def _inputs(kind, t_q=6, t_k=7, batch=3):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(t_q, batch, 16, generator=g, dtype=torch.float64)
    if kind == "cross":
        enc = torch.randn(t_k, batch, 24, generator=g, dtype=torch.float64)
        kmask = torch.zeros(batch, t_k, dtype=torch.bool)
        kmask[1, :3] = kmask[2, :5] = True  # left-padded sources
        return dict(query=x, key=enc, value=enc, key_padding_mask=kmask, static_kv=True)
    if kind == "decoder_self":
        return dict(query=x, key=x, value=x, attn_mask=causal_mask(t_q, t_q))
    kmask = torch.zeros(batch, t_q, dtype=torch.bool)
    kmask[1, :2] = kmask[2, :4] = True
    return dict(query=x, key=x, value=x, key_padding_mask=kmask)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("training", [False, True])
def test_soft_sampler_module_equals_fairseq_attention(kind, training):
    """Parity (float64): S = softmax(L) is fairseq's attention, to 1e-12
    against torch's kernel (fairseq's ordinary path), the per-head weights
    too against fairseq's own Python path."""
    plain, disc = _pair(kind)
    plain.train(training), disc.train(training)
    kw = _inputs(kind)
    out_p, _ = plain(**kw, need_weights=False)  # torch's kernel for the ordinary call
    out_d, w_d = disc(**kw, need_weights=False, need_head_weights=True)
    # (static_kv calls never take torch's kernel: fairseq's Python path, below)
    torch.testing.assert_close(out_d, out_p, atol=1e-6 if kind == "cross" else 1e-12, rtol=0)
    # fairseq's Python path returns per-head weights; its softmax runs in
    # float32 even for float64 inputs (fairseq.utils.softmax), hence 1e-6
    plain.skip_embed_dim_check = True
    out_p, w_p = plain(**kw, need_weights=True, need_head_weights=True)
    torch.testing.assert_close(out_d, out_p, atol=1e-6, rtol=0)
    torch.testing.assert_close(w_d, w_p.double(), atol=1e-6, rtol=0)


def _reference_output(module, kw, noise, tau):
    """The module's output recomputed in float64 with reference_sample."""
    x, key = kw["query"], kw["key"]
    h, d = module.num_heads, module.head_dim

    def proj(linear, y):
        return y.double() @ linear.weight.double().T + linear.bias.double()

    def heads(y):  # (T, B, C) -> (B, H, T, D)
        return y.view(y.size(0), y.size(1), h, d).permute(1, 2, 0, 3)

    q = heads(proj(module.q_proj, x) * module.scaling)
    k, v = heads(proj(module.k_proj, key)), heads(proj(module.v_proj, key))
    s = reference_sample(q @ k.transpose(-1, -2), noise, tau, kw.get("key_padding_mask"), kw.get("attn_mask"))
    out = (s @ v).permute(2, 0, 1, 3).reshape(x.size(0), x.size(1), h * d)
    return proj(module.out_proj, out), s


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hard", [False, True])
def test_gumbel_module_matches_float64_reference(kind, hard):
    """Training mode: the output is out_proj(S v) with S the relaxed sample of
    the module's own noise (drawn from the default generator: the same seed
    gives the reference the same noise)."""
    _, disc = _pair(kind, sampler="gumbel", hard=hard)
    disc.train()
    disc.gumbel_temperature = 0.6
    kw = _inputs(kind)
    torch.manual_seed(5)
    out, w = disc(**kw, need_head_weights=True)
    torch.manual_seed(5)
    noise = N.gumbel_noise(w.transpose(0, 1).shape)
    ref, s = _reference_output(disc, kw, noise, 0.6)
    if hard:  # the forward value is the one-hot of the relaxed sample's argmax
        s = torch.nn.functional.one_hot(s.argmax(-1), s.size(-1)).double() * (s.sum(-1, keepdim=True) > 0)
        x, key = kw["query"], kw["key"]
        v = (key.double() @ disc.v_proj.weight.double().T + disc.v_proj.bias.double())
        v = v.view(v.size(0), v.size(1), 4, 4).permute(1, 2, 0, 3)
        out_ref = (s @ v).permute(2, 0, 1, 3).reshape(x.size(0), x.size(1), 16)
        ref = out_ref @ disc.out_proj.weight.double().T + disc.out_proj.bias.double()
    torch.testing.assert_close(w.transpose(0, 1), s, atol=1e-12, rtol=0)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_training_path_equals_the_explicit_sample(kind, monkeypatch):
    """Training calls that ask for no weights run torch's fused attention with
    the noise as an additive mask (gumbel_attention); with the same noise
    (same seed) the output and the gradients are the explicit S v's (float64,
    1e-12)."""
    _, disc = _pair(kind, sampler="gumbel")
    disc.train()
    disc.gumbel_temperature = 0.7
    calls = []
    fused = DA.gumbel_attention
    monkeypatch.setattr(DA, "gumbel_attention", lambda *a, **k: calls.append(1) or fused(*a, **k))
    results = []
    for need_weights in (False, True):
        kw = _inputs(kind)
        x = kw["query"].clone().requires_grad_(True)
        kw.update(query=x, key=x if kind != "cross" else kw["key"], value=x if kind != "cross" else kw["value"])
        torch.manual_seed(11)
        out, _ = disc(**kw, need_weights=need_weights)
        out.pow(2).sum().backward()
        results.append((out.detach(), x.grad, disc.q_proj.weight.grad.clone()))
        disc.zero_grad()
    assert calls == [1]  # the fused path ran once, the explicit one once
    for fused_r, explicit_r in zip(*results):
        torch.testing.assert_close(fused_r, explicit_r, atol=1e-12, rtol=0)


@pytest.mark.parametrize("need_weights", [False, True])  # the fused path and the explicit one
def test_attention_dropout_acts_on_softmax_attention_only(need_weights):
    """One rule for both modules (docs/math.md): attention dropout drops
    entries of softmax attention (S = softmax(L) with the soft sampler, the
    controller's A) and never of a Gumbel sample S. Training, same seed,
    attention dropout 0.5 against 0."""
    from fairseq_dnas.modules.two_stream_attention import TwoStreamAttention

    def run_single(sampler, p):
        _, disc = _pair("encoder_self", sampler=sampler, dropout=p)
        torch.manual_seed(5)
        return disc.train()(**_inputs("encoder_self"), need_weights=need_weights)[0]

    torch.testing.assert_close(run_single("gumbel", 0.5), run_single("gumbel", 0.0), atol=0, rtol=0)
    assert not torch.allclose(run_single("soft", 0.5), run_single("soft", 0.0))

    # Two streams: S as the model stream used it (rows of a sample sum to 1;
    # a dropped row does not), and A's dropout seen in the controller's output.
    torch.manual_seed(0)
    g = torch.randn(6, 3, 16, dtype=torch.float64)
    for sampler in ("gumbel", "soft"):
        m = TwoStreamAttention(16, 4, sampler=sampler, dropout=0.5, self_attention=True).double().train()
        g_out, _, _, sample = m.two_stream_forward(g, g, g.flip(0))
        rows = sample.sum(-1)
        if sampler == "gumbel":
            torch.testing.assert_close(rows, torch.ones_like(rows), atol=1e-12, rtol=0)
        else:
            assert (rows - 1).abs().max() > 0.1
        m.eval()
        assert not torch.allclose(g_out, m.two_stream_forward(g, g, g.flip(0))[0])  # A dropped in training


@pytest.mark.parametrize("kind", KINDS)
def test_eval_weights_are_exactly_one_hot(kind):
    _, disc = _pair(kind, sampler="gumbel")
    disc.eval()
    kw = _inputs(kind)
    _, w = disc(**kw, need_head_weights=True)
    assert set(w.unique().tolist()) == {0.0, 1.0}
    assert bool((w.sum(-1) == 1).all())
    if "key_padding_mask" in kw:
        assert bool((w[..., kw["key_padding_mask"][None, :, None, :].expand_as(w)] == 0).all())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eval_by_index_equals_the_one_hot_product_bit_for_bit(kind, dtype, monkeypatch):
    """Inference gathers V at the argmax; the output and the weights are the
    one-hot product's, bit for bit: whole calls with padding or the causal
    mask, one step at a time with fairseq's incremental state, and the beam
    layout of encoder-decoder attention (one copy of the keys per sentence)."""
    _, disc = _pair(kind, sampler="gumbel")
    disc.to(dtype).eval()
    kw = {k: (t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t) for k, t in _inputs(kind).items()}

    def run():
        outs = [disc(**kw, need_head_weights=True), disc(**kw, need_weights=False)]
        state = {}
        for t in range(kw["query"].size(0) if kind != "encoder_self" else 0):  # (decoders step one query at a time)
            x = kw["query"][t:t + 1]
            step = dict(kw, query=x, attn_mask=None)
            if kind == "decoder_self":
                step.update(key=x, value=x)
            outs.append(disc(**step, incremental_state=state, need_weights=t % 2 == 0))
        if kind == "cross":  # beam 2: the encoder output repeated per hypothesis, projected once per sentence
            disc.set_beam_size(2)
            beam_kw = dict(kw, query=kw["query"].repeat_interleave(2, 1), key=kw["key"].repeat_interleave(2, 1),
                           value=kw["value"].repeat_interleave(2, 1),
                           key_padding_mask=kw["key_padding_mask"].repeat_interleave(2, 0))
            outs.append(disc(**beam_kw, need_weights=True))
            disc.set_beam_size(1)
        return outs

    by_index, by_product = by_index_and_by_product(run, monkeypatch, DA)
    assert len(by_index) == len(by_product)
    for (out, w), (want, want_w) in zip(by_index, by_product):
        assert out.dtype == dtype and torch.equal(out, want)
        assert (w is None and want_w is None) or torch.equal(w, want_w)


def test_eval_builds_no_one_hot_unless_asked(monkeypatch):
    _, disc = _pair("encoder_self", sampler="gumbel")
    disc.eval()
    monkeypatch.setattr(DA, "one_hot_rows", lambda *a, **kw: pytest.fail("one-hot built without being asked for"))
    out, w = disc(**_inputs("encoder_self"), need_weights=False)
    assert w is None and bool(out.isfinite().all())


def test_gradients_reach_every_parameter_through_the_sample():
    _, disc = _pair("encoder_self", sampler="gumbel")
    disc.train()
    out, _ = disc(**_inputs("encoder_self"))
    out.sum().backward()
    for name, p in disc.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_incremental_module_steps_equal_the_full_causal_call():
    """Eval mode: one query at a time with fairseq's incremental state (the
    argmax over past positions) equals the full causal call, for self- and
    encoder-decoder attention."""
    for kind in ("decoder_self", "cross"):
        _, disc = _pair(kind, sampler="gumbel")
        disc.eval()
        kw = _inputs(kind)
        full, w_full = disc(**kw, need_head_weights=True)
        state, steps, ws = {}, [], []
        for t in range(kw["query"].size(0)):
            x = kw["query"][t:t + 1]
            step_kw = dict(kw, query=x, key=x if kind == "decoder_self" else kw["key"],
                           value=x if kind == "decoder_self" else kw["value"], attn_mask=None)
            out, w = disc(**step_kw, incremental_state=state, need_head_weights=True)
            steps.append(out)
            ws.append(w)
        torch.testing.assert_close(torch.cat(steps), full, atol=1e-12, rtol=0)
        got_w = torch.cat([torch.nn.functional.pad(w, (0, w_full.size(-1) - w.size(-1))) for w in ws], dim=2)
        assert torch.equal(got_w, w_full)


def test_low_precision_module_is_finite():
    for dtype in (torch.bfloat16, torch.float16):
        _, disc = _pair("encoder_self", sampler="gumbel")
        disc = disc.to(dtype).train()
        disc.gumbel_temperature = 0.1
        kw = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v)
              for k, v in _inputs("encoder_self").items()}
        kw["query"] = kw["key"] = kw["value"] = kw["query"] * 100
        try:
            out, w = disc(**kw, need_head_weights=True)
        except RuntimeError as err:  # float16 matmul is not implemented on some CPUs
            assert dtype == torch.float16 and "not implemented" in str(err)
            continue
        assert out.dtype == dtype and bool(torch.isfinite(out).all()) and bool(torch.isfinite(w).all())


@pytest.mark.parametrize("kwargs, message", [
    (dict(sampler="argmax"), "sampler"),
    (dict(scheme="hnas"), "scheme"),
    (dict(temperature=0.0), "--gumbel-temperature"),
    (dict(scheme="dnas", self_attention=False, encoder_decoder_attention=True), "self-attention"),
])
def test_bad_module_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DiscreteMultiheadAttention(16, 4, **{"self_attention": True, **kwargs})


# --- models in-process -----------------------------------------------------------


def _encode(model, tokens):
    lengths = tokens.ne(model.encoder.padding_idx).sum(1)
    return model.encoder(tokens, src_lengths=lengths)


def _plain_and_discrete(extra=()):
    """fairseq's transformer and the discrete model, same tiny shape, same weights."""
    plain = build_model("transformer")
    disc = build_model(ARCH, list(extra))
    disc.load_state_dict(plain.state_dict(), strict=True)  # a plain checkpoint initializes it
    return plain, disc


def test_every_attention_is_discrete_and_dnas_stays_in_the_encoder():
    model = build_model(ARCH, ["--discrete-scheme", "dnas", "--sinkhorn-iters", "2", "--gumbel-hard"])
    enc = model.encoder.attention_modules()
    dec = [m for m in model.decoder.modules() if isinstance(m, DiscreteMultiheadAttention)]
    assert len(enc) == 2 and len(dec) == 2  # TINY: 2 encoder layers, 1 decoder layer (self + cross)
    assert all(m.discrete_scheme == "dnas" and m.sinkhorn_iters == 2 and m.gumbel_hard for m in enc)
    assert all(m.discrete_scheme == "unas" and m.gumbel_hard for m in dec)
    assert not any(type(m) is MultiheadAttention for m in model.modules())
    for arch, dim in ((ARCH + "_iwslt_de_en", 512), (ARCH + "_tiny", 64)):
        args = tiny_args(arch)
        assert args.discrete_sampler == "gumbel" and args.gumbel_temperature == 1.0
    sizes = options_of(ARCH + "_iwslt_de_en")
    assert sizes == (512, 1024, 6, 4)
    assert options_of(ARCH + "_tiny") == (64, 64, 2, 2)


def options_of(arch):
    """(embed, ffn, layers, heads) of the encoder of ``arch`` with no size flags."""
    from fairseq import options

    import fairseq_dnas.plugin  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), ["unused", "--arch", arch])
    return (args.encoder_embed_dim, args.encoder_ffn_embed_dim, args.encoder_layers, args.encoder_attention_heads)


def test_soft_model_equals_fairseqs_transformer_in_float64():
    """Parity of the whole model (float64, to 1e-6: fairseq's decoder
    attention runs its softmax in float32): with S = softmax(L) the
    single-stream model with a plain transformer's weights computes what
    fairseq's transformer computes, encoder and decoder."""
    plain, disc = _plain_and_discrete(["--discrete-sampler", "soft"])
    plain.double(), disc.double()
    d = plain.encoder.dictionary
    src = random_tokens([5, 9, 7], 9, d, left_pad=True)
    tgt = random_tokens([4, 6, 3], 6, d, left_pad=False, seed=2)
    lengths = src.ne(d.pad()).sum(1)
    out_p = plain(src, lengths, tgt)[0]
    out_d = disc(src, lengths, tgt)[0]
    real = tgt.ne(d.pad())
    torch.testing.assert_close(out_d[real], out_p[real], atol=1e-6, rtol=0)
    # and the gumbel model with the same weights is another model
    gumbel = build_model(ARCH)
    gumbel.load_state_dict(plain.float().state_dict(), strict=True)
    assert (gumbel(src, lengths, tgt)[0][real] - out_p.float()[real]).abs().max() > 1e-3


def _capture_encoder_probs(model, tokens):
    """Per layer, the (H, B, T, T) attention the encoder used (capture's re-run)."""
    probs, handles = {}, []
    for site in attention_sites(model, decoder=False):
        def hook(module, args, kwargs, output, layer=site.layer):
            from fairseq_dnas.analysis.capture import call_kwargs

            probs[layer] = head_probs(module, call_kwargs(args, kwargs))[1]
        handles.append(site.module.register_forward_hook(hook, with_kwargs=True))
    _encode(model, tokens)
    for h in handles:
        h.remove()
    return probs


def test_capture_reports_the_discrete_attention_one_hot_in_eval():
    model = build_model(ARCH)
    sites = attention_sites(model)
    assert [s.scheme for s in sites] == ["discrete"] * 4
    tokens = random_tokens([5, 9, 7], 9, model.encoder.dictionary)
    probs = _capture_encoder_probs(model, tokens)
    pad = tokens.eq(model.encoder.padding_idx)
    for p in probs.values():
        assert set(p.unique().tolist()) == {0.0, 1.0} and bool((p.sum(-1) == 1).all())
        assert bool((p[..., pad[None, :, None, :].expand_as(p)] == 0).all())


@pytest.mark.parametrize("attended", [False, True])
def test_eval_encoder_output_depends_only_on_attended_values(attended):
    """Perturb the value input (v_proj's output) of one head at positions that
    no query of that head attends to: the encoder output is unchanged bit for
    bit. Perturbing an attended one changes it (the test can fail)."""
    model = build_model(ARCH)
    d = model.encoder.dictionary
    tokens = random_tokens([9, 9], 9, d, seed=3)
    probs = _capture_encoder_probs(model, tokens)
    base = _encode(model, tokens)["encoder_out"][0]
    layer, heads, hd = 0, model.encoder.layers[0].self_attn.num_heads, model.encoder.layers[0].self_attn.head_dim
    col = probs[layer].sum(dim=2)  # (H, B, T_k): how often each key is chosen
    chosen = (col > 0) if attended else (col == 0)
    assert bool(chosen.any())
    delta = torch.zeros(9, 2, heads * hd)
    for h, b, j in chosen.nonzero().tolist():
        delta[j, b, h * hd:(h + 1) * hd] = 7.0
    handle = model.encoder.layers[layer].self_attn.v_proj.register_forward_hook(lambda m, i, o: o + delta)
    out = _encode(model, tokens)["encoder_out"][0]
    handle.remove()
    if attended:
        assert (out - base).abs().max() > 1e-3
    else:
        assert torch.equal(out, base)


def test_incremental_decoding_equals_full_causal_decoding():
    model = build_model(ARCH)
    d = model.encoder.dictionary
    src = random_tokens([5, 9, 7], 9, d)
    tgt = random_tokens([6, 6, 6], 6, d, left_pad=False, seed=4)
    enc = _encode(model, src)
    full = model.decoder(tgt, encoder_out=enc)[0]
    state = {}
    steps = [model.decoder(tgt[:, :t + 1], encoder_out=enc, incremental_state=state)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
    # reordering the cache as beam search does (here: dropping a finished
    # sentence) reorders the next step
    order = torch.tensor([2, 0])
    model.decoder.reorder_incremental_state_scripting(state, order)
    nxt = model.decoder(torch.cat([tgt, tgt[:, :1]], 1)[order], encoder_out=model.encoder.reorder_encoder_out(enc, order),
                        incremental_state=state)[0]
    again = model.decoder(torch.cat([tgt, tgt[:, :1]], 1)[order], encoder_out=model.encoder.reorder_encoder_out(enc, order))[0]
    torch.testing.assert_close(nxt[:, -1], again[:, -1], atol=1e-5, rtol=0)


def test_beam_search_by_index_equals_the_one_hot_product(monkeypatch):
    model = build_model(ARCH).eval()
    d = model.encoder.dictionary
    assert_beam_search_by_index_is_the_product(model, random_tokens([5, 9, 7], 9, d), d.pad(), monkeypatch, DA)


def test_dnas_scheme_model_trains_and_decodes():
    """--discrete-scheme dnas: the encoder samples from the DNAS probabilities
    (training: finite loss gradients on every parameter; eval: the argmax of
    the DNAS distribution, which differs from the softmax model's)."""
    model = build_model(ARCH, ["--discrete-scheme", "dnas"])
    d = model.encoder.dictionary
    src = random_tokens([5, 9, 7], 9, d)
    tgt = random_tokens([4, 6, 3], 6, d, left_pad=False, seed=2)
    lengths = src.ne(d.pad()).sum(1)
    model.train()
    model(src, lengths, tgt)[0].logsumexp(-1).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if "encoder.layers" in n and "self_attn" in n}
    assert grads and all(g is not None and bool(torch.isfinite(g).all()) and g.abs().sum() > 0 for g in grads.values())
    model.eval()
    unas = build_model(ARCH)
    unas.load_state_dict(model.state_dict(), strict=True)
    p_dnas, p_unas = _capture_encoder_probs(model, src), _capture_encoder_probs(unas, src)
    assert all(set(p.unique().tolist()) == {0.0, 1.0} for p in p_dnas.values())
    assert any(not torch.equal(p_dnas[i], p_unas[i]) for i in p_dnas)


def test_temperature_follows_the_anneal_schedule_and_is_logged():
    model = build_model(ARCH, ["--gumbel-anneal", "2,0.5,100"])
    mods = [m for m in model.modules() if isinstance(m, DiscreteMultiheadAttention)]
    assert all(m.gumbel_temperature == 2.0 for m in mods)
    model.train()
    with metrics.aggregate(new_root=True) as agg:
        model.set_num_updates(50)
    assert all(m.gumbel_temperature == pytest.approx(1.0) for m in mods)
    assert agg.get_smoothed_values()["gumbel_tau"] == pytest.approx(1.0)
    model.set_num_updates(1000)
    assert all(m.gumbel_temperature == pytest.approx(0.5) for m in mods)
    fixed = build_model(ARCH, ["--gumbel-temperature", "0.7"])
    fixed.set_num_updates(10)
    assert {m.gumbel_temperature for m in fixed.modules() if isinstance(m, DiscreteMultiheadAttention)} == {0.7}


def test_training_forward_samples_and_eval_is_deterministic():
    model = build_model(ARCH)
    d = model.encoder.dictionary
    src = random_tokens([5, 9], 9, d)
    tgt = random_tokens([4, 6], 6, d, left_pad=False, seed=2)
    lengths = src.ne(d.pad()).sum(1)
    model.train()
    a, b = model(src, lengths, tgt)[0], model(src, lengths, tgt)[0]
    assert (a - b).abs().max() > 1e-4  # fresh noise per forward
    model.eval()
    assert torch.equal(model(src, lengths, tgt)[0], model(src, lengths, tgt)[0])


# --- classification models in-process ---------------------------------------------


def _roberta(arch, extra=(), seed=0):
    from test_roberta_dnas import build

    return build(arch, extra, seed=seed)


def test_roberta_discrete_single_sizes_and_attention():
    from fairseq_dnas.models.roberta_discrete_single import RobertaDiscreteSingleModel

    model = _roberta("roberta_discrete_single_small")
    assert isinstance(model, RobertaDiscreteSingleModel)
    mods = model.attention_modules()
    assert len(mods) == 2 and all(isinstance(m, DiscreteMultiheadAttention) for m in mods)
    from test_roberta_dnas import roberta_args

    for arch, sizes in (("roberta_discrete_single_thesis", (6, 64, 128, 4)), ("roberta_thesis", (6, 64, 128, 4)),
                        ("roberta_discrete_single_small", (4, 128, 512, 4))):
        a = roberta_args(arch, tiny=False)
        assert (a.encoder_layers, a.encoder_embed_dim, a.encoder_ffn_embed_dim, a.encoder_attention_heads) == sizes


def test_roberta_soft_equals_fairseqs_roberta_and_gumbel_does_not():
    """A plain roberta's weights load into the discrete model (same names);
    with S = softmax(L) the outputs are fairseq's (float32, to 1e-5), with the
    argmax they are not."""
    from test_roberta_dnas import tokens

    plain = _roberta("roberta_small", seed=3)
    soft = _roberta("roberta_discrete_single_small", ["--discrete-sampler", "soft"])
    gumbel = _roberta("roberta_discrete_single_small")
    x = tokens(plain)
    out_p = plain(x)[0]
    for model in (soft, gumbel):
        model.load_state_dict(plain.state_dict(), strict=True)
    torch.testing.assert_close(soft(x)[0], out_p, atol=1e-5, rtol=0)
    assert (gumbel(x)[0] - out_p).abs().max() > 1e-2
    # the temperature reaches the encoder's modules here too
    g = _roberta("roberta_discrete_single_small", ["--gumbel-anneal", "1,0.1,10"])
    g.set_num_updates(10)
    assert [m.gumbel_temperature for m in g.attention_modules()] == [pytest.approx(0.1)] * 2


# --- tiny end-to-end runs through fairseq's commands -------------------------------

import os  # noqa: E402
import random  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

from helpers import BIN, ROOT, USER_DIR, WORDS, run, write_parallel_data  # noqa: E402

TRAIN = ["--user-dir", USER_DIR, "--cpu", "--optimizer", "adam", "--lr", "2e-3", "--max-tokens", "1000",
         "--no-progress-bar", "--log-interval", "5", "--seed", "1", "--no-epoch-checkpoints"]


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    """Binarized copy-task data (tests/helpers.py)."""
    raw = tmp_path_factory.mktemp("discrete_raw")
    write_parallel_data(raw)
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", raw / "bin", "--joined-dictionary",
         "--workers", "1"])
    return raw / "bin"


@pytest.fixture(scope="module")
def translation(data_bin, tmp_path_factory):
    """fairseq's transformer_tiny trained 1 epoch and
    transformer_discrete_single_tiny initialized from it and trained 3 more
    (--finetune-from-model: a plain checkpoint of the same shape)."""
    data = data_bin
    root = tmp_path_factory.mktemp("discrete_ckpt")
    plain, disc = root / "plain", root / "discrete"
    run(["fairseq-train", data, "--arch", "transformer_tiny", *TRAIN, "--max-epoch", "1", "--save-dir", plain])
    proc = run(["fairseq-train", data, "--arch", ARCH + "_tiny", *TRAIN, "--max-epoch", "3", "--save-dir", disc,
                "--finetune-from-model", plain / "checkpoint_last.pt", "--gumbel-anneal", "2,0.5,40"])
    return {"data": data, "plain": plain, "discrete": disc, "log": proc.stdout + proc.stderr}


def _hypotheses(stdout):
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^H-(\d+)\t\S+\t(.*)$", stdout, re.M)}


def test_train_from_a_plain_checkpoint_logs_the_temperature(translation):
    log = translation["log"]
    assert "loading pretrained model" in log and "done training" in log
    taus = [float(t) for t in re.findall(r"gumbel_tau[ =](\d+\.\d+)", log)]
    assert taus and taus[-1] < taus[0] <= 2.0  # annealed down, logged with the training loss


def test_generate_beam_4_and_interactive(translation):
    ckpt = translation["discrete"] / "checkpoint_best.pt"
    proc = run(["fairseq-generate", translation["data"], "--user-dir", USER_DIR, "--cpu", "--path", ckpt,
                "--beam", "4", "--batch-size", "8", "--required-batch-size-multiple", "1"])
    hyps = _hypotheses(proc.stdout)
    assert sorted(hyps) == list(range(25)) and all(h.strip() for h in hyps.values())
    proc = run(["fairseq-interactive", translation["data"], "--user-dir", USER_DIR, "--cpu", "--path", ckpt,
                "--beam", "2", "--source-lang", "src", "--target-lang", "tgt"], input="w1 w2 w3 w4\nw5 w6 w7\n")
    assert len(_hypotheses(proc.stdout)) == 2
    # the hub interface
    from fairseq.models.transformer import TransformerModel

    hub = TransformerModel.from_pretrained(str(translation["discrete"]), checkpoint_file="checkpoint_best.pt",
                                           data_name_or_path=str(translation["data"]), user_dir=USER_DIR,
                                           source_lang="src", target_lang="tgt")
    assert type(hub.models[0]).__name__ == "TransformerDiscreteSingleModel"
    assert hub.translate("w1 w2 w3 w4 w5", beam=4).strip()


def test_loaded_checkpoint_runs_discrete_attention(translation):
    """After loading (eval mode): every attention is one-hot, the model
    carries the trained plain weights' names, and the plain transformer with
    the same weights gives other outputs."""
    from fairseq import checkpoint_utils
    from fairseq.models.transformer import TransformerModel

    import fairseq_dnas.plugin  # noqa: F401  (its checkpoint patches: torch >= 2.6 loads fairseq checkpoints)

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(translation["discrete"] / "checkpoint_best.pt")])
    model = models[0].eval()
    tokens = random_tokens([6, 11, 9], 11, task.source_dictionary)
    for p in _capture_encoder_probs(model, tokens).values():
        assert set(p.unique().tolist()) == {0.0, 1.0}
    plain = TransformerModel.build_model(cfg.model, task).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    assert (_encode(model, tokens)["encoder_out"][0] - _encode(plain, tokens)["encoder_out"][0]).abs().max() > 1e-3


def _sentences(n, rng):
    """Label 1 iff the sentence holds w3: learnable from one attended token."""
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS[:12]) for _ in range(rng.randint(3, 10))]
        rows.append((" ".join(words), int("w3" in words)))
    return rows


def test_sentence_prediction_and_sentence_classify_score(tmp_path):
    """roberta_discrete_single_thesis (2 of its 6 layers, to keep it short)
    trained with --task sentence_prediction, then scored by
    fairseq_dnas/commands/sentence_classify.py, unchanged."""
    import sentencepiece as spm

    rng = random.Random(0)
    text = tmp_path / "text"
    text.mkdir()
    splits = {"train": _sentences(160, rng), "valid": _sentences(40, rng), "test": _sentences(40, rng)}
    (text / "all.txt").write_text("".join(s + "\n" for rows in splits.values() for s, _ in rows))
    (tmp_path / "bin").mkdir()
    # one piece per word (12 words and <unk>): sentence_classify.py finds it as BIN/../sp.model
    spm.SentencePieceTrainer.train(input=str(text / "all.txt"), model_prefix=str(tmp_path / "bin" / "sp"),
                                   model_type="word", vocab_size=13, bos_id=-1, eos_id=-1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "bin" / "sp.model"))
    for split in ("train", "valid"):
        rows = splits[split]
        (text / f"{split}.sp").write_text("".join(" ".join(sp.encode(s, out_type=str)) + "\n" for s, _ in rows))
        (text / f"{split}.label").write_text("".join(f"{y}\n" for _, y in rows))
    data = tmp_path / "bin" / "task"
    run(["fairseq-preprocess", "--only-source", "--trainpref", text / "train.sp", "--validpref", text / "valid.sp",
         "--destdir", data / "input0", "--workers", "1"])
    run(["fairseq-preprocess", "--only-source", "--trainpref", text / "train.label", "--validpref",
         text / "valid.label", "--destdir", data / "label", "--workers", "1"])
    save = tmp_path / "ckpt"
    proc = run(["fairseq-train", data, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                "--num-classes", "2", "--init-token", "0", "--separator-token", "2", "--max-positions", "64",
                "--arch", "roberta_discrete_single_thesis", "--encoder-layers", "2", "--user-dir", USER_DIR, "--cpu", "--optimizer", "adam",
                "--lr", "2e-3", "--batch-size", "16", "--max-epoch", "3", "--no-epoch-checkpoints",
                "--no-progress-bar", "--log-interval", "5", "--seed", "1", "--save-dir", save,
                "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric"])
    assert "done training" in proc.stdout + proc.stderr
    test_tsv = tmp_path / "test.tsv"
    test_tsv.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in splits["test"]))
    proc = run([sys.executable, "-m", "fairseq_dnas.commands.sentence_classify", "score",
                save / "checkpoint_best.pt", test_tsv])
    import json

    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 40 and 0.0 <= result["accuracy"] <= 1.0
    majority = max(sum(y for _, y in splits["test"]), 40 - sum(y for _, y in splits["test"])) / 40
    assert result["accuracy"] > majority  # it learned something: above the majority class


def _plain_train(*args):
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    return subprocess.run([os.path.join(BIN, "fairseq-train"), *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("flags, says", [
    (["--gumbel-temperature", "0"], "--gumbel-temperature must be a finite number > 0"),
    (["--gumbel-anneal", "2,0.5"], "--gumbel-anneal takes START,END,UPDATES"),
    (["--sinkhorn-iters", "2"], "add --discrete-scheme dnas"),
])
def test_bad_flags_through_plain_fairseq_train_give_one_line(data_bin, tmp_path, flags, says):
    proc = _plain_train(data_bin, "--user-dir", USER_DIR, "--arch", ARCH + "_tiny", "--cpu",
                        "--optimizer", "adam", "--lr", "1e-3", "--max-update", "1", "--batch-size", "8", "--save-dir", tmp_path,
                        *flags)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], proc.stderr[-3000:]
