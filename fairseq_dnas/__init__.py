"""fairseq-dnas: the attention schemes of "Attention that does not Explain Away"
(Ding et al., 2020) for fairseq.

``fairseq_dnas.attention_probs`` (the math), ``fairseq_dnas.nn`` (a drop-in
``torch.nn.MultiheadAttention``), ``fairseq_dnas.attention`` and
``fairseq_dnas.hf`` need torch only: importing them imports no fairseq and
changes nothing in fairseq, also when fairseq was imported first.

The commands a user runs are modules of ``fairseq_dnas.commands``
(``python -m fairseq_dnas.commands.rouge_eval --help``); the recipes under
examples/ run their internal steps from ``fairseq_dnas.recipes``.

The fairseq side (the ``transformer_dnas`` / ``roberta_dnas`` families, the
``translation_rouge`` task, and the changes to fairseq's behaviour listed in
``fairseq_dnas.fairseq_patches``) is installed when fairseq loads the plugin
(``--user-dir fairseq_dnas``), or in Python by ``import fairseq_dnas.plugin``.
"""

__version__ = "0.1.0"
__all__ = ["SCHEMES", "attention_probs", "__version__"]


def __getattr__(name):
    """``SCHEMES`` and ``attention_probs`` on first use: importing the package
    itself imports no torch, so ``python -m fairseq_dnas.commands.rouge_eval``
    and the recipes' small tools start in a fraction of a second."""
    if name in ("SCHEMES", "attention_probs"):
        from fairseq_dnas import attention

        return getattr(attention, name)
    raise AttributeError(f"module 'fairseq_dnas' has no attribute {name!r}")
