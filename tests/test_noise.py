"""Exact discrete noise (hdmm.noise): distributions, exactness of every path, privacy audits, no float leak.

Every sampler is checked against its exact probability mass function by chi-square tests on
10^6 draws (small, typical and huge scales); the rare exact paths are checked by forcing them;
small strategies are audited on neighbouring data sets (10^5 releases each, epsilon lower bounds
from threshold events with Clopper-Pearson intervals); and the floating-point attack on
textbook Laplace noise (Mironov 2012) is shown to separate neighbours with numpy's float Laplace
and to fail against hdmm's release.
"""

from __future__ import annotations

import math
import os
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import beta, chisquare, norm

import hdmm
from hdmm.exact import exact_centres, on_grid_exact
from hdmm import noise
from hdmm.kernel import measure
from hdmm.planning import strategy_plan
from hdmm.marginals import Marginals
from hdmm.matrix import Kronecker
from hdmm.optimizers import PIdentity
from hdmm.workload import IdentityTotal

MILLION = 1_000_000


# ====================================================================== chi-square helpers
def laplace_cdf(z: np.ndarray, t: float) -> np.ndarray:
    """P(Z <= z) of the discrete Laplace with scale t, for integer z (closed form)."""
    z = np.asarray(z, dtype=float)
    q = math.exp(-1.0 / t)
    upper = np.exp(-(np.abs(z) + (z >= 0)) / t) / (1.0 + q)  # q^(z+1)/(1+q) for z >= 0, q^(-z)/(1+q) below
    return np.where(z >= 0, 1.0 - upper, upper)


def gaussian_cdf(z: np.ndarray, sigma: float) -> np.ndarray:
    """P(Z <= z) of the discrete Gaussian: summed exactly for modest sigma, else Phi((z + 1/2)/sigma)."""
    z = np.asarray(z, dtype=float)
    if sigma > 1000:  # the difference is far below what 10^6 draws can see (Poisson summation)
        return norm.cdf((z + 0.5) / sigma)
    reach = int(40 * sigma) + 2
    support = np.arange(-reach, reach + 1)
    cdf = np.cumsum(noise.discrete_gaussian_pmf(support, sigma))
    return np.interp(z, support, cdf, left=0.0, right=1.0)


def chi_square_pvalue(draws: np.ndarray, cdf, scale: float, bins: int = 60) -> float:
    """Chi-square p-value of integer draws against a CDF, on about ``bins`` bins of equal probability."""
    probe = np.unique(np.round(np.linspace(-12, 12, 20_001) * scale).astype(np.int64))
    values = cdf(probe)
    edges = np.unique(probe[np.searchsorted(values, np.linspace(0, 1, bins + 1)[1:-1])])  # bin k: (e_{k-1}, e_k]
    upper = np.concatenate([cdf(edges), [1.0]])
    expected = np.diff(np.concatenate([[0.0], upper])) * draws.size
    observed = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=edges.size + 1)
    keep = expected > 0
    return float(chisquare(observed[keep], expected[keep] * observed.sum() / expected[keep].sum()).pvalue)


LAPLACE_SCALES = [0.3, 1.0, 7.5, 1e6, 2.0**40, noise.MAX_SCALE]
GAUSSIAN_SCALES = [0.5, 1.5, 10.0, 1e6, 2.0**40]


@pytest.mark.parametrize("t", LAPLACE_SCALES)
def test_discrete_laplace_matches_its_pmf(t):
    z = noise.discrete_laplace(t, MILLION, rng=int(t * 1000) % 2**31)
    assert z.dtype == np.int64
    assert chi_square_pvalue(z, lambda v: laplace_cdf(v, t), t) > 1e-4
    assert z.var() == pytest.approx(noise.discrete_laplace_variance(t), rel=0.02)


@pytest.mark.parametrize("sigma", GAUSSIAN_SCALES)
def test_discrete_gaussian_matches_its_pmf(sigma):
    z = noise.discrete_gaussian(sigma, MILLION, rng=int(sigma * 1000) % 2**31)
    assert chi_square_pvalue(z, lambda v: gaussian_cdf(v, sigma), sigma) > 1e-4
    assert z.var() == pytest.approx(noise.discrete_gaussian_variance(sigma), rel=0.01)


