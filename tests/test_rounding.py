"""Controlled rounding (hdmm.georelease.rounding, roundtree) against exhaustive integer search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdmm.geography import GeographyError, GeographyTree
from hdmm.georelease.rounding import (RoundingError, compact, controlled_round, round_below, round_families,
                                      round_vector)
from hdmm.georelease.roundtree import check_integer, round_tree
from trees import random_tree as shared_random_tree


# ---------------------------------------------------------------------------------------------- helpers
def fractional_table(rng, k, m, held):
    """A non-negative ``k x m`` table with integer column sums (and integer row sums when ``held``)."""
    if held:  # an integer table plus a perturbation with zero row and column sums, kept >= 0
        B = rng.integers(0, 3, (k, m)).astype(float)
        D = rng.random((k, m)) * 0.6
        D -= D.mean(axis=1, keepdims=True)
        D -= D.mean(axis=0, keepdims=True)
        scale = min(1.0, min((B[D < 0] / -D[D < 0]).min(initial=np.inf), 1.0))
        X = B + scale * D
        return X, np.rint(X.sum(axis=0)), np.rint(X.sum(axis=1))
    X = rng.random((k, m)) * rng.integers(0, 3, (k, m)) * (rng.random((k, m)) < 0.8)
    c = np.ceil(X.sum(axis=0))
    X[rng.integers(0, k, m), np.arange(m)] += c - X.sum(axis=0)
    return X, np.rint(X.sum(axis=0)), None


def exhaustive(X, columns, rows):
    """The least L1 over all floor/ceiling tables meeting the columns and the rows (or the rows' floor/ceil)."""
    F = np.floor(X)
    where = list(zip(*np.nonzero(X - F > 0)))
    s = X.sum(axis=1)
    best = None
    for bits in itertools.product((0, 1), repeat=len(where)):
        R = F.copy()
        for (i, j), b in zip(where, bits):
            R[i, j] += b
        if not np.allclose(R.sum(axis=0), columns):
            continue
        sums = R.sum(axis=1)
        if rows is not None and not np.allclose(sums, rows):
            continue
        if rows is None and not np.all((np.floor(s + 1e-9) <= sums) & (sums <= np.ceil(s - 1e-9))):
            continue
        loss = float(np.abs(R - X).sum())
        best = loss if best is None else min(best, loss)
    return best


def check_family(R, X, columns, rows):
    assert R.dtype == np.int64
    assert np.all((R == np.floor(X)) | (R == np.ceil(X)))
    assert np.all(R[X == 0] == 0) and np.all(np.abs(R - X) < 1)
    assert np.array_equal(R.sum(axis=0), np.asarray(columns, dtype=np.int64))
    s = X.sum(axis=1)
    if rows is not None:
        assert np.array_equal(R.sum(axis=1), np.asarray(rows, dtype=np.int64))
    else:
        assert np.all((np.floor(s + 1e-9) <= R.sum(axis=1)) & (R.sum(axis=1) <= np.ceil(s - 1e-9)))


# ---------------------------------------------------------------------------------------------- families
def test_families_against_exhaustive_search():
    """Feasible on every table (exhaustive search finds a rounding on each), within 1.1x the least L1."""
    rng = np.random.default_rng(7)
    ratios = []
    for trial in range(150):
        X, c, r = fractional_table(rng, int(rng.integers(2, 5)), int(rng.integers(2, 5)), held=trial % 2 == 0)
        if np.count_nonzero(X - np.floor(X)) > 12:
            continue
        best = exhaustive(X, c, r)
        assert best is not None  # the theorem: a rounding exists
        R = controlled_round(X, c, r)
        check_family(R, X, c, r)
        loss = float(np.abs(R - X).sum())
        assert loss >= best - 1e-9
        ratios.append(loss / best if best > 0 else 1.0)
    ratios = np.array(ratios)
    assert len(ratios) > 80
    assert ratios.max() <= 1.1 and np.mean(ratios == 1.0) >= 0.85, (ratios.max(), np.mean(ratios == 1.0))


def test_round_vector_is_optimal():
    rng = np.random.default_rng(3)
    for _ in range(50):
        x = rng.random(6) * 3
        for total in (None, int(np.ceil(x.sum()))):
            if total is not None:
                x = x * (total / x.sum())
            R = round_vector(x, total)
            F = np.floor(x)
            best = min(float(np.abs(F + np.array(b) - x).sum()) for b in itertools.product((0, 1), repeat=6)
                       if (total is not None and (F + np.array(b)).sum() == total)
                       or (total is None and np.floor(x.sum()) <= (F + np.array(b)).sum() <= np.ceil(x.sum())))
            assert np.isclose(np.abs(R - x).sum(), best)
            assert total is None or R.sum() == total


def test_batches_and_tolerance():
    rng = np.random.default_rng(11)
    fams = [fractional_table(rng, 4, 5, held=i % 2 == 0) for i in range(40)]
    out = list(round_families(iter(fams), batch_entries=50))  # many small graphs
    assert len(out) == 40
    for R, (X, c, r) in zip(out, fams):
        check_family(R, X, c, r)
    X, c, r = fams[0]
    noisy = X.copy()
    noisy[0] += 1e-12 * (1 + X[0])  # a solver's rounding: accepted
    check_family(controlled_round(noisy, c, r), noisy, c, r)
    exact = np.array([[2.0 - 1e-12, 1.0], [1e-13, 3.0]])  # near-integers are integers
    assert controlled_round(exact, np.array([2, 4])).tolist() == [[2, 1], [0, 3]]


def test_compact_follows_nonzero_cells():
    X = np.array([[0.0, 1.5, 0.0, 0.25], [0.0, 0.5, 0.0, 0.75]])
    parent = np.array([0, 2, 0, 1])
    idx, Xc = compact(X, parent)
    assert idx.tolist() == [1, 3]
    R = controlled_round(Xc, parent[idx])
    check_family(R, Xc, parent[idx], None)
    with pytest.raises(RoundingError, match="parent has none"):
        compact(np.array([[0.5, 1.0]]), np.array([0, 1]))


@pytest.mark.parametrize("X, columns, rows, match", [
    (np.array([[-0.5, 1.5]]), [0, 2], None, "negative"),
    (np.array([[np.nan, 1.0]]), [0, 1], None, "non-finite"),
    (np.array([[0.5, 1.5]]), [0.5, 1.5], None, "whole numbers"),
    (np.array([[0.5, 1.5]]), [1, 2], None, "adds up to"),
    (np.array([[0.5, 0.5], [0.5, 0.5]]), [1, 1], [1.5, 0.5], "whole numbers"),
    (np.array([[0.5, 0.5], [0.5, 0.5]]), [1, 1], [2, 0], "adds up to"),
    (np.array([[0.5, 0.5]]), [1, 1, 1], None, "column totals"),
    (np.ones(3), [1, 1, 1], None, "2-d"),
])
def test_bad_families_are_refused(X, columns, rows, match):
    with pytest.raises(RoundingError, match=match):
        controlled_round(X, np.asarray(columns), None if rows is None else np.asarray(rows))


def test_family_miss_in_all_is_bounded():
    X = np.tile([[5e7 + 0.54], [5e7 - 0.46]], (1, 10))   # each column 1e8 + 0.08: within 1e-9, 0.8 in all
    with pytest.raises(RoundingError, match="in all"):
        controlled_round(X, np.full(10, 10**8))
    check_family(controlled_round(X[:, :5], np.full(5, 10**8)), X[:, :5], np.full(5, 10**8), None)


def test_round_below_widens_only_when_the_parent_forces_it():
    X = np.array([[1.69, 0.0, 0.045], [0.0, 0.721, 0.0]])   # real parent 1.69, 0.721, 0.045
    (R, w), = round_below([(X, np.array([2, 1, 0]))])
    assert w == 0 and R.sum(axis=0).tolist() == [2, 1, 0]
    (R, w), = round_below([(X, np.array([2, 0, 1]))])      # the first child must take 3 > ceil(1.735)
    assert w == 1 and R.tolist() == [[2, 0, 1], [0, 0, 0]]
    with pytest.raises(RoundingError, match="cannot be rounded to it"):
        list(round_below([(X, np.array([3, 1, 0]))]))


# ---------------------------------------------------------------------------------------------- trees
def random_tree(rng, depth, fanout=3):
    return shared_random_tree(depth, rng, fanout)


def tree_cells(tree, rng, m, held_level=None, density=0.7):
    """Consistent real cells, leaves up; with ``held_level``, its units' totals whole (the held totals)."""
    D = tree.depth
    leaves = rng.random((tree.sizes[D], m)) * rng.integers(0, 3, (tree.sizes[D], m)) * (rng.random((tree.sizes[D], m))
                                                                                       < density)
    held = None
    if held_level is not None:
        totals = tree.aggregate(held_level, leaves).sum(axis=1)
        target = np.rint(totals)
        factor = np.where(totals > 0, target / np.where(totals > 0, totals, 1), 0.0)
        leaves = leaves * tree.spread(held_level, factor[:, None])
        held = {held_level: target}
    cells = {d: tree.aggregate(d, leaves) for d in range(D + 1)}
    return cells, held


def tree_exhaustive(tree, cells, closed, soft=False):
    """Least L1 over all consistent floor/ceiling trees holding the held totals (unheld totals free, or with
    ``soft`` the floor or ceiling of the real ones)."""
    D = max(cells)
    spots = [(d, u, j) for d in range(D + 1) for u, j in zip(*np.nonzero(cells[d] - np.floor(cells[d]) > 1e-12))]
    best = None
    for bits in itertools.product((0, 1), repeat=len(spots)):
        R = {d: np.floor(cells[d]) for d in cells}
        for (d, u, j), b in zip(spots, bits):
            R[d][u, j] += b
        if any(not np.array_equal(np.add.reduceat(R[d + 1], tree.child_bounds(d)[:-1], axis=0), R[d])
               for d in range(D)):
            continue
        if any(not np.allclose(R[d].sum(axis=1)[~np.isnan(closed[d])], closed[d][~np.isnan(closed[d])])
               for d in range(D + 1)):
            continue
        if soft and any(np.any(np.abs(R[d].sum(axis=1) - cells[d].sum(axis=1)) >= 1 - 1e-9) for d in range(D + 1)):
            continue
        loss = sum(float(np.abs(R[d] - cells[d]).sum()) for d in cells)
        best = loss if best is None else min(best, loss)
    return best, len(spots)


def check_tree(tree, cells, closed, out):
    D = max(cells)
    for d in range(D + 1):
        R, X = out.cells[d], cells[d]
        assert R.dtype == np.int64 and np.all(R >= 0)
        assert np.all((R == np.floor(X + 1e-12)) | (R == np.ceil(X - 1e-12)))
        held = ~np.isnan(closed[d])
        assert np.array_equal(R.sum(axis=1)[held], closed[d][held].astype(np.int64))
        if d < D:
            assert np.array_equal(np.add.reduceat(out.cells[d + 1], tree.child_bounds(d)[:-1], axis=0), R)
        if d > 0:
            s = X.sum(axis=1)
            w = out.widened[d]
            assert np.all((np.floor(s + 1e-9) - w <= R.sum(axis=1)) & (R.sum(axis=1) <= np.ceil(s - 1e-9) + w))
    if np.isnan(closed[0][0]):
        s = cells[0].sum()
        assert np.floor(s + 1e-9) <= out.cells[0].sum() <= np.ceil(s - 1e-9)


def test_trees_against_exhaustive_search():
    """Small trees: ours is consistent with held totals exact whenever exhaustive search finds any such tree."""
    rng = np.random.default_rng(5)
    ratios, checked = [], 0
    for trial in range(120):
        tree = random_tree(rng, int(rng.integers(1, 3)), fanout=2)
        held_level = [None, 1, tree.depth][trial % 3]
        cells, held = tree_cells(tree, rng, int(rng.integers(1, 3)), held_level)
        closed = check_integer(tree, held)
        spots = sum(int(np.count_nonzero(cells[d] - np.floor(cells[d]) > 1e-12)) for d in cells)
        if spots > 13:
            continue
        best, _ = tree_exhaustive(tree, cells, closed)
        out = round_tree(tree, cells, held)
        check_tree(tree, cells, closed, out)
        assert best is not None
        loss = sum(float(np.abs(out.cells[d] - cells[d]).sum()) for d in cells)
        ratios.append(loss / best if best > 0 else 1.0)
        checked += 1
    assert checked > 60
    assert max(ratios) <= 1.6, max(ratios)


def test_joint_trees_against_exhaustive_search():
    """Rounded at once, every unit's total is the floor or ceiling of its real one; exhaustive search agrees
    that such a tree exists, and ours is within 1.2x of the least L1 among them."""
    rng = np.random.default_rng(9)
    ratios = []
    for trial in range(120):
        tree = random_tree(rng, int(rng.integers(1, 3)), fanout=2)
        held_level = [None, 1, tree.depth][trial % 3]
        cells, held = tree_cells(tree, rng, int(rng.integers(1, 3)), held_level)
        closed = check_integer(tree, held)
        if sum(int(np.count_nonzero(cells[d] - np.floor(cells[d]) > 1e-12)) for d in cells) > 13:
            continue
        best, _ = tree_exhaustive(tree, cells, closed, soft=True)
        assert best is not None
        out = round_tree(tree, cells, held, joint=tree.depth)
        check_tree(tree, cells, closed, out)
        assert all(w == 0 for w in out.widened.values())
        for d in cells:
            assert np.all(np.abs(out.cells[d].sum(axis=1) - cells[d].sum(axis=1)) < 1)
        loss = sum(float(np.abs(out.cells[d] - cells[d]).sum()) for d in cells)
        assert loss >= best - 1e-9
        ratios.append(loss / best if best > 0 else 1.0)
    assert len(ratios) > 60 and max(ratios) <= 1.2, (len(ratios), max(ratios))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), depth=st.integers(1, 3), m=st.integers(1, 6),
       held=st.sampled_from([None, 1, "deepest", "root"]), joint=st.integers(0, 3))
