r"""OPT_0: p-Identity strategies for one attribute (MATH.md section 3).

A p-Identity strategy adds ``p`` non-negative query rows ``T`` to the identity and rescales
every column to unit norm:

.. math:: A(T) = \begin{bmatrix} I \\ T \end{bmatrix} D^{-1}, \qquad
          d_j = 1 + \textstyle\sum_i T_{ij} \;\text{(Laplace, } L_1\text{)}, \quad
          d_j = \sqrt{1 + \textstyle\sum_i T_{ij}^2} \;\text{(Gaussian, } L_2\text{)} .

It always has sensitivity 1 and full column rank, so it supports every workload, and the
error of a workload with Gram :math:`G` is

.. math:: f(T) = \mathrm{tr}\big((A^TA)^{-1} G\big) = \mathrm{tr}\big(D (I + T^TT)^{-1} D G\big)
          = \textstyle\sum_j d_j^2 G_{jj} - \mathrm{tr}\big(M^{-1} T C T^T\big),

with :math:`C = DGD` and :math:`M = I_p + TT^T = LL^T` (Woodbury). With :math:`V = L^{-1}T` and
:math:`Z = VC`,

.. math:: f = \textstyle\sum_j d_j^2 G_{jj} - \langle V, Z\rangle, \qquad
          \nabla_T f = -2L^{-T}\big(Z - (ZV^T)V\big) + \Big(\frac{\partial d}{\partial T}\Big)^T g,
          \qquad g_j = 2 d_j G_{jj} - \frac{2}{d_j}\textstyle\sum_i V_{ij} Z_{ij},

where :math:`\partial d_j / \partial T_{ij}` is 1 (Laplace) or :math:`T_{ij}/d_j` (Gaussian).
An evaluation needs ``p`` products with :math:`G` (``O(n)`` each for prefix and range Grams),
two triangular solves and two ``p x p x n`` products: ``O(p^2 n)``, never an ``n x n`` matrix.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy.linalg import cholesky, solve_triangular
from scipy.optimize import Bounds, minimize
from threadpoolctl import threadpool_limits

from ..matrix import Explicit, Identity, KronVector, Matrix, _check_norm

__all__ = ["PIdentity", "pidentity_objective", "optimize_pidentity", "default_p"]

#: Upper bound on the entries of ``T``. Workloads that only need totals push ``T`` towards
#: infinity, where the Woodbury objective loses all precision to cancellation; at ``T_MAX``
#: the identity rows carry a weight of about ``1/T_MAX`` of the total, which costs nothing.
T_MAX = 1e3

#: Iterations every start runs before all but the best start are dropped.
PROBE_ITER = 150

#: Up to this many values a p-Identity strategy evaluates its error through a QR factor.
STABLE_MAX_N = 2048


def _scales(T: np.ndarray, norm: int) -> np.ndarray:
    """Column norms ``d`` of ``[I; T]``: L1 (``norm=1``) or L2 (``norm=2``)."""
    return 1.0 + T.sum(axis=0) if norm == 1 else np.sqrt(1.0 + np.einsum("ij,ij->j", T, T))


def pidentity_objective(T: np.ndarray, G: Matrix, norm: int = 1, gradient: bool = True):
    r"""``f(T) = tr((A(T)^T A(T))^{-1} G)`` and, if asked, its gradient (module docstring).

    Parameters
    ----------
    T
        The ``p x n`` non-negative parameters.
    G
        The workload Gram (an implicit matrix: only products with it are used).
    norm
        1 for Laplace (L1-normalised columns), 2 for Gaussian (L2).
    """
    p, n = T.shape
    d = _scales(T, norm)
    diagG = G.diag()
    if p == 0:
        value = float(d**2 @ diagG)
        return (value, np.zeros_like(T)) if gradient else value
    L = cholesky(np.eye(p) + T @ T.T, lower=True, check_finite=False)
    V = solve_triangular(L, T, lower=True, check_finite=False)
    Z = (G @ (V * d).T).T * d
    VZ = V * Z
    value = float(d**2 @ diagG - VZ.sum())
    if not gradient:
        return value
    grad = solve_triangular(L, (Z @ V.T) @ V - Z, lower=True, trans="T", check_finite=False)
    g = d * diagG - VZ.sum(axis=0) / d
    grad += g[None, :] if norm == 1 else T * (g / d)[None, :]
    return value, 2.0 * grad


def default_p(n: int) -> int:
    """Number of extra rows used when none is given: about ``n/16``, at least 1, at most 64."""
    return int(min(64, max(1, n // 16)))


def optimize_pidentity(
    G: Matrix, p: int, norm: int = 1, restarts: int = 3, rng: np.random.Generator | None = None,
    maxiter: int = 1000, start: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Minimise :func:`pidentity_objective` over ``0 <= T <= T_MAX`` by L-BFGS-B.

    The first start is a partition of the values into ``p`` blocks of consecutive values (or
    ``start``, a warm start, when given); the other ``restarts - 1`` are uniform random in
    [0, 1). Every start first runs ``PROBE_ITER`` iterations; only the best of them is then
    run on to ``maxiter`` iterations, so extra restarts cost a probe each, not a full run.
    Returns the best ``T`` and its objective.
    """
    n = G.shape[0]
    rng = np.random.default_rng() if rng is None else rng
    if p == 0:
        return np.zeros((0, n)), pidentity_objective(np.zeros((0, n)), G, norm, gradient=False)

    def fun(theta):
        value, grad = pidentity_objective(theta.reshape(p, n), G, norm)
        return value, grad.ravel()

    def descend(x0, iterations):
        return minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=Bounds(0.0, T_MAX),
                        options={"maxiter": iterations})

    blocks = np.zeros((p, n))
    blocks[np.arange(n) * p // n, np.arange(n)] = 1.0
    starts = [blocks.ravel()] + [rng.random(p * n) for _ in range(max(1, restarts) - 1)]
    if start is not None:
        starts[0] = np.asarray(start, dtype=float).ravel()
    probe = min(maxiter, PROBE_ITER) if len(starts) > 1 else maxiter
    # The products are small (p x n): one BLAS thread is faster, and on a shared 2-core machine
    # several threads per process can slow these loops down more than tenfold.
    with threadpool_limits(limits=1, user_api="blas"):
        best = min((descend(x0, probe) for x0 in starts), key=lambda result: result.fun)
        if best.nit >= probe and maxiter > probe:
            best = descend(best.x, maxiter - probe)
    return best.x.reshape(p, n), float(best.fun)


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
        _check_norm(norm)
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
        _check_norm(p)
        T = self.params
        return KronVector.from_array((1.0 + (T**p).sum(axis=0)) / self.d**p)

    @cached_property
    def _r_factor(self) -> np.ndarray:
        """``R`` of ``A = QR``: ``X = R^T R`` without squaring ``A``'s condition number."""
        return np.linalg.qr(self.dense(), mode="r")

    def gram_pinv_trace(self, f):
        """``tr(X^{-1} f^T f)``; every workload is supported (full column rank).

        Up to ``STABLE_MAX_N`` values it is computed from the QR factor of ``A`` as
        ``tr(R^{-T} G R^{-1})``: the Woodbury form loses precision to cancellation when the
        identity rows carry little weight, and an optimizer can exploit that.
        """
        n = self.shape[1]
        if n > STABLE_MAX_N:
            return pidentity_objective(self.params, f.gram(), self.norm, gradient=False), True
        R = self._r_factor
        K = solve_triangular(R, f.gram().dense(), trans="T")
        return float(np.trace(solve_triangular(R, K.T, trans="T"))), True

    @property
    def _gram_inverse(self):
        """``X^{-1} = R^{-1} R^{-T}``; the projector is the identity (full rank)."""
        n = self.shape[1]
        Rinv = solve_triangular(self._r_factor, np.eye(n))
        return Rinv @ Rinv.T, np.eye(n)

    def pinv(self):
        Xinv, _ = self._gram_inverse
        return Explicit(Xinv) @ self.T

    def dense(self, max_entries=None):
        return Explicit(np.vstack([np.eye(self.shape[1]), self.params])).dense(max_entries) / self.d[None, :]

    def describe(self, row, name=None, values=None):
        n = self.shape[1]
        if row < n:
            return Identity(n).describe(row, name, values)
        return f"{name or 'value'}: p-Identity query {row - n}"

    def __repr__(self):
        return f"PIdentity(p={self.params.shape[0]}, n={self.shape[1]}, L{self.norm})"
