"""Tier 1: the ``auto`` path's first-use check of the Triton kernels and its fallback.

Without a GPU the kernels run on CPU tensors under Triton's interpreter; the
tests let ``auto`` take them for CPU tensors and let the first-use check run
there (the ``auto_triton_on_cpu`` fixture of conftest.py). A kernel
made to disagree (its output shifted) or to fail (it raises, forward or
backward) must give one warning with the numbers and the configuration, and
the result must still be DNAS/HNAS (against ``reference.py``), computed by
the dense path; a forced ``triton`` path keeps every failure an error.
"""

import warnings

import pytest
import torch
from conftest import padding_mask
from fairseq_dnas.reference import reference_probs, reference_self_attention

from fairseq_dnas.attention import kernels, selfcheck
from fairseq_dnas.modules import DNASMultiheadAttention

long = pytest.importorskip(
    "fairseq_dnas.attention.triton.long", reason="triton is not installed (scripts/install.sh installs it)"
)
from fairseq_dnas.attention.triton import dropout as triton_dropout  # noqa: E402 (after the importorskip)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
T = 17  # two 16-row tiles under the interpreter, the second ragged
LENGTHS = (17, 9)


@pytest.fixture(autouse=True)
def _auto_takes_triton(monkeypatch, auto_triton_on_cpu):
    monkeypatch.delenv(kernels.PATH_ENV, raising=False)
    monkeypatch.delenv(selfcheck.CHECK_ENV, raising=False)


def _qkv(d=16, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (len(LENGTHS), heads, T, d)
    q, k = (torch.randn(shape, generator=g, dtype=torch.float64) * 1.2 for _ in range(2))
    v = torch.randn(shape, generator=g, dtype=torch.float64)
    return [x.float().to(DEVICE).requires_grad_() for x in (q, k, v)]


def _u(heads=2):
    return torch.tensor([0.3, 0.8][:heads], device=DEVICE)


def _mask():
    return padding_mask(LENGTHS, T, True).to(DEVICE)


def _attend(scheme, path=None, dropout=None, d=16):
    q, k, v = _qkv(d)
    u = _u() if scheme == "hnas" else None
    out, _ = kernels.attend(q, k, v, scheme=scheme, padding_mask=_mask(), hybrid_weight=u, dropout=dropout,
                            path=path)
    return out, (q, k, v, u)


def _reference(q, k, v, u, scheme):
    mask = _mask().cpu()
    p = reference_probs(q.detach().double().cpu() @ k.detach().double().cpu().transpose(-1, -2), scheme,
                        mask, mask, None if u is None else u.cpu())
    return p @ v.detach().double().cpu()


def _spy(monkeypatch, shift=0.0, error=None, backward_error=None):
    """Replace ``long.triton_attention`` by a counted version whose
    output is shifted by ``shift``, or which raises ``error`` (forward) or
    ``backward_error`` (in the backward); returns the list of calls."""
    calls = []
    real = long.triton_attention

    class FailingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise backward_error

    def fake(q, k, v, **kw):
        calls.append(kw)
        if error is not None:
            raise error
        out = real(q, k, v, **kw) + shift
        return FailingBackward.apply(out) if backward_error is not None else out

    monkeypatch.setattr(long, "triton_attention", fake)
    return calls


def _dense_spy(monkeypatch):
    calls = []
    real = kernels.dense_probs
    monkeypatch.setattr(kernels, "dense_probs", lambda *a: calls.append(1) or real(*a))
    return calls


class _Record:
    def __enter__(self):
        self._cm = warnings.catch_warnings(record=True)
        self.list = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)

    def fallbacks(self):
        return [str(w.message) for w in self.list if issubclass(w.category, selfcheck.TritonFallbackWarning)]


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_agreeing_kernels_run_without_warning(scheme, monkeypatch, auto_triton_on_cpu):
    calls = _spy(monkeypatch)
    dense = _dense_spy(monkeypatch)
    with _Record() as rec:
        out, inputs = _attend(scheme)
        out.sum().backward()
        assert len(calls) == 2  # the first-use check, then the real call
        out2, _ = _attend(scheme)
    assert rec.fallbacks() == []
    assert len(calls) == 3 and not dense  # no second check; the kernels computed both
    torch.testing.assert_close(out.double().cpu(), _reference(*inputs, scheme), atol=1e-5, rtol=0)
    assert list(auto_triton_on_cpu.values()) == [""]  # the check's verdict: the kernels agree


