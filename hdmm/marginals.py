r"""Marginal workloads and the marginals algebra (docs/math.md, section 3).

With :math:`P_i = J/n_i` and :math:`Q_i = I - P_i` on attribute :math:`i`, the projectors

.. math:: E_T = \bigotimes_{i \in T} Q_i \bigotimes_{i \notin T} P_i, \qquad T \subseteq [d],

are orthogonal, idempotent and sum to the identity; :math:`\mathrm{tr}(E_T) = \prod_{i\in T}(n_i - 1)`.
For a Kronecker product Gram :math:`G = \bigotimes_i G_i` the traces factor,

.. math:: \mathrm{tr}(E_T G) = \prod_{i \in T} \mathrm{tr}(Q_i G_i) \prod_{i \notin T} \mathrm{tr}(P_i G_i),

with :math:`\mathrm{tr}(P_i G_i) = \|F_i 1\|^2 / n_i` and :math:`\mathrm{tr}(Q_i G_i) = \|F_i\|_F^2 -
\mathrm{tr}(P_i G_i)` for :math:`G_i = F_i^T F_i`. This module computes the *trace spectrum*

.. math:: \tau_T(W) = \mathrm{tr}(E_T W^T W) / N

of any union of Kronecker products, enumerating only the subsets with :math:`\tau_T > 0`
(for marginals: the downward closure of the workload's attribute sets, never all
:math:`2^d`). Dividing by :math:`N = \prod_i n_i` keeps every number of order one however
many attributes there are. When every factor Gram is of the form :math:`aI + bJ` (marginals,
totals, identities, their unions) the Gram is :math:`\sum_T \mu_T E_T` with
:math:`\mu_T = N \tau_T / \mathrm{tr}(E_T)`: its pseudo-inverse, its singular values and the
error of any workload under it are read off the spectrum.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Mapping, Sequence

import numpy as np

from .domain import Domain
from .matrix import Identity, Kronecker, KronVector, Matrix, Ones, Product, Weighted, norm_powers
from .validation import ZERO_RTOL, check_dense_size, check_norm
from .kron_union import KronUnion, kron_union

__all__ = [
    "SubsetProducts",
    "Marginals",
    "Residuals",
    "Helmert",
    "helmert",
    "Marginal",
    "DimKMarginals",
    "AllMarginals",
    "TraceSpectrum",
    "trace_spectrum",
    "factor_traces",
    "expand_subsets",
    "workload_domain",
]

#: Largest number of (term, subset) pairs the spectrum enumeration will generate.
ENUMERATION_LIMIT = 50_000_000


def as_domain(domain: Domain | Sequence[int]) -> Domain:
    """A :class:`Domain`, or one with attributes named ``a0, a1, ...`` for a tuple of sizes."""
    if isinstance(domain, Domain):
        return domain
    sizes = tuple(domain)
    return Domain([f"a{i}" for i in range(len(sizes))], sizes)


def workload_domain(W: Matrix, sizes: Sequence[int]) -> Domain:
    """The attributes of workload ``W`` over ``sizes``, names included, as found on it or its parts
    (a ``domain`` attribute, or a Kronecker product's factor names); else ``a0, a1, ...``.

    >>> import hdmm
    >>> W = hdmm.DimKMarginals(hdmm.Domain(["age", "sex"], [3, 2]), 1)
    >>> workload_domain(W, (3, 2)).names
    ('age', 'sex')
    >>> workload_domain(hdmm.Identity(6), (3, 2)).names
    ('a0', 'a1')
    """
    sizes = tuple(int(n) for n in sizes)
    parts = [W]
    while parts:
        M = parts.pop(0)
        domain = getattr(M, "domain", None)
        if isinstance(domain, Domain) and tuple(domain.shape) == sizes:
            return domain
        if isinstance(M, Kronecker) and tuple(f.shape[1] for f in M.factors) == sizes:
            try:  # names only label queries: any that make no domain (None, repeated, ...) are skipped
                return Domain(M.names, sizes)
            except (TypeError, ValueError):
                pass
        parts += [M.base] if isinstance(M, Weighted) else list(getattr(M, "blocks", []))
    return as_domain(sizes)


def subset_keys(members: np.ndarray) -> np.ndarray:
    """Hashable, sortable keys (numpy void scalars) for rows of a boolean membership matrix."""
    packed = np.ascontiguousarray(np.packbits(members, axis=1))
    return packed.view(np.dtype((np.void, packed.shape[1]))).ravel()


def member_products(members: np.ndarray, inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """Per subset ``T`` (row of ``members``), ``prod_{i in T} inside[i] * prod_{i not in T} outside[i]``.

    Computed from the members only (``O(subsets + members)``, not ``subsets x d``) when every
    ``outside`` value is positive and their product is a normal float, else row by row.

    >>> member_products(np.array([[True, False], [False, False]]), np.array([2.0, 3.0]), np.array([5.0, 7.0]))
    array([14., 35.])
    """
    inside, outside = np.asarray(inside, dtype=float), np.asarray(outside, dtype=float)
    total = float(np.prod(outside))
    if not (np.all(outside > 0) and np.isfinite(total) and total >= np.finfo(float).tiny):
        return np.prod(np.where(members, inside, outside), axis=1)
    rows, cols = np.nonzero(members)
    out = np.full(members.shape[0], total)
    if rows.size:
        starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        out[rows[starts]] *= np.multiply.reduceat(inside[cols] / outside[cols], starts)
    return out


# ====================================================================== trace spectrum
def factor_traces(f: Matrix) -> tuple[float, float]:
    r"""``(tr(P G) / n, tr(Q G) / n)`` for the Gram ``G = f^T f`` of a one-attribute factor.

    Computed from one product ``f @ 1`` and the column norms: no Gram is formed.
    """
    n = f.shape[1]
    image = f @ np.ones(n)
    p = float(image @ image) / n
    frob = f.column_norm_powers(2).sum()
    q = frob - p
    if q <= ZERO_RTOL * frob:
        q = 0.0
    return p / n, q / n


class TraceSpectrum:
    r"""The subsets ``T`` with :math:`\tau_T > 0` and their values, sorted by key.

    Attributes
    ----------
    sizes : tuple of int
        Attribute sizes ``n_i``.
    members : ndarray of bool, shape (subsets, d)
        Membership of each subset ``T``.
    tau : ndarray
        :math:`\tau_T = \mathrm{tr}(E_T G)/N`.
    """

    def __init__(self, sizes: tuple[int, ...], members: np.ndarray, tau: np.ndarray):
        self.sizes = sizes
        self.members = members
        self.tau = tau
        self.keys = subset_keys(members)

    @functools.cached_property
    def trace_E(self) -> np.ndarray:
        r""":math:`\mathrm{tr}(E_T) = \prod_{i \in T} (n_i - 1)` for each subset."""
        return np.rint(member_products(self.members, np.array(self.sizes, dtype=float) - 1, np.ones(len(self.sizes))))

    @property
    def residual_error(self) -> float:
        r""":math:`(\sum_T \sqrt{\tau_T\,\mathrm{tr}(E_T)})^2`: the least total squared error at unit noise
        of any strategy in the marginals algebra with L2 sensitivity 1 (the optimal residual
        strategy's), and the SVD bound of a workload in the algebra (docs/math.md, sections 4.8 and 5.3)."""
        return float(np.sum(np.sqrt(self.trace_E * self.tau))) ** 2

    @property
    def eigenvalues(self) -> np.ndarray:
        r""":math:`\mu_T / N = \tau_T / \mathrm{tr}(E_T)`: the normalised eigenvalue on each ``E_T``.

        Meaningful only for Grams in the marginals algebra (:func:`hdmm.structure.in_marginal_algebra`).
        """
        trace_E = self.trace_E
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(trace_E > 0, self.tau / trace_E, 0.0)

    def lookup(self, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        """``values`` at the given subset keys, 0 where a subset is not in this spectrum."""
        pos = np.searchsorted(self.keys, keys)
        pos = np.minimum(pos, self.keys.size - 1)
        found = self.keys[pos] == keys
        return np.where(found, values[pos], 0.0)


def _expand(union: KronUnion, traces: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (term, T, contribution) triples with a non-zero contribution to tau_T.

    ``traces`` are the per-attribute ``(factors, 2)`` arrays of the pair ``(p, q)`` multiplied in
    for an attribute outside and inside ``T`` (default :func:`factor_traces`, giving tau_T; other
    pairs give other subset sums of the same shape, see :func:`expand_subsets`).

    Term ``j`` contributes ``c_j^2 prod_{i in T} q_ij prod_{i not in T} p_ij`` to tau_T; the
    subsets with a non-zero product contain ``R_j = {i: p_ij = 0}`` and lie inside
    ``F_j = {i: q_ij > 0}``, so only those ``2^{|F_j - R_j|}`` subsets are generated.

    Attributes on which a term uses its attribute's most common factor
    (:attr:`~hdmm.kron_union.KronUnion.deviations`) and that factor is a total-like one
    (``q = 0 < p``: never in ``T``) contribute only the factor ``p``: they are folded into one
    product, so the work follows the terms' few other attributes (a marginal's own), not ``d``.
    Subsets are returned as packed keys (:func:`subset_keys`' bytes), members only for the
    distinct ones.
    """
    d, T = union.dim, union.num_terms
    if traces is None:
        traces = union.per_factor(factor_traces)  # per attribute: (factors, 2)
    offsets = np.cumsum([0] + [t.shape[0] for t in traces])
    p_all = np.concatenate([t[:, 0] for t in traces])
    q_all = np.concatenate([t[:, 1] for t in traces])
    defaults, dev_terms, dev_attrs, dev_factors = union.deviations
    p_def, q_def = p_all[offsets[:-1] + defaults], q_all[offsets[:-1] + defaults]
    static = (q_def <= 0) & (p_def > 0)
    # the (term, attribute) pairs that matter: deviations, and every term on non-static attributes
    keep = static[dev_attrs]
    moving = np.flatnonzero(~static)
    terms = np.concatenate([dev_terms[keep], np.repeat(np.arange(T), moving.size)])
    attrs = np.concatenate([dev_attrs[keep], np.tile(moving, T)])
    factors = union.index[terms, attrs]
    order = np.lexsort((attrs, terms))
    terms, attrs, factors = terms[order], attrs[order], factors[order]
    p, q = p_all[offsets[attrs] + factors], q_all[offsets[attrs] + factors]
    allowed, required = q > 0, p <= 0
    dead = np.bincount(terms, weights=required & ~allowed, minlength=T) > 0
    live = ~dead & (union.weights != 0)
    # base: c^2, the static defaults' p, each pair's p where T cannot hold it, q where T must
    base = union.weights**2 * union.products(
        [np.where((np.arange(t.shape[0]) == defaults[i]) & static[i], p_def[i], 1.0) for i, t in enumerate(traces)])
    factor = np.where(allowed, 1.0, p) * np.where(required, q, 1.0)
    if terms.size:
        starts = np.flatnonzero(np.r_[True, terms[1:] != terms[:-1]])
        base[terms[starts]] *= np.multiply.reduceat(factor, starts)
    free = allowed & ~required
    counts = np.bincount(terms[free], minlength=T)
    total = int(np.sum(2.0 ** counts[live]))
    if total > ENUMERATION_LIMIT:
        raise ValueError(
            f"the marginals-algebra computation would enumerate {total:,} attribute subsets "
            f"(limit {ENUMERATION_LIMIT:,}); the workload has terms over too many attributes at once"
        )
    width = (d + 7) // 8
    bit = (128 >> (np.arange(d) % 8)).astype(np.uint8)
    byte = np.arange(d) // 8
    must = np.zeros((T, width), dtype=np.uint8)
    np.bitwise_or.at(must, (terms[required], byte[attrs[required]]), bit[attrs[required]])
    free_terms, free_attrs, pf_all, qf_all = terms[free], attrs[free], p[free], q[free]
    term_ids, keys, values = [], [], []
    for k in np.unique(counts[live]):
        rows = np.flatnonzero(live & (counts == k))
        pick = np.isin(free_terms, rows) if k else np.zeros(0, dtype=bool)
        cols = free_attrs[pick].reshape(rows.size, k)  # pairs are sorted by term: rows in order
        pf, qf = pf_all[pick].reshape(rows.size, k), qf_all[pick].reshape(rows.size, k)
        ar = np.arange(rows.size)
        for mask in range(2**k):
            sel = [(mask >> b) & 1 == 1 for b in range(k)]
            key = must[rows]
            value = base[rows].copy()
            for b in range(k):
                if sel[b]:
                    key[ar, byte[cols[:, b]]] |= bit[cols[:, b]]
                value *= qf[:, b] if sel[b] else pf[:, b]
            term_ids.append(rows)
            keys.append(key)
            values.append(value)
    if not term_ids:
        return np.zeros(0, dtype=np.intp), np.zeros((0, width), dtype=np.uint8), np.zeros(0)
    return np.concatenate(term_ids), np.vstack(keys), np.concatenate(values)


def trace_spectrum(union: KronUnion, with_terms: bool = False):
    r"""The trace spectrum :math:`\tau_T = \mathrm{tr}(E_T W^T W)/N` of a union of Kronecker products.

    With ``with_terms=True`` also returns the per-(term, subset) contributions
    ``(term_ids, position of T in the spectrum, value)`` used for per-query quantities.
    """
    if "trace spectrum" not in union.memo:  # computed once per union
        union.memo["trace spectrum"] = _trace_spectrum(union)
    spectrum, terms = union.memo["trace spectrum"]
    return (spectrum, terms) if with_terms else spectrum


def _trace_spectrum(union: KronUnion) -> tuple[TraceSpectrum, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return expand_subsets(union, None)


def expand_subsets(union: KronUnion, traces: list[np.ndarray] | None
                   ) -> tuple[TraceSpectrum, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    r"""Per subset ``T``, :math:`\sum_j c_j^2 \prod_{i \in T} q_{ij} \prod_{i \notin T} p_{ij}`, and the
    per-(term, subset) contributions ``(term_ids, position of T, value)``.

    ``traces[i]`` is the ``(factors, 2)`` array of ``(p, q)`` for each factor of attribute ``i``
    (``None``: :func:`factor_traces`, which gives the trace spectrum). Only subsets with a
    non-zero contribution are enumerated: ``T`` holds every attribute where ``p = 0`` and none
    where ``q = 0``.
    """
    term_ids, packed, values = _expand(union, traces)
    keys = np.ascontiguousarray(packed).view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    tau = np.bincount(inverse, weights=values, minlength=first.size)
    members = np.unpackbits(packed[first], axis=1, count=union.dim).astype(bool)
    return TraceSpectrum(union.sizes, members, tau), (term_ids, inverse, values)


# ====================================================================== subset-indexed products
class SubsetProducts(Matrix):
    r"""A weighted union of Kronecker products indexed by attribute subsets ``S``:

    .. math:: \mathrm{VStack}_S \; w_S \bigotimes_{i \in S} F^{in}_i \bigotimes_{i \notin S} F^{out}_i .

    Stored as a boolean ``(subsets, d)`` membership matrix and a weight vector, so hundreds of
    thousands of subsets cost a few megabytes. Subclasses choose the two factors of each
    attribute (:meth:`_attribute_factors`).
    """

    def __init__(self, domain: Domain | Sequence[int], weights: Mapping[Sequence, float]):
        domain = as_domain(domain)
        items = list(weights.items())
        members = np.zeros((len(items), len(domain)), dtype=bool)
        w = np.empty(len(items))
        for row, (attrs, weight) in enumerate(items):
            if isinstance(attrs, (str, int, np.integer)):
                attrs = (attrs,)
            members[row, list(domain.indices(attrs))] = True
            w[row] = weight
        self._setup(domain, members, w)

    @classmethod
    def from_members(cls, domain: Domain | Sequence[int], members: np.ndarray, weights: np.ndarray):
        """Build from a boolean ``(subsets, d)`` membership matrix and weights."""
        self = cls.__new__(cls)
        self._setup(as_domain(domain), np.asarray(members, dtype=bool), np.asarray(weights, dtype=float))
        return self

    def _attribute_factors(self, n: int) -> tuple[Matrix, Matrix]:
        """``(F_out, F_in)`` for an attribute with ``n`` values."""
        raise NotImplementedError

    def _factors_of(self, i: int, n: int) -> tuple[Matrix, Matrix]:
        """``(F_out, F_in)`` of attribute ``i`` (with ``n`` values); the same for every attribute by default."""
        return self._attribute_factors(n)

    def _setup(self, domain: Domain, members: np.ndarray, weights: np.ndarray) -> None:
        if members.ndim != 2 or members.shape[1] != len(domain) or weights.shape != (members.shape[0],):
            raise ValueError("members must be (subsets, attributes) and weights one per subset")
        if members.shape[0] == 0:
            raise ValueError(f"{type(self).__name__} needs at least one attribute subset")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0):
            raise ValueError("subset weights must be finite and non-negative")
        if np.unique(subset_keys(members)).size != members.shape[0]:
            raise ValueError("each attribute subset may appear only once; combine their weights")
        self.domain = domain
        self.members = members
        self.weights = weights
        self.factors = [list(self._factors_of(i, n)) for i, n in enumerate(domain.shape)]
        inside = np.array([fs[1].shape[0] for fs in self.factors], dtype=float)
        outside = np.array([fs[0].shape[0] for fs in self.factors], dtype=float)
        self.rows_per_subset = np.rint(member_products(members, inside, outside)).astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.rows_per_subset)])
        self.shape = (int(self.offsets[-1]), domain.size)

    @property
    def subsets(self) -> list[tuple[str, ...]]:
        """The attribute subsets, as tuples of names."""
        names = self.domain.names
        return [tuple(names[i] for i in np.flatnonzero(row)) for row in self.members]

    def _term(self, row: int) -> Kronecker:
        return Kronecker([fs[int(m)] for fs, m in zip(self.factors, self.members[row])])

    def column_support(self):
        # each subset's rows are a weighted Kronecker product, computed as such (see _matmat)
        supports = [(fs[0].column_support(), fs[1].column_support()) for fs in self.factors]
        return sum(math.prod(pair[int(m)] for pair, m in zip(supports, self.members[row]))
                   for row in range(self.members.shape[0]) if self.weights[row] != 0)

    def _matmat(self, X):
        out = np.empty((self.shape[0], X.shape[1]))
        for row in range(self.members.shape[0]):
            out[self.offsets[row] : self.offsets[row + 1]] = self.weights[row] * self._term(row)._matmat(X)
        return out

    def _rmatmat(self, Y):
        out = np.zeros((self.shape[1], Y.shape[1]))
        for row in range(self.members.shape[0]):
            out += self.weights[row] * self._term(row)._rmatmat(Y[self.offsets[row] : self.offsets[row + 1]])
        return out

    def column_norm_powers(self, p):
        check_norm(p)
        rows = [np.vstack([f.column_norm_powers(p).to_array() for f in fs]) for fs in self.factors]
        return KronVector.factored(self.domain.shape, norm_powers(self.weights, p), rows, self.members.view(np.uint8))

    def _subset_of_row(self, row: int) -> tuple[int, int]:
        k = int(np.searchsorted(self.offsets, row, side="right")) - 1
        return k, row - int(self.offsets[k])

    def __repr__(self):
        domain = repr(self.domain) if len(self.domain) <= 8 else f"{len(self.domain)} attributes"
        return f"{type(self).__name__}({self.members.shape[0]:,} subsets over {domain})"


class Marginals(SubsetProducts):
    r"""A weighted set of marginals: for each attribute subset ``S`` the counts of every
    combination of values of the attributes in ``S``, scaled by ``w_S``.

    .. math:: M_S = \bigotimes_{i \in S} I_{n_i} \bigotimes_{i \notin S} 1^T, \qquad
              W = \mathrm{VStack}_S \; w_S M_S .

    Serves both as a workload and as a weighted marginals strategy (OPT_M). Every column has
    the same norms: ``D_1 = sum_S w_S`` and ``D_2 = sqrt(sum_S w_S^2)``.

    Parameters
    ----------
    domain
        A :class:`Domain` or a tuple of attribute sizes.
    weights
        Mapping from attribute subsets (tuples of names or indices; ``()`` is the total) to
        non-negative weights.

    Examples
    --------
    All marginals of two attributes with 2 and 3 values: the total, both one-way marginals and
    the full table, 1 + 2 + 3 + 6 queries; each cell is in one query of each, so both
    sensitivities follow from the four unit weights.

    >>> from hdmm.marginals import AllMarginals
    >>> W = AllMarginals((2, 3))
    >>> W.shape, W.sensitivity(1), round(W.sensitivity(2) ** 2, 12)
    ((12, 6), 4.0, 4.0)
    """

    def _attribute_factors(self, n):
        return Ones(1, n), Identity(n)

    def gram(self):
        return _MarginalsGram(self)

    def column_norm_powers(self, p):
        check_norm(p)
        ones = tuple(np.broadcast_to(1.0, n) for n in self.domain.shape)
        return KronVector(self.domain.shape, [(float(np.sum(norm_powers(self.weights, p))), ones)])

    def describe(self, row, name=None, values=None):
        k, r = self._subset_of_row(row)
        inside = np.flatnonzero(self.members[k])
        if inside.size == 0:
            return None
        cell = np.unravel_index(r, tuple(self.domain.shape[i] for i in inside))
        names = self.domain.names
        return " & ".join(f"{names[i]}={self.domain.values(names[i])[int(v)]}" for i, v in zip(inside, cell))


class _MarginalsGram(Product):
    r"""``M^T M = sum_S w_S^2 G_S``; every ``G_S`` has a unit diagonal, so diag and trace are closed form."""

    def __init__(self, marginals: Marginals):
        super().__init__(marginals.T, marginals)
        self._total = float(np.sum(marginals.weights**2))

    @property
    def T(self):
        return self

    def diag(self):
        return np.full(self.shape[0], self._total)

    def trace(self):
        return self._total * self.shape[0]


def helmert(n: int) -> np.ndarray:
    r"""An orthonormal basis of the zero-sum vectors of length ``n``, as ``n - 1`` rows ``R``.

    Row ``k`` is :math:`(1, \dots, 1, -k, 0, \dots, 0)/\sqrt{k(k+1)}` (``k`` ones), so
    :math:`R^T R = I - J/n = Q`.
    """
    R = np.zeros((n - 1, n))
    for k in range(1, n):
        R[k - 1, :k] = 1.0
        R[k - 1, k] = -k
        R[k - 1] /= np.sqrt(k * (k + 1))
    return R


class Helmert(Matrix):
    r"""The :func:`helmert` basis as an implicit ``(n - 1) x n`` matrix with ``O(n)`` products.

    With :math:`c_k = y_{k-1}/\sqrt{k(k+1)}`: :math:`(Hx)_{k-1} = (\sum_{j<k} x_j - k x_k)/\sqrt{k(k+1)}`
    and :math:`(H^Ty)_j = \sum_{k>j} c_k - j c_j`. The rows are orthonormal, so
    :math:`H^+ = H^T`, and :math:`H^TH = I - J/n`.
    """

    fast_pinv = True

    def __init__(self, n: int):
        if int(n) < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.n = int(n)
        self.shape = (self.n - 1, self.n)
        k = np.arange(1, self.n, dtype=float)
        self._norms = np.sqrt(k * (k + 1))

    def _matmat(self, X):
        k = np.arange(1, self.n, dtype=float)[:, None]
        return (np.cumsum(X, axis=0)[:-1] - k * X[1:]) / self._norms[:, None]

    def _rmatmat(self, Y):
        c = np.zeros((self.n, Y.shape[1]))
        c[1:] = Y / self._norms[:, None]                        # c_k, k = 1 .. n-1 (c_0 = 0)
        after = np.cumsum(c[::-1], axis=0)[::-1] - c            # sum over k > j
        return after - np.arange(self.n, dtype=float)[:, None] * c

    def column_norm_powers(self, p):
        check_norm(p)
        if p == 2:
            return KronVector.from_array(np.full(self.n, 1.0 - 1.0 / self.n))
        c = np.zeros(self.n)
        c[1:] = 1.0 / self._norms
        after = np.cumsum(c[::-1])[::-1] - c
        return KronVector.from_array(after + np.arange(self.n) * c)

    def pinv(self):
        return self.T

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a Helmert basis", max_entries)
        return helmert(self.n)

    def describe(self, row, name=None, values=None):
        return f"{name or 'value'}: contrast {row + 1}"

    def __repr__(self):
        return f"Helmert(n={self.n})"

    def _key(self):
        return ("Helmert", self.n)


class Residuals(SubsetProducts):
    r"""Residual measurements: for each subset ``T`` the queries :math:`\sqrt{\lambda_T}\,R_T`
    with :math:`R_T = \bigotimes_{i \in T} H_i \bigotimes_{i \notin T} 1^T/\sqrt{n_i}`
    (``H_i`` the :func:`helmert` basis), so that :math:`R_T^T R_T = E_T` and the Gram is
    :math:`\sum_T \lambda_T E_T`. The weights given are :math:`\sqrt{\lambda_T}`.

    Every column has squared L2 norm :math:`\sum_T \lambda_T \mathrm{tr}(E_T)/N`. Under
    Gaussian noise the optimal strategy for any marginals workload has this form
    (docs/math.md, section 4.8).
    """

    def _attribute_factors(self, n):
        return Weighted(Ones(1, n), 1.0 / np.sqrt(n)), Helmert(n)

    def column_norm_powers(self, p):
        if p == 1:
            return super().column_norm_powers(p)
        check_norm(p)
        sizes = np.array(self.domain.shape, dtype=float)
        trace_E = member_products(self.members, (sizes - 1) / sizes, 1.0 / sizes)
        ones = tuple(np.broadcast_to(1.0, n) for n in self.domain.shape)
        return KronVector(self.domain.shape, [(float(self.weights**2 @ trace_E), ones)])

    def describe(self, row, name=None, values=None):
        k, r = self._subset_of_row(row)
        names = [self.domain.names[i] for i in np.flatnonzero(self.members[k])]
        return f"residual ({', '.join(names) or 'total'}) #{r}"


def Marginal(domain: Domain | Sequence[int], attrs: Sequence) -> Marginals:
    """The single marginal over ``attrs`` (names or indices): one query per value combination."""
    if isinstance(attrs, (str, int, np.integer)):
        attrs = (attrs,)
    return Marginals(domain, {tuple(attrs): 1.0})


def _subsets_of_size(d: int, k: int) -> np.ndarray:
    if k == 0:
        return np.zeros((1, d), dtype=bool)
    combos = np.array(list(itertools.combinations(range(d), k)), dtype=np.intp).reshape(-1, k)
    members = np.zeros((combos.shape[0], d), dtype=bool)
    members[np.arange(combos.shape[0])[:, None], combos] = True
    return members


def DimKMarginals(domain: Domain | Sequence[int], k: int) -> Marginals:
    """All marginals over exactly ``k`` attributes, each with weight 1."""
    domain = as_domain(domain)
    if not 0 <= k <= len(domain):
        raise ValueError(f"k must be between 0 and the number of attributes ({len(domain)}), got {k}")
    members = _subsets_of_size(len(domain), k)
    return Marginals.from_members(domain, members, np.ones(members.shape[0]))


def AllMarginals(domain: Domain | Sequence[int], max_size: int | None = None) -> Marginals:
    """All marginals over at most ``max_size`` attributes (all of them by default), the total included."""
    domain = as_domain(domain)
    d = len(domain)
    max_size = d if max_size is None else max_size
    if not 0 <= max_size <= d:
        raise ValueError(f"max_size must be between 0 and the number of attributes ({d}), got {max_size}")
    members = np.vstack([_subsets_of_size(d, k) for k in range(max_size + 1)])
    return Marginals.from_members(domain, members, np.ones(members.shape[0]))


@kron_union.register
def _subset_products_normal_form(M: SubsetProducts) -> KronUnion:
    """One term per attribute subset, sharing each attribute's two factors."""
    return KronUnion(M.factors, M.members.view(np.uint8), M.weights)
