"""Tier 1: the Triton path's long kernels (``attention/triton/long.py``) against the float64 reference.

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(conftest sets TRITON_INTERPRET=1; the interpreter uses 16 x 16 tiles, so the
lengths below span several tiles and ragged tails). On a GPU machine the same
tests run the compiled kernels on CUDA tensors. ``test_triton_tiles.py``
compiles every kernel variant for an H100 (sm_90) on any machine (the
interpreter accepts code the compiler rejects) and tests the tile tools.
The one-tile kernels of short inputs: ``test_triton_short.py``.
"""

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_probs, reference_self_attention

from fairseq_dnas.attention import functional as AF
from fairseq_dnas.attention import kernels, selection
from fairseq_dnas.attention.kernels import attend, choose_path
from fairseq_dnas.modules import DNASMultiheadAttention

long = pytest.importorskip(
    "fairseq_dnas.attention.triton.long", reason="triton is not installed (scripts/install.sh installs it)"
)
from fairseq_dnas.attention.triton import dropout as triton_dropout  # noqa: E402 (after the importorskip)
from fairseq_dnas.attention.triton import launch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
T = 37  # three 16-row tiles under the interpreter, the last one ragged
LENGTHS = (37, 20, 1, 30)  # a one-token sentence: its only key is its only query
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _long_kernels_at_every_length(monkeypatch):
    """These tests hold long.py's kernels; through ``attend`` short inputs
    would otherwise run the one-tile kernels (tests/test_triton_short.py)."""
    monkeypatch.setenv(selection.SHORT_ENV, "0")


def _needs_working_dot(dtype):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("Triton's interpreter returns garbage for bfloat16 tl.dot (docs/performance.md#testing-the-kernels-without-a-gpu); "
                    "bfloat16 runs on the GPU, and the sm_90 compile test covers its kernels here")


def _qkv(dtype=torch.float32, batch=4, heads=3, tq=T, tk=T, d=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = 1.5 * (20 / d) ** 0.25  # scores of the same size (std about 10) at every head size
    q = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64) * scale
    k = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64)
    return [x.to(device=DEVICE, dtype=dtype).requires_grad_() for x in (q, k, v)]


def _u(heads=3):
    return torch.linspace(0.1, 0.9, heads, device=DEVICE).requires_grad_()


def _mask(padding, t=T, lengths=LENGTHS):
    return None if padding == "none" else padding_mask(lengths, t, padding == "left").to(DEVICE)


def _float64_autograd(q, k, v, u, scheme, kmask, qmask, keep=None, p=0.0, sinkhorn_iters=1):
    """Output and the graph's inputs, through the materialized float64 math."""
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    ud = None if u is None or scheme == "dnas" else u.detach().double().requires_grad_()
    km, qm = AF.broadcast_masks(kmask, qmask)
    s = qd @ kd.transpose(-1, -2)
    if scheme == "dnas":
        probs = AF.dnas_probs(s, km, qm, sinkhorn_iters)
    else:
        probs = AF.hnas_probs(s, ud, km, qm, sinkhorn_iters)
    if keep is not None:  # the kernels drop at p rounded to a multiple of 1/256, and scale by its complement
        probs = probs * keep.double() / (1.0 - triton_dropout.effective_dropout_p(p))
    inputs = (qd, kd, vd) if ud is None else (qd, kd, vd, ud)
    return probs @ vd, inputs


def _grad_tol(ref, tol=1e-5):
    """float32 rounding relative to the gradient's scale: the gradients here
    reach |10| and du sums B * T * T terms."""
    return tol * max(1.0, float(ref.abs().max()))


