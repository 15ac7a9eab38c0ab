"""DNAS/HNAS attention without a T x T matrix, forward and backward.

The log-domain identity (``docs/math.md#the-log-domain-identity``): with scores
s[i, j] = q_i . k_j and c[j] = logsumexp over real queries i of s[i, j],

    pi_D[i, j] = softmax_j(s[i, j] - c[j])          (Algorithm 1, step 4)

so DNAS is ordinary softmax attention with the key bias b[j] = -c[j], and c is
the row log-sum-exp of the transposed problem (keys attending over queries).
Forward: two softmax-attention passes (``primitives``), each keeping only
O(T * D) per head.

Backward, closed form. With P = pi_D, O = P V, upstream dO, D_i = dO_i . O_i,
r_i = logsumexp_j(s[i, j] - c[j]) (the forward's row lse) and
xi[i, j] = exp(s[i, j] - c[j]) = P[i, j] exp(r_i) (the column softmax):

    ds[i, j] = P[i, j] (dP[i, j] - D_i)  +  xi[i, j] dc[j]      (dP = dO V^T)
    dc[j]    = -db[j] = -(v_j . (P^T dO)_j - (P^T D)_j)

(the first term is the softmax gradient at fixed bias; the second is the
gradient through c, d c[j] / d s[i, j] = xi[i, j]). Both terms are one
softmax backward: appending one channel, V' = [V, dc] and dO' = [dO, exp(r)],
and handing the kernel O' = [O, 0] (so its D_i stays dO_i . O_i) gives
dP'[i, j] = dP[i, j] + exp(r_i) dc[j] and hence exactly ds above; q and k get
a zero channel so the scores do not change. dc needs P^T [dO, D] first: a
transposed pass with query bias -r_i, whose output is sum_i P[i, j] X_i up to
the column sum sum_i P[i, j] = exp(c2[j] - c[j]) (c2 its row lse), which
Theorem 2 keeps in [1/T, T], so nothing overflows. The derivation:
``docs/math.md#the-fused-form-one-softmax-backward``.

HNAS (Eq. 12) is linear in pi: out = u O_D + (1 - u) O_U, one DNAS and one
plain pass.

Cost in softmax-attention passes (plain attention: 1 forward, 1 backward):
DNAS 2 forward; backward 1 forward (transposed, D + 1 channels) + 1 backward
(D + 1). HNAS 3 forward; backward 2 forward (one of them the recompute
described at ``FusedHNAS``) + 2 backward. Heads are processed in groups of
``HEADS_PER_CALL`` so that every temporary is a fraction of a (B, H, T, D)
tensor: peak memory stays close to plain attention's.

Dropout on the probabilities is not supported here (the CPU kernels have
none); ``kernels.attend`` takes the dense path when dropout is active.
"""

from typing import Optional

import torch
from torch import Tensor

from fairseq_dnas.attention.functional import NEG, compute_dtype
from fairseq_dnas.attention.tracing import compiling


def key_padding_bias(pad: Optional[Tensor], dtype) -> Optional[Tensor]:
    """(B, T) padding -> (B, 1, 1, T) additive bias: NEG at padding, 0 elsewhere,
    in the compute dtype of ``dtype`` (float32, or float64)."""
    if pad is None:
        return None
    cd = compute_dtype(dtype)
    return torch.zeros(pad.shape, dtype=cd, device=pad.device).masked_fill_(pad, NEG)[:, None, None, :]


def _extra_channel(x: Tensor, last: Optional[Tensor] = None) -> Tensor:
    """(B, H, T, D) -> (B, H, T, D + 1), the new channel ``last`` (B, H, T) or 0."""
    if last is None:
        last = x.new_zeros(x.shape[:-1])
    return torch.cat([x, last.unsqueeze(-1).to(x.dtype)], dim=-1)


def _fill(x: Tensor, where: Optional[Tensor], value: float) -> Tensor:
    return x if where is None else x.masked_fill(where, value)


