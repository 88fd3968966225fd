r"""The tree least-squares passes, split into independent subtrees and a small top.

A geography release measures, for every unit ``u`` of every measured level ``l``, the person
strategy :math:`A_p` on the unit's histogram with weight :math:`w_l`. Each unit's measurement is
first mapped to a vector :math:`e_u` in a common space of ``k`` numbers (the person workload's
answers and the unit's total, or the strategy's answers), its *own* unbiased estimate. By the
mixed-product rule, :math:`(A_{\text{tree}} \otimes A_p)^+ = A_{\text{tree}}^+ \otimes A_p^+`, so
the least-squares answers of every unit are the tree pseudo-inverse applied, column by column, to
the :math:`e_u` (docs/math.md, section 8.4). With :math:`a_l = w_l^2`, :math:`l^*` the finest
measured level and the quantities :math:`\sigma, \rho, \beta, s` of
:class:`~hdmm.geography.solver.TreeSolver`:

1. *down* (accumulate): :math:`b_v = \sum_{u \supseteq v} a_u e_u` for every unit ``v`` of
   level :math:`l^*` (the sum over its measured ancestors and itself);
2. *up*: :math:`g_v = b_v / a_{l^*}` at level :math:`l^*`, then for coarser units
   :math:`\gamma_u = \sum_{c} g_c` (children ``c``) and :math:`g_u = \rho_u \gamma_u`;
3. *down* (offsets): :math:`t_{\text{root}} = 0`, a child of ``u`` gets
   :math:`t_u + \beta_u(\gamma_u - \sigma_u t_u)`, and :math:`z_v = (b_v - t_v)/a_{l^*}`;
4. the estimate of unit ``u`` at a level :math:`l \le l^*` is :math:`\sum_{v \subseteq u} z_v`.

The units of a level are numbered depth first, so the subtree of any unit is a contiguous range
at every level below it, and so are the subtrees of consecutive siblings. A *partition* is a range
of consecutive siblings of the partition level ``P`` (units ``lo..hi-1``, children of one unit
``p`` of level ``P - 1``; a state, or a few tracts of a county) with their subtrees: steps 1-4
inside it need only the partition's own measurements and two vectors from above, :math:`c` (the
sum of :math:`a_u e_u` over the ancestors of its units) and :math:`t` (their offset), both the
same for every child of ``p`` (``t`` is repeated over children in step 3). The coarse levels
above ``P`` need only :math:`\gamma_p`, the sum over the children of ``p`` of
:math:`g = g^{\text{own}} + s\,c` (by linearity, :math:`g^{\text{own}}` computed without
:math:`c`, since the pass of a constant gives :math:`s`): so a partition hands up the sum of its
units' :math:`g^{\text{own}}` (:func:`partition_up`), the top (:func:`top_passes`, on ``units
above P`` vectors) adds :math:`c` times the sum of their ``s`` (:math:`\sigma_p` over all of
``p``'s partitions), and every partition's second pass (:func:`partition_down`) gets its
parent's :math:`c` and its children's ``t``. The estimates of the levels above ``P`` are sums of
the partitions' sums of their units' estimates. Each partition is independent of the others: one
process partition by partition, or one Spark task per partition; how large a partition may be is
:func:`hdmm.georelease.plan.partition_ranges`'s choice.

>>> import numpy as np
>>> from hdmm.geography import GeographyTree, TreeStrategy
>>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
...                                   ["nation", "state", "county"])
>>> A = TreeStrategy(tree, [1.0, 1.0, 1.0])
>>> y = np.array([10.0, 6.0, 3.0, 2.0, 5.0, 4.0])       # nation, states a, b, counties a1, a2, b1
>>> passes = TreePasses(tree, A.weights)
>>> estimates = passes.solve({0: y[:1, None], 1: y[1:3, None], 2: y[3:, None]})
>>> np.allclose(estimates[2][:, 0], A.pinv() @ y)
True
>>> bool(np.isclose(estimates[0][0, 0], estimates[1][:, 0].sum()))
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..geography import GeographyTree
from ..geography.solver import TreeSolver

__all__ = ["Partition", "TreePasses", "partition_bounds", "partition_up", "partition_down", "top_passes"]


@dataclass(frozen=True)
class Partition:
    """Consecutive siblings of the partition level (units ``lo..hi-1`` of level ``P``, all children of one
    unit of level ``P - 1``) with their subtrees: their unit ranges level by level.

    Attributes
    ----------
    level : int
        The partition level ``P``.
    unit : int
        The position of the first unit at level ``P``.
    ranges : tuple of (int, int)
        ``(lo, hi)`` of the subtrees' units at levels ``P, P + 1, ...`` (to the finest level).
    parent : int
        The units' parent's position at level ``P - 1`` (0 when ``P`` is the root level).
    """

    level: int
    unit: int
    ranges: tuple[tuple[int, int], ...]
    parent: int = 0

    @classmethod
    def of(cls, tree: GeographyTree, level: int, unit: int) -> Partition:
        """The subtree of one unit of ``level``."""
        return cls.span(tree, level, unit, unit + 1)

    @classmethod
    def span(cls, tree: GeographyTree, level: int, lo: int, hi: int) -> Partition:
        """Units ``lo..hi-1`` of ``level`` with their subtrees; they must be children of one parent."""
        if not 0 <= level < len(tree.levels) or not 0 <= lo < hi <= tree.sizes[level]:
            raise ValueError(f"a partition is units lo..hi-1 of a level with 0 <= lo < hi <= its units; got level "
                             f"{level}, units {lo}..{hi - 1}")
        parent = 0
        if level:
            bounds = tree.child_bounds(level - 1)
            parent = int(np.searchsorted(bounds, lo, side="right")) - 1
            if hi > bounds[parent + 1]:
                raise ValueError(f"units {lo}..{hi - 1} of level {tree.levels[level]!r} are not siblings (unit {lo}'s "
                                 f"parent has children {int(bounds[parent])}..{int(bounds[parent + 1]) - 1}): split "
                                 f"the range at its parents' boundaries")
        ranges = [(int(lo), int(hi))]
        for d in range(level, tree.depth):
            bounds = tree.child_bounds(d)
            lo, hi = ranges[-1]
            ranges.append((int(bounds[lo]), int(bounds[hi])))
        return cls(level, ranges[0][0], tuple(ranges), parent)

    @property
    def units(self) -> tuple[int, int]:
        """``(lo, hi)`` of the partition's units at level ``P``."""
        return self.ranges[0]

    @property
    def size(self) -> int:
        """The number of the partition's units at level ``P``."""
        return self.ranges[0][1] - self.ranges[0][0]

    def range(self, d: int) -> tuple[int, int]:
        """``(lo, hi)`` of the partition's units at level ``d >= P``."""
        return self.ranges[d - self.level]

    def leaves(self) -> tuple[int, int]:
        """``(lo, hi)`` of the partition's leaves."""
        return self.ranges[-1]


