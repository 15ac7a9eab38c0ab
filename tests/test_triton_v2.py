"""Tier 1: the v2 Triton kernels (``attention/triton_flash_v2.py``), their
selection (``FAIRSEQ_DNAS_TRITON_KERNELS``) and their launch budget.

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(conftest sets TRITON_INTERPRET=1; 16 x 16 tiles, so the lengths below span
several tiles and ragged tails). bfloat16 is left to the GPU and to the sm_90
compile (the interpreter's bfloat16 tl.dot is wrong). On a GPU machine the
same tests run the compiled kernels.
"""

import subprocess
import sys
import warnings

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_self_attention
from test_triton import TOL, _float64_autograd, _grad_tol, module_gradients_match_materialized

from fairseq_dnas.attention import kernels, selfcheck, triton_common
from fairseq_dnas.attention.launches import count_launches
from fairseq_dnas.modules import DNASMultiheadAttention

triton_flash = pytest.importorskip("fairseq_dnas.attention.triton_flash", reason="triton is not installed")
from fairseq_dnas.attention import triton_flash_v2  # noqa: E402 (after the skip)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, F16 = torch.float32, torch.float16
LENGTHS = (37, 20, 1)  # a one-token sentence: its only key is its only query
V2_BUDGET = 5  # launches per forward + backward step (issue 28)


@pytest.fixture(autouse=True)
def _long_kernels_at_every_length(monkeypatch):
    """These tests hold triton_flash_v2's kernels; short inputs would otherwise
    run the one-tile kernels (tests/test_triton_short.py)."""
    monkeypatch.setenv(kernels.SHORT_ENV, "0")


def _inputs(dtype, tq=37, tk=37, d=20, batch=3, heads=1, seed=0, mean=0.7):
    """q (with a mean query away from 0: the q_proj bias that centring is for),
    k, v, an upstream gradient and u."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.5 * (20 / d) ** 0.25
    q = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64) * scale + mean
    k = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64) * scale
    v = torch.randn(batch, heads, tk, d, generator=g, dtype=torch.float64)
    do = torch.randn(batch, heads, tq, d, generator=g, dtype=torch.float64)
    q, k, v = (x.to(DEVICE, dtype).requires_grad_() for x in (q, k, v))
    u = torch.linspace(0.2, 0.8, heads, device=DEVICE).requires_grad_()
    return q, k, v, do.to(DEVICE, dtype), u


def _masks(left, tq=37, tk=37, batch=3):
    lengths_q = [min(n, tq) for n in LENGTHS][:batch]
    lengths_k = [min(n, tk) for n in LENGTHS][:batch]
    return padding_mask(lengths_k, tk, left).to(DEVICE), padding_mask(lengths_q, tq, left).to(DEVICE)


def _check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, p=0.0, seed=None):
    """Output and gradients of ``module``'s kernels against the float64 autograd
    of the materialized math, with the kernels' own dropout mask."""
    seed = torch.tensor([20201], dtype=torch.int64, device=DEVICE) if seed is None else seed
    hybrid = u if scheme == "hnas" else None
    out = module.triton_attention(q, k, v, hybrid_weight=hybrid, key_padding_mask=kmask, query_padding_mask=qmask,
                                  dropout_p=p, seed=seed)
    inputs = (q, k, v) if hybrid is None else (q, k, v, u)
    grads = torch.autograd.grad(out, inputs, do)
    keep = triton_flash.dropout_mask(seed, tuple(q.shape[:3]) + (k.shape[2],), p).cpu() if p > 0 else None
    ref, ref_inputs = _float64_autograd(*(x.cpu() for x in (q, k, v)), None if hybrid is None else u.cpu(), scheme,
                                        None if kmask is None else kmask.cpu(),
                                        None if qmask is None else qmask.cpu(), keep, p)
    ref_grads = torch.autograd.grad(ref, ref_inputs, do.cpu().double())
    tol = TOL[q.dtype]
    torch.testing.assert_close(out.detach().double().cpu(), ref.detach(), atol=tol, rtol=0)
    if p == 0:  # the scheme ran, not plain softmax: softmax attention is far from the output
        s = q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2)
        if kmask is not None:
            s = s.masked_fill(kmask.cpu()[:, None, None, :], float("-inf"))
        softmax_out = s.softmax(-1) @ v.detach().double().cpu()
        real = torch.ones(q.shape[:3], dtype=torch.bool) if qmask is None else ~qmask.cpu()[:, None, :]
        gap = (out.detach().double().cpu() - softmax_out).abs().amax(-1)[real.expand(q.shape[:3])].max()
        assert gap > 20 * tol, f"v2's output is within {gap:.2e} of plain softmax attention"
    for name, a, b in zip(("dq", "dk", "dv", "du"), grads, ref_grads):
        assert a.dtype == inputs[("dq", "dk", "dv", "du").index(name)].dtype, name
        torch.testing.assert_close(a.double().cpu(), b, atol=_grad_tol(b, tol), rtol=0, msg=name)
    return out, grads


