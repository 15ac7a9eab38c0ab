"""roberta_dnas / roberta_hnas built in-process: parity with fairseq's roberta,
checkpoint loading, presets, and the NumPy 2 break-mode shim."""

import numpy as np
import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models.roberta import RobertaModel
from fairseq.tasks.masked_lm import MaskedLMTask
from helpers import USER_DIR, WORDS, random_tokens

from fairseq_dnas.models.roberta_dnas import RobertaDNASModel
from fairseq_dnas.modules import DNASMultiheadAttention

TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "4", "--tokens-per-sample", "32"]


def roberta_args(arch, extra=(), tiny=True):
    parser = options.get_training_parser(default_task="masked_lm")
    return options.parse_args_and_arch(
        parser, ["unused-data", "--task", "masked_lm", "--arch", arch, "--user-dir", USER_DIR,
                 "--dropout", "0", "--attention-dropout", "0", *(TINY if tiny else ()), *extra]
    )


def dictionary():
    d = Dictionary()
    for w in WORDS:
        d.add_symbol(w)
    return d


def build(arch, extra=(), seed=0, tiny=True):
    args = roberta_args(arch, extra, tiny)
    task = MaskedLMTask(args, dictionary())
    torch.manual_seed(seed)
    return task.build_model(args).eval()


def tokens(model, lengths=(9, 5, 7)):
    # RoBERTa pads on the right and starts with <s> (bos).
    t = random_tokens(lengths, max(lengths), model.encoder.dictionary, left_pad=False)
    return torch.cat([torch.full((len(lengths), 1), model.encoder.dictionary.bos()), t], 1)


def test_unas_is_exactly_fairseqs_roberta():
    plain = build("roberta_small", seed=3)
    unas = build("roberta_dnas_small", ["--encoder-attention-scheme", "unas"], seed=3)
    assert type(plain) is RobertaModel and isinstance(unas, RobertaDNASModel)
    a, b = plain.state_dict(), unas.state_dict()
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    x = tokens(plain)
    out_a, _ = plain(x)
    out_b, _ = unas(x)
    assert torch.equal(out_a, out_b)
    # and the classification head path (sentence_prediction)
    for m in (plain, unas):
        torch.manual_seed(1)
        m.register_classification_head("sentence_classification_head", num_classes=2)
    ca, _ = plain(x, classification_head_name="sentence_classification_head")
    cb, _ = unas(x, classification_head_name="sentence_classification_head")
    assert torch.equal(ca, cb)


@pytest.mark.parametrize("arch,scheme", [("roberta_dnas", "dnas"), ("roberta_hnas", "hnas"),
                                         ("roberta_dnas_small", "dnas"), ("roberta_hnas_small", "hnas")])
def test_every_encoder_layer_runs_the_scheme(arch, scheme):
    model = build(arch, seed=3)
    mods = model.attention_modules()
    assert len(mods) == 2 and all(m.scheme == scheme for m in mods)
    assert all(isinstance(layer.self_attn, DNASMultiheadAttention)
               for layer in model.encoder.sentence_encoder.layers)
    # The same weights under UNAS give different outputs: the scheme runs.
    x = tokens(model)
    out, _ = model(x)
    for m in mods:
        m.scheme = "unas"
    ref, _ = model(x)
    assert not torch.allclose(out, ref, atol=1e-4)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_output_does_not_depend_on_batch_mates(scheme):
    # DNAS normalizes each key over the queries: padding must not take part.
    model = build(f"roberta_{scheme}_small", seed=0)
    x = tokens(model, (9, 4, 6))
    out, _ = model(x, features_only=True)
    for b in range(3):
        n = int(x[b].ne(model.encoder.dictionary.pad()).sum())
        alone, _ = model(x[b:b + 1, :n], features_only=True)
        torch.testing.assert_close(out[b:b + 1, :n], alone, atol=1e-5, rtol=1e-5)


def test_flags_and_checks_are_the_plugins():
    model = build("roberta_hnas", ["--hybrid-init", "0.3", "--hybrid-weight-per", "layer", "--sinkhorn-iters", "2"])
    assert model.hybrid_weights() == [[pytest.approx(0.3)] * 4] * 2
    assert model.attention_modules()[0].sinkhorn_iters == 2
    assert build("roberta_dnas").hybrid_weights() is None
    with pytest.raises(ValueError, match="--sinkhorn-iters"):
        build("roberta_dnas", ["--sinkhorn-iters", "0"])
    with pytest.raises(ValueError, match="hybrid"):
        build("roberta_hnas", ["--hybrid-init", "1.5"])


