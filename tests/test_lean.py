"""Tier 1: the lean Triton kernels (``attention/triton/lean.py``) against the
float64 reference, their selection (``FAIRSEQ_DNAS_TRITON_LEAN``,
``LEAN_CHOSEN``, deterministic algorithms), their launches, and
``benchmarks/gpu_lean.py``.

Without a GPU the kernels run on CPU tensors under Triton's interpreter
(conftest sets TRITON_INTERPRET=1; 16 x 16 tiles, so T = 37 spans three tiles,
the last ragged). bfloat16 is left to the GPU (the interpreter's bfloat16
``tl.dot`` is wrong) and to the sm_90 compile. The default tier holds one
representative of each property; the full tier repeats them over every
scheme, dtype, dropout and more random shapes.
"""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, padding_mask
from launches import count_launches

from fairseq_dnas.attention import kernels, selection, selfcheck

lean = pytest.importorskip("fairseq_dnas.attention.triton.lean", reason="triton is not installed")
from fairseq_dnas.attention.triton import long  # noqa: E402 (after the skip)
from triton_checks import (DEVICE, F16, F32, _inputs, _masks, check_against_float64,  # noqa: E402
                           check_exactness, check_head_size, check_same_as_long, check_strided_views)

BACKWARD = "_lean_backward_kernel"


def _param(*values, full=False):
    return pytest.param(*values, marks=pytest.mark.full) if full else pytest.param(*values)


# --- exactness against float64 ------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme,dtype,p", [
    _param("dnas", F32, 0.0), _param("hnas", F16, 0.25), _param("dnas", F16, 0.1), _param("hnas", F32, 0.0, full=True),
    _param("dnas", F32, 0.25, full=True), _param("hnas", F32, 0.25, full=True),
    _param("dnas", F16, 0.0, full=True), _param("hnas", F16, 0.0, full=True),
], ids=lambda x: str(x).replace("torch.", ""))
def test_forward_and_gradients_match_float64(scheme, dtype, p):
    """37 positions (three tiles, the last ragged), head size 20, left padding
    with a one-token sentence, a mean query far from 0 (what dk's centring
    is for); dropout with the kernels' own mask (the same for every set);
    at p = 0 the output is also far from plain softmax attention."""
    check_exactness(lean, scheme, dtype, p)


@pytest.mark.parametrize("scheme,d", [_param("hnas", 64, full=True), _param("dnas", 128, full=True),
                                      _param("dnas", 64, full=True), _param("hnas", 128, full=True)])
def test_head_sizes_64_and_128(scheme, d):
    check_head_size(lean, scheme, d, heads=2)


@pytest.mark.parametrize("scheme,tq,tk", [_param("hnas", 19, 33), _param("dnas", 33, 19),
                                          _param("dnas", 19, 33, full=True), _param("hnas", 33, 19, full=True)])
