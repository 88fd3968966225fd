r"""The root's non-negative cells, fitted to least squares through the workload.

The root of a top-down walk (:class:`hdmm.georelease.nonneg.TopDown`) has no parent to add up to, so
nothing ties its answers to least squares' but the metric of its projection. Through the strategy
alone, :math:`\min_{v\ge0}\|A_p(v - \hat x)\|`, a strategy that measures every cell (SF1's p-Identity)
clips the noise of the many empty cells, and that bias adds up in every wide query. This module fits
the root through the released queries :math:`W` instead, with the strategy's norm as a small tie-break:

.. math:: v^+ = \arg\min_{v \ge 0\ (,\ \mathbf 1^Tv = t)}\ f(v), \qquad
          f(v) = \tfrac12\|W(v - \hat x)\|_2^2 + \tfrac\mu2\|A_p(v - \hat x)\|_2^2,
          \qquad \mu = \tau\,\|W\|_2^2/\|A_p\|_2^2,

with the total :math:`t` only where it is held (an invariant). Without :math:`\tau`, :math:`f` is flat
along :math:`W`'s null space (SF1's 4,151 queries on 28,980 cells), where the cells still matter as
the parent of the next level; the strategy's norm settles them as the strategy-only projection would.

**What it guarantees.** The projection onto a closed convex set that holds the truth :math:`x` is
never further from it in the metric it is taken in, so whenever :math:`x \ge 0` (and
:math:`\mathbf 1^Tx = t`):

.. math:: \|W(v^+ - x)\|^2 + \mu\|A_p(v^+ - x)\|^2 \le \|W(\hat x - x)\|^2 + \mu\|A_p(\hat x - x)\|^2 .

The root's workload error is least squares' plus at most :math:`\tau` times a strategy term; the
tuning notes (benchmarks/results/tuning-notes.md) give the measured errors against least squares.

**How it is solved.** :math:`f` (scaled by :math:`1/\|W\|_2^2`) by L-BFGS-B (``scipy.optimize``) on
the bounds :math:`v \ge 0`, from the clipped least-squares cells; it stops on L-BFGS-B's relative
reduction test (``ROOT_FTOL``) or after ``ROOT_MAXITER`` steps (with a warning). A held total is
met by an augmented Lagrangian: L-BFGS-B on :math:`f(v) + \lambda(\mathbf 1^Tv - t) +
\tfrac\rho2(\mathbf 1^Tv - t)^2`, then :math:`\lambda \leftarrow \lambda + \rho(\mathbf 1^Tv - t)`,
warm-started, :math:`\rho` tenfold when the gap to :math:`t` does not fall fourfold; the last few
rounding units are placed by the Euclidean projection of the positive cells onto
:math:`\{v \ge 0, \mathbf 1^Tv = t\}` (:func:`hdmm.postprocess.project_nonnegative`), which moves them
by about that much.

>>> import numpy as np
>>> from hdmm.matrix import Explicit
>>> W = Explicit(np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]]))
>>> A = Explicit(np.eye(3))
>>> v = workload_projection(W, A, np.array([2.0, 1.5, -0.5]))
>>> bool(np.all(v >= 0)), np.round(W @ v, 1)  # the answers kept, the negative cell gone
(True, array([3., 2.]))
"""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy.optimize import minimize

from ..matrix import Matrix
from ..postprocess import NONNEGATIVE_MAXITER, largest_gram_eigenvalue, project_nonnegative

__all__ = ["workload_projection", "TIE_WEIGHT"]

#: :math:`\tau`, the strategy's norm against the workload's (each scaled by its largest eigenvalue).
TIE_WEIGHT = 0.03

#: L-BFGS-B stops when a step reduces the objective by less than this fraction of it ...
ROOT_FTOL = 1e-13

#: ... or after this many steps (with a warning; twice as many evaluations): the gradient method's limit.
ROOT_MAXITER = NONNEGATIVE_MAXITER

#: Augmented Lagrangian rounds for a held total at most; each is a warm-started L-BFGS-B solve.
ROUNDS = 30

#: A held total is met when the cells add up to it within this much (relative to the total, at least 1).
TOTAL_RTOL = 1e-9


