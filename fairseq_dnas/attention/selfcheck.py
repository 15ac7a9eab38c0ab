"""The Triton kernels checked on first use, and the fallback when they fail.

The ``triton`` path is ``auto``'s choice for every CUDA tensor, so a kernel
that miscompiles on some GPU or Triton version would silently train a wrong
model. ``kernels.attend`` therefore asks ``triton_usable`` before it runs the
kernels on the ``auto`` path (the ``Config`` and the kernel function come
from the call's ``dispatch.Decision``). The first time a configuration (``Config``:
device, dtype, head size, scheme, dropout on/off, Sinkhorn iterations,
padding on/off, TF32 for float32, the kernel set ``selection.choose``
picked: everything that selects a different compiled kernel) runs in a
process, ``compare`` runs the kernels it is handed and the
materialized float64 math of ``functional.py`` (an independent computation:
plain torch, no Triton) on a small fixed input, forward and gradients; with
dropout both sides use the kernels' own mask (``triton.dropout.dropout_mask``),
so the check also proves that the mask the kernels apply is the one they
publish. If the kernels raise (cannot compile or launch) or disagree beyond
``tolerances``, one ``TritonFallbackWarning`` names the configuration and the
numbers, and the configuration runs the paths ``auto`` takes without Triton
(``selection.fallback_path``) for the rest of the process. A failure to compile
or launch in a real call (a size the check did not meet) does the same.

A failure in the backward of a real call cannot be rerouted (its forward
already ran on the kernels and autograd holds their graph): it raises. The
check runs the backward kernels too, so a backward that cannot compile or
launch on this GPU, or computes wrong gradients, is caught before the first
real step; a backward failure only at real sizes remains an error.

Cost: the check runs the kernels the first real call compiles anyway, on a
(2, 2, 150, D) input (the one-tile kernels: T = 100 or 50): milliseconds
once the kernels are compiled. It runs where ``auto`` takes the kernels
(``selection.kernels_by_default``: CUDA tensors), never when the path is forced
(``FAIRSEQ_DNAS_ATTENTION_PATH=triton``: failures stay errors there), never
during CUDA graph capture or torch.compile tracing, and not at all with
``FAIRSEQ_DNAS_TRITON_CHECK=0``. ``python -m fairseq_dnas.check`` runs the same
comparison for every configuration and prints a table.
"""

import dataclasses
import math
import os
import warnings
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention import selection

CHECK_ENV = "FAIRSEQ_DNAS_TRITON_CHECK"
DROPOUT_P = 0.25  # the drop probability of the check's dropout configurations
CUDA_SIZES = dict(batch=2, heads=2, length=150)  # two 128-row tiles, the second ragged
CUDA_SHORT_SIZES = dict(batch=2, heads=2, length=100)  # the one-tile kernels: a ragged 128 tile (50: 64)
INTERPRETER_SIZES = dict(batch=2, heads=1, length=17)  # two 16-row tiles (one 32 tile for short), ragged


class TritonFallbackWarning(RuntimeWarning):
    """The Triton kernels were switched off for one configuration."""