def test_strided_views_and_cross_attention(scheme, tq, tk):
    """Views of packed projections, T_q != T_k, separate key and query masks."""
    _, grads = check_strided_views(lean, scheme, tq, tk)
    assert (grads[0][1, :, (tq + 1) // 4:] == 0).all()  # padded queries get no gradient


@pytest.mark.parametrize("scheme", ["hnas", pytest.param("dnas", marks=pytest.mark.full)])
def test_lean_equals_long_for_the_same_dropout_seed(scheme):
    """The same mask, replayed bit for bit in both backward loops: a mask that
    differed in one loop would move the gradients far beyond float32 rounding."""
    check_same_as_long(lean, scheme)


@pytest.mark.parametrize("scheme", ["hnas", pytest.param("dnas", marks=pytest.mark.full)])
def test_large_scores_with_u_near_0_and_1(scheme):
    """Scores up to |s| about 40 and beyond (rows far below the columns' maxima:
    HNAS's one exponential and its row and column factors, where 2^(c2) alone
    or a lone softmax probability would leave float32's half range), u 0.02
    and 0.98, left padding, float32."""
    q, k, v, do, _ = _inputs(F32, tq=37, tk=37, d=16, batch=2, heads=2, seed=5, mean=0.0)
    with torch.no_grad():
        q.mul_(1.2)
        k.mul_(1.2)
        q[:, :, ::5] *= -1.2  # some queries far below the others in every column
    s = (q @ k.transpose(-1, -2)).detach()
    assert 40 < s.abs().amax() < 100 and (s.abs() > 30).float().mean() > 0.03
    u = torch.tensor([0.02, 0.98], device=DEVICE, requires_grad=True)
    kmask, qmask = _masks(left=True, batch=2)
    check_against_float64(lean, q, k, v, do, u, scheme, kmask, qmask)


def test_an_all_padding_sentence_and_one_token():
    """A sentence that is all padding gives zeros and finite gradients; a
    one-query, one-key call gives v (DNAS weight 1)."""
    q, k, v, do, u = _inputs(F32, tq=17, tk=17, d=16, batch=2, heads=1)
    mask = padding_mask((17, 0), 17, True).to(DEVICE)
    out = lean.triton_attention(q, k, v, hybrid_weight=u, key_padding_mask=mask, query_padding_mask=mask)
    grads = torch.autograd.grad(out, (q, k, v, u), do)
    assert (out[1] == 0).all() and all(torch.isfinite(g).all() for g in grads)
    q1, k1, v1, _, _ = _inputs(F32, tq=1, tk=1, d=16, batch=2, heads=2)
    torch.testing.assert_close(lean.triton_attention(q1, k1, v1), v1.detach(), atol=1e-6, rtol=1e-5)


def test_sinkhorn_rounds_are_refused():
    q = torch.zeros(1, 1, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match="one normalization round.*long kernels"):
        lean.triton_attention(q, q, q, sinkhorn_iters=2)


def _random_case(seed):
    """Shapes, masks, scheme and dropout drawn from ``seed``: T_q, T_k in 1-40
    (ragged tiles, T_q != T_k), head size 16/20/32, left or right padding."""
    rnd = random.Random(seed)
    tq, tk = rnd.randint(1, 40), rnd.randint(1, 40)
    d, batch, heads = rnd.choice((16, 20, 32)), rnd.randint(1, 3), rnd.randint(1, 2)
    left = rnd.random() < 0.5
    klens = [tk] + [rnd.randint(0, tk) for _ in range(batch - 1)]
    # a sentence without a real key is all padding on both sides (real queries with no key to attend
    # to have no defined output: the kernels give 0, the float64 reference does not)
    qlens = [tq] + [rnd.randint(1, tq) if n else 0 for n in klens[1:]]
    kmask = padding_mask(klens, tk, left)
    qmask = padding_mask(qlens, tq, left)
    return dict(tq=tq, tk=tk, d=d, batch=batch, heads=heads, kmask=kmask.to(DEVICE), qmask=qmask.to(DEVICE),
                scheme=rnd.choice(("dnas", "hnas")), p=rnd.choice((0.0, 0.2)), seed=seed)


def _check_random_case(case):
    q, k, v, do, u = _inputs(F32, tq=case["tq"], tk=case["tk"], d=case["d"], batch=case["batch"],
                             heads=case["heads"], seed=case["seed"])
    check_against_float64(lean, q, k, v, do, u, case["scheme"], case["kmask"], case["qmask"], case["p"],
                          seed=torch.tensor([case["seed"]], dtype=torch.int64, device=DEVICE))


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:  # seeded random cases instead
    given = None


if given is not None:
    def _property(examples):
        @settings(max_examples=examples, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.integers(0, 2**31 - 1))
        def check(seed):
            _check_random_case(_random_case(seed))
        return check

    def test_random_shapes_and_masks_match_float64():
        """Hypothesis over shapes, masks, scheme and dropout (float32: the
        error is the kernels' arithmetic alone). A few examples here; the
        full tier runs 30."""
        _property(3)()

    @pytest.mark.full
    def test_random_shapes_and_masks_match_float64_many():
        _property(30)()
else:
    @pytest.mark.parametrize("seed", [0, 1, 2] + [pytest.param(s, marks=pytest.mark.full) for s in range(3, 30)])
    def test_random_shapes_and_masks_match_float64(seed):
        _check_random_case(_random_case(seed))


# --- cross-attention through fairseq_dnas.nn -------------------------------------------------------------------


@pytest.mark.parametrize("scheme,hybrid_per", [("hnas", "layer"), ("hnas", "head"),
                                               pytest.param("dnas", "head", marks=pytest.mark.full)])
def test_nn_cross_attention_runs_the_lean_kernels(scheme, hybrid_per, monkeypatch):
    """fairseq_dnas.nn.MultiheadAttention, T_q 19 != T_k 33, key and query
    padding, u per layer (one u for every head) and per head, on the forced
    Triton path with FAIRSEQ_DNAS_TRITON_LEAN=1: the lean kernels run (and
    no long kernel), output and every parameter gradient equal the
    materialized path's."""
    from fairseq_dnas.nn import MultiheadAttention

    monkeypatch.setenv(selection.SHORT_ENV, "0")
    monkeypatch.setenv(selection.LEAN_ENV, "1")
    torch.manual_seed(0)
    kwargs = dict(hybrid_init=0.3, hybrid_per=hybrid_per) if scheme == "hnas" else {}
    m = MultiheadAttention(32, 2, batch_first=True, scheme=scheme, **kwargs).to(DEVICE)
    x = (torch.randn(3, 19, 32) + 0.5).to(DEVICE)
    y = torch.randn(3, 33, 32).to(DEVICE)
    kmask = padding_mask((33, 20, 5), 33, False).to(DEVICE)
    qmask = padding_mask((19, 7, 1), 19, False).to(DEVICE)
    g = torch.randn(3, 19, 32).to(DEVICE)
    real = ~qmask

    def run(path):
        monkeypatch.setenv(kernels.PATH_ENV, path)
        m.zero_grad()
        out, _ = m(x, y, y, key_padding_mask=kmask, query_padding_mask=qmask, need_weights=False)
        (out * g)[real].sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}

    with count_launches() as launches:
        out, grads = run("triton")
    assert BACKWARD in launches.triton and not any(n in long.__dict__ for n in launches.triton), launches.describe()
    ref, ref_grads = run("materialized")
    torch.testing.assert_close(out[real], ref[real], atol=1e-5, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    if scheme == "hnas":
        assert m.hybrid_logit.numel() == (1 if hybrid_per == "layer" else 2)
        assert grads["hybrid_logit"].abs().max() > 1e-6  # dL/du reached u


# --- launches a step ------------------------------------------------------------------------------------------

LEAN_LAUNCHES = {("dnas", 0.0): 5, ("hnas", 0.1): 7}


@pytest.mark.parametrize("scheme,p", [("dnas", 0.0), ("hnas", 0.1)])
def test_lean_launches_a_step(scheme, p, monkeypatch):
    """Every Triton launch and every computing torch operation of one forward +
    backward through ``kernels.attend`` (float16: dq is cast once): DNAS
    without dropout at most 6 (it is 5: the column pass, the forward, the
    preprocess, the backward and dq's cast); dropout adds the seed, HNAS
    dL/du's sum. long.py takes 12 (DNAS) and 13 (HNAS) here."""
    monkeypatch.setenv(selection.SHORT_ENV, "0")
    monkeypatch.setenv(selection.LEAN_ENV, "1")
    q, k, v, do, u = _inputs(F16, tq=20, tk=20, d=16, batch=2, heads=1)
    kmask, _ = _masks(left=True, tq=20, tk=20, batch=2)
    with count_launches() as launches:
        out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=kmask,
                                hybrid_weight=u if scheme == "hnas" else None,
                                dropout=torch.nn.Dropout(p) if p > 0 else None, path="triton")
        torch.autograd.grad(out, (q, k, v, u) if scheme == "hnas" else (q, k, v), do)
    print(f"{scheme} p={p}: {launches.describe()}")
    assert launches.triton == ["_lean_column_kernel", "_lean_forward_kernel", "_lean_preprocess_kernel",
                               BACKWARD], launches.describe()
    assert launches.total == LEAN_LAUNCHES[scheme, p], launches.describe()
    if scheme == "dnas" and p == 0.0:
        assert launches.total <= 6


# --- selection ------------------------------------------------------------------------------------------------


class _FakeCuda:
    """Enough of a CUDA tensor for ``selection.choose`` (no GPU needed)."""

    def __init__(self, t=1024, dtype=F16, d=64):
        self.device, self.dtype, self.shape = torch.device("cuda"), dtype, (2, 12, t, d)


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


LEAN_RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results",
                           "2026-11-28-h200-lean-kernels.raw", "lean.json")


