"""Property tests of the math, with Hypothesis.

``attention_probs`` and every execution path of ``kernels.attend`` (every
name in ``kernels.PATHS``, so a path added there is tested without editing
this file) on random cases: 1 to 300 positions, T_q != T_k (attention_probs;
``attend`` is self-attention), random left and right padding with a batch
element that has a single real position, scores up to +-1e4, float16,
bfloat16, float32 and float64 inputs, u anywhere in [0, 1] (0 and 1
included). Checked on every case: real rows sum to 1, padded rows and columns
are exactly 0, no NaN or inf in the output or the gradients, Theorem 2, and
equality with the float64 reference (fairseq_dnas/reference.py).

Cost and determinism: a fixed number of examples per test, derandomized
unless HYPOTHESIS_PROFILE=explore. Settings (environment):
  FAIRSEQ_DNAS_PROPERTY_EXAMPLES        examples per test (default 15)
  FAIRSEQ_DNAS_PROPERTY_EXAMPLES_<PATH> examples for one path, e.g. _TRITON=20
                                        (default: 4 for 'triton', slow on CPU)
  HYPOTHESIS_PROFILE=explore            random (not derandomized) search, for
                                        developers hunting for new failures
Each test prints how many cases it ran (pytest -s shows them).

How ``attend`` is checked without a probability matrix: with V = [I | R]
(identity, then random columns) the output is [P | P R], so the first T
output columns are the probabilities themselves, for paths that keep no
T x T matrix too. Half-precision scores are made exactly representable (one
coordinate of q and k carries m * 2^e and +-2^f), so that the float64
reference sees exactly the scores the path sees.
"""

import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from fairseq_dnas.reference import reference_probs

from fairseq_dnas import attention_probs
from fairseq_dnas.attention import kernels

