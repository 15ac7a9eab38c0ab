"""fairseq_dnas.hf under torch.compile and torch.export, on the CPU paths.

Every scheme (DNAS, HNAS, discrete) in BERT, BART and T5 compiles without a
graph break (``torch._dynamo.explain``), as ``sdpa`` does; ``fullgraph=True``
in training gives eager's outputs and gradients; an eval model exports with
``torch.export.export``; the adapter's checks still refuse bad masks inside a
compiled graph; ``Trainer(torch_compile=True)`` trains. The Gumbel noise of
the discrete scheme is one opaque op of the graph with eager's draws.
Compiling is slow: in the default tier one representative of each proof
(no break: BERT HNAS; fullgraph = eager: BERT discrete, the noise op in
training; export: BERT HNAS), the rest in the full tier.
"""

import pytest
import torch
import torch._dynamo
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from fairseq_dnas import hf
from fairseq_dnas.attention import gumbel_noise
from fairseq_dnas.attention.discrete import gumbel_attention
from fairseq_dnas.hf.attention import attention_forward

BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=99,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
BART = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=2,
            encoder_ffn_dim=37, decoder_ffn_dim=37, dropout=0.0, attention_dropout=0.0, vocab_size=99,
            max_position_embeddings=64)
T5 = dict(d_model=32, d_kv=8, d_ff=37, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=99,
          dropout_rate=0.0, relative_attention_num_buckets=8, decoder_start_token_id=0, pad_token_id=0)
SCHEMES = ("dnas", "hnas", "discrete")


def build(family, scheme, **changes):
    torch.manual_seed(0)
    if family == "t5":
        model = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model("t5", **{**T5, **changes}))
    else:
        config = {**(BERT if family == "bert" else BART), **changes}
        model = AutoModel.from_config(AutoConfig.for_model(family, **config))
    return model if scheme == "sdpa" else hf.enable(model, scheme=scheme)