# Heads handled per kernel call. Every temporary of the passes below is
# (B, HEADS_PER_CALL, T, D + 1), so the memory beyond what plain attention
# keeps is a fraction 1/H of one (B, H, T, D) tensor per buffer; the kernels
# still get B * T / block independent work items per call.
HEADS_PER_CALL = 1


def _groups(heads: int):
    for h in range(0, heads, HEADS_PER_CALL):
        yield slice(h, min(h + HEADS_PER_CALL, heads))


# Masks: ``kpad`` (B, T_k) marks padded keys, ``qpad`` (B, T_q) padded queries
# (True at padding, either may be None); self-attention passes one mask twice.


def _pad_t(pad: Optional[Tensor]) -> Optional[Tensor]:
    return None if pad is None else pad[:, None, :]  # (B, 1, T), True at padding


def _rows(pad: Optional[Tensor]) -> Optional[Tensor]:
    return None if pad is None else pad[:, None, :, None]  # (B, 1, T, 1)


def _key_bias(c: Tensor, kpad: Optional[Tensor]) -> Tensor:
    # Step 4 as a key bias: pi_D = softmax_j(s[i, j] - c[j]); padded keys NEG.
    return _fill(-c, _pad_t(kpad), NEG).unsqueeze(-2)  # (B, h, 1, T_k)


def dnas_forward(prim, q, k, v, kpad, qpad):
    """O_D (B, h, T_q, D), its row lse r (B, h, T_q) and c (B, h, T_k)."""
    # c[j] = logsumexp_i s[i, j] over real queries: the transposed problem
    # (keys attend over queries, padded queries masked as its keys). Only its
    # lse is needed; the values (q) are a placeholder of the right shape.
    _, c = prim.forward(k, q, q, key_padding_bias(qpad, q.dtype))
    o, r = prim.forward(q, k, v, _key_bias(c, kpad))
    return o, r, c


def dnas_backward(prim, do, q, k, v, o, r, c, kpad, qpad, scale=None):
    """dq, dk, dv of DNAS for upstream ``scale * do`` (B, h, T_q, D).

    ``o`` may be given with the extra zero channel already, (B, h, T, D + 1).
    Every temporary is (B, h, T, D + 1); they are freed as soon as possible
    since this runs inside the backward of a whole encoder.
    """
    d = q.shape[-1]
    qpad_t, kpad_t = _pad_t(qpad), _pad_t(kpad)
    oz = o if o.shape[-1] == d + 1 else _extra_channel(o)
    # dO' = [dO, .] with padded query rows zeroed (their output is constant 0).
    do_x = _extra_channel(do)
    if scale is not None:
        do_x[..., :d].mul_(scale)
    if qpad is not None:
        do_x.masked_fill_(_rows(qpad), 0.0)
    do_x[..., d] = torch.einsum("bhtd,bhtd->bht", do_x, oz)  # D_i = dO_i . O_i
    qz, kz = _extra_channel(q), _extra_channel(k)
    # G[j] = sum_i P[i, j] [dO_i, D_i]: transposed pass with query bias -r_i;
    # its output is normalized by its own lse c2 instead of c.
    g, c2 = prim.forward(kz, qz, do_x, _fill(-r, qpad_t, NEG).unsqueeze(-2))
    g.mul_(torch.exp(_fill(c2 - c, kpad_t, 0.0)).unsqueeze(-1))  # sum_i P[i, j], in [1/T, T]
    db = torch.einsum("bhtd,bhtd->bht", v, g[..., :d]) - g[..., d]  # gradient of the key bias -c
    del g
    dc = _fill(-db, kpad_t, 0.0)  # padded keys have no c
    # One softmax backward gives both terms of ds (see the module docstring).
    do_x[..., d] = torch.exp(_fill(r, qpad_t, float("-inf")))  # exp(r_i) = sum_j xi[i, j]; 0 at padding
    dq, dk, dv = prim.backward(do_x, qz, kz, _extra_channel(v, dc), oz, r, _key_bias(c, kpad))
    return dq[..., :d], dk[..., :d], dv[..., :d]


