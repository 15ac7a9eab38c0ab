"""The two-stream encoder and decoder layers (J. Kinley, 2020, Section 4.2):
fairseq's layers (the controller stream g, with fairseq's parameter names)
with the model stream h beside them (``model_*``), both streams through one
``TwoStreamAttention`` (``two_stream_attention``).

Per layer (post-norm, as fairseq's ``transformer``; pre-norm with
``--encoder-normalize-before``): g <- LN(g + W_o^g A v), h <- LN(h + W_o^h S v'),
then a feed-forward block per stream. The thesis's table (Section 4.2) lists
the feed-forward block before the attention; here each layer is fairseq's
(attention, then feed-forward), so a two-stream model whose two streams hold
the same weights is exactly fairseq's ``transformer`` (the parity the tests
check).
"""

from typing import Optional

from fairseq.modules import LayerNorm
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import Tensor

from fairseq_dnas.modules.two_stream_attention import TwoStreamAttention, attention_kwargs

# The model stream's own modules in a layer (besides the attention's
# model_v_proj / model_out_proj): shared between the views of a multiview model.
MODEL_STREAM_MODULES = (
    "model_self_attn_layer_norm", "model_encoder_attn_layer_norm",
    "model_fc1", "model_fc2", "model_final_layer_norm",
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

    def forward(self, g: Tensor, h: Tensor, encoder_padding_mask: Optional[Tensor] = None, need_sample: bool = True):
        """g, h (T, B, C) -> (g, h, A, S); at inference S is None unless
        ``need_sample`` (``TwoStreamAttention.two_stream_forward``)."""
        gq = pre_norm(self, g, self.self_attn_layer_norm)
        hq = pre_norm(self, h, self.model_self_attn_layer_norm)
        g_att, h_att, probs, sample = self.self_attn.two_stream_forward(
            gq, gq, hq, key_padding_mask=encoder_padding_mask, query_padding_mask=encoder_padding_mask,
            need_sample=need_sample,
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
                self_attn_mask=None, self_attn_padding_mask=None, need_attn: bool = True):
        """g, h (T, B, C) -> (g, h, cross-attention S (B, H, T, Ts) or None);
        at inference S only when ``need_attn`` (the alignment layer)."""
        gq = pre_norm(self, g, self.self_attn_layer_norm)
        hq = pre_norm(self, h, self.model_self_attn_layer_norm)
        g_att, h_att, _, _ = self.self_attn.two_stream_forward(
            gq, gq, hq, key_padding_mask=self_attn_padding_mask, attn_mask=self_attn_mask,
            incremental_state=incremental_state, need_sample=False,
        )
        g = add_norm(self, g_att, g, self.self_attn_layer_norm)
        h = add_norm(self, h_att, h, self.model_self_attn_layer_norm)
        cross = None
        if self.encoder_attn is not None and encoder_g is not None:
            gq = pre_norm(self, g, self.encoder_attn_layer_norm)
            g_att, h_att, _, cross = self.encoder_attn.two_stream_forward(
                gq, encoder_g, encoder_h, key_padding_mask=encoder_padding_mask,
                incremental_state=incremental_state, static_kv=True, need_sample=need_attn,
            )
            g = add_norm(self, g_att, g, self.encoder_attn_layer_norm)
            h = add_norm(self, h_att, h, self.model_encoder_attn_layer_norm)
        g = feed_forward(self, g, self.fc1, self.fc2, self.final_layer_norm)
        h = feed_forward(self, h, self.model_fc1, self.model_fc2, self.model_final_layer_norm)
        return g, h, cross
