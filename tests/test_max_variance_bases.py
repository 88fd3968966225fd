"""The max-variance allocation over fixed residual bases (hdmm.optimizers.max_variance_bases) against dense numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import hdmm
from hdmm.marginals import AllMarginals, helmert
from hdmm.matrix import Matrix
from hdmm.optimizers.max_variance import max_variance_residual
from hdmm.optimizers.max_variance_bases import max_variance_bases, pareto_front
from hdmm.residual_bases import ResidualBases

GAUSS = hdmm.ZCDP(0.5)  # unit noise variance per unit squared L2 sensitivity


def _dense_variances(W: Matrix, A: Matrix) -> tuple[np.ndarray, float]:
    """Every query's unit-noise variance times the squared L2 sensitivity, and the sensitivity, densely."""
    Wd, Ad = W.dense(), A.dense()
    sensitivity = float(np.sqrt((Ad**2).sum(axis=0)).max())
    Ap = np.linalg.pinv(Ad)
    assert np.allclose(Wd @ Ap @ Ad, Wd, atol=1e-8)  # the strategy answers the workload
    return sensitivity**2 * np.sum((Wd @ Ap) ** 2, axis=1), sensitivity


def _mixed(seed: int = 0, weights: bool = False):
    """Prefix, AllRange and Identity marginals (with a total) on a small domain."""
    dom = hdmm.Domain(["a", "b", "c"], [5, 4, 3])
    blocks = {"a": hdmm.Prefix(5), "b": hdmm.Identity(4), "c": hdmm.AllRange(3)}
    parts = [hdmm.product(dom, {x: blocks[x] for x in A}) for k in range(3) for A in itertools.combinations("abc", k)]
    w = np.random.default_rng(seed).uniform(0.5, 2.0, len(parts)) if weights else None
    return hdmm.union(parts, weights=w)


def test_pareto_front_against_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(20):
        e, p = rng.integers(0, 5, 30).astype(float), rng.integers(0, 5, 30).astype(float)
        fe, fp = pareto_front(e, p)
        pairs = set(zip(e, p))
        brute = {(a, b) for a, b in pairs if not any(c >= a and d >= b and (c, d) != (a, b) for c, d in pairs)}
        assert set(zip(fe, fp)) == brute and len(fe) == len(brute)


@pytest.mark.parametrize("weights", [False, True])
def test_largest_variance_and_sensitivity_match_dense_numpy(weights):
    W = _mixed(1, weights)
    solution = max_variance_bases(W)
    dense, sensitivity = _dense_variances(W, solution.strategy)
    assert sensitivity == pytest.approx(1.0, rel=1e-9)
    assert solution.value == pytest.approx(dense.max(), rel=1e-9)
    assert solution.checked == pytest.approx(dense.max(), rel=1e-9)
    assert float(hdmm.error.per_query_variance(W, solution.strategy, GAUSS).max()) == pytest.approx(dense.max(), rel=1e-9)
    assert solution.dual_bound <= solution.value and solution.gap < 1e-6
    assert solution.rows < W.shape[0]  # dominated queries dropped


def test_dual_bound_is_below_every_allocation_over_the_same_bases():
    W = _mixed(2, True)
    solution = max_variance_bases(W)
    strategy = solution.strategy
    rng = np.random.default_rng(3)
    for _ in range(10):
        kappa = strategy.weights**2 * rng.uniform(0.2, 5.0, strategy.weights.size)
        other = ResidualBases.from_members(strategy.domain, strategy.members, np.sqrt(kappa), strategy.bases)
        dense, _ = _dense_variances(W, other)
        assert dense.max() >= solution.dual_bound * (1 - 1e-12)
        assert dense.max() >= solution.value * (1 - 1e-6)


def test_marginal_workloads_give_the_certified_helmert_optimum():
    W = AllMarginals((3, 4, 5), 2)
    solution = max_variance_bases(W)
    helmert_solution = max_variance_residual(W)
    assert solution.value == pytest.approx(helmert_solution.value, rel=1e-7)
    dense, sensitivity = _dense_variances(W, solution.strategy)
    assert dense.max() == pytest.approx(solution.value, rel=1e-9) and sensitivity == pytest.approx(1.0)


def test_given_bases_and_refusals():
    W = _mixed()
    bases = [helmert(n) for n in (5, 4, 3)]
    solution = max_variance_bases(W, bases=bases)
    dense, _ = _dense_variances(W, solution.strategy)
    assert solution.value == pytest.approx(dense.max(), rel=1e-9)
    with pytest.raises(ValueError, match="sum to zero"):
        max_variance_bases(W, bases=[np.eye(5), helmert(4), helmert(3)])
    two = hdmm.union([hdmm.Prefix(5), hdmm.Identity(5)])
    with pytest.raises(ValueError, match="one query matrix"):
        max_variance_bases(two)
    narrow = [helmert(5)[:2], helmert(4), helmert(3)]  # spans too little of attribute a
    with pytest.raises(ValueError, match="outside the span"):
        max_variance_bases(W, bases=narrow)


def test_basis_improvement_never_raises_the_largest_variance_and_stays_certified():
    W = _mixed(4, True)
    plain = max_variance_bases(W)
    improved = max_variance_bases(W, improve=3)
    assert improved.value <= plain.value
    dense, sensitivity = _dense_variances(W, improved.strategy)
    assert sensitivity == pytest.approx(1.0, rel=1e-9)
    assert improved.value == pytest.approx(dense.max(), rel=1e-9)
    assert improved.dual_bound <= improved.value and improved.gap < 1e-6


@pytest.mark.parametrize("updates", [0, 50, 2000])
def test_solve_allocation_by_the_barrier_matches_a_general_convex_solver(monkeypatch, updates):
    import scipy.sparse as sp
    from scipy.optimize import minimize

    import hdmm.optimizers.max_variance as mv
    monkeypatch.setattr(mv, "MULTIPLICATIVE_ITERATIONS", updates)  # 0: the barrier method alone
    rng = np.random.default_rng(updates)
    A = rng.random((12, 5)) * (rng.random((12, 5)) < 0.6)
    A[np.arange(5), np.arange(5)] += 0.5  # every subset in some row
    A[A.sum(axis=1) == 0, 0] = 1.0
    t = rng.uniform(0.5, 2.0, 5)
    x, y, _, _ = mv.solve_allocation(sp.csr_array(A), t)
    value = float((A @ x).max() * np.sum(t / x))
    bound = float(np.sum(np.sqrt(t * (A.T @ y))) ** 2)
    assert y.min() >= 0 and y.sum() == pytest.approx(1.0)
    assert bound <= value and value - bound < 1e-8 * value
    # min over x of sum t/x subject to A x <= 1, by SLSQP in log x
    found = minimize(lambda z: np.sum(t * np.exp(-z)), np.zeros(5), method="SLSQP",
                     constraints=[{"type": "ineq", "fun": lambda z: 1.0 - A @ np.exp(z)}],
                     options={"maxiter": 1000, "ftol": 1e-14})
    assert value == pytest.approx(found.fun, rel=1e-6)


def test_too_large_programs_are_refused(monkeypatch):
    import hdmm.optimizers.max_variance_bases as M
    monkeypatch.setattr(M, "MAX_ENTRIES", 10)
    with pytest.raises(ValueError, match="more than 10 entries"):
        max_variance_bases(_mixed())
