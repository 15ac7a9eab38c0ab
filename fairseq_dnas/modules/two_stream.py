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

The attention is in ``two_stream_attention``, the layers in
``two_stream_layers``; this module holds the stacks (embeddings, encoder,
decoder) around them.
"""

from typing import Dict, List, Optional

import torch
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules import LayerNorm, PositionalEmbedding
from torch import Tensor, nn

from fairseq_dnas.modules.two_stream_layers import MODEL_STREAM_MODULES, TwoStreamDecoderLayer, TwoStreamEncoderLayer


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
            g, h, probs, sample = layer(g, h, padding_mask if has_pads else None, need_sample=return_attention)
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
                                self_attn_mask=mask, self_attn_padding_mask=self_attn_padding_mask,
                                need_attn=idx == alignment_layer)
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
