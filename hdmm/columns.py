"""One column of records read as the codes of one attribute.

A record's value of attribute :math:`A_i` becomes its code :math:`c_i \\in \\{0, \\dots, n_i - 1\\}`,
the position of the value among the attribute's labels (:meth:`hdmm.Domain.values`).  A column is
read as value labels, or as codes with ``codes=True``; a numeric column is taken for codes without
being told only when that cannot be mistaken for labels (the attribute has no labels, or only
string labels none of which spells a number: :func:`reads_numbers_as_codes`).  Labels that spell
numbers, such as region numbers ``"1", ..., "9"`` or FIPS codes ``"01", ..., "56"``, come back as
numbers from a CSV file, where they cannot be told from codes: such a column is read as labels
when only that reading fits, as codes when only that one does and no value names another label,
and refused (:class:`AmbiguousColumnError`) when both fit and they disagree.

Every bad value is refused with one error naming the column and the fix.  With ``private=True``
an error says how many records hold a bad value, never the values or the rows (for data whose
values must not reach a log).  :mod:`hdmm.records` combines the columns into cell indices.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from .validation import PREVIEW_LIMIT, preview

__all__ = ["AmbiguousColumnError", "Schema", "column_codes", "reads_numbers_as_codes"]


# The text of a number as pandas.read_csv parses it: "7", "-3", "07", "1.5", ".5", "2e3".
_NUMBER_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


class Schema(Protocol):
    """What reading records needs of a domain (:class:`hdmm.Domain` is one)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def size(self) -> int: ...

    def __getitem__(self, attr: str | int) -> int: ...

    def index(self, attr: str | int) -> int: ...

    def values(self, attr: str | int) -> tuple[Any, ...]: ...

    def has_labels(self, attr: str | int) -> bool: ...


class AmbiguousColumnError(ValueError):
    """A numeric column that reads as value labels and as codes, with different counts.

    Raised by :meth:`hdmm.Domain.vectorize` for an attribute whose string labels spell numbers
    (``"1", ..., "9"``) when the column's numbers are all labels and all codes but would
    be counted in different cells (the number 3 is the label ``"3"``, code 2, and also
    code 3, label ``"4"``).

    Attributes
    ----------
    attribute : str
        The attribute (column) name.
    """

    def __init__(self, message: str, attribute: str) -> None:
        super().__init__(message)
        self.attribute = attribute


def _spelled_number(label: Any) -> float | None:
    """The number a string label spells (``"07"`` -> 7.0), or None for other labels."""
    if isinstance(label, str) and _NUMBER_TEXT.fullmatch(label):
        number = float(label)
        return number if math.isfinite(number) else None
    return None


def reads_numbers_as_codes(domain: Schema, attr: str | int) -> bool:
    """Whether :meth:`hdmm.Domain.vectorize` reads any numeric column of this attribute as codes.

    True when the attribute has no value labels (its labels are its codes) or when
    all its labels are strings none of which spells a number (``"M"``, ``"0-4"``):
    then no number can be one of its labels.  False otherwise:

    * some label is a number (int, float or bool): a numeric column is matched
      against the labels, since reading it as codes could count the wrong cells;
    * the labels are strings and some spell numbers (``"1"``, ``"07"``, ``"2.5"``):
      a CSV reader returns those as numbers, so a numeric column is read by the
      rule of :meth:`hdmm.Domain.vectorize` (labels, codes, or refused as ambiguous).

    >>> from hdmm import Domain
    >>> d = Domain(["sex", "region"], [2, 3], {"sex": ["M", "F"], "region": ["1", "2", "3"]})
    >>> reads_numbers_as_codes(d, "sex"), reads_numbers_as_codes(d, "region")
    (True, False)
    """
    if not domain.has_labels(attr):
        return True
    return all(isinstance(v, str) and _spelled_number(v) is None for v in domain.values(attr))


class _Private:
    """How errors report bad values with ``private=True``: the number of records only."""

    def __init__(self, rows: int, counts: Any = None) -> None:
        self.counts = None if counts is None else np.asarray(counts, dtype=float).reshape(rows)

    def records(self, mask: np.ndarray) -> int:
        """The number of records of the rows in ``mask``."""
        return int(mask.sum()) if self.counts is None else int(self.counts[mask].sum())


def _shown(values: np.ndarray | None, mask: np.ndarray, private: _Private | None) -> str:
    """Bad values of a column for an error message: a preview of the distinct ``values[mask]``, or with
    ``private`` only how many records hold them (the values come from the data)."""
    if private:
        return f"<{private.records(mask):,} records; values not shown: private>"
    return preview(np.unique(values[mask]))


def _raise_missing(column: pd.Series, name: str, private: _Private | None = None) -> None:
    """Raise the error for a column with missing values (``private``: without the rows)."""
    na = column.isna().to_numpy()
    count = private.records(na) if private else int(na.sum())
    rows = "" if private else f", e.g. in rows {preview(column.index[na])}"
    raise ValueError(
        f"column {name!r} has {count} missing value(s) (NaN/None){rows}; drop or impute them first"
    )