def test_tree_properties(seed, depth, m, held, joint):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, depth)
    level = {None: None, 1: 1, "deepest": depth, "root": 0}[held]
    cells, totals = tree_cells(tree, rng, m, level, density=0.5)
    out = round_tree(tree, cells, totals, joint=min(joint, depth))
    check_tree(tree, cells, check_integer(tree, totals), out)
    for d in range(1, min(joint, depth) + 1):
        assert out.widened[d] == 0


def test_plan_time_refusals():
    tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
                                      ["nation", "state", "county"])
    with pytest.raises(GeographyError, match="all or none"):
        check_integer(tree, {"county": np.array([1.0, np.nan, 2.0])})
    with pytest.raises(GeographyError, match="whole numbers"):
        check_integer(tree, {"state": np.array([1.5, 2.0])})
    with pytest.raises(GeographyError, match="whole numbers"):
        check_integer(tree, {"state": np.array([-1.0, 2.0])})
    with pytest.raises(GeographyError, match="do not add up"):
        check_integer(tree, {"state": np.array([3.0, 2.0]), "nation": np.array([6.0])})
    with pytest.raises(GeographyError, match="one per unit"):
        check_integer(tree, {"state": np.array([3.0])})
    closed = check_integer(tree, {"county": np.array([1.0, 2.0, 2.0])})
    assert closed[0].tolist() == [5.0] and closed[1].tolist() == [3.0, 2.0]


