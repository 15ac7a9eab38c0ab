"""examples/hf/run_summarization.py: a tiny random BART (tokenizer trained
on the data, no download) fine-tuned with HNAS on the first Gigaword pairs,
evaluated and decoded, in this process; the ROUGE of its metrics against
rouge_eval's scoring of the predictions file; u logged, saved and reloaded;
an interrupted run leaves no result files; truncation at 1,024 tokens and
labels padded with -100; mBART's forced first token; bad input in one line.
The command line itself, on a CNN/DailyMail-shaped JSON lines sample with
DNAS and sdpa, is in the full tier."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

SCRIPT = os.path.join(ROOT, "examples", "hf", "run_summarization.py")
_spec = importlib.util.spec_from_file_location("run_summarization", SCRIPT)
summ = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summ)

QUICK = ["--save_strategy", "no", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true",
         "--dataloader_num_workers", "0"]


def _gigaword_pairs(gigaword_dir, folder, train=32, test=8):
    """fairseq-style train/test .source/.target files: the first Gigaword pairs."""
    os.makedirs(folder, exist_ok=True)
    for split, (src, tgt), n in (("train", ("train/train.article.txt", "train/train.title.txt"), train),
                                 ("test", ("Giga/input.txt", "Giga/task1_ref0.txt"), test)):
        for path, suffix in ((src, "source"), (tgt, "target")):
            with open(os.path.join(gigaword_dir, path), encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with open(os.path.join(folder, f"{split}.{suffix}"), "w", encoding="utf-8") as g:
                g.writelines(lines)
    return folder


def test_tiny_hnas_trains_decodes_scores_and_reloads(tmp_path, gigaword_dir, capsys):
    from fairseq_dnas import hf
    from fairseq_dnas.commands import rouge_eval

    data, out = _gigaword_pairs(gigaword_dir, str(tmp_path / "data")), str(tmp_path / "out")
    args = ["--tiny", "--scheme", "hnas", "--hybrid_init", "0.3", "--train_file", f"{data}/train.source",
            "--validation_file", f"{data}/test.source", "--test_file", f"{data}/test.source",
            "--max_eval_samples", "4", "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
            "--output_dir", out, "--max_steps", "4", "--per_device_train_batch_size", "8",
            "--per_device_eval_batch_size", "8", "--learning_rate", "1e-2", "--logging_steps", "2",
            "--generation_max_length", "12", "--num_beams", "2", "--no_repeat_ngram_size", "2", *QUICK]
    assert summ.main(args) == 0
    results = json.loads(open(os.path.join(out, "all_results.json")).read())
    predictions = open(os.path.join(out, "generated_predictions.txt"), encoding="utf-8").read().splitlines()
    assert len(predictions) == 8 and results["predict_samples"] == 8 and results["eval_samples"] == 4
    # every ROUGE type the project's scorer lists (ROUGE-Lsum among them: checked last)
    for t in rouge_eval.TYPES:
        assert 0 <= results[f"predict_{t}"] <= 100 and f"eval_{t}" in results
    # the metrics (decoded label ids) agree with rouge_eval on the files (headlines are far below 128 tokens)
    full = json.loads(open(os.path.join(out, "predict_rouge.json")).read())
    refs = open(f"{data}/test.target", encoding="utf-8").read().splitlines()
    assert full["sentences"] == 8
    for t in rouge_eval.TYPES:
        assert abs(full["stemmed"][t]["fmeasure"]["mean"] - results[f"predict_{t}"]) < 1e-3, t
    assert full["stemmed"] == rouge_eval.evaluate(predictions, [refs])["stemmed"]
    # the decoding settings apply: no bigram twice in a prediction, at most 12 tokens
    for line in predictions:
        words = line.split()
        bigrams = list(zip(words, words[1:]))
        assert len(bigrams) == len(set(bigrams)), line
    assert results["predict_gen_len"] <= 12

    # u: logged during training, trained away from hybrid_init, saved, restored by hf.from_pretrained
    state = json.loads(open(os.path.join(out, "trainer_state.json")).read())
    logged = [h for h in state["log_history"] if "u/layer0" in h]
    assert len(logged) >= 2 and all("u/layer1" in h for h in logged)
    history = [json.loads(line) for line in open(os.path.join(out, "hybrid_weights.jsonl"))]
    assert history[-1]["u"] == results["u"] and len(results["u"]) == 2 and len(results["u"][0]) == 4
    assert max(abs(u - 0.3) for row in results["u"] for u in row) > 1e-4  # HNAS ran: its u got gradients
    from transformers import AutoModelForSeq2SeqLM

    model = hf.from_pretrained(AutoModelForSeq2SeqLM, out)
    assert model.config.dnas == {"scheme": "hnas", "hybrid_init": 0.3, "per": "head"}
    assert hf.callback.layer_weights(model) == results["u"]

    # the saved folder keeps its scheme: another one is refused in one line, before anything is written
    capsys.readouterr()
    assert summ.main(["--model_name_or_path", out, "--scheme", "dnas", "--test_file", f"{data}/test.source",
                      "--do_predict", "--predict_with_generate", "--output_dir", str(tmp_path / "again"), *QUICK]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {out} was saved with scheme 'hnas': drop --scheme dnas (it keeps 'hnas'), or start from the plain "
        "pretrained model"]
    assert not (tmp_path / "again").exists()

    # an interrupted run from the saved folder: no result file of the earlier run is left to pass for it
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    from transformers import Seq2SeqTrainer

    predict, Seq2SeqTrainer.predict = Seq2SeqTrainer.predict, interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            summ.main(["--model_name_or_path", out, "--test_file", f"{data}/test.source", "--do_predict",
                       "--predict_with_generate", "--output_dir", out, *QUICK])
    finally:
        Seq2SeqTrainer.predict = predict
    left = set(os.listdir(out))
    assert not left & set(summ.RESULT_FILES), left
    assert "config.json" in left  # the model is kept

    assert "rougeLsum" in rouge_eval.TYPES and "predict_rougeLsum" in results


def test_sources_truncated_at_1024_and_labels_padded_with_minus_100():
    words = [f"w{i % 50}" for i in range(3000)]
    tokenizer = summ.tiny_tokenizer([" ".join(words)], 300)
    margs, dargs, targs = summ.parse(["--tiny", "--do_train", "--output_dir", "unused"])
    assert dargs.max_source_length == 1024
    examples = summ.encode(tokenizer, [" ".join(words), "w1 w2"], ["w3 w4 w5 w6", "w7"],
                           dargs.max_source_length, dargs.max_target_length)
    assert len(examples[0]["input_ids"]) == 1024 and examples[0]["input_ids"][-1] == tokenizer.eos_token_id
    assert len(examples[1]["input_ids"]) < 10
    model = summ.tiny_bart(tokenizer, 1024)
    batch = summ.collator(tokenizer, model, dargs)(examples)
    short = len(examples[1]["labels"])
    assert (batch["labels"][1, short:] == -100).all() and (batch["labels"][1, :short] >= 0).all()
    assert (batch["labels"][0] >= 0).all()
    # -100 is left out of the loss: the padded example's loss is its own alone
    model.eval()
    with torch.no_grad():
        both = model(**batch).logits
        alone = model(**summ.collator(tokenizer, model, dargs)([examples[1]])).logits
    assert torch.allclose(both[1, :short], alone[0], atol=1e-5)


def test_mbart_lang_forces_the_first_generated_token(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import MBartConfig, MBartForConditionalGeneration, PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", "a", "b", "c", "en_XX", "de_DE"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                        unk_token="<unk>", additional_special_tokens=["en_XX", "de_DE"])
    torch.manual_seed(0)
    model = MBartForConditionalGeneration(MBartConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=32,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=None))
    model.eval()
    ids = tokenizer(["a b c", "c b"], return_tensors="pt", padding=True)
    assert not (model.generate(**ids, max_length=6, num_beams=2)[:, 1] == vocab["de_DE"]).all()  # not by chance
    assert summ.set_language(model, tokenizer, "de_DE", None) == vocab["de_DE"]
    out = model.generate(**ids, max_length=6, num_beams=2)
    assert (out[:, 0] == 2).all() and (out[:, 1] == vocab["de_DE"]).all()
    with pytest.raises(summ.InputError, match="the tokenizer has no token 'xx_YY'"):
        summ.set_language(model, tokenizer, "xx_YY", None)


def test_compute_metrics_decodes_the_ids_and_scores_with_rouge_eval():
    import numpy as np

    from fairseq_dnas.commands import rouge_eval

    hyps = ["police arrest a man in the city", "fire in the centre on monday"]
    refs = ["a man was arrested by police.\nthe city was calm.", "a fire broke out on monday"]
    tokenizer = summ.tiny_tokenizer(hyps + refs, 300)

    def padded(texts, fill):  # generate pads with pad_token_id, the labels with -100
        ids = tokenizer(texts)["input_ids"]
        width = max(map(len, ids)) + 2
        return np.array([row + [fill] * (width - len(row)) for row in ids])

    result = summ.metrics_function(tokenizer)((padded(hyps, tokenizer.pad_token_id), padded(refs, -100)))
    expected = rouge_eval.sentence_scores(hyps, [refs], use_stemmer=True).mean(axis=0)[:, 2] * 100
    assert [result[t] for t in rouge_eval.TYPES] == pytest.approx(list(expected), abs=1e-3)
    assert 0 < result["rouge1"] < 100 and result["rouge2"] < result["rouge1"]
    assert result["gen_len"] == np.mean([len(tokenizer(h)["input_ids"]) for h in hyps])


@pytest.mark.parametrize("case", ["missing file", "missing column", "unknown scheme", "no target file", "no model"])
def test_bad_input_is_one_line(tmp_path, capsys, case):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"article": "a b c", "highlights": "a"}) + "\n")
    (tmp_path / "x.source").write_text("a b\n")
    base = ["--do_train", "--output_dir", str(tmp_path / "out")] + ([] if case == "no model" else ["--tiny"])
    args, code, line = {
        "missing file": (["--train_file", str(tmp_path / "nope.jsonl")], 1,
                         f"error: --train_file {tmp_path / 'nope.jsonl'}: no such file"),
        "missing column": (["--train_file", str(data), "--summary_column", "summary"], 1,
                           f"error: {data} has no column 'summary' (--summary_column); its columns: article, "
                           "highlights"),
        "unknown scheme": (["--train_file", str(data), "--scheme", "flash"], 2,
                           "error: argument --scheme: invalid choice: 'flash' (choose from 'sdpa', 'dnas', 'hnas')"),
        "no target file": (["--train_file", str(tmp_path / "x.source")], 1,
                           f"error: --train_file {tmp_path / 'x.source'}: its summaries {tmp_path / 'x.target'} "
                           "do not exist (a .source file goes with a .target file, line by line)"),
        "no model": (["--train_file", str(data), "--model_name_or_path", str(tmp_path / "bart")], 1,
                     f"error: --model_name_or_path {tmp_path / 'bart'}: no such folder (a save_pretrained folder, or "
                     "a hub name such as facebook/bart-large)"),
    }[case]
    assert summ.main(base + args) == code
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [line], err
    assert not (tmp_path / "out" / "all_results.json").exists()


def _cnndm_sample(folder, n):
    """CNN/DailyMail-shaped JSON lines: long multi-sentence articles (more
    tokens than --max_source_length), highlights one sentence a line."""
    import random

    rng = random.Random(0)
    words = "the police said a man was arrested on monday after a fire in the city centre".split()
    with open(folder / "cnndm.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            sentences = [" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(40)]
            highlights = "\n".join(sentences[j][:40].rstrip() + "." for j in range(3))
            f.write(json.dumps({"article": " ".join(sentences), "highlights": highlights, "id": str(i)}) + "\n")
    return str(folder / "cnndm.jsonl")


@pytest.mark.full
@pytest.mark.parametrize("scheme", ["dnas", "sdpa"])
def test_command_line_on_a_cnndm_shaped_sample(tmp_path, scheme):
    data, out = _cnndm_sample(tmp_path, 24), str(tmp_path / "out")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--tiny", "--scheme", scheme, "--train_file", data, "--validation_file", data,
         "--test_file", data, "--max_eval_samples", "4", "--max_predict_samples", "6", "--text_column", "article",
         "--summary_column", "highlights", "--max_source_length", "256", "--max_target_length", "48",
         "--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--output_dir", out,
         "--max_steps", "3", "--per_device_train_batch_size", "4", "--generation_max_length", "24",
         "--num_beams", "2", "--no_repeat_ngram_size", "3", "--length_penalty", "2.0", "--min_length", "4",
         *QUICK], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"encoder self-attention {scheme}" in proc.stderr and "R-Lsum" in proc.stderr
    results = json.loads(open(os.path.join(out, "all_results.json")).read())
    assert results["scheme"] == scheme and "predict_rougeLsum" in results and "eval_rougeLsum" in results
    assert len(open(os.path.join(out, "generated_predictions.txt")).read().splitlines()) == 6
    config = json.loads(open(os.path.join(out, "config.json")).read())
    assert (config.get("dnas") or {}).get("scheme") == (scheme if scheme != "sdpa" else None)
    generation = json.loads(open(os.path.join(out, "generation_config.json")).read())
    assert generation["no_repeat_ngram_size"] == 3 and generation["num_beams"] == 2
