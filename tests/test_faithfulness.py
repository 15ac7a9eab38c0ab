"""The faithfulness metric (fairseq_dnas/analysis/faithfulness.py,
fairseq_dnas/commands/faithfulness.py, examples/discrete/classify.sh): Kendall's tau-b by
hand; attention received and gradient importance against a float64
recomputation of the classifier written out here (its own attention
probabilities, autograd on an explicitly built embedding) for roberta and
roberta_hnas; one backward per padded batch against one example at a time;
the --json lines; one-line refusals of bad input; the script and the recipe
end to end on a generated sentence<TAB>label set."""

import json
import os
import random
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, USER_DIR, run
from fairseq_dnas.reference import reference_probs
from scipy.stats import kendalltau

from fairseq_dnas.commands import sentence_classify
from fairseq_dnas.recipes import masked_lm_data

from fairseq_dnas.analysis import attention_share as AS  # noqa: E402
from fairseq_dnas.analysis import faithfulness as FA  # noqa: E402

COMMAND = ["-m", "fairseq_dnas.commands.faithfulness"]
RECIPE = os.path.join(ROOT, "examples", "discrete", "classify.sh")
HEAD = sentence_classify.HEAD
POSITIVE, NEGATIVE = ["good", "great", "lovely", "superb"], ["bad", "awful", "dull", "poor"]
FILLER = [f"w{i}" for i in range(24)]
TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--max-positions", "64"]


