"""The exact family projection (hdmm.georelease.activeset) against closed forms and the gradient method."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hdmm.georelease.activeset import family_projection, gap_floor, root_projection
from hdmm.georelease.simplex import simplex_projection


def objective(G, B, V, w=None):
    w = np.ones(len(V)) if w is None else w
    return float(np.sum(w * (0.5 * np.einsum("ki,ij,kj->k", V, G, V) - np.sum(B * V, axis=1))))


def test_identity_gram_gives_the_simplex_projection_of_each_cell():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(7, 5)) * 3
    p = rng.random(5) * 4 + 0.1
    V = family_projection(np.eye(5), X, p, X, bound=1e-14)
    np.testing.assert_allclose(V, simplex_projection(X, p), atol=1e-7)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.integers(1, 8), st.booleans(), st.integers(0, 2**32 - 1))
def test_rank_deficient_grams_reach_the_certified_optimum(k, s, r, weighted, seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(r, s))  # rank r < s: a singular Gram, as a strategy measuring only the workload's needs
    G = A.T @ A
    X = rng.normal(size=(k, s)) * 5
    B = X @ G
    p = rng.random(s) * 10 + 1e-3
    w = np.ones(k) if not weighted else rng.random(k) + 0.2
    bound = 1e-8 * k * s
    V = family_projection(G, B, p, X, bound=bound, weights=w)
    assert V is not None
    assert V.min() >= 0 and np.allclose(V.sum(axis=0), p, rtol=1e-12, atol=1e-12)
    # f(V) - f* <= the Frank-Wolfe gap: over the feasible set, <grad, V - S> is largest with all of p_j
    # in the child of the smallest partial derivative, cell by cell
    grad = w[:, None] * (V @ G - B)
    gap = float(np.sum(grad * V) - sum(p[j] * grad[:, j].min() for j in range(s)))
    assert gap <= bound * (1 + 1e-9)
    # no feasible vertex or random feasible point does better than f(V) - bound
    for _ in range(20):
        U = rng.dirichlet(np.ones(k), size=s).T * p
        assert objective(G, B, U, w) >= objective(G, B, V, w) - bound * (1 + 1e-9)


def test_families_too_large_or_with_empty_cells_are_left_to_the_caller(monkeypatch):
    G = np.eye(3)
    X = np.ones((2, 3))
    assert family_projection(G, X, np.array([1.0, 0.0, 2.0]), X, bound=1e-9) is None
    from hdmm.georelease import activeset
    big = activeset.MAX_CELLS + 1
    assert family_projection(np.eye(big), np.ones((1, big)), np.ones(big), np.ones((1, big)), bound=1.0) is None
    monkeypatch.setattr(activeset, "MAX_ENTRIES", 1000)
    k = 1000 // 16 + 1  # every child free in 4 cells: too many inverses to hold
    assert family_projection(np.eye(4), np.ones((k, 4)), np.full(4, float(k)), np.ones((k, 4)), bound=0.0) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 10), st.integers(1, 10), st.floats(1e-3, 1e6), st.integers(0, 2**32 - 1))
def test_the_root_reaches_the_certified_optimum(s, r, total, seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(r, s))  # a singular Gram when r < s
    G = A.T @ A
    x = rng.normal(size=s) * total / s * 3  # least-squares cells, some negative, at the total's scale
    bound = 1e-9 * s * (1.0 + total**2)  # relative to the objective's scale, as a noise standard deviation is
    v = root_projection(G, x, total, bound)
    assert v is not None
    assert v.min() >= 0 and np.isclose(v.sum(), total, rtol=1e-12)
    grad = G @ (v - x)
    assert float(grad @ v - total * grad.min()) <= bound * (1 + 1e-9)
    f = 0.5 * (v - x) @ G @ (v - x)
    for _ in range(20):  # no feasible point does better than f(v) - bound
        u = rng.dirichlet(np.ones(s)) * total
        assert 0.5 * (u - x) @ G @ (u - x) >= f - bound * (1 + 1e-6) - 1e-9 * abs(f)
    for j in range(s):  # nor any vertex
        u = np.zeros(s)
        u[j] = total
        assert 0.5 * (u - x) @ G @ (u - x) >= f - bound * (1 + 1e-6) - 1e-9 * abs(f)


def test_the_identity_root_is_the_simplex_projection():
    x = np.array([4.0, -2.0, 1.0, 0.5])
    v = root_projection(np.eye(4), x, 3.0, 1e-14)
    np.testing.assert_allclose(v, simplex_projection(x[:, None], np.array([3.0]))[:, 0], atol=1e-9)
    assert root_projection(np.eye(4), x, 0.0, 1e-9) is None  # nothing to spread: the caller's


@pytest.mark.parametrize("seed", range(3))
def test_a_country_sized_root_is_certified_at_a_tight_bound(seed):
    """Cells of up to millions with noise of a few persons, measured by marginals (0/1 rows, as a census
    strategy): the bound is ~1e-13 of the squared cells, so the steps must be solved relative to their
    centre (Gv - Gx would lose the multipliers to rounding)."""
    rng = np.random.default_rng(seed)
    eye, ones = np.eye, lambda n: np.ones((1, n))
    A = np.vstack([np.kron(np.kron(eye(8), eye(5)), ones(10)), np.kron(np.kron(eye(8), ones(5)), eye(10)),
                   np.kron(np.kron(ones(8), eye(5)), eye(10)), np.ones((1, 400))])  # rank 148 on 400 cells
    truth = rng.gamma(0.3, 200000, size=400) * (rng.random(400) < 0.8)
    x = np.linalg.pinv(A) @ (A @ truth + rng.normal(0, 2.0, A.shape[0]))
    bound = 0.5 * (0.01 * 2.0) ** 2 * A.shape[0]  # answers within 1% of a noise sd (RMS) of the optimum's
    v = root_projection(A.T @ A, x, float(truth.sum()), bound)
    assert v is not None and v.min() >= 0 and np.isclose(v.sum(), truth.sum(), rtol=1e-14)
    grad = A.T @ (A @ (v - x))
    # the certificate: the bound, or what double precision resolves at this total if that is larger (here it is:
    # about 0.5 against 0.034; which of the two a run meets depended on the BLAS threads' rounding before)
    floor = gap_floor(A.T @ A, x, float(truth.sum()))
    assert 0.1 < floor < 1.0
    assert float(grad @ v - truth.sum() * grad.min()) <= max(bound, floor) * (1 + 1e-6)
