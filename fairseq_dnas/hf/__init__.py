"""DNAS/HNAS and discrete attention for Hugging Face ``transformers`` encoders (extra ``[hf]``).

    from fairseq_dnas import hf
    model = AutoModelForSequenceClassification.from_config(config)
    hf.enable(model, scheme="hnas", hybrid_init=0.5, per="head")
    hf.enable(model, scheme="discrete", gumbel_temperature=1.0, gumbel_hard=False)  # or discrete attention
    model.save_pretrained(d); model = hf.from_pretrained(AutoModelForSequenceClassification, d)

Only bidirectional self-attention changes; causal self-attention and
cross-attention stay softmax (transformers' ``sdpa``), as in the fairseq plugin's
decoder. DNAS/HNAS run on ``fairseq_dnas.attention.kernels.attend``, discrete
attention on the fairseq models' ``fairseq_dnas.attention.discrete``.
"""

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "fairseq_dnas.hf needs Hugging Face transformers: pip install -e '.[hf]'"
    ) from e

from fairseq_dnas.hf.attention import SCHEMES, attention_forward, key_padding_mask, register  # noqa: F401
from fairseq_dnas.hf.callback import HybridWeightCallback, hybrid_weights  # noqa: F401
from fairseq_dnas.hf.enable import attention_modules, enable, from_pretrained, load_hybrid_logits  # noqa: F401
