r"""The max-variance objective over residual measurements with a basis per attribute (docs/math.md, section 4.11).

For a union of Kronecker products whose factors on each attribute are one query matrix or
totals (the domain of :mod:`.residual_bases`), fix the per-attribute zero-sum bases :math:`B_i`
(Grams :math:`X_i`, largest diagonal entries :math:`m_i`) and choose only the noise allocation
:math:`\kappa_T` across the subsets. With :math:`x_T = 1/\kappa_T`, a query
:math:`c\bigotimes_i f_i` has unit-noise variance :math:`\sum_T x_T a_T` with

.. math:: a_T = c^2 \prod_{i \in T} e_i \prod_{i \notin T} p_i, \qquad e_i = f_iX_i^+f_i^T, \quad
          p_i = (f_i\cdot 1)^2/n_i,

and :math:`\Delta_2^2 = \sum_T s_T/x_T`, :math:`s_T = \prod_{i \in T} m_i \prod_{i \notin T} 1/n_i`.
Minimising the largest variance at sensitivity 1 is the program of :mod:`.max_variance` with one
row per query and ``t`` replaced by ``s``: :func:`~.max_variance.solve_allocation` solves it with
a certified duality gap.

Each :math:`a_T` is non-decreasing in every :math:`e_i` and :math:`p_i`, so a query whose pairs
:math:`(e_i, p_i)` are all at or below another query's of the same term never has the larger
variance: only the Pareto frontier of each factor's pairs is kept, and a term's rows are the
products of its factors' frontiers. A dual point on those rows is one on all the queries (zero
elsewhere) and the largest variance over them is the largest over all queries, so the gap is
certified for every query of the workload, *over the allocation with the bases fixed*. The bases
are the total-error optimal ones of :mod:`.residual_bases`; nothing is claimed about other bases.
:func:`max_variance_bases` then recomputes the largest variance over every query from the factors
(:func:`hdmm.residual_bases.residual_query_variances`) as a check.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..kron_union import KronUnion, kron_union
from ..marginals import factor_traces, workload_domain
from ..matrix import Matrix
from ..residual_bases import ResidualBases, residual_form, residual_query_variances
from ..validation import ZERO_RTOL
from .max_variance import GAP_RTOL, MAX_ITERATIONS, solve_allocation
from .residual_bases import attribute_basis, residual_bases_applies, residual_bases_strategy

__all__ = ["MaxVarianceBasesSolution", "AllocationProblem", "max_variance_bases", "factor_pairs", "pareto_front",
           "MAX_ENTRIES", "CHECK_MAX_QUERIES"]

#: Largest number of non-zero entries of the rows-by-subsets matrix (frontier rows times their subsets).
MAX_ENTRIES = 20_000_000

#: The largest variance over every query is recomputed from the factors up to this many queries.
CHECK_MAX_QUERIES = 10_000_000

#: Weight of the query Gram mixed into the dual-weighted one (every query stays in the basis' range).
IMPROVE_MIX = 100.0

#: A round of basis improvement is kept only when it lowers the largest variance by this much, relatively.
IMPROVE_RTOL = 1e-6

#: Relative tolerance of the support check (the part of a row outside the basis' range).
SUPPORT_RTOL = 1e-8


def _pinv_projector(B: Matrix) -> tuple[np.ndarray, np.ndarray, float]:
    """``(X^+, X X^+, max diag X)`` for the Gram ``X`` of basis ``B``."""
    X = B.gram().dense()
    w, U = np.linalg.eigh((X + X.T) / 2)
    keep = w > ZERO_RTOL * max(w[-1], 0.0)
    Uk = U[:, keep]
    return (Uk / w[keep]) @ Uk.T, Uk @ Uk.T, float(np.max(np.diag(X)))


def factor_pairs(f: Matrix, pinv: np.ndarray | None, projector: np.ndarray | None, i: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    r"""Per row of factor ``f``: :math:`(e, p) = (f_rX^+f_r^T, (f_r\cdot 1)^2/n)`.

    Rows proportional to :math:`1^T` get ``e = 0`` exactly; a factor of such rows only needs no
    ``pinv`` (``None``: nothing dense is formed). Raises ``ValueError`` when a row's zero-sum part
    leaves the basis' range (the strategy would not answer it)."""
    n = f.shape[1]
    image = f @ np.ones(n)
    p = image**2 / n
    if _is_total(f):
        return np.zeros_like(p), p
    if pinv is None:
        raise ValueError(f"attribute {i}: a query factor needs the basis' pseudo-inverse")
    norms = f.quadratic_diag(np.eye(n))
    q = np.where(norms - p <= ZERO_RTOL * norms, 0.0, norms - p)
    leak = q - f.quadratic_diag(projector)
    if np.any(leak > SUPPORT_RTOL * np.maximum(norms, 1e-300)):
        raise ValueError(f"attribute {i}: some query rows are outside the span of the residual basis; "
                         "the residual family with these bases cannot answer them")
    e = np.where(q > 0, np.maximum(f.quadratic_diag(pinv), 0.0), 0.0)
    return e, p