def workload_projection(W: Matrix, A: Matrix, x: np.ndarray, total: float | None = None, *,
                        tie: float = TIE_WEIGHT, workload_norm: float | None = None,
                        strategy_norm: float | None = None, negligible: float = 0.0,
                        slack: float = 0.0) -> np.ndarray:
    r"""The non-negative cells (with the held ``total``, if given) closest to ``x`` in :math:`f` above.

    Parameters
    ----------
    W, A
        The released queries and the strategy, on the same cells as ``x``.
    x
        The least-squares cells (one vector).
    total
        The root's held total, or ``None`` (no total is imposed).
    tie
        :math:`\tau`, the weight of the strategy's norm.
    workload_norm, strategy_norm
        :math:`\|W\|_2^2` and :math:`\|A\|_2^2` when known (estimated otherwise).
    negligible, slack
        Cells below ``negligible`` are set to 0 (and the rest fitted again) if that raises
        :math:`\|W(v - \hat x)\|^2 + \mu\|A_p(v - \hat x)\|^2` by at most ``2 * slack``, which moves the
        fitted answers by at most :math:`\sqrt{2\,\text{slack}}` (:math:`f` is a squared distance in its
        metric): fewer non-zero cells make every family below the root smaller.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim != 1 or x.size != W.shape[1] or x.size != A.shape[1]:
        raise ValueError(f"x must be one vector of {W.shape[1]} cells (got shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot fit an estimate with NaN or infinite cells; the measured data must be finite counts")
    start = np.maximum(x, 0.0) if total is None else project_nonnegative(x, total)
    if total is not None and total <= 0:
        return start
    nw = largest_gram_eigenvalue(W) if workload_norm is None else float(workload_norm)
    na = largest_gram_eigenvalue(A) if strategy_norm is None else float(strategy_norm)
    if nw == 0.0:
        raise ValueError("the workload is all zeros: there is nothing to fit the root's cells to")
    mu = tie * nw / na if na > 0 else 0.0

    def f(v: np.ndarray) -> tuple[float, np.ndarray]:
        d = v - x
        g = (W.T @ (W @ d) + mu * (A.T @ (A @ d))) / nw
        return 0.5 * float(d @ g), g

    v = _lbfgsb(f, start) if total is None else _held_total(f, start, float(total))
    small = (v > 0) & (v < negligible)
    if slack > 0 and small.any():
        zeroed = np.where(small, 0.0, v)
        fixed = _lbfgsb(f, zeroed, small) if total is None else _held_total(f, zeroed, float(total), small)
        if f(fixed)[0] <= f(v)[0] + slack / nw:
            return fixed
    return v


def _lbfgsb(fun, start: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray:
    """``fun`` (value and gradient) minimized over the non-negative orthant (with the cells ``zero`` at 0) from
    ``start``."""
    bounds = [(0.0, None)] * start.size if zero is None else [(0.0, 0.0 if z else None) for z in zero.tolist()]
    res = minimize(fun, start, jac=True, method="L-BFGS-B", bounds=bounds,
                   options=dict(maxiter=ROOT_MAXITER, maxfun=2 * ROOT_MAXITER, ftol=ROOT_FTOL, gtol=0.0,
                                maxcor=20))
    if res.nit >= ROOT_MAXITER:
        warnings.warn(f"the root's non-negative projection through the workload stopped after {ROOT_MAXITER:,} "
                      "steps; the post-processed answers are valid but not fully optimised",
                      RuntimeWarning, stacklevel=3)
    return np.maximum(res.x, 0.0)


def _held_total(f, start: np.ndarray, total: float, zero: np.ndarray | None = None) -> np.ndarray:
    """:func:`workload_projection` with :math:`\\mathbf 1^Tv = t`: the augmented Lagrangian (module docstring)."""
    n = start.size
    rho, lam, v = 1.0 / n, 0.0, start  # rho * n: the size of f's Hessian after scaling
    target = TOTAL_RTOL * max(1.0, total)
    gap = math.inf
    for _ in range(ROUNDS):
        def fun(u: np.ndarray, lam=lam, rho=rho) -> tuple[float, np.ndarray]:
            value, grad = f(u)
            r = float(u.sum()) - total
            return value + lam * r + 0.5 * rho * r * r, grad + (lam + rho * r)
        v = _lbfgsb(fun, v, zero)
        r = float(v.sum()) - total
        if abs(r) <= target:
            break
        lam += rho * r
        if abs(r) > 0.25 * gap:
            rho *= 10.0
        gap = abs(r)
    else:
        warnings.warn(f"the root's cells missed their held total by {abs(r):.3g} after {ROUNDS} rounds; the "
                      "Euclidean projection onto the total placed the rest", RuntimeWarning, stacklevel=3)
    keep = v > 0  # the last rounding units on the cells in use: a shift of all of them would fill the zeros
    if not keep.any():
        keep = np.ones(v.size, dtype=bool) if zero is None else ~zero
    out = np.zeros_like(v)
    out[keep] = project_nonnegative(v[keep], total)
    return out