def test_small_scales_match_the_pmf_point_by_point():
    """At small scales every integer is its own bin: the exact pmf, not only the CDF."""
    for draws, pmf in ((noise.discrete_laplace(0.8, 400_000, rng=3), lambda v: noise.discrete_laplace_pmf(v, 0.8)),
                       (noise.discrete_gaussian(0.7, 400_000, rng=4), lambda v: noise.discrete_gaussian_pmf(v, 0.7))):
        support = np.arange(-6, 7)
        expected = pmf(support) * draws.size
        observed = np.array([(draws == v).sum() for v in support])
        tail = draws.size - observed.sum()
        assert chisquare(np.append(observed, tail), np.append(expected, draws.size - expected.sum())).pvalue > 1e-4


def test_the_cryptographic_source_gives_the_same_distribution():
    z = noise.discrete_laplace(20.0, 300_000)  # rng=None: os.urandom
    assert chi_square_pvalue(z, lambda v: laplace_cdf(v, 20.0), 20.0, bins=30) > 1e-6
    g = noise.discrete_gaussian(20.0, 300_000)
    assert chi_square_pvalue(g, lambda v: gaussian_cdf(v, 20.0), 20.0, bins=30) > 1e-6


# ====================================================================== exact paths, forced
def decimal_exp_neg(x: Fraction, digits: int = 150) -> Decimal:
    getcontext().prec = digits
    return (-(Decimal(x.numerator) / Decimal(x.denominator))).exp()


@pytest.mark.parametrize("x", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(7, 2), Fraction(2**-50),
                               Fraction(61, 7), Fraction(100), Fraction(3, 2**60)])
def test_exp_intervals_contain_the_value(x):
    for bits in (64, 200, 333):
        lo, hi = noise._exp_neg_interval(x, bits)
        exact = decimal_exp_neg(x) * (Decimal(2) ** bits)
        assert Decimal(lo) <= exact <= Decimal(hi) and hi - lo < 2**12


@pytest.mark.parametrize("scale", [Fraction(1, 3), Fraction(7), Fraction(2**40), Fraction(123456789, 1000)])
def test_geometric_digit_probabilities_are_exact(scale):
    for level in (0, 5, 20, 45):
        p = noise._geometric_digit(level, scale)
        y = decimal_exp_neg(Fraction(2**level) / scale)
        exact = y / (1 + y)
        assert p.bits(200) == int(exact * (Decimal(2) ** 200))  # floor (exact is irrational)


class ScriptedBits(noise.RandomBits):
    """A source that replays given words/bytes, then falls back to a seeded stream."""

    def __init__(self, words=(), lead=None):
        super().__init__(np.random.default_rng(0))
        self._script = list(words)
        self._lead = lead

    def words(self, n):
        out = super().words(n).copy()
        for i in range(min(n, len(self._script))):
            out[i] = self._script.pop(0)
        return out

    def bytes(self, n):
        if self._lead is None:
            return super().bytes(n)
        return np.tile(self._lead, -(-n // self._lead.size))[:n]


def test_a_comparison_tied_through_all_table_bits_is_finished_exactly():
    p = noise._geometric_digit(3, Fraction(10))
    table = noise._Table([p])
    c = p.bits(noise._TABLE_BITS)
    tied = [(c >> (noise._TABLE_BITS - 8 - 64 * (j + 1))) & noise._MASK64 for j in range(3)]
    # U's first 200 bits equal p's; the next 64 bits decide: one below p's, one above
    nxt = p.bits(noise._TABLE_BITS + 64) & noise._MASK64
    for extra, expected in ((nxt - 1, True), (nxt + 1, False)):
        source = ScriptedBits(tied + [extra], lead=table.lead)
        assert bool(table.draw(1, source)[0, 0]) is expected


def test_exact_comparison_against_a_dyadic_probability():
    half = noise._Probability(lambda bits: (1 << (bits - 1), 1 << (bits - 1)))
    assert noise._compare_exact(half, 0, 1, ScriptedBits()) is True  # U = 0.0... < 1/2
    assert noise._compare_exact(half, 1, 1, ScriptedBits([0, 1])) is False  # U = 0.1000...01 > 1/2


def test_the_geometric_tail_path(monkeypatch):
    """Above the last digit level G >> L is drawn by exact repeated trials: force it to be common."""
    monkeypatch.setattr(noise._GeometricSampler, "__init__", _few_levels)
    noise._geometric.cache_clear()
    try:
        z = noise.discrete_laplace(3.0, 200_000, rng=11)
    finally:
        noise._geometric.cache_clear()
    assert chi_square_pvalue(z, lambda v: laplace_cdf(v, 3.0), 3.0, bins=20) > 1e-4


def _few_levels(self, scale):
    self.levels = 1  # P(G >= 2) = exp(-2/3): the tail loop runs for half the draws
    self.tail = noise._exp_neg_probability(Fraction(2) / scale)
    self.table = noise._Table([noise._geometric_digit(0, scale), self.tail])


def test_the_gaussian_exact_acceptance_path(monkeypatch):
    """With the float band widened to everything, every acceptance is decided in exact rationals."""
    monkeypatch.setattr(noise, "_MARGIN", 2.0)
    z = noise.discrete_gaussian(1.5, 20_000, rng=5)
    assert chi_square_pvalue(z, lambda v: gaussian_cdf(v, 1.5), 1.5, bins=12) > 1e-4


# ====================================================================== inputs and grid
@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, 2.0**51])
def test_bad_scales_are_refused(bad):
    for sampler in (noise.discrete_laplace, noise.discrete_gaussian):
        with pytest.raises(ValueError, match="must be a finite number in"):
            sampler(bad, 3)


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="must be a real number"):
        noise.discrete_laplace(True, 3)
    with pytest.raises(ValueError, match="size must be"):
        noise.discrete_gaussian(1.0, -1)
    with pytest.raises(TypeError, match="rng must be None"):
        noise.discrete_laplace(1.0, 3, rng=1.5)
    with pytest.raises(ValueError, match="unknown noise kind"):
        noise.draw("uniform", 1.0, 3)


