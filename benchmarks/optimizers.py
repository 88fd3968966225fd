"""Optimizer benchmark: HDMM against the classical strategies and the SVD lower bound.

Part 1 (``--part 1d``): AllRange, Prefix and WidthKRange(32) for n = 128 ... 8192, Laplace
(pure DP, epsilon = 1) and Gaussian (zCDP, rho = 0.5, unit noise variance): RMSE of Identity,
H2, HB, Privelet, GreedyH and HDMM (OPT_0 under Laplace; under Gaussian the convex program of
docs/math.md, section 4.2, up to n = 2048, with its certified duality gap and dual bound, and the
square-root strategy of ``hdmm.optimizers.root`` beyond), the SVD bound, and optimization time.

Part 2 (``--part multi``): 2-D ranges (64 x 64 with the quadtree, 256 x 256), 3-D ranges
(64^3), SF1 Persons, SF1+, Adult all marginals and 2-way marginals, CPS all marginals,
range-marginals and 2-way range-marginals; Laplace and Gaussian; ``hdmm.optimize`` against
Identity and the applicable baselines, with times, and the Laplace ratios against the tutorial
seed's published table.

Part 3 (``--part planning``): the Gaussian residual strategy (closed form, equal to the SVD
bound) for all marginals of up to 3 of 100 attributes (sizes 2 to 5), timed (the reference time
of a published implementation is in ``benchmarks/results/tuning-notes.md``).

Part 4 (``--part unions``): one-attribute unions with no closed-form spectrum (prefixes with
all ranges, prefixes with width-32 ranges, 4000 random ranges, identity with the total) on
8192 values under Gaussian noise, beyond the dense eigensolver's limit: ``opt0`` (the
square-root strategy in a sine basis) against p-Identity with L2-normalised columns and the
exact SVD bound.

Part 5 (``--part large``): ``hdmm.optimize`` on ResidualPlanner's benchmark (all <= 3-way
marginals of 100 attributes of 10 values, zCDP rho = 0.5; total and max-variance objectives) and
the HDMM authors' largest ones on a 14-attribute domain of 6.4e17 cells (all <= 3-way marginals; 91 two-way Prefix/Identity
products), beside the reference figures of issue 14.

Part 6 (``--part maxvar``): ``objective="max_variance"`` beyond marginals (SF1, CPS
prefix-marginals, 2-D ranges; Laplace and Gaussian) by reweighting, against the total-error
optimum's largest variance and the mean-variance lower bound.

Writes ``benchmarks/results/optimizers_1d.csv``, ``optimizers_multi.csv``,
``optimizers_planning.csv``, ``optimizers_unions.csv``, ``optimizers_large.csv``,
``optimizers_maxvar.csv`` and ``optimizers.md``. Ratios between strategies do not depend on
the privacy parameters.

Run: ``python benchmarks/optimizers.py [--part 1d|multi|planning|unions|large|maxvar|all] [--max-n 8192] [--workloads Prefix ...]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import pathlib
import time
from typing import Sequence

import numpy as np
import pandas as pd

import hdmm
from hdmm import strategies as S
from hdmm.optimizers.convex import solve_convex
from hdmm.block_diagonal import BlockDiagonal
from hdmm.matrix import Kronecker, Matrix, Ones
from hdmm.optimizers import PIdentity, SquareRootStrategy, opt0, opt_residual
from hdmm.workload import Ranges

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
PRIVACY = {"laplace": hdmm.PureDP(1.0), "gaussian": hdmm.ZCDP(0.5)}
CONVEX_MAX_N = 2048

#: Identity's error over HDMM's on Prefix, as published in the tutorial seed.
PUBLISHED_PREFIX = {128: 1.80, 256: 2.18, 512: 2.68, 1024: 3.34, 2048: 4.18, 4096: 5.25, 8192: 6.40}

#: OPT_0 under Laplace noise against the reference dpcomp-org/hdmm, in seconds. Issue 14 states
#: only ratios (OPT_0 at the defaults of then 5.7x faster on AllRange(1024) and 6.5x on
#: Prefix(2048), at lower error); the reference's own times were not recorded, so they are taken
#: as those ratios times OPT_0's times at the defaults of then, measured on the day of the
#: change (1.044 s and 7.556 s, one BLAS thread, load 3.8).
REFERENCE_OPT0 = {("AllRange", 1024): 1.044 * 5.7, ("Prefix", 2048): 7.556 * 6.5}

#: Issue 14's time target for OPT_0 on Prefix(8192), Laplace, in seconds.
PREFIX_8192_TARGET = 30.0

#: Issue 14's side-by-side measurements of the reference's best template (BestHD, its own
#: environment, single-threaded CPU seconds): workload and noise -> (reference seconds, reference
#: RMSE at our privacy settings). The issue gives the reference's error only as a ratio to ours
#: of the day; the RMSE here is that day's RMSE of ours (the committed table before the change
#: 9943c9a) divided by the square root of the ratio, i.e. the ratio read as one of total squared
#: errors, which puts the reference closer to ours than reading it as a ratio of RMSEs would.
#: SF1's is stated (7.44 at epsilon = 1). CPS prefix-marginals was not in that table: its anchor
#: is ``optimize(..., seed=0)`` of the code the issue measured (7d58552, re-run on 2026-11-25:
#: 40.8075 at seed 0; seeds 0-7 gave 40.807 to 40.899, mean 40.849, as random starts fell into
#: one of two basins).
REFERENCE_BESTHD = {
    ("3-D ranges 64^3", "laplace"): (0.29, 86.2133 / 1.000**0.5),
    ("Adult 2-way marginals", "laplace"): (0.45, 8.76397 / 0.952**0.5),
    ("CPS prefix-marginals", "laplace"): (0.55, 40.8075 / 0.998**0.5),
    ("Adult all marginals", "laplace"): (0.31, 5.03458 / 0.898**0.5),
    ("2-D ranges 256x256", "laplace"): (2.5, 45.8975 / 0.994**0.5),
    ("Adult 2-way marginals", "gaussian"): (0.32, 2.33080 / 0.985**0.5),
    ("2-D ranges 256x256", "gaussian"): (7.9, 8.41833 / 1.000**0.5),
    ("SF1 Persons", "laplace"): (1.56, 7.44),
}

#: The tutorial seed's multi-attribute table: the best competitor's error over HDMM's, per workload.
PUBLISHED_MULTI = {
    "SF1 Persons": ("Identity", 3.07),
    "SF1+ (x 51 states)": ("Identity", 3.15),
    "Adult all marginals": ("Identity", 1.38),
    "Adult 2-way marginals": ("DataCube", 2.01),
    "CPS range-marginals": ("Identity", 1.49),
    "SF1 Persons, no relationship": ("Identity", 3.07),
    "CPS 2-way range-marginals": ("Identity", 5.79),
}


def _rmse(W, A, privacy) -> float:
    return float(hdmm.rmse(W, A, privacy))


WORKLOADS_1D = {"AllRange": hdmm.AllRange, "Prefix": hdmm.Prefix, "WidthKRange(32)": lambda n: hdmm.WidthKRange(n, 32)}


def method_name(A: Matrix) -> str:
    """Which kind of strategy ``opt0`` returned."""
    if isinstance(A, SquareRootStrategy):
        return "square root"
    if isinstance(A, PIdentity):
        return "p-Identity"
    if isinstance(A, BlockDiagonal):
        return f"{method_name(A.block)}, {A.copies} blocks"
    return repr(A)


def one_d(max_n: int, names: list[str], noises: Sequence[str] = tuple(PRIVACY), repeats: int = 1) -> pd.DataFrame:
    """The 1-D rows; each optimization is run ``repeats`` times and timed by the fastest run."""
    rows = []
    workloads = {name: WORKLOADS_1D[name] for name in names}
    sizes = [n for n in (128, 256, 512, 1024, 2048, 4096, 8192) if n <= max_n]
    for (wname, make), n in itertools.product(workloads.items(), sizes):
        W = make(n)
        baselines = {"Identity": S.identity(n), "H2": S.hierarchical(n, 2), "HB": S.hb(n), "Privelet": S.wavelet(n),
                     "GreedyH": S.greedy_h(W)}
        unit_bound = hdmm.svd_bound(W, hdmm.ZCDP(0.5))  # unit noise variance: rescaled per privacy below
        for noise in noises:
            privacy = PRIVACY[noise]
            row = {"workload": wname, "n": n, "noise": noise}
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                if noise == "gaussian" and n <= CONVEX_MAX_N:
                    result = solve_convex(W.gram().dense())
                    A = result.strategy
                    row["duality gap (relative)"] = result.gap / result.objective
                    # certified for the workload itself (a singular Gram is solved with a small ridge)
                    row["dual bound RMSE"] = float(np.sqrt(privacy.noise_variance(1.0) * result.original_dual_bound
                                                           / W.shape[0]))
                    row["method"] = "convex program"
                else:
                    A = opt0(W, privacy, seed=0)
                    row["method"] = method_name(A)
                seconds.append(time.perf_counter() - start)
            row["seconds"] = min(seconds)
            row["load"] = os.getloadavg()[0]   # the machine's 1-minute load average after the runs
            row["HDMM"] = _rmse(W, A, privacy)
            for name, B in baselines.items():
                row[name] = _rmse(W, B, privacy)
            row["SVD bound"] = float(np.sqrt(unit_bound.value * privacy.noise_variance(1.0) / W.shape[0]))
            rows.append(row)
            print(row, flush=True)
    return pd.DataFrame(rows)


#: The CPS domain of the HDMM paper's benchmarks; income and age are numeric.
CPS = hdmm.Domain.from_dict({"income": 50, "age": 100, "marital": 7, "race": 4, "sex": 2})


def _range_marginals(domain: hdmm.Domain, numeric: set[str], sizes: Sequence[int] | None = None,
                     block=hdmm.AllRange) -> Matrix:
    """Every subset of attributes (of the given sizes; all by default): ``block`` (AllRange, or e.g.
    Prefix) on numeric ones, Identity on the others, Total elsewhere."""
    parts = []
    for k in range(len(domain) + 1) if sizes is None else sizes:
        for subset in itertools.combinations(domain.names, k):
            blocks = {a: block(domain[a]) if a in numeric else hdmm.Identity(domain[a]) for a in subset}
            parts.append(hdmm.product(domain, blocks))
    return hdmm.union(parts)


def _without_attribute(W: Matrix, drop: int) -> Matrix:
    """``W`` with attribute ``drop`` summed out: the attribute's factor (a total in every term) left out."""
    from hdmm.kron_union import kron_union
    from hdmm.matrix import VStack, Weighted

    union = kron_union(W)
    if not all(isinstance(f, Ones) and f.shape[0] == 1 for f in union.factors[drop]):
        raise ValueError("the attribute to drop is not a total in every term")
    terms = [union.term(j) for j in range(union.num_terms)]
    return VStack([Weighted(Kronecker(factors[:drop] + factors[drop + 1:]), weight) for weight, factors in terms])


