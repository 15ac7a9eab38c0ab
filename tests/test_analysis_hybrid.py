"""HNAS weights: logged during training (log, TensorBoard) and plotted from
checkpoints by fairseq_dnas/commands/plot_hybrid_weights.py."""

import csv
import json
import os
import re

import pytest
import torch
import fairseq_dnas.plugin  # noqa: F401  (fairseq checkpoint loading under torch >= 2.6)
from analysis_fixtures import HYBRID_INIT, tiny_runs
from helpers import ROOT, run

COMMAND = ["-m", "fairseq_dnas.commands.plot_hybrid_weights"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return tiny_runs(tmp_path_factory)


def _json_records(log, tag):
    """The JSON stats fairseq printed with --log-format json under ``tag``
    ('... | train_inner | {...}' or 'INFO:train_inner:{...}')."""
    out = []
    for line in log.splitlines():
        m = re.search(rf"(?:\| |INFO:){tag}[ |:]+(\{{.*\}})\s*$", line)
        if m:
            out.append(json.loads(m.group(1)))
    return out


def _load(path):
    from fairseq import checkpoint_utils

    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    return models[0]


def _num_updates(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))["optimizer_history"][-1]["num_updates"]


def test_training_log_has_u_per_encoder_layer(runs):
    records = _json_records(runs["hnas"]["log"], "train_inner")
    total = _num_updates(runs["hnas"]["dir"] / "checkpoint_last.pt")
    assert [int(r["num_updates"]) for r in records] == list(range(1, total + 1))
    layers = sorted(k for k in records[0] if k.startswith("hnas_u_"))
    assert layers == ["hnas_u_L00", "hnas_u_L01"]  # TINY has 2 encoder layers
    # Update 1 trains with the initial u.
    assert all(float(records[0][k]) == HYBRID_INIT for k in layers)
    # The logged u is the one behind the loss of that update: u after the
    # previous update, i.e. the u saved after epoch 1 (update n) is what
    # update n + 1 logs (mean over heads, rounded to 4 digits).
    first = runs["hnas"]["dir"] / "checkpoint1.pt"
    n = _num_updates(first)
    assert 1 < n < total
    means = [sum(u) / len(u) for u in _load(first).hybrid_weights()]
    logged = [float(records[n][k]) for k in layers]  # records[n]: update n + 1
    assert logged == pytest.approx(means, abs=5e-5)
    assert any(abs(m - HYBRID_INIT) > 1e-4 for m in means)  # u trains
    # The end-of-epoch lines carry it too (the JSON format prefixes 'train_').
    epochs = _json_records(runs["hnas"]["log"], "train")
    assert len(epochs) == 3 and all(0 < float(r["train_hnas_u_L00"]) < 1 for r in epochs)


def test_no_hybrid_metrics_without_hnas(runs):
    for name in ("unas", "dnas"):
        assert "hnas_u" not in runs[name]["log"]


def test_tensorboard_receives_u(runs):
    records = runs["hnas"]["tb"]
    inner = [r for r in records if r["key"] == "hnas_u_L01" and r["logdir"].endswith("train_inner")]
    total = _num_updates(runs["hnas"]["dir"] / "checkpoint_last.pt")
    assert [r["step"] for r in inner] == list(range(1, total + 1))
    assert inner[0]["value"] == pytest.approx(HYBRID_INIT, abs=1e-6)
    assert all(0.0 < r["value"] < 1.0 for r in inner)
    logged = [float(r["hnas_u_L01"]) for r in _json_records(runs["hnas"]["log"], "train_inner")]
    assert [r["value"] for r in inner] == pytest.approx(logged, abs=1e-9)


def test_plot_several_checkpoints(runs, tmp_path):
    ckpts = [runs["hnas"]["dir"] / f"checkpoint{epoch}.pt" for epoch in (1, 2, 3)]
    out, table = tmp_path / "u.png", tmp_path / "u.csv"
    proc = run(["python", *COMMAND, *ckpts, "--out", out, "--csv", table])
    with open(out, "rb") as f:
        assert f.read(8) == PNG_MAGIC
    # The printed table: one row per layer, "mean [min, max]" per checkpoint,
    # equal to the loaded model's u.
    rows = [line for line in proc.stdout.splitlines() if re.match(r"\s+\d+\s+\d\.\d{4} \[", line)]
    assert len(rows) == 2
    for i, path in enumerate(ckpts):
        u = torch.tensor(_load(path).hybrid_weights())  # (layers, heads)
        for layer, line in enumerate(rows):
            mean, lo, hi = [float(x) for x in re.findall(r"(\d\.\d{4}) \[(\d\.\d{4}), (\d\.\d{4})\]", line)[i]]
            assert mean == pytest.approx(u[layer].mean().item(), abs=5e-5)
            assert (lo, hi) == pytest.approx((u[layer].min().item(), u[layer].max().item()), abs=5e-5)
    with open(table) as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 3 * 2 * 4  # checkpoints x layers x heads
    assert [int(r["num_updates"]) for r in csv_rows[::8]] == [_num_updates(p) for p in ckpts]


@pytest.mark.parametrize("name, scheme", [("unas", "unas"), ("dnas", "dnas")])
def test_checkpoint_without_hybrid_weights_is_refused(runs, tmp_path, name, scheme):
    out = tmp_path / "u.png"
    proc = run(["python", *COMMAND, runs[name]["dir"] / "checkpoint_last.pt", "--out", out], check=False)
    assert proc.returncode == 1
    assert "no hybrid weights" in proc.stderr and f"encoder scheme {scheme}" in proc.stderr
    assert "transformer_hnas" in proc.stderr  # says what to do
    assert not out.exists()


def test_missing_checkpoint_and_bad_labels(runs, tmp_path):
    out = tmp_path / "u.png"
    proc = run(["python", *COMMAND, tmp_path / "nope.pt", "--out", out], check=False)
    assert proc.returncode == 1 and "checkpoint not found" in proc.stderr and not out.exists()
    last = runs["hnas"]["dir"] / "checkpoint_last.pt"
    proc = run(["python", *COMMAND, last, "--out", out, "--labels", "a", "b"], check=False)
    assert proc.returncode == 2 and "one label per checkpoint" in proc.stderr


def test_one_weight_per_layer_is_shown_for_every_head(tmp_path):
    """--hybrid-weight-per layer: one u per layer, reported for each head."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from helpers import build_model, tiny_args
    from omegaconf import OmegaConf

    from fairseq_dnas.loading import read_hybrid_weights

    args = tiny_args("transformer_hnas", ["--hybrid-weight-per", "layer", "--hybrid-init", "0.2"])
    model = build_model("transformer_hnas", args=args)
    with torch.no_grad():
        model.encoder.attention_modules()[1].hybrid_logit.fill_(1.0)
    # The layout fairseq's trainer writes.
    state = {"cfg": OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True),
             "model": model.state_dict(), "extra_state": {},
             "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam",
                                    "lr_scheduler_state": {}, "num_updates": 7}]}
    path = str(tmp_path / "layer.pt")
    checkpoint_utils.torch_persistent_save(state, path)
    w = read_hybrid_weights(path)
    assert w.per == "layer" and w.num_updates == 7 and w.hybrid_init == 0.2
    assert w.layers[0] == pytest.approx([0.2] * 4) and w.layers[1] == pytest.approx([torch.sigmoid(torch.tensor(1.0)).item()] * 4)