def _tsv(path, n, rng, header=True):
    """A learnable toy sentiment set: filler words and one sentiment word."""
    lines = ["sentence\tlabel"] if header else []
    for _ in range(n):
        y = rng.randint(0, 1)
        words = [rng.choice(FILLER) for _ in range(rng.randint(1, 10))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if y else NEGATIVE))
        lines.append(f"{' '.join(words)}\t{y}")
    path.write_text("".join(line + "\n" for line in lines))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A generated set, the recipe's data steps, and three tiny classifiers
    (roberta, roberta_hnas, the two-stream roberta_discrete) trained for a few updates."""
    return train_classifiers(tmp_path_factory.mktemp("faithfulness"), ("roberta", "roberta_hnas", "roberta_discrete"))


def train_classifiers(root, archs, extra=()):
    """The generated set under ``root`` and a tiny classifier per arch (10
    updates, ``extra`` flags added): {'root', 'files', 'data', 'ckpt': {arch:
    path}, 'logs': {arch: fairseq-train's output}}."""
    rng = random.Random(0)
    files = {split: root / f"{split}.tsv" for split in ("train", "dev", "test")}
    for (split, path), n in zip(files.items(), (160, 24, 30)):
        _tsv(path, n, rng)
    text, bin_ = root / "text", root / "bin"
    assert masked_lm_data.main(["tsv", "--train", str(files["train"]), "--valid", str(files["dev"]),
                                "--test", str(files["test"]), "--out", str(text)]) == 0
    tool = ["-m", "fairseq_dnas.recipes.sentencepiece_tool"]
    run([sys.executable, *tool, "train", "--input", text / "train.input0", "--model-prefix", bin_ / "sp",
         "--vocab-size", "50", "--threads", "1"])
    for split in ("train", "valid", "test"):
        run([sys.executable, *tool, "encode", "--model", bin_ / "sp.model", "--input", text / f"{split}.input0",
             "--output", text / f"{split}.sp"])
    data = bin_ / "data"
    for part, ext in (("input0", "sp"), ("label", "label")):
        run(["fairseq-preprocess", "--only-source", "--trainpref", text / f"train.{ext}", "--validpref",
             text / f"valid.{ext}", "--testpref", text / f"test.{ext}", "--destdir", data / part, "--workers", "1"])
    ckpt, logs = {}, {}
    for arch in archs:
        save = root / arch
        proc = run(["fairseq-train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction",
             "--criterion", "sentence_prediction", "--num-classes", "2", "--init-token", "0",
             "--separator-token", "2", "--arch", arch, *TINY, "--cpu", "--optimizer", "adam", "--lr", "3e-3",
             "--batch-size", "16", "--max-update", "10", "--no-progress-bar", "--seed", "1",
             "--no-epoch-checkpoints", "--dropout", "0.1", "--attention-dropout", "0.1", "--save-dir", save,
             *extra])
        ckpt[arch] = save / "checkpoint_last.pt"
        logs[arch] = proc.stdout + proc.stderr
    return {"root": root, "files": files, "data": data, "ckpt": ckpt, "logs": logs}


# --- pure functions -----------------------------------------------------------


def test_kendall_tau_b_by_hand():
    # 5 concordant pairs, 1 discordant: (5 - 1) / 6.
    assert FA.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6, abs=1e-15)
    # One tie in each vector: 4 concordant, 0 discordant, 6 pairs, 1 tied in
    # a, 1 tied in g: tau-b = 4 / sqrt((6 - 1) (6 - 1)) = 0.8 (tau-a would be 4/6).
    assert FA.kendall_tau([1, 1, 2, 3], [1, 2, 2, 3]) == pytest.approx(0.8, abs=1e-15)
    assert FA.kendall_tau([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0, abs=1e-15)
    # Undefined: fewer than 2 values, or a constant vector.
    assert FA.kendall_tau([1.0], [2.0]) is None
    assert FA.kendall_tau([2, 2, 2], [1, 2, 3]) is None
    assert FA.kendall_tau([1, 2, 3], [5, 5, 5]) is None


def test_summary_counts_the_examples_left_out():
    s = FA.summarize([0.5, None, -0.5, 1.0, None], [1, 0, 1, 1, 0], [1, 1, 1, 0, 0])
    assert s["n"] == 5 and s["left_out"] == 2
    assert s["accuracy"] == pytest.approx(3 / 5)
    assert s["tau_mean"] == pytest.approx(1 / 3) and s["tau_std"] == pytest.approx(np.std([0.5, -0.5, 1.0]))


def test_attention_received_sums_real_queries_and_drops_special_keys():
    g = torch.Generator().manual_seed(0)
    layers, heads, batch, t = 2, 3, 2, 5
    probs = [torch.rand(heads, batch, t, t, generator=g, dtype=torch.float64) for _ in range(layers)]
    padding = torch.tensor([[False] * 5, [False, False, False, False, True]])
    special = torch.tensor([[True, False, False, False, True], [True, False, False, True, False]])
    a = FA.attention_received(probs, padding, special)
    for b in range(batch):
        for j in range(t):
            expected = 0.0
            if not padding[b, j] and not special[b, j]:
                expected = sum(float(p[h, b, i, j]) for p in probs for h in range(heads)
                               for i in range(t) if not padding[b, i])
            assert float(a[b, j]) == pytest.approx(expected, abs=1e-12)


def test_special_positions_are_the_first_and_the_last_real_token():
    tokens = torch.tensor([[0, 7, 8, 2], [0, 9, 2, 1]])
    padding = tokens.eq(1)
    assert FA.special_positions(tokens, padding, 0).tolist() == [[True, False, False, True],
                                                                 [True, False, True, False]]
    assert FA.special_positions(tokens, padding, None).tolist() == [[False, False, False, True],
                                                                    [False, False, True, False]]


def test_importance_forms():
    grad = torch.tensor([[[3.0, 4.0], [1.0, -2.0]]], dtype=torch.float64)
    e = torch.tensor([[[1.0, 1.0], [2.0, 2.0]]], dtype=torch.float64)
    assert FA.importance(grad, e, "grad").tolist() == [[5.0, 5.0 ** 0.5]]
    assert FA.importance(grad, e, "grad-x-input").tolist() == [[7.0, 2.0]]
    with pytest.raises(ValueError, match="grad-x-input"):
        FA.importance(grad, e, "saliency")


def test_two_stream_layers_are_read_by_name():
    s, a = torch.zeros(1), torch.ones(1)
    assert FA.pick_stream({"self": s}, "controller") is s  # single stream: the same for both
    assert FA.pick_stream({"model": s, "controller": a}, "model") is s
    assert FA.pick_stream({"model": s, "controller": a}, "controller") is a
    with pytest.raises(ValueError, match="controller, model"):
        FA.pick_stream({"model": s, "controller": a}, "other")


def test_attention_share_by_hand():
    # (T, B, C) = (3, 2, 2); example 1's last position is padding.
    o = torch.tensor([[[3.0, 4.0], [0.0, 1.0]], [[1.0, 0.0], [6.0, 8.0]], [[0.0, 2.0], [9.0, 9.0]]],
                     dtype=torch.float64)
    x = torch.tensor([[[0.0, 10.0], [2.0, 0.0]], [[0.0, 4.0], [0.0, 5.0]], [[1.0, 0.0], [0.0, 0.0]]],
                     dtype=torch.float64)
    padding = torch.tensor([[False, False, False], [False, False, True]])
    r = AS.attention_share(o, x, padding)
    # example 0: 5/10, 1/4, 2/1; example 1: 1/2, 10/5 (its padded token, with x = 0, left out)
    assert r.dtype == torch.float64 and r.tolist() == [0.5, 0.25, 2.0, 0.5, 2.0]
    s = AS.share_summary([[r[:3], r[3:]], [torch.tensor([1.0, 3.0], dtype=torch.float64)]])
    assert s["mean"] == [pytest.approx(5.25 / 5, abs=1e-15), 2.0]
    assert s["median"] == [0.5, 2.0]  # 0.25 0.5 0.5 2 2; (1 + 3) / 2


ENCODERS = ("roberta", "roberta_dnas", "roberta_hnas", "roberta_discrete_single", "roberta_discrete",
            "roberta_two_stream")


def _ratios(o, x, padding):
    """||o_tb|| / ||x_tb|| token by token, batch-major, non-padding only."""
    return torch.tensor([float(o[t, b].norm() / x[t, b].norm()) for b in range(padding.shape[0])
                         for t in range(padding.shape[1]) if not padding[b, t]], dtype=torch.float64)


@pytest.mark.parametrize("arch", ENCODERS)
def test_attention_share_of_every_encoder_equals_a_recomputation(arch):
    """The hooks' r_l against each layer's attention called directly on the
    layer's input (single stream: the encoder's inner states; two streams:
    ``two_stream_forward`` on g and h, layer by layer), in float64, for a
    tiny model of every encoder the plugin trains; a two-stream encoder
    reports both streams, by name."""
    import fairseq_dnas.plugin  # noqa: F401  (the discrete and two-stream architectures)
    from test_roberta_dnas import build, tokens

    from fairseq_dnas.modules.two_stream import zero_pads

    model = build(f"{arch}_small", seed=1)
    model.register_classification_head(HEAD, num_classes=2)
    model = model.double().eval()
    enc = model.encoder.sentence_encoder
    for layer in enc.layers:
        assert not layer.normalize_before  # post-norm: the attention reads the layer input itself
        layer.self_attn.q_proj.weight.data *= 30.0  # peaked attention: the schemes differ
    x = tokens(model)
    padding = x.eq(enc.padding_idx)
    assert padding.any()
    with AS.ResidualAttention(model) as residual:
        FA.explain_batch(model, x, HEAD, 0)
    got = residual.shares(padding)
    expected = {}
    with torch.no_grad():
        if arch in ("roberta_discrete", "roberta_two_stream"):
            h, _ = enc.forward_embedding(x)
            g = enc.controller_embedding(x)
            g, h = zero_pads(g, padding).transpose(0, 1), zero_pads(h, padding).transpose(0, 1)
            for layer in enc.layers:
                g_att, h_att, _, _ = layer.self_attn.two_stream_forward(
                    g, g, h, key_padding_mask=padding, query_padding_mask=padding)
                expected.setdefault("controller", []).append(_ratios(g_att, g, padding))
                expected.setdefault("model", []).append(_ratios(h_att, h, padding))
                g, h, _, _ = layer(g, h, padding)
        else:
            _, extra = model(x, features_only=True, return_all_hiddens=True)
            for layer, h in zip(enc.layers, extra["inner_states"]):  # inner_states[l]: layer l's input
                o, _ = layer.self_attn(query=h, key=h, value=h, key_padding_mask=padding)
                expected.setdefault("self", []).append(_ratios(o, h, padding))
    assert set(got) == set(expected) and all(len(got[k]) == len(enc.layers) for k in got)
    for name in expected:
        for a, b in zip(got[name], expected[name]):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
            assert float(a.min()) > 0 and float(a.std()) > 0


def test_attention_share_needs_a_forward():
    import fairseq_dnas.plugin  # noqa: F401
    from test_roberta_dnas import build

    model = build("roberta_small")
    with AS.ResidualAttention(model) as residual:
        pass
    with pytest.raises(RuntimeError, match="run one forward"):
        residual.shares(torch.zeros(1, 3, dtype=torch.bool))


# --- against a float64 recomputation -------------------------------------------


def _float64_model(path, hnas):
    """The checkpoint in float64, eval mode, with peaked attention and u
    different per layer and head (so that each term matters)."""
    model, task, data = sentence_classify.load(str(path))
    model = model.double().eval()
    for n, layer in enumerate(model.encoder.sentence_encoder.layers):
        layer.activation_fn = F.gelu  # fairseq's gelu rounds through float32
        layer.self_attn.q_proj.weight.data *= 30.0
        if hnas:
            layer.self_attn.hybrid_logit.data = torch.tensor([-1.0 + n, 0.7 - n], dtype=torch.float64)
    return model, task, data


def _probs(scores, scheme, u):
    """Differentiable attention probabilities of one unpadded example, (H, T, T):
    UNAS a softmax over keys; DNAS normalized over queries, then over keys
    (one Sinkhorn round, in the log domain); HNAS u DNAS + (1 - u) UNAS."""
    unas = scores.softmax(-1)
    log = scores - scores.logsumexp(-2, keepdim=True)
    dnas = (log - log.logsumexp(-1, keepdim=True)).exp()
    if scheme == "unas":
        return unas
    if scheme == "dnas":
        return dnas
    u = u.double()[:, None, None]
    return u * dnas + (1 - u) * unas


def _reference(model, ids, residual=None, detach=False):
    """(class probabilities, per-layer attention (H, T, T), {point: (grad,
    input)}) of one example, the encoder written out in float64 (post-norm
    RoBERTa: learned positions, embedding layer norm, attention, FFN,
    classification head on <s>); the points: 'h0' (the embedding layer
    norm's output, the thesis's h0) and 'embed_tokens' (the embedding rows
    themselves), the gradient of y_hat at each by autograd. ``residual``: a
    list that gets, per layer, (attention output o, layer input x), (T, C).
    ``detach``: the probabilities enter P v as constants (Jain & Wallace's
    code), the gradient flows through v only."""
    enc = model.encoder.sentence_encoder
    P = lambda t: t.detach().double()  # noqa: E731
    t = len(ids)
    e = P(enc.embed_tokens.weight)[ids].clone().requires_grad_(True)
    x = enc.embed_scale * e + P(enc.embed_positions.weight)[enc.padding_idx + 1 + torch.arange(t)]
    ln = enc.layernorm_embedding
    x = h0 = F.layer_norm(x, x.shape[-1:], P(ln.weight), P(ln.bias), ln.eps)
    attention = []
    for layer in enc.layers:
        assert not layer.normalize_before
        m = layer.self_attn
        h, d = m.num_heads, m.head_dim

        def heads(lin, scale=1.0):
            return (F.linear(x, P(lin.weight), P(lin.bias)) * scale).view(t, h, d).transpose(0, 1)

        q, k, v = heads(m.q_proj, m.scaling), heads(m.k_proj), heads(m.v_proj)
        scores = q @ k.transpose(-1, -2)
        u = getattr(m, "hybrid_weight", None)
        u = None if u is None else u.detach()
        p = _probs(scores, getattr(m, "scheme", "unas"), u)
        # The probabilities of the tests' reference implementation, too.
        ref = reference_probs(scores[None], getattr(m, "scheme", "unas"), hybrid_weight=u)[0]
        torch.testing.assert_close(p.detach(), ref, atol=1e-12, rtol=0)
        attention.append(p.detach())
        pv = (p.detach() if detach else p) @ v  # detach: P a constant, the gradient through v only
        o = F.linear(pv.transpose(0, 1).reshape(t, h * d), P(m.out_proj.weight), P(m.out_proj.bias))
        if residual is not None:
            residual.append((o.detach(), x.detach()))
        n1, n2 = layer.self_attn_layer_norm, layer.final_layer_norm
        x = F.layer_norm(x + o, x.shape[-1:], P(n1.weight), P(n1.bias), n1.eps)
        f = F.gelu(F.linear(x, P(layer.fc1.weight), P(layer.fc1.bias)))
        f = F.linear(f, P(layer.fc2.weight), P(layer.fc2.bias))
        x = F.layer_norm(x + f, x.shape[-1:], P(n2.weight), P(n2.bias), n2.eps)
    head = model.classification_heads[HEAD]
    z = torch.tanh(F.linear(x[0], P(head.dense.weight), P(head.dense.bias)))
    probs = F.linear(z, P(head.out_proj.weight), P(head.out_proj.bias)).softmax(-1)
    grad_h0, grad_e = torch.autograd.grad(probs[probs.argmax()], (h0, e))
    return probs.detach(), attention, {"h0": (grad_h0, h0.detach()), "embed_tokens": (grad_e, e.detach())}


def _examples(tiny, model, task, data, n):
    sp = sentence_classify.spm_model(type("A", (), {"spm": None})(), data)
    sentences, gold = sentence_classify.read_labelled(str(tiny["files"]["test"]), sentence_classify.labels_of(task))
    return sentence_classify.encode(model, task, sp, sentences[:n])


@pytest.mark.parametrize("arch", ["roberta", "roberta_hnas"])
def test_attention_and_importance_match_a_float64_recomputation(tiny, arch):
    model, task, data = _float64_model(tiny["ckpt"][arch], arch == "roberta_hnas")
    rows = _examples(tiny, model, task, data, 8)
    assert len({len(r) for r in rows}) > 2  # padding in the batch
    x = sentence_classify.pad_batch(rows, task.source_dictionary.pad())
    with AS.ResidualAttention(model) as residual:
        r = FA.explain_batch(model, x, HEAD, task.cfg.init_token)  # importance at h0 (the default)
    (shares,) = residual.shares(x.eq(task.source_dictionary.pad())).values()  # one stream: 'self'
    expected_shares = [[] for _ in shares]
    # fairseq's MultiheadAttention (UNAS) returns its weights from a float32
    # softmax (fairseq.utils.softmax) whatever the model's dtype; the
    # plugin's attention (HNAS) computes them in the model's dtype.
    atol = 1e-5 if arch == "roberta" else 1e-10
    for b, ids in enumerate(rows):
        pairs = []
        probs, attention, points = _reference(model, ids, pairs)
        for n, (o, h) in enumerate(pairs):  # r_lt = ||o_t|| / ||x_t||, every token of the example
            expected_shares[n].append(o.norm(dim=-1) / h.norm(dim=-1))
        grad, e = points["h0"]
        t = len(ids)
        torch.testing.assert_close(r["probs"][b], probs, atol=1e-12, rtol=0)
        # a_j: every layer, head and query (<s> and </s> included), keys 1..T-2.
        a = sum(p.sum(dim=(0, 1)) for p in attention)[1:t - 1]
        real = r["real"][b]
        assert real.tolist() == [False] + [True] * (t - 2) + [False] * (x.shape[1] - t + 1)
        torch.testing.assert_close(r["attention"][b][real].double(), a, atol=atol, rtol=0)
        g = grad[1:t - 1]
        torch.testing.assert_close(r["importance"]["grad"][b][real], g.norm(dim=-1), atol=1e-12, rtol=1e-9)
        torch.testing.assert_close(r["importance"]["grad-x-input"][b][real], (g * e[1:t - 1]).sum(-1).abs(),
                                   atol=1e-12, rtol=1e-9)
        assert not r["attention"][b][~real].any() and not r["importance"]["grad"][b][~real].any()
    # Not a trivial case: attention is far from uniform and u differs per head.
    assert float(r["attention"][r["real"]].std()) > 0.1
    # Attention's share of the residual stream, batch-major over the non-padding tokens.
    for got, want in zip(shares, expected_shares):
        torch.testing.assert_close(got, torch.cat(want), atol=1e-12, rtol=1e-10)
        assert float(got.std()) > 0


def test_h0_and_the_token_embedding_are_different_points(tiny):
    """RoBERTa's embedding LayerNorm divides each position by its own
    standard deviation and projects: the gradient at h0 (the thesis's,
    Section 5.4) is not the gradient at the output of embed_tokens, in norm
    and in ranking. at='embed_tokens' keeps the old point, checked against
    the same float64 recomputation."""
    model, task, data = _float64_model(tiny["ckpt"]["roberta"], False)
    assert model.encoder.sentence_encoder.layernorm_embedding is not None
    rows = _examples(tiny, model, task, data, 8)
    x = sentence_classify.pad_batch(rows, task.source_dictionary.pad())
    at_h0 = FA.explain_batch(model, x, HEAD, 0)
    at_e = FA.explain_batch(model, x, HEAD, 0, at="embed_tokens")
    rankings_differ = False
    for b, ids in enumerate(rows):
        t = len(ids)
        _, _, points = _reference(model, ids)
        real = at_e["real"][b]
        g, e = points["embed_tokens"]
        torch.testing.assert_close(at_e["importance"]["grad"][b][real], g[1:t - 1].norm(dim=-1),
                                   atol=1e-12, rtol=1e-9)
        torch.testing.assert_close(at_e["importance"]["grad-x-input"][b][real],
                                   (g[1:t - 1] * e[1:t - 1]).sum(-1).abs(), atol=1e-12, rtol=1e-9)
        g0, ge = at_h0["importance"]["grad"][b][real], at_e["importance"]["grad"][b][real]
        assert not torch.allclose(g0, ge, rtol=1e-3)
        if len(g0) > 1 and not torch.equal(g0.argsort(), ge.argsort()):
            rankings_differ = True
    assert rankings_differ
    with pytest.raises(ValueError, match="h0, embed_tokens"):
        FA.explain_batch(model, x, HEAD, 0, at="output")


@pytest.mark.parametrize("arch", ["roberta", "roberta_hnas"])
def test_one_backward_per_padded_batch_equals_one_example_at_a_time(tiny, arch):
    model, task, data = _float64_model(tiny["ckpt"][arch], arch == "roberta_hnas")
    rows = _examples(tiny, model, task, data, 12)
    pad = task.source_dictionary.pad()
    batch = FA.explain_batch(model, sentence_classify.pad_batch(rows, pad), HEAD, 0)
    for b, ids in enumerate(rows):
        one = FA.explain_batch(model, ids[None], HEAD, 0)
        t = len(ids)
        torch.testing.assert_close(batch["probs"][b], one["probs"][0], atol=1e-12, rtol=0)
        # UNAS weights come from fairseq's float32 softmax (see above).
        torch.testing.assert_close(batch["attention"][b][:t], one["attention"][0],
                                   atol=1e-5 if arch == "roberta" else 1e-12, rtol=0)
        for form in FA.IMPORTANCE_FORMS:
            torch.testing.assert_close(batch["importance"][form][b][:t], one["importance"][form][0],
                                       atol=1e-13, rtol=1e-10)


def test_a_two_stream_encoder_is_read_by_stream_name(tiny):
    """roberta_discrete: 'model' sums the model stream's S (one-hot rows in
    eval), 'controller' the controller's A, each as the model used them
    (read independently here through capture_two_stream); the importance
    does not depend on the choice."""
    from fairseq_dnas.analysis.capture import capture_two_stream

    model, task, data = sentence_classify.load(str(tiny["ckpt"]["roberta_discrete"]))
    model = model.double().eval()
    rows = _examples(tiny, model, task, data, 6)
    x = sentence_classify.pad_batch(rows, task.source_dictionary.pad())
    by_model = FA.explain_batch(model, x, HEAD, 0, attention="model")
    by_controller = FA.explain_batch(model, x, HEAD, 0, attention="controller")
    with capture_two_stream(model, decoder=False) as records, torch.no_grad():
        model(x, features_only=True, classification_head_name=HEAD)
    assert len(records) == len(model.encoder.sentence_encoder.layers)
    query = (~x.eq(task.source_dictionary.pad())).double()[None, :, :, None]
    for name, got in (("model_S", by_model), ("controller_A", by_controller)):
        a = sum((parts[name].double() * query).sum(dim=(0, 2)) for _, parts in records)
        torch.testing.assert_close(got["attention"], a * got["real"].double(), atol=1e-12, rtol=0)
    S = torch.stack([parts["model_S"] for _, parts in records])
    assert set(S.unique().tolist()) <= {0.0, 1.0}  # argmax rows at inference
    assert not torch.equal(by_model["attention"], by_controller["attention"])
    for form in FA.IMPORTANCE_FORMS:
        torch.testing.assert_close(by_model["importance"][form], by_controller["importance"][form], atol=0, rtol=0)


# fairseq's Python attention path computes its softmax in float32 (above).
UNAS_PYTHON_PATH = dict(atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("arch", ["roberta", "roberta_hnas"])
def test_detached_attention_matches_a_float64_recomputation(tiny, arch):
    """detach_attention=True against the float64 recomputation whose
    probabilities enter P v as constants; the attention and the prediction
    are those of the ordinary run, and the importance is not (the option is
    not a no-op where attention matters): per sentence tau differs."""
    model, task, data = _float64_model(tiny["ckpt"][arch], arch == "roberta_hnas")
    rows = _examples(tiny, model, task, data, 8)
    x = sentence_classify.pad_batch(rows, task.source_dictionary.pad())
    plain = FA.explain_batch(model, x, HEAD, 0)
    r = FA.explain_batch(model, x, HEAD, 0, detach_attention=True)
    # Detaching sends fairseq's softmax attention (roberta) through its Python
    # path (the projections must be called), whose softmax is float32 whatever
    # the model's dtype (fairseq.utils.softmax): float32 rounding there.
    tol = UNAS_PYTHON_PATH if arch == "roberta" else dict(atol=1e-12, rtol=1e-9)
    torch.testing.assert_close(r["probs"], plain["probs"], atol=tol["atol"], rtol=0)
    torch.testing.assert_close(r["attention"], plain["attention"], atol=1e-12, rtol=0)
    taus_differ = 0
    for b, ids in enumerate(rows):
        t = len(ids)
        for at, detach in (("h0", True), ("h0", False)):
            grad, e = _reference(model, ids, detach=detach)[2][at]
            got, close = (r, tol) if detach else (plain, dict(atol=1e-12, rtol=1e-9))
            real = got["real"][b]
            g = grad[1:t - 1]
            torch.testing.assert_close(got["importance"]["grad"][b][real], g.norm(dim=-1), **close)
            torch.testing.assert_close(got["importance"]["grad-x-input"][b][real], (g * e[1:t - 1]).sum(-1).abs(),
                                       **close)
        a = plain["attention"][b][real].tolist()
        tau = [FA.kendall_tau(a, d["importance"]["grad"][b][real].tolist()) for d in (plain, r)]
        taus_differ += tau[0] != tau[1]
    assert not torch.allclose(r["importance"]["grad"], plain["importance"]["grad"], rtol=1e-3)
    assert taus_differ > 0


def test_detached_attention_at_the_token_embedding(tiny):
    """The option composes with at='embed_tokens' (the same float64 recomputation)."""
    model, task, data = _float64_model(tiny["ckpt"]["roberta"], False)
    rows = _examples(tiny, model, task, data, 4)
    x = sentence_classify.pad_batch(rows, task.source_dictionary.pad())
    r = FA.explain_batch(model, x, HEAD, 0, at="embed_tokens", detach_attention=True)
    for b, ids in enumerate(rows):
        t = len(ids)
        g, _ = _reference(model, ids, detach=True)[2]["embed_tokens"]
        torch.testing.assert_close(r["importance"]["grad"][b][r["real"][b]], g[1:t - 1].norm(dim=-1),
                                   **UNAS_PYTHON_PATH)


@pytest.mark.parametrize("arch", ["roberta_discrete_single", "roberta_discrete"])
def test_detaching_the_argmax_of_discrete_attention_changes_nothing(tiny, arch):
    """At inference the discrete sample S is an argmax, a constant of its
    input already, and the two-stream model stream reads the controller
    only through S: the detached importance equals the ordinary one exactly
    (what docs/analysis.md says detaching means for the sample)."""
    if arch == "roberta_discrete":  # trained (tiny fixture)
        model, task, data = sentence_classify.load(str(tiny["ckpt"]["roberta_discrete"]))
        model = model.double().eval()
        x = sentence_classify.pad_batch(_examples(tiny, model, task, data, 6), task.source_dictionary.pad())
    else:  # built, as the attention-share test does
        import fairseq_dnas.plugin  # noqa: F401
        from test_roberta_dnas import build, tokens

        model = build(f"{arch}_small", seed=1)
        model.register_classification_head(HEAD, num_classes=2)
        model = model.double().eval()
        x = tokens(model)
    plain = FA.explain_batch(model, x, HEAD, 0)
    detached = FA.explain_batch(model, x, HEAD, 0, detach_attention=True)
    assert float(plain["importance"]["grad"].max()) > 0
    for form in FA.IMPORTANCE_FORMS:
        torch.testing.assert_close(detached["importance"][form], plain["importance"][form], atol=0, rtol=0)


def test_detaching_refuses_a_forward_that_never_called_the_projections(tiny):
    model, _, _ = sentence_classify.load(str(tiny["ckpt"]["roberta"]))
    with FA.DetachedAttention(model) as detached:
        pass
    with pytest.raises(RuntimeError, match="not detached"):
        detached.check()


def test_training_mode_is_refused(tiny):
    model, task, _ = sentence_classify.load(str(tiny["ckpt"]["roberta"]))
    with pytest.raises(ValueError, match="eval"):
        FA.explain_batch(model.train(), torch.tensor([[0, 5, 6, 2]]), HEAD, 0)


# --- the script -----------------------------------------------------------------


def _script(*args, check=True):
    return run([sys.executable, *COMMAND, *map(str, args)], check=check)


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_json_lines_and_summary(tiny, tmp_path):
    out = tmp_path / "gxi.jsonl"
    proc = _script(tiny["ckpt"]["roberta_hnas"], "--test", tiny["files"]["test"], "--importance", "grad-x-input",
                   "--json", out, "--batch", "7")
    (summary,) = [json.loads(line) for line in proc.stdout.splitlines()]
    rows = _read_jsonl(out)
    sentences = tiny["files"]["test"].read_text().splitlines()[1:]
    assert [r["index"] for r in rows] == list(range(len(sentences))) == list(range(summary["n"]))
    model, task, data = sentence_classify.load(str(tiny["ckpt"]["roberta_hnas"]))
    fed = _examples(tiny, model, task, data, len(sentences))
    for r, ids, line in zip(rows, fed, sentences):
        assert set(r) == {"index", "tokens", "attention", "importance", "tau", "label", "prediction"}
        assert r["tokens"] == ids.tolist() and r["tokens"][0] == 0 and r["tokens"][-1] == 2
        assert len(r["attention"]) == len(r["importance"]) == len(r["tokens"]) - 2
        assert r["label"] == line.split("\t")[1] and r["prediction"] in ("0", "1")
        if r["tau"] is None:
            assert len(r["attention"]) < 2 or len(set(r["attention"])) == 1 or len(set(r["importance"])) == 1
        else:
            assert r["tau"] == pytest.approx(kendalltau(r["attention"], r["importance"]).statistic, abs=1e-12)
        # grad x input: |sum_d grad_d e_d| of the embedding rows, never above ||grad|| ||e||
        assert all(g >= 0 for g in r["importance"])
    taus = [r["tau"] for r in rows if r["tau"] is not None]
    assert summary["left_out"] == len(rows) - len(taus)
    assert summary["tau_mean"] == pytest.approx(np.mean(taus)) and summary["tau_std"] == pytest.approx(np.std(taus))
    assert summary["accuracy"] == pytest.approx(np.mean([r["label"] == r["prediction"] for r in rows]))
    assert summary["importance"] == "grad-x-input" and summary["attention"] == "model"
    # Attention's share of the residual stream per layer: mean and median over
    # every token fed (<s> and </s> included), against the float64 reference.
    ratios = [[] for _ in model.encoder.sentence_encoder.layers]
    for ids in fed:
        pairs = []
        _reference(model, ids, pairs)
        for n, (o, h) in enumerate(pairs):
            ratios[n].append(o.norm(dim=-1) / h.norm(dim=-1))
    ratios = [torch.cat(r).numpy() for r in ratios]
    assert sum(map(len, ratios)) == len(ratios) * sum(len(ids) for ids in fed)
    assert summary["attention_share"] == pytest.approx([r.mean() for r in ratios], rel=1e-4)
    assert summary["attention_share_median"] == pytest.approx([np.median(r) for r in ratios], rel=1e-4)
    assert "controller_attention_share" not in summary
    assert "attention's share of the residual stream per layer" in proc.stderr
    # The batch size changes nothing but rounding (float32 here).
    out1 = tmp_path / "one.jsonl"
    _script(tiny["ckpt"]["roberta_hnas"], "--test", tiny["files"]["test"], "--importance", "grad-x-input",
            "--json", out1, "--batch", "1")
    for r, s in zip(rows, _read_jsonl(out1)):
        np.testing.assert_allclose(r["attention"], s["attention"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r["importance"], s["importance"], rtol=1e-4, atol=1e-7)
        assert r["prediction"] == s["prediction"]


def test_a_two_stream_encoder_reports_the_share_of_both_streams(tiny):
    proc = _script(tiny["ckpt"]["roberta_discrete"], "--test", tiny["files"]["test"], "--max-examples", "6")
    (summary,) = [json.loads(line) for line in proc.stdout.splitlines()]
    for key in ("attention_share", "attention_share_median", "controller_attention_share",
                "controller_attention_share_median"):
        assert len(summary[key]) == 2 and all(r > 0 for r in summary[key]), key  # TINY: 2 layers
    assert summary["attention_share"] != summary["controller_attention_share"]
    assert "controller attention's share of the residual stream" in proc.stderr


def test_two_models_overlaid_and_from_json(tiny, tmp_path):
    jsons = [tmp_path / "unas.jsonl", tmp_path / "hnas.jsonl"]
    picture = tmp_path / "tau.png"
    proc = _script(tiny["ckpt"]["roberta"], tiny["ckpt"]["roberta_hnas"], "--test", tiny["files"]["test"],
                   "--json", *jsons, "--labels", "UNAS", "HNAS", "--plot", picture)
    first = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [s["label"] for s in first] == ["UNAS", "HNAS"]
    assert "UNAS: 30 sentences, accuracy" in proc.stderr and "left out (tau undefined)" in proc.stderr
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = tmp_path / "again.png"
    proc = _script("--from-json", *jsons, "--labels", "UNAS", "HNAS", "--plot", again)
    second = [json.loads(line) for line in proc.stdout.splitlines()]
    for a, b in zip(first, second):
        for key in ("n", "accuracy", "tau_mean", "tau_std", "left_out"):
            assert a[key] == pytest.approx(b[key], abs=1e-12), key
    assert again.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _one_line_error(proc, message):
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("[faithfulness] error: ") and message in last, proc.stderr[-2000:]


def test_bad_input_gives_one_line_and_exit_1(tiny, tmp_path):
    ckpt, test = tiny["ckpt"]["roberta"], tiny["files"]["test"]
    bad_label = tmp_path / "bad.tsv"
    bad_label.write_text("a good film\t1\nan awful one\t2\n")
    one_column = tmp_path / "one.tsv"
    one_column.write_text("a good film\t1\nno label\n")
    mlm = tmp_path / "mlm.pt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state["cfg"]["task"]["_name"] = "masked_lm"
    torch.save(state, mlm)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(ckpt.read_bytes()[:2000])
    out = tmp_path / "never.jsonl"
    for args, message in [
        ((ckpt, "--test", tmp_path / "missing.tsv"), "missing.tsv: no such file"),
        ((tmp_path / "missing.pt", "--test", test), "missing.pt: no such file"),
        ((ckpt, "--test", bad_label), "label '2' is not one the model knows"),
        ((ckpt, "--test", one_column), "expected 'sentence<TAB>label', found 1 column"),
        ((mlm, "--test", test), "not a fine-tuned sentence classifier"),
        ((cut, "--test", test), str(cut)),
        ((ckpt, ckpt, "--test", test, "--json", out), "--json: 1 file(s) for 2 checkpoint(s)"),
        ((ckpt, mlm, "--test", test, "--json", out, tmp_path / "two.jsonl"), "not a fine-tuned sentence classifier"),
        (("--from-json", tmp_path / "missing.jsonl"), "missing.jsonl: no such file"),
        (("--from-json", test), "not a line of faithfulness.py --json"),
    ]:
        _one_line_error(_script(*args, "--batch", "4", check=False), message)
    assert not out.exists() and not (tmp_path / "two.jsonl").exists()


# --- the recipe -----------------------------------------------------------------


def _validations(log):
    """(update, dev accuracy) of every validation in a fairseq-train log."""
    import re

    out = []
    for line in log.splitlines():
        if "valid on 'valid' subset" in line:
            acc = float(re.search(r"\| accuracy ([0-9.]+)", line).group(1))
            out.append((int(re.search(r"\| num_updates (\d+)", line).group(1)), acc))
    return out


@pytest.mark.full
def test_classify_recipe_trains_to_patience_and_scores_the_best_dev_checkpoint(tiny, tmp_path):
    """classify.sh end to end: dev accuracy every 4 updates, patience 2, a
    cap of 60; the row's updates (run, best dev) against fairseq's own log
    of the validations and fairseq's rules (the best checkpoint: the last
    of the best scores; stop after 2 validations not strictly better); the
    test set scored at checkpoint_best.pt; interval checkpoints deleted."""
    files = tiny["files"]
    env = {"TRAIN": str(files["train"]), "DEV": str(files["dev"]), "TEST": str(files["test"]),
           "OUT": str(tmp_path / "out"), "ARCH": "roberta_hnas", "MAX_UPDATE": "60", "VALIDATE_INTERVAL": "4",
           "PATIENCE": "2", "WARMUP_UPDATES": "2", "LR": "3e-3", "VOCAB": "50",
           "LAYERS": "2", "DIM": "16", "FFN": "32", "HEADS": "2", "PYTHON": sys.executable}
    proc = run(["bash", RECIPE], env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "out" / "roberta_hnas-seed1"
    s = {f: json.loads((folder / f"summary-{f}.json").read_text()) for f in ("grad", "grad-x-input")}
    assert s["grad"]["checkpoint"].endswith("checkpoint_best.pt")
    row = json.loads((folder / "row.json").read_text())
    checks = _validations((folder / "train.log").read_text())
    updates = [u for u, _ in checks]
    assert updates == sorted(set(updates)) and all(u % 4 == 0 or u == 60 for u in updates)
    best = max(a for _, a in checks)
    assert row["best_update"] == max(u for u, a in checks if a == best)
    assert row["best_dev_accuracy"] == pytest.approx(best, abs=0.01)
    assert row["updates_run"] == updates[-1]
    run_best, stale = -1.0, 0
    for u, a in checks:  # fairseq's --patience: stop once 2 in a row are not strictly better
        stale = 0 if a > run_best else stale + 1
        run_best = max(run_best, a)
        if stale == 2:
            assert (u, row["stopped"]) == (row["updates_run"], "patience")
            break
    else:
        assert (row["updates_run"], row["stopped"]) == (60, "max_update")
    assert (row["validate_interval"], row["patience"], row["max_update"], row["lr_scheduler"]) == (4, 2, 60, "fixed")
    assert sorted(p.name for p in folder.glob("checkpoint*.pt")) == ["checkpoint_best.pt", "checkpoint_last.pt"]
    lines = (folder / "row.md").read_text().splitlines()
    assert lines[-1] == (f"| roberta_hnas | {100 * s['grad']['accuracy']:.1f} | {s['grad']['tau_mean']:.3f} +- "
                         f"{s['grad']['tau_std']:.3f} | {s['grad-x-input']['tau_mean']:.3f} +- "
                         f"{s['grad-x-input']['tau_std']:.3f} | {s['grad']['left_out']} of 30 | {best:.1f} | "
                         f"{row['best_update']} / {row['updates_run']} ({row['stopped']}) | "
                         f"{s['grad']['attention_share'][0]:.3f} / {s['grad']['attention_share'][-1]:.3f} |")
    assert lines[-1] in proc.stderr + proc.stdout
    assert len(_read_jsonl(folder / "faithfulness-grad.jsonl")) == 30


def test_recipe_data_step_reads_any_labels_and_refuses_unknown_ones(tmp_path, capsys):
    """masked_lm_data.py tsv: a header line is skipped when present; labels are
    any words, those of the training file."""
    train, dev, test = tmp_path / "train.tsv", tmp_path / "dev.tsv", tmp_path / "test.tsv"
    train.write_text("a puck game\thockey\nA bat game\tbaseball\n")
    dev.write_text("sentence\tlabel\nice\thockey\n")
    test.write_text("a pitch\tbaseball\n")
    out = tmp_path / "text"
    args = ["tsv", "--train", str(train), "--valid", str(dev), "--test", str(test), "--out", str(out)]
    assert masked_lm_data.main(args) == 0
    assert (out / "train.input0").read_text() == "a puck game\na bat game\n"
    assert (out / "train.label").read_text() == "hockey\nbaseball\n"
    assert (out / "valid.input0").read_text() == "ice\n"
    test.write_text("a pitch\tsoccer\n")
    assert masked_lm_data.main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"[masked_lm_data] error: {test}:1: label 'soccer' is not one of baseball, hockey"
