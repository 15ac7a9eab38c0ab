"""Is attention an explanation? The faithfulness metric of a Hugging Face
``transformers`` sequence classifier (``...ForSequenceClassification``),
plain or switched by ``fairseq_dnas.hf.enable`` (any scheme: sdpa, DNAS,
HNAS, discrete, ...): the thesis's metric (J. Kinley, 2020, Chapter 6,
Section 5.4; after Jain & Wallace, 2019) as
``fairseq_dnas.analysis.faithfulness`` computes it for fairseq models, with
the same definitions (docs/analysis.md):

- h0: the output of the model's embeddings module (token + position (+
  type) embeddings after their LayerNorm, before dropout, the identity in
  eval mode): ``base_model.embeddings``, or for BART/mBART, whose encoder
  has no such module, the encoder's ``layernorm_embedding``;
- importance g_j = ||d y_hat / d h0_j||_2 ('grad') or
  |sum_d (d y_hat / d h0_jd) h0_jd| ('grad-x-input'), y_hat the probability
  of the predicted class; with ``detach_attention`` every attention
  probability of the model is a constant for that gradient (Jain & Wallace's
  code): the attention function is called with detached queries and keys,
  so P = f(q, k) is constant while P v carries the gradient through v;
- attention received a_j: sum over the bidirectional self-attention layers,
  heads and real queries (every non-padding position, special tokens
  included) of p_ij; special tokens (the tokenizer's
  ``special_tokens_mask``: [CLS], [SEP], <s>, </s>) and padding are left
  out as keys, as in the fairseq tool; causal and cross-attention (BART's
  decoder) are not summed;
- tau: Kendall's tau-b per sentence (``analysis.faithfulness.kendall_tau``).

The attention is read inside the model's own attention function: while
``AttentionReader`` is active the model runs under a registered
implementation that calls the function of the model's implementation
(``AttentionInterface``; transformers' sdpa for 'sdpa' and 'eager') and
keeps its per-head weights; where that function returns none (sdpa), they
are recomputed as the softmax of the scaled scores plus the mask. Either
way the weights are checked to give the output the model used (P v), so
what is reported is what the model computed.
"""

import inspect
from typing import List, Optional, Sequence

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from fairseq_dnas.analysis import faithfulness as F
from fairseq_dnas.analysis.capture import check_same_output
from fairseq_dnas.hf.attention import ROLE_ATTR, infer_role

READER = "faithfulness_reader"  # the implementation name the model runs under while read


def softmax_weights(query: Tensor, key: Tensor, mask: Optional[Tensor], scaling: Optional[float]) -> Tensor:
    """p = softmax(q k^T s + mask) over the keys, (B, H, T_q, T_k): what sdpa
    and eager attention compute. ``mask``: transformers' 4D mask, boolean
    (True: the query sees the key) or additive (0 or very negative)."""
    s = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * s
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    return scores.softmax(-1)


class AttentionReader:
    """While active (``with``), ``model`` runs under the implementation
    ``READER``, which calls the model's own attention function and appends
    the per-head weights (B, H, T, T) of each bidirectional self-attention
    call to ``self.weights`` (bottom layer first, detached). With
    ``detach=True`` every attention call (self, causal and cross) gets
    detached queries and keys: the probabilities are constants for the
    gradient. The model's implementation is restored on exit."""

    def __init__(self, model, detach: bool = False):
        self.model = model
        self.detach = detach
        self.weights: List[Tensor] = []
        self.detached = 0

    def __enter__(self):
        config = self.model.config
        self.original = config._attn_implementation
        if self.original in (None, "eager", "sdpa"):
            function = sdpa_attention_forward  # eager is the same softmax; sdpa takes its masks too
        elif self.original in ALL_ATTENTION_FUNCTIONS:
            function = ALL_ATTENTION_FUNCTIONS[self.original]
        else:
            raise ValueError(f"attention implementation {self.original!r} is not registered with transformers' "
                             "AttentionInterface: import the module that registers it")
        mask = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(self.original or "sdpa", sdpa_mask)

        def read(module, query, key, value, attention_mask, **kwargs):
            return self._call(function, module, query, key, value, attention_mask, **kwargs)

        AttentionInterface.register(READER, read)
        AttentionMaskInterface.register(READER, mask)
        self.model.set_attn_implementation(READER)
        if config._attn_implementation != READER:
            self.model.set_attn_implementation(self.original)
            raise ValueError(f"{type(self.model).__name__} does not route its attention through transformers' "
                             "AttentionInterface, so its attention cannot be read")
        return self

    def __exit__(self, *exc):
        self.model.set_attn_implementation(self.original)
        return False

    def _call(self, function, module, query, key, value, attention_mask, **kwargs):
        role = getattr(module, ROLE_ATTR, None) or infer_role(module)
        bidirectional = role == "self" and not kwargs.get("is_causal") and query.shape[-2] == key.shape[-2]
        if self.detach and torch.is_grad_enabled():
            query, key = query.detach(), key.detach()  # P = f(q, k): a constant; P v keeps v's gradient
            self.detached += 1
        if function is not sdpa_attention_forward:  # sdpa returns no weights (and warns when asked)
            kwargs = dict(kwargs, output_attentions=True)
        out, weights = function(module, query, key, value, attention_mask, **kwargs)
        if bidirectional:
            groups = getattr(module, "num_key_value_groups", 1)
            k, v = (repeat_kv(key, groups), repeat_kv(value, groups)) if groups > 1 else (key, value)
            if weights is None and function is not sdpa_attention_forward:
                raise ValueError(f"the attention function of {self.original!r} returns no weights with "
                                 "output_attentions=True, so the attention the model used cannot be read")
            p = weights if weights is not None else softmax_weights(query, k, attention_mask, kwargs.get("scaling"))
            check_same_output(torch.matmul(p.to(v.dtype), v).transpose(1, 2), out,
                              f"{type(module).__name__} ({self.original})")
            self.weights.append(p.detach())
        return out, weights


