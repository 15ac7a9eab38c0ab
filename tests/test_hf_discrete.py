"""fairseq_dnas.hf with scheme='discrete' (J. Kinley, 2020, Section 4.1):
every bidirectional self-attention of the supported
families takes one key per query and head, the Gumbel-softmax relaxation in
training and the argmax at inference, through the fairseq models' code
(``attention.discrete``).

Against float64 computations by hand: training with a fixed noise, S =
softmax((log_softmax(L) + G) / tau) (forward and gradients); inference, the
one-hot rows of argmax(L) and the gathered V; with padding, in every family;
the settings survive save_pretrained / from_pretrained; a count of the calls
proves the scheme runs (not sdpa); BART's decoder staying sdpa is
tests/test_hf.py's seq2seq test.
"""

import copy

import pytest
import torch
import transformers
from test_hf import FAMILIES, SMALL, _bool_mask, _qkv, batch, build, encode
from transformers import BertConfig, BertForSequenceClassification, BertModel

from fairseq_dnas import hf
from fairseq_dnas.attention import discrete as DA
from fairseq_dnas.hf import attention as HA

TAU = 0.7


class FixedNoise:
    """Stands in for ``gumbel_noise``: deterministic float32 Gumbel noise, one
    tensor per call, kept in call order for the reference."""

    def __init__(self):
        self.drawn, self.used = [], 0

    def __call__(self, shape, *, device=None, generator=None):
        g = torch.Generator().manual_seed(100 + len(self.drawn))
        u = torch.rand(shape, generator=g).clamp(1e-6, 1 - 1e-6)
        self.drawn.append(-torch.log(-torch.log(u)))
        return self.drawn[-1].clone()

    def next(self):
        self.used += 1
        return self.drawn[self.used - 1]


def reference(q, k, v, pad, scaling, tau, training, noise=None, hard=False):
    """float64 by hand: L = q k^T * scaling, -inf at padded keys; training:
    S = softmax((log_softmax(L) + G) / tau) (hard: the one-hot of argmax(L +
    G) in the forward, S's gradient); inference: one-hot(argmax L) and V
    gathered at the argmax. Returns (out (B, H, T, D), S)."""
    q, k, v = q.double(), k.double(), v.double()
    logits = (q * scaling) @ k.transpose(-1, -2)
    if pad is not None:
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    if not training:
        index = logits.argmax(-1)
        s = torch.nn.functional.one_hot(index, logits.size(-1)).double()
        return torch.take_along_dim(v, index[..., None], dim=-2), s
    y = (torch.log_softmax(logits, -1) + noise.double()) / tau
    s = torch.exp(y - y.amax(-1, keepdim=True))
    s = s / s.sum(-1, keepdim=True)
    if hard:
        one_hot = torch.nn.functional.one_hot(y.argmax(-1), y.size(-1)).double()
        s = one_hot + s - s.detach()
    return s @ v, s


class _Module(torch.nn.Module):  # what transformers passes as `module`, after enable
    is_causal = False

    def __init__(self, hard=False):
        super().__init__()
        self.gumbel_temperature, self.gumbel_hard = TAU, hard


@pytest.mark.parametrize("training,hard,weights", [(True, False, False), (True, False, True), (True, True, True),
                                                   (False, False, False), (False, False, True)])
def test_function_matches_float64_by_hand(training, hard, weights, monkeypatch):
    """The attention function, padded: the fused training path (no weights),
    the explicit one (weights asked for), straight-through, and inference."""
    noise = FixedNoise()
    monkeypatch.setattr(DA, "gumbel_noise", noise)
    q, k, v = _qkv(torch.float32)
    module = _Module(hard).train(training)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    out, w = HA.attention_forward("discrete", module, q, k, v, _bool_mask(pad), scaling=0.37,
                                  output_attentions=weights, dropout=0.5)  # (no dropout on a sample)
    assert out.shape == (2, 6, 3, 4)
    assert len(noise.drawn) == int(training)
    ref_out, ref_s = reference(q, k, v, pad, 0.37, TAU, training, noise.drawn[0] if training else None, hard)
    tol = dict(atol=2e-6, rtol=1e-5)
    if training:
        torch.testing.assert_close(out.double(), ref_out.transpose(1, 2), **tol)
    else:
        assert torch.equal(out.double(), ref_out.transpose(1, 2))  # the gathered rows, exactly
    assert (w is None) == (not weights)
    if weights:
        if training:
            torch.testing.assert_close(w.double(), ref_s, **tol)
        else:
            assert torch.equal(w.double(), ref_s)
        assert bool((w[1, :, :, 4:] == 0).all())  # never a padded key
    if not training:
        return
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    grads = torch.autograd.grad(out, [q, k, v], g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, _ = reference(q64, k64, v64, pad, 0.37, TAU, True, noise.drawn[0], hard)
    ref_grads = torch.autograd.grad(ref_out.transpose(1, 2), [q64, k64, v64], g.double())
    for name, a, b in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-4, msg=name)


def _register_reference(noise):
    """'discrete_ref64': the whole model's self-attention by ``reference``."""
    def ref64(module, query, key, value, attention_mask, scaling=None, **kwargs):
        pad = hf.key_padding_mask(attention_mask, query.shape[0], query.shape[2])
        out, s = reference(query, key, value, pad, scaling, module.gumbel_temperature, module.training,
                           noise.next() if module.training else None)
        return out.transpose(1, 2).to(value.dtype), s.to(value.dtype)

    transformers.AttentionInterface.register("discrete_ref64", ref64)
    transformers.masking_utils.AttentionMaskInterface.register("discrete_ref64", transformers.masking_utils.sdpa_mask)


