"""Releases that build on earlier ones: generalized least squares over every measurement so far."""

from __future__ import annotations

import numpy as np
import pytest

import hdmm
import hdmm.kernel
import hdmm.release
from hdmm.matrix import DenseLimitError, Explicit, Kronecker, VStack
from hdmm.privacy import ZCDP, ApproxDP, PureDP
from hdmm.release import Release

TIGHT = {"tol": 1e-10, "maxiter": 10_000}  # LSMR run to convergence, to compare with dense numpy


def _gls(releases):
    """Dense numpy GLS over every measurement: (estimate, pinv of B^T B)."""
    B = np.vstack([m.strategy.dense() / m.noise_std for r in releases for m in [r.measurement]])
    b = np.concatenate([r.measurement.answers / r.measurement.noise_std for r in releases])
    return np.linalg.pinv(B) @ b, np.linalg.pinv(B.T @ B)


@pytest.mark.parametrize("privacies", [(PureDP(1.0), ZCDP(0.3)), (ApproxDP(1.0, 1e-6), PureDP(0.5)),
                                       (ZCDP(0.2), ZCDP(0.8))])
def test_prior_release_is_dense_gls(privacies):
    rng = np.random.default_rng(1)
    n = 12
    x = rng.integers(0, 30, n).astype(float)
    W1, W2 = hdmm.Prefix(n), hdmm.AllRange(n)
    A1, A2 = Explicit(rng.normal(size=(9, n))), Explicit(np.abs(rng.normal(size=(15, n))))
    r1 = hdmm.run(W1, x, privacies[0], strategy=VStack([A1, hdmm.Identity(n)]), rng=2)
    r2 = hdmm.run(W2, x, privacies[1], strategy=A2, rng=3, prior=r1, reconstruct_options=TIGHT)
    estimate, cov = _gls([r1, r2])
    W1d, W2d = W1.dense(), W2.dense()
    assert r2.variance_exact
    np.testing.assert_allclose(r2.answers, W2d @ estimate, rtol=1e-7, atol=1e-7 * np.max(r2.std_errors))
    np.testing.assert_allclose(r2.variances, np.einsum("ij,jk,ik->i", W2d, cov, W2d), rtol=1e-8)
    again = r2.answer(W1)
    np.testing.assert_allclose(again.answers, W1d @ estimate, rtol=1e-7, atol=1e-7 * np.max(again.std_errors))
    np.testing.assert_allclose(again.std_errors**2, np.einsum("ij,jk,ik->i", W1d, cov, W1d), rtol=1e-8)
    assert again.variance_exact and len(again.table()) == n


def test_overlapping_answers_agree_and_errors_shrink():
    n = 16
    x = np.arange(n, dtype=float) * 3
    W1 = hdmm.Prefix(n)
    W2 = hdmm.union([hdmm.Prefix(n), hdmm.Total(n), hdmm.Identity(n)])
    r1 = hdmm.run(W1, x, ZCDP(0.5), strategy=hdmm.strategies.hb(n), rng=4)
    r2 = hdmm.run(W2, x, ZCDP(0.5), strategy=hdmm.Identity(n), rng=5, prior=r1, reconstruct_options=TIGHT)
    again = r2.answer(W1)
    np.testing.assert_allclose(again.answers, r2.answers[:n], rtol=1e-9, atol=1e-9)  # the same queries agree
    total = r2.answer(hdmm.Total(n)).answers[0]
    np.testing.assert_allclose(total, r2.answers[n], rtol=1e-9)
    assert np.all(again.std_errors <= r1.std_errors * (1 + 1e-9)) and again.rmse < 0.95 * r1.rmse
    assert np.all(r2.std_errors <= r2.plan.std_errors * (1 + 1e-9)) and r2.rmse < r2.plan.rmse
    assert r2.answer(W1).provenance["prior"] == r1.provenance()


