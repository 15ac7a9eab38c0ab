"""Whether the code runs inside a graph that ``torch.compile`` or
``torch.export`` is tracing.

Where eager code branches on a tensor's values (an underflow check, a
validity check), a traced graph would break there; the callers take a
branch-free form instead when ``compiling()`` is True. Older torch (without
``torch.compiler``) never traces these paths: False.
"""

import torch


def compiling() -> bool:
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())
