"""What every kernel set's ``triton_attention`` does around its kernels: the
masks and seed it completes, the facts of a call, the output buffer."""

from typing import Optional

import torch
from torch import Tensor

from fairseq_dnas.attention.triton.dropout import dropout_threshold, new_seed


def output_buffer(q: Tensor, dtype: torch.dtype) -> Tensor:
    """(B, H, T, D) laid out as (T, B, H, D): the fairseq module's reshape of
    the output to (T, B, C) is then a view (as in fused.py)."""
    b, h, t, d = q.shape
    return q.new_empty((t, b, h, d), dtype=dtype).permute(1, 2, 0, 3)


def call_facts(q: Tensor, k: Tensor, u: Optional[Tensor], kpad: Optional[Tensor], p_drop: float):
    """((B, H, T_q, T_k, D), the dropout threshold, (HNAS?, dropout?, padding?)) of a call."""
    threshold = dropout_threshold(p_drop)
    return (*q.shape[:3], k.shape[2], q.shape[3]), threshold, (u is not None, threshold > 0, kpad is not None)



def prepare_call(q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], query_padding_mask: Optional[Tensor],
                 dropout_p: float, seed: Optional[Tensor]):
    """The masks and seed a kernel set's autograd function takes: both masks
    or none (a missing one completed with no padding), a seed drawn with
    ``new_seed`` when dropout needs one; ``dropout_p`` checked (ValueError)."""
    dropout_threshold(dropout_p)  # a probability, else ValueError
    if (key_padding_mask is None) != (query_padding_mask is None):
        bsz = q.shape[0]
        if key_padding_mask is None:
            key_padding_mask = torch.zeros((bsz, k.shape[2]), dtype=torch.bool, device=q.device)
        else:
            query_padding_mask = torch.zeros((bsz, q.shape[2]), dtype=torch.bool, device=q.device)
    if dropout_p > 0 and seed is None:
        seed = new_seed(q.device)
    return key_padding_mask, query_padding_mask, seed
