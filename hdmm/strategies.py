r"""The classical baseline strategies: the competitors of HDMM in every benchmark.

Every function returns an :class:`~hdmm.matrix.Matrix` whose rows are the queries to measure
(docs/math.md, section 1: release :math:`y = Ax + z`, answer :math:`W A^+ y`). One-attribute trees
are sparse :class:`~hdmm.matrix.Explicit` matrices (about :math:`n \log n` non-zeros), the
data cube is a weighted :class:`~hdmm.marginals.Marginals` strategy and multi-attribute
baselines are Kronecker products, so nothing dense over a multi-attribute domain is formed.

==============================================  =================================================
:func:`identity`                                one query per cell (the "flat" baseline)
:func:`hierarchical`                            all nodes of a ``b``-ary tree of intervals (H2:
                                                Hay et al. 2010)
:func:`hb`                                      the tree with the branching of Qardaji, Yang &
                                                Li (2013)
:func:`wavelet`                                 the Haar wavelet (Privelet: Xiao, Wang & Gehrke
                                                2010)
:func:`greedy_h`                                a tree with workload-fitted node weights
                                                (GreedyH: Li, Hay, Miklau & Wang 2014)
:func:`quadtree`                                the 2-D hierarchical quadtree over a grid
:func:`datacube`                                cuboids chosen greedily (DataCube: Ding et al.
                                                2011)
:func:`kron`, :func:`kronecker_baseline`        Kronecker products of one-attribute baselines
==============================================  =================================================

Trees over ``n`` values that are not a power of the branching factor are *balanced*: a node
``[lo, hi)`` of size ``s > 1`` has ``min(b, s)`` children ``[lo + floor(k s / b'), lo +
floor((k + 1) s / b'))``, ``k < b' = min(b, s)``, whose sizes differ by at most one. After
``l`` levels every node has at most :math:`\lceil n / b^l \rceil` values, so the tree has
height :math:`h = \lceil \log_b n \rceil` (the smallest ``h`` with :math:`b^h \ge n`); some
leaves may sit one level higher than others (the last level is partial) and no node is
repeated. Each tree contains every leaf (the identity), so it supports any workload.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from .domain import Domain
from .error import expected_error
from .kron_union import kron_union
from .marginals import Marginals, as_domain
from .matrix import DENSE_LIMIT, Explicit, Identity, Kronecker, Matrix, Ones, Weighted
from .privacy import Privacy, PureDP
from .spectral import blocks
from .workload import AllRange, attribute_factors

__all__ = [
    "identity",
    "hierarchical",
    "hb_branching",
    "hb",
    "wavelet",
    "greedy_h",
    "quadtree",
    "datacube",
    "kron",
    "kronecker_baseline",
]

#: GreedyH treats a node as flat when k = E s - z^T G z is below this fraction of E s.
_FLAT_TOL = 1e-10
#: Largest number of candidate cuboids :func:`datacube` will enumerate.
CUBOID_LIMIT = 2**18


def _integer(value: object, what: str, minimum: int) -> int:
    """``value`` as an ``int``, checking that it is an integer of at least ``minimum``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an integer, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return int(value)


