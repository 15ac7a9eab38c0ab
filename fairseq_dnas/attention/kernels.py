"""Attention outputs ``probs @ V`` for every scheme: the execution paths.

``attend`` is what the fairseq module calls. It takes per-head queries (already
scaled by 1/sqrt(d)), keys and values of shape (B, H, T, D) and returns the
output (B, H, T, D) and, when asked, the probabilities (B, H, T, T) computed by
``fairseq_dnas.attention.functional``.
"""

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention import functional as AF


def materialized_probs(
    scores: Tensor,
    scheme: str,
    padding_mask: Optional[Tensor],
    hybrid_weight: Optional[Tensor],
    sinkhorn_iters: int,
) -> Tensor:
    """Self-attention probabilities from a materialized (B, H, T, T) score matrix."""
    s = scores.to(AF.compute_dtype(scores.dtype))
    kmask, qmask = AF.broadcast_masks(padding_mask, padding_mask)
    if scheme == "unas":
        return AF.unas_probs(s, kmask, qmask)
    if scheme == "dnas":
        return AF.dnas_probs(s, kmask, qmask, sinkhorn_iters)
    return AF.hnas_probs(s, hybrid_weight, kmask, qmask, sinkhorn_iters)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scheme: str,
    padding_mask: Optional[Tensor] = None,
    hybrid_weight: Optional[Tensor] = None,
    sinkhorn_iters: int = 1,
    dropout: Optional[Callable[[Tensor], Tensor]] = None,
    need_weights: bool = False,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Self-attention output for scaled queries ``q`` and keys/values ``k``, ``v``.

    ``padding_mask`` is (B, T), True at padding: the padded positions are both
    the padded keys and the padded queries. Probabilities are computed in
    float32 and cast back to the dtype of ``v`` before ``@ V``, as fairseq does.
    """
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, T, T)
    probs = materialized_probs(scores, scheme, padding_mask, hybrid_weight, sinkhorn_iters)
    p = probs.to(v.dtype)
    if dropout is not None:
        p = dropout(p)
    out = torch.matmul(p, v)  # (B, H, T, D)
    return out, (probs if need_weights else None)
