r"""The max-variance objective: residual noise levels minimizing the largest per-query variance (docs/math.md, section 4.11).

Under Gaussian noise a residual strategy (docs/math.md, section 3.6) with normalised eigenvalues
:math:`\lambda_T` has :math:`\Delta_2^2 = \sum_T \lambda_T t_T` (:math:`t_T = \mathrm{tr}(E_T)`), and
a query :math:`w = c \bigotimes_i w_i` has unit-noise variance
:math:`c^2 \sum_T (w^T E_T w / N) / \lambda_T`. When every query of a Kronecker term has the same
projections (marginals, identities, totals: the rows of each factor have equal sums and equal
norms), the variance is one number per term, :math:`V_j = (A x)_j` with :math:`x_T = 1/\lambda_T`
and :math:`A_{jT}` the term's share of :math:`\tau_T` per query. The objective, scale-free, is

.. math:: F(x) = \max_j (A x)_j \cdot \sum_T t_T / x_T, \qquad x > 0,

convex after :math:`x = e^z`. For any :math:`y` on the simplex over terms, with :math:`b = A^T y`,
:math:`\max_j (Ax)_j \ge b^Tx` and Cauchy-Schwarz give the dual bound

.. math:: F(x) \ge (b^T x)\Big(\sum_T t_T/x_T\Big) \ge h(y)^2, \qquad h(y) = \sum_T \sqrt{t_T b_T},

with equality at :math:`x_T \propto \sqrt{t_T/b_T}` when :math:`y` sits on the terms of largest
variance. :math:`h` is concave; its gradient is :math:`(A x(y))_j / 2`, and the multiplicative
update :math:`y_j \leftarrow y_j (A x(y))_j / h(y)` (which keeps :math:`y` on the simplex, as
:math:`\sum_j y_j (Ax(y))_j = h(y)`) climbs it. Every iterate gives a primal strategy and a dual
bound, so the result carries a certified gap.

**Symmetry.** The problem is first reduced by colour refinement: terms and subsets are split into
classes such that every term of a class has the same sums of :math:`A` over each subset class and
every subset of a class the same sums over each term class (an equitable partition; :math:`t_T` is
constant on subset classes). Averaging any solution over the classes keeps it feasible and does
not raise the objective (the max of averages is at most the max, and :math:`1/x` is convex), so
the optimum has class-constant :math:`x` and the reduced problem (one variable per class) has the
same value. All <= 3-way marginals of 100 attributes of 10 values reduce to 4 x 4 classes. The
gap is then certified on the full problem.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from ..kron_union import KronUnion, kron_union
from ..marginals import Residuals, trace_spectrum, workload_domain
from ..matrix import Matrix
from ..traces import row_projections

__all__ = ["MaxVarianceProblem", "MaxVarianceSolution", "max_variance_residual"]

#: Relative duality gap at which the multiplicative iteration stops.
GAP_RTOL = 1e-9

#: Iterations of the multiplicative update at most.
MAX_ITERATIONS = 20_000


def _row_projections(f: Matrix) -> tuple[np.ndarray, np.ndarray]:
    """Per row of a one-attribute factor ``f``: ``((f_r . 1)^2 / n^2, (|f_r|^2 - (f_r . 1)^2 / n) / n)``."""
    p, q = row_projections(f)
    return p / f.shape[1], q / f.shape[1]


class MaxVarianceProblem:
    """The per-term variance matrix ``A`` (terms x subsets) and ``t_T`` for a workload.

    Raises ``ValueError`` when some Kronecker term's queries do not all have the same variance
    under every residual strategy (a factor whose rows differ in sum or norm, e.g. prefixes).
    """

    def __init__(self, union: KronUnion):
        for i, fs in enumerate(union.factors):
            for f in fs:
                p, q = _row_projections(f)
                if np.ptp(p) > 1e-12 * max(p.max(), 1e-300) or np.ptp(q) > 1e-12 * max(q.max(), 1e-300):
                    raise ValueError(
                        f"the max-variance objective needs workloads whose queries within a Kronecker term all have "
                        f"the same variance (marginals, identities, totals); attribute {i} has a factor "
                        f"({f!r}) whose rows differ in sum or norm")
        spectrum, (term_ids, position, values) = trace_spectrum(union, with_terms=True)
        live = (spectrum.tau > 0) & (spectrum.trace_E > 0)
        keep = live[position] & (values > 0)
        rows = union.term_rows()
        self.union = union
        self.spectrum = spectrum
        self.subsets = np.flatnonzero(live)
        column = np.full(spectrum.tau.size, -1)
        column[self.subsets] = np.arange(self.subsets.size)
        self.A = sp.csr_array((values[keep] / rows[term_ids[keep]], (term_ids[keep], column[position[keep]])),
                              shape=(union.num_terms, self.subsets.size))
        self.t = spectrum.trace_E[self.subsets]
        self.terms = np.flatnonzero(np.asarray(self.A.sum(axis=1)).ravel() > 0)

    def objective(self, x: np.ndarray) -> float:
        """``max_j (A x)_j * sum_T t_T / x_T``: the largest unit-noise variance at sensitivity 1."""
        return float((self.A @ x).max() * np.sum(self.t / x))

    def dual(self, y: np.ndarray) -> float:
        """``h(y)^2``, a lower bound on :meth:`objective` for ``y >= 0`` summing to 1 over the terms."""
        return float(np.sum(np.sqrt(self.t * (self.A.T @ y))) ** 2)


@dataclass(frozen=True)
class MaxVarianceSolution:
    """Residual noise levels for the max-variance objective, with their certificate.

    Attributes
    ----------
    strategy : Residuals
        The residual strategy, L2 sensitivity 1.
    value : float
        Its largest per-query variance at unit noise variance.
    dual_bound : float
        A lower bound on that value over all residual strategies.
    classes : tuple of int
        Term and subset classes of the reduced problem.
    iterations : int
        Multiplicative updates made.
    """

    strategy: Residuals
    value: float
    dual_bound: float
    classes: tuple[int, int]
    iterations: int

    @property
    def gap(self) -> float:
        """The relative duality gap, ``1 - dual_bound / value``."""
        return 1.0 - self.dual_bound / self.value


def _refine(A: sp.csr_array, row_colour: np.ndarray, col_colour: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coarsest equitable refinement of the colourings of ``A``'s rows and columns (colour refinement).

    A node's new colour is its colour with the multiset of (neighbour colour, entry) over its
    entries, hashed as a sum of random 64-bit numbers per distinct pair; entries are compared
    to 10 significant digits.
    """
    coo = A.tocoo()
    r, c = coo.row, coo.col
    value = np.unique(np.round(np.log(coo.data), 10), return_inverse=True)[1].reshape(-1)
    rng = np.random.default_rng(12345)
    previous = (-1, -1)
    while (np.unique(row_colour).size, np.unique(col_colour).size) != previous:
        previous = (np.unique(row_colour).size, np.unique(col_colour).size)
        for side in (0, 1):
            own, other, src, dst, n = ((row_colour, col_colour, c, r, A.shape[0]) if side == 0
                                       else (col_colour, row_colour, r, c, A.shape[1]))
            pair = other[src].astype(np.int64) * (int(value.max(initial=0)) + 1) + value
            pairs = np.unique(pair, return_inverse=True)[1].reshape(-1)
            salt = rng.integers(0, 2**63, size=pairs.max(initial=0) + 1, dtype=np.uint64)
            acc = np.zeros(n, dtype=np.uint64)
            np.add.at(acc, dst, salt[pairs])
            acc += own.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # wraps: a hash of (own, multiset)
            colour = np.unique(acc, return_inverse=True)[1].reshape(-1)
            if side == 0:
                row_colour = colour
            else:
                col_colour = colour
    return row_colour, col_colour


