"""The SVD lower bound (hdmm.bound) against dense singular values (docs/math.md, section 5)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import hdmm.bound as hdmm_bound
from hdmm.kron_union import kron_union
from hdmm import workload as wl
from hdmm.bound import SVDBound, svd_bound
from hdmm.error import expected_error
from hdmm.marginals import AllMarginals, DimKMarginals, Marginal
from hdmm.matrix import Explicit, Identity, Kronecker, VStack
from hdmm.privacy import ApproxDP, PureDP, ZCDP
from strategies import (
    SETTINGS,
    Pair,
    all_subsets,
    dense_svd_bound,
    domain_shapes,
    kron_terms,
    marginal_block_ref,
    marginals_on,
    privacies,
    strategies_on,
    workloads_on,
)

PRIVACIES = [PureDP(1.0), ZCDP(0.5), ApproxDP(1.0, 1e-6)]


def check_exact(W: Pair, privacy, **kwargs) -> SVDBound:
    b = svd_bound(W.mat, privacy, **kwargs)
    assert isinstance(b, SVDBound)
    want = dense_svd_bound(W.ref, privacy)
    assert b.exact is True, b
    assert b.stderr == 0.0
    assert b.value == pytest.approx(want, rel=1e-7, abs=1e-10 * privacy.noise_variance(1.0))
    assert float(b) == b.value
    assert b.queries == W.shape[0]
    assert b.rmse == pytest.approx(math.sqrt(want / W.shape[0]), rel=1e-7, abs=1e-10)
    assert isinstance(b.method, str) and b.method
    return b


# ====================================================================== exact on each structure
@SETTINGS
@given(domain_shapes().flatmap(kron_terms), privacies())
def test_single_kronecker_product(W, privacy):
    check_exact(W, privacy)


@SETTINGS
@given(domain_shapes(max_dims=4).flatmap(lambda s: marginals_on(s, min_weight=0.0)), privacies())
def test_marginals(W, privacy):
    check_exact(W, privacy)


@SETTINGS
@given(domain_shapes(), st.data(), privacies())
def test_identity_total_unions(shape, data, privacy):
    subsets = data.draw(st.lists(st.sampled_from(all_subsets(len(shape))), min_size=1, unique=True))
    weights = data.draw(st.lists(st.floats(0.1, 3.0), min_size=len(subsets), max_size=len(subsets)))
    blocks = [w * Kronecker([Identity(n) if i in s else wl.Total(n) for i, n in enumerate(shape)]) for s, w in zip(subsets, weights)]
    ref = np.vstack([w * marginal_block_ref(shape, s) for s, w in zip(subsets, weights)])
    check_exact(Pair(VStack(blocks), ref), privacy)


@SETTINGS
@given(domain_shapes().flatmap(workloads_on), privacies())
def test_general_unions(W, privacy):
    check_exact(W, privacy)


@SETTINGS
@given(domain_shapes().flatmap(workloads_on), st.sampled_from([(0, 10**9), (0, 2), (10**9, 10**9)]))
def test_general_unions_whatever_the_split_decision(W, limits):
    # large attributes (here: all, or none) with few blocks stay whole; the bound is the same
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hdmm_bound, "SPLIT_ALWAYS_N", limits[0])
        patch.setattr(hdmm_bound, "SPLIT_MIN_BLOCKS", limits[1])
        check_exact(W, ZCDP(1.0))


def _non_commuting_union() -> Pair:
    """Prefix and AllRange Grams do not commute, on either attribute."""
    rng = np.random.default_rng(4)
    E = rng.standard_normal((2, 4))
    P5, P4 = np.tril(np.ones((5, 5))), np.tril(np.ones((4, 4)))
    R5, R4 = wl.AllRange(5).dense(), wl.AllRange(4).dense()
    W = wl.union(
        [Kronecker([wl.Prefix(5), wl.AllRange(4)]), Kronecker([wl.AllRange(5), wl.Prefix(4)]), Kronecker([wl.Prefix(5), Explicit(E)])],
        weights=[1.0, 0.5, 2.0],
    )
    ref = np.vstack([np.kron(P5, R4), 0.5 * np.kron(R5, P4), 2.0 * np.kron(P5, E)])
    return Pair(W, ref)


@pytest.mark.parametrize("privacy", PRIVACIES, ids=lambda p: type(p).__name__)
def test_structured_examples(privacy):
    cases = [
        Pair(Kronecker([wl.Prefix(4), wl.AllRange(3)]), np.kron(np.tril(np.ones((4, 4))), wl.AllRange(3).dense())),
        Pair(3.0 * Kronecker([wl.IdentityTotal(3), wl.Prefix(5)]), 3.0 * np.kron(np.vstack([np.eye(3), np.ones((1, 3))]), np.tril(np.ones((5, 5))))),
        Pair(wl.Prefix(7), np.tril(np.ones((7, 7)))),
        Pair(AllMarginals((2, 3, 2), 2), np.vstack([marginal_block_ref((2, 3, 2), s) for s in all_subsets(3) if len(s) <= 2])),
        Pair(DimKMarginals((3, 2, 2), 1), np.vstack([marginal_block_ref((3, 2, 2), (i,)) for i in range(3)])),
        Pair(Marginal((4, 3), (1,)), marginal_block_ref((4, 3), (1,))),
        _non_commuting_union(),
    ]
    for W in cases:
        check_exact(W, privacy)


def _shared_base_union() -> Pair:
    """Attribute 0: Grams I, J and I + J (one shared base); attribute 1: width-3 ranges,
    their double and the identity; attribute 2: two diagonal Grams."""
    W3 = wl.WidthKRange(6, 3)
    D1, D2 = Explicit(np.diag([1.0, 2.0, 0.5])), Explicit(np.diag([3.0, 0.0, 1.0]))
    terms = [Kronecker([Identity(4), W3, D1]), Kronecker([wl.Total(4), 2.0 * W3, D2]),
             Kronecker([wl.IdentityTotal(4), Identity(6), D1])]
    weights = [1.0, 0.7, 1.3]
    ref = np.vstack([w * np.kron(np.kron(t.factors[0].dense(), t.factors[1].dense()), t.factors[2].dense())
                     for w, t in zip(weights, terms)])
    return Pair(wl.union(terms, weights=weights), ref)


@pytest.mark.parametrize("limits", [(4096, 2**25), (1, 2**25), (1, 1)], ids=["default", "one solve", "no scalars"])
def test_shared_base_and_diagonal_attributes_split_without_eigenvectors(limits, monkeypatch):
    # every attribute splits fully from eigenvalues alone, so all blocks are scalars: exact
    # however few separate solves are allowed; with no room for scalars, attributes stay whole
    monkeypatch.setattr(hdmm_bound, "BLOCK_LIMIT", limits[0])
    monkeypatch.setattr(hdmm_bound, "SCALAR_WORK_LIMIT", limits[1])
    b = check_exact(_shared_base_union(), ZCDP(1.0))
    assert ("closed form" in b.method) == (limits[1] > 1)


@pytest.mark.parametrize("make, n, d", [(wl.AllRange, 128, 3), (wl.Prefix, 200, 3), (wl.AllRange, 32, 4)])
def test_range_on_each_attribute_spans_a_wide_eigenvalue_range(make, n, d):
    # one range workload per attribute, the identity elsewhere: the Gram is a Kronecker sum, its
    # eigenvalues are sums of the attribute's eigenvalues, from tiny to huge across attributes
    terms = [Kronecker([make(n) if j == i else Identity(n) for j in range(d)]) for i in range(d)]
    lam = make(n).gram().spectrum().values
    total = np.zeros(1)
    for _ in range(d):
        total = (total[:, None] + lam[None, :]).ravel()
    privacy = ZCDP(1.0)
    want = privacy.noise_variance(1.0) * np.sqrt(total).sum() ** 2 / n**d
    b = svd_bound(wl.union(terms), privacy)
    assert b.exact and b.value == pytest.approx(want, rel=1e-8)


@pytest.mark.parametrize("scale", [1e4, 1e-4])
def test_factors_of_very_different_scales(scale):
    # eigenvalues far above or below 1 in some factors must not be taken for rounding noise
    n = 8
    P, eye = wl.Prefix(n).dense(), np.eye(n)
    unions = [
        [Kronecker([scale * wl.AllRange(n), Identity(n), wl.Prefix(n)]), Kronecker([Identity(n), scale * wl.Prefix(n), Identity(n)])],
        [Kronecker([Explicit(scale * P), Explicit(scale * eye), wl.Prefix(n)]),
         Kronecker([Explicit(scale * eye), Explicit(scale * P), wl.AllRange(n)])],
    ]
    for terms in unions:
        ref = np.vstack([np.kron(np.kron(t.factors[0].dense(), t.factors[1].dense()), t.factors[2].dense()) for t in terms])
        check_exact(Pair(wl.union(terms), ref), ZCDP(1.0))


# ====================================================================== stochastic Lanczos fall-back
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slq_fallback(seed):
    W = _non_commuting_union()
    privacy = ZCDP(1.0)
    truth = dense_svd_bound(W.ref, privacy)
    b = svd_bound(W.mat, privacy, exact_limit=1, seed=seed)
    assert b.exact is False, b
    assert b.stderr > 0
    assert "Lanczos" in b.method
    assert abs(b.value - truth) <= 4 * b.stderr + 1e-9 * truth, (b, truth)
    # reproducible with a seed
    again = svd_bound(W.mat, privacy, exact_limit=1, seed=seed)
    assert again.value == b.value and again.stderr == b.stderr


@pytest.mark.parametrize("seed", [0, 1])
def test_slq_on_whole_attributes_uses_their_own_products(seed, monkeypatch):
    # no eigenvector split and no exact solve: whole attributes go to stochastic Lanczos
    # quadrature through the factor Grams themselves (prefix and range Grams are implicit)
    monkeypatch.setattr(hdmm_bound, "SPLIT_MAX_N", 0)
    W = _non_commuting_union()
    privacy = ZCDP(1.0)
    truth = dense_svd_bound(W.ref, privacy)
    b = svd_bound(W.mat, privacy, exact_limit=1, seed=seed)
    assert not b.exact and "Lanczos" in b.method
    assert abs(b.value - truth) <= 4 * b.stderr + 1e-9 * truth, (b, truth)


def test_a_near_multiple_of_a_shared_gram_is_not_taken_for_one():
    # G2 = 2 B + 1e-7 E is no combination of I and B: the general split must handle it, exactly
    n = 7
    E = np.random.default_rng(5).standard_normal((n, n))
    terms = [Kronecker([wl.Prefix(n), Identity(3)]), Kronecker([Explicit(np.sqrt(2.0) * wl.Prefix(n).dense() + 1e-7 * E), wl.Total(3)])]
    ref = np.vstack([np.kron(t.factors[0].dense(), t.factors[1].dense()) for t in terms])
    grams = [t.factors[0].gram() for t in terms]
    assert hdmm_bound._shared_base_split([G.dense() for G in grams], grams) is None
    check_exact(Pair(wl.union(terms), ref), ZCDP(1.0))


@SETTINGS
@given(domain_shapes().flatmap(workloads_on))
def test_blocks_too_large_to_probe_give_a_valid_lower_bound(W):
    privacy = ZCDP(1.0)
    truth = dense_svd_bound(W.ref, privacy)
    limit = hdmm_bound.SLQ_MAX_N
    hdmm_bound.SLQ_MAX_N = 0
    try:
        b = svd_bound(W.mat, privacy, exact_limit=1, seed=0)
    finally:
        hdmm_bound.SLQ_MAX_N = limit
    if b.exact:
        assert b.value == pytest.approx(truth, rel=1e-7, abs=1e-10)
    else:
        assert b.stderr == 0 and "lower bound" in b.method and "weaker lower bound" in repr(b)
        assert b.value <= truth * (1 + 1e-9) + 1e-12


@SETTINGS
@given(domain_shapes().flatmap(workloads_on), st.integers(0, 2**16))
def test_slq_fallback_on_random_unions(W, seed):
    privacy = ZCDP(1.0)
    truth = dense_svd_bound(W.ref, privacy)
    b = svd_bound(W.mat, privacy, exact_limit=1, seed=seed, probes=40)
    if b.exact:
        assert b.value == pytest.approx(truth, rel=1e-7, abs=1e-10)
    else:
        assert b.stderr > 0
        # 4.5 standard errors: a miss has probability well below 1e-4 per example
        assert abs(b.value - truth) <= 4.5 * b.stderr + 1e-9 * truth, (b, truth)


# ====================================================================== it is a lower bound
@SETTINGS
@given(domain_shapes().flatmap(lambda s: st.tuples(workloads_on(s), strategies_on(s))), privacies())
def test_no_strategy_beats_the_bound(case, privacy):
    W, A = case
    bound = dense_svd_bound(W.ref, privacy)
    err = expected_error(W.mat, A.mat, privacy)
    assert float(err) >= bound * (1 - 1e-7) - 1e-9
    assert float(svd_bound(W.mat, privacy)) <= float(err) * (1 + 1e-7) + 1e-9


@SETTINGS
@given(domain_shapes().flatmap(workloads_on), st.integers(0, 2**32 - 1), privacies(gaussian_only=True))
def test_random_kronecker_strategies_do_not_beat_the_bound(W, seed, privacy):
    rng = np.random.default_rng(seed)
    shape = kron_union(W.mat).sizes
    factors = [rng.standard_normal((n + 1, n)) for n in shape]
    A = Kronecker([Explicit(f) for f in factors]) if len(factors) > 1 else Explicit(factors[0])
    err = expected_error(W.mat, A, privacy)
    assert float(err) >= svd_bound(W.mat, privacy).value * (1 - 1e-7)
    # the identity strategy does not beat it either
    assert float(expected_error(W.mat, Identity(W.shape[1]), privacy)) >= svd_bound(W.mat, privacy).value * (1 - 1e-7)


def test_the_bound_is_attained_for_the_identity_workload():
    # W = I: the identity strategy is optimal and the bound is exactly its error
    for privacy in PRIVACIES:
        b = svd_bound(Identity(6), privacy)
        assert b.value == pytest.approx(float(expected_error(Identity(6), Identity(6), privacy)), rel=1e-12)


def test_float_of_a_bound_is_a_python_float():
    # float() must return an exact float: returning a numpy float64 from __float__ is deprecated
    # since Python 3.11 (DeprecationWarning now, TypeError later)
    unions = [
        wl.union([wl.Prefix(4), Identity(4)]),
        wl.union([Kronecker([Identity(2), wl.Prefix(3)]), Kronecker([wl.Total(2), wl.AllRange(3)])]),
    ]
    for W in [Identity(4), AllMarginals((2, 3), 1), _non_commuting_union().mat] + unions:
        b = svd_bound(W, ZCDP(1.0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            value = float(b)
        assert type(value) is float
        assert type(b.value) is float and type(b.stderr) is float


def test_bad_inputs():
    with pytest.raises(TypeError):
        svd_bound(np.eye(3), PureDP(1.0))
    for bad in (1.0, None, "zcdp"):
        with pytest.raises(TypeError, match="privacy"):
            svd_bound(Identity(3), bad)


def test_without_estimates_a_large_block_gives_a_certain_lower_bound():
    W = wl.union([Kronecker([wl.Prefix(12), wl.Prefix(10)]),
                    Kronecker([wl.Prefix(12), wl.Total(10)]),
                    Kronecker([wl.Total(12), wl.Prefix(10)])])
    privacy = ZCDP(0.5)
    exact = svd_bound(W, privacy)
    cheap = svd_bound(W, privacy, exact_limit=16, estimate=False)
    assert exact.exact and exact.certain and not exact.lower
    assert not cheap.exact and cheap.lower and cheap.certain and cheap.stderr == 0.0
    assert 0 < cheap.value <= exact.value * (1 + 1e-12)
    assert "weaker lower bound" in repr(cheap)
    estimated = svd_bound(W, privacy, exact_limit=16, seed=0)
    assert not estimated.certain


# ====================================================================== marginal-type unions (issue 25)
def _marginal_union(blocks, k_max, weights=None):
    """Every marginal on at most ``k_max`` attributes: a fresh ``blocks[i]()`` on the marginal's
    attributes (a new object per marginal, as workload builders make them), Total elsewhere;
    with its dense reference."""
    import itertools
    n = [b().shape[1] for b in blocks]
    parts, dense = [], []
    for k in range(k_max + 1):
        for subset in itertools.combinations(range(len(n)), k):
            factors = [blocks[i]() if i in subset else wl.Total(n[i]) for i in range(len(n))]
            parts.append(Kronecker(factors))
            ref = np.ones((1, 1))
            for f in factors:
                ref = np.kron(ref, f.dense())
            dense.append(ref)
    w = np.ones(len(parts)) if weights is None else np.asarray(weights(len(parts)))
    return wl.union(parts, list(w)), np.vstack([wj * d for wj, d in zip(w, dense)])


MIXES = {
    "prefix, prefix, identity": ([lambda: wl.Prefix(6), lambda: wl.Prefix(5), lambda: Identity(3)], 2),
    "prefix, identity x3": ([lambda: wl.Prefix(7), lambda: Identity(3), lambda: Identity(2), lambda: Identity(2)], 3),
    "range, prefix, identity": ([lambda: wl.AllRange(5), lambda: wl.Prefix(4), lambda: Identity(3)], 3),
    "range, identity, identity": ([lambda: wl.AllRange(6), lambda: Identity(4), lambda: Identity(3)], 2),
    "identity x3": ([lambda: Identity(4), lambda: Identity(3), lambda: Identity(3)], 2),
    "prefix x3, all ways": ([lambda: wl.Prefix(4), lambda: wl.Prefix(3), lambda: wl.Prefix(3)], 3),
}


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("weighted", [False, True])
def test_marginal_type_unions_exact_against_dense(mix, weighted):
    blocks, k_max = MIXES[mix]
    weights = (lambda m: 1.0 + np.arange(m) % 3) if weighted else None
    W, ref = _marginal_union(blocks, k_max, weights)
    for privacy in (ZCDP(0.5), PureDP(1.0)):
        b = svd_bound(W, privacy)
        assert b.exact, b
        assert b.value == pytest.approx(dense_svd_bound(ref, privacy), rel=1e-8)


@pytest.mark.parametrize("mix", sorted(MIXES))
def test_marginal_type_unions_cheap_bound_is_certain(mix):
    """``optimize``'s bound (no estimates, small exact blocks) is exact or below the dense bound; the
    research estimate is within a few standard errors of it."""
    blocks, k_max = MIXES[mix]
    W, ref = _marginal_union(blocks, k_max)
    privacy = ZCDP(0.5)
    want = dense_svd_bound(ref, privacy)
    cheap = svd_bound(W, privacy, exact_limit=8, estimate=False)
    assert cheap.certain and cheap.stderr == 0.0
    if cheap.exact:
        assert cheap.value == pytest.approx(want, rel=1e-8)
    else:
        assert 0 < cheap.value <= want * (1 + 1e-10)
    estimated = svd_bound(W, privacy, exact_limit=8, seed=1)
    if not estimated.exact:
        assert abs(estimated.value - want) <= 4 * estimated.stderr + 1e-9 * want


def test_equal_factors_and_terms_are_merged():
    """Equal Grams built as separate objects are kept once, repeated terms merge into one with the
    summed squared weight, and the bound is unchanged (docs/math.md, section 5.4)."""
    # explicit prefix matrices: a Prefix(5) equals every other one and the union keeps it once already
    W, ref = _marginal_union([lambda: Explicit(wl.Prefix(5).dense()), lambda: Identity(3), lambda: Identity(2)], 2)
    union = kron_union(W)
    assert len(union.factors[0]) > 2  # one explicit prefix object per marginal on attribute 0
    ops = [[f.gram() for f in fs] for fs in union.factors]
    grams = [[G.dense() for G in gs] for gs in ops]
    kept, _, index, w2 = hdmm_bound._distinct(grams, ops, union.index, union.weights**2)
    assert [len(g) for g in kept] == [2, 2, 2]  # the query matrix's Gram and the total's
    assert len(index) == union.num_terms and np.allclose(w2, 1.0)
    twice = VStack([W, W])
    b = svd_bound(twice, ZCDP(0.5))
    assert b.exact
    assert b.value == pytest.approx(dense_svd_bound(np.vstack([ref, ref]), ZCDP(0.5)), rel=1e-8)
    union2 = kron_union(twice)
    ops2 = [[f.gram() for f in fs] for fs in union2.factors]
    kept, _, index, w2 = hdmm_bound._distinct([[G.dense() for G in gs] for gs in ops2], ops2, union2.index,
                                              union2.weights**2)
    assert len(index) == union.num_terms and np.allclose(w2, 2.0)


def _circulant(n: int, width: int = 3) -> Explicit:
    """Cyclic windows of ``width`` cells: every cell in ``width`` queries, so the Gram fixes the ones vector."""
    M = np.zeros((n, n))
    for a in range(n):
        M[a, (a + np.arange(width)) % n] = 1.0
    return Explicit(M)


def _cyclic_differences(n: int) -> Explicit:
    """``x_a - x_{a+1}`` around the cycle: a Gram that maps the ones vector to zero (``g = 0``)."""
    M = np.eye(n) - np.roll(np.eye(n), 1, axis=1)
    return Explicit(M)


SUBSET_MIXES = {
    "differences, identity, circulant": ([lambda: _cyclic_differences(5), lambda: Identity(3),
                                          lambda: _circulant(4)], 2),
    "circulant x3": ([lambda: _circulant(6), lambda: _circulant(5, 2), lambda: _circulant(4)], 2),
    "circulant, identity, circulant": ([lambda: _circulant(7), lambda: Identity(3), lambda: _circulant(5, 4)], 3),
    "scaled": ([lambda: 2.0 * _circulant(5), lambda: Identity(4), lambda: 0.5 * Identity(3)], 2),
}


@pytest.mark.parametrize("mix", sorted(SUBSET_MIXES))
@pytest.mark.parametrize("weighted", [False, True])
def test_subset_route_exact_against_dense(mix, weighted):
    """Query Grams fixing the ones vector: the subset-basis closed form, exact at any size."""
    blocks, k_max = SUBSET_MIXES[mix]
    weights = (lambda m: np.where(np.arange(m) % 4 == 1, 0.0, 1.0 + np.arange(m) % 3)) if weighted else None
    W, ref = _marginal_union(blocks, k_max, weights)
    b = svd_bound(W, ZCDP(0.5), exact_limit=1, estimate=False)
    assert b.exact and b.method.startswith("subset basis"), b
    assert b.value == pytest.approx(dense_svd_bound(ref, ZCDP(0.5)), rel=1e-9)


def test_subset_route_on_identities_and_totals_matches_dense():
    W, ref = _marginal_union([lambda: Identity(4), lambda: Identity(3), lambda: Identity(2)], 2,
                             lambda m: 1.0 + np.arange(m))
    norm = hdmm_bound.nuclear_norm(kron_union(W))
    assert norm.method.startswith("subset basis") and norm.stderr == 0.0 and not norm.lower
    assert norm.value == pytest.approx(np.linalg.svd(ref, compute_uv=False).sum(), rel=1e-10)


def test_subset_route_declines_what_it_cannot_do():
    """Prefix Grams move the ones vector; two query matrices on one attribute do not share a block structure."""
    prefix, _ = _marginal_union([lambda: wl.Prefix(5), lambda: Identity(3)], 2)
    assert not hdmm_bound.nuclear_norm(kron_union(prefix)).method.startswith("subset basis")
    two = wl.union([Kronecker([_circulant(5), Identity(3)]), Kronecker([Identity(5), wl.Total(3)])])
    norm = hdmm_bound.nuclear_norm(kron_union(two))
    assert not norm.method.startswith("subset basis")
    assert norm.value == pytest.approx(np.linalg.svd(two.dense(), compute_uv=False).sum(), rel=1e-9)


def test_work_limit_bounds_the_blocks_left_from_below():
    W, ref = _marginal_union([lambda: wl.Prefix(5), lambda: wl.Prefix(4), lambda: Identity(3)], 2)
    privacy = ZCDP(0.5)
    want = dense_svd_bound(ref, privacy)
    full = svd_bound(W, privacy, estimate=False, seed=0)
    assert full.exact and full.value == pytest.approx(want, rel=1e-8)
    roomy = svd_bound(W, privacy, estimate=False, work_limit=1e12, seed=0)
    assert roomy.exact and roomy.value == full.value
    for limit in (0.0, 100.0):
        tight = svd_bound(W, privacy, estimate=False, work_limit=limit)
        assert tight.certain and not tight.exact and tight.lower
        assert 0 < tight.value <= want * (1 + 1e-10)
    # an estimate is never made once the work is spent, even when estimates are allowed
    assert svd_bound(W, privacy, work_limit=0.0).certain


def test_optimize_bound_is_certain_and_reproducible():
    """``optimize``'s bound on a prefix-marginal union: certain, at most the dense bound, the same every run."""
    from hdmm.optimizers import optimize

    W, ref = _marginal_union([lambda: wl.Prefix(6), lambda: wl.Prefix(5), lambda: Identity(3)], 2)
    privacy = ZCDP(0.5)
    first = optimize(W, privacy, seed=0, optimizers=["identity", "residual"])
    again = optimize(W, privacy, seed=0, optimizers=["identity", "residual"])
    assert first.bound.certain and first.bound.value == again.bound.value
    assert first.bound.value <= dense_svd_bound(ref, privacy) * (1 + 1e-8)  # exact: to the split's rounding
    assert first.error >= first.bound.value