# --- selection ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value,expect", [(None, "v1"), ("auto", "v1"), ("v1", "v1"), ("v2", "v2")])
def test_kernel_selection_reads_the_variable(value, expect, monkeypatch):
    if value is None:
        monkeypatch.delenv(kernels.KERNELS_ENV, raising=False)
    else:
        monkeypatch.setenv(kernels.KERNELS_ENV, value)
    assert kernels.triton_kernels() == expect
    assert kernels.triton_kernels(sinkhorn_iters=3) == "v1"  # only v1 has the Sinkhorn rounds
    assert kernels.triton_module() is (triton_flash_v2 if expect == "v2" else triton_flash)


def test_a_bad_kernel_version_names_the_allowed_values(monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, "v3")
    with pytest.raises(ValueError, match=r"FAIRSEQ_DNAS_TRITON_KERNELS='v3' .* auto, v1, v2"):
        kernels.triton_kernels()
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="auto, v1, v2"):
        kernels.attend(q, q, q, scheme="dnas", path="triton")


@pytest.mark.parametrize("version,first_kernel", [("v1", "_column_lse_kernel"), ("v2", "_column_kernel")])
def test_attend_runs_the_selected_kernels(version, first_kernel, monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, version)
    q, k, v, do, u = _inputs(F32, tq=17, tk=17, d=16, batch=1, heads=1)
    with count_launches() as launches:
        kernels.attend(q, k, v, scheme="dnas", path="triton")
    assert launches.triton[0] == first_kernel


# --- exactness ------------------------------------------------------------------------------------------------


# The bodies are shared with tests/test_triton_short.py (the one-tile kernels), which runs them on its module.


def check_exactness(module, scheme, dtype, p):
    """37 positions, head size 20, left padding with a one-token sentence, a
    mean query far from 0, dropout with v1's mask for the same seed."""
    q, k, v, do, u = _inputs(dtype)
    kmask, qmask = _masks(left=True)
    _check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, p)


def check_head_size(module, scheme, d, heads=1):
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, d=d, batch=2, heads=heads)
    kmask, qmask = _masks(left=False, tq=20, tk=20, batch=2)
    _check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask, 0.25 if d == 64 else 0.0)