def _run(q, k, v, scheme, kmask, qmask, u, **kw):
    return long.triton_attention(
        q, k, v, hybrid_weight=u if scheme == "hnas" else None,
        key_padding_mask=kmask, query_padding_mask=qmask, **kw)


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _pairwise_grid(dtypes, default):
    """(padding, scheme, dtype) over every padding, scheme and dtype: the
    default tier runs ``default``, a subset in which every pair of values
    (padding and scheme, padding and dtype, scheme and dtype) occurs; the
    full tier runs the rest of the product."""
    return [pytest.param(padding, scheme, dtype, id=f"{padding}-{scheme}-{str(dtype)[6:]}",
                         marks=() if (padding, scheme, dtype) in default else pytest.mark.full)
            for padding in ("none", "left", "right") for scheme in ("dnas", "hnas") for dtype in dtypes]


FORWARD_GRID = _pairwise_grid((F32, F16, BF16), {
    ("none", "dnas", F32), ("none", "hnas", F16), ("none", "dnas", BF16),
    ("left", "hnas", F32), ("left", "dnas", F16), ("left", "hnas", BF16),
    ("right", "dnas", F32), ("right", "hnas", F16), ("right", "dnas", BF16)})
GRADIENT_GRID = _pairwise_grid((F32, F16), {
    ("none", "dnas", F32), ("none", "hnas", F16), ("left", "dnas", F16),
    ("left", "hnas", F32), ("right", "dnas", F16), ("right", "hnas", F32)})


@pytest.mark.parametrize("grid", [FORWARD_GRID, GRADIENT_GRID])
def test_default_tier_grids_cover_every_pair_of_values(grid):
    every = [param.values for param in grid]
    default = [param.values for param in grid if not param.marks]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert {(v[i], v[j]) for v in default} == {(v[i], v[j]) for v in every}, (i, j)


@pytest.mark.parametrize("padding,scheme,dtype", FORWARD_GRID)
def test_forward_matches_float64_reference(dtype, scheme, padding):
    _needs_working_dot(dtype)
    q, k, v = _qkv(dtype)
    u = _u()
    mask = _mask(padding)
    out = _run(q, k, v, scheme, mask, mask, u)
    p = reference_probs(q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2), scheme,
                        None if mask is None else mask.cpu(), None if mask is None else mask.cpu(),
                        u.detach().double().cpu())
    ref = p @ v.detach().double().cpu()
    assert out.shape == q.shape and out.dtype == dtype
    torch.testing.assert_close(out.double().cpu(), ref, atol=TOL[dtype], rtol=0)
    if mask is not None:  # padded query rows: exactly 0, finite
        assert (out.transpose(1, 2)[mask] == 0).all()


@pytest.mark.parametrize("padding,scheme,dtype", GRADIENT_GRID)
def test_gradients_match_float64_autograd(dtype, scheme, padding):
    q, k, v = _qkv(dtype)
    u = _u()
    mask = _mask(padding)
    out = _run(q, k, v, scheme, mask, mask, u)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device=DEVICE, dtype=dtype)
    ins = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    grads = torch.autograd.grad(out, ins, g)
    ref_out, ref_ins = _float64_autograd(q, k, v, u, scheme, mask, mask)
    ref = torch.autograd.grad(ref_out, ref_ins, g.double())
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    for name, a, b in zip("qkvu", grads, ref):
        assert torch.isfinite(a).all(), name
        atol = _grad_tol(b, tol)
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=atol, rtol=0, msg=lambda m, name=name: f"d{name} ({dtype}): {m}")


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_cross_attention_with_separate_masks(scheme):
    """T_q != T_k, padded queries left out of DNAS's column sums."""
    tq, tk = 23, 41
    q, k, v = _qkv(tq=tq, tk=tk)
    u = _u()
    qmask = padding_mask((23, 5, 1, 17), tq, True).to(DEVICE)
    kmask = padding_mask((41, 40, 3, 9), tk, False).to(DEVICE)
    out = _run(q, k, v, scheme, kmask, qmask, u)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ins = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    grads = torch.autograd.grad(out, ins, g)
    p = reference_probs(q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2), scheme,
                        kmask.cpu(), qmask.cpu(), u.detach().double().cpu())
    torch.testing.assert_close(out.double().cpu(), p @ v.detach().double().cpu(), atol=1e-5, rtol=0)
    ref_out, ref_ins = _float64_autograd(q, k, v, u, scheme, kmask, qmask)
    for name, a, b in zip("qkvu", grads, torch.autograd.grad(ref_out, ref_ins, g.double())):
        atol = _grad_tol(b)
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=atol, rtol=0, msg=lambda m, name=name: f"d{name}: {m}")


