"""The accuracy report of geography releases against figures computed by hand on tiny trees."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import hdmm
from hdmm.geography import GeographyTree
from hdmm.georelease import ArrayHistograms, geo_plan, release_geography
from hdmm.georelease.report import (SIZE_BINS, TrueAnswers, accuracy_report, size_bin_labels, table_of,
                                    total_query, true_answers)
from hdmm.matrix import Explicit, Identity, Kronecker, VStack

#: nation -> counties c0 (tracts t0, t1) and c1 (tract t2)
TREE = GeographyTree.from_parents({"c0": "US", "c1": "US", "t0": "c0", "t1": "c0", "t2": "c1"},
                                  ["nation", "county", "tract"])
#: three person cells; a total, two tables
W = Explicit(np.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]),
             labels=["P1: total", "P1: a", "P2: b or c"])
#: the tracts' histograms: populations 3, 0 and 12
H = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0], [4.0, 4.0, 4.0]])


def tiny_plan():
    return geo_plan(TREE, W, hdmm.PureDP(1.0), strategy=Identity(3), level_weights=[1.0, 1.0, 1.0])


def test_true_answers_by_hand():
    truth = true_answers(tiny_plan(), ArrayHistograms(sp.csr_matrix(H)))
    assert truth.levels == ("nation", "county", "tract")
    assert truth.labels == ("P1: total", "P1: a", "P2: b or c")
    np.testing.assert_array_equal(truth.answers["tract"], [[3, 1, 2], [0, 0, 0], [12, 4, 8]])
    np.testing.assert_array_equal(truth.answers["county"], [[3, 1, 2], [12, 4, 8]])
    np.testing.assert_array_equal(truth.answers["nation"], [[15, 5, 10]])
    np.testing.assert_array_equal(truth.totals["tract"], [3, 0, 12])
    np.testing.assert_array_equal(truth.totals["county"], [3, 12])
    assert truth.privacy == hdmm.PureDP(1.0).description


def test_true_answers_read_in_blocks(monkeypatch):
    """Reading one leaf at a time gives the same answers, and never asks for more leaves than allowed."""
    import hdmm.georelease.report as report

    reads = []

    class Source:
        def leaf_totals(self):
            return H.sum(axis=1)

        def histograms(self, lo, hi):
            reads.append(hi - lo)
            return sp.csr_matrix(H[lo:hi])

    whole = true_answers(tiny_plan(), Source())
    monkeypatch.setattr(report, "LEAVES_PER_READ", 1)
    reads.clear()
    piecewise = true_answers(tiny_plan(), Source(), levels=["county", "tract"])
    assert max(reads) == 1 and sum(reads) == 3
    assert piecewise.levels == ("county", "tract")
    for level in piecewise.levels:
        np.testing.assert_array_equal(piecewise.answers[level], whole.answers[level])


def hand_truth() -> TrueAnswers:
    return TrueAnswers(levels=("nation", "tract"), labels=("P1: total", "P1: a", "P2: b or c"),
                       answers={"nation": np.array([[15.0, 5.0, 10.0]]),
                                "tract": np.array([[3.0, 1.0, 2.0], [0.0, 0.0, 0.0], [12.0, 4.0, 8.0]])},
                       totals={"nation": np.array([15.0]), "tract": np.array([3.0, 0.0, 12.0])},
                       privacy="pure DP, epsilon=1")


def test_errors_by_hand():
    # tract errors: total +1, -0, -3 (answers' first column); P1 a: 0, +2, -1; P2: +1, 0, 0
    out = {"nation": np.array([[13.0, 6.0, 11.0]]),
           "tract": np.array([[4.0, 1.0, 3.0], [0.0, 2.0, 0.0], [9.0, 3.0, 8.0]])}
    report = accuracy_report({"integer": out}, hand_truth())
    e = report.errors.set_index(["level", "measure"])
    tract_total = e.loc[("tract", "total population")]
    assert tract_total["units"] == 3 and tract_total["queries"] == 1
    assert tract_total["MAE"] == pytest.approx(4 / 3)
    assert tract_total["RMSE"] == pytest.approx(np.sqrt(10 / 3))
    p1 = e.loc[("tract", "P1")]  # errors 1, 0, -3 (total) and 0, 2, -1 (a)
    assert p1["queries"] == 2 and p1["MAE"] == pytest.approx(7 / 6) and p1["RMSE"] == pytest.approx(np.sqrt(15 / 6))
    p2 = e.loc[("tract", "P2")]
    assert p2["MAE"] == pytest.approx(1 / 3) and p2["RMSE"] == pytest.approx(np.sqrt(1 / 3))
    everything = e.loc[("tract", "all queries")]
    assert everything["queries"] == 3 and everything["RMSE"] == pytest.approx(np.sqrt(16 / 9))
    nation = e.loc[("nation", "total population")]  # total from the "P1: total" query: 13 - 15
    assert nation["MAE"] == 2 and nation["RMSE"] == 2
    assert list(e.loc["nation"].index) == ["total population", "all queries", "P1", "P2"]
    assert report.errors.attrs["privacy"] == "pure DP, epsilon=1"
    assert "pure DP, epsilon=1" in report.caption and "integer" in report.caption


def test_bias_by_size_by_hand():
    truth = TrueAnswers(levels=("tract",), labels=("T: total",),
                        answers={"tract": np.array([[0.0], [0.0], [5.0], [7.0], [6000.0]])},
                        totals={"tract": np.array([0.0, 0.0, 5.0, 7.0, 6000.0])})
    out = {"tract": np.array([[1.0, 1.0], [3.0, 3.0], [5.0, 5.0], [10.0, 10.0], [5990.0, 5990.0]])}
    bias = accuracy_report({"x": out}, truth).bias.set_index("size")
    assert list(bias.index) == ["0", "1-9", "5000+"]  # empty bins are left out
    assert bias.loc["0", "units"] == 2 and bias.loc["0", "mean signed error"] == 2.0
    assert bias.loc["0", "standard error"] == pytest.approx(np.std([1, 3], ddof=1) / np.sqrt(2))
    assert bias.loc["1-9", "mean signed error"] == 1.5 and bias.loc["1-9", "RMSE"] == pytest.approx(np.sqrt(4.5))
    assert bias.loc["5000+", "mean signed error"] == -10.0 and np.isnan(bias.loc["5000+", "standard error"])


def test_two_outputs_and_a_release():
    plan = tiny_plan()
    data = ArrayHistograms(sp.csr_matrix(H))
    release = release_geography(plan, data, seed=3)
    truth = true_answers(plan, data)
    exact = {lv: np.column_stack([truth.answers[lv], truth.totals[lv]]) for lv in truth.levels}
    report = accuracy_report({"least squares": release, "truth": exact}, truth, workload=W)
    rmse = report.rmse()
    assert list(rmse.index) == ["nation", "county", "tract"] and list(rmse.columns) == ["least squares", "truth"]
    assert (rmse["truth"] == 0).all()
    expected = np.sqrt(np.mean((release.totals("tract") - [3, 0, 12]) ** 2))
    assert rmse.loc["tract", "least squares"] == pytest.approx(expected)
    assert (report.bias.loc[report.bias["output"] == "truth", "mean signed error"] == 0).all()
    unnamed = accuracy_report({"least squares": release}, replace(truth, privacy=""))
    assert unnamed.privacy == plan.privacy.description == unnamed.bias.attrs["privacy"]


def test_bad_outputs_are_named():
    truth = hand_truth()
    with pytest.raises(ValueError, match="output 'x' at level 'tract' has shape"):
        accuracy_report({"x": {"nation": np.zeros((1, 3)), "tract": np.zeros((2, 3))}}, truth)
    with pytest.raises(ValueError, match="has no answers for level 'tract'"):
        accuracy_report({"x": {"nation": np.zeros((1, 3))}}, truth)
    no_total = TrueAnswers(("tract",), ("T: a",), {"tract": np.zeros((3, 1))}, {"tract": np.zeros(3)})
    with pytest.raises(ValueError, match="no totals"):
        accuracy_report({"x": {"tract": np.zeros((3, 1))}}, no_total, total=None)
    with pytest.raises(ValueError, match="at least one output"):
        accuracy_report({}, truth)


def test_labels_tables_and_total_query():
    assert size_bin_labels(SIZE_BINS) == ["0", "1-9", "10-49", "50-99", "100-499", "500-999", "1000-4999", "5000+"]
    with pytest.raises(ValueError, match="increasing"):
        size_bin_labels([1, 10])
    assert table_of("PL94 P1: White alone") == "PL94 P1" and table_of("P12: Male: 5 to 9") == "P12"
    assert table_of("no table") == "no table"
    assert total_query(W) == 0
    assert total_query(Explicit(np.array([[1.0, 0.0], [1.0, 1.0 + 1e-12]]))) is None


@pytest.mark.slow  # imports matplotlib (about 2 s)
def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    from hdmm.georelease.report_plots import plot_bias_by_size, plot_error_by_level

    out = {"nation": np.array([[13.0, 6.0, 11.0]]),
           "tract": np.array([[4.0, 1.0, 3.0], [0.0, 2.0, 0.0], [9.0, 3.0, 8.0]])}
    report = accuracy_report({"a": out, "b": {k: v + 1 for k, v in out.items()}}, hand_truth())
    plot_error_by_level(report, path=tmp_path / "error.png")
    fig = plot_bias_by_size(report, path=tmp_path / "bias.png")
    assert (tmp_path / "error.png").stat().st_size > 1000 and (tmp_path / "bias.png").stat().st_size > 1000
    assert len(fig.axes) == 1  # the nation has one unit: only the tracts are drawn
    assert isinstance(report.bias, pd.DataFrame)


def test_workload_columns_equal_dense_columns():
    from hdmm.georelease.report import workload_columns

    W2 = VStack([Kronecker([hdmm.Identity(2), hdmm.Prefix(3), hdmm.Total(4)]),
                      2.0 * Kronecker([hdmm.Total(2), hdmm.Identity(3), hdmm.Prefix(4)])])
    dense = W2.dense()
    cells = np.array([0, 5, 23, 7, 7])
    np.testing.assert_allclose(workload_columns(W2, cells), dense[:, cells])


@pytest.mark.parametrize("factor_limit", [1 << 20, 0])  # the columns of W, or products with dense cell vectors
def test_true_answers_sparse_and_dense_paths_agree(monkeypatch, factor_limit):
    import hdmm.georelease.report as report

    monkeypatch.setattr(report, "MAX_FACTOR_ENTRIES", factor_limit)
    monkeypatch.setattr(report, "COLUMN_ENTRIES", 2 * 3)  # groups of one or two units
    rng = np.random.default_rng(5)
    big = np.where(rng.random((3, 3)) < 0.5, 0.0, rng.integers(1, 4, size=(3, 3)))
    truth = true_answers(tiny_plan(), ArrayHistograms(sp.csr_matrix(big)))
    np.testing.assert_array_equal(truth.answers["tract"], big @ W.dense().T)
    np.testing.assert_array_equal(truth.answers["nation"], big.sum(axis=0, keepdims=True) @ W.dense().T)
