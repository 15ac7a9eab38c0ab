"""examples/translation: prepare.sh on small synthetic parallel files (input
checks, re-runs), and the whole chain on real Multi30k (quickstart.sh:
prepare -> train -> generate -> sacreBLEU) with a BLEU floor."""

import json
import os
import random
import re
import subprocess

import pytest

from helpers import ROOT

RECIPE = os.path.join(ROOT, "examples", "translation")

# BLEU floor for the CI chain (quickstart.sh with its defaults: all 29,000
# training pairs, tiny HNAS model, 200 updates of 2,048 tokens, beam 5 on the
# first 200 test2016 pairs). Calibrated on this machine (2 CPU cores,
# 2026-11-23), sacreBLEU on those 200 pairs [bootstrap 95% interval]:
#   untrained model (1 update at lr 1e-9)           BLEU  0.00, chrF  3.6
#   the quickstart translations shifted by one line BLEU  0.44, chrF 13.6
#   the quickstart model (200 updates)              BLEU 11.36 [9.43, 13.38], chrF 26.4
# (on the first 500 pairs: 0.00 / 0.46 / 10.85 [9.57, 12.17]). A broken
# pipeline (misaligned or missing output, a model that did not train) stays
# far below; the floor leaves about 6 points for run-to-run noise.
BLEU_FLOOR = 5.0


def _sentence(rng, words, n):
    return " ".join(rng.choice(words) for _ in range(n))


def make_parallel(root, sizes=(("train", 80), ("val", 10), ("test_a", 7), ("test_b", 6)), seed=0):
    """PREFIX.de / PREFIX.en files under root; returns {name: prefix}."""
    rng = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    prefixes = {}
    for name, n in sizes:
        prefix = os.path.join(root, name)
        pairs = [(_sentence(rng, "ein Hund läuft über die Wiese".split(), rng.randint(3, 8)),
                  _sentence(rng, "a dog runs over the meadow".split(), rng.randint(3, 8))) for _ in range(n)]
        for k, lang in enumerate(("de", "en")):
            with open(f"{prefix}.{lang}", "w", encoding="utf-8") as f:
                f.writelines(p[k] + "\n" for p in pairs)
        prefixes[name] = prefix
    return prefixes


def prepare(prefixes, out, **env):
    settings = {"TRAIN_PREFIX": prefixes["train"], "VALID_PREFIX": prefixes["val"],
                "TEST_PREFIXES": f"{prefixes['test_a']} {prefixes['test_b']}", "VOCAB_SIZE": "40",
                "MULTI30K_DIR": ""}
    return subprocess.run(["bash", os.path.join(RECIPE, "prepare.sh"), str(out)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **settings, **env})


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_prepare_builds_every_split_and_skips_finished_steps(tmp_path):
    prefixes = make_parallel(tmp_path / "raw")
    proc = prepare(prefixes, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    for split, n in (("train", 80), ("valid", 10), ("test", 7), ("test1", 6)):
        assert len(_lines(out / f"spm/{split}.de")) == n
        assert (out / f"bin/{split}.de-en.en.bin").exists()
    # The references are the raw target files, line for line.
    assert _lines(out / "text/test1.en") == _lines(prefixes["test_b"] + ".en")
    assert _lines(out / "test_sets.txt") == [f"test {prefixes['test_a']}", f"test1 {prefixes['test_b']}"]
    again = prepare(prefixes, tmp_path / "out")
    assert again.returncode == 0 and "done already" in again.stderr and "checking" not in again.stderr
    changed = prepare(prefixes, tmp_path / "out", VOCAB_SIZE="50")
    assert changed.returncode != 0 and "prepared with other settings" in changed.stderr


@pytest.mark.parametrize("damage, message", [
    ("short_target", "the source file {s} has 80 lines but the target file {t} has 79 lines"),
    ("missing", "missing file: {t}"),
    ("bad_bytes", "{s}, line 5: bytes that are not valid UTF-8"),
])
def test_prepare_refuses_bad_input_and_writes_nothing_finished(tmp_path, damage, message):
    prefixes = make_parallel(tmp_path / "raw")
    s, t = prefixes["train"] + ".de", prefixes["train"] + ".en"
    if damage == "short_target":
        with open(t, encoding="utf-8") as f:
            lines = f.read().splitlines()
        with open(t, "w", encoding="utf-8") as f:
            f.write("\n".join(lines[:-1]) + "\n")
    elif damage == "missing":
        os.remove(t)
    else:
        with open(s, "rb") as f:
            lines = f.read().split(b"\n")
        lines[4] = b"Stra\xdfe " + lines[4]  # Latin-1, not UTF-8
        with open(s, "wb") as f:
            f.write(b"\n".join(lines))
    proc = prepare(prefixes, tmp_path / "out")
    assert proc.returncode != 0
    assert message.format(s=s, t=t) in proc.stderr, proc.stderr
    assert not (tmp_path / "out/text/train.de").exists() and not (tmp_path / "out/text/train.de.tmp").exists()
    assert not (tmp_path / "out/bin").exists()


def test_prepare_without_data_says_what_to_set(tmp_path):
    proc = subprocess.run(["bash", os.path.join(RECIPE, "prepare.sh"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "MULTI30K_DIR"})
    assert proc.returncode != 0 and "set MULTI30K_DIR" in proc.stderr


def test_quickstart_chain_on_real_multi30k_reaches_the_bleu_floor(multi30k_dir, tmp_path):
    """The recipe end to end on Multi30k: prepare -> train a tiny model a few
    minutes -> beam search -> sacreBLEU, with a floor a broken pipeline cannot
    reach (see BLEU_FLOOR)."""
    proc = subprocess.run(["bash", os.path.join(RECIPE, "quickstart.sh")], capture_output=True,
                          text=True, timeout=1200,
                          env={**os.environ, "MULTI30K_DIR": multi30k_dir, "WORK_DIR": str(tmp_path),
                               "DEVICE": "cpu"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    hyps = _lines(tmp_path / "results/transformer_hnas.hyp")
    assert len(hyps) == 200 and sum(1 for h in hyps if h.strip()) >= 198
    assert proc.stdout.count("translation: ") == 3 and "BLEU" in proc.stdout
    # Progress on the console (stderr, not a terminal: a line every 5%).
    assert "[train] update 200/200 (100%) loss " in proc.stderr, proc.stderr[-3000:]
    assert "[generate] 200/200 sentences (100%)" in proc.stderr, proc.stderr[-3000:]
    assert len([line for line in proc.stderr.splitlines() if line.startswith("[train] update ")]) >= 10
    with open(tmp_path / "results/transformer_hnas.bleu.json") as f:
        result = json.load(f)
    assert result["sentences"] == 200 and result["bleu"]["signature"].startswith("nrefs:1|")
    assert result["bleu"]["score"] >= BLEU_FLOOR, result["bleu"]
    # Validation BLEU (--eval-bleu) ran during training; it picks checkpoint_best.pt.
    log = (tmp_path / "checkpoints/transformer_hnas/train.log").read_text()
    assert re.search(r"valid on 'valid' subset \| .*\| bleu \d+\.\d+", log), log[-2000:]
