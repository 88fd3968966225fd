r"""Privacy definitions and the noise each one calls for.

A mechanism answers a strategy :math:`A` on the data vector :math:`x` as
:math:`y = s\,(\operatorname{round}(Ax/s) + Z)` on a grid of spacing :math:`s = 2^{-k}`, with
i.i.d. integer noise :math:`Z` drawn exactly by :mod:`hdmm.noise` and scaled by the sensitivity of
:math:`A` in the norm the privacy definition uses (raised by the grid's rounding bound, see
:func:`hdmm.noise.rounding_bound`):

* :class:`PureDP` -- :math:`\epsilon`-DP, L1 sensitivity :math:`\Delta_1`, discrete Laplace
  noise of scale :math:`b = \Delta_1 / \epsilon` (:math:`b/s` grid steps).
* :class:`ApproxDP` -- :math:`(\epsilon, \delta)`-DP, L2 sensitivity :math:`\Delta_2`, discrete
  Gaussian noise whose :math:`\rho`-zCDP guarantee implies :math:`(\epsilon, \delta)`-DP by the
  conversion of Canonne, Kamath & Steinke (2020, Corollary 13): see :func:`discrete_gaussian_sigma`.
* :class:`ZCDP` -- :math:`\rho`-zCDP, L2 sensitivity :math:`\Delta_2`, discrete Gaussian noise
  with :math:`\sigma^2 = \Delta_2^2 / (2\rho)` (Canonne, Kamath & Steinke 2020, Theorem 14).

Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy" (NeurIPS 2020): the
theorem and corollary numbers cited here are those of the arXiv version, arXiv:2004.00010v5.

For a strategy :math:`A`, the L1 sensitivity is the largest column L1 norm
:math:`\max_j \lVert A_{:,j} \rVert_1` and the L2 sensitivity the largest
column L2 norm :math:`\max_j \lVert A_{:,j} \rVert_2` (adding or removing one
record changes :math:`x` by one in one cell). :meth:`Privacy.noise_variance` gives the variance
of the continuous distribution of the same scale, an upper bound on that of the discrete noise
actually added (:func:`hdmm.noise.discrete_laplace_variance`,
:func:`hdmm.noise.discrete_gaussian_variance`; the two agree to a relative :math:`10^{-12}` or
better at hdmm's grid). docs/privacy.md states the guarantee in full. The arithmetic of the
calibrations and conversions (:func:`zcdp_rho`, :func:`zcdp_delta`, :func:`zcdp_epsilon`,
:func:`discrete_gaussian_sigma`, ...) is in :mod:`hdmm.calibration`; its names are importable from
here too.

**The noise is an object.** ``privacy.noise`` is the distribution (:mod:`hdmm.distributions`:
``LAPLACE`` for :class:`PureDP`, ``GAUSSIAN`` for the other two), which knows its name (what
files write), its sensitivity norm (:attr:`Privacy.norm` is the noise's), its variance at a scale,
its unit-variance scale and how to draw exact integers; a privacy class adds the calibration
(:meth:`Privacy.noise_scale`) and the inverse, :meth:`Privacy.at_noise_scale`, which gives
:meth:`Privacy.unit_noise`. Nothing in hdmm compares a noise's name.

**Composition is a method.** How privacy losses add up is each class's own rule, not a chain of
``isinstance`` tests in the budget: :meth:`Privacy.to_pure` (pure DP or ``None``),
:meth:`Privacy.to_zcdp` (:math:`\epsilon`-DP is :math:`\epsilon^2/2`-zCDP; ``ApproxDP`` is
:func:`zcdp_rho`-zCDP), :attr:`Privacy.budget_unit` and :attr:`Privacy.amount` (what a total of
the kind adds up in: epsilon, rho, or nothing for :math:`(\epsilon, \delta)`),
:meth:`Privacy.cost_of` (what a release adds to a total of this kind; ``None`` if it does not
compose) and :meth:`Privacy.epsilon_at` (an amount stated as :math:`(\epsilon, \delta)`-DP).
:class:`hdmm.Budget` only asks them (its module docstring has the table).

>>> ZCDP(1.0).cost_of(PureDP(1.0)), PureDP(1.0).cost_of(ZCDP(0.5)), round(ApproxDP(1.0, 1e-6).to_zcdp().rho, 6)
(0.5, None, 0.024356)
"""

