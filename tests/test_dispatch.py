"""Tier 1: a call's path is resolved once (``attention/dispatch.py``).

``kernels.attend`` builds one ``dispatch.Decision`` a call and reads
everything from it: each step of the resolution (the dropout probability,
the rules of ``selection.choose``, the kernel function, the fallback) runs
once a call, on the CPU paths and on the Triton path (under Triton's
interpreter on CPU, with ``auto`` taking the kernels: the
``auto_triton_on_cpu`` fixture). The results themselves are held to the
float64 reference elsewhere (``test_kernels.py``, ``test_triton.py``,
``test_fallback.py``); here what counts is how often each step runs and what
the decision carries.
"""

import collections

import pytest
import torch
from conftest import padding_mask
from fairseq.modules import FairseqDropout

from fairseq_dnas.attention import dispatch, kernels, selection, selfcheck

# Every step of the resolution, by (module, name): each is counted through its module attribute.
STEPS = [(dispatch, "resolve"), (selection, "choose"), (selection, "dropout_p"), (selection, "dropout_active"),
         (selection, "attention_function"), (selection, "fallback_path"), (selfcheck, "config_of"),
         (selfcheck, "triton_usable")]
T = 17
LENGTHS = (17, 9)


def _count(monkeypatch):
    """Count the calls of every step in STEPS (each still runs)."""
    calls = collections.Counter()
    for module, name in STEPS:
        real = getattr(module, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def _inputs(t=T):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(LENGTHS), 2, t, 16, generator=g) for _ in range(3))
    return q, k, v, padding_mask(LENGTHS, t, True)


def _dropout(p=0.25):
    return FairseqDropout(p, module_name="test").train()


@pytest.fixture(autouse=True)
def _no_path_from_the_environment(monkeypatch):
    monkeypatch.delenv(selection.PATH_ENV, raising=False)
    monkeypatch.delenv(selfcheck.CHECK_ENV, raising=False)


@pytest.mark.parametrize("path, dropout, expect", [
    (None, None, "dense"), (None, _dropout(), "dense"), ("flash", None, "flash"), ("blockwise", None, "blockwise"),
    ("materialized", _dropout(), "materialized"), ("dense", _dropout(0.0), "dense")])
def test_each_step_runs_once_on_the_cpu_paths(monkeypatch, path, dropout, expect):
    q, k, v, mask = _inputs()
    decisions = []
    resolve = dispatch.resolve
    monkeypatch.setattr(dispatch, "resolve", lambda *a, **kw: decisions.append(resolve(*a, **kw)) or decisions[-1])
    calls = _count(monkeypatch)
    kernels.attend(q, k, v, scheme="dnas", padding_mask=mask, dropout=dropout, path=path)
    auto = {"fallback_path": 1} if path is None else {}  # the rule auto applies off the kernels, inside choose
    assert calls == {"resolve": 1, "choose": 1, "dropout_p": 1, "dropout_active": 1, **auto}
    assert decisions == [dispatch.Decision(expect)]  # nothing of the Triton path on a CPU path


def test_unas_resolves_to_the_reference_math_without_a_rule(monkeypatch):
    q, k, v, mask = _inputs()
    calls = _count(monkeypatch)
    kernels.attend(q, k, v, scheme="unas", padding_mask=mask, dropout=_dropout())
    assert calls == {"resolve": 1}
    assert dispatch.resolve(q, k, scheme="unas", padding=True) == dispatch.Decision("materialized")
    with pytest.raises(ValueError, match="unknown attention path 'fast'"):
        dispatch.resolve(q, k, scheme="unas", padding=True, path="fast")  # a bad path is still an error


def test_each_step_runs_once_on_the_checked_triton_path(monkeypatch, auto_triton_on_cpu):
    """``auto`` on the kernels, attention dropout on: one resolution, one
    kernel function handed to the first-use check and then called, with the
    drop probability computed once."""
    long = pytest.importorskip("fairseq_dnas.attention.triton.long", reason="triton is not installed")
    monkeypatch.setenv(selfcheck.CHECK_ENV, "0")  # the comparison itself is test_fallback.py's; not rerun here
    q, k, v, mask = _inputs()
    ran = []
    real = long.triton_attention
    monkeypatch.setattr(long, "triton_attention", lambda *a, **kw: ran.append(kw["dropout_p"]) or real(*a, **kw))
    calls = _count(monkeypatch)
    out, _ = kernels.attend(q, k, v, scheme="dnas", padding_mask=mask, dropout=_dropout(0.25))
    assert calls == {"resolve": 1, "choose": 1, "dropout_p": 1, "dropout_active": 1, "attention_function": 1,
                     "config_of": 1, "fallback_path": 1, "triton_usable": 1}
    assert ran == [0.25]  # the kernels ran, once, with the module's probability
    assert out.shape == q.shape


