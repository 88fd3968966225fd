"""Geography releases: the tree passes, plan, engine and invariants against dense numpy."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

import hdmm
from hdmm.geography import GeographyError, GeographyTree, TreeStrategy
from hdmm.georelease import ArrayHistograms, RecordHistograms, geo_plan, optimize_level_weights, release_geography
from hdmm.georelease.levels import tree_objective
from hdmm.georelease.passes import (Partition, TreePasses, partition_bounds, partition_down, partition_up,
                                   top_passes)
from hdmm.georelease.units import unit_seed
from hdmm.records import cell_index
from hdmm.budget import BudgetExceeded
from hdmm.marginals import Marginals
from hdmm.matrix import Explicit, Kronecker, Ones
from trees import random_tree, small_country


def states_and_counties(states: int, low: int, high: int, rng: np.random.Generator) -> GeographyTree:
    """A nation of ``states`` states of ``low`` to ``high - 1`` counties each."""
    pairs = {}
    for s in range(states):
        pairs[f"s{s}"] = "US"
        for c in range(int(rng.integers(low, high))):
            pairs[f"s{s}c{c}"] = f"s{s}"
    return GeographyTree.from_parents(pairs, ["nation", "state", "county"])


def assert_units_add_up(tree: GeographyTree, release, rtol: float, atol: float) -> None:
    """Every unit's estimate equals the sum of its children's, cell by cell."""
    for d in range(tree.depth):
        children = np.add.reduceat(release.estimates[d + 1], tree.child_bounds(d)[:-1], axis=0)
        np.testing.assert_allclose(release.estimates[d], children, rtol=rtol, atol=atol)


DOMAIN = hdmm.Domain(["a", "b"], [2, 3])
WP = hdmm.product(DOMAIN, {"a": hdmm.Identity(2), "b": hdmm.Prefix(3)})
AP = Kronecker([hdmm.Identity(2), hdmm.Prefix(3)])


# ====================================================================== passes
@pytest.mark.parametrize("trial", range(12))
def test_partitioned_passes_equal_the_dense_pseudo_inverse(trial):
    rng = np.random.default_rng(trial)
    depth = int(rng.integers(1, 4))
    tree = random_tree(depth, rng)
    w = rng.uniform(0.2, 2, depth + 1) * (rng.random(depth + 1) < 0.7)
    if not (w > 0).any():
        w[-1] = 1.0
    A = TreeStrategy(tree, w)
    passes = TreePasses(tree, A.weights)
    own = {d: rng.normal(size=(tree.sizes[d], 3)) for d in passes.measured()}
    Y = np.vstack([own[d] * A.weights[d] for d in passes.measured()])
    dense = np.linalg.pinv(A.dense()) @ Y
    whole = passes.solve(own)
    for d in range(passes.finest + 1):
        np.testing.assert_allclose(whole[d], tree.aggregate(d, dense), atol=1e-10)
    for P in range(passes.finest + 1):
        parts = [Partition.of(tree, P, u) for u in range(tree.sizes[P])]
        owns = [{d: own[d][slice(*p.range(d))] for d in passes.measured() if d >= P} for p in parts]
        g = np.vstack([partition_up(passes, p, o) for p, o in zip(parts, owns)])
        c, t = top_passes(passes, P, g, {d: own[d] for d in passes.measured() if d < P})
        for p, o in zip(parts, owns):
            for d, values in partition_down(passes, p, o, c[p.unit:p.unit + 1], t[p.unit:p.unit + 1]).items():
                np.testing.assert_allclose(values, whole[d][slice(*p.range(d))], atol=1e-10)


def random_ranges(tree: GeographyTree, P: int, rng: np.random.Generator, cut: float) -> np.ndarray:
    """Partition bounds of level ``P``: every parent's children cut into consecutive ranges (each gap cut with
    probability ``cut``: 1 gives single units, 0 whole families)."""
    n = tree.sizes[P]
    if P == 0:
        return np.array([0, 1])
    gaps = np.arange(1, n)[rng.random(n - 1) < cut]
    return np.union1d(np.union1d(gaps, tree.child_bounds(P - 1)), [0, n])


@pytest.mark.parametrize("trial", range(16))
def test_sibling_range_passes_equal_the_whole_tree_passes(trial):
    """Partitions of consecutive siblings (single units, whole families and anything between) give the
    unpartitioned passes' estimates at every level, those above ``P`` as sums of the partitions' sums."""
    rng = np.random.default_rng(100 + trial)
    depth = int(rng.integers(1, 5))
    tree = random_tree(depth, rng, fanout=int(rng.integers(2, 6)))
    w = rng.uniform(0.2, 2, depth + 1) * (rng.random(depth + 1) < 0.7)
    if not (w > 0).any():
        w[int(rng.integers(depth + 1))] = 1.0
    passes = TreePasses(tree, w)
    k = int(rng.integers(1, 4))
    own = {d: rng.normal(size=(tree.sizes[d], k)) for d in passes.measured()}
    whole = passes.solve(own)
    for P in range(passes.finest + 1):
        for cut in (0.0, 0.4, 1.0):
            bounds = random_ranges(tree, P, rng, cut)
            parts = [Partition.span(tree, P, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
            owns = [{d: own[d][slice(*p.range(d))] for d in passes.measured() if d >= P} for p in parts]
            g = np.vstack([partition_up(passes, p, o) for p, o in zip(parts, owns)])
            c, t = top_passes(passes, P, g, {d: own[d] for d in passes.measured() if d < P}, bounds)
            assert c.shape == t.shape == (len(parts), k)
            sums = []
            for r, (p, o) in enumerate(zip(parts, owns)):
                est = partition_down(passes, p, o, c[r:r + 1], t[r:r + 1])
                assert sorted(est) == list(range(P, passes.finest + 1))
                for d, values in est.items():
                    np.testing.assert_allclose(values, whole[d][slice(*p.range(d))], atol=1e-10)
                sums.append(est[P].sum(axis=0))
            above = np.add.reduceat(np.array(sums), np.searchsorted(bounds, tree.child_bounds(P - 1)[:-1]),
                                    axis=0) if P else None
            for d in range(P - 1, -1, -1):
                np.testing.assert_allclose(above, whole[d], atol=1e-9)
                if d:
                    above = np.add.reduceat(above, tree.child_bounds(d - 1)[:-1], axis=0)


def test_single_unit_ranges_give_the_same_bits_as_unit_partitions():
    """Bounds of one unit each are the partitions of one unit: ``top_passes`` with and without them agree bit
    for bit, and a range's first pass is the sum of its units' (to rounding)."""
    rng = np.random.default_rng(7)
    tree = random_tree(3, rng, fanout=4)
    passes = TreePasses(tree, np.array([0.5, 0.0, 1.1, 0.8]))
    own = {d: rng.normal(size=(tree.sizes[d], 2)) for d in passes.measured()}
    for P in range(4):
        parts = [Partition.of(tree, P, u) for u in range(tree.sizes[P])]
        assert all(p == Partition.span(tree, P, u, u + 1) for u, p in enumerate(parts))
        owns = [{d: own[d][slice(*p.range(d))] for d in passes.measured() if d >= P} for p in parts]
        g = np.vstack([partition_up(passes, p, o) for p, o in zip(parts, owns)])
        top = {d: own[d] for d in passes.measured() if d < P}
        c, t = top_passes(passes, P, g, top)
        c1, t1 = top_passes(passes, P, g, top, np.arange(tree.sizes[P] + 1))
        assert np.array_equal(c, c1) and np.array_equal(t, t1)
        if P:
            bounds = tree.child_bounds(P - 1)
            for p in range(bounds.size - 1):
                family = Partition.span(tree, P, int(bounds[p]), int(bounds[p + 1]))
                assert family.parent == p and family.size == bounds[p + 1] - bounds[p]
                mine = {d: own[d][slice(*family.range(d))] for d in passes.measured() if d >= P}
                np.testing.assert_allclose(partition_up(passes, family, mine), g[bounds[p]:bounds[p + 1]].sum(0)[None],
                                           atol=1e-12)


def test_partitions_must_be_ranges_of_siblings():
    tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
                                      ["nation", "state", "county"])
    assert Partition.span(tree, 2, 0, 2).ranges == ((0, 2),)
    with pytest.raises(ValueError, match="not siblings"):
        Partition.span(tree, 2, 1, 3)
    with pytest.raises(ValueError, match="0 <= lo < hi"):
        Partition.span(tree, 2, 2, 2)
    assert partition_bounds(tree, 2, None).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="every parent's first child"):
        partition_bounds(tree, 2, np.array([0, 3]))
    with pytest.raises(ValueError, match="increasing integers"):
        partition_bounds(tree, 2, np.array([0, 2, 2, 3]))


@pytest.mark.parametrize("trial", range(10))
def test_partition_ranges_are_the_fewest_sibling_ranges_under_the_cap(trial):
    from hdmm.georelease.plan import default_partition, partition_ranges

    rng = np.random.default_rng(300 + trial)
    depth = int(rng.integers(1, 5))
    tree = random_tree(depth, rng, fanout=int(rng.integers(2, 7)))
    finest = int(rng.integers(0, depth + 1))
    width, values = int(rng.integers(1, 4)), int(rng.integers(1, 40))
    cap = max(1, values // width)
    P, bounds = partition_ranges(tree, finest, width, values=values)
    assert P == default_partition(tree, finest, cap)
    assert np.array_equal(partition_bounds(tree, P, bounds), bounds)
    parts = [Partition.span(tree, P, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    held = [sum(p.range(d)[1] - p.range(d)[0] for d in range(P, finest + 1)) for p in parts]
    for r, p in enumerate(parts):
        assert held[r] <= cap or p.size == 1  # only a single unit may be over the cap
        if r + 1 < len(parts) and parts[r + 1].parent == p.parent and P:  # the fewest: the next unit did not fit
            grown = Partition.span(tree, P, p.units[0], p.units[1] + 1)
            assert sum(grown.range(d)[1] - grown.range(d)[0] for d in range(P, finest + 1)) > cap
    for level in range(finest + 1):  # at a level whose every unit is over the cap: the units of that level
        given, one_each = partition_ranges(tree, finest, width, level=level, values=1, units=1)
        assert given == level and np.array_equal(one_each, np.arange(tree.sizes[level] + 1))
    with pytest.raises(GeographyError, match="partition level"):
        partition_ranges(tree, finest, width, level=finest + 1)


def test_partition_ranges_split_a_large_family_at_the_finer_level():
    """A county of many tracts (Los Angeles' 4,669 under SF1's widths): the tracts, the county's in several
    ranges under the cap and every small county's in one."""
    from hdmm.georelease.plan import partition_ranges

    pairs = {"s0": "US", "s1": "US", "s0c0": "s0", "s1c0": "s1", "s1c1": "s1"}
    for t in range(100):
        pairs[f"s0c0t{t}"] = "s0c0"
    for c in ("s1c0", "s1c1"):
        for t in range(3):
            pairs[f"{c}t{t}"] = c
    tree = GeographyTree.from_parents(pairs, ["nation", "state", "county", "tract"])
    P, bounds = partition_ranges(tree, 3, width=10, values=300)  # 30 units a partition
    assert P == 3 and bounds.tolist() == [0, 30, 60, 90, 100, 103, 106]
    P, bounds = partition_ranges(tree, 3, width=10, values=10**4)
    assert P == 1 and bounds.tolist() == [0, 2]