def _concat_ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``concatenate([arange(a, b) for a, b in zip(lo, hi)])`` without a Python loop."""
    lengths = hi - lo
    starts = np.cumsum(lengths) - lengths
    return np.arange(int(lengths.sum())) - np.repeat(starts - lo, lengths)


# ====================================================================== trees of intervals
@dataclass(frozen=True)
class _Level:
    """The intervals ``[lo, hi)`` partitioning ``[0, n)`` at one depth of a tree.

    ``parent[k]`` is the index of the interval one level up that contains interval ``k``
    (``-1`` at the root); ``new[k]`` is False for a leaf carried down from a shallower depth
    (the same node, not a new one).
    """

    lo: np.ndarray
    hi: np.ndarray
    parent: np.ndarray
    new: np.ndarray

    @property
    def size(self) -> np.ndarray:
        return self.hi - self.lo

    def owner(self) -> np.ndarray:
        """For each cell, the index of the interval containing it."""
        return np.repeat(np.arange(self.lo.size), self.size)

    def indicator(self) -> sp.csr_array:
        """The 0/1 matrix with one row per interval (the intervals are contiguous and sorted)."""
        n = int(self.hi[-1])
        return sp.csr_array((np.ones(n), np.arange(n), np.append(self.lo, n)), shape=(self.lo.size, n))

    def carried(self) -> _Level:
        """The same partition one level further down, every interval carried."""
        k = self.lo.size
        return _Level(self.lo, self.hi, np.arange(k), np.zeros(k, dtype=bool))


def _tree_levels(n: int, branching: int) -> list[_Level]:
    """The levels (root first) of the balanced ``branching``-ary tree over ``n`` values.

    Level ``l + 1`` splits every interval of level ``l`` of size ``s > 1`` into
    ``b' = min(b, s)`` parts ``[lo + floor(k s / b'), lo + floor((k + 1) s / b'))``; intervals
    of size one are carried down unchanged. The last level is all singletons.
    """
    levels = [_Level(np.array([0]), np.array([n]), np.array([-1]), np.array([True]))]
    while np.any(levels[-1].size > 1):
        top = levels[-1]
        size = top.size
        parts = np.minimum(branching, size)
        parent = np.repeat(np.arange(size.size), parts)
        k = np.arange(parent.size) - np.repeat(np.cumsum(parts) - parts, parts)
        lo = top.lo[parent] + k * size[parent] // parts[parent]
        hi = top.lo[parent] + (k + 1) * size[parent] // parts[parent]
        levels.append(_Level(lo, hi, parent, size[parent] > 1))
    return levels


def _stack_rows(blocks: Sequence[tuple[sp.csr_array, np.ndarray]]) -> Explicit:
    """Stack ``diag(w) @ P`` over ``(P, w)`` blocks, dropping the rows with weight zero."""
    rows = [sp.diags_array(w[w > 0]) @ P[w > 0] for P, w in blocks]
    return Explicit(sp.vstack(rows, format="csr"))


# ====================================================================== one attribute
def identity(n: int) -> Identity:
    """The identity strategy: measure every cell once (sensitivity 1).

    The "flat" method of the range-query literature; optimal for the identity workload and
    the yardstick every other baseline is compared with.
    """
    return Identity(_integer(n, "n", 1))


def hierarchical(n: int, branching: int = 2) -> Explicit:
    r"""All nodes of the balanced ``branching``-ary tree of intervals over ``n`` values.

    Rows, root first and level by level (left to right): the total, the ``b`` intervals of the
    first split, ..., the ``n`` single values. With ``b = 2`` and ``n = 2^k`` this is
    :math:`H_n` of Hay, Rastogi, Miklau & Suciu (2010), "Boosting the accuracy of
    differentially private histograms through consistency" (PVLDB 3), analysed as a matrix
    mechanism strategy by Li et al. (2010, section 6). Every cell lies in one node per level,
    so the sensitivity (L1 and squared L2) is the number of levels on its root-to-leaf path:
    :math:`\Delta_1 = h + 1`, :math:`\Delta_2 = \sqrt{h + 1}`, :math:`h = \lceil\log_b n\rceil`.
    A range query is the sum of at most :math:`2(b - 1)` nodes per level, so each noisy range
    has :math:`O(b \log_b^3 n)` variance; least squares (:math:`A^+`) only lowers it.

    Parameters
    ----------
    n
        Number of values of the (ordered) attribute, ``n >= 1``.
    branching
        Children per node, ``b >= 2``. For ``n`` not a power of ``b`` the tree is balanced (see
        the module docstring): the last level may be partial.
    """
    n = _integer(n, "n", 1)
    b = _integer(branching, "branching", 2)
    return _stack_rows([(level.indicator(), level.new.astype(float)) for level in _tree_levels(n, b)])


def hb_branching(n: int) -> int:
    r"""The branching factor HB uses for ``n`` values (Qardaji, Yang & Li 2013).

    Qardaji, Yang & Li, "Understanding hierarchical methods for differentially private
    histograms" (PVLDB 6(14), 2013) choose the branching ``b`` that minimises the average
    variance of a random range query answered by the ``b``-ary hierarchy of height
    :math:`h = \lceil \log_b n \rceil`: a range needs about :math:`b - 1` nodes per level on
    average, each with variance proportional to :math:`h^2` (the budget is split over the
    levels), so the average variance is proportional to :math:`(b - 1)\, h^3` up to
    lower-order terms. The rule implemented here is exactly

    .. math:: b^\star = \operatorname*{arg\,min}_{2 \le b \le \max(n, 2)} (b - 1)\,
              \lceil \log_b n \rceil^3,

    with :math:`\lceil \log_b n \rceil` computed in integers (the smallest ``h`` with
    :math:`b^h \ge n`) and ties broken towards the smaller ``b``. For a fixed height the cost
    grows with ``b``, so only the smallest branching reaching each height,
    :math:`b_h = \lceil n^{1/h} \rceil`, needs to be compared. Examples: ``n = 128 -> 12``,
    ``256 -> 16``, ``1024 -> 32``, ``8192 -> 21``.
    """
    n = _integer(n, "n", 1)
    costs = []
    for h in range(1, max(1, (n - 1).bit_length()) + 1):
        b = max(2, round(n ** (1.0 / h)))
        while b > 2 and (b - 1) ** h >= n:
            b -= 1
        while b**h < n:
            b += 1
        costs.append(((b - 1) * h**3, b))
    return min(costs)[1]


def hb(n: int, *, exact: bool = False, privacy: Privacy | None = None, max_branching: int = 64) -> Explicit:
    r"""HB: the hierarchical strategy with the branching of Qardaji, Yang & Li (2013).

    Returns :func:`hierarchical` ``(n, b)`` with uniform weights across levels (the privacy
    budget split equally between levels, as in HB).

    Parameters
    ----------
    n
        Number of values, ``n >= 1``.
    exact
        ``False`` (default): ``b`` from the rule of the paper, :func:`hb_branching`.
        ``True``: ``b`` minimising hdmm's exact :func:`~hdmm.error.expected_error` on all
        range queries, :class:`~hdmm.workload.AllRange` ``(n)``, over
        ``2 <= b <= max_branching`` and the flat tree ``b = n`` (one dense pseudo-inverse of
        an ``n x n`` Gram per candidate: use for ``n`` up to a few thousand).
    privacy
        The privacy definition for ``exact=True`` (it fixes the sensitivity norm: L1 for
        :class:`~hdmm.privacy.PureDP`, the default, L2 for Gaussian noise).
    max_branching
        Largest branching tried by ``exact=True``.
    """
    n = _integer(n, "n", 1)
    if not exact:
        return hierarchical(n, hb_branching(n))
    top = _integer(max_branching, "max_branching", 2)
    privacy = PureDP(1.0) if privacy is None else privacy
    W = AllRange(n)
    trees = [hierarchical(n, b) for b in sorted({*range(2, min(n, top) + 1), max(n, 2)})]
    return min(trees, key=lambda A: float(expected_error(W, A, privacy)))


def wavelet(n: int) -> Explicit:
    r"""The Haar wavelet strategy :math:`Y_n` (Privelet).

    Xiao, Wang & Gehrke, "Differential privacy via wavelet transforms" (ICDE 2010) release
    noisy Haar coefficients; Li et al. (2010, section 6 and appendix E) show this is the
    matrix mechanism with the unnormalised Haar matrix: the total, then for every node of
    the binary tree over ``n = 2^k`` values the difference "left half minus right half"
    (entries +1 / -1). For ``n = 4``

    .. math:: Y_4 = \begin{bmatrix} 1 & 1 & 1 & 1 \\ 1 & 1 & -1 & -1 \\
              1 & -1 & 0 & 0 \\ 0 & 0 & 1 & -1 \end{bmatrix}.

    :math:`Y_n` is square and invertible, every cell has one non-zero per level, so
    :math:`\Delta_1 = 1 + k` and :math:`\Delta_2 = \sqrt{1 + k}`. Rows: the total, then level
    by level (coarsest first), left to right.

    For ``n`` not a power of two the domain is padded to :math:`2^k`,
    :math:`k = \lceil \log_2 n \rceil`, and the padded columns are dropped, as are the rows
    left all zero (difference queries entirely inside the padding). The remaining columns of
    an invertible matrix are linearly independent, so the strategy still has full column
    rank ``n`` and supports every workload; its sensitivity is still ``1 + k``.
    """
    n = _integer(n, "n", 1)
    k = (n - 1).bit_length()
    padded = 1 << k
    cells = np.arange(n)
    blocks = [sp.csr_array(np.ones((1, n)))]
    for level in range(k):
        span = padded >> level
        node = cells // span
        sign = np.where(cells % span < span // 2, 1.0, -1.0)
        blocks.append(sp.csr_array((sign, (node, cells)), shape=(int(node[-1]) + 1, n)))
    return Explicit(sp.vstack(blocks, format="csr"))


# ====================================================================== GreedyH
def _as_gram(workload: Matrix | None, gram: Matrix | np.ndarray | None) -> Matrix:
    """The workload Gram ``W^T W`` from exactly one of a workload or its Gram."""
    if (workload is None) == (gram is None):
        raise ValueError("give exactly one of workload (an m x n matrix) or gram (its n x n Gram W^T W)")
    if workload is not None:
        if not isinstance(workload, Matrix):
            raise TypeError(f"workload must be an hdmm matrix, got {type(workload).__name__}")
        return workload.gram()
    G = gram if isinstance(gram, Matrix) else Explicit(gram)
    if G.shape[0] != G.shape[1]:
        raise ValueError(f"a Gram matrix must be square, got shape {G.shape}")
    return G


class _IntervalForms:
    r"""Quadratic forms :math:`v_I^T G_{II} v_I` of a Gram over disjoint intervals ``I``.

    ``G`` is densified when it has at most ``DENSE_LIMIT`` entries and the forms are read from
    its diagonal blocks; otherwise the vectors restricted to the intervals are stacked as the
    columns of ``n x k`` blocks and multiplied by the implicit ``G`` (structured Grams such as
    :class:`~hdmm.workload.PrefixGram` cost ``O(n k)`` per block).
    """

    def __init__(self, gram: Matrix):
        self.gram = gram
        self.n = gram.shape[0]
        self.dense = gram.dense() if self.n * self.n <= DENSE_LIMIT else None
        self.diag = np.diagonal(self.dense).copy() if self.dense is not None else np.asarray(gram.diag(), dtype=float)

    def __call__(self, lo: np.ndarray, hi: np.ndarray, v: np.ndarray) -> np.ndarray:
        if self.dense is not None:
            G = self.dense
            return np.array([v[a:b] @ G[a:b, a:b] @ v[a:b] for a, b in zip(lo, hi)])
        out = np.empty(lo.size)
        for block in blocks(lo.size, self.n):
            a, b = lo[block], hi[block]
            rows = _concat_ranges(a, b)
            Z = np.zeros((self.n, a.size), order="F")  # column-major: fast cumulative sums down columns
            Z[rows, np.repeat(np.arange(a.size), b - a)] = v[rows]
            out[block] = np.einsum("ij,ij->j", Z, self.gram @ Z)
        return out

    def corners(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        r""":math:`G_{lo, hi - 1}` for disjoint intervals of at least two cells.

        Read from the dense Gram, or as :math:`(v^T G v - G_{aa} - G_{bb}) / 2` with ``v`` the
        indicator of the two ends ``a = lo``, ``b = hi - 1`` of each interval.
        """
        if self.dense is not None:
            return self.dense[lo, hi - 1]
        ends = np.zeros(self.n)
        ends[lo] = ends[hi - 1] = 1.0
        return (self(lo, hi, ends) - self.diag[lo] - self.diag[hi - 1]) / 2


def _split_error(e: float, s: float, k: float, u: float) -> float:
    """The subtree error ``(1 + u)^2 (e + k u^2) / (1 + s u^2)`` of :func:`greedy_h`."""
    return (1 + u) ** 2 * (e + k * u * u) / (1 + s * u * u)


def _best_split(e: float, s: float, k: float) -> float:
    r"""The ``u >= 0`` minimising :math:`(1 + u)^2 (e + k u^2) / (1 + s u^2)`.

    Its derivative vanishes at the positive real roots of
    :math:`s k u^4 + 2 k u^2 - (e s - k)\, u + e = 0`; the function tends to infinity with
    ``u`` when ``k > 0``, so its minimum on :math:`[0, \infty)` is at ``u = 0`` or at one of
    them.
    """
    roots = np.roots([s * k, 0.0, 2.0 * k, k - e * s, e])
    real = roots.real[(np.abs(roots.imag) <= 1e-9 * (1.0 + np.abs(roots))) & (roots.real > 0)]
    return min([0.0, *real.tolist()], key=lambda u: _split_error(e, s, k, u))


def greedy_h(
    workload: Matrix | None = None,
    branching: int = 2,
    *,
    gram: Matrix | np.ndarray | None = None,
) -> Explicit:
    r"""GreedyH: a hierarchical strategy whose node weights are fitted to a workload.

    The strategy step of DAWA: Li, Hay, Miklau & Wang, "A data- and workload-aware algorithm
    for range queries under differential privacy" (PVLDB 7(5), 2014). The queries are the
    nodes of the balanced ``branching``-ary tree of :func:`hierarchical`; node ``v`` is
    measured with a weight :math:`c_v \ge 0` chosen greedily, bottom-up.

    **Budget.** Every subtree is normalised so that the weights on each of its node-to-leaf
    paths sum to one: node ``v`` keeps a share :math:`c = u / (1 + u)` and its children's
    subtrees are scaled by :math:`1 - c = 1 / (1 + u)`, ``u >= 0``. Every column of the final
    strategy has L1 norm exactly 1 (sensitivity 1: one unit of budget per path). This is the
    budget of pure differential privacy (Laplace noise), for which DAWA is designed; under
    Gaussian noise (L2 sensitivity) the weights are not tuned and uniform trees can do better.

    **What a subtree answers.** A range query is answered from its canonical decomposition:
    the largest tree nodes inside it. The queries that contain all of v's parent ``p`` take
    v's cells from ``p`` or an ancestor, so v's subtree answers the restriction to v's cells
    of the *other* queries, with Gram

    .. math:: \hat G_v = G_v - \gamma_p\, 1 1^T, \qquad \gamma_p = G_{lo_p,\, hi_p - 1},

    where :math:`G_v` is the block of :math:`G = W^TW` on v's cells and :math:`\gamma_p`, the
    weight of the queries containing both ends of ``p``, is for interval queries exactly the
    weight of those containing ``p`` (for other workloads it is a heuristic; ``e`` below is
    clipped at 0). At the root :math:`\gamma = 0`.

    **Greedy step.** With the children's weights fixed, ``u`` minimises the exact
    least-squares error of :math:`\hat G_v` answered from v's subtree. With ``B`` the
    block-diagonal Gram of the children's subtrees, :math:`z = B^{-1} 1`, :math:`s = 1^T z`
    and :math:`E = \mathrm{tr}(B^{-1} G_v)` (the sum of the children's values of
    :math:`E_c = \mathrm{tr}(X_c^{-1} G_c)`), Sherman-Morrison gives

    .. math:: X_v = (1 + u)^{-2} \big(B + u^2\, 1 1^T\big), \qquad
              \mathrm{tr}(X_v^{-1} \hat G_v) = (1 + u)^2\, \frac{e + k u^2}{1 + s u^2},

    with :math:`e = E - \gamma_p s` and :math:`k = E s - z^T G_v z \ge 0` (which does not
    depend on :math:`\gamma_p`). The best ``u`` is ``0`` or a positive root of a quartic
    (:func:`_best_split`). The node then passes up :math:`z_v = (1 + u)^2 z / (1 + s u^2)`,
    :math:`s_v = 1^T z_v` and :math:`E_v = (1 + u)^2 (E + k u^2) / (1 + s u^2)`; leaves start
    from :math:`z = 1, s = 1, E = G_{ii}`. At the root :math:`E` is the exact error of the
    whole strategy, :math:`\mathrm{tr}((A^TA)^{-1} W^TW)` at unit sensitivity. Uniform H_b is
    one point of the search space; the greedy choice beats it in practice (not by proof).

    **Flat blocks.** Where no workload query tells the cells of a node apart (``k = 0``: the
    workload restricted to the node is constant on it, e.g. every node for the total
    workload) the node's total answers everything its subtree would: the node is measured with
    its whole path budget and its subtree is not measured. The strategy then supports the
    workload but not every query; for range workloads such as prefixes or all ranges no block
    is flat and every leaf is measured.

    The paper's algorithm keeps the same search space (one weight per node, paths normalised,
    greedy bottom-up, queries answered through their canonical decomposition); the cost of a
    choice here is the exact least-squares error of the subtree's share of the workload.

    Parameters
    ----------
    workload
        The workload ``W`` (``m x n``); its :meth:`~hdmm.matrix.Matrix.gram` is used.
    branching
        Children per node, ``b >= 2`` (DAWA uses 2).
    gram
        Instead of ``workload``: its Gram ``W^T W`` (``n x n`` hdmm matrix or array).

    Notes
    -----
    Cost: ``O(n^2)`` with a dense Gram (``n`` up to about 5,800), else implicit Gram products
    with ``O(n)`` vectors, in blocks (fast for the structured range Grams, e.g. ``n = 8192``
    prefixes).
    """
    G = _as_gram(workload, gram)
    b = _integer(branching, "branching", 2)
    n = G.shape[0]
    levels = _tree_levels(n, b)
    forms = _IntervalForms(G)

    # bottom-up: which nodes are flat, and the split u of the others
    z = np.ones(n)
    s, E = np.ones(n), forms.diag.copy()  # the leaves, all on the last level
    split = [np.zeros(level.lo.size) for level in levels]
    flat = [level.size == 1 for level in levels]
    for depth in reversed(range(len(levels) - 1)):
        level, below, u, leaf = levels[depth], levels[depth + 1], split[depth], flat[depth]
        s = np.bincount(below.parent, weights=s, minlength=level.lo.size)
        E = np.bincount(below.parent, weights=E, minlength=level.lo.size)
        big = np.flatnonzero(level.size > 1)
        k = np.maximum(E[big] * s[big] - forms(level.lo[big], level.hi[big], z), 0.0)
        mixed = np.bincount(below.parent, weights=~flat[depth + 1], minlength=level.lo.size)[big] > 0
        leaf[big] = ~mixed & (k <= _FLAT_TOL * E[big] * s[big])
        inner, k = big[~leaf[big]], k[~leaf[big]]
        z[_concat_ranges(level.lo[leaf], level.hi[leaf])] = np.repeat(1.0 / level.size[leaf], level.size[leaf])
        s[leaf] = 1.0
        E[leaf] = forms.diag[level.lo[leaf]]
        if inner.size:
            claimed = np.zeros(inner.size)
            if depth:
                up = levels[depth - 1]
                parents, where = np.unique(level.parent[inner], return_inverse=True)
                claimed = forms.corners(up.lo[parents], up.hi[parents])[where]
            e = np.maximum(E[inner] - claimed * s[inner], 0.0)
            u[inner] = [_best_split(*args) for args in zip(e, s[inner], k)]
            E[inner] = _split_error(E[inner], s[inner], k, u[inner])
            factor = (1 + u) ** 2 / (1 + s * u**2)
            z *= factor[level.owner()]
            s = s * factor

    # top-down: absolute weights c_v * prod_{ancestors a} (1 - c_a)
    blocks = []
    share = np.ones(1)
    for depth, level in enumerate(levels):
        measured_leaf = flat[depth]
        if depth:
            share = (share / (1 + split[depth - 1]))[level.parent]
            measured_leaf = measured_leaf & ~flat[depth - 1][level.parent]
        u = split[depth]
        weight = np.where(flat[depth], np.where(measured_leaf, share, 0.0), share * u / (1 + u))
        blocks.append((level.indicator(), weight))
    return _stack_rows(blocks)


# ====================================================================== two attributes
def quadtree(n1: int, n2: int) -> Explicit:
    r"""The 2-D hierarchical quadtree over an ``n1 x n2`` grid.

    The root is the whole grid; every node ``[r0, r1) x [c0, c1)`` is split in half along
    each dimension of size greater than one (four children, or two once one side is a
    single row or column), down to single cells. The row and column halvings are those of
    the balanced binary trees over ``n1`` and ``n2`` (:func:`hierarchical`), so the nodes at
    depth ``l`` are the products :math:`I \times J` of the depth-``l`` intervals of the two
    trees, a depth-``l`` level being :math:`P^{(1)}_l \otimes P^{(2)}_l`; a product of two
    leaves carried down from shallower depths is an existing node and is not repeated. This
    is the data-independent quadtree of Cormode et al. (ICDE 2012, "Differentially private
    spatial decompositions") with uniform budget per level. Cells are in C order (first
    attribute most significant), rows root first, level by level.
    The strategy contains every cell, so it supports any workload;
    :math:`\Delta_1 = 1 + \max(\lceil\log_2 n_1\rceil, \lceil\log_2 n_2\rceil)`.
    """
    first = _tree_levels(_integer(n1, "n1", 1), 2)
    second = _tree_levels(_integer(n2, "n2", 1), 2)
    depth = max(len(first), len(second))
    for levels in (first, second):
        levels.extend(levels[-1].carried() for _ in range(depth - len(levels)))
    blocks = []
    for a, b in zip(first, second):
        product = sp.csr_array(sp.kron(a.indicator(), b.indicator(), format="csr"))
        blocks.append((product, np.logical_or.outer(a.new, b.new).ravel().astype(float)))
    return _stack_rows(blocks)


# ====================================================================== data cubes
def _marginal_factor(f: Matrix) -> tuple[bool, float] | None:
    """``(aggregated over?, scale)`` of a factor that is ``c I`` or ``c 1^T``; ``None`` otherwise."""
    if isinstance(f, Weighted):
        inner = _marginal_factor(f.base)
        return None if inner is None else (inner[0], inner[1] * f.weight)
    if isinstance(f, Identity):
        return False, 1.0
    if isinstance(f, Ones) and f.shape[0] == 1:
        return True, 1.0
    return None


def _union_cuboids(domain: Domain, workload: Matrix) -> tuple[np.ndarray, np.ndarray]:
    r"""Membership and weights of a workload that is a (weighted) union of marginals.

    A marginal listed more than once counts once, with weight :math:`\sqrt{\sum w^2}` (the
    same Gram, so the same error under any strategy).
    """
    union = kron_union(workload)
    if union.sizes != domain.shape:
        raise ValueError(f"the workload's attributes have sizes {union.sizes}, not the domain's {domain.shape}")
    members = np.zeros((union.num_terms, len(domain)), dtype=bool)
    squares = np.zeros(union.num_terms)
    for j in range(union.num_terms):
        weight, factors = union.term(j)
        parts = [_marginal_factor(f) for f in factors]
        if any(part is None for part in parts):
            raise TypeError(f"DataCube measures marginals, and workload term {j} is not one ({factors}); "
                            "use hdmm.optimize for other workloads")
        members[j] = [not aggregated for aggregated, _ in parts]
        squares[j] = (weight * np.prod([scale for _, scale in parts])) ** 2
    keys, inverse = np.unique(members, axis=0, return_inverse=True)
    return keys, np.sqrt(np.bincount(inverse.ravel(), weights=squares, minlength=keys.shape[0]))


def _workload_cuboids(domain: Domain, workload: Matrix | Sequence[Sequence]) -> tuple[np.ndarray, np.ndarray]:
    """Membership ``(cuboids, d)`` and weights of the workload marginals."""
    if isinstance(workload, Marginals):
        if workload.domain != domain:
            raise ValueError(f"the workload marginals are over {workload.domain!r}, not over {domain!r}")
        return workload.members, workload.weights
    if isinstance(workload, Matrix):
        return _union_cuboids(domain, workload)
    if isinstance(workload, (str, bytes)) or not isinstance(workload, Sequence):
        raise TypeError("workload_marginals must be an hdmm marginals workload (Marginals, or a union of "
                        "marginals) or a list of attribute subsets")
    members = np.zeros((len(workload), len(domain)), dtype=bool)
    for row, attrs in enumerate(workload):
        if isinstance(attrs, (str, numbers.Integral)):
            attrs = (attrs,)
        members[row, list(domain.indices(attrs))] = True
    if np.unique(members, axis=0).shape[0] != members.shape[0]:
        raise ValueError("each workload marginal may be listed only once")
    return members, np.ones(members.shape[0])


def datacube(
    domain: Domain | Sequence[int],
    workload_marginals: Matrix | Sequence[Sequence],
    *,
    privacy: Privacy | None = None,
) -> Marginals:
    r"""DataCube: measure a greedily chosen set of cuboids (marginals), each with weight 1.

    Ding, Winslett, Han & Li, "Differentially private data cubes: optimizing noise sources
    and consistency" (SIGMOD 2011). A workload cuboid ``C`` (a marginal) can be computed from
    any measured cuboid ``K`` that contains its attributes, :math:`K \supseteq C`, by summing
    :math:`|K| / |C|` noisy cells into each cell of ``C`` (:math:`|K|` = number of cells). With
    the budget split equally over the set ``S`` of measured cuboids (weight 1 each: the
    sensitivity is :math:`\Delta_1 = |S|` or :math:`\Delta_2 = \sqrt{|S|}`), answering every
    ``C`` from its cheapest measured superset has total squared error, in units of the noise
    variance at unit sensitivity,

    .. math:: \mathrm{cost}(S) = |S|^{2/p} \sum_{C \in L} w_C^2 \min_{K \in S,\, K \supseteq C} |K|

    (``p`` the sensitivity norm, ``w_C`` the workload weights). The paper selects cuboids
    greedily under this noise model with a max-variance objective (its BMMax problem); hdmm
    reports total squared error, so the variant implemented here minimises ``cost(S)``, by
    greedy local search:

    1. start from ``S = L`` (the workload cuboids themselves), and separately from
       ``S = {U}`` (the single finest cuboid ``U`` over all the attributes the workload uses);
    2. among all moves "add one candidate cuboid" and "remove one measured cuboid" (keeping
       every ``C`` covered), apply the one that lowers ``cost`` most;
    3. stop when no move lowers it, and keep the better of the two local optima.

    Candidates are all cuboids over the attributes the workload uses that contain at least one
    workload cuboid (a cuboid with any other attribute is dominated). The model ignores that
    hdmm's least-squares reconstruction combines all measured cuboids, which can favour
    measuring ``L`` directly; so the exact errors (:func:`~hdmm.error.expected_error`, closed
    form in the marginals algebra) of the selection and of ``L`` are compared and the better
    is returned. Either way the strategy supports the workload.

    Parameters
    ----------
    domain
        The domain (or a tuple of attribute sizes).
    workload_marginals
        An hdmm :class:`~hdmm.marginals.Marginals` workload or a (weighted) union of marginals
        such as ``hdmm.union([DimKMarginals(d, 1), DimKMarginals(d, 2)])`` (their weights are
        used), or a list of attribute subsets (names or positions), each with weight 1.
    privacy
        The privacy definition (default :class:`~hdmm.privacy.PureDP`): it fixes the
        sensitivity norm ``p`` (1 for Laplace noise, 2 for Gaussian).
    """
    domain = as_domain(domain)
    privacy = PureDP(1.0) if privacy is None else privacy
    members, weights = _workload_cuboids(domain, workload_marginals)
    members, weights = members[weights > 0], weights[weights > 0]
    if members.shape[0] == 0:
        raise ValueError("the workload has no marginal with a positive weight")
    power = 2.0 / privacy.norm

    used = np.flatnonzero(members.any(axis=0))
    if 2**used.size > CUBOID_LIMIT:
        raise ValueError(
            f"the workload marginals use {used.size} attributes: {2 ** used.size:,} candidate cuboids "
            f"exceeds the limit of {CUBOID_LIMIT:,}"
        )
    bits = 1 << np.arange(used.size)
    wanted = members[:, used] @ bits
    masks = np.arange(2**used.size)
    covers = (masks[:, None] & wanted[None, :]) == wanted[None, :]  # (candidates, workload)
    masks, covers = masks[covers.any(axis=1)], covers[covers.any(axis=1)]
    inside = (masks[:, None] & bits[None, :]) > 0
    cells = np.prod(np.where(inside, np.array(domain.shape, dtype=float)[used], 1.0), axis=1)
    cost = np.where(covers, weights**2 * cells[:, None], np.inf)

    def local_search(chosen: np.ndarray) -> tuple[float, np.ndarray]:
        while True:
            picked = np.flatnonzero(chosen)
            ordered = np.sort(cost[picked], axis=0)
            best = ordered[0]
            current = picked.size**power * best.sum()
            add = (picked.size + 1) ** power * np.minimum(cost, best).sum(axis=1)
            add[chosen] = np.inf
            remove = np.full(1, np.inf)
            if picked.size > 1:
                remove = (picked.size - 1) ** power * np.where(cost[picked] <= best, ordered[1], best).sum(axis=1)
            if min(add.min(), remove.min()) >= current * (1 - 1e-12):
                return current, chosen
            if add.min() <= remove.min():
                chosen[np.argmin(add)] = True
            else:
                chosen[picked[np.argmin(remove)]] = False

    _, chosen = min(local_search(np.isin(masks, wanted)), local_search(masks == masks[-1]), key=lambda t: t[0])
    selected = np.zeros((int(chosen.sum()), len(domain)), dtype=bool)
    selected[:, used] = inside[chosen]
    order = np.lexsort((masks[chosen], selected.sum(axis=1)))
    greedy = Marginals.from_members(domain, selected[order], np.ones(order.size))
    direct = Marginals.from_members(domain, members, np.ones(members.shape[0]))
    W = Marginals.from_members(domain, members, weights)
    return min((greedy, direct), key=lambda A: float(expected_error(W, A, privacy)))


# ====================================================================== Kronecker products
def kron(*factors: Matrix) -> Kronecker:
    r"""The Kronecker product :math:`A_1 \otimes \dots \otimes A_d` of one-attribute strategies.

    By docs/math.md, section 2, its Gram, pseudo-inverse and column norms factor, so hdmm computes
    the error on any (union of) Kronecker workload(s) exactly from the factors. E.g.
    ``kron(hb(64), identity(2))`` is HB on the first attribute crossed with the identity.
    """
    if not factors:
        raise ValueError("kron needs at least one factor")
    return Kronecker(list(factors))


def kronecker_baseline(domain: Domain | Sequence[int], strategies: Mapping[str | int, Matrix]) -> Kronecker:
    """The Kronecker product of per-attribute strategies over ``domain``; the identity elsewhere.

    ``kronecker_baseline(dom, {"age": hb(115)})`` measures every combination of the other
    attributes' values crossed with HB's intervals of ages.

    Parameters
    ----------
    domain
        The domain (or a tuple of attribute sizes, attributes then named ``a0, a1, ...``).
    strategies
        One-attribute strategies by attribute name or position; each must have as many
        columns as its attribute has values.
    """
    domain = as_domain(domain)
    return Kronecker(attribute_factors(domain, strategies, Identity), names=domain.names)
