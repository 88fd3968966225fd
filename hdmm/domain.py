"""The data domain: a finite grid of attribute values.

A domain with attributes :math:`A_1, \\dots, A_d` of sizes :math:`n_1, \\dots, n_d`
is the Cartesian product :math:`[n_1] \\times \\dots \\times [n_d]` with
:math:`N = \\prod_i n_i` cells.  A data set over the domain is summarised by its
*data vector* :math:`x \\in \\mathbb{R}^N`, where :math:`x_j` counts the records
falling into cell :math:`j`.  Cells are numbered in C order (row-major), so the
first attribute is the most significant digit:

.. math::

    j = \\sum_{i=1}^{d} c_i \\prod_{k > i} n_k ,

where :math:`c_i \\in \\{0, \\dots, n_i - 1\\}` is the code of the record's value
of attribute :math:`A_i`.  This matches ``numpy.ravel_multi_index`` and the
Kronecker-product structure of the workloads (the leftmost Kronecker factor
acts on the first attribute).

Records and data vectors: :meth:`Domain.vectorize` counts the records of a
DataFrame into :math:`x`, and :meth:`Domain.records` expands :math:`x` back into
records, so ``domain.vectorize(domain.records(x)) == x``.  A column is read as
value labels, or as codes with ``codes=True``; a numeric column is taken for
codes without being told only when that cannot be mistaken for labels (the
attribute has no labels, or only string labels none of which spells a number).
Labels that spell numbers, such as region numbers ``"1", ..., "9"`` or FIPS codes
``"01", ..., "56"``, come back as numbers from a CSV file, where they cannot be told
from codes: :meth:`Domain.vectorize` reads such a column as labels when only that
reading fits, as codes when only that one does and no value names another label,
and refuses it (:class:`AmbiguousColumnError`) when both fit and they disagree.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any

import numpy as np
import pandas as pd

from .files import replace_atomically

__all__ = ["AmbiguousColumnError", "Domain", "MAX_DENSE_CELLS"]

#: Largest domain (in cells) for which :meth:`Domain.vectorize` builds a dense
#: data vector.  2**31 float64 cells already take 16 GiB of memory.
MAX_DENSE_CELLS: int = 2**31

# How many offending values an error message shows.
_SHOW = 5

# A value label: a JSON scalar (str, int, bool or finite float).
Label = str | int | float


# The text of a number as pandas.read_csv parses it: "7", "-3", "07", "1.5", ".5", "2e3".
_NUMBER_TEXT = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?\s*")


class AmbiguousColumnError(ValueError):
    """A numeric column that reads as value labels and as codes, with different counts.

    Raised by :meth:`Domain.vectorize` for an attribute whose string labels spell numbers
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


def _preview(values: Iterable[Any]) -> str:
    """Format up to ``_SHOW`` values for an error message."""
    shown = []
    for i, v in enumerate(values):
        if i == _SHOW:
            shown.append("...")
            break
        shown.append(repr(v.item() if isinstance(v, np.generic) else v))
    return "[" + ", ".join(shown) + "]"


def _duplicates(items: Iterable[Any]) -> list[Any]:
    """The items that occur more than once (each listed once, in order of first repeat)."""
    seen: set[Any] = set()
    repeated: dict[Any, None] = {}  # an insertion-ordered set
    for item in items:
        if item in seen:
            repeated[item] = None
        seen.add(item)
    return list(repeated)


def _as_size(name: str, size: Any) -> int:
    """Validate one attribute size and return it as a Python int."""
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, numbers.Integral):
        raise TypeError(
            f"size of attribute {name!r} must be a positive int, "
            f"got {size!r} of type {type(size).__name__}"
        )
    if size < 1:
        raise ValueError(f"size of attribute {name!r} must be a positive int, got {size}")
    return int(size)


def _as_label(name: str, label: Any) -> Label:
    """Validate one value label; numpy scalars become Python scalars."""
    if isinstance(label, np.generic):
        label = label.item()
    if isinstance(label, float) and not math.isfinite(label):
        raise ValueError(f"value labels of attribute {name!r} must be finite, got {label!r}")
    if not isinstance(label, (str, int, float)):
        raise TypeError(
            f"value labels of attribute {name!r} must be str, int or float "
            f"(so that the domain can be saved as JSON), got {label!r} "
            f"of type {type(label).__name__}"
        )
    return label


