"""Receptive fields of discrete attention (J. Kinley, 2020, Appendix):
the boolean recursion and its soft form on hand-built graphs
(fairseq_dnas/analysis/receptive_field.py); the acceptance test of the analysis
(a discrete classifier at inference has gradient importance exactly 0
outside the receptive field of the position its head reads, and its
prediction does not move, bit for bit, when an embedding outside is
perturbed); the field in fairseq_dnas/commands/faithfulness.py; the training
penalty (fairseq_dnas/attention/receptive_field.py) and its criterions
--criterion <base>_rf_penalty --receptive-field-penalty C
(fairseq_dnas/criterions/receptive_field_penalty.py)."""

import os

import pytest
import torch

from fairseq_dnas.analysis import receptive_field as RF
from fairseq_dnas.attention import receptive_field as ARF
from fairseq_dnas.criterions import receptive_field_penalty as RFC


def one_hot_layer(choices, length):
    """(H, 1, T, T) one-hot attention from choices[h][i] = the key query i picks in head h."""
    s = torch.zeros(len(choices), 1, length, length)
    for h, row in enumerate(choices):
        for i, k in enumerate(row):
            s[h, 0, i, k] = 1.0
    return s


def as_sets(field):
    """(B, T, T) bool -> per example, per query, the set of keys."""
    return [[set(torch.nonzero(row).flatten().tolist()) for row in example] for example in field]


# --- pure functions ---------------------------------------------------------------


def test_boolean_fields_on_a_hand_built_graph():
    # Layer 1, two heads: head 0 sends 0->1, 1->1, 2->3, 3->3, 4->4; head 1 0->0, 1->2, 2->2, 3->4, 4->4.
    l1 = one_hot_layer([[1, 1, 3, 3, 4], [0, 2, 2, 4, 4]], 5)
    # Layer 2: 0 reads 2 (head 0), everything else reads itself.
    l2 = one_hot_layer([[2, 1, 2, 3, 4], [0, 1, 2, 3, 4]], 5)
    r1, r2 = RF.receptive_fields([l1, l2])
    # r(i, 1) = {i} U the keys i attends to in any head
    assert as_sets(r1)[0] == [{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4}]
    # r(0, 2) = r(0, 1) U r(2, 1) = {0, 1} U {2, 3}; the residual keeps r(i, 1) for the others
    assert as_sets(r2)[0] == [{0, 1, 2, 3}, {1, 2}, {2, 3}, {3, 4}, {4}]
    assert RF.field_sizes([r1, r2])[:, 0].tolist() == [[2, 2, 2, 2, 1], [4, 2, 2, 2, 1]]
    assert RF.field_of([r1, r2], 0)[:, 0].tolist() == [[True, True, False, False, False],
                                                       [True, True, True, True, False]]


def test_fields_chain_through_layers_and_leave_padding_out():
    # A chain: in every layer i attends to i + 1 (the last to itself). After
    # l layers r(i, l) = {i, ..., i + l}. Example 1 has two padded positions:
    # its padded queries attend to real keys (cleared) and nothing reaches them.
    chain = [1, 2, 3, 4, 5, 5]
    padded = [1, 2, 3, 3, 0, 1]  # positions 4 and 5 are padding
    layer = torch.cat([one_hot_layer([chain], 6), one_hot_layer([padded], 6)], dim=1)  # (1, 2, 6, 6)
    padding = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    fields = RF.receptive_fields([layer] * 3, padding)
    for l, field in enumerate(fields, 1):
        sets = as_sets(field)
        assert sets[0] == [set(range(i, min(i + l, 5) + 1)) for i in range(6)]
        assert sets[1] == [set(range(i, min(i + l, 3) + 1)) for i in range(4)] + [set(), set()]
    sizes = RF.field_sizes(fields)
    assert sizes[-1, 1].tolist() == [4, 3, 2, 1, 0, 0]


def test_soft_recursion_equals_the_boolean_fields_on_one_hot_samples():
    g = torch.Generator().manual_seed(0)
    heads, batch, t, layers = 3, 2, 7, 4
    samples = []
    for _ in range(layers):
        pick = torch.randint(0, t - 1, (heads, batch, t), generator=g)  # key t - 1 is padding in example 1
        samples.append(torch.nn.functional.one_hot(pick, t).double())
    padding = torch.zeros(batch, t, dtype=torch.bool)
    padding[1, -1] = True
    hard = RF.receptive_fields(samples, padding)
    soft = RF.soft_receptive_fields(samples, padding)
    for h, s in zip(hard, soft):
        assert torch.equal(s, h.double())
    assert int(hard[-1][0].sum()) > t  # not the identity: the recursion did something


