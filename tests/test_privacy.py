"""Tests for hdmm.privacy."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdmm.noise import calibrate_grid
from hdmm.privacy import (
    ZCDP,
    ApproxDP,
    Privacy,
    PureDP,
    analytic_gaussian_sigma,
    classic_gaussian_sigma,
    discrete_gaussian_sigma,
    zcdp_delta,
    zcdp_rho,
)


def phi(t: float) -> float:
    """Standard normal CDF via math.erfc (independent of scipy)."""
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


def gaussian_delta(sigma: float, epsilon: float, sensitivity: float = 1.0) -> float:
    """Balle & Wang's exact delta of the Gaussian mechanism, computed directly."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    return phi(a - b) - math.exp(epsilon) * phi(-a - b)


GRID = [
    (eps, delta)
    for eps in (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0)
    for delta in (1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5)
]


# ------------------------------------------------------------------ PureDP
def test_pure_dp_laplace() -> None:
    p = PureDP(0.5)
    assert p.norm == 1 and p.noise == "laplace"
    assert p.epsilon == 0.5
    assert p.noise_scale(3.0) == 6.0
    assert p.noise_variance(3.0) == 2 * 6.0**2
    assert p.noise_scale(0) == 0.0
    assert p.description == "pure DP, epsilon=0.5"
    assert repr(p) == "PureDP(epsilon=0.5)"


# -------------------------------------------------------------------- zCDP
def test_zcdp_gaussian() -> None:
    p = ZCDP(0.125)
    assert p.norm == 2 and p.noise == "gaussian"
    assert p.rho == 0.125
    assert p.noise_scale(1.0) == 2.0  # sigma^2 = 1 / (2 * 0.125) = 4
    assert p.noise_variance(3.0) == pytest.approx(9.0 / (2 * 0.125))
    assert p.description == "zCDP, rho=0.125"
    assert repr(p) == "ZCDP(rho=0.125)"


# ---------------------------------------------------------------- ApproxDP
def test_approx_dp_basics() -> None:
    p = ApproxDP(1, 1e-6)
    assert p.norm == 2 and p.noise == "gaussian"
    assert (p.epsilon, p.delta) == (1.0, 1e-6)
    assert p.description == "(epsilon=1, delta=1e-06)-DP, discrete Gaussian"
    assert repr(p) == "ApproxDP(epsilon=1.0, delta=1e-06)"
    sigma = p.noise_scale(1.0)
    assert p.noise_scale(2.5) == pytest.approx(2.5 * sigma, rel=1e-15)
    assert p.noise_variance(2.5) == pytest.approx((2.5 * sigma) ** 2, rel=1e-15)
    assert sigma == discrete_gaussian_sigma(1, 1e-6)
    # the discrete Gaussian's zCDP guarantee, converted, costs a few percent over the continuous curve
    assert 1.0 < sigma / analytic_gaussian_sigma(1, 1e-6) < 1.1


def test_known_value() -> None:
    # eps = 1, delta = 1e-5, unit sensitivity: sigma ~ 3.73 (classic formula would give 4.84)
    sigma = analytic_gaussian_sigma(1.0, 1e-5)
    assert sigma == pytest.approx(3.7306, abs=1e-4)
    assert gaussian_delta(sigma, 1.0) == pytest.approx(1e-5, rel=1e-9)
    assert gaussian_delta(sigma * (1 - 1e-6), 1.0) > 1e-5 > gaussian_delta(sigma * (1 + 1e-6), 1.0)


