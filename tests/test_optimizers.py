"""Strategy optimizers: gradients against autograd, reported errors against dense numpy, bounds."""

from __future__ import annotations

import io

import autograd.numpy as anp
import numpy as np
import pytest
from autograd import grad

from hdmm.kron_union import kron_union
import hdmm
from hdmm.optimizers.kron import opt_kron_union
from hdmm.optimizers.marginals import MarginalsProblem, opt_marginals_strategy, residual_strategy
from hdmm.optimizers.pidentity import PIdentity, pidentity_objective
from hdmm.optimizers.union import budget_split, opt_union_groups
from hdmm.error import per_query_variance
from hdmm.io import load_strategy, save_strategy
from hdmm.marginals import Marginal
from hdmm.matrix import Explicit, Kronecker
from hdmm.optimizers import opt0, opt_kron, opt_marginals, opt_residual, opt_union
from hdmm.privacy import Privacy
from hdmm.workload import IdentityTotal

LAPLACE, GAUSS = hdmm.PureDP(1.0), hdmm.ZCDP(0.5)


def dense_error(W, A, privacy):
    """Var(z) * tr(pinv(A^T A) W^T W) from dense matrices, inf when A does not support W."""
    Wd, Ad = W.dense(), A.dense()
    X = Ad.T @ Ad
    Xp = np.linalg.pinv(X)
    if np.linalg.norm(Wd - Wd @ Xp @ X) > 1e-6 * np.linalg.norm(Wd):
        return np.inf
    p = privacy.norm
    sens = ((np.abs(Ad) ** p).sum(axis=0) ** (1 / p)).max()
    return privacy.noise_variance(sens) * np.trace(Xp @ Wd.T @ Wd)


def autograd_objective(T, G, norm):
    d = 1 + anp.sum(T, axis=0) if norm == 1 else anp.sqrt(1 + anp.sum(T * T, axis=0))
    A = anp.vstack([anp.eye(T.shape[1]), T]) / d[None, :]
    return anp.trace(anp.dot(anp.linalg.inv(anp.dot(A.T, A)), G))


