"""The Triton kernels as PyTorch custom ops, for compiled graphs.

Eagerly, ``kernels.attend`` calls a kernel set's ``triton_attention`` (an
autograd function). Inside a graph that ``torch.compile`` traces it calls
``attention`` below instead: one opaque op ``fairseq_dnas::triton_attention``
(with a fake implementation giving the output's shape, dtype and layout) and
its backward ``fairseq_dnas::triton_attention_backward``, so the graph holds
the kernels as one op each way, without a break. The backward op runs the
kernels' forward again (as activation checkpointing does) and then their
backward: the ops keep no tensors between the two.

The first-use check (``selfcheck``) runs inside the op, when the graph runs,
never while it is traced. Where it fails, the compiled call stops with a
one-line error instead of falling back (eager ``auto`` falls back to the CPU
paths): run that configuration eagerly, or pick a path with
``FAIRSEQ_DNAS_ATTENTION_PATH``.
"""

from typing import List, Optional

import torch
from torch import Tensor

from fairseq_dnas.attention import selection, selfcheck

OP = "fairseq_dnas::triton_attention"


def _kernels_output(q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, checked):
    function = selection.attention_function(kernels)
    if checked:
        config = selfcheck.config_of(q, scheme, padding=kpad is not None, dropout=dropout_p > 0,
                                     sinkhorn_iters=sinkhorn_iters, kernels=kernels)
        if not selfcheck.triton_usable(config, function):
            raise RuntimeError(
                f"the Triton kernels ({kernels}) are off for this configuration (their first-use check failed), "
                f"and a compiled graph cannot fall back: run it eagerly or set {selection.PATH_ENV}=dense"
            )
    return function(q, k, v, hybrid_weight=u, key_padding_mask=kpad, query_padding_mask=qpad, dropout_p=dropout_p,
                    seed=seed, sinkhorn_iters=sinkhorn_iters)


def _register():
    if not hasattr(torch.library, "custom_op"):
        return None, None

    @torch.library.custom_op(OP, mutates_args=())
    def forward_op(q: Tensor, k: Tensor, v: Tensor, u: Optional[Tensor], kpad: Optional[Tensor],
                   qpad: Optional[Tensor], dropout_p: float, seed: Tensor, sinkhorn_iters: int, kernels: str,
                   scheme: str, checked: bool) -> Tensor:
        with torch.no_grad():
            return _kernels_output(q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme,
                                   checked).contiguous()

    @forward_op.register_fake
    def _(q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, checked):
        return q.new_empty(q.shape[:-1] + v.shape[-1:], dtype=v.dtype)

    @torch.library.custom_op(OP + "_backward", mutates_args=())
    def backward_op(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, u: Optional[Tensor], kpad: Optional[Tensor],
                    qpad: Optional[Tensor], dropout_p: float, seed: Tensor, sinkhorn_iters: int, kernels: str,
                    scheme: str, checked: bool) -> List[Tensor]:
        inputs = [x.detach().requires_grad_() for x in (q, k, v)]
        uu = None if u is None else u.detach().requires_grad_()
        with torch.enable_grad():  # the forward again, then the kernels' own backward
            out = _kernels_output(*inputs, uu, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, False)
            grads = torch.autograd.grad(out, inputs + ([] if uu is None else [uu]), grad)
        return [g.contiguous() for g in grads]

    @backward_op.register_fake
    def _(grad, q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, checked):
        return [torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v)] + (
            [] if u is None else [torch.empty_like(u)])

    def setup_context(ctx, inputs, output):
        q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, checked = inputs
        ctx.save_for_backward(q, k, v, u, kpad, qpad, seed)
        ctx.settings = (dropout_p, sinkhorn_iters, kernels, scheme)

    def backward(ctx, grad):
        q, k, v, u, kpad, qpad, seed = ctx.saved_tensors
        dropout_p, sinkhorn_iters, kernels, scheme = ctx.settings
        grads = backward_op(grad, q, k, v, u, kpad, qpad, dropout_p, seed, sinkhorn_iters, kernels, scheme, False)
        du = grads[3] if u is not None else None
        return grads[0], grads[1], grads[2], du, None, None, None, None, None, None, None, None

    forward_op.register_autograd(backward, setup_context=setup_context)
    return forward_op, backward_op


triton_attention_op, triton_attention_backward_op = _register()


def attention(q, k, v, *, hybrid_weight, key_padding_mask, query_padding_mask, dropout_p, sinkhorn_iters, kernels,
              scheme, checked):
    """The kernels' output through the custom op (the seed, when dropout
    needs one, drawn here, in the graph, as the kernels draw it)."""
    if dropout_p > 0:
        from fairseq_dnas.attention.triton.dropout import new_seed

        seed = new_seed(q.device)
    else:
        seed = torch.zeros((1,), dtype=torch.int64, device=q.device)
    return triton_attention_op(q, k, v, hybrid_weight, key_padding_mask, query_padding_mask, float(dropout_p), seed,
                               int(sinkhorn_iters), kernels, scheme, bool(checked))
