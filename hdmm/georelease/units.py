r"""Unit histograms and their measurement: the data-touching step of a geography release.

The data reach a geography release as per-leaf histograms over the person domain: sparse
``leaves x N`` count matrices, one partition (e.g. a state) at a time, made from person records
(:class:`RecordHistograms`) or given directly (:class:`ArrayHistograms`, any object with the same
two methods). Each measured unit's histogram (the sum of its leaves') is measured by
:func:`hdmm.measure`, the kernel, under the unit's plan (:meth:`GeoPlan.unit_plan`), and mapped
to the unit's own estimate in the common space of :mod:`hdmm.georelease.passes`: the answers of
the person workload and the unit's total, :math:`e_u = (W_p \hat x_u, \mathbf 1^T\hat x_u)` with
:math:`\hat x_u = (w_lA_p)^+y_u`.

**Noise streams.** With ``seed=None`` every unit's noise comes from fresh OS entropy. With an
int seed, unit ``u`` of level ``l`` draws from the stream seeded by a hash of ``(seed, level
name, unit code)`` (:func:`unit_seed`): the same unit gets the same noise whichever engine,
partition or order measures it, which makes the engines' releases identical for a given seed.
Seeds are for tests and reproducible research only: anyone who knows one can remove the noise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..domain import Domain
from ..exact import DENSE_NODE
from ..geography import GeographyError, GeographyTree
from ..kernel import measure_many
from ..kron_union import FactorMismatchError, kron_union
from ..matrix import Explicit, Kronecker, Matrix, VStack, Weighted
from ..mechanism import reconstruct
from ..planning import check_calibration
from ..records import cell_index
from .passes import Partition
from .plan import GeoPlan

__all__ = [
    "HistogramSource", "RecordHistograms", "ArrayHistograms", "unit_seed", "measure_units", "measure_partition",
    "unit_histograms", "check_record_columns",
]


class HistogramSource(Protocol):
    """Where the data come from: per-leaf histograms over the person domain, a leaf range at a time.

    A source may also say how many person cells its histograms have (``person_cells``) and which tree
    it places records in (``tree``); :func:`check_source` then checks them against the plan.
    """

    def leaf_totals(self) -> np.ndarray:
        """Number of records of every leaf (checked against invariants before any noise)."""

    def histograms(self, lo: int, hi: int) -> sp.csr_matrix:
        """The ``(hi - lo) x N`` sparse counts of leaves ``lo..hi-1``."""


def unit_seed(seed: int, level: str, code: str) -> int:
    """The seed of one unit's noise stream: 64 bits of SHA-256 of ``seed``, the level and the code."""
    digest = hashlib.sha256(f"hdmm-geography/{int(seed)}/{level}/{code}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def check_record_columns(columns, tree: GeographyTree, domain: Domain | None, leaf_column: str | None = None) -> None:
    """Refuse records (of column names ``columns``) that lack a column the release reads, all named at once.

    A record needs its leaf's code (``leaf_column``, or else the tree's level columns, see
    :meth:`GeographyTree.from_table`) and a value of every attribute of ``domain`` (if given).
    Only column names are shown, never values: which codes the data hold is private.
    """
    columns = [str(c) for c in columns]
    if leaf_column is not None:
        levels, what = [leaf_column], "the column of leaf codes"
    elif tree.columns is None:
        raise GeographyError("give leaf_column= (a column of leaf codes) for a tree not made by from_table")
    else:
        levels, what = list(tree.columns), "the geography's level columns"
    no_level = [c for c in levels if c not in columns]
    no_attribute = [] if domain is None else [n for n in domain.names if n not in columns]
    if not no_level and not no_attribute:
        return
    parts = ([f"{no_level} ({what})"] if no_level else []) + (
        [f"{no_attribute} (person attributes)"] if no_attribute else [])
    raise GeographyError(
        f"the records have no column(s) {' and no column(s) '.join(parts)}; they have {columns}: every record needs "
        "the code of its unit at every level and a value of every person attribute; add or rename those columns "
        "(hdmm release: --geography names the level columns, e.g. state,county)")


@dataclass(frozen=True, eq=False)
class RecordHistograms:
    """Histograms from person records: one row per person, person attribute columns and geography.

    Parameters
    ----------
    tree
        The geography; records are placed by :meth:`GeographyTree.locate` (its level columns,
        for a tree from :meth:`GeographyTree.from_table`) or by a column of leaf codes.
    domain
        The person domain (the columns read as :meth:`hdmm.Domain.vectorize` reads them).
    leaves, cells
        Each record's leaf and person cell, sorted by leaf (made by :meth:`of`).
    """

    tree: GeographyTree
    domain: Domain
    leaves: np.ndarray
    cells: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, tree: GeographyTree, domain: Domain, records: pd.DataFrame, *, leaf_column: str | None = None,
           codes: bool = False) -> RecordHistograms:
        """Read and check every record (before any noise): unknown codes and values are refused."""
        if not isinstance(records, pd.DataFrame):
            raise TypeError(f"records must be a pandas DataFrame, got {type(records).__name__}")
        check_record_columns(records.columns, tree, domain, leaf_column)
        if leaf_column is not None:
            if records[leaf_column].isna().any():
                raise GeographyError(f"some records have no code in {leaf_column!r} (missing values): every record "
                                     "needs the code of its leaf")
            leaves = tree.leaf_index(records[leaf_column].astype(str))
        else:
            leaves = tree.locate(records)
        cells = cell_index(domain, records, codes=codes, private=True)  # errors count records, never show values
        order = np.argsort(leaves, kind="stable")
        leaves, cells = leaves[order], cells[order]
        starts = np.searchsorted(leaves, np.arange(tree.leaves + 1))
        return cls(tree, domain, leaves, cells, starts)

    @property
    def person_cells(self) -> int:
        return self.domain.size

    def leaf_totals(self) -> np.ndarray:
        return np.diff(self.starts).astype(float)

    def histograms(self, lo: int, hi: int) -> sp.csr_matrix:
        a, b = self.starts[lo], self.starts[hi]
        rows, cols = self.leaves[a:b] - lo, self.cells[a:b]
        H = sp.csr_matrix((np.ones(b - a), (rows, cols)), shape=(hi - lo, self.domain.size))
        H.sum_duplicates()
        return H


