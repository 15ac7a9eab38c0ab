"""fairseq modules: the attention module and the encoder built around it."""

from fairseq_dnas.modules.dnas_encoder_layer import (
    DNASTransformerEncoder,
    DNASTransformerEncoderLayer,
)
from fairseq_dnas.modules.dnas_multihead_attention import DNASMultiheadAttention

__all__ = ["DNASMultiheadAttention", "DNASTransformerEncoder", "DNASTransformerEncoderLayer"]

from fairseq_dnas import register_with_fairseq  # noqa: E402

register_with_fairseq()  # now complete: see fairseq_dnas._register_with_fairseq
