"""The analysis scripts on encoder-only RoBERTa checkpoints (roberta,
roberta_dnas, roberta_hnas; --task masked_lm and sentence_prediction):
fairseq_dnas/commands/plot_hybrid_weights.py reads u per layer and head, and
fairseq_dnas/commands/explaining_away.py measures sum_i pi_ij of the encoder self-attention
on held-out text fed as '<s> sentence </s>' (Definition 1, Theorem 2).

The checkpoints are fairseq-train's own (a few updates on a tiny synthetic
corpus, all run in one Python process to pay fairseq's import once), then
edited in place: the queries sharpened (so that UNAS explains keys away and
Theorem 2's bound is not met trivially) and u set to a different value per
layer and head."""

import csv
import json
import os
import random
import sys

import numpy as np
import pytest
import torch
from helpers import ROOT, USER_DIR, WORDS, run
from fairseq_dnas.reference import reference_probs

from fairseq_dnas.commands import explaining_away, plot_hybrid_weights

import fairseq_dnas.plugin  # noqa: E402,F401  (fairseq checkpoint loading under torch >= 2.6)

HEADS, LAYERS, MAX_POSITIONS = 4, 2, 32
# Scales of q_proj / k_proj: scores 4,000 times those of the trained model,
# peaked attention (UNAS then explains 20-25 % of the keys away).
SHARPEN_Q, SHARPEN_K = 400.0, 10.0
# u per (layer, head) written into the HNAS checkpoints: sigmoid of these logits
LOGITS = [[-1.5, -0.5, 0.25, 1.0], [0.5, -1.0, 1.5, -0.25]]
VALID_LONG = 2  # held-out sentences longer than MAX_POSITIONS - 2 words: skipped

TINY = ["--encoder-layers", str(LAYERS), "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", str(HEADS), "--max-positions", str(MAX_POSITIONS)]
TRAIN = ["--user-dir", USER_DIR, *TINY, "--cpu", "--optimizer", "adam", "--lr", "3e-3", "--batch-size", "8",
         "--max-update", "3", "--disable-validation", "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
         "--dropout", "0.1", "--attention-dropout", "0.1"]

# fairseq-preprocess and fairseq-train, several runs in one process.
_RUNNER = r"""
import json, sys
import fairseq_dnas.plugin  # noqa: F401
from fairseq_cli import preprocess, train

for tool, argv in json.loads(sys.argv[1]):
    sys.argv = ["fairseq-" + tool, *argv]
    {"preprocess": preprocess, "train": train}[tool].cli_main()
"""


def _sentences(n, rng, lengths=(3, 20)):
    return [" ".join(rng.choice(WORDS[:30]) for _ in range(rng.randint(*lengths))) for _ in range(n)]


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))


