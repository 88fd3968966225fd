r"""The steps of a geography release, written once; an engine only runs its tasks.

A release works on *partitions*: the units of the partition level ``P`` (e.g. counties or
tracts), each with its subtree, or ranges of consecutive siblings of ``P`` with their subtrees
(:meth:`hdmm.georelease.plan.GeoPlan.with_partitions`: so far for least squares and
non-negative estimates, :func:`check_partitions`). A plan's default partitions are cut into ranges
by :func:`release_partitions` for the release's post-processing: for least squares at most
``PARTITION_VALUES`` numbers and ``RANGE_UNITS`` units a task; for non-negative estimates, in
addition, few enough units that each range and the ranges of a family are projected in one piece;
integer tables take one unit a partition, at the level whose units fit. Its steps:

1. *measure* (a task per partition): measure every unit of the partition
   (:func:`hdmm.georelease.units.measure_partition`) and take the first tree pass
   (:func:`~hdmm.georelease.passes.partition_up`). The partition's estimates go to the *store*
   (:mod:`hdmm.georelease.stores`); its first-pass vector and its total histogram (sparse) come
   back here. Exact counts never leave the task except as that total, which stays in memory.
2. *top* (here): measure the levels above ``P`` from the partitions' totals and take the top
   passes (:func:`~hdmm.georelease.passes.top_passes`).
3. *estimate* (a task per partition): the second pass, every unit's least-squares estimate,
   back to the store; the rows of level ``P`` (and of the levels held by invariants or rounded
   at once below it) come back here, and the levels above ``P`` are their sums (for ranges of
   siblings, each range's sum of its units' rows, and the rows of the invariants' levels only).
4. *invariants* (here): the multipliers of :mod:`hdmm.georelease.invariants`, one per unit.
5. *answers*:

   * least squares: a task per partition writes its units' corrected answers to the *output*;
     the levels above ``P`` are written here;
   * non-negative or integer (:class:`hdmm.georelease.nonneg.TopDown`): the walk from the root
     runs here down to level ``a`` (the root's family, or for integer tables the held region,
     rounded at once); then, level by level down to ``P``, a task per unit projects its family;
     then a task per partition walks its subtree and writes its units' answers. With ranges of
     siblings the driver holds no row of level ``P``: the walk reaches ``P - 1``, a family of
     ``P - 1`` in one partition is projected in that partition's task, and a family split over
     several is projected in the two stages of :func:`~hdmm.georelease.nonneg.family_groups` with
     the partitions as the groups: their sums here (each partition's sum of its units' estimates,
     from step 3), then each partition's children onto its share, in its task.

An *engine* (:class:`Engine`) runs a step's tasks and keeps each partition's estimates between
steps (its *state*, ``{level: units x k}``):

* ``measure(fn, shared, n)``: ``state, result = fn(*values, i, read)`` for every partition ``i``,
  where ``read(lo, hi)`` gives the sparse counts of leaves ``lo..hi-1``;
* ``update(fn, shared, n, inputs=None)``: ``state, result = fn(*values, i, state[, inputs[i]])``
  (``None`` keeps the state);
* ``map(fn, shared, items)``: ``fn(*values, item)`` for every item (a family, say);

each yielding the results in order (an engine may also have ``observe(progress)``, to report a
step's tasks while they run: :meth:`hdmm.georelease.steps.Progress.within`). ``values`` are the values of the ``shared`` handles that
:meth:`Engine.share` made (the plan once per release, each step's inputs once per step): a
cluster ships them once per worker, not once per task. The task functions are module-level
functions of this module, so that an engine may pickle them. :class:`LocalEngine` runs the tasks
in this process or in forked worker processes (:mod:`hdmm.georelease.workers`) and keeps the
states in a store (:mod:`hdmm.georelease.stores`); Spark's engine is
:class:`hdmm.georelease.spark.SparkEngine`. The answers do not depend on the engine, the store or
the number of workers: every unit's noise comes from its own stream (or fresh OS entropy) and
every task is a deterministic function of its inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import scipy.sparse as sp

from ..geography import GeographyError
from .nonneg import (DENSE_FAMILY, MAX_FAMILY_CELLS, TopDown, cell_space, change_rmse, dense_parts, family_at_once,
                     integer_totals)
from .passes import Partition, partition_down, partition_up, top_passes
from .plan import PARTITION_UNITS, GeoPlan
from .roundtree import held_region
from .steps import Progress, invariant_multipliers, measure_top
from .units import measure_partition
from .workers import map_partitions

__all__ = ["Engine", "LocalEngine", "Outcome", "check_partitions", "release_partitions", "run_release"]

T = TypeVar("T")
R = TypeVar("R")


class Shared(Protocol[T]):
    """A value shipped to the tasks (:meth:`Engine.share`)."""

    @property
    def value(self) -> T: ...


class Engine(Protocol):
    """What runs a release's tasks and keeps each partition's state between steps (module docstring)."""

    name: str

    def share(self, value: T) -> Shared[T]:
        """``value`` made available to tasks (handed to them as an argument, before their own)."""
        ...

    def measure(self, fn: Callable[..., tuple[dict, R]], shared: tuple, partitions: int) -> Iterator[R]:
        """Every partition's first state and result from its leaves' counts, results in order."""
        ...

    def update(self, fn: Callable[..., tuple[dict | None, R]], shared: tuple, partitions: int,
               inputs: Sequence | None = None) -> Iterator[R]:
        """Every partition's new state (``None``: unchanged) and result from its state (and its entry of
        ``inputs``, if given), results in order. A task function whose ``reads_rows`` attribute is true
        reads each level of its state only as rows by index (``state[d][units]``, never the whole array
        at once): an engine may then hand it a row reader, so that the level is never gathered whole."""
        ...

    def map(self, fn: Callable[..., R], shared: tuple, items: Sequence) -> Iterator[R]:
        """``fn(*values, item)`` for every item, in order."""
        ...


@dataclass(frozen=True)
class Value:
    """A shared value that is simply held (:meth:`LocalEngine.share`)."""

    value: object


@dataclass(frozen=True)
class LocalEngine:
    """Tasks in this process, or in ``workers`` forked processes (:func:`~hdmm.georelease.workers.map_partitions`);
    states in ``store`` (:mod:`hdmm.georelease.stores`); leaves' counts from ``histograms(lo, hi)``.

    The first task of every step runs here, so that what it caches on the plan (matrices made
    once) is made before the workers fork and is shared by them.

    >>> from hdmm.georelease.stores import MemoryStore
    >>> engine = LocalEngine(lambda lo, hi: None, MemoryStore(), workers=2)
    >>> list(engine.map(lambda k, x: k * x, (engine.share(10),), [1, 2, 3]))
    [10, 20, 30]
    """

    histograms: Callable
    store: object
    workers: int = 1
    name: str = "local"

    def share(self, value: T) -> Value:
        return Value(value)

    def _run(self, fn: Callable[[int], R], n: int) -> Iterator[R]:
        if n:
            yield fn(0)
            yield from map_partitions(lambda i: fn(i + 1), n - 1, self.workers)

    def measure(self, fn, shared: tuple, partitions: int) -> Iterator:
        values = [h.value for h in shared]

        def task(i: int):
            state, result = fn(*values, i, self.histograms)
            return self.store.save(i, state), result

        for i, (token, result) in enumerate(self._run(task, partitions)):
            self.store.accept(i, token)
            yield result

    def update(self, fn, shared: tuple, partitions: int, inputs: Sequence | None = None) -> Iterator:
        values = [h.value for h in shared]

        def task(i: int):
            extra = () if inputs is None else (inputs[i],)
            state, result = fn(*values, i, self.store.load(i), *extra)
            return None if state is None else self.store.save(i, state), state is not None, result

        for i, (token, changed, result) in enumerate(self._run(task, partitions)):
            if changed:
                self.store.accept(i, token)
            yield result

    def map(self, fn, shared: tuple, items: Sequence) -> Iterator:
        values = [h.value for h in shared]
        return self._run(lambda i: fn(*values, items[i]), len(items))


@dataclass
class Outcome:
    """What :func:`run_release` reports: seconds per step and, for post-processed releases, per released
    level the RMSE of the answers' change from least squares."""

    timings: dict[str, float] = field(default_factory=dict)
    change: dict[int, float] | None = None


