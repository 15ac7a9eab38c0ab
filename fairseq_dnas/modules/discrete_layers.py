"""fairseq encoder and decoder whose every attention is discrete (J. Kinley,
2020, Section 4.1: the single-stream discrete Transformer).

Built through fairseq's hooks only (``build_encoder_layer`` /
``build_decoder_layer`` -> ``build_self_attention`` /
``build_encoder_attention``); layer and stack forwards stay fairseq's, so the
layers are post-norm as fairseq's ``transformer`` (or pre-norm with its
``--*-normalize-before`` flags).

Which attention is discrete: all of them, encoder self-attention, decoder
causal self-attention and encoder-decoder attention, as the thesis's
single-stream model (Section 4.1 modifies the one attention equation every
layer uses; Section 2: "in our case, every layer uses discrete attentions").
``--discrete-scheme dnas`` samples from the DNAS probabilities in the
encoder's self-attention only: DNAS normalizes each key over all queries,
which a decoder that produces its queries one step at a time cannot do, so
the decoder keeps sampling from softmax(L).

Settings are read from ``cfg``: ``discrete_sampler``, ``discrete_scheme``,
``gumbel_hard``, ``gumbel_temperature``, ``sinkhorn_iters``
(``fairseq_dnas.models.discrete_args``).
"""

from fairseq.models.transformer import TransformerDecoderBase
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase

from fairseq_dnas.modules.discrete_attention import DiscreteMultiheadAttention
from fairseq_dnas.modules.dnas_encoder_layer import DNASTransformerEncoder, DNASTransformerEncoderLayer, wrap_layer


def discrete_settings(cfg, scheme: bool = False) -> dict:
    """The ``DiscreteMultiheadAttention`` keywords from ``cfg``; ``scheme``:
    this attention may use ``--discrete-scheme`` (encoder self-attention)."""
    return dict(
        sampler=cfg.discrete_sampler,
        scheme=cfg.discrete_scheme if scheme else "unas",
        hard=cfg.gumbel_hard,
        temperature=cfg.gumbel_temperature,
        sinkhorn_iters=cfg.sinkhorn_iters if scheme else 1,
    )


class DiscreteTransformerEncoderLayer(DNASTransformerEncoderLayer):
    """fairseq's encoder layer with discrete self-attention (and, from the
    parent, fairseq 0.12.2's softmax-only inference fast path switched off)."""

    attention_class = DiscreteMultiheadAttention

    @staticmethod
    def attention_settings(cfg) -> dict:
        return discrete_settings(cfg, scheme=True)


class DiscreteTransformerEncoder(DNASTransformerEncoder):
    """fairseq's Transformer encoder of ``DiscreteTransformerEncoderLayer``."""

    layer_class = DiscreteTransformerEncoderLayer

    def attention_modules(self):
        """The encoder's discrete attention modules, bottom layer first."""
        return [m for m in self.modules() if isinstance(m, DiscreteMultiheadAttention)]


class DiscreteTransformerDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with discrete causal self-attention and
    discrete encoder-decoder attention."""

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn:
            raise ValueError("discrete attention has no extra bias key/value or zero attention slot")
        return DiscreteMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **discrete_settings(cfg),
        )

    def build_encoder_attention(self, embed_dim, cfg):
        return DiscreteMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            kdim=cfg.encoder.embed_dim,
            vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout,
            encoder_decoder_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **discrete_settings(cfg),
        )


class DiscreteTransformerDecoder(TransformerDecoderBase):
    """fairseq's Transformer decoder of ``DiscreteTransformerDecoderLayer``."""

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(DiscreteTransformerDecoderLayer(cfg, no_encoder_attn), cfg)
