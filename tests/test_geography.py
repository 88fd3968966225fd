"""hdmm.geography: trees, level-total workloads and tree strategies against dense numpy."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hdmm
from hdmm.geography import GeographyError, GeographyTree, LevelTotals, TreeStrategy, geography_workload
from hdmm.matrix import Explicit, Identity, Kronecker, Ones
from hdmm.traces import factor_rows, factor_trace
from hdmm.error import per_query_variance

# 1 nation, 3 states with 1 / 2 / 4 counties, counties with 1-3 tracts (rows deliberately unsorted)
TRACTS = {("01", "001"): 2, ("02", "001"): 1, ("02", "003"): 3, ("03", "005"): 1, ("03", "001"): 2,
          ("03", "003"): 3, ("03", "007"): 1}
STATE_NAMES = {"01": "Alpha", "02": "Beta", "03": "Gamma"}


def _table() -> pd.DataFrame:
    rows = [(s, c, f"{t:02d}", STATE_NAMES[s]) for (s, c), k in TRACTS.items() for t in range(k, 0, -1)]
    return pd.DataFrame(rows, columns=["state", "county", "tract", "state_name"])


@pytest.fixture(scope="module")
def tree() -> GeographyTree:
    return GeographyTree.from_table(_table(), ["state", "county", "tract"], names={"state": "state_name"})


def level_matrix(tree: GeographyTree, level: int) -> np.ndarray:
    """Dense 0/1 aggregation matrix of a level, built from the leaf codes' prefixes (not from the tree's bounds)."""
    codes = tree.codes(level)
    return np.array([[float(leaf.startswith(code)) for leaf in tree.leaf_codes] for code in codes])


def dense_strategy(tree: GeographyTree, weights) -> np.ndarray:
    return np.vstack([w * level_matrix(tree, d) for d, w in enumerate(weights) if w > 0])


# ====================================================================== the tree
def test_tree_order_sizes_and_labels(tree):
    assert tree.levels == ("nation", "state", "county", "tract")
    assert tree.sizes == (1, 3, 7, 13)
    assert tree.leaf_codes[:4] == ("0100101", "0100102", "0200101", "0200301")
    assert list(tree.codes("county")) == sorted(tree.codes("county"))
    assert list(tree.leaf_bounds("state")) == [0, 2, 6, 13]
    assert list(tree.child_bounds("state")) == [0, 1, 3, 7]
    assert list(tree.parents("county")) == [0, 1, 1, 2, 2, 2, 2]
    assert tree.label("state", 0) == "state=01 Alpha"
    assert tree.label("county", 1) == "county=02001"
    assert tree.label("nation", 0) == "nation"
    assert repr(tree) == "GeographyTree(nation: 1, state: 3, county: 7, tract: 13)"
    assert list(tree.locate(_table().iloc[:3])) == [1, 0, 2]


def test_from_parents_matches_from_table(tree):
    pairs = {}
    for level in range(1, 4):
        for code, parent in zip(tree.codes(level), tree.parents(level)):
            pairs[code] = tree.codes(level - 1)[parent] or "USA"
    other = GeographyTree.from_parents(list(pairs.items())[::-1], tree.levels)
    assert other.sizes == tree.sizes and other.leaf_codes == tree.leaf_codes
    for level in range(4):
        assert np.array_equal(other.leaf_bounds(level), tree.leaf_bounds(level))


@pytest.mark.parametrize("build, message", [
    (lambda: GeographyTree.from_table(pd.DataFrame({"state": [], "county": []}), ["state", "county"]), "empty"),
    (lambda: GeographyTree.from_parents({}, ["nation"]), "empty"),
    (lambda: GeographyTree.from_table(pd.DataFrame({"state": ["1"], "county": ["1"]}), ["state", "state"]),
     "named twice"),
    (lambda: GeographyTree.from_table(pd.DataFrame({"state": ["1"]}), ["state"], root="state"), "named twice"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "nation"]), "named twice"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "st/ate"]), r"holds \['/'\]: releases are written"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "state=1"]), "holds"),
    (lambda: GeographyTree.from_table(pd.DataFrame({"100%": ["1"]}), ["100%"]), "holds"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", " "]), "is empty"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "state "]), "ends with a space"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "a<b"]), "holds"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["nation", "__HIVE_DEFAULT_PARTITION__"]), "missing value"),
    (lambda: GeographyTree.from_parents({"a": "US"}, ["Nation", "nation"]), r"named twice .* \(case aside\)"),
    (lambda: GeographyTree.from_table(pd.DataFrame({"state": ["1", "1"], "county": ["2", "2"]}), ["state", "county"]),
     "duplicate codes"),
    (lambda: GeographyTree.from_parents([("a", "US"), ("a", "US")], ["nation", "state"]), "duplicate codes"),
    (lambda: GeographyTree.from_parents({"a": "US", "b": "CA"}, ["nation", "state"]), "without a parent"),
    (lambda: GeographyTree.from_parents({"a": "b", "b": "a"}, ["nation", "state"]), "cycle"),
    (lambda: GeographyTree.from_parents({"a": "US", "b": "c", "c": "b"}, ["nation", "state"]), "cycle"),
    (lambda: GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a"}, ["nation", "state", "county"]),
     "every path must reach"),
    (lambda: GeographyTree.from_parents({"a": "US", "a1": "a"}, ["nation", "state"]), "deeper than"),
    (lambda: GeographyTree.from_table(pd.DataFrame({"state": ["1", "1"], "county": ["1", "2"], "n": ["x", "y"]}),
                                      ["state", "county"], names={"state": "n"}), "named both"),
])
def test_bad_trees_are_refused_with_a_clear_message(build, message):
    with pytest.raises(GeographyError, match=message):
        build()


def test_records_outside_the_tree_are_counted_never_listed():
    # issue 22.4: the message listed the records' codes; it counts them and names the tree's unit involved
    tree = GeographyTree.from_table(pd.DataFrame({"state": ["01", "01", "02"], "county": ["001", "003", "001"]}),
                                    ["state", "county"])
    records = pd.DataFrame({"state": ["02", "01", "01", "99", "02"], "county": ["001", "777", "778", "001", "001"]})
    with pytest.raises(GeographyError) as caught:
        tree.locate(records)
    message = str(caught.value)
    assert "3 records have geography codes that are not in the tree" in message
    assert "a county code that is not in the tree under state=01" in message
    for private in ("777", "778", "99"):
        assert private not in message
    with pytest.raises(GeographyError, match="5 records have") as caught:  # distinct rows, weighted by records
        tree.locate(records.iloc[[1, 3]], weights=[2, 3])
    assert "777" not in str(caught.value)
    with pytest.raises(GeographyError, match="1 record has geography codes"):
        tree.locate(pd.DataFrame({"state": ["99"], "county": ["001"]}))


def test_codes_joined_without_a_separator_are_read_level_by_level():
    # ("010", "01") joined is "01001", the code of county 001 of state 01: it is no unit of the tree
    tree = GeographyTree.from_table(pd.DataFrame({"state": ["01", "02"], "county": ["001", "001"]}),
                                    ["state", "county"])
    assert tree.locate(pd.DataFrame({"state": ["02", "01"], "county": ["001", "001"]})).tolist() == [1, 0]
    with pytest.raises(GeographyError, match="1 record has state codes of the wrong width"):  # was: not in the tree
        tree.locate(pd.DataFrame({"state": ["010"], "county": ["01"]}))


def test_a_table_of_finer_units_says_what_is_wrong():
    # issue 22.3: a table of tracts read with the levels state, county said "duplicate codes"
    table = pd.DataFrame({"state": ["01", "01", "01"], "county": ["001", "001", "003"], "tract": ["1", "2", "1"]})
    with pytest.raises(GeographyError) as caught:
        GeographyTree.from_table(table, ["state", "county"])
    message = str(caught.value)
    assert "county '01001' is in 2 rows" in message and "one row per unit of the finest level ('county')" in message
    assert "other columns ['tract']" in message and "--geography state,county,tract" in message
    assert "duplicate codes" not in message


def test_codes_not_in_the_tree(tree):
    with pytest.raises(GeographyError, match="'99' is not in the tree at level 'state'"):
        tree.index("state", "99")
    with pytest.raises(GeographyError, match="1 record has leaf codes that are not leaves of the tree") as caught:
        tree.leaf_index(["0100101", "x-data-only"])
    assert "x-data-only" not in str(caught.value)  # issue 22.4: which codes the data hold is private
    with pytest.raises(GeographyError, match="a state code that is not in the tree"):
        tree.locate(pd.DataFrame({"state": ["09"], "county": ["001"], "tract": ["01"]}))
    with pytest.raises(GeographyError, match="no level 'block'"):
        LevelTotals(tree, ["block"])
    with pytest.raises(GeographyError, match="named twice"):
        LevelTotals(tree, ["state", "state"])


# ====================================================================== level totals
def test_level_totals_equal_dense(tree):
    W = LevelTotals(tree, ["county", "nation", "tract"], weights=[2.0, 1.0, -0.5])
    D = np.vstack([2.0 * level_matrix(tree, 2), level_matrix(tree, 0), -0.5 * level_matrix(tree, 3)])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(13, 3)), rng.normal(size=(W.shape[0], 2))
    assert np.allclose(W @ x, D @ x) and np.allclose(y.T @ W, y.T @ D)
    assert np.allclose(W.dense(), D) and np.allclose(W.gram().dense(), D.T @ D)
    assert np.isclose(W.sensitivity(1), np.abs(D).sum(axis=0).max())
    assert np.isclose(W.sensitivity(2), np.linalg.norm(D, axis=0).max())
    X = rng.normal(size=(13, 13))
    assert np.allclose(W.quadratic_diag(X + X.T), np.einsum("ij,ij->i", D @ (X + X.T), D))
    assert W.labels[0] == "county=01001" and W.labels[7] == "nation"
    K = Kronecker([LevelTotals(tree, ["state"]), hdmm.Identity(2)], names=["geo", "sex"], values=[None, ["f", "m"]])
    assert K.labels[1] == "state=01 Alpha & sex=m"


# ====================================================================== tree strategies
WEIGHTS = [
    [1.0, 1.0, 1.0, 1.0],
    [0.5, 2.0, 0.0, 3.0],        # a level left out in the middle
    [1.0, 0.0, 2.0, 0.0],        # finest level not measured: rank deficient
    [0.0, 0.0, 0.0, 1.0],        # the identity
    [3.0, 0.0, 0.0, 0.0],        # the total only
]


@pytest.mark.parametrize("weights", WEIGHTS)
def test_tree_strategy_equals_dense(tree, weights):
    A = TreeStrategy(tree, weights)
    D = dense_strategy(tree, weights)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(13, 2)), rng.normal(size=(D.shape[0], 2))
    assert np.allclose(A @ x, D @ x) and np.allclose(y.T @ A, y.T @ D)
    assert np.allclose(A.gram().dense(), D.T @ D)
    assert np.isclose(A.sensitivity(1), np.abs(D).sum(axis=0).max()) and np.isclose(A.sensitivity(1), sum(weights))
    assert np.isclose(A.sensitivity(2), np.linalg.norm(D, axis=0).max())
    assert np.allclose(A.pinv().dense(), np.linalg.pinv(D), atol=1e-12)
    Xp = np.linalg.pinv(D.T @ D)
    assert np.allclose(A.gram().pinv().dense(), Xp, atol=1e-12)
    W = LevelTotals(tree)
    Wd = W.dense()
    variances, bad, nonzero = factor_rows(A, W)
    supported = np.linalg.norm(Wd - Wd @ Xp @ (D.T @ D), axis=1) < 1e-8
    assert np.array_equal(~bad, supported) and nonzero.all()
    assert np.allclose(variances[supported], np.diag(Wd @ Xp @ Wd.T)[supported])
    trace, ok = factor_trace(A, LevelTotals(tree, ["nation", "state"], weights=[1.0, 2.0]))
    S = np.vstack([level_matrix(tree, 0), 2.0 * level_matrix(tree, 1)])
    assert ok == bool(np.allclose(S @ Xp @ D.T @ D, S))
    assert ok == (A.finest != "nation")
    if ok:
        assert np.isclose(trace, np.trace(Xp @ S.T @ S))


@pytest.mark.parametrize("weights", WEIGHTS[:3])
def test_other_workload_factors_by_rows(tree, weights):
    A = TreeStrategy(tree, weights)
    D = dense_strategy(tree, weights)
    X = D.T @ D
    Xp = np.linalg.pinv(X)
    rng = np.random.default_rng(2)
    for f in (Explicit(rng.integers(0, 2, size=(5, 13))), Identity(13), Ones(1, 13),
              hdmm.union([LevelTotals(tree, ["state"]), Identity(13)], weights=[2.0, 1.0])):
        F = f.dense()
        variances, bad, nonzero = factor_rows(A, f)
        supported = np.linalg.norm(F - F @ Xp @ X, axis=1) <= 1e-8 * np.linalg.norm(F, axis=1)
        assert np.array_equal(~bad | ~nonzero, supported | ~nonzero)
        assert np.allclose(variances[supported], np.einsum("ij,ij->i", F @ Xp, F)[supported])
        trace, ok = factor_trace(A, f)
        assert ok == bool(supported.all())
        if ok:
            assert np.isclose(trace, np.trace(Xp @ F.T @ F))


@st.composite
def random_trees(draw):
    depth = draw(st.integers(1, 3))
    pairs, level = {}, ["r"]
    for d in range(depth):
        below = []
        for parent in level:
            for k in range(draw(st.integers(1, 3))):
                code = f"{parent}.{k}"
                pairs[code] = parent
                below.append(code)
        level = below
    weights = draw(st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5]), min_size=depth + 1, max_size=depth + 1))
    if not any(weights):
        weights[-1] = 1.0
    return GeographyTree.from_parents(pairs, [f"l{d}" for d in range(depth + 1)]), weights


@settings(max_examples=40, deadline=None)
@given(random_trees())
def test_random_trees_equal_dense(case):
    tree, weights = case
    A = TreeStrategy(tree, weights)
    D = dense_strategy(tree, weights)
    X = D.T @ D
    Xp = np.linalg.pinv(X)
    assert np.allclose(A.gram().dense(), X)
    assert np.isclose(A.sensitivity(2), np.linalg.norm(D, axis=0).max())
    assert np.allclose(A.pinv().dense(), np.linalg.pinv(D), atol=1e-10)
    W = LevelTotals(tree)
    Wd = W.dense()
    variances, bad, _ = factor_rows(A, W)
    supported = np.linalg.norm(Wd - Wd @ Xp @ X, axis=1) < 1e-8
    assert np.array_equal(~bad, supported)
    assert np.allclose(variances[supported], np.diag(Wd @ Xp @ Wd.T)[supported])


# ====================================================================== with a person factor
@pytest.mark.parametrize("privacy", [hdmm.PureDP(1.0), hdmm.ZCDP(0.5)])
def test_kronecker_error_and_variances_equal_dense(tree, privacy):
    person = hdmm.Prefix(3)
    W = geography_workload(tree, ["nation", "state", "county"], person, weights=[1.0, 2.0, 1.0])
    A = Kronecker([TreeStrategy(tree, [1.0, 1.0, 0.5, 1.0]), hdmm.Identity(3)])
    Ad, Wd = A.dense(), W.dense()
    Xp = np.linalg.pinv(Ad.T @ Ad)
    sens = np.abs(Ad).sum(axis=0).max() if privacy.norm == 1 else np.linalg.norm(Ad, axis=0).max()
    var = privacy.noise_variance(sens)
    assert np.isclose(float(hdmm.expected_error(W, A, privacy)), var * np.trace(Xp @ Wd.T @ Wd))
    assert np.allclose(per_query_variance(W, A, privacy), var * np.diag(Wd @ Xp @ Wd.T))
    bad = hdmm.expected_error(Kronecker([LevelTotals(tree, ["tract"]), person]),
                              Kronecker([TreeStrategy(tree, {"state": 1.0}), hdmm.Identity(3)]), privacy)
    assert not bad.supported


def test_run_reconstructs_consistently_and_matches_expected_error(tree):
    person = hdmm.Identity(2)
    W = Kronecker([LevelTotals(tree), person])
    A = Kronecker([TreeStrategy(tree, [1.0, 1.0, 1.0, 2.0]), hdmm.Identity(2)])
    rng = np.random.default_rng(5)
    x = rng.integers(0, 50, size=W.shape[1]).astype(float)
    privacy = hdmm.PureDP(1.0)
    plan = hdmm.plan(W, A, privacy)
    assert plan.method == "kronecker"
    expected = hdmm.expected_error(W, A, privacy)
    squared = []
    for seed in range(400):
        release = hdmm.run(W, x, privacy, strategy=plan, rng=seed)
        answers = release.answers.reshape(-1, 2)
        for level in range(3):  # every parent's answer is the sum of its children's
            lo, hi = LevelTotals(tree).offsets[level: level + 2]
            children = LevelTotals(tree).offsets[level + 1: level + 3]
            summed = np.add.reduceat(answers[children[0]: children[1]], tree.child_bounds(level)[:-1], axis=0)
            assert np.allclose(answers[lo:hi], summed)
        squared.append(np.sum((release.answers - W @ x) ** 2))
    squared = np.array(squared)
    standard_error = squared.std() / np.sqrt(squared.size)
    assert abs(squared.mean() - float(expected)) < 4 * standard_error


def test_level_weights_are_checked(tree):
    for bad in ([0, 0, 0, 0], [1, -1, 0, 0], [1, 2], {"nation": np.nan}):
        with pytest.raises(GeographyError, match="weight"):
            TreeStrategy(tree, bad)
    with pytest.raises(GeographyError, match="no level"):
        TreeStrategy(tree, {"block": 1.0})


# ====================================================================== scale
def test_seventy_thousand_leaves_are_fast():
    rng = np.random.default_rng(0)
    counties = rng.integers(40, 80, size=51)
    rows = []
    for s, k in enumerate(counties):
        for c in range(k):
            rows.extend((f"{s:02d}", f"{c:03d}", f"{t:04d}") for t in range(int(rng.integers(5, 45))))
    table = pd.DataFrame(rows[:70_000], columns=["state", "county", "tract"])
    start = time.perf_counter()
    tree = GeographyTree.from_table(table, ["state", "county", "tract"])
    built = time.perf_counter() - start
    assert tree.leaves == 70_000
    start = time.perf_counter()
    W = geography_workload(tree, ["nation", "state", "county", "tract"], hdmm.Identity(2))
    A = Kronecker([TreeStrategy(tree, [1.0, 1.0, 1.0, 1.0]), hdmm.Identity(2)])
    x = rng.random(W.shape[1])
    assert np.isclose((A.pinv() @ (A @ x)), x).all()
    error = hdmm.expected_error(W, A, hdmm.PureDP(1.0))
    variances = per_query_variance(W, A, hdmm.PureDP(1.0))
    elapsed = time.perf_counter() - start
    assert np.isfinite(error) and variances.size == W.shape[0] and A.sensitivity(1) == 4.0
    assert built < 10 and elapsed < 10, (built, elapsed)
