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


class _PackagePath(list):
    """This package's ``__path__``, which also hears fairseq's ``--user-dir``.

    fairseq's ``utils.import_user_module`` (``--user-dir fairseq_dnas``, the
    hub's ``from_pretrained(..., user_dir=...)``) imports nothing for a user
    dir whose package is already in ``sys.modules``: it only checks
    ``module_path in sys.modules["fairseq_dnas"].__path__`` and logs "has
    already been imported". After a torch-only import of this package (say
    ``fairseq_dnas.hf``), ``user_dir=`` thus registered nothing, and under
    torch >= 2.6 the load ended in an ``UnpicklingError`` from torch. That
    one check, made from ``import_user_module`` on this package's own
    folder, now imports ``fairseq_dnas.plugin``: what the user dir asked for.
    Every other use of ``__path__`` is a plain list's."""

    def __contains__(self, item):
        found = list.__contains__(self, item)
        if found:
            import sys

            caller = sys._getframe(1)
            if caller.f_code.co_name == "import_user_module" and caller.f_globals.get("__name__") == "fairseq.utils":
                import fairseq_dnas.plugin  # noqa: F401  (models, tasks, the patches)
        return found


__path__ = _PackagePath(__path__)