def test_data_time_refusals():
    tree = GeographyTree.from_parents({"a": "US", "b": "US"}, ["nation", "state"])
    cells = {0: np.array([[2.5, 1.5]]), 1: np.array([[1.25, 0.75], [1.25, 0.75]])}
    with pytest.raises(RoundingError, match="held total"):
        round_tree(tree, cells, {1: np.array([3.0, 1.0])})   # the real solution does not meet them
    bad = {0: np.array([[2.5, 1.5]]), 1: np.array([[1.25, 0.75], [1.0, 0.75]])}
    with pytest.raises(RoundingError, match="add up"):
        round_tree(tree, bad, {1: np.array([2.0, 2.0])})
    with pytest.raises(RoundingError, match="add up"):
        round_tree(tree, bad)
    with pytest.raises(RoundingError, match="negative"):
        round_tree(tree, {0: np.array([[2.5, 1.5]]), 1: np.array([[1.5, 0.75], [1.0, -0.0001]])})
    with pytest.raises(GeographyError, match="every level"):
        round_tree(tree, {1: cells[1]})


def test_held_region_is_rounded_at_once():
    """docs/math.md 8.8: family by family, the county family below (0, 1, 1, 2) has no rounding; at once it has."""
    counties = np.array([[0.26, 0.0, 1.74, 0.0], [0.0, 0.079, 0.0, 0.921], [0.0, 0.0, 0.0, 1.0]])
    held = np.array([2.0, 1.0, 1.0])
    assert exhaustive(counties, np.array([0, 1, 1, 2]), held) is None
    tree = GeographyTree.from_parents({"s": "US", "c1": "s", "c2": "s", "c3": "s"}, ["nation", "state", "county"])
    state = counties.sum(axis=0, keepdims=True)
    cells = {0: state, 1: state, 2: counties}
    out = round_tree(tree, cells, {"county": held})
    check_tree(tree, cells, check_integer(tree, {"county": held}), out)
    best, _ = tree_exhaustive(tree, cells, check_integer(tree, {"county": held}))
    assert np.isclose(sum(np.abs(out.cells[d] - cells[d]).sum() for d in cells), best)


def test_round_below_streams():
    """Families are consumed a chunk at a time: the first tables come before the generator is exhausted."""
    rng = np.random.default_rng(2)
    seen = []

    def families():
        for n in range(30):
            seen.append(n)
            X, c, _ = fractional_table(rng, 3, 4, held=False)
            yield X, c.astype(np.int64)

    stream = round_below(families(), batch_entries=20)
    R, w = next(stream)
    assert len(seen) < 30 and w == 0
    assert len(list(stream)) == 29
