r"""Strategies over a geography: each level's unit totals, measured with one weight per level.

:class:`TreeStrategy` measures, for every level ``l`` with weight :math:`w_l > 0`, the totals of
the level's units scaled by :math:`w_l`: :math:`A = \mathrm{VStack}_l\, w_l S_l`. Every leaf is in
exactly one unit per level, so every column of ``A`` holds :math:`w_l` once per measured level:

.. math:: \Delta_1(A) = \sum_l w_l, \qquad \Delta_2(A) = \Big(\sum_l w_l^2\Big)^{1/2},

and :math:`A^TA = \sum_l w_l^2 S_l^TS_l` (a :class:`~hdmm.geography.blocks.TreeGram`). Its
pseudo-inverse, the estimates :math:`A^+y = (A^TA)^+A^Ty` and the variance of every unit's
estimated total come from the two tree passes of :mod:`hdmm.geography.solver` (docs/math.md,
section 8), linear in the number of units. The error functions of :mod:`hdmm.traces` are
registered here for ``TreeStrategy``, so ``hdmm.expected_error``, ``hdmm.error.per_query_variance``
and ``hdmm.run`` are exact and fast for ``Kronecker([TreeStrategy(...), A_person])``.

>>> from hdmm.geography import GeographyTree, LevelTotals
>>> tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
...                                   ["nation", "state", "county"])
>>> A = TreeStrategy(tree, {"nation": 1.0, "state": 1.0, "county": 2.0})
>>> A.shape, A.sensitivity(1), round(A.sensitivity(2), 4)
((6, 3), 4.0, 2.4495)
>>> from hdmm.traces import factor_trace
>>> round(factor_trace(A, LevelTotals(tree, ["nation"]))[0], 6)
0.347826
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..matrix import Identity, KronVector, Matrix, Ones, VStack, Weighted, norm_powers
from ..spectral import blocks, unit_columns
from ..traces import SUPPORT_TOL, factor_rows, factor_trace
from ..validation import check_norm, check_width
from .blocks import LevelTotals, TreeGram
from .solver import TreeSolver
from .tree import GeographyError, GeographyTree

__all__ = ["TreeStrategy", "TreePinv", "level_parts"]


class TreeStrategy(Matrix):
    """Every measured level's unit totals, scaled by the level's weight (module docstring).

    Parameters
    ----------
    tree
        The geography.
    level_weights
        ``{level: weight}`` (levels left out get 0) or one weight per level, root first:
        finite, >= 0, at least one positive. Rows of levels with weight 0 are left out.
    """

    fast_pinv = True

    def __init__(self, tree: GeographyTree, level_weights: Mapping[str | int, float] | Sequence[float]):
        if not isinstance(tree, GeographyTree):
            raise TypeError(f"tree must be a GeographyTree, got {type(tree).__name__}")
        w = np.zeros(len(tree.levels))
        if isinstance(level_weights, Mapping):
            for level, value in level_weights.items():
                w[tree.level_index(level)] = float(value)
        else:
            w = np.asarray(level_weights, dtype=float).reshape(-1)
            if w.size != len(tree.levels):
                raise GeographyError(
                    f"give one weight per level {list(tree.levels)} ({len(tree.levels)}), got {w.size}"
                )
        if not np.all(np.isfinite(w)) or np.any(w < 0) or not np.any(w > 0):
            raise GeographyError(
                f"level weights must be finite and >= 0 with at least one positive (the budget share of each "
                f"level), got {dict(zip(tree.levels, w.tolist()))}"
            )
        self.tree, self.weights = tree, w
        measured = np.flatnonzero(w > 0)
        self.rows = LevelTotals(tree, measured.tolist(), w[measured])
        self.shape = self.rows.shape
        self.solver = TreeSolver(tree, w**2)

    def _matmat(self, X):
        return self.rows._matmat(X)

    def _rmatmat(self, Y):
        return self.rows._rmatmat(Y)

    def gram(self):
        return TreeGram(self.tree, self.weights**2)

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(np.full(self.shape[1], float(np.sum(norm_powers(self.weights, p)))))

    def sensitivity(self, p: int = 1) -> float:
        """``sum_l w_l`` (``p = 1``) or ``sqrt(sum_l w_l^2)`` (``p = 2``): each leaf is in one unit per level."""
        check_norm(p)
        return float(np.sum(norm_powers(self.weights, p)) ** (1.0 / p))

    def pinv(self):
        return TreePinv(self)

    def describe(self, row, name=None, values=None):
        return self.rows.describe(row, name, values)

    @property
    def finest(self) -> str:
        """The finest measured level: totals of it and coarser levels are supported, finer ones are not."""
        return self.tree.levels[self.solver.finest]

    def __repr__(self):
        weights = ", ".join(f"{name}: {w:g}" for name, w in zip(self.tree.levels, self.weights))
        return f"TreeStrategy({{{weights}}}, {self.shape[0]:,} x {self.shape[1]:,})"

    def _key(self):
        return ("TreeStrategy", id(self.tree), tuple(self.weights.tolist()))


class TreePinv(Matrix):
    r""":math:`A^+ = (A^TA)^+A^T` of a :class:`TreeStrategy` (``leaves x rows``), applied by the recursion."""

    fast_pinv = True

    def __init__(self, strategy: TreeStrategy):
        self.strategy = strategy
        self.shape = (strategy.shape[1], strategy.shape[0])

    def _matmat(self, Y):
        return self.strategy.solver.apply(self.strategy._rmatmat(Y))

    def _rmatmat(self, X):
        return self.strategy._matmat(self.strategy.solver.apply(X))

    def pinv(self):
        return self.strategy

    def __repr__(self):
        return f"TreePinv({self.strategy!r})"


# ====================================================================== error of a workload factor
def level_parts(f: Matrix, tree: GeographyTree) -> list[tuple[int, float]] | None:
    """``f``'s rows as ``(level, coefficient)`` blocks of unit totals in row order, or ``None``.

    Recognises :class:`LevelTotals` over ``tree``, the identity (the finest level), the total
    (the root), and weighted or stacked combinations of them.
    """
    if isinstance(f, LevelTotals):
        return list(zip(f.level_ids, f.weights.tolist())) if f.tree is tree else None
    if isinstance(f, Identity):
        return [(tree.depth, 1.0)]
    if isinstance(f, Ones) and f.shape[0] == 1:
        return [(0, 1.0)]
    if isinstance(f, Weighted):
        inner = level_parts(f.base, tree)
        return None if inner is None else [(d, c * f.weight) for d, c in inner]
    if isinstance(f, VStack):
        parts = [level_parts(b, tree) for b in f.blocks]
        return None if any(p is None for p in parts) else [x for p in parts for x in p]
    return None


def _rows(A: TreeStrategy, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    parts = level_parts(f, A.tree)
    if parts is not None:
        variances, bad, nonzero = [], [], []
        for level, c in parts:
            size = A.tree.sizes[level]
            variances.append(c**2 * A.solver.unit_variances(level))
            bad.append(~A.solver.supported(level) & (c != 0))
            nonzero.append(np.full(size, c != 0))
        return np.concatenate(variances), np.concatenate(bad), np.concatenate(nonzero)
    m, n = f.shape
    variances, residual, norms = np.empty(m), np.empty(m), np.empty(m)
    for block in blocks(m, n):
        V = f.T @ unit_columns(m, block)
        R = A.solver.residual(V)
        variances[block] = np.einsum("ij,ij->j", V, A.solver.apply(V))
        residual[block], norms[block] = np.einsum("ij,ij->j", R, R), np.einsum("ij,ij->j", V, V)
    return variances, residual > SUPPORT_TOL * norms, norms > 0


@factor_rows.register
def _(A: TreeStrategy, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Per row of ``f``: :math:`w^T(A^TA)^+w` by the tree recursion, unsupported, non-zero.

    Level totals (and identities, totals and their weighted unions) take one ``Q`` pass per
    level (:meth:`TreeSolver.unit_variances`); a unit finer than the strategy's finest measured
    level is unsupported unless it is its ancestor's only descendant there. Other factors apply :math:`(A^TA)^+` to their rows in blocks,
    :math:`O(\text{leaves})` per row.
    """
    check_width(f, A)
    return _rows(A, f)


@factor_trace.register
def _(A: TreeStrategy, f: Matrix) -> tuple[float, bool]:
    r""":math:`\mathrm{tr}((A^TA)^+f^Tf)`, the sum of the rows' variances, and whether every row is supported."""
    check_width(f, A)
    variances, bad, nonzero = _rows(A, f)
    return float(np.sum(variances[nonzero])), not bool(np.any(bad & nonzero))
