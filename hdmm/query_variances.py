r"""Per-query variances at any size: the largest, per union term, and streamed in blocks (docs/math.md, sections 2.8 and 2.9).

:func:`hdmm.error.per_query_variance` returns one number per query, which a workload of 1e9
queries cannot hold. The variances of a workload term :math:`c \bigotimes_i F_i` keep the term's
Kronecker structure, so they are summarised and streamed from the factors:

* **Kronecker strategy** :math:`a \bigotimes_i A_i`: the term's variances are the outer product
  :math:`(c/a)^2 \bigotimes_i v_i` of :math:`v_i = \mathrm{diag}(F_i X_i^+ F_i^T)`, non-negative
  vectors, so the largest is :math:`(c/a)^2 \prod_i \max v_i` (at the query made of each
  factor's largest row) and the mean :math:`(c/a)^2 \prod_i \mathrm{mean}\, v_i`.
* **Marginals strategy**: a sum over subsets of such outer products (the mean factors; the largest
  is found by streaming).
* **Union strategy** whose Grams diagonalise together (:mod:`hdmm.union_gram`): a contraction of
  a small grid of eigenvalues with per-attribute matrices; the mean is one contraction with vectors.
* **Residual strategy with per-attribute bases** (:mod:`hdmm.residual_bases`): its closed form for
  every query at once (up to ``FLAT_LIMIT`` queries), summarised per term.
* **Any other union strategy** too large for a dense pseudo-inverse: per query, the smallest of
  the variances each strategy term alone gives (an upper bound by Gauss-Markov, as
  :func:`hdmm.planning.union_variance_bound`), flagged ``exact=False``.

Blocks of rows (:func:`query_variance_blocks`) are cut along the term's leading attributes, so
memory stays within ``block_rows`` numbers whatever the workload's size.

>>> import hdmm
>>> from hdmm.matrix import Kronecker
>>> from hdmm.query_variances import variance_summary
>>> W = Kronecker([hdmm.Prefix(1024)] * 3)                 # 1.07e9 queries
>>> s = variance_summary(W, hdmm.Identity(1024 ** 3), hdmm.ZCDP(0.5))
>>> s.max, s.argmax == W.shape[0] - 1, s.exact               # the query summing every cell
(1073741824.0, True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from .error import unit_query_variances
from .kron_union import FactorMismatchError, KronUnion, aligned_pair, kron_union
from .marginals import trace_spectrum
from .matrix import DENSE_LIMIT, DenseLimitError, Matrix
from .privacy import Privacy
from .structure import ZERO_RTOL, Structure, aligned_unions, classify
from .threads import one_blas_thread
from .traces import factor_rows, row_projections
from .union_gram import TermGrid, joint_diagonal, term_grid, term_variances

__all__ = ["BLOCK_ROWS", "FLAT_LIMIT", "TermVariances", "VarianceSummary", "variance_summary", "query_variance_blocks"]

#: Default number of variances a block holds (8 MiB of floats).
BLOCK_ROWS = 2**20

#: Most queries whose variances are computed at once where no factored form is kept (a residual strategy's
#: closed form): 1 GiB of floats.
FLAT_LIMIT = 2**27


# ====================================================================== one term's variances, factored
class _Outer:
    """``sum_s coef_s (x)_i vectors_s[i]`` (variances), and ``bad`` summands whose positive values mark unsupported queries."""

    def __init__(self, shape: tuple[int, ...], parts: list, bad: list):
        self.shape, self.parts, self.bad = shape, parts, bad

    def fix(self, r: int) -> _Outer:
        return _Outer(self.shape[1:], [(c * v[0][r], v[1:]) for c, v in self.parts],
                      [(c * v[0][r], v[1:]) for c, v in self.bad])

    def rows(self, a: int, b: int) -> _Outer:
        return _Outer((b - a,) + self.shape[1:], [(c, [v[0][a:b]] + v[1:]) for c, v in self.parts],
                      [(c, [v[0][a:b]] + v[1:]) for c, v in self.bad])

    @staticmethod
    def _value(parts: list, shape: tuple[int, ...]) -> np.ndarray:
        out = np.zeros(shape)
        for c, vectors in parts:
            part = np.array(c)
            for v in vectors:
                part = np.multiply.outer(part, v)
            out += part
        return out

    def dense(self) -> np.ndarray:
        values = self._value(self.parts, self.shape)
        return np.where(self._value(self.bad, self.shape) > 0, np.inf, values) if self.bad else values

    def leading(self, step: int) -> Iterator[np.ndarray]:
        """The values in runs of ``step`` leading indices, each summand's trailing outer product formed once."""
        def tails(parts: list) -> list:
            return [(c, v[0], self._value([(1.0, v[1:])], self.shape[1:])) for c, v in parts]

        parts, bad = tails(self.parts), tails(self.bad)
        for a in range(0, self.shape[0], step):
            b = min(a + step, self.shape[0])
            values = sum(np.multiply.outer(c * v[a:b], tail) for c, v, tail in parts)
            if bad:
                flags = sum(np.multiply.outer(c * v[a:b], tail) for c, v, tail in bad)
                values = np.where(flags > 0, np.inf, values)
            yield np.asarray(values).ravel()

    def _any_bad(self) -> bool:
        return bool(self.bad) and math.fsum(c * math.prod(float(np.sum(v)) for v in vs) for c, vs in self.bad) > 0

    def total(self) -> float | None:
        if self._any_bad():
            return math.inf
        return math.fsum(c * math.prod(float(np.sum(v)) for v in vs) for c, vs in self.parts)

    def largest(self) -> tuple[float, int] | None:
        """The largest value and its flat index, when one non-negative outer product gives them."""
        if len(self.parts) != 1 or self._any_bad():
            return None
        c, vectors = self.parts[0]
        if c < 0 or any(np.any(v < 0) for v in vectors):
            return None
        at = [int(np.argmax(v)) for v in vectors]
        return c * math.prod(float(v[k]) for v, k in zip(vectors, at)), _ravel(at, self.shape)


