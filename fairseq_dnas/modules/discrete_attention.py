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
from fairseq_dnas.attention import gumbel_schedule as GS
from fairseq_dnas.modules.dnas_multihead_attention import fairseq_weights

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class DiscreteMultiheadAttention(MultiheadAttention):
    """Attention with S = discrete_probs(L) in place of softmax(L).

    Attention dropout (``dropout``) acts on softmax attention only: on S =
    softmax(L) with ``sampler='soft'``, never on a Gumbel sample (the rule of
    the two-stream module too, docs/math.md): Eq. 4.1's output row is the
    value at one sampled position, V_{z_i}, and dropping entries of a
    (nearly) one-hot row would zero or rescale that whole value instead; the
    sample is already the noise.

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
        GS.check_temperature(temperature)
        super().__init__(
            embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout, bias=bias,
            self_attention=self_attention, encoder_decoder_attention=encoder_decoder_attention,
            q_noise=q_noise, qn_block_size=qn_block_size,
        )
        self.sampler, self.discrete_scheme, self.gumbel_hard = sampler, scheme, hard
        self.gumbel_temperature = float(temperature)
        self.sinkhorn_iters = sinkhorn_iters
        # The receptive-field penalty (criterions/receptive_field_penalty.py) asks for
        # the S of each forward, with its graph.
        self.keep_sample = False
        self.kept_sample: Optional[Tensor] = None

    def extra_repr(self):
        s = f"sampler={self.sampler}, scheme={self.discrete_scheme}, heads={self.num_heads}"
        if self.sampler == "gumbel":
            s += f", tau={self.gumbel_temperature:g}, hard={self.gumbel_hard}"
        return s

    def _project(self, query, key, value, static_cached: bool):
        """q (T_q, B, C) (not yet scaled by 1 / sqrt(d_k)), k and v (T_k,
        B_kv, C) or None when cached."""
        q = self.q_proj(query)
        if self.self_attention:
            return q, self.k_proj(query), self.v_proj(query)
        if static_cached or key is None:
            return q, None, None
        if self.encoder_decoder_attention:
            value = key  # fairseq's encoder-decoder attention reads keys and values from key
        return q, self.k_proj(key), self.v_proj(value)

    def _cached(self, incremental_state, saved_state, k, v, key_padding_mask, static_kv, kv_bsz):
        """Append this step's keys and values to the cache (or read the
        static encoder ones), with fairseq's buffer names and shapes
        (B_kv, H, T, D), so ``reorder_incremental_state`` works unchanged.
        k, v: (B_kv * H, T, D) or None; returns them with the past."""
        heads, head_dim = self.num_heads, self.head_dim
        if "prev_key" in saved_state:
            kv_bsz = saved_state["prev_key"].size(0)
            prev_k = saved_state["prev_key"].view(kv_bsz * heads, -1, head_dim)
            prev_v = saved_state["prev_value"].view(kv_bsz * heads, -1, head_dim)
            if static_kv:
                k, v = prev_k, prev_v
            else:
                k, v = torch.cat([prev_k, k], dim=1), torch.cat([prev_v, v], dim=1)
        key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
            key_padding_mask=key_padding_mask,
            prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
            batch_size=kv_bsz,
            src_len=k.size(1),
            static_kv=static_kv,
        )
        saved_state["prev_key"] = k.view(kv_bsz, heads, -1, head_dim)
        saved_state["prev_value"] = v.view(kv_bsz, heads, -1, head_dim)
        saved_state["prev_key_padding_mask"] = key_padding_mask
        self._set_input_buffer(incremental_state, saved_state)
        return k, v, key_padding_mask

    def _fused(self, need_weights: bool, beam: int) -> bool:
        """The training hot path (relaxed sample of softmax(L), weights not
        asked for) runs through torch's fused attention, ``gumbel_attention``."""
        return (self.training and self.sampler == "gumbel" and not self.gumbel_hard
                and self.discrete_scheme == "unas" and not need_weights and beam == 1
                and not self.keep_sample)  # the fused kernel keeps no S

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state: Optional[IncrementalState] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """fairseq's ``MultiheadAttention.forward`` arguments; input (T, B, C);
        returns (output (T_q, B, C), S).

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

        # (T, B, C) -> (B * H, T, D), as fairseq lays out heads
        q = q.contiguous().view(tgt_len, bsz * heads, head_dim).transpose(0, 1)
        kv_bsz = bsz if k is None else k.size(1)
        if k is not None:
            k = k.contiguous().view(k.size(0), kv_bsz * heads, head_dim).transpose(0, 1)
            v = v.contiguous().view(v.size(0), kv_bsz * heads, head_dim).transpose(0, 1)
        if saved_state is not None:
            k, v, key_padding_mask = self._cached(
                incremental_state, saved_state, k, v, key_padding_mask, static_kv, kv_bsz
            )
            kv_bsz = k.size(0) // heads
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None  # fairseq's placeholder for "no mask"
        src_len = k.size(1)
        # Beam search keeps one copy of the encoder keys per sentence: the
        # queries of sentence b are rows b * beam .. b * beam + beam - 1.
        beam = bsz // kv_bsz

        if self._fused(need_weights, beam):
            # Eq. 4.1, relaxed: S v with S = softmax((L + G) / tau), fused.
            out = DA.gumbel_attention(
                q.view(bsz, heads, tgt_len, head_dim),
                k.view(bsz, heads, src_len, head_dim),
                v.view(bsz, heads, src_len, head_dim),
                scale=self.scaling,  # 1 / sqrt(d_k), applied inside the fused kernel
                tau=self.gumbel_temperature,
                key_padding_mask=key_padding_mask,
                attn_mask=attn_mask,
                dropout_p=0.0,  # no attention dropout on a Gumbel sample (class docstring)
            )
            out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)  # (B, H, T, D) -> (T, B, C)
            return self.out_proj(out), None

        q = q * self.scaling
        if beam == 1:
            scores = torch.bmm(q, k.transpose(1, 2))  # (B * H, T_q, T_k)
        else:  # (B_kv, beam, H, T_q, D) @ (B_kv, 1, H, D, T_k)
            scores = q.reshape(kv_bsz, beam, heads, tgt_len, head_dim) @ k.view(
                kv_bsz, 1, heads, src_len, head_dim).transpose(-1, -2)
            key_padding_mask = None if key_padding_mask is None else key_padding_mask.repeat_interleave(beam, 0)

        if not self.training and self.sampler == "gumbel":
            return self._argmax_forward(scores, v, key_padding_mask, attn_mask, kv_bsz, beam, need_weights,
                                        need_head_weights)

        # Eq. 4.1: z_i ~ Categorical(softmax(L_i)), relaxed (training) or argmax (eval).
        probs = DA.discrete_probs(
            scores.view(bsz, heads, tgt_len, src_len),
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
        if self.keep_sample:
            self.kept_sample = probs  # (B, H, T_q, T_k), for the receptive-field penalty
        s = probs.to(v.dtype)
        if self.sampler == "soft":
            s = self.dropout_module(s)  # attention dropout on S = softmax(L), as fairseq's; none on a sample
        if beam == 1:
            out = torch.bmm(s.view(bsz * heads, tgt_len, src_len), v)  # (B * H, T_q, D)
        else:
            out = s.view(kv_bsz, beam, heads, tgt_len, src_len) @ v.view(kv_bsz, 1, heads, src_len, head_dim)
        out = out.reshape(bsz, heads, tgt_len, head_dim).permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        out = self.out_proj(out)

        return out, fairseq_weights(probs, need_weights, need_head_weights)

    def _argmax_forward(self, scores: Tensor, v: Tensor, key_padding_mask: Optional[Tensor],
                        attn_mask: Optional[Tensor], kv_bsz: int, beam: int, need_weights: bool,
                        need_head_weights: bool) -> Tuple[Tensor, Optional[Tensor]]:
        """Inference: each row takes the value at z_i = argmax_j L_ij (Eq.
        4.1, Section 1), gathered by index (``argmax_attention``), the same
        output bit for bit as the one-hot product; the one-hot S is built
        only for the callers that ask for it. scores as ``forward`` has
        them, (B * H, T_q, T_k) or (B_kv, beam, H, T_q, T_k); v (B_kv * H,
        T_k, D)."""
        heads, head_dim = self.num_heads, self.head_dim
        bsz, tgt_len, src_len = kv_bsz * beam, scores.size(-2), scores.size(-1)
        logits = DA.distribution_logits(
            scores.view(bsz, heads, tgt_len, src_len), scheme=self.discrete_scheme,
            key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            query_padding_mask=key_padding_mask if self.discrete_scheme == "dnas" else None,
            sinkhorn_iters=self.sinkhorn_iters,
        )
        # (B_kv, beam, H, ...): the beam's queries share their sentence's values
        out, probs = DA.argmax_attention(
            logits.view(kv_bsz, beam, heads, tgt_len, src_len), v.view(kv_bsz, 1, heads, src_len, head_dim),
            need_weights=need_weights or self.keep_sample,
        )
        if probs is not None:
            probs = probs.view(bsz, heads, tgt_len, src_len)
        if self.keep_sample:
            self.kept_sample = probs
        out = out.reshape(bsz, heads, tgt_len, head_dim).permute(2, 0, 1, 3).reshape(tgt_len, bsz, self.embed_dim)
        return self.out_proj(out), fairseq_weights(probs, need_weights, need_head_weights)