def multi(repeats: int = 3) -> pd.DataFrame:
    """``hdmm.optimize`` on each multi-attribute workload, the fastest of ``repeats`` runs (seed 0)."""
    from census_workloads import sf1_persons, sf1_plus

    adult = hdmm.Domain.from_dict({"age": 75, "education": 16, "race": 5, "sex": 2, "hours": 20})
    cases = {
        "2-D ranges 64x64": (Kronecker([hdmm.AllRange(64)] * 2),
                             {"H2 x H2": S.kron(S.hierarchical(64), S.hierarchical(64)), "HB x HB": S.kron(S.hb(64), S.hb(64)),
                              "Privelet x Privelet": S.kron(S.wavelet(64), S.wavelet(64)), "Quadtree": S.quadtree(64, 64)}),
        "2-D ranges 256x256": (Kronecker([hdmm.AllRange(256)] * 2),
                               {"HB x HB": S.kron(S.hb(256), S.hb(256)), "Privelet x Privelet": S.kron(S.wavelet(256), S.wavelet(256))}),
        "3-D ranges 64^3": (Kronecker([hdmm.AllRange(64)] * 3), {"HB^3": S.kron(*[S.hb(64)] * 3)}),
        "SF1 Persons": (sf1_persons(), {}),
        "SF1 Persons, no relationship": (_without_attribute(sf1_persons(), 3), {}),
        "SF1+ (x 51 states)": (sf1_plus(), {}),
        "Adult all marginals": (hdmm.AllMarginals(adult), {"DataCube": S.datacube(adult, hdmm.AllMarginals(adult))}),
        "Adult 2-way marginals": (hdmm.DimKMarginals(adult, 2), {"DataCube": S.datacube(adult, hdmm.DimKMarginals(adult, 2))}),
        "CPS all marginals": (hdmm.AllMarginals(CPS), {"DataCube": S.datacube(CPS, hdmm.AllMarginals(CPS))}),
        "CPS range-marginals": (_range_marginals(CPS, {"income", "age"}), {}),
        "CPS prefix-marginals": (_range_marginals(CPS, {"income", "age"}, block=hdmm.Prefix), {}),
        "CPS 2-way range-marginals": (_range_marginals(CPS, {"income", "age"}, sizes=[2]), {}),
    }
    rows = []
    for name, (W, baselines) in cases.items():
        for noise, privacy in PRIVACY.items():
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                result = hdmm.optimize(W, privacy, seed=0)
                seconds.append(time.perf_counter() - start)
            identity = _rmse(W, hdmm.Identity(W.shape[1]), privacy)
            bound = hdmm.bound.svd_bound(W, privacy, seed=0)  # the full bound, outside the timing
            report = result.report.set_index("optimizer")
            row = {"workload": name, "cells": W.shape[1], "queries": W.shape[0], "noise": noise,
                   "HDMM": result.rmse, "HDMM optimizer": result.optimizer,
                   "HDMM exact": bool(report.loc[result.optimizer, "exact"]),
                   "Identity": identity, "SVD bound": bound.rmse, "seconds": min(seconds),
                   "skipped": "; ".join(f"{o}: {n.split(':')[0]}" for o, n in report["note"].items()
                                        if n.startswith(("skipped", "abandoned")))}
            for bname, B in baselines.items():
                row[bname] = _rmse(W, B, privacy)
            rows.append(row)
            print(row, flush=True)
    return pd.DataFrame(rows)


