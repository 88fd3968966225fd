r"""Euclidean projection of each column of a table onto its scaled simplex, without sorting.

The children of a unit, cell by cell, must be non-negative and add up to their parent's cell
:math:`t_j`: column ``j`` of a ``children x cells`` table lies in :math:`\{v \ge 0, \sum_i v_i = t_j\}`.
Its Euclidean projection is :math:`\max(v - \theta_j, 0)` for the one threshold :math:`\theta_j` that
makes the column add up (:func:`thresholds`); the top-down projections of
:mod:`hdmm.georelease.nonneg` and :mod:`hdmm.georelease.activeset` call it.

>>> V = np.array([[3.0, -1.0], [1.0, 2.0]])      # two children, two cells
>>> simplex_projection(V, np.array([2.0, 1.0])).tolist()
[[2.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

__all__ = ["thresholds", "simplex_projection"]


def thresholds(V: np.ndarray, totals: np.ndarray) -> np.ndarray:
    r"""Per column ``j``: the :math:`\theta_j` with :math:`\sum_i \max(V_{ij} - \theta_j, 0) = t_j`.

    Michelot's algorithm on every column at once: :math:`\theta = (\sum_{i \in S} V_{ij} - t_j)/|S|`
    over the values :math:`S` still kept (all at first), then :math:`S \leftarrow \{i \in S: V_{ij}
    \ge \theta\}`, until no column's :math:`S` shrinks. :math:`\theta` only grows and :math:`S` only
    shrinks, so it ends after at most ``k`` passes (a handful in practice) and needs no sort. A total
    of 0 gives the column's largest value (everything to 0). Should rounding lift :math:`\theta`
    above the values kept (tied largest values), :math:`\theta` is their value less :math:`t_j/|S|`.
    """
    V = np.asarray(V, dtype=float)
    t = np.asarray(totals, dtype=float)
    if np.any(t < 0):
        raise ValueError("simplex totals must be >= 0")
    kept = np.ones(V.shape, dtype=bool)
    count = np.full(V.shape[1], float(V.shape[0]))
    theta = (V.sum(axis=0) - t) / count
    while True:
        still = kept & (V >= theta)
        remaining = still.sum(axis=0, dtype=float)
        empty = remaining == 0  # rounding put theta above tied largest values: they are the answer
        if empty.any():
            top = np.where(kept[:, empty], V[:, empty], -np.inf).max(axis=0)
            theta[empty] = top - t[empty] / count[empty]
            still[:, empty], remaining[empty] = kept[:, empty], count[empty]
        if np.array_equal(remaining, count):
            return theta
        kept, count = still, remaining
        theta = ((V * kept).sum(axis=0) - t) / count  # 5x faster than sum(where=) on SF1's families


def simplex_projection(V: np.ndarray, totals: np.ndarray) -> np.ndarray:
    r"""Each column of ``V`` projected onto :math:`\{v \ge 0, \sum_i v_i = t_j\}` (Euclidean):
    :math:`\max(v - \theta_j, 0)` (:func:`thresholds`)."""
    return np.maximum(np.asarray(V, dtype=float) - thresholds(V, totals), 0.0)
