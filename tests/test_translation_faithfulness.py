"""The translation form of the faithfulness metric
(``faithfulness.explain_translation_batch``, ``fairseq_dnas/commands/translation_faithfulness.py``):
exact against a float64 recomputation one sentence at a time, and the
script end to end on a tiny trained model."""

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, build_model, random_tokens, run, train_tiny_translation, write_parallel_data
from fairseq_dnas.reference import reference_probs

from fairseq_dnas.analysis import faithfulness as FA
from fairseq_dnas.analysis.capture import capture_two_stream

COMMAND = ["-m", "fairseq_dnas.commands.translation_faithfulness"]


def _pairs(model, lengths, hyp_lengths, seed=0):
    """Left-padded sources, and right-padded hypotheses ending in </s> as
    fairseq's generator returns them: (src, src_lengths, prev, target)."""
    from fairseq.data import data_utils

    d = model.encoder.dictionary
    src = random_tokens(lengths, max(lengths), d, left_pad=True, seed=seed)
    hyps = [row[row.ne(d.pad())] for row in random_tokens(hyp_lengths, max(hyp_lengths), d, left_pad=False,
                                                          seed=seed + 1)]
    target = data_utils.collate_tokens(hyps, d.pad(), d.eos(), left_pad=False)
    prev = data_utils.collate_tokens(hyps, d.pad(), d.eos(), left_pad=False, move_eos_to_beginning=True)
    return src, torch.tensor(lengths), prev, target


class _Inputs:
    """Forward pre-hooks: the (query, key) each attention module of a list is
    called with, in call order."""

    def __init__(self, modules):
        self.calls = []
        self.handles = [m.register_forward_pre_hook(self, with_kwargs=True) for m in modules]

    def __call__(self, module, args, kwargs):
        query = kwargs.get("query", args[0] if args else None)
        key = kwargs.get("key", args[1] if len(args) > 1 else None)
        self.calls.append((module, query.detach().double(), key.detach().double()))

    def remove(self):
        for h in self.handles:
            h.remove()


def _scores(m, query, key):
    """(1, H, T_q, T_k) scaled dot products of one unpadded sentence, float64."""
    P = lambda t: t.detach().double()  # noqa: E731
    h, d = m.num_heads, m.head_dim
    q = F.linear(query[:, 0], P(m.q_proj.weight), P(m.q_proj.bias)) * m.scaling
    k = F.linear(key[:, 0], P(m.k_proj.weight), P(m.k_proj.bias))
    return (q.view(-1, h, d).transpose(0, 1) @ k.view(-1, h, d).transpose(0, 1).transpose(-1, -2))[None]


def _probs(m, query, key):
    """The attention a module gives one sentence, from its inputs: fairseq's
    softmax, DNAS's doubly normalized probabilities, or the one-hot argmax of
    a discrete module at inference."""
    s = _scores(m, query, key)
    if getattr(m, "capture_name", None) == "discrete":
        return F.one_hot(s.argmax(-1), s.shape[-1]).double()[0]
    return reference_probs(s, getattr(m, "scheme", "unas"))[0]


