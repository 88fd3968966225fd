"""The accuracy report of a small geography release: least squares against non-negative estimates.

Run ``python benchmarks/geography_accuracy.py [--state 50] [--levels state,county,tract]``; it
writes ``benchmarks/results/geography-accuracy.md`` and two plots beside it
(``geography-accuracy-error.png``, ``geography-accuracy-bias.png``). PL94 persons for every unit
of the SYNTHETIC geography of one state (default Vermont: 14 counties, 151 synthetic tracts, its
2010 population drawn by ``SyntheticHistograms``), zCDP at the 2020 production total
rho = 293764/114921 (as a float here), level weights optimized by hdmm, one seeded release of
each output, errors against the true answers (:mod:`hdmm.georelease.report`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

RESULTS = Path(__file__).parent / "results"
RHO = 293764 / 114921  # the 2020 production total for persons (PL94), from the public DAS configs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state", default="50", help="FIPS code of the state (default 50, Vermont)")
    p.add_argument("--levels", default="state,county,tract")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()

    import hdmm
    from census_workloads import pl94
    from census_workloads.geography import SyntheticHistograms, us_geography, us_tree
    from hdmm.georelease import geo_plan, release_geography
    from hdmm.georelease.report import accuracy_report, true_answers
    from hdmm.georelease.report_plots import plot_bias_by_size, plot_error_by_level

    levels, states = tuple(args.levels.split(",")), (args.state,)
    tree = us_tree(levels, states=states)
    people = int(us_geography(levels, states=states)["population"].sum())
    source = SyntheticHistograms(people, levels=levels, states=states, seed=1)
    seconds = {}
    start = time.perf_counter()
    plan = geo_plan(tree, pl94(), hdmm.ZCDP(RHO), seed=0)
    seconds["plan"] = time.perf_counter() - start
    outputs = {}
    for name, postprocess in (("least squares", None), ("non-negative", "nonnegative")):
        start = time.perf_counter()
        outputs[name] = release_geography(plan, source, seed=1, postprocess=postprocess)
        seconds[name] = time.perf_counter() - start
    start = time.perf_counter()
    truth = true_answers(plan, source)
    seconds["true answers"] = time.perf_counter() - start
    report = accuracy_report(outputs, truth, workload=plan.person.workload)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_error_by_level(report, path=out / "geography-accuracy-error.png")
    plot_bias_by_size(report, path=out / "geography-accuracy-bias.png")
    errors = report.errors[report.errors["measure"].isin(["total population", "all queries"])]
    lines = [
        "# Accuracy report of a small geography release: least squares and non-negative", "",
        f"`python benchmarks/geography_accuracy.py --state {args.state} --levels {args.levels}`: PL94 persons "
        f"(288 queries) for every unit of {tree!r}, the SYNTHETIC geography and people of "
        f"`census_workloads.geography` ({people:,} people). Privacy: {plan.privacy.description} (the 2020 "
        "production total rho 293764/114921 as a float), level weights optimized by hdmm: "
        + ", ".join(f"{tree.levels[d]} {plan.level_weights[d]:.3f}" for d in plan.measured) + ". One seeded "
        "release of each output (the same noise), errors against the true answers "
        "(`hdmm.georelease.report.accuracy_report`). With one release per output the figures are one draw: "
        "the expected RMSE of least squares per query is " + ", ".join(
            f"{tree.levels[d]} {plan.expected_rmse(d):.3f}" for d in plan.levels) + ".", "",
        "How to read it: `geography-accuracy-error.png` has one bar per output and level, the RMSE of the units' "
        "total population (the per-table figures are in the tables below); `geography-accuracy-bias.png` has one "
        "panel per level with more than one unit, one point per output and size bin: the mean signed error of the "
        "units' total population in the bin (positive: the output adds people) with +/- 1 standard error. The "
        "bias TopDown was criticised for shows as points above zero on the left (small units) and below zero on "
        "the right (large units). The notebook `notebooks/geography_accuracy.ipynb` draws the same plots for "
        "Vermont's nation, state and counties.", "",
        "Seconds (one BLAS thread, on a shared 2-core machine): " + ", ".join(
            f"{k} {v:.0f}" for k, v in seconds.items()) + ".", "",
        "## Error by level (`geography-accuracy-error.png`: RMSE of the total population per level)", "",
        "![error by level](geography-accuracy-error.png)", "",
        _markdown(errors), "",
        "Per PL94 table, RMSE:", "",
        _pivot(report, "RMSE"), "",
        "## Bias by size (`geography-accuracy-bias.png`: mean signed error of the total population by the unit's "
        "true population, +/- 1 standard error)", "",
        "![bias by size](geography-accuracy-bias.png)", "",
        _markdown(report.bias),
        "", "A bin with one unit has no standard error. The nation and the state are one unit each (and hold the "
        "same people here: one state), so only the counties and tracts show a size profile; the synthetic "
        "tracts are all about 4,000 people (except in the smallest counties), so the small bins hold few units.",
        "",
    ]
    (out / "geography-accuracy.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _markdown(frame) -> str:
    """A pandas frame as a Markdown table (numbers to 3 decimals; no tabulate needed)."""
    def cell(v) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)
    rows = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * frame.shape[1]]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _pivot(report, value: str) -> str:
    tables = report.errors[~report.errors["measure"].isin(["total population", "all queries"])]
    wide = tables.pivot_table(index=["level", "output"], columns="measure", values=value, observed=True)
    return _markdown(wide.reset_index())


if __name__ == "__main__":
    main()
