#!/usr/bin/env python
"""Text for the masked-LM recipe (examples/masked_lm/prepare.sh).

    masked_lm_data.py corpus --out DIR --valid-every 100 FILE...
        Lowercased, one sentence a line (WikiText paragraphs are split at " . ",
        its " = Heading = " and blank lines dropped) -> DIR/train.txt and
        DIR/valid.txt (every Nth sentence held out for masked-LM validation).
    masked_lm_data.py glue --task sst2|cola --glue-dir GLUE --out DIR
        GLUE's tab-separated files -> DIR/{train,valid,test}.{input0,label}:
        sst2: train.tsv / dev.tsv / test.tsv (GLUE's dev, the reported figure);
        cola: train.tsv minus every 17th line (held out as valid) / dev.tsv as test.
    masked_lm_data.py tsv --train T.tsv --valid V.tsv --test X.tsv --out DIR
        Any "sentence<TAB>label" files (a "sentence<TAB>label" header line is
        skipped, as sentence_classify.py does; labels are any words, those of
        the training file) -> DIR/{train,valid,test}.{input0,label}.

Each TSV line must be "sentence<TAB>label" with the label in {0, 1}; a
missing column, another label or an empty file stops with one line that
names the file and line.
"""

import argparse
import os
import sys

LABELS = ("0", "1")
TASKS = {
    # task: (folder, has a header line, {split: source file})
    "sst2": ("SST-2", True, {"train": "train.tsv", "valid": "dev.tsv", "test": "test.tsv"}),
    "cola": ("CoLA", False, {"train": "train.tsv", "test": "dev.tsv"}),
}
COLA_VALID_EVERY = 17  # CoLA has no labelled test here: dev.tsv is the test, ~500 train lines validate


class BadInput(Exception):
    pass


def sentences(path):
    """Lowercased sentences of one text file (WikiText paragraphs split)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or (line.startswith("= ") and line.endswith(" =")):
                continue
            for s in line.lower().split(" . "):
                s = s.strip()
                if s:
                    yield s if s.endswith(".") else s + " ."


def corpus(args):
    os.makedirs(args.out, exist_ok=True)
    n = words = 0
    tmp = {k: os.path.join(args.out, f"{k}.txt.tmp") for k in ("train", "valid")}
    with open(tmp["train"], "w", encoding="utf-8") as tr, open(tmp["valid"], "w", encoding="utf-8") as va:
        for path in args.files:
            if not os.path.isfile(path):
                raise BadInput(f"{path}: no such file")
            for i, s in enumerate(sentences(path)):
                if args.max_lines and i >= args.max_lines:
                    break
                (va if n % args.valid_every == args.valid_every - 1 else tr).write(s + "\n")
                n += 1
                words += len(s.split())
    for k, p in tmp.items():
        os.replace(p, os.path.join(args.out, f"{k}.txt"))
    print(f"[masked_lm_data] {args.out}: {n} sentences, {words} words, every {args.valid_every}th held out",
          file=sys.stderr)


def has_header(line):
    """A GLUE header line: its last column is 'label' (sentence_classify.py's test)."""
    return line.rstrip("\n").split("\t")[-1].strip() == "label"


def read_tsv(path, header, labels=LABELS):
    """[(sentence, label)] of a GLUE file, checked; header: True, False or
    'auto' (has_header); labels: the allowed labels (None: any)."""
    if not os.path.isfile(path):
        raise BadInput(f"{path}: no such file")
    rows = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if i == 1 and (has_header(line) if header == "auto" else header):
                continue
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) < 2 or not parts[0].strip():
                raise BadInput(f"{path}:{i}: expected 'sentence<TAB>label', found {len(parts)} column(s)")
            label = parts[-1].strip()
            if labels is not None and label not in labels:
                raise BadInput(f"{path}:{i}: label {label!r} is not one of {', '.join(labels)}")
            rows.append((" ".join(parts[:-1]).strip(), label))
    if not rows:
        raise BadInput(f"{path}: no labelled sentence in the file (empty)")
    return rows


def glue(args):
    folder, header, files = TASKS[args.task]
    splits = {k: read_tsv(os.path.join(args.glue_dir, folder, v), header) for k, v in files.items()}
    if "valid" not in splits:
        rows = splits["train"]
        splits["valid"] = [r for i, r in enumerate(rows) if i % COLA_VALID_EVERY == COLA_VALID_EVERY - 1]
        splits["train"] = [r for i, r in enumerate(rows) if i % COLA_VALID_EVERY != COLA_VALID_EVERY - 1]
    for split, cap in (("train", args.max_train), ("valid", args.max_eval), ("test", args.max_eval)):
        if cap:
            splits[split] = splits[split][:cap]
    write_splits(args.out, splits, args.task)


def write_splits(out, splits, name):
    """DIR/{split}.input0 (lowercased sentences) and DIR/{split}.label."""
    os.makedirs(out, exist_ok=True)
    for split, rows in splits.items():
        for ext, col in (("input0", 0), ("label", 1)):
            path = os.path.join(out, f"{split}.{ext}")
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.writelines((r[col].lower() if col == 0 else r[col]) + "\n" for r in rows)
            os.replace(path + ".tmp", path)
        print(f"[masked_lm_data] {name} {split}: {len(rows)} sentences", file=sys.stderr)


def tsv(args):
    """A user's train/valid/test files; the labels of valid and test must be
    among the training file's."""
    train = read_tsv(args.train, "auto", labels=None)
    known = sorted({label for _, label in train})
    splits = {"train": train, "valid": read_tsv(args.valid, "auto", known), "test": read_tsv(args.test, "auto", known)}
    write_splits(args.out, splits, "tsv")
    print(f"[masked_lm_data] {len(known)} classes: {' '.join(known)}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("corpus")
    c.add_argument("--out", required=True)
    c.add_argument("--valid-every", type=int, default=100)
    c.add_argument("--max-lines", type=int, default=0, help="at most N sentences from each file (0: all)")
    c.add_argument("files", nargs="+")
    g = sub.add_parser("glue")
    g.add_argument("--task", choices=sorted(TASKS), required=True)
    g.add_argument("--glue-dir", required=True)
    g.add_argument("--out", required=True)
    g.add_argument("--max-train", type=int, default=0, help="keep the first N training sentences (0: all)")
    g.add_argument("--max-eval", type=int, default=0, help="keep the first N valid/test sentences (0: all)")
    t = sub.add_parser("tsv")
    for split in ("train", "valid", "test"):
        t.add_argument(f"--{split}", required=True, help=f"{split} file, sentence<TAB>label a line")
    t.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        {"corpus": corpus, "glue": glue, "tsv": tsv}[args.command](args)
    except BadInput as err:
        print(f"[masked_lm_data] error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
