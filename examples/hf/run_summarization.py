#!/usr/bin/env python
"""Fine-tune and evaluate a transformers summarizer (BART, mBART, PEGASUS, ...)
with its encoder self-attention sdpa (transformers' own), DNAS or HNAS.

    python examples/hf/run_summarization.py \\
        --model_name_or_path facebook/bart-large --scheme hnas --hybrid_init 0.5 \\
        --train_file train.jsonl --validation_file val.jsonl --test_file test.jsonl \\
        --text_column article --summary_column highlights \\
        --do_train --do_eval --do_predict --predict_with_generate --output_dir out

What Hugging Face's examples/pytorch/summarization/run_summarization.py does,
on local files only, with the flags of its arguments (and every flag of
Seq2SeqTrainingArguments): sources truncated at --max_source_length (1,024)
tokens, labels at --max_target_length (128) and padded with -100 (left out
of the loss); Seq2SeqTrainer with --predict_with_generate,
--generation_max_length (or --val_max_target_length) and --num_beams (or
--generation_num_beams); --no_repeat_ngram_size, --length_penalty and
--min_length set on the model's generation config; ROUGE F1 in percent of
every type fairseq_dnas.commands.rouge_eval scores (ROUGE-1/2/L/Lsum, rouge-score
with Porter stemming, as the published figures); mBART's target language
with --lang (the decoder's first token, forced_bos_token_id).

Data (--train_file, --validation_file, --test_file): JSON lines (.jsonl,
.json: one object a line), CSV (.csv, a header line), or fairseq's
.source/.target pair (name the .source file; line N of the .target file is
its summary). Columns: --text_column and --summary_column, by default the
first two of the file.

--scheme: sdpa leaves the model as loaded; dnas and hnas switch its encoder
self-attention with fairseq_dnas.hf.enable (the decoder stays softmax). A
folder saved after training with dnas/hnas is loaded with
fairseq_dnas.hf.from_pretrained (scheme, settings and u restored) and keeps
its scheme. For HNAS, u per layer is logged by
fairseq_dnas.hf.HybridWeightCallback (``u/layer<i>`` in the Trainer's logs and
trainer_state.json, every (layer x head) value in hybrid_weights.jsonl).

--tiny: a random-init tiny BART (d_model 32, 2 + 2 layers) and a byte-level
BPE tokenizer trained on the training texts, to check the pipeline on a CPU
without any download (its ROUGE means nothing).

Outputs in --output_dir: the model and tokenizer (--do_train),
generated_predictions.txt (one summary a line, --do_predict),
predict_rouge.json (rouge_eval's full result against the test file's own
summaries, with bootstrap intervals), {train,eval,predict}_results.json and
all_results.json. Every file is written whole or not at all, and
all_results.json last: a folder without it is an unfinished run (the files
of an earlier run there are removed when a run starts).
"""

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass, field
from typing import List, Optional

SCHEMES = ("sdpa", "dnas", "hnas")
RESULT_FILES = ("generated_predictions.txt", "predict_rouge.json", "train_results.json", "eval_results.json",
                "predict_results.json", "all_results.json")
HISTORY = "hybrid_weights.jsonl"  # u at each Trainer log of an HNAS run; a new training run starts it afresh
# the tiny model of --tiny (a pipeline check, not a summarizer)
TINY = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # BART's order: ids 0-4


