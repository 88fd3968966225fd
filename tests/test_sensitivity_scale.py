"""Sensitivity from the factors at any domain size (docs/math.md, section 2.3).

Kronecker strategies and unions of them over up to 10^100 cells, against dense numpy on small
cases and against closed forms on huge ones; the branch-and-bound maximum of a Kronecker vector
against its expanded array, and its upper bound when the search is cut short.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hdmm
import hdmm.matrix as hm
from hdmm.marginals import AllMarginals, Residuals
from hdmm.matrix import Explicit, Identity, Kronecker, KronVector, Ones, VStack, Weighted
from hdmm.optimizers import opt_residual

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def kron_vectors(draw) -> KronVector:
    """A small non-negative Kronecker vector: 1-4 terms over 1-3 axes of 1-4 values, with repeats."""
    d = draw(st.integers(1, 3))
    sizes = tuple(draw(st.integers(1, 4)) for _ in range(d))
    terms = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    rows, index = [], []
    for n in sizes:
        k = int(rng.integers(1, 4))
        # values from a small set so that constant vectors and equal columns occur
        r = rng.choice([0.0, 0.5, 1.0, 2.0, 3.0], size=(k, n))
        if rng.random() < 0.3:
            r[:] = r[:, :1]
        rows.append(r)
        index.append(rng.integers(0, k, terms))
    weights = rng.choice([0.0, 0.25, 1.0, 1.5], size=terms)
    return KronVector.factored(sizes, weights, rows, np.stack(index, axis=1))


@SETTINGS
@given(kron_vectors())
def test_max_matches_the_expanded_vector(v):
    want = float(v.to_array().max())
    lower, upper = v.max_bounds()
    assert lower == pytest.approx(want, rel=1e-12, abs=1e-300)
    assert upper == pytest.approx(want, rel=1e-12, abs=1e-300)


@SETTINGS
@given(kron_vectors(), st.integers(0, 3))
def test_branch_and_bound_is_exact_or_brackets_the_maximum(v, steps):
    want = float(v.to_array().max())
    enumeration = hm.MAX_ENUMERATION
    hm.MAX_ENUMERATION = 0  # force the search
    try:
        exact = v.max_bounds()
        cut = v.max_bounds(steps=steps)
    finally:
        hm.MAX_ENUMERATION = enumeration
    assert exact[0] == pytest.approx(want, rel=1e-12) and exact[1] == pytest.approx(want, rel=1e-12)
    assert cut[0] <= want * (1 + 1e-12) and cut[1] >= want * (1 - 1e-12)


def _dense_sensitivity(A: np.ndarray, p: int) -> float:
    return float(np.max((np.abs(A) ** p).sum(axis=0)) ** (1 / p))


@pytest.mark.parametrize("p", [1, 2])
def test_unions_of_kronecker_products_match_dense(p):
    rng = np.random.default_rng(1)
    for _ in range(20):
        sizes = tuple(int(s) for s in rng.integers(1, 5, rng.integers(1, 4)))
        blocks = []
        for _ in range(int(rng.integers(1, 4))):
            factors = [Explicit(rng.random((int(rng.integers(1, 4)), n)) * (rng.random(n) < 0.8))
                       if rng.random() < 0.7 else Ones(1, n) for n in sizes]
            blocks.append(Weighted(Kronecker(factors), float(rng.random())))
        A = VStack(blocks)
        assert A.sensitivity(p) == pytest.approx(_dense_sensitivity(A.dense(), p), rel=1e-12)


def test_differently_split_unions_are_merged_not_expanded():
    rng = np.random.default_rng(2)
    a = Kronecker([Explicit(rng.random((2, 6))), Explicit(rng.random((3, 5)))])
    b = Kronecker([Explicit(rng.random((2, 2))), Explicit(rng.random((2, 15)))])
    A = VStack([a, b])
    for p in (1, 2):
        assert A.sensitivity(p) == pytest.approx(_dense_sensitivity(A.dense(), p), rel=1e-12)


# ---------------------------------------------------------------------- 10^100 cells
D, N = 100, 10


@pytest.mark.parametrize("p", [1, 2])
def test_kronecker_over_a_googol_cells_is_the_product_of_factor_maxima(p):
    rng = np.random.default_rng(3)
    factors = [Explicit(rng.random((3, N))) for _ in range(D)]
    want = math.prod(_dense_sensitivity(f.matrix, p) for f in factors)
    A = Kronecker(factors)
    assert float(A.shape[1]) == 1e100
    assert A.sensitivity(p) == pytest.approx(want, rel=1e-12)


def test_union_of_kronecker_products_over_a_googol_cells():
    # term k varies on attribute k only: the maximum is the sum of each term's maximum
    rng = np.random.default_rng(4)
    blocks, want = [], 0.0
    for k in range(5):
        F = Explicit(rng.random((2, N)))
        factors = [Ones(1, N)] * D
        factors = factors[:k] + [F] + factors[k + 1:]
        w = float(k + 1)
        blocks.append(Weighted(Kronecker(factors), w))
        want += w * float(np.abs(F.matrix).sum(axis=0).max())
    A = VStack(blocks)
    assert A.sensitivity(1) == pytest.approx(want, rel=1e-12)
    # two full Kronecker products of unit-norm factors and the identity: constant columns
    unit = [Kronecker([Explicit(np.eye(N)[::-1]) for _ in range(D)]), 0.5 * Kronecker([Identity(N)] * D)]
    assert VStack(unit).sensitivity(1) == pytest.approx(1.5, rel=1e-12)
    assert VStack(unit).sensitivity(2) == pytest.approx(math.sqrt(1.25), rel=1e-12)


def test_marginal_and_residual_strategies_over_a_googol_cells():
    dom = hdmm.Domain([f"x{i}" for i in range(D)], [N] * D)
    W = AllMarginals(dom, 2)
    assert W.sensitivity(1) == pytest.approx(1 + D + D * (D - 1) / 2)
    A = opt_residual(W, hdmm.ZCDP(0.5))
    assert isinstance(A, Residuals)
    assert A.sensitivity(2) == pytest.approx(1.0, rel=1e-9)
    # the residual strategy's L1 sensitivity: its Helmert columns differ from value to value
    small = opt_residual(AllMarginals((3, 4, 2), 2), hdmm.ZCDP(0.5))
    assert small.sensitivity(1) == pytest.approx(_dense_sensitivity(small.dense(), 1), rel=1e-12)
