"""Tests for :mod:`hdmm.slq` (stochastic Lanczos quadrature)."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from scipy.linalg import hadamard

import hdmm.slq as slq
from hdmm.slq import SLQEstimate, trace_function


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
    # Total error: Hutchinson noise, which the stderr must cover, plus quadrature error.
    assert abs(est.value - exact) <= 4 * est.stderr
    assert abs(est.value - exact) <= 0.05 * exact
    assert est.stderr <= 0.04 * exact
    # Quadrature error alone: compare with the exact v^T M^(1/2) v of the same probes.
    v = rec.first * np.sqrt(n)
    evals, u = np.linalg.eigh(m)
    sqrt_m = (u * np.sqrt(np.clip(evals, 0, None))) @ u.T
    hutchinson = np.einsum("ni,nm,mi->i", v, sqrt_m, v).mean()
    assert est.value == pytest.approx(hutchinson, rel=5e-3)


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


def test_diagonal_is_exact() -> None:
    """For diagonal M, v^T f(M) v = tr f(M) for every Rademacher v."""
    d = np.linspace(0.0, 5.0, 50)
    est = trace_function(lambda x: d[:, None] * x, 50, probes=5, steps=60, rng=7)
    assert est.value == pytest.approx(np.sqrt(d).sum(), rel=1e-8)
    assert est.stderr < 1e-8


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
