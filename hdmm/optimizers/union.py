r"""OPT_+: a union of Kronecker strategies, one per group of workload terms (docs/math.md, section 4).

Each group ``g`` of the workload's Kronecker terms gets its own OPT_(x) strategy :math:`A_g`
(sensitivity 1, error :math:`e_g` on its group), and the strategies are stacked with weights
:math:`w_g`. Answering each group from its own measurements gives the upper bound
:math:`\sum_g e_g / w_g^2` on the error (least squares over the whole union can only do better).

* Laplace: the stack has L1 sensitivity :math:`\sum_g w_g = 1`; the bound is minimised by
  :math:`w_g \propto e_g^{1/3}`, giving :math:`(\sum_g e_g^{1/3})^3`.
* Gaussian: L2 sensitivity :math:`(\sum_g w_g^2)^{1/2} = 1`; minimised by
  :math:`w_g^2 \propto e_g^{1/2}`, giving :math:`(\sum_g e_g^{1/2})^2`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..kron_union import KronUnion, kron_union
from ..matrix import Matrix, VStack, Weighted
from ..privacy import Privacy
from .kron import opt_kron_union

__all__ = ["budget_split", "check_groups", "opt_union_groups", "default_groups", "GROUP_RESTARTS"]

#: p-Identity starts per attribute in each group's OPT_(x) by default: fewer than OPT_(x) alone
#: makes on small attributes (:func:`.pidentity.default_restarts`), as the groups multiply the
#: cost.
GROUP_RESTARTS = 3


def budget_split(errors: Sequence[float], norm: int) -> tuple[np.ndarray, float]:
    """Optimal group weights for the unit-noise group errors ``e_g``, and the resulting bound.

    ``norm`` is the sensitivity norm of the stack (``privacy.norm``): 1 (Laplace) or 2
    (Gaussian); see the module docstring.
    """
    e = np.asarray(errors, dtype=float)
    if norm == 1:
        w = np.cbrt(e)
        w /= w.sum()
    else:
        w = np.sqrt(np.sqrt(e))
        w /= np.sqrt(w @ w)
    return w, float(np.sum(e / w**2))


def default_groups(W: Matrix, union: KronUnion) -> list[np.ndarray]:
    """Term groups: one per top-level block of a union (e.g. one per Census table), else per term."""
    blocks = getattr(W, "blocks", None)
    if blocks is not None and len(blocks) > 1:
        sizes = [kron_union(b).num_terms for b in blocks]
        if sum(sizes) == union.num_terms:
            edges = np.cumsum([0] + sizes)
            return [np.arange(a, b) for a, b in zip(edges[:-1], edges[1:])]
    return [np.array([j]) for j in range(union.num_terms)]


def check_groups(groups: Sequence[Sequence[int]], num_terms: int) -> list[np.ndarray]:
    """Validate user groups: integer term indices in range, each term in exactly one group."""
    checked, seen = [], np.zeros(num_terms, dtype=int)
    for k, group in enumerate(groups):
        g = np.asarray(group)
        if g.ndim != 1 or g.size == 0 or not np.issubdtype(g.dtype, np.integer):
            raise ValueError(f"group {k} must be a nonempty list of integer term indices, got {group!r}")
        if np.unique(g).size != g.size:
            raise ValueError(f"group {k} lists a term more than once: {group!r}")
        if g.min() < 0 or g.max() >= num_terms:
            raise ValueError(f"group {k} names term {int(g.min() if g.min() < 0 else g.max())}; the workload's "
                             f"terms are 0 ... {num_terms - 1} (see hdmm.kron_union.kron_union(W))")
        np.add.at(seen, g, 1)
        checked.append(g.astype(np.intp))
    if np.any(seen > 1):
        raise ValueError(f"terms {np.flatnonzero(seen > 1).tolist()} are in more than one group; each term "
                         "belongs to exactly one")
    if np.any(seen == 0):
        raise ValueError(f"terms {np.flatnonzero(seen == 0).tolist()} are in no group: the strategy would not "
                         "support them; add them to a group")
    return checked


def opt_union_groups(
    union: KronUnion, groups: Sequence[np.ndarray], privacy: Privacy, p: int | None = None,
    restarts: int | None = None, rng: np.random.Generator | None = None,
    progress: Callable[[str], None] | None = None,
    check: Callable[[list[Matrix], list[float]], None] | None = None,
) -> tuple[Matrix, float]:
    """OPT_(x) per group, stacked with the optimal budget split; returns the strategy and the bound.

    The strategy has sensitivity 1 in the norm of ``privacy``; the bound is an upper bound on
    its error at unit noise variance (``privacy.unit_noise()``).

    Terms of weight zero need no measurement and are left out (a group of only such terms too).
    Each group's OPT_(x) makes ``restarts`` p-Identity starts per attribute, ``GROUP_RESTARTS``
    by default; groups share first-round one-attribute solutions for effective Grams equal up
    to scale (the same prefix attribute in many two-way products is optimized once).
    ``check(strategies, errors)``, when given, is called after each group with those found so
    far; it may raise to abandon the search.
    """
    restarts = GROUP_RESTARTS if restarts is None else restarts
    groups = [np.asarray(terms, dtype=np.intp) for terms in groups]
    groups = [terms[union.weights[terms] != 0] for terms in groups]
    groups = [terms for terms in groups if terms.size]
    if not groups:
        raise ValueError("every term of the workload has weight 0: there is nothing to measure")
    parts, errors, memo = [], [], {}
    for k, terms in enumerate(groups):
        sub = KronUnion(union.factors, union.index[terms], union.weights[terms])
        A, e = opt_kron_union(sub, privacy, p, restarts, rng, progress=progress, memo=memo)
        parts.append(A)
        errors.append(e)
        if progress is not None:
            progress(f"OPT_+ group {k + 1}/{len(groups)}: error {e:.6g}")
        if check is not None:
            check(parts, errors)
    weights, bound = budget_split(errors, privacy.norm)
    return VStack([Weighted(A, w) for A, w in zip(parts, weights)]), bound
