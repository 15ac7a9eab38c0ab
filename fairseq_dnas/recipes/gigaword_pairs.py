#!/usr/bin/env python
"""Check and clean aligned article/title files (the first step of
examples/gigaword/prepare.sh).

Reads one or more (article, title) file pairs, line N of one going with line N
of the other, and writes ``OUT.article`` and ``OUT.title``:

* refuses, with exit code 1 and a message naming both files, pairs of files
  whose line counts differ, missing files, and bytes that are not UTF-8 (file
  and line number);
* maps the training data's unknown-word token ``<unk>`` to the test set's
  ``UNK`` (``--unk-to``), so that the model learns to write the token the
  references contain, as the Hugging Face ``gigaword`` loader does (v1.2.0);
* collapses runs of whitespace (including the test set's U+00A0) to a space;
* drops pairs with an empty article or title and counts them, unless
  ``--keep-empty`` (the test set must stay whole: its raw references are the
  scoring reference);
* drops pairs whose article also occurs in ``--exclude-articles`` files (held
  out validation/test sources), so that the training data does not contain
  evaluation inputs.

Prints one summary line per input pair and a total. Outputs are written to
temporary files and renamed, so an interrupted run leaves nothing that looks
finished.
"""

import argparse
import os
import sys


class InputError(Exception):
    """Bad input: the message says what is wrong and what to change."""


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_lines(path, limit=0):
    """Yield decoded lines (without the newline) of ``path``; at most ``limit``
    lines when ``limit`` > 0. Undecodable bytes raise InputError with the line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if limit and number > limit:
                return
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                bad = raw[max(0, err.start - 10):err.end + 10]
                raise InputError(
                    f"{path}, line {number}: bytes that are not valid UTF-8 "
                    f"({err.reason} at byte {err.start}: {bad!r}). Fix or remove "
                    "that line in both the article and the title file."
                ) from None


def normalize(line, unk_to):
    words = line.split()  # str.split() also splits at U+00A0 and other Unicode spaces
    if unk_to:
        words = [unk_to if w == "<unk>" else w for w in words]
    return " ".join(words)


def check_pair(article, title):
    for path in (article, title):
        if not os.path.isfile(path):
            raise InputError(f"missing file: {path}")
    n_article, n_title = count_lines(article), count_lines(title)
    if n_article != n_title:
        raise InputError(
            f"the article file {article} has {n_article} lines but the title file "
            f"{title} has {n_title} lines; they must be aligned line by line "
            "(line N of one goes with line N of the other)"
        )
    return n_article


def load_excluded(paths, unk_to):
    excluded = set()
    for path in paths:
        if not os.path.isfile(path):
            raise InputError(f"missing file: {path} (given with --exclude-articles)")
        excluded.update(normalize(line, unk_to) for line in read_lines(path))
    excluded.discard("")
    return excluded


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pair", nargs=2, action="append", required=True,
                   metavar=("ARTICLE", "TITLE"),
                   help="an aligned article file and title file; repeat to concatenate several")
    p.add_argument("--out-prefix", required=True,
                   help="writes OUT_PREFIX.article and OUT_PREFIX.title")
    p.add_argument("--max-pairs", type=int, default=0,
                   help="read only the first N lines of each pair of files (0: all)")
    p.add_argument("--unk-to", default="UNK",
                   help="replace the token <unk> by this one (empty string: keep <unk>)")
    p.add_argument("--keep-empty", action="store_true",
                   help="keep pairs with an empty side (for the test set, which must stay whole)")
    p.add_argument("--exclude-articles", nargs="*", default=[], metavar="FILE",
                   help="drop pairs whose article (after normalization) occurs in these files")
    return p.parse_args(argv)


def clean(args):
    """Write the cleaned pairs; return (counts per input, totals)."""
    counts = [check_pair(a, t) for a, t in args.pair]
    excluded = load_excluded(args.exclude_articles, args.unk_to)
    tmp = {side: f"{args.out_prefix}.{side}.tmp" for side in ("article", "title")}
    os.makedirs(os.path.dirname(os.path.abspath(args.out_prefix)), exist_ok=True)
    totals = {"read": 0, "kept": 0, "empty": 0, "excluded": 0, "empty_kept": 0}
    try:
        with open(tmp["article"], "w", encoding="utf-8") as fa, \
                open(tmp["title"], "w", encoding="utf-8") as ft:
            for (article, title), n in zip(args.pair, counts):
                stats = {"read": 0, "kept": 0, "empty": 0, "excluded": 0, "empty_kept": 0}
                lines = zip(read_lines(article, args.max_pairs), read_lines(title, args.max_pairs))
                for a, t in lines:
                    stats["read"] += 1
                    a, t = normalize(a, args.unk_to), normalize(t, args.unk_to)
                    if not a or not t:
                        if not args.keep_empty:
                            stats["empty"] += 1
                            continue
                        stats["empty_kept"] += int(not a) + int(not t)
                    if a in excluded:
                        stats["excluded"] += 1
                        continue
                    fa.write(a + "\n")
                    ft.write(t + "\n")
                    stats["kept"] += 1
                print(f"[pairs] {article} + {title}: read {stats['read']}, kept {stats['kept']}, "
                      f"dropped {stats['empty']} empty and {stats['excluded']} whose article is "
                      "held out", file=sys.stderr)
                for k in totals:
                    totals[k] += stats[k]
        for side in ("article", "title"):
            os.replace(tmp[side], f"{args.out_prefix}.{side}")
    finally:
        for path in tmp.values():
            if os.path.exists(path):
                os.remove(path)
    return totals


def main(argv=None):
    args = parse_args(argv)
    if args.max_pairs < 0:
        print("error: --max-pairs must be >= 0", file=sys.stderr)
        return 2
    try:
        totals = clean(args)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if totals["kept"] == 0:
        print(f"error: no pairs left for {args.out_prefix} (read {totals['read']}, "
              f"{totals['empty']} empty, {totals['excluded']} held out)", file=sys.stderr)
        os.remove(f"{args.out_prefix}.article")
        os.remove(f"{args.out_prefix}.title")
        return 1
    if totals["empty_kept"]:  # --keep-empty: counted, not dropped, so that they are visible
        print(f"[pairs] warning: {totals['empty_kept']} empty article/title lines kept in "
              f"{args.out_prefix} (--keep-empty)", file=sys.stderr)
    print(f"[pairs] {args.out_prefix}: {totals['kept']} pairs (of {totals['read']} read; "
          f"{totals['empty']} empty dropped, {totals['excluded']} held-out dropped)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
