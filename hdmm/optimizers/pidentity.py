r"""OPT_0: p-Identity strategies for one attribute (docs/math.md, section 4).

A p-Identity strategy adds ``p`` non-negative query rows ``T`` to the identity and rescales
every column to unit norm:

.. math:: A(T) = \begin{bmatrix} I \\ T \end{bmatrix} D^{-1}, \qquad
          d_j = 1 + \textstyle\sum_i T_{ij} \;\text{(Laplace, } L_1\text{)}, \quad
          d_j = \sqrt{1 + \textstyle\sum_i T_{ij}^2} \;\text{(Gaussian, } L_2\text{)} .

It always has sensitivity 1 and full column rank, so it supports every workload, and the
error of a workload with Gram :math:`G` is

.. math:: f(T) = \mathrm{tr}\big((A^TA)^{-1} G\big) = \mathrm{tr}\big(D (I + T^TT)^{-1} D G\big)
          = \textstyle\sum_j d_j^2 G_{jj} - \langle T, Q\rangle,
          \qquad Q = M^{-1} T C,

with :math:`C = DGD` and :math:`M = I_p + TT^T` (Woodbury). Differentiating at fixed ``d``
(:math:`dM^{-1} = -M^{-1}dM\,M^{-1}`) and then through ``d``,

.. math:: \nabla_T f = 2\big(E\,T - Q\big) + \Big(\frac{\partial d}{\partial T}\Big)^T g,
          \qquad E = M^{-1} (T C T^T) M^{-1} = (Q T^T) M^{-1}, \qquad
          g_j = 2 d_j G_{jj} - \frac{2}{d_j}\textstyle\sum_i T_{ij} Q_{ij},

where :math:`\partial d_j / \partial T_{ij}` is 1 (Laplace) or :math:`T_{ij}/d_j` (Gaussian).

Cost. ``G`` only enters through ``Q^T = D\,G\,(D\,T^T M^{-1})``: ``p`` products with ``G``,
``O(n)`` each for prefix and range Grams. Everything else is a product of ``T`` (or its
transpose) with a ``p x p`` or ``n x p`` matrix, plus the ``p x p`` inverse of ``M``. With a
dense ``T`` that is ``O(p^2 n)``; but optimal ``T`` are sparse (each row is a localised bump,
a few rows are wide), and with ``nnz`` non-zeros every product costs ``O(p nnz)``: one
evaluation is ``O(p n + p nnz + p^3)``, never ``O(p^2 n)``, and never an ``n x n`` matrix.

Optimisation (:func:`optimize_pidentity`) is a projected L-BFGS on a *working set* of entries
of ``T``: the entries that are positive or whose partial derivative is negative (the only ones
that a projected step can move off the bound ``T_ij = 0``). The full gradient costs no more
than the restricted one (``Q`` and ``E T`` are formed anyway), so the working set is refreshed
cheaply every few iterations. The search is exact: whatever entries are frozen at zero, the
returned ``T`` is a valid p-Identity strategy whose error is computed exactly afterwards.
"""

from __future__ import annotations

import copy
import functools
from functools import cached_property

import numpy as np
import scipy.sparse as sp
from scipy.linalg.lapack import dpotrf, dpotri, dtpqrt, dtrtri

from ..matrix import Explicit, Identity, KronVector, Matrix, Sum, Weighted
from ..threads import blas_one_thread
from ..traces import compute_gram_inverse, factor_trace
from ..validation import check_norm, check_width
from .racing import successive_halving

__all__ = ["PIdentity", "pidentity_objective", "optimize_pidentity", "default_p", "default_restarts",
           "hierarchical_start", "bump_start", "default_start"]

#: Upper bound on the entries of ``T``. Workloads that only need totals push ``T`` towards
#: infinity, where the Woodbury objective loses all precision to cancellation; at ``T_MAX``
#: the identity rows carry a weight of about ``1/T_MAX`` of the total, which costs nothing.
T_MAX = 1e3

#: Successive halving of the starts (:func:`optimize_pidentity`): every start first runs
#: ``RUNG_ITER`` iterations; each rung keeps the best ``1 / RUNG_KEEP`` of the starts and
#: multiplies the iterations by ``RUNG_GROWTH``.
RUNG_ITER = 15
RUNG_KEEP = 4
RUNG_GROWTH = 3

