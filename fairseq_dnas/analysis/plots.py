"""The pictures (matplotlib, Agg backend: no display needed).

Colours follow the paper: UNAS blue, DNAS red; HNAS green.
"""

import logging
import math
from typing import List, Sequence

# fairseq's import leaves the root logger at DEBUG; keep matplotlib's chatter out.
logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fairseq_dnas.analysis.column_sums import EDGES  # noqa: E402
from fairseq_dnas.analysis.files import save_figure  # noqa: E402

SCHEME_COLOURS = {"unas": "tab:blue", "dnas": "tab:red", "hnas": "tab:green"}
SCHEME_NAMES = {
    "unas": "UNAS (softmax over keys)",
    "dnas": "DNAS (doubly normalized)",
    "hnas": "HNAS (mixture u*DNAS + (1-u)*UNAS)",
}
ATTENTION_TITLES = {
    "encoder_self": "encoder self-attention",
    "decoder_cross": "decoder cross-attention (UNAS in every model; queries: target, keys: source)",
    "decoder_self": "decoder self-attention (UNAS, causal: key j is seen only by queries i >= j)",
}


def _grid(n):
    """(rows, columns) for n panels: 2 x 2 for 4 layers, 3 x 4 for 12."""
    cols = 2 if n <= 4 else 3 if n <= 9 else 4
    cols = min(cols, n)
    return int(math.ceil(n / cols)), cols


# --- hybrid weights (Figures 3-5) --------------------------------------------