class InputError(Exception):
    """Bad input: one line for the user; exit status ``code`` (argparse's 2
    for a bad command line, else 1)."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "a save_pretrained folder or a hub name (facebook/bart-large)"})
    tokenizer_name: Optional[str] = field(default=None, metadata={"help": "default: --model_name_or_path"})
    tiny: bool = field(default=False, metadata={"help": "a random-init tiny BART and a tokenizer trained on the data"})
    tiny_vocab_size: int = field(default=600, metadata={"help": "--tiny: the tokenizer's vocabulary size"})
    scheme: Optional[str] = field(
        default=None, metadata={"help": "encoder self-attention; default: the saved folder's scheme, else sdpa",
                                "choices": SCHEMES})
    hybrid_init: Optional[float] = field(default=None, metadata={"help": "hnas: the initial u (default 0.5)"})
    per: Optional[str] = field(default=None, metadata={"help": "hnas: one u per 'head' (default) or 'layer'",
                                                        "choices": ("head", "layer")})


@dataclass
class DataArguments:
    train_file: Optional[str] = field(default=None, metadata={"help": ".jsonl, .json, .csv or .source"})
    validation_file: Optional[str] = field(default=None, metadata={"help": ".jsonl, .json, .csv or .source"})
    test_file: Optional[str] = field(default=None, metadata={"help": ".jsonl, .json, .csv or .source"})
    text_column: Optional[str] = field(default=None, metadata={"help": "the source text (default: first column)"})
    summary_column: Optional[str] = field(default=None, metadata={"help": "the summary (default: second column)"})
    max_source_length: int = field(default=1024, metadata={"help": "sources are truncated to this many tokens"})
    max_target_length: int = field(default=128, metadata={"help": "training labels are truncated to this"})
    val_max_target_length: Optional[int] = field(
        default=None, metadata={"help": "evaluation labels' length and generate's max_length (default: "
                                        "--generation_max_length, else --max_target_length)"})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "the first N training pairs"})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "the first N validation pairs"})
    max_predict_samples: Optional[int] = field(default=None, metadata={"help": "the first N test pairs"})
    num_beams: Optional[int] = field(default=None, metadata={"help": "beams (default: --generation_num_beams)"})
    no_repeat_ngram_size: Optional[int] = field(default=None, metadata={"help": "generate: block repeated n-grams"})
    length_penalty: Optional[float] = field(default=None, metadata={"help": "generate: beam length penalty"})
    min_length: Optional[int] = field(default=None, metadata={"help": "generate: minimum summary length"})
    ignore_pad_token_for_loss: bool = field(default=True, metadata={"help": "labels padded with -100"})
    source_prefix: str = field(default="", metadata={"help": "prepended to every source (T5: 'summarize: ')"})
    lang: Optional[str] = field(
        default=None, metadata={"help": "mBART: the language code (en_XX): the tokenizer's source and target "
                                        "language, and the token generation starts with (forced_bos_token_id)"})
    forced_bos_token: Optional[str] = field(
        default=None, metadata={"help": "the token generation starts with (default: --lang)"})


class OneLineParser:
    """transformers' HfArgumentParser whose errors are one line (argparse
    prints the usage of ~150 flags first)."""

    @staticmethod
    def build():
        from transformers import HfArgumentParser, Seq2SeqTrainingArguments

        class Parser(HfArgumentParser):
            def error(self, message):
                raise InputError(message, code=2)

        return Parser((ModelArguments, DataArguments, Seq2SeqTrainingArguments), description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)


# ---------------------------------------------------------------- data

def read_pairs(path: str, text_column: Optional[str], summary_column: Optional[str], flag: str):
    """(sources, summaries) of a .jsonl/.json, .csv or .source file."""
    if not path:
        raise InputError(f"{flag} is required here")
    if not os.path.isfile(path):
        raise InputError(f"{flag} {path}: no such file")
    if path.endswith(".source"):
        target = path[: -len(".source")] + ".target"
        if not os.path.isfile(target):
            raise InputError(f"{flag} {path}: its summaries {target} do not exist (a .source file goes with a "
                             ".target file, line by line)")
        if text_column or summary_column:
            raise InputError(f"{flag} {path}: a .source/.target pair has no columns; drop --text_column and "
                             "--summary_column")
        sources, targets = _lines(path), _lines(target)
        if len(sources) != len(targets):
            raise InputError(f"{path} has {len(sources)} lines but {target} has {len(targets)}: they must be "
                             "aligned line by line")
        rows, columns = [{"source": s, "target": t} for s, t in zip(sources, targets)], ["source", "target"]
    elif path.endswith((".jsonl", ".json")):
        rows = []
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"{path}:{number}: not JSON ({err.msg}); one JSON object a line") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path}:{number}: not a JSON object; one object a line")
                rows.append(row)
        columns = list(rows[0]) if rows else []
    elif path.endswith(".csv"):
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), list(reader.fieldnames or [])
    else:
        raise InputError(f"{flag} {path}: unknown format; give a .jsonl, .json, .csv or .source file")
    if not rows:
        raise InputError(f"{flag} {path}: no examples in it")
    if len(columns) < 2 and not (text_column and summary_column):
        raise InputError(f"{path} has the columns {columns}: it needs a text and a summary column")
    text_column = text_column or columns[0]
    summary_column = summary_column or columns[1]
    for name, option in ((text_column, "--text_column"), (summary_column, "--summary_column")):
        if name not in columns:
            raise InputError(f"{path} has no column {name!r} ({option}); its columns: {', '.join(columns)}")
    for number, row in enumerate(rows, start=1):
        for name in (text_column, summary_column):
            if not isinstance(row.get(name), str):
                raise InputError(f"{path}: example {number} has no text in column {name!r}")
    return [r[text_column] for r in rows], [r[summary_column] for r in rows]


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\r\n") for line in f]


def encode(tokenizer, sources, summaries, max_source_length, max_target_length, prefix=""):
    """Examples as the collator takes them: input_ids truncated to
    max_source_length tokens, labels to max_target_length (padded later)."""
    inputs = tokenizer([prefix + s for s in sources], max_length=max_source_length, truncation=True)
    labels = tokenizer(text_target=summaries, max_length=max_target_length, truncation=True)
    return [{"input_ids": ids, "attention_mask": mask, "labels": lab}
            for ids, mask, lab in zip(inputs["input_ids"], inputs["attention_mask"], labels["input_ids"])]


def collator(tokenizer, model, dargs):
    """Pads a batch to its longest source and its longest summary; the labels'
    padding is -100 (left out of the loss) unless --ignore_pad_token_for_loss
    false; decoder_input_ids are the labels shifted right (the model's own
    prepare_decoder_input_ids_from_labels)."""
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(
        tokenizer, model=model, label_pad_token_id=-100 if dargs.ignore_pad_token_for_loss else tokenizer.pad_token_id)


# ---------------------------------------------------------------- model

def tiny_tokenizer(texts: List[str], vocab_size: int):
    """A byte-level BPE tokenizer (BART's kind) trained on ``texts``, with BART's
    special tokens and '<s> ... </s>' around each text: no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                   unk_token="<unk>", mask_token="<mask>")