def _stack_levels(rows: list[dict[int, np.ndarray]]) -> dict[int, np.ndarray]:
    """Per level, the partitions' rows one after the other (partitions are consecutive at every level)."""
    return {d: np.vstack([r[d] for r in rows]) for d in rows[0]} if rows else {}


def _held_depth(plan: GeoPlan, integer: bool) -> int:
    """The deepest level of the held region that integer tables round at once (0 without invariants)."""
    return max(held_region(plan.tree, integer_totals(plan))) if integer else 0


def release_partitions(plan: GeoPlan, postprocess: str | None) -> GeoPlan:
    """The plan a release with ``postprocess`` runs on: a plan with given partitions as it is (checked by
    :func:`check_partitions`); default ones (``plan.partition_auto``) cut into ranges of siblings
    (:meth:`GeoPlan.default_ranges`). Least squares takes ranges of at most ``PARTITION_VALUES`` numbers
    and ``RANGE_UNITS`` units; non-negative estimates, such ranges of at most as many units as a family
    projects in one piece (:func:`~hdmm.georelease.nonneg.family_at_once`), or one unit a partition where
    such ranges would not fit; integer tables, one unit a partition at the coarsest level whose every
    unit's subtree holds at most ``PARTITION_VALUES`` numbers and ``PARTITION_UNITS`` units (where one
    does). Data-independent: it runs before any data are read.
    """
    if not plan.partition_auto or plan.per_level:
        check_partitions(plan, postprocess)
        return plan
    if postprocess == "integer":
        return plan.default_ranges(units=PARTITION_UNITS, ranges=False)
    if postprocess is None:
        return plan.default_ranges()
    _, most = _family_cells(plan)
    ranged = plan.default_ranges(units=max(1, most))
    try:
        check_partitions(ranged, postprocess)
    except (GeographyError, NotImplementedError):  # a family of too many ranges: one unit a partition
        return plan
    return ranged


