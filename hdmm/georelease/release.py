r"""A geography release: every unit's answers, consistent over the tree, with standard errors.

:func:`release_geography` runs a :class:`~hdmm.georelease.plan.GeoPlan` on data in one of two
engines with the same steps and, for a given seed, the same result:

1. check the data against the plan (leaves, counts, invariants), before any noise;
2. per partition (e.g. a state): measure its units (:mod:`hdmm.georelease.units`) and take the
   first tree pass (:func:`~hdmm.georelease.passes.partition_up`);
3. on the driver: measure the levels above the partition level from the partitions' totals, and
   the top passes;
4. per partition: the second pass, giving the least-squares estimate of every unit;
5. on the driver: the invariants' correction (:mod:`hdmm.georelease.invariants`).

``engine="local"`` (the default) runs the partitions one after another in this process: the
histograms of one partition at a time exist, and every unit's estimate (``queries + 1`` numbers).
``engine="spark"`` runs steps 2 and 4 as Spark tasks (:mod:`hdmm.georelease.spark`).

Every parent's answers equal the sum of its children's (up to floating-point rounding), because
every unit's estimate is the sum of its finest measured descendants' estimates.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..budget import Budget, Charge
from .passes import Partition, TreePasses, partition_down, partition_up, top_passes
from .plan import GeoPlan
from .files import finish_output, start_output, write_units
from .workers import check_workers, map_partitions
from .nonneg import POSTPROCESS, check_nonnegative, integer_totals, nonnegative_estimates
from .steps import apply_invariants, created_now, invariant_multipliers, measure_top, progress_printer, provenance
from .units import HistogramSource, check_source, measure_partition

__all__ = ["GeoRelease", "release_geography", "ENGINES"]

ENGINES = ("local", "spark")


@dataclass(frozen=True, eq=False)
class GeoRelease:
    """The released answers of every unit of the released levels (module docstring).

    Attributes
    ----------
    plan : GeoPlan
    estimates : dict
        ``level -> units x (queries + 1)``: the person queries' answers and the unit's total.
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
    """

    plan: GeoPlan
    estimates: dict[int, np.ndarray]
    seeded: bool
    timings: dict[str, float] = field(default_factory=dict)
    postprocess: str | None = None
    change: dict[int, float] | None = None
    charge: Charge | None = None
    about: dict = field(default_factory=dict)

    def answers(self, level: str | int) -> np.ndarray:
        """``units x queries`` answers of a released level."""
        return self.estimates[self._level(level)][:, :-1]

    def totals(self, level: str | int) -> np.ndarray:
        """Estimated total of every unit of a released level (held exactly for invariant units)."""
        return self.estimates[self._level(level)][:, -1]

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
        in every file's metadata and in ``path/_provenance.json``. Needs ``pyarrow`` (``hdmm[parquet]``)."""
        meta = self.provenance()
        partial = start_output(path)
        for d in self.plan.levels:
            write_units(partial, self.plan, d, np.arange(self.plan.tree.sizes[d]), self.answers(d),
                        self.std_errors(d), meta, "part-0")
        finish_output(partial, path, meta)

    def __repr__(self) -> str:
        levels = ", ".join(f"{self.plan.tree.levels[d]}: {self.plan.tree.sizes[d]:,}" for d in self.plan.levels)
        return f"GeoRelease({levels} units x {self.plan.queries:,} queries; {self.plan.privacy.description})"


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
        ``"local"`` (default) or ``"spark"``.
    engine_options
        The local engine's ``workers``: processes measuring and post-processing partitions at once
        (:mod:`hdmm.georelease.workers`; default ``None``: every core the process may use, for
        releases of at least ``POOL_UNITS`` units). The answers do not depend on it. Spark's options:
        :func:`hdmm.georelease.spark.release_spark`.
    seed
        ``None`` (default): noise from fresh OS entropy, as a real release must. An int: every
        unit's noise from a stream derived from the seed and the unit (for tests and research only).
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
    GeoRelease (local) or :class:`~hdmm.georelease.spark.SparkGeoRelease`.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of {list(ENGINES)}")
    if not isinstance(plan, GeoPlan):
        raise TypeError(f"plan must be a GeoPlan (from geo_plan), got {type(plan).__name__}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be None (OS entropy, for real releases) or an int, got {seed!r}")
    if postprocess not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {list(POSTPROCESS)}, got {postprocess!r}")
    if plan.per_level and (postprocess is None or engine != "local"):
        raise ValueError("a plan with per-level strategies is estimated top down from each level's own measurements "
                         "(hdmm.georelease.plan): release it with postprocess='nonnegative' or 'integer' on the local "
                         "engine")
    if budget is not None:
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be an hdmm.Budget, got {type(budget).__name__}")
        budget.check(plan.privacy)  # refused before any work; charged after the data checks
    label = label or f"geography release of {[plan.tree.levels[d] for d in plan.levels]}"
    about = {"created": created_now(), **(about or {})}
    if engine == "spark":
        from .spark import release_spark
        return release_spark(plan, data, seed=seed, progress=progress, budget=budget, label=label,
                             postprocess=postprocess, about=about, **engine_options)
    workers = check_workers(engine_options.pop("workers", None), int(sum(plan.tree.sizes)))
    if engine_options:
        raise TypeError(f"the local engine takes only the option 'workers', not {sorted(engine_options)}")
    if postprocess is not None:
        check_nonnegative(plan)
    if postprocess == "integer":
        integer_totals(plan)
    return replace(_release_local(plan, data, seed=seed, progress=progress, postprocess=postprocess, budget=budget,
                                  label=label, workers=workers), about=about)


