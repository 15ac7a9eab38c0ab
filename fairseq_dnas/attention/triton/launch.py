"""How the Triton kernels address their inputs: the grid, offsets, tile loads
and stores, and the host-side arguments every launch passes (strides, masks,
the matmul precision, the head-size block).

Grid: every kernel runs on a one-dimensional grid of
``cdiv(T, BLOCK) * B * H`` programs, the block index fastest (programs of one
head run side by side and share its keys in L2). Axis 0 allows 2**31 - 1
programs, so no batch size reaches a grid limit (axes 1 and 2 stop at
65,535).

Offsets: Triton passes integers below 2**31 as int32, and a pointer offset
``row * stride`` is computed in the type of its operands. When some element
of a tensor a kernel touches lies 2**31 or more elements from its start
(``needs_int64``), the kernels are compiled with ``INT64`` and compute every
offset in int64; otherwise in int32 (fewer instructions and registers).

Every kernel file (``long.py``, ``short.py``, ``sinkhorn.py``, ``column.py``,
``dropout.py``) launches through these helpers.
"""

import contextlib
from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def program(T, H, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """(block index, batch * head, batch, head) of this program on the 1-D
    grid of cdiv(T, BLOCK) * B * H programs, block index fastest."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(T, BLOCK)
    bh = pid // n_blocks
    blk = pid - bh * n_blocks
    if INT64:
        bh = bh.to(tl.int64)
    return blk, bh, bh // H, bh % H


@triton.jit
def offsets(start, BLOCK: tl.constexpr, INT64: tl.constexpr):
    """start + [0, BLOCK), in int64 when a tensor's offsets may pass 2**31."""
    offs = start + tl.arange(0, BLOCK)
    if INT64:
        offs = offs.to(tl.int64)
    return offs


@triton.jit
def real(PAD, b, offs, T, HAS_PAD: tl.constexpr):
    """True at positions inside [0, T) that are not padding (PAD is (B, T) uint8)."""
    inside = offs < T
    if HAS_PAD:
        padded = tl.load(PAD + b * T + offs, mask=inside, other=1)
        inside = inside & (padded == 0)
    return inside


@triton.jit
def load_tile(base, offs_t, offs_d, stride_t, stride_d, rows_ok, D):
    """A (len(offs_t), BLOCK_D) tile; rows where rows_ok is False and columns >= D read 0."""
    ptrs = base + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d
    return tl.load(ptrs, mask=rows_ok[:, None] & (offs_d[None, :] < D), other=0.0)


@triton.jit
def store_tile(base, x, offs_t, offs_d, stride_t, stride_d, T, D):
    """Store a (len(offs_t), BLOCK_D) tile with the strides of the tensor written."""
    ptrs = base + offs_t[:, None] * stride_t + offs_d[None, :] * stride_d
    tl.store(ptrs, x, mask=(offs_t[:, None] < T) & (offs_d[None, :] < D))


def strides(x: Tensor):
    return tuple(x.stride())


def pad_arg(pad: Optional[Tensor], like: Tensor) -> Tensor:
    """(B, T) bool -> uint8 view for the kernels; without a mask ``like``
    itself: the kernels never read it (HAS_PAD False), so nothing is allocated
    or written for it."""
    if pad is None:
        return like
    return pad.contiguous().view(torch.uint8)


def precision(dtype: torch.dtype) -> str:
    """How tl.dot multiplies float32 inputs: as torch's own float32 matmuls do.
    torch's default is exact float32 ("ieee", which the 1e-5 target needs);
    torch.backends.cuda.matmul.allow_tf32 = True (or
    torch.set_float32_matmul_precision("high")) turns TF32 on for both.
    Half-precision inputs ignore it."""
    if dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32:
        return "ieee"
    return "tf32"


def block_d(d: int) -> int:
    return max(16, next_power_of_2(d))


INT32_LIMIT = 2**31


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are
# constexpr functions whose Python call goes through Triton's JIT machinery
# (about 10 us each on a 2-core CPU); a step calls them several times, and at
# Gigaword's sizes a step on a GPU is bound by the host.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def needs_int64(*tensors: Tensor) -> bool:
    """True if a kernel may address an element 2**31 or more elements from
    the start of one of ``tensors`` (the largest offset its strides reach),
    so that offsets must be computed in int64 (``INT64``)."""
    return any(sum((n - 1) * s for n, s in zip(t.shape, t.stride())) >= INT32_LIMIT - 1 or t.numel() >= INT32_LIMIT
               for t in tensors if t is not None)


def grid(t: int, block: int, bsz: int, heads: int) -> Tuple[int]:
    """The 1-D grid of ``program``; refuses a launch beyond axis 0's limit."""
    programs = cdiv(t, block) * bsz * heads
    if programs >= INT32_LIMIT:
        raise ValueError(f"attention path 'triton': {programs} programs (B * H * cdiv(T, {block})) exceed "
                         "the 2**31 - 1 a grid allows; split the batch")
    return (programs,)


def on_device(x: Tensor):
    """Launch on x's device, not the current one (a model on cuda:1 without
    torch.cuda.set_device); nothing to do on CPU (the interpreter)."""
    if x.device.type == "cuda":
        return torch.cuda.device(x.device)
    return contextlib.nullcontext()