#: At most this many iterations by default.
MAXITER = 1000

#: Beyond ``SMALL_N`` values an iteration costs milliseconds, and the search stops once the
#: last ``WINDOW`` iterations gained less than ``WINDOW_TOL`` of the objective (relative);
#: smaller domains always run ``MAXITER`` iterations, which are cheap there. The tolerance trades
#: a little time for a negligible loss of error on large prefix workloads, which still reach the
#: published p-Identity ratios.
SMALL_N = 512
WINDOW = 100
WINDOW_TOL = 3e-3

#: Up to this many values a p-Identity strategy evaluates its error through a QR factor (a dense
#: one: cheap at that size) ...
DENSE_QR_MAX_N = 512

#: ... and up to this many, through the Woodbury form where its estimated relative rounding
#: error is at most ``WOODBURY_RTOL``, else through a structured QR factor; beyond, the Woodbury form.
STABLE_MAX_N = 2048
WOODBURY_RTOL = 1e-9

#: Block size of the triangular-pentagonal QR behind a p-Identity strategy's exact error.
TPQRT_BLOCK = 32

#: Up to this many values the search multiplies by the Gram as a dense matrix.
DENSE_GRAM_N = 256

#: Below this fraction of non-zeros, ``T`` is handled as a sparse matrix, when it has more than
#: ``DENSE_T_MAX`` entries (below that, a sparse matrix's overheads outweigh what it saves).
SPARSE_DENSITY = 0.1
DENSE_T_MAX = 8192

#: In a cautious run (see :func:`optimize_pidentity`) a step may at most halve an entry larger
#: than this fraction of the largest entry; smaller entries may still drop to zero.
CAUTIOUS_MIN = 1e-2

#: Wide rows (the total, halves, quarters) of :func:`bump_start`.
WIDE_ROWS = 7

#: Sizes (exclusive, inclusive) beyond ``SMALL_N`` whose default start is the dyadic hierarchy.
HIERARCHY_RANGE = (1024, 2048)

#: L-BFGS memory (number of correction pairs).
MEMORY = 10

#: The working set is rebuilt from the full gradient every this many iterations.
REFRESH = 10


def _scales(T: np.ndarray, norm: int) -> np.ndarray:
    """Column norms ``d`` of ``[I; T]``: L1 (``norm=1``) or L2 (``norm=2``)."""
    return 1.0 + T.sum(axis=0) if norm == 1 else np.sqrt(1.0 + np.einsum("ij,ij->j", T, T))


