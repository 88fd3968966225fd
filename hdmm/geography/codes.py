"""Columns of unit codes read once, as arrays: the vectorized reading behind :class:`GeographyTree`.

A column of codes (a level of a table of units, or of person records) is read by factorizing it
(``pandas.factorize``, hashing in C) and turning only its *distinct* values into text, so a
column of millions of codes with a few thousand distinct values costs a few thousand Python
operations. The result is a :class:`CodeColumn`: each row's position in the sorted distinct
codes, ``-1`` for a missing code (``NaN``, ``None`` or blank text).

Messages built here never show a code of the data (which codes the data hold is private): they
count records (:func:`records_phrase`) and show only the tree's own codes (:func:`preview`).

>>> column = read_codes(["06", "01", None, "06", " "])
>>> column.values.tolist(), column.ranks.tolist()
(['01', '06'], [1, 0, -1, 1, -1])
>>> column.widths()
[2]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["GeographyError", "CodeColumn", "read_codes", "preview", "records_phrase", "weights_array", "lookup"]

SHOW = 5


class GeographyError(ValueError):
    """A geography that is not a valid tree, or a code that is not in it."""


def preview(items: Iterable) -> str:
    """``"['a', 'b', ...]"``: the first few of ``items`` (public codes only)."""
    items = list(items[:SHOW + 1] if isinstance(items, (np.ndarray, tuple, list)) else items)
    shown = ", ".join(repr(str(i)) for i in items[:SHOW])
    return f"[{shown}{', ...' if len(items) > SHOW else ''}]"


def weights_array(weights: Iterable[float] | None, n: int) -> np.ndarray | None:
    """Records per row as an array of length ``n`` (``None`` when every row is one record)."""
    if weights is None:
        return None
    w = np.asarray(weights.to_numpy() if hasattr(weights, "to_numpy") else list(weights), dtype=float)
    if w.shape != (n,):
        raise ValueError(f"weights must give one number of records per row ({n}), got shape {w.shape}")
    return w


def records_phrase(bad: np.ndarray, weights: np.ndarray | None) -> str:
    """``"3 records have"``: the number of records flagged ``bad`` (``weights`` records per row, when given)."""
    n = int(bad.sum()) if weights is None else int(weights[bad].sum())
    return "1 record has" if n == 1 else f"{n:,} records have"


@dataclass(frozen=True)
class CodeColumn:
    """A column of codes: ``ranks[i]`` is row ``i``'s position in ``values`` (sorted distinct codes), ``-1`` if
    missing."""

    ranks: np.ndarray
    values: np.ndarray

    @property
    def missing(self) -> np.ndarray:
        return self.ranks < 0

    def widths(self) -> list[int]:
        """The distinct lengths of the codes present, ascending."""
        return sorted({len(v) for v in self.values.tolist()})

    def text(self) -> np.ndarray:
        """Each row's code as text (``""`` when missing): for small columns (tests, messages)."""
        return np.where(self.missing, "", self.values[np.maximum(self.ranks, 0)] if self.values.size else "")


def read_codes(column) -> CodeColumn:
    """Read a column (a pandas Series or any sequence) of codes: each value as ``str(value)``, blank is missing.

    Values that read as the same text (``1`` and ``"1"``) are the same code.
    """
    if not isinstance(column, (pd.Series, pd.Index, np.ndarray)):
        column = pd.Series(list(column), dtype=object)
    fac, distinct = pd.factorize(column, use_na_sentinel=True)
    text = np.array([str(v) for v in distinct], dtype=str) if len(distinct) else np.zeros(0, dtype=str)
    values, inverse = np.unique(text, return_inverse=True)
    blank = np.char.str_len(np.char.strip(values)) == 0 if values.size else np.zeros(0, dtype=bool)
    if blank.any():  # blank text is no code: drop it from the values
        keep = np.flatnonzero(~blank)
        renumber = np.full(values.size, -1, dtype=np.int64)
        renumber[keep] = np.arange(keep.size)
        values, inverse = values[keep], renumber[inverse]
    mapping = np.append(np.asarray(inverse, dtype=np.int64).ravel(), -1)  # index -1 (missing) -> -1
    return CodeColumn(mapping[fac], values)


def lookup(sorted_codes: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Position of each of ``queries`` in the sorted array ``sorted_codes``, ``-1`` where it is absent."""
    if sorted_codes.size == 0 or queries.size == 0:
        return np.full(queries.shape, -1, dtype=np.int64)
    pos = np.searchsorted(sorted_codes, queries)
    found = pos < sorted_codes.size
    found[found] = sorted_codes[pos[found]] == queries[found]
    return np.where(found, pos, -1).astype(np.int64)