def test_the_error_shrinks_empirically():
    n, reps = 8, 300
    x = np.full(n, 10.0)
    W1, W2 = hdmm.Prefix(n), hdmm.Identity(n)
    alone, combined = [], []
    for seed in range(reps):
        r1 = hdmm.run(W1, x, ZCDP(0.5), strategy=hdmm.Identity(n), rng=seed)
        r2 = hdmm.run(W2, x, ZCDP(0.5), strategy=hdmm.strategies.hb(n), rng=10_000 + seed, prior=r1)
        alone.append(r1.answers - W1.dense() @ x)
        combined.append(r2.answer(W1).answers - W1.dense() @ x)
    expected = r2.answer(W1).std_errors
    observed = np.sqrt(np.mean(np.square(combined), axis=0))
    assert np.sqrt(np.mean(np.square(combined))) < 0.9 * np.sqrt(np.mean(np.square(alone)))
    np.testing.assert_allclose(observed, expected, rtol=0.25)  # 300 replicates: a few % sampling error


def test_the_same_strategy_measured_twice_averages_exactly_at_any_size():
    dom = hdmm.Domain(["a", "b", "c"], [60, 50, 40])  # 120,000 cells: no dense fall-back
    W = hdmm.product(dom, {"a": hdmm.Prefix(60), "c": hdmm.Identity(40)})
    A = Kronecker([hdmm.strategies.hb(60), hdmm.Identity(50), hdmm.Identity(40)])
    x = np.random.default_rng(0).integers(0, 3, dom.size).astype(float)
    plan = hdmm.plan(W, A, ZCDP(0.5))
    r1 = hdmm.run(W, x, ZCDP(0.5), strategy=plan, rng=1)
    r2 = hdmm.run(W, x, ZCDP(0.5), strategy=plan, rng=2, prior=r1)
    assert r2.combined.method == "kronecker" and r2.variance_exact and len(r2.combined.groups) == 1
    np.testing.assert_allclose(r2.variances, plan.variances / 2, rtol=1e-12)
    mean = (r1.measurement.answers + r2.measurement.answers) / 2
    np.testing.assert_allclose(r2.answers, W @ (plan.structure.kronecker.pinv() @ mean), rtol=1e-9, atol=1e-9)


def test_marginals_measurements_combine_exactly_on_a_large_domain():
    dom = hdmm.Domain(["a", "b", "c"], [40, 30, 20])
    x = np.random.default_rng(0).integers(0, 3, dom.size).astype(float)
    W1, W2 = hdmm.DimKMarginals(dom, 2), hdmm.DimKMarginals(dom, 1)
    r1 = hdmm.run(W1, x, ZCDP(0.5), strategy=W1, rng=1)
    r2 = hdmm.run(W2, x, PureDP(1.0), strategy=hdmm.product(dom, {"a": hdmm.Identity(40)}), rng=2, prior=r1)
    assert r2.combined.method == "marginals" and r2.variance_exact
    assert np.all(r2.std_errors <= r1.answer(W2).std_errors * (1 + 1e-9))
    assert r2.answer(W1).variance_exact


def test_variances_are_upper_bounds_where_no_exact_route_applies(monkeypatch):
    n = 20
    x = np.arange(n, dtype=float)
    W = hdmm.union([hdmm.Prefix(n), hdmm.Identity(n)])
    r1 = hdmm.run(W, x, ZCDP(0.5), strategy=hdmm.Identity(n), rng=1)
    # three unrelated Grams (the identity's and two random ones) do not diagonalise together, so no
    # hdmm.union_gram route either (two always would)
    A2, A3 = (Explicit(np.random.default_rng(seed).normal(size=(8, n))) for seed in (3, 4))
    r2 = hdmm.run(W, x, ZCDP(0.5), strategy=A2, rng=2, prior=r1)
    exact = hdmm.run(W, x, ZCDP(0.5), strategy=A3, rng=3, prior=r2)
    assert hdmm.error.exact_route(W, exact.combined.stacked) == "dense"
    monkeypatch.setattr(hdmm.release, "DENSE_LIMIT", 10)  # no dense inverse: bounds only
    bounded = hdmm.run(W, x, ZCDP(0.5), strategy=A3, rng=3, prior=r2)
    assert exact.variance_exact and not bounded.variance_exact
    assert np.all(bounded.variances >= exact.variances * (1 - 1e-9))
    np.testing.assert_allclose(bounded.variances, r1.variances, rtol=1e-12)  # the identity alone, here
    assert "upper bounds" in bounded.interval_method + bounded.provenance()["standard_errors"]


def test_only_the_new_measurement_is_charged():
    b = hdmm.Budget(ZCDP(1.0))
    x = np.ones(6)
    r1 = hdmm.run(hdmm.Prefix(6), x, ZCDP(0.25), strategy=hdmm.Identity(6), rng=1, budget=b)
    r2 = hdmm.run(hdmm.Prefix(6), x, PureDP(0.5), strategy=hdmm.Identity(6), rng=2, budget=b, prior=r1)
    assert [c.cost for c in b.charges] == [0.25, 0.125] and b.spent == 0.375
    assert r2.provenance()["charge"]["charge"] == 0.125
    assert r2.provenance()["prior"]["charge"]["charge"] == 0.25


def test_refusals_come_before_any_noise(monkeypatch):
    n = 6
    first = hdmm.run(hdmm.Prefix(n), np.ones(n), ZCDP(0.5), strategy=hdmm.Identity(n), rng=1)
    totals = hdmm.run(hdmm.Total(n), np.ones(n), ZCDP(0.5), strategy=hdmm.Total(n), rng=0)
    calls = []
    monkeypatch.setattr(hdmm.kernel, "draw", lambda *a, **k: calls.append(a))
    b = hdmm.Budget(ZCDP(1.0))
    with pytest.raises(ValueError, match="same domain"):
        hdmm.run(hdmm.Prefix(n + 1), np.ones(n + 1), ZCDP(0.5), strategy=hdmm.Identity(n + 1), prior=first, budget=b)
    # a strategy that supports the workload only together with the prior: fine; with nothing: refused
    few = Explicit(np.ones((1, n)))
    with pytest.raises(ValueError, match="do not support"):
        hdmm.run(hdmm.Prefix(n), np.ones(n), ZCDP(0.5), strategy=few, prior=totals, budget=b)
    with pytest.raises(TypeError, match="prior must be"):
        hdmm.run(hdmm.Prefix(n), np.ones(n), ZCDP(0.5), prior=first.measurement)
    assert not calls and not b.charges


def test_a_strategy_need_only_support_the_workload_together_with_the_prior():
    n = 6
    x = np.arange(n, dtype=float)
    r1 = hdmm.run(hdmm.Identity(n), x, ZCDP(0.5), strategy=hdmm.Identity(n), rng=1)
    r2 = hdmm.run(hdmm.Prefix(n), x, ZCDP(0.5), strategy=hdmm.Total(n), rng=2, prior=r1)
    assert r2.plan.variances is None and np.all(np.isfinite(r2.std_errors)) and r2.variance_exact
    assert "measurement alone" not in r2.summary() and "2 measurements" in r2.summary()


def test_a_release_with_a_prior_saves_loads_and_builds_further(tmp_path):
    n = 10
    x = np.arange(n, dtype=float)
    r1 = hdmm.run(hdmm.Prefix(n), x, PureDP(1.0), strategy=hdmm.Identity(n), rng=1)
    r2 = hdmm.run(hdmm.AllRange(n), x, ZCDP(0.5), strategy=hdmm.strategies.hb(n), rng=2, prior=r1,
                  budget=hdmm.Budget(ZCDP(1.0)), postprocess="nonnegative")
    r2.save(tmp_path / "r2.npz")
    loaded = Release.load(tmp_path / "r2.npz")
    assert len(loaded.measurements) == 2 and loaded.charge == r2.charge
    np.testing.assert_allclose(loaded.variances, r2.variances, rtol=1e-12)
    np.testing.assert_allclose(loaded.answer(hdmm.Prefix(n)).answers, r2.answer(hdmm.Prefix(n)).answers)
    assert loaded.provenance()["prior"] == r1.provenance()
    assert np.all(r2.answers >= -1e-9) and r2.postprocess_change >= 0
    r3 = hdmm.run(hdmm.Prefix(n), x, ZCDP(0.5), strategy=hdmm.Identity(n), rng=3, prior=loaded)
    assert len(r3.measurements) == 3 and r3.provenance()["prior"]["prior"] == r1.provenance()
    assert np.all(r3.std_errors < loaded.answer(hdmm.Prefix(n)).std_errors)


def test_a_release_file_with_an_edited_earlier_measurement_is_refused(tmp_path):
    import json
    import zipfile

    n = 5
    r1 = hdmm.run(hdmm.Prefix(n), np.ones(n), PureDP(1.0), strategy=hdmm.Identity(n), rng=1)
    r2 = hdmm.run(hdmm.Prefix(n), np.ones(n), PureDP(1.0), strategy=hdmm.Identity(n), rng=2, prior=r1)
    r2.save(tmp_path / "r2.npz")
    with zipfile.ZipFile(tmp_path / "r2.npz") as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    header = np.load(tmp_path / "r2.npz")["header"]
    info = json.loads(str(header))
    info["release"]["prior"]["measurements"][0]["sensitivity"] = 0.001  # claims far less noise
    with zipfile.ZipFile(tmp_path / "bad.npz", "w") as archive:
        for name, data in members.items():
            if name != "header.npy":
                archive.writestr(name, data)
        import io
        buffer = io.BytesIO()
        np.save(buffer, np.array(json.dumps(info)))
        archive.writestr("header.npy", buffer.getvalue())
    with pytest.raises(ValueError, match="earlier measurement 1.*sensitivity"):
        Release.load(tmp_path / "bad.npz")


def test_answer_refuses_unsupported_and_foreign_workloads():
    n = 6
    r = hdmm.run(hdmm.Total(n), np.ones(n), ZCDP(0.5), strategy=hdmm.Total(n), rng=1)
    with pytest.raises(ValueError, match="do not support"):
        r.answer(hdmm.Identity(n))
    with pytest.raises(ValueError, match="columns"):
        r.answer(hdmm.Identity(n + 1))
    assert r.answer(VStack([hdmm.Total(n), hdmm.Total(n)])).answers.shape == (2,)


def test_dense_variances_by_column_blocks_when_the_workload_is_too_large_to_form(monkeypatch):
    dom = hdmm.Domain(["a", "b"], [6, 7])
    W = hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(6)}), hdmm.DimKMarginals(dom, 1)])
    X = np.random.default_rng(0).normal(size=(42, 42))
    X = X @ X.T
    expected = np.einsum("ij,jk,ik->i", W.dense(), X, W.dense())

    def refuse(self, X):
        raise DenseLimitError("too large")

    monkeypatch.setattr(type(W), "quadratic_diag", refuse)
    monkeypatch.setattr(hdmm.release, "QUADRATIC_BLOCK", 5)
    np.testing.assert_allclose(hdmm.release._quadratic_diag(W, X), expected, rtol=1e-10)


def test_combined_variances_are_exact_through_union_gram_without_a_dense_inverse(monkeypatch):
    # two Kronecker strategies on three attributes: two Grams per attribute always diagonalise together
    dom = hdmm.Domain(["a", "b", "c"], [6, 5, 4])
    x = np.arange(dom.size, dtype=float) % 7
    W1 = hdmm.product(dom, {"a": hdmm.Prefix(6), "b": hdmm.Identity(5)})
    W2 = hdmm.union([W1, hdmm.product(dom, {"a": hdmm.Identity(6), "c": hdmm.Identity(4)}),
                     hdmm.product(dom, {"b": hdmm.Prefix(5)})])
    A1 = Kronecker([hdmm.Prefix(6), hdmm.Identity(5), hdmm.Total(4)])
    A2 = Kronecker([hdmm.Identity(6), VStack([hdmm.Identity(5), hdmm.Total(5)]), hdmm.Identity(4)])
    monkeypatch.setattr(hdmm.release, "DENSE_LIMIT", 10)  # no dense inverse of B^T B: union_gram or bounds
    r1 = hdmm.run(W1, x, ZCDP(0.5), strategy=A1, rng=1)
    r2 = hdmm.run(W2, x, PureDP(1.0), strategy=A2, rng=2, prior=r1)
    assert hdmm.error.exact_route(W2, r2.combined.stacked) == "union"
    assert r2.variance_exact
    _, cov = _gls([r1, r2])
    W2d = W2.dense()
    np.testing.assert_allclose(r2.variances, np.einsum("ij,jk,ik->i", W2d, cov, W2d), rtol=1e-8)
    again = r2.answer(W1)
    assert again.variance_exact
    np.testing.assert_allclose(again.std_errors**2, np.einsum("ij,jk,ik->i", W1.dense(), cov, W1.dense()),
                               rtol=1e-8)
    # no worse than either measurement alone
    assert np.all(again.std_errors <= r1.std_errors * (1 + 1e-9))
