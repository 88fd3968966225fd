r"""The matrix mechanism: measure a strategy with noise, reconstruct by least squares (MATH.md 1, 7).

For a data vector :math:`x` (length ``N``) and a strategy :math:`A` (``k x N``),

.. math:: y = Ax + z, \qquad \hat x = A^+ y = \arg\min_{x} \|Ax - y\|_2 \;(\text{minimum norm}),

where :math:`z` is i.i.d. Laplace noise of scale :math:`b = \Delta_1(A)/\epsilon` (pure DP) or
Gaussian noise calibrated to :math:`\Delta_2(A)` (:mod:`hdmm.privacy`). Any workload ``W`` whose
rows lie in the row space of ``A`` (:math:`WA^+A = W`) is then answered without bias by
:math:`W\hat x = Wx + WA^+z`, whatever the rank of ``A``: the minimum-norm solution differs from
any other least-squares solution only by a vector of :math:`A`'s null space, which ``W`` does not
see.

Reconstruction never forms an ``N x N`` matrix. Three routes:

* ``"kronecker"``: :math:`A = c \bigotimes_i A_i` gives :math:`A^+ = c^{-1} \bigotimes_i A_i^+`,
  applied one axis at a time (exact; each small factor is pseudo-inverted on its own).
* ``"marginals"``: a strategy whose Gram is in the marginals algebra (weighted marginals,
  residual measurements) has :math:`A^TA = \sum_T \mu_T E_T`, so
  :math:`\hat x = \sum_{\mu_T > 0} \mu_T^{-1} E_T A^Ty` (exact, closed form).
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

from .kron_union import FactorMismatchError, KronUnion
from .marginals import in_marginal_algebra, trace_spectrum
from .matrix import Kronecker, Matrix, Weighted
from .privacy import Privacy

__all__ = ["Measurement", "measure", "reconstruct", "reconstruction_method", "RECONSTRUCTION_METHODS"]

#: The reconstruction methods :func:`reconstruct` accepts.
RECONSTRUCTION_METHODS = ("auto", "kronecker", "marginals", "lsmr")

#: Largest Kronecker factor (in entries, rows x columns) that ``"auto"`` pseudo-inverts densely;
#: identities, totals and diagonals are inverted structurally at any size.
EXACT_FACTOR_ENTRIES = 2**24

#: Eigenvalues of a marginals-algebra Gram below this fraction of the largest count as zero
#: (the same cut-off :mod:`hdmm.error` uses, so reconstruction and error agree on the rank).
SPECTRAL_RCOND = 1e-12

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
        Laplace scale :math:`b` or Gaussian standard deviation :math:`\\sigma` of each ``z_i``.
    """

    strategy: Matrix
    answers: np.ndarray
    privacy: Privacy
    sensitivity: float
    noise_scale: float

    @property
    def noise_std(self) -> float:
        """Standard deviation of each noise draw (:math:`\\sqrt{2}\\,b` for Laplace, :math:`\\sigma` for Gaussian)."""
        return math.sqrt(self.privacy.noise_variance(self.sensitivity))

    def __repr__(self) -> str:
        return (
            f"Measurement({self.answers.size:,} answers of {self.strategy!r}; {self.privacy.description}, "
            f"sensitivity {self.sensitivity:.6g}, {self.privacy.noise} noise scale {self.noise_scale:.6g})"
        )


def as_generator(rng: None | int | np.random.Generator) -> np.random.Generator:
    """The noise source: fresh OS entropy for ``None``, else a seeded or given generator.

    Seeds make the noise reproducible, and therefore guessable: use them for tests and
    reproducible research only, never for a real release.
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)):
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be None (fresh OS entropy, for real releases), an int seed or a "
        f"numpy.random.Generator, got {type(rng).__name__}"
    )


def check_data_vector(x, n: int) -> np.ndarray:
    """``x`` as a float vector of ``n`` finite, non-negative counts, or a ``ValueError`` saying why not."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"the data vector must be numeric counts, got {type(x).__name__} that numpy cannot read as "
            f"float ({exc}); pass a numpy array, or a DataFrame of records together with domain=..."
        ) from None
    if arr.ndim != 1:
        raise ValueError(
            f"the data vector must be 1-D (one count per domain cell), got shape {arr.shape}; flatten "
            "a data cube with x.ravel() (C order: first attribute most significant)"
        )
    if arr.size != n:
        raise ValueError(
            f"the data vector has {arr.size:,} entries but the domain has {n:,} cells; build it over "
            "the same domain as the workload and strategy (Domain.vectorize does this for records)"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"the data vector holds {int(bad.sum()):,} NaN or infinite entries (the first at index {i}); "
            "counts must be finite: fill or drop the missing cells first"
        )
    negative = arr < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"the data vector holds {int(negative.sum()):,} negative entries (e.g. {arr[i]:g} at index {i}); "
            "it must hold the true, non-negative record counts (not a noisy estimate)"
        )
    return arr