def test_attend_passes_cross_attention_masks_to_the_kernels():
    """kernels.attend with query_padding_mask (what fairseq_dnas.nn calls)."""
    tq, tk = 19, 33
    q, k, v = _qkv(tq=tq, tk=tk)
    qmask = padding_mask((19, 4, 1, 10), tq, False).to(DEVICE)
    kmask = padding_mask((33, 2, 30, 7), tk, True).to(DEVICE)
    out, _ = attend(q, k, v, scheme="dnas", padding_mask=kmask, query_padding_mask=qmask, path="triton")
    p = reference_probs(q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2), "dnas",
                        kmask.cpu(), qmask.cpu())
    torch.testing.assert_close(out.double().cpu(), p @ v.detach().double().cpu(), atol=1e-5, rtol=0)


def test_head_sizes_and_an_all_padding_sentence():
    """Head sizes 32 and 128 (and an odd 20 above); a sentence that is all
    padding gives finite zeros forward and backward."""
    for d in (32, 128):
        q, k, v = _qkv(batch=2, heads=1, tq=17, tk=17, d=d)
        mask = padding_mask((17, 0), 17, True).to(DEVICE)
        out = _run(q, k, v, "dnas", mask, mask, None)
        out.sum().backward()
        q0, k0, v0, m0 = (x[:1].detach().double().cpu() for x in (q, k, v, mask))  # the real sentence
        ref = reference_probs(q0 @ k0.transpose(-1, -2), "dnas", m0.bool(), m0.bool()) @ v0
        torch.testing.assert_close(out[:1].double().cpu(), ref, atol=1e-5, rtol=0)
        assert (out[1] == 0).all()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_extreme_scores_stay_finite_and_exact(scheme):
    """Scores in the hundreds: a query explained away by every key (its row of
    exp(s - c) underflows in float32) must still get a normalized row, and
    nothing may become NaN. The error is then set by float32 rounding of the
    scores themselves (c comes from a second product k.q, rounded apart):
    allow 4 rounding steps of the largest score (|v| = 1)."""
    q, k, v = _qkv()
    with torch.no_grad():
        q.mul_(4.0)
        k.mul_(4.0)
    u = _u()
    mask = _mask("left")
    out = _run(q, k, v, scheme, mask, mask, u)
    scores = q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2)
    assert scores.abs().max() > 300
    p = reference_probs(scores, scheme, mask.cpu(), mask.cpu(), u.detach().double().cpu())
    atol = 4 * torch.finfo(torch.float32).eps * float(scores.abs().max())
    torch.testing.assert_close(out.double().cpu(), p @ v.detach().double().cpu(), atol=atol, rtol=0)
    out.pow(2).sum().backward()
    for t in (q, k, v, u):
        assert t.grad is None or torch.isfinite(t.grad).all()


def test_the_scheme_runs_not_softmax():
    """A silent fallback to softmax attention would pass many tests: the DNAS
    output must differ from UNAS by far more than the tolerance."""
    q, k, v = _qkv()
    mask = _mask("left")
    out = _run(q, k, v, "dnas", mask, mask, None)
    s = q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2)
    unas = reference_probs(s, "unas", mask.cpu(), mask.cpu()) @ v.detach().double().cpu()
    assert (out.double().cpu() - unas).abs().max() > 0.1


# --- Sinkhorn iterations (triton/sinkhorn.py) ---------------------------------------


