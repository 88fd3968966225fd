r"""The plan of a geography release: made once, without data, and shipped to every worker.

A geography release answers the person workload :math:`W_p` (e.g. SF1) for every unit of the
released levels of a :class:`~hdmm.geography.GeographyTree` (nation, states, counties, tracts).
It measures :math:`A = A_{\text{tree}}(w) \otimes A_p`: the person strategy :math:`A_p` on the
histogram of every unit of every measured level ``l``, scaled by the level's weight :math:`w_l`
(the level's share of the measurement budget). A person is in one unit per level, so

.. math:: \Delta_1(A) = \Big(\sum_l w_l\Big)\,\Delta_1(A_p), \qquad
          \Delta_2(A) = \Big(\sum_l w_l^2\Big)^{1/2}\,\Delta_2(A_p),

and every unit's strategy answers get noise calibrated to :math:`\Delta(A)`: the whole release
spends the plan's privacy once, by parallel composition over the units of a level and sequential
composition over levels, folded into one sensitivity. The least-squares estimate
:math:`A^+y = (A_{\text{tree}}^+ \otimes A_p^+)\,y` is computed unit by unit
(:mod:`hdmm.georelease.passes`), so the cell vector of the whole country never exists. The
variance of query ``q`` of unit ``v`` at level ``l`` is :math:`\nu\,(S_lX^+S_l^T)_{vv}\,
(W_p(A_p^TA_p)^+W_p^T)_{qq}`, a tree factor times a person factor (:mod:`hdmm.georelease.levels`).

>>> import hdmm
>>> from hdmm.geography import GeographyTree
>>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
...                                   ["nation", "state", "county"])
>>> p = geo_plan(tree, hdmm.Identity(3), hdmm.PureDP(1.0), strategy=hdmm.Identity(3))
>>> p.summary()[["level", "units", "queries"]].values.tolist()
[['nation', 1, 3], ['state', 2, 6], ['county', 3, 9]]

**Per-level strategies.** ``strategy`` may instead give every measured level its own person
strategy :math:`A_l` (the 2020 Census measured different queries at each level). A person is still
in one unit per level, in the same person cell :math:`j` at every level, so
:math:`\Delta_p(A)^p = \max_j\sum_l w_l^p\|A_le_j\|_p^p` (at most :math:`\sum_l w_l^p\Delta_p(A_l)^p`,
each level's worst column at once, which the plan uses on domains too large to sum cell by cell). The Grams
:math:`A_l^TA_l` of different levels need not commute, so the whole-tree least squares of
:mod:`hdmm.georelease.passes` no longer factors into a tree part and a person part. Such a plan is
estimated top down instead, as the 2020 production system does
(:mod:`hdmm.georelease.nonneg`): every unit from its own measurements (:math:`A_l^+y_u`), the root
first, then each family projected onto its parent's cells through its level's strategy. It releases
non-negative or integer tables; the variances it reports are those of each level's own
estimates, before the top-down step (:meth:`GeoPlan.variances`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from ..geography import GeographyError, GeographyTree, TreeStrategy
from ..geography.solver import TreeSolver
from ..matrix import Matrix, Weighted
from ..optimizers import OptimizationResult
from ..noise import calibrate_grid
from ..planning import SENSITIVITY_MARGIN, Plan, plan
from ..privacy import Privacy
from ..structure import classify
from ..version import HDMM_VERSION
from .invariants import Invariants
from .levels import optimize_level_weights
from .passes import Partition, TreePasses
from ..threads import one_blas_thread

__all__ = ["GeoPlan", "geo_plan", "default_partition", "partition_ranges", "PARTITION_UNITS", "PARTITION_VALUES",
           "RANGE_UNITS", "MIN_PARTITIONS"]


@dataclass(frozen=True, eq=False)
class GeoPlan:
    """A data-independent geography release plan (module docstring); make one with :func:`geo_plan`.

    Attributes
    ----------
    tree : GeographyTree
    levels : tuple of int
        The released levels (positions in ``tree.levels``).
    level_weights : numpy.ndarray
        :math:`w_l` per tree level, root first (0: not measured), summing to 1.
    person : Plan
        The person workload's plan (queries, strategy :math:`A_p`, reconstruction route).
    privacy : Privacy
        What the whole release spends.
    sensitivity : float
        :math:`\\Delta(A_{\\text{tree}})\\,\\Delta(A_p)`, with the relative margin ``SENSITIVITY_MARGIN``
        and the rounding bound of the noise grid (:func:`hdmm.noise.calibrate_grid`) for the
        answers one person moves: the rows of :math:`A_p` in one unit of each measured level.
    spacing : float
        The noise grid (a power of two) every unit's answers are rounded to.
    noise_scale : float
        Laplace scale or Gaussian standard deviation of every noisy strategy answer.
    partition_level : int
        The level whose subtrees are processed independently (states by default).
    partition_bounds : numpy.ndarray or None
        The partitions as ranges of consecutive siblings of the partition level
        (:func:`~hdmm.georelease.passes.partition_bounds`; :meth:`GeoPlan.with_partitions`), or ``None``:
        one partition per unit of the partition level.
    partition_auto : bool
        Whether the partitions are the default (no ``partition`` given to :func:`geo_plan`, no
        :meth:`with_partitions`): a release then cuts them into ranges of siblings sized for its
        post-processing (:func:`hdmm.georelease.pipeline.release_partitions`). Given partitions are
        used as they are.
    invariants : Invariants or None
        Public unit totals held exactly (not privatized).
    origin : str
        Who chose the person strategy and the level weights.
    level_persons : tuple of Plan or None
        Per tree level, the person plan of its own strategy :math:`A_l` (``None`` at unmeasured
        levels), for a plan with per-level strategies (module docstring); ``None`` when every level
        measures ``person``'s strategy. ``person`` is then the finest measured level's.
    """

    tree: GeographyTree
    levels: tuple[int, ...]
    level_weights: np.ndarray
    person: Plan
    privacy: Privacy
    sensitivity: float
    noise_scale: float
    partition_level: int
    invariants: Invariants | None
    origin: str
    seconds: float = 0.0
    version: str = HDMM_VERSION
    spacing: float = 0.0
    level_persons: tuple[Plan | None, ...] | None = None
    partition_bounds: np.ndarray | None = None
    partition_auto: bool = False
    _cache: dict = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ structure
    def memo(self, key: str, make: Callable[[], object]):
        """``make()`` computed once per plan and kept (derived, data-independent objects)."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def labels(self) -> list[str]:
        """The person queries' labels, in row order."""
        return self.memo("labels", lambda: [str(x) for x in self.person.workload.labels])

    @property
    def passes(self) -> TreePasses:
        """The tree passes (:mod:`hdmm.georelease.passes`) for the level weights, made once."""
        return self.memo("passes", lambda: TreePasses(self.tree, self.level_weights))

    @property
    def partitions(self) -> int:
        """The number of partitions (tasks of a step)."""
        if self.partition_bounds is None:
            return int(self.tree.sizes[self.partition_level])
        return int(self.partition_bounds.size - 1)

    @property
    def ranged(self) -> bool:
        """Whether the partitions are ranges of siblings (:attr:`partition_bounds`) rather than single units."""
        return self.partition_bounds is not None

    def partition(self, i: int) -> Partition:
        """Partition ``i``: its units at the partition level and below."""
        if self.partition_bounds is None:
            return Partition.of(self.tree, self.partition_level, i)
        b = self.partition_bounds
        return Partition.span(self.tree, self.partition_level, int(b[i]), int(b[i + 1]))

    def with_partitions(self, values: int | None = None, level: str | int | None = None,
                        units: int | None = None) -> GeoPlan:
        """This plan with its partitions chosen by :func:`partition_ranges`: ranges of siblings whose units
        hold at most ``values`` numbers (default ``PARTITION_VALUES``; a unit holds the larger of its answers
        and its strategy answers) and number at most ``units`` (default ``RANGE_UNITS``), at ``level``
        (default: the coarsest level whose every unit fits). The release's answers are the same to rounding.
        The result's partitions are given (``partition_auto`` is false): a release uses them as they are.

        >>> import hdmm
        >>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
        ...                                   ["nation", "state", "county"])
        >>> p = geo_plan(tree, hdmm.Identity(3), hdmm.PureDP(1.0), strategy=hdmm.Identity(3))
        >>> q = p.with_partitions(values=8)          # 4 numbers a unit: 2 units a partition
        >>> q.partition_level, q.partition_bounds.tolist(), q.partition(0).units
        (2, [0, 2, 3], (0, 2))
        """
        return self._ranged(values, level, units, auto=False)

    def _ranged(self, values: int | None, level: str | int | None, units: int | None, auto: bool,
                ranges: bool = True) -> GeoPlan:
        if self.per_level:
            raise GeographyError("a plan with per-level strategies is estimated top down unit by unit; its "
                                 "partitions are the units of the partition level")
        width = max(self.queries + 1, self.person.strategy.shape[0])
        given = None if level is None else self.tree.level_index(level)
        P, bounds = partition_ranges(self.tree, self.solver.finest, width, given,
                                     PARTITION_VALUES if values is None else values,
                                     RANGE_UNITS if units is None else units)
        if self.invariants is not None:
            self.invariants.check_supported(self.tree, self.solver)
        return replace(self, partition_level=P, partition_bounds=bounds if ranges else None, partition_auto=auto,
                       _cache=dict(self._cache))

    def default_ranges(self, units: int | None = None, ranges: bool = True) -> GeoPlan:
        """This plan, with default partitions, cut by :func:`partition_ranges` into ranges of siblings of at
        most ``PARTITION_VALUES`` numbers and ``units`` (default ``RANGE_UNITS``) units each, and at most
        1/``MIN_PARTITIONS`` of the tree's units where that makes no range a single unit (``ranges=False``:
        one partition per unit of that function's level, the coarsest whose every unit fits);
        ``partition_auto`` stays true. A plan with given partitions or per-level strategies is returned as it
        is. What a release runs on (:func:`hdmm.georelease.pipeline.release_partitions`)."""
        if not self.partition_auto or self.per_level:
            return self
        total = int(sum(self.tree.sizes[:self.solver.finest + 1]))  # enough tasks to spread over the cores
        cap = min(RANGE_UNITS if units is None else units, max(1, -(-total // MIN_PARTITIONS)))
        return self._ranged(None, None, cap, auto=True, ranges=ranges)

    @property
    def solver(self) -> TreeSolver:
        """The tree Gram's solver for the level weights (the passes')."""
        return self.passes.solver

    @property
    def measured(self) -> list[int]:
        """The measured levels (weight > 0), root first."""
        return [int(d) for d in np.flatnonzero(self.level_weights > 0)]

    @property
    def per_level(self) -> bool:
        """Whether the levels measure different person strategies (estimated top down; module docstring)."""
        return self.level_persons is not None

    def person_plan(self, level: int) -> Plan:
        """The person plan (workload and strategy :math:`A_l`) that level ``level`` measures."""
        if self.level_persons is None:
            return self.person
        found = self.level_persons[level]
        if found is None:
            raise GeographyError(f"level {self.tree.levels[level]!r} is not measured (its weight is 0)")
        return found

    def level_pinv(self, level: int) -> Matrix:
        """:math:`A_l^+` of ``level``'s person strategy, formed once (:attr:`strategy_pinv` when shared)."""
        if self.level_persons is None:
            return self.strategy_pinv
        return self.memo(("pinv", level), lambda: self.person_plan(level).strategy.pinv())

    @property
    def queries(self) -> int:
        """Person queries per unit."""
        return self.person.queries

    def unit_plan(self, level: int) -> Plan:
        """The plan of one unit of a measured level: :math:`w_l A_p`, noise calibrated to the whole strategy.

        Its sensitivity is the geography strategy's, not :math:`w_l\\Delta(A_p)`: the unit's rows are
        part of :math:`A`, and each person is in one unit of every measured level.
        """
        key = ("unit", level)
        if key not in self._cache:
            w = float(self.level_weights[level])
            if w <= 0:
                raise GeographyError(f"level {self.tree.levels[level]!r} is not measured (its weight is 0)")
            person = self.person_plan(level)
            strategy = Weighted(person.strategy, w)
            self._cache[key] = Plan(
                workload=person.workload, strategy=strategy, privacy=self.privacy,
                sensitivity=self.sensitivity, noise_scale=self.noise_scale, structure=classify(strategy),
                method=person.method, variances=None, variance_exact=True,
                origin=f"{self.origin}, level {self.tree.levels[level]}", version=self.version,
                spacing=self.spacing,
            )
        return self._cache[key]

    # ------------------------------------------------------------------ error
    @property
    def noise_variance(self) -> float:
        """Variance of each noisy strategy answer."""
        return self.privacy.noise_variance(self.sensitivity)

    @property
    def query_variances(self) -> np.ndarray:
        """Person factor of the variances: :math:`\\mathrm{diag}(W_p(A_p^TA_p)^+W_p^T)` (unit noise)."""
        if "query" not in self._cache:
            self._cache["query"] = self.person.variances / self.privacy.noise_variance(self.person.sensitivity)
        return self._cache["query"]

    def unit_variances(self, level: int) -> np.ndarray:
        """Tree factor of the variances of ``level``'s units: :math:`(S_lX^+S_l^T)_{vv}`, without invariants."""
        key = ("tree", level)
        if key not in self._cache:
            self._cache[key] = self.solver.unit_variances(level)
        return self._cache[key]

    def invariant_reduction(self, level: int) -> np.ndarray | None:
        """Per unit of ``level``: the tree factor the invariants take off the variances (times
        :math:`h_q^2/\\gamma` per query), ``None`` when not computed (see :mod:`hdmm.georelease.invariants`)."""
        if self.invariants is None:
            return np.zeros(self.tree.sizes[level])
        key = ("reduction", level)
        if key not in self._cache:
            self._cache[key] = self.invariants.variance_reduction(self.tree, self.solver, level)
        return self._cache[key]

    @property
    def total_direction(self) -> tuple[np.ndarray, float]:
        """:math:`h = W_pG_p^+\\mathbf 1` and :math:`\\gamma = \\mathbf 1^TG_p^+\\mathbf 1` (invariants only)."""
        if "h" not in self._cache:
            u, g = self.total_parts
            self._cache["h"] = (self.person.workload @ g, float(u @ u))
        return self._cache["h"]

    @property
    def strategy_pinv(self) -> Matrix:
        """:math:`A_p^+`, formed once (cells from a unit's measurements: :math:`\\hat x = A_p^+ z`)."""
        return self.memo("pinv", lambda: self.person.strategy.pinv())

    @property
    def total_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """:math:`u = (A_p^+)^T\\mathbf 1` (a unit's total from its measurements, :math:`u^Tz`) and
        :math:`G_p^+\\mathbf 1 = A_p^+u`, formed once."""
        def make():
            pinv = self.strategy_pinv
            u = pinv.T @ np.ones(self.person.strategy.shape[1])
            return u, pinv @ u
        return self.memo("total parts", make)

    def variances(self, level: int, units: np.ndarray | None = None) -> np.ndarray:
        """Variance of every released answer of ``level`` (``units x queries``; only ``units``, positions
        in the level, if given); an upper bound when :attr:`variance_exact` is false.

        With per-level strategies: the variance of the level's own least-squares estimates,
        :math:`\\nu\\,(W_p(A_l^TA_l)^+W_p^T)_{qq}/w_l^2`, before the top-down step (which adds the
        parent's information and, with non-negativity, a bias): the error of the level's noisy
        measurements themselves.
        """
        pick = slice(None) if units is None else np.asarray(units)
        if self.level_persons is not None:
            person = self.person_plan(level)
            own = person.variances / person.privacy.noise_variance(person.sensitivity)
            count = self.tree.sizes[level] if units is None else len(pick)
            w2 = float(self.level_weights[level]) ** 2
            return np.tile(self.noise_variance * own / w2, (count, 1))
        out = self.noise_variance * np.outer(self.unit_variances(level)[pick], self.query_variances)
        reduction = self.invariant_reduction(level)
        if self.invariants is not None and reduction is not None:
            h, gamma = self.total_direction
            out -= self.noise_variance * np.outer(reduction[pick], h**2 / gamma)
            np.maximum(out, 0.0, out=out)
        return out

    @property
    def variance_exact(self) -> bool:
        """False when invariants are too many for the exact variance reduction (variances are upper bounds),
        and for per-level strategies (the variances are each level's own measurements', :meth:`variances`)."""
        if self.level_persons is not None:
            return False
        return all(self.invariant_reduction(d) is not None for d in self.levels) and self.person.variance_exact

    def expected_rmse(self, level: int) -> float:
        """Expected RMSE of the released answers of ``level`` (over all its units and queries).

        Without invariants the mean of the outer product is the product of the means; with them
        the variances are summed a block of units at a time (a level of tracts has 300 million).
        """
        if self.level_persons is not None:
            return float(np.sqrt(np.mean(self.variances(level, np.array([0])))))
        if self.invariants is None:
            return float(np.sqrt(self.noise_variance * np.mean(self.unit_variances(level))
                                 * np.mean(self.query_variances)))
        units = self.tree.sizes[level]
        total = sum(float(np.sum(self.variances(level, np.arange(lo, min(lo + 4096, units)))))
                    for lo in range(0, units, 4096))
        return float(np.sqrt(total / (units * self.queries)))

    def summary(self) -> pd.DataFrame:
        """One row per released level: units, queries, level weight and expected RMSE."""
        rows = []
        for d in self.levels:
            rows.append({
                "level": self.tree.levels[d], "units": self.tree.sizes[d],
                "queries": self.tree.sizes[d] * self.queries, "level weight": float(self.level_weights[d]),
                "expected RMSE": self.expected_rmse(d),
            })
        return pd.DataFrame(rows)

    def describe(self) -> str:
        """A few lines for people: levels, budget shares, privacy, sensitivity and expected RMSE per level."""
        shares = ", ".join(f"{self.tree.levels[d]} {self.level_weights[d]:.3g}" for d in self.measured)
        lines = [
            f"geography release plan: {self.person.queries:,} person queries x units of "
            f"{[self.tree.levels[d] for d in self.levels]}",
            f"  privacy: {self.privacy.description} ({self.privacy.noise.name} noise, sensitivity {self.sensitivity:.6g}, "
            f"scale {self.noise_scale:.6g})",
            f"  level weights (measurement budget shares): {shares}",
            f"  person strategy: {self.person.strategy!r} ({self.origin})" if self.level_persons is None else
            "  person strategies per level (estimated top down): " + "; ".join(
                f"{self.tree.levels[d]} {self.person_plan(d).strategy!r}" for d in self.measured),
        ]
        if self.invariants is not None:
            lines.append(f"  invariants (public, not privatized): {self.invariants.units} unit totals held exactly")
        own = " of its own measurements (before the top-down step)" if self.level_persons is not None else ""
        lines += [f"  {self.tree.levels[d]}: expected RMSE{own} {self.expected_rmse(d):.4g}" for d in self.levels]
        return "\n".join(lines)


#: Most units (down to the finest measured level) :func:`default_partition` lets one partition hold.
PARTITION_UNITS = 2**14


def _subtree_units(tree: GeographyTree, d: int, finest: int) -> np.ndarray:
    """Every unit of level ``d``'s units at levels ``d..finest`` (itself and those below it)."""
    starts = tree.leaf_bounds(d)
    per_unit = np.zeros(tree.sizes[d], dtype=np.int64)
    for e in range(d, finest + 1):  # units of level e under each unit of level d
        per_unit += np.diff(np.searchsorted(tree.leaf_bounds(e)[:-1], starts, side="left"))
    return per_unit


def default_partition(tree: GeographyTree, finest: int, units: int | None = None) -> int:
    """The coarsest level below the root whose every unit's subtree (its units down to level ``finest``) holds
    at most ``units`` units (default ``PARTITION_UNITS``; ``finest`` if none; the root when nothing below it is
    measured).

    A partition is one task's work and memory (its units' strategy answers), so no partition may be
    large, and many small ones balance over the cores: the states for a tree down to tracts, the
    tracts for one down to blocks (a synthetic county holds up to 498,703 units).

    >>> tree = GeographyTree.from_parents({"a": "US", "a1": "a", "a2": "a"}, ["nation", "state", "county"])
    >>> default_partition(tree, 2)
    1
    """
    cap = PARTITION_UNITS if units is None else units
    for d in range(1, finest + 1):
        per_unit = _subtree_units(tree, d, finest)
        if per_unit.size == 0 or int(per_unit.max()) <= cap:
            return d
    return finest


#: Most values (units down to the finest measured level, times the numbers per unit) :func:`partition_ranges`
#: lets one partition hold: 128 MB of doubles (a task holds its state about four times over).
PARTITION_VALUES = 2**24

#: Most units (down to the finest measured level) in one range of siblings (:meth:`GeoPlan.with_partitions`),
#: where a unit holds few numbers (PL94: a range is some of a state's counties with their tracts).
RANGE_UNITS = 2**13

#: The default partitions hold at most 1/MIN_PARTITIONS of the tree's units each, so that a step's tasks
#: spread over the cores.
MIN_PARTITIONS = 16


def partition_ranges(tree: GeographyTree, finest: int, width: int, level: int | None = None,
                     values: int = PARTITION_VALUES, units: int = PARTITION_UNITS) -> tuple[int, np.ndarray]:
    """The partitions of a release whose units hold ``width`` numbers each: a partition level ``P`` and the
    partitions' bounds at it (:func:`hdmm.georelease.passes.partition_bounds`: ranges of consecutive siblings).

    A partition holds at most ``min(units, values // width)`` units down to level ``finest`` (its subtrees'
    units), unless one unit's subtree alone holds more (a partition of one unit, at the finest level only
    when the width alone is over ``values``). ``P`` is ``level`` if given, else the coarsest level whose every
    unit's subtree fits (:func:`default_partition` with that cap); the siblings of each parent are cut
    greedily, in order, into the fewest ranges that fit, so a parent with few children is one range. With
    ``units`` and ``values // width`` at most each unit's subtree size the partitions are the units of ``P``.

    >>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "a3": "a", "b1": "b"},
    ...                                   ["nation", "state", "county"])
    >>> partition_ranges(tree, 2, width=1, values=2)     # a's 4 units are over 2: counties, 2 per range
    (2, array([0, 2, 3, 4]))
    >>> partition_ranges(tree, 2, width=1, values=4)     # a (4 units) fits, with b (2) it does not
    (1, array([0, 1, 2]))
    >>> partition_ranges(tree, 2, width=2, values=12)    # both states fit in one range
    (1, array([0, 2]))
    """
    if width < 1 or values < 1 or units < 1:
        raise ValueError(f"partition_ranges needs width, values and units >= 1; got {width}, {values}, {units}")
    cap = max(1, min(units, values // width))
    P = default_partition(tree, finest, cap) if level is None else int(level)
    if not 0 <= P <= max(finest, 0):
        raise GeographyError(f"the partition level {P} is not a level from the root to the finest measured one "
                             f"({finest})")
    if P == 0:
        return 0, np.array([0, 1])
    size = _subtree_units(tree, P, finest)
    cum = np.concatenate([[0], np.cumsum(size)])
    parents = tree.child_bounds(P - 1)
    cuts = [0]
    for p in range(parents.size - 1):
        lo, end = int(parents[p]), int(parents[p + 1])
        while lo < end:  # the most units from lo whose subtrees fit (at least one)
            hi = int(np.searchsorted(cum, cum[lo] + cap, side="right")) - 1
            lo = min(end, max(lo + 1, hi))
            cuts.append(lo)
    return P, np.array(cuts)


@one_blas_thread
def geo_plan(tree: GeographyTree, person: Matrix, privacy: Privacy, *,
             levels: Sequence[str | int] | None = None,
             weights: Sequence[float] | None = None,
             strategy: str | Matrix | OptimizationResult | Mapping[str | int, Matrix] = "auto",
             level_weights: str | Mapping[str | int, float] | Sequence[float] = "auto",
             invariants: Mapping[str | int, Mapping[object, float]] | Invariants | None = None,
             partition: str | int | None = None,
             seed=None, progress: bool | Callable[[str], None] = False) -> GeoPlan:
    """Plan a release of the person workload ``person`` for every unit of ``levels`` of ``tree``.

    Parameters
    ----------
    tree
        The geography.
    person
        The person workload :math:`W_p` (e.g. ``census_workloads.sf1_persons()``), over the person
        domain (without geography).
    privacy
        What the whole release spends: :class:`~hdmm.PureDP`, :class:`~hdmm.ApproxDP` or :class:`~hdmm.ZCDP`.
    levels
        The released levels (default: all of them, nation to the finest).
    weights
        One weight per released level: how much its error counts to the optimizer (the level
        weights). The default, :math:`1/\\sqrt{\\text{units}}`, makes every level's mean squared
        error count the same: with weight 1 everywhere the many tracts would outvote the nation.
    strategy
        The person strategy: ``"auto"`` (:func:`hdmm.optimize`), a matrix or an optimization result;
        or ``{level: matrix}``, a strategy for every measured level (per-level strategies, estimated
        top down: module docstring; give ``level_weights`` then).
    level_weights
        ``"auto"`` (optimized, :func:`~hdmm.georelease.levels.optimize_level_weights`), or the
        budget share of each level (``{level: share}`` or one per level); normalized to sum 1.
    invariants
        ``{level: {code: total}}``: public totals held exactly (not privatized; see
        :mod:`hdmm.georelease.invariants`).
    partition
        The level whose units' subtrees are processed independently, one partition per unit. By
        default :func:`default_partition`'s level, which a release cuts into ranges of siblings sized
        for its post-processing (:func:`hdmm.georelease.pipeline.release_partitions`), so that no task
        holds more than ``PARTITION_VALUES`` numbers where the post-processing allows.
    seed, progress
        For :func:`hdmm.optimize` (``strategy="auto"``).

    Raises
    ------
    GeographyError
        Unknown or repeated levels, a released level finer than every measured one, invariants
        that are unknown, negative or do not add up, a partition level finer than the finest
        measured level.
    """
    start = time.perf_counter()
    if not isinstance(tree, GeographyTree):
        raise TypeError(f"tree must be a GeographyTree, got {type(tree).__name__}")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    released = list(range(len(tree.levels))) if levels is None else [tree.level_index(x) for x in levels]
    if len(set(released)) != len(released):
        twice = next(tree.levels[d] for d in released if released.count(d) > 1)
        raise GeographyError(f"level {twice!r} is named twice; list each level once")
    if not released:
        raise GeographyError("release at least one level")
    if weights is None:  # every level's mean squared error counts the same, however many units it has
        omega = 1.0 / np.sqrt([tree.sizes[d] for d in released])
    else:
        omega = np.asarray(weights, dtype=float).reshape(-1)
    if omega.size != len(released) or not np.all(np.isfinite(omega)) or np.any(omega < 0):
        raise GeographyError(f"give one finite weight >= 0 per released level ({len(released)}), got {weights!r}")
    if isinstance(invariants, Mapping):
        invariants = Invariants.of(tree, invariants)
    elif invariants is not None and not isinstance(invariants, Invariants):
        raise TypeError("invariants must be {level: {code: total}}")
    if isinstance(strategy, Mapping):
        return _per_level_plan(tree, person, privacy, released, strategy, level_weights, invariants, partition, start)
    person_plan = plan(person, strategy, privacy, seed=seed, progress=progress)
    origin = person_plan.origin
    if isinstance(level_weights, str):
        if level_weights != "auto":
            raise ValueError(f"level_weights must be 'auto', a mapping or a sequence, got {level_weights!r}")
        w = optimize_level_weights(tree, dict(zip(released, omega.tolist())), privacy.norm)
        origin += "; level weights optimized"
    else:
        w = _given_weights(tree, level_weights)
        origin += "; level weights given"
    solver = TreeSolver(tree, w**2)
    too_fine = [tree.levels[d] for d in released if d > solver.finest]
    if too_fine:
        raise GeographyError(
            f"released level(s) {too_fine} are finer than the finest measured level {tree.levels[solver.finest]!r}: "
            "their totals cannot be estimated; give them a level weight > 0"
        )
    P = _partition_level(tree, solver, invariants, partition)
    norm = privacy.norm
    tree_sensitivity = float(np.sum(w)) if norm == 1 else float(np.sqrt(np.sum(w**2)))
    A_p = person_plan.strategy
    raw = tree_sensitivity * A_p.sensitivity(norm) * (1.0 + SENSITIVITY_MARGIN)
    # one person moves the rows of A_p in one unit of every measured level: that many answers are rounded
    spacing, sensitivity = calibrate_grid(raw, int(np.count_nonzero(w)) * A_p.shape[0], norm, privacy.noise_scale)
    result = GeoPlan(
        tree=tree, levels=tuple(released), level_weights=w, person=person_plan, privacy=privacy,
        sensitivity=sensitivity, noise_scale=privacy.noise_scale(sensitivity), partition_level=P,
        invariants=invariants, origin=origin, seconds=time.perf_counter() - start, spacing=spacing,
        partition_auto=partition is None,
    )
    if invariants is not None:
        result.total_direction  # noqa: B018 -- fails here, before any data, when A_p has no structural pinv
    return result


def _partition_level(tree: GeographyTree, solver: TreeSolver, invariants: Invariants | None, partition) -> int:
    """The partition level (given, or :func:`default_partition`), after the invariants' check against the tree."""
    if invariants is not None:
        invariants.check_supported(tree, solver)
    P = default_partition(tree, solver.finest) if partition is None else tree.level_index(partition)
    if P > solver.finest:
        raise GeographyError(f"the partition level {tree.levels[P]!r} is finer than the finest measured level "
                             f"{tree.levels[solver.finest]!r}")
    return P


#: Largest person domain whose per-level column norms are summed cell by cell for the exact sensitivity.
MAX_NORM_CELLS = 2**24


def _per_level_sensitivity(strategies: list[Matrix], weights: np.ndarray, norm: int) -> float:
    """:math:`\\max_j(\\sum_l w_l^p\\|A_le_j\\|_p^p)^{1/p}`: one person, in cell ``j`` at every level (module
    docstring); each level's worst column at once (an upper bound) on domains above ``MAX_NORM_CELLS``."""
    cells = strategies[0].shape[1]
    if cells > MAX_NORM_CELLS:
        parts = np.array([A.sensitivity(norm) for A in strategies])
        return float(np.sum(weights**norm * parts**norm) ** (1.0 / norm))
    total = np.zeros(cells)
    for A, w in zip(strategies, weights):
        total += w**norm * A.column_norm_powers(norm).to_array()
    return float(total.max() ** (1.0 / norm))


def _per_level_plan(tree: GeographyTree, person: Matrix, privacy: Privacy, released: list[int],
                    strategies: Mapping[str | int, Matrix], level_weights, invariants: Invariants | None,
                    partition, start: float) -> GeoPlan:
    """:func:`geo_plan` with a person strategy per measured level (module docstring)."""
    if isinstance(level_weights, str):
        raise GeographyError("per-level strategies need the level weights (budget shares) given: level_weights="
                             "{level: share}; 'auto' optimizes them for one strategy shared by every level")
    w = _given_weights(tree, level_weights)
    given = {}
    for key, A in strategies.items():
        d = tree.level_index(key)
        if d in given:
            raise GeographyError(f"level {tree.levels[d]!r} has two strategies; give each level one")
        if not isinstance(A, Matrix):
            raise TypeError(f"the strategy of level {tree.levels[d]!r} must be a Matrix, got {type(A).__name__}")
        given[d] = A
    measured = [int(d) for d in np.flatnonzero(w > 0)]
    missing = [tree.levels[d] for d in measured if d not in given]
    idle = [tree.levels[d] for d in given if w[d] <= 0]
    if missing or idle:
        raise GeographyError(f"give a strategy for every measured level and only those: missing {missing}, "
                             f"for unmeasured levels {idle}")
    deepest = max(released)
    gaps = [tree.levels[d] for d in range(deepest + 1) if w[d] <= 0]
    if gaps:
        raise GeographyError(f"per-level strategies are estimated top down from each level's own measurements: "
                             f"measure every level from the root to {tree.levels[deepest]!r} (level weights of "
                             f"{gaps} are 0)")
    persons: list[Plan | None] = [None] * len(tree.levels)
    for d in measured:
        persons[d] = plan(person, given[d], privacy)
    norm = privacy.norm
    raw = _per_level_sensitivity([persons[d].strategy for d in measured], w[measured], norm) * (1.0 + SENSITIVITY_MARGIN)
    rows = sum(persons[d].strategy.shape[0] for d in measured)
    spacing, sensitivity = calibrate_grid(raw, rows, norm, privacy.noise_scale)
    P = _partition_level(tree, TreeSolver(tree, w**2), invariants, partition)
    return GeoPlan(
        tree=tree, levels=tuple(released), level_weights=w, person=persons[measured[-1]], privacy=privacy,
        sensitivity=sensitivity, noise_scale=privacy.noise_scale(sensitivity), partition_level=P,
        invariants=invariants, origin="per-level strategies given; level weights given",
        seconds=time.perf_counter() - start, spacing=spacing, level_persons=tuple(persons),
    )


def _given_weights(tree: GeographyTree, level_weights) -> np.ndarray:
    w = TreeStrategy(tree, level_weights).weights  # checked there: finite, >= 0, one per level
    return w / w.sum()