def _solve(A: np.ndarray, t: np.ndarray, tol: float, max_iterations: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Maximise ``h(y)`` over the simplex by multiplicative updates; returns ``(x, y, iterations)``."""
    y = np.full(A.shape[0], 1.0 / A.shape[0])
    best = (np.inf, None, None)
    for it in range(1, max_iterations + 1):
        b = A.T @ y
        x = np.sqrt(t / b)
        V = A @ x
        h = float(np.sqrt(t * b).sum())
        value = float(V.max() * np.sum(t / x))
        if value < best[0]:
            best = (value, x, y)
        if h * h >= value * (1.0 - tol):
            return x, y, it
        y = y * V / h
        y /= y.sum()
    return best[1], best[2], max_iterations


def max_variance_residual(W: Matrix, union: KronUnion | None = None, tol: float = GAP_RTOL,
                          max_iterations: int = MAX_ITERATIONS, *,
                          problem: MaxVarianceProblem | None = None) -> MaxVarianceSolution:
    """The residual strategy minimizing the workload's largest per-query variance under Gaussian noise.

    ``union`` is ``kron_union(W)`` when the caller has it, and ``problem`` its
    :class:`MaxVarianceProblem` (building one takes most of a second on 100 attributes). Workload weights scale their terms'
    variances (a weight of 2 asks for a quarter of the variance: per-table targets). Raises
    ``ValueError`` for workloads whose queries within a term differ in variance (see
    :class:`MaxVarianceProblem`).

    Examples
    --------
    >>> import hdmm
    >>> solution = max_variance_residual(hdmm.AllMarginals((4, 5, 6), 2))
    >>> solution.gap < 1e-8, solution.strategy.sensitivity(2)
    (True, 1.0)
    """
    union = kron_union(W) if union is None else union
    problem = MaxVarianceProblem(union) if problem is None else problem
    A = problem.A[problem.terms]
    t = problem.t
    tkey = np.unique(np.round(np.log(t), 10), return_inverse=True)[1].reshape(-1)
    rows, cols = _refine(A, np.zeros(A.shape[0], dtype=np.intp), tkey)
    # reduced problem: one variable per subset class, one variance per term class
    first_row = np.unique(rows, return_index=True)[1]
    R = sp.csr_array((A.data, (np.repeat(np.arange(A.shape[0]), np.diff(A.indptr)), cols[A.indices])),
                     shape=(A.shape[0], cols.max() + 1))[first_row].toarray()
    sizes = np.bincount(cols).astype(float)
    t_class = np.zeros(sizes.size)
    t_class[cols] = t
    x_class, y_class, iterations = _solve(R, sizes * t_class, tol, max_iterations)
    x = x_class[cols]
    term_counts = np.bincount(rows).astype(float)
    y_full = np.zeros(union.num_terms)
    y_full[problem.terms] = (y_class / term_counts)[rows]
    value, bound = problem.objective(x), problem.dual(y_full)
    lam = 1.0 / x
    lam /= float(lam @ t)  # sum_T lambda_T tr(E_T) = 1: L2 sensitivity 1
    N = float(np.prod(np.array(union.sizes, dtype=float)))
    members = problem.spectrum.members[problem.subsets]
    strategy = Residuals.from_members(workload_domain(W, union.sizes), members, np.sqrt(lam * N))
    return MaxVarianceSolution(strategy, value, min(bound, value), (int(rows.max()) + 1, int(cols.max()) + 1),
                               iterations)
