r"""Controlled rounding: integer tables near real ones that keep their totals (docs/math.md, section 8.8).

A family is ``k`` children x ``m`` cells of non-negative reals ``X`` whose columns add up to the
parent's integer cells ``c``; :func:`controlled_round` returns an integer ``R`` with every
:math:`R_{ij} \in \{\lfloor X_{ij}\rfloor, \lceil X_{ij}\rceil\}` (so 0 where ``X`` is 0 and
:math:`|R - X| < 1`), column sums exactly ``c``, and row sums exactly the children's held totals
``r`` (given) or in :math:`\{\lfloor s_i\rfloor, \lceil s_i\rceil\}` of ``X``'s row sums ``s``.

**Why it exists.** Put ``X`` on a network: a source feeds each cell ``j`` exactly :math:`c_j`, cell
``j`` sends :math:`X_{ij}` to child ``i`` (bounds :math:`[\lfloor X_{ij}\rfloor, \lceil X_{ij}\rceil]`),
child ``i`` sends its row sum to the sink (bounds :math:`[r_i, r_i]` or :math:`[\lfloor s_i\rfloor,
\lceil s_i\rceil]`), the sink returns everything to the source. ``X`` is a feasible real
circulation, every bound is an integer, so an integer feasible circulation exists (integrality of
flows), and any such one is the rounding.

**How it is found** (:func:`integer_flow`, for any such network): start from every edge's nearest
integer within its bounds, measure each node's imbalance, and route the imbalances through the
residual network (an edge may move up to its upper bound, down to its lower bound) with one call of
scipy's compiled maximum flow (Dinic), from a super source feeding the surplus nodes to a super sink
draining the deficits. Because ``X - round(X)`` routes them fractionally, an integer routing exists
and the maximum flow saturates. **Cost awareness:** moving ``R_ij`` by one changes
:math:`\sum|R - X|` by :math:`|X_{ij} - R_{ij} \mp 1| - |X_{ij} - R_{ij}|`; stage ``s`` routes what it
can over the moves costing at most ``STAGES[s]`` and keeps it (from any ``R`` within the bounds the
argument above still holds), the last stage over every move, so it always succeeds. Nothing more is
guaranteed about :math:`\sum|R-X|` than :math:`|R - X| < 1` entrywise; measured, it is at the
exhaustive-search optimum on most small tables (tests) and about 1% above the linear program's optimum
on block-group families (benchmarks/results/rounding.md).

**Tolerance.** Solvers give ``X`` whose column sums meet the integer ``c`` only to rounding. An
entry within ``ROUND_RTOL * max(1, x)`` of an integer is taken as that integer, and a total (column
sum against ``c``, row sum against held ``r``) may miss by ``ROUND_RTOL * max(1, |target|)``, and
the misses of one family by less than ``MAX_FAMILY_MISS`` in all: the cut conditions of the
integer network then hold (both sides are integers and differ from the real ones by less than 1).
More is refused, as are negative or non-finite entries and totals that are not whole numbers.

**Batches.** :func:`round_families` rounds many families with one graph (families are disjoint
components of it) and yields their tables in order, so a caller can stream them; only the positive
entries of ``X`` enter the graph (pass the parent's non-zero cells only, see :func:`compact`).

>>> X = np.array([[0.5, 1.5], [0.5, 0.5]])
>>> controlled_round(X, np.array([1, 2])).tolist() in ([[1, 1], [0, 1]], [[0, 2], [1, 0]], [[1, 2], [0, 0]],
...                                                 [[0, 1], [1, 1]])
True
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import maximum_flow

__all__ = ["controlled_round", "round_families", "round_below", "round_vector", "compact", "integer_flow",
           "RoundingError", "ROUND_RTOL", "MAX_FAMILY_MISS", "STAGES", "BATCH_ENTRIES", "snap"]

#: Relative tolerance of an entry's distance to an integer and of a total's miss (module docstring).
ROUND_RTOL = 1e-9

#: Largest summed miss of one family's totals (below 1, the integer network stays feasible).
MAX_FAMILY_MISS = 0.5

#: Largest cost of a move (the change of |R_ij - X_ij|) allowed in each stage of :func:`integer_flow`.
STAGES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

#: Positive entries per graph in :func:`round_families`: 2**18 (about 100 block groups; smaller graphs were
#: faster than 2**20 or 2**22 per family, measured in benchmarks/rounding.py).
BATCH_ENTRIES = 2**18


class RoundingError(ValueError):
    """Input that cannot be rounded: negative or non-finite entries, totals that are not whole numbers,
    or totals the real table does not meet."""


def snap(X: np.ndarray) -> np.ndarray:
    """``X`` with entries within ``ROUND_RTOL * max(1, x)`` of an integer set to it."""
    X = np.asarray(X, dtype=float)
    near = np.rint(X)
    return np.where(np.abs(X - near) <= ROUND_RTOL * np.maximum(1.0, np.abs(X)), near, X)


def _whole(values, what: str) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v != np.rint(v)):
        bad = v[~(np.isfinite(v) & (v >= 0) & (v == np.rint(v)))][:3].tolist()
        raise RoundingError(f"{what} must be whole numbers >= 0 (got {bad}); round or fix them before rounding")
    return v.astype(np.int64)


def _entries(X) -> np.ndarray:
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise RoundingError(f"a family is a 2-d table (children x cells), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise RoundingError("the table has non-finite entries (NaN or inf); round finite estimates only")
    if np.any(X < 0):
        raise RoundingError(f"the table has negative entries (the least {X.min():g}); round non-negative "
                            "estimates (hdmm.georelease.nonneg)")
    return snap(X)


def _misses(actual: np.ndarray, target: np.ndarray, what: str) -> float:
    miss = np.abs(actual - target)
    allowed = ROUND_RTOL * np.maximum(1.0, np.abs(target))
    if np.any(miss > allowed):
        i = int(np.argmax(miss - allowed))
        raise RoundingError(f"{what} {i} of the table adds up to {float(actual[i])!r}, not to its total "
                            f"{float(target[i])!r} "
                            f"(allowed miss {allowed[i]:.3g}); make the table meet its totals before rounding")
    return float(miss.sum())


def compact(X: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The parent's non-zero cells ``idx`` and the children's table on them ``X[:, idx]``.

    The children's cells outside ``idx`` must be 0 (to the tolerance): they round to 0.

    >>> compact(np.array([[0.0, 1.5, 0.0], [0.0, 0.5, 2.0]]), np.array([0, 2, 2]))[0].tolist()
    [1, 2]
    """
    parent = np.asarray(parent)
    idx = np.flatnonzero(parent)
    X = np.asarray(X, dtype=float)
    rest = np.delete(X, idx, axis=1)
    if rest.size and np.any(np.abs(rest) > ROUND_RTOL):
        raise RoundingError("the children have cells where their parent has none; the table is not consistent")
    return idx, X[:, idx]


