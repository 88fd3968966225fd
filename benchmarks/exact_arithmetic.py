"""Cost of exact arithmetic in hdmm.measure (issue 22, item 5): one BLAS thread, min of repeats.

Run ``python benchmarks/exact_arithmetic.py`` on this branch, and with ``PYTHONPATH`` pointing at a
checkout of the code before exact arithmetic for the "before" column: it times ``hdmm.measure``
(plan made once, outside the timing) on Poisson counts of the given mean per cell.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

import hdmm
from hdmm.optimizers import opt0, opt_kron


def best(f, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def cases():
    W = hdmm.AllRange(256)
    yield "opt0(AllRange(256))", W, opt0(W, hdmm.PureDP(1.0), seed=0)
    from census_workloads import sf1_persons
    sf1 = sf1_persons()
    yield "SF1 persons (opt_kron)", sf1, opt_kron(sf1, hdmm.PureDP(1.0), seed=0)


def main():
    rng = np.random.default_rng(0)
    with threadpool_limits(1):
        for name, W, A in cases():
            p = hdmm.plan(W, A, hdmm.PureDP(1.0))
            for scale in (1e6, 1e8):
                x = rng.poisson(scale, W.shape[1]).astype(float)
                measure = best(lambda: hdmm.measure(p, x, rng=0))
                print(f"| {name} | {W.shape[1]:,} cells, {p.strategy.shape[0]:,} rows | {scale:.0e} | "
                      f"{measure * 1e3:.2f} ms |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
