r"""The Gaussian mechanism's calibrations and the zCDP conversions: the numbers behind the privacy classes.

:mod:`hdmm.privacy` defines the privacy classes; this module holds the arithmetic they (and
:class:`hdmm.Budget`) rest on, each function with its source:

* :func:`zcdp_delta`, :func:`zcdp_rho`, :func:`zcdp_epsilon` -- :math:`\rho`-zCDP implies
  :math:`(\epsilon, \delta)`-DP (Canonne, Kamath & Steinke 2020, Corollary 13), in each direction.
* :func:`discrete_gaussian_sigma` -- the discrete Gaussian noise :class:`hdmm.ApproxDP` adds:
  :math:`\sigma = \Delta/\sqrt{2\rho}` for the largest such :math:`\rho` (their Theorem 14).
* :func:`analytic_gaussian_sigma` (Balle & Wang 2018) and :func:`classic_gaussian_sigma` (Dwork
  & Roth 2014) -- calibrations of the *continuous* Gaussian mechanism, for comparison.
* :func:`check_positive`, :func:`check_delta`, :func:`check_sensitivity` -- the checks of a
  privacy parameter, one each.

Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020): the
theorem and corollary numbers cited here are those of the arXiv version, arXiv:2004.00010v5.
Every name here is also importable from :mod:`hdmm.privacy`, where it was first defined.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

from .validation import is_finite_real

__all__ = [
    "analytic_gaussian_sigma",
    "check_delta",
    "check_positive",
    "check_sensitivity",
    "classic_gaussian_sigma",
    "discrete_gaussian_sigma",
    "unit_discrete_sigma",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]


def check_positive(name: str, value: Any) -> float:
    """Validate a privacy parameter: a finite real number > 0."""
    if not (is_finite_real(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def check_delta(value: Any) -> float:
    """Validate delta: a finite real number in (0, 1)."""
    if is_finite_real(value) and value == 0:
        raise ValueError(
            "delta must be a finite number in (0, 1), got 0; "
            "for delta = 0 use PureDP(epsilon) (Laplace noise)"
        )
    if not (is_finite_real(value) and 0 < value < 1):
        raise ValueError(f"delta must be a finite number in (0, 1), got {value!r}")
    return float(value)


def check_sensitivity(value: Any) -> float:
    """Validate a sensitivity: a finite real number >= 0."""
    if not (is_finite_real(value) and value >= 0):
        raise ValueError(f"sensitivity must be a finite number >= 0, got {value!r}")
    return float(value)


def _log_gaussian_delta(sigma: float, epsilon: float) -> tuple[float, float]:
    """:math:`\\log \\delta(\\sigma)` of the Gaussian mechanism with unit L2 sensitivity.

    Balle & Wang (2018, Theorem 8): the Gaussian mechanism with noise
    :math:`\\sigma` and L2 sensitivity :math:`\\Delta = 1` is
    :math:`(\\epsilon, \\delta)`-DP exactly for :math:`\\delta \\ge \\delta(\\sigma)`, where

    .. math::

        \\delta(\\sigma) = \\Phi(a - b) - e^{\\epsilon}\\,\\Phi(-a - b),
        \\qquad a = \\frac{1}{2\\sigma}, \\quad b = \\epsilon \\sigma .

    To avoid overflow of :math:`e^\\epsilon` and underflow of :math:`\\Phi` we
    use :math:`\\ell(t) = \\log \\Phi(t)` and write the log-ratio of the two
    terms as :math:`r = \\epsilon + \\ell(-a - b) - \\ell(a - b) < 0`:

    .. math::

        \\log \\delta = \\ell(a - b) + \\log\\bigl(-\\operatorname{expm1}(r)\\bigr).

    Returns
    -------
    log_delta : float
        :math:`\\log\\delta(\\sigma)`; ``-inf`` where rounding makes it vanish.
    rel_error : float
        Estimated relative rounding error of :math:`\\delta(\\sigma)`: the
        absolute error of :math:`r`, about
        :math:`u\\,(|\\ell(a-b)| + |\\ell(-a-b)| + \\epsilon)` with unit roundoff
        :math:`u`, divided by :math:`|r|`.  It is large when both terms nearly
        cancel (tiny :math:`\\epsilon` together with tiny :math:`\\delta`).
    """
    a = 0.5 / sigma
    b = epsilon * sigma
    log_first = float(log_ndtr(a - b))
    log_second = float(log_ndtr(-a - b))
    ratio = epsilon + log_second - log_first
    rounding = np.finfo(float).eps * (abs(log_first) + abs(log_second) + epsilon)
    if not ratio < 0.0:  # rounding made the terms cross (or both underflowed: NaN)
        return -math.inf, math.inf
    if ratio == -math.inf:  # the second term underflowed to 0: nothing cancels
        return log_first, 0.0
    return log_first + math.log(-math.expm1(ratio)), rounding / -ratio


def _uncomputable(epsilon: float, delta: float) -> ValueError:
    """The error for parameters outside the reach of double precision."""
    return ValueError(
        f"cannot calibrate the analytic Gaussian mechanism for epsilon={epsilon!r}, "
        f"delta={delta!r}: the privacy curve cannot be evaluated accurately in double "
        "precision (this happens for extreme values, e.g. a tiny epsilon together with a "
        "tiny delta); use less extreme parameters, or ZCDP"
    )


@functools.lru_cache(maxsize=256)
def _unit_analytic_sigma(epsilon: float, delta: float) -> float:
    """Smallest :math:`\\sigma` with :math:`\\delta(\\sigma) \\le \\delta` for unit sensitivity.

    :math:`\\delta(\\sigma)` decreases from 1 (as :math:`\\sigma \\to 0`) to 0
    (as :math:`\\sigma \\to \\infty`), so the root of
    :math:`f(\\sigma) = \\log\\delta(\\sigma) - \\log\\delta` is unique.  We
    bracket it by halving / doubling from the classic calibration
    :math:`\\sqrt{2\\ln(1.25/\\delta)}/\\epsilon` and solve with Brent's method.

    Raises
    ------
    ValueError
        If :math:`\\delta(\\sigma)` cannot be evaluated to a relative accuracy of
        :math:`10^{-3}` near the root (only for extreme parameters such as
        :math:`\\epsilon = 10^{-10}, \\delta = 10^{-50}`).
    """
    log_target = math.log(delta)

    def excess(sigma: float) -> float:
        return _log_gaussian_delta(sigma, epsilon)[0] - log_target

    guess = math.sqrt(2.0 * (math.log(1.25) - math.log(delta))) / epsilon
    if not math.isfinite(guess):
        raise _uncomputable(epsilon, delta)
    lo = hi = guess
    while not excess(lo) > 0.0:  # stops: delta(sigma) -> 1 as sigma -> 0
        lo /= 2.0
    while not excess(hi) < 0.0:
        hi *= 2.0
        if not math.isfinite(hi):
            raise _uncomputable(epsilon, delta)
    try:
        sigma = brentq(excess, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=1000)
    except RuntimeError:  # no convergence: the curve is dominated by rounding noise
        raise _uncomputable(epsilon, delta) from None
    if _log_gaussian_delta(sigma, epsilon)[1] > 1e-3:
        raise _uncomputable(epsilon, delta)
    return sigma


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise standard deviation of the analytic Gaussian mechanism (Balle & Wang 2018).

    The smallest :math:`\\sigma` such that

    .. math::

        \\Phi\\Bigl(\\frac{\\Delta}{2\\sigma} - \\frac{\\epsilon\\sigma}{\\Delta}\\Bigr)
        - e^{\\epsilon}\\,
          \\Phi\\Bigl(-\\frac{\\Delta}{2\\sigma} - \\frac{\\epsilon\\sigma}{\\Delta}\\Bigr)
        \\le \\delta ,

    where :math:`\\Delta` is the L2 sensitivity.  The condition depends on
    :math:`\\sigma / \\Delta` only, so
    :math:`\\sigma = \\Delta \\cdot \\sigma_1(\\epsilon, \\delta)` with the
    unit-sensitivity solution :math:`\\sigma_1` (cached).  Valid for
    every :math:`\\epsilon > 0` and :math:`0 < \\delta < 1`.
    """
    unit = _unit_analytic_sigma(check_positive("epsilon", epsilon), check_delta(delta))
    return check_sensitivity(sensitivity) * unit


