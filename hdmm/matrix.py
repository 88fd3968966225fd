"""Implicit matrices: workloads and strategies that are never formed densely.

Every class here represents an ``m x n`` real matrix by its structure and supports

* ``A @ x`` for a vector ``x`` (shape ``(n,)``) or a block of vectors (shape ``(n, k)``),
  and ``y @ A`` from the left; ``A @ B`` with another implicit matrix gives their lazy product;
* ``A.T`` (lazy transpose), ``A.gram()`` (``A^T A``, kept implicit),
  ``A.sensitivity(p)`` (largest column ``L_p`` norm, ``p`` in {1, 2}), ``A.trace()``,
  ``A.diag()``, ``A.pinv()``, ``A.dense()`` and ``A.to_linear_operator()``.

The structure rules are those of docs/math.md, section 2: for ``A = A_1 (x) ... (x) A_d``

    A^T A = (x)_i A_i^T A_i,   A^+ = (x)_i A_i^+,   tr(A) = prod_i tr(A_i),

column norms multiply, and ``A @ x`` applies each factor along its own axis of ``x`` reshaped
to an ``(n_1, ..., n_d)`` tensor (C order: first factor most significant), at a cost of about
``N * sum_i m_i`` instead of ``N^2``.

Matrices opt out of numpy's operator dispatch (``__array_ufunc__ = None``), so
``ndarray @ Matrix`` and ``numpy scalar * Matrix`` reach the methods here instead of being
turned into numpy object arrays.
"""

from __future__ import annotations

import heapq
import itertools
import math
import numbers
import operator
from functools import reduce
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from .spectral import Spectrum
from .labels import LabelSequence, describe_row, value_label
from .validation import DENSE_LIMIT, DenseLimitError, check_dense_size, check_norm, positive_int

__all__ = [
    "DENSE_LIMIT",
    "DenseLimitError",
    "norm_powers",
    "SINGULAR_RTOL",
    "UNDERFLOW_MESSAGE",
    "Matrix",
    "Explicit",
    "Identity",
    "Ones",
    "Diagonal",
    "Kronecker",
    "VStack",
    "Weighted",
    "Sum",
    "Product",
    "Transpose",
    "LabelSequence",
    "cheap_pinv",
]


#: Largest factor (in entries, rows x columns) whose pseudo-inverse counts as cheap to form
#: densely; identities, totals, diagonals and other structural pseudo-inverses are cheap at any size.
CHEAP_PINV_ENTRIES = 2**24


def cheap_pinv(f: Matrix) -> bool:
    """Whether the pseudo-inverse of ``f`` is structural, or small enough to form densely."""
    return f.fast_pinv or f.shape[0] * f.shape[1] <= CHEAP_PINV_ENTRIES


def _is_scalar(value: object) -> bool:
    return isinstance(value, numbers.Number) or (isinstance(value, np.ndarray) and value.ndim == 0)


