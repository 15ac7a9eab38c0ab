#!/usr/bin/env python
"""The multiview arithmetic data of Kinley (2020, sections 5.2 and 6.3):
expressions over the digits 0-4 with + and *, valued modulo 5 (a 5-class
problem), each written in two views, infix and prefix, e.g.

    infix:  ( ( 4 + 1 ) * 3 ) + ( 2 + 4 )
    prefix: ( + ( * ( + 4 1 ) 3 ) ( + 2 4 ) )         value (5 * 3 + 6) mod 5 = 1

    python examples/discrete/arithmetic.py OUT_DIR [--train 30000] [--test 3000] [--seed 1] [--split iid|disjoint]

writes OUT_DIR/{train,test}.{infix,prefix}.tsv (GLUE's layout: a header
``sentence<TAB>label``, then ``expression<TAB>value``; the two views of line k
are the same expression) and OUT_DIR/{train,test}.depth (the depth of line
k), then prints what it wrote. Tokens are separated by single spaces, so
fairseq-preprocess reads them as they are (no SentencePiece).

What the thesis leaves open, decided here:
- **Depth.** The thesis calls its example above "depth 2 nesting": the depth
  is the nesting of parentheses inside the infix form whose outermost
  operation has none, i.e. the height of the operator tree minus 1
  (``a + b`` has depth 0, ``( a + b ) * c`` depth 1). Depths 1, 2, 3 are
  generated, a third of each split each ("evenly distributed among the depth
  levels").
- **Tree shapes.** A tree of height h >= 1 is an operator (+ or *, each with
  probability 1/2) over two children, one of which (left or right with
  probability 1/2) has height exactly h - 1 and the other a height drawn
  uniformly from 0..h-1; height 0 is a digit drawn uniformly from 0-4.
- **Duplicates and disjointness** (``--split``). The thesis only says it
  "generate[s] 30000 training samples and 3000 test samples", so the default,
  ``iid``, draws both sets independently from the generator, repeats
  allowed. Depth 1 has only 6,000 distinct expressions (height 2 over 5
  digits and 2 operators) and the generator does not draw them uniformly:
  the 10,000 depth-1 training lines hold about 4,200 of them, and about 81%
  of the depth-1 test lines are training expressions (about 2% at depth 2,
  none at depth 3), so depth 1 largely measures fitting the training set, as
  the thesis's 97.6% suggests. ``disjoint`` (this recipe's choice until
  2026-11-27) holds distinct test expressions, none of which appears in
  training: depth 1 then measures generalization to unseen expressions,
  which no model of ours learned at CPU scale (docs/results/
  2026-11-27-cpu-table65-learnability.md). Both print the share of test
  lines that are training expressions, per depth.
- **Parentheses.** Infix puts parentheses around every operation but the
  outermost; prefix around every operation (the thesis's two examples).
"""

import argparse
import os
import random
import sys

DIGITS = 5
OPERATORS = ("+", "*")
DEPTHS = (1, 2, 3)


def random_tree(height, rng):
    """A random expression tree of exactly ``height`` operator levels: a digit
    (height 0) or (operator, left, right)."""
    if height == 0:
        return rng.randrange(DIGITS)
    tall = rng.randrange(2)
    other = rng.randrange(height)
    children = [other, other]
    children[tall] = height - 1
    return (rng.choice(OPERATORS), random_tree(children[0], rng), random_tree(children[1], rng))


def distinct_trees(height):
    """How many distinct expressions have exactly ``height`` operator levels:
    N(0) = 5 digits; N(h) = 2 operators x (both children of height h - 1, or
    one of them and the other lower, in either order)."""
    counts = [DIGITS]
    for _ in range(height):
        lower = sum(counts[:-1])
        counts.append(len(OPERATORS) * (counts[-1] ** 2 + 2 * counts[-1] * lower))
    return counts[height]


def height(tree):
    return 0 if isinstance(tree, int) else 1 + max(height(tree[1]), height(tree[2]))


def value(tree):
    """The value modulo 5 ((A + B) mod 5 = (A mod 5 + B mod 5) mod 5, the same for *)."""
    if isinstance(tree, int):
        return tree
    a, b = value(tree[1]), value(tree[2])
    return (a + b) % DIGITS if tree[0] == "+" else (a * b) % DIGITS


def infix(tree, outer=True):
    if isinstance(tree, int):
        return str(tree)
    body = f"{infix(tree[1], False)} {tree[0]} {infix(tree[2], False)}"
    return body if outer else f"( {body} )"


