"""Discrete attention (J. Kinley, 2020): each attention row is a sampled choice.

The thesis (Section 4.1, Eq. 4.1) replaces the attention weights A_i =
softmax(L_i) of every head by one draw z_i ~ Categorical(A_i): the output row
is the value at the chosen position, V_{z_i}. Training uses the
Gumbel-softmax relaxation of that draw (Section 3.3, Jang et al. 2016;
Maddison et al. 2016),

    S_i = softmax((log A_i + G_i) / tau),   G_ij = -log(-log U_ij),  U ~ Uniform(0, 1),

with tau = 1 throughout the thesis (Section 5.3); inference takes the argmax,
S_i = one-hot(argmax_j L_ij), with no noise ("At inference time, we only use
argmax attention", Section 1).

All functions take scores of shape (B, H, T_q, T_k) and compute in float32
(float64 stays float64, so gradcheck and exact references can run); callers
cast the result to their dtype. Nothing here imports fairseq.

The noise G is drawn in ``gumbel_noise``; the temperature's check and its
annealing schedule are in ``gumbel_schedule``.
"""

from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention.gumbel_noise import exponential_noise, gumbel_noise
from fairseq_dnas.attention.tracing import compiling

SAMPLERS = ("gumbel", "soft")  # 'soft' is S = A = softmax(L) (no sampling)
DISCRETE_SCHEMES = ("unas", "dnas")  # the distribution sampled from

# A finite stand-in for -inf inside the sample (the functional module's
# value): a row whose keys are all forbidden then stays finite (uniform, then
# zeroed), in the forward and in the gradient, where -inf would give NaN.
NEG = AF.NEG


def masked_scores(scores: Tensor, key_padding_mask: Optional[Tensor] = None,
                  attn_mask: Optional[Tensor] = None) -> Tensor:
    """The attention logits L: scores in float32 (float64 stays float64) with
    -inf at padded keys and fairseq's additive ``attn_mask`` added.

    Args:
        scores: (B, H, T_q, T_k) q.k / sqrt(d_k).
        key_padding_mask: (B, T_k) bool, True at padding.
        attn_mask: (T_q, T_k) float, 0 = allowed, -inf = forbidden (the
            decoder's causal mask), as fairseq passes it.
    """
    s = scores.to(AF.compute_dtype(scores.dtype))
    if attn_mask is not None:
        s = s + attn_mask.to(s.dtype)
    if key_padding_mask is not None:
        s = s.masked_fill(key_padding_mask.bool()[:, None, None, :], float("-inf"))
    return s


def _rows_with_keys(logits: Tensor) -> Tensor:
    """(..., 1): 1 where the row has a key that may be chosen, else 0."""
    return (logits.amax(dim=-1, keepdim=True) > float("-inf")).to(logits.dtype)


def _every_row_has_a_key(logits: Tensor) -> bool:
    """True if every row of ``logits`` has a key above -inf (checked on the
    CPU only: elsewhere the answer would cost a host synchronization, so
    False, and the caller takes the path that handles empty rows; inside a
    compiled graph too, where the answer would be data-dependent Python)."""
    if logits.device.type != "cpu" or compiling():
        return False
    return bool((logits.amax(dim=-1) > float("-inf")).all())


def softmax_probs(logits: Tensor) -> Tensor:
    """A = softmax(L) over the allowed keys, exactly 0 at -inf keys; rows with
    no allowed key are all 0, not NaN (forward and gradient)."""
    if _every_row_has_a_key(logits):
        # exp(-inf - max) = 0 beside a real logit, and the softmax gradient
        # there is 0 * (...) = 0: the same values as below, two passes fewer
        # (and two in the backward).
        return torch.softmax(logits, dim=-1)
    # -inf -> NEG: exp(NEG - max) is exactly 0 beside any real logit, and a
    # row of NEG alone is finite (uniform, then zeroed), where -inf gives NaN.
    return torch.softmax(logits.clamp_min(NEG), dim=-1) * _rows_with_keys(logits)