def _is_total(f: Matrix) -> bool:
    """Whether every row of ``f`` is a multiple of the ones vector (its Gram has no zero-sum part)."""
    return factor_traces(f)[1] == 0


def pareto_indices(e: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Indices of the pairs not dominated by another pair (at least as large in both, larger in one);
    of equal pairs the first in sort order only."""
    order = np.lexsort((-p, -e))  # e descending, then p descending
    sorted_p = p[order]
    before = np.maximum.accumulate(np.concatenate([[-np.inf], sorted_p[:-1]]))
    return order[sorted_p > before]


def pareto_front(e: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs not dominated by another pair (at least as large in both, larger in one); duplicates once."""
    keep = pareto_indices(e, p)
    return e[keep], p[keep]


@dataclass
class AllocationProblem:
    r"""Rows (frontier queries) by subsets: ``A[r, T] = a_T`` of row ``r`` (module docstring), and ``s_T``.

    Attributes
    ----------
    A : scipy.sparse.csr_array
    s : numpy.ndarray
    members : numpy.ndarray
        Boolean ``(subsets, d)``: the subsets ``T``.
    row_terms : numpy.ndarray
        The workload term of each row.
    blocks : list
        Per term with rows: ``(term, query attributes, first row, frontier sizes)``; rows run over
        the product of the frontiers in Kronecker order.
    fronts : list
        Per attribute and factor: ``(e, p, indices)``, every row's pair and the frontier's rows.
    """

    A: sp.csr_array
    s: np.ndarray
    members: np.ndarray
    row_terms: np.ndarray
    blocks: list
    fronts: list

    def objective(self, x: np.ndarray) -> float:
        """The largest unit-noise variance at L2 sensitivity 1 for ``kappa = 1/x``."""
        return float((self.A @ x).max() * np.sum(self.s / x))

    def dual(self, y: np.ndarray) -> float:
        """``h(y)^2``: a lower bound on :meth:`objective` for any ``y >= 0`` summing to 1."""
        return float(np.sum(np.sqrt(self.s * (self.A.T @ y))) ** 2)


def allocation_problem(union: KronUnion, bases: list[Matrix]) -> AllocationProblem:
    """The program's matrix for the union's queries under fixed bases (one zero-sum basis per attribute)."""
    d = union.dim
    # the basis' pseudo-inverse only where a factor has zero-sum parts (an attribute of totals may be huge)
    aux = [_pinv_projector(B) if not all(_is_total(f) for f in fs) else (None, None, 1.0)
           for B, fs in zip(bases, union.factors)]
    m = np.array([a[2] for a in aux])
    sizes = np.array(union.sizes, dtype=float)
    pairs = [[factor_pairs(f, aux[i][0], aux[i][1], i) for f in fs] for i, fs in enumerate(union.factors)]
    fronts_all = [[(e, p, pareto_indices(e, p)) for e, p in fs] for fs in pairs]
    fronts = [[(e[k], p[k]) for e, p, k in fs] for fs in fronts_all]
    blocks = []
    columns: dict[tuple[int, ...], int] = {}
    data, rows, cols, row_terms = [], [], [], []
    offset, entries = 0, 0
    for j in range(union.num_terms):
        c2 = float(union.weights[j]) ** 2
        if c2 == 0:
            continue
        parts = [fronts[i][k] for i, k in enumerate(union.index[j])]
        if any(e.size == 0 for e, _ in parts):  # a factor without rows: the term has no queries
            continue
        inside = [i for i, (e, _) in enumerate(parts) if np.any(e > 0)]
        count = int(np.prod([parts[i][0].size for i in inside], dtype=np.int64))
        entries += count * 2 ** len(inside)
        if entries > MAX_ENTRIES:
            raise ValueError(f"the max-variance program over these bases would have more than {MAX_ENTRIES:,} entries "
                             f"(term {j} alone has {count:,} frontier rows over {2 ** len(inside)} subsets); "
                             "split the workload, or optimize the total error (objective='total')")
        constant = c2 * float(np.prod([parts[i][1].max() for i in range(d) if i not in inside]))
        for size in range(len(inside) + 1):
            for T in itertools.combinations(inside, size):
                vec = np.full(1, constant)
                for i in inside:
                    vec = np.multiply.outer(vec, parts[i][0] if i in T else parts[i][1]).ravel()
                nz = np.flatnonzero(vec > 0)
                if nz.size == 0:
                    continue
                col = columns.setdefault(T, len(columns))
                data.append(vec[nz])
                rows.append(offset + nz)
                cols.append(np.full(nz.size, col))
        row_terms.append(np.full(count, j))
        blocks.append((j, inside, offset, [parts[i][0].size for i in inside]))
        offset += count
    if not columns:
        raise ValueError("every query of the workload is zero: there is no variance to minimise")
    A = sp.csr_array((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))), shape=(offset, len(columns)))
    members = np.zeros((len(columns), d), dtype=bool)
    for T, col in columns.items():
        members[col, list(T)] = True
    s = np.prod(np.where(members, m, 1.0 / sizes), axis=1)
    # rows of zero variance under every allocation stay (the blocks index them); they never bind
    return AllocationProblem(A, s, members, np.concatenate(row_terms), blocks, fronts_all)


