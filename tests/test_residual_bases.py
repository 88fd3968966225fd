"""Residual measurements with per-attribute bases (hdmm.residual_bases) against dense numpy."""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np
import pytest

import hdmm
from hdmm.error import expected_error, per_query_variance
from hdmm.marginals import helmert
from hdmm.matrix import Explicit, Kronecker, Ones, VStack, Weighted
from hdmm.mechanism import least_squares, reconstruction_method
from hdmm.residual_bases import ResidualBases, basis_from_gram
from hdmm.structure import classify

SIZES = (3, 4, 2)


def _random_basis(n: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    B = rng.normal(size=(rows, n))
    return B - B.mean(axis=1, keepdims=True)


def _dense_strategy(sizes, subsets, weights, bases) -> np.ndarray:
    blocks = []
    for T, w in zip(subsets, weights):
        factors = [bases[i] if i in T else np.ones((1, n)) / np.sqrt(n) for i, n in enumerate(sizes)]
        blocks.append(w * reduce(np.kron, factors))
    return np.vstack(blocks)


def _strategy(rng, full_rank=True, subsets=None):
    bases = [_random_basis(n, n - 1 if full_rank else max(n - 2, 1), rng) for n in SIZES]
    if subsets is None:
        subsets = [T for k in range(len(SIZES) + 1) for T in itertools.combinations(range(len(SIZES)), k)]
    weights = rng.uniform(0.5, 2.0, size=len(subsets))
    A = ResidualBases(SIZES, dict(zip(subsets, weights)), bases)
    return A, _dense_strategy(SIZES, subsets, weights, bases)


def test_matvecs_gram_norms_and_sensitivity_against_dense():
    rng = np.random.default_rng(0)
    A, D = _strategy(rng)
    assert A.shape == D.shape
    np.testing.assert_allclose(A.dense(), D, atol=1e-12)
    x, y = rng.normal(size=D.shape[1]), rng.normal(size=D.shape[0])
    np.testing.assert_allclose(A @ x, D @ x, atol=1e-12)
    np.testing.assert_allclose(A.T @ y, D.T @ y, atol=1e-12)
    np.testing.assert_allclose(A.gram().dense(), D.T @ D, atol=1e-11)
    np.testing.assert_allclose(A.column_norm_powers(2).to_array(), np.sum(D**2, axis=0), atol=1e-12)
    assert hdmm.ApproxDP(1.0, 1e-6).noise.sensitivity(A) == pytest.approx(np.sqrt(np.sum(D**2, axis=0).max()))
    assert classify(A).form == "residual"


def test_pseudo_inverse_reconstruction_is_exact():
    rng = np.random.default_rng(1)
    A, D = _strategy(rng)
    y = rng.normal(size=D.shape[0])
    structure = classify(A)
    assert reconstruction_method(A, "auto", structure=structure) == "residual"
    xhat = least_squares(A, y, "residual", structure, noise_std=1.0)
    np.testing.assert_allclose(xhat, np.linalg.pinv(D) @ y, atol=1e-10)
    # a strategy missing subsets, with rank-deficient bases: still the minimum-norm solution
    A, D = _strategy(rng, full_rank=False, subsets=[(), (0,), (1, 2)])
    y = rng.normal(size=D.shape[0])
    xhat = least_squares(A, y, "residual", classify(A), noise_std=1.0)
    np.testing.assert_allclose(xhat, np.linalg.pinv(D) @ y, atol=1e-10)


def _workloads():
    n0, n1, n2 = SIZES
    T = [Ones(1, n) for n in SIZES]
    W = [hdmm.Prefix(n0), hdmm.AllRange(n1), hdmm.Identity(n2)]
    terms = []
    for k in range(4):
        for S in itertools.combinations(range(3), k):
            terms.append(Kronecker([W[i] if i in S else T[i] for i in range(3)]))
    yield VStack(terms)
    yield Kronecker(W)
    # other query matrices than the strategy was built for, weighted terms
    yield VStack([Weighted(Kronecker([hdmm.Identity(n0), T[1], hdmm.Prefix(n2)]), 2.0),
                  Kronecker([hdmm.Total(n0), hdmm.Prefix(n1), hdmm.Identity(n2)])])


@pytest.mark.parametrize("k", range(3))
def test_expected_error_and_variances_against_dense(k):
    rng = np.random.default_rng(2 + k)
    A, D = _strategy(rng)
    W = list(_workloads())[k]
    privacy = hdmm.ZCDP(0.5)
    dense_A = Explicit(D)
    exact = expected_error(W, A, privacy)
    assert exact.structure.form == "residual"
    assert float(exact) == pytest.approx(float(expected_error(W, dense_A, privacy)), rel=1e-9)
    Xp = np.linalg.pinv(D.T @ D)
    Wd = W.dense()
    var = privacy.noise_variance(np.sqrt(np.sum(D**2, axis=0).max()))
    assert float(exact) == pytest.approx(var * np.trace(Xp @ Wd.T @ Wd), rel=1e-6)
    np.testing.assert_allclose(per_query_variance(W, A, privacy), var * np.einsum("ij,jk,ik->i", Wd, Xp, Wd),
                               rtol=1e-6, atol=1e-12)


def test_unsupported_workloads_are_infinite_both_ways():
    rng = np.random.default_rng(7)
    privacy = hdmm.ZCDP(0.5)
    # rank-deficient bases: the identity is not answered
    A, D = _strategy(rng, full_rank=False)
    W = hdmm.Identity(int(np.prod(SIZES)))
    W = Kronecker([hdmm.Identity(n) for n in SIZES])
    assert np.isinf(expected_error(W, A, privacy))
    assert np.isinf(expected_error(W, Explicit(D), privacy))
    # a missing subset: the marginal on attribute 0 is not answered, the total is
    A, D = _strategy(rng, subsets=[(), (1,), (2,), (1, 2)])
    W = VStack([Kronecker([hdmm.Identity(SIZES[0]), Ones(1, SIZES[1]), Ones(1, SIZES[2])]),
                Kronecker([Ones(1, n) for n in SIZES])])
    v = per_query_variance(W, A, privacy)
    dense = per_query_variance(W, Explicit(D), privacy)
    np.testing.assert_array_equal(np.isinf(v), np.isinf(dense))
    assert np.isinf(v[:SIZES[0]]).all() and np.isfinite(v[-1])
    np.testing.assert_allclose(v[-1], dense[-1], rtol=1e-9)


def test_helmert_bases_are_the_marginals_form_and_bad_bases_are_refused():
    A = ResidualBases((3, 4), {(): 1.0, (0, 1): 2.0}, [helmert(3), None])
    assert classify(A).form == "marginals"
    with pytest.raises(ValueError, match="sum to zero"):
        ResidualBases((3, 4), {(0,): 1.0}, [np.eye(3), None])
    with pytest.raises(ValueError, match="one basis per attribute"):
        ResidualBases((3, 4), {(0,): 1.0}, [None])


def test_basis_from_gram():
    Q = np.eye(5) - 1 / 5
    X = Q @ hdmm.Prefix(5).gram().dense() @ Q
    B = basis_from_gram(X)
    assert B.shape == (4, 5)
    np.testing.assert_allclose(B.T @ B, X, atol=1e-12)
    np.testing.assert_allclose(B.sum(axis=1), 0, atol=1e-13)


# ====================================================================== the optimizer
def test_attribute_basis_solver_reproduces_helmert_on_the_identity():
    from hdmm.optimizers.residual_bases import attribute_basis

    for n in (3, 10, 40):
        solved = attribute_basis(np.eye(n), closed_form=False)
        assert solved.error == pytest.approx((n - 1) ** 2 / n, rel=1e-7)
        assert solved.relative_gap <= 1e-6
        closed = attribute_basis(np.eye(n))
        assert closed.error == pytest.approx((n - 1) ** 2 / n, rel=1e-12)


@pytest.mark.parametrize("n", [5, 30])
def test_attribute_basis_on_prefix_is_certified_and_beats_helmert(n):
    from hdmm.optimizers.residual_bases import attribute_basis

    G = hdmm.Prefix(n).gram().dense()
    solved = attribute_basis(G)
    B = solved.basis
    np.testing.assert_allclose(B.sum(axis=1), 0, atol=1e-12)
    X = B.T @ B
    assert np.max(np.diag(X)) == pytest.approx(1.0, rel=1e-9)
    assert np.trace(np.linalg.pinv(X, hermitian=True) @ G) == pytest.approx(solved.error, rel=1e-7)
    assert 0 <= solved.relative_gap <= 1e-6
    Q = np.eye(n) - 1 / n
    assert solved.error < np.trace(Q @ G) * (1 - 1 / n)  # Helmert's e * m


def _prefix_marginals(sizes, prefix, k):
    terms = []
    for size in range(k + 1):
        for S in itertools.combinations(range(len(sizes)), size):
            terms.append(Kronecker([(hdmm.Prefix(n) if i in prefix else hdmm.Identity(n)) if i in S else Ones(1, n)
                                    for i, n in enumerate(sizes)]))
    return VStack(terms)


def test_residual_bases_strategy_error_is_exact_and_beats_residual():
    from hdmm.optimizers.marginals import residual_strategy
    from hdmm.optimizers.residual_bases import residual_bases_strategy

    W = _prefix_marginals((6, 5, 3), {0, 1}, 2)
    A, error, solved = residual_bases_strategy(W)
    privacy = hdmm.ZCDP(0.5)
    unit = privacy.noise_variance(1.0)
    assert hdmm.ApproxDP(1.0, 1e-6).noise.sensitivity(A) == pytest.approx(1.0, rel=1e-9)
    exact = float(expected_error(W, A, privacy))
    assert exact == pytest.approx(unit * error, rel=1e-9)
    assert exact == pytest.approx(float(expected_error(W, Explicit(A.dense()), privacy)), rel=1e-8)
    assert error < residual_strategy(W)[1]
    assert solved[2] is not None and solved[2].error == pytest.approx(4 / 3)


def test_residual_bases_does_not_apply_with_two_query_matrices_per_attribute():
    from hdmm.optimizers.residual_bases import residual_bases_applies, residual_bases_strategy
    from hdmm.kron_union import kron_union

    W = VStack([Kronecker([hdmm.Prefix(4), Ones(1, 3)]), Kronecker([hdmm.Identity(4), hdmm.Prefix(3)])])
    assert not residual_bases_applies(kron_union(W))
    with pytest.raises(ValueError, match="one query matrix"):
        residual_bases_strategy(W)


def test_optimize_runs_residual_bases_and_keeps_the_best():
    from hdmm.optimizers import optimize

    W = _prefix_marginals((8, 6, 3), {0, 1}, 2)
    result = optimize(W, hdmm.ZCDP(0.5), seed=0, optimizers=["residual", "residual_bases", "opt_kron"])
    rows = result.report.set_index("optimizer")
    assert "residual_bases" in rows.index
    col = [c for c in rows.columns if "error" in c][0]
    assert rows.loc["residual_bases", col] < rows.loc["residual", col]
    assert float(result.error) == pytest.approx(float(rows[col].min()), rel=1e-12)


def test_save_load_and_plan_round_trip(tmp_path):
    from hdmm.io import load_strategy, save_strategy
    from hdmm.planning import Plan

    rng = np.random.default_rng(11)
    A, D = _strategy(rng)
    A = ResidualBases.from_members(A.domain, A.members, A.weights, [A.bases[0], None, A.bases[2]])
    save_strategy(A, tmp_path / "s.npz")
    B, _ = load_strategy(tmp_path / "s.npz")
    assert isinstance(B, ResidualBases)
    np.testing.assert_array_equal(B.dense(), A.dense())
    W = list(_workloads())[0]
    privacy = hdmm.ZCDP(0.5)
    p = hdmm.plan(W, A, privacy)
    assert p.structure.form == "residual" and p.method == "residual"
    np.testing.assert_allclose(p.variances, per_query_variance(W, Explicit(A.dense()), privacy), rtol=1e-8)
    p.save(tmp_path / "p.hdmm")
    q = Plan.load(tmp_path / "p.hdmm")
    assert q.structure.form == "residual" and q.method == "residual"


def test_attribute_basis_on_a_low_rank_query_matrix_is_certified():
    from hdmm.optimizers.residual_bases import attribute_basis
    from hdmm.workload import Ranges

    G = Ranges(20, [(0, 7), (5, 12)]).gram().dense()
    solved = attribute_basis(G)
    X = solved.basis.T @ solved.basis
    np.testing.assert_allclose(X.sum(axis=1), 0, atol=1e-10)
    assert np.trace(np.linalg.pinv(X, hermitian=True) @ G) * X.diagonal().max() == pytest.approx(solved.error, rel=1e-7)
    assert 0 <= solved.relative_gap <= 1e-2  # a Q G Q of rank 2: a few 1e-4 (module docstring)


def test_optimize_skips_residual_bases_on_a_large_attribute():
    from hdmm.optimizers.registry import REGISTRY, Problem

    dom = hdmm.Domain(["a", "b"], [600, 3])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(600)}), hdmm.product(dom, {"b": hdmm.Prefix(3)})])
    problem = Problem(W, hdmm.ZCDP(0.5))
    assert REGISTRY["residual_bases"].applies(problem)
    assert "600 values" in REGISTRY["residual_bases"].skip(problem)


