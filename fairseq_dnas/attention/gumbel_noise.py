"""Gumbel noise for the discrete attention's relaxed sample (J. Kinley, 2020,
Section 3.3): G = -log(-log U), U ~ Uniform(0, 1), and E = -log U ~ Exp(1).

Numerics: the thesis's ``-log(-log(U + 1e-20) + 1e-20)`` underflows in half
precision (1e-20 is 0 in fp16), and a uniform draw of exactly 0 or 1 gives an
infinite noise value. Here the noise is always drawn in float32 from a
uniform clamped to [tiny, 1 - eps] of float32, so it lies in about
[-4.5, 15.9] whatever the caller's dtype. Nothing here imports fairseq.
"""

import math
from typing import List, Optional

import numpy as np
import torch
from torch import Tensor

from fairseq_dnas.attention.tracing import compiling

_F32 = torch.finfo(torch.float32)
U_LOW = _F32.tiny  # smallest normal float32 > 0: -log(U) = 87.3, finite
U_HIGH = 1.0 - _F32.eps  # 1 - 2^-23 < 1: -log(U) = 1.19e-7 > 0, so log() is finite
# The same bounds on E = -log U, the exponential variable (-log of the
# clamped uniform, computed in float32 as the noise is).
E_LOW = float(-torch.tensor(U_HIGH, dtype=torch.float32).log())
E_HIGH = float(-torch.tensor(U_LOW, dtype=torch.float32).log())


def gumbel_from_uniform(u: Tensor) -> Tensor:
    """G = -log(-log U) (Section 3.3) in float32, U clamped to [U_LOW, U_HIGH]
    first, so U = 0 or U = 1 still give finite noise. ``u`` is not changed."""
    return u.to(torch.float32, copy=True).clamp_(U_LOW, U_HIGH).log_().neg_().log_().neg_()


def uniform_float32(shape, *, generator: Optional[torch.Generator] = None) -> Tensor:
    """U ~ Uniform[0, 1) on the CPU in float32, k 2^-23 for k uniform in
    [0, 2^23): 23 random bits as the mantissa of a float in [1, 2), minus 1
    (JAX's ``random.uniform`` does the same).

    The bits come from NumPy's SFC64 generator (``random_raw``: 64 bits a
    value, two 32-bit words, 23 bits taken from each), seeded for each call
    with one 63-bit draw of torch's generator (``generator``, or torch's
    default CPU generator): ``torch.manual_seed`` and fairseq's seeding
    reproduce the noise, and each call advances torch's generator state, so
    the next call draws other noise. Why not torch's own bits: its CPU
    ``random_`` on int64 (MT19937) costs twice SFC64's ``random_raw``, and
    ``uniform_`` more (docs/results/2026-11-27-cpu-gumbel-speed.md,
    docs/results/2026-11-27-cpu-noise-sfc64.md). SFC64 (Chris
    Doty-Humphrey's Small Fast Chaotic generator, 256 bits of state with a
    64-bit counter) is one of NumPy's documented bit generators; NumPy seeds
    it through its ``SeedSequence``, so neighbouring seeds give unrelated
    streams, and its documented compatibility guarantee keeps a fixed seed's
    stream the same across NumPy versions.
    """
    n = math.prod(shape)
    seed = int(torch.randint(0, 2 ** 63 - 1, (), dtype=torch.int64, generator=generator))
    # (at least one word: NumPy gives an empty array stride 0, which torch cannot view as int32)
    raw = np.random.SFC64(seed).random_raw(max(1, (n + 1) // 2)).view(np.int64)  # uint64 bits read as int64
    words = torch.from_numpy(raw).view(torch.int32)[:n]
    mantissa = words.bitwise_and_(0x7FFFFF).bitwise_or_(0x3F800000)  # bits of 1 + k 2^-23, k < 2^23
    return mantissa.view(torch.float32).sub_(1.0).view(shape)  # exact: k 2^-23 in [0, 1 - 2^-23]


def _uniform_fake(shape):
    return torch.empty(shape, dtype=torch.float32)


def _register_uniform_op():
    """``uniform_float32`` from torch's default generator as one opaque op of
    a compiled graph: NumPy's generator cannot be traced, and a graph break
    (or torch's own random ops, another stream) would follow otherwise. The
    same draws as eager for the same seed; the tag keeps two calls from being
    merged into one. None on torch without ``torch.library.custom_op``."""
    if not hasattr(torch.library, "custom_op"):
        return None

    @torch.library.custom_op("fairseq_dnas::uniform_float32", mutates_args=(),
                             tags=(torch.Tag.nondeterministic_seeded,))
    def uniform_op(shape: List[int]) -> Tensor:
        return uniform_float32(tuple(shape))

    uniform_op.register_fake(_uniform_fake)
    return uniform_op


_uniform_op = _register_uniform_op()


def exponential_noise(shape, *, device=None, generator: Optional[torch.Generator] = None) -> Tensor:
    """E = -log U ~ Exp(1) in float32, U uniform clamped to [tiny, 1 - eps] of
    float32, so E lies in [E_LOW, E_HIGH] (about [1.2e-7, 87.3]); the
    Gumbel noise is G = -log E (``gumbel_noise`` draws E and takes that log).

    On the CPU, U is ``uniform_float32`` and the log a vectorized pass:
    torch's CPU ``exponential_`` samples one element at a time and costs
    several times the whole Gumbel chain (docs/results/2026-11-27-cpu-gumbel-speed.md).
    On other devices E is drawn directly as Exp(1) (``exponential_``, the
    same distribution in one kernel) and clamped to the same bounds.
    """
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cpu":
        if generator is None and _uniform_op is not None and compiling():
            u = _uniform_op([int(n) for n in shape])
        else:
            u = uniform_float32(shape, generator=generator)
        return u.clamp_(U_LOW, U_HIGH).log_().neg_()  # E = -log U
    return torch.empty(shape, device=device, dtype=torch.float32).exponential_(generator=generator).clamp_(
        E_LOW, E_HIGH)


def gumbel_noise(shape, *, device=None, generator: Optional[torch.Generator] = None) -> Tensor:
    """float32 Gumbel(0, 1) noise of ``shape``, always finite: -log(-log U)
    with U uniform clamped to [tiny, 1 - eps] of float32 (G in about
    [-4.5, 15.9]), drawn in one buffer and transformed in place. The same
    draws as ``exponential_noise`` with the same generator state."""
    return exponential_noise(shape, device=device, generator=generator).log_().neg_()  # G = -log E, Section 3.3
