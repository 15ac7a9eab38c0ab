"""examples/bart/: the CNN/DailyMail steps (GPT-2 BPE, binarize), fine-tuning
from a pretrained checkpoint with finetune.sh, summarize.py's hub-interface
generation and ROUGE, end to end on a tiny corpus with a GPT-2 BPE of bytes
only (encoder.json of the 256 byte symbols, no merges): the same file
formats as fairseq's, small enough for a test. Every missing file or bad
setting ends in one line. The experiment driver at its smallest size."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, USER_DIR, run

import fairseq_dnas.plugin  # noqa: F401  (fairseq's checkpoint reader under torch >= 2.6)
from fairseq_dnas.attention.hybrid import exact_logit

BART = os.path.join(ROOT, "examples", "bart")
SIZES = ["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
         "--decoder-attention-heads", "2", "--max-source-positions", "256", "--max-target-positions", "256"]
WORDS = ["the", "mayor", "said", "on", "monday", "city", "council", "will", "vote", "new", "budget", "plan",
         "police", "reported", "fire", "near", "river", "school"]


def sh(script, env, *args, check=True):
    proc = subprocess.run(["bash", os.path.join(BART, script), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env})
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def one_error_line(proc, *words):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error" in lines[-1] and all(w in lines[-1] for w in words), lines[-1]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A byte-level GPT-2 BPE (encoder.json, vocab.bpe, BART-style dict.txt)
    and a tiny article/summary corpus in CNN/DailyMail's layout."""
    from fairseq.data.encoders.gpt2_bpe_utils import bytes_to_unicode

    root = tmp_path_factory.mktemp("bart_recipe")
    gpt2 = root / "gpt2_bpe"
    gpt2.mkdir()
    symbols = bytes_to_unicode()
    (gpt2 / "encoder.json").write_text(json.dumps({ch: i for i, ch in enumerate(symbols[b] for b in range(256))}))
    (gpt2 / "vocab.bpe").write_text("#version: 0.2\n\n")
    (gpt2 / "dict.txt").write_text("".join(f"{i} {1000 - i}\n" for i in range(256)))
    rng = random.Random(0)
    cnn = root / "cnn_dm"
    cnn.mkdir()
    for split, n in (("train", 60), ("val", 6), ("test", 5)):
        src = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) for _ in range(n)]
        (cnn / f"{split}.source").write_text("".join(s + "\n" for s in src))
        (cnn / f"{split}.target").write_text("".join(" ".join(s.split()[:4]) + "\n" for s in src))
    return {"root": root, "gpt2": gpt2, "cnn": cnn}


@pytest.fixture(scope="module")
def prepared(corpus):
    out = corpus["root"] / "cnn_dm-bin"
    sh("prepare_cnndm.sh", {"CNNDM_DIR": str(corpus["cnn"]), "GPT2_DIR": str(corpus["gpt2"]), "OUT_DIR": str(out),
                            "WORKERS": "1"})
    return out


def test_prepare_writes_bpe_ids_and_binarized_data(corpus, prepared):
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    enc = get_encoder(str(corpus["gpt2"] / "encoder.json"), str(corpus["gpt2"] / "vocab.bpe"))
    first = (corpus["cnn"] / "train.source").read_text().splitlines()[0]
    bpe = (corpus["cnn"] / "train.bpe.source").read_text().splitlines()[0]
    assert bpe.split() == [str(b) for b in first.encode()]  # bytes only: one id a byte
    assert enc.decode([int(x) for x in bpe.split()]) == first
    for f in ("dict.source.txt", "train.source-target.source.bin", "valid.source-target.target.idx",
              "test.source-target.source.idx"):
        assert (prepared / f).exists(), f


def test_prepare_stops_in_one_line_on_a_missing_file(corpus, tmp_path):
    proc = sh("prepare_cnndm.sh", {"CNNDM_DIR": str(corpus["cnn"]), "GPT2_DIR": str(tmp_path),
                                   "OUT_DIR": str(tmp_path / "bin")}, check=False)
    one_error_line(proc, f"missing {tmp_path}/encoder.json", "dl.fbaipublicfiles.com")
    proc = sh("prepare_cnndm.sh", {"CNNDM_DIR": str(tmp_path), "GPT2_DIR": str(corpus["gpt2"]),
                                   "OUT_DIR": str(tmp_path / "bin")}, check=False)
    one_error_line(proc, f"missing {tmp_path}/train.source")
    assert not (tmp_path / "bin").exists()