def _spd_inverse(M: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric positive definite matrix (here ``M >= I``) by Cholesky."""
    c, info = dpotrf(M, lower=1)
    if info == 0:
        c, info = dpotri(c, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError("I + T T^T is not positive definite (non-finite T?)")
    return np.where(_lower_mask(c.shape[0]), c, c.T)  # the inverse is in the lower triangle


@functools.lru_cache(maxsize=16)
def _lower_mask(p: int) -> np.ndarray:
    """The boolean lower triangle (diagonal included) of a ``p x p`` matrix."""
    return np.tri(p, dtype=bool)


class _Evaluation:
    r"""One evaluation of the objective at ``T`` (module docstring), dense or sparse.

    Parameters
    ----------
    T
        ``p x n`` dense array, or a ``scipy.sparse`` CSR array of that shape whose
        (row, column) pattern is ``rows, cols`` (CSR order) with values ``values``.
    """

    def __init__(self, T, G: Matrix, diagG: np.ndarray, norm: int, rows=None, cols=None, values=None, scale=()):
        self.T, self.norm = T, norm
        self.sparse = sp.issparse(T)
        self.rows, self.cols, self.values = rows, cols, values
        p, n = T.shape
        if self.sparse:
            s = np.bincount(cols, weights=values if norm == 1 else values * values, minlength=n)
            TTt = (T @ T.T).toarray()
        else:
            s = T.sum(axis=0) if norm == 1 else np.einsum("ij,ij->j", T, T)
            TTt = T @ T.T
        d = 1.0 + s if norm == 1 else np.sqrt(1.0 + s)
        TTt[np.diag_indices(p)] += 1.0
        self.Minv = _spd_inverse(TTt)
        # Q^T = D G D T^T M^{-1}  (n x p), with G the product of the weights in ``scale`` (innermost
        # first) and the Gram passed: the only products with G. n x p in Fortran order: the Gram's
        # cumulative sums run over contiguous memory.
        self.d, self.diagG = d, diagG
        Yt = np.asfortranarray(T.T @ self.Minv)
        Yt *= d[:, None]
        self.Qt = G @ Yt
        for weight in scale:
            self.Qt *= weight
        self.Qt *= d[:, None]
        if self.sparse:
            self.Qg = self.Qt[cols, rows]
            TQ = np.bincount(cols, weights=values * self.Qg, minlength=n)
        else:
            TQ = np.einsum("ij,ji->j", T, self.Qt)     # sum_i T_ij Q_ij
        self.value = float(d**2 @ diagG - TQ.sum())
        self.TQ = TQ

    @cached_property
    def _parts(self):
        """``Z = M^{-1} P`` (p x p, ``P = T Q^T``, so ``E T = Z^T T``) and the vector ``g / 2`` of the module docstring."""
        g = self.d * self.diagG - self.TQ / self.d
        return self.Minv @ (self.T @ self.Qt), g

    @cached_property
    def _core(self) -> np.ndarray:
        """``(E T)^T - Q^T = T^T M^{-1} P - Q^T`` (``n x p``), shared by the full and the restricted gradient."""
        Z, _ = self._parts
        core = self.T.T @ Z
        core -= self.Qt
        return core

    @cached_property
    def _gradient(self) -> np.ndarray:
        _, g = self._parts
        if self.norm == 1:
            return np.multiply((self._core + g[:, None]).T, 2.0, order="C")
        grad = np.multiply(self._core.T, 2.0, order="C")
        grad += (self.T.multiply(2.0 * g / self.d)).toarray() if self.sparse else self.T * (2.0 * g / self.d)
        return grad

    def gradient(self) -> np.ndarray:
        """The full ``p x n`` gradient (computed once per evaluation; do not modify it)."""
        return self._gradient

    def gradient_at(self, omega: np.ndarray) -> np.ndarray:
        """The gradient at the flat indices ``omega`` of ``T`` (for a sparse ``T``: its pattern)."""
        if not self.sparse:
            return self.gradient().ravel()[omega]
        _, g = self._parts
        out = self._core[self.cols, self.rows]
        out += g[self.cols] if self.norm == 1 else self.values * (g / self.d)[self.cols]
        return 2.0 * out

def _unscaled(G: Matrix) -> tuple[Matrix, tuple[float, ...]]:
    """``G`` as its weights (innermost first) times a base, peeling weights and sums of one term.

    A product with the base, then the weights applied in that order, gives the same floating-point
    result as a product with ``G`` in fewer passes over the ``n x p`` operand.
    """
    weights = []
    while True:
        if isinstance(G, Sum) and len(G.terms) == 1:
            G = G.terms[0]
        elif isinstance(G, Weighted):
            weights.append(G.weight)
            G = G.base
        else:
            return G, tuple(w for w in reversed(weights) if w != 1.0)


def pidentity_objective(T: np.ndarray, G: Matrix, norm: int = 1, gradient: bool = True):
    r"""``f(T) = tr((A(T)^T A(T))^{-1} G)`` and, if asked, its gradient (module docstring).

    Parameters
    ----------
    T
        The ``p x n`` non-negative parameters (dense; mostly-zero ``T`` are handled sparsely).
    G
        The workload Gram (an implicit matrix: only products with it are used).
    norm
        1 for Laplace (L1-normalised columns), 2 for Gaussian (L2).
    gradient
        Also return the ``p x n`` gradient.

    Returns
    -------
    value or (value, gradient)
    """
    T = np.asarray(T, dtype=float)
    if T.shape[0] == 0:
        value = float(np.sum(G.diag()))
        return (value, np.zeros_like(T)) if gradient else value
    ev = _evaluate(T, G, norm)
    return (ev.value, ev.gradient()) if gradient else ev.value


def _evaluate(T: np.ndarray, G: Matrix, norm: int) -> _Evaluation:
    """:class:`_Evaluation` at a dense ``T`` with at least one row (sparse when mostly zero)."""
    p, n = T.shape
    diagG = np.asarray(G.diag(), dtype=float)
    rows, cols = np.nonzero(T)
    base, scale = _unscaled(G)
    if T.size > DENSE_T_MAX and rows.size <= SPARSE_DENSITY * T.size:
        values = T[rows, cols]
        Ts = sp.csr_array((values, (rows, cols)), shape=(p, n))
        return _Evaluation(Ts, base, diagG, norm, rows, cols, values, scale)
    return _Evaluation(T, base, diagG, norm, scale=scale)


def _woodbury_trace(T: np.ndarray, G: Matrix, norm: int) -> tuple[float, float]:
    r"""The Woodbury value of :func:`pidentity_objective` and an estimate of its relative rounding error.

    The value is :math:`\sum_j d_j^2 G_{jj} - \langle T, Q\rangle`: the subtraction loses the
    ratio :math:`c = \sum_j d_j^2 G_{jj} / f` and the solve with :math:`M = I + TT^T` its
    condition number, so the estimate is :math:`\epsilon\, c\, \kappa(M)`.
    """
    if T.shape[0] == 0:
        return float(np.sum(G.diag())), 0.0
    ev = _evaluate(T, G, norm)
    if not ev.value > 0:
        return ev.value, np.inf
    inverse_eigenvalues = np.linalg.eigvalsh(ev.Minv)   # 1 / eigenvalues of M
    cancellation = float(ev.d**2 @ ev.diagG) / ev.value
    condition = inverse_eigenvalues[-1] / inverse_eigenvalues[0]
    return ev.value, float(np.finfo(float).eps * cancellation * condition)


class _Problem:
    """The objective restricted to a working set ``omega`` of flat indices into ``T`` (p x n)."""

    def __init__(self, G: Matrix, p: int, n: int, norm: int):
        self.p, self.n, self.norm = p, n, norm
        self.diagG = np.asarray(G.diag(), dtype=float)
        self.G, self.scale = _unscaled(G)
        if n <= DENSE_GRAM_N and not isinstance(self.G, Explicit):
            # small: one BLAS product with the dense Gram beats a structured product's passes
            self.G = Explicit(self.G.dense())
        self.nfev = 0

    def evaluate(self, omega: np.ndarray, x: np.ndarray) -> _Evaluation:
        """Evaluate at ``T`` with values ``x`` on ``omega`` (sorted) and zeros elsewhere."""
        self.nfev += 1
        p, n = self.p, self.n
        if p * n <= DENSE_T_MAX or omega.size > SPARSE_DENSITY * p * n:
            T = np.zeros(p * n)
            T[omega] = x
            return _Evaluation(T.reshape(p, n), self.G, self.diagG, self.norm, scale=self.scale)
        rows, cols = np.divmod(omega, n)
        indptr = np.zeros(p + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=p), out=indptr[1:])
        Ts = sp.csr_array((x, cols, indptr), shape=(p, n))
        return _Evaluation(Ts, self.G, self.diagG, self.norm, rows, cols, x, self.scale)


def _two_loop(q: np.ndarray, S: list, Y: list, rho: list) -> np.ndarray:
    """L-BFGS product ``H q`` (two-loop recursion, ``H_0 = (s^T y / y^T y) I``)."""
    q = q.copy()
    alpha = []
    for s, y, r in zip(reversed(S), reversed(Y), reversed(rho)):
        a = r * (s @ q)
        q -= a * y
        alpha.append(a)
    if S:
        q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1])
    for s, y, r, a in zip(S, Y, rho, reversed(alpha)):
        q += (a - r * (y @ q)) * s
    return q


def _projected_lbfgs(problem: _Problem, T0: np.ndarray, maxiter: int, ftol: float = 1e-10, window_tol: float = 0.0,
                     cautious: bool = False):
    r"""Minimise over ``0 <= T <= T_MAX`` by projected L-BFGS on a working set.

    Each iteration fixes the entries at a bound whose derivative pushes outwards, takes the
    L-BFGS direction on the others (two-loop recursion), and backtracks along the projected
    path ``P(x + a d)`` until the Armijo condition holds. Every ``REFRESH`` iterations the
    working set becomes: entries that are positive, plus entries with a negative derivative.
    Correction pairs are carried over to a new working set (entries that join it had ``s = 0``,
    so they simply get the initial scaling ``H_0``).

    Stops after ``maxiter`` iterations, after 5 iterations in a row that each gain less than
    ``ftol`` (relative), or once the last ``WINDOW`` iterations together gained less than
    ``window_tol`` (relative; 0 turns this test off).

    ``cautious``: no step more than halves an entry above ``CAUTIOUS_MIN`` times the largest, so
    the search cannot jump to ``T = 0`` in one secant step.

    Returns
    -------
    T, value, iterations
    """
    p, n = problem.p, problem.n
    flat = np.asarray(T0, dtype=float).ravel()
    omega = np.flatnonzero(flat > 0)
    x = flat[omega]
    ev = problem.evaluate(omega, x)
    f = ev.value
    full = ev.gradient().ravel()
    omega = np.flatnonzero((flat > 0) | (full < 0))
    x, g = flat[omega], full[omega]
    S, Y, rho = [], [], []
    it, stall = 0, 0
    history = [f]
    while it < maxiter:
        it += 1
        free = ~(((x <= 0) & (g > 0)) | ((x >= T_MAX) & (g < 0)))
        gf = np.where(free, g, 0.0)
        if not gf.any():
            break
        d = -_two_loop(gf, S, Y, rho)
        d[~free] = 0.0
        slope = gf @ d
        if slope >= 0 or not S:
            S, Y, rho = [], [], []
            d = -gf
            step = min(1.0, 1.0 / np.abs(gf).max())
        else:
            step = 1.0
        floor = np.where(x > CAUTIOUS_MIN * x.max(), x / 2, 0.0) if cautious and x.size else 0.0
        for attempt in range(30):
            x_new = np.clip(x + step * d, floor, T_MAX)
            ev_new = problem.evaluate(omega, x_new)
            if ev_new.value <= f + 1e-4 * (g @ (x_new - x)):
                break
            step *= 0.5 if attempt < 2 else 0.1
        else:
            break                           # no decrease along the direction: converged
        g_new = ev_new.gradient_at(omega)
        s, y = x_new - x, g_new - g
        sy = s @ y
        if sy > 1e-12 * (y @ y):
            S.append(s)
            Y.append(y)
            rho.append(1.0 / sy)
            if len(S) > MEMORY:
                del S[0], Y[0], rho[0]
        decrease = f - ev_new.value
        x, g, f, ev = x_new, g_new, ev_new.value, ev_new
        stall = stall + 1 if decrease <= ftol * abs(f) else 0
        history.append(f)
        if stall >= 5 or (it >= WINDOW and history[-WINDOW - 1] - f <= window_tol * abs(f)):
            break
        if it % REFRESH == 0:
            full = ev.gradient().ravel()
            positive = np.zeros(p * n, dtype=bool)
            positive[omega[x > 0]] = True
            new = np.flatnonzero(positive | (full < 0))
            if not np.array_equal(new, omega):
                pos = np.searchsorted(omega, new)
                pos = np.minimum(pos, omega.size - 1)
                kept = omega[pos] == new
                S = [np.where(kept, v[pos], 0.0) for v in S]
                Y = [np.where(kept, v[pos], 0.0) for v in Y]
                pairs = [(s, y, s @ y) for s, y in zip(S, Y)]
                pairs = [(s, y, 1.0 / sy) for s, y, sy in pairs if sy > 1e-12 * (y @ y)]
                S, Y, rho = [a for a, _, _ in pairs], [b for _, b, _ in pairs], [c for _, _, c in pairs]
                x = np.where(kept, x[pos], 0.0)
                omega, g = new, full[new]
    T = np.zeros(p * n)
    T[omega] = x
    return T.reshape(p, n), f, it


def default_restarts(n: int) -> int:
    """Starts of a multi-start search when none is given: 8 up to ``SMALL_N`` values, 3 beyond.

    On small attributes a start costs milliseconds, and more of them lower OPT_(x)'s error on
    the multi-attribute benchmarks (and can shorten the search, from a better first round).
    """
    return 8 if n <= SMALL_N else 3


def default_p(n: int) -> int:
    """Number of extra rows used when none is given: ``n/8`` up to 64 rows, and 128 beyond 1024 values.

    ``n/8`` rather than ``n/16`` on small domains: the extra rows are nearly free there and
    reach the published prefix ratios. From n=2048 on, 64 rows fall short of them and 128 rows
    reach them.
    """
    return int(min(max(1, n // 8), 64 if n <= 1024 else 128))


def hierarchical_start(n: int, p: int, weight: float = 0.5) -> np.ndarray:
    """A dyadic hierarchy as ``p`` rows of ``T``: ``m`` blocks, then ``m/2``, ..., then the total.

    ``m`` is the largest power of two with ``2m - 1 <= p`` rows (and ``m <= n``); block edges
    are ``i n / k`` for ``k`` blocks, rows left over are zero. Optimal p-Identity rows for
    range-like workloads are overlapping bumps at every scale, which this start resembles far
    more than a flat partition: from it, L-BFGS reaches the published prefix ratios in a few
    hundred iterations.
    """
    m = 1
    while 4 * m - 1 <= p and 2 * m <= n:
        m *= 2
    T = np.zeros((p, n))
    row, k = 0, m
    while k >= 1:
        row = _partition_rows(T, row, k, weight)
        k //= 2
    return T


def _partition_rows(T: np.ndarray, row: int, k: int, weight: float) -> int:
    """Fill rows ``row, row + 1, ...`` of ``T`` (as many as fit) with the ``k`` blocks ``[i n / k, (i + 1) n / k)``;
    returns the next free row."""
    n = T.shape[1]
    edges = np.arange(k + 1) * n // k
    for lo, hi in zip(edges[:-1], edges[1:]):
        if row >= T.shape[0]:
            break
        T[row, lo:hi] = weight
        row += 1
    return row


def bump_start(n: int, p: int, weight: float = 0.5) -> np.ndarray:
    """Overlapping bumps and a few wide rows as the ``p`` rows of ``T``.

    The wide rows are the total, then the halves and quarters of the domain, as many as fit in
    ``min(WIDE_ROWS, p // 2)`` rows; each of the ``k`` other rows covers about ``2n/k`` consecutive
    values centred on the ``i``-th of ``k`` equal blocks, overlapping its neighbours by half.
    Optimal p-Identity rows for range workloads on large domains look like this: most rows are
    such bumps, a few are wide.
    """
    wide, level = 0, 1
    while wide + level <= min(WIDE_ROWS, p // 2):
        wide += level
        level *= 2
    k = p - wide
    T = np.zeros((p, n))
    centres = (np.arange(k) + 0.5) * n / k
    lo = np.clip(np.round(centres - n / k), 0, n - 1).astype(int)
    hi = np.maximum(np.clip(np.round(centres + n / k), 0, n).astype(int), lo + 1)
    for i in range(k):
        T[i, lo[i]:hi[i]] = weight
    row, level = k, 1
    while row < p:
        row = _partition_rows(T, row, level, weight)
        level *= 2
    return T


def default_start(n: int, p: int) -> np.ndarray:
    """The first start of :func:`optimize_pidentity`: :func:`bump_start` on large domains, else :func:`hierarchical_start`.

    Bumps beyond ``SMALL_N`` values, apart from ``HIERARCHY_RANGE`` (more than 1024 values, up
    to 2048), where the hierarchy reached lower error in the tuning runs.
    """
    lo, hi = HIERARCHY_RANGE
    return bump_start(n, p) if n > SMALL_N and not lo < n <= hi else hierarchical_start(n, p)


def optimize_pidentity(
    G: Matrix, p: int, norm: int = 1, restarts: int = 1, rng: np.random.Generator | None = None,
    maxiter: int | None = None, start: np.ndarray | None = None, l2_warmup: int = 0,
) -> tuple[np.ndarray, float]:
    r"""Minimise :func:`pidentity_objective` over ``0 <= T <= T_MAX`` (projected L-BFGS).

    Each start runs :func:`_projected_lbfgs` (working-set projected L-BFGS, sparse products
    once ``T`` is mostly zero). The starts, ``restarts`` in all: :func:`default_start` (the
    hierarchy of :func:`hierarchical_start` or the bumps of :func:`bump_start`; or ``start``, a
    warm start, when given), a partition of the
    values into ``p`` blocks of consecutive values, then uniform random in [0, 1). Several starts
    race by successive halving: all run ``RUNG_ITER`` iterations, the best ``1 / RUNG_KEEP`` run
    ``RUNG_GROWTH`` times as many more, and so on until one is left, which runs on to
    ``maxiter`` iterations in all (default ``MAXITER``; beyond ``SMALL_N`` values it stops
    earlier once ``WINDOW`` iterations gain less than ``WINDOW_TOL``). A start that is far
    behind after a few iterations rarely wins, so extra starts cost a few iterations each, not a
    full run. The search runs on ``G`` scaled to mean diagonal 1, so that it does not depend on
    the Gram's scale. Returns the best ``T`` and its objective.

    Under Laplace noise ``T = 0`` is a strict local minimum: the sensitivity
    :math:`1 + \max_j \sum_i T_{ij}` grows to first order in ``T`` while the trace falls only to
    second order. A secant step that clips every entry to zero therefore ends a search at the
    identity even where small extra rows pay (``I + J``: the identity with one total row of small
    weight beats the identity). When the best run ends at ``T = 0``,
    the first start is run again cautiously (no step more than halves an entry, apart from the
    smallest, see ``CAUTIOUS_MIN``) and kept if it is better.

    ``l2_warmup`` (Laplace only, when no ``start`` is given): the default start first runs that
    many iterations of the same search under L2 column norms, :math:`d_j = (1 + \sum_i
    T_{ij}^2)^{1/2}` (on top of ``maxiter``), and the L1 search races from where it ends, unless
    that is ``T = 0`` (the default start is kept; the cautious rerun always uses it). The L2
    norms are smooth in ``T`` and grow only to second order from a zero entry, so rows move and
    widen freely there, where under L1 every entry pays its first-order cost in sensitivity; the
    warm-up settles the layout of the rows (which values each covers) before the L1 search
    refines their weights. OPT_(x) uses it in its first round (:mod:`.kron`).
    """
    n = G.shape[0]
    maxiter = MAXITER if maxiter is None else maxiter
    window_tol = WINDOW_TOL if n > SMALL_N else 0.0
    rng = np.random.default_rng() if rng is None else rng
    if p == 0:
        return np.zeros((0, n)), pidentity_objective(np.zeros((0, n)), G, norm, gradient=False)
    # the search is not invariant to the Gram's scale (first steps, tolerances): OPT_(x)'s effective
    # Grams carry the product of the other attributes' traces; search on G scaled to mean diagonal 1
    trace = float(np.sum(G.diag()))
    unit = n / trace if trace > 0 and np.isfinite(trace) else 1.0
    problem = _Problem(G if unit == 1.0 else Weighted(G, unit), p, n, norm)
    starts = [default_start(n, p) if start is None else np.asarray(start, dtype=float).reshape(p, n)]
    if restarts >= 2:
        blocks = np.zeros((p, n))
        blocks[np.arange(n) * p // n, np.arange(n)] = 1.0
        starts += [blocks] + [rng.random((p, n)) for _ in range(restarts - 2)]
    first = starts[0]
    with blas_one_thread():
        if l2_warmup > 0 and norm == 1 and start is None:
            smooth = copy.copy(problem)     # the same (scaled, possibly densified) Gram under L2 norms
            smooth.norm = 2
            warmed = _projected_lbfgs(smooth, first, l2_warmup)[0]
            if warmed.any():
                starts[0] = warmed
        best, used = successive_halving(starts, lambda T0, k: _projected_lbfgs(problem, T0, k, window_tol=window_tol)[:2],
                                        RUNG_ITER, RUNG_KEEP, RUNG_GROWTH, budget=maxiter)
        T, f, it = _projected_lbfgs(problem, best, maxiter - used, window_tol=window_tol)
        if not T.any():
            T, f, it = min((T, f, it), _projected_lbfgs(problem, first, maxiter, window_tol=window_tol, cautious=True),
                           key=lambda r: r[1])
    return T, float(f) / unit


class PIdentity(Matrix):
    r"""The p-Identity strategy :math:`A(T) = [I; T] D^{-1}` (module docstring).

    Parameters
    ----------
    T
        ``p x n`` non-negative matrix of extra queries.
    norm
        1: columns have unit L1 norm (Laplace); 2: unit L2 norm (Gaussian).
    """

    def __init__(self, T: np.ndarray, norm: int = 1):
        check_norm(norm)
        T = np.asarray(T, dtype=float)
        if T.ndim != 2 or not np.all(np.isfinite(T)) or np.any(T < 0):
            raise ValueError("T must be a finite, non-negative 2-D array (p x n)")
        self.params = T
        self.norm = norm
        self.d = _scales(T, norm)
        self.shape = (T.shape[1] + T.shape[0], T.shape[1])

    def _matmat(self, X):
        Y = X / self.d[:, None]
        return np.vstack([Y, self.params @ Y])

    def _rmatmat(self, Y):
        n = self.shape[1]
        return (Y[:n] + self.params.T @ Y[n:]) / self.d[:, None]

    def column_norm_powers(self, p):
        check_norm(p)
        T = self.params
        return KronVector.from_array((1.0 + (T**p).sum(axis=0)) / self.d**p)

    @cached_property
    def _r_factor(self) -> np.ndarray:
        """``R`` of ``A = QR``: ``X = R^T R`` without squaring ``A``'s condition number.

        Up to ``DENSE_QR_MAX_N`` values, the dense QR of ``A``. Beyond: ``A = [I; T] D^{-1}``, so
        ``R`` is the ``R`` of ``[I; T]`` with its columns divided by ``d``; LAPACK's
        triangular-pentagonal QR (``dtpqrt``) reflects only the ``p`` rows of ``T`` into the
        identity's, ``O(p n^2)`` operations instead of a dense QR's ``O(n^3)``.
        """
        T = self.params
        p, n = T.shape
        if n <= DENSE_QR_MAX_N:
            return np.linalg.qr(self.dense(), mode="r")
        R = np.eye(n, order="F")
        if p > 0:
            R, _, _, info = dtpqrt(0, min(TPQRT_BLOCK, n), R, np.array(T, order="F"), overwrite_a=1, overwrite_b=1)
            if info != 0:
                raise np.linalg.LinAlgError(f"dtpqrt failed (info={info})")
            R = np.triu(R)
        return R / self.d[None, :]

    @cached_property
    def _r_inverse(self) -> np.ndarray:
        """``R^{-1}`` (upper triangular), by LAPACK's triangular inverse."""
        Rinv, info = dtrtri(self._r_factor, lower=0)
        if info != 0:
            raise np.linalg.LinAlgError("the p-Identity strategy's R factor is singular")
        return Rinv

    def pinv(self):
        """:math:`A^+ = X^{-1} A^T` with :math:`X^{-1} = R^{-1} R^{-T}` (full column rank)."""
        Rinv = self._r_inverse
        return Explicit(Rinv @ Rinv.T) @ self.T

    def dense(self, max_entries=None):
        return Explicit(np.vstack([np.eye(self.shape[1]), self.params])).dense(max_entries) / self.d[None, :]

    def describe(self, row, name=None, values=None):
        n = self.shape[1]
        if row < n:
            return Identity(n).describe(row, name, values)
        return f"{name or 'value'}: p-Identity query {row - n}"

    def __repr__(self):
        return f"PIdentity(p={self.params.shape[0]}, n={self.shape[1]}, L{self.norm})"


# ====================================================================== error of a workload factor (hdmm.traces)
@compute_gram_inverse.register
def _(A: PIdentity) -> tuple[np.ndarray, np.ndarray]:
    """``X^{-1} = R^{-1} R^{-T}`` from the QR factor of ``A``; the projector is the identity (full rank)."""
    Rinv = A._r_inverse
    return Rinv @ Rinv.T, np.eye(A.shape[1])


@factor_trace.register
def _(A: PIdentity, f: Matrix) -> tuple[float, bool]:
    r""":math:`\mathrm{tr}(X^{-1} f^Tf)`; every workload is supported (full column rank).

    Up to ``DENSE_QR_MAX_N`` values it is computed from the QR factor of ``A`` as
    :math:`\mathrm{tr}(R^{-T} G R^{-1})`: the Woodbury form loses precision to cancellation when
    the identity rows carry little weight, and an optimizer can exploit that. Up to
    ``STABLE_MAX_N`` values, the Woodbury form (:func:`pidentity_objective`, ``O(p n)`` with
    structured Grams) is used when its estimated relative rounding error (:func:`_woodbury_trace`)
    is at most ``WOODBURY_RTOL``, the QR factor otherwise. Beyond, it is the Woodbury form (no
    ``n x n`` matrix).
    """
    check_width(f, A)
    n = A.shape[1]
    G = f.gram()
    if n > DENSE_QR_MAX_N:
        value, error = _woodbury_trace(A.params, G, A.norm)
        if n > STABLE_MAX_N or error <= WOODBURY_RTOL:
            return value, True
    Rinv = A._r_inverse
    return float(np.einsum("ij,ij->", Rinv, G @ Rinv)), True  # tr(R^-T G R^-1)
