"""The two-stream attention (J. Kinley, 2020, Section 4.2, Figure 4.2): the
controller's softmax attention A and the model stream's attention S sampled
from the controller's logits (Section 4.1), in one fairseq
``MultiheadAttention`` subclass. The layers and stacks around it are in
``two_stream_layers`` and ``two_stream``.

Attention dropout acts on softmax attention only: on A, and on S = A in the
soft variant, never on a Gumbel sample (the single-stream module's rule too,
``fairseq_dnas.modules.discrete_attention``).
"""

import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from fairseq.modules.quant_noise import quant_noise
from torch import Tensor, nn

from fairseq_dnas.attention.discrete import argmax_attention, discrete_probs, distribution_logits, masked_scores


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(T, B, C) -> (B, H, T, C / H)."""
    t, b, c = x.shape
    return x.reshape(t, b, num_heads, c // num_heads).permute(1, 2, 0, 3)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (T, B, H * d)."""
    b, h, t, d = x.shape
    return x.permute(2, 0, 1, 3).reshape(t, b, h * d)


def attention_logits(q: Tensor, k: Tensor) -> Tensor:
    """L = Q K^T / sqrt(d_k) per head (thesis Section 3.2.1); q (B, H, Tq, d),
    k (B, H, Tk, d). q is scaled first, as fairseq does."""
    return torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-1, -2))


class AttentionTap(nn.Module):
    """Identity on (A, S): a module call, so that forward hooks (the
    analysis capture, ``fairseq_dnas.analysis.capture``) see both
    attentions as the model used them. No parameters."""

    def forward(self, probs: Tensor, sample: Tensor):
        return probs, sample


