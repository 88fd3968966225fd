r"""The steps of a geography release, written once; an engine only runs its tasks.

A release works on *partitions*: the units of the partition level ``P`` (e.g. counties or
tracts), each with its subtree. Its steps:

1. *measure* (a task per partition): measure every unit of the partition
   (:func:`hdmm.georelease.units.measure_partition`) and take the first tree pass
   (:func:`~hdmm.georelease.passes.partition_up`). The partition's estimates go to the *store*
   (:mod:`hdmm.georelease.stores`); its first-pass vector and its total histogram (sparse) come
   back here. Exact counts never leave the task except as that total, which stays in memory.
2. *top* (here): measure the levels above ``P`` from the partitions' totals and take the top
   passes (:func:`~hdmm.georelease.passes.top_passes`).
3. *estimate* (a task per partition): the second pass, every unit's least-squares estimate,
   back to the store; the rows of level ``P`` (and of the levels held by invariants or rounded
   at once below it) come back here, and the levels above ``P`` are their sums.
4. *invariants* (here): the multipliers of :mod:`hdmm.georelease.invariants`, one per unit.
5. *answers*:

   * least squares: a task per partition writes its units' corrected answers to the *output*;
     the levels above ``P`` are written here;
   * non-negative or integer (:class:`hdmm.georelease.nonneg.TopDown`): the walk from the root
     runs here down to level ``a`` (the root's family, or for integer tables the held region,
     rounded at once); then, level by level down to ``P``, a task per unit projects its family;
     then a task per partition walks its subtree and writes its units' answers.

An *engine* (:class:`Engine`) runs a step's tasks: ``engine.map(fn, items)`` yields ``fn(item)``
for every item, in order. :class:`LocalEngine` runs them in this process or in forked worker
processes (:mod:`hdmm.georelease.workers`). The answers do not depend on the engine, the store
or the number of workers: every unit's noise comes from its own stream (or fresh OS entropy)
and every task is a deterministic function of its inputs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np
import scipy.sparse as sp

from .nonneg import TopDown, change_rmse, integer_totals
from .passes import Partition, partition_down, partition_up, top_passes
from .plan import GeoPlan
from .roundtree import held_region
from .steps import invariant_multipliers, measure_top
from .units import measure_partition
from .workers import map_partitions

__all__ = ["Engine", "LocalEngine", "Outcome", "run_release"]

T = TypeVar("T")
R = TypeVar("R")


class Engine(Protocol):
    """What runs a release's tasks (module docstring)."""

    name: str

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        """``fn(item)`` for every item, yielded in the items' order."""
        ...


@dataclass(frozen=True)
class LocalEngine:
    """Tasks in this process, or in ``workers`` forked processes (:func:`~hdmm.georelease.workers.map_partitions`).

    The first item of every step runs here, so that what it caches on the plan (matrices made
    once) is made before the workers fork and is shared by them.

    >>> list(LocalEngine(workers=2).map(lambda x: x * x, [1, 2, 3]))
    [1, 4, 9]
    """

    workers: int = 1
    name: str = "local"

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> Iterator[R]:
        if not items:
            return
        yield fn(items[0])
        yield from map_partitions(lambda i: fn(items[i + 1]), len(items) - 1, self.workers)


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


def run_release(plan: GeoPlan, histograms, *, engine: Engine, store, output, seed: int | None,
                postprocess: str | None, say: Callable[[str], None]) -> Outcome:
    """Run the steps of the module docstring; the answers go to ``output``.

    ``histograms`` is a :class:`~hdmm.georelease.units.HistogramSource`'s ``histograms`` (leaves
    ``lo..hi-1`` -> sparse counts), ``store`` a store and ``output`` an output of
    :mod:`hdmm.georelease.stores`. The caller has checked the data and charged the budget.
    """
    tree, P = plan.tree, plan.partition_level
    space = "answers" if postprocess is None else "measurements"
    passes = None if plan.per_level else plan.passes
    out = Outcome()
    parts = list(range(tree.sizes[P]))

    start = time.perf_counter()

    def measure(i: int):
        part = Partition.of(tree, P, i)
        own, root = measure_partition(plan, part, histograms, seed, space)
        g = None if passes is None else partition_up(passes, part, own)
        return store.save(i, own), g, sp.csr_matrix(root[None, :])

    g_own, roots = [], []
    for i, (token, g, root) in enumerate(engine.map(measure, parts)):
        store.accept(i, token)
        g_own.append(g)
        roots.append(root)
        say(f"  measured {tree.label(P, i)} ({i + 1}/{len(parts)})")
    roots = sp.vstack(roots, format="csr")
    out.timings["measure"] = time.perf_counter() - start

    start = time.perf_counter()
    integer = postprocess == "integer"
    held = _held_depth(plan, integer)
    inv = plan.invariants
    kept = {P} | set(range(P, held + 1))  # the levels at and below P the driver needs in full
    if inv is not None:
        kept |= {d for d in np.unique(inv.levels).tolist() if d > P}
    top = measure_top(plan, roots, seed, space)
    del roots
    if passes is None:  # per-level strategies: every unit's own measurements are its estimates
        def collect(i: int):
            return {d: v for d, v in store.load(i).items() if d in kept}
        estimates = {**top, **_stack_levels(list(engine.map(collect, parts)))}
    else:
        c, t = top_passes(passes, P, np.vstack(g_own), top)
        del g_own

        def estimate(i: int):
            part = Partition.of(tree, P, i)
            est = partition_down(passes, part, store.load(i), c[i:i + 1], t[i:i + 1])
            return store.save(i, est), {d: est[d] for d in kept}

        rows = []
        for i, (token, needed) in enumerate(engine.map(estimate, parts)):
            store.accept(i, token)
            rows.append(needed)
        estimates = _stack_levels(rows)
        for d in range(P - 1, -1, -1):
            estimates[d] = np.add.reduceat(estimates[d + 1], tree.child_bounds(d)[:-1], axis=0)
    out.timings["estimate"] = time.perf_counter() - start

    start = time.perf_counter()
    if postprocess is None:
        _least_squares(plan, engine, store, output, estimates, parts)
        out.timings["answers"] = time.perf_counter() - start
        return out
    lam = None if plan.per_level else invariant_multipliers(plan, estimates, space)
    squared = _top_down(plan, engine, store, output, estimates, lam, parts, integer, held, say)
    out.timings[postprocess.replace("nonnegative", "non-negative")] = time.perf_counter() - start
    out.change = change_rmse(plan, squared)
    return out


