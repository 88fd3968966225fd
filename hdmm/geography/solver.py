r"""The pseudo-inverse of a tree Gram by two passes over the tree (docs/math.md, section 8).

For coefficients :math:`a_l \ge 0` per level, the Gram of a strategy measuring each level's
unit totals with weight :math:`w_l` (:math:`a_l = w_l^2`) is

.. math:: X = \sum_l a_l S_l^T S_l = \sum_{\text{units } u} a_{l(u)} \mathbf 1_u \mathbf 1_u^T ,

with :math:`\mathbf 1_u` the indicator of the leaves below ``u``. Let :math:`l^*` be the finest
level with :math:`a_l > 0` and :math:`B = S_{l^*}`, :math:`D = BB^T` (the diagonal of leaf
counts of the level-:math:`l^*` units). Every :math:`S_l` with :math:`l \le l^*` is
:math:`T_l B` (:math:`T_l` aggregates level :math:`l^*` into level :math:`l`), so
:math:`X = B^T M B` with :math:`M = \sum_{l \le l^*} a_l T_l^T T_l`, positive definite
(:math:`M \succeq a_{l^*} I`), and

.. math:: X^+ = B^T D^{-1} M^{-1} D^{-1} B

(check the four Penrose conditions with :math:`BB^T = D`). :math:`M` is the same kind of sum over
the tree cut at level :math:`l^*`, whose units are the leaves. On the subtree of unit ``u``,
:math:`M_u = \mathrm{diag}_c(M_c) + a_u \mathbf 1 \mathbf 1^T` (children ``c``), and
Sherman-Morrison gives, with :math:`\sigma_u = \sum_c s_c`, :math:`s_u = \mathbf 1^T M_u^{-1}
\mathbf 1`, :math:`\rho_u = 1/(1 + a_u \sigma_u)` and :math:`\beta_u = a_u \rho_u`:

.. math:: s_u = \sigma_u \rho_u, \qquad
          M_u^{-1}(b - t\mathbf 1) = \mathrm{diag}_c(M_c^{-1})\big(b - t'\mathbf 1\big), \quad
          t' = t + \beta_u(\gamma_u - t\,\sigma_u), \quad \gamma_u = \sum_c \mathbf 1^T M_c^{-1} b_c ,

and :math:`\mathbf 1^T M_u^{-1} b = \rho_u \gamma_u`; at a leaf :math:`M^{-1}(b - t) = (b - t)/a_{l^*}`.
So :math:`M^{-1}b` is one upward pass (the :math:`\gamma_u`) and one downward pass (the offsets
``t``), and the variance of unit ``v``'s estimated total,
:math:`\mathbf 1_v^T X^+ \mathbf 1_v = s_v - s_v^2 Q_v` with :math:`Q_{\mathrm{root}} = 0` and
:math:`Q_c = \beta_u + \rho_u^2 Q_u` for a child ``c`` of ``u``, is one more downward pass. All
of it is ``np.add.reduceat`` / ``np.repeat`` over the level arrays: linear in the number of
units (times the number of right-hand sides).
"""

from __future__ import annotations

import numpy as np

from .tree import GeographyTree

__all__ = ["TreeSolver"]