def test_partition_passes_in_place_give_the_same_bits(monkeypatch):
    """The passes work in place and add ``a * own`` a block of rows at a time (memory): the same bits as the
    whole-array expressions ``b + a * own``, ``b / a`` and ``(b - offsets) / a``."""
    import hdmm.georelease.passes as passes_module

    monkeypatch.setattr(passes_module, "ADD_ROWS_BYTES", 40)  # blocks of one or two rows
    rng = np.random.default_rng(3)
    tree = random_tree(2, rng, fanout=5)
    passes = TreePasses(tree, np.array([0.7, 1.3, 0.9]))
    own = {d: rng.normal(size=(tree.sizes[d], 3)) for d in passes.measured()}
    f = passes.finest
    for P in range(f + 1):
        for u in range(tree.sizes[P]):
            part = Partition.of(tree, P, u)
            mine = {d: own[d][slice(*part.range(d))] for d in passes.measured() if d >= P}
            c, t = rng.normal(size=(1, 3)), rng.normal(size=(1, 3))
            b = np.array(c)  # the sums of accumulate, written out
            for d in range(P, f + 1):
                if d > P:
                    lo, hi = part.range(d - 1)
                    b = np.repeat(b, np.diff(passes._local_bounds(d - 1, lo, hi)), axis=0)
                b = b + passes.a[d] * mine[d]
            assert np.array_equal(passes.accumulate(P, part.range, mine, c), b)
            gammas, _ = passes.up(f, part.range, b / passes.a[f], P)
            z = (b - passes.down(P, part.range, gammas, t, f)) / passes.a[f]
            for d, values in partition_down(passes, part, mine, c, t).items():
                assert np.array_equal(values, passes.totals(P, part.range, z)[d])
            b0 = passes.accumulate(P, part.range, mine, np.zeros((1, 3)))
            assert np.array_equal(partition_up(passes, part, mine), passes.up(f, part.range, b0 / passes.a[f], P)[1])
            assert all(np.array_equal(own[d][slice(*part.range(d))], mine[d]) for d in mine)  # inputs untouched
            spent = {d: v.copy() for d, v in mine.items()}  # reused: the finest level's array holds the estimates
            reused = partition_down(passes, part, spent, c, t, reuse=True)
            assert all(np.array_equal(reused[d], passes.totals(P, part.range, z)[d]) for d in reused)
            assert reused[f] is spent[f]


# ====================================================================== level weights
@pytest.mark.parametrize("norm", [1, 2])
def test_level_weights_beat_a_grid_search(norm):
    tree = random_tree(2, np.random.default_rng(5), fanout=6)
    released = {0: 1.0, 1: 2.0, 2: 1.0}
    w = optimize_level_weights(tree, released, norm)
    assert w.sum() == pytest.approx(1.0)
    best = min(
        tree_objective(tree, np.array([a, b, 1 - a - b]), released, norm)
        for a in np.linspace(0, 1, 41) for b in np.linspace(0, 1, 41) if 1 - a - b > 1e-9
    )
    assert tree_objective(tree, w, released, norm) <= best * (1 + 1e-9)


def test_level_weights_only_measure_what_helps():
    tree = random_tree(2, np.random.default_rng(1), fanout=4)
    w = optimize_level_weights(tree, {"L1": 1.0}, 1)
    assert w[2] == 0.0 and w[1] > 0  # a finer level adds nothing for coarser totals


