r"""The accuracy report a redistricting office asks for: error per level, per table, and bias by unit size.

Given the released answers of one or more outputs of a geography release (least squares,
non-negative, integer, ...) and the true answers, :func:`accuracy_report` tabulates, for every
released level and output:

* the error of the **total population** of every unit and of every **table** (the query labels
  grouped by their prefix before ``":"``, e.g. ``"PL94 P1: White alone"`` is in table
  ``"PL94 P1"``), and of all queries together:

  .. math:: \text{MAE} = \frac1{n}\sum_{u,q} |\hat a_{uq} - a_{uq}|, \qquad
            \text{RMSE} = \Big(\frac1{n}\sum_{u,q} (\hat a_{uq} - a_{uq})^2\Big)^{1/2},

  over the :math:`n` (unit, query) pairs of the level and table;
* the **mean signed error of the total population by unit size** (the size is the unit's true
  population, binned as ``0, 1-9, 10-49, 50-99, 100-499, 500-999, 1000-4999, 5000+``), with its
  standard error :math:`s/\sqrt{m}` (:math:`s` the sample standard deviation of the :math:`m`
  units' errors in the bin): a post-processing that moves people from large units to small ones
  (as the 2020 Census TopDown was criticised for) shows as positive means in the small bins and
  negative ones in the large bins.

The true answers come from :func:`true_answers`, which reads the data a block of leaves at a time
and multiplies each unit's histogram of the finest released level by the person workload (one
dense cell vector at a time, never a whole country's); coarser levels are sums of their
children's answers. The privacy the release spent travels with the report (``attrs`` of the
frames and :attr:`AccuracyReport.caption`). Plots: :mod:`hdmm.georelease.report_plots`.

>>> import numpy as np
>>> truth = TrueAnswers(levels=("county",), labels=("T1: a", "T1: b", "T2: c"),
...                     answers={"county": np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])},
...                     totals={"county": np.array([3.0, 0.0])}, privacy="zCDP, rho=1")
>>> out = {"county": np.array([[2.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]])}  # last column: totals
>>> report = accuracy_report({"least squares": out}, truth)
>>> report.errors[["measure", "queries", "MAE", "RMSE"]].round(3).values.tolist()
[['total population', 1, 1.0, 1.0], ['all queries', 3, 0.333, 0.577], ['T1', 2, 0.25, 0.5], ['T2', 1, 0.5, 0.707]]
>>> report.bias[["size", "units", "mean signed error"]].values.tolist()
[['0', 1, 1.0], ['1-9', 1, 1.0]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..kron_union import FactorMismatchError, kron_union
from ..matrix import Matrix
from .plan import GeoPlan

__all__ = ["SIZE_BINS", "TrueAnswers", "AccuracyReport", "true_answers", "accuracy_report", "table_of",
           "size_bin_labels", "total_query", "workload_columns"]

#: Lower bounds of the unit size bins (true population): 0, 1-9, 10-49, ..., 5000+.
SIZE_BINS = (0, 1, 10, 50, 100, 500, 1000, 5000)

#: Leaves read at once by :func:`true_answers` (a sparse ``leaves x cells`` block).
LEAVES_PER_READ = 4096

#: Largest dense block of workload columns (queries x cells) :func:`true_answers` forms at once.
COLUMN_ENTRIES = 1 << 22

#: Largest factor (entries) of the workload's Kronecker form that :func:`workload_columns` densifies.
MAX_FACTOR_ENTRIES = 1 << 20


@dataclass(frozen=True, eq=False)
class TrueAnswers:
    """The true answers of every unit of the released levels.

    Attributes
    ----------
    levels : tuple of str
        The released levels, coarsest first.
    labels : tuple of str
        The person queries' labels.
    answers, totals : dict
        ``level -> units x queries`` true answers and ``level -> units`` true populations.
    privacy : str
        What the release spent (the plan's privacy), shown with the report.
    """

    levels: tuple[str, ...]
    labels: tuple[str, ...]
    answers: dict[str, np.ndarray]
    totals: dict[str, np.ndarray]
    privacy: str = ""


@dataclass(frozen=True, eq=False)
class AccuracyReport:
    """Tidy tables of errors (module docstring).

    Attributes
    ----------
    errors : pandas.DataFrame
        ``level, output, measure, units, queries, MAE, RMSE``: one row per level, output and measure
        (``"total population"``, ``"all queries"``, then every table).
    bias : pandas.DataFrame
        ``level, output, size, units, mean signed error, standard error, RMSE``: the error of the
        total population by unit size bin (non-empty bins only).
    privacy : str
    """

    errors: pd.DataFrame
    bias: pd.DataFrame
    privacy: str = ""
    outputs: tuple[str, ...] = field(default=())

    @property
    def caption(self) -> str:
        """One line for a table or a figure: what was compared and the privacy spent."""
        spent = f"; privacy spent: {self.privacy}" if self.privacy else ""
        return f"errors against the true answers of {', '.join(self.outputs)}{spent}"

    def rmse(self, measure: str = "total population") -> pd.DataFrame:
        """RMSE of ``measure``, levels (rows, coarsest first) by outputs (columns)."""
        picked = self.errors[self.errors["measure"] == measure]
        if picked.empty:
            raise ValueError(f"no measure {measure!r}; the measures are {list(self.errors['measure'].unique())}")
        return picked.pivot(index="level", columns="output", values="RMSE").loc[
            list(dict.fromkeys(picked["level"])), list(self.outputs)]


def table_of(label: str) -> str:
    """The table of a query label: its text before the first ``":"`` (``"PL94 P1: total"`` -> ``"PL94 P1"``);
    a label without ``":"`` is its own table."""
    text = str(label)
    return text.split(":", 1)[0].strip() if ":" in text else text


def size_bin_labels(bins: Sequence[int] = SIZE_BINS) -> list[str]:
    """``["0", "1-9", ..., "5000+"]`` for lower bounds ``bins`` (increasing integers from 0)."""
    lows = [int(b) for b in bins]
    if not lows or lows[0] != 0 or any(b <= a for a, b in zip(lows, lows[1:])):
        raise ValueError(f"size bins must be increasing integer lower bounds starting at 0, got {list(bins)}")
    out = [str(a) if b == a + 1 else f"{a}-{b - 1}" for a, b in zip(lows, lows[1:])]
    return out + [f"{lows[-1]}+"]


def total_query(W: Matrix) -> int | None:
    """The position of a query of ``W`` that is the total (a row of ones), or ``None``.

    Screened with one product by a random vector, then confirmed exactly by ``W^T e_q``.
    """
    g = np.random.default_rng(0).standard_normal(W.shape[1])
    tol = 1e-8 * (np.abs(g).sum() + 1.0)
    for q in np.flatnonzero(np.abs(W @ g - g.sum()) <= tol).tolist():
        e = np.zeros(W.shape[0])
        e[q] = 1.0
        if np.array_equal(W.T @ e, np.ones(W.shape[1])):
            return int(q)
    return None


def true_answers(plan: GeoPlan, source, *, levels: Sequence[str | int] | None = None) -> TrueAnswers:
    """The true answers and populations of every unit of the released levels (or ``levels``).

    ``source`` is a :class:`~hdmm.georelease.units.HistogramSource`. Leaves are read
    :data:`LEAVES_PER_READ` at a time (whole units of the finest level asked for). The units of
    that level are answered from the workload's columns at their non-zero cells
    (:func:`workload_columns`: work follows the non-zero cells) or, for a workload without a
    Kronecker form, by one product with each non-empty unit's dense cell vector. Coarser levels
    are sums of their children's answers (exact: counts).
    """
    tree, W = plan.tree, plan.person.workload
    wanted = sorted(plan.levels if levels is None else {tree.level_index(x) for x in levels})
    finest = wanted[-1]
    bounds = np.asarray(tree.leaf_bounds(finest))
    units, q = bounds.size - 1, W.shape[0]
    answers, totals = np.zeros((units, q)), np.zeros(units)
    first = 0
    while first < units:
        last = max(first + 1, int(np.searchsorted(bounds, bounds[first] + LEAVES_PER_READ, side="right")) - 1)
        last = min(last, units)
        lo, hi = int(bounds[first]), int(bounds[last])
        H = sp.csr_matrix(source.histograms(lo, hi))
        owner = np.repeat(np.arange(last - first), np.diff(bounds[first:last + 1]))
        S = sp.csr_matrix((np.ones(owner.size), (owner, np.arange(owner.size))), shape=(last - first, hi - lo))
        X = (S @ H).tocsr()
        totals[first:last] = np.asarray(X.sum(axis=1)).ravel()
        answers[first:last] = _answer_rows(plan, X)
        first = last
    out_answers, out_totals = {}, {}
    for d in wanted:
        name = tree.levels[d]
        if d == finest:
            out_answers[name], out_totals[name] = answers, totals
            continue
        S = _summing(np.searchsorted(bounds, tree.leaf_bounds(d)), units)
        out_answers[name], out_totals[name] = S @ answers, S @ totals
    return TrueAnswers(tuple(tree.levels[d] for d in wanted), tuple(str(x) for x in W.labels), out_answers,
                       out_totals, plan.privacy.description)


def workload_columns(W: Matrix, cells: np.ndarray, memo: dict | None = None) -> np.ndarray | None:
    r"""``W[:, cells]`` (``queries x k``, dense) from ``W``'s union of Kronecker products, or ``None``.

    Column :math:`c` of :math:`\sum_j c_j \bigotimes_i F_{ij}` stacked by terms is, per term,
    :math:`c_j \bigotimes_i F_{ij}[:, c_i]` with :math:`(c_1, \dots)` the cell's index per attribute:
    small dense factors, no cell vector. ``None`` when ``W`` has no such form or a factor is larger than
    :data:`MAX_FACTOR_ENTRIES` (then answer by products with dense cell vectors).
    """
    memo = {} if memo is None else memo
    if "factors" not in memo:
        try:
            union = kron_union(W)
        except FactorMismatchError:
            union = None
        if union is None or any(f.shape[0] * f.shape[1] > MAX_FACTOR_ENTRIES for fs in union.factors for f in fs):
            memo["factors"] = None
        else:
            memo["factors"] = (union, [[np.asarray(f.dense()) for f in fs] for fs in union.factors])
    if memo["factors"] is None:
        return None
    union, dense = memo["factors"]
    index = np.unravel_index(np.asarray(cells, dtype=np.int64), union.sizes)
    blocks = []
    for j in range(union.num_terms):
        block = np.ones((1, index[0].size))
        for i, k in enumerate(union.index[j]):
            F = dense[i][k][:, index[i]]
            block = (block[:, None, :] * F[None, :, :]).reshape(block.shape[0] * F.shape[0], index[i].size)
        blocks.append(union.weights[j] * block)
    return np.vstack(blocks)


def _answer_rows(plan: GeoPlan, X: sp.csr_matrix) -> np.ndarray:
    """``X W^T`` for the units' sparse histograms ``X``: by the columns of ``W`` at the units' non-zero cells
    (:func:`workload_columns`, groups of units holding at most :data:`COLUMN_ENTRIES` entries) where the
    units are sparse (fewer distinct cells than an eighth of the cells per unit times the units over the
    queries), else by one product with each non-empty unit's dense cell vector."""
    W = plan.person.workload
    q = W.shape[0]
    out = np.zeros((X.shape[0], q))
    memo = plan.memo("report workload columns", dict)
    nnz = np.diff(X.indptr)
    start = 0
    while start < X.shape[0]:
        stop = start + 1 + int(np.searchsorted(np.cumsum(nnz[start + 1:]), COLUMN_ENTRIES // q - nnz[start],
                                                side="right"))
        rows = X[start:stop]
        if rows.nnz == 0:  # empty units answer zero
            start = stop
            continue
        cells, inverse = np.unique(rows.indices, return_inverse=True)
        busy = int(np.count_nonzero(nnz[start:stop]))
        # the columns cost about q per distinct cell, a product with a dense cell vector about N per unit
        cheap = cells.size * q <= busy * W.shape[1] // 8 and nnz[start] * q <= COLUMN_ENTRIES
        columns = workload_columns(W, cells, memo) if cheap else None
        if columns is not None:
            compact = sp.csr_matrix((rows.data, inverse.ravel(), rows.indptr), shape=(stop - start, cells.size))
            out[start:stop] = np.asarray(compact @ columns.T)
        else:
            for i in np.flatnonzero(nnz[start:stop]).tolist():
                out[start + i] = W @ rows[i].toarray().ravel()
        start = stop
    return out


def _summing(edges: np.ndarray, n: int) -> sp.csr_matrix:
    """The sparse ``groups x n`` matrix summing consecutive ranges ``edges[i]..edges[i+1]-1``."""
    owner = np.repeat(np.arange(edges.size - 1), np.diff(edges))
    return sp.csr_matrix((np.ones(owner.size), (owner, np.arange(n))), shape=(edges.size - 1, n))


def _output_level(name: str, output, level: str, truth: TrueAnswers, total: int | None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(answers units x queries, totals units)`` of one output at one level, checked against the truth."""
    units, q = truth.answers[level].shape
    if hasattr(output, "answers") and hasattr(output, "totals"):  # a GeoRelease
        answers, totals = np.asarray(output.answers(level), dtype=float), np.asarray(output.totals(level), float)
    else:
        if not isinstance(output, Mapping):
            raise TypeError(f"output {name!r} must be a GeoRelease or a mapping level -> answers, "
                            f"got {type(output).__name__}")
        if level not in output:
            raise ValueError(f"output {name!r} has no answers for level {level!r}; it has {sorted(map(str, output))}")
        values = np.asarray(output[level], dtype=float)
        if values.ndim != 2 or values.shape[0] != units or values.shape[1] not in (q, q + 1):
            raise ValueError(f"output {name!r} at level {level!r} has shape {values.shape}; expected {units} units x "
                             f"{q} queries (or {q + 1} columns, the last the units' totals)")
        if values.shape[1] == q + 1:
            answers, totals = values[:, :q], values[:, q]
        elif total is not None:
            answers, totals = values, values[:, total]
        else:
            raise ValueError(f"output {name!r} gives no totals and the workload has no total query: add the units' "
                             "totals as a last column")
    if answers.shape != (units, q) or totals.shape != (units,):
        raise ValueError(f"output {name!r} at level {level!r} has {answers.shape} answers; the truth {(units, q)}")
    return answers, totals


def accuracy_report(outputs: Mapping[str, object], truth: TrueAnswers, *, bins: Sequence[int] = SIZE_BINS,
                    total: int | None | str = "auto", workload: Matrix | None = None) -> AccuracyReport:
    """Errors of every output against ``truth`` per level, table and unit size (module docstring).

    Parameters
    ----------
    outputs
        ``{name: output}``, e.g. ``{"least squares": release, "non-negative": release_nn}``; an output
        is a :class:`~hdmm.georelease.GeoRelease` (its ``answers`` and ``totals``) or a mapping
        ``level -> units x queries`` (or ``units x (queries + 1)``, the units' totals last).
    truth
        From :func:`true_answers` (or a :class:`TrueAnswers` made by hand); the privacy shown is its
        ``privacy``, else the plan's of the first :class:`~hdmm.georelease.GeoRelease` output.
    bins
        Lower bounds of the size bins (:data:`SIZE_BINS`).
    total
        For outputs without totals: the position of the total query, ``None``, or ``"auto"``
        (found in ``workload`` by :func:`total_query`, else a label ending in ``": total"``).
    """
    if not outputs:
        raise ValueError("give at least one output to report on")
    labels = size_bin_labels(bins)
    if total == "auto":
        total = total_query(workload) if workload is not None else next(
            (i for i, x in enumerate(truth.labels) if x.lower().endswith(": total")), None)
    tables = pd.Series([table_of(x) for x in truth.labels])
    groups = {t: np.flatnonzero(tables.to_numpy() == t) for t in dict.fromkeys(tables)}
    error_rows, bias_rows = [], []
    for level in truth.levels:
        true_answers_, true_totals = truth.answers[level], truth.totals[level]
        which = np.searchsorted(np.asarray(bins, dtype=float), true_totals, side="right") - 1
        for name, output in outputs.items():
            answers, totals = _output_level(name, output, level, truth, total)
            err, terr = answers - true_answers_, totals - true_totals
            units = err.shape[0]
            measures = [("total population", terr[:, None]), ("all queries", err)]
            measures += [(t, err[:, cols]) for t, cols in groups.items()]
            for measure, e in measures:
                error_rows.append({"level": level, "output": name, "measure": measure, "units": units,
                                   "queries": e.shape[1], "MAE": float(np.mean(np.abs(e))),
                                   "RMSE": float(np.sqrt(np.mean(e**2)))})
            for b, label in enumerate(labels):
                e = terr[which == b]
                if e.size == 0:
                    continue
                bias_rows.append({"level": level, "output": name, "size": label, "units": int(e.size),
                                  "mean signed error": float(e.mean()),
                                  "standard error": float(e.std(ddof=1) / np.sqrt(e.size)) if e.size > 1 else np.nan,
                                  "RMSE": float(np.sqrt(np.mean(e**2)))})
    errors = pd.DataFrame(error_rows, columns=["level", "output", "measure", "units", "queries", "MAE", "RMSE"])
    bias = pd.DataFrame(bias_rows, columns=["level", "output", "size", "units", "mean signed error",
                                            "standard error", "RMSE"])
    privacy = truth.privacy or next((o.plan.privacy.description for o in outputs.values()
                                     if isinstance(getattr(o, "plan", None), GeoPlan)), "")
    for frame in (errors, bias):
        frame["level"] = pd.Categorical(frame["level"], categories=list(truth.levels), ordered=True)
        frame["output"] = pd.Categorical(frame["output"], categories=list(outputs), ordered=True)
        frame.attrs["privacy"] = privacy
    bias["size"] = pd.Categorical(bias["size"], categories=labels, ordered=True)
    return AccuracyReport(errors, bias, privacy, tuple(outputs))
