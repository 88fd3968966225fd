"""Geography plans with a person strategy per level, estimated top down (hdmm.georelease.plan)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize as so
import scipy.sparse as sp

import hdmm
from hdmm.geography import GeographyError
from hdmm.georelease import ArrayHistograms, geo_plan, release_geography
from hdmm.georelease.nonneg import nonnegative_estimates
from hdmm.matrix import Explicit, Ones, VStack
from trees import small_country

W = hdmm.Identity(3)
STRATEGIES = {"nation": hdmm.Identity(3), "state": hdmm.Prefix(3), "county": VStack([hdmm.Identity(3), Ones(1, 3)]),
              "tract": Explicit(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.5]]))}
SHARES = {"nation": 1.0, "state": 1.0, "county": 2.0, "tract": 4.0}


def country():
    return small_country(3, counties=(1, 3), tracts=(1, 4))


def per_level_plan(tree, privacy=hdmm.ZCDP(0.5), **options):
    return geo_plan(tree, W, privacy, strategy=STRATEGIES, level_weights=SHARES, **options)


def histograms(tree, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 12, size=(tree.sizes[-1], 3)).astype(float)


def _exact_sensitivity(plan, strategies, p):
    """max_j (sum_l w_l^p ||A_l e_j||_p^p)^(1/p) from the dense strategies: one person in cell j at every level."""
    total = sum(plan.level_weights[d] ** p * np.sum(np.abs(np.asarray(strategies[name].dense())) ** p, axis=0)
                for d, name in enumerate(plan.tree.levels))
    return float(total.max() ** (1.0 / p))


@pytest.mark.parametrize("privacy, p", [(hdmm.PureDP(1.0), 1), (hdmm.ZCDP(0.5), 2)])
def test_sensitivity_is_the_worst_cell_over_all_levels(privacy, p):
    flipped = {**STRATEGIES, "state": Explicit(np.asarray(hdmm.Prefix(3).dense())[:, ::-1])}  # worst cell: the last
    for strategies in (STRATEGIES, flipped):
        plan = geo_plan(country(), W, privacy, strategy=strategies, level_weights=SHARES)
        exact = _exact_sensitivity(plan, strategies, p)
        assert exact <= plan.sensitivity <= exact * (1 + 1e-6)  # the margin and the noise grid's rounding only
    bound = float(np.sum(plan.level_weights**p * np.array([flipped[n].sensitivity(p) for n in plan.tree.levels])**p)
                  ** (1.0 / p))
    assert exact < bound  # the worst columns differ by level: the exact maximum is smaller than the bound


def test_each_unit_measures_its_levels_strategy():
    plan = per_level_plan(country(), hdmm.PureDP(1.0))
    for d, name in enumerate(plan.tree.levels):
        dense = np.asarray(plan.unit_plan(d).strategy.dense())
        np.testing.assert_allclose(dense, plan.level_weights[d] * np.asarray(STRATEGIES[name].dense()))
    assert plan.per_level and not plan.variance_exact


def test_variances_are_each_levels_own():
    plan = per_level_plan(country())
    for d, name in enumerate(plan.tree.levels):
        A = np.asarray(STRATEGIES[name].dense())
        own = np.diag(np.linalg.pinv(A.T @ A)) * plan.noise_variance / plan.level_weights[d] ** 2
        V = plan.variances(d)
        assert V.shape == (plan.tree.sizes[d], 3)
        np.testing.assert_allclose(V, np.tile(own, (plan.tree.sizes[d], 1)), rtol=1e-9)
        assert plan.expected_rmse(d) == pytest.approx(np.sqrt(own.mean()))


def _family(A, Xhat, parent):
    """Brute force: min sum_i ||A (x_i - xhat_i)||^2 over x_i >= 0 with sum_i x_i = parent."""
    k, n = Xhat.shape
    G = A.T @ A

    def f(v):
        D = v.reshape(k, n) - Xhat
        return float(np.einsum("ij,jk,ik->", D, G, D)), (2 * D @ G).ravel()

    cons = {"type": "eq", "fun": lambda v: v.reshape(k, n).sum(axis=0) - parent,
            "jac": lambda v: np.tile(np.eye(n), (1, k))}
    start = np.tile(parent / k, k)
    out = so.minimize(f, start, jac=True, bounds=[(0, None)] * (k * n), constraints=[cons], method="SLSQP",
                      options={"ftol": 1e-14, "maxiter": 1000})
    return out.x.reshape(k, n)


def test_top_down_projects_each_family_through_its_levels_strategy():
    tree = country()
    plan = per_level_plan(tree)
    rng = np.random.default_rng(1)
    cells = {d: rng.normal(3.0, 4.0, size=(tree.sizes[d], 3)) for d in range(len(tree.levels))}  # some negative
    dense = {d: np.asarray(STRATEGIES[name].dense()) for d, name in enumerate(tree.levels)}
    z = {d: cells[d] @ dense[d].T for d in cells}  # measurement space: the strategy's answers
    got = nonnegative_estimates(plan, z, None).answers
    # the root: the non-negative cells with its least-squares total (here the strategy is the identity)
    total = max(cells[0].sum(), 0.0)
    root = so.minimize(lambda v: float(np.sum((v - cells[0][0]) ** 2)), np.full(3, total / 3), method="SLSQP",
                       bounds=[(0, None)] * 3, constraints=[{"type": "eq", "fun": lambda v: v.sum() - total}],
                       options={"ftol": 1e-14}).x
    np.testing.assert_allclose(got[0][0], root, atol=1e-5)
    expect = {0: got[0]}
    for d in range(len(tree.levels) - 1):
        rows = []
        for u in range(tree.sizes[d]):
            lo, hi = tree.child_bounds(d)[u], tree.child_bounds(d)[u + 1]
            rows.append(_family(dense[d + 1], cells[d + 1][lo:hi], expect[d][u]))
        expect[d + 1] = np.vstack(rows)
        np.testing.assert_allclose(got[d + 1], expect[d + 1], atol=2e-3 * max(1.0, np.abs(expect[d + 1]).max()))
        expect[d + 1] = got[d + 1]  # the next level under the released parents


@pytest.mark.parametrize("postprocess", ["nonnegative", "integer"])
def test_release_is_consistent_non_negative_and_keeps_invariants(postprocess):
    tree = country()
    H = histograms(tree)
    bounds = tree.leaf_bounds("state")
    held = {"state": {code: float(H[bounds[s]:bounds[s + 1]].sum()) for s, code in enumerate(tree.codes("state"))}}
    plan = per_level_plan(tree, invariants=held)
    rel = release_geography(plan, ArrayHistograms(sp.csr_matrix(H)), seed=4, postprocess=postprocess)
    for d in range(len(tree.levels)):
        A = rel.answers(d)
        assert np.all(A >= -1e-9)
        if postprocess == "integer":
            assert np.array_equal(A, np.rint(A))
        if d + 1 < len(tree.levels):
            np.testing.assert_allclose(np.add.reduceat(rel.answers(d + 1), tree.child_bounds(d)[:-1], axis=0), A,
                                       atol=1e-6)
    np.testing.assert_allclose(rel.answers(1).sum(axis=1), [held["state"][c] for c in tree.codes("state")], atol=1e-6)
    np.testing.assert_allclose(rel.answers(0).sum(), H.sum(), atol=1e-6)


@pytest.mark.filterwarnings("ignore:the non-negative projection stopped")  # noise far below the stopping rule
def test_measures_each_level_with_its_own_strategy():
    """With almost no noise the release is the truth at every level: each level's measurements went through
    its own strategy and were read back through its pseudo-inverse."""
    tree = country()
    H = histograms(tree, seed=2)
    plan = per_level_plan(tree, hdmm.PureDP(1e7))
    rel = release_geography(plan, ArrayHistograms(sp.csr_matrix(H)), seed=0, postprocess="integer")
    truth = H
    for d in range(len(tree.levels) - 1, -1, -1):
        np.testing.assert_array_equal(rel.answers(d), truth)
        if d:
            truth = np.add.reduceat(truth, tree.child_bounds(d - 1)[:-1], axis=0)


def test_refusals_before_any_noise():
    tree = country()
    plan = per_level_plan(tree)
    source = ArrayHistograms(sp.csr_matrix(histograms(tree)))
    with pytest.raises(ValueError, match="top down"):
        release_geography(plan, source, seed=0)
    with pytest.raises(ValueError, match="top down"):
        release_geography(plan, source, seed=0, engine="spark")  # least squares: refused on Spark too
    with pytest.raises(GeographyError, match="level weights"):
        geo_plan(tree, W, hdmm.ZCDP(0.5), strategy=STRATEGIES)
    with pytest.raises(GeographyError, match="missing \\['tract'\\]"):
        geo_plan(tree, W, hdmm.ZCDP(0.5), strategy={k: v for k, v in STRATEGIES.items() if k != "tract"},
                 level_weights=SHARES)
    with pytest.raises(GeographyError, match="measure every level"):
        geo_plan(tree, W, hdmm.ZCDP(0.5), strategy={k: v for k, v in STRATEGIES.items() if k != "state"},
                 level_weights={**SHARES, "state": 0.0})
    with pytest.raises(TypeError, match="must be a Matrix"):
        geo_plan(tree, W, hdmm.ZCDP(0.5), strategy={**STRATEGIES, "tract": np.eye(3)}, level_weights=SHARES)


def test_production_plan_gives_productions_noise_to_every_answer():
    from census_workloads.das2020 import PL94_2020
    from hdmm.geography import GeographyTree

    names = list(PL94_2020.level_names)
    parents, above = {}, "US"
    for name in names[1:]:  # one unit per level, nation to block
        parents[name] = above
        above = name
    tree = GeographyTree.from_parents(parents, names)
    plan = PL94_2020.geo_plan(tree)
    assert plan.per_level and plan.privacy == PL94_2020.hdmm_privacy()
    w2 = plan.level_weights**2 / np.sum(plan.level_weights**2)
    for d, name in enumerate(names):
        a = PL94_2020.level(name)
        assert w2[d] == pytest.approx(float(a.share), rel=1e-12)
        for q, s in zip(a.queries, a.query_shares):  # the answers of query q: rows divided by w_l sqrt(s)
            got = plan.noise_variance / (plan.level_weights[d] ** 2 * float(s))
            assert got == pytest.approx(float(PL94_2020.variance(name, q)), rel=1e-6)
    with pytest.raises(ValueError, match="production's first levels"):
        PL94_2020.geo_plan(GeographyTree.from_parents({"x": "US"}, ["nation", "county"]))
