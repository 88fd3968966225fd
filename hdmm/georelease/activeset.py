r"""A family's non-negative projection solved exactly: proximal point steps, each by a primal-dual active set.

The children :math:`v_1..v_k` of a unit, on the cells :math:`S` where their parent is non-zero, solve

.. math:: \min_V f(V) = \sum_i w_i\big(\tfrac12 v_i^TGv_i - b_i^Tv_i\big)
          \quad\text{s.t.}\quad V \ge 0,\;\; \textstyle\sum_i v_i = p,

with :math:`G = G_{SS}` the strategy's Gram on those cells, :math:`b_i = G_{S\cdot}\hat x_i` from the
least-squares cells and :math:`p > 0` the parent's cells (:class:`hdmm.georelease.nonneg.TopDown`).
Accelerated projected gradient needs thousands of steps here: :math:`G` is singular (a strategy
measures only what the workload needs, e.g. 259 directions of PL94's 2,016 cells) and ill-conditioned
on the rest. This module solves it exactly instead, for families of at most :data:`MAX_CELLS` cells
whose children's free entries fit :data:`MAX_ENTRIES`.

**Proximal point.** :math:`f` is not strictly convex, so each outer step solves the strictly convex
:math:`f(V) + \tfrac\varepsilon2\|V - C\|_F^2` with the centre :math:`C` the previous solution (first the
least-squares cells), :math:`\varepsilon = \text{EPSILON}\cdot\|G\|_2`. The steps converge to a
minimizer of :math:`f` (Rockafellar 1976); along an eigenvalue :math:`\lambda > 0` of the face in play
each step keeps a fraction :math:`\varepsilon/(\varepsilon + \lambda)` of the distance. It stops when
the Frank-Wolfe gap of :math:`f` itself, :math:`\langle\nabla f(V), V\rangle - \sum_j p_j\min_i
\partial_{ij}f(V)`, which bounds :math:`f(V) - f^*`, is at most the caller's ``bound`` (the same
certificate as :func:`hdmm.postprocess.metric_projection`'s).

**Primal-dual active set** (Hintermüller, Ito and Kunisch 2002: a semismooth Newton method on the
KKT conditions). With :math:`H_i = w_iG + \varepsilon I`, :math:`c_i = w_ib_i + \varepsilon C_i`, a
multiplier :math:`\alpha_j` per cell for the sums and :math:`\mu_{ij} \ge 0` for the bounds, the KKT
conditions are :math:`H_iv_i - c_i + \alpha = \mu_i`, :math:`\sum_i v_i = p`, :math:`v \ge 0`,
:math:`\mu \ge 0`, :math:`v_{ij}\mu_{ij} = 0`. Given the free entries :math:`F_i` of each child
(:math:`\mu = 0` there, :math:`v = 0` elsewhere), :math:`v_i = M_i(c_i - \alpha)` with
:math:`M_i = P_i(P_i^TH_iP_i)^{-1}P_i^T`, and the sums give one :math:`|S|\times|S|` system
:math:`(\sum_iM_i)\alpha = \sum_iM_ic_i - p`. Then an entry leaves :math:`F` where :math:`v < 0` and
joins it where :math:`\mu < 0`; when no entry is on the wrong side, :math:`V` is the subproblem's exact
solution. Exchanging all wrong entries at once can cycle, so, as in block principal pivoting (Júdice and
Pires 1994; Kim and Park 2011), a sweep that does not reduce their number uses up one of
``BACKUP_EXCHANGES``, after which only the last wrong entry is exchanged (Murty's finite rule) until
their number falls again.
Every cell keeps a free child (its children add up to :math:`p_j > 0`), so the system is regular.
Without a convergence guarantee for a general :math:`G`, a subproblem that has not settled after
``MAX_SWEEPS`` sweeps is tried again with a tenfold :math:`\varepsilon` (better conditioned), the later
steps keeping it; beyond ``MAX_EPSILON`` it returns ``None`` and the caller falls back to the gradient
method. Each child's system is solved on its own free cells only (the children's systems padded to the
largest and inverted in one batch), so the work follows the free entries, not :math:`|S|`.

>>> G = np.array([[2.0, 1.0], [1.0, 2.0]])
>>> B = np.array([[3.0, -1.0], [0.0, 2.0]])      # two children's G x_i on two cells
>>> V = family_projection(G, B, np.array([1.0, 1.0]), np.zeros((2, 2)), bound=1e-12)
>>> np.round(V, 6).tolist()
[[1.0, 0.0], [0.0, 1.0]]
"""

