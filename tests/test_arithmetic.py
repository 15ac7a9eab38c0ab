"""examples/discrete/arithmetic.py: the multiview arithmetic data (Kinley 2020, 5.2)."""

import os
import sys

import pytest
from helpers import ROOT, run

import arithmetic as A  # examples/discrete/ (tests/conftest.py puts it on sys.path)

SCRIPT = os.path.join(ROOT, "examples", "discrete", "arithmetic.py")
THESIS_TREE = ("+", ("*", ("+", 4, 1), 3), ("+", 2, 4))


def eval_infix(text):
    """Independent of the tree: Python evaluates the infix string, then mod 5."""
    return eval(text) % 5  # the string holds only digits, + * ( ) and spaces


def eval_prefix(text):
    """Independent of the tree: a stack machine over the prefix tokens, mod 5 at the end."""
    stack = []
    for tok in reversed(text.replace("(", " ").replace(")", " ").split()):
        if tok.isdigit():
            stack.append(int(tok))
        else:
            a, b = stack.pop(), stack.pop()
            stack.append(a + b if tok == "+" else a * b)
    assert len(stack) == 1
    return stack[0] % 5


def test_the_thesis_example():
    assert A.infix(THESIS_TREE) == "( ( 4 + 1 ) * 3 ) + ( 2 + 4 )"
    assert A.prefix(THESIS_TREE) == "( + ( * ( + 4 1 ) 3 ) ( + 2 4 ) )"
    assert A.value(THESIS_TREE) == 1  # the thesis: "the above example evaluates to 1"
    assert A.height(THESIS_TREE) - 1 == 2  # "The example above has depth 2 nesting"


def enumerate_trees(h):
    """Every tree of exactly h operator levels, by brute force (small h only)."""
    if h == 0:
        return list(range(5))
    lower = [t for k in range(h - 1) for t in enumerate_trees(k)]
    top = enumerate_trees(h - 1)
    pairs = [(a, b) for a in top for b in top] + [(a, b) for a in top for b in lower] + \
            [(a, b) for a in lower for b in top]
    return [(op, a, b) for op in "+*" for a, b in pairs]


def test_distinct_counts_match_brute_force():
    for h in (0, 1, 2):
        trees = enumerate_trees(h)
        assert len({A.infix(t) for t in trees}) == len(trees) == A.distinct_trees(h)
    assert A.distinct_trees(2) == 6000


def test_hand_examples_value_and_depth():
    """Values and depths worked out by hand: depth 1 is one nested operation
    under the outermost one (the thesis's example, depth 2, has two)."""
    cases = [  # (tree, infix, value mod 5, depth)
        (("+", ("+", 3, 4), 1), "( 3 + 4 ) + 1", 3, 1),            # 8 mod 5
        (("*", 4, ("+", 3, 4)), "4 * ( 3 + 4 )", 3, 1),            # 28 mod 5
        (("*", ("*", 3, 4), ("+", 2, 4)), "( 3 * 4 ) * ( 2 + 4 )", 2, 1),  # 72 mod 5
        (("*", ("+", 0, 0), 4), "( 0 + 0 ) * 4", 0, 1),
        (("+", ("*", ("+", 2, 2), 4), 0), "( ( 2 + 2 ) * 4 ) + 0", 1, 2),  # 16 mod 5
    ]
    for tree, text, val, depth in cases:
        assert A.infix(tree) == text
        assert A.value(tree) == val == eval_infix(text) == eval_prefix(A.prefix(tree))
        assert A.height(tree) - 1 == depth == max_paren_nesting(text)


def test_depth1_draws_are_height_2():
    """Every depth-1 draw has exactly one operation under the outermost one
    (never a bare ``a + b``: that is depth 0, which the thesis does not list)."""
    rng = __import__("random").Random(0)
    trees = [A.random_tree(2, rng) for _ in range(2000)]
    assert {A.height(t) for t in trees} == {2}
    assert {max_paren_nesting(A.infix(t)) for t in trees} == {1}


def test_iid_split_is_the_default_and_overlaps_at_depth_1():
    """The thesis's reading: both sets drawn from the generator, so most
    depth-1 test lines (about 4,200 of the 6,000 expressions fill 10,000
    training lines) are training expressions, deeper ones almost never."""
    train, test = A.generate(30000, 3000, seed=1)
    assert (train, test) == A.generate(30000, 3000, seed=1, split="iid")
    assert [sum(r[3] == d for r in test) for d in A.DEPTHS] == [1000] * 3
    for inf, pre, val, depth in test[:300] + train[:300]:
        assert eval_infix(inf) == val == eval_prefix(pre) and max_paren_nesting(inf) == depth
    shares = [A.overlap_share(train, test, d) for d in A.DEPTHS]
    assert 0.75 < shares[0] < 0.87 and shares[1] < 0.05 and shares[2] == 0


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="choose from iid, disjoint"):
        A.generate(30, 9, seed=1, split="random")


def test_generated_sets(tmp_path):
    train, test = A.generate(600, 90, seed=3, split="disjoint")
    assert len(train) == 600 and len(test) == 90
    for rows, n in ((train, 200), (test, 30)):
        assert [sum(r[3] == d for r in rows) for d in A.DEPTHS] == [n] * 3
        for inf, pre, val, depth in rows:
            assert eval_infix(inf) == val == eval_prefix(pre)
            assert max_paren_nesting(inf) == depth
    assert len({r[0] for r in test}) == len(test)
    assert not {r[0] for r in train} & {r[0] for r in test}
    assert len({r[3] for r in train}) == 3 and len({r[2] for r in train}) == 5
    assert A.generate(600, 90, seed=3, split="disjoint") == (train, test)
    assert A.generate(600, 90, seed=4, split="disjoint") != (train, test)


def max_paren_nesting(text):
    level = best = 0
    for ch in text:
        level += ch == "("
        level -= ch == ")"
        best = max(best, level)
    return best


def test_command_writes_aligned_views(tmp_path):
    out = tmp_path / "arith"
    proc = run([sys.executable, SCRIPT, str(out), "--train", "30", "--test", "9", "--seed", "2"])
    assert "train 30 expressions" in proc.stdout
    for split, n in (("train", 30), ("test", 9)):
        infix = (out / f"{split}.infix.tsv").read_text().splitlines()
        prefix = (out / f"{split}.prefix.tsv").read_text().splitlines()
        depth = (out / f"{split}.depth").read_text().split()
        assert infix[0] == prefix[0] == "sentence\tlabel" and len(infix) == len(prefix) == n + 1 == len(depth) + 1
        for a, b in zip(infix[1:], prefix[1:]):
            (ea, la), (eb, lb) = a.split("\t"), b.split("\t")
            assert la == lb == str(eval_infix(ea)) == str(eval_prefix(eb))
    assert not list(out.glob("*.tmp"))


def test_impossible_request_is_refused_in_one_line(tmp_path):
    proc = run([sys.executable, SCRIPT, str(tmp_path / "x"), "--train", "3", "--test", "18000", "--split", "disjoint"],
               check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "arithmetic.py: error: depth 1 has 6000 distinct expressions: cannot draw 6000 distinct test "
        "expressions and leave any for training; ask for fewer"]
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("bad", [["--train", "0"], ["--test", "2"]])
def test_too_small_sets_are_refused(tmp_path, bad):
    proc = run([sys.executable, SCRIPT, str(tmp_path / "x"), *bad], check=False)
    assert proc.returncode == 2 and "at least 3" in proc.stderr
