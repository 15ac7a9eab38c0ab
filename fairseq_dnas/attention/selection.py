"""Which path and which Triton kernel set a call runs: the rules, in one place.

``choose`` turns the settings of a call (the ``path`` argument or
``FAIRSEQ_DNAS_ATTENTION_PATH``, ``FAIRSEQ_DNAS_TRITON_SHORT``, the device,
dtype, head size and lengths, Sinkhorn iterations, dropout, need_weights)
into a ``Choice``. ``dispatch.resolve`` applies it once per call (with the
dropout probability and the kernel function, ``attention_function``);
``python -m fairseq_dnas.check`` lists the kernel sets of each configuration
(``kernel_sets``). Nothing here imports triton until ``attention_function``
is called.

Names: a *path* (``PATHS``) is how ``kernels.attend`` computes a call;
'flash' is the CPU path on PyTorch's own flash-attention kernels
(``fused.py``). A *kernel set* (``KERNEL_SETS``) is a file of Triton kernels
under ``attention/triton/`` that the path 'triton' runs: 'short' (one tile a
head), 'long' (any length) or 'lean' (any length, one normalization round,
fewer passes; its dq sums with atomic adds, so it is not bitwise repeatable).
'lean' runs where ``FAIRSEQ_DNAS_TRITON_LEAN=1`` asks for it, or where
``LEAN_CHOSEN`` (filled from a GPU's measurements) chose it; never under
``torch.use_deterministic_algorithms(True)``.
"""

import dataclasses
import importlib.util
import os
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention import primitives

PATHS = ("auto", "materialized", "dense", "flash", "blockwise", "fused", "triton")
PATH_ENV = "FAIRSEQ_DNAS_ATTENTION_PATH"
# The Triton kernel sets, named after their files in attention/triton/: one
# tile a head for short inputs, and the long-sequence kernels (any length, any
# number of Sinkhorn rounds).
KERNEL_SETS = ("short", "long", "lean")
# Former names of kernel sets: an error that says the new one, not a silent guess.
RENAMED_KERNEL_SETS = {"flash": "long"}
SHORT_ENV = "FAIRSEQ_DNAS_TRITON_SHORT"
SHORT_MODES = ("auto", "0")  # auto: the one-tile kernels wherever SHORT_MAX allows; 0: never
LEAN_ENV = "FAIRSEQ_DNAS_TRITON_LEAN"
# auto: the lean kernels where LEAN_CHOSEN says so; 1: wherever the long ones would run; 0: never
LEAN_MODES = ("auto", "1", "0")
# Length bands of LEAN_CHOSEN: the longer of T_q, T_k up to 512, 1024, 2048, and beyond (the last).
LEAN_BANDS = (512, 1024, 2048, 4096)
# Where ``auto`` runs the lean kernels (triton/lean.py) instead of the long
# ones: {(input kind, head size class, scheme, band): "lean" | "long"}, the set
# a GPU's clock chose (benchmarks/gpu_lean.py measures both and writes this
# table; ``read_lean_table`` reads its JSON). From an H200, fp16 and bf16,
# dropout 0 and 0.1: the lean set was faster in every band at both head sizes
# (docs/results/2026-11-28-h200-lean-kernels.md; tests/test_lean.py checks this
# table against that record's JSON). float32 was not timed: long.
LEAN_CHOSEN = {(kind, head, scheme, band): "lean" for kind in ("half",) for head in (64, 128)
               for scheme in ("dnas", "hnas") for band in LEAN_BANDS}
