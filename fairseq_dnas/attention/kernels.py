"""Attention outputs ``probs @ V`` for every scheme: the execution paths.

``attend`` is what the fairseq module (self-attention) and
``fairseq_dnas.nn.MultiheadAttention`` (also cross-attention) call. It takes
per-head queries (already scaled by 1/sqrt(d)) of shape (B, H, T_q, D), keys
and values (B, H, T_k, D), and returns the output (B, H, T_q, D) and, when
asked, the probabilities (B, H, T_q, T_k).

Paths (all compute the same function; ``tests/test_kernels.py`` checks each
against the float64 reference, forward and gradients):

- ``materialized``: autograd through ``functional`` (the readable reference;
  with ``triton``, the only path for ``sinkhorn_iters > 1``).
- ``dense``: (B, H, T, T) probabilities with a hand-written backward
  (``dense.py``); supports attention dropout and ``need_weights``.
- ``flash``: no T x T matrix; PyTorch's CPU flash-attention kernels with the
  DNAS key bias and closed-form backward (``fused.py``). CPU, float32/64
  (a bias rounded to half precision inside the kernel would lose c).
- ``blockwise``: the same algorithm on a plain-torch kernel that processes
  query blocks in float32 (``primitives.Blockwise``); any device and dtype.
- ``fused``: ``flash`` where it applies, else ``blockwise``.
- ``triton``: Triton kernels (``triton_flash.py``), no T x T matrix forward
  or backward, attention dropout inside the kernel; CUDA tensors (CPU tensors
  only under Triton's interpreter, ``TRITON_INTERPRET=1``, for tests);
  float16/bfloat16/float32, head size <= 128, any ``sinkhorn_iters``
  (``triton_sinkhorn.py``). ``need_weights`` is served by a separate
  computation of the (pre-dropout) probabilities, outside autograd.
- ``auto`` (default): on CUDA ``triton`` wherever it applies (any length,
  with or without dropout; ``dense`` when the weights are asked for); on CPU
  ``dense`` for short sequences, attention dropout and ``need_weights``,
  ``fused`` for long sequences. Sinkhorn iterations > 1: ``triton`` on CUDA,
  else ``materialized``.

The fallback (``auto`` only): where the kernels cannot compile or launch, or
where the first-use check (``selfcheck.py``: the first call of each
configuration in a process compares them with the float64 math, forward and
gradients) finds them wrong, ``auto`` takes for that configuration what it
takes on CPU (``fallback_path``: ``materialized`` for Sinkhorn iterations > 1,
``dense`` for short sequences, dropout and ``need_weights``, ``blockwise`` for
long ones; ``flash`` never applies to CUDA tensors), with one
``selfcheck.TritonFallbackWarning`` per configuration naming it and the
reason. A forced ``triton`` (argument or environment) is never checked and
never falls back: its failures are errors. A failure in the backward of a real
call cannot be rerouted and raises; the first-use check runs the backward
kernels, so such failures are caught before the first real step (see
``selfcheck.py``). ``FAIRSEQ_DNAS_TRITON_CHECK=0`` turns the check off (the
fallback on compile/launch errors stays).

'unas' always runs ``materialized`` here: the fairseq module never calls
``attend`` for it (it hands UNAS to fairseq's own attention).

The environment variable ``FAIRSEQ_DNAS_ATTENTION_PATH`` (or the ``path``
argument) forces a path, for tests and benchmarks.

Which Triton kernels (``triton_kernels``, the one place that decides):
``FAIRSEQ_DNAS_TRITON_KERNELS`` = ``v1`` (``triton_flash.py``: five kernels
a step, the key-major backward with three accumulators), ``v2``
(``triton_flash_v2.py``: four kernels a step, the small reductions folded
in, q centred once per head, exp2 domain, no atomics) or ``auto`` (default):
``v1`` until a GPU has timed ``v2`` faster (docs/performance.md). Sinkhorn
iterations > 1 always run ``v1`` (``triton_sinkhorn.py`` extends only it).
Short inputs (T_q, T_k <= ``short_max``: 128 or 64 by head size and
scheme, never float32) run ``v2-short`` (``triton_short.py``: one tile a
head, two kernels a step) wherever ``FAIRSEQ_DNAS_TRITON_SHORT`` allows:
``auto`` (default) when ``v2`` is selected, ``1`` whatever the version,
``0`` never.
"""