def check_partitions(plan: GeoPlan, postprocess: str | None) -> None:
    """Refuse a plan whose partitions are ranges of several siblings (:meth:`GeoPlan.with_partitions`) where they
    are not wired yet: a release other than least squares (every engine runs this module's tasks on partitions
    by index, so the engine does not matter)."""
    if not plan.ranged or postprocess is None:
        return
    if postprocess != "nonnegative" or plan.partition_level == 0:
        raise NotImplementedError(f"partitions of several units (GeoPlan.with_partitions) are released by least "
                                  f"squares or non-negative estimates below the root only so far, not "
                                  f"{postprocess!r}: use a plan with one partition per unit of its partition level")
    tree, P, bounds = plan.tree, plan.partition_level, plan.partition_bounds
    cells, most = _family_cells(plan)
    parents = np.searchsorted(bounds, tree.child_bounds(P - 1))
    for p in range(parents.size - 1):  # a family in several partitions: stage 1 on their sums, stage 2 in each
        sizes = np.diff(bounds[parents[p]:parents[p + 1] + 1])
        if sizes.size > 1 and max(sizes.size, int(sizes.max())) > most:  # each stage in one piece
            raise GeographyError(
                f"non-negative estimates project a family split into partitions in two stages, each at most "
                f"{MAX_FAMILY_CELLS:,} units x cells at once: the {sizes.size} partitions of the children of "
                f"{tree.label(P - 1, p)} (up to {int(sizes.max())} units each, {cells:,} cells) are too many or too "
                f"large; choose partitions of fewer values (GeoPlan.with_partitions)")


def _family_cells(plan: GeoPlan) -> tuple[int, int]:
    """The cells a family of ``plan`` is projected on, and the most children projected in one piece
    (:func:`~hdmm.georelease.nonneg.family_at_once`; fewer with the dense Gram of a small person domain)."""
    cells = cell_space(plan)[0].strategy.shape[1]
    return cells, family_at_once(cells, None if dense_parts(plan) is None else DENSE_FAMILY)


