"""The optimizers' protocol and registry, the privacy argument every optimizer takes, and its deprecated alias."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import warnings

import numpy as np
import pytest

import hdmm
import hdmm.optimizers.api as api
import hdmm.optimizers.registry as registry
from hdmm.optimizers import (
    REGISTRY,
    Candidate,
    OptimizationResult,
    Optimizer,
    Problem,
    opt0,
    opt_kron,
    opt_marginals,
    opt_residual,
    opt_union,
)
from hdmm.error import exact_route, expected_error
from hdmm.matrix import Kronecker

LAPLACE, GAUSS = hdmm.PureDP(1.0), hdmm.ZCDP(0.5)
PUBLIC = (opt0, opt_kron, opt_union, opt_marginals, opt_residual)


def two_terms():
    dom = hdmm.Domain(["a", "b"], [4, 5])
    return hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(4)}), hdmm.product(dom, {"b": hdmm.Identity(5)})])


def test_the_registry_holds_the_six_optimizers_in_the_order_optimize_runs_them():
    assert list(REGISTRY) == ["identity", "residual", "residual_bases", "opt_kron", "opt_marginals", "opt_union"]
    assert all(isinstance(o, Optimizer) and o.name == name and o.summary for name, o in REGISTRY.items())


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS, hdmm.ApproxDP(1.0, 1e-6)])
def test_applies_needs_several_terms_for_opt_union_and_gaussian_noise_for_residual(privacy):
    single = Problem(hdmm.Prefix(8), privacy)
    several = Problem(two_terms(), privacy)
    gaussian = privacy.noise == "gaussian"
    assert [n for n, o in REGISTRY.items() if o.applies(single)] == (
        ["identity"] + (["residual", "residual_bases"] if gaussian else []) + ["opt_kron", "opt_marginals"])
    assert REGISTRY["opt_union"].applies(several) and REGISTRY["residual"].applies(several) == gaussian
    assert REGISTRY["residual_bases"].applies(several) == gaussian


@pytest.mark.parametrize("privacy", [LAPLACE, hdmm.PureDP(0.1), GAUSS, hdmm.ApproxDP(2.0, 1e-9)])
def test_each_run_returns_a_candidate_with_its_unit_noise_error(privacy):
    W = two_terms()
    problem = Problem(W, privacy, rng=np.random.default_rng(0))
    unit = privacy.unit_noise()
    for name, optimizer in REGISTRY.items():
        if not optimizer.applies(problem):
            continue
        candidate = optimizer.run(problem)
        assert isinstance(candidate, Candidate) and candidate.exact
        with pytest.raises(dataclasses.FrozenInstanceError):
            candidate.exact = False
        assert candidate.strategy.sensitivity(privacy.norm) == pytest.approx(1.0)
        exact = float(hdmm.expected_error(W, candidate.strategy, unit))
        assert candidate.unit_error == pytest.approx(exact, rel=1e-12), name
        assert problem.total_error(candidate) == float(problem.expected_error(candidate.strategy))


def test_the_error_of_each_strategy_is_computed_once_and_the_winners_is_the_result(monkeypatch):
    calls = []
    original = registry.expected_error

    def counting(W, A, privacy, **kwargs):
        result = original(W, A, privacy, **kwargs)
        calls.append((A, result))
        return result

    bounds = []
    original_bound = api.svd_bound
    monkeypatch.setattr(registry, "expected_error", counting)
    monkeypatch.setattr(api, "svd_bound", lambda *a, **k: bounds.append(1) or original_bound(*a, **k))
    privacy = hdmm.ApproxDP(1.0, 1e-6)
    result = hdmm.optimize(two_terms(), privacy, seed=0)
    assert len(bounds) == 1
    assert len(result.report) == 6  # OPT_M cannot beat the residual strategy under Gaussian noise: skipped
    assert result.report.set_index("optimizer").loc["opt_marginals", "note"].startswith("skipped: cannot beat")
    assert len(calls) == result.report["rmse"].notna().sum() == 5
    assert len({id(A) for A, _ in calls}) == len(calls)
    (winner_error,) = [error for A, error in calls if A is result.strategy]
    assert result.error is winner_error and result.error.privacy == privacy
    assert float(result.error) == result.report["total squared error"].min()


def test_an_optimization_result_is_frozen():
    result = hdmm.optimize(hdmm.Prefix(8), LAPLACE, seed=0)
    assert isinstance(result, OptimizationResult) and dataclasses.is_dataclass(result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.optimizer = "other"
    assert list(result.report.columns) == ["optimizer", "total squared error", "exact", "seconds", "rmse",
                                           "RMSE / SVD bound RMSE", "note"]
    assert not result.optimal and (result.report["note"] == "").all()


def test_an_inexact_candidate_is_reported_at_its_bound():
    W = two_terms()
    problem = Problem(W, hdmm.PureDP(0.5))
    candidate = Candidate(hdmm.Identity(20), 3.0, False)
    assert problem.total_error(candidate) == problem.privacy.noise_variance(1.0) * 3.0
    error = problem.error_result(candidate)
    assert float(error) == problem.total_error(candidate) and error.queries == W.shape[0]


def test_a_registered_optimizer_joins_optimize(monkeypatch):
    def total_and_cells(problem):
        n = problem.workload.shape[1]
        return problem.candidate(hdmm.matrix.VStack([0.5 * hdmm.Total(n), 0.5 * hdmm.Identity(n)]))

    extra = Optimizer("total_and_cells", total_and_cells, summary="a total and the cells")
    monkeypatch.setitem(REGISTRY, extra.name, extra)
    result = hdmm.optimize(hdmm.Prefix(8), LAPLACE, seed=0, optimizers=["identity", "total_and_cells"])
    assert list(result.report["optimizer"]) == ["identity", "total_and_cells"]
    with pytest.raises(ValueError, match="registered already"):
        registry.register(extra)
    with pytest.raises(TypeError, match="Optimizer"):
        registry.register(total_and_cells)


# ------------------------------------------------------------------ privacy as the second argument
def test_every_public_optimizer_takes_the_privacy_second_and_no_norm_or_noise_is_threaded():
    for f in PUBLIC:
        parameters = list(inspect.signature(f).parameters.values())
        assert parameters[1].name == "privacy"
        assert parameters[-1].name == "noise" and parameters[-1].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(inspect.signature(hdmm.optimize).parameters)[1] == "privacy"
    from hdmm.optimizers import kron, marginals, union

    drivers = [kron.factor_method, kron.optimize_factor, kron.factor_candidates, kron.opt_kron_union,
               union.opt_union_groups, marginals.opt_marginals_strategy, marginals.optimize_marginal_weights]
    for f in drivers:
        names = list(inspect.signature(f).parameters)
        assert "privacy" in names and "norm" not in names and "noise" not in names, f.__name__


@pytest.mark.parametrize("noise, privacy", [("laplace", LAPLACE), ("gaussian", GAUSS)])
def test_the_noise_string_is_a_deprecated_alias_with_the_same_strategy(noise, privacy):
    W = two_terms()
    for f in PUBLIC:
        if f is opt_residual and noise == "laplace":
            continue
        with pytest.warns(DeprecationWarning, match=rf"{f.__name__}\(W, noise='{noise}'\) is deprecated.*hdmm\."):
            old = f(W, noise=noise, seed=3)
        with pytest.warns(DeprecationWarning, match="is deprecated"):
            positional = f(W, noise, seed=3)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            new = f(W, privacy, seed=3)
        errors = {float(hdmm.expected_error(W, A, privacy)) for A in (old, positional, new)}
        assert len(errors) == 1, f.__name__


def test_without_privacy_the_optimizers_plan_for_laplace_noise_and_residuals_for_gaussian():
    W = two_terms()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for f in PUBLIC[:-1]:
            A = f(W, seed=0)
            assert A.sensitivity(1) == pytest.approx(1.0)
            assert float(hdmm.expected_error(W, A, LAPLACE)) == float(
                hdmm.expected_error(W, f(W, LAPLACE, seed=0), LAPLACE))
        assert opt_residual(W).sensitivity(2) == pytest.approx(1.0)


def test_bad_privacy_arguments_name_the_fix():
    W = hdmm.Prefix(8)
    with pytest.raises(TypeError, match="privacy definition"):
        opt0(W, 4)  # the old positional p
    with pytest.raises(TypeError, match="not both"):
        opt_kron(W, LAPLACE, noise="laplace")
    with pytest.raises(ValueError, match="noise must be 'laplace' or 'gaussian'.*hdmm.PureDP"):
        opt_marginals(W, noise="gauss")
    with pytest.raises(ValueError, match="Gaussian noise only"):
        opt_residual(hdmm.AllMarginals((2, 3)), hdmm.PureDP(2.0))
    with pytest.raises(TypeError, match="PureDP, ApproxDP or ZCDP"):
        hdmm.optimize(W, "laplace")


def test_the_submodules_are_not_shadowed_by_functions():
    assert callable(hdmm.optimizers.optimize)
    assert importlib.import_module("hdmm.optimizers.api").optimize is hdmm.optimizers.optimize
    assert importlib.import_module("hdmm.optimizers.registry").REGISTRY is REGISTRY
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("hdmm.optimizers.optimize")


# ------------------------------------------------------------------ certified early exit and skips
def test_a_strategy_equal_to_the_svd_bound_stops_optimize_as_optimal(monkeypatch):
    ran = []
    for name, optimizer in list(REGISTRY.items()):
        monkeypatch.setitem(REGISTRY, name, dataclasses.replace(
            optimizer, run=lambda problem, run=optimizer.run, name=name: ran.append(name) or run(problem)))
    W = hdmm.AllMarginals((3, 4, 2, 5), 2)  # in the marginals algebra: the residual strategy is optimal
    result = hdmm.optimize(W, GAUSS, seed=0)
    assert ran == ["identity", "residual"]
    assert result.optimal and result.optimizer == "residual"
    assert float(result.error) == pytest.approx(result.bound.value, rel=1e-9)
    report = result.report.set_index("optimizer")
    assert report.loc["residual", "note"] == "optimal"
    for name in ("opt_kron", "opt_marginals", "opt_union"):
        assert report.loc[name, "note"].startswith("skipped: residual is optimal")
        assert np.isnan(report.loc[name, "rmse"])
    # exhaustive runs everything and still says which is optimal
    full = hdmm.optimize(W, GAUSS, seed=0, exhaustive=True)
    assert full.optimal and full.report["rmse"].notna().all()
    assert float(full.error) == pytest.approx(float(result.error), rel=1e-9)


def test_an_optimum_is_only_certified_against_an_exact_bound():
    # Laplace: the identity is optimal for the identity workload, at the SVD bound
    result = hdmm.optimize(hdmm.Identity(6), LAPLACE, seed=0)
    assert result.optimal and result.optimizer == "identity"
    assert list(result.report["note"][1:].str.startswith("skipped")) == [True] * (len(result.report) - 1)
    # prefixes: no strategy reaches the bound, nothing is certified and everything runs
    result = hdmm.optimize(hdmm.Prefix(8), GAUSS, seed=0)
    report = result.report.set_index("optimizer")
    assert not result.optimal and report.drop(["opt_marginals", "residual_bases"])["rmse"].notna().all()
    assert report.loc["opt_marginals", "note"].startswith("skipped: cannot beat")
    assert report.loc["residual_bases", "note"].startswith("skipped: on one Kronecker product")


def test_optimizers_whose_cost_would_explode_are_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(registry, "MARGINALS_MAX_CANDIDATES", 3)
    monkeypatch.setattr(registry, "UNION_MAX_SOLVES", 2)
    W = hdmm.union([hdmm.product(hdmm.Domain(["a", "b"], [4, 5]), {"a": hdmm.Prefix(4)}),
                    hdmm.product(hdmm.Domain(["a", "b"], [4, 5]), {"b": hdmm.Prefix(5)})])
    result = hdmm.optimize(W, LAPLACE, seed=0)
    report = result.report.set_index("optimizer")
    assert report.loc["opt_marginals", "note"].startswith("skipped: OPT_M over 4 candidate marginals")
    assert report.loc["opt_union", "note"].startswith("skipped: OPT_+ over 2 groups")
    assert np.isnan(report.loc["opt_union", "total squared error"]) and report.loc["opt_kron", "note"] == ""
    # naming an optimizer runs it whatever its cost
    named = hdmm.optimize(W, LAPLACE, seed=0, optimizers=["identity", "opt_marginals"])
    assert named.report["note"].eq("").all() and named.report["rmse"].notna().all()


def test_all_three_way_marginals_of_100_attributes_stop_at_the_residual_optimum():
    # ResidualPlanner's benchmark at 1e100 cells: no dense vector, OPT_(x)/OPT_M/OPT_+ never run
    dom = hdmm.Domain([f"x{i}" for i in range(100)], [10] * 100)
    result = hdmm.optimize(hdmm.AllMarginals(dom, 3), GAUSS, seed=0)
    assert result.optimal and result.optimizer == "residual"
    assert result.rmse == pytest.approx(303.216, abs=5e-4)


# ---------------------------------------------------------------- certified skips and the time limit
def test_opt_m_is_skipped_when_its_floor_is_above_a_strategy_found_and_runs_when_named():
    W = Kronecker([hdmm.AllRange(128)] * 2)
    result = hdmm.optimize(W, LAPLACE, seed=0)
    report = result.report.set_index("optimizer")
    note = report.loc["opt_marginals", "note"]
    assert note.startswith("skipped: cannot beat opt_kron") and np.isnan(report.loc["opt_marginals", "rmse"])
    # the floor is valid: OPT_M run anyway does no better than it
    floor = registry.REGISTRY["opt_marginals"].lower_bound(Problem(W, LAPLACE)) * LAPLACE.noise_variance(1.0)
    full = hdmm.optimize(W, LAPLACE, seed=0, exhaustive=True).report.set_index("optimizer")
    assert full.loc["opt_marginals", "total squared error"] >= floor * (1 - 1e-9)
    assert full.loc["opt_kron", "total squared error"] < floor


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS], ids=["laplace", "gaussian"])
@pytest.mark.parametrize("make", [
    lambda: hdmm.AllMarginals((3, 4, 2), 2),
    lambda: Kronecker([hdmm.Prefix(6), hdmm.Identity(3)]),
    two_terms,
], ids=["marginals", "prefix-identity", "two-terms"])
def test_opt_m_never_goes_below_its_stated_floor(make, privacy):
    W = make()
    problem = Problem(W, privacy, rng=np.random.default_rng(0))
    floor = registry.REGISTRY["opt_marginals"].lower_bound(problem)
    assert registry.REGISTRY["opt_marginals"].run(problem).unit_error >= floor * (1 - 1e-9)


def test_opt_union_abandons_once_its_bound_cannot_win_and_never_where_its_error_may_be_exact(monkeypatch):
    W = hdmm.union([Kronecker([hdmm.Prefix(32), hdmm.Prefix(16)]),
                    Kronecker([hdmm.AllRange(32), hdmm.Total(16)]), Kronecker([hdmm.Total(32), hdmm.AllRange(16)])])
    monkeypatch.setattr(registry, "UNION_EXACT_MAX_N", 4)  # 512 cells: OPT_+ judged by its bound
    for privacy in (LAPLACE, GAUSS):
        problem = Problem(W, privacy, rng=np.random.default_rng(0))
        groups = registry.default_groups(W, problem.union)
        check = registry._union_check(problem, groups)
        assert check is not None
        check([], [])  # nothing evaluated yet: never abandons
        problem.expected_error(hdmm.Identity(512))
        run = registry.REGISTRY["opt_union"].run(Problem(W, privacy, rng=np.random.default_rng(0), abandon=False))
        assert not run.exact
        # a best candidate just below OPT_+'s bound: abandoned, and the floor it quotes is below that bound
        monkeypatch.setattr(Problem, "best_unit_error", lambda self, v=run.unit_error: v * 0.999)
        with pytest.raises(registry.Abandoned, match="abandoned after .* groups: its error bound") as stop:
            registry.REGISTRY["opt_union"].run(Problem(W, privacy, rng=np.random.default_rng(0)))
        floor = float(str(stop.value).split("at least ")[1].split(",")[0])
        assert floor <= run.unit_error * problem.unit_variance * (1 + 1e-6)
        monkeypatch.undo()
        monkeypatch.setattr(registry, "UNION_EXACT_MAX_N", 4)
    # groups of identities and totals may give a strategy with its exact error: never abandoned, even against
    # a best candidate barely above the groups' SVD bounds (which no strategy's exact error goes under)
    M = hdmm.AllMarginals((3, 4, 2), 1)
    problem = Problem(M, LAPLACE, rng=np.random.default_rng(0))
    problem.expected_error(hdmm.Identity(24))
    groups = registry.default_groups(M, problem.union)
    floor = sum(registry._group_floors(problem, groups))
    monkeypatch.setattr(Problem, "best_unit_error", lambda self: floor * 1.001)
    run = registry.REGISTRY["opt_union"].run(problem)
    assert run.exact and run.unit_error >= floor * (1 - 1e-9)


def test_a_time_limit_returns_the_best_found_so_far_and_reports_the_rest_as_skipped(monkeypatch):
    clock = iter(np.arange(0.0, 1e6, 10.0))  # every call to the clock moves on 10 s
    monkeypatch.setattr(api.time, "perf_counter", lambda: float(next(clock)))
    result = hdmm.optimize(two_terms(), LAPLACE, seed=0, time_limit=5)
    report = result.report.set_index("optimizer")
    assert result.optimizer == "identity"
    for name in ("opt_kron", "opt_marginals", "opt_union"):
        assert report.loc[name, "note"] == "skipped: the time limit of 5 s was reached"


def test_a_time_limit_ends_opt_kron_after_its_current_round():
    from hdmm.optimizers.kron import opt_kron_union
    W = hdmm.union([Kronecker([hdmm.Prefix(16), hdmm.Prefix(8)]),
                    Kronecker([hdmm.AllRange(16), hdmm.Total(8)]), Kronecker([hdmm.Total(16), hdmm.AllRange(8)])])
    union = hdmm.kron_union.kron_union(W)
    free, limited = [], []
    opt_kron_union(union, LAPLACE, rng=np.random.default_rng(0), progress=free.append)
    opt_kron_union(union, LAPLACE, rng=np.random.default_rng(0), progress=limited.append, deadline=0.0)
    assert len(free) >= 2
    assert limited == [free[0], "OPT_(x): time limit reached, stopping after this round"]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "10", True])
def test_a_bad_time_limit_names_the_fix(bad):
    with pytest.raises(ValueError, match="time_limit must be a positive number of seconds"):
        hdmm.optimize(hdmm.Identity(4), LAPLACE, time_limit=bad)


@pytest.mark.parametrize("make", [lambda: hdmm.AllMarginals((3, 4, 2, 5)), lambda: hdmm.DimKMarginals((6, 2, 3, 4), 2),
                                  lambda: hdmm.union([hdmm.AllMarginals((3, 4, 5), 1), Kronecker(
                                      [hdmm.Identity(3), hdmm.Total(4), hdmm.Identity(5)])], weights=[1.0, 3.0])],
                         ids=["all", "two-way", "weighted"])
def test_under_laplace_opt_union_is_left_to_opt_m_on_identities_and_totals(make):
    W = make()
    result = hdmm.optimize(W, LAPLACE, seed=0).report.set_index("optimizer")
    assert result.loc["opt_union", "note"].startswith("skipped: on identities and totals")
    full = hdmm.optimize(W, LAPLACE, seed=0, exhaustive=True).report.set_index("optimizer")
    assert full.loc["opt_marginals", "total squared error"] <= full.loc["opt_union", "total squared error"]
    # under Gaussian noise the residual strategy settles it
    assert hdmm.optimize(W, GAUSS, seed=0).optimizer == "residual"


def test_opt_union_check_counts_only_the_groups_it_measures(monkeypatch):
    # a group of weight zero is not measured: the check must not pair errors with the wrong groups
    # (three measured groups: two would always diagonalise together and be judged exactly, not by the bound)
    W = hdmm.union([Kronecker([hdmm.Prefix(32), hdmm.Prefix(16)]), Kronecker([hdmm.AllRange(32), hdmm.Total(16)]),
                    Kronecker([hdmm.Total(32), hdmm.AllRange(16)]), Kronecker([hdmm.AllRange(32), hdmm.Prefix(16)])],
                   weights=[1.0, 0.0, 1.0, 1.0])
    monkeypatch.setattr(registry, "UNION_EXACT_MAX_N", 4)
    problem = Problem(W, LAPLACE, rng=np.random.default_rng(0))
    groups = registry.default_groups(W, problem.union)
    assert len(groups) == 4
    problem.expected_error(hdmm.Identity(512))
    check = registry._union_check(problem, groups)
    run = registry.REGISTRY["opt_union"].run(Problem(W, LAPLACE, rng=np.random.default_rng(0), abandon=False))
    assert not run.exact
    monkeypatch.setattr(Problem, "best_unit_error", lambda self, v=run.unit_error: v * 0.999)
    with pytest.raises(registry.Abandoned, match="of 3 groups: its error bound"):
        registry.REGISTRY["opt_union"].run(Problem(W, LAPLACE, rng=np.random.default_rng(0)))
    assert check is not None
    # one measured group left: OPT_+ is one Kronecker strategy with its exact error, so no check
    single = hdmm.union([Kronecker([hdmm.Prefix(32), hdmm.Prefix(16)]),
                         Kronecker([hdmm.AllRange(32), hdmm.Total(16)])], weights=[1.0, 0.0])
    one = Problem(single, LAPLACE)
    assert registry._union_check(one, registry.default_groups(single, one.union)) is None


def prefix_marginals(sizes=(16, 12, 4, 3)):
    """Every 0-2-way marginal, Prefix on the first two attributes and Identity on the rest (2,304 cells)."""
    dom = hdmm.Domain(list("abcd"), list(sizes))
    return hdmm.union([hdmm.product(dom, {"abcd"[i]: hdmm.Prefix(sizes[i]) if i < 2 else hdmm.Identity(sizes[i])
                                          for i in S})
                       for k in range(3) for S in itertools.combinations(range(4), k)])


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS], ids=["laplace", "gaussian"])
def test_opt_union_above_the_dense_limit_is_judged_by_its_exact_error_where_its_grams_diagonalise(privacy):
    W = prefix_marginals()
    assert W.shape[1] > registry.UNION_EXACT_MAX_N
    result = hdmm.optimize(W, privacy, seed=0, optimizers=["identity", "opt_kron", "opt_union"])
    row = result.report.set_index("optimizer").loc["opt_union"]
    problem = Problem(W, privacy, rng=np.random.default_rng(0))
    A, bound = registry.opt_union_groups(problem.union, registry.default_groups(W, problem.union), privacy,
                                         rng=np.random.default_rng(0))
    assert exact_route(W, A) == "union"
    candidate = registry.union_candidate(problem, A, bound)
    assert candidate.exact and candidate.unit_error < bound
    # against numpy's dense pseudo-inverse (2,304 cells)
    Ad, Wd = A.dense(), W.dense()
    dense = np.sum((Wd @ np.linalg.pinv(Ad.T @ Ad, rcond=1e-10, hermitian=True)) * Wd)
    np.testing.assert_allclose(candidate.unit_error, dense, rtol=1e-8)
    assert bool(row["exact"])
    if privacy is GAUSS:  # the exact error wins here; judged by its bound (1.75x) it lost to opt_kron
        assert result.optimizer == "opt_union"
        np.testing.assert_allclose(float(result.error), float(expected_error(W, result.strategy, privacy)), rtol=1e-12)
        assert float(result.error) < row["total squared error"] * (1 + 1e-12)
        np.testing.assert_allclose(row["total squared error"], dense * problem.unit_variance, rtol=1e-8)


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS], ids=["laplace", "gaussian"])
def test_opt_union_is_never_abandoned_when_its_exact_error_would_win(monkeypatch, privacy):
    W = prefix_marginals()
    won = registry.REGISTRY["opt_union"].run(Problem(W, privacy, rng=np.random.default_rng(0), abandon=False))
    assert won.exact
    problem = Problem(W, privacy, rng=np.random.default_rng(0))
    floors = registry._group_floors(problem, [g for g in registry.default_groups(W, problem.union)])
    assert sum(floors) <= won.unit_error * (1 + 1e-9)  # the exact floor is under the exact error
    # any best so far above OPT_+'s exact error, however close: it runs to the end and wins
    for margin in (1e-6, 0.01, 0.5):
        monkeypatch.setattr(Problem, "best_unit_error", lambda self, v=won.unit_error * (1 + margin): v)
        run = registry.REGISTRY["opt_union"].run(Problem(W, privacy, rng=np.random.default_rng(0)))
        assert run.exact and run.unit_error == pytest.approx(won.unit_error, rel=1e-12)
    # with abandoning as optimize does it, the same winner and error as without
    every = hdmm.optimize(W, privacy, seed=0, exhaustive=True)
    default = hdmm.optimize(W, privacy, seed=0)
    assert (default.optimizer, float(default.error)) == (every.optimizer, float(every.error))


def test_opt_union_diagonalises_its_factors_only_when_the_bound_would_abandon(monkeypatch):
    W = prefix_marginals()
    calls = []
    real = registry.factors_diagonalise
    monkeypatch.setattr(registry, "factors_diagonalise", lambda fs: calls.append(len(fs)) or real(fs))
    won = registry.REGISTRY["opt_union"].run(Problem(W, GAUSS, rng=np.random.default_rng(0), abandon=False))
    groups = len(registry.default_groups(W, Problem(W, GAUSS).union))
    # a best far above the bound: nothing to decide, no Gram diagonalised
    monkeypatch.setattr(Problem, "best_unit_error", lambda self: won.unit_error * 100)
    registry.REGISTRY["opt_union"].run(Problem(W, GAUSS, rng=np.random.default_rng(0)))
    assert calls == []
    # a best just above the exact error, under the bound's floor: an attribute is diagonalised once per new factor
    monkeypatch.setattr(Problem, "best_unit_error", lambda self: won.unit_error * 1.01)
    run = registry.REGISTRY["opt_union"].run(Problem(W, GAUSS, rng=np.random.default_rng(0)))
    assert run.exact and 0 < len(calls) <= 4 * groups
    assert all(n <= groups + 2 for n in calls)


@pytest.mark.parametrize("make", [
    lambda: prefix_marginals((12, 10, 3, 4)),
    lambda: hdmm.union([hdmm.product(hdmm.Domain(list("abc"), [12, 10, 12]), {"abc"[i]: hdmm.AllRange((12, 10, 12)[i])
                                                                               for i in S})
                        for S in [(0,), (1,), (2,), (0, 1), (1, 2)]]),
    lambda: hdmm.union([Kronecker([hdmm.Prefix(40), hdmm.Identity(30)]), Kronecker([hdmm.AllRange(40), hdmm.Total(30)]),
                        Kronecker([hdmm.Total(40), hdmm.Prefix(30)])]),
], ids=["prefix-marginals", "range-marginals", "three-products"])
@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS], ids=["laplace", "gaussian"])
def test_abandoning_never_changes_what_optimize_chooses(make, privacy):
    W = make()
    assert W.shape[1] > registry.UNION_EXACT_MAX_N
    default, every = hdmm.optimize(W, privacy, seed=0), hdmm.optimize(W, privacy, seed=0, exhaustive=True)
    assert (default.optimizer, float(default.error)) == (every.optimizer, float(every.error))
    row = default.report.set_index("optimizer").loc["opt_union"]
    if row["note"].startswith("abandoned"):
        assert every.report.set_index("optimizer").loc["opt_union", "total squared error"] >= float(every.error)


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS], ids=["laplace", "gaussian"])
def test_opt_union_judged_exactly_stops_once_the_terms_summed_exceed_the_best(monkeypatch, privacy):
    W = prefix_marginals()
    won = registry.REGISTRY["opt_union"].run(Problem(W, privacy, rng=np.random.default_rng(0), abandon=False))
    assert won.exact
    grids = []
    real = registry.union_totals

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        grids.append(int(np.sum(~np.isnan(found[0]))))
        return found

    monkeypatch.setattr(registry, "union_totals", spy)
    # a best just under its exact error: abandoned, quoting a partial sum above the best and not above the error
    for margin in (1e-6, 0.3):
        best = won.unit_error * (1 - margin)
        monkeypatch.setattr(Problem, "best_unit_error", lambda self, v=best: v)
        problem = Problem(W, privacy, rng=np.random.default_rng(0))
        with pytest.raises(registry.Abandoned, match=r"exact error on \d+ of \d+ workload terms") as stop:
            registry.REGISTRY["opt_union"].run(problem)
        partial = float(str(stop.value).split("at least ")[1].split(",")[0]) / problem.unit_variance
        assert best < partial * (1 + 1e-5) and partial <= won.unit_error * (1 + 1e-5)
    assert grids[0] == problem.union.num_terms > grids[1]  # far under: fewer terms summed


def test_union_totals_stop_early_largest_grid_first_and_keep_what_they_computed(monkeypatch):
    import hdmm.union_gram as union_gram

    W = prefix_marginals()
    A, _ = registry.opt_union_groups(kron(W), registry.default_groups(W, kron(W)), GAUSS, rng=np.random.default_rng(0))
    a_union = hdmm.kron_union.kron_union(A)
    full, supported = union_gram.union_totals(W, a_union)
    assert supported.all() and np.isfinite(full).all()
    np.testing.assert_allclose(full.sum(), float(expected_error(W, A, GAUSS)) / GAUSS.noise_variance(1.0), rtol=1e-12)
    sizes = np.array([g.inverse.size for g in union_gram.union_terms(W, a_union)])
    fresh = hdmm.kron_union.KronUnion(a_union.factors, a_union.index, a_union.weights)  # a new union: nothing kept
    made = []
    real = union_gram.term_grid
    monkeypatch.setattr(union_gram, "term_grid", lambda *args: made.append(1) or real(*args))
    part, _ = union_gram.union_totals(W, fresh, stop_above=0.5 * full.sum())
    done = ~np.isnan(part)
    np.testing.assert_array_equal(part[done], full[done])
    order = sorted(range(len(full)), key=lambda j: -sizes[j])  # largest grids first, then in term order
    reached = order[:int(done.sum())]
    assert sorted(reached) == list(np.flatnonzero(done))
    assert part[done].sum() > 0.5 * full.sum() >= part[done].sum() - part[reached[-1]]  # stopped once above
    assert len(made) == done.sum()
    again, _ = union_gram.union_totals(W, fresh)  # completes the sum, computing only the terms not reached
    np.testing.assert_array_equal(again, full)
    assert len(made) == len(full)


def kron(W):
    return hdmm.kron_union.kron_union(W)


@pytest.mark.parametrize("seed", range(20))
def test_the_sensitivity_floor_is_below_the_sensitivity_and_reaches_it_on_opt_union_strategies(seed):
    from hdmm.matrix import Explicit, VStack, Weighted

    rng = np.random.default_rng(seed)
    sizes = [3, 4, 2]
    pools = [[Explicit(rng.uniform(-1, 1, size=(rng.integers(1, 5), n)) * (rng.random((1, n)) < 0.8))
              for _ in range(rng.integers(1, 3))] for n in sizes]
    A = VStack([Weighted(Kronecker([pool[rng.integers(len(pool))] for pool in pools]), float(rng.uniform(-2, 2)))
                for _ in range(rng.integers(1, 5))])
    union = hdmm.kron_union.kron_union(A)
    for p in (1, 2):
        want = float(np.max(np.sum(np.abs(A.dense()) ** p, axis=0)) ** (1 / p))
        assert registry._sensitivity_floor(union, p) <= want * (1 + 1e-12)
    W = prefix_marginals()
    for privacy in (LAPLACE, GAUSS):
        problem = Problem(W, privacy, rng=np.random.default_rng(0))
        S, _ = registry.opt_union_groups(problem.union, registry.default_groups(W, problem.union), privacy,
                                         rng=np.random.default_rng(0))
        np.testing.assert_allclose(registry._sensitivity_floor(hdmm.kron_union.kron_union(S), privacy.norm),
                                   privacy.noise.sensitivity(S), rtol=1e-12)


def test_opt_union_judged_exactly_computes_its_sensitivity_once_when_it_wins(monkeypatch):
    from hdmm.distributions import Noise

    W = prefix_marginals()
    won = registry.REGISTRY["opt_union"].run(Problem(W, GAUSS, rng=np.random.default_rng(0), abandon=False))
    monkeypatch.setattr(Problem, "best_unit_error", lambda self, v=won.unit_error * 1.01: v)
    asked = []
    real = Noise.sensitivity
    monkeypatch.setattr(Noise, "sensitivity", lambda self, matrix: asked.append(matrix) or real(self, matrix))
    run = registry.REGISTRY["opt_union"].run(Problem(W, GAUSS, rng=np.random.default_rng(0)))
    assert run.exact and run.unit_error == won.unit_error
    assert [A is run.strategy for A in asked].count(True) == 1
