"""PL94-171 (2020 tables) from the nation down, at the 2020 production budget: least squares, non-negative, integer.

Run ``python benchmarks/census_production.py [--states 11,10,44] [--levels state,county,tract,block_group,block]
[--engine local|spark] [--partition county] [--workers 1] [--allocation hdmm|production] [--write]``; it writes
``benchmarks/results/census_production.md`` (and ``.json``).
Every output (least squares, non-negative, integer) is released in its own process (peak memory is
the memory of that process and its children, PSS summed (geography.PeakMemory), sampled every 0.5 s,
up to the end of the release
and then with the accuracy report, which holds every unit's true answers), with one BLAS thread.

The setting, for every run:

* data: the SYNTHETIC United States (census_workloads.geography: real 2010 state populations and
  counties per state, made-up counties, tracts, block groups and blocks), as many synthetic persons
  as the states' 2010 populations, drawn from the CPH model, seen over the 2,016 DAS PL94 cells
  (census_workloads.pl94_2020.PL94Histograms);
* workload: the 2020 PL94-171 person tables P1-P5 (298 queries per unit);
* privacy: production's rho = 293764/114921 for bounded neighbours, i.e. hdmm's
  ZCDP(146882/114921) for add/remove neighbours for strategies whose bounded factor is 2 (checked:
  census_workloads.allocations.bounded_factor), spent on the levels released (production's budget
  of those levels when fewer than six);
* person strategy: hdmm's, optimized for the tables under a total-population row of weight 30
  (census_workloads.allocations.total_first), level weights optimized (every level's mean squared
  error counts the same); invariants: the state totals (as production's);
* error against the true answers of the synthetic data: census_workloads' accuracy report
  (hdmm.georelease.report), with production's measurement sigma of total population per level
  (census_workloads.das2020) as the goal of the integer output; on Spark, and on the local engine with
  ``--write`` (the release written to files as it goes, each partition's estimates on disk), the answers
  are read back from the release files, which are removed afterwards.

With ``--allocation production``: production's own mechanism instead of hdmm's person strategy, its
per-level strategies and shares at the same rho (census_workloads.das2020.ProductionConfig.geo_plan),
estimated top down from each level's own measurements (non-negative and integer outputs).

With ``--workload sf1 [--epsilon 1]``: SF1 Persons (census_workloads.sf1_persons, 4,151 queries per unit)
over its 492,660 cells instead, as many synthetic persons, pure DP epsilon, hdmm's person strategy
(geo_plan's default), no invariants.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from geography import PeakMemory  # noqa: E402

RESULTS = Path(__file__).parent / "results"
OUTPUTS = {"least squares": None, "non-negative": "nonnegative", "integer": "integer"}
TOTAL_WEIGHT = 30.0


def setting(states: tuple[str, ...] | None, levels: tuple[str, ...], total_weight: float = TOTAL_WEIGHT,
            workload: str = "pl94", epsilon: float = 1.0, allocation: str = "hdmm"):
    """The tree, data source, plan inputs and production's budget of the released levels (PL94; SF1 Persons at
    pure DP ``epsilon``, without invariants, with ``workload="sf1"``). For ``allocation="production"`` the
    person strategy and privacy are production's own (``PL94_2020.geo_plan``): ``None`` here."""
    import hdmm
    from census_workloads.allocations import bounded_factor, total_first
    from census_workloads.das2020 import PL94_2020
    from census_workloads.geography import SyntheticHistograms, us_geography, us_tree
    from census_workloads.pl94_2020 import PL94Histograms, pl94_2020

    tree = us_tree(levels, states=states)
    people = int(us_geography(levels[:1], states=states)["population"].sum())  # the states' 2010 populations
    if workload == "sf1":  # SF1 Persons over its 492,660 cells, pure DP, the person strategy hdmm's default
        from census_workloads import sf1_persons
        return (tree, SyntheticHistograms(people, levels=levels, states=states, seed=1), sf1_persons(), "auto",
                hdmm.PureDP(epsilon), 1)
    source = PL94Histograms(SyntheticHistograms(people, levels=levels, states=states, seed=1))
    shares = sum(PL94_2020.level(name).share for name in tree.levels)
    W = pl94_2020()
    if allocation == "production":
        return tree, source, W, None, None, shares
    strategy = hdmm.plan(total_first(W, total_weight), "auto", hdmm.ZCDP(1.0), seed=0).strategy
    beta = Fraction(bounded_factor(strategy)).limit_denominator(10**6)
    privacy = hdmm.ZCDP(PL94_2020.rho * shares / beta)
    return tree, source, W, strategy, privacy, shares


