"""examples/hf/finetune_sst2.py end to end on a tiny SST-2-shaped folder:
random init, and from a local pretrained directory (model + tokenizer saved
with save_pretrained, as a user's would be); a bad data folder is one line."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "examples", "hf", "finetune_sst2.py")
WORDS = "good bad great awful fine dull fun boring nice poor".split()


def _data(folder):
    os.makedirs(folder)
    for name, n in (("train.tsv", 64), ("test.tsv", 16)):
        with open(os.path.join(folder, name), "w") as f:
            f.write("sentence\tlabel\n")
            for i in range(n):
                f.write(f"{WORDS[i % 10]} {WORDS[(3 * i) % 10]} movie \t{i % 2}\n")


def _run(args, cwd):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_finetune_example(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    data = str(tmp_path / "sst2")
    _data(data)
    common = ["--max-steps", "2", "--batch-size", "8", "--hidden", "32", "--data-dir", data]
    out = tmp_path / "hnas.json"
    run = _run(["--scheme", "hnas", "--seed", "1", "--out", str(out), *common], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads(out.read_text())
    assert record["scheme"] == "hnas" and record["test_examples"] == 16 and record["steps"] == 2
    assert len(record["u"]) == 2 and record["ci95"][0] <= record["accuracy"] <= record["ci95"][1]

    # a local pretrained directory: model and tokenizer
    model_dir = tmp_path / "pretrained"
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "movie", *WORDS]))
    BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(model_dir)
    BertForSequenceClassification(BertConfig(vocab_size=16, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=37)).save_pretrained(model_dir)
    out = tmp_path / "dnas.json"
    run = _run(["--scheme", "dnas", "--model-dir", str(model_dir), "--out", str(out), *common], tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(out.read_text())["model"] == str(model_dir)

    run = _run(["--scheme", "dnas", "--out", str(tmp_path / "x.json"), "--data-dir", str(tmp_path / "nowhere")],
               tmp_path)
    assert run.returncode != 0 and "train.tsv not found" in run.stderr and not (tmp_path / "x.json").exists()
