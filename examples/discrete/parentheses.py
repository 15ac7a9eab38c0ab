#!/usr/bin/env python
"""The parenthesis language of J. Kinley (2020, Appendix, "Dependency
Learning On A Synthetic Language modeling Task", adapted from Strobelt et
al., 2017, LSTMVis): words 0 1 2 3 4 ( ), e.g.

    ( 1 ( ( 3 ) 2 2 ) 1 ) 0 ( ( ( 3 ( 4 ) ) ) ) 0 0 ( 1 ) 0 ( ( 2 ) )

    python examples/discrete/parentheses.py OUT_DIR [--train 50000] [--valid 5000] [--test 5000]
        [--length 30] [--max-depth 4] [--seed 1]

writes OUT_DIR/{train,valid,test}.txt (a sequence a line, words separated
by single spaces: fairseq-preprocess --only-source reads them as they are)
and OUT_DIR/{train,valid,test}.dep (line k: the true dependency of every
target of sequence k, below), then prints what it wrote.

What the thesis leaves open, decided here:
- **Nesting level.** The depth before a word is the number of ``(`` not yet
  closed by a ``)``. A number is the depth, as a digit: "numbers are
  emitted randomly, but must match the nesting level (the number of open
  left parentheses)" read as "the number written equals the nesting level
  where it stands" (LSTMVis's language). So 0 stands outside every
  parenthesis, 4 inside four; depth never exceeds 4 ("nesting is limited to
  depth 4"), so the digits 0-4 are exactly the possible levels.
- **Matched parentheses.** Every sequence is balanced: a ``)`` only closes
  an open ``(``, and every ``(`` is closed by the end (depth 0 after the
  last word). Every sequence has exactly ``--length`` (30) words.
- **The random choice.** Word by word, uniformly among the words that keep
  the sequence completable: ``(`` when depth < 4 and the remaining words
  after it can still close every parenthesis (depth + 1 <= words left
  after it), ``)`` when depth > 0, the number equal to the depth (always
  allowed, except that a number at depth d needs d words left after it to
  close). Sequences may repeat across and within splits (the generator's
  distribution; no deduplication), and all three splits come from one
  ``random.Random(seed)``, train first, then valid, then test.
- **The true dependency** ("the span between the last number and the
  previous word"). A language model reads ``</s> w_0 ... w_{T-1}`` (fairseq's
  ``language_modeling`` with ``--sample-break-mode eos``: input position 0
  holds ``</s>``, position q >= 1 holds w_{q-1}) and at input position t
  predicts w_t. What decides w_t's distribution is the current depth (and
  the position, which every position's own embedding carries); the depth is
  the value of the last number before w_t plus the ``(`` minus the ``)``
  after it, so the dependency of target t is the input positions holding
  that number and every word after it up to w_{t-1}, the previous word:
  input positions s_t .. t with s_t = n + 1 for the last number w_n (n < t),
  and s_t = 0 (``</s>``, "depth 0 at the start", and every word so far)
  when no number precedes w_t. Line k of a .dep file holds s_0 .. s_{T-1}
  (T integers); the final ``</s>`` target is not scored (its position alone
  decides it).
"""

import argparse
import os
import random
import sys

NUMBERS = tuple(str(d) for d in range(5))
OPEN, CLOSE = "(", ")"
VOCABULARY = NUMBERS + (OPEN, CLOSE)


def allowed_words(depth: int, left: int, max_depth: int):
    """The words that can stand at depth ``depth`` with ``left`` words still
    to write (this one included) and the sequence still end balanced."""
    after = left - 1  # words after this one
    words = []
    if depth < max_depth and depth + 1 <= after:
        words.append(OPEN)
    if depth > 0:
        words.append(CLOSE)
    if depth <= after:
        words.append(str(depth))
    return words


def sequence(length: int, max_depth: int, rng: random.Random):
    """One balanced sequence of ``length`` words (a list of str)."""
    words, depth = [], 0
    for i in range(length):
        w = rng.choice(allowed_words(depth, length - i, max_depth))
        depth += (w == OPEN) - (w == CLOSE)
        words.append(w)
    assert depth == 0
    return words


def depths(words):
    """The depth before each word (the number of open ``(``)."""
    out, depth = [], 0
    for w in words:
        out.append(depth)
        depth += (w == OPEN) - (w == CLOSE)
    return out


def dependency_starts(words):
    """s_t for every target t: the first input position of its true
    dependency, whose last is t (module docstring). Input position q holds
    w_{q-1}; position 0 holds ``</s>``."""
    starts, last_number = [], None
    for t, w in enumerate(words):
        starts.append(0 if last_number is None else last_number + 1)
        if w in NUMBERS:
            last_number = t
    return starts


def dependency(starts, t):
    """The true dependency of target t, a set of input positions."""
    return set(range(starts[t], t + 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=50000, help="training sequences (default 50,000)")
    parser.add_argument("--valid", type=int, default=5000, help="validation sequences (default 5,000)")
    parser.add_argument("--test", type=int, default=5000, help="test sequences (default 5,000)")
    parser.add_argument("--length", type=int, default=30, help="words per sequence (default 30)")
    parser.add_argument("--max-depth", type=int, default=4, choices=range(1, 5), metavar="{1..4}",
                        help="deepest nesting (default 4; numbers are 0-4)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.length < 2 or min(args.train, args.valid, args.test) < 1:
        parser.error("--length must be >= 2 and every split >= 1 sequence")

    rng = random.Random(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    for split in ("train", "valid", "test"):
        count = getattr(args, split)
        seqs = [sequence(args.length, args.max_depth, rng) for _ in range(count)]
        for ext, lines in ((".txt", [" ".join(s) for s in seqs]),
                           (".dep", [" ".join(map(str, dependency_starts(s))) for s in seqs])):
            path = os.path.join(args.out_dir, split + ext)
            with open(path + ".tmp", "w") as f:  # renamed when whole
                f.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
        distinct = len({tuple(s) for s in seqs})
        print(f"{split}: {count} sequences of {args.length} words ({distinct} distinct) -> "
              f"{os.path.join(args.out_dir, split)}.{{txt,dep}}", file=sys.stderr)


if __name__ == "__main__":
    main()