def _encoder_attentions(model, family, ids, mask):
    base = model.get_encoder() if family in ("bart", "mbart") else model
    return base(input_ids=ids, attention_mask=mask, output_attentions=True).attentions


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_matches_float64_by_hand(family, monkeypatch):
    ids, mask = batch(family)
    real = mask.bool()
    model = build(family)
    with torch.no_grad():
        sdpa = encode(model, family, ids, mask)
    hf.enable(model, scheme="discrete", gumbel_temperature=TAU)
    calls = []
    monkeypatch.setattr(HA, "discrete_attention", lambda *a, **kw: calls.append(1) or DA.discrete_attention(*a, **kw))
    noise = FixedNoise()
    monkeypatch.setattr(DA, "gumbel_noise", noise)
    _register_reference(noise)
    ref = copy.deepcopy(model).double()
    ref.set_attn_implementation("discrete_ref64")
    layers = 2  # SMALL: two encoder layers (ALBERT: one module, called twice)

    # inference: one-hot rows of the argmax, the gathered values
    with torch.no_grad():
        out = encode(model, family, ids, mask)
        want = encode(ref, family, ids, mask)
        attentions = _encoder_attentions(model, family, ids, mask)
        alone = encode(model, family, ids[1:, :6], mask[1:, :6])
    assert len(calls) == 3 * layers  # the scheme runs (three forwards), not sdpa
    torch.testing.assert_close(out.double()[real], want[real], atol=1e-5, rtol=1e-5)
    assert (out[real] - sdpa[real]).abs().max() > 1e-3
    torch.testing.assert_close(out[1, :6], alone[0], atol=2e-5, rtol=1e-5)  # padding changes nothing
    assert len(attentions) == layers
    for a in attentions:
        assert set(a.unique().tolist()) == {0.0, 1.0} and bool((a.sum(-1) == 1).all())
        assert bool((a[1, :, :, 6:] == 0).all())

    # training: the relaxed sample with a fixed noise, forward and gradients
    model.train()
    ref.train()
    out = encode(model, family, ids, mask)
    want = encode(ref, family, ids, mask)
    assert len(noise.drawn) == layers and noise.used == layers
    torch.testing.assert_close(out.double()[real], want[real], atol=1e-5, rtol=1e-5)
    out[real].pow(2).sum().backward()
    want[real].pow(2).sum().backward()
    params = dict(ref.named_parameters())
    checked = 0
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(p.grad.double(), params[name].grad, atol=1e-4, rtol=1e-3, msg=name)
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("model_class", [BertForSequenceClassification, BertModel])
def test_discrete_settings_survive_save_and_load(tmp_path, model_class):
    model = hf.enable(BertForSequenceClassification(BertConfig(**SMALL)).eval(), scheme="discrete",
                      gumbel_temperature=0.25, gumbel_hard=True)
    model.save_pretrained(tmp_path)
    loaded = hf.from_pretrained(model_class, str(tmp_path)).eval()
    assert loaded.config._attn_implementation == "discrete"
    assert loaded.config.dnas["gumbel_temperature"] == 0.25 and loaded.config.dnas["gumbel_hard"] is True
    selfs = [m for _, m, role in hf.attention_modules(loaded) if role == "self"]
    assert len(selfs) == 2 and all(m.gumbel_temperature == 0.25 and m.gumbel_hard is True for m in selfs)
    ids, mask = batch("bert")
    base = loaded if model_class is BertModel else loaded.bert
    assert torch.equal(base(input_ids=ids, attention_mask=mask).last_hidden_state,
                       model.bert(input_ids=ids, attention_mask=mask).last_hidden_state)
    # switching back to another scheme drops the Gumbel settings
    hf.enable(loaded, scheme="dnas")
    assert not any(hasattr(m, "gumbel_temperature") for m in selfs)


def test_trainer_trains_a_discrete_classifier(tmp_path):
    """One call switches the classifier; transformers' Trainer trains it (the
    relaxed sample) and the loss has a gradient through the attention."""
    torch.manual_seed(0)
    model = hf.enable(BertForSequenceClassification(BertConfig(**SMALL)), scheme="discrete")
    ids, mask = batch("bert")
    rows = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": torch.tensor(i % 2)} for i in range(2)] * 4
    args = transformers.TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
                                          report_to=[], use_cpu=True, save_strategy="no", disable_tqdm=True)
    before = model.bert.encoder.layer[0].attention.self.query.weight.detach().clone()
    transformers.Trainer(model=model, args=args, train_dataset=rows).train()
    assert not torch.equal(before, model.bert.encoder.layer[0].attention.self.query.weight)


@pytest.mark.parametrize("kwargs, says", [
    (dict(gumbel_temperature=0.0), "gumbel_temperature must be a finite number > 0"),
    (dict(gumbel_temperature=float("nan")), "gumbel_temperature must be a finite number > 0"),
    (dict(gumbel_hard="yes"), "gumbel_hard must be True or False"),
])
def test_bad_settings_give_one_line(kwargs, says):
    with pytest.raises(ValueError) as excinfo:
        hf.enable(BertModel(BertConfig(**SMALL)), scheme="discrete", **kwargs)
    assert says in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_attention_function_without_enable_says_what_to_do():
    q, k, v = _qkv(torch.float32)
    module = torch.nn.Module()
    module.is_causal = False
    with pytest.raises(ValueError, match="fairseq_dnas.hf.enable\\(model, scheme='discrete'\\)"):
        HA.attention_forward("discrete", module, q, k, v, None, scaling=0.5)
