"""Exact arithmetic (issue 22, item 5): dyadic strategies and error-free round(Ax/s)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import hdmm
from hdmm.block_diagonal import BlockDiagonal
from hdmm.exact import exact_centres, is_dyadic, on_grid_exact, quantize
from hdmm.geography import GeographyTree, TreeStrategy
from hdmm.marginals import Marginals
from hdmm.matrix import Diagonal, Explicit, Identity, Kronecker, Ones, Sum, VStack, Weighted
from hdmm.noise import draw, on_grid, random_bits
from hdmm.optimizers import PIdentity, opt0
from hdmm.planning import Plan, check_calibration
from hdmm.workload import AllRange, Prefix, Ranges


def exact_dense(A) -> np.ndarray:
    """The entries as Fractions (a Kronecker product's entries multiplied exactly, not in floating point)."""
    if isinstance(A, PIdentity):  # [diag(v); T diag(v)] with v = fl(1/d), what hdmm.exact measures
        v = [Fraction(float(t)) for t in 1.0 / A.d]
        T = [[Fraction(float(t)) for t in row] for row in A.params]
        top = [[v[j] if i == j else Fraction(0) for j in range(len(v))] for i in range(len(v))]
        return np.array(top + [[t * v[j] for j, t in enumerate(row)] for row in T], dtype=object)
    if isinstance(A, Weighted):
        return exact_dense(A.base) * Fraction(float(A.weight))
    if isinstance(A, Kronecker):
        out = np.array([[Fraction(1)]], dtype=object)
        for F in A.factors:
            out = np.kron(out, exact_dense(F))
        return out
    return np.vectorize(lambda v: Fraction(float(v)), otypes=[object])(A.dense())


def reference(A, x, s) -> list[int]:
    """floor(A x / s + 1/2) in exact rational arithmetic from the dense entries."""
    D = exact_dense(A)
    out = []
    for row in D:
        v = sum((a * int(b) for a, b in zip(row, x) if a), Fraction(0))
        out.append(int((v / Fraction(s) + Fraction(1, 2)).__floor__()))
    return out


def _tree():
    rows = [("01", "001", "01"), ("01", "001", "02"), ("02", "001", "01"), ("02", "003", "01"), ("02", "003", "02")]
    return GeographyTree.from_table(pd.DataFrame(rows, columns=["state", "county", "tract"]),
                                    ["state", "county", "tract"])


def strategies(rng):
    real = lambda *shape: Explicit(rng.random(shape) * 3 - 1)  # noqa: E731
    return [
        Identity(5), Ones(2, 5), Prefix(6), AllRange(5), Ranges(6, [(0, 3), (2, 6)]),
        real(4, 6), Explicit(sp.random(5, 6, density=0.5, random_state=1, format="csr") * 0.7),
        Diagonal(rng.random(6)), Weighted(Prefix(6), 1 / 3),
        Kronecker([real(3, 4), Prefix(3)]), Kronecker([AllRange(3), real(2, 2), Identity(2)]),
        VStack([real(3, 6), Weighted(Ones(1, 6), 0.3)]), VStack([Identity(6), Prefix(6)], weights=[0.7, 1.9]),
        Sum([real(4, 6), Weighted(Ones(4, 6), 0.1)]),
        Marginals((2, 3), {(): 0.37, (0,): 1.1, (0, 1): 2 / 3}),
        PIdentity(rng.random((2, 6)), norm=1),
        BlockDiagonal(real(2, 2), 3), BlockDiagonal(Weighted(Identity(2), 0.6), 2, tail=2),
        TreeStrategy(_tree(), [0.0, 0.3, 1.7, 1.0]),
    ]


@pytest.mark.parametrize("index", range(19))
def test_exact_product_matches_rationals(index):
    rng = np.random.default_rng(index)
    A = quantize(strategies(rng)[index])
    assert is_dyadic(A) and quantize(A) is A  # idempotent
    for top in (10, 10**8, 10**15):
        x = rng.integers(0, top, size=A.shape[1], endpoint=True)
        for s in (2.0**-30, 1.0, 2.0**-3, 2.0**5):
            got = exact_centres(A, x.astype(float), s)
            assert [int(v) for v in got] == reference(A, x, s)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2**32))