@pytest.mark.parametrize("norm", [1, 2])
@pytest.mark.parametrize("make", [hdmm.AllRange, hdmm.Prefix, lambda n: hdmm.WidthKRange(n, 3)])
def test_pidentity_gradient_matches_autograd(norm, make):
    rng = np.random.default_rng(1)
    n, p = 14, 3
    G = make(n).gram()
    for _ in range(3):
        T = rng.random((p, n)) * rng.choice([0.1, 1.0, 5.0])
        value, gradient = pidentity_objective(T, G, norm)
        assert value == pytest.approx(autograd_objective(T, G.dense(), norm), rel=1e-10)
        np.testing.assert_allclose(gradient, grad(autograd_objective)(T, G.dense(), norm), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("norm, privacy", [(1, LAPLACE), (2, GAUSS)])
def test_pidentity_strategy_is_normalised_and_its_error_is_exact(norm, privacy):
    rng = np.random.default_rng(2)
    T = rng.random((2, 9))
    A = PIdentity(T, norm)
    d = 1 + T.sum(0) if norm == 1 else np.sqrt(1 + (T * T).sum(0))
    np.testing.assert_allclose(A.dense(), np.vstack([np.eye(9), T]) / d)
    assert A.sensitivity(norm) == pytest.approx(1.0)
    W = hdmm.AllRange(9)
    assert float(hdmm.expected_error(W, A, privacy)) == pytest.approx(dense_error(W, A, privacy), rel=1e-9)
    np.testing.assert_allclose(per_query_variance(W, A, privacy).sum(), dense_error(W, A, privacy), rtol=1e-9)


def test_opt0_reproduces_the_published_prefix_ratio():
    # tutorial seed: on Prefix(128), Identity's error is 1.80x HDMM's (RMSE ratio)
    W = hdmm.Prefix(128)
    A = opt0(W, seed=0)
    ratio = np.sqrt(hdmm.expected_error(W, hdmm.Identity(128), LAPLACE) / hdmm.expected_error(W, A, LAPLACE))
    assert ratio == pytest.approx(1.80, abs=0.05)
    assert A.sensitivity(1) == pytest.approx(1.0)


def test_optimizers_are_deterministic_given_a_seed():
    W = hdmm.AllRange(32)
    a, b = opt0(W, seed=7), opt0(W, seed=7)
    np.testing.assert_array_equal(a.dense(), b.dense())


@pytest.mark.parametrize("norm, privacy", [(1, LAPLACE), (2, GAUSS)])
def test_opt_kron_reports_the_exact_error_and_beats_identity(norm, privacy):
    dom = hdmm.Domain(["x", "y"], [6, 5])
    W = hdmm.union([hdmm.product(dom, {"x": hdmm.Prefix(6), "y": hdmm.Identity(5)}),
                    hdmm.product(dom, {"y": hdmm.AllRange(5)})], weights=[1.0, 2.0])
    A, value = opt_kron_union(kron_union(W), privacy, rng=np.random.default_rng(0))
    exact = dense_error(W, A, privacy)
    assert privacy.noise_variance(1.0) * value == pytest.approx(exact, rel=1e-8)
    assert float(hdmm.expected_error(W, A, privacy)) == pytest.approx(exact, rel=1e-8)
    assert exact <= dense_error(W, hdmm.Identity(30), privacy) * (1 + 1e-9)
    assert exact >= hdmm.svd_bound(W, privacy).value * (1 - 1e-9)


def test_opt_kron_warms_only_its_first_round_under_laplace_with_several_attributes(monkeypatch):
    import hdmm.optimizers.kron as K
    calls = []
    real = K.optimize_pidentity

    def spy(*args, l2_warmup=0, **kwargs):
        calls.append((kwargs.get("start") is None, l2_warmup))
        return real(*args, l2_warmup=l2_warmup, **kwargs)

    monkeypatch.setattr(K, "optimize_pidentity", spy)
    dom = hdmm.Domain(["x", "y"], [12, 10])
    W = hdmm.union([hdmm.product(dom, {"x": hdmm.Prefix(12)}), hdmm.product(dom, {"y": hdmm.Prefix(10)}),
                    hdmm.product(dom, {"x": hdmm.Prefix(12), "y": hdmm.Prefix(10)})])
    opt_kron_union(kron_union(W), LAPLACE, rng=np.random.default_rng(0))
    assert calls[:2] == [(True, K.L2_WARMUP)] * 2 and len(calls) > 2
    assert all(warmup == 0 and not cold for cold, warmup in calls[2:])  # later rounds start warm
    calls.clear()
    opt_kron_union(kron_union(hdmm.Prefix(12)), LAPLACE, rng=np.random.default_rng(0))
    assert calls == [(True, 0)]                                         # one attribute: no warm-up


def test_opt_marginals_gradient_matches_autograd():
    W = hdmm.union([hdmm.AllMarginals((3, 4, 2), 2), hdmm.product((3, 4, 2), {0: hdmm.Prefix(3)})])
    problem = MarginalsProblem(kron_union(W))
    Z = problem.Z.toarray()
    live = problem.tau > 0

    def reference(theta, norm):
        F = anp.sum(problem.tau[live] / anp.dot(Z, theta**2)[live])
        return (anp.sum(theta) if norm == 1 else anp.sqrt(anp.sum(theta**2))) ** 2 * F

    theta = np.random.default_rng(4).random(problem.members.shape[0]) + 0.1
    for norm in (1, 2):
        value, gradient = problem.objective(theta, norm)
        assert value == pytest.approx(reference(theta, norm), rel=1e-12)
        np.testing.assert_allclose(gradient, grad(reference)(theta, norm), rtol=1e-9)


@pytest.mark.parametrize("d", [12, 13])
def test_opt_marginals_never_loses_to_the_identity_on_many_attributes(d):
    # beyond 12 attributes the candidates are the workload's closure, and the full cube must be
    # one (without it OPT_M can lose badly to the identity); up to 12 all subsets are candidates
    dom = hdmm.Domain([f"x{i}" for i in range(d)], [2] * d)
    W = hdmm.union([hdmm.DimKMarginals(dom, k) for k in range(4)])
    A = opt_marginals(W, seed=0)
    assert hdmm.expected_error(W, A, LAPLACE) < hdmm.expected_error(W, hdmm.Identity(dom.size), LAPLACE)


@pytest.mark.parametrize("norm, privacy", [(1, LAPLACE), (2, GAUSS)])
def test_opt_marginals_error_is_exact_even_outside_the_marginals_algebra(norm, privacy):
    dom = (3, 4, 2)
    W = hdmm.union([hdmm.AllMarginals(dom, 1), hdmm.product(dom, {0: hdmm.Prefix(3), 1: hdmm.AllRange(4)})])
    A, value = opt_marginals_strategy(W, privacy, 2, np.random.default_rng(0))
    assert A.sensitivity(norm) == pytest.approx(1.0)
    assert privacy.noise_variance(1.0) * value == pytest.approx(dense_error(W, A, privacy), rel=1e-7)


def test_residual_strategy_reaches_the_svd_bound_on_marginals():
    W = hdmm.union([hdmm.DimKMarginals((3, 4, 5, 2), 2), Marginal((3, 4, 5, 2), (0, 1, 2))], weights=[1, 3])
    A, value = residual_strategy(W)
    bound = hdmm.svd_bound(W, GAUSS)
    assert bound.exact
    assert A.sensitivity(2) == pytest.approx(1.0)
    assert GAUSS.noise_variance(1.0) * value == pytest.approx(bound.value, rel=1e-9)
    assert float(hdmm.expected_error(W, A, GAUSS)) == pytest.approx(dense_error(W, A, GAUSS), rel=1e-8)


def test_residual_strategy_never_beats_the_bound_outside_the_algebra():
    W = hdmm.union([hdmm.product((5, 4), {0: hdmm.Prefix(5)}), hdmm.product((5, 4), {1: hdmm.AllRange(4)})])
    A, value = residual_strategy(W)
    exact = dense_error(W, A, GAUSS)
    assert GAUSS.noise_variance(1.0) * value == pytest.approx(exact, rel=1e-8)
    assert exact >= hdmm.svd_bound(W, GAUSS).value


def test_residual_strategy_plans_100_attributes_quickly():
    dom = hdmm.Domain([f"x{i}" for i in range(100)], [2 + i % 4 for i in range(100)])
    A, value = residual_strategy(hdmm.AllMarginals(dom, 3))
    assert A.members.shape[0] == 166_751
    assert np.isfinite(value)


@pytest.mark.parametrize("norm", [1, 2])
def test_budget_split_is_optimal(norm):
    errors = np.array([3.0, 1.0, 10.0, 0.5])
    w, bound = budget_split(errors, norm)
    assert (w.sum() if norm == 1 else w @ w) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        v = np.abs(w + 0.05 * rng.normal(size=w.size))
        v /= v.sum() if norm == 1 else np.sqrt(v @ v)
        assert np.sum(errors / v**2) >= bound * (1 - 1e-12)


@pytest.mark.parametrize("norm, privacy", [(1, LAPLACE), (2, GAUSS)])
def test_opt_union_bound_is_an_upper_bound_and_supports(norm, privacy):
    dom = (6, 5)
    W = hdmm.union([hdmm.product(dom, {0: hdmm.Prefix(6)}), hdmm.product(dom, {1: hdmm.AllRange(5)})])
    union = kron_union(W)
    A, bound = opt_union_groups(union, [np.array([0]), np.array([1])], privacy, rng=np.random.default_rng(0))
    assert A.sensitivity(norm) == pytest.approx(1.0)
    exact = dense_error(W, A, privacy)
    assert np.isfinite(exact)
    assert exact <= privacy.noise_variance(1.0) * bound * (1 + 1e-9)


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS])
def test_optimize_judges_opt_union_by_its_exact_error_on_small_domains(privacy):
    # OPT_+'s bound is well above its exact error here: judged by the bound, optimize would keep a
    # worse strategy
    dom = hdmm.Domain(["a", "b", "c"], [6, 5, 4])
    W = hdmm.union([hdmm.product(dom, {"b": IdentityTotal(5), "c": hdmm.Prefix(4)}),
                    hdmm.product(dom, {"a": hdmm.Identity(6), "c": hdmm.AllRange(4)})])
    result = hdmm.optimize(W, privacy, seed=0)
    row = result.report.set_index("optimizer").loc["opt_union"]
    union_only = hdmm.optimize(W, privacy, seed=0, optimizers=["opt_union"])
    assert bool(row["exact"])
    assert row["total squared error"] == pytest.approx(dense_error(W, union_only.strategy, privacy), rel=1e-8)
    assert float(result.error) == pytest.approx(result.report["total squared error"].min())


