r"""The optimal residual strategy with a basis per attribute, under Gaussian noise (docs/math.md, section 4.9).

For a workload that is a union of Kronecker products whose factors on attribute ``i`` are one
query matrix :math:`W_i` (Gram :math:`G_i`) or totals, the residual family
:math:`\sqrt{\kappa_T}\bigotimes_{i \in T} B_i \bigotimes_{i \notin T} 1^T/\sqrt{n_i}`
(:mod:`hdmm.residual_bases`) has unit-noise error

.. math:: \Big(\sum_T \kappa_T s_T\Big)\sum_T \frac{c_T}{\kappa_T}, \qquad
          c_T = \prod_{i \in T} e_i\; t_T, \quad s_T = \prod_{i \in T} m_i \prod_{i \notin T} \frac1{n_i},

with :math:`e_i = \mathrm{tr}(X_i^+G_i)`, :math:`m_i = \max_j (X_i)_{jj}` and :math:`t_T` not
depending on the bases. The allocation :math:`\kappa_T \propto \sqrt{c_T/s_T}` gives
:math:`(\sum_T \sqrt{c_Ts_T})^2`, and every :math:`\sqrt{c_Ts_T}` is
:math:`\prod_{i \in T}\sqrt{e_im_i}` times a constant: each basis minimises :math:`e_im_i`
on its own. That is the Gaussian OPT_0 program on :math:`V_i = Q_iG_iQ_i` with zero-sum rows,
whose optimum is the unconstrained program's on :math:`V_i` (same Lagrange dual, and the
optimum has the range of :math:`V_i`). :func:`solve_convex` solves it (with a tiny
regularisation, since :math:`V_i` is singular); the solution projected by :math:`Q_i` is kept,
and its value is certified by the dual bound of :math:`V_i` itself (relative gaps below 1e-7 on
Prefix, AllRange and the benchmark attributes). When :math:`V_i` has rank below
:math:`n_i - 1` (a few ranges) the projected solution is further off; solves regularised inside
the zero-sum subspace (``LOW_RANK_EPS``) bring it to a few 1e-4 (two ranges on 20 values), and
the best candidate, Helmert's included, is kept with its gap. A Gram of the form
:math:`aI + bJ` needs no solve: the Helmert basis is optimal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kron_union import KronUnion, kron_union
from ..marginals import expand_subsets, factor_traces, helmert, workload_domain
from ..matrix import Matrix
from ..residual_bases import RESIDUAL_DENSE_MAX, ResidualBases, basis_from_gram
from ..structure import gram_is_aI_bJ
from ..validation import ZERO_RTOL
from .convex import solve_convex

__all__ = ["AttributeBasis", "residual_bases_applies", "residual_bases_solve_size", "attribute_basis",
           "residual_bases_strategy", "SOLVE_MAX_N"]

#: Regularisation of the singular ``Q G Q`` in the per-attribute solve, as a fraction of its mean
#: eigenvalue: small enough that the projected solution is within about 1e-7 of the dual bound.
THETA = 1e-12

#: Relative duality gap at which a per-attribute solve is accepted.
GAP_TOL = 1e-6

#: When ``Q G Q`` has rank below ``n - 1`` the projected solution can be a few percent off; further
#: solves regularise inside the zero-sum subspace by these fractions of the mean eigenvalue (the
#: best candidate is kept, Helmert's included, its gap reported).
LOW_RANK_EPS = (1e-8, 1e-10)

#: ``optimize`` skips ``residual_bases`` by default when an attribute needing a solve has more values
#: (one dense convex solve of order n^3 per Newton step: seconds at 256, a minute or more at 1024).
SOLVE_MAX_N = 512


@dataclass(frozen=True)
class AttributeBasis:
    """One attribute's optimal residual basis.

    Attributes
    ----------
    basis : ndarray
        ``B`` (rows summing to zero) with :math:`\\max_j (B^TB)_{jj} = 1`.
    error : float
        :math:`e\\,m = \\mathrm{tr}((B^TB)^+ G)` (``m = 1``).
    bound : float
        A certified lower bound on ``error`` over every zero-sum basis (the dual bound).
    """

    basis: np.ndarray
    error: float
    bound: float

    @property
    def relative_gap(self) -> float:
        return (self.error - self.bound) / self.error if self.error > 0 else 0.0


def _query_factors(union: KronUnion) -> list[int] | None:
    """Per attribute the index of a query factor (``-1``: totals only), or ``None`` when an attribute
    has non-total factors with different Grams (or one too large to solve densely). Factors
    with the same Gram are one query matrix (a union built term by term repeats equal factors)."""
    live = union.weights != 0
    out = []
    for i, fs in enumerate(union.factors):
        used = np.unique(union.index[live, i])
        queries = []
        for k in used:
            if factor_traces(fs[k])[1] > 0:  # a zero-sum part: a query factor, not a total
                queries.append(int(k))
        if queries and union.sizes[i] > RESIDUAL_DENSE_MAX:
            return None
        if len(queries) > 1:
            first = fs[queries[0]].gram().dense()
            scale = max(1.0, float(np.abs(first).max()))
            for k in queries[1:]:
                if not np.allclose(fs[k].gram().dense(), first, rtol=1e-12, atol=ZERO_RTOL * scale):
                    return None
        out.append(queries[0] if queries else -1)
    return out


def residual_bases_applies(union: KronUnion) -> bool:
    """Whether every attribute's factors are one query matrix or totals (module docstring)."""
    return union.num_terms > 0 and _query_factors(union) is not None


