"""Side by side with ResidualPlanner+ on its own benchmark workloads (issue 25).

ResidualPlanner+ (RP+; github.com/cmla-psu/ResidualPlannerPlus, snapshot commit
``82a9a8991ed4fe65dcfeda881b399db35913689d``) answers unions of marginals whose attributes are
Prefix (``'P'``) or Identity (``'I'``) queries with a *residual* mechanism: per attribute ``i``
of ``k`` values a ``(k-1) x k`` basis ``R_i`` of the space orthogonal to the ones vector (found
by a strategy optimizer on the attribute's centred query matrix), and per subset ``T`` of
attributes one Gaussian measurement ``y_T = (kron_{i in T} R_i kron_{j not in T} 1^T) x +
sigma_T kron_{i in T} Gamma_i z``. Its sum-of-variances planner (``ResPlanSum``) uses
``Gamma_i = I`` for Prefix and ``Gamma_i = R_i`` (the difference matrix) for Identity; its
max-variance planner (``ResPlanMax``) uses ``Gamma_i = R_i`` for every attribute. Both choose
``sigma_T^2`` by a closed form (sum) or a convex program (max) under a privacy cost of 1, where
the cost of subset ``T`` is ``prod_{i in T} max diag(R_i^T (Gamma_i Gamma_i^T)^-1 R_i) /
sigma_T^2``: unit noise variance per unit squared L2 sensitivity, which is hdmm's Gaussian
noise at zCDP rho = 0.5 (``hdmm.ZCDP(0.5).noise_variance(1) == 1``).

The workloads (RP+'s ``resplan/workload.py``, ``workload_large_dataset`` and
``dataset_domains``, run by ``experiments/exp_large_dataset.py``): CPS (50, 100, 7, 4, 2; the
first two Prefix), Adult (100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2; the first five
Prefix) and Loans (101, 101, 101, 101, 3, 8, 36, 6, 51, 4, 5, 15; the first four Prefix). For the
RMSE tables (``choice="sumvar"``) every k-way marginal for k = 1, 2, 3, and every 0-3-way one
("3D"); for the max-variance tables (``choice="maxvar"``) the same but only marginals of at most
5,000 cells. Each marginal is the Kronecker product of its attributes' query matrices (Prefix:
lower-triangular ones, ``resplan.utils.prefix_workload``; Identity) and a total elsewhere;
unweighted. Besides: Prefix(64) on each of 5 attributes as one Kronecker product (RP+'s
synthetic experiment, ``experiments/experiment.py`` / ``workload_allkway``, n = 64, its 5-way
term), RMSE objective.

RP+'s self-reported figures are its planners' objective values (RMSE = sqrt(objective / queries);
max variance = objective). They are **re-evaluated exactly** here: per subset ``T`` the whitened
measurement ``M_T = kron_{i in T} M_i kron_{j not in T} 1^T`` at noise ``sigma_T``, with ``M_i =
(Gamma_i Gamma_i^T)^(-1/2) R_i``; the exact squared L2 sensitivity ``Delta^2 = max_x sum_T
sigma_T^-2 prod_{i in T} ||M_i[:, x_i]||^2`` equals ``sum_T sigma_T^-2 prod_{i in T} max_c
||M_i[:, c]||^2`` (the sum is multilinear with non-negative coefficients in the per-attribute
column norms, so its maximum is at each attribute's largest column), and the blocks are mutually
orthogonal (each ``M_i`` annihilates the ones vector), so a query ``kron_i w_i`` of marginal ``A``
has variance ``Delta^2 sum_{T subset A} sigma_T^2 prod_{i in T} ||w_i M_i^+||^2 prod_{i in A \\ T}
(w_i . 1 / k_i)^2`` (the least-squares estimate; it is the only unbiased one since ``M_i`` is a
bijection from the ones-orthogonal space). Sums of the per-attribute vectors give each marginal's
total error; Kronecker products of them each query's variance. ``check`` verifies this evaluator
against dense numpy (generalised least squares with the correlated noise, and
``hdmm.error.per_query_variance`` on the whitened strategy) on small domains.

RMSE: RP+'s sum planner is consistent (``Gamma_i`` in its measurement, cost and variance alike);
its bases and noise levels are evaluated as they are, and its self-report is exact. Max variance:
its variance formula, ``diag(W R^+ R^+T W^T)``, is that of the strategy ``R x + z`` (``Gamma_i =
I``), but its privacy cost, ``prod max diag(R^T (R R^T)^-1 R)``, and its measurement step are those
of ``R x + R z`` (``Gamma_i = R_i``), so its self-report is the variance of neither when ``R R^T`` is
not a multiple of the identity (its optimized Prefix bases). Column "RP+ exact": the strategy its
formula describes (bases ``R_i``, white noise, its noise levels) at its true sensitivity; column
"RP+ as run": the measurement its code runs (far worse: its noise levels were chosen for the other
variance).

hdmm's side: ``hdmm.optimize(W, hdmm.ZCDP(0.5), seed=0)`` and, for the max-variance workloads,
``objective="max_variance"``, with the times, the candidates of ``result.report`` and the
certified flags (``result.optimal``). ``--optimizers NAME ...`` also runs each named optimizer
alone (``optimizers=[NAME]``) and reports its value; a name ``optimize`` does not know is
reported as missing ("-"). By default ``residual_bases`` (the residual family with optimized
per-attribute bases, being added to ``optimize`` for issue 25). When hdmm's strategy is such a
residual family (it has ``bases``, ``members`` and ``weights``), this script's evaluator
re-evaluates it too (column "hdmm re-evaluated here"), an independent check of hdmm's figure.

How to run (one BLAS thread, ``OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1``):

1. Reference figures, once, in RP+'s own environment (not hdmm's)::

       mkdir /tmp/rpp && git -C <clone of ResidualPlannerPlus> archive 82a9a89 | tar -x -C /tmp/rpp
       python3 -m venv /tmp/rpp-venv
       /tmp/rpp-venv/bin/pip install numpy scipy cvxpy pandas gurobipy tqdm
       /tmp/rpp-venv/bin/python benchmarks/residualplanner.py reference --rpp /tmp/rpp [--only NAME ...]

   (``gurobipy`` is only imported by RP+; its max-variance program runs on cvxpy's Clarabel.)
   Writes ``benchmarks/results/residualplanner_reference.npz``: per workload RP+'s marginals,
   noise levels, self-reported value and seconds (best of ``--repeats``, building the planner
   included, as its scripts time it), and its per-attribute bases and query matrices. The sum
   planner's workloads take under a second each; each max-variance one one to two minutes (its
   basis search for attributes of about 100 values).
2. The comparison, in hdmm's environment::

       python benchmarks/residualplanner.py compare [--only NAME ...] [--optimizers NAME ...]

   Writes ``benchmarks/results/residualplanner.json`` and ``residualplanner.md`` (rows of
   workloads not rerun are kept from the earlier JSON; ``--out NAME`` writes ``NAME.json`` and
   ``NAME.md`` instead; ``table`` rebuilds the Markdown from the JSON). CPS and the 1- and
   2-way workloads take seconds to a minute each; with hdmm before the residual family with
   optimized bases, the 3-way and 0-3-way ones of Adult and Loans take minutes each (OPT_+),
   so rerun parts with ``--only`` to stay within a few minutes.
3. ``python benchmarks/residualplanner.py check``: the exact evaluator against dense numpy and
   hdmm, and each hdmm workload against RP+'s (its marginals, and the dense rows up to order on
   a small domain, built from RP+'s own per-attribute matrices stored with the reference).

``NAME`` is a workload name such as ``"CPS 0-3-way"`` or ``"CPS 0-3-way max"``, or words that
pick every workload whose name has them all (``CPS``, ``max``, ``"Adult rmse"``; ``rmse``
means not ``max``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
REFERENCE = RESULTS / "residualplanner_reference.npz"
SNAPSHOT = "82a9a8991ed4fe65dcfeda881b399db35913689d"

#: RP+'s dataset domains and attribute kinds (resplan/workload.py, dataset_domains).
DATASETS = {
    "CPS": ([50, 100, 7, 4, 2], "PPIII"),
    "Adult": ([100, 100, 100, 99, 85, 42, 16, 15, 9, 7, 6, 5, 2, 2], "P" * 5 + "I" * 9),
    "Loans": ([101, 101, 101, 101, 3, 8, 36, 6, 51, 4, 5, 15], "P" * 4 + "I" * 8),
}
#: the k-way choices of exp_large_dataset.py: k = 1, 2, 3 and "3D" (every 0-3-way marginal)
WAYS = {"1-way": (1, 2), "2-way": (2, 3), "3-way": (3, 4), "0-3-way": (0, 4)}
#: the max-variance workloads keep marginals of at most this many cells (workload_large_dataset)
MAXVAR_CELLS = 5000


def cases() -> list[dict]:
    """Every benchmark workload: name, domains, kinds (``'P'``/``'I'`` per attribute), objective, marginals."""
    out = []
    for objective in ("rmse", "max variance"):
        for dataset, (domains, kinds) in DATASETS.items():
            for way, (low, high) in WAYS.items():
                marginals = [A for k in range(low, high) for A in itertools.combinations(range(len(domains)), k)]
                if objective == "max variance":
                    marginals = [A for A in marginals if 0 < math.prod(domains[i] for i in A) <= MAXVAR_CELLS]
                suffix = "" if objective == "rmse" else " max"
                out.append({"name": f"{dataset} {way}{suffix}", "domains": domains, "kinds": kinds,
                            "objective": objective, "marginals": marginals, "system": ("dataset", dataset, way)})
    out.append({"name": "Prefix(64)^5", "domains": [64] * 5, "kinds": "P" * 5, "objective": "rmse",
                "marginals": [tuple(range(5))], "system": ("product",)})
    return out


def select(names: list[str] | None) -> list[dict]:
    """The cases named: a full name picks that workload; other words pick the workloads whose
    names have them all (``CPS``, ``max``, ``Adult 3-way``; ``rmse`` means not ``max``)."""
    all_cases = cases()
    if not names:
        return all_cases
    chosen = []
    for n in names:
        exact = [c for c in all_cases if c["name"] == n]
        words = set(n.split())
        chosen += exact or [c for c in all_cases
                            if (words - {"rmse"}) <= set(c["name"].split())
                            and not ("rmse" in words and c["objective"] != "rmse")]
    if not chosen:
        raise SystemExit(f"no workload matches {names}; the names are: {[c['name'] for c in all_cases]}")
    return [c for c in all_cases if any(c is d for d in chosen)]


def _queries(case: dict) -> int:
    return sum(math.prod(case["domains"][i] for i in A) for A in case["marginals"])


# ---------------------------------------------------------------------------------------------
# step 1: RP+'s figures, in its own environment


def reference(rpp: str, names: list[str] | None, repeats: int) -> None:
    """Run RP+ on each workload and store its figures and its mechanism (bases, noise levels)."""
    sys.path.insert(0, rpp)
    sys.argv = sys.argv[:1]  # RP+'s max-variance basis search parses the command line (resplan/softmax.py)
    import cvxpy

    # RP+'s max-variance program calls cvxpy's solve() without a solver; with gurobipy installed
    # (RP+ imports it) cvxpy would pick Gurobi, whose size-limited licence fails here: Clarabel
    solve = cvxpy.Problem.solve

    def solve_with_clarabel(problem, *args, **kwargs):
        kwargs.setdefault("solver", cvxpy.CLARABEL)
        return solve(problem, *args, **kwargs)

    cvxpy.Problem.solve = solve_with_clarabel
    from resplan import ResPlanMax, ResPlanSum
    from resplan.utils import prefix_workload, subtract_matrix
    from resplan.workload import root_mean_squared_error, workload_large_dataset

    for case in select(names):
        store, meta = _stored()
        mode = "sum" if case["objective"] == "rmse" else "max"
        best = math.inf
        for _ in range(repeats if mode == "sum" else 1):
            start = time.perf_counter()
            if case["system"][0] == "dataset":
                k = {"1-way": 1, "2-way": 2, "3-way": 3, "0-3-way": "3D"}[case["system"][2]]
                system, total = workload_large_dataset(case["system"][1], k, choice="sumvar" if mode == "sum" else "maxvar")
            else:
                system = ResPlanSum(case["domains"], list(case["kinds"]))
                for A in case["marginals"]:
                    system.input_mech(A)
                total = _queries(case)
            objective = system.get_noise_level()
            best = min(best, time.perf_counter() - start)
        assert isinstance(system, ResPlanSum if mode == "sum" else ResPlanMax)
        marginals = sorted(tuple(A) for A in system.marg_dict)
        if marginals != sorted(case["marginals"]) or int(total) != _queries(case):
            raise SystemExit(f"{case['name']}: RP+ built other marginals than this script's workload")
        self_value = root_mean_squared_error(objective, total, pcost=1) if mode == "sum" else float(objective)
        gammas = []
        for i, (k, kind) in enumerate(zip(case["domains"], case["kinds"])):
            R = system.residual_matrix[k]
            key = f"{mode}.R.{kind}.{k}"
            if key in store and not np.array_equal(store[key], R):
                raise SystemExit(f"{key}: RP+'s basis differs between runs")
            store[key] = R
            # the noise matrix its measurement uses (ResMech.get_core_matrix)
            G = system.gamma_matrix[k] if mode == "sum" else R
            gamma = ("identity" if G.shape == (k - 1, k - 1) and np.array_equal(G, np.eye(k - 1))
                     else "residual" if np.array_equal(G, R) else None)
            if gamma is None:
                raise SystemExit(f"{case['name']}: unexpected noise matrix for attribute {i}")
            if kind == "I" and mode == "sum" and not np.array_equal(R, subtract_matrix(k)):
                raise SystemExit(f"{case['name']}: unexpected identity basis for attribute {i}")
            gammas.append(gamma)
            store[f"W.{kind}.{k}"] = prefix_workload(k) if kind == "P" else np.eye(k)
        subsets = list(system.res_dict)
        noise = np.array([system.res_dict[T].noise_level for T in subsets], dtype=float)
        store[f"{case['name']}.noise"] = noise
        meta[case["name"]] = {"subsets": [list(T) for T in subsets], "gammas": gammas, "self": float(self_value),
                              "seconds": best, "queries": int(total), "mode": mode}
        print(f"{case['name']}: {total:.0f} queries, RP+ self-reported {'RMSE' if mode == 'sum' else 'max variance'} "
              f"{self_value:.6g} in {best:.3f} s", flush=True)
        RESULTS.mkdir(exist_ok=True)
        # merged into what is on file just before writing, so that runs of other workloads may overlap
        stored, stored_meta = _stored()
        stored.update({key: v for key, v in store.items() if key == f"{case['name']}.noise"
                       or not key.endswith(".noise")})
        stored_meta[case["name"]] = meta[case["name"]]
        stored_meta.setdefault("snapshot", SNAPSHOT)
        partial = REFERENCE.with_name(REFERENCE.stem + ".partial.npz")
        np.savez_compressed(partial, meta=json.dumps(stored_meta), **stored)
        os.replace(partial, REFERENCE)


def _stored() -> tuple[dict, dict]:
    store = dict(np.load(REFERENCE, allow_pickle=False)) if REFERENCE.exists() else {}
    return store, json.loads(str(store.pop("meta"))) if "meta" in store else {}


def load_reference() -> tuple[dict, dict]:
    if not REFERENCE.exists():
        raise SystemExit(f"{REFERENCE} is missing: run step 1 ('reference') first, see the module docstring")
    store = dict(np.load(REFERENCE, allow_pickle=False))
    return json.loads(str(store.pop("meta"))), store


# ---------------------------------------------------------------------------------------------
# the exact evaluator of a residual mechanism


def whitened(R: np.ndarray, gamma: str) -> np.ndarray:
    """``(Gamma Gamma^T)^(-1/2) R`` on the ones-orthogonal space (``Gamma`` = I or R)."""
    if gamma == "residual":
        vals, vecs = np.linalg.eigh(R @ R.T)
        R = (vecs / np.sqrt(vals)) @ vecs.T @ R
    elif gamma != "identity":
        raise ValueError(f"unknown noise matrix {gamma!r}")
    # RP+'s bases annihilate the ones vector up to its regularisation (about 1e-5); exactly here
    return R - R.mean(axis=1, keepdims=True)


class ResidualMechanism:
    """A residual mechanism: whitened bases ``M_i`` and noise variances ``sigma_T^2`` per subset."""

    def __init__(self, bases: list[np.ndarray], noise: dict[tuple, float]):
        self.bases = bases
        self.noise = noise
        self.pinv = [np.linalg.pinv(M) for M in bases]
        colmax = [float(np.max(np.sum(M * M, axis=0))) for M in bases]
        #: exact squared L2 sensitivity at the given noise levels
        self.sensitivity2 = sum(math.prod(colmax[i] for i in T) / s2 for T, s2 in noise.items())

    def _factors(self, A: tuple, queries: dict[int, np.ndarray]):
        """Per attribute of ``A``: the residual part ``||w M^+||^2`` and the total part ``(w . 1 / k)^2`` per row."""
        res, tot = {}, {}
        for i in A:
            W = queries[i]
            res[i] = np.sum((W @ self.pinv[i]) ** 2, axis=1)
            tot[i] = (W.sum(axis=1) / W.shape[1]) ** 2
        return res, tot

    def _subsets(self, A: tuple):
        for k in range(len(A) + 1):
            for T in itertools.combinations(A, k):
                if T not in self.noise:
                    raise ValueError(f"the mechanism measures no residual for {T}, needed by marginal {A}")
                yield T

    def total_error(self, A: tuple, queries: dict[int, np.ndarray]) -> float:
        """Total variance of marginal ``A``'s queries (``queries[i]``: attribute ``i``'s query matrix)."""
        res, tot = self._factors(A, queries)
        return self.sensitivity2 * sum(self.noise[T] * math.prod(res[i].sum() if i in T else tot[i].sum() for i in A)
                                       for T in self._subsets(A))

    def variances(self, A: tuple, queries: dict[int, np.ndarray]) -> np.ndarray:
        """Each query's variance, in Kronecker (row-major) order over ``A``'s attributes."""
        res, tot = self._factors(A, queries)
        out = 0.0
        for T in self._subsets(A):
            vec = np.ones(1)
            for i in A:
                vec = np.kron(vec, res[i] if i in T else tot[i])
            out = out + self.noise[T] * vec
        return self.sensitivity2 * np.asarray(out, dtype=float).reshape(-1)


def rp_mechanism(case: dict, meta: dict, store: dict, gammas: list[str] | None = None) -> ResidualMechanism:
    info = meta[case["name"]]
    gammas = info["gammas"] if gammas is None else gammas
    bases = [whitened(store[f"{info['mode']}.R.{kind}.{k}"], g)
             for k, kind, g in zip(case["domains"], case["kinds"], gammas)]
    noise = dict(zip((tuple(T) for T in info["subsets"]), store[f"{case['name']}.noise"]))
    return ResidualMechanism(bases, noise)


def per_attribute_queries(case: dict) -> dict[int, np.ndarray]:
    import hdmm
    return {i: (hdmm.Prefix(k) if kind == "P" else hdmm.Identity(k)).dense()
            for i, (k, kind) in enumerate(zip(case["domains"], case["kinds"]))}


def evaluate(mech: ResidualMechanism, case: dict, with_max: bool) -> dict:
    queries = per_attribute_queries(case)
    total = sum(mech.total_error(A, queries) for A in case["marginals"])
    out = {"rmse": math.sqrt(total / _queries(case))}
    if with_max:
        out["max variance"] = max(float(mech.variances(A, queries).max()) for A in case["marginals"])
    return out


# ---------------------------------------------------------------------------------------------
# hdmm's side


def hdmm_workload(case: dict):
    import hdmm
    dom = hdmm.Domain([f"a{i}" for i in range(len(case["domains"]))], case["domains"])
    blocks = {"P": hdmm.Prefix, "I": hdmm.Identity}
    parts = [hdmm.product(dom, {f"a{i}": blocks[case["kinds"][i]](case["domains"][i]) for i in A})
             for A in case["marginals"]]
    return parts[0] if len(parts) == 1 else hdmm.union(parts)


def _candidates(result, column: str) -> str:
    rows = []
    for _, r in result.report.iterrows():
        note = str(r.get("note", "") or "")
        if note.startswith("skipped") or note.startswith("abandoned"):
            rows.append(f"{r['optimizer']} {note.split(':')[0]}")
        else:
            rows.append(f"{r['optimizer']} {r[column]:.6g}{'' if r.get('exact', True) else ' (bound)'} "
                        f"({r['seconds']:.2f} s)")
    return "; ".join(rows)


def run_hdmm(case: dict, objective: str, optimizers: list[str] | None = None, repeats: int = 3) -> dict:
    """``hdmm.optimize`` on the case (seed 0); time: the fastest of ``repeats`` runs when one takes under 5 s."""
    import hdmm
    W = hdmm_workload(case)
    privacy = hdmm.ZCDP(0.5)
    kwargs = {} if optimizers is None else {"optimizers": optimizers}
    if objective != "rmse":
        kwargs["objective"] = "max_variance"
    times = []
    while not times or (len(times) < repeats and min(times) < 5.0):
        start = time.perf_counter()
        result = hdmm.optimize(W, privacy, seed=0, **kwargs)
        times.append(time.perf_counter() - start)
    value, column = (result.rmse, "rmse") if objective == "rmse" else (result.max_variance, "max variance")
    exact = True
    if objective == "rmse":
        best = result.report[result.report["optimizer"] == result.optimizer]
        exact = bool(best["exact"].iloc[0]) if "exact" in best and len(best) else True
    out = {"value": float(value), "seconds": min(times), "optimizer": result.optimizer,
           "certified": bool(result.optimal), "exact": exact, "candidates": _candidates(result, column)}
    mech = as_residual_mechanism(result.strategy, case)
    if mech is not None:
        # hdmm's residual strategy (bases per attribute) re-evaluated by this script's evaluator
        again = evaluate(mech, case, with_max=objective != "rmse")["rmse" if objective == "rmse" else "max variance"]
        out["recheck"] = again
    return out


def as_residual_mechanism(A, case: dict) -> ResidualMechanism | None:
    """hdmm's strategy as a :class:`ResidualMechanism` when it is a residual family with a basis per
    attribute (subsets ``T``, weights ``w_T``, bases ``B_i``: rows ``w_T kron_{T} B_i kron_{not T}
    1^T / sqrt(n_j)``, unit noise), else ``None``."""
    if not all(hasattr(A, name) for name in ("bases", "members", "weights")):
        return None
    sizes = case["domains"]
    bases = [np.asarray(B.dense() if hasattr(B, "dense") else B, dtype=float) for B in A.bases]
    noise = {}
    for member, w in zip(np.asarray(A.members, dtype=bool), np.asarray(A.weights, dtype=float)):
        if w > 0:
            T = tuple(int(i) for i in np.flatnonzero(member))
            noise[T] = math.prod(n for j, n in enumerate(sizes) if j not in T) / w ** 2
    return ResidualMechanism([B - B.mean(axis=1, keepdims=True) for B in bases], noise)


def compare(names: list[str] | None, optimizers: list[str], repeats: int = 3, out: str = "residualplanner") -> None:
    meta, store = load_reference()
    for case in select(names):
        if case["name"] not in meta:
            print(f"{case['name']}: no reference figures, skipped (run step 1 for it)", flush=True)
            continue
        info = meta[case["name"]]
        objective = case["objective"]
        start = time.perf_counter()
        if objective == "rmse":
            exact = evaluate(rp_mechanism(case, meta, store), case, with_max=False)["rmse"]
        else:
            # its strategy (bases R_i, noise z), which its variance formula describes; and as its measurement runs
            strategy = evaluate(rp_mechanism(case, meta, store, ["identity"] * len(case["domains"])), case, True)
            as_run = evaluate(rp_mechanism(case, meta, store), case, True)
            exact = strategy["max variance"]
        row = {"workload": case["name"], "objective": objective, "queries": _queries(case),
               "RP+ self-reported": info["self"], "RP+ exact": exact, "RP+ seconds": info["seconds"],
               "evaluation seconds": time.perf_counter() - start}
        if objective != "rmse":
            row.update({"RP+ exact RMSE": strategy["rmse"], "RP+ as run": as_run["max variance"],
                        "RP+ as run RMSE": as_run["rmse"]})
        ours = run_hdmm(case, objective, repeats=repeats)
        if "recheck" in ours:
            row["hdmm recheck"] = ours["recheck"]
        row.update({"hdmm": ours["value"], "hdmm seconds": ours["seconds"], "hdmm optimizer": ours["optimizer"],
                    "hdmm certified": ours["certified"], "hdmm exact": ours["exact"],
                    "hdmm / RP+ exact": ours["value"] / row["RP+ exact"], "hdmm candidates": ours["candidates"]})
        for name in optimizers:
            try:
                named = run_hdmm(case, objective, [name], repeats=repeats)
                row[f"{name}"] = named["value"]
                row[f"{name} seconds"] = named["seconds"]
            except (ValueError, KeyError, TypeError) as err:
                row[f"{name}"] = None
                row[f"{name} seconds"] = None
                print(f"  {name}: not run ({err})", flush=True)
        row["load average"] = os.getloadavg()[0]  # of the machine over the last minute, at the end of the row
        print({k: v for k, v in row.items() if k != "hdmm candidates"}, flush=True)
        # merged into the rows on file just before writing, so that runs of other workloads may overlap
        out_json = RESULTS / f"{out}.json"
        rows = {r["workload"]: r for r in json.loads(out_json.read_text())["rows"]} if out_json.exists() else {}
        rows[case["name"]] = row
        write(rows, out)


def write(rows: dict, out: str = "residualplanner") -> None:
    order = [c["name"] for c in cases()]
    ordered = [rows[n] for n in order if n in rows] + [r for n, r in rows.items() if n not in order]
    RESULTS.mkdir(exist_ok=True)
    threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    (RESULTS / f"{out}.json").write_text(json.dumps({"snapshot": SNAPSHOT, "threads": threads,
                                                              "rows": ordered}, indent=1))
    lines = ["# hdmm against ResidualPlanner+ on its benchmark workloads", "",
             f"ResidualPlanner+ (RP+) snapshot {SNAPSHOT[:7]}; Gaussian noise, zCDP rho = 0.5 (unit noise variance per "
             "unit squared L2 sensitivity in both tools). Written by `benchmarks/residualplanner.py` (how to rerun, "
             "the workloads and the exact evaluation: its docstring). Seconds at one BLAS thread (hdmm: the fastest "
             "of 3 runs when one takes under 5 s); RP+'s include building its planner (its per-attribute basis "
             "search), as its scripts time it. A value marked (bound) is an upper bound on hdmm's error (OPT_+ "
             "beyond its exact-error size).", "",
             "RP+ exact: RP+'s strategy re-evaluated exactly: per subset T of attributes, the Kronecker product of "
             "its per-attribute bases on T and a total row off T, scaled by its noise level for T; the exact L2 "
             "sensitivity of the union; least-squares reconstruction. RMSE rows: its sum planner's bases, noise "
             "matrices and noise levels (its planner is consistent there, and its self-report is exact). Largest "
             "variance: its max planner's variance formula is that of this strategy (bases `R` with white noise), "
             "but its privacy cost is that of the measurement its code runs (noise `R z` added to `R x`, i.e. the "
             "strategy with each basis whitened to an orthonormal one), and its self-report mixes the two: it is "
             "not the variance of either when `R R^T` is not a multiple of the identity (its optimized Prefix "
             "bases). RP+ exact is the strategy at its true sensitivity; RP+ as run is the measurement its code "
             "runs (much worse: its noise levels were chosen for the other variance).", ""]
    loads = [r["load average"] for r in ordered if "load average" in r]
    if loads:
        lines[2] += (f" One-minute load average of the machine (2 cores) at the end of the {len(loads)} of "
                     f"{len(ordered)} rows that record it (in the JSON): {min(loads):.1f} to {max(loads):.1f}; on a "
                     "busy machine the seconds are longer than on an idle one.")
    named = list(dict.fromkeys(k for r in ordered for k in r if k not in _BASE_KEYS and not k.endswith(" seconds")
                               and k not in ("RP+ exact RMSE", "RP+ as run", "RP+ as run RMSE")))
    for objective in ("rmse", "max variance"):
        chosen = [r for r in ordered if r["objective"] == objective]
        if not chosen:
            continue
        if objective == "rmse":
            lines += ["## RMSE per query", ""]
            head = ["workload", "queries", "RP+ self-reported", "RP+ exact", "RP+ s", "hdmm", "hdmm s",
                    "hdmm / RP+ exact", "hdmm optimizer", "certified"]
        else:
            lines += ["## Largest per-query variance", ""]
            head = ["workload", "queries", "RP+ self-reported", "RP+ exact", "RP+ s", "hdmm", "hdmm s",
                    "hdmm / RP+ exact", "hdmm optimizer", "certified", "RP+ exact: RMSE", "RP+ as run",
                    "hdmm / RP+ as run"]
        recheck = any("hdmm recheck" in r for r in chosen)
        head += (["hdmm re-evaluated here"] if recheck else []) + named
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in chosen:
            hd = _fmt(r["hdmm"]) + ("" if r.get("hdmm exact", True) else " (bound)")
            cells = [r["workload"], f"{r['queries']:,}", _fmt(r["RP+ self-reported"]), _fmt(r["RP+ exact"])]
            if objective == "rmse":
                cells += [_fmt(r["RP+ seconds"], 3), hd, _fmt(r["hdmm seconds"], 3), f"{r['hdmm'] / r['RP+ exact']:.4f}"]
            else:
                cells += [_fmt(r["RP+ seconds"], 3), hd, _fmt(r["hdmm seconds"], 3), f"{r['hdmm'] / r['RP+ exact']:.4f}"]
            cells += [r["hdmm optimizer"], "yes" if r["hdmm certified"] else "no"]
            if objective != "rmse":
                cells += [_fmt(r["RP+ exact RMSE"]), _fmt(r["RP+ as run"]), f"{r['hdmm'] / r['RP+ as run']:.4f}"]
            cells += ([_fmt(r.get("hdmm recheck"))] if recheck else []) + [_fmt(r.get(k)) for k in named]
            lines.append("| " + " | ".join(cells) + " |")
        wins = sum(r["hdmm"] <= r["RP+ exact"] for r in chosen)
        lines += ["", f"hdmm at or below RP+ exact on {wins} of {len(chosen)} workloads"
                      + (f"; below RP+ as run on {sum(r['hdmm'] <= r['RP+ as run'] for r in chosen)}."
                         if objective != "rmse" else "."), "", "hdmm's candidates:", ""]
        lines += [f"- {r['workload']}: {r['hdmm candidates']}" for r in chosen]
        lines.append("")
    (RESULTS / f"{out}.md").write_text("\n".join(lines))


_BASE_KEYS = {"workload", "objective", "queries", "RP+ self-reported", "RP+ exact", "RP+ seconds", "evaluation seconds",
              "hdmm", "hdmm seconds", "hdmm optimizer", "hdmm certified", "hdmm exact", "hdmm / RP+ exact",
              "hdmm candidates", "load average", "hdmm recheck"}


def _fmt(x, digits: int = 5) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:.{digits}g}"


# ---------------------------------------------------------------------------------------------
# step 3: checks


def _dense_kron(mats: list[np.ndarray]) -> np.ndarray:
    out = np.ones((1, 1))
    for M in mats:
        out = np.kron(out, M)
    return out


def check_evaluator(seed: int = 0, off: float = 0.0) -> float:
    """The evaluator against generalised least squares in dense numpy and hdmm.per_query_variance.

    ``off``: size of a random part of the bases along the ones vector (RP+'s bases have one of
    about 1e-5 from its regularisation; the evaluator projects it away)."""
    import hdmm
    from hdmm.error import per_query_variance
    from hdmm.matrix import Explicit

    rng = np.random.default_rng(seed)
    domains, kinds = [4, 5, 3], "PPI"
    marginals = [(), (0,), (1, 2), (0, 1, 2), (0, 2)]
    worst = 0.0
    for gamma_kind in ("identity", "residual"):
        Rs, Gs = [], []
        for k in domains:
            R = rng.standard_normal((k - 1, k))
            R = R - R.mean(axis=1, keepdims=True) + off * rng.standard_normal((k - 1, 1))
            Rs.append(R)
            Gs.append(np.eye(k - 1) if gamma_kind == "identity" else R)
        closure = sorted({T for A in marginals for k in range(len(A) + 1) for T in itertools.combinations(A, k)})
        noise = {T: float(rng.uniform(0.5, 2.0)) for T in closure}
        # dense: measurement blocks B_T with noise covariance sigma_T^2 kron(Gamma Gamma^T); whitened S
        blocks = []
        for T in closure:
            B = _dense_kron([Rs[i] if i in T else np.ones((1, k)) for i, k in enumerate(domains)])
            C = _dense_kron([Gs[i] @ Gs[i].T if i in T else np.ones((1, 1)) for i in range(len(domains))])
            vals, vecs = np.linalg.eigh(noise[T] * C)
            blocks.append((vecs / np.sqrt(vals)) @ vecs.T @ B)
        S = np.vstack(blocks)
        delta2 = float(np.max(np.sum(S * S, axis=0)))
        queries = {i: (hdmm.Prefix(k) if kinds[i] == "P" else hdmm.Identity(k)).dense() for i, k in enumerate(domains)}
        W = np.vstack([_dense_kron([queries[i] if i in A else np.ones((1, k)) for i, k in enumerate(domains)])
                       for A in marginals])
        dense = delta2 * np.einsum("ij,jk,ik->i", W, np.linalg.pinv(S.T @ S), W)
        mech = ResidualMechanism([whitened(R, gamma_kind) for R in Rs], noise)
        ours = np.concatenate([mech.variances(A, queries) for A in marginals])
        totals = np.array([mech.total_error(A, queries) for A in marginals])
        sizes = [math.prod(domains[i] for i in A) for A in marginals]
        split = np.split(dense, np.cumsum(sizes)[:-1])
        case = {"domains": domains, "kinds": kinds, "marginals": marginals}
        via_hdmm = per_query_variance(hdmm_workload(case), Explicit(S), hdmm.ZCDP(0.5))
        worst = max(worst, float(np.max(np.abs(ours - dense) / dense)),
                    float(np.max(np.abs(totals - [s.sum() for s in split]) / totals)),
                    float(np.max(np.abs(via_hdmm - dense) / dense)))
    print(f"exact evaluator against dense numpy and hdmm.per_query_variance (bases off the ones-orthogonal space by "
          f"{off:g}): largest relative difference {worst:.2e}")
    if worst > (1e-9 if off == 0 else 100 * off):
        raise SystemExit("the exact evaluator disagrees with dense numpy")
    return worst


def check_workloads() -> None:
    """Each hdmm workload against RP+'s: its marginals (checked in step 1), its per-attribute matrices
    (RP+'s own, stored with the reference), and the dense rows up to order on a small domain."""
    meta, store = load_reference()
    compared = 0
    for case in cases():
        if case["name"] not in meta:
            continue
        queries = per_attribute_queries(case)
        for i, (k, kind) in enumerate(zip(case["domains"], case["kinds"])):
            if not np.array_equal(queries[i], store[f"W.{kind}.{k}"]):
                raise SystemExit(f"{case['name']}: attribute {i}'s queries differ from RP+'s")
        if [tuple(T) for T in meta[case["name"]]["subsets"]] and _queries(case) != meta[case["name"]]["queries"]:
            raise SystemExit(f"{case['name']}: query count differs from RP+'s")
        # dense rows up to order on a small domain: each attribute shrunk to at most 3 values
        small = dict(case, domains=[min(k, 3) for k in case["domains"]])
        if len(small["domains"]) > 8:
            small["domains"] = small["domains"][:8]
            small["kinds"] = small["kinds"][:8]
            small["marginals"] = [A for A in case["marginals"] if max(A, default=-1) < 8]
            if not small["marginals"]:
                continue
        ours = hdmm_workload(small).dense()
        theirs = np.vstack([_dense_kron([_rp_matrix(store, small["kinds"][i], k) if i in A else np.ones((1, k))
                                         for i, k in enumerate(small["domains"])]) for A in small["marginals"]])
        if ours.shape != theirs.shape or not np.array_equal(ours[np.lexsort(ours.T)], theirs[np.lexsort(theirs.T)]):
            raise SystemExit(f"{case['name']}: hdmm's workload differs from RP+'s on a small domain")
        compared += 1
    print(f"workloads: all {len([c for c in cases() if c['name'] in meta])} have RP+'s marginals, query counts and "
          f"per-attribute matrices; {compared} compared densely (rows up to order) on a small domain")


def _rp_matrix(store: dict, kind: str, k: int) -> np.ndarray:
    """RP+'s per-attribute query matrix on ``k`` values: the leading block of one it built (its
    ``prefix_workload``, row i ones on 0..i, or the identity), which is its matrix on ``k`` values."""
    built = [v for key, v in store.items() if key.startswith(f"W.{kind}.") and v.shape[0] >= k]
    return built[0][:k, :k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["reference", "compare", "check", "table"])
    parser.add_argument("--only", nargs="+", help="workload names (or their prefixes) to run")
    parser.add_argument("--rpp", default="/tmp/rpp", help="reference: the unpacked ResidualPlanner+ snapshot")
    parser.add_argument("--repeats", type=int, default=3,
                        help="reference: best of this many runs (sum planner); compare: of hdmm's runs under 5 s")
    parser.add_argument("--optimizers", nargs="*", default=["residual_bases"],
                        help="compare: also run each of these hdmm optimizers alone (missing names are reported as '-'; "
                             "default: residual_bases, the residual family with optimized per-attribute bases)")
    parser.add_argument("--out", default="residualplanner",
                        help="compare, table: name of the results files under benchmarks/results/ (.json, .md)")
    args = parser.parse_args()
    if args.step == "reference":
        reference(args.rpp, args.only, args.repeats)
    elif args.step == "compare":
        compare(args.only, args.optimizers, args.repeats, args.out)
    elif args.step == "check":
        check_evaluator()
        check_evaluator(off=1e-5)
        check_workloads()
    else:
        out_json = RESULTS / f"{args.out}.json"
        write({r["workload"]: r for r in json.loads(out_json.read_text())["rows"]}, args.out)


if __name__ == "__main__":
    main()
