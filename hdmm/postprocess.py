r"""Post-processing of a least-squares estimate: non-negative counts, integer counts.

Post-processing uses only the noisy measurements, so it costs no privacy; it changes (and
biases) the answers, so :func:`hdmm.run` reports how far it moved them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np

from .matrix import Explicit, Identity, Kronecker, Matrix, Weighted

__all__ = ["project_nonnegative", "nonnegative_least_squares", "metric_projection", "largest_gram_eigenvalue",
           "round_to_total"]


#: Non-negative least squares stops when a step moves the fitted strategy answers by less than
#: this many noise standard deviations (root mean square over the answers) ...
NONNEGATIVE_TOL = 1e-3

#: ... or after this many accelerated projected-gradient steps (with a warning).
NONNEGATIVE_MAXITER = 3000


def project_nonnegative(x: np.ndarray, total: float | None = None) -> np.ndarray:
    r"""The closest non-negative vector with a given total (Euclidean projection).

    Solves :math:`\min_v \|v - x\|_2` subject to :math:`v \ge 0,\ \sum_j v_j = t` with
    :math:`t = \max(\text{total}, 0)` (``total`` defaults to :math:`\sum_j x_j`). The solution
    is :math:`v = \max(x - \theta, 0)` for the unique :math:`\theta` giving the total, found by
    Michelot's algorithm: :math:`\theta = (\sum_{j \in S} x_j - t)/|S|` over the cells
    :math:`S` still kept (all at first), then :math:`S \leftarrow \{j \in S: x_j \ge \theta\}`,
    repeated until :math:`S` stops shrinking. :math:`S` shrinks at every pass, so it ends after at most
    :math:`N` passes of :math:`O(N)` (a few in practice), whatever the rounding.

    Raises
    ------
    ValueError
        If ``x`` or ``total`` holds NaN or infinite values, or the sum of ``x`` overflows.
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):  # an overflowing sum is refused just below
        t = max(float(np.sum(x) if total is None else total), 0.0) if np.all(np.isfinite(x)) else math.nan
    if not math.isfinite(t):
        raise ValueError(
            "cannot project an estimate with NaN or infinite entries (or whose sum overflows) onto non-negative "
            "counts; the measured data must be finite counts of at most hdmm.kernel.MAX_COUNT"
        )
    if t == 0.0:
        return np.zeros_like(x)
    kept_cells = np.ones(x.size, dtype=bool)
    count, kept = x.size, float(np.sum(x))
    while True:
        theta = (kept - t) / count
        above = kept_cells & (x >= theta)  # never empty in exact arithmetic: theta is at most the kept cells' mean
        remaining = int(above.sum())
        if remaining == count or remaining == 0:
            return np.maximum(x - theta, 0.0)
        kept_cells, count, kept = above, remaining, float(np.sum(x[above]))


def largest_gram_eigenvalue(A: Matrix, iterations: int = 30) -> float:
    r"""An estimate of :math:`\|A\|_2^2` by power iteration on :math:`A^TA` (from below, so padded by 10%)."""
    u = np.random.default_rng(0).random(A.shape[1]) + 1.0  # data independent
    lam = 0.0
    for _ in range(iterations):
        u = A.T @ (A @ (u / np.linalg.norm(u)))
        lam = float(np.linalg.norm(u))
        if lam == 0.0:
            break
    return 1.1 * lam


#: Strategy factors of at most this many columns get their Gram as a dense matrix in :func:`metric_projection`.
DENSE_GRAM_FACTOR = 2048


def _gram_operator(A: Matrix) -> Matrix:
    """:math:`A^TA` as an operator for repeated products: a Kronecker strategy's small factor Grams made dense
    (one small matrix product per factor instead of two through the factor and its transpose)."""
    if isinstance(A, Weighted):
        return Weighted(_gram_operator(A.base), A.weight**2)
    if isinstance(A, Kronecker):
        return Kronecker([f if isinstance(f, Identity) else Explicit(f.gram().dense())
                          if f.shape[1] <= DENSE_GRAM_FACTOR else f.gram() for f in A.factors])
    return A.gram()


