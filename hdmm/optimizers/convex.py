r"""The optimal strategy under Gaussian noise: a convex program (docs/math.md, section 4; Yuan et al. 2016).

Under Gaussian noise (:math:`(\epsilon, \delta)`-DP or zCDP) a strategy ``A`` answers a workload
with Gram :math:`V = W^TW` with total squared error
:math:`\mathrm{Var}(1)\,\Delta_2(A)^2\,\mathrm{tr}((A^TA)^+ V)`. Scaling ``A`` changes nothing, so
fix unit column norms; with :math:`X = A^TA` the best strategy solves

.. math:: \min_X\; F(X) = \mathrm{tr}(X^{-1} V) \quad \text{s.t.}\quad \mathrm{diag}(X) = 1,\; X \succ 0,

a strictly convex program when :math:`V \succ 0`. A singular ``V`` is replaced by
:math:`V_\theta = V + \theta I` with a small :math:`\theta > 0` (reported), reached by continuation.

Newton step, in whitened coordinates
------------------------------------
Write :math:`X = R^TR` (Cholesky), :math:`\tilde V = R^{-T} V R^{-1} = U\,\mathrm{diag}(v)\,U^T`
(so :math:`F(X) = \mathrm{tr}\,\tilde V = \sum_k v_k`) and :math:`P = U^T R`, whose column
:math:`p_i` satisfies :math:`p_i^Tp_i = X_{ii}`. With :math:`Z = X^{-1}` and
:math:`M = Z V Z` the gradient is :math:`G = -M` and the Hessian acts as
:math:`H[D] = Z D M + M D Z` (Yuan et al., eq. 11). In the coordinates
:math:`D = P^T \hat E P` it is diagonal:

.. math:: \langle D, H[D]\rangle = 2\,\mathrm{tr}(D Z D M) = \sum_{kl} (v_k + v_l)\,\hat E_{kl}^2,
          \qquad \langle G, D\rangle = -\sum_k v_k \hat E_{kk}.

The Newton direction minimises the quadratic model subject to :math:`\mathrm{diag}(D) = 0`;
with multipliers :math:`\lambda` its optimality condition gives

.. math:: \hat E = \tfrac12 I + C \circ (P\,\mathrm{diag}(\lambda)\,P^T), \qquad
          C_{kl} = \frac{1}{v_k + v_l},

and the constraint becomes an ``n x n`` symmetric positive definite system

.. math:: S\lambda = -\tfrac12 \mathbf 1, \qquad
          (S\lambda)_i = p_i^T \big(C \circ (P\,\mathrm{diag}(\lambda)\,P^T)\big)\, p_i,

the Schur complement :math:`S = \mathrm{diag} \circ H^{-1} \circ \mathrm{Diag}`. It is solved by
conjugate gradients (two matrix products per step) preconditioned by its exact diagonal
:math:`S_{ii} = \sum_{kl} C_{kl} P_{ki}^2 P_{li}^2` and, if that is slow (nearly singular ``V``),
by the Cholesky factor of a model of ``S`` spectrally equivalent to it within a factor 1.76 (an
exponential-sum approximation of ``C``, see ``_schur_model``), warm started at
:math:`\lambda = -\mathrm{diag}(M)` (exact at the optimum, where :math:`M` is diagonal). This is
Yuan et al.'s Algorithm 2 (CG on the model with the diagonal held at zero) after an exact change of
variables that makes the Hessian diagonal: a handful of CG steps suffice where plain CG on
:math:`D` stalls. An inexact :math:`\lambda` leaves :math:`\mathrm{diag}(D) = r \ne 0`; the
diagonal is zeroed, which costs :math:`\|\mathrm{Diag}(r)\|_H^2 = 2\,r^T(Z\circ M)\,r` in the
Hessian norm, and CG runs until that is a small fraction of the Newton decrement. An Armijo
backtracking line search keeps :math:`X + \alpha D` positive definite (tested by Cholesky, whose
factor is reused by the next iteration).

Dual bound
----------
The Lagrangian :math:`\mathrm{tr}(X^{-1}V) + \sum_i y_i (X_{ii} - 1)` is minimised over
:math:`X \succ 0` by :math:`X Y X = V` (:math:`Y = \mathrm{diag}(y)`, :math:`y > 0`), giving
Yuan et al.'s Lemma 3 dual function
:math:`g(y) = 2\,\mathrm{tr}\big((Y^{1/2} V Y^{1/2})^{1/2}\big) - \sum_i y_i \le F(X)` for every
feasible ``X``. Maximising over the scale of ``y`` gives the scale-free bound

.. math:: h(y) = \max_{c > 0} g(c\,y)
          = \frac{\big(\sum_j \sqrt{\mu_j(Y^{1/2} V Y^{1/2})}\big)^2}{\sum_i y_i} \le \min F,

and :math:`h(\mathbf 1) = (\sum_j \sqrt{\mu_j(V)})^2 / n` is exactly the SVD bound (docs/math.md,
section 5), so the dual bound at the optimum is never below it. At the optimum
:math:`y_i = M_{ii} = -\lambda_i`; the solver evaluates ``h`` at :math:`y = \mathrm{diag}(M)`
of every iterate (and at :math:`-\lambda`, one Newton step ahead, when the gap is nearly
closed), a certified lower bound whose gap to ``F`` closes quadratically with the iterations.

Starting point (dual fixed point)
---------------------------------
For weights ``y`` the Lagrangian minimiser :math:`Y^{-1/2}(Y^{1/2}VY^{1/2})^{1/2}Y^{-1/2}`,
rescaled to unit diagonal, is a feasible ``X(y)``; ``X(1)`` is the rescaled :math:`V^{1/2}`,
optimal when :math:`V^{1/2}` has a constant diagonal. The optimum is the fixed point of
:math:`y \mapsto m(y) = \mathrm{diag}(M(X(y)))`. The damped iteration
:math:`y \leftarrow y\,(m(y)/y)^\omega`, with :math:`\omega` set by a scalar secant model, costs
one eigendecomposition per step (which also gives :math:`h(y)`), a fraction of a Newton step; it
runs while it lowers the objective and at least halves the gap, and Newton takes over from its
best iterate. On Prefix and AllRange up to ``n = 2048`` it reaches ``tol`` by itself.

Singular workloads (continuation)
---------------------------------
``V`` counts as singular when its smallest eigenvalue is below ``1e-10`` of its largest; the
default target is then :math:`\theta = 10^{-8}\,\mathrm{tr}(V)/n`, whose cost on ``V`` itself
is reported (``original_objective``) and certified (``original_dual_bound``). Near
:math:`\theta = 0` the optimum of a singular ``V`` has eigenvalues of order
:math:`\sqrt\theta` in the null space of ``V``, and Newton's method started far away from it
crawls. The solver follows the central path instead: :math:`\theta_j = 10^{-3}\bar e\,
10^{-j/2}` (:math:`\bar e = \mathrm{tr}(V)/n`) down to the target, Newton steps until one is a
full step (at most three) per stage, each stage warm started by linear extrapolation of the path
in :math:`\sqrt{\theta}` (along which the small eigenvalues move linearly), then Newton to
convergence at the target. (The fixed-point iteration is no help here: rescaling to unit
diagonal mixes the range and the null space of ``V``.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.linalg as la
from numpy.typing import ArrayLike

from ..matrix import Explicit, Matrix

__all__ = [
    "ConvexProgress",
    "ConvexResult",
    "dual_bound",
    "gaussian_error",
    "solve_convex",
]

#: ``V`` is treated as singular when its smallest eigenvalue is below this fraction of its largest.
SINGULAR_TOL = 1e-10
#: Default regularisation of a singular ``V``, as a fraction of its mean eigenvalue ``tr(V)/n``.
DEFAULT_THETA = 1e-8
#: First continuation stage, as a fraction of the mean eigenvalue.
THETA_START = 1e-3
#: Ratio between consecutive continuation stages.
THETA_RATIO = math.sqrt(10.0)
#: Largest condition number of ``V + theta I`` for which the dual bound uses eigenvalues (else singular values).
ACCURATE_COND = 1e8
#: Armijo sufficient-decrease constant.
ARMIJO = 1e-4
#: Largest number of step halvings in the line search.
MAX_HALVINGS = 40
#: Also try the dual bound at the Newton multipliers once the gap is within this factor of ``tol``.
CLOSE = 1e3
#: Largest number of dual fixed-point steps in the starting phase.
FIXED_POINT_STEPS = 12
#: First step length of the fixed-point iteration (1 overshoots on some workloads, e.g. Prefix(2048)).
FIXED_POINT_WEIGHT = 0.7
#: The fixed-point phase stops once a step shrinks the duality gap by less than this factor.
FIXED_POINT_RATE = 0.5
#: CG iterations preconditioned by the diagonal before switching to the Schur model.
JACOBI_STEPS = 10
#: Largest number of Newton steps spent on one intermediate continuation stage.
STAGE_STEPS = 3


@dataclass(frozen=True)
class ConvexProgress:
    r"""What the solver reports to ``callback`` after every Newton step.

    Attributes
    ----------
    iteration : int
        Newton iterations so far (all stages).
    theta : float
        Regularisation of the current stage.
    objective : float
        :math:`F(X) = \mathrm{tr}(X^{-1}(V + \theta I))` before the step.
    decrement : float
        Squared Newton decrement :math:`-\langle G, D\rangle` of the step.
    step : float
        Accepted step length.
    cg_iterations : int
        Conjugate-gradient iterations spent on the direction.
    dual_bound : float or None
        Best certified lower bound so far (``None`` before the final stage).
    """

    iteration: int
    theta: float
    objective: float
    decrement: float
    step: float
    cg_iterations: int
    dual_bound: float | None


@dataclass(frozen=True)
class ConvexResult:
    r"""The optimal Gaussian-noise strategy for one workload Gram, with its certificate.

    Attributes
    ----------
    X : numpy.ndarray
        The optimal Gram :math:`A^TA` (unit diagonal, positive definite).
    strategy : Explicit
        The upper Cholesky factor ``R`` of ``X`` (``R^T R = X``): unit L2 columns, so its L2
        sensitivity is 1.
    objective : float
        :math:`F(X) = \mathrm{tr}(X^{-1}(V + \theta I))`, the value of the program solved.
    original_objective : float
        :math:`\mathrm{tr}(X^{-1} V)` on the workload itself; the total squared error of
        ``strategy`` is ``Var(1) * original_objective``.
    dual_bound : float
        Certified lower bound :math:`h(y) \le \min F` for the program solved.
    original_dual_bound : float
        The same bound for ``V`` itself (:math:`\theta = 0`): no strategy has a smaller
        ``tr(X^+ V)``.
    gap : float
        ``objective - dual_bound``.
    relative_gap : float
        ``gap / objective``.
    svd_bound : float
        :math:`(\sum_j \sqrt{\mu_j(V)})^2 / n` (eigenvalues below ``n * eps`` of the largest
        count as 0): every feasible objective is at least this much, and so is ``dual_bound``
        once converged (``original_dual_bound`` too, up to the effect of ``theta``).
    iterations : int
        Newton iterations, over all continuation stages.
    fixed_point_steps : int
        Dual fixed-point steps taken to build the starting point (see ``solve_convex``).
    theta : float
        The regularisation :math:`\theta` added to ``V`` (0 when ``V`` is nonsingular).
    converged : bool
        Whether ``relative_gap <= tol``.
    """

    X: np.ndarray
    strategy: Explicit
    objective: float
    original_objective: float
    dual_bound: float
    original_dual_bound: float
    gap: float
    relative_gap: float
    svd_bound: float
    iterations: int
    fixed_point_steps: int
    theta: float
    converged: bool


# ====================================================================== public helpers
def dual_bound(V: ArrayLike, y: ArrayLike) -> float:
    r"""Certified lower bound :math:`h(y)` on :math:`\min \{\mathrm{tr}(X^+ V) : \mathrm{diag}(X) = 1\}`.

    .. math:: h(y) = \frac{\big(\sum_j \sqrt{\mu_j(Y^{1/2} V Y^{1/2})}\big)^2}{\sum_i y_i},
              \qquad Y = \mathrm{diag}(y),

    the Lagrange dual function :math:`g(y) = 2\,\mathrm{tr}((Y^{1/2}VY^{1/2})^{1/2}) - \sum y`
    maximised over the scale of ``y``. Valid for every ``y >= 0`` with a positive sum;
    ``h(ones(n))`` is the SVD bound.

    Parameters
    ----------
    V
        Symmetric positive semidefinite ``n x n`` workload Gram.
    y
        Nonnegative weights, one per cell, not all zero.
    """
    V = _check_gram(V)
    e, Q = la.eigh(V, check_finite=False)
    e = _check_spectrum(e)
    y = np.asarray(y, dtype=float)
    if y.shape != (V.shape[0],) or not np.all(np.isfinite(y)) or np.any(y < 0) or not y.sum() > 0:
        raise ValueError(f"y must be {V.shape[0]} finite nonnegative weights with a positive sum")
    return _certifier(V, e, Q, 0.0)(y)


def gaussian_error(V: ArrayLike, X: ArrayLike) -> float:
    r"""Gaussian-noise error, in units of ``Var(1)``, of any strategy ``A`` with Gram ``X = A^TA``.

    .. math:: \Delta_2(A)^2\,\mathrm{tr}(X^+ V) = \max_i X_{ii}\;\mathrm{tr}(X^+ V),

    which is :math:`\mathrm{tr}(X^+ V)` for a unit-diagonal ``X``. The total squared error of
    ``A`` on a workload with Gram ``V`` is ``Var(1) * gaussian_error(V, X)``; ``inf`` when ``V``
    has weight outside the range of ``X`` (the strategy does not support the workload).

    Parameters
    ----------
    V
        Symmetric positive semidefinite ``n x n`` workload Gram.
    X
        Symmetric positive semidefinite ``n x n`` strategy Gram.
    """
    V = _check_gram(V)
    X = _check_gram(X, name="X")
    if X.shape != V.shape:
        raise ValueError(f"X has shape {X.shape} but V has shape {V.shape}")
    _check_spectrum(la.eigh(V, eigvals_only=True, check_finite=False))
    omega, W = la.eigh(X, check_finite=False)
    omega = _check_spectrum(omega, name="X")
    keep = omega > X.shape[0] * np.finfo(float).eps * omega[-1]
    Wk = W[:, keep]
    inside = np.einsum("ij,ij->j", Wk, V @ Wk)  # w_j^T V w_j over the range of X
    if np.trace(V) - inside.sum() > 1e-9 * np.trace(V):
        return math.inf
    return float(np.max(np.diag(X)) * np.sum(inside / omega[keep]))


# ====================================================================== solver
def solve_convex(
    V: ArrayLike | Matrix,
    *,
    tol: float = 1e-8,
    max_iter: int = 100,
    cg_iter: int = 20,
    theta: float | None = None,
    X0: ArrayLike | None = None,
    callback: Callable[[ConvexProgress], None] | None = None,
) -> ConvexResult:
    r"""Optimal strategy Gram :math:`X` for workload Gram ``V`` under Gaussian noise.

    Solves :math:`\min \mathrm{tr}(X^{-1}(V + \theta I))` s.t. :math:`\mathrm{diag}(X) = 1`,
    :math:`X \succ 0` by Newton's method (see the module docstring) and certifies the result
    with the dual bound.

    Parameters
    ----------
    V
        The workload Gram :math:`W^TW`: a dense symmetric positive semidefinite ``n x n``
        array (or an hdmm matrix, made dense), e.g. ``hdmm.Prefix(n).gram().dense()``.
    tol
        Stop when the relative duality gap ``(F - h) / F`` is at most ``tol``.
    max_iter
        Largest total number of Newton iterations.
    cg_iter
        Largest number of conjugate-gradient iterations per Newton direction.
    theta
        Regularisation added to the diagonal of ``V``. ``None``: 0 when ``V`` is nonsingular,
        else ``1e-8 * tr(V) / n``. ``0`` is refused for a singular ``V``.
    X0
        Starting Gram (symmetric positive definite; rescaled to unit diagonal). Default: the
        dual fixed-point start from the rescaled :math:`(V + \theta I)^{1/2}`, followed by
        continuation in :math:`\theta` when ``V`` is singular. A given ``X0`` is used directly
        at the target :math:`\theta` (no continuation), so it should be close, e.g. a previous
        solution.
    callback
        Called with a :class:`ConvexProgress` after every Newton step.

    Returns
    -------
    ConvexResult
        The optimum, its Cholesky factor as the strategy, objective, dual bound and gap.

    Raises
    ------
    ValueError
        For a ``V`` that is not a finite symmetric positive semidefinite nonzero square matrix,
        an invalid ``X0``, ``theta``, ``tol``, ``max_iter`` or ``cg_iter``, or ``theta = 0``
        with a singular ``V``.
    """
    V = _check_gram(V.dense() if isinstance(V, Matrix) else V)
    n = V.shape[0]
    if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r}")
    for name, value in (("max_iter", max_iter), ("cg_iter", cg_iter)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    e, Q = la.eigh(V, check_finite=False)
    e = _check_spectrum(e)
    mean_e = float(e.sum()) / n
    singular = e[0] <= SINGULAR_TOL * e[-1]
    target = _target_theta(theta, singular, int(np.sum(e <= SINGULAR_TOL * e[-1])), mean_e)
    schedule = [target] if X0 is not None or not singular else _schedule(target, mean_e)
    factor = Q * np.sqrt(e + schedule[0])  # V + theta I = factor @ factor.T
    if X0 is None:
        start = _dual_start(V + schedule[0] * np.eye(n), factor, tol)
    else:
        point = _Point.at(_check_start(X0, n), factor)
        if point is None:
            raise ValueError("X0 is not positive definite")
        start = _Outcome(point, 0, -math.inf, None)
    point = start.point

    iterations = 0
    path: list[tuple[float, np.ndarray]] = []  # solved (theta, X) of the last two stages
    for th in schedule[:-1]:
        if iterations >= max_iter:
            break
        factor = Q * np.sqrt(e + th)
        if path:
            point = _predict(path, point, th, factor)
        outcome = _newton(point, factor, th, tol, min(STAGE_STEPS, max_iter - iterations),
                          cg_iter, iterations, callback, None)
        iterations += outcome.steps
        point = outcome.point
        path = [*path[-1:], (th, point.X)]
    certify = _certifier(V, e, Q, target)
    if len(schedule) == 1:
        trusted = (start.bound, start.y) if X0 is None and _well_conditioned(e, target) else (-math.inf, None)
        outcome = _newton(point, factor, target, tol, max_iter, cg_iter, 0, callback, certify, *trusted)
    else:
        factor = Q * np.sqrt(e + target)
        point = _predict(path, point, target, factor)
        outcome = _newton(point, factor, target, tol, max_iter - iterations, cg_iter, iterations, callback,
                          certify)
    iterations += outcome.steps
    point = outcome.point
    original = point.f if target == 0 else _Point(point.X, point.R, Q * np.sqrt(e)).f
    original_bound = outcome.bound if target == 0 else _certifier(V, e, Q, 0.0)(outcome.y)
    gap = point.f - outcome.bound
    return ConvexResult(
        X=point.X,
        strategy=Explicit(point.R),
        objective=point.f,
        original_objective=original,
        dual_bound=outcome.bound,
        original_dual_bound=original_bound,
        gap=gap,
        relative_gap=gap / point.f,
        svd_bound=float(np.sqrt(e[e > n * np.finfo(float).eps * e[-1]]).sum()) ** 2 / n,
        iterations=iterations,
        fixed_point_steps=start.steps,
        theta=target,
        converged=bool(gap <= tol * point.f),
    )


# ====================================================================== internals
def _check_gram(V: ArrayLike, name: str = "V") -> np.ndarray:
    """Validate a finite real symmetric square matrix; return it symmetrised, as float."""
    try:
        V = np.array(V, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a real square matrix: {exc}") from None
    if V.ndim != 2 or V.shape[0] != V.shape[1] or V.shape[0] == 0:
        raise ValueError(f"{name} must be a nonempty square matrix, got shape {V.shape}")
    if not np.all(np.isfinite(V)):
        raise ValueError(f"{name} has NaN or infinite entries")
    asym = float(np.abs(V - V.T).max())
    if asym > 1e-8 * float(np.abs(V).max()):
        raise ValueError(f"{name} is not symmetric (max |{name} - {name}^T| = {asym:.3g})")
    return (V + V.T) / 2


def _check_spectrum(e: np.ndarray, name: str = "V") -> np.ndarray:
    """Check that ascending eigenvalues ``e`` are those of a nonzero PSD matrix; clip rounding negatives."""
    top = max(float(e[-1]), 0.0)
    if e[0] < -1e-10 * len(e) * top or top == 0:
        what = "zero" if top == 0 else f"not positive semidefinite (smallest eigenvalue {e[0]:.3g})"
        raise ValueError(f"{name} is {what}")
    return np.clip(e, 0.0, None)


def _target_theta(theta: float | None, singular: bool, nullity: int, mean_e: float) -> float:
    """The regularisation of the program to solve (see ``solve_convex``)."""
    if theta is None:
        return DEFAULT_THETA * mean_e if singular else 0.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not (math.isfinite(theta) and theta >= 0):
        raise ValueError(f"theta must be a finite number >= 0 or None, got {theta!r}")
    if theta == 0 and singular:
        raise ValueError(
            f"V is singular (about {nullity} zero eigenvalues): the program needs theta > 0; "
            "pass theta=None for the default or a small positive theta"
        )
    return float(theta)


def _schedule(target: float, mean_e: float) -> list[float]:
    r"""Continuation stages :math:`\theta_j = \theta_0 / \rho^j` above ``target``, then ``target``.

    :math:`\theta_0` is ``THETA_START`` times the mean eigenvalue ``mean_e`` and
    :math:`\rho` = ``THETA_RATIO``.
    """
    stages = []
    th = THETA_START * mean_e
    while th > target * THETA_RATIO:
        stages.append(th)
        th /= THETA_RATIO
    return stages + [target]


def _check_start(X0: ArrayLike, n: int) -> np.ndarray:
    """Validate a user start and rescale it to unit diagonal."""
    X = np.array(X0, dtype=float)
    if X.shape != (n, n) or not np.all(np.isfinite(X)):
        raise ValueError(f"X0 must be a finite {n} x {n} matrix, got shape {X.shape}")
    if np.abs(X - X.T).max() > 1e-8 * max(float(np.abs(X).max()), np.finfo(float).tiny):
        raise ValueError("X0 is not symmetric")
    d = np.diag(X)
    if np.any(d <= 0):
        raise ValueError("X0 is not positive definite (nonpositive diagonal)")
    s = 1.0 / np.sqrt(d)
    X = (X + X.T) / 2 * np.outer(s, s)
    np.fill_diagonal(X, 1.0)
    return X


def _dual_start(V_theta: np.ndarray, factor: np.ndarray, tol: float) -> _Outcome:
    r"""Starting point by the dual fixed-point iteration :math:`y \leftarrow y\,(\mathrm{diag}(M(X(y))) / y)^\omega`.

    For dual weights ``y`` the Lagrangian is minimised by :math:`Y^{-1/2} K^{1/2} Y^{-1/2}` with
    :math:`K = Y^{1/2} V_\theta Y^{1/2}`; its unit-diagonal rescaling
    :math:`X(y) = \mathrm{diag}(K^{1/2})^{-1/2}\, K^{1/2}\, \mathrm{diag}(K^{1/2})^{-1/2}` is
    feasible, and the same eigendecomposition of ``K`` gives the dual bound :math:`h(y)` for free.
    ``y = 1`` gives the rescaled square root of :math:`V_\theta` (optimal when its diagonal is
    constant); the optimum is the fixed point :math:`y = m(y) = \mathrm{diag}(X^{-1}V_\theta X^{-1})`.

    A step :math:`y \leftarrow y\,e^{\omega r}`, :math:`r = \log(m(y) / y)`, costs one
    eigendecomposition, a fraction of a Newton iteration. The plain iteration (:math:`\omega = 1`)
    overshoots on some workloads (Prefix(2048) diverges), so :math:`\omega` starts at
    ``FIXED_POINT_WEIGHT`` and follows a scalar secant model: if the last step multiplied the
    residual by :math:`c = \langle r_{k+1}, r_k\rangle / \|r_k\|^2`, the step
    :math:`\omega / (1 - c)` would cancel it (clipped to :math:`[\tfrac12, 2]`; ``1/2`` when
    :math:`c \ge 1`). The iteration is not a contraction in general, so it stops at the first step
    that does not lower the objective or shrinks the gap by less than ``FIXED_POINT_RATE``
    (Newton is then cheaper), at ``tol``, or after ``FIXED_POINT_STEPS`` steps, and returns the
    best iterate, the best bound and its weights.
    """
    y = np.ones(V_theta.shape[0])
    best: _Point | None = None
    best_bound, best_y, steps, gap, weight = -math.inf, y, 0, math.inf, FIXED_POINT_WEIGHT
    residual: np.ndarray | None = None
    while True:
        s = np.sqrt(y)
        mu, U = la.eigh(V_theta * np.outer(s, s), driver="evd", check_finite=False)
        mu = np.clip(mu, 0.0, None)
        bound = float(np.sqrt(mu).sum()) ** 2 / float(y.sum())
        if bound > best_bound:
            best_bound, best_y = bound, y
        half = U * mu**0.25
        root = half @ half.T  # K^{1/2}
        scale = 1.0 / np.sqrt(np.diag(root))
        X = root * np.outer(scale, scale)
        X = (X + X.T) / 2
        np.fill_diagonal(X, 1.0)
        point = _Point.at(X, factor)
        if point is None or (best is not None and point.f >= best.f):
            if best is None:
                raise ValueError("V + theta I is too ill-conditioned for a positive definite start; "
                                 "increase theta")
            break
        best = point
        previous, gap = gap, (point.f - best_bound) / point.f
        if gap <= tol or gap > FIXED_POINT_RATE * previous or steps == FIXED_POINT_STEPS:
            break
        new_residual = np.log(point.diag_m / y)
        if residual is not None:
            ratio = float(new_residual @ residual) / float(residual @ residual)
            weight = min(max(weight / (1.0 - ratio), 0.5), 2.0) if ratio < 1 else 0.5
        residual = new_residual
        y = y * np.exp(weight * residual)
        steps += 1
    return _Outcome(best, steps, best_bound, best_y)


def _predict(path: list[tuple[float, np.ndarray]], point: _Point, theta: float, factor: np.ndarray) -> _Point:
    r"""Warm start for the stage at ``theta``: the path extrapolated linearly in :math:`\sqrt\theta`.

    From the last solved stages :math:`(\theta_a, X_a), (\theta_b, X_b)` the prediction is
    :math:`X_b + (X_b - X_a)\,(\sqrt{\theta} - \sqrt{\theta_b}) / (\sqrt{\theta_b} -
    \sqrt{\theta_a})` (unit diagonal, as both points have one). It replaces ``point`` (which is
    :math:`X_b`) only when it is positive definite with a smaller objective at ``theta``.
    """
    here = _Point.at(point.X, factor)
    if len(path) < 2:
        return here
    (ta, Xa), (tb, Xb) = path
    ratio = (math.sqrt(theta) - math.sqrt(tb)) / (math.sqrt(tb) - math.sqrt(ta))
    guess = _Point.at(Xb + (Xb - Xa) * ratio, factor)
    return guess if guess is not None and guess.f < here.f else here


class _Point:
    r"""A feasible iterate :math:`X = R^TR` with :math:`C = R^{-T}B` and :math:`F = \|C\|_F^2`.

    ``B`` is a square root of :math:`V_\theta` (:math:`BB^T = V_\theta`), so
    :math:`F(X) = \mathrm{tr}(R^{-1}R^{-T}BB^T) = \|R^{-T}B\|_F^2` and the whitened Gram is
    :math:`\tilde V = CC^T`. With :math:`L = R^{-1}C` the (negative) gradient is
    :math:`M = X^{-1}V_\theta X^{-1} = LL^T`.
    """

    __slots__ = ("X", "R", "C", "f", "_L")

    def __init__(self, X: np.ndarray, R: np.ndarray, factor: np.ndarray):
        self.X = X
        self.R = R
        self.C = la.solve_triangular(R, factor, trans="T", check_finite=False)
        self.f = float(np.einsum("ij,ij->", self.C, self.C))
        self._L: np.ndarray | None = None

    @classmethod
    def at(cls, X: np.ndarray, factor: np.ndarray) -> _Point | None:
        """The iterate at ``X``, or ``None`` when ``X`` is not positive definite."""
        try:
            R = la.cholesky(X, lower=False, check_finite=False)
        except la.LinAlgError:
            return None
        return cls(X, R, factor)

    @property
    def L(self) -> np.ndarray:
        r""":math:`L = R^{-1}R^{-T}B`, a square root of :math:`M = X^{-1}V_\theta X^{-1}`."""
        if self._L is None:
            self._L = la.solve_triangular(self.R, self.C, check_finite=False)
        return self._L

    @property
    def diag_m(self) -> np.ndarray:
        r""":math:`\mathrm{diag}(M)`: the dual weights read off this iterate (exact at the optimum)."""
        return np.einsum("ij,ij->i", self.L, self.L)


@dataclass
class _Outcome:
    """Result of a run of Newton iterations at one ``theta``."""

    point: _Point
    steps: int
    bound: float
    y: np.ndarray | None  # dual weights attaining ``bound`` (None while there is no bound)


def _newton(
    point: _Point,
    factor: np.ndarray,
    theta: float,
    tol: float,
    max_steps: int,
    cg_iter: int,
    done: int,
    callback: Callable[[ConvexProgress], None] | None,
    certify: Callable[[np.ndarray], float] | None,
    bound: float = -math.inf,
    y: np.ndarray | None = None,
) -> _Outcome:
    r"""Newton iterations at fixed ``theta``, starting from ``point``.

    Without ``certify`` (an intermediate continuation stage) it stops after its first full step
    or ``max_steps`` steps. The final stage certifies every iterate with the dual bound
    ``certify(y)`` at :math:`y = \mathrm{diag}(M)` (keeping the best bound so far, starting from
    ``bound`` at ``y``) and stops when the relative gap is at most ``tol``, when the Newton
    decrement falls to rounding level, when the line search fails, or after ``max_steps`` steps.
    """
    steps = 0
    eta = 0.1
    while True:
        if certify is not None:
            if point.f - bound > tol * point.f:
                candidate = certify(point.diag_m)
                if candidate > bound:
                    bound, y = candidate, point.diag_m
            if point.f - bound <= tol * point.f or steps >= max_steps:
                return _Outcome(point, steps, bound, y)
        direction = _direction(point, eta, cg_iter)
        if certify is not None and point.f - bound <= CLOSE * tol * point.f and np.all(direction.lam < 0):
            # nearly certified: the multipliers, one Newton step ahead, may close the gap
            ahead = certify(-direction.lam)
            if ahead > bound:
                bound, y = ahead, -direction.lam
                if point.f - bound <= tol * point.f:
                    return _Outcome(point, steps, bound, y)
        if direction.decrement <= 1e-3 * tol * point.f:
            return _Outcome(point, steps, bound, y)
        new = _line_search(point, direction, factor)
        if new is None:
            return _Outcome(point, steps, bound, y)
        if callback is not None:
            callback(ConvexProgress(done + steps + 1, theta, point.f, direction.decrement, new[1],
                                    direction.cg_iterations, None if certify is None else bound))
        point = new[0]
        steps += 1
        if certify is None and (new[1] == 1.0 or steps >= max_steps):
            return _Outcome(point, steps, bound, y)
        eta = min(0.1, math.sqrt(direction.decrement / point.f))


@dataclass
class _Direction:
    r"""A Newton direction ``D`` (zero diagonal) with its squared decrement :math:`-\langle G, D\rangle`."""

    D: np.ndarray
    decrement: float
    lam: np.ndarray  # multipliers of diag(D) = 0; -> -diag(M) at the optimum
    cg_iterations: int


def _direction(point: _Point, eta: float, cg_iter: int) -> _Direction:
    r"""Newton direction by preconditioned CG on the Schur system :math:`S\lambda = -\tfrac12\mathbf 1`.

    CG starts at :math:`\lambda = -\mathrm{diag}(M)` and stops once the Hessian-norm cost of
    zeroing the residual diagonal, :math:`2 r^T (Z \circ M) r`, is at most :math:`\eta^2` times
    the decrement estimate :math:`\sum_k v_k \hat E_{kk}`, or after ``cg_iter`` iterations. It is
    preconditioned by the diagonal of ``S`` for ``JACOBI_STEPS`` iterations, then (the system is
    ill conditioned, typically when ``V`` is nearly singular) restarted with the Cholesky factor
    of the model :func:`_schur_model`.
    """
    n = point.X.shape[0]
    v, U = la.eigh(point.C @ point.C.T, driver="evd", check_finite=False)  # whitened V
    v = np.maximum(v, np.finfo(float).eps * max(v[-1], np.finfo(float).tiny))
    P = U.T @ point.R  # column p_i: p_i^T p_i = X_ii
    Cw = 1.0 / (v[:, None] + v[None, :])
    P2 = P * P
    jacobi = 1.0 / np.einsum("ki,ki->i", P2, Cw @ P2)  # 1 / S_ii
    Rinv = la.lapack.dtrtri(point.R, lower=0)[0]
    ZM = (Rinv @ Rinv.T) * (point.L @ point.L.T)  # Z o M, Z = X^-1 = R^-1 R^-T
    diag_m = point.diag_m

    def schur(lam: np.ndarray) -> np.ndarray:
        return np.einsum("ki,ki->i", P, (Cw * ((P * lam) @ P.T)) @ P)

    def decrement(lam: np.ndarray) -> float:
        # sum_k v_k E_kk with E_kk = 1/2 + (sum_i lam_i P_ki^2) / (2 v_k)
        return float(np.sum(v) + np.sum(P2 @ lam)) / 2

    def precondition(r: np.ndarray) -> np.ndarray:
        return jacobi * r

    lam = -diag_m
    r = -0.5 - schur(lam)
    z = precondition(r)
    p = z.copy()
    rz = float(r @ z)
    iterations = 0
    while iterations < cg_iter and 2.0 * float(r @ ZM @ r) > eta**2 * max(decrement(lam), 0.0):
        if iterations == JACOBI_STEPS:
            model = la.cho_factor(_schur_model(P, v), check_finite=False)

            def precondition(r: np.ndarray) -> np.ndarray:
                return la.cho_solve(model, r, check_finite=False)

            z = precondition(r)
            p = z.copy()
            rz = float(r @ z)
        Sp = schur(p)
        curvature = float(p @ Sp)
        if not curvature > 0:
            break
        step = rz / curvature
        lam = lam + step * p
        r = r - step * Sp
        z = precondition(r)
        rz_new = float(r @ z)
        p = z + (rz_new / rz) * p
        rz = rz_new
        iterations += 1
    E = Cw * ((P * lam) @ P.T)
    E[np.diag_indices(n)] += 0.5
    D = P.T @ (E @ P)
    D = (D + D.T) / 2
    resid = np.diag(D).copy()  # the CG residual diagonal, zeroed below
    np.fill_diagonal(D, 0.0)
    # -<G, D> = <M, D> = sum_k v_k E_kk - sum_i M_ii resid_i
    return _Direction(D, float(v @ np.diag(E) - diag_m @ resid), lam, iterations)


def _schur_model(P: np.ndarray, v: np.ndarray) -> np.ndarray:
    r"""A spectrally equivalent model of the Schur matrix ``S``, formed in ``O(n^3 \log \kappa)``.

    :math:`\lambda^T S \lambda = \sum_{kl} C_{kl} (P\Lambda P^T)_{kl}^2` weighs squared entries by
    :math:`C_{kl} = 1/(v_k + v_l) > 0`, so replacing ``C`` by a :math:`\tilde C` within a factor
    :math:`[a, b]` of it entrywise gives a model with condition number ``b / a`` relative to
    ``S``. With :math:`1/x = \int_{-\infty}^{\infty} e^{s - x e^s}\, ds` discretised by the
    trapezoidal rule (step ``h = 3``, nodes :math:`t_q = e^{s_q}` covering the spectrum of
    :math:`v_k + v_l`), :math:`\tilde C_{kl} = \sum_q h\,t_q\, e^{-t_q v_k} e^{-t_q v_l}` is
    within :math:`[0.72, 1.27]` of ``C`` and separable, so

    .. math:: \tilde S = \sum_q h\,t_q\, T_q \circ T_q, \qquad T_q = P^T e^{-t_q \mathrm{diag}(v)} P,

    one symmetric product per node, about ``(log(v_max / v_min) + 7) / 3`` of them.
    """
    h = 3.0
    lo, hi = 2.0 * v[0], 2.0 * v[-1]
    model = np.zeros((P.shape[1], P.shape[1]))
    for s in np.arange(math.log(1e-2 / hi), math.log(8.0 / lo) + h, h):
        t = math.exp(s)
        G = P * np.exp(-0.5 * t * v)[:, None]
        T = G.T @ G
        model += (h * t) * (T * T)
    return model


def _line_search(point: _Point, direction: _Direction, factor: np.ndarray) -> tuple[_Point, float] | None:
    r"""Armijo backtracking: the first :math:`\alpha = 2^{-k}` with :math:`X + \alpha D \succ 0` and
    :math:`F(X + \alpha D) \le F(X) - 10^{-4}\,\alpha\,\delta^2`; ``None`` if there is none
    (or ``D`` is not a descent direction)."""
    if not direction.decrement > 0:
        return None
    alpha = 1.0
    for _ in range(MAX_HALVINGS):
        X = point.X + alpha * direction.D
        np.fill_diagonal(X, 1.0)
        new = _Point.at(X, factor)
        if new is not None and new.f <= point.f - ARMIJO * alpha * direction.decrement:
            return new, alpha
        alpha /= 2
    return None


def _well_conditioned(e: np.ndarray, theta: float) -> bool:
    r"""Whether the eigenvalues of :math:`Y^{1/2}(V + \theta I)Y^{1/2}` can be trusted to the bound's accuracy."""
    return e[-1] + theta <= ACCURATE_COND * (e[0] + theta)


