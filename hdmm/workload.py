r"""Workloads: the queries an analyst or agency wants answered.

One-attribute building blocks (each an implicit :class:`~hdmm.matrix.Matrix` over ``n`` values):
:func:`Total`, :class:`~hdmm.matrix.Identity`, :func:`IdentityTotal`, :class:`Prefix`,
:class:`AllRange`, :func:`WidthKRange`, :class:`Ranges` and :func:`Predicates`. Multi-attribute
workloads are Kronecker products of blocks (:func:`product`), unions of weighted products
(:func:`union`), and marginals (:class:`~hdmm.marginals.Marginals` and friends).

Range Grams have closed forms. For all ``n(n+1)/2`` ranges :math:`[a, b)` the number of
ranges covering both cells ``i`` and ``j`` is

.. math:: (W^T W)_{ij} = (\min(i, j) + 1)\,(n - \max(i, j)),

and for the ``n`` prefixes :math:`[0, b)` it is :math:`n - \max(i, j)`. Both multiply a vector
in :math:`O(n)` with cumulative sums.
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Callable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from .domain import Domain
from .marginals import AllMarginals, DimKMarginals, Marginal, Marginals, as_domain
from .matrix import Explicit, Identity, Kronecker, KronVector, Matrix, Ones, VStack
from .labels import value_label
from .validation import check_dense_size, check_norm, positive_int
from .spectral import Spectrum

#: ``Ranges.gram()`` is a sparse matrix while the ranges' squared lengths sum to at most this
#: (an upper bound on its non-zeros), else implicit (:class:`RangesGram`).
SPARSE_GRAM_ENTRIES = 2**24

__all__ = [
    "Total",
    "Identity",
    "IdentityTotal",
    "Ranges",
    "Prefix",
    "AllRange",
    "WidthKRange",
    "Predicates",
    "PrefixGram",
    "AllRangeGram",
    "RangesGram",
    "Marginal",
    "Marginals",
    "DimKMarginals",
    "AllMarginals",
    "product",
    "union",
]


def Total(n: int) -> Ones:
    """The single query counting every value of an ``n``-valued attribute."""
    return Ones(1, n)


def IdentityTotal(n: int) -> VStack:
    """One query per value plus the total (``n + 1`` queries)."""
    return VStack([Identity(n), Total(n)])


def _range_label(lo: int, hi: int, n: int, name: str | None, values: Sequence | None) -> str | None:
    name = name or "value"
    if lo == 0 and hi == n:
        return None
    if hi - lo == 1:
        return f"{name}={value_label(values, lo)}"
    if values is None:
        return f"{name} in [{lo}, {hi})"
    return f"{name} in {value_label(values, lo)}..{value_label(values, hi - 1)}"


class Ranges(Matrix):
    """Interval counting queries ``[lo, hi)`` over an ordered attribute with ``n`` values.

    ``A @ x`` takes differences of prefix sums (``O(n + m)``), ``A^T @ y`` accumulates a
    difference array; the Gram is sparse.
    """

    def __init__(self, n: int, intervals: Sequence[tuple[int, int]] | np.ndarray):
        self.n = positive_int(n, "n")
        bounds = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
        if bounds.shape[0] == 0:
            raise ValueError("Ranges needs at least one interval")
        lo, hi = bounds[:, 0], bounds[:, 1]
        bad = (lo < 0) | (hi > self.n) | (lo >= hi)
        if np.any(bad):
            first = bounds[np.flatnonzero(bad)[0]]
            raise ValueError(
                f"interval [{first[0]}, {first[1]}) is not a non-empty half-open range inside [0, {self.n})"
            )
        self._lo, self._hi = lo, hi
        self.shape = (bounds.shape[0], self.n)

    @property
    def lo(self) -> np.ndarray:
        return self._lo

    @property
    def hi(self) -> np.ndarray:
        return self._hi

    def _matmat(self, X):
        prefix = np.zeros((self.n + 1, X.shape[1]))
        np.cumsum(X, axis=0, out=prefix[1:])
        return prefix[self.hi] - prefix[self.lo]

    def _rmatmat(self, Y):
        diff = np.zeros((self.n + 1, Y.shape[1]))
        np.add.at(diff, self.lo, Y)
        np.subtract.at(diff, self.hi, Y)
        return np.cumsum(diff[:-1], axis=0)

    def sparse(self) -> sp.csr_array:
        """The 0/1 query matrix as a scipy sparse array."""
        lengths = self.hi - self.lo
        check_dense_size(int(lengths.sum()), 1, "the sparse form of these ranges", 2**27)
        rows = np.repeat(np.arange(self.shape[0]), lengths)
        cols = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths) + np.repeat(self.lo, lengths)
        return sp.csr_array((np.ones(rows.size), (rows, cols)), shape=self.shape)

    def gram(self):
        r"""``S^T S`` as a sparse matrix while that stays small (short ranges: banded), else
        implicit (:class:`RangesGram`): many long ranges make it dense, and forming it sparsely
        would take :math:`\sum_r \mathrm{len}_r^2` work."""
        lengths = (self.hi - self.lo).astype(float)
        if float(lengths @ lengths) > SPARSE_GRAM_ENTRIES:
            return RangesGram(self)
        S = self.sparse()
        return Explicit((S.T @ S).tocsr())

    def _coverage(self) -> np.ndarray:
        diff = np.zeros(self.n + 1)
        np.add.at(diff, self.lo, 1.0)
        np.subtract.at(diff, self.hi, 1.0)
        return np.cumsum(diff[:-1])

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(self._coverage())

    def quadratic_diag(self, X):
        # sum over a square block of X, from its 2-D prefix sums
        C = np.zeros((self.n + 1, self.n + 1))
        C[1:, 1:] = np.cumsum(np.cumsum(X, axis=0), axis=1)
        lo, hi = self.lo, self.hi
        return C[hi, hi] - C[lo, hi] - C[hi, lo] + C[lo, lo]

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, f"dense() of {type(self).__name__}", max_entries)
        out = np.zeros(self.shape)
        cols = np.arange(self.n)
        for r, (a, b) in enumerate(zip(self.lo, self.hi)):
            out[r, (cols >= a) & (cols < b)] = 1.0
        return out

    def describe(self, row, name=None, values=None):
        return _range_label(int(self.lo[row]), int(self.hi[row]), self.n, name, values)

    def __repr__(self):
        return f"{type(self).__name__}(n={self.n}, {self.shape[0]:,} ranges)"

    @cached_property
    def _digest(self) -> bytes:
        """The intervals' fingerprint (a hash of their end points, computed once)."""
        return hashlib.sha256(np.ascontiguousarray(np.stack([self.lo, self.hi]), dtype=np.int64).tobytes()).digest()

    def _key(self):
        return (type(self).__name__, self.n, self._digest)