def run(states, levels, output: str, engine: str, total_weight: float = TOTAL_WEIGHT, workload: str = "pl94",
        epsilon: float = 1.0, partition: str = "county", workers: int | None = 1, allocation: str = "hdmm",
        write: bool = False) -> dict:
    from census_workloads.das2020 import PL94_2020
    from hdmm.georelease import geo_plan, release_geography
    from hdmm.georelease.report import accuracy_report, true_answers

    out: dict = {"output": output, "engine": engine, "written": write or engine != "local"}
    with PeakMemory() as memory:
        start = time.perf_counter()
        tree, source, W, strategy, privacy, shares = setting(states, levels, total_weight, workload, epsilon, allocation)
        out["total weight"] = total_weight
        out["partition"], out["workers"] = partition, workers if engine == "local" else None
        totals = source.leaf_totals()
        b = tree.leaf_bounds("state")
        invariants = None if workload == "sf1" else {  # production's: the state totals
            "state": {code: float(totals[b[s]:b[s + 1]].sum()) for s, code in enumerate(tree.codes("state"))}}
        if allocation == "production":  # production's per-level strategies and shares, estimated top down
            plan = PL94_2020.geo_plan(tree, workload=W, invariants=invariants, partition=partition)
        else:
            plan = geo_plan(tree, W, privacy, strategy=strategy, invariants=invariants, partition=partition, seed=0)
        out["allocation"] = allocation
        out["plan seconds"] = time.perf_counter() - start
        out["units"] = {name: int(n) for name, n in zip(tree.levels, tree.sizes)}
        out["people"] = int(totals.sum())
        out["privacy"] = plan.privacy.description
        out["level weights"] = {tree.levels[d]: float(plan.level_weights[d]) for d in plan.measured}
        start = time.perf_counter()
        options = {"workers": workers} if engine == "local" else {}
        if write or engine != "local":  # the answers written to files as the release goes, then read back
            options["output"] = f"/tmp/hdmm-census-production-{os.getpid()}"
        release = release_geography(plan, source, seed=1, postprocess=OUTPUTS[output], engine=engine, **options)
        out["release seconds"] = time.perf_counter() - start
        out["release steps"] = dict(release.timings)
        out["release peak memory GB"] = memory.peak / 1e9  # so far: the release (before the report's truth)
        start = time.perf_counter()
        truth = true_answers(plan, source)
        report = accuracy_report({output: release}, truth)  # Spark's answers are read back from its files
        out["errors"] = report.errors.to_dict(orient="records")
        out["bias"] = report.bias.to_dict(orient="records")
        del truth, report
        if "output" in options:
            shutil.rmtree(options["output"])
        out["report seconds"] = time.perf_counter() - start
        out["expected RMSE"] = {tree.levels[d]: plan.expected_rmse(d) for d in plan.levels}
        out["production sigma"] = {name: PL94_2020.sigma(name) if name != "nation" and workload == "pl94" else None
                                   for name in tree.levels}
        out["budget share of the levels"] = str(shares)
    out["peak memory GB"] = memory.peak / 1e9
    return out


def _child(args) -> dict:
    states = None if args.states == "all" else tuple(args.states.split(","))
    return run(states, tuple(args.levels.split(",")), args.child, args.engine, args.total_weight, args.workload,
               args.epsilon, args.partition, args.workers, args.allocation, args.write)


