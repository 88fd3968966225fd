"""The root's non-negative cells fitted through the workload (hdmm.georelease.rootfit)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import lsq_linear
from scipy.optimize import minimize as so_minimize

import hdmm
from hdmm.georelease import ArrayHistograms, geo_plan, release_geography
from hdmm.geography import GeographyTree
from hdmm.georelease import rootfit
from hdmm.georelease import nonneg
from hdmm.georelease.rootfit import TIE_WEIGHT, workload_projection
from hdmm.matrix import Explicit, Kronecker


def _metric(W: np.ndarray, A: np.ndarray, tie: float = TIE_WEIGHT) -> np.ndarray:
    """The projection's metric, with the norms computed exactly (the module pads its estimates alike)."""
    mu = tie * np.linalg.norm(W, 2) ** 2 / np.linalg.norm(A, 2) ** 2
    return W.T @ W + mu * A.T @ A


def _solve(W, A, x, total=None):
    return workload_projection(Explicit(W), Explicit(A), x, total, workload_norm=np.linalg.norm(W, 2) ** 2,
                               strategy_norm=np.linalg.norm(A, 2) ** 2)


def _problem(seed: int, n: int, m: int):
    rng = np.random.default_rng(seed)
    W = rng.integers(0, 2, size=(m, n)).astype(float)
    W[0] = 1.0  # the total among the queries
    A = np.vstack([np.eye(n), rng.integers(0, 2, size=(3, n))]).astype(float)
    truth = rng.poisson(0.7, size=n).astype(float)
    x = truth + rng.normal(0, 1.5, size=n)
    return W, A, truth, x


@pytest.mark.parametrize("seed", range(6))
def test_equals_bounded_least_squares_on_the_dense_metric(seed):
    W, A, _, x = _problem(seed, 12, 5)  # fewer queries than cells: W's Gram alone is singular
    M = _metric(W, A)
    R = np.linalg.cholesky(M).T  # M = R^T R
    reference = lsq_linear(R, R @ x, bounds=(0, np.inf), method="bvls", tol=1e-14).x
    v = _solve(W, A, x)
    assert np.all(v >= 0)
    np.testing.assert_allclose(v, reference, atol=1e-6 * max(1.0, np.abs(reference).max()))


def _exhaustive(M: np.ndarray, x: np.ndarray, t: float) -> np.ndarray:
    """min (v-x)'M(v-x)/2 over v >= 0, sum v = t, by solving the equality problem on every support."""
    n = x.size
    best, best_value = None, np.inf
    for k in range(1, n + 1):
        for S in itertools.combinations(range(n), k):
            S = list(S)
            K = np.zeros((k + 1, k + 1))
            K[:k, :k], K[:k, k], K[k, :k] = M[np.ix_(S, S)], 1.0, 1.0
            rhs = np.concatenate([M[S] @ x, [t]])
            sol = np.linalg.lstsq(K, rhs, rcond=None)[0]
            v = np.zeros(n)
            v[S] = sol[:k]
            if np.any(v < -1e-12) or abs(v.sum() - t) > 1e-9 * max(1.0, t):
                continue
            value = 0.5 * (v - x) @ M @ (v - x)
            if value < best_value:
                best, best_value = v, value
    return best


@pytest.mark.parametrize("seed", range(6))
def test_a_held_total_equals_exhaustive_search(seed):
    W, A, truth, x = _problem(seed, 6, 3)
    t = float(truth.sum()) + 1.0
    v = _solve(W, A, x, t)
    assert np.all(v >= 0) and v.sum() == pytest.approx(t, rel=1e-12)
    reference = _exhaustive(_metric(W, A), x, t)
    np.testing.assert_allclose(v, reference, atol=1e-5 * max(1.0, t))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), held=st.booleans())
def test_never_further_from_a_valid_truth_than_least_squares_in_its_metric(seed, held):
    W, A, truth, x = _problem(seed, 10, 4)
    v = _solve(W, A, x, float(truth.sum()) if held else None)
    M = _metric(W, A)
    after, before = (v - truth) @ M @ (v - truth), (x - truth) @ M @ (x - truth)
    assert after <= before * (1 + 1e-6) + 1e-8


def test_edge_cases_and_refusals():
    W, A = Explicit(np.ones((1, 3))), Explicit(np.eye(3))
    np.testing.assert_array_equal(workload_projection(W, A, np.array([-1.0, 2.0, 0.5]), 0.0), np.zeros(3))
    np.testing.assert_array_equal(workload_projection(W, A, np.array([-1.0, -2.0, -0.5])), np.zeros(3))
    with pytest.raises(ValueError, match="one vector of 3 cells"):
        workload_projection(W, A, np.zeros(4))
    with pytest.raises(ValueError, match="NaN or infinite"):
        workload_projection(W, A, np.array([1.0, np.nan, 0.0]))
    with pytest.raises(ValueError, match="all zeros"):
        workload_projection(Explicit(np.zeros((1, 3))), A, np.ones(3))


