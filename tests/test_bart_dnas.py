"""bart_dnas / bart_hnas: fairseq's BART with a DNAS/HNAS encoder.

In-process: UNAS is exactly fairseq's ``bart``; the DNAS/HNAS encoder and the
whole model's output match a float64 computation written out here (padding,
forward and gradients); a ``bart`` state dict loads with every tensor in its
place. End to end with the commands: ``--restore-file`` of a softmax ``bart``
/ ``transformer`` checkpoint into the DNAS/HNAS architectures (every tensor
compared, one log line for the created HNAS logits), the hub interface
(``BARTModel.from_pretrained`` + ``sample`` with the CNN/DailyMail settings,
and beam 1 against a greedy search written out), ``fairseq-generate``, and the
one-line errors (a ``--hybrid-init`` outside (0, 1), a checkpoint of another
architecture, a missing BPE file).
"""

import logging
import math
import random
import re

import pytest
import torch
import torch.nn.functional as F
from fairseq.models.bart import BARTModel
from helpers import USER_DIR, build_model, random_tokens, run

from fairseq_dnas.attention.hybrid import exact_logit
from fairseq_dnas.models.bart_dnas import BARTDNASModel
from fairseq_dnas.modules import DNASMultiheadAttention

# --------------------------------------------------------------- in-process


def test_architectures_and_defaults():
    for arch, scheme in (("bart_dnas_base", "dnas"), ("bart_hnas_base", "hnas"), ("bart_dnas_large", "dnas"),
                         ("bart_hnas_large", "hnas"), ("mbart_hnas_large", "hnas"), ("mbart_dnas_base", "dnas")):
        m = build_model(arch)
        assert isinstance(m, BARTDNASModel) and m.args.encoder_attention_scheme == scheme
        assert [a.scheme for a in m.encoder.attention_modules()] == [scheme, scheme]
        # the decoder is fairseq's, self- and cross-attention
        assert not any(isinstance(x, DNASMultiheadAttention) for x in m.decoder.modules())
    assert build_model("mbart_hnas_base").args.no_scale_embedding is False
    assert build_model("bart_hnas_base").args.no_scale_embedding is True
    hnas = build_model("bart_hnas_base", ["--hybrid-init", "0.01", "--hybrid-weight-per", "layer"])
    assert [len(u) for u in hnas.hybrid_weights()] == [4, 4]
    assert all(abs(x - 0.01) < 1e-8 for u in hnas.hybrid_weights() for x in u)  # float32


def test_unas_is_exactly_fairseqs_bart():
    torch.manual_seed(3)
    plain = build_model("bart_base")
    torch.manual_seed(3)
    unas = build_model("bart_dnas_base", ["--encoder-attention-scheme", "unas"])
    assert type(plain) is BARTModel
    a, b = plain.state_dict(), unas.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    src = random_tokens((7, 4, 6), 7, plain.encoder.dictionary)
    prev = random_tokens((3, 5, 2), 5, plain.encoder.dictionary, left_pad=False, seed=1)
    lengths = src.ne(1).sum(1)
    assert torch.equal(plain(src, lengths, prev)[0], unas(src, lengths, prev)[0])


# --- the float64 computation written out ---------------------------------------

def _layer_norm(x, ln):
    return F.layer_norm(x, x.shape[-1:], ln.weight.double(), ln.bias.double(), ln.eps)


def _linear(x, lin):
    return x @ lin.weight.double().T + lin.bias.double()


def _probs(scores, pad, scheme, u):
    """(B, H, T, T) probabilities of Algorithm 1: UNAS normalizes each query
    row over the real keys; DNAS each key column over the real queries, then
    each row over the keys; HNAS u * DNAS + (1 - u) * UNAS (Eq. 12)."""
    neg = torch.finfo(scores.dtype).min
    keys = pad[:, None, None, :]
    queries = pad[:, None, :, None]
    s = scores.masked_fill(keys, neg)
    p_u = torch.softmax(s, dim=-1)
    col = s.masked_fill(queries, neg)
    col = col - torch.logsumexp(col, dim=-2, keepdim=True)  # over queries
    p_d = torch.softmax(col.masked_fill(keys, neg), dim=-1)  # then over keys
    if scheme == "dnas":
        p = p_d
    else:
        p = u[None, :, None, None] * p_d + (1 - u[None, :, None, None]) * p_u
    return p.masked_fill(queries, 0.0)


