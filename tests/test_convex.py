"""The Gaussian-noise convex program (hdmm.optimizers.convex) against its optimality conditions.

Every solution is checked against what characterises the optimum independently of the solver:
feasibility (unit diagonal, positive definite), the KKT condition ``V = X Y X`` with ``Y``
diagonal, weak duality (objective >= certified dual bound >= SVD bound), a brute-force
minimisation on tiny cases, and hdmm's own error formula for the returned strategy. The Newton
direction is checked against the quadratic model solved by brute force, and the CG
preconditioner's model of the Schur matrix against its claimed spectral bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

import hdmm
from hdmm.error import expected_error
from hdmm.optimizers.convex import (
    ConvexProgress,
    ConvexResult,
    _direction,
    _Point,
    _schur_model,
    dual_bound,
    gaussian_error,
    solve_convex,
)

TOL = 1e-11  # solver tolerance for the optimality checks


def random_gram(n: int, rank: int, seed: int) -> np.ndarray:
    """``B B^T`` for a random ``n x rank`` Gaussian ``B`` (singular when ``rank < n``)."""
    B = np.random.default_rng(seed).standard_normal((n, rank))
    return B @ B.T


def whitened_kkt_residual(V: np.ndarray, res: ConvexResult) -> float:
    r"""Relative KKT residual :math:`\|R^{-T}(V_\theta - XYX)R^{-1}\|_F / \|R^{-T}V_\theta R^{-1}\|_F`.

    At the optimum the gradient :math:`-X^{-1}V_\theta X^{-1}` is diagonal, ``-Y``, i.e.
    :math:`V_\theta = XYX`; measured in the metric of the iterate (whitened by ``X = R^T R``) this
    is the part of the gradient the unit-diagonal constraints cannot absorb.
    """
    n = V.shape[0]
    V_theta = V + res.theta * np.eye(n)
    Z = np.linalg.inv(res.X)
    y = np.diag(Z @ V_theta @ Z)
    R = np.linalg.cholesky(res.X).T
    Rinv = np.linalg.inv(R)
    whitened = Rinv.T @ V_theta @ Rinv
    return float(np.linalg.norm(whitened - (R * y) @ R.T) / np.linalg.norm(whitened))


def svd_bound_of(V: np.ndarray) -> float:
    """(sum of singular values of V^(1/2))^2 / n, eigenvalues below the rank tolerance taken as 0."""
    e = np.linalg.eigvalsh(V)
    return np.sqrt(e[e > len(e) * np.finfo(float).eps * e[-1]]).sum() ** 2 / len(e)


def check_optimal(V: np.ndarray, res: ConvexResult, kkt: float = 1e-3) -> None:
    """Feasibility, KKT, certified gap, bounds and the returned strategy."""
    n = V.shape[0]
    X = res.X
    assert res.converged
    np.testing.assert_array_equal(np.diag(X), np.ones(n))
    np.testing.assert_allclose(X, X.T, rtol=0, atol=1e-14)
    assert np.linalg.eigvalsh(X)[0] > 0
    assert whitened_kkt_residual(V, res) < kkt
    # the objectives are what they claim
    V_theta = V + res.theta * np.eye(n)
    assert res.objective == pytest.approx(np.trace(np.linalg.solve(X, V_theta)), rel=1e-9)
    assert res.original_objective == pytest.approx(np.trace(np.linalg.solve(X, V)), rel=1e-9)
    # certified gap and weak duality
    assert 0 <= res.relative_gap + 1e-12 and res.relative_gap < 1e-6
    assert res.gap == pytest.approx(res.objective - res.dual_bound, rel=1e-12, abs=1e-12 * res.objective)
    assert res.original_dual_bound <= res.original_objective * (1 + 1e-12)
    assert res.svd_bound == pytest.approx(svd_bound_of(V), rel=1e-9)
    assert res.objective >= res.dual_bound * (1 - 1e-12)
    assert res.dual_bound >= res.svd_bound * (1 - 1e-9)
    # never worse than the identity strategy (X = I, error tr V) or a random feasible X
    assert res.objective <= np.trace(V_theta) * (1 + 1e-12)
    G = np.random.default_rng(n).standard_normal((n, n + 2))
    Xr = G @ G.T
    Xr /= np.sqrt(np.outer(np.diag(Xr), np.diag(Xr)))
    assert res.objective <= np.trace(np.linalg.solve(Xr, V_theta))
    # the strategy is a factor of X with unit columns (L2 sensitivity 1)
    A = res.strategy.dense()
    np.testing.assert_allclose(A.T @ A, X, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(A, axis=0), 1.0, rtol=0, atol=1e-12)
    assert res.strategy.sensitivity(2) == pytest.approx(1.0, rel=1e-12)


# ====================================================================== optimality
@pytest.mark.parametrize("n", [5, 12, 25, 40])
@pytest.mark.parametrize("extra", [3, 0])
def test_random_full_rank(n, extra):
    V = random_gram(n, n + extra, seed=n + extra)
    res = solve_convex(V, tol=TOL)
    assert res.theta == 0.0
    assert res.original_objective == res.objective
    check_optimal(V, res)


@pytest.mark.parametrize("n", [5, 12, 25, 40])
@pytest.mark.parametrize("rank", [1, 2, "half"])
def test_random_rank_deficient(n, rank):
    rank = n // 2 if rank == "half" else rank
    B = np.random.default_rng(100 * n + rank).standard_normal((n, rank))
    V = B @ B.T
    res = solve_convex(V, tol=TOL)
    # the SVD bound (sum of singular values of B)^2 / n, zero eigenvalues and all
    assert res.svd_bound == pytest.approx(np.linalg.svd(B, compute_uv=False).sum() ** 2 / n, rel=1e-12)
    # a singular V is regularised by theta = 1e-8 * tr(V) / n
    assert res.theta == pytest.approx(1e-8 * np.trace(V) / n)
    check_optimal(V, res)
    # regularising costs little: the certified bound for V itself is within 1e-3
    assert res.original_dual_bound <= res.original_objective
    assert res.original_objective - res.original_dual_bound < 1e-3 * res.original_objective


@pytest.mark.parametrize("n", [32, 64, 128])
@pytest.mark.parametrize(
    "workload",
    [hdmm.Prefix, hdmm.AllRange, lambda n: hdmm.WidthKRange(n, 8), lambda n: hdmm.WidthKRange(n, n // 4)],
    ids=["prefix", "allrange", "width8", "width-quarter"],
)
def test_range_workloads(n, workload):
    V = workload(n).gram().dense()
    res = solve_convex(V, tol=TOL)
    check_optimal(V, res)


def test_brute_force_tiny():
    """Minimise tr(X^-1 V) over X = R^T R, R upper triangular with unit columns (its Cholesky factor)."""
    rng = np.random.default_rng(7)
    for n in (3, 4):
        upper = np.triu_indices(n)
        for rank in (n, n - 1):
            V = random_gram(n, rank, seed=10 * n + rank) + (0 if rank == n else 0.05 * np.eye(n))

            def objective(r: np.ndarray) -> float:
                R = np.zeros((n, n))
                R[upper] = r
                R /= np.linalg.norm(R, axis=0)
                return float(np.trace(np.linalg.solve(R.T @ R, V)))

            best = min(
                minimize(objective, rng.standard_normal(len(upper[0])), method="BFGS", options={"gtol": 1e-10}).fun
                for _ in range(8)
            )
            res = solve_convex(V, tol=TOL)
            assert res.objective == pytest.approx(best, rel=1e-6)
            assert res.dual_bound <= best * (1 + 1e-9)


@pytest.mark.parametrize("workload", [hdmm.Prefix, hdmm.AllRange], ids=["prefix", "allrange"])
def test_newton_alone_agrees(workload):
    """Newton from the identity (no fixed-point start) reaches the optimum the default path finds."""
    V = workload(64).gram().dense()
    default = solve_convex(V, tol=TOL)
    newton = solve_convex(V, tol=TOL, X0=np.eye(64))
    assert newton.fixed_point_steps == 0 and newton.iterations > 0
    check_optimal(V, newton)
    assert newton.objective == pytest.approx(default.objective, rel=1e-10)
    np.testing.assert_allclose(newton.X, default.X, rtol=0, atol=1e-4)


def test_one_cell():
    res = solve_convex(np.array([[4.0]]))
    assert res.X.tolist() == [[1.0]]
    assert res.objective == pytest.approx(4.0) and res.dual_bound == pytest.approx(4.0)
    assert res.converged and res.iterations == 0


def test_constant_diagonal_root_is_optimal():
    """When V^(1/2) has a constant diagonal its rescaling attains the SVD bound: no Newton step needed."""
    V = hdmm.AllRange(16).gram().dense()
    circulant = np.fromfunction(lambda i, j: 0.5 ** np.abs(i - j) + 0.5 ** (16 - np.abs(i - j)), (16, 16))
    for W in (np.eye(16) * 3.0, circulant):
        res = solve_convex(W)
        assert res.objective == pytest.approx(res.svd_bound, rel=1e-10)
        assert res.iterations == 0
    assert solve_convex(V).objective > solve_convex(V).svd_bound  # not so for ranges


# ====================================================================== the Newton step
def test_newton_direction_solves_the_model():
    """The Schur/CG direction equals the minimiser of the quadratic model with diag(D) = 0, by brute force."""
    rng = np.random.default_rng(11)
    n = 6
    G = rng.standard_normal((n, n + 1))
    X = G @ G.T
    X /= np.sqrt(np.outer(np.diag(X), np.diag(X)))
    B = rng.standard_normal((n, n))
    V = B @ B.T
    Z = np.linalg.inv(X)
    M = Z @ V @ Z  # minus the gradient
    # the model <G, D> + <D, H[D]> / 2 over symmetric D with zero diagonal, H[D] = Z D M + M D Z
    basis = []
    for i, j in zip(*np.triu_indices(n, 1)):
        E = np.zeros((n, n))
        E[i, j] = E[j, i] = 1.0
        basis.append(E)
    hessian = np.array([[np.sum(Ei * (Z @ Ej @ M + M @ Ej @ Z)) for Ej in basis] for Ei in basis])
    gradient = np.array([-np.sum(M * Ei) for Ei in basis])
    want = sum(c * Ei for c, Ei in zip(np.linalg.solve(hessian, -gradient), basis))
    got = _direction(_Point.at(X, B), eta=1e-10, cg_iter=100)
    np.testing.assert_allclose(got.D, want, rtol=0, atol=1e-9 * np.abs(want).max())
    assert got.decrement == pytest.approx(np.sum(M * want), rel=1e-9)


def test_schur_model_is_spectrally_equivalent():
    """The exponential-sum model of S is within [0.72, 1.27] of it in the quadratic-form sense."""
    rng = np.random.default_rng(5)
    n = 10
    P = rng.standard_normal((n, n))
    for spread in (1.0, 1e4, 1e12):
        v = np.geomspace(1.0 / spread, 1.0, n)
        C = 1.0 / (v[:, None] + v[None, :])
        S = np.einsum("kl,ki,li,kj,lj->ij", C, P, P, P, P)
        ratios = np.linalg.eigvals(np.linalg.solve(_schur_model(P, v), S)).real
        assert 1 / 1.27 <= ratios.min() and ratios.max() <= 1 / 0.72


# ====================================================================== hdmm's error
@pytest.mark.parametrize("W", [hdmm.Prefix(64), hdmm.WidthKRange(64, 8)], ids=["prefix", "width8"])
def test_error_in_hdmm_terms(W):
    privacy = hdmm.ZCDP(0.5)
    res = solve_convex(W.gram().dense())
    unit = privacy.noise_variance(1.0)
    error = float(expected_error(W, res.strategy, privacy))
    assert error == pytest.approx(unit * res.original_objective, rel=1e-8)
    # and it beats the identity strategy, and is at least the SVD bound
    assert error < float(expected_error(W, hdmm.Identity(64), privacy))
    assert error >= float(hdmm.svd_bound(W, privacy)) * (1 - 1e-9)


def test_gaussian_error():
    V = hdmm.Prefix(16).gram().dense()
    res = solve_convex(V)
    assert gaussian_error(V, res.X) == pytest.approx(res.original_objective, rel=1e-10)
    assert gaussian_error(V, np.eye(16)) == pytest.approx(np.trace(V))
    # scale invariant: the sensitivity max_i X_ii is accounted for
    assert gaussian_error(V, 4.0 * res.X) == pytest.approx(res.original_objective, rel=1e-10)
    # a singular strategy that supports the workload, and one that does not
    Vs = hdmm.WidthKRange(16, 4).gram().dense()
    assert math.isfinite(gaussian_error(Vs, Vs))
    assert gaussian_error(V, Vs) == math.inf


def test_dual_bound_helper():
    V = hdmm.AllRange(24).gram().dense()
    res = solve_convex(V)
    assert dual_bound(V, np.ones(24)) == pytest.approx(res.svd_bound, rel=1e-12)
    rng = np.random.default_rng(3)
    for _ in range(5):
        assert dual_bound(V, rng.uniform(0.1, 2.0, 24)) <= res.objective
    # scale free, and zero weights are allowed
    y = rng.uniform(0.1, 2.0, 24)
    assert dual_bound(V, 7.0 * y) == pytest.approx(dual_bound(V, y), rel=1e-12)
    assert dual_bound(V, np.eye(24)[0]) <= res.objective


# ====================================================================== options
def test_explicit_theta_and_warm_start():
    V = hdmm.Prefix(32).gram().dense()
    res = solve_convex(V, theta=0.5, tol=TOL)
    assert res.theta == 0.5
    assert res.original_objective < res.objective
    check_optimal(V, res)
    # a warm start at the solution needs no Newton step
    again = solve_convex(V, theta=0.5, X0=res.X)
    assert again.iterations == 0 and again.fixed_point_steps == 0
    assert again.objective == pytest.approx(res.objective, rel=1e-12)
    # X0 is rescaled to unit diagonal
    cold = solve_convex(V, X0=2.0 * np.eye(32))
    assert cold.converged and cold.iterations > 0


def test_callback_and_matrix_input():
    seen: list[ConvexProgress] = []
    res = solve_convex(hdmm.WidthKRange(32, 4).gram(), callback=seen.append, tol=TOL)
    assert [p.iteration for p in seen] == list(range(1, res.iterations + 1))
    assert all(p.step > 0 and p.decrement > 0 for p in seen)
    final = [p for p in seen if p.dual_bound is not None]
    assert final and all(p.theta == res.theta for p in final)
    assert [p.theta for p in seen] == sorted((p.theta for p in seen), reverse=True)


def test_iteration_limit():
    res = solve_convex(hdmm.Prefix(64).gram().dense(), max_iter=1, tol=1e-14)
    assert res.iterations <= 1
    assert res.dual_bound <= res.objective


# ====================================================================== bad input
@pytest.mark.parametrize(
    "V, match",
    [
        (np.ones((3, 4)), "square"),
        (np.ones(3), "square"),
        (np.zeros((0, 0)), "square"),
        (np.array([[1.0, 2.0], [0.0, 1.0]]), "symmetric"),
        (np.array([[1.0, np.nan], [np.nan, 1.0]]), "NaN"),
        (np.array([[1.0, 2.0], [2.0, 1.0]]), "positive semidefinite"),
        (np.zeros((3, 3)), "zero"),
        ([["a", "b"], ["c", "d"]], "real square"),
    ],
)
def test_bad_gram(V, match):
    with pytest.raises(ValueError, match=match):
        solve_convex(V)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tol": 0.0}, "tol"),
        ({"tol": float("nan")}, "tol"),
        ({"max_iter": 0}, "max_iter"),
        ({"cg_iter": True}, "cg_iter"),
        ({"cg_iter": 2.5}, "cg_iter"),
        ({"theta": -1.0}, "theta"),
        ({"theta": float("inf")}, "theta"),
        ({"X0": np.eye(3)}, "X0"),
        ({"X0": np.array([[1.0, 2.0], [2.0, 1.0]])}, "positive definite"),
        ({"X0": np.array([[1.0, 0.5], [0.0, 1.0]])}, "symmetric"),
        ({"X0": np.array([[0.0, 0.0], [0.0, 1.0]])}, "positive definite"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        solve_convex(np.array([[2.0, 1.0], [1.0, 2.0]]), **kwargs)


def test_singular_needs_theta():
    with pytest.raises(ValueError, match="singular"):
        solve_convex(np.ones((4, 4)), theta=0)
    assert solve_convex(np.ones((4, 4))).converged


def test_bad_helper_input():
    V = np.array([[2.0, 1.0], [1.0, 2.0]])
    with pytest.raises(ValueError, match="y must be"):
        dual_bound(V, np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="y must be"):
        dual_bound(V, np.zeros(2))
    with pytest.raises(ValueError, match="y must be"):
        dual_bound(V, np.ones(3))
    with pytest.raises(ValueError, match="shape"):
        gaussian_error(V, np.eye(3))
    with pytest.raises(ValueError, match="positive semidefinite"):
        gaussian_error(V, np.array([[1.0, 2.0], [2.0, 1.0]]))