@pytest.mark.parametrize(("eps", "delta"), GRID)
def test_curve_equals_delta_at_solution(eps: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(eps, delta)
    assert gaussian_delta(sigma, eps) == pytest.approx(delta, rel=1e-9)
    # sigma is the smallest noise that works: a bit less breaks the guarantee
    assert gaussian_delta(sigma * (1 - 1e-6), eps) > delta > gaussian_delta(sigma * (1 + 1e-6), eps)
    # the condition depends on sigma / sensitivity only
    assert gaussian_delta(7.0 * sigma, eps, sensitivity=7.0) == pytest.approx(delta, rel=1e-9)
    scaled = analytic_gaussian_sigma(eps, delta, sensitivity=7.0)
    assert scaled == pytest.approx(7.0 * sigma, rel=1e-15)


@settings(max_examples=100, deadline=None)
@given(
    eps=st.floats(0.01, 20.0),
    log10_delta=st.floats(-15.0, -0.5),
)
def test_curve_equals_delta_property(eps: float, log10_delta: float) -> None:
    delta = 10.0**log10_delta
    sigma = analytic_gaussian_sigma(eps, delta)
    assert gaussian_delta(sigma, eps) == pytest.approx(delta, rel=1e-9)


def test_monotone_in_delta_and_epsilon() -> None:
    for eps in (0.1, 1.0, 10.0):
        sigmas = [analytic_gaussian_sigma(eps, d) for d in (1e-12, 1e-9, 1e-6, 1e-3, 0.1, 0.5)]
        assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    for delta in (1e-9, 1e-5, 0.1):
        sigmas = [analytic_gaussian_sigma(e, delta) for e in (0.01, 0.1, 0.5, 1.0, 2.0, 10.0, 50.0)]
        assert all(a > b for a, b in zip(sigmas, sigmas[1:]))


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 0.9, 0.999])
@pytest.mark.parametrize("delta", [1e-12, 1e-6, 1e-3, 0.1])
def test_analytic_beats_classic(eps: float, delta: float) -> None:
    classic = classic_gaussian_sigma(eps, delta)
    assert classic == pytest.approx(math.sqrt(2 * math.log(1.25 / delta)) / eps, rel=1e-15)
    assert analytic_gaussian_sigma(eps, delta) < classic
    # the classic noise is private too, i.e. the analytic curve is below delta there
    assert gaussian_delta(classic, eps) < delta


def test_classic_rejects_large_epsilon() -> None:
    with pytest.raises(ValueError, match=r"only valid for epsilon < 1, got 1\.0; use analytic"):
        classic_gaussian_sigma(1.0, 1e-5)


@pytest.mark.parametrize("eps", [20.0, 50.0, 200.0, 1000.0])
def test_large_epsilon_does_not_overflow(eps: float) -> None:
    sigma = ApproxDP(eps, 1e-6).noise_scale(1.0)
    assert math.isfinite(sigma) and sigma > 0
    assert zcdp_delta(1 / (2 * sigma**2), eps) <= 1e-6
    assert sigma >= analytic_gaussian_sigma(eps, 1e-6)


def test_tiny_delta() -> None:
    sigma = analytic_gaussian_sigma(1.0, 1e-300)
    assert math.isfinite(sigma)
    assert analytic_gaussian_sigma(1.0, 1e-200) < sigma


def test_extreme_parameters_still_calibrate() -> None:
    # the zCDP conversion has no cancelling terms: even a tiny epsilon with a tiny delta works
    sigma = ApproxDP(1e-10, 1e-50).noise_scale(1.0)
    assert math.isfinite(sigma) and zcdp_delta(1 / (2 * sigma**2), 1e-10) <= 1e-50
    # below the noise of the classical conversion rho + 2 sqrt(rho log(1/delta)) <= epsilon (Bun & Steinke 2016)
    assert 0.8 < sigma / (math.sqrt(2 * math.log(1e50)) / 1e-10) < 1.0


# ------------------------------------------- the zCDP conversion (CKS 2020, Corollary 13)
def brute_log_delta(rho: float, eps: float) -> float:
    """The conversion's log delta minimised over a fine grid of orders (independent of the bisection)."""
    best = math.inf
    for alpha in np.exp(np.linspace(math.log(1 + 1e-6), math.log((eps + 1) / (2 * rho) + 2), 20_001)):
        value = (alpha - 1) * (alpha * rho - eps) + alpha * math.log1p(-1 / alpha) - math.log(alpha - 1)
        best = min(best, value)
    return best


@pytest.mark.parametrize(("eps", "delta"), [(0.1, 1e-6), (1.0, 1e-6), (1.0, 1e-9), (2.0, 1e-3), (10.0, 1e-5)])
def test_zcdp_conversion(eps: float, delta: float) -> None:
    rho = zcdp_rho(eps, delta)
    assert zcdp_delta(rho, eps) <= delta
    assert zcdp_delta(rho * (1 + 1e-6), eps) > delta  # the largest rho that works
    # the bisection finds the best order: a brute-force grid does no better
    assert math.log(zcdp_delta(rho, eps)) <= brute_log_delta(rho, eps) + 1e-6
    # tighter than the classical bound of Bun & Steinke (2016)
    assert zcdp_delta(rho, eps) <= math.exp(-((eps - rho) ** 2) / (4 * rho))
    sigma = ApproxDP(eps, delta).noise_scale(1.0)
    assert sigma == pytest.approx(1 / math.sqrt(2 * rho), rel=1e-14) and sigma >= 1 / math.sqrt(2 * rho)


