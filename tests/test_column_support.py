"""The grid's rounding bound counts the answers one cell can move (issue 22 item 10)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

import hdmm
from hdmm.block_diagonal import BlockDiagonal
from hdmm.marginals import Marginals
from hdmm.matrix import Diagonal, Explicit, Identity, Kronecker, Ones, Sum, VStack, Weighted
from hdmm.noise import GRID_BITS
from hdmm.planning import Plan, check_calibration

BIG = hdmm.Domain([f"a{i}" for i in range(50)], [100] * 50)
RNG = np.random.default_rng(3)
SPARSE = np.where(RNG.random((5, 4)) < 0.4, RNG.normal(size=(5, 4)), 0.0)

SMALL = [
    Identity(5), Ones(3, 4), Diagonal(np.array([0.0, 2.0, 0.0])), hdmm.Prefix(6), hdmm.AllRange(5),
    Explicit(SPARSE), Explicit(sp.csr_array(SPARSE)), Kronecker([Identity(3), Explicit(SPARSE), Ones(2, 2)]),
    VStack([Identity(4), Ones(1, 4), Weighted(hdmm.Prefix(4), 0.0)]), Weighted(Explicit(SPARSE), 3.0),
    Sum([Explicit(SPARSE), Explicit(-SPARSE)]), Marginals((3, 2, 2), {(0,): 1.0, (1, 2): 0.0, (0, 2): 2.0}),
    BlockDiagonal(Explicit(SPARSE), 3, tail=2), Kronecker([hdmm.Prefix(3), Identity(2)]).T,
]


@pytest.mark.parametrize("A", SMALL, ids=lambda A: type(A).__name__)
def test_column_support_bounds_the_dense_count(A):
    dense = A.dense()
    true = int(np.count_nonzero(dense, axis=0).max())
    assert true <= A.column_support() <= A.shape[0]


def test_column_support_is_exact_where_structural():
    assert Kronecker([Identity(100)] * 50).column_support() == 1
    assert Identity(BIG.size).column_support() == 1
    assert Explicit(SPARSE).column_support() == int(np.count_nonzero(SPARSE, axis=0).max())
    assert Marginals((3, 2, 2), {(0,): 1.0, (1, 2): 0.0, (0, 2): 2.0}).column_support() == 2


@pytest.mark.parametrize("privacy", [hdmm.PureDP(1.0), hdmm.ZCDP(0.5)], ids=["pure", "zcdp"])
@pytest.mark.parametrize("case", ["kronecker", "product"])
def test_huge_domains_plan_with_sensitivity_one(case, privacy):
    # failed before: "sensitivity must be finite, got inf" (the grid counted 1e100 rows and underflowed)
    if case == "kronecker":
        W = A = Kronecker([Identity(100)] * 50)
    else:
        W, A = hdmm.product(BIG, {"a0": hdmm.Prefix(100)}), Identity(BIG.size)
    p = hdmm.plan(W, A, privacy)
    assert p.sensitivity == pytest.approx(1.0, rel=2e-9) and p.sensitivity >= 1.0
    assert p.spacing == 2.0**-GRID_BITS
    check_calibration(dataclasses.replace(p))  # the check computes the same bound
    if case == "product":
        assert p.variances.shape == (100,) and np.all(np.isfinite(p.variances))
    else:  # 1e100 queries: no per-query variances, said plainly
        assert p.variances is None
        with pytest.raises(ValueError, match="MAX_QUERIES"):
            p.rmse


def test_huge_plan_round_trips(tmp_path):
    A = Kronecker([Identity(100)] * 50)
    p = hdmm.plan(hdmm.product(BIG, {"a0": hdmm.Prefix(100)}), A, hdmm.PureDP(1.0))
    p.save(tmp_path / "p.npz")
    q = Plan.load(tmp_path / "p.npz")
    assert (q.sensitivity, q.spacing, q.noise_scale) == (p.sensitivity, p.spacing, p.noise_scale)


def test_edited_sensitivity_still_refused():
    p = hdmm.plan(hdmm.Prefix(8), Kronecker([hdmm.Prefix(8)]), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="not calibrated"):
        check_calibration(dataclasses.replace(p, sensitivity=p.sensitivity / (1 + 1e-8), noise_scale=p.noise_scale / (1 + 1e-8)))
