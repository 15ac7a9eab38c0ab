"""DNAS/HNAS attention for any PyTorch model: a drop-in ``torch.nn.MultiheadAttention``.

    from fairseq_dnas.nn import MultiheadAttention
    attn = MultiheadAttention(256, 8, batch_first=True, scheme="hnas")
    out, weights = attn(primary, secondary, secondary, key_padding_mask=sec_pad,
                        query_padding_mask=prim_pad)

A subclass of ``torch.nn.MultiheadAttention``: the same constructor, parameters
(``in_proj_weight`` or ``q/k/v_proj_weight``, ``in_proj_bias``, ``out_proj``),
initialization and ``state_dict`` names, so weights move both ways with
``load_state_dict``; HNAS adds one entry, ``hybrid_logit`` (u = its sigmoid),
which starts at ``hybrid_init`` when a plain torch state dict is loaded.
'unas' runs torch's own forward, so it is torch's module exactly.
'dnas' and 'hnas' run the projections here and the attention on the
execution paths of ``fairseq_dnas.attention.kernels.attend`` (dense with a
hand-written backward, or fused without a T_q x T_k matrix when
``need_weights=False`` and the inputs are long).

Masks for DNAS/HNAS. Each key is normalized over every real query (Algorithm 1,
step 4), so:
- ``key_padding_mask`` (B, T_k) removes keys, as in torch;
- ``query_padding_mask`` (B, T_q) removes queries from those column sums
  (their output rows are then the output projection's bias). When it is None
  and ``query is key`` (self-attention), the key padding mask is used for the
  queries too: padded positions must not change the real ones. For
  cross-attention None means no padded query;
- ``attn_mask`` is accepted only when it is the same for every query (then it
  is a key mask); a causal or otherwise query-dependent mask is refused, since
  a key's column sum needs every query. Additive float masks must hold only
  0 and -inf.

Importing this module does not import fairseq.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention.hybrid import exact_logit, hybrid_logit
from fairseq_dnas.attention.kernels import attend


def _blocked(mask: Tensor, name: str) -> Tensor:
    """A bool mask (True = blocked) from torch's bool or additive float form."""
    if mask.dtype == torch.bool:
        return mask
    if mask.is_floating_point():
        ninf = mask == float("-inf")
        if not bool((ninf | (mask == 0)).all()):
            raise ValueError(
                f"{name}: an additive float mask with values other than 0 and -inf is a bias, "
                "which DNAS/HNAS do not take; pass a bool mask (True = blocked)"
            )
        return ninf
    raise ValueError(f"{name} must be a bool or float tensor; got {mask.dtype}")