def planning() -> pd.DataFrame:
    """Time ``opt_residual`` on all marginals of up to 3 of 100 attributes (best of 3 runs)."""
    dom = hdmm.Domain([f"x{i}" for i in range(100)], [2 + i % 4 for i in range(100)])
    W = hdmm.AllMarginals(dom, 3)
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        A = opt_residual(W)
        seconds.append(time.perf_counter() - start)
    error = hdmm.expected_error(W, A, PRIVACY["gaussian"])
    bound = hdmm.svd_bound(W, PRIVACY["gaussian"])
    row = {"workload": "all marginals of up to 3 of 100 attributes", "cells": float(dom.size), "queries": W.shape[0],
           "residual groups": int(A.members.shape[0]), "seconds": min(seconds),
           "error / SVD bound": float(error) / bound.value}
    print(row, flush=True)
    return pd.DataFrame([row])


#: The 14-attribute domain of the HDMM authors' largest benchmarks (6.4e17 cells).
LARGE_SIZES = (100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2)


def _prefix_identity_pairs() -> Matrix:
    """The 91 two-way Kronecker products: Prefix on the first five attributes, Identity on the rest, totals elsewhere."""
    dom = hdmm.Domain([f"a{i}" for i in range(len(LARGE_SIZES))], LARGE_SIZES)
    parts = []
    for i, j in itertools.combinations(range(len(LARGE_SIZES)), 2):
        parts.append(hdmm.product(dom, {f"a{a}": hdmm.Prefix(LARGE_SIZES[a]) if a < 5 else hdmm.Identity(LARGE_SIZES[a])
                                        for a in (i, j)}))
    return hdmm.union(parts)