def integer_flow(tail: np.ndarray, head: np.ndarray, value: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 group: np.ndarray, groups: int, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer flows ``y`` (``lo <= y <= hi``, conserved at every node) near ``value``, per group of nodes.

    Edges go ``tail -> head`` between nodes ``0..n-1``; ``group[node]`` is the node's group (edges
    stay within a group, each group a network of its own, closed by a return edge). Starts from
    ``clip(rint(value), lo, hi)``; a move of an edge by one costs ``weight`` times the change of
    ``|value - y|``. Stage ``s`` of ``STAGES`` routes what it can of the imbalances over the moves
    costing at most ``STAGES[s]`` and keeps it (any ``y`` within the bounds can still reach every
    feasible flow), the last over every move. Returns ``y`` and, per group, whether its flow is
    conserved: it is whenever some integer flow within the bounds exists, since the last stage's
    maximum flow then routes every imbalance.
    """
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    value, weight = np.asarray(value, dtype=float), np.asarray(weight, dtype=float)
    y = np.clip(np.rint(value), lo, hi).astype(np.int64)
    n = group.size

    def imbalance():
        return np.rint(np.bincount(head, weights=y, minlength=n) - np.bincount(tail, weights=y, minlength=n)
                       ).astype(np.int64)

    excess = imbalance()
    for stage, bound in enumerate(STAGES):
        pending = np.zeros(groups, dtype=bool)
        np.logical_or.at(pending, group, excess != 0)
        if not pending.any():
            break
        last = stage == len(STAGES) - 1
        now = np.abs(value - y)
        up_ok = last | (weight * (np.abs(value - y - 1) - now) <= bound)
        down_ok = last | (weight * (np.abs(value - y + 1) - now) <= bound)
        keep = pending[group[tail]] & (up_ok | down_ok)
        up = np.where(up_ok, hi - y, 0)[keep]
        down = np.where(down_ok, y - lo, 0)[keep]
        delta = _route(tail[keep], head[keep], up, down, np.where(pending[group], excess, 0))
        y[np.flatnonzero(keep)] += delta
        excess = imbalance()
    done = np.ones(groups, dtype=bool)
    np.logical_and.at(done, group, excess == 0)
    return y, done


def _route(tail, head, up, down, excess) -> np.ndarray:
    """The edges' changes of one maximum flow routing ``excess`` (surplus > 0, deficit < 0) over edges that
    may rise by ``up`` and fall by ``down``."""
    n = excess.size
    src, dst = np.flatnonzero(excess > 0), np.flatnonzero(excess < 0)
    if src.size == 0 or tail.size == 0:
        return np.zeros(tail.size, dtype=np.int64)
    S, T = n, n + 1
    rows = np.concatenate([tail, head, np.full(src.size, S), dst])
    cols = np.concatenate([head, tail, src, np.full(dst.size, T)])
    caps = np.concatenate([up, down, excess[src], -excess[dst]])
    use = caps > 0
    graph = sp.csr_matrix((caps[use].astype(np.int32), (rows[use], cols[use])), shape=(n + 2, n + 2))
    flow = maximum_flow(graph, S, T, method="dinic").flow.tocoo()
    keys = flow.row.astype(np.int64) * (n + 2) + flow.col
    order = np.argsort(keys)
    keys, data = keys[order], flow.data[order]
    want = tail.astype(np.int64) * (n + 2) + head
    where = np.minimum(np.searchsorted(keys, want), max(keys.size - 1, 0))
    hit = keys.size > 0
    return np.where(hit & (keys[where] == want), data[where], 0).astype(np.int64) if hit else \
        np.zeros(tail.size, dtype=np.int64)


class _Graph:
    """Edges of many families' networks, appended family by family (node ids are global)."""

    def __init__(self):
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.nodes = 0
        self.groups: list[np.ndarray] = []

    def family(self, X: np.ndarray, columns: np.ndarray, row_lo: np.ndarray, row_hi: np.ndarray) -> np.ndarray:
        """Add a family (snapped ``X``, integer column totals, row bounds); returns its entry edges' positions."""
        k, m = X.shape
        s, t = self.nodes, self.nodes + 1
        col0, row0 = self.nodes + 2, self.nodes + 2 + m
        i, j = np.nonzero(X > 0)
        x = X[i, j]
        total = int(columns.sum())
        tail = np.concatenate([np.full(m, s), col0 + j, row0 + np.arange(k), [t]])
        head = np.concatenate([col0 + np.arange(m), row0 + i, np.full(k, t), [s]])
        start = np.bincount(i, weights=np.rint(x), minlength=k)  # the rows' sums of their nearest entries
        value = np.concatenate([columns, x, np.clip(start, row_lo, row_hi), [total]])
        lo = np.concatenate([columns, np.floor(x), row_lo, [total]])
        hi = np.concatenate([columns, np.ceil(x), row_hi, [total]])
        weight = np.concatenate([np.zeros(m), np.ones(x.size), np.zeros(k + 1)])
        first = sum(p[0].size for p in self.parts) + m
        self.parts.append((tail, head, value, lo, hi, weight))
        self.groups.append(np.full(2 + m + k, len(self.groups)))
        self.nodes += 2 + m + k
        return np.arange(first, first + x.size), (i, j)

    def solve(self) -> tuple[np.ndarray, np.ndarray]:
        tail, head, value, lo, hi, weight = (np.concatenate(c) for c in zip(*self.parts))
        return integer_flow(tail.astype(np.int64), head.astype(np.int64), value, lo, hi,
                            np.concatenate(self.groups), len(self.groups), weight)


