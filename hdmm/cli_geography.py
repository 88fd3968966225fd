"""``hdmm release --geography``: a person workload for every unit of nation, states, counties, tracts and below.

::

    hdmm release --workload sf1 --epsilon 1 --geography state,county --output out/
    hdmm release --workload sf1 --rho 0.5 --geography state,county,tract --data persons.parquet \\
        --tree geography.csv --engine spark --output out/

The geography tree must be public: by default the built-in SYNTHETIC United States
(:mod:`census_workloads.geography`, which the built-in synthetic people live in, e.g. written to
Parquet with ``census_workloads.geography.synthetic_persons_in``); for other data give ``--tree``
(a CSV or Parquet table with one row per finest unit and the ``--geography`` columns, e.g. from
the Census gazetteer). The tree is never taken from the data: which units have people is private,
so records with codes not in the tree are refused with their number and the tree's unit under
which the first of them leaves the tree, never with their codes. ``--invariants state`` holds
the data's state totals exact: they are then published without noise and are not protected.
The output is a Parquet dataset partitioned by level (``out/level=state/...``, so ``--output``
names a directory) with the provenance in ``out/_provenance.json``: the privacy spent, the plan,
the workload (as typed and by fingerprint), the data source, the tree and the creation time.

Everything is checked before any noise is drawn or any budget is charged, with the checks of
plain releases (:mod:`hdmm.cli_inputs`): the output directory can be created, the records file
has records and every column the release reads (the level columns and the person attributes);
on Spark from Parquet the records' codes and values are checked by Spark before the plan is
shown. Nothing is written unless the whole release succeeds.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import pandas as pd
from tqdm import tqdm

from .budget import Budget, settle_quietly
from .catalog import NamedWorkload
from .cli_inputs import UsageError, check_records_count, need_pyarrow, probe_directory, read_records
from .geography import GeographyTree
from .georelease import RecordHistograms, geo_plan, release_geography
from .georelease.files import check_output
from .georelease.release import ENGINES
from .georelease.units import check_record_columns
from .io import load_strategy, workload_fingerprint
from .matrix import Identity
from .privacy import Privacy

__all__ = ["geography_release", "add_geography_options", "check_geography_options"]


#: The options that only a geography release reads (refused without ``--geography``).
GEOGRAPHY_ONLY = ("tree", "levels", "engine", "master", "invariants", "workers")


def check_geography_options(args: argparse.Namespace) -> None:
    """Refuse the geography options given without ``--geography`` (a plain release would ignore them)."""
    if args.geography is not None:
        return
    given = [f"--{name}" for name in GEOGRAPHY_ONLY if getattr(args, name, None) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} only apply to a geography release: add --geography LEVELS (e.g. "
                         f"--geography state,county) or leave out {', '.join(given)}")


def add_geography_options(p: argparse.ArgumentParser) -> None:
    """The ``--geography`` options of ``hdmm release``."""
    g = p.add_argument_group("geography (a release for every unit of every level)")
    g.add_argument("--geography", help="the levels below the nation, coarsest first, as data columns, e.g. "
                   "state,county,tract; the output is then a Parquet dataset partitioned by level")
    g.add_argument("--tree", default=None, help="the public geography: a .csv or .parquet table with one row per "
                   "finest unit and the --geography columns (default: the built-in synthetic United States of "
                   "census_workloads.geography; never taken from the data)")
    g.add_argument("--levels", help="the released levels (default: nation and every --geography level)")
    g.add_argument("--engine", choices=list(ENGINES), help="one process (default) or Apache "
                   "Spark (pip install 'hdmm[spark]', Java 17+; the master of --master, or of Spark's own "
                   "configuration: spark-submit, PYSPARK_SUBMIT_ARGS, MASTER, spark-defaults.conf; else local[2])")
    g.add_argument("--master", help="the Spark master of --engine spark, e.g. spark://host:7077 or local[4] "
                   "(default: Spark's own configuration, else local[2])")
    g.add_argument("--invariants", help="levels whose totals are held exact from the data, e.g. state (those "
                   "totals are published without noise: they are NOT protected)")
    g.add_argument("--workers", type=int, help="processes of the local engine (default: every core for releases "
                   "of 2,000 units or more); the answers do not depend on it")


def _levels(text: str) -> list[str]:
    levels = [x.strip() for x in text.split(",") if x.strip()]
    if not levels:
        raise ValueError("--geography needs level names, e.g. state,county,tract")
    return levels


def _tree(args: argparse.Namespace, levels: list[str]) -> GeographyTree:
    if args.tree is None:
        from census_workloads.geography import LEVELS, us_tree

        if tuple(levels) != LEVELS[:len(levels)]:
            raise ValueError(f"the built-in geography has the levels {','.join(LEVELS)}: give --geography as the "
                             "first of them, e.g. state,county,tract or state,county,tract,block_group,block")
        return us_tree(tuple(levels))
    path = args.tree
    if not path.endswith((".csv", ".parquet")):
        raise ValueError(f"--tree {path}: expected a .csv or .parquet table of units")
    table = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path, dtype=str)
    return GeographyTree.from_table(table.astype({c: str for c in levels if c in table.columns}), levels)


def _check_output(path: str | None, engine: str, master: str | None) -> None:
    """``--output`` of a geography release: a new directory that can be created, checked before any charge (for
    Spark through Spark's file system: a URL, or a path on Spark's default file system)."""
    if path is None:
        raise UsageError("--geography writes a Parquet dataset: give --output DIRECTORY (a new one)")
    if os.path.splitext(os.path.normpath(path))[1].lower() in (".csv", ".tsv", ".txt", ".json", ".npz"):
        raise UsageError(f"--output {path}: --geography writes a Parquet dataset, a directory of files partitioned "
                         "by level: give a directory name, e.g. --output release/")
    need_pyarrow("writing", "--output")
    if engine == "spark":
        from .georelease.session import require_spark, spark_session
        from .georelease.sparkfiles import SparkFiles

        try:
            require_spark()
            SparkFiles(spark_session(master), path)  # the engine's own check, before any noise
        except (ImportError, RuntimeError) as exc:
            raise UsageError(str(exc)) from None
        except FileExistsError as exc:
            raise UsageError(f"--output: {exc}") from None
        return
    try:  # the engine's own check (a leftover partial directory too), before any noise
        check_output(path)
    except FileExistsError as exc:
        raise UsageError(f"--output: {exc}") from None
    probe_directory(os.path.normpath(path), "--output")  # the directory that will hold it, as for plain releases


def _records(args: argparse.Namespace, tree: GeographyTree, named: NamedWorkload, levels: list[str],
             synthetic: bool) -> tuple[pd.DataFrame | str, str]:
    """The records (a DataFrame, or a Parquet path that Spark reads) and how the output names them.

    A file is read as a plain release reads it (:func:`hdmm.cli_inputs.read_records`: no repeated
    column, at least one record), with the level columns as text (codes keep their leading zeros);
    a Parquet path for Spark is checked the same way from its schema and row count.
    """
    if synthetic:
        from census_workloads.geography import synthetic_persons_in

        people = named.built_in_records(synthetic_persons_in(args.people, tuple(levels), seed=args.data_seed))
        return people, f"{args.people:,} built-in SYNTHETIC people"
    if not args.data.endswith((".csv", ".parquet")):
        raise UsageError(f"--data {args.data}: expected a .csv or .parquet file of records")
    if args.engine == "spark" and args.data.endswith(".parquet"):  # read by Spark, at any URL it reaches
        from pyspark.errors import AnalysisException

        from .georelease.session import spark_session
        from .georelease.sparkfiles import HadoopFiles

        spark = spark_session(args.master)
        try:
            frame = spark.read.parquet(args.data)
        except AnalysisException as exc:
            raise FileNotFoundError(f"--data {args.data}: Spark cannot read it ({str(exc).splitlines()[0]})") from None
        check_records_count(args.data, frame.count())
        check_record_columns(frame.columns, tree, named.domain)
        files = HadoopFiles.of(spark)  # None on Spark Connect: the path as given
        return args.data, args.data if files is None else files.qualified(args.data)
    records = read_records(args.data, levels)
    check_record_columns(records.columns, tree, named.domain)
    return records, args.data


def _about(args: argparse.Namespace, named: NamedWorkload, synthetic: bool, source: str | None = None) -> dict:
    """What a geography release's provenance records of the command's inputs: the workload (as typed and by
    fingerprint, :func:`hdmm.io.workload_fingerprint`), the data source (``source``, Spark's URL of records it read,
    else the file's absolute path) and the tree, as plain releases record them.
    The number of records of a data file is private and not recorded."""
    return {
        "workload": {"name": args.workload, "description": named.description,
                     "queries": int(named.workload.shape[0]), "cells": int(named.domain.size),
                     "fingerprint": workload_fingerprint(named.workload),
                     "fingerprint_with_domain": workload_fingerprint(named.workload, named.domain)},
        "data": {"source": "synthetic", "records": args.people, "data_seed": args.data_seed} if synthetic else
        {"source": source or os.path.abspath(args.data), "records": None},
        "tree": "built-in synthetic United States (census_workloads.geography)" if args.tree is None else
        os.path.abspath(args.tree),
        "strategy": args.strategy if args.strategy in ("auto", "identity", PRODUCTION) else
        os.path.abspath(args.strategy),
        "noise_seed": args.noise_seed,
    }


#: ``--strategy`` of a geography release of ``pl94-2020``: the 2020 Census's own mechanism.
PRODUCTION = "production"


def _check_production(args: argparse.Namespace, levels: list[str]) -> None:
    """Refuse, before any data is read, ``--strategy production`` where it does not apply."""
    if args.strategy != PRODUCTION:
        return
    from census_workloads.das2020 import PL94_2020

    try:
        PL94_2020.check_levels(["nation", *levels])
    except ValueError as e:
        raise UsageError(f"--strategy production measures the 2020 Census's levels in order ({e}); --geography "
                         "lists them below the nation") from None
    if args.workload != "pl94-2020":
        raise UsageError("--strategy production is the 2020 Census's mechanism for the PL94-171 tables over its "
                         "2,016 cells: use --workload pl94-2020")
    if args.postprocess is None:
        raise UsageError("--strategy production is estimated top down from each level's own measurements, as the "
                         "Census did: add --postprocess integer (or nonnegative)")


def _production_plan(tree: GeographyTree, named: NamedWorkload, privacy: Privacy, released, invariants):
    """The 2020 production plan (:meth:`census_workloads.das2020.ProductionConfig.geo_plan`) at ``privacy``."""
    from census_workloads.das2020 import PL94_2020

    try:
        return PL94_2020.geo_plan(tree, workload=named.workload, privacy=privacy, levels=released,
                                  invariants=invariants)
    except ValueError as e:
        raise UsageError(f"--strategy production: {e}") from None


def _person_strategy(spec: str, named: NamedWorkload):
    """``--strategy``: ``auto`` (optimized), ``identity``, or a strategy file over the person domain."""
    if spec == "auto":
        return "auto"
    if spec == "identity":
        return Identity(named.domain.size)
    strategy, _ = load_strategy(spec)
    if strategy.shape[1] != named.domain.size:
        raise ValueError(f"--strategy {spec} is over {strategy.shape[1]:,} cells, the person domain has "
                         f"{named.domain.size:,}: optimize it for the person workload (without geography)")
    return strategy


class _Bars:
    """A progress bar per step of a release (its ``step(name, done, total)`` reports: hdmm.georelease.steps.Progress),
    with the rate and the time left."""

    def __init__(self) -> None:
        self.bars: dict[str, tqdm] = {}

    def step(self, name: str, done: int, total: int) -> None:
        if name not in self.bars:
            self.close()
            self.bars[name] = tqdm(total=total, desc=f"release: {name}", file=sys.stderr, leave=False)
        self.bars[name].update(done - self.bars[name].n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


def geography_release(args: argparse.Namespace, privacy: Privacy, named: NamedWorkload,
                      budget: Budget | None = None) -> None:
    """Run ``hdmm release --geography`` (module docstring); ``budget`` (``--budget``) is charged once."""
    levels = _levels(args.geography)
    engine = args.engine or "local"
    if engine == "spark" and args.workers is not None:
        raise UsageError("--workers sets the local engine's processes; Spark's come from its master (local[N] or "
                         "the cluster): leave out --workers")
    if args.master is not None and engine != "spark":
        raise UsageError("--master is the Spark master: add --engine spark")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: give a positive number of processes")
    _check_output(args.output, engine, args.master)
    _check_production(args, levels)
    if any(level in named.domain.names for level in levels):
        raise ValueError(f"the workload's domain has a {levels[0]!r} attribute already: use a person workload "
                         "(e.g. sf1, not sf1-states) with --geography")
    synthetic = args.data in (None, "synthetic")
    if synthetic and not (named.data or "").startswith("synthetic"):
        raise ValueError("this workload has no built-in data: give --data FILE.parquet (or .csv) and --tree")
    tree = _tree(args, levels)
    released = None if args.levels is None else _levels(args.levels)
    start = time.perf_counter()
    records, data_note = _records(args, tree, named, levels, synthetic)
    source = None
    if isinstance(records, str):  # a Parquet path for Spark: read and checked by Spark, before the plan is shown
        from .georelease.spark import leaf_totals

        totals = leaf_totals(tree, records, domain=named.domain, codes=args.codes)
    else:
        source = RecordHistograms.of(tree, named.domain, records, codes=args.codes)
        totals = source.leaf_totals()
    invariants = None
    if args.invariants:
        invariants = {level: dict(zip(tree.codes(level), tree.aggregate(level, totals).tolist()))
                      for level in _levels(args.invariants)}
    read_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if args.strategy == PRODUCTION:
        plan = _production_plan(tree, named, privacy, released, invariants)
    else:
        plan = geo_plan(tree, named.workload, privacy, levels=released, invariants=invariants, seed=args.seed,
                        strategy=_person_strategy(args.strategy, named))
    plan_seconds = time.perf_counter() - start
    print(f"{named.description} for every unit of {list(tree.levels)} ({sum(tree.sizes):,} units)")
    print(f"  data: {data_note}")
    print(plan.describe())
    if invariants is not None:
        print("  note: the invariant totals are published exactly, without noise: they are not protected")
    label = f"{args.workload} by {','.join(levels)}"
    about = _about(args, named, synthetic, data_note if isinstance(records, str) else None)
    start = time.perf_counter()
    bars = _Bars()  # a bar per step, with its rate and the time left
    try:
        if engine == "spark":
            from .georelease.session import spark_session

            spark = spark_session(args.master)
            data = records if isinstance(records, str) else spark.createDataFrame(records)
            result = release_geography(plan, data, engine="spark", seed=args.noise_seed, output=args.output,
                                       domain=named.domain, codes=args.codes, progress=bars, budget=budget,
                                       label=label, postprocess=args.postprocess, about=about)
        else:
            result = release_geography(plan, source, seed=args.noise_seed, postprocess=args.postprocess,
                                       progress=bars, budget=budget, label=label, about=about, workers=args.workers,
                                       output=args.output)  # written as it goes: memory follows a partition
    finally:
        bars.close()
    if result.change is not None:
        kind = "integer" if result.postprocess == "integer" else "non-negative"
        print(f"  {kind} estimates (top down) moved the answers by RMSE " + ", ".join(
            f"{tree.levels[d]} {v:.3g}" for d, v in result.change.items()))
    # the time spent reading records grows with their number, which is private: shown for synthetic
    # data or with --evaluate only, as for hdmm release without --geography
    read = f"read data {read_seconds:.1f} s, " if synthetic or args.evaluate else ""
    parts = result.provenance()["partitions"]
    print(f"  {read}plan {plan_seconds:.1f} s, release {time.perf_counter() - start:.1f} s, in {parts['count']:,} "
          f"partitions ({'ranges of ' if parts['ranges_of_siblings'] else ''}{parts['level']} units)")
    print(f"wrote the answers of {len(plan.levels)} levels to {result.path} (Parquet, partitioned by level; "
          f"privacy and provenance in {result.path.rstrip('/')}/_provenance.json)")
    if budget is not None and result.charge is not None:
        settle_quietly(budget, result.charge, output=result.path if engine == "spark" else os.path.abspath(result.path))
        print("  " + budget.charged(result.charge))
    if args.noise_seed is not None:
        print("  note: the noise came from --noise-seed: reproducible, for tests and research only")