from __future__ import annotations

import abc
import dataclasses
import math
import numbers
import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from . import noise as grid_noise
from .calibration import (analytic_gaussian_sigma, check_delta, check_positive, check_sensitivity,
                          classic_gaussian_sigma, discrete_gaussian_sigma, unit_discrete_sigma, zcdp_delta,
                          zcdp_epsilon, zcdp_rho)
from .distributions import GAUSSIAN, LAPLACE, Noise, noise_named
from .validation import is_finite_real

__all__ = [
    "Privacy",
    "PureDP",
    "ApproxDP",
    "ZCDP",
    "analytic_gaussian_sigma",
    "classic_gaussian_sigma",
    "discrete_gaussian_sigma",
    "exact_entry",
    "read_exact",
    "zcdp_delta",
    "zcdp_epsilon",
    "zcdp_rho",
]


def exact_entry(name: str, value: Any) -> dict[str, str]:
    """``{name + "_exact": "p/q"}`` for a :class:`fractions.Fraction` ``value``, else ``{}``.

    How an exact privacy parameter or cost travels in JSON (provenance, budget files): next to
    its nearest double under ``name``, so that readers that know only the float still read it.

    >>> exact_entry("rho", Fraction(293764, 114921)), exact_entry("rho", 0.5)
    ({'rho_exact': '293764/114921'}, {})
    """
    return {f"{name}_exact": f"{value.numerator}/{value.denominator}"} if isinstance(value, Fraction) else {}


def read_exact(name: str, text: Any, approx: Any) -> Fraction:
    """The fraction written by :func:`exact_entry` (``"p/q"`` or ``"p"``), checked against its double ``approx``.

    Raises
    ------
    ValueError
        If ``text`` is not ``"p/q"`` with whole numbers ``p`` and ``q > 0``, or ``approx`` is not
        the double nearest to it (the record was damaged or edited).

    >>> read_exact("rho", "293764/114921", 2.556225581051331)
    Fraction(293764, 114921)
    """
    parts = text.split("/") if isinstance(text, str) else []
    digits = [part.removeprefix("-") if i == 0 else part for i, part in enumerate(parts)]
    if not (1 <= len(parts) <= 2 and all(p.isdigit() and p.isascii() and len(p) <= 400 for p in digits)):
        raise ValueError(f"{name}_exact must be a fraction written 'p/q' (e.g. '293764/114921'), got {text!r}")
    if len(parts) == 2 and int(parts[1]) == 0:
        raise ValueError(f"{name}_exact has a zero denominator: {text!r}")
    value = Fraction(int(parts[0]), int(parts[1]) if len(parts) == 2 else 1)
    if not (is_finite_real(approx) and float(value) == approx):
        raise ValueError(f"{name}={approx!r} is not the double nearest to {name}_exact={text!r} "
                         f"({float(value)!r}); the record was damaged or edited")
    return value


def _format(x: float) -> str:
    """Short human-readable number: 1.0 -> '1', 1e-06 -> '1e-06'."""
    return f"{x:g}"


#: The largest finite double: noise whose variance exceeds it cannot be computed with.
_FLOAT_MAX = sys.float_info.max


