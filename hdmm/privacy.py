"""Privacy definitions and the noise each one calls for.

A mechanism answers a strategy :math:`A` on the data vector :math:`x` as
:math:`y = A x + z`, with i.i.d. noise :math:`z` whose scale is set by the
sensitivity of :math:`A` in the norm the privacy definition uses:

* :class:`PureDP` -- :math:`\\epsilon`-DP, L1 sensitivity :math:`\\Delta_1`,
  Laplace noise of scale :math:`b = \\Delta_1 / \\epsilon`.
* :class:`ApproxDP` -- :math:`(\\epsilon, \\delta)`-DP, L2 sensitivity
  :math:`\\Delta_2`, Gaussian noise with the analytic calibration of
  Balle & Wang (2018).
* :class:`ZCDP` -- :math:`\\rho`-zCDP, L2 sensitivity :math:`\\Delta_2`,
  Gaussian noise with :math:`\\sigma^2 = \\Delta_2^2 / (2\\rho)`.

For a strategy :math:`A`, the L1 sensitivity is the largest column L1 norm
:math:`\\max_j \\lVert A_{:,j} \\rVert_1` and the L2 sensitivity the largest
column L2 norm :math:`\\max_j \\lVert A_{:,j} \\rVert_2` (adding or removing one
record changes :math:`x` by one in one cell).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
import numbers
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr

__all__ = [
    "Privacy",
    "PureDP",
    "ApproxDP",
    "ZCDP",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
]


def _finite_real(value: Any) -> bool:
    """Whether ``value`` is a finite real number (bools excluded)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value)
    )


