"""Two building blocks for the fused paths: softmax attention with an additive
key bias, forward (returning the row log-sum-exp) and backward.

    forward(q, k, v, bias)                       -> out, lse
    backward(dout, q, k, v, out, lse, bias)      -> dq, dk, dv

with ``out[i] = sum_j softmax_j(q_i . k_j + bias_j) v_j`` and
``lse[i] = logsumexp_j(q_i . k_j + bias_j)``; q is already scaled. Shapes:
q (B, H, T_q, D), k and v (B, H, T_k, D), bias (B, 1 or H, 1, T_k), or a
bias per score (B or 1, 1 or H, T_q, T_k) (a score bias, ``fused.py``), or None,
out (B, H, T_q, D), lse (B, H, T_q); bias and lse in float32 (float64 for
float64 inputs), ``functional.compute_dtype``. The backward follows the
flash-attention convention: it takes ``out`` as given and uses
``D_i = dout_i . out_i`` (the fused DNAS backward relies on that, see
``fused.py``).

Two implementations with the same contract:
- ``FLASH_CPU``: PyTorch's own CPU flash-attention kernels (the ones
  ``F.scaled_dot_product_attention`` runs on CPU, which is also what fairseq's
  encoder runs without attention dropout). They expose the log-sum-exp, which
  the public SDPA function does not. Used here on CPU for float32/float64
  only (a bias in half precision would round c); no dropout; q, k and v must
  have the same head size.
- ``BLOCKWISE``: plain torch, any device and dtype; query blocks of
  ``block`` rows, so at most (B, H, block, T_k) scores exist at a time.
  Slower than the flash kernels on CPU; it is the fallback where they do not
  apply (other devices, half precision when forced).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from fairseq_dnas.attention.functional import compute_dtype


class FlashCPU:
    name = "flash-cpu"

    # The private CPU kernels appeared in torch 2.2; older torch (e.g. the
    # 1.12/1.13 that PyPI fairseq 0.12.2 was built against) takes BLOCKWISE.
    available = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
    )

    @staticmethod
    def supports(x: Tensor) -> bool:
        return FlashCPU.available and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)

    @staticmethod
    def forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias, scale=1.0
        )
        return out, lse

    @staticmethod
    def backward(dout, q, k, v, out, lse, bias):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=1.0
        )


class Blockwise:
    """Query blocks of ``block`` rows; scores, lse and bias in float32 (float64
    stays float64), probabilities cast to v's dtype before ``@ V`` as fairseq
    does."""

    name = "blockwise"

    def __init__(self, block: int = 256):
        self.block = block

    @staticmethod
    def supports(x: Tensor) -> bool:
        return True

    @staticmethod
    def _bias_rows(bias: Optional[Tensor], a: int, b: int) -> Optional[Tensor]:
        """The rows [a, b) of a bias per score; a key bias (one row) as it is."""
        return bias if bias is None or bias.shape[-2] == 1 else bias[..., a:b, :]

    def _probs(self, q_blk: Tensor, k: Tensor, bias: Optional[Tensor], lse: Optional[Tensor]):
        s = torch.matmul(q_blk, k.transpose(-1, -2)).to(compute_dtype(q_blk.dtype))  # (B, H, b, T_k)
        if bias is not None:
            s = s.add_(bias)
        if lse is None:
            lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, H, b, 1)
        return s.sub_(lse).exp_(), lse

    def forward(self, q, k, v, bias):
        out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=v.dtype, device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=compute_dtype(q.dtype), device=q.device)
        for a in range(0, q.shape[-2], self.block):
            b = min(a + self.block, q.shape[-2])
            p, m = self._probs(q[..., a:b, :], k, self._bias_rows(bias, a, b), None)
            out[..., a:b, :] = torch.matmul(p.to(v.dtype), v)
            lse[..., a:b] = m.squeeze(-1)
        return out, lse

    def backward(self, dout, q, k, v, out, lse, bias):
        dq = torch.empty_like(q)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        cd = compute_dtype(q.dtype)
        delta = (dout.to(cd) * out.to(cd)).sum(-1, keepdim=True)  # D_i = dout_i . out_i
        for a in range(0, q.shape[-2], self.block):
            b = min(a + self.block, q.shape[-2])
            q_blk, do_blk = q[..., a:b, :], dout[..., a:b, :]
            p, _ = self._probs(q_blk, k, self._bias_rows(bias, a, b), lse[..., a:b, None])  # P, (B, H, b, T_k)
            dv += torch.matmul(p.to(v.dtype).transpose(-1, -2), do_blk)
            # dS = P * (dP - D), dP = dout . v
            ds = torch.matmul(do_blk, v.transpose(-1, -2)).to(cd).sub_(delta[..., a:b, :]).mul_(p)
            ds = ds.to(q.dtype)
            dq[..., a:b, :] = torch.matmul(ds, k)
            dk += torch.matmul(ds.transpose(-1, -2), q_blk)
        return dq, dk, dv


FLASH_CPU = FlashCPU()
BLOCKWISE = Blockwise()


def for_tensor(x: Tensor):
    """The fastest primitive that handles ``x``'s device and dtype."""
    return FLASH_CPU if FlashCPU.supports(x) else BLOCKWISE


__all__ = ["FLASH_CPU", "BLOCKWISE", "Blockwise", "FlashCPU", "for_tensor"]