def _up(*xs: Tensor):
    """Per-head slices in the compute dtype: half-precision inputs run the
    passes in float32 (a no-op for float32/float64)."""
    return [x.to(compute_dtype(x.dtype)) for x in xs]


def _output_buffer(q: Tensor) -> Tensor:
    """An empty (B, H, T, D) tensor laid out as (T, B, H, D) in memory, so that
    the fairseq module's reshape of the output to (T, B, C) is a view and the
    output projection saves this very tensor (no second copy)."""
    b, h, t, d = q.shape
    return q.new_empty((t, b, h, d)).permute(1, 2, 0, 3)


class FusedDNAS(torch.autograd.Function):
    """pi_D V for scaled q (B, H, T_q, D), k, v (B, H, T_k, D); padded query rows give 0."""

    @staticmethod
    def forward(ctx, q, k, v, kpad, qpad, prim, same=False):
        qpad = kpad if same else qpad  # one mask for both (see dense.py)
        o = _output_buffer(q)
        r = q.new_empty(q.shape[:-1], dtype=compute_dtype(q.dtype))
        c = k.new_empty(k.shape[:-1], dtype=compute_dtype(k.dtype))
        for h in _groups(q.shape[1]):
            o[:, h], r[:, h], c[:, h] = dnas_forward(prim, *_up(q[:, h], k[:, h], v[:, h]), kpad, qpad)
        if qpad is not None:
            o.masked_fill_(_rows(qpad), 0.0)  # as the materialized path: pi rows of padding are 0
        ctx.prim, ctx.same = prim, same
        ctx.save_for_backward(q, k, v, o, r, c, kpad, None if same else qpad)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, r, c, kpad, qpad = ctx.saved_tensors
        qpad = kpad if ctx.same else qpad
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        for h in _groups(q.shape[1]):
            dq[:, h], dk[:, h], dv[:, h] = dnas_backward(
                ctx.prim, *_up(do[:, h], q[:, h], k[:, h], v[:, h], o[:, h]), r[:, h], c[:, h], kpad, qpad
            )
        return dq, dk, dv, None, None, None, None


