r"""A geography release: every unit's answers, consistent over the tree, with standard errors.

:func:`release_geography` runs a :class:`~hdmm.georelease.plan.GeoPlan` on data in one of two
engines with the same steps (:mod:`hdmm.georelease.pipeline`) and, for a given seed, the same
result: check the data against the plan (leaves, counts, invariants) before any noise, charge the
budget once, then measure and estimate partition by partition (e.g. a county and its subtree).

``engine="local"`` (the default) runs the partitions in this process or in forked workers. Without
``output`` the release is held in memory (every unit's answers); with ``output`` each partition's
estimates are kept on disk between steps and the answers are written straight into the release
files, so memory follows the largest partition, not the country. ``engine="spark"`` runs the
steps as Spark stages (:mod:`hdmm.georelease.spark`).

Every parent's answers equal the sum of its children's (up to floating-point rounding), because
every unit's estimate is the sum of its finest measured descendants' estimates.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from ..budget import Budget, Charge
from .files import finish_output, read_answers, start_output, write_units
from .stores import copy_release
from .nonneg import POSTPROCESS, check_nonnegative, integer_totals
from .pipeline import Engine, LocalEngine, release_partitions, run_release
from .plan import GeoPlan
from .report import total_query
from .steps import Progress, created_now, provenance
from .stores import DiskStore, MemoryAnswers, MemoryStore, ReleaseFiles
from .units import HistogramSource, check_source
from .workers import check_workers
from ..threads import one_blas_thread

__all__ = ["GeoRelease", "release_geography", "ENGINES", "EngineKind", "Opened", "engine_kind"]


@dataclass(frozen=True, eq=False)
class GeoRelease:
    """The released answers of every unit of the released levels (module docstring).

    Attributes
    ----------
    plan : GeoPlan
    estimates : dict
        ``level -> units x (queries + 1)``: the person queries' answers and the unit's total; empty
        for a release written to ``path``.
    seeded : bool
        Whether the noise came from a seed (reproducible: for tests and research only).
    timings : dict
        Seconds per step.
    postprocess : str or None
        ``"nonnegative"`` for the top-down non-negative estimates (:mod:`hdmm.georelease.nonneg`),
        ``"integer"`` for integer ones (non-negative, every parent's cells the sum of its
        children's, invariants exact: :meth:`hdmm.georelease.nonneg.TopDown.start`).
    change : dict or None
        With ``postprocess``: per level, the RMSE of the answers' change from least squares (the
        error the post-processing may add; the standard errors are those of least squares).
    charge : Charge or None
        What the release was charged to a :class:`~hdmm.Budget` (once for the whole release).
    about : dict
        What the provenance records of the release's inputs: ``created`` (UTC) and what the caller
        gave (``release_geography(about=...)``, e.g. the workload and the data source).
    path : str or None
        The release files (:mod:`hdmm.georelease.files`) of a release written by the engine
        (``release_geography(output=...)``); its answers are read back from them, a level at a time
        (a Spark release's through Spark, from whatever URL they were written to).
    """

    plan: GeoPlan
    estimates: dict[int, np.ndarray]
    seeded: bool
    timings: dict[str, float] = field(default_factory=dict)
    postprocess: str | None = None
    change: dict[int, float] | None = None
    charge: Charge | None = None
    about: dict = field(default_factory=dict)
    path: str | None = None
    _read: dict = field(default_factory=dict, repr=False)
    _files: object = field(default=None, repr=False)  # the engine's output target that wrote path

    def answers(self, level: str | int) -> np.ndarray:
        """``units x queries`` answers of a released level."""
        d = self._level(level)
        if d in self.estimates:
            return self.estimates[d][:, :-1]
        if d not in self._read:  # the last level read is kept (answers, then totals, of one level)
            self._read.clear()
            self._read[d] = (read_answers(self.path, self.plan, d) if self._files is None
                             else self._files.read(self.plan, d))
        return self._read[d]

    def totals(self, level: str | int) -> np.ndarray:
        """Estimated total of every unit of a released level (held exactly for invariant units); for a
        written release, its answer to the workload's total query (the files hold the queries only)."""
        d = self._level(level)
        if d in self.estimates:
            return self.estimates[d][:, -1]
        q = self.plan.memo("total query", lambda: total_query(self.plan.person.workload))
        if q is None:
            raise ValueError("the release's files hold the workload's queries only, and the workload has no total "
                             "query: add a total row to the workload to read the units' totals back")
        return self.answers(d)[:, q]

    def std_errors(self, level: str | int) -> np.ndarray:
        """``units x queries`` standard errors (upper bounds unless ``plan.variance_exact``; for a plan with
        per-level strategies, those of each level's own measurements: :meth:`GeoPlan.variances`)."""
        return np.sqrt(self.plan.variances(self._level(level)))

    def _level(self, level: str | int) -> int:
        d = self.plan.tree.level_index(level)
        if d not in self.plan.levels:
            raise ValueError(f"level {self.plan.tree.levels[d]!r} is not released; released: "
                             f"{[self.plan.tree.levels[x] for x in self.plan.levels]}")
        return d

    def table(self, level: str | int | None = None) -> pd.DataFrame:
        """Long table: ``level, code, name, query, answer, std_error`` (one row per unit and query)."""
        levels = self.plan.levels if level is None else (self._level(level),)
        return pd.concat([_level_table(self.plan, d, self.answers(d), self.std_errors(d)) for d in levels],
                         ignore_index=True)

    def provenance(self) -> dict:
        """What a file of this release records: privacy spent, sensitivity, levels, weights, invariants, charge."""
        return provenance(self.plan, self.seeded, self.charge, self.postprocess, self.about)

    def save(self, path: str | os.PathLike) -> None:
        """Write a Parquet dataset partitioned by level (``path/level=<name>/...``) with the provenance
        in every file's metadata and in ``path/_provenance.json`` (a written release's files are copied).
        Needs ``pyarrow`` (``hdmm[parquet]``)."""
        meta = self.provenance()
        if self.path is not None:
            if self._files is None:
                copy_release(self.path, path)
            else:
                self._files.copy(path, meta)
            return
        partial = start_output(path)
        for d in self.plan.levels:
            write_units(partial, self.plan, d, np.arange(self.plan.tree.sizes[d]), self.answers(d),
                        self.std_errors(d), meta, "part-0")
        finish_output(partial, path, meta)

    def __repr__(self) -> str:
        levels = ", ".join(f"{self.plan.tree.levels[d]}: {self.plan.tree.sizes[d]:,}" for d in self.plan.levels)
        where = "" if self.path is None else f"; written to {self.path}"
        return (f"GeoRelease({levels} units x {self.plan.queries:,} queries; {self.plan.privacy.description}"
                f"{where})")


def _level_table(plan: GeoPlan, d: int, answers: np.ndarray, std_errors: np.ndarray, first: int = 0) -> pd.DataFrame:
    tree, q = plan.tree, plan.queries
    units = answers.shape[0]
    labels = list(plan.person.workload.labels)
    codes = np.asarray(tree.codes(d)[first:first + units], dtype=object)
    names = np.asarray(tree.names(d)[first:first + units], dtype=object)
    return pd.DataFrame({
        "level": pd.Categorical([tree.levels[d]] * (units * q), categories=list(tree.levels)),
        "code": np.repeat(codes, q),
        "name": np.repeat(names, q),
        "query": pd.Categorical.from_codes(np.tile(np.arange(q), units), categories=pd.Index(labels).unique())
        if len(set(labels)) == len(labels) else np.tile(np.asarray(labels, dtype=object), units),
        "answer": answers.ravel(),
        "std_error": std_errors.ravel(),
    })


@one_blas_thread
def release_geography(plan: GeoPlan, data: HistogramSource, *, engine: str = "local", seed: int | None = None,
                      postprocess: str | None = None, budget: Budget | None = None, label: str | None = None,
                      progress: bool | Callable[[str], None] = False, about: dict | None = None, **engine_options):
    """Release ``plan`` on ``data`` (module docstring).

    Parameters
    ----------
    plan
        From :func:`~hdmm.georelease.plan.geo_plan`.
    data
        The per-leaf histograms: :class:`~hdmm.georelease.units.RecordHistograms` (records) or
        :class:`~hdmm.georelease.units.ArrayHistograms`; for ``engine="spark"`` also a Spark
        DataFrame of records or a Parquet path (see :func:`hdmm.georelease.spark.release_spark`).
    engine
        A name in :data:`ENGINES`: ``"local"`` (default) or ``"spark"``.
    engine_options
        The local engine's:

        * ``workers``: processes measuring and post-processing partitions at once
          (:mod:`hdmm.georelease.workers`; default ``None``: every core the process may use, for
          releases of at least ``POOL_UNITS`` units). The answers do not depend on it.
        * ``output``: write the release files (:mod:`hdmm.georelease.files`) to this new directory
          as the release goes, keeping each partition's estimates on disk between steps (in a
          private directory under ``work_dir``, default the output's parent, removed at the end):
          memory then follows the largest partition, not the tree. The result reads its answers
          back from the files.

        Spark's options: :func:`hdmm.georelease.spark.release_spark`.
    seed
        ``None`` (default): noise from fresh OS entropy, as a real release must. An int: every
        unit's noise from a stream derived from the seed and the unit (for tests and research only).
    progress
        ``False`` (default: nothing), ``True`` (a line per hundredth of each step's tasks, with the rate
        and the time left), a function of such a line, or an object with a method
        ``step(name, done, total)`` that gets every step's count of tasks instead
        (:class:`~hdmm.georelease.steps.Progress`; the command line draws its bars from it).
    postprocess
        ``None`` (least squares), ``"nonnegative"`` (top-down non-negative estimates,
        :mod:`hdmm.georelease.nonneg`, on either engine; the change it makes is reported) or
        ``"integer"`` (the same, rounded top down to consistent integer tables that keep the
        invariants: docs/math.md section 8.8).
    budget, label
        A :class:`~hdmm.Budget` to charge (once: the whole release spends ``plan.privacy``, every
        unit's noise being calibrated to the geography strategy's sensitivity), after the data are
        checked and before any noise is drawn; ``label`` names the release in the budget.
    about
        What the provenance (every file's, and :meth:`GeoRelease.provenance`) records of the
        release's inputs besides the plan: JSON-able, e.g. ``{"workload": {...}, "data": {...}}``
        (the command line records the workload's name and fingerprint and the data source). The
        time the release was made is recorded as ``created``.

    Returns
    -------
    GeoRelease (held in memory, or written to ``output``), or for Spark its
    :class:`~hdmm.georelease.spark.SparkGeoRelease` (a GeoRelease with a DataFrame of the answers).
    """
    if not isinstance(plan, GeoPlan):
        raise TypeError(f"plan must be a GeoPlan (from geo_plan), got {type(plan).__name__}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be None (OS entropy, for real releases) or an int, got {seed!r}")
    if postprocess not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {list(POSTPROCESS)}, got {postprocess!r}")
    if plan.per_level and postprocess is None:
        raise ValueError("a plan with per-level strategies is estimated top down from each level's own measurements "
                         "(hdmm.georelease.plan): release it with postprocess='nonnegative' or 'integer'")
    if budget is not None:
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be an hdmm.Budget, got {type(budget).__name__}")
        budget.check(plan.privacy)  # refused before any work; charged after the data checks
    kind = engine_kind(engine)
    plan = release_partitions(plan, postprocess)  # before the data are read
    unknown = sorted(set(engine_options) - set(kind.options))
    if unknown:
        raise TypeError(f"the {engine} engine takes only the options {list(kind.options)}, not {unknown}")
    label = label or f"geography release of {[plan.tree.levels[d] for d in plan.levels]}"
    about = {"created": created_now(), **(about or {})}
    if postprocess is not None:  # what the walk will hold, refused before the data are read
        check_nonnegative(plan, partitioned=kind.partitioned(engine_options))
    if postprocess == "integer":
        integer_totals(plan)
    start = time.perf_counter()
    opened = kind.open(plan, data, engine_options)  # the data read and checked against the plan, before any noise
    try:
        charge = None if budget is None else budget.charge(plan.privacy, label)  # on disk before any noise
        meta = provenance(plan, seed is not None, charge, postprocess, about)
        files = opened.output
        answers = MemoryAnswers(plan) if files is None else files.answers(meta)
        checks = time.perf_counter() - start
        try:
            outcome = run_release(plan, engine=opened.engine, output=answers, seed=seed, postprocess=postprocess,
                                  progress=Progress(progress))
        except BaseException:
            if files is not None:  # no output that looks like a release: the partial directory goes too
                files.abort()
            raise
        if files is not None:
            files.finish(answers, meta)
    finally:
        opened.close()  # work files (the disk store, Spark's checkpoints) never outlive the release
    result = GeoRelease(plan, answers.rows if files is None else {}, seeded=seed is not None,
                        timings={"checks": checks, **outcome.timings}, postprocess=postprocess, change=outcome.change,
                        charge=charge, about=about, path=None if files is None else files.path, _files=files)
    return opened.finish(result)


# ---------------------------------------------------------------------------------------------- engines
@dataclass(frozen=True)
class Opened:
    """An engine ready to run one release (:meth:`EngineKind.open`).

    Attributes
    ----------
    engine : Engine
        Runs the steps' tasks (:class:`hdmm.georelease.pipeline.Engine`).
    output : ReleaseFiles-like or None
        Where the release files go (:class:`~hdmm.georelease.stores.ReleaseFiles`, or Spark's
        :class:`~hdmm.georelease.sparkfiles.SparkFiles`: ``path``, ``answers(meta)``, ``finish``,
        ``abort``, ``read``, ``copy``), checked new; or ``None`` (the answers held in memory).
    close : callable
        Removes the engine's work files; called once the release ends, whether it succeeds or fails.
    finish : callable
        The engine's result from the common :class:`GeoRelease` (e.g. Spark's, with a DataFrame).
    """

    engine: Engine
    output: object | None = None
    close: Callable[[], None] = lambda: None
    finish: Callable[[GeoRelease], GeoRelease] = lambda result: result


class EngineKind(Protocol):
    """An engine as :func:`release_geography` sees it: the options it takes, and how it opens a release.

    Everything else (the checks of the plan, the single budget charge, the steps, the post-processing,
    the provenance and the output directory) is done once, in :func:`release_geography`.
    """

    options: tuple[str, ...]

    def partitioned(self, options: dict) -> bool:
        """Whether the release keeps each partition's estimates apart (what its memory check counts)."""
        ...

    def open(self, plan: GeoPlan, data, options: dict) -> Opened:
        """Read and check ``data`` against ``plan`` (before any noise) and make the engine and its work files."""
        ...


class LocalKind:
    """The local engine (:class:`hdmm.georelease.pipeline.LocalEngine`): options ``workers``, ``output``,
    ``work_dir`` (:func:`release_geography`)."""

    options = ("workers", "output", "work_dir")

    def partitioned(self, options: dict) -> bool:
        return options.get("output") is not None

    def open(self, plan: GeoPlan, data: HistogramSource, options: dict) -> Opened:
        workers = check_workers(options.get("workers"), int(sum(plan.tree.sizes)))
        output, work_dir = options.get("output"), options.get("work_dir")
        if work_dir is not None and output is None:
            raise TypeError("work_dir holds the estimates of a release written to output=: give output too")
        files = None if output is None else ReleaseFiles(output)  # refuses an output that exists
        if files is not None and work_dir is None:
            work_dir = os.path.dirname(os.path.abspath(files.path))
        check_source(plan, data)
        store = MemoryStore() if output is None else DiskStore(work_dir)
        return Opened(LocalEngine(data.histograms, store, workers), files, store.close)


#: The engines by name: an object with :class:`EngineKind`'s methods, or ``"module:name"`` of one (imported
#: when first used). An engine is one module and one line here (docs/engines.md).
ENGINES: dict[str, EngineKind | str] = {
    "local": LocalKind(),
    "spark": "hdmm.georelease.spark:SPARK",
}


def engine_kind(name: str) -> EngineKind:
    """The registered engine ``name`` (:data:`ENGINES`)."""
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of {list(ENGINES)}")
    kind = ENGINES[name]
    if isinstance(kind, str):
        module, attribute = kind.split(":")
        kind = getattr(importlib.import_module(module), attribute)
    return kind
