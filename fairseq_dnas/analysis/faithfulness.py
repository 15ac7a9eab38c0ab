"""Is attention an explanation? The faithfulness metric of a sentence
classifier (J. Kinley, 2020, Chapter 6, after Jain & Wallace, 2019,
"Attention is not Explanation"): does the attention a position receives rank
the positions as the gradient of the decision does?

Per example, model in eval mode, over the real tokens j (the classification
token ``<s>`` and ``</s>`` are left out as positions but count as queries):

- attention a_j = sum over layers l, heads h and real queries i of
  p^{l,h}_{ij}, the attention probability query i gives key j
  (``attention_received``);
- importance g_j = || d y_hat / d h0_j ||_2 (thesis Section 5.4), y_hat the
  probability of the predicted class and h0_j the input of the first encoder
  layer at position j: the token embedding (times ``embed_scale``) plus the
  position embedding, after the embedding LayerNorm where the encoder has one
  (RoBERTa), before dropout (the identity in eval mode). In a two-stream
  encoder h0 is the model stream's input (the stream the prediction reads).
  ``grad-x-input`` gives | sum_d (d y_hat / d h0_jd) h0_jd |, the form of Jain
  & Wallace's code (``importance``). ``at='embed_tokens'`` takes both at the
  output of ``embed_tokens`` instead (the token embedding e_j alone, before
  the scale, the positions and the LayerNorm; Jain & Wallace's point): the
  LayerNorm divides each position by its own standard deviation and
  projects, so norms and rankings differ from h0's;
- ``detach_attention=True``: the same gradient with every attention
  probability held constant (Jain & Wallace's code: the attention weights
  ``.detach()``-ed in the forward the gradient is taken through), so g says
  how y_hat moves with the inputs through the values, the residual stream
  and the feed-forward layers while the attention stays fixed
  (``DetachedAttention``). Discrete attention at inference is an argmax,
  already constant with respect to its input: detaching changes only the
  paths through soft attention (a two-stream encoder's controller A, and S
  where ``sampler='soft'``);
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
from fairseq_dnas.analysis.capture import EncoderAttention, Hooks, attention_sites, encoder_stack

IMPORTANCE_FORMS = ("grad", "grad-x-input")
IMPORTANCE_POINTS = ("h0", "embed_tokens")  # where the gradient is taken: the thesis's h0 (default)
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


def attention_received(probs: Sequence[Tensor], padding: Tensor, special: Tensor,
                       query_padding: Optional[Tensor] = None) -> Tensor:
    """a_j = sum_l sum_h sum_{i real query} p^{l,h}_{ij}, (B, T); 0 at the
    positions that are not real tokens.

    probs: one (H, B, T_q, T) tensor per layer (queries i, keys j); padding,
    special: (B, T) bool, of the keys. Every non-padding position is a query
    (the special tokens included); the special positions are dropped as keys.
    ``query_padding`` (B, T_q): the queries' padding when they are another
    sequence than the keys (cross-attention: target queries, source keys).
    """
    if query_padding is None:
        query_padding = padding
    query = (~query_padding).to(probs[0].dtype)[None, :, :, None]  # (1, B, T_q, 1)
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
    table's gradient is not needed). With ``only`` (a token tensor), only the
    call on that very tensor is kept: a translation model that shares its
    embedding table also embeds the target with it, and those calls pass."""

    def __init__(self, only: Optional[Tensor] = None):
        self.value = None
        self.only = only

    def __call__(self, module, args, output):
        if self.only is not None and args[0] is not self.only:
            return None
        self.value = output.detach().requires_grad_(True)
        return self.value

    def batch_first(self, x: Tensor) -> Tensor:
        return x  # embed_tokens gives (B, T, C)