class _Grid:
    """A :class:`~hdmm.union_gram.TermGrid` restricted by fixing leading rows."""

    def __init__(self, grid: TermGrid):
        self.grid = grid
        self.shape = grid.shape

    def _with(self, squares: list[np.ndarray], inverse: np.ndarray, null: np.ndarray | None) -> _Grid:
        g = self.grid
        return _Grid(TermGrid(g.weight, squares, g.cols[len(g.squares) - len(squares):], inverse, null))

    def fix(self, r: int) -> _Grid:
        g = self.grid
        if g.null is not None:  # the support check needs each query's mass on the whole grid
            return _GridWithNull(g, [r])
        return self._with(g.squares[1:], np.tensordot(g.squares[0][r], g.inverse, axes=(0, 0)), None)

    def rows(self, a: int, b: int) -> _Grid:
        g = self.grid
        return _Grid(TermGrid(g.weight, [g.squares[0][a:b]] + g.squares[1:], g.cols, g.inverse, g.null))

    def dense(self) -> np.ndarray:
        return term_variances(self.grid).reshape(self.shape)

    def total(self) -> float | None:
        value, supported = self.grid.total()
        return value if supported else math.inf

    def largest(self) -> None:
        return None


class _GridWithNull(_Grid):
    """A grid term with unsupported points and leading rows fixed (``fixed``): evaluated from the whole grid."""

    def __init__(self, grid: TermGrid, fixed: list[int]):
        self.grid, self.fixed = grid, fixed
        self.shape = grid.shape[len(fixed):]

    def fix(self, r: int) -> _GridWithNull:
        return _GridWithNull(self.grid, self.fixed + [r])

    def rows(self, a: int, b: int) -> _GridWithNull:
        return _RowsWithNull(self.grid, self.fixed, a, b)

    def dense(self) -> np.ndarray:
        g, k = self.grid, len(self.fixed)
        squares = [S[r:r + 1] for S, r in zip(g.squares[:k], self.fixed)] + g.squares[k:]
        return term_variances(TermGrid(g.weight, squares, g.cols, g.inverse, g.null)).reshape(self.shape)


