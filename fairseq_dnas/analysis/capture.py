"""Per-head attention probabilities of a running fairseq model, captured by hooks.

fairseq's layers call their attention with ``need_weights=False``, and for
ordinary (non-incremental) calls fairseq's ``MultiheadAttention`` hands the
work to torch's ``F.multi_head_attention_forward``, which can only return
weights averaged over heads. So a forward hook on each attention module takes
the exact inputs of that call and runs the *same module* once more with
``need_head_weights=True``:

- ``DNASMultiheadAttention`` in 'dnas'/'hnas' mode returns the very
  probabilities its forward multiplies with V (one code path, ``attend``);
- ``DiscreteMultiheadAttention`` returns the S it multiplied V with (in eval
  mode one-hot rows, the argmax; in training mode the re-run would draw new
  noise, and the output check below refuses it);
- fairseq's ``MultiheadAttention`` (UNAS, the decoder, a plain
  ``transformer``) is sent through its own Python implementation
  (``skip_embed_dim_check=True`` routes around the torch kernel), the same
  softmax attention, which returns per-head weights.

Each re-run is checked against the output the model actually produced, so
what is reported is what the model computed. The model's math is untouched;
the hooks only add a second call.

A two-stream module (``TwoStreamAttention``, J. Kinley 2020) is not re-run:
it hands the controller's A and the model stream's S, as it used them, to
its ``attention_tap`` (an identity module), and a hook there reads them
(``two_stream_attention``): two components per site, ``controller_A`` and
``model_S``.
"""

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

# MultiheadAttention.forward's positional parameters, in order.
_FORWARD_PARAMS = (
    "query", "key", "value", "key_padding_mask", "incremental_state", "need_weights",
    "static_kv", "attn_mask", "before_softmax", "need_head_weights",
)
# An HNAS module is reported as the mixture the model uses and, apart, as its
# two components; a two-stream module as the controller's A and the model
# stream's S.
HNAS_COMPONENTS = ("mixture", "dnas", "unas")
TWO_STREAM = "two_stream"
TWO_STREAM_COMPONENTS = ("controller_A", "model_S")


@dataclass
class Site:
    """One attention module of the model."""

    kind: str  # 'encoder_self', 'decoder_self' (causal) or 'decoder_cross'
    layer: int  # 0 = bottom
    module: nn.Module
    scheme: str  # 'unas', 'dnas', 'hnas', or a module's ``capture_name`` ('discrete', 'two_stream')

    @property
    def hybrid_weight(self) -> Optional[List[float]]:
        u = getattr(self.module, "hybrid_weight", None)
        return None if u is None else [float(x) for x in u.detach().cpu()]


def encoder_stack(model):
    """The module that holds the encoder layers and the padding index:
    ``model.encoder`` of an encoder-decoder Transformer, the
    ``TransformerEncoder`` inside the ``RobertaEncoder`` of a ``roberta`` /
    ``roberta_dnas`` model (``model.encoder.sentence_encoder``)."""
    return getattr(model.encoder, "sentence_encoder", model.encoder)


def is_encoder_only(model) -> bool:
    """True for a model without a decoder (RoBERTa: masked LM or sentence
    classification)."""
    return getattr(model, "decoder", None) is None


def site_scheme(module) -> str:
    """What the module's weights are: its ``capture_name`` (a discrete
    attention module's 'discrete': the S it multiplied V with, one-hot rows
    in eval mode), else its DNAS scheme, else 'unas' (fairseq's softmax)."""
    return getattr(module, "capture_name", None) or getattr(module, "scheme", "unas")


def attention_sites(model, decoder: bool = True) -> List[Site]:
    """Every attention module of a fairseq encoder-decoder Transformer, or of
    an encoder-only RoBERTa, bottom up."""
    sites = []
    for layer, block in enumerate(encoder_stack(model).layers):
        sites.append(Site("encoder_self", layer, block.self_attn, site_scheme(block.self_attn)))
    if decoder and getattr(model, "decoder", None) is not None:
        for layer, block in enumerate(model.decoder.layers):
            sites.append(Site("decoder_self", layer, block.self_attn, site_scheme(block.self_attn)))
            if getattr(block, "encoder_attn", None) is not None:
                sites.append(Site("decoder_cross", layer, block.encoder_attn, site_scheme(block.encoder_attn)))
    return sites


def site_components(site: Site) -> Tuple[str, ...]:
    """The attentions reported per site: HNAS's mixture and its two parts,
    a two-stream module's A and S, else the scheme's one."""
    if site.scheme == "hnas":
        return HNAS_COMPONENTS
    if site.scheme == TWO_STREAM:
        return TWO_STREAM_COMPONENTS
    return (site.scheme,)


def two_stream_attention(tap_args) -> Dict[str, Tensor]:
    """The arguments a two-stream module's ``attention_tap`` was called with,
    as {'controller_A': A, 'model_S': S}, each (H, B, T_q, T_k) as
    ``head_probs`` returns probabilities (in eval mode S rows are one-hot)."""
    probs, sample = tap_args
    return dict(zip(TWO_STREAM_COMPONENTS, (probs.detach().transpose(0, 1), sample.detach().transpose(0, 1))))