class Privacy(abc.ABC):
    """A privacy definition: which noise to add, how much, and how its privacy losses compose.

    Subclasses are frozen dataclasses (equal, and hashed, by their parameters) that name the
    noise distribution (:attr:`noise`, whose norm becomes :attr:`norm`) and implement
    :meth:`noise_scale` and :meth:`at_noise_scale`. The composition methods (:meth:`to_pure`,
    :meth:`to_zcdp`, :meth:`cost_of`, :meth:`epsilon_at`, :attr:`budget_unit`, :attr:`amount`)
    are what :class:`hdmm.Budget` counts with; see the module docstring's table.

    Attributes
    ----------
    noise : hdmm.distributions.Noise
        The noise distribution (:data:`~hdmm.distributions.LAPLACE` or
        :data:`~hdmm.distributions.GAUSSIAN`; its ``str`` is its name, ``"laplace"`` or
        ``"gaussian"``).
    norm : int
        The norm (1 or 2) in which the strategy's sensitivity is measured: ``noise.norm``.
    budget_unit : str or None
        The parameter in which losses of this kind add up (sequential composition):
        ``"epsilon"`` (pure DP), ``"rho"`` (zCDP), ``None`` for :math:`(\\epsilon, \\delta)`-DP,
        whose losses do not add up.
    """

    __slots__ = ()

    norm: ClassVar[int]
    noise: ClassVar[Noise]
    budget_unit: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "noise" in cls.__dict__:
            if isinstance(cls.noise, str):  # a subclass written when the noise was its name
                cls.noise = noise_named(cls.noise)
            if "norm" in cls.__dict__ and cls.norm != cls.noise.norm:
                raise TypeError(f"{cls.__name__}.norm = {cls.norm!r}, but its {cls.noise.title} noise is calibrated to "
                                f"L{cls.noise.norm} sensitivity: leave norm out (it is the noise's)")
            cls.norm = cls.noise.norm  # the sensitivity norm is the noise's

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
        """Variance of one noise draw: an upper bound on that of the discrete noise added.

        Laplace with scale :math:`b` has variance :math:`2b^2`; Gaussian with
        standard deviation :math:`\\sigma` has variance :math:`\\sigma^2`. hdmm adds the discrete
        Laplace and discrete Gaussian of the same scales on a grid of spacing :math:`s`, whose
        variances are smaller: :math:`2b^2 - s^2/6 + O(s^4/b^2)` and below :math:`\\sigma^2`
        (Canonne, Kamath & Steinke 2020), with :math:`b, \\sigma > 2^{30} s` in hdmm's releases (unless the grid is coarsened for a tiny privacy parameter):
        the bound is exact to a relative :math:`10^{-18}` and this is the variance hdmm reports.

        Raises
        ------
        ValueError
            If the variance exceeds double precision (a huge sensitivity for this privacy level).
        """
        return _finite_noise(self, sensitivity, self.noise.variance(self.noise_scale(sensitivity)))

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
        return self.at_noise_scale(self.noise.unit_scale)

    @classmethod
    def at_noise_scale(cls, scale: float) -> Privacy:
        """The privacy definition of this kind whose noise at sensitivity 1 has ``scale`` (:meth:`noise_scale`).

        :class:`ApproxDP` gives a :class:`ZCDP` (the same discrete Gaussian; no one
        :math:`(\\epsilon, \\delta)` corresponds to a scale).

        >>> PureDP.at_noise_scale(0.5), ApproxDP.at_noise_scale(1.0)
        (PureDP(epsilon=2.0), ZCDP(rho=0.5))
        """
        raise NotImplementedError(f"{cls.__name__} does not say which of its levels gives a noise scale "
                                  "(define at_noise_scale): it has no unit noise")

    # ------------------------------------------------------------------ composition
    def to_pure(self) -> PureDP | None:
        """This definition as pure DP, if it is (``None``: Gaussian noise is not pure DP for any epsilon)."""
        return None

    def to_zcdp(self) -> ZCDP | None:
        """The zCDP guarantee this definition implies (``None`` if there is none).

        :math:`\\epsilon`-DP is :math:`\\epsilon^2/2`-zCDP (Bun & Steinke 2016, Proposition 1.4); hdmm's
        ``ApproxDP(epsilon, delta)`` adds discrete Gaussian noise calibrated to
        :func:`zcdp_rho` ``(epsilon, delta)``-zCDP (Canonne, Kamath & Steinke 2020, Theorem 14).

        >>> PureDP(1.0).to_zcdp(), ZCDP(0.25).to_zcdp()
        (ZCDP(rho=0.5), ZCDP(rho=0.25))
        """
        return None

    @property
    def amount(self) -> float | Fraction:
        """The parameter named by :attr:`budget_unit` (epsilon, rho): what losses of this kind add up in.

        Raises
        ------
        TypeError
            For a definition whose losses do not add up (:attr:`budget_unit` is ``None``).
        """
        raise TypeError(f"{self.description} losses do not add up: there is no amount to count a budget in")

    def cost_of(self, release: Privacy) -> float | Fraction | None:
        """What ``release`` adds to a total of this kind, in :attr:`budget_unit`; ``None`` if it does not compose.

        Pure DP adds epsilons (Dwork, McSherry, Nissim & Smith 2006) and takes pure-DP releases
        only; zCDP adds rhos (Bun & Steinke 2016, Lemma 2.3) and takes every release with a zCDP
        guarantee (:meth:`to_zcdp`). A kind that does not add up (:math:`(\\epsilon, \\delta)`-DP)
        takes none.

        >>> ZCDP(1.0).cost_of(PureDP(1.0)), PureDP(1.0).cost_of(ZCDP(0.1))
        (0.5, None)
        """
        return None

    @classmethod
    def epsilon_at(cls, amount: float | Fraction, delta: float | None) -> float:
        """An ``amount`` of this kind's :attr:`budget_unit` stated as :math:`(\\epsilon, \\delta)`-DP: its epsilon.

        Pure DP is :math:`(\\epsilon, 0)`-DP, so its epsilon is the amount at any ``delta`` (even
        ``None``); rho-zCDP is :math:`(\\epsilon, \\delta)`-DP for :func:`zcdp_epsilon` ``(rho, delta)``.

        Raises
        ------
        ValueError
            For zCDP without a ``delta``, or a kind whose losses do not add up.
        """
        raise ValueError(f"{cls.__name__} losses do not add up: no amount of them can be stated as (epsilon, delta)")

    def sample(
        self, size: int | tuple[int, ...], sensitivity: float, rng: None | int | np.random.Generator = None
    ) -> np.ndarray:
        """I.i.d. noise for ``size`` answers of a query with this ``sensitivity``, on hdmm's grid.

        The grid and the noise are those :func:`hdmm.measure` uses for that many answers: the
        result is ``spacing * z`` with integers ``z`` from :func:`hdmm.noise.draw`, the noise
        calibrated to the sensitivity raised by the grid's rounding bound
        (:func:`hdmm.noise.calibrate_grid`). Its variance is at most :meth:`noise_variance`.

        Parameters
        ----------
        size : int or tuple of int
            Shape of the noise array.
        sensitivity : float
            Sensitivity of the strategy in the norm :attr:`norm`.
        rng : None, int or numpy.random.Generator
            ``None``: the OS's cryptographic generator. A seed or Generator makes the noise
            reproducible (tests and research only: whoever has the seed can subtract it).
        """
        source = grid_noise.random_bits(rng)
        sensitivity = check_sensitivity(sensitivity)
        shape = (size,) if isinstance(size, numbers.Integral) else tuple(size)
        n = math.prod(shape)
        self.noise_scale(sensitivity)  # refuse noise beyond double precision, before drawing
        if sensitivity == 0 or n == 0:
            return np.zeros(shape)
        spacing, calibrated = grid_noise.calibrate_grid(sensitivity, n, self.norm, self.noise_scale)
        steps = grid_noise.draw(self.noise, self.noise_scale(calibrated) / spacing, shape, source)
        return steps * spacing

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
        return kinds[kind].from_params(params)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Privacy:
        """The definition from the parameters :meth:`to_dict` writes (without ``"type"``)."""
        return cls(**params)


