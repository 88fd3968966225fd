"""The closed-form spectra of range Grams and the square-root strategy, against dense numpy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hdmm
from hdmm.mechanism import reconstruction_method
from hdmm.block_diagonal import BlockDiagonal, fold
from hdmm.optimizers import PIdentity, SquareRootStrategy, kron, opt0
from hdmm.optimizers.root import inverse_gram_trace
from hdmm.spectral import DenseBasis, SineBasis, Spectrum, pinch
from hdmm.traces import factor_rows, factor_trace, gram_inverse
from hdmm.error import per_query_variance
from hdmm.io import load_strategy, save_strategy
from hdmm.matrix import Explicit, Ones
from hdmm.workload import Predicates

KINDS = {"allrange": hdmm.AllRange, "prefix": hdmm.Prefix}


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 40), kind=st.sampled_from(sorted(KINDS)), seed=st.integers(0, 2**31))
def test_sine_spectrum_is_the_gram_eigendecomposition(n, kind, seed):
    G = KINDS[kind](n).gram()
    s = G.spectrum()
    Q = s.basis.apply(np.eye(n))
    np.testing.assert_allclose(Q.T @ Q, np.eye(n), atol=1e-12)
    np.testing.assert_allclose((Q * s.values) @ Q.T, G.dense(), atol=1e-9 * n * n)
    np.testing.assert_allclose(s.basis.apply_transpose(np.eye(n)), Q.T, atol=1e-12)
    rng = np.random.default_rng(seed)
    f, u, w, mu = rng.random((4, n))
    np.testing.assert_allclose(s.basis.diag_of(f), np.diag((Q * f) @ Q.T), atol=1e-12)
    B = Q.T @ (u[:, None] * Q)
    np.testing.assert_allclose(s.basis.congruence_norm(u, w, mu), w @ (B * B) @ mu, rtol=1e-10)
    dense = DenseBasis(Q)
    np.testing.assert_allclose(dense.diag_of(f), np.diag((Q * f) @ Q.T), atol=1e-12)
    for basis in (s.basis, dense):
        for walk, expected in ((basis.rows(), Q.T), (basis.columns(), Q)):
            got = np.hstack([block for _, block in walk])
            np.testing.assert_allclose(got, expected, atol=1e-12)


def test_walks_cover_large_bases_in_bounded_blocks(monkeypatch):
    monkeypatch.setattr(hdmm.spectral, "BLOCK_ENTRIES", 100)
    s = hdmm.Prefix(30).gram().spectrum()
    walked = list(s.basis.columns())
    assert len(walked) == 10 and all(Q.shape == (30, 3) for _, Q in walked)  # 100 // 30 = 3 columns each
    np.testing.assert_allclose(np.hstack([Q for _, Q in walked]), s.basis.apply(np.eye(30)), atol=1e-12)
    for kind in ("prefix", "allrange"):  # the closed-form entries agree with the transforms on long domains
        basis, block = SineBasis(5001, kind), slice(4990, 5001)
        np.testing.assert_allclose(basis.entries(slice(None), block), basis.apply(np.eye(5001)[:, block]), atol=1e-12)
        np.testing.assert_allclose(basis.entries(block, slice(None)).T, basis.apply_transpose(np.eye(5001)[:, block]),
                                   atol=1e-12)


def test_spectra_combine_only_within_one_basis():
    n = 12
    P, R = hdmm.Prefix(n).gram(), hdmm.AllRange(n).gram()
    mixed = (2.0 * P + 3.0 * P).spectrum()
    np.testing.assert_allclose(mixed.values, 5.0 * P.spectrum().values)
    stacked = hdmm.union([hdmm.Prefix(n), hdmm.Identity(n)], weights=[1.0, 2.0]).gram()  # prefixes + 4 I
    s = stacked.spectrum()
    Q = s.basis.apply(np.eye(n))
    np.testing.assert_allclose((Q * s.values) @ Q.T, stacked.dense(), atol=1e-10)
    assert SquareRootStrategy.for_workload(hdmm.Prefix(n)).spectrum() is None  # a strategy is no Gram
    assert (P + R).spectrum() is None
    assert hdmm.WidthKRange(n, 3).gram().spectrum() is None
    with pytest.raises(ValueError, match="kind"):
        SineBasis(n, "suffix")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            SineBasis(bad, "prefix")


WORKLOADS = [hdmm.Prefix(33), hdmm.AllRange(20), hdmm.WidthKRange(30, 4), hdmm.Prefix(16)]


@pytest.mark.parametrize("W", WORKLOADS, ids=repr)
def test_square_root_strategy_matches_its_dense_definition(W):
    A = SquareRootStrategy.for_workload(W)
    V = W.gram().dense()
    e, Q = np.linalg.eigh(V)
    e = np.maximum(e, A.theta)
    root = (Q * np.sqrt(e)) @ Q.T
    scale = 1 / np.sqrt(np.diag(root))
    X = root * np.outer(scale, scale)
    Ad = A.dense()
    np.testing.assert_allclose(Ad.T @ Ad, X, atol=1e-10)
    assert A.sensitivity(2) == pytest.approx(1.0)
    assert A.sensitivity(1) == pytest.approx(np.abs(Ad).sum(axis=0).max())
    np.testing.assert_allclose(A.pinv().dense(), np.linalg.inv(Ad), atol=1e-8 * np.abs(np.linalg.inv(Ad)).max())
    np.testing.assert_allclose(A.pinv().T.dense(), np.linalg.inv(Ad).T, atol=1e-8 * np.abs(np.linalg.inv(Ad)).max())
    trace, supported = factor_trace(A, W)
    assert supported
    assert trace == pytest.approx(np.trace(np.linalg.solve(X, V)), rel=1e-9)
    privacy = hdmm.ZCDP(0.5)
    err = hdmm.expected_error(W, A, privacy)
    assert float(err) == pytest.approx(np.trace(np.linalg.solve(X, V)) * privacy.noise_scale(1.0) ** 2, rel=1e-8)
    bound = (np.sqrt(np.linalg.eigvalsh(V).clip(0)).sum()) ** 2 / V.shape[0]
    assert trace >= bound * (1 - 1e-9)
    np.testing.assert_allclose(gram_inverse(A)[0], np.linalg.inv(X), rtol=1e-8, atol=1e-10)


def test_square_root_strategy_rejects_a_bad_spectrum_or_floor():
    basis = DenseBasis(np.eye(3))
    for values in ([1.0, np.nan, 1.0], [0.0, 0.0, 0.0], [1.0, -1.0, 2.0], [1.0, 2.0]):
        with pytest.raises(ValueError):
            SquareRootStrategy(Spectrum(basis, np.array(values)))
    for theta in (-1.0, np.inf, 0.0):
        with pytest.raises(ValueError, match="theta"):
            SquareRootStrategy(Spectrum(basis, np.array([0.0, 1.0, 2.0])), theta)


def test_the_floor_of_a_singular_gram_is_tuned_to_the_workload():
    W = hdmm.WidthKRange(64, 8)  # Gram of rank 57
    G = W.gram()
    spectrum = Spectrum.of_dense(G.dense())
    tuned = SquareRootStrategy.for_gram(G)
    assert tuned.theta > 0
    optimum = hdmm.optimizers.convex.solve_convex(G.dense()).original_objective
    assert factor_trace(tuned, W)[0] < 1.01 * optimum
    mean = spectrum.values.clip(0).mean()
    for floor in (1e-8, 1e-6, 1e-2, 1e-1):  # the convex solver's 1e-8 costs a factor 3 here
        fixed = SquareRootStrategy(spectrum, floor * mean)
        assert factor_trace(tuned, W)[0] <= factor_trace(fixed, W)[0]


@pytest.mark.parametrize("make", [hdmm.Prefix, hdmm.AllRange])
def test_gaussian_opt0_beyond_the_convex_program_is_near_the_bound_on_large_ranges(make):
    W = make(4096)
    A = opt0(W, hdmm.ZCDP(1))
    assert isinstance(A, SquareRootStrategy) and isinstance(A.basis, SineBasis)
    bound = hdmm.svd_bound(W, hdmm.ZCDP(0.5))
    err = hdmm.expected_error(W, A, hdmm.ZCDP(0.5))
    assert 1.0 <= np.sqrt(float(err) / float(bound)) < 1.02


def test_gaussian_factor_uses_a_dense_eigensolver_between_the_limits(monkeypatch):
    monkeypatch.setattr(kron, "CONVEX_MAX_N", 16)
    W = hdmm.WidthKRange(64, 8)
    A = opt0(W, hdmm.ZCDP(1))
    assert isinstance(A, SquareRootStrategy) and isinstance(A.basis, DenseBasis)
    convex = hdmm.optimizers.convex.solve_convex(W.gram().dense())
    ratio = hdmm.expected_error(W, A, hdmm.ZCDP(1)) / hdmm.expected_error(W, convex.strategy, hdmm.ZCDP(1))
    assert 1.0 - 1e-9 <= ratio < 1.05
    monkeypatch.setattr(kron, "ROOT_DENSE_MAX_N", 32)
    beyond = opt0(W, hdmm.ZCDP(1))  # the Gram's pinching in a sine basis stands in for it
    assert isinstance(beyond, SquareRootStrategy) and isinstance(beyond.basis, SineBasis)
    ratio = hdmm.expected_error(W, beyond, hdmm.ZCDP(1)) / hdmm.expected_error(W, convex.strategy, hdmm.ZCDP(1))
    assert 1.0 - 1e-9 <= ratio < 1.05


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 30), kind=st.sampled_from(sorted(KINDS)), seed=st.integers(0, 2**31))
def test_pinching_against_dense(n, kind, seed):
    Q = SineBasis(n, kind).apply(np.eye(n))
    F = np.random.default_rng(seed).standard_normal((n + 2, n))
    G = F.T @ F
    spectrum, kept = pinch(SineBasis(n, kind), Explicit(G))
    d = np.diag(Q.T @ G @ Q)
    np.testing.assert_allclose(spectrum.values, d, atol=1e-10 * np.abs(G).max())
    assert kept == pytest.approx((d @ d) / np.sum(G * G), rel=1e-10)
    # a basis that diagonalises the Gram keeps all of it
    exact, kept = pinch(SineBasis(n, kind), KINDS[kind](n).gram())
    assert kept == pytest.approx(1.0, rel=1e-10)
    np.testing.assert_allclose(exact.values, KINDS[kind](n).gram().spectrum().values, rtol=1e-9)


UNIONS = {
    "prefix + ranges": lambda n: hdmm.union([hdmm.Prefix(n), hdmm.AllRange(n)]),
    "prefix + width-8": lambda n: hdmm.union([hdmm.Prefix(n), hdmm.WidthKRange(n, 8)]),
    "identity + total": lambda n: hdmm.union([hdmm.Identity(n), hdmm.Total(n)]),
    "ranges + shuffled prefix": lambda n: hdmm.union(
        [hdmm.AllRange(n), Explicit(np.tril(np.ones((n, n)))[:, np.random.default_rng(0).permutation(n)])]),
}


@pytest.mark.parametrize("name", sorted(UNIONS))
def test_gaussian_factor_in_a_sine_basis_beyond_the_dense_limit(name, monkeypatch):
    # a Gram with no closed-form spectrum beyond ROOT_DENSE_MAX_N: the square-root strategy of
    # its pinching in a sine basis, next to p-Identity; the better one by exact error is kept
    monkeypatch.setattr(kron, "CONVEX_MAX_N", 16)
    monkeypatch.setattr(kron, "ROOT_DENSE_MAX_N", 32)
    n = 96
    W = UNIONS[name](n)
    G = W.gram()
    assert G.spectrum() is None and kron.factor_method(G, hdmm.ZCDP(1)) == "sine basis"
    root = SquareRootStrategy.in_sine_basis(G)
    found = kron.factor_candidates(G, hdmm.ZCDP(1), None, 1, np.random.default_rng(0))
    assert [type(A) for A in found] == [SquareRootStrategy, PIdentity]
    A = opt0(W, hdmm.ZCDP(1), seed=0)
    privacy = hdmm.ZCDP(1)
    # the reported errors are the dense ones, and the best candidate is kept
    Ad, Wd = A.dense(), W.dense()
    dense = privacy.noise_variance(1.0) * np.max(np.sum(Ad * Ad, axis=0)) * np.trace(Wd @ np.linalg.pinv(Ad.T @ Ad) @ Wd.T)
    assert float(hdmm.expected_error(W, A, privacy)) == pytest.approx(dense, rel=1e-8)
    assert privacy.noise_variance(1.0) * inverse_gram_trace(root, G) == pytest.approx(
        float(hdmm.expected_error(W, root, privacy)), rel=1e-8)
    errors = [float(hdmm.expected_error(W, B, privacy)) for B in found]
    assert float(hdmm.expected_error(W, A, privacy)) <= min(errors) * (1 + 1e-12)
    optimum = float(hdmm.expected_error(W, hdmm.optimizers.convex.solve_convex(G.dense()).strategy, privacy))
    ratio = float(hdmm.expected_error(W, A, privacy)) / optimum
    assert 1 - 1e-9 <= ratio < (1.03 if name.startswith("prefix") else 1.2)


def test_square_root_strategy_reconstructs_exactly_and_round_trips(tmp_path):
    n = 8192
    W = hdmm.Prefix(n)
    A = SquareRootStrategy.for_workload(W)
    assert reconstruction_method(A) == "kronecker"
    x = np.random.default_rng(1).integers(0, 50, n).astype(float)
    np.testing.assert_allclose(A.pinv() @ (A @ x), x, atol=1e-8)
    for strategy in (A, SquareRootStrategy.for_workload(hdmm.WidthKRange(40, 5))):
        path = tmp_path / "root.npz"
        save_strategy(strategy, path)
        loaded, _ = load_strategy(path)
        v = np.random.default_rng(2).random(strategy.shape[1])
        np.testing.assert_array_equal(loaded @ v, strategy @ v)


# ---------------------------------------------------------------------- block-diagonal strategies
@pytest.mark.parametrize("tail", [0, 3])
@pytest.mark.parametrize("block", [PIdentity(np.random.default_rng(0).random((3, 8))), hdmm.Prefix(8),
                                   Ones(1, 8)], ids=repr)
def test_block_diagonal_matches_its_dense_kronecker_form(block, tail):
    import scipy.linalg

    A = BlockDiagonal(block, 4, tail)
    dense = scipy.linalg.block_diag(np.kron(np.eye(4), block.dense()), np.eye(tail))
    np.testing.assert_allclose(A.dense(), dense, atol=1e-12)
    np.testing.assert_allclose(A.T.dense(), dense.T, atol=1e-12)
    np.testing.assert_allclose(A.pinv().dense(), np.linalg.pinv(dense), atol=1e-10)
    for p in (1, 2):
        assert A.sensitivity(p) == pytest.approx(np.linalg.norm(dense, ord=p, axis=0).max())
    n = 32 + tail
    for W in (hdmm.WidthKRange(n, 5), hdmm.AllRange(n), hdmm.Identity(n)):
        trace, supported = factor_trace(A, W)
        X = dense.T @ dense
        V = W.gram().dense()
        Xp = np.linalg.pinv(X)
        assert supported == bool(np.allclose(V @ Xp @ X, V, atol=1e-8 * np.abs(V).max()))
        if supported:
            assert trace == pytest.approx(np.trace(Xp @ V), rel=1e-9)


def test_fold_sums_the_diagonal_blocks():
    for G in (hdmm.Prefix(24).gram(), hdmm.WidthKRange(24, 3).gram()):
        F = fold(G, 6)
        D = G.dense()
        np.testing.assert_allclose(F.dense(), sum(D[b:b + 6, b:b + 6] for b in range(0, 24, 6)), atol=1e-12)
    assert fold(hdmm.WidthKRange(240, 3).gram(), 60).is_sparse
    D = hdmm.Prefix(10).gram().dense()
    np.testing.assert_allclose(fold(hdmm.Prefix(10).gram(), 4).dense(), D[:4, :4] + D[4:8, 4:8])  # cells 8, 9 left out
    with pytest.raises(ValueError, match="one block"):
        fold(hdmm.Prefix(3).gram(), 4)


@pytest.mark.slow  # skip locally with -m "not slow"; CI runs it
def test_large_local_workloads_get_a_block_diagonal_candidate(monkeypatch, tmp_path):
    monkeypatch.setattr(kron, "TILE_BLOCK_N", 128)
    W = hdmm.WidthKRange(512, 3)
    G = W.gram()
    rng = np.random.default_rng(0)
    for norm, privacy in ((1, hdmm.PureDP(1)), (2, hdmm.ZCDP(1))):
        candidates = kron.factor_candidates(G, privacy, None, 1, rng)
        A = candidates[-1]
        # under Laplace noise the blocks replace a whole-domain p-Identity; the convex optimum stays
        assert len(candidates) == norm and isinstance(A, BlockDiagonal) and A.copies == 4
        assert A.sensitivity(norm) == pytest.approx(1.0)
        dense = A.dense()
        exact = np.trace(np.linalg.solve(dense.T @ dense, G.dense())) * A.sensitivity(norm) ** 2
        assert float(hdmm.expected_error(W, A, privacy)) == pytest.approx(
            exact * privacy.noise_scale(1.0) ** 2 * (2 if norm == 1 else 1), rel=1e-8)
        best = opt0(W, privacy, seed=0)
        assert hdmm.expected_error(W, best, privacy) <= hdmm.expected_error(W, A, privacy) * (1 + 1e-9)
        path = tmp_path / f"{norm}.npz"
        save_strategy(A, path)
        loaded, _ = load_strategy(path)
        np.testing.assert_allclose(loaded.dense(), dense)
    # a global workload folds densely: no block-diagonal candidate
    assert len(kron.factor_candidates(hdmm.Prefix(512).gram(), hdmm.PureDP(1), None, 1, rng)) == 1


@pytest.mark.parametrize("W", [hdmm.Prefix(40), hdmm.WidthKRange(40, 6), hdmm.AllRange(12)], ids=repr)
def test_square_root_per_query_variances_match_dense(W):
    A = SquareRootStrategy.for_workload(W)
    dense = A.dense()
    Wd = W.dense()
    expected = np.einsum("ij,ij->i", Wd @ np.linalg.inv(dense.T @ dense), Wd)
    variances, unsupported, nonzero = factor_rows(A, W)
    np.testing.assert_allclose(variances, expected, rtol=1e-9)
    assert not unsupported.any() and nonzero.all()
    np.testing.assert_allclose(per_query_variance(W, A, hdmm.ZCDP(1)), expected * hdmm.ZCDP(1).noise_scale(1.0) ** 2,
                               rtol=1e-8)


def test_block_diagonal_labels_name_the_real_cells():
    A = BlockDiagonal(hdmm.Identity(2), 2, tail=1)
    assert [A.describe(i, "x", ["a", "b", "c", "d", "e"]) for i in range(5)] == ["x=a", "x=b", "x=c", "x=d", "x=e"]
    P = BlockDiagonal(hdmm.Prefix(3), 2)
    dense = P.dense()
    for row in range(6):
        cells = np.flatnonzero(dense[row])
        label = P.describe(row, "x")
        assert label.startswith("x") and str(cells.min()) in label


@pytest.mark.parametrize("block", [PIdentity(np.random.default_rng(1).random((2, 6))),
                                   SquareRootStrategy.for_workload(hdmm.Prefix(6)), Ones(1, 6)], ids=repr)
def test_block_diagonal_per_query_variances_match_dense(block, monkeypatch):
    monkeypatch.setattr(hdmm.spectral, "BLOCK_ENTRIES", 50)  # several blocks of queries
    A = BlockDiagonal(block, 3, tail=2)
    W = hdmm.WidthKRange(20, 4)
    dense = A.dense()
    X = dense.T @ dense
    Xp = np.linalg.pinv(X)
    Wd = W.dense()
    variances, unsupported, nonzero = factor_rows(A, W)
    supported = np.linalg.norm(Wd - Wd @ Xp @ X, axis=1) < 1e-8 * np.linalg.norm(Wd, axis=1)
    np.testing.assert_array_equal(unsupported, ~supported)
    np.testing.assert_allclose(variances[supported], np.einsum("ij,ij->i", Wd @ Xp, Wd)[supported], rtol=1e-9)
    assert nonzero.all()
    with pytest.raises(ValueError, match="cells"):
        factor_trace(A, hdmm.Prefix(12))
    with pytest.raises(ValueError, match="tail"):
        BlockDiagonal(block, 3, tail=-1)


def test_the_bound_of_a_short_wide_factor_uses_its_row_gram():
    import tracemalloc

    f = Predicates(np.ones((1, 4000)))
    tracemalloc.start()
    value = hdmm.bound.factor_nuclear_norm(f)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert value == pytest.approx(np.sqrt(4000)) and peak < 4000 * 4000  # never the 4000 x 4000 Gram
    band = hdmm.WidthKRange(300, 7)
    assert hdmm.bound.factor_nuclear_norm(band) == pytest.approx(np.linalg.svd(band.dense(), compute_uv=False).sum())


def test_block_diagonal_variances_of_many_queries_go_through_the_dense_route():
    A = BlockDiagonal(SquareRootStrategy.for_workload(hdmm.AllRange(5)), 3, tail=1)
    W = hdmm.AllRange(16)  # 136 queries > 4 per cell
    dense = A.dense()
    expected = np.einsum("ij,ij->i", W.dense() @ np.linalg.inv(dense.T @ dense), W.dense())
    variances, unsupported, nonzero = factor_rows(A, W)
    np.testing.assert_allclose(variances, expected, rtol=1e-9)
    assert not unsupported.any() and nonzero.all()


def test_a_domain_without_a_good_divisor_gets_blocks_and_a_tail(monkeypatch, tmp_path):
    monkeypatch.setattr(kron, "TILE_BLOCK_N", 128)
    assert kron._tiling(509) == (127, 4, 1)  # 509 is prime
    W = hdmm.WidthKRange(509, 3)
    (A,) = kron.factor_candidates(W.gram(), hdmm.PureDP(1), None, 1, np.random.default_rng(0))
    assert isinstance(A, BlockDiagonal) and (A.copies, A.tail) == (4, 1)
    dense = A.dense()
    exact = np.trace(np.linalg.solve(dense.T @ dense, W.gram().dense())) * A.sensitivity(1) ** 2
    assert float(hdmm.expected_error(W, A, hdmm.PureDP(1))) == pytest.approx(2 * exact, rel=1e-8)
    save_strategy(A, tmp_path / "tail.npz")
    loaded, _ = load_strategy(tmp_path / "tail.npz")
    np.testing.assert_allclose(loaded.dense(), dense)
    x = np.random.default_rng(3).random(509)
    np.testing.assert_allclose(A.pinv() @ (A @ x), x, atol=1e-8)
