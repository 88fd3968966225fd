"""Release benchmark: SF1 Persons on 1,000,000 and SF1 x 51 states on 10,000,000 synthetic people.

For each case, in a fresh process (so peak memory is its own): build the workload, draw the
synthetic people (``census_workloads.synthetic_persons``) and vectorize them, optimize a
strategy once with OPT_(x) (not part of the release time: an agency optimizes once and
releases many times), then release ``repeats`` times with fresh noise. Reported: seconds for
measure + reconstruct + answer (the release proper; the median over repeats), the plan's
seconds (sensitivity, structure, route and per-query standard errors from the optimized
strategy), the peak resident memory of the process, and the empirical RMSE against the
true answers next to the expected RMSE.

Targets (2-core machine): national under 5 s and 1 GB; by state under 60 s and 6 GB.

Run: ``python benchmarks/release.py`` (prints a markdown table; ``--repeats`` to change the
number of releases per case).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time

CASES = {
    "SF1 Persons": {"people": 1_000_000, "states": False, "seconds": 5.0, "peak MB": 1024.0},
    "SF1 x 51 states": {"people": 10_000_000, "states": True, "seconds": 60.0, "peak MB": 6144.0},
}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(case: str, repeats: int, queue: mp.Queue) -> None:
    import numpy as np

    import hdmm
    from census_workloads import cph_domain, sf1_persons, sf1_plus, synthetic_persons

    spec = CASES[case]
    privacy = hdmm.PureDP(1.0)
    out: dict = {"case": case, "people": spec["people"]}
    start = time.perf_counter()
    W = sf1_plus() if spec["states"] else sf1_persons()
    domain = cph_domain(state=spec["states"])
    people = synthetic_persons(spec["people"], seed=0, states=spec["states"])
    out["data s"] = time.perf_counter() - start
    start = time.perf_counter()
    x = domain.vectorize(people)
    out["vectorize s"] = time.perf_counter() - start
    del people
    truth = W @ x
    start = time.perf_counter()
    strategy = hdmm.optimize(W, privacy, seed=0, optimizers=["opt_kron"])
    out["optimize s"] = time.perf_counter() - start
    out["cells"], out["queries"] = W.shape[1], W.shape[0]

    release_seconds, squared = [], []
    for seed in range(repeats):
        release = hdmm.run(W, x, privacy, strategy=strategy, rng=seed)
        t = release.timings
        release_seconds.append(t["measure"] + t["reconstruct"] + t["answer"])
        squared.append(np.mean((release.answers - truth) ** 2))
    out["release s"] = float(np.median(release_seconds))
    out["plan s"] = release.timings["plan"]
    out["method"] = release.method
    out["expected RMSE"] = release.rmse
    out["empirical RMSE"] = float(np.sqrt(np.mean(squared)))
    out["peak MB"] = _peak_mb()
    queue.put(out)


def run(case: str, repeats: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(case, repeats, queue))
    proc.start()
    result = queue.get()
    proc.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="releases per case (default 20)")
    args = parser.parse_args()
    results = [run(case, args.repeats) for case in CASES]
    columns = ["case", "people", "cells", "queries", "data s", "vectorize s", "optimize s", "release s",
               "plan s", "method", "expected RMSE", "empirical RMSE", "peak MB"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in results:
        cells = [f"{r[c]:,}" if isinstance(r[c], int) else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])
                 for c in columns]
        print("| " + " | ".join(cells) + " |")
    print(f"\nPure DP, epsilon = 1; strategy from OPT_(x); release s = measure + reconstruct + answer (median of "
          f"{args.repeats}); empirical RMSE over {args.repeats} releases against the true answers of the synthetic data.")
    for r in results:
        target = CASES[r["case"]]
        ok = r["release s"] < target["seconds"] and r["peak MB"] < target["peak MB"]
        print(f"- {r['case']}: release {r['release s']:.2f} s (target {target['seconds']:.0f} s), peak "
              f"{r['peak MB']:,.0f} MB (target {target['peak MB']:,.0f} MB): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