def run_release(plan: GeoPlan, *, engine: Engine, output, seed: int | None, postprocess: str | None,
                progress: Progress) -> Outcome:
    """Run the steps of the module docstring on ``engine``; the answers go to ``output`` (an output of
    :mod:`hdmm.georelease.stores`), each step's tasks are counted to ``progress``. The caller has checked the
    data and charged the budget."""
    tree, P = plan.tree, plan.partition_level
    space = "answers" if postprocess is None else "measurements"
    out = Outcome()
    n = plan.partitions
    if hasattr(engine, "observe"):  # an engine that can see a step's tasks before their results come back
        engine.observe(progress)
    the_plan = (engine.share(plan),)

    start = time.perf_counter()
    g_own, roots = [], []
    progress.start("measure", n, "partition")
    for i, (g, root) in enumerate(engine.measure(_measure_task, the_plan + (engine.share((seed, space)),), n)):
        g_own.append(g)
        roots.append(root)
        progress.done("measure", i + 1, _label(plan, i))
    roots = sp.vstack(roots, format="csr")
    out.timings["measure"] = time.perf_counter() - start

    start = time.perf_counter()
    integer = postprocess == "integer"
    held = _held_depth(plan, integer)
    inv = plan.invariants
    kept = set() if plan.ranged else {P} | set(range(P, held + 1))  # the levels at and below P the driver
    if inv is not None:                                                   # needs in full
        kept |= {d for d in np.unique(inv.levels).tolist() if d >= P and (d > P or plan.ranged)}
    top = measure_top(plan, roots, seed, space)
    del roots
    progress.start("estimate", n, "partition")
    if plan.per_level:  # per-level strategies: every unit's own measurements are its estimates
        rows = _counted(engine.update(_collect_task, the_plan + (engine.share(kept),), n), progress, "estimate")
        estimates = {**top, **_stack_levels(rows)}
    else:
        c, t = top_passes(plan.passes, P, np.vstack(g_own), top, plan.partition_bounds)
        del g_own
        reuse = bool(getattr(engine, "fresh_states", False))  # each task's state is its own copy: reused
        results = _counted(engine.update(_estimate_task, the_plan + (engine.share((kept, c, t, reuse)),), n),
                           progress, "estimate")
        del c, t
        rows = [r for r, _ in results]
        estimates = _stack_levels(rows)
        if plan.ranged:  # the levels above P: sums of the partitions' sums
            sums = ranges = np.vstack([total for _, total in results])
            starts = np.searchsorted(plan.partition_bounds, tree.child_bounds(P - 1)[:-1]) if P else None
        else:
            sums, starts = estimates[P], tree.child_bounds(P - 1)[:-1] if P else None
        del results
        for d in range(P - 1, -1, -1):
            sums = estimates[d] = np.add.reduceat(sums, starts, axis=0)
            if d:
                starts = tree.child_bounds(d - 1)[:-1]
        del sums
    del rows
    out.timings["estimate"] = time.perf_counter() - start

    start = time.perf_counter()
    if postprocess is None:
        _least_squares(plan, engine, the_plan, output, estimates, progress)
        out.timings["answers"] = time.perf_counter() - start
        return out
    lam = None if plan.per_level else invariant_multipliers(plan, estimates, space)
    if plan.ranged:
        squared = _top_down_ranged(plan, engine, the_plan, output, estimates, ranges, lam, progress)
    else:
        squared = _top_down(plan, engine, the_plan, output, estimates, lam, integer, held, progress)
    out.timings[postprocess.replace("nonnegative", "non-negative")] = time.perf_counter() - start
    out.change = change_rmse(plan, squared)
    return out


def _label(plan: GeoPlan, i: int) -> str:
    """Partition ``i``'s name: its unit's label, or its first unit's with the number of units that follow."""
    part = plan.partition(i)
    label = plan.tree.label(part.level, part.unit)
    return label if part.size == 1 else f"{label} (+{part.size - 1})"


