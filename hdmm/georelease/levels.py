r"""The measurement budget of each geography level, optimized (the tree factor of OPT_(x)).

A geography release measures :math:`A = A_{\text{tree}}(w) \otimes A_p`: every unit of level
``l`` with weight :math:`w_l` times the person strategy :math:`A_p`. For a workload
:math:`\sum_l \omega_l\, S_l \otimes W_p` (the totals of the released levels, weights
:math:`\omega_l`, times the same person queries) both the error and the sensitivity factor:

.. math:: \text{error} = \nu\big(\Delta(w)\,\Delta(A_p)\big)\;
          \underbrace{\sum_l \omega_l^2\, \mathrm{tr}\big(S_l X(w)^+ S_l^T\big)}_{\text{tree}}\;
          \underbrace{\mathrm{tr}\big(W_p (A_p^TA_p)^+ W_p^T\big)}_{\text{person}},

with :math:`\nu(\Delta) \propto \Delta^2` the noise variance, :math:`\Delta(w) = \sum_l w_l`
(Laplace) or :math:`(\sum_l w_l^2)^{1/2}` (Gaussian), and :math:`X(w)` the tree Gram. OPT_(x)
optimizes one factor at a time with the others fixed; here the two factors do not interact, so
one pass is the joint optimum: the person factor by :func:`hdmm.optimize` on :math:`W_p`, and the
tree factor by minimizing :math:`\Delta(w)^2 \cdot \text{tree}(w)`, which is scale free in
:math:`w`. The tree term takes one :class:`~hdmm.geography.solver.TreeSolver` (``O(units)``) per
evaluation; :func:`optimize_level_weights` minimizes over :math:`\log w` by L-BFGS from several
starts (only levels no finer than the finest released one can help: a finer level's totals cost
the same budget and add no information about coarser totals that measuring them directly would
not give with less noise).

>>> from hdmm.geography import GeographyTree
>>> pairs = {f"s{i}": "US" for i in range(50)} | {f"s{i}c{j}": f"s{i}" for i in range(50) for j in range(60)}
>>> tree = GeographyTree.from_parents(pairs, ["nation", "state", "county"])
>>> w = optimize_level_weights(tree, {"nation": 1.0, "state": 1.0, "county": 1.0}, norm=1)
>>> [round(float(v), 3) for v in w / w.sum()]
[0.043, 0.163, 0.794]
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.optimize import minimize

from ..geography import GeographyError, GeographyTree
from ..geography.solver import TreeSolver

__all__ = ["tree_objective", "optimize_level_weights"]

#: Level weights below this fraction of the largest are dropped (the level is not measured).
DROP_BELOW = 1e-4


def _released(tree: GeographyTree, released: Mapping[str | int, float]) -> dict[int, float]:
    out: dict[int, float] = {}
    for level, omega in released.items():
        d = tree.level_index(level)
        if d in out:
            raise GeographyError(f"level {tree.levels[d]!r} is named twice; list each level once")
        omega = float(omega)
        if not (np.isfinite(omega) and omega >= 0):
            raise GeographyError(f"the weight of level {tree.levels[d]!r} must be finite and >= 0, got {omega}")
        out[d] = omega
    if not out:
        raise GeographyError("release at least one level")
    return out


def tree_objective(tree: GeographyTree, weights: np.ndarray, released: Mapping[str | int, float], norm: int) -> float:
    r""":math:`\Delta(w)^2 \sum_l \omega_l^2\, \mathrm{tr}(S_l X(w)^+ S_l^T)` (module docstring); ``inf`` when a
    released level is finer than the finest measured one."""
    w = np.asarray(weights, dtype=float)
    omega = _released(tree, released)
    solver = TreeSolver(tree, w**2)
    if max(omega) > solver.finest:
        return float("inf")
    trace = sum(o**2 * float(np.sum(solver.unit_variances(d))) for d, o in omega.items())
    delta2 = float(np.sum(w)) ** 2 if norm == 1 else float(np.sum(w**2))
    return delta2 * trace


def optimize_level_weights(tree: GeographyTree, released: Mapping[str | int, float], norm: int) -> np.ndarray:
    """The level weights (one per tree level, root first, summing to 1) minimizing :func:`tree_objective`.

    Parameters
    ----------
    tree
        The geography.
    released
        ``{level: weight}`` of the released levels (the weights steer the optimizer only).
    norm
        1 (Laplace noise) or 2 (Gaussian noise).
    """
    omega = _released(tree, released)
    finest = max(omega)
    free = np.arange(finest + 1)

    def weights_of(theta: np.ndarray) -> np.ndarray:
        w = np.zeros(len(tree.levels))
        w[free] = np.exp(theta - theta.max())
        return w

    def objective(theta: np.ndarray) -> float:
        return np.log(tree_objective(tree, weights_of(theta), omega, norm))

    starts = [np.zeros(free.size)]
    only_finest = np.full(free.size, -8.0)
    only_finest[-1] = 0.0
    starts.append(only_finest)
    for d in omega:
        emphasis = np.zeros(free.size)
        emphasis[d] = 2.0
        starts.append(emphasis)
    best_theta, best = None, np.inf
    for theta0 in starts:
        result = minimize(objective, theta0, method="L-BFGS-B", bounds=[(-20.0, 20.0)] * free.size,
                          options={"maxiter": 200})
        if result.fun < best:
            best_theta, best = result.x, float(result.fun)
    w = weights_of(best_theta)
    dropped = np.where(w < DROP_BELOW * w.max(), 0.0, w)
    if dropped[finest] > 0 and tree_objective(tree, dropped, omega, norm) <= tree_objective(tree, w, omega, norm):
        w = dropped
    return w / w.sum()