# ====================================================================== engine against dense numpy
UNION_AP = hdmm.matrix.VStack([Kronecker([hdmm.Identity(2), hdmm.Prefix(3)]),
                               Kronecker([Ones(1, 2), hdmm.Identity(3)])])


def _dense_release(tree, plan, H, seed, invariants=None):
    """The constrained least-squares answers of the whole Kronecker strategy, densely."""
    A_tree = TreeStrategy(tree, plan.level_weights)
    ys = []
    for d in plan.measured:
        unit = plan.unit_plan(d)
        X = tree.aggregate(d, H)
        ys += [hdmm.measure(unit, X[u], rng=unit_seed(seed, tree.levels[d], tree.codes(d)[u])).answers
               for u in range(tree.sizes[d])]
    A = np.kron(A_tree.dense(), plan.person.strategy.dense())
    cov = plan.noise_variance * np.linalg.pinv(A.T @ A)
    xhat = np.linalg.pinv(A) @ np.concatenate(ys)
    if invariants is not None:
        C = np.kron(tree.aggregate(1, np.eye(tree.leaves)), np.ones((1, DOMAIN.size)))
        c = np.array(list(invariants["state"].values()))
        K = C @ cov @ C.T
        xhat = xhat - cov @ C.T @ np.linalg.solve(K, C @ xhat - c)
        cov = cov - cov @ C.T @ np.linalg.solve(K, C @ cov)
    return xhat.reshape(tree.leaves, DOMAIN.size), cov


@pytest.mark.parametrize("privacy, strategy", [(hdmm.PureDP(1.0), AP), (hdmm.ZCDP(0.5), AP),
                                               (hdmm.ApproxDP(1.0, 1e-6), AP), (hdmm.PureDP(1.0), UNION_AP)])
@pytest.mark.parametrize("with_invariants", [False, True])
def test_local_engine_equals_dense_least_squares(privacy, strategy, with_invariants):
    tree = small_country()
    H = np.random.default_rng(3).integers(0, 5, size=(tree.leaves, DOMAIN.size)).astype(float)
    invariants = None
    if with_invariants:
        b = tree.leaf_bounds(1)
        invariants = {"state": {f"s{s}": float(H[b[s]:b[s + 1]].sum()) for s in range(3)}}
    plan = geo_plan(tree, WP, privacy, strategy=strategy, invariants=invariants,
                    level_weights="auto" if privacy.norm == 2 else [1.0, 1.0, 2.0, 3.0])
    release = release_geography(plan, ArrayHistograms(sp.csr_matrix(H)), seed=7)
    Xhat, cov = _dense_release(tree, plan, H, 7, invariants)
    for d in plan.levels:
        np.testing.assert_allclose(release.answers(d), tree.aggregate(d, Xhat) @ WP.dense().T, atol=1e-8)
        np.testing.assert_allclose(release.totals(d), tree.aggregate(d, Xhat).sum(axis=1), atol=1e-8)
        L = np.kron(tree.aggregate(d, np.eye(tree.leaves)), WP.dense())
        np.testing.assert_allclose(plan.variances(d).ravel(), np.einsum("ij,jk,ik->i", L, cov, L), rtol=1e-8,
                                   atol=1e-10)
        assert plan.expected_rmse(d) == pytest.approx(np.sqrt(np.mean(np.einsum("ij,jk,ik->i", L, cov, L))), rel=1e-8)
    if with_invariants:
        np.testing.assert_allclose(release.totals("state"), list(invariants["state"].values()), rtol=1e-12)


def test_every_parent_equals_the_sum_of_its_children():
    tree = small_country(2)
    H = sp.csr_matrix(np.random.default_rng(0).integers(0, 9, size=(tree.leaves, DOMAIN.size)).astype(float))
    release = release_geography(geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP), ArrayHistograms(H), seed=1)
    assert_units_add_up(tree, release, rtol=1e-12, atol=1e-9)


def test_sensitivity_is_the_dense_column_norm_of_the_whole_strategy():
    tree = small_country(1)
    for privacy in (hdmm.PureDP(1.0), hdmm.ZCDP(1.0)):
        plan = geo_plan(tree, WP, privacy, strategy=AP, level_weights=[0.1, 0.2, 0.3, 0.4])
        A = np.kron(TreeStrategy(tree, plan.level_weights).dense(), AP.dense())
        dense = np.max(np.linalg.norm(A, ord=privacy.norm, axis=0))
        assert plan.sensitivity == pytest.approx(dense, rel=1e-8)
        assert plan.sensitivity >= dense


def test_records_and_histograms_give_the_same_release():
    tree = GeographyTree.from_table(pd.DataFrame({"state": ["01", "01", "02"], "county": ["001", "003", "001"]}),
                                    ["state", "county"])
    rng = np.random.default_rng(0)
    records = pd.DataFrame({"state": rng.choice(["01", "02"], 300), "a": rng.integers(0, 2, 300),
                            "b": rng.integers(0, 3, 300)})
    records["county"] = np.where(records["state"] == "01", rng.choice(["001", "003"], 300), "001")
    plan = geo_plan(tree, WP, hdmm.ZCDP(1.0), strategy=AP)
    from_records = release_geography(plan, RecordHistograms.of(tree, DOMAIN, records), seed=3)
    leaves = tree.locate(records)
    H = sp.csr_matrix((np.ones(300), (leaves, cell_index(DOMAIN, records))), shape=(tree.leaves, DOMAIN.size))
    from_matrix = release_geography(plan, ArrayHistograms(H), seed=3)
    for d in plan.levels:
        np.testing.assert_array_equal(from_records.estimates[d], from_matrix.estimates[d])
    again = release_geography(plan, ArrayHistograms(H), seed=3)
    np.testing.assert_array_equal(again.estimates[2], from_matrix.estimates[2])
    fresh = release_geography(plan, ArrayHistograms(H))
    assert not np.allclose(fresh.estimates[2], from_matrix.estimates[2])
    table = from_records.table("county")
    assert list(table.columns) == ["level", "code", "name", "query", "answer", "std_error"]
    assert len(table) == 3 * WP.shape[0]


def test_save_writes_a_parquet_dataset_by_level(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    release = release_geography(geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP), ArrayHistograms(H), seed=0)
    out = tmp_path / "out"
    release.save(out)
    assert sorted(p.name for p in out.iterdir()) == sorted(["_provenance.json"] + [f"level={n}" for n in tree.levels])
    meta = json.loads((out / "_provenance.json").read_text())
    assert meta["privacy"] == {"type": "PureDP", "epsilon": 1.0} or meta["privacy"]["epsilon"] == 1.0
    table = pq.read_table(out / "level=county")
    assert json.loads(table.schema.metadata[b"hdmm"])["seeded"] is True
    assert table.num_rows == tree.sizes[2] * WP.shape[0]
    with pytest.raises(FileExistsError):
        release.save(out)
    release.save(f"{tmp_path / 'slash'}/")  # a directory named with a trailing separator
    assert (tmp_path / "slash" / "_provenance.json").exists() and not (tmp_path / "slash.partial").exists()
    with pytest.raises(ValueError, match="not a URL"):
        release.save("s3://bucket/release")