def _report(results: list[dict], args) -> str:
    if args.workload == "sf1":
        lines = ["# SF1 Persons from the nation down, pure DP", "",
                 f"`python benchmarks/census_production.py --workload sf1 --epsilon {args.epsilon:g} --states "
                 f"{args.states} --levels {args.levels} --engine {args.engine} --partition {args.partition}"
                 f"{f' --workers {args.workers}' if args.engine == 'local' else ''}` "
                 "(module docstring: SYNTHETIC data, "
                 "no invariants).", ""]
    else:
        lines = ["# PL94-171 (2020 tables) from the nation down at the 2020 production budget", "",
                 f"`python benchmarks/census_production.py --states {args.states} --levels {args.levels} "
                 f"--engine {args.engine} --total-weight {args.total_weight:g} --partition {args.partition}"
                 f"{f' --workers {args.workers}' if args.engine == 'local' else ''} --allocation {args.allocation}"
                 f"{' --write' if args.write else ''}` "
                 "(module docstring: SYNTHETIC data, "
                 "production's rho, state totals held).", ""]
        if args.allocation == "production":
            lines += ["**Production's own mechanism**: its per-level strategies and level and query shares "
                      "(census_workloads.das2020.PL94_2020.geo_plan), every level estimated top down from its own "
                      "measurements as production does, with hdmm's non-negative projection and controlled rounding "
                      "in place of production's Gurobi steps. Its 'expected RMSE' column is each level's own "
                      "noisy measurement's error, before the top-down step.", ""]
    first = results[0]
    lines += [f"- units: {', '.join(f'{k} {v:,}' for k, v in first['units'].items())}; people {first['people']:,}",
              f"- privacy: {first['privacy']} (production's budget share of these levels: {first['budget share of the levels']})",
              f"- level weights: {', '.join(f'{k} {v:.3f}' for k, v in first['level weights'].items())}", ""]
    lines += ["| output | plan s | release s | report s | peak memory GB (release) | peak memory GB (with the report) "
              "| release steps |", "|---|---|---|---|---|---|---|"]
    for r in results:
        steps = ", ".join(f"{k} {v:.1f}" for k, v in r["release steps"].items())
        release_peak = r.get("release peak memory GB")
        lines.append(f"| {r['output']} | {r['plan seconds']:.1f} | {r['release seconds']:.1f} | "
                     f"{r['report seconds']:.1f} | {'-' if release_peak is None else f'{release_peak:.2f}'} | "
                     f"{r['peak memory GB']:.2f} | {steps} |")
    lines += ["", "Total population and all the workload's queries, per level (RMSE and MAE against the true answers; "
              "production's sigma is its noisy measurement's, the goal of the integer output):", "",
              "| output | level | units | total RMSE | total MAE | production sigma | all queries RMSE | expected RMSE (least squares) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        by = {}
        for row in r["errors"]:
            by.setdefault(row["level"], {})[row["measure"]] = row
        for level, rows in by.items():
            t, a = rows["total population"], rows["all queries"]
            sigma = r["production sigma"].get(level)
            lines.append(f"| {r['output']} | {level} | {t['units']:,} | {t['RMSE']:.3f} | {t['MAE']:.3f} | "
                         f"{'-' if sigma is None else f'{sigma:.3f}'} | {a['RMSE']:.3f} | {r['expected RMSE'][level]:.3f} |")
    lines += ["", "Mean signed error of total population by unit size (true population), +/- one standard error:", "",
              "| output | level | size | units | mean signed error | standard error |", "|---|---|---|---|---|---|"]
    for r in results:
        for row in r["bias"]:
            lines.append(f"| {r['output']} | {row['level']} | {row['size']} | {row['units']:,} | "
                         f"{row['mean signed error']:.3f} | {row['standard error']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="11,10,44", help="FIPS codes separated by ',' or 'all' (default DC, DE, RI)")
    parser.add_argument("--levels", default="state,county,tract,block_group,block")
    parser.add_argument("--engine", default="local", choices=["local", "spark"])
    parser.add_argument("--outputs", default=",".join(OUTPUTS))
    parser.add_argument("--total-weight", type=float, default=TOTAL_WEIGHT,
                        help="weight of the total-population row steering the person strategy")
    parser.add_argument("--workload", default="pl94", choices=["pl94", "sf1"])
    parser.add_argument("--epsilon", type=float, default=1.0, help="pure DP epsilon of the SF1 runs")
    parser.add_argument("--partition", default="county", help="the partition level (default county)")
    parser.add_argument("--workers", type=int, default=1, help="the local engine's processes (default 1)")
    parser.add_argument("--allocation", default="hdmm", choices=["hdmm", "production"],
                        help="hdmm's person strategy and level weights, or production's per-level strategies and "
                             "shares (estimated top down; non-negative and integer outputs only)")
    parser.add_argument("--write", action="store_true",
                        help="local engine: write the answers to files as the release goes (release_geography's "
                             "output=: each partition's estimates kept on disk), read back for the report")
    parser.add_argument("--name", default="census_production", help="results file name (without extension)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    results = []
    for output in args.outputs.split(","):
        cmd = [sys.executable, __file__, "--child", output, "--states", args.states, "--levels", args.levels,
               "--engine", args.engine, "--total-weight", str(args.total_weight), "--workload", args.workload,
               "--epsilon", str(args.epsilon), "--partition", args.partition, "--workers", str(args.workers),
               "--allocation", args.allocation] + (["--write"] if args.write else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit(f"{output} failed")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"{output}: release {results[-1]['release seconds']:.1f} s, peak {results[-1]['peak memory GB']:.2f} GB",
              flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(results, indent=1, default=float))
    (RESULTS / f"{args.name}.md").write_text(_report(results, args))
    _plots(results, RESULTS / args.name)
    print((RESULTS / f"{args.name}.md").read_text())


def _plots(results: list[dict], stem: Path) -> None:
    """``<stem>-error.png`` (total-population RMSE by level) and ``<stem>-bias.png`` (mean signed error by unit size,
    every level of more than one unit), if matplotlib is installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no plots (pip install 'hdmm[plot]')")
        return
    import pandas as pd
    from hdmm.georelease.report import AccuracyReport, size_bin_labels
    from hdmm.georelease.report_plots import plot_bias_by_size, plot_error_by_level

    outputs = tuple(r["output"] for r in results)
    frames = []
    for key in ("errors", "bias"):
        frame = pd.DataFrame([row for r in results for row in r[key]])
        if frame.empty:
            return
        levels = list(dict.fromkeys(frame["level"]))
        frame["level"] = pd.Categorical(frame["level"], categories=levels, ordered=True)
        frame["output"] = pd.Categorical(frame["output"], categories=list(outputs), ordered=True)
        frames.append(frame)
    sizes = list(dict.fromkeys(row["size"] for r in results for row in r["bias"]))
    frames[1]["size"] = pd.Categorical(frames[1]["size"], categories=[b for b in size_bin_labels() if b in sizes],
                                       ordered=True)
    report = AccuracyReport(frames[0], frames[1], results[0]["privacy"], outputs)
    plot_error_by_level(report, path=f"{stem}-error.png")
    plot_bias_by_size(report, path=f"{stem}-bias.png")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