def gumbel_softmax_probs(logits: Tensor, *, tau: float, hard: bool, noise: Tensor) -> Tensor:
    """The relaxed sample S = softmax((log_softmax(L) + G) / tau) (Section 3.3).

    Args:
        logits: (..., T_k) L, -inf at keys that may not be chosen.
        tau: the temperature, > 0.
        hard: straight-through: the forward value is one-hot(argmax_j (L + G))
            exactly, the gradient is the relaxed sample's.
        noise: G, broadcastable to ``logits`` (float32 Gumbel noise); not changed.

    Returns:
        S in float32 (float64 for float64 logits): exactly 0 at -inf keys,
        also after the noise (-inf + G = -inf); rows with no allowed key are
        all 0.
    """
    # log_softmax(L) = L - logsumexp(L) shifts a whole row by one constant,
    # and softmax is shift-invariant: softmax((L + G) / tau) is the same
    # sample, one pass over T x T fewer.
    y = logits + noise.to(logits.dtype)  # L + G: a new tensor, so the division may act in place
    if tau != 1.0:  # (the thesis's tau = 1 needs no pass)
        y = y.div_(tau)  # (L + G) / tau
    soft = softmax_probs(y)  # S = softmax((L + G) / tau)
    if not hard:
        return soft
    # one_hot + (soft - soft.detach()) is exactly one_hot in the forward
    # (x - x = 0), and its gradient is soft's.
    return _one_hot_argmax(y.detach()) + (soft - soft.detach())


def _one_hot_argmax(y: Tensor) -> Tensor:
    index = y.argmax(dim=-1, keepdim=True)  # first maximum: ties go to the lowest index
    one_hot = torch.zeros_like(y).scatter_(-1, index, 1.0)
    return one_hot if _every_row_has_a_key(y) else one_hot * _rows_with_keys(y)


class _RelaxedSampleFromProbs(torch.autograd.Function):
    """S = softmax(L + G) from A = softmax(L) and E = exp(-G), written into
    E's buffer (see ``gumbel_softmax_from_probs``); the gradient is the
    softmax's, w.r.t. L."""

    @staticmethod
    def forward(ctx, logits, probs, exponential):
        s = torch.div(probs, exponential, out=exponential)  # A_j e^{G_j} = A_j / E_j
        total = s.sum(dim=-1, keepdim=True)
        s.mul_(total.reciprocal_())  # S_j = A_j e^{G_j} / sum_k A_k e^{G_k} = softmax(L + G)_j
        if compiling() or bool(total.isnan().any()):
            # softmax of a row of -inf (no allowed key) is NaN: S is 0 there,
            # as gumbel_softmax_probs gives (NaN logits stay NaN); compiled:
            # always (a no-op where every row has a key), no data-dependent branch
            s.masked_fill_(logits.amax(dim=-1, keepdim=True) == float("-inf"), 0.0)
        ctx.mark_dirty(exponential)
        ctx.save_for_backward(s)
        return s

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        # dL = S * (dS - sum_j S_j dS_j): softmax's backward at its output S
        return torch._softmax_backward_data(grad, s, -1, s.dtype), None, None


def gumbel_softmax_from_probs(logits: Tensor, probs: Tensor, exponential: Tensor) -> Tensor:
    """The relaxed sample at tau = 1, S = softmax(L + G) (Section 3.3), from
    the caller's A = softmax(L) and E = exp(-G) ~ Exp(1):

        softmax(L + G)_j = A_j e^{G_j} / sum_k A_k e^{G_k} = (A_j / E_j) / sum_k (A_k / E_k),

    which spares the second log of the noise and the row maxima and
    exponentials of a second softmax. The gradient flows to ``logits`` (the
    softmax's, at S); none to ``probs`` or ``exponential``.

    Args:
        logits: (..., T_k) L, -inf at forbidden keys.
        probs: softmax(L) of these logits (the two-stream controller's A),
            same shape; NaN in rows without an allowed key, as torch's softmax gives.
        exponential: E > 0, ``probs``' shape (``exponential_noise``); not changed.

    Returns:
        S in ``probs``' dtype: exactly 0 where A is 0; rows with no allowed
        key are all 0. Equal to ``gumbel_softmax_probs(logits, tau=1,
        hard=False, noise=-log E)`` up to rounding, except where A_j
        underflows to 0 while S_j would be below about 1e-30.
    """
    return _sample_from_probs_(logits, probs, exponential.to(probs.dtype, copy=True))