def test_read_answers_gives_back_every_level_in_the_trees_order(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    from hdmm.georelease.files import read_answers

    tree = small_country()
    H = sp.csr_matrix(np.random.default_rng(1).integers(0, 4, (tree.leaves, DOMAIN.size)).astype(float))
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    release = release_geography(plan, ArrayHistograms(H), seed=0)
    release.save(tmp_path / "out")
    for d in plan.levels:
        np.testing.assert_array_equal(read_answers(tmp_path / "out", plan, d), release.answers(d))
    with pytest.raises(FileNotFoundError, match="no answers of level 'tract'"):
        read_answers(tmp_path / "nothing", plan, "tract")
    county = tmp_path / "out" / "level=county"
    table = pq.read_table(county / "part-0.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), county / "part-0.parquet")  # one answer lost
    with pytest.raises(ValueError, match="missing or repeated"):
        read_answers(tmp_path / "out", plan, "county")
    pq.write_table(table, county / "part-1.parquet")  # now repeated
    with pytest.raises(ValueError, match="missing or repeated"):
        read_answers(tmp_path / "out", plan, "county")
    other = geo_plan(small_country(seed=5), WP, hdmm.PureDP(1.0), strategy=AP)
    with pytest.raises(ValueError, match="does not have"):
        read_answers(tmp_path / "out", other, "tract")


# ====================================================================== bad input, before any noise
def _count_noise(monkeypatch):
    calls = []
    import hdmm.georelease.units as units

    original = units.measure_many
    monkeypatch.setattr(units, "measure_many", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


def test_plan_refusals():
    tree = small_country()
    with pytest.raises(GeographyError, match="named twice"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, levels=["state", "state"])
    with pytest.raises(GeographyError, match="finer than the finest measured"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, level_weights={"state": 1.0})
    with pytest.raises(GeographyError, match="do not add up"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP,
                 invariants={"nation": {"US": 10}, "state": {"s0": 3, "s1": 3, "s2": 3}})
    with pytest.raises(GeographyError, match="not in the tree"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"state": {"s9": 3}})
    with pytest.raises(GeographyError, match="finite count"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"state": {"s0": -1}})
    with pytest.raises(GeographyError, match=r"s0.* is 10.5: a total is a number of records, a whole"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"state": {"s0": 10.5}})  # issue 22.3
    with pytest.raises(GeographyError, match="no level"):
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, levels=["block"])


def test_data_refusals_come_before_any_noise(monkeypatch):
    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    calls = _count_noise(monkeypatch)
    wrong = {"state": {"s0": 1.0, "s1": 1.0, "s2": 1.0}}
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants=wrong)
    with pytest.raises(GeographyError, match="not the number of records"):
        release_geography(plan, ArrayHistograms(H), seed=0)
    records = pd.DataFrame({"leaf": ["s0c0t0", "nowhere"], "a": [0, 1], "b": [0, 2]})
    with pytest.raises(GeographyError, match="1 record has leaf codes that are not leaves of the tree") as caught:
        RecordHistograms.of(tree, DOMAIN, records, leaf_column="leaf")
    assert "nowhere" not in str(caught.value)  # issue 22.4: a code only the data hold is private
    with pytest.raises(ValueError, match="unknown engine"):
        release_geography(geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP), ArrayHistograms(H), engine="dask")
    assert calls == []


# ====================================================================== non-negative estimates
@pytest.mark.parametrize("seed", range(5))
def test_simplex_projection_meets_its_optimality_conditions(seed):
    from hdmm.georelease.nonneg import simplex_projection

    rng = np.random.default_rng(seed)
    V = rng.normal(size=(int(rng.integers(1, 6)), 40)) * 3
    totals = np.abs(rng.normal(size=40)) * 4
    totals[:3] = 0.0
    P = simplex_projection(V, totals)
    assert np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=0), totals, atol=1e-12)
    for j in range(V.shape[1]):  # KKT: V - P is one threshold on the support and >= V off it
        positive = P[:, j] > 0
        if positive.any():
            theta = (V[:, j] - P[:, j])[positive]
            np.testing.assert_allclose(theta, theta[0], atol=1e-12)
            assert np.all(V[~positive, j] <= theta[0] + 1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_thresholds_equal_the_sort_formula(seed):
    from hdmm.georelease.nonneg import thresholds

    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 25)), int(rng.integers(1, 40))
    V = rng.normal(0, 3, (k, n)) * (rng.random((k, n)) < 0.7)     # ties at zero included
    t = np.maximum(rng.normal(2, 3, n), 0) * (rng.random(n) < 0.8)  # some totals 0
    U = -np.sort(-V, axis=0)                                       # Held et al.: from the sorted column
    excess = np.cumsum(U, axis=0) - t
    ok = U - excess / np.arange(1, k + 1)[:, None] > 0
    last = k - 1 - np.argmax(ok[::-1], axis=0)
    theta = np.where(ok.any(axis=0), excess[last, np.arange(n)] / (last + 1), U[0])
    np.testing.assert_allclose(np.maximum(V - thresholds(V, t), 0), np.maximum(V - theta, 0), atol=1e-12)


def test_thresholds_of_tied_largest_values_stay_finite():
    # (3 x 0.1) / 3 rounds above 0.1: Michelot's kept set would empty (0/0) without the guard
    from hdmm.georelease.nonneg import simplex_projection, thresholds

    V = np.array([[0.1, 0.1], [0.1, 0.1], [0.1, 0.1], [0.05, 0.05]])
    t = np.array([0.0, 1e-17])
    assert np.all(np.isfinite(thresholds(V, t)))
    P = simplex_projection(V, t)
    assert np.all(np.isfinite(P)) and np.all(P >= 0)
    np.testing.assert_allclose(P.sum(axis=0), t, atol=1e-16)
    rng = np.random.default_rng(0)
    for _ in range(300):                                    # ties among the largest values, random totals
        V = np.repeat(rng.random((1, 5)), int(rng.integers(3, 10)), axis=0)
        V = np.vstack([V, rng.random((3, 5)) * V[0]])
        t = rng.random(5) * rng.choice([0.0, 1e-12, 1.0], 5)
        P = simplex_projection(V, t)
        assert np.all(np.isfinite(P)) and np.allclose(P.sum(axis=0), t, atol=1e-12)


def test_nonnegative_release_is_consistent_and_reports_its_change():
    tree = small_country(4)
    H = sp.csr_matrix(np.random.default_rng(2).integers(0, 3, size=(tree.leaves, DOMAIN.size)).astype(float))
    total = float(H.sum())
    plan = geo_plan(tree, WP, hdmm.PureDP(0.3), strategy=AP, invariants={"nation": {"US": total}})
    ls = release_geography(plan, ArrayHistograms(H), seed=9)
    nn = release_geography(plan, ArrayHistograms(H), seed=9, postprocess="nonnegative")
    assert nn.postprocess == "nonnegative" and set(nn.change) == set(plan.levels)
    assert nn.totals("nation")[0] == pytest.approx(total, rel=1e-12)
    for d in plan.levels:
        assert np.all(nn.answers(d) >= -1e-9) and np.all(nn.totals(d) >= -1e-9)
        rms = np.sqrt(np.mean((nn.answers(d) - ls.answers(d)) ** 2))
        assert nn.change[d] == pytest.approx(rms, rel=1e-9)
    assert_units_add_up(tree, nn, rtol=1e-9, atol=1e-8)
    assert np.any(ls.answers(3) < 0)  # the post-processing had something to do


