"""Unions of weighted Kronecker products, the shape every workload and strategy reduces to.

A :class:`KronUnion` describes

    W = VStack_j  c_j * (F_1[k_j1] (x) F_2[k_j2] (x) ... (x) F_d[k_jd])

by, for each attribute ``i``, the list ``F_i`` of its *distinct* factors, an integer
``index`` matrix (``index[j, i] = k_ji``) and the weights ``c``. The rows of term ``j`` come
in one block, in term order. Storing distinct factors once means per-attribute work (Grams,
traces against a strategy factor) is done once per factor, and per-term quantities are
vectorised products over the index matrix: the expected error of docs/math.md, section 2.4,

    tr((A^T A)^+ W^T W) = sum_j c_j^2 prod_i tr((A_i^T A_i)^+ G_i^(j)),

is one ``np.prod`` over a ``(terms, d)`` array, even for ~166,000 marginals.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import weakref
from typing import Sequence

import numpy as np

from .matrix import Identity, Kronecker, Matrix, Ones, VStack, Weighted

__all__ = ["KronUnion", "FactorMismatchError", "kron_union", "normal_form", "outer_rows", "aligned_pair"]


class FactorMismatchError(ValueError):
    """The Kronecker factors of two matrices cannot be lined up attribute by attribute."""


def _flatten(factors: Sequence[Matrix]) -> tuple[float, list[Matrix]]:
    """Expand nested Kronecker factors and pull weights out: ``c * (x) F``."""
    weight, flat = 1.0, []
    for f in factors:
        while isinstance(f, Weighted):
            weight *= f.weight
            f = f.base
        if isinstance(f, Kronecker):
            w, inner = _flatten(f.factors)
            weight *= w
            flat.extend(inner)
        else:
            flat.append(f)
    return weight, flat


def _split(f: Matrix, head: int, tail: int) -> tuple[Matrix, Matrix] | None:
    """Write ``f`` (with ``head * tail`` columns) as ``H (x) T``, if its structure allows."""
    if isinstance(f, Identity):
        return Identity(head), Identity(tail)
    if isinstance(f, Ones):
        return Ones(f.shape[0], head), Ones(1, tail)
    return None


def _align(factors: Sequence[Matrix], sizes: Sequence[int]) -> list[Matrix]:
    """Regroup a Kronecker factor list so that factor ``i`` has ``sizes[i]`` columns.

    Consecutive factors are merged into a Kronecker product; identities and all-ones factors
    are split. Raises :class:`FactorMismatchError` when neither works.
    """
    queue = list(factors)
    out: list[Matrix] = []

    def mismatch(detail: str) -> FactorMismatchError:
        have = [f.shape[1] for f in factors]
        return FactorMismatchError(f"cannot line up factor sizes {have} with {list(sizes)}: {detail}")

    for s in sizes:
        group: list[Matrix] = []
        width = 1  # always divides s
        while width < s or (queue and queue[0].shape[1] == 1):
            if not queue:
                raise mismatch("the factors run out")
            f = queue.pop(0)
            n = f.shape[1]
            if s % (width * n) == 0:
                group.append(f)
                width *= n
                continue
            need = s // width
            parts = _split(f, need, n // need) if n % need == 0 else None
            if parts is None:
                raise mismatch(f"a {type(f).__name__} with {n} columns would have to be split")
            group.append(parts[0])
            queue.insert(0, parts[1])
            width *= need
        out.append(Kronecker(group) if len(group) > 1 else group[0] if group else Identity(1))
    if queue:
        raise mismatch("factors are left over")
    return out


def _cuts(sizes: Sequence[int]) -> set[int]:
    """Cumulative products ``1, n_1, n_1 n_2, ...`` (exact integers: domains may exceed int64)."""
    return set(itertools.accumulate([int(s) for s in sizes], operator.mul, initial=1))


def _sizes_from_cuts(cuts: set[int]) -> tuple[int, ...]:
    points = sorted(cuts)
    return tuple(b // a for a, b in zip(points[:-1], points[1:]))


class KronUnion:
    """A union of weighted Kronecker products with shared per-attribute factors.

    Parameters
    ----------
    factors
        ``factors[i]`` is the list of distinct matrices used on attribute ``i``; all have
        ``sizes[i]`` columns.
    index
        Integer array of shape ``(terms, d)``: term ``j`` uses ``factors[i][index[j, i]]`` (any
        integer type; a small one keeps unions over many attributes compact).
    weights
        Array of shape ``(terms,)``: the scalar ``c_j`` of each term.
    """

    def __init__(self, factors: list[list[Matrix]], index: np.ndarray, weights: np.ndarray):
        self.factors = factors
        index = np.asarray(index)
        self.index = index if np.issubdtype(index.dtype, np.integer) else index.astype(np.intp)
        self.weights = np.asarray(weights, dtype=float)
        self.sizes = tuple(int(fs[0].shape[1]) for fs in factors)
        if self.index.shape != (self.weights.size, len(factors)):
            raise ValueError("index must have one row per term and one column per attribute")

    # ------------------------------------------------------------------ construction
    @classmethod
    def single(cls, factors: Sequence[Matrix]) -> KronUnion:
        """One Kronecker product, nested products expanded into their factors."""
        weight, flat = _flatten(factors)
        return cls.term_of(flat, weight)

    @classmethod
    def term_of(cls, factors: Sequence[Matrix], weight: float = 1.0) -> KronUnion:
        """One term ``weight * (x) factors`` with the factors taken as they are."""
        return cls([[f] for f in factors], np.zeros((1, len(factors)), dtype=np.intp), np.array([weight]))

    @classmethod
    def concatenate(cls, unions: Sequence[KronUnion]) -> KronUnion:
        """The union of several unions (rows in order), lined up on common factor sizes.

        Factors with equal keys (:meth:`hdmm.matrix.Matrix._key`: the same object, or equal building
        blocks built separately, such as one ``Prefix(100)`` per marginal) are kept once per attribute.
        """
        unions = list(unions)
        if len({u.sizes for u in unions}) > 1:
            sizes = cls.common_sizes(unions)
            unions = [u.align(sizes) for u in unions]
        d = len(unions[0].sizes)
        factors: list[list[Matrix]] = [[] for _ in range(d)]
        positions: list[dict] = [{} for _ in range(d)]
        blocks = []
        for u in unions:
            remap = np.empty(u.index.shape, dtype=np.intp)
            for i in range(d):
                lookup = np.empty(len(u.factors[i]), dtype=np.intp)
                for k, f in enumerate(u.factors[i]):
                    key = f._key()
                    if key not in positions[i]:
                        positions[i][key] = len(factors[i])
                        factors[i].append(f)
                    lookup[k] = positions[i][key]
                remap[:, i] = lookup[u.index[:, i]]
            blocks.append(remap)
        return cls(factors, np.vstack(blocks), np.concatenate([u.weights for u in unions]))

    @staticmethod
    def common_sizes(unions: Sequence[KronUnion]) -> tuple[int, ...]:
        """Per-attribute sizes every union can be lined up to.

        The finest common refinement when every union can be split to it (identities and
        totals split), else the coarsest common grouping (merging factors always works).
        """
        cut_sets = [_cuts(u.sizes) for u in unions]
        fine = set().union(*cut_sets)
        points = sorted(fine)
        if all(b % a == 0 for a, b in zip(points[:-1], points[1:])):
            sizes = _sizes_from_cuts(fine)
            try:
                for u in unions:
                    u.align(sizes)
                return sizes
            except FactorMismatchError:
                pass
        return _sizes_from_cuts(set.intersection(*cut_sets))

    def align(self, sizes: Sequence[int]) -> KronUnion:
        """The same union with factor ``i`` having ``sizes[i]`` columns (merged or split)."""
        sizes = tuple(int(s) for s in sizes)
        if sizes == self.sizes:
            return self
        if math.prod(sizes) != math.prod(self.sizes):
            raise FactorMismatchError(
                f"domain sizes differ: {math.prod(self.sizes):,} cells vs {math.prod(sizes):,}"
            )
        parts = [self.term(j) for j in range(self.num_terms)]
        return KronUnion.concatenate([KronUnion.term_of(_align(fs, sizes), w) for w, fs in parts])

    def scale(self, c: float) -> KronUnion:
        return KronUnion(self.factors, self.index, self.weights * c)

    # ------------------------------------------------------------------ access
    @property
    def num_terms(self) -> int:
        return self.weights.size

    @property
    def dim(self) -> int:
        return len(self.factors)

    def term(self, j: int) -> tuple[float, list[Matrix]]:
        """Weight and factor list of term ``j``."""
        return float(self.weights[j]), [self.factors[i][k] for i, k in enumerate(self.index[j])]

    def per_factor(self, fn) -> list[np.ndarray]:
        """``[array(fn(f) for f in factors[i]) for each attribute i]``: computed once per factor."""
        return [np.array([fn(f) for f in fs], dtype=float) for fs in self.factors]

    def gather(self, values: Sequence[np.ndarray]) -> np.ndarray:
        """The ``(terms, d)`` array ``values[i][index[j, i]]`` of per-factor quantities."""
        return np.stack([values[i][self.index[:, i]] for i in range(self.dim)], axis=1)

    def term_rows(self) -> np.ndarray:
        """Number of queries in each term (as floats: a term may have more than 2^63 rows)."""
        return np.rint(self.products(self.per_factor(lambda f: f.shape[0])))

    @functools.cached_property
    def memo(self) -> dict:
        """Quantities derived from this union once and reused (e.g. its trace spectrum); unions are not changed."""
        return {}

    @functools.cached_property
    def deviations(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The index table in sparse form: ``(defaults, terms, attributes, factors)``.

        ``defaults[i]`` is the factor most terms use on attribute ``i``; the other three arrays
        list every place where a term uses another factor (term ``terms[k]`` uses factor
        ``factors[k]`` on attribute ``attributes[k]``), sorted by term. A marginals workload
        over many attributes deviates from the totals only on each marginal's few attributes,
        so per-term products cost what those few do.
        """
        defaults = np.zeros(self.dim, dtype=np.intp)
        if self.num_terms:
            counts = [len(fs) for fs in self.factors]
            two = np.flatnonzero(np.array(counts) == 2)  # e.g. marginals: one column sum decides
            if two.size:
                defaults[two] = 2 * self.index[:, two].sum(axis=0, dtype=np.int64) > self.num_terms
            for i in np.flatnonzero(np.array(counts) > 2):
                defaults[i] = np.bincount(self.index[:, i]).argmax()
        terms, attributes = np.nonzero(self.index != defaults.astype(self.index.dtype))
        return defaults, terms, attributes, self.index[terms, attributes]

    def products(self, values: Sequence[np.ndarray], exclude: int | None = None) -> np.ndarray:
        """Per term, ``prod_i values[i][index[j, i]]`` (attribute ``exclude`` left out), in ``O(terms + deviations)``.

        The product of every attribute's default value is taken once and corrected on the
        attributes where a term deviates (:attr:`deviations`); zero defaults are counted rather
        than divided by. Falls back to the ``(terms, d)`` table when that product leaves the
        floating-point range.
        """
        defaults, terms, attributes, factors = self.deviations
        values = [np.asarray(v, dtype=float) for v in values]
        base = np.array([values[i][defaults[i]] for i in range(self.dim)], dtype=float)
        offsets = np.cumsum([0] + [v.size for v in values])
        deviating = np.concatenate(values)[offsets[attributes] + factors]
        if exclude is not None:
            base[exclude] = 1.0
            deviating = np.where(attributes == exclude, 1.0, deviating)
        zero = base == 0
        safe = np.where(zero, 1.0, base)
        total = float(np.prod(safe))
        if not (0.0 < abs(total) < np.inf):
            table = self.gather(values)
            if exclude is not None:
                table[:, exclude] = 1.0
            return np.prod(table, axis=1)
        out = np.full(self.num_terms, total)
        if terms.size:
            starts = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]])
            out[terms[starts]] *= np.multiply.reduceat(deviating / safe[attributes], starts)
        if zero.any():
            covered = np.bincount(terms, weights=zero[attributes], minlength=self.num_terms)
            out[covered < zero.sum()] = 0.0
        return out

    def __repr__(self) -> str:
        return f"KronUnion({self.num_terms} terms over sizes {self.sizes})"


