"""Foundation benchmark: SF1 Persons and SF1 x 51 states, implicit all the way.

For each workload, in a fresh process (so peak memory is its own): time to build the
workload, time for ``W @ x`` on a synthetic data vector, time for the Identity strategy's
expected error, time for the SVD lower bound, and the process's peak resident memory.

Targets (2-core machine): SF1 Persons everything under 0.5 s and 300 MB; SF1 x states
``W @ x`` under 5 s and 2 GB.

Run: ``python benchmarks/foundation.py`` (prints a markdown table).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import time


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(case: str, queue: mp.Queue) -> None:
    import numpy as np

    import hdmm
    from census_workloads import sf1_persons, sf1_plus

    baseline = _peak_mb()
    timings: dict[str, float] = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        timings[name] = time.perf_counter() - start
        return out

    W = timed("build", sf1_persons if case == "SF1 Persons" else sf1_plus)
    rng = np.random.default_rng(0)
    x = rng.poisson(2.0, size=W.shape[1]).astype(float)
    answers = timed("W @ x", lambda: W @ x)
    privacy = hdmm.PureDP(1.0)
    A = hdmm.Identity(W.shape[1])
    err = timed("Identity error", lambda: hdmm.expected_error(W, A, privacy))
    bound = timed("SVD bound", lambda: hdmm.svd_bound(W, privacy))
    queue.put(
        {
            "case": case,
            "cells": W.shape[1],
            "queries": W.shape[0],
            **timings,
            "answers finite": bool(np.all(np.isfinite(answers))),
            "Identity RMSE": float(np.sqrt(err / W.shape[0])),
            "bound RMSE": bound.rmse,
            "bound exact": bound.exact,
            "peak MB": _peak_mb(),
            "peak above imports MB": _peak_mb() - baseline,
        }
    )


def run(case: str) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(case, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    results = [run("SF1 Persons"), run("SF1 x 51 states")]
    columns = [
        "case", "cells", "queries", "build", "W @ x", "Identity error", "SVD bound",
        "Identity RMSE", "bound RMSE", "bound exact", "peak MB", "peak above imports MB",
    ]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in results:
        cells = []
        for c in columns:
            v = r[c]
            if isinstance(v, float):
                cells.append(f"{v:.3f}" if c in ("build", "W @ x", "Identity error", "SVD bound") else f"{v:,.2f}")
            elif isinstance(v, int) and not isinstance(v, bool):
                cells.append(f"{v:,}")
            else:
                cells.append(str(v))
        print("| " + " | ".join(cells) + " |")
    print("\nTimes in seconds (epsilon = 1, pure DP). Targets: SF1 Persons every step < 0.5 s and "
          "< 300 MB; SF1 x states W @ x < 5 s and < 2 GB.")
    sf1, plus = results
    checks = {
        "SF1 steps < 0.5 s": all(sf1[k] < 0.5 for k in ("build", "W @ x", "Identity error", "SVD bound")),
        "SF1 peak < 300 MB": sf1["peak MB"] < 300,
        "SF1+ W @ x < 5 s": plus["W @ x"] < 5,
        "SF1+ peak < 2 GB": plus["peak MB"] < 2048,
    }
    for name, ok in checks.items():
        print(f"- {name}: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