def _sample_from_probs_(logits: Tensor, probs: Tensor, exponential: Tensor) -> Tensor:
    """``gumbel_softmax_from_probs`` writing S into ``exponential``'s buffer
    (one T x T allocation fewer): for noise the caller drew for this call."""
    if exponential.shape != probs.shape:
        raise ValueError(f"exponential noise of shape {tuple(exponential.shape)} for probabilities of shape "
                         f"{tuple(probs.shape)}: draw it in the probabilities' shape")
    # detach(): a tensor of its own (not a view of the noise's bit buffer), so it may be marked dirty
    return _RelaxedSampleFromProbs.apply(logits, probs.detach(), exponential.to(probs.dtype).detach())


def argmax_one_hot(logits: Tensor) -> Tensor:
    """S = one-hot(argmax_j L_ij), the inference-time attention (Section 1).

    Ties go to the lowest index; rows whose keys are all -inf give zeros.
    float32 (float64 for float64 logits).
    """
    return _one_hot_argmax(logits.detach().to(AF.compute_dtype(logits.dtype)))


class ArgmaxChoice(NamedTuple):
    """The key each attention row takes at inference, z_i = argmax_j L_ij."""

    index: Tensor  # (..., T_q) int64; ties to the lowest index, as argmax_one_hot
    has_key: Optional[Tensor]  # (..., T_q) bool, False where every key is -inf; None if every row has one


def argmax_choice(logits: Tensor) -> ArgmaxChoice:
    """z_i = argmax_j L_ij, the inference-time choice (Section 1), as indices:
    the same choice as ``argmax_one_hot`` (argmax in the logits' own dtype
    gives the float32 cast's argmax: the cast keeps the order), without
    the T_q x T_k one-hot."""
    # one pass for both: the row maxima (is there a key?) and their first index (torch.max's ties, as argmax's)
    top, index = logits.detach().max(dim=-1)
    has_key = top > float("-inf")
    if has_key.device.type == "cpu" and not compiling() and bool(has_key.all()):
        # (elsewhere the test would be a host synchronization; compiled, a graph break)
        has_key = None
    return ArgmaxChoice(index, has_key)


def gather_values(choice: ArgmaxChoice, v: Tensor) -> Tensor:
    """The output rows V_{z_i} (Eq. 4.1 at inference): a gather of v, not
    the product one-hot(z) v, and bit for bit that product (1 * v + 0 * ...
    is v exactly; a row with no key gives 0 as its zero row does).

    Args:
        choice: indices (..., T_q) (``argmax_choice``).
        v: (..., T_k, D), leading dimensions broadcastable to the indices'
            (beam search: one copy of the encoder values per sentence).

    Returns:
        (..., T_q, D) in v's dtype.
    """
    index = choice.index
    lead = torch.broadcast_shapes(index.shape[:-1], v.shape[:-2])
    t_q, d = index.size(-1), v.size(-1)
    rows = index.expand(*lead, t_q).unsqueeze(-1).expand(*lead, t_q, d)
    out = torch.gather(v.expand(*lead, *v.shape[-2:]), -2, rows)
    if choice.has_key is None:
        return out
    return out.masked_fill(~choice.has_key.expand(*lead, t_q).unsqueeze(-1), 0.0)


