r"""Integer cells for every unit of a tree, top down, consistent, with the held totals exact (docs/math.md 8.8).

Input: per level ``d`` from the root down, each unit's non-negative real cells (``units x cells``)
adding up, cell by cell, to their parent's (the non-negative estimates of
:mod:`hdmm.georelease.nonneg`), and the held totals (invariants, NaN where none). Output: integer
cells with every unit's cells adding up to its parent's in every cell, every entry the floor or the
ceiling of the real one, and the held totals exact.

Two stages:

* **The region rounded at once** (:func:`round_held`): the held region :math:`H` (the units whose
  totals are held, closed upward: a unit whose children are all held is held at their sum; the root
  alone when nothing is held) and every unit down to level ``joint`` (default: the root). One
  network: the source feeds each root cell, each cell of a unit feeds the same cell of its children
  in the region, the cells of the region's deepest units drain into a node per unit, and each unit's
  node passes its total to its parent's node (the root's to the sink) within the floor and ceiling
  of its real total, or exactly where held. The real cells are a feasible flow, so an integer one
  exists: every total in the region is the floor or ceiling of its real one, the held ones exact.
* **Below the region**, family by family (:func:`hdmm.georelease.rounding.round_below`, which
  streams): the children under their parent's integer cells, each child's total within ``w`` of the
  floor and ceiling of its real total, ``w`` the smallest of 0, 1, 2, 4, ... that the parent's cells
  allow (reported per level: a parent's cells are rounded without seeing its children, so ``w = 0``
  is not always possible; with free totals every cell rounds on its own).

Rounding the held region family by family instead can fail: the parent's rounded cells may not be
reachable by its children with their totals held (section 8.8 gives a 3 x 4 family). A family in which
some children are held and some not is refused for the same reason (:func:`check_integer`, at plan
time, before any noise).

>>> from hdmm.geography import GeographyTree
>>> tree = GeographyTree.from_parents({"a": "US", "b": "US"}, ["nation", "state"])
>>> cells = {0: np.array([[2.5, 1.5]]), 1: np.array([[1.25, 0.75], [1.25, 0.75]])}
>>> out = round_tree(tree, cells, {1: np.array([2.0, 2.0])})
>>> out.cells[0].tolist(), out.cells[1].sum(axis=1).tolist()
([[2, 2]], [2, 2])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..geography import GeographyError, GeographyTree
from .rounding import (MAX_FAMILY_MISS, ROUND_RTOL, RoundingError, integer_flow, round_below, snap)

__all__ = ["check_integer", "round_held", "round_tree", "IntegerCells", "held_region"]


def check_integer(tree: GeographyTree, held: Mapping[int | str, np.ndarray] | None) -> dict[int, np.ndarray]:
    """Refuse held totals that make integer cells impossible; return them closed upward (NaN: not held).

    Run it at plan time, before any noise. ``held`` maps levels to one total per unit (NaN where none),
    e.g. :func:`hdmm.georelease.nonneg.known_totals`. Refused: totals that are negative, infinite or not
    whole; a family where some children are held and others not; held children that do not add up to
    their held parent. A unit whose children are all held is held at their sum.

    >>> from hdmm.geography import GeographyTree
    >>> tree = GeographyTree.from_parents({"a": "US", "b": "US"}, ["nation", "state"])
    >>> check_integer(tree, {"state": np.array([3.0, 4.0])})[0].tolist()
    [7.0]
    """
    out = {d: np.full(tree.sizes[d], np.nan) for d in range(len(tree.levels))}
    for level, values in (held or {}).items():
        d = tree.level_index(level)
        v = np.asarray(values, dtype=float)
        if v.shape != (tree.sizes[d],):
            raise GeographyError(f"held totals of level {tree.levels[d]!r}: {v.shape} for {tree.sizes[d]} units "
                                 "(give one per unit, NaN where none is held)")
        given = ~np.isnan(v)
        bad = given & ~(np.isfinite(v) & (v >= 0) & (v == np.floor(v)))
        if bad.any():
            u = int(np.flatnonzero(bad)[0])
            raise GeographyError(f"the held total of {tree.label(d, u)} is {v[u]!r}: integer cells need held totals "
                                 "that are whole numbers >= 0")
        out[d] = v
    for d in range(len(tree.levels) - 2, -1, -1):
        bounds = tree.child_bounds(d)
        below = ~np.isnan(out[d + 1])
        count = np.add.reduceat(below.astype(np.intp), bounds[:-1])
        partial = (count > 0) & (count < np.diff(bounds))
        if partial.any():
            u = int(np.flatnonzero(partial)[0])
            raise GeographyError(
                f"{int(count[u])} of the {int(np.diff(bounds)[u])} units below {tree.label(d, u)} have held totals: "
                "integer cells need the held totals of a family all or none (rounding the others could make the "
                "held ones unreachable, docs/math.md section 8.8); declare them for every unit of the family")
        implied = np.add.reduceat(np.nan_to_num(out[d + 1]), bounds[:-1])
        full = count == np.diff(bounds)
        clash = full & ~np.isnan(out[d]) & (implied != out[d])
        if clash.any():
            u = int(np.flatnonzero(clash)[0])
            raise GeographyError(f"the held totals do not add up: {tree.label(d, u)} holds {out[d][u]:g} but its "
                                 f"units at level {tree.levels[d + 1]!r} hold {implied[u]:g}; fix the totals")
        out[d] = np.where(full & np.isnan(out[d]), implied, out[d])
    return out


def held_region(tree: GeographyTree, closed: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Per level, the positions of the units of the held region (the root alone when nothing is held)."""
    region = {d: np.flatnonzero(~np.isnan(np.asarray(closed[d]))) for d in sorted(closed)}
    if region[0].size == 0:
        return {0: np.array([0])}
    return {d: units for d, units in region.items() if units.size}