def _edit_checkpoint(path, hnas):
    """Sharpen the queries of every encoder layer; set u (HNAS)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    model = state["model"]
    for layer in range(LAYERS):
        prefix = f"encoder.sentence_encoder.layers.{layer}.self_attn."
        model[prefix + "q_proj.weight"] = model[prefix + "q_proj.weight"] * SHARPEN_Q
        model[prefix + "k_proj.weight"] = model[prefix + "k_proj.weight"] * SHARPEN_K
        if hnas:
            model[prefix + "hybrid_logit"] = torch.tensor(LOGITS[layer])
    torch.save(state, path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("roberta_analysis")
    rng = random.Random(0)
    text = root / "text"
    text.mkdir()
    train = _sentences(160, rng)
    valid = _sentences(22, rng) + _sentences(VALID_LONG, rng, (40, 45))
    rng.shuffle(valid)
    _write(text / "train.txt", train)
    _write(text / "valid.txt", valid)
    _write(text / "empty.txt", [])
    _write(text / "train.label", [str(rng.randint(0, 1)) for _ in train])
    _write(text / "valid.label", [str(rng.randint(0, 1)) for _ in valid])
    mlm, sp = root / "bin" / "pretrain", root / "bin" / "sst"
    commands = [
        ("preprocess", ["--only-source", "--trainpref", text / "train.txt", "--validpref", text / "valid.txt",
                        "--testpref", text / "empty.txt", "--destdir", mlm, "--workers", "1"]),
        ("preprocess", ["--only-source", "--srcdict", mlm / "dict.txt", "--trainpref", text / "train.txt",
                        "--validpref", text / "valid.txt", "--destdir", sp / "input0", "--workers", "1"]),
        ("preprocess", ["--only-source", "--trainpref", text / "train.label", "--validpref",
                        text / "valid.label", "--destdir", sp / "label", "--workers", "1"]),
    ]
    ckpt = {}
    for name, arch, extra in [("unas", "roberta", []), ("dnas", "roberta_dnas", []),
                              ("hnas", "roberta_hnas", ["--hybrid-init", "0.3"])]:
        save = root / name
        commands.append(("train", [mlm, "--task", "masked_lm", "--criterion", "masked_lm", "--arch", arch,
                                   "--tokens-per-sample", str(MAX_POSITIONS), "--sample-break-mode", "none",
                                   *TRAIN, *extra, "--save-dir", save]))
        ckpt[name] = save / "checkpoint_last.pt"
    save = root / "hnas_sst"
    commands.append(("train", [sp, "--task", "sentence_prediction", "--criterion", "sentence_prediction",
                               "--num-classes", "2", "--init-token", "0", "--separator-token", "2",
                               "--arch", "roberta_hnas", *TRAIN, "--save-dir", save]))
    ckpt["hnas_sst"] = save / "checkpoint_last.pt"
    proc = run([sys.executable, "-c", _RUNNER, json.dumps([(t, [str(a) for a in argv]) for t, argv in commands])])
    for name, path in ckpt.items():
        assert path.exists(), (proc.stdout + proc.stderr)[-3000:]
        _edit_checkpoint(path, hnas=name.startswith("hnas"))
    for f in os.listdir(mlm):  # fairseq names the --testpref split 'test'
        if f.startswith("test."):
            os.rename(mlm / f, mlm / f.replace("test.", "empty.", 1))
    return {"root": root, "text": text, "mlm": mlm, "sp": sp, "ckpt": ckpt, "valid": valid}



def _stored_u(path):
    """sigmoid of the hybrid logits as saved, (layers, heads), read with torch alone."""
    model = torch.load(path, map_location="cpu", weights_only=False)["model"]
    return [torch.sigmoid(model[f"encoder.sentence_encoder.layers.{layer}.self_attn.hybrid_logit"]).tolist()
            for layer in range(LAYERS)]


def _kept(valid):
    """Lengths as fed ('<s> words </s>') of the held-out sentences that fit."""
    lengths = [len(line.split()) + 2 for line in valid]
    return [n for n in lengths if n <= MAX_POSITIONS]


def _rows(out):
    with open(out / "summary.csv") as f:
        return list(csv.DictReader(f))


def _one_error_line(status, captured, *needles):
    text = captured.out + captured.err
    assert status == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# --- plot_hybrid_weights.py ---------------------------------------------------


def test_u_per_layer_and_head_is_sigmoid_of_the_stored_logits(tiny, tmp_path, capsys):
    from fairseq_dnas.loading import read_hybrid_weights

    paths = [tiny["ckpt"]["hnas"], tiny["ckpt"]["hnas_sst"]]  # masked_lm and sentence_prediction
    for path in paths:
        w = read_hybrid_weights(str(path))
        np.testing.assert_allclose(w.layers, _stored_u(path), atol=1e-7, rtol=0)
        np.testing.assert_allclose(w.layers, torch.sigmoid(torch.tensor(LOGITS)).numpy(), atol=1e-6, rtol=0)
        assert w.num_updates == 3 and w.arch == "roberta_hnas" and w.per == "head"
        assert w.hybrid_init == (0.3 if path == tiny["ckpt"]["hnas"] else 0.5)  # as trained
    out, table = tmp_path / "u.png", tmp_path / "u.csv"
    status = plot_hybrid_weights.main([*map(str, paths), "--labels", "mlm", "sst", "--out", str(out),
                                       "--csv", str(table)])
    assert status == 0
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * LAYERS * HEADS
    u = _stored_u(paths[0])
    for r in rows:
        assert float(r["u"]) == pytest.approx(u[int(r["layer"]) - 1][int(r["head"]) - 1], abs=1e-6)
    printed = capsys.readouterr().out
    assert f"{np.mean(u[0]):.4f} [{min(u[0]):.4f}, {max(u[0]):.4f}]" in printed


@pytest.mark.parametrize("name, scheme", [("unas", "unas"), ("dnas", "dnas")])
def test_roberta_without_hybrid_weights_is_refused(tiny, tmp_path, capsys, name, scheme):
    out = tmp_path / "u.png"
    status = plot_hybrid_weights.main([str(tiny["ckpt"][name]), "--out", str(out)])
    _one_error_line(status, capsys.readouterr(), "no hybrid weights", f"encoder scheme {scheme}",
                    "--arch roberta_hnas", str(tiny["ckpt"][name]))
    assert not out.exists()


# --- explaining_away.py: capture on a RoBERTa encoder ---------------------------


@pytest.mark.parametrize("name", ["unas", "dnas", "hnas"])
def test_captured_column_sums_match_the_float64_reference(tiny, name):
    """Right-padded '<s> sentence </s>' batches through the checkpoint's
    encoder: per-head probabilities and column sums over the real queries
    against Algorithm 1 in float64; the recorder counts the real keys only."""
    from fairseq_dnas.analysis.capture import attention_sites, call_kwargs, head_probs
    from fairseq_dnas.loading import load_model
    from fairseq_dnas.analysis.column_sums import column_sums
    from fairseq_dnas.analysis.explaining_away import ColumnSumRecorder, load_split

    model, _, task = load_model(str(tiny["ckpt"][name]), str(tiny["mlm"]))
    dataset = load_split(task, "valid", str(tiny["mlm"]))
    fits = [i for i in range(len(dataset)) if dataset.src_sizes[i] <= MAX_POSITIONS]
    batch = dataset.collater([dataset[i] for i in fits[:5]])["net_input"]["src_tokens"]
    bos, pad, eos = task.source_dictionary.bos(), task.source_dictionary.pad(), task.source_dictionary.eos()
    real = batch.ne(pad)
    assert (batch[:, 0] == bos).all() and real.sum(1).unique().numel() > 1  # padded on the right
    assert (batch[torch.arange(len(batch)), real.sum(1) - 1] == eos).all()
    calls, handles = [], []
    for site in attention_sites(model):
        def hook(module, args, kwargs, output, site=site):
            calls.append((site, call_kwargs(args, kwargs)))
        handles.append(site.module.register_forward_hook(hook, with_kwargs=True))
    with ColumnSumRecorder(model) as rec, torch.no_grad():
        model(batch, features_only=True)
    for h in handles:
        h.remove()
    assert [c[0].layer for c in calls] == list(range(LAYERS)) and {c[0].kind for c in calls} == {"encoder_self"}
    pad_mask = ~real
    for site, kwargs in calls:
        m = site.module
        _, probs = head_probs(m, kwargs)
        x = kwargs["query"].double()
        t, b, _ = x.shape

        def proj(lin):  # (T, B, C) -> (B, H, T, D)
            y = x @ lin.weight.double().T + lin.bias.double()
            return y.view(t, b, m.num_heads, m.head_dim).permute(1, 2, 0, 3)

        scores = (proj(m.q_proj) * m.scaling) @ proj(m.k_proj).transpose(-1, -2)
        u = getattr(m, "hybrid_weight", None)
        ref = reference_probs(scores, site.scheme, pad_mask, pad_mask, None if u is None else u.double(),
                              getattr(m, "sinkhorn_iters", 1))
        live = real[:, None, :, None] & real[:, None, None, :]
        # float32 scores of the sharpened model reach ~250, where float32
        # rounding alone moves a score by ~1e-5: tolerance in proportion.
        tol = 2e-6 + 2e-7 * scores.abs().max().item()
        torch.testing.assert_close(probs.transpose(0, 1).double() * live, ref, atol=tol, rtol=0)
        sums, _ = column_sums(probs, pad_mask, pad_mask)
        ref_sums = ref.sum(dim=2).transpose(0, 1)[:, real].numpy()  # (H, real keys)
        np.testing.assert_allclose(sums, ref_sums, atol=tol * t, rtol=0)
        stats = rec.stats[("encoder_self", site.layer, "mixture" if site.scheme == "hnas" else site.scheme)]
        assert stats.n.tolist() == [int(real.sum())] * HEADS
        ref_scaled = ref_sums * real.sum(1).repeat_interleave(real.sum(1)).numpy()[None, :]
        np.testing.assert_allclose(stats.min_scaled, ref_scaled.min(axis=1), atol=tol * t * t, rtol=0)


# --- explaining_away.py end to end ---------------------------------------------


def test_script_compares_roberta_unas_dnas_hnas(tiny, tmp_path, capsys):
    out = tmp_path / "ea"
    ckpt = tiny["ckpt"]
    status = explaining_away.main(["--path", str(ckpt["unas"]), str(ckpt["dnas"]), str(ckpt["hnas"]),
                                   "--labels", "U", "D", "H", "--data", str(tiny["mlm"]), "--subset", "valid",
                                   "--out", str(out), "--batch-size", "7", "--cpu"])
    captured = capsys.readouterr()
    assert status == 0, captured.err[-3000:]
    assert captured.err.count("inputs: '<s> sentence </s>' per line of") == 3
    assert captured.err.count(f"skipped {VALID_LONG} sentences longer than the model's maximum positions") == 3
    with open(out / "encoder_self.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not (out / "decoder_cross.png").exists() and not (out / "decoder_self.png").exists()
    rows = _rows(out)
    assert {r["attention"] for r in rows} == {"encoder_self"}
    assert [(r["model"], r["layer"], r["component"]) for r in rows] == [
        *[("U", str(layer), "unas") for layer in range(LAYERS)],
        *[("D", str(layer), "dnas") for layer in range(LAYERS)],
        *[("H", str(layer), comp) for layer in range(LAYERS) for comp in ("mixture", "dnas", "unas")]]
    keys = HEADS * sum(_kept(tiny["valid"]))  # every real position of every fitting sentence, per head
    assert all(int(r["keys"]) == keys for r in rows)
    u = _stored_u(ckpt["hnas"])
    for r in rows:
        low = float(r["min_T_times_sum"])
        if r["component"] == "dnas":
            assert low >= 1 - 1e-5  # Theorem 2: T * sum_i pi_ij >= 1
            assert int(r["explained_away"]) == 0
        elif r["component"] == "mixture":
            layer_u = u[int(r["layer"])]
            assert [float(x) for x in r["hybrid_u_per_head"].split()] == pytest.approx(layer_u, abs=1e-4)
            assert min(layer_u) - 1e-5 <= low < 1  # >= u (Eq. 12 is linear), not DNAS's 1
        else:  # UNAS: no bound; on this peaked attention keys are explained away
            assert low < 1e-3 and float(r["fraction_explained_away"]) > 0.05
            assert (r["hybrid_u_mean"] == "") == (r["model"] == "U")
    with open(out / "histograms.csv") as f:
        hist = list(csv.DictReader(f))
    for r in rows:
        n = sum(int(h["count"]) for h in hist if h["model"] == r["model"] and int(h["layer"]) == int(r["layer"]) + 1
                and h["component"] == r["component"])
        assert n == keys
    summary = json.loads((out / "summary.json").read_text())
    kept = len(_kept(tiny["valid"]))
    assert [(m["sentences"], m["skipped_too_long"]) for m in summary["models"]] == [(kept, VALID_LONG)] * 3
    assert all("'<s> sentence </s>'" in m["inputs"] and "skipped, not truncated" in m["inputs"]
               for m in summary["models"])


def test_sentence_prediction_folder_and_checkpoint(tiny, tmp_path, capsys):
    """A masked_lm checkpoint reads a sentence_prediction folder's input0/
    (the same sentences: the same sums); a sentence_prediction checkpoint
    reads its own folder, with its --init-token 0 (<s>) first."""
    ckpt = tiny["ckpt"]
    runs = {}
    for name, path, data in [("mlm", ckpt["hnas"], tiny["mlm"]), ("input0", ckpt["hnas"], tiny["sp"]),
                             ("sst", ckpt["hnas_sst"], tiny["sp"])]:
        out = tmp_path / name
        status = explaining_away.main(["--path", str(path), "--data", str(data), "--out", str(out), "--cpu",
                                       "--max-sentences", "12"])
        assert status == 0, capsys.readouterr().err[-3000:]
        runs[name] = _rows(out)
    err = capsys.readouterr().err
    assert f"per line of {tiny['sp'] / 'input0'}" in err
    assert runs["mlm"] == runs["input0"]
    sst = {(r["layer"], r["component"]): r for r in runs["sst"]}
    assert int(sst[("0", "mixture")]["keys"]) == int(runs["mlm"][0]["keys"])
    assert float(sst[("0", "dnas")]["min_T_times_sum"]) >= 1 - 1e-5
    assert float(sst[("0", "mixture")]["min_T_times_sum"]) >= min(_stored_u(ckpt["hnas_sst"])[0]) - 1e-5


def _translation_checkpoint(path):
    """A transformer_dnas checkpoint of the translation task, in the layout fairseq-train writes."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from helpers import build_model, tiny_args
    from omegaconf import OmegaConf

    args = tiny_args("transformer_dnas")
    state = {"cfg": OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True),
             "model": build_model("transformer_dnas", args=args).state_dict(), "extra_state": {},
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {}, "num_updates": 1}]}
    checkpoint_utils.torch_persistent_save(state, str(path))
    return path