def _residual_planner_marginals() -> Matrix:
    return hdmm.AllMarginals(hdmm.Domain([f"x{i}" for i in range(100)], [10] * 100), 3)


#: Large workloads through ``hdmm.optimize``: (name, builder, privacy, objective, repeats,
#: reference value, reference seconds, reference). The value is the RMSE for the total
#: objective, the largest per-query variance for ``max_variance``. Laplace rows are at unit
#: noise variance, as the reference reports them.
LARGE = [
    ("all <= 3-way marginals, 100 attributes of 10 values", _residual_planner_marginals, hdmm.ZCDP(0.5), "total", 3,
     303.216, 8.4, "ResidualPlanner"),
    ("all <= 3-way marginals, 100 attributes of 10 values", _residual_planner_marginals, hdmm.ZCDP(0.5),
     "max_variance", 3, 91960.92, 57.0, "ResidualPlanner (Clarabel)"),
    ("all <= 3-way marginals, 14 attributes (6.4e17 cells)",
     lambda: hdmm.AllMarginals(hdmm.Domain([f"a{i}" for i in range(14)], LARGE_SIZES), 3),
     hdmm.PureDP(1.0).unit_noise(), "total", 1, 929.9, 4.6, "reference Kronecker template (authors' best 617.4)"),
    ("91 two-way Prefix/Identity products, 14 attributes", _prefix_identity_pairs, hdmm.PureDP(1.0).unit_noise(),
     "total", 1, 359.6, 2.4, "reference BestHD"),
]


