r"""Non-negative estimates over the tree, top down: each unit's cells sum to its parent's.

The least-squares estimate of a unit's histogram :math:`\hat x_u` can hold negative counts. The
non-negative estimate is made top down, one parent at a time (:class:`TopDown`), every step a
projection measured through the person strategy :math:`A_p`
(:func:`hdmm.postprocess.metric_projection`):

* the root: the non-negative cells with the root's total (its invariant ``c`` if held, else its
  least-squares total clipped at 0) closest to :math:`\hat x_{\text{root}}` in :math:`\|A_p(\cdot)\|`;
* the children :math:`c_1..c_k` of a unit ``u``: the non-negative cells adding up to
  :math:`x^+_u` in every cell closest to theirs in :math:`\sum_i \|A_p(\cdot)\|^2`. The
  feasible set's Euclidean projection, which the solver calls, is cell by cell onto the scaled
  simplex :math:`\{v \ge 0, \sum_i v_i = x^+_u[j]\}` (:func:`simplex_projection`);
* a family whose strategy measures beyond the workload (:func:`totals_first`: it measures every cell) and
  whose children are dense (``DENSE_CHILDREN``) first fits its children's totals :math:`t`: their
  least-squares totals projected onto the non-negative totals adding up to the parent's. Its cells then
  minimize :math:`\sum_i w_i(\|A_p(v_i - \hat x_i)\|^2 + \lambda(\mathbf 1^Tv_i - t_i)^2)` on the same set,
  :math:`\lambda = \text{TOTALS\_WEIGHT}\,\|A_p\|_2^2/N`, so that clipping one child's noise in a cell
  does not hand people to its siblings (docs/math.md section 8.7);
* a family too large to project at once (more than ``MAX_FAMILY_CELLS`` children x cells, as the
  tracts of a large county) is projected in two stages (:func:`family_groups`): first the sums of
  ``g`` groups of consecutive children, as children of their own, each weighted by one over its
  size (the sum of ``m`` estimates has ``m`` times their noise covariance); then each group's
  children onto its projected sum. Any function of the estimates costs no privacy; the two stages
  cost some accuracy against one joint projection;
* a family whose children's totals are held (invariants, or implied by their own children's
  invariants) also keeps them: the feasible set is the transportation polytope
  :math:`\{V \ge 0, \sum_i V_{ij} = x^+_u[j], \sum_j V_{ij} = t_i\}`, whose projection
  (:func:`transport_projection`) is :math:`\max(\hat V - \alpha_j - \beta_i, 0)`, by alternating
  exact maximization of the dual over :math:`\alpha` (one simplex threshold per cell) and
  :math:`\beta` (one per child), then :func:`balance` scales its rows and columns in turn until the
  totals hold to rounding where the zeros allow it (else to the projection's tolerance), ending on
  the cells, which add up to the parent's exactly.

Measured through :math:`A_p`, the projections keep the well-measured directions (the workload's
sums) nearly where least squares put them; a Euclidean projection of the cells would add every
cell's clipped noise to every large sum. The cells are those :class:`CellSpace` keeps (summed over
attributes the strategy only totals). The answers move by what :attr:`NonNegative.change` reports
(RMSE of the change per level). Integer estimates (``postprocess="integer"``, :meth:`TopDown.start`) round
the held region at once and then every family under its parent's integer cells, projecting the
children onto those integers first (docs/math.md sections 8.8 and 8.9). The walk is depth first: it holds
the projected cells of one family
per level of the path it is on. A family where only some children have invariants is refused
(declare all of them, or none).

>>> V = np.array([[3.0, -1.0], [1.0, 2.0]])      # two children, two cells
>>> simplex_projection(V, np.array([2.0, 1.0])).tolist()
[[2.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..geography import GeographyError
from ..kron_union import FactorMismatchError, kron_union
from ..matrix import Explicit, Kronecker, Matrix, Ones, VStack, Weighted
from ..postprocess import (NONNEGATIVE_MAXITER, largest_gram_eigenvalue, metric_projection,
                           project_nonnegative)
from .activeset import family_gap, family_projection, root_projection
from .plan import GeoPlan
from .rootfit import workload_projection
from .rounding import round_below
from .roundtree import check_integer, held_region, round_held
from .simplex import simplex_projection, thresholds

__all__ = ["simplex_projection", "transport_projection", "balance", "thresholds", "known_totals", "NonNegative",
           "CellSpace", "cell_space", "family_groups", "family_at_once", "TopDown", "held_measurements", "check_nonnegative",
           "nonnegative_estimates", "change_rmse", "integer_totals", "dense_parts", "POSTPROCESS", "DENSE_CELLS",
           "MAX_FAMILY_CELLS", "MAX_HELD_MEASUREMENTS", "DUST",
           "TOPDOWN_TOL", "DENSE_FAMILY", "DENSE_CHILDREN", "TOTALS_WEIGHT", "totals_first"]

#: What a geography release's ``postprocess`` accepts: least squares, non-negative or integer estimates.
POSTPROCESS = (None, "nonnegative", "integer")

#: Largest ``children x cells`` (the cells of :class:`CellSpace`) projected at once: 2**24. A
#: projection holds about ten arrays of that size (1.3 GiB at the limit); larger families are
#: projected in groups (:func:`family_groups`).
MAX_FAMILY_CELLS = 2**24

#: Largest number of strategy answers (every unit's, doubles) held for the top-down pass: 2**30, 8 GiB.
MAX_HELD_MEASUREMENTS = 2**30


#: Relative tolerance of the row totals in :func:`transport_projection` (the column sums are exact).
TRANSPORT_RTOL = 1e-10

#: Rounds without halving the worst row's miss after which :func:`transport_projection` settles for its
#: total tolerance (rounding, not the method, then limits the rows).
STALL_ROUNDS = 20

#: Relative tolerance of :func:`transport_projection`'s check that the rows and columns add up alike.
TOTALS_RTOL = 1e-9


def transport_projection(V: np.ndarray, columns: np.ndarray, rows: np.ndarray, *, rtol: float = TRANSPORT_RTOL,
                         maxiter: int = 10_000, beta: np.ndarray | None = None, dual: bool = False,
                         scale: float | None = None):
    r""":math:`\hat V` projected onto :math:`\{V \ge 0, V^T\mathbf 1 = c, V\mathbf 1 = r\}` (module docstring).

    ``columns`` and ``rows`` must add up to the same total, to ``TOTALS_RTOL`` times ``scale``
    (default: the larger of 1 and the columns' sum); ``rows`` are then scaled to ``columns``' sum.
    In a tree, pass the root's total as ``scale``: a parent's cells meet its own total only to
    rounding at that scale. The rounds stop when every row sum is within ``rtol`` of its target
    (relative to it, or to 1 when smaller), or, when rounding stalls that, once they are within
    ``rtol`` of the columns' sum in all and ``STALL_ROUNDS`` rounds have not improved the worst
    row (:func:`balance` then meets the rows to rounding where the zeros allow). ``beta`` starts
    the children's dual variables (from the projection of a nearby point: a few rounds then
    suffice); with ``dual``, returns ``(X, beta)``.

    >>> V = np.array([[3.0, -1.0], [1.0, 2.0]])
    >>> transport_projection(V, np.array([2.0, 1.0]), np.array([1.5, 1.5])).round(6).tolist()
    [[1.5, 0.0], [0.5, 1.0]]
    """
    V = np.asarray(V, dtype=float)
    c, r = np.asarray(columns, dtype=float), np.asarray(rows, dtype=float)
    total = max(1.0, float(c.sum()))
    scale = total if scale is None else float(scale)
    if abs(float(c.sum()) - float(r.sum())) > TOTALS_RTOL * scale:
        raise ValueError(f"the cells add up to {c.sum():g} but the children's totals to {r.sum():g}")
    r = _rows_to_columns(r, c)
    room = rtol * np.maximum(r, 1.0)
    alpha = thresholds(V if beta is None else V - beta[:, None], c)  # each round starts from the last alpha
    worst, stalled = np.inf, 0
    for _ in range(maxiter):
        beta = thresholds((V - alpha[None, :]).T, r)
        alpha = thresholds(V - beta[:, None], c)
        X = np.maximum(V - alpha[None, :] - beta[:, None], 0.0)
        miss = np.abs(X.sum(axis=1) - r)
        relative = float(np.max(miss / room))
        if relative <= 1.0:
            return (X, beta) if dual else X
        worst, stalled = (relative, 0) if relative < 0.5 * worst else (worst, stalled + 1)
        if stalled >= STALL_ROUNDS and miss.sum() <= rtol * total:
            return (X, beta) if dual else X
    raise ArithmeticError(f"the transportation projection did not converge in {maxiter} rounds")


def _rows_to_columns(rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``rows`` scaled to add up to ``columns``' sum exactly (a parent's cells carry the rounding of its own
    projection), unless they add up to 0."""
    total = float(rows.sum())
    return rows * (float(columns.sum()) / total) if total > 0 else rows