# ====================================================================== normal form
#: Normal forms already computed, per matrix object (matrices are not changed after construction).
_NORMAL_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kron_union(M: Matrix) -> KronUnion:
    """Matrix ``M`` as a union of weighted Kronecker products (its normal form), computed once per matrix.

    See :func:`normal_form`, which computes it; modules register their own matrices with
    ``kron_union.register`` (the same as ``normal_form.register``).

    >>> from hdmm.matrix import Identity
    >>> M = Identity(3)
    >>> kron_union(M) is kron_union(M)
    True
    """
    try:
        cached = _NORMAL_FORMS.get(M)
    except TypeError:  # not hashable or not weakly referenceable: compute every time
        return normal_form(M)
    if cached is None:
        cached = normal_form(M)
        _NORMAL_FORMS[M] = cached
    return cached


@functools.singledispatch
def normal_form(M: Matrix) -> KronUnion:
    """Matrix ``M`` as a union of weighted Kronecker products (its normal form).

    A matrix without Kronecker structure of its own is one term with one factor. Kronecker
    products, weighted matrices and stacked unions are taken apart; modules defining matrices
    with a union structure of their own register it (``kron_union.register``). Raises
    :class:`FactorMismatchError` when the terms of a stack cannot be lined up attribute by
    attribute.

    >>> from hdmm.matrix import Identity, Kronecker, Ones
    >>> normal_form(Kronecker([Identity(2), 3.0 * Ones(1, 4)]))
    KronUnion(1 terms over sizes (2, 4))
    """
    if not isinstance(M, Matrix):
        raise TypeError(f"expected an hdmm matrix, got {type(M).__name__}")
    return KronUnion.single([M])


