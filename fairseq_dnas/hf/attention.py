"""The attention function transformers calls for ``attn_implementation`` =
"dnas", "hnas", "discrete" (and "unas", the same plumbing with ordinary
softmax, for tests).

transformers hands every attention module's call to the function registered
under the model's implementation name, with per-head ``query``, ``key``,
``value`` (B, H, T, D), a mask, ``scaling`` and ``dropout``. Bidirectional
self-attention goes to ``kernels.attend`` (DNAS/HNAS) or to the fairseq
models' discrete attention, ``attention.discrete.discrete_attention`` (J.
Kinley, 2020, Section 4.1: the Gumbel-softmax relaxation in training, the
argmax by index at inference); causal self-attention and cross-attention go
to transformers' own ``sdpa_attention_forward``.

A score bias a model passes as ``position_bias`` (T5, mT5, UMT5: the relative
position bias, with ``scaling`` = 1) is added to the scores, and the scheme
runs over S + B (``docs/math.md#a-biased-score``). Nothing here branches on a
tensor's values inside a compiled graph (``attention.tracing.compiling``): the
mask checks become tensor asserts there, so ``torch.compile`` and
``torch.export`` see one graph.
"""

from typing import Optional

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from fairseq_dnas.attention import kernels
from fairseq_dnas.attention.discrete import discrete_attention
from fairseq_dnas.attention.functional import SCHEMES as KERNEL_SCHEMES
from fairseq_dnas.attention.tracing import compiling

DISCRETE = "discrete"
SCHEMES = KERNEL_SCHEMES + (DISCRETE,)
# The attributes ``enable`` sets on each bidirectional self-attention module
# of a discrete model: the fairseq flags' names (--gumbel-temperature, --gumbel-hard).
TEMPERATURE_ATTR, HARD_ATTR = "gumbel_temperature", "gumbel_hard"

ROLE_ATTR = "dnas_role"  # set on each attention module by enable(): self, causal or cross
CROSS_NAMES = ("encoder_attn", "crossattention", "cross_attention", "EncDecAttention")


def infer_role(module, name: str = "") -> str:
    """'causal', 'cross' or 'self' (bidirectional self-attention) for an attention module.

    transformers flags causal attention (``is_causal``) but not cross-attention:
    BART's decoder cross-attention is the same class as its self-attention,
    told apart by its name (``encoder_attn``) or by ``is_decoder`` without
    ``is_causal``; BERT-style decoders use a ``...CrossAttention`` class.
    """
    if getattr(module, "is_causal", False):
        return "causal"
    if "Cross" in type(module).__name__ or name.rsplit(".", 1)[-1] in CROSS_NAMES:
        return "cross"
    if getattr(module, "is_cross_attention", False) or getattr(module, "is_decoder", False):
        return "cross"
    return "self"


def _require(ok: Tensor, message: str) -> None:
    """ValueError(message) unless the boolean tensor ``ok`` is True. Inside a
    compiled graph the same check is a tensor op (``torch._assert_async``:
    a RuntimeError with the same message when the graph runs) instead of
    data-dependent Python, which would break the graph."""
    if compiling():
        torch._assert_async(ok, message)
    elif not bool(ok):
        raise ValueError(message)