# The longest T_q, T_k the one-tile kernels (triton/short.py) take, by input
# kind (half: float16/bfloat16), head size class and scheme; 0: never. A CTA
# holds the whole score block, at most short.BLOCK_MAX (128) a side. In half
# precision both schemes and both head sizes go to 128: on an H100 their GPU
# time is below the long kernels' in every case measured, including the
# 128 x 128 tiles where ptxas spills registers (HNAS, head size 128;
# docs/results/2026-11-27-h100-one-tile-defaults.md). float32 (products on
# the FMA units) spills kilobytes even at 64 and runs the long kernels.
SHORT_MAX = {
    ("half", 64, "dnas"): 128, ("half", 64, "hnas"): 128,
    ("half", 128, "dnas"): 128, ("half", 128, "hnas"): 128,
    ("float32", 64, "dnas"): 0, ("float32", 64, "hnas"): 0,
    ("float32", 128, "dnas"): 0, ("float32", 128, "hnas"): 0,
}


def _env_length(name: str, default: int) -> int:
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name} must be an integer (a sequence length); got {value!r}") from None


# Longest sequence for which ``auto`` materializes the T x T probabilities off
# the Triton kernels (override: FAIRSEQ_DNAS_DENSE_MAX_LEN): the dense path is
# the faster one on CPU up to here, but keeps (B, H, T, T) tensors; beyond it
# memory decides (the figures: docs/performance.md).
DENSE_MAX_LEN = _env_length("FAIRSEQ_DNAS_DENSE_MAX_LEN", 160)


@dataclasses.dataclass(frozen=True)
class Choice:
    """What a call runs: ``path`` is 'materialized', 'dense', 'flash',
    'blockwise' or 'triton'; with 'triton', ``kernels`` names the kernel set
    ('short', 'long' or 'lean') and ``forced`` says the path was asked for by name
    (then never checked, never a fallback: failures are errors)."""

    path: str
    kernels: Optional[str] = None
    forced: bool = False


def kernels_by_default(device: torch.device) -> bool:
    """Whether ``auto`` takes the Triton kernels (and ``selfcheck`` checks
    them) for tensors on ``device``: CUDA only. Tests patch this to drive
    the ``auto`` path under Triton's interpreter on CPU."""
    return device.type == "cuda"


def requested_path(path: Optional[str] = None) -> str:
    """``path``, else ``FAIRSEQ_DNAS_ATTENTION_PATH``, else 'auto'; checked."""
    requested = path or os.environ.get(PATH_ENV) or "auto"
    if requested not in PATHS:
        raise ValueError(
            f"unknown attention path {requested!r} (argument path= or ${PATH_ENV}); "
            f"choose one of {', '.join(PATHS)}"
        )
    return requested


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


def short_mode() -> str:
    """``FAIRSEQ_DNAS_TRITON_SHORT``: 'auto' (default) or '0'; another value
    raises ValueError naming these."""
    value = os.environ.get(SHORT_ENV, "auto") or "auto"
    if value not in SHORT_MODES:
        raise ValueError(f"${SHORT_ENV}={value!r} is not allowed; choose one of {', '.join(SHORT_MODES)} "
                         "(auto: the one-tile kernels for inputs up to SHORT_MAX; 0: never, the long kernels "
                         "at every length)")
    return value


def short_max(head_dim: int, dtype: torch.dtype, scheme: str = "dnas") -> int:
    """The longest T_q, T_k of the one-tile kernels for this head size, dtype and scheme (``SHORT_MAX``)."""
    return SHORT_MAX["float32" if dtype == torch.float32 else "half", 64 if head_dim <= 64 else 128, scheme]


def lean_mode() -> str:
    """``FAIRSEQ_DNAS_TRITON_LEAN``: 'auto' (default), '1' or '0'; another
    value raises ValueError naming these."""
    value = os.environ.get(LEAN_ENV, "auto") or "auto"
    if value not in LEAN_MODES:
        raise ValueError(f"${LEAN_ENV}={value!r} is not allowed; choose one of {', '.join(LEAN_MODES)} "
                         "(auto: the lean kernels where a GPU's measurements chose them, selection.LEAN_CHOSEN; "
                         "1: wherever the long kernels would run; 0: never)")
    return value