def balance(X: np.ndarray, columns: np.ndarray, rows: np.ndarray, rtol: float = 1e-14,
            maxiter: int = 200) -> np.ndarray:
    r"""A non-negative ``X`` that nearly meets its row and column sums, scaled to meet them to rounding.

    Alternately scales the rows of ``X`` to ``rows`` and its columns to ``columns``
    (iterative proportional fitting), until every row sum is within ``rtol`` of its target
    (relative to it, or to 1 when smaller), ending with the columns (exact to rounding). It
    keeps zeros and non-negativity and, from a point within the transportation projection's
    tolerance, moves entries by about that tolerance: it turns a tolerance relative to the
    family's total into one relative to each row. Rows or columns that are all zero are left, and
    it stops when a pass makes no progress: rows whose sums could only move through zero entries
    keep their miss (within the transportation projection's tolerance). The rows are first scaled to
    add up to the columns' sum, as :func:`transport_projection` scales them.

    >>> balance(np.array([[1.0, 1.0], [1.0, 0.999]]), np.array([2.0, 2.0]), np.array([2.0, 2.0])).sum(axis=1).round(12)
    array([2., 2.])
    """
    X = np.array(X, dtype=float)
    c = np.asarray(columns, dtype=float)
    r = _rows_to_columns(np.asarray(rows, dtype=float), c)
    room = rtol * np.maximum(r, 1.0)
    last = np.inf
    for _ in range(maxiter):
        sums = X.sum(axis=1)
        worst = float(np.max(np.abs(sums - r) / room))
        if worst <= 1.0 or worst >= last:  # met, or no progress (rows that cannot move without a zero)
            break
        last = worst
        X *= np.divide(r, sums, out=np.ones_like(r), where=sums > 0)[:, None]
        sums = X.sum(axis=0)
        X *= np.divide(c, sums, out=np.ones_like(c), where=sums > 0)[None, :]
    return X


@dataclass(frozen=True)
class NonNegative:
    """Non-negative (or integer) answers per released level and the RMSE of their change from least squares;
    for integer answers, per level the largest widening of a family's rows (:class:`TopDown`)."""

    answers: dict[int, np.ndarray]
    totals: dict[int, np.ndarray]
    change: dict[int, float]
    widened: dict[int, int] | None = None


def integer_totals(plan: GeoPlan) -> dict[int, np.ndarray]:
    """The held totals of integer cells, per level (NaN: not held), checked before any noise.

    Refused: what cannot be rounded (:func:`hdmm.georelease.roundtree.check_integer`: totals that are
    not whole or do not add up). Held totals that :func:`check_nonnegative` accepts (families held
    all or none, closed upward) cover whole levels from the root down: the held region, rounded at
    once in the calling process (:mod:`hdmm.georelease.pipeline`).
    """
    tree = plan.tree
    return plan.memo("integer totals", lambda: check_integer(
        tree, {d: v for d, v in known_totals(plan).items() if np.isfinite(v).any()}))  # once per plan (data free)


def known_totals(plan: GeoPlan) -> dict[int, np.ndarray]:
    """Per level, each unit's held total: its invariant, or the sum of its children's when all are held; NaN if none."""
    tree, inv = plan.tree, plan.invariants
    known = {d: np.full(tree.sizes[d], np.nan) for d in range(len(tree.levels))}
    if inv is not None:
        for d, u, v in zip(inv.levels.tolist(), inv.units_at.tolist(), inv.values.tolist()):
            known[d][u] = v
    for d in range(len(tree.levels) - 2, -1, -1):
        implied = np.add.reduceat(known[d + 1], tree.child_bounds(d)[:-1])  # NaN unless every child is held
        known[d] = np.where(np.isnan(known[d]), implied, known[d])
    return known