def test_seeds_and_generators_reproduce_and_none_does_not():
    a = noise.discrete_gaussian(1e3, 1000, rng=9)
    np.testing.assert_array_equal(a, noise.discrete_gaussian(1e3, 1000, rng=np.random.default_rng(9)))
    assert noise.discrete_laplace(1e3, (4, 5), rng=1).shape == (4, 5)
    assert not np.array_equal(noise.discrete_laplace(1e9, 100), noise.discrete_laplace(1e9, 100))
    assert noise.random_bits(None).secure and not noise.random_bits(np.random.default_rng()).secure


def test_rounding_to_the_grid_stays_within_the_bound():
    rng = np.random.default_rng(0)
    s = 2.0**-10
    for _ in range(200):
        a = rng.normal(0, 1e3, 50)
        b = a + rng.normal(0, 1, 50) * (rng.random(50) < 0.3)
        moved = np.rint(a / s) - np.rint(b / s)
        assert np.abs(moved).sum() * s <= np.abs(a - b).sum() + noise.rounding_bound(s, 50, 1)
        assert np.sqrt((moved**2).sum()) * s <= np.sqrt(((a - b) ** 2).sum()) + noise.rounding_bound(s, 50, 2)


def test_grid_values_and_huge_noise_are_exact():
    assert np.array_equal(noise.on_grid(np.array([1e15 + 0.3]), 2.0**-4, np.array([0])), [1e15 + 0.25])
    # |z| >= 2**53 is added in Python integers: the double nearest the exact sum
    for centre, z in ((3.0, 2**60 + 2**8), (2.0**70, -(2**55) + 1), (0.0, -(2**53) - 1)):
        assert noise.on_grid(np.array([centre]), 1.0, np.array([z]))[0] == float(int(centre) + z)
    with pytest.raises(ValueError, match="power of two"):
        noise.on_grid(np.zeros(2), 0.3, np.zeros(2, dtype=np.int64))


def test_plans_calibrate_to_the_grid():
    A = Kronecker([hdmm.Prefix(4), hdmm.Identity(5)])
    for privacy in (hdmm.PureDP(1.0), hdmm.ZCDP(0.5), hdmm.ApproxDP(1.0, 1e-6)):
        p = strategy_plan(A, privacy)
        computed = A.sensitivity(privacy.norm)
        assert p.sensitivity >= computed * (1 + 1e-12) + noise.rounding_bound(p.spacing, A.column_support(), privacy.norm)
        assert p.noise_scale == privacy.noise_scale(p.sensitivity)
        assert math.frexp(p.spacing)[0] == 0.5 and p.noise_scale / p.spacing > 2.0**30
    # a tiny epsilon coarsens the grid to keep the scale within MAX_SCALE, and adds the bound on top
    p = strategy_plan(hdmm.Identity(4), hdmm.PureDP(1e-9))
    assert p.noise_scale / p.spacing <= noise.MAX_SCALE
    assert p.sensitivity >= 1.0 + noise.rounding_bound(p.spacing, 1, 1)  # one answer per cell