def _check_shape(mask: Tensor, name: str, shape: Tuple[int, ...]) -> Tensor:
    if tuple(mask.shape) != shape:
        raise ValueError(f"{name} must have shape {shape} (True at padding); got {tuple(mask.shape)}")
    return mask


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` with scheme 'unas', 'dnas' or 'hnas'.

    Args (beyond torch's, keyword-only):
        scheme: 'dnas' (default: the doubly-normalized attention this class
            exists for), 'hnas' (u * DNAS + (1 - u) * UNAS) or 'unas' (torch).
        sinkhorn_iters: (column, row) normalization rounds; 1 is the paper's DNAS.
        hybrid_init: initial u for 'hnas', in (0, 1) (paper: 0.5 for VQA).
        hybrid_per: 'head' (one u per head) or 'layer' (one u for all heads).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, scheme="dnas", sinkhorn_iters=1, hybrid_init=0.5, hybrid_per="head"):
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn,
                         kdim, vdim, batch_first, device, dtype)
        AF.check_scheme(scheme)
        AF.check_sinkhorn_iters(sinkhorn_iters)
        if scheme != "unas" and (add_bias_kv or add_zero_attn):
            raise ValueError(
                f"add_bias_kv and add_zero_attn append keys that are not in the input; scheme "
                f"{scheme!r} does not support them (use scheme='unas', or add such keys to the input)"
            )
        self.scheme = scheme
        self.sinkhorn_iters = sinkhorn_iters
        self.hybrid_init = hybrid_init
        self.hybrid_logit = None
        if scheme == "hnas":
            self.hybrid_logit = hybrid_logit(num_heads, hybrid_init, hybrid_per, name="hybrid_init",
                                             fixed="scheme='unas' or 'dnas'", device=device)
        # The attention dropout as a module, so that attend() sees p and the
        # train/eval state (a float p stays in self.dropout, as torch has it).
        self.attn_dropout = nn.Dropout(dropout)
        if scheme != "unas":
            # nn.TransformerEncoderLayer's inference fast path reads this
            # module's weights and runs torch's fused softmax attention,
            # bypassing forward(); it is skipped when any submodule has a
            # hook, so DNAS/HNAS keep one that does nothing.
            self.register_forward_pre_hook(_keeps_torch_fast_paths_off)

    @property
    def hybrid_weight(self) -> Optional[Tensor]:
        """u per head, shape (H,), in [0, 1]; None unless scheme is 'hnas'."""
        if self.hybrid_logit is None:
            return None
        return torch.sigmoid(self.hybrid_logit.float()).expand(self.num_heads)

    def extra_repr(self) -> str:
        s = f"scheme={self.scheme}"
        if self.scheme != "unas":
            s += f", sinkhorn_iters={self.sinkhorn_iters}"
        if self.hybrid_logit is not None:
            s += f", hybrid_per={'head' if self.hybrid_logit.numel() > 1 else 'layer'}"
        return s

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A torch.nn.MultiheadAttention state dict has no hybrid weights:
        # they start at hybrid_init.
        key = prefix + "hybrid_logit"
        if self.hybrid_logit is not None and key not in state_dict:
            state_dict[key] = torch.full_like(self.hybrid_logit, exact_logit(self.hybrid_init))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False, query_padding_mask: Optional[Tensor] = None):
        """torch's forward, plus ``query_padding_mask`` (B, T_q), True at padded
        queries (only DNAS/HNAS use it: under UNAS queries do not interact)."""
        if self.scheme == "unas":
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   need_weights=need_weights, attn_mask=attn_mask,
                                   average_attn_weights=average_attn_weights, is_causal=is_causal)
        if is_causal:
            raise ValueError(self._query_dependent("is_causal=True"))
        self_attention = query is key
        batched = query.dim() == 3
        if not batched:  # (T, E) -> (T, 1, E); masks (T,) -> (1, T)
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            key_padding_mask, query_padding_mask = (
                None if m is None else m.unsqueeze(0) for m in (key_padding_mask, query_padding_mask))
        elif self.batch_first:  # (B, T, E) -> (T, B, E)
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        t_q, bsz, _ = query.shape
        t_k = key.shape[0]

        kpad = None
        if key_padding_mask is not None:
            kpad = _check_shape(_blocked(key_padding_mask, "key_padding_mask"), "key_padding_mask", (bsz, t_k))
        qpad = None
        if query_padding_mask is not None:
            qpad = _check_shape(query_padding_mask, "query_padding_mask", (bsz, t_q)).bool()
        elif self_attention and kpad is not None and t_q == t_k:
            qpad = kpad
        keys_blocked = self._key_mask(attn_mask, bsz, t_q, t_k)
        if keys_blocked is not None:
            kpad = keys_blocked if kpad is None else kpad | keys_blocked
        if kpad is not None and qpad is None:
            qpad = torch.zeros(bsz, t_q, dtype=torch.bool, device=query.device)

        out, probs = attend(
            self._heads(query, 0, t_q) * self.head_dim ** -0.5,  # scaled queries (B, H, T_q, D)
            self._heads(key, 1, t_k),
            self._heads(value, 2, t_k),
            scheme=self.scheme,
            padding_mask=kpad,
            query_padding_mask=qpad,
            hybrid_weight=self.hybrid_weight,
            sinkhorn_iters=self.sinkhorn_iters,
            dropout=self.attn_dropout,
            need_weights=need_weights,
        )
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(t_q, bsz, self.embed_dim))  # (T_q, B, E)
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        weights = None
        if need_weights:
            weights = (probs.mean(dim=1) if average_attn_weights else probs).to(out.dtype)
            if not batched:
                weights = weights.squeeze(0)
        return out, weights

    def _heads(self, x: Tensor, which: int, length: int) -> Tensor:
        """Input projection ``which`` (0 q, 1 k, 2 v) of x (T, B, E_in) -> (B, H, T, D)."""
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            weight = self.in_proj_weight[which * e:(which + 1) * e]
        else:
            weight = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[which]
        bias = None if self.in_proj_bias is None else self.in_proj_bias[which * e:(which + 1) * e]
        y = F.linear(x, weight, bias)  # (T, B, E)
        return y.view(length, -1, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _key_mask(self, attn_mask: Optional[Tensor], bsz: int, t_q: int, t_k: int) -> Optional[Tensor]:
        """attn_mask (T_q, T_k) or (B * H, T_q, T_k) -> (B, T_k) blocked keys, if
        it is the same for every query (and head); refused otherwise."""
        if attn_mask is None:
            return None
        blocked = _blocked(attn_mask, "attn_mask")
        if blocked.dim() == 2:
            blocked = _check_shape(blocked, "attn_mask", (t_q, t_k)).unsqueeze(0)
        else:
            blocked = _check_shape(blocked, "attn_mask", (bsz * self.num_heads, t_q, t_k))
        if not bool((blocked == blocked[:, :1]).all()):
            raise ValueError(self._query_dependent("an attn_mask that differs between queries"))
        keys = blocked[:, 0]  # (1 or B * H, T_k)
        if keys.shape[0] > 1:
            keys = keys.view(bsz, self.num_heads, t_k)
            if not bool((keys == keys[:, :1]).all()):
                raise ValueError(f"attn_mask differs between heads; scheme {self.scheme!r} takes "
                                 "only masks that are the same for every head (a key mask)")
            keys = keys[:, 0]
        return keys.expand(bsz, t_k)

    def _query_dependent(self, what: str) -> str:
        return (f"scheme {self.scheme!r} cannot take {what} (a causal or otherwise query-dependent "
                "mask): it normalizes each key over every query (Algorithm 1, step 4), so no query "
                "can be hidden from some keys only. Use scheme='unas' for causal attention, and "
                "key_padding_mask / query_padding_mask for padding")


def _keeps_torch_fast_paths_off(module, args):
    """A no-op forward pre-hook (see MultiheadAttention.__init__)."""
    return None


__all__ = ["MultiheadAttention"]