def test_plain_roberta_state_loads_into_roberta_hnas():
    plain = build("roberta_small", seed=5)
    state = plain.state_dict()
    plain_keys = set(state)
    hnas = build("roberta_hnas_small", ["--hybrid-init", "0.2"], seed=9)
    hnas.load_state_dict(state, strict=True)  # fairseq upgrades the state first
    assert hnas.hybrid_weights() == [[pytest.approx(0.2)] * 4] * 2
    mine = hnas.state_dict()
    for k, v in state.items():
        assert torch.equal(mine[k], v), k
    assert set(mine) - plain_keys == {f"encoder.sentence_encoder.layers.{i}.self_attn.hybrid_logit" for i in range(2)}


def _params(arch):
    model = build(arch, tiny=False)
    return sum(p.numel() for p in model.parameters())


def test_preset_sizes():
    # Encoder sizes (layers, width, heads, FFN) and parameter counts with a
    # 44-symbol dictionary (the embeddings are tiny, so the counts are the
    # encoder's): base 85M, large / the paper's BERT 302M, small 0.8M.
    expect = {"base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096),
              "bert": (24, 1024, 16, 4096), "small": (4, 128, 4, 512)}
    for preset, (layers, dim, heads, ffn) in expect.items():
        a = roberta_args(f"roberta_hnas_{preset}", tiny=False)
        assert (a.encoder_layers, a.encoder_embed_dim, a.encoder_attention_heads, a.encoder_ffn_embed_dim) == \
            (layers, dim, heads, ffn), preset
        assert a.encoder_attention_scheme == "hnas" and a.hybrid_init == 0.5
    assert roberta_args("roberta_dnas_bert", tiny=False).encoder_attention_scheme == "dnas"
    small = _params("roberta_dnas_small")
    assert small == _params("roberta_small")  # DNAS adds no parameter
    assert _params("roberta_hnas_small") == small + 4 * 4  # one u per head and layer
    # Layer arithmetic, checked against the count: 4 * (attention 4*(d^2+d)
    # + 2 layer norms 2*2*d + FFN 2*d*f + f + d), embeddings, LM head.
    d, f = 128, 512
    layer = 4 * (d * d + d) + 2 * 2 * d + 2 * d * f + f + d
    vocab = 44 + 1  # WORDS + 4 specials + <mask>
    embed = vocab * d + (128 + 2) * d + 2 * d  # tokens, positions (+pad offset), layer norm
    lm_head = d * d + d + 2 * d + vocab  # dense, layer norm, bias (weight tied)
    assert small == 4 * layer + embed + lm_head


@pytest.mark.parametrize("mode", ["none", "complete", "complete_doc", "eos"])
def test_token_block_dataset_every_break_mode(mode):
    # fairseq's TokenBlockDataset names np.compat.long for "eos" (gone in NumPy 2):
    # fairseq_dnas.fairseq_patches.numpy_alias makes it work; every mode builds and reads.
    import fairseq_dnas.plugin  # noqa: F401
    from fairseq.data import TokenBlockDataset

    sentences = [torch.arange(1, n + 1) for n in (5, 3, 7, 1, 4)]
    ds = TokenBlockDataset(sentences, np.array([len(s) for s in sentences]), block_size=8,
                           pad=0, eos=2, break_mode=mode, document_sep_len=0)
    blocks = [ds[i] for i in range(len(ds))]
    assert sum(len(b) for b in blocks) == 20
    if mode == "eos":
        assert [len(b) for b in blocks] == [5, 3, 7, 1, 4]


def test_numpy_shim_is_scoped():
    import fairseq.data.language_pair_dataset as lpd
    import fairseq.data.token_block_dataset as tbd

    import fairseq_dnas.plugin  # noqa: F401

    assert tbd.np.compat.long is np.int64 and lpd.np.compat.long is np.int64
    assert tbd.np.zeros(2, dtype=tbd.np.compat.long).dtype == np.int64
    if not hasattr(np, "compat"):  # numpy itself is left alone
        assert np.__name__ == "numpy" and not hasattr(np, "compat")