def classic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """The classic Gaussian calibration, for comparison.

    .. math::

        \\sigma = \\frac{\\Delta \\sqrt{2 \\ln(1.25 / \\delta)}}{\\epsilon}

    (Dwork & Roth 2014, Theorem A.1).  It only guarantees
    :math:`(\\epsilon, \\delta)`-DP for :math:`\\epsilon < 1`, and even there it
    adds more noise than :func:`analytic_gaussian_sigma`.

    Raises
    ------
    ValueError
        If ``epsilon >= 1``, where the formula is not a valid calibration.
    """
    epsilon = check_positive("epsilon", epsilon)
    if epsilon >= 1:
        raise ValueError(
            f"the classic Gaussian calibration is only valid for epsilon < 1, got {epsilon!r}; "
            "use analytic_gaussian_sigma, which is valid for every epsilon"
        )
    log_ratio = math.log(1.25) - math.log(check_delta(delta))  # ln(1.25 / delta), no overflow
    return check_sensitivity(sensitivity) * math.sqrt(2.0 * log_ratio) / epsilon


def _log_zcdp_delta(rho: float, epsilon: float) -> float:
    """:math:`\\log\\delta` of :func:`zcdp_delta`: the bound at the best order found by bisection."""

    def log_bound(alpha: float) -> float:
        return (alpha - 1.0) * (alpha * rho - epsilon) + alpha * math.log1p(-1.0 / alpha) - math.log(alpha - 1.0)

    # the bound's log is convex in alpha; its derivative (2 alpha - 1) rho - epsilon + log(1 - 1/alpha)
    # is negative as alpha -> 1 and positive at alpha = (epsilon + 1) / (2 rho) + 2
    lo, hi = 1.0, (epsilon + 1.0) / (2.0 * rho) + 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if (2.0 * mid - 1.0) * rho - epsilon + math.log1p(-1.0 / mid) < 0.0:
            lo = mid
        else:
            hi = mid
    return min(log_bound(hi), 0.0)  # any order alpha > 1 gives a valid bound; delta <= 1 always