def _reference_encoder(model, src):
    """BART's encoder in float64: scaled(1)-token + learned-position embedding,
    layernorm_embedding, then post-norm layers of attention and GELU FFN."""
    enc = model.encoder
    pad_idx = enc.padding_idx
    pad = src.eq(pad_idx)
    x = enc.embed_tokens.weight.double()[src] * enc.embed_scale
    positions = (torch.cumsum(~pad, dim=1) * ~pad) + pad_idx
    x = x + enc.embed_positions.weight.double()[positions]
    x = _layer_norm(x, enc.layernorm_embedding)
    x = x * (~pad).unsqueeze(-1)
    B, T, C = x.shape
    for layer in enc.layers:
        att = layer.self_attn
        H, D = att.num_heads, att.head_dim

        def heads(y):
            return y.view(B, T, H, D).transpose(1, 2)

        q = heads(_linear(x, att.q_proj) * D ** -0.5)
        k, v = heads(_linear(x, att.k_proj)), heads(_linear(x, att.v_proj))
        # u as the module defines it: the float32 sigmoid of its logit
        u = None if att.hybrid_logit is None else torch.sigmoid(att.hybrid_logit.float()).double().expand(H)
        p = _probs(q @ k.transpose(-1, -2), pad, att.scheme, u)
        a = _linear((p @ v).transpose(1, 2).reshape(B, T, C), att.out_proj)
        x = _layer_norm(x + a, layer.self_attn_layer_norm)
        h = _linear(F.gelu(_linear(x, layer.fc1)), layer.fc2)
        x = _layer_norm(x + h, layer.final_layer_norm)
    return x, pad  # (B, T, C)


@pytest.mark.parametrize("arch", ["bart_dnas_base", "bart_hnas_base"])
def test_encoder_and_model_match_a_float64_computation(arch):
    torch.manual_seed(0)
    model = build_model(arch, ["--hybrid-init", "0.3"] if "hnas" in arch else []).double()
    if model.encoder.attention_modules()[0].hybrid_logit is not None:  # distinct u per head
        for m in model.encoder.attention_modules():
            m.hybrid_logit.data = torch.randn(m.hybrid_logit.shape, dtype=torch.float64)
    for p in model.parameters():  # BERT's init (std 0.02) gives near-uniform attention: sharpen it
        p.data.add_(0.3 * torch.randn_like(p))
    # fairseq's gelu runs in float32 whatever the input; the float64 one here.
    for layer in [*model.encoder.layers, *model.decoder.layers]:
        layer.activation_fn = F.gelu
    d = model.encoder.dictionary
    src = random_tokens((9, 5, 7), 9, d)  # left padded, as the translation task pads
    lengths = src.ne(d.pad()).sum(1)
    out = model.encoder(src, lengths)
    got = out["encoder_out"][0].transpose(0, 1)
    ref, pad = _reference_encoder(model, src)
    real = ~pad
    assert torch.allclose(got[real], ref[real], atol=1e-7, rtol=0)
    # The scheme matters here: the same weights through softmax differ by far more than the tolerance.
    for m in model.encoder.attention_modules():
        m.scheme, saved = "unas", m.scheme
    softmax_out = model.encoder(src, lengths)["encoder_out"][0].transpose(0, 1)
    assert (softmax_out[real] - ref[real]).abs().max() > 1e-3
    for m in model.encoder.attention_modules():
        m.scheme = saved

    # Gradients of a loss on the real positions, for every encoder parameter.
    loss = (got[real] * torch.linspace(-1, 1, got[real].numel(), dtype=torch.float64).view_as(got[real])).sum()
    grads = torch.autograd.grad(loss, list(model.encoder.parameters()), allow_unused=True)
    model.zero_grad()
    ref2, _ = _reference_encoder(model, src)
    loss_ref = (ref2[real] * torch.linspace(-1, 1, ref2[real].numel(), dtype=torch.float64).view_as(ref2[real])).sum()
    grads_ref = torch.autograd.grad(loss_ref, list(model.encoder.parameters()), allow_unused=True)
    names = [n for n, _ in model.encoder.named_parameters()]
    for name, g, r in zip(names, grads, grads_ref):
        if r is None:
            continue
        assert g is not None and torch.allclose(g, r, atol=1e-7, rtol=1e-6), name
    assert any("hybrid_logit" in n for n in names) == (arch == "bart_hnas_base")

    # The decoder is fairseq's: fed the reference encoder output it gives the model's logits.
    prev = random_tokens((4, 3, 2), 4, d, left_pad=False, seed=2)
    logits = model(src, lengths, prev)[0]
    ref_out = {**out, "encoder_out": [ref.transpose(0, 1)]}
    ref_logits = model.decoder(prev, encoder_out=ref_out)[0]
    assert torch.allclose(logits, ref_logits, atol=1e-7, rtol=0)