from __future__ import annotations

import numpy as np

from .simplex import simplex_projection

__all__ = ["family_projection", "family_gap", "root_projection", "gap_floor", "EPSILON", "MAX_ENTRIES", "MAX_CELLS", "MAX_SWEEPS", "MAX_STEPS",
           "BACKUP_EXCHANGES", "MAX_EPSILON"]

#: The proximal weight, relative to :math:`\|G\|_2`.
EPSILON = 1e-6
#: Largest ``children x free cells**2`` (the batch of inverses held at once: 2**26 doubles, 512 MiB); a family
#: whose free entries outgrow it goes back to the caller (``None``).
MAX_ENTRIES = 2**26
#: Most cells solved here (the cells' multipliers are one dense system of this size).
MAX_CELLS = 2048
#: The largest proximal weight tried, relative to :math:`\|G\|_2` (module docstring).
MAX_EPSILON = 1e-2
#: Active-set sweeps allowed per proximal step before its weight grows tenfold.
MAX_SWEEPS = 60
#: Sweeps that may exchange every wrong entry without reducing their number before only one is exchanged.
BACKUP_EXCHANGES = 3
#: Proximal steps allowed before giving up (``None``).
MAX_STEPS = 200


def family_gap(V: np.ndarray, grad: np.ndarray, p: np.ndarray) -> float:
    """The Frank-Wolfe gap at a feasible ``V`` (``k x s``) with gradient ``grad``: each cell's best vertex puts
    all of ``p_j`` in the child with the smallest partial derivative."""
    return float(np.sum(grad * V) - p @ grad.min(axis=0))


class _TooLarge(Exception):
    """The children's free entries outgrew ``MAX_ENTRIES``."""


def _exchange(wrong: np.ndarray, fewest: int, allowance: int) -> tuple[np.ndarray, int, int]:
    """The entries a sweep exchanges, and the updated ``fewest`` and ``allowance`` (module docstring): every wrong
    entry when their number fell (with a fresh allowance) or while the allowance lasts; else only the last one
    (Murty's finite rule)."""
    count = int(wrong.sum())
    if count < fewest:
        return wrong, count, BACKUP_EXCHANGES
    if allowance > 0:
        return wrong, fewest, allowance - 1
    only = np.zeros_like(wrong)
    only.ravel()[np.flatnonzero(wrong.ravel())[-1]] = True
    return only, fewest, allowance


def _free_solve(G: np.ndarray, w: np.ndarray, eps: float, c: np.ndarray, p: np.ndarray,
                free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``V`` and ``alpha`` for fixed free entries: each child's system on its own free cells only (padded to
    the largest count, so one batched inverse), the cells' multipliers from the summed inverses."""
    k, s = c.shape
    counts = free.sum(axis=1)
    width = max(int(counts.max()), 1)
    if k * width * width > MAX_ENTRIES:
        raise _TooLarge
    idx = np.argsort(~free, axis=1, kind="stable")[:, :width]  # each child's free cells first
    valid = np.arange(width)[None, :] < counts[:, None]
    idx = np.where(valid, idx, 0)
    pair = valid[:, :, None] & valid[:, None, :]
    eye = np.eye(width)
    H = w[:, None, None] * G[idx[:, :, None], idx[:, None, :]] + eps * eye[None]
    inv = np.linalg.inv(np.where(pair, H, eye[None]))
    inv *= pair
    flat = (idx[:, :, None] * s + idx[:, None, :]).ravel()
    total = np.bincount(flat, weights=inv.ravel(), minlength=s * s).reshape(s, s)
    cg = np.take_along_axis(c, idx, axis=1) * valid
    rhs = np.bincount(idx.ravel(), weights=np.einsum("kij,kj->ki", inv, cg).ravel(), minlength=s)
    alpha = np.linalg.solve(total, rhs - p)
    Vg = np.einsum("kij,kj->ki", inv, (cg - alpha[idx]) * valid)
    V = np.zeros((k, s))
    rows = np.broadcast_to(np.arange(k)[:, None], idx.shape)
    V[rows[valid], idx[valid]] = Vg[valid]
    return V, alpha