def test_random_kronecker_products_are_exact(m, n, r, seed):
    rng = np.random.default_rng(seed)
    A = quantize(Kronecker([Explicit(rng.normal(size=(m, n)) * 10.0 ** rng.integers(-5, 5)),
                            Explicit(rng.normal(size=(r, 3)))]))
    x = rng.integers(0, 10**15, size=A.shape[1], endpoint=True)
    assert [int(v) for v in exact_centres(A, x.astype(float), 2.0**-20)] == reference(A, x, 2.0**-20)


def test_integer_strategies_are_unchanged():
    for A in (Identity(4), Prefix(8), AllRange(8), Ones(1, 4), Kronecker([Identity(3), Prefix(4)]),
              Marginals((2, 3), {(): 1.0, (0,): 2.0}), Weighted(Identity(4), 3.0),
              Explicit(np.array([[1.0, 0.0], [1.0, 1.0]]))):
        assert quantize(A) is A


def test_plan_measures_the_quantized_strategy_and_its_sensitivity():
    rng = np.random.default_rng(0)
    A = Explicit(rng.random((5, 4)))
    p = hdmm.plan(Identity(4), A, hdmm.PureDP(1.0))
    assert p.strategy is not A and is_dyadic(p.strategy)
    Q = p.strategy.dense()
    assert np.max(np.abs(Q - A.dense())) <= 2.0**-29 * np.max(A.dense())
    assert p.sensitivity >= np.abs(Q).sum(axis=0).max() and p.sensitivity <= np.abs(Q).sum(axis=0).max() * (1 + 2e-9)


def test_release_uses_the_exact_product_not_floating_point():
    """Fails before exact arithmetic: fl(Ax) rounds differently from the exact dyadic product at 1e8 counts."""
    rng = np.random.default_rng(3)
    A = opt0(AllRange(64), hdmm.PureDP(1.0), seed=0)
    p = hdmm.plan(AllRange(64), A, hdmm.PureDP(1.0))
    x = rng.integers(10**8 - 1000, 10**8, size=64).astype(float)
    s = p.spacing
    exact = exact_centres(p.strategy, x, s)
    floating = np.rint((p.strategy @ x) / s)
    assert np.any(floating != exact.astype(float))  # the float product is off for some answers
    y = hdmm.measure(p, x, rng=7).answers
    steps = draw(p.privacy.noise, p.noise_scale / s, p.strategy.shape[0], random_bits(7))
    assert np.array_equal(y, on_grid_exact(exact, s, steps))  # the exact product, plus the noise
    assert not np.array_equal(y, on_grid(p.strategy @ x, s, steps))  # not the floating-point one


def test_saved_plan_round_trips_the_quantized_strategy(tmp_path):
    rng = np.random.default_rng(1)
    W = Kronecker([AllRange(4), Identity(3)])
    p = hdmm.plan(W, Kronecker([Explicit(rng.random((5, 4))), Identity(3)]), hdmm.PureDP(1.0))
    p.save(tmp_path / "p.hdmm")
    q = Plan.load(tmp_path / "p.hdmm")
    assert np.array_equal(q.strategy.dense(), p.strategy.dense()) and is_dyadic(q.strategy)
    assert q.sensitivity == p.sensitivity
    check_calibration(q)


def test_non_integer_counts_are_refused_before_noise():
    budget = hdmm.Budget(hdmm.PureDP(1.0))
    p = hdmm.plan(Identity(3), Identity(3), hdmm.PureDP(1.0))
    with pytest.raises(ValueError, match="non-integer counts"):
        hdmm.measure(p, [1.0, 2.5, 3.0], budget=budget)
    assert not budget.charges