def _soft_by_loops(samples, t):
    """The soft recursion element by element (float64, one example, no padding)."""
    s = [[1.0 if i == j else 0.0 for j in range(t)] for i in range(t)]
    for sample in samples:
        z = sample.sum(0)[0]
        s = [[min(s[i][j] + sum(float(z[i, k]) * s[k][j] for k in range(t)), 1.0) for j in range(t)]
             for i in range(t)]
    return torch.tensor(s, dtype=torch.float64)


def test_soft_fields_against_explicit_loops():
    g = torch.Generator().manual_seed(1)
    t = 5
    # Peaked rows (logits * 4), so that some entries stay below 1 and the min matters for others.
    samples = [torch.softmax(4 * torch.randn(2, 1, t, t, generator=g, dtype=torch.float64), -1) * 0.6
               for _ in range(2)]
    got = RF.soft_receptive_fields(samples)[-1][0]
    want = _soft_by_loops(samples, t)
    torch.testing.assert_close(got, want, atol=1e-15, rtol=0)
    assert 0 < int((got < 1).sum()) < t * t  # both branches of the min occur


def test_penalty_by_hand():
    # One head, three positions; the classifier reads position 0.
    s1 = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.0, 0.5, 0.5]], dtype=torch.float64)
    s2 = torch.tensor([[0.1, 0.6, 0.3], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    readers = torch.tensor([[True, False, False]])
    # One layer: s^1_0j = min(delta_0j + S_0j, 1) = (1, 0.3, 0.2): 1.5.
    p1 = RF.receptive_field_penalty([s1[None, None]], readers=readers)
    assert p1.tolist() == [pytest.approx(1.5, abs=1e-15)]
    # Two layers: s^1 = min(I + S1, 1) = rows (1, .3, .2), (.2, 1, .6), (0, .5, 1);
    # S2_0 s^1 = .1 (1, .3, .2) + .6 (.2, 1, .6) + .3 (0, .5, 1) = (.22, .78, .68);
    # s^2_0 = min((1, .3, .2) + (.22, .78, .68), 1) = (1, 1, .88): 2.88.
    p2 = RF.receptive_field_penalty([s1[None, None], s2[None, None]], readers=readers)
    assert p2.tolist() == [pytest.approx(2.88, abs=1e-14)]
    # Every position read: the mean of the three sizes. s^2_1 = min((.2, 1, .6) + (1, .3, .2), 1)
    # = (1, 1, .8): 2.8; s^2_2 = min((0, .5, 1) + (0, .5, 1), 1) = (0, 1, 1): 2.
    p_all = RF.receptive_field_penalty([s1[None, None], s2[None, None]])
    assert p_all.tolist() == [pytest.approx((2.88 + 2.8 + 2.0) / 3, abs=1e-14)]
    # --receptive-field-layers all: the mean over the two layers, 1.5 and 2.88 at <s>.
    p_layers = RF.receptive_field_penalty([s1[None, None], s2[None, None]], readers=readers, layers="all")
    assert p_layers.tolist() == [pytest.approx((1.5 + 2.88) / 2, abs=1e-14)]
    with pytest.raises(ValueError, match="final, all"):
        RF.receptive_field_penalty([s1[None, None]], layers="last")


def test_the_penalty_math_lives_beside_the_attention_and_imports_no_fairseq():
    """Imports go down: the penalty (attention/) is what the criterion and
    the analysis both use, and importing it imports no fairseq."""
    import subprocess
    import sys

    assert RF.receptive_field_penalty is ARF.receptive_field_penalty
    assert RF.soft_receptive_fields is ARF.soft_receptive_fields
    assert RFC.receptive_field_penalty is ARF.receptive_field_penalty
    code = "import sys, fairseq_dnas.attention.receptive_field; assert 'fairseq' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def test_full_final_fields_have_no_gradient_and_the_mean_over_layers_has():
    # Two heads of uniform rows over 3 positions: Z = 2/3 everywhere.
    # s^1 = min(I + Z, 1): 2/3 off the diagonal (below 1); s^2 = min(s^1 +
    # Z s^1, 1) = 1 everywhere (2/3 + 2/3 (1 + 4/3) > 1): the final field is
    # full, so the min passes no gradient; the first layer's still does.
    logits = [torch.zeros(2, 1, 3, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    lift = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)  # an uneven row, so that softmax's gradient is not 0

    def samples():
        return [torch.softmax(g + lift, -1) for g in logits]

    final = RF.receptive_field_penalty(samples(), layers="final")
    assert final.tolist() == [3.0]
    final.sum().backward()
    assert all(not g.grad.any() for g in logits)
    mean = RF.receptive_field_penalty(samples(), layers="all")
    mean.sum().backward()
    assert logits[0].grad.abs().max() > 0 and not logits[1].grad.any()  # the full top layer still gives none


def test_penalty_leaves_padding_out_and_is_per_sentence():
    g = torch.Generator().manual_seed(2)
    t = 6
    logits = torch.randn(2, 1, t, t, generator=g, dtype=torch.float64)
    padding = torch.zeros(1, t, dtype=torch.bool)
    padding[0, 4:] = True
    logits = logits.masked_fill(padding[:, None, None, :], float("-inf"))
    sample = torch.softmax(logits, -1)
    padded = RF.receptive_field_penalty([sample, sample], padding)
    # The same sentence cut to its 4 real positions gives the same value.
    cut = torch.softmax(logits[..., :4, :4], -1)
    alone = RF.receptive_field_penalty([cut, cut])
    torch.testing.assert_close(padded, alone, atol=1e-14, rtol=0)


# --- acceptance: importance 0 outside the field, exactly -----------------------------

from fairseq_dnas.analysis import faithfulness as FA  # noqa: E402
from fairseq_dnas.analysis.capture import EncoderAttention  # noqa: E402

HEAD = "sentence_classification_head"  # fairseq_dnas/commands/sentence_classify.py's head
DISCRETE = ["roberta_discrete_single", "roberta_discrete"]


def classifier(arch, seed=0):
    """A tiny discrete RoBERTa (3 layers, 2 heads, random weights) with a
    two-class head, in eval mode: argmax attention."""
    from test_roberta_dnas import build

    import fairseq_dnas.plugin  # noqa: F401  (registers the models: fairseq_dnas is imported already)

    model = build(arch, ["--encoder-layers", "3", "--encoder-attention-heads", "2"], seed=seed)
    torch.manual_seed(seed + 1)
    model.register_classification_head(HEAD, num_classes=2)
    return model.eval()


def sentences(model, lengths=(16, 11, 14, 8)):
    """<s> w ... </s>, right-padded (as sentence_classify.py feeds them)."""
    from test_roberta_dnas import tokens

    return tokens(model, lengths)


def model_stream_samples(model, x):
    """Per layer the (H, B, T, T) attention that carries values to the
    classification head, read by the capture hooks in a separate forward."""
    with EncoderAttention(model) as rec, torch.no_grad():
        model(x, features_only=True, classification_head_name=HEAD)
    return [FA.pick_stream(named, "model") for named in rec.calls[0]]


@pytest.mark.parametrize("arch", DISCRETE)
def test_importance_is_exactly_zero_outside_the_receptive_field(arch):
    model = classifier(arch)
    assert RF.is_discrete_encoder(model)
    x = sentences(model)
    padding = x.eq(model.encoder.sentence_encoder.padding_idx)
    r = FA.explain_batch(model, x, HEAD, 0)
    fields = RF.receptive_fields(model_stream_samples(model, x), padding)
    assert torch.equal(r["receptive_field"], RF.field_of(fields, 0))
    field = r["receptive_field"][-1]  # (B, T): r(0, L)
    outside, inside = r["real"] & ~field, r["real"] & field
    assert outside.any() and inside.any()  # both kinds of position occur: the test can fail
    for form in FA.IMPORTANCE_FORMS:
        g = r["importance"][form]
        assert bool((g[outside] == 0).all()), form  # exactly 0, not small
    assert bool((r["importance"]["grad"][inside] > 0).all())
    # The field grows layer by layer (the residual keeps what was reached).
    sizes = r["receptive_field"].sum(-1)
    assert bool((sizes[1:] >= sizes[:-1]).all()) and bool((sizes[-1] > 1).all())


def _logits_with_embedding_shift(model, x, delta):
    """The classifier's logits with ``delta`` (B, T, C) added to the output of
    embed_tokens, and the attention graph of that forward."""
    enc = model.encoder.sentence_encoder
    handle = enc.embed_tokens.register_forward_hook(lambda m, i, o: o + delta)
    try:
        with EncoderAttention(model) as rec, torch.no_grad():
            logits, _ = model(x, features_only=True, classification_head_name=HEAD)
    finally:
        handle.remove()
    return logits, [FA.pick_stream(named, "model") for named in rec.calls[0]]


@pytest.mark.parametrize("arch", DISCRETE)
def test_perturbing_an_embedding_outside_the_field_changes_nothing(arch):
    """The converse: the prediction is a function of the embeddings inside
    r(<s>, L) alone, as long as the argmax choices of the positions inside
    stay (a shift large enough to change one changes the field itself:
    the choice depends on every key). Shift every
    position outside the field, then every real position inside: the first
    leaves the logits bit for bit, the second moves them."""
    model = classifier(arch, seed=1)
    for layer in model.encoder.sentence_encoder.layers:
        layer.self_attn.q_proj.weight.data *= 30.0  # clear argmax margins: a small shift keeps the graph
    x = sentences(model)
    padding = x.eq(model.encoder.sentence_encoder.padding_idx)
    base, graph = _logits_with_embedding_shift(model, x, 0.0)
    field = RF.field_of(RF.receptive_fields(graph, padding), 0)[-1]
    dim = model.encoder.sentence_encoder.embed_tokens.embedding_dim
    noise = 1e-4 * torch.randn(*x.shape, dim, generator=torch.Generator().manual_seed(5))
    for region, same in (((~field) & ~padding, True), (field & ~padding, False)):
        assert region.any()
        delta = noise * region[..., None]
        logits, moved_graph = _logits_with_embedding_shift(model, x, delta)
        # The rows of every position inside the field are the same argmax
        # choices, in every layer: the computation that ends in <s>'s state
        # is the same (rows outside may change: nothing of them reaches <s>).
        if same:
            assert all(torch.equal(a[:, field], b[:, field]) for a, b in zip(graph, moved_graph))
            assert torch.equal(logits, base)
        else:
            assert (logits - base).abs().max() > 0


# --- the field in fairseq_dnas/commands/faithfulness.py, and a tiny fairseq-train run with the penalty ---

import json  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402

from helpers import ROOT, run  # noqa: E402

PENALTY = ["--receptive-field-penalty", "0.1"]  # with a --criterion <base>_rf_penalty


@pytest.fixture(scope="module")
def penalized(tmp_path_factory):
    """tests/test_faithfulness.py's generated set and recipe steps, and the
    two discrete classifiers trained 10 updates with --criterion
    sentence_prediction_rf_penalty --receptive-field-penalty 0.01."""
    from test_faithfulness import train_classifiers

    return train_classifiers(tmp_path_factory.mktemp("receptive_field"), DISCRETE,
                             ("--criterion", "sentence_prediction_rf_penalty", "--receptive-field-penalty", "0.01",
                              "--log-interval", "5"))


@pytest.mark.parametrize("arch", DISCRETE)
def test_fairseq_train_with_the_penalty_logs_it(penalized, arch):
    log = penalized["logs"][arch]
    assert "done training" in log
    values = [float(v) for v in re.findall(r"rf_penalty[ =](\d+\.\d+)", log)]
    assert values, log[-2000:]
    # the mean size of <s>'s soft receptive field: at least <s> itself, at
    # most the longest sentence (1 + 11 words + </s> pieces; the set's lines are short)
    assert all(1.0 <= v <= 64 for v in values)
    assert "valid" in log and not re.search(r"\| valid .*rf_penalty", log)  # training only


def _rewired(checkpoint, path):
    """The checkpoint with every q_proj drawn afresh (seeded): after 10
    updates <s> picks itself in every head (a field of one position), with
    other queries it picks other positions."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    g = torch.Generator().manual_seed(7)
    for name, value in state["model"].items():
        if name.endswith("self_attn.q_proj.weight"):
            value.copy_(torch.randn(value.shape, generator=g, dtype=value.dtype))
    torch.save(state, path)
    return path


def test_faithfulness_script_reports_the_field_of_discrete_encoders(penalized, tmp_path):
    from fairseq_dnas.commands import sentence_classify

    test = penalized["files"]["test"]
    out = {arch: tmp_path / f"{arch}.jsonl" for arch in DISCRETE}
    ckpt = {a: _rewired(penalized["ckpt"][a], penalized["ckpt"][a].parent / "rewired.pt") for a in DISCRETE}
    proc = run([sys.executable, "-m", "fairseq_dnas.commands.faithfulness",
                *ckpt.values(), "--test", test, "--json", *out.values(),
                "--labels", *DISCRETE, "--batch", "7"])
    summaries = [json.loads(line) for line in proc.stdout.splitlines()]
    for arch, summary in zip(DISCRETE, summaries):
        rows = [json.loads(line) for line in out[arch].read_text().splitlines()]
        model, task, data = sentence_classify.load(str(ckpt[arch]))
        layers = len(model.encoder.sentence_encoder.layers)
        sizes, fractions, outside_count = [], [], 0
        for row in rows:
            # the field of <s> recomputed from one sentence alone (no padding)
            x = torch.tensor(row["tokens"])[None]
            field = FA.explain_batch(model.eval(), x, HEAD, 0)["receptive_field"][:, 0]  # (L, T)
            assert row["receptive_field"] == field[-1].nonzero().flatten().tolist()
            assert row["receptive_field"][0] == 0  # <s> is in its own field
            # the acceptance property on trained models too: importance (over the
            # real tokens, positions 1 .. T-2) is 0 exactly outside the field
            inside = set(row["receptive_field"])
            for j, g in enumerate(row["importance"], 1):
                assert (g > 0) if j in inside else (g == 0), (j, g)
            outside_count += sum(j not in inside for j in range(1, len(row["tokens"]) - 1))
            sizes.append(field.sum(-1).double())
            fractions.append(field.sum(-1).double() / len(row["tokens"]))
        inside_count = sum(len(r["receptive_field"]) for r in rows)
        print(arch, "real positions outside the field:", outside_count, "positions inside:", inside_count)
        assert outside_count > 0 and inside_count > 2 * len(rows)  # both occur, beyond <s> and </s>
        assert len(summary["receptive_field_size"]) == len(summary["receptive_field_fraction"]) == layers
        torch.testing.assert_close(torch.tensor(summary["receptive_field_size"], dtype=torch.float64),
                                   torch.stack(sizes).mean(0), atol=1e-12, rtol=0)
        torch.testing.assert_close(torch.tensor(summary["receptive_field_fraction"], dtype=torch.float64),
                                   torch.stack(fractions).mean(0), atol=1e-12, rtol=0)
        assert f"{arch}: receptive field of <s> per layer (mean over sentences): " in proc.stderr


# --- the penalty in the models ------------------------------------------------------------


def _train_mode(model):
    model.train()
    for m in model.modules():  # dropout off, the sampler on
        if hasattr(m, "p") and isinstance(getattr(m, "p"), float):
            m.p = 0.0
    return model


def _penalty(model, x, head, layers="final", **kw):
    """(P per sentence with its graph, the model's forward output): the
    criterion's computation (``penalty_stacks``, ``kept_samples``,
    ``sentence_penalty``) around one forward of ``model`` on ``x``."""
    stacks = RFC.penalty_stacks(model, {"net_input": {"src_tokens": x}}, classification=head)
    with RFC.kept_samples(stacks):
        out = model(x, **kw)
        return RFC.sentence_penalty(stacks, layers), out


@pytest.mark.parametrize("arch, extra, layers", [("roberta_discrete_single", ["--discrete-sampler", "soft"], "final"),
                                                 ("roberta_two_stream", [], "final"),
                                                 ("roberta_two_stream", [], "all")])
@pytest.mark.parametrize("head", [True, False])
def test_penalty_is_the_soft_recursion_of_the_samples_the_model_used(arch, extra, layers, head):
    """Soft samplers (S = softmax(L): deterministic, so the capture's S is the
    one the model used): P per sentence is receptive_field_penalty of the
    captured S, read at <s> for a classification criterion, at every real
    position for another; the modules keep no S afterwards."""
    from test_roberta_dnas import build

    import fairseq_dnas.plugin  # noqa: F401

    model = build(arch, extra)
    model.register_classification_head(HEAD, num_classes=2)
    _train_mode(model)
    x = sentences(model)
    padding = x.eq(model.encoder.sentence_encoder.padding_idx)
    kw = {"features_only": True, "classification_head_name": HEAD} if head else {}
    with EncoderAttention(model) as rec:
        got, _ = _penalty(model, x, head, layers, **kw)
    samples = [FA.pick_stream(named, "model") for named in rec.calls[0]]
    readers = None
    if head:
        readers = torch.zeros_like(padding)
        readers[:, 0] = True
    want = RF.receptive_field_penalty(samples, padding, readers, layers)
    torch.testing.assert_close(got.detach(), want, atol=1e-5, rtol=0)
    assert bool((got > 1).all())  # more than <s> itself: not a trivial value
    assert all(not m.keep_sample and m.kept_sample is None for m in RFC.penalty_stacks(
        model, {"net_input": {"src_tokens": x}}, head)[0][0])


@pytest.mark.parametrize("arch", DISCRETE)
def test_penalty_gradient_reaches_the_attention_logits(arch):
    from test_roberta_dnas import build

    import fairseq_dnas.plugin  # noqa: F401

    model = build(arch, [])
    model.register_classification_head(HEAD, num_classes=2)
    _train_mode(model)
    torch.manual_seed(3)
    penalty, _ = _penalty(model, sentences(model), True, features_only=True, classification_head_name=HEAD)
    penalty.sum().backward()
    layers = model.encoder.sentence_encoder.layers
    for layer in layers:  # L = q k^T: every layer's logits shape the field
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            assert proj.weight.grad is not None and proj.weight.grad.abs().max() > 0
    if arch == "roberta_discrete":
        # The field depends on S alone, which the controller decides: the
        # model stream gets no gradient from the penalty.
        model_stream = [p for n, p in model.named_parameters() if ".model_" in n]
        assert model_stream and all(p.grad is None or not p.grad.any() for p in model_stream)
    else:
        top = layers[-1].self_attn.v_proj.weight.grad  # the top layer's values reach no logits
        assert top is None or not top.any()


def _translation_loss(arch, criterion, extra=(), seed=1, stray=False):
    """(loss, sample_size, logging output, P per sentence recomputed) of
    ``criterion`` (label_smoothed_cross_entropy or its _rf_penalty) on a tiny
    batch, the model in training mode; ``stray``: one more training forward
    before the criterion's (it must not count)."""
    from fairseq.tasks.translation import TranslationTask
    from helpers import random_tokens, tiny_args, tiny_dictionary

    args = tiny_args(arch, ["--dropout", "0", "--criterion", criterion, "--label-smoothing", "0.1", *extra])
    d = tiny_dictionary()
    task = TranslationTask(args, d, d)
    torch.manual_seed(0)
    model = task.build_model(args).train()
    crit = task.build_criterion(args)
    src = random_tokens([5, 9, 7], 9, d, left_pad=True)
    tgt = random_tokens([4, 6, 3], 6, d, left_pad=False, seed=2)
    prev = torch.cat([torch.full((3, 1), d.eos()), tgt[:, :-1]], 1).masked_fill(tgt.eq(d.pad()), d.pad())
    sample = {"net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1), "prev_output_tokens": prev},
              "target": tgt, "ntokens": int(tgt.ne(d.pad()).sum()), "nsentences": 3}
    if stray:
        model(**sample["net_input"])  # outside the criterion: must not count
    torch.manual_seed(seed)
    loss, sample_size, logging_output = crit(model, sample)
    stacks = RFC.penalty_stacks(model, sample, classification=False)
    with RFC.kept_samples(stacks):  # the same noise: the same samples
        torch.manual_seed(seed)
        model(**sample["net_input"])
        p = RFC.sentence_penalty(stacks)
    return loss, sample_size, logging_output, crit, p


@pytest.mark.parametrize("arch", ["transformer_discrete_single", "transformer_discrete"])
def test_penalty_criterion_wraps_fairseqs_and_zero_changes_nothing(arch):
    base = "label_smoothed_cross_entropy"
    plain, size, log0, crit0, _ = _translation_loss(arch, base)
    zero, _, log_zero, crit_zero, _ = _translation_loss(arch, base + RFC.SUFFIX, ["--receptive-field-penalty", "0"])
    assert type(crit_zero.base) is type(crit0) and crit_zero.base.eps == crit0.eps == 0.1  # the base's own flag
    assert torch.equal(zero, plain) and "receptive_field_penalty" not in log_zero  # bit for bit
    with_penalty, size1, log1, _, p = _translation_loss(arch, base + RFC.SUFFIX, ["--receptive-field-penalty", "0.5"],
                                                        stray=True)
    assert size1 == size and p.shape == (3,)
    # encoder (2 layers) and decoder (1 layer) fields: each at least 1, at most the length
    assert bool((p > 2).all()) and bool((p <= 9 + 6).all())
    # The base criterion's own loss is unchanged (logged as before); the
    # returned one gains C * sum_b P_b * sample_size / nsentences. The
    # single-stream model leaves its fused kernel to keep S: the same noise,
    # other rounding.
    atol = 0 if arch == "transformer_discrete" else 1e-4
    torch.testing.assert_close(log1["loss"], log0["loss"], atol=atol, rtol=0)
    want = log1["loss"] + 0.5 * p.detach().sum() * size / 3
    torch.testing.assert_close(with_penalty.detach(), want, atol=1e-4, rtol=0)
    assert log1["receptive_field_penalty"] == pytest.approx(float(p.detach().sum()), abs=1e-4)
    assert log1["rf_nsentences"] == 3


@pytest.fixture(scope="module")
def translation_data(tmp_path_factory):
    from helpers import write_parallel_data

    raw = tmp_path_factory.mktemp("rf_raw")
    write_parallel_data(raw, sizes=(("train", 60), ("valid", 10), ("test", 10)))
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--destdir", raw / "bin", "--joined-dictionary", "--workers", "1"])
    return raw / "bin"


def _fairseq_train(data, save, arch, *flags, check=True):
    from helpers import USER_DIR

    return run(["fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", "--optimizer", "adam",
                "--lr", "1e-3", "--max-update", "4", "--batch-size", "16", "--no-progress-bar", "--log-interval", "2",
                "--save-dir", save, "--no-save", *flags], check=check)


@pytest.mark.full  # the classification runs of the penalized fixture prove the flag in the default tier
def test_translation_fairseq_train_with_the_penalty(translation_data, tmp_path):
    proc = _fairseq_train(translation_data, tmp_path, "transformer_discrete_tiny", *PENALTY,
                          "--criterion", "label_smoothed_cross_entropy_rf_penalty", "--label-smoothing", "0.1")
    log = proc.stdout + proc.stderr
    assert "done training" in log and re.search(r"rf_penalty[ =]\d+\.\d+", log), log[-2000:]


def test_penalty_start_switches_the_penalty_on_at_that_update_in_fairseq_train(translation_data, tmp_path):
    """Through fairseq-train, one update per log line: no rf_penalty at
    updates 1 and 2 (--receptive-field-penalty-start 2: the first two train
    on the base criterion), rf_penalty at 3 and 4."""
    proc = _fairseq_train(translation_data, tmp_path, "transformer_discrete_single_tiny", *PENALTY,
                          "--criterion", "label_smoothed_cross_entropy_rf_penalty", "--label-smoothing", "0.1",
                          "--receptive-field-penalty-start", "2", "--log-interval", "1")
    log = proc.stdout + proc.stderr
    lines = {int(m.group(1)): line for line in log.splitlines() if "train_inner" in line
             for m in [re.search(r"num_updates[ =](\d+)", line)] if m}
    assert sorted(lines) == [1, 2, 3, 4], log[-3000:]
    assert ["rf_penalty" in lines[n] for n in (1, 2, 3, 4)] == [False, False, True, True], log[-3000:]


@pytest.mark.parametrize("arch, flags, message", [
    ("transformer_discrete_single_tiny", ["--receptive-field-penalty", "-0.1"],
     "--receptive-field-penalty must be a finite number >= 0"),
    ("transformer_discrete_tiny", ["--receptive-field-penalty", "nan"],
     "--receptive-field-penalty must be a finite number >= 0"),
    ("transformer_discrete_tiny", ["--receptive-field-penalty-start", "-3"],
     "--receptive-field-penalty-start must be an update count >= 0"),
])
def test_bad_penalty_through_plain_fairseq_train_gives_one_line(translation_data, tmp_path, arch, flags, message):
    from test_discrete_models import _plain_train

    from helpers import USER_DIR

    proc = _plain_train(translation_data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", "--optimizer", "adam",
                        "--lr", "1e-3", "--max-update", "1", "--batch-size", "8", "--save-dir", tmp_path,
                        "--criterion", "cross_entropy_rf_penalty", *flags)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], errors