class _SymmetricStructured(Matrix):
    """A symmetric ``n x n`` matrix with a closed-form entry formula and an O(n) product."""

    def __init__(self, n: int):
        self.n = positive_int(n, "n")
        self.shape = (self.n, self.n)

    def _rmatmat(self, Y):
        return self._matmat(Y)

    @property
    def T(self):
        return self

    def trace(self):
        return float(np.sum(self.diag()))

    def _key(self):
        return (type(self).__name__, self.n)


class RangesGram(_SymmetricStructured):
    r"""Gram of interval queries, kept implicit: :math:`G_{ij} = \#\{r : lo_r \le \min(i,j),\ \max(i,j) < hi_r\}`.

    A product is the intervals' own two products (prefix sums, then a difference array),
    :math:`O((n + m)k)` for ``k`` vectors; ``dense()`` counts the intervals by their two ends
    and sums the counts over the corner :math:`lo \le i`, :math:`hi > j` (:math:`O(n^2 + m)`).
    """

    def __init__(self, ranges: Ranges):
        super().__init__(ranges.n)
        self.ranges = ranges

    def _matmat(self, X):
        return self.ranges._rmatmat(self.ranges._matmat(X))

    def diag(self):
        return self.ranges.column_norm_powers(2).to_array()

    def dense(self, max_entries=None):
        n = self.n
        check_dense_size(n, n, "dense() of a RangesGram", max_entries)
        counts = np.zeros((n + 1, n + 1))
        np.add.at(counts, (self.ranges.lo, self.ranges.hi), 1.0)
        # corner[a, b] = #{r : lo_r <= a, hi_r >= b}; G_ij = corner[i, j + 1] for i <= j
        corner = np.cumsum(np.cumsum(counts[:, ::-1], axis=1)[:, ::-1], axis=0)
        upper = np.triu(corner[:n, 1:])
        return upper + np.triu(upper, 1).T

    def __repr__(self):
        return f"RangesGram(n={self.n}, {self.ranges.shape[0]:,} ranges)"

    def _key(self):
        return ("RangesGram", self.ranges._key())