def held_measurements(plan: GeoPlan, partitioned: bool = False) -> int:
    """How many strategy answers the top-down pass holds at once: every unit's to the finest measured
    level (a release held in memory), or, for a release that keeps each partition's estimates apart
    (Spark, or the local engine writing its output), the most of the driver's (levels down to the
    partition level, and the invariant and held levels below it) and one partition's (its units below that
    level)."""
    tree, finest, P = plan.tree, plan.solver.finest, plan.partition_level
    if not partitioned:
        units = sum(tree.sizes[d] for d in range(finest + 1))
    else:
        widest = 0
        for i in range(plan.partitions):
            part = plan.partition(i)
            widest = max(widest, sum(hi - lo for lo, hi in (part.range(d) for d in range(P, finest + 1))))
        top = P if plan.ranged else P + 1  # the driver's levels: above P, and P itself unless the partitions are ranges
        deeper = set() if plan.invariants is None else {d for d in np.unique(plan.invariants.levels).tolist() if d >= top}
        deeper |= set(range(P + 1, max(held_region(tree, known_totals(plan))) + 1))  # rounded at once, above
        units = max(sum(tree.sizes[d] for d in range(top)) + sum(tree.sizes[d] for d in deeper), widest)
    return units * max(plan.person_plan(d).strategy.shape[0] for d in plan.measured)


