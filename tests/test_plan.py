"""Release plans: one decision per release, saved and shipped, measured by the private kernel."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hdmm
from hdmm import structure as structure_module
from hdmm.matrix import Explicit, Kronecker, Matrix, Ones
from hdmm.planning import Plan
from hdmm.error import per_query_variance
from hdmm.io import load_strategy, save_strategy, workload_fingerprint

DOM = hdmm.Domain(["a", "b", "c"], [8, 4, 2])
W = hdmm.union(
    [hdmm.product(DOM, {"a": hdmm.Prefix(8), "b": hdmm.Identity(4)}), hdmm.DimKMarginals(DOM, 2)],
    weights=[1.0, 0.5],
)
X = np.random.default_rng(1).poisson(3.0, DOM.size).astype(float)


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


@pytest.fixture
def counters(monkeypatch):
    """Count, per matrix object, calls of ``sensitivity`` and of the structure classifier."""
    sensitivity_calls: dict[int, int] = {}
    classify_calls: dict[int, int] = {}
    keep: list = []  # keep counted objects alive so that their ids stay unique

    for cls in [Matrix, *_subclasses(Matrix)]:
        if "sensitivity" in vars(cls):
            original = vars(cls)["sensitivity"]

            def counted(self, p=1, _original=original):
                keep.append(self)
                sensitivity_calls[id(self)] = sensitivity_calls.get(id(self), 0) + 1
                return _original(self, p)

            monkeypatch.setattr(cls, "sensitivity", counted)

    original_classify = structure_module.classify

    def counted_classify(A):
        keep.append(A)
        classify_calls[id(A)] = classify_calls.get(id(A), 0) + 1
        return original_classify(A)

    for name, module in list(sys.modules.items()):
        if name.startswith("hdmm") and getattr(module, "classify", None) is original_classify:
            monkeypatch.setattr(module, "classify", counted_classify)
    return sensitivity_calls, classify_calls


def test_auto_run_classifies_its_strategy_once_and_calibrates_from_the_strategy_itself(counters):
    sensitivity_calls, classify_calls = counters
    release = hdmm.run(W, X, hdmm.PureDP(1.0), rng=0)
    A = release.strategy
    # once for the optimizer's error, once where the plan calibrates the noise (never from the optimizer's
    # record, which could have been paired with another strategy), and the measurement trusts the plan
    assert sensitivity_calls.get(id(A)) == 2
    assert classify_calls.get(id(A)) == 1


def test_run_with_a_given_strategy_decides_once(counters):
    sensitivity_calls, classify_calls = counters
    A = hdmm.Identity(DOM.size)
    hdmm.run(W, X, hdmm.ZCDP(0.5), strategy=A, rng=0)
    assert sensitivity_calls.get(id(A)) == 1 and classify_calls.get(id(A)) == 1


@pytest.mark.parametrize("privacy", [hdmm.PureDP(1.0), hdmm.ZCDP(0.5)], ids=["laplace", "gaussian"])
def test_saved_and_loaded_plan_gives_the_same_release_as_run(privacy, tmp_path):
    p = hdmm.plan(W, "auto", privacy, seed=3)
    path = tmp_path / "plan.npz"
    p.save(path)
    loaded = Plan.load(path)
    assert loaded.sensitivity == p.sensitivity and loaded.method == p.method
    assert loaded.structure.form == p.structure.form and loaded.origin == p.origin
    np.testing.assert_array_equal(loaded.variances, p.variances)
    assert list(loaded.workload.labels) == list(p.workload.labels)
    measurement = hdmm.measure(loaded, X, 7)
    answers = loaded.workload @ hdmm.reconstruct(loaded, measurement)
    release = hdmm.run(W, X, privacy, strategy=p.strategy, rng=7)
    np.testing.assert_allclose(answers, release.answers, rtol=1e-12, atol=1e-9)
    again = hdmm.run(W, X, privacy, strategy=loaded, rng=7)
    np.testing.assert_array_equal(again.answers, release.answers)
    # the strategy file reader reads a plan's strategy and origin too
    A, metadata = load_strategy(path)
    assert A.shape == p.strategy.shape and metadata["optimizer"] == p.origin


def test_plan_is_frozen_and_data_independent():
    p = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(2.0))
    with pytest.raises(AttributeError):
        p.sensitivity = 0.5
    assert p.sensitivity == pytest.approx(1.0) and p.noise_scale == pytest.approx(0.5)
    assert p.structure.form == "kronecker" and p.method == "kronecker"
    assert np.isclose(float(p.error), hdmm.expected_error(hdmm.workload.unweighted(W)[0], hdmm.Identity(DOM.size),
                                                          hdmm.PureDP(2.0)))
    assert "RMSE" in repr(p) and "queries" in p.summary()


def test_a_tampered_plan_file_is_refused(tmp_path):
    p = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(1.0))
    path = tmp_path / "plan.npz"
    p.save(path)
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    import json

    header = json.loads(str(arrays.pop("header")))
    header["plan"]["sensitivity"] = 0.01  # would make the noise 100 times too small
    bad = tmp_path / "bad.npz"
    np.savez(bad, header=np.array(json.dumps(header)), **arrays)
    with pytest.raises(ValueError, match="sensitivity"):
        Plan.load(bad)
    header["plan"]["sensitivity"] = 1.0
    arrays["plan_variances"] = arrays["plan_variances"][:-1]
    np.savez(bad, header=np.array(json.dumps(header)), **arrays)
    with pytest.raises(ValueError, match="variances"):
        Plan.load(bad)
    save_strategy(hdmm.Identity(4), tmp_path / "strategy.npz")
    with pytest.raises(ValueError, match="not a plan"):
        Plan.load(tmp_path / "strategy.npz")


def test_a_plan_for_another_workload_or_privacy_is_refused():
    p = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="privacy"):
        hdmm.run(W, X, hdmm.PureDP(2.0), strategy=p)
    with pytest.raises(ValueError, match="queries"):
        hdmm.run(hdmm.Identity(DOM.size), X, hdmm.PureDP(1.0), strategy=p)
    other = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="not taken under this plan"):
        hdmm.reconstruct(other, hdmm.measure(p, X, 0))


def test_an_unsupported_strategy_is_refused_before_any_noise():
    with pytest.raises(ValueError, match="does not support"):
        hdmm.plan(W, Kronecker([hdmm.Total(8), hdmm.Identity(4), hdmm.Identity(2)]), hdmm.PureDP(1.0))


# ---------------------------------------------------------------------- weights
@pytest.mark.parametrize("weight", [0.5, 2.0, 10.0])
def test_weighted_workloads_release_the_queries_themselves(weight):
    dom = hdmm.Domain(["sex", "age"], [2, 10])
    parts = [hdmm.product(dom, {"sex": hdmm.Identity(2), "age": hdmm.Prefix(10)}), hdmm.DimKMarginals(dom, 1)]
    Wt = hdmm.union(parts, weights=[1.0, weight])
    x = np.random.default_rng(0).poisson(50.0, dom.size).astype(float)
    truth = np.concatenate([p @ x for p in parts])
    release = hdmm.run(Wt, x, hdmm.ZCDP(1e6), strategy=hdmm.Identity(dom.size), rng=0)  # almost no noise
    np.testing.assert_allclose(release.answers, truth, atol=0.05)
    lower, upper = release.intervals(0.95)
    assert np.mean((lower <= truth) & (truth <= upper)) > 0.8
    table = release.table()
    assert "weight" in table and set(table["weight"]) == {1.0, weight}
    # the standard errors are those of the queries, not of the weighted rows
    unweighted = hdmm.union(parts)
    np.testing.assert_allclose(release.std_errors,
                               np.sqrt(per_query_variance(unweighted, hdmm.Identity(dom.size), hdmm.ZCDP(1e6))))


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_weights_must_be_non_negative_and_finite(bad):
    with pytest.raises(ValueError, match="weights must be finite numbers >= 0"):
        hdmm.union([hdmm.Total(3), hdmm.Identity(3)], weights=[1.0, bad])


def test_a_json_workload_with_weights_releases_counts(tmp_path):
    from hdmm.catalog import load_workload

    spec = tmp_path / "w.json"
    spec.write_text('{"domain": {"a": 3, "b": 2}, "queries": [{"a": "identity"}, {"b": "identity"}], '
                    '"weights": [1.0, 0.25]}')
    named = load_workload(str(spec))
    Wj = named.workload if hasattr(named, "workload") else named[0]
    x = np.array([1.0, 2, 3, 4, 5, 6])
    release = hdmm.run(Wj, x, hdmm.ZCDP(1e8), strategy=hdmm.Identity(6), rng=0)
    np.testing.assert_allclose(release.answers, [3, 7, 11, 9, 12], atol=0.01)


def test_the_legacy_measure_and_reconstruct_forms_still_work():
    A = hdmm.Identity(DOM.size)
    m = hdmm.measure(A, X, hdmm.PureDP(1.0), rng=0)
    np.testing.assert_allclose(hdmm.reconstruct(m), m.answers)


def test_a_zero_weight_part_is_still_answered_as_counts():
    dom = hdmm.Domain(["a"], [4])
    Wz = hdmm.union([hdmm.Identity(4), hdmm.Total(4)], weights=[1.0, 0.0])
    release = hdmm.run(Wz, np.array([1.0, 2, 3, 4]), hdmm.ZCDP(1e8), strategy=hdmm.Identity(dom.size), rng=0)
    assert abs(release.answers[-1] - 10.0) < 0.01 and release.std_errors[-1] > 0


def test_run_checks_the_data_once(monkeypatch):
    from hdmm import kernel

    calls = []
    original = kernel.check_data_vector

    def counted(x, n):
        calls.append(n)
        return original(x, n)

    monkeypatch.setattr(kernel, "check_data_vector", counted)
    hdmm.run(W, X, hdmm.PureDP(1.0), strategy=hdmm.Identity(DOM.size), rng=0)
    assert calls == [DOM.size]


def test_unit_weights_add_no_weight_column():
    Wu = hdmm.union([hdmm.Total(4), hdmm.Identity(4)], weights=[1.0, 1.0])
    release = hdmm.run(Wu, np.arange(4.0), hdmm.PureDP(1.0), strategy=hdmm.Identity(4), rng=0)
    assert "weight" not in release.table() and release.plan.weights is None


def test_a_plan_file_with_edited_variances_is_refused(tmp_path):
    # the standard errors of every release made from a loaded plan come from its stored variances
    from hdmm.io import read_archive, write_archive

    p = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(1.0))
    path = tmp_path / "plan.npz"
    p.save(path)
    header, arrays = read_archive(path)
    write_archive(path, header, {**arrays, "plan_variances": arrays["plan_variances"] * 1e-6})
    with pytest.raises(ValueError, match="stored variances add up to"):
        Plan.load(path)


@pytest.mark.parametrize("seed", range(6))
def test_a_full_rank_strategy_supports_its_own_rows_near_the_cut(seed):
    # singular values down to 1.6e-5 of the largest (inside the pseudo-inverse's 1e-5 cut): a condition test on
    # the Gram's 1-norm turned such Grams to the pseudo-inverse route, whose projector's rounding then refused
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    V, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    A = U @ np.diag(np.geomspace(1.0, 1.6e-5, 12)) @ V.T
    p = hdmm.plan(Explicit(A[:6]), Explicit(A), hdmm.ZCDP(0.5))
    assert np.all(np.isfinite(p.variances))


# ---------------------------------------------------------------------- workload fingerprints
def test_a_loaded_plan_for_another_workload_of_the_same_shape_is_refused_before_any_charge(tmp_path):
    # issue 22 item 7: a plan for 8 totals, loaded from a file, must not answer Identity(8)
    path = tmp_path / "ones.npz"
    hdmm.plan(Ones(8, 8), hdmm.Identity(8), hdmm.PureDP(1.0)).save(path)
    loaded = Plan.load(path)
    budget = hdmm.Budget(hdmm.PureDP(5.0))
    with pytest.raises(ValueError, match="made for another workload.*Ones.*Identity"):
        hdmm.run(hdmm.Identity(8), np.ones(8), hdmm.PureDP(1.0), strategy=loaded, budget=budget)
    assert budget.spent == 0 and not budget.charges
    release = hdmm.run(Ones(8, 8), np.ones(8), hdmm.PureDP(1.0), strategy=loaded, rng=0)
    assert release.provenance()["workload_fingerprint"] == workload_fingerprint(Ones(8, 8))


@pytest.mark.parametrize("made_for, given", [
    # the same number of cells split into other attributes: a plan for another domain
    (Kronecker([hdmm.Prefix(2), hdmm.Identity(4)]), Kronecker([hdmm.Prefix(4), hdmm.Identity(2)])),
    # the same matrix over attributes of other names (labels of the released queries)
    (hdmm.product(hdmm.Domain(["a", "b"], [2, 4]), {"a": hdmm.Prefix(2)}),
     hdmm.product(hdmm.Domain(["x", "y"], [2, 4]), {"x": hdmm.Prefix(2)})),
    # the same queries with other union weights
    (hdmm.union([hdmm.Total(8), hdmm.Identity(8)], weights=[2.0, 1.0]),
     hdmm.union([hdmm.Total(8), hdmm.Identity(8)], weights=[1.0, 1.0])),
])
def test_a_plan_for_another_domain_labels_or_weights_is_refused(made_for, given):
    p = hdmm.plan(made_for, hdmm.Identity(8), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="made for another workload"):
        hdmm.run(given, np.ones(8), hdmm.PureDP(1.0), strategy=p)


def test_workload_fingerprints_are_stable_and_describe_queries_and_weights(tmp_path):
    f = workload_fingerprint
    assert f(W) == f(hdmm.union([hdmm.product(DOM, {"a": hdmm.Prefix(8), "b": hdmm.Identity(4)}),
                                 hdmm.DimKMarginals(DOM, 2)], weights=[1.0, 0.5]))
    assert f(W).startswith("sha256:") and len(f(W)) == len("sha256:") + 64
    p = hdmm.plan(W, hdmm.Identity(DOM.size), hdmm.PureDP(1.0))
    assert p.fingerprint == f(W) != f(p.workload)                 # the weights are part of it
    assert f(hdmm.union([hdmm.Total(3), hdmm.Identity(3)], weights=[1.0, 1.0])) == f(
        hdmm.union([hdmm.Total(3), hdmm.Identity(3)]))            # weights all 1 are no weights
    p.save(tmp_path / "p.npz")
    assert Plan.load(tmp_path / "p.npz").fingerprint == f(W)
    assert f(W, DOM) != f(W) and f(W, DOM) == f(W, hdmm.Domain(["a", "b", "c"], [8, 4, 2]))
    assert f(W, DOM) != f(W, hdmm.Domain(["a", "b", "z"], [8, 4, 2]))
    with pytest.raises(ValueError, match="domain"):
        f(W, hdmm.Domain(["a"], [3]))
    # sparse and dense entries read back from a file hash alike; an explicit matrix's entries count
    import scipy.sparse as sp

    S = Explicit(sp.csr_array(np.array([[1.0, 0.0, 2.0], [0.0, 0.0, 1.0]])))
    save_strategy(S, tmp_path / "s.npz")
    assert f(load_strategy(tmp_path / "s.npz")[0]) == f(S) != f(Explicit(np.array([[1.0, 0, 2], [0, 0, 3]])))


def test_a_workload_fingerprint_never_makes_a_large_workload_dense():
    huge = Kronecker([hdmm.AllRange(1000)] * 6)             # 5e35 queries over 1e18 cells
    assert workload_fingerprint(huge) != workload_fingerprint(Kronecker([hdmm.AllRange(1000)] * 5))

    class Doubled(Matrix):                                       # a class hdmm cannot save: described implicitly
        def __init__(self, n):
            self.shape = (n, n)

        def _matmat(self, X):
            return 2.0 * X

        def _rmatmat(self, Y):
            return 2.0 * Y

    assert workload_fingerprint(Doubled(10**5)) == workload_fingerprint(Doubled(10**5))
    assert workload_fingerprint(Doubled(4)) != workload_fingerprint(hdmm.Identity(4))


def test_a_plan_file_with_an_edited_or_missing_fingerprint(tmp_path):
    from hdmm.io import read_archive, write_archive

    p = hdmm.plan(Ones(8, 8), hdmm.Identity(8), hdmm.PureDP(1.0))
    path = tmp_path / "plan.npz"
    p.save(path)
    header, arrays = read_archive(path)
    assert header["plan"]["fingerprint"] == p.fingerprint
    header["plan"]["fingerprint"] = workload_fingerprint(hdmm.Identity(8))  # relabelled as another workload
    write_archive(path, header, arrays)
    with pytest.raises(ValueError, match="fingerprint"):
        Plan.load(path)
    del header["plan"]["fingerprint"]                            # a file written before fingerprints: still checked
    del header["checksum"]                                       # (and before checksums: read with a warning)
    write_archive(path, header, arrays)
    with pytest.warns(UserWarning, match="no checksum"):
        old = Plan.load(path)
    assert old.fingerprint == p.fingerprint
    with pytest.raises(ValueError, match="made for another workload"):
        hdmm.run(hdmm.Identity(8), np.ones(8), hdmm.PureDP(1.0), strategy=old)


def test_a_plan_whose_strategy_is_over_another_domain_is_refused_before_any_charge():
    import dataclasses

    p = hdmm.plan(hdmm.Prefix(8), hdmm.Identity(8), hdmm.PureDP(1.0))
    swapped = dataclasses.replace(p, strategy=hdmm.Identity(16))  # was refused only by numpy, with a misleading message
    budget = hdmm.Budget(hdmm.PureDP(3.0))
    with pytest.raises(ValueError, match="strategy Identity.16. is over 16 cells.*another domain"):
        hdmm.run(hdmm.Prefix(8), np.ones(8), hdmm.PureDP(1.0), strategy=swapped, budget=budget)
    assert budget.spent == 0


def test_a_plan_file_with_variances_edited_to_keep_their_total_is_refused(tmp_path):
    # the recomputed total cannot see two variances swapped or moved between queries: the checksum does
    from hdmm.io import read_archive, write_archive

    path = tmp_path / "plan.npz"
    hdmm.plan(hdmm.Prefix(8), hdmm.Identity(8), hdmm.PureDP(1.0)).save(path)
    Plan.load(path)                                              # as written: loads, without a warning
    header, arrays = read_archive(path)
    arrays["plan_variances"] = arrays["plan_variances"][::-1].copy()
    write_archive(path, header, arrays)
    with pytest.raises(ValueError, match="checksum"):
        Plan.load(path)
