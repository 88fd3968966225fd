"""Noise distributions as objects (hdmm.distributions) and composition rules as Privacy methods."""

from __future__ import annotations

import math
import pickle
from fractions import Fraction

import numpy as np
import pytest

import hdmm
from hdmm import noise
from hdmm.budget import BudgetError
from hdmm.distributions import GAUSSIAN, LAPLACE, NOISES, GaussianNoise, LaplaceNoise, Noise, noise_named
from hdmm.optimizers import opt0, opt_kron
from hdmm.privacy import ZCDP, ApproxDP, Privacy, PureDP, zcdp_epsilon, zcdp_rho

PRIVACIES = [PureDP(0.5), ApproxDP(1.0, 1e-6), ZCDP(0.25), ZCDP(Fraction(293764, 114921))]


# ---------------------------------------------------------------------------------- the objects
def test_each_privacy_class_owns_its_noise_object_and_its_norm_follows():
    assert PureDP.noise is LAPLACE and ApproxDP.noise is GAUSSIAN and ZCDP.noise is GAUSSIAN
    for p in PRIVACIES:
        assert isinstance(p.noise, Noise) and p.norm == p.noise.norm
    assert (LAPLACE.norm, GAUSSIAN.norm, LAPLACE.l2, GAUSSIAN.l2) == (1, 2, False, True)
    assert (LAPLACE.normal, GAUSSIAN.normal) == (False, True)


@pytest.mark.parametrize("scale", [1e-3, 0.7, 3.0, 1e5, 1e150])
def test_variances_are_the_formulas_the_privacy_classes_used(scale):
    assert LAPLACE.variance(scale) == 2.0 * scale**2
    assert GAUSSIAN.variance(scale) == scale**2
    assert LAPLACE.variance(1e300) == math.inf and GAUSSIAN.variance(1e300) == math.inf  # overflow, not an error
    for steps in (0.8, 20.0, 3e4):
        assert LAPLACE.discrete_variance(steps) == noise.discrete_laplace_variance(steps)
        assert GAUSSIAN.discrete_variance(steps) == noise.discrete_gaussian_variance(steps)
        assert LAPLACE.discrete_variance(steps) < LAPLACE.variance(steps)  # the continuous one bounds it
        assert GAUSSIAN.discrete_variance(steps) <= GAUSSIAN.variance(steps) * (1 + 1e-14)  # equal beyond a few sigma


def test_unit_scale_has_unit_variance_and_gives_the_unit_noise_privacy():
    for n in NOISES.values():
        assert n.variance(n.unit_scale) == pytest.approx(1.0, rel=1e-15)
    assert PureDP(0.1).unit_noise() == PureDP(math.sqrt(2.0)) == PureDP.at_noise_scale(LAPLACE.unit_scale)
    assert ApproxDP(1.0, 1e-6).unit_noise() == ZCDP(0.5) == ZCDP(7.0).unit_noise()
    for p in PRIVACIES:
        assert p.unit_noise().noise is p.noise
        assert p.unit_noise().noise_variance(1.0) == pytest.approx(1.0, rel=1e-15)
        assert p.at_noise_scale(2.0).noise_scale(1.0) == pytest.approx(2.0, rel=1e-15)


def test_objects_are_immutable_equal_by_kind_and_read_as_their_names():
    assert LaplaceNoise() == LAPLACE and GaussianNoise() != LAPLACE and hash(LaplaceNoise()) == hash(LAPLACE)
    assert pickle.loads(pickle.dumps(GAUSSIAN)) == GAUSSIAN
    assert pickle.loads(pickle.dumps(ZCDP(0.5))).noise is GAUSSIAN
    with pytest.raises(AttributeError, match="immutable"):
        LAPLACE.norm = 2
    # code written when privacy.noise was its name keeps working; files and messages write the name
    assert PureDP(1.0).noise == "laplace" and ZCDP(1.0).noise != "laplace" and "gaussian" == ZCDP(1.0).noise
    assert str(PureDP(1.0).noise) == "laplace" and f"{ZCDP(1.0).noise} noise" == "gaussian noise"
    assert {p.noise for p in PRIVACIES} == {LAPLACE, GAUSSIAN}
    assert noise_named("laplace") is LAPLACE and noise_named("gaussian") is GAUSSIAN
    for bad in ("uniform", "Laplace", None, 1):
        with pytest.raises(ValueError, match="unknown noise"):
            noise_named(bad)


