"""Exact variances of union strategies whose factor Grams diagonalise together, against dense numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import hdmm
from hdmm.error import exact_route, expected_error, per_query_variance, unit_query_variances
from hdmm.kron_union import kron_union
from hdmm.optimizers import opt_union
from hdmm.matrix import Explicit, Identity, Kronecker, Ones, VStack, Weighted
from hdmm.structure import classify
from hdmm.traces import SUPPORT_TOL
from hdmm.union_gram import joint_diagonal


def dense_unit_variances(W, A):
    """diag(W (A^TA)^+ W^T) from numpy's pseudo-inverse, inf where a query is outside A's row space."""
    Ad, Wd = np.asarray(A.dense()), np.asarray(W.dense())
    X = Ad.T @ Ad
    Xp = np.linalg.pinv(X, rcond=1e-10, hermitian=True)
    variances = np.einsum("ij,jk,ik->i", Wd, Xp, Wd)
    residual = np.einsum("ij,ij->i", Wd - Wd @ Xp @ X, Wd - Wd @ Xp @ X)
    return np.where(residual > SUPPORT_TOL * np.einsum("ij,ij->i", Wd, Wd), np.inf, variances)


def check(W, A, *, diagonalises=True):
    structure = classify(A)
    assert structure.form == "general"
    assert (joint_diagonal(structure.union) is not None) == diagonalises
    assert exact_route(W, A) == ("union" if diagonalises else "dense")
    got, want = unit_query_variances(W, A, structure), dense_unit_variances(W, A)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-8, atol=1e-12 * want[finite].max())
    if finite.all():
        privacy = hdmm.ZCDP(0.5)
        sens = privacy.noise.sensitivity(A)
        np.testing.assert_allclose(float(expected_error(W, A, privacy)), privacy.noise_variance(sens) * want.sum(),
                                   rtol=1e-8)
        np.testing.assert_allclose(per_query_variance(W, A, privacy), privacy.noise_variance(sens) * want, rtol=1e-8)
    else:
        assert not expected_error(W, A, hdmm.ZCDP(0.5)).supported


def readme_like(sizes=(2, 9, 4)):
    dom = hdmm.Domain(["sex", "age", "income"], list(sizes))
    return hdmm.union([hdmm.product(dom, {"sex": hdmm.Identity(sizes[0]), "age": hdmm.AllRange(sizes[1])}),
                       hdmm.DimKMarginals(dom, 2)], weights=[1.0, 0.5])


@pytest.mark.parametrize("privacy", [hdmm.PureDP(1.0), hdmm.ZCDP(0.5)])
def test_opt_union_strategy_of_a_readme_like_workload(privacy):
    W = readme_like((2, 20, 5))
    A = opt_union(W, privacy, groups=[[0], [1, 2, 3]], seed=0)
    check(W, A)


def test_prefix_marginals_under_opt_union():
    sizes = [5, 4, 3, 2]
    dom = hdmm.Domain(list("abcd"), sizes)
    parts = [hdmm.product(dom, {"abcd"[i]: (hdmm.Prefix(sizes[i]) if i < 2 else hdmm.Identity(sizes[i])) for i in S})
             for k in range(3) for S in itertools.combinations(range(4), k)]
    W = hdmm.union(parts)
    A = opt_union(W, hdmm.ZCDP(0.5), groups=[[j] for j in range(kron_union(W).num_terms)], seed=1)
    check(W, A)


def _random_explicit(rows, n, rank, seed):
    rng = np.random.default_rng(seed)
    return Explicit(rng.normal(size=(rows, rank)) @ rng.normal(size=(rank, n)))


def test_singular_factors_and_unsupported_queries():
    # group 1 misses the directions outside a rank-2 factor; group 2 measures only totals on attribute 0
    F0, F1 = _random_explicit(3, 4, 2, 0), _random_explicit(2, 3, 2, 1)
    A = VStack([Kronecker([F0, Identity(3)]), Weighted(Kronecker([Ones(1, 4), F1]), 0.5)])
    W = VStack([Kronecker([Identity(4), Ones(1, 3)]),          # not supported
                Kronecker([Ones(1, 4), Identity(3)]),          # in part
                Kronecker([Ones(1, 4), F1]),                   # by group 2
                Kronecker([Explicit(F0.dense()[:2] + 0.5 * F0.dense()[2]), Identity(3)])])  # by group 1
    want = dense_unit_variances(W, A)
    assert np.isinf(want).any() and np.isfinite(want).any()
    check(W, A)


def test_three_commuting_grams_on_an_attribute():
    n = 5
    aIbJ = Explicit(np.linalg.cholesky(2 * np.eye(n) + np.ones((n, n))).T)
    A = VStack([Kronecker([Identity(n), Explicit(np.tril(np.ones((3, 3))))]),
                Kronecker([Ones(1, n), Identity(3)]),
                Weighted(Kronecker([aIbJ, Explicit(np.tril(np.ones((3, 3))))]), 0.3)])
    W = VStack([Kronecker([hdmm.Prefix(n), Identity(3)]), Kronecker([Ones(1, n), hdmm.Prefix(3)])])
    check(W, A)


def test_grams_that_do_not_diagonalise_together_fall_back_to_dense():
    A = VStack([Kronecker([_random_explicit(4, 4, 4, s), Identity(2)]) for s in range(2)]
               + [Kronecker([_random_explicit(4, 4, 4, 7), Ones(1, 2)])])
    W = Kronecker([hdmm.Prefix(4), Identity(2)])
    check(W, A, diagonalises=False)


def test_a_workload_split_finer_than_the_strategy():
    # the strategy's first factor spans two workload attributes: the unions are lined up first
    A = VStack([Kronecker([Identity(6), Ones(1, 2)]), Kronecker([Explicit(np.tril(np.ones((6, 6)))), Identity(2)])])
    W = VStack([Kronecker([Identity(2), Ones(1, 3), Identity(2)]), Kronecker([Ones(1, 2), hdmm.Prefix(3), Ones(1, 2)])])
    check(W, A)


def test_a_plan_of_a_union_strategy_is_exact_and_loads_with_progress(tmp_path):
    W = readme_like((2, 20, 5))
    A = opt_union(W, hdmm.PureDP(1.0), groups=[[0], [1, 2, 3]], seed=0)
    assert classify(A).form == "general"
    plan = hdmm.plan(W, A, hdmm.PureDP(1.0))
    assert plan.variance_exact
    queries = hdmm.workload.unweighted(W)[0]
    want = dense_unit_variances(queries, plan.strategy) * plan.privacy.noise_variance(plan.sensitivity)
    np.testing.assert_allclose(plan.variances, want, rtol=1e-8)
    plan.save(tmp_path / "plan.npz")
    lines = []
    loaded = hdmm.planning.Plan.load(tmp_path / "plan.npz", progress=lines.append)
    np.testing.assert_array_equal(loaded.variances, plan.variances)
    assert any("variances" in line for line in lines) and any("checksum" in line for line in lines)
    with pytest.raises(TypeError, match="progress"):
        hdmm.planning.Plan.load(tmp_path / "plan.npz", progress="yes")


def _random_factor(rng, n):
    kind = rng.integers(0, 5)
    if kind == 0:
        return Identity(n)
    if kind == 1:
        return Ones(1, n)
    if kind == 4:
        return hdmm.Prefix(n)
    return Explicit(rng.normal(size=(n + 1 if kind == 2 else max(1, n - 1), n)))  # full or deficient rank


def _random_union(rng, sizes: list[int]) -> VStack:
    """A weighted union of 2-3 Kronecker products drawing from 1-3 random factors per attribute."""
    pools = [[_random_factor(rng, n) for _ in range(rng.integers(1, 4))] for n in sizes]
    return VStack([Weighted(Kronecker([pool[rng.integers(len(pool))] for pool in pools]), float(rng.uniform(0.3, 2)))
                   for _ in range(rng.integers(2, 4))])


@pytest.mark.parametrize("seed", range(40))
def test_random_unions_against_dense(seed):
    """Unions of 2-3 Kronecker products drawing from 1-3 factors per attribute, some singular."""
    rng = np.random.default_rng(seed)
    sizes = [3, 4, 2]
    A = _random_union(rng, sizes)
    W = VStack([Kronecker([_random_factor(rng, n) for n in sizes]) for _ in range(3)])
    structure = classify(A)
    if structure.form != "general":
        pytest.skip("the draw is not a general union")
    got, want = unit_query_variances(W, A, structure), dense_unit_variances(W, A)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-7)


def test_the_union_route_is_taken_only_where_every_grid_fits(monkeypatch):
    import hdmm.union_gram as union_gram

    W = readme_like((2, 20, 5))
    A = opt_union(W, hdmm.ZCDP(0.5), groups=[[0], [1, 2, 3]], seed=0)
    assert union_gram.union_route(W, classify(A).union) and exact_route(W, A) == "union"
    monkeypatch.setattr(union_gram, "GRID_LIMIT", 1)  # every term's grid now too large: no exact route but dense
    assert not union_gram.union_route(W, classify(A).union) and exact_route(W, A) == "dense"
    assert not union_gram.union_route(W, None)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("limit", [None, 0])
def test_delta_grids_against_a_sum_of_outer_products(seed, limit, monkeypatch):
    """delta on random grids (single points, repeats, all columns) equals the sum over strategy terms of their
    weighted outer products, by one matrix product and (limit 0) by the loop of outer products."""
    import hdmm.union_gram as union_gram

    if limit is not None:
        monkeypatch.setattr(union_gram, "CP_FACTORS_LIMIT", limit)
    rng = np.random.default_rng(seed)
    sizes = [3, 4, 2, 5]
    pools = [[_random_factor(rng, n) for _ in range(rng.integers(1, 3))] for n in sizes]
    A = VStack([Weighted(Kronecker([pool[rng.integers(len(pool))] for pool in pools]), float(rng.uniform(0.3, 2)))
                for _ in range(rng.integers(2, 7))])
    union = kron_union(A)
    diagonal = joint_diagonal(union)
    if diagonal is None:
        pytest.skip("the draw does not diagonalise together")
    for _ in range(4):
        cols = [np.sort(rng.choice(n, size=rng.integers(1, n + 1), replace=False)) for n in sizes]
        want = np.zeros(tuple(len(c) for c in cols))
        for j in range(union.num_terms):
            part = np.array(union.weights[j] ** 2)
            for i, c in enumerate(cols):
                part = np.multiply.outer(part, diagonal.diagonals[i][union.index[j, i]][c])
            want += part
        got = diagonal.delta(cols)
        kept = got != 0
        np.testing.assert_allclose(got[kept], want[kept], rtol=1e-12)
        assert np.all(want[~kept] <= 1e-9 * np.abs(want).max())


def test_union_totals_equal_the_grids_sums_and_the_kept_sums_are_bounded(monkeypatch):
    import hdmm.union_gram as union_gram

    W = readme_like((2, 20, 5))
    A = opt_union(W, hdmm.ZCDP(0.5), groups=[[0], [1, 2, 3]], seed=0)
    a_union = classify(A).union
    want = [grid.total() for grid in union_gram.union_terms(W, a_union)]
    monkeypatch.setattr(union_gram, "TOTALS_KEPT", 2)
    for _ in range(2):  # the second time from what is kept, however little
        values, supported = union_gram.union_totals(W, a_union)
        assert [(float(v), bool(s)) for v, s in zip(values, supported)] == want
        assert len(union_gram.cached_joint_diagonal(a_union)._totals) <= 2


@pytest.mark.parametrize("seed", range(30))
def test_partial_totals_are_below_the_dense_error(seed):
    """On random small unions, every term's sum equals numpy's, and a sum stopped early is below the whole."""
    import hdmm.union_gram as union_gram

    rng = np.random.default_rng(seed)
    sizes = [3, 4, 2]
    A = _random_union(rng, sizes)
    terms = [Kronecker([_random_factor(rng, n) for n in sizes]) for _ in range(4)]
    W = VStack(terms)
    structure = classify(A)
    if structure.form != "general" or not union_gram.union_route(W, structure.union):
        pytest.skip("the draw has no union route")
    dense = dense_unit_variances(W, A)
    edges = np.cumsum([0] + [t.shape[0] for t in terms])
    want = np.array([dense[a:b].sum() for a, b in zip(edges[:-1], edges[1:])])
    values, supported = union_gram.union_totals(W, structure.union)
    np.testing.assert_array_equal(~supported, np.isinf(want))
    np.testing.assert_allclose(values[supported], want[supported], rtol=1e-7)
    fresh = hdmm.kron_union.KronUnion(structure.union.factors, structure.union.index, structure.union.weights)
    for stop in (0.0, 0.3, 0.9):  # of the supported terms' sum (the whole is infinite when one is not)
        part, ok = union_gram.union_totals(W, fresh, stop_above=stop * want[np.isfinite(want)].sum())
        done = ~np.isnan(part)
        partial = np.inf if not ok[done].all() else part[done].sum()
        assert partial <= want.sum() * (1 + 1e-7)