def test_lean_chosen_is_the_h200_records_choice():
    """selection.LEAN_CHOSEN is the table benchmarks/gpu_lean.py chose on the H200
    (docs/results/2026-11-28-h200-lean-kernels.md), every entry exact there."""
    import json

    assert selection.LEAN_CHOSEN == selection.read_lean_table(LEAN_RECORD)
    assert all(row["exact"] for row in json.load(open(LEAN_RECORD))["chosen"])


@pytest.mark.parametrize("value,expect", [(None, "lean"), ("auto", "lean"), ("", "lean"), ("1", "lean"),
                                          ("0", "long")])
def test_lean_runs_where_the_clock_chose_it_or_when_asked(value, expect, monkeypatch):
    """auto runs the lean kernels where LEAN_CHOSEN (the H200 record) chose them: half precision,
    every band; =1 everywhere the long kernels would run; =0 never."""
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    if value is None:
        monkeypatch.delenv(selection.LEAN_ENV, raising=False)
    else:
        monkeypatch.setenv(selection.LEAN_ENV, value)
    assert selection.choose(_FakeCuda(1024, dtype=F32)).kernels == ("lean" if value == "1" else "long")
    for t in (129, 1024, 8192):
        assert selection.choose(_FakeCuda(t)) == selection.Choice("triton", expect)
        assert selection.choose(_FakeCuda(t), scheme="hnas", path="triton") == selection.Choice("triton", expect, True)
    assert selection.choose(_FakeCuda(100)).kernels == "short"  # the one-tile kernels keep short inputs
    assert selection.choose(_FakeCuda(1024), sinkhorn_iters=3).kernels == "long"  # Sinkhorn: long only
    assert selection.kernel_sets(1, 64, F16, "dnas") == ("short", expect)
    assert selection.kernel_sets(3, 64, F16, "dnas") == ("long",)
    assert selection.attention_function(expect) is {"lean": lean, "long": long}[expect].triton_attention


