r"""Exact discrete noise on a grid, from a cryptographic source: the only place hdmm draws noise.

A release adds noise to the strategy answers :math:`a = Ax` as

.. math:: y = s\,\bigl(\operatorname{round}(a / s) + Z\bigr), \qquad s = 2^{-k},

with :math:`Z` i.i.d. integers from the **discrete Laplace** distribution,
:math:`P(Z = z) \propto e^{-|z|/t}`, or the **discrete Gaussian**,
:math:`P(Z = z) \propto e^{-z^2/(2\sigma^2)}` (Canonne, Kamath & Steinke 2020, "The Discrete
Gaussian for Differential Privacy", NeurIPS 2020; theorem, corollary and algorithm numbers
below are those of arXiv:2004.00010v5), with :math:`t` and :math:`\sigma` given in
grid steps. Nothing random ever passes through floating point: :math:`Z` is drawn exactly
(below), :math:`\operatorname{round}(a/s)` is computed exactly from the exact answers
(:mod:`hdmm.exact`, whose ``on_grid_exact`` the kernel uses; :func:`on_grid` here is the same
step for answers already rounded in floating point, kept for experiments), and the release is exactly :math:`s\,(\operatorname{round}(a/s) + Z)`: the float sum is the
correctly rounded value of the integer :math:`\operatorname{round}(a/s) + Z` (exact below
:math:`2^{53}`), so every released number is a function of that integer alone. This closes the
floating-point attack on textbook Laplace noise (Mironov, CCS 2012), where the low-order bits of
``a + laplace()`` reveal :math:`a`.

**Rounding bound.** Rounding to the grid moves each answer by at most :math:`s/2`. Neighbouring
data differ in one cell :math:`j`, and answer :math:`i` moves only if :math:`a_{ij} \ne 0` (the
product computes each answer from the cells of its row's support alone, so a zero coefficient
contributes exactly nothing, and rounding is a function of the answer): only the
:math:`k_j = |\{i : a_{ij} \ne 0\}|` answers of column :math:`j`'s support can differ, each by at
most the strategy's change plus :math:`s`. With :math:`k = \max_j k_j`
(:meth:`hdmm.Matrix.column_support`, at most the number of rows) the sensitivity of
:math:`\operatorname{round}(Ax/s)` (in grid steps, times :math:`s`) is at most

.. math:: \Delta_1 + k\,s \quad (L_1), \qquad \Delta_2 + \sqrt{k}\,s \quad (L_2)

(:func:`rounding_bound`; the :math:`L_2` bound by the triangle inequality over the :math:`k_j`
moved answers). :func:`grid_spacing` picks :math:`s` as the largest power of two with
:math:`k s \le 2^{-\text{GRID\_BITS}}\Delta_1` (:math:`\sqrt k s` for :math:`L_2`), so the bound
raises the noise by a relative :math:`2^{-30}` at most (unless a very small privacy
parameter makes :func:`calibrate_grid` coarsen the grid to keep the scale within ``MAX_SCALE``).
Counting :math:`k` by column rather than by rows keeps the grid fine on huge domains: a Kronecker
product of 50 identities has :math:`10^{100}` rows but :math:`k = 1`.

**Privacy of the discrete mechanisms** (integer-valued query :math:`q(x) = \operatorname{round}(Ax/s)`
with sensitivity :math:`D_p` in grid steps):

* discrete Laplace with :math:`t \ge D_1/\epsilon` is :math:`\epsilon`-DP: the ratio of the two
  output probabilities is :math:`e^{(|z - q(x')|_1 - |z - q(x)|_1)/t} \le e^{D_1/t}` (the
  geometric mechanism, Ghosh, Roughgarden & Sundararajan 2009);
* the discrete Gaussian is :math:`\rho`-zCDP with :math:`\rho = D_2^2/(2\sigma^2)` for independent
  coordinates (Canonne, Kamath & Steinke 2020, Theorem 14), and :math:`\rho`-zCDP implies
  :math:`(\epsilon, \delta)`-DP for every :math:`\alpha > 1` with
  :math:`\delta = e^{(\alpha-1)(\alpha\rho-\epsilon)}(1-1/\alpha)^{\alpha}/(\alpha-1)`
  (their Corollary 13; :func:`hdmm.privacy.zcdp_delta`).

**Exact samplers.** The discrete Laplace is a fair sign times a geometric magnitude :math:`G`
(:math:`P(G = g) \propto q^g`, :math:`q = e^{-1/t}`), redrawn on "minus zero". The binary digits
of :math:`G` are independent: :math:`P(G = g) \propto \prod_i (q^{2^i})^{g_i}`, so digit
:math:`i` is 1 with probability :math:`p_i = 1/(1 + e^{2^i/t})`. The digits below level
:math:`L` (the first with :math:`e^{-2^L/t} \le 2^{-40}`) are drawn one Bernoulli each; the part
above, :math:`G \gg L`, is geometric with parameter :math:`e^{-2^L/t}` and almost always 0, drawn
by repeated Bernoulli trials. A Bernoulli(:math:`p`) draw compares a uniform :math:`U \in [0, 1)`
with :math:`p` digit by digit: first 8 random bits against the first 8 bits of :math:`p`, which
decides unless they are equal (probability :math:`2^{-8}`), then 64 bits at a time against
:math:`p`'s expansion, which is computed once to 200 bits with exact integer arithmetic
(interval Taylor series, :class:`fractions.Fraction`), and beyond that to as many bits as the
comparison needs (never in practice). The discrete Gaussian is Algorithm 3 of Canonne, Kamath &
Steinke: a discrete Laplace proposal :math:`Y` of scale :math:`\lfloor\sigma\rfloor + 1`, accepted
with probability :math:`\exp(-(|Y| - \sigma^2/t)^2/(2\sigma^2))`. That probability is computed in
double precision with an error below :math:`2^{-48}` (IEEE-754 rounding of five operations and an
``exp`` accurate to :math:`2^8` ulp); a 64-bit uniform decides when it is more than
:math:`2^{-30}` away from it, and otherwise (about one draw in :math:`10^9`) the comparison is
finished exactly with rational arithmetic.

**Randomness.** ``rng=None`` (the default) takes the bits from the operating system's
cryptographic generator (``os.urandom``: ``getrandom(2)`` on Linux). An int seed or a
``numpy.random.Generator`` gives a reproducible stream instead, for tests and reproducible
research only: anyone who knows the seed can regenerate the noise and subtract it.

>>> z = discrete_laplace(3.0, 5, rng=0)
>>> z.dtype, z.shape
(dtype('int64'), (5,))
>>> bool(np.array_equal(z, discrete_laplace(3.0, 5, rng=0)))
True
>>> on_grid(np.array([0.3, 2.0]), 0.25, np.array([1, -2]))
array([0.5, 1.5])
"""

