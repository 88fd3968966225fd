r"""Residual measurements with a basis per attribute (docs/math.md, section 4.9).

With :math:`P_i = J/n_i` and :math:`Q_i = I - P_i`, take on each attribute a basis
:math:`B_i` whose rows sum to zero (:math:`B_i 1 = 0`) with Gram :math:`X_i = B_i^TB_i`, and for
each attribute subset ``T`` the queries

.. math:: \sqrt{\kappa_T}\,R_T, \qquad R_T = \bigotimes_{i \in T} B_i \bigotimes_{i \notin T} 1^T/\sqrt{n_i},
          \qquad R_T^TR_T = K_T = \bigotimes_{i \in T} X_i \bigotimes_{i \notin T} P_i .

Because :math:`X_i P_i = 0`, the :math:`K_T` of different subsets multiply to zero: the Gram
:math:`\sum_T \kappa_T K_T` has the pseudo-inverse :math:`\sum_T \kappa_T^{-1} K_T^+` with
:math:`K_T^+ = \bigotimes_{i \in T} X_i^+ \bigotimes_{i \notin T} P_i`. Every quantity of a
union-of-Kronecker workload under it is then a sum over subsets of products of per-attribute
traces: :func:`residual_form` recognises the structure on any union of Kronecker products (each
attribute's factors totals, whose Gram is :math:`bJ`, or one zero-sum factor), and
:func:`residual_traces`, :func:`residual_query_variances` and :func:`apply_residual_pinv` give
the exact error, per-query variances and reconstruction from the factors at any size. With
Helmert bases (:math:`X_i = Q_i`) this is :class:`hdmm.marginals.Residuals`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .domain import Domain
from .kron_union import KronUnion, outer_rows
from .marginals import (Helmert, SubsetProducts, TraceSpectrum, as_domain, expand_subsets, member_products,
                        subset_keys)
from .matrix import Explicit, Matrix, Ones, Weighted, norm_powers
from .validation import ZERO_RTOL, check_norm

__all__ = ["ResidualBases", "ResidualForm", "residual_form", "residual_traces", "residual_query_variances",
           "apply_residual_pinv", "basis_from_gram", "RESIDUAL_DENSE_MAX"]

#: Largest attribute size whose residual basis Gram is handled densely (its pseudo-inverse).
RESIDUAL_DENSE_MAX = 4096

#: Relative tolerance on ``B 1 = 0`` (against the basis' Frobenius norm times ``sqrt(n)``).
ZERO_SUM_RTOL = 1e-9


def basis_from_gram(X: np.ndarray) -> np.ndarray:
    r"""Rows ``B`` with :math:`B^TB = X` for a PSD ``X`` with :math:`X1 = 0` (to round-off): one row per
    eigenvalue above ``ZERO_RTOL`` of the largest, each projected to sum exactly to zero."""
    X = np.asarray(X, dtype=float)
    w, U = np.linalg.eigh((X + X.T) / 2)
    keep = w > ZERO_RTOL * max(w[-1], 0.0)
    B = np.sqrt(w[keep])[:, None] * U[:, keep].T
    return B - B.mean(axis=1, keepdims=True)


def _check_basis(B, n: int, i: int) -> Matrix:
    if B is None:
        return Helmert(n)
    M = B if isinstance(B, Matrix) else Explicit(np.asarray(B, dtype=float))
    if M.shape[1] != n:
        raise ValueError(f"the basis of attribute {i} has {M.shape[1]} columns, but the attribute has {n} values")
    if M.shape[0] and n > 1:
        image = M @ np.ones(n)
        scale = float(np.sqrt(M.column_norm_powers(2).sum() * n))
        if float(np.linalg.norm(image)) > ZERO_SUM_RTOL * max(scale, 1e-300):
            raise ValueError(f"the rows of the basis of attribute {i} must each sum to zero (B @ 1 = 0); "
                             "project them with B - B.mean(axis=1, keepdims=True)")
    return M


class ResidualBases(SubsetProducts):
    r"""Residual measurements with a basis per attribute: for each subset ``T`` the queries
    :math:`\sqrt{\kappa_T}\,\bigotimes_{i \in T} B_i \bigotimes_{i \notin T} 1^T/\sqrt{n_i}`.

    Parameters
    ----------
    domain
        A :class:`Domain` or a tuple of attribute sizes.
    weights
        Mapping from attribute subsets to :math:`\sqrt{\kappa_T} \ge 0`.
    bases
        One basis per attribute (an hdmm matrix or an array, ``k_i x n_i``, rows summing to
        zero), or ``None`` for the Helmert basis.

    Every column has squared L2 norm :math:`\sum_T \kappa_T \prod_{i \in T} (X_i)_{x_ix_i}
    \prod_{i \notin T} 1/n_i`; the largest is attained at each attribute's largest diagonal entry
    of :math:`X_i` at once (every term grows with each), so the sensitivity is exact at any size.
    """

    def __init__(self, domain: Domain | Sequence[int], weights: Mapping[Sequence, float], bases: Sequence):
        domain = as_domain(domain)
        self.bases = self._bases(domain, bases)
        super().__init__(domain, weights)

    @classmethod
    def from_members(cls, domain: Domain | Sequence[int], members: np.ndarray, weights: np.ndarray,
                     bases: Sequence | None = None):
        """Build from a boolean ``(subsets, d)`` membership matrix, the weights and the bases."""
        domain = as_domain(domain)
        self = cls.__new__(cls)
        self.bases = cls._bases(domain, [None] * len(domain) if bases is None else bases)
        self._setup(domain, np.asarray(members, dtype=bool), np.asarray(weights, dtype=float))
        return self

    @staticmethod
    def _bases(domain: Domain, bases: Sequence) -> list[Matrix]:
        bases = list(bases)
        if len(bases) != len(domain):
            raise ValueError(f"give one basis per attribute ({len(domain)}), got {len(bases)}")
        return [_check_basis(B, n, i) for i, (B, n) in enumerate(zip(bases, domain.shape))]

    def _factors_of(self, i, n):
        return Weighted(Ones(1, n), 1.0 / np.sqrt(n)), self.bases[i]

    def sensitivity(self, p: int = 1) -> float:
        r"""Exact :math:`\Delta_p`: column ``x`` has :math:`\sum_T w_T^p \prod_{i \in T} a_i(x_i) \prod_{i \notin T}
        b_i` (``a_i``, ``b_i`` the column norm powers of the attribute's two factors, ``b_i`` constant),
        every term non-decreasing in each :math:`a_i(x_i) \ge 0`: all are largest at each
        attribute's largest :math:`a_i` at once."""
        check_norm(p)
        inside = np.array([fs[1].column_norm_powers(p).to_array().max(initial=0.0) for fs in self.factors])
        outside = np.array([fs[0].column_norm_powers(p).to_array().max() for fs in self.factors])
        total = float(norm_powers(self.weights, p) @ member_products(self.members, inside, outside))
        return total ** (1.0 / p)

    def describe(self, row, name=None, values=None):
        k, r = self._subset_of_row(row)
        names = [self.domain.names[i] for i in np.flatnonzero(self.members[k])]
        return f"residual ({', '.join(names) or 'total'}) #{r}"


# ====================================================================== the structure
@dataclass(frozen=True, eq=False)
class ResidualForm:
    r"""A union of Kronecker products recognised as :math:`\sum_T \kappa_T K_T` (module docstring).

    Attributes
    ----------
    subsets : TraceSpectrum
        The subsets ``T`` with :math:`\kappa_T > 0` (in its ``tau``), sorted by key.
    pinvs : list
        Per attribute :math:`X_i^+` (dense), or ``None`` when no term has a zero-sum factor there.
    projectors : list
        Per attribute the projector :math:`X_iX_i^+` on the range of :math:`X_i`, or ``None``.
    """

    subsets: TraceSpectrum
    pinvs: list
    projectors: list

    @property
    def kappa(self) -> np.ndarray:
        return self.subsets.tau


def _factor_kind(f: Matrix) -> tuple[str, float]:
    """``("zero" | "total" | "residual" | "other", tr(G))`` for a one-attribute factor with Gram ``G``."""
    n = f.shape[1]
    if f.shape[0] == 0:
        return "zero", 0.0
    image = f @ np.ones(n)
    p = float(image @ image) / n
    frob = float(f.column_norm_powers(2).sum())
    if frob <= 0:
        return "zero", 0.0
    q = frob - p
    if q <= ZERO_RTOL * frob:
        return "total", frob
    if p <= ZERO_RTOL * frob:
        return "residual", frob
    return "other", frob


def _pinv_and_projector(B: Matrix) -> tuple[np.ndarray, np.ndarray]:
    X = B.gram().dense()
    w, U = np.linalg.eigh((X + X.T) / 2)
    keep = w > ZERO_RTOL * max(w[-1], 0.0)
    Uk = U[:, keep]
    return (Uk / w[keep]) @ Uk.T, Uk @ Uk.T


def _same_grams(factors: list[Matrix]) -> bool:
    """Whether the factors have one Gram (a union built term by term may repeat equal factors)."""
    if len(factors) == 1:
        return True
    first = factors[0].gram().dense()
    atol = ZERO_RTOL * max(1.0, float(np.abs(first).max()))
    return all(np.allclose(f.gram().dense(), first, rtol=1e-12, atol=atol) for f in factors[1:])


def residual_form(union: KronUnion) -> ResidualForm | None:
    r"""The union as :math:`\sum_T \kappa_T K_T`, or ``None`` when it does not have that form.

    It has it when on every attribute each factor used is a total (Gram :math:`bJ`, rows
    proportional to :math:`1^T`) or zero-sum factors with one Gram (:math:`F1 = 0`; factors
    with no rows or a zero Gram are ignored) of at most ``RESIDUAL_DENSE_MAX`` values. Then term
    ``j`` with zero-sum factors on ``T`` has Gram :math:`c_j^2 \prod_{i \notin T} \mathrm{tr}(G_{ij})\,K_T`.
    Computed once per union.
    """
    if "residual form" not in union.memo:
        union.memo["residual form"] = _residual_form(union)
    return union.memo["residual form"]


def _residual_form(union: KronUnion) -> ResidualForm | None:
    live = union.weights != 0
    kinds = [[_factor_kind(f) for f in fs] for fs in union.factors]
    zero = union.gather([np.array([k == "zero" for k, _ in ks], dtype=float) for ks in kinds]).any(axis=1)
    live &= ~zero
    if not live.any():
        return None
    index = union.index[live]
    residual_factor = np.full(union.dim, -1)
    residual: dict[int, list[int]] = {}
    for i, ks in enumerate(kinds):
        used = np.unique(index[:, i])
        used_kinds = {ks[k][0] for k in used}
        if "other" in used_kinds:
            return None
        res = [int(k) for k in used if ks[k][0] == "residual"]
        if res and (union.sizes[i] > RESIDUAL_DENSE_MAX or not _same_grams([union.factors[i][k] for k in res])):
            return None
        if res:
            residual_factor[i] = res[0]
            residual[i] = res
    members = np.column_stack([np.isin(index[:, i], residual.get(i, [])) for i in range(union.dim)]).reshape(
        index.shape)
    outside = union.gather([np.array([t if k == "total" else 1.0 for k, t in ks]) for ks in kinds])[live]
    kappa = union.weights[live] ** 2 * np.prod(np.where(members, 1.0, outside), axis=1)
    keys = subset_keys(members)
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    kappa = np.bincount(inverse.reshape(-1), weights=kappa, minlength=unique.size)
    subsets = TraceSpectrum(union.sizes, members[first], kappa)
    pinvs, projectors = [], []
    for i, k in enumerate(residual_factor):
        if k < 0:
            pinvs.append(None)
            projectors.append(None)
        else:
            pinv, proj = _pinv_and_projector(union.factors[i][k])
            pinvs.append(pinv)
            projectors.append(proj)
    return ResidualForm(subsets, pinvs, projectors)


# ====================================================================== a workload under the form
def _row_parts(f: Matrix, pinv: np.ndarray | None, proj: np.ndarray | None) -> tuple[np.ndarray, ...]:
    r"""Per row of ``f``: :math:`(fPf^T, fX^+f^T, fQf^T, \text{leak})` diagonals; leak is the part of
    :math:`fQ` outside the range of ``X`` (the rows the form cannot answer)."""
    n = f.shape[1]
    image = f @ np.ones(n)
    p = image**2 / n
    # squared row norms: through the factor's own quadratic form where it is small (ranges use prefix sums)
    rows = f.quadratic_diag(np.eye(n)) if n <= RESIDUAL_DENSE_MAX else f.T.column_norm_powers(2).to_array()
    q = rows - p
    q = np.where(q <= ZERO_RTOL * (p + q), 0.0, q)
    if pinv is None:
        return p, np.zeros_like(p), q, q
    e = f.quadratic_diag(pinv)
    leak = q - f.quadratic_diag(proj)
    leak = np.where(leak <= 1e3 * ZERO_RTOL * np.maximum(q, 1e-300) + ZERO_RTOL * (p + q), 0.0, leak)
    return p, np.where(q > 0, np.maximum(e, 0.0), 0.0), q, leak


def _factor_parts(w_union: KronUnion, form: ResidualForm) -> list[list[tuple[np.ndarray, ...]]]:
    return [[_row_parts(f, form.pinvs[i], form.projectors[i]) for f in fs] for i, fs in enumerate(w_union.factors)]


def _expansion(w_union: KronUnion, form: ResidualForm, parts):
    """Per (term, T): the value :math:`c^2\\prod_{T} \\mathrm{tr}(X^+G)\\prod_{\\bar T}\\mathrm{tr}(PG)`,
    :math:`\\kappa_T` and whether the term's rows leave the form's range there."""
    traces, leaky = [], []
    for fs in parts:
        t = np.array([[p.sum(), (q.sum() if leak.sum() > 0 else e.sum())] for p, e, q, leak in fs]).reshape(-1, 2)
        traces.append(t)
        leaky.append(np.array([leak.sum() > 0 for *_, leak in fs], dtype=bool))
    spectrum, (term_ids, position, values) = expand_subsets(w_union, traces)
    kappa = form.subsets.lookup(spectrum.keys, form.kappa)[position]
    leaks = w_union.gather([lk.astype(float) for lk in leaky]) > 0
    bad = (kappa <= 0) | np.any(spectrum.members[position] & leaks[term_ids], axis=1)
    return spectrum, term_ids, position, values, kappa, bad


def residual_traces(w_union: KronUnion, form: ResidualForm) -> tuple[np.ndarray, np.ndarray]:
    r"""Per workload term, :math:`c_j^2\,\mathrm{tr}((A^TA)^+ G_j) = \sum_T \kappa_T^{-1} c_j^2 \prod_{i \in T}
    \mathrm{tr}(X_i^+G_{ij}) \prod_{i \notin T} \mathrm{tr}(P_iG_{ij})`, and whether each term is
    unsupported (it has weight on a subset with :math:`\kappa_T = 0`, or outside a basis' range)."""
    parts = _factor_parts(w_union, form)
    _, term_ids, _, values, kappa, bad = _expansion(w_union, form, parts)
    contrib = np.where(bad, 0.0, values / np.where(kappa > 0, kappa, 1.0))
    t = np.bincount(term_ids, weights=contrib, minlength=w_union.num_terms)
    unsupported = np.zeros(w_union.num_terms, dtype=bool)
    unsupported[term_ids[bad]] = True
    return t, unsupported



def residual_query_variances(w_union: KronUnion, form: ResidualForm) -> np.ndarray:
    r"""Per workload query, :math:`\sum_T \kappa_T^{-1} c^2 \prod_{i \in T} f_iX_i^+f_i^T \prod_{i \notin T}
    f_iP_if_i^T` (``inf`` where the form does not answer the query), in the union's row order."""
    parts = _factor_parts(w_union, form)
    spectrum, term_ids, position, _, kappa, bad = _expansion(w_union, form, parts)
    rows = w_union.term_rows()
    out = []
    for j in range(w_union.num_terms):
        c2 = w_union.weights[j] ** 2
        variance = np.zeros(int(rows[j]))
        unsupported = np.zeros(int(rows[j]), dtype=bool)
        picks = np.flatnonzero(term_ids == j)
        for entry in picks:
            members = spectrum.members[position[entry]]
            fs = [parts[i][k] for i, k in enumerate(w_union.index[j])]
            if bad[entry]:
                weight = outer_rows([f[2] if members[i] else f[0] for i, f in enumerate(fs)], np.multiply)
                leak = outer_rows([(f[3] > 0) if members[i] else np.zeros(f[0].size, dtype=bool)
                               for i, f in enumerate(fs)], np.logical_or)
                unsupported |= (weight > 0) & (leak | (kappa[entry] <= 0))
                if kappa[entry] <= 0:
                    continue
            weight = outer_rows([f[1] if members[i] else f[0] for i, f in enumerate(fs)], np.multiply)
            variance += c2 / kappa[entry] * weight
        out.append(np.where(unsupported, np.inf, variance))
    return np.concatenate(out) if out else np.zeros(0)


def apply_residual_pinv(v: np.ndarray, sizes: tuple[int, ...], form: ResidualForm) -> np.ndarray:
    r""":math:`\sum_T \kappa_T^{-1} K_T^+ v` with :math:`K_T^+ = \bigotimes_{i \in T} X_i^+ \bigotimes_{i \notin T} P_i`.

    Attribute by attribute, ``v`` splits into its mean part (the axis collapsed to length 1) and
    :math:`X_i^+` applied along the axis; only prefixes of the form's subsets are followed.
    """
    d = len(sizes)
    members, kappa = form.subsets.members, form.kappa
    inverse = {tuple(bool(b) for b in row): 1.0 / k for row, k in zip(members, kappa) if k > 0}
    prefixes = [{T[:i] for T in inverse} for i in range(d + 1)]

    def visit(a: np.ndarray, i: int, prefix: tuple) -> np.ndarray | None:
        if i == d:
            return a * inverse[prefix]
        out = None
        if prefix + (False,) in prefixes[i + 1]:
            out = visit(a.mean(axis=i, keepdims=True), i + 1, prefix + (False,))
        if prefix + (True,) in prefixes[i + 1] and form.pinvs[i] is not None:
            moved = np.moveaxis(np.tensordot(form.pinvs[i], a, axes=([1], [i])), 0, i)
            residual = visit(moved, i + 1, prefix + (True,))
            out = residual if out is None else residual + out
        return out

    out = visit(np.asarray(v, dtype=float).reshape(sizes), 0, ())
    if out is None:
        return np.zeros(int(np.prod(sizes)))
    return np.broadcast_to(out, sizes).reshape(-1).copy()