def family_groups(children: int, cells: int, most: int | None = None) -> np.ndarray | None:
    """Bounds of the groups a family of ``children`` units of ``cells`` cells is projected in, or ``None``.

    One group (``[0, children]``) when ``children x cells`` is at most ``MAX_FAMILY_CELLS`` (and
    ``children`` at most ``most``, if given); else the fewest groups of consecutive children, of sizes
    differing by at most one, with at most that many children in each group and in the groups' sums
    together; ``None`` when no such groups exist.

    >>> family_groups(5, 2**22).tolist()      # four units' cells fit at once: two groups
    [0, 2, 5]
    """
    most = min(family_at_once(cells, most), children)
    if children <= most:
        return np.array([0, children])
    groups = -(-children // most) if most > 0 else 0
    if most == 0 or groups > most:
        return None
    return np.arange(groups + 1) * children // groups


def family_at_once(cells: int, most: int | None = None) -> int:
    """The most children of ``cells`` cells each that :func:`family_groups` projects in one piece: at most
    ``MAX_FAMILY_CELLS`` children x cells, and at most ``most`` children if given.

    >>> family_at_once(2**22)
    4
    """
    fit = MAX_FAMILY_CELLS // max(cells, 1)
    return min(fit, most) if most else fit


def check_nonnegative(plan: GeoPlan, partitioned: bool = False) -> None:
    """Refuse, before any noise, a plan whose non-negative estimates cannot be made in memory (every unit's
    estimates at once, or, ``partitioned``, the driver's and one partition's: :func:`held_measurements`)."""
    tree = plan.tree
    known = known_totals(plan)
    deepest = max(plan.levels)
    for d in range(deepest):
        below = known[d + 1]
        for u in range(tree.sizes[d]):
            lo, hi = tree.child_bounds(d)[u], tree.child_bounds(d)[u + 1]
            held = np.isfinite(below[lo:hi])
            if held.any() and not held.all():
                raise GeographyError(
                    f"non-negative estimates need the invariants of a family all or none: {int(held.sum())} of the "
                    f"{hi - lo} units below {tree.label(d, u)} have one; declare them for every unit of the family"
                )
    cells = cell_space(plan)[0].strategy.shape[1]
    for d in range(deepest):
        widest = int(np.diff(tree.child_bounds(d)).max())
        if family_groups(widest, cells) is None:
            raise GeographyError(
                f"non-negative estimates project at most {MAX_FAMILY_CELLS:,} children x cells at once, in "
                f"groups of a family when it is larger: {widest:,} children of one {tree.levels[d]} x {cells:,} "
                f"cells need more groups than that allows; release least-squares estimates, or non-negative ones "
                f"down to a coarser level"
            )
    held = held_measurements(plan, partitioned)
    if held > MAX_HELD_MEASUREMENTS:
        where = "the largest partition's (or the driver's)" if partitioned else "every unit's"
        raise GeographyError(
            f"non-negative estimates hold {where} strategy answers ({held:,} numbers, more than "
            f"{MAX_HELD_MEASUREMENTS:,}); " + ("partition at a finer level, " if partitioned else
                                               "write the release to an output directory (output=: each "
                                               "partition's estimates kept on disk), ") +
            "release least-squares estimates, or non-negative ones for fewer levels"
        )


#: Largest strategy factor (columns) checked densely for measuring only the total of its attribute.
MAX_COLLAPSE_CELLS = 4096


class CellSpace:
    r"""The cells the projections work on: the person domain, less the attributes ``A_p`` only totals.

    A Kronecker strategy :math:`A_p = c\bigotimes_i A_i` whose factor :math:`A_r = f\mathbf 1^T`
    measures only the total of attribute ``r`` (SF1's strategy sums over the relationship
    attribute) sees the cells only through their sum over ``r``: :math:`A_p x = \tilde A\tilde x`
    with :math:`\tilde x` the cells summed over ``r`` and :math:`\tilde A` the strategy with
    :math:`A_r` replaced by the column ``f``. The workload, which the strategy supports, also sees
    only :math:`\tilde x`. So the projections run on :math:`\tilde x` (17 times fewer cells for
    SF1), and a non-negative :math:`\tilde x` is spread evenly over the collapsed values
    (:meth:`expand`) to answer the workload. Other strategies keep every cell.
    """

    def __init__(self, plan: GeoPlan, level: int = 0):
        person = plan.person_plan(level)
        A = person.strategy
        self.strategy, self.shape, self.collapsed = A, (A.shape[1],), ()
        self._workload = person.workload
        self.workload: Matrix | None = self._workload  # on the reduced cells (None: spread them first)
        structure = person.structure
        if structure.form != "kronecker" or plan.per_level:  # per level: the cells every level's family shares
            return
        c, factors = structure.union.term(0)
        collapsed = tuple(i for i, f in enumerate(factors) if 1 < f.shape[1] <= MAX_COLLAPSE_CELLS and _totals_only(f))
        if not collapsed:
            return
        columns = [Explicit((f @ np.eye(f.shape[1], 1)).reshape(-1, 1)) if i in collapsed else f
                   for i, f in enumerate(factors)]
        self.strategy = Weighted(Kronecker(columns), c) if c != 1.0 else Kronecker(columns)
        self.shape, self.collapsed = tuple(f.shape[1] for f in factors), collapsed
        self.workload = _spread_workload(person.workload, self.shape, collapsed)

    def answers(self, X: np.ndarray) -> np.ndarray:
        """The person workload's answers (``k x queries``) on the cells :meth:`expand` spreads the rows of
        ``X`` (``k`` units' reduced cells) to."""
        if self.workload is not None:
            return np.asarray(self.workload @ X.T).T
        return np.vstack([self._workload @ self.expand(x) for x in X])

    def reduce(self, X: np.ndarray) -> np.ndarray:
        """Rows of cells (``m x N``) summed over the collapsed attributes (``m x N~``)."""
        if not self.collapsed:
            return X
        m = X.shape[0]
        return X.reshape(m, *self.shape).sum(axis=tuple(i + 1 for i in self.collapsed)).reshape(m, -1)

    def expand(self, x: np.ndarray) -> np.ndarray:
        """Reduced cells spread evenly over the collapsed values (``N~`` to ``N``)."""
        if not self.collapsed:
            return x
        kept = [1 if i in self.collapsed else n for i, n in enumerate(self.shape)]
        spread = np.broadcast_to(x.reshape(kept), self.shape) / np.prod([self.shape[i] for i in self.collapsed])
        return spread.ravel()


def _spread_workload(W: Matrix, shape: tuple[int, ...], collapsed: tuple[int, ...]) -> Matrix | None:
    r""":math:`W` applied after :meth:`CellSpace.expand`: in each Kronecker term the factor ``F`` of a
    collapsed attribute becomes the column :math:`F\mathbf 1/n` (the workload of a strategy that only
    totals an attribute has only totals there); ``None`` when ``W`` is no union of Kronecker products
    over those attributes."""
    try:
        union = kron_union(W).align(list(shape))
    except FactorMismatchError:
        return None
    terms = []
    for j in range(union.num_terms):
        weight, factors = union.term(j)
        factors = [Explicit((np.asarray(f @ np.ones(f.shape[1])) / f.shape[1]).reshape(-1, 1)) if i in collapsed
                   else f for i, f in enumerate(factors)]
        terms.append(Weighted(Kronecker(factors), float(weight)))
    return VStack(terms)


def _level_key(plan: GeoPlan, name: str, level: int):
    """The memo key of a per-level object: one for every level unless the plan has per-level strategies."""
    return (name, level) if plan.per_level else name


def cell_space(plan: GeoPlan, level: int = 0) -> tuple[CellSpace, float]:
    """The :class:`CellSpace` of ``level``'s strategy and :math:`\\|\\tilde A\\|_2^2`, made once per plan
    (data independent; the same for every level unless the plan has per-level strategies)."""
    def make():
        space = CellSpace(plan, level)
        return space, largest_gram_eigenvalue(space.strategy)
    return plan.memo(_level_key(plan, "cell space", level), make)


#: The certified tolerance of the top-down projections with a Frank-Wolfe gap (the root's and the families'
#: without held totals): the fitted strategy answers within 1% of a noise standard deviation (RMS) of the
#: exact projection's. Ten times looser than a single release's ``NONNEGATIVE_TOL``: the gap over-states the
#: distance to the optimum on these ill-conditioned Grams (benchmarks/results/tuning-notes.md), and a
#: hundredth of the noise is far below the error.
TOPDOWN_TOL = 1e-2

#: Children of a family solved at once on the dense path; a larger family (the tracts of a large county)
#: is projected in groups (:func:`family_groups`), so that the exact solve's inverses fit in memory.
DENSE_FAMILY = 256

#: The transportation polytope has no cheap Frank-Wolfe gap, so families with held totals stop on FISTA's
#: step instead, which stalls long before the optimum on an ill-conditioned Gram: they stop at this much
#: smaller step (noise standard deviations, RMS), with up to ``TRANSPORT_MAXITER`` steps.
TRANSPORT_STEP_TOL = 1e-6
TRANSPORT_MAXITER = 20000


def _maxiter(tol: float) -> int:
    return TRANSPORT_MAXITER if tol <= TRANSPORT_STEP_TOL else NONNEGATIVE_MAXITER


#: A parent's cell of at most this fraction of its largest is rounding dust (of an earlier projection): the
#: exact family solve splits it by its Euclidean projection rather than carry it as a cell.
DUST = 1e-9

#: A family fits its children's totals first (:func:`totals_first`) if its parent holds at least this many
#: people per child and cell: children dense enough that non-negativity has little noise to remove, where
#: clipping a child's noise would only move people to its siblings.
DENSE_CHILDREN = 1.0

#: :math:`\lambda = \text{TOTALS\_WEIGHT}\,\|A_p\|_2^2/N`, the weight of a child's total against its fitted
#: total: along the all-ones direction of the ``N`` cells the pull weighs this many times the strategy's
#: best-measured direction.
TOTALS_WEIGHT = 3.0

#: Largest person domain whose projections use a dense Gram and pseudo-inverse of the strategy (formed once
#: per plan): a family's projection then runs on its parent's non-zero cells only.
DENSE_CELLS = 4096


def dense_parts(plan: GeoPlan, level: int = 0) -> tuple[np.ndarray, np.ndarray, float] | None:
    r""":math:`G = \tilde A^T\tilde A`, :math:`A_p^+` (dense) and :math:`\|G\|_2` for a person domain of at most
    :data:`DENSE_CELLS` cells (``None`` otherwise), made once per plan.

    With them a family's projection works on the cells :math:`S` where its parent is non-zero (its
    children are 0 elsewhere): :math:`k\times|S|` unknowns and the Gram's block :math:`G_{SS}`, so the
    work of a sparse unit (a block of a few dozen people) follows its parent's non-zero cells, not the
    domain. A unit's least-squares cells are one matrix product for a whole family.
    """
    def make():
        space, norm = cell_space(plan, level)
        n = space.strategy.shape[1]
        if n > DENSE_CELLS or space.collapsed:
            return None
        G = np.asarray(space.strategy.gram().dense(), dtype=float)
        pinv = np.asarray(plan.level_pinv(level).dense(), dtype=float)
        return G, pinv, norm
    return plan.memo(_level_key(plan, "dense parts", level), make)


def strategy_beyond_workload(plan: GeoPlan, level: int = 0) -> bool:
    r"""Whether the (reduced) strategy measures directions outside the workload's row space (made once per plan).

    If it does not (:math:`\operatorname{rank}[W; \tilde A] = \operatorname{rank}W`, as for PL94's residual
    strategy, which measures exactly the workload's marginals), :math:`\|\tilde A(\cdot)\|` sees only answers
    the workload asks, and the root is projected through the strategy like every family. If it does (SF1's
    p-Identity measures every cell: rank 28,980 against 4,151 queries), the strategy's norm trades the
    workload's answers for directions nobody asked, so the root is fitted through the workload
    (:func:`hdmm.georelease.rootfit.workload_projection`). Decided exactly on domains of at most
    :data:`DENSE_CELLS` cells, by the rank of a Kronecker strategy's factors against the number of queries
    otherwise; when neither decides, the workload's metric (whose error bound holds for any strategy).
    """
    def make():
        space = cell_space(plan, level)[0]
        W, A = space.workload, space.strategy
        if W is None:
            return False
        if A.shape[1] <= DENSE_CELLS:
            Wd, Ad = np.asarray(W.dense(), dtype=float), np.asarray(A.dense(), dtype=float)
            return bool(np.linalg.matrix_rank(np.vstack([Wd, Ad])) > np.linalg.matrix_rank(Wd))
        base = A.base if isinstance(A, Weighted) else A
        if isinstance(base, Kronecker):
            rank = int(np.prod([np.linalg.matrix_rank(np.asarray(f.dense(), dtype=float)) for f in base.factors]))
            return rank > W.shape[0]
        return True
    return plan.memo(_level_key(plan, "strategy beyond workload", level), make)


def totals_first(plan: GeoPlan, level: int) -> bool:
    """Whether the dense families of ``level`` (its units as children) fit their totals first (module
    docstring): where its strategy measures beyond the workload (:func:`strategy_beyond_workload`)."""
    return strategy_beyond_workload(plan, level)


def _totals_only(f: Matrix) -> bool:
    """Whether every row of ``f`` is a multiple of the all-ones row (its Gram a positive multiple of ``J``)."""
    G = np.asarray(f.gram().dense(), dtype=float)
    return bool(G[0, 0] > 0 and np.allclose(G, G[0, 0], rtol=1e-12, atol=0.0))


class TopDown:
    r"""The top-down walk over (part of) the tree, from least-squares estimates in measurement space.

    ``z(d, units)`` gives those units' estimates (``len(units) x rows of A_p``) and ``lam`` the
    invariant multipliers per level (or ``None``). Every projection is measured through the
    strategy (:func:`hdmm.postprocess.metric_projection`): the root's cells are the non-negative
    cells with its total (held, or the least-squares one clipped at 0) closest to the least-squares
    cells in :math:`\|A_p(\cdot)\|`, and a family's children the non-negative cells adding up to
    the parent's (and to their held totals) closest to theirs in :math:`\sum_i\|A_p(\cdot)\|^2`.
    :meth:`descend` projects every family below a unit whose non-negative cells are known, down to
    the deepest released level; :attr:`answers`, :attr:`totals` and :attr:`squared` collect, for
    the units of the released levels it meets, the answers, totals and the squared change of the
    answers from least squares; ``progress`` (if given) gets a line every hundredth of the families,
    or, with ``counted``, only the root's fit, and ``counted(families done, label)`` every family.
    With ``sink``, the answers and totals go instead to ``sink(level, units, answers, totals)`` in
    batches of ``batch`` units of a level (call :meth:`flush` at the end), so that a walk over many
    units does not hold them all. A release walks down to the partition level in the calling process
    (a task per family below the root's) and each partition's subtree in a task
    (:mod:`hdmm.georelease.pipeline`).
    """

    def __init__(self, plan: GeoPlan, z, lam: dict[int, np.ndarray] | None, sink=None, batch: int = 1024,
                 progress=None, integer: bool = False, counted=None):
        self.plan, self.z, self.lam, self.progress, self.counted = plan, z, lam, progress, counted
        self.integer, self.recording, self.rounding = integer, True, integer
        self.widened = {d: 0 for d in range(1, len(plan.tree.levels))}  # integer: the rows' largest widening
        self.families = sum(plan.tree.sizes[d] for d in range(max(plan.levels)))  # units with children to project
        self.projected = 0
        self.sink, self.batch = sink, batch
        self._pending: dict[int, tuple[list, list, list]] = {d: ([], [], []) for d in plan.levels}
        self.space, self.gram_norm = cell_space(plan)
        self.dense = dense_parts(plan)
        self.known = known_totals(plan)
        root = self.known[0][0]  # held whenever any family holds totals (check_nonnegative: all or none)
        self.scale = max(1.0, float(root)) if np.isfinite(root) else None  # of every transport projection
        self.deepest = max(plan.levels)
        self.answers: dict[int, dict[int, np.ndarray]] = {d: {} for d in plan.levels}
        self.totals: dict[int, dict[int, float]] = {d: {} for d in plan.levels}
        self.squared = {d: 0.0 for d in plan.levels}
        if plan.per_level:  # every level's Gram and pseudo-inverse here, once, not in every worker's pool
            for d in range(self.deepest + 1):
                self.view(d)

    def view(self, d: int) -> tuple[CellSpace, float, tuple[np.ndarray, np.ndarray, float] | None]:
        """Level ``d``'s cell space, :math:`\\|\\tilde A\\|_2^2` and dense parts (the same for every level
        unless the plan has per-level strategies)."""
        if not self.plan.per_level:
            return self.space, self.gram_norm, self.dense
        space, norm = cell_space(self.plan, d)
        return space, norm, dense_parts(self.plan, d)

    def cells(self, d: int, units: np.ndarray) -> np.ndarray:
        """The least-squares cells of ``units`` of level ``d`` (with the invariants' correction), reduced."""
        return self.summed_cells(d, self.z(d, units), None if self.lam is None else self.lam[d][units])

    def summed_cells(self, d: int, Z: np.ndarray, lam: np.ndarray | None) -> np.ndarray:
        """The reduced cells of rows ``Z`` of level ``d``'s estimates with multipliers ``lam`` (one per row, or
        ``None``): :meth:`cells` of units, or, being linear, of sums of units (rows and multipliers summed)."""
        pinv = self.plan.level_pinv(d)
        space, _, dense = self.view(d)
        if dense is not None:  # one product for the whole family
            X = np.asarray(Z, dtype=float) @ dense[1].T
            if lam is not None:
                X -= np.outer(lam, self.plan.total_parts[1])
            return X
        out = []
        for i in range(len(Z)):  # one vector at a time: faster than a block, and one full vector in memory
            x = pinv @ Z[i]
            if lam is not None:
                x = x - lam[i] * self.plan.total_parts[1]
            out.append(space.reduce(x[None, :])[0])
        return np.vstack(out)

    def _noise_std(self, d: int) -> float:
        """The noise of a unit's measurement-space estimate at level ``d`` (for unmeasured levels, that of
        the level with the largest weight): the scale of :func:`metric_projection`'s stopping rule."""
        w = self.plan.level_weights
        return float(np.sqrt(self.plan.noise_variance)) / float(w[d] if w[d] > 0 else w.max())

    def project(self, d: int, X: np.ndarray, project, weights: np.ndarray | None = None,
                support: np.ndarray | None = None, gap=None, tol: float = TOPDOWN_TOL,
                totals: np.ndarray | None = None) -> np.ndarray:
        """Rows ``X`` projected through the strategy onto a convex set (its Euclidean projection
        ``project``; ``gap``, its Frank-Wolfe gap, certifies the stop); with ``support`` (dense parts
        only), on those cells, the others 0; with ``totals``, each row's total pulled toward its entry
        (:meth:`total_weight`)."""
        space, gram_norm, dense = self.view(d)
        lam = 0.0 if totals is None else self.total_weight(d)
        if support is None:
            if totals is None:
                return metric_projection(space.strategy, X, project, self._noise_std(d), gram_norm=gram_norm,
                                         weights=weights, gap=gap, tol=tol, maxiter=_maxiter(tol))
            n = space.strategy.shape[1]
            gram = space.strategy.gram()
            target = np.asarray(gram @ X.T) + lam * totals[None, :]
            return metric_projection(space.strategy, X, project, self._noise_std(d), gram_norm=gram_norm + lam * n,
                                     weights=weights, gram=gram + Weighted(Ones(n, n), lam), target=target, gap=gap,
                                     tol=tol, maxiter=_maxiter(tol))
        G = dense[0]
        out = np.zeros_like(X)
        if support.size:
            target = G[support] @ X.T + (0.0 if totals is None else lam * totals[None, :])
            out[:, support] = metric_projection(
                space.strategy, X[:, support], project, self._noise_std(d), gram_norm=gram_norm + lam * support.size,
                weights=weights, gram=Explicit(G[np.ix_(support, support)] + lam), target=target, gap=gap,
                tol=tol, maxiter=_maxiter(tol))
        return out

    def total_weight(self, d: int) -> float:
        """:math:`\\lambda` of level ``d``'s families that fit their totals first: ``TOTALS_WEIGHT`` times
        :math:`\\|A_p\\|_2^2/N` on its (reduced) cells."""
        space, gram_norm, _ = self.view(d)
        return TOTALS_WEIGHT * gram_norm / space.strategy.shape[1]

    def fitted_totals(self, d: int, held: np.ndarray, estimates: np.ndarray, x_plus: np.ndarray,
                      units: int) -> np.ndarray | None:
        """The totals a family of ``units`` units of level ``d`` pulls its children's toward, or ``None``: where
        nothing is ``held``, :func:`totals_first` and the children are dense (the parent ``x_plus`` holds at least
        ``DENSE_CHILDREN`` people per unit and cell), the children's least-squares totals ``estimates``
        projected onto the non-negative totals adding up to the parent's (the simplex projection)."""
        total = float(x_plus.sum())
        if (not np.isnan(held).all() or not totals_first(self.plan, d)
                or total < DENSE_CHILDREN * units * self.view(d)[0].strategy.shape[1]):
            return None
        return simplex_projection(np.asarray(estimates, dtype=float)[:, None], np.array([total]))[:, 0]

    def family(self, d: int, X: np.ndarray, x_plus: np.ndarray, held: np.ndarray,
               weights: np.ndarray | None = None, totals: np.ndarray | None = None) -> np.ndarray:
        """Rows ``X`` (units of level ``d``, or sums of them with ``weights``) projected onto the
        non-negative cells adding up to ``x_plus``, and to the ``held`` totals unless they are NaN; else with
        their totals pulled toward ``totals`` if given (:meth:`fitted_totals`)."""
        support = None if self.view(d)[2] is None else np.flatnonzero(x_plus > 0)  # the children are 0 elsewhere
        cells = x_plus if support is None else x_plus[support]
        if np.isnan(held).all():
            if support is not None and support.size:
                exact = self._active_set(d, X, support, cells, weights, totals)
                if exact is not None:
                    return exact
            return self.project(d, X, lambda V: simplex_projection(V, cells), weights, support,
                                lambda V, grad: family_gap(V, grad, cells), totals=totals)
        dual = [None]  # successive points are close: each projection starts from the last one's dual

        def transport(V: np.ndarray) -> np.ndarray:
            out, dual[0] = transport_projection(V, cells, held, beta=dual[0], dual=True, scale=self.scale)
            return out

        P = self.project(d, X, transport, weights, support, tol=TRANSPORT_STEP_TOL)
        if support is None:
            return balance(P, x_plus, held)
        P[:, support] = balance(P[:, support], cells, held)
        return P

    def _active_set(self, d: int, X: np.ndarray, support: np.ndarray, cells: np.ndarray,
                    weights: np.ndarray | None, totals: np.ndarray | None = None) -> np.ndarray | None:
        """:meth:`family` without held totals on the parent's non-zero cells ``support``, solved exactly by
        :func:`hdmm.georelease.activeset.family_projection` (``None`` where it does not apply or settle),
        to the same certified tolerance as the gradient method. Cells the parent holds only rounding
        dust of (at most ``DUST`` of its largest) are split by their Euclidean projection instead."""
        space, gram_norm, dense = self.view(d)
        G = dense[0]
        dust = cells <= DUST * max(1.0, float(cells.max()))
        main = support[~dust]
        bound = 0.5 * (TOPDOWN_TOL * self._noise_std(d)) ** 2 * space.strategy.shape[0] * X.shape[0]
        lam = 0.0 if totals is None else self.total_weight(d)  # each child's total pulled toward its own
        V = family_projection(G[np.ix_(main, main)] + lam, X @ G[:, main] + lam * (0.0 if totals is None else
                              totals[:, None]), cells[~dust], X[:, main], bound, weights, gram_norm + lam * main.size)
        if V is None:
            return None
        out = np.zeros_like(X)
        out[:, main] = simplex_projection(V, cells[~dust])  # the sums to rounding, as the gradient method's
        out[:, support[dust]] = simplex_projection(X[:, support[dust]], cells[dust])
        return out

    def record(self, d: int, units: np.ndarray, X_plus: np.ndarray, X_ls: np.ndarray) -> None:
        """Keep (or hand to ``sink``) the answers of ``units`` of level ``d`` from their non-negative cells
        (rows of ``X_plus``), and add their squared change from least squares (``X_ls``)."""
        if d not in self.squared or not self.recording:
            return
        space = self.view(d)[0]
        A = space.answers(X_plus)
        if self.integer:  # sums of integer cells: whole up to rounding (0/1 workloads)
            whole = np.rint(A)
            A = np.where(np.abs(A - whole) <= 1e-6 * np.maximum(1.0, np.abs(whole)), whole, A)
        self.squared[d] += float(np.sum((A - space.answers(X_ls)) ** 2))
        for unit, a, x in zip(units.tolist(), A, X_plus):
            if self.sink is None:
                self.answers[d][unit] = a
                self.totals[d][unit] = float(x.sum())
                continue
            pending_units, rows, totals = self._pending[d]
            pending_units.append(unit)
            rows.append(a)
            totals.append(float(x.sum()))
            if len(pending_units) >= self.batch:
                self.flush(d)

    def flush(self, level: int | None = None) -> None:
        """Hand the answers and totals waiting for ``sink`` (of ``level``, or of every level) over to it."""
        for d in self._pending if level is None else (level,):
            units, rows, totals = self._pending[d]
            if units:
                self._pending[d] = ([], [], [])
                self.sink(d, np.asarray(units), np.vstack(rows), np.asarray(totals))

    def root(self) -> np.ndarray:
        """The root's non-negative cells (recorded), with its held total if any: fitted through the workload
        (:func:`hdmm.georelease.rootfit.workload_projection`) if :func:`strategy_beyond_workload`, else
        through the strategy with its held total or its least-squares one (at least 0)."""
        root_ls = self.cells(0, np.array([0]))
        held = self.known[0][0]
        if strategy_beyond_workload(self.plan):
            W = self.space.workload
            if self.progress is not None:
                self.progress("  non-negative: fitting the root's cells through the workload")
            workload_norm = self.plan.memo("workload norm", lambda: largest_gram_eigenvalue(W))
            sigma = TOPDOWN_TOL * self._noise_std(0)  # the certified tolerance, as the families'
            root = workload_projection(W, self.space.strategy, root_ls[0], None if np.isnan(held) else float(held),
                                       workload_norm=workload_norm, strategy_norm=self.gram_norm, negligible=sigma,
                                       slack=0.5 * sigma**2 * W.shape[0])[None, :]
            self.record(0, np.array([0]), root, root_ls)
            return root[0]
        total = max(float(root_ls.sum()), 0.0) if np.isnan(held) else float(held)
        def gap(V: np.ndarray, grad: np.ndarray) -> float:  # the best vertex: the whole total in one cell
            return float(grad[0] @ V[0] - total * grad[0].min())
        root = None
        if self.dense is not None:  # exactly, by the active set, to the gradient method's certified tolerance
            bound = 0.5 * (TOPDOWN_TOL * self._noise_std(0)) ** 2 * self.space.strategy.shape[0]
            exact = root_projection(self.dense[0], root_ls[0], total, bound, self.gram_norm)
            root = None if exact is None else exact[None, :]
        if root is None:
            root = self.project(0, root_ls, lambda V: project_nonnegative(V[0], total)[None, :], gap=gap)
        self.record(0, np.array([0]), root, root_ls)
        return root[0]

    def start(self, stop: int | None = None, reached: dict[int, np.ndarray] | None = None) -> None:
        """The walk from the root down to level ``stop`` (see :meth:`descend`), non-negative or integer.

        Integer cells (``integer=True``; docs/math.md section 8.8): the held region (the levels
        whose totals are held, with the root; the root alone if none) is projected as non-negative
        real cells first, without recording, then rounded at once
        (:func:`hdmm.georelease.roundtree.round_held`); below it each family is projected onto its
        parent's *integer* cells and rounded (:func:`hdmm.georelease.rounding.round_below`).
        """
        if not self.integer:
            self.descend(0, 0, self.root(), stop, reached)
            return
        tree = self.plan.tree
        closed = integer_totals(self.plan)
        h = max(held_region(tree, closed))
        self.recording = self.rounding = False  # the held region's real cells first
        top = {0: self.root()[None, :]}
        if h > 0:
            deep: dict[int, np.ndarray] = {}
            self.descend(0, 0, top[0][0], h, deep)
            top[h] = np.vstack([deep[u] for u in range(tree.sizes[h])])
            for d in range(h - 1, 0, -1):
                top[d] = np.add.reduceat(top[d + 1], tree.child_bounds(d)[:-1], axis=0)
        self.recording = self.rounding = True
        rounded = round_held(tree, top, {d: closed[d] for d in range(h + 1)})
        for d in range(h + 1):
            units = np.arange(tree.sizes[d])
            self.record(d, units, rounded[d], self.cells(d, units))
        for u in range(tree.sizes[h]):
            self.descend(h, u, rounded[h][u].astype(float), stop, reached)

    def _round(self, d: int, X: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """Children's real cells ``X`` (level ``d``) rounded under their parent's integer cells."""
        R, w = next(round_below([(X, np.rint(parent).astype(np.int64))]))
        self.widened[d] = max(self.widened[d], int(w))
        return R.astype(float)

    def _count(self, d: int, unit: int) -> None:
        """Count the family below ``unit`` of level ``d`` as projected: to ``counted(projected, label)`` if given,
        else as a line to ``progress`` every hundredth."""
        self.projected += 1
        if self.counted is not None:
            self.counted(self.projected, self.plan.tree.label(d, unit))
        elif self.progress is not None and (self.projected % max(1, self.families // 100) == 0
                                          or self.projected == self.families):
            self.progress(f"  non-negative: projected the units below {self.plan.tree.label(d, unit)} "
                          f"({self.projected}/{self.families})")

    def descend(self, d: int, unit: int, x_plus: np.ndarray, stop: int | None = None,
                reached: dict[int, np.ndarray] | None = None) -> None:
        """Project the families below ``unit`` of level ``d`` down to level ``stop`` (default: the
        deepest released); ``reached`` (if given) receives the cells of the units of level ``stop``."""
        stop = self.deepest if stop is None else stop
        if d >= stop:
            if reached is not None:
                reached[unit] = x_plus
            return
        tree = self.plan.tree
        lo, hi = tree.child_bounds(d)[unit], tree.child_bounds(d)[unit + 1]
        space, _, dense = self.view(d + 1)
        bounds = family_groups(hi - lo, space.strategy.shape[1], None if dense is None else DENSE_FAMILY)
        parts = self.group_parts(d, unit, x_plus, bounds) if len(bounds) > 2 else x_plus[None, :]
        for a, b, part in zip(bounds, bounds[1:], parts):
            self.descend_group(d, unit, int(a), int(b), part, stop, reached)

    def group_parts(self, d: int, unit: int, x_plus: np.ndarray, bounds: np.ndarray,
                    sums: np.ndarray | None = None) -> np.ndarray:
        """The first stage of a family projected in groups (module docstring): the cells of the groups of ``unit``'s
        children (``bounds``, counted from its first child) projected onto its cells ``x_plus``, each group weighted
        by one over its size. ``sums`` are the groups' sums of their children's least-squares cells, if known (a
        partition's, summed where its children are); else they are made here."""
        lo, hi = self.plan.tree.child_bounds(d)[unit], self.plan.tree.child_bounds(d)[unit + 1]
        children = np.arange(lo, hi)
        held = self.known[d + 1][lo:hi]
        if sums is None:
            sums = np.vstack([self.cells(d + 1, children[a:b]).sum(axis=0) for a, b in zip(bounds, bounds[1:])])
        group_held = np.add.reduceat(held, bounds[:-1])
        parts = self.family(d + 1, sums, x_plus, group_held, 1.0 / np.diff(bounds),
                            self.fitted_totals(d + 1, group_held, sums.sum(axis=1), x_plus, hi - lo))
        if self.rounding:
            parts = self._round(d + 1, parts, x_plus)
        return parts

    def descend_group(self, d: int, unit: int, a: int, b: int, part: np.ndarray, stop: int | None = None,
                      reached: dict[int, np.ndarray] | None = None) -> None:
        """The second stage: ``unit``'s children ``a..b-1`` (counted from its first child) projected onto their
        group's cells ``part`` (the parent's, for one group), then :meth:`descend` below each of them."""
        stop = self.deepest if stop is None else stop
        lo = int(self.plan.tree.child_bounds(d)[unit])
        children = np.arange(lo + a, lo + b)
        held = self.known[d + 1][lo + a:lo + b]
        X = self.cells(d + 1, children)
        P = part[None, :] if b - a == 1 else self.family(  # one child: the sum
            d + 1, X, part, held, totals=self.fitted_totals(d + 1, held, X.sum(axis=1), part, b - a))
        if self.rounding and b - a > 1:
            P = self._round(d + 1, P, part)
        self.record(d + 1, children, P, X)
        del X
        if a == 0:
            self._count(d, unit)
        for i, c in enumerate(children.tolist()):
            self.descend(d + 1, c, P[i], stop, reached)


def nonnegative_estimates(plan: GeoPlan, z: dict[int, np.ndarray], lam: dict[int, np.ndarray] | None,
                          progress=None, integer: bool = False) -> NonNegative:
    """Top-down non-negative (or ``integer``) answers from the least-squares estimates ``z`` in measurement space,
    in this process (a release runs the same walk in tasks: :mod:`hdmm.georelease.pipeline`).

    ``z[d]`` holds every unit of level ``d`` (``units x rows of A_p``) and ``lam`` the invariant
    multipliers (:mod:`hdmm.georelease.invariants`) or ``None``. The plan must have passed
    :func:`check_nonnegative` (and :func:`integer_totals`).
    """
    walk = TopDown(plan, lambda d, units: z[d][units], lam, progress=progress, integer=integer)
    walk.start()
    tree = plan.tree
    answers = {d: np.vstack([walk.answers[d][u] for u in range(tree.sizes[d])]) for d in plan.levels}
    totals = {d: np.array([walk.totals[d][u] for u in range(tree.sizes[d])]) for d in plan.levels}
    widened = {d: walk.widened[d] for d in plan.levels if d > 0} if integer else None
    return NonNegative(answers, totals, change_rmse(plan, walk.squared), widened)


def change_rmse(plan: GeoPlan, squared: dict[int, float]) -> dict[int, float]:
    """Per released level, the RMSE of the answers' change from the summed squared changes."""
    return {d: float(np.sqrt(squared[d] / (plan.tree.sizes[d] * plan.queries))) for d in plan.levels}