def inputs(family):
    """Two sequences, the second right-padded (lengths 9 and 6)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 90, (2, 9), generator=g)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, 6:] = 0
    kw = dict(input_ids=ids, attention_mask=mask)
    if family != "bert":
        kw["decoder_input_ids"] = ids[:, :5].contiguous()
    return kw


def output(family, out):
    return out.last_hidden_state if family == "bert" else out.encoder_last_hidden_state


CASES = [(f, s) for f in ("bert", "bart", "t5") for s in SCHEMES]
# one layer of each stack: tracing time grows with the layers, the code traced does not
ONE_LAYER = {"bert": dict(num_hidden_layers=1), "bart": dict(encoder_layers=1, decoder_layers=1),
             "t5": dict(num_layers=1, num_decoder_layers=1)}


@pytest.mark.parametrize("family,scheme", [c if c == ("bert", "hnas") else pytest.param(*c, marks=pytest.mark.full)
                                           for c in CASES])
def test_no_graph_breaks(family, scheme):
    torch._dynamo.reset()
    model = build(family, scheme, **ONE_LAYER[family]).train()  # every layer runs the same code
    explained = torch._dynamo.explain(model)(**inputs(family))
    assert explained.graph_break_count == 0, [str(r.reason)[:200] for r in explained.break_reasons]
    assert explained.graph_count == 1


@pytest.fixture
def fixed_noise(monkeypatch):
    """The same Gumbel noise for every draw of a shape, eager or compiled: a
    compiled graph draws its dropout masks from torch's generator, eager does
    not (dropout 0), so the generator's state, and the noise drawn after it,
    would differ. The op stays the one the graph holds."""
    def uniform(shape, generator=None):
        return torch.rand(shape, generator=torch.Generator().manual_seed(11))
    monkeypatch.setattr(gumbel_noise, "uniform_float32", uniform)


FULLGRAPH = [(*c, "aot_eager") if c == ("bert", "discrete") else pytest.param(*c, "aot_eager", marks=pytest.mark.full)
             for c in CASES] + [pytest.param("bert", "dnas", "inductor", marks=pytest.mark.full)]


@pytest.mark.parametrize("family,scheme,backend", FULLGRAPH)
def test_fullgraph_training_equals_eager(family, scheme, backend, fixed_noise):
    """Forward and backward traced as one graph (AOT autograd: ``aot_eager``
    runs the traced graphs as they are), and once through inductor's
    generated code; one layer each except the inductor case's two."""
    torch._dynamo.reset()
    model = build(family, scheme, **({} if backend == "inductor" else ONE_LAYER[family])).train()
    kw = inputs(family)
    params = [p for p in model.parameters() if p.requires_grad]
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    got = output(family, compiled(**kw))
    got_grads = torch.autograd.grad(got.square().sum(), params, allow_unused=True)
    want = output(family, model(**kw))
    want_grads = torch.autograd.grad(want.square().sum(), params, allow_unused=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for p, a, b in zip(params, got_grads, want_grads):
        a = torch.zeros_like(p) if a is None else a
        b = torch.zeros_like(p) if b is None else b
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    if scheme == "hnas":
        assert any(a is not None and a.abs().sum() > 0 for p, a in zip(params, got_grads) if p.dim() == 1
                   and p.numel() == 4)  # u learns in the compiled graph


def test_compiled_gumbel_noise_is_eagers():
    """The noise op under compile draws what eager draws for the same seed
    (NumPy's SFC64 behind one opaque op), and two draws are not merged."""
    torch._dynamo.reset()
    q, k, v = torch.randn(3, 2, 2, 5, 4, generator=torch.Generator().manual_seed(0)).unbind(0)

    def two(q, k, v):
        return gumbel_attention(q, k, v, scale=0.5, tau=1.0), gumbel_attention(q, k, v, scale=0.5, tau=1.0)

    compiled = torch.compile(two, fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    a, b = compiled(q, k, v)
    torch.manual_seed(3)
    a2, b2 = two(q, k, v)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, b)
    torch.library.opcheck(gumbel_noise._uniform_op, ([2, 3],), test_utils=("test_schema", "test_faketensor"))


def test_compiled_checks_still_refuse():
    """The mask checks are tensor ops in a compiled graph: a sliding-window
    mask still stops the forward with the eager message."""
    torch._dynamo.reset()

    class Module(torch.nn.Module):
        is_causal = False

    q, k, v = torch.randn(3, 2, 3, 6, 4).unbind(0)
    local = torch.ones(6, 6).triu(-1).tril(1).bool()[None, None].expand(2, 1, 6, 6)
    call = torch.compile(lambda q, k, v, m: attention_forward("dnas", Module(), q, k, v, m)[0], fullgraph=True,
                         backend="aot_eager")
    with pytest.raises(RuntimeError, match="not a key padding mask"):
        call(q, k, v, local.contiguous())
    padded = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    padded[1, :, :, 4:] = False
    assert call(q, k, v, padded).shape == (2, 6, 3, 4)


@pytest.mark.parametrize("family,scheme", [("bert", "hnas")] + [pytest.param(f, s, marks=pytest.mark.full) for f, s in
                                          [("bert", "dnas"), ("bert", "discrete")] + [("t5", s) for s in SCHEMES]])
def test_export_eval_model(family, scheme):
    """torch.export of an eval model (T5 without its generation cache) runs
    as the eager model does."""
    model = build(family, scheme).eval()
    kw = inputs(family)
    if family == "t5":
        kw["use_cache"] = False
    exported = torch.export.export(model, (), kwargs=kw)
    got, want = exported.module()(**kw), model(**kw)
    key = "last_hidden_state" if family == "bert" else "logits"
    torch.testing.assert_close(got[key], want[key])


@pytest.mark.full
def test_trainer_with_torch_compile_trains(tmp_path):
    """transformers' Trainer with torch_compile=True (the aot_eager backend:
    inductor's code generation is covered above) trains a DNAS classifier
    through a compiled graph: the loss on its two sentences falls."""
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    model = hf.enable(BertForSequenceClassification(AutoConfig.for_model("bert", **BERT, num_labels=2)),
                      scheme="dnas")
    kw = inputs("bert")
    labels = torch.tensor([0, 1])
    rows = [{"input_ids": kw["input_ids"][i], "attention_mask": kw["attention_mask"][i],
             "labels": labels[i]} for i in range(2)] * 8

    def loss():
        model.eval()
        with torch.no_grad():
            return model(**kw, labels=labels).loss.item()

    before = loss()
    args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, torch_compile_backend="aot_eager",
                             max_steps=8, per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True)
    Trainer(model=model, args=args, train_dataset=rows).train()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # the steps ran a compiled graph
    assert loss() < 0.5 * before
    assert model.config._attn_implementation == "dnas"


