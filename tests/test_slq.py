"""Tests for :mod:`hdmm.slq` (stochastic Lanczos quadrature)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from scipy.linalg import eigh_tridiagonal, hadamard, solve_banded

import hdmm.slq as slq
from hdmm.slq import SLQEstimate, trace_function, trace_sqrt


def _psd(eigenvalues: np.ndarray, seed: int) -> np.ndarray:
    """Return ``U diag(eigenvalues) U^T`` for a random orthogonal ``U``."""
    n = eigenvalues.size
    u, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return (u * eigenvalues) @ u.T


def _exact_trace(m: np.ndarray, f: Callable[[np.ndarray], np.ndarray] = np.sqrt) -> float:
    """Exact tr f(M) from a dense eigendecomposition."""
    return float(np.sum(f(np.clip(np.linalg.eigvalsh(m), 0.0, None))))


class _Recorder:
    """Dense block matvec that records the shape of every call and the first block."""

    def __init__(self, m: np.ndarray) -> None:
        self.m = m
        self.widths: list[int] = []
        self.first: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        assert x.shape[0] == self.m.shape[0]
        if self.first is None:
            self.first = x.copy()
        self.widths.append(x.shape[1])
        return self.m @ x


def _spread(n: int) -> np.ndarray:
    return _psd(np.logspace(-3, 2, n), seed=n)


def _low_rank(n: int, rank: int) -> np.ndarray:
    w = np.random.default_rng(rank).standard_normal((rank, n))  # fewer rows than columns
    return w.T @ w


@pytest.mark.parametrize(
    "m",
    [_spread(300), _spread(500), _low_rank(400, 120), _low_rank(250, 80)],
    ids=["spread300", "spread500", "lowrank400", "lowrank250"],
)
def test_accuracy_sqrt(m: np.ndarray) -> None:
    n = m.shape[0]
    exact = _exact_trace(m)
    rec = _Recorder(m)
    est = trace_function(rec, n, rng=0)
    assert isinstance(est, SLQEstimate)
    assert (est.probes, est.steps) == (30, 60)
    assert float(est) == est.value
    assert est.value == pytest.approx((est.lower + est.upper) / 2, rel=1e-12)
    # Total error: Hutchinson noise, which the stderr must cover, plus quadrature error.
    assert abs(est.value - exact) <= 4 * est.stderr + (est.upper - est.lower) / 2
    assert abs(est.value - exact) <= 0.05 * exact
    assert est.stderr <= 0.04 * exact
    # Quadrature error alone: the same probes' exact mean v^T M^(1/2) v is inside the mean
    # bracket, so the midpoint is off by at most half its width. (The dense reference is
    # only good to ~1e-8 here: on a null space, eigenvalues of size u * ||M|| become
    # square roots of size sqrt(u * ||M||).)
    v = rec.first * np.sqrt(n)
    evals, u = np.linalg.eigh(m)
    sqrt_m = (u * np.sqrt(np.clip(evals, 0, None))) @ u.T
    hutchinson = np.einsum("ni,nm,mi->i", v, sqrt_m, v).mean()
    assert est.lower <= hutchinson * (1 + 1e-7) and hutchinson <= est.upper * (1 + 1e-7)
    assert est.upper - est.lower <= 0.03 * hutchinson


def test_low_rank_uses_one_block_per_step() -> None:
    m = _low_rank(400, 120)
    rec = _Recorder(m)
    trace_function(rec, 400, probes=12, steps=40, rng=1)
    assert rec.widths == [12] * 40


def test_small_n_exact_per_probe() -> None:
    """With n <= steps every probe's quadrature equals v^T f(M) v exactly."""
    n = 40
    m = _spread(n)
    rec = _Recorder(m)
    est = trace_function(rec, n, probes=8, steps=60, rng=3)
    assert est.steps == n
    v = rec.first * np.sqrt(n)  # first block holds the normalised probes v / ||v||
    np.testing.assert_allclose(np.abs(v), 1.0, atol=1e-12)
    evals, u = np.linalg.eigh(m)
    sqrt_m = (u * np.sqrt(np.clip(evals, 0, None))) @ u.T
    per_probe = np.einsum("ni,nm,mi->i", v, sqrt_m, v)
    assert est.value == pytest.approx(per_probe.mean(), rel=1e-8)
    assert est.stderr == pytest.approx(per_probe.std(ddof=1) / np.sqrt(8), rel=1e-6)
    assert est.upper - est.lower <= 1e-8 * est.value  # breakdown: Radau = Gauss = exact