def test_nonnegative_release_holds_state_invariants():
    tree = small_country(5)
    H = sp.csr_matrix(np.random.default_rng(4).integers(0, 3, size=(tree.leaves, DOMAIN.size)).astype(float))
    b = tree.leaf_bounds(1)
    states = {f"s{s}": float(H[b[s]:b[s + 1]].sum()) for s in range(3)}
    plan = geo_plan(tree, WP, hdmm.PureDP(0.3), strategy=AP, invariants={"state": states})
    nn = release_geography(plan, ArrayHistograms(H), seed=2, postprocess="nonnegative")
    np.testing.assert_allclose(nn.totals("state"), list(states.values()), rtol=1e-9)
    assert nn.totals("nation")[0] == pytest.approx(sum(states.values()), rel=1e-9)
    assert_units_add_up(tree, nn, rtol=1e-9, atol=1e-8)
    assert all(np.all(nn.answers(d) >= -1e-9) for d in plan.levels)


def test_nonnegative_release_holds_invariants_on_two_levels():
    # counties' totals held below states' of very different sizes: the nation's projection meets the
    # small states' totals only to rounding at the nation's scale, and their county families must
    # still start (no "cells add up to ... but the totals to ...") and meet each county's total
    rng = np.random.default_rng(0)
    tree = states_and_counties(8, 2, 5, rng)
    H = rng.integers(0, 3, size=(tree.leaves, DOMAIN.size)).astype(float)
    H[:tree.leaf_bounds(1)[1]] *= 1e6                            # one state a million times the others
    H = sp.csr_matrix(H)
    b1, b2 = tree.leaf_bounds(1), tree.leaf_bounds(2)
    states = {code: float(H[b1[s]:b1[s + 1]].sum()) for s, code in enumerate(tree.codes("state"))}
    counties = {code: float(H[b2[c]:b2[c + 1]].sum()) for c, code in enumerate(tree.codes("county"))}
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"state": states, "county": counties})
    nn = release_geography(plan, ArrayHistograms(H), seed=0, postprocess="nonnegative")
    np.testing.assert_allclose(nn.totals("state"), list(states.values()), rtol=1e-13)
    np.testing.assert_allclose(nn.totals("county"), list(counties.values()), rtol=1e-13)
    assert_units_add_up(tree, nn, rtol=1e-12, atol=1e-9)


def test_balance_meets_rows_and_columns_to_rounding():
    from hdmm.georelease.nonneg import balance, transport_projection

    rng = np.random.default_rng(9)
    truth = rng.poisson(2, size=(5, 40)).astype(float)
    truth[0] *= 1e6                                              # one large child beside small ones
    V = truth + rng.normal(0, 1, size=truth.shape)
    c, r = truth.sum(axis=0), truth.sum(axis=1)
    X = transport_projection(V, c, r, rtol=1e-6)                 # rows met only to 1e-6 of the total
    B = balance(X, c, r)
    np.testing.assert_allclose(B.sum(axis=1), r, rtol=1e-13)
    np.testing.assert_allclose(B.sum(axis=0), c, rtol=1e-13)
    assert B.min() >= 0 and np.all(B[X == 0] == 0)
    assert np.abs(B - X).max() <= 1e-6 * c.sum()


def test_transport_projection_matches_a_general_solver():
    from scipy.optimize import minimize

    from hdmm.georelease.nonneg import transport_projection

    rng = np.random.default_rng(0)
    truth = rng.poisson(2, size=(3, 6)).astype(float)
    V = truth + rng.normal(0, 2, size=truth.shape)
    X = transport_projection(V, truth.sum(axis=0), truth.sum(axis=1))
    constraints = [{"type": "eq", "fun": lambda x, j=j: x.reshape(3, 6)[:, j].sum() - truth[:, j].sum()}
                   for j in range(6)]
    constraints += [{"type": "eq", "fun": lambda x, i=i: x.reshape(3, 6)[i].sum() - truth[i].sum()} for i in range(2)]
    best = minimize(lambda x: ((x - V.ravel()) ** 2).sum(), np.maximum(V, 0).ravel(), constraints=constraints,
                    bounds=[(0, None)] * 18, method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000})
    np.testing.assert_allclose(X, best.x.reshape(3, 6), atol=1e-6)
    np.testing.assert_allclose(X.sum(axis=0), truth.sum(axis=0), atol=1e-12)


def test_metric_projection_of_a_family_matches_a_general_solver():
    from scipy.optimize import minimize

    from hdmm.georelease.nonneg import simplex_projection
    from hdmm.postprocess import metric_projection

    rng = np.random.default_rng(3)
    A = Explicit(rng.random((5, 4)))          # a strategy that measures no cell alone
    parent = np.array([3.0, 0.0, 1.0, 2.0])
    X = parent / 3 + rng.normal(0, 1.5, size=(3, 4))
    V = metric_projection(A, X, lambda Y: simplex_projection(Y, parent), noise_std=1.0, tol=1e-10)
    D = A.dense()

    def objective(v):
        return float(np.sum((D @ (v.reshape(3, 4) - X).T) ** 2))

    constraints = [{"type": "eq", "fun": lambda v, j=j: v.reshape(3, 4)[:, j].sum() - parent[j]} for j in range(4)]
    best = minimize(objective, simplex_projection(X, parent).ravel(), constraints=constraints, bounds=[(0, None)] * 12,
                    method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    assert objective(V.ravel()) <= best.fun + 1e-7
    np.testing.assert_allclose(V.sum(axis=0), parent, atol=1e-12)
    assert V.min() >= 0
    euclid = simplex_projection(X, parent)
    assert objective(V.ravel()) < objective(euclid.ravel())   # the metric matters here


def test_cell_space_collapses_attributes_the_strategy_only_totals():
    from hdmm.georelease.nonneg import CellSpace

    domain = hdmm.Domain(["a", "r", "b"], [2, 4, 3])
    W = hdmm.product(domain, {"a": hdmm.Identity(2), "b": hdmm.Prefix(3)})     # totals over r
    A = Kronecker([hdmm.Identity(2), hdmm.Total(4), hdmm.Prefix(3)])
    plan = geo_plan(small_country(), W, hdmm.PureDP(1.0), strategy=A)
    space = CellSpace(plan)
    assert space.collapsed == (1,) and space.strategy.shape == (6, 6)
    x = np.random.default_rng(0).random(24)
    reduced = space.reduce(x[None, :])[0]
    np.testing.assert_allclose(reduced, x.reshape(2, 4, 3).sum(axis=1).ravel())
    np.testing.assert_allclose(space.strategy @ reduced, A @ x)
    np.testing.assert_allclose(W @ space.expand(reduced), W @ x)
    np.testing.assert_allclose(space.answers(reduced), W @ x)
    assert space.workload.shape == (W.shape[0], 6)
    assert CellSpace(geo_plan(small_country(), WP, hdmm.PureDP(1.0), strategy=AP)).collapsed == ()


def test_nonnegative_estimates_stay_near_least_squares_when_cells_are_measured_only_in_sums():
    # a strategy of wide sums measures no single cell precisely: projecting each noisy cell at zero
    # (Euclidean) would add its clipped noise to every large sum; measured through the strategy, the
    # non-negative answers stay within the least-squares error
    domain = hdmm.Domain(["a", "r", "b"], [2, 4, 16])
    W = hdmm.product(domain, {"a": hdmm.Identity(2), "b": hdmm.Prefix(16)})
    A = Kronecker([hdmm.Identity(2), hdmm.Total(4), hdmm.Prefix(16)])
    tree = small_country(6)
    rng = np.random.default_rng(1)
    H = sp.csr_matrix(rng.poisson(0.05, size=(tree.leaves, domain.size)).astype(float))
    plan = geo_plan(tree, W, hdmm.PureDP(0.5), strategy=A)
    nn = release_geography(plan, ArrayHistograms(H), seed=3, postprocess="nonnegative")
    for d in plan.levels:
        assert np.all(nn.answers(d) >= -1e-9)
        assert nn.change[d] < 2.0 * plan.expected_rmse(d), (d, nn.change[d], plan.expected_rmse(d))
    assert_units_add_up(tree, nn, rtol=1e-9, atol=1e-8)


def test_transport_projection_from_a_nearby_dual_gives_the_same_projection():
    from hdmm.georelease.nonneg import transport_projection

    rng = np.random.default_rng(5)
    truth = rng.poisson(3, size=(4, 30)).astype(float)
    V = truth + rng.normal(0, 2, size=truth.shape)
    cold, beta = transport_projection(V, truth.sum(axis=0), truth.sum(axis=1), dual=True)
    nearby = V + rng.normal(0, 0.05, size=V.shape)
    warm = transport_projection(nearby, truth.sum(axis=0), truth.sum(axis=1), beta=beta)
    np.testing.assert_allclose(warm, transport_projection(nearby, truth.sum(axis=0), truth.sum(axis=1)), atol=1e-9)


def test_nonnegative_refusals_come_before_noise(monkeypatch):
    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    calls = _count_noise(monkeypatch)
    state = int(np.flatnonzero(np.diff(tree.child_bounds(1)) > 1)[0])  # a state with several counties
    county = int(tree.child_bounds(1)[state])
    lo, hi = tree.leaf_bounds(2)[county], tree.leaf_bounds(2)[county + 1]
    some = {tree.codes("county")[county]: float(H[lo:hi].sum())}
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"county": some})
    with pytest.raises(GeographyError, match="all or none"):
        release_geography(plan, ArrayHistograms(H), postprocess="nonnegative")
    import hdmm.georelease.nonneg as nonneg

    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    widest = int(max(np.diff(tree.child_bounds(d)).max() for d in range(tree.depth)))
    assert widest >= 3
    monkeypatch.setattr(nonneg, "MAX_FAMILY_CELLS", 2 * DOMAIN.size - 1)  # one unit a group: as many as units
    with pytest.raises(GeographyError, match="need more groups"):
        release_geography(plan, ArrayHistograms(H), postprocess="nonnegative")
    assert calls == []