def prefix(tree):
    if isinstance(tree, int):
        return str(tree)
    return f"( {tree[0]} {prefix(tree[1])} {prefix(tree[2])} )"


SPLITS = ("iid", "disjoint")


def generate(train, test, seed, split="iid"):
    """(train rows, test rows), each row (infix, prefix, value, depth); ``train``
    and ``test`` split evenly over DEPTHS (the remainder to the lowest depths).
    ``split``: "iid", both drawn independently from the generator (repeats
    allowed, test lines may be training lines), or "disjoint", distinct test
    expressions, none in training."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: choose from {', '.join(SPLITS)}")
    rng = random.Random(seed)
    per_depth = lambda n: [n // len(DEPTHS) + (i < n % len(DEPTHS)) for i in range(len(DEPTHS))]  # noqa: E731
    if split == "iid":
        rows = {}
        for name, size in (("test", test), ("train", train)):
            rows[name] = []
            for depth, n in zip(DEPTHS, per_depth(size)):
                for _ in range(n):
                    tree = random_tree(depth + 1, rng)
                    rows[name].append((infix(tree), prefix(tree), value(tree), depth))
            rng.shuffle(rows[name])
        return rows["train"], rows["test"]
    for depth, n in zip(DEPTHS, per_depth(test)):
        if n >= distinct_trees(depth + 1):
            raise ValueError(f"depth {depth} has {distinct_trees(depth + 1)} distinct expressions: cannot draw "
                             f"{n} distinct test expressions and leave any for training; ask for fewer")
    test_rows, seen = [], set()
    for depth, n in zip(DEPTHS, per_depth(test)):
        drawn = 0
        while drawn < n:
            tree = random_tree(depth + 1, rng)
            text = infix(tree)
            if text in seen:
                continue
            seen.add(text)
            test_rows.append((text, prefix(tree), value(tree), depth))
            drawn += 1
    train_rows = []
    for depth, n in zip(DEPTHS, per_depth(train)):
        drawn = 0
        while drawn < n:
            tree = random_tree(depth + 1, rng)
            text = infix(tree)
            if text in seen:  # a test expression: never in training
                continue
            train_rows.append((text, prefix(tree), value(tree), depth))
            drawn += 1
    rng.shuffle(train_rows)
    rng.shuffle(test_rows)
    return train_rows, test_rows


def overlap_share(train, test, depth):
    """The share of ``depth``'s test lines whose expression is a training expression."""
    seen = {r[0] for r in train}
    lines = [r[0] for r in test if r[3] == depth]
    return sum(t in seen for t in lines) / max(len(lines), 1)


def write(out_dir, split, rows):
    """{split}.infix.tsv, {split}.prefix.tsv, {split}.depth, each written to a
    temporary name and renamed, so a half-written set never passes for whole."""
    os.makedirs(out_dir, exist_ok=True)
    files = {
        f"{split}.infix.tsv": ["sentence\tlabel"] + [f"{r[0]}\t{r[2]}" for r in rows],
        f"{split}.prefix.tsv": ["sentence\tlabel"] + [f"{r[1]}\t{r[2]}" for r in rows],
        f"{split}.depth": [str(r[3]) for r in rows],
    }
    for name, lines in files.items():
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=30000, help="training expressions (thesis: 30,000)")
    p.add_argument("--test", type=int, default=3000, help="test expressions, distinct, none in training (thesis: 3,000)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--split", choices=SPLITS, default="iid",
                   help="iid: train and test drawn independently (the thesis's plain reading; default); "
                        "disjoint: distinct test expressions, none in training")
    args = p.parse_args(argv)
    if args.train < len(DEPTHS) or args.test < len(DEPTHS):
        p.error(f"--train and --test must be at least {len(DEPTHS)} (one expression per depth)")
    try:
        train, test = generate(args.train, args.test, args.seed, args.split)
    except ValueError as err:
        print(f"arithmetic.py: error: {err}", file=sys.stderr)
        return 1
    write(args.out_dir, "train", train)
    write(args.out_dir, "test", test)
    seen = {r[0] for r in train}
    overlap = ", ".join(f"depth {d} {overlap_share(train, test, d):.0%}" for d in DEPTHS)
    print(f"[arithmetic] {args.out_dir}: train {len(train)} expressions ({len(seen)} distinct), "
          f"test {len(test)} ({args.split}; test lines that are training expressions: {overlap}); "
          f"depths {', '.join(map(str, DEPTHS))} evenly; seed {args.seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
