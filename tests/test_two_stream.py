"""Tier 1 and 2: the two-stream Transformer (J. Kinley, 2020, Section 4.2)
built in-process. The attention against a plain float64 reference (padding,
forward and gradients); the separation of the streams (h never enters g; the
controller learns only through S); one-hot S at inference; incremental
decoding and beam reordering equal full decoding; and the parity with
fairseq's ``transformer``: the soft model (S = A) whose model stream holds
the controller's weights is fairseq's Transformer."""

import math

import pytest
import torch
from conftest import padding_mask
from helpers import build_model, random_tokens, tiny_dictionary
from test_discrete import (assert_beam_search_by_index_is_the_product, by_index_and_by_product, causal_mask,
                           reference_sample)

from fairseq_dnas.attention import discrete as D
from fairseq_dnas.attention import gumbel_noise as N
from fairseq_dnas.modules import two_stream_attention as TS

EMBED, HEADS = 16, 4


def _attention(sampler, kdim=None, tau=0.7):
    torch.manual_seed(1)
    m = TS.TwoStreamAttention(EMBED, HEADS, sampler=sampler, gumbel_temperature=tau, kdim=kdim,
                              self_attention=kdim is None, encoder_decoder_attention=kdim is not None)
    with torch.no_grad():  # non-zero biases, so that a bias mistake shows
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return m


def _linear(lin, x):
    return x @ lin.weight.double().T + lin.bias.double()


def _heads(x):
    t, b, _ = x.shape
    return x.reshape(t, b, HEADS, -1).permute(1, 2, 0, 3)


def _merge(x):
    b, h, t, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(t, b, h * d)


def reference_two_stream(m, gq, gk, hk, kmask, attn_mask, noise, sampler):
    """Section 4.1 in float64: L = Q K^T / sqrt(d_k) from the controller,
    A = softmax(L) over the allowed keys, W_o^g A V and W_o^h S (h W^h)."""
    q, k, v = (_heads(_linear(lin, x.double())) for lin, x in ((m.q_proj, gq), (m.k_proj, gk), (m.v_proj, gk)))
    vm = _heads(_linear(m.model_v_proj, hk.double()))
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    zero = torch.zeros_like(noise, dtype=torch.float64)
    probs = reference_sample(logits, zero, 1.0, kmask, attn_mask)  # tau 1, no noise: softmax
    sample = probs if sampler == "soft" else reference_sample(logits, noise, m.gumbel_temperature, kmask, attn_mask)
    return _linear(m.out_proj, _merge(probs @ v)), _linear(m.model_out_proj, _merge(sample @ vm)), probs, sample


