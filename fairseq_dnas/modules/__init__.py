"""fairseq modules: the attention module and the encoder built around it."""

from fairseq_dnas.modules.dnas_encoder_layer import (
    DNASTransformerEncoder,
    DNASTransformerEncoderLayer,
)
from fairseq_dnas.modules.dnas_multihead_attention import DNASMultiheadAttention

__all__ = ["DNASMultiheadAttention", "DNASTransformerEncoder", "DNASTransformerEncoderLayer"]
