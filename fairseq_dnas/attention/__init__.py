"""Attention math, free of fairseq: ``attention_probs`` is the public contract."""

from fairseq_dnas.attention.functional import SCHEMES, attention_probs

__all__ = ["SCHEMES", "attention_probs"]
