"""The faithfulness metric for transformers classifiers
(fairseq_dnas/hf/faithfulness.py, fairseq_dnas/commands/hf_faithfulness.py).

A tiny BERT classifier and a tiny BART classifier (BartForSequenceClassification:
its encoder is what fairseq_dnas.hf.enable switches and what the metric reads;
its classification head reads the decoder's last </s>), built from configs with
a tokenizer trained here (no downloads), against a float64 forward written out
in this file (h0 an explicit leaf, the attention probabilities computed by hand
and, for the detached form, fed back as constants), for softmax (sdpa), DNAS and
HNAS; detached differs from not detached; padding changes nothing (a batch
against one sentence at a time); the attention read equals the model's own
output_attentions; the command's summary line, --json lines and one-line
refusals of bad input."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT
from test_faithfulness import _probs

from fairseq_dnas import hf
from fairseq_dnas.analysis.faithfulness import IMPORTANCE_FORMS, attention_received, kendall_tau
from fairseq_dnas.commands import hf_faithfulness as command
from fairseq_dnas.hf import faithfulness as HF

POSITIVE, NEGATIVE = ["good", "great", "lovely"], ["bad", "awful", "dull"]
SENTENCES = ["the film is good", "a bad and dull movie", "great acting but an awful plot",
             "lovely", "the plot is dull and the acting is bad but the music is great", "awful film"]
LABELS = [1, 0, 0, 1, 0, 0]


def _tokenizer(kind):
    """A WordPiece ([CLS] x [SEP], BERT's ids) or BPE (<s> x </s>, BART's ids)
    tokenizer trained on SENTENCES."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if kind == "bert":
        specials, bos, eos, pad, unk = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"], "[CLS]", "[SEP]", "[PAD]", "[UNK]"
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        trainer = trainers.WordPieceTrainer(vocab_size=80, special_tokens=specials)
    else:  # BART's special ids: <s> 0, <pad> 1, </s> 2, <unk> 3
        specials, bos, eos, pad, unk = ["<s>", "<pad>", "</s>", "<unk>"], "<s>", "</s>", "<pad>", "<unk>"
        tok = Tokenizer(models.BPE(unk_token=unk))
        trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=specials)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(SENTENCES * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))])
    names = {"bert": dict(cls_token=bos, sep_token=eos), "bart": dict(bos_token=bos, eos_token=eos)}[kind]
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, unk_token=unk,
                                   model_input_names=["input_ids", "attention_mask"], **names)


