"""hdmm.traces: every registered implementation agrees with the dense default, and the inverse-Gram cache."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import hdmm
from hdmm.block_diagonal import BlockDiagonal
from hdmm.matrix import Explicit, Identity, Kronecker, Matrix, Ones
from hdmm.optimizers.pidentity import PIdentity
from hdmm.optimizers.root import SquareRootStrategy
from hdmm.traces import SUPPORT_TOL, compute_gram_inverse, factor_rows, factor_trace, gram_inverse
from hdmm.error import per_query_variance

N = 12


def _rank_deficient(rng: np.random.Generator, m: int, n: int, rank: int) -> Explicit:
    return Explicit(rng.random((m, rank)) @ rng.random((rank, n)))


def _strategies() -> dict[str, object]:
    rng = np.random.default_rng(7)
    return {
        "identity": Identity(N),
        "block of p-identity": BlockDiagonal(PIdentity(rng.random((2, 4))), 3),
        "block of explicit, tail": BlockDiagonal(Explicit(rng.random((6, 5))), 2, tail=2),
        "block of totals": BlockDiagonal(Ones(1, 4), 3),
        "block of rank 2, tail": BlockDiagonal(_rank_deficient(rng, 4, 5, 2), 2, tail=2),
        "p-identity L1": PIdentity(rng.random((3, N)), 1),
        "p-identity L2": PIdentity(rng.random((2, N)), 2),
        "square root": SquareRootStrategy.for_workload(hdmm.Prefix(N)),
        "square root, singular gram": SquareRootStrategy.for_workload(hdmm.WidthKRange(N, 4)),
        "kronecker of explicit": Kronecker([Explicit(rng.random((3, 3))), Explicit(rng.random((5, 4)))]),
        "kronecker, rank deficient": Kronecker([_rank_deficient(rng, 3, 3, 2), Explicit(rng.random((4, 4)))]),
        "explicit, rank deficient": _rank_deficient(rng, 8, N, 5),
    }


def _workloads() -> dict[str, object]:
    rng = np.random.default_rng(8)
    rows = rng.random((5, N))
    rows[2] = 0.0  # a zero query: supported by anything, flagged as zero
    return {
        "prefix": hdmm.Prefix(N),
        "width-3 ranges": hdmm.WidthKRange(N, 3),
        "all ranges": hdmm.AllRange(N),  # more than ROW_WALK queries per cell: the dense routes
        "total": hdmm.Total(N),
        "identity": Identity(N),
        "explicit with a zero row": Explicit(rows),
    }


STRATEGIES = _strategies()
WORKLOADS = _workloads()


def _dense_reference(A, f):
    """Trace, support and per-row values from numpy alone (docs/math.md, sections 1.3 and 1.4)."""
    Ad, F = A.dense(), f.dense()
    X = Ad.T @ Ad
    Xp = np.linalg.pinv(X, rcond=1e-10, hermitian=True)
    G = F.T @ F
    outside = np.einsum("ij,ij->i", F @ (np.eye(N) - Xp @ X), F)
    norms = np.einsum("ij,ij->i", F, F)
    total = np.trace(G)
    return (np.trace(Xp @ G), total - np.trace(G @ Xp @ X) <= SUPPORT_TOL * total,
            np.einsum("ij,ij->i", F @ Xp, F), outside > SUPPORT_TOL * norms, norms > 0)


@pytest.mark.parametrize("wname", list(WORKLOADS))
@pytest.mark.parametrize("aname", list(STRATEGIES))
def test_each_implementation_agrees_with_the_dense_default(aname, wname):
    A, f = STRATEGIES[aname], WORKLOADS[wname]
    default_trace = factor_trace.dispatch(Matrix)
    default_rows = factor_rows.dispatch(Matrix)
    dense = Explicit(A.dense())
    trace, supported = factor_trace(A, f)
    ref_trace, ref_supported = default_trace(dense, f)
    variances, unsupported, nonzero = factor_rows(A, f)
    ref_variances, ref_unsupported, ref_nonzero = default_rows(dense, f)

    assert supported == ref_supported
    np.testing.assert_array_equal(unsupported, ref_unsupported)
    np.testing.assert_array_equal(nonzero, ref_nonzero)
    assert supported == (not unsupported.any())
    assert trace == pytest.approx(ref_trace, rel=1e-8)
    np.testing.assert_allclose(variances, ref_variances, rtol=1e-8, atol=1e-12 * ref_variances.max())
    assert trace == pytest.approx(variances.sum(), rel=1e-8)

    # and the dense default agrees with numpy
    expected = _dense_reference(A, f)
    assert ref_trace == pytest.approx(expected[0], rel=1e-8)
    assert ref_supported == expected[1]
    np.testing.assert_allclose(ref_variances, expected[2], rtol=1e-8, atol=1e-12 * expected[2].max())
    for got, want in zip((ref_unsupported, ref_nonzero), expected[3:]):
        np.testing.assert_array_equal(got, want)


def test_the_cases_cover_supported_and_unsupported_factors():
    flags = {(a, w): factor_trace(A, f)[1] for a, A in STRATEGIES.items() for w, f in WORKLOADS.items()}
    for a in ("block of totals", "block of rank 2, tail", "kronecker, rank deficient", "explicit, rank deficient"):
        assert not flags[a, "prefix"] and not flags[a, "explicit with a zero row"]
    assert flags["block of totals", "total"]
    assert all(flags[a, w] for a in ("identity", "p-identity L1", "square root, singular gram") for w in WORKLOADS)


def test_registered_inverse_grams_match_the_pseudo_inverse():
    for name, A in STRATEGIES.items():
        Ad = A.dense()
        X = Ad.T @ Ad
        Xp, projector = compute_gram_inverse(A)
        np.testing.assert_allclose(Xp, np.linalg.pinv(X, rcond=1e-10, hermitian=True), rtol=1e-7,
                                   atol=1e-9 * np.abs(Xp).max(), err_msg=name)
        np.testing.assert_allclose(projector, Xp @ X, atol=1e-8, err_msg=name)


def test_the_inverse_gram_is_cached_per_factor_without_keeping_it_alive():
    A = PIdentity(np.random.default_rng(3).random((2, 6)))
    B = Explicit(np.random.default_rng(4).random((7, 6)))
    attributes = dict(vars(B))
    first = gram_inverse(B)
    assert gram_inverse(B) is first and gram_inverse(A) is gram_inverse(A)
    assert gram_inverse(Explicit(B.matrix)) is not first  # an equal matrix is another factor
    assert vars(B).keys() == attributes.keys()  # nothing stored on the matrix
    ref = weakref.ref(B)
    del B, first
    gc.collect()
    assert ref() is None


def test_width_mismatch_is_refused_by_every_implementation():
    for name, A in STRATEGIES.items():
        with pytest.raises(ValueError, match="cells"):
            factor_trace(A, hdmm.Prefix(N + 1))
        with pytest.raises(ValueError, match="cells"):
            factor_rows(A, hdmm.Prefix(N + 1))


def test_expected_error_of_a_kronecker_strategy_uses_the_factor_traces():
    rng = np.random.default_rng(5)
    factors = [PIdentity(rng.random((2, 4))), SquareRootStrategy.for_workload(hdmm.Prefix(3)),
               BlockDiagonal(Explicit(rng.random((3, 2))), 2, tail=1)]
    A = Kronecker(factors)
    W = Kronecker([hdmm.Prefix(4), hdmm.AllRange(3), hdmm.WidthKRange(5, 2)])
    privacy = hdmm.ZCDP(0.5)
    Ad, Wd = A.dense(), W.dense()
    Xp = np.linalg.pinv(Ad.T @ Ad)
    scale = privacy.noise_variance(A.sensitivity(2))
    assert float(hdmm.expected_error(W, A, privacy)) == pytest.approx(scale * np.trace(Wd @ Xp @ Wd.T), rel=1e-8)
    np.testing.assert_allclose(per_query_variance(W, A, privacy), scale * np.einsum("ij,ij->i", Wd @ Xp, Wd),
                               rtol=1e-8)


def test_structured_factors_register_their_own_implementations():
    default_trace, default_rows = factor_trace.dispatch(Matrix), factor_rows.dispatch(Matrix)
    for cls in (Identity, BlockDiagonal, PIdentity, SquareRootStrategy):
        assert factor_trace.dispatch(cls) is not default_trace
    for cls in (Identity, BlockDiagonal, SquareRootStrategy):
        assert factor_rows.dispatch(cls) is not default_rows
    for cls in (Identity, PIdentity, SquareRootStrategy):
        assert compute_gram_inverse.dispatch(cls) is not compute_gram_inverse.dispatch(Matrix)