def metric_projection(
    A: Matrix, X: np.ndarray, project: Callable[[np.ndarray], np.ndarray], noise_std: float,
    tol: float = NONNEGATIVE_TOL, maxiter: int = NONNEGATIVE_MAXITER, gram_norm: float | None = None,
    weights: np.ndarray | None = None, gram: Matrix | None = None, target: np.ndarray | None = None,
    gap: Callable[[np.ndarray, np.ndarray], float] | None = None,
) -> np.ndarray:
    r"""The point of a convex set closest to the rows of ``X`` as measured through ``A``.

    .. math:: V = \arg\min_{V \in C} \textstyle\sum_i w_i \|A(V_i - X_i)\|_2^2,

    for ``X`` of shape ``k x N`` (one estimate per row), positive row ``weights`` :math:`w`
    (default 1) and a convex set :math:`C` given by its Euclidean projection ``project`` (a
    ``k x N`` array to a ``k x N`` array). Measuring the distance through ``A`` moves the
    well-measured directions far less than a Euclidean projection of ``X`` would; a row that is
    the sum of ``m`` independent estimates has ``m`` times their noise covariance and weight
    :math:`1/m`. Solved by accelerated projected gradient (FISTA with adaptive restart, step
    :math:`1/(\max_i w_i \|A\|_2^2)`; ``gram_norm`` gives :math:`\|A\|_2^2` when known) from
    ``project(X)``; it stops when one step moves the fitted strategy answers, each scaled by
    :math:`\sqrt{w_i}`, by at most ``tol`` noise standard deviations (root mean square per
    answer), and warns if ``maxiter`` steps come first.

    ``gram`` (an operator for :math:`A^TA`, e.g. a dense one formed once) and ``target``
    (``N x k``, standing for :math:`A^TAX^T` in the objective; the rows of ``X`` then only start
    the search) serve a caller that fits :math:`V` on some columns ``S`` of a wider strategy to full
    estimates :math:`\hat X`: it passes :math:`G_{SS}` and :math:`G_{S\cdot}\hat X^T`, since
    :math:`\|A_SV_i - A\hat X_i\|^2` and :math:`V_i^TG_{SS}V_i - 2V_i^TG_{S\cdot}\hat X_i` differ by a
    constant. ``gram_norm`` must then bound :math:`\|G_{SS}\|_2` (that of :math:`G` does).

    With ``gap``, the stop is certified instead: ``gap(V, grad)`` returns the Frank-Wolfe gap
    :math:`\max_{S \in C}\langle\nabla f(V), V - S\rangle` at a feasible ``V`` (``grad`` is
    :math:`\nabla f(V)`, ``k x N``), which bounds :math:`f(V) - f^*`; it stops when the gap is at
    most :math:`\tfrac12(\text{tol}\,\sigma)^2` times the number of weighted answers, so that the
    fitted answers are within ``tol`` noise standard deviations (root mean square) of the exact
    optimum's (:math:`\|A(V - V^*)\|^2 \le 2(f(V) - f^*)`). A step that merely moves little, as
    FISTA's steps do on an ill-conditioned Gram long before the optimum, does not stop it.
    """
    X = np.atleast_2d(np.asarray(X, dtype=float))
    k = X.shape[0]
    if weights is not None:
        weights = np.asarray(weights, dtype=float)
        if weights.shape != (k,) or not np.all(np.isfinite(weights)) or not np.all(weights > 0):
            raise ValueError(f"weights must be {k} positive finite numbers, one per row of X")
    w8 = np.ones(k) if weights is None else weights

    def inner(D: np.ndarray, E: np.ndarray) -> float:
        r""":math:`\sum_i w_i D_i^T E_i` over the columns ``i`` of two ``N x k`` arrays."""
        return float(np.einsum("ji,ji,i->", D, E, w8))

    v = project(X)
    L = largest_gram_eigenvalue(A) if gram_norm is None else float(gram_norm)
    if L == 0.0 or not v.any():
        return v
    L *= float(w8.max())
    G = _gram_operator(A) if gram is None else gram
    Gx = G @ X.T if target is None else np.asarray(target, dtype=float).reshape(X.shape[1], k)
    Gv = G @ v.T
    w, Gw, momentum = v, Gv, 1.0
    threshold = tol * noise_std * math.sqrt(A.shape[0] * k)
    change = math.inf  # stays so if no step ever descends
    bound = 0.5 * threshold**2
    if gap is not None and gap(v, ((Gv - Gx) * w8[None, :]).T) <= bound:
        return v
    for _ in range(maxiter):
        step = project(w - ((Gw - Gx) * w8[None, :]).T / L)
        G_step = G @ step.T
        D, dG = (step - v).T, G_step - Gv
        squared = inner(D, dG)  # the weighted squared norm of A(step - v)
        rise = 0.5 * squared + inner(D, Gv - Gx)  # f(step) - f(v), f(v) = sum_i w_i |A(v_i - x_i)|^2 / 2
        moved = math.sqrt(max(squared, 0.0))
        if rise > 0.0:  # no descent: drop the momentum; if a plain step fails, the step size was too long
            if w is v:
                if moved <= threshold and (gap is None or moved == 0.0):  # ... or v is stationary (rounding)
                    return v
                L *= 2.0
            w, Gw, momentum = v, Gv, 1.0
            continue
        change = moved
        following = (1.0 + math.sqrt(1.0 + 4.0 * momentum**2)) / 2.0
        beta = (momentum - 1.0) / following
        w, Gw = step + beta * D.T, G_step + beta * dG
        v, Gv, momentum = step, G_step, following
        if gap is not None:
            if gap(v, ((Gv - Gx) * w8[None, :]).T) <= bound:
                return v
        elif change <= threshold:
            return v
    warnings.warn(
        f"the non-negative projection stopped after {maxiter:,} steps with the last step moving the fitted "
        f"strategy answers by {change / math.sqrt(A.shape[0] * k) / noise_std:.3g} noise standard deviations "
        f"(RMS; target {tol:g}); the post-processed answers are valid but not fully optimised",
        RuntimeWarning,
        stacklevel=3,
    )
    return v


