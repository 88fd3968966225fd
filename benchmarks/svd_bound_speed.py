"""The SVD bound's time against ``optimize``'s on marginal-type unions (issue 25, item 4).

Workloads (zCDP, rho = 0.5):

* Adult prefix-marginals: the 14-attribute Adult domain (100, 100, 100, 99, 85, 42, 16, 15, 9,
  7, 6, 5, 2, 2), Prefix on the first five attributes and Identity on the rest, every marginal
  on 0-3 attributes (21M queries);
* CPS prefix-marginals: domain (50, 100, 7, 4, 2), the first two Prefix, every marginal on 0-3
  attributes;
* all marginals on 0-3 of 100 attributes of 10 values (ResidualPlanner's benchmark; built as
  ``hdmm.AllMarginals``, as ``benchmarks/optimizers.py`` builds it: the same union made of 166,752
  separate ``hdmm.product`` terms takes minutes just to reach its normal form);
* SF1 Persons (``census_workloads.sf1_persons()``).

For each: the workload's normal form (``kron_union``, shared by everything after it and cached on
the matrix; timed once, on the first call), the bound as ``optimize`` computes it
(``svd_bound(..., exact_limit=BOUND_EXACT_LIMIT, estimate=False)``, its per-union memo cleared
between repeats so each repeat does the whole work), and ``optimize(W, ZCDP(0.5), seed=0)`` end
to end on a freshly built workload (normal form included), with the bound's share of it. Times
are the minimum over ``--repeats`` runs; run with one BLAS thread
(``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1``). Values, exactness and the certified flag are
printed in full so that two versions of hdmm can be compared.

``--estimate`` also times ``hdmm.svd_bound(W, ZCDP(0.5), seed=0)`` itself, once (estimates with a
standard error where blocks are too large to solve; ``--lanczos-work`` sets its work budget), with
the process's peak resident memory after it (``ru_maxrss``: run one workload per process to read
it as the estimate's).

Run: ``python benchmarks/svd_bound_speed.py [--workloads adult cps ...] [--repeats 3]
[--optimize-repeats 1] [--estimate] [--lanczos-work W] [--json out.json]``
(``--optimize-repeats 0``: the bound alone).
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import time

import hdmm
import hdmm.optimizers.api as api
from hdmm.bound import LANCZOS_WORK, svd_bound
from hdmm.kron_union import kron_union
from hdmm.optimizers.registry import BOUND_EXACT_LIMIT

ADULT = hdmm.Domain.from_dict({f"a{i}": n for i, n in enumerate([100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2])})
CPS = hdmm.Domain.from_dict({"income": 50, "age": 100, "marital": 7, "race": 4, "sex": 2})


def prefix_marginals(domain: hdmm.Domain, numeric: set[str], max_way: int = 3):
    """Every marginal on at most ``max_way`` attributes: Prefix on ``numeric`` attributes, Identity on
    the others, Total elsewhere (as ``benchmarks/optimizers.py`` builds CPS's)."""
    parts = []
    for k in range(max_way + 1):
        for subset in itertools.combinations(domain.names, k):
            blocks = {a: hdmm.Prefix(domain[a]) if a in numeric else hdmm.Identity(domain[a]) for a in subset}
            parts.append(hdmm.product(domain, blocks))
    return hdmm.union(parts)


def _sf1():
    from census_workloads import sf1_persons
    return sf1_persons()


WORKLOADS = {
    "adult": lambda: prefix_marginals(ADULT, set(ADULT.names[:5])),
    "cps": lambda: prefix_marginals(CPS, {"income", "age"}),
    "marginals100": lambda: hdmm.AllMarginals(hdmm.Domain([f"x{i}" for i in range(100)], [10] * 100), 3),
    "sf1": _sf1,
}


def estimate(W, privacy, lanczos_work: float) -> dict:
    """``hdmm.svd_bound`` as a user calls it (estimates allowed), once, with the peak memory after it."""
    start = time.perf_counter()
    bound = svd_bound(W, privacy, seed=0, lanczos_work=lanczos_work)
    seconds = time.perf_counter() - start
    return {"estimate s": seconds, "estimate": bound.value, "estimate stderr": bound.stderr,
            "estimate exact": bound.exact, "estimate certain": bound.certain, "estimate rmse": bound.rmse,
            "estimate method": bound.method, "lanczos work": lanczos_work,
            "peak rss MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run(name: str, repeats: int, optimize_repeats: int, with_estimate: bool = False,
        lanczos_work: float = LANCZOS_WORK) -> dict:
    privacy = hdmm.ZCDP(0.5)
    W = WORKLOADS[name]()
    start = time.perf_counter()
    union = kron_union(W)
    normal_form = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        union.memo.clear()
        start = time.perf_counter()
        bound = svd_bound(W, privacy, exact_limit=BOUND_EXACT_LIMIT, estimate=False)
        seconds.append(time.perf_counter() - start)
    row = {"workload": name, "queries": W.shape[0], "normal form s": normal_form, "bound s": min(seconds),
           "bound": bound.value, "bound exact": bound.exact, "bound certain": bound.certain,
           "bound rmse": bound.rmse, "bound method": bound.method}
    if with_estimate:
        row.update(estimate(W, privacy, lanczos_work))
    if optimize_repeats < 1:
        return row
    inner = api.svd_bound
    spent: list[float] = []

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    api.svd_bound = timed
    try:
        totals = []
        for _ in range(optimize_repeats):
            W = WORKLOADS[name]()  # a fresh matrix: its normal form is computed again, as a user's would be
            spent.clear()
            start = time.perf_counter()
            result = hdmm.optimize(W, privacy, seed=0)
            totals.append((time.perf_counter() - start, sum(spent)))
    finally:
        api.svd_bound = inner
    total, in_bound = min(totals)
    report = result.report.set_index("optimizer")
    row.update({"optimize s": total, "bound in optimize s": in_bound, "optimizer": result.optimizer,
                "error": float(result.error), "optimal": result.optimal,
                "steps": {o: (float(r["total squared error"]), float(r["seconds"]), r["note"])
                          for o, r in report.iterrows()}})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--optimize-repeats", type=int, default=1)
    parser.add_argument("--estimate", action="store_true", help="also time hdmm.svd_bound itself, with estimates")
    parser.add_argument("--lanczos-work", type=float, default=LANCZOS_WORK)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for name in args.workloads:
        row = run(name, args.repeats, args.optimize_repeats, args.estimate, args.lanczos_work)
        print(json.dumps(row, default=str), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1, default=str)


if __name__ == "__main__":
    main()