@pytest.mark.parametrize("case", ["missing_split", "empty_split", "translation_data", "mlm_data_for_sst",
                                  "mlm_data_for_translation"])
def test_script_bad_input(case, tiny, tmp_path, capsys):
    ckpt, mlm = tiny["ckpt"], tiny["mlm"]
    translation = tmp_path / "translation"  # what fairseq-preprocess -s src -t tgt leaves
    translation.mkdir()
    for lang in ("src", "tgt"):
        (translation / f"dict.{lang}.txt").write_text((mlm / "dict.txt").read_text())
    path, data, extra = {
        "missing_split": (ckpt["dnas"], mlm, ["--subset", "nosuch"]),
        "empty_split": (ckpt["dnas"], mlm, ["--subset", "empty"]),
        "translation_data": (ckpt["hnas"], translation, []),
        "mlm_data_for_sst": (ckpt["hnas_sst"], mlm, []),
        "mlm_data_for_translation": (None, mlm, []),
    }[case]
    if path is None:
        path = _translation_checkpoint(tmp_path / "translation.pt")
    needles = {
        "missing_split": [f"split 'nosuch' not found in {mlm}", "splits found: empty, train, valid"],
        "empty_split": ["split 'empty'", "is empty (0 sentences)"],
        "translation_data": ["holds translation data", "masked_lm checkpoint",
                             "give the fairseq-preprocess --only-source folder (dict.txt"],
        "mlm_data_for_sst": ["holds masked-LM data", "sentence_prediction checkpoint",
                             "give its fine-tuning data folder (input0/dict.txt, label/dict.txt"],
        "mlm_data_for_translation": ["holds masked-LM data", "translation checkpoint",
                                     "give its fairseq-preprocess folder (dict.<src>.txt, dict.<tgt>.txt)"],
    }[case]
    out = tmp_path / "ea"
    status = explaining_away.main(["--path", str(path), "--data", str(data), "--out", str(out), "--cpu", *extra])
    _one_error_line(status, capsys.readouterr(), *needles)
    assert not out.exists()  # nothing half-written