@pytest.mark.parametrize(
    "scheme, iters, padding, tk, dtype",
    [
        # default tier: both schemes, 2 and 3 rounds, cross-attention, float16
        ("hnas", 3, "left", 29, torch.float32),  # cross-attention: rows and columns of different lengths
        ("dnas", 2, "left", T, torch.float16),
        # full tier: the other padding side and the remaining scheme x rounds pairs in float32
        pytest.param("dnas", 2, "left", T, torch.float32, marks=pytest.mark.full),
        pytest.param("dnas", 3, "right", T, torch.float32, marks=pytest.mark.full),
        pytest.param("hnas", 2, "right", T, torch.float32, marks=pytest.mark.full),
    ],
)
def test_sinkhorn_iterations_match_float64_reference(scheme, iters, padding, tk, dtype):
    """sinkhorn_iters > 1 without a T x T matrix: output against Algorithm 1
    repeated (fairseq_dnas/reference.py), gradients against float64 autograd."""
    q, k, v = _qkv(dtype, tk=tk)
    u = _u()
    qmask = _mask(padding)
    kmask = _mask(padding, tk, (29, 20, 1, 5))
    out = _run(q, k, v, scheme, kmask, qmask, u, sinkhorn_iters=iters)
    s = q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2)
    p = reference_probs(s, scheme, kmask.cpu(), qmask.cpu(), u.detach().double().cpu(), sinkhorn_iters=iters)
    vd = v.detach().double().cpu()
    torch.testing.assert_close(out.double().cpu(), p @ vd, atol=TOL[dtype], rtol=0)
    assert (out.transpose(1, 2)[qmask] == 0).all()
    one_round = reference_probs(s, scheme, kmask.cpu(), qmask.cpu(), u.detach().double().cpu()) @ vd
    assert (out.double().cpu() - one_round).abs().max() > 0.05  # the extra rounds ran
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device=DEVICE, dtype=dtype)
    ins = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    grads = torch.autograd.grad(out, ins, g)
    ref_out, ref_ins = _float64_autograd(q, k, v, u, scheme, kmask, qmask, sinkhorn_iters=iters)
    tol = 1e-5 if dtype == torch.float32 else 5e-3
    for name, a, b in zip("qkvu", grads, torch.autograd.grad(ref_out, ref_ins, g.double())):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=_grad_tol(b, tol), rtol=0,
                                   msg=lambda m, name=name: f"d{name}: {m}")


def test_sinkhorn_iterations_approach_a_doubly_stochastic_matrix():
    """With V = I the output is the probability matrix itself: rows sum to 1
    after every round, columns only in the limit (Sinkhorn's theorem)."""
    t = 16
    q, k, _ = _qkv(batch=1, heads=1, tq=t, tk=t, d=16)
    eye = torch.eye(t, device=DEVICE).expand(1, 1, t, t)
    with torch.no_grad():
        q = q / 4  # scores of std about 2: near-permutation matrices need many more rounds
        col_err = {}
        for iters in (1, 30):
            p = _run(q, k, eye, "dnas", None, None, None, sinkhorn_iters=iters).double().cpu()
            torch.testing.assert_close(p.sum(-1), torch.ones(1, 1, t, dtype=torch.float64), atol=1e-5, rtol=0)
            col_err[iters] = (p.sum(-2) - 1).abs().max().item()
    assert col_err[1] > 0.1 and col_err[30] < 1e-4, col_err


def test_sinkhorn_padded_queries_far_from_every_key():
    """A padded query whose scores are all very negative has a row normalizer
    b far below 0 (about -360 here): exp(-b) must not reach the gradients
    through 0 * inf = NaN, and the real rows must not notice it."""
    q, k, v = _qkv(batch=2, heads=1, tq=20, tk=20, d=16)
    mask = padding_mask((20, 12), 20, True).to(DEVICE)
    with torch.no_grad():
        k.abs_()
        q[1, :, :8] = -50.0
    out = _run(q, k, v, "dnas", mask, mask, None, sinkhorn_iters=2)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_out, ref_ins = _float64_autograd(q, k, v, None, "dnas", mask, mask, sinkhorn_iters=2)
    torch.testing.assert_close(out.double().cpu(), ref_out.detach().cpu(), atol=1e-5, rtol=0)
    for name, a, b in zip("qkv", grads, torch.autograd.grad(ref_out, ref_ins, g.double())):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=_grad_tol(b), rtol=0,
                                   msg=lambda m, name=name: f"d{name}: {m}")