def test_draw_takes_the_object_and_delegates_to_the_exact_samplers():
    assert np.array_equal(noise.draw(LAPLACE, 3.0, 50, rng=4), noise.discrete_laplace(3.0, 50, rng=4))
    assert np.array_equal(noise.draw(GAUSSIAN, 3.0, (2, 5), rng=4), noise.discrete_gaussian(3.0, (2, 5), rng=4))
    with pytest.raises(ValueError, match="draw takes a noise distribution"):
        noise.draw("laplace", 1.0, 3)


def test_the_deprecated_noise_string_is_read_once_into_the_same_privacy():
    with pytest.warns(DeprecationWarning, match="hdmm.PureDP"):
        a = opt_kron(hdmm.Prefix(8), noise="laplace", seed=0)
    b = opt_kron(hdmm.Prefix(8), PureDP(math.sqrt(2.0)), seed=0)
    assert np.array_equal(a.dense(), b.dense())


# ---------------------------------------------------------------------------------- a new distribution is one class
class UniformNoise(Noise):
    """A test-only distribution (uniform on [-b, b], integers uniform on [-floor(b), floor(b)]): plumbing only.

    Not a private mechanism: it exists to show that a distribution is one class.
    """

    name = "uniform"
    title = "Uniform"
    norm = 1
    normal = False
    unit_scale = math.sqrt(3.0)

    def variance(self, scale):
        return float(scale) ** 2 / 3.0

    def discrete_variance(self, steps):
        m = math.floor(steps)
        return m * (m + 1) / 3.0

    def integers(self, steps, size, rng=None):
        m, shape = math.floor(steps), (size,) if isinstance(size, int) else tuple(size)
        words = noise.random_bits(rng).words(math.prod(shape))  # (modulo bias: fine for a plumbing test)
        return (words % np.uint64(2 * m + 1)).astype(np.int64).reshape(shape) - m


class UniformDP(PureDP):
    noise = UniformNoise()


def test_a_test_only_distribution_works_through_the_expected_error_path():
    W, A = hdmm.Prefix(8), opt0(hdmm.Prefix(8), PureDP(1.0), seed=0)
    uniform, laplace = UniformDP(0.5), PureDP(0.5)
    assert uniform.norm == 1 and uniform.noise_variance(2.0) == pytest.approx(16.0 / 3.0)
    # the same strategy, scale and sensitivity: the error is the variance ratio (1/3) / 2 times Laplace's
    assert hdmm.expected_error(W, A, uniform) == pytest.approx(hdmm.expected_error(W, A, laplace) / 6.0, rel=1e-12)
    v_u = hdmm.error.per_query_variance(W, A, uniform)
    assert np.allclose(v_u, hdmm.error.per_query_variance(W, A, laplace) / 6.0, rtol=1e-12)
    with pytest.raises(ValueError, match="exact only under Gaussian"):  # not normal: no exact l_p error
        hdmm.error.lp_error(W, A, uniform, 3)
    unit = uniform.unit_noise()
    assert isinstance(unit, UniformDP) and unit.noise_variance(1.0) == pytest.approx(1.0)
    # the plan and the kernel draw through the object
    p = hdmm.plan(W, A, uniform)
    assert p.noise_scale > 0
    m = hdmm.measure(p, np.arange(8.0), rng=3)
    assert m.privacy is uniform and np.all(np.abs(m.answers - A @ np.arange(8.0)) <= p.noise_scale + 1e-6)