class _KeepFirstLayerInput:
    """Forward pre-hook on the encoder's first layer: its input h0 (T, B, C),
    made a leaf of its own. fairseq's encoder calls ``layer(x, ...)``; a
    two-stream layer is called ``layer(g, h, ...)`` and h0 is the model
    stream's h (the layer's ``model_stream_input`` = 1). Only the first call
    of a forward is kept."""

    def __init__(self, stream: int):
        self.value = None
        self.stream = stream

    def __call__(self, module, args):
        if self.value is not None:
            return None
        self.value = args[self.stream].detach().requires_grad_(True)
        return args[:self.stream] + (self.value,) + args[self.stream + 1:]

    def batch_first(self, x: Tensor) -> Tensor:
        return x.transpose(0, 1)  # (T, B, C) -> (B, T, C)


def _hook_importance_point(enc, at: str, only: Optional[Tensor] = None):
    """(hook, handle): the hook keeps the tensor the importance is taken at,
    h0 (the first layer's input) or the output of ``embed_tokens``; remove
    the handle after the backward."""
    if at == "h0":
        first = enc.layers[0]
        keep = _KeepFirstLayerInput(getattr(first, "model_stream_input", 0))
        return keep, first.register_forward_pre_hook(keep)
    if at == "embed_tokens":
        keep = _KeepEmbedding(only=only)
        return keep, enc.embed_tokens.register_forward_hook(keep)
    raise ValueError(f"importance point {at!r}: choose one of {', '.join(IMPORTANCE_POINTS)}")


class DetachedAttention(Hooks):
    """While active (``with``), every attention module of ``model`` (the
    encoder's self-attention; with ``decoder=True`` the decoder's self- and
    cross-attention too) computes its probabilities from detached queries
    and keys: forward hooks on ``q_proj`` and ``k_proj`` return their output
    detached, so P = f(q, k) is a constant for autograd while P v still
    carries the gradient through v = ``v_proj``(x) (Jain & Wallace's
    ``.detach()`` of the attention weights). This holds for every scheme the
    plugin has, as each computes P from q and k alone (softmax, DNAS, HNAS's
    mixture with its u, the discrete sample, a two-stream module's A and S,
    whose model-stream values ``model_v_proj`` keep their gradient).

    fairseq's ``MultiheadAttention`` hands its ordinary forward to torch's
    fused function, which reads the projection weights without calling the
    modules; ``skip_embed_dim_check`` routes it through fairseq's own Python
    path, the same math, which calls them. ``check()`` refuses a forward in
    which some module's projections were not called with gradient enabled:
    the option must never be silently a no-op."""

    def __init__(self, model, decoder: bool = False):
        super().__init__()
        self.modules = [site.module for site in attention_sites(model, decoder=decoder)]
        self.calls = {}
        self._saved = []

    def __enter__(self):
        for module in self.modules:
            for name in ("q_proj", "k_proj"):
                self._handles.append(getattr(module, name).register_forward_hook(self._detach(module, name)))
            if hasattr(module, "skip_embed_dim_check"):
                self._saved.append((module, module.skip_embed_dim_check))
                module.skip_embed_dim_check = True
        return self

    def __exit__(self, *exc):
        for module, value in self._saved:
            module.skip_embed_dim_check = value
        self._saved = []
        return super().__exit__(*exc)

    def _detach(self, module, name):
        def hook(proj, args, output):
            if torch.is_grad_enabled():  # the forward the gradient is taken through (not capture's re-runs)
                self.calls[(id(module), name)] = self.calls.get((id(module), name), 0) + 1
            return output.detach()

        return hook

    def check(self) -> None:
        missing = sum(1 for m in self.modules for name in ("q_proj", "k_proj") if (id(m), name) not in self.calls)
        if missing:
            raise RuntimeError(f"detach_attention: {missing} query/key projection(s) of the model's attention "
                               "were not called in the forward, so their attention was not detached")


def predicted_probability(logits: Tensor):
    """(class probabilities (B, C), prediction (B,), y_hat (B,)): the
    softmax of the logits, its argmax and the probability of the argmax, the
    y_hat whose gradient is the importance."""
    probs = torch.softmax(logits, dim=-1)
    prediction = probs.argmax(-1)
    return probs, prediction, probs.gather(1, prediction[:, None]).squeeze(1)


