"""fairseq_dnas.hf under torch.compile and torch.export, on the CPU paths.

Every scheme (DNAS, HNAS, discrete) in BERT, BART and T5 compiles without a
graph break (``torch._dynamo.explain``), as ``sdpa`` does; ``fullgraph=True``
in training gives eager's outputs and gradients; an eval model exports with
``torch.export.export``; the adapter's checks still refuse bad masks inside a
compiled graph; ``Trainer(torch_compile=True)`` trains. The Gumbel noise of
the discrete scheme is one opaque op of the graph with eager's draws.
Compiling is slow: one representative in the default tier, the rest in the
full tier.
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


@pytest.mark.parametrize("family,scheme", [c if c == ("bert", "hnas") else pytest.param(*c, marks=pytest.mark.full)
                                           for c in CASES])
def test_no_graph_breaks(family, scheme):
    torch._dynamo.reset()
    # the default tier's representative: one layer (the break count is per layer)
    model = build(family, scheme, **({"num_hidden_layers": 1} if (family, scheme) == ("bert", "hnas") else {}))
    model.train()
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


@pytest.mark.parametrize("family,scheme", [pytest.param(*c, marks=pytest.mark.full) for c in CASES])
def test_fullgraph_training_equals_eager(family, scheme, fixed_noise):
    torch._dynamo.reset()
    model = build(family, scheme).train()
    kw = inputs(family)
    params = [p for p in model.parameters() if p.requires_grad]
    compiled = torch.compile(model, fullgraph=True)
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


@pytest.mark.full
@pytest.mark.parametrize("scheme", SCHEMES)
def test_export_eval_model(scheme):
    model = build("bert", scheme).eval()
    kw = inputs("bert")
    exported = torch.export.export(model, (), kwargs=kw)
    torch.testing.assert_close(exported.module()(**kw).last_hidden_state, model(**kw).last_hidden_state)
