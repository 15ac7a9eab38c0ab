#!/usr/bin/env python
"""Is attention an explanation? Kendall's tau between the attention each
token receives and its gradient importance, per test sentence, for a Hugging
Face transformers sequence classifier (any ...ForSequenceClassification
saved locally with save_pretrained, its tokenizer saved in the same folder),
plain or switched by fairseq_dnas.hf.enable (sdpa, DNAS, HNAS, discrete, any
scheme it was enabled with). The thesis's metric (J. Kinley, 2020, Chapter 6;
Jain & Wallace, 2019), as fairseq_dnas.commands.faithfulness computes it for
fairseq classifiers; definitions in fairseq_dnas/hf/faithfulness.py and
docs/analysis.md.

    hf_faithfulness.py MODEL_DIR [MODEL_DIR ...] --test TEST.tsv
            [--importance grad|grad-x-input] [--detach-attention]
            [--json FILE [FILE ...]] [--plot FIGURE.png] [--labels NAME ...]
            [--batch 32] [--max-examples N] [--threads 1]

TEST.tsv: one "sentence<TAB>label" a line, UTF-8 (a first line
"sentence<TAB>label" is a header and skipped; blank lines are skipped), the
label the class index 0 .. num_labels-1 of the model (the layout of GLUE's
SST-2 dev.tsv and of Jain & Wallace's SST test.tsv). The sentence goes through
the model's own tokenizer as it is.

Importance at h0, the output of the embeddings module (after its LayerNorm,
before dropout; BART/mBART: the encoder's layernorm_embedding); attention
received summed over the bidirectional self-attention layers, heads and real
queries; the tokenizer's special tokens and padding left out as keys.
--detach-attention: the attention probabilities are constants for the
gradient (Jain & Wallace's code); default: the gradient runs through them
too (the thesis, Section 5.4).

Prints per model the accuracy, tau mean +- standard deviation and the count
of sentences left out (tau undefined) on stderr, and one JSON summary line
on stdout; --json writes one line per sentence (one file per model): index,
tokens (ids fed, special tokens included), pieces, attention, importance,
tau, label, prediction. Bad input (a missing folder or file, a folder
without a classifier or tokenizer, a label the model does not know) stops
with one line and exit status 1; no --json file is written then.
"""

import argparse
import os
import sys
import time

from fairseq_dnas.commands.faithfulness import (add_metric_options, add_run_options, check_counts, finish, metric_name,
                                                parse_run_args, report)
from fairseq_dnas.commands.sentence_classify import BadInput, exit_status, read_labelled

TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def load(model_dir):
    """(model in eval mode, tokenizer) of a folder written by save_pretrained;
    a model saved after fairseq_dnas.hf.enable gets its scheme back."""
    import transformers
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from fairseq_dnas import hf

    transformers.logging.set_verbosity_error()  # stderr holds our lines: one per model, one per problem
    transformers.utils.logging.disable_progress_bar()
    if not os.path.isdir(model_dir):
        raise BadInput(f"{model_dir}: no such folder (give the folder written by save_pretrained)")
    try:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        raise BadInput(f"{model_dir}: not a transformers model folder ({str(err).splitlines()[0]})") from None
    if not any(a.endswith("ForSequenceClassification") for a in (config.architectures or [])):
        raise BadInput(f"{model_dir}: holds a {', '.join(config.architectures or ['model'])}, not a "
                       "...ForSequenceClassification")
    try:
        if isinstance(getattr(config, "dnas", None), dict):
            model = hf.from_pretrained(AutoModelForSequenceClassification, model_dir, local_files_only=True)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        raise BadInput(f"{model_dir}: {str(err).splitlines()[0]}") from None
    # Without its files AutoTokenizer may still build one from the config, with
    # no vocabulary of this model's: ask for what tokenizer.save_pretrained writes.
    if not any(os.path.isfile(os.path.join(model_dir, f)) for f in TOKENIZER_FILES):
        raise BadInput(f"{model_dir}: no tokenizer ({' or '.join(TOKENIZER_FILES)}); save the model's tokenizer "
                       "there with tokenizer.save_pretrained")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise BadInput(f"{model_dir}: no tokenizer (save it there with tokenizer.save_pretrained; "
                       f"{str(err).splitlines()[0]})") from None
    return model.eval(), tokenizer


def measure(model_dir, args):
    """(summary, rows) of one model."""
    import torch

    from fairseq_dnas.hf.faithfulness import faithfulness, label_names

    model, tokenizer = load(model_dir)
    sentences, gold = read_labelled(args.test, label_names(model))
    if args.max_examples:
        sentences, gold = sentences[:args.max_examples], gold[:args.max_examples]
    limit = getattr(model.config, "max_position_embeddings", None)
    for i, sentence in enumerate(sentences):
        n = len(tokenizer(sentence)["input_ids"])
        if limit and n > limit:
            raise BadInput(f"{args.test}: sentence {i + 1} is {n} tokens long; {model_dir} takes at most {limit}")
    t0 = time.time()
    try:
        summary, rows = faithfulness(model, tokenizer, sentences, gold, args.importance, args.detach_attention,
                                     args.batch)
    except ValueError as err:  # a model whose attention or h0 cannot be read
        raise BadInput(f"{model_dir}: {err}") from None
    summary.update({"model": model_dir, "test": args.test, "scheme": model.config._attn_implementation,
                    "seconds": round(time.time() - t0, 2), "threads": torch.get_num_threads()})
    return summary, rows


def run(args):
    check_counts(args, args.models)
    if not os.path.isfile(args.test):
        raise BadInput(f"{args.test}: no such file")
    labels = args.labels or [os.path.basename(os.path.abspath(d)) for d in args.models]
    series, per_model = [], []
    for label, model_dir in zip(labels, args.models):
        summary, rows = measure(model_dir, args)
        report(label, summary)
        per_model.append(rows)
        series.append((label, summary["scheme"], [r["tau"] for r in rows if r["tau"] is not None]))
    finish(args, per_model, series, f" ({metric_name(args)})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+", metavar="MODEL_DIR",
                   help="save_pretrained folders of ...ForSequenceClassification models with their tokenizer")
    p.add_argument("--test", required=True, help="sentence<TAB>label file (label: the class index)")
    add_metric_options(p, "sentence", streams=False)
    add_run_options(p, batch=32)
    args = parse_run_args(p, argv)
    return exit_status("hf_faithfulness", run, args)


if __name__ == "__main__":
    sys.exit(main())
