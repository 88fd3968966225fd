"""Baseline strategies (hdmm.strategies) against hand-built matrices and dense error formulas."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hdmm.spectral
from hdmm import strategies as bs
from hdmm import workload as wl
from hdmm.domain import Domain
from hdmm.error import expected_error, rmse
from hdmm.marginals import DimKMarginals, Marginals
from hdmm.matrix import Explicit, Identity, Kronecker
from hdmm.privacy import PureDP, ZCDP
from strategies import SETTINGS, allrange_ref, kron_ref, marginals_ref, prefix_ref, width_k_ref

LAPLACE = PureDP(1.0)
PRIVACIES = [PureDP(1.0), ZCDP(0.5)]


# ====================================================================== dense references
def dense_tse(W: np.ndarray, A: np.ndarray, privacy) -> float:
    """``Var * tr(pinv(A^T A) W^T W)``, asserting that ``A`` supports ``W`` (``W A^+ A = W``)."""
    X = A.T @ A
    Xp = np.linalg.pinv(X, rcond=1e-10, hermitian=True)
    assert np.allclose(W @ Xp @ X, W, atol=1e-8 * max(1.0, np.abs(W).max()))
    columns = (np.abs(A) ** privacy.norm).sum(axis=0) ** (1.0 / privacy.norm)
    return privacy.noise_variance(float(columns.max())) * float(np.trace(Xp @ W.T @ W))


def tree_intervals(lo: int, hi: int, b: int) -> list[tuple[int, int]]:
    """The nodes of the balanced b-ary tree over [lo, hi), by plain recursion."""
    size = hi - lo
    if size == 1:
        return [(lo, hi)]
    parts = min(b, size)
    cuts = [lo + k * size // parts for k in range(parts + 1)]
    return [(lo, hi)] + [node for a, c in zip(cuts, cuts[1:]) for node in tree_intervals(a, c, b)]


def quadtree_rectangles(r0: int, r1: int, c0: int, c1: int) -> list[tuple[int, int, int, int]]:
    """The nodes of the quadtree over [r0, r1) x [c0, c1), by plain recursion."""
    rows = [(r0, r1)] if r1 - r0 == 1 else [(r0, (r0 + r1) // 2), ((r0 + r1) // 2, r1)]
    cols = [(c0, c1)] if c1 - c0 == 1 else [(c0, (c0 + c1) // 2), ((c0 + c1) // 2, c1)]
    if len(rows) == len(cols) == 1:
        return [(r0, r1, c0, c1)]
    return [(r0, r1, c0, c1)] + [q for r in rows for c in cols for q in quadtree_rectangles(*r, *c)]


def row_set(A: np.ndarray) -> list[tuple[float, ...]]:
    return sorted(map(tuple, np.round(A, 12)))


def haar(k: int) -> np.ndarray:
    """Hand-built rows of Y_{2^k}: total, then left-minus-right differences level by level."""
    n = 2**k
    rows = [np.ones(n)]
    for level in range(k):
        span = n >> level
        for j in range(n // span):
            row = np.zeros(n)
            row[j * span : j * span + span // 2] = 1.0
            row[j * span + span // 2 : (j + 1) * span] = -1.0
            rows.append(row)
    return np.array(rows)


# ====================================================================== rows of the strategies
def test_hierarchical_4_2_rows():
    want = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
    A = bs.hierarchical(4, 2)
    assert isinstance(A, Explicit) and A.is_sparse
    assert row_set(A.dense()) == row_set(np.array(want, dtype=float))


@SETTINGS
@given(st.integers(1, 70), st.integers(2, 9))
def test_hierarchical_rows_are_the_balanced_tree(n, b):
    intervals = tree_intervals(0, n, b)
    want = np.zeros((len(intervals), n))
    for r, (lo, hi) in enumerate(intervals):
        want[r, lo:hi] = 1.0
    assert row_set(bs.hierarchical(n, b).dense()) == row_set(want)


@pytest.mark.parametrize("k", range(0, 9))
def test_h2_and_wavelet_sensitivity_on_powers_of_two(k):
    n = 2**k
    for A in (bs.hierarchical(n), bs.wavelet(n)):
        assert A.sensitivity(1) == k + 1
        assert A.sensitivity(2) == pytest.approx(math.sqrt(k + 1))


@pytest.mark.parametrize("n, b", [(5, 2), (100, 2), (100, 3), (128, 12), (1000, 16), (7, 7), (8, 7)])
def test_tree_sensitivity_is_height_plus_one(n, b):
    h = 0
    while b**h < n:
        h += 1
    assert bs.hierarchical(n, b).sensitivity(1) == h + 1
    assert bs.hierarchical(n, b).sensitivity(2) == pytest.approx(math.sqrt(h + 1))


def test_wavelet_matches_hand_built_haar():
    Y4 = np.array([[1, 1, 1, 1], [1, 1, -1, -1], [1, -1, 0, 0], [0, 0, 1, -1]], dtype=float)
    np.testing.assert_array_equal(bs.wavelet(4).dense(), Y4)
    Y8 = np.array(
        [
            [1, 1, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, -1, -1, -1, -1],
            [1, 1, -1, -1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 1, -1, -1],
            [1, -1, 0, 0, 0, 0, 0, 0],
            [0, 0, 1, -1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, -1, 0, 0],
            [0, 0, 0, 0, 0, 0, 1, -1],
        ],
        dtype=float,
    )
    np.testing.assert_array_equal(bs.wavelet(8).dense(), Y8)
    np.testing.assert_array_equal(haar(3), Y8)
    np.testing.assert_array_equal(bs.wavelet(1).dense(), [[1.0]])


@pytest.mark.parametrize("n", [3, 5, 6, 7, 11, 13, 100])
def test_wavelet_pads_and_drops(n):
    k = (n - 1).bit_length()
    padded = haar(k)[:, :n]
    want = padded[np.abs(padded).sum(axis=1) > 0]
    A = bs.wavelet(n)
    np.testing.assert_array_equal(A.dense(), want)
    assert np.linalg.matrix_rank(A.dense()) == n
    assert A.sensitivity(1) == k + 1


def test_quadtree_4x4_rows():
    want = [np.ones((4, 4))]
    for r, c in itertools.product((0, 2), (0, 2)):
        q = np.zeros((4, 4))
        q[r : r + 2, c : c + 2] = 1.0
        want.append(q)
    want += list(np.eye(16).reshape(16, 4, 4))
    Q = bs.quadtree(4, 4)
    assert Q.shape == (21, 16)
    assert row_set(Q.dense()) == row_set(np.array([w.ravel() for w in want]))
    assert Q.sensitivity(1) == 3


@pytest.mark.parametrize("n1, n2", [(1, 1), (1, 6), (3, 1), (3, 5), (6, 6), (8, 2), (7, 12)])
def test_quadtree_rows_are_the_recursive_quadtree(n1, n2):
    rects = quadtree_rectangles(0, n1, 0, n2)
    want = np.zeros((len(rects), n1, n2))
    for k, (r0, r1, c0, c1) in enumerate(rects):
        want[k, r0:r1, c0:c1] = 1.0
    Q = bs.quadtree(n1, n2)
    assert row_set(Q.dense()) == row_set(want.reshape(len(rects), -1))
    assert Q.sensitivity(1) == 1 + max((n1 - 1).bit_length(), (n2 - 1).bit_length())


def test_quadtree_on_one_row_is_the_binary_tree():
    np.testing.assert_array_equal(bs.quadtree(1, 12).dense(), bs.hierarchical(12, 2).dense())


def test_identity():
    assert isinstance(bs.identity(5), Identity) and bs.identity(5).shape == (5, 5)


# ====================================================================== HB
def test_hb_branching_known_values():
    assert [bs.hb_branching(n) for n in (1, 2, 3, 128, 256, 512, 1024, 8192)] == [2, 2, 3, 12, 16, 23, 32, 21]


def test_hb_branching_is_the_argmin_of_the_rule():
    for n in range(2, 400):
        costs = []
        for b in range(2, n + 1):
            h = 0
            while b**h < n:
                h += 1
            costs.append(((b - 1) * h**3, b))
        assert bs.hb_branching(n) == min(costs)[1], n


def test_hb_is_the_tree_with_that_branching():
    np.testing.assert_array_equal(bs.hb(300).dense(), bs.hierarchical(300, bs.hb_branching(300)).dense())


def test_hb_exact_minimises_allrange_error():
    n = 40
    W = wl.AllRange(n)
    best = bs.hb(n, exact=True, max_branching=12)
    errors = [float(expected_error(W, bs.hierarchical(n, b), LAPLACE)) for b in [*range(2, 13), n]]
    assert float(expected_error(W, best, LAPLACE)) == pytest.approx(min(errors))
    assert float(expected_error(W, best, LAPLACE)) <= float(expected_error(W, bs.hb(n), LAPLACE))


# ====================================================================== support and exact error
ONE_D = {
    "identity": bs.identity,
    "H2": bs.hierarchical,
    "H3": lambda n: bs.hierarchical(n, 3),
    "HB": bs.hb,
    "wavelet": bs.wavelet,
}
WORKLOADS = {
    "prefix": (wl.Prefix, prefix_ref),
    "allrange": (wl.AllRange, allrange_ref),
    "width3": (lambda n: wl.WidthKRange(n, 3), lambda n: width_k_ref(n, 3)),
}


@pytest.mark.parametrize("n", [13, 16])
@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.parametrize("name", ONE_D)
def test_one_attribute_error_matches_dense_formula(name, workload, n):
    make, ref = WORKLOADS[workload]
    A = ONE_D[name](n)
    for privacy in PRIVACIES:
        got = expected_error(make(n), A, privacy)
        assert got.supported and math.isfinite(got)
        assert float(got) == pytest.approx(dense_tse(ref(n), A.dense(), privacy), rel=1e-8)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_greedy_h_error_matches_dense_formula(workload):
    make, ref = WORKLOADS[workload]
    for n in (13, 16):
        A = bs.greedy_h(make(n))
        assert A.sensitivity(1) == pytest.approx(1.0)
        for privacy in PRIVACIES:
            got = expected_error(make(n), A, privacy)
            assert got.supported
            assert float(got) == pytest.approx(dense_tse(ref(n), A.dense(), privacy), rel=1e-8)


@pytest.mark.parametrize("n1, n2", [(4, 4), (5, 6)])
def test_quadtree_supports_2d_ranges(n1, n2):
    Q = bs.quadtree(n1, n2)
    cases = [
        (Kronecker([wl.AllRange(n1), wl.AllRange(n2)]), kron_ref([allrange_ref(n1), allrange_ref(n2)])),
        (Kronecker([wl.Prefix(n1), wl.Prefix(n2)]), kron_ref([prefix_ref(n1), prefix_ref(n2)])),
    ]
    for W, ref in cases:
        for privacy in PRIVACIES:
            got = expected_error(W, Q, privacy)
            assert got.supported
            assert float(got) == pytest.approx(dense_tse(ref, Q.dense(), privacy), rel=1e-8)


# ====================================================================== published shape of results
def test_trees_beat_identity_on_large_range_workloads():
    ratios = {}
    for n in (64, 256, 1024):
        trees = {"H2": bs.hierarchical(n), "HB": bs.hb(n)}
        for W in (wl.Prefix(n), wl.AllRange(n)):
            identity = float(rmse(W, bs.identity(n), LAPLACE))
            for name, A in trees.items():
                ratios[n, type(W).__name__, name] = float(rmse(W, A, LAPLACE)) / identity
    for workload in ("Prefix", "AllRange"):
        assert ratios[1024, workload, "H2"] < 1
        assert ratios[1024, workload, "HB"] < 0.8
        for name in ("H2", "HB"):  # the advantage grows with n
            assert ratios[64, workload, name] > ratios[256, workload, name] > ratios[1024, workload, name]
        for n in (64, 256, 1024):
            assert ratios[n, workload, "HB"] < ratios[n, workload, "H2"]


# ====================================================================== GreedyH
def dense_workloads(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    lo = rng.integers(0, n, size=30)
    hi = np.minimum(lo + rng.integers(1, n, size=30), n)
    return [prefix_ref(n), allrange_ref(n), width_k_ref(n, max(1, n // 4)), wl.Ranges(n, np.column_stack([lo, hi])).dense()]


@pytest.mark.parametrize("n, b", [(16, 2), (31, 2), (64, 2), (40, 3), (64, 4)])
def test_greedy_h_beats_uniform_tree_on_its_workload(n, b):
    # GreedyH budgets L1 sensitivity (pure DP, as DAWA); under Gaussian noise it is not tuned
    rng = np.random.default_rng(n * b)
    uniform = bs.hierarchical(n, b).dense()
    for W in dense_workloads(n, rng):
        A = bs.greedy_h(Explicit(W), b)
        assert A.sensitivity(1) == pytest.approx(1.0)
        assert dense_tse(W, A.dense(), LAPLACE) <= dense_tse(W, uniform, LAPLACE) * (1 + 1e-9)


def test_greedy_h_measures_only_the_root_for_the_total():
    A = bs.greedy_h(wl.Total(128))
    np.testing.assert_array_equal(A.dense(), np.ones((1, 128)))


def test_greedy_h_keeps_flat_blocks_whole():
    W = np.kron(np.eye(2), np.ones((1, 4)))  # the totals of [0, 4) and [4, 8)
    A = bs.greedy_h(gram=W.T @ W)
    np.testing.assert_array_equal(A.dense(), W)
    assert dense_tse(W, A.dense(), LAPLACE) == pytest.approx(2 * LAPLACE.noise_variance(1.0))


def test_greedy_h_identity_workload_gives_identity():
    assert row_set(bs.greedy_h(wl.Identity(20)).dense()) == row_set(np.eye(20))


def test_greedy_h_gram_and_workload_agree():
    W = wl.AllRange(30)
    np.testing.assert_allclose(bs.greedy_h(gram=W.gram().dense()).dense(), bs.greedy_h(W).dense())


def test_greedy_h_implicit_route_matches_dense_route(monkeypatch):
    rng = np.random.default_rng(3)
    cases = [wl.Prefix(64), wl.AllRange(45), Explicit(rng.integers(0, 2, size=(20, 37)).astype(float))]
    dense = [bs.greedy_h(W, 2).dense() for W in cases]
    monkeypatch.setattr(bs, "DENSE_LIMIT", 0)
    monkeypatch.setattr(hdmm.spectral, "BLOCK_ENTRIES", 300)  # several blocks per level
    for W, want in zip(cases, dense):
        np.testing.assert_allclose(bs.greedy_h(W, 2).dense(), want, rtol=1e-7, atol=1e-9)


# ====================================================================== DataCube
def test_datacube_known_selections():
    A = bs.datacube((10, 10, 10), [(0,), (0, 1), (0, 2)])
    assert A.subsets == [("a0", "a1"), ("a0", "a2")]
    assert np.all(A.weights == 1)
    assert bs.datacube((2, 2, 2, 2), [(i,) for i in range(4)]).subsets == [("a0", "a1", "a2", "a3")]
    dom = Domain(["sex", "age", "race"], [2, 50, 6])
    assert bs.datacube(dom, [["sex"], ["age"], ["race"]]).subsets == [("sex",), ("age",), ("race",)]


@SETTINGS
@given(st.data())
def test_datacube_supports_and_never_loses_to_direct(data):
    d = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=d, max_size=d)))
    subsets = [s for k in range(d + 1) for s in itertools.combinations(range(d), k)]
    chosen = data.draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=6, unique=True))
    weights = data.draw(st.lists(st.floats(0.1, 3.0), min_size=len(chosen), max_size=len(chosen)))
    W = Marginals(shape, dict(zip(chosen, weights)))
    for privacy in PRIVACIES:
        A = bs.datacube(shape, W, privacy=privacy)
        got = expected_error(W, A, privacy)
        direct = expected_error(W, Marginals(shape, {c: 1.0 for c in chosen}), privacy)
        assert got.supported
        assert float(got) <= float(direct) * (1 + 1e-9)
    want = dense_tse(marginals_ref(shape, chosen, weights), A.dense(), privacy)
    assert float(got) == pytest.approx(want, rel=1e-7)


def test_datacube_on_two_way_marginals():
    dom = Domain(list("abcdef"), [2, 3, 4, 2, 3, 4])
    W = DimKMarginals(dom, 2)
    A = bs.datacube(dom, W)
    assert expected_error(W, A, LAPLACE) <= expected_error(W, W, LAPLACE)


def test_datacube_bad_inputs():
    dom = Domain(["x", "y"], [2, 3])
    with pytest.raises(KeyError, match="unknown attribute"):
        bs.datacube(dom, [["x"], ["z"]])
    with pytest.raises(ValueError, match="only once"):
        bs.datacube(dom, [["x"], ["x"]])
    with pytest.raises(ValueError, match="not over"):
        bs.datacube(dom, Marginals((2, 3), {(0,): 1.0}))
    with pytest.raises(ValueError, match="positive weight"):
        bs.datacube(dom, Marginals(dom, {("x",): 0.0}))
    with pytest.raises(TypeError):
        bs.datacube(dom, "x")


# ====================================================================== Kronecker baselines
def test_kron_and_kronecker_baseline():
    H, Y = bs.hierarchical(4), bs.wavelet(2)
    np.testing.assert_array_equal(bs.kron(H, Y).dense(), np.kron(H.dense(), Y.dense()))
    dom = Domain(["sex", "age"], [2, 4])
    A = bs.kronecker_baseline(dom, {"age": H})
    np.testing.assert_array_equal(A.dense(), np.kron(np.eye(2), H.dense()))
    W = wl.product(dom, {"sex": wl.Identity(2), "age": wl.Prefix(4)})
    for privacy in PRIVACIES:
        got = expected_error(W, A, privacy)
        assert float(got) == pytest.approx(dense_tse(W.dense(), A.dense(), privacy), rel=1e-8)


def test_kronecker_baseline_bad_inputs():
    dom = Domain(["sex", "age"], [2, 4])
    with pytest.raises(KeyError, match="unknown attribute"):
        bs.kronecker_baseline(dom, {"income": bs.identity(4)})
    with pytest.raises(ValueError, match="4 values"):
        bs.kronecker_baseline(dom, {"age": bs.identity(5)})
    with pytest.raises(ValueError, match="twice"):
        bs.kronecker_baseline(dom, {"age": bs.identity(4), 1: bs.identity(4)})
    with pytest.raises(TypeError, match="hdmm matrix"):
        bs.kronecker_baseline(dom, {"age": np.eye(4)})
    with pytest.raises(ValueError, match="at least one"):
        bs.kron()


# ====================================================================== bad inputs
@pytest.mark.parametrize("make", [bs.identity, bs.hierarchical, bs.hb, bs.wavelet, bs.hb_branching])
def test_bad_sizes(make):
    with pytest.raises(ValueError, match="at least 1"):
        make(0)
    with pytest.raises(ValueError, match="at least 1"):
        make(-3)
    for bad in (2.5, True, "8", None):
        with pytest.raises(TypeError, match="integer"):
            make(bad)


def test_bad_branching_and_grids():
    with pytest.raises(ValueError, match="branching must be at least 2"):
        bs.hierarchical(8, 1)
    with pytest.raises(ValueError, match="branching must be at least 2"):
        bs.greedy_h(wl.Prefix(8), 1)
    with pytest.raises(ValueError, match="n2 must be at least 1"):
        bs.quadtree(4, 0)
    with pytest.raises(TypeError, match="integer"):
        bs.quadtree(4.0, 4)


def test_greedy_h_bad_inputs():
    with pytest.raises(ValueError, match="exactly one"):
        bs.greedy_h()
    with pytest.raises(ValueError, match="exactly one"):
        bs.greedy_h(wl.Prefix(4), gram=np.eye(4))
    with pytest.raises(ValueError, match="square"):
        bs.greedy_h(gram=np.ones((3, 4)))
    with pytest.raises(TypeError, match="hdmm matrix"):
        bs.greedy_h(np.eye(4))


def test_baselines_are_reachable_from_the_package():
    # ``import hdmm`` alone must expose the namespace the README documents
    import subprocess
    import sys

    code = "import hdmm; print(hdmm.strategies.hb(16).shape, callable(hdmm.strategies.datacube))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"{bs.hb(16).shape} True"


def test_datacube_takes_a_union_of_marginals_like_the_same_marginals_workload():
    dom = Domain(["a", "b", "c"], [3, 4, 5])
    W = wl.union([DimKMarginals(dom, 1), DimKMarginals(dom, 2), wl.union([DimKMarginals(dom, 2)], weights=[2.0])])
    same = Marginals(dom, {("a",): 1, ("b",): 1, ("c",): 1, ("a", "b"): math.sqrt(5), ("a", "c"): math.sqrt(5),
                           ("b", "c"): math.sqrt(5)})
    np.testing.assert_allclose(W.gram().dense(), same.gram().dense())
    A, B = bs.datacube(dom, W), bs.datacube(dom, same)
    np.testing.assert_array_equal(A.members, B.members)
    assert float(expected_error(W, A, LAPLACE)) == pytest.approx(float(expected_error(same, B, LAPLACE)), rel=1e-12)
    with pytest.raises(TypeError, match="not one"):
        bs.datacube(dom, wl.product(dom, {"a": wl.Prefix(3)}))
