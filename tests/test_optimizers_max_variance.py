"""optimize(..., objective="max_variance"): the residual strategy minimizing the largest per-query variance."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

import hdmm
from hdmm.marginals import AllMarginals, Marginals
from hdmm.optimizers.max_variance import MaxVarianceProblem, max_variance_residual
from hdmm.error import per_query_variance
from hdmm.matrix import Matrix
from hdmm.optimizers import opt_residual

GAUSS = hdmm.ZCDP(0.5)


def _weighted_marginals(sizes, k, seed):
    base = AllMarginals(sizes, k)
    rng = np.random.default_rng(seed)
    return Marginals.from_members(sizes, base.members, 0.3 + rng.random(base.members.shape[0]))


def _dense_variances(W: Matrix, A: Matrix, privacy) -> np.ndarray:
    """Every query's variance from dense numpy, the sensitivity in the privacy's norm."""
    Wd, Ad = W.dense(), A.dense()
    sensitivity = (np.abs(Ad).sum(axis=0) if privacy.noise == "laplace" else np.sqrt((Ad**2).sum(axis=0))).max()
    Xp = np.linalg.pinv(Ad.T @ Ad)
    return privacy.noise_variance(sensitivity) * np.einsum("ij,jk,ik->i", Wd, Xp, Wd)


@pytest.mark.parametrize("sizes, k, seed", [((3, 4, 2), 2, 0), ((2, 3, 2, 3), 3, 1), ((5, 2, 3), 1, 2)])
def test_the_largest_variance_matches_dense_numpy(sizes, k, seed):
    W = _weighted_marginals(sizes, k, seed)
    result = hdmm.optimize(W, hdmm.ApproxDP(1.0, 1e-6), objective="max_variance")
    dense = _dense_variances(W, result.strategy, hdmm.ApproxDP(1.0, 1e-6))
    assert result.max_variance == pytest.approx(dense.max(), rel=1e-9)
    assert result.strategy.sensitivity(2) == pytest.approx(1.0)
    assert float(result.error) == pytest.approx(dense.sum(), rel=1e-9)
    report = result.report.set_index("optimizer")
    # the total-error residual strategy has a larger worst query, and nothing beats the mean-variance bound
    total = opt_residual(W, hdmm.ApproxDP(1.0, 1e-6))
    assert report.loc["residual (total)", "max variance"] == pytest.approx(
        _dense_variances(W, total, hdmm.ApproxDP(1.0, 1e-6)).max(), rel=1e-9)
    assert report.loc["max_variance", "max variance"] <= report.loc["residual (total)", "max variance"] * (1 + 1e-9)
    assert (report["max variance / SVD mean-variance bound"] >= 1 - 1e-9).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_optimum_matches_a_general_convex_solver(seed):
    W = _weighted_marginals((3, 2, 4), 2, seed)
    solution = max_variance_residual(W)
    problem = MaxVarianceProblem(hdmm.kron_union.kron_union(W))
    A, t = problem.A.toarray()[problem.terms], problem.t
    k = t.size

    # min s over (z, s): (A e^z)_j <= s, sum_T t_T e^-z_T <= 1 (x = e^z), by SLSQP from x = 1
    z0 = np.log(np.full(k, t.sum()))
    s0 = float((A @ np.exp(z0)).max())
    cons = [{"type": "ineq", "fun": lambda v: v[-1] - A @ np.exp(v[:-1])},
            {"type": "ineq", "fun": lambda v: 1.0 - np.sum(t * np.exp(-v[:-1]))}]
    found = minimize(lambda v: v[-1], np.r_[z0, s0], constraints=cons, method="SLSQP",
                     options={"maxiter": 1000, "ftol": 1e-12})
    assert found.success
    assert solution.value == pytest.approx(found.fun, rel=1e-5)
    assert solution.dual_bound <= solution.value and solution.gap < 1e-8
    # every residual strategy is at least the dual bound
    rng = np.random.default_rng(seed)
    for _ in range(20):
        assert problem.objective(rng.random(problem.t.size) + 0.01) >= solution.dual_bound * (1 - 1e-12)


def test_symmetric_marginals_reduce_to_a_few_classes():
    dom = hdmm.Domain([f"x{i}" for i in range(30)], [10] * 30)
    solution = max_variance_residual(hdmm.AllMarginals(dom, 3))
    assert solution.classes == (4, 4) and solution.gap < 1e-8
    assert solution.value == pytest.approx(2540.44027, rel=1e-8)


def test_weights_set_per_table_targets():
    # doubling a table's weight asks for a quarter of its variance
    sizes = (3, 4, 5)
    plain = Marginals(sizes, {(0, 1): 1.0, (1, 2): 1.0})
    favoured = Marginals(sizes, {(0, 1): 2.0, (1, 2): 1.0})
    variances = {}
    for name, W in (("plain", plain), ("favoured", favoured)):
        A = hdmm.optimize(W, GAUSS, objective="max_variance").strategy
        v = per_query_variance(Marginals(sizes, {(0, 1): 1.0, (1, 2): 1.0}), A, GAUSS)
        variances[name] = (v[:12].max(), v[12:].max())
    assert variances["favoured"][0] < variances["plain"][0]
    assert variances["favoured"][0] * 4 == pytest.approx(variances["favoured"][1], rel=1e-6)


def test_unsupported_objectives_and_workloads_say_why(monkeypatch):
    W = AllMarginals((3, 4), 2)
    with pytest.raises(ValueError, match="objective must be"):
        hdmm.optimize(W, GAUSS, objective="worst")
    with pytest.raises(ValueError, match="optimizers= does not apply"):
        hdmm.optimize(W, GAUSS, objective="max_variance", optimizers=["residual"])
    with pytest.raises(ValueError, match="same variance"):
        MaxVarianceProblem(hdmm.kron_union.kron_union(hdmm.Prefix(6)))
    import hdmm.optimizers.reweight as reweight
    monkeypatch.setattr(reweight, "MAX_QUERIES", 10)
    with pytest.raises(ValueError, match="every query's variance each round; this workload has 21 queries"):
        hdmm.optimize(hdmm.AllRange(6), hdmm.PureDP(1.0), objective="max_variance")


@pytest.mark.parametrize("privacy", [hdmm.PureDP(1.0), GAUSS], ids=["laplace", "gaussian"])
def test_reweighting_lowers_the_largest_variance_of_any_workload_and_reports_it_exactly(privacy):
    # prefixes (unequal variances within the term) with a total held to a quarter of their RMSE; under
    # Gaussian noise a second query matrix on the attribute (outside the residual-bases program)
    parts = [hdmm.Prefix(16), hdmm.Total(16)] + ([hdmm.AllRange(16)] if privacy.noise.l2 else [])
    W = hdmm.union(parts, weights=[1.0, 4.0, 1.0][:len(parts)])
    result = hdmm.optimize(W, privacy, objective="max_variance", seed=0)
    report = result.report
    assert result.optimizer == "reweighted" and result.objective == "max_variance"
    assert report["optimizer"].iloc[0] == "reweighted, round 1" and "total-error optimum" in report["note"].iloc[0]
    assert "uncertified" in report.loc[report["max variance"].idxmin(), "note"]
    assert result.max_variance == pytest.approx(report["max variance"].min(), rel=1e-12)
    assert result.max_variance < report["max variance"].iloc[0]  # below the total-error optimum's
    assert result.max_variance == pytest.approx(_dense_variances(W, result.strategy, privacy).max(), rel=1e-8)
    mean_bound = result.bound.value / W.shape[0]
    assert result.max_variance >= mean_bound
    assert float(result.error) == pytest.approx(float(hdmm.expected_error(W, result.strategy, privacy)), rel=1e-9)


def test_reweighting_on_a_multi_attribute_union_of_ranges_and_marginals():
    dom = hdmm.Domain(["a", "b", "c"], [6, 3, 4])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.AllRange(6)}), hdmm.product(dom, {"b": hdmm.Identity(3),
                                                                                   "c": hdmm.Identity(4)})])
    result = hdmm.optimize(W, hdmm.PureDP(1.0), objective="max_variance", seed=0)
    assert result.max_variance <= result.report["max variance"].iloc[0]
    assert result.max_variance == pytest.approx(_dense_variances(W, result.strategy, hdmm.PureDP(1.0)).max(), rel=1e-8)


def test_a_time_limit_stops_the_reweighting_after_its_first_round(monkeypatch):
    import hdmm.optimizers.api as api
    clock = iter(np.arange(0.0, 1e6, 10.0))  # every call to the clock moves on 10 s
    monkeypatch.setattr(api.time, "perf_counter", lambda: float(next(clock)))
    import hdmm.optimizers.reweight as reweight
    monkeypatch.setattr(reweight.time, "perf_counter", lambda: float(next(clock)))
    W = hdmm.union([hdmm.Prefix(16), hdmm.Total(16)], weights=[1.0, 4.0])
    result = hdmm.optimize(W, hdmm.PureDP(1.0), objective="max_variance", seed=0, time_limit=5)
    assert len(result.report) == 1 and result.max_variance == result.report["max variance"].iloc[0]


def test_reweighting_takes_each_terms_largest_variance_over_its_own_rows_only():
    from hdmm.optimizers.reweight import reweighted_max_variance
    W = hdmm.union([hdmm.Prefix(8), hdmm.Identity(8), hdmm.Total(8)], weights=[1.0, 0.0, 2.0])
    seen = []

    def total(weighted):
        seen.append(hdmm.kron_union.kron_union(weighted).weights.copy())
        return hdmm.Identity(8), "identity"

    solution = reweighted_max_variance(W, hdmm.PureDP(1.0), total, rounds=2)
    # under the identity: prefix variances 2 * (1..8), the total's 2 * 4 * 8; the zero-weight term is left alone
    assert solution.history["max variance"].iloc[0] == pytest.approx(64.0)
    assert seen[1][1] == 0.0 and seen[1][2] / 2.0 > seen[1][0]


def test_a_round_that_overshoots_sends_the_next_back_to_the_best_weights_with_half_the_step():
    from hdmm.optimizers.reweight import STEP, reweighted_max_variance
    W = hdmm.union([hdmm.Prefix(8), hdmm.Identity(8)])
    seen = []

    def total(weighted):  # the same strategy every round: no round beats the first
        seen.append(hdmm.kron_union.kron_union(weighted).weights.copy())
        return hdmm.Identity(8), "identity"

    solution = reweighted_max_variance(W, hdmm.PureDP(1.0), total, rounds=4)
    # under the identity the terms' largest variances are 2 * 8 (prefixes) and 2 (cells): mean 9
    ratio = np.array([16.0, 2.0]) / 9.0
    for round_, eta in [(1, STEP), (2, STEP / 2), (3, STEP / 4)]:
        expected = ratio**eta / (ratio**eta).max()
        np.testing.assert_allclose(seen[round_], expected, rtol=1e-12)
    assert solution.history["max variance"].iloc[0] == pytest.approx(16.0)
    np.testing.assert_array_equal(solution.weights, [1.0, 1.0])


def test_the_step_stays_halved_after_an_overshoot_even_when_a_later_round_wins(monkeypatch):
    import hdmm.optimizers.reweight as R
    W = hdmm.union([hdmm.Prefix(8), hdmm.Identity(8)])
    scripted = iter([(16.0, 2.0), (40.0, 1.0), (10.0, 5.0), (9.0, 8.0)])  # each round's largest per term
    monkeypatch.setattr(R, "per_query_variance", lambda W, A, privacy: np.repeat(next(scripted), 8))
    seen = []

    def total(weighted):
        seen.append(hdmm.kron_union.kron_union(weighted).weights.copy())
        return hdmm.Identity(8), "identity"

    solution = R.reweighted_max_variance(W, hdmm.PureDP(1.0), total, rounds=4)

    def moved(omega, v, eta):
        w = omega * (np.asarray(v) / np.mean(v)) ** eta
        return w / w.max()

    third = moved(np.ones(2), (16.0, 2.0), R.STEP / 2)        # round 2 overshot: back to round 1, half the step
    np.testing.assert_allclose(seen[2], third, rtol=1e-12)
    np.testing.assert_allclose(seen[3], moved(third, (10.0, 5.0), R.STEP / 2), rtol=1e-12)  # still half
    assert solution.max_variance == 9.0 and list(solution.history["max variance"]) == [16.0, 40.0, 10.0, 9.0]


def test_gaussian_prefix_marginals_take_the_certified_program_over_residual_bases():
    dom = hdmm.Domain(["a", "b", "c"], [6, 4, 3])
    W = hdmm.union([hdmm.product(dom, {}), hdmm.product(dom, {"a": hdmm.Prefix(6)}),
                    hdmm.product(dom, {"a": hdmm.Prefix(6), "b": hdmm.Identity(4)}),
                    hdmm.product(dom, {"c": hdmm.Identity(3)})], weights=[4.0, 1.0, 1.0, 2.0])
    result = hdmm.optimize(W, GAUSS, objective="max_variance")
    assert result.optimizer == "max_variance_bases"
    assert result.max_variance == pytest.approx(_dense_variances(W, result.strategy, GAUSS).max(), rel=1e-9)
    assert float(result.error) == pytest.approx(_dense_variances(W, result.strategy, GAUSS).sum(), rel=1e-9)
    report = result.report.set_index("optimizer")
    assert "bases fixed" in report.loc["max_variance_bases", "note"]
    assert report.loc["max_variance_bases", "max variance"] <= report.loc["residual_bases (total)", "max variance"]


def test_exhaustive_also_runs_the_reweighting_and_keeps_the_lower():
    dom = hdmm.Domain(["a", "b"], [6, 4])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(6)}), hdmm.product(dom, {"b": hdmm.Identity(4)}),
                    hdmm.product(dom, {"a": hdmm.Prefix(6), "b": hdmm.Identity(4)})])
    certified = hdmm.optimize(W, GAUSS, objective="max_variance")
    both = hdmm.optimize(W, GAUSS, objective="max_variance", exhaustive=True, seed=0)
    names = list(both.report["optimizer"])
    assert "max_variance_bases" in names and "reweighted, round 1" in names
    searched = both.report[both.report["optimizer"].str.startswith("reweighted")]
    assert "residual_bases" not in set(searched["total-error optimizer"])  # it cannot beat the certified program
    assert both.max_variance == pytest.approx(both.report["max variance"].min(), rel=1e-12)
    assert both.max_variance <= certified.max_variance * (1 + 1e-12)
    assert both.max_variance == pytest.approx(_dense_variances(W, both.strategy, GAUSS).max(), rel=1e-8)


def test_a_residual_bases_program_too_large_falls_back_to_the_reweighting(monkeypatch):
    import hdmm.optimizers.max_variance_bases as M
    monkeypatch.setattr(M, "MAX_ENTRIES", 3)
    dom = hdmm.Domain(["a", "b"], [6, 4])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(6)}), hdmm.product(dom, {"b": hdmm.Identity(4)})])
    said = []
    result = hdmm.optimize(W, GAUSS, objective="max_variance", seed=0, progress=said.append)
    assert result.optimizer == "reweighted" and any("more than 3 entries" in line for line in said)