def _reference(model, src, prev, target):
    """One unpadded sentence in float64: (grad, h0, encoder attention per
    layer, cross-attention per layer, log p(y | x)); grad = d log p / d h0,
    h0 = embed_scale * e + positions (these encoders have no embedding
    LayerNorm), by autograd on the source embeddings e passed to the encoder
    directly: d log p / d h0 = (d log p / d e) / embed_scale."""
    enc_mods = [layer.self_attn for layer in model.encoder.layers]
    cross_mods = [layer.encoder_attn for layer in model.decoder.layers]
    two_stream = type(model).__name__ == "TransformerTwoStreamModel"
    inputs = None if two_stream else _Inputs(enc_mods + cross_mods)
    e = model.encoder.embed_tokens(src).detach().requires_grad_(True)
    try:
        with capture_two_stream(model) as records:
            enc_out = model.encoder(src, torch.tensor([src.shape[1]]), token_embeddings=e)
            out = model.decoder(prev, encoder_out=enc_out)
    finally:
        if inputs is not None:
            inputs.remove()
    logprob = model.get_normalized_probs(out, log_probs=True)[0].gather(-1, target[0, :, None]).sum()
    (grad,) = torch.autograd.grad(logprob, e)
    encoder = model.encoder
    assert encoder.layernorm_embedding is None
    h0 = encoder.embed_scale * e + encoder.embed_positions(src)
    grad = grad / encoder.embed_scale
    if two_stream:  # S as the model used it, read at its attention_tap
        enc = [parts["model_S"][:, 0].double() for site, parts in records if site.kind == "encoder_self"]
        cross = [parts["model_S"][:, 0].double() for site, parts in records if site.kind == "decoder_cross"]
    else:
        by_module = {id(m): _probs(m, q, k) for m, q, k in inputs.calls}
        enc = [by_module[id(m)] for m in enc_mods]
        cross = [by_module[id(m)] for m in cross_mods]
    return grad[0].detach(), h0[0].detach(), enc, cross, logprob.detach()


ARCHS = [("transformer", ["--share-all-embeddings"]), ("transformer_dnas", []),
         ("transformer_discrete_single", ["--share-all-embeddings"]), ("transformer_discrete", [])]


@pytest.mark.parametrize("arch,extra", ARCHS, ids=[a for a, _ in ARCHS])
def test_translation_metric_matches_a_float64_recomputation_one_sentence_at_a_time(arch, extra):
    torch.manual_seed(0)
    model = build_model(arch, extra).double().eval()
    for m in model.modules():  # peaked attention: the sums are far from uniform
        if hasattr(m, "q_proj"):
            m.q_proj.weight.data *= 8.0
    d = model.encoder.dictionary
    lengths, hyp_lengths = [7, 4, 9, 2], [5, 8, 3, 6]
    src, src_lengths, prev, target = _pairs(model, lengths, hyp_lengths)
    r = FA.explain_translation_batch(model, src, src_lengths, prev, target)
    for b, (n, m) in enumerate(zip(lengths, hyp_lengths)):
        one_src = src[b:b + 1, src.shape[1] - n:]
        grad, e, enc, cross, logprob = _reference(model, one_src, prev[b:b + 1, :m], target[b:b + 1, :m])
        torch.testing.assert_close(r["logprob"][b], logprob, atol=1e-9, rtol=1e-6)  # float32 log_softmax
        real = r["real"][b]
        pad = src.shape[1] - n
        assert real.tolist() == [False] * pad + [True] * (n - 1) + [False]  # left padding, </s> last
        assert src[b, real].ne(d.eos()).all()
        g = grad[:n - 1]
        # fairseq computes its softmaxes (MultiheadAttention's weights, the
        # decoder's log_softmax) in float32 whatever the model's dtype, so a
        # padded batch and one sentence alone agree to float32 rounding.
        torch.testing.assert_close(r["importance"]["grad"][b][real], g.norm(dim=-1), atol=1e-9, rtol=1e-5)
        torch.testing.assert_close(r["importance"]["grad-x-input"][b][real], (g * e[:n - 1]).sum(-1).abs(),
                                   atol=1e-9, rtol=1e-5)
        # encoder: every layer, head and source query (</s> included); keys without </s>.
        a_enc = sum(p.sum(dim=(0, 1)) for p in enc)[:n - 1]
        # cross: every decoder layer, head and target position of the hypothesis.
        a_cross = sum(p.sum(dim=(0, 1)) for p in cross)[:n - 1]
        # fairseq's MultiheadAttention (a plain encoder; every UNAS
        # cross-attention) gives its weights from a float32 softmax (above).
        enc_atol = 1e-5 if arch == "transformer" else 1e-10
        cross_atol = 1e-5 if arch in ("transformer", "transformer_dnas") else 1e-10
        torch.testing.assert_close(r["attention"]["encoder"][b][real].double(), a_enc, atol=enc_atol, rtol=0)
        torch.testing.assert_close(r["attention"]["cross"][b][real].double(), a_cross, atol=cross_atol, rtol=0)
        for x in (r["attention"]["encoder"], r["attention"]["cross"], r["importance"]["grad"]):
            assert not x[b][~real].any()
    assert float(r["importance"]["grad"][r["real"]].std()) > 0  # not a degenerate case
    assert not torch.allclose(r["attention"]["encoder"].double(), r["attention"]["cross"].double())