def _detaching(model, detach: bool, decoder: bool = False):
    """``DetachedAttention`` when ``detach``, else a context that does nothing."""
    from contextlib import nullcontext

    return DetachedAttention(model, decoder) if detach else nullcontext()


def explain_batch(model, tokens: Tensor, head: str, init_token: Optional[int],
                  attention: str = "model", at: str = "h0", detach_attention: bool = False) -> dict:
    """The metric's inputs for a right-padded batch (B, T) of a
    sentence_prediction model in eval mode, one forward and one backward:

    {'probs': (B, C) class probabilities, 'prediction': (B,),
     'real': (B, T) bool, 'attention': (B, T) a_j,
     'importance': {form: (B, T) g_j for each of IMPORTANCE_FORMS},
     'receptive_field': (L, B, T) bool, the field of position 0 after every
     layer, for a discrete encoder (else None)}
    (a_j and g_j are 0 outside the real positions). ``at``: where the
    gradient is taken, 'h0' (the thesis's) or 'embed_tokens';
    ``detach_attention``: the attention probabilities are constants for the
    gradient (``DetachedAttention``; the attention reported is the same).
    """
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() (no dropout)")
    enc = encoder_stack(model)
    padding = tokens.eq(enc.padding_idx)
    special = special_positions(tokens, padding, init_token)
    keep, handle = _hook_importance_point(enc, at)
    try:
        with EncoderAttention(model) as rec, _detaching(model, detach_attention) as detached, \
                torch.enable_grad():
            logits, _ = model(tokens, features_only=True, classification_head_name=head)
            if detach_attention:
                detached.check()
            probs, prediction, y_hat = predicted_probability(logits)
            # One backward for the batch: examples do not interact, so the
            # gradient of sum_b y_hat_b at example b's h0 is d y_hat_b / d h0.
            (grad,) = torch.autograd.grad(y_hat.sum(), keep.value)
    finally:
        handle.remove()
    (layers,) = rec.calls  # one forward
    a = attention_received([pick_stream(named, attention) for named in layers], padding, special)
    real = real_positions(padding, special)
    e, grad = keep.batch_first(keep.value.detach()), keep.batch_first(grad)  # (B, T, C)
    field = None
    if RF.is_discrete_encoder(model):  # the values reach h through the model stream's S
        samples = [pick_stream(named, "model") for named in layers]
        field = RF.field_of(RF.receptive_fields(samples, padding), HEAD_POSITION)
    return {
        "probs": probs.detach(), "prediction": prediction, "real": real, "attention": a,
        "importance": {form: importance(grad, e, form) * real.to(e.dtype) for form in IMPORTANCE_FORMS},
        "receptive_field": field,
    }


