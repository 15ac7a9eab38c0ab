"""The two-stream Transformer: a controller stream g that decides where to
attend and a model stream h that carries the representations (J. Kinley,
*Two-Stream Transformer Architecture With Discrete Attention*, 2020,
Section 4.2, Figure 4.2; the discrete attention itself is Section 4.1).

Per layer (post-norm, as fairseq's ``transformer``; pre-norm with
``--encoder-normalize-before``), with L_ij = q_i . k_j / sqrt(d_k) per head:

    controller:  q, k, v from g;  A = softmax(L);   g <- LN(g + W_o^g A v)
    model:       v' = h W^h;                         h <- LN(h + W_o^h S v')

and a feed-forward block per stream. S is sampled from the controller's
logits L (Gumbel-softmax in training, the argmax one-hot at inference:
``discrete_probs`` of ``fairseq_dnas.attention.discrete``), or S = A for the
"soft" variant (``--discrete-sampler soft``, the thesis's multiview model,
Section 5.3). The controller never reads h, and by default each stream has
its own first layer of word embeddings (Section 4.2: "The first layer
representations are set to the corresponding word embeddings"), so the
controller learns only through S; with ``--share-stream-embeddings`` both
streams start from one embedding (g^0 = h^0), which then also learns
through h. Downstream heads read h.

Attention dropout acts on softmax attention only: on A, and on S = A in the
soft variant, never on a Gumbel sample (the single-stream module's rule too,
``fairseq_dnas.modules.discrete_attention``).

The thesis's table (Section 4.2) lists the feed-forward block before the
attention; here each layer is fairseq's (attention, then feed-forward), so
a two-stream model whose two streams hold the same weights is exactly
fairseq's ``transformer`` (the parity the tests check).

fairseq hooks: the layers subclass fairseq's layers (the controller keeps
fairseq's parameter names: ``self_attn.{q,k,v,out}_proj``,
``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``; the model
stream's are ``model_*``), and the attention is a fairseq
``MultiheadAttention`` (its ``forward`` is the controller alone) with
``two_stream_forward`` for both streams.
"""

import math
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import LayerNorm, MultiheadAttention, PositionalEmbedding
from fairseq.modules.quant_noise import quant_noise
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor, nn

from fairseq_dnas.attention.discrete import discrete_probs, masked_scores

# The model stream's own modules in a layer (besides the attention's
# model_v_proj / model_out_proj): shared between the views of a multiview model.
MODEL_STREAM_MODULES = (
    "model_self_attn_layer_norm", "model_encoder_attn_layer_norm",
    "model_fc1", "model_fc2", "model_final_layer_norm",
)


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
    ):
        """query (Tq, B, C): the controller at the queries; key (Tk, B, C):
        the controller at the keys; model_key (Tk, B, C): the model stream at
        the keys. key_padding_mask (B, Tk) bool, True = pad; attn_mask
        fairseq's additive (Tq, Tk) mask (the causal mask).

        Returns (controller output, model output) (Tq, B, C) before the
        residual, and A, S (B, H, Tq, Tk).
        """
        q = split_heads(self.q_proj(query), self.num_heads)
        k, v, vm = self._keys_and_values(key, model_key, incremental_state, static_kv)
        logits = attention_logits(q, k)  # L
        scores = masked_scores(logits, key_padding_mask, attn_mask)  # -inf at padded/future keys
        a = F.softmax(scores, dim=-1)  # A = softmax(L), in the scores' dtype
        probs = a.to(q.dtype)
        dropped = self.dropout_module(probs)
        g_out = self.out_proj(merge_heads(torch.matmul(dropped, v)))  # W_o^g A v
        if self.sampler == "soft":
            sample = dropped  # S = A
        else:
            # Softmax(L) is sampled from the masked scores above; DNAS needs the masks itself.
            dnas = self.scheme == "dnas"
            sample = discrete_probs(
                logits if dnas else scores, key_padding_mask=key_padding_mask if dnas else None,
                attn_mask=attn_mask if dnas else None, query_padding_mask=query_padding_mask,
                tau=self.gumbel_temperature, hard=self.gumbel_hard, training=self.training,
                sampler=self.sampler, scheme=self.scheme, sinkhorn_iters=self.sinkhorn_iters,
                probs=None if dnas else a,  # softmax(L + G) from A where it can (tau = 1)
            ).to(q.dtype)
        if self.keep_sample:
            self.kept_sample = sample  # (B, H, T_q, T_k), for the receptive-field penalty
        h_out = self.model_out_proj(merge_heads(torch.matmul(sample, vm)))  # W_o^h S v'
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


