"""DNAS/HNAS probabilities from a materialized score matrix, with a
hand-written backward.

Autograd through ``functional.dnas_probs`` keeps half a dozen (B, H, T, T)
intermediates (masked scores, shifted scores, log-probabilities, ...). Here
the forward works in place on one score matrix and saves only the
probabilities, and the backward is the closed form of ``fused.py``:

    ds[i, j] = P[i, j] (G[i, j] - D_i + exp(r_i) dc[j]),
    D_i = sum_j P[i, j] G[i, j],   dc[j] = -sum_i P[i, j] (G[i, j] - D_i)

for G = dL/dP (exp(r_i) P[i, j] is the column softmax xi[i, j];
``docs/math.md#the-closed-form-backward``). This path
returns the probabilities, so attention dropout and ``need_weights`` work on
it as on fairseq's own math path; it is the fastest for short sequences.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention.functional import NEG, broadcast_masks, compute_dtype
from fairseq_dnas.attention.tracing import compiling


# A row whose normalizer falls below this is recomputed in the log domain:
# far from float32's smallest normal number (1.2e-38), so every probability
# that matters keeps full precision.
TINY = 1e-30


def _scores(q: Tensor, k: Tensor, kmask, qmask, bias: Optional[Tensor] = None) -> Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)).to(compute_dtype(q.dtype))  # (B, H, T_q, T_k)
    if bias is not None:  # s + B, the biased score (docs/math.md#a-biased-score)
        s.add_(bias.to(s.dtype))
    if kmask is not None and qmask is not None:
        s.masked_fill_(kmask | qmask, NEG)  # (B, 1, T_q, T_k) broadcast: one pass
    elif kmask is not None or qmask is not None:
        s.masked_fill_(kmask if qmask is None else qmask, NEG)
    return s


def _normalize_rows_(e: Tensor, qmask) -> Tuple[Tensor, Tensor]:
    """In place: e -> e / sum_j e; returns (e, row sums (B, H, T, 1), 0 at padded rows)."""
    z = e.sum(dim=-1, keepdim=True)
    if qmask is not None:
        z.masked_fill_(qmask, 0.0)
    return e.div_(z.clamp_min(TINY)), z


def _dnas_exp_(s: Tensor, kmask, qmask):
    """One exp over the masked scores (in place): xi = exp(s - c) (Algorithm 1,
    step 4, column normalization), then pi_D = xi / sum_j xi (rows).

    Returns pi_D, exp(r) = sum_j xi[i, j] (B, H, T, 1) and whether some real
    row underflowed (a query explained away by every key; the caller then
    recomputes in the log domain).
    """
    m = s.amax(dim=-2, keepdim=True)  # column maxima over real queries
    if kmask is not None:
        m.masked_fill_(kmask, 0.0)  # padded key columns: exp(NEG) = 0
    e = s.sub_(m).exp_()  # exp(s - m_j) <= 1; padded rows and keys 0
    z = e.sum(dim=-2, keepdim=True)  # >= 1 at real keys (the maximum gives exp(0))
    if kmask is not None:
        z.masked_fill_(kmask, 1.0)
    xi = e.div_(z)  # xi[i, j] = exp(s[i, j] - c[j]), c = m + log z
    p, exp_r = _normalize_rows_(xi, qmask)
    underflow = exp_r < TINY
    if qmask is not None:
        underflow &= ~qmask
    return p, exp_r, bool(underflow.any())


def _dnas_log_(s: Tensor, kmask, qmask) -> Tuple[Tensor, Tensor]:
    """The same in the log domain (two exps; safe for any scores)."""
    c = torch.logsumexp(s, dim=-2, keepdim=True)  # (B, H, 1, T)
    if kmask is not None:
        c.masked_fill_(kmask, 0.0)  # padded keys stay at NEG
    s.sub_(c)  # log xi[i, j] = s[i, j] - c[j]
    r = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, H, T, 1)
    p = s.sub_(r).exp_()
    exp_r = r.exp_()
    if qmask is not None:
        p.masked_fill_(qmask, 0.0)  # padded query rows: pi = 0
        exp_r.masked_fill_(qmask, 0.0)
    return p, exp_r


def _unas_log_(s: Tensor, qmask) -> Tensor:
    p = torch.softmax(s, dim=-1)
    return p if qmask is None else p.masked_fill_(qmask, 0.0)


def log_domain_at_once(s: Tensor) -> bool:
    """Whether to skip the one-exp forward and its underflow check: on CUDA
    (the check would synchronize with the host) and inside a compiled graph
    (the check is data-dependent Python, a graph break). The log domain gives
    the same probabilities for any scores."""
    return s.is_cuda or compiling()


def dnas_forward(q, k, kpad, qpad, bias=None):
    """pi_D (B, H, T_q, T_k) and exp(r) (B, H, T_q, 1) from scaled q, k
    (and the additive score bias ``bias``, broadcast to the scores, if given)."""
    kmask, qmask = broadcast_masks(kpad, qpad)
    s = _scores(q, k, kmask, qmask, bias)
    if log_domain_at_once(s):
        return _dnas_log_(s, kmask, qmask)
    p, exp_r, underflow = _dnas_exp_(s, kmask, qmask)
    if underflow:  # an explained-away query: redo in the log domain
        p, exp_r = _dnas_log_(_scores(q, k, kmask, qmask, bias), kmask, qmask)
    return p, exp_r


def hnas_forward(q, k, kpad, qpad, bias=None):
    """pi_D, exp(r) and pi_U from one exp over the scores.

    pi_U[i, j] is proportional to exp(s[i, j]) = e[i, j] exp(m_j); with
    g = max_j m_j, the weights exp(m_j - g) <= 1 make it
    e[i, j] exp(m_j - g) / sum_j' (...), computed before e is normalized.
    """
    kmask, qmask = broadcast_masks(kpad, qpad)
    s = _scores(q, k, kmask, qmask, bias)
    if log_domain_at_once(s):  # no host synchronization, no graph break (see dnas_forward)
        p_u = _unas_log_(s, qmask)
        p_d, exp_r = _dnas_log_(s, kmask, qmask)
        return p_d, exp_r, p_u
    m = s.amax(dim=-2, keepdim=True)
    if kmask is not None:
        m.masked_fill_(kmask, 0.0)
    e = s.sub_(m).exp_()
    w = torch.exp(m - m.amax(dim=-1, keepdim=True))  # (B, H, 1, T), <= 1
    if kmask is not None:
        w.masked_fill_(kmask, 0.0)
    p_u, z_u = _normalize_rows_(e * w, qmask)  # Algorithm 1, step 3
    z = e.sum(dim=-2, keepdim=True)
    if kmask is not None:
        z.masked_fill_(kmask, 1.0)
    p_d, exp_r = _normalize_rows_(e.div_(z), qmask)  # step 4
    real = torch.ones_like(exp_r, dtype=torch.bool) if qmask is None else ~qmask
    if bool(((exp_r < TINY) & real).any() or ((z_u < TINY) & real).any()):
        s = _scores(q, k, kmask, qmask, bias)
        p_u = _unas_log_(s, qmask)
        p_d, exp_r = _dnas_log_(s, kmask, qmask)
    return p_d, exp_r, p_u


def _softmax_grad(p: Tensor, g: Tensor) -> Tensor:
    """p * (g - sum_j p g): the row-softmax gradient at fixed bias (one fused
    kernel, the one autograd runs for ``torch.softmax``)."""
    return torch._softmax_backward_data(g, p, -1, p.dtype)


def _dnas_grad(p: Tensor, exp_r: Tensor, g: Tensor, kmask, scale=None) -> Tensor:
    """dL/ds of pi_D = softmax_j(s - c) for G = dL/dpi_D (closed form above),
    times ``scale`` (B or 1, H, 1, 1) if given."""
    t = _softmax_grad(p, g)
    if scale is not None:
        t.mul_(scale)
    dc = t.sum(dim=-2, keepdim=True).neg_()  # dc[j] = -db[j], (B, H, 1, T)
    if kmask is not None:
        dc.masked_fill_(kmask, 0.0)
    return t.addcmul_(p, exp_r * dc)  # + xi[i, j] dc[j]


def _dot_per_head(a: Tensor, b: Tensor) -> Tensor:
    """sum over batch, rows and columns of a * b, per head (H,), without a
    (B, H, T, T) temporary: a batched (1 x N) @ (N x 1) product."""
    bsz, heads = a.shape[:2]
    return torch.matmul(a.reshape(bsz, heads, 1, -1), b.reshape(bsz, heads, -1, 1)).sum(dim=(0, 2, 3))


def _bias_grad(ds: Tensor, bias: Optional[Tensor]) -> Optional[Tensor]:
    """dL/dB of an additive score bias: dL/ds summed over the dimensions the
    bias was broadcast along (T5's (1, H, T, T) bias: over the batch)."""
    return None if bias is None else ds.sum_to_size(bias.shape).to(bias.dtype)


# Self-attention pads keys and queries with one mask: the autograd functions
# take it once (qpad None, ``same`` True), since a compiled graph cannot trace
# a function given the same tensor twice.


class DenseDNAS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, kpad, qpad, bias=None, same=False):
        p, exp_r = dnas_forward(q, k, kpad, kpad if same else qpad, bias)
        ctx.save_for_backward(q, k, p, exp_r, kpad, bias)
        return p

    @staticmethod
    def backward(ctx, g):
        q, k, p, exp_r, kpad, bias = ctx.saved_tensors
        ds = _dnas_grad(p, exp_r, g, broadcast_masks(kpad, None)[0])
        db = _bias_grad(ds, bias) if ctx.needs_input_grad[4] else None
        ds = ds.to(q.dtype)
        return torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q), None, None, db, None