def test_diagonal_is_exact() -> None:
    """For diagonal M, v^T f(M) v = tr f(M) for every Rademacher v."""
    d = np.linspace(0.0, 5.0, 50)
    est = trace_function(lambda x: d[:, None] * x, 50, probes=5, steps=60, rng=7)
    assert est.value == pytest.approx(np.sqrt(d).sum(), rel=1e-8)
    assert est.stderr < 1e-8
    assert est.upper - est.lower <= 1e-8 * est.value


def test_breakdown_few_distinct_eigenvalues() -> None:
    """Three distinct eigenvalues: every recurrence breaks down after <= 3 steps, exactly."""
    n = 300
    m = _psd(np.repeat([0.0, 1.0, 4.0], n // 3), seed=5)
    rec = _Recorder(m)
    est = trace_function(rec, n, f=lambda t: t**2, probes=6, steps=60, rng=2)
    assert len(rec.widths) <= 3
    v = rec.first * np.sqrt(n)
    per_probe = np.einsum("ni,nm,mi->i", v, m @ m, v)
    assert est.value == pytest.approx(per_probe.mean(), rel=1e-8)
    assert est.lower == pytest.approx(est.upper, rel=1e-8)


def test_breakdown_at_different_steps_within_a_block() -> None:
    """Eigenvectors = Hadamard rows: probes excite 1, 2, 4 or 8 eigenvectors, so they stop at
    different steps while sharing the block; each one must still be exact."""
    n = 8
    u = hadamard(n) / np.sqrt(n)
    m = (u * np.arange(1.0, n + 1)) @ u.T
    rec = _Recorder(m)
    est = trace_function(rec, n, probes=40, steps=n, rng=8)
    assert rec.widths[0] == 40 and len(set(rec.widths)) > 1
    assert rec.widths == sorted(rec.widths, reverse=True)
    v = rec.first * np.sqrt(n)
    sqrt_m = (u * np.sqrt(np.arange(1.0, n + 1))) @ u.T
    per_probe = np.einsum("ni,nm,mi->i", v, sqrt_m, v)
    assert est.value == pytest.approx(per_probe.mean(), rel=1e-10)
    assert est.stderr == pytest.approx(per_probe.std(ddof=1) / np.sqrt(40), rel=1e-6)


def test_zero_matrix() -> None:
    est = trace_function(lambda x: np.zeros_like(x), 30, probes=3, rng=0)
    assert est.value == 0.0 and est.stderr == 0.0
    assert est.lower == est.upper == 0.0


def test_identity_function_is_hutchinson() -> None:
    m = _spread(100)
    rec = _Recorder(m)
    est = trace_function(rec, 100, f=lambda t: t, probes=5, steps=3, rng=4)
    v = rec.first * 10.0
    assert est.value == pytest.approx(np.einsum("ni,nm,mi->i", v, m, v).mean(), rel=1e-10)


def test_reproducible_and_block_independent() -> None:
    m = _spread(150)
    matvec = lambda x: m @ x  # noqa: E731
    a = trace_function(matvec, 150, probes=6, steps=20, rng=11)
    b = trace_function(matvec, 150, probes=6, steps=20, rng=11)
    assert a == b
    widths: list[int] = []

    def single(x: np.ndarray) -> np.ndarray:
        widths.append(x.shape[1])
        return m @ x

    c = trace_function(single, 150, probes=6, steps=20, rng=11, block=False)
    assert set(widths) == {1} and len(widths) == 6 * 20
    assert c.value == pytest.approx(a.value, rel=1e-10)
    assert c.stderr == pytest.approx(a.stderr, rel=1e-6)
    assert trace_function(matvec, 150, probes=6, steps=20, rng=12).value != a.value


def test_chunking_under_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _spread(100)
    full = trace_function(lambda x: m @ x, 100, probes=7, steps=10, rng=5)
    monkeypatch.setattr(slq, "_BASIS_BYTES", 3 * 10 * 100 * 8)  # room for 3 probes
    rec = _Recorder(m)
    chunked = trace_function(rec, 100, probes=7, steps=10, rng=5)
    assert rec.widths == [3] * 10 + [3] * 10 + [1] * 10
    assert chunked.value == pytest.approx(full.value, rel=1e-10)


def test_one_dimensional_matvec_output_accepted() -> None:
    est = trace_function(lambda x: (4.0 * x).ravel(), 1, probes=2, rng=0, block=False)
    assert est.value == pytest.approx(2.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"n": 2.5},
        {"probes": 1},
        {"steps": 0},
        {"steps": True},
        {"node": float("nan")},
        {"node": "0"},
        {"node": True},
    ],
)
def test_bad_arguments(kwargs: dict) -> None:
    args = {"n": 10} | kwargs
    n = args.pop("n")
    with pytest.raises(ValueError):
        trace_function(lambda x: x, n, **args)