def measure(A: Matrix, x, privacy: Privacy, rng: None | int | np.random.Generator = None) -> Measurement:
    r"""Answer the strategy queries with calibrated noise: :math:`y = Ax + z`.

    The sensitivity :math:`\Delta_p(A)` (the largest column :math:`L_p` norm, ``p = privacy.norm``)
    is computed from ``A``, never assumed, and each :math:`z_i` is drawn i.i.d. with
    ``privacy.noise_scale(Delta)`` (Laplace :math:`b = \Delta_1/\epsilon`, or the Gaussian
    :math:`\sigma` of ``ApproxDP`` / ``ZCDP``).

    Parameters
    ----------
    A
        The strategy, an implicit ``k x N`` matrix.
    x
        The data vector: ``N`` finite, non-negative counts.
    privacy
        :class:`~hdmm.PureDP`, :class:`~hdmm.ApproxDP` or :class:`~hdmm.ZCDP`.
    rng
        ``None`` (default) draws the noise from fresh OS entropy, as a real release must. An int
        seed or a ``numpy.random.Generator`` makes the noise reproducible: for tests and
        reproducible research only, since anyone who knows the seed can subtract the noise.

    Returns
    -------
    Measurement

    Raises
    ------
    TypeError
        If ``A`` is not an hdmm matrix or ``privacy`` not a privacy definition.
    ValueError
        If ``x`` is not a 1-D vector of ``N`` finite, non-negative counts.
    """
    if not isinstance(A, Matrix):
        raise TypeError(f"the strategy must be an hdmm matrix, got {type(A).__name__}")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    x = check_data_vector(x, A.shape[1])
    generator = as_generator(rng)
    sensitivity = A.sensitivity(privacy.norm)
    noisy = A @ x + privacy.sample(A.shape[0], sensitivity, generator)
    return Measurement(A, noisy, privacy, sensitivity, privacy.noise_scale(sensitivity))


# ====================================================================== exact routes
def _kronecker_form(A: Matrix) -> Matrix | None:
    r"""``A`` as :math:`c \bigotimes_i A_i` (nested products and weights flattened), or ``None``."""
    try:
        union = A.kron_union()
    except FactorMismatchError:
        return None
    if union.num_terms != 1:
        return None
    weight, factors = union.term(0)
    return Weighted(Kronecker(factors), weight)


def _cheap_pinv(f: Matrix) -> bool:
    """Whether ``"auto"`` pseudo-inverts this Kronecker factor: structural, or small enough to do densely."""
    return f.fast_pinv or f.shape[0] * f.shape[1] <= EXACT_FACTOR_ENTRIES


def _marginals_union(A: Matrix) -> KronUnion | None:
    """``A``'s Kronecker union if its Gram lies in the marginals algebra, else ``None``."""
    try:
        union = A.kron_union()
    except FactorMismatchError:
        return None
    return union if in_marginal_algebra(union) else None