def _certifier(V: np.ndarray, e: np.ndarray, Q: np.ndarray, theta: float) -> Callable[[np.ndarray], float]:
    r"""The dual bound :math:`y \mapsto h(y)` for :math:`V_\theta = V + \theta I = Q\,\mathrm{diag}(e + \theta)\,Q^T`.

    :math:`\sqrt{\mu_j}` are the singular values of :math:`Y^{1/2}B` for any
    :math:`BB^T = V_\theta`. When :math:`V_\theta` is well conditioned they come from the
    eigenvalues of :math:`Y^{1/2}V_\theta Y^{1/2}` (fast); otherwise from the singular values of
    :math:`Y^{1/2}Q\,\mathrm{diag}(\sqrt{e+\theta})`, which keeps the tiny ones accurate (an
    eigenvalue solver returns them with absolute error :math:`\epsilon\,\mu_{max}`, so their
    square roots, and a bound meant to certify a gap of ``1e-8``, would be off by
    :math:`\sqrt{\epsilon\,\mu_{max}}` each).
    """
    if _well_conditioned(e, theta):
        V_theta = V + theta * np.eye(len(e))

        def roots(s: np.ndarray) -> np.ndarray:
            mu = la.eigh(V_theta * np.outer(s, s), eigvals_only=True, driver="evd", check_finite=False)
            return np.sqrt(np.clip(mu, 0.0, None))
    else:
        factor = Q * np.sqrt(e + theta)

        def roots(s: np.ndarray) -> np.ndarray:
            return la.svdvals(s[:, None] * factor, check_finite=False)

    def bound(y: np.ndarray) -> float:
        return float(roots(np.sqrt(y)).sum()) ** 2 / float(y.sum())

    return bound
