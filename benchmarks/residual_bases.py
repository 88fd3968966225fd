"""The residual family with optimized per-attribute bases (``residual_bases``) on prefix-marginal workloads.

Gaussian noise at zCDP rho = 0.5, RMSE per query. For each workload: the ``residual_bases``
optimizer's RMSE (its exact error, through ``hdmm.error.expected_error`` and the ``"residual"``
structure) and time, the worst per-attribute duality gap, the Helmert ``residual`` strategy's
RMSE, OPT_(x)'s where it is quick, and whether OPT_+'s check (``registry._union_check``)
abandons it against the ``residual_bases`` candidate, and after how many groups.

Workloads: CPS prefix-marginals (income 50 and age 100 Prefix, marital 7, race 4, sex 2
Identity; every marginal on 0-3 attributes); Adult prefix-marginals (the 14-attribute Adult
domain, the first five Prefix; every 0-3-way marginal); Loans prefix-marginals
(ResidualPlanner+'s 12-attribute Loans domain, the first four Prefix; every 0-3-way marginal);
the same three with AllRange in place of Prefix; Prefix(64) on each of 5 attributes as one
Kronecker product; plain <= 3-way marginals of CPS and Adult.

Run with one BLAS thread: ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/residual_bases.py``.
Writes ``benchmarks/results/residual_bases.csv``.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import sys
import time

import numpy as np
import pandas as pd

import hdmm
from hdmm.error import expected_error
from hdmm.matrix import Kronecker
from hdmm.optimizers.kron import opt_kron_union
from hdmm.optimizers.marginals import residual_strategy
from hdmm.optimizers.registry import REGISTRY, Abandoned, Problem
from hdmm.optimizers.residual_bases import residual_bases_applies, residual_bases_strategy

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
PRIVACY = hdmm.ZCDP(0.5)
CPS = hdmm.Domain.from_dict({"income": 50, "age": 100, "marital": 7, "race": 4, "sex": 2})
ADULT = hdmm.Domain([f"a{i}" for i in range(14)], [100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2])
#: ResidualPlanner+'s Loans domain: loan amount, interest rate, annual income, installment (numeric), then
#: term, grade, sub-grade, home ownership, state, settlement status, loan status, purpose.
LOANS = hdmm.Domain([f"l{i}" for i in range(12)], [101, 101, 101, 101, 3, 8, 36, 6, 51, 4, 5, 15])


def prefix_marginals(domain: hdmm.Domain, prefix: set[str], k: int = 3, block=hdmm.Prefix):
    """Every marginal on 0..k attributes: ``block`` on the attributes in ``prefix``, Identity on the others."""
    parts = []
    for size in range(k + 1):
        for subset in itertools.combinations(domain.names, size):
            blocks = {a: block(domain[a]) if a in prefix else hdmm.Identity(domain[a]) for a in subset}
            parts.append(hdmm.product(domain, blocks))
    return hdmm.union(parts)


def workloads() -> dict:
    return {
        "CPS prefix-marginals": prefix_marginals(CPS, {"income", "age"}),
        "Adult prefix-marginals": prefix_marginals(ADULT, set(ADULT.names[:5])),
        "Loans prefix-marginals": prefix_marginals(LOANS, set(LOANS.names[:4])),
        "CPS range-marginals": prefix_marginals(CPS, {"income", "age"}, block=hdmm.AllRange),
        "Adult range-marginals": prefix_marginals(ADULT, set(ADULT.names[:5]), block=hdmm.AllRange),
        "Loans range-marginals": prefix_marginals(LOANS, set(LOANS.names[:4]), block=hdmm.AllRange),
        "Prefix(64)^5": Kronecker([hdmm.Prefix(64)] * 5),
        "CPS <=3-way marginals": hdmm.AllMarginals(CPS, 3),
        "Adult <=3-way marginals": hdmm.AllMarginals(ADULT, 3),
    }


def rmse(W, A) -> float:
    return math.sqrt(float(expected_error(W, A, PRIVACY)) / W.shape[0])


def run(name: str, W, repeats: int = 3, kron: bool = True) -> dict:
    row = {"workload": name, "queries": W.shape[0]}
    problem = Problem(W, PRIVACY, rng=np.random.default_rng(0))
    union = problem.union
    A0, _ = residual_strategy(W, union)
    row["residual RMSE"] = rmse(W, A0)
    if residual_bases_applies(union):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            A, error, solved = residual_bases_strategy(W, union)
            times.append(time.perf_counter() - start)
        row["residual_bases seconds"] = min(times)
        start = time.perf_counter()
        row["residual_bases RMSE"] = rmse(W, A)
        row["exact error seconds"] = time.perf_counter() - start
        row["closed-form RMSE"] = math.sqrt(error * PRIVACY.noise_variance(1.0) / W.shape[0])
        gaps = [s.relative_gap for s in solved if s is not None]
        row["worst relative gap"] = max(gaps, default=0.0)
        row["applies in optimize"] = REGISTRY["residual_bases"].applies(problem)
    if kron:
        start = time.perf_counter()
        K, _ = opt_kron_union(union, PRIVACY, None, None, np.random.default_rng(0))
        row["opt_kron seconds"] = time.perf_counter() - start
        row["opt_kron RMSE"] = rmse(W, K)
    if union.num_terms > 1 and REGISTRY["residual_bases"].applies(problem):
        REGISTRY["residual_bases"].run(problem)  # its exact error is the best so far
        start = time.perf_counter()
        try:
            REGISTRY["opt_union"].run(problem)
            row["OPT_+"] = "ran to the end"
        except Abandoned as why:
            row["OPT_+"] = str(why).split(":")[0]
        row["OPT_+ seconds"] = time.perf_counter() - start
    return row


def main() -> None:
    only = sys.argv[1:]
    rows = []
    for name, W in workloads().items():
        if only and name not in only:
            continue
        row = run(name, W, kron=name.startswith(("CPS", "Prefix")))
        print(row, flush=True)
        rows.append(row)
    table = pd.DataFrame(rows)
    RESULTS.mkdir(exist_ok=True)
    table.to_csv(RESULTS / "residual_bases.csv", index=False)
    print(table.to_string())


if __name__ == "__main__":
    main()