def check_strided_views(module, scheme, tq=19, tk=33):
    """q, k, v as views of packed projections in fairseq's (T, B, H, D) order,
    v with a transposed head dimension; T_q != T_k with separate masks.
    Returns the output and the gradients."""
    g = torch.Generator().manual_seed(3)
    bsz, heads, d = 2, 2, 16
    packed_q = (torch.randn(tq, bsz, heads, d, generator=g) + 0.5).to(DEVICE)
    packed_kv = torch.randn(tk, bsz, 2, heads, d, generator=g).to(DEVICE)
    q = packed_q.permute(1, 2, 0, 3).requires_grad_()
    kv = packed_kv.permute(1, 2, 3, 0, 4).requires_grad_()  # (B, 2, H, T, D)
    k, v = kv[:, 0], kv[:, 1].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not q.is_contiguous() and not k.is_contiguous() and v.stride(-1) != 1
    do = torch.randn(bsz, heads, tq, d, generator=g).to(DEVICE)
    u = torch.tensor([0.3, 0.7], device=DEVICE, requires_grad=True)
    real_q = (tq + 1) // 4
    kmask = padding_mask([tk, tk * 4 // 11], tk, False).to(DEVICE)
    qmask = padding_mask([tq, real_q], tq, False).to(DEVICE)
    out, grads = _check_against_float64(module, q, k, v, do, u, scheme, kmask, qmask)
    assert (out[1, :, real_q:] == 0).all()  # padded queries give 0
    return out, grads


def check_same_as_v1(module, scheme):
    """The same output and gradients as v1 for the same dropout seed (the same mask)."""
    q, k, v, do, u = _inputs(F32, tq=20, tk=20, batch=2, heads=2)
    kmask, qmask = _masks(left=False, tq=20, tk=20, batch=2)
    seed = torch.tensor([7], dtype=torch.int64, device=DEVICE)
    inputs = (q, k, v, u) if scheme == "hnas" else (q, k, v)
    results = []
    for kernels_module in (triton_flash, module):
        out = kernels_module.triton_attention(q, k, v, hybrid_weight=u if scheme == "hnas" else None,
                                              key_padding_mask=kmask, query_padding_mask=qmask, dropout_p=0.3,
                                              seed=seed)
        results.append((out, *torch.autograd.grad(out, inputs, do)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=_grad_tol(b.detach()), rtol=0)


def check_bitwise_repeatable(module, deterministic):
    """The same bits every run, with and without torch.use_deterministic_algorithms."""
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, batch=2, heads=2)
    kmask, qmask = _masks(left=True, tq=20, tk=20, batch=2)
    seed = torch.tensor([11], dtype=torch.int64, device=DEVICE)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        runs = []
        for _ in range(2):
            out = module.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=kmask,
                                          query_padding_mask=qmask, dropout_p=0.2, seed=seed)
            runs.append((out, *torch.autograd.grad(out, (q, k, v, u), do)))
    finally:
        torch.use_deterministic_algorithms(before)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("p", [0.0, 0.25], ids=["no-dropout", "dropout"])
def test_forward_and_gradients_match_float64(scheme, dtype, p):
    check_exactness(triton_flash_v2, scheme, dtype, p)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("d", [64, 128])
def test_head_sizes_64_and_128(scheme, d):
    check_head_size(triton_flash_v2, scheme, d)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_strided_views_and_cross_attention(scheme):
    check_strided_views(triton_flash_v2, scheme)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_v2_equals_v1_for_the_same_dropout_seed(scheme):
    check_same_as_v1(triton_flash_v2, scheme)


@pytest.mark.parametrize("deterministic", [True, False])
def test_bitwise_repeatable(deterministic):
    """No atomics: there is no other variant to select."""
    check_bitwise_repeatable(triton_flash_v2, deterministic)


# --- HNAS: pi_U from pi_D with a guarded exponent (docs/math.md#hnas-pi_u-from-pi_d) --------------------------


def _far_column_inputs():
    """HNAS inputs (float32, 2 sentences of 20, the second right-padded to 13)
    where p_D underflows while p_U counts: query I1 = 11 e_0 meets key J0 =
    10 e_0 with score 110 (every other key has k[0] = 0, so I1's other scores
    are 0), which puts J0's column normalizer 110 nats above the scores of
    query I0 (I0's score with J0 is 0: q[0] = 0). Then p_D[I0, J0] = e^-110
    r_d < 2^-149 is 0 in float32 while p_U[I0, J0] is about 1 / T, and
    2^(c2 + r_d - r_u) is about 2^150, past float32: the programs that meet
    (I0, J0) must take p_U directly (a guard of 60), the others may take the
    product. Exact products, so that float32 sees the same scores as float64."""
    q, k, v, do, u = _inputs(F32, tq=20, tk=20, d=16, batch=2, heads=1, seed=5, mean=0.0)
    i0, i1, j0 = 9, 3, 5
    with torch.no_grad():
        q.mul_(0.5)
        k.mul_(0.5)
        k[..., 0] = 0.0
        k[:, :, j0] = 0.0
        k[:, :, j0, 0] = 10.0
        q[:, :, i1] = 0.0
        q[:, :, i1, 0] = 11.0
        q[:, :, i0, 0] = 0.0
    kmask = padding_mask([20, 13], 20, False).to(DEVICE)
    return (q, k, v, do, u), (kmask, kmask)


@pytest.fixture(params=["forward", "backward_kv", "backward_q"])
def pu_kernel(request, monkeypatch):
    """pi_U from pi_D in one kernel (whether v2 enables it there or not), the
    others direct: each kernel's product and guard tested on its own."""
    monkeypatch.setattr(triton_flash_v2, "PU_FROM_PD", {k: True if k == request.param else set()
                                                       for k in triton_flash_v2.PU_FROM_PD})
    return request.param


def _hnas(q, k, v, do, u, kmask, qmask):
    """Output and (dq, dk, dv, du) of the v2 kernels."""
    out = triton_flash_v2.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=kmask, query_padding_mask=qmask)
    return tuple(x.detach() for x in (out, *torch.autograd.grad(out, (q, k, v, u), do)))