def test_a_bart_state_dict_loads_with_every_tensor_in_place(caplog):
    torch.manual_seed(1)
    plain = build_model("bart_base")
    state = {k: v.clone() for k, v in plain.state_dict().items()}
    hnas = build_model("bart_hnas_base", ["--hybrid-init", "0.01"])
    with caplog.at_level(logging.INFO, logger="fairseq_dnas.models"):
        hnas.load_state_dict(dict(state), strict=True)
    created = [r.getMessage() for r in caplog.records if "hybrid_logit" in r.getMessage()]
    assert len(created) == 1 and "created 2 hybrid_logit tensors" in created[0] and "0.01" in created[0]
    got = hnas.state_dict()
    assert set(got) - set(state) == {f"encoder.layers.{i}.self_attn.hybrid_logit" for i in range(2)}
    for k, v in state.items():
        assert torch.equal(got[k], v), k
    for i in range(2):
        assert torch.equal(got[f"encoder.layers.{i}.self_attn.hybrid_logit"],
                           torch.full((4,), exact_logit(0.01)))


def test_u_near_zero_starts_near_the_softmax_model():
    """--hybrid-init 0.01: the output moves by about u times DNAS's distance."""
    torch.manual_seed(2)
    plain = build_model("bart_base")
    for p in plain.parameters():
        p.data.add_(0.3 * torch.randn_like(p))
    d = plain.encoder.dictionary
    src = random_tokens((9, 5, 7), 9, d)
    lengths = src.ne(d.pad()).sum(1)
    base = plain.encoder(src, lengths)["encoder_out"][0]
    dist = {}
    for arch, extra in (("bart_dnas_base", []), ("bart_hnas_base", ["--hybrid-init", "0.01"])):
        m = build_model(arch, extra)
        m.load_state_dict(plain.state_dict(), strict=False)
        dist[arch] = (m.encoder(src, lengths)["encoder_out"][0] - base)[src.ne(d.pad()).T].norm()
    assert dist["bart_dnas_base"] > 0
    assert dist["bart_hnas_base"] < 0.05 * dist["bart_dnas_base"]


def test_bad_settings_fail_at_build():
    from fairseq_dnas.errors import BadFlag

    for extra, words in ((["--hybrid-init", "1.5"], "--hybrid-init must lie in (0, 1)"),
                         (["--hybrid-init", "0"], "--hybrid-init must lie in (0, 1)"),
                         (["--decoder-attention-scheme", "dnas"], "Keep the decoder at 'unas'")):
        with pytest.raises(BadFlag, match=None) as err:
            build_model("bart_hnas_base", extra)
        assert words in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------- commands

SIZES = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "2", "--max-source-positions", "64", "--max-target-positions", "128"]
TRAIN = ["--task", "translation", "-s", "src", "-t", "tgt", "--cpu", "--optimizer", "adam", "--lr", "3e-3",
         "--batch-size", "16", "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
         "--disable-validation", "--num-workers", "0"]