def _finite_noise(privacy: Privacy, sensitivity: float, value: float) -> float:
    """``value`` (a noise scale or variance for ``sensitivity``) if finite, else a ValueError naming the fix."""
    if math.isfinite(value):
        return value
    raise ValueError(
        f"the {privacy.noise.title} noise for sensitivity {_format(sensitivity)} under {privacy.description} "
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
            f"{name}={value!r} is too small: the {privacy.noise.title} noise variance at "
            "sensitivity 1 overflows double precision (the noise would drown every answer); "
            f"use {name} >= {1.01 * least:.3g}"
        ) from None


@dataclasses.dataclass(frozen=True)
class PureDP(Privacy):
    """Pure :math:`\\epsilon`-differential privacy via the (discrete) Laplace mechanism.

    With L1 sensitivity :math:`\\Delta` (including the grid's rounding bound), discrete Laplace
    noise of scale :math:`b = \\Delta / \\epsilon` (:math:`b/s` steps of the grid :math:`s`;
    variance at most :math:`2b^2`) gives :math:`\\epsilon`-DP.

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
    noise: ClassVar[Noise] = LAPLACE
    budget_unit: ClassVar[str | None] = "epsilon"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))
        _check_unit_noise(self, "epsilon", math.sqrt(2.0 / _FLOAT_MAX))

    def noise_scale(self, sensitivity: float) -> float:
        """Laplace scale :math:`b = \\Delta / \\epsilon`."""
        return _finite_noise(self, sensitivity, check_sensitivity(sensitivity) / self.epsilon)

    @classmethod
    def at_noise_scale(cls, scale: float) -> Privacy:
        """``cls(1 / scale)``: scale :math:`b` at sensitivity 1 is :math:`\\epsilon = 1/b`."""
        return cls(1.0 / scale)

    def to_pure(self) -> PureDP:
        return self

    def to_zcdp(self) -> ZCDP:
        return ZCDP(self.epsilon**2 / 2.0)

    @property
    def amount(self) -> float:
        return self.epsilon

    def cost_of(self, release: Privacy) -> float | Fraction | None:
        pure = release.to_pure()
        return None if pure is None else pure.epsilon

    @classmethod
    def epsilon_at(cls, amount: float | Fraction, delta: float | None) -> float:
        return amount

    def _params(self) -> dict[str, float]:
        return {"epsilon": self.epsilon}

    @property
    def description(self) -> str:
        return f"pure DP, epsilon={_format(self.epsilon)}"


@dataclasses.dataclass(frozen=True)
class ApproxDP(Privacy):
    """Approximate :math:`(\\epsilon, \\delta)`-DP via the discrete Gaussian mechanism.

    With L2 sensitivity :math:`\\Delta`, discrete Gaussian noise of scale
    :math:`\\sigma = \\Delta\\,\\sigma_1(\\epsilon, \\delta)` is added, where
    :math:`\\sigma_1 = 1/\\sqrt{2\\rho}` for the largest :math:`\\rho` whose zCDP guarantee
    implies :math:`(\\epsilon, \\delta)`-DP (Canonne, Kamath & Steinke 2020, Corollary 13); see
    :func:`discrete_gaussian_sigma`. :math:`\\sigma_1` is computed at construction (which
    refuses parameters it cannot be computed for) and cached per :math:`(\\epsilon, \\delta)`.

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
    noise: ClassVar[Noise] = GAUSSIAN

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_positive("epsilon", self.epsilon))
        object.__setattr__(self, "delta", check_delta(self.delta))
        unit_discrete_sigma(self.epsilon, self.delta)  # refuse what cannot be calibrated, now
        try:
            self.noise_variance(1.0)
        except ValueError:
            raise ValueError(
                f"epsilon={self.epsilon!r} is too small for delta={self.delta!r}: the Gaussian noise "
                "variance at sensitivity 1 overflows double precision (it would drown every answer); "
                "use a larger epsilon"
            ) from None

    def noise_scale(self, sensitivity: float) -> float:
        """Discrete Gaussian scale :math:`\\sigma = \\Delta\\,\\sigma_1(\\epsilon, \\delta)` (:func:`discrete_gaussian_sigma`)."""
        unit = unit_discrete_sigma(self.epsilon, self.delta)
        return _finite_noise(self, sensitivity, check_sensitivity(sensitivity) * unit)

    @classmethod
    def at_noise_scale(cls, scale: float) -> Privacy:
        """``ZCDP.at_noise_scale(scale)``: the same discrete Gaussian as a zCDP guarantee."""
        return ZCDP.at_noise_scale(scale)

    def to_zcdp(self) -> ZCDP:
        return ZCDP(zcdp_rho(self.epsilon, self.delta))

    def _params(self) -> dict[str, float]:
        return {"epsilon": self.epsilon, "delta": self.delta}

    @property
    def description(self) -> str:
        return (
            f"(epsilon={_format(self.epsilon)}, delta={_format(self.delta)})-DP, "
            "discrete Gaussian"
        )


