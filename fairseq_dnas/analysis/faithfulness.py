"""Is attention an explanation? The faithfulness metric of a sentence
classifier (J. Kinley, 2020, Chapter 6, after Jain & Wallace, 2019,
"Attention is not Explanation"): does the attention a position receives rank
the positions as the gradient of the decision does?

Per example, model in eval mode, over the real tokens j (the classification
token ``<s>`` and ``</s>`` are left out as positions but count as queries):

- attention a_j = sum over layers l, heads h and real queries i of
  p^{l,h}_{ij}, the attention probability query i gives key j
  (``attention_received``);
- importance g_j = || d y_hat / d e_j ||_2, y_hat the probability of the
  predicted class and e_j the token embedding of position j as it enters the
  encoder (the output of ``embed_tokens``); ``grad-x-input`` gives
  | sum_d (d y_hat / d e_jd) e_jd |, the form of Jain & Wallace's code
  (``importance``);
- tau = Kendall's tau-b between a and g (``kendall_tau``); an example with
  fewer than 2 real tokens, or with a constant a or g, has no tau (None).

The gradients of a batch come from one backward pass of sum_b y_hat_b:
examples do not interact (padding is masked out of every attention, and the
classification head reads each example's own ``<s>``), so the gradient of
the sum with respect to e of example b is that of y_hat_b alone.

Two-stream encoders: the capture (``capture.EncoderAttention``) gives each
layer's attention by stream name. A single-stream encoder has one attention
(``capture.SINGLE_STREAM``), used whatever ``attention`` says; an encoder
whose layers report several streams is read by name: ``'model'`` (the
model stream's S, the attention that combines the values the prediction
reads) or ``'controller'`` (the controller's A).

Discrete encoders (argmax attention at inference, ``receptive_field``): the
batch also gives the receptive field of the position the classification
head reads (``<s>``, position 0) after every layer, from the model stream's
S whatever ``attention`` says; the gradient importance is exactly 0 outside
it (tests/test_receptive_field.py).
"""

from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from fairseq_dnas.analysis import receptive_field as RF
from fairseq_dnas.analysis.capture import EncoderAttention, encoder_stack

IMPORTANCE_FORMS = ("grad", "grad-x-input")
HEAD_POSITION = 0  # fairseq's classification head reads the first token (<s>)
ATTENTION_STREAMS = ("model", "controller")


def real_positions(padding: Tensor, special: Tensor) -> Tensor:
    """(B, T) True at the positions that are tokens of the sentence: neither
    padding nor a special position (``<s>``, ``</s>``)."""
    return ~padding & ~special


def special_positions(tokens: Tensor, padding: Tensor, init_token: Optional[int]) -> Tensor:
    """(B, T) True at ``<s>`` (position 0, when the task puts an
    ``--init-token`` first) and at ``</s>`` (the last real position) of each
    right-padded row, as ``sentence_classify.encode`` builds them."""
    batch, length = tokens.shape
    pos = torch.arange(length, device=tokens.device).expand(batch, length)
    last = (~padding).sum(1, keepdim=True) - 1
    special = pos.eq(last)
    if init_token is not None:
        special |= pos.eq(0)
    return special


def attention_received(probs: Sequence[Tensor], padding: Tensor, special: Tensor) -> Tensor:
    """a_j = sum_l sum_h sum_{i real query} p^{l,h}_{ij}, (B, T); 0 at the
    positions that are not real tokens.

    probs: one (H, B, T, T) tensor per layer (queries i, keys j); padding,
    special: (B, T) bool. Every non-padding position is a query (the special
    tokens included); the special positions are dropped as keys.
    """
    query = (~padding).to(probs[0].dtype)[None, :, :, None]  # (1, B, T_q, 1)
    a = sum((p * query).sum(dim=(0, 2)) for p in probs)  # sum over heads and queries
    return a * real_positions(padding, special).to(a.dtype)


def importance(grad: Tensor, embed: Tensor, form: str = "grad") -> Tensor:
    """(B, T) importance of each position from grad = d y_hat / d e and the
    embeddings e, both (B, T, D):
    'grad': g_j = ||grad_j||_2; 'grad-x-input': g_j = |sum_d grad_jd e_jd|."""
    if form == "grad":
        return grad.norm(dim=-1)
    if form == "grad-x-input":
        return (grad * embed).sum(-1).abs()
    raise ValueError(f"importance form {form!r}: choose one of {', '.join(IMPORTANCE_FORMS)}")


