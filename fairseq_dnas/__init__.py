"""fairseq-dnas: the attention schemes of "Attention that does not Explain Away"
(Ding et al., 2020) for fairseq.

``fairseq_dnas.attention_probs`` is the math on its own (torch only). With
fairseq installed, importing this package (or ``--user-dir fairseq_dnas``)
registers ``transformer_dnas``, ``transformer_hnas`` and their presets, and lets
fairseq load its checkpoints under torch >= 2.6.
"""

from fairseq_dnas.attention import SCHEMES, attention_probs

__version__ = "0.1.0"
__all__ = ["SCHEMES", "attention_probs", "__version__"]

try:
    import fairseq  # noqa: F401
except ImportError:  # the math stays usable without fairseq
    fairseq = None
except Exception as err:  # fairseq is there but broken
    raise ImportError(
        f"fairseq is installed but fails to import ({type(err).__name__}: {err}). "
        "PyPI fairseq 0.12.2 does not import on Python >= 3.11; install the "
        "community build ve-fairseq 0.12.3 as scripts/install.sh does (see README)."
    ) from err

if fairseq is not None:
    from fairseq_dnas import checkpoint_compat

    checkpoint_compat.install()

    from fairseq_dnas import models  # noqa: F401  (registers the architectures)
    from fairseq_dnas import tasks  # noqa: F401  (registers translation_rouge)