def test_zero_weight_terms_need_no_measurement():
    dom = hdmm.Domain(["a", "b"], [4, 5])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(4)}), hdmm.product(dom, {"b": hdmm.Identity(5)})],
                   weights=[1.0, 0.0])
    result = hdmm.optimize(W, LAPLACE, seed=0)
    assert float(result.error) == pytest.approx(dense_error(W, result.strategy, LAPLACE), rel=1e-9)
    assert np.isfinite(float(hdmm.expected_error(W, opt_union(W, seed=0), LAPLACE)))


@pytest.mark.parametrize("groups, match", [([[0]], "in no group"), ([[-1], [0]], "names term -1"),
                                           ([[0.5], [1]], "integer"), ([[5]], "names term 5"),
                                           ([[0], [1], [1]], "more than one group"), ([[]], "nonempty"),
                                           ([[0, 0], [1]], "more than once")])
def test_opt_union_rejects_groups_that_do_not_partition_the_terms(groups, match):
    dom = hdmm.Domain(["a", "b"], [4, 5])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(4)}), hdmm.product(dom, {"b": hdmm.Identity(5)})])
    with pytest.raises(ValueError, match=match):
        opt_union(W, groups=groups, seed=0)


@pytest.mark.parametrize("privacy", [LAPLACE, GAUSS])
def test_optimize_picks_the_best_candidate_and_round_trips(privacy, tmp_path):
    dom = hdmm.Domain(["a", "b", "c"], [4, 3, 5])
    W = hdmm.union([hdmm.AllMarginals(dom, 2), hdmm.product(dom, {"c": hdmm.Prefix(5)})])
    result = hdmm.optimize(W, privacy, seed=0)
    report = result.report
    assert set(report["optimizer"]) >= {"identity", "opt_kron", "opt_marginals", "opt_union"}
    assert float(result.error) == pytest.approx(report["total squared error"].min())
    assert float(result.error) <= float(hdmm.expected_error(W, hdmm.Identity(dom.size), privacy))
    assert (report["RMSE / SVD bound RMSE"].dropna() >= 1 - 1e-9).all()
    again = hdmm.optimize(W, privacy, seed=0)
    np.testing.assert_allclose(again.report["total squared error"], report["total squared error"])
    path = tmp_path / "strategy.npz"
    save_strategy(result.strategy, path, {"workload": "test"})
    loaded, meta = load_strategy(path)
    assert meta == {"workload": "test"}
    assert float(hdmm.expected_error(W, loaded, privacy)) == pytest.approx(float(result.error), rel=1e-12)