def _constant_attention(module, args, kwargs, output):
    """Forward hook: the module's output recomputed as out_proj(P v), P its
    probabilities (H, B, T_q, T_k) from a re-run without gradient, v =
    v_proj(value) with gradient."""
    from fairseq_dnas.analysis.capture import call_kwargs, head_probs

    call = call_kwargs(args, kwargs)
    _, p = head_probs(module, call)
    value = call["query"] if module.self_attention else call["value"]
    t_k, b, c = value.shape
    v = module.v_proj(value).view(t_k, b, module.num_heads, module.head_dim).permute(1, 2, 0, 3)  # (B, H, T_k, D)
    out = (p.transpose(0, 1).to(v.dtype) @ v).permute(2, 0, 1, 3).reshape(-1, b, c)  # (T_q, B, C)
    return module.out_proj(out), output[1]


@pytest.mark.parametrize("arch,extra", ARCHS[:2], ids=[a for a, _ in ARCHS[:2]])
def test_detached_attention_changes_the_importance_only(arch, extra):
    """detach_attention=True detaches every attention of the model (encoder
    self-attention, decoder self- and cross-attention: DetachedAttention
    refuses a forward in which one of them was not called): the
    log-probability and the attention stay, the importance changes, and it
    equals the ordinary metric of the model whose every attention output is
    recomputed here from its probabilities held constant."""
    torch.manual_seed(0)
    model = build_model(arch, extra).double().eval()
    for m in model.modules():
        if hasattr(m, "q_proj"):
            m.q_proj.weight.data *= 8.0
    src, src_lengths, prev, target = _pairs(model, [7, 4, 9, 2], [5, 8, 3, 6])
    plain = FA.explain_translation_batch(model, src, src_lengths, prev, target)
    with FA.DetachedAttention(model, decoder=True) as probe:
        model(src, src_lengths, prev)
    probe.check()
    assert len(probe.modules) == len(model.encoder.layers) + 2 * len(model.decoder.layers)
    r = FA.explain_translation_batch(model, src, src_lengths, prev, target, detach_attention=True)
    # Independently: every attention module's output replaced by one computed
    # here, out_proj(P v_proj(value)) with P the module's own probabilities
    # read without gradient (a constant), then the ordinary metric.
    handles = [m.register_forward_hook(_constant_attention, with_kwargs=True)
               for m in model.modules() if type(m).__name__.endswith("MultiheadAttention")]
    try:
        by_hand = FA.explain_translation_batch(model, src, src_lengths, prev, target)
    finally:
        for h in handles:
            h.remove()
    assert len(handles) == len(model.encoder.layers) + 2 * len(model.decoder.layers)
    for form in FA.IMPORTANCE_FORMS:  # fairseq's attention weights: a float32 softmax (above)
        torch.testing.assert_close(r["importance"][form], by_hand["importance"][form], atol=1e-8, rtol=1e-5)
    torch.testing.assert_close(r["logprob"], plain["logprob"], atol=1e-9, rtol=1e-6)
    for kind in ("encoder", "cross"):  # fairseq's MultiheadAttention weights: a float32 softmax (above)
        torch.testing.assert_close(r["attention"][kind], plain["attention"][kind], atol=1e-5, rtol=0)
    real = plain["real"]
    assert not torch.allclose(r["importance"]["grad"][real], plain["importance"]["grad"][real], rtol=1e-3)


