r"""Noise distributions as objects: what a privacy definition adds, and everything that depends on which one it is.

A privacy definition (:mod:`hdmm.privacy`) owns its noise distribution as an object,
``privacy.noise``: :data:`LAPLACE` for :class:`~hdmm.PureDP`, :data:`GAUSSIAN` for
:class:`~hdmm.ApproxDP` and :class:`~hdmm.ZCDP`. Code that depends on the distribution asks the
object instead of comparing its name, so that a new distribution is one subclass of
:class:`Noise` (and a privacy class that names it) and no other file changes.

What a :class:`Noise` knows
---------------------------
name : str
    Its name as files and messages write it (``"laplace"``, ``"gaussian"``): the release
    provenance's ``"noise"`` entry. ``str(noise)`` is the name, and a noise compares equal to
    its name, so code written when ``privacy.noise`` was that string still works; hdmm itself
    never compares names.
title : str
    The name in a sentence (``"Laplace"``).
norm : int
    The norm, 1 or 2, of the sensitivity it is calibrated to: :math:`\Delta_1(A) = \max_j
    \lVert A_{:,j}\rVert_1` or :math:`\Delta_2(A) = \max_j \lVert A_{:,j}\rVert_2`
    (:meth:`Noise.sensitivity`). :attr:`Noise.l2` says whether it is 2: the strategy optimizers whose
    objective is the L2 one (the residual strategy, the convex program, the square-root
    strategy) apply to such noise only.
normal : bool
    Whether linear combinations of its draws are normally distributed (Gaussian noise): then
    an answer's error is :math:`N(0, v)` and the confidence intervals and :math:`\ell_p` errors
    computed from :math:`v` are exact, not normal approximations.
variance(scale), discrete_variance(steps)
    The variance of the continuous distribution at a scale (Laplace :math:`2b^2`, Gaussian
    :math:`\sigma^2`), the one hdmm reports and optimizes (an upper bound that the discrete
    noise meets to a relative :math:`10^{-18}` at hdmm's grid, see :mod:`hdmm.privacy`), and
    the exact variance of the discrete noise at a scale in grid steps
    (:func:`hdmm.noise.discrete_laplace_variance`, :func:`hdmm.noise.discrete_gaussian_variance`).
unit_scale : float
    The scale whose :meth:`Noise.variance` is 1 (Laplace :math:`1/\sqrt 2`, Gaussian 1).
    Strategies are compared at unit noise: :meth:`hdmm.privacy.Privacy.unit_noise` is the privacy
    definition of the same kind whose noise has this scale at sensitivity 1
    (``PureDP(sqrt(2))``, ``ZCDP(0.5)``).
integers(steps, size, rng)
    Exact i.i.d. integer noise at a scale in grid steps. The samplers stay in :mod:`hdmm.noise`
    (the only module that draws noise; the kernel is its only caller in a release):
    :func:`hdmm.noise.draw` calls this method, which calls the exact sampler of the distribution
    (:func:`hdmm.noise.discrete_laplace`, :func:`hdmm.noise.discrete_gaussian`). There is
    deliberately no continuous (floating-point) sampler: releases are on a grid
    (:meth:`hdmm.privacy.Privacy.sample` gives ``spacing * integers``), which closes the
    floating-point attack of Mironov (CCS 2012).

The objects are immutable and hold no state: every :class:`LaplaceNoise` equals every other
(and hashes like its name), so they survive pickling (Spark tasks) and compare as before.

Adding a distribution
---------------------
Subclass :class:`Noise`, set the class attributes, implement the three methods, and name it in a
privacy class (``noise = MyNoise()``; the privacy class's ``norm`` follows it)::

    class StaircaseDP(PureDP):
        noise = StaircaseNoise()

The expected error (:mod:`hdmm.error`), the plan's variances, unit-noise comparisons and the
kernel's draw then follow it; tests/test_distributions.py does this with a test-only
distribution. A privacy file names only the built-in privacy classes (:meth:`~hdmm.privacy.Privacy.from_dict`).

>>> LAPLACE.variance(2.0), GAUSSIAN.variance(2.0), LAPLACE.norm, GAUSSIAN.l2
(8.0, 4.0, 1, True)
>>> noise_named("gaussian") is GAUSSIAN, str(LAPLACE), LAPLACE == "laplace"
(True, 'laplace', True)
"""

from __future__ import annotations

import abc
import math
from typing import Any, ClassVar

import numpy as np

from . import noise as exact

__all__ = ["Noise", "LaplaceNoise", "GaussianNoise", "LAPLACE", "GAUSSIAN", "NOISES", "noise_named"]


def _square(scale: float) -> float:
    """``scale ** 2``, ``inf`` where it overflows double precision (``float ** 2`` raises there)."""
    try:
        return float(scale) ** 2
    except OverflowError:
        return math.inf


