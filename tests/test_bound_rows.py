"""The row Gram of a coupled SVD-bound block (hdmm.bound_rows) against dense numpy (docs/math.md, section 5.4)."""

from __future__ import annotations

import itertools
from functools import reduce

import numpy as np
import pytest

from hdmm import workload as wl
from hdmm.bound import svd_bound
from hdmm.bound_rows import RowGram, row_plan, trace_sqrt_rows
from hdmm.matrix import Identity, Kronecker
from hdmm.privacy import ZCDP
from hdmm.slq import probe_brackets
from strategies import dense_svd_bound


def _compressed(G):
    values, vectors = np.linalg.eigh(G)
    keep = values > 1e-10 * values.max()
    return (vectors[:, keep] * np.sqrt(values[keep])).T, values[keep]


def _prefix_gram(n):
    P = np.tril(np.ones((n, n)))
    return P.T @ P


def _coupled(seed, sizes=(4, 3, 5, 2), terms=40, max_queries=3):
    """Random terms over per-attribute Grams (prefix, total, a random rank-2 Gram, identity), at most
    ``max_queries`` non-total factors per term: the row Gram's operator and its dense ``B``."""
    rng = np.random.default_rng(seed)
    grams = []
    for n in sizes:
        A = rng.standard_normal((2, n))
        grams.append([_prefix_gram(n), np.ones((n, n)), A.T @ A, np.eye(n)])
    index = np.array([ix for ix in itertools.product(range(4), repeat=len(sizes))
                      if sum(k != 1 for k in ix) <= max_queries])
    index = index[rng.permutation(len(index))[:terms]]
    w2 = rng.uniform(0.5, 2.0, len(index))
    pairs = [[_compressed(G) for G in gs] for gs in grams]
    op = RowGram(w2, index, [[R for R, _ in ps] for ps in pairs], [[v for _, v in ps] for ps in pairs])
    B = np.hstack([np.sqrt(w) * reduce(np.kron, [pairs[i][k][0].T for i, k in enumerate(ix)])
                   for w, ix in zip(w2, index)])
    M = sum(w * reduce(np.kron, [grams[i][k] for i, k in enumerate(ix)]) for w, ix in zip(w2, index))
    return op, B, M


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_row_gram_products_equal_the_dense_row_gram(seed):
    op, B, _ = _coupled(seed)
    A = B.T @ B
    assert op.shape == A.shape
    scale = np.abs(A).max()
    assert np.abs(op.dense() - A).max() <= 1e-12 * scale
    assert np.allclose(op.diagonal(), np.diagonal(A), rtol=1e-12, atol=1e-12 * scale)
    X = np.random.default_rng(seed).standard_normal((op.n, 3))
    assert np.abs(op.matmat(X) - A @ X).max() <= 1e-12 * np.abs(A @ X).max()
    assert np.allclose(op.matmat(X[:, 0]), A @ X[:, 0], rtol=1e-12, atol=1e-12 * np.abs(A @ X).max())
    # a column-major block, as the Lanczos recurrence passes it, and a zero weight
    assert np.allclose(op.matmat(np.asfortranarray(X)), A @ X)


def test_row_gram_with_a_zero_term_weight():
    op, B, _ = _coupled(3, terms=12)
    w2 = op.root**2
    w2[::3] = 0.0
    zeroed = RowGram(w2, op.index, op.factors, op.values)
    B = np.hstack([np.sqrt(w) * reduce(np.kron, [zeroed.factors[i][k].T for i, k in enumerate(ix)])
                   for w, ix in zip(w2, op.index)])
    X = np.random.default_rng(3).standard_normal((op.n, 2))
    assert np.allclose(zeroed.matmat(X), B.T @ B @ X, rtol=1e-12, atol=1e-12 * np.abs(B.T @ B).max())


def test_row_gram_has_the_nonzero_spectrum_of_the_block():
    op, B, M = _coupled(4, sizes=(4, 3, 3), terms=20)
    want = np.sqrt(np.clip(np.linalg.eigvalsh(M), 0, None)).sum()
    got = np.sqrt(np.clip(np.linalg.eigvalsh(op.dense()), 0, None)).sum()
    assert got == pytest.approx(want, rel=1e-7)  # the null spaces round to +-1e-13: their roots differ


def test_row_gram_rejects_bad_input():
    op, _, _ = _coupled(0, terms=5)
    with pytest.raises(ValueError, match="index must have shape"):
        RowGram(op.root**2, op.index[:, :2], op.factors, op.values)
    with pytest.raises(ValueError, match="non-negative"):
        RowGram(-op.root**2, op.index, op.factors, op.values)
    with pytest.raises(ValueError, match="eigenvalues"):
        RowGram(op.root**2, op.index, op.factors, [[v[:-1] for v in vs] for vs in op.values])
    with pytest.raises(ValueError, match="rows"):
        op.matmat(np.ones(op.n + 1))