@dataclass(frozen=True)
class MaxVarianceBasesSolution:
    """The allocation minimising the largest variance for fixed per-attribute bases, with its certificate.

    Attributes
    ----------
    strategy : ResidualBases
        L2 sensitivity 1.
    value : float
        Its largest per-query variance at unit noise variance (over the frontier rows; equal to
        the largest over all queries).
    dual_bound : float
        A lower bound on the largest variance of *every allocation over these bases*.
    checked : float
        The largest variance over every query recomputed from the factors (``nan`` beyond
        ``CHECK_MAX_QUERIES`` queries).
    rows : int
        Frontier rows in the program (against the workload's queries).
    classes : tuple of int
        Row and subset classes of the reduced program.
    iterations : int
    total_value : float
        The largest variance of the total-error optimal allocation over the starting bases (``nan``
        when the bases were given).
    improved : int
        Rounds of basis improvement kept (the certificate is for the final bases).
    """

    strategy: ResidualBases
    value: float
    dual_bound: float
    checked: float
    rows: int
    classes: tuple[int, int]
    iterations: int
    total_value: float = np.nan
    improved: int = 0

    @property
    def gap(self) -> float:
        """The relative duality gap, ``1 - dual_bound / value``."""
        return 1.0 - self.dual_bound / self.value

    certificate = ("optimal over the noise allocation of the residual family with the per-attribute bases fixed "
                   "(the total-error optimal bases); not over other bases or other strategies")


def max_variance_bases(W: Matrix, union: KronUnion | None = None, tol: float = GAP_RTOL,
                       max_iterations: int = MAX_ITERATIONS, *, bases: list | None = None,
                       check: bool = True, improve: int = 0) -> MaxVarianceBasesSolution:
    """The residual strategy with per-attribute bases minimising the largest per-query variance (Gaussian noise).

    ``bases`` (one hdmm matrix per attribute, rows summing to zero) defaults to the total-error
    optimal bases of :func:`~.residual_bases.residual_bases_strategy`. ``check`` recomputes the
    largest variance over every query from the factors. ``improve`` rounds of basis improvement
    (:func:`_dual_weighted_bases`, kept while they lower the largest variance; the result is then
    certified for its own bases). Raises ``ValueError`` outside the family's
    domain (an attribute with several query matrices).

    Examples
    --------
    >>> import hdmm
    >>> W = hdmm.union([hdmm.product(hdmm.Domain(["a", "b"], [6, 5]), {"a": hdmm.Prefix(6)}),
    ...                 hdmm.product(hdmm.Domain(["a", "b"], [6, 5]), {"b": hdmm.Identity(5)})])
    >>> solution = max_variance_bases(W)
    >>> bool(solution.gap < 1e-8), round(solution.strategy.sensitivity(2), 12)
    (True, 1.0)
    """
    union = kron_union(W) if union is None else union
    total = None
    if bases is None:
        if not residual_bases_applies(union):
            raise ValueError("the max-variance program over residual bases needs one query matrix (or totals) per "
                             "attribute; this workload has several on some attribute")
        total = residual_bases_strategy(W, union)[0]
        bases = total.bases
    else:
        bases = ResidualBases.from_members(union.sizes, np.zeros((1, union.dim), dtype=bool), np.ones(1), bases).bases
    problem = allocation_problem(union, list(bases))
    x, y, value, bound, classes, iterations = _solve(problem, tol, max_iterations)
    total_value = np.nan
    if total is not None:  # the total-error allocation on the program's subsets (zero weight: infinite variance)
        kappas = {tuple(row): w**2 for row, w in zip(total.members, total.weights)}
        k_total = np.array([kappas.get(tuple(row), 0.0) for row in problem.members])
        k_total /= float(k_total @ problem.s)
        total_value = problem.objective(1.0 / k_total) if np.all(k_total > 0) else np.inf
    rounds = 0
    for _ in range(improve):
        try:
            trial_bases = _dual_weighted_bases(union, problem, x, y, bases)
            trial = allocation_problem(union, trial_bases)
        except ValueError:  # a basis no longer spans some query: keep the last bases
            break
        tx, ty, tvalue, tbound, tclasses, titer = _solve(trial, tol, max_iterations)
        if tvalue >= value * (1.0 - IMPROVE_RTOL):
            break
        problem, bases, x, y, value, bound, classes, iterations = (trial, trial_bases, tx, ty, tvalue, tbound, tclasses,
                                                                   iterations + titer)
        rounds += 1
    kappa = 1.0 / x
    kappa /= float(kappa @ problem.s)  # L2 sensitivity 1
    strategy = ResidualBases.from_members(workload_domain(W, union.sizes), problem.members, np.sqrt(kappa), bases)
    checked = np.nan
    if check and W.shape[0] <= CHECK_MAX_QUERIES:
        checked = float(residual_query_variances(union, residual_form(kron_union(strategy))).max())
    rows = int(np.count_nonzero(np.diff(problem.A.indptr)))
    return MaxVarianceBasesSolution(strategy, value, min(bound, value), checked, rows, classes, iterations,
                                    total_value, rounds)


