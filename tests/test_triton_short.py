"""Tier 1: the one-tile Triton kernels for short inputs
(``attention/triton_short.py``), their selection
(``FAIRSEQ_DNAS_TRITON_SHORT``, ``kernels.triton_kernels``) and their launches.

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(conftest sets TRITON_INTERPRET=1); the tile is the whole sequence (the next
power of two >= T, at least 16), so every length below is a ragged tile.
bfloat16 is left to the GPU and to the sm_90 compile (the interpreter's
bfloat16 tl.dot is wrong). On a GPU machine the same tests run the compiled
kernels.
"""

import subprocess
import sys

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_self_attention
from test_triton import _float64_autograd, module_gradients_match_materialized
from test_triton_v2 import (DEVICE, F16, F32, _check_against_float64, _inputs, _masks, check_bitwise_repeatable,
                            check_exactness, check_head_size, check_same_as_v1, check_strided_views)

from fairseq_dnas.attention import kernels, selfcheck
from fairseq_dnas.attention.launches import count_launches
from fairseq_dnas.modules import DNASMultiheadAttention

triton_flash = pytest.importorskip("fairseq_dnas.attention.triton_flash", reason="triton is not installed")
from fairseq_dnas.attention import triton_flash_v2, triton_short  # noqa: E402 (after the skip)

FIRST = "_short_forward_kernel"


def _float32_on_the_interpreter(monkeypatch):
    """float32 never runs the one-tile kernels on a GPU (they spill there:
    ``kernels.SHORT_MAX``); these tests drive float32 through them anyway."""
    for scheme in ("dnas", "hnas"):
        monkeypatch.setitem(kernels.SHORT_MAX, ("float32", 64, scheme), 128)


# --- exactness ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("p", [0.0, 0.25], ids=["no-dropout", "dropout"])
def test_forward_and_gradients_match_float64(scheme, dtype, p):
    """37 positions (a 64 tile), head size 20; at p = 0 the output is also far
    from plain softmax attention (``_check_against_float64``): the scheme ran."""
    check_exactness(triton_short, scheme, dtype, p)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("d", [64, 128])
def test_head_sizes_64_and_128(scheme, d):
    check_head_size(triton_short, scheme, d, heads=2)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_the_largest_tile(scheme):
    """T = 128 (the whole 128 x 128 block, nothing past T), right padding."""
    q, k, v, do, u = _inputs(F32, tq=128, tk=128, d=16, batch=2, heads=1)
    kmask, qmask = _masks(left=False, tq=128, tk=128, batch=2)
    _check_against_float64(triton_short, q, k, v, do, u, scheme, kmask, qmask, 0.1 if scheme == "hnas" else 0.0)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("tq,tk", [(19, 33), (33, 19)])