def test_pu_from_pd_fast_path_matches_float64(pu_kernel, monkeypatch):
    """Ordinary scores: the kernel takes p_U = p_D times a row and a key
    factor. Exact against float64 with padding (left, a one-token sentence),
    and not the bits of the direct p_U (guard -inf: every program direct), so
    the products ran."""
    q, k, v, do, u = _inputs(F32, tq=20, tk=20, d=16, batch=3, heads=1)
    kmask, qmask = _masks(left=True, tq=20, tk=20, batch=3)
    _check_against_float64(triton_flash_v2, q, k, v, do, u, "hnas", kmask, qmask)
    product = _hnas(q, k, v, do, u, kmask, qmask)
    monkeypatch.setattr(triton_flash, "PU_GUARD", float("-inf"))
    direct = _hnas(q, k, v, do, u, kmask, qmask)
    for a, b in zip(product, direct):
        torch.testing.assert_close(a, b, atol=_grad_tol(b), rtol=0)
    assert not all(torch.equal(a, b) for a, b in zip(product, direct)), "every program took the direct p_U"


def test_pu_from_pd_fallback_matches_float64(pu_kernel, monkeypatch):
    """p_D underflows where p_U is about 1 / T (``_far_column_inputs``): the
    guarded kernel matches float64, forward and gradients, with padding; the
    same kernel without the guard (PU_GUARD = inf: always the product) does
    not, so the fallback ran."""
    (q, k, v, do, u), (kmask, qmask) = _far_column_inputs()
    _check_against_float64(triton_flash_v2, q, k, v, do, u, "hnas", kmask, qmask)
    guarded = _hnas(q, k, v, do, u, kmask, qmask)
    monkeypatch.setattr(triton_flash, "PU_GUARD", float("inf"))
    with warnings.catch_warnings():  # the interpreter's numpy: 2^150 overflows, 0 * inf
        warnings.simplefilter("ignore", RuntimeWarning)
        unguarded = _hnas(q, k, v, do, u, kmask, qmask)
    error = max(float((a - b).abs().nan_to_num(float("inf")).amax()) for a, b in zip(unguarded, guarded))
    assert error > 1e-3, f"the unguarded product is within {error:.1e} of the guarded kernels"


# --- launches per step ----------------------------------------------------------------------------------------


def _step_launches(module, scheme, p, t):
    q, k, v, do, u = _inputs(F32, tq=t, tk=t, d=16, batch=2, heads=1)
    kmask, qmask = _masks(left=True, tq=t, tk=t, batch=2)
    dropout = torch.nn.Dropout(p)
    with count_launches() as launches:
        out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=kmask, hybrid_weight=u if scheme == "hnas" else None,
                                dropout=dropout if p > 0 else None, path="triton")
        torch.autograd.grad(out, (q, k, v, u) if scheme == "hnas" else (q, k, v), do)
    return launches