def test_bad_arguments_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="noise"):
        opt_kron(hdmm.Prefix(8), noise="gauss")
    with pytest.raises(ValueError, match="do not apply"):
        hdmm.optimize(hdmm.Prefix(8), LAPLACE, optimizers=["residual"])
    with pytest.raises(ValueError, match="Gaussian"):
        opt_residual(hdmm.Prefix(8), LAPLACE)
    with pytest.raises(TypeError):
        hdmm.optimize(np.eye(3), LAPLACE)
    path = tmp_path / "not_a_strategy.npz"
    np.savez(path, x=np.zeros(2))
    with pytest.raises(ValueError, match="strategy file"):
        load_strategy(path)
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(ValueError, match="not a numpy .npz archive"):
        load_strategy(tmp_path / "text.npz")
    with pytest.raises(ValueError, match="workload is zero"):
        hdmm.optimize(Explicit(np.zeros((3, 4))), LAPLACE)
    with pytest.raises(ValueError, match="optimizers is empty"):
        hdmm.optimize(hdmm.Prefix(8), LAPLACE, optimizers=[])
    with pytest.raises(ValueError, match="p must be an integer >= 0"):
        opt0(hdmm.Prefix(8), p=-1)
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="restarts must be an integer >= 1"):
            opt_kron(hdmm.Prefix(8), restarts=bad)


def test_every_optimizer_takes_the_privacy_and_seed_and_optimize_takes_one_name(tmp_path):
    W = hdmm.AllMarginals((2, 3))
    for optimizer in (opt0, opt_kron, opt_union, opt_marginals, opt_residual):
        for privacy in (GAUSS, hdmm.ApproxDP(1.0, 1e-6)):
            A = optimizer(W, privacy, seed=1)
            assert A.sensitivity(2) == pytest.approx(1.0)
            assert np.isfinite(float(hdmm.expected_error(W, A, privacy)))
    assert hdmm.optimize(W, LAPLACE, seed=0, optimizers="opt_kron").optimizer == "opt_kron"


