r"""Exact per-query variances of union-of-Kronecker strategies whose factor Grams diagonalise together.

A union strategy :math:`A = \mathrm{VStack}_g\, a_g \bigotimes_i A_{g,i}` (what OPT_+ builds) has
the Gram :math:`X = \sum_g a_g^2 \bigotimes_i X_{g,i}`, a sum of Kronecker products with no
Kronecker pseudo-inverse. When, on every attribute :math:`i`, one invertible :math:`T_i`
diagonalises every factor Gram by congruence, :math:`T_i^T X_{g,i} T_i = \mathrm{diag}(d_{g,i})`,
then with :math:`T = \bigotimes_i T_i`

.. math:: T^T X T = \mathrm{diag}(\delta), \qquad \delta = \sum_g a_g^2 \bigotimes_i d_{g,i},

and a query :math:`w` is supported (:math:`w^T` in the range of :math:`X`) exactly when
:math:`u = T^T w^T` vanishes wherever :math:`\delta` does; its variance at unit noise is then

.. math:: w X^+ w^T = \sum_k u_k^2 / \delta_k

(any :math:`v` with :math:`Xv = w^T` gives :math:`w v = w X^+ w^T`, and
:math:`v = T \mathrm{diag}(\delta)^+ T^T w^T` is one). For a workload term
:math:`c \bigotimes_i F_i` the coordinates factor too, :math:`u = c \bigotimes_i (F_i T_i)`, so
the variances of the term's queries are the multilinear contraction of the grid
:math:`1/\delta` with the matrices :math:`(F_i T_i)^{\circ 2}` (docs/math.md, section 2.8).

Two positive semi-definite Grams always diagonalise together (whiten by their sum on its range,
then take the eigenvectors of one of them); more do when their whitened forms commute, which is
checked numerically. An attribute whose Grams do not is reported by :func:`joint_diagonal`
returning ``None``. A workload total on an attribute (the ones row) is diagonalised along with the
strategy's Grams when it fits: then :math:`T_i^T \mathbf 1` has one non-zero, and the term's grid
collapses on that attribute, which keeps the grid of a low-order marginal small on any domain.

Values of :math:`\delta` below ``PINV_RCOND`` of its largest possible value count as zero, as the
dense pseudo-inverse cuts eigenvalues (:data:`hdmm.traces.PINV_RCOND`). For a Gram whose condition
number is beyond about 1e10 the two routes can then disagree on which queries are supported; where
they do, this route's finite variances are the least-squares ones (``numpy.linalg.lstsq`` agrees).

>>> import numpy as np, hdmm
>>> from hdmm.matrix import Kronecker, Ones, VStack
>>> from hdmm.kron_union import kron_union
>>> A = VStack([Kronecker([hdmm.Identity(3), Ones(1, 4)]), Kronecker([Ones(1, 3), hdmm.Prefix(4)])])
>>> [len(t) for t in joint_diagonal(kron_union(A)).diagonals]   # two Grams per attribute
[2, 2]
>>> W = Kronecker([Ones(1, 3), Ones(1, 4)])                      # the total: measured by both terms
>>> round(float(term_variances(union_terms(W, kron_union(A))[0])[0]), 12)  # 1 / (1/3 + 1/1)
0.75
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .kron_union import KronUnion, aligned_pair
from .matrix import DenseLimitError, Matrix
from .traces import FACTOR_DENSE_LIMIT, PINV_RCOND, SUPPORT_TOL
from .validation import ZERO_RTOL

__all__ = ["JointDiagonal", "joint_diagonal", "cached_joint_diagonal", "factors_diagonalise",
           "TermGrid", "term_grid",
           "GRID_LIMIT", "CP_FACTORS_LIMIT", "TOTALS_KEPT", "DIAGONAL_RTOL", "union_terms", "union_totals",
           "union_route", "contract", "term_variances"]

#: Largest grid of :math:`1/\delta` values one workload term may need (entries, 128 MiB of floats).
GRID_LIMIT = 2**24

#: Largest off-diagonal part (relative Frobenius norm) accepted in a joint diagonalisation.
DIAGONAL_RTOL = 1e-9

#: :math:`\delta` grids are one matrix product when its two factors fit in this many entries (or in the
#: grid's own size), else a loop of outer products (:func:`_cp_grid`).
CP_FACTORS_LIMIT = 2**20

#: Workload terms whose sums of variances a joint diagonalisation keeps (:meth:`JointDiagonal.term_total`);
#: beyond, it forgets them and starts again.
TOTALS_KEPT = 4096

#: Squared transformed coordinates below this fraction of their column's largest are rounding.
_MASS_RTOL = 1e-20


@dataclass
class JointDiagonal:
    """Per attribute, the congruence ``T_i`` and the diagonal of every strategy factor Gram in it.

    Attributes
    ----------
    transforms : list of numpy.ndarray
        ``T_i`` (``n_i x n_i``, invertible).
    diagonals : list of numpy.ndarray
        ``diagonals[i][k]``: :math:`\\mathrm{diag}(T_i^T X_{k,i} T_i)` for the ``k``-th distinct factor of
        attribute ``i`` (``union.factors[i][k]``).
    union : KronUnion
        The strategy's union.
    """

    transforms: list[np.ndarray]
    diagonals: list[np.ndarray]
    union: KronUnion

    def __post_init__(self) -> None:
        # identical factor Grams (OPT_+ repeats one factor over many groups) share one diagonal
        self._labels, self._unique = [], []
        for d in self.diagonals:
            unique, labels = np.unique(d, axis=0, return_inverse=True)
            self._unique.append(unique)
            self._labels.append(labels.ravel()[self.union.index[:, len(self._labels)]])
        largest = [d.max(axis=1, initial=0.0) for d in self.diagonals]
        self._scale = float(np.sum(self.union.weights ** 2 * self.union.products(largest)))
        self._squares: dict[tuple[int, int], tuple[Matrix, tuple[np.ndarray, np.ndarray]]] = {}
        self._totals: dict[tuple, tuple[list[Matrix], tuple[float, bool]]] = {}

    def term_total(self, weight: float, factors: list[Matrix],
                   squares: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, bool]:
        """:meth:`TermGrid.total` of the workload term ``weight * (x) factors`` (its factors' :meth:`squares`
        given), computed once per term (kept by its factor objects and weight)."""
        key = (float(weight),) + tuple(id(f) for f in factors)
        hit = self._totals.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], factors)):
            if len(self._totals) >= TOTALS_KEPT:  # workloads lined up anew each time bring new factor objects
                self._totals.clear()
            hit = self._totals[key] = (list(factors), term_grid(self, weight, factors, squares).total())
        return hit[1]

    def squares(self, i: int, f: Matrix) -> tuple[np.ndarray, np.ndarray]:
        r"""A workload factor's :math:`(fT_i)^{\circ 2}` on attribute ``i`` where it has mass, and those columns
        (computed once per factor object)."""
        hit = self._squares.get((i, id(f)))
        if hit is None or hit[0] is not f:
            hit = self._squares[(i, id(f))] = (f, _squares(f, self.transforms[i]))
        return hit[1]

    def delta(self, cols: list[np.ndarray]) -> np.ndarray:
        r""":math:`\delta` on the grid ``cols[0] x cols[1] x ...`` (index arrays), zero where it is rounding.

        Strategy terms are summed by the diagonals they use on the grid's attributes of more than one
        point (a total's attribute has one), so a grid is a sum of one outer product per distinct
        pattern: :math:`\delta = \sum_p s_p \bigotimes_i m_{p,i}`. Split the wide attributes into a
        first and a last part; with :math:`L` (:math:`P \times a`) holding row by row the outer
        products :math:`\bigotimes_{i \le h} m_{p,i}` and :math:`R` (:math:`P \times b`) those of the
        rest, the grid is :math:`L^T \mathrm{diag}(s) R` reshaped, one matrix product (:func:`_cp_grid`).
        """
        coefficient = self.union.weights ** 2
        wide = []
        for i, c in enumerate(cols):
            if len(c) == 1:
                coefficient = coefficient * self._unique[i][self._labels[i], c[0]]
            else:
                wide.append(i)
        shape = tuple(len(c) for c in cols)
        if wide:
            patterns, which = np.unique(np.stack([self._labels[i] for i in wide], axis=1), axis=0, return_inverse=True)
            sums = np.bincount(which.ravel(), weights=coefficient, minlength=len(patterns))
            used = sums != 0
            rows = [self._unique[i][patterns[used, k]][:, cols[i]] for k, i in enumerate(wide)]
            out = _cp_grid(sums[used], rows).reshape(shape)
        else:
            out = np.full(shape, float(coefficient.sum()))
        return np.where(out > PINV_RCOND * self._scale, out, 0.0)


def _khatri_rao(rows: list[np.ndarray], P: int) -> np.ndarray:
    """Row by row outer products: ``out[p] = (x)_i rows[i][p]`` flattened in C order (``P x prod n_i``; ones
    when ``rows`` is empty)."""
    out = np.ones((P, 1))
    for M in rows:
        out = (out[:, :, None] * M[:, None, :]).reshape(out.shape[0], -1)
    return out


def _cp_grid(s: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    r""":math:`\sum_p s_p \bigotimes_i` ``rows[i][p]``, flattened in C order (``P`` patterns, ``rows[i]`` is
    ``P x n_i``).

    One matrix product :math:`L^T \mathrm{diag}(s) R` over the split of the attributes that makes the
    two factors smallest; a loop of outer products when the factors would take more memory than the
    grid itself (many patterns on a small grid).
    """
    P = len(s)
    sizes = [M.shape[1] for M in rows]
    size = math.prod(sizes)
    if P == 0:
        return np.zeros(size)
    firsts = [math.prod(sizes[:h]) for h in range(len(sizes) + 1)]
    h = min(range(1, len(sizes) + 1), key=lambda h: firsts[h] + size // firsts[h])
    if P * (firsts[h] + size // firsts[h]) <= max(size, CP_FACTORS_LIMIT):
        L = _khatri_rao(rows[:h], P)
        R = _khatri_rao(rows[h:], P)
        return ((L * s[:, None]).T @ R).ravel()
    out = np.zeros(size)
    for p in range(P):
        out += _khatri_rao([M[p:p + 1] for M in rows], 1).ravel() * s[p]
    return out


def _dense_gram(f: Matrix) -> np.ndarray:
    n = f.shape[1]
    if n * n > FACTOR_DENSE_LIMIT:
        raise DenseLimitError(f"a strategy factor over {n:,} values is too large to diagonalise densely")
    return np.asarray(f.gram().dense(max_entries=FACTOR_DENSE_LIMIT), dtype=float)


def _together(grams: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """``(T, [diag(T^T X T) for X in grams])`` for one ``T`` diagonalising every Gram, or ``None``."""
    n = grams[0].shape[0]
    norms = [float(np.linalg.norm(X)) for X in grams]
    scaled = [X / s for X, s in zip(grams, norms) if s > 0]
    if not scaled:
        return np.eye(n), [np.zeros(n) for _ in grams]
    total = sum(scaled)
    sigma, U = np.linalg.eigh(total)
    keep = sigma > ZERO_RTOL * sigma[-1]
    whiten = U[:, keep] / np.sqrt(sigma[keep])
    whitened = [whiten.T @ X @ whiten for X in scaled]
    if len(whitened) <= 2:
        combination = whitened[0]
    else:  # commuting whitened Grams share the eigenvectors of a generic combination of them
        coefficients = np.random.default_rng(0).uniform(1.0, 2.0, len(whitened))
        combination = sum(c * M for c, M in zip(coefficients, whitened))
    _, Q = np.linalg.eigh(combination)
    T = np.hstack([whiten @ Q, U[:, ~keep]])
    diagonals = []
    for X in grams:
        D = T.T @ X @ T
        d = np.diag(D).copy()
        size = float(np.linalg.norm(D))
        if size > 0 and np.linalg.norm(D - np.diag(d)) > DIAGONAL_RTOL * size:
            return None
        d[d <= ZERO_RTOL * d.max(initial=0.0)] = 0.0
        diagonals.append(d)
    return T, diagonals


def cached_joint_diagonal(union: KronUnion) -> JointDiagonal | None:
    """:func:`joint_diagonal` of ``union``, computed once per union (kept in its ``memo``); raises as it does."""
    cached = union.memo.get("joint_diagonal", False)
    if cached is False:
        cached = union.memo["joint_diagonal"] = joint_diagonal(union)
    return cached


def joint_diagonal(union: KronUnion) -> JointDiagonal | None:
    """The joint diagonalisation of a union strategy's factor Grams (module docstring), or ``None``.

    ``None`` when on some attribute the Grams do not diagonalise together. The all-ones direction
    (a workload's total on the attribute) is diagonalised with them when it fits. Raises
    :class:`~hdmm.matrix.DenseLimitError` for an attribute too large to diagonalise densely.
    """
    transforms, diagonals = [], []
    for fs in union.factors:
        found = _attribute_diagonal(fs)
        if found is None:
            return None
        transforms.append(found[0])
        diagonals.append(np.array(found[1]))
    return JointDiagonal(transforms, diagonals, union)


def _attribute_diagonal(factors: list[Matrix]) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """One attribute's ``T`` and Gram diagonals (the all-ones direction with them when it fits), or ``None``."""
    grams = [_dense_gram(f) for f in factors]
    n = grams[0].shape[0]
    found = _together(grams + [np.ones((n, n))])
    found = None if found is None else (found[0], found[1][:-1])
    return found or _together(grams)


def factors_diagonalise(factors: list[Matrix]) -> bool:
    """Whether one attribute's strategy factors have Grams that diagonalise together (densely affordable).

    :func:`joint_diagonal` of a union is not ``None`` exactly when this holds for every attribute's
    distinct factors. Monotone: a list that fails (or has a factor too large to diagonalise densely)
    keeps failing as factors are added, since a congruence diagonalising all the Grams diagonalises
    any of them.
    """
    try:
        return _attribute_diagonal(list(factors)) is not None
    except DenseLimitError:
        return False


@dataclass
class TermGrid:
    r"""One workload term's variances as a contraction: ``weight * sum_k prod_i S_i[r_i, k_i] core[k]``.

    ``squares[i]`` is :math:`(F_i T_i)^{\circ 2}` on the columns ``cols[i]`` where the term has mass;
    ``inverse`` is :math:`1/\delta` on that grid (0 where :math:`\delta = 0`) and ``null`` marks the
    grid points where :math:`\delta = 0` (``None`` when there are none).
    """

    weight: float
    squares: list[np.ndarray]
    cols: list[np.ndarray]
    inverse: np.ndarray
    null: np.ndarray | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s.shape[0] for s in self.squares)

    def total(self) -> tuple[float, bool]:
        """The sum of the term's variances at unit noise and whether every query is supported."""
        sums = [s.sum(axis=0) for s in self.squares]
        value = self.weight * float(_contract_vectors(self.inverse, sums))
        if self.null is None:
            return value, True
        return value, not _any_unsupported(self)


def _contract_vectors(core: np.ndarray, vectors: list[np.ndarray]) -> np.ndarray:
    out = core
    for v in vectors:
        out = np.tensordot(v, out, axes=(0, 0))
    return out


def _any_unsupported(term: TermGrid) -> bool:
    """Whether some query of the term has more than ``SUPPORT_TOL`` of its mass where :math:`\\delta = 0`."""
    rows = math.prod(term.shape)
    if rows > GRID_LIMIT:
        raise DenseLimitError(f"checking the support of {rows:,} queries one by one needs a smaller workload term")
    bad = contract(term.null.astype(float), term.squares)
    mass = contract(np.ones(term.null.shape), term.squares)
    return bool(np.any(bad > SUPPORT_TOL * mass))


def contract(core: np.ndarray, matrices: list[np.ndarray]) -> np.ndarray:
    """``out[r] = sum_k prod_i matrices[i][r_i, k_i] core[k]``, axis by axis (smallest growth first)."""
    out = core
    order = sorted(range(len(matrices)), key=lambda i: matrices[i].shape[0] / max(matrices[i].shape[1], 1))
    for i in order:
        out = np.moveaxis(np.tensordot(matrices[i], out, axes=(1, i)), 0, i)
    return out


def _squares(f: Matrix, T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r""":math:`(fT)^{\circ 2}` on the columns where it has mass, and those columns."""
    m, n = f.shape
    if m * n > FACTOR_DENSE_LIMIT:
        raise DenseLimitError(f"a workload factor of {m:,} x {n:,} is too large for the exact union variances")
    B = np.asarray(f @ T) ** 2
    mass = B.max(axis=0)
    keep = np.flatnonzero(mass > _MASS_RTOL * mass.max(initial=0.0))
    return B[:, keep], keep


def term_grid(diagonal: JointDiagonal, weight: float, factors: list[Matrix],
              squares: list[tuple[np.ndarray, np.ndarray]] | None = None) -> TermGrid:
    """The contraction of one workload term ``weight * (x)_i factors[i]`` (raises if its grid is too large).

    ``squares``: the factors' :func:`_squares`, when computed already.
    """
    if squares is None:
        squares = [_squares(f, T) for T, f in zip(diagonal.transforms, factors)]
    cols = [keep for _, keep in squares]
    squares = [S for S, _ in squares]
    size = math.prod(len(c) for c in cols)
    if size > GRID_LIMIT:
        raise DenseLimitError(f"a workload term needs a grid of {size:,} strategy eigenvalues, above GRID_LIMIT")
    delta = diagonal.delta(cols)
    zero = delta == 0
    inverse = np.divide(1.0, delta, out=np.zeros_like(delta), where=~zero)
    return TermGrid(float(weight) ** 2, squares, cols, inverse, zero if zero.any() else None)


def term_variances(term: TermGrid) -> np.ndarray:
    """Every query's variance at unit noise (``inf`` where unsupported), flattened in C order."""
    values = term.weight * contract(term.inverse, term.squares).ravel()
    if term.null is None:
        return values
    bad = contract(term.null.astype(float), term.squares).ravel()
    mass = contract(np.ones(term.null.shape), term.squares).ravel()
    return np.where(bad > SUPPORT_TOL * mass, np.inf, values)


def _lined_up(W: Matrix, a_union: KronUnion | None) -> tuple[KronUnion, JointDiagonal] | None:
    """The workload's union and the strategy's joint diagonalisation on common attributes, or ``None``."""
    if a_union is None:
        return None
    pair = aligned_pair(W, a_union)
    if pair is None:
        return None
    w_union, a_union = pair
    diagonal = cached_joint_diagonal(a_union)
    return None if diagonal is None else (w_union, diagonal)


def _term_squares(w_union: KronUnion, diagonal: JointDiagonal) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Per workload term, its factors' :meth:`JointDiagonal.squares`."""
    per_factor = [[diagonal.squares(i, f) for f in fs] for i, fs in enumerate(w_union.factors)]
    return [[per_factor[i][k] for i, k in enumerate(w_union.index[j])] for j in range(w_union.num_terms)]


def union_route(W: Matrix, a_union: KronUnion | None) -> bool:
    """Whether :func:`union_terms` gives the workload's terms under ``a_union`` (no error raised), without
    forming the grids: the two line up, the strategy's Grams diagonalise together and every term's grid
    fits in ``GRID_LIMIT``."""
    try:
        found = _lined_up(W, a_union)
        if found is None:
            return False
        terms = _term_squares(*found)
    except DenseLimitError:
        return False
    return all(math.prod(len(keep) for _, keep in squares) <= GRID_LIMIT for squares in terms)


def union_totals(W: Matrix, a_union: KronUnion | None,
                 stop_above: float | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """Per workload term of ``W``, :meth:`TermGrid.total` under the union strategy ``a_union``: the sums of its
    queries' variances at unit noise and whether all are supported; ``None`` as :func:`union_terms`.

    With ``stop_above``, the terms are taken largest grid first (the costliest, and on marginal-like
    workloads those of most error) and the search stops once the sum so far exceeds it (an unsupported
    term counting as infinite): every term's sum is non-negative, so the total is above it too. The
    terms not reached are ``nan``. Each term's sum is kept with the strategy's joint diagonalisation, so
    a later call (the full error after a partial one) does not compute it again. Raises
    :class:`~hdmm.matrix.DenseLimitError` as :func:`union_terms`.
    """
    found = _lined_up(W, a_union)
    if found is None:
        return None
    w_union, diagonal = found
    terms = _term_squares(w_union, diagonal)
    for squares in terms:
        size = math.prod(len(keep) for _, keep in squares)
        if size > GRID_LIMIT:
            raise DenseLimitError(f"a workload term needs a grid of {size:,} strategy eigenvalues, above GRID_LIMIT")
    values = np.full(len(terms), np.nan)
    supported = np.ones(len(terms), dtype=bool)
    order = range(len(terms))
    if stop_above is not None:
        order = sorted(order, key=lambda j: -math.prod(len(keep) for _, keep in terms[j]))
    done = 0.0
    for j in order:
        values[j], supported[j] = diagonal.term_total(w_union.weights[j], w_union.term(j)[1], terms[j])
        done += values[j] if supported[j] else math.inf
        if stop_above is not None and done > stop_above:
            break
    return values, supported


def union_terms(W: Matrix, a_union: KronUnion | None) -> list[TermGrid] | None:
    """Every workload term of ``W`` as a :class:`TermGrid` under the union strategy ``a_union``, or ``None``.

    ``None`` when the two cannot be lined up attribute by attribute or the strategy's Grams do not
    diagonalise together; :class:`~hdmm.matrix.DenseLimitError` when a factor or a term's grid is
    too large (then only bounds are cheap).
    """
    found = _lined_up(W, a_union)
    if found is None:
        return None
    w_union, diagonal = found
    return [term_grid(diagonal, w_union.weights[j], w_union.term(j)[1], squares)
            for j, squares in enumerate(_term_squares(w_union, diagonal))]