import importlib.util
import os
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention import primitives, selfcheck
from fairseq_dnas.attention.dense import dense_probs
from fairseq_dnas.attention.fused import fused_dnas, fused_hnas

PATHS = ("auto", "materialized", "dense", "flash", "blockwise", "fused", "triton")
PATH_ENV = "FAIRSEQ_DNAS_ATTENTION_PATH"
KERNELS_ENV = "FAIRSEQ_DNAS_TRITON_KERNELS"
KERNEL_VERSIONS = ("auto", "v1", "v2")
SHORT_ENV = "FAIRSEQ_DNAS_TRITON_SHORT"
SHORT_MODES = ("auto", "0", "1")
# The longest T_q, T_k the one-tile kernels (triton_short.py) take, by input
# kind, head size class and scheme: a CTA holds the whole score block, and
# these are the tiles whose kernels compile for sm_90 without register spills
# (benchmarks/triton_spills.py, docs/performance.md#the-one-tile-kernels-for-short-inputs).
# At 128 x 128 the backward holds three float32 score tiles for HNAS (pi_D,
# pi_U, G; 64 registers each at 8 warps) and spills 288-664 bytes, DNAS at
# head size 128 8-104 bytes: those stop at 64. float32 (exact products on
# the FMA units) spills kilobytes even at 64: never.
SHORT_MAX = {
    ("half", 64, "dnas"): 128, ("half", 64, "hnas"): 64,
    ("half", 128, "dnas"): 64, ("half", 128, "hnas"): 64,
    ("float32", 64, "dnas"): 0, ("float32", 64, "hnas"): 0,
    ("float32", 128, "dnas"): 0, ("float32", 128, "hnas"): 0,
}
# What ``auto`` runs: v1 until a GPU has timed v2 faster on the kernels-alone
# benchmark (benchmarks/benchmark.py --sections kernels); the change that
# measures it flips this and records the figures in docs/performance.md.
AUTO_KERNELS = "v1"
# Device types on which ``auto`` takes the Triton kernels. Tests add "cpu" to
# drive the auto path (its first-use check and fallback) under Triton's interpreter.
AUTO_TRITON_DEVICES = ("cuda",)

# Longest sequence for which ``auto`` materializes the T x T probabilities
# (override: FAIRSEQ_DNAS_DENSE_MAX_LEN). The ``crossover`` section of
# benchmarks/benchmark.py (docs/performance.md; 2-core AMD EPYC, torch 2.13)
# found the dense path faster than the fused one at every length from 64 to
# 512 positions (time x fairseq: DNAS 1.03-1.15 dense vs 1.16-1.28 fused, HNAS
# 1.00-1.43 vs 1.26-1.82), but it keeps (B, H, T, T) tensors: past Gigaword's 128 source
# positions memory, not time, decides, and the fused path keeps peak memory
# within 1.12x of fairseq's fused attention at any length.
def _env_length(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} must be an integer (a sequence length); got {value!r}") from None


DENSE_MAX_LEN = _env_length("FAIRSEQ_DNAS_DENSE_MAX_LEN", 160)


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