def test_the_decision_carries_the_kernels_the_probability_and_the_check(auto_triton_on_cpu):
    long = pytest.importorskip("fairseq_dnas.attention.triton.long", reason="triton is not installed")
    q, k, _, _ = _inputs()
    decision = dispatch.resolve(q, k, scheme="hnas", padding=True, dropout=_dropout(0.25))
    assert decision.path == "triton" and decision.kernels == "long"  # float32: never the one-tile kernels
    assert decision.function is long.triton_attention
    assert decision.dropout_p == 0.25
    assert decision.checked == selfcheck.Config("cpu", torch.float32, 16, "hnas", True, 1, True, False, "long")
    assert decision.fallback == "dense"  # dropout needs the probabilities
    # dropout off (eval), no padding, longer than DENSE_MAX_LEN: the fallback keeps no T x T matrix
    t = selection.DENSE_MAX_LEN + 1
    q, k, _, _ = _inputs(t)
    decision = dispatch.resolve(q, k, scheme="dnas", padding=False, dropout=_dropout(0.25).eval())
    assert (decision.dropout_p, decision.checked.dropout, decision.checked.padding) == (0.0, False, False)
    assert decision.fallback == "flash"


def test_a_forced_triton_path_has_no_check_and_no_fallback(monkeypatch):
    pytest.importorskip("fairseq_dnas.attention.triton.long", reason="triton is not installed")
    q, k, v, mask = _inputs()
    decision = dispatch.resolve(q, k, scheme="dnas", padding=True, dropout=_dropout(0.1), path="triton")
    assert (decision.path, decision.kernels, decision.dropout_p) == ("triton", "long", 0.1)
    assert decision.checked is None and decision.fallback is None
    calls = _count(monkeypatch)
    kernels.attend(q, k, v, scheme="dnas", padding_mask=mask, path="triton")
    assert calls == {"resolve": 1, "choose": 1, "dropout_p": 1, "dropout_active": 1, "attention_function": 1}


def test_a_switched_off_configuration_runs_the_fallback_without_resolving_again(monkeypatch, auto_triton_on_cpu):
    long = pytest.importorskip("fairseq_dnas.attention.triton.long", reason="triton is not installed")
    q, k, v, mask = _inputs()
    decision = dispatch.resolve(q, k, scheme="dnas", padding=True)
    auto_triton_on_cpu[decision.checked] = "switched off by the test"  # a verdict of an earlier failure
    monkeypatch.setattr(long, "triton_attention", lambda *a, **kw: pytest.fail("the kernels ran"))
    calls = _count(monkeypatch)
    out, _ = kernels.attend(q, k, v, scheme="dnas", padding_mask=mask)
    assert calls == {"resolve": 1, "choose": 1, "dropout_p": 1, "dropout_active": 1, "attention_function": 1,
                     "config_of": 1, "fallback_path": 1, "triton_usable": 1}
    expected, _ = kernels.attend(q, k, v, scheme="dnas", padding_mask=mask, path="dense")
    assert torch.equal(out, expected)


def test_an_unknown_dropout_stops_the_triton_path_before_any_kernel_is_imported(monkeypatch, auto_triton_on_cpu):
    q, k, v, mask = _inputs()
    calls = _count(monkeypatch)
    with pytest.raises(ValueError, match="needs its probability"):
        kernels.attend(q, k, v, scheme="dnas", padding_mask=mask, dropout=torch.nn.functional.dropout)
    assert calls["attention_function"] == 0


def test_the_former_name_of_the_long_kernels_is_an_error_saying_the_new_one():
    with pytest.raises(ValueError, match="'flash' is now called 'long'"):
        selection.attention_function("flash")
    with pytest.raises(ValueError, match="'flash' is now called 'long'"):
        selfcheck.Config("cuda", torch.float16, 64, "dnas", False, 1, True, False, "flash")
    with pytest.raises(ValueError, match="unknown Triton kernel set 'tiled'; choose one of short, long"):
        selection.attention_function("tiled")
    assert selection.PATHS.count("flash") == 1  # 'flash' stays the name of the CPU path, and only of it
