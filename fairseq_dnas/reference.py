"""A plain float64 implementation of the paper's Algorithm 1 (steps 3-5).

Deliberately naive: one (batch, head) at a time, only the real queries and
keys, each normalization written out (as a log-sum-exp, so that scores of any
size stay exact). Everything in fairseq_dnas is tested against this (tests/),
and the benchmarks check their rows against it; it is part of the package so
that both import it the same way, and nothing in the package imports it.
"""

import torch


def reference_probs(scores, scheme, key_padding_mask=None, query_padding_mask=None,
                    hybrid_weight=None, sinkhorn_iters=1):
    """(B, H, T_q, T_k) probabilities in float64; padding rows/columns are 0."""
    s = scores.detach().double()
    batch, heads, t_q, t_k = s.shape
    out = torch.zeros_like(s)
    for b in range(batch):
        rq = [i for i in range(t_q) if query_padding_mask is None or not query_padding_mask[b, i]]
        rk = [j for j in range(t_k) if key_padding_mask is None or not key_padding_mask[b, j]]
        for h in range(heads):
            S = s[b, h][rq][:, rk]
            # In the log domain: with scores of 1e4, exp of anything underflows
            # and a plain exp/sum would give 0/0 even in float64.
            # Step 3 (UNAS): normalize each query row over the keys.
            p_u = (S - torch.logsumexp(S, dim=1, keepdim=True)).exp()
            # Step 4 (DNAS): normalize each key column over the queries, then
            # each query row over the keys; k rounds = k Sinkhorn iterations.
            L = S
            for _ in range(sinkhorn_iters):
                L = L - torch.logsumexp(L, dim=0, keepdim=True)
                L = L - torch.logsumexp(L, dim=1, keepdim=True)
            p_d = L.exp()
            if scheme == "unas":
                P = p_u
            elif scheme == "dnas":
                P = p_d
            else:  # Step 5 (HNAS)
                u = float(hybrid_weight[h])
                P = u * p_d + (1.0 - u) * p_u
            out[b, h][torch.tensor(rq)[:, None], torch.tensor(rk)[None, :]] = P
    return out


def reference_self_attention(module, x, padding_mask=None):
    """A ``DNASMultiheadAttention``'s output recomputed in float64 with
    ``reference_probs``; x is (T, B, C) as fairseq passes it."""
    t, b, c = x.shape
    h, d = module.num_heads, module.head_dim
    xd = x.detach().double()

    def proj(linear):
        return xd @ linear.weight.detach().double().T + linear.bias.detach().double()

    def heads(y):  # (T, B, C) -> (B, H, T, D)
        return y.view(t, b, h, d).permute(1, 2, 0, 3)

    q, k, v = heads(proj(module.q_proj) * module.scaling), heads(proj(module.k_proj)), heads(proj(module.v_proj))
    u = None if module.hybrid_weight is None else module.hybrid_weight.detach().double()
    p = reference_probs(q @ k.transpose(-1, -2), module.scheme, padding_mask, padding_mask,
                        u, module.sinkhorn_iters)
    out = (p @ v).permute(2, 0, 1, 3).reshape(t, b, c)
    return out @ module.out_proj.weight.detach().double().T + module.out_proj.bias.detach().double()