class Matrix:
    """Base class of all implicit matrices.

    Subclasses set ``shape`` and implement ``_matmat`` (``A @ X`` for a 2-D block ``X``) and
    ``_rmatmat`` (``A^T @ Y``); every other operation has a structural override where the
    structure allows, or a dense fall-back that refuses matrices above ``DENSE_LIMIT``.
    """

    __array_ufunc__ = None
    shape: tuple[int, int]
    #: Whether :meth:`pinv` is structural and cheap at any size (reconstruction uses it directly).
    fast_pinv: bool = False

    # ------------------------------------------------------------------ products with arrays
    def _matmat(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _rmatmat(self, Y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __matmul__(self, other):
        if isinstance(other, Matrix):
            return _multiply(self, other)
        if _is_scalar(other):
            raise TypeError("use * to scale a matrix by a number; @ is the matrix product")
        X = np.asarray(other, dtype=np.float64)
        if X.ndim not in (1, 2) or X.shape[0] != self.shape[1]:
            raise ValueError(
                f"cannot multiply a {self.shape[0]:,} x {self.shape[1]:,} matrix by an array of "
                f"shape {X.shape}: expected ({self.shape[1]:,},) or ({self.shape[1]:,}, k)"
            )
        if X.ndim == 1:
            return self._matmat(X[:, None])[:, 0]
        return self._matmat(X)

    def __rmatmul__(self, other):
        if _is_scalar(other):
            raise TypeError("use * to scale a matrix by a number; @ is the matrix product")
        Y = np.asarray(other, dtype=np.float64)
        if Y.ndim not in (1, 2) or Y.shape[-1] != self.shape[0]:
            raise ValueError(
                f"cannot multiply an array of shape {Y.shape} by a {self.shape[0]:,} x "
                f"{self.shape[1]:,} matrix"
            )
        if Y.ndim == 1:
            return self._rmatmat(Y[:, None])[:, 0]
        return self._rmatmat(Y.T).T

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """``A @ x``."""
        return self @ x

    def rmatvec(self, y: np.ndarray) -> np.ndarray:
        """``A^T @ y``."""
        return self.T @ y

    # ------------------------------------------------------------------ algebra
    def __mul__(self, other):
        if _is_scalar(other):
            return Weighted(self, float(other))
        return NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, other):
        if _is_scalar(other):
            return Weighted(self, 1.0 / float(other))
        return NotImplemented

    def __neg__(self):
        return Weighted(self, -1.0)

    def __add__(self, other):
        if isinstance(other, Matrix):
            return Sum([self, other])
        return NotImplemented

    def __sub__(self, other):
        if isinstance(other, Matrix):
            return Sum([self, -other])
        return NotImplemented

    @property
    def T(self) -> Matrix:
        """The (lazy) transpose."""
        return Transpose(self)

    def gram(self) -> Matrix:
        """``A^T A``, kept implicit."""
        return Product(self.T, self)

    # ------------------------------------------------------------------ norms and traces
    def column_norm_powers(self, p: int) -> KronVector:
        r"""The vector of :math:`\sum_i |a_{ij}|^p` over rows, one entry per column.

        Returned as a :class:`KronVector` (a sum of Kronecker products of short vectors), so
        that a Kronecker strategy over a huge domain never forms a length-``N`` vector.
        """
        check_norm(p)
        A = self.dense()
        return KronVector.from_array(norm_powers(A, p).sum(axis=0))

    def sensitivity(self, p: int = 1) -> float:
        r"""Largest column :math:`L_p` norm, :math:`\Delta_p(A) = \max_j \|a_{:,j}\|_p`.

        ``p = 1`` calibrates Laplace noise (pure DP), ``p = 2`` Gaussian noise.
        """
        check_norm(p)
        return float(self.column_norm_powers(p).max() ** (1.0 / p))

    def column_support(self) -> int:
        r"""An upper bound on the number of answers that one cell's count can move: :math:`\max_j |\{i : a_{ij} \ne 0\}|`.

        A change of cell :math:`j` moves answer :math:`i` only when :math:`a_{ij} \ne 0`, provided
        the product computes each answer from the cells in its row's support alone (so that a zero
        coefficient contributes exactly nothing). The grid's rounding bound counts these answers
        only (:func:`hdmm.noise.rounding_bound`; docs/privacy.md). The default, the number of rows,
        is always valid; structures whose products have this property override it (an exact
        Python int, however large the domain).
        """
        return int(self.shape[0])

    def _check_square(self, what: str) -> None:
        if self.shape[0] != self.shape[1]:
            raise ValueError(f"{what} needs a square matrix, got shape {self.shape}")

    def diag(self) -> np.ndarray:
        """The diagonal of a square matrix."""
        self._check_square("diag()")
        return np.diagonal(self.dense()).copy()

    def trace(self) -> float:
        """The trace of a square matrix."""
        self._check_square("trace()")
        return float(np.sum(self.diag()))

    def spectrum(self) -> Spectrum | None:
        r"""A fast eigendecomposition :math:`Q\,\mathrm{diag}(\lambda)\,Q^T` of this symmetric matrix.

        ``None`` unless the structure gives one without a dense eigensolver: the prefix and
        all-range Grams (:mod:`hdmm.spectral`), their multiples, and sums of terms in one basis
        plus multiples of the identity (e.g. the Gram of prefixes stacked on the identity).
        """
        return None

    def pinv(self) -> Matrix:
        """The Moore-Penrose pseudo-inverse.

        Structural for explicit, identity, all-ones, diagonal, Kronecker, weighted and
        transposed matrices; other compositions fall back to a dense pseudo-inverse when small
        and raise :class:`DenseLimitError` otherwise (reconstruct with LSMR instead).
        """
        return Explicit(np.linalg.pinv(self.dense(), rcond=SINGULAR_RTOL))

    def quadratic_diag(self, X: np.ndarray) -> np.ndarray:
        """``diag(A X A^T)`` for a small dense symmetric ``X`` (``n x n``).

        The per-query variance of a workload factor: structured workloads override this to
        avoid forming ``A`` (ranges use 2-D prefix sums of ``X``).
        """
        A = self.dense()
        return np.einsum("ij,ij->i", A @ X, A)

    # ------------------------------------------------------------------ conversions
    def dense(self, max_entries: int | None = None) -> np.ndarray:
        """The matrix as a dense numpy array; refuses above ``max_entries`` (default ``DENSE_LIMIT``)."""
        m, n = self.shape
        check_dense_size(m, n, f"dense() of a {type(self).__name__}", max_entries)
        return self._matmat(np.eye(n))

    def to_linear_operator(self) -> LinearOperator:
        """A ``scipy.sparse.linalg.LinearOperator`` view (for LSMR, eigsh, ...)."""
        return LinearOperator(
            shape=self.shape,
            dtype=np.float64,
            matvec=lambda v: self._matmat(np.asarray(v, dtype=float).reshape(-1, 1))[:, 0],
            rmatvec=lambda v: self._rmatmat(np.asarray(v, dtype=float).reshape(-1, 1))[:, 0],
            matmat=lambda X: self._matmat(np.asarray(X, dtype=float)),
            rmatmat=lambda Y: self._rmatmat(np.asarray(Y, dtype=float)),
        )

    # ------------------------------------------------------------------ labels
    def describe(self, row: int, name: str | None = None, values: Sequence | None = None) -> str | None:
        """A readable predicate for query ``row`` of a one-attribute matrix.

        ``name`` and ``values`` are the attribute's name and value labels when known. Returns
        ``None`` when the query places no condition on the attribute (a total).
        """
        return f"{name or 'query'}[{row}]"

    @property
    def labels(self) -> LabelSequence:
        """Readable labels of the rows, computed lazily one at a time."""
        return LabelSequence(self.shape[0], lambda i: self.describe(i) or "total")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(shape={self.shape})"

    def _key(self):
        """A hashable key: equal keys mean equal matrices (used to share work, and by ``==`` and ``hash``).

        By default the object's identity. Building blocks fixed by a few parameters (``Identity(n)``,
        ``Ones(m, n)``, ``Prefix(n)``, ...) key by their class and parameters, and products and weights
        by their parts' keys, so that equal ones built separately compare equal; never by dense content.
        """
        return id(self)

    def __eq__(self, other: object) -> bool:
        """Equality by :meth:`_key` within one class: by value for keyed building blocks, else identity."""
        if self is other:
            return True
        if not isinstance(other, Matrix):
            return NotImplemented
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


# ====================================================================== Kronecker vectors
#: Axes on which every term's vector is constant to this relative tolerance are folded into the
#: coefficients at the vector's maximum: the largest entry is then overestimated by at most this
#: fraction (never underestimated), so a sensitivity stays valid for calibration.
FOLD_RTOL = 1e-12

#: Largest (terms x cells) a maximum is evaluated over by enumeration, after folding constant
#: axes and merging equal column classes.
MAX_ENUMERATION = 2**22

#: Branching steps (each over one axis's values for one partial choice) the branch-and-bound
#: search for a maximum may take before it returns its upper bound instead of the exact value
#: (a step costs terms x axis size; the whole search stays well under a second).
MAX_SEARCH_STEPS = 20_000


#: Singular values below this fraction of the largest are treated as zero by every dense pseudo-inverse:
#: reconstruction (:meth:`Matrix.pinv`) and the error computations (whose Gram eigenvalues are cut at
#: its square, :data:`hdmm.traces.PINV_RCOND`) must drop the same directions, or reported standard
#: errors would leave out the noise that reconstruction amplifies along them.
SINGULAR_RTOL = 1e-5

#: Why a strategy whose column norm powers leave the normal floating-point range is refused.
UNDERFLOW_MESSAGE = (
    "the strategy's column norms underflow (entries or weights so small that their powers or products fall below "
    "2.2e-308, where floats keep few or no significant bits): its sensitivity cannot be computed reliably, and noise "
    "calibrated to it could be far too small; scale the strategy up (the mechanism's error does not depend on its "
    "scale)")


_TINY = np.finfo(float).tiny


def _underflowed(results: np.ndarray, nonzero: np.ndarray | bool) -> bool:
    """Whether any result of non-zero inputs is zero or subnormal."""
    results = np.abs(results)
    if results.size == 0 or results.min() >= _TINY:  # the usual case, in one pass
        return False
    return bool(np.any(np.logical_and(nonzero, results < _TINY)))


def norm_powers(values, p: int) -> np.ndarray:
    r""":math:`|v|^p` entrywise, refusing (``ValueError``) any non-zero entry whose power underflows.

    Column norm powers feed the sensitivity, which calibrates the noise: a power that underflows to
    zero or to a subnormal float would make the sensitivity too low.
    """
    values = np.asarray(values, dtype=float)
    powers = np.abs(values) ** p
    if _underflowed(powers, values != 0.0):
        raise ValueError(UNDERFLOW_MESSAGE)
    return powers


class KronVector:
    r"""A non-negative vector stored as a sum of Kronecker products of short vectors.

    :math:`v = \sum_t c_t\, v_{t,1} \otimes v_{t,2} \otimes \dots \otimes v_{t,d}`, all terms over
    the same axis sizes ``(n_1, ..., n_d)`` and every coefficient and entry non-negative. Column
    norm powers of Kronecker strategies and of their unions have this form (docs/math.md,
    section 2.3). The vectors are stored factored: per axis the distinct vectors (rows of a
    2-D array) and a ``(terms, d)`` index, so a union of many Kronecker products over many
    attributes costs what its factors cost, never a length-``N`` vector.

    :meth:`max` finds the largest entry at any ``N``: exactly when the structure allows (one
    term; axes constant for every term; few column classes left; a branch-and-bound search
    within its budget), else a valid upper bound (:meth:`max_bounds`).

    Examples
    --------
    Two terms over 100 attributes of 10 values (:math:`10^{100}` cells), one varying on the
    first attribute and one on the last:

    >>> from functools import reduce
    >>> ramp, flat = KronVector.from_array(np.arange(1.0, 11.0)), KronVector.from_array(np.ones(10))
    >>> first = reduce(KronVector.kron, [ramp] + [flat] * 99)
    >>> last = reduce(KronVector.kron, [flat] * 99 + [ramp])
    >>> (first + last.scale(2.0)).max()
    30.0
    """

    def __init__(self, sizes: tuple[int, ...], terms: list[tuple[float, tuple[np.ndarray, ...]]]):
        sizes = tuple(int(s) for s in sizes)
        d = len(sizes)
        weights = np.array([float(w) for w, _ in terms], dtype=float)
        vectors: list[list[np.ndarray]] = [[] for _ in range(d)]
        index = np.zeros((len(terms), d), dtype=np.intp)
        seen: list[dict] = [{} for _ in range(d)]
        for t, (_, vs) in enumerate(terms):
            if len(vs) != d:
                raise ValueError(f"a term has {len(vs)} vectors for {d} axes")
            for i, v in enumerate(vs):
                key = id(v)
                if key not in seen[i]:
                    seen[i][key] = len(vectors[i])
                    vectors[i].append(v)
                index[t, i] = seen[i][key]
        rows = [np.array([np.broadcast_to(np.asarray(v, dtype=float), (n,)) for v in vs], dtype=float).reshape(-1, n)
                for vs, n in zip(vectors, sizes)]
        self._setup(sizes, weights, rows, index)

    @classmethod
    def factored(cls, sizes: Sequence[int], weights: np.ndarray, rows: Sequence[np.ndarray],
                 index: np.ndarray) -> KronVector:
        """Build from per-axis distinct vectors (``rows[i]``, shape ``(k_i, n_i)``) and an index.

        Term ``t`` is ``weights[t] * (x)_i rows[i][index[t, i]]``.
        """
        self = cls.__new__(cls)
        self._setup(tuple(int(s) for s in sizes), np.asarray(weights, dtype=float),
                    [np.asarray(r, dtype=float) for r in rows], np.asarray(index))
        return self

    def _setup(self, sizes, weights, rows, index) -> None:
        if index.shape != (weights.size, len(sizes)) or len(rows) != len(sizes):
            raise ValueError("a Kronecker vector needs one index row per term and one column per axis")
        for r, n in zip(rows, sizes):
            if r.ndim != 2 or r.shape[1] != n:
                raise ValueError(f"axis vectors must have the axis length {n}, got shape {r.shape}")
        self.sizes = sizes
        self.weights = weights
        self.rows = rows
        self.index = index

    @classmethod
    def from_array(cls, v: np.ndarray) -> KronVector:
        """A one-axis vector."""
        v = np.asarray(v, dtype=float).ravel()
        return cls.factored((v.size,), np.ones(1), [v[None, :]], np.zeros((1, 1), dtype=np.intp))

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    @property
    def num_terms(self) -> int:
        return self.weights.size

    @property
    def terms(self) -> list[tuple[float, tuple[np.ndarray, ...]]]:
        """The terms as ``(coefficient, (v_1, ..., v_d))`` pairs."""
        return [(float(w), tuple(self.rows[i][k] for i, k in enumerate(ks))) for w, ks in zip(self.weights, self.index)]

    def scale(self, c: float) -> KronVector:
        weights = c * self.weights
        if c != 0.0 and _underflowed(weights, self.weights != 0.0):
            raise ValueError(UNDERFLOW_MESSAGE)
        return KronVector.factored(self.sizes, weights, self.rows, self.index)

    def kron(self, other: KronVector) -> KronVector:
        """The Kronecker product: axes of ``self`` then of ``other``, one term per pair of terms."""
        a, b = np.meshgrid(np.arange(self.num_terms), np.arange(other.num_terms), indexing="ij")
        a, b = a.ravel(), b.ravel()
        index = np.hstack([self.index[a], other.index[b]])
        weights = self.weights[a] * other.weights[b]
        if _underflowed(weights, (self.weights[a] != 0.0) & (other.weights[b] != 0.0)):
            raise ValueError(UNDERFLOW_MESSAGE)
        return KronVector.factored(self.sizes + other.sizes, weights, self.rows + other.rows, index)

    def regroup(self, sizes: Sequence[int]) -> KronVector:
        """The same vector over coarser axes: consecutive axes merged (each term's vectors by ``np.kron``).

        ``sizes`` must group the axes (every cumulative product of ``sizes`` is one of
        ``self.sizes``'); raises ``ValueError`` otherwise.
        """
        sizes = tuple(int(s) for s in sizes)
        if sizes == self.sizes:
            return self
        groups, start = [], 0
        for s in sizes:
            stop, width = start, 1
            while width < s and stop < len(self.sizes):
                width *= self.sizes[stop]
                stop += 1
            if width != s:
                raise ValueError(f"axes {self.sizes} cannot be merged into {sizes}")
            while stop < len(self.sizes) and self.sizes[stop] == 1:  # axes of one value join the group before
                stop += 1
            groups.append((start, stop))
            start = stop
        if start != len(self.sizes):
            raise ValueError(f"axes {self.sizes} cannot be merged into {sizes}")
        rows, index = [], []
        for lo, hi in groups:
            keys, inverse = np.unique(self.index[:, lo:hi], axis=0, return_inverse=True)
            check_dense_size(keys.shape[0], math.prod(self.sizes[lo:hi]), "merging Kronecker vector axes")
            rows.append(np.array([reduce(np.kron, [self.rows[lo + a][k] for a, k in enumerate(ks)], np.ones(1))
                                  for ks in keys]))
            index.append(inverse.reshape(-1))
        return KronVector.factored(sizes, self.weights, rows, np.stack(index, axis=1))

    def __add__(self, other: KronVector) -> KronVector:
        if self.size != other.size:
            raise ValueError(f"cannot add vectors of lengths {self.size} and {other.size}")
        if self.sizes != other.sizes:
            cuts = (set(itertools.accumulate(self.sizes, operator.mul, initial=1))
                    & set(itertools.accumulate(other.sizes, operator.mul, initial=1)))
            points = sorted(cuts)
            sizes = tuple(b // a for a, b in zip(points[:-1], points[1:])) or (1,)  # one cell: one axis of 1
            return self.regroup(sizes) + other.regroup(sizes)
        shift = [r.shape[0] for r in self.rows]
        rows = [np.vstack([a, b]) for a, b in zip(self.rows, other.rows)]
        index = np.vstack([self.index, other.index + np.array(shift, dtype=np.intp)])
        return KronVector.factored(self.sizes, np.concatenate([self.weights, other.weights]), rows, index)

    def sum(self) -> float:
        """The sum of the entries: ``sum_t c_t prod_i sum(v_ti)``."""
        sums = np.stack([r.sum(axis=1)[self.index[:, i]] for i, r in enumerate(self.rows)], axis=1)
        return float(self.weights @ np.prod(sums, axis=1))

    def to_array(self) -> np.ndarray:
        check_dense_size(self.size, 1, "expanding a Kronecker-structured vector", 2**28)
        out = np.zeros(self.size)
        for w, ks in zip(self.weights, self.index):
            out += w * reduce(np.kron, [self.rows[i][k] for i, k in enumerate(ks)], np.ones(1))
        return out

    def max(self) -> float:
        """The largest entry, or a valid upper bound on it (see :meth:`max_bounds`)."""
        return self.max_bounds()[1]

    def max_bounds(self, steps: int = MAX_SEARCH_STEPS) -> tuple[float, float]:
        r"""``(lower, upper)``: bounds on the largest entry that are equal when it is found exactly.

        ``lower`` is an entry of the vector; ``upper`` is at least every entry. The steps
        (docs/math.md, section 2.3):

        1. Axes on which every term is constant (to ``FOLD_RTOL``) are folded into the
           coefficients at each vector's maximum; with one term every axis folds, so a Kronecker
           product's maximum is the product of its factors' maxima.
        2. On every other axis, values whose column of term values is the same (``j`` and
           ``j'`` with :math:`v_{t,i}[j] = v_{t,i}[j']` for every term) form one class, and terms
           equal on all remaining axes are added.
        3. What is left is enumerated when it has at most ``MAX_ENUMERATION`` (terms x cells),
           else searched by branch and bound over the axes: a partial choice of values is bounded
           by taking each term's largest value on the axes still open, and branches whose bound
           cannot beat the best entry found are cut. The search
           stops after ``steps`` branching steps and ``upper`` is the largest bound still open (at
           most the sum of the terms' maxima).

        Calibrating noise to ``upper`` is always safe for privacy (it can only add noise).
        """
        if self.weights.size == 0:
            return 0.0, 0.0
        if np.any(self.weights < 0) or any(np.any(r < 0) for r in self.rows):
            raise ValueError("the maximum of a Kronecker vector is only computed for non-negative terms")
        live = self.weights > 0
        weights, index = self.weights[live], self.index[live]
        if weights.size == 0:
            return 0.0, 0.0
        lower_weights = weights.copy()
        kept = []
        for i, r in enumerate(self.rows):  # step 1: fold constant axes
            used = np.unique(index[:, i])
            top, bottom = r[used].max(axis=1), r[used].min(axis=1)
            if np.all(top - bottom <= FOLD_RTOL * top):
                rowmax = np.zeros(r.shape[0])
                rowmax[used] = top
                rowmin = np.zeros(r.shape[0])
                rowmin[used] = bottom
                weights = weights * rowmax[index[:, i]]
                lower_weights = lower_weights * rowmin[index[:, i]]
            else:
                kept.append(i)
        if not kept:
            return float(lower_weights.sum()), float(weights.sum())
        weights_before = weights
        rows, columns = [], []
        for i in kept:
            used, local = np.unique(index[:, i], return_inverse=True)
            classes = np.unique(self.rows[i][used], axis=1)
            rows.append(classes)
            columns.append(local.reshape(-1))
        index = np.stack(columns, axis=1)
        index, merged = np.unique(index, axis=0, return_inverse=True)
        merged = merged.reshape(-1)
        weights_before = np.bincount(merged, weights=weights_before, minlength=index.shape[0])
        lower_weights = np.bincount(merged, weights=lower_weights, minlength=index.shape[0])
        weights = weights_before
        best, upper = _max_of_products(weights, rows, index, steps)
        # the folded axes were taken at their maxima: the entry found is at least this much
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = float(np.min(np.where(weights_before > 0, lower_weights / weights_before, 1.0)))
        return best * ratio, upper


def _local_max(weights: np.ndarray, rows: list[np.ndarray], index: np.ndarray, rounds: int = 20) -> float:
    r"""An entry of :math:`\sum_t w_t \prod_i R_i[k_{ti}, j_i]` found by coordinate ascent (a lower bound on the maximum).

    Starts from each axis's value of largest weighted sum and moves one axis at a time to its
    best value given the others, until no axis moves.
    """
    picked = [r[index[:, i]] for i, r in enumerate(rows)]  # (terms, n_i) per axis
    choice = [int(np.argmax(weights @ p)) for p in picked]
    factors = np.stack([p[:, j] for p, j in zip(picked, choice)], axis=1)
    for _ in range(rounds):
        moved = False
        for i, p in enumerate(picked):
            others = weights * np.prod(np.delete(factors, i, axis=1), axis=1)
            j = int(np.argmax(others @ p))
            if p[:, j] @ others > p[:, choice[i]] @ others:
                choice[i], factors[:, i], moved = j, p[:, j], True
        if not moved:
            break
    return float(weights @ np.prod(factors, axis=1))


def _max_of_products(weights: np.ndarray, rows: list[np.ndarray], index: np.ndarray, steps: int) -> tuple[float, float]:
    r"""``(lower, upper)`` on :math:`\max_j \sum_t w_t \prod_i R_i[k_{ti}, j_i]` (non-negative entries).

    Enumerates when small (``MAX_ENUMERATION``), else best-first branch and bound with dives
    (see :meth:`KronVector.max_bounds`), stopping after ``steps`` branching steps.
    """
    d = len(rows)
    # most varied axes first: their bounds are loosest, so branching on them cuts most
    spread = []
    for i, r in enumerate(rows):
        top, bottom = r.max(axis=1)[index[:, i]], r.min(axis=1)[index[:, i]]
        spread.append(float(np.max(np.where(top > 0, (top - bottom) / np.where(top > 0, top, 1.0), 0.0))))
    order = np.argsort(spread)[::-1]
    rows = [rows[i] for i in order]
    index = index[:, order]
    cells = math.prod(r.shape[1] for r in rows)
    if cells * weights.size <= MAX_ENUMERATION:
        values = weights[:, None]
        for i, r in enumerate(rows):
            values = (values[:, :, None] * r[index[:, i]][:, None, :]).reshape(weights.size, -1)
        best = float(values.sum(axis=0).max())
        return best, best
    maxima = np.stack([r.max(axis=1)[index[:, i]] for i, r in enumerate(rows)], axis=1)
    tail = np.ones((d + 1, weights.size))
    for r in range(d - 1, -1, -1):
        tail[r] = tail[r + 1] * maxima[:, r]
    best = _local_max(weights, rows, index)
    heap = [(-float(weights @ tail[0]), 0, 0, weights)]
    counter, spent = 1, 0
    while heap:
        bound, _, depth, a = heapq.heappop(heap)
        if -bound <= best:
            return best, best
        if spent >= steps:
            return best, -bound
        while True:  # dive: follow the most promising child, keep the others
            child = a[:, None] * rows[depth][index[:, depth]]
            spent += 1
            if depth == d - 1:
                best = max(best, float(child.sum(axis=0).max()))
                break
            bounds = tail[depth + 1] @ child
            ranked = np.argsort(bounds)[::-1]
            if bounds[ranked[0]] <= best:
                break
            for j in ranked[1:]:
                if bounds[j] > best:
                    heapq.heappush(heap, (-float(bounds[j]), counter, depth + 1, child[:, j]))
                    counter += 1
            a, depth = child[:, ranked[0]], depth + 1
    return best, best


# ====================================================================== leaves
class Explicit(Matrix):
    """A matrix given by its entries: a dense numpy array or a scipy.sparse matrix."""

    def __init__(self, matrix, labels: Sequence[str] | None = None):
        if sp.issparse(matrix):
            matrix = sp.csr_array(matrix, dtype=np.float64)
        else:
            matrix = np.asarray(matrix, dtype=np.float64)
            if matrix.ndim == 1:
                matrix = matrix[None, :]
            if matrix.ndim != 2:
                raise ValueError(f"an explicit matrix must be 2-D, got shape {matrix.shape}")
        data = matrix.data if sp.issparse(matrix) else matrix
        if not np.all(np.isfinite(data)):
            raise ValueError("matrix entries must be finite (found NaN or infinity)")
        if labels is not None and len(labels) != matrix.shape[0]:
            raise ValueError(f"got {len(labels)} labels for {matrix.shape[0]} rows")
        self.matrix = matrix
        self.row_labels = None if labels is None else tuple(str(s) for s in labels)
        self.shape = (int(matrix.shape[0]), int(matrix.shape[1]))

    @property
    def is_sparse(self) -> bool:
        return sp.issparse(self.matrix)

    def _matmat(self, X):
        return np.asarray(self.matrix @ X)

    def _rmatmat(self, Y):
        return np.asarray(self.matrix.T @ Y)

    @property
    def T(self):
        return Explicit(self.matrix.T)

    def gram(self):
        return Explicit(self.matrix.T @ self.matrix)

    def column_norm_powers(self, p):
        check_norm(p)
        if self.is_sparse:
            M = self.matrix.tocsr(copy=True)
            M.data = norm_powers(M.data, p)
            col = np.asarray(M.sum(axis=0)).ravel()
        else:
            col = norm_powers(self.matrix, p).sum(axis=0)
        return KronVector.from_array(col)

    def column_support(self):
        if self.shape[0] == 0 or self.shape[1] == 0:
            return 0
        if self.is_sparse:
            M = self.matrix.tocsc()
            M.eliminate_zeros()
            return int(np.diff(M.indptr).max())
        return int(np.count_nonzero(self.matrix, axis=0).max())

    def diag(self):
        self._check_square("diag()")
        return np.asarray(self.matrix.diagonal(), dtype=float)

    def quadratic_diag(self, X):
        AX = np.asarray(self.matrix @ X)
        if self.is_sparse:
            return np.asarray(self.matrix.multiply(AX).sum(axis=1)).ravel()
        return np.einsum("ij,ij->i", AX, self.matrix)

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of an Explicit matrix", max_entries)
        return self.matrix.toarray() if self.is_sparse else self.matrix.copy()

    def describe(self, row, name=None, values=None):
        if self.row_labels is not None:
            label = self.row_labels[row]
            return label if name is None else f"{name}: {label}"
        r = self.matrix[[row]].toarray()[0] if self.is_sparse else self.matrix[row]
        return describe_row(r, name, values)

    def __repr__(self):
        kind = "sparse" if self.is_sparse else "dense"
        return f"Explicit({kind}, shape={self.shape})"


class Identity(Matrix):
    """The ``n x n`` identity: one query per cell."""

    fast_pinv = True

    def __init__(self, n: int):
        self.n = positive_int(n, "n")
        self.shape = (self.n, self.n)

    def _matmat(self, X):
        return np.array(X, dtype=float, copy=True)

    _rmatmat = _matmat

    @property
    def T(self):
        return self

    def gram(self):
        return self

    def column_support(self):
        return min(1, self.shape[0])

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(np.broadcast_to(1.0, self.n))

    def sensitivity(self, p=1):
        check_norm(p)
        return 1.0

    def diag(self):
        return np.ones(self.n)

    def trace(self):
        return float(self.n)

    def pinv(self):
        return self

    def quadratic_diag(self, X):
        return np.diagonal(X).copy()

    def dense(self, max_entries=None):
        check_dense_size(self.n, self.n, "dense() of an Identity", max_entries)
        return np.eye(self.n)

    def describe(self, row, name=None, values=None):
        label = value_label(values, row)
        return label if name is None else f"{name}={label}"

    def __repr__(self):
        return f"Identity({self.n})"

    def _key(self):
        return ("Identity", self.n)


class Ones(Matrix):
    """The ``m x n`` all-ones matrix; ``Ones(1, n)`` is the single query "total"."""

    fast_pinv = True

    def __init__(self, m: int, n: int):
        self.shape = (positive_int(m, "m"), positive_int(n, "n"))

    def _matmat(self, X):
        return np.repeat(X.sum(axis=0, keepdims=True), self.shape[0], axis=0)

    def _rmatmat(self, Y):
        return np.repeat(Y.sum(axis=0, keepdims=True), self.shape[1], axis=0)

    @property
    def T(self):
        return Ones(self.shape[1], self.shape[0])

    def gram(self):
        m, n = self.shape
        return Ones(n, n) if m == 1 else Weighted(Ones(n, n), float(m))

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(np.broadcast_to(float(self.shape[0]), self.shape[1]))

    def sensitivity(self, p=1):
        check_norm(p)
        return float(self.shape[0]) ** (1.0 / p)

    def diag(self):
        self._check_square("diag()")
        return np.ones(self.shape[0])

    def trace(self):
        self._check_square("trace()")
        return float(self.shape[0])

    def pinv(self):
        m, n = self.shape
        return Weighted(Ones(n, m), 1.0 / (m * n))

    def quadratic_diag(self, X):
        return np.full(self.shape[0], float(np.sum(X)))

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of Ones", max_entries)
        return np.ones(self.shape)

    def describe(self, row, name=None, values=None):
        return None

    def __repr__(self):
        return f"Ones({self.shape[0]}, {self.shape[1]})"

    def _key(self):
        return ("Ones",) + self.shape


class Diagonal(Matrix):
    """A diagonal matrix ``diag(d)``."""

    fast_pinv = True

    def __init__(self, d):
        d = np.asarray(d, dtype=float)
        if d.ndim != 1 or d.size == 0 or not np.all(np.isfinite(d)):
            raise ValueError("a diagonal must be a non-empty 1-D array of finite numbers")
        self.d = d
        self.shape = (d.size, d.size)

    def _matmat(self, X):
        return self.d[:, None] * X

    _rmatmat = _matmat

    @property
    def T(self):
        return self

    def gram(self):
        return Diagonal(self.d**2)

    def column_support(self):
        return int(np.any(self.d != 0))

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(norm_powers(self.d, p))

    def diag(self):
        return self.d.copy()

    def pinv(self):
        inv = np.zeros_like(self.d)
        nonzero = self.d != 0
        inv[nonzero] = 1.0 / self.d[nonzero]
        return Diagonal(inv)

    def quadratic_diag(self, X):
        return self.d**2 * np.diagonal(X)

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a Diagonal", max_entries)
        return np.diag(self.d)


# ====================================================================== compositions
class Kronecker(Matrix):
    """The Kronecker product ``F_1 (x) F_2 (x) ... (x) F_d`` of implicit matrices.

    Parameters
    ----------
    factors
        One matrix per attribute (first attribute most significant).
    names, values
        Optional attribute names and value labels, used only for query labels.
    sep
        Separator between the per-attribute conditions of a label.
    """

    def __init__(
        self,
        factors: Sequence[Matrix],
        names: Sequence[str | None] | None = None,
        values: Sequence[Sequence | None] | None = None,
        sep: str = " & ",
    ):
        factors = list(factors)
        if not factors:
            raise ValueError("a Kronecker product needs at least one factor")
        for f in factors:
            if not isinstance(f, Matrix):
                raise TypeError(f"Kronecker factors must be hdmm matrices, got {type(f).__name__}")
        self.factors = factors
        d = len(factors)
        self.names = tuple(names) if names is not None else (None,) * d
        self.values = tuple(values) if values is not None else (None,) * d
        if len(self.names) != d or len(self.values) != d:
            raise ValueError("names and values must have one entry per factor")
        self.sep = sep
        self.shape = (
            math.prod(f.shape[0] for f in factors),
            math.prod(f.shape[1] for f in factors),
        )

    def _apply(self, factors: Sequence[Matrix], X: np.ndarray, transpose: bool) -> np.ndarray:
        k = X.shape[1]
        in_dim = 0 if transpose else 1
        T = X.reshape(tuple(f.shape[in_dim] for f in factors) + (k,))
        # Shrinking factors first keeps the intermediate tensors small; identities are no-ops.
        order = sorted(range(len(factors)), key=lambda i: factors[i].shape[1 - in_dim] / factors[i].shape[in_dim])
        for i in order:
            f = factors[i]
            if isinstance(f, Identity):
                continue
            if isinstance(f, Ones):  # a total: reduce in place of a transposed copy
                T = np.repeat(T.sum(axis=i, keepdims=True), f.shape[1 - in_dim], axis=i)
                continue
            if isinstance(f, Explicit) and not f.is_sparse:  # a batched product on a view: no transposed copies
                M = np.asarray(f.matrix.T if transpose else f.matrix)
                shape = T.shape
                out = np.matmul(M, T.reshape(math.prod(shape[:i]), shape[i], -1))
                T = out.reshape(shape[:i] + (M.shape[0],) + shape[i + 1:])
                continue
            moved = np.moveaxis(T, i, 0)
            rest = moved.shape[1:]
            flat = moved.reshape(moved.shape[0], -1)
            out = f._rmatmat(flat) if transpose else f._matmat(flat)
            T = np.moveaxis(out.reshape((out.shape[0],) + rest), 0, i)
        return T.reshape(-1, k)

    def _matmat(self, X):
        return self._apply(self.factors, X, transpose=False)

    def _rmatmat(self, Y):
        return self._apply(self.factors, Y, transpose=True)

    @property
    def T(self):
        return Kronecker([f.T for f in self.factors])

    def gram(self):
        return Kronecker([f.gram() for f in self.factors])

    def column_norm_powers(self, p):
        return reduce(KronVector.kron, [f.column_norm_powers(p) for f in self.factors])

    def column_support(self):
        # mode by mode, an answer depends on the intermediate entries its factor row selects
        return math.prod(f.column_support() for f in self.factors)

    def _square_factors(self) -> bool:
        return all(f.shape[0] == f.shape[1] for f in self.factors)

    def diag(self):
        if not self._square_factors():
            return super().diag()
        return reduce(np.kron, [f.diag() for f in self.factors])

    def trace(self):
        if not self._square_factors():
            return super().trace()
        return math.prod(f.trace() for f in self.factors)

    def pinv(self):
        return Kronecker([f.pinv() for f in self.factors])

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a Kronecker product", max_entries)
        return reduce(np.kron, [f.dense() for f in self.factors])

    def describe(self, row, name=None, values=None):
        idx = np.unravel_index(row, tuple(f.shape[0] for f in self.factors))
        parts = [
            f.describe(int(i), n, v) for f, i, n, v in zip(self.factors, idx, self.names, self.values)
        ]
        parts = [p for p in parts if p is not None]
        return self.sep.join(parts) if parts else None

    def __repr__(self):
        return "Kronecker([" + ", ".join(repr(f) for f in self.factors) + "])"

    def _key(self):
        return ("Kronecker",) + tuple(f._key() for f in self.factors)


class VStack(Matrix):
    """A union of queries: the rows of several matrices with the same number of columns.

    ``names`` (optional, one per block) prefix the blocks' query labels, e.g. ``"P12: "``.
    ``weights`` (optional, one finite number >= 0 per block) say how much each block matters:
    the matrix is then ``VStack_j w_j B_j`` (what an optimizer minimises the error of), and
    :attr:`parts` keeps the unweighted blocks ``B_j`` (the queries a release answers).
    """

    def __init__(self, blocks: Sequence[Matrix], names: Sequence[str] | None = None,
                 weights: Sequence[float] | None = None):
        blocks = list(blocks)
        if not blocks:
            raise ValueError("a union needs at least one matrix")
        self.parts = blocks
        self.weights = None
        if weights is not None:
            weights = [float(w) for w in weights]
            if len(weights) != len(blocks):
                raise ValueError(f"got {len(weights)} weights for {len(blocks)} workloads")
            bad = [w for w in weights if not (math.isfinite(w) and w >= 0)]
            if bad:
                raise ValueError(
                    f"workload weights must be finite numbers >= 0 (how much each part matters to the optimizer), "
                    f"got {bad[0]!r}; a weight is not a coefficient: to count a query negatively, negate the part"
                )
            self.weights = tuple(weights)
            blocks = [b if w == 1 else Weighted(b, w) for b, w in zip(blocks, weights)]
        n = blocks[0].shape[1]
        for b in blocks:
            if not isinstance(b, Matrix):
                raise TypeError(f"union members must be hdmm matrices, got {type(b).__name__}")
            if b.shape[1] != n:
                raise ValueError(
                    f"all matrices in a union must have the same number of columns (domain size): "
                    f"got {n:,} and {b.shape[1]:,}"
                )
        if names is not None and len(names) != len(blocks):
            raise ValueError(f"got {len(names)} names for {len(blocks)} blocks")
        self.blocks = blocks
        self.names = None if names is None else tuple(names)
        self.offsets = np.cumsum([0] + [b.shape[0] for b in blocks])
        self.shape = (int(self.offsets[-1]), n)

    def _matmat(self, X):
        return np.vstack([b._matmat(X) for b in self.blocks])

    def _rmatmat(self, Y):
        return sum(b._rmatmat(Y[lo:hi]) for b, lo, hi in zip(self.blocks, self.offsets[:-1], self.offsets[1:]))

    def gram(self):
        return Sum([b.gram() for b in self.blocks])

    def column_norm_powers(self, p):
        return reduce(KronVector.__add__, [b.column_norm_powers(p) for b in self.blocks])

    def column_support(self):
        return sum(b.column_support() for b in self.blocks)

    def quadratic_diag(self, X):
        return np.concatenate([b.quadratic_diag(X) for b in self.blocks])

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a union", max_entries)
        return np.vstack([b.dense() for b in self.blocks])

    def _locate(self, row: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.offsets, row, side="right")) - 1
        return k, row - int(self.offsets[k])

    def describe(self, row, name=None, values=None):
        k, r = self._locate(row)
        label = self.blocks[k].describe(r, name, values)
        if self.names is not None:
            return f"{self.names[k]}: {label or 'total'}"
        return label

    def __repr__(self):
        return f"VStack({len(self.blocks)} blocks, shape={self.shape})"


class Weighted(Matrix):
    """``c * A`` for a scalar ``c``."""

    def __init__(self, base: Matrix, weight: float):
        weight = float(weight)
        if not math.isfinite(weight):
            raise ValueError(f"a matrix weight must be finite, got {weight}")
        if isinstance(base, Weighted):
            base, weight = base.base, weight * base.weight
        self.base = base
        self.weight = weight
        self.shape = base.shape

    def _matmat(self, X):
        return self.weight * self.base._matmat(X)

    def _rmatmat(self, Y):
        return self.weight * self.base._rmatmat(Y)

    @property
    def T(self):
        return Weighted(self.base.T, self.weight)

    def gram(self):
        return Weighted(self.base.gram(), self.weight**2)

    def column_norm_powers(self, p):
        return self.base.column_norm_powers(p).scale(float(norm_powers(self.weight, p)))

    def column_support(self):
        return 0 if self.weight == 0 else self.base.column_support()

    def diag(self):
        return self.weight * self.base.diag()

    def trace(self):
        return self.weight * self.base.trace()

    def spectrum(self):
        inner = self.base.spectrum()
        return None if inner is None else inner.scaled(self.weight)

    def pinv(self):
        if self.weight == 0:
            return Weighted(self.base.T, 0.0)
        return Weighted(self.base.pinv(), 1.0 / self.weight)

    def quadratic_diag(self, X):
        return self.weight**2 * self.base.quadratic_diag(X)

    def dense(self, max_entries=None):
        return self.weight * self.base.dense(max_entries)

    def describe(self, row, name=None, values=None):
        return self.base.describe(row, name, values)

    def __repr__(self):
        return f"{self.weight:g} * {self.base!r}"

    def _key(self):
        return ("Weighted", self.weight, self.base._key())


class Sum(Matrix):
    """``A_1 + A_2 + ...`` for matrices of one shape (e.g. the Gram of a union)."""

    def __init__(self, terms: Sequence[Matrix]):
        flat: list[Matrix] = []
        for t in terms:
            flat.extend(t.terms if isinstance(t, Sum) else [t])
        if not flat:
            raise ValueError("a sum needs at least one matrix")
        shape = flat[0].shape
        for t in flat:
            if t.shape != shape:
                raise ValueError(f"cannot add matrices of shapes {shape} and {t.shape}")
        self.terms = flat
        self.shape = shape

    def _matmat(self, X):
        return sum(t._matmat(X) for t in self.terms)

    def column_support(self):
        return min(self.shape[0], sum(t.column_support() for t in self.terms))

    def _rmatmat(self, Y):
        return sum(t._rmatmat(Y) for t in self.terms)

    @property
    def T(self):
        return Sum([t.T for t in self.terms])

    def diag(self):
        self._check_square("diag()")
        return sum(t.diag() for t in self.terms)

    def trace(self):
        self._check_square("trace()")
        return float(sum(t.trace() for t in self.terms))

    def spectrum(self):
        shift, total = 0.0, None
        for t in self.terms:
            base, weight = (t.base, t.weight) if isinstance(t, Weighted) else (t, 1.0)
            if isinstance(base, Identity):
                shift += weight  # diagonal in every basis
                continue
            part = t.spectrum()
            total = part if total is None or part is None else total.plus(part)
            if total is None:
                return None
        return None if total is None else total.shifted(shift)

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a sum", max_entries)
        return sum(t.dense() for t in self.terms)

    def __repr__(self):
        return f"Sum({len(self.terms)} terms, shape={self.shape})"


class Product(Matrix):
    """The lazy product ``A @ B``."""

    def __init__(self, left: Matrix, right: Matrix):
        if left.shape[1] != right.shape[0]:
            raise ValueError(f"cannot multiply matrices of shapes {left.shape} and {right.shape}")
        self.left, self.right = left, right
        self.shape = (left.shape[0], right.shape[1])

    def _matmat(self, X):
        return self.left._matmat(self.right._matmat(X))

    def _rmatmat(self, Y):
        return self.right._rmatmat(self.left._rmatmat(Y))

    @property
    def T(self):
        return Product(self.right.T, self.left.T)

    def __repr__(self):
        return f"Product({self.left!r}, {self.right!r})"


class Transpose(Matrix):
    """The lazy transpose of a matrix without a structural transpose of its own."""

    def __init__(self, base: Matrix):
        self.base = base
        self.shape = (base.shape[1], base.shape[0])

    def _matmat(self, X):
        return self.base._rmatmat(X)

    def _rmatmat(self, Y):
        return self.base._matmat(Y)

    @property
    def T(self):
        return self.base

    def gram(self):
        return Product(self.base, self.base.T)

    def diag(self):
        return self.base.diag()

    def trace(self):
        return self.base.trace()

    def pinv(self):
        return self.base.pinv().T

    def __repr__(self):
        return f"Transpose({self.base!r})"


def _multiply(left: Matrix, right: Matrix) -> Matrix:
    """``left @ right``, simplified where the structure allows."""
    if left.shape[1] != right.shape[0]:
        raise ValueError(f"cannot multiply matrices of shapes {left.shape} and {right.shape}")
    if isinstance(left, Identity):
        return right
    if isinstance(right, Identity):
        return left
    if isinstance(left, Weighted):
        return Weighted(_multiply(left.base, right), left.weight)
    if isinstance(right, Weighted):
        return Weighted(_multiply(left, right.base), right.weight)
    if (
        isinstance(left, Kronecker)
        and isinstance(right, Kronecker)
        and len(left.factors) == len(right.factors)
        and all(a.shape[1] == b.shape[0] for a, b in zip(left.factors, right.factors))
    ):
        return Kronecker([_multiply(a, b) for a, b in zip(left.factors, right.factors)])
    if isinstance(left, Explicit) and isinstance(right, Explicit):
        if left.is_sparse and right.is_sparse:
            return Explicit(left.matrix @ right.matrix)
        if left.shape[0] * right.shape[1] <= DENSE_LIMIT:
            return Explicit(np.asarray(left.matrix @ right.matrix))
    return Product(left, right)