def column_codes(domain: Schema, df: pd.DataFrame, name: str, codes: bool, private: bool = False,
                 counts: Any = None) -> np.ndarray:
    """Codes of the values in ``df[name]`` for attribute ``name``, validated (any integer dtype).

    ``codes``: the column holds codes ``0..n-1`` rather than value labels.  ``private``: errors
    count records instead of showing values or rows; ``counts`` (one per row) says how many
    records each row stands for in those counts.  The reading rule is
    :meth:`hdmm.Domain.vectorize`'s (``codes``).

    >>> from hdmm import Domain
    >>> d = Domain(["sex"], [2], {"sex": ["M", "F"]})
    >>> column_codes(d, pd.DataFrame({"sex": ["F", "M", "F"]}), "sex", codes=False).tolist()
    [1, 0, 1]
    """
    report = _Private(len(df), counts) if private else None
    column = df[name]
    if isinstance(column, pd.DataFrame):
        raise ValueError(f"DataFrame has {column.shape[1]} columns named {name!r}; keep one")
    n = domain[name]
    dtype = column.dtype
    labels_like = isinstance(dtype, (pd.CategoricalDtype, pd.StringDtype))
    numeric = dtype.kind in "iufb" and not labels_like
    if numeric and (codes or reads_numbers_as_codes(domain, name)):
        return _numeric_codes(domain, column, name, n, codes, report)
    if numeric and all(isinstance(v, str) for v in domain.values(name)):
        return _spelled_codes(domain.values(name), column, name, n, report)
    if numeric or labels_like or dtype.kind == "O":
        return _label_codes(domain, column, name, codes, report)
    raise ValueError(
        f"column {name!r} has dtype {dtype}, which is neither numeric codes "
        "nor labels; convert it to int codes 0..n-1 or to object/string/category labels"
    )


def _numeric_codes(domain: Schema, column: pd.Series, name: str, n: int, codes: bool,
                   private: _Private | None = None) -> np.ndarray:
    """Validate a numeric column of codes in ``[0, n)``."""
    if column.hasnans:
        _raise_missing(column, name, private)
    values = column.to_numpy(dtype=getattr(column.dtype, "numpy_dtype", column.dtype))
    if values.dtype.kind == "f":
        fractional = values != np.floor(values)
        if fractional.any():
            raise ValueError(
                f"column {name!r} holds non-integer numbers {_shown(values, fractional, private)}; "
                f"codes must be whole numbers in [0, {n})"
            )
    if values.size and (values.min() < 0 or values.max() >= n):
        bad = (values < 0) | (values >= n)
        if codes and domain.has_labels(name):
            fix = (
                "; with codes=True columns hold codes, so to pass value labels "
                "call vectorize without codes=True"
            )
        else:
            fix = "; recode or drop those rows"
        raise ValueError(
            f"column {name!r} holds codes {_shown(values, bad, private)} outside "
            f"[0, {n}) (attribute {name!r} has size {n}){fix}"
        )
    if values.dtype.kind == "f" or not np.can_cast(values.dtype, np.intp, "safe"):
        return values.astype(np.intp)
    return values


