"""OPT_0 internals: sparse and dense evaluation paths, the working-set projected L-BFGS."""

from __future__ import annotations

import numpy as np
import pytest

import hdmm
import hdmm.optimizers.pidentity as P
from hdmm.matrix import Explicit
from hdmm.optimizers import opt0

GRAMS = {
    "prefix": lambda n: hdmm.Prefix(n).gram(),
    "allrange": lambda n: hdmm.AllRange(n).gram(),
    "width3": lambda n: hdmm.WidthKRange(n, 3).gram(),
}


def sparse_T(rng, p, n, density):
    return rng.random((p, n)) * (rng.random((p, n)) < density) * rng.choice([0.1, 1.0, 5.0])


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("gram", sorted(GRAMS))
def test_sparse_and_dense_paths_agree(norm, gram, monkeypatch):
    rng = np.random.default_rng(0)
    n, p = 40, 6
    G = GRAMS[gram](n)
    for _ in range(3):
        T = sparse_T(rng, p, n, 0.05)
        monkeypatch.setattr(P, "SPARSE_DENSITY", 1.0)
        v_sparse, g_sparse = P.pidentity_objective(T, G, norm)
        monkeypatch.setattr(P, "SPARSE_DENSITY", -1.0)
        v_dense, g_dense = P.pidentity_objective(T, G, norm)
        assert v_sparse == pytest.approx(v_dense, rel=1e-12)
        np.testing.assert_allclose(g_sparse, g_dense, rtol=1e-9, atol=1e-9 * np.abs(g_dense).max())
        # against the definition, with a dense n x n Gram
        Gd = G.dense()
        d = 1 + T.sum(0) if norm == 1 else np.sqrt(1 + (T * T).sum(0))
        A = np.vstack([np.eye(n), T]) / d
        assert v_dense == pytest.approx(np.trace(np.linalg.solve(A.T @ A, Gd)), rel=1e-10)


@pytest.mark.parametrize("norm", [1, 2])
def test_working_set_gradient_is_the_full_gradient_restricted(norm):
    rng = np.random.default_rng(1)
    n, p = 50, 5
    G = GRAMS["allrange"](n)
    problem = P._Problem(G, p, n, norm)
    T = sparse_T(rng, p, n, 0.1)
    omega = np.union1d(np.flatnonzero(T), rng.choice(p * n, 20, replace=False))  # explicit zeros too
    ev = problem.evaluate(omega, T.ravel()[omega])
    value, full = P.pidentity_objective(T, G, norm)
    assert ev.value == pytest.approx(value, rel=1e-12)
    np.testing.assert_allclose(ev.gradient_at(omega), full.ravel()[omega], rtol=1e-9, atol=1e-9 * np.abs(full).max())
    np.testing.assert_allclose(ev.gradient(), full, rtol=1e-9, atol=1e-9 * np.abs(full).max())