def test_an_optimization_result_saves_with_its_privacy_and_error(tmp_path):
    W = hdmm.Prefix(16)
    result = hdmm.optimize(W, LAPLACE, seed=0)
    path = tmp_path / "no_suffix"
    save_strategy(result, path, {"table": "P1"})
    A, meta = load_strategy(path)
    assert meta == {"privacy": LAPLACE.to_dict(), "optimizer": result.optimizer,
                    "total_squared_error": float(result.error), "queries": 16, "table": "P1"}
    assert Privacy.from_dict(meta["privacy"]) == LAPLACE
    assert float(hdmm.expected_error(W, A, LAPLACE)) == pytest.approx(float(result.error), rel=1e-12)
    buffer = io.BytesIO()
    save_strategy(result, buffer)
    buffer.seek(0)
    assert float(hdmm.expected_error(W, load_strategy(buffer)[0], LAPLACE)) == pytest.approx(float(result.error))


def test_optimize_reports_progress_as_a_bar_or_to_a_callable(capsys):
    W = hdmm.product(hdmm.Domain(["x", "y"], [6, 5]), {"x": hdmm.Prefix(6), "y": hdmm.AllRange(5)})
    lines = []
    hdmm.optimize(W, LAPLACE, seed=0, progress=lines.append)
    assert any(line.startswith("OPT_(x) round 1") for line in lines)
    assert any(line.startswith("opt_marginals: total squared error") for line in lines)
    hdmm.optimize(W, LAPLACE, seed=0, progress=True)
    assert "optimize: " in capsys.readouterr().err


def test_the_convex_program_reports_each_newton_step():
    lines = []
    A = opt0(hdmm.WidthKRange(64, 4), GAUSS, progress=lines.append)
    steps = [line for line in lines if line.startswith("convex program on 64 values: Newton step")]
    assert steps
    assert A.sensitivity(2) == pytest.approx(1.0)


def test_a_saved_kronecker_strategy_keeps_its_attribute_names_and_labels(tmp_path):
    dom = hdmm.Domain(["sex", "age"], [2, 8])
    A = hdmm.strategies.kronecker_baseline(dom, {"age": hdmm.strategies.hb(8)})
    save_strategy(A, tmp_path / "kron.npz")
    loaded, _ = load_strategy(tmp_path / "kron.npz")
    assert loaded.names == A.names == ("sex", "age")
    assert list(loaded.labels) == list(A.labels)


def test_kronecker_labels_that_make_no_domain_are_not_attribute_names():
    for names in ([1, 2], ["age", "age"], ["", "b"]):
        W = Kronecker([hdmm.Prefix(4), hdmm.Identity(3)], names=names)
        assert opt_marginals(W, seed=0).domain.shape == (4, 3)


def test_marginal_strategies_keep_the_workloads_attribute_names():
    dom = hdmm.Domain(["sex", "age"], [2, 8])
    W = hdmm.union([hdmm.product(dom, {"age": hdmm.Prefix(8)}), hdmm.product(dom, {"sex": hdmm.Identity(2)})],
                   weights=[1, 2])
    assert opt_marginals(W, seed=0).domain == dom
    assert opt_residual(W).domain == dom


def test_opt_union_by_default_keeps_the_better_of_its_groups_and_one_kronecker_strategy():
    # one group per marginal shares nothing between groups: 3.8x the identity's error here
    W = hdmm.AllMarginals((4, 6, 5))
    assert hdmm.expected_error(W, opt_union(W, seed=1), LAPLACE) <= 1920 * (1 + 1e-9)  # the identity's
    # ... while cyclic range x identity terms gain from groups (judged by exact error, not the bound)
    dom = hdmm.Domain(["a", "b", "c"], [8, 8, 8])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.AllRange(8), "b": hdmm.Identity(8)}),
                    hdmm.product(dom, {"b": hdmm.AllRange(8), "c": hdmm.Identity(8)}),
                    hdmm.product(dom, {"c": hdmm.AllRange(8), "a": hdmm.Identity(8)})])
    grouped = hdmm.expected_error(W, opt_union(W, groups=[[0], [1], [2]], seed=0), LAPLACE)
    assert hdmm.expected_error(W, opt_union(W, seed=0), LAPLACE) <= grouped * (1 + 1e-9)
    assert grouped < hdmm.expected_error(W, opt_kron(W, seed=0), LAPLACE)


def test_opt_union_groups_take_lists():
    union = kron_union(hdmm.union([hdmm.Prefix(8), hdmm.Identity(8)]))
    A, bound = opt_union_groups(union, [[0], [1]], LAPLACE, rng=np.random.default_rng(0))
    assert np.isfinite(bound) and A.sensitivity(1) == pytest.approx(1.0)


