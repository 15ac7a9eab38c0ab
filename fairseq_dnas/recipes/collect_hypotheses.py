#!/usr/bin/env python
"""Turn fairseq-generate output into one detokenized headline per source line.

    python -m fairseq_dnas.recipes.collect_hypotheses --generate-log gen.out --sources spm/test.article --out test.hyp

Reads the ``H-<id>\\t<score>\\t<pieces>`` lines (fairseq prints them in batch
order, not input order), puts them back in input order, removes SentencePiece
(pieces are joined and U+2581 becomes a space, as SentencePiece decoding and
fairseq's ``--post-process sentencepiece`` do; a fairseq ``<unk>`` becomes
``UNK``, the test set's spelling) and writes them. It fails, writing nothing,
unless there is exactly one hypothesis for every line of ``--sources``: a
missing id (e.g. the last partial batch that some fairseq builds drop without
``--required-batch-size-multiple 1``), a duplicate, or an id out of range.
"""

import argparse
import os
import sys

SPACE = "\u2581"


def detokenize(pieces):
    words = []
    for piece in pieces.split():
        words.append(SPACE + "UNK" if piece == "<unk>" else piece)
    return " ".join("".join(words).replace(SPACE, " ").split())


def collect(lines, n_sources):
    """Map id -> hypothesis from generate output lines; raise ValueError on
    anything but exactly one hypothesis per id 0..n_sources-1."""
    hyps = {}
    for number, line in enumerate(lines, start=1):
        if not line.startswith("H-"):
            continue
        fields = line.rstrip("\n").split("\t")
        try:
            idx = int(fields[0][2:])
        except ValueError:
            raise ValueError(f"line {number}: cannot read the id in {fields[0]!r}") from None
        if idx in hyps:
            raise ValueError(f"two hypotheses for source {idx} (run with --nbest 1)")
        if not 0 <= idx < n_sources:
            raise ValueError(f"hypothesis id {idx} outside the {n_sources} sources")
        hyps[idx] = detokenize(fields[2] if len(fields) > 2 else "")
    missing = [i for i in range(n_sources) if i not in hyps]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise ValueError(
            f"{len(missing)} of {n_sources} sources have no hypothesis (ids {shown}); "
            "fairseq-generate dropped or skipped them (check --required-batch-size-multiple 1 "
            "and that no --skip-invalid-size-inputs-valid-test was given)"
        )
    return [hyps[i] for i in range(n_sources)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--generate-log", required=True, help="fairseq-generate's stdout")
    p.add_argument("--sources", required=True,
                   help="the source file that was binarized (one line per source)")
    p.add_argument("--out", required=True, help="headlines, one per source, in input order")
    args = p.parse_args(argv)
    try:
        with open(args.sources, encoding="utf-8") as f:
            n_sources = sum(1 for _ in f)
    except (OSError, ValueError) as err:
        print(f"error: {args.sources}: cannot read ({err})", file=sys.stderr)
        return 1
    if n_sources == 0:
        print(f"error: {args.sources}: empty, no source sentence", file=sys.stderr)
        return 1
    try:
        with open(args.generate_log, encoding="utf-8") as f:
            hyps = collect(f, n_sources)
    except (OSError, ValueError) as err:
        print(f"error: {args.generate_log}: {err}", file=sys.stderr)
        return 1
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(h + "\n" for h in hyps)
    os.replace(tmp, args.out)
    print(f"[hypotheses] {args.out}: {len(hyps)} headlines", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