def residual_bases_solve_size(union: KronUnion) -> int:
    """The largest attribute whose query matrix needs a convex solve (0 when none does)."""
    queries = _query_factors(union)
    sizes = [union.sizes[i] for i, k in enumerate(queries or []) if k >= 0 and union.sizes[i] > 2
             and not gram_is_aI_bJ(union.factors[i][k].gram().dense())]
    return max(sizes, default=0)


def attribute_basis(G: np.ndarray, closed_form: bool = True) -> AttributeBasis:
    r"""The zero-sum basis minimising :math:`\mathrm{tr}(X^+G)\max_j X_{jj}` for query Gram ``G`` (``n x n``).

    A Gram :math:`aI + bJ` takes the Helmert basis without a solve (``closed_form=False``
    solves it anyway, a check of the solver)."""
    G = np.asarray(G, dtype=float)
    n = G.shape[0]
    H = helmert(n)
    M = H @ G @ H.T  # the residual workload in Helmert coordinates
    if n <= 2 or (closed_form and gram_is_aI_bJ(G)):
        value = float(np.trace(M)) * (1.0 - 1.0 / n)
        return AttributeBasis(H * np.sqrt(n / (n - 1.0)) if n > 1 else H, value, value)
    Q = np.eye(n) - 1.0 / n
    V = Q @ G @ Q
    mean = float(np.trace(V)) / n
    helmert_error = float(np.trace(M)) * (1.0 - 1.0 / n)
    best = (helmert_error, Q * (n / (n - 1.0)))  # Helmert's Gram, unit diagonal
    bound = 0.0
    for eps in (0.0, *LOW_RANK_EPS):
        # eps > 0 (a V of rank below n - 1): regularise inside the zero-sum subspace only
        result = solve_convex(V + eps * mean * Q, theta=THETA * mean)
        if eps == 0.0:
            bound = float(result.original_dual_bound)  # the bound for V itself
        X = Q @ result.X @ Q
        X /= float(np.max(np.diag(X)))
        error = float(np.trace(np.linalg.solve(H @ X @ H.T, M)))
        if error < best[0]:
            best = (error, X)
        if best[0] - bound <= GAP_TOL * best[0]:
            break
    error, X = best
    return AttributeBasis(basis_from_gram(X), error, min(bound, error))


def residual_bases_strategy(W: Matrix, union: KronUnion | None = None
                            ) -> tuple[ResidualBases, float, list[AttributeBasis | None]]:
    r"""The optimal residual strategy with per-attribute bases, its unit-noise error and the bases.

    The strategy has L2 sensitivity 1; the error is :math:`(\sum_T \sqrt{c_Ts_T})^2`. Raises
    ``ValueError`` when an attribute has more than one query matrix (then the family's optimum
    is not separable: use the Helmert residual strategy).
    """
    union = kron_union(W) if union is None else union
    queries = _query_factors(union)
    if queries is None:
        raise ValueError("the residual-bases optimizer needs one query matrix (or totals) per attribute; "
                         "this workload has several on some attribute: use the 'residual' optimizer")
    sizes = union.sizes
    solved: list[AttributeBasis | None] = []
    bases, pinvs = [], []
    for i, k in enumerate(queries):
        n = sizes[i]
        if k < 0 or n < 2:
            solved.append(None)
            bases.append(None)
            pinvs.append(None)
            continue
        solution = attribute_basis(union.factors[i][k].gram().dense())
        solved.append(solution)
        bases.append(solution.basis)
        Bp = np.linalg.pinv(solution.basis)
        pinvs.append(Bp @ Bp.T)  # (B^TB)^+
    # c_T: the workload's subset sums with tr(X_i^+ G) inside T and tr(P_i G) outside
    traces = []
    for i, fs in enumerate(union.factors):
        rows = []
        for f in fs:
            n = f.shape[1]
            image = f @ np.ones(n)
            p = float(image @ image) / n
            e = float(np.sum(f.quadratic_diag(pinvs[i]))) if pinvs[i] is not None else 0.0
            rows.append((p, e if e > ZERO_RTOL * p else 0.0))
        traces.append(np.array(rows).reshape(-1, 2))
    spectrum, _ = expand_subsets(union, traces)
    c = spectrum.tau
    live = c > 0
    members, c = spectrum.members[live], c[live]
    s = np.prod(np.where(members, 1.0, 1.0 / np.array(sizes, dtype=float)), axis=1)
    kappa = np.sqrt(c / s)
    kappa /= float(kappa @ s)  # sum_T kappa_T s_T = 1: L2 sensitivity 1
    error = float(np.sum(np.sqrt(c * s))) ** 2
    domain = workload_domain(W, sizes)
    bases = [helmert(n) if B is None else B for B, n in zip(bases, sizes)]
    strategy = ResidualBases.from_members(domain, members, np.sqrt(kappa), bases)
    return strategy, error, solved
