"""examples/hf/sst_schemes.py: one tiny discrete
classifier trained a few steps on the first sentences of the SST split,
saved with its tokenizer and loadable; a finished run is not redone; the
table step reads it; bad data fails with one line."""

import json
import os
import subprocess
import sys

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "examples", "hf", "sst_schemes.py")
TINY = ["--max-steps", "3", "--layers", "1", "--hidden", "16", "--heads", "2", "--ffn", "16", "--vocab-size", "120",
        "--batch-size", "4", "--log-every", "1"]


def _head(src, dst, lines):
    with open(src, encoding="utf-8") as f, open(dst, "w", encoding="utf-8") as g:
        for _ in range(lines + 1):  # the header and the first sentences
            g.write(f.readline())


def _run(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=300, env=env)


def test_driver_trains_saves_resumes_and_tabulates(tmp_path, sst_binary_dir):
    data = tmp_path / "data"
    data.mkdir()
    for split, n in (("train", 48), ("dev", 12), ("test", 12)):
        _head(os.path.join(sst_binary_dir, f"{split}.tsv"), data / f"{split}.tsv", n)
    out = tmp_path / "runs"
    proc = _run("run", "--schemes", "discrete", "--seeds", "1", "--out", str(out), "--data-dir", str(data), *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[sst] run 1/1: discrete seed 1" in proc.stdout
    result = json.loads((out / "discrete_seed1" / "result.json").read_text())
    assert result["steps"] == 3 and 0 <= result["test_accuracy"] <= 1 and result["scheme"] == "discrete"
    assert not (out / "discrete_seed1.partial").exists()

    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from fairseq_dnas import hf
    model_dir = str(out / "discrete_seed1" / "model")
    model = hf.from_pretrained(BertForSequenceClassification, model_dir).eval()
    assert model.config.dnas["scheme"] == "discrete"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(["a good film", "bad"], padding=True, return_tensors="pt")
    assert enc["input_ids"][0, 0] == tokenizer.cls_token_id
    with torch.no_grad():
        attentions = model(**enc, output_attentions=True).attentions
    assert set(attentions[0].unique().tolist()) == {0.0, 1.0}  # argmax attention at inference

    again = _run("train", "--scheme", "discrete", "--seed", "1", "--out", str(out), "--data-dir", str(data), *TINY)
    assert again.returncode == 0 and "done before, skipped" in again.stdout

    table = _run("table", "--schemes", "discrete", "--seeds", "1", "--out", str(out), "--data-dir", str(data))
    assert table.returncode == 0, table.stderr[-3000:]
    row = [line for line in table.stdout.splitlines() if line.startswith("| discrete |")]
    assert len(row) == 1 and f"{100 * result['test_accuracy']:.1f}" in row[0]


def test_bad_data_fails_with_one_line(tmp_path):
    (tmp_path / "train.tsv").write_text("text\tlabel\nfine\t1\n")
    for split in ("dev", "test"):
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\nfine\t1\n")
    proc = _run("train", "--scheme", "sdpa", "--seed", "1", "--out", str(tmp_path / "o"), "--data-dir", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'train.tsv'} must start with the header 'sentence<TAB>label'; got ['text', 'label']"]