def nonnegative_least_squares(
    A: Matrix, estimate: np.ndarray, noise_std: float, tol: float = NONNEGATIVE_TOL, maxiter: int = NONNEGATIVE_MAXITER
) -> np.ndarray:
    r"""The non-negative data vector with the released total that best fits the measurements.

    .. math:: v = \arg\min_v \|A(v - \hat x)\|_2 \quad \text{s.t.} \quad v \ge 0,\;
              \textstyle\sum_j v_j = t = \max(\sum_j \hat x_j, 0),

    which is least squares on the noisy answers, :math:`\|Av - y\|^2 = \|A(v - \hat x)\|^2 +
    \text{const}`, restricted to valid data vectors. Measuring the distance through ``A`` (not
    cell by cell) moves the well-measured directions, and so the workload answers, far less than
    a Euclidean projection of :math:`\hat x` would: that one shifts and clips every noisy cell,
    which biases large aggregates of sparse cells badly. Solved by :func:`metric_projection`,
    projecting onto the constraints with :func:`project_nonnegative`.

    Raises
    ------
    ValueError
        If the estimate holds NaN or infinite values, or its sum overflows.
    """
    estimate = np.asarray(estimate, dtype=float)
    project_nonnegative(estimate)  # refuses a non-finite estimate
    t = max(float(np.sum(estimate)), 0.0)
    return metric_projection(A, estimate[None, :], lambda V: project_nonnegative(V[0], t)[None, :], noise_std,
                             tol, maxiter)[0]


def round_to_total(x: np.ndarray) -> np.ndarray:
    r"""Integers from non-negative ``x`` by largest-remainder rounding, keeping the rounded total.

    Every cell gets :math:`\lfloor x_j \rfloor`; the :math:`\mathrm{round}(\sum_j x_j) - \sum_j
    \lfloor x_j \rfloor` cells with the largest remainders :math:`x_j - \lfloor x_j \rfloor` get one
    more. Each cell moves by less than 1 and the total becomes the rounded total.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.any(x < 0):
        raise ValueError("largest-remainder rounding needs non-negative values; project them first")
    floor = np.floor(x)
    missing = int(round(float(np.sum(x)))) - int(np.sum(floor))
    if missing > 0:
        floor[np.argpartition(floor - x, missing - 1)[:missing]] += 1.0
    return floor