def test_strided_views_and_cross_attention(scheme, tq, tk):
    _, grads = check_strided_views(triton_short, scheme, tq, tk)
    assert (grads[0][1, :, (tq + 1) // 4:] == 0).all()  # padded queries get no gradient


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_one_query_and_one_key(scheme):
    """The smallest call (a 16 tile): softmax and DNAS both give weight 1."""
    q, k, v, do, u = _inputs(F32, tq=1, tk=1, d=16, batch=2, heads=2)
    out = triton_short.triton_attention(q, k, v, hybrid_weight=u if scheme == "hnas" else None)
    torch.testing.assert_close(out, v.detach(), atol=1e-6, rtol=0)
    dv, = torch.autograd.grad(out, v, do)
    torch.testing.assert_close(dv, do, atol=1e-6, rtol=0)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_short_equals_v1_for_the_same_dropout_seed(scheme):
    """The same mask (a function of (seed, b H + h, i, j // 16) only)."""
    check_same_as_v1(triton_short, scheme)


@pytest.mark.parametrize("deterministic", [True, False])
def test_bitwise_repeatable(deterministic):
    """No atomics (du's batch sum is torch's reduction)."""
    check_bitwise_repeatable(triton_short, deterministic)


def test_a_long_input_is_refused():
    q = torch.zeros(1, 1, 129, 16, device=DEVICE)
    with pytest.raises(ValueError, match="T_q, T_k <= 128"):
        triton_short.triton_attention(q, q, q)


# --- selection ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version,short,length,expect", [
    ("v2", None, 128, "v2-short"), ("v2", "auto", 129, "v2"), ("v2", "0", 20, "v2"), ("v1", "auto", 20, "v1"),
    ("v1", "1", 128, "v2-short"), ("v1", "1", 129, "v1"), (None, None, 20, "v1"),  # auto: v1, no short kernels
])
def test_selection_reads_both_variables(version, short, length, expect, monkeypatch):
    for name, value in ((kernels.KERNELS_ENV, version), (kernels.SHORT_ENV, short)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert kernels.triton_kernels(1, length, length, 64, F16) == expect
    assert kernels.triton_kernels(1, 20, length, 64, F16) == expect  # the longer of T_q, T_k decides
    assert kernels.triton_kernels(3, 20, 20, 64, F16) == "v1"  # Sinkhorn rounds: v1 only
    assert kernels.triton_kernels(1) in ("v1", "v2")  # unknown lengths: the long kernels
    long = "v1" if expect == "v1" or version in (None, "v1") else "v2"
    assert kernels.triton_kernels(1, length, length, 64, F32) == long  # float32 spills on sm_90: never
    modules = {"v1": triton_flash, "v2": triton_flash_v2, "v2-short": triton_short}
    assert kernels.triton_module(version=expect) is modules[expect]


@pytest.mark.parametrize("head_dim,scheme,longest", [(64, "dnas", 128), (64, "hnas", 64), (128, "dnas", 64),
                                                     (128, "hnas", 64)])
def test_the_longest_short_input_follows_the_compile_rule(head_dim, scheme, longest, monkeypatch):
    """The tiles that compile for sm_90 without spills (docs/performance.md):
    128 for DNAS at head size 64, else 64."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    monkeypatch.delenv(kernels.SHORT_ENV, raising=False)
    for dtype in (F16, torch.bfloat16):
        assert kernels.triton_kernels(1, longest, longest, head_dim, dtype, scheme) == "v2-short"
        assert kernels.triton_kernels(1, longest + 1, 8, head_dim, dtype, scheme) == "v2"


def test_a_bad_short_value_names_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(kernels.SHORT_ENV, "yes")
    with pytest.raises(ValueError, match=r"FAIRSEQ_DNAS_TRITON_SHORT='yes' .* auto, 0, 1"):
        kernels.triton_kernels()
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="auto, 0, 1"):
        kernels.attend(q, q, q, scheme="dnas", path="triton")


@pytest.mark.parametrize("length,first_kernel", [(128, FIRST), (129, "_column_kernel")])
def test_attend_runs_the_one_tile_kernels_up_to_128(length, first_kernel, monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    monkeypatch.delenv(kernels.SHORT_ENV, raising=False)
    q = torch.zeros(1, 1, length, 16, device=DEVICE, dtype=F16)
    seen = []
    monkeypatch.setattr(triton_flash_v2.triton_flash, "triton_attention",  # record the launch, run nothing
                        lambda *a, function=None, **kw: seen.append(function) or q)
    kernels.attend(q, q, q, scheme="dnas", path="triton")
    expect = triton_short.TritonShortAttention if first_kernel == FIRST else triton_flash_v2.TritonAttentionV2
    assert seen == [expect]


# --- launches per step ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("p", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_two_kernels_a_step(scheme, p, monkeypatch):
    """Every Triton launch and every torch operation that computes, forward
    and backward, through ``kernels.attend``: the two kernels, the seed draw
    with dropout and, for HNAS, dL/du's sum over the batch (issue 28's budget
    is 5)."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    monkeypatch.delenv(kernels.SHORT_ENV, raising=False)
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, d=16, batch=2, heads=1)
    kmask, _ = _masks(left=True, tq=20, tk=20, batch=2)
    with count_launches() as launches:
        out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=kmask,
                                hybrid_weight=u if scheme == "hnas" else None,
                                dropout=torch.nn.Dropout(p) if p > 0 else None, path="triton")
        torch.autograd.grad(out, (q, k, v, u) if scheme == "hnas" else (q, k, v), do)
    print(f"{scheme} p={p}: {launches.describe()}")
    assert launches.triton == [FIRST, "_short_backward_kernel"], launches.describe()
    assert launches.torch == (["randint"] if p > 0 else []) + (["sum"] if scheme == "hnas" else [])
    assert launches.total <= (3 if p > 0 else 2) + (scheme == "hnas")


# --- the self-check, the fallback, the check command and the fairseq module -------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_the_first_use_check_passes_the_one_tile_kernels(scheme):
    config = selfcheck.Config(DEVICE, F16, 64, scheme, True, 1, True, kernels="v2-short")
    assert selfcheck.sizes(config)["length"] <= 128
    result = selfcheck.compare(config, **selfcheck.sizes(config))
    assert result.ok, result.reason()


