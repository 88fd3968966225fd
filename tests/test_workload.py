"""Workload building blocks (hdmm.workload) against hand-built dense references."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given
from hypothesis import strategies as st

from hdmm import workload as wl
from hdmm.domain import Domain
from hdmm.matrix import Identity, Matrix
from strategies import (
    SETTINGS,
    allrange_ref,
    interval_lists,
    interval_rows,
    kron_ref,
    prefix_ref,
    width_k_ref,
    workload_blocks,
)


def close(got, want, rtol=1e-10, atol=1e-10):
    got = np.asarray(got)
    assert got.dtype != object
    assert got.shape == np.shape(want)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


# ====================================================================== leaves
@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
def test_leaf_entries(n):
    close(wl.Total(n).dense(), np.ones((1, n)))
    close(wl.IdentityTotal(n).dense(), np.vstack([np.eye(n), np.ones((1, n))]))
    close(wl.Identity(n).dense(), np.eye(n))
    close(wl.Prefix(n).dense(), prefix_ref(n))
    close(wl.AllRange(n).dense(), allrange_ref(n))
    assert wl.AllRange(n).shape == (n * (n + 1) // 2, n)
    for k in range(1, n + 1):
        close(wl.WidthKRange(n, k).dense(), width_k_ref(n, k))


def test_allrange_query_order():
    # ordered by the start of the interval, then by its end
    R = wl.AllRange(3)
    assert list(zip(R.lo.tolist(), R.hi.tolist())) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


@SETTINGS
@given(st.integers(1, 15).flatmap(lambda n: st.tuples(st.just(n), interval_lists(n, max_size=10))), st.integers(0, 2**32 - 1))
def test_ranges(case, seed):
    n, intervals = case
    R = wl.Ranges(n, intervals)
    ref = interval_rows(n, intervals)
    rng = np.random.default_rng(seed)
    x, y = rng.standard_normal((n, 2)), rng.standard_normal((len(intervals), 3))
    close(R.dense(), ref)
    close(R @ x, ref @ x)
    close(R.T @ y, ref.T @ y)
    close(y.T @ R, y.T @ ref)
    close(R.sparse().toarray(), ref)
    close(R.gram().dense(), ref.T @ ref)
    close(R.gram() @ x, ref.T @ ref @ x)
    implicit = wl.RangesGram(R)  # what gram() returns for many long ranges
    close(implicit.dense(), ref.T @ ref)
    close(implicit @ x, ref.T @ ref @ x)
    close(implicit.T @ x, ref.T @ ref @ x)
    close(implicit.diag(), np.diag(ref.T @ ref))
    close(implicit.trace(), np.trace(ref.T @ ref))
    close(R.sensitivity(1), ref.sum(axis=0).max())
    close(R.sensitivity(2), np.sqrt((ref**2).sum(axis=0)).max())
    B = rng.standard_normal((n, n))
    X = B + B.T
    close(R.quadratic_diag(X), np.diag(ref @ X @ ref.T))


def test_ranges_gram_is_sparse_while_small(monkeypatch):
    R = wl.WidthKRange(50, 4)
    assert isinstance(R.gram(), wl.Explicit) and R.gram().is_sparse
    monkeypatch.setattr(wl, "SPARSE_GRAM_ENTRIES", 4 * 4 * 47 - 1)
    assert isinstance(R.gram(), wl.RangesGram)
    close(R.gram().dense(), R.dense().T @ R.dense())


@SETTINGS
@given(st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_prefix_and_allrange_grams(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    for W, ref, G_cls in [(wl.Prefix(n), prefix_ref(n), wl.PrefixGram), (wl.AllRange(n), allrange_ref(n), wl.AllRangeGram)]:
        G = W.gram()
        want = ref.T @ ref
        assert isinstance(G, G_cls)
        close(G.dense(), want)
        close(G @ x, want @ x)
        close(G.T @ x, want @ x)
        close(x.T @ G, x.T @ want)
        close(G.diag(), np.diag(want))
        close(G.trace(), np.trace(want))
        close(G_cls(n).dense(), want)
        close(W @ x, ref @ x)
        y = rng.standard_normal(W.shape[0])
        close(W.T @ y, ref.T @ y)
        close(y @ W, y @ ref)
        close(W.sensitivity(1), ref.sum(axis=0).max())
        close(W.sensitivity(2), np.sqrt((ref**2).sum(axis=0)).max())
        B = rng.standard_normal((n, n))
        close(W.quadratic_diag(B + B.T), np.diag(ref @ (B + B.T) @ ref.T))
        # the closed-form Gram formulas of the module docstring
        i = np.arange(n)
        if G_cls is wl.PrefixGram:
            close(want, n - np.maximum.outer(i, i))
        else:
            close(want, (np.minimum.outer(i, i) + 1) * (n - np.maximum.outer(i, i)))


@SETTINGS
@given(st.integers(1, 8).flatmap(lambda n: workload_blocks(n)), st.integers(0, 2**32 - 1))
def test_blocks_match_reference(p, seed):
    rng = np.random.default_rng(seed)
    m, n = p.shape
    close(p.mat.dense(), p.ref)
    x, y = rng.standard_normal(n), rng.standard_normal(m)
    close(p.mat @ x, p.ref @ x)
    close(y @ p.mat, y @ p.ref)
    close(p.mat.gram().dense(), p.ref.T @ p.ref)
    close(p.mat.sensitivity(1), np.abs(p.ref).sum(axis=0).max())
    close(p.mat.sensitivity(2), np.sqrt((p.ref**2).sum(axis=0)).max())


def test_predicates():
    P = np.array([[1, 0, 1, 0], [0, 1, 1, 1]])
    W = wl.Predicates(P, labels=["even", "not zero"])
    close(W.dense(), P.astype(float))
    assert list(W.labels) == ["even", "not zero"]
    S = wl.Predicates(sp.csr_array(P))
    close(S.dense(), P.astype(float))
    assert isinstance(W, Matrix)


# ====================================================================== product and union
def test_product_matches_kron_and_fills_totals():
    dom = Domain(["sex", "age", "race"], [2, 5, 3])
    W = wl.product(dom, {"age": wl.Prefix(5), "sex": Identity(2)})
    close(W.dense(), kron_ref([np.eye(2), prefix_ref(5), np.ones((1, 3))]))
    W2 = wl.product((2, 5, 3), {1: wl.AllRange(5)})
    close(W2.dense(), kron_ref([np.ones((1, 2)), allrange_ref(5), np.ones((1, 3))]))
    T = wl.product(dom, {})
    close(T.dense(), np.ones((1, 30)))


def test_product_labels():
    dom = Domain(["sex", "age"], [2, 100], values={"sex": ["male", "female"]})
    W = wl.product(dom, {"sex": Identity(2), "age": wl.Ranges(100, [(18, 25), (0, 100), (30, 31)])})
    assert W.shape == (6, 200)
    assert W.labels[0] == "sex=male & age in [18, 25)"
    assert W.labels[3] == "sex=female & age in [18, 25)"
    assert W.labels[4] == "sex=female"  # the full range is no condition
    assert W.labels[5] == "sex=female & age=30"
    assert W.labels[-1] == W.labels[5]
    assert len(W.labels) == 6
    assert W.labels[1:3] == ["sex=male", "sex=male & age=30"]
    # totals say "total"
    assert list(wl.product(dom, {}).labels) == ["total"]
    assert wl.product(dom, {"age": wl.Prefix(100)}).labels[17] == "age in [0, 18)"
    # value labels for an ordered attribute
    dom2 = Domain(["grade"], [4], values={"grade": ["A", "B", "C", "D"]})
    assert wl.product(dom2, {"grade": wl.Ranges(4, [(1, 3)])}).labels[0] == "grade in B..C"


def test_union_labels_and_weights():
    dom = Domain(["sex", "age"], [2, 3], values={"sex": ["male", "female"]})
    A = wl.product(dom, {"sex": Identity(2)})
    B = wl.product(dom, {})
    W = wl.union([A, B], weights=[1.0, 2.0], names=["by sex", "all"])
    assert W.shape == (3, 6)
    assert list(W.labels) == ["by sex: sex=male", "by sex: sex=female", "all: total"]
    close(W.dense(), np.vstack([np.kron(np.eye(2), np.ones((1, 3))), 2 * np.ones((1, 6))]))
    plain = wl.union([A, B])
    assert plain.labels[2] == "total"
    with pytest.raises(ValueError):
        wl.union([A, B], weights=[1.0])
    with pytest.raises(ValueError):
        wl.union([A, B], names=["one"])
    with pytest.raises(ValueError, match="same number of columns"):
        wl.union([A, Identity(5)])


# ====================================================================== bad inputs
def test_ranges_outside_domain_raise():
    for bad in ([(0, 6)], [(-1, 2)], [(3, 3)], [(4, 2)], [(0, 2), (5, 7)]):
        with pytest.raises(ValueError, match="range"):
            wl.Ranges(5, bad)
    with pytest.raises(ValueError):
        wl.Ranges(5, [])
    with pytest.raises(ValueError):
        wl.Ranges(0, [(0, 1)])
    with pytest.raises(ValueError):
        wl.WidthKRange(4, 5)
    with pytest.raises(ValueError):
        wl.WidthKRange(4, 0)
    with pytest.raises(ValueError):
        wl.Prefix(0)
    with pytest.raises(ValueError):
        wl.AllRange(-3)
    with pytest.raises(ValueError):
        wl.Prefix(True)


def test_predicates_must_be_zero_one():
    with pytest.raises(ValueError, match="0/1"):
        wl.Predicates([[1, 2, 0]])
    with pytest.raises(ValueError, match="0/1"):
        wl.Predicates([[0.5, 1.0]])
    with pytest.raises(ValueError, match="0/1"):
        wl.Predicates([[-1, 0]])
    with pytest.raises(ValueError, match="0/1"):
        wl.Predicates(sp.csr_array(np.array([[0.0, 3.0]])))
    with pytest.raises(ValueError):
        wl.Predicates([[1.0, np.nan]])


def test_product_bad_inputs():
    dom = Domain(["sex", "age"], [2, 5])
    with pytest.raises(KeyError, match="income"):
        wl.product(dom, {"income": Identity(3)})
    with pytest.raises(IndexError):
        wl.product(dom, {5: Identity(3)})
    with pytest.raises(ValueError, match="columns"):
        wl.product(dom, {"age": wl.Prefix(4)})
    with pytest.raises(TypeError):
        wl.product(dom, {"age": np.eye(5)})


def test_building_blocks_compare_and_hash_by_class_and_parameters():
    from hdmm.marginals import Helmert
    from hdmm.matrix import Explicit, Kronecker, Ones

    equal = [(wl.Prefix(5), wl.Prefix(5)), (wl.AllRange(7), wl.AllRange(7)), (Identity(4), Identity(4)),
             (Ones(2, 3), Ones(2, 3)), (wl.WidthKRange(6, 2), wl.WidthKRange(6, 2)),
             (wl.Ranges(5, [(0, 2), (1, 4)]), wl.Ranges(5, [(0, 2), (1, 4)])),
             (wl.PrefixGram(5), wl.Prefix(5).gram()), (wl.AllRangeGram(6), wl.AllRange(6).gram()),
             (wl.RangesGram(wl.Ranges(5, [(0, 3)])), wl.RangesGram(wl.Ranges(5, [(0, 3)]))), (Helmert(4), Helmert(4)),
             (Kronecker([wl.Prefix(3), Identity(2)]), Kronecker([wl.Prefix(3), Identity(2)])),
             (2.0 * wl.Prefix(3), 2.0 * wl.Prefix(3))]
    for a, b in equal:
        assert a is not b and a == b and hash(a) == hash(b) and not (a != b), (a, b)
        np.testing.assert_array_equal(a.dense(), b.dense())
    different = [(wl.Prefix(5), wl.Prefix(6)), (wl.Prefix(5), wl.AllRange(5)), (wl.AllRange(3), wl.Prefix(3)),
                 (wl.Ranges(5, [(0, 2)]), wl.Ranges(5, [(0, 3)])), (wl.WidthKRange(6, 2), wl.WidthKRange(6, 3)),
                 (Ones(1, 3), Ones(3, 1)), (2.0 * wl.Prefix(3), 3.0 * wl.Prefix(3)),
                 (Kronecker([wl.Prefix(3), Identity(2)]), Kronecker([Identity(3), wl.Prefix(2)])),
                 # by class: the same queries as another class are not the same building block
                 (wl.Prefix(4), wl.Ranges(4, [(0, b) for b in range(1, 5)]))]
    for a, b in different:
        assert a != b and not (a == b), (a, b)
    # one entry per value in dicts and sets
    assert len({wl.Prefix(5), wl.Prefix(5), wl.Prefix(6)}) == 2
    assert {wl.AllRange(4): 1}[wl.AllRange(4)] == 1
    # matrices given by their entries stay compared by identity (no dense content is hashed)
    M = np.arange(6.0).reshape(2, 3)
    e = Explicit(M)
    assert e == e and Explicit(M) != e and hash(e) == hash(e)
    # against other objects: never equal, never an elementwise array
    assert (wl.Prefix(3) == np.eye(3)) is False and (wl.Prefix(3) == 3) is False
    assert (wl.Prefix(3) != np.eye(3)) is True


def test_equality_of_large_blocks_never_forms_their_queries():
    a, b = wl.AllRange(10**6), wl.AllRange(10**6)  # 5e11 ranges: its interval list would not fit in memory
    assert a == b and hash(a) == hash(b)
    assert "_bounds" not in vars(a) and "_bounds" not in vars(b)
    assert wl.Prefix(10**7) == wl.Prefix(10**7) and wl.PrefixGram(10**7) == wl.Prefix(10**7).gram()


def test_a_union_of_prefix_marginals_keeps_one_factor_per_attribute_value():
    import itertools

    from hdmm.kron_union import kron_union

    sizes = [50, 100, 7, 4, 2]  # CPS: Prefix on the first two attributes, Identity on the rest
    dom = Domain(list("abcde"), sizes)
    W = wl.union([wl.product(dom, {"abcde"[i]: wl.Prefix(sizes[i]) if i < 2 else Identity(sizes[i]) for i in S})
                  for k in range(4) for S in itertools.combinations(range(5), k)])
    union = kron_union(W)
    assert [len(fs) for fs in union.factors] == [2, 2, 2, 2, 2]  # the block and the total, each once
    for fs, n in zip(union.factors, sizes):
        kinds = sorted(type(f).__name__ for f in fs)
        assert kinds == (["Ones", "Prefix"] if n in (50, 100) else ["Identity", "Ones"])
    subsets = [S for k in range(4) for S in itertools.combinations(range(5), k)]
    prefix = [k for k, f in enumerate(union.factors[0]) if f == wl.Prefix(50)]
    assert np.count_nonzero(union.index[:, 0] == prefix[0]) == sum(0 in S for S in subsets)