def _as_labels(name: str, labels: Any) -> tuple[Label, ...]:
    """Validate the value labels of one attribute: an ordered, duplicate-free sequence."""
    if isinstance(labels, (str, bytes)):
        raise TypeError(
            f"value labels of attribute {name!r} must be a list of labels, got the "
            f"string {labels!r}; write e.g. {list(str(labels))!r} to mean one label "
            "per character"
        )
    if isinstance(labels, (Set, Mapping)) or not isinstance(labels, Iterable):
        raise TypeError(
            f"value labels of attribute {name!r} must be an ordered sequence "
            f"(list, tuple, array), got {type(labels).__name__}"
        )
    result = tuple(_as_label(name, v) for v in labels)
    duplicates = _duplicates(result)
    if duplicates:
        raise ValueError(
            f"value labels of attribute {name!r} must be unique, got duplicates "
            f"{_preview(duplicates)} (note that 1, 1.0 and True count as equal)"
        )
    return result


class Domain:
    """A finite, ordered product of named attributes.

    Parameters
    ----------
    names : sequence of str
        Attribute names, unique and non-empty, in significance order (the first
        attribute is the most significant digit of the cell index).
    sizes : sequence of int
        Number of values :math:`n_i \\ge 1` of each attribute.
    values : mapping of str to sequence, optional
        Value labels for some (or all) attributes: ``values[name][c]`` is the
        label of code ``c``.  Labels must be unique str/int/float scalars and
        there must be exactly ``n_i`` of them.  Attributes without labels use
        the codes ``0, ..., n_i - 1`` as labels.

    Notes
    -----
    The domain has :math:`N = \\prod_i n_i` cells (see :attr:`size`).  Domains
    are immutable and hashable; two domains are equal when names, sizes and
    labels all agree.

    Examples
    --------
    >>> d = Domain(["sex", "age"], [2, 115], values={"sex": ["M", "F"]})
    >>> d
    Domain(sex=2, age=115)
    >>> d.size, d["age"], d.values("sex")
    (230, 115, ('M', 'F'))
    """

    __slots__ = ("_names", "_shape", "_labels", "_position")

    def __init__(
        self,
        names: Sequence[str],
        sizes: Sequence[int],
        values: Mapping[str, Sequence[Label]] | None = None,
    ) -> None:
        if isinstance(names, str):
            raise TypeError(
                f"names must be a sequence of attribute names, got the string {names!r}; "
                f"write [{names!r}] for a single attribute"
            )
        names = tuple(names)
        if isinstance(sizes, (int, np.integer)):
            raise TypeError(
                f"sizes must be a sequence of ints, got the single int {sizes!r}; "
                f"write [{sizes!r}] for a single attribute"
            )
        sizes = tuple(sizes)
        for name in names:
            if not isinstance(name, str) or not name:
                raise TypeError(f"attribute names must be non-empty strings, got {name!r}")
        duplicates = _duplicates(names)
        if duplicates:
            raise ValueError(f"attribute names must be unique, got duplicates {duplicates}")
        if len(sizes) != len(names):
            raise ValueError(
                f"got {len(names)} attribute names but {len(sizes)} sizes; "
                "pass one size per name"
            )
        self._names: tuple[str, ...] = names
        self._shape: tuple[int, ...] = tuple(_as_size(n, s) for n, s in zip(names, sizes))
        self._position: dict[str, int] = {n: i for i, n in enumerate(names)}

        labels: dict[str, tuple[Label, ...]] = {}
        if values is not None:
            if not isinstance(values, Mapping):
                raise TypeError(
                    "values must be a mapping from attribute name to its value labels, "
                    f"got {type(values).__name__}"
                )
            unknown = [k for k in values if k not in self._position]
            if unknown:
                raise ValueError(
                    f"values given for unknown attributes {unknown}; "
                    f"the attributes are {list(names)}"
                )
            for name in names:  # store in domain order so equality ignores mapping order
                if name not in values:
                    continue
                lab = _as_labels(name, values[name])
                size = self._shape[self._position[name]]
                if len(lab) != size:
                    raise ValueError(
                        f"attribute {name!r} has size {size} but {len(lab)} value labels "
                        "were given; pass exactly one label per value"
                    )
                labels[name] = lab
        self._labels: dict[str, tuple[Label, ...]] = labels

    # ------------------------------------------------------------------ basics
    @property
    def names(self) -> tuple[str, ...]:
        """Attribute names, in order."""
        return self._names

    @property
    def shape(self) -> tuple[int, ...]:
        """Attribute sizes :math:`(n_1, \\dots, n_d)`, in order."""
        return self._shape

    @property
    def size(self) -> int:
        """Number of cells :math:`N = \\prod_i n_i` (an exact Python int)."""
        return math.prod(self._shape)

    def __len__(self) -> int:
        """Number of attributes :math:`d`."""
        return len(self._names)

    def __iter__(self) -> Iterator[str]:
        """Iterate over the attribute names."""
        return iter(self._names)

    def __getitem__(self, attr: str | int) -> int:
        """Size of an attribute given by name or position."""
        return self._shape[self.index(attr)]

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is an attribute name of this domain."""
        return isinstance(name, str) and name in self._position

    def index(self, attr: str | int) -> int:
        """Position of an attribute.

        Parameters
        ----------
        attr : str or int
            An attribute name, or a position (negative positions count from the
            end, as for Python sequences).

        Returns
        -------
        int
            The position in ``0, ..., len(self) - 1``.

        Raises
        ------
        KeyError
            If ``attr`` is a name that is not in the domain.
        IndexError
            If ``attr`` is a position out of range.
        """
        if isinstance(attr, str):
            try:
                return self._position[attr]
            except KeyError:
                raise KeyError(
                    f"unknown attribute {attr!r}; the attributes are {list(self._names)}"
                ) from None
        if isinstance(attr, (bool, np.bool_)) or not isinstance(attr, numbers.Integral):
            raise TypeError(
                f"attributes are given by name (str) or position (int), got {attr!r} "
                f"of type {type(attr).__name__}"
            )
        d = len(self._names)
        if not -d <= attr < d:
            raise IndexError(
                f"attribute position {attr} is out of range for a domain with {d} "
                f"attributes {list(self._names)}"
            )
        return int(attr) % d

    def indices(self, attrs: Sequence[str | int]) -> tuple[int, ...]:
        """Positions of several attributes (see :meth:`index`), in the order given.

        Raises
        ------
        ValueError
            If an attribute is listed twice.
        """
        if isinstance(attrs, (str, numbers.Integral)):
            raise TypeError(
                f"indices expects a sequence of attributes, got {attrs!r}; "
                f"write [{attrs!r}] for a single attribute"
            )
        result = tuple(self.index(a) for a in attrs)
        duplicates = _duplicates(result)
        if duplicates:
            raise ValueError(
                f"attributes {[self._names[i] for i in duplicates]} are listed more than once"
            )
        return result

    def values(self, attr: str | int) -> tuple[Label, ...]:
        """Value labels of an attribute: its labels, or the codes ``0..n-1``."""
        i = self.index(attr)
        name = self._names[i]
        if name in self._labels:
            return self._labels[name]
        return tuple(range(self._shape[i]))

    def has_labels(self, attr: str | int) -> bool:
        """Whether value labels were given for the attribute."""
        return self._names[self.index(attr)] in self._labels

    def project(self, attrs: Sequence[str | int]) -> Domain:
        """The sub-domain on the given attributes, kept in this domain's order.

        The projection onto attributes :math:`S` has
        :math:`\\prod_{i \\in S} n_i` cells; labels are carried over.

        Examples
        --------
        >>> Domain(["a", "b", "c"], [2, 3, 4]).project(["c", "a"])
        Domain(a=2, c=4)
        """
        keep = sorted(self.indices(attrs))
        names = [self._names[i] for i in keep]
        return Domain(
            names,
            [self._shape[i] for i in keep],
            {n: self._labels[n] for n in names if n in self._labels},
        )

    def cell(self, index: int) -> dict[str, Label]:
        """The value labels of the cell with the given flat index.

        Inverts the C-order numbering :math:`j = \\sum_i c_i \\prod_{k>i} n_k`
        by repeated division (exact for domains of any size).

        Examples
        --------
        >>> Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]}).cell(4)
        {'sex': 'F', 'age': 1}
        """
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral):
            raise TypeError(f"cell index must be an int, got {index!r}")
        if not 0 <= index < self.size:
            raise IndexError(f"cell index {index} is out of range [0, {self.size})")
        rest = int(index)
        codes = []
        for n in reversed(self._shape):
            rest, c = divmod(rest, n)
            codes.append(c)
        codes.reverse()
        return {
            name: (self._labels[name][c] if name in self._labels else c)
            for name, c in zip(self._names, codes)
        }

    # --------------------------------------------------------- identity
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Domain):
            return NotImplemented
        return (
            self._names == other._names
            and self._shape == other._shape
            and self._labels == other._labels
        )

    def __hash__(self) -> int:
        return hash((self._names, self._shape, tuple(self._labels.items())))

    def __repr__(self) -> str:
        parts = [
            f"{n if n.isidentifier() else repr(n)}={s}" for n, s in zip(self._names, self._shape)
        ]
        return f"Domain({', '.join(parts)})"

    # ---------------------------------------------------- serialisation
    @classmethod
    def from_dict(cls, d: Mapping[str, int | Sequence[Label]]) -> Domain:
        """Build a domain from ``{name: size}`` or ``{name: [label, ...]}`` entries.

        Each value is either an int (the size) or an ordered sequence of value
        labels (the size is its length).  The mapping's order is the attribute
        order.

        Examples
        --------
        >>> Domain.from_dict({"sex": ["M", "F"], "age": 115})
        Domain(sex=2, age=115)
        """
        if not isinstance(d, Mapping):
            raise TypeError(f"from_dict expects a mapping, got {type(d).__name__}")
        sizes: list[int] = []
        labels: dict[str, tuple[Label, ...]] = {}
        for name, spec in d.items():
            if isinstance(spec, numbers.Integral) and not isinstance(spec, (bool, np.bool_)):
                sizes.append(_as_size(str(name), spec))
            else:
                labels[name] = _as_labels(str(name), spec)
                sizes.append(len(labels[name]))
        return cls(list(d), sizes, labels)

    def to_dict(self) -> dict[str, int | list[Label]]:
        """Inverse of :meth:`from_dict`: labels (as lists) where given, else sizes."""
        return {
            n: list(self._labels[n]) if n in self._labels else s
            for n, s in zip(self._names, self._shape)
        }

    def to_json(self, indent: int | None = None) -> str:
        """JSON text of :meth:`to_dict` (a JSON object whose key order is the attribute order)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Domain:
        """Inverse of :meth:`to_json`."""

        def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
            keys = [k for k, _ in pairs]
            if len(set(keys)) != len(keys):
                raise ValueError(f"domain JSON has duplicate attribute names in {keys}")
            return dict(pairs)

        data = json.loads(text, object_pairs_hook=no_duplicate_keys)
        if not isinstance(data, dict):
            raise ValueError(
                "domain JSON must be an object like {\"sex\": [\"M\", \"F\"], \"age\": 115}, "
                f"got {type(data).__name__}"
            )
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the domain to a JSON file (see :meth:`to_json`)."""
        replace_atomically(path, (self.to_json(indent=2) + "\n").encode())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Domain:
        """Read a domain written by :meth:`save`."""
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())

    # -------------------------------------------------------- data vector
    def reads_numbers_as_codes(self, attr: str | int) -> bool:
        """Whether :meth:`vectorize` reads any numeric column of this attribute as codes.

        True when the attribute has no value labels (its labels are its codes) or when
        all its labels are strings none of which spells a number (``"M"``, ``"0-4"``):
        then no number can be one of its labels.  False otherwise:

        * some label is a number (int, float or bool): a numeric column is matched
          against the labels, since reading it as codes could count the wrong cells;
        * the labels are strings and some spell numbers (``"1"``, ``"07"``, ``"2.5"``):
          a CSV reader returns those as numbers, so a numeric column is read by the
          rule of :meth:`vectorize` (labels, codes, or refused as ambiguous).
        """
        name = self._names[self.index(attr)]
        return all(
            isinstance(v, str) and _spelled_number(v) is None for v in self._labels.get(name, ())
        )

    def vectorize(self, df: pd.DataFrame, *, codes: bool = False) -> np.ndarray:
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
            vectorized over a projection (:meth:`project`).
        codes : bool, default False
            How column values are read:

            * ``False``: as value labels, matched against :meth:`values` (for an
              attribute without labels those are the codes ``0..n-1``).  A text,
              object or category column is matched exactly.  A numeric column (int,
              uint, bool, or floats that are whole numbers) is read as follows:

              - attribute without labels, or whose labels are strings none of which
                spells a number (``"M"``, ``"0-4"``): as codes, since none of its
                values can be a label (see :meth:`reads_numbers_as_codes`);
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

        Returns
        -------
        numpy.ndarray
            float64 vector of length :attr:`size`; :meth:`records` is its inverse.

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
        >>> d = Domain(["size", "sex"], [3, 2], {"size": [1, 2, 3], "sex": ["M", "F"]})
        >>> df = pd.DataFrame({"size": [1, 3], "sex": [0, 1]})  # size holds labels here
        >>> d.vectorize(df).tolist()
        [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        >>> d.vectorize(pd.DataFrame({"size": [0, 2], "sex": [0, 1]}), codes=True).tolist()
        [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]

        Labels that spell numbers: 9 can only be the label ``"9"``, while 1 and 2 alone
        could be labels or codes.

        >>> r = Domain(["region"], [9], {"region": [str(k) for k in range(1, 10)]})
        >>> r.vectorize(pd.DataFrame({"region": [1, 2, 9]})).tolist()
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        >>> r.vectorize(pd.DataFrame({"region": [1, 2]}))
        Traceback (most recent call last):
        ...
        hdmm.domain.AmbiguousColumnError: column 'region' is ambiguous: ...
        >>> r.vectorize(pd.DataFrame({"region": ["1", "2"]})).tolist()[:3]
        [1.0, 1.0, 0.0]
        """
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"vectorize expects a pandas DataFrame, got {type(df).__name__}")
        if not isinstance(codes, (bool, np.bool_)):
            raise TypeError(f"codes must be True or False, got {codes!r}")
        if self.size > MAX_DENSE_CELLS:
            raise ValueError(
                f"the domain {self!r} has {self.size} cells, more than the "
                f"{MAX_DENSE_CELLS} a dense data vector can hold; vectorize a "
                "projection onto fewer attributes (Domain.project) instead"
            )
        missing = [n for n in self._names if n not in df.columns]
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
                stacklevel=2,
            )
        return np.bincount(self.cell_index(df, codes=codes), minlength=self.size).astype(np.float64)

    def cell_index(self, df: pd.DataFrame, *, codes: bool = False, private: bool = False,
                   counts: Any = None) -> np.ndarray:
        """The flat cell of each record (C order), read as :meth:`vectorize` reads the columns.

        ``private=True``: an error names how many records hold a bad value, never the values or
        the rows (for data whose values must not reach a log, e.g. a geography release). With
        ``counts`` (one per row) each row stands for that many records (distinct values and their
        counts), for those messages.

        What :meth:`vectorize` counts: ``np.bincount(dom.cell_index(df), minlength=dom.size)``.
        Used to split records by another column (e.g. a geography unit) before counting.

        >>> Domain(["sex", "age"], [2, 3]).cell_index(pd.DataFrame({"sex": [0, 1], "age": [2, 0]})).tolist()
        [2, 3]
        """
        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"cell_index expects a pandas DataFrame, got {type(df).__name__}")
        missing = [n for n in self._names if n not in df.columns]
        if missing:
            raise ValueError(
                f"DataFrame has no column for attribute(s) {missing}; its columns are "
                f"{list(df.columns)}{_rename_hint(missing, df.columns)}; rename the columns to the attribute names"
            )
        flat = np.zeros(len(df), dtype=np.intp)
        for name, n in zip(self._names, self._shape):
            flat *= n
            flat += self._column_codes(df, name, bool(codes), _Private(len(df), counts) if private else None)
        return flat

    def records(self, x: Any, *, codes: bool = False) -> pd.DataFrame:
        """The records counted by a data vector: the inverse of :meth:`vectorize`.

        Cell :math:`j` becomes :math:`x_j` identical rows, in cell order, so
        ``self.vectorize(self.records(x), codes=codes)`` equals ``x``.

        Parameters
        ----------
        x : array_like
            Counts, of shape ``(size,)``: whole, non-negative and finite numbers
            (a noisy estimate must be rounded and clipped first, e.g.
            ``np.clip(np.rint(x), 0, None)``).
        codes : bool, default False
            ``False``: a column of value labels per attribute, as a pandas
            Categorical whose categories are :meth:`values` for attributes with
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
        >>> d = Domain(["sex", "age"], [2, 3], {"sex": ["M", "F"]})
        >>> d.records([0, 2, 0, 0, 0, 1]).to_dict("list")
        {'sex': ['M', 'M', 'F'], 'age': [1, 1, 2]}
        """
        if not isinstance(codes, (bool, np.bool_)):
            raise TypeError(f"codes must be True or False, got {codes!r}")
        counts = _as_counts(x, self.size)
        cells = np.flatnonzero(counts)
        repeats = counts[cells]
        cell_codes = np.unravel_index(cells, self._shape) if self._names else ()
        columns: dict[str, Any] = {}
        for name, n, c in zip(self._names, self._shape, cell_codes):
            if name in self._labels and not codes:
                columns[name] = pd.Categorical.from_codes(
                    np.repeat(c.astype(np.min_scalar_type(-n)), repeats),
                    categories=pd.Index(self._labels[name], dtype=object),
                    validate=False,
                )
            else:
                columns[name] = np.repeat(c.astype(np.min_scalar_type(n - 1)), repeats)
        return pd.DataFrame(columns, index=pd.RangeIndex(int(repeats.sum())))

    def _column_codes(self, df: pd.DataFrame, name: str, codes: bool, private: _Private | None = None) -> np.ndarray:
        """Codes of the values in ``df[name]``, validated (any integer dtype)."""
        column = df[name]
        if isinstance(column, pd.DataFrame):
            raise ValueError(f"DataFrame has {column.shape[1]} columns named {name!r}; keep one")
        n = self._shape[self._position[name]]
        dtype = column.dtype
        labels_like = isinstance(dtype, (pd.CategoricalDtype, pd.StringDtype))
        numeric = dtype.kind in "iufb" and not labels_like
        if numeric and (codes or self.reads_numbers_as_codes(name)):
            return self._numeric_codes(column, name, n, codes, private)
        if numeric and all(isinstance(v, str) for v in self._labels[name]):
            return self._spelled_codes(column, name, n, private)
        if numeric or labels_like or dtype.kind == "O":
            return self._label_codes(column, name, codes, private)
        raise ValueError(
            f"column {name!r} has dtype {dtype}, which is neither numeric codes "
            "nor labels; convert it to int codes 0..n-1 or to object/string/category labels"
        )

    def _numeric_codes(self, column: pd.Series, name: str, n: int, codes: bool, private: _Private | None = None
                       ) -> np.ndarray:
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
            if codes and name in self._labels:
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

    def _spelled_codes(self, column: pd.Series, name: str, n: int, private: _Private | None = None) -> np.ndarray:
        """Codes of a numeric column whose attribute has string labels spelling numbers.

        The rule is in :meth:`vectorize` (``codes``): each distinct value is looked up
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
        labels = self._labels[name]
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
            spelling = "" if private else f" ({_preview(v for v in labels if _spelled_number(v) == distinct[k])})"
            raise ValueError(
                f"column {name!r} holds the number {show(k)}, which several labels of attribute "
                f"{name!r} spell{spelling}; "
                f"read the column as text (pd.read_csv(..., dtype={{{name!r}: str}})) so that each value "
                "is matched to one label exactly"
            )
        neither = ~label_ok & ~code_ok
        if neither.any():
            bad = [show(k) for k in np.flatnonzero(neither)]
            listed = f"[{', '.join(bad[:_SHOW])}{', ...' if len(bad) > _SHOW else ''}]"
            if private:
                listed = _shown(None, neither[record_codes], private)
            raise ValueError(
                f"column {name!r} holds values {listed} "
                f"that are neither labels of attribute {name!r} ({_preview(labels)}) nor codes 0..{n - 1}; "
                "recode or drop those rows"
            )
        if clash.any():
            k = int(np.flatnonzero(clash)[0])
            example = "" if private else (f" (the value {show(k)} is the label {labels[as_label[k]]!r}, and also "
                                          f"code {as_code[k]}, the label {labels[as_code[k]]!r})")
            raise AmbiguousColumnError(
                f"column {name!r} is ambiguous: the attribute's labels spell numbers "
                f"({_preview(labels)}), and its values read both as labels and as codes but count "
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
            f"([{', '.join(only_label[:_SHOW])}], not codes 0..{n - 1}) with values that are only codes "
            f"([{', '.join(only_code[:_SHOW])}], no label {_preview(labels)} spells them); "
            "recode the column to one of the two"
        )

    def _label_codes(self, column: pd.Series, name: str, codes: bool, private: _Private | None = None) -> np.ndarray:
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
        n = self._shape[self._position[name]]
        wanted = range(n) if codes else self.values(name)
        distinct = np.asarray(distinct, dtype=object)
        mapping = pd.Index(wanted, dtype=object).get_indexer(pd.Index(distinct, dtype=object))
        unknown = mapping < 0
        if categorical and unknown.any():  # unused categories do no harm
            unknown &= np.bincount(record_codes, minlength=mapping.size) > 0
        if unknown.any():
            raise ValueError(
                f"column {name!r} holds unknown values "
                f"{_shown(None, unknown[record_codes], private) if private else _preview(distinct[unknown])} for "
                f"attribute {name!r}; {self._expected_values(name, codes, distinct[unknown])}"
            )
        if np.array_equal(mapping, np.arange(mapping.size)):
            return record_codes
        return mapping[record_codes]

    def _expected_values(self, name: str, codes: bool, unknown: np.ndarray) -> str:
        """What the values of a column should be, and how to fix it, for an error message."""
        n = self._shape[self._position[name]]
        if codes:
            return (
                f"with codes=True values must be codes 0..{n - 1}; to pass value labels "
                "call vectorize without codes=True"
            )
        if name not in self._labels:
            return f"it has no value labels, so values must be codes 0..{n - 1}"
        hint = ""
        if all(isinstance(v, numbers.Integral) and 0 <= v < n for v in unknown):
            hint = "; if the column holds codes 0..n-1 rather than labels, pass codes=True"
        return (
            f"its labels are {_preview(self._labels[name])}; map those values to labels "
            f"or drop their rows{hint}"
        )


def _raise_missing(column: pd.Series, name: str, private: _Private | None = None) -> None:
    """Raise the error for a column with missing values (``private``: without the rows)."""
    na = column.isna().to_numpy()
    count = private.records(na) if private else int(na.sum())
    rows = "" if private else f", e.g. in rows {_preview(column.index[na])}"
    raise ValueError(
        f"column {name!r} has {count} missing value(s) (NaN/None){rows}; drop or impute them first"
    )


class _Private:
    """How :meth:`Domain.cell_index` reports bad values with ``private=True``: the number of records only."""

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
    return _preview(np.unique(values[mask]))


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
            f"x holds counts {_preview(counts[cells])} in cells {_preview(cells)} that are "
            "not whole non-negative numbers; round and clip a noisy estimate first, "
            "e.g. np.clip(np.rint(x), 0, None)"
        )
    return counts.astype(np.int64, copy=False)
