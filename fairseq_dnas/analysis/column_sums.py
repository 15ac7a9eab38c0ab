"""How much attention each key receives: sum_i pi_ij (Definition 1, Theorem 2).

A key (lower-layer neuron) j is epsilon-"explained away" when
sum_i pi_ij < epsilon, the sum running over the real queries i (Definition 1;
the paper uses epsilon = 1e-8 and plots log_e of the sum, Figure 1). For DNAS,
Theorem 2 gives sum_i pi_ij >= 1 / T_k for T_k real keys (its proof bounds
each row sum of xi by the number of keys), i.e. T_k * sum_i pi_ij >= 1; in
self-attention T_k = T_q. HNAS mixes linearly: sum_i pi_H >= u / T_k.

Statistics are streamed into fixed log-space bins, so a whole split fits in
constant memory; counts below epsilon and minima are exact.
"""

from typing import Optional

import numpy as np
import torch
from torch import Tensor

EPSILON = 1e-8  # Definition 1, as in the paper
# log_e(sum) bins. float32 probabilities underflow to 0 below about e^-103.3;
# exact zeros are counted apart (their log is -inf).
BIN_LO, BIN_HI, BIN_WIDTH = -110.0, 10.0, 0.05
EDGES = np.linspace(BIN_LO, BIN_HI, int(round((BIN_HI - BIN_LO) / BIN_WIDTH)) + 1)


def column_sums(probs: Tensor, query_pad: Optional[Tensor], key_pad: Optional[Tensor]):
    """Column sums over real queries, for real keys only.

    Args:
        probs: (H, B, T_q, T_k) attention probabilities.
        query_pad, key_pad: (B, T_q), (B, T_k), True at padding (or None).

    Returns:
        (sums, scaled): two float64 numpy arrays of shape (H, N), N the number
        of real keys in the batch; ``scaled`` is T_k * sum with T_k the real
        length of each key's own sentence.
    """
    heads, batch, t_q, t_k = probs.shape
    p = probs.detach().double()
    if query_pad is not None:
        p = p.masked_fill(query_pad.bool()[None, :, :, None], 0.0)
    sums = p.sum(dim=2)  # (H, B, T_k)
    real_k = torch.ones(batch, t_k, dtype=torch.bool, device=p.device) if key_pad is None else ~key_pad.bool()
    n_keys = real_k.sum(dim=1).to(sums.dtype)  # (B,)
    scaled = sums * n_keys[None, :, None]
    return sums[:, real_k].cpu().numpy(), scaled[:, real_k].cpu().numpy()


class ColumnStats:
    """Running statistics of sum_i pi_ij for one attention module, per head."""

    def __init__(self, heads: int, epsilon: float = EPSILON):
        self.epsilon = epsilon
        self.counts = np.zeros((heads, len(EDGES) - 1), dtype=np.int64)
        self.n = np.zeros(heads, dtype=np.int64)
        self.below = np.zeros(heads, dtype=np.int64)  # epsilon-explained away
        self.zeros = np.zeros(heads, dtype=np.int64)  # sum underflowed to 0
        self.min_scaled = np.full(heads, np.inf)
        self.min_log = np.full(heads, np.inf)
        self.max_log = np.full(heads, -np.inf)

    def add(self, sums: np.ndarray, scaled: np.ndarray) -> None:
        """sums, scaled: (H, N) from ``column_sums``."""
        if sums.shape[1] == 0:
            return
        with np.errstate(divide="ignore"):
            logs = np.log(sums)
        self.n += sums.shape[1]
        self.below += (sums < self.epsilon).sum(axis=1)
        self.zeros += (sums <= 0).sum(axis=1)
        self.min_scaled = np.minimum(self.min_scaled, scaled.min(axis=1))
        for h in range(sums.shape[0]):
            finite = logs[h][np.isfinite(logs[h])]
            if finite.size:
                self.min_log[h] = min(self.min_log[h], finite.min())
                self.max_log[h] = max(self.max_log[h], finite.max())
                clipped = np.clip(finite, BIN_LO, BIN_HI - 1e-9)
                self.counts[h] += np.histogram(clipped, bins=EDGES)[0]

    def pooled_counts(self) -> np.ndarray:
        """Histogram over all heads (zeros not included)."""
        return self.counts.sum(axis=0)

    def median_log(self) -> float:
        """Median of log sum over all heads and keys (to the bin width)."""
        total = int(self.n.sum())
        if total == 0:
            return float("nan")
        half = (total + 1) / 2
        zeros = int(self.zeros.sum())  # log 0 = -inf: below every bin
        if zeros >= half:
            return float("-inf")
        k = int(np.searchsorted(np.cumsum(self.pooled_counts()) + zeros, half))
        return float((EDGES[k] + EDGES[k + 1]) / 2)

    def summary(self) -> dict:
        total = int(self.n.sum())
        return {
            "keys": total,
            "explained_away": int(self.below.sum()),
            "fraction_explained_away": float(self.below.sum() / total) if total else float("nan"),
            "zero_sums": int(self.zeros.sum()),
            "min_T_times_sum": float(self.min_scaled.min()) if total else float("nan"),
            "min_log_sum": float(self.min_log.min()) if total else float("nan"),
            "median_log_sum": round(self.median_log(), 4),
            "max_log_sum": float(self.max_log.max()) if total else float("nan"),
            "per_head_fraction": [float(b / n) if n else float("nan") for b, n in zip(self.below, self.n)],
            "per_head_min_T_times_sum": [float(m) for m in self.min_scaled],
        }
