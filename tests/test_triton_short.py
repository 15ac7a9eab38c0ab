"""Tier 1: the one-tile Triton kernels for short inputs
(``attention/triton/short.py``), their selection (``selection.py``:
``SHORT_MAX``, ``FAIRSEQ_DNAS_TRITON_SHORT``) and their launches.

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
from launches import count_launches
from test_triton import _float64_autograd, module_gradients_match_materialized

from fairseq_dnas.attention import kernels, selection, selfcheck
from fairseq_dnas.modules import DNASMultiheadAttention

short = pytest.importorskip("fairseq_dnas.attention.triton.short", reason="triton is not installed")
from fairseq_dnas.attention.triton import lean, long  # noqa: E402 (after the skip)
from triton_checks import (DEVICE, F16, F32, _inputs, _masks, check_against_float64,  # noqa: E402
                           check_bitwise_repeatable, check_exactness, check_head_size, check_same_as_long,
                           check_strided_views)

FIRST = "_short_forward_kernel"


def _float32_on_the_interpreter(monkeypatch):
    """float32 never runs the one-tile kernels on a GPU (they spill there:
    ``selection.SHORT_MAX``); these tests drive float32 through them anyway."""
    for scheme in ("dnas", "hnas"):
        monkeypatch.setitem(selection.SHORT_MAX, ("float32", 64, scheme), 128)


# --- exactness ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["float32", "float16"])
@pytest.mark.parametrize("p", [0.0, 0.25], ids=["no-dropout", "dropout"])
def test_forward_and_gradients_match_float64(scheme, dtype, p):
    """37 positions (a 64 tile), head size 20; at p = 0 the output is also far
    from plain softmax attention (``check_against_float64``): the scheme ran."""
    check_exactness(short, scheme, dtype, p)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("d", [64, 128])
def test_head_sizes_64_and_128(scheme, d):
    check_head_size(short, scheme, d, heads=2)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_the_largest_tile(scheme):
    """T = 128 (the whole 128 x 128 block, nothing past T), right padding."""
    q, k, v, do, u = _inputs(F32, tq=128, tk=128, d=16, batch=2, heads=1)
    kmask, qmask = _masks(left=False, tq=128, tk=128, batch=2)
    check_against_float64(short, q, k, v, do, u, scheme, kmask, qmask, 0.1 if scheme == "hnas" else 0.0)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("tq,tk", [(19, 33), (33, 19)])
def test_strided_views_and_cross_attention(scheme, tq, tk):
    _, grads = check_strided_views(short, scheme, tq, tk)
    assert (grads[0][1, :, (tq + 1) // 4:] == 0).all()  # padded queries get no gradient


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_one_query_and_one_key(scheme):
    """The smallest call (a 16 tile): softmax and DNAS both give weight 1.
    The weight is 1 only up to float32 rounding: on a GPU exp2/log2 are
    approximate (ex2.approx, lg2.approx: a few ulp each) and HNAS's
    u p_D + (1 - u) p_U adds roundings, so out = w v and dv = w do with
    |w - 1| of some ulp (the H100 gave |dv - do| = 1.43e-6, |do| <= 2.6 here:
    an absolute 1e-6 fails it). The tolerance is relative to each element,
    rtol 1e-5 (about 100 ulp of float32), plus 1e-6 absolute; a wrong kernel
    is off by a fraction of |v|, not 1e-5 of it (a dropped key: w = 0; HNAS
    without its UNAS part: w = u)."""
    q, k, v, do, u = _inputs(F32, tq=1, tk=1, d=16, batch=2, heads=2)
    out = short.triton_attention(q, k, v, hybrid_weight=u if scheme == "hnas" else None)
    torch.testing.assert_close(out, v.detach(), atol=1e-6, rtol=1e-5)
    dv, = torch.autograd.grad(out, v, do)
    torch.testing.assert_close(dv, do, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_short_equals_long_for_the_same_dropout_seed(scheme):
    """The same mask (a function of (seed, b H + h, i, j // 16) only)."""
    check_same_as_long(short, scheme)


@pytest.mark.parametrize("deterministic", [True, False])
def test_bitwise_repeatable(deterministic):
    """No atomics (du's batch sum is torch's reduction)."""
    check_bitwise_repeatable(short, deterministic)


def test_a_long_input_is_refused():
    q = torch.zeros(1, 1, 129, 16, device=DEVICE)
    with pytest.raises(ValueError, match="T_q, T_k <= 128"):
        short.triton_attention(q, q, q)


# --- selection ------------------------------------------------------------------------------------------------


class _FakeCuda:
    """Enough of a CUDA tensor for ``selection.choose`` (no GPU needed)."""

    def __init__(self, t=128, dtype=F16, d=64):
        self.device, self.dtype, self.shape = torch.device("cuda"), dtype, (2, 12, t, d)


@pytest.mark.parametrize("value,length,expect", [
    (None, 128, "short"), ("auto", 128, "short"), (None, 129, "lean"), ("0", 20, "lean"), ("", 20, "short"),
])
def test_selection_reads_the_variable(value, length, expect, monkeypatch):
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    if value is None:
        monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    else:
        monkeypatch.setenv(selection.SHORT_ENV, value)
    assert selection.kernel_set(1, length, length, 64, F16, "dnas") == expect
    assert selection.kernel_set(1, 20, length, 64, F16, "dnas") == expect  # the longer of T_q, T_k decides
    assert selection.kernel_set(3, 20, 20, 64, F16, "dnas") == "long"  # Sinkhorn rounds: long only
    assert selection.kernel_set(1, length, length, 64, F32, "dnas") == "long"  # float32 spills on sm_90: never
    assert selection.choose(_FakeCuda(length)) == selection.Choice("triton", expect)  # what auto runs on CUDA
    assert selection.choose(_FakeCuda(length), path="triton") == selection.Choice("triton", expect, forced=True)
    assert selection.attention_function(expect) is {"short": short, "lean": lean}[expect].triton_attention


def test_auto_runs_the_longer_kernels_where_short_does_not_apply(monkeypatch):
    """Half precision beyond the one-tile lengths: the lean kernels (selection.LEAN_CHOSEN, an H200's
    choice); Sinkhorn rounds and float32: the long ones."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    monkeypatch.delenv(selection.LEAN_ENV, raising=False)
    assert selection.choose(_FakeCuda(4096)) == selection.Choice("triton", "lean")
    assert selection.choose(_FakeCuda(20), sinkhorn_iters=3) == selection.Choice("triton", "long")
    assert selection.choose(_FakeCuda(20, dtype=F32)) == selection.Choice("triton", "long")
    assert selection.choose(_FakeCuda(129), scheme="hnas") == selection.Choice("triton", "lean")
    assert selection.choose(_FakeCuda(20), need_weights=True) == selection.Choice("dense")


@pytest.mark.parametrize("head_dim,scheme,longest", [(64, "dnas", 128), (64, "hnas", 128), (128, "dnas", 128),
                                                     (128, "hnas", 128)])
def test_the_longest_short_input_is_one_tile(head_dim, scheme, longest, monkeypatch):
    """Half precision runs the one-tile kernels up to their largest tile,
    128, for both schemes and head sizes (``selection.SHORT_MAX``: the H100
    timed them faster than the long kernels there); one more position runs
    the lean kernels (selection.LEAN_CHOSEN)."""
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    monkeypatch.delenv(selection.LEAN_ENV, raising=False)
    for dtype in (F16, torch.bfloat16):
        assert selection.kernel_set(1, longest, longest, head_dim, dtype, scheme) == "short"
        assert selection.kernel_set(1, longest + 1, 8, head_dim, dtype, scheme) == "lean"


def test_an_edited_short_max_takes_effect(monkeypatch):
    """SHORT_MAX is the one table to edit: HNAS at head size 64 set to 64
    sends T = 100 to the lean kernels and keeps T = 64 on the one-tile ones
    (auto and the check command's list alike), and the first-use check sizes
    its input to the new limit."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    assert selection.choose(_FakeCuda(100), scheme="hnas") == selection.Choice("triton", "short")
    config = selfcheck.Config("cuda", F16, 64, "hnas", False, 1, True, kernels="short")
    assert selfcheck.sizes(config)["length"] == 100  # a ragged 128 tile
    monkeypatch.setitem(selection.SHORT_MAX, ("half", 64, "hnas"), 64)
    assert selection.choose(_FakeCuda(100), scheme="hnas").kernels == "lean"
    assert selection.choose(_FakeCuda(64), scheme="hnas") == selection.Choice("triton", "short")
    assert selection.kernel_sets(1, 64, F16, "hnas") == ("short", "lean")
    assert selfcheck.sizes(config)["length"] == 50  # a ragged 64 tile


def test_a_bad_short_value_names_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(selection.SHORT_ENV, "1")
    with pytest.raises(ValueError, match=r"FAIRSEQ_DNAS_TRITON_SHORT='1' .* auto, 0"):
        selection.kernel_set(1, 20, 20, 64, F16, "dnas")
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="auto, 0"):
        kernels.attend(q, q, q, scheme="dnas", path="triton")


@pytest.mark.parametrize("length,first_kernel", [(128, FIRST), (129, "lean")])
def test_attend_runs_the_one_tile_kernels_up_to_128(length, first_kernel, monkeypatch):
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    monkeypatch.delenv(selection.LEAN_ENV, raising=False)
    q = torch.zeros(1, 1, length, 16, device=DEVICE, dtype=F16)
    seen = []
    for module in (short, long, lean):  # record the call, run nothing
        monkeypatch.setattr(module, "triton_attention", lambda *a, module=module, **kw: seen.append(module) or q)
    kernels.attend(q, q, q, scheme="dnas", path="triton")
    assert seen == [short if first_kernel == FIRST else lean]


# --- launches per step ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
@pytest.mark.parametrize("p", [0.0, 0.1], ids=["no-dropout", "dropout"])
def test_two_kernels_a_step(scheme, p, monkeypatch):
    """Every Triton launch and every torch operation that computes, forward
    and backward, through ``kernels.attend``: the two kernels, the seed draw
    with dropout and, for HNAS, dL/du's sum over the batch (the budget is 5)."""
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
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


# Triton launches + computing torch operations of long.py's kernels per step (recorded in docs/performance.md).
LONG_LAUNCHES = {"dnas": 12, "hnas": 13}


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_long_launches_a_step(scheme, monkeypatch):
    """The same count for long.py's kernels (FAIRSEQ_DNAS_TRITON_SHORT=0),
    five kernels and the torch operations around them."""
    monkeypatch.setenv(selection.SHORT_ENV, "0")
    q, k, v, do, u = _inputs(F32, tq=20, tk=20, d=16, batch=2, heads=1)
    kmask, _ = _masks(left=True, tq=20, tk=20, batch=2)
    with count_launches() as launches:
        out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=kmask,
                                hybrid_weight=u if scheme == "hnas" else None, path="triton")
        torch.autograd.grad(out, (q, k, v, u) if scheme == "hnas" else (q, k, v), do)
    assert launches.triton[0] == "_column_lse_kernel" and len(launches.triton) == 5, launches.describe()
    assert launches.total == LONG_LAUNCHES[scheme], launches.describe()


def test_counting_sees_torch_operations_and_not_views():
    x = torch.ones(4, 4)
    with count_launches() as launches:
        y = x.reshape(16)[:3].unsqueeze(0).expand(2, 3)  # views: free
        torch.empty(3)  # an allocation: free
        z = torch.zeros(3) + y  # a fill and an add
        z.sum()
        x.t().contiguous()  # a copy
    assert launches.torch == ["zeros", "add", "sum", "clone"]


# --- the self-check, the fallback, the check command and the fairseq module -------------------------------------


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_the_first_use_check_passes_the_one_tile_kernels(scheme):
    config = selfcheck.Config(DEVICE, F16, 64, scheme, True, 1, True, kernels="short")
    assert selfcheck.sizes(config)["length"] <= 128
    result = selfcheck.compare(config, short.triton_attention, **selfcheck.sizes(config))
    assert result.ok, result.reason()


def test_disagreeing_one_tile_kernels_fall_back_with_a_warning(monkeypatch, auto_triton_on_cpu):
    """The auto path checks the one-tile kernels on first use (their own
    configuration, 'short') and falls back when they disagree."""
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.delenv(selfcheck.CHECK_ENV, raising=False)
    _float32_on_the_interpreter(monkeypatch)
    real = short.triton_attention
    monkeypatch.setattr(short, "triton_attention", lambda *a, **kw: real(*a, **kw) + 0.1)
    q, k, v, do, u = _inputs(F32, tq=17, tk=17, d=16, batch=2, heads=1)
    with pytest.warns(selfcheck.TritonFallbackWarning, match="short kernels"):
        out, _ = kernels.attend(q, k, v, scheme="dnas")
    ref, _ = _float64_autograd(q.cpu(), k.cpu(), v.cpu(), None, "dnas", None, None)
    torch.testing.assert_close(out.double().cpu(), ref.detach(), atol=1e-5, rtol=0)
    assert [c.kernels for c in auto_triton_on_cpu] == ["short"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU stand-in for the GPU run")
def test_the_check_command_runs_the_one_tile_kernels(monkeypatch):
    env = dict(__import__("os").environ)
    env.pop(selection.SHORT_ENV, None)
    r = subprocess.run([sys.executable, "-m", "fairseq_dnas.check", "--interpret", "--dtypes", "float16",
                        "--heads", "64", "--sinkhorn", "1", "--schemes", "hnas", "--dropout", "on"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kernels: short for inputs up to" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("hnas ")]
    assert [line.split()[5] for line in rows] == ["short", "lean"], r.stdout
    assert all(line.endswith(" ok") for line in rows), r.stdout


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_fairseq_module_on_the_one_tile_kernels(scheme, monkeypatch):
    """The fairseq module on the triton path at T = 20: the one-tile kernels
    run; output equal to the float64 reference, parameter gradients equal
    to the materialized path's."""
    monkeypatch.setenv(kernels.PATH_ENV, "triton")
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
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
@pytest.mark.full  # compiles 44 variants (about two minutes)
def test_one_tile_kernels_compile_for_sm90_without_spills():
    """The one-tile kernels compiled for an H100 as the JIT specializes a real
    call (benchmarks/triton_spills.py, which picks them through
    selection.kernel_set): at length 100 the 128 x 128 tile of every scheme
    and head size compiles, and DNAS at head size 64 has no register spills
    there (HNAS and head size 128 spill at this tile on sm_90, and run it
    anyway: the H100 timed them faster than the long kernels,
    docs/results/2026-11-27-h100-one-tile-defaults.md); at lengths 60 and 20
    the 64 x 64 and 32 x 32 tiles of every scheme and head size; DNAS/HNAS x
    dropout 0/0.1, no register spills at all there (--max-stack 0), no wgmma
    serialized by ptxas."""
    from test_triton_tiles import _compile

    short = "--kernels", "short_forward,short_backward", "--sinkhorn", "1"
    seen, summary = _compile("fp16:64", "--length", "100", "--where", "HYBRID=0", *short, "--max-stack", "0")
    assert {(case, kernel) for case, kernel, _ in seen} == {("fp16:64", "short_forward"), ("fp16:64", "short_backward")}
    assert len(seen) == 4 and "0 with a stack" in summary, (seen, summary)
    seen, summary = _compile("fp16:64,bf16:128", "--length", "100", *short, "--max-stack", "100000")
    assert len(seen) == 16, seen  # 2 cases x 2 kernels x HYBRID x DROPOUT: all one-tile at 128
    short = (*short, "--max-stack", "0")
    for length in (60, 20):  # the 64 x 64 tile (wgmma) and the 32 x 32 one (mma.sync)
        seen, summary = _compile("fp16:64,bf16:128", "--length", str(length), *short)
        assert len(seen) == 16, seen  # 2 cases x 2 kernels x HYBRID x DROPOUT
        assert "0 with a stack" in summary and "0 with wgmma serialized by ptxas" in summary, summary