def test_wrong_matvec_shape() -> None:
    with pytest.raises(ValueError, match="matvec returned shape"):
        trace_function(lambda x: x[:-1], 10, probes=2)


# ---------------------------------------------------------------- Gauss-Radau / Gauss brackets
def _factored(n: int, spectrum: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``M = U diag(spectrum) U^T`` on a random ``spectrum.size``-dimensional subspace (the
    other eigenvalues are zero) and its square root, built without an eigensolver."""
    u, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, spectrum.size)))
    return (u * spectrum) @ u.T, (u * np.sqrt(spectrum)) @ u.T


def _wide_with_zeros() -> tuple[np.ndarray, np.ndarray]:
    return _factored(600, np.logspace(-4, 3, 350), seed=1)  # 250 zero eigenvalues


def _gaussian_gram() -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(2).standard_normal((100, 500))  # rank 100: fast convergence
    _, sv, vt = np.linalg.svd(g, full_matrices=False)
    return g.T @ g, (vt.T * sv) @ vt


def _prefix_gram() -> tuple[np.ndarray, np.ndarray]:
    p = np.tril(np.ones((300, 300)))  # prefix sums on 300 of 500 columns
    _, sv, vt = np.linalg.svd(p)
    m, root = np.zeros((500, 500)), np.zeros((500, 500))
    m[:300, :300], root[:300, :300] = p.T @ p, (vt.T * sv) @ vt
    return m, root


def _rademacher(probes: int, n: int, seed: int) -> np.ndarray:
    return 2.0 * np.random.default_rng(seed).integers(0, 2, size=(probes, n)) - 1.0


@pytest.mark.parametrize(
    "case", [_wide_with_zeros, _gaussian_gram, _prefix_gram], ids=lambda c: c.__name__[1:]
)
def test_every_probe_is_bracketed(case: Callable[[], tuple[np.ndarray, np.ndarray]]) -> None:
    """Radau <= v^T M^(1/2) v <= Gauss for each probe at each step count, and the bracket
    narrows as the step count grows (up to rounding once it has converged)."""
    m, root = case()
    n = m.shape[0]
    v = _rademacher(6, n, seed=n)
    exact = np.einsum("in,nm,im->i", v, root, v) / n  # for the unit vectors v / sqrt(n)
    checkpoints = [5, 10, 20, 40, 80, 160]
    widths = []
    for prefixes in slq._lanczos(lambda x: m @ x, v / np.sqrt(n), checkpoints):
        radau, gauss = np.array([slq._quadrature_bracket(*p, np.sqrt, 0.0) for p in prefixes]).T
        assert np.all(radau <= exact * (1 + 1e-9))
        assert np.all(exact <= gauss * (1 + 1e-9))
        widths.append(gauss - radau)
    widths = np.array(widths)
    assert np.all(widths[0] > 1e-2 * exact)
    assert np.all(np.diff(widths, axis=0) <= 1e-5 * exact)
    assert np.all(widths[-1] <= 1e-2 * widths[0])


def test_radau_matches_the_extended_tridiagonal() -> None:
    """Away from singularity the rule is the textbook one: phi from a banded solve of
    (T_m - aI) delta = beta_{m+1}^2 e_m, nodes and weights from the extended tridiagonal."""
    m = _spread(300)
    (prefixes,) = slq._lanczos(lambda x: m @ x, _rademacher(3, 300, seed=6) / np.sqrt(300), [12])
    for alpha, beta, beta_next in prefixes:
        theta, s = eigh_tridiagonal(alpha, beta)
        for node in (0.0, 5e-4):  # both below lambda_min = 1e-3
            banded = np.zeros((3, alpha.size))
            banded[0, 1:], banded[1], banded[2, :-1] = beta, alpha - node, beta
            rhs = np.zeros(alpha.size)
            rhs[-1] = beta_next**2
            phi = node + solve_banded((1, 1), banded, rhs)[-1]
            nodes, vectors = eigh_tridiagonal(np.append(alpha, phi), np.append(beta, beta_next))
            nearest = np.argmin(np.abs(nodes - node))
            assert abs(nodes[nearest] - node) <= 1e-10 * nodes.max()  # a is a node ...
            nodes[nearest] = node  # ... up to rounding, which sqrt would amplify at 0
            radau, gauss = slq._quadrature_bracket(alpha, beta, beta_next, np.sqrt, node)
            assert radau == pytest.approx(vectors[0] ** 2 @ np.sqrt(nodes), rel=1e-10)
            assert gauss == pytest.approx(s[0] ** 2 @ np.sqrt(theta), rel=1e-12)
            assert radau < gauss


def test_radau_is_exact_for_degree_2m() -> None:
    """m steps: the (m+1)-node Radau rule integrates t^(2m) exactly, the m-node Gauss rule not."""
    m = _spread(200)
    v = _rademacher(4, 200, seed=9)
    (prefixes,) = slq._lanczos(lambda x: m @ x, v / np.sqrt(200), [2])
    exact = np.einsum("in,nm,im->i", v, np.linalg.matrix_power(m, 4), v) / 200
    for (alpha, beta, beta_next), want in zip(prefixes, exact):
        radau, gauss = slq._quadrature_bracket(alpha, beta, beta_next, lambda t: t**4, 0.0)
        assert radau == pytest.approx(want, rel=1e-9)
        assert abs(gauss - want) > 1e-3 * want


def test_node_none_gives_the_gauss_mean() -> None:
    m = _spread(300)
    gauss_only = trace_function(lambda x: m @ x, 300, probes=6, steps=15, rng=1, node=None)
    bracketed = trace_function(lambda x: m @ x, 300, probes=6, steps=15, rng=1)
    assert gauss_only.lower == gauss_only.value == gauss_only.upper
    assert gauss_only.value == pytest.approx(bracketed.upper, rel=1e-12)
    assert bracketed.lower < bracketed.value < bracketed.upper


def test_stderr_is_that_of_the_midpoints() -> None:
    m, _ = _wide_with_zeros()
    lower, upper, steps = slq._probe_brackets(lambda x: m @ x, 600, np.sqrt, 7, [20], 0.0, 0.0, 4, True)
    est = trace_function(lambda x: m @ x, 600, probes=7, steps=20, rng=4)
    mid = (lower + upper) / 2
    assert steps == 20
    assert (est.lower, est.upper) == pytest.approx((lower.mean(), upper.mean()), rel=1e-12)
    assert est.stderr == pytest.approx(mid.std(ddof=1) / np.sqrt(7), rel=1e-10)
    assert np.all(lower < upper)


# ---------------------------------------------------------------- trace_sqrt
def _slow() -> tuple[np.ndarray, np.ndarray]:
    """60 steps leave a ~2.3% bracket, 120 steps ~0.6%."""
    return _factored(800, np.logspace(-6, 3, 500), seed=4)


@pytest.mark.slow  # skip locally with -m "not slow"; CI runs it
def test_trace_sqrt_stops_at_the_first_adequate_level() -> None:
    m, root = _slow()
    rec = _Recorder(m)
    est = trace_sqrt(rec, 800, probes=8, rel_gap=0.01, rng=3)
    assert est.steps == 120 and est.probes == 8
    assert est.upper - est.lower <= 0.01 * est.value
    assert rec.widths == [8] * 120  # one recurrence, stopped as soon as 120 passed
    # The same probes and step count through trace_function give the same estimate ...
    same = trace_function(lambda x: m @ x, 800, probes=8, steps=120, rng=3)
    assert (same.lower, same.value, same.upper, same.stderr) == pytest.approx(
        (est.lower, est.value, est.upper, est.stderr), rel=1e-10
    )
    # ... and 60 steps would not have met the criterion.
    coarse = trace_function(lambda x: m @ x, 800, probes=8, steps=60, rng=3)
    assert coarse.upper - coarse.lower > 0.01 * coarse.value
    v = rec.first * np.sqrt(800)
    hutchinson = np.einsum("ni,nm,mi->i", v, root, v).mean()
    assert est.lower <= hutchinson <= est.upper


@pytest.mark.slow  # skip locally with -m "not slow"; CI runs it
def test_trace_sqrt_gives_up_at_max_steps() -> None:
    m, _ = _slow()
    rec = _Recorder(m)
    est = trace_sqrt(rec, 800, probes=4, rel_gap=1e-9, max_steps=100, rng=0)
    assert est.steps == 100
    assert rec.widths == [4] * 100  # checks after 60 and 100 steps, on one recurrence
    assert est.upper - est.lower > 1e-9 * est.value
    short = trace_sqrt(lambda x: m @ x, 800, probes=4, rel_gap=1e-9, max_steps=25, rng=0)
    assert short.steps == 25


def test_trace_sqrt_small_n_is_exact() -> None:
    m = _spread(40)
    est = trace_sqrt(lambda x: m @ x, 40, probes=5, rng=2)
    assert est.steps == 40
    assert est.upper - est.lower <= 1e-8 * est.value


@pytest.mark.slow  # skip locally with -m "not slow"; CI runs it
def test_trace_sqrt_reruns_in_chunks_beyond_the_memory_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _slow()
    whole = trace_sqrt(lambda x: m @ x, 800, probes=8, rel_gap=0.01, rng=3)
    monkeypatch.setattr(slq, "_BASIS_BYTES", 8 * 60 * 800 * 8)  # all 8 probes fit for 60 steps only
    rec = _Recorder(m)
    chunked = trace_sqrt(rec, 800, probes=8, rel_gap=0.01, rng=3)
    assert rec.widths == [8] * 60 + [4] * 120 + [4] * 120  # 120 steps rerun, 4 probes at a time
    assert chunked.steps == whole.steps == 120
    assert (chunked.lower, chunked.upper) == pytest.approx((whole.lower, whole.upper), rel=1e-9)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0},
        {"probes": 1},
        {"max_steps": 0},
        {"rel_gap": 0.0},
        {"rel_gap": -0.1},
        {"rel_gap": float("nan")},
        {"rel_gap": "0.1"},
        {"node": None},
        {"node": float("inf")},
    ],
)
def test_trace_sqrt_bad_arguments(kwargs: dict) -> None:
    args = {"n": 10} | kwargs
    n = args.pop("n")
    with pytest.raises(ValueError):
        trace_sqrt(lambda x: x, n, **args)