@pytest.mark.parametrize("reorthogonalize", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_trace_sqrt_rows_within_a_few_standard_errors(seed, reorthogonalize):
    op, _, M = _coupled(seed, sizes=(6, 5, 5, 3), terms=30)
    want = np.sqrt(np.clip(np.linalg.eigvalsh(M), 0, None)).sum()
    est = trace_sqrt_rows(op, probes=6, steps=40, seed=seed, reorthogonalize=reorthogonalize)
    assert est.steps == 40 and est.probes == 6 and est.stderr > 0
    assert est.stderr == pytest.approx(np.hypot(est.sampling, est.truncation))
    assert abs(est.value - want) <= 4 * est.stderr, (est, want)


def test_trace_sqrt_rows_is_exact_with_every_step_reorthogonalized():
    op, _, M = _coupled(5, sizes=(3, 3, 2), terms=10)
    want = np.sqrt(np.clip(np.linalg.eigvalsh(M), 0, None)).sum()
    est = trace_sqrt_rows(op, probes=3, steps=10**6, seed=0, reorthogonalize=True)
    assert est.truncation == 0.0 and est.steps == op.n
    # each probe's quadrature is exact: only the sampling error is left
    assert abs(est.value - want) <= 5 * est.sampling + 1e-8 * want


def test_probe_brackets_match_trace_function():
    from hdmm.slq import trace_function
    A = np.random.default_rng(0).standard_normal((50, 50))
    A = A @ A.T
    lower, upper = probe_brackets(lambda X: A @ X, 50, [5, 10], probes=4, rng=7)
    est = trace_function(lambda X: A @ X, 50, probes=4, steps=10, rng=7)
    assert lower.shape == (2, 4)
    assert lower[1].mean() == pytest.approx(est.lower) and upper[1].mean() == pytest.approx(est.upper)
    plain_lower, plain_upper = probe_brackets(lambda X: A @ X, 50, [5, 10], probes=4, rng=7, reorthogonalize=False)
    assert np.allclose(plain_lower[0], lower[0]) and np.allclose(plain_upper[0], upper[0])
    with pytest.raises(ValueError, match="levels"):
        probe_brackets(lambda X: A @ X, 50, [10, 5])


def _prefix_marginals(sizes, queries, k_max):
    """Every marginal on at most ``k_max`` attributes: Prefix on the first ``queries`` attributes, Identity
    on the rest, Total elsewhere; with its dense reference."""
    parts, dense = [], []
    for k in range(k_max + 1):
        for subset in itertools.combinations(range(len(sizes)), k):
            factors = [(wl.Prefix(n) if i < queries else Identity(n)) if i in subset else wl.Total(n)
                       for i, n in enumerate(sizes)]
            parts.append(Kronecker(factors))
            dense.append(reduce(np.kron, [f.dense() for f in factors]))
    return wl.union(parts), np.vstack(dense)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_svd_bound_estimates_coupled_prefix_blocks_on_the_row_side(seed):
    # three prefix attributes and an identity, <= 2-way marginals: the coupled prefix block has
    # more columns (7 x 6 x 5) than rows (1 + 18 + 107), so it is estimated on the row side
    W, ref = _prefix_marginals((7, 6, 5, 3), 3, 2)
    privacy = ZCDP(0.5)
    truth = dense_svd_bound(ref, privacy)
    b = svd_bound(W, privacy, exact_limit=1, seed=seed)
    assert "row Gram" in b.method and not b.exact and not b.lower and b.stderr > 0, b
    assert abs(b.value - truth) <= 4 * b.stderr, (b, truth)
    again = svd_bound(W, privacy, exact_limit=1, seed=seed)
    assert again.value == b.value and again.stderr == b.stderr


def test_row_side_past_its_work_budget_gives_the_certain_lower_bound():
    W, ref = _prefix_marginals((7, 6, 5, 3), 3, 2)
    privacy = ZCDP(0.5)
    truth = dense_svd_bound(ref, privacy)
    b = svd_bound(W, privacy, exact_limit=1, seed=0, lanczos_work=1)
    assert b.lower and b.certain and b.stderr == 0 and b.value <= truth * (1 + 1e-12)
    assert "past lanczos_work" in b.method


def test_row_plan_cuts_probes_then_steps():
    plan = row_plan
    assert plan(100, 30, 480, float("inf")) == (30, 100)
    rows = 10**7
    assert plan(rows, 30, 480, float("inf"))[0] == 2
    p, m = plan(rows, 30, 480, 2 * 120 * rows)
    assert (p, m) == (2, 120)
    assert plan(rows, 30, 480, rows) is None


def test_the_estimated_lanczos_error_covers_the_error_on_prefix_marginals():
    """On an Adult-like block (prefix Grams and totals, every <= 3-way marginal) the corrected
    estimate's distance from the exact Hutchinson value of the same probes (its Lanczos error alone)
    is below the estimated Lanczos error, with the plain recurrence."""
    sizes = (7, 6, 5, 4)
    pairs = [[_compressed(G) for G in (_prefix_gram(n), np.ones((n, n)))] for n in sizes]
    index = np.array([[0 if i in S else 1 for i in range(4)] for k in range(4)
                      for S in itertools.combinations(range(4), k)])
    op = RowGram(np.ones(len(index)), index, [[R for R, _ in ps] for ps in pairs], [[v for _, v in ps] for ps in pairs])
    values, vectors = np.linalg.eigh(op.dense())
    root = (vectors * np.sqrt(np.clip(values, 0, None))) @ vectors.T
    for seed in (0, 1):
        # the probes of hdmm.slq: one child generator per probe
        children = np.random.default_rng(seed).spawn(3)
        V = np.stack([2.0 * g.integers(0, 2, size=op.n, dtype=np.int8) - 1.0 for g in children])
        hutchinson = np.einsum("pn,nm,pm->p", V, root, V).mean()
        for steps in (20, 40, 80):
            est = trace_sqrt_rows(op, probes=3, steps=steps, seed=seed, reorthogonalize=False)
            assert 0 < abs(est.value - hutchinson) <= est.truncation, (steps, est, hutchinson)
