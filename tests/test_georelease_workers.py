"""The local engine on several processes gives the one-process release, answer for answer."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import hdmm
from hdmm.geography import GeographyTree
from hdmm.georelease import ArrayHistograms, geo_plan, release_geography
from hdmm.georelease.workers import POOL_UNITS, check_workers, default_workers, map_partitions
from hdmm.matrix import Kronecker
from trees import small_country

DOMAIN = hdmm.Domain(["a", "b"], [2, 3])
WP = hdmm.product(DOMAIN, {"a": hdmm.Identity(2), "b": hdmm.Prefix(3)})
AP = Kronecker([hdmm.Identity(2), hdmm.Prefix(3)])


def country(seed: int) -> GeographyTree:
    return small_country(seed, counties=(2, 5), tracts=(1, 4))


def test_map_partitions_keeps_order_and_raises_the_workers_errors():
    assert list(map_partitions(lambda i: i * 10, 5, workers=2)) == [0, 10, 20, 30, 40]
    assert list(map_partitions(lambda i: i, 0, workers=2)) == []

    def fail(i: int) -> int:
        if i == 2:
            raise ArithmeticError("partition 2")
        return i

    with pytest.raises(ArithmeticError, match="partition 2"):
        list(map_partitions(fail, 4, workers=2))
    assert list(map_partitions(lambda i: i, 3, workers=2)) == [0, 1, 2]  # the failed pool left nothing behind


def test_check_workers():
    assert check_workers(3) == 3 and check_workers(None, units=POOL_UNITS - 1) == 1
    assert check_workers(None, units=POOL_UNITS) == default_workers() >= 1
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive int"):
            check_workers(bad)


@pytest.mark.parametrize("postprocess", [None, "nonnegative", "integer"])
@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("partition", ["nation", "county", "tract"])
def test_two_workers_give_the_one_process_release(postprocess, held, partition):
    tree = country(1)
    rng = np.random.default_rng(2)
    H = sp.csr_matrix(rng.poisson(0.8, size=(tree.leaves, DOMAIN.size)).astype(float))
    invariants = None
    if held:
        b = tree.leaf_bounds("state")
        invariants = {"state": {code: float(H[b[u]:b[u + 1]].sum()) for u, code in enumerate(tree.codes("state"))}}
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, invariants=invariants, partition=partition)
    one = release_geography(plan, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=1)
    two = release_geography(plan, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=2)
    for d in plan.levels:
        np.testing.assert_array_equal(two.estimates[d], one.estimates[d])
    if postprocess is not None:
        assert two.change == pytest.approx(one.change, rel=1e-12)


def test_local_engine_refuses_unknown_options():
    tree = country(0)
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    H = sp.csr_matrix(np.ones((tree.leaves, DOMAIN.size)))
    with pytest.raises(TypeError, match="local engine takes only the options \\['workers', 'output', 'work_dir'\\], not \\['spark'\\]"):
        release_geography(plan, ArrayHistograms(H), seed=0, spark=None)
    with pytest.raises(TypeError, match="give output too"):
        release_geography(plan, ArrayHistograms(H), seed=0, work_dir=".")
    with pytest.raises(ValueError, match="positive int"):
        release_geography(plan, ArrayHistograms(H), seed=0, workers=0)


def test_default_partition_keeps_every_partition_small():
    from hdmm.georelease.plan import PARTITION_UNITS, default_partition

    pairs = {"s0": "US", "s1": "US", "s0c0": "s0", "s1c0": "s1", "s1c1": "s1"}
    for t in range(PARTITION_UNITS):  # state s0's one county holds more units than a partition may
        pairs[f"s0c0t{t}"] = "s0c0"
    pairs["s1c0t0"], pairs["s1c1t0"] = "s1c0", "s1c1"
    tree = GeographyTree.from_parents(pairs, ["nation", "state", "county", "tract"])
    assert default_partition(tree, 3) == 3  # states and counties too large: tracts
    assert default_partition(tree, 2) == 1  # down to counties only, the states are small
    assert default_partition(tree, 0) == 0
    assert geo_plan(tree, WP, hdmm.PureDP(1.0), strategy=AP).partition_level == 3


def test_freed_memory_is_given_back_where_the_c_library_can_and_skipped_where_it_cannot(monkeypatch):
    import hdmm.georelease.workers as W

    pa = pytest.importorskip("pyarrow")
    kept = pa.array(np.arange(10**6))  # live memory is never touched
    W.return_free_memory()
    monkeypatch.setattr(W, "_TRIM", None)  # macOS, musl: no malloc_trim
    W.return_free_memory()
    assert kept.to_numpy()[-1] == 10**6 - 1
