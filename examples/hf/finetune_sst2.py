#!/usr/bin/env python
"""Fine-tune a transformers encoder on SST-2 with Trainer, attention UNAS, DNAS or HNAS.

    python examples/hf/finetune_sst2.py --scheme hnas --seed 1 --out run.json

With --model-dir (a local directory from save_pretrained: there is no model
hub here) it starts from that model and its tokenizer; otherwise from a small
random-init BERT-style config and a word-level vocabulary built from
train.tsv. Reports accuracy on test.tsv with a bootstrap 95% interval, time
per training step, and for HNAS the weights u per layer (logged during
training by fairseq_dnas.hf.HybridWeightCallback). Writes one JSON file.
"""

import argparse
import collections
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

DEFAULT_DATA = os.environ.get("SST2_DIR")  # no default folder: the data is the user's
PAD, UNK, CLS = 0, 1, 2


def evaluation_file(data_dir):
    """The labelled file to report on: test.tsv when it has labels (a folder
    whose test.tsv holds the 872 labelled sentences), else dev.tsv (GLUE's own
    download, where those 872 are dev.tsv and test.tsv is unlabelled, with the
    header 'index<TAB>sentence')."""
    test, dev = os.path.join(data_dir, "test.tsv"), os.path.join(data_dir, "dev.tsv")
    if os.path.exists(test):
        with open(test, encoding="utf-8") as f:
            header = f.readline().rstrip("\n").split("\t")
        if header[:1] != ["index"] or not os.path.exists(dev):
            return test
        print(f"[sst2] {test} is GLUE's unlabelled test split: reporting on {dev} (GLUE's 872 labelled "
              "sentences)", file=sys.stderr)
    return dev if os.path.exists(dev) else test


def read_tsv(path):
    """(sentences, labels) of a GLUE SST-2 file with a 'sentence<TAB>label' header."""
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found: pass --data-dir (or set SST2_DIR), a GLUE SST-2 folder with train.tsv "
                 "and dev.tsv (GLUE's download) or train.tsv and a labelled test.tsv")
    sentences, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:2] != ["sentence", "label"]:
            sys.exit(f"error: {path} must start with the header 'sentence<TAB>label'; got {header}")
        for line in f:
            sentence, label = line.rstrip("\n").rsplit("\t", 1)
            sentences.append(sentence.strip())
            labels.append(int(label))
    return sentences, labels


class WordVocab:
    """Lower-cased whitespace words, the most frequent ``size`` of train.tsv."""

    def __init__(self, sentences, size):
        counts = collections.Counter(w for s in sentences for w in s.lower().split())
        self.index = {w: i + 3 for i, (w, _) in enumerate(counts.most_common(size - 3))}

    def __len__(self):
        return len(self.index) + 3

    def __call__(self, sentence, max_len):
        ids = [CLS] + [self.index.get(w, UNK) for w in sentence.lower().split()]
        return ids[:max_len]


def bootstrap_interval(correct, samples=2000, seed=0):
    """95% percentile bootstrap interval of the accuracy."""
    rng = np.random.default_rng(seed)
    correct = np.asarray(correct, dtype=float)
    means = correct[rng.integers(0, len(correct), (samples, len(correct)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheme", required=True, choices=["unas", "dnas", "hnas"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", required=True, help="JSON file with the results")
    p.add_argument("--data-dir", default=DEFAULT_DATA, help="GLUE SST-2 directory (env SST2_DIR)")
    p.add_argument("--model-dir", help="local pretrained model directory (save_pretrained); default: random init")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-len", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--hybrid-init", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if not args.data_dir:
        sys.exit("error: no data folder: pass --data-dir or set SST2_DIR to a GLUE SST-2 folder")

    from transformers import AutoModelForSequenceClassification, AutoTokenizer, BertConfig, Trainer, TrainingArguments

    from fairseq_dnas import hf

    torch.set_num_threads(args.threads)
    train_x, train_y = read_tsv(os.path.join(args.data_dir, "train.tsv"))
    test_x, test_y = read_tsv(evaluation_file(args.data_dir))
    torch.manual_seed(args.seed)
    if args.model_dir:
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        encode = lambda s: tokenizer(s, truncation=True, max_length=args.max_len)["input_ids"]  # noqa: E731
        pad_id = tokenizer.pad_token_id or 0
        model = AutoModelForSequenceClassification.from_pretrained(args.model_dir, num_labels=2)
    else:
        vocab = WordVocab(train_x, args.vocab_size)
        encode = lambda s: vocab(s, args.max_len)  # noqa: E731
        pad_id = PAD
        config = BertConfig(
            vocab_size=len(vocab), hidden_size=args.hidden, num_hidden_layers=args.layers,
            num_attention_heads=args.heads, intermediate_size=4 * args.hidden,
            max_position_embeddings=args.max_len, num_labels=2, pad_token_id=PAD,
        )
        model = AutoModelForSequenceClassification.from_config(config)
    hf.enable(model, scheme=args.scheme, hybrid_init=args.hybrid_init if args.scheme == "hnas" else None)

    train = [{"input_ids": encode(s), "labels": y} for s, y in zip(train_x, train_y)]
    test = [{"input_ids": encode(s), "labels": y} for s, y in zip(test_x, test_y)]

    def collate(batch):  # pad to the longest in the batch: the mask reaches the attention
        length = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, : len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, : len(b["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([b["labels"] for b in batch])}

    callback = hf.HybridWeightCallback()
    with tempfile.TemporaryDirectory() as tmp:
        training = TrainingArguments(
            output_dir=tmp, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
            per_device_eval_batch_size=64, learning_rate=args.lr, warmup_steps=args.max_steps // 10,
            weight_decay=0.01, logging_steps=max(1, args.max_steps // 10), save_strategy="no", report_to=[],
            seed=args.seed, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        )
        trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=collate, callbacks=[callback])
        start = time.perf_counter()
        result = trainer.train()
        train_seconds = time.perf_counter() - start
        prediction = trainer.predict(test)
    correct = (prediction.predictions.argmax(-1) == np.asarray(test_y)).tolist()
    low, high = bootstrap_interval(correct)
    record = {
        "scheme": args.scheme, "seed": args.seed, "accuracy": float(np.mean(correct)), "ci95": [low, high],
        "test_examples": len(correct), "steps": result.global_step, "train_loss": result.training_loss,
        "seconds_per_step": train_seconds / max(1, result.global_step),
        "u": hf.callback.layer_weights(model) if args.scheme == "hnas" else None,
        "u_history": callback.history if args.scheme == "hnas" else None,
        "model": "random-init" if not args.model_dir else args.model_dir, "config": vars(args),
        "torch_threads": torch.get_num_threads(),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(args.out + ".tmp", args.out)  # no half-written result
    print(f"{args.scheme} seed {args.seed}: accuracy {record['accuracy']:.4f} [{low:.4f}, {high:.4f}], "
          f"{record['seconds_per_step'] * 1000:.0f} ms/step" + (f", u per layer {[round(sum(r)/len(r),3) for r in record['u']]}" if record["u"] else ""))


if __name__ == "__main__":
    main()