class _RowsWithNull(_GridWithNull):
    def __init__(self, grid: TermGrid, fixed: list[int], a: int, b: int):
        super().__init__(grid, fixed)
        self.a, self.b = a, b
        self.shape = (b - a,) + self.shape[1:]

    def dense(self) -> np.ndarray:
        g, k = self.grid, len(self.fixed)
        squares = ([S[r:r + 1] for S, r in zip(g.squares[:k], self.fixed)] + [g.squares[k][self.a:self.b]]
                   + g.squares[k + 1:])
        return term_variances(TermGrid(g.weight, squares, g.cols, g.inverse, g.null)).reshape(self.shape)


class _Smallest:
    """Per query, the smallest of several factored terms' values (an upper bound on the variance)."""

    def __init__(self, shape: tuple[int, ...], children: list):
        self.shape, self.children = shape, children

    def fix(self, r: int) -> _Smallest:
        return _Smallest(self.shape[1:], [c.fix(r) for c in self.children])

    def rows(self, a: int, b: int) -> _Smallest:
        return _Smallest((b - a,) + self.shape[1:], [c.rows(a, b) for c in self.children])

    def dense(self) -> np.ndarray:
        out = np.full(self.shape, np.inf)
        for c in self.children:
            out = np.minimum(out, c.dense())
        return out

    def total(self) -> None:
        return None

    def largest(self) -> tuple[float, int] | None:
        return self.children[0].largest() if len(self.children) == 1 else None


class _Flat:
    """Variances already computed (a dense route on a small domain)."""

    def __init__(self, values: np.ndarray):
        self.values, self.shape = values, values.shape

    def rows(self, a: int, b: int) -> _Flat:
        return _Flat(self.values[a:b])

    def fix(self, r: int) -> _Flat:
        return _Flat(self.values[r])

    def dense(self) -> np.ndarray:
        return self.values

    def total(self) -> float:
        return float(np.sum(self.values))

    def largest(self) -> tuple[float, int]:
        k = int(np.argmax(self.values))
        return float(self.values[k]), k


def _ravel(index: list[int], shape: tuple[int, ...]) -> int:
    """C-order flat index in Python integers (a term may have more than 2^63 queries)."""
    flat = 0
    for k, m in zip(index, shape):
        flat = flat * int(m) + int(k)
    return flat


