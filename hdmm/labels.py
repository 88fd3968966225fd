"""Readable query labels: lazy label sequences and the wording of one-attribute predicates.

A workload with millions of queries gets its labels one at a time, when asked for
(:class:`LabelSequence`); a row of an explicit one-attribute matrix is described as a total,
a single value, a range or a set of values (:func:`describe_row`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

__all__ = ["LabelSequence", "value_label", "describe_row"]


class LabelSequence(Sequence):
    """A lazy, read-only sequence of query labels: label ``i`` is computed when asked for."""

    def __init__(self, length: int, label: Callable[[int], str]):
        self._length = int(length)
        self._label = label

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._label(i) for i in range(*index.indices(self._length))]
        i = int(index)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError(f"query index {index} out of range for {self._length} queries")
        return self._label(i)

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, self._length)))
        more = ", ..." if self._length > 3 else ""
        return f"LabelSequence([{head}{more}], length={self._length})"


def value_label(values: Sequence | None, i: int) -> str:
    return str(i if values is None else values[i])


def describe_row(row: np.ndarray, name: str | None, values: Sequence | None) -> str | None:
    """Label a one-attribute query row: a total, a single value, a range or a set of values."""
    name = name or "value"
    support = np.flatnonzero(row)
    if support.size == 0:
        return f"{name}: empty query"
    if not np.all(row[support] == 1):
        return f"{name}: weighted query"
    if support.size == row.size:
        return None
    if support.size == 1:
        return f"{name}={value_label(values, support[0])}"
    lo, hi = int(support[0]), int(support[-1]) + 1
    if hi - lo == support.size:
        if values is None:
            return f"{name} in [{lo}, {hi})"
        return f"{name} in {value_label(values, lo)}..{value_label(values, hi - 1)}"
    shown = ", ".join(value_label(values, i) for i in support[:6])
    return f"{name} in {{{shown}{', ...' if support.size > 6 else ''}}}"
