"""Marginal workloads (hdmm.marginals) against tensor sums and dense references."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hdmm
from hdmm.domain import Domain
from hdmm.marginals import AllMarginals, DimKMarginals, Marginal, Marginals
from hdmm.matrix import Identity, Kronecker, VStack
from hdmm import workload as wl
from hdmm.optimizers import SquareRootStrategy
from strategies import SETTINGS, all_subsets, marginal_block_ref, marginals_ref


def close(got, want, rtol=1e-10, atol=1e-10):
    got = np.asarray(got)
    assert got.dtype != object
    assert got.shape == np.shape(want)
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale)


@st.composite
def marginal_cases(draw):
    d = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=d, max_size=d)))
    subsets = all_subsets(d)
    chosen = draw(st.lists(st.sampled_from(subsets), min_size=1, max_size=min(6, len(subsets)), unique=True))
    # zero or normal-sized weights: powers of weights below ~1e-154 underflow and are refused (test_matrix.py)
    weight = st.one_of(st.just(0.0), st.floats(1e-100, 3.0))
    weights = draw(st.lists(weight, min_size=len(chosen), max_size=len(chosen)))
    seed = draw(st.integers(0, 2**32 - 1))
    return shape, chosen, weights, np.random.default_rng(seed)


def tensor_sums(x: np.ndarray, shape, subsets, weights) -> np.ndarray:
    """Each marginal is the data tensor summed over the attributes outside the subset."""
    T = x.reshape(shape)
    out = []
    for s, w in zip(subsets, weights):
        other = tuple(i for i in range(len(shape)) if i not in s)
        out.append(w * T.sum(axis=other).ravel())
    return np.concatenate(out)


@SETTINGS
@given(marginal_cases())
def test_matvec_is_a_tensor_sum(case):
    shape, subsets, weights, rng = case
    M = Marginals(shape, dict(zip(subsets, weights)))
    x = rng.standard_normal(math.prod(shape))
    close(M @ x, tensor_sums(x, shape, subsets, weights))
    X = rng.standard_normal((math.prod(shape), 3))
    close(M @ X, np.column_stack([tensor_sums(X[:, j], shape, subsets, weights) for j in range(3)]))


@SETTINGS
@given(marginal_cases())
def test_marginals_against_dense(case):
    shape, subsets, weights, rng = case
    M = Marginals(shape, dict(zip(subsets, weights)))
    ref = marginals_ref(shape, subsets, weights)
    assert M.shape == ref.shape
    close(M.dense(), ref)
    y = rng.standard_normal((ref.shape[0], 2))
    close(M.T @ y, ref.T @ y)
    close(y.T @ M, y.T @ ref)
    G = M.gram()
    close(G.dense(), ref.T @ ref)
    close(G.diag(), np.diag(ref.T @ ref))
    close(G.trace(), np.trace(ref.T @ ref))
    x = rng.standard_normal(ref.shape[1])
    close(G @ x, ref.T @ (ref @ x))
    close(M.sensitivity(1), np.abs(ref).sum(axis=0).max())
    close(M.sensitivity(2), np.sqrt((ref**2).sum(axis=0)).max())
    B = rng.standard_normal((ref.shape[1], ref.shape[1]))
    close(M.quadratic_diag(B + B.T), np.diag(ref @ (B + B.T) @ ref.T))
    # the same marginals written as a union of Kronecker products of identities and totals
    blocks = [w * Kronecker([Identity(n) if i in s else wl.Total(n) for i, n in enumerate(shape)]) for s, w in zip(subsets, weights)]
    close(VStack(blocks).dense(), ref)


@pytest.mark.parametrize("shape", [(2,), (2, 3), (3, 1, 2), (2, 2, 3, 2), (2, 3, 2, 2, 3)])
def test_counts(shape):
    d = len(shape)
    for k in range(d + 1):
        M = DimKMarginals(shape, k)
        assert M.members.shape[0] == math.comb(d, k)
        assert all(len(s) == k for s in M.subsets)
        assert M.shape == (sum(math.prod(shape[i] for i in s) for s in itertools.combinations(range(d), k)), math.prod(shape))
        assert len(set(M.subsets)) == math.comb(d, k)
        A = AllMarginals(shape, k)
        assert A.members.shape[0] == sum(math.comb(d, j) for j in range(k + 1))
        assert A.shape[0] == sum(math.prod(shape[i] for i in s) for j in range(k + 1) for s in itertools.combinations(range(d), j))
    full = AllMarginals(shape)
    assert full.members.shape[0] == 2**d
    # all marginals of all subsets: prod(n_i + 1) queries
    assert full.shape[0] == math.prod(n + 1 for n in shape)


def test_dimk_and_all_marginals_dense():
    shape = (2, 3, 2)
    subsets2 = list(itertools.combinations(range(3), 2))
    close(DimKMarginals(shape, 2).dense(), marginals_ref(shape, subsets2, [1.0] * 3))
    close(AllMarginals(shape, 1).dense(), marginals_ref(shape, [(), (0,), (1,), (2,)], [1.0] * 4))
    close(Marginal(shape, (2, 0)).dense(), marginal_block_ref(shape, (0, 2)))
    close(Marginal(shape, 1).dense(), marginal_block_ref(shape, (1,)))


def test_marginals_by_name_and_labels():
    dom = Domain(["sex", "age", "race"], [2, 3, 2], values={"sex": ["male", "female"], "race": ["w", "b"]})
    M = Marginals(dom, {("age", "sex"): 1.0, ("race",): 2.0, (): 1.0})
    close(M.dense(), marginals_ref(dom.shape, [(0, 1), (2,), ()], [1.0, 2.0, 1.0]))
    assert M.labels[0] == "sex=male & age=0"
    assert M.labels[5] == "sex=female & age=2"
    assert M.labels[6] == "race=w"
    assert M.labels[7] == "race=b"
    assert M.labels[8] == "total"
    assert len(M.labels) == 9
    assert Marginal(dom, "sex").labels[1] == "sex=female"


def test_marginal_bad_inputs():
    dom = Domain(["sex", "age"], [2, 3])
    with pytest.raises(KeyError, match="income"):
        Marginal(dom, ("income",))
    with pytest.raises(KeyError, match="income"):
        Marginals(dom, {("sex", "income"): 1.0})
    with pytest.raises(IndexError):
        Marginals(dom, {(5,): 1.0})
    with pytest.raises(ValueError):
        Marginals(dom, {("sex", "sex"): 1.0})
    with pytest.raises(ValueError):
        Marginals(dom, {("sex",): -1.0})
    with pytest.raises(ValueError):
        Marginals(dom, {("sex",): np.nan})
    with pytest.raises(ValueError):
        Marginals(dom, {})
    with pytest.raises(ValueError):
        Marginals(dom, {("sex", "age"): 1.0, ("age", "sex"): 1.0})
    with pytest.raises(ValueError):
        DimKMarginals(dom, 3)
    with pytest.raises(ValueError):
        DimKMarginals(dom, -1)
    with pytest.raises(ValueError):
        AllMarginals(dom, 3)


def test_three_way_marginals_over_100_attributes_build_quickly():
    rng = np.random.default_rng(2023)
    sizes = rng.integers(2, 6, size=100).tolist()
    dom = Domain([f"x{i}" for i in range(100)], sizes)
    start = time.perf_counter()
    M = AllMarginals(dom, 3)
    built = time.perf_counter() - start
    assert M.members.shape[0] == 1 + 100 + math.comb(100, 2) + math.comb(100, 3) == 166_751
    assert M.shape[1] == dom.size
    n = np.array(sizes, dtype=object)
    rows = 1 + sum(n) + sum(n[i] * n[j] for i, j in itertools.combinations(range(100), 2))
    rows += sum(n[i] * n[j] * n[k] for i, j, k in itertools.combinations(range(100), 3))
    assert M.shape[0] == rows
    # implicit quantities stay cheap on a 10^55-cell domain
    assert M.sensitivity(1) == pytest.approx(166_751)
    assert M.sensitivity(2) == pytest.approx(math.sqrt(166_751))
    K = DimKMarginals(dom, 3)
    assert K.members.shape[0] == math.comb(100, 3)
    print(f"\nAllMarginals(100 attributes, 3) built in {built:.2f} s")


@pytest.mark.parametrize("n", [1, 2, 3, 10])
def test_helmert_matrix_matches_the_dense_basis(n):
    from hdmm.marginals import Helmert, helmert

    H, D = Helmert(n), helmert(n)
    np.testing.assert_allclose(H @ np.eye(n), D, atol=1e-12)
    if n > 1:
        np.testing.assert_allclose(H.T @ np.eye(n - 1), D.T, atol=1e-12)
        np.testing.assert_allclose(H.pinv().dense(), np.linalg.pinv(D), atol=1e-12)
    for p in (1, 2):
        np.testing.assert_allclose(H.column_norm_powers(p).to_array(), (np.abs(D) ** p).sum(axis=0), atol=1e-12)


def test_residuals_on_a_large_attribute_stay_implicit_and_exact():
    W = hdmm.Prefix(8192)
    result = hdmm.optimize(W, hdmm.ZCDP(0.5), seed=0)  # used to densify the residual basis and fail
    assert isinstance(result.strategy.factors[0], SquareRootStrategy)
    residual = result.report.set_index("optimizer").loc["residual"]
    assert residual["exact"] and np.isfinite(residual["total squared error"])
