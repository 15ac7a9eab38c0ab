"""Attention outputs ``probs @ V`` for every scheme: the execution paths.

``attend`` is what the fairseq module (self-attention) and
``fairseq_dnas.nn.MultiheadAttention`` (also cross-attention) call: scaled
queries (B, H, T_q, D), keys and values (B, H, T_k, D) in, the output
(B, H, T_q, D) and, when asked, the probabilities (B, H, T_q, T_k) out.

Every path computes the same function (``tests/test_kernels.py`` holds each
to the float64 reference, forward and gradients): ``materialized`` (autograd
through ``functional.py``), ``dense`` (``dense.py``), ``flash`` and
``blockwise`` (no T x T matrix on CPU: ``fused.py``, ``primitives.py``) and
``triton`` (the GPU kernels of ``attention/triton/``). ``dispatch.resolve``
decides once per call which one runs, by the rules of ``selection.py``
(``auto`` by default: the Triton kernels on CUDA, else the CPU paths); on
the ``auto`` path the kernels are checked on first use and fall back where
they fail (``selfcheck.py``); the call chain is in ``dispatch.py``'s
docstring. 'unas' always runs ``materialized`` here: the fairseq module
hands UNAS to fairseq's own attention. Details: docs/math.md,
docs/performance.md.
"""

import dataclasses
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention import dispatch, primitives, selection, selfcheck, triton_op
from fairseq_dnas.attention.dense import dense_probs
from fairseq_dnas.attention.fused import fused_dnas, fused_hnas
from fairseq_dnas.attention.tracing import compiling
from fairseq_dnas.attention.selection import (  # noqa: F401 (the callers' names for them)
    PATH_ENV, PATHS, Choice, choose_path, dropout_active, dropout_p)


def materialized_probs(
    scores: Tensor,
    scheme: str,
    padding_mask: Optional[Tensor],
    hybrid_weight: Optional[Tensor],
    sinkhorn_iters: int,
    query_padding_mask: Optional[Tensor] = None,
) -> Tensor:
    """Probabilities from a materialized (B, H, T_q, T_k) score matrix;
    ``padding_mask`` pads the keys, ``query_padding_mask`` the queries."""
    return AF.scheme_probs(scores, scheme, padding_mask, query_padding_mask, hybrid_weight, sinkhorn_iters)


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scheme: str,
    padding_mask: Optional[Tensor] = None,
    hybrid_weight: Optional[Tensor] = None,
    sinkhorn_iters: int = 1,
    dropout: Optional[Callable[[Tensor], Tensor]] = None,
    need_weights: bool = False,
    path: Optional[str] = None,
    query_padding_mask: Optional[Tensor] = None,
    score_bias: Optional[Tensor] = None,
) -> Tuple[Tensor, Optional[Tensor]]:
    """Attention output for scaled queries ``q`` and keys/values ``k``, ``v``.

    Self-attention: ``padding_mask`` is (B, T), True at padding: the padded
    positions are both the padded keys and the padded queries; their output
    rows are 0. Cross-attention (T_q may differ from T_k): ``padding_mask``
    (B, T_k) pads the keys and ``query_padding_mask`` (B, T_q) the queries,
    which DNAS leaves out of its column sums (None: no padded query).
    Probabilities are computed in float32 and cast back to the dtype of ``v``
    before ``@ V``, as fairseq does. ``path`` picks the execution path (see the
    module docstring); all paths give the same result.

    ``score_bias`` (1 or B, H or 1, T_q, T_k), e.g. T5's relative position
    bias, is added to the scores before the scheme normalizes them: the
    scheme runs over S + B (``docs/math.md#a-biased-score``), with a gradient
    for B. It runs eagerly on every path but the short and long Triton
    kernel sets: 'dense', 'materialized', the CPU fused paths ('flash',
    'blockwise': B added to each pass's bias, T x T per group of heads) and
    the lean Triton kernels (one normalization round). 'auto' takes the lean
    kernels where it would run any Triton set and they may run, the fused
    paths where it chooses them, else 'dense' ('materialized' for Sinkhorn
    rounds); inside a compiled graph 'dense' or 'materialized' only.
    """
    if scheme == "hnas":
        _check_hybrid_weight_given(hybrid_weight, q.shape[1])
    pad = None if padding_mask is None else padding_mask.bool()
    qpad = pad if query_padding_mask is None else query_padding_mask.bool()
    if query_padding_mask is None and pad is not None and q.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"cross-attention ({q.shape[-2]} queries, {k.shape[-2]} keys) with a key padding mask "
            "needs query_padding_mask (B, T_q), all False when no query is padded"
        )
    if score_bias is not None:
        path = _biased_path(path, sinkhorn_iters)
    decision = dispatch.resolve(q, k, scheme=scheme, padding=pad is not None or qpad is not None,
                                sinkhorn_iters=sinkhorn_iters, dropout=dropout, need_weights=need_weights, path=path)
    if score_bias is not None:
        decision = _biased_decision(decision, path, sinkhorn_iters)
    chosen = decision.path
    if chosen == "triton":
        result = _run_triton(decision, q, k, v, scheme, pad, qpad, hybrid_weight, need_weights, sinkhorn_iters,
                             score_bias)
        if result is not None:
            return result
        chosen = decision.fallback if score_bias is None else _biased_cpu_path(sinkhorn_iters)
    if chosen in ("flash", "blockwise"):
        prim = primitives.FLASH_CPU if chosen == "flash" else primitives.BLOCKWISE
        if scheme == "dnas":
            return fused_dnas(q, k, v, pad, qpad, prim, score_bias), None
        return fused_hnas(q, k, v, hybrid_weight, pad, qpad, prim, score_bias), None

    if chosen == "dense":
        probs = dense_probs(q, k, scheme, pad, qpad, hybrid_weight, score_bias)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, T_q, T_k)
        if score_bias is not None:
            scores = scores + score_bias  # S + B
        probs = materialized_probs(scores, scheme, pad, hybrid_weight, sinkhorn_iters, qpad)
    p = probs.to(v.dtype)
    if dropout is not None:
        p = dropout(p)
    out = torch.matmul(p, v)  # (B, H, T_q, D)
    return out, (probs if need_weights else None)