def key_padding_mask(mask: Optional[Tensor], batch: int, length: int) -> Optional[Tensor]:
    """The (B, T) key padding mask (True at padding) behind transformers' 4D mask.

    ``sdpa_mask`` gives a boolean (B, 1, T, T) mask, True where a query may see
    a key; with padding only, every query row is the same. Additive float masks
    (0 or very negative) are read the same way. Anything else (sliding-window or
    local layers, custom 4D masks, biases) is refused: DNAS normalizes each
    key's column over the queries that see it, and the project's kernels and
    float64 reference cover padding masks only.

    None when there is no mask, or (eager only) when no position is padded;
    inside a compiled graph the mask is returned as it is (all False without
    padding: the same result, without a data-dependent branch).
    """
    if mask is None:
        return None
    if mask.dim() != 4:
        raise ValueError(f"DNAS expects transformers' 4D attention mask (B, 1, T, T); got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        keep = mask
    else:
        blocked = mask <= torch.finfo(mask.dtype).min / 2
        _require(((mask == 0) | blocked).all(),
                 "DNAS takes padding masks only; this additive mask carries a bias (values other than 0 "
                 "and -inf): use attn_implementation='sdpa' for this model")
        keep = ~blocked
    keep = keep.expand(batch, -1, length, length) if keep.shape[-2] == 1 else keep
    rows = keep[:, :1, :1, :]
    _require((keep == rows).all(),
             "DNAS/HNAS got an attention mask that is not a key padding mask (a sliding-window, local or "
             "custom 4D mask): only padding masks are supported; use attn_implementation='sdpa' for this model "
             "or a model with full bidirectional attention")
    pad = ~rows[:, 0, 0, :]
    if compiling():
        return pad
    return pad if bool(pad.any()) else None


def score_bias(bias: Optional[Tensor], batch: int, heads: int, length: int) -> Optional[Tensor]:
    """T5's ``position_bias``, checked: an additive score bias of shape
    (1 or B, 1 or H, T, T), on which the scheme runs over S + B."""
    if bias is None:
        return None
    shape = tuple(bias.shape)
    if bias.dim() != 4 or shape[0] not in (1, batch) or shape[1] not in (1, heads) or shape[2:] != (length, length):
        raise ValueError(
            f"DNAS takes a position bias of shape (1 or B, 1 or H, T, T) = (1 or {batch}, 1 or {heads}, {length}, "
            f"{length}); got {shape}: use attn_implementation='sdpa' for this model"
        )
    return bias


class _Dropout:
    """Attention dropout as ``kernels.attend`` expects it (a callable with ``p``)."""

    training = True

    def __init__(self, p: float):
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return torch.nn.functional.dropout(x, p=self.p, training=True)


def hybrid_weight(module, heads: int) -> Tensor:
    """u = sigmoid(logit) of an HNAS module, (H,)."""
    logit = getattr(module, "hybrid_logit", None)
    if logit is None:
        raise ValueError(
            f"attn_implementation 'hnas' needs the HNAS weights on {type(module).__name__}: build or load the "
            "model with fairseq_dnas.hf.enable(model, scheme='hnas') or fairseq_dnas.hf.from_pretrained(...)"
        )
    return torch.sigmoid(logit.float()).expand(heads)


def discrete_settings(module) -> tuple:
    """(tau, hard) that ``enable(model, scheme='discrete', ...)`` set on ``module``."""
    if not hasattr(module, TEMPERATURE_ATTR):
        raise ValueError(
            f"attn_implementation 'discrete' needs the Gumbel settings on {type(module).__name__}: build or load the "
            "model with fairseq_dnas.hf.enable(model, scheme='discrete') or fairseq_dnas.hf.from_pretrained(...)"
        )
    return float(getattr(module, TEMPERATURE_ATTR)), bool(getattr(module, HARD_ATTR, False))


def attention_forward(
    scheme: str,
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    dropout: float = 0.0,
    scaling: Optional[float] = None,
    is_causal: Optional[bool] = None,
    **kwargs,
):
    """transformers' attention-function signature; returns ((B, T, H, D), weights or None)."""
    role = getattr(module, ROLE_ATTR, None) or infer_role(module)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    if role != "self" or causal or query.shape[-2] != key.shape[-2]:
        # Decoders stay softmax, as in the fairseq plugin (DNAS's column
        # normalization over queries would let a query see later queries).
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    for unsupported in ("softcap", "sinks", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(
                f"DNAS/HNAS does not take {unsupported!r} (this model adds it to the attention scores): "
                "use attn_implementation='sdpa' for this model"
            )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    batch, heads, length, head_dim = query.shape
    pad = key_padding_mask(attention_mask, batch, length)
    bias = score_bias(kwargs.get("position_bias"), batch, heads, length)  # T5: S + B
    # T5 passes scaling = 1 (its scores are not divided by sqrt(d)); None: 1/sqrt(d)
    scale = head_dim**-0.5 if scaling is None else scaling
    need_weights = bool(kwargs.get("output_attentions", False))
    if scheme == DISCRETE:
        # Eq. 4.1: each query and head takes one key; no attention dropout on a sample
        tau, hard = discrete_settings(module)
        out, weights = discrete_attention(query, key, value, scale=scale, tau=tau, hard=hard,
                                          training=module.training, key_padding_mask=pad, need_weights=need_weights,
                                          score_bias=bias)
        return out.transpose(1, 2).contiguous(), None if weights is None else weights.to(query.dtype)
    u = hybrid_weight(module, heads) if scheme == "hnas" else None
    out, weights = kernels.attend(
        query * scale,  # attend takes queries already scaled (Eq. 1's 1/sqrt(d))
        key,
        value,
        scheme=scheme,
        padding_mask=pad,
        hybrid_weight=u,
        dropout=_Dropout(dropout) if dropout > 0 else None,
        need_weights=need_weights,
        score_bias=bias,
    )
    return out.transpose(1, 2).contiguous(), weights


def _bind(scheme):
    def forward(module, query, key, value, attention_mask, **kwargs):
        return attention_forward(scheme, module, query, key, value, attention_mask, **kwargs)

    forward.__name__ = f"{scheme}_attention_forward"
    return forward


def register() -> None:
    """Register 'unas', 'dnas', 'hnas' and 'discrete' with transformers (idempotent).

    Both interfaces: without the mask function, transformers builds no mask
    for an unknown implementation and passes ``attention_mask=None``, so
    padding would be silently ignored.
    """
    for scheme in SCHEMES:
        AttentionInterface.register(scheme, _bind(scheme))
        AttentionMaskInterface.register(scheme, sdpa_mask)


register()