class PrefixGram(_SymmetricStructured):
    r"""Gram of the prefix workload: :math:`G_{ij} = n - \max(i, j)`.

    :math:`G = P^TP` for the prefix-sum matrix ``P``, so :math:`Gx` is a cumulative sum followed
    by a reversed one: :math:`(Gx)_i = \sum_{k \ge i} \sum_{j \le k} x_j`.
    """

    def _matmat(self, X):
        Y = np.cumsum(X, axis=0)
        np.cumsum(Y[::-1], axis=0, out=Y[::-1])  # then the reverse cumulative sum, in place
        return Y

    def diag(self):
        return self.n - np.arange(self.n, dtype=float)

    def spectrum(self):
        return Spectrum.sine(self.n, "prefix")

    def dense(self, max_entries=None):
        check_dense_size(self.n, self.n, "dense() of a PrefixGram", max_entries)
        i = np.arange(self.n)
        return (self.n - np.maximum.outer(i, i)).astype(float)


class AllRangeGram(_SymmetricStructured):
    r"""Gram of all ranges: :math:`G_{ij} = (\min(i,j) + 1)(n - \max(i,j))`.

    :math:`(Gx)_i = (n - i) \sum_{j \le i} (j + 1) x_j + (i + 1) \sum_{j > i} (n - j) x_j`.
    """

    def _matmat(self, X):
        n = self.n
        idx = np.arange(n, dtype=float)[:, None]
        head = np.cumsum((idx + 1) * X, axis=0)
        tail = np.cumsum(((n - idx) * X)[::-1], axis=0)[::-1]
        tail = np.vstack([tail[1:], np.zeros((1, X.shape[1]))])
        return (n - idx) * head + (idx + 1) * tail

    def diag(self):
        i = np.arange(self.n, dtype=float)
        return (i + 1) * (self.n - i)

    def spectrum(self):
        return Spectrum.sine(self.n, "allrange")

    def dense(self, max_entries=None):
        check_dense_size(self.n, self.n, "dense() of an AllRangeGram", max_entries)
        i = np.arange(self.n)
        return ((np.minimum.outer(i, i) + 1) * (self.n - np.maximum.outer(i, i))).astype(float)


class Prefix(Ranges):
    """The ``n`` prefix queries ``[0, b)``, ``b = 1..n`` (the empirical CDF)."""

    def __init__(self, n: int):
        n = positive_int(n, "n")
        hi = np.arange(1, n + 1)
        super().__init__(n, np.column_stack([np.zeros(n, dtype=np.int64), hi]))

    def _matmat(self, X):
        return np.cumsum(X, axis=0)

    def _rmatmat(self, Y):
        return np.cumsum(Y[::-1], axis=0)[::-1]

    def gram(self):
        return PrefixGram(self.n)

    def _coverage(self):
        return self.n - np.arange(self.n, dtype=float)

    def _key(self):
        return ("Prefix", self.n)