def _biased_cpu_path(sinkhorn_iters: int) -> str:
    return "materialized" if sinkhorn_iters > 1 else "dense"


def _biased_path(path: Optional[str], sinkhorn_iters: int) -> str:
    """The path requested for a call with a score bias: every path goes on to
    ``dispatch.resolve`` (``_biased_decision`` then keeps the lean kernels
    or takes the score matrix); inside a compiled graph 'auto' takes
    'dense' (the kernels' custom op has no bias input, the fused paths'
    bias gradient is not traced), and a forced fused path is refused."""
    requested = selection.requested_path(path)
    if requested == "auto" and compiling():
        return _biased_cpu_path(sinkhorn_iters)
    if compiling() and requested in ("flash", "blockwise", "fused"):
        raise ValueError(
            f"attention path {requested!r} takes no score bias (a position bias added to the scores, as T5's) "
            f"inside a compiled graph: use path 'auto', 'dense' or 'materialized' (unset {PATH_ENV})"
        )
    return requested


def _biased_decision(decision: dispatch.Decision, path: str, sinkhorn_iters: int) -> dispatch.Decision:
    """With a score bias: the lean Triton kernels as resolved, eagerly; where
    'auto' resolved the short or the long kernel set, the lean set where it
    may run (one round, no deterministic algorithms, not
    FAIRSEQ_DNAS_TRITON_LEAN=0: else the score matrix, O(T^2) memory); where
    'auto' resolved another CPU path than the fused ones, the score matrix
    ('dense', 'materialized' for Sinkhorn rounds); a forced 'triton' on
    another kernel set is refused."""
    if decision.path == "triton" and decision.kernels == "lean" and not compiling():
        return decision
    if (decision.path == "triton" and decision.checked is not None and sinkhorn_iters == 1 and not compiling()
            and selection.lean_mode() != "0" and not selection.deterministic()):
        return dataclasses.replace(decision, kernels="lean", function=selection.attention_function("lean"),
                                   checked=dataclasses.replace(decision.checked, kernels="lean"))
    if decision.path != "triton" or selection.requested_path(path) == "auto":
        return decision if decision.path in ("dense", "materialized", "flash", "blockwise") else dispatch.Decision(
            _biased_cpu_path(sinkhorn_iters))
    why = "inside a compiled graph" if compiling() else f"on the {decision.kernels} kernel set"
    raise ValueError(
        f"attention path 'triton' takes a score bias (a position bias added to the scores, as T5's) only on the "
        f"lean kernels, eagerly, with one normalization round; this call runs {why}: use path 'auto' or 'dense' "
        f"(or {selection.LEAN_ENV}=1 for one round, eagerly)"
    )