def test_sinkhorn_with_dropout_equals_autograd_with_the_same_mask():
    q, k, v = _qkv(heads=2)
    u = _u(2)
    mask = _mask("left")
    p, seed = 0.2, _seed(99)
    out = _run(q, k, v, "hnas", mask, mask, u, dropout_p=p, seed=seed, sinkhorn_iters=2)
    keep = triton_dropout.dropout_mask(seed, tuple(q.shape[:3]) + (k.shape[2],), p)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    grads = torch.autograd.grad(out, (q, k, v, u), g)
    ref_out, ref_ins = _float64_autograd(q, k, v, u, "hnas", mask, mask, keep=keep, p=p, sinkhorn_iters=2)
    torch.testing.assert_close(out.double().cpu(), ref_out.cpu(), atol=1e-5, rtol=0)
    for name, a, b in zip("qkvu", grads, torch.autograd.grad(ref_out, ref_ins, g.double())):
        torch.testing.assert_close(a.double().cpu(), b.cpu(), atol=_grad_tol(b), rtol=0,
                                   msg=lambda m, name=name: f"d{name}: {m}")


# --- dropout --------------------------------------------------------------------


def _seed(value):
    return torch.tensor([value], dtype=torch.int64, device=DEVICE)


# HNAS in the default tier (its DNAS half runs the same masked kernels); DNAS in the full tier.
@pytest.mark.parametrize("scheme", [pytest.param("dnas", marks=pytest.mark.full), "hnas"])
def test_dropout_gradients_equal_autograd_with_the_same_mask(scheme):
    q, k, v = _qkv()
    u = _u()
    mask = _mask("left")
    p, seed = 0.3, _seed(1234)
    out = _run(q, k, v, scheme, mask, mask, u, dropout_p=p, seed=seed)
    keep = triton_dropout.dropout_mask(seed, tuple(q.shape[:3]) + (k.shape[2],), p)
    kept = keep.float().mean().item()
    assert 0.6 < kept < 0.8, kept  # about 1 - p of the entries kept
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ins = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    grads = torch.autograd.grad(out, ins, g)
    ref_out, ref_ins = _float64_autograd(q, k, v, u, scheme, mask, mask, keep=keep, p=p)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=0)
    for name, a, b in zip("qkvu", grads, torch.autograd.grad(ref_out, ref_ins, g.double())):
        atol = _grad_tol(b)
        torch.testing.assert_close(a.double(), b, atol=atol, rtol=0, msg=lambda m, name=name: f"d{name}: {m}")


def test_dropout_same_seed_same_result_and_p0_is_no_dropout():
    q, k, v = _qkv(heads=2)
    u = _u(2)
    mask = _mask("right")
    runs = []
    for seed in (7, 7, 8):
        out = _run(q, k, v, "hnas", mask, mask, u, dropout_p=0.2, seed=_seed(seed))
        runs.append((out.detach(), torch.autograd.grad(out.sum(), (q, k, v, u))))
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)
    assert torch.equal(runs[0][0], runs[1][0])
    assert not torch.allclose(runs[0][0], runs[2][0])
    # Through attend: an inactive dropout (p = 0, or eval mode) is the no-dropout kernel.
    plain = _run(q, k, v, "hnas", mask, mask, u)
    for drop in (torch.nn.Dropout(0.0).train(), torch.nn.Dropout(0.5).eval()):
        out, _ = attend(q, k, v, scheme="hnas", padding_mask=mask, hybrid_weight=u, dropout=drop, path="triton")
        assert torch.equal(out, plain)