class TwoStreamAttention(MultiheadAttention):
    """Controller attention (fairseq's q_proj, k_proj, v_proj, out_proj) plus
    the model stream's value projection W^h (``model_v_proj``) and output
    projection W_o^h (``model_out_proj``).

    ``forward`` is fairseq's (the controller alone); ``two_stream_forward``
    runs both streams and returns A and S.

    ``sampler``: 'gumbel' (S sampled from L; the sample is the noise, no
    attention dropout on it) or 'soft' (S = A, after the attention dropout,
    so the soft model with tied streams is fairseq's).
    ``scheme`` 'dnas' samples from the DNAS distribution instead of
    softmax(L) (encoder self-attention only); the controller's A stays
    softmax(L).
    """

    capture_name = "two_stream"  # fairseq_dnas.analysis.capture reads A and S from attention_tap

    def __init__(self, embed_dim, num_heads, *, sampler="gumbel", scheme="unas", sinkhorn_iters=1,
                 gumbel_temperature=1.0, gumbel_hard=False, kdim=None, dropout=0.0,
                 self_attention=False, encoder_decoder_attention=False, q_noise=0.0, qn_block_size=8):
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=kdim, dropout=dropout, self_attention=self_attention,
            encoder_decoder_attention=encoder_decoder_attention, q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.model_v_proj = quant_noise(nn.Linear(kdim or embed_dim, embed_dim), q_noise, qn_block_size)
        self.model_out_proj = quant_noise(nn.Linear(embed_dim, embed_dim), q_noise, qn_block_size)
        # As fairseq initializes v_proj and out_proj.
        nn.init.xavier_uniform_(self.model_v_proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.model_out_proj.weight)
        nn.init.constant_(self.model_out_proj.bias, 0.0)
        self.sampler = sampler
        self.scheme = scheme
        self.sinkhorn_iters = sinkhorn_iters
        self.gumbel_temperature = gumbel_temperature  # set per update by the model's set_num_updates
        self.gumbel_hard = gumbel_hard
        self.attention_tap = AttentionTap()
        # The receptive-field penalty (criterions/receptive_field_penalty.py) asks for
        # the S of each forward, with its graph.
        self.keep_sample = False
        self.kept_sample: Optional[Tensor] = None

    def _keys_and_values(self, key, model_key, incremental_state, static_kv):
        """K, V (controller) and V' (model stream), (B, H, Tk, d), with the
        incremental cache: static (encoder) keys are projected once, the
        decoder's own keys grow by one position per step."""
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else {}
        if static_kv and "prev_key" in saved:
            return saved["prev_key"], saved["prev_value"], saved["prev_model_value"]
        h = self.num_heads
        k = split_heads(self.k_proj(key), h)
        v = split_heads(self.v_proj(key), h)
        vm = split_heads(self.model_v_proj(model_key), h)  # V' = h W^h
        if "prev_key" in saved:
            k = torch.cat([saved["prev_key"], k], dim=2)
            v = torch.cat([saved["prev_value"], v], dim=2)
            vm = torch.cat([saved["prev_model_value"], vm], dim=2)
        if incremental_state is not None:
            # Batch first, so fairseq's reorder_incremental_state reorders them for beam search.
            self._set_input_buffer(incremental_state, {"prev_key": k, "prev_value": v, "prev_model_value": vm})
        return k, v, vm

    def two_stream_forward(
        self,
        query: Tensor,
        key: Tensor,
        model_key: Tensor,
        key_padding_mask: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        static_kv: bool = False,
        query_padding_mask: Optional[Tensor] = None,
        need_sample: bool = True,
    ):
        """query (Tq, B, C): the controller at the queries; key (Tk, B, C):
        the controller at the keys; model_key (Tk, B, C): the model stream at
        the keys. key_padding_mask (B, Tk) bool, True = pad; attn_mask
        fairseq's additive (Tq, Tk) mask (the causal mask).

        Returns (controller output, model output) (Tq, B, C) before the
        residual, and A, S (B, H, Tq, Tk). At inference the model stream
        takes its values by index (``argmax_attention``) and S, the one-hot,
        is built only when ``need_sample``, the receptive-field penalty
        (``keep_sample``) or a hook on ``attention_tap`` asks for it (else
        None).
        """
        q = split_heads(self.q_proj(query), self.num_heads)
        k, v, vm = self._keys_and_values(key, model_key, incremental_state, static_kv)
        logits = attention_logits(q, k)  # L
        scores = masked_scores(logits, key_padding_mask, attn_mask)  # -inf at padded/future keys
        a = F.softmax(scores, dim=-1)  # A = softmax(L), in the scores' dtype
        probs = a.to(q.dtype)
        dropped = self.dropout_module(probs)
        g_out = self.out_proj(merge_heads(torch.matmul(dropped, v)))  # W_o^g A v
        dnas = self.scheme == "dnas"
        if self.sampler == "soft":
            sample = dropped  # S = A
        elif not self.training:
            # Inference: h's row i is v'_{z_i}, z_i = argmax_j L_ij, a gather (Section 1)
            want = need_sample or self.keep_sample or bool(self.attention_tap._forward_hooks)
            out, sample = argmax_attention(
                distribution_logits(logits, scheme="dnas", key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                    query_padding_mask=query_padding_mask, sinkhorn_iters=self.sinkhorn_iters)
                if dnas else scores, vm, need_weights=want)
            sample = None if sample is None else sample.to(q.dtype)
            return self._finish(g_out, out, probs, sample)
        else:
            # Softmax(L) is sampled from the masked scores above; DNAS needs the masks itself.
            sample = discrete_probs(
                logits if dnas else scores, key_padding_mask=key_padding_mask if dnas else None,
                attn_mask=attn_mask if dnas else None, query_padding_mask=query_padding_mask,
                tau=self.gumbel_temperature, hard=self.gumbel_hard, training=self.training,
                sampler=self.sampler, scheme=self.scheme, sinkhorn_iters=self.sinkhorn_iters,
                probs=None if dnas else a,  # softmax(L + G) from A where it can (tau = 1)
            ).to(q.dtype)
        return self._finish(g_out, torch.matmul(sample, vm), probs, sample)

    def _finish(self, g_out: Tensor, model_attended: Tensor, probs: Tensor, sample: Optional[Tensor]):
        """The model stream's output projection, and S handed to the
        receptive-field penalty and the analysis tap."""
        if self.keep_sample:
            self.kept_sample = sample  # (B, H, T_q, T_k), for the receptive-field penalty
        h_out = self.model_out_proj(merge_heads(model_attended))  # W_o^h S v'
        self.attention_tap(probs, sample)  # identity; what the analysis hooks read
        return g_out, h_out, probs, sample


def attention_kwargs(cfg, side: str) -> dict:
    """TwoStreamAttention settings from the model's flags (``discrete_defaults``).
    The DNAS distribution needs every query, so only the encoder's
    self-attention samples from it."""
    return dict(
        sampler=cfg.discrete_sampler,
        scheme=cfg.discrete_scheme if side == "encoder" else "unas",
        sinkhorn_iters=cfg.sinkhorn_iters,
        gumbel_temperature=cfg.gumbel_temperature,
        gumbel_hard=cfg.gumbel_hard,
        dropout=cfg.attention_dropout,
    )