def test_family_groups():
    from hdmm.georelease.nonneg import MAX_FAMILY_CELLS, family_groups

    assert family_groups(7, MAX_FAMILY_CELLS // 7).tolist() == [0, 7]
    bounds = family_groups(4011, 28_980)                       # the tracts of a large county, SF1's cells
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == 4011 and sizes.max() - sizes.min() <= 1
    assert sizes.max() * 28_980 <= MAX_FAMILY_CELLS and len(sizes) * 28_980 <= MAX_FAMILY_CELLS
    assert (len(sizes) - 1) * (MAX_FAMILY_CELLS // 28_980) < 4011          # one group fewer would not hold them
    assert family_groups(10**6, 28_980) is None and family_groups(1, MAX_FAMILY_CELLS + 1) is None


def test_weighted_metric_projection_matches_a_general_solver():
    from scipy.optimize import minimize

    from hdmm.georelease.nonneg import simplex_projection
    from hdmm.postprocess import metric_projection

    rng = np.random.default_rng(8)
    A = Explicit(rng.random((5, 4)))
    parent = np.array([3.0, 0.5, 1.0, 2.0])
    X = parent / 3 + rng.normal(0, 1.5, size=(3, 4))
    w = np.array([1.0, 0.5, 0.25])
    V = metric_projection(A, X, lambda Y: simplex_projection(Y, parent), noise_std=1.0, tol=1e-10, weights=w)
    D = A.dense()

    def objective(v):
        return float(np.sum(w * np.sum((D @ (v.reshape(3, 4) - X).T) ** 2, axis=0)))

    constraints = [{"type": "eq", "fun": lambda v, j=j: v.reshape(3, 4)[:, j].sum() - parent[j]} for j in range(4)]
    best = minimize(objective, simplex_projection(X, parent).ravel(), constraints=constraints, bounds=[(0, None)] * 12,
                    method="SLSQP", options={"ftol": 1e-15, "maxiter": 1000})
    assert objective(V.ravel()) <= best.fun + 1e-7
    np.testing.assert_allclose(V.sum(axis=0), parent, atol=1e-12)
    unweighted = metric_projection(A, X, lambda Y: simplex_projection(Y, parent), noise_std=1.0, tol=1e-10)
    assert not np.allclose(V, unweighted, atol=1e-3)  # the weights matter here
    equal = metric_projection(A, X, lambda Y: simplex_projection(Y, parent), noise_std=1.0, tol=1e-10,
                              weights=np.full(3, 0.3))
    np.testing.assert_allclose(equal, unweighted, atol=1e-7)  # equal weights: the same minimiser
    with pytest.raises(ValueError, match="positive finite"):
        metric_projection(A, X, lambda Y: Y, noise_std=1.0, weights=np.array([1.0, 0.0, 1.0]))


@pytest.mark.parametrize("held", [False, True])
def test_families_too_large_to_project_at_once_are_projected_in_groups(monkeypatch, held):
    import hdmm.georelease.nonneg as nonneg

    rng = np.random.default_rng(11)
    tree = states_and_counties(5, 4, 7, rng)
    H = sp.csr_matrix(rng.poisson(0.4, size=(tree.leaves, DOMAIN.size)).astype(float))
    b = tree.leaf_bounds(1)
    invariants = {"state": {f"s{s}": float(H[b[s]:b[s + 1]].sum()) for s in range(5)}} if held else None
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, invariants=invariants, partition="state")  # groups in a task
    whole = release_geography(plan, ArrayHistograms(H), seed=4, postprocess="nonnegative")
    monkeypatch.setattr(nonneg, "MAX_FAMILY_CELLS", 3 * DOMAIN.size)   # groups of at most three units
    calls, original = [], nonneg.TopDown.family

    def family(self, d, X, *rest, **options):
        calls.append(len(X))
        return original(self, d, X, *rest, **options)

    monkeypatch.setattr(nonneg.TopDown, "family", family)
    grouped = release_geography(plan, ArrayHistograms(H), seed=4, postprocess="nonnegative")
    assert max(calls) == 3 and len(calls) == 3 * (1 + tree.sizes[1])     # every family came in two groups
    assert_units_add_up(tree, grouped, rtol=1e-9, atol=1e-8)
    for d in plan.levels:
        assert np.all(grouped.answers(d) >= -1e-9)
        # two stages cost some accuracy against the joint projection, not much
        assert grouped.change[d] <= 1.5 * whole.change[d] + 0.1 * plan.expected_rmse(d), (d, grouped.change,
                                                                                         whole.change)
    if held:
        np.testing.assert_allclose(grouped.totals("state"), list(invariants["state"].values()), rtol=1e-9)
    np.testing.assert_allclose(grouped.answers(0), whole.answers(0), atol=1e-6)  # the root is projected alone


def test_a_family_walked_in_given_groups_in_separate_walks(monkeypatch):
    """The two stages of a family in groups as separate calls (the groups' projection in one walk, each group's
    children in a walk of its own, as a partition of siblings would run them): with the groups of
    ``family_groups`` the one-walk answers bit for bit; with any groups, children adding up to their group's
    cells and the groups to the parent's, all non-negative."""
    import hdmm.georelease.nonneg as nonneg
    from hdmm.georelease.nonneg import TopDown, family_groups

    rng = np.random.default_rng(12)
    tree = states_and_counties(3, 4, 7, rng)
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    z = {d: rng.normal(2.0, 1.0, size=(tree.sizes[d], AP.shape[0])) for d in range(3)}

    def walk():
        return TopDown(plan, lambda d, units: z[d][units], None)

    states: dict[int, np.ndarray] = {}
    top = walk()
    top.descend(0, 0, top.root(), 1, states)
    monkeypatch.setattr(nonneg, "MAX_FAMILY_CELLS", 3 * DOMAIN.size)  # groups of at most three counties
    bounds_of = tree.child_bounds(1)
    for u, x_plus in states.items():
        n = int(bounds_of[u + 1] - bounds_of[u])
        one = walk()
        one.descend(1, u, x_plus)
        for bounds in (family_groups(n, DOMAIN.size), np.array([0, 1, n]), np.array([0, n - 2, n - 1, n])):
            stage1 = walk()
            parts = stage1.group_parts(1, u, x_plus, bounds)
            children = np.arange(bounds_of[u], bounds_of[u + 1])
            sums = np.vstack([stage1.cells(2, children[a:b]).sum(axis=0) for a, b in zip(bounds, bounds[1:])])
            assert np.array_equal(walk().group_parts(1, u, x_plus, bounds, sums=sums), parts)
            np.testing.assert_allclose(parts.sum(axis=0), x_plus, rtol=1e-9, atol=1e-9)
            answers = {}
            for a, b, part in zip(bounds, bounds[1:], parts):
                group, cells = walk(), {}
                group.descend_group(1, u, int(a), int(b), part, reached=cells)
                answers.update(group.answers[2])
                got = np.vstack([cells[c] for c in children[a:b]])
                assert np.all(got >= 0)
                np.testing.assert_allclose(got.sum(axis=0), part, rtol=1e-9, atol=1e-9)
            assert sorted(answers) == children.tolist()
            if np.array_equal(bounds, family_groups(n, DOMAIN.size)):
                assert all(np.array_equal(answers[c], one.answers[2][c]) for c in children)


def test_a_geography_release_is_charged_once_to_a_budget(monkeypatch, tmp_path):
    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    budget = hdmm.Budget(hdmm.PureDP(1.5))
    budget.save(tmp_path / "budget.json")
    release = release_geography(plan, ArrayHistograms(H), seed=0, budget=budget, label="by county")
    assert budget.spent == pytest.approx(1.0) and release.charge.cost == pytest.approx(1.0)
    assert release.provenance()["charge"]["workload"] == "by county"
    assert hdmm.Budget.load(tmp_path / "budget.json").spent == pytest.approx(1.0)
    calls = _count_noise(monkeypatch)
    with pytest.raises(BudgetExceeded):
        release_geography(plan, ArrayHistograms(H), budget=budget)
    assert calls == [] and budget.spent == pytest.approx(1.0)


def test_sources_that_do_not_fit_the_plan_are_refused_before_any_noise(monkeypatch):
    tree = small_country()
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    calls = _count_noise(monkeypatch)
    with pytest.raises(ValueError, match="person cells"):      # histograms over another person domain
        release_geography(plan, ArrayHistograms(sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size - 2)))), seed=0)
    negative = np.ones((tree.leaves, DOMAIN.size))
    negative[0, :2] = [-1.0, 3.0]                               # the leaf's total stays positive
    with pytest.raises(ValueError, match="negative or non-finite"):
        ArrayHistograms(sp.csr_matrix(negative))
    # records placed in another tree with as many leaves: refused, not released against the wrong units
    other = GeographyTree.from_parents({f"t{i}": "c0" for i in range(tree.leaves)} | {"c0": "s0", "s0": "US"},
                                       ["nation", "state", "county", "tract"])
    assert other.leaves == tree.leaves
    records = pd.DataFrame({"leaf": list(other.codes("tract")), "a": 0, "b": 1})
    with pytest.raises(ValueError, match="another geography tree"):
        release_geography(plan, RecordHistograms.of(other, DOMAIN, records, leaf_column="leaf"), seed=0)
    wide = RecordHistograms.of(tree, hdmm.Domain(["a", "b"], [2, 4]),
                               pd.DataFrame({"leaf": [tree.codes("tract")[0]], "a": [0], "b": [3]}), leaf_column="leaf")
    with pytest.raises(ValueError, match="person cells"):
        release_geography(plan, wide, seed=0)
    assert calls == []


