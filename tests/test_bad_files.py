"""Bad files fail cleanly.

Every script that reads a checkpoint or data, given a truncated or corrupt
checkpoint, a checkpoint of another architecture, an empty or truncated data
file, or a results JSON of another run, must exit non-zero with one line that
names the file and says what is wrong (no traceback), and leave no output
that looks complete.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from recipe_data import make_binarized

from helpers import ROOT

RECIPE = os.path.join(ROOT, "examples", "gigaword")
from fairseq_dnas.commands import explaining_away, lead_baseline, plot_hybrid_weights, rouge_eval, seed_table
from fairseq_dnas.recipes import collect_hypotheses

import fairseq_dnas.plugin  # noqa: E402,F401  (models, tasks, checkpoint loading under torch >= 2.6)
from fairseq_dnas.fairseq_patches import file_checks  # noqa: E402

SMALL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
         "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
         "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TRAIN_ENV = {"SIZE": "tiny", "DEVICE": "cpu", "NPROC": "1", "CPU_THREADS": "1", "BATCH_SENTENCES": "32",
             "MAX_UPDATE": "2", "LR": "1e-3", "WARMUP_UPDATES": "1", "VALIDATE_INTERVAL_UPDATES": "2",
             "EVAL_ROUGE": "0", "LOG_INTERVAL": "1"}


def _train(data_bin, save_dir, *flags, arch="transformer_hnas"):
    env = {**os.environ, **TRAIN_ENV, "DATA": data_bin, "ARCH": arch, "SAVE_DIR": str(save_dir)}
    return subprocess.run(["bash", os.path.join(RECIPE, "train.sh"), *flags], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """Tiny article/title data (bin/, spm/, text/) and an HNAS checkpoint
    trained on it; plus a DNAS checkpoint of another data set (30 words, not
    20: another dictionary), which fits no model built for this data."""
    root = tmp_path_factory.mktemp("bad_files")
    data = root / "data"
    make_binarized(str(data))
    proc = _train(str(data / "bin"), root / "ckpt", *SMALL)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    other_data = root / "other_data"
    make_binarized(str(other_data), sizes=(("train", 64), ("valid", 8), ("test", 8)),
                   vocabulary=[f"v{i}" for i in range(30)])
    proc = _train(str(other_data / "bin"), root / "other", *SMALL, arch="transformer_dnas")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return {"data": data, "checkpoint": root / "ckpt" / "checkpoint_last.pt",
            "other_arch": root / "other" / "checkpoint_last.pt"}


def _damaged_checkpoint(good, folder, how):
    path = folder / f"{how}.pt"
    data = good.read_bytes()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "corrupt":  # the zip directory and the start of the pickle overwritten
        data = b"\x00garbage" * 64 + data[512:-2048] + b"\xff" * 2048
    elif how == "empty":
        data = b""
    path.write_bytes(data)
    return path


def _checkpoint(case, recipe, folder):
    if case == "other-arch":
        return recipe["other_arch"]
    return _damaged_checkpoint(recipe["checkpoint"], folder, case)


def _damaged_data(recipe, folder, how):
    """A copy of the tiny data with one file damaged; returns (data folder, that file)."""
    data = folder / "data"
    shutil.copytree(recipe["data"], data)
    split = "valid"
    target = {
        "truncated-bin": data / "bin" / f"{split}.article-title.article.bin",
        "empty-idx": data / "bin" / f"{split}.article-title.title.idx",
        "empty-dict": data / "bin" / "dict.article.txt",
        "truncated-reference": data / "text" / f"{split}.title",
        "empty-sources": data / "spm" / f"{split}.article",
    }[how]
    content = target.read_bytes()
    target.write_bytes(content[: len(content) // 2 - 3] if how.startswith("truncated") else b"")
    return data, target


def _one_error_line(returncode, output, path):
    """The single error line of a failed run; it names ``path``."""
    assert returncode not in (0, None), output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, output[-3000:]
    assert str(path) in errors[0] or os.path.basename(str(path)) in errors[0], errors[0]
    return errors[0]


# ---------------------------------------------------------------- generate.sh

def _generate(data, checkpoint, out_prefix):
    env = {**os.environ, "DATA": str(data), "CHECKPOINT": str(checkpoint), "OUT_PREFIX": str(out_prefix),
           "SUBSET": "valid", "DEVICE": "cpu", "BEAM": "2", "BATCH_SIZE": "16"}
    return subprocess.run(["bash", os.path.join(RECIPE, "generate.sh")], env=env, capture_output=True,
                          text=True, timeout=600)


def _stale_results(prefix):
    """Results of an earlier run, which a failed run must not leave behind."""
    for suffix in (".hyp", ".rouge.json"):
        prefix.parent.joinpath(prefix.name + suffix).write_text("from an earlier run\n")


# One case of each kind per script (a subprocess each, a few seconds); the
# other variants of a kind (corrupt or empty checkpoint, empty index, empty
# dictionary) take the same code path, tested in-process below.
GENERATE_CASES = {
    "truncated": "truncated or corrupt", "other-arch": "do not fit the model",
    "truncated-bin": "truncated", "truncated-reference": "lines but",
}


@pytest.mark.parametrize("case", list(GENERATE_CASES))
def test_generate_reports_a_bad_file_in_one_line(recipe, tmp_path, case):
    data, checkpoint = recipe["data"], recipe["checkpoint"]
    if case in ("truncated", "corrupt", "empty", "other-arch"):
        checkpoint = bad = _checkpoint(case, recipe, tmp_path)
    else:
        data, bad = _damaged_data(recipe, tmp_path, case)
    prefix = tmp_path / "out" / "valid"
    prefix.parent.mkdir()
    _stale_results(prefix)
    proc = _generate(data, checkpoint, prefix)
    line = _one_error_line(proc.returncode, proc.stdout + proc.stderr, bad)
    assert GENERATE_CASES[case] in line, line
    assert sorted(p.name for p in prefix.parent.iterdir() if not p.name.endswith((".err",))) == [], \
        list(prefix.parent.iterdir())


# ------------------------------------------------------------------- train.sh

TRAIN_CASES = {
    "corrupt": "corrupt", "other-arch": "do not fit the model",
    "truncated-last": "truncated or corrupt", "empty-idx": "empty file",
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_reports_a_bad_file_in_one_line(recipe, tmp_path, case):
    data, flags, save = recipe["data"], list(SMALL), tmp_path / "save"
    if case in ("truncated", "corrupt", "other-arch"):
        bad = _checkpoint(case, recipe, tmp_path)
        flags += ["--restore-file", str(bad)]
    elif case == "truncated-last":  # a checkpoint_last.pt cut short (a disk that filled up)
        save.mkdir()
        bad = save / "checkpoint_last.pt"
        shutil.copy(_damaged_checkpoint(recipe["checkpoint"], tmp_path, "truncated"), bad)
    else:
        data, bad = _damaged_data(recipe, tmp_path, case)
    proc = _train(str(data / "bin"), save, *flags)
    line = _one_error_line(proc.returncode, proc.stdout + proc.stderr, bad)
    assert TRAIN_CASES[case] in line, line
    written = sorted(p.name for p in save.iterdir()) if save.exists() else []
    assert not [name for name in written if name.endswith(".pt") and name != "checkpoint_last.pt"], written


# ------------------------------------- the same checks in-process, every variant

@pytest.mark.parametrize("case,problem", [("truncated", "truncated or corrupt"), ("corrupt", "corrupt"),
                                          ("empty", "empty file"), ("not-a-checkpoint", "not a fairseq checkpoint")])
def test_read_checkpoint_names_the_file_and_the_problem(recipe, tmp_path, case, problem):
    from fairseq import checkpoint_utils

    if case == "not-a-checkpoint":
        bad = tmp_path / "tensor.pt"
        torch.save({"weights": torch.zeros(3)}, bad)
    else:
        bad = _damaged_checkpoint(recipe["checkpoint"], tmp_path, case)
    with pytest.raises(file_checks.BadFile) as err:
        file_checks.read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, str(bad))
    assert str(err.value).startswith(f"{bad}: ") and problem in str(err.value), str(err.value)
    state = file_checks.read_checkpoint(checkpoint_utils.load_checkpoint_to_cpu, str(recipe["checkpoint"]))
    assert "encoder.layers.0.self_attn.hybrid_logit" in state["model"]  # a good file still loads


@pytest.mark.parametrize("case,problem", [("empty-idx", "empty file"), ("truncated-idx", "truncated or corrupt"),
                                          ("truncated-bin", "truncated"), ("empty-bin", "truncated")])
def test_check_indexed_dataset_names_the_file_and_the_problem(recipe, tmp_path, case, problem):
    prefix = tmp_path / "data" / "bin" / "valid.article-title.article"
    shutil.copytree(recipe["data"], tmp_path / "data")
    file_checks.check_indexed_dataset(str(prefix))  # intact: no complaint
    ext = ".idx" if "idx" in case else ".bin"
    bad = prefix.parent / (prefix.name + ext)
    content = bad.read_bytes()
    bad.write_bytes(b"" if case.startswith("empty") else content[: len(content) // 2 + 1])
    with pytest.raises(file_checks.BadFile) as err:
        file_checks.check_indexed_dataset(str(prefix))
    assert str(err.value).startswith(f"{bad}: ") and problem in str(err.value), str(err.value)


@pytest.mark.parametrize("content,problem", [("", "empty dictionary"), ("w1 5\nw2\n", "not a fairseq dictionary")])
def test_read_dictionary_names_the_file_and_the_problem(tmp_path, content, problem):
    from fairseq.data import Dictionary

    bad = tmp_path / "dict.article.txt"
    bad.write_text(content)
    with pytest.raises(file_checks.BadFile) as err:
        file_checks.read_dictionary(Dictionary.load, str(bad))
    assert str(err.value).startswith(f"{bad}: ") and problem in str(err.value), str(err.value)


# ----------------------------------------------------------- analysis scripts

@pytest.mark.parametrize("case", ["truncated", "corrupt", "empty", "other-arch", "truncated-bin"])
def test_explaining_away_reports_a_bad_file_in_one_line(recipe, tmp_path, capsys, case):
    data, checkpoint = recipe["data"], recipe["checkpoint"]
    if case == "truncated-bin":
        data, bad = _damaged_data(recipe, tmp_path, case)
    else:
        checkpoint = bad = _checkpoint(case, recipe, tmp_path)
    out = tmp_path / "analysis"
    status = explaining_away.main(["--path", str(checkpoint), "--data", str(data / "bin"),
                                   "--out", str(out), "--max-sentences", "4", "--cpu"])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, bad)
    assert not out.exists()


@pytest.mark.parametrize("case", ["truncated", "corrupt", "empty", "not-hnas"])
def test_plot_hybrid_weights_reports_a_bad_file_in_one_line(recipe, tmp_path, capsys, case):
    good_hnas = recipe["checkpoint"]  # an HNAS checkpoint: the first file is fine
    if case == "not-hnas":
        bad = recipe["other_arch"]  # a DNAS model
    else:
        bad = _damaged_checkpoint(good_hnas, tmp_path, case)
    out = tmp_path / "u.png"
    status = plot_hybrid_weights.main([str(good_hnas), str(bad), "--out", str(out), "--csv", str(tmp_path / "u.csv")])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, bad)
    assert not out.exists() and not (tmp_path / "u.csv").exists()


# ----------------------------------------------- text and results readers

def _lines(path, n, text="a headline"):
    path.write_text("".join(f"{text} {i}\n" for i in range(n)))
    return path


@pytest.mark.parametrize("case", ["empty-hyp", "truncated-ref", "corrupt-ref", "missing-ref"])
def test_rouge_eval_reports_a_bad_file_in_one_line(tmp_path, capsys, case):
    hyp, ref = _lines(tmp_path / "h.txt", 5), _lines(tmp_path / "r.txt", 5)
    bad = {"empty-hyp": hyp, "truncated-ref": ref, "corrupt-ref": ref, "missing-ref": tmp_path / "nope"}[case]
    if case == "empty-hyp":
        hyp.write_text("")
    elif case == "truncated-ref":
        _lines(ref, 3)
    elif case == "corrupt-ref":
        ref.write_bytes(b"a headline\n\xff\xfe\x00 broken\n" * 2 + b"x\n")
    out = tmp_path / "rouge.json"
    status = rouge_eval.main(["--hyp", str(hyp), "--ref", str(bad if case == "missing-ref" else ref),
                              "--json-out", str(out), "--bootstrap", "10"])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, bad)
    assert not out.exists()


def _rouge_result(tmp_path, name, sentences, ref="test.title", label="transformer"):
    hyp, refs = _lines(tmp_path / f"{name}.hyp", sentences), _lines(tmp_path / ref, sentences, "the headline")
    assert rouge_eval.main(["--hyp", str(hyp), "--ref", str(refs), "--label", label, "--bootstrap", "10",
                            "--json-out", str(tmp_path / f"{name}.json")]) == 0
    return tmp_path / f"{name}.json"


@pytest.mark.parametrize("case", ["other-run", "truncated", "not-a-result"])
def test_seed_table_reports_a_bad_results_file_in_one_line(tmp_path, capsys, case):
    good = [_rouge_result(tmp_path, f"seed{i}", 6) for i in (1, 2)]
    if case == "other-run":  # scored on another (500-pair quickstart-like) test set
        (tmp_path / "other").mkdir()
        bad = _rouge_result(tmp_path / "other", "seed3", 4)
    elif case == "truncated":
        bad = tmp_path / "seed3.json"
        bad.write_text(good[0].read_text()[:150])
    else:  # another tool's JSON (explaining_away's summary)
        bad = tmp_path / "summary.json"
        bad.write_text(json.dumps({"data": "bin", "subset": "valid", "rows": []}))
    capsys.readouterr()
    status = seed_table.main([*map(str, good), str(bad)])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, bad)
    assert captured.out == ""  # no table at all


@pytest.mark.parametrize("case", ["truncated-log", "empty-sources"])
def test_collect_hypotheses_reports_a_bad_file_in_one_line(tmp_path, capsys, case):
    sources = _lines(tmp_path / "src.txt", 4)
    log = tmp_path / "gen.log"
    log.write_text("".join(f"H-{i}\t-0.5\t\u2581w{i}\n" for i in range(4)))
    if case == "truncated-log":
        log.write_text(log.read_text()[:20])
        bad = log
    else:
        sources.write_text("")
        bad = sources
    out = tmp_path / "out.hyp"
    status = collect_hypotheses.main(["--generate-log", str(log), "--sources", str(sources), "--out", str(out)])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, bad)
    assert not out.exists()


@pytest.mark.parametrize("case", ["empty", "corrupt"])
def test_lead_baseline_reports_a_bad_file_in_one_line(tmp_path, capsys, case):
    articles = tmp_path / "articles.txt"
    articles.write_bytes(b"" if case == "empty" else b"an article\n\xff\xfe broken\n")
    status = lead_baseline.main(["--input", str(articles)])
    captured = capsys.readouterr()
    _one_error_line(status, captured.out + captured.err, articles)
    assert captured.out == ""