def _least_squares(plan: GeoPlan, engine: Engine, store, output, estimates: dict[int, np.ndarray],
                   parts: list[int]) -> None:
    """Every released unit's answers, moved by the invariants' correction (if any) and written to ``output``."""
    tree, P = plan.tree, plan.partition_level
    lam = invariant_multipliers(plan, estimates)
    direction = None if lam is None else np.append(*plan.total_direction)

    def corrected(d: int, values: np.ndarray, lo: int) -> np.ndarray:
        return values if lam is None else values - np.outer(lam[d][lo:lo + len(values)], direction)

    writer = output.writer("driver")
    for d in plan.levels:
        if d < P:
            values = corrected(d, estimates[d], 0)
            writer.write(d, np.arange(tree.sizes[d]), values[:, :-1], values[:, -1])
    output.gather(writer.result())
    below = [d for d in plan.levels if d >= P]
    if not below:
        return

    def answer(i: int):
        part = Partition.of(tree, P, i)
        est = store.load(i)
        task = output.writer(f"{i:07d}")
        for d in below:
            lo, hi = part.range(d)
            values = corrected(d, est[d], lo)
            task.write(d, np.arange(lo, hi), values[:, :-1], values[:, -1])
        return task.result()

    for result in engine.map(answer, parts):
        output.gather(result)


def _top_down(plan: GeoPlan, engine: Engine, store, output, estimates: dict[int, np.ndarray], lam, parts: list[int],
              integer: bool, held: int, say: Callable[[str], None]) -> dict[int, float]:
    """The non-negative (or integer) walk of the module docstring, step 5; returns the squared changes per level."""
    tree, P = plan.tree, plan.partition_level
    writer = output.writer("driver")
    walk = TopDown(plan, lambda d, units: estimates[d][units], lam, sink=writer.write, progress=say, integer=integer)
    a = max(held, min(1, P))  # the driver's walk: the root's family (if P allows), or the held region
    if walk.deepest <= a:
        walk.start()
        walk.flush()
        output.gather(writer.result())
        return walk.squared
    cells: dict[int, np.ndarray] = {}
    walk.start(stop=a, reached=cells)
    walk.flush()
    output.gather(writer.result())
    squared, projected = dict(walk.squared), walk.projected

    def report(d: int, unit: int, done: int, n: int) -> None:  # every hundredth task of a step
        if done % max(1, n // 100) == 0 or done == n:
            say(f"  non-negative: projected the units below {tree.label(d, unit)} ({projected}/{walk.families})")

    for d in range(a, min(P, walk.deepest)):  # families level by level, a task per unit
        bounds = tree.child_bounds(d)

        def family(item, d=d, bounds=bounds):
            u, x_plus, children = item
            lo = int(bounds[u])
            task_writer = output.writer(f"{tree.levels[d]}-{u:07d}")
            task = TopDown(plan, lambda e, units: children[units - lo], lam, sink=task_writer.write, integer=integer)
            reached: dict[int, np.ndarray] = {}
            task.descend(d, u, x_plus, d + 1, reached)
            task.flush()
            return reached, task_writer.result(), task.squared.get(d + 1, 0.0), task.projected

        items = [(u, x, estimates[d + 1][bounds[u]:bounds[u + 1]]) for u, x in sorted(cells.items())]
        reached_all: dict[int, np.ndarray] = {}
        for n, (reached, result, sq, count) in enumerate(engine.map(family, items)):
            reached_all.update(reached)
            output.gather(result)
            if d + 1 in squared:
                squared[d + 1] += sq
            projected += count
            report(d, items[n][0], n + 1, len(items))
        cells = reached_all
    if walk.deepest <= P:
        return squared
    s = max(a, P)  # each partition walks on from its units of level s

    def subtree(i: int):
        part = Partition.of(tree, P, i)
        own = store.load(i)
        task_writer = output.writer(f"{i:07d}")
        task = TopDown(plan, lambda e, units: own[e][units - part.range(e)[0]], lam, sink=task_writer.write,
                       integer=integer)
        lo, hi = part.range(s)
        for u in range(lo, hi):
            task.descend(s, u, cells[u])
        task.flush()
        return task_writer.result(), {e: task.squared[e] for e in plan.levels if e > s}, task.projected

    for i, (result, sq, count) in enumerate(engine.map(subtree, parts)):
        output.gather(result)
        for e, value in sq.items():
            squared[e] += value
        projected += count
        report(P, i, i + 1, len(parts))
    return squared
