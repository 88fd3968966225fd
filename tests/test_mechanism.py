"""The matrix mechanism (hdmm.mechanism): measurement and least-squares reconstruction.

Every reconstruction route is checked against the dense pseudo-inverse ``pinv(A) @ y`` (docs/math.md,
section 7), including rank-deficient strategies, where the minimum-norm solution is expected.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hdmm
from hdmm import workload as wl
from hdmm.marginals import Marginal, Marginals
from hdmm.matrix import Explicit, Identity, Kronecker, Ones, Product, VStack, Weighted
from hdmm import measure
from hdmm.mechanism import Measurement, reconstruct, reconstruction_method
from hdmm.optimizers.pidentity import PIdentity
from hdmm.privacy import ApproxDP, PureDP, ZCDP
from hdmm.error import per_query_variance
from hdmm.optimizers import opt_residual, opt_union
from strategies import SETTINGS, domain_shapes, marginals_on, pinv_matrices, strategies_on

PRIVACY = PureDP(1.0)


def noisy(A, seed: int = 0, privacy=PRIVACY) -> tuple[np.ndarray, Measurement]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 30, size=A.shape[1]).astype(float)
    return x, measure(A, x, privacy, rng=seed)


def assert_pinv(A, ref: np.ndarray, method: str, seed: int = 0, **kw) -> np.ndarray:
    _, m = noisy(A, seed)
    got = reconstruct(m, method, **kw)
    want = np.linalg.pinv(ref) @ m.answers
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-7 * scale)
    return got


# ====================================================================== measure
def test_measure_uses_the_computed_sensitivity():
    A = 3.0 * Kronecker([Identity(4), wl.Prefix(5)])  # column L1 norms up to 3 * 5
    x, m = noisy(A)
    assert m.sensitivity == pytest.approx(15.0)
    assert m.noise_scale == pytest.approx(15.0)
    assert m.strategy is A and m.privacy == PRIVACY
    assert m.noise_std == pytest.approx(math.sqrt(2) * 15.0)
    g = measure(A, x, ZCDP(0.5), rng=1)
    assert g.sensitivity == pytest.approx(3.0 * math.sqrt(5.0))
    assert g.noise_scale == pytest.approx(g.sensitivity)  # sigma = D2 / sqrt(2 rho)
    assert "Measurement(" in repr(m) and "pure DP" in repr(m)


@pytest.mark.parametrize("privacy", [PureDP(0.5), ApproxDP(1.0, 1e-6)])
def test_measure_noise_has_the_calibrated_variance(privacy):
    n = 40_000
    x = np.full(n, 7.0)
    m = measure(Identity(n), x, privacy, rng=3)
    z = m.answers - x
    var = privacy.noise_variance(1.0)
    # the sample variance has standard error var * sqrt((kurtosis - 1) / n), kurtosis <= 6
    assert abs(z.var() - var) <= 5 * var * math.sqrt(5 / n)
    assert abs(z.mean()) <= 5 * math.sqrt(var / n)


def test_measure_seeds_and_generators():
    A = Identity(50)
    x = np.ones(50)
    a = measure(A, x, PRIVACY, rng=11).answers
    b = measure(A, x, PRIVACY, rng=np.random.default_rng(11)).answers
    np.testing.assert_array_equal(a, b)
    c, d = measure(A, x, PRIVACY).answers, measure(A, x, PRIVACY).answers
    assert not np.array_equal(c, d)  # fresh OS entropy each time
    for bad in ["seed", 1.5, True]:
        with pytest.raises(TypeError, match="rng must be"):
            measure(A, x, PRIVACY, rng=bad)


@pytest.mark.parametrize(
    "x, match",
    [
        (np.ones((5, 2)), "must be 1-D"),
        (np.ones(9), "9 entries but the domain has 10"),
        (np.r_[np.ones(9), np.nan], "NaN or infinite"),
        (np.r_[np.ones(9), np.inf], "NaN or infinite"),
        (np.r_[np.ones(9), -1.0], "negative"),
        (["a"] * 10, "numeric counts"),
    ],
)
def test_measure_rejects_bad_data(x, match):
    with pytest.raises(ValueError, match=match):
        measure(Identity(10), x, PRIVACY, rng=0)


def test_measure_rejects_bad_arguments():
    with pytest.raises(TypeError, match="hdmm matrix"):
        measure(np.eye(3), np.ones(3), PRIVACY)
    with pytest.raises(TypeError, match="privacy"):
        measure(Identity(3), np.ones(3), 1.0)


# ====================================================================== exact routes against pinv
@SETTINGS
@given(pinv_matrices(), st.integers(0, 2**16))
def test_kronecker_route_is_the_pseudo_inverse(pair, seed):
    # any single (weighted) Kronecker term, factors of every structure, rank deficient included
    assert_pinv(pair.mat, pair.ref, "kronecker", seed)


@pytest.mark.parametrize(
    "A",
    [
        # rank-deficient factor, a total and an identity
        Kronecker([Explicit(np.array([[1.0, 1, 0], [0, 0, 1], [1, 1, 1]])), Ones(1, 4), Identity(3)]),
        2.5 * Kronecker([wl.Prefix(5), wl.IdentityTotal(3)]),
        Kronecker([Kronecker([Identity(2), Ones(2, 3)]), Weighted(wl.AllRange(4), 0.5)]),
        Kronecker([Identity(2), PIdentity(np.random.default_rng(0).random((2, 6)), norm=1)]),
        PIdentity(np.random.default_rng(1).random((3, 10)), norm=2),
        0.0 * Kronecker([Identity(2), Identity(3)]),
    ],
    ids=["deficient", "weighted", "nested", "pidentity_factor", "pidentity", "zero"],
)
def test_kronecker_strategies(A):
    assert reconstruction_method(A) == "kronecker"
    assert_pinv(A, A.dense(), "kronecker")
    assert_pinv(A, A.dense(), "auto")


@SETTINGS
@given(domain_shapes().flatmap(marginals_on), st.integers(0, 2**16))
def test_marginals_route_is_the_pseudo_inverse(pair, seed):
    assert_pinv(pair.mat, pair.ref, "marginals", seed)


@pytest.mark.parametrize("shape", [(3, 4, 2), (2, 1, 5), (6,)])
def test_residuals_and_identity_total_unions(shape):
    W = hdmm.AllMarginals(shape, max_size=min(2, len(shape)))
    R = opt_residual(W)
    assert reconstruction_method(R) == "marginals"
    assert_pinv(R, R.dense(), "auto")
    union = VStack([Kronecker([Identity(n) if i == j else Ones(1, n) for i, n in enumerate(shape)]) for j in range(len(shape))])
    assert reconstruction_method(union) == ("kronecker" if len(shape) == 1 else "marginals")
    assert_pinv(union, union.dense(), "auto")


@SETTINGS
@given(domain_shapes().flatmap(strategies_on), st.integers(0, 2**16))
def test_auto_route_is_the_pseudo_inverse(pair, seed):
    assert_pinv(pair.mat, pair.ref, "auto", seed)


# ====================================================================== LSMR
def opt_union_strategy(shape=(16, 6, 3), seed=0):
    dom = hdmm.Domain([f"a{i}" for i in range(len(shape))], shape)
    W = wl.union([
        wl.product(dom, {"a0": wl.Prefix(shape[0]), "a1": Identity(shape[1])}),
        wl.product(dom, {"a1": wl.AllRange(shape[1]), "a2": Identity(shape[2])}),
        Marginal(dom, ("a0", "a2")),
    ])
    return W, opt_union(W, groups=[[0], [1], [2]], seed=seed)  # a genuine union of three strategies


def test_lsmr_on_a_union_strategy_is_the_pseudo_inverse():
    _, A = opt_union_strategy()
    assert isinstance(A, VStack) and reconstruction_method(A) == "lsmr"
    ref = A.dense()
    assert np.linalg.matrix_rank(ref) < ref.shape[1]  # rank deficient: minimum-norm solution expected
    assert_pinv(A, ref, "lsmr")
    assert_pinv(A, ref, "auto")


@pytest.mark.parametrize(
    "A",
    [
        Marginals((3, 4), {(0,): 1.0, (1,): 2.0, (): 0.5}),
        Product(Explicit(np.eye(12) + 0.1), wl.Prefix(12)),
        Kronecker([wl.Prefix(4), Ones(1, 3)]),
    ],
)
def test_lsmr_agrees_with_the_exact_routes(A):
    assert_pinv(A, A.dense(), "lsmr")


def test_lsmr_monitors_the_workload_and_warm_starts():
    W, A = opt_union_strategy(seed=1)
    _, m = noisy(A, seed=5)
    exact = np.linalg.pinv(A.dense()) @ m.answers
    se = np.sqrt(per_query_variance(W, A, PRIVACY))
    loose = reconstruct(m, "lsmr", workload=W, std_errors=se, tol=0.05)
    assert np.max(np.abs(W @ (loose - exact)) / se) <= 0.05
    warm = reconstruct(m, "lsmr", x0=exact)
    np.testing.assert_allclose(warm, exact, atol=1e-6 * np.abs(exact).max())


def test_lsmr_warns_at_the_iteration_cap():
    _, A = opt_union_strategy()
    _, m = noisy(A)
    with pytest.warns(RuntimeWarning, match=r"iteration cap \(2 iterations\).*residual"):
        reconstruct(m, "lsmr", maxiter=2)


def test_reconstruct_rejects_bad_requests():
    _, U = opt_union_strategy()
    _, m = noisy(U)
    with pytest.raises(ValueError, match="unknown reconstruction method 'pinv'"):
        reconstruct(m, "pinv")
    with pytest.raises(ValueError, match="method='kronecker' needs .*use method='lsmr'"):
        reconstruct(m, "kronecker")
    with pytest.raises(ValueError, match="method='marginals' needs"):
        reconstruct(m, "marginals")
    with pytest.raises(ValueError, match="x0 must be a finite vector of length 288"):
        reconstruct(m, "lsmr", x0=np.ones(3))
    with pytest.raises(ValueError, match="tol must be"):
        reconstruct(m, "lsmr", tol=0)
    with pytest.raises(ValueError, match="maxiter must be"):
        reconstruct(m, "lsmr", maxiter=0)
    with pytest.raises(ValueError, match="std_errors must hold"):
        reconstruct(m, "lsmr", std_errors=np.ones(2))
    with pytest.raises(TypeError, match="Measurement"):
        reconstruct(np.ones(3))


def test_large_kronecker_strategy_never_forms_dense_matrices():
    # 2 * 2 * 63 * 17 * 115 cells: the SF1 domain; a rank-deficient Kronecker strategy
    A = Kronecker([Identity(2), Identity(2), PIdentity(np.ones((2, 63)) * 0.1), Ones(1, 17), wl.Prefix(115)])
    x = np.random.default_rng(0).poisson(1.0, A.shape[1]).astype(float)
    m = measure(A, x, PRIVACY, rng=0)
    xhat = reconstruct(m)
    assert xhat.shape == x.shape
    # sums over the totalled attribute are recovered without bias (and the rest evenly spread)
    np.testing.assert_allclose(xhat.reshape(2, 2, 63, 17, 115).std(axis=3), 0.0, atol=1e-9)


def test_a_plan_whose_noise_does_not_fit_its_strategy_is_refused_before_any_noise():
    import dataclasses

    W = hdmm.Prefix(4)
    p = hdmm.plan(W, hdmm.Identity(4), hdmm.PureDP(1.0))
    x = np.array([3.0, 1.0, 4.0, 1.0])
    budget = hdmm.Budget(hdmm.PureDP(5.0))
    for edited in (dataclasses.replace(p, strategy=2.0 * hdmm.Identity(4)),      # twice the sensitivity, same noise
                   dataclasses.replace(p, noise_scale=p.noise_scale / 2),
                   dataclasses.replace(p, spacing=4.0)):                           # a grid rounding by up to 8
        with pytest.raises(ValueError, match="not calibrated to its strategy"):
            hdmm.measure(edited, x, budget=budget)
    assert budget.spent == 0.0
    harmless = dataclasses.replace(p, origin="edited by hand")                  # checked once, then measured
    assert hdmm.measure(harmless, x, rng=0).noise_scale == p.noise_scale
    # an optimization result paired with another strategy does not lend it its sensitivity
    result = hdmm.optimize(W, hdmm.PureDP(1.0), seed=0)
    swapped = dataclasses.replace(result, strategy=3.0 * result.strategy)
    assert hdmm.plan(W, swapped, hdmm.PureDP(1.0)).sensitivity == pytest.approx(3.0 * result.strategy.sensitivity(1))