def test_opt_kron_reaches_the_published_sf1_error():
    # tutorial seed: optimized for SF1 at epsilon = 1, average per-query error 7.28 on SF1
    from census_workloads import sf1_persons

    W = sf1_persons()
    # p-Identity's random starts move the result by about 0.5% from seed to seed (7.28 to 7.31): the
    # best of three seeds reaches the published figure
    assert min(float(hdmm.rmse(W, opt_kron(W, seed=seed), LAPLACE)) for seed in (0, 1, 2)) <= 7.285


# ---------------------------------------------------------------- exchangeable Grams and scale invariance
@pytest.mark.parametrize("n", [2, 5, 16, 40, 75])
@pytest.mark.parametrize("a,b", [(1.0, 0.01), (1.0, 1.0), (1.0, 10.0), (0.0, 1.0)])
def test_the_identity_with_a_total_row_is_exact_and_no_worse_than_a_p_identity_search(n, a, b):
    from hdmm.optimizers.kron import identity_and_total
    from hdmm.optimizers.pidentity import default_p, optimize_pidentity
    G = a * np.eye(n) + b * np.ones((n, n))
    A = identity_and_total(n, a, b)
    X = A.dense().T @ A.dense()
    exact = np.trace(np.linalg.solve(X, G))
    assert np.abs(A.dense()).sum(axis=0).max() == pytest.approx(1.0)
    _, searched = optimize_pidentity(Explicit(G), default_p(n), 1, 8, np.random.default_rng(0))
    assert exact <= searched * (1 + 1e-6)


def test_exchangeable_grams_are_recognised_and_others_are_not():
    from hdmm.optimizers.kron import exchangeable_parts
    n = 7
    assert exchangeable_parts(Explicit(2 * np.eye(n) + 3 * np.ones((n, n)))) == pytest.approx((2.0, 3.0))
    assert exchangeable_parts(hdmm.Identity(n).gram()) == pytest.approx((1.0, 0.0))
    assert exchangeable_parts(hdmm.Prefix(n).gram()) is None
    G = np.eye(n) + np.ones((n, n))
    G[0, 1] = G[1, 0] = 1.5  # equal row sums and diagonal are not enough
    G[0, 2] = G[2, 0] = 0.5
    assert exchangeable_parts(Explicit(G)) is None


@pytest.mark.parametrize("scale", [1e-9, 1.0, 1e9])
def test_the_p_identity_search_does_not_depend_on_the_grams_scale(scale):
    from hdmm.optimizers.pidentity import optimize_pidentity
    G = hdmm.AllRange(32).gram()
    T1, v1 = optimize_pidentity(G, 4, 1, 3, np.random.default_rng(0))
    T2, v2 = optimize_pidentity(hdmm.matrix.Weighted(G, scale), 4, 1, 3, np.random.default_rng(0))
    assert v2 / scale == pytest.approx(v1, rel=1e-9)
    np.testing.assert_allclose(T2, T1, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("norm", [1, 2])
def test_the_batched_opt_m_objective_equals_the_single_one_column_by_column(norm):
    W = hdmm.union([hdmm.AllMarginals((3, 4, 2), 2), Kronecker([hdmm.Prefix(3), hdmm.Identity(4), hdmm.Total(2)])])
    problem = MarginalsProblem(kron_union(W))
    rng = np.random.default_rng(0)
    theta = rng.random((problem.members.shape[0], 5))
    theta[:, 4] = 0.0  # no support: infinite
    values, grads = problem.objectives(theta, norm)
    for j in range(4):
        value, grad = problem.objective(theta[:, j], norm)
        assert values[j] == pytest.approx(value, rel=1e-12)
        np.testing.assert_allclose(grads[:, j], grad, rtol=1e-10, atol=1e-14 * np.abs(grad).max())
    assert values[4] == np.inf


def test_opt_m_with_screened_starts_reaches_the_optimum_of_every_seed():
    dom = hdmm.Domain.from_dict({"age": 75, "education": 16, "race": 5, "sex": 2, "hours": 20})
    W = hdmm.DimKMarginals(dom, 2)
    values = {opt_marginals_strategy(W, hdmm.PureDP(1.0), None, np.random.default_rng(seed))[1] for seed in range(3)}
    assert max(values) == pytest.approx(min(values), rel=1e-6)