def one_hot_rows(choice: ArgmaxChoice, num_keys: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """S = one-hot(z_i) (..., T_q, T_k) of ``choice``, zero rows where no key
    may be chosen: ``argmax_one_hot``'s value, for the callers that ask for
    the attention (analysis, ``output_attentions``)."""
    index = choice.index
    s = torch.zeros(*index.shape, num_keys, dtype=dtype, device=index.device).scatter_(-1, index.unsqueeze(-1), 1.0)
    return s if choice.has_key is None else s * choice.has_key.unsqueeze(-1).to(dtype)


def argmax_attention(logits: Tensor, v: Tensor, *, need_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
    """Inference (Section 1: "we only use argmax attention"): the output
    V_{z_i}, z_i = argmax_j L_ij, by index (``gather_values``), and S =
    one-hot(z) (float32, float64 for float64 logits) only when asked for.

    logits (..., T_q, T_k) with -inf at forbidden keys; v (..., T_k, D),
    leading dimensions broadcastable to the logits'. Returns ((..., T_q, D)
    in v's dtype, S or None).
    """
    choice = argmax_choice(logits)
    out = gather_values(choice, v)
    if not need_weights:
        return out, None
    return out, one_hot_rows(choice, logits.size(-1), AF.compute_dtype(logits.dtype))


def gumbel_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, tau: float,
                     key_padding_mask: Optional[Tensor] = None, attn_mask: Optional[Tensor] = None,
                     dropout_p: float = 0.0, noise: Optional[Tensor] = None,
                     generator: Optional[torch.Generator] = None) -> Tensor:
    """S v for the relaxed sample (``hard=False``, scheme 'unas') through
    torch's fused ``scaled_dot_product_attention``, which keeps no T x T
    probabilities for the backward on its fused kernels.

    With L = q k^T * scale, softmax((L + G) / tau) = softmax(q k^T * (scale /
    tau) + M), M = (G + attn_mask) / tau with padded keys at the dtype's
    lowest value: the noise enters as an additive mask. The gradient is the
    relaxed sample's, as in ``discrete_probs``. Attention dropout
    (``dropout_p``) drops entries of S as fairseq does.

    Args:
        q: (B, H, T_q, D); k, v: (B, H, T_k, D).
        noise: G, (B, H, T_q, T_k) float32; drawn (``gumbel_noise``) when None.

    Returns:
        (B, H, T_q, D) in v's dtype. A row with no allowed key gives a finite
        average of the values (``discrete_probs`` gives 0 there); fairseq's
        models never have one.
    """
    shape = (q.size(0), q.size(1), q.size(2), k.size(2))
    dtype = AF.compute_dtype(q.dtype)
    if noise is None:
        m = gumbel_noise(shape, device=q.device, generator=generator).to(dtype)
    else:
        m = noise.to(dtype, copy=True)  # the caller's noise stays as it was
    if tau != 1.0:  # (the thesis's tau = 1 needs no pass)
        m.div_(tau)
    # Forbidden keys get a finite lowest value (NEG, or half precision's
    # lowest) instead of -inf, so a row with no allowed key stays finite.
    low = max(NEG, torch.finfo(q.dtype).min)
    if attn_mask is not None:
        m = m.add_(attn_mask.to(dtype) / tau).clamp_min_(low)  # (G + attn_mask) / tau
    if key_padding_mask is not None:
        m.masked_fill_(key_padding_mask.bool()[:, None, None, :], low)
    m = m.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=dropout_p, scale=scale / tau)