# ---------------------------------------------------------------------------------- composition methods
def test_composition_methods_give_the_budget_table():
    eps, delta, rho = 0.7, 1e-6, 0.3
    pure, approx, zcdp = PureDP(eps), ApproxDP(eps, delta), ZCDP(rho)
    assert pure.to_pure() is pure and approx.to_pure() is None and zcdp.to_pure() is None
    assert pure.to_zcdp() == ZCDP(eps**2 / 2.0) and zcdp.to_zcdp() is zcdp
    assert approx.to_zcdp() == ZCDP(zcdp_rho(eps, delta))
    assert [PureDP(3.0).cost_of(p) for p in (pure, approx, zcdp)] == [eps, None, None]
    assert [ZCDP(3.0).cost_of(p) for p in (pure, approx, zcdp)] == [eps**2 / 2.0, zcdp_rho(eps, delta), rho]
    assert ApproxDP(3.0, delta).cost_of(pure) is None and ApproxDP.budget_unit is None
    exact = ZCDP(Fraction(1, 3))
    assert ZCDP(1.0).cost_of(exact) == Fraction(1, 3) and exact.amount == Fraction(1, 3)
    assert (PureDP.budget_unit, ZCDP.budget_unit, pure.amount, zcdp.amount) == ("epsilon", "rho", eps, rho)
    with pytest.raises(TypeError, match="do not add up"):
        approx.amount
    assert PureDP.epsilon_at(2.0, None) == 2.0 == PureDP.epsilon_at(2.0, 1e-9)
    assert ZCDP.epsilon_at(0.5, 1e-6) == zcdp_epsilon(0.5, 1e-6) and ZCDP.epsilon_at(0, 1e-6) == 0.0
    with pytest.raises(ValueError, match="give the delta"):
        ZCDP.epsilon_at(0.5, None)
    with pytest.raises(ValueError, match="do not add up"):
        ApproxDP.epsilon_at(0.5, 1e-6)


def test_the_budget_counts_with_the_methods():
    b = hdmm.Budget(ZCDP(1.0))
    for p in (PureDP(0.5), ApproxDP(1.0, 1e-6), ZCDP(Fraction(1, 10))):
        assert b.charge(p).cost == ZCDP(1.0).cost_of(p)
    assert b.unit == "rho" and b.epsilon_at(1e-6) == zcdp_epsilon(b.spent, 1e-6)
    with pytest.raises(BudgetError, match="Gaussian noise is not pure DP"):
        hdmm.Budget(PureDP(1.0)).charge(ZCDP(0.1))
    with pytest.raises(BudgetError, match=r"Budget.from_approx_dp\(1, 1e-06\)"):
        hdmm.Budget(ApproxDP(1.0, 1e-6))
    assert isinstance(Privacy.from_dict(ZCDP(Fraction(1, 3)).to_dict()).rho, Fraction)


def test_a_privacy_subclass_written_with_the_noise_name_still_works():
    class OldStyle(PureDP):
        noise = "laplace"

    assert OldStyle.noise is LAPLACE and OldStyle.norm == 1 and OldStyle(1.0).noise_variance(1.0) == 2.0
    with pytest.raises(TypeError, match="leave norm out"):
        class Inconsistent(PureDP):
            noise = GAUSSIAN
            norm = 1


def test_the_interval_method_follows_the_noises_normality():
    from hdmm.release import _interval_method

    assert _interval_method({GAUSSIAN}, True) == "exact (Gaussian noise)"
    assert _interval_method({LAPLACE}, True) == "normal approximation (Laplace noise)"
    assert _interval_method({LAPLACE, GAUSSIAN}, False) == ("normal approximation (Laplace noise in some measurements); "
                                                            "conservative (standard errors are upper bounds)")
    assert _interval_method({UniformNoise(), GAUSSIAN}, True) == "normal approximation (Uniform noise in some measurements)"
