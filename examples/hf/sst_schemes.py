#!/usr/bin/env python
"""BERT-style SST classifiers trained from scratch with transformers' Trainer,
their self-attention sdpa (transformers' own), DNAS, HNAS or discrete
(``fairseq_dnas.hf.enable``): test accuracy, and Kendall's tau of the
faithfulness metric (``python -m fairseq_dnas.commands.hf_faithfulness``).

    python examples/hf/sst_schemes.py run --out outputs/hf-sst            # every scheme x seed (resumable)
    python examples/hf/sst_schemes.py train --scheme discrete --seed 1 --out outputs/hf-sst
    python examples/hf/sst_schemes.py table --out outputs/hf-sst          # tau (once per run), then the table

Data: the Jain & Wallace binary SST split (``--data-dir``, env SST_BINARY_DIR:
train.tsv, dev.tsv, test.tsv with a 'sentence<TAB>label' header). The
tokenizer is a WordPiece vocabulary trained on train.tsv here (no download),
saved beside each model, so ``AutoTokenizer.from_pretrained(MODEL_DIR)`` and
the faithfulness command read it. Sizes default to the thesis's (6 layers x
64, FFN 128, 4 heads: fairseq's ``roberta_thesis``).

Each run writes OUT/<scheme>_seed<N>/ with ``model/`` (save_pretrained, and
the tokenizer) and ``result.json`` (written last, atomically): a run whose
result.json exists is not redone. The table step writes ``faithfulness.jsonl``
per run (the command's --json lines) once, and prints mean +- standard error
over seeds.
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time

SCHEMES = ("sdpa", "dnas", "hnas", "discrete")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DEFAULT_DATA = os.environ.get("SST_BINARY_DIR")  # no default folder: the data is the user's
FAITHFULNESS = "fairseq_dnas.commands.hf_faithfulness"


def fail(message):
    sys.exit(f"error: {message}")


def data_dir(args):
    """--data-dir, or SST_BINARY_DIR, holding train.tsv, dev.tsv and test.tsv;
    anything else is a one-line error, before any run starts."""
    if not args.data_dir:
        fail("no data folder: pass --data-dir or set SST_BINARY_DIR to the folder with train.tsv, dev.tsv, test.tsv")
    missing = [n for n in ("train.tsv", "dev.tsv", "test.tsv") if not os.path.isfile(os.path.join(args.data_dir, n))]
    if missing:
        fail(f"{args.data_dir} lacks {', '.join(missing)}: pass --data-dir (or SST_BINARY_DIR), the folder with "
             "train.tsv, dev.tsv and test.tsv")
    return args.data_dir


def read_tsv(path):
    """(sentences, labels) of a 'sentence<TAB>label' file with that header."""
    if not os.path.exists(path):
        fail(f"{path} not found: pass --data-dir, the folder with train.tsv, dev.tsv and test.tsv")
    sentences, labels = [], []
    with open(path, encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:2] != ["sentence", "label"]:
            fail(f"{path} must start with the header 'sentence<TAB>label'; got {header}")
        for number, line in enumerate(f, start=2):
            parts = line.rstrip("\n").rsplit("\t", 1)
            if len(parts) != 2 or parts[1] not in ("0", "1"):
                fail(f"{path}:{number}: expected 'sentence<TAB>0 or 1'")
            sentences.append(parts[0].strip())
            labels.append(int(parts[1]))
    return sentences, labels


def train_tokenizer(sentences, vocab_size):
    """A WordPiece tokenizer trained on ``sentences`` (BERT's pre-tokenizer,
    '[CLS] ... [SEP]' around each sentence), as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(sentences, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[(t, tok.token_to_id(t)) for t in ("[CLS]", "[SEP]")])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def build_model(args, tokenizer):
    """A random-init BertForSequenceClassification, switched to ``args.scheme``."""
    from transformers import BertConfig, BertForSequenceClassification

    from fairseq_dnas import hf

    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=args.ffn, max_position_embeddings=args.max_len,
        num_labels=2, pad_token_id=tokenizer.pad_token_id,
    )
    model = BertForSequenceClassification(config)
    if args.scheme != "sdpa":
        hf.enable(model, scheme=args.scheme, hybrid_init=args.hybrid_init if args.scheme == "hnas" else None,
                  gumbel_temperature=args.gumbel_temperature if args.scheme == "discrete" else None)
    return model


