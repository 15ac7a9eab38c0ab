"""The HNAS weight u = sigmoid(logit), one per head or per layer: its
initialization, shared by the fairseq module and ``fairseq_dnas.nn`` (no fairseq here)."""

import math

import torch
from torch import nn

HYBRID_PER = ("head", "layer")


def exact_logit(u: float) -> float:
    """The float32 logit whose float32 sigmoid is closest to u (exactly u when
    float32 allows it, e.g. the paper's 0.1 and 0.5).

    ``log(u / (1 - u))`` rounded to float32 can miss by a step; look at the
    neighbouring float32 values so the hybrid weight starts at the flag's value.
    """
    target = torch.tensor(u, dtype=torch.float64)
    x = torch.tensor(math.log(u / (1.0 - u)), dtype=torch.float32)
    candidates = [x]
    for direction in (math.inf, -math.inf):
        y = x
        for _ in range(8):
            y = torch.nextafter(y, torch.tensor(direction))
            candidates.append(y)
    errors = [abs(torch.sigmoid(c).double().item() - target.item()) for c in candidates]
    return candidates[errors.index(min(errors))].item()


def check_hybrid_init(hybrid_init, name="--hybrid-init", fixed="--encoder-attention-scheme unas or dnas") -> None:
    """The initial HNAS weight must lie strictly inside (0, 1).

    u = sigmoid(logit) reaches 0 or 1 only at an infinite logit, which
    would never train; a fixed u of 0 or 1 is simply UNAS or DNAS.
    """
    try:
        ok = 0.0 < float(hybrid_init) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(
            f"{name} must lie in (0, 1) (paper: 0.1 for Gigaword, 0.5 "
            f"elsewhere); got {hybrid_init!r}. For a fixed weight of 0 or 1 use "
            f"{fixed} instead."
        )


def hybrid_logit(num_heads: int, hybrid_init, hybrid_per: str, name="--hybrid-init",
                 fixed="--encoder-attention-scheme unas or dnas", device=None) -> nn.Parameter:
    """The trainable logit of u, (H,) for 'head' or (1,) for 'layer', at
    hybrid_init; u = sigmoid(logit) stays in [0, 1] whatever the optimizer does."""
    check_hybrid_init(hybrid_init, name, fixed)
    if hybrid_per not in HYBRID_PER:
        raise ValueError(f"hybrid_per must be one of {HYBRID_PER}; got {hybrid_per!r}")
    n = num_heads if hybrid_per == "head" else 1
    return nn.Parameter(torch.full((n,), exact_logit(hybrid_init), device=device))