def _counted(results, progress: Progress, step: str) -> list:
    """The results of a step's tasks, each counted to ``progress`` as it comes."""
    out = []
    for result in results:
        out.append(result)
        progress.done(step, len(out))
    return out


# ---------------------------------------------------------------------------------------------- tasks
def _measure_task(plan: GeoPlan, job: tuple, i: int, read) -> tuple[dict, tuple]:
    """Step 1 for partition ``i``: its units' own estimates (the state), its first-pass vector and total."""
    seed, space = job
    part = plan.partition(i)
    own, root = measure_partition(plan, part, read, seed, space)
    g = None if plan.per_level else partition_up(plan.passes, part, own)
    return own, (g, sp.csr_matrix(root[None, :]))


def _collect_task(plan: GeoPlan, kept: set, i: int, state: dict) -> tuple[None, dict]:
    """Step 3 of a plan with per-level strategies: the rows of the levels the driver keeps."""
    return None, {d: v for d, v in state.items() if d in kept}


def _estimate_task(plan: GeoPlan, job: tuple, i: int, state: dict) -> tuple[dict, tuple]:
    """Step 3 for partition ``i``: its units' least-squares estimates (the new state), the kept levels' rows and
    (for a range of siblings) the sum of its units' estimates at the partition level."""
    kept, c, t, reuse = job
    part = plan.partition(i)
    f = plan.passes.finest
    reuse = reuse and f in state and state[f].flags.writeable and state[f].flags.owndata
    est = partition_down(plan.passes, part, state, c[i:i + 1], t[i:i + 1], reuse=reuse)
    total = est[plan.partition_level].sum(axis=0, keepdims=True) if plan.ranged else None
    return est, ({d: est[d] for d in kept}, total)


def _corrected(plan: GeoPlan, lam, d: int, values: np.ndarray, lo: int) -> np.ndarray:
    """Rows ``lo, lo + 1, ...`` of level ``d`` moved by the invariants' correction (if any)."""
    if lam is None:
        return values
    return values - np.outer(lam[d][lo:lo + len(values)], np.append(*plan.total_direction))


def _answer_task(plan: GeoPlan, job: tuple, i: int, state: dict) -> tuple[None, object]:
    """Step 5 (least squares) for partition ``i``: its released units' answers, written to the output."""
    below, lam, output = job
    part = plan.partition(i)
    writer = output.writer(f"{i:07d}", plan)
    for d in below:
        lo, hi = part.range(d)
        values = _corrected(plan, lam, d, state[d], lo)
        writer.write(d, np.arange(lo, hi), values[:, :-1], values[:, -1])
    return None, writer.result()


def _family_task(plan: GeoPlan, job: tuple, item: tuple) -> tuple:
    """Step 5 (top down) for one unit of level ``d`` above the partition level: its family's cells."""
    d, lam, integer, output = job
    u, x_plus, children = item
    lo = int(plan.tree.child_bounds(d)[u])
    writer = output.writer(f"{plan.tree.levels[d]}-{u:07d}", plan)
    task = TopDown(plan, lambda e, units: children[units - lo], lam, sink=writer.write, integer=integer)
    reached: dict[int, np.ndarray] = {}
    task.descend(d, u, x_plus, d + 1, reached)
    task.flush()
    return reached, writer.result(), task.squared.get(d + 1, 0.0), task.projected


def _subtree_task(plan: GeoPlan, job: tuple, i: int, state: dict, cells: np.ndarray) -> tuple[None, tuple]:
    """Step 5 (top down) for partition ``i``: the walk below its units of level ``s`` (whose cells are ``cells``)."""
    s, lam, integer, output = job
    part = plan.partition(i)
    writer = output.writer(f"{i:07d}", plan)
    task = TopDown(plan, lambda e, units: state[e][units - part.range(e)[0]], lam, sink=writer.write,
                   integer=integer)
    lo, hi = part.range(s)
    for u in range(lo, hi):
        task.descend(s, u, cells[u - lo])
    task.flush()
    return None, (writer.result(), {e: task.squared[e] for e in plan.levels if e > s}, task.projected)


_subtree_task.reads_rows = True  # its walk reads a family's (or group's) rows at a time (Engine.update)