from __future__ import annotations

import functools
import math
import numbers
import os
from fractions import Fraction
from typing import Any, Callable

import numpy as np

__all__ = [
    "GRID_BITS",
    "MAX_SCALE",
    "RandomBits",
    "random_bits",
    "discrete_laplace",
    "discrete_gaussian",
    "discrete_laplace_pmf",
    "discrete_gaussian_pmf",
    "discrete_laplace_variance",
    "discrete_gaussian_variance",
    "grid_spacing",
    "rounding_bound",
    "calibrate_grid",
    "on_grid",
    "draw",
]

#: The grid's rounding bound is at most ``2**-GRID_BITS`` times the sensitivity.
GRID_BITS = 30

#: Largest noise scale in grid steps (Laplace ``t`` or Gaussian ``sigma``) the samplers accept:
#: draws then stay far inside int64.
MAX_SCALE = 2.0**50

#: Smallest noise scale in grid steps :func:`calibrate_grid` accepts: below one step almost every
#: answer would be released exactly (a privacy parameter such as epsilon = 1e308), so it is refused.
MIN_SCALE = 1.0

#: Bits of each fixed probability computed when a sampler is set up (8 + 3 * 64).
_TABLE_BITS = 200

#: Half-width of the band around the double-precision acceptance probability of the discrete
#: Gaussian in which the comparison is finished exactly (its error is below 2**-48).
_MARGIN = 2.0**-30