def zcdp_delta(rho: float, epsilon: float) -> float:
    """The :math:`\\delta` for which :math:`\\rho`-zCDP implies :math:`(\\epsilon, \\delta)`-DP.

    Canonne, Kamath & Steinke (2020, Corollary 13): a :math:`\\rho`-zCDP mechanism is
    :math:`(\\epsilon, \\delta)`-DP for every order :math:`\\alpha > 1` with

    .. math::

        \\delta = \\frac{e^{(\\alpha - 1)(\\alpha\\rho - \\epsilon)}}{\\alpha - 1}
                 \\Bigl(1 - \\frac{1}{\\alpha}\\Bigr)^{\\alpha}.

    The order is chosen by bisection on the derivative of the logarithm (convex in
    :math:`\\alpha`); any order gives a valid :math:`\\delta`, so an inexact optimum only costs
    tightness. It is at most the classical :math:`e^{-(\\epsilon - \\rho)^2/(4\\rho)}` (Bun & Steinke 2016).

    >>> round(zcdp_delta(0.5, 3.0), 6) < math.exp(-(3.0 - 0.5) ** 2 / 2.0)
    True
    """
    return math.exp(_log_zcdp_delta(check_positive("rho", rho), check_positive("epsilon", epsilon)))


@functools.lru_cache(maxsize=256)
def _zcdp_rho(epsilon: float, delta: float) -> float:
    log_target = math.log(delta) - 1e-9  # a relative 1e-9 below delta: covers rounding in the bound

    def excess(log_rho: float) -> float:
        return _log_zcdp_delta(math.exp(log_rho), epsilon) - log_target

    # in logarithms: epsilon**2 overflows for epsilon above 1e154 (and the search below never ended)
    lo = hi = 2.0 * math.log(epsilon) - math.log(8.0 * (1.0 - math.log(delta)))
    if hi > 700.0:  # rho beyond double precision (epsilon above about 1e150)
        raise _uncomputable(epsilon, delta)
    while not excess(lo) < 0.0:
        lo -= 1.0
        if lo < -1400.0:
            raise _uncomputable(epsilon, delta)
    while not excess(hi) > 0.0:
        hi += 1.0
        if hi > 700.0:
            raise _uncomputable(epsilon, delta)
    try:
        log_rho = brentq(excess, lo, hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)
    except RuntimeError:
        raise _uncomputable(epsilon, delta) from None
    rho = math.exp(log_rho)
    while _log_zcdp_delta(rho, epsilon) > log_target:  # the root may sit a rounding step too high
        rho *= 1.0 - 1e-12
    if not (math.isfinite(rho) and rho > 0.0):
        raise _uncomputable(epsilon, delta)
    return rho


