"""fairseq-dnas: the attention schemes of "Attention that does not Explain Away"
(Ding et al., 2020) for fairseq.

``fairseq_dnas.attention_probs`` (the math), ``fairseq_dnas.nn`` (a drop-in
``torch.nn.MultiheadAttention``), ``fairseq_dnas.attention`` and
``fairseq_dnas.hf`` need torch only: importing them imports no fairseq and
changes nothing in fairseq, also when fairseq was imported first.

The fairseq side (the ``transformer_dnas`` / ``roberta_dnas`` families, the
``translation_rouge`` task, and the changes to fairseq's behaviour listed in
``fairseq_dnas.fairseq_patches``) is installed when fairseq loads the plugin
(``--user-dir fairseq_dnas``), or in Python by ``import fairseq_dnas.plugin``.
"""

from fairseq_dnas.attention import SCHEMES, attention_probs

__version__ = "0.1.0"
__all__ = ["SCHEMES", "attention_probs", "__version__"]