@dataclass(frozen=True)
class IntegerCells:
    """Integer cells per level (``units x cells``, int64) and, per level below the root, the largest ``w``
    any family there needed (0: every unheld unit's total is the floor or ceiling of its real one)."""

    cells: dict[int, np.ndarray]
    widened: dict[int, int]


def round_held(tree: GeographyTree, cells: Mapping[int, np.ndarray], closed: Mapping[int, np.ndarray],
               depth: int = 0) -> dict[int, np.ndarray]:
    """The integer cells of the region's units (``{level: rows of its units}``, module docstring): the held
    region and every unit down to level ``depth``, rounded at once with every unit's total the floor or the
    ceiling of its real one (exact where held)."""
    region = _region(tree, closed, depth)
    levels = sorted(region)
    m = np.asarray(cells[0]).shape[1]
    ids, keys, values = {}, {}, {}
    nodes = 2  # 0: source, 1: sink
    tails, heads, vals, los, his, weights = [], [], [], [], [], []
    miss = 0.0

    def edges(t, h, x, lo, hi, weight):
        for store, part in zip((tails, heads, vals, los, his, weights), (t, h, x, lo, hi, weight)):
            store.append(np.asarray(part))

    for d in levels:
        units = region[d]
        X = snap(np.asarray(cells[d], dtype=float)[units])
        i, j = np.nonzero(X > 0)
        keys[d], values[d] = units[i] * m + j, X[i, j]
        ids[d] = nodes + np.arange(i.size)
        nodes += i.size
        x = values[d]
        if d == 0:
            parent_ids = np.zeros(i.size, dtype=np.int64)
        else:
            parents = tree.parents(d)[units[i]]
            where = np.searchsorted(keys[d - 1], parents * m + j)
            where = np.minimum(where, max(keys[d - 1].size - 1, 0))
            found = i.size == 0 or (keys[d - 1].size > 0 and np.array_equal(keys[d - 1][where], parents * m + j))
            if not found:
                raise RoundingError(f"units of level {tree.levels[d]!r} have cells where their parent has none: "
                                    "the real cells are not consistent")
            parent_ids = ids[d - 1][where]
            sums = np.bincount(where, weights=x, minlength=keys[d - 1].size)
            miss += _family_miss(tree, d, region, values[d - 1], sums, keys[d - 1], m)
        edges(parent_ids, ids[d], x, np.floor(x), np.ceil(x), np.ones(x.size))
    unit_ids = {}
    for d in levels:
        unit_ids[d] = nodes + np.arange(region[d].size)
        nodes += region[d].size
    frontier = _frontier(tree, region)
    for d, units in frontier.items():  # the frontier's cells drain into their unit's node
        pos = np.searchsorted(region[d], units)
        row_of_entry = np.searchsorted(region[d], keys[d] // m)
        on = np.isin(row_of_entry, pos)
        x = values[d][on]
        edges(ids[d][on], unit_ids[d][row_of_entry[on]], x, np.floor(x), np.ceil(x), np.zeros(x.size))
    for d in levels:  # each unit's node passes its total to its parent's (the root's to the sink)
        units = region[d]
        real = np.asarray(cells[d], dtype=float)[units].sum(axis=1)
        target = np.asarray(closed[d], dtype=float)[units]
        held = ~np.isnan(target)
        allowed = ROUND_RTOL * np.maximum(1.0, np.where(held, target, 0.0))
        off = held & (np.abs(real - np.where(held, target, 0.0)) > allowed)
        if off.any():
            u = int(units[np.flatnonzero(off)[0]])
            raise RoundingError(f"the real cells of {tree.label(d, u)} add up to {float(real[units == u][0])!r}, not "
                                f"to its held total {float(closed[d][u]):g}; hold the totals in the estimates")
        miss += float(np.abs(real - target)[held].sum())
        near = np.rint(real)
        whole = np.abs(real - near) <= ROUND_RTOL * np.maximum(1.0, real)
        miss += float(np.abs(real - near)[whole & ~held].sum())
        lo = np.where(held, target, np.where(whole, near, np.floor(real)))
        hi = np.where(held, target, np.where(whole, near, np.ceil(real)))
        up = np.ones(units.size, dtype=np.int64) if d == 0 else \
            unit_ids[d - 1][np.searchsorted(region[d - 1], tree.parents(d)[units])]
        edges(unit_ids[d], up, real, lo, hi, np.zeros(units.size))
        if d == 0:
            edges([1], [0], real, lo, hi, [0.0])  # the sink returns the root's total to the source
    if miss >= MAX_FAMILY_MISS:
        raise RoundingError(f"the region's real cells miss their sums and totals by {miss:g} in all (at most "
                            f"{MAX_FAMILY_MISS}); round consistent estimates that meet the held totals")
    y, ok = integer_flow(*(np.concatenate(p) for p in (tails, heads)), *(np.concatenate(p) for p in (vals, los, his)),
                         np.zeros(nodes, dtype=np.int64), 1, np.concatenate(weights))
    if not ok[0]:
        raise ArithmeticError("the region could not be rounded; please report this")
    out, offset = {}, 0
    for d in levels:
        size = keys[d].size
        R = np.zeros((region[d].size, m), dtype=np.int64)
        R[np.searchsorted(region[d], keys[d] // m), keys[d] % m] = y[offset:offset + size]
        out[d] = R
        offset += size
    return out


def _region(tree: GeographyTree, closed: Mapping[int, np.ndarray], depth: int) -> dict[int, np.ndarray]:
    """The held region and every unit down to level ``depth``: the units rounded at once."""
    region = held_region(tree, closed)
    for d in range(depth + 1):
        region[d] = np.arange(tree.sizes[d])
    return region


def _frontier(tree: GeographyTree, region: Mapping[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Units of the region whose children are outside it (or that have none)."""
    out = {}
    for d, units in region.items():
        if d + 1 in region:
            inside = np.zeros(tree.sizes[d], dtype=bool)
            inside[tree.parents(d + 1)[region[d + 1]]] = True
            units = units[~inside[units]]
        if units.size:
            out[d] = units
    return out


def _family_miss(tree, d, region, parent_values, sums, parent_keys, m) -> float:
    """Summed miss of the region's children's cells against their parents' (level ``d``), checked per cell."""
    inside = np.zeros(tree.sizes[d - 1], dtype=bool)
    inside[tree.parents(d)[region[d]]] = True
    has_children = inside[parent_keys // m]
    miss = np.abs(sums - parent_values)[has_children]
    allowed = ROUND_RTOL * np.maximum(1.0, parent_values[has_children])
    if np.any(miss > allowed):
        raise RoundingError(f"units of level {tree.levels[d]!r} do not add up to their parent's cells (a miss of "
                            f"{miss.max():g}); round consistent estimates")
    return float(miss.sum())


def round_tree(tree: GeographyTree, cells: Mapping[int | str, np.ndarray],
               held: Mapping[int | str, np.ndarray] | None = None, joint: int | str = 0) -> IntegerCells:
    """Integer cells for the levels of ``cells`` (the root and every level down to the deepest given).

    ``cells[d]`` holds every unit's real cells (``units x cells``), consistent top down; ``held`` the
    held totals per level (NaN where none; :func:`check_integer`). Rounds the held region and every unit
    down to level ``joint`` at once (every unit's total there the floor or ceiling of its real one, or
    exact where held), and every family below it level by level; ``joint`` as deep as the tree makes one
    graph of all the tree's positive cells. A caller with more units than memory can instead call
    :func:`round_held` and stream families through :func:`hdmm.georelease.rounding.round_below`.
    """
    cells = {tree.level_index(level): np.asarray(X, dtype=float) for level, X in cells.items()}
    deepest = max(cells)
    if sorted(cells) != list(range(deepest + 1)):
        raise GeographyError("integer cells are rounded from the root down: give the cells of every level "
                             f"0..{deepest}")
    m = cells[0].shape[1]
    for d, X in cells.items():
        if X.shape != (tree.sizes[d], m):
            raise GeographyError(f"cells of level {tree.levels[d]!r}: {X.shape}, expected {(tree.sizes[d], m)}")
        if not np.all(np.isfinite(X)) or np.any(X < 0):
            raise RoundingError(f"the cells of level {tree.levels[d]!r} hold negative or non-finite values; round "
                                "non-negative estimates (hdmm.georelease.nonneg)")
    closed = check_integer(tree, held)
    depth = min(tree.level_index(joint), deepest)
    rounded = round_held(tree, cells, {d: closed[d] for d in closed if d <= deepest}, depth)
    region = _region(tree, {d: closed[d] for d in closed if d <= deepest}, depth)
    out = {d: np.zeros((tree.sizes[d], m), dtype=np.int64) for d in range(deepest + 1)}
    done = {d: np.zeros(tree.sizes[d], dtype=bool) for d in range(deepest + 1)}
    for d, R in rounded.items():
        if d <= deepest:
            out[d][region[d]] = R
            done[d][region[d]] = True
    widened = {}
    for d in range(deepest):
        bounds = tree.child_bounds(d)
        parents = np.flatnonzero(done[d] & ~np.isin(np.arange(tree.sizes[d]), tree.parents(d + 1)[done[d + 1]]))
        families = ((cells[d + 1][bounds[u]:bounds[u + 1]], out[d][u]) for u in parents.tolist())
        _check_families(tree, d, cells, parents)
        w_max = 0
        for u, (R, w) in zip(parents.tolist(), round_below(families)):
            out[d + 1][bounds[u]:bounds[u + 1]] = R
            w_max = max(w_max, w)
        done[d + 1][:] = True
        widened[d + 1] = w_max
    return IntegerCells(out, widened)


def _check_families(tree: GeographyTree, d: int, cells: Mapping[int, np.ndarray], parents: np.ndarray) -> None:
    """Refuse families below ``parents`` (level ``d``) whose real cells do not add up to their parent's."""
    if parents.size == 0:
        return
    sums = np.add.reduceat(cells[d + 1], tree.child_bounds(d)[:-1], axis=0)[parents]
    target = cells[d][parents]
    miss = np.abs(sums - target) - ROUND_RTOL * np.maximum(1.0, target)
    if np.any(miss > 0):
        u = int(parents[np.unravel_index(np.argmax(miss), miss.shape)[0]])
        raise RoundingError(f"the units below {tree.label(d, u)} do not add up to its cells; round consistent "
                            "estimates")
