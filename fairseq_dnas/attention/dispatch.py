"""What one attention call runs, resolved once: the ``Decision``.

``kernels.attend`` calls ``resolve`` once per call and then only reads the
``Decision`` it returns; nothing below is computed twice in a call. The
chain, in the order it runs (CUDA, ``auto``, DNAS or HNAS):

    kernels.attend(q, k, v, scheme=..., dropout=..., path=...)
      dispatch.resolve                      -> Decision, built once:
        selection.dropout_p(dropout)          the drop probability (0.0: drops nothing)
        selection.choose(...)                 the rules: path, Triton kernel set, forced?
        selection.attention_function(set)     short, long or lean .triton_attention
        selfcheck.config_of(...)              what the first-use check covers ('auto' only)
        selection.fallback_path(...)          what runs if the kernels are off ('auto' only)
      kernels._run_triton(decision, ...)
        selfcheck.triton_usable(decision.checked, decision.function)   first use: compare
        decision.function(q, k, v, ..., dropout_p=decision.dropout_p)  the kernels
      (kernels off for this configuration: the CPU paths on decision.fallback)

The path forced by name (``path='triton'`` or
``FAIRSEQ_DNAS_ATTENTION_PATH=triton``) has ``checked`` None: no check, no
fallback, every failure an error. Every other path ('materialized', 'dense',
'flash', 'blockwise') is a ``Decision`` with only ``path`` set, and
``kernels.attend`` runs it in plain torch.
"""

import dataclasses
from typing import Callable, Optional

from torch import Tensor

from fairseq_dnas.attention import selection, selfcheck


@dataclasses.dataclass(frozen=True)
class Decision:
    """Everything a call needs to run, fixed before it runs.

    ``path``: 'materialized', 'dense', 'flash', 'blockwise' or 'triton'.
    With 'triton': ``kernels`` the kernel set ('short', 'long' or 'lean'),
    ``function`` its ``triton_attention``, ``dropout_p`` the probability the
    kernels drop with (0.0: no dropout), ``checked`` the configuration of
    the first-use check (None: the path was forced by name, no check and no
    fallback) and ``fallback`` the path that runs where the kernels are off
    for ``checked``."""

    path: str
    kernels: Optional[str] = None
    function: Optional[Callable[..., Tensor]] = None
    dropout_p: float = 0.0
    checked: Optional[selfcheck.Config] = None
    fallback: Optional[str] = None


def resolve(q: Tensor, k: Tensor, *, scheme: str, padding: bool, sinkhorn_iters: int = 1,
            dropout: Optional[Callable[[Tensor], Tensor]] = None, need_weights: bool = False,
            path: Optional[str] = None) -> Decision:
    """The ``Decision`` for scaled queries ``q`` (B, H, T_q, D) and keys ``k``
    (B, H, T_k, D); ``padding``: a key or query padding mask is given.
    Raises ValueError where the settings cannot run (``selection.choose``)
    or the Triton kernels cannot learn the drop probability."""
    if scheme == "unas":
        # The plugin's module hands UNAS to fairseq's own attention; here it is
        # only reached by direct callers (tests, benchmarks): the reference math.
        selection.requested_path(path)  # a bad path is still an error
        return Decision("materialized")
    p = selection.dropout_p(dropout)  # 0.0 exactly where selection.dropout_active is False
    choice = selection.choose(q, k, scheme=scheme, sinkhorn_iters=sinkhorn_iters, dropout=p != 0.0,
                              need_weights=need_weights, path=path)
    if choice.path != "triton":
        return Decision(choice.path)
    if p is None:
        raise ValueError(
            "attention path 'triton' applies dropout inside its kernels and needs its "
            "probability: pass a dropout module with a `p` attribute (fairseq's FairseqDropout)"
        )
    function = selection.attention_function(choice.kernels)  # imports triton
    if choice.forced:
        return Decision("triton", choice.kernels, function, p)
    checked = selfcheck.config_of(q, scheme, padding=padding, dropout=p > 0, sinkhorn_iters=sinkhorn_iters,
                                  kernels=choice.kernels)
    fallback = selection.fallback_path(q, sinkhorn_iters=sinkhorn_iters, needs_probs=need_weights or p != 0.0)
    return Decision("triton", choice.kernels, function, p, checked, fallback)