@dataclasses.dataclass(frozen=True)
class Config:
    """What selects a compiled kernel (and so what the check covers)."""

    device: str
    dtype: torch.dtype
    head_dim: int
    scheme: str
    dropout: bool
    sinkhorn_iters: int
    padding: bool
    tf32: bool = False  # float32 products on TF32 tensor cores (torch's allow_tf32)
    kernels: str = "long"  # which Triton kernel set (selection.KERNEL_SETS): short, long or lean

    def __post_init__(self):
        selection.check_kernel_set(self.kernels)  # a former name ('flash') is an error saying the new one

    def describe(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        if self.dtype == torch.float32 and self.tf32:
            dtype += " (TF32)"
        return (f"{self.scheme} {dtype}, head size {self.head_dim}, dropout {'on' if self.dropout else 'off'}, "
                f"sinkhorn_iters {self.sinkhorn_iters}, padding {'on' if self.padding else 'off'}, {self.device}, "
                f"{self.kernels} kernels")


def config_of(q: Tensor, scheme: str, *, padding: bool, dropout: bool, sinkhorn_iters: int,
              kernels: str = "long") -> Config:
    """The configuration of a call with scaled queries ``q`` (B, H, T, D);
    ``kernels`` is the kernel set ``selection.choose`` picked."""
    tf32 = q.dtype == torch.float32 and bool(torch.backends.cuda.matmul.allow_tf32)
    return Config(str(q.device), q.dtype, int(q.shape[-1]), scheme, bool(dropout), int(sinkhorn_iters),
                  bool(padding), tf32, kernels)


def tolerances(config: Config) -> Tuple[float, float]:
    """(forward, gradient) tolerances: max abs error of the output (|v| ~ 1),
    and of each gradient relative to max(1, its largest entry). One rounding
    of the input dtype (float16 and TF32 keep 11 significant bits, bfloat16 8)
    times a margin for the sums, as ``tests/test_triton.py`` holds the kernels."""
    if config.dtype == torch.float32 and not config.tf32:
        return 1e-5, 1e-5
    if config.dtype == torch.bfloat16:
        return 2e-2, 4e-2
    return 3e-3, 5e-3  # float16, or float32 on TF32


@dataclasses.dataclass
class Result:
    config: Config
    forward_error: float = math.nan
    forward_tol: float = math.nan
    grad_error: float = math.nan  # the worst gradient, relative to its scale
    grad_name: str = ""
    grad_tol: float = math.nan
    error: Optional[str] = None  # the exception the kernels raised, if any

    @property
    def ok(self) -> bool:
        return self.error is None and self.forward_error <= self.forward_tol and self.grad_error <= self.grad_tol

    def reason(self) -> str:
        """Why the kernels are not used, in one sentence ('' when ok)."""
        if self.error is not None:
            return f"the kernels could not compile or launch ({self.error})"
        if not self.forward_error <= self.forward_tol:  # NaN included
            return (f"the first-use check disagrees with the float64 reference: output max abs error "
                    f"{self.forward_error:.3g} > tolerance {self.forward_tol:.3g}")
        if not self.grad_error <= self.grad_tol:
            return (f"the first-use check disagrees with the float64 reference: gradient {self.grad_name} "
                    f"max error {self.grad_error:.3g} (relative to max(1, |{self.grad_name}|)) "
                    f"> tolerance {self.grad_tol:.3g}")
        return ""


def _inputs(config: Config, batch: int, heads: int, length: int):
    """Fixed inputs (a private generator: torch's own RNG is left untouched):
    scores of std 2, |v| ~ 1, left padding with a one-token sentence, a
    hybrid weight per head in (0, 1), an upstream gradient."""
    g = torch.Generator().manual_seed(0)
    d = config.head_dim
    scale = (4.0 / d) ** 0.25
    shape = (batch, heads, length, d)
    q, k = (torch.randn(shape, generator=g, dtype=torch.float64) * scale for _ in range(2))
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    grad = torch.randn(shape, generator=g, dtype=torch.float64)
    u = torch.linspace(0.2, 0.8, heads, dtype=torch.float64) if config.scheme == "hnas" else None
    mask = None
    if config.padding:
        lengths = [length, 1] + [max(1, length // (b + 1)) for b in range(2, batch)]
        mask = torch.ones(batch, length, dtype=torch.bool)
        for b, n in enumerate(lengths[:batch]):
            mask[b, length - n:] = False
    return q, k, v, u, mask, grad


def reference(q, k, v, u, scheme, mask, sinkhorn_iters, keep=None, p=0.0):
    """Output of Algorithm 1 in float64 through ``functional.py``'s
    materialized math; (output, graph inputs) for autograd."""
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ud = None if u is None else u.detach().double().requires_grad_()
    km, qm = AF.broadcast_masks(mask, mask)
    s = qd @ kd.transpose(-1, -2)
    if scheme == "dnas":
        probs = AF.dnas_probs(s, km, qm, sinkhorn_iters)
    else:
        probs = AF.hnas_probs(s, ud, km, qm, sinkhorn_iters)
    if keep is not None:
        probs = probs * keep.double() / (1.0 - p)
    return probs @ vd, tuple(x for x in (qd, kd, vd, ud) if x is not None)


def sizes(config: Config) -> Dict[str, int]:
    """The check's input sizes for ``config``: tiny under the interpreter; on
    CUDA two ragged tiles of the long kernels, or one ragged tile of the
    one-tile kernels (short, which take T <= selection.short_max)."""
    if torch.device(config.device).type != "cuda":
        return INTERPRETER_SIZES
    if config.kernels != "short":
        return CUDA_SIZES
    longest = selection.short_max(config.head_dim, config.dtype, config.scheme)
    return CUDA_SHORT_SIZES if longest >= CUDA_SHORT_SIZES["length"] else dict(CUDA_SHORT_SIZES, length=longest - 14)


def _max_error(a: Tensor, b: Tensor) -> float:
    err = (a.double() - b.double()).abs().max()
    return float(err) if bool(torch.isfinite(a).all()) else math.inf


def compare(config: Config, attention: Callable[..., Tensor], *, batch: int, heads: int, length: int) -> Result:
    """``attention`` (the ``triton_attention`` of the kernel set
    ``config.kernels`` names) against the float64 reference on one small
    input, forward and gradients (q, k, v and, for HNAS, the hybrid weight)."""
    result = Result(config)
    result.forward_tol, result.grad_tol = tolerances(config)
    device = torch.device(config.device)
    q64, k64, v64, u64, mask64, grad64 = _inputs(config, batch, heads, length)
    p = DROPOUT_P if config.dropout else 0.0
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        try:
            from fairseq_dnas.attention.triton import dropout as triton_dropout  # imports triton

            q, k, v = (x.to(device, config.dtype).requires_grad_() for x in (q64, k64, v64))
            u = None if u64 is None else u64.to(device, torch.float32).requires_grad_()
            mask = None if mask64 is None else mask64.to(device)
            seed = torch.tensor([20201], dtype=torch.int64, device=device)
            out = attention(q, k, v, hybrid_weight=u, key_padding_mask=mask, query_padding_mask=mask,
                            dropout_p=p, seed=seed, sinkhorn_iters=config.sinkhorn_iters)
            inputs = (q, k, v) if u is None else (q, k, v, u)
            grad = grad64.to(device, config.dtype)
            grads = torch.autograd.grad(out, inputs, grad)
            keep = triton_dropout.dropout_mask(seed, tuple(q.shape[:3]) + (k.shape[2],), p) if p > 0 else None
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 (any failure to compile or launch; see the docstring)
            result.error = f"{type(e).__name__}: {first_line(e)}"
            return result
        # The reference takes the inputs as the kernels got them (rounded to
        # the dtype): the error measured is the kernels' arithmetic alone.
        ref_out, ref_inputs = reference(*(x.detach().cpu() for x in (q, k, v)),
                                        None if u is None else u.detach().cpu(), config.scheme, mask64,
                                        config.sinkhorn_iters, None if keep is None else keep.cpu(), p)
        ref_grads = torch.autograd.grad(ref_out, ref_inputs, grad.cpu().double())
    result.forward_error = _max_error(out.detach().cpu(), ref_out.detach())
    result.grad_error = -1.0
    for name, a, b in zip(("dq", "dk", "dv", "du"), grads, ref_grads):
        err = _max_error(a.cpu(), b) / max(1.0, float(b.abs().max()))
        if not err <= result.grad_error:
            result.grad_error, result.grad_name = err, name
    return result


def first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else "(no message)"


# --- the per-process state ------------------------------------------------------

_verdicts: Dict[Config, str] = {}  # "" = the kernels agree; else why they are off


def enabled() -> bool:
    value = os.environ.get(CHECK_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"${CHECK_ENV} must be 0 (no first-use check of the Triton kernels) or 1; got {value!r}")
    return value == "1"


def _busy() -> bool:
    """Inside CUDA graph capture or torch.compile tracing: no check now."""
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if compiling is not None and compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def triton_usable(config: Config, attention: Callable[..., Tensor]) -> bool:
    """Whether the ``auto`` path may run ``attention``, the kernels of
    ``config``: False once they failed for it in this process; the first
    time, the check (``compare``) decides."""
    verdict = _verdicts.get(config)
    if verdict is not None:
        return verdict == ""
    if not enabled() or not selection.kernels_by_default(torch.device(config.device)) or _busy():
        return True
    result = compare(config, attention, **sizes(config))
    if result.ok:
        _verdicts[config] = ""
        return True
    disable(config, result.reason(), stacklevel=5)
    return False


def disable(config: Config, reason: str, stacklevel: int = 4) -> None:
    """Switch the kernels off for ``config`` for the rest of the process, with
    one warning (a configuration is disabled at most once); ``stacklevel``
    points it at the caller of ``kernels.attend``."""
    if _verdicts.get(config):
        return
    _verdicts[config] = reason
    paths = "'materialized'" if config.sinkhorn_iters > 1 else "'dense' (short inputs, dropout) or 'blockwise'"
    warnings.warn(
        f"fairseq_dnas: Triton attention kernels switched off for {config.describe()}: {reason}. "
        f"This configuration runs the same {config.scheme.upper()} attention on the path 'auto' takes "
        f"without Triton ({paths}; slower, more memory) for the rest of the process. "
        f"`python -m fairseq_dnas.check` prints a full report; FAIRSEQ_DNAS_ATTENTION_PATH=triton "
        f"makes this an error, {CHECK_ENV}=0 skips the first-use check.",
        TritonFallbackWarning,
        stacklevel=stacklevel,
    )