def _inputs(t_q, t_k, batch=3, kdim=EMBED, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gq = torch.randn(t_q, batch, EMBED, generator=gen, dtype=torch.float64)
    gk = gq if t_q == t_k and kdim == EMBED else torch.randn(t_k, batch, kdim, generator=gen, dtype=torch.float64)
    hk = torch.randn(t_k, batch, kdim, generator=gen, dtype=torch.float64)
    return gq, gk, hk


@pytest.mark.parametrize("sampler", ["gumbel", "soft"])
@pytest.mark.parametrize("case", ["self_padded", "causal", "cross_padded"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_stream_attention_matches_float64_reference(sampler, case, dtype):
    kdim = 12 if case == "cross_padded" else None
    t_q, t_k = (5, 7) if case == "cross_padded" else (6, 6)
    m = _attention(sampler, kdim=kdim).to(dtype).train()
    gq, gk, hk = _inputs(t_q, t_k, kdim=kdim or EMBED)
    kmask = None if case == "causal" else padding_mask([t_k, 4, 2], t_k, left_pad=True)
    amask = causal_mask(t_q, t_k) if case == "causal" else None
    shape = (3, HEADS, t_q, t_k)
    torch.manual_seed(5)
    noise = N.gumbel_noise(shape)  # what the module draws after the same seed
    x = [t.clone().to(dtype).requires_grad_() for t in (gq, gk, hk)]
    torch.manual_seed(5)
    g_out, h_out, probs, sample = m.two_stream_forward(x[0], x[1], x[2], key_padding_mask=kmask, attn_mask=amask)
    xr = [t.clone().requires_grad_() for t in (gq, gk, hk)]
    ref = reference_two_stream(m, *xr, kmask, amask, noise, sampler)
    tol = dict(atol=1e-10, rtol=0) if dtype == torch.float64 else dict(atol=2e-5, rtol=1e-5)
    for got, want in zip((g_out, h_out, probs, sample), ref):
        torch.testing.assert_close(got.double(), want, **tol)
    if kmask is not None:  # no attention, ever, on padded keys
        assert (sample.masked_select(kmask[:, None, None, :]) == 0).all()
        assert (probs.masked_select(kmask[:, None, None, :]) == 0).all()
    # Gradients of both streams' outputs, to the inputs and to every weight.
    gen = torch.Generator().manual_seed(3)
    wg, wh = torch.randn(g_out.shape, generator=gen, dtype=torch.float64), torch.randn(h_out.shape, generator=gen,
                                                                                         dtype=torch.float64)
    params = [p for _, p in m.named_parameters()]
    got = torch.autograd.grad((g_out.double() * wg).sum() + (h_out.double() * wh).sum(), x + params,
                              allow_unused=True)
    m64 = m.double()
    params64 = [p for _, p in m64.named_parameters()]
    ref = reference_two_stream(m64, *xr, kmask, amask, noise, sampler)
    want = torch.autograd.grad((ref[0] * wg).sum() + (ref[1] * wh).sum(), xr + params64, allow_unused=True)
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a.double(), b, **tol)


@pytest.mark.parametrize("case", ["self_padded", "causal", "cross_padded"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_eval_model_stream_by_index_equals_the_one_hot_product_bit_for_bit(case, dtype, monkeypatch):
    """Inference: the model stream gathers v' at the controller's argmax; both
    streams' outputs equal the one-hot product's bit for bit, and S (the
    exact one-hot) is built only when asked for."""
    kdim = 12 if case == "cross_padded" else None
    t_q, t_k = (5, 7) if case == "cross_padded" else (6, 6)
    m = _attention("gumbel", kdim=kdim).to(dtype).eval()
    gq, gk, hk = (t.to(dtype) for t in _inputs(t_q, t_k, kdim=kdim or EMBED))
    kmask = None if case == "causal" else padding_mask([t_k, 4, 2], t_k, left_pad=True)
    amask = causal_mask(t_q, t_k) if case == "causal" else None

    def run():
        return [m.two_stream_forward(gq, gk, hk, key_padding_mask=kmask, attn_mask=amask, need_sample=need)
                for need in (True, False)]

    by_index, by_product = by_index_and_by_product(run, monkeypatch, TS)
    for got, want in zip(by_index, by_product):
        for a, b in zip(got[:3], want[:3]):
            assert a.dtype == dtype and torch.equal(a, b)
    assert torch.equal(by_index[0][3], by_product[0][3])  # the one-hot S, asked for
    assert by_index[1][3] is None  # not asked for: not built


@pytest.mark.parametrize("arch", ["transformer_discrete_tiny", "transformer_two_stream_tiny"])
def test_beam_search_by_index_equals_the_one_hot_product(arch, monkeypatch):
    d = tiny_dictionary()
    assert_beam_search_by_index_is_the_product(build_model(arch).eval(), random_tokens([7, 4, 6], 7, d), d.pad(),
                                               monkeypatch, TS)


def test_eval_sample_is_exactly_one_hot_at_the_controllers_argmax():
    model = build_model("transformer_discrete_tiny")
    d = tiny_dictionary()
    src = random_tokens([7, 4, 2], 7, d)
    out = model.encoder(src, return_attention=True)
    mask = src.eq(d.pad())
    for probs, sample in out["attention"]:
        assert set(sample.unique().tolist()) <= {0.0, 1.0}
        assert (sample.sum(-1) == 1).all()
        assert (sample.masked_select(mask[:, None, None, :]) == 0).all()
        assert torch.equal(sample.argmax(-1), probs.argmax(-1))


def _perturb_model_stream(model, seed=0):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".model_" in name:
                p.mul_(1 + torch.rand(p.shape, generator=gen))


def _controller_states(model, src, prev):
    """Every layer's g (encoder and decoder), from one training forward."""
    states = []
    hooks = [layer.register_forward_hook(lambda mod, inp, out: states.append(out[0].detach().clone()))
             for layer in list(model.encoder.layers) + list(model.decoder.layers)]
    torch.manual_seed(11)  # the same Gumbel noise for both runs
    model(src, torch.tensor([src.size(1)] * src.size(0)), prev)
    for h in hooks:
        h.remove()
    return states


@pytest.mark.parametrize("arch", ["transformer_discrete_tiny", "transformer_two_stream_tiny"])
def test_h_never_enters_g(arch):
    """Perturb every model-stream weight: every controller state is unchanged
    bit for bit (and the model stream's are not)."""
    model = build_model(arch).train()
    d = tiny_dictionary()
    src = random_tokens([6, 6], 6, d)
    prev = random_tokens([5, 5], 5, d, seed=2)
    before = _controller_states(model, src, prev)
    logits_before = model(src, torch.tensor([6, 6]), prev)[0].detach()
    _perturb_model_stream(model)
    after = _controller_states(model, src, prev)
    assert len(before) == 3 and all(torch.equal(a, b) for a, b in zip(before, after))
    assert not torch.allclose(model(src, torch.tensor([6, 6]), prev)[0], logits_before)


def _controller_parameters(model):
    """The controller's parameters: the layers' fairseq-named ones and its own embeddings."""
    return {n: p for n, p in model.named_parameters()
            if (".layers." in n and ".model_" not in n) or ".controller_" in n}


@pytest.mark.parametrize("hard", [False, True])
def test_controller_learns_only_through_s(hard, monkeypatch):
    """Default settings (each stream its own embeddings): with S detached,
    nothing reaches the controller, its embeddings included."""
    model = build_model("transformer_discrete_tiny", ["--gumbel-hard"] if hard else []).train()
    d = tiny_dictionary()
    src, prev = random_tokens([6, 4], 6, d), random_tokens([5, 5], 5, d, seed=2)
    controller = _controller_parameters(model)
    assert any("controller_embed_tokens" in n for n in controller) and len(controller) > 40

    def grads():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(4)
        model(src, torch.tensor([6, 4]), prev)[0].log_softmax(-1).sum().backward()
        return {n: (None if p.grad is None else p.grad.abs().sum().item()) for n, p in controller.items()}

    live = grads()
    # Through S the controller learns: its queries, keys, values and embeddings all get gradients.
    for name in ("encoder.layers.0.self_attn.q_proj.weight", "encoder.layers.0.self_attn.v_proj.weight",
                 "encoder.layers.0.fc1.weight", "decoder.layers.0.encoder_attn.k_proj.weight",
                 "encoder.controller_embed_tokens.weight", "decoder.controller_embed_tokens.weight"):
        assert live[name] and live[name] > 0, name
    # With S detached, nothing reaches the controller.
    real = TS.discrete_probs
    monkeypatch.setattr(TS, "discrete_probs", lambda *a, **k: real(*a, **k).detach())
    assert all(g is None or g == 0 for g in grads().values())


def _tied_two_stream(plain, arch, extra):
    """A two-stream model whose two streams both hold ``plain``'s weights
    (and one embedding: --share-stream-embeddings)."""
    model = build_model(arch, [*extra, "--share-stream-embeddings"])
    source = plain.state_dict()
    target = {name: source[name.replace("model_", "")] for name in model.state_dict()}
    model.load_state_dict(target)
    assert {n.replace("model_", "") for n in target} == set(source)
    return model


@pytest.mark.parametrize("pre_norm", [False, True])
def test_soft_two_stream_with_tied_streams_is_fairseqs_transformer(pre_norm):
    extra = ["--encoder-normalize-before", "--decoder-normalize-before"] if pre_norm else []
    torch.manual_seed(0)
    plain = build_model("transformer", extra)
    model = _tied_two_stream(plain, "transformer_two_stream_tiny", extra)
    d = tiny_dictionary()
    src, lengths = random_tokens([7, 5, 3], 7, d), torch.tensor([7, 5, 3])
    prev = random_tokens([6, 6, 6], 6, d, seed=1)
    for train in (False, True):  # eval, and training (dropout 0) with gradients
        plain.train(train), model.train(train)
        want, got = plain(src, lengths, prev)[0], model(src, lengths, prev)[0]
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    # With the weights tied, both streams carry the same states: g = h.
    out = model.encoder(src, lengths)
    torch.testing.assert_close(out["controller_out"][0], out["encoder_out"][0], atol=0, rtol=0)


@pytest.mark.parametrize("arch", ["transformer_discrete_tiny", "transformer_two_stream_tiny"])
def test_incremental_decoding_and_beam_reordering_equal_full_decoding(arch):
    model = build_model(arch)
    d = tiny_dictionary()
    # Two sentences, beam 2 (rows 0-1 and 2-3): beam search reorders the
    # hypotheses within a sentence (fairseq then leaves the encoder cache as is).
    src = random_tokens([7, 4], 7, d)[[0, 0, 1, 1]]
    lengths = torch.tensor([7, 7, 4, 4])
    prev = random_tokens([6, 6, 6, 6], 6, d, seed=3)
    order = torch.tensor([1, 1, 3, 2])
    with torch.no_grad():
        enc = model.encoder(src, lengths)
        full = model.decoder(prev, enc)[0]
        full_reordered = model.decoder(prev[order], model.encoder.reorder_encoder_out(enc, order))[0]
        state = {}
        steps = []
        for t in range(3):
            steps.append(model.decoder(prev[:, :t + 1], enc, incremental_state=state)[0][:, -1])
        model.decoder.reorder_incremental_state_scripting(state, order)
        enc_r = model.encoder.reorder_encoder_out(enc, order)
        later = [model.decoder(prev[order][:, :t + 1], enc_r, incremental_state=state)[0][:, -1]
                 for t in range(3, 6)]
    torch.testing.assert_close(torch.stack(steps, 1), full[:, :3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(later, 1), full_reordered[:, 3:], atol=1e-5, rtol=1e-5)


def test_temperature_follows_the_anneal_schedule():
    model = build_model("transformer_discrete_tiny", ["--gumbel-anneal", "2,0.5,10"])
    mods = [m for m in model.modules() if isinstance(m, TS.TwoStreamAttention)]
    assert len(mods) == 2 + 2 * 1 and all(m.gumbel_temperature == 2.0 for m in mods)
    model.train()
    model.set_num_updates(5)
    assert all(m.gumbel_temperature == pytest.approx(2 * 0.25 ** 0.5) for m in mods)


def test_capture_returns_the_controllers_a_and_the_model_streams_s():
    from fairseq_dnas.analysis.capture import capture_two_stream
    from fairseq_dnas.analysis.explaining_away import ColumnSumRecorder, summary_rows

    model = build_model("transformer_discrete_tiny")
    d = tiny_dictionary()
    src, lengths = random_tokens([7, 4], 7, d), torch.tensor([7, 4])
    prev = random_tokens([5, 5], 5, d, seed=1)
    with capture_two_stream(model) as records, torch.no_grad():
        model(src, lengths, prev)
    sites = [(site.kind, site.layer) for site, _ in records]
    assert sites == [("encoder_self", 0), ("encoder_self", 1), ("decoder_self", 0), ("decoder_cross", 0)]
    with torch.no_grad():
        used = model.encoder(src, lengths, return_attention=True)["attention"]
    for (_, attention), (probs, sample) in zip(records, used):
        assert torch.equal(attention["controller_A"], probs.transpose(0, 1))
        assert torch.equal(attention["model_S"], sample.transpose(0, 1))
    for _, attention in records:  # eval: S one-hot, A a distribution
        assert set(attention["model_S"].unique().tolist()) <= {0.0, 1.0}
        torch.testing.assert_close(attention["controller_A"].sum(-1), torch.ones(attention["controller_A"].shape[:-1]))
    # The explaining-away statistics read the same two attentions per site.
    with ColumnSumRecorder(model) as rec, torch.no_grad():
        model(src, lengths, prev)
    rows = summary_rows("m", "path", rec)
    assert [(r["attention"], r["layer"], r["component"]) for r in rows] == [
        (kind, layer, comp) for kind, layer in sites for comp in ("controller_A", "model_S")]
    assert all(r["scheme"] == "two_stream" for r in rows)


def test_several_gpus_need_find_unused_parameters():
    """The top decoder layer's controller output is not read, so its weights
    get no gradient (checked here), which torch's DDP refuses unless told."""
    from fairseq_dnas.errors import BadFlag

    model = build_model("transformer_discrete_tiny").train()
    d = tiny_dictionary()
    model(random_tokens([5], 5, d), torch.tensor([5]), random_tokens([4], 4, d, seed=1))[0].sum().backward()
    top = model.decoder.layers[-1]
    assert top.fc1.weight.grad is None and top.encoder_attn.out_proj.weight.grad is None
    assert top.encoder_attn.q_proj.weight.grad is not None  # its queries choose S
    with pytest.raises(BadFlag, match="add --find-unused-parameters"):
        build_model("transformer_discrete_tiny", ["--distributed-world-size", "2"])
    build_model("transformer_discrete_tiny", ["--distributed-world-size", "2", "--find-unused-parameters"])


@pytest.mark.parametrize("training", [True, False])
def test_dnas_scheme_samples_s_from_the_dnas_distribution(training):
    """--discrete-scheme dnas (encoder self-attention): S is drawn from the
    doubly-normalized probabilities of L (Ding et al., 2020) while the
    controller keeps A = softmax(L)."""
    m = _attention("gumbel").double().train(training)
    m.scheme = "dnas"
    gq, gk, hk = _inputs(6, 6)
    kmask = padding_mask([6, 4, 2], 6, left_pad=True)
    torch.manual_seed(5)
    noise = N.gumbel_noise((3, HEADS, 6, 6))
    torch.manual_seed(5)
    _, _, probs, sample = m.two_stream_forward(gq, gk, hk, key_padding_mask=kmask, query_padding_mask=kmask)
    q, k = (_heads(_linear(lin, gq)) for lin in (m.q_proj, m.k_proj))
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))
    log_pd = D.distribution_logits(logits, scheme="dnas", key_padding_mask=kmask, query_padding_mask=kmask)
    want = reference_sample(log_pd, noise, m.gumbel_temperature) if training else D.argmax_one_hot(log_pd)
    torch.testing.assert_close(sample, want, atol=1e-10, rtol=0)
    torch.testing.assert_close(probs, reference_sample(logits, torch.zeros_like(noise), 1.0, kmask), atol=1e-12,
                               rtol=0)
    assert not torch.equal(sample.argmax(-1), probs.argmax(-1))  # a different distribution than softmax(L)