def triton_problem(q: Tensor) -> Optional[str]:
    """Why the ``triton`` path cannot run on ``q``, or None if it can.

    Checked without importing triton, so CPU users never pay for it.
    """
    if importlib.util.find_spec("triton") is None:
        return "it needs the triton package (CUDA builds of torch ship it; else: pip install triton)"
    if q.device.type != "cuda" and not (q.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        return (
            f"it runs on CUDA tensors (got {q.device.type}); CPU tensors only under Triton's "
            f"interpreter (TRITON_INTERPRET=1, slow: meant for tests)"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"it takes float16, bfloat16 or float32 inputs (got {q.dtype})"
    if q.shape[-1] > 128:
        return f"it takes head sizes up to 128 (got {q.shape[-1]})"
    return None


def dropout_p(dropout: Optional[Callable[[Tensor], Tensor]]) -> Optional[float]:
    """The drop probability of an active ``dropout``: 0.0 if it drops nothing,
    None if it is active but of unknown kind (no ``p``)."""
    if not dropout_active(dropout):
        return 0.0
    p = getattr(dropout, "p", None)
    return None if p is None else float(p)


def dropout_active(dropout: Optional[Callable[[Tensor], Tensor]]) -> bool:
    """Whether ``dropout`` (fairseq's ``FairseqDropout``) would drop anything."""
    if dropout is None:
        return False
    p = getattr(dropout, "p", None)
    if p is None:
        return True  # an unknown callable: assume it changes the probabilities
    if p == 0:
        return False
    return bool(getattr(dropout, "training", True) or getattr(dropout, "apply_during_inference", False))


def requested_path(path: Optional[str] = None) -> str:
    """``path``, else ``FAIRSEQ_DNAS_ATTENTION_PATH``, else 'auto'; checked."""
    requested = path or os.environ.get(PATH_ENV) or "auto"
    if requested not in PATHS:
        raise ValueError(
            f"unknown attention path {requested!r} (argument path= or ${PATH_ENV}); "
            f"choose one of {', '.join(PATHS)}"
        )
    return requested


def short_max(head_dim: int, dtype: torch.dtype, scheme: str = "dnas") -> int:
    """The longest T_q, T_k of the one-tile kernels for this head size, dtype and scheme (``SHORT_MAX``)."""
    return SHORT_MAX["float32" if dtype == torch.float32 else "half", 64 if head_dim <= 64 else 128, scheme]


def short_mode() -> str:
    """``FAIRSEQ_DNAS_TRITON_SHORT``: 'auto' (default: the one-tile kernels
    for short inputs when v2 is selected), '1' (whatever the version) or '0'
    (never); another value raises ValueError naming these."""
    value = os.environ.get(SHORT_ENV, "auto") or "auto"
    if value not in SHORT_MODES:
        raise ValueError(f"${SHORT_ENV}={value!r} is not allowed; choose one of {', '.join(SHORT_MODES)} "
                         "(auto: the one-tile kernels for T <= 128 when v2 is selected; 1: always there; 0: never)")
    return value


def triton_kernels(sinkhorn_iters: int = 1, tq: Optional[int] = None, tk: Optional[int] = None,
                   head_dim: int = 64, dtype: torch.dtype = torch.float16, scheme: str = "dnas") -> str:
    """Which Triton kernels run: 'v1', 'v2' or 'v2-short', from
    ``FAIRSEQ_DNAS_TRITON_KERNELS`` (``auto``, the default, is
    ``AUTO_KERNELS``) and ``FAIRSEQ_DNAS_TRITON_SHORT``. Sinkhorn iterations
    > 1 run 'v1' whatever is asked (only v1 has the extra normalization
    rounds). 'v2-short' (``triton_short.py``) where the call's lengths
    ``tq``, ``tk`` are given, both at most ``short_max(head_dim, dtype, scheme)``,
    and the short mode allows it ('auto': when the version is v2; '1':
    always; '0': never). A value other than auto, v1, v2 raises ValueError
    naming them (``short_mode`` likewise)."""
    value = os.environ.get(KERNELS_ENV, "auto") or "auto"
    if value not in KERNEL_VERSIONS:
        raise ValueError(f"${KERNELS_ENV}={value!r} is not a kernel version; choose one of "
                         f"{', '.join(KERNEL_VERSIONS)} (auto: {AUTO_KERNELS} until a GPU has timed v2)")
    version = AUTO_KERNELS if value == "auto" else value
    mode = short_mode()
    if sinkhorn_iters > 1:
        return "v1"
    if tq is not None and max(tq, tk) <= short_max(head_dim, dtype, scheme) and (
            mode == "1" or (mode == "auto" and version == "v2")):
        return "v2-short"
    return version


def short_kernels_selectable(sinkhorn_iters: int, head_dim: int, dtype: torch.dtype, scheme: str) -> bool:
    """Whether some short call of this head size, dtype and scheme would run
    'v2-short' (``triton_kernels``): ``python -m fairseq_dnas.check`` then
    checks the one-tile kernels beside the long ones."""
    return triton_kernels(sinkhorn_iters, 16, 16, head_dim, dtype, scheme) == "v2-short"


def triton_module(sinkhorn_iters: int = 1, version: Optional[str] = None):
    """The module of the kernels ``version`` names, by default those
    ``triton_kernels`` picks for an input of unknown length (imports triton):
    ``triton_flash`` (v1), ``triton_flash_v2`` (v2) or ``triton_short``
    (v2-short); each has ``triton_attention`` and ``dropout_mask`` (the same
    mask)."""
    version = version or triton_kernels(sinkhorn_iters)
    if version == "v2-short":
        from fairseq_dnas.attention import triton_short as module
    elif version == "v2":
        from fairseq_dnas.attention import triton_flash_v2 as module
    else:
        from fairseq_dnas.attention import triton_flash as module
    return module


def fallback_path(q: Tensor, *, sinkhorn_iters: int = 1, needs_probs: bool = False) -> str:
    """What ``auto`` takes where the Triton kernels do not run (CPU tensors,
    and CUDA configurations the kernels failed): 'materialized' for Sinkhorn
    iterations > 1; 'dense' up to ``DENSE_MAX_LEN`` positions and whenever the
    probabilities are needed (dropout, need_weights); beyond that 'flash'
    where PyTorch's CPU kernels apply (CPU float32/64), else 'blockwise'."""
    if sinkhorn_iters > 1:
        return "materialized"
    if needs_probs or q.shape[-2] <= DENSE_MAX_LEN:
        return "dense"
    return "flash" if primitives.FlashCPU.supports(q) else "blockwise"


def choose_path(
    q: Tensor,
    *,
    sinkhorn_iters: int = 1,
    dropout: bool = False,
    need_weights: bool = False,
    path: Optional[str] = None,
) -> str:
    """The concrete path: 'materialized', 'dense', 'flash', 'blockwise' or
    'triton' ('fused' resolves to 'flash' or 'blockwise'; 'auto' to 'triton'
    on CUDA where the kernels run, else to ``fallback_path``).

    ``path`` None reads ``FAIRSEQ_DNAS_ATTENTION_PATH`` (default 'auto'). A
    forced path that cannot run these settings raises ValueError saying why.
    """
    requested = requested_path(path)
    if requested == "materialized":
        return requested
    needs_probs = need_weights or dropout
    if requested == "auto":
        if q.device.type in AUTO_TRITON_DEVICES and not need_weights and triton_problem(q) is None:
            return "triton"
        return fallback_path(q, sinkhorn_iters=sinkhorn_iters, needs_probs=needs_probs)
    if requested == "triton":
        problem = triton_problem(q)
        if problem is not None:
            raise ValueError(f"attention path 'triton' cannot run here: {problem}. Use 'auto'")
        return requested
    if sinkhorn_iters > 1:
        raise ValueError(
            f"attention path {requested!r} runs one normalization round (the paper's DNAS); "
            f"sinkhorn_iters={sinkhorn_iters} needs path 'materialized', 'triton' or 'auto'"
        )
    if requested == "dense":
        return requested
    if needs_probs:
        what = "attention dropout" if dropout else "need_weights"
        raise ValueError(
            f"attention path {requested!r} keeps no probabilities, so it cannot apply "
            f"{what}; use path 'dense' or 'auto' (or set the attention dropout to 0)"
        )
    if requested == "fused":
        return "flash" if primitives.FlashCPU.supports(q) else "blockwise"
    if requested == "flash" and not primitives.FlashCPU.available:
        raise ValueError(
            f"attention path 'flash' needs PyTorch's CPU flash-attention kernels (torch >= 2.2); "
            f"this is torch {torch.__version__}. Use 'fused' or 'auto'"
        )
    if requested == "flash" and not primitives.FlashCPU.supports(q):
        raise ValueError(
            f"attention path 'flash' runs PyTorch's CPU kernels on float32/float64 only; "
            f"got {q.device.type} {q.dtype}. Use 'fused' or 'auto'"
        )
    return requested


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
    chosen = choose_path(
        q,
        sinkhorn_iters=sinkhorn_iters,
        dropout=dropout_active(dropout),
        need_weights=need_weights,
        path=path,
    )
    if scheme == "unas":
        # The plugin's module hands UNAS to fairseq's own attention; here it is
        # only reached by direct callers (tests, benchmarks): the reference math.
        chosen = "materialized"
    if chosen == "triton":
        args = (q, k, v, scheme, pad, qpad, hybrid_weight, dropout, need_weights, sinkhorn_iters)
        if requested_path(path) == "triton":  # forced: no check, no fallback
            return _attend_triton(*args)
        result = _attend_triton_checked(*args)
        if result is not None:
            return result
        chosen = fallback_path(q, sinkhorn_iters=sinkhorn_iters,
                               needs_probs=need_weights or dropout_active(dropout))
    if chosen in ("flash", "blockwise"):
        prim = primitives.FLASH_CPU if chosen == "flash" else primitives.BLOCKWISE
        if scheme == "dnas":
            return fused_dnas(q, k, v, pad, qpad, prim), None
        return fused_hnas(q, k, v, hybrid_weight, pad, qpad, prim), None

    if chosen == "dense":
        probs = dense_probs(q, k, scheme, pad, qpad, hybrid_weight)
    else:
        scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, T_q, T_k)
        probs = materialized_probs(scores, scheme, pad, hybrid_weight, sinkhorn_iters, qpad)
    p = probs.to(v.dtype)
    if dropout is not None:
        p = dropout(p)
    out = torch.matmul(p, v)  # (B, H, T_q, D)
    return out, (probs if need_weights else None)


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


def _triton_dropout_p(dropout) -> float:
    p = dropout_p(dropout)
    if p is None:
        raise ValueError(
            "attention path 'triton' applies dropout inside its kernels and needs its "
            "probability: pass a dropout module with a `p` attribute (fairseq's FairseqDropout)"
        )
    return p


def _attend_triton_checked(q, k, v, scheme, pad, qpad, hybrid_weight, dropout, need_weights, sinkhorn_iters):
    """``_attend_triton`` on the ``auto`` path: None where the kernels are off
    for this configuration (the first-use check failed now or before), or
    where they cannot compile or launch now (then off from here on)."""
    p = _triton_dropout_p(dropout)  # a caller's error, not the kernels': raised
    config = selfcheck.config_of(q, scheme, padding=pad is not None or qpad is not None, dropout=p > 0,
                                 sinkhorn_iters=sinkhorn_iters, kernels=_call_kernels(q, k, sinkhorn_iters, scheme))
    if not selfcheck.triton_usable(config):
        return None
    try:
        return _attend_triton(q, k, v, scheme, pad, qpad, hybrid_weight, dropout, need_weights, sinkhorn_iters)
    except torch.cuda.OutOfMemoryError:
        raise  # the fallback needs more memory, not less
    except Exception as e:  # noqa: BLE001 (triton's compile and launch errors have no common base class)
        selfcheck.disable(config, f"the kernels could not compile or launch ({type(e).__name__}: "
                                  f"{selfcheck.first_line(e)})")
        return None


def _call_kernels(q: Tensor, k: Tensor, sinkhorn_iters: int, scheme: str) -> str:
    """``triton_kernels`` for the lengths, head size, dtype and scheme of this call."""
    return triton_kernels(sinkhorn_iters, q.shape[-2], k.shape[-2], q.shape[-1], q.dtype, scheme)


def _attend_triton(q, k, v, scheme, pad, qpad, hybrid_weight, dropout, need_weights, sinkhorn_iters=1):
    p = _triton_dropout_p(dropout)
    out = triton_module(sinkhorn_iters, _call_kernels(q, k, sinkhorn_iters, scheme)).triton_attention(  # imports
        q, k, v,
        hybrid_weight=hybrid_weight if scheme == "hnas" else None,
        key_padding_mask=pad,
        query_padding_mask=qpad,
        dropout_p=p,
        sinkhorn_iters=sinkhorn_iters,
    )
    weights = None
    if need_weights:  # the pre-dropout probabilities, as fairseq returns them
        with torch.no_grad():
            if sinkhorn_iters == 1:
                weights = dense_probs(q, k, scheme, pad, qpad, hybrid_weight)
            else:
                scores = torch.matmul(q, k.transpose(-1, -2))
                weights = materialized_probs(scores, scheme, pad, hybrid_weight, sinkhorn_iters, qpad)
    return out, weights