@pytest.mark.full
def test_bench_compile_quick(tmp_path, capsys, monkeypatch):
    """benchmarks/bench_compile.py at its smallest size (in this process,
    aot_eager): a row per scheme, sdpa's ratio 1; bad arguments in one line."""
    import json
    import os

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
    import bench_compile

    torch._dynamo.reset()
    out = tmp_path / "b.json"
    bench_compile.main(["--quick", "--backend", "aot_eager", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"sdpa", "dnas"} and rows["sdpa"]["ratio"] == 1.0 and rows["dnas"]["median_s"] > 0
    with pytest.raises(SystemExit) as err:
        bench_compile.main(["--schemes", "dnas"])
    assert err.value.code != 0 and "--schemes takes sdpa" in capsys.readouterr().err


@pytest.mark.full
@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_fused_path_compiles_without_breaks(scheme, monkeypatch):
    """The fused CPU path (long sequences on 'auto'; forced here) in one
    graph, forward and backward equal to eager (HNAS's backward recomputes
    both outputs instead of branching on u's values)."""
    from fairseq_dnas.attention import kernels

    monkeypatch.setenv(kernels.PATH_ENV, "fused")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 4, generator=g).requires_grad_() for _ in range(3))
    u = torch.tensor([0.3, 0.8], requires_grad=True)  # one head on each side of 1/2
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    wrt = [q, k, v] + ([u] if scheme == "hnas" else [])

    def attend(q, k, v, u):
        u = u if scheme == "hnas" else None
        return kernels.attend(q, k, v, scheme=scheme, padding_mask=pad, hybrid_weight=u)[0]

    assert torch._dynamo.explain(attend)(q, k, v, u).graph_break_count == 0
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v, u)
    got_grads = torch.autograd.grad(got.square().sum(), wrt)
    want = attend(q, k, v, u)
    want_grads = torch.autograd.grad(want.square().sum(), wrt)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_triton_kernels_are_registered_custom_ops():
    """The kernels' custom op and its backward are registered, and their
    fake implementations give the shapes and dtypes without running a kernel."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fairseq_dnas.attention import triton_op

    assert hasattr(torch.ops.fairseq_dnas, "triton_attention")
    assert hasattr(torch.ops.fairseq_dnas, "triton_attention_backward")
    with FakeTensorMode():
        q, k = torch.empty(2, 3, 7, 16, dtype=torch.float16), torch.empty(2, 3, 5, 16, dtype=torch.float16)
        v, u = torch.empty(2, 3, 5, 8, dtype=torch.float16), torch.empty(3)
        pad, seed = torch.zeros(2, 5, dtype=torch.bool), torch.zeros(1, dtype=torch.int64)
        out = triton_op.triton_attention_op(q, k, v, u, pad, None, 0.1, seed, 1, "long", "hnas", True)
        assert out.shape == (2, 3, 7, 8) and out.dtype == torch.float16
        grads = triton_op.triton_attention_backward_op(out, q, k, v, u, pad, None, 0.1, seed, 1, "long", "hnas",
                                                       False)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, u.shape]
        assert len(triton_op.triton_attention_backward_op(out, q, k, v, None, None, None, 0.0, seed, 1, "short",
                                                          "dnas", False)) == 3


@pytest.mark.full
@pytest.mark.parametrize("scheme,p", [("dnas", 0.0), ("hnas", 0.0), ("hnas", 0.25)])
def test_triton_path_compiles_as_one_op(scheme, p):
    """Under Triton's interpreter: a compiled call of the Triton path has no
    graph break, holds the custom op, and gives the eager kernels' output
    and gradients (with dropout: the same seed, drawn from torch's generator
    in the graph as eagerly, and the same mask in the backward)."""
    pytest.importorskip("triton")
    from fairseq_dnas.attention import kernels
    from fairseq_dnas.hf.attention import _Dropout

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 16, generator=g).requires_grad_() for _ in range(3))
    u = torch.tensor([0.3, 0.8], requires_grad=True)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    wrt = [q, k, v] + ([u] if scheme == "hnas" else [])

    def attend(q, k, v, u):
        u = u if scheme == "hnas" else None
        return kernels.attend(q, k, v, scheme=scheme, padding_mask=pad, hybrid_weight=u, path="triton",
                              dropout=_Dropout(p) if p else None)[0]

    explained = torch._dynamo.explain(attend)(q, k, v, u)
    assert explained.graph_break_count == 0
    assert "fairseq_dnas.triton_attention" in explained.graphs[0].code
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    torch.manual_seed(4)
    got = compiled(q, k, v, u)
    got_grads = torch.autograd.grad(got.square().sum(), wrt)
    torch.manual_seed(4)
    want = attend(q, k, v, u)
    want_grads = torch.autograd.grad(want.square().sum(), wrt)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)
    if p:  # dropout ran: not the output without it
        plain = kernels.attend(q, k, v, scheme=scheme, padding_mask=pad, hybrid_weight=u, path="triton")[0]
        assert (got - plain).abs().max() > 1e-3
