r"""Workload blocks over a geography: the totals of the units of chosen levels.

:class:`LevelTotals` is a one-attribute matrix over the leaves of a :class:`GeographyTree`:
one row per unit of each chosen level (levels in the order given, units in tree order), the
row of unit ``u`` at level ``l`` being :math:`\omega_l \mathbf 1_u^T` (:math:`\omega_l` the level's
weight, 1 by default). Products are ``np.add.reduceat`` / ``np.repeat`` over the leaf order,
:math:`O(\text{leaves})` per level and vector; its Gram :math:`\sum_l \omega_l^2 S_l^TS_l` is a
:class:`TreeGram`, implicit, with the pseudo-inverse of :mod:`hdmm.geography.solver`.

The level weights are coefficients of the matrix (a weight-2 row counts twice the people):
inside a Kronecker factor they say how much each level's error counts. To release plain totals
and let the weights steer only the optimizer, put one level per part of a union:
:func:`geography_workload`.

>>> import pandas as pd
>>> from hdmm.geography import GeographyTree
>>> tree = GeographyTree.from_table(pd.DataFrame({"state": ["1", "1", "2"], "county": ["1", "2", "1"]}),
...                                 ["state", "county"])
>>> W = LevelTotals(tree, ["nation", "state"])
>>> W @ np.array([1.0, 2.0, 3.0])
array([6., 3., 3.])
>>> list(W.labels)
['nation', 'state=1', 'state=2']
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..matrix import Kronecker, KronVector, Matrix, VStack, norm_powers
from ..validation import check_dense_size, check_norm
from .solver import TreeSolver
from .tree import GeographyError, GeographyTree

__all__ = ["LevelTotals", "TreeGram", "geography_workload"]


def _level_weights(tree: GeographyTree, levels, weights) -> tuple[tuple[int, ...], np.ndarray]:
    if isinstance(levels, (str, int)):
        levels = [levels]
    ids = tuple(tree.level_index(level) for level in (tree.levels if levels is None else levels))
    if not ids:
        raise GeographyError("choose at least one level")
    if len(set(ids)) != len(ids):
        twice = next(tree.levels[i] for i in ids if ids.count(i) > 1)
        raise GeographyError(f"level {twice!r} is named twice; list each level once")
    w = np.ones(len(ids)) if weights is None else np.asarray(weights, dtype=float).reshape(-1)
    if w.size != len(ids) or not np.all(np.isfinite(w)):
        raise GeographyError(f"give one finite weight per level ({len(ids)}), got {weights!r}")
    return ids, w


class LevelTotals(Matrix):
    """The totals of every unit at the chosen levels (module docstring).

    Parameters
    ----------
    tree
        The geography; the matrix has one column per leaf, in tree order.
    levels
        Level names or positions (default: every level), each once; rows follow this order.
    weights
        One coefficient per level (default 1): the rows of level ``l`` are scaled by it.
    """

    def __init__(self, tree: GeographyTree, levels: Sequence[str | int] | str | None = None,
                 weights: Sequence[float] | None = None):
        if not isinstance(tree, GeographyTree):
            raise TypeError(f"tree must be a GeographyTree, got {type(tree).__name__}")
        self.tree = tree
        self.level_ids, self.weights = _level_weights(tree, levels, weights)
        self.offsets = np.cumsum([0] + [tree.sizes[d] for d in self.level_ids])
        self.shape = (int(self.offsets[-1]), tree.leaves)

    def _matmat(self, X):
        return np.vstack([w * self.tree.aggregate(d, X) for d, w in zip(self.level_ids, self.weights)])

    def _rmatmat(self, Y):
        out = np.zeros((self.shape[1], Y.shape[1]))
        for d, w, lo, hi in zip(self.level_ids, self.weights, self.offsets[:-1], self.offsets[1:]):
            out += w * self.tree.spread(d, Y[lo:hi])
        return out

    def gram(self):
        a = np.zeros(len(self.tree.levels))
        np.add.at(a, list(self.level_ids), self.weights**2)
        return TreeGram(self.tree, a)

    def column_norm_powers(self, p):
        check_norm(p)
        return KronVector.from_array(np.full(self.shape[1], float(np.sum(norm_powers(self.weights, p)))))

    def quadratic_diag(self, X):
        n = self.shape[1]
        C = np.zeros((n + 1, n + 1))
        C[1:, 1:] = np.cumsum(np.cumsum(X, axis=0), axis=1)
        out = []
        for d, w in zip(self.level_ids, self.weights):
            b = self.tree.leaf_bounds(d)
            lo, hi = b[:-1], b[1:]
            out.append(w**2 * (C[hi, hi] - C[lo, hi] - C[hi, lo] + C[lo, lo]))
        return np.concatenate(out)

    def locate(self, row: int) -> tuple[int, int]:
        """``(level position, unit)`` of query ``row``."""
        k = int(np.searchsorted(self.offsets, row, side="right")) - 1
        return self.level_ids[k], row - int(self.offsets[k])

    def describe(self, row, name=None, values=None):
        return self.tree.label(*self.locate(row))

    def __repr__(self):
        levels = ", ".join(self.tree.levels[d] for d in self.level_ids)
        return f"LevelTotals([{levels}], {self.shape[0]:,} units over {self.shape[1]:,} leaves)"

    def _key(self):
        return ("LevelTotals", id(self.tree), self.level_ids, tuple(self.weights.tolist()))


class TreeGram(Matrix):
    r""":math:`\sum_l a_l S_l^TS_l` over the leaves of a tree (``leaves x leaves``), kept implicit.

    Products cost :math:`O(\text{leaves})` per level and vector; :meth:`pinv` is the two-pass
    recursion of :class:`~hdmm.geography.solver.TreeSolver`.
    """

    def __init__(self, tree: GeographyTree, coefficients: Sequence[float]):
        self.tree = tree
        self.a = np.asarray(coefficients, dtype=float)
        if self.a.shape != (len(tree.levels),):
            raise ValueError(f"give one coefficient per level ({len(tree.levels)}), got shape {self.a.shape}")
        self.shape = (tree.leaves, tree.leaves)

    def _matmat(self, X):
        out = np.zeros((self.shape[0], X.shape[1]))
        for d in np.flatnonzero(self.a):
            out += self.a[d] * self.tree.spread(d, self.tree.aggregate(d, X))
        return out

    _rmatmat = _matmat

    @property
    def T(self):
        return self

    def diag(self):
        return np.full(self.shape[0], float(self.a.sum()))

    def trace(self):
        return float(self.a.sum()) * self.shape[0]

    def pinv(self):
        if not np.any(self.a > 0):
            return TreeGram(self.tree, np.zeros_like(self.a))
        return TreeGramPinv(TreeSolver(self.tree, self.a))

    def dense(self, max_entries=None):
        check_dense_size(*self.shape, "dense() of a TreeGram", max_entries)
        return self._matmat(np.eye(self.shape[0]))

    def __repr__(self):
        return f"TreeGram({self.tree!r}, coefficients={self.a.tolist()})"

    def _key(self):
        return ("TreeGram", id(self.tree), tuple(self.a.tolist()))


class TreeGramPinv(Matrix):
    """The pseudo-inverse of a :class:`TreeGram`, applied by the tree recursion (symmetric)."""

    fast_pinv = True

    def __init__(self, solver: TreeSolver):
        self.solver = solver
        self.shape = (solver.tree.leaves, solver.tree.leaves)

    def _matmat(self, X):
        return self.solver.apply(X)

    _rmatmat = _matmat

    @property
    def T(self):
        return self

    def pinv(self):
        return TreeGram(self.solver.tree, self.solver.a)

    def __repr__(self):
        return f"TreeGramPinv({self.solver.tree!r})"


def geography_workload(tree: GeographyTree, levels: Sequence[str | int], person: Matrix | None = None,
                       weights: Sequence[float] | None = None) -> Matrix:
    """The totals at each level (times ``person`` queries), one union part per level.

    ``weights`` (one per level) are :func:`hdmm.union` weights: they steer the optimizer and the
    error, and a release answers the plain totals.

    >>> import pandas as pd
    >>> tree = GeographyTree.from_parents({"a": "US", "b": "US"}, ["nation", "state"])
    >>> geography_workload(tree, ["nation", "state"], weights=[1.0, 2.0]).shape
    (3, 2)
    """
    ids, _ = _level_weights(tree, levels, weights)
    parts = [LevelTotals(tree, [d]) for d in ids]
    if person is not None:
        parts = [Kronecker([p, person]) for p in parts]
    return VStack(parts, weights=weights)