kron_union.register = normal_form.register


@normal_form.register
def _kronecker_normal_form(M: Kronecker) -> KronUnion:
    return KronUnion.single(M.factors)


@normal_form.register
def _stack_normal_form(M: VStack) -> KronUnion:
    return KronUnion.concatenate([kron_union(b) for b in M.blocks])


@normal_form.register
def _weighted_normal_form(M: Weighted) -> KronUnion:
    return kron_union(M.base).scale(M.weight)


def outer_rows(parts: list[np.ndarray], combine=np.multiply) -> np.ndarray:
    """``combine``-outer product of per-factor row vectors, flattened in C order: the values of a Kronecker
    term's rows (e.g. per-query variances, with ``np.multiply``) from one vector per attribute.

    >>> outer_rows([np.array([1.0, 2.0]), np.array([1.0, 10.0, 100.0])]).tolist()
    [1.0, 10.0, 100.0, 2.0, 20.0, 200.0]
    """
    out = parts[0]
    for p in parts[1:]:
        out = combine.outer(out, p).ravel()
    return out


def aligned_pair(W: Matrix, a_union: KronUnion) -> tuple[KronUnion, KronUnion] | None:
    """The workload's normal form and the strategy's union ``a_union`` on common attribute factors (either may
    have its factors merged), or ``None`` when their factors cannot be lined up attribute by attribute."""
    try:
        w_union = kron_union(W)
        if w_union.sizes != a_union.sizes:
            sizes = KronUnion.common_sizes([w_union, a_union])
            w_union, a_union = w_union.align(sizes), a_union.align(sizes)
    except FactorMismatchError:
        return None
    return w_union, a_union