# ---------------------------------------------------------------------------------------------- step 5
def _least_squares(plan: GeoPlan, engine: Engine, the_plan: tuple, output, estimates: dict[int, np.ndarray],
                   progress: Progress) -> None:
    """Every released unit's answers, moved by the invariants' correction (if any) and written to ``output``."""
    tree, P = plan.tree, plan.partition_level
    lam = invariant_multipliers(plan, estimates)
    writer = output.writer("driver", plan)
    for d in plan.levels:
        if d < P:
            values = _corrected(plan, lam, d, estimates[d], 0)
            writer.write(d, np.arange(tree.sizes[d]), values[:, :-1], values[:, -1])
    output.gather(writer.result())
    below = [d for d in plan.levels if d >= P]
    if below:
        progress.start("answers", plan.partitions, "partition")
        for i, result in enumerate(engine.update(_answer_task, the_plan + (engine.share((below, lam, output)),),
                                                 plan.partitions)):
            output.gather(result)
            progress.done("answers", i + 1, _label(plan, i))


def _top_down(plan: GeoPlan, engine: Engine, the_plan: tuple, output, estimates: dict[int, np.ndarray], lam,
              integer: bool, held: int, progress: Progress) -> dict[int, float]:
    """The non-negative (or integer) walk of the module docstring, step 5; returns the squared changes per level."""
    tree, P = plan.tree, plan.partition_level
    writer = output.writer("driver", plan)
    step = "integer" if integer else "non-negative"
    walk = TopDown(plan, lambda d, units: estimates[d][units], lam, sink=writer.write, progress=progress.say,
                   integer=integer, counted=lambda done, where: progress.done(step, done, where))
    progress.start(step, walk.families, "family")
    a = max(held, min(1, P))  # the driver's walk: the root's family (if P allows), or the held region
    cells: dict[int, np.ndarray] = {}
    if walk.deepest <= a:
        walk.start()
    else:
        walk.start(stop=a, reached=cells)
    walk.flush()
    output.gather(writer.result())
    if walk.deepest <= a:
        return walk.squared
    squared, projected = dict(walk.squared), walk.projected

    cells, projected = _family_levels(plan, engine, the_plan, output, estimates, cells, range(a, min(P, walk.deepest)),
                                      lam, integer, progress, step, squared, projected)
    if walk.deepest <= P:
        return squared
    s = max(a, P)  # each partition walks on from its units of level s
    inputs = []
    for i in range(tree.sizes[P]):
        lo, hi = Partition.of(tree, P, i).range(s)
        inputs.append(np.vstack([cells.pop(u) for u in range(lo, hi)]))
    job = the_plan + (engine.share((s, lam, integer, output)),)
    _partition_walks(plan, engine, _subtree_task, job, inputs, output, progress, step, squared, projected)
    return squared


def _family_levels(plan: GeoPlan, engine: Engine, the_plan: tuple, output, estimates: dict[int, np.ndarray],
                   cells: dict[int, np.ndarray], levels: range, lam, integer: bool, progress: Progress, step: str,
                   squared: dict[int, float], projected: int) -> tuple[dict[int, np.ndarray], int]:
    """The families of ``levels``, level by level, a task per unit (``cells``: the projected cells of the units of
    the first level); returns the cells of the units one level below the last and the families projected so far.
    ``squared`` gathers the changes per level."""
    tree = plan.tree
    for d in levels:
        bounds = tree.child_bounds(d)
        items = [(u, x, estimates[d + 1][bounds[u]:bounds[u + 1]]) for u, x in sorted(cells.items())]
        cells = {}
        job = the_plan + (engine.share((d, lam, integer, output)),)
        for k, (reached, result, sq, count) in enumerate(engine.map(_family_task, job, items)):
            cells.update(reached)
            output.gather(result)
            if d + 1 in squared:
                squared[d + 1] += sq
            projected += count
            progress.done(step, projected, tree.label(d, items[k][0]))
    return cells, projected