def explain_translation_batch(model, src_tokens: Tensor, src_lengths: Tensor, prev_output_tokens: Tensor,
                              target: Tensor, attention: str = "model", at: str = "h0",
                              detach_attention: bool = False) -> dict:
    """The translation form of the metric for a batch of (source, hypothesis)
    pairs of an encoder-decoder model in eval mode, one teacher-forced
    forward and one backward:

    - y_hat = log p(y | x) = sum_t log p(y_t | y_<t, x), the log-probability
      of the hypothesis y (``target``, ``</s>`` included; the generator's own
      output, so the model explains its decision), teacher-forced;
    - importance g_j of source position j from d y_hat / d h0_j, h0_j the
      input of the encoder's first layer (as in ``explain_batch``; with
      ``at='embed_tokens'`` the output of the encoder's ``embed_tokens``, at
      the call on the source tokens only: a table shared with the decoder
      also embeds the target);
    - two attentions a_j over the source: 'encoder', the encoder
      self-attention received (sum over encoder layers, heads and real source
      queries, ``</s>`` included as a query), and 'cross', the decoder
      cross-attention received (sum over decoder layers, heads and the target
      positions of y). Two-stream layers are read by ``attention`` as in
      ``explain_batch``.
    - ``detach_attention``: every attention of the model (encoder
      self-attention, decoder self- and cross-attention) is a constant for
      the gradient (``DetachedAttention``).

    The real source positions are the non-padding tokens other than ``</s>``
    (fairseq's translation task puts no ``<s>`` on the source; padding may be
    on the left). Returns {'logprob': (B,), 'real': (B, T_s),
    'attention': {'encoder': (B, T_s), 'cross': (B, T_s)},
    'importance': {form: (B, T_s)}}.
    """
    if model.training:
        raise ValueError("the model is in training mode; call model.eval() (no dropout)")
    enc = model.encoder
    padding = src_tokens.eq(enc.padding_idx)
    special = src_tokens.eq(enc.dictionary.eos())
    target_padding = target.eq(model.decoder.padding_idx)
    keep, handle = _hook_importance_point(enc, at, only=src_tokens)
    try:
        with EncoderAttention(model) as self_rec, EncoderAttention(model, "decoder_cross") as cross_rec, \
                _detaching(model, detach_attention, decoder=True) as detached, torch.enable_grad():
            net_output = model(src_tokens, src_lengths, prev_output_tokens)
            if detach_attention:
                detached.check()
            lprobs = model.get_normalized_probs(net_output, log_probs=True)
            token_lp = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            y_hat = token_lp.masked_fill(target_padding, 0.0).sum(1)
            # One backward for the batch: pairs do not interact (padding is
            # masked in every attention), so d(sum_b y_hat_b)/d h0_b = d y_hat_b/d h0_b.
            (grad,) = torch.autograd.grad(y_hat.sum(), keep.value)
    finally:
        handle.remove()
    (enc_layers,), (cross_layers,) = self_rec.calls, cross_rec.calls  # one forward each
    real = real_positions(padding, special)
    e, grad = keep.batch_first(keep.value.detach()), keep.batch_first(grad)  # (B, T_s, C)
    return {
        "logprob": y_hat.detach(), "real": real,
        "attention": {
            "encoder": attention_received([pick_stream(n, attention) for n in enc_layers], padding, special),
            "cross": attention_received([pick_stream(n, attention) for n in cross_layers], padding, special,
                                        query_padding=target_padding),
        },
        "importance": {form: importance(grad, e, form) * real.to(e.dtype) for form in IMPORTANCE_FORMS},
    }


def tau_summary(taus: List[Optional[float]]) -> dict:
    """Mean and standard deviation (numpy's, ddof=0) of the defined taus, and
    how many examples were left out (tau undefined)."""
    kept = np.array([t for t in taus if t is not None], dtype=np.float64)
    return {
        "n": len(taus),
        "tau_mean": float(kept.mean()) if len(kept) else float("nan"),
        "tau_std": float(kept.std()) if len(kept) else float("nan"),
        "left_out": len(taus) - len(kept),
    }


def summarize(taus: List[Optional[float]], gold: Sequence[int], pred: Sequence[int]) -> dict:
    """``tau_summary`` and the accuracy."""
    gold, pred = np.asarray(gold), np.asarray(pred)
    out = tau_summary(taus)
    out["accuracy"] = float((gold == pred).mean()) if len(gold) else float("nan")
    return {k: out[k] for k in ("n", "accuracy", "tau_mean", "tau_std", "left_out")}


def receptive_field_summary(per_example) -> dict:
    """From (sizes per layer, length) per sentence: the mean over sentences
    of |r(<s>, l)| and of |r(<s>, l)| / length, per layer l (bottom first);
    length counts every position fed to the model, <s> and </s> included."""
    sizes = np.array([s for s, _ in per_example], dtype=np.float64)  # (N, L)
    lengths = np.array([n for _, n in per_example], dtype=np.float64)[:, None]
    return {"receptive_field_size": sizes.mean(0).tolist(),
            "receptive_field_fraction": (sizes / lengths).mean(0).tolist()}