def _spelled_codes(labels: Sequence[Any], column: pd.Series, name: str, n: int, private: _Private | None = None
                   ) -> np.ndarray:
    """Codes of a numeric column whose attribute has string labels spelling numbers.

    The rule is in :meth:`hdmm.Domain.vectorize` (``codes``): each distinct value is looked up
    as the label spelling the same number and as a code, and the column is read the
    one way that fits, or refused.
    """
    if column.hasnans:
        _raise_missing(column, name, private)
    values = column.to_numpy(dtype=getattr(column.dtype, "numpy_dtype", column.dtype))
    if values.dtype.kind == "b":
        values = values.astype(np.intp)
    record_codes, distinct = pd.factorize(values)
    distinct = np.asarray(distinct, dtype=np.float64)
    spelled: dict[float, int] = {}
    twice: set[float] = set()
    for code, label in enumerate(labels):
        number = _spelled_number(label)
        if number is None:
            continue
        if number in spelled:
            twice.add(number)
        else:
            spelled[number] = code
    as_label = np.array([-1 if v in twice else spelled.get(float(v), -1) for v in distinct], dtype=np.intp)
    whole = np.isfinite(distinct) & (distinct == np.floor(distinct))
    as_code = np.where(whole & (distinct >= 0) & (distinct < n), distinct, -1).astype(np.intp)
    label_ok, code_ok = as_label >= 0, as_code >= 0
    clash = label_ok & code_ok & (as_label != as_code)
    doubled = np.array([v in twice for v in distinct], dtype=bool)
    if label_ok.all() and not (code_ok.all() and clash.any()):
        return as_label[record_codes]
    if code_ok.all() and not clash.any() and not doubled.any():
        return as_code[record_codes]

    def show(k: int) -> str:
        if private:
            return _shown(None, record_codes == k, private)
        number = distinct[k]
        return str(int(number)) if whole[k] else repr(float(number))

    fix = (
        f"say which: cast the column to text to match each value to the label of the same text "
        f"(pandas: df.astype({{{name!r}: str}}), or pd.read_csv(..., dtype={{{name!r}: str}}) to keep "
        f"leading zeros), or pass codes=True if it holds codes 0..{n - 1}"
    )
    if doubled.any():
        k = int(np.flatnonzero(doubled)[0])
        spelling = "" if private else f" ({preview(v for v in labels if _spelled_number(v) == distinct[k])})"
        raise ValueError(
            f"column {name!r} holds the number {show(k)}, which several labels of attribute "
            f"{name!r} spell{spelling}; "
            f"read the column as text (pd.read_csv(..., dtype={{{name!r}: str}})) so that each value "
            "is matched to one label exactly"
        )
    neither = ~label_ok & ~code_ok
    if neither.any():
        bad = [show(k) for k in np.flatnonzero(neither)]
        listed = f"[{', '.join(bad[:PREVIEW_LIMIT])}{', ...' if len(bad) > PREVIEW_LIMIT else ''}]"
        if private:
            listed = _shown(None, neither[record_codes], private)
        raise ValueError(
            f"column {name!r} holds values {listed} "
            f"that are neither labels of attribute {name!r} ({preview(labels)}) nor codes 0..{n - 1}; "
            "recode or drop those rows"
        )
    if clash.any():
        k = int(np.flatnonzero(clash)[0])
        example = "" if private else (f" (the value {show(k)} is the label {labels[as_label[k]]!r}, and also "
                                      f"code {as_code[k]}, the label {labels[as_code[k]]!r})")
        raise AmbiguousColumnError(
            f"column {name!r} is ambiguous: the attribute's labels spell numbers "
            f"({preview(labels)}), and its values read both as labels and as codes but count "
            f"different cells{example}; {fix}",
            name,
        )
    only_label = [show(k) for k in np.flatnonzero(~code_ok)]
    only_code = [show(k) for k in np.flatnonzero(~label_ok)]
    if private:
        only_label = [_shown(None, ~code_ok[record_codes], private)[1:-1]]
        only_code = [_shown(None, ~label_ok[record_codes], private)[1:-1]]
    raise ValueError(
        f"column {name!r} mixes values that are only labels of attribute {name!r} "
        f"([{', '.join(only_label[:PREVIEW_LIMIT])}], not codes 0..{n - 1}) with values that are only codes "
        f"([{', '.join(only_code[:PREVIEW_LIMIT])}], no label {preview(labels)} spells them); "
        "recode the column to one of the two"
    )


def _label_codes(domain: Schema, column: pd.Series, name: str, codes: bool, private: _Private | None = None
                 ) -> np.ndarray:
    """Map a column of value labels (or, with ``codes``, of codes) to codes.

    Only the column's distinct values are looked up: a category column's
    categories, or otherwise the result of one hash pass (``pandas.factorize``).
    """
    categorical = isinstance(column.dtype, pd.CategoricalDtype)
    if categorical:
        record_codes = column.cat.codes.to_numpy()
        distinct = column.cat.categories
    else:
        record_codes, distinct = pd.factorize(column, use_na_sentinel=True)
    if record_codes.size and record_codes.min() < 0:
        _raise_missing(column, name, private)
    n = domain[name]
    wanted = range(n) if codes else domain.values(name)
    distinct = np.asarray(distinct, dtype=object)
    mapping = pd.Index(wanted, dtype=object).get_indexer(pd.Index(distinct, dtype=object))
    unknown = mapping < 0
    if categorical and unknown.any():  # unused categories do no harm
        unknown &= np.bincount(record_codes, minlength=mapping.size) > 0
    if unknown.any():
        raise ValueError(
            f"column {name!r} holds unknown values "
            f"{_shown(None, unknown[record_codes], private) if private else preview(distinct[unknown])} for "
            f"attribute {name!r}; {_expected_values(domain, name, codes, distinct[unknown])}"
        )
    if np.array_equal(mapping, np.arange(mapping.size)):
        return record_codes
    return mapping[record_codes]


def _expected_values(domain: Schema, name: str, codes: bool, unknown: np.ndarray) -> str:
    """What the values of a column should be, and how to fix it, for an error message."""
    n = domain[name]
    if codes:
        return (
            f"with codes=True values must be codes 0..{n - 1}; to pass value labels "
            "call vectorize without codes=True"
        )
    if not domain.has_labels(name):
        return f"it has no value labels, so values must be codes 0..{n - 1}"
    hint = ""
    if all(isinstance(v, numbers.Integral) and 0 <= v < n for v in unknown):
        hint = "; if the column holds codes 0..n-1 rather than labels, pass codes=True"
    return (
        f"its labels are {preview(domain.values(name))}; map those values to labels "
        f"or drop their rows{hint}"
    )