def embeddings_module(model):
    """The module whose output is h0 (see the module docstring)."""
    base = model.base_model
    if getattr(base, "embeddings", None) is not None:
        return base.embeddings
    norm = getattr(getattr(base, "encoder", None), "layernorm_embedding", None)
    if norm is not None:
        return norm
    raise ValueError(f"{type(model).__name__}: no embeddings module (base_model.embeddings, or an encoder's "
                     "layernorm_embedding) to take h0 at")


class _KeepOutput:
    """Forward hook: the module's first output of a forward, made a leaf of
    its own (the gradient is taken with respect to it)."""

    def __init__(self):
        self.value = None

    def __call__(self, module, args, output):
        if self.value is not None:
            return None
        self.value = output.detach().requires_grad_(True)
        return self.value


def model_inputs(model, encoded: dict) -> dict:
    """The tokenizer's tensors the model's forward takes (BART takes no token_type_ids)."""
    accepted = inspect.signature(model.forward).parameters
    return {k: v for k, v in encoded.items() if k in accepted and k != "special_tokens_mask"}


def explain_batch(model, encoded: dict, detach_attention: bool = False) -> dict:
    """The metric's inputs for one padded batch, one forward and one backward.

    encoded: the tokenizer's output for the batch, with ``attention_mask``
    and ``special_tokens_mask`` (``return_special_tokens_mask=True``).
    Returns {'probs': (B, C), 'prediction': (B,), 'real': (B, T) bool,
    'attention': (B, T) a_j, 'importance': {form: (B, T) g_j}}, a_j and g_j 0
    outside the real positions. The examples of a batch do not interact
    (padding is masked in every attention), so the gradient of sum_b y_hat_b
    at example b's h0 is that of y_hat_b.
    """
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() (no dropout)")
    if "special_tokens_mask" not in encoded or "attention_mask" not in encoded:
        raise ValueError("encode the batch with return_special_tokens_mask=True and an attention_mask")
    keep = _KeepOutput()
    handle = embeddings_module(model).register_forward_hook(keep)
    try:
        with AttentionReader(model, detach_attention) as reader, torch.enable_grad():
            logits = model(**model_inputs(model, encoded)).logits
            probs, prediction, y_hat = F.predicted_probability(logits)
            (grad,) = torch.autograd.grad(y_hat.sum(), keep.value)
    finally:
        handle.remove()
    if not reader.weights:
        raise ValueError(f"{type(model).__name__}: no bidirectional self-attention reached the attention function")
    if detach_attention and not reader.detached:
        raise RuntimeError("detach_attention: no attention call was detached")
    padding = encoded["attention_mask"].eq(0)
    special = encoded["special_tokens_mask"].bool() & ~padding
    a = F.attention_received([w.transpose(0, 1) for w in reader.weights], padding, special)  # (H, B, T, T) each
    real = F.real_positions(padding, special)
    h0 = keep.value.detach()
    return {"probs": probs.detach(), "prediction": prediction, "real": real, "attention": a,
            "importance": {form: F.importance(grad, h0, form) * real.to(h0.dtype) for form in F.IMPORTANCE_FORMS}}


def label_names(model) -> List[str]:
    """The labels a TSV line may carry: the class indices '0' .. 'C-1'."""
    return [str(i) for i in range(model.config.num_labels)]


def faithfulness(model, tokenizer, sentences: Sequence[str], gold: Optional[Sequence[int]] = None,
                 importance: str = "grad", detach_attention: bool = False, batch_size: int = 32):
    """(summary, rows) of the metric over ``sentences`` for a classifier in
    eval mode and its tokenizer (for a notebook; the command
    ``python -m fairseq_dnas.commands.hf_faithfulness`` wraps it).

    rows: one dict per sentence, in order: index, tokens (the ids fed,
    special tokens included, padding left out), pieces (the tokenizer's
    strings of those ids), attention and importance (over the real tokens),
    tau (None where undefined), label (gold, when given) and prediction, as
    class-index strings. summary: n, accuracy (NaN without gold), tau_mean,
    tau_std, left_out, importance, detach_attention.
    """
    if importance not in F.IMPORTANCE_FORMS:
        raise ValueError(f"importance {importance!r}: choose one of {', '.join(F.IMPORTANCE_FORMS)}")
    names = label_names(model)
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))  # less padding; results do not depend on it
    rows = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        encoded = tokenizer([sentences[i] for i in idx], padding=True, return_tensors="pt",
                            return_special_tokens_mask=True)
        r = explain_batch(model, dict(encoded), detach_attention)
        for b, i in enumerate(idx):
            real, kept = r["real"][b], encoded["attention_mask"][b].bool()
            ids = encoded["input_ids"][b][kept].tolist()
            a = r["attention"][b][real].tolist()
            g = r["importance"][importance][b][real].tolist()
            rows[i] = {"index": i, "tokens": ids, "pieces": tokenizer.convert_ids_to_tokens(ids),
                       "attention": a, "importance": g, "tau": F.kendall_tau(a, g),
                       "label": None if gold is None else names[int(gold[i])],
                       "prediction": names[int(r["prediction"][b])]}
    predicted = [names.index(row["prediction"]) for row in rows]
    labelled = gold is not None  # without gold labels the accuracy is NaN
    summary = F.summarize([row["tau"] for row in rows], gold if labelled else [], predicted if labelled else [])
    summary.update({"importance": importance, "detach_attention": detach_attention})
    return summary, rows