# ====================================================================== the kernel's output
def test_measurements_are_exact_grid_values():
    A = PIdentity(np.random.default_rng(2).random((2, 8)), norm=1)
    x = np.random.default_rng(3).integers(0, 50, 8).astype(float)
    for privacy in (hdmm.PureDP(0.7), hdmm.ApproxDP(1.0, 1e-6), hdmm.ZCDP(0.3)):
        p = strategy_plan(A, privacy)
        for rng in (None, 4):
            m = measure(p, x, rng=rng)
            assert m.spacing == p.spacing
            steps = m.answers / p.spacing
            assert np.all(steps == np.round(steps)) and np.all(np.abs(steps) < 2**53)
        # the kernel is the exact round(Q(A) x / s) plus draw(...) with the same random stream
        steps = noise.draw(privacy.noise, p.noise_scale / p.spacing, A.shape[0], 7)
        expected = on_grid_exact(exact_centres(p.strategy, x, p.spacing), p.spacing, steps)
        np.testing.assert_array_equal(measure(p, x, rng=7).answers, expected)


def test_bad_data_is_refused_before_any_noise(monkeypatch):
    drawn = []
    monkeypatch.setattr(os, "urandom", lambda n: drawn.append(n) or bytes(n))
    p = strategy_plan(hdmm.Identity(3), hdmm.PureDP(1.0))
    for bad in (np.array([1.0, -1.0, 0.0]), np.array([1.0, np.nan, 0.0]), np.ones(4)):
        with pytest.raises(ValueError):
            measure(p, bad)
    with pytest.raises(TypeError, match="rng must be"):
        measure(p, np.ones(3), rng="seed")
    assert drawn == []


def test_releases_are_reproducible_with_a_seed_and_fresh_without():
    W = hdmm.Prefix(16)
    x = np.arange(16.0)
    one = hdmm.run(W, x, hdmm.PureDP(1.0), strategy=hdmm.Identity(16), rng=3)
    two = hdmm.run(W, x, hdmm.PureDP(1.0), strategy=hdmm.Identity(16), rng=3)
    np.testing.assert_array_equal(one.answers, two.answers)
    fresh = [hdmm.run(W, x, hdmm.PureDP(1.0), strategy=hdmm.Identity(16)).measurement.answers for _ in range(2)]
    assert not np.array_equal(*fresh)