def _model(kind, tokenizer, scheme="sdpa"):
    """A tiny classifier, weights of std 0.3 (peaked attention, where the
    schemes and the detached gradient differ), float64, eval mode; HNAS with
    u different per layer and head."""
    from transformers import BartConfig, BartForSequenceClassification, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    if kind == "bert":
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0, num_labels=2, pad_token_id=tokenizer.pad_token_id)
        model = BertForSequenceClassification(config)
    else:
        config = BartConfig(vocab_size=len(tokenizer), d_model=32, encoder_layers=2, decoder_layers=1,
                            encoder_attention_heads=4, decoder_attention_heads=2, encoder_ffn_dim=37,
                            decoder_ffn_dim=37, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                            classifier_dropout=0.0, max_position_embeddings=64,
                            # BartConfig's default is 3 labels; 2 by name, so that config.json keeps them
                            id2label={0: "negative", 1: "positive"},
                            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
        model = BartForSequenceClassification(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    if scheme != "sdpa":
        hf.enable(model, scheme=scheme)
        for n, (name, p) in enumerate((n, p) for n, p in model.named_parameters() if n.endswith("hybrid_logit")):
            p.data = torch.linspace(-1.5, 1.5, p.numel()) + n
    return model.double().eval()


# --- the float64 forward written out ----------------------------------------------


def _linear(x, lin):
    return F.linear(x, lin.weight.detach().double(), lin.bias.detach().double())


def _norm(x, ln):
    return F.layer_norm(x, x.shape[-1:], ln.weight.detach().double(), ln.bias.detach().double(), ln.eps)


def _heads(x, lin, h):
    t = x.shape[0]
    return _linear(x, lin).view(t, h, -1).transpose(0, 1)  # (H, T, D)


def _attend(xq, xk, q_lin, k_lin, v_lin, o_lin, h, scheme, u=None, causal=False, detach=False):
    """One attention sub-layer of one unpadded sentence: (output (T, C),
    probabilities (H, T, T)); with ``detach`` the probabilities enter P v as
    constants."""
    q, k, v = _heads(xq, q_lin, h), _heads(xk, k_lin, h), _heads(xk, v_lin, h)
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(torch.ones_like(scores[0], dtype=torch.bool).triu(1), float("-inf"))
        p = scores.softmax(-1)
    else:
        p = _probs(scores, scheme, u)
    out = ((p.detach() if detach else p) @ v).transpose(0, 1).reshape(xq.shape[0], -1)
    return _linear(out, o_lin), p.detach()


def _u(module):
    logit = getattr(module, "hybrid_logit", None)
    # The adapter takes u = sigmoid(logit) in float32 whatever the model's dtype.
    return None if logit is None else torch.sigmoid(logit.detach().float()).double()


def _bert_reference(model, ids, scheme, detach):
    bert, t = model.bert, len(ids)
    emb = bert.embeddings
    x = (emb.word_embeddings.weight[ids] + emb.position_embeddings.weight[:t]
         + emb.token_type_embeddings.weight[0]).detach().double()
    h0 = x = _norm(x, emb.LayerNorm).detach().requires_grad_(True)
    attention = []
    for layer in bert.encoder.layer:
        s = layer.attention.self
        o, p = _attend(x, x, s.query, s.key, s.value, layer.attention.output.dense, s.num_attention_heads,
                       scheme, _u(s), detach=detach)
        attention.append(p)
        x = _norm(x + o, layer.attention.output.LayerNorm)
        f = _linear(F.gelu(_linear(x, layer.intermediate.dense)), layer.output.dense)
        x = _norm(x + f, layer.output.LayerNorm)
    pooled = torch.tanh(_linear(x[0], bert.pooler.dense))
    return _linear(pooled, model.classifier), h0, attention


def _bart_layer(layer, x, enc, h, scheme, detach, causal=False):
    """A post-norm BART layer: self-attention (causal in the decoder),
    cross-attention to ``enc`` (decoder), feed-forward."""
    a = layer.self_attn
    o, p = _attend(x, x, a.q_proj, a.k_proj, a.v_proj, a.out_proj, h, scheme, _u(a), causal=causal, detach=detach)
    x = _norm(x + o, layer.self_attn_layer_norm)
    if enc is not None:
        c = layer.encoder_attn
        o, _ = _attend(x, enc, c.q_proj, c.k_proj, c.v_proj, c.out_proj, c.num_heads, "unas", detach=detach)
        x = _norm(x + o, layer.encoder_attn_layer_norm)
    f = _linear(F.gelu(_linear(x, layer.fc1)), layer.fc2)
    return _norm(x + f, layer.final_layer_norm), p


def _bart_reference(model, ids, scheme, detach):
    bart, t = model.model, len(ids)
    enc, dec = bart.encoder, bart.decoder

    def embed(stack, tokens):
        scale = getattr(stack.embed_tokens, "embed_scale", 1.0)
        x = stack.embed_tokens.weight[tokens] * scale + stack.embed_positions.weight[2 + torch.arange(len(tokens))]
        return _norm(x.detach().double(), stack.layernorm_embedding)

    h0 = x = embed(enc, ids).detach().requires_grad_(True)
    attention = []
    for layer in enc.layers:
        x, p = _bart_layer(layer, x, None, layer.self_attn.num_heads, scheme, detach)
        attention.append(p)
    y = embed(dec, torch.cat([torch.tensor([model.config.decoder_start_token_id]), ids[:-1]]))
    for layer in dec.layers:
        y, _ = _bart_layer(layer, y, x, layer.self_attn.num_heads, "unas", detach, causal=True)
    head = model.classification_head
    last_eos = int(ids.eq(model.config.eos_token_id).nonzero()[-1])
    return _linear(torch.tanh(_linear(y[last_eos], head.dense)), head.out_proj), h0, attention


REFERENCE = {"bert": _bert_reference, "bart": _bart_reference}


def _expected(model, kind, ids, special, scheme, detach):
    """(class probabilities, a_j, {form: g_j}) over the real tokens of one sentence."""
    logits, h0, attention = REFERENCE[kind](model, ids, "unas" if scheme == "sdpa" else scheme, detach)
    probs = logits.softmax(-1)
    (grad,) = torch.autograd.grad(probs[probs.argmax()], h0)
    real = ~special
    a = sum(p.sum(dim=(0, 1)) for p in attention)[real]  # every head and query, real keys
    g, e = grad[real], h0.detach()[real]
    return probs.detach(), a, {"grad": g.norm(dim=-1), "grad-x-input": (g * e).sum(-1).abs()}


CASES = [("bert", "sdpa"), ("bert", "dnas"), ("bert", "hnas"), ("bart", "sdpa"), ("bart", "hnas")]


@pytest.fixture(scope="module")
def tokenizers():
    return {kind: _tokenizer(kind) for kind in ("bert", "bart")}


@pytest.mark.parametrize("kind, scheme", CASES)
def test_metric_matches_a_float64_forward_written_out(tokenizers, kind, scheme):
    """Batched (right padding), detached and not, against the float64 forward
    one sentence at a time; the detached importance is another one (the
    option is not a no-op), tau differs for some sentence."""
    tok = tokenizers[kind]
    model = _model(kind, tok, scheme)
    encoded = dict(tok(SENTENCES, padding=True, return_tensors="pt", return_special_tokens_mask=True))
    assert encoded["attention_mask"].eq(0).any()  # padding in the batch
    got = {d: HF.explain_batch(model, encoded, detach_attention=d) for d in (False, True)}
    assert model.config._attn_implementation == scheme  # restored after reading
    taus_differ = 0
    for b in range(len(SENTENCES)):
        kept = encoded["attention_mask"][b].bool()
        ids, special = encoded["input_ids"][b][kept], encoded["special_tokens_mask"][b][kept].bool()
        real = got[False]["real"][b]
        assert real[kept].tolist() == (~special).tolist() and not real[~kept].any()
        taus = []
        for detach in (False, True):
            probs, a, g = _expected(model, kind, ids, special, scheme, detach)
            r = got[detach]
            torch.testing.assert_close(r["probs"][b], probs, atol=1e-10, rtol=0)
            torch.testing.assert_close(r["attention"][b][real], a, atol=1e-10, rtol=1e-9)
            for form in IMPORTANCE_FORMS:
                torch.testing.assert_close(r["importance"][form][b][real], g[form], atol=1e-12, rtol=1e-8)
            taus.append(kendall_tau(a.tolist(), g["grad"].tolist()))
        taus_differ += taus[0] != taus[1]
    assert not torch.allclose(got[True]["importance"]["grad"], got[False]["importance"]["grad"], rtol=1e-3)
    assert taus_differ > 0
    assert float(got[False]["attention"][got[False]["real"]].std()) > 0.1  # far from uniform


@pytest.mark.parametrize("kind, scheme", [("bert", "hnas"), ("bart", "dnas")])
def test_padding_changes_nothing(tokenizers, kind, scheme):
    """The summary and every row of a batch of 4 equal those of one sentence at a time."""
    tok = tokenizers[kind]
    model = _model(kind, tok, scheme)
    s_batch, batched = HF.faithfulness(model, tok, SENTENCES, LABELS, batch_size=4)
    s_one, alone = HF.faithfulness(model, tok, SENTENCES, LABELS, batch_size=1)
    assert s_batch == pytest.approx(s_one, abs=1e-12)
    for x, y in zip(batched, alone):
        assert x["tokens"] == y["tokens"] and x["prediction"] == y["prediction"]
        assert x["attention"] == pytest.approx(y["attention"], abs=1e-12)
        assert x["importance"] == pytest.approx(y["importance"], rel=1e-9, abs=1e-15)
        assert x["tau"] == pytest.approx(y["tau"], abs=1e-12)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_attention_read_equals_the_models_output_attentions(tokenizers, scheme):
    """The weights read inside the attention function are those the model
    returns with output_attentions=True (its own path)."""
    tok = tokenizers["bert"]
    model = _model("bert", tok, scheme)
    encoded = dict(tok(SENTENCES, padding=True, return_tensors="pt", return_special_tokens_mask=True))
    with HF.AttentionReader(model) as reader, torch.no_grad():
        model(**HF.model_inputs(model, encoded))
    with torch.no_grad():
        own = model(**HF.model_inputs(model, encoded), output_attentions=True).attentions
    assert len(reader.weights) == len(own) == 2
    for w, o in zip(reader.weights, own):
        torch.testing.assert_close(w, o, atol=1e-12, rtol=0)


def test_training_mode_and_bad_importance_are_refused(tokenizers):
    tok = tokenizers["bert"]
    model = _model("bert", tok)
    encoded = dict(tok(SENTENCES[:2], padding=True, return_tensors="pt", return_special_tokens_mask=True))
    with pytest.raises(ValueError, match="eval"):
        HF.explain_batch(model.train(), encoded)
    with pytest.raises(ValueError, match="grad-x-input"):
        HF.faithfulness(model.eval(), tok, SENTENCES, importance="saliency")
    summary, rows = HF.faithfulness(model, tok, SENTENCES[:2])  # no gold labels: no accuracy
    assert summary["n"] == 2 and summary["accuracy"] != summary["accuracy"] and rows[0]["label"] is None


# --- the command --------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tokenizers, tmp_path_factory):
    """Saved models (BERT HNAS, BART sdpa) with their tokenizers, and a test set."""
    root = tmp_path_factory.mktemp("hf_faithfulness")
    dirs = {}
    for kind, scheme in (("bert", "hnas"), ("bart", "sdpa")):
        d = root / f"{kind}_{scheme}"
        _model(kind, tokenizers[kind], scheme).float().save_pretrained(d)
        tokenizers[kind].save_pretrained(d)
        dirs[kind] = d
    test = root / "test.tsv"
    test.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in zip(SENTENCES, LABELS)))
    return {"root": root, "dirs": dirs, "test": test}


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_command_summary_and_json_lines(saved, tmp_path):
    """``python -m fairseq_dnas.commands.hf_faithfulness MODEL_DIR --test TEST.tsv --json OUT.jsonl``
    (the interface examples/hf relies on): one JSON summary line on stdout,
    one JSON object per sentence with tau, label, prediction and tokens; the
    numbers are the notebook function's on the loaded model."""
    out = tmp_path / "bert.jsonl"
    proc = subprocess.run([sys.executable, "-m", "fairseq_dnas.commands.hf_faithfulness", str(saved["dirs"]["bert"]),
                           "--test", str(saved["test"]), "--json", str(out), "--detach-attention"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    (summary,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert summary["n"] == len(SENTENCES) and summary["scheme"] == "hnas" and summary["detach_attention"] is True
    assert "Kendall tau" in proc.stderr
    rows = _read_jsonl(out)
    assert [r["index"] for r in rows] == list(range(len(SENTENCES)))
    assert [r["label"] for r in rows] == [str(y) for y in LABELS]
    model, tok = command.load(str(saved["dirs"]["bert"]))
    assert model.config.dnas["scheme"] == "hnas"
    _, expected = HF.faithfulness(model, tok, SENTENCES, LABELS, detach_attention=True)
    for r, e in zip(rows, expected):
        assert r["tokens"] == e["tokens"] and r["prediction"] == e["prediction"]
        assert r["tau"] == pytest.approx(e["tau"], abs=1e-9)
    assert summary["tau_mean"] == pytest.approx(
        sum(r["tau"] for r in rows if r["tau"] is not None) / sum(r["tau"] is not None for r in rows), abs=1e-12)


def test_command_two_models_and_plot(saved, tmp_path, capsys):
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    plot = tmp_path / "tau.png"
    assert command.main([str(saved["dirs"]["bert"]), str(saved["dirs"]["bart"]), "--test", str(saved["test"]),
                         "--importance", "grad-x-input", "--json", *map(str, outs), "--plot", str(plot),
                         "--labels", "bert", "bart"]) == 0
    summaries = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [s["label"] for s in summaries] == ["bert", "bart"]
    assert all(s["importance"] == "grad-x-input" and s["detach_attention"] is False for s in summaries)
    assert all(len(_read_jsonl(o)) == len(SENTENCES) for o in outs) and plot.stat().st_size > 0


def _refusal(args, capsys):
    code = command.main([str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def test_command_bad_input_gives_one_line_and_exit_1(saved, tmp_path, capsys):
    from transformers import BertConfig, BertModel

    bert, test = saved["dirs"]["bert"], saved["test"]
    bad_label = tmp_path / "bad_label.tsv"
    bad_label.write_text("sentence\tlabel\ngood film\t1\nbad film\tpositive\n")
    one_column = tmp_path / "one_column.tsv"
    one_column.write_text("sentence\tlabel\ngood film\n")
    no_tokenizer = tmp_path / "no_tokenizer"
    _model("bert", _tokenizer("bert")).save_pretrained(no_tokenizer)
    encoder_only = tmp_path / "encoder_only"
    BertModel(BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=8)).save_pretrained(encoder_only)
    json_out = tmp_path / "never.jsonl"
    cases = [
        ([tmp_path / "missing", "--test", test], "no such folder"),
        ([bert, "--test", tmp_path / "missing.tsv"], "no such file"),
        ([bert, "--test", bad_label, "--json", json_out], "label 'positive' is not one the model knows (0, 1)"),
        ([bert, "--test", one_column, "--json", json_out], "expected 'sentence<TAB>label'"),
        ([tmp_path, "--test", test], "not a transformers model folder"),
        ([no_tokenizer, "--test", test], "no tokenizer"),
        ([encoder_only, "--test", test], "not a ...ForSequenceClassification"),
        ([bert, "--test", test, "--json", json_out, json_out], "--json: 2 file(s) for 1"),
    ]
    capsys.readouterr()  # the saves' progress bars
    for args, message in cases:
        code, err = _refusal(args, capsys)
        assert code == 1 and len(err) == 1 and err[0].startswith("[hf_faithfulness] error: ") and message in err[0], \
            (args, err)
    assert not json_out.exists()



def _argmax_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """A scheme registered from outside (as fairseq_dnas.hf's 'discrete' is):
    one key per query, the argmax of the masked scores; weights returned
    when output_attentions is asked for."""
    p = HF.softmax_weights(query, key, attention_mask, scaling)
    one_hot = F.one_hot(p.argmax(-1), p.shape[-1]).to(value.dtype)
    out = torch.matmul(one_hot, value).transpose(1, 2)
    return out, one_hot if kwargs.get("output_attentions") else None


def test_any_registered_scheme_is_read_and_one_without_weights_refused(tokenizers):
    """A scheme the reader does not know (registered with AttentionInterface,
    as hf.enable's schemes are) is read through its own weights: one-hot
    rows here, so a_j counts the queries whose argmax is j; a function that
    returns no weights is refused in one line, not read as softmax."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    tok = tokenizers["bert"]
    model = _model("bert", tok)
    AttentionInterface.register("test_argmax", _argmax_attention)
    AttentionMaskInterface.register("test_argmax", sdpa_mask)
    model.set_attn_implementation("test_argmax")
    encoded = dict(tok(SENTENCES, padding=True, return_tensors="pt", return_special_tokens_mask=True))
    r = HF.explain_batch(model, encoded)
    with torch.no_grad():
        own = model(**HF.model_inputs(model, encoded), output_attentions=True).attentions
    counts = attention_received([w.transpose(0, 1) for w in own], encoded["attention_mask"].eq(0),
                                encoded["special_tokens_mask"].bool())
    torch.testing.assert_close(r["attention"], counts, atol=0, rtol=0)
    assert set(r["attention"][r["real"]].tolist()) <= set(float(n) for n in range(100))  # whole counts
    assert float(r["importance"]["grad"][r["real"]].min()) >= 0

    def no_weights(module, query, key, value, attention_mask, **kwargs):
        out, _ = _argmax_attention(module, query, key, value, attention_mask, **kwargs)
        return out, None

    AttentionInterface.register("test_no_weights", no_weights)
    AttentionMaskInterface.register("test_no_weights", sdpa_mask)
    model.set_attn_implementation("test_no_weights")
    with pytest.raises(ValueError, match="returns no weights"):
        HF.explain_batch(model, encoded)
    assert model.config._attn_implementation == "test_no_weights"  # restored after the refusal