def test_disagreeing_one_tile_kernels_fall_back_with_a_warning(monkeypatch):
    """The auto path checks the one-tile kernels on first use (their own
    configuration, 'v2-short') and falls back when they disagree."""
    monkeypatch.setenv(kernels.KERNELS_ENV, "v2")
    monkeypatch.delenv(kernels.SHORT_ENV, raising=False)
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.setattr(kernels, "AUTO_TRITON_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(selfcheck, "CHECK_DEVICES", ("cuda", "cpu"))
    _float32_on_the_interpreter(monkeypatch)
    real = triton_short.triton_attention
    monkeypatch.setattr(triton_short, "triton_attention", lambda *a, **kw: real(*a, **kw) + 0.1)
    selfcheck.reset()
    try:
        q, k, v, do, u = _inputs(F32, tq=17, tk=17, d=16, batch=2, heads=1)
        with pytest.warns(selfcheck.TritonFallbackWarning, match="v2-short kernels"):
            out, _ = kernels.attend(q, k, v, scheme="dnas")
        ref, _ = _float64_autograd(q.cpu(), k.cpu(), v.cpu(), None, "dnas", None, None)
        torch.testing.assert_close(out.double().cpu(), ref.detach(), atol=1e-5, rtol=0)
        assert [c.kernels for c in selfcheck.verdicts()] == ["v2-short"]
    finally:
        selfcheck.reset()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU stand-in for the GPU run")
def test_the_check_command_runs_the_one_tile_kernels(monkeypatch):
    env = {**__import__("os").environ, kernels.KERNELS_ENV: "v2"}
    env.pop(kernels.SHORT_ENV, None)
    r = subprocess.run([sys.executable, "-m", "fairseq_dnas.check", "--interpret", "--dtypes", "float16",
                        "--heads", "64", "--sinkhorn", "1", "--schemes", "hnas", "--dropout", "on"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "v2-short for short inputs" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("hnas ")]
    assert [line.split()[5] for line in rows] == ["v2-short", "v2"], r.stdout
    assert all(line.endswith(" ok") for line in rows), r.stdout


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_fairseq_module_on_the_one_tile_kernels(scheme, monkeypatch):
    """The fairseq module with v2 selected and the triton path at T = 20:
    the one-tile kernels run; output equal to the float64 reference,
    parameter gradients equal to the materialized path's."""
    for name, value in ((kernels.PATH_ENV, "triton"), (kernels.KERNELS_ENV, "v2")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(kernels.SHORT_ENV, raising=False)
    _float32_on_the_interpreter(monkeypatch)
    m = DNASMultiheadAttention(32, 2, scheme=scheme, hybrid_init=0.3).train().to(DEVICE)
    x = torch.randn(20, 3, 32, device=DEVICE, requires_grad=True)
    mask = padding_mask((20, 9, 1), 20, True).to(DEVICE)
    with count_launches() as launches:
        out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    assert launches.triton == [FIRST], launches.describe()
    real = ~mask.T
    ref = reference_self_attention(m.cpu(), x.cpu(), mask.cpu())
    m.to(DEVICE)
    torch.testing.assert_close(out.double().cpu()[real.cpu()], ref[real.cpu()], atol=1e-5, rtol=0)
    module_gradients_match_materialized(m, x, mask, out, monkeypatch)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile and run the kernels")
@pytest.mark.full  # compiles 36 variants (about two minutes)
def test_one_tile_kernels_compile_for_sm90_without_spills():
    """The one-tile kernels compiled for an H100 as the JIT specializes a real
    call (benchmarks/triton_spills.py, which picks them through
    kernels.triton_kernels): at length 100 the 128 x 128 tile of DNAS at head
    size 64, at lengths 60 and 20 the 64 x 64 and 32 x 32 tiles of every scheme and head size;
    DNAS/HNAS x dropout 0/0.1, no register spills at all (--max-stack 0),
    no wgmma serialized by ptxas."""
    from test_triton_tiles import _compile

    short = "--kernels", "short_forward,short_backward", "--version", "v2", "--sinkhorn", "1", "--max-stack", "0"
    seen, summary = _compile("fp16:64,bf16:128", "--length", "100", *short)
    assert {(case, kernel) for case, kernel, _ in seen} == {("fp16:64", "short_forward"), ("fp16:64", "short_backward")}
    assert all("HYBRID=0" in flags for _, _, flags in seen) and len(seen) == 4, seen  # HNAS: 64 at most
    assert "0 with a stack" in summary and "0 with wgmma serialized by ptxas" in summary, summary
    for length in (60, 20):  # the 64 x 64 tile (wgmma) and the 32 x 32 one (mma.sync)
        seen, summary = _compile("fp16:64,bf16:128", "--length", str(length), *short)
        assert len(seen) == 16, seen  # 2 cases x 2 kernels x HYBRID x DROPOUT
        assert "0 with a stack" in summary and "0 with wgmma serialized by ptxas" in summary, summary