_MASK64 = (1 << 64) - 1


# ====================================================================== randomness
class RandomBits:
    """A source of uniform random bits: the OS's cryptographic generator or a numpy Generator.

    Make one with :func:`random_bits`.
    """

    def __init__(self, generator: np.random.Generator | None = None) -> None:
        self._generator = generator

    @property
    def secure(self) -> bool:
        """True when the bits come from the operating system's cryptographic generator."""
        return self._generator is None

    def words(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit words (``uint64``)."""
        if self._generator is None:
            return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        return self._generator.integers(0, 2**64, size=n, dtype=np.uint64)

    def bytes(self, n: int) -> np.ndarray:
        """``n`` independent uniform bytes (``uint8``)."""
        if self._generator is None:
            return np.frombuffer(os.urandom(n), dtype=np.uint8)
        return self.words(-(-n // 8)).view(np.uint8)[:n]

    def __repr__(self) -> str:
        return "RandomBits(os.urandom)" if self.secure else f"RandomBits({self._generator!r}, reproducible)"


def random_bits(rng: None | int | np.random.Generator | RandomBits = None) -> RandomBits:
    """The random bits for ``rng``: ``None`` for the OS's cryptographic generator, an int seed or a Generator.

    Seeds make the noise reproducible, and so known to anyone who has the seed: use them for
    tests and reproducible research only, never for a real release.

    Raises
    ------
    TypeError
        For anything else (a float, a bool, a legacy ``RandomState``).

    Examples
    --------
    >>> random_bits().secure, random_bits(7).secure
    (True, False)
    """
    if rng is None:
        return RandomBits()
    if isinstance(rng, RandomBits):
        return rng
    if isinstance(rng, np.random.Generator):
        return RandomBits(rng)
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)):
        return RandomBits(np.random.default_rng(int(rng)))
    raise TypeError(
        f"rng must be None (fresh OS entropy, for real releases), an int seed or a "
        f"numpy.random.Generator, got {type(rng).__name__}"
    )


# ====================================================================== exact arithmetic
def _exp_neg_fraction(f: Fraction, bits: int) -> tuple[int, int]:
    """Integers ``lo <= exp(-f) * 2**bits <= hi`` for ``0 <= f <= 1`` (alternating Taylor series)."""
    num, den = f.numerator, f.denominator
    term = 1 << bits  # floor(f**k / k! * 2**bits), each step losing less than one unit
    total, k, error = 0, 0, 0
    while term:
        total += -term if k % 2 else term
        error += 2
        k += 1
        term = term * num // (den * k)
    # the tail after the last (zero) term is below 2 units; each term is within 2 units
    return total - error - 2, total + error + 2


def _exp_neg_interval(x: Fraction, bits: int) -> tuple[int, int]:
    """Integers ``lo <= exp(-x) * 2**bits <= hi`` for rational ``x >= 0``."""
    whole = math.floor(x)
    if whole > 2 * bits + 2:  # exp(-x) < 2**-(bits + 1)
        return 0, 1
    work = bits + 2 * whole.bit_length() + 16
    lo, hi = _exp_neg_fraction(x - whole, work)
    if whole:
        e_lo, e_hi = _exp_neg_fraction(Fraction(1), work)
        for _ in range(whole):
            lo = lo * e_lo >> work
            hi = -(-(hi * e_hi) >> work)
    shift = work - bits
    return max(lo, 0) >> shift, -(-hi >> shift)


class _Probability:
    """A probability known exactly through intervals ``interval(bits) -> (lo, hi)`` of ``p * 2**bits``."""

    def __init__(self, interval: Callable[[int], tuple[int, int]]) -> None:
        self._interval = interval
        self._known: dict[int, int] = {}

    #: Most extra bits of working precision tried: a probability whose ``p * 2**k`` is an exact
    #: integer is never decided by intervals that straddle it, so the search stops here with an
    #: error instead of looping forever. hdmm's probabilities (``exp(-x)`` and ``1 / (1 + exp(x))``
    #: for rational ``x > 0``) are irrational, so this is never reached for them.
    max_extra = 1 << 16

    def bits(self, k: int) -> int:
        """``floor(p * 2**k)`` exactly (raising the working precision until the interval decides it)."""
        if k not in self._known:
            extra = 32
            while True:
                lo, hi = self._interval(k + extra)
                if lo >> extra == hi >> extra:
                    self._known[k] = lo >> extra
                    break
                if extra >= self.max_extra:
                    raise ArithmeticError(
                        f"floor(p * 2**{k}) is undecided at {k + extra} bits: p * 2**{k} is (within 2**-{extra}) "
                        "an integer, which an irrational probability never is; this is a bug in the sampler"
                    )
                extra *= 2
        return self._known[k]


def _geometric_digit(level: int, scale: Fraction) -> _Probability:
    """Digit ``level`` of a geometric magnitude: probability ``1 / (1 + exp(2**level / scale))``."""
    x = Fraction(2**level) / scale

    def interval(bits: int) -> tuple[int, int]:
        lo, hi = _exp_neg_interval(x, bits)  # y = exp(-x); p = y / (1 + y) increases with y
        one = 1 << bits
        return (lo << bits) // (one + lo), -(-(hi << bits) // (one + hi))

    return _Probability(interval)


def _exp_neg_probability(x: Fraction) -> _Probability:
    """The probability ``exp(-x)``."""
    return _Probability(lambda bits: _exp_neg_interval(x, bits))


def _compare_exact(p: _Probability, prefix: int, known: int, source: RandomBits) -> bool:
    """``U < p`` for a uniform ``U`` whose first ``known`` bits are ``prefix``, drawing more bits as needed."""
    while True:
        target = p.bits(known)
        if prefix != target:
            return prefix < target
        prefix = (prefix << 64) | int(source.words(1)[0])
        known += 64


# ====================================================================== Bernoulli tables
class _Table:
    """Fixed probabilities with their first ``_TABLE_BITS`` bits: a leading byte and three 64-bit words."""

    def __init__(self, probabilities: list[_Probability]) -> None:
        self.probabilities = probabilities
        expansions = [p.bits(_TABLE_BITS) for p in probabilities]
        self.lead = np.array([c >> (_TABLE_BITS - 8) for c in expansions], dtype=np.uint8)
        self.words = np.array([[(c >> (_TABLE_BITS - 8 - 64 * (j + 1))) & _MASK64 for j in range(3)]
                               for c in expansions], dtype=np.uint64).reshape(len(probabilities), 3)

    def draw(self, n: int, source: RandomBits) -> np.ndarray:
        """An ``(n, m)`` boolean array: column ``j`` holds ``n`` Bernoulli draws of probability ``j``."""
        m = len(self.probabilities)
        if m == 0 or n == 0:
            return np.zeros((n, m), dtype=bool)
        u = source.bytes(n * m).reshape(n, m)
        out = u < self.lead
        rows, cols = np.nonzero(u == self.lead)
        if rows.size:
            out[rows, cols] = self._finish(cols, source)
        return out

    def _finish(self, which: np.ndarray, source: RandomBits) -> np.ndarray:
        """Finish comparisons whose first byte tied with probability ``which``: 64 bits at a time."""
        result = np.zeros(which.size, dtype=bool)
        pending = np.arange(which.size)
        for j in range(3):
            w = source.words(pending.size)
            threshold = self.words[which[pending], j]
            result[pending[w < threshold]] = True
            pending = pending[w == threshold]
            if not pending.size:
                return result
        for i in pending:  # tied on all _TABLE_BITS bits: probability 2**-200 per draw
            p = self.probabilities[which[i]]
            result[i] = _compare_exact(p, p.bits(_TABLE_BITS), _TABLE_BITS, source)
        return result


class _GeometricSampler:
    """Exact geometric magnitudes ``P(G = g) = (1 - q) q**g``, ``q = exp(-1/scale)``, digit by digit."""

    def __init__(self, scale: Fraction) -> None:
        levels = 0
        while Fraction(2**levels) < 28 * scale:  # then exp(-2**levels / scale) < exp(-28) < 2**-40
            levels += 1
        self.levels = levels
        self.tail = _exp_neg_probability(Fraction(2**levels) / scale)
        self.table = _Table([_geometric_digit(i, scale) for i in range(levels)] + [self.tail])

    def draw(self, n: int, source: RandomBits) -> np.ndarray:
        bits = self.table.draw(n, source)
        packed = np.packbits(bits[:, : self.levels], axis=1, bitorder="little")
        full = np.zeros((n, 8), dtype=np.uint8)
        full[:, : packed.shape[1]] = packed
        g = full.view("<u8").reshape(n).astype(np.int64)
        for row in np.flatnonzero(bits[:, self.levels]):  # G >= 2**levels: probability below 2**-40
            high = 1
            while _compare_exact(self.tail, 0, 0, source):
                high += 1
            value = int(g[row]) + (high << self.levels)
            if value >= 2**62:
                raise OverflowError("a geometric draw exceeded 2**62 (probability below 2**-1000)")
            g[row] = value
        return g


def _check_scale(name: str, scale) -> Fraction:
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (numbers.Real, Fraction)):
        raise TypeError(f"{name} must be a real number, got {type(scale).__name__}")
    if not (math.isfinite(float(scale)) and 0 < scale <= MAX_SCALE):
        raise ValueError(f"{name} must be a finite number in (0, 2**50] (grid steps), got {scale!r}")
    return Fraction(scale)


def _size(size) -> tuple[int, tuple[int, ...]]:
    shape = (size,) if isinstance(size, numbers.Integral) else tuple(size)
    if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Integral) or d < 0 for d in shape):
        raise ValueError(f"size must be a non-negative int or a tuple of them, got {size!r}")
    return math.prod(shape), tuple(int(d) for d in shape)


@functools.lru_cache(maxsize=64)
def _geometric(scale: Fraction) -> _GeometricSampler:
    return _GeometricSampler(scale)


def _laplace(n: int, scale: Fraction, source: RandomBits) -> np.ndarray:
    sampler = _geometric(scale)
    out = np.empty(n, dtype=np.int64)
    todo = np.arange(n)
    while todo.size:
        g = sampler.draw(todo.size, source)
        negative = (source.bytes(todo.size) & 1).astype(bool)
        redo = negative & (g == 0)  # "minus zero": drawn again, so that 0 is not counted twice
        keep = ~redo
        out[todo[keep]] = np.where(negative[keep], -g[keep], g[keep])
        todo = todo[redo]
    return out


def discrete_laplace(scale: float, size: int | tuple[int, ...],
                     rng: None | int | np.random.Generator | RandomBits = None) -> np.ndarray:
    r"""Exact draws of the discrete Laplace distribution :math:`P(z) \propto e^{-|z|/t}` on the integers.

    Parameters
    ----------
    scale
        :math:`t > 0`, in grid steps (at most ``MAX_SCALE`` = :math:`2^{50}`); its exact
        rational value is used.
    size
        Number or shape of the draws.
    rng
        ``None``: the OS's cryptographic generator. An int seed or ``numpy.random.Generator``:
        a reproducible stream (tests and research only).

    Returns
    -------
    numpy.ndarray
        ``int64`` draws of shape ``size``.

    Examples
    --------
    >>> z = discrete_laplace(2**40, 1000, rng=1)
    >>> bool(np.all(np.abs(z) < 2**40 * 40))
    True
    """
    t = _check_scale("scale", scale)
    n, shape = _size(size)
    return _laplace(n, t, random_bits(rng)).reshape(shape)


def discrete_gaussian(sigma: float, size: int | tuple[int, ...],
                      rng: None | int | np.random.Generator | RandomBits = None) -> np.ndarray:
    r"""Exact draws of the discrete Gaussian :math:`P(z) \propto e^{-z^2/(2\sigma^2)}` on the integers.

    Algorithm 3 of Canonne, Kamath & Steinke (2020): discrete Laplace proposals of scale
    :math:`t = \lfloor\sigma\rfloor + 1`, each accepted with probability
    :math:`\exp(-(|y| - \sigma^2/t)^2 / (2\sigma^2))`, decided exactly (module docstring).

    Parameters
    ----------
    sigma
        :math:`\sigma > 0`, in grid steps (at most :math:`2^{50}`); its exact rational value is used.
    size, rng
        As for :func:`discrete_laplace`.

    Examples
    --------
    >>> z = discrete_gaussian(1.5, 100_000, rng=2)
    >>> bool(abs(z.var() - discrete_gaussian_variance(1.5)) < 0.05)
    True
    """
    s = _check_scale("sigma", sigma)
    n, shape = _size(size)
    source = random_bits(rng)
    sigma2 = s * s
    t = math.floor(s) + 1
    tau = sigma2 / t
    tau_f, half_inv = float(tau), float(1 / (2 * sigma2))
    out = np.empty(n, dtype=np.int64)
    filled = 0
    while filled < n:
        need = n - filled
        y = _laplace(need + need // 2 + 16, Fraction(t), source)
        a = np.abs(y)
        d = a.astype(np.float64) - tau_f
        p = np.exp(-(d * d) * half_inv)
        u = source.words(y.size)
        low = (u >> np.uint64(11)).astype(np.float64) * 2.0**-53  # U lies in [low, low + 2**-53)
        accept = low + 2.0**-53 <= p - _MARGIN
        unsure = ~accept & ~(low >= p + _MARGIN) | (a >= 2**53)
        for i in np.flatnonzero(unsure):  # within the margin: finish with exact rationals
            gamma = (Fraction(int(a[i])) - tau) ** 2 / (2 * sigma2)
            accept[i] = _compare_exact(_exp_neg_probability(gamma), int(u[i]), 64, source)
        taken = y[accept][:need]
        out[filled: filled + taken.size] = taken
        filled += taken.size
    return out.reshape(shape)


def draw(noise: Any, scale: float, size: int | tuple[int, ...],
         rng: None | int | np.random.Generator | RandomBits = None) -> np.ndarray:
    """Integer noise of the distribution ``noise`` (``privacy.noise``, an :class:`hdmm.distributions.Noise`).

    The one entry point through which the kernel draws a release's noise: the distribution object
    calls its exact sampler here (:func:`discrete_laplace`, :func:`discrete_gaussian`), at a scale
    of ``scale`` grid steps.

    >>> from hdmm.distributions import GAUSSIAN
    >>> draw(GAUSSIAN, 2.0, 3, rng=5).shape
    (3,)
    """
    integers = getattr(noise, "integers", None)
    if isinstance(noise, str) or not callable(integers):
        raise ValueError(f"unknown noise kind {noise!r}: draw takes a noise distribution (privacy.noise, or "
                         "hdmm.distributions.noise_named('laplace') for a name)")
    return integers(scale, size, rng)


# ====================================================================== exact distributions
def discrete_laplace_pmf(z, scale: float) -> np.ndarray:
    r""":math:`P(Z = z) = \frac{1 - q}{1 + q} q^{|z|}`, :math:`q = e^{-1/t}` (in double precision)."""
    q = math.exp(-1.0 / float(scale))
    return (-math.expm1(-1.0 / float(scale))) / (1.0 + q) * np.exp(-np.abs(np.asarray(z, dtype=float)) / float(scale))


def _gaussian_normaliser(sigma: float) -> float:
    """:math:`\\sum_z e^{-z^2/(2\\sigma^2)}` (terms beyond 40 sigma are below 1e-300 of the total)."""
    reach = int(40 * sigma) + 2
    z = np.arange(-reach, reach + 1, dtype=float)
    return float(np.sum(np.exp(-z * z / (2 * sigma * sigma))))


def discrete_gaussian_pmf(z, sigma: float) -> np.ndarray:
    r""":math:`P(Z = z) = e^{-z^2/(2\sigma^2)} / \sum_{y} e^{-y^2/(2\sigma^2)}` (double precision, modest sigma)."""
    z = np.asarray(z, dtype=float)
    return np.exp(-z * z / (2 * sigma * sigma)) / _gaussian_normaliser(sigma)


def discrete_laplace_variance(scale: float) -> float:
    r"""Variance :math:`2q/(1-q)^2 = 1/(2\sinh^2(1/(2t)))` of the discrete Laplace; below :math:`2t^2`.

    >>> round(2 * 1000.0**2 - discrete_laplace_variance(1000.0), 6)  # 2 t**2 - 1/6 + O(1/t**2)
    0.166667
    """
    u = 0.5 / float(scale)
    return 0.5 / math.sinh(u) ** 2


def discrete_gaussian_variance(sigma: float) -> float:
    r"""Variance of the discrete Gaussian; below :math:`\sigma^2` (Canonne, Kamath & Steinke 2020).

    Summed directly for :math:`\sigma \le 10^4`; above, it equals :math:`\sigma^2` to within a
    relative :math:`10^{-1000}`, and :math:`\sigma^2` is returned.
    """
    sigma = float(sigma)
    if sigma > 1e4:
        return sigma * sigma
    reach = int(40 * sigma) + 2
    z = np.arange(-reach, reach + 1, dtype=float)
    w = np.exp(-z * z / (2 * sigma * sigma))
    return float(np.sum(w * z * z) / np.sum(w))


# ====================================================================== the grid
def _rows_factor(rows: int, norm: int) -> float:
    """``rows`` (L1) or ``sqrt(rows)`` (L2), rounded up (``rows`` may be a Python int of any size)."""
    rows = int(rows)
    if rows > 2**1000:
        raise ValueError(f"one cell can move {rows:.3e} answers: too many to bound the grid's rounding; "
                         "measure a strategy with fewer non-zeros per column")
    if norm == 1:
        return math.nextafter(float(rows), math.inf) if rows > 2**53 else float(rows)
    return math.sqrt(rows) * (1 + 2**-50)  # sqrt is correctly rounded: this is an upper bound


def rounding_bound(spacing: float, rows: int, norm: int) -> float:
    r"""What rounding to a grid of ``spacing`` adds to the sensitivity when one cell moves at most ``rows`` answers.

    ``rows`` is the strategy's largest column support :math:`k` (at most its number of rows; see
    the module docstring). Each rounded answer is within :math:`s/2` of the answer, so two
    rounded answer vectors differ from the difference of the answers by at most :math:`s` in each
    of the :math:`k` answers that can move: :math:`k s` in :math:`L_1` and :math:`\sqrt{k}\,s` in
    :math:`L_2` (rounded up here).

    >>> rounding_bound(2.0**-20, 4, 1), rounding_bound(2.0**-20, 4, 2) > 2 * 2.0**-20
    (3.814697265625e-06, True)
    """
    return _rows_factor(rows, norm) * spacing


def grid_spacing(sensitivity: float, rows: int, norm: int) -> float:
    r"""The grid: the largest power of two :math:`s` with ``rounding_bound(s) <= 2**-GRID_BITS * sensitivity``.

    >>> grid_spacing(1.0, 1, 1) == 2.0**-30
    True
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"the grid needs a finite sensitivity > 0, got {sensitivity!r}")
    target = sensitivity / _rows_factor(max(int(rows), 1), norm) * 2.0**-GRID_BITS
    mantissa, exponent = math.frexp(target)  # target = mantissa * 2**exponent, 0.5 <= mantissa < 1
    return math.ldexp(1.0, exponent - 1)


