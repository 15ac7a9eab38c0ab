"""The attention schemes of Ding et al. (2020), as pure functions of scores.

Every function takes scores ``s`` of shape (B, H, T_q, T_k) and boolean masks
that are True at padding, and returns probabilities of the same shape. The
paper's Algorithm 1 numbers the steps: step 3 is UNAS (row softmax), step 4
is DNAS (column normalization, then row normalization), step 5 mixes them
(HNAS). Everything runs in the log domain in float32 (float64 stays float64,
so ``torch.autograd.gradcheck`` can run), whatever the input dtype.

Nothing here imports fairseq: the math can be reused on its own.
"""

from typing import Optional

import torch
from torch import Tensor

SCHEMES = ("unas", "dnas", "hnas")

# A finite stand-in for -inf. exp(NEG - x) underflows to exactly 0 against any
# real score, yet NEG - NEG is 0, not NaN, so rows or columns that are entirely
# padding stay finite in the forward pass and in the gradient (fairseq's -inf
# would turn them into NaN, and 0 * NaN still poisons later layers).
NEG = -1e30


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16/float32 -> float32; float64 stays float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def broadcast_masks(
    key_padding_mask: Optional[Tensor], query_padding_mask: Optional[Tensor]
):
    """(B, T_k) / (B, T_q) padding masks -> (B, 1, 1, T_k) / (B, 1, T_q, 1)."""
    kmask = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
    qmask = None if query_padding_mask is None else query_padding_mask.bool()[:, None, :, None]
    return kmask, qmask


def _mask_keys(s: Tensor, kmask: Optional[Tensor]) -> Tensor:
    return s if kmask is None else s.masked_fill(kmask, NEG)


def _zero_padded_queries(p: Tensor, qmask: Optional[Tensor]) -> Tensor:
    return p if qmask is None else p.masked_fill(qmask, 0.0)


def dnas_key_bias(
    s: Tensor, kmask: Optional[Tensor] = None, qmask: Optional[Tensor] = None
) -> Tensor:
    """c[j] = logsumexp_i s[i, j] over real queries, shape (B, H, 1, T_k).

    This is the column normalizer of Algorithm 1, step 4 (the denominator of
    xi[i, j] = exp(s[i, j]) / sum_i' exp(s[i', j])). Padded queries are left
    out of the sum; padded keys get c = 0, so a key that was masked with NEG
    stays at NEG after ``s - c``.
    """
    if qmask is not None:
        s = s.masked_fill(qmask, NEG)
    c = torch.logsumexp(s, dim=-2, keepdim=True)
    return c if kmask is None else c.masked_fill(kmask, 0.0)


def unas_log_probs(s: Tensor, kmask: Optional[Tensor] = None) -> Tensor:
    """Algorithm 1, step 3: log pi_U[i, j] = s[i, j] - logsumexp_j' s[i, j']."""
    return torch.log_softmax(_mask_keys(s, kmask), dim=-1)


def dnas_log_probs(
    s: Tensor,
    kmask: Optional[Tensor] = None,
    qmask: Optional[Tensor] = None,
    sinkhorn_iters: int = 1,
) -> Tensor:
    """Algorithm 1, step 4, repeated ``sinkhorn_iters`` times (Sinkhorn).

    One iteration is the paper's DNAS:
        xi[i, j]   = exp(s[i, j] - c[j])            (column normalization)
        pi_D[i, j] = xi[i, j] / sum_j' xi[i, j']    (row normalization)
    i.e. log pi_D = log_softmax_j(s - c), the log-domain identity.
    """
    log_p = _mask_keys(s, kmask)
    for _ in range(sinkhorn_iters):
        log_p = log_p - dnas_key_bias(log_p, kmask, qmask)  # columns over queries
        log_p = torch.log_softmax(log_p, dim=-1)  # rows over keys
    return log_p


def unas_probs(s, kmask=None, qmask=None):
    """UNAS: row softmax (Eq. 3). Padded query rows are all 0."""
    return _zero_padded_queries(unas_log_probs(s, kmask).exp(), qmask)


def dnas_probs(s, kmask=None, qmask=None, sinkhorn_iters=1):
    """DNAS: column then row normalization (Eq. 7-8). Padded query rows are 0."""
    return _zero_padded_queries(dnas_log_probs(s, kmask, qmask, sinkhorn_iters).exp(), qmask)


def hnas_probs(s, hybrid_weight, kmask=None, qmask=None, sinkhorn_iters=1):
    """HNAS (Eq. 12): pi_H = u * pi_D + (1 - u) * pi_U, one u per head.

    ``hybrid_weight`` has shape (H,) (or anything broadcastable to
    (1, H, 1, 1) after a view), values in [0, 1].
    """
    u = hybrid_weight.to(s.dtype).reshape(1, -1, 1, 1)
    p_d = dnas_log_probs(s, kmask, qmask, sinkhorn_iters).exp()
    p_u = unas_log_probs(s, kmask).exp()
    return _zero_padded_queries(u * p_d + (1.0 - u) * p_u, qmask)