def test_a_shared_embedding_table_gives_the_source_gradient_only():
    """With --share-all-embeddings the decoder embeds its input with the same
    module; the importance must still be that of the source embeddings (the
    hook keeps only the call on the source tokens)."""
    model = build_model("transformer", ["--share-all-embeddings"]).double().eval()
    assert model.encoder.embed_tokens is model.decoder.embed_tokens
    src, lengths, prev, target = _pairs(model, [5, 5], [6, 6])
    r = FA.explain_translation_batch(model, src, lengths, prev, target)
    assert r["importance"]["grad"].shape == src.shape


def test_training_mode_is_refused():
    model = build_model("transformer").train()
    src, lengths, prev, target = _pairs(model, [5], [4])
    with pytest.raises(ValueError, match="eval"):
        FA.explain_translation_batch(model, src, lengths, prev, target)


# --- the script on a tiny trained model ------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("translation_faithfulness")
    write_parallel_data(root / "raw")
    return train_tiny_translation(root, f"{root}/raw/")


def _script(*args, check=True):
    return run([sys.executable, *COMMAND, *map(str, args)], check=check)


def test_script_writes_every_sentence_and_the_summary(trained, tmp_path):
    out = [tmp_path / "plain.jsonl", tmp_path / "discrete.jsonl"]
    proc = _script(trained["ckpt"]["transformer_tiny"], trained["ckpt"]["transformer_discrete_tiny"],
                   "--data", trained["data"], "--beam", "2", "--json", *out, "--plot", tmp_path / "tau.png",
                   "--labels", "plain", "discrete")
    summaries = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [s["label"] for s in summaries] == ["plain", "discrete"]
    for path, s in zip(out, summaries):
        rows = [json.loads(line) for line in open(path)]
        assert [r["index"] for r in rows] == list(range(25))  # the 25 test sentences, in order
        for r in rows:
            assert set(r) == {"index", "tokens", "hypothesis", "logprob", "attention_encoder", "attention_cross",
                              "importance", "tau_encoder", "tau_cross"}
            n = len(r["tokens"]) - 1  # </s> is not a position
            assert len(r["attention_encoder"]) == len(r["attention_cross"]) == len(r["importance"]) == n
            assert r["hypothesis"][-1] == 2 and r["logprob"] < 0  # ends in </s>
        for kind in ("encoder", "cross"):
            taus = [r[f"tau_{kind}"] for r in rows if r[f"tau_{kind}"] is not None]
            assert s[kind]["n"] == 25 and s[kind]["left_out"] == 25 - len(taus)
            assert s[kind]["tau_mean"] == pytest.approx(sum(taus) / len(taus))
    # The discrete model at inference: each query's encoder attention is one
    # position, so the attention received by a sentence sums to at most
    # layers x heads x queries.
    layers_heads = 2 * 4
    for line in open(out[1]):
        r = json.loads(line)
        assert all(float(a).is_integer() for a in r["attention_encoder"])
        assert sum(r["attention_encoder"]) <= layers_heads * len(r["tokens"])
    assert (tmp_path / "tau.png").stat().st_size > 0


def test_script_bad_input_gives_one_line_and_exit_1(trained, tmp_path):
    ckpt = trained["ckpt"]["transformer_tiny"]
    cases = [
        ((tmp_path / "missing.pt", "--data", trained["data"]), "no such file"),
        ((ckpt, "--data", tmp_path / "nowhere"), "no such folder"),
        ((ckpt, "--data", trained["data"], "--subset", "test7"), "test7"),
        ((ckpt, "--data", trained["data"], "--json", tmp_path / "a", tmp_path / "b"), "give one each"),
    ]
    for args, message in cases:
        proc = _script(*args, check=False)
        assert proc.returncode == 1, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("[translation_faithfulness] error")]
        assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "a").exists()
