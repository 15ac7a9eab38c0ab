"""Receptive fields of discrete attention (J. Kinley, 2020, Appendix,
"Dependency Learning On A Synthetic Language modeling Task").

At inference a discrete model's attention rows are one-hot (the argmax), so
the hidden state of position i after layer l is computed from the hidden
states, one layer down, of i itself (the residual connection; the
feed-forward block and the layer norms act on one position) and of the
positions k that i attends to in some head (S^{l,h}_{ik} = 1). Unrolled down
to the embeddings, the receptive field r(i, l) is the set of input positions
whose embedding enters the computation of position i's state after layer l:

    r(i, 0) = {i}
    r(i, l) = r(i, l-1)  U  U_{h, k: S^{l,h}_{ik} = 1} r(k, l-1)

or, with R^l the boolean matrix R^l_{ij} = [j in r(i, l)] and G^l_{ik} =
OR_h S^{l,h}_{ik} the layer's attention graph (union over heads),

    R^0 = I,   R^l = R^{l-1} OR (G^l R^{l-1})   (boolean product)     (Appendix's recursion)

For a two-stream model the graph is the model stream's S: only h carries
values (the controller g decides S through the argmax, which has no
gradient and is constant under perturbations that change no argmax).
Padding is never attended (its keys are -inf), and is left out of every
field here (rows and columns).

``soft_receptive_fields`` is the same recursion on relaxed samples
(s^l = min(s^{l-1} + (sum_h S^{l,h}) s^{l-1}, 1), the appendix's
differentiable form, summed over heads), which gives R^l exactly on one-hot
input; ``receptive_field_penalty`` is the training regularizer built on it
(docs/math.md). Both live in ``fairseq_dnas.attention.receptive_field``,
beside the discrete attention, and are re-exported here. Pure functions on
tensors; nothing here imports fairseq.
"""

from typing import List, Optional, Sequence

import torch
from torch import Tensor

# The soft recursion and the training penalty live beside the discrete
# attention they differentiate; re-exported here with the hard fields.
from fairseq_dnas.attention.receptive_field import (  # noqa: F401
    PENALTY_LAYERS,
    receptive_field_penalty,
    soft_receptive_fields,
)
from fairseq_dnas.attention.receptive_field import real_positions as _real_positions


def is_discrete_encoder(model) -> bool:
    """True when every encoder attention of ``model`` takes the argmax at
    inference (a single-stream or two-stream module with the 'gumbel'
    sampler); False for softmax encoders and the soft samplers."""
    from fairseq_dnas.analysis.capture import attention_sites

    sites = attention_sites(model, decoder=False)
    return bool(sites) and all(getattr(s.module, "sampler", None) == "gumbel" for s in sites)


def attention_graph(sample: Tensor, padding: Optional[Tensor] = None) -> Tensor:
    """G (B, T, T) bool: G_ik = OR_h [S^h_ik > 0], with padded queries and
    keys cleared.

    sample: one layer's attention (H, B, T_q, T_k), the capture's layout
    (``fairseq_dnas.analysis.capture``), one-hot rows at inference;
    padding: (B, T) bool, True at padding.
    """
    g = (sample > 0).any(dim=0)
    real = _real_positions(padding, g.size(0), g.size(1), g.device)
    return g & real[:, :, None] & real[:, None, :]


def receptive_fields(samples: Sequence[Tensor], padding: Optional[Tensor] = None) -> List[Tensor]:
    """[R^1, ..., R^L], each (B, T, T) bool, R^l_ij = [j in r(i, l)]: the
    receptive fields after every layer (bottom first) from the per-layer
    attention ``samples`` (each (H, B, T, T)); padding left out."""
    first = samples[0]
    batch, length = first.size(1), first.size(2)
    real = _real_positions(padding, batch, length, first.device)
    r = torch.eye(length, dtype=torch.bool, device=first.device).expand(batch, length, length)
    r = r & real[:, :, None]  # R^0 = I on the real positions
    fields = []
    for sample in samples:
        g = attention_graph(sample, padding)
        # (G R)_ij = OR_k G_ik R_kj, as a count > 0 (counts <= T: exact in float64)
        reached = torch.bmm(g.double(), r.double()) > 0
        r = r | reached  # R^l = R^{l-1} OR G^l R^{l-1}
        fields.append(r)
    return fields


def field_sizes(fields: Sequence[Tensor]) -> Tensor:
    """(L, B, T) |r(i, l)| per layer and position (0 at padding)."""
    return torch.stack([f.sum(dim=-1) for f in fields])


def field_of(fields: Sequence[Tensor], position: int = 0) -> Tensor:
    """(L, B, T) bool: the receptive field of one position (the classification
    head reads position 0, ``<s>``) after every layer."""
    return torch.stack([f[:, position, :] for f in fields])