def _positive(name: str, value: Any) -> float:
    """Validate a privacy parameter: a finite real number > 0."""
    if not (_finite_real(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _delta(value: Any) -> float:
    """Validate delta: a finite real number in (0, 1)."""
    if _finite_real(value) and value == 0:
        raise ValueError(
            "delta must be a finite number in (0, 1), got 0; "
            "for delta = 0 use PureDP(epsilon) (Laplace noise)"
        )
    if not (_finite_real(value) and 0 < value < 1):
        raise ValueError(f"delta must be a finite number in (0, 1), got {value!r}")
    return float(value)


def _sensitivity(value: Any) -> float:
    """Validate a sensitivity: a finite real number >= 0."""
    if not (_finite_real(value) and value >= 0):
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
    unit = _unit_analytic_sigma(_positive("epsilon", epsilon), _delta(delta))
    return _sensitivity(sensitivity) * unit


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
    epsilon = _positive("epsilon", epsilon)
    if epsilon >= 1:
        raise ValueError(
            f"the classic Gaussian calibration is only valid for epsilon < 1, got {epsilon!r}; "
            "use analytic_gaussian_sigma, which is valid for every epsilon"
        )
    log_ratio = math.log(1.25) - math.log(_delta(delta))  # ln(1.25 / delta), no overflow
    return _sensitivity(sensitivity) * math.sqrt(2.0 * log_ratio) / epsilon


def _format(x: float) -> str:
    """Short human-readable number: 1.0 -> '1', 1e-06 -> '1e-06'."""
    return f"{x:g}"


#: The largest finite double: noise whose variance exceeds it cannot be computed with.
_FLOAT_MAX = sys.float_info.max


class Privacy(abc.ABC):
    """A privacy definition: which noise to add, and how much.

    Subclasses are frozen dataclasses (equal, and hashed, by their parameters) that fix the
    sensitivity norm (:attr:`norm`), the noise distribution (:attr:`noise`) and implement
    :meth:`noise_scale`.

    Attributes
    ----------
    norm : int
        The norm (1 or 2) in which the strategy's sensitivity is measured.
    noise : str
        ``"laplace"`` or ``"gaussian"``.
    """

    __slots__ = ()

    norm: ClassVar[int]
    noise: ClassVar[str]

    @abc.abstractmethod
    def noise_scale(self, sensitivity: float) -> float:
        """Laplace scale :math:`b` or Gaussian standard deviation :math:`\\sigma`."""

    @abc.abstractmethod
    def _params(self) -> dict[str, float]:
        """The defining parameters, in constructor order."""

    @property
    @abc.abstractmethod
    def description(self) -> str:
        """A readable statement of the guarantee."""

    def noise_variance(self, sensitivity: float) -> float:
        """Variance of one noise draw.

        Laplace with scale :math:`b` has variance :math:`2b^2`; Gaussian with
        standard deviation :math:`\\sigma` has variance :math:`\\sigma^2`.

        Raises
        ------
        ValueError
            If the variance exceeds double precision (a huge sensitivity for this privacy level).
        """
        scale = self.noise_scale(sensitivity)
        try:
            return _finite_noise(self, sensitivity, 2.0 * scale**2 if self.noise == "laplace" else scale**2)
        except OverflowError:  # float ** 2 raises where multiplication would give inf
            return _finite_noise(self, sensitivity, math.inf)

    def unit_noise(self) -> Privacy:
        """The privacy definition with this noise distribution whose noise variance at sensitivity 1 is 1.

        :class:`PureDP` gives ``PureDP(sqrt(2))`` (Laplace of scale :math:`1/\\sqrt 2`);
        :class:`ApproxDP` and :class:`ZCDP` give ``ZCDP(0.5)`` (Gaussian with
        :math:`\\sigma = 1`). Strategies are compared at unit noise: the error of every strategy
        is the same multiple of its unit-noise error under any privacy level of one noise kind,
        so which strategy is better, and by how much (their ratio), does not depend on
        :math:`\\epsilon`, :math:`\\delta` or :math:`\\rho`.

        Examples
        --------
        >>> PureDP(0.1).unit_noise()
        PureDP(epsilon=1.4142135623730951)
        >>> ApproxDP(1.0, 1e-6).unit_noise()
        ZCDP(rho=0.5)
        >>> round(PureDP(0.1).unit_noise().noise_variance(1.0), 12)
        1.0
        """
        return _UNIT_NOISE[self.noise]

    def sample(
        self, size: int | tuple[int, ...], sensitivity: float, rng: np.random.Generator
    ) -> np.ndarray:
        """Draw i.i.d. noise of the given shape, calibrated to ``sensitivity``.

        Parameters
        ----------
        size : int or tuple of int
            Shape of the noise array.
        sensitivity : float
            Sensitivity of the strategy in the norm :attr:`norm`.
        rng : numpy.random.Generator
            Source of randomness, e.g. ``numpy.random.default_rng(seed)``.
        """
        if not isinstance(rng, np.random.Generator):
            raise TypeError(
                f"rng must be a numpy.random.Generator, got {type(rng).__name__}; "
                "create one with numpy.random.default_rng(seed)"
            )
        scale = self.noise_scale(sensitivity)
        if self.noise == "laplace":
            return rng.laplace(0.0, scale, size)
        return rng.normal(0.0, scale, size)

    def to_dict(self) -> dict[str, Any]:
        """``{"type": class name, **parameters}``; inverse of :meth:`from_dict`."""
        return {"type": type(self).__name__, **self._params()}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Privacy:
        """Rebuild a privacy definition from :meth:`to_dict` output."""
        kinds = {cls.__name__: cls for cls in (PureDP, ApproxDP, ZCDP)}
        params = dict(d)
        kind = params.pop("type", None)
        if kind not in kinds:
            raise ValueError(
                f"unknown privacy type {kind!r}; expected a 'type' entry among {sorted(kinds)}"
            )
        return kinds[kind](**params)


def _finite_noise(privacy: Privacy, sensitivity: float, value: float) -> float:
    """``value`` (a noise scale or variance for ``sensitivity``) if finite, else a ValueError naming the fix."""
    if math.isfinite(value):
        return value
    raise ValueError(
        f"the {privacy.noise.capitalize()} noise for sensitivity {_format(sensitivity)} under {privacy.description} "
        "is too large for double precision (its variance overflows): every answer would be pure noise; "
        "use a larger privacy parameter or a strategy with a smaller sensitivity"
    )


def _check_unit_noise(privacy: Privacy, name: str, least: float) -> None:
    """Refuse a privacy level whose noise at sensitivity 1 has a variance beyond double precision.

    ``name`` is the parameter that is too small and ``least`` its smallest usable value (the
    message suggests 1% more, so that the suggestion survives rounding to three digits).
    """
    try:
        privacy.noise_variance(1.0)
    except ValueError:
        value = getattr(privacy, name)
        raise ValueError(
            f"{name}={value!r} is too small: the {privacy.noise.capitalize()} noise variance at "
            "sensitivity 1 overflows double precision (the noise would drown every answer); "
            f"use {name} >= {1.01 * least:.3g}"
        ) from None


@dataclasses.dataclass(frozen=True)
class PureDP(Privacy):
    """Pure :math:`\\epsilon`-differential privacy via the Laplace mechanism.

    With L1 sensitivity :math:`\\Delta`, Laplace noise of scale
    :math:`b = \\Delta / \\epsilon` (variance :math:`2b^2`) gives
    :math:`\\epsilon`-DP.

    Parameters
    ----------
    epsilon : float
        Privacy loss, finite and > 0 (at least about ``1.1e-154``, below which the noise
        variance overflows double precision).

    Examples
    --------
    >>> PureDP(1)
    PureDP(epsilon=1.0)
    >>> PureDP(0.5).noise_scale(2.0)
    4.0
    """

    epsilon: float
    norm: ClassVar[int] = 1
    noise: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))
        _check_unit_noise(self, "epsilon", math.sqrt(2.0 / _FLOAT_MAX))

    def noise_scale(self, sensitivity: float) -> float:
        """Laplace scale :math:`b = \\Delta / \\epsilon`."""
        return _finite_noise(self, sensitivity, _sensitivity(sensitivity) / self.epsilon)

    def _params(self) -> dict[str, float]:
        return {"epsilon": self.epsilon}

    @property
    def description(self) -> str:
        return f"pure DP, epsilon={_format(self.epsilon)}"