def test_any_matrix_of_doubles_has_an_exact_product():
    """Not only quantized strategies: 53-bit entries and weights of any exponent are split into 16-bit chunks."""
    rng = np.random.default_rng(5)
    for A in (Explicit(rng.normal(size=(3, 5)) * np.array([1e-9, 1.0, 1e9, 3.0, 1e-3])),
              Weighted(Kronecker([Identity(2), Prefix(3)]), 2 / 7),
              Explicit(sp.csr_array(rng.normal(size=(3, 4)) * 1e6)), Diagonal(rng.normal(size=4) * 1e12)):
        x = rng.integers(0, 10**15, size=A.shape[1], endpoint=True)
        for s in (2.0**-30, 1.0):
            assert [int(v) for v in exact_centres(A, x.astype(float), s)] == reference(A, x, s)


def test_structures_without_an_exact_product_are_refused_when_planning():
    from hdmm.matrix import Transpose
    small = Transpose(Prefix(4))  # small: measured as the explicit matrix of its entries
    assert isinstance(quantize(small), Explicit) and np.array_equal(quantize(small).dense(), small.dense())
    with pytest.raises(ValueError, match="cannot compute the answers of a Transpose strategy"):
        hdmm.plan(Identity(3000), Transpose(Prefix(3000)), hdmm.PureDP(1.0))


def test_pidentity_keeps_its_structure_and_one_dimensional_opt0_plans():
    rng = np.random.default_rng(2)
    A = PIdentity(rng.random((4, 50)), norm=1)
    Q = quantize(A)
    assert isinstance(Q, PIdentity) and quantize(Q) is Q
    assert abs(Q.sensitivity(1) - np.abs(exact_dense(Q).astype(float)).sum(axis=0).max()) <= 1e-14


def test_residual_strategies_are_measured_exactly():
    # a Gaussian optimization of marginals picks a Residuals strategy, whose Helmert factors are measured as the
    # explicit matrices of their doubles (it was refused: 'cannot compute the answers of a Residuals strategy')
    import itertools
    import math
    from fractions import Fraction

    from hdmm.exact import _subset_factor
    from hdmm.marginals import Residuals
    R = Residuals((3, 4, 2), {(): 1.0, (0,): 0.7, (0, 1): 1.3, (2,): 0.4})
    assert quantize(R) is R
    x = np.random.default_rng(0).integers(0, 10**12, size=R.shape[1]).astype(float)
    s = 2.0**-20
    ref = []
    for row, w in zip(R.members, R.weights):
        Fs = [[[Fraction(float(v)) for v in r] for r in _subset_factor(fs[int(m)]).dense()]
              for fs, m in zip(R.factors, row)]
        for rows in itertools.product(*[range(len(F)) for F in Fs]):
            total = Fraction(0)
            for j, cols in enumerate(itertools.product(*[range(len(F[0])) for F in Fs])):
                e = Fraction(float(w))
                for F, r, c in zip(Fs, rows, cols):
                    e *= F[r][c]
                total += e * int(x[j])
            ref.append(math.floor(total / Fraction(s) + Fraction(1, 2)))
    assert [int(c) for c in exact_centres(R, x, s)] == ref


def test_plans_for_long_gaussian_domains_choose_a_strategy_measured_exactly():
    # beyond 2048 values the Gaussian optimizer's square-root strategy (a sine transform) has no exact product;
    # hdmm.plan optimizes for release (p-Identity stands in) instead of refusing (it raised ExactUnsupported)
    from hdmm.optimizers.kron import factor_method, for_release
    G = hdmm.Prefix(4096).gram()
    assert factor_method(G, hdmm.ZCDP(0.5)) == "square root"
    with for_release():
        assert factor_method(G, hdmm.ZCDP(0.5)) == "p-identity"
    assert factor_method(G, hdmm.ZCDP(0.5)) == "square root"


@pytest.mark.parametrize("index", range(19))
def test_many_data_vectors_at_once_give_each_ones_centres(index):
    from hdmm.exact import exact_centres_many

    rng = np.random.default_rng(100 + index)
    A = quantize(strategies(rng)[index])
    for top in (10, 10**15):  # the int64 digits and the Python-int path
        X = rng.integers(0, top, size=(3, A.shape[1]), endpoint=True).astype(float)
        for s in (2.0**-30, 2.0**5):
            many = exact_centres_many(A, X, s)
            assert many.shape == (3, A.shape[0])
            for row, x in zip(many, X):
                assert [int(v) for v in row] == [int(v) for v in exact_centres(A, x, s)] == reference(A, x, s)