def _active_set(G: np.ndarray, w: np.ndarray, eps: float, c: np.ndarray, p: np.ndarray,
                free: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """The solution of the proximal subproblem (linear term ``c``) and its free entries, from ``free``."""
    tol = 1e-9 * max(1.0, float(p.max()))
    fewest, allowance = free.size + 1, BACKUP_EXCHANGES
    for _ in range(MAX_SWEEPS):
        try:
            V, alpha = _free_solve(G, w, eps, c, p, free)
        except np.linalg.LinAlgError:  # a cell without a free child: not settled
            return None
        mu = w[:, None] * (V @ G) + eps * V - c + alpha[None, :]
        if not (np.all(np.isfinite(V)) and np.all(np.isfinite(mu))):
            return None
        scale = tol * max(1.0, float(np.abs(mu).max()))
        wrong = (free & (V <= -tol)) | (~free & (mu < -scale))  # the entries on the wrong side
        if not wrong.any():
            return V, free
        wrong, fewest, allowance = _exchange(wrong, fewest, allowance)
        free = free ^ wrong
    return None


def family_projection(G: np.ndarray, B: np.ndarray, p: np.ndarray, X: np.ndarray, bound: float,
                      weights: np.ndarray | None = None, norm: float | None = None) -> np.ndarray | None:
    r"""The children's cells ``V`` (``k x s``, non-negative, columns adding up to ``p``) minimizing
    :math:`f` (module docstring) to within ``bound`` (its Frank-Wolfe gap), or ``None`` if the active
    set does not settle (the caller then uses the gradient method).

    ``G`` is the ``s x s`` Gram on the cells, ``B`` the children's linear terms (``k x s``), ``X`` the
    first proximal centre (the least-squares cells), ``weights`` the children's :math:`w_i` (default 1)
    and ``norm`` :math:`\|G\|_2` if known. The columns of the result add up to ``p`` to rounding.
    """
    k, s = B.shape
    w = np.ones(k) if weights is None else np.asarray(weights, dtype=float)
    p = np.asarray(p, dtype=float)
    if s > MAX_CELLS or s == 0 or np.any(p <= 0):
        return None
    scale = float(np.linalg.eigvalsh(G)[-1]) if norm is None else float(norm)
    if scale <= 0:
        return None
    eps = EPSILON * scale
    centre = np.asarray(X, dtype=float)
    free = simplex_projection(centre, p) > 0  # a sparse first guess: the Euclidean projection's support,
    free[np.argmax(centre, axis=0), np.arange(s)] = True  # with a free child in every cell
    for _ in range(MAX_STEPS):
        try:
            solved = _active_set(G, w, eps, w[:, None] * B + eps * centre, p, free)
            while solved is None and eps < MAX_EPSILON * scale:  # a stronger proximal term: better conditioned
                eps *= 10.0
                solved = _active_set(G, w, eps, w[:, None] * B + eps * centre, p, free)
        except _TooLarge:
            return None
        if solved is None:
            return None
        V, free = solved
        V = simplex_projection(V, p)  # a move of the order of rounding: exactly feasible
        grad = w[:, None] * (V @ G - B)
        if family_gap(V, grad, p) <= bound:
            return V
        centre = V
    return None


def _root_active_set(G: np.ndarray, eps: float, C: np.ndarray, r: np.ndarray, t: float, free: np.ndarray,
                     bound: float) -> tuple[np.ndarray, np.ndarray] | None:
    """One proximal step of :func:`root_projection`: :math:`\\min \\tfrac12(v - x)^TG(v - x) +
    \\tfrac\\varepsilon2\\|v - C\\|^2` over :math:`v \\ge 0`, :math:`\\mathbf 1^Tv = t`, by the primal-dual active
    set from ``free``, with one multiplier :math:`\\alpha` for the sum.

    It is solved for the move :math:`u = v - C` from the centre, with :math:`r = G(C - x)` the gradient
    there: small numbers near the optimum, where :math:`Gv - Gx` would be the difference of two large
    ones. On the free cells :math:`(G_{FF} + \\varepsilon I)u_F = -r_F - \\alpha\\mathbf 1 + G_{FN}C_N`
    (:math:`u_N = -C_N`), and :math:`\\alpha` makes the cells add up to ``t``. A fixed cell joins the
    free ones only if its multiplier is below ``-bound / (4t)``: moving all of ``t`` there would lower
    the objective by at most a quarter of ``bound``."""
    tol = 1e-12 * max(1.0, t)
    fewest, allowance = free.size + 1, BACKUP_EXCHANGES
    for _ in range(MAX_SWEEPS):
        F, N = np.flatnonzero(free), np.flatnonzero(~free)
        if F.size == 0:
            return None
        rhs = -r[F] + G[np.ix_(F, N)] @ C[N]
        try:
            solved = np.linalg.solve(G[np.ix_(F, F)] + eps * np.eye(F.size), np.column_stack([np.ones(F.size), rhs]))
        except np.linalg.LinAlgError:
            return None
        m1, mr = solved[:, 0], solved[:, 1]
        alpha = (mr.sum() - C[N].sum() + (C.sum() - t)) / m1.sum()  # 1'(C_F + u_F) = t
        u = -C.copy()
        u[F] = mr - alpha * m1
        v = np.zeros_like(C)
        v[F] = C[F] + u[F]
        mu = G @ u + eps * u + r + alpha
        if not (np.all(np.isfinite(v)) and np.all(np.isfinite(mu))):
            return None
        wrong = (free & (v <= -tol)) | (~free & (mu < -bound / (4.0 * t)))
        if not wrong.any():
            return v, free
        wrong, fewest, allowance = _exchange(wrong, fewest, allowance)
        free = free ^ wrong
    return None


def gap_floor(G: np.ndarray, x: np.ndarray, total: float) -> float:
    """What :func:`root_projection`'s Frank-Wolfe gap can resolve in double precision: the total times the largest
    row sum of :math:`|G|` times the spacing of doubles at the largest cell of ``x`` (the cells' scale)."""
    largest = float(np.abs(x).max(initial=0.0))
    return float(total) * float(np.abs(G).sum(axis=1).max(initial=0.0)) * float(np.spacing(largest))


def root_projection(G: np.ndarray, x: np.ndarray, total: float, bound: float,
                    norm: float | None = None) -> np.ndarray | None:
    r"""The root's cells :math:`v \ge 0` with :math:`\mathbf 1^Tv =` ``total`` minimizing
    :math:`f(v) = \tfrac12 (v - x)^TG(v - x)` to within ``bound`` (its Frank-Wolfe gap,
    :math:`\nabla f^Tv - t\min_j\partial_jf`), or ``None`` if the active set does not settle.

    The gap cannot be resolved below :func:`gap_floor` (cells of a country's size are stored to about
    1e-10 persons, and the gradient's rounding times the total is what the gap can see): a ``bound``
    below that is raised to it, for the stop and for the exchange rule alike, so that cells are not
    freed on rounding.

    The family's method (module docstring) for one unit whose cells add up to one number: proximal
    point steps, the first centred on the Euclidean projection of ``x`` (the least-squares cells), each
    solved by the primal-dual active set with a single multiplier for the sum, for the move from its
    centre (:func:`_root_active_set`). The gradient is always formed as :math:`G(v - x)`, not
    :math:`Gv - Gx`: at a country's total the difference of two large products would leave the gap at
    the rounding of :math:`Gx` times the total, above any useful ``bound``.

    >>> G = np.array([[2.0, 1.0], [1.0, 2.0]])
    >>> np.round(root_projection(G, np.array([3.0, -1.0]), 1.0, 1e-12), 6).tolist()
    [1.0, 0.0]
    """
    x = np.asarray(x, dtype=float)
    s = x.size
    if s > MAX_CELLS or s == 0 or total <= 0:
        return None
    scale = float(np.linalg.eigvalsh(G)[-1]) if norm is None else float(norm)
    if scale <= 0:
        return None
    eps = EPSILON * scale
    centre = simplex_projection(x[:, None], np.array([total]))[:, 0]  # feasible: the first centre
    bound = max(bound, gap_floor(G, x, total))
    free = centre > 0
    for _ in range(MAX_STEPS):
        r = G @ (centre - x)
        solved = _root_active_set(G, eps, centre, r, total, free, bound)
        while solved is None and eps < MAX_EPSILON * scale:
            eps *= 10.0
            solved = _root_active_set(G, eps, centre, r, total, free, bound)
        if solved is None:
            return None
        v, free = solved
        v = simplex_projection(v[:, None], np.array([total]))[:, 0]  # a move of the order of rounding: feasible
        grad = G @ (v - x)
        if float(grad @ v - total * grad.min()) <= bound:
            return v
        centre = v
    return None
