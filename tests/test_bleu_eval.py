"""fairseq_dnas/commands/bleu_eval.py: sacreBLEU BLEU and chrF with signature and bootstrap
interval, and its refusals."""

import json
import os
import subprocess
import sys

import sacrebleu

from helpers import ROOT

COMMAND = ["-m", "fairseq_dnas.commands.bleu_eval"]
REFS = ["A man is riding a red bicycle down the street.", "Two dogs play in the snow.",
        "A woman in a blue dress sings on stage.", "Children are running on the beach.",
        "An old man reads a newspaper on a bench."]
HYPS = ["A man rides a red bike down the street.", "Two dogs are playing in snow.",
        "A woman in a blue dress is singing on a stage.", "Kids run on the beach.",
        "An old man is reading the paper on a bench."]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def _run(*args):
    return subprocess.run([sys.executable, *COMMAND, *args], capture_output=True, text=True, timeout=120)


def test_scores_are_sacrebleus_with_signature_and_interval(tmp_path):
    hyp, ref = _write(tmp_path / "h", HYPS), _write(tmp_path / "r", REFS)
    proc = _run("--hyp", hyp, "--ref", ref, "--json", "--json-out", str(tmp_path / "out.json"), "--label", "x")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert json.loads((tmp_path / "out.json").read_text()) == result and result["label"] == "x"
    bleu, chrf = result["bleu"], result["chrf"]
    assert abs(bleu["score"] - sacrebleu.corpus_bleu(HYPS, [REFS]).score) < 1e-3
    assert abs(chrf["score"] - sacrebleu.corpus_chrf(HYPS, [REFS]).score) < 1e-3
    assert 0 < bleu["score"] < 100
    assert bleu["signature"].startswith("nrefs:1|bs:1000|") and "tok:13a" in bleu["signature"]
    assert "case:mixed" in bleu["signature"]  # cased
    for r in (bleu, chrf):
        assert r["low"] <= r["bootstrap_mean"] <= r["high"] and r["low"] < r["high"]


def test_perfect_output_and_several_references(tmp_path):
    ref = _write(tmp_path / "r", REFS)
    proc = _run("--hyp", ref, "--ref", ref)
    assert proc.returncode == 0 and "BLEU 100.00" in proc.stdout and "chrF 100.00" in proc.stdout
    hyp, ref2 = _write(tmp_path / "h", HYPS), _write(tmp_path / "r2", HYPS)
    two = json.loads(_run("--hyp", hyp, "--ref", ref, "--ref", ref2, "--json").stdout)
    assert two["references"] == 2 and two["bleu"]["score"] == 100.0  # the second reference is the output


def test_line_count_mismatch_is_refused_and_writes_nothing(tmp_path):
    hyp, ref = _write(tmp_path / "h", HYPS[:-1]), _write(tmp_path / "r", REFS)
    out = tmp_path / "out.json"
    proc = _run("--hyp", hyp, "--ref", ref, "--json-out", str(out))
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"{hyp} has 4 lines but {ref} has 5" in proc.stderr
    assert not out.exists() and not (tmp_path / "out.json.tmp").exists()
    empty = _write(tmp_path / "e", [])
    proc = _run("--hyp", empty, "--ref", _write(tmp_path / "e2", []))
    assert proc.returncode == 1 and "empty, no hypothesis" in proc.stderr
