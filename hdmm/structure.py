r"""The structure of a strategy, decided in one place.

Every exact computation hdmm makes about a strategy :math:`A` (its expected error, the
per-query variances, the reconstruction :math:`\hat x = A^+ y`, the SVD bound of a workload)
depends on which of four forms it has:

``"kronecker"``
    One weighted Kronecker product :math:`A = c \bigotimes_i A_i` (the identity included):
    Grams, pseudo-inverses and traces factor attribute by attribute.
``"marginals"``
    A union of Kronecker products whose every factor Gram has the form :math:`aI + bJ`
    (weighted marginals, residual measurements, unions of identities and totals): the Gram is
    diagonal in the subset basis :math:`E_T` of :mod:`hdmm.marginals`, so its pseudo-inverse
    is read off one eigenvalue per attribute subset.
``"residual"``
    A union of Kronecker products whose factors on each attribute are totals (rows proportional
    to :math:`1^T`) or zero-sum factors :math:`B_i` with one Gram (residual measurements with a basis per
    attribute, :mod:`hdmm.residual_bases`): the Gram is :math:`\sum_T \kappa_T \bigotimes_{i \in T}
    B_i^TB_i \bigotimes_{i \notin T} P_i`, whose terms are mutually orthogonal, so its
    pseudo-inverse is one small pseudo-inverse per attribute and one scalar per subset.
``"general"``
    Anything else (e.g. a union of Kronecker products from OPT_+, or a matrix whose factors do
    not line up with the domain): exact only through a dense pseudo-inverse on small domains,
    else reconstructed by LSMR.

:func:`classify` answers this once; the result travels with a release plan so that error,
variances and reconstruction never decide it again.

>>> import hdmm
>>> from hdmm.structure import classify
>>> classify(hdmm.Identity(8)).form
'kronecker'
>>> classify(hdmm.DimKMarginals(hdmm.Domain(["a", "b"], [2, 3]), 1)).form
'marginals'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kron_union import FactorMismatchError, KronUnion, aligned_pair, kron_union
from .marginals import Helmert
from .residual_bases import residual_form
from .matrix import Identity, Kronecker, Matrix, Ones, Weighted
from .validation import ZERO_RTOL  # the one zero tolerance, shared with the algebra below

__all__ = ["ZERO_RTOL", "FORMS", "Structure", "classify", "aligned_unions", "in_marginal_algebra", "gram_is_aI_bJ"]

#: The four forms, from the most to the least structured.
FORMS = ("kronecker", "marginals", "residual", "general")

#: Largest one-attribute Gram (in entries) checked densely for the form ``aI + bJ``.
_DENSE_CHECK_ENTRIES = 2**24


def _is_aI_bJ(f: Matrix) -> bool:
    """Whether the Gram ``f^T f`` of a one-attribute factor is ``aI + bJ``."""
    if isinstance(f, (Identity, Ones, Helmert)):
        return True
    if isinstance(f, Weighted):
        return _is_aI_bJ(f.base)
    n = f.shape[1]
    if n == 1:
        return True
    if n * n > _DENSE_CHECK_ENTRIES:
        return False
    return gram_is_aI_bJ(f.gram().dense())


def gram_is_aI_bJ(G: np.ndarray) -> bool:
    """Whether the dense one-attribute Gram ``G`` is ``aI + bJ`` (to round-off)."""
    a, b = G[0, 0] - G[0, 1], G[0, 1]
    return bool(np.allclose(G, a * np.eye(G.shape[0]) + b, rtol=1e-10, atol=ZERO_RTOL * max(1.0, abs(G).max())))


def in_marginal_algebra(union: KronUnion) -> bool:
    r"""Whether every factor Gram of a union of Kronecker products has the form :math:`aI + bJ`.

    Then the union's Gram :math:`\sum_j c_j^2 \bigotimes_i G_i^{(j)}` is diagonal in the
    subset basis :math:`E_T`.
    """
    return all(_is_aI_bJ(f) for fs in union.factors for f in fs)


@dataclass(frozen=True, eq=False)
class Structure:
    """The form of a matrix and its normal form as a union of Kronecker products.

    Attributes
    ----------
    form : str
        ``"kronecker"``, ``"marginals"``, ``"residual"`` or ``"general"`` (see the module docstring).
    union : KronUnion or None
        The matrix as a union of weighted Kronecker products, ``None`` when its factors do not
        line up into one (then the form is ``"general"``).
    """

    form: str
    union: KronUnion | None

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if self.form != "general" and self.union is None:
            raise ValueError(f"a {self.form!r} structure needs its Kronecker union")

    @property
    def kronecker(self) -> Weighted:
        r"""The matrix as :math:`c \bigotimes_i A_i` (nested products and weights flattened)."""
        if self.form != "kronecker":
            raise ValueError(f"a {self.form!r} strategy is not one Kronecker product")
        weight, factors = self.union.term(0)
        return Weighted(Kronecker(factors), weight)

    def __repr__(self) -> str:
        detail = "" if self.union is None else f", {self.union.num_terms} terms over sizes {self.union.sizes}"
        return f"Structure({self.form!r}{detail})"


def classify(A: Matrix) -> Structure:
    """The structure of ``A``: its form and its union of Kronecker products.

    Parameters
    ----------
    A
        Any hdmm matrix (a strategy or a workload).

    Returns
    -------
    Structure
    """
    if not isinstance(A, Matrix):
        raise TypeError(f"expected an hdmm matrix, got {type(A).__name__}")
    try:
        union = kron_union(A)
    except FactorMismatchError:
        return Structure("general", None)
    if union.num_terms == 1:
        return Structure("kronecker", union)
    if in_marginal_algebra(union):
        return Structure("marginals", union)
    if residual_form(union) is not None:
        return Structure("residual", union)
    return Structure("general", union)


def aligned_unions(W: Matrix, structure: Structure) -> tuple[str, KronUnion | None, KronUnion | None]:
    """The form under which workload ``W`` is answered exactly, with both unions lined up.

    Returns ``(form, w_union, a_union)``: the strategy's form, and ``W``'s union of Kronecker
    products and the strategy's on common attribute sizes. Lining up can merge the strategy's
    factors (when ``W`` does not split into the strategy's attributes), and a merged factor of
    a marginals strategy is no longer ``aI + bJ`` (nor one of a residual strategy a total or a
    zero-sum factor): the form is then ``"general"``, as it is
    when the two cannot be lined up at all (both unions ``None``).
    """
    pair = None if structure.union is None else aligned_pair(W, structure.union)
    if pair is None:
        return "general", None, None
    w_union, a_union = pair
    if a_union.sizes != structure.union.sizes:  # the strategy's factors were merged
        if structure.form == "marginals" and not in_marginal_algebra(a_union):
            return "general", None, None
        if structure.form == "residual" and residual_form(a_union) is None:
            return "general", None, None
    if structure.form == "general":
        return "general", None, None
    return structure.form, w_union, a_union
