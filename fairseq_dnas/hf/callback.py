"""HNAS weights u of a transformers model: read, logged during Trainer
training, and in the form the plugin's plots take
(``fairseq_dnas.analysis.plots.plot_hybrid_weights``)."""

import json
from typing import List, Optional

import torch
from transformers import TrainerCallback

from fairseq_dnas.analysis.hybrid import HybridWeights, NoHybridWeights


def layer_weights(model) -> List[List[float]]:
    """u per self-attention module (bottom layer first) and head."""
    rows = []
    for name, param in model.named_parameters():
        if name.endswith("hybrid_logit"):
            rows.append(torch.sigmoid(param.detach().float()).tolist())
    return rows


def hybrid_weights(model, label: str = "model", num_updates: Optional[int] = None) -> HybridWeights:
    """The model's u as ``HybridWeights`` (what plot_hybrid_weights draws)."""
    rows = layer_weights(model)
    if not rows:
        raise NoHybridWeights(f"{type(model).__name__} has no HNAS weights: enable(model, scheme='hnas') first")
    settings = getattr(model.config, "dnas", {}) or {}
    return HybridWeights(
        path=label,
        layers=rows,
        num_updates=num_updates,
        arch=getattr(model.config, "model_type", "?"),
        hybrid_init=settings.get("hybrid_init"),
        per="head" if len(rows[0]) > 1 else "layer",
    )


class HybridWeightCallback(TrainerCallback):
    """Adds u per layer (mean over heads) to each Trainer log as ``u/layer<i>``
    (in ``state.log_history``, so in trainer_state.json, and in the logs the
    callbacks after this one see: insert it first,
    ``trainer.callback_handler.callbacks.insert(0, cb)``, for reporters),
    keeps the full (layer x head) history in ``self.history``, and appends it
    to ``path`` (JSON lines) when given."""

    def __init__(self, path: Optional[str] = None):
        self.path = path
        self.history = []

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if model is None:
            return
        rows = layer_weights(model)
        if not rows:
            return
        means = {f"u/layer{i}": round(sum(row) / len(row), 6) for i, row in enumerate(rows)}
        if logs is not None:  # seen by the callbacks after this one (the printer, ...)
            logs.update(means)
        if state.log_history:  # kept in trainer_state.json with the loss
            state.log_history[-1].update(means)
        record = {"step": state.global_step, "u": rows}
        self.history.append(record)
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
