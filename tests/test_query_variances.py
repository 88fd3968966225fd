"""Per-query variance summaries and blocks (hdmm.query_variances) against dense per-query variances."""

from __future__ import annotations

import numpy as np
import pytest

import hdmm
from hdmm import query_variances as qv
from hdmm.error import per_query_variance
from hdmm.kron_union import kron_union
from hdmm.marginals import DimKMarginals, Marginals
from hdmm.matrix import Explicit, Identity, Kronecker, Ones, VStack, Weighted
from hdmm.optimizers import opt_union
from hdmm.planning import union_variance_bound
from hdmm.residual_bases import ResidualBases
from hdmm.structure import classify
from test_union_gram import dense_unit_variances

PRIVACY = hdmm.ZCDP(0.5)


def _explicit(rows, n, seed, rank=None):
    rng = np.random.default_rng(seed)
    rank = rank or min(rows, n)
    return Explicit(rng.normal(size=(rows, rank)) @ rng.normal(size=(rank, n)))


def _with_total(rows, n, seed):
    """A random factor whose row space holds the total (the ones row), so only some workload terms are supported."""
    return Explicit(np.vstack([np.ones(n), np.random.default_rng(seed).normal(size=(rows - 1, n))]))


def _workload():
    dom = hdmm.Domain(list("abc"), [4, 3, 5])
    return hdmm.union([hdmm.product(dom, {"a": hdmm.Prefix(4), "c": hdmm.AllRange(5)}),
                       hdmm.DimKMarginals(dom, 1), hdmm.product(dom, {"b": hdmm.Identity(3)})], weights=[1.0, 2.0, 0.5])


def _cases():
    W = _workload()
    kron = Kronecker([_explicit(5, 4, 0), Identity(3), hdmm.Prefix(5)])
    marg = Marginals([4, 3, 5], {(0,): 1.0, (1, 2): 2.0, (): 0.5, (0, 1, 2): 0.3})
    union = opt_union(W, PRIVACY, groups=[[0], list(range(1, kron_union(W).num_terms))], seed=0)
    mixed = VStack([Kronecker([_explicit(4, 4, s), Identity(3), Identity(5)]) for s in range(2)]
                   + [Kronecker([_explicit(4, 4, 9), Ones(1, 3), Identity(5)])])
    zero_sum = np.diff(np.eye(4), axis=0) * [[1.0], [2.0], [0.5]]  # rows summing to zero, not Helmert's
    residual = ResidualBases([4, 3, 5], {(): 1.0, (0,): 2.0, (1,): 1.0, (2,): 1.5, (0, 2): 0.7, (1, 2): 0.4},
                             [zero_sum, None, None])
    return {"kronecker": (W, kron), "marginals": (W, marg), "union": (W, union), "dense": (W, mixed),
            "residual": (W, residual),
            "unsupported kronecker": (W, Kronecker([_with_total(2, 4, 1), Identity(3), Identity(5)])),
            "unsupported marginals": (DimKMarginals([4, 3, 5], 2), Marginals([4, 3, 5], {(0,): 1.0, (1, 2): 1.0})),
            "unsupported union": (W, VStack([Kronecker([_explicit(3, 4, 0, 2), Identity(3), Identity(5)]),
                                             Weighted(Kronecker([Ones(1, 4), _with_total(2, 3, 1), Identity(5)]), 0.5)]))}


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("block_rows", [1, 4, 7, 100, qv.BLOCK_ROWS])
def test_blocks_are_the_per_query_variances(name, block_rows):
    W, A = CASES[name]
    want = per_query_variance(W, A, PRIVACY)
    if name.startswith("unsupported"):
        assert np.isinf(want).any() and np.isfinite(want).any()
    dense = dense_unit_variances(W, A) * PRIVACY.noise_variance(PRIVACY.noise.sensitivity(A))
    np.testing.assert_array_equal(np.isinf(dense), np.isinf(want))
    np.testing.assert_allclose(want[np.isfinite(want)], dense[np.isfinite(want)], rtol=1e-8)
    blocks = list(qv.query_variance_blocks(W, A, PRIVACY, block_rows=block_rows))
    assert all(v.size <= block_rows for _, v in blocks)
    assert [start for start, _ in blocks] == list(np.cumsum([0] + [v.size for _, v in blocks])[:-1])
    got = np.concatenate([v for _, v in blocks])
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-9)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("block_rows", [3, qv.BLOCK_ROWS])
def test_summary_is_the_largest_and_mean_variance_per_term(name, block_rows):
    W, A = CASES[name]
    want = per_query_variance(W, A, PRIVACY)
    s = qv.variance_summary(W, A, PRIVACY, block_rows=block_rows)
    assert s.exact and s.queries == W.shape[0]
    assert s.max == pytest.approx(want.max(), rel=1e-9) and want[s.argmax] == pytest.approx(want.max(), rel=1e-9)
    assert s.label == W.labels[s.argmax]
    assert s.mean == pytest.approx(want.mean(), rel=1e-9)
    rows = kron_union(W).term_rows().astype(int)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    assert [t.first_row for t in s.terms] == list(starts) and [t.queries for t in s.terms] == list(rows)
    for t in s.terms:
        part = want[t.first_row:t.first_row + t.queries]
        assert t.max == pytest.approx(part.max(), rel=1e-9) and t.mean == pytest.approx(part.mean(), rel=1e-9)
        assert want[t.argmax] == pytest.approx(part.max(), rel=1e-9) and t.label == W.labels[t.first_row]
    assert len(s.table()) == len(s.terms)


def test_a_union_strategy_that_does_not_diagonalise_gives_the_per_group_bound(monkeypatch):
    W, A = CASES["dense"]
    monkeypatch.setattr(qv, "DENSE_LIMIT", 0)  # as on a domain too large for the dense pseudo-inverse
    s = qv.variance_summary(W, A, PRIVACY, block_rows=5)
    bound = union_variance_bound(W, classify(A)) * PRIVACY.noise_variance(PRIVACY.noise.sensitivity(A))
    got = np.concatenate([v for _, v in qv.query_variance_blocks(W, A, PRIVACY, block_rows=5)])
    np.testing.assert_allclose(got, bound, rtol=1e-12)
    assert not s.exact and not any(t.exact for t in s.terms)
    assert s.max == pytest.approx(bound.max()) and s.mean == pytest.approx(bound.mean())
    assert s.max >= per_query_variance(W, A, PRIVACY).max()


def test_a_billion_queries_from_the_factors():
    W = Kronecker([hdmm.Prefix(1024)] * 3)
    A = Kronecker([hdmm.Prefix(1024)] * 3)  # every query answered from one measurement
    s = qv.variance_summary(W, A, PRIVACY)
    assert s.queries == 1024**3 and s.exact
    assert s.max == pytest.approx(PRIVACY.noise_variance(1024**1.5))  # columns of Prefix have norm up to sqrt(1024)
    first = next(iter(qv.query_variance_blocks(W, A, PRIVACY, block_rows=1000)))
    assert first[0] == 0 and first[1].size == 1000


def test_bad_block_sizes_are_refused():
    W, A = CASES["kronecker"]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="block_rows"):
            qv.variance_summary(W, A, PRIVACY, block_rows=bad)
