"""Multi-head attention whose weights are a sampled choice of one position.

The single-stream discrete Transformer of J. Kinley (2020), Section 4.1
(Eq. 4.1): every head of every attention layer replaces softmax(L) by a draw
z_i ~ Categorical(softmax(L_i)), relaxed with Gumbel-softmax during training
and taken as the argmax at inference (``fairseq_dnas.attention.discrete``).

A subclass of fairseq's ``MultiheadAttention`` with its parameters
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), so a plain ``transformer``
checkpoint of the same shape loads into it, but it owns ``forward``: fairseq's
forward hands ordinary calls to ``F.multi_head_attention_forward`` (plain
softmax). It serves encoder self-attention, the decoder's causal
self-attention with fairseq's incremental state (keys and values of past
steps cached with fairseq's buffer names, so ``reorder_incremental_state``
and beam search work unchanged; at inference the argmax runs over the past
positions only), and encoder-decoder attention (``static_kv``).
"""

from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fairseq_dnas.attention import discrete as DA


class DiscreteMultiheadAttention(MultiheadAttention):
    """Attention with S = discrete_probs(L) in place of softmax(L).

    Args beyond fairseq's ``MultiheadAttention``:
        sampler: 'gumbel' (the discrete model) or 'soft' (S = softmax(L):
            then this module computes what fairseq's does).
        scheme: the distribution sampled from, 'unas' (softmax(L), the
            thesis) or 'dnas' (Ding et al.'s doubly-normalized probabilities;
            self-attention without a causal mask only).
        hard: straight-through one-hot samples during training.
        temperature: tau; the model sets ``gumbel_temperature`` before every
            update (annealing, ``discrete_args.apply_temperature``).
        sinkhorn_iters: DNAS rounds.
    """

    capture_name = "discrete"  # what fairseq_dnas.analysis.capture calls its weights

    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, bias=True,
                 self_attention=False, encoder_decoder_attention=False, q_noise=0.0, qn_block_size=8,
                 sampler="gumbel", scheme="unas", hard=False, temperature=1.0, sinkhorn_iters=1):
        if sampler not in DA.SAMPLERS:
            raise ValueError(f"unknown sampler {sampler!r}; choose one of {', '.join(DA.SAMPLERS)}")
        if scheme not in DA.DISCRETE_SCHEMES:
            raise ValueError(f"unknown discrete scheme {scheme!r}; choose one of {', '.join(DA.DISCRETE_SCHEMES)}")
        if scheme == "dnas" and not self_attention:
            raise ValueError("the DNAS distribution needs every query: self-attention only")
        DA.check_temperature(temperature)
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
            self_attention=self_attention, encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.sampler, self.discrete_scheme, self.gumbel_hard = sampler, scheme, hard
        self.gumbel_temperature = float(temperature)
        self.sinkhorn_iters = sinkhorn_iters

    def extra_repr(self):
        s = f"sampler={self.sampler}, scheme={self.discrete_scheme}, heads={self.num_heads}"
        if self.sampler == "gumbel":
            s += f", tau={self.gumbel_temperature:g}, hard={self.gumbel_hard}"
        return s

    def _project(self, query, key, value, static_cached: bool):
        """q (T_q, B, C) scaled, k and v (T_k, B_kv, C) or None when cached."""
        q = self.q_proj(query) * self.scaling
        if self.self_attention:
            return q, self.k_proj(query), self.v_proj(query)
        if static_cached or key is None:
            return q, None, None
        if self.encoder_decoder_attention:
            value = key  # fairseq's encoder-decoder attention reads keys and values from key
        return q, self.k_proj(key), self.v_proj(value)

    def _cached(self, incremental_state, saved_state, k, v, key_padding_mask, static_kv):
        """Append this step's keys and values to the cache (or read the
        static encoder ones), with fairseq's buffer names and shapes
        (B_kv, H, T, D), so ``reorder_incremental_state`` works unchanged."""
        if "prev_key" in saved_state:
            prev_k, prev_v = saved_state["prev_key"], saved_state["prev_value"]
            if static_kv:
                k, v = prev_k, prev_v
            else:
                k, v = torch.cat([prev_k, k], dim=2), torch.cat([prev_v, v], dim=2)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=k.size(0),
            src_len=k.size(2),
            static_kv=static_kv,
        )
        saved_state["prev_key"], saved_state["prev_value"] = k, v
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask

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
        """Input (T, B, C) as in fairseq; returns (output (T_q, B, C), S).

        S, when asked for, is (B, T_q, T_k) averaged over heads or
        (H, B, T_q, T_k) with ``need_head_weights``: the float32 attention
        this call multiplied the values with (before attention dropout).
        """
        if before_softmax:
            raise RuntimeError("discrete attention has no scores-only mode (before_softmax)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
        static_cached = saved_state is not None and "prev_key" in saved_state and static_kv
        if self.encoder_decoder_attention and key is not None and self.beam_size > 1 and bsz == key.size(1):
            # Beam search repeats the encoder output beam_size times: project
            # each sentence once, as fairseq does. (T_k, B, C) -> (T_k, B / beam, C)
            key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0, :]
        q, k, v = self._project(query, key, value, static_cached)

        # (T, B, C) -> (B, H, T, D)
        q = q.view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
        if k is not None:
            k = k.view(k.size(0), -1, heads, head_dim).permute(1, 2, 0, 3)
            v = v.view(v.size(0), -1, heads, head_dim).permute(1, 2, 0, 3)
        if saved_state is not None:
            k, v, key_padding_mask = self._cached(incremental_state, saved_state, k, v, key_padding_mask, static_kv)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None  # fairseq's placeholder for "no mask"

        # Beam search keeps one copy of the encoder keys per sentence: the
        # queries of sentence b are rows b * beam .. b * beam + beam - 1.
        kv_bsz, src_len = k.size(0), k.size(2)
        beam = bsz // kv_bsz
        # (B_kv, beam, H, T_q, D) @ (B_kv, 1, H, D, T_k) -> (B, H, T_q, T_k)
        scores = (q.view(kv_bsz, beam, heads, tgt_len, head_dim) @ k.unsqueeze(1).transpose(-1, -2)).view(
            bsz, heads, tgt_len, src_len
        )
        if key_padding_mask is not None and beam > 1:
            key_padding_mask = key_padding_mask.repeat_interleave(beam, dim=0)

        # Eq. 4.1: z_i ~ Categorical(softmax(L_i)), relaxed (training) or argmax (eval).
        probs = DA.discrete_probs(
            scores,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            tau=self.gumbel_temperature,
            hard=self.gumbel_hard,
            training=self.training,
            sampler=self.sampler,
            scheme=self.discrete_scheme,
            # DNAS normalizes each key over the real queries; in self-attention
            # the padded queries are the padded keys.
            query_padding_mask=key_padding_mask if self.discrete_scheme == "dnas" else None,
            sinkhorn_iters=self.sinkhorn_iters,
        )
        s = self.dropout_module(probs.to(v.dtype))  # attention dropout on S, as fairseq on softmax(L)

        # (B_kv, beam, H, T_q, T_k) @ (B_kv, 1, H, T_k, D) -> (B, H, T_q, D) -> (T_q, B, C)
        out = (s.view(kv_bsz, beam, heads, tgt_len, src_len) @ v.unsqueeze(1)).view(bsz, heads, tgt_len, head_dim)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))

        weights: Optional[Tensor] = None
        if need_weights:
            weights = probs.transpose(0, 1)  # (H, B, T_q, T_k), fairseq's layout
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights
