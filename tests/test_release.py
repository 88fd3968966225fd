"""End-to-end releases (hdmm.release.run): error statistics, inputs, post-processing, tables."""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.optimize import minimize

import hdmm
from hdmm import workload as wl
from hdmm.error import expected_error, per_query_variance
from hdmm.exact import quantize
from hdmm.matrix import Explicit, Identity, Kronecker, Ones, VStack, Weighted
from hdmm.privacy import ApproxDP, PureDP, ZCDP
from hdmm.structure import classify
from hdmm.planning import union_variance_bound
from hdmm.postprocess import nonnegative_least_squares, project_nonnegative, round_to_total
from hdmm.release import Release, run
from hdmm.io import workload_fingerprint
from hdmm.marginals import Marginal
from hdmm.optimizers import opt_kron, opt_marginals, opt_union
from strategies import SETTINGS

SHAPE = (16, 5, 3)
DOMAIN = hdmm.Domain(["a", "b", "c"], SHAPE)


def small_workload():
    return wl.union(
        [
            wl.product(DOMAIN, {"a": wl.Prefix(16), "b": Identity(5)}),
            wl.product(DOMAIN, {"b": wl.AllRange(5), "c": Identity(3)}),
            Marginal(DOMAIN, ("a", "c")),
        ],
        names=["prefix", "ranges", "marginal"],
    )


W_SMALL = small_workload()
X_SMALL = np.random.default_rng(7).poisson(4.0, W_SMALL.shape[1]).astype(float)


# ====================================================================== error statistics
def strategy_of(kind: str, privacy):
    if kind == "kronecker":
        return opt_kron(W_SMALL, privacy, seed=0)
    if kind == "union":
        return opt_union(W_SMALL, privacy, groups=[[0], [1], [2]], seed=0)
    return opt_marginals(W_SMALL, privacy, seed=0)


@pytest.mark.parametrize("privacy", [PureDP(1.0), ZCDP(0.5)], ids=["laplace", "gaussian"])
@pytest.mark.parametrize("kind", ["kronecker", pytest.param("union", marks=pytest.mark.slow), "marginals"])
def test_empirical_error_matches_expected_error(kind, privacy):
    A = strategy_of(kind, privacy)
    expected = expected_error(W_SMALL, A, privacy)
    truth = W_SMALL @ X_SMALL
    runs = 300
    errors, coverage = np.empty(runs), np.empty(runs)
    for r in range(runs):
        release = run(W_SMALL, X_SMALL, privacy, strategy=A, rng=1000 + r)
        errors[r] = np.sum((release.answers - truth) ** 2)
        lower, upper = release.intervals(0.9)
        coverage[r] = np.mean((lower <= truth) & (truth <= upper))
    assert release.method == {"kronecker": "kronecker", "union": "lsmr", "marginals": "marginals"}[kind]
    assert release.variance_exact
    assert release.expected_error == pytest.approx(float(expected), rel=1e-8)
    # the mean of `runs` independent squared errors, within 5 of its standard errors
    standard_error = errors.std(ddof=1) / math.sqrt(runs)
    assert abs(errors.mean() - expected) <= 5 * standard_error, (errors.mean(), float(expected), standard_error)
    if privacy.noise == "gaussian":  # exact intervals: coverage 0.9 on average over runs
        assert abs(coverage.mean() - 0.9) <= 5 * coverage.std(ddof=1) / math.sqrt(runs) + 1e-3


# ====================================================================== inputs
def test_dataframe_input_through_a_domain():
    dom = hdmm.Domain(["sex", "age"], [2, 10], values={"sex": ["M", "F"]})
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"sex": rng.choice(["M", "F"], 500), "age": rng.integers(0, 10, 500), "other": 1})
    W = wl.product(dom, {"sex": Identity(2), "age": wl.Prefix(10)})
    from_records = run(W, df, PureDP(1.0), strategy=Identity(20), domain=dom, rng=3)
    from_vector = run(W, dom.vectorize(df), PureDP(1.0), strategy=Identity(20), rng=3)
    np.testing.assert_array_equal(from_records.answers, from_vector.answers)
    assert from_records.table()["query"].iloc[0] == W.labels[0]
    assert W.labels[0].startswith("sex=M")
    with pytest.raises(ValueError, match="pass domain="):
        run(W, df, PureDP(1.0), strategy=Identity(20))
    with pytest.raises(ValueError, match="has 6 cells but the workload has 20"):
        run(W, df, PureDP(1.0), strategy=Identity(20), domain=hdmm.Domain(["sex", "age"], [2, 3]))
    with pytest.raises(ValueError, match="column 'age' holds codes"):
        run(W, df.assign(age=df["age"] + 5), PureDP(1.0), strategy=Identity(20), domain=dom)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"data": np.ones(5)}, ValueError, "5 entries but the domain has 240"),
        ({"data": -X_SMALL}, ValueError, "negative"),
        ({"data": np.r_[X_SMALL[:-1], np.nan]}, ValueError, "NaN"),
        ({"data": X_SMALL.reshape(16, 15)}, ValueError, "1-D"),
        ({"strategy": "best"}, ValueError, "strategy must be 'auto'"),
        ({"strategy": 3}, TypeError, "strategy must be"),
        ({"strategy": Identity(7)}, ValueError, "strategy has 7 columns but the workload has 240"),
        ({"strategy": Ones(1, 240)}, ValueError, "does not support the workload.*prefix"),
        ({"postprocess": "round"}, ValueError, "postprocess must be one of"),
        ({"method": "qr"}, ValueError, "unknown reconstruction method"),
        ({"method": "kronecker", "strategy": VStack([Identity(240), Ones(1, 240)])}, ValueError, "needs a \\(weighted\\) Kronecker"),
        ({"privacy": 1.0}, TypeError, "privacy must be"),
        ({"W": np.eye(240)}, TypeError, "workload must be an hdmm matrix"),
        ({"domain": "abc"}, TypeError, "domain must be an hdmm.Domain"),
        ({"rng": "seed"}, TypeError, "rng must be"),
    ],
)
def test_run_rejects_bad_input(kwargs, error, match):
    args = {"W": W_SMALL, "data": X_SMALL, "privacy": PureDP(1.0), "strategy": Identity(240), "rng": 0}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        run(**args)


def test_run_optimizes_and_accepts_optimization_results():
    auto = run(W_SMALL, X_SMALL, PureDP(1.0), rng=5)
    again = run(W_SMALL, X_SMALL, PureDP(1.0), rng=5)
    np.testing.assert_array_equal(auto.answers, again.answers)  # seeded: reproducible
    assert auto.optimizer in {"identity", "opt_kron", "opt_marginals", "opt_union"}
    assert auto.timings["plan"] > 0
    result = hdmm.optimize(W_SMALL, PureDP(1.0), seed=0)
    given_result = run(W_SMALL, X_SMALL, PureDP(1.0), strategy=result, rng=5)
    assert given_result.optimizer == result.optimizer  # and it measures the dyadic strategy:
    assert np.array_equal(given_result.strategy.dense(), quantize(result.strategy).dense())
    user = run(W_SMALL, X_SMALL, PureDP(1.0), strategy=result.strategy, rng=5)
    assert user.optimizer == "user"
    np.testing.assert_array_equal(user.answers, given_result.answers)
    with pytest.warns(UserWarning, match="optimised for laplace noise"):
        run(W_SMALL, X_SMALL, ZCDP(1.0), strategy=result, rng=5)


# ====================================================================== post-processing
def sparse_release(postprocess):
    x = np.zeros(240)
    x[::7] = 3.0
    A = opt_kron(W_SMALL, seed=0)
    return x, run(W_SMALL, x, PureDP(0.5), strategy=A, rng=11, postprocess=postprocess)


@pytest.mark.parametrize("postprocess", ["nonnegative", "integer"])
def test_postprocessing_keeps_the_total_and_reports_its_change(postprocess):
    _, plain = sparse_release(None)
    _, post = sparse_release(postprocess)
    assert plain.postprocess_change == 0.0
    np.testing.assert_array_equal(post.unprocessed_answers, plain.answers)  # same seed, same noise
    np.testing.assert_array_equal(post.std_errors, plain.std_errors)
    assert np.all(post.estimate >= 0) and np.any(plain.estimate < 0)
    total = plain.estimate.sum()
    if postprocess == "nonnegative":
        assert post.estimate.sum() == pytest.approx(total, rel=1e-9)
    else:
        np.testing.assert_array_equal(post.estimate, np.round(post.estimate))
        assert post.estimate.sum() == round(total)
    change = np.sqrt(np.mean((post.answers - plain.answers) ** 2))
    assert post.postprocess_change == pytest.approx(change) and change > 0
    assert "post-processing" in post.summary() and "unprocessed estimate" in post.summary()
    table = post.table()
    assert "unprocessed_answer" in table.columns
    np.testing.assert_array_equal(table["answer"], post.answers)


@pytest.mark.parametrize("kind", ["explicit", "kronecker"])
def test_nonnegative_least_squares_is_optimal(kind):
    rng = np.random.default_rng(3)
    if kind == "explicit":
        A = Explicit(np.abs(rng.standard_normal((9, 6))))
    else:  # the projection works with the strategy's Gram, its small factors' Grams made dense
        from hdmm.postprocess import _gram_operator

        A = Weighted(Kronecker([hdmm.Prefix(3), Explicit(np.array([[1.0], [2.0]])), hdmm.Total(2)]), 0.5)
        np.testing.assert_allclose(_gram_operator(A).dense(), A.dense().T @ A.dense(), atol=1e-12)
    D = A.dense()
    xhat = rng.standard_normal(6) + 0.3
    v = nonnegative_least_squares(A, xhat, noise_std=1.0, tol=1e-10)

    def f(u):
        return 0.5 * float(np.sum((D @ (u - xhat)) ** 2))

    ref = minimize(f, np.full(6, max(xhat.sum(), 0) / 6), method="SLSQP", bounds=[(0, None)] * 6,
                   constraints=[{"type": "eq", "fun": lambda u: u.sum() - max(xhat.sum(), 0)}], options={"ftol": 1e-15})
    assert np.all(v >= 0) and v.sum() == pytest.approx(max(xhat.sum(), 0))
    assert f(v) <= f(ref.x) + 1e-8


@SETTINGS
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=30), st.one_of(st.just(0.0), st.floats(1e-6, 100)))
def test_project_nonnegative_is_the_euclidean_projection(values, total):
    x = np.array(values)
    v = project_nonnegative(x, total)
    assert np.all(v >= 0) and v.sum() == pytest.approx(total, abs=1e-9 * max(1.0, total))
    # the sort-based formula (Duchi et al. 2008), computed independently
    u = np.sort(x)[::-1]
    css = np.cumsum(u) - total
    rho = np.flatnonzero(u - css / np.arange(1, x.size + 1) > 0)
    if total > 0:
        theta = css[rho[-1]] / (rho[-1] + 1)
        np.testing.assert_allclose(v, np.maximum(x - theta, 0), atol=1e-9 * max(1.0, np.abs(x).max()))
    assert np.all(project_nonnegative(x, -3.0) == 0)


@SETTINGS
@given(st.lists(st.floats(0, 20), min_size=1, max_size=40))
def test_round_to_total(values):
    x = np.array(values)
    r = round_to_total(x)
    np.testing.assert_array_equal(r, np.round(r))
    assert r.sum() == round(x.sum()) and np.all(np.abs(r - x) < 1)
    with pytest.raises(ValueError, match="non-negative"):
        round_to_total(np.array([-1.0, 2.0]))


# ====================================================================== the release object
def test_release_table_intervals_and_summary():
    A = opt_kron(W_SMALL, ZCDP(0.5), seed=0)
    release = run(W_SMALL, X_SMALL, ApproxDP(1.0, 1e-6), strategy=A, rng=2)
    assert isinstance(release, Release)
    table = release.table(level=0.9)
    assert list(table.columns) == ["table", "query", "answer", "std_error", "lower", "upper"]
    assert len(table) == W_SMALL.shape[0]
    assert list(table["query"]) == list(W_SMALL.labels)
    assert table["table"].iloc[0] == "prefix" and table["table"].iloc[-1] == "marginal"
    assert table.attrs["interval_method"] == "exact (Gaussian noise)" == release.interval_method
    lower, upper = release.intervals(0.9)
    np.testing.assert_allclose(upper - lower, 2 * 1.6448536269514722 * release.std_errors)
    np.testing.assert_allclose(release.std_errors**2, per_query_variance(W_SMALL, A, release.privacy))
    assert release.privacy_description == ApproxDP(1.0, 1e-6).description
    assert release.measurement.sensitivity == pytest.approx(A.sensitivity(2))
    text = release.summary()
    for piece in ["240 cells", "delta=1e-06", "from user", "reconstructed by kronecker", "seconds:"]:
        assert piece in text
    assert repr(release).startswith("Release(") and "RMSE" in repr(release)
    assert set(release.timings) >= {"plan", "measure", "reconstruct", "answer"}
    with pytest.raises(ValueError, match="level"):
        release.intervals(1.5)
    laplace = run(W_SMALL, X_SMALL, PureDP(1.0), strategy=A, rng=2)
    assert laplace.interval_method.startswith("normal approximation (Laplace")


def test_union_on_a_large_domain_has_conservative_standard_errors():
    dom = hdmm.Domain(["a", "b"], [100, 60])  # 6,000 cells: too many for a dense pseudo-inverse
    W = wl.union([wl.product(dom, {"a": wl.Prefix(100)}), wl.product(dom, {"b": Identity(60)})])
    A = VStack([Kronecker([wl.Prefix(100), Ones(1, 60)]), Kronecker([Ones(1, 100), Identity(60)]),
                0.5 * Kronecker([Identity(100), Identity(60)])])
    x = np.random.default_rng(0).poisson(2.0, dom.size).astype(float)
    release = run(W, x, PureDP(1.0), strategy=A, rng=0)
    assert not release.variance_exact and release.method == "lsmr"
    assert "conservative" in release.interval_method and "upper bound" in release.summary()
    assert np.all(np.isfinite(release.std_errors))
    # on a small domain the bound can be checked against the exact variance
    small = hdmm.Domain(["a", "b"], [10, 6])
    Ws = wl.union([wl.product(small, {"a": wl.Prefix(10)}), wl.product(small, {"b": Identity(6)})])
    As = VStack([Kronecker([wl.Prefix(10), Ones(1, 6)]), Kronecker([Ones(1, 10), Identity(6)]),
                 0.5 * Kronecker([Identity(10), Identity(6)])])
    exact = per_query_variance(Ws, As, PureDP(1.0))
    bound = union_variance_bound(Ws, classify(As)) * PureDP(1.0).noise_variance(As.sensitivity(1))
    assert np.all(bound >= exact * (1 - 1e-9)) and np.any(bound > exact * 1.01)


def test_sf1_smoke():
    from census_workloads import cph_domain, sf1_persons

    W, dom = sf1_persons(), cph_domain()
    x = np.random.default_rng(0).poisson(0.6, dom.size).astype(float)
    start = time.perf_counter()
    identity = run(W, x, PureDP(1.0), strategy=Identity(dom.size), rng=0)
    # a cheap rank-deficient Kronecker strategy: relationship is a total in every SF1 table
    kron = Kronecker([Identity(n) if name != "relationship" else Ones(1, n) for name, n in zip(dom.names, dom.shape)])
    totals = run(W, x, PureDP(1.0), strategy=kron, rng=0, postprocess="nonnegative")
    assert time.perf_counter() - start < 60
    for release in (identity, totals):
        table = release.table()
        assert len(table) == 4151 and list(table.columns[:2]) == ["table", "query"]
        assert table["table"].iloc[0] == "P1" and table["query"].iloc[0] == "P1: total"
        assert table["table"].iloc[-1] == "PCT12A-O"
        assert np.all(table["std_error"] > 0)
    assert totals.method == "kronecker" and totals.rmse < identity.rmse
    assert totals.estimate.min() >= 0
    assert abs(totals.answers[0] - x.sum()) < 10 * totals.std_errors[0] + 1


def test_a_release_saves_and_loads_with_its_provenance(tmp_path):
    release = run(W_SMALL, X_SMALL, ZCDP(0.5), strategy=hdmm.Identity(W_SMALL.shape[1]), rng=1,
                  postprocess="nonnegative")
    path = tmp_path / "release.npz"
    release.save(path)
    back = Release.load(path)
    np.testing.assert_array_equal(back.answers, release.answers)
    np.testing.assert_array_equal(back.std_errors, release.std_errors)
    np.testing.assert_array_equal(back.measurement.answers, release.measurement.answers)
    assert back.privacy == release.privacy and back.postprocess == "nonnegative"
    assert back.table().equals(release.table())
    provenance = release.provenance()
    assert provenance["privacy"] == {"type": "ZCDP", "rho": 0.5} and provenance["strategy_origin"] == "user"
    assert provenance["hdmm_version"] == hdmm.__version__
    assert release.table().attrs["provenance"] == provenance
    with pytest.raises(ValueError, match="not an hdmm release"):
        hdmm.plan(W_SMALL, hdmm.Identity(W_SMALL.shape[1]), ZCDP(0.5)).save(tmp_path / "p.npz") or Release.load(
            tmp_path / "p.npz")


def test_a_release_says_whether_its_noise_came_from_a_seed_and_keeps_no_data_timing(tmp_path):
    W = hdmm.Prefix(6)
    x = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    seeded = run(W, x, PureDP(1.0), rng=0)
    private = run(W, x, PureDP(1.0))
    assert seeded.seeded and seeded.measurement.seeded and not private.seeded
    assert seeded.provenance()["seeded"] is True and private.provenance()["seeded"] is False
    assert "from a seed" in seeded.summary() and "from a seed" not in private.summary()
    # the time taken to read the data grows with the (private) number of records: not kept in results or files
    assert "data" not in seeded.timings and "data" not in private.timings
    seeded.save(tmp_path / "r.hdmm")
    again = Release.load(tmp_path / "r.hdmm")
    assert again.seeded and again.provenance()["seeded"] is True
    later = run(W, x, PureDP(1.0), prior=again)                  # builds on a seeded release: says so too
    assert later.seeded and not later.measurement.seeded


def test_reported_errors_and_reconstruction_drop_the_same_weak_directions():
    # a factor with one singular value 1e-8 of the others: the error code treated that direction as unmeasured
    # while reconstruction inverted it, so the "exact" standard errors left out a variance 2,500 times larger
    rng = np.random.default_rng(8)
    U, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    V, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    F = Explicit(U @ np.diag([1, 1, 1, 1, 1, 1e-8]) @ V.T)
    A = Kronecker([F, Identity(2)])
    W = Kronecker([Explicit((V[:, 0] + 5e-7 * V[:, 5])[None, :]), Identity(2)])
    x = rng.integers(0, 20, 12).astype(float)
    answers = np.array([run(W, x, ZCDP(0.5), strategy=A, rng=seed).answers for seed in range(400)])
    reported = run(W, x, ZCDP(0.5), strategy=A, rng=0).std_errors
    assert np.allclose(answers.std(axis=0), reported, rtol=0.15)



def test_noise_from_a_secure_source_is_not_called_seeded():
    from hdmm.noise import RandomBits

    p = hdmm.plan(hdmm.Prefix(4), hdmm.Identity(4), PureDP(1.0))
    x = np.array([3.0, 1.0, 4.0, 1.0])
    assert not hdmm.measure(p, x, rng=RandomBits()).seeded and not hdmm.measure(p, x).seeded
    assert hdmm.measure(p, x, rng=3).seeded


# ====================================================================== files: checksums and provenance
def _edit(path, change):
    """Rewrite a release file with ``change(header, arrays)`` applied (the checksum left as it was)."""
    from hdmm.io import read_archive, write_archive

    header, arrays = read_archive(path)
    change(header, arrays)
    write_archive(path, header, arrays)


@pytest.mark.parametrize("postprocess", [None, "nonnegative"])
def test_a_release_file_with_edited_answers_is_refused(tmp_path, postprocess):
    # issue 22 item 8: 1000 added to the answers loaded, and answers and answer(W) then disagreed
    release = run(W_SMALL, X_SMALL, PureDP(1.0), strategy=Identity(W_SMALL.shape[1]), rng=1, postprocess=postprocess)
    path = tmp_path / "release.npz"
    release.save(path)
    _edit(path, lambda header, arrays: arrays.__setitem__("answers", arrays["answers"] + 1000))
    with pytest.raises(ValueError, match="checksum"):
        Release.load(path)


def test_a_release_file_is_checked_whole_and_against_its_estimate(tmp_path):
    from hdmm.io import archive_checksum

    release = run(W_SMALL, X_SMALL, ZCDP(0.5), strategy=Identity(W_SMALL.shape[1]), rng=1)
    path = tmp_path / "release.npz"
    release.save(path)
    Release.load(path)                                           # as written: loads, without a warning

    def relabel(header, arrays):                                 # the header is covered too
        header["release"]["postprocess"] = "integer"

    _edit(path, relabel)
    with pytest.raises(ValueError, match="checksum"):
        Release.load(path)
    release.save(path)

    def forge(header, arrays):                                   # a checksum recomputed over edited answers
        arrays["answers"] = arrays["answers"] + 1000
        arrays["unprocessed_answers"] = arrays["answers"]
        header["checksum"] = archive_checksum(header, arrays)

    _edit(path, forge)
    with pytest.raises(ValueError, match="not the workload's answers from its estimate"):
        Release.load(path)
    release.save(path)
    _edit(path, lambda header, arrays: header.pop("checksum"))   # a file written before checksums: read, with a warning
    with pytest.warns(UserWarning, match="no checksum"):
        back = Release.load(path)
    np.testing.assert_array_equal(back.answers, release.answers)


@pytest.mark.parametrize("privacy, rho", [(PureDP(1.0), None), (ZCDP(0.3), 0.3),
                                          (ApproxDP(1.0, 1e-6), hdmm.privacy.zcdp_rho(1.0, 1e-6))])
def test_a_release_records_its_calibrated_rho_and_workload_fingerprint(tmp_path, privacy, rho):
    # issue 22 item 12: an (epsilon, delta) release records the rho its noise is calibrated to, every release a
    # hash of its workload with the weights
    W = hdmm.union([hdmm.Total(6), hdmm.Prefix(6)], weights=[3.0, 1.0])
    release = run(W, np.arange(6.0), privacy, strategy=Identity(6), rng=0)
    provenance = release.provenance()
    assert provenance["calibrated_rho"] == rho
    assert provenance["workload_fingerprint"] == workload_fingerprint(W)
    assert provenance["workload_fingerprint"] != workload_fingerprint(hdmm.union([hdmm.Total(6), hdmm.Prefix(6)]))
    answered = release.answer(hdmm.Total(6)).provenance         # answers read off it say which workload they answer
    assert answered["answered_workload_fingerprint"] == workload_fingerprint(hdmm.Total(6))
    assert answered["workload_fingerprint"] == provenance["workload_fingerprint"]
    if rho is not None:                                          # the noise is calibrated to that rho
        assert release.plan.noise_scale == pytest.approx(release.plan.sensitivity / math.sqrt(2 * rho), rel=1e-12)
    release.save(tmp_path / "r.npz")
    from hdmm.io import read_archive

    header, _ = read_archive(tmp_path / "r.npz")
    assert header["metadata"]["workload_fingerprint"] == provenance["workload_fingerprint"]
    assert header["metadata"]["calibrated_rho"] == rho
    assert Release.load(tmp_path / "r.npz").provenance() == provenance
