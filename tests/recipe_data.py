"""Tiny binarized article/title data in the layout prepare.sh produces (for the
recipe tests that must not depend on the real Gigaword sample)."""

import os
import random

from helpers import run

WORDS = [f"w{i}" for i in range(20)]
SPACE = "\u2581"


def headline_pairs(n, seed, vocabulary=WORDS):
    """A learnable toy task: the headline is the article's first three words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(4, 12))]
        pairs.append((words, words[:3]))
    return pairs


def make_binarized(folder, sizes=(("train", 320), ("valid", 30), ("test", 21)), vocabulary=WORDS):
    """Write SentencePiece-style text (every word a ``\u2581word`` piece) under
    folder/spm, the detokenized titles under folder/text, and fairseq-preprocess
    output under folder/bin. Returns folder/bin."""
    spm_dir, text_dir = os.path.join(folder, "spm"), os.path.join(folder, "text")
    os.makedirs(spm_dir, exist_ok=True)
    os.makedirs(text_dir, exist_ok=True)
    for i, (split, n) in enumerate(sizes):
        pairs = headline_pairs(n, seed=i, vocabulary=vocabulary)
        for side, k in (("article", 0), ("title", 1)):
            with open(os.path.join(spm_dir, f"{split}.{side}"), "w") as f:
                f.writelines(" ".join(SPACE + w for w in p[k]) + "\n" for p in pairs)
            with open(os.path.join(text_dir, f"{split}.{side}"), "w") as f:
                f.writelines(" ".join(p[k]) + "\n" for p in pairs)
    run(["fairseq-preprocess", "--source-lang", "article", "--target-lang", "title",
         "--trainpref", os.path.join(spm_dir, "train"), "--validpref", os.path.join(spm_dir, "valid"),
         "--testpref", os.path.join(spm_dir, "test"), "--destdir", os.path.join(folder, "bin"),
         "--joined-dictionary", "--workers", "1"])
    return os.path.join(folder, "bin")
