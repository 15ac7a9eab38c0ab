"""Appendix E: Eq. (13)/(14) against the simulation with the plugin's own
attention, the 2-D collapse of Figures 6-9, and fairseq_dnas/commands/mode_collapse.py."""

import csv
import math
import os

import numpy as np
import pytest
from helpers import ROOT, run

from fairseq_dnas.analysis import mode_collapse as MC

COMMAND = ["-m", "fairseq_dnas.commands.mode_collapse"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _by_hand(n0, n1, a, scheme):
    """One step on the two 1-D point masses, written out with numpy (no
    plugin code): the paper's derivation before simplification."""
    x = np.concatenate([np.full(n0, a), np.full(n1, -a)])
    z = np.exp(np.outer(x, x))  # Q = K = I, s_ij = x_i x_j
    if scheme == "dnas":
        z = z / z.sum(axis=0, keepdims=True)  # Eq. (7): normalize each key over the queries
    p = z / z.sum(axis=1, keepdims=True)  # Eq. (3) / (8): normalize each query over the keys
    y = p @ x
    return y[:n0].mean() - y[n0:].mean()


@pytest.mark.parametrize("a", [0.3, 0.5, 1.0, 1.5])
@pytest.mark.parametrize("n0, n1", [(1, 10), (10, 10), (25, 10), (100, 10), (7, 3), (3, 40)])
def test_simulation_matches_eq_13_and_14(a, n0, n1):
    r = n0 / n1
    for scheme, eq in (("unas", MC.unas_distance), ("dnas", MC.dnas_distance)):
        simulated = MC.simulated_distance(n0, n1, a, scheme)
        assert simulated == pytest.approx(eq(r, a), rel=1e-10)
        assert simulated == pytest.approx(_by_hand(n0, n1, a, scheme), rel=1e-10)


def test_equations_against_the_papers_unsimplified_centres():
    """Eq. (13)/(14) equal c0 - c1 as first written in Appendix E (with N0, N1, s, t)."""
    for a in (0.5, 1.0):
        s, t = math.exp(-2 * a * a), 1.0
        for n0, n1 in ((3, 7), (50, 5), (12, 12)):
            c0u = (n0 * t - n1 * s) / (n0 * t + n1 * s) * a
            c1u = (n0 * s - n1 * t) / (n1 * t + n0 * s) * a
            assert MC.unas_distance(n0 / n1, a) == pytest.approx(c0u - c1u, rel=1e-12)
            big_a, big_b = n0 * t + n1 * s, n0 * s + n1 * t
            c0d = (n0 * t * big_b - n1 * s * big_a) / (n0 * t * big_b + n1 * s * big_a) * a
            c1d = (n0 * s * big_b - n1 * t * big_a) / (n0 * s * big_b + n1 * t * big_a) * a
            assert MC.dnas_distance(n0 / n1, a) == pytest.approx(c0d - c1d, rel=1e-12)


def test_dnas_keeps_clusters_further_apart():
    """Figure 7's reading: DNAS upper-bounds UNAS, equal at r = 1, and the
    ratio DNAS / UNAS grows with the imbalance (the absolute gap for a = 0.5
    peaks near r = 7, as both distances shrink); both stay below 2a."""
    for a in (0.5, 1.0):
        ratios = []
        for r in np.arange(0.1, 10.01, 0.1):
            u, d = MC.unas_distance(r, a), MC.dnas_distance(r, a)
            assert 0 < u <= d + 1e-15 < 2 * a
            ratios.append(d / u)
        assert ratios[9] == pytest.approx(1.0, abs=1e-12)  # r = 1
        assert all(q2 > q1 for q1, q2 in zip(ratios[9:], ratios[10:]))  # r > 1
        assert all(q2 < q1 for q1, q2 in zip(ratios[:9], ratios[1:10]))  # r < 1


def test_simulation_with_spread_clusters_is_close():
    """Real clusters (std 0.05) land near the point-mass formulas."""
    for a in (0.5, 1.0):
        for n0 in (10, 30, 80):
            for scheme, eq in (("unas", MC.unas_distance), ("dnas", MC.dnas_distance)):
                got = MC.simulated_distance(n0, 10, a, scheme, spread=0.05, seed=n0)
                assert got == pytest.approx(eq(n0 / 10, a), rel=0.1)


def test_two_dimensional_collapse():
    """Figures 6 and 9: with 500/50 points UNAS merges the clusters within 4
    steps, DNAS keeps them apart; Figure 8: balanced clusters stay apart."""
    unbalanced = {(r["scheme"], r["step"]): r["centre_distance"] for r in MC.run_2d((500, 50))["rows"]}
    assert unbalanced[("unas", 0)] == unbalanced[("dnas", 0)] > 3.0
    assert unbalanced[("unas", 4)] < 0.1
    assert unbalanced[("dnas", 4)] > 2.5
    balanced = {(r["scheme"], r["step"]): r["centre_distance"] for r in MC.run_2d((225, 225))["rows"]}
    assert balanced[("unas", 4)] > 2.5 and balanced[("dnas", 4)] > 2.5


def test_script_writes_curves_and_pictures(tmp_path):
    out = tmp_path / "mc"
    proc = run(["python", *COMMAND, "--out", out])
    for name in ("center_distance.png", "collapse_500_50.png", "collapse_225_225.png"):
        with open(out / name, "rb") as f:
            assert f.read(8) == PNG_MAGIC
    with open(out / "center_distance.csv") as f:
        rows = list(csv.DictReader(f))
    for a in (0.5, 1.0):
        sel = [r for r in rows if float(r["a"]) == a]
        rs = [float(r["r"]) for r in sel]
        assert set(range(1, 11)) <= set(rs)  # every integer r from 1 to 10
        for r in sel:
            assert float(r["unas_simulated"]) == pytest.approx(float(r["unas_eq13"]), rel=1e-9)
            assert float(r["dnas_simulated"]) == pytest.approx(float(r["dnas_eq14"]), rel=1e-9)
    with open(out / "collapse_2d.csv") as f:
        rows_2d = list(csv.DictReader(f))
    assert len(rows_2d) == 2 * 2 * 5  # cases x schemes x steps 0..4
    assert "500/50 UNAS" in proc.stdout and "Eq.13" in proc.stdout


def test_script_rejects_bad_arguments(tmp_path):
    proc = run(["python", *COMMAND, "--out", tmp_path / "mc", "--steps", "0"], check=False)
    assert proc.returncode == 2 and "--steps must be at least 1" in proc.stderr
    assert not (tmp_path / "mc").exists()