class TreeSolver:
    """:math:`X^+` for :math:`X = \\sum_l a_l S_l^T S_l` over a tree (module docstring).

    Parameters
    ----------
    tree
        The geography.
    coefficients
        :math:`a_l \\ge 0`, one per level (root first), at least one positive.
    """

    def __init__(self, tree: GeographyTree, coefficients: np.ndarray):
        a = np.asarray(coefficients, dtype=float)
        if a.shape != (len(tree.levels),) or not np.all(np.isfinite(a)) or np.any(a < 0) or not np.any(a > 0):
            raise ValueError(
                f"tree Gram coefficients must be {len(tree.levels)} finite numbers >= 0, at least one positive; got {a}"
            )
        self.tree, self.a = tree, a
        self.finest = int(np.flatnonzero(a > 0)[-1])
        f = self.finest
        self.counts = np.diff(tree.leaf_bounds(f)).astype(float)
        self.fanout = [np.diff(tree.child_bounds(level)) for level in range(f)]
        s = [np.empty(0)] * (f + 1)
        self.sigma, self.rho, self.beta = [np.empty(0)] * f, [np.empty(0)] * f, [np.empty(0)] * f
        s[f] = np.full(tree.sizes[f], 1.0 / a[f])
        for level in range(f - 1, -1, -1):
            sigma = np.add.reduceat(s[level + 1], tree.child_bounds(level)[:-1])
            rho = 1.0 / (1.0 + a[level] * sigma)
            self.sigma[level], self.rho[level], self.beta[level] = sigma, rho, a[level] * rho
            s[level] = sigma * rho
        self.s = s

    # ------------------------------------------------------------------ the reduced system M z = b
    def solve(self, b: np.ndarray) -> np.ndarray:
        """:math:`M^{-1} b` for ``b`` of shape ``(units of level l*, k)``."""
        f, a = self.finest, self.a
        gamma = [np.empty(0)] * f
        g = b / a[f]
        for level in range(f - 1, -1, -1):
            gamma[level] = np.add.reduceat(g, self.tree.child_bounds(level)[:-1], axis=0)
            g = gamma[level] * self.rho[level][:, None]
        t = np.zeros((1, b.shape[1]))
        for level in range(f):
            t = t + self.beta[level][:, None] * (gamma[level] - t * self.sigma[level][:, None])
            t = np.repeat(t, self.fanout[level], axis=0)
        return (b - t) / a[f]

    # ------------------------------------------------------------------ in leaf space
    def apply(self, V: np.ndarray) -> np.ndarray:
        """:math:`X^+ V` for ``V`` of shape ``(leaves, k)``."""
        c = self.counts[:, None]
        return self.tree.spread(self.finest, self.solve(self.tree.aggregate(self.finest, V) / c) / c)

    def residual(self, V: np.ndarray) -> np.ndarray:
        """:math:`(I - X^+X) V`: each column minus its means over the units of level :math:`l^*`."""
        c = self.counts[:, None]
        return V - self.tree.spread(self.finest, self.tree.aggregate(self.finest, V) / c)

    def _ancestors(self, level: int) -> tuple[np.ndarray, np.ndarray]:
        """Leaf counts of the units of ``level`` (finer than l*) and their ancestors' positions at level l*."""
        bounds = self.tree.leaf_bounds(level)
        return np.diff(bounds), np.searchsorted(self.tree.leaf_bounds(self.finest), bounds[:-1], side="right") - 1

    def supported(self, level: int) -> np.ndarray:
        """Whether each unit's indicator is in the row space: it is, unless it is finer than level l*
        and shares its level-l* ancestor's leaves with other units."""
        if level <= self.finest:
            return np.ones(self.tree.sizes[level], dtype=bool)
        counts, ancestor = self._ancestors(level)
        return counts == self.counts[ancestor]

    def unit_variances(self, level: int) -> np.ndarray:
        """:math:`\\mathbf 1_v^T X^+ \\mathbf 1_v` for every unit ``v`` of ``level`` (by the ``Q`` pass)."""
        f = self.finest
        stop = min(level, f)
        Q = np.zeros(1)
        for d in range(stop):
            Q = np.repeat(self.beta[d] + self.rho[d] ** 2 * Q, self.fanout[d])
        variances = self.s[stop] - self.s[stop] ** 2 * Q
        if level <= f:
            return variances
        # finer than l*: 1_v is n_v / n_anc of its ancestor's indicator, as far as X^+ can see
        counts, ancestor = self._ancestors(level)
        return (counts / self.counts[ancestor]) ** 2 * variances[ancestor]