def _solve(problem: AllocationProblem, tol: float, max_iterations: int):
    """``(x, y, value, bound, classes, iterations)`` of the program, ``y`` over all the problem's rows."""
    live = np.flatnonzero(np.diff(problem.A.indptr) > 0)  # rows of zero variance never bind
    x, y_live, classes, iterations = solve_allocation(problem.A[live], problem.s, tol, max_iterations)
    y = np.zeros(problem.A.shape[0])
    y[live] = y_live
    return x, y, problem.objective(x), problem.dual(y), classes, iterations


def _dual_weighted_bases(union: KronUnion, problem: AllocationProblem, x: np.ndarray, y: np.ndarray,
                         bases: list) -> list:
    r"""New bases from the dual weights (a heuristic; each result is certified on its own).

    Row ``r``'s variance is linear in the :math:`e_i` of its attribute-``i`` factor row ``k``, with
    coefficient :math:`g_r = \sum_{T \ni i} x_Ta_{rT}/e_{ik}`; the dual weights make
    :math:`\sum_r y_rg_r\,f_kX_i^+f_k^T = \mathrm{tr}(X_i^+G_i(y))` with
    :math:`G_i(y) = \sum_k w_kf_k^Tf_k`, and each attribute takes the basis minimising
    :math:`\mathrm{tr}(X^+G)\max_jX_{jj}` (section 4.9) for :math:`G` a mix of :math:`G_i(y)` and its
    query Gram (``IMPROVE_MIX``: every query stays in range). Rows whose pairs equal a frontier
    row's share its weight."""
    out = list(bases)
    for i, fs in enumerate(union.factors):
        grams, plain = [], []
        through = problem.A @ (x * problem.members[:, i])  # sum_{T containing i} x_T a_rT, per row
        weights = [np.zeros(f.shape[0]) for f in fs]
        for j, inside, offset, shape in problem.blocks:
            if i not in inside:
                continue
            k = union.index[j, i]
            e, _, front = problem.fronts[i][k]
            count = int(np.prod(shape))
            position = np.unravel_index(np.arange(count), shape)[inside.index(i)]
            rows = front[position]
            share = y[offset:offset + count] * through[offset:offset + count]
            np.add.at(weights[k], rows, np.where(e[rows] > 0, share / np.where(e[rows] > 0, e[rows], 1.0), 0.0))
        for k, f in enumerate(fs):
            if not weights[k].any():
                continue
            e, p, front = problem.fronts[i][k]
            w = weights[k]
            for r in front:  # equal pairs share the frontier row's weight
                same = np.flatnonzero((e == e[r]) & (p == p[r]))
                w[same] = w[r] / same.size
            F = f.dense()
            grams.append((F.T * w) @ F)
            plain.append(F.T @ F)
        if not grams:
            continue
        G, G0 = sum(grams), sum(plain)
        G = G / np.trace(G) + IMPROVE_MIX * G0 / np.trace(G0)
        out[i] = attribute_basis(G).basis
    return ResidualBases.from_members(union.sizes, np.zeros((1, union.dim), dtype=bool), np.ones(1), out).bases