def test_the_step_limit_warns(monkeypatch):
    monkeypatch.setattr(rootfit, "ROOT_MAXITER", 1)
    W, A, _, x = _problem(0, 12, 5)
    with pytest.warns(RuntimeWarning, match="stopped after 1 steps"):
        v = _solve(W, A, x)
    assert np.all(v >= 0)


def test_a_release_fits_its_root_through_the_workload_within_least_squares_accuracy():
    # a strategy that measures every cell against a workload of wide sums, on sparse data: the root's
    # non-negative answers are fitted through the workload, whose error they cannot exceed by more than the tie
    domain = hdmm.Domain(["a", "b"], [4, 32])
    wide = np.vstack([np.ones(32), np.r_[np.ones(16), np.zeros(16)], np.r_[np.zeros(24), np.ones(8)]])
    W = hdmm.product(domain, {"a": hdmm.Identity(4), "b": Explicit(wide)})
    A = Kronecker([hdmm.Identity(4), hdmm.Identity(32)])
    tree = GeographyTree.from_parents({"s0": "US", "s1": "US", "s0c0": "s0", "s0c1": "s0", "s1c0": "s1"},
                                      ["nation", "state", "county"])
    H = sp.csr_matrix(np.random.default_rng(0).poisson(0.1, size=(tree.leaves, domain.size)).astype(float))
    truth = W @ np.asarray(H.sum(axis=0)).ravel()
    plan = geo_plan(tree, W, hdmm.PureDP(1.0), strategy=A)
    assert nonneg.strategy_beyond_workload(plan)  # 128 cells measured, 12 independent queries
    calls = []
    fit = nonneg.workload_projection
    with pytest.MonkeyPatch.context() as m:
        m.setattr(nonneg, "workload_projection", lambda *a, **k: calls.append(1) or fit(*a, **k))
        errors = {"ls": [], "nonnegative": []}
        for seed in range(8):
            errors["ls"].append(release_geography(plan, ArrayHistograms(H), seed=seed).answers(0)[0] - truth)
            nn = release_geography(plan, ArrayHistograms(H), seed=seed, postprocess="nonnegative")
            assert np.all(nn.answers(0) >= -1e-9)
            errors["nonnegative"].append(nn.answers(0)[0] - truth)
    assert len(calls) == 8
    rmse = {k: float(np.sqrt(np.mean(np.square(v)))) for k, v in errors.items()}
    assert rmse["nonnegative"] <= 1.05 * rmse["ls"], rmse


def test_a_strategy_inside_the_workloads_row_space_keeps_the_strategy_metric():
    domain = hdmm.Domain(["a", "b"], [4, 8])
    W = hdmm.product(domain, {"a": hdmm.Identity(4), "b": hdmm.Prefix(8)})
    tree = GeographyTree.from_parents({"s0": "US", "s1": "US"}, ["nation", "state"])
    inside = geo_plan(tree, W, hdmm.PureDP(1.0), strategy=Kronecker([hdmm.Identity(4), hdmm.Identity(8)]))
    assert not nonneg.strategy_beyond_workload(inside)  # the prefixes span every cell of b
    narrow = hdmm.product(domain, {"a": hdmm.Identity(4), "b": hdmm.Total(8)})
    beyond = geo_plan(tree, narrow, hdmm.PureDP(1.0), strategy=Kronecker([hdmm.Identity(4), hdmm.Prefix(8)]))
    assert nonneg.strategy_beyond_workload(beyond)


@pytest.mark.parametrize("held", [False, True])
def test_negligible_cells_go_to_zero_within_the_slack(held):
    W, A, truth, x = _problem(3, 12, 5)
    total = float(truth.sum()) if held else None
    exact = _solve(W, A, x, total)
    M = _metric(W, A)
    slack = 0.5 * 0.3**2 * W.shape[0]
    sparse = workload_projection(Explicit(W), Explicit(A), x, total, workload_norm=np.linalg.norm(W, 2) ** 2,
                                 strategy_norm=np.linalg.norm(A, 2) ** 2, negligible=0.3, slack=slack)
    assert np.all(sparse >= 0) and (not held or sparse.sum() == pytest.approx(total, rel=1e-12))
    if not np.any((sparse > 0) & (sparse < 0.3)):  # zeroed: the objective rose by at most the slack
        rise = 0.5 * ((sparse - x) @ M @ (sparse - x) - (exact - x) @ M @ (exact - x))
        assert rise <= slack * (1 + 1e-6)
    else:  # refused: the fit is the exact one
        np.testing.assert_allclose(sparse, exact)