class FusedHNAS(torch.autograd.Function):
    """(u pi_D + (1 - u) pi_U) V, one u per head (Eq. 12).

    Saves only the output (which the module's output projection keeps in any
    case), not O_D and O_U: the backward recomputes, per head, the one of the
    two whose weight is smaller and takes the other from the output, e.g.
    O_D = (out - (1 - u) O_U) / u for u >= 1/2 (rounding grows by at most
    1 / max(u, 1 - u) <= 2). One extra pass per head buys the memory of plain
    attention.
    """

    @staticmethod
    def forward(ctx, q, k, v, u, kpad, qpad, prim, same=False):
        qpad = kpad if same else qpad
        out = _output_buffer(q)
        r_d, r_u = (q.new_empty(q.shape[:-1], dtype=compute_dtype(q.dtype)) for _ in range(2))
        c = k.new_empty(k.shape[:-1], dtype=compute_dtype(k.dtype))
        uu = u.to(compute_dtype(q.dtype)).view(1, -1, 1, 1)
        ubias = key_padding_bias(kpad, q.dtype)
        for h in _groups(q.shape[1]):
            qh, kh, vh = _up(q[:, h], k[:, h], v[:, h])
            o_d, r_d[:, h], c[:, h] = dnas_forward(prim, qh, kh, vh, kpad, qpad)
            o_u, r_u[:, h] = prim.forward(qh, kh, vh, ubias)  # step 3
            out[:, h] = torch.lerp(o_u, o_d, uu[:, h])  # step 5: u O_D + (1 - u) O_U
        if qpad is not None:
            out.masked_fill_(_rows(qpad), 0.0)
        ctx.prim, ctx.same = prim, same
        ctx.save_for_backward(q, k, v, u, out, r_d, c, r_u, kpad, None if same else qpad)
        return out

    @staticmethod
    def _both_outputs(prim, qh, kh, vh, out_h, us, c_h, kpad):
        """[O_D, 0] (B, h, T, D + 1) and O_U (B, h, T, D) for a group of heads
        whose weights are the floats ``us``."""
        oz = _extra_channel(out_h)
        o_u = torch.empty_like(out_h)
        for i, ui in enumerate(us):
            one = slice(i, i + 1)
            if ui >= 0.5:  # recompute O_U; O_D = (out - (1 - u) O_U) / u
                o_u[:, one] = prim.forward(qh[:, one], kh[:, one], vh[:, one], key_padding_bias(kpad, qh.dtype))[0]
                oz[:, one, :, :-1].sub_(o_u[:, one], alpha=1.0 - ui).div_(ui)
            else:  # recompute O_D; O_U = (out - u O_D) / (1 - u)
                o_d = prim.forward(qh[:, one], kh[:, one], vh[:, one], _key_bias(c_h[:, one], kpad))[0]
                torch.sub(out_h[:, one], o_d, alpha=ui, out=o_u[:, one]).div_(1.0 - ui)
                oz[:, one, :, :-1] = o_d
        return oz, o_u

    @staticmethod
    def _both_recomputed(prim, qh, kh, vh, c_h, kpad):
        """[O_D, 0] and O_U, both recomputed (one pass more than
        ``_both_outputs``, no branch on u)."""
        o_u = prim.forward(qh, kh, vh, key_padding_bias(kpad, qh.dtype))[0]
        o_d = prim.forward(qh, kh, vh, _key_bias(c_h, kpad))[0]
        return _extra_channel(o_d), o_u

    @staticmethod
    def backward(ctx, do):
        q, k, v, u, out, r_d, c, r_u, kpad, qpad = ctx.saved_tensors
        qpad = kpad if ctx.same else qpad
        prim = ctx.prim
        d = q.shape[-1]
        uu = u.to(compute_dtype(q.dtype)).view(1, -1, 1, 1)
        # which of O_D, O_U to recompute depends on u's values: data-dependent
        # Python, so a compiled graph recomputes both (``_both_recomputed``)
        u_list = None if compiling() else u.tolist()
        du = torch.empty_like(u)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ubias = key_padding_bias(kpad, q.dtype)
        for h in _groups(q.shape[1]):
            qh, kh, vh, out_h = _up(q[:, h], k[:, h], v[:, h], out[:, h])
            uh = uu[:, h]
            do_h = _fill(_up(do[:, h])[0], _rows(qpad), 0.0)
            if u_list is None:
                oz, o_u = FusedHNAS._both_recomputed(prim, qh, kh, vh, c[:, h], kpad)
            else:
                oz, o_u = FusedHNAS._both_outputs(prim, qh, kh, vh, out_h, u_list[h], c[:, h], kpad)
            du[h] = torch.einsum("bhtd,bhtd->h", do_h, oz[..., :d] - o_u).to(u.dtype)  # <dO, O_D - O_U>
            dq[:, h], dk[:, h], dv[:, h] = dnas_backward(
                prim, do_h, qh, kh, vh, oz, r_d[:, h], c[:, h], kpad, qpad, scale=uh
            )
            del oz
            gq, gk, gv = prim.backward(do_h * (1.0 - uh), qh, kh, vh, o_u, r_u[:, h], ubias)
            del do_h, o_u
            dq[:, h] += gq
            dk[:, h] += gk
            dv[:, h] += gv
        return dq, dk, dv, du, None, None, None, None


def fused_dnas(q, k, v, kpad, qpad, prim):
    same = qpad is kpad and kpad is not None
    return FusedDNAS.apply(q, k, v, kpad, None if same else qpad, prim, same)


def fused_hnas(q, k, v, u, kpad, qpad, prim):
    same = qpad is kpad and kpad is not None
    return FusedHNAS.apply(q, k, v, u, kpad, None if same else qpad, prim, same)
