"""Counting what a step launches: the Triton kernels and the torch operations
around them (tests/test_triton_short.py holds the one-tile kernels to two
kernels a forward + backward step, and records the long kernels' count).

``count_launches()`` is a context manager that yields a ``Launches``
record. Inside it every Triton kernel launch (compiled, or under Triton's
interpreter) is counted by name, and a ``TorchDispatchMode`` counts every
torch operation that computes: arithmetic, reductions, matmuls, fills and
zeros, casts, copies, clones, random draws. Free (not counted): views
(``OpOverload.is_view``: view, permute, transpose, expand, detach, ...; and
``_unsafe_view``, the reshape of a fresh tensor) and
allocations that write nothing (``FREE_OPS``: empty, empty_like,
empty_strided, new_empty, ...). What a Triton launch does to its arguments
inside the launch (the interpreter copies them to numpy and back) is part of
the launch and not counted again. On a GPU each counted entry is one kernel
(or more) on the profile; on the interpreter the count is the same, which is
what lets a CPU test hold the GPU's launch budget.
"""

import contextlib
import dataclasses
from typing import Iterator, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operations that allocate without writing (their memory is uninitialized) or
# only read metadata: no kernel on a GPU.
FREE_OPS = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::new_empty_strided",
    "aten::_unsafe_view", "aten::lift_fresh", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::sym_storage_offset",
    "aten::is_same_size", "aten::size", "aten::stride", "aten::dim", "aten::is_contiguous",
}


@dataclasses.dataclass
class Launches:
    triton: List[str] = dataclasses.field(default_factory=list)  # kernel names, in launch order
    torch: List[str] = dataclasses.field(default_factory=list)  # operation names, in call order

    @property
    def total(self) -> int:
        return len(self.triton) + len(self.torch)

    def describe(self) -> str:
        return f"{self.total} ({len(self.triton)} Triton: {', '.join(self.triton)}; " \
               f"{len(self.torch)} torch: {', '.join(self.torch) or '-'})"


class _TorchOps(TorchDispatchMode):
    def __init__(self, record: Launches):
        super().__init__()
        self.record = record
        self.paused = 0  # > 0 inside a Triton launch

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if not self.paused and not func.is_view and name not in FREE_OPS:
            self.record.torch.append(name.replace("aten::", ""))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_launches() -> Iterator[Launches]:
    """Count Triton launches and computing torch operations in the block."""
    from triton.runtime import interpreter, jit

    record = Launches()
    mode = _TorchOps(record)
    originals = {cls: cls.run for cls in (jit.JITFunction, interpreter.InterpretedFunction)}

    def counted(original):
        def run(self, *args, **kwargs):
            if kwargs.get("warmup"):
                return original(self, *args, **kwargs)
            record.triton.append(getattr(self, "__name__", None) or self.fn.__name__)
            mode.paused += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                mode.paused -= 1
        return run

    for cls, original in originals.items():
        cls.run = counted(original)
    try:
        with mode:
            yield record
    finally:
        for cls, original in originals.items():
            cls.run = original