@dataclass(frozen=True, eq=False)
class ArrayHistograms:
    """Histograms given directly: a sparse ``leaves x N`` matrix (e.g. drawn for a benchmark)."""

    matrix: sp.csr_matrix

    def __post_init__(self) -> None:
        if not sp.issparse(self.matrix) or self.matrix.ndim != 2:
            raise TypeError("ArrayHistograms needs a 2-D scipy.sparse matrix (leaves x person cells)")
        values = self.matrix.data
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError("the histograms hold negative or non-finite counts; they must be record counts")

    @property
    def person_cells(self) -> int:
        return int(self.matrix.shape[1])

    def leaf_totals(self) -> np.ndarray:
        return np.asarray(self.matrix.sum(axis=1)).ravel()

    def histograms(self, lo: int, hi: int) -> sp.csr_matrix:
        return self.matrix[lo:hi]


def check_source(plan: GeoPlan, source: HistogramSource) -> None:
    """Refuse data that do not fit the plan (shape, counts, invariants) before any noise is drawn.

    A mismatch with an invariant names the unit, not the count in the data (which is private).
    Each measured level's unit plan is checked against its strategy first
    (:func:`hdmm.planning.check_calibration`): an edited plan is refused before it is charged.
    """
    for d in plan.measured:
        check_calibration(plan.unit_plan(d))
    tree = getattr(source, "tree", None)
    if tree is not None and tree is not plan.tree and (
            tree.levels != plan.tree.levels or tree.sizes != plan.tree.sizes
            or any(tree.codes(d) != plan.tree.codes(d)
                   or not np.array_equal(tree.leaf_bounds(d), plan.tree.leaf_bounds(d))
                   for d in range(len(tree.levels)))):
        raise ValueError("the data were placed in another geography tree than the plan's: build the histograms "
                         "(RecordHistograms.of) with the plan's tree")
    cells = getattr(source, "person_cells", None)
    if cells is not None and cells != plan.person.strategy.shape[1]:
        raise ValueError(f"the data's histograms have {cells:,} person cells but the plan's person domain has "
                         f"{plan.person.strategy.shape[1]:,}: use the plan's person domain")
    totals = np.asarray(source.leaf_totals(), dtype=float)
    if totals.shape != (plan.tree.leaves,):
        raise ValueError(f"the data have {totals.size} leaves but the tree has {plan.tree.leaves}")
    if not np.all(np.isfinite(totals)) or np.any(totals < 0):
        raise ValueError("the histograms hold negative or non-finite counts; they must be record counts")
    inv = plan.invariants
    if inv is None:
        return
    for d, u, value in zip(inv.levels.tolist(), inv.units_at.tolist(), inv.values.tolist()):
        lo, hi = plan.tree.leaf_bounds(d)[u], plan.tree.leaf_bounds(d)[u + 1]
        if abs(float(totals[lo:hi].sum()) - value) > 1e-9 * max(1.0, value):
            raise GeographyError(
                f"the invariant of {plan.tree.label(d, u)} ({value:g}) is not the number of records the data hold "
                "there: an invariant must be the true (public) total; fix the invariants or the data"
            )


