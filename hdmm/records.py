"""Records and data vectors: records -> cell indices -> a histogram over the domain, and back.

A domain with attributes :math:`A_1, \\dots, A_d` of sizes :math:`n_1, \\dots, n_d` numbers its
cells in C order (row-major, :class:`hdmm.Domain`), so a record whose values have the codes
:math:`c_1, \\dots, c_d` (:mod:`hdmm.columns` reads each column into codes) falls into cell

.. math::

    j = \\sum_{i=1}^{d} c_i \\prod_{k > i} n_k ,

which :func:`cell_index` computes for every record by Horner's rule over the columns.  The
*data vector* :math:`x \\in \\mathbb{R}^N` counts the records of each cell (:func:`vectorize`,
also :meth:`hdmm.Domain.vectorize`), and :func:`to_records` expands :math:`x` back into records,
so ``vectorize(domain, to_records(domain, x)) == x``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .columns import Schema, column_codes
from .validation import preview

__all__ = ["MAX_DENSE_CELLS", "cell_index", "to_records", "vectorize"]

#: Largest domain (in cells) for which :func:`vectorize` builds a dense
#: data vector.  2**31 float64 cells already take 16 GiB of memory.
MAX_DENSE_CELLS: int = 2**31


def vectorize(domain: Schema, df: pd.DataFrame, *, codes: bool = False, stacklevel: int = 2) -> np.ndarray:
    """The data vector of record counts.

    Each record with codes :math:`(c_1, \\dots, c_d)` adds one to cell
    :math:`j = \\sum_i c_i \\prod_{k>i} n_k` (C order), so

    .. math::

        x_j = \\#\\{\\text{records in cell } j\\}, \\qquad \\sum_j x_j = \\#\\text{records}.

    Parameters
    ----------
    df : pandas.DataFrame
        One row per record, with one column per attribute.  Columns that are
        not attributes are ignored, so the data of a larger domain can be
        vectorized over a projection (:meth:`hdmm.Domain.project`).
    codes : bool, default False
        How column values are read:

        * ``False``: as value labels, matched against :meth:`hdmm.Domain.values` (for an
          attribute without labels those are the codes ``0..n-1``).  A text,
          object or category column is matched exactly.  A numeric column (int,
          uint, bool, or floats that are whole numbers) is read as follows:

          - attribute without labels, or whose labels are strings none of which
            spells a number (``"M"``, ``"0-4"``): as codes, since none of its
            values can be a label (see :func:`hdmm.columns.reads_numbers_as_codes`);
          - attribute with numeric labels, e.g. years ``[2020, 2021]`` or sizes
            ``[1, 2, 3]``: matched against the labels, never guessed to be codes;
          - attribute with string labels that spell numbers, e.g. regions
            ``["1", ..., "9"]`` or FIPS codes ``["01", ..., "56"]`` (what a CSV
            reader turns into numbers): each value stands for the label that
            spells the same number (7 for ``"07"``) or for the code it equals.
            The column is read as labels when every value is a label and either
            some value is no code or both readings agree (labels ``"0"..."8"``
            of codes 0..8); as codes when every value is a code, some value is
            no label, and no value is the label of another cell (the top-coded
            ages ``"0", ..., "113", "114 and over"`` read from the numbers
            0..114).  Otherwise it is refused: :class:`AmbiguousColumnError`
            when some value is both a label and a code of different cells
            (the number 3 in ``["1", ..., "9"]``), a ``ValueError`` when values
            fit neither reading.  A statistician would not guess here: counting
            3 in the cell of label ``"4"`` shifts every count silently.  Say
            which reading is meant: cast the column to text
            (``df.astype({name: str})``, or ``pandas.read_csv(...,
            dtype={name: str})`` to keep leading zeros) to match labels
            exactly, or pass ``codes=True``.
        * ``True``: every column holds codes ``0..n-1`` (numeric, or
          object/category columns of ints), whatever the labels.

    stacklevel : int, default 2
        Where the warning for an empty ``df`` points (2: the caller of this function; a wrapper
        such as :meth:`hdmm.Domain.vectorize` passes 3 so that it points at its own caller).

    Returns
    -------
    numpy.ndarray
        float64 vector of length ``domain.size``; :func:`to_records` is its inverse.

    Raises
    ------
    ValueError
        If a column is missing or duplicated, holds missing values (NaN/None),
        codes outside ``[0, n)``, non-integer numbers or unknown labels, or if
        the domain has more than :data:`MAX_DENSE_CELLS` cells.  The message
        names the attribute and how to fix the data.
    AmbiguousColumnError
        A ``ValueError`` for a numeric column that reads as labels and as codes
        with different counts (see ``codes``).

    Warns
    -----
    UserWarning
        If ``df`` has no rows: the data vector is all zeros, and a release of it
        would publish noise only.

    Notes
    -----
    Runs in time and memory linear in the number of records: one pass per
    column builds the flat cell index in place (Horner's rule over the
    attributes) and ``numpy.bincount`` counts it.  Category columns whose
    categories are the attribute's labels in order are used without a lookup.

    Examples
    --------
    >>> from hdmm import Domain
    >>> d = Domain(["size", "sex"], [3, 2], {"size": [1, 2, 3], "sex": ["M", "F"]})
    >>> df = pd.DataFrame({"size": [1, 3], "sex": [0, 1]})  # size holds labels here
    >>> vectorize(d, df).tolist()
    [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    >>> vectorize(d, pd.DataFrame({"size": [0, 2], "sex": [0, 1]}), codes=True).tolist()
    [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]

    Labels that spell numbers: 9 can only be the label ``"9"``, while 1 and 2 alone
    could be labels or codes.

    >>> r = Domain(["region"], [9], {"region": [str(k) for k in range(1, 10)]})
    >>> vectorize(r, pd.DataFrame({"region": [1, 2, 9]})).tolist()
    [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    >>> vectorize(r, pd.DataFrame({"region": [1, 2]}))
    Traceback (most recent call last):
    ...
    hdmm.columns.AmbiguousColumnError: column 'region' is ambiguous: ...
    >>> vectorize(r, pd.DataFrame({"region": ["1", "2"]})).tolist()[:3]
    [1.0, 1.0, 0.0]
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"vectorize expects a pandas DataFrame, got {type(df).__name__}")
    if not isinstance(codes, (bool, np.bool_)):
        raise TypeError(f"codes must be True or False, got {codes!r}")
    if domain.size > MAX_DENSE_CELLS:
        raise ValueError(
            f"the domain {domain!r} has {domain.size} cells, more than the "
            f"{MAX_DENSE_CELLS} a dense data vector can hold; vectorize a "
            "projection onto fewer attributes (Domain.project) instead"
        )
    missing = [n for n in domain.names if n not in df.columns]
    if missing:
        raise ValueError(
            f"DataFrame has no column for attribute(s) {missing}; its columns are "
            f"{list(df.columns)}{_rename_hint(missing, df.columns)}; rename the columns "
            "to the attribute names, or vectorize over a projection without the "
            "missing attributes (Domain.project)"
        )
    if len(df) == 0:
        warnings.warn(
            "vectorize: the DataFrame has no records, so every count is 0 and a release of "
            "it would publish noise only; check that the right data was read",
            UserWarning,
            stacklevel=stacklevel,
        )
    return np.bincount(cell_index(domain, df, codes=codes), minlength=domain.size).astype(np.float64)


def cell_index(domain: Schema, df: pd.DataFrame, *, codes: bool = False, private: bool = False,
               counts: Any = None) -> np.ndarray:
    """The flat cell of each record (C order), read as :func:`vectorize` reads the columns.

    ``private=True``: an error names how many records hold a bad value, never the values or
    the rows (for data whose values must not reach a log, e.g. a geography release). With
    ``counts`` (one per row) each row stands for that many records (distinct values and their
    counts), for those messages.

    What :func:`vectorize` counts: ``np.bincount(cell_index(dom, df), minlength=dom.size)``.
    Used to split records by another column (e.g. a geography unit) before counting.

    >>> from hdmm import Domain
    >>> cell_index(Domain(["sex", "age"], [2, 3]), pd.DataFrame({"sex": [0, 1], "age": [2, 0]})).tolist()
    [2, 3]
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"cell_index expects a pandas DataFrame, got {type(df).__name__}")
    missing = [n for n in domain.names if n not in df.columns]
    if missing:
        raise ValueError(
            f"DataFrame has no column for attribute(s) {missing}; its columns are "
            f"{list(df.columns)}{_rename_hint(missing, df.columns)}; rename the columns to the attribute names"
        )
    flat = np.zeros(len(df), dtype=np.intp)
    for name, n in zip(domain.names, domain.shape):
        flat *= n
        flat += column_codes(domain, df, name, bool(codes), private=bool(private), counts=counts)
    return flat


def to_records(domain: Schema, x: Any, *, codes: bool = False) -> pd.DataFrame:
    """The records counted by a data vector: the inverse of :func:`vectorize`.

    Cell :math:`j` becomes :math:`x_j` identical rows, in cell order, so
    ``vectorize(domain, to_records(domain, x), codes=codes)`` equals ``x``.

    Parameters
    ----------
    x : array_like
        Counts, of shape ``(domain.size,)``: whole, non-negative and finite numbers
        (a noisy estimate must be rounded and clipped first, e.g.
        ``np.clip(np.rint(x), 0, None)``).
    codes : bool, default False
        ``False``: a column of value labels per attribute, as a pandas
        Categorical whose categories are :meth:`hdmm.Domain.values` for attributes with
        labels, and integer codes (which are their labels) otherwise.
        ``True``: integer codes ``0..n-1`` for every attribute.

    Returns
    -------
    pandas.DataFrame
        ``int(sum(x))`` rows, one column per attribute, compact dtypes.

    Raises
    ------
    ValueError
        If ``x`` has the wrong shape or holds negative, fractional or
        non-finite counts.

    Examples
    --------
    >>> from hdmm import Domain
    >>> d = Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]})
    >>> to_records(d, [0, 2, 0, 0, 0, 1]).to_dict("list")
    {'sex': ['M', 'M', 'F'], 'age': [1, 1, 2]}
    """
    if not isinstance(codes, (bool, np.bool_)):
        raise TypeError(f"codes must be True or False, got {codes!r}")
    counts = _as_counts(x, domain.size)
    cells = np.flatnonzero(counts)
    repeats = counts[cells]
    cell_codes = np.unravel_index(cells, domain.shape) if domain.names else ()
    columns: dict[str, Any] = {}
    for name, n, c in zip(domain.names, domain.shape, cell_codes):
        if domain.has_labels(name) and not codes:
            columns[name] = pd.Categorical.from_codes(
                np.repeat(c.astype(np.min_scalar_type(-n)), repeats),
                categories=pd.Index(domain.values(name), dtype=object),
                validate=False,
            )
        else:
            columns[name] = np.repeat(c.astype(np.min_scalar_type(n - 1)), repeats)
    return pd.DataFrame(columns, index=pd.RangeIndex(int(repeats.sum())))


def _rename_hint(missing: Sequence[str], columns: pd.Index) -> str:
    """Suggest existing columns whose names differ only in case from missing attributes."""
    by_lower = {str(c).lower(): c for c in columns}
    pairs = {c: m for m in missing if (c := by_lower.get(m.lower())) is not None}
    return f" (to rename: df.rename(columns={pairs!r}))" if pairs else ""


def _as_counts(x: Any, size: int) -> np.ndarray:
    """Validate a data vector of record counts and return it as int64."""
    counts = np.asarray(x)
    if counts.shape != (size,):
        raise ValueError(
            f"x has shape {counts.shape} but the domain has {size} cells; pass a vector "
            f"of shape ({size},) (use x.ravel() for a tensor of the domain's shape)"
        )
    if counts.dtype.kind not in "iufb":
        raise TypeError(f"x must hold numbers, got dtype {counts.dtype}")
    bad = counts < 0
    if counts.dtype.kind == "f":
        bad |= ~np.isfinite(counts) | (counts != np.floor(counts))
    if bad.any():
        cells = np.flatnonzero(bad)
        raise ValueError(
            f"x holds counts {preview(counts[cells])} in cells {preview(cells)} that are "
            "not whole non-negative numbers; round and clip a noisy estimate first, "
            "e.g. np.clip(np.rint(x), 0, None)"
        )
    return counts.astype(np.int64, copy=False)