class AllRange(Ranges):
    """All ``n(n+1)/2`` range queries ``[a, b)``, ordered by ``a`` then ``b``.

    The interval list is generated only when queries are evaluated; the Gram is closed form.
    """

    def __init__(self, n: int):
        self.n = positive_int(n, "n")
        self.shape = (self.n * (self.n + 1) // 2, self.n)

    @cached_property
    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.triu_indices(self.n + 1, k=1)
        return lo.astype(np.int64), hi.astype(np.int64)

    @property
    def lo(self):
        return self._bounds[0]

    @property
    def hi(self):
        return self._bounds[1]

    def gram(self):
        return AllRangeGram(self.n)

    def _coverage(self):
        i = np.arange(self.n, dtype=float)
        return (i + 1) * (self.n - i)

    def _key(self):
        return ("AllRange", self.n)


def WidthKRange(n: int, k: int) -> Ranges:
    """All ``n - k + 1`` ranges of exactly ``k`` consecutive values (sliding windows)."""
    n = positive_int(n, "n")
    k = positive_int(k, "k")
    if k > n:
        raise ValueError(f"window width k={k} is larger than the attribute size n={n}")
    lo = np.arange(n - k + 1)
    return Ranges(n, np.column_stack([lo, lo + k]))


def Predicates(matrix, labels: Sequence[str] | None = None) -> Explicit:
    """Arbitrary predicate counting queries over one attribute: a 0/1 matrix, one row per query.

    ``labels`` (one per row) name the predicates in query labels.
    """
    M = Explicit(matrix, labels=labels)
    values = M.matrix.data if M.is_sparse else M.matrix
    if not np.all((values == 0) | (values == 1)):
        raise ValueError("predicate queries must be 0/1 matrices; use Explicit for weighted queries")
    return M


# ====================================================================== multi-attribute
def attribute_factors(
    domain: Domain, blocks: Mapping[str | int, Matrix], default: Callable[[int], Matrix]
) -> list[Matrix]:
    """One factor per attribute of ``domain``: ``blocks`` by name or position, ``default(n)`` elsewhere.

    Checks that every block is an hdmm matrix with one column per value of its attribute and
    that no attribute is named twice.
    """
    chosen: dict[int, Matrix] = {}
    for attr, block in blocks.items():
        i = domain.index(attr)
        name = domain.names[i]
        if i in chosen:
            raise ValueError(f"attribute {name!r} is given twice")
        if not isinstance(block, Matrix):
            raise TypeError(f"the matrix for {name!r} must be an hdmm matrix, got {type(block).__name__}")
        if block.shape[1] != domain.shape[i]:
            raise ValueError(
                f"the matrix for {name!r} has {block.shape[1]} columns but the attribute has {domain.shape[i]} values"
            )
        chosen[i] = block
    return [chosen.get(i, default(n)) for i, n in enumerate(domain.shape)]


def product(domain: Domain | Sequence[int], blocks: Mapping[str | int, Matrix], sep: str = " & ") -> Kronecker:
    """The Kronecker product of per-attribute blocks over ``domain``; unnamed attributes get Total.

    ``product(domain, {"sex": Identity(2), "age": Prefix(115)})`` counts, for each sex, the people
    at most each age. Labels read like ``sex=female & age in [0, 18)``.
    """
    domain = as_domain(domain)
    factors = attribute_factors(domain, blocks, Total)
    values = [domain.values(name) if domain.has_labels(name) else None for name in domain.names]
    return Kronecker(factors, names=domain.names, values=values, sep=sep)


def union(parts: Sequence[Matrix], weights: Sequence[float] | None = None, names: Sequence[str] | None = None) -> Matrix:
    """The union ``VStack_j w_j W_j`` of workloads over the same domain (weights default to 1).

    A weight says how much a part matters to the optimizer (its error counts ``w_j^2`` times);
    a release answers the parts' queries themselves (see :func:`unweighted`). Weights must be
    finite and >= 0 (weight 0: the optimizer ignores the part; a release still answers it if the
    strategy supports it).
    """
    return VStack(list(parts), names=names, weights=weights)


def unweighted(W: Matrix) -> tuple[Matrix, np.ndarray | None]:
    """The queries of a workload without the weights of :func:`union`, and each row's weight.

    Weights steer the optimizer only: a release answers ``W_j x``, not ``w_j W_j x``. Returns
    ``(queries, row_weights)`` with ``row_weights`` ``None`` when ``W`` carries no union weights
    other than 1 (nested unions multiply their weights).

    >>> import hdmm
    >>> W = hdmm.union([hdmm.Total(3), hdmm.Identity(3)], weights=[2.0, 1.0])
    >>> Q, w = unweighted(W)
    >>> Q @ np.ones(3), w
    (array([3., 1., 1., 1.]), array([2., 1., 1., 1.]))
    """
    if not isinstance(W, VStack):
        return W, None
    inner = [unweighted(p) for p in W.parts]
    if W.weights is None and all(w is None for _, w in inner):
        return W, None
    outer = W.weights or (1.0,) * len(W.parts)
    rows = np.concatenate([
        c * (np.ones(q.shape[0]) if w is None else w) for c, (q, w) in zip(outer, inner)
    ])
    queries = VStack([q for q, _ in inner], names=W.names)
    return (queries, None) if np.all(rows == 1.0) else (queries, rows)