# ------------------------------------------------------------- validation
BAD_POSITIVE = [-1, 0, 0.0, -0.5, math.nan, math.inf, -math.inf, True, "1", None, 1j, 10**400]


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_epsilon(value) -> None:
    message = f"epsilon must be a finite number > 0, got {value!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        PureDP(value)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        ApproxDP(value, 1e-6)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        analytic_gaussian_sigma(value, 1e-6)


@pytest.mark.parametrize("value", BAD_POSITIVE)
def test_bad_rho(value) -> None:
    with pytest.raises(ValueError, match="rho must be a finite number > 0"):
        ZCDP(value)


def test_bad_epsilon_message_exact() -> None:
    with pytest.raises(ValueError) as info:
        PureDP(-1)
    assert str(info.value) == "epsilon must be a finite number > 0, got -1"


@pytest.mark.parametrize("value", [1, 1.0, 1.5, -1e-6, math.nan, math.inf, True, "0.1", None])
def test_bad_delta(value) -> None:
    with pytest.raises(ValueError, match="delta must be a finite number in \\(0, 1\\)"):
        ApproxDP(1.0, value)


def test_delta_zero_points_to_pure_dp() -> None:
    for zero in (0, 0.0):
        with pytest.raises(ValueError, match=r"got 0; for delta = 0 use PureDP"):
            ApproxDP(1.0, zero)


@pytest.mark.parametrize("privacy", [PureDP(1.0), ApproxDP(1.0, 1e-6), ZCDP(0.5)])
@pytest.mark.parametrize("value", [-1, -1e-9, math.nan, math.inf, True, "1", None])
def test_bad_sensitivity(privacy: Privacy, value) -> None:
    rng = np.random.default_rng(0)
    for call in (
        lambda: privacy.noise_scale(value),
        lambda: privacy.noise_variance(value),
        lambda: privacy.sample(3, value, rng),
    ):
        with pytest.raises(ValueError, match="sensitivity must be a finite number >= 0"):
            call()


def test_numeric_types_accepted() -> None:
    assert PureDP(np.float32(0.5)) == PureDP(0.5)
    assert PureDP(np.int64(2)) == PureDP(2.0)
    assert ZCDP(Fraction(1, 4)).rho == 0.25
    assert ApproxDP(1, Fraction(1, 10**6)) == ApproxDP(1.0, 1e-6)


# ------------------------------------------------- sampling and identity
@pytest.mark.parametrize("privacy", [PureDP(0.5), ApproxDP(1.0, 1e-6), ZCDP(0.5)])
def test_sample(privacy: Privacy) -> None:
    z = privacy.sample(200_000, 2.0, np.random.default_rng(1))
    assert z.shape == (200_000,) and z.dtype == np.float64
    spacing, _ = calibrate_grid(2.0, 200_000, privacy.norm, privacy.noise_scale)  # discrete noise on the grid
    assert math.frexp(spacing)[0] == 0.5 and np.all(z / spacing == np.round(z / spacing))
    assert abs(z.mean()) < 5 * math.sqrt(privacy.noise_variance(2.0) / z.size)
    assert z.var() == pytest.approx(privacy.noise_variance(2.0), rel=0.03)
    again = privacy.sample(200_000, 2.0, np.random.default_rng(1))
    np.testing.assert_array_equal(z, again)
    assert privacy.sample((2, 3), 1.0, np.random.default_rng(0)).shape == (2, 3)
    np.testing.assert_array_equal(privacy.sample(4, 0.0, np.random.default_rng(0)), 0.0)


def test_sample_distribution_shape() -> None:
    rng = np.random.default_rng(2)
    lap = PureDP(1.0).sample(200_000, 1.0, rng)
    gau = ZCDP(0.5).sample(200_000, 1.0, rng)  # sigma = 1

    def kurt(z: np.ndarray) -> float:
        """Excess kurtosis: 3 for Laplace, 0 for Gaussian."""
        return float(np.mean(z**4) / np.mean(z**2) ** 2 - 3)

    assert kurt(lap) == pytest.approx(3.0, abs=0.3)
    assert kurt(gau) == pytest.approx(0.0, abs=0.1)


def test_sample_takes_the_rng_forms_of_measure() -> None:
    with pytest.raises(TypeError, match=r"rng must be None .*numpy\.random\.Generator, got RandomState"):
        PureDP(1.0).sample(3, 1.0, np.random.RandomState(0))
    for bad in (1.5, True, "0"):
        with pytest.raises(TypeError, match="rng must be"):
            PureDP(1.0).sample(3, 1.0, bad)
    np.testing.assert_array_equal(PureDP(1.0).sample(5, 1.0, 3), PureDP(1.0).sample(5, 1.0, np.random.default_rng(3)))
    assert PureDP(1.0).sample(5, 1.0).shape == (5,)  # None: the OS's cryptographic generator