def test_deterministic_algorithms_run_the_long_kernels(monkeypatch, deterministic):
    """Atomic dq is not bitwise repeatable: torch.use_deterministic_algorithms(True)
    runs the long kernels even when the lean ones are asked for, and the check
    command says so."""
    from fairseq_dnas.check import longer_kernels

    monkeypatch.setenv(selection.LEAN_ENV, "1")
    assert selection.choose(_FakeCuda(1024)) == selection.Choice("triton", "long")
    assert selection.choose(_FakeCuda(1024), path="triton").kernels == "long"
    assert selection.kernel_sets(1, 64, F16, "hnas") == ("short", "long")
    assert "use_deterministic_algorithms(True)" in longer_kernels(selection)


def test_lean_chosen_table_decides_per_band(monkeypatch):
    """LEAN_CHOSEN (a GPU record's table) sends its (kind, head size, scheme,
    band) to the lean kernels under auto and nothing else; =0 overrides it."""
    from fairseq_dnas.check import longer_kernels

    monkeypatch.delenv(selection.LEAN_ENV, raising=False)
    monkeypatch.delenv(selection.SHORT_ENV, raising=False)
    monkeypatch.setattr(selection, "LEAN_CHOSEN", {("half", 64, "dnas", 1024): "lean",
                                                  ("half", 64, "dnas", 4096): "long"})
    assert selection.lean_band(513) == 1024 and selection.lean_band(100_000) == 4096
    assert selection.choose(_FakeCuda(1000)).kernels == "lean"
    assert selection.choose(_FakeCuda(1000, dtype=torch.bfloat16)).kernels == "lean"  # half precision: both
    for case in (_FakeCuda(1000, d=128), _FakeCuda(1000, dtype=F32), _FakeCuda(2000), _FakeCuda(5000)):
        assert selection.choose(case).kernels == "long"
    assert selection.choose(_FakeCuda(1000), scheme="hnas").kernels == "long"
    assert selection.kernel_sets(1, 64, F16, "dnas") == ("short", "long", "lean")
    assert "half:64 dnas T<=1024" in longer_kernels(selection)
    monkeypatch.setenv(selection.LEAN_ENV, "0")
    assert selection.choose(_FakeCuda(1000)).kernels == "long"


