"""fairseq encoder layer and encoder whose self-attention is UNAS, DNAS or HNAS.

Both extend fairseq through its hooks (``build_encoder_layer`` ->
``build_self_attention``); the layer and encoder forwards stay fairseq's.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerEncoderBase
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from fairseq_dnas.modules.dnas_multihead_attention import DNASMultiheadAttention


class DNASTransformerEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with a ``DNASMultiheadAttention`` inside
    (``attention_class``, built with ``attention_settings(cfg)``).

    The scheme settings are read from ``cfg`` (``encoder_attention_scheme``,
    ``sinkhorn_iters``, ``hybrid_init``, ``hybrid_weight_per``).
    """

    # PyPI fairseq 0.12.2 gives the encoder layer an inference fast path
    # (``torch._transformer_encoder_layer_fwd``, plain softmax) that switches on
    # once a checkpoint is loaded (``load_to_BT``) and the model is in eval
    # mode. It is gated on ``can_use_fastpath``: pin that to False so the
    # scheme runs after loading too. (Newer fairseq has no fast path; this is
    # then a harmless attribute.)
    @property
    def can_use_fastpath(self):
        return False

    @can_use_fastpath.setter
    def can_use_fastpath(self, value):
        pass  # fairseq 0.12.2's __init__ assigns it; ignore that

    attention_class = DNASMultiheadAttention

    @staticmethod
    def attention_settings(cfg) -> dict:
        """``attention_class``'s own keywords, read from ``cfg``."""
        return dict(scheme=cfg.encoder_attention_scheme, sinkhorn_iters=cfg.sinkhorn_iters,
                    hybrid_init=cfg.hybrid_init, hybrid_per=cfg.hybrid_weight_per)

    def build_self_attention(self, embed_dim, cfg):
        return self.attention_class(
            embed_dim,
            cfg.encoder.attention_heads,
            dropout=cfg.attention_dropout,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **self.attention_settings(cfg),
        )


def wrap_layer(layer, cfg):
    """The wrapping of fairseq's ``build_encoder_layer`` / ``build_decoder_layer``:
    activation checkpointing, then FSDP (always, when checkpointing)."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not checkpoint else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


class DNASTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder built from ``layer_class`` layers
    (``DNASTransformerEncoderLayer`` here)."""

    layer_class = DNASTransformerEncoderLayer

    def build_encoder_layer(self, cfg):
        return wrap_layer(self.layer_class(cfg, return_fc=self.return_fc), cfg)

    def attention_modules(self):
        """The encoder's DNASMultiheadAttention modules, bottom layer first."""
        return [m for m in self.modules() if isinstance(m, DNASMultiheadAttention)]

    def hybrid_weights(self):
        """u per encoder layer and head as a (layers, heads) list of lists,
        or None unless the encoder is HNAS (the models' ``hybrid_weights()``)."""
        mods = self.attention_modules()
        if not mods or mods[0].hybrid_weight is None:
            return None
        return [m.hybrid_weight.detach().cpu().tolist() for m in mods]