@contextmanager
def capture_two_stream(model, decoder: bool = True):
    """While active, every forward of a two-stream ``model`` appends
    (site, {'controller_A': A, 'model_S': S}) per attention module to the
    yielded list, in call order."""
    records = []
    handles = []
    for site in attention_sites(model, decoder=decoder):
        if site.scheme == TWO_STREAM:
            hook = (lambda s: lambda mod, args, out: records.append((s, two_stream_attention(args))))(site)
            handles.append(site.module.attention_tap.register_forward_hook(hook))
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def call_kwargs(args, kwargs) -> dict:
    """The keyword form of a ``MultiheadAttention.forward`` call."""
    merged = dict(zip(_FORWARD_PARAMS, args))
    merged.update(kwargs)
    return merged


@contextmanager
def _per_head_path(module, scheme: Optional[str]):
    """Route the call through code that returns per-head probabilities, and
    optionally compute one component ('dnas' or 'unas') of an HNAS module."""
    saved = (module.skip_embed_dim_check, getattr(module, "scheme", None))
    module.skip_embed_dim_check = True  # fairseq's own Python attention path
    if scheme is not None:
        module.scheme = scheme
    try:
        yield
    finally:
        module.skip_embed_dim_check = saved[0]
        if scheme is not None:
            module.scheme = saved[1]


def head_probs(module, kwargs: dict, scheme: Optional[str] = None):
    """Run ``module`` on the captured call ``kwargs`` again, asking for weights.

    Returns (output (T_q, B, C), probabilities (H, B, T_q, T_k)). With
    ``scheme`` ('dnas' or 'unas') an HNAS module computes that component alone.
    """
    if kwargs.get("incremental_state") is not None:
        raise RuntimeError(
            "attention capture needs full (teacher-forced) forward passes, not "
            "incremental decoding"
        )
    kw = dict(kwargs, need_weights=True, need_head_weights=True)
    with _per_head_path(module, scheme), torch.no_grad():
        out, probs = module.forward(**kw)  # .forward: hooks do not fire again
    return out, probs


def check_same_output(recomputed: Tensor, observed: Tensor, what: str) -> None:
    """The re-run must reproduce the model's own output (else dropout is on,
    or the module's math changed): float32 rounding only."""
    scale = 1.0 + observed.detach().abs().max().item()
    diff = (recomputed.detach().float() - observed.detach().float()).abs().max().item()
    if not diff <= 1e-4 * scale:
        raise RuntimeError(
            f"{what}: re-running the attention to read its weights gave a "
            f"different output (max diff {diff:.3g}); put the model in eval mode "
            "(model.eval()) so that dropout is off"
        )


# The stream name of the one attention of a single-stream encoder layer.
SINGLE_STREAM = "self"


def stream_probs(module, call: dict, observed: Optional[Tensor] = None, what: str = "") -> dict:
    """{``SINGLE_STREAM``: per-head probabilities (H, B, T_q, T_k)} of one
    captured self-attention call of a single-stream module (fairseq's
    ``MultiheadAttention``, ``DNASMultiheadAttention``: UNAS, DNAS, the HNAS
    mixture; ``DiscreteMultiheadAttention``: the S it used), its re-run
    checked against ``observed`` (the output the model produced) when given.
    Two-stream modules are read at their ``attention_tap`` instead
    (``EncoderAttention``): {'model': S, 'controller': A}.
    """
    out, probs = head_probs(module, call)
    if observed is not None:
        check_same_output(out, observed, what)
    return {SINGLE_STREAM: probs}


class Hooks:
    """Hooks registered by ``__enter__`` (kept in ``self._handles``) and
    removed when the ``with`` block ends, however it ends."""

    def __init__(self):
        self._handles = []

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


class EncoderAttention(Hooks):
    """While active (``with``), every forward of ``model`` appends to
    ``self.calls`` one list with one dict per encoder layer (bottom up):
    {stream name: per-head attention probabilities (H, B, T_q, T_k)}:
    ``{SINGLE_STREAM: p}`` for a single-stream layer (``stream_probs``),
    ``{'model': S, 'controller': A}`` for a two-stream one (as it used them). The model runs unchanged (gradients included); the
    probabilities are read without gradient.

    ``kind='decoder_cross'`` reads the decoder's cross-attention layers the
    same way instead (queries: target positions, keys: source positions);
    the model must then run full (teacher-forced) forwards.
    """

    def __init__(self, model, kind: str = "encoder_self"):
        super().__init__()
        if kind not in ("encoder_self", "decoder_cross"):
            raise ValueError(f"kind {kind!r}: choose 'encoder_self' or 'decoder_cross'")
        self.sites = [s for s in attention_sites(model, decoder=kind != "encoder_self") if s.kind == kind]
        self.kind = kind
        self.calls: List[List[dict]] = []

    def __enter__(self):
        for site in self.sites:
            if site.scheme == TWO_STREAM:  # read at its attention_tap, as it used them
                self._handles.append(site.module.attention_tap.register_forward_hook(self._tap_hook(site)))
            else:
                self._handles.append(site.module.register_forward_hook(self._hook(site), with_kwargs=True))
        return self

    def _record(self, site, named):
        if site.layer == 0:
            self.calls.append([])
        self.calls[-1].append(named)

    def _hook(self, site):
        def hook(module, args, kwargs, output):
            self._record(site, stream_probs(module, call_kwargs(args, kwargs), output[0],
                                           f"{site.kind} layer {site.layer}"))

        return hook

    def _tap_hook(self, site):
        def hook(module, args, output):
            parts = two_stream_attention(args)
            self._record(site, {"model": parts["model_S"], "controller": parts["controller_A"]})

        return hook
