"""Geography releases: SF1 for every unit of nation, states, counties (local engine) and tracts (Spark).

Run ``python benchmarks/geography.py [--people 10000000] [--spark] [--full-us]``; it writes
``benchmarks/results/geography.md`` (and ``geography.json``). Every configuration runs in its own
process (so peak memory is that configuration's), with one BLAS thread. Privacy: pure DP,
epsilon = 1 (Laplace noise); RMSE is sqrt(mean squared error) over every unit of the level and
every SF1 query, expected (from the plan) and empirical (one release against the true answers of
the synthetic data).

Configurations:

* ``geography``: SF1 x (nation, states, counties), level weights optimized with every level's
  mean squared error weighed equally (the default), one release;
* ``geography, unit weights``: the same with every query weighed equally (so the 3,143
  counties dominate the objective);
* ``independent``: every county released on its own with the whole budget (parallel
  composition), states and nation summed from their counties (the same engine with only the
  county level measured);
* ``geography, nation and states``: the geography release of nation and states only, to compare
  with SF1+;
* ``sf1plus``: SF1+ (SF1 crossed with the 51 states, the state as an attribute, 25 million cells),
  the HDMM release of nation and states in one domain;
* Spark (``--spark``): SF1 at (nation, state, county, tract) for California (8,750 synthetic
  tracts, histograms drawn directly) at ``local[1]`` and ``local[2]``: units per second; with
  ``--full-us`` the whole country (72,665 tracts when measured; 84,414 since the
  geography took the 2020 tallies) at ``local[2]``; with ``--nonnegative``
  the District of Columbia (141 synthetic tracts) and California (8,750 synthetic tracts, 4,011 of
  them in one county, whose family is projected in groups) at ``local[2]`` with non-negative
  estimates (top down), how far they move the answers from least squares, and their error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results"
EPSILON = 1.0


class PeakMemory:
    """Peak memory of this process and all its descendants (Spark's JVM and Python workers, forked local workers),
    sampled: the sum of their proportional set sizes (PSS: a page shared by n processes counts 1/n in each, so
    forked workers' shared pages are counted once), or of their resident sizes where PSS is not available."""

    def __init__(self, interval: float = 0.5):
        import psutil

        self.process, self.interval, self.peak = psutil.Process(), interval, 0
        self.parts: dict[str, int] = {}  # the largest resident memory seen per kind of process
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil

        total, kinds = 0, {}
        for p in [self.process, *self.process.children(recursive=True)]:
            try:  # proportional set size: pages shared by forked workers are counted once, not per process
                try:
                    rss = p.memory_full_info().pss
                except (AttributeError, psutil.AccessDenied):  # no PSS on this system: resident size
                    rss = p.memory_info().rss
                kind = "driver" if p.pid == self.process.pid else ("JVM" if "java" in p.name() else "workers")
            except Exception:  # a worker that just ended
                continue
            total += rss
            kinds[kind] = kinds.get(kind, 0) + rss
        for kind, rss in kinds.items():
            self.parts[kind] = max(self.parts.get(kind, 0), rss)
        return total

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def _written_rmse(output: str, plan, tree, H, level: int) -> float:
    """RMSE of the answers written for ``level`` against the true answers, read level by level with
    pyarrow (codes and queries kept as dictionaries), without collecting the release through Spark."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(output, columns=["code", "query", "answer"], filters=[("level", "=", tree.levels[level])],
                          read_dictionary=["code", "query"])

    def positions(column: str, wanted: list[str]) -> np.ndarray:
        encoded = table.column(column).combine_chunks()
        if not pa.types.is_dictionary(encoded.type):
            encoded = encoded.dictionary_encode()
        found = pd.Index(wanted).get_indexer(encoded.dictionary.to_pylist())
        if (found < 0).any():
            raise ValueError(f"level {tree.levels[level]}: written {column}s not in the plan")
        return found[encoded.indices.to_numpy()]

    unit = positions("code", list(tree.codes(level)))
    query = positions("query", [str(q) for q in plan.person.workload.labels])
    truth = _true_answers(plan.person.workload, H, tree, level)
    return float(np.sqrt(np.mean((table.column("answer").to_numpy() - truth[unit, query]) ** 2)))


def _true_answers(W, H, tree, level):
    """Every unit's true answers: W x_u for the unit histograms of ``level``."""
    import scipy.sparse as sp

    bounds = tree.leaf_bounds(level)
    owner = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
    S = sp.csr_matrix((np.ones(owner.size), (owner, np.arange(owner.size))), shape=(bounds.size - 1, H.shape[0]))
    X = (S @ H).tocsr()
    return np.vstack([W @ X[i].toarray().ravel() for i in range(X.shape[0])])


def run_local(config: str, people: int) -> dict:
    import hdmm
    from census_workloads import sf1_persons
    from census_workloads.geography import synthetic_persons_in, us_tree
    from hdmm.georelease import RecordHistograms, geo_plan, release_geography

    W = sf1_persons()
    out: dict = {"config": config, "people": people, "privacy": f"PureDP({EPSILON})"}
    with PeakMemory() as memory:
        start = time.perf_counter()
        if config == "sf1plus":
            from census_workloads import cph_domain, sf1_plus, synthetic_persons

            records = synthetic_persons(people, seed=1, states=True)
            domain = cph_domain(state=True)
            x = domain.vectorize(records)
            out["read seconds"] = time.perf_counter() - start
            Wp = sf1_plus()
            start = time.perf_counter()
            plan = hdmm.plan(Wp, "auto", hdmm.PureDP(EPSILON), seed=0)
            out["plan seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            release = hdmm.run(Wp, x, hdmm.PureDP(EPSILON), strategy=plan, rng=1)
            out["release seconds"] = time.perf_counter() - start
            truth = release.workload @ x
            states = {name for _, name in __import__("census_workloads").STATES}
            national = np.array([not any(str(label).endswith(", " + s) for s in states) for label in Wp.labels])
            err = (release.answers - truth) ** 2
            out["levels"] = {
                "nation": {"units": 1, "expected RMSE": float(np.sqrt(np.mean(plan.variances[national]))),
                           "empirical RMSE": float(np.sqrt(np.mean(err[national])))},
                "state": {"units": 51, "expected RMSE": float(np.sqrt(np.mean(plan.variances[~national]))),
                          "empirical RMSE": float(np.sqrt(np.mean(err[~national])))},
            }
            out["strategy"] = repr(plan.strategy)
        else:
            levels = ("state",) if config == "geography, nation and states" else ("state", "county")
            tree = us_tree(levels)
            records = synthetic_persons_in(people, levels, seed=1)
            source = RecordHistograms.of(tree, __import__("census_workloads").cph_domain(), records)
            del records
            out["read seconds"] = time.perf_counter() - start
            start = time.perf_counter()
            level_weights = {"county": 1.0} if config == "independent" else "auto"
            weights = [1.0, 1.0, 1.0] if config == "geography, unit weights" else None
            plan = geo_plan(tree, W, hdmm.PureDP(EPSILON), level_weights=level_weights, weights=weights, seed=0)
            out["plan seconds"] = time.perf_counter() - start
            out["level weights"] = {tree.levels[d]: float(plan.level_weights[d]) for d in plan.measured}
            start = time.perf_counter()
            release = release_geography(plan, source, seed=1)
            out["release seconds"] = time.perf_counter() - start
            out["release steps"] = release.timings
            H = source.histograms(0, tree.leaves)
            out["levels"] = {}
            for d in plan.levels:
                truth = _true_answers(W, H, tree, d)
                out["levels"][tree.levels[d]] = {
                    "units": tree.sizes[d], "expected RMSE": plan.expected_rmse(d),
                    "empirical RMSE": float(np.sqrt(np.mean((release.answers(d) - truth) ** 2)))}
            out["strategy"] = repr(plan.person.strategy)
    out["peak memory GB"] = memory.peak / 1e9
    return out


#: The scopes of the Spark runs: the states (None: all) and the partition level.
SCOPES = {"full": ("United States", None, "state"), "ca": ("California", ("06",), "county"),
          "dc": ("District of Columbia", ("11",), "county"),
          # the release's default partitions (hdmm.georelease.pipeline.release_partitions): ranges of tracts
          "ca-default": ("California", ("06",), None), "dc-default": ("District of Columbia", ("11",), None)}


def run_spark(master: str, scope: str, people_per_tract: int, postprocess: str | None = None,
              heap: str | None = None) -> dict:

    import hdmm
    from census_workloads import sf1_persons
    from census_workloads.geography import SyntheticHistograms, us_tree
    from hdmm.georelease import geo_plan, release_geography
    from hdmm.georelease.spark import spark_session

    name, states, partition = SCOPES[scope]
    tree = us_tree(states=states)
    source = SyntheticHistograms(people_per_tract * tree.leaves, states=states, seed=1)
    out = {"config": f"spark {master}" + ("" if postprocess is None else f", {postprocess}")
           + ("" if heap is None else f", {heap} heap") + (", default partitions" if partition is None else ""),
           "scope": name,
           "units": int(sum(tree.sizes)), "tracts": tree.leaves, "people": int(source.leaf_totals().sum()),
           "privacy": f"PureDP({EPSILON})"}
    with PeakMemory() as memory:
        start = time.perf_counter()
        spark = spark_session(master) if heap is None else spark_session(master, memory=heap)
        out["spark start seconds"] = time.perf_counter() - start
        start = time.perf_counter()
        plan = geo_plan(tree, sf1_persons(), hdmm.PureDP(EPSILON), seed=0,
                        partition=partition)
        out["plan seconds"] = time.perf_counter() - start
        out["level weights"] = {tree.levels[d]: float(plan.level_weights[d]) for d in plan.measured}
        out["expected RMSE"] = {tree.levels[d]: plan.expected_rmse(d) for d in plan.levels}
        output = f"/tmp/hdmm-geo-bench-{master.replace('[', '').replace(']', '')}-{os.getpid()}"
        start = time.perf_counter()
        result = release_geography(plan, source, engine="spark", seed=1, output=output, spark=spark,
                                   postprocess=postprocess, progress=lambda s: print(s, file=sys.stderr, flush=True))
        out["release seconds"] = time.perf_counter() - start
        out["peak memory in the release GB"] = memory.peak / 1e9
        out["partitions"] = result.provenance()["partitions"]
        out["release steps"] = result.timings
        out["rows written"] = int(result.dataframe.count())
        out["units per second (measure stage)"] = out["units"] / result.timings["measure"]
        if result.change is not None:
            out["change RMSE"] = {tree.levels[d]: v for d, v in result.change.items()}
            H = source.histograms(0, tree.leaves)
            out["empirical RMSE"] = {tree.levels[d]: _written_rmse(output, plan, tree, H, d) for d in plan.levels}
        spark.stop()
    out["peak memory GB"] = memory.peak / 1e9
    out["peak memory by process GB"] = {k: v / 1e9 for k, v in memory.parts.items()}
    shutil.rmtree(output, ignore_errors=True)
    return out


def _child(args) -> dict:
    cmd = [sys.executable, __file__, "--child", args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{args} failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_seconds(r: dict) -> float:
    """The measure stage's seconds (named ``stage 1 (measure)`` in runs before the engine seam)."""
    steps = r["release steps"]
    return steps["measure"] if "measure" in steps else steps["stage 1 (measure)"]


def _report(results: list[dict]) -> str:
    lines = ["# Geography releases: SF1 for every unit from nation to tract", "",
             "`python benchmarks/geography.py` (one BLAS thread, each configuration in its own process; peak memory "
             "is the resident memory of the process and its children, sampled every 0.5 s). Pure DP, epsilon = 1; "
             "RMSE per query over every unit of the level, expected (the plan) and empirical (one release against "
             "the true answers of the synthetic data). The geography and counts per tract are SYNTHETIC "
             "(census_workloads.geography).", ""]
    local = [r for r in results if not r["config"].startswith("spark")]
    if local:
        lines += ["## SF1 x (nation, states, counties), 10M synthetic people, local engine", "",
                  "| configuration | level | units | expected RMSE | empirical RMSE |", "|---|---|---|---|---|"]
        for r in local:
            for level, v in r["levels"].items():
                lines.append(f"| {r['config']} | {level} | {v['units']:,} | {v['expected RMSE']:.3f} | "
                             f"{v['empirical RMSE']:.3f} |")
        lines += ["", "| configuration | read data s | plan s | release s | peak memory GB | level weights |",
                  "|---|---|---|---|---|---|"]
        for r in local:
            weights = ", ".join(f"{k} {v:.3f}" for k, v in r.get("level weights", {}).items()) or "-"
            lines.append(f"| {r['config']} | {r['read seconds']:.1f} | {r['plan seconds']:.1f} | "
                         f"{r['release seconds']:.1f} | {r['peak memory GB']:.2f} | {weights} |")
        lines.append("")
        by = {r["config"]: r["levels"] for r in local}
        lines += ["Ratios of expected RMSE (a ratio below 1 means the first is more accurate):", ""]
        for a, b in (("geography", "independent"), ("geography, unit weights", "independent"),
                     ("geography, nation and states", "sf1plus"), ("geography", "sf1plus")):
            if a in by and b in by:
                common = [lv for lv in by[a] if lv in by[b]]
                lines.append(f"- {a} / {b}: " + ", ".join(
                    f"{lv} {by[a][lv]['expected RMSE'] / by[b][lv]['expected RMSE']:.3f}" for lv in common))
        lines.append("")
    spark = [r for r in results if r["config"].startswith("spark")]
    if spark:
        lines += ["## SF1 x (nation, state, county, tract) on Spark, histograms drawn per tract", "",
                  "| run | scope | units | people | release s | measure stage s | units/s (measure) | rows written "
                  "| peak memory GB |", "|---|---|---|---|---|---|---|---|---|"]
        for r in spark:
            lines.append(f"| {r['config']} | {r['scope']} | {r['units']:,} | {r['people']:,} | "
                         f"{r['release seconds']:.0f} | {_measure_seconds(r):.0f} | "
                         f"{r['units per second (measure stage)']:.1f} | {r['rows written']:,} | "
                         f"{r['peak memory GB']:.2f} |")
        lines.append("")
        ca = {r["config"]: r for r in spark if r["scope"] == "California"}
        if "spark local[1]" in ca and "spark local[2]" in ca:
            one, two = ca["spark local[1]"], ca["spark local[2]"]
            lines.append(f"- Scaling with executors (California, measure stage): local[2] / local[1] = "
                         f"{two['units per second (measure stage)'] / one['units per second (measure stage)']:.2f}x "
                         f"units per second; whole release {one['release seconds'] / two['release seconds']:.2f}x.")
            us_units = 1 + 51 + 3143 + 84414  # the 2020 tract count (72,665 synthetic tracts before)
            rate = two["units"] / two["release seconds"]
            lines.append(f"- Extrapolated from California at local[2] ({rate:.1f} units/s over the whole release): "
                         f"the United States ({us_units:,} units) in about {us_units / rate / 60:.0f} minutes.")
        for r in spark:
            if "peak memory by process GB" in r:
                lines.append(f"- {r['config']} {r['scope']}: largest resident memory per kind of process: " + ", ".join(
                    f"{k} {v:.2f} GB" for k, v in r["peak memory by process GB"].items()))
            if "peak memory in the release GB" in r:
                parts = r["partitions"]
                lines.append(f"- {r['config']} {r['scope']}: peak memory in the release (before reading the answers "
                             f"back) {r['peak memory in the release GB']:.2f} GB; partitions: {parts['count']:,} "
                             f"at the {parts['level']} level" + (" (ranges of siblings)" if parts["ranges_of_siblings"] else ""))
            lines.append(f"- {r['config']} {r['scope']}: steps " + ", ".join(
                f"{k} {v:.0f} s" for k, v in r["release steps"].items()) + "; expected RMSE " + ", ".join(
                f"{k} {v:.2f}" for k, v in r["expected RMSE"].items()) + ("" if "change RMSE" not in r else
                "; the non-negative estimates moved the answers by RMSE " + ", ".join(
                    f"{k} {v:.2f}" for k, v in r["change RMSE"].items()) + "; their RMSE against the true answers "
                + ", ".join(f"{k} {v:.2f}" for k, v in r["empirical RMSE"].items())))
        lines.append("")
    lines += NOTES
    blocks = RESULTS / "geography_blocks.json"
    if blocks.exists():  # written by benchmarks/geography_blocks.py
        from geography_blocks import report as blocks_report

        lines += [""] + blocks_report(json.loads(blocks.read_text()))
    sections = RESULTS / "geography_sections.md"
    if sections.exists():  # hand-written sections (runs of other scripts), kept when the tables are rewritten
        text = sections.read_text()
        lines += ["", text[text.index("-->") + 3:].strip()] if text.startswith("<!--") else ["", text.strip()]
    return "\n".join(lines) + "\n"


#: What the tables cannot say: when each row was measured, and what the non-negative row shows.
NOTES = [
    "Notes. The California run at `local[1]` was taken before the Spark tasks wrote their answers with",
    "Arrow directly (its stage 3, 316 s for 36.6 million rows, now takes a tenth of that: the whole-US",
    "run wrote 314.9 million rows in 103 s) and before partitions were measured one county at a time;",
    "its measure stage is the same code as the whole-US run's, so the units per second compare (1.83x",
    "with two executors). The local-engine release times predate the per-unit answer operator (a",
    "unit's SF1 answers from its strategy answers by small Kronecker factors). All runs shared the two",
    "cores with other work (load average 2 to 6).",
    "",
    "The tract rows above were measured on the synthetic geography as it was before issue 23: 72,665",
    "tracts (California 8,750, 4,011 in one county; District of Columbia 141). It now has the 2020",
    "count, 84,414 tracts (California 10,183, 4,669 in one county; District of Columbia 164), with the",
    "same state and county populations; those rows have not been re-measured on it.",
    "",
    "Non-negative estimates (District of Columbia, 2026-11-25): the projections are measured through",
    "the person strategy. Before, they were Euclidean projections of the cells, and the same run moved",
    "the answers by RMSE 261,412 (nation, state, county: one unit each here) and 2,011 (tracts), their",
    "RMSE against the true answers being 261,410 and 2,011, in 37 s at 5.15 GB. Through the strategy",
    "the tracts' answers are more accurate than least squares (6.26 against 17.73 expected), the top",
    "unit's less (32.2 against 12.3): non-negativity trades the error of the sparse units for a bias",
    "at the top. Re-measured after the Gram-based projection (same answers): 32 s, 2.39 GB.",
    "",
    "Non-negative estimates (California, 2026-11-25, first run): 8,750 tracts, 4,011 of them in one",
    "county, a family of 116 million reduced cells, projected in 7 groups (more than 2**24 children x",
    "cells at once are projected in groups). It needed a Spark session of 8 GB: at 4 GB the stage-3",
    "task of that county ran the JVM out of heap (one partition's strategy answers, 1.2 GB, are held",
    "whole per task). The peak (15.4 GB: Python workers 10.0, JVM 7.0, driver 3.5) comes from two",
    "such tasks at once; the non-negative stage is 465 s of the 728 s. Tracts 8.03 against the truth",
    "(least squares 23.26 expected), counties 24.6 (23.5), the top 40.9 (18.7).",
    "",
    "Non-negative California on Spark `local[2]` at a 4 GB heap, memory (2026-11-28, issue 24; the",
    "2020 synthetic geography: 10,183 tracts, 4,669 in Los Angeles county, whose state is 4,670 units",
    "x 36,120 strategy rows, 1.35 GB). Memory was sampled every 2 s over all processes (PSS). Before,",
    "one Python worker reached 10.3 GB and the OOM killer took it. With the states exchanged as Arrow",
    "(`applyInArrow`/`mapInArrow`; commit dcc9ba8) the run peaked at 11.65 GB (driver 0.30, JVM 4.27,",
    "workers 7.08) in the estimate step, where the Los Angeles task held its state twice (Spark's 64 MB",
    "Arrow input batches, which PySpark keeps for the whole call, and the array gathered from them)",
    "plus the second pass's b, b / a and offsets (2.9 states): 6.9 GB in one worker. Its measure task",
    "peaked at 4.6 GB (its state, the first pass's b and b / a). The non-negative step peaked at 9.94",
    "GB (JVM 4.00, workers 5.60; the Los Angeles subtree task 4.4 GB resident: its state twice and a",
    "group of 518 tracts x 28,980 reduced cells in projection). Times, with other sessions' load of 3 to 6 on",
    "the 2 cores: measure 505 s, estimate about 60 s, then the root's fit 35 s and the state's family",
    "(58 counties) about 300 s; after 29 minutes of the non-negative step 28 of the 58 counties' subtree",
    "tasks were done and Los Angeles's had run 17 minutes (the District of Columbia's 164-tract family",
    "alone takes 167 s), and the run was stopped, so it has no row above. Then the passes in place",
    "(commits a3f6183 and 876914a: the same bits), measured in one",
    "process on the 568-tract county with the same task functions and no Spark: the measure task's",
    "peak above its start went from 3.5 to 2.6 times its state, the estimate task's from 2.9 to 1.1.",
    "Scaled to Los Angeles, the estimate task is about 4.8 GB instead of 6.9 and the estimate step",
    "about 9.5 GB, so the run's peak is about 10 GB at a 4 GB heap, in the non-negative step (JVM 4.0,",
    "the Los Angeles worker 4.4, the other worker 1.1, the driver 0.35): not under 8 GB (it was",
    "15.4 GB at an 8 GB heap, and killed at 4 GB). What holds it: the JVM; the partition's state twice in its",
    "task; the subtree projection's group. Under 8 GB needs the Los Angeles partition split below the",
    "county (no task above a set number of cells), or a smaller heap (not measured).",
    "",
    "Measured to completion (2026-11-28, commit ba1204d: states as Arrow, passes in place, the top-down",
    "walk reading its state row by row; the row \"spark local[2], nonnegative, 4g heap\" above): 5,637 s",
    "(measure 978 s, estimate 47 s, non-negative 4,612 s) beside two helper sessions' tests and",
    "benchmarks (load 2 to 7), peak 11.36 GB over all processes, so still above 8 GB. The largest",
    "per kind of process: the JVM 7.32 GB (at a 4 GB heap: about 3 GB outside it), the workers 5.27,",
    "the driver 3.52 (after the release, reading the answers back against the truth). A sampler of the",
    "processes' PSS every 3 s in the non-negative step's last task (Los Angeles's subtree) read the JVM",
    "at 6.70 GB, that task's worker at 2.84 GB and the whole run at 10.71 GB. The JVM's memory outside",
    "its heap is now the largest single part; the partitions' part is what ranges of sibling tracts",
    "(`GeoPlan.with_partitions`, opt-in) bound; not yet measured on SF1.",
    "",
    "On the release's default partitions (2026-11-28, commit 2a1a195; the row \"spark local[2],",
    "nonnegative, default partitions\" until the run below): 70 ranges of at most 464 tracts (Los Angeles's 4,669 in 11),",
    "4,480 s (measure 771 s, estimate 107 s, non-negative 3,601 s) beside other benchmarks and the test",
    "suite (load 2 to 5). Peak in the release 9.05 GB (sampled every 0.5 s), 10.42 GB with the answers read",
    "back. A second sampler, every 10 s, read at most 6.90 GB through the measure, estimate and non-negative",
    "tasks (JVM at most 3.3 GB, Python workers at most 3.1 GB): the peak came in the release's last",
    "seconds, after the non-negative tasks had ended, with the JVM alone at work (6.48 GB, where the",
    "step's 42.5M answer rows are written out) while the two idle Python workers still held 2.11 GB.",
    "Against 11.36 GB before: not yet under 8 GB. Left: the JVM's memory in that write and the memory the",
    "idle Python workers keep (not measured: a smaller heap, workers not reused between tasks).",
    "",
    "Under 8 GB (2026-11-28, commit a40f997; the row \"spark local[2], nonnegative, default partitions\"",
    "above, the same 70 partitions): each step's answers written one level at a time straight into",
    "level=<name> (Spark's partitionBy(\"level\") had sorted each write task's rows in the JVM's heap",
    "first), and each Python worker giving back what its last task freed as the next starts (Arrow's",
    "pool, glibc's malloc_trim). Peak 7.20 GB over all processes (sampled every 0.5 s), the same with the",
    "answers read back, against 9.05 (10.42) GB; the largest per kind: JVM 4.48 GB, workers 3.36, driver",
    "3.47 (reading the answers back). A sampler every 2 s put the peak in the non-negative tasks (7.24 GB:",
    "JVM 3.42, workers 3.36, driver 0.46); the answers' write (42.5M rows, about 25 s) peaked at 6.75 GB,",
    "and the workers fell to 0.25-0.32 GB between the last task and the write. 3,423 s (measure 511 s,",
    "estimate 48 s, non-negative 2,864 s), the test suite running beside it for the first 13 minutes.",
    "The answers are those of the run before: tracts 7.43 against the truth, counties 19.07, the top",
    "16.64; the non-negative estimates moved the tracts' answers by RMSE 21.48 (all as before to rounding).",
    "",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, default=10_000_000)
    parser.add_argument("--spark", action="store_true", help="also the Spark runs (California at local[1], local[2])")
    parser.add_argument("--full-us", action="store_true", help="also the whole country on Spark local[2]")
    parser.add_argument("--nonnegative", action="store_true",
                        help="also the District of Columbia and California on Spark local[2] with non-negative "
                             "estimates (top down)")
    parser.add_argument("--spark-memory", help="the Spark runs' driver heap (default: spark_session's)")
    parser.add_argument("--skip-local", action="store_true")
    parser.add_argument("--only", help="local configurations to run, separated by ';'")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child.split(":")
        if kind == "local":
            result = run_local(rest[0], int(rest[1]))
        else:
            result = run_spark(rest[0], rest[1], int(rest[2]), *[None if v == "-" else v for v in rest[3:]])
        print(json.dumps(result))
        return
    path = RESULTS / "geography.json"
    results = json.loads(path.read_text()) if path.exists() else []
    configs = ("geography", "geography, unit weights", "independent", "sf1plus", "geography, nation and states")
    todo = [] if args.skip_local else [f"local:{c}:{args.people}" for c in configs]
    if args.only:
        todo = [f"local:{c}:{args.people}" for c in args.only.split(";")]
    if args.spark:
        todo += ["spark:local[1]:ca:4258", "spark:local[2]:ca:4258"]
    if args.full_us:
        todo.append("spark:local[2]:full:4258")
    if args.nonnegative:
        todo += ["spark:local[2]:dc-default:4258:nonnegative", "spark:local[2]:ca-default:4258:nonnegative"]
    if args.spark_memory:
        todo = [job + (":-" if job.count(":") == 3 else "") + f":{args.spark_memory}" if job.startswith("spark")
                else job for job in todo]
    for job in todo:
        print(f"running {job} ...", file=sys.stderr, flush=True)
        result = _child(job)
        results = [r for r in results if (r["config"], r.get("scope")) != (result["config"], result.get("scope"))]
        results.append(result)
        path.write_text(json.dumps(results, indent=2))
        (RESULTS / "geography.md").write_text(_report(results))
    print((RESULTS / "geography.md").read_text())


if __name__ == "__main__":
    main()