def large() -> pd.DataFrame:
    """``hdmm.optimize`` on the large workloads of ``LARGE`` (time: min over the repeats, one BLAS thread)."""
    rows = []
    for name, build, privacy, objective, repeats, ref_value, ref_seconds, reference in LARGE:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            W = build()
            result = hdmm.optimize(W, privacy, seed=0, objective=objective)
            times.append(time.perf_counter() - start)
        value = result.rmse if objective == "total" else result.max_variance
        row = {"workload": name, "queries": W.shape[0], "privacy": privacy.description,
               "measure": "RMSE" if objective == "total" else "max variance", "value": value,
               "optimizer": result.optimizer, "certified optimal": result.optimal, "seconds": min(times),
               "reference": reference, "reference value": ref_value, "reference seconds": ref_seconds,
               "value / reference": value / ref_value, "reference seconds / seconds": ref_seconds / min(times),
               "candidates": "; ".join(
                   f"{r['optimizer']} skipped" if str(r["note"]).startswith("skipped")
                   else f"{r['optimizer']} {r['rmse' if objective == 'total' else 'max variance']:.6g} "
                        f"({r['seconds']:.1f} s)"
                   for _, r in result.report.iterrows())}
        print(row, flush=True)
        rows.append(row)
    return pd.DataFrame(rows)


def _random_ranges(n: int, count: int = 4000) -> Matrix:
    rng = np.random.default_rng(0)
    ends = np.sort(rng.integers(0, n, (count, 2)), axis=1)
    return Ranges(n, np.stack([ends[:, 0], ends[:, 1] + 1], axis=1))


UNIONS_1D = {
    "Prefix + AllRange": lambda n: hdmm.union([hdmm.Prefix(n), hdmm.AllRange(n)]),
    "Prefix + WidthKRange(32)": lambda n: hdmm.union([hdmm.Prefix(n), hdmm.WidthKRange(n, 32)]),
    "4000 random ranges": _random_ranges,
    "Identity + Total": lambda n: hdmm.union([hdmm.Identity(n), hdmm.Total(n)]),
}