def test_equality_hash_and_dict_round_trip() -> None:
    defs = [PureDP(1.0), PureDP(2.0), ApproxDP(1.0, 1e-6), ApproxDP(1.0, 1e-5), ZCDP(1.0)]
    for i, p in enumerate(defs):
        for j, q in enumerate(defs):
            assert (p == q) == (i == j)
        assert Privacy.from_dict(p.to_dict()) == p
        assert hash(Privacy.from_dict(p.to_dict())) == hash(p)
    assert PureDP(1) == PureDP(1.0) and hash(PureDP(1)) == hash(PureDP(1.0))
    assert PureDP(1.0) != ZCDP(1.0)
    assert PureDP(1.0) != 1.0
    assert ApproxDP(1.0, 1e-6).to_dict() == {"type": "ApproxDP", "epsilon": 1.0, "delta": 1e-6}
    message = r"unknown privacy type 'Renyi'.*\['ApproxDP', 'PureDP', 'ZCDP'\]"
    with pytest.raises(ValueError, match=message):
        Privacy.from_dict({"type": "Renyi", "alpha": 2})


def test_privacy_is_abstract() -> None:
    with pytest.raises(TypeError):
        Privacy()


# ------------------------------------------------------ frozen dataclasses
def test_privacy_definitions_are_frozen_dataclasses() -> None:
    import dataclasses
    import pickle

    for p in (PureDP(1.0), ApproxDP(1.0, 1e-6), ZCDP(0.5)):
        assert dataclasses.is_dataclass(p)
        name = dataclasses.fields(p)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(p, name, 2.0)
        assert pickle.loads(pickle.dumps(p)) == p
    assert [f.name for f in dataclasses.fields(ApproxDP(1.0, 1e-6))] == ["epsilon", "delta"]
    assert dataclasses.replace(PureDP(1.0), epsilon=2) == PureDP(2.0)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        dataclasses.replace(PureDP(1.0), epsilon=-1)
    assert len({PureDP(1), PureDP(1.0), ZCDP(1.0)}) == 2


@pytest.mark.parametrize(
    "privacy, unit",
    [(PureDP(0.1), PureDP(math.sqrt(2.0))), (PureDP(7.0), PureDP(math.sqrt(2.0))),
     (ApproxDP(1.0, 1e-6), ZCDP(0.5)), (ZCDP(3.0), ZCDP(0.5))],
)
def test_unit_noise_keeps_the_noise_kind_at_unit_variance(privacy: Privacy, unit: Privacy) -> None:
    found = privacy.unit_noise()
    assert found == unit
    assert (found.noise, found.norm) == (privacy.noise, privacy.norm)
    assert found.noise_variance(1.0) == pytest.approx(1.0, rel=1e-15)
    # errors under any level are one multiple of the unit-noise error: ratios do not depend on it
    assert privacy.noise_variance(3.0) / found.noise_variance(3.0) == pytest.approx(privacy.noise_variance(1.0))


# -------------------------------------------------- overflow (issue 11, defect 4)
@pytest.mark.parametrize(
    "make, message",
    [(lambda: PureDP(1e-300), r"epsilon=1e-300 is too small: .*overflows.*use epsilon >= 1\.07e-154"),
     (lambda: ZCDP(1e-320), r"rho=1e-320 is too small: .*overflows.*use rho >= 2\.81e-309")],
)
def test_a_privacy_level_whose_noise_overflows_is_refused_at_construction(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_the_smallest_suggested_levels_work() -> None:
    assert math.isfinite(PureDP(1.07e-154).noise_variance(1.0))
    assert math.isfinite(ZCDP(2.81e-309).noise_variance(1.0))


@pytest.mark.parametrize("privacy", [PureDP(1e-150), ZCDP(1e-300), ApproxDP(1e-3, 1e-6)])
def test_noise_that_overflows_for_a_large_sensitivity_is_a_clear_error(privacy: Privacy) -> None:
    for use in (privacy.noise_variance, privacy.noise_scale,
                lambda s: privacy.sample(2, s, np.random.default_rng(0))):
        with pytest.raises(ValueError, match="too large for double precision.*smaller sensitivity"):
            use(1e306)