# ====================================================================== privacy audits
def clopper_pearson_epsilon(hits: np.ndarray, others: np.ndarray, n: int, delta: float = 0.0,
                            confidence: float = 0.95) -> float:
    """Largest epsilon lower bound over the events, Bonferroni-corrected: log((P1_low - delta) / P2_high)."""
    alpha = (1 - confidence) / (2 * hits.size)
    best = -math.inf
    for h, o in ((hits, others), (others, hits)):
        low = np.where(h > 0, beta.ppf(alpha, np.maximum(h, 1), n - h + 1), 0.0)
        high = np.where(o < n, beta.ppf(1 - alpha, o + 1, np.maximum(n - o, 1)), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            bound = np.log(np.maximum(low - delta, 0.0) / high)
        best = max(best, float(np.max(bound)))
    return best


def releases(plan, x, count: int, seed: int) -> np.ndarray:
    """``count`` releases of the plan on ``x``, exactly as the kernel makes them (checked above), in one batch."""
    A = plan.strategy
    steps = noise.draw(plan.privacy.noise, plan.noise_scale / plan.spacing, (count, A.shape[0]), seed)
    centres = exact_centres(A, x, plan.spacing)
    return on_grid_exact(np.broadcast_to(centres, steps.shape).ravel(), plan.spacing, steps.ravel()).reshape(steps.shape)


def events(plan, y: np.ndarray, centre: np.ndarray, other: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Hit counts of threshold events on the privacy-loss statistic and on low-order bits of answer 0."""
    m = y / plan.spacing  # exact integers
    scale = plan.noise_scale / plan.spacing
    if plan.privacy.noise == "laplace":
        loss = (np.abs(m - other) - np.abs(m - centre)).sum(axis=1) / scale
    else:
        loss = (((m - other) ** 2) - ((m - centre) ** 2)).sum(axis=1) / (2 * scale**2)
    bits = np.frexp(y[:, 0])[0] * 2.0**53 % 2**8  # the low mantissa bits of the first answer
    over = (loss[:, None] >= thresholds[None, :]).sum(axis=0)
    low = np.array([(bits == b).sum() for b in range(0, 256, 16)] + [(np.floor(y[:, 0] * 2.0**53) != y[:, 0] * 2.0**53).sum()])
    return np.concatenate([over, low])


AUDITS = [
    ("p-identity on 8 cells", lambda: PIdentity(np.random.default_rng(1).random((2, 8)), norm=1),
     hdmm.PureDP(1.0), 0.0),
    ("kronecker 2 x 3", lambda: Kronecker([hdmm.Prefix(2), IdentityTotal(3)]), hdmm.PureDP(1.0), 0.0),
    ("weighted marginals 2 x 3 x 4", lambda: Marginals((2, 3, 4), {(): 0.5, (0,): 1.0, (1, 2): 2.0, (0, 1, 2): 0.7}),
     hdmm.PureDP(0.5), 0.0),
    ("kronecker 2 x 3, approximate DP", lambda: Kronecker([hdmm.Identity(2), hdmm.Prefix(3)]),
     hdmm.ApproxDP(1.0, 1e-6), 1e-6),
]


@pytest.mark.parametrize("name, make, privacy, delta", AUDITS, ids=[a[0] for a in AUDITS])
def test_audit_on_neighbouring_data(name, make, privacy, delta):
    A = make()
    plan = strategy_plan(A, privacy)
    n = A.shape[1]
    x = np.random.default_rng(5).integers(0, 20, n).astype(float)
    dense = A.dense()
    j = int(np.argmax(np.sum(np.abs(dense) ** privacy.norm, axis=0)))  # the column of largest norm
    neighbour = x.copy()
    neighbour[j] += 1
    count = 100_000
    centre, other = np.rint(A @ x / plan.spacing), np.rint(A @ neighbour / plan.spacing)
    y1, y2 = releases(plan, x, count, 1), releases(plan, neighbour, count, 2)
    eps = privacy.epsilon
    thresholds = np.linspace(0, 1.0, 11) * eps
    hits = events(plan, y1, centre, other, thresholds)
    others = events(plan, y2, centre, other, thresholds)
    bound = clopper_pearson_epsilon(hits, others, count, delta)
    assert bound <= eps, f"{name}: epsilon lower bound {bound:.3f} above the claimed {eps}"
    assert bound > 0.3 * eps  # the audit has power: the loss events do separate the neighbours somewhat


def test_the_float_attack_separates_textbook_laplace_and_fails_on_the_grid():
    """Mironov (2012): textbook float Laplace noise leaves the low bits of a + noise that depend on a."""
    count, b = 50_000, 1.0
    rng = np.random.default_rng(0)

    def attack(y: np.ndarray) -> np.ndarray:
        # a neighbour's answer a' = 1: 1 + (float noise) is a multiple of 2**-53 below 1 (Sterbenz);
        # with a = 0 the noise itself is released, with all its low bits
        return np.array([np.sum(y * 2.0**53 != np.floor(y * 2.0**53))])

    old0 = attack(0.0 + rng.laplace(0.0, b, count))
    old1 = attack(1.0 + rng.laplace(0.0, b, count))
    assert clopper_pearson_epsilon(old0, old1, count) > 5.0  # claimed epsilon 1: broken

    plan = strategy_plan(hdmm.Identity(1), hdmm.PureDP(1.0))
    new0 = attack(releases(plan, np.zeros(1), count, 3)[:, 0])
    new1 = attack(releases(plan, np.ones(1), count, 4)[:, 0])
    assert new0[0] == new1[0] == 0  # every release is a grid point: the event never fires
    # the same events on the low mantissa bits of the released value stay within the claim
    hits0 = np.array([np.sum(np.frexp(v)[0] * 2.0**53 % 16 == k) for v in [releases(plan, np.zeros(1), count, 5)[:, 0]]
                      for k in range(16)])
    hits1 = np.array([np.sum(np.frexp(v)[0] * 2.0**53 % 16 == k) for v in [releases(plan, np.ones(1), count, 6)[:, 0]]
                      for k in range(16)])
    assert clopper_pearson_epsilon(hits0, hits1, count) <= 1.0