@pytest.mark.parametrize("n", [100, pytest.param(400, marks=pytest.mark.full)])
def test_dropout_mean_over_seeds_approaches_the_expectation(n):
    """E[Z / (1 - p)] = 1: the average output over many masks tends to the
    no-dropout output (the error of the mean shrinks like 1 / sqrt(n); the
    bound asks for sqrt(n) / 2.5 of it: 4x fewer masks in the default tier)."""
    q, k, v = _qkv(batch=1, heads=1, tq=20, tk=20, d=16)
    plain = _run(q, k, v, "dnas", None, None, None).detach()
    p = 0.1
    total = torch.zeros_like(plain)
    for seed in range(n):
        total += _run(q, k, v, "dnas", None, None, None, dropout_p=p, seed=_seed(seed)).detach()
    err_mean = (total / n - plain).abs().mean().item()
    one = _run(q, k, v, "dnas", None, None, None, dropout_p=p, seed=_seed(10**6)).detach()
    err_one = (one - plain).abs().mean().item()
    assert err_mean < err_one / (n ** 0.5 / 2.5), (err_mean, err_one)  # sqrt(n) in expectation


# --- the path in the package ------------------------------------------------------


class _FakeCuda:
    """Enough of a CUDA tensor for ``choose_path`` (no GPU needed)."""

    def __init__(self, t=128, dtype=torch.float16, d=64):
        self.device, self.dtype, self.shape = torch.device("cuda"), dtype, (2, 12, t, d)


def test_auto_takes_triton_on_cuda_at_every_length(monkeypatch):
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    for t in (8, 128, 4096):
        assert choose_path(_FakeCuda(t)) == "triton"
        assert choose_path(_FakeCuda(t), dropout=True) == "triton"
    assert choose_path(_FakeCuda(), need_weights=True) == "dense"
    assert choose_path(_FakeCuda(), sinkhorn_iters=3) == "triton"
    assert choose_path(_FakeCuda(), sinkhorn_iters=3, need_weights=True) == "materialized"
    assert choose_path(_FakeCuda(dtype=torch.float64)) == "dense"  # no float64 kernels
    assert choose_path(_FakeCuda(d=256)) == "dense"


@pytest.mark.parametrize(
    "q, kwargs, message",
    [
        (_FakeCuda(dtype=torch.float64), {}, "float16, bfloat16 or float32"),
        (_FakeCuda(d=256), {}, "head sizes up to 128"),
    ],
)
def test_forced_triton_says_why_it_cannot_run(q, kwargs, message, monkeypatch):
    monkeypatch.setenv(kernels.PATH_ENV, "triton")
    with pytest.raises(ValueError, match=message):
        choose_path(q, **kwargs)


def test_forced_triton_on_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        choose_path(torch.zeros(1, 1, 4, 4), path="triton")


@pytest.mark.parametrize(
    "scheme, left_pad, sinkhorn_iters",
    [("dnas", True, 1), ("dnas", False, 1), ("hnas", True, 1), ("hnas", False, 1), ("hnas", True, 3)],
)
def test_fairseq_module_on_the_triton_path(scheme, left_pad, sinkhorn_iters, monkeypatch):
    """FAIRSEQ_DNAS_ATTENTION_PATH=triton: the fairseq module's output equals the
    float64 reference, its gradients those of the materialized path, and
    need_weights still returns the probabilities."""
    monkeypatch.setenv(kernels.PATH_ENV, "triton")
    calls = []
    apply = long.TritonLongAttention.apply
    monkeypatch.setattr(long.TritonLongAttention, "apply", lambda *a: calls.append(1) or apply(*a))
    m = DNASMultiheadAttention(32, 2, scheme=scheme, hybrid_init=0.3, sinkhorn_iters=sinkhorn_iters)
    m = m.train().to(DEVICE)
    if m.hybrid_logit is not None:
        m.hybrid_logit.data = torch.tensor([-1.0, 1.5], device=DEVICE)
    x = torch.randn(T, 4, 32, device=DEVICE, requires_grad=True)
    mask = padding_mask(LENGTHS, T, left_pad).to(DEVICE)
    out, weights = m(x, x, x, key_padding_mask=mask, need_weights=True)
    assert calls, "the Triton kernels did not run"
    real = ~mask.T
    ref = reference_self_attention(m.cpu(), x.cpu(), mask.cpu())
    m.to(DEVICE)
    torch.testing.assert_close(out.double().cpu()[real.cpu()], ref[real.cpu()], atol=1e-5, rtol=0)
    probs = reference_probs(_module_scores(m, x), scheme, mask.cpu(), mask.cpu(),
                            None if m.hybrid_weight is None else m.hybrid_weight.detach().double().cpu(),
                            sinkhorn_iters)
    torch.testing.assert_close(weights.double().cpu(), probs.mean(dim=1), atol=1e-6, rtol=0)
    module_gradients_match_materialized(m, x, mask, out, monkeypatch)