@dataclasses.dataclass(frozen=True)
class ApproxDP(Privacy):
    """Approximate :math:`(\\epsilon, \\delta)`-DP via the analytic Gaussian mechanism.

    With L2 sensitivity :math:`\\Delta`, Gaussian noise of standard deviation
    :math:`\\sigma = \\Delta\\,\\sigma_1(\\epsilon, \\delta)` is added, where
    :math:`\\sigma_1` is the smallest noise meeting the exact privacy curve of
    Balle & Wang (2018); see :func:`analytic_gaussian_sigma`. :math:`\\sigma_1` is
    computed at construction (which refuses parameters it cannot be computed for) and
    cached per :math:`(\\epsilon, \\delta)`.

    Parameters
    ----------
    epsilon : float
        Privacy loss, finite and > 0.
    delta : float
        Failure probability, in (0, 1).

    Examples
    --------
    >>> ApproxDP(1, 1e-6)
    ApproxDP(epsilon=1.0, delta=1e-06)
    """

    epsilon: float
    delta: float
    norm: ClassVar[int] = 2
    noise: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))
        object.__setattr__(self, "delta", _delta(self.delta))
        _unit_analytic_sigma(self.epsilon, self.delta)  # refuse what cannot be calibrated, now
        try:
            self.noise_variance(1.0)
        except ValueError:
            raise ValueError(
                f"epsilon={self.epsilon!r} is too small for delta={self.delta!r}: the Gaussian noise "
                "variance at sensitivity 1 overflows double precision (it would drown every answer); "
                "use a larger epsilon"
            ) from None

    def noise_scale(self, sensitivity: float) -> float:
        """Gaussian standard deviation :math:`\\sigma = \\Delta\\,\\sigma_1(\\epsilon, \\delta)`."""
        unit = _unit_analytic_sigma(self.epsilon, self.delta)
        return _finite_noise(self, sensitivity, _sensitivity(sensitivity) * unit)

    def _params(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}

    @property
    def description(self) -> str:
        return (
            f"(epsilon={_format(self.epsilon)}, delta={_format(self.delta)})-DP, "
            "analytic Gaussian"
        )


@dataclasses.dataclass(frozen=True)
class ZCDP(Privacy):
    """:math:`\\rho`-zero-concentrated DP (Bun & Steinke 2016) via the Gaussian mechanism.

    With L2 sensitivity :math:`\\Delta`, Gaussian noise with
    :math:`\\sigma^2 = \\Delta^2 / (2\\rho)` gives :math:`\\rho`-zCDP.

    Parameters
    ----------
    rho : float
        Privacy parameter, finite and > 0 (at least about ``2.8e-309``, below which the
        noise variance overflows double precision).

    Examples
    --------
    >>> ZCDP(0.125).noise_scale(1.0)
    2.0
    """

    rho: float
    norm: ClassVar[int] = 2
    noise: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rho", _positive("rho", self.rho))
        _check_unit_noise(self, "rho", 0.5 / _FLOAT_MAX)

    def noise_scale(self, sensitivity: float) -> float:
        """Gaussian standard deviation :math:`\\sigma = \\Delta / \\sqrt{2\\rho}`."""
        return _finite_noise(self, sensitivity, _sensitivity(sensitivity) / math.sqrt(2.0 * self.rho))

    def _params(self) -> dict[str, float]:
        return {"rho": self.rho}

    @property
    def description(self) -> str:
        return f"zCDP, rho={_format(self.rho)}"


#: Per noise distribution, the privacy definition with unit noise variance at sensitivity 1
#: (see :meth:`Privacy.unit_noise`).
_UNIT_NOISE: dict[str, Privacy] = {"laplace": PureDP(math.sqrt(2.0)), "gaussian": ZCDP(0.5)}
