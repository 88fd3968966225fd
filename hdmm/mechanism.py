r"""The matrix mechanism's least-squares reconstruction (docs/math.md, sections 1 and 7).

For a data vector :math:`x` (length ``N``) and a strategy :math:`A` (``k x N``),

.. math:: y = Ax + z, \qquad \hat x = A^+ y = \arg\min_{x} \|Ax - y\|_2 \;(\text{minimum norm}),

where :math:`z` is i.i.d. Laplace noise of scale :math:`b = \Delta_1(A)/\epsilon` (pure DP) or
Gaussian noise calibrated to :math:`\Delta_2(A)` (:mod:`hdmm.privacy`). Any workload ``W`` whose
rows lie in the row space of ``A`` (:math:`WA^+A = W`) is then answered without bias by
:math:`W\hat x = Wx + WA^+z`, whatever the rank of ``A``: the minimum-norm solution differs from
any other least-squares solution only by a vector of :math:`A`'s null space, which ``W`` does not
see.

Reconstruction never forms an ``N x N`` matrix. Four routes:

* ``"kronecker"``: :math:`A = c \bigotimes_i A_i` gives :math:`A^+ = c^{-1} \bigotimes_i A_i^+`,
  applied one axis at a time (exact; each small factor is pseudo-inverted on its own).
* ``"marginals"``: a strategy whose Gram is in the marginals algebra (weighted marginals,
  residual measurements) has :math:`A^TA = \sum_T \mu_T E_T`, so
  :math:`\hat x = \sum_{\mu_T > 0} \mu_T^{-1} E_T A^Ty` (exact, closed form).
* ``"residual"``: residual measurements with a basis per attribute (:mod:`hdmm.residual_bases`):
  :math:`\hat x = \sum_T \kappa_T^{-1} K_T^+ A^Ty` (exact, closed form).
* ``"lsmr"``: anything else, by LSMR on the implicit operator, stopped once more iterations no
  longer move the answers of interest (the workload's, in :func:`hdmm.run`) by more than a small
  fraction of their noise standard errors.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import lsmr

from .budget import Charge
from .kron_union import KronUnion
from .marginals import trace_spectrum
from .matrix import Matrix, cheap_pinv
from .privacy import Privacy
from .residual_bases import apply_residual_pinv, residual_form
from .structure import ZERO_RTOL, Structure, classify, in_marginal_algebra

__all__ = ["Measurement", "reconstruct", "reconstruction_method", "RECONSTRUCTION_METHODS"]

#: The reconstruction methods :func:`reconstruct` accepts.
RECONSTRUCTION_METHODS = ("auto", "kronecker", "marginals", "residual", "lsmr")

#: LSMR stops when doubling the iterations moves no monitored answer by more than this many
#: standard errors.
LSMR_TOL = 1e-2

#: Iterations of the first LSMR run; each further run doubles them.
LSMR_FIRST = 32

#: LSMR's own tolerances (``atol = btol``): near double precision, so that its stopping test
#: means "converged", and the monitored answers decide earlier stops.
LSMR_ATOL = 1e-10


# ====================================================================== measurement
@dataclass(frozen=True, eq=False)
class Measurement:
    """Noisy answers to a strategy, with everything needed to reconstruct and to audit them.

    Attributes
    ----------
    strategy : Matrix
        The strategy ``A`` (``k x N``) that was measured.
    answers : numpy.ndarray
        The noisy answers :math:`y = Ax + z`, length ``k``.
    privacy : Privacy
        The privacy definition the noise was calibrated for.
    sensitivity : float
        :math:`\\Delta_p(A)`, computed from ``A`` in the norm ``privacy.norm``.
    noise_scale : float
        Scale of the discrete Laplace (:math:`b`) or discrete Gaussian (:math:`\\sigma`) noise of
        each ``z_i``, in the data's units.
    spacing : float or None
        The noise grid :math:`s` (a power of two): each answer is
        :math:`s\\,(\\operatorname{round}((Ax)_i/s) + Z_i)` with integer :math:`Z_i`
        (:mod:`hdmm.noise`). ``None`` when not recorded (a measurement read back from a file).
    charge : Charge or None
        What the measurement was charged to a privacy budget (:class:`hdmm.Budget`), recorded
        before its noise was drawn; ``None`` when no budget was given.
    seeded : bool
        Whether the noise came from a seeded generator (``rng=`` of :func:`hdmm.measure`):
        reproducible, for tests and research only (whoever knows the seed can remove the noise).
    """

    strategy: Matrix
    answers: np.ndarray
    privacy: Privacy
    sensitivity: float
    noise_scale: float
    spacing: float | None = None
    charge: Charge | None = None
    seeded: bool = False

    @property
    def noise_std(self) -> float:
        """Standard deviation of each noise draw (:math:`\\sqrt{2}\\,b` for Laplace, :math:`\\sigma` for Gaussian)."""
        return math.sqrt(self.privacy.noise_variance(self.sensitivity))

    def __repr__(self) -> str:
        return (
            f"Measurement({self.answers.size:,} answers of {self.strategy!r}; {self.privacy.description}, "
            f"sensitivity {self.sensitivity:.6g}, {self.privacy.noise.name} noise scale {self.noise_scale:.6g})"
        )


# ====================================================================== exact routes
def reconstruction_method(A: Matrix, method: str = "auto", *, structure: Structure | None = None) -> str:
    """The reconstruction method :func:`reconstruct` uses for strategy ``A``.

    ``"auto"`` resolves to ``"kronecker"`` for a (weighted) Kronecker product whose factors are
    small or structured, ``"marginals"`` for a strategy in the marginals algebra, ``"residual"``
    for residual measurements with per-attribute bases, else
    ``"lsmr"``. An explicit method is returned as is once it is checked to apply to ``A``.
    ``structure`` is ``A``'s (:func:`hdmm.structure.classify`) when already known.

    Raises
    ------
    ValueError
        For an unknown method, or one that does not apply to ``A``.
    """
    if method not in RECONSTRUCTION_METHODS:
        raise ValueError(f"unknown reconstruction method {method!r}; choose one of {list(RECONSTRUCTION_METHODS)}")
    if method == "lsmr":
        return method
    structure = classify(A) if structure is None else structure
    form = structure.form
    if method in ("auto", "kronecker"):
        if form == "kronecker" and (method == "kronecker" or all(cheap_pinv(f) for f in structure.union.term(0)[1])):
            return "kronecker"
        if method == "kronecker":
            raise ValueError(
                f"method='kronecker' needs a (weighted) Kronecker product strategy, but {A!r} is a union of "
                "several Kronecker products; use method='lsmr' (or 'auto')"
            )
    if form == "marginals" or (method == "marginals" and form == "kronecker" and in_marginal_algebra(structure.union)):
        return "marginals"
    if form == "residual" and method in ("auto", "residual"):
        return "residual"
    if method == "residual":
        raise ValueError(
            f"method='residual' needs residual measurements with a basis per attribute (hdmm.residual_bases), "
            f"not {A!r}; use method='lsmr' (or 'auto')"
        )
    if method == "marginals":
        raise ValueError(
            f"method='marginals' needs a strategy in the marginals algebra (weighted Marginals, Residuals, "
            f"or unions of products of identities and totals), not {A!r}; use method='lsmr' (or 'auto')"
        )
    return "lsmr"


def _apply_spectral(v: np.ndarray, sizes: tuple[int, ...], inverse: dict[tuple, float]) -> np.ndarray:
    r""":math:`\sum_T E_T v / \mu_T` over the subsets ``T`` in ``inverse`` (``T -> 1/mu_T``).

    Splits ``v`` attribute by attribute into its mean part :math:`P_i v` (kept with axis ``i``
    collapsed to length 1) and its residual part :math:`Q_i v = v - P_i v`, so the component
    :math:`E_T v` is held on :math:`\prod_{i \in T} n_i` numbers; summing the scaled components
    back broadcasts the collapsed axes (applying :math:`P_i` again, which is idempotent). Only
    prefixes of subsets in ``inverse`` are followed. Cost :math:`O(d \prod_i (n_i + 1))`.
    """
    d = len(sizes)
    prefixes = [{T[:i] for T in inverse} for i in range(d + 1)]

    def visit(a: np.ndarray, i: int, prefix: tuple) -> np.ndarray | None:
        if i == d:
            return a * inverse[prefix]
        mean = a.mean(axis=i, keepdims=True)
        out = visit(mean, i + 1, prefix + (False,)) if prefix + (False,) in prefixes[i + 1] else None
        if sizes[i] > 1 and prefix + (True,) in prefixes[i + 1]:
            residual = visit(a - mean, i + 1, prefix + (True,))
            out = residual if out is None else residual + out
        return out

    out = visit(v.reshape(sizes), 0, ())
    if out is None:
        return np.zeros(v.size)
    return np.broadcast_to(out, sizes).reshape(-1).copy()


def _reconstruct_marginals(A: Matrix, y: np.ndarray, union: KronUnion) -> np.ndarray:
    r""":math:`\hat x = (A^TA)^+ A^T y` with :math:`(A^TA)^+ = \sum_{\mu_T > 0} E_T / \mu_T`.

    The eigenvalues come from the trace spectrum of the strategy (docs/math.md, section 3):
    :math:`\mu_T = N \tau_T / \mathrm{tr}(E_T)`.
    """
    spectrum = trace_spectrum(union)
    mu = spectrum.eigenvalues * float(A.shape[1])
    keep = mu > ZERO_RTOL * mu.max(initial=0.0)
    inverse = {tuple(bool(b) for b in row): 1.0 / m for row, m in zip(spectrum.members[keep], mu[keep])}
    return _apply_spectral(A.T @ y, union.sizes, inverse)


# ====================================================================== LSMR
def _lsmr(
    A: Matrix, y: np.ndarray, x0: np.ndarray | None, monitor: Matrix, scale: np.ndarray, tol: float, maxiter: int
) -> np.ndarray:
    r"""Least squares by LSMR, iterated until the monitored answers stop moving.

    LSMR is deterministic, so the iterate after ``k`` steps is the same whether LSMR stops there
    or runs on. It is run for ``k = LSMR_FIRST, 2 LSMR_FIRST, 4 LSMR_FIRST, ...`` steps (each
    call from the start, at most twice the work of the last one, and no restarted Krylov space)
    until doubling the iterations moves every monitored answer :math:`(Mx)_i` by at most
    ``tol * scale_i``, or until LSMR's own test finds the least-squares solution to about
    double precision (:math:`\|A^Tr\| \le 10^{-10}\|A\|\,\|r\|`). A warning states the reached
    change and residuals if ``maxiter`` comes first.
    """
    op = A.to_linear_operator()
    iterations = min(LSMR_FIRST, maxiter)
    previous, change = None, math.inf
    while True:
        x, _, itn, normr, normar, *_ = lsmr(
            op, y, atol=LSMR_ATOL, btol=LSMR_ATOL, conlim=0.0, maxiter=iterations, x0=x0
        )
        if itn < iterations:  # LSMR's own stopping test: converged
            return x
        answers = monitor @ x
        if previous is not None:
            change = float(np.max(np.abs(answers - previous) / scale, initial=0.0))
            if change <= tol:
                return x
        if iterations >= maxiter:
            break
        previous, iterations = answers, min(2 * iterations, maxiter)
    moved = (
        f"the last doubling of the iterations still moved the monitored answers by up to {change:.3g} "
        f"standard errors (target {tol:g})"
        if math.isfinite(change)
        else "too few iterations to check convergence"
    )
    warnings.warn(
        f"LSMR stopped at the iteration cap ({maxiter:,} iterations): {moved}; residual ||y - Ax|| = {normr:.6g}, "
        f"||A^T (y - Ax)|| = {normar:.3g}. Pass maxiter=... to iterate further",
        RuntimeWarning,
        stacklevel=3,
    )
    return x


# ====================================================================== public
def _lsmr_options(A: Matrix, noise_std: float, monitor: Matrix | None, std_errors, x0, tol, maxiter):
    """Validated LSMR settings: ``(monitor, scale, x0, tol, maxiter)``."""
    k, n = A.shape
    if not (isinstance(tol, numbers.Real) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0 (a fraction of a standard error), got {tol!r}")
    if maxiter is None:
        maxiter = max(8 * min(k, n), 1000)
    elif isinstance(maxiter, bool) or not isinstance(maxiter, numbers.Integral) or maxiter < 1:
        raise ValueError(f"maxiter must be a positive integer or None, got {maxiter!r}")
    if x0 is not None:
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.shape != (n,) or not np.all(np.isfinite(x0)):
            raise ValueError(f"x0 must be a finite vector of length {n:,} (one entry per domain cell), got shape {x0.shape}")
    monitor = A if monitor is None else monitor
    if not isinstance(monitor, Matrix) or monitor.shape[1] != n:
        raise ValueError(f"workload must be an hdmm matrix with {n:,} columns (the strategy's domain)")
    if std_errors is None:
        scale = np.full(monitor.shape[0], noise_std)
    else:
        scale = np.asarray(std_errors, dtype=np.float64)
        if scale.shape != (monitor.shape[0],) or np.any(~(scale >= 0)):
            raise ValueError(
                f"std_errors must hold one non-negative number per workload query ({monitor.shape[0]:,}), "
                f"got shape {scale.shape}"
            )
    scale = np.where(scale > 0, scale, noise_std)  # a query without noise: judge it by sigma
    return monitor, scale, x0, float(tol), int(maxiter)


def least_squares(A: Matrix, y: np.ndarray, method: str, structure: Structure, *, noise_std: float,
                  workload: Matrix | None = None, std_errors: np.ndarray | None = None, x0: np.ndarray | None = None,
                  tol: float = LSMR_TOL, maxiter: int | None = None) -> np.ndarray:
    r""":math:`\hat x = A^+ y` by a method already resolved by :func:`reconstruction_method`.

    ``structure`` is ``A``'s; ``noise_std`` the standard deviation of one noisy answer (LSMR's
    default scale for judging convergence). The other parameters are LSMR's (see
    :func:`reconstruct`).
    """
    if method == "kronecker":
        return structure.kronecker.pinv() @ y
    if method == "marginals":
        return _reconstruct_marginals(A, y, structure.union)
    if method == "residual":
        return apply_residual_pinv(A.T @ y, structure.union.sizes, residual_form(structure.union))
    if method != "lsmr":
        raise ValueError(f"method must be resolved by reconstruction_method first, got {method!r}")
    monitor, scale, x0, tol, maxiter = _lsmr_options(A, noise_std, workload, std_errors, x0, tol, maxiter)
    return _lsmr(A, y, x0, monitor, scale, tol, maxiter)


def reconstruct(plan, measurement: Measurement | None = None, method: str | None = None, *,
                workload: Matrix | None = None, std_errors: np.ndarray | None = None, x0: np.ndarray | None = None,
                tol: float = LSMR_TOL, maxiter: int | None = None) -> np.ndarray:
    r"""The least-squares estimate :math:`\hat x = A^+ y` of the data vector.

    Called as ``reconstruct(plan, measurement)`` with the :class:`~hdmm.planning.Plan` the measurement
    was taken under: the plan's reconstruction route and structure are used, and LSMR (if that
    is the route) is stopped by the plan's workload answers and their standard errors. The
    earlier form ``reconstruct(measurement, method="auto", workload=..., std_errors=...)``
    still works and decides the route itself.

    When ``A`` does not have full column rank this is the minimum-norm least-squares solution
    (pseudo-inverse semantics). The answers :math:`W\hat x` are still unbiased for every
    workload ``W`` the strategy supports (:math:`WA^+A = W`), since then
    :math:`W\hat x = WA^+(Ax + z) = Wx + WA^+z`; only :math:`\hat x` itself is biased, along the
    null space of ``A``.

    Parameters
    ----------
    plan
        The :class:`~hdmm.planning.Plan` (or, in the earlier form, the :class:`Measurement`).
    measurement
        Output of :func:`hdmm.measure` under ``plan``.
    method
        Earlier form only. ``"kronecker"``: exact for :math:`A = c \bigotimes_i A_i`,
        :math:`\hat x = c^{-1} (\bigotimes_i A_i^+) y`, one small pseudo-inverse per factor, applied
        axis by axis. ``"marginals"``: exact for strategies in the marginals algebra (weighted
        :class:`~hdmm.marginals.Marginals`, :class:`~hdmm.marginals.Residuals`, unions of products of identities
        and totals), :math:`\hat x = \sum_{\mu_T>0} \mu_T^{-1} E_T A^T y`. ``"lsmr"``: iterative, for
        any strategy (e.g. unions of Kronecker products from ``opt_union``). ``"auto"`` (default):
        the exact route when one applies (see :func:`reconstruction_method`), else LSMR.
    workload, std_errors
        LSMR only, earlier form: the queries whose answers decide when LSMR has converged
        (default: the strategy's own answers :math:`A\hat x`), and their noise standard errors
        (default: the noise standard deviation of one measurement, for every query).
    x0
        LSMR only: a warm start (length ``N``). LSMR keeps the component of ``x0`` in the null
        space of ``A``, so the result is the minimum-norm solution only if ``x0`` lies in the
        row space (e.g. an earlier estimate).
    tol
        LSMR only: stop once doubling the number of iterations moves no monitored answer by
        more than ``tol`` of its standard error (default 1%), far below the noise. LSMR also stops
        by itself when the least-squares solution is reached to about double precision.
    maxiter
        LSMR only: cap on the iterations (default ``max(8 min(k, N), 1000)``); a
        ``RuntimeWarning`` states the reached change and residuals if the cap stops it first.

    The exact routes ignore the LSMR-only parameters.

    Returns
    -------
    numpy.ndarray
        :math:`\hat x`, length ``N``.

    Raises
    ------
    ValueError
        For an unknown method, a method that does not apply to the strategy, a measurement
        taken under another plan, or bad LSMR parameters (shapes, non-finite values).
    """
    if isinstance(plan, Measurement):  # the earlier form: reconstruct(measurement, method, ...)
        if measurement is not None and method is None and isinstance(measurement, str):
            method = measurement
        A = plan.strategy
        structure = classify(A)
        resolved = reconstruction_method(A, method or "auto", structure=structure)
        return least_squares(A, plan.answers, resolved, structure, noise_std=plan.noise_std, workload=workload,
                             std_errors=std_errors, x0=x0, tol=tol, maxiter=maxiter)
    if not isinstance(measurement, Measurement):
        raise TypeError(
            f"reconstruct(plan, measurement) needs a Measurement from hdmm.measure, got {type(measurement).__name__}"
        )
    if not hasattr(plan, "structure") or not hasattr(plan, "method"):
        raise TypeError(f"reconstruct needs a Plan (from hdmm.plan) or a Measurement, got {type(plan).__name__}")
    if method is not None or workload is not None or std_errors is not None:
        raise TypeError("with a plan, the method, workload and standard errors are the plan's: pass only "
                        "x0, tol or maxiter")
    if measurement.strategy is not plan.strategy or measurement.privacy != plan.privacy:
        raise ValueError("the measurement was not taken under this plan (another strategy or privacy); "
                         "reconstruct it with the plan passed to hdmm.measure")
    std = None if plan.variances is None else np.sqrt(plan.variances)
    monitor = None if plan.variances is None else plan.workload
    return least_squares(plan.strategy, measurement.answers, plan.method, plan.structure,
                         noise_std=measurement.noise_std, workload=monitor, std_errors=std, x0=x0, tol=tol,
                         maxiter=maxiter)