def lean_band(length: int) -> int:
    """The ``LEAN_BANDS`` entry of a length: the first bound >= it, the last for anything longer."""
    return next((bound for bound in LEAN_BANDS if length <= bound), LEAN_BANDS[-1])


def lean_key(length: int, head_dim: int, dtype: torch.dtype, scheme: str) -> Tuple[str, int, str, int]:
    """The ``LEAN_CHOSEN`` key of a call: (input kind, head size class, scheme, band)."""
    return ("float32" if dtype == torch.float32 else "half", 64 if head_dim <= 64 else 128, scheme,
            lean_band(length))


def deterministic() -> bool:
    """Whether torch must run deterministic algorithms (``torch.use_deterministic_algorithms``):
    then the long kernels, whose sums are bitwise repeatable, run instead of the lean ones."""
    return torch.are_deterministic_algorithms_enabled()


def lean_instead_of_long(sinkhorn_iters: int, length: int, head_dim: int, dtype: torch.dtype, scheme: str) -> bool:
    """Whether a call the long kernels would run takes the lean ones: one
    Sinkhorn round, no deterministic algorithms, and FAIRSEQ_DNAS_TRITON_LEAN=1
    or (auto) ``LEAN_CHOSEN`` naming 'lean' for its key."""
    mode = lean_mode()
    if mode == "0" or sinkhorn_iters != 1 or deterministic():
        return False
    return mode == "1" or LEAN_CHOSEN.get(lean_key(length, head_dim, dtype, scheme)) == "lean"


def kernel_set(sinkhorn_iters: int, tq: int, tk: int, head_dim: int, dtype: torch.dtype, scheme: str) -> str:
    """'short' where both lengths are at most ``short_max`` and one Sinkhorn
    round runs (unless ``FAIRSEQ_DNAS_TRITON_SHORT=0``); else 'lean' where
    ``lean_instead_of_long`` says so, else 'long'."""
    if short_mode() == "auto" and sinkhorn_iters == 1 and max(tq, tk) <= short_max(head_dim, dtype, scheme):
        return "short"
    return "lean" if lean_instead_of_long(sinkhorn_iters, max(tq, tk), head_dim, dtype, scheme) else "long"


def kernel_sets(sinkhorn_iters: int, head_dim: int, dtype: torch.dtype, scheme: str) -> Tuple[str, ...]:
    """Every kernel set a call of this configuration may run, shortest inputs
    first (what ``python -m fairseq_dnas.check`` checks)."""
    sets = ["short"] if kernel_set(sinkhorn_iters, 1, 1, head_dim, dtype, scheme) == "short" else []
    for bound in LEAN_BANDS:  # every band of the lengths beyond the one-tile kernels
        if bound > short_max(head_dim, dtype, scheme) or short_mode() == "0" or sinkhorn_iters != 1:
            name = "lean" if lean_instead_of_long(sinkhorn_iters, bound, head_dim, dtype, scheme) else "long"
            if name not in sets:
                sets.append(name)
    return tuple(sets)


def read_lean_table(path: str) -> dict:
    """``LEAN_CHOSEN``'s entries from the JSON that benchmarks/gpu_lean.py
    writes: {"chosen": [{"kind": "half", "head": 64, "scheme": "dnas",
    "band": 1024, "set": "lean"}, ...], ...}. Raises ValueError saying what
    to fix."""
    import json

    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as JSON ({e}); give the file benchmarks/gpu_lean.py wrote") from None
    rows = data.get("chosen") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f'{path}: expected an object with a "chosen" list (what benchmarks/gpu_lean.py writes)')
    table = {}
    for row in rows:
        key = (row.get("kind"), row.get("head"), row.get("scheme"), row.get("band")) if isinstance(row, dict) else None
        if (key is None or key[0] not in ("half", "float32") or key[1] not in (64, 128)
                or key[2] not in ("dnas", "hnas") or key[3] not in LEAN_BANDS or row.get("set") not in ("lean", "long")):
            raise ValueError(f"{path}: bad entry {row!r}: kind half/float32, head 64/128, scheme dnas/hnas, "
                             f"band one of {', '.join(map(str, LEAN_BANDS))}, set lean/long")
        table[key] = row["set"]
    return table


