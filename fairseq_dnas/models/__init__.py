"""fairseq model registrations: importing this registers the architectures."""

from fairseq_dnas.models.roberta_dnas import RobertaDNASModel
from fairseq_dnas.models.transformer_dnas import TransformerDNASModel

__all__ = ["RobertaDNASModel", "TransformerDNASModel"]

from fairseq_dnas import register_with_fairseq  # noqa: E402

register_with_fairseq()  # now complete: see fairseq_dnas._register_with_fairseq
