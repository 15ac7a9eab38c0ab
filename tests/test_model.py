"""Tier 2: the fairseq models built in-process (no CLI)."""

import pytest
import torch
from helpers import build_model, random_tokens, tiny_args

from fairseq_dnas.modules import DNASMultiheadAttention, DNASTransformerEncoderLayer

SCHEMES = ["dnas", "hnas"]


def _encode(model, tokens):
    lengths = tokens.ne(model.encoder.padding_idx).sum(1)
    return model.encoder(tokens, src_lengths=lengths)["encoder_out"][0]  # (T, B, C)


def test_architectures_build_the_right_schemes():
    for arch, scheme in [("transformer_dnas", "dnas"), ("transformer_hnas", "hnas"),
                         ("transformer_hnas_iwslt_de_en", "hnas"),
                         ("transformer_dnas_vaswani_wmt_en_de_big", "dnas")]:
        model = build_model(arch)
        enc = [m for m in model.encoder.modules() if isinstance(m, DNASMultiheadAttention)]
        assert len(enc) == 2 and all(m.scheme == scheme for m in enc), arch
        # The decoder is fairseq's plain softmax attention.
        assert not any(isinstance(m, DNASMultiheadAttention) for m in model.decoder.modules())


def test_scheme_flag_overrides_the_architecture_default():
    model = build_model("transformer_hnas", ["--encoder-attention-scheme", "dnas", "--sinkhorn-iters", "3"])
    mods = model.encoder.attention_modules()
    assert [m.scheme for m in mods] == ["dnas", "dnas"] and mods[0].sinkhorn_iters == 3


def test_hybrid_flags():
    model = build_model("transformer_hnas", ["--hybrid-init", "0.25", "--hybrid-weight-per", "layer"])
    weights = model.hybrid_weights()
    assert len(weights) == 2 and all(w == [0.25] * 4 for w in weights)
    assert model.encoder.attention_modules()[0].hybrid_logit.shape == (1,)
    assert build_model("transformer_dnas").hybrid_weights() is None


def test_gigaword_presets():
    args = tiny_args("transformer_hnas_gigaword")
    assert args.hybrid_init == 0.1 and args.encoder_attention_scheme == "hnas"
    assert args.max_source_positions == 128 and args.max_target_positions == 64
    assert tiny_args("transformer_hnas").hybrid_init == 0.5
    assert tiny_args("transformer_dnas_gigaword").encoder_attention_scheme == "dnas"
    base = tiny_args("transformer_gigaword")  # fairseq's own model, same sizes
    assert base.arch == "transformer_gigaword" and base.share_all_embeddings


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("left_pad", [True, False])
def test_encoder_output_does_not_depend_on_batch_mates(scheme, left_pad):
    model = build_model(f"transformer_{scheme}")
    d = model.encoder.dictionary
    lengths = [4, 11, 7]
    batch = random_tokens(lengths, 11, d, left_pad=left_pad)
    out = _encode(model, batch)
    for b, n in enumerate(lengths):
        row = batch[b][batch[b].ne(d.pad())][None]  # the sentence alone, no padding
        alone = _encode(model, row)[:, 0]
        idx = torch.arange(11 - n, 11) if left_pad else torch.arange(n)
        torch.testing.assert_close(out[idx, b], alone, atol=1e-5, rtol=0)
    assert torch.isfinite(out).all()  # padded positions too


def test_padding_would_leak_if_padded_queries_were_normalized():
    """The test above can fail: counting padded queries in the column sums
    changes real outputs."""
    from fairseq_dnas.attention import functional as AF

    s = torch.randn(1, 1, 6, 6)
    mask = torch.tensor([[True, True, False, False, False, False]])
    kmask, qmask = AF.broadcast_masks(mask, mask)
    right = AF.dnas_probs(s, kmask, qmask)
    leaky = AF.dnas_probs(s, kmask, None)
    assert (right - leaky)[0, 0, 2:].abs().max() > 1e-3


def test_fairseq_0_12_2_fast_path_stays_off():
    """fairseq 0.12.2 sets ``can_use_fastpath`` in the layer's __init__ and uses
    plain softmax when it is true after a checkpoint load; ours can't be true."""
    model = build_model("transformer_dnas")
    for layer in model.encoder.layers:
        assert isinstance(layer, DNASTransformerEncoderLayer)
        layer.can_use_fastpath = True  # what 0.12.2's __init__ does
        layer.load_to_BT = True  # what 0.12.2's _load_from_state_dict does
        assert layer.can_use_fastpath is False


@pytest.mark.parametrize("scheme", SCHEMES)
def test_plain_transformer_weights_load_for_fine_tuning(scheme):
    plain = build_model("transformer")
    model = build_model(f"transformer_{scheme}", ["--hybrid-init", "0.2"] if scheme == "hnas" else [])
    state = plain.state_dict()
    model.load_state_dict(state, strict=True)  # fairseq's load, with its upgrade hooks
    for name, tensor in plain.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, atol=0, rtol=0)
    if scheme == "hnas":
        u0 = torch.tensor(0.2).item()  # float32(0.2), what the flag gives
        assert all(w == [u0] * 4 for w in model.hybrid_weights())


def test_unas_scheme_is_exactly_fairseqs_transformer():
    plain = build_model("transformer")
    model = build_model("transformer_dnas", ["--encoder-attention-scheme", "unas"])
    model.load_state_dict(plain.state_dict())
    tokens = random_tokens([5, 9], 9, plain.encoder.dictionary)
    torch.testing.assert_close(_encode(model, tokens), _encode(plain, tokens), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_low_precision_model_forward_is_finite(dtype, scheme):
    model = build_model(f"transformer_{scheme}")
    tokens = random_tokens([5, 9, 2], 9, model.encoder.dictionary)
    ref = _encode(model, tokens)
    out = _encode(model.to(dtype), tokens)
    assert out.dtype == dtype and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.1)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sinkhorn-iters", "0"], "--sinkhorn-iters must be an integer >= 1"),
        (["--hybrid-init", "1.5"], r"--hybrid-init must lie in \(0, 1\)"),
        (["--hybrid-init", "-0.1"], r"--hybrid-init must lie in \(0, 1\)"),
        (["--decoder-attention-scheme", "dnas"], "incremental"),
        (["--decoder-attention-scheme", "hnas"], "incremental"),
    ],
)
def test_bad_settings_are_rejected_at_build(extra, message):
    with pytest.raises(ValueError, match=message):
        build_model("transformer_hnas", extra)


def test_unknown_scheme_is_rejected_at_build():
    # argparse's choices= stops it on the command line; a config edited in
    # Python (or a checkpoint's args) is caught when the model is built.
    args = tiny_args("transformer_dnas")
    args.encoder_attention_scheme = "softmax"
    with pytest.raises(ValueError, match="choose one of unas, dnas, hnas"):
        build_model("transformer_dnas", args=args)


def test_gigaword_preset_parameter_count_is_the_documented_one():
    """README: 222,067,200 parameters with a 30,522-entry dictionary (+144 u for HNAS)."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.tasks.translation import TranslationTask
    from helpers import USER_DIR

    d = Dictionary()
    for i in range(30522 - len(d)):
        d.add_symbol(f"p{i}")
    for arch, expected in [("transformer_gigaword", 222_067_200),
                           ("transformer_hnas_gigaword", 222_067_200 + 12 * 12)]:
        args = options.parse_args_and_arch(
            options.get_training_parser(), ["unused-data", "--arch", arch, "--user-dir", USER_DIR]
        )
        model = TranslationTask(args, d, d).build_model(args)
        assert sum(p.numel() for p in model.parameters()) == expected, arch