def test_a_bad_lean_value_names_the_allowed_ones(monkeypatch):
    monkeypatch.setenv(selection.LEAN_ENV, "yes")
    with pytest.raises(ValueError, match=r"FAIRSEQ_DNAS_TRITON_LEAN='yes' .* auto, 1, 0"):
        selection.choose(_FakeCuda(1024))


def test_the_first_use_check_passes_the_lean_kernels():
    config = selfcheck.Config(DEVICE, F16, 64, "hnas", True, 1, True, kernels="lean")
    result = selfcheck.compare(config, lean.triton_attention, **selfcheck.sizes(config))
    assert result.ok, result.reason()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter run is the CPU stand-in for the GPU run")
def test_the_check_command_says_which_set_runs():
    env = dict(os.environ, **{selection.LEAN_ENV: "1", selection.SHORT_ENV: "0"})
    r = subprocess.run([sys.executable, "-m", "fairseq_dnas.check", "--interpret", "--dtypes", "float32",
                        "--heads", "64", "--sinkhorn", "1", "--schemes", "dnas", "--dropout", "off"],
                       capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "else lean ($FAIRSEQ_DNAS_TRITON_LEAN=1" in r.stdout
    rows = [line for line in r.stdout.splitlines() if line.startswith("dnas ")]
    assert [line.split()[5] for line in rows] == ["lean"] and rows[0].endswith(" ok"), r.stdout


# --- benchmarks/gpu_lean.py -----------------------------------------------------------------------------------


def test_gpu_lean_dry_run_prints_the_plan():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_lean.py"), "--dry-run"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exact: 16 configurations of the lean kernels" in r.stdout
    assert "time: 64 cases" in r.stdout and "float16 head 64 dnas dropout 0.0 T 1024 (B 16 x H 16)" in r.stdout


@pytest.mark.parametrize("args,message", [
    (("--render", "x.log"), "--render LOG needs --out"), (("--out", "x", "--dtypes", "float64"), "--dtypes takes"),
    (("--out", "x", "--schemes", "unas"), "--schemes takes"), (("--out", "x", "--lengths", "a"), "comma-separated"),
])
def test_gpu_lean_bad_arguments_are_one_line(args, message):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_lean.py"), *args],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_lean_refuses_without_a_gpu(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu_lean.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2 and "torch sees no CUDA device" in r.stderr and not os.listdir(tmp_path)


def test_gpu_lean_stand_in_writes_every_file(tmp_path, monkeypatch, capsys):
    """The stand-in run (Triton's interpreter): one exactness row per lean
    configuration, each set timed, lean.json's ``chosen`` readable by
    ``selection.read_lean_table``; a set that raises is an error row and the
    run goes on; ``--render`` rebuilds the same files from the printed
    lines; configurations past the budget are skipped rows."""
    import gpu_lean

    real = gpu_lean.make_step

    def failing_long(name, *args):
        if name == "long":
            raise RuntimeError("a long-kernel failure")
        return real(name, *args)

    monkeypatch.setattr(gpu_lean, "make_step", failing_long)
    out = tmp_path / "lean"
    code = gpu_lean.main(["--stand-in", "--out", str(out), "--schemes", "dnas", "--dropouts", "0.1",
                          "--lengths", "20"])
    assert code == 1  # the error row
    rows = [json.loads(line) for line in (out / "lean.jsonl").read_text().splitlines()]
    data = json.loads((out / "lean.json").read_text())
    assert data["complete"] and data["rows"] == rows
    assert [r["ok"] for r in rows if r["part"] == "exact"] == [True, True]
    by_set = {r["set"]: r for r in rows if r["part"] == "time"}
    assert by_set["lean"]["gpu_ms"] > 0 and by_set["sdpa"]["gpu_ms"] > 0
    assert by_set["long"]["error"] == "RuntimeError: a long-kernel failure"
    assert "## Exactness of the lean kernels" in (out / "lean.md").read_text()
    log = tmp_path / "lean.log"
    log.write_text(capsys.readouterr().out)
    assert gpu_lean.main(["--render", str(log), "--out", str(tmp_path / "rendered")]) == 0
    assert json.loads((tmp_path / "rendered" / "lean.json").read_text()) == data

    monkeypatch.setattr(gpu_lean, "make_step", real)
    code = gpu_lean.main(["--stand-in", "--out", str(out), "--no-exact", "--schemes", "dnas", "--dropouts", "0",
                          "--lengths", "20,600", "--budget-s", "1e-9"])
    rows = [json.loads(line) for line in (out / "lean.jsonl").read_text().splitlines()]
    assert code == 0 and rows and all(r["part"] == "skipped" for r in rows)  # nothing started after the budget

    rows = [dict(part="time", dtype=d, head=64, scheme="dnas", dropout=p, T=t, set=s, gpu_ms=ms)
            for d in ("float16", "bfloat16") for p in (0.0, 0.1) for t, s, ms in
            ((1024, "lean", 1.0), (1024, "long", 2.0), (4096, "lean", 9.0), (4096, "long", 8.0))]
    path = tmp_path / "chosen.json"
    path.write_text(json.dumps(dict(chosen=gpu_lean.choose(rows))))
    assert selection.read_lean_table(str(path)) == {("half", 64, "dnas", 1024): "lean",
                                                    ("half", 64, "dnas", 4096): "long"}


def test_read_lean_table_says_what_to_fix(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(chosen=[dict(kind="half", head=64, scheme="dnas", band=777, set="lean")])))
    with pytest.raises(ValueError, match="band one of 512, 1024, 2048, 4096"):
        selection.read_lean_table(str(path))
    path.write_text("[]")
    with pytest.raises(ValueError, match='"chosen" list'):
        selection.read_lean_table(str(path))