@pytest.mark.parametrize("gram", sorted(GRAMS))
def test_projected_lbfgs_stays_feasible_and_reports_its_value(gram):
    n, p = 64, 4
    G = GRAMS[gram](n)
    problem = P._Problem(G, p, n, 1)
    blocks = np.zeros((p, n))
    blocks[np.arange(n) * p // n, np.arange(n)] = 1.0
    start = P.pidentity_objective(blocks, G, 1, gradient=False)
    T, f, iterations = P._projected_lbfgs(problem, blocks, 300)
    assert np.all(T >= 0) and np.all(T <= P.T_MAX)
    assert f == pytest.approx(P.pidentity_objective(T, G, 1, gradient=False), rel=1e-10)
    assert f < start
    assert 0 < iterations <= 300


def test_upper_bound_is_respected_when_the_workload_wants_totals():
    n = 16
    G = hdmm.Total(n).gram()
    T, f = P.optimize_pidentity(G, 1, 1, restarts=1, rng=np.random.default_rng(0), maxiter=200)
    assert np.all(T <= P.T_MAX) and np.all(T >= 0)
    assert f < P.pidentity_objective(np.zeros((1, n)), G, 1, gradient=False)


@pytest.mark.parametrize("p", [1, None])
def test_small_extra_rows_are_kept_where_a_secant_step_would_clip_to_zero(p):
    # Identity and total on 115 values: the best p-Identity adds one total row of weight ~0.19;
    # T = 0 is a strict local minimum under Laplace noise, and the plain search jumped there
    from scipy.optimize import minimize_scalar

    n = 115
    W = hdmm.matrix.VStack([hdmm.Identity(n), hdmm.Total(n)])
    G = W.gram()
    best = minimize_scalar(lambda t: P.pidentity_objective(np.full((1, n), t), G, 1, gradient=False),
                           bounds=(0.05, 1.0), method="bounded").fun
    lap = hdmm.PureDP(1.0)
    found = hdmm.expected_error(W, opt0(W, p=p, seed=0), lap) / 2
    assert found <= best * (1 + 1e-4)
    assert found < 0.85 * hdmm.expected_error(W, hdmm.Identity(n), lap) / 2


def test_warm_start_never_gets_worse():
    n, p = 96, 6
    G = GRAMS["prefix"](n)
    rng = np.random.default_rng(3)
    T0, f0 = P.optimize_pidentity(G, p, 1, restarts=1, rng=rng, maxiter=40)
    T1, f1 = P.optimize_pidentity(G, p, 1, restarts=1, rng=rng, maxiter=40, start=T0)
    assert f1 <= f0 * (1 + 1e-12)


@pytest.mark.parametrize("n, published", [(128, 1.80), (256, 2.18)])
def test_opt0_meets_the_published_prefix_ratio(n, published):
    # tutorial seed, "Error on Prefix workload": RMSE of Identity over HDMM
    W = hdmm.Prefix(n)
    A = opt0(W, seed=0)
    lap = hdmm.PureDP(1.0)
    ratio = np.sqrt(hdmm.expected_error(W, hdmm.Identity(n), lap) / hdmm.expected_error(W, A, lap))
    assert round(float(ratio), 2) >= published  # published to two decimals


def test_default_p():
    assert [P.default_p(n) for n in (1, 8, 16, 128, 256, 512, 1024, 2048, 8192)] == [1, 1, 2, 16, 32, 64, 64, 128, 128]


def test_hierarchical_start_is_a_dyadic_tree():
    T = P.hierarchical_start(10, 7)
    assert T.shape == (7, 10)
    # 4 blocks, 2 halves, the total: every level covers each value once, with weight 1/2
    np.testing.assert_array_equal((T > 0).sum(axis=1), [2, 3, 2, 3, 5, 5, 10])
    np.testing.assert_allclose(T.sum(axis=0), 1.5)
    T = P.hierarchical_start(1024, 64)
    assert (T.sum(axis=1) > 0).sum() == 63 and np.all(T[63] == 0)


def test_total_support_check_matches_its_definition():
    from hdmm.optimizers.kron import _total_supports

    assert _total_supports([hdmm.Total(7), 3.0 * hdmm.Total(7)])
    assert _total_supports([Explicit(np.ones((4, 5)))])
    assert not _total_supports([hdmm.Total(7), hdmm.Prefix(7)])
    assert not _total_supports([Explicit(np.array([[1.0, 1.0, 1.0 + 1e-2]]))])


def test_window_test_stops_once_progress_is_slow():
    n, p = 64, 8
    G = GRAMS["prefix"](n)
    start = P.hierarchical_start(n, p)
    _, f_full, it_full = P._projected_lbfgs(P._Problem(G, p, n, 1), start, 400)
    _, f_window, it_window = P._projected_lbfgs(P._Problem(G, p, n, 1), start, 400, window_tol=1e-2)
    assert P.WINDOW <= it_window < it_full
    assert f_full <= f_window <= f_full * 1.05


def test_weighted_and_summed_grams_give_the_same_bits(monkeypatch):
    # the weights are peeled off the Gram and applied in the same order: identical floating point
    from hdmm.matrix import Sum, Weighted

    rng = np.random.default_rng(4)
    n, p = 60, 5
    base = GRAMS["allrange"](n)
    for norm in (1, 2):
        for density in (0.05, 0.5):
            T = sparse_T(rng, p, n, density)
            for weight in (1.0, 0.37):
                wrapped = Sum([Weighted(base, weight)])
                value, gradient = P.pidentity_objective(T, wrapped, norm)
                with monkeypatch.context() as m:
                    m.setattr(P, "_unscaled", lambda G: (G, ()))
                    through_wrappers = P.pidentity_objective(T, wrapped, norm)
                assert value == through_wrappers[0]
                np.testing.assert_array_equal(gradient, through_wrappers[1])
                assert value == pytest.approx(weight * P.pidentity_objective(T, base, norm, gradient=False), rel=1e-12)


@pytest.mark.parametrize("p", [1, 3, 12])
def test_structured_qr_factor_matches_the_dense_one(p, monkeypatch):
    monkeypatch.setattr(P, "DENSE_QR_MAX_N", 8)
    rng = np.random.default_rng(5)
    n = 40
    T = sparse_T(rng, p, n, 0.3)
    T_before = T.copy()
    A = P.PIdentity(T, 1)
    R = A._r_factor
    dense = np.linalg.qr(A.dense(), mode="r")
    np.testing.assert_allclose(np.abs(R), np.abs(dense), atol=1e-13)
    np.testing.assert_allclose(R.T @ R, A.dense().T @ A.dense(), atol=1e-13)
    np.testing.assert_array_equal(A.params, T_before)      # LAPACK works on copies


def test_exact_error_takes_woodbury_only_where_it_is_accurate(monkeypatch):
    from hdmm.traces import factor_trace

    monkeypatch.setattr(P, "DENSE_QR_MAX_N", 8)
    n, p = 64, 8
    W = hdmm.Prefix(n)
    G = W.gram()
    T = P.hierarchical_start(n, p)
    value, error = P._woodbury_trace(T, G, 1)
    assert error <= P.WOODBURY_RTOL
    exact, _ = factor_trace(P.PIdentity(T, 1), W)
    assert exact == value
    Rinv = P.PIdentity(T, 1)._r_inverse
    assert exact == pytest.approx(np.einsum("ij,ij->", Rinv, G.dense() @ Rinv), rel=1e-12)
    # identity rows of negligible weight: cancellation, so the QR factor is used
    big = np.full((p, n), P.T_MAX)
    value, error = P._woodbury_trace(big, G, 1)
    assert error > P.WOODBURY_RTOL
    A = P.PIdentity(big, 1)
    Rinv = A._r_inverse
    assert factor_trace(A, W)[0] == np.einsum("ij,ij->", Rinv, G @ Rinv)


def test_bump_start_shape():
    T = P.bump_start(1024, 64)
    assert T.shape == (64, 1024) and np.all((T == 0) | (T == 0.5))
    widths = (T > 0).sum(axis=1)
    # 57 overlapping bumps about 2 n / 57 wide, then the total, the halves and the quarters
    assert np.all(widths[:57] <= 2 * 1024 / 57 + 2) and np.all(widths[1:56] >= 2 * 1024 / 57 - 2)
    np.testing.assert_array_equal(widths[57:], [1024, 512, 512, 256, 256, 256, 256])
    assert np.all(T[:57].sum(axis=0) >= 0.5)               # every value is in a bump
    assert P.bump_start(600, 1).shape == (1, 600) and P.bump_start(600, 1).all()
    for n, kind in [(256, "hierarchical"), (1024, "bump"), (2048, "hierarchical"), (4096, "bump")]:
        p = P.default_p(n)
        expected = P.hierarchical_start(n, p) if kind == "hierarchical" else P.bump_start(n, p)
        np.testing.assert_array_equal(P.default_start(n, p), expected)


def test_l2_warmup_settles_the_rows_of_prefixes_with_a_total():
    # prefixes and the total once more (OPT_(x)'s effective Gram for an age attribute in prefix-marginals):
    # from the hierarchy alone the L1 search settles 0.46% above where the L2 warm-up leads it
    n, p = 100, 12
    G = hdmm.Prefix(n).gram() + hdmm.Total(n).gram()
    _, cold = P.optimize_pidentity(G, p, 1, restarts=1, rng=np.random.default_rng(0))
    T, warm = P.optimize_pidentity(G, p, 1, restarts=1, rng=np.random.default_rng(0), l2_warmup=100)
    assert warm < 0.996 * cold
    assert np.all(T >= 0) and warm == pytest.approx(P.pidentity_objective(T, G, 1, gradient=False), rel=1e-12)


def test_l2_warmup_leaves_gaussian_searches_and_warm_starts_alone():
    n, p = 64, 8
    G = GRAMS["prefix"](n)
    for kwargs in ({"norm": 2}, {"norm": 1, "start": P.hierarchical_start(n, p) * 0.3}):
        plain = P.optimize_pidentity(G, p, restarts=3, rng=np.random.default_rng(1), maxiter=60, **kwargs)
        warmed = P.optimize_pidentity(G, p, restarts=3, rng=np.random.default_rng(1), maxiter=60, l2_warmup=50,
                                      **kwargs)
        np.testing.assert_array_equal(plain[0], warmed[0])
        assert plain[1] == warmed[1]


def test_a_warm_up_that_ends_at_zero_keeps_the_default_start():
    # on the identity's Gram every extra row only costs: the L2 search clears T, the L1 search runs as without it
    n, p = 32, 4
    G = hdmm.Identity(n).gram()
    plain = P.optimize_pidentity(G, p, 1, restarts=2, rng=np.random.default_rng(0))
    warmed = P.optimize_pidentity(G, p, 1, restarts=2, rng=np.random.default_rng(0), l2_warmup=50)
    np.testing.assert_array_equal(plain[0], warmed[0])
    assert plain[1] == warmed[1] == pytest.approx(n)