def unit_histograms(tree: GeographyTree, part: Partition, level: int, H: sp.csr_matrix) -> sp.csr_matrix:
    """The histograms of a partition's units of ``level`` from its leaves' ``H``."""
    lo, hi = part.range(level)
    bounds = tree.leaf_bounds(level)[lo:hi + 1] - part.leaves()[0]
    owner = np.repeat(np.arange(hi - lo), np.diff(bounds))
    S = sp.csr_matrix((np.ones(owner.size), (owner, np.arange(owner.size))), shape=(hi - lo, H.shape[0]))
    return (S @ H).tocsr()


#: The spaces a unit's own estimate can be held in: the person answers and the unit's total
#: (``queries + 1`` numbers), or the person strategy's answers divided by the level weight.
SPACES = ("answers", "measurements")


#: Largest strategy factor (columns) whose pseudo-inverse :func:`answer_operator` forms densely.
MAX_FACTOR_CELLS = 4096


def answer_operator(plan: GeoPlan) -> Matrix | None:
    r""":math:`[W_p; \mathbf 1^T]\,A_p^+` as one union of Kronecker products (a dense matrix for a small domain of
    another structure), or ``None``.

    For :math:`A_p = c \bigotimes_j A_j` and a workload term :math:`\bigotimes_j W_{ij}`, the term of
    :math:`W_pA_p^+` is :math:`c^{-1}\bigotimes_j (W_{ij}A_j^+)`, small dense factors applied to the
    strategy's answers directly: no cell vector, and the attributes the strategy sums over (a
    total factor) cost nothing. Built once per plan.
    """
    structure = plan.person.structure
    if structure.form != "kronecker":
        n = plan.person.strategy.shape[1]
        if n > MAX_FACTOR_CELLS or plan.person.strategy.shape[0] * n > DENSE_NODE:  # as the exact measurement's
            return None
        # a small domain (PL94's 2,016 cells): the dense (queries + 1) x rows product, formed once
        pinv = np.asarray(plan.strategy_pinv.dense(), dtype=float)
        W = np.asarray(plan.person.workload.dense(), dtype=float)
        return Explicit(np.vstack([W @ pinv, pinv.sum(axis=0, keepdims=True)]))
    c, a_factors = structure.union.term(0)
    if max(f.shape[1] for f in a_factors) > MAX_FACTOR_CELLS:  # e.g. one identity over the whole domain
        return None
    try:
        wu = kron_union(plan.person.workload).align([f.shape[1] for f in a_factors])
    except FactorMismatchError:
        return None
    pinvs = [np.asarray(f.pinv().dense()) for f in a_factors]
    products = [[Explicit(np.asarray(F.dense()) @ pinvs[i]) for F in wu.factors[i]] for i in range(len(pinvs))]
    terms = []
    for j in range(wu.num_terms):
        factors = [products[i][wu.index[j, i]] for i in range(len(pinvs))]
        terms.append(Weighted(Kronecker(factors), float(wu.weights[j]) / c))
    total = Weighted(Kronecker([Explicit(p.sum(axis=0, keepdims=True)) for p in pinvs]), 1.0 / c)
    return VStack(terms + [total])


#: Units measured by one call of the kernel (their dense counts held at once) ...
UNITS_PER_CALL = 256

#: ... and at most this many of their cells (units x person domain; one unit of SF1's 492,660 cells, 65 of
#: PL94's 2,016). The kernel's exact arithmetic makes several temporaries the size of a batch per strategy
#: factor; large ones are fresh memory every time, and its page faults cost more than the products (SF1
#: measured 34 units a call: 188 ms a unit, 146 of them in the kernel; one unit a call: 50 ms;
#: benchmarks/results/geography.md).
CELLS_PER_CALL = 2**17

#: A subtree with at most this many leaves is read and measured at once (its units a level at a time).
LEAVES_PER_READ = 4096


