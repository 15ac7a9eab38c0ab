#!/usr/bin/env python
"""Check one pair of aligned parallel-text files and copy it (the first step of
examples/translation/prepare.sh).

    parallel_text.py --pair raw/train.de raw/train.en --out-prefix OUT/text/train \
        --src de --tgt en [--max-pairs N] [--keep-empty]

Line N of the source file is the translation of line N of the target file.
Refuses, with exit code 1, a message naming the files and nothing written:
a missing file, a line-count mismatch, bytes that are not UTF-8 (file and line).
Writes ``OUT.SRC`` and ``OUT.TGT`` (through .tmp files, renamed at the end):
the lines unchanged except for the line ending; pairs with an empty side are
dropped and counted unless ``--keep-empty`` (evaluation sets stay whole, line
for line, since their target side is the BLEU reference).
"""

import argparse
import os
import sys

from fairseq_dnas.recipes.gigaword_pairs import InputError, count_lines, read_lines


def check_files(src, tgt):
    for path in (src, tgt):
        if not os.path.isfile(path):
            raise InputError(f"missing file: {path}")
    n_src, n_tgt = count_lines(src), count_lines(tgt)
    if n_src != n_tgt:
        raise InputError(
            f"the source file {src} has {n_src} lines but the target file {tgt} has {n_tgt} "
            "lines; they must be aligned line by line (line N of one translates line N of the other)"
        )
    return n_src


def copy_pair(src, tgt, out_prefix, src_lang, tgt_lang, max_pairs=0, keep_empty=False):
    """Returns (pairs read, pairs written)."""
    check_files(src, tgt)
    # Decode everything first: a bad byte anywhere leaves no output behind.
    pairs = list(zip(read_lines(src, max_pairs), read_lines(tgt, max_pairs)))
    kept = [(s, t) for s, t in pairs if keep_empty or (s.strip() and t.strip())]
    os.makedirs(os.path.dirname(os.path.abspath(out_prefix)), exist_ok=True)
    for k, lang in enumerate((src_lang, tgt_lang)):
        tmp = f"{out_prefix}.{lang}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(pair[k] + "\n" for pair in kept)
    for lang in (src_lang, tgt_lang):
        os.replace(f"{out_prefix}.{lang}.tmp", f"{out_prefix}.{lang}")
    return len(pairs), len(kept)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", nargs=2, metavar=("SRC_FILE", "TGT_FILE"), required=True)
    p.add_argument("--out-prefix", required=True)
    p.add_argument("--src", required=True, help="source language suffix of the outputs")
    p.add_argument("--tgt", required=True, help="target language suffix of the outputs")
    p.add_argument("--max-pairs", type=int, default=0, help="first N pairs only (0: all)")
    p.add_argument("--keep-empty", action="store_true", help="keep pairs with an empty side")
    args = p.parse_args(argv)
    try:
        read, kept = copy_pair(*args.pair, args.out_prefix, args.src, args.tgt,
                               args.max_pairs, args.keep_empty)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"[pairs] {args.out_prefix}.{{{args.src},{args.tgt}}}: {kept} pairs "
          f"(of {read} read; {read - kept} with an empty side dropped)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