def plot_hybrid_weights(weights, labels: Sequence[str], path: str) -> None:
    """u per encoder layer: mean over heads (line) and per-head spread (band
    from min to max, dots for single heads), one line per checkpoint."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colours = plt.cm.viridis(np.linspace(0.0, 0.85, len(weights))) if len(weights) > 1 else ["tab:green"]
    for w, label, colour in zip(weights, labels, colours):
        layers = np.arange(1, len(w.layers) + 1)
        u = np.asarray(w.layers)  # (L, H)
        ax.plot(layers, u.mean(1), "-o", color=colour, label=label, zorder=3)
        ax.fill_between(layers, u.min(1), u.max(1), color=colour, alpha=0.15, lw=0)
        for layer, heads in zip(layers, u):
            ax.scatter(np.full(len(heads), layer), heads, s=8, color=colour, alpha=0.5, zorder=2)
    inits = {w.hybrid_init for w in weights if w.hybrid_init is not None}
    values = [u for w in weights for heads in w.layers for u in heads]
    if len(inits) == 1:
        init = inits.pop()
        ax.axhline(init, color="grey", ls=":", lw=1, label=f"initial u = {init:g}")
        values.append(init)
    # Zoom on the values (short runs move u little), within [0, 1].
    ax.set_ylim(max(0.0, min(values) - 0.05), min(1.0, max(values) + 0.05))
    ax.set_xticks(np.arange(1, max(len(w.layers) for w in weights) + 1))
    ax.set_xlabel("encoder layer (1 = bottom, next to the embeddings)")
    ax.set_ylabel("hybrid weight u  (0 = UNAS, 1 = DNAS)")
    ax.set_title("HNAS: learned weight of DNAS per encoder layer\n(line: mean over heads; band and dots: the heads)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    save_figure(fig, path)


# --- explaining away (Figure 1) ----------------------------------------------


def _coarse(counts: np.ndarray, factor: int):
    n = len(counts) // factor * factor
    return counts[:n].reshape(-1, factor).sum(1), EDGES[: n + 1 : factor]


def model_colours(schemes: Sequence[str]) -> list:
    """One colour per model, the same in every figure: its encoder scheme's
    colour, or another one when two models share a scheme."""
    spare = iter(["tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"] * 10)
    used, out = set(), []
    for scheme in schemes:
        colour = SCHEME_COLOURS.get(scheme)
        if colour is None or colour in used:
            colour = next(spare)
        used.add(colour)
        out.append(colour)
    return out


def plot_column_sums(models, kind: str, path: str, epsilon: float) -> bool:
    """Histograms of log_e(sum_i pi_ij) per layer of one attention kind,
    one step histogram per model (fraction of keys, so that models compare).

    ``models``: list of (label, encoder scheme, recorder). HNAS encoder layers
    show the mixture the model uses. Returns False when no model has this
    kind of attention (nothing drawn).
    """
    layers = sorted({k[1] for _, _, rec in models for k in rec.stats if k[0] == kind})
    if not layers:
        return False
    colours = model_colours([scheme for _, scheme, _ in models])
    log_eps = math.log(epsilon)
    lo, hi = log_eps, 0.0
    for _, _, rec in models:
        for key, st in rec.stats.items():
            if key[0] == kind and np.isfinite(st.min_log).any():
                lo, hi = min(lo, st.min_log.min()), max(hi, st.max_log.max())
    lo, hi = lo - 2, hi + 1
    rows, cols = _grid(len(layers))
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, layer in zip(axes.flat, layers):
        for (label, scheme, rec), colour in zip(models, colours):
            component = ("mixture" if scheme == "hnas" else scheme) if kind == "encoder_self" else "unas"
            st = rec.stats.get((kind, layer, component))
            if st is None or not st.n.sum():
                continue
            total = int(st.n.sum())
            counts, edges = _coarse(st.pooled_counts(), 10)  # 0.5-wide bins
            frac = counts / total
            pct = 100 * st.summary()["fraction_explained_away"]
            # Decoder attention is UNAS in every model: name the model, not a scheme.
            name = label if kind == "encoder_self" else f"{label} model"
            ax.stairs(frac, edges, color=colour, lw=1.4, label=f"{name}: {pct:.1f}% below eps")
            ax.stairs(frac, edges, color=colour, alpha=0.12, fill=True)
            zeros = int(st.zeros.sum())
            if zeros:  # log(0) = -inf: shown as a bar at the left edge
                ax.bar(lo + 0.25, zeros / total, width=0.5, color=colour, alpha=0.6)
        ax.axvline(log_eps, color="black", ls="--", lw=1)
        ax.text(log_eps, 0.5, f"eps = {epsilon:g} ", fontsize=7, rotation=90, ha="right", va="center",
                transform=ax.get_xaxis_transform())
        ax.set_xlim(lo, hi)
        ax.set_title(f"layer {layer + 1}" + (" (bottom)" if layer == 0 else ""), fontsize=9)
        ax.set_xlabel("log_e( sum_i pi_ij ): total attention key j receives", fontsize=8)
        ax.set_ylabel("fraction of keys (all heads)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6.5, loc="best")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(layers):]:
        ax.axis("off")
    fig.suptitle(
        f"Explaining away in {ATTENTION_TITLES.get(kind, kind)}\n"
        "keys left of the dashed line receive almost no attention (eps-explained away, Definition 1);\n"
        "percentages: share of such keys; sums that underflow to 0 are drawn at the left edge",
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path)
    return True


# --- mode collapse (Appendix E, Figures 6-9) ---------------------------------


def plot_distance_curves(rows: List[dict], path: str) -> None:
    """Figure 7: centre distance after one step against r = N0 / N1."""
    values_of_a = sorted({row["a"] for row in rows})
    fig, axes = plt.subplots(1, len(values_of_a), figsize=(5.5 * len(values_of_a), 4.2), squeeze=False)
    for ax, a in zip(axes.flat, values_of_a):
        sel = [row for row in rows if row["a"] == a]
        r = np.array([row["r"] for row in sel])
        ax.plot(r, [row["unas_eq13"] for row in sel], "-", color=SCHEME_COLOURS["unas"], label="UNAS, Eq. (13)")
        ax.plot(r, [row["dnas_eq14"] for row in sel], "--", color=SCHEME_COLOURS["dnas"], label="DNAS, Eq. (14)")
        integer = np.isclose(r, np.round(r))
        for scheme, marker in (("unas", "o"), ("dnas", "s")):
            sim = np.array([row[f"{scheme}_simulated_spread"] for row in sel])
            ax.plot(r[integer], sim[integer], marker, ms=4, mfc="none", color=SCHEME_COLOURS[scheme],
                    label=f"{scheme.upper()}, simulated (clusters with std 0.05)")
        ax.axhline(2 * a, color="grey", ls=":", lw=1, label=f"distance before the step (2a = {2 * a:g})")
        ax.set_xlabel("cluster size ratio r = N0 / N1")
        ax.set_ylabel("distance between cluster centres after one step")
        ax.set_title(f"a = {a:g}: clusters at +a (N0 points) and -a (N1 points)", fontsize=10)
        ax.set_ylim(0, 2 * a * 1.08)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5)
    fig.suptitle("One step of self-attention pulls two clusters together; DNAS less so (Appendix E)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)


def plot_trajectories(result: dict, sizes, path: str) -> None:
    """Figures 6, 8, 9: the points after 0..steps self-attention steps,
    UNAS in the top row, DNAS in the bottom row."""
    trajectories, labels = result["trajectories"], result["labels"]
    steps = len(next(iter(trajectories.values())))
    fig, axes = plt.subplots(2, steps, figsize=(2.6 * steps, 5.6), sharex=True, sharey=True)
    colours = np.where(labels == 0, "tab:red", "tab:blue")
    for row, scheme in enumerate(("unas", "dnas")):
        for step, x in enumerate(trajectories[scheme]):
            ax = axes[row, step]
            for k, name in ((0, f"{sizes[0]} points around (1.8, 0.7)"), (1, f"{sizes[1]} points around (-1, -1)")):
                sel = labels == k
                ax.scatter(x[sel, 0], x[sel, 1], s=5, c=colours[sel], alpha=0.6, label=name)
            ax.set_title(f"{scheme.upper()}, step {step}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if row == 1:
                ax.set_xlabel("x1", fontsize=8)
            if step == 0:
                ax.set_ylabel("x2", fontsize=8)
    axes[0, 0].legend(fontsize=6.5, loc="lower right", markerscale=2)
    fig.suptitle(
        f"Repeated self-attention (Q = K = V = I) on two clusters of {sizes[0]} and {sizes[1]} points:\n"
        "UNAS (top) against DNAS (bottom)", fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path)


# --- faithfulness (the thesis's Figure 6.1) ----------------------------------


def plot_tau_histograms(series, path: str, what: str = "") -> None:
    """Histograms of Kendall's tau between attention and gradient importance
    per test sentence, one step histogram per model (fraction of its
    sentences, so that models compare), its mean dashed.

    ``series``: list of (label, encoder scheme or None, taus)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    colours = model_colours([scheme or "" for _, scheme, _ in series])
    edges = np.linspace(-1.0, 1.0, 41)
    top = 0.0
    for (label, _, taus), colour in zip(series, colours):
        taus = np.asarray(taus, dtype=np.float64)
        if not len(taus):
            continue
        counts, _ = np.histogram(taus, bins=edges)
        frac = counts / len(taus)
        top = max(top, frac.max())
        ax.stairs(frac, edges, color=colour, lw=1.4,
                  label=f"{label}: mean {taus.mean():.3f} +- {taus.std():.3f} (n={len(taus)})")
        ax.stairs(frac, edges, color=colour, alpha=0.12, fill=True)
        ax.axvline(taus.mean(), color=colour, ls="--", lw=1)
    ax.axvline(0.0, color="grey", ls=":", lw=1)
    ax.set_xlim(-1, 1)
    ax.set_ylim(0, (top or 1.0) * (1.25 + 0.08 * len(series)))  # room for the legend above the bars
    ax.set_xlabel("Kendall's tau-b between attention received and gradient importance")
    ax.set_ylabel("fraction of test sentences")
    ax.set_title(f"Is attention an explanation?{what}\n(per sentence; dashed: the mean; right = attention "
                 "ranks tokens as the gradient does)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    save_figure(fig, path)