ZERO_STEP = ["--optimizer", "sgd", "--lr", "0", "--max-update", "1", "--reset-optimizer", "--reset-dataloader",
             "--reset-meters", "--reset-lr-scheduler"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny parallel text through SentencePiece (the BPE of the hub
    interface), binarized, and a plain ``bart_base`` and ``transformer``
    trained on it: {'root', 'bin', 'spm', 'bart', 'transformer'}."""
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("bart")
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "big", "red", "house", "saw"]
    raw = root / "raw"
    raw.mkdir()
    lines = {}
    for split, n in (("train", 200), ("valid", 10), ("test", 8)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(n)]
        lines[split] = (src, [" ".join(s.split()[:3]) for s in src])
    (raw / "all.txt").write_text("\n".join(lines["train"][0]) + "\n")
    spm.SentencePieceTrainer.train(input=str(raw / "all.txt"), model_prefix=str(root / "sp"), vocab_size=30,
                                   model_type="unigram", character_coverage=1.0, num_threads=1,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(root / "sp.model"))
    for split, (src, tgt) in lines.items():
        for side, text in (("src", src), ("tgt", tgt)):
            (raw / f"{split}.{side}").write_text(
                "".join(" ".join(sp.encode(t, out_type=str)) + "\n" for t in text))
    run(["fairseq-preprocess", "-s", "src", "-t", "tgt", "--trainpref", raw / "train", "--validpref", raw / "valid",
         "--testpref", raw / "test", "--destdir", root / "bin", "--joined-dictionary", "--workers", "1"])
    out = {"root": root, "bin": root / "bin", "spm": root / "sp.model", "raw": raw}
    for arch in ("bart_base", "transformer"):
        run(["fairseq-train", root / "bin", "--arch", arch, "--user-dir", USER_DIR, *SIZES, *TRAIN,
             "--max-update", "30", "--save-dir", root / arch])
        out[arch] = root / arch / "checkpoint_last.pt"
    return out


def _model_state(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["model"]


@pytest.mark.parametrize("source,arch,extra", [
    ("bart_base", "bart_hnas_base", ["--hybrid-init", "0.01"]),
    pytest.param("bart_base", "bart_dnas_base", [], marks=pytest.mark.full),
    ("transformer", "transformer_hnas", ["--hybrid-init", "0.1"]),
    pytest.param("transformer", "transformer_dnas", [], marks=pytest.mark.full),
])
def test_restore_file_loads_every_tensor_in_place(trained, tmp_path, source, arch, extra):
    """fairseq-train --restore-file of a softmax checkpoint, one update at
    lr 0: every tensor of the saved model is the pretrained one, the HNAS
    logits (the only new keys) sit at --hybrid-init, and one line says so."""
    proc = run(["fairseq-train", trained["bin"], "--arch", arch, "--user-dir", USER_DIR, *SIZES, *TRAIN, *extra,
                *ZERO_STEP, "--restore-file", trained[source], "--save-dir", tmp_path / "ft"])
    before, after = _model_state(trained[source]), _model_state(tmp_path / "ft" / "checkpoint_last.pt")
    new = set(after) - set(before)
    assert set(before) <= set(after)
    for k, v in before.items():
        assert torch.equal(after[k], v), k
    log = proc.stdout + proc.stderr
    if "hnas" in arch:
        u = float(extra[1])
        assert new == {f"encoder.layers.{i}.self_attn.hybrid_logit" for i in range(2)}
        for k in new:
            assert torch.equal(after[k], torch.full((4,), exact_logit(u))), k
        assert log.count("the checkpoint has no HNAS weights: created 2 hybrid_logit tensors") == 1
    else:
        assert new == set()
    assert "hybrid_logit" not in log or "hnas" in arch


def test_hub_interface_generates_with_the_cnn_dailymail_settings(trained, tmp_path):
    """What bart_hnas saves loads back through BARTModel.from_pretrained;
    sample() runs with fairseq's CNN/DailyMail settings; beam 1 is the
    greedy search written out below (full forwards, no incremental state)."""
    save = tmp_path / "hnas"
    run(["fairseq-train", trained["bin"], "--arch", "bart_hnas_base", "--user-dir", USER_DIR, *SIZES, *TRAIN,
         "--max-update", "40", "--restore-file", trained["bart_base"], "--reset-optimizer", "--reset-dataloader",
         "--reset-meters", "--save-dir", save])
    hub = BARTModel.from_pretrained(str(save), checkpoint_file="checkpoint_last.pt",
                                    data_name_or_path=str(trained["bin"]), bpe="sentencepiece",
                                    sentencepiece_model=str(trained["spm"]), user_dir=USER_DIR)
    hub.eval()
    model = hub.model
    assert isinstance(model, BARTDNASModel) and model.args.encoder_attention_scheme == "hnas"
    saved = _model_state(save / "checkpoint_last.pt")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    text = ["the big red dog ran to the park", "a cat sat on the mat"]
    tokens = [hub.encode(s) for s in text]
    # beam 1 == greedy search by full forwards (first: fairseq's generator leaves the
    # cross-attention at the last beam > 1 it saw, so a later beam 1 would not run)
    d = model.encoder.dictionary
    for t in tokens:
        hyp = hub.generate([t], beam=1, max_len_a=0, max_len_b=12, min_len=1)[0][0]["tokens"]
        src = t.unsqueeze(0)
        prev = torch.tensor([[d.eos(), d.bos()]])  # BART's hub prefix: <s> after the decoder start </s>
        greedy = [d.bos()]
        with torch.no_grad():
            for _ in range(12):
                logits = model(src, torch.tensor([len(t)]), prev)[0][0, -1]
                logits[d.pad()] = -math.inf
                logits[d.unk()] = -math.inf  # fairseq's generator forbids <unk> by default (--unkpen 0)
                nxt = int(logits.argmax())
                greedy.append(nxt)
                if nxt == d.eos():
                    break
                prev = torch.cat([prev, torch.tensor([[nxt]])], 1)
            else:
                greedy.append(d.eos())
        assert hyp.tolist() == greedy

    out = hub.sample(text, beam=4, lenpen=2.0, max_len_b=140, min_len=55, no_repeat_ngram_size=3)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
    long = hub.generate(tokens, beam=4, lenpen=2.0, max_len_b=140, min_len=55, no_repeat_ngram_size=3)
    assert all(len(h[0]["tokens"]) >= 55 for h in long)  # min_len took effect


def test_fairseq_generate_reads_what_bart_hnas_saved(trained, tmp_path):
    save = tmp_path / "hnas"
    run(["fairseq-train", trained["bin"], "--arch", "bart_hnas_base", "--user-dir", USER_DIR, *SIZES, *TRAIN,
         "--max-update", "2", "--save-dir", save])
    proc = run(["fairseq-generate", trained["bin"], "--user-dir", USER_DIR, "-s", "src", "-t", "tgt", "--path",
                save / "checkpoint_last.pt", "--beam", "4", "--lenpen", "2.0", "--max-len-b", "20",
                "--no-repeat-ngram-size", "3", "--batch-size", "4", "--cpu", "--bpe", "sentencepiece",
                "--sentencepiece-model", trained["spm"], "--required-batch-size-multiple", "1"])
    hyps = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 8
    # a BPE file that is not there: one line naming the flag
    proc = run(["fairseq-generate", trained["bin"], "--user-dir", USER_DIR, "-s", "src", "-t", "tgt", "--path",
                save / "checkpoint_last.pt", "--cpu", "--bpe", "sentencepiece",
                "--sentencepiece-model", tmp_path / "nowhere.model"], check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "nowhere.model: no such BPE file" in last and "--sentencepiece-model" in last
    assert "Traceback" not in proc.stderr


def test_from_pretrained_missing_bpe_file_is_one_line(trained, tmp_path):
    from fairseq_dnas.errors import BadFile

    with pytest.raises(BadFile) as err:
        BARTModel.from_pretrained(str(trained["bart_base"].parent), checkpoint_file="checkpoint_last.pt",
                                  data_name_or_path=str(trained["bin"]), bpe="sentencepiece",
                                  sentencepiece_model=str(tmp_path / "sp.model"), user_dir=USER_DIR)
    msg = str(err.value)
    assert "\n" not in msg and "no such BPE file (sentencepiece_model)" in msg
    assert "pass sentencepiece_model=PATH to from_pretrained" in msg


@pytest.mark.parametrize("flags,words", [
    (["--arch", "bart_hnas_base", "--hybrid-init", "1.5"], ["--hybrid-init must lie in (0, 1)", "1.5"]),
    (["--arch", "bart_hnas_base", "--hybrid-init", "0"], ["--hybrid-init must lie in (0, 1)"]),
    (["--arch", "bart_hnas_base", "--restore-file", "TRANSFORMER"],
     ["its parameters do not fit the model being built", "another architecture"]),
])
def test_bad_inputs_end_in_one_line(trained, tmp_path, flags, words):
    flags_given = list(flags)
    flags = [str(trained["transformer"]) if f == "TRANSFORMER" else f for f in flags]
    proc = run(["fairseq-train", trained["bin"], "--user-dir", USER_DIR, *SIZES, *TRAIN, *flags, "--max-update", "1",
                "--save-dir", tmp_path / "save"], check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(w in last for w in words), last
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()
    if "TRANSFORMER" in flags_given:  # no "created ... hybrid_logit tensors" before it; whole key names only
        assert "hybrid_logit tensors" not in proc.stdout + proc.stderr
        named = re.findall(r"(?:missing|unexpected) keys ([^;]+)", last)
        assert named, last
        for keys in named:
            for key in re.sub(r", \.\.\. \(\d+ in all\)$", "", keys.strip()).split(", "):
                assert re.fullmatch(r"[a-z_0-9]+(\.[a-z_0-9]+)+", key), (key, last)