def _release_local(plan: GeoPlan, source: HistogramSource, *, seed: int | None, progress,
                   postprocess: str | None = None, budget: Budget | None = None, label: str = "",
                   workers: int = 1) -> GeoRelease:
    say = progress_printer(progress)
    space = "answers" if postprocess is None else "measurements"
    tree, P = plan.tree, plan.partition_level
    timings: dict[str, float] = {}
    start = time.perf_counter()
    check_source(plan, source)
    charge = None if budget is None else budget.charge(plan.privacy, label)  # on disk before any noise
    passes = None if plan.per_level else plan.passes
    parts = [Partition.of(tree, P, u) for u in range(tree.sizes[P])]
    owns, g_own, roots = [], [], []

    def measure(i: int):
        own, root = measure_partition(plan, parts[i], source.histograms, seed, space)
        return own, None if passes is None else partition_up(passes, parts[i], own), root

    first = [measure(0)]  # here: the plan's cached matrices are made once, before the workers fork
    for i, (own, g, root) in enumerate(itertools.chain(first, map_partitions(lambda i: measure(i + 1),
                                                                             len(parts) - 1, workers))):
        owns.append(own)
        g_own.append(g)
        roots.append(root)
        say(f"  measured {tree.label(P, parts[i].unit)} ({i + 1}/{len(parts)})")
    timings["measure"] = time.perf_counter() - start
    start = time.perf_counter()
    if passes is None:  # per-level strategies: every unit's own measurements, for the top-down walk
        estimates = measure_top(plan, np.vstack(roots), seed, space)
        for d in range(P, max(plan.levels) + 1):
            estimates[d] = np.vstack([own[d] for own in owns])
    else:
        estimates = finish(plan, passes, parts, np.vstack(g_own), np.vstack(roots), owns, seed, space)
    timings["estimate"] = time.perf_counter() - start
    if postprocess is None:
        apply_invariants(plan, estimates)
        return GeoRelease(plan, {d: estimates[d] for d in plan.levels}, seeded=seed is not None, timings=timings,
                          charge=charge)
    start = time.perf_counter()
    lam = None if plan.per_level else invariant_multipliers(plan, estimates, space)
    result = nonnegative_estimates(plan, estimates, lam, progress=say, integer=postprocess == "integer",
                                   workers=workers)
    timings[postprocess.replace("nonnegative", "non-negative")] = time.perf_counter() - start
    out = {d: np.column_stack([result.answers[d], result.totals[d]]) for d in plan.levels}
    return GeoRelease(plan, out, seeded=seed is not None, timings=timings, postprocess=postprocess,
                      change=result.change, charge=charge)


def finish(plan: GeoPlan, passes: TreePasses, parts: list[Partition], g_own: np.ndarray, roots: np.ndarray,
           owns, seed: int | None, space: str = "answers") -> dict[int, np.ndarray]:
    """Steps 3 and 4 for the local engine: the top and the second passes (every level to the finest measured)."""
    tree, P = plan.tree, plan.partition_level
    k = g_own.shape[1]
    c, t = top_passes(passes, P, g_own, measure_top(plan, roots, seed, space))
    estimates = {d: np.empty((tree.sizes[d], k)) for d in range(passes.finest + 1)}
    for part, own in zip(parts, owns):
        for d, values in partition_down(passes, part, own, c[part.unit:part.unit + 1],
                                        t[part.unit:part.unit + 1]).items():
            lo, hi = part.range(d)
            estimates[d][lo:hi] = values
    for d in range(P - 1, -1, -1):
        estimates[d] = np.add.reduceat(estimates[d + 1], tree.child_bounds(d)[:-1], axis=0)
    return estimates