def calibrate_grid(sensitivity: float, rows: int, norm: int, noise_scale: Callable[[float], float],
                   headroom: float = 0.0) -> tuple[float, float]:
    """``(spacing, calibrated sensitivity)``: the grid for ``rows`` answers and a sensitivity that covers its rounding.

    The spacing is :func:`grid_spacing` of ``sensitivity``, made coarser (by powers of two) if
    the noise scale ``noise_scale(calibrated)`` would exceed ``MAX_SCALE`` grid steps. The
    calibrated sensitivity is ``sensitivity`` itself when the rounding bound fits in
    ``headroom`` (a part of ``sensitivity`` that is already a safety margin, e.g. hdmm's
    ``SENSITIVITY_MARGIN``), else ``sensitivity`` plus the rounding bound, rounded up.

    >>> s, d = calibrate_grid(1.0, 10, 1, lambda d: d / 1.0)
    >>> s == 2.0**-34, d == math.nextafter(1.0 + 10 * s, math.inf)
    (True, True)
    >>> calibrate_grid(1.0, 10, 1, lambda d: d, headroom=1e-9)[1]
    1.0
    """
    spacing = grid_spacing(sensitivity, rows, norm)
    while True:
        bound = rounding_bound(spacing, rows, norm)
        calibrated = sensitivity if bound <= headroom else math.nextafter(sensitivity + bound, math.inf)
        steps = noise_scale(calibrated) / spacing
        if steps < MIN_SCALE:  # e.g. epsilon = 1e308: refused before any noise, as no privacy at all
            raise ValueError(
                f"the noise would be {steps:.3g} steps of the release grid (spacing {spacing:.3g}), below one step: "
                "the release would be the exact answers, with no privacy; the privacy parameter (epsilon or rho) is "
                "far too large: use a smaller one (even epsilon = 10 protects little)"
            )
        if steps <= MAX_SCALE:
            return spacing, calibrated
        spacing *= 2.0