def tiny_bart(tokenizer, positions: int):
    """A random-init BartForConditionalGeneration of the TINY sizes."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(vocab_size=len(tokenizer), max_position_embeddings=positions, pad_token_id=1, bos_token_id=0,
                        eos_token_id=2, decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=2,
                        **TINY)
    return BartForConditionalGeneration(config)


def saved_scheme(path: Optional[str]) -> Optional[str]:
    """The scheme a folder was saved with after fairseq_dnas.hf.enable (None: a plain model)."""
    config = os.path.join(path or "", "config.json")
    if not path or not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        dnas = json.load(f).get("dnas")
    return dnas.get("scheme") if isinstance(dnas, dict) else None


def load_model(margs, texts: List[str], positions: int):
    """(model, tokenizer, scheme) with the encoder switched to the scheme."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from fairseq_dnas import hf

    if margs.tiny and margs.model_name_or_path:
        raise InputError("--tiny builds its own model: drop --model_name_or_path (or --tiny)")
    if not margs.tiny and not margs.model_name_or_path:
        raise InputError("--model_name_or_path is required (a save_pretrained folder or a hub name such as "
                         "facebook/bart-large), or --tiny for a pipeline check")
    path = margs.model_name_or_path
    saved = None if margs.tiny else saved_scheme(path)
    scheme = margs.scheme or saved or "sdpa"
    if saved and scheme != saved:
        raise InputError(f"{path} was saved with scheme {saved!r}: drop --scheme {scheme} (it keeps {saved!r}), or "
                         "start from the plain pretrained model")
    given = {"hybrid_init": margs.hybrid_init, "per": margs.per}
    if scheme != "hnas" and any(v is not None for v in given.values()):
        raise InputError(f"--hybrid_init and --per apply to --scheme hnas only; drop them for --scheme {scheme}")
    if saved and any(v is not None for v in given.values()):
        raise InputError(f"{path} restores its own u: drop --hybrid_init and --per")
    if path and (os.path.isabs(path) or path.startswith(".")) and not os.path.isdir(path):
        raise InputError(f"--model_name_or_path {path}: no such folder (a save_pretrained folder, or a hub name "
                         "such as facebook/bart-large)")
    if margs.tiny:
        tokenizer = tiny_tokenizer(texts, margs.tiny_vocab_size)
        model = tiny_bart(tokenizer, positions)
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(margs.tokenizer_name or path)
            model = (hf.from_pretrained(AutoModelForSeq2SeqLM, path) if saved
                     else AutoModelForSeq2SeqLM.from_pretrained(path))
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise InputError(f"--model_name_or_path {path}: cannot load it ({first})") from None
    if scheme != "sdpa" and not saved:
        try:
            hf.enable(model, scheme=scheme, **({k: v for k, v in given.items() if v is not None}
                                               if scheme == "hnas" else {}))
        except ValueError as err:
            raise InputError(f"--scheme {scheme}: {err}") from None
    return model, tokenizer, scheme


