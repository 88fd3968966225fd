"""Expected error (hdmm.error) against the dense formulas of docs/math.md, sections 1.4 and 6."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.special import gamma

from hdmm import workload as wl
from hdmm.error import ErrorResult, expected_error, lp_error, per_query_variance, rmse
from hdmm.marginals import AllMarginals, Marginal, Marginals
from hdmm.matrix import Explicit, Identity, Kronecker, Product, VStack, Weighted
from hdmm.privacy import ApproxDP, PureDP, ZCDP
from strategies import (
    SETTINGS,
    Pair,
    dense_error,
    domain_shapes,
    factorizations,
    marginals_on,
    privacies,
    strategies_on,
    workloads_on,
)

PRIVACIES = [PureDP(1.0), ZCDP(0.5), ApproxDP(1.0, 1e-6)]


@st.composite
def error_cases(draw, gaussian_only=False, strategy=None):
    shape = draw(domain_shapes())
    W = draw(workloads_on(shape))
    A = draw(strategy(shape) if strategy is not None else strategies_on(shape))
    privacy = draw(privacies(gaussian_only))
    return W, A, privacy


def check_total(W: Pair, A: Pair, privacy):
    want = dense_error(W.ref, A.ref, privacy)
    got = expected_error(W.mat, A.mat, privacy)
    assert isinstance(got, ErrorResult) and isinstance(got, float)
    assert got.queries == W.shape[0]
    assert got.privacy == privacy
    if want.supported:
        assert got.supported, got.reason
        assert got.reason is None
        assert float(got) == pytest.approx(want.total, rel=1e-7, abs=1e-9 * want.variance)
    else:
        assert not got.supported
        assert math.isinf(got)
        assert isinstance(got.reason, str) and got.reason
    return got, want


@SETTINGS
@given(error_cases())
def test_expected_error(case):
    check_total(*case)


@SETTINGS
@given(error_cases(strategy=lambda shape: marginals_on(shape)))
def test_expected_error_marginal_strategies(case):
    check_total(*case)


@SETTINGS
@given(error_cases())
def test_rmse_and_per_query_variance(case):
    W, A, privacy = case
    got, want = check_total(W, A, privacy)
    r = rmse(W.mat, A.mat, privacy)
    v = per_query_variance(W.mat, A.mat, privacy)
    assert isinstance(v, np.ndarray) and v.shape == (W.shape[0],) and v.dtype == np.float64
    if want.supported:
        assert float(r) == pytest.approx(math.sqrt(want.total / W.shape[0]), rel=1e-7, abs=1e-9)
        assert r.supported
        np.testing.assert_allclose(v, want.per_query, rtol=1e-7, atol=1e-9 * want.variance)
        assert v.sum() == pytest.approx(float(got), rel=1e-7, abs=1e-9 * want.variance)
    else:
        assert math.isinf(r) and not r.supported and r.reason
        # every query outside the strategy's row space has infinite variance
        assert np.any(np.isinf(v))


@SETTINGS
@given(error_cases(gaussian_only=True), st.sampled_from([1.0, 1.5, 2.0, 3.0, 4.0]))
def test_lp_error_closed_form(case, p):
    W, A, privacy = case
    want = dense_error(W.ref, A.ref, privacy)
    got = lp_error(W.mat, A.mat, privacy, p)
    if not want.supported:
        assert math.isinf(got)
        return
    moment = 2 ** (p / 2) * gamma((p + 1) / 2) / math.sqrt(math.pi)
    expected = (np.sum(want.per_query ** (p / 2)) * moment) ** (1 / p)
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-9)
    if p == 2:
        assert got == pytest.approx(math.sqrt(want.total), rel=1e-7, abs=1e-9)


def test_lp_error_monte_carlo():
    rng = np.random.default_rng(7)
    W = Kronecker([wl.Prefix(4), wl.IdentityTotal(2)])
    Wd = np.kron(np.tril(np.ones((4, 4))), np.vstack([np.eye(2), np.ones((1, 2))]))
    F1, F2 = rng.standard_normal((5, 4)), rng.standard_normal((3, 2))
    A = Kronecker([Explicit(F1), Explicit(F2)])
    Ad = np.kron(F1, F2)
    privacy = ZCDP(0.5)
    sigma = privacy.noise_scale(np.sqrt((Ad**2).sum(axis=0)).max())
    recon = Wd @ np.linalg.pinv(Ad)
    z = rng.normal(0.0, sigma, size=(Ad.shape[0], 40_000))
    errors = recon @ z
    for p in (1.0, 2.0, 3.0):
        mc = np.mean(np.sum(np.abs(errors) ** p, axis=0)) ** (1 / p)
        assert lp_error(W, A, privacy, p) == pytest.approx(mc, rel=0.03)


def test_lp_error_laplace_only_for_p_2():
    W, A = wl.Prefix(4), Identity(4)
    assert lp_error(W, A, PureDP(1.0), 2) == pytest.approx(math.sqrt(expected_error(W, A, PureDP(1.0))))
    with pytest.raises(ValueError):
        lp_error(W, A, PureDP(1.0), 3)
    for bad in (0.5, 0, -1, math.inf, math.nan, "2"):
        with pytest.raises(ValueError):
            lp_error(W, A, ZCDP(1.0), bad)


@st.composite
def cross_factorization_cases(draw):
    """Workload and strategy over the same number of cells, factorized differently."""
    N = draw(st.sampled_from([4, 6, 8, 12, 16, 18, 24]))
    shapes = factorizations(N)
    w_shape, a_shape = draw(st.sampled_from(shapes)), draw(st.sampled_from(shapes))
    W = draw(workloads_on(w_shape))
    A = draw(strategies_on(a_shape))
    return W, A, draw(privacies())


@SETTINGS
@given(cross_factorization_cases())
def test_expected_error_across_factorizations(case):
    check_total(*case)


def test_prefix_workload_under_a_marginals_strategy():
    # a silent wrong answer before: the workload over (6,) against marginals over (2, 3)
    W = wl.Prefix(6)
    A = Marginals((2, 3), {(0, 1): 1.0, (0,): 1.0})
    Ad = np.vstack([np.eye(6), np.kron(np.eye(2), np.ones((1, 3)))])
    want = dense_error(np.tril(np.ones((6, 6))), Ad, ZCDP(1.0))
    assert float(expected_error(W, A, ZCDP(1.0))) == pytest.approx(want.total, rel=1e-9)  # 7.25


def test_lp_error_accepts_numpy_numbers():
    W, A = wl.Prefix(4), Identity(4)
    assert lp_error(W, A, ZCDP(1.0), np.float64(1.5)) == pytest.approx(lp_error(W, A, ZCDP(1.0), 1.5))
    assert lp_error(W, A, ZCDP(1.0), np.int64(3)) == pytest.approx(lp_error(W, A, ZCDP(1.0), 3))


# ====================================================================== each strategy structure
def _kron_explicit(shape, seed):
    rng = np.random.default_rng(seed)
    fs = [rng.standard_normal((n + 1, n)) for n in shape]
    return Pair(Kronecker([Explicit(f) for f in fs]), np.kron(fs[0], fs[1]) if len(fs) == 2 else fs[0])


def _mixed_workload():
    """A union of weighted Kronecker products with mixed factors, and marginals, over (3, 4)."""
    rng = np.random.default_rng(3)
    E = rng.standard_normal((2, 4))
    W = wl.union(
        [
            Kronecker([wl.Prefix(3), wl.AllRange(4)]),
            2.0 * Kronecker([Identity(3), Explicit(E)]),
            wl.product((3, 4), {1: wl.WidthKRange(4, 2)}),
            Marginals((3, 4), {(0,): 1.0, (0, 1): 0.5}),
        ]
    )
    P3 = np.tril(np.ones((3, 3)))
    R4 = wl.AllRange(4).dense()
    ref = np.vstack(
        [
            np.kron(P3, R4),
            2.0 * np.kron(np.eye(3), E),
            np.kron(np.ones((1, 3)), np.array([[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], float)),
            np.kron(np.eye(3), np.ones((1, 4))),
            0.5 * np.eye(12),
        ]
    )
    return Pair(W, ref)


def _strategies():
    rng = np.random.default_rng(11)
    shape = (3, 4)
    out = {"kron explicit": _kron_explicit(shape, 5), "identity": Pair(Identity(12), np.eye(12))}
    w = {(0, 1): 1.0, (0,): 0.7, (1,): 0.4, (): 2.0}
    ref = np.vstack(
        [np.eye(12), 0.7 * np.kron(np.eye(3), np.ones((1, 4))), 0.4 * np.kron(np.ones((1, 3)), np.eye(4)), 2.0 * np.ones((1, 12))]
    )
    out["weighted marginals"] = Pair(Marginals(shape, w), ref)
    out["identity/total union"] = Pair(
        VStack([Kronecker([Identity(3), Identity(4)]), 0.7 * Kronecker([Identity(3), wl.Total(4)]), 0.4 * Kronecker([wl.Total(3), Identity(4)]), 2.0 * Kronecker([wl.Total(3), wl.Total(4)])]),
        ref,
    )
    B = rng.standard_normal((14, 12))
    out["generic explicit"] = Pair(Explicit(B), B)
    out["generic product"] = Pair(Product(Explicit(B), wl.Prefix(12)), B @ np.tril(np.ones((12, 12))))
    return out


@pytest.mark.parametrize("name", list(_strategies()))
@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_each_strategy_structure(name, privacy):
    A = _strategies()[name]
    W = _mixed_workload()
    check_total(W, A, privacy)
    want = dense_error(W.ref, A.ref, privacy)
    np.testing.assert_allclose(per_query_variance(W.mat, A.mat, privacy), want.per_query, rtol=1e-7)


def test_error_ratios_do_not_depend_on_epsilon_and_scaling_a_strategy_is_free():
    W = _mixed_workload().mat
    A, B = _strategies()["kron explicit"].mat, _strategies()["weighted marginals"].mat
    ratios = [expected_error(W, A, PureDP(e)) / expected_error(W, B, PureDP(e)) for e in (0.1, 1.0, 7.0)]
    assert ratios == pytest.approx([ratios[0]] * 3, rel=1e-9)
    for privacy in PRIVACIES:
        assert expected_error(W, 5.0 * A, privacy) == pytest.approx(expected_error(W, A, privacy), rel=1e-9)


# ====================================================================== unsupported strategies
@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_missing_marginal_is_unsupported(privacy):
    W = Marginal((2, 3, 2), (0, 1))
    A = Marginals((2, 3, 2), {(0,): 1.0, (1,): 1.0, (1, 2): 1.0})
    err = expected_error(W, A, privacy)
    assert math.isinf(err) and not err.supported
    assert isinstance(err.reason, str) and "row space" in err.reason
    r = rmse(W, A, privacy)
    assert math.isinf(r) and not r.supported and r.reason
    assert np.all(np.isinf(per_query_variance(W, A, privacy)))
    # the same workload in a union with supported parts is still unsupported
    U = wl.union([Marginal((2, 3, 2), (1,)), W])
    err = expected_error(U, A, privacy)
    assert math.isinf(err) and not err.supported
    v = per_query_variance(U, A, privacy)
    assert np.all(np.isfinite(v[:3])) and np.all(np.isinf(v[3:]))


@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_rank_deficient_explicit_factor_is_unsupported(privacy):
    F = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # cannot tell cells 0 and 1 apart
    A = Kronecker([Explicit(F), Identity(2)])
    for W in (Identity(6), Kronecker([Identity(3), Identity(2)]), Kronecker([wl.Prefix(3), wl.Total(2)])):
        err = expected_error(W, A, privacy)
        assert math.isinf(err) and not err.supported and err.reason
    # but the queries it can answer are supported
    ok = Kronecker([Explicit(np.array([[2.0, 2.0, 1.0]])), Identity(2)])
    want = dense_error(np.kron([[2.0, 2.0, 1.0]], np.eye(2)), np.kron(F, np.eye(2)), privacy)
    err = expected_error(ok, A, privacy)
    assert err.supported and float(err) == pytest.approx(want.total, rel=1e-9)


@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_rank_deficient_generic_strategy_is_unsupported(privacy):
    B = np.random.default_rng(0).standard_normal((3, 6))
    err = expected_error(Identity(6), Explicit(B), privacy)
    assert math.isinf(err) and not err.supported and err.reason
    err = expected_error(Identity(6), VStack([Explicit(B), wl.Prefix(6)]), privacy)
    assert err.supported


@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_workload_orthogonal_to_strategy_is_unsupported(privacy):
    # W's only query lies in the null space of A: W A^+ A = 0 != W, so the error is infinite
    W, A = Explicit([[0.0, 1.0]]), Explicit([[1.0, 0.0]])
    err = expected_error(W, A, privacy)
    assert math.isinf(err) and not err.supported and err.reason
    assert np.all(np.isinf(per_query_variance(W, A, privacy)))
    W = Kronecker([Explicit([[0.0, 1.0, 0.0]]), Identity(2)])
    A = Kronecker([Explicit([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]), Identity(2)])
    err = expected_error(W, A, privacy)
    assert math.isinf(err) and not err.supported and err.reason


@pytest.mark.parametrize(
    "A",
    [Explicit([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), VStack([Explicit([[1.0, 0.0, 0.0]]), Explicit([[0.0, 1.0, 0.0]])])],
    ids=["kronecker route", "dense route"],
)
def test_per_query_variance_is_infinite_only_for_unsupported_queries(A):
    # the strategy answers cells 0 and 1 exactly but knows nothing about cell 2: the first two
    # identity queries have variance Var(z) * 1 = 2 under PureDP(1), only the third is infinite
    v = per_query_variance(Identity(3), A, PureDP(1.0))
    np.testing.assert_allclose(v[:2], [2.0, 2.0])
    assert np.isinf(v[2])
    assert not expected_error(Identity(3), A, PureDP(1.0)).supported


@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_zero_strategy_is_unsupported(privacy):
    for A in (0.0 * Identity(3), Explicit(np.zeros((2, 3))), Weighted(Kronecker([Identity(3), Identity(2)]), 0.0)):
        W = Identity(A.shape[1])
        err = expected_error(W, A, privacy)
        assert math.isinf(err) and not err.supported and err.reason, repr(err)


def test_supported_zero_workload_rows_are_fine():
    W = VStack([Identity(3), 0.0 * wl.Prefix(3)])
    err = expected_error(W, Identity(3), PureDP(1.0))
    assert err.supported and float(err) == pytest.approx(3 * 2.0)


# ====================================================================== bad inputs
def test_bad_inputs():
    W = Identity(6)
    with pytest.raises(ValueError, match="same domain"):
        expected_error(W, Identity(5), PureDP(1.0))
    with pytest.raises(ValueError, match="same domain"):
        expected_error(Marginal((2, 3), (0,)), AllMarginals((2, 2), 2), ZCDP(1.0))
    with pytest.raises(ValueError, match="same domain"):
        per_query_variance(W, Identity(5), PureDP(1.0))
    with pytest.raises(ValueError, match="same domain"):
        rmse(W, Identity(7), ZCDP(1.0))
    with pytest.raises(TypeError):
        expected_error(np.eye(6), W, PureDP(1.0))
    with pytest.raises(TypeError):
        expected_error(W, np.eye(6), PureDP(1.0))
    with pytest.raises(TypeError):
        per_query_variance(W, "identity", PureDP(1.0))
    for bad_privacy in (1.0, None, "pure", {"epsilon": 1.0}):
        with pytest.raises(TypeError, match="privacy"):
            expected_error(W, W, bad_privacy)
        with pytest.raises(TypeError, match="privacy"):
            per_query_variance(W, W, bad_privacy)
        with pytest.raises(TypeError, match="privacy"):
            lp_error(W, W, bad_privacy, 2)
