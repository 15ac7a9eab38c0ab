#!/usr/bin/env python
"""Train a SentencePiece model, or encode text with one and truncate it.

    sentencepiece_tool.py train --input A.txt B.txt --model-prefix spm/sp --vocab-size 30522
    sentencepiece_tool.py encode --model spm/sp.model --input train.article \
        --output spm/train.article --max-pieces 127

``encode`` writes space-separated pieces, one line per input line (empty lines
stay empty, so the files stay aligned), keeps at most ``--max-pieces`` pieces
per line and reports how many lines it truncated. The paper truncates to 128
encoder and 64 decoder positions; fairseq appends </s> to every sentence, so
127 / 63 pieces fill those positions exactly.
"""

import argparse
import os
import sys

import sentencepiece as spm


def train(args):
    for path in args.input:
        if not os.path.isfile(path):
            print(f"error: missing file: {path}", file=sys.stderr)
            return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.model_prefix)), exist_ok=True)
    tmp_prefix = args.model_prefix + ".tmp"
    spm.SentencePieceTrainer.train(
        input=args.input,
        model_prefix=tmp_prefix,
        vocab_size=args.vocab_size,
        model_type=args.model_type,
        character_coverage=1.0,  # lowercased English: keep every character
        input_sentence_size=args.sample,  # large corpora: a random sample is enough
        shuffle_input_sentence=True,
        # A soft limit: small data sets cannot support 30,522 pieces; the real
        # size is printed below (and fairseq's dictionary follows the data).
        hard_vocab_limit=False,
        num_threads=args.threads,
        minloglevel=2,
    )
    for ext in ("model", "vocab"):
        os.replace(f"{tmp_prefix}.{ext}", f"{args.model_prefix}.{ext}")
    size = spm.SentencePieceProcessor(model_file=f"{args.model_prefix}.model").get_piece_size()
    print(f"[spm] {args.model_prefix}.model: {size} pieces ({args.model_type}, asked for "
          f"{args.vocab_size})", file=sys.stderr)
    return 0


def encode(args):
    if not os.path.isfile(args.input):
        print(f"error: missing file: {args.input}", file=sys.stderr)
        return 1
    sp = spm.SentencePieceProcessor(model_file=args.model)
    tmp = args.output + ".tmp"
    lines = truncated = 0
    with open(args.input, encoding="utf-8") as fin, open(tmp, "w", encoding="utf-8") as fout:
        for line in fin:
            pieces = sp.encode(line.strip(), out_type=str)
            if args.max_pieces and len(pieces) > args.max_pieces:
                pieces = pieces[:args.max_pieces]
                truncated += 1
            fout.write(" ".join(pieces) + "\n")
            lines += 1
    os.replace(tmp, args.output)
    print(f"[spm] {args.output}: {lines} lines, {truncated} truncated to "
          f"{args.max_pieces} pieces", file=sys.stderr)
    return 0


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a joint SentencePiece model")
    t.add_argument("--input", nargs="+", required=True, help="text files, one sentence a line")
    t.add_argument("--model-prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    t.add_argument("--vocab-size", type=int, default=30522,
                   help="pieces (paper: 30,522 word pieces; use fewer for small data)")
    t.add_argument("--model-type", default="unigram", choices=["unigram", "bpe"])
    t.add_argument("--sample", type=int, default=2_000_000,
                   help="train on at most this many randomly chosen lines")
    t.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    e = sub.add_parser("encode", help="encode text into pieces, truncating long lines")
    e.add_argument("--model", required=True)
    e.add_argument("--input", required=True)
    e.add_argument("--output", required=True)
    e.add_argument("--max-pieces", type=int, default=0, help="keep at most N pieces a line (0: all)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.command == "train":
        if args.vocab_size < 8:
            print("error: --vocab-size must be at least 8", file=sys.stderr)
            return 2
        return train(args)
    return encode(args)


if __name__ == "__main__":
    sys.exit(main())
