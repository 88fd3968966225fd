r"""Exact strategy answers: dyadic strategies and error-free products with integer counts.

A release is :math:`y = s\,(\operatorname{round}(Ax/s) + Z)` (:mod:`hdmm.noise`). Its privacy
proof needs :math:`\operatorname{round}(Ax/s)` to be a function of the *exact* value :math:`Ax`:
then neighbouring data move each rounded answer by at most the exact column change plus
:math:`s`, which the grid's rounding bound covers. A product computed in floating point
carries a data-dependent error instead, which no fixed margin covers (issue 22, item 5). This
module removes that error in two steps.

**1. Dyadic strategies** (:func:`quantize`, once, in the plan, without the data). Every real
number a strategy holds (the entries of a dense or sparse factor, a weight, a diagonal, the
weights of marginals) is rounded to an integer multiple of :math:`2^{-e}`, with :math:`e` chosen
per array so that its largest entry keeps ``QBITS`` significant bits (fewer for very wide
factors, :func:`_bits_for`, so that every product below stays exact). The structure is kept:
a Kronecker product of quantized factors is a Kronecker product, marginals stay marginals.
Integer-valued arrays (0/1 factors, integer weights) are on every such grid already and come
back unchanged, the same object. A p-Identity strategy :math:`[D^{-1}; T D^{-1}]` keeps its
structure (O(pn) memory, fast pseudo-inverse): its parameters :math:`T` are quantized, and the
matrix measured exactly is :math:`[\mathrm{diag}(v); T\,\mathrm{diag}(v)]` with the doubles
:math:`v = \mathrm{fl}(1/d)`; its own float methods (column norms, Gram) differ from that matrix
by a few ulp, which the sensitivity's ``ROUNDOFF_ALLOWANCE`` (1e-12) covers. The plan's
strategy *is* the quantized matrix: its sensitivity, noise and variances are computed from it.

**2. Exact products** (:func:`exact_centres`). With a dyadic strategy and integer counts
:math:`x` (at most ``MAX_COUNT = 1e15 < 2^{50}``), every intermediate of the product is an
integer times a power of two. We carry it as an integer array in base :math:`2^{16}` digits,
:math:`v = 2^{-E}\sum_j T_j\,2^{16 j}` (``_Exact``), with a bound :math:`m \ge |T_j|`. A linear
node :math:`M` whose entries are integers :math:`N` times :math:`2^{-e}` is applied to each digit
array separately (linearity), exponent :math:`E + e`. The float64 product :math:`N T_j` is
exact when every partial sum is an integer below :math:`2^{53}` in magnitude; whatever the
order and grouping of the sum (BLAS, FMA), each partial sum is bounded by
:math:`c(N)\,m` with :math:`c(N)` the largest row sum of :math:`|N|`. So before applying
:math:`M` we check :math:`c(N)\,m < 2^{53}`, and otherwise first *normalise* the digits (carry
propagation in int64: every digit into :math:`[0, 2^{16})`, the top one signed), after which
:math:`m = 2^{16}` and :math:`c(N) \le 2^{37}` (guaranteed by the quantization) suffices. Sums,
prefix sums and range differences (Ones, Prefix, Ranges) are done in int64 with
:math:`c = n`, weights and diagonals as int64 products, checked against :math:`2^{62}`. Parts
of a VStack or Sum are aligned to a common exponent by exact shifts.

A matrix that was not quantized (any finite doubles, e.g. the level weights of a geography
unit's plan) still has an exact product: numerators too wide for one float product are split into
16-bit chunks :math:`N = \sum_i C_i 2^{16 i}` (exact float steps: power-of-two divisions, floors
and subtractions of integers), each chunk applied as above and shifted back by :math:`i` digits.
Quantization only keeps the number of digits, hence the cost, small.

**Small strategies, many units.** A structured strategy of at most ``DENSE_NODE`` entries and
``DENSE_COLUMNS`` columns (e.g. PL94's 259 x 2,016) is formed once as its exact dense matrix: the
structured product above applied to the identity, kept as normalised digits :math:`D_j` with one
exponent. Then :math:`Ax = 2^{-E}\sum_j 2^{16j} D_jx` is one float product per digit pair, each exact by
the same bound (:math:`|D_j| < 2^{16}`, so partial sums stay below :math:`2^{16}\,n\,m < 2^{53}`), and
on sparse data only the non-zero counts enter: a block of a few people costs rows x its non-zero cells.

**The cheap path** is the same computation with no normalisation needed: for an
integer-valued strategy whose intermediates stay below :math:`2^{53}` (e.g. a Kronecker product
of 0/1 factors with :math:`\prod_i c(N_i)\cdot\max_j x_j < 2^{53}`) the counts are used as one
digit and each node is one float product, exact by the bound above.

Finally :math:`\operatorname{round}(v/s)` for :math:`s = 2^{-k}` is
:math:`\lfloor (Y + 2^{h-1}) / 2^{h} \rfloor` with :math:`Y = \sum_j T_j 2^{16 j}`, :math:`h = E - k`
(rounding half up; for :math:`h \le 0` it is :math:`Y 2^{-h}`), computed on normalised digits
(int64, or Python integers for the rare centres beyond :math:`2^{61}`). Noise is then added to
these integers and the sum converted to double once (:func:`on_grid_exact`), so the release is a
function of the noisy integers alone, and :math:`\operatorname{round}(Ax/s)` is a function of the
exact :math:`Ax`: the mechanism is exactly the one the noise is calibrated for (docs/privacy.md).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from .block_diagonal import BlockDiagonal
from .geography.strategy import TreeStrategy
from .marginals import Marginals, SubsetProducts
from .matrix import Diagonal, Explicit, Identity, Kronecker, Matrix, Ones, Sum, VStack, Weighted
from .optimizers.pidentity import PIdentity
from .workload import Ranges

__all__ = ["exact_centres_many", "QBITS", "quantize", "is_dyadic", "exact_centres", "on_grid_exact", "ExactUnsupported"]

#: Significant bits kept of each real array of a strategy, relative to its largest entry.
QBITS = 30

#: Largest row sum of |integer numerators| of a node applied by float products (so that
#: 2**16-digit inputs keep every partial sum below 2**53).
_MAX_ROW = 2**37
_DIGIT = 16
#: Other structures (Transpose, Product, ...) up to this many entries are measured as explicit matrices.
_DENSE_FALLBACK = 2**22
_FLOAT_EXACT = 2**53
_INT_SAFE = 2**62


class ExactUnsupported(ValueError):
    """A strategy structure whose answers cannot be computed exactly (refused before any noise)."""


# ====================================================================== quantization
def _bits_for(width: int) -> int:
    """Significant bits for an array whose rows have ``width`` non-zeros: row sums stay below ``_MAX_ROW``."""
    return max(8, min(QBITS, 36 - max(int(width) - 1, 0).bit_length()))


def _grid(values: np.ndarray, bits: int) -> int:
    """The exponent ``e``: ``values`` rounded to multiples of ``2**-e`` keep ``bits`` bits of the largest."""
    top = float(np.max(np.abs(values))) if values.size else 0.0
    if top == 0.0:
        return 0
    return bits - math.frexp(top)[1]


def _round_array(values: np.ndarray, bits: int) -> np.ndarray:
    """``values`` on a dyadic grid (idempotent: a second call changes nothing)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or np.all(values == np.rint(values)) and np.max(np.abs(values)) < 2**bits:
        return values
    out = values
    for _ in range(3):  # the largest entry may round up to the next power of two: re-grid then
        e = _grid(out, bits)
        new = np.ldexp(np.rint(np.ldexp(values, e)), -e)
        if _grid(new, bits) == e:
            return new
        out = new
    return out


