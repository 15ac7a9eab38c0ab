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

A score bias B (T5's position bias; ``docs/math.md#a-biased-score``) adds
to every score: the passes take the key bias plus B, a (B, h, T_q, T_k)
bias per group of heads (B transposed in the transposed passes), and dB,
the score gradient ds = P (dO' V'^T - D) of the extended channels above
(plus HNAS's plain part), is formed per group of heads and summed into a
buffer of B's shape. Those are T x T per group of heads (B itself is
H T^2): with a bias the fused paths keep O(B T^2) per group, not O(T D).

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


def _plus(bias: Optional[Tensor], sb: Optional[Tensor], transposed: bool = False) -> Optional[Tensor]:
    """A pass's bias plus the score bias ``sb`` (B or 1, h, T_q, T_k), or its
    transpose for the transposed passes (keys attending over queries)."""
    if sb is None:
        return bias
    sb = sb.transpose(-1, -2) if transposed else sb
    return sb if bias is None else bias + sb


def dnas_forward(prim, q, k, v, kpad, qpad, sb=None):
    """O_D (B, h, T_q, D), its row lse r (B, h, T_q) and c (B, h, T_k);
    ``sb``: the score bias of these heads (scores s + B)."""
    # c[j] = logsumexp_i s[i, j] over real queries: the transposed problem
    # (keys attend over queries, padded queries masked as its keys). Only its
    # lse is needed; the values (q) are a placeholder of the right shape.
    _, c = prim.forward(k, q, q, _plus(key_padding_bias(qpad, q.dtype), sb, transposed=True))
    o, r = prim.forward(q, k, v, _plus(_key_bias(c, kpad), sb))
    return o, r, c


def _score_grad(do, q, k, v, out, bias, lse):
    """ds = P (dO V^T - D) of one softmax pass, P = exp(q k^T + bias - lse)
    (B, h, T_q, T_k) in the compute dtype, D_i = dO_i . out_i: the gradient
    of the pass's scores, hence of a bias added to them."""
    cd = compute_dtype(q.dtype)
    s = torch.matmul(q.to(cd), k.to(cd).transpose(-1, -2)).add_(bias).sub_(lse.unsqueeze(-1))
    delta = (do.to(cd) * out.to(cd)).sum(-1, keepdim=True)  # D_i
    return s.exp_().mul_(torch.matmul(do.to(cd), v.to(cd).transpose(-1, -2)).sub_(delta))


def add_bias_grad(db: Tensor, ds: Tensor, h: slice) -> None:
    """db (B or 1, H or 1, T_q, T_k) += ds (B, h, T_q, T_k) of heads ``h``,
    summed over the dimensions the bias is broadcast along."""
    if db.shape[0] == 1:
        ds = ds.sum(0, keepdim=True)
    if db.shape[1] == 1:
        db[:, 0:1] += ds.sum(1, keepdim=True).to(db.dtype)
    else:
        db[:, h] += ds.to(db.dtype)


def dnas_backward(prim, do, q, k, v, o, r, c, kpad, qpad, scale=None, sb=None, db_out=None):
    """dq, dk, dv of DNAS for upstream ``scale * do`` (B, h, T_q, D);
    ``sb``: the score bias of these heads; with it, ``db_out(ds)`` takes
    the score gradient (B, h, T_q, T_k).

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
    g, c2 = prim.forward(kz, qz, do_x, _plus(_fill(-r, qpad_t, NEG).unsqueeze(-2), sb, transposed=True))
    g.mul_(torch.exp(_fill(c2 - c, kpad_t, 0.0)).unsqueeze(-1))  # sum_i P[i, j], in [1/T, T]
    db = torch.einsum("bhtd,bhtd->bht", v, g[..., :d]) - g[..., d]  # gradient of the key bias -c
    del g
    dc = _fill(-db, kpad_t, 0.0)  # padded keys have no c
    # One softmax backward gives both terms of ds (see the module docstring).
    do_x[..., d] = torch.exp(_fill(r, qpad_t, float("-inf")))  # exp(r_i) = sum_j xi[i, j]; 0 at padding
    vz = _extra_channel(v, dc)
    bias = _plus(_key_bias(c, kpad), sb)
    dq, dk, dv = prim.backward(do_x, qz, kz, vz, oz, r, bias)
    if db_out is not None:  # the same ds, formed once more for dB
        db_out(_score_grad(do_x, q, k, vz, oz, bias, r))
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
    def forward(ctx, q, k, v, kpad, qpad, prim, same=False, bias=None):
        qpad = kpad if same else qpad  # one mask for both (see dense.py)
        o = _output_buffer(q)
        r = q.new_empty(q.shape[:-1], dtype=compute_dtype(q.dtype))
        c = k.new_empty(k.shape[:-1], dtype=compute_dtype(k.dtype))
        for h in _groups(q.shape[1]):
            o[:, h], r[:, h], c[:, h] = dnas_forward(prim, *_up(q[:, h], k[:, h], v[:, h]), kpad, qpad,
                                                     _heads(bias, h, q))
        if qpad is not None:
            o.masked_fill_(_rows(qpad), 0.0)  # as the materialized path: pi rows of padding are 0
        ctx.prim, ctx.same = prim, same
        ctx.save_for_backward(q, k, v, o, r, c, kpad, None if same else qpad, bias)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, r, c, kpad, qpad, bias = ctx.saved_tensors
        qpad = kpad if ctx.same else qpad
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        db = _bias_grad_buffer(bias, ctx.needs_input_grad[7])
        for h in _groups(q.shape[1]):
            dq[:, h], dk[:, h], dv[:, h] = dnas_backward(
                ctx.prim, *_up(do[:, h], q[:, h], k[:, h], v[:, h], o[:, h]), r[:, h], c[:, h], kpad, qpad,
                sb=_heads(bias, h, q), db_out=None if db is None else (lambda ds, h=h: add_bias_grad(db, ds, h)),
            )
        return dq, dk, dv, None, None, None, None, _bias_grad_result(db, bias)


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
    def forward(ctx, q, k, v, u, kpad, qpad, prim, same=False, bias=None):
        qpad = kpad if same else qpad
        out = _output_buffer(q)
        r_d, r_u = (q.new_empty(q.shape[:-1], dtype=compute_dtype(q.dtype)) for _ in range(2))
        c = k.new_empty(k.shape[:-1], dtype=compute_dtype(k.dtype))
        uu = u.to(compute_dtype(q.dtype)).view(1, -1, 1, 1)
        ubias = key_padding_bias(kpad, q.dtype)
        for h in _groups(q.shape[1]):
            qh, kh, vh = _up(q[:, h], k[:, h], v[:, h])
            sb = _heads(bias, h, q)
            o_d, r_d[:, h], c[:, h] = dnas_forward(prim, qh, kh, vh, kpad, qpad, sb)
            o_u, r_u[:, h] = prim.forward(qh, kh, vh, _plus(ubias, sb))  # step 3
            out[:, h] = torch.lerp(o_u, o_d, uu[:, h])  # step 5: u O_D + (1 - u) O_U
        if qpad is not None:
            out.masked_fill_(_rows(qpad), 0.0)
        ctx.prim, ctx.same = prim, same
        ctx.save_for_backward(q, k, v, u, out, r_d, c, r_u, kpad, None if same else qpad, bias)
        return out

    @staticmethod
    def _both_outputs(prim, qh, kh, vh, out_h, us, c_h, kpad, sb=None):
        """[O_D, 0] (B, h, T, D + 1) and O_U (B, h, T, D) for a group of heads
        whose weights are the floats ``us`` (``sb``: their score bias)."""
        oz = _extra_channel(out_h)
        o_u = torch.empty_like(out_h)
        for i, ui in enumerate(us):
            one = slice(i, i + 1)
            if ui >= 0.5:  # recompute O_U; O_D = (out - (1 - u) O_U) / u
                o_u[:, one] = prim.forward(qh[:, one], kh[:, one], vh[:, one],
                                           _plus(key_padding_bias(kpad, qh.dtype), _one(sb, one)))[0]
                oz[:, one, :, :-1].sub_(o_u[:, one], alpha=1.0 - ui).div_(ui)
            else:  # recompute O_D; O_U = (out - u O_D) / (1 - u)
                o_d = prim.forward(qh[:, one], kh[:, one], vh[:, one],
                                   _plus(_key_bias(c_h[:, one], kpad), _one(sb, one)))[0]
                torch.sub(out_h[:, one], o_d, alpha=ui, out=o_u[:, one]).div_(1.0 - ui)
                oz[:, one, :, :-1] = o_d
        return oz, o_u

    @staticmethod
    def _both_recomputed(prim, qh, kh, vh, c_h, kpad, sb=None):
        """[O_D, 0] and O_U, both recomputed (one pass more than
        ``_both_outputs``, no branch on u)."""
        o_u = prim.forward(qh, kh, vh, _plus(key_padding_bias(kpad, qh.dtype), sb))[0]
        o_d = prim.forward(qh, kh, vh, _plus(_key_bias(c_h, kpad), sb))[0]
        return _extra_channel(o_d), o_u

    @staticmethod
    def backward(ctx, do):
        q, k, v, u, out, r_d, c, r_u, kpad, qpad, bias = ctx.saved_tensors
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
        db = _bias_grad_buffer(bias, ctx.needs_input_grad[8])
        for h in _groups(q.shape[1]):
            qh, kh, vh, out_h = _up(q[:, h], k[:, h], v[:, h], out[:, h])
            uh = uu[:, h]
            sb = _heads(bias, h, q)
            db_out = None if db is None else (lambda ds, h=h: add_bias_grad(db, ds, h))
            do_h = _fill(_up(do[:, h])[0], _rows(qpad), 0.0)
            if u_list is None:
                oz, o_u = FusedHNAS._both_recomputed(prim, qh, kh, vh, c[:, h], kpad, sb)
            else:
                oz, o_u = FusedHNAS._both_outputs(prim, qh, kh, vh, out_h, u_list[h], c[:, h], kpad, sb)
            du[h] = torch.einsum("bhtd,bhtd->h", do_h, oz[..., :d] - o_u).to(u.dtype)  # <dO, O_D - O_U>
            dq[:, h], dk[:, h], dv[:, h] = dnas_backward(
                prim, do_h, qh, kh, vh, oz, r_d[:, h], c[:, h], kpad, qpad, scale=uh, sb=sb, db_out=db_out
            )
            del oz
            ubias_h = _plus(ubias, sb)
            if db_out is not None:  # the plain part's score gradient
                db_out(_score_grad(do_h * (1.0 - uh), qh, kh, vh, o_u, ubias_h, r_u[:, h]))
            gq, gk, gv = prim.backward(do_h * (1.0 - uh), qh, kh, vh, o_u, r_u[:, h], ubias_h)
            del do_h, o_u
            dq[:, h] += gq
            dk[:, h] += gk
            dv[:, h] += gv
        return dq, dk, dv, du, None, None, None, None, _bias_grad_result(db, bias)


def _heads(bias: Optional[Tensor], h: slice, q: Tensor) -> Optional[Tensor]:
    """The score bias of heads ``h`` in the compute dtype, (B or 1, h, T_q, T_k)."""
    if bias is None:
        return None
    return bias.expand(bias.shape[0], q.shape[1], *bias.shape[2:])[:, h].to(compute_dtype(q.dtype))


def _one(sb: Optional[Tensor], one: slice) -> Optional[Tensor]:
    return None if sb is None else sb[:, one]


def _bias_grad_buffer(bias: Optional[Tensor], needed: bool) -> Optional[Tensor]:
    if bias is None or not needed:
        return None
    return torch.zeros(bias.shape, dtype=compute_dtype(bias.dtype), device=bias.device)


def _bias_grad_result(db: Optional[Tensor], bias: Optional[Tensor]) -> Optional[Tensor]:
    return None if db is None else db.to(bias.dtype)


def fused_dnas(q, k, v, kpad, qpad, prim, bias=None):
    """``bias``: a score bias (1 or B, 1 or H, T_q, T_k) added to the scores, or None."""
    same = qpad is kpad and kpad is not None
    return FusedDNAS.apply(q, k, v, kpad, None if same else qpad, prim, same, bias)


def fused_hnas(q, k, v, u, kpad, qpad, prim, bias=None):
    same = qpad is kpad and kpad is not None
    return FusedHNAS.apply(q, k, v, u, kpad, None if same else qpad, prim, same, bias)