def kendall_tau(a: Sequence[float], g: Sequence[float]) -> Optional[float]:
    """Kendall's tau-b of two equally long vectors (scipy's default: ties
    counted in both), or None when it is undefined: fewer than 2 values, or a
    constant vector."""
    from scipy.stats import kendalltau

    a, g = np.asarray(a, dtype=np.float64), np.asarray(g, dtype=np.float64)
    if len(a) < 2 or np.all(a == a[0]) or np.all(g == g[0]):
        return None
    return float(kendalltau(a, g).statistic)


def pick_stream(named: Dict[str, Tensor], attention: str) -> Tensor:
    """The attention of one layer: the only one of a single-stream layer, or
    the stream ``attention`` ('model' or 'controller') of a two-stream one."""
    if len(named) == 1:
        return next(iter(named.values()))
    if attention not in named:
        raise ValueError(f"--attention {attention}: this encoder's layers report the streams "
                         f"{', '.join(sorted(named))}")
    return named[attention]


class _KeepEmbedding:
    """Forward hook on ``embed_tokens``: its output, made a leaf of its own
    so that the gradient with respect to it is taken alone (the embedding
    table's gradient is not needed)."""

    def __init__(self):
        self.value = None

    def __call__(self, module, args, output):
        self.value = output.detach().requires_grad_(True)
        return self.value


def explain_batch(model, tokens: Tensor, head: str, init_token: Optional[int],
                  attention: str = "model") -> dict:
    """The metric's inputs for a right-padded batch (B, T) of a
    sentence_prediction model in eval mode, one forward and one backward:

    {'probs': (B, C) class probabilities, 'prediction': (B,),
     'real': (B, T) bool, 'attention': (B, T) a_j,
     'importance': {form: (B, T) g_j for each of IMPORTANCE_FORMS},
     'receptive_field': (L, B, T) bool, the field of position 0 after every
     layer, for a discrete encoder (else None)}
    (a_j and g_j are 0 outside the real positions).
    """
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() (no dropout)")
    enc = encoder_stack(model)
    padding = tokens.eq(enc.padding_idx)
    special = special_positions(tokens, padding, init_token)
    keep = _KeepEmbedding()
    handle = enc.embed_tokens.register_forward_hook(keep)
    try:
        with EncoderAttention(model) as rec, torch.enable_grad():
            logits, _ = model(tokens, features_only=True, classification_head_name=head)
            probs = torch.softmax(logits, dim=-1)
            prediction = probs.argmax(-1)
            y_hat = probs.gather(1, prediction[:, None]).squeeze(1)
            # One backward for the batch: examples do not interact, so the
            # gradient of sum_b y_hat_b at example b's e is d y_hat_b / d e.
            (grad,) = torch.autograd.grad(y_hat.sum(), keep.value)
    finally:
        handle.remove()
    (layers,) = rec.calls  # one forward
    a = attention_received([pick_stream(named, attention) for named in layers], padding, special)
    real = real_positions(padding, special)
    e = keep.value.detach()
    field = None
    if RF.is_discrete_encoder(model):  # the values reach h through the model stream's S
        samples = [pick_stream(named, "model") for named in layers]
        field = RF.field_of(RF.receptive_fields(samples, padding), HEAD_POSITION)
    return {
        "probs": probs.detach(), "prediction": prediction, "real": real, "attention": a,
        "importance": {form: importance(grad, e, form) * real.to(e.dtype) for form in IMPORTANCE_FORMS},
        "receptive_field": field,
    }


def summarize(taus: List[Optional[float]], gold: Sequence[int], pred: Sequence[int]) -> dict:
    """Mean and standard deviation (numpy's, ddof=0) of the defined taus,
    accuracy, and how many examples were left out (tau undefined)."""
    kept = np.array([t for t in taus if t is not None], dtype=np.float64)
    gold, pred = np.asarray(gold), np.asarray(pred)
    return {
        "n": len(taus),
        "accuracy": float((gold == pred).mean()) if len(gold) else float("nan"),
        "tau_mean": float(kept.mean()) if len(kept) else float("nan"),
        "tau_std": float(kept.std()) if len(kept) else float("nan"),
        "left_out": len(taus) - len(kept),
    }


def receptive_field_summary(per_example) -> dict:
    """From (sizes per layer, length) per sentence: the mean over sentences
    of |r(<s>, l)| and of |r(<s>, l)| / length, per layer l (bottom first);
    length counts every position fed to the model, <s> and </s> included."""
    sizes = np.array([s for s, _ in per_example], dtype=np.float64)  # (N, L)
    lengths = np.array([n for _, n in per_example], dtype=np.float64)[:, None]
    return {"receptive_field_size": sizes.mean(0).tolist(),
            "receptive_field_fraction": (sizes / lengths).mean(0).tolist()}