def test_records_without_a_code_are_refused_by_name():
    tree = GeographyTree.from_table(pd.DataFrame({"state": ["01", "01", "02"], "county": ["001", "003", "001"]}),
                                    ["state", "county"])
    records = pd.DataFrame({"state": ["01", "02"], "county": ["001", None], "a": [0, 1], "b": [0, 2]})
    with pytest.raises(GeographyError, match=r"no code in column\(s\) \['county'\]"):
        RecordHistograms.of(tree, DOMAIN, records)
    with pytest.raises(GeographyError, match="no code in 'leaf'"):
        RecordHistograms.of(tree, DOMAIN, pd.DataFrame({"leaf": ["01001", None], "a": [0, 1], "b": [0, 2]}),
                            leaf_column="leaf")


def test_an_edited_geography_plan_is_refused_before_its_charge():
    import dataclasses

    tree = small_country()
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    edited = dataclasses.replace(plan, noise_scale=plan.noise_scale / 4)
    budget = hdmm.Budget(hdmm.PureDP(3.0))
    with pytest.raises(ValueError, match="not calibrated to its strategy"):
        release_geography(edited, ArrayHistograms(sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))), seed=0,
                          budget=budget)
    assert budget.spent == 0.0


# ====================================================================== integer estimates
def assert_integer_tables(tree: GeographyTree, release) -> None:
    """Whole, non-negative answers and totals, every parent's answers the sum of its children's, exactly."""
    for d in release.plan.levels:
        A = release.estimates[d]
        assert np.array_equal(A, np.rint(A)) and np.all(A >= 0)
    assert_units_add_up(tree, release, rtol=0, atol=0)


@pytest.mark.parametrize("held", [None, "nation", "state", "county"])
@pytest.mark.parametrize("seed", [0, 1])
def test_integer_release_is_whole_consistent_and_keeps_invariants(held, seed):
    rng = np.random.default_rng(seed)
    tree = states_and_counties(4, 1, 5, rng)
    H = sp.csr_matrix(rng.poisson(0.7, size=(tree.leaves, DOMAIN.size)).astype(float))
    invariants = None
    if held is not None:
        d = tree.level_index(held)
        b = tree.leaf_bounds(d)
        invariants = {held: {code: float(H[b[u]:b[u + 1]].sum()) for u, code in enumerate(tree.codes(d))}}
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, invariants=invariants)
    nn = release_geography(plan, ArrayHistograms(H), seed=seed, postprocess="nonnegative")
    out = release_geography(plan, ArrayHistograms(H), seed=seed, postprocess="integer")
    assert out.postprocess == "integer" and set(out.change) == set(plan.levels)
    assert_integer_tables(tree, out)
    if held is not None:
        np.testing.assert_array_equal(out.totals(held), list(invariants[held].values()))
    # rounding moves each cell by less than one: the root's answers stay within the workload's row sums
    row_sums = np.abs(WP.dense()).sum(axis=1)
    assert np.all(np.abs(out.answers("nation") - nn.answers("nation"))[0] <= row_sums + 1e-6)