@dataclasses.dataclass(frozen=True)
class ZCDP(Privacy):
    """:math:`\\rho`-zero-concentrated DP (Bun & Steinke 2016) via the discrete Gaussian mechanism.

    With L2 sensitivity :math:`\\Delta` (including the grid's rounding bound), discrete
    Gaussian noise with :math:`\\sigma^2 = \\Delta^2 / (2\\rho)` gives :math:`\\rho`-zCDP
    (Canonne, Kamath & Steinke 2020, Theorem 14).

    Parameters
    ----------
    rho : float or fractions.Fraction
        Privacy parameter, finite and > 0 (at least about ``2.8e-309``, below which the
        noise variance overflows double precision). A :class:`fractions.Fraction` is kept as
        it is (an **exact rho**, e.g. the 2020 Census's ``Fraction(293764, 114921)``): budgets
        add it exactly, and :meth:`to_dict` (provenance, budget files) writes it as
        ``"rho_exact": "293764/114921"`` next to ``"rho"``, its nearest double. Any other number
        is converted to a float, as before. The noise is computed in double precision either way.

    Examples
    --------
    >>> ZCDP(0.125).noise_scale(1.0)
    2.0
    >>> from fractions import Fraction
    >>> z = ZCDP(Fraction(293764, 114921))
    >>> z.rho, z.description
    (Fraction(293764, 114921), 'zCDP, rho=293764/114921 (2.55623)')
    >>> z.to_dict()
    {'type': 'ZCDP', 'rho': 2.556225581051331, 'rho_exact': '293764/114921'}
    >>> Privacy.from_dict(z.to_dict()) == z, ZCDP(Fraction(1, 2)) == ZCDP(0.5)
    (True, True)
    """

    rho: float | Fraction
    noise: ClassVar[Noise] = GAUSSIAN
    budget_unit: ClassVar[str | None] = "rho"

    def __post_init__(self) -> None:
        if isinstance(self.rho, Fraction):
            check_positive("rho", self.rho)
        else:
            object.__setattr__(self, "rho", check_positive("rho", self.rho))
        _check_unit_noise(self, "rho", 0.5 / _FLOAT_MAX)

    def noise_scale(self, sensitivity: float) -> float:
        """Gaussian standard deviation :math:`\\sigma = \\Delta / \\sqrt{2\\rho}`."""
        return _finite_noise(self, sensitivity, check_sensitivity(sensitivity) / math.sqrt(float(2 * self.rho)))

    @classmethod
    def at_noise_scale(cls, scale: float) -> Privacy:
        """``cls(1 / (2 scale**2))``: :math:`\\sigma` at sensitivity 1 is :math:`\\rho = 1/(2\\sigma^2)`."""
        return cls(1.0 / (2.0 * scale * scale))

    def to_zcdp(self) -> ZCDP:
        return self

    @property
    def amount(self) -> float | Fraction:
        return self.rho

    def cost_of(self, release: Privacy) -> float | Fraction | None:
        zcdp = release.to_zcdp()
        return None if zcdp is None else zcdp.rho

    @classmethod
    def epsilon_at(cls, amount: float | Fraction, delta: float | None) -> float:
        if delta is None:
            raise ValueError("give the delta at which to state this zCDP budget as (epsilon, delta)-DP")
        return zcdp_epsilon(amount, delta)

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Privacy:
        params = dict(params)
        if "rho_exact" in params:  # an exact rho (the class docstring)
            params["rho"] = read_exact("rho", params.pop("rho_exact"), params.get("rho"))
        return cls(**params)

    def _params(self) -> dict[str, float | str]:
        return {"rho": float(self.rho), **exact_entry("rho", self.rho)}

    @property
    def description(self) -> str:
        if isinstance(self.rho, Fraction):
            return f"zCDP, rho={self.rho} ({_format(float(self.rho))})"
        return f"zCDP, rho={_format(self.rho)}"