settings.register_profile("ci", derandomize=True, deadline=None, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("explore", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
SCALES = (0.0, 1e-3, 1.0, 30.0, 1e4)  # typical size of the scores
MAX_LEN = 300
F32_EPS = 2.0 ** -24  # every path computes in float32 or better


# Paths that are slow on CPU get fewer examples by default: the Triton kernels
# run under TRITON_INTERPRET=1 there, one Python call per program instance.
SLOW_PATH_EXAMPLES = {"triton": 4}


def examples(path=None):
    default = int(os.environ.get("FAIRSEQ_DNAS_PROPERTY_EXAMPLES", "15"))
    if path is None:
        return default
    default = min(default, SLOW_PATH_EXAMPLES.get(path, default))
    return int(os.environ.get(f"FAIRSEQ_DNAS_PROPERTY_EXAMPLES_{path.upper()}", default))


def _settings(path=None):
    return settings(settings.get_profile(PROFILE), max_examples=examples(path))


lengths = st.one_of(st.integers(1, 12), st.integers(13, MAX_LEN))
hybrid_values = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


@st.composite
def padding(draw, batch, total):
    """(B, T) mask, True at padding: each element has 1..T real positions,
    padded on the left, the right or both; element 0 may have a single one."""
    mask = torch.ones(batch, total, dtype=torch.bool)
    single = draw(st.booleans())
    for b in range(batch):
        real = 1 if (single and b == 0) else draw(st.integers(1, total))
        left = draw(st.integers(0, total - real))
        mask[b, left:left + real] = False
    return mask


@st.composite
def cases(draw, self_attention):
    batch, heads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    t_q = draw(lengths)
    t_k = t_q if self_attention else draw(lengths)
    qmask = draw(padding(batch, t_q))
    kmask = qmask if self_attention else draw(padding(batch, t_k))
    return {
        "batch": batch, "heads": heads, "t_q": t_q, "t_k": t_k, "qmask": qmask, "kmask": kmask,
        "scheme": draw(st.sampled_from(("unas", "dnas", "hnas"))),
        "dtype": draw(st.sampled_from(DTYPES)),
        "scale": draw(st.sampled_from(SCALES)),
        "u": draw(st.lists(hybrid_values, min_size=heads, max_size=heads)),
        "seed": draw(st.integers(0, 2 ** 31 - 1)),
    }


def _describe(case):
    real_q = (~case["qmask"]).sum(1).tolist()
    real_k = (~case["kmask"]).sum(1).tolist()
    return (f"{case['scheme']} {case['dtype']} B={case['batch']} H={case['heads']} T_q={case['t_q']} "
            f"T_k={case['t_k']} real q {real_q} real k {real_k} scale {case['scale']} u {case['u']} "
            f"seed {case['seed']}")


def _tolerance(max_score, dtype):
    """Largest allowed |p - p_ref|: a few float32 roundings of the log-domain
    values (of the size of the largest score), plus the output's own rounding."""
    return 16 * F32_EPS * (1.0 + max_score) + 4 * torch.finfo(dtype).eps + 1e-7


def _check_probabilities(p, ref, case, tol, what):
    """p: (B, H, T_q, T_k) probabilities (any float dtype), ref: float64 reference."""
    p = p.double()
    qmask, kmask = case["qmask"], case["kmask"]
    assert torch.isfinite(p).all(), f"{what}: NaN or inf"
    assert (p.transpose(1, 2)[qmask] == 0).all(), f"{what}: a padded query row is not exactly 0"
    assert (p.permute(0, 3, 1, 2)[kmask] == 0).all(), f"{what}: a padded key column is not exactly 0"
    rows = p.sum(-1).transpose(1, 2)[~qmask]  # real query rows
    assert ((rows - 1).abs() <= tol * case["t_k"] + 1e-6).all(), \
        f"{what}: a real row sums to {rows[(rows - 1).abs().argmax()].item()!r}, not 1"
    diff = (p - ref).abs().max().item()
    assert diff <= tol, f"{what}: differs from the float64 reference by {diff:.3g} (allowed {tol:.3g})"
    if case["scheme"] == "unas":
        return
    # Theorem 2: every real key j gets sum_i pi_D[i, j] >= 1 / T_k (T_k real
    # keys; in self-attention T_k = T_q, the paper's 1 / T), and HNAS at least
    # u times that. Checked on the path's output itself, not on the reference.
    cols = p.sum(-2)  # (B, H, T_k)
    for b in range(case["batch"]):
        real = ~kmask[b]
        n_keys = int(real.sum())
        u = torch.tensor(case["u"], dtype=torch.float64) if case["scheme"] == "hnas" else torch.ones(case["heads"])
        bound = u[:, None] / n_keys
        low = cols[b][:, real] - (bound - tol * case["t_q"])
        assert (low >= 0).all(), f"{what}: Theorem 2 fails for batch element {b} ({n_keys} real keys)"


def _scores(case):
    g = torch.Generator().manual_seed(case["seed"])
    shape = (case["batch"], case["heads"], case["t_q"], case["t_k"])
    s = torch.randn(shape, generator=g, dtype=torch.float64) * case["scale"]
    spikes = torch.rand(shape, generator=g, dtype=torch.float64) < 0.05
    s = torch.where(spikes, torch.sign(s) * case["scale"] * 1.0, s)
    return s.clamp(-1e4, 1e4).to(case["dtype"])


def _check_attention_probs(case, iters):
    scores = _scores(case)
    u = torch.tensor(case["u"], dtype=case["dtype"]) if case["scheme"] == "hnas" else None
    leaf = scores.clone().requires_grad_()
    p = attention_probs(leaf, case["scheme"], key_padding_mask=case["kmask"], query_padding_mask=case["qmask"],
                        hybrid_weight=u, sinkhorn_iters=iters)
    assert p.dtype == (torch.float64 if case["dtype"] == torch.float64 else torch.float32)
    ref = reference_probs(scores, case["scheme"], case["kmask"], case["qmask"], u, iters)
    tol = _tolerance(float(scores.double().abs().max()), torch.float32) * iters
    _check_probabilities(p, ref, case, tol, f"attention_probs[{_describe(case)}, iters {iters}]")
    (grad,) = torch.autograd.grad(p, leaf, torch.randn_like(p))
    assert torch.isfinite(grad).all(), f"attention_probs[{_describe(case)}]: NaN or inf in the gradient"


def test_attention_probs_properties():
    ran = []

    @_settings()
    @given(case=cases(self_attention=False), iters=st.integers(1, 3))
    def check(case, iters):
        _check_attention_probs(case, iters)
        ran.append(case["t_q"] != case["t_k"])

    check()
    print(f"\nattention_probs: {len(ran)} property cases ({sum(ran)} with T_q != T_k)")
    assert sum(ran) >= 1  # cross-attention shapes were among them


def _qkv(case, extra_columns=3):
    """q, k with exactly representable scores; v = [I | R] of width T + extra."""
    g = torch.Generator().manual_seed(case["seed"])
    b, h, t = case["batch"], case["heads"], case["t_q"]
    d = t + extra_columns
    # Scores m * 2^(e + f), |m| <= 19, e + f <= 9: at most 9,728 in size, exact
    # in every dtype (5 significant bits).
    e = 0 if case["scale"] == 0 else max(-10, min(5, round(math.log2(case["scale"] / 19)) - 4))
    m = torch.randint(-19, 20, (b, h, t), generator=g).double() * (case["scale"] > 0)
    f = torch.randint(0, 5, (b, h, t), generator=g).double()
    sign = torch.randint(0, 2, (b, h, t), generator=g).double() * 2 - 1
    q = torch.zeros(b, h, t, d, dtype=torch.float64)
    k = torch.zeros_like(q)
    q[..., 0], k[..., 0] = m * 2.0 ** e, sign * 2.0 ** f
    if case["dtype"] in (torch.float32, torch.float64):  # general scores (rounded within the tolerance)
        q[..., 1:3] = torch.randn(b, h, t, 2, generator=g, dtype=torch.float64)
        k[..., 1:3] = torch.randn(b, h, t, 2, generator=g, dtype=torch.float64)
    v = torch.cat([torch.eye(t, dtype=torch.float64).expand(b, h, t, t),
                   torch.randn(b, h, t, extra_columns, generator=g, dtype=torch.float64)], dim=-1)
    return [x.to(case["dtype"]).requires_grad_() for x in (q, k, v)]


def _check_path(path, case):
    """None when the path ran and passed; the refusal message when it refused."""
    q, k, v = _qkv(case)
    u = torch.tensor(case["u"], dtype=case["dtype"]).requires_grad_() if case["scheme"] == "hnas" else None
    pad = case["qmask"]
    try:
        out, _ = kernels.attend(q, k, v, scheme=case["scheme"], padding_mask=pad, hybrid_weight=u, path=path)
    except ValueError as err:  # a forced path that cannot run these settings says why
        try:
            kernels.choose_path(q, path=path)
        except ValueError:
            return str(err)
        raise
    what = f"path {path!r} [{_describe(case)}]"
    assert out.shape == v.shape and out.dtype == v.dtype, what
    t = case["t_q"]
    ref = reference_probs(q.detach().double() @ k.detach().double().transpose(-1, -2), case["scheme"],
                          pad, pad, None if u is None else u.detach().double())
    max_score = float((q.detach().double() @ k.detach().double().transpose(-1, -2)).abs().max())
    tol = _tolerance(max_score, case["dtype"])
    _check_probabilities(out[..., :t], ref, case, tol, what)
    r = v.detach().double()[..., t:]
    diff = (out[..., t:].double() - ref @ r).abs().max().item()
    allowed = tol * r.abs().sum(-2).max().item() + 4 * torch.finfo(case["dtype"]).eps * r.abs().max().item()
    assert diff <= allowed, f"{what}: P V differs from the reference by {diff:.3g} (allowed {allowed:.3g})"
    inputs = [x for x in (q, k, v, u) if x is not None]
    grads = torch.autograd.grad(out, inputs, torch.randn_like(out))
    for name, grad in zip("qkvu", grads):
        assert torch.isfinite(grad).all(), f"{what}: NaN or inf in d{name}"
    return None


@pytest.mark.parametrize("path", kernels.PATHS)
def test_attend_path_properties(path):
    counts = {"ran": 0, "refused": 0}

    @_settings(path)
    @given(case=cases(self_attention=True))
    def check(case):
        refusal = _check_path(path, case)
        counts["refused" if refusal else "ran"] += 1

    check()
    print(f"\npath {path!r}: {counts['ran']} property cases ran, {counts['refused']} refused by the path "
          "(ValueError saying why, e.g. flash on half precision)")
    assert counts["ran"] >= 1, f"path {path!r} ran no case"
