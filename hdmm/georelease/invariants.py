r"""Invariants: unit totals declared public and held exactly (as the 2020 Census held state populations).

An invariant is a number the agency publishes *without* noise (e.g. each state's resident
population). It is not protected by differential privacy: the privacy guarantee of a release with
invariants covers everything else, given the invariants. Declare only totals that are public.

**Estimate.** The least-squares estimate :math:`\hat x` has covariance
:math:`\Sigma = \sigma^2 X^+ \otimes G_p^+` (the tree Gram's and the person strategy's
pseudo-inverses). The generalized least-squares estimate subject to :math:`C x = c`, with ``C``
the totals of the invariant units (:math:`C = S_C \otimes \mathbf 1^T`), is

.. math:: x^* = \hat x - \Sigma C^T (C \Sigma C^T)^{-1} (C\hat x - c)
              = \hat x - (X^+ S_C^T \delta) \otimes (G_p^+ \mathbf 1), \qquad
          K\delta = (C\hat x - c)/\gamma,

with :math:`K = S_C X^+ S_C^T` (one row per invariant unit) and :math:`\gamma = \mathbf 1^T G_p^+
\mathbf 1`. So every released answer moves by a per-unit scalar times a per-query constant:
query ``q`` of unit ``v`` by :math:`\lambda_v h_q` with :math:`\lambda = S_l X^+ S_C^T\delta` and
:math:`h = W_p G_p^+ \mathbf 1`. ``K`` is applied by the tree passes (:math:`O(\text{leaves})`) and
:math:`\delta` solved by conjugate gradients, so any number of invariant units is fine. The
estimates stay consistent (the correction is itself a tree estimate) and the invariant units'
totals equal the declared values up to floating-point rounding. The variances shrink by
:math:`\sigma^2 (S_l X^+ S_C^T K^{-1} S_C X^+ S_l^T)_{vv} h_q^2/\gamma`, computed exactly for up
to ``EXACT_VARIANCE_UNITS`` invariant units (else the variances without it are reported, an
upper bound).

>>> from hdmm.geography import GeographyTree
>>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
...                                   ["nation", "state", "county"])
>>> inv = Invariants.of(tree, {"state": {"a": 120, "b": 80}})
>>> inv.units, inv.values.tolist()
(2, [120.0, 80.0])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator, cg

from ..geography import GeographyError, GeographyTree
from ..geography.solver import TreeSolver

__all__ = ["Invariants", "EXACT_VARIANCE_UNITS"]

#: Up to this many invariant units, the variance reduction of every released answer is computed
#: exactly (a dense ``K``); above it the reported variances are the larger ones without invariants.
EXACT_VARIANCE_UNITS = 2000

#: Relative tolerance of the conjugate-gradient solve for the invariant multipliers.
CG_RTOL = 1e-13


@dataclass(frozen=True, eq=False)
class Invariants:
    """Public unit totals held exactly (module docstring): made with :meth:`of`.

    Attributes
    ----------
    levels, units_at, values : numpy.ndarray
        One entry per invariant unit: its level, its position in the level, its total.
    """

    levels: np.ndarray
    units_at: np.ndarray
    values: np.ndarray

    @property
    def units(self) -> int:
        """Number of invariant units."""
        return int(self.values.size)

    @classmethod
    def of(cls, tree: GeographyTree, totals: Mapping[str | int, Mapping[object, float]]) -> Invariants:
        """Check ``{level: {code: total}}`` against the tree and return the invariants.

        Raises
        ------
        GeographyError
            For an unknown level or code, a level named twice, a total that is not a whole
            finite count >= 0 (10.5 is no number of records), or totals that do not add up over the tree (a unit's declared total
            against the sum of its declared descendants when all of them at a level are declared).
        """
        if not isinstance(totals, Mapping) or not totals:
            raise GeographyError("invariants are {level: {code: total}}, e.g. {'state': {'06': 37253956}}")
        per_level: dict[int, dict[int, float]] = {}
        for level, table in totals.items():
            d = tree.level_index(level)
            if d in per_level:
                raise GeographyError(f"level {tree.levels[d]!r} is named twice in the invariants; list it once")
            items = table.items() if isinstance(table, Mapping) else getattr(table, "items", lambda: None)()
            if items is None:
                raise GeographyError(f"the invariants of level {tree.levels[d]!r} must map unit codes to totals")
            values: dict[int, float] = {}
            for code, value in items:
                unit = tree.index(d, code)
                try:
                    v = float(value)
                except (TypeError, ValueError):
                    raise GeographyError(f"invariant of {tree.label(d, unit)} is {value!r}, not a number") from None
                if not (np.isfinite(v) and v >= 0 and v == np.floor(v)):
                    raise GeographyError(f"invariant of {tree.label(d, unit)} is {v!r}: a total is a number of "
                                         "records, a whole finite count >= 0")
                values[unit] = v
            if not values:
                raise GeographyError(f"no invariants given for level {tree.levels[d]!r}")
            per_level[d] = values
        _check_additive(tree, per_level)
        levels, units, values = [], [], []
        for d in sorted(per_level):
            for unit in sorted(per_level[d]):
                levels.append(d)
                units.append(unit)
                values.append(per_level[d][unit])
        return cls(np.array(levels, dtype=np.intp), np.array(units, dtype=np.intp), np.array(values, dtype=float))

    def table(self, tree: GeographyTree) -> dict[str, dict[str, float]]:
        """``{level: {code: total}}``, as declared."""
        out: dict[str, dict[str, float]] = {}
        for d, u, v in zip(self.levels.tolist(), self.units_at.tolist(), self.values.tolist()):
            out.setdefault(tree.levels[d], {})[tree.codes(d)[u]] = v
        return out

    # ------------------------------------------------------------------ the correction
    def _spread(self, tree: GeographyTree, delta: np.ndarray) -> np.ndarray:
        """:math:`S_C^T \\delta` in leaf space."""
        out = np.zeros(tree.leaves)
        for d in np.unique(self.levels):
            mask = self.levels == d
            unit_values = np.zeros(tree.sizes[d])
            unit_values[self.units_at[mask]] = delta[mask]
            out += tree.spread(int(d), unit_values)
        return out

    def _gather(self, tree: GeographyTree, leaf_values: np.ndarray) -> np.ndarray:
        """:math:`S_C v` for a leaf-space ``v``."""
        out = np.empty(self.units)
        for d in np.unique(self.levels):
            mask = self.levels == d
            out[mask] = tree.aggregate(int(d), leaf_values)[self.units_at[mask]]
        return out

    def check_supported(self, tree: GeographyTree, solver: TreeSolver) -> None:
        """Refuse invariants at levels finer than the finest measured one (their totals are not estimated)."""
        too_fine = sorted({tree.levels[d] for d in self.levels.tolist() if d > solver.finest})
        if too_fine:
            raise GeographyError(
                f"invariants at level(s) {too_fine}, finer than the finest measured level "
                f"{tree.levels[solver.finest]!r}: measure those levels too (give them a level weight)"
            )

    def multipliers(self, tree: GeographyTree, solver: TreeSolver, estimated: np.ndarray, gamma: float
                    ) -> dict[int, np.ndarray]:
        """:math:`\\lambda` for every unit of levels ``0..l*`` (module docstring), from the estimated
        totals of the invariant units (same order as ``values``) and :math:`\\gamma = \\mathbf 1^TG_p^+\\mathbf 1`."""
        rhs = (np.asarray(estimated, dtype=float) - self.values) / gamma

        def K(v):
            return self._gather(tree, solver.apply(self._spread(tree, np.ravel(v))[:, None])[:, 0])

        if self.units <= EXACT_VARIANCE_UNITS:
            delta = np.linalg.lstsq(self.dense_k(tree, solver), rhs, rcond=None)[0]
        else:
            delta, info = cg(LinearOperator((self.units, self.units), matvec=K, dtype=float), rhs,
                             rtol=CG_RTOL, atol=0.0, maxiter=10 * self.units)
            if info != 0:
                raise ArithmeticError(f"the invariant solve did not converge (conjugate gradients, info {info})")
        leaf = solver.apply(self._spread(tree, delta)[:, None])[:, 0]
        return {d: tree.aggregate(d, leaf) for d in range(solver.finest + 1)}

    def dense_k(self, tree: GeographyTree, solver: TreeSolver) -> np.ndarray:
        """:math:`K = S_C X^+ S_C^T` as a dense ``units x units`` array."""
        return self._gather_columns(tree, solver.apply(self._spread_columns(tree)))

    def _spread_columns(self, tree: GeographyTree) -> np.ndarray:
        out = np.zeros((tree.leaves, self.units))
        for i, (d, u) in enumerate(zip(self.levels.tolist(), self.units_at.tolist())):
            lo, hi = tree.leaf_bounds(d)[u], tree.leaf_bounds(d)[u + 1]
            out[lo:hi, i] = 1.0
        return out

    def _gather_columns(self, tree: GeographyTree, V: np.ndarray) -> np.ndarray:
        out = np.empty((self.units, V.shape[1]))
        for d in np.unique(self.levels):
            mask = self.levels == d
            out[mask] = tree.aggregate(int(d), V)[self.units_at[mask]]
        return out

    def variance_reduction(self, tree: GeographyTree, solver: TreeSolver, level: int) -> np.ndarray | None:
        """:math:`(S_l X^+ S_C^T K^+ S_C X^+ S_l^T)_{vv}` per unit of ``level``, or ``None`` above
        ``EXACT_VARIANCE_UNITS`` invariant units."""
        if self.units > EXACT_VARIANCE_UNITS:
            return None
        B = solver.apply(self._spread_columns(tree))            # X^+ S_C^T, leaves x units
        K = self._gather_columns(tree, B)
        L = tree.aggregate(level, B)                              # S_l X^+ S_C^T
        return np.einsum("ij,ij->i", L @ np.linalg.pinv(K, hermitian=True), L)


def _check_additive(tree: GeographyTree, per_level: dict[int, dict[int, float]]) -> None:
    levels = sorted(per_level)
    for i, coarse in enumerate(levels):
        for fine in levels[i + 1:]:
            declared = np.zeros(tree.sizes[fine], dtype=bool)
            declared[list(per_level[fine])] = True
            values = np.zeros(tree.sizes[fine])
            values[list(per_level[fine])] = list(per_level[fine].values())
            bounds = _descendant_bounds(tree, coarse, fine)
            for unit, total in per_level[coarse].items():
                lo, hi = bounds[unit], bounds[unit + 1]
                if declared[lo:hi].all():
                    below = float(values[lo:hi].sum())
                    if abs(below - total) > 1e-9 * max(1.0, abs(total)):
                        raise GeographyError(
                            f"the invariants do not add up: {tree.label(coarse, unit)} is declared {total:g} but its "
                            f"units at level {tree.levels[fine]!r} are declared {below:g} in all; fix the totals"
                        )


def _descendant_bounds(tree: GeographyTree, coarse: int, fine: int) -> np.ndarray:
    bounds = np.arange(tree.sizes[coarse] + 1)
    for d in range(coarse, fine):
        bounds = tree.child_bounds(d)[bounds]
    return bounds
