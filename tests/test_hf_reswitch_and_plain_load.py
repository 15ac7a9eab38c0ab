"""fairseq_dnas.hf: ``enable`` on a model that is switched already, and what
transformers' own ``from_pretrained`` does with a folder saved after
``enable`` (docs/usage.md, "Saving and loading").

- A second ``enable(model, scheme='hnas', hybrid_init=0.1)`` starts u afresh
  at 0.1, as ``config.dnas`` then records, in the same Parameter objects,
  with a warning that says so; 'hnas' then 'dnas' removes u with a warning.
- Plain ``from_pretrained``: a DNAS folder is the same DNAS model; an HNAS
  (or discrete) folder stops at the first forward with a line naming
  ``fairseq_dnas.hf.from_pretrained``; without ``fairseq_dnas.hf``
  registered, transformers refuses the implementation name. Never a
  silent softmax model.
"""

import warnings

import pytest
import torch
from transformers import AttentionInterface, BertConfig, BertModel
from transformers.masking_utils import AttentionMaskInterface

from fairseq_dnas import hf

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, vocab_size=99,
             max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
IDS = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 1, 1, 1]])
MASK = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])


def bert():
    torch.manual_seed(0)
    return BertModel(BertConfig(**SMALL)).eval()


def u_of(model):
    return [u for row in hf.callback.layer_weights(model) for u in row]


def test_second_hnas_enable_starts_u_afresh_as_config_records():
    model = hf.enable(bert(), scheme="hnas", hybrid_init=0.5)
    logits = [p for n, p in model.named_parameters() if n.endswith("hybrid_logit")]
    with torch.no_grad():  # as if trained
        for p in logits:
            p.add_(torch.linspace(-1, 1, p.numel()))
    with pytest.warns(UserWarning, match=r"BertModel has HNAS weights u already \(2 modules, mean u 0\.5\): "
                                         r"enable\(scheme='hnas'\) starts them afresh at hybrid_init=0\.1"):
        hf.enable(model, scheme="hnas", hybrid_init=0.1)
    assert model.config.dnas == {"scheme": "hnas", "hybrid_init": 0.1, "per": "head"}
    assert u_of(model) == pytest.approx([0.1] * 8, abs=1e-7)
    # the same Parameters: an optimizer that holds them goes on training them
    assert [p for n, p in model.named_parameters() if n.endswith("hybrid_logit")] == logits
    # another per: new logits of the new shape
    with pytest.warns(UserWarning, match="starts them afresh at hybrid_init=0.2, per='layer'"):
        hf.enable(model, scheme="hnas", hybrid_init=0.2, per="layer")
    assert u_of(model) == pytest.approx([0.2, 0.2], abs=1e-7) and model.config.dnas["per"] == "layer"


def test_hnas_then_dnas_removes_u_and_says_so():
    model = hf.enable(bert(), scheme="hnas")
    with pytest.warns(UserWarning, match=r"scheme='dnas' has none, so enable removes them; save the model "
                                         r"\(save_pretrained\) first to keep them"):
        hf.enable(model, scheme="dnas")
    assert not any(n.endswith("hybrid_logit") for n, _ in model.named_parameters())
    assert model.config.dnas == {"scheme": "dnas"}
    # a model without u switches without a word
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.enable(model, scheme="unas")
        hf.enable(model, scheme="hnas")


def test_a_bad_hybrid_init_changes_nothing():
    model = hf.enable(bert(), scheme="hnas", hybrid_init=0.3)
    with pytest.raises(ValueError, match="hybrid_init"):
        hf.enable(model, scheme="hnas", hybrid_init=1.5)
    assert u_of(model) == pytest.approx([0.3] * 8, abs=1e-7) and model.config.dnas["hybrid_init"] == 0.3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    models = {}
    for scheme in ("dnas", "unas", "hnas", "discrete"):
        models[scheme] = hf.enable(bert(), scheme=scheme)
        models[scheme].save_pretrained(root / scheme)
    return root, models


@pytest.mark.parametrize("scheme", ["dnas", "unas"])
def test_plain_from_pretrained_of_a_dnas_folder_is_the_dnas_model(folders, scheme):
    root, models = folders
    plain = BertModel.from_pretrained(root / scheme).eval()
    assert plain.config._attn_implementation == scheme
    with torch.no_grad():
        out = plain(input_ids=IDS, attention_mask=MASK).last_hidden_state
        ref = models[scheme](input_ids=IDS, attention_mask=MASK).last_hidden_state
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    if scheme == "unas":
        return
    softmax = bert()
    softmax.set_attn_implementation("sdpa")
    with torch.no_grad():
        assert (softmax(input_ids=IDS, attention_mask=MASK).last_hidden_state - out).abs().max() > 1e-3


@pytest.mark.parametrize("scheme, needs", [("hnas", "the HNAS weights"), ("discrete", "the Gumbel settings")])
def test_plain_from_pretrained_of_an_hnas_folder_stops_at_the_first_forward(folders, scheme, needs):
    root, _ = folders
    plain = BertModel.from_pretrained(root / scheme)
    with pytest.raises(ValueError) as e:
        plain(input_ids=IDS, attention_mask=MASK)
    assert str(e.value).startswith(f"attn_implementation '{scheme}' needs {needs} on BertSelfAttention")
    assert "fairseq_dnas.hf.from_pretrained" in str(e.value)
    loaded = hf.from_pretrained(BertModel, str(root / scheme))  # what the line says works
    assert loaded.config.dnas["scheme"] == scheme


def test_without_fairseq_dnas_hf_transformers_refuses_the_name(folders):
    root, _ = folders
    saved = {m: {k: m._global_mapping.pop(k) for k in hf.SCHEMES} for m in (AttentionInterface, AttentionMaskInterface)}
    try:
        with pytest.raises(ValueError, match='Specified `attn_implementation="dnas"` is not supported'):
            BertModel.from_pretrained(root / "dnas")
    finally:
        for mapping, entries in saved.items():
            mapping._global_mapping.update(entries)
    assert BertModel.from_pretrained(root / "dnas").config._attn_implementation == "dnas"
