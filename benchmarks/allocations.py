"""Production's 2020 PL94 allocation against hdmm's, at the same rho, on the synthetic US from nation to block.

Run ``python benchmarks/allocations.py [--total-weights 60,0]``; it writes
``benchmarks/results/allocations.md``. Expected errors only (no data): per level, the RMSE per
PL94-2020 query and the standard deviation of a unit's total population, for production's
per-level strategies and shares (each level from its own measurements: production's noisy
measurements before its post-processing), hdmm's strategy with production's level shares, and
hdmm's with optimized level weights (census_workloads.allocations.compare_allocations). hdmm's
person strategy is optimized for the tables under a total-population row of the given weight
(0: the tables alone). The tree is the SYNTHETIC United States (census_workloads.geography: real
2010 state populations and counties per state, the 2020 numbers of tracts, block groups and
blocks, made-up units), whose shape is all the errors depend on.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    from census_workloads.allocations import compare_allocations, total_first
    from census_workloads.geography import LEVELS, us_tree
    from census_workloads.pl94_2020 import pl94_2020

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-weights", default="60,0")
    args = parser.parse_args()
    tree = us_tree(LEVELS)
    lines = ["# Production's 2020 PL94 allocation against hdmm's, at the same rho", "",
             f"`python benchmarks/allocations.py --total-weights {args.total_weights}` (module docstring). "
             f"Tree: {tree!r} (SYNTHETIC units).", ""]
    for weight in (float(w) for w in args.total_weights.split(",")):
        start = time.perf_counter()
        df = compare_allocations(tree, steer=None if weight == 0 else total_first(pl94_2020(), weight))
        seconds = time.perf_counter() - start
        lines += [f"## hdmm's strategy steered by a total-population row of weight {weight:g}", "",
                  f"{df.attrs['privacy']}; hdmm's person strategy {df.attrs['strategy']}; {seconds:.0f} s.", ""]
        columns = list(df.columns)
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        for row in df.itertuples(index=False):
            lines.append("| " + " | ".join(f"{v:,}" if isinstance(v, int) else f"{v:.3f}" if isinstance(v, float)
                                           else str(v) for v in row) + " |")
        lines.append("")
    lines += ["Production's columns are its noisy measurements' own errors (least squares from each level's "
              "measurements alone); its released tables add the levels above through the top-down constraint "
              "and then the bias of non-negativity and rounding. hdmm's are the least-squares errors of the "
              "whole tree (every level's measurements), before post-processing. State totals are invariant in "
              "production: their sd matters only without that invariant.", ""]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "allocations.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
