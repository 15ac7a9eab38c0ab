#!/usr/bin/env python
"""Reproduce Appendix E of the paper: UNAS attention collapses clusters
("modes") faster than DNAS (Figures 6-9 and Eq. (13)/(14)).

Self-attention with Q = K = V = I moves every point to an attention-weighted
mean of all points (UNAS: Eq. (3); DNAS: Eq. (7)-(8)), using this plugin's
own attention functions in float64.

1. Figure 7: two 1-D clusters, N0 points at a and N1 points at -a. After
   one step their centres are Eq. (13) (UNAS) and Eq. (14) (DNAS) apart.
   For a = 0.5 and a = 1 and r = N0/N1 = 0.1, 0.2, ..., 10 (N1 = 10) the
   analytic values are written beside two simulations: points exactly at
   +-a (the paper's assumption; equal to the formulas up to rounding) and
   clusters with a spread (std 0.05). -> center_distance.csv / .png
2. Figures 6 and 9: 500 points around [1.8, 0.7] and 50 around [-1, -1]
   (covariance 0.1 I), 4 steps: UNAS collapses to one cluster, DNAS keeps
   two. Figure 8: 225/225, where both behave alike.
   -> collapse_500_50.png, collapse_225_225.png, collapse_2d.csv

Example:
    python -m fairseq_dnas.commands.mode_collapse --out analysis/mode_collapse

Runs in a few seconds on a CPU. Exit status 0 on success, 2 for bad arguments.
"""

import argparse
import os
import sys

from fairseq_dnas.analysis import mode_collapse as MC
from fairseq_dnas.analysis.files import write_csv


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the pictures and CSV files")
    parser.add_argument("--a", type=float, nargs="+", default=[0.5, 1.0],
                        help="half distances between the 1-D clusters (default: 0.5 1, as Figure 7)")
    parser.add_argument("--steps", type=int, default=4, help="self-attention steps in 2-D (default: 4)")
    parser.add_argument("--spread", type=float, default=0.05,
                        help="std of the 1-D clusters in the second simulation (default: 0.05)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the sampled points")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if any(a <= 0 for a in args.a):
        parser.error("--a values must be positive")
    if args.spread < 0:
        parser.error("--spread must be >= 0")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from fairseq_dnas.analysis.plots import plot_distance_curves, plot_trajectories

    os.makedirs(args.out, exist_ok=True)
    curve = [row for a in args.a for row in MC.distance_curve(a, spread=args.spread, seed=args.seed)]
    write_csv(os.path.join(args.out, "center_distance.csv"), curve, MC.CURVE_FIELDS)
    plot_distance_curves(curve, os.path.join(args.out, "center_distance.png"))
    print("1-D, one step: distance between the cluster centres (before: 2a)")
    print(f"{'a':>4} {'r':>5} {'UNAS Eq.13':>11} {'simulated':>10} {'DNAS Eq.14':>11} {'simulated':>10}")
    for row in curve:
        if row["r"] in (0.5, 1, 2, 5, 10):
            print(f"{row['a']:>4g} {row['r']:>5g} {row['unas_eq13']:>11.5f} {row['unas_simulated']:>10.5f} "
                  f"{row['dnas_eq14']:>11.5f} {row['dnas_simulated']:>10.5f}")

    rows_2d = []
    for sizes in ((500, 50), (225, 225)):
        result = MC.run_2d(sizes, steps=args.steps, seed=args.seed)
        rows_2d += result["rows"]
        plot_trajectories(result, sizes, os.path.join(args.out, f"collapse_{sizes[0]}_{sizes[1]}.png"))
    write_csv(os.path.join(args.out, "collapse_2d.csv"), rows_2d,
              ["case", "scheme", "step", "centre_distance", "within_cluster_spread"])
    print("\n2-D: distance between the means of the two original clusters")
    for case in ("500/50", "225/225"):
        for scheme in MC.SCHEMES:
            d = [r["centre_distance"] for r in rows_2d if r["case"] == case and r["scheme"] == scheme]
            print(f"{case:>8} {scheme.upper()}: " + "  ".join(f"step {k}: {v:.3f}" for k, v in enumerate(d)))
    print(f"\nwrote {args.out}/center_distance.csv, center_distance.png, collapse_2d.csv, "
          "collapse_500_50.png, collapse_225_225.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