def test_optimize_skips_residual_bases_on_one_product_where_opt_kron_is_at_least_as_good():
    from hdmm.optimizers.registry import REGISTRY, Problem

    for factors in ([hdmm.Prefix(6), hdmm.AllRange(5)], [hdmm.Prefix(4), hdmm.Identity(3), hdmm.Prefix(5)]):
        W = Kronecker(factors)
        problem = Problem(W, hdmm.ZCDP(0.5))
        assert REGISTRY["residual_bases"].applies(problem)
        assert "one Kronecker product" in REGISTRY["residual_bases"].skip(problem)
        both = hdmm.optimize(W, hdmm.ZCDP(0.5), seed=0, optimizers=["opt_kron", "residual_bases"])
        values = dict(zip(both.report["optimizer"], both.report["rmse"]))
        assert values["opt_kron"] <= values["residual_bases"] * (1 + 1e-6)


def test_a_union_built_term_by_term_has_the_residual_form():
    rng = np.random.default_rng(5)
    B0, B1 = _random_basis(3, 2, rng), _random_basis(4, 3, rng)
    # each term its own copy of the bases (equal Grams), one term with the bases rotated
    rotation = np.linalg.qr(rng.normal(size=(2, 2)))[0]
    A = VStack([Kronecker([Explicit(B0.copy()), Ones(1, 4)]), Kronecker([Explicit(rotation @ B0), Explicit(B1.copy())]),
                Weighted(Kronecker([Ones(2, 3), Explicit(B1.copy())]), 0.5), Kronecker([Ones(1, 3), Ones(1, 4)])])
    assert classify(A).form == "residual"
    W = VStack([Kronecker([hdmm.Prefix(3), hdmm.Prefix(4)]), Kronecker([Ones(1, 3), hdmm.Identity(4)])])
    privacy = hdmm.ZCDP(0.5)
    D = Explicit(A.dense())
    assert float(expected_error(W, A, privacy)) == pytest.approx(float(expected_error(W, D, privacy)), rel=1e-9)
    np.testing.assert_allclose(per_query_variance(W, A, privacy), per_query_variance(W, D, privacy), rtol=1e-8)
    y = rng.normal(size=A.shape[0])
    np.testing.assert_allclose(least_squares(A, y, "residual", classify(A), noise_std=1.0),
                               np.linalg.pinv(A.dense()) @ y, atol=1e-10)


@pytest.mark.parametrize("p", [1, 2])
def test_sensitivity_is_the_largest_dense_column_norm(p):
    rng = np.random.default_rng(13)
    A, D = _strategy(rng, subsets=[(), (0,), (1, 2), (0, 1, 2)])
    assert A.sensitivity(p) == pytest.approx(np.max(np.sum(np.abs(D) ** p, axis=0)) ** (1 / p), rel=1e-12)
    assert A.sensitivity(p) == pytest.approx(float(A.column_norm_powers(p).max()) ** (1 / p), rel=1e-12)
