"""The receptive-field penalty of discrete attention (J. Kinley, 2020,
Appendix): the soft receptive fields of relaxed samples and the penalty on
their size, differentiable in the attention logits the samples come from
(``fairseq_dnas.attention.discrete``). The hard fields of argmax attention,
the same recursion on 0/1 values, are analysis
(``fairseq_dnas.analysis.receptive_field``); the formula, and why it is not
the appendix's as printed: docs/math.md, "Receptive fields".

Pure functions on tensors; nothing here imports fairseq.
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

PENALTY_LAYERS = ("final", "all")


def real_positions(padding: Optional[Tensor], batch: int, length: int, device) -> Tensor:
    """(B, T) True at real (not padded) positions."""
    if padding is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    return ~padding.bool()


def soft_receptive_fields(samples: Sequence[Tensor], padding: Optional[Tensor] = None) -> List[Tensor]:
    """[s^1, ..., s^L], each (B, T, T) in [0, 1], differentiable in the samples:

        s^0 = I,   s^l = min(s^{l-1} + Z^l s^{l-1}, 1),   Z^l = sum_h S^{l,h}

    (the appendix's recursion, with z summed over heads). On one-hot samples
    s^l is R^l as 0/1 (sums of 0/1 terms, then min(., 1)). Padded rows and
    columns are 0. samples: (H, B, T, T) per layer, bottom first."""
    first = samples[0]
    batch, length = first.size(1), first.size(2)
    real = real_positions(padding, batch, length, first.device).to(first.dtype)
    mask = real[:, :, None] * real[:, None, :]  # (B, T, T): real query and key
    s = torch.eye(length, dtype=first.dtype, device=first.device) * mask
    fields = []
    for sample in samples:
        z = sample.sum(dim=0) * mask  # Z^l, union over heads as a sum (clamped below)
        s = torch.clamp(s + torch.bmm(z, s), max=1.0)  # s^l = min(s^{l-1} + Z^l s^{l-1}, 1)
        fields.append(s)
    return fields


def receptive_field_penalty(samples: Sequence[Tensor], padding: Optional[Tensor] = None,
                            readers: Optional[Tensor] = None, layers: str = "final") -> Tensor:
    """(B,) per sentence, the mean over the positions the loss reads of the
    soft size of their receptive field after the final layer (the thesis's),
    or with ``layers='all'`` the mean of that over the layers:

        final: P_b = (1 / |Q_b|) sum_{i in Q_b} sum_j s^L_{b,ij}
        all:   P_b = (1 / L) sum_l (1 / |Q_b|) sum_{i in Q_b} sum_j s^l_{b,ij}

    samples: relaxed samples (H, B, T, T) per layer, bottom first;
    readers: (B, T) bool, Q (default: every real position). With one reader
    (a classifier's ``<s>``) the final form is the union sum_j min(sum_{i in Q} s_ij, 1)
    (each s_ij <= 1); over every real position that union is the constant T
    (s_jj = 1), hence the mean of the sizes (docs/math.md). Where every
    s^L_ij has reached 1 the final form's gradient is 0 (the min), hence 'all'.
    """
    if layers not in PENALTY_LAYERS:
        raise ValueError(f"layers {layers!r}: choose one of {', '.join(PENALTY_LAYERS)}")
    fields = soft_receptive_fields(samples, padding)
    first = samples[0]
    real = real_positions(padding, first.size(1), first.size(2), first.device)
    q = (real if readers is None else readers.bool() & real).to(first.dtype)
    used = fields[-1:] if layers == "final" else fields
    sizes = sum(s.sum(dim=-1) for s in used) / len(used)  # (B, T): sum_j s^l_ij, averaged over layers
    return (sizes * q).sum(dim=-1) / q.sum(dim=-1).clamp(min=1.0)