def test_integer_release_rounds_families_projected_in_groups(monkeypatch):
    import hdmm.georelease.nonneg as nonneg

    rng = np.random.default_rng(3)
    tree = states_and_counties(3, 4, 7, rng)
    H = sp.csr_matrix(rng.poisson(0.5, size=(tree.leaves, DOMAIN.size)).astype(float))
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    monkeypatch.setattr(nonneg, "MAX_FAMILY_CELLS", 3 * DOMAIN.size)
    assert_integer_tables(tree, release_geography(plan, ArrayHistograms(H), seed=1, postprocess="integer"))


def test_integer_refusals_come_before_noise(monkeypatch):
    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    calls = _count_noise(monkeypatch)
    b = tree.leaf_bounds(1)
    halves = {code: float(H[b[u]:b[u + 1]].sum()) + 0.5 for u, code in enumerate(tree.codes("state"))}
    with pytest.raises(GeographyError, match="whole finite count"):  # refused by the plan already
        geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP, invariants={"state": halves})
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    with pytest.raises(ValueError, match="postprocess must be one of"):
        release_geography(plan, ArrayHistograms(H), postprocess="rounded")
    assert calls == []


@pytest.mark.parametrize("held", [False, True])
def test_dense_projections_on_the_parents_cells_equal_the_structured_ones(monkeypatch, held):
    # small person domains project each family on its parent's non-zero cells with a dense Gram (and form
    # the least-squares cells by one product): the same optimum as the structured path over every cell
    import hdmm.georelease.nonneg as nonneg

    rng = np.random.default_rng(7)
    tree = states_and_counties(3, 2, 5, rng)
    H = sp.csr_matrix(rng.poisson(1.0, size=(tree.leaves, DOMAIN.size)).astype(float))  # many zero cells
    b = tree.leaf_bounds(1)
    invariants = {"state": {f"s{s}": float(H[b[s]:b[s + 1]].sum()) for s in range(3)}} if held else None
    plan = geo_plan(tree, WP, hdmm.PureDP(2.0), strategy=AP, invariants=invariants)
    assert nonneg.dense_parts(plan) is not None
    solved = []  # the dense path solves the families without held totals exactly (hdmm.georelease.activeset)
    exact = nonneg.family_projection
    monkeypatch.setattr(nonneg, "family_projection", lambda *a, **k: solved.append(exact(*a, **k)) or solved[-1])
    dense = release_geography(plan, ArrayHistograms(H), seed=5, postprocess="nonnegative")
    assert held or solved and all(V is not None for V in solved)  # (held totals: the gradient method)
    monkeypatch.setattr(nonneg, "DENSE_CELLS", 0)
    plan = geo_plan(tree, WP, hdmm.PureDP(2.0), strategy=AP, invariants=invariants)
    assert nonneg.dense_parts(plan) is None
    structured = release_geography(plan, ArrayHistograms(H), seed=5, postprocess="nonnegative")
    for d in plan.levels:
        np.testing.assert_allclose(dense.answers(d), structured.answers(d), atol=0.02 * plan.expected_rmse(d))


def test_a_gap_certified_projection_reaches_the_optimum_on_an_ill_conditioned_metric():
    # the Frank-Wolfe gap bounds f(V) - f*: a projection stopped by it is within the certified distance of a
    # general solver's optimum (the step rule it replaces for simplex families stopped PL94's top units early)
    from scipy.optimize import minimize

    from hdmm.georelease.nonneg import simplex_projection
    from hdmm.matrix import Explicit
    from hdmm.postprocess import metric_projection

    rng = np.random.default_rng(3)
    U, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    A = Explicit(U @ np.diag(np.logspace(0, -3, 6)) @ U.T * 10.0)
    X = rng.normal(size=(3, 6)) * 5.0
    parent = rng.random(6) * 4.0
    D = A.dense()

    def objective(V):
        return 0.5 * float(np.sum((D @ (V.reshape(3, 6) - X).T) ** 2))

    def gap(V, grad):
        return float(np.sum(grad * V) - parent @ grad.min(axis=0))

    sigma, tol = 1.0, 1e-3
    V = metric_projection(A, X, lambda V: simplex_projection(V, parent), sigma, tol=tol, maxiter=200000, gap=gap)
    constraints = [{"type": "eq", "fun": lambda v, j=j: v.reshape(3, 6)[:, j].sum() - parent[j]} for j in range(6)]
    best = minimize(objective, V.ravel(), constraints=constraints, bounds=[(0, None)] * 18, method="SLSQP",
                    options={"ftol": 1e-15, "maxiter": 2000})
    assert objective(V) - best.fun <= 0.5 * (tol * sigma) ** 2 * 6 * 3 + 1e-9
    np.testing.assert_allclose(V.sum(axis=0), parent, atol=1e-12)


def test_small_domains_answer_through_one_dense_operator_as_through_reconstruction(monkeypatch):
    # a person strategy that is no Kronecker product (marginals here; PL94's residuals in production) on a small
    # domain: least-squares answers through the dense (queries + 1) x rows operator equal the per-unit route
    import hdmm.georelease.units as units

    rng = np.random.default_rng(11)
    tree = states_and_counties(2, 2, 4, rng)
    H = sp.csr_matrix(rng.poisson(2.0, size=(tree.leaves, DOMAIN.size)).astype(float))
    strategy = Marginals((2, 3), {(): 1.0, (0,): 1.0, (1,): 1.0, (0, 1): 1.0})
    plan = geo_plan(tree, WP, hdmm.ZCDP(0.5), strategy=strategy)
    assert isinstance(units.answer_operator(plan), Explicit)
    fast = release_geography(plan, ArrayHistograms(H), seed=3)
    monkeypatch.setattr(units, "answer_operator", lambda plan: None)
    plan = geo_plan(tree, WP, hdmm.ZCDP(0.5), strategy=strategy)
    slow = release_geography(plan, ArrayHistograms(H), seed=3)
    for d in plan.levels:
        np.testing.assert_allclose(fast.answers(d), slow.answers(d), rtol=1e-9, atol=1e-9)


def test_the_units_measured_per_kernel_call_do_not_change_the_release(monkeypatch):
    from hdmm.georelease import units

    tree = small_country(3)
    H = sp.csr_matrix(np.random.default_rng(3).integers(0, 3, size=(tree.leaves, DOMAIN.size)).astype(float))
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    whole = release_geography(plan, ArrayHistograms(H), seed=4)
    monkeypatch.setattr(units, "CELLS_PER_CALL", 2 * DOMAIN.size)  # two units a call
    split = release_geography(plan, ArrayHistograms(H), seed=4)
    for d in plan.levels:
        np.testing.assert_array_equal(split.answers(d), whole.answers(d))


def test_a_written_release_is_copied_whole_by_save(tmp_path):
    pytest.importorskip("pyarrow")
    import dataclasses

    tree = small_country()
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    plan = geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP)
    written = release_geography(plan, ArrayHistograms(H), seed=0, output=tmp_path / "a")
    # the engine's output target, and a release that knows only its path (as one built from the files)
    for release, name in ((written, "b"), (dataclasses.replace(written, _files=None), "c")):
        release.save(tmp_path / name)
        assert not (tmp_path / f"{name}.partial").exists()
        for d in plan.levels:
            np.testing.assert_array_equal(release.answers(d), written.answers(d))
        copied = sorted(str(p.relative_to(tmp_path / name)) for p in (tmp_path / name).rglob("*"))
        assert copied == sorted(str(p.relative_to(tmp_path / "a")) for p in (tmp_path / "a").rglob("*"))
    with pytest.raises(FileExistsError):
        written.save(tmp_path / "b")