def module_gradients_match_materialized(m, x, mask, out, monkeypatch):
    """The parameter gradients of sum(out^2) over the real positions equal
    those of the module on the materialized path."""
    real = ~mask.T
    out[real].pow(2).sum().backward()
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    monkeypatch.setenv(kernels.PATH_ENV, "materialized")
    out2, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    out2[real].pow(2).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=n)


def _module_scores(m, x):
    """float64 scores q . k of the module's own projections, (B, H, T, T)."""
    t, b, c = x.shape
    h, d = m.num_heads, m.head_dim
    xd = x.detach().double().cpu()

    def proj(lin):
        return xd @ lin.weight.detach().double().cpu().T + lin.bias.detach().double().cpu()

    q = (proj(m.q_proj) * m.scaling).view(t, b, h, d).permute(1, 2, 0, 3)
    k = proj(m.k_proj).view(t, b, h, d).permute(1, 2, 0, 3)
    return q @ k.transpose(-1, -2)


def test_module_dropout_follows_fairseq_training_rules(monkeypatch):
    """Attention dropout acts in training mode only (unless fairseq's
    apply_during_inference), inside the kernel."""
    monkeypatch.setenv(kernels.PATH_ENV, "triton")
    m = DNASMultiheadAttention(32, 2, dropout=0.3, scheme="dnas").to(DEVICE)
    x = torch.randn(T, 2, 32, device=DEVICE)
    m.eval()
    a, _ = m(x, x, x, need_weights=False)
    b, _ = m(x, x, x, need_weights=False)
    assert torch.equal(a, b)
    m.train()
    torch.manual_seed(3)
    c, _ = m(x, x, x, need_weights=False)
    torch.manual_seed(3)
    d, _ = m(x, x, x, need_weights=False)
    assert torch.equal(c, d) and not torch.allclose(a, c)  # torch.manual_seed replays the mask
    m.eval()
    m.dropout_module.apply_during_inference = True
    e, _ = m(x, x, x, need_weights=False)
    assert not torch.allclose(a, e)


def test_float32_products_follow_torchs_tf32_setting():
    """float32 inputs are multiplied exactly unless the user let torch's own
    float32 matmuls use TF32 (then the kernels do too); half inputs: tensor cores."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    try:
        matmul.allow_tf32 = False
        assert launch.precision(torch.float32) == "ieee"
        assert launch.precision(torch.float16) == "tf32"
        matmul.allow_tf32 = True
        assert launch.precision(torch.float32) == "tf32"
    finally:
        matmul.allow_tf32 = before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronization exists only with a GPU")
@pytest.mark.parametrize("need_weights", [False, True])
def test_no_host_synchronization_on_the_gpu(need_weights, monkeypatch):
    """The fairseq module, training with attention dropout, forward and
    backward: torch raises on any operation that waits for the GPU."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    m = DNASMultiheadAttention(64, 4, dropout=0.1, scheme="hnas").cuda().train()
    x = torch.randn(T, 4, 64, device="cuda", requires_grad=True)
    mask = padding_mask(LENGTHS, T, True).cuda()
    m(x, x, x, key_padding_mask=mask, need_weights=need_weights)  # warm-up: compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = m(x, x, x, key_padding_mask=mask, need_weights=need_weights)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)