@pytest.mark.parametrize("scheme", ["dnas", "hnas"])
def test_disagreeing_kernels_warn_once_and_fall_back(scheme, monkeypatch):
    calls = _spy(monkeypatch, shift=0.1)
    dense = _dense_spy(monkeypatch)
    with _Record() as rec:
        out, inputs = _attend(scheme)
        out2, _ = _attend(scheme)
    (message,) = rec.fallbacks()
    assert "output max abs error 0.1 > tolerance 1e-05" in message
    assert f"{scheme} float32, head size 16, dropout off, sinkhorn_iters 1, padding on, {DEVICE}" in message
    assert "runs the same " + scheme.upper() in message
    assert len(calls) == 1 and len(dense) == 2  # only the check ran the kernels
    ref = _reference(*inputs, scheme)  # still DNAS/HNAS, not softmax
    torch.testing.assert_close(out.double().cpu(), ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(out2.double().cpu(), ref, atol=1e-5, rtol=0)
    unas = reference_probs(inputs[0].detach().double().cpu() @ inputs[1].detach().double().cpu().transpose(-1, -2),
                           "unas", _mask().cpu(), _mask().cpu()) @ inputs[2].detach().double().cpu()
    assert (out.double().cpu() - unas).abs().max() > 1e-2
    grads = torch.autograd.grad(out.sum(), inputs[:3])
    dense_out, dense_inputs = _attend(scheme, path="dense")
    expect = torch.autograd.grad(dense_out.sum(), dense_inputs[:3])
    for a, b in zip(grads, expect):
        torch.testing.assert_close(a, b)


def test_only_the_failing_configuration_falls_back(monkeypatch):
    """The HNAS kernels disagree, the DNAS ones do not: DNAS keeps them."""
    real = long.triton_attention
    calls = []

    def fake(q, k, v, **kw):
        calls.append(kw["hybrid_weight"] is None)
        return real(q, k, v, **kw) + (0.0 if kw["hybrid_weight"] is None else 0.1)

    monkeypatch.setattr(long, "triton_attention", fake)
    with _Record() as rec:
        _attend("hnas")
        _attend("dnas")
        _attend("hnas")
        _attend("dnas")
    assert len(rec.fallbacks()) == 1 and "hnas float32," in rec.fallbacks()[0]
    assert calls == [False, True, True, True]  # hnas: check only; dnas: check, call, call


@pytest.mark.parametrize("check", ["1", "0"])
def test_kernels_that_cannot_launch_fall_back(check, monkeypatch):
    """Raised in the check (check on) or in the real call (check off): one
    warning naming the error, the dense path's result."""
    monkeypatch.setenv(selfcheck.CHECK_ENV, check)
    calls = _spy(monkeypatch, error=RuntimeError("out of resource: shared memory, Required: 131072"))
    with _Record() as rec:
        out, inputs = _attend("hnas")
        _attend("hnas")
    (message,) = rec.fallbacks()
    assert "could not compile or launch (RuntimeError: out of resource: shared memory" in message
    assert len(calls) == 1
    torch.testing.assert_close(out.double().cpu(), _reference(*inputs, "hnas"), atol=1e-5, rtol=0)


def test_the_check_catches_a_failing_backward(monkeypatch):
    """A backward cannot be rerouted once its forward ran on the kernels; the
    first-use check runs the backward, so the failure is found before the
    real call, which then runs on the dense path."""
    calls = _spy(monkeypatch, backward_error=RuntimeError("PassManager::run failed"))
    with _Record() as rec:
        out, inputs = _attend("dnas")
        out.sum().backward()
    (message,) = rec.fallbacks()
    assert "(RuntimeError: PassManager::run failed)" in message
    assert len(calls) == 1 and torch.isfinite(inputs[0].grad).all()


def test_without_the_check_a_failing_backward_is_an_error(monkeypatch):
    monkeypatch.setenv(selfcheck.CHECK_ENV, "0")
    _spy(monkeypatch, backward_error=RuntimeError("PassManager::run failed"))
    out, _ = _attend("dnas")
    with pytest.raises(RuntimeError, match="PassManager"):
        out.sum().backward()


def test_the_check_can_be_switched_off(monkeypatch):
    monkeypatch.setenv(selfcheck.CHECK_ENV, "0")
    calls = _spy(monkeypatch, shift=0.1)
    with _Record() as rec:
        out, inputs = _attend("dnas")
    assert rec.fallbacks() == [] and len(calls) == 1  # unchecked: the shifted kernels ran
    torch.testing.assert_close(out.double().cpu() - 0.1, _reference(*inputs, "dnas"), atol=1e-5, rtol=0)
    monkeypatch.setenv(selfcheck.CHECK_ENV, "no")
    with pytest.raises(ValueError, match="FAIRSEQ_DNAS_TRITON_CHECK must be 0"):
        _attend("dnas")


def _force(how, monkeypatch):
    if how == "environment":
        monkeypatch.setenv(kernels.PATH_ENV, "triton")
        return None
    return "triton"


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_forced_triton_keeps_failures_errors(how, monkeypatch):
    path = _force(how, monkeypatch)
    _spy(monkeypatch, error=RuntimeError("out of resource: shared memory"))
    with _Record() as rec:
        with pytest.raises(RuntimeError, match="out of resource"):
            _attend("dnas", path=path)
    assert rec.fallbacks() == []


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_forced_triton_is_not_checked(how, monkeypatch):
    path = _force(how, monkeypatch)
    calls = _spy(monkeypatch, shift=0.1)
    with _Record() as rec:
        out, inputs = _attend("dnas", path=path)  # forced: not checked either
    assert rec.fallbacks() == [] and len(calls) == 1
    torch.testing.assert_close(out.double().cpu() - 0.1, _reference(*inputs, "dnas"), atol=1e-5, rtol=0)


def test_out_of_memory_is_not_a_reason_to_fall_back(monkeypatch):
    monkeypatch.setenv(selfcheck.CHECK_ENV, "0")
    _spy(monkeypatch, error=torch.cuda.OutOfMemoryError("CUDA out of memory"))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        _attend("dnas")


def test_dropout_is_checked_with_the_kernels_own_mask(monkeypatch, auto_triton_on_cpu):
    """With dropout the check compares against the float64 math times the mask
    ``dropout_mask`` publishes: the real kernels agree; a published mask that
    is not the one the kernels apply is caught."""
    drop = torch.nn.Dropout(0.3).train()
    with _Record() as rec:
        _attend("dnas", dropout=drop)
    assert rec.fallbacks() == [] and list(auto_triton_on_cpu.values()) == [""]
    auto_triton_on_cpu.clear()
    real = triton_dropout.dropout_mask
    monkeypatch.setattr(triton_dropout, "dropout_mask", lambda seed, shape, p: real(seed + 1, shape, p))
    with _Record() as rec:
        _attend("dnas", dropout=drop)
    (message,) = rec.fallbacks()
    assert "dropout on" in message and "max abs error" in message


def test_the_fairseq_module_falls_back_to_the_same_scheme(monkeypatch):
    _spy(monkeypatch, shift=0.1)
    m = DNASMultiheadAttention(32, 2, scheme="hnas", hybrid_init=0.3).to(DEVICE)
    x = torch.randn(T, len(LENGTHS), 32, device=DEVICE)
    mask = _mask()
    with _Record() as rec:
        out, _ = m(x, x, x, key_padding_mask=mask, need_weights=False)
    assert len(rec.fallbacks()) == 1
    real = ~mask.T.cpu()
    ref = reference_self_attention(m.cpu(), x.cpu(), mask.cpu())
    torch.testing.assert_close(out.detach().double().cpu()[real], ref[real], atol=1e-5, rtol=0)


def test_the_check_leaves_torchs_random_state_alone():
    """fairseq seeds its runs: the check draws from a private generator and a
    fixed dropout seed, so a run is the same with and without it."""
    config = selfcheck.Config(DEVICE, torch.float32, 16, "dnas", True, 1, True)
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state() if DEVICE == "cuda" else None
    assert selfcheck.compare(config, long.triton_attention, **selfcheck.INTERPRETER_SIZES).ok
    assert torch.equal(torch.get_rng_state(), cpu_state)
    if cuda_state is not None:
        assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