def _measurements(plan: GeoPlan, unit, level: int, first: int, X, seed: int | None):
    """``(i, measurement)`` of every row of ``X`` (units ``first + i`` of ``level``), through the kernel,
    ``UNITS_PER_CALL`` units (and at most ``CELLS_PER_CALL`` cells) a call, each unit with its own noise stream."""
    name = plan.tree.levels[level]
    codes = None if seed is None else plan.tree.codes(level)
    step = max(1, min(UNITS_PER_CALL, CELLS_PER_CALL // max(1, X.shape[1])))
    for lo in range(0, X.shape[0], step):
        hi = min(lo + step, X.shape[0])
        block = X[lo:hi].toarray() if sp.issparse(X) else np.asarray(X[lo:hi], dtype=float)
        rngs = [None if seed is None else unit_seed(seed, name, codes[first + i]) for i in range(lo, hi)]
        for i, measured in enumerate(measure_many(unit, block, rngs)):
            yield lo + i, measured


def measure_units(plan: GeoPlan, level: int, first: int, X: sp.csr_matrix | np.ndarray, seed: int | None,
                  space: str = "answers") -> np.ndarray:
    r"""The own estimates :math:`e_u` of units ``first, first + 1, ...`` of ``level``, one row per unit.

    Each unit is measured by the kernel (:func:`hdmm.measure`) with its own noise stream. In the
    ``"answers"`` space a row is :math:`(W_p\hat x_u, \mathbf 1^T\hat x_u)`; in the ``"measurements"``
    space it is :math:`y_u / w_l` (whose image under :math:`A_p^+` is :math:`\hat x_u`), for
    estimates that need the cells afterwards (:mod:`hdmm.georelease.nonneg`).
    """
    unit = plan.unit_plan(level)
    w = float(plan.level_weights[level])
    if space == "measurements":
        out = np.empty((X.shape[0], plan.person_plan(level).strategy.shape[0]))
        for i, measured in _measurements(plan, unit, level, first, X, seed):
            out[i] = measured.answers / w
        return out
    W = plan.person.workload
    out = np.empty((X.shape[0], plan.queries + 1))
    fast = plan.memo("answer operator", lambda: answer_operator(plan))
    for i, measured in _measurements(plan, unit, level, first, X, seed):
        if fast is not None:
            out[i] = fast @ (measured.answers / w)
            continue
        xhat = reconstruct(unit, measured)
        out[i, :-1] = W @ xhat
        out[i, -1] = xhat.sum()
    return out


def measure_partition(plan: GeoPlan, part: Partition, histograms, seed: int | None,
                      space: str = "answers") -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Every measured unit of the partition at levels ``P..l*``: their own estimates, level by level,
    and the partition's total histogram (dense, ``N``; the sum of its units' for a range of siblings).

    ``histograms`` is the partition's leaves' sparse counts, or a function ``(lo, hi) -> counts``
    of leaves ``lo..hi-1`` (tree positions). The subtree is walked unit by unit down to the level
    above the finest measured one, whose leaves are read at once: a state's release holds one
    county's tracts at a time, not the state's.
    """
    if callable(histograms):
        read = histograms
    else:
        base = part.leaves()[0]

        def read(lo: int, hi: int) -> sp.csr_matrix:
            return histograms[lo - base:hi - base]
    return _measure_subtree(plan, part, read, seed, space)


def _measure_subtree(plan: GeoPlan, part: Partition, read, seed: int | None, space: str
                     ) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """A partition's leaves read at once, each level in one call, when few (or near the finest level); else its
    units one by one (a range of siblings), or its children one by one and then the unit from their total."""
    tree, finest = plan.tree, plan.solver.finest
    lo, hi = part.leaves()
    if part.level >= finest - 1 or hi - lo <= LEAVES_PER_READ:
        H = read(lo, hi)
        own = {d: measure_units(plan, d, part.range(d)[0], unit_histograms(tree, part, d, H), seed, space)
               for d in plan.measured if d >= part.level}
        return own, np.asarray(H.sum(axis=0)).ravel()
    one = part.size == 1
    level, units = (part.level + 1, part.range(part.level + 1)) if one else (part.level, part.units)
    below, total = [], np.zeros(plan.person.cells)
    for u in range(*units):
        own, piece = _measure_subtree(plan, Partition.of(tree, level, u), read, seed, space)
        below.append(own)
        total += piece
    own = {d: np.vstack([o[d] for o in below]) for d in below[0]}
    if one and plan.level_weights[part.level] > 0:
        own[part.level] = measure_units(plan, part.level, part.unit, total[None, :], seed, space)
    return own, total
