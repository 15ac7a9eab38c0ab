"""fairseq-dnas: the attention schemes of "Attention that does not Explain Away"
(Ding et al., 2020) for fairseq.

``fairseq_dnas.attention_probs`` (the math) and ``fairseq_dnas.nn`` (a
drop-in ``torch.nn.MultiheadAttention``) need torch only, and importing them
does not import fairseq. The fairseq side (``transformer_dnas``,
``transformer_hnas`` and their presets, the ``translation_rouge`` task, and
loading fairseq checkpoints under torch >= 2.6, a resume that sees the same
batches as the run left alone) is registered as soon as
fairseq is imported: at once when it already is (``--user-dir fairseq_dnas``),
else right after a later ``import fairseq``.
"""

import importlib.abc
import importlib.util
import sys

from fairseq_dnas.attention import SCHEMES, attention_probs

__version__ = "0.1.0"
__all__ = ["SCHEMES", "attention_probs", "__version__"]


_registered = False


def _plugin_module_initializing() -> bool:
    """Whether a module of this package is half-way through its own import
    (Python marks its spec ``_initializing``)."""
    return any(
        name.startswith("fairseq_dnas.") and getattr(getattr(mod, "__spec__", None), "_initializing", False)
        for name, mod in list(sys.modules.items())
    )


def _register_with_fairseq(defer_inside_plugin: bool = True) -> None:
    """Import the modules that register with fairseq (once).

    When ``import fairseq`` comes from inside one of this package's own
    modules (``from fairseq_dnas.modules import ...`` before fairseq was
    imported), registering at that moment would import that half-initialized
    module back (a circular import): then the module itself calls
    ``register_with_fairseq()`` at its end.
    """
    global _registered
    if _registered or (defer_inside_plugin and _plugin_module_initializing()):
        return
    _registered = True
    from fairseq_dnas import checkpoint_compat

    checkpoint_compat.install()

    from fairseq_dnas import numpy_compat

    numpy_compat.install()

    from fairseq_dnas import exact_resume

    exact_resume.install()

    from fairseq_dnas import file_checks

    if file_checks.fairseq_command():  # fairseq-train/-generate/... --user-dir fairseq_dnas
        file_checks.install_for_command_line()  # bad files: one line, not a traceback

    from fairseq_dnas import models  # noqa: F401  (registers the architectures)
    from fairseq_dnas import tasks  # noqa: F401  (registers translation_rouge)


class _AfterFairseqImport(importlib.abc.MetaPathFinder):
    """Finds ``fairseq`` with the other finders and registers this plugin once
    fairseq's own ``__init__`` has run (a one-shot post-import hook)."""

    def find_spec(self, name, path=None, target=None):
        if name != "fairseq":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            try:
                exec_module(module)
            except Exception as err:
                raise ImportError(
                    f"fairseq is installed but fails to import ({type(err).__name__}: {err}). "
                    "PyPI fairseq 0.12.2 does not import on Python >= 3.11; install the "
                    "community build ve-fairseq 0.12.3 as scripts/install.sh does (see README)."
                ) from err
            _register_with_fairseq()

        spec.loader.exec_module = exec_then_register
        return spec


def register_with_fairseq() -> None:
    """Called at the end of each module of this package that imports fairseq."""
    _register_with_fairseq(defer_inside_plugin=False)


if sys.modules.get("fairseq") is not None:
    _register_with_fairseq()
elif not any(isinstance(f, _AfterFairseqImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterFairseqImport())