def _beyond_plan():
    """A strategy that measures every cell against a workload of wide sums, on a three-level tree."""
    domain = hdmm.Domain(["a", "b"], [4, 8])
    wide = np.vstack([np.ones(8), np.r_[np.ones(4), np.zeros(4)]])
    W = hdmm.product(domain, {"a": hdmm.Identity(4), "b": Explicit(wide)})
    A = Kronecker([hdmm.Identity(4), hdmm.Identity(8)])
    tree = GeographyTree.from_parents({"s0": "US", "s1": "US", "s2": "US", "s0c0": "s0", "s0c1": "s0",
                                       "s0c2": "s0", "s1c0": "s1", "s2c0": "s2", "s2c1": "s2"},
                                      ["nation", "state", "county"])
    rng = np.random.default_rng(0)
    H = np.vstack([rng.poisson(lam, size=domain.size) for lam in (0.3, 12.0, 2.0, 4.0, 0.2, 8.0)]).astype(float)
    return geo_plan(tree, W, hdmm.PureDP(1.0), strategy=A), ArrayHistograms(sp.csr_matrix(H))


@pytest.mark.parametrize("dense_path", [True, False])
def test_a_family_pulled_toward_its_fitted_totals_solves_the_penalized_projection(dense_path, monkeypatch):
    # min sum_i |A(v_i - x_i)|^2 + lam (1'v_i - t_i)^2 over v >= 0, sum_i v_i = p: by the exact active set on a
    # small domain, by FISTA otherwise; against SLSQP
    if not dense_path:
        monkeypatch.setattr(nonneg, "DENSE_CELLS", 0)
    plan, _ = _beyond_plan()
    assert nonneg.totals_first(plan, 1) and nonneg.totals_first(plan, 2)
    walk = nonneg.TopDown(plan, lambda d, units: None, None)
    rng = np.random.default_rng(3)
    k, n = 3, 32
    X = rng.normal(2.0, 3.0, size=(k, n))
    p = rng.uniform(0.5, 9.0, size=n)
    t = nonneg.simplex_projection(X.sum(axis=1)[:, None] + np.array([[25.0], [-40.0], [5.0]]), np.array([p.sum()]))[:, 0]
    lam = walk.total_weight(2)
    V = walk.family(2, X, p, np.full(k, np.nan), totals=t)
    A = np.eye(n)

    def f(v):
        D = v.reshape(k, n) - X
        R = D @ A.T
        miss = v.reshape(k, n).sum(axis=1) - t
        return float(np.sum(R**2) + lam * np.sum(miss**2))

    brute = so_minimize(f, np.tile(p / k, k), method="SLSQP", bounds=[(0, None)] * (k * n),
                        constraints=[{"type": "eq", "fun": lambda v: v.reshape(k, n).sum(axis=0) - p}],
                        options={"ftol": 1e-14, "maxiter": 2000})
    assert np.all(V >= 0) and np.allclose(V.sum(axis=0), p)
    assert f(V.ravel()) <= brute.fun + 1e-3 * max(1.0, brute.fun)
    np.testing.assert_allclose(V, brute.x.reshape(k, n), atol=0.05)


def test_dense_families_keep_totals_near_their_least_squares_ones_and_sparse_ones_are_unchanged(monkeypatch):
    plan, source = _beyond_plan()
    tree = plan.tree

    def misses(weight, dense_children=nonneg.DENSE_CHILDREN):
        monkeypatch.setattr(nonneg, "TOTALS_WEIGHT", weight)
        monkeypatch.setattr(nonneg, "DENSE_CHILDREN", dense_children)
        out, answers = [], []
        for seed in range(4):
            ls = release_geography(plan, source, seed=seed)
            nn = release_geography(plan, source, seed=seed, postprocess="nonnegative")
            answers.append(nn.answers(2))
            for d in (1, 2):
                b = tree.child_bounds(d - 1)
                for u in range(tree.sizes[d - 1]):
                    fitted = nonneg.simplex_projection(ls.totals(d)[b[u]:b[u + 1], None],
                                                       np.array([nn.totals(d - 1)[u]]))[:, 0]
                    out.append(np.abs(nn.totals(d)[b[u]:b[u + 1]] - fitted))
        return float(np.mean(np.concatenate(out))), answers

    pulled, _ = misses(nonneg.TOTALS_WEIGHT)
    free, plain = misses(0.0)
    assert pulled < 0.5 * free, (pulled, free)
    _, sparse = misses(nonneg.TOTALS_WEIGHT, dense_children=1e9)  # no family dense enough: as without the pull
    for a, b in zip(plain, sparse):
        np.testing.assert_allclose(a, b, atol=1e-8)