class DenseHNAS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, u, kpad, qpad, bias=None, same=False):
        p_d, exp_r, p_u = hnas_forward(q, k, kpad, kpad if same else qpad, bias)
        uu = u.to(p_d.dtype).view(1, -1, 1, 1)
        ctx.save_for_backward(q, k, u, p_d, exp_r, p_u, kpad, bias)
        return torch.lerp(p_u, p_d, uu)  # step 5: u pi_D + (1 - u) pi_U

    @staticmethod
    def backward(ctx, g):
        q, k, u, p_d, exp_r, p_u, kpad, bias = ctx.saved_tensors
        uu = u.to(g.dtype).view(1, -1, 1, 1)
        du = (_dot_per_head(g, p_d) - _dot_per_head(g, p_u)).to(u.dtype)  # dL/du = <G, pi_D - pi_U>
        ds = _dnas_grad(p_d, exp_r, g, broadcast_masks(kpad, None)[0], scale=uu)
        ds = ds.add_(_softmax_grad(p_u, g).mul_(1.0 - uu))
        db = _bias_grad(ds, bias) if ctx.needs_input_grad[5] else None
        ds = ds.to(q.dtype)
        return torch.matmul(ds, k), torch.matmul(ds.transpose(-1, -2), q), du, None, None, db, None


def dense_probs(q, k, scheme, kpad, qpad, hybrid_weight, bias=None):
    """(B, H, T_q, T_k) probabilities (float32, float64 for float64 q) of 'dnas'
    or 'hnas'; ``kpad`` (B, T_k) and ``qpad`` (B, T_q) are True at padding;
    ``bias``, if given, is added to the scores (broadcast to (B, H, T_q, T_k))."""
    same = qpad is kpad and kpad is not None
    qpad = None if same else qpad
    if scheme == "dnas":
        return DenseDNAS.apply(q, k, kpad, qpad, bias, same)
    return DenseHNAS.apply(q, k, hybrid_weight, kpad, qpad, bias, same)