def set_language(model, tokenizer, lang: Optional[str], forced_bos_token: Optional[str]):
    """mBART: the tokenizer's source and target language, and the first token
    generate() produces after decoder_start_token_id (forced_bos_token_id)."""
    token = forced_bos_token or lang
    if lang is not None:
        for attr in ("src_lang", "tgt_lang"):
            if hasattr(tokenizer, attr):
                setattr(tokenizer, attr, lang)
    if token is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise InputError(f"the tokenizer has no token {token!r} (--lang/--forced_bos_token): give a language code "
                         "of the model's tokenizer, such as en_XX for mBART")
    # generate() reads the generation config (transformers refuses generation settings on model.config)
    model.generation_config.forced_bos_token_id = token_id
    if model.generation_config.decoder_start_token_id is None and model.config.decoder_start_token_id is None:
        model.generation_config.decoder_start_token_id = model.config.decoder_start_token_id = token_id
    return token_id


# ---------------------------------------------------------------- metrics and outputs

def rouge_means(predictions: List[str], references: List[str]) -> dict:
    """Mean ROUGE F1 in percent, with Porter stemming, of every type
    ``rouge_eval.TYPES`` lists, key as in rouge-score (rouge1, ..., rougeLsum)."""
    from fairseq_dnas.commands import rouge_eval

    scores = rouge_eval.sentence_scores(predictions, [references], use_stemmer=True)  # (N, types, parts)
    f1 = rouge_eval.PARTS.index("fmeasure")
    return {t: round(100 * float(scores[:, i, f1].mean()), 4) for i, t in enumerate(rouge_eval.TYPES)}