@pytest.fixture(scope="module")
def pretrained(corpus, prepared):
    """A softmax ``bart_base`` (tiny) trained a few updates: the stand-in for bart.base/model.pt."""
    save = corpus["root"] / "pretrained"
    run(["fairseq-train", prepared, "--arch", "bart_base", "--user-dir", USER_DIR, *SIZES, "--task", "translation",
         "-s", "source", "-t", "target", "--cpu", "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "2000",
         "--max-update", "20", "--no-progress-bar", "--no-epoch-checkpoints", "--disable-validation",
         "--save-dir", save, "--num-workers", "0"])
    return save / "checkpoint_last.pt"


def finetune_env(prepared, pretrained, save, **extra):
    return {"RESTORE": str(pretrained), "DATA": str(prepared), "ARCH": "bart_hnas_base", "SAVE_DIR": str(save),
            "TOTAL_NUM_UPDATES": "3", "WARMUP_UPDATES": "1", "LR": "1e-3", "MAX_TOKENS": "2000",
            "UPDATE_FREQ": "1", "DEVICE": "cpu", **extra}


def test_finetune_then_summarize_and_score(corpus, prepared, pretrained, tmp_path):
    save = tmp_path / "hnas"
    proc = sh("finetune.sh", finetune_env(prepared, pretrained, save, HYBRID_INIT="0.01"), *SIZES,
              "--num-workers", "0", "--no-epoch-checkpoints", "--disable-validation")
    log = proc.stdout + proc.stderr
    assert log.count("the checkpoint has no HNAS weights: created 2 hybrid_logit tensors at u = --hybrid-init 0.01") == 1
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["cfg"]["model"].arch == "bart_hnas_base"
    assert state["optimizer_history"][-1]["num_updates"] == 3
    u = torch.sigmoid(state["model"]["encoder.layers.0.self_attn.hybrid_logit"].float())
    assert (u - torch.sigmoid(torch.tensor(exact_logit(0.01)))).abs().max() < 0.01  # trained a little from 0.01

    hyp = tmp_path / "test.hyp"
    proc = subprocess.run([sys.executable, os.path.join(BART, "summarize.py"), "--model-dir", save,
                           "--checkpoint", "checkpoint_last.pt", "--data", prepared, "--gpt2-encoder-json",
                           corpus["gpt2"] / "encoder.json", "--gpt2-vocab-bpe", corpus["gpt2"] / "vocab.bpe",
                           "--source", corpus["cnn"] / "test.source", "--reference", corpus["cnn"] / "test.target",
                           "--out", hyp, "--batch-size", "2"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BARTDNASModel (hnas encoder)" in proc.stderr and "'min_len': 55" in proc.stderr
    assert len(hyp.read_text().splitlines()) == 5
    rouge = json.loads((tmp_path / "test.hyp.rouge.json").read_text())
    assert rouge["sentences"] == 5 and 0 <= rouge["stemmed"]["rouge1"]["fmeasure"]["mean"] <= 100
    assert 0 <= rouge["stemmed"]["rougeLsum"]["fmeasure"]["mean"] <= 100

    # a fresh interpreter that never imported the plugin: user_dir= makes the architecture known
    code = ("import sys; from fairseq.models.bart import BARTModel; "
            "b = BARTModel.from_pretrained(sys.argv[1], checkpoint_file='checkpoint_last.pt', data_name_or_path="
            "sys.argv[2], gpt2_encoder_json=sys.argv[3], gpt2_vocab_bpe=sys.argv[4], user_dir=sys.argv[5]); "
            "b.eval(); print(type(b.model).__name__, b.model.args.encoder_attention_scheme, "
            "len(b.sample(['the mayor said'], beam=4, lenpen=2.0, max_len_b=140, min_len=55, no_repeat_ngram_size=3)))")
    proc = subprocess.run([sys.executable, "-c", code, save, prepared, corpus["gpt2"] / "encoder.json",
                           corpus["gpt2"] / "vocab.bpe", USER_DIR], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert proc.returncode == 0 and proc.stdout.split() == ["BARTDNASModel", "hnas", "1"], proc.stderr[-2000:]

    # a BPE file that is not there: one line naming what to pass
    proc = subprocess.run([sys.executable, os.path.join(BART, "summarize.py"), "--model-dir", save,
                           "--checkpoint", "checkpoint_last.pt", "--data", prepared, "--gpt2-encoder-json",
                           tmp_path / "encoder.json", "--gpt2-vocab-bpe", corpus["gpt2"] / "vocab.bpe",
                           "--source", corpus["cnn"] / "test.source", "--out", tmp_path / "x.hyp"],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    one_error_line(proc, "encoder.json: no such BPE file (gpt2_encoder_json)", "pass gpt2_encoder_json=PATH")
    assert not (tmp_path / "x.hyp").exists()


def test_summarize_with_a_missing_data_folder_is_one_line(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("summarize", os.path.join(BART, "summarize.py"))
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    (tmp_path / "checkpoint_best.pt").write_bytes(b"x")
    (tmp_path / "test.source").write_text("an article\n")
    with pytest.raises(SystemExit) as exit_:
        summarize.main(["--model-dir", str(tmp_path), "--data", str(tmp_path / "cnn_dm-bin"), "--source",
                        str(tmp_path / "test.source"), "--out", str(tmp_path / "test.hyp"),
                        "--gpt2-encoder-json", "e.json", "--gpt2-vocab-bpe", "v.bpe"])
    message = str(exit_.value.code)
    assert message == (f"[summarize] error: {tmp_path / 'cnn_dm-bin'}: no such data folder (--data: the binarized "
                       "data of the fine-tuning, whose dict.source.txt / dict.target.txt the model was trained with)")
    assert not (tmp_path / "test.hyp").exists()


@pytest.mark.parametrize("extra,words", [
    ({"HYBRID_INIT": "1.5"}, ["--hybrid-init must lie in (0, 1)"]),
    ({"RESTORE": "/nowhere/model.pt"}, ["missing /nowhere/model.pt"]),
    ({"ARCH": "bart_dnas_base", "HYBRID_INIT": "0.1"}, ["HYBRID_INIT is for the HNAS architectures"]),
    ({"ARCH": "transformer_hnas"}, ["ARCH=transformer_hnas"]),
])
def test_finetune_bad_settings_end_in_one_line(prepared, pretrained, tmp_path, extra, words):
    proc = sh("finetune.sh", finetune_env(prepared, pretrained, tmp_path / "save", **extra), *SIZES, check=False)
    one_error_line(proc, *words)
    assert not (tmp_path / "save" / "checkpoint_last.pt").exists()


@pytest.mark.full  # the same check through fairseq-train: tests/test_bart_dnas.py
def test_finetune_of_another_architectures_checkpoint_is_one_line(prepared, tmp_path):
    run(["fairseq-train", prepared, "--arch", "transformer", "--user-dir", USER_DIR, *SIZES, "--task", "translation",
         "-s", "source", "-t", "target", "--cpu", "--optimizer", "adam", "--lr", "3e-3", "--max-tokens", "2000",
         "--max-update", "1", "--no-progress-bar", "--disable-validation", "--save-dir", tmp_path / "tf",
         "--num-workers", "0"])
    proc = sh("finetune.sh", finetune_env(prepared, tmp_path / "tf" / "checkpoint_last.pt", tmp_path / "save"),
              *SIZES, check=False)
    one_error_line(proc, "its parameters do not fit the model being built")


def test_finetune_dry_run_is_fairseqs_cnn_dailymail_command(prepared, pretrained, tmp_path):
    out = sh("finetune.sh", {"RESTORE": str(pretrained), "DATA": str(prepared), "DRY_RUN": "1", "DEVICE": "cpu",
                             "ARCH": "bart_hnas_large", "HYBRID_INIT": "0.01"}).stdout
    for flag in ("--restore-file", "--reset-optimizer", "--reset-dataloader", "--reset-meters", "--truncate-source",
                 "--layernorm-embedding", "--share-all-embeddings", "--arch bart_hnas_large", "--hybrid-init 0.01",
                 "--lr 3e-05", "--total-num-update 20000", "--warmup-updates 500", "--max-tokens 2048",
                 "--update-freq 4", "--clip-norm 0.1", "--label-smoothing 0.1", "--user-dir"):
        assert flag in out, flag


def test_hnas_distance_grows_from_u_near_zero_to_dnas(prepared, pretrained, tmp_path):
    out = tmp_path / "distance.jsonl"
    proc = subprocess.run([sys.executable, os.path.join(BART, "hnas_distance.py"), "--checkpoint", pretrained,
                           "--data", prepared, "--split", "valid", "--sentences", "6", "--u", "0.01", "0.5", "1",
                           "--json-out", out], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["u"] for r in rows] == [0.01, 0.5, 1.0] and [r["scheme"] for r in rows] == ["hnas", "hnas", "dnas"]
    assert 0 < rows[0]["enc_rel"] < rows[2]["enc_rel"]  # the scheme runs; u = 0.01 stays closer than DNAS
    assert all(r["sentences"] == 6 and 0 <= r["top1"] <= 1 and r["kl"] >= -1e-6 for r in rows)
    proc = subprocess.run([sys.executable, os.path.join(BART, "hnas_distance.py"), "--checkpoint", pretrained,
                           "--data", prepared, "--u", "0"], capture_output=True, text=True)
    one_error_line(proc, "--u 0.0: give values in (0, 1]")


@pytest.mark.full
def test_hnas_distance_truncates_long_sources_as_fine_tuning_does(prepared, pretrained, tmp_path):
    """A source longer than the model's positions (256 here, 1,024 for BART):
    fine-tuning truncates it (--truncate-source); the script too, instead of
    an IndexError in the position embedding."""
    raw = tmp_path / "raw"
    raw.mkdir()
    long_source = " ".join(WORDS * 6)  # about 600 bytes: 600 byte-level BPE ids
    for side, lines in (("source", [long_source, "the mayor said"]), ("target", ["the mayor", "the mayor"])):
        (raw / f"valid.bpe.{side}").write_text("".join(" ".join(str(b) for b in line.encode()) + "\n"
                                                       for line in lines))
    run(["fairseq-preprocess", "--source-lang", "source", "--target-lang", "target", "--validpref",
         raw / "valid.bpe", "--destdir", tmp_path / "bin", "--srcdict", prepared / "dict.source.txt",
         "--tgtdict", prepared / "dict.target.txt", "--workers", "1"])
    proc = subprocess.run([sys.executable, os.path.join(BART, "hnas_distance.py"), "--checkpoint", pretrained,
                           "--data", tmp_path / "bin", "--split", "valid", "--sentences", "2", "--u", "0.5"],
                          capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["sentences"] == 2 and row["enc_rel"] > 0


def test_experiment_table_from_results(tmp_path):
    """--report-only: the table (mean +- s.e. over seeds) and u per layer from results.jsonl."""
    def rouge(r1):
        return {"stemmed": {k: {"fmeasure": {"mean": v}} for k, v in
                            (("rouge1", r1), ("rouge2", r1 / 4), ("rougeL", r1 - 1))}}
    rows = [{"scheme": s, "arch": a, "seed": seed, "train_seconds": 1, "rouge": rouge(r1), "hnas_u": u}
            for s, a, u in (("unas", "bart_base", None), ("hnas", "bart_hnas_base", [0.2, 0.3]))
            for seed, r1 in ((1, 10.0), (2, 12.0))]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = subprocess.run([sys.executable, os.path.join(BART, "experiment.py"), "--out", tmp_path, "--report-only"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = (tmp_path / "table.md").read_text()
    assert "| UNAS | `bart_base` | 2 | 11.00 +- 1.00 | 2.75 +- 0.25 | 10.00 +- 1.00 |" in table
    assert "- seed 1: L0 0.2000, L1 0.3000" in table


@pytest.mark.full
def test_experiment_runs_end_to_end_at_its_smallest(tmp_path):
    gigaword = os.environ.get("GIGAWORD_DIR", os.path.join(os.path.dirname(ROOT), "shared", "data", "gigaword",
                                                           "sumdata"))
    if not os.path.isdir(gigaword):
        pytest.skip("no Gigaword sumdata (set GIGAWORD_DIR)")
    proc = subprocess.run([sys.executable, os.path.join(BART, "experiment.py"), "--sumdata", gigaword, "--out",
                           tmp_path, "--pretrain-updates", "4", "--finetune-updates", "3", "--train-pairs", "300",
                           "--test-pairs", "20", "--vocab", "800", "--seeds", "1", "--layers", "1", "--dim", "32"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["scheme"] for r in rows] == ["unas", "dnas", "hnas"]
    assert rows[2]["hnas_u"] is not None and len(rows[2]["hnas_u"]) == 1
    assert "the checkpoint has no HNAS weights" in (tmp_path / "ft-hnas-seed1" / "train.log").read_text()