def zcdp_rho(epsilon: float, delta: float) -> float:
    """The largest :math:`\\rho` whose zCDP guarantee implies :math:`(\\epsilon, \\delta)`-DP by :func:`zcdp_delta`.

    Found by Brent's method on :math:`\\log\\delta(\\rho)`, which increases with :math:`\\rho`,
    aiming a relative :math:`10^{-9}` below :math:`\\delta` and checked to stay at or below it.

    >>> zcdp_delta(zcdp_rho(1.0, 1e-6), 1.0) <= 1e-6
    True
    """
    return _zcdp_rho(check_positive("epsilon", epsilon), check_delta(delta))


def zcdp_epsilon(rho: float, delta: float) -> float:
    r"""The smallest epsilon for which :math:`\rho`-zCDP implies :math:`(\epsilon, \delta)`-DP by :func:`zcdp_delta`.

    The inverse in epsilon of the conversion of Canonne, Kamath & Steinke (2020, Corollary 13),
    found by bisection (the delta it gives decreases with epsilon) and rounded up: the epsilon
    returned always satisfies ``zcdp_delta(rho, epsilon) <= delta``. It is at most the classical
    :math:`\rho + 2\sqrt{\rho \ln(1/\delta)}` (Bun & Steinke 2016). ``rho = 0`` gives 0.

    >>> eps = zcdp_epsilon(0.5, 1e-6)
    >>> round(eps, 3), zcdp_delta(0.5, eps) <= 1e-6
    (5.222, True)
    """
    if not (is_finite_real(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    if not (is_finite_real(delta) and 0 < delta < 1):
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    if rho == 0:
        return 0.0
    hi = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    while zcdp_delta(rho, hi) > delta:  # the classical bound is never tighter; guard against rounding
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi or hi - lo <= 1e-15 * hi:
            break
        if mid > 0 and zcdp_delta(rho, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def discrete_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Noise (in the data's units) of the discrete Gaussian that :class:`hdmm.ApproxDP` adds.

    :math:`\\sigma = \\Delta / \\sqrt{2\\rho}` with :math:`\\rho` = :func:`zcdp_rho` of
    :math:`(\\epsilon, \\delta)`: the discrete Gaussian with L2 sensitivity :math:`\\Delta` is
    :math:`\\Delta^2/(2\\sigma^2)`-zCDP (Canonne, Kamath & Steinke 2020, Theorem 14), hence
    :math:`(\\epsilon, \\delta)`-DP (their Corollary 13). It is 4 to 9% above the analytic
    calibration of the *continuous* Gaussian (:func:`analytic_gaussian_sigma`), which does not
    apply to the discrete noise hdmm adds.

    >>> round(discrete_gaussian_sigma(1.0, 1e-6), 3)
    4.531
    """
    unit = unit_discrete_sigma(check_positive("epsilon", epsilon), check_delta(delta))
    return check_sensitivity(sensitivity) * unit


def unit_discrete_sigma(epsilon: float, delta: float) -> float:
    """:math:`1/\\sqrt{2\\rho}` rounded up: :func:`discrete_gaussian_sigma` at sensitivity 1, for checked parameters.

    Cached per ``(epsilon, delta)``; :class:`hdmm.ApproxDP` calls it for every noise scale.
    """
    return 1.0 / math.sqrt(2.0 * _zcdp_rho(epsilon, delta)) * (1.0 + 2.0**-50)