def _numerator(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``(N, e)`` with ``values = N * 2**-e`` exactly, ``N`` integer-valued floats and ``e`` (any sign) smallest."""
    values = np.asarray(values, dtype=np.float64)
    nz = values[values != 0]
    if nz.size == 0:
        return np.zeros_like(values), 0
    mant, expo = np.frexp(nz)  # nz = mant * 2**expo, |mant| in [0.5, 1): mant * 2**53 is an integer
    whole = np.abs(np.ldexp(mant, 53)).astype(np.int64)
    trailing = np.log2(whole & -whole).astype(np.int64)  # exact: a power of two
    e = int(np.max(53 - expo - trailing))
    return np.ldexp(values, e), e


def _quantize_explicit(M: Explicit) -> Explicit:
    if M.is_sparse:
        csr = M.matrix
        width = int(np.max(np.diff(csr.indptr))) if csr.shape[0] else 0
        data = _round_array(csr.data, _bits_for(width))
        if data is csr.data or np.array_equal(data, csr.data):
            return M
        new = sp.csr_array((data, csr.indices.copy(), csr.indptr.copy()), shape=csr.shape)
        return Explicit(new, labels=M.row_labels)
    data = _round_array(M.matrix, _bits_for(M.shape[1]))
    if data is M.matrix or np.array_equal(data, M.matrix):
        return M
    return Explicit(data, labels=M.row_labels)


def quantize(A: Matrix) -> Matrix:
    """``A`` with every real number on a dyadic grid (module docstring), the same object if nothing changes.

    Raises
    ------
    ExactUnsupported
        For a structure whose products :func:`exact_centres` cannot compute exactly.
    """
    if isinstance(A, (Identity, Ones, Ranges)):
        return A
    if isinstance(A, Explicit):
        return _quantize_explicit(A)
    if isinstance(A, PIdentity):  # structure kept: its p x n parameters on a dyadic grid (module docstring)
        T = _round_array(A.params, _bits_for(A.params.shape[1]))
        return A if np.array_equal(T, A.params) else PIdentity(T, norm=A.norm)
    if isinstance(A, Diagonal):
        d = _round_array(A.d, QBITS)
        return A if np.array_equal(d, A.d) else Diagonal(d)
    if isinstance(A, Weighted):
        base = quantize(A.base)
        w = float(_round_array(np.array([A.weight]), QBITS)[0])
        return A if base is A.base and w == A.weight else Weighted(base, w)
    if isinstance(A, (Kronecker, Sum)):
        parts = A.factors if isinstance(A, Kronecker) else A.terms
        new = [quantize(P) for P in parts]
        if all(a is b for a, b in zip(new, parts)):
            return A
        return type(A)(new)
    if isinstance(A, VStack):
        new = [quantize(P) for P in A.parts]
        w = None if A.weights is None else [float(v) for v in _round_array(np.array(A.weights), QBITS)]
        if all(a is b for a, b in zip(new, A.parts)) and (w is None or tuple(w) == A.weights):
            return A
        return VStack(new, names=A.names, weights=w)
    if isinstance(A, Marginals):
        w = _round_array(A.weights, QBITS)
        return A if np.array_equal(w, A.weights) else Marginals.from_members(A.domain, A.members, w)
    if isinstance(A, BlockDiagonal):
        block = quantize(A.block)
        return A if block is A.block else BlockDiagonal(block, A.copies, A.tail)
    if isinstance(A, TreeStrategy):
        w = _round_array(A.weights, QBITS)
        return A if np.array_equal(w, A.weights) else TreeStrategy(A.tree, w)
    if isinstance(A, SubsetProducts):  # e.g. Residuals: measured term by term, factors as their doubles
        for fs in A.factors:
            for F in fs:
                _subset_factor(F)
        return A
    if A.shape[0] * A.shape[1] <= _DENSE_FALLBACK:  # any other small node: its quantized entries
        return _quantize_explicit(Explicit(A.dense()))
    raise ExactUnsupported(
        f"hdmm cannot compute the answers of a {type(A).__name__} strategy of shape {A.shape} exactly, so it "
        "cannot release them with exactly calibrated noise; use a strategy built from Identity, Ones, Prefix, "
        "AllRange, Ranges, Explicit, Diagonal, Weighted, Kronecker, VStack, Sum, Marginals, PIdentity, "
        "BlockDiagonal or TreeStrategy, or any matrix of at most 2**22 entries"
    )


def _subset_factor(F: Matrix) -> Matrix:
    """A factor of a :class:`~hdmm.marginals.SubsetProducts` as a node :func:`_apply` computes exactly.

    Factors of a structure with an exact product stay; any other (a Helmert basis of a residual
    strategy) is measured as the explicit matrix of its doubles (every double is dyadic). Its
    closed-form column norms describe that matrix to within a few ulp, which the plan's
    ``ROUNDOFF_ALLOWANCE`` covers, as for p-Identity strategies.
    """
    if isinstance(F, (Identity, Ones, Ranges, Explicit, Diagonal)) or (
            isinstance(F, Weighted) and isinstance(F.base, (Identity, Ones))):
        return F
    if F.shape[0] * F.shape[1] > _DENSE_FALLBACK:
        raise ExactUnsupported(f"a factor {F!r} of shape {F.shape} of a subset-product strategy is too large to "
                               "measure exactly as an explicit matrix (at most 2**22 entries)")
    return Explicit(F.dense())


def is_dyadic(A: Matrix) -> bool:
    """Whether ``A`` is its own quantization (every plan's strategy is)."""
    try:
        return quantize(A) is A
    except ExactUnsupported:
        return False


# ====================================================================== exact integers in 2**16 digits
class _Exact:
    """``2**-E * sum_j T[j] * 2**(16 j)``: ``T`` int64 ``(J, n, cols)``, every ``|T[j]| <= m``."""

    __slots__ = ("T", "m", "E")

    def __init__(self, T: np.ndarray, m: int, E: int):
        self.T, self.m, self.E = T, int(m), int(E)

    def normalised(self) -> _Exact:
        """Digits in ``[0, 2**16)``, the top one signed in ``[-2**15, 2**15)``; ``m = 2**16``."""
        if self.m < 2**(_DIGIT - 1) and self.T.shape[0] == 1:
            return self
        out, carry = [], np.zeros(self.T.shape[1:], dtype=np.int64)
        for j in range(self.T.shape[0]):
            t = self.T[j] + carry
            out.append(t & (2**_DIGIT - 1))
            carry = t >> _DIGIT
        while np.any((carry < -(2**(_DIGIT - 1))) | (carry >= 2**(_DIGIT - 1))):
            out.append(carry & (2**_DIGIT - 1))
            carry = carry >> _DIGIT
        out.append(carry)
        while len(out) > 1 and not np.any(out[-1]):
            out.pop()
        return _Exact(np.stack(out), 2**_DIGIT, self.E)

    def ready(self, c: int, limit: int = _FLOAT_EXACT) -> _Exact:
        """This value with ``m * c < limit`` (normalised if needed)."""
        if self.m * c < limit:
            return self
        out = self.normalised()
        if out.m * c >= limit:
            raise ExactUnsupported(f"a strategy node with row sums up to {c:.3g} is too wide for exact products")
        return out

    def shifted(self, E: int) -> _Exact:
        """The same value with exponent ``E >= self.E``."""
        d = E - self.E
        if d == 0:
            return self
        if self.m * 2**d < _INT_SAFE:
            return _Exact(self.T * (1 << d), self.m * 2**d, E)
        v = self.normalised()
        q, r = divmod(d, _DIGIT)
        T = np.concatenate([np.zeros((q,) + v.T.shape[1:], dtype=np.int64), v.T * (1 << r)])
        return _Exact(T, v.m << r, E)


def _matmul_float(N, X: _Exact, c: int) -> np.ndarray:
    """``N @ T[j]`` for each digit, in float64: exact since ``c * m < 2**53`` (module docstring)."""
    out = []
    for j in range(X.T.shape[0]):
        prod = N @ X.T[j].astype(np.float64)
        out.append(np.rint(np.asarray(prod)).astype(np.int64))
    return np.stack(out)


def _row_sum(N) -> int:
    if sp.issparse(N):
        return int(np.max(abs(N).sum(axis=1))) if N.nnz else 0
    return int(np.max(np.abs(N).sum(axis=1))) if N.size else 0


def _chunks(N: np.ndarray) -> list[np.ndarray]:
    """Integer-valued floats ``N`` as ``sum_i C_i 2**(16 i)`` with ``|C_i| < 2**16`` (same signs): exact float steps."""
    sign, rest = np.sign(N), np.abs(N)
    out = []
    while True:
        high = np.floor(rest / 2.0**_DIGIT)  # exact: a power-of-two division of an integer, then floor
        out.append(sign * (rest - high * 2.0**_DIGIT))
        rest = high
        if not np.any(rest):
            return out


def _digit_shift(X: _Exact, digits: int) -> _Exact:
    """``X * 2**(16 digits)``: zero digits prepended."""
    if not digits:
        return X
    zeros = np.zeros((digits,) + X.T.shape[1:], dtype=np.int64)
    return _Exact(np.concatenate([zeros, X.T]), X.m, X.E)


def _by_chunks(N, X: _Exact, one) -> _Exact:
    """``sum_i 2**(16 i) one(C_i, X)`` over the 16-bit chunks ``C_i`` of ``N`` (for numerators too wide at once)."""
    parts = [_digit_shift(one(C, X), i) for i, C in enumerate(_chunks(N))]
    return parts[0] if len(parts) == 1 else _combine(parts, stack=False)


def _scale(X: _Exact, numerators: np.ndarray, e: int) -> _Exact:
    """Rows times integer ``numerators`` (broadcast over ``(n, 1)``), exponent ``+ e``."""
    big = int(np.max(np.abs(numerators))) if numerators.size else 0
    if big >= 2**_DIGIT and big * max(X.m, 2**_DIGIT) >= _INT_SAFE:  # split the numerators into 16-bit chunks
        return _by_chunks(numerators, X, lambda C, Y: _scale(Y, C, e))
    X = X.ready(max(big, 1), _INT_SAFE)
    return _Exact(X.T * numerators.astype(np.int64), X.m * max(big, 1), X.E + e)


def _apply(A: Matrix, X: _Exact) -> _Exact:
    """``A`` applied to the value ``X`` (its axis 1), exactly."""
    if isinstance(A, Identity):
        return X
    if isinstance(A, Ones):
        X = X.ready(A.shape[1], _INT_SAFE)
        total = X.T.sum(axis=1, keepdims=True)
        return _Exact(np.repeat(total, A.shape[0], axis=1), X.m * A.shape[1], X.E)
    if isinstance(A, Ranges):
        X = X.ready(A.n, _INT_SAFE)
        J, _, cols = X.T.shape
        prefix = np.zeros((J, A.n + 1, cols), dtype=np.int64)
        np.cumsum(X.T, axis=1, out=prefix[:, 1:])
        return _Exact(prefix[:, A.hi] - prefix[:, A.lo], X.m * A.n, X.E)
    if isinstance(A, Explicit):
        N, e = _numerator(A.matrix.data if A.is_sparse else A.matrix)
        if A.is_sparse:
            N = sp.csr_array((N, A.matrix.indices, A.matrix.indptr), shape=A.shape)
        return _explicit(N, X, e)
    if isinstance(A, Diagonal):
        N, e = _numerator(A.d)
        return _scale(X, N[:, None], e)
    if isinstance(A, PIdentity):  # [diag(v); T diag(v)], v = fl(1 / d): the diagonal, then the dyadic T
        N, e = _numerator(1.0 / A.d)
        scaled = _scale(X, N[:, None], e)
        return _combine([scaled, _apply(Explicit(A.params), scaled)], stack=True)
    if isinstance(A, Weighted):
        N, e = _numerator(np.array([A.weight]))
        return _scale(_apply(A.base, X), N.reshape(1, 1), e)
    if isinstance(A, Kronecker):
        return _kron(A.factors, X)
    if isinstance(A, (VStack, Sum)):
        parts = [_apply(P, X) for P in (A.blocks if isinstance(A, VStack) else A.terms)]
        return _combine(parts, stack=isinstance(A, VStack))
    if isinstance(A, SubsetProducts):  # Marginals, Residuals: one weighted Kronecker product per subset
        factors = [[_subset_factor(F) for F in fs] for fs in A.factors]
        terms = [Weighted(Kronecker([fs[int(m)] for fs, m in zip(factors, row)]), float(w))
                 for row, w in zip(A.members, A.weights)]
        return _combine([_apply(t, X) for t in terms], stack=True)
    if isinstance(A, BlockDiagonal):
        J, _, cols = X.T.shape
        width, B = A.block.shape[1], A.copies
        head = X.T[:, : B * width].reshape(J, B, width, cols).transpose(0, 2, 1, 3).reshape(J, width, B * cols)
        Y = _apply(A.block, _Exact(head, X.m, X.E))
        rows = A.block.shape[0]
        T = Y.T.reshape(Y.T.shape[0], rows, B, cols).transpose(0, 2, 1, 3).reshape(Y.T.shape[0], B * rows, cols)
        parts = [_Exact(T, Y.m, Y.E)]
        if A.tail:
            parts.append(_Exact(X.T[:, B * width:], X.m, X.E))
        return _combine(parts, stack=True)
    if isinstance(A, TreeStrategy):
        rows = A.rows
        leaves = A.shape[1]
        X = X.ready(leaves)
        parts = []
        for d, w in zip(rows.level_ids, rows.weights):
            T = np.stack([np.rint(rows.tree.aggregate(d, X.T[j].astype(np.float64))).astype(np.int64)
                          for j in range(X.T.shape[0])])
            N, e = _numerator(np.array([w]))
            parts.append(_scale(_Exact(T, X.m * leaves, X.E), N.reshape(1, 1), e))
        return _combine(parts, stack=True)
    raise ExactUnsupported(f"no exact product for a {type(A).__name__} strategy (see hdmm.exact.quantize)")


#: A structured strategy (not Identity, Ones, Ranges, Explicit or Diagonal) of at most ``DENSE_NODE`` entries
#: and ``DENSE_COLUMNS`` columns, applied to at least ``DENSE_MIN_COLUMNS`` data vectors at once (or to any
#: number once its dense matrix exists), is applied as its exact dense matrix: formed once per strategy object
#: (its structured product on the identity, digits and exponent kept), then one float product per digit, on
#: the data's non-zeros when they are sparse. For many sparse units (blocks) this costs (rows x non-zero cells)
#: per unit instead of a pass through the structure.
DENSE_NODE = 2**22
DENSE_COLUMNS = 4096
DENSE_MIN_COLUMNS = 8
#: Data at most this dense (non-zero fraction) is multiplied as a sparse matrix.
_SPARSE_DATA = 0.05
_DENSE_CACHE: dict[int, tuple[Matrix, np.ndarray, int, int]] = {}
_DENSE_CACHE_SIZE = 8


def _densable(A: Matrix) -> bool:
    return (not isinstance(A, (Identity, Ones, Ranges, Explicit, Diagonal))
            and A.shape[1] <= DENSE_COLUMNS and A.shape[0] * A.shape[1] <= DENSE_NODE)


def _dense_digits(A: Matrix) -> tuple[np.ndarray, int, int]:
    """``A = 2**-E sum_j D_j 2**(16 j)`` exactly (normalised digits ``D_j``), made once per object: returns
    ``[D_0^T | D_1^T | ...]`` as one ``columns x (digits * rows)`` float array of integers, the digits and ``E``."""
    hit = _DENSE_CACHE.get(id(A))
    if hit is not None and hit[0] is A:
        return hit[1:]
    n = A.shape[1]
    D = _apply(A, _Exact(np.eye(n, dtype=np.int64)[None], 1, 0)).normalised()
    stacked = np.ascontiguousarray(np.hstack([D.T[j].T for j in range(D.T.shape[0])]).astype(np.float64))
    if len(_DENSE_CACHE) >= _DENSE_CACHE_SIZE:
        _DENSE_CACHE.pop(next(iter(_DENSE_CACHE)))
    _DENSE_CACHE[id(A)] = (A, stacked, D.T.shape[0], D.E)
    return stacked, D.T.shape[0], D.E


def _dense_product(A: Matrix, X: _Exact) -> _Exact:
    """``A X`` through ``A``'s exact dense digits: every digit pair's product is exact in float64, since each
    partial sum is an integer below ``2**16 * columns * X.m < 2**53`` (``X`` normalised first if needed)."""
    stacked, digits, E = _dense_digits(A)
    n, m = A.shape[1], A.shape[0]
    X = X.ready(2**_DIGIT * n)
    J, _, cols = X.T.shape
    out = np.zeros((digits + J - 1, m, cols), dtype=np.int64)
    for b in range(J):
        Xb = X.T[b]
        if np.count_nonzero(Xb) <= _SPARSE_DATA * Xb.size:
            P = sp.csr_array(Xb.T.astype(np.float64)) @ stacked  # cols x (digits * m), the non-zeros only
        else:
            P = Xb.T.astype(np.float64) @ stacked
        P = np.rint(P).astype(np.int64).reshape(cols, digits, m).transpose(1, 2, 0)
        out[b:b + digits] += P
    bound = min(digits, J) * 2**_DIGIT * n * X.m
    return _Exact(out, bound, E + X.E)


def _product(A: Matrix, X: _Exact) -> _Exact:
    """``A X`` exactly: through the dense digits of ``A`` (or of a weighted ``A``'s base) when that pays
    (:data:`DENSE_NODE`), else through its structure."""
    if isinstance(A, Weighted) and _densable(A.base):
        N, e = _numerator(np.array([A.weight]))
        return _scale(_product(A.base, X), N.reshape(1, 1), e)
    cached = _DENSE_CACHE.get(id(A), (None,))[0] is A
    if _densable(A) and (cached or X.T.shape[2] >= DENSE_MIN_COLUMNS):
        return _dense_product(A, X)
    return _apply(A, X)


def _explicit(N, X: _Exact, e: int) -> _Exact:
    """``N @ X`` for integer-valued ``N`` (dense or sparse), exponent ``+ e``; wide numerators in 16-bit chunks."""
    c = max(_row_sum(N), 1)
    if c * 2**_DIGIT >= _FLOAT_EXACT:  # (not after hdmm.exact.quantize: any other matrix of doubles)
        data = N.data if sp.issparse(N) else N
        if np.max(np.abs(data)) >= 2**_DIGIT:
            def one(C, Y):
                M = sp.csr_array((C, N.indices, N.indptr), shape=N.shape) if sp.issparse(N) else C
                return _explicit(M, Y, e)
            return _by_chunks(data, X, one)
    X = X.ready(c)
    return _Exact(_matmul_float(N, X, c), X.m * c, X.E + e)


def _kron(factors, X: _Exact) -> _Exact:
    J, _, cols = X.T.shape
    shape = [F.shape[1] for F in factors]
    for i, F in enumerate(factors):
        if isinstance(F, Identity):
            continue
        T = X.T.reshape([X.T.shape[0]] + shape + [cols])
        moved = np.moveaxis(T, i + 1, 1)
        rest = moved.shape[2:]
        flat = moved.reshape(moved.shape[0], shape[i], -1)
        Y = _apply(F, _Exact(flat, X.m, X.E))
        shape[i] = F.shape[0]
        back = Y.T.reshape((Y.T.shape[0], F.shape[0]) + rest)
        X = _Exact(np.ascontiguousarray(np.moveaxis(back, 1, i + 1)).reshape(Y.T.shape[0], -1, cols), Y.m, Y.E)
    return X


def _combine(parts: list[_Exact], stack: bool) -> _Exact:
    """Parts stacked (rows) or added, on a common exponent."""
    E = max(p.E for p in parts)
    parts = [p.shifted(E) for p in parts]
    if not stack:
        parts = [p.ready(len(parts), _INT_SAFE) for p in parts]
    J = max(p.T.shape[0] for p in parts)

    def padded(p):
        extra = J - p.T.shape[0]
        return p.T if not extra else np.concatenate([p.T, np.zeros((extra,) + p.T.shape[1:], dtype=np.int64)])

    m = max(p.m for p in parts)
    if stack:
        return _Exact(np.concatenate([padded(p) for p in parts], axis=1), m, E)
    return _Exact(sum(padded(p) for p in parts), m * len(parts), E)


def _check_counts(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if not np.all(x == np.floor(x)):
        i = int(np.flatnonzero(x != np.floor(x))[0])
        value, i = x.reshape(-1)[i], i % x.shape[-1]  # the index within its data vector
        raise ValueError(
            f"the data vector holds non-integer counts (e.g. {value!r} at index {i}); hdmm measures whole record "
            "counts exactly: round or aggregate the data to integers first"
        )
    if np.any(np.abs(x) >= 2**53):
        raise ValueError("the data vector holds counts of 2**53 or more, beyond exact integers")
    return x.astype(np.int64)


def exact_centres(A: Matrix, x, spacing: float) -> np.ndarray:
    r""":math:`\operatorname{round}(Ax/s)` exactly, for a dyadic strategy and integer counts (module docstring).

    Returns an int64 array, or an object array of Python ints if a centre is beyond ``2**61``.
    Rounding is half up (:math:`\lfloor v/s + 1/2 \rfloor`).

    Raises
    ------
    ValueError
        If ``x`` is not integer-valued or ``spacing`` is not a power of two.
    ExactUnsupported
        If ``A`` is not dyadic or has a structure without an exact product.
    """
    x = np.asarray(x)
    return exact_centres_many(A, x.reshape(1, -1), spacing)[0]


def exact_centres_many(A: Matrix, X, spacing: float) -> np.ndarray:
    r""":func:`exact_centres` of every row of ``X`` (``k x N`` counts) at once: ``k x rows``, the same numbers.

    The digits of all ``k`` data vectors go through the strategy's structure together (its columns
    axis), so many small units cost about one product each instead of one pass of Python each.
    """
    centres = _centres(A, X, spacing)
    if centres.dtype == object:
        top = max((abs(int(c)) for c in centres.ravel()), default=0)
        if top.bit_length() + math.frexp(spacing)[1] > 1020:
            raise ValueError(
                "the strategy's answers on this data vector overflow to infinity: the counts are too large for "
                "floating point; measure counts of at most hdmm.kernel.MAX_COUNT with a strategy of modest entries"
            )
    return centres


def _centres(A: Matrix, X, spacing: float) -> np.ndarray:
    """``round(A X^T / s)^T`` for the rows of ``X`` (``k x N``): ``k x rows``."""
    mantissa, exp = math.frexp(spacing) if math.isfinite(spacing) and spacing > 0 else (0.0, 0)
    if mantissa != 0.5:
        raise ValueError(f"the grid spacing must be a positive power of two, got {spacing!r}")
    k = 1 - exp  # spacing = 2**-k
    xi = _check_counts(X)
    big = int(np.max(np.abs(xi))) if xi.size else 0
    X = _Exact(xi.T.reshape(1, xi.shape[1], xi.shape[0]), max(big, 1), 0)
    Y = _product(A, X)
    h = Y.E - k
    if h <= 0:
        Y = Y.normalised()
        return _digits_to_int(Y.T, -h).T
    Y = Y.normalised()
    q, r = divmod(h - 1, _DIGIT)
    T = Y.T
    if T.shape[0] <= q:
        T = np.concatenate([T, np.zeros((q + 1 - T.shape[0],) + T.shape[1:], dtype=np.int64)])
    T = T.copy()
    T[q] += 1 << r  # + 2**(h - 1)
    Y = _Exact(T, 2**(_DIGIT + 1), Y.E)
    Y = Y.normalised()
    q, r = divmod(h, _DIGIT)
    digits = Y.T[q:] if Y.T.shape[0] > q else np.zeros((1,) + Y.T.shape[1:], dtype=np.int64)
    return _floor_shift(digits, r).T


def _digits_to_int(digits: np.ndarray, shift: int) -> np.ndarray:
    """``sum_j digits[j] 2**(16 j) * 2**shift`` (normalised digits), int64 if it fits."""
    digits = _trim(digits)
    if _DIGIT * digits.shape[0] + shift <= 61:
        out = np.zeros(digits.shape[1:], dtype=np.int64)
        for j in range(digits.shape[0] - 1, -1, -1):
            out = (out << _DIGIT) + digits[j]
        return out << shift
    out = np.zeros(digits.shape[1:], dtype=object)
    for j in range(digits.shape[0] - 1, -1, -1):
        out = out * (1 << _DIGIT) + digits[j].astype(object)
    return out * (1 << shift)


def _trim(digits: np.ndarray) -> np.ndarray:
    """Normalised digits without the top digits that only extend the sign (a 0 above a digit below
    ``2**15``, a -1 above one at least ``2**15``, in every entry): the same values, in fewer digits."""
    while digits.shape[0] > 1:
        top, below = digits[-1], digits[-2]
        if not np.all(((top == 0) & (below < 2**(_DIGIT - 1))) | ((top == -1) & (below >= 2**(_DIGIT - 1)))):
            break
        digits = np.concatenate([digits[:-2], (below + top * 2**_DIGIT)[None]])  # the new top digit is signed
    return digits


def _floor_shift(digits: np.ndarray, r: int) -> np.ndarray:
    """``floor(sum_j digits[j] 2**(16 j) / 2**r)`` for normalised digits."""
    digits = _trim(digits)
    if _DIGIT * digits.shape[0] <= 61:
        return _digits_to_int(digits, 0) >> r
    J = digits.shape[0]
    if J <= 4 and _DIGIT * J - r <= 62:  # in int64: the top (signed) digit shifted, plus the low digits' floor
        low = _digits_to_int(digits[:-1], 0)  # the low digits are all unsigned: 0 <= low < 2**48
        return (digits[-1] << (_DIGIT * (J - 1) - r)) + (low >> r)
    value = _digits_to_int(digits, 0)
    return np.vectorize(lambda v: v >> r, otypes=[object])(value)


def on_grid_exact(centres: np.ndarray, spacing: float, noise: np.ndarray) -> np.ndarray:
    r""":math:`s\,(c + z)` as doubles: the integer :math:`c + z` computed exactly, then converted once.

    Every released number is the double nearest :math:`s(c+z)` (exactly it below :math:`2^{53}`),
    a function of the noisy integer alone.
    """
    noise = np.asarray(noise, dtype=np.int64)
    if centres.dtype == np.int64 and np.all(np.abs(centres) < 2**61) and np.all(np.abs(noise) < 2**61):
        return (centres + noise).astype(np.float64) * spacing
    return np.array([float(int(c) + int(z)) for c, z in zip(centres, noise)], dtype=np.float64) * spacing

