#!/usr/bin/env python
"""Lead-N baseline: the first N words of each article as its headline.

    python -m fairseq_dnas.commands.lead_baseline --input raw/test.article --words 8 > lead8.hyp

Gigaword headlines average 8.5 words, so lead-8 is the usual "no model"
reference point for ROUGE on this test set. Words are whitespace-separated
tokens of the file as released (PTB tokens, ``UNK``, ``#``).
"""

import argparse
import sys


def lead(line, words):
    return " ".join(line.split()[:words])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="articles, one a line")
    p.add_argument("--words", type=int, default=8, help="how many leading words (default 8)")
    args = p.parse_args(argv)
    if args.words < 1:
        print("error: --words must be >= 1", file=sys.stderr)
        return 2
    try:
        with open(args.input, encoding="utf-8") as f:
            articles = f.readlines()  # all read before anything is written
    except (OSError, UnicodeDecodeError) as err:
        print(f"error: {args.input}: cannot read ({err})", file=sys.stderr)
        return 1
    if not articles:
        print(f"error: {args.input}: empty, no article to take a headline from", file=sys.stderr)
        return 1
    sys.stdout.writelines(lead(line, args.words) + "\n" for line in articles)
    return 0


if __name__ == "__main__":
    sys.exit(main())