# --- the residual blocks, the same for both streams and both layer kinds ------


def pre_norm(layer, x: Tensor, norm) -> Tensor:
    return norm(x) if layer.normalize_before else x


def add_norm(layer, out: Tensor, residual: Tensor, norm) -> Tensor:
    """residual + dropout(out), then LN in post-norm (fairseq's order)."""
    x = residual + layer.dropout_module(out)
    return x if layer.normalize_before else norm(x)


def feed_forward(layer, x: Tensor, fc1, fc2, norm) -> Tensor:
    """fairseq's feed-forward block with one stream's fc1, fc2 and LN."""
    y = pre_norm(layer, x, norm)
    y = fc2(layer.activation_dropout_module(layer.activation_fn(fc1(y))))
    return add_norm(layer, y, x, norm)


def add_model_stream(layer, embed_dim: int, ffn_dim: int, cross: bool) -> None:
    """The model stream's layer norms and feed-forward, beside fairseq's (the controller's)."""
    layer.model_self_attn_layer_norm = LayerNorm(embed_dim)
    layer.model_encoder_attn_layer_norm = LayerNorm(embed_dim) if cross else None
    layer.model_fc1 = layer.build_fc1(embed_dim, ffn_dim, layer.quant_noise, layer.quant_noise_block_size)
    layer.model_fc2 = layer.build_fc2(ffn_dim, embed_dim, layer.quant_noise, layer.quant_noise_block_size)
    layer.model_final_layer_norm = LayerNorm(embed_dim)


class TwoStreamEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer (the controller) with a model stream beside it."""

    model_stream_input = 1  # forward(g, h, ...): h is argument 1 (the faithfulness metric's h0)

    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc=return_fc)
        add_model_stream(self, self.embed_dim, cfg.encoder.ffn_embed_dim, cross=False)

    def build_self_attention(self, embed_dim, cfg):
        return TwoStreamAttention(
            embed_dim, cfg.encoder.attention_heads, self_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            **attention_kwargs(cfg, "encoder"),
        )

    def forward(self, g: Tensor, h: Tensor, encoder_padding_mask: Optional[Tensor] = None):
        """g, h (T, B, C) -> (g, h, A, S)."""
        gq = pre_norm(self, g, self.self_attn_layer_norm)
        hq = pre_norm(self, h, self.model_self_attn_layer_norm)
        g_att, h_att, probs, sample = self.self_attn.two_stream_forward(
            gq, gq, hq, key_padding_mask=encoder_padding_mask, query_padding_mask=encoder_padding_mask
        )
        g = add_norm(self, g_att, g, self.self_attn_layer_norm)
        h = add_norm(self, h_att, h, self.model_self_attn_layer_norm)
        g = feed_forward(self, g, self.fc1, self.fc2, self.final_layer_norm)
        h = feed_forward(self, h, self.model_fc1, self.model_fc2, self.model_final_layer_norm)
        return g, h, probs, sample


class TwoStreamDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer (the controller) with a model stream beside it.
    Encoder-decoder attention: Q from the decoder's controller, K and V from
    the encoder's controller, V' from the encoder's model stream (thesis
    Section 5.3)."""

    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)
        add_model_stream(self, self.embed_dim, cfg.decoder.ffn_embed_dim, cross=not no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        return TwoStreamAttention(
            embed_dim, cfg.decoder.attention_heads, self_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            **attention_kwargs(cfg, "decoder"),
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return TwoStreamAttention(
            embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
            **attention_kwargs(cfg, "decoder"),
        )

    def forward(self, g, h, encoder_g, encoder_h, encoder_padding_mask, incremental_state=None,
                self_attn_mask=None, self_attn_padding_mask=None):
        """g, h (T, B, C) -> (g, h, cross-attention S (B, H, T, Ts) or None)."""
        gq = pre_norm(self, g, self.self_attn_layer_norm)
        hq = pre_norm(self, h, self.model_self_attn_layer_norm)
        g_att, h_att, _, _ = self.self_attn.two_stream_forward(
            gq, gq, hq, key_padding_mask=self_attn_padding_mask, attn_mask=self_attn_mask,
            incremental_state=incremental_state,
        )
        g = add_norm(self, g_att, g, self.self_attn_layer_norm)
        h = add_norm(self, h_att, h, self.model_self_attn_layer_norm)
        cross = None
        if self.encoder_attn is not None and encoder_g is not None:
            gq = pre_norm(self, g, self.encoder_attn_layer_norm)
            g_att, h_att, _, cross = self.encoder_attn.two_stream_forward(
                gq, encoder_g, encoder_h, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True,
            )
            g = add_norm(self, g_att, g, self.encoder_attn_layer_norm)
            h = add_norm(self, h_att, h, self.model_encoder_attn_layer_norm)
        g = feed_forward(self, g, self.fc1, self.fc2, self.final_layer_norm)
        h = feed_forward(self, h, self.model_fc1, self.model_fc2, self.model_final_layer_norm)
        return g, h, cross


def zero_pads(x: Tensor, padding_mask: Tensor) -> Tensor:
    """As fairseq's encoder: embeddings of padded positions are zero."""
    return x * (1 - padding_mask.unsqueeze(-1).type_as(x))


# The controller's embedding modules and the model stream's (fairseq's) they mirror.
CONTROLLER_EMBEDDINGS = {"controller_embed_tokens": "embed_tokens", "controller_embed_positions": "embed_positions",
                         "controller_layernorm_embedding": "layernorm_embedding",
                         "controller_project_in_dim": "project_in_dim"}


def add_controller_embeddings(stack, cfg, controller_embed_tokens, max_positions: int, learned: bool) -> None:
    """The controller's own first layer (thesis Section 4.2: "The first layer
    representations are set to the corresponding word embeddings", for each
    stream): token embeddings ``controller_embed_tokens``, positions and
    embedding LayerNorm of the same kinds as the model stream's (fairseq's
    ``embed_positions``, ``layernorm_embedding``, and the decoder's
    ``project_in_dim``). With ``controller_embed_tokens`` None
    (``--share-stream-embeddings``) the controller reads the model stream's
    embedding (g^0 = h^0) and none of these exist."""
    stack.controller_embed_tokens = controller_embed_tokens
    own = controller_embed_tokens is not None
    dim = controller_embed_tokens.embedding_dim if own else None
    stack.controller_embed_positions = (
        PositionalEmbedding(max_positions, stack.embed_positions.embedding_dim, stack.padding_idx, learned=learned)
        if own and stack.embed_positions is not None else None
    )
    stack.controller_layernorm_embedding = (
        LayerNorm(stack.layernorm_embedding.normalized_shape[0], export=cfg.export)
        if own and stack.layernorm_embedding is not None else None
    )
    project_in = getattr(stack, "project_in_dim", None)
    stack.controller_project_in_dim = (
        nn.Linear(dim, project_in.out_features, bias=False) if own and project_in is not None else None
    )


def fill_controller_embeddings(state_dict, name: str) -> None:
    """A checkpoint from before each stream had its own embeddings (the
    controller read the model stream's positions and LayerNorm, and its
    token table unless untied): copy the model stream's into the controller's
    missing entries, which computes what that checkpoint computed."""
    for own, shared in CONTROLLER_EMBEDDINGS.items():
        for key in [k for k in state_dict if k.startswith(f"{name}.{shared}.")]:
            target = f"{name}.{own}." + key[len(f"{name}.{shared}."):]
            if target not in state_dict:
                state_dict[target] = state_dict[key].clone()


class TwoStreamEncoder(TransformerEncoderBase):
    """fairseq's encoder with two streams, each with its own first layer of
    word embeddings (thesis Section 4.2). ``embed_tokens``, ``embed_positions``
    and ``layernorm_embedding`` (fairseq's, the token table tied to the
    output or LM head where those are tied) embed the model stream; the
    controller has its own ``controller_embed_tokens`` (given),
    ``controller_embed_positions`` and ``controller_layernorm_embedding``.
    With ``controller_embed_tokens=None`` (``--share-stream-embeddings``) the
    controller starts from the model stream's embedding instead (g^0 = h^0),
    and the model stream's embedding parameters also learn through the
    controller's path, not through S alone.

    The output dict is fairseq's with the model stream h as ``encoder_out``
    (so fairseq's heads, decoder and generator read h) and the controller's g
    as ``controller_out``.
    """

    def __init__(self, cfg, dictionary, embed_tokens, controller_embed_tokens=None):
        super().__init__(cfg, dictionary, embed_tokens)
        add_controller_embeddings(self, cfg, controller_embed_tokens, cfg.max_source_positions,
                                  cfg.encoder.learned_pos)
        self.model_layer_norm = LayerNorm(embed_tokens.embedding_dim) if self.layer_norm is not None else None

    def controller_embedding(self, src_tokens) -> Tensor:
        """g^0 (B, T, C): fairseq's ``forward_embedding`` on the controller's own modules."""
        x = self.embed_scale * self.controller_embed_tokens(src_tokens)
        if self.controller_embed_positions is not None:
            x = x + self.controller_embed_positions(src_tokens)
        if self.controller_layernorm_embedding is not None:
            x = self.controller_layernorm_embedding(x)
        return self.dropout_module(x)

    def upgrade_state_dict_named(self, state_dict, name):
        if self.controller_embed_tokens is not None:
            fill_controller_embeddings(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def build_encoder_layer(self, cfg):
        return TwoStreamEncoderLayer(cfg)

    def forward(self, src_tokens, src_lengths=None, return_all_hiddens: bool = False,
                token_embeddings=None, return_attention: bool = False):
        padding_mask = src_tokens.eq(self.padding_idx)
        has_pads = bool(padding_mask.any())
        h, embedding = self.forward_embedding(src_tokens, token_embeddings)
        g = h if self.controller_embed_tokens is None else self.controller_embedding(src_tokens)
        if has_pads:
            g, h = zero_pads(g, padding_mask), zero_pads(h, padding_mask)
        g, h = g.transpose(0, 1), h.transpose(0, 1)  # B x T x C -> T x B x C
        states = [h] if return_all_hiddens else []
        attention = []
        for layer in self.layers:
            g, h, probs, sample = layer(g, h, padding_mask if has_pads else None)
            if return_all_hiddens:
                states.append(h)
            if return_attention:
                attention.append((probs, sample))
        if self.layer_norm is not None:
            g, h = self.layer_norm(g), self.model_layer_norm(h)
        out = {
            "encoder_out": [h],  # T x B x C: the model stream
            "controller_out": [g],  # T x B x C
            "encoder_padding_mask": [padding_mask],
            "encoder_embedding": [embedding],
            "encoder_states": states,
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }
        if return_attention:
            out["attention"] = attention  # per layer (A, S), each (B, H, T, T)
        return out

    @torch.jit.export
    def reorder_encoder_out(self, encoder_out: Dict[str, List[Tensor]], new_order):
        out = super().reorder_encoder_out(encoder_out, new_order)
        out["controller_out"] = [x.index_select(1, new_order) for x in encoder_out["controller_out"]]
        return out


class TwoStreamDecoder(TransformerDecoderBase):
    """fairseq's decoder with two streams; the output projection reads the
    model stream h. Self-attention is causal in both streams, so incremental
    decoding (argmax over the past at inference) equals full decoding."""

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None,
                 controller_embed_tokens=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        add_controller_embeddings(self, cfg, controller_embed_tokens, self.max_target_positions,
                                  cfg.decoder.learned_pos)
        self.model_layer_norm = LayerNorm(self.embed_dim) if self.layer_norm is not None else None

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return TwoStreamDecoderLayer(cfg, no_encoder_attn)

    def upgrade_state_dict_named(self, state_dict, name):
        if self.controller_embed_tokens is not None:
            fill_controller_embeddings(state_dict, name)
        return super().upgrade_state_dict_named(state_dict, name)

    def _embed(self, tokens, positions, table, project_in, layernorm):
        """fairseq's decoder embedding (scale, project in, positions, LN, dropout), T x B x C."""
        x = self.embed_scale * table(tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if project_in is not None:
            x = project_in(x)
        if positions is not None:
            x = x + positions
        if layernorm is not None:
            x = layernorm(x)
        return self.dropout_module(x).transpose(0, 1)

    def _positions(self, module, prev_output_tokens, incremental_state):
        if module is None:
            return None
        positions = module(prev_output_tokens, incremental_state=incremental_state)
        return positions[:, -1:] if incremental_state is not None else positions

    def extract_features_scriptable(self, prev_output_tokens, encoder_out, incremental_state=None,
                                    full_context_alignment=False, alignment_layer=None, alignment_heads=None):
        encoder_g = encoder_h = encoder_padding_mask = None
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            encoder_h = encoder_out["encoder_out"][0]
            encoder_g = encoder_out["controller_out"][0]
        if encoder_out is not None and len(encoder_out["encoder_padding_mask"]) > 0:
            encoder_padding_mask = encoder_out["encoder_padding_mask"][0]
        positions = self._positions(self.embed_positions, prev_output_tokens, incremental_state)
        controller_positions = self._positions(self.controller_embed_positions, prev_output_tokens, incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
        tokens = prev_output_tokens.contiguous()
        h = self._embed(tokens, positions, self.embed_tokens, self.project_in_dim, self.layernorm_embedding)
        g = h
        if self.controller_embed_tokens is not None:  # the controller's own first layer (Section 4.2)
            g = self._embed(tokens, controller_positions, self.controller_embed_tokens,
                            self.controller_project_in_dim, self.controller_layernorm_embedding)
        self_attn_padding_mask = tokens.eq(self.padding_idx) if tokens.eq(self.padding_idx).any() else None
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        attn = None
        inner_states: List[Optional[Tensor]] = [h]
        for idx, layer in enumerate(self.layers):
            mask = self.buffered_future_mask(g) if incremental_state is None and not full_context_alignment else None
            g, h, cross = layer(g, h, encoder_g, encoder_h, encoder_padding_mask, incremental_state,
                                self_attn_mask=mask, self_attn_padding_mask=self_attn_padding_mask)
            inner_states.append(h)
            if cross is not None and idx == alignment_layer:
                heads = cross if alignment_heads is None else cross[:, :alignment_heads]
                attn = heads.float().mean(dim=1).to(h)  # fairseq's alignment: mean over heads, of S
        if self.layer_norm is not None:
            g, h = self.layer_norm(g), self.model_layer_norm(h)
        h = h.transpose(0, 1)
        if self.project_out_dim is not None:
            h = self.project_out_dim(h)
        return h, {"attn": [attn], "inner_states": inner_states}


def share_model_stream(source: TwoStreamEncoder, target: TwoStreamEncoder) -> None:
    """Make ``target`` use ``source``'s model stream (the same modules, so
    one set of parameters): its embeddings, layers and final LayerNorm.
    ``target`` keeps its own controller: its layers and, unless the streams
    share embeddings, its own controller embeddings (``controller_*``). The
    multiview model's second view (thesis Section 5.3: "a separate
    controller stream for each of x_infix and x_prefix and share the same
    model stream")."""
    for name in ("embed_tokens", "embed_positions", "layernorm_embedding", "model_layer_norm"):
        setattr(target, name, getattr(source, name))
    for src, dst in zip(source.layers, target.layers):
        for name in MODEL_STREAM_MODULES:
            setattr(dst, name, getattr(src, name))
        dst.self_attn.model_v_proj = src.self_attn.model_v_proj
        dst.self_attn.model_out_proj = src.self_attn.model_out_proj