def check_kernel_set(kernels: str) -> str:
    """``kernels`` if it names a kernel set, else ValueError (a former name:
    saying the new one)."""
    if kernels in KERNEL_SETS:
        return kernels
    if kernels in RENAMED_KERNEL_SETS:
        raise ValueError(f"the Triton kernel set {kernels!r} is now called {RENAMED_KERNEL_SETS[kernels]!r} "
                         f"(attention/triton/{RENAMED_KERNEL_SETS[kernels]}.py); use that name")
    raise ValueError(f"unknown Triton kernel set {kernels!r}; choose one of {', '.join(KERNEL_SETS)}")


def attention_function(kernels: str) -> Callable[..., Tensor]:
    """``triton_attention`` of the kernel set ``kernels`` (imports triton,
    hence the imports here); every set takes the same arguments and draws
    the same dropout mask. Read from the module at each call, so that a
    test's monkeypatch of ``<set>.triton_attention`` is what runs."""
    if check_kernel_set(kernels) == "short":
        from fairseq_dnas.attention.triton import short as module
    elif kernels == "lean":
        from fairseq_dnas.attention.triton import lean as module
    else:
        from fairseq_dnas.attention.triton import long as module
    return module.triton_attention


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


def choose(
    q: Tensor,
    k: Optional[Tensor] = None,
    *,
    scheme: str = "dnas",
    sinkhorn_iters: int = 1,
    dropout: bool = False,
    need_weights: bool = False,
    path: Optional[str] = None,
) -> Choice:
    """The ``Choice`` for scaled queries ``q`` (B, H, T_q, D) and keys ``k``
    (B, H, T_k, D; None: as many as queries). 'fused' resolves to 'flash'
    or 'blockwise'; 'auto' to 'triton' where ``kernels_by_default`` and the
    kernels run, else to ``fallback_path``. A forced path that cannot run
    these settings raises ValueError saying why."""
    requested = requested_path(path)
    if requested == "materialized":
        return Choice(requested)
    needs_probs = need_weights or dropout
    if requested == "triton":
        problem = triton_problem(q)
        if problem is not None:
            raise ValueError(f"attention path 'triton' cannot run here: {problem}. Use 'auto'")
    if requested == "triton" or (requested == "auto" and kernels_by_default(q.device) and not need_weights
                                 and triton_problem(q) is None):
        tk = q.shape[-2] if k is None else k.shape[-2]
        kernels = kernel_set(sinkhorn_iters, q.shape[-2], tk, q.shape[-1], q.dtype, scheme)
        return Choice("triton", kernels, forced=requested == "triton")
    if requested == "auto":
        return Choice(fallback_path(q, sinkhorn_iters=sinkhorn_iters, needs_probs=needs_probs))
    if sinkhorn_iters > 1:
        raise ValueError(
            f"attention path {requested!r} runs one normalization round (the paper's DNAS); "
            f"sinkhorn_iters={sinkhorn_iters} needs path 'materialized', 'triton' or 'auto'"
        )
    if requested == "dense":
        return Choice(requested)
    if needs_probs:
        what = "attention dropout" if dropout else "need_weights"
        raise ValueError(
            f"attention path {requested!r} keeps no probabilities, so it cannot apply "
            f"{what}; use path 'dense' or 'auto' (or set the attention dropout to 0)"
        )
    if requested == "fused":
        return Choice("flash" if primitives.FlashCPU.supports(q) else "blockwise")
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
    return Choice(requested)


def choose_path(q: Tensor, **settings) -> str:
    """``choose(q, **settings).path``."""
    return choose(q, **settings).path