def discrete_attention(q: Tensor, k: Tensor, v: Tensor, *, scale: float, tau: float = 1.0, hard: bool = False,
                       training: bool = True, key_padding_mask: Optional[Tensor] = None, need_weights: bool = False,
                       generator: Optional[torch.Generator] = None,
                       score_bias: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
    """Eq. 4.1 for per-head q (B, H, T_q, D) and k, v (B, H, T_k, D), each
    row a draw from softmax(L), L = q k^T * scale (scheme 'unas'), padded
    keys never chosen: the relaxed sample in training (fused, as
    ``gumbel_attention``, unless ``hard`` or the weights are asked for), the
    argmax by index at inference (``argmax_attention``). No attention
    dropout: the sample is the noise (the fairseq modules' rule). The path of
    the Hugging Face adapter's bidirectional self-attention.

    ``score_bias`` (broadcast to (B, H, T_q, T_k)), e.g. T5's position
    bias, is added to the logits: L = q k^T * scale + B.

    Returns (S v (B, H, T_q, D) in v's dtype, S (float32; float64 for
    float64 q) or None when not asked for).
    """
    if training and not hard and not need_weights:
        out = gumbel_attention(q, k, v, scale=scale, tau=tau, key_padding_mask=key_padding_mask,
                               attn_mask=score_bias, generator=generator)  # B enters as the additive mask
        return out, None
    scores = torch.matmul(q * scale, k.transpose(-1, -2))  # L, q scaled first as fairseq does
    if score_bias is not None:
        scores = scores + score_bias  # L = S + B
    if not training:
        return argmax_attention(masked_scores(scores, key_padding_mask), v, need_weights=need_weights)
    probs = discrete_probs(scores, key_padding_mask=key_padding_mask, tau=tau, hard=hard, generator=generator)
    return torch.matmul(probs.to(v.dtype), v), probs


def distribution_logits(scores: Tensor, *, scheme: str = "unas", key_padding_mask: Optional[Tensor] = None,
                        attn_mask: Optional[Tensor] = None, query_padding_mask: Optional[Tensor] = None,
                        sinkhorn_iters: int = 1) -> Tensor:
    """Logits of the categorical distribution each row samples from.

    'unas' (the thesis): L itself (``masked_scores``), Categorical(softmax(L)).
    'dnas': log pi_D of Ding et al. (2020), Algorithm 1, step 4 (columns over
    the real queries, then rows), -inf at padded keys; self-attention of an
    encoder only (it needs every query, so no ``attn_mask``).
    """
    if scheme == "unas":
        return masked_scores(scores, key_padding_mask, attn_mask)
    if scheme != "dnas":
        raise ValueError(f"unknown discrete scheme {scheme!r}; choose one of {', '.join(DISCRETE_SCHEMES)}")
    if attn_mask is not None:
        raise ValueError("the DNAS distribution needs every query, so it cannot take a causal attn_mask")
    s = scores.to(AF.compute_dtype(scores.dtype))
    kmask, qmask = AF.broadcast_masks(key_padding_mask, query_padding_mask)
    log_p = AF.dnas_log_probs(s, kmask, qmask, sinkhorn_iters)
    return log_p if kmask is None else log_p.masked_fill(kmask, float("-inf"))


def discrete_probs(scores: Tensor, *, key_padding_mask: Optional[Tensor] = None,
                   attn_mask: Optional[Tensor] = None, tau: float = 1.0, hard: bool = False,
                   training: bool = True, noise: Optional[Tensor] = None,
                   generator: Optional[torch.Generator] = None, sampler: str = "gumbel",
                   scheme: str = "unas", query_padding_mask: Optional[Tensor] = None,
                   sinkhorn_iters: int = 1, probs: Optional[Tensor] = None) -> Tensor:
    """The attention S (B, H, T_q, T_k) a discrete model multiplies V with.

    training: the relaxed sample ``gumbel_softmax_probs`` with ``noise`` (fresh
    float32 Gumbel noise from ``generator``, or the default generator, when
    None); eval: ``argmax_one_hot``, no noise. ``sampler='soft'`` gives
    S = A = softmax(L) in both modes (the thesis's two-stream soft model, and
    the parity switch of the single-stream one). ``scheme`` picks the
    distribution (``distribution_logits``); ``query_padding_mask`` is used
    by 'dnas' only (its column normalization). float32 (float64 for float64
    scores); callers cast.

    ``probs``: A = softmax(L) of the same masked logits, when the caller has
    computed it (the two-stream controller). The relaxed sample at tau = 1
    ('unas', not hard) is then computed from it (``gumbel_softmax_from_probs``),
    with the same noise draws; elsewhere it is not used.
    """
    logits = distribution_logits(scores, scheme=scheme, key_padding_mask=key_padding_mask,
                                 attn_mask=attn_mask, query_padding_mask=query_padding_mask,
                                 sinkhorn_iters=sinkhorn_iters)
    if sampler == "soft":
        return softmax_probs(logits)
    if sampler != "gumbel":
        raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    if not training:
        return argmax_one_hot(logits)
    if probs is not None and scheme == "unas" and tau == 1.0 and not hard and logits.device.type == "cpu":
        # (measured on the CPU only; elsewhere the empty-row check in it would be a host synchronization)
        if noise is None:
            e = exponential_noise(logits.shape, device=logits.device, generator=generator)
        else:
            e = noise.to(logits.dtype).neg().exp().expand(logits.shape).contiguous()  # E = exp(-G), a new tensor
        return _sample_from_probs_(logits, probs, e)
    if noise is None:
        noise = gumbel_noise(logits.shape, device=logits.device, generator=generator)
    return gumbel_softmax_probs(logits, tau=tau, hard=hard, noise=noise)