def unions(n: int = 8192) -> pd.DataFrame:
    """Gaussian noise on one-attribute unions without a closed-form spectrum, beyond the dense limit."""
    from hdmm.optimizers.pidentity import default_p, optimize_pidentity

    privacy = PRIVACY["gaussian"]
    rows = []
    for name, make in UNIONS_1D.items():
        W = make(n)
        start = time.perf_counter()
        A = opt0(W, privacy, seed=0)
        seconds = time.perf_counter() - start
        start = time.perf_counter()
        T, _ = optimize_pidentity(W.gram(), default_p(n), 2, 1, np.random.default_rng(0))
        pid_seconds = time.perf_counter() - start
        start = time.perf_counter()
        bound = hdmm.svd_bound(W, privacy)
        row = {"workload": name, "n": n, "method": method_name(A), "seconds": seconds, "HDMM": _rmse(W, A, privacy),
               "p-Identity": _rmse(W, PIdentity(T, 2), privacy), "p-Identity seconds": pid_seconds,
               "SVD bound": bound.rmse, "bound exact": bound.exact, "bound seconds": time.perf_counter() - start}
        print(row, flush=True)
        rows.append(row)
    return pd.DataFrame(rows)


def maxvar() -> pd.DataFrame:
    """``objective="max_variance"`` beyond marginals, both noises: reweighting, against the total-error optimum."""
    from census_workloads import sf1_persons

    cases = {"SF1 Persons": sf1_persons(), "CPS prefix-marginals": _range_marginals(CPS, {"income", "age"}, block=hdmm.Prefix),
             "2-D ranges 64x64": Kronecker([hdmm.AllRange(64)] * 2)}
    rows = []
    for name, W in cases.items():
        for noise, privacy in PRIVACY.items():
            start = time.perf_counter()
            result = hdmm.optimize(W, privacy, objective="max_variance", seed=0)
            seconds = time.perf_counter() - start
            report = result.report
            rows.append({"workload": name, "queries": W.shape[0], "noise": noise, "method": result.optimizer,
                         "total-error optimum's max variance": report["max variance"].iloc[0],
                         "max variance": result.max_variance,
                         "reduction": report["max variance"].iloc[0] / result.max_variance,
                         "mean-variance bound": result.bound.value / W.shape[0], "rounds": len(report),
                         "seconds": seconds})
            print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def summary(one: pd.DataFrame | None, many: pd.DataFrame | None, plan: pd.DataFrame | None = None,
            union_rows: pd.DataFrame | None = None, large_rows: pd.DataFrame | None = None,
            maxvar_rows: pd.DataFrame | None = None) -> str:
    lines = ["# Optimizer benchmark", "",
             "RMSE per query (Laplace: pure DP, epsilon = 1; Gaussian: zCDP, rho = 0.5, unit noise variance at "
             "sensitivity 1). Columns after HDMM are ratios to HDMM's RMSE (>1: HDMM is better).", ""]
    if one is not None:
        table = one.copy()
        for col in ("Identity", "H2", "HB", "Privelet", "GreedyH", "SVD bound"):
            table[col] = table[col] / table["HDMM"]
        table = table.drop(columns=[c for c in ("load",) if c in table])
        lines += ["## One attribute", "", table.to_markdown(index=False, floatfmt=".3g"), ""]
        beaten = (one[["Identity", "H2", "HB", "Privelet", "GreedyH"]].min(axis=1) >= one["HDMM"] * (1 - 1e-9))
        lines += [f"HDMM at or below every baseline in {int(beaten.sum())} of {len(one)} rows"
                  + ("" if beaten.all() else ": not in " + "; ".join(
                      f"{r.workload} n={r.n} {r.noise}" for r in one[~beaten].itertuples())) + ".", ""]
        prefix = one[(one["workload"] == "Prefix") & (one["noise"] == "laplace")].set_index("n")
        published = pd.Series(PUBLISHED_PREFIX, name="published").reindex(prefix.index)
        compare = pd.DataFrame({"measured": prefix["Identity"] / prefix["HDMM"], "published": published,
                                "opt0 seconds": prefix["seconds"]})
        lines += ["Prefix under Laplace noise, Identity's RMSE over HDMM's against the tutorial seed's published "
                  "ratios:", "", compare.reset_index().astype({"n": str}).to_markdown(index=False, floatfmt=".4g"), ""]
        laplace = one[one["noise"] == "laplace"].set_index(["workload", "n"])
        rows = [{"workload": w, "n": n, "seconds": laplace.loc[(w, n), "seconds"], "reference seconds": ref,
                 "reference seconds / seconds": ref / laplace.loc[(w, n), "seconds"], "HDMM RMSE": laplace.loc[(w, n), "HDMM"]}
                for (w, n), ref in REFERENCE_OPT0.items() if (w, n) in laplace.index]
        if rows:
            lines += ["OPT_0 under Laplace noise against the reference dpcomp-org/hdmm (issue 14; the reference seconds "
                      "are derived from the issue's ratios, see `REFERENCE_OPT0` in `benchmarks/optimizers.py`; "
                      "the reference's error is above OPT_0's on both rows):", "",
                      pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"), ""]
        if ("Prefix", 8192) in laplace.index:
            lines += [f"Prefix(8192) under Laplace noise: {laplace.loc[('Prefix', 8192), 'seconds']:.1f} s "
                      f"(target: under {PREFIX_8192_TARGET:.0f} s).", ""]
    if many is not None:
        table = many.copy()
        for col in [c for c in table.columns if c not in ("workload", "cells", "queries", "noise", "HDMM",
                                                          "HDMM optimizer", "HDMM exact", "seconds", "skipped")]:
            table[col] = table[col] / table["HDMM"]
        lines += ["## Several attributes", "",
                  "`hdmm.optimize(W, privacy, seed=0)` at its defaults, the fastest of 3 runs (one BLAS thread); "
                  "`skipped` lists the optimizers skipped or abandoned as unable to win (the report's notes).", "",
                  table.to_markdown(index=False, floatfmt=".3g"), ""]
        indexed = many.set_index(["workload", "noise"])
        rows = [{"workload": w, "noise": noise, "HDMM RMSE": indexed.loc[(w, noise), "HDMM"], "reference RMSE": ref_rmse,
                 "error ours / reference (RMSE)": indexed.loc[(w, noise), "HDMM"] / ref_rmse,
                 "seconds": indexed.loc[(w, noise), "seconds"], "reference seconds": ref_seconds,
                 "reference seconds / seconds": ref_seconds / indexed.loc[(w, noise), "seconds"]}
                for (w, noise), (ref_seconds, ref_rmse) in REFERENCE_BESTHD.items() if (w, noise) in indexed.index]
        if rows:
            lines += ["Against the reference's best template (BestHD), issue 14's side-by-side figures (see "
                      "`REFERENCE_BESTHD` in `benchmarks/optimizers.py` for how the reference RMSE is derived; "
                      "reference seconds / seconds above 1: `optimize` is faster):", "",
                      pd.DataFrame(rows).to_markdown(index=False, floatfmt=".4g"), ""]
        laplace = many[many["noise"] == "laplace"].set_index("workload")
        rows = [{"workload": w, "competitor": c, "RMSE ratio": laplace.loc[w, c] / laplace.loc[w, "HDMM"],
                 "TSE ratio": (laplace.loc[w, c] / laplace.loc[w, "HDMM"]) ** 2, "published": value}
                for w, (c, value) in PUBLISHED_MULTI.items() if w in laplace.index]
        lines += ["Under Laplace noise, the competitor's error over HDMM's against the tutorial seed's published "
                  "table (its metric is not stated; CPS range-marginals match it in RMSE):", "",
                  pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"), ""]
    if plan is not None:
        lines += ["## Planning Gaussian marginals on 100 attributes", "",
                  plan.to_markdown(index=False, floatfmt=".4g"), ""]
    if large_rows is not None:
        lines += ["## Large workloads through `hdmm.optimize`", "",
                  "Times include building the workload; one BLAS thread; the reference figures are those stated in "
                  "issue 14 (the reference measured on these machines). Laplace rows at unit noise variance.", "",
                  large_rows.to_markdown(index=False, floatfmt=".6g"), ""]
    if maxvar_rows is not None:
        lines += ["## The max-variance objective beyond marginals", "",
                  "`hdmm.optimize(W, privacy, objective=\"max_variance\", seed=0)` on workloads the exact residual "
                  "program does not cover: the terms reweighted round by round (`hdmm.optimizers.reweight`). "
                  "Variances in the privacy's units (Laplace: pure DP, epsilon = 1; Gaussian: zCDP, rho = 0.5); "
                  "`reduction` is the total-error optimum's largest variance over the result's; the mean-variance "
                  "bound (SVD bound / queries) bounds every strategy's largest variance from below.", "",
                  maxvar_rows.to_markdown(index=False, floatfmt=".4g"), ""]
    if union_rows is not None:
        table = union_rows.copy()
        for col in ("p-Identity", "SVD bound"):
            table[col] = table[col] / table["HDMM"]
        lines += ["## One-attribute unions beyond the dense eigensolver, Gaussian noise", "",
                  table.to_markdown(index=False, floatfmt=".4g"), ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["1d", "multi", "planning", "unions", "large", "maxvar", "all"], default="all")
    parser.add_argument("--max-n", type=int, default=8192)
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS_1D), default=list(WORKLOADS_1D),
                        help="1-D workloads to run; rows of the others already in the CSV are kept")
    parser.add_argument("--noise", nargs="+", choices=list(PRIVACY), default=list(PRIVACY),
                        help="1-D noises to run; rows of the others already in the CSV are kept")
    parser.add_argument("--repeats", type=int, default=1,
                        help="1-D part: run each optimization this many times and report the fastest")
    parser.add_argument("--summarize", action="store_true",
                        help="only rebuild optimizers.md from the CSV files of earlier runs")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    one_csv, many_csv = RESULTS / "optimizers_1d.csv", RESULTS / "optimizers_multi.csv"
    plan_csv = RESULTS / "optimizers_planning.csv"
    one = pd.read_csv(one_csv) if one_csv.exists() else None
    many = pd.read_csv(many_csv) if many_csv.exists() else None
    plan = pd.read_csv(plan_csv) if plan_csv.exists() else None
    union_csv = RESULTS / "optimizers_unions.csv"
    union_rows = pd.read_csv(union_csv) if union_csv.exists() else None
    large_csv = RESULTS / "optimizers_large.csv"
    large_rows = pd.read_csv(large_csv) if large_csv.exists() else None
    if not args.summarize and args.part in ("1d", "all"):
        one = one_d(args.max_n, args.workloads, args.noise, args.repeats)
        if one_csv.exists():
            # rows measured now replace the earlier ones in place; the others are kept
            key = ["workload", "n", "noise"]
            merged, fresh = pd.read_csv(one_csv).set_index(key), one.set_index(key)
            common = fresh.index.intersection(merged.index)
            merged.loc[common, fresh.columns] = fresh.loc[common]
            one = pd.concat([merged, fresh.loc[fresh.index.difference(merged.index)]]).reset_index()
        one.to_csv(one_csv, index=False)
    if not args.summarize and args.part in ("multi", "all"):
        many = multi()
        many.to_csv(many_csv, index=False)
    if not args.summarize and args.part in ("planning", "all"):
        plan = planning()
        plan.to_csv(plan_csv, index=False)
    if not args.summarize and args.part in ("unions", "all"):
        union_rows = unions()
        union_rows.to_csv(union_csv, index=False)
    if not args.summarize and args.part in ("large", "all"):
        large_rows = large()
        large_rows.to_csv(large_csv, index=False)
    maxvar_csv = RESULTS / "optimizers_maxvar.csv"
    maxvar_rows = pd.read_csv(maxvar_csv) if maxvar_csv.exists() else None
    if not args.summarize and args.part in ("maxvar", "all"):
        maxvar_rows = maxvar()
        maxvar_rows.to_csv(maxvar_csv, index=False)
    text = summary(one, many, plan, union_rows, large_rows, maxvar_rows)
    (RESULTS / "optimizers.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