@pytest.mark.parametrize("index", range(19))
def test_dense_digits_path_gives_the_structured_paths_centres(index):
    """Many units through a strategy's exact dense matrix (sparse or dense data, weighted or not, counts
    needing several digits): the centres of the exact rationals, as through the structure."""
    from hdmm import exact

    rng = np.random.default_rng(200 + index)
    base = quantize(strategies(rng)[index])
    for A in (base, Weighted(base, 0.196)):
        for top, density in ((40, 0.02), (10**15, 1.0)):
            X = rng.integers(0, top, size=(exact.DENSE_MIN_COLUMNS + 4, A.shape[1]), endpoint=True).astype(float)
            X *= rng.random(X.shape) < density
            X[0, 0] = max(X[0, 0], 1.0)
            for s in (2.0**-37, 2.0**3):
                many = exact.exact_centres_many(A, X, s)
                if not isinstance(base, (Identity, Ones, Ranges, Explicit, Diagonal)):
                    assert exact._DENSE_CACHE[id(base)][0] is base  # the dense path ran
                for row, x in zip(many[:3], X[:3]):
                    assert [int(v) for v in row] == reference(A, x, s)
                Y = exact._apply(A, exact._Exact(X.T.astype(np.int64)[None], int(X.max()), 0)).normalised()
                Z = exact._product(A, exact._Exact(X.T.astype(np.int64)[None], int(X.max()), 0)).normalised()
                value = lambda V: exact._digits_to_int(V.T, 0)  # noqa: E731
                shift = Z.E - Y.E
                assert np.array_equal(np.asarray(value(Y), dtype=object) * (2 ** max(shift, 0)),
                                      np.asarray(value(Z), dtype=object) * (2 ** max(-shift, 0)))


def test_sign_extension_digits_are_trimmed():
    from hdmm.exact import _digits_to_int, _trim

    values = np.array([[-5, 7, -(2**40), 2**44 - 1]], dtype=np.int64)
    digits = np.stack([(values >> (16 * j)) & 0xFFFF for j in range(6)] + [values >> 96])  # padded with the sign
    trimmed = _trim(digits)
    assert trimmed.shape[0] == 3 and _digits_to_int(trimmed, 0).dtype == np.int64
    np.testing.assert_array_equal(_digits_to_int(trimmed, 0), values)


def test_measure_many_equals_measure_row_by_row():
    import hdmm
    from hdmm.kernel import measure, measure_many

    plan = hdmm.plan(hdmm.Prefix(6), "auto", hdmm.ZCDP(0.5), seed=0)
    X = np.random.default_rng(0).integers(0, 50, size=(4, 6)).astype(float)
    many = measure_many(plan, X, [11, 12, 13, 14])
    for row, seed, got in zip(X, [11, 12, 13, 14], many):
        np.testing.assert_array_equal(got.answers, measure(plan, row, rng=seed).answers)
        assert got.seeded and got.charge is None
    with pytest.raises(ValueError, match="non-integer counts"):
        measure_many(plan, X + 0.5, [None] * 4)
    with pytest.raises(ValueError, match="k noise sources"):
        measure_many(plan, X, [None])


def test_floor_shift_of_four_digits_stays_exact_in_int64():
    from hdmm.exact import _floor_shift

    rng = np.random.default_rng(0)
    values = [int(v) for v in rng.integers(-2**62, 2**62, 300)] + [-1, 0, 1, -(2**63) + 5, 2**63 - 7, -(2**50), 2**50]
    digits = np.array([[(v >> (16 * j)) & 0xFFFF if j < 3 else v >> 48 for v in values] for j in range(4)],
                      dtype=np.int64)
    for r in range(16):
        assert [int(g) for g in _floor_shift(digits, r)] == [v >> r for v in values]
    small = digits[:, -2:]  # |values| < 2**51: int64 for every shift of at least 2
    assert _floor_shift(small, 2).dtype == np.int64
