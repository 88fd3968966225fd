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

Reading records is not the domain's business: :mod:`hdmm.records` counts the records of a
DataFrame into :math:`x` (also :meth:`Domain.vectorize`) and expands :math:`x` back into records,
and :mod:`hdmm.columns` reads one column as the codes of one attribute.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from typing import Any

import numpy as np
import pandas as pd

from .columns import AmbiguousColumnError
from .files import replace_atomically
from .records import MAX_DENSE_CELLS, vectorize
from .validation import preview

# AmbiguousColumnError and MAX_DENSE_CELLS live in hdmm.columns and hdmm.records; they stay importable from here.
__all__ = ["AmbiguousColumnError", "Domain", "MAX_DENSE_CELLS"]

# A value label: a JSON scalar (str, int, bool or finite float).
Label = str | int | float


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
            f"{preview(duplicates)} (note that 1, 1.0 and True count as equal)"
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
    def vectorize(self, df: pd.DataFrame, *, codes: bool = False) -> np.ndarray:
        """The data vector of record counts: :func:`hdmm.records.vectorize` of this domain.

        Each record adds one to its cell :math:`j = \\sum_i c_i \\prod_{k>i} n_k`, where
        :math:`c_i` is the code of its value of attribute :math:`i`.  ``codes=False`` reads
        the columns as value labels (numeric columns by the rule documented at
        :func:`hdmm.records.vectorize`, which may refuse them with
        :class:`~hdmm.columns.AmbiguousColumnError`), ``codes=True`` as codes ``0..n-1``.
        :func:`hdmm.records.to_records` is the inverse.

        Examples
        --------
        >>> d = Domain(["size", "sex"], [3, 2], {"size": [1, 2, 3], "sex": ["M", "F"]})
        >>> d.vectorize(pd.DataFrame({"size": [1, 3], "sex": ["M", "F"]})).tolist()
        [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        """
        return vectorize(self, df, codes=codes, stacklevel=3)