# --- the compiler's view (sm_90, no GPU needed) ---------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above compile and run the kernels")
@pytest.mark.full  # compiles 24 variants (a few minutes on 2 cores)
def test_lean_kernels_compile_for_sm90_within_the_tile_rule():
    """The lean kernels compiled for an H100 as the JIT specializes a real call
    (benchmarks/triton_spills.py --lean 1): every variant of fp16 at head
    size 64 without a register spill, every matmul on wgmma or mma.sync and
    none serialized by ptxas; bf16 at head size 128 within the tile rule
    (at most 64 bytes of spills, 99 KB of shared memory)."""
    from test_triton_tiles import _compile

    lean = ("--short", "0", "--lean", "1", "--sinkhorn", "1")
    seen, summary = _compile("fp16:64", *lean, "--max-stack", "0")
    assert {kernel for _, kernel, _ in seen} == {"lean_column", "lean_forward", "lean_preprocess", "lean_backward"}
    # 12 variants: the column pass twice (HNAS's also writes the key terms of its one exp2 a score)
    assert len(seen) == 12 and "0 with a stack" in summary and "0 with wgmma serialized" in summary, summary
    seen, summary = _compile("bf16:128", *lean)
    assert len(seen) == 12 and "0 with wgmma serialized" in summary, summary


def test_gpu_lean_never_chooses_an_inexact_lean_set():
    import gpu_lean

    rows = [dict(part="time", dtype="float16", head=64, scheme=scheme, dropout=0.0, T=1024, set=s, gpu_ms=ms)
            for scheme in ("dnas", "hnas") for s, ms in (("lean", 1.0), ("long", 2.0))]
    rows.append(dict(part="exact", dtype="bfloat16", head=64, scheme="hnas", dropout=True, ok=False))
    chosen = {c["scheme"]: (c["set"], c["exact"]) for c in gpu_lean.choose(rows)}
    assert chosen == {"dnas": ("lean", True), "hnas": ("long", False)}