def run_dir(out, scheme, seed):
    return os.path.join(out, f"{scheme}_seed{seed}")


def accuracy(trainer, rows, labels):
    import numpy as np

    return float((trainer.predict(rows).predictions.argmax(-1) == np.asarray(labels)).mean())


def train(args):
    """One model: train, evaluate on dev and test, save; result.json last."""
    import torch
    from transformers import Trainer, TrainingArguments

    folder = run_dir(args.out, args.scheme, args.seed)
    result_path = os.path.join(folder, "result.json")
    if os.path.exists(result_path):
        print(f"[sst] {folder}: done before, skipped", flush=True)
        return
    torch.set_num_threads(args.threads)
    data = {split: read_tsv(os.path.join(data_dir(args), f"{split}.tsv")) for split in ("train", "dev", "test")}
    if args.train_limit:
        data["train"] = tuple(x[:args.train_limit] for x in data["train"])
    tokenizer = train_tokenizer(data["train"][0], args.vocab_size)
    torch.manual_seed(args.seed)
    model = build_model(args, tokenizer)

    def rows(split):
        ids = tokenizer(list(data[split][0]), truncation=True, max_length=args.max_len)["input_ids"]
        return [{"input_ids": i, "labels": y} for i, y in zip(ids, data[split][1])]

    def collate(batch):  # pad to the longest in the batch: the padding mask reaches the attention
        length = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), length), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), length), dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, :len(b["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([b["labels"] for b in batch])}

    work = folder + ".partial"
    train_rows = rows("train")
    total = args.max_steps or math.ceil(math.ceil(len(train_rows) / args.batch_size) * args.epochs)
    training = TrainingArguments(
        output_dir=work, num_train_epochs=args.epochs, max_steps=args.max_steps or -1,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128, learning_rate=args.lr,
        warmup_steps=total // 10, weight_decay=0.01, logging_steps=args.log_every, save_strategy="no", report_to=[],
        seed=args.seed, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=train_rows, data_collator=collate)
    print(f"[sst] {time.strftime('%H:%M:%S')} {args.scheme} seed {args.seed}: training", flush=True)
    start = time.perf_counter()
    state = trainer.train()
    seconds = time.perf_counter() - start
    model.eval()
    result = {
        "scheme": args.scheme, "seed": args.seed, "dev_accuracy": accuracy(trainer, rows("dev"), data["dev"][1]),
        "test_accuracy": accuracy(trainer, rows("test"), data["test"][1]), "steps": state.global_step,
        "train_loss": state.training_loss, "train_seconds": seconds, "threads": torch.get_num_threads(),
        "config": {k: v for k, v in vars(args).items() if k != "func"},
    }
    model_dir = os.path.join(folder, "model")
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(result_path + ".tmp", result_path)  # written last: its presence means the run is complete
    shutil.rmtree(work, ignore_errors=True)  # the Trainer's output folder (nothing saved there)
    print(f"[sst] {args.scheme} seed {args.seed}: test accuracy {result['test_accuracy']:.4f} "
          f"(dev {result['dev_accuracy']:.4f}), {state.global_step} steps in {seconds:.0f} s", flush=True)


def run_all(args):
    """Every scheme x seed, one process each (a crash names its run)."""
    data_dir(args)  # checked before the first run starts
    runs = [(scheme, seed) for seed in args.seeds for scheme in args.schemes]
    for number, (scheme, seed) in enumerate(runs, start=1):
        print(f"[sst] run {number}/{len(runs)}: {scheme} seed {seed}", flush=True)
        argv = [sys.executable, os.path.abspath(__file__), "train", "--scheme", scheme, "--seed", str(seed),
                *forwarded(args)]
        if subprocess.run(argv).returncode != 0:
            fail(f"{scheme} seed {seed} failed (its output is above); re-run to resume")


def forwarded(args):
    """The shared settings as command-line options, for each run's process."""
    out = []
    for name in ("out", "data_dir", "epochs", "max_steps", "batch_size", "lr", "max_len", "hidden", "layers",
                 "heads", "ffn", "vocab_size", "hybrid_init", "gumbel_temperature", "threads", "train_limit",
                 "log_every"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out


def faithfulness_taus(folder, test_tsv):
    """Per-sentence tau of one run, from its faithfulness.jsonl (computed once)."""
    path = os.path.join(folder, "faithfulness.jsonl")
    if not os.path.exists(path):
        argv = [sys.executable, "-m", FAITHFULNESS, os.path.join(folder, "model"), "--test", test_tsv,
                "--json", path + ".tmp"]
        if subprocess.run(argv).returncode != 0:
            fail(f"{FAITHFULNESS} failed on {folder} (its message is above)")
        os.replace(path + ".tmp", path)
    with open(path, encoding="utf-8") as f:
        taus = [json.loads(line)["tau"] for line in f if line.strip()]
    return [t for t in taus if t is not None]  # (None: a sentence the metric cannot rank)


def table(args):
    """Mean +- standard error over seeds of test accuracy (%) and mean tau."""
    import importlib.util

    from fairseq_dnas.stats import mean_se_cell

    has_metric = importlib.util.find_spec(FAITHFULNESS) is not None
    if not has_metric:
        print(f"[sst] {FAITHFULNESS} is not in this tree: accuracy only", file=sys.stderr)
    test_tsv = os.path.join(data_dir(args), "test.tsv")
    print("| attention | seeds | test accuracy (%) | dev accuracy (%) | mean Kendall tau |")
    print("|---|---|---|---|---|")
    found = False
    for scheme in args.schemes:
        results, taus = [], []
        for seed in args.seeds:
            folder = run_dir(args.out, scheme, seed)
            path = os.path.join(folder, "result.json")
            if not os.path.exists(path):
                continue
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
            if has_metric:
                per_sentence = faithfulness_taus(folder, test_tsv)
                if per_sentence:
                    taus.append(sum(per_sentence) / len(per_sentence))
        if not results:
            continue
        found = True
        tau = mean_se_cell(taus, digits=3) if taus else "-"
        print(f"| {scheme} | {len(results)} | {mean_se_cell([100 * r['test_accuracy'] for r in results], digits=1)} "
              f"| {mean_se_cell([100 * r['dev_accuracy'] for r in results], digits=1)} | {tau} |")
    if not found:
        fail(f"no finished run under {args.out}: run '{os.path.basename(__file__)} run --out {args.out}' first")


def parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="step", required=True)
    for step, func in (("train", train), ("run", run_all), ("table", table)):
        s = sub.add_parser(step)
        s.set_defaults(func=func)
        s.add_argument("--out", required=True, help="folder of the runs (outside the repository)")
        s.add_argument("--data-dir", default=DEFAULT_DATA, help="train/dev/test.tsv (env SST_BINARY_DIR)")
        if step == "train":
            s.add_argument("--scheme", required=True, choices=SCHEMES)
            s.add_argument("--seed", type=int, required=True)
        else:
            s.add_argument("--schemes", type=lambda v: v.split(","), default=list(SCHEMES),
                           help="comma-separated, of " + ", ".join(SCHEMES))
            s.add_argument("--seeds", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 3])
        if step != "table":
            s.add_argument("--epochs", type=float, default=2.0)
            s.add_argument("--max-steps", type=int, default=0, help="stop after this many updates (0: --epochs)")
            s.add_argument("--batch-size", type=int, default=32)
            s.add_argument("--lr", type=float, default=1e-3)
            s.add_argument("--max-len", type=int, default=128)
            s.add_argument("--hidden", type=int, default=64)
            s.add_argument("--layers", type=int, default=6)
            s.add_argument("--heads", type=int, default=4)
            s.add_argument("--ffn", type=int, default=128)
            s.add_argument("--vocab-size", type=int, default=8000)
            s.add_argument("--hybrid-init", type=float, default=0.5)
            s.add_argument("--gumbel-temperature", type=float, default=1.0)
            s.add_argument("--threads", type=int, default=1)
            s.add_argument("--train-limit", type=int, default=0, help="first N training sentences only (tests)")
            s.add_argument("--log-every", type=int, default=50)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.step != "train":
        unknown = sorted(set(args.schemes) - set(SCHEMES))
        if unknown:
            fail(f"unknown scheme {unknown[0]!r}: choose from {', '.join(SCHEMES)}")
    args.func(args)


if __name__ == "__main__":
    main()
