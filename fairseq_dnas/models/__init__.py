"""fairseq model registrations: importing this registers the architectures."""

from fairseq_dnas.models.transformer_dnas import TransformerDNASModel

__all__ = ["TransformerDNASModel"]