def _check_hybrid_weight_given(hybrid_weight: Optional[Tensor], heads: int) -> None:
    """HNAS needs u: without it some paths would run DNAS (the Triton kernels
    take u=None for DNAS). Shape only: checking the values would wait for the GPU."""
    if hybrid_weight is None:
        raise ValueError(
            f"scheme 'hnas' needs hybrid_weight: pass a tensor of shape (H,) = ({heads},) with values "
            "in [0, 1], the weight u of DNAS per head (DNASMultiheadAttention passes its hybrid_weight), "
            "or use scheme='dnas'"
        )
    if not torch.is_tensor(hybrid_weight) or tuple(hybrid_weight.shape) != (heads,):
        got = tuple(hybrid_weight.shape) if torch.is_tensor(hybrid_weight) else type(hybrid_weight).__name__
        raise ValueError(f"hybrid_weight must be a tensor of shape (H,) = ({heads},); got {got}")


def _run_triton(decision, q, k, v, scheme, pad, qpad, hybrid_weight, need_weights, sinkhorn_iters,
                score_bias=None):
    """The output of ``decision.function`` (the Triton kernels), or None on the
    ``auto`` path where they are off for ``decision.checked`` (the first-use
    check failed now or before, or they cannot compile or launch now: then
    off from here on). Forced by name (``checked`` None): no check, no None.
    Inside a compiled graph: the kernels as one custom op (``triton_op``),
    which runs the check itself when the graph runs."""
    if compiling() and triton_op.triton_attention_op is not None and score_bias is None:
        return triton_op.attention(q, k, v, hybrid_weight=hybrid_weight if scheme == "hnas" else None,
                                   key_padding_mask=pad, query_padding_mask=qpad, dropout_p=decision.dropout_p,
                                   sinkhorn_iters=sinkhorn_iters, kernels=decision.kernels, scheme=scheme,
                                   checked=decision.checked is not None), None
    args = (decision, q, k, v, scheme, pad, qpad, hybrid_weight, need_weights, sinkhorn_iters, score_bias)
    if decision.checked is None:
        return _triton_output(*args)
    if not selfcheck.triton_usable(decision.checked, decision.function):
        return None
    try:
        return _triton_output(*args)
    except torch.cuda.OutOfMemoryError:
        raise  # the fallback needs more memory, not less
    except Exception as e:  # noqa: BLE001 (triton's compile and launch errors have no common base class)
        selfcheck.disable(decision.checked, f"the kernels could not compile or launch ({type(e).__name__}: "
                                            f"{selfcheck.first_line(e)})")
        return None


def _triton_output(decision, q, k, v, scheme, pad, qpad, hybrid_weight, need_weights, sinkhorn_iters,
                   score_bias=None):
    bias = {} if score_bias is None else dict(score_bias=score_bias)  # only the lean set takes one
    out = decision.function(
        q, k, v,
        hybrid_weight=hybrid_weight if scheme == "hnas" else None,
        key_padding_mask=pad,
        query_padding_mask=qpad,
        dropout_p=decision.dropout_p,
        sinkhorn_iters=sinkhorn_iters,
        **bias,
    )
    weights = None
    if need_weights:  # the pre-dropout probabilities, as fairseq returns them
        with torch.no_grad():
            if sinkhorn_iters == 1:
                weights = dense_probs(q, k, scheme, pad, qpad, hybrid_weight, score_bias)
            else:
                scores = torch.matmul(q, k.transpose(-1, -2))
                weights = materialized_probs(scores, scheme, pad, hybrid_weight, sinkhorn_iters, qpad)
    return out, weights