def _check_mask(mask, name, batch, length):
    if mask is None:
        return
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] != length:
        raise ValueError(
            f"{name} must have shape (B, T) = ({batch}, {length}) with True at "
            f"padding; got {tuple(mask.shape)}"
        )


def check_hybrid_weight(hybrid_weight: Optional[Tensor], num_heads: int) -> None:
    """ValueError unless hybrid_weight is a (H,) tensor with values in [0, 1]."""
    if hybrid_weight is None:
        raise ValueError(
            "scheme 'hnas' needs hybrid_weight, a tensor of shape (H,) with values in [0, 1]"
        )
    if not torch.is_tensor(hybrid_weight) or tuple(hybrid_weight.shape) != (num_heads,):
        shape = tuple(hybrid_weight.shape) if torch.is_tensor(hybrid_weight) else type(hybrid_weight).__name__
        raise ValueError(
            f"hybrid_weight must be a tensor of shape (H,) = ({num_heads},); got {shape}"
        )
    if not bool(torch.isfinite(hybrid_weight).all()) or bool(
        ((hybrid_weight < 0) | (hybrid_weight > 1)).any()
    ):
        raise ValueError(
            f"hybrid_weight must lie in [0, 1]; got values from "
            f"{hybrid_weight.min().item():g} to {hybrid_weight.max().item():g}"
        )


def check_sinkhorn_iters(sinkhorn_iters) -> None:
    if isinstance(sinkhorn_iters, bool) or not isinstance(sinkhorn_iters, int) or sinkhorn_iters < 1:
        raise ValueError(
            f"sinkhorn_iters must be an integer >= 1 (1 is the paper's DNAS); got {sinkhorn_iters!r}"
        )


def check_scheme(scheme) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown attention scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


def attention_probs(
    scores: Tensor,
    scheme: str,
    *,
    key_padding_mask: Optional[Tensor] = None,
    query_padding_mask: Optional[Tensor] = None,
    hybrid_weight: Optional[Tensor] = None,
    sinkhorn_iters: int = 1,
) -> Tensor:
    """Attention probabilities for one of the schemes 'unas', 'dnas', 'hnas'.

    Args:
        scores: (B, H, T_q, T_k) attention scores q.k / sqrt(d), any float dtype.
        scheme: 'unas' (row softmax), 'dnas' (doubly normalized) or 'hnas'
            (hybrid of the two).
        key_padding_mask: (B, T_k), True at padded keys.
        query_padding_mask: (B, T_q), True at padded queries; DNAS leaves
            them out of the column normalization.
        hybrid_weight: (H,) in [0, 1], the weight u of DNAS in HNAS.
        sinkhorn_iters: number of (column, row) normalization rounds for
            DNAS/HNAS; 1 is the paper's DNAS.

    Returns:
        (B, H, T_q, T_k) float32 probabilities (float64 for float64 scores):
        each real query row sums to 1, padded keys get 0, padded query rows
        are all 0.
    """
    check_scheme(scheme)
    check_sinkhorn_iters(sinkhorn_iters)
    if not torch.is_tensor(scores) or scores.dim() != 4 or not scores.is_floating_point():
        raise ValueError("scores must be a floating-point tensor of shape (B, H, T_q, T_k)")
    batch, heads, t_q, t_k = scores.shape
    _check_mask(key_padding_mask, "key_padding_mask", batch, t_k)
    _check_mask(query_padding_mask, "query_padding_mask", batch, t_q)
    if scheme == "hnas":
        check_hybrid_weight(hybrid_weight, heads)
    return scheme_probs(scores, scheme, key_padding_mask, query_padding_mask, hybrid_weight, sinkhorn_iters)


def scheme_probs(scores, scheme, key_padding_mask, query_padding_mask, hybrid_weight, sinkhorn_iters) -> Tensor:
    """``attention_probs`` without its argument checks (for callers that
    checked them at build time): the compute dtype, the (B, T) padding masks
    broadcast, and the scheme's function."""
    s = scores.to(compute_dtype(scores.dtype))
    kmask, qmask = broadcast_masks(key_padding_mask, query_padding_mask)
    if scheme == "unas":
        return unas_probs(s, kmask, qmask)
    if scheme == "dnas":
        return dnas_probs(s, kmask, qmask, sinkhorn_iters)
    return hnas_probs(s, hybrid_weight, kmask, qmask, sinkhorn_iters)
