"""HNAS weights u (Eq. 12: pi = u * pi_D + (1 - u) * pi_U) read from checkpoints.

Reads the saved parameters directly, so it needs neither the training data
nor the dictionaries, only the checkpoint's state; reading the file is
``fairseq_dnas.loading.read_hybrid_weights``.
"""

import os
import re
from dataclasses import dataclass
from typing import List, Optional

import torch

# encoder.layers.<l>.self_attn.hybrid_logit, as DNASMultiheadAttention names it
# (transformer_hnas); roberta_hnas keeps the same encoder inside its
# RobertaEncoder: encoder.sentence_encoder.layers.<l>.self_attn.hybrid_logit.
_HYBRID_KEY = re.compile(r"^encoder\.(?:sentence_encoder\.)?layers\.(\d+)\.self_attn\.hybrid_logit$")
_ROBERTA_KEY = "encoder.sentence_encoder."


class NoHybridWeights(ValueError):
    """The checkpoint is not an HNAS model."""


@dataclass
class HybridWeights:
    path: str
    layers: List[List[float]]  # u per encoder layer (bottom first) and head
    num_updates: Optional[int] = None
    arch: str = "?"
    hybrid_init: Optional[float] = None
    per: str = "head"

    @property
    def means(self) -> List[float]:
        return [sum(h) / len(h) for h in self.layers]

    def label(self) -> str:
        name = os.path.basename(self.path)
        parent = os.path.basename(os.path.dirname(os.path.abspath(self.path)))
        base = f"{parent}/{name}" if parent else name
        return base if self.num_updates is None else f"{base} (update {self.num_updates})"


def _model_cfg(state):
    cfg = state.get("cfg") or {}
    model = cfg.get("model") if hasattr(cfg, "get") else None
    if model is None and state.get("args") is not None:  # very old checkpoints
        model = state["args"]
    return model


def _get(obj, name, default=None):
    if obj is None:
        return default
    if hasattr(obj, "get") and not isinstance(obj, type):
        try:
            value = obj.get(name, default)
            return default if value is None else value
        except Exception:
            pass
    return getattr(obj, name, default)


def hybrid_weights(state, path: str) -> HybridWeights:
    """u per encoder layer and head of an HNAS checkpoint (``transformer_hnas``
    or ``roberta_hnas``, of any task), from its loaded ``state`` (what
    ``fairseq_dnas.loading.read_state(path)`` returns; ``path`` names it in
    messages).

    Raises NoHybridWeights for any checkpoint without HNAS weights (a plain
    ``transformer`` or ``roberta``, a DNAS or UNAS ``transformer_dnas`` /
    ``roberta_dnas``).
    """
    model_cfg = _model_cfg(state)
    arch = str(_get(model_cfg, "arch", _get(model_cfg, "_name", "?")))
    logits = {}
    for key, value in state["model"].items():
        match = _HYBRID_KEY.match(key)
        if match:
            logits[int(match.group(1))] = value
    if not logits:
        scheme = _get(model_cfg, "encoder_attention_scheme", "unas")
        roberta = any(key.startswith(_ROBERTA_KEY) for key in state["model"])
        hnas = "roberta_hnas (or a roberta_hnas_* preset, or" if roberta else "transformer_hnas (or"
        raise NoHybridWeights(
            f"{path}: no hybrid weights (arch {arch}, encoder scheme {scheme}). Only "
            f"HNAS models have them: train with --arch {hnas} "
            "--encoder-attention-scheme hnas)."
        )
    if sorted(logits) != list(range(len(logits))):
        raise ValueError(f"{path}: hybrid weights of some encoder layers are missing ({sorted(logits)})")
    heads = int(_get(model_cfg, "encoder_attention_heads", 0) or 0)
    layers = []
    for layer in sorted(logits):
        # The same map as DNASMultiheadAttention.hybrid_weight: u = sigmoid(logit).
        u = torch.sigmoid(logits[layer].float())
        if u.numel() == 1 and heads > 1:  # --hybrid-weight-per layer
            u = u.expand(heads)
        layers.append([float(x) for x in u])
    history = state.get("optimizer_history") or [{}]
    return HybridWeights(
        path=path,
        layers=layers,
        num_updates=history[-1].get("num_updates"),
        arch=arch,
        hybrid_init=_get(model_cfg, "hybrid_init"),
        per=str(_get(model_cfg, "hybrid_weight_per", "head")),
    )
