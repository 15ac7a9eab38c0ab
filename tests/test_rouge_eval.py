"""fairseq_dnas/commands/rouge_eval.py and the small scoring helpers of the Gigaword recipe
(lead baseline, hypothesis collection, seed table)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from rouge_score import rouge_scorer

from helpers import ROOT


from fairseq_dnas.commands import lead_baseline, rouge_eval, seed_table
from fairseq_dnas.recipes import collect_hypotheses


PACKAGE = {"collect_hypotheses.py": "recipes"}  # the rest are fairseq_dnas.commands


def run_script(name, *args):
    """``python -m fairseq_dnas.commands.<name without .py>`` (or .recipes.)."""
    module = f"fairseq_dnas.{PACKAGE.get(name, 'commands')}.{name[:-3]}"
    return subprocess.run([sys.executable, "-m", module, *map(str, args)],
                          capture_output=True, text=True)


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def f1(result, rouge_type, variant="stemmed"):
    return result[variant][rouge_type]["fmeasure"]["mean"]


def test_hand_computed_scores():
    # ref "the cat sat", hyp "the cat": unigrams P=1, R=2/3 -> F=0.8; bigrams
    # P=1, R=1/2 -> F=2/3; LCS 2 -> F=0.8.
    result = rouge_eval.evaluate(["the cat"], [["the cat sat"]], samples=10)
    assert f1(result, "rouge1") == pytest.approx(80.0)
    assert f1(result, "rouge2") == pytest.approx(200 / 3, abs=1e-3)
    assert f1(result, "rougeL") == pytest.approx(80.0)
    assert result["stemmed"]["rouge1"]["recall"]["mean"] == pytest.approx(200 / 3, abs=1e-3)


def test_mean_over_sentences_not_pooled_counts():
    # A pooled (corpus-level) count would give 2 of 5 unigrams; the mean of
    # per-sentence F1 is (1 + 0) / 2.
    result = rouge_eval.evaluate(["a b", "x"], [["a b", "c d e"]], samples=10)
    assert f1(result, "rouge1") == pytest.approx(50.0)


def test_stemming_and_raw_reference_tokens():
    result = rouge_eval.evaluate(["police arrest protester"], [["police arrested protesters"]],
                                 samples=10)
    assert f1(result, "rouge1", "stemmed") == pytest.approx(100.0)
    assert f1(result, "rouge1", "unstemmed") == pytest.approx(100 / 3, abs=1e-3)
    # The Gigaword test reference keeps UNK and '#': rouge-score reads UNK as
    # the word "unk" and drops '#.#'.
    result = rouge_eval.evaluate(["unk wins percent"], [["UNK wins #.# percent"]], samples=10)
    assert f1(result, "rouge1") == pytest.approx(100.0)


def test_agrees_with_rouge_score_sentence_by_sentence():
    rng = np.random.default_rng(0)
    words = "the a police said on in us market stocks fall rise year".split()
    hyps = [" ".join(rng.choice(words, rng.integers(1, 9))) for _ in range(40)]
    refs = [" ".join(rng.choice(words, rng.integers(1, 9))) for _ in range(40)]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    expected = {t: 100 * np.mean([scorer.score(r, h)[t].fmeasure for h, r in zip(hyps, refs)])
                for t in ("rouge1", "rouge2", "rougeL")}
    result = rouge_eval.evaluate(hyps, [refs], samples=200)
    for t, value in expected.items():
        assert f1(result, t) == pytest.approx(value, abs=1e-3)
        f = result["stemmed"][t]["fmeasure"]
        assert f["low"] < f["mean"] < f["high"]  # varied sentences: a real interval


def test_bootstrap_interval_is_seeded_and_degenerate_for_constant_scores():
    hyps = ["a b c", "a x", "b c", "q"]
    refs = [["a b c", "a b", "c b", "r"]]
    one = rouge_eval.evaluate(hyps, refs, samples=300, seed=1)
    assert one == rouge_eval.evaluate(hyps, refs, samples=300, seed=1)
    assert one != rouge_eval.evaluate(hyps, refs, samples=300, seed=2)
    same = rouge_eval.evaluate(["a b"] * 5, [["a b"] * 5], samples=50)
    f = same["stemmed"]["rouge1"]["fmeasure"]
    assert f["low"] == f["mean"] == f["high"] == 100.0


def test_multiple_references_mean_and_max():
    refs = [["the cat sat"], ["dogs bark"]]
    mean = rouge_eval.evaluate(["the cat sat"], refs, samples=10, multi_ref="mean")
    best = rouge_eval.evaluate(["the cat sat"], refs, samples=10, multi_ref="max")
    assert f1(mean, "rouge1") == pytest.approx(50.0)
    assert f1(best, "rouge1") == pytest.approx(100.0)


def test_max_bytes_truncates_hypotheses():
    result = rouge_eval.evaluate(["aaaa bbbb"], [["aaaa"]], samples=10, max_bytes=4)
    assert f1(result, "rouge1") == pytest.approx(100.0)
    assert rouge_eval.truncate_bytes("é" * 3, 3) == "é"  # never splits a character


def test_cli_json_and_table(tmp_path):
    hyp = write(tmp_path / "h", ["the cat", "dogs bark loudly"])
    ref = write(tmp_path / "r", ["the cat sat", "dogs bark"])
    proc = run_script("rouge_eval.py", "--hyp", hyp, "--ref", ref, "--json", "--label", "x")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # exactly one JSON object
    assert result["sentences"] == 2 and result["label"] == "x"
    assert set(result["stemmed"]) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert f1(result, "rouge1") == pytest.approx(80.0)
    out = tmp_path / "r.json"
    proc = run_script("rouge_eval.py", "--hyp", hyp, "--ref", ref, "--json-out", out)
    assert proc.returncode == 0 and "R-1 80.00" in proc.stdout
    assert json.loads(out.read_text())["stemmed"] == result["stemmed"]


def test_cli_refuses_line_count_mismatch(tmp_path):
    hyp = write(tmp_path / "hyp.txt", ["a", "b", "c"])
    ref = write(tmp_path / "ref.txt", ["a", "b"])
    proc = run_script("rouge_eval.py", "--hyp", hyp, "--ref", ref, "--json")
    assert proc.returncode == 1 and proc.stdout == ""
    assert "hyp.txt has 3 lines" in proc.stderr and "ref.txt has 2" in proc.stderr


def test_lead_baseline(tmp_path):
    src = write(tmp_path / "a", ["one two three four five six seven eight nine ten", "short one"])
    proc = run_script("lead_baseline.py", "--input", src, "--words", "8")
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == ["one two three four five six seven eight", "short one"]
    assert lead_baseline.lead("  a   b c ", 2) == "a b"


def test_collect_hypotheses_reorders_and_detokenizes():
    log = [
        "S-1\t\u2581x\n", "H-1\t-0.5\t\u2581second \u2581head line\n", "D-1\t-0.5\tsecond headline\n",
        "H-0\t-0.2\t\u2581first <unk> \u2581word\n", "H-2\t-0.1\t\n",
    ]
    hyps = collect_hypotheses.collect(log, 3)
    assert hyps == ["first UNK word", "second headline", ""]


@pytest.mark.parametrize("lines, message", [
    (["H-0\t0\t\u2581a\n"], "1 of 2 sources have no hypothesis (ids 1)"),
    (["H-0\t0\t\u2581a\n", "H-0\t0\t\u2581b\n", "H-1\t0\t\u2581c\n"], "two hypotheses for source 0"),
    (["H-0\t0\t\u2581a\n", "H-1\t0\t\u2581b\n", "H-2\t0\t\u2581c\n"], "outside the 2 sources"),
])
def test_collect_hypotheses_refuses_anything_but_one_per_source(lines, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        collect_hypotheses.collect(lines, 2)


def test_collect_hypotheses_cli_writes_nothing_on_error(tmp_path):
    log = write(tmp_path / "gen.out", ["H-0\t0\t\u2581a"])
    src = write(tmp_path / "src", ["x", "y"])
    out = tmp_path / "out.hyp"
    proc = run_script("collect_hypotheses.py", "--generate-log", log, "--sources", src, "--out", out)
    assert proc.returncode == 1 and "no hypothesis" in proc.stderr and not out.exists()


def _result(label, r1, r2, rl, low=0.0, high=0.0):
    cell = lambda v: {"fmeasure": {"mean": v, "low": low or v - 1, "high": high or v + 1}}
    scores = {"rouge1": cell(r1), "rouge2": cell(r2), "rougeL": cell(rl)}
    return {"label": label, "sentences": 1951, "stemmed": scores, "unstemmed": scores}


def test_seed_table_mean_and_standard_error(tmp_path):
    paths = []
    for i, (r1, r2, rl) in enumerate([(30.0, 10.0, 28.0), (32.0, 12.0, 29.0), (34.0, 11.0, 30.0)]):
        paths.append(tmp_path / f"u{i}.json")
        paths[-1].write_text(json.dumps(_result("transformer", r1, r2, rl)))
    paths.append(tmp_path / "lead.json")
    paths[-1].write_text(json.dumps(_result("lead-8", 21.3, 7.35, 19.95, 20.43, 22.18)))
    text = seed_table.table(seed_table.load(paths), "stemmed", ["transformer"])
    rows = [l for l in text.splitlines() if l.startswith("| ") and "---" not in l][1:]
    # mean 32, sd 2, s.e. 2/sqrt(3) = 1.15; R-2 mean 11, sd 1, s.e. 0.58.
    assert rows[0] == "| UNAS encoder (baseline) | 3 | 32.00 ± 1.15 | 11.00 ± 0.58 | 29.00 ± 0.58 |"
    assert rows[1].startswith("| lead-8 | 1 | 21.30 [20.43, 22.18] |")


# ------------------------------------------------------------- ROUGE-Lsum

def test_rouge_lsum_is_the_summary_level_lcs_over_sentences(monkeypatch):
    """Two sentences in swapped order: ROUGE-L (one LCS over the whole text)
    finds half of them, ROUGE-Lsum (the union LCS per reference sentence)
    all; nothing is downloaded for the split."""
    import nltk

    monkeypatch.setattr(nltk, "download", lambda *a, **k: pytest.fail("ROUGE-Lsum must not download"))
    ref = "The cat sat on the mat. A dog ran off quickly."
    hyp = "A dog ran off quickly. The cat sat on the mat."
    assert rouge_eval.split_sentences(ref) == "The cat sat on the mat.\nA dog ran off quickly."
    result = rouge_eval.evaluate([hyp], [[ref]], samples=10)
    assert f1(result, "rougeL") == pytest.approx(600 / 11, abs=1e-3)  # LCS "the cat sat on the mat": 6 of 11
    assert f1(result, "rougeLsum") == pytest.approx(100.0)
    assert f1(result, "rouge1") == pytest.approx(100.0)


def test_rouge_lsum_matches_rouge_score_on_newline_separated_sentences():
    """Texts that hold newlines keep their lines as the sentences (no
    splitter runs: "mr." stays inside its sentence); the figure is
    rouge-score's own rougeLsum of the same text; ROUGE-1/2/L do not move."""
    ref = "mr. smith went to washington\nhe met the president there"
    hyp = "the president met mr. smith\nsmith went to washington"
    assert rouge_eval.split_sentences(ref) == ref
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    want = scorer.score(ref, hyp)
    got = rouge_eval.sentence_scores([hyp], [[ref]], use_stemmer=True)[0]
    for a, t in enumerate(rouge_eval.TYPES):
        assert got[a, 2] == pytest.approx(want[t].fmeasure), t
    assert want["rougeLsum"].fmeasure != want["rougeL"].fmeasure
    one_line = rouge_eval.sentence_scores([hyp.replace("\n", " ")], [[ref.replace("\n", " ")]], use_stemmer=True)[0]
    assert np.allclose(one_line[:3], got[:3])  # the split only reaches ROUGE-Lsum


def test_the_sentence_split_keeps_abbreviations_initials_and_lower_cased_headlines():
    text = ('Mr. Smith met the U.S. envoy on Jan. 5. "It went well," he said. J. Doe agreed! '
            '3 people left? Then it ended.')
    assert rouge_eval.split_sentences(text).split("\n") == [
        "Mr. Smith met the U.S. envoy on Jan. 5.", '"It went well," he said.', "J. Doe agreed!", "3 people left?",
        "Then it ended."]
    for headline in ("u.s. to urge u.n. to lift sanctions against iraq", "sri lanka vs. new zealand scoreboard",
                     "stocks end lower . dollar up"):
        assert rouge_eval.split_sentences(headline) == headline


def test_rouge_lsum_equals_rouge_l_on_headlines():
    hyps = ["police arrest man over killing", "u.s. stocks fall on wall street"]
    refs = ["man arrested in killing of police officer", "u.s. stocks fall sharply"]
    result = rouge_eval.evaluate(hyps, [refs], samples=10)
    assert result["stemmed"]["rougeLsum"] == result["stemmed"]["rougeL"]