def metrics_function(tokenizer):
    """compute_metrics for Seq2SeqTrainer with predict_with_generate."""
    import numpy as np

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        # -100 (labels' padding, and generate's past the end under some settings) is no token
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        hyps = [t.strip() for t in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        refs = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = rouge_means(hyps, refs)
        result["gen_len"] = float(np.mean(np.count_nonzero(preds != tokenizer.pad_token_id, axis=1)))
        return result

    return compute_metrics


def write_atomic(path: str, text: str):
    """``text`` into ``path`` whole or not at all."""
    tmp = path + ".partial"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_json(path: str, record: dict):
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------- main

def parse(argv):
    parser = OneLineParser.build()
    try:
        margs, dargs, targs = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except ValueError as err:  # Seq2SeqTrainingArguments' own checks of its settings
        raise InputError(str(err).strip().splitlines()[0], code=2) from None
    if not (targs.do_train or targs.do_eval or targs.do_predict):
        raise InputError("nothing to do: pass --do_train, --do_eval and/or --do_predict")
    if targs.do_predict and not targs.predict_with_generate:
        raise InputError("--do_predict writes generated summaries: add --predict_with_generate")
    for name in ("max_source_length", "max_target_length", "val_max_target_length", "num_beams",
                 "no_repeat_ngram_size", "min_length"):
        value = getattr(dargs, name)
        if value is not None and value < (0 if name in ("no_repeat_ngram_size", "min_length") else 1):
            raise InputError(f"--{name} {value}: must be a positive number")
    return margs, dargs, targs


def run(margs, dargs, targs):
    import numpy as np
    from transformers import Seq2SeqTrainer, set_seed

    from fairseq_dnas import hf

    data = {}
    for split, path, flag, wanted, limit in (
            ("train", dargs.train_file, "--train_file", targs.do_train, dargs.max_train_samples),
            ("eval", dargs.validation_file, "--validation_file", targs.do_eval, dargs.max_eval_samples),
            ("predict", dargs.test_file, "--test_file", targs.do_predict, dargs.max_predict_samples)):
        if wanted:
            sources, summaries = read_pairs(path, dargs.text_column, dargs.summary_column, flag)
            data[split] = (sources[:limit], summaries[:limit]) if limit else (sources, summaries)
    max_length = dargs.val_max_target_length or targs.generation_max_length or dargs.max_target_length
    targs.generation_max_length = max_length
    targs.generation_num_beams = dargs.num_beams or targs.generation_num_beams
    set_seed(targs.seed)

    texts = [t for sources, summaries in data.values() for t in (*sources, *summaries)]
    positions = max(dargs.max_source_length, dargs.max_target_length, max_length)
    model, tokenizer, scheme = load_model(margs, texts, positions)
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and dargs.max_source_length > limit:
        raise InputError(f"--max_source_length {dargs.max_source_length} is more than the model's "
                         f"{limit} positions: lower it to {limit}")
    set_language(model, tokenizer, dargs.lang, dargs.forced_bos_token)
    generation = model.generation_config
    for name in ("no_repeat_ngram_size", "length_penalty", "min_length"):
        if getattr(dargs, name) is not None:
            setattr(generation, name, getattr(dargs, name))
    if targs.generation_num_beams:
        generation.num_beams = targs.generation_num_beams
    generation.max_length = max_length

    os.makedirs(targs.output_dir, exist_ok=True)
    stale = list(RESULT_FILES)  # an earlier run's results would pass for this one's
    if targs.do_train and not targs.resume_from_checkpoint:
        stale.append(HISTORY)  # a new training run starts the history of u afresh
    for name in stale:
        if os.path.exists(os.path.join(targs.output_dir, name)):
            os.remove(os.path.join(targs.output_dir, name))

    target_length = {"train": dargs.max_target_length, "eval": max_length, "predict": max_length}
    datasets = {split: encode(tokenizer, *pairs, dargs.max_source_length, target_length[split], dargs.source_prefix)
                for split, pairs in data.items()}
    trainer = Seq2SeqTrainer(
        model=model, args=targs, train_dataset=datasets.get("train"), eval_dataset=datasets.get("eval"),
        processing_class=tokenizer, data_collator=collator(tokenizer, model, dargs),
        compute_metrics=metrics_function(tokenizer) if targs.predict_with_generate else None)
    if scheme == "hnas":
        # first, so the printer and reporters after it see u/layer<i> in each log
        trainer.callback_handler.callbacks.insert(
            0, hf.HybridWeightCallback(path=os.path.join(targs.output_dir, HISTORY)))
    print(f"[summarization] {type(model).__name__}, encoder self-attention {scheme}; "
          + ", ".join(f"{split} {len(d)}" for split, d in datasets.items()), file=sys.stderr)

    results = {"scheme": scheme}
    if targs.do_train:
        outcome = trainer.train(resume_from_checkpoint=targs.resume_from_checkpoint)
        trainer.save_model()  # the model and its tokenizer; hf.from_pretrained restores dnas/hnas
        trainer.save_state()
        train = {**outcome.metrics, "train_samples": len(datasets["train"])}
        write_json(os.path.join(targs.output_dir, "train_results.json"), train)
        results.update(train)
    if targs.do_eval:
        evaluation = {**trainer.evaluate(metric_key_prefix="eval"), "eval_samples": len(datasets["eval"])}
        write_json(os.path.join(targs.output_dir, "eval_results.json"), evaluation)
        results.update(evaluation)
    if targs.do_predict:
        from fairseq_dnas.commands import rouge_eval

        output = trainer.predict(datasets["predict"], metric_key_prefix="predict")
        preds = np.where(output.predictions != -100, output.predictions, tokenizer.pad_token_id)
        summaries = [" ".join(t.split()) for t in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        write_atomic(os.path.join(targs.output_dir, "generated_predictions.txt"),
                     "".join(s + "\n" for s in summaries))
        # against the file's own summaries (not truncated), with intervals
        full = rouge_eval.evaluate(summaries, [data["predict"][1]], samples=1000, seed=0)
        write_json(os.path.join(targs.output_dir, "predict_rouge.json"), full)
        prediction = {**output.metrics, "predict_samples": len(summaries)}
        write_json(os.path.join(targs.output_dir, "predict_results.json"), prediction)
        results.update(prediction)
        print(rouge_eval.format_table(full), file=sys.stderr)
    if scheme == "hnas":
        results["u"] = hf.callback.layer_weights(model)
    write_json(os.path.join(targs.output_dir, "all_results.json"), results)  # last: the run is complete
    return results


def main(argv=None):
    try:
        margs, dargs, targs = parse(argv)
        run(margs, dargs, targs)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