def on_grid(values: np.ndarray, spacing: float, noise: np.ndarray) -> np.ndarray:
    r""":math:`s\,(\operatorname{round}(v/s) + z)` as doubles, a function of the integer :math:`\operatorname{round}(v/s) + z` alone.

    ``spacing`` must be a power of two, so :math:`v/s` and the final product are exact;
    :math:`\operatorname{round}(v/s)` (to nearest, ties to even) is an integer-valued double, and
    its sum with an integer :math:`|z| < 2^{53}` is the correctly rounded value of the exact
    integer sum (larger :math:`z`, drawn only at scales near ``MAX_SCALE``, are added in Python
    integers). So the released double is exactly the grid point whenever
    :math:`|\operatorname{round}(v/s) + z| < 2^{53}`, and otherwise the double nearest it.

    Raises
    ------
    ValueError
        If ``spacing`` is not a positive power of two, or ``values / spacing`` overflows.
    """
    mantissa, _ = math.frexp(spacing) if math.isfinite(spacing) and spacing > 0 else (0.0, 0)
    if mantissa != 0.5:
        raise ValueError(f"the grid spacing must be a positive power of two, got {spacing!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        centre = np.rint(np.asarray(values, dtype=np.float64) / spacing)
    if not np.all(np.isfinite(centre)):
        raise ValueError("the answers divided by the grid spacing overflow double precision")
    noise = np.asarray(noise, dtype=np.int64)
    out = centre + noise.astype(np.float64)
    for i in np.flatnonzero(np.abs(noise) >= 2**53):
        out[i] = float(int(centre[i]) + int(noise[i]))
    return out * spacing
