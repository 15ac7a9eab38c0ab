"""fairseq model registrations: importing this registers the architectures
and installs the patches of ``fairseq_dnas.fairseq_patches`` (fairseq's
``--user-dir`` also imports every module here). A new model family is one
more import line here, or a new file in this folder."""

from fairseq_dnas import fairseq_patches
from fairseq_dnas.models.bart_dnas import BARTDNASModel
from fairseq_dnas.models.roberta_dnas import RobertaDNASModel
from fairseq_dnas.models.transformer_dnas import TransformerDNASModel

__all__ = ["BARTDNASModel", "RobertaDNASModel", "TransformerDNASModel"]

fairseq_patches.install()