def _blocks(term, limit: int) -> Iterator[np.ndarray]:
    """The term's values in C order, in pieces of at most ``limit`` numbers (one when the term has fewer)."""
    shape = term.shape
    if math.prod(shape) <= limit:
        yield np.asarray(term.dense()).ravel()
        return
    inner = math.prod(shape[1:])
    if inner <= limit:
        step = max(1, limit // inner)
        if isinstance(term, _Outer):
            yield from term.leading(step)
            return
        for a in range(0, shape[0], step):
            yield np.asarray(term.rows(a, min(a + step, shape[0])).dense()).ravel()
        return
    for r in range(shape[0]):
        yield from _blocks(term.fix(r), limit)


# ====================================================================== building the terms
def _kronecker_terms(w_union: KronUnion, a_union: KronUnion) -> list[_Outer]:
    weight, factors = a_union.term(0)
    rows = [[factor_rows(factors[i], f) for f in fs] for i, fs in enumerate(w_union.factors)]
    out = []
    for j in range(w_union.num_terms):
        parts = [rows[i][k] for i, k in enumerate(w_union.index[j])]
        shape = tuple(d.size for d, _, _ in parts)
        c = float(w_union.weights[j])
        nonzero = [nz.astype(float) for _, _, nz in parts]
        good = [(nz & ~b).astype(float) for _, b, nz in parts]
        if weight == 0:  # a zero strategy measures nothing
            out.append(_Outer(shape, [(0.0, [np.zeros(s) for s in shape])], [(1.0 if c else 0.0, nonzero)]))
            continue
        bad = [(1.0, nonzero), (-1.0, good)] if c and any(b.any() for _, b, _ in parts) else []
        out.append(_Outer(shape, [((c / weight) ** 2, [d for d, _, _ in parts])], bad))
    return out


def _projections(f: Matrix) -> tuple[np.ndarray, np.ndarray]:
    n = f.shape[1]
    p, q = row_projections(f)
    q = np.where(q <= ZERO_RTOL * (p + q), 0.0, q)
    return p / n, q / n


def _marginals_terms(w_union: KronUnion, a_union: KronUnion) -> list[_Outer]:
    lam = trace_spectrum(a_union).eigenvalues
    lam = np.where(lam > ZERO_RTOL * lam.max(initial=0.0), lam, 0.0)
    spectrum, (term_ids, position, _) = trace_spectrum(w_union, with_terms=True)
    lam_w = trace_spectrum(a_union).lookup(spectrum.keys, lam)
    proj = [[_projections(f) for f in fs] for fs in w_union.factors]
    out = []
    for j in range(w_union.num_terms):
        c2 = float(w_union.weights[j]) ** 2
        shape = tuple(proj[i][k][0].size for i, k in enumerate(w_union.index[j]))
        parts, bad = [], []
        for pos in np.unique(position[term_ids == j]):
            members = spectrum.members[pos]
            vectors = [proj[i][k][1 if members[i] else 0] for i, k in enumerate(w_union.index[j])]
            (parts if lam_w[pos] > 0 else bad).append((c2 / lam_w[pos] if lam_w[pos] > 0 else 1.0, vectors))
        out.append(_Outer(shape, parts or [(0.0, [np.zeros(s) for s in shape])], bad))
    return out


def _union_terms(W: Matrix, a_union: KronUnion) -> tuple[list, list[bool]] | None:
    """Exact grids where :mod:`hdmm.union_gram` applies and they fit, else the per-group bound; ``None`` if neither."""
    pair = aligned_pair(W, a_union)
    if pair is None:
        return None
    w_union, a_union = pair
    try:
        diagonal = joint_diagonal(a_union)
    except DenseLimitError:
        diagonal = None
    alone: list = []  # each strategy term's own variances, made when some workload term needs the bound

    def bound(j: int) -> _Smallest:
        if not alone:
            alone.extend(_kronecker_terms(w_union, KronUnion.term_of(a_union.term(g)[1], a_union.weights[g]))
                         for g in range(a_union.num_terms))
        return _Smallest(alone[0][j].shape, [a[j] for a in alone])

    terms, exact = [], []
    for j in range(w_union.num_terms):
        grid = None
        if diagonal is not None:
            try:
                grid = _Grid(term_grid(diagonal, *w_union.term(j)))
            except DenseLimitError:
                grid = None
        terms.append(grid if grid is not None else bound(j))
        exact.append(grid is not None)
    return terms, exact


def _flat_terms(W: Matrix, values: np.ndarray) -> tuple[list, list[bool]]:
    """Exact variances computed at once, split by the workload's union terms."""
    try:
        cuts = np.cumsum(kron_union(W).term_rows().astype(np.int64))[:-1]
    except FactorMismatchError:
        cuts = []
    parts = np.split(values, cuts)
    return [_Flat(v) for v in parts], [True] * len(parts)


def _factored(W: Matrix, A: Matrix, structure: Structure) -> tuple[list, list[bool]]:
    """Each workload term's unit variances, factored, and whether each is exact (else an upper bound)."""
    route, w_union, a_union = aligned_unions(W, structure)
    if route == "kronecker":
        terms = _kronecker_terms(w_union, a_union)
        return terms, [True] * len(terms)
    if route == "marginals":
        terms = _marginals_terms(w_union, a_union)
        return terms, [True] * len(terms)
    if route == "residual":  # closed form for every query at once (hdmm.residual_bases)
        if W.shape[0] > FLAT_LIMIT:
            raise DenseLimitError(
                f"the variances of a residual strategy are computed for all {W.shape[0]:,} queries at once, above "
                f"FLAT_LIMIT ({FLAT_LIMIT:,}): summarise a smaller workload, or its union terms one at a time")
        return _flat_terms(W, unit_query_variances(W, A, structure))
    found = None if structure.union is None else _union_terms(W, structure.union)
    if found is not None and all(found[1]):
        return found
    if A.shape[1] ** 2 <= DENSE_LIMIT and W.shape[0] <= DENSE_LIMIT:  # exact on a small domain
        return _flat_terms(W, unit_query_variances(W, A, structure))
    if found is not None:
        return found
    raise DenseLimitError(
        f"no structured route gives the variances of {A!r} on {A.shape[1]:,} cells: use a Kronecker, marginals or "
        "union-of-Kronecker strategy"
    )


# ====================================================================== public functions
@dataclass(frozen=True)
class TermVariances:
    """The variances of one Kronecker term of the workload (in :func:`hdmm.kron_union.kron_union` order).

    Attributes
    ----------
    term : int
        The term's index; its queries are rows ``first_row`` to ``first_row + queries - 1`` of ``W``.
    label : str
        The label of the term's first query (``W.labels[first_row]``).
    first_row, queries : int
    max : float
        The largest variance of the term's queries (``inf`` if some query is not supported).
    argmax : int
        The row of ``W`` with the largest variance.
    mean : float
        The mean variance of the term's queries.
    exact : bool
        False when ``max`` and ``mean`` are upper bounds (a union strategy whose variances only
        bound; module docstring).
    """

    term: int
    label: str
    first_row: int
    queries: int
    max: float
    argmax: int
    mean: float
    exact: bool


@dataclass(frozen=True)
class VarianceSummary:
    """The largest and mean per-query variance of a workload, with one :class:`TermVariances` per term.

    ``max`` is reached by row ``argmax`` of ``W`` (``label`` is its label); ``mean`` is the
    total squared error over the number of queries, so ``sqrt(mean)`` is the RMSE.
    """

    max: float
    argmax: int
    label: str
    mean: float
    queries: int
    exact: bool
    privacy: Privacy
    terms: list[TermVariances] = field(repr=False)

    @property
    def rmse(self) -> float:
        """``sqrt(mean)``: the expected RMSE per query."""
        return math.sqrt(self.mean)

    def table(self):
        """The terms as a :class:`pandas.DataFrame` (one row per term)."""
        import pandas as pd

        return pd.DataFrame([t.__dict__ for t in self.terms])


def _prepare(W: Matrix, A: Matrix, privacy: Privacy, structure: Structure | None,
             sensitivity: float | None) -> tuple[list, list[bool], list[int], float]:
    if not isinstance(W, Matrix) or not isinstance(A, Matrix):
        raise TypeError("W and A must be hdmm matrices (see hdmm.matrix and hdmm.workload)")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    if W.shape[1] != A.shape[1]:
        raise ValueError(f"the workload has {W.shape[1]:,} columns but the strategy has {A.shape[1]:,}: "
                         "they must be over the same domain")
    structure = classify(A) if structure is None else structure
    scale = privacy.noise_variance(privacy.noise.sensitivity(A) if sensitivity is None else float(sensitivity))
    terms, exact = _factored(W, A, structure)
    offsets = [0]
    for t in terms:
        offsets.append(offsets[-1] + math.prod(t.shape))
    return terms, exact, offsets, scale


def _check_block_rows(block_rows: int) -> int:
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows < 1:
        raise ValueError(f"block_rows must be a positive integer, got {block_rows!r}")
    return int(block_rows)


def query_variance_blocks(W: Matrix, A: Matrix, privacy: Privacy, *, block_rows: int = BLOCK_ROWS,
                          structure: Structure | None = None,
                          sensitivity: float | None = None) -> Iterator[tuple[int, np.ndarray]]:
    r"""Every query's variance, in ``W``'s row order, as ``(first row, variances)`` blocks of at most ``block_rows``.

    The values are those of :func:`hdmm.error.per_query_variance` (``inf`` for an unsupported
    query), computed block by block from the factors, so memory stays bounded for a workload of
    any size. Where no exact route applies (a union strategy whose Grams do not diagonalise
    together, on a large domain) the blocks hold upper bounds: check
    :func:`variance_summary`'s ``exact``. ``structure`` and ``sensitivity`` as in
    :func:`hdmm.error.expected_error`.

    >>> import hdmm
    >>> from hdmm.matrix import Kronecker
    >>> W = Kronecker([hdmm.Prefix(4), hdmm.Identity(3)])
    >>> [(start, v.size) for start, v in query_variance_blocks(W, hdmm.Identity(12), hdmm.ZCDP(0.5), block_rows=5)]
    [(0, 3), (3, 3), (6, 3), (9, 3)]
    """
    limit = _check_block_rows(block_rows)
    terms, _, offsets, scale = _prepare(W, A, privacy, structure, sensitivity)
    for term, start in zip(terms, offsets):
        at = start
        for values in _blocks(term, limit):
            yield at, np.where(np.isfinite(values), scale * values, np.inf)
            at += values.size


@one_blas_thread
def variance_summary(W: Matrix, A: Matrix, privacy: Privacy, *, structure: Structure | None = None,
                     sensitivity: float | None = None, block_rows: int = BLOCK_ROWS) -> VarianceSummary:
    r"""The largest and mean variance of ``W``'s answers under ``A``, overall and per union term.

    From the factors without streaming where a closed form gives them (a Kronecker strategy: the
    product of the per-attribute maxima and means); otherwise the term's queries are streamed
    in blocks of ``block_rows`` (:func:`query_variance_blocks`), in bounded memory. Runs with one
    BLAS thread (:func:`hdmm.threads.one_blas_thread`).

    >>> import hdmm
    >>> from hdmm.matrix import Kronecker, Ones
    >>> W = hdmm.union([Kronecker([hdmm.Prefix(4), Ones(1, 3)]), Kronecker([Ones(1, 4), hdmm.Identity(3)])])
    >>> s = variance_summary(W, hdmm.Identity(12), hdmm.PureDP(1.0))
    >>> s.max, s.argmax, [(t.max, t.mean) for t in s.terms]
    (24.0, 3, [(24.0, 15.0), (8.0, 8.0)])
    """
    limit = _check_block_rows(block_rows)
    terms, exact, offsets, scale = _prepare(W, A, privacy, structure, sensitivity)
    out = []
    for j, (term, start) in enumerate(zip(terms, offsets)):
        count = offsets[j + 1] - start
        largest, total = term.largest(), term.total()
        if largest is None or total is None:
            best, at, streamed, position = -math.inf, 0, 0.0, 0
            for values in _blocks(term, limit):
                k = int(np.argmax(values)) if values.size else 0
                if values.size and values[k] > best:
                    best, at = float(values[k]), position + k
                streamed += float(np.sum(values))
                position += values.size
            largest = largest or (best, at)
            total = streamed if total is None else total
        value = largest[0] * scale if math.isfinite(largest[0]) else math.inf
        mean = total * scale / count if math.isfinite(total) else math.inf
        out.append(TermVariances(j, W.labels[start] if count else "", start, count, value, start + largest[1],
                                 mean, exact[j]))
    top = max(out, key=lambda t: t.max)
    mean = math.fsum(t.mean * t.queries for t in out) / offsets[-1]
    return VarianceSummary(top.max, top.argmax, W.labels[top.argmax], mean, offsets[-1], all(exact), privacy, out)