def _top_down_ranged(plan: GeoPlan, engine: Engine, the_plan: tuple, output, estimates: dict[int, np.ndarray],
                     ranges: np.ndarray, lam, progress: Progress) -> dict[int, float]:
    """The non-negative walk of a plan whose partitions are ranges of siblings (``ranges``: each one's sum of its
    units' estimates at the partition level ``P``, which the driver does not hold): the walk here and in family
    tasks down to level ``P - 1``; a family of ``P - 1`` in one partition is walked in its task, one in several
    is projected here in two stages' first (the partitions' sums, :meth:`TopDown.group_parts`) and each
    partition projects its children onto its share and walks below (:meth:`TopDown.descend_group`)."""
    tree, P, bounds = plan.tree, plan.partition_level, plan.partition_bounds
    writer = output.writer("driver", plan)
    step = "non-negative"
    walk = TopDown(plan, lambda d, units: estimates[d][units], lam, sink=writer.write, progress=progress.say,
                   counted=lambda done, where: progress.done(step, done, where))
    progress.start(step, walk.families, "family")
    a = min(1, P - 1)  # the driver's walk: the root's family if its children are above P
    cells: dict[int, np.ndarray] = {}
    if walk.deepest <= P - 1:
        walk.start()
        walk.flush()
        output.gather(writer.result())
        return walk.squared
    walk.start(stop=a, reached=cells)
    squared, projected = dict(walk.squared), walk.projected
    cells, projected = _family_levels(plan, engine, the_plan, output, estimates, cells, range(a, P - 1), lam, False,
                                      progress, step, squared, projected)
    parents = tree.child_bounds(P - 1)
    first = np.searchsorted(bounds, parents)  # each parent's first partition
    lam_sums = None if lam is None else np.add.reduceat(lam[P], bounds[:-1])
    inputs: list = []
    for p in range(parents.size - 1):
        r0, r1 = int(first[p]), int(first[p + 1])
        x_plus = cells.pop(p)
        if r1 - r0 == 1:
            inputs.append((p, None, x_plus))
            continue
        sums = walk.summed_cells(P, ranges[r0:r1], None if lam_sums is None else lam_sums[r0:r1])
        parts = walk.group_parts(P - 1, p, x_plus, bounds[r0:r1 + 1] - bounds[r0], sums)
        inputs.extend((p, int(bounds[r] - parents[p]), part) for r, part in zip(range(r0, r1), parts))
    walk.flush()
    output.gather(writer.result())
    job = the_plan + (engine.share((lam, output)),)
    _partition_walks(plan, engine, _range_walk_task, job, inputs, output, progress, step, squared, projected)
    return squared


def _partition_walks(plan: GeoPlan, engine: Engine, task, job: tuple, inputs: list, output, progress: Progress,
                     step: str, squared: dict[int, float], projected: int) -> None:
    """The walk below every partition, a ``task`` per partition (its entry of ``inputs``: where it starts);
    ``squared`` gathers the changes per level, and the families are counted on from ``projected``."""
    for i, (result, sq, count) in enumerate(engine.update(task, job, plan.partitions, inputs)):
        output.gather(result)
        for e, value in sq.items():
            squared[e] += value
        projected += count
        progress.done(step, projected, _label(plan, i))


def _range_walk_task(plan: GeoPlan, job: tuple, i: int, state: dict, start: tuple) -> tuple[None, tuple]:
    """Step 5 (non-negative, ranges of siblings) for partition ``i``: its units' family (all of it, from the
    parent's cells; or its share of it, from the first stage's cells of its sum), then the walk below."""
    lam, output = job
    p, a, cells = start
    part = plan.partition(i)
    writer = output.writer(f"{i:07d}", plan)
    task = TopDown(plan, lambda e, units: state[e][units - part.range(e)[0]], lam, sink=writer.write)
    if a is None:
        task.descend(plan.partition_level - 1, p, cells)
    else:
        task.descend_group(plan.partition_level - 1, p, a, a + part.size, cells)
    task.flush()
    return None, (writer.result(), {e: task.squared[e] for e in plan.levels if e >= plan.partition_level},
                  task.projected)


_range_walk_task.reads_rows = True  # its walk reads a family's (or group's) rows at a time (Engine.update)