class TreePasses:
    """The tree passes of the module docstring for one tree and one set of level weights.

    Parameters
    ----------
    tree
        The geography.
    weights
        :math:`w_l \\ge 0`, one per level (root first), at least one positive.
    """

    def __init__(self, tree: GeographyTree, weights: np.ndarray):
        self.tree = tree
        self.weights = np.asarray(weights, dtype=float)
        self.a = self.weights**2
        self.solver = TreeSolver(tree, self.a)
        self.finest = self.solver.finest

    def measured(self) -> list[int]:
        """The measured levels (weight > 0), root first."""
        return [int(d) for d in np.flatnonzero(self.a > 0)]

    def _local_bounds(self, d: int, lo: int, hi: int) -> np.ndarray:
        bounds = self.tree.child_bounds(d)[lo:hi + 1]
        return bounds - bounds[0]

    # ------------------------------------------------------------------ pieces
    def accumulate(self, start: int, ranges, own: dict[int, np.ndarray], above: np.ndarray,
                   reuse: bool = False) -> np.ndarray:
        """:math:`b` at the finest measured level: ``above`` (one row per unit of level ``start``)
        plus :math:`\\sum a_u e_u` over measured levels ``start..l*`` of ``own``. With ``reuse``, :math:`b` is
        made in ``own``'s finest array (the same bits: ``a * e + c`` is ``c + a * e``), which it overwrites."""
        C = np.array(above, dtype=float)
        for d in range(start, self.finest + 1):
            parents = None
            if d > start:
                lo, hi = ranges(d - 1)
                parents = np.repeat(np.arange(C.shape[0]), np.diff(self._local_bounds(d - 1, lo, hi)))
            if reuse and d == self.finest:
                out = own[d]
                step = _block_rows(out)
                for r in range(0, out.shape[0], step):
                    block = out[r:r + step]
                    block *= self.a[d]
                    block += C[r:r + step] if parents is None else C[parents[r:r + step]]
                return out
            if parents is not None:
                C = C[parents]
            if self.a[d] > 0:
                _add_scaled(C, self.a[d], own[d])
        return C

    def up(self, start: int, ranges, g: np.ndarray, stop: int) -> tuple[dict[int, np.ndarray], np.ndarray]:
        """From ``g`` at level ``start`` up to level ``stop``: the :math:`\\gamma` of levels ``stop..start-1``
        and :math:`g` at level ``stop``."""
        gammas = {}
        for d in range(start - 1, stop - 1, -1):
            lo, hi = ranges(d)
            gammas[d] = np.add.reduceat(g, self._local_bounds(d, lo, hi)[:-1], axis=0)
            g = gammas[d] * self.solver.rho[d][lo:hi, None]
        return gammas, g

    def down(self, start: int, ranges, gammas: dict[int, np.ndarray], t: np.ndarray, stop: int) -> np.ndarray:
        """Offsets from level ``start`` (``t``) down to level ``stop``."""
        for d in range(start, stop):
            lo, hi = ranges(d)
            t = t + self.solver.beta[d][lo:hi, None] * (gammas[d] - t * self.solver.sigma[d][lo:hi, None])
            t = np.repeat(t, np.diff(self._local_bounds(d, lo, hi)), axis=0)
        return t

    def totals(self, start: int, ranges, z: np.ndarray) -> dict[int, np.ndarray]:
        """Estimates of the units of levels ``start..l*``: sums of ``z`` over their level-:math:`l^*` units."""
        out = {self.finest: z}
        for d in range(self.finest - 1, start - 1, -1):
            lo, hi = ranges(d)
            out[d] = np.add.reduceat(out[d + 1], self._local_bounds(d, lo, hi)[:-1], axis=0)
        return out

    # ------------------------------------------------------------------ the whole tree at once
    def solve(self, own: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        """Estimates of every unit of levels ``0..l*`` from every measured unit's own estimate ``own[d]``.

        The unpartitioned passes (one partition, the root's subtree), for tests and small trees.
        """
        whole = Partition.of(self.tree, 0, 0)
        k = next(iter(own.values())).shape[1]
        b = self.accumulate(0, whole.range, own, np.zeros((1, k)))
        gammas, _ = self.up(self.finest, whole.range, b / self.a[self.finest], 0)
        t = self.down(0, whole.range, gammas, np.zeros((1, k)), self.finest)
        return self.totals(0, whole.range, (b - t) / self.a[self.finest])


def partition_up(passes: TreePasses, part: Partition, own: dict[int, np.ndarray]) -> np.ndarray:
    """A partition's first pass: the sum of its units' :math:`g^{\\text{own}}` (``1 x k``), without anything
    from above (for one unit, its :math:`g^{\\text{own}}`)."""
    f, P = passes.finest, part.level
    k = own[max(d for d in own)].shape[1]
    b = passes.accumulate(P, part.range, own, np.zeros((part.size, k)))
    b /= passes.a[f]  # in place: b is this function's own array
    _, g = passes.up(f, part.range, b, P)
    return g if part.size == 1 else g.sum(axis=0, keepdims=True)


def partition_bounds(tree: GeographyTree, level: int, bounds: np.ndarray | None = None) -> np.ndarray:
    """``bounds`` checked as the partitions of ``level`` (the first unit of each partition, then the level's size:
    consecutive ranges, none across two parents); ``None``: one partition per unit."""
    n = tree.sizes[level]
    if bounds is None:
        return np.arange(n + 1)
    bounds = np.asarray(bounds)
    if (bounds.ndim != 1 or bounds.size < 2 or not np.issubdtype(bounds.dtype, np.integer) or bounds[0] != 0
            or bounds[-1] != n or np.any(np.diff(bounds) <= 0)):
        raise ValueError(f"partition bounds must be increasing integers from 0 to the {n} units of level "
                         f"{tree.levels[level]!r}; got {bounds}")
    if level and not np.isin(tree.child_bounds(level - 1), bounds).all():
        raise ValueError(f"partition bounds of level {tree.levels[level]!r} must split it at every parent's first "
                         f"child (a partition is siblings): add tree.child_bounds({level - 1}) to them")
    return bounds


def top_passes(passes: TreePasses, level: int, g_own: np.ndarray, own: dict[int, np.ndarray],
               bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The coarse levels ``0..P-1``: each partition's ``c`` and ``t`` (``partitions x k`` each; the same for
    every unit of a partition, since its units are siblings).

    ``g_own`` holds every partition's first pass (:func:`partition_up`, one row per partition), ``own`` the
    own estimates of the measured levels above ``P`` and ``bounds`` the partitions (:func:`partition_bounds`;
    ``None``: one per unit of level ``P``). A parent's :math:`\\gamma` is the sum over its partitions of
    :math:`G + S c`, with :math:`G` a partition's row of ``g_own`` and :math:`S` the sum of its units' ``s``.
    """
    tree, P = passes.tree, level
    k = g_own.shape[1]
    bounds = partition_bounds(tree, P, bounds)
    if g_own.shape[0] != bounds.size - 1:
        raise ValueError(f"g_own has {g_own.shape[0]} rows for {bounds.size - 1} partitions")
    if P == 0:
        return np.zeros((1, k)), np.zeros((1, k))
    full = Partition.of(tree, 0, 0).range
    C = np.zeros((1, k))
    for d in range(P):
        if d:
            C = np.repeat(C, np.diff(tree.child_bounds(d - 1)), axis=0)
        if passes.a[d] > 0:
            C = C + passes.a[d] * own[d]
    parents = tree.child_bounds(P - 1)
    parent = np.searchsorted(parents, bounds[:-1], side="right") - 1  # each partition's parent
    c = C[parent]
    g = g_own + np.add.reduceat(passes.solver.s[P], bounds[:-1])[:, None] * c
    gammas = {P - 1: np.add.reduceat(g, np.searchsorted(bounds, parents[:-1]), axis=0)}
    above, _ = passes.up(P - 1, full, gammas[P - 1] * passes.solver.rho[P - 1][:, None], 0)
    gammas.update(above)
    t = passes.down(0, full, gammas, np.zeros((1, k)), P - 1)
    t = t + passes.solver.beta[P - 1][:, None] * (gammas[P - 1] - t * passes.solver.sigma[P - 1][:, None])
    return c, t[parent]


#: Rows of ``a * X`` made at a time by :func:`_add_scaled` (about 32 MB of SF1 strategy rows).
ADD_ROWS_BYTES = 2**25


def _block_rows(C: np.ndarray) -> int:
    return max(1, ADD_ROWS_BYTES // max(1, C.itemsize * (C.size // max(1, C.shape[0]))))


def _add_scaled(C: np.ndarray, a: float, X: np.ndarray) -> None:
    """``C += a * X`` a block of rows at a time: the same sums as ``C + a * X``, without an ``a * X`` the size of
    ``C`` (a partition's units x strategy rows: 1.35 GB for the largest synthetic county under SF1)."""
    X = np.broadcast_to(X, C.shape)
    step = _block_rows(C)
    for lo in range(0, C.shape[0], step):
        C[lo:lo + step] += a * X[lo:lo + step]


def partition_down(passes: TreePasses, part: Partition, own: dict[int, np.ndarray], c: np.ndarray,
                   t: np.ndarray, reuse: bool = False) -> dict[int, np.ndarray]:
    """A partition's second pass: the estimates of its units at levels ``P..l*`` (``c``, ``t``: ``1 x k``).
    With ``reuse`` (a writable array the caller no longer needs), the finest level's ``own`` is overwritten by
    the estimates (one array of the partition's size less)."""
    f, P = passes.finest, part.level
    b = passes.accumulate(P, part.range, own, np.broadcast_to(c, (part.size, c.shape[1])), reuse=reuse)
    gammas, _ = passes.up(f, part.range, b / passes.a[f], P)
    z = b  # (b - offsets) / a, in place: b is this function's own array
    z -= passes.down(P, part.range, gammas, t, f)
    z /= passes.a[f]
    return passes.totals(P, part.range, z)
