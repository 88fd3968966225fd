"""Extreme inputs end in clear errors, in bounded time and memory, before any noise is drawn."""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np
import pytest

import hdmm
from hdmm.block_diagonal import BlockDiagonal
from hdmm.error import per_query_variance
from hdmm.kernel import MAX_COUNT, measure
from hdmm.matrix import DenseLimitError, Identity, Kronecker, Ones, Weighted
from hdmm.planning import SENSITIVITY_MARGIN, Plan, strategy_plan
from hdmm.postprocess import nonnegative_least_squares, project_nonnegative
from hdmm.workload import AllRange, Prefix


class _NoNoise(np.random.Generator):
    """A generator that fails the test if any noise is drawn from it."""

    def __init__(self):
        super().__init__(np.random.PCG64(0))

    def laplace(self, *args, **kwargs):
        raise AssertionError("noise was drawn")

    normal = laplace


@pytest.mark.parametrize("count", [1e308, 1.5e15, np.finfo(float).max])
def test_counts_above_the_bound_are_refused_before_any_noise(count):
    x = np.array([1.0, count, 3.0, 4.0])
    with pytest.raises(ValueError, match="above hdmm.kernel.MAX_COUNT = 1e\\+15"):
        measure(strategy_plan(Prefix(4), hdmm.PureDP(1.0)), x, rng=_NoNoise())
    with pytest.raises(ValueError, match="MAX_COUNT"):
        hdmm.run(Prefix(4), x, hdmm.PureDP(1.0), strategy=Identity(4), postprocess="nonnegative", rng=_NoNoise())


def test_counts_at_the_bound_are_measured():
    x = np.array([MAX_COUNT, 0.0, 1.0])
    m = measure(strategy_plan(Identity(3), hdmm.PureDP(1.0)), x, rng=0)
    assert np.all(np.isfinite(m.answers)) and m.answers[0] == pytest.approx(MAX_COUNT, rel=1e-9)


def test_strategy_answers_that_overflow_are_refused_before_any_noise():
    A = Weighted(Identity(4), 1e300)  # finite sensitivity, but 1e300 * 1e15 overflows
    with pytest.raises(ValueError, match="overflow to infinity"):
        measure(strategy_plan(A, hdmm.PureDP(1.0)), np.array([1e15, 0.0, 1.0, 2.0]), rng=_NoNoise())


def test_nonnegative_projection_terminates_where_rounding_made_it_cycle():
    # huge, widely spread values: the threshold rounds down between passes, and the kept set used to cycle
    x = np.array([float.fromhex(h) for h in (
        "-0x1.3278d3358017bp+42", "0x1.cfb1802241d18p+995", "0x1.3ca424d5ca549p+22", "0x1.48568942d6b8ap+995",
        "0x1.05eddff022441p+996", "0x1.de2064e49cbf5p+993", "0x1.26d8c94055105p+995", "-0x1.40178041eb2bap+5")])
    start = time.perf_counter()
    v = project_nonnegative(x)
    assert time.perf_counter() - start < 1.0
    assert np.all(v >= 0) and np.all(np.isfinite(v))
    assert np.sum(v) == pytest.approx(np.sum(x), rel=1e-12)


def test_nonnegative_projection_matches_the_exact_answer_on_ordinary_data():
    rng = np.random.default_rng(3)
    for _ in range(200):
        x = rng.normal(size=rng.integers(1, 30)) * 10
        v = project_nonnegative(x, abs(x.sum()) + 1)
        assert np.all(v >= 0) and v.sum() == pytest.approx(abs(x.sum()) + 1)
        theta = np.max(x - v)  # v = max(x - theta, 0): the positive cells share one shift
        assert np.allclose(v[v > 0], x[v > 0] - theta)


def test_nonfinite_estimates_are_refused_by_post_processing():
    for estimate in (np.array([1e308, 1e308, 0.0]), np.array([np.nan, 1.0, 2.0]), np.array([np.inf, 0.0, 0.0])):
        with pytest.raises(ValueError, match="NaN or infinite"):
            nonnegative_least_squares(Identity(3), estimate, 1.0)


def test_per_query_variance_of_a_long_prefix_never_forms_an_identity():
    n = 12_000  # np.eye(n) would take 1.15 GB
    W = Kronecker([Prefix(n), Ones(1, 3)])
    tracemalloc.start()
    try:
        variances = per_query_variance(W, Kronecker([Identity(n), Identity(3)]), hdmm.ApproxDP(1.0, 1e-6))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20
    unit = hdmm.ApproxDP(1.0, 1e-6).noise_variance(1.0)
    assert variances.shape == (n,)
    assert variances[[0, 9, n - 1]] == pytest.approx(unit * 3 * np.array([1, 10, n]), rel=1e-6)


def test_per_query_variance_too_large_to_walk_is_refused_up_front():
    W = Kronecker([AllRange(30_000), Ones(1, 3)])
    start = time.perf_counter()
    with pytest.raises(DenseLimitError, match="squared row norms"):
        per_query_variance(W, Kronecker([Identity(30_000), Identity(3)]), hdmm.ApproxDP(1.0, 1e-6))
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize("p", [1, 2])
def test_block_diagonal_sensitivity_comes_from_the_block(p):
    start = time.perf_counter()
    assert BlockDiagonal(Identity(4), 10**9, 3).sensitivity(p) == 1.0
    assert BlockDiagonal(Weighted(Identity(4), 0.25), 10**9, 3).sensitivity(p) == 1.0
    assert BlockDiagonal(Weighted(Identity(4), 0.25), 10**9).sensitivity(p) == 0.25
    block = Prefix(5)
    assert BlockDiagonal(block, 10**9).sensitivity(p) == pytest.approx(block.sensitivity(p))
    assert time.perf_counter() - start < 1.0
    small = BlockDiagonal(Prefix(3), 4, 2)
    assert small.sensitivity(p) == pytest.approx(np.max(np.sum(np.abs(small.dense()) ** p, axis=0)) ** (1 / p))


def test_the_plan_calibrates_noise_to_a_sensitivity_just_above_the_computed_one(tmp_path):
    W, A = Prefix(16), Kronecker([Prefix(4), Identity(4)])
    for privacy in (hdmm.PureDP(1.0), hdmm.ZCDP(0.5)):
        p = hdmm.plan(W, A, privacy)
        computed = A.sensitivity(privacy.norm)
        dense = np.max(np.sum(np.abs(A.dense()) ** privacy.norm, axis=0)) ** (1 / privacy.norm)
        assert p.sensitivity == computed * (1 + SENSITIVITY_MARGIN) > dense
        assert p.noise_scale == privacy.noise_scale(p.sensitivity)
        assert strategy_plan(A, privacy).sensitivity == p.sensitivity
        p.save(tmp_path / "p.npz")
        assert Plan.load(tmp_path / "p.npz").sensitivity == p.sensitivity


def test_a_plan_file_stored_without_the_margin_still_loads(tmp_path):
    p = hdmm.plan(Prefix(8), Identity(8), hdmm.PureDP(1.0))
    path = tmp_path / "p.npz"
    p.save(path)
    with np.load(path, allow_pickle=False) as archive:
        arrays = {k: archive[k] for k in archive.files if k != "header"}
        header = json.loads(str(archive["header"]))
    header["plan"]["sensitivity"] = 1.0
    del header["checksum"]  # such old files have no checksum either: read with a warning
    hdmm.io.write_archive(path, header, arrays)
    with pytest.warns(UserWarning, match="no checksum"):
        assert Plan.load(path).sensitivity == 1.0 + SENSITIVITY_MARGIN