class Noise(abc.ABC):
    """A noise distribution a privacy definition adds (module docstring): immutable, equal by kind.

    Attributes
    ----------
    name : str
        As files and messages write it (``"laplace"``).
    title : str
        As a sentence writes it (``"Laplace"``).
    norm : int
        The sensitivity norm it is calibrated to, 1 or 2.
    normal : bool
        Whether linear combinations of its draws are normal (exact intervals).
    unit_scale : float
        The scale of unit :meth:`variance`.
    """

    __slots__ = ()

    name: ClassVar[str]
    title: ClassVar[str]
    norm: ClassVar[int]
    normal: ClassVar[bool]
    unit_scale: ClassVar[float]

    @abc.abstractmethod
    def variance(self, scale: float) -> float:
        """Variance of the continuous distribution at ``scale`` (``inf`` beyond double precision)."""

    @abc.abstractmethod
    def discrete_variance(self, steps: float) -> float:
        """Exact variance of the discrete noise at a scale of ``steps`` grid steps (in steps squared)."""

    @abc.abstractmethod
    def integers(self, steps: float, size: int | tuple[int, ...],
                 rng: None | int | np.random.Generator | exact.RandomBits = None) -> np.ndarray:
        """I.i.d. integer noise at a scale of ``steps`` grid steps, drawn exactly by :mod:`hdmm.noise`."""

    @property
    def l2(self) -> bool:
        """Whether the noise is calibrated to L2 sensitivity (then the L2 strategy optimizers apply)."""
        return self.norm == 2

    def sensitivity(self, matrix: Any) -> float:
        """The sensitivity of a strategy ``matrix`` (an :class:`hdmm.matrix.Matrix`) in this noise's norm."""
        return matrix.sensitivity(self.norm)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):  # code written when privacy.noise was its name
            return other == self.name
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __reduce__(self) -> tuple:
        return type(self), ()


class LaplaceNoise(Noise):
    r"""The (discrete) Laplace distribution, :math:`P(Z = z) \propto e^{-|z|/b}`: pure DP, L1 sensitivity.

    The continuous Laplace of scale :math:`b` has variance :math:`2b^2`; the discrete one on a
    grid of spacing :math:`s` has :math:`2b^2 - s^2/6 + O(s^4/b^2)`.

    >>> round(LaplaceNoise().variance(LaplaceNoise.unit_scale), 12)
    1.0
    """

    __slots__ = ()
    name = "laplace"
    title = "Laplace"
    norm = 1
    normal = False
    unit_scale = 1.0 / math.sqrt(2.0)

    def variance(self, scale: float) -> float:
        return 2.0 * _square(scale)

    def discrete_variance(self, steps: float) -> float:
        return exact.discrete_laplace_variance(steps)

    def integers(self, steps, size, rng=None) -> np.ndarray:
        return exact.discrete_laplace(steps, size, rng)


class GaussianNoise(Noise):
    r"""The (discrete) Gaussian distribution, :math:`P(Z = z) \propto e^{-z^2/(2\sigma^2)}`: zCDP, L2 sensitivity.

    Variance :math:`\sigma^2` (the discrete one a little less; Canonne, Kamath & Steinke 2020).

    >>> GaussianNoise().variance(3.0), GaussianNoise().normal
    (9.0, True)
    """

    __slots__ = ()
    name = "gaussian"
    title = "Gaussian"
    norm = 2
    normal = True
    unit_scale = 1.0

    def variance(self, scale: float) -> float:
        return _square(scale)

    def discrete_variance(self, steps: float) -> float:
        return exact.discrete_gaussian_variance(steps)

    def integers(self, steps, size, rng=None) -> np.ndarray:
        return exact.discrete_gaussian(steps, size, rng)


#: The discrete Laplace distribution (:class:`~hdmm.PureDP`).
LAPLACE = LaplaceNoise()

#: The discrete Gaussian distribution (:class:`~hdmm.ApproxDP`, :class:`~hdmm.ZCDP`).
GAUSSIAN = GaussianNoise()

#: The built-in distributions by name: the one place a name is read into a distribution.
NOISES: dict[str, Noise] = {n.name: n for n in (LAPLACE, GAUSSIAN)}


def noise_named(name: Any) -> Noise:
    """The built-in distribution called ``name`` (``"laplace"`` or ``"gaussian"``), e.g. from a file or an option.

    Raises
    ------
    ValueError
        For any other name.

    >>> noise_named("laplace")
    LaplaceNoise()
    """
    if isinstance(name, str) and name in NOISES:
        return NOISES[name]
    raise ValueError(f"unknown noise {name!r}; expected one of {sorted(NOISES)}")
