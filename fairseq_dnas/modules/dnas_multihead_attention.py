"""Multi-head self-attention whose normalization is UNAS, DNAS or HNAS.

A subclass of fairseq's ``MultiheadAttention`` that keeps its parameters
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``) so weights move between a
plain ``transformer`` and ``transformer_dnas`` / ``transformer_hnas``, but owns
``forward``: fairseq's own forward hands ordinary calls to
``F.multi_head_attention_forward``, so a subclass that only swapped the softmax
would silently train plain softmax attention.
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention.hybrid import HYBRID_PER, check_hybrid_init, exact_logit, hybrid_logit  # noqa: F401
from fairseq_dnas.attention.kernels import attend


def fairseq_weights(probs: Tensor, need_weights: bool, need_head_weights: bool) -> Optional[Tensor]:
    """(B, H, T_q, T_k) probabilities as fairseq returns attention weights:
    None, the mean over heads (B, T_q, T_k), or per head (H, B, T_q, T_k)."""
    if not need_weights:
        return None
    weights = probs.transpose(0, 1)
    return weights if need_head_weights else weights.mean(dim=0)


class DNASMultiheadAttention(MultiheadAttention):
    """Self-attention with scheme 'unas', 'dnas' or 'hnas' (Ding et al., 2020).

    Args beyond fairseq's ``MultiheadAttention``:
        scheme: 'unas' runs fairseq's own code path unchanged; 'dnas' the
            doubly-normalized scheme (Algorithm 1, step 4); 'hnas' the hybrid
            ``u * DNAS + (1 - u) * UNAS`` with a trainable u (Eq. 12).
        sinkhorn_iters: column/row normalization rounds (1 = the paper).
        hybrid_init: the initial u for 'hnas', in the open interval (0, 1).
        hybrid_per: 'head' (one u per head, the paper's u_l^h) or 'layer'.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        dropout=0.0,
        bias=True,
        self_attention=True,
        q_noise=0.0,
        qn_block_size=8,
        scheme="dnas",
        sinkhorn_iters=1,
        hybrid_init=0.5,
        hybrid_per="head",
    ):
        AF.check_scheme(scheme)
        AF.check_sinkhorn_iters(sinkhorn_iters)
        if not self_attention:
            raise ValueError(
                "DNASMultiheadAttention is self-attention only (the encoder's); "
                "cross-attention keeps fairseq's MultiheadAttention"
            )
        super().__init__(
            embed_dim,
            num_heads,
            dropout=dropout,
            bias=bias,
            self_attention=True,
            q_noise=q_noise,
            qn_block_size=qn_block_size,
        )
        self.scheme = scheme
        self.sinkhorn_iters = sinkhorn_iters
        if scheme == "hnas":
            self.hybrid_logit = hybrid_logit(num_heads, hybrid_init, hybrid_per)
            self.hybrid_init = hybrid_init
        else:
            self.hybrid_logit = None

    @property
    def hybrid_weight(self) -> Optional[Tensor]:
        """u per head, shape (H,), or None unless the scheme is 'hnas'."""
        if self.hybrid_logit is None:
            return None
        return torch.sigmoid(self.hybrid_logit.float()).expand(self.num_heads)

    def extra_repr(self):
        s = f"scheme={self.scheme}, heads={self.num_heads}"
        if self.scheme != "unas":
            s += f", sinkhorn_iters={self.sinkhorn_iters}"
        if self.hybrid_logit is not None:
            s += f", hybrid_per={'head' if self.hybrid_logit.numel() > 1 else 'layer'}"
        return s

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        # A plain transformer checkpoint has no hybrid weights: start them at
        # their initial value so it can be fine-tuned as HNAS.
        key = (name + "." if name else "") + "hybrid_logit"
        if self.hybrid_logit is not None and key not in state_dict:
            state_dict[key] = self.hybrid_logit.detach().new_full(
                self.hybrid_logit.shape, exact_logit(self.hybrid_init)
            )

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Input (T, B, C) as in fairseq; returns (output (T, B, C), weights).

        Weights, when asked for, are (B, T, T) averaged over heads or
        (H, B, T, T) with ``need_head_weights``, as fairseq returns them.
        """
        if self.scheme == "unas":
            return super().forward(
                query, key, value, key_padding_mask, incremental_state,
                need_weights, static_kv, attn_mask, before_softmax, need_head_weights,
            )
        if incremental_state is not None or static_kv:
            raise RuntimeError(
                "DNAS/HNAS normalizes over all queries, so it cannot run "
                "incrementally (step-by-step decoding); use it in the encoder only"
            )
        if attn_mask is not None or before_softmax:
            raise RuntimeError(
                "DNAS/HNAS encoder self-attention takes padding through "
                "key_padding_mask only (attn_mask / before_softmax are not supported)"
            )
        need_weights = need_weights or need_head_weights

        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim
        # (T, B, C) -> (B, H, T, D)
        q = (self.q_proj(query) * self.scaling).view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
        k = self.k_proj(query).view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
        v = self.v_proj(query).view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
        # Self-attention (as in fairseq, key and value are taken from query):
        # the padded queries are the padded keys.
        padding = None if key_padding_mask is None else key_padding_mask.bool()

        out, probs = attend(
            q, k, v,
            scheme=self.scheme,
            padding_mask=padding,
            hybrid_weight=self.hybrid_weight,
            sinkhorn_iters=self.sinkhorn_iters,
            dropout=self.dropout_module,
            need_weights=need_weights,
        )
        # (B, H, T, D) -> (T, B, C)
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        out = self.out_proj(out)

        return out, fairseq_weights(probs, need_weights, need_head_weights)