def reconstruction_method(A: Matrix, method: str = "auto") -> str:
    """The reconstruction method :func:`reconstruct` uses for strategy ``A``.

    ``"auto"`` resolves to ``"kronecker"`` for a (weighted) Kronecker product whose factors are
    small or structured, ``"marginals"`` for a strategy in the marginals algebra, else
    ``"lsmr"``. An explicit method is returned as is once it is checked to apply to ``A``.

    Raises
    ------
    ValueError
        For an unknown method, or one that does not apply to ``A``.
    """
    if method not in RECONSTRUCTION_METHODS:
        raise ValueError(f"unknown reconstruction method {method!r}; choose one of {list(RECONSTRUCTION_METHODS)}")
    if method in ("auto", "kronecker"):
        K = _kronecker_form(A)
        if K is not None and (method == "kronecker" or all(_cheap_pinv(f) for f in K.base.factors)):
            return "kronecker"
        if method == "kronecker":
            raise ValueError(
                f"method='kronecker' needs a (weighted) Kronecker product strategy, but {A!r} is a union of "
                "several Kronecker products; use method='lsmr' (or 'auto')"
            )
    if method in ("auto", "marginals"):
        if _marginals_union(A) is not None:
            return "marginals"
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

    The eigenvalues come from the trace spectrum of the strategy (MATH.md section 3):
    :math:`\mu_T = N \tau_T / \mathrm{tr}(E_T)`.
    """
    spectrum = trace_spectrum(union)
    mu = spectrum.eigenvalues * float(A.shape[1])
    keep = mu > SPECTRAL_RCOND * mu.max(initial=0.0)
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
def reconstruct(
    measurement: Measurement,
    method: str = "auto",
    *,
    workload: Matrix | None = None,
    std_errors: np.ndarray | None = None,
    x0: np.ndarray | None = None,
    tol: float = LSMR_TOL,
    maxiter: int | None = None,
) -> np.ndarray:
    r"""The least-squares estimate :math:`\hat x = A^+ y` of the data vector.

    When ``A`` does not have full column rank this is the minimum-norm least-squares solution
    (pseudo-inverse semantics). The answers :math:`W\hat x` are still unbiased for every
    workload ``W`` the strategy supports (:math:`WA^+A = W`), since then
    :math:`W\hat x = WA^+(Ax + z) = Wx + WA^+z`; only :math:`\hat x` itself is biased, along the
    null space of ``A``.

    Parameters
    ----------
    measurement
        Output of :func:`measure`.
    method
        ``"kronecker"``: exact for :math:`A = c \bigotimes_i A_i`,
        :math:`\hat x = c^{-1} (\bigotimes_i A_i^+) y`, one small pseudo-inverse per factor, applied
        axis by axis. ``"marginals"``: exact for strategies in the marginals algebra (weighted
        :class:`~hdmm.Marginals`, :class:`~hdmm.Residuals`, unions of products of identities
        and totals), :math:`\hat x = \sum_{\mu_T>0} \mu_T^{-1} E_T A^T y`. ``"lsmr"``: iterative, for
        any strategy (e.g. unions of Kronecker products from ``opt_union``). ``"auto"`` (default):
        the exact route when one applies (see :func:`reconstruction_method`), else LSMR.
    workload, std_errors
        LSMR only: the queries whose answers decide when LSMR has converged (default: the
        strategy's own answers :math:`A\hat x`), and their noise standard errors (default: the
        noise standard deviation of one measurement, for every query). :func:`hdmm.run` passes
        the workload and its standard errors.
    x0
        LSMR only: a warm start (length ``N``). LSMR keeps the component of ``x0`` in the null
        space of ``A``, so the result is the minimum-norm solution only if ``x0`` lies in the
        row space (e.g. an earlier estimate).
    tol
        LSMR only: stop once doubling the number of iterations moves no monitored answer by
        more than ``tol`` of its standard error (default 1%), far below the noise. LSMR also stops
        by itself when the least-squares solution is reached to about double precision.
    maxiter
        LSMR only: cap on the iterations (default ``max(2 min(k, N), 100)``); a
        ``RuntimeWarning`` states the reached change and residuals if the cap stops it first.

    The exact routes ignore the LSMR-only parameters.

    Returns
    -------
    numpy.ndarray
        :math:`\hat x`, length ``N``.

    Raises
    ------
    ValueError
        For an unknown method, a method that does not apply to the strategy, or bad LSMR
        parameters (shapes, non-finite values).
    """
    if not isinstance(measurement, Measurement):
        raise TypeError(f"reconstruct needs a Measurement (from measure), got {type(measurement).__name__}")
    A, y = measurement.strategy, measurement.answers
    method = reconstruction_method(A, method)
    if method == "kronecker":
        return _kronecker_form(A).pinv() @ y
    if method == "marginals":
        return _reconstruct_marginals(A, y, _marginals_union(A))
    k, n = A.shape
    if not (isinstance(tol, numbers.Real) and math.isfinite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0 (a fraction of a standard error), got {tol!r}")
    if maxiter is None:
        maxiter = max(2 * min(k, n), 100)
    elif isinstance(maxiter, bool) or not isinstance(maxiter, numbers.Integral) or maxiter < 1:
        raise ValueError(f"maxiter must be a positive integer or None, got {maxiter!r}")
    if x0 is not None:
        x0 = np.asarray(x0, dtype=np.float64)
        if x0.shape != (n,) or not np.all(np.isfinite(x0)):
            raise ValueError(f"x0 must be a finite vector of length {n:,} (one entry per domain cell), got shape {x0.shape}")
    monitor = A if workload is None else workload
    if not isinstance(monitor, Matrix) or monitor.shape[1] != n:
        raise ValueError(f"workload must be an hdmm matrix with {n:,} columns (the strategy's domain)")
    if std_errors is None:
        scale = np.full(monitor.shape[0], measurement.noise_std)
    else:
        scale = np.asarray(std_errors, dtype=np.float64)
        if scale.shape != (monitor.shape[0],) or np.any(~(scale >= 0)):
            raise ValueError(
                f"std_errors must hold one non-negative number per workload query ({monitor.shape[0]:,}), "
                f"got shape {scale.shape}"
            )
    scale = np.where(scale > 0, scale, measurement.noise_std)  # a query without noise: judge it by sigma
    return _lsmr(A, y, x0, monitor, scale, float(tol), int(maxiter))
