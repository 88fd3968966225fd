"""The ``hdmm`` command line.

``hdmm demo`` describes the Census SF1 Persons workload and its expected error under the
Identity strategy (every cell measured once) next to the SVD lower bound for any strategy.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np
import pandas as pd

from .bound import svd_bound
from .error import per_query_variance
from .matrix import Identity
from .privacy import ApproxDP, Privacy, PureDP


def _privacy(args: argparse.Namespace) -> Privacy:
    return PureDP(args.epsilon) if args.delta is None else ApproxDP(args.epsilon, args.delta)


def demo(args: argparse.Namespace) -> None:
    """Print the SF1 Persons workload's size, its Identity-strategy error and the SVD bound."""
    from census_workloads import cph_domain, sf1_persons

    privacy = _privacy(args)
    start = time.perf_counter()
    W = sf1_persons()
    domain = cph_domain()
    built = time.perf_counter()
    A = Identity(domain.size)
    variance = per_query_variance(W, A, privacy)
    bound = svd_bound(W, privacy)
    done = time.perf_counter()

    rmse = float(np.sqrt(variance.mean()))
    print(f"SF1 Persons workload: {W.shape[0]:,} queries over {domain.size:,} cells")
    print("  domain: " + " x ".join(f"{n} ({s})" for n, s in zip(domain.names, domain.shape)))
    print(f"  privacy: {privacy.description}")
    print(f"Identity strategy: RMSE per query {rmse:.3f}")
    print(f"SVD lower bound (any strategy): RMSE {bound.rmse:.3f} ({'exact' if bound.exact else 'estimate'})")
    print(f"  Identity is {rmse / bound.rmse:.2f}x the bound")
    print()
    rows, start_row = [], 0
    for name, table in zip(W.names, W.blocks):
        v = variance[start_row : start_row + table.shape[0]]
        rows.append({"table": name, "queries": table.shape[0], "rmse": float(np.sqrt(v.mean()))})
        start_row += table.shape[0]
    print(pd.DataFrame(rows).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print()
    sample = np.linspace(0, W.shape[0] - 1, 6).astype(int)
    print("Sample queries (standard error under Identity):")
    for i in sample:
        print(f"  {W.labels[i]:<60s} {np.sqrt(variance[i]):8.3f}")
    print(f"\nbuilt in {built - start:.3f} s; error and bound in {done - built:.3f} s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hdmm", description="The High-Dimensional Matrix Mechanism.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="SF1 Persons: workload size, Identity error and the SVD bound")
    p.add_argument("--epsilon", type=float, default=1.0, help="privacy budget epsilon (default 1)")
    p.add_argument("--delta", type=float, default=None, help="delta for (epsilon, delta)-DP (default: pure DP)")
    p.set_defaults(run=demo)
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except ValueError as exc:
        print(f"hdmm: error: {exc}", file=sys.stderr)
        return 2
    return 0