# v1's count (Triton launches + computing torch operations) per step, recorded here and in docs/performance.md.
V1_LAUNCHES = {"dnas": 12, "hnas": 13}


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("p", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("t", [20, 129], ids=["short", "long"])
def test_v2_launches_at_most_five_per_step(scheme, p, t, monkeypatch):
    """Every Triton launch and every torch operation that computes, in the
    forward and backward of the attention (``launches.count_launches``)."""
    if t > 128:  # the count does not depend on the tiles: larger ones keep the interpreter fast
        monkeypatch.setattr(triton_common, "INTERPRETER_TILES", dict.fromkeys(triton_common.INTERPRETER_TILES,
                                                                              (64, 64, 1)))
    counts = {}
    for version, module in (("v1", triton_flash), ("v2", triton_flash_v2)):
        monkeypatch.setenv(kernels.KERNELS_ENV, version)
        counts[version] = _step_launches(module, scheme, p, t)
        print(f"{scheme} p={p} T={t} {version}: {counts[version].describe()}")
    assert counts["v1"].total == V1_LAUNCHES[scheme]
    assert counts["v2"].total <= V2_BUDGET, counts["v2"].describe()
    assert counts["v2"].torch == (["randint"] if p > 0 else [])  # the seed draw, on the device (no host sync)
    assert len(counts["v2"].triton) == 4


def test_counting_sees_torch_operations_and_not_views():
    x = torch.ones(4, 4)
    with count_launches() as launches:
        y = x.reshape(16)[:3].unsqueeze(0).expand(2, 3)  # views: free
        torch.empty(3)  # an allocation: free
        z = torch.zeros(3) + y  # a fill and an add
        z.sum()
        x.t().contiguous()  # a copy
    assert launches.torch == ["zeros", "add", "sum", "clone"]


# --- the self-check, the fallback and the check command ---------------------------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("dropout", [False, True])
def test_the_first_use_check_passes_v2(scheme, dropout):
    config = selfcheck.Config(DEVICE, F16, 64, scheme, dropout, 1, True, kernels="v2")
    result = selfcheck.compare(config, **selfcheck.INTERPRETER_SIZES)
    assert result.ok, result.reason()


def test_disagreeing_v2_kernels_fall_back_with_a_warning(monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.setattr(kernels, "AUTO_TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(selfcheck, "CHECK_DEVICES", ("cuda", "cpu"))
    real = triton_flash_v2.triton_attention
    monkeypatch.setattr(triton_flash_v2, "triton_attention", lambda *a, **kw: real(*a, **kw) + 0.1)
    selfcheck.reset()
    try:
        q, k, v, do, u = _inputs(F32, tq=17, tk=17, d=16, batch=2, heads=1)
        with pytest.warns(selfcheck.TritonFallbackWarning, match="v2 kernels"):
            out, _ = kernels.attend(q, k, v, scheme="dnas")
        ref, _ = _float64_autograd(q.cpu(), k.cpu(), v.cpu(), None, "dnas", None, None)
        torch.testing.assert_close(out.double().cpu(), ref.detach(), atol=1e-5, rtol=0)
    finally:
        selfcheck.reset()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU stand-in for the GPU run")
def test_the_check_command_runs_v2():
    env = {**__import__("os").environ, kernels.KERNELS_ENV: "v2"}
    r = subprocess.run([sys.executable, "-m", "fairseq_dnas.check", "--interpret", "--dtypes", "float16",
                        "--heads", "64", "--sinkhorn", "1,3"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernels: v2" in r.stdout
    assert r.stdout.count(" ok") == 8  # dnas, hnas x dropout off, on x sinkhorn 1 (v2), 3 (v1)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_fairseq_module_on_the_v2_kernels(scheme, monkeypatch):
    """The fairseq module with FAIRSEQ_DNAS_TRITON_KERNELS=v2 and the triton path:
    output equal to the float64 reference, parameter gradients equal to the
    materialized path's."""
    for name, value in ((kernels.PATH_ENV, "triton"), (kernels.KERNELS_ENV, "v2")):
        monkeypatch.setenv(name, value)
    m = DNASMultiheadAttention(32, 2, scheme=scheme, hybrid_init=0.3).train().to(DEVICE)
    x = torch.randn(20, 3, 32, device=DEVICE, requires_grad=True)
    mask = padding_mask((20, 9, 1), 20, True).to(DEVICE)
    with count_launches() as launches:
        out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    assert launches.triton[0] == "_column_kernel", launches.describe()  # v2's first kernel
    real = ~mask.T
    ref = reference_self_attention(m.cpu(), x.cpu(), mask.cpu())
    m.to(DEVICE)
    torch.testing.assert_close(out.double().cpu()[real.cpu()], ref[real.cpu()], atol=1e-5, rtol=0)
    module_gradients_match_materialized(m, x, mask, out, monkeypatch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronization exists only with a GPU")
def test_no_host_synchronization_on_the_gpu(monkeypatch):
    """The v2 kernels through the fairseq module, training with attention
    dropout: torch raises on any operation that waits for the GPU. (On CPU the
    launch count above shows no `_local_scalar_dense`, the op behind .item().)"""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    m = DNASMultiheadAttention(64, 4, dropout=0.1, scheme="hnas").cuda().train()
    x = torch.randn(37, 4, 64, device="cuda", requires_grad=True)
    mask = padding_mask((37, 20, 1, 30), 37, True).cuda()
    m(x, x, x, key_padding_mask=mask)  # warm-up: compiles the kernels, runs the first-use check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, _ = m(x, x, x, key_padding_mask=mask)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile and run the kernels")
@pytest.mark.full  # compiles every v2 variant (about 30 s)
def test_v2_compiles_for_sm90_within_the_tile_rule():
    """Every v2 kernel variant (DNAS/HNAS x dropout 0/0.1, fp16, head size 64)
    compiled for an H100 as the JIT specializes a real call: the interpreter
    runs code the compiler rejects. Within the tile rule (at most 64 bytes of
    spills: triton_spills.py's exit status) and no wgmma serialized by ptxas."""
    from test_triton_tiles import _compile

    seen, summary = _compile("fp16:64", "--version", "v2", "--short", "0", "--sinkhorn", "1")  # the long kernels
    assert {kernel for _, kernel, _ in seen} == {"column", "forward", "backward_kv", "backward_q"}
    assert len(seen) == 13, seen  # column once, the other three in 4 variants each
    assert "0 with wgmma serialized by ptxas" in summary, summary