def _bounds(X: np.ndarray, columns, rows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate one family; its integer columns and row bounds."""
    X = _entries(X)
    c = _whole(columns, "the column totals")
    if c.shape != (X.shape[1],):
        raise RoundingError(f"{c.size} column totals for a table of {X.shape[1]} columns")
    miss = _misses(X.sum(axis=0), c.astype(float), "column")
    s = X.sum(axis=1)
    if rows is not None:
        r = _whole(rows, "the row totals")
        if r.shape != (X.shape[0],):
            raise RoundingError(f"{r.size} row totals for a table of {X.shape[0]} rows")
        miss += _misses(s, r.astype(float), "row")
        lo = hi = r
    else:
        near = np.rint(s)
        whole = np.abs(s - near) <= ROUND_RTOL * np.maximum(1.0, s)
        miss += float(np.abs(s - near)[whole].sum())
        lo = np.where(whole, near, np.floor(s)).astype(np.int64)
        hi = np.where(whole, near, np.ceil(s)).astype(np.int64)
    if miss >= MAX_FAMILY_MISS:
        raise RoundingError(f"the family's totals miss by {miss:g} in all (at most {MAX_FAMILY_MISS} can be "
                            "rounded); make the table meet its totals before rounding")
    return X, c, (lo, hi)


def round_families(families: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray | None]],
                   batch_entries: int = BATCH_ENTRIES) -> Iterator[np.ndarray]:
    """:func:`controlled_round` of every ``(X, columns, rows)`` (``rows`` may be ``None``), in order.

    Families are validated and put on one graph until it holds ``batch_entries`` positive entries, then
    rounded together; the tables are yielded as they are made, so ``families`` may be a generator.
    """
    def checked():
        for X, columns, rows in families:
            X, c, (lo, hi) = _bounds(X, columns, rows)
            yield X, c, lo, hi

    for R, failed in _batches(checked(), batch_entries):
        if failed:  # the module docstring's theorem says this cannot happen
            raise ArithmeticError("a family within the tolerance could not be rounded; please report this")
        yield R


def _batches(items, batch_entries: int):
    """``(R, False)`` per ``(X, c, lo, hi)`` rounded (in order), ``(None, True)`` where the bounds admit no rounding."""
    pending, graph, held = [], _Graph(), 0
    for X, c, lo, hi in items:
        pending.append((X, *graph.family(X, c, lo, hi)))
        held += int(np.count_nonzero(X))
        if held >= batch_entries:
            yield from _finish(graph, pending)
            pending, graph, held = [], _Graph(), 0
    if pending:
        yield from _finish(graph, pending)


def _finish(graph: _Graph, pending) -> Iterator[tuple[np.ndarray | None, bool]]:
    y, ok = graph.solve()
    for g, (X, edges, (i, j)) in enumerate(pending):
        if not ok[g]:
            yield None, True
            continue
        R = np.zeros(X.shape, dtype=np.int64)
        R[i, j] = y[edges]
        yield R, False


def round_below(families: Iterable[tuple[np.ndarray, np.ndarray]], batch_entries: int = BATCH_ENTRIES
                ) -> Iterator[tuple[np.ndarray, int]]:
    r"""Children's real cells ``X`` (``k x m``) rounded under their parent's *integer* cells ``P``, per family.

    ``X``'s columns add up to the parent's real cells ``p``, which were rounded to ``P`` (each
    :math:`\lfloor p_j\rfloor` or :math:`\lceil p_j\rceil`, or anything between the sums of the column's
    floors and ceilings). Yields ``(R, w)``: ``R`` has entries :math:`\lfloor X_{ij}\rfloor` or
    :math:`\lceil X_{ij}\rceil` and column sums ``P``, and row sums within ``w`` of
    :math:`[\lfloor s_i\rfloor, \lceil s_i\rceil]` for ``X``'s row sums ``s``: the rows are held within
    ``v`` of those bounds for the first ``v`` of 0, 1, 2, 4, ... that admits a rounding (``w``, the
    deviation met, is at most ``v``; more only where the parent leaves a row no choice). ``w`` can
    exceed 0: ``P`` was chosen without seeing the children (docs/math.md, section 8.8). With free rows
    every column rounds on its own, so some ``w`` always works. Families are batched (and streamed) as in
    :func:`round_families`; only the columns with :math:`P_j > 0` enter (the others are 0).

    >>> [(R.tolist(), w) for R, w in round_below([(np.array([[1.69, 0.0, 0.045], [0.0, 0.721, 0.0]]),
    ...                                                 np.array([2, 0, 1]))])]
    [([[2, 0, 1], [0, 0, 0]], 1)]
    """
    items, held = [], 0
    for X, P in families:
        X = _entries(X)
        P = _whole(P, "the parent's cells")
        if P.shape != (X.shape[1],):
            raise RoundingError(f"{P.size} parent cells for a table of {X.shape[1]} columns")
        low, high = np.floor(X).sum(axis=0), np.ceil(X).sum(axis=0)
        if np.any(P < low) or np.any(P > high):
            j = int(np.flatnonzero((P < low) | (P > high))[0])
            raise RoundingError(f"the parent's cell {j} is {P[j]} but its children's add up to {X[:, j].sum()!r}: "
                                "the children cannot be rounded to it; round consistent tables")
        items.append((X, P))
        held += int(np.count_nonzero(X))
        if held >= batch_entries:  # a chunk at a time: the caller may stream families
            yield from _below(items, batch_entries)
            items, held = [], 0
    if items:
        yield from _below(items, batch_entries)


def _below(items: list, batch_entries: int) -> list[tuple[np.ndarray, int]]:
    """:func:`round_below` of validated ``(X, P)``: rows widened family by family until each rounds."""
    out: list = [None] * len(items)
    todo, w = list(range(len(items))), 0
    while todo:
        rows = [_soft_rows(items[f][0].sum(axis=1), items[f][0][:, items[f][1] > 0], w) for f in todo]
        tables = ((items[f][0][:, items[f][1] > 0], items[f][1][items[f][1] > 0], lo, hi) for f, (lo, hi) in
                  zip(todo, rows))
        failed = []
        for f, (R, bad) in zip(todo, _batches(tables, batch_entries)):
            if bad:
                failed.append(f)
                continue
            full = np.zeros(items[f][0].shape, dtype=np.int64)
            full[:, items[f][1] > 0] = R
            out[f] = (full, _deviation(items[f][0].sum(axis=1), full))
        if failed and w > max(items[f][0].shape[1] for f in failed):  # free rows: cannot fail (docstring)
            raise ArithmeticError("a consistent family could not be rounded with free rows; please report this")
        todo, w = failed, (1 if w == 0 else 2 * w)
    return out


def _soft_rows(s: np.ndarray, X: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows' bounds: within ``w`` of the floor and ceiling of their real sums ``s``, and within the sums of
    their entries' floors and ceilings on the columns kept, ``X``."""
    near = np.rint(s)
    whole = np.abs(s - near) <= ROUND_RTOL * np.maximum(1.0, s)
    lo = np.where(whole, near, np.floor(s)) - w
    hi = np.where(whole, near, np.ceil(s)) + w
    least, most = np.floor(X).sum(axis=1), np.ceil(X).sum(axis=1)
    return np.clip(lo, least, most).astype(np.int64), np.clip(hi, least, most).astype(np.int64)


def _deviation(s: np.ndarray, R: np.ndarray) -> int:
    """How far the rows of ``R`` fall outside the floor and ceiling of their real sums ``s`` (0 if none does)."""
    near = np.rint(s)
    whole = np.abs(s - near) <= ROUND_RTOL * np.maximum(1.0, s)
    lo, hi = np.where(whole, near, np.floor(s)), np.where(whole, near, np.ceil(s))
    sums = R.sum(axis=1)
    return int(max(0.0, float(np.max(lo - sums, initial=0)), float(np.max(sums - hi, initial=0))))


def controlled_round(X: np.ndarray, columns: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """An integer table with the columns' totals (and rows', if given) next to ``X`` (module docstring).

    >>> controlled_round(np.array([[0.4, 0.6], [0.6, 0.4]]), np.array([1, 1]), rows=np.array([1, 1])).sum(axis=0)
    array([1, 1])
    """
    return next(round_families([(X, columns, rows)]))


def round_vector(x: np.ndarray, total: float | None = None) -> np.ndarray:
    """Cells ``x`` rounded up or down, adding up to ``total`` (a whole number) or, when ``None``, to
    :math:`\\lfloor\\sum x\\rfloor` or :math:`\\lceil\\sum x\\rceil`, with the least :math:`\\sum|R - x|`:
    the cells with the largest fractional parts go up.

    >>> round_vector(np.array([0.2, 0.7, 1.1]), 2).tolist()
    [0, 1, 1]
    """
    x = _entries(np.asarray(x, dtype=float)[None, :])[0]
    F = np.floor(x)
    f = x - F
    s = float(x.sum())
    if total is None:
        near = np.rint(s)
        if abs(s - near) <= ROUND_RTOL * max(1.0, s):
            ups = [int(near - F.sum())]
        else:
            ups = [int(np.floor(s) - F.sum()), int(np.ceil(s) - F.sum())]
    else:
        t = int(_whole([total], "the total")[0])
        _misses(np.array([s]), np.array([float(t)]), "total")
        ups = [int(t - F.sum())]
    order = np.argsort(-f, kind="stable")
    best, R = np.inf, None
    for up in ups:
        if not 0 <= up <= int(np.count_nonzero(f)):
            raise RoundingError(f"the cells add up to {s!r}, which cannot be rounded to {F.sum() + up:g}")
        out = F.copy()
        out[order[:up]] += 1
        loss = float(np.abs(out - x).sum())
        if loss < best:
            best, R = loss, out
    return R.astype(np.int64)
