"""Appendix E of the paper: doubly-normalized attention alleviates mode collapse.

Self-attention with Q = K = V = I moves every point to an attention-weighted
mean of all points: Eq. (3) for UNAS, Eq. (7)-(8) for DNAS. The attention
weights come from ``fairseq_dnas.attention_probs``, the plugin's own math, on
the scores s_ij = x_i . x_j (the paper's q_i^T k_j, no 1/sqrt(d)). The
paper's Gaussian form of (7) with priors beta_i ~ exp(q_i^T q_i / 2) is this
dot product: the remaining factor exp(-k_j^T k_j / 2) cancels in the column
normalization, as alpha_j ~ exp(k_j^T k_j / 2) does in Eq. (2).

1-D: N0 points at a, N1 at -a. Within a cluster the unnormalized weight is
t = 1, across s = exp(-2 a^2) (relative to t). With r = N0 / N1, one step
brings the centres to the distances

    UNAS, Eq. (13): 2 r (1 - s^2) a / ((1 + r s) (r + s))
    DNAS, Eq. (14): 2 q r (1 - s^2) a / ((q + r s) (r + s q)),  q = (r + s) / (r s + 1)

(derivation: c0 = (r - s q) a / (r + s q), c1 = (r s - q) a / (r s + q) for
DNAS; q = 1 turns these into UNAS's c0 = (r - s) a / (r + s),
c1 = (r s - 1) a / (r s + 1)).
"""

import math
from contextlib import contextmanager
from typing import Dict, List

import numpy as np
import torch

from fairseq_dnas.attention.functional import attention_probs

SCHEMES = ("unas", "dnas")


def _s(a):
    return math.exp(-2.0 * a * a)  # cross-cluster weight relative to t = 1


def unas_distance(r: float, a: float) -> float:
    """Eq. (13): centre distance after one UNAS step."""
    s = _s(a)
    return 2.0 * r * (1.0 - s * s) * a / ((1.0 + r * s) * (r + s))


def dnas_distance(r: float, a: float) -> float:
    """Eq. (14): centre distance after one DNAS step."""
    s = _s(a)
    q = (r + s) / (r * s + 1.0)
    return 2.0 * q * r * (1.0 - s * s) * a / ((q + r * s) * (r + s * q))


ANALYTIC = {"unas": unas_distance, "dnas": dnas_distance}


@contextmanager
def single_thread():
    """The matrices here are tiny: thread start-up costs far more than it saves
    (20x slower with 2 busy cores)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def attention_step(x: np.ndarray, scheme: str) -> np.ndarray:
    """One self-attention step with Q = K = V = I on points x (N, d), float64."""
    xt = torch.as_tensor(x, dtype=torch.float64)
    scores = (xt @ xt.T)[None, None]  # (1, 1, N, N): s_ij = q_i . k_j
    probs = attention_probs(scores, scheme)[0, 0]  # UNAS Eq. (3) / DNAS Eq. (7)-(8)
    return (probs @ xt).numpy()


def two_clusters_1d(n0: int, n1: int, a: float, spread: float = 0.0, seed: int = 0) -> np.ndarray:
    """N0 points at a and N1 at -a (plus Gaussian noise of std ``spread``), shape (N, 1)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.full(n0, a), np.full(n1, -a)])
    if spread > 0:
        x = x + rng.normal(0.0, spread, size=x.shape)
    return x[:, None]


def simulated_distance(n0: int, n1: int, a: float, scheme: str, spread: float = 0.0, seed: int = 0) -> float:
    """Distance between the two cluster means after one step (1-D)."""
    y = attention_step(two_clusters_1d(n0, n1, a, spread, seed), scheme)[:, 0]
    return float(y[:n0].mean() - y[n0:].mean())


def distance_curve(a: float, n1: int = 10, n0_max: int = 100, spread: float = 0.05, seed: int = 0) -> List[dict]:
    """Rows for r = N0 / N1 = 1/n1, 2/n1, ..., n0_max/n1 (with n1 = 10 and
    n0_max = 100: r = 0.1 ... 10 in steps of 0.1, every integer 1..10 included)."""
    rows = []
    with single_thread():
        for n0 in range(1, n0_max + 1):
            rows.append(_curve_row(a, n0, n1, spread, seed))
    return rows


def _curve_row(a, n0, n1, spread, seed) -> dict:
    r = n0 / n1
    row = {"a": a, "r": round(r, 6), "N0": n0, "N1": n1, "initial_distance": 2 * a}
    for scheme in SCHEMES:
        row[f"{scheme}_eq{13 if scheme == 'unas' else 14}"] = ANALYTIC[scheme](r, a)
        row[f"{scheme}_simulated"] = simulated_distance(n0, n1, a, scheme)
        row[f"{scheme}_simulated_spread"] = simulated_distance(n0, n1, a, scheme, spread, seed + n0)
    return row


CURVE_FIELDS = [
    "a", "r", "N0", "N1", "initial_distance",
    "unas_eq13", "unas_simulated", "unas_simulated_spread",
    "dnas_eq14", "dnas_simulated", "dnas_simulated_spread",
]


def gaussian_clusters_2d(sizes=(500, 50), centres=((1.8, 0.7), (-1.0, -1.0)), variance=0.1, seed=0):
    """Points of two Gaussian clusters (Figure 6: 500 at [1.8, 0.7], 50 at
    [-1, -1], covariance 0.1 I) and each point's cluster label."""
    rng = np.random.default_rng(seed)
    xs, labels = [], []
    for k, (n, c) in enumerate(zip(sizes, centres)):
        xs.append(rng.normal(0.0, math.sqrt(variance), size=(n, 2)) + np.asarray(c))
        labels.append(np.full(n, k))
    return np.concatenate(xs), np.concatenate(labels)


def iterate(x: np.ndarray, scheme: str, steps: int = 4) -> List[np.ndarray]:
    """[x, step 1, ..., step ``steps``] of repeated self-attention."""
    out = [x]
    for _ in range(steps):
        out.append(attention_step(out[-1], scheme))
    return out


def centre_distance(x: np.ndarray, labels: np.ndarray) -> float:
    """Distance between the means of the two original clusters."""
    return float(np.linalg.norm(x[labels == 0].mean(0) - x[labels == 1].mean(0)))


def spread(x: np.ndarray, labels: np.ndarray) -> float:
    """Mean distance of a point to its own cluster's mean."""
    d = [np.linalg.norm(x[labels == k] - x[labels == k].mean(0), axis=1) for k in (0, 1)]
    return float(np.concatenate(d).mean())


def run_2d(sizes, steps: int = 4, seed: int = 0) -> Dict[str, object]:
    """Both schemes on the same points: trajectories and per-step distances."""
    x, labels = gaussian_clusters_2d(sizes=sizes, seed=seed)
    with single_thread():
        trajectories = {scheme: iterate(x, scheme, steps) for scheme in SCHEMES}
    rows = []
    for scheme, traj in trajectories.items():
        for step, xs in enumerate(traj):
            rows.append({
                "case": f"{sizes[0]}/{sizes[1]}", "scheme": scheme, "step": step,
                "centre_distance": centre_distance(xs, labels), "within_cluster_spread": spread(xs, labels),
            })
    return {"labels": labels, "trajectories": trajectories, "rows": rows}
