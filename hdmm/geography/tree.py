"""Geography hierarchies: a frozen, validated tree of units with irregular fan-out.

A :class:`GeographyTree` has named levels, the root level first (``"nation"``), then any number
of finer levels, e.g. ``"state"``, ``"county"``, ``"tract"``, ``"block_group"``, ``"block"``.
Every path from the root reaches the finest level: the *leaves* are the units of the finest
level, and the geography attribute of a domain has one value per leaf.

**Order.** Units are numbered level by level in depth-first order: the children of a unit are
sorted by their codes (as strings, so numeric codes should be zero-padded, as Census codes
are), and the units of a level are ordered by their parent's position, then by code. The
leaves of any unit are therefore a contiguous run of the leaf order, and so are the children of
any unit in the next level; the workload blocks and strategies of :mod:`hdmm.geography` use this
to aggregate with ``np.add.reduceat`` in ``O(leaves)``.

**Codes and widths.** A tree from a table (:meth:`GeographyTree.from_table`) reads one column
of codes per level; a unit's code there is relative to its parent (county ``"001"`` of state
``"06"``). When every level's codes have one width (Census codes: state 2 digits, county 3,
tract 6, block group 1, block 4), a unit's full code is the concatenation (``"06001"``, the
GEOID); when some level's codes differ in width, the full code joins them with ``"/"``
(``"6/1"``). Records are placed (:meth:`GeographyTree.locate`) level by level, each level's
code matched on its own and checked against that level's width, never through a joined
string: a record with state ``"1"`` and county ``"0001"`` is refused (codes of the wrong
width), not read as state ``"10"``, county ``"001"``.

**Storage.** Each level holds arrays, not Python objects per unit: the position of every unit's
parent and the rank of its own code among the level's sorted distinct codes. A level's keys
``parent * K + rank`` are sorted, so finding units is ``np.searchsorted``; full codes as text
are made only when asked for (:meth:`GeographyTree.codes`). The 8.1 million blocks of the
United States take about 100 MB (benchmarks/results/geography.md).

>>> import pandas as pd
>>> table = pd.DataFrame({"state": ["01", "01", "02"], "county": ["001", "003", "001"],
...                       "state_name": ["Alabama", "Alabama", "Alaska"]})
>>> tree = GeographyTree.from_table(table, ["state", "county"], names={"state": "state_name"})
>>> tree
GeographyTree(nation: 1, state: 2, county: 3)
>>> tree.leaf_codes
('01001', '01003', '02001')
>>> tree.label("state", 1)
'state=02 Alaska'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .build import build_level, check_levels, check_table, parents_levels, unit_names
from .codes import GeographyError, lookup, preview, read_codes, records_phrase, weights_array

__all__ = ["GeographyError", "GeographyTree"]


class GeographyTree:
    """A frozen tree of geographic units, built with :meth:`from_table` or :meth:`from_parents`.

    Attributes
    ----------
    levels : tuple of str
        Level names, root level first.
    sizes : tuple of int
        Number of units per level.
    """

    def __init__(self, levels: Sequence[str], parents: Sequence[np.ndarray], ranks: Sequence[np.ndarray],
                 values: Sequence[np.ndarray], names: Sequence[tuple[np.ndarray, np.ndarray] | None] | None = None,
                 *, joined: bool = False, columns: tuple[str, ...] | None = None, separator: str = "",
                 prefixed: Sequence[str] = ()):
        """Build from arrays (level 0 is the root: one unit); use :meth:`from_table` or :meth:`from_parents`.

        ``parents[d]`` is each unit's parent position (``parents[0]`` empty), ``ranks[d]`` the position of its
        own code in ``values[d]`` (sorted distinct codes), ``names[d]`` the same for display names (or ``None``).
        ``joined``: a unit's full code joins its ancestors' codes below the root and its own (``separator``).
        """
        self.levels = check_levels(levels)
        self._parents = [np.asarray(p, dtype=np.intp) for p in parents]
        self._ranks = [np.asarray(r, dtype=np.int64) for r in ranks]
        self._values = [np.asarray(v, dtype=str) for v in values]
        self._unit_names = list(names) if names is not None else [None] * len(self.levels)
        self.sizes = tuple(int(r.size) for r in self._ranks)
        self._joined, self._columns, self._separator = joined, columns, separator
        self._prefixed = tuple(prefixed)
        L = len(self.levels)
        self._child_bounds = [
            np.concatenate([[0], np.cumsum(np.bincount(self._parents[d + 1], minlength=self.sizes[d]))]).astype(np.intp)
            for d in range(L - 1)
        ]
        counts = [np.ones(self.sizes[-1], dtype=np.intp)]
        for d in range(L - 2, -1, -1):
            counts.insert(0, np.add.reduceat(counts[0], self._child_bounds[d][:-1]) if self.sizes[d + 1] else
                          np.zeros(self.sizes[d], dtype=np.intp))
        self._leaf_bounds = [np.concatenate([[0], np.cumsum(c)]).astype(np.intp) for c in counts]
        self._full: dict[int, np.ndarray] = {}
        self._sorted: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}
        self._tuples: dict[int, tuple[str, ...]] = {}
        self._name_tuples: dict[int, tuple[str, ...]] = {}
        if separator:  # joined with "/": codes holding "/" could make two units' codes equal
            for d in range(1, L):
                self._lookup_table(d)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_parents(cls, pairs: Mapping[object, object] | Iterable[tuple[object, object]], levels: Sequence[str],
                     names: Mapping[object, str] | None = None) -> GeographyTree:
        """A tree from ``child -> parent`` pairs (a mapping or ``(child, parent)`` pairs).

        The root is the unit whose parent is ``None``, or else the one parent that is never a
        child. Codes are compared as strings and are whole codes (never joined). ``names`` maps
        codes to display names.

        >>> GeographyTree.from_parents({"CA": "US", "OR": "US", "06001": "CA", "41001": "OR"},
        ...                            ["nation", "state", "county"]).sizes
        (1, 2, 2)
        """
        levels = check_levels(levels)
        parents, ranks, values, unit_names_ = parents_levels(pairs, levels, names)
        return cls(levels, parents, ranks, values, unit_names_)

    @classmethod
    def from_table(cls, table, levels: Sequence[str], *, root: str = "nation", root_code: str = "",
                   root_name: str = "", names: Mapping[str, str] | None = None,
                   prefixed: Sequence[str] = ()) -> GeographyTree:
        """A tree from a table of codes: one row per finest unit, one column per level below the root.

        A unit's code is the concatenation of its ancestors' codes and its own (Census GEOIDs,
        ``"06" + "001"`` -> ``"06001"``) when each level's codes have one width, joined by
        ``"/"`` otherwise. Rows may repeat a unit of a coarser level, not a finest unit. The
        table is read with array operations (8.1 million blocks in seconds).

        Parameters
        ----------
        table
            A pandas DataFrame (or anything with those columns).
        levels
            The level columns, coarsest first (e.g. ``["state", "county", "tract"]``), any number.
        root, root_code, root_name
            The root level's name and the root unit's code and name.
        names
            Optional ``level -> column`` of display names (e.g. ``{"state": "state_name"}``).
        prefixed
            Levels whose codes begin with their parent's code, as a Census block's 4 digits begin
            with its block group's digit: a row (or, in :meth:`locate`, a record) where they
            differ is refused (the levels do not nest).

        Raises
        ------
        GeographyError
            Missing columns or codes (a row with a block but no tract is named as such), a
            repeated finest unit, a unit named twice, levels that do not nest (``prefixed``).
        """
        columns = check_levels([root, *levels])[1:]
        check_table(table, columns, names or {}, prefixed)
        names = dict(names or {})
        read = [read_codes(table[c]) for c in columns]
        _refuse_missing(columns, read, None, "rows of the table of units")
        widths = [col.widths() for col in read]
        separator = "" if all(len(w) == 1 for w in widths) else "/"
        _refuse_unnested(columns, prefixed, read, None, "rows of the table of units")
        parents, ranks, values = [np.zeros(0, dtype=np.intp)], [np.zeros(1, dtype=np.int64)], [np.array([root_code])]
        unit_names_: list = [(np.zeros(1, dtype=np.int64), np.array([root_name]))]
        row_unit = np.zeros(len(table), dtype=np.int64)
        for d, (c, col) in enumerate(zip(columns, read), start=1):
            last = d == len(columns)
            parent, rank, row_unit = build_level(row_unit, col, last, table, columns, read, separator, names)
            parents.append(parent)
            ranks.append(rank)
            values.append(col.values)
            unit_names_.append(None if c not in names else
                               unit_names(table[names[c]], row_unit, parent.size, c, read[:d], separator))
        return cls([root, *columns], parents, ranks, values, unit_names_, joined=True, columns=columns,
                   separator=separator, prefixed=prefixed)

    # ------------------------------------------------------------------ access
    @property
    def depth(self) -> int:
        """Index of the finest level (the root is level 0)."""
        return len(self.levels) - 1

    @property
    def leaves(self) -> int:
        """Number of finest units (the size of the geography attribute)."""
        return self.sizes[-1]

    @property
    def units(self) -> int:
        """Number of units at all levels."""
        return sum(self.sizes)

    @property
    def leaf_codes(self) -> tuple[str, ...]:
        """Codes of the leaves, in leaf order: the value labels of the geography attribute."""
        return self.codes(self.depth)

    @property
    def widths(self) -> tuple[int | None, ...]:
        """The width of each level's own codes (``None`` for the root and for a level whose codes differ in
        width; levels of :meth:`from_parents` trees hold whole codes)."""
        out = []
        for d, v in enumerate(self._values):
            w = {len(x) for x in v.tolist()}
            out.append(w.pop() if d and len(w) == 1 else None)
        return tuple(out)

    def level_index(self, level: str | int) -> int:
        """Position of a level (0 is the root), by name or position."""
        if isinstance(level, (int, np.integer)) and not isinstance(level, bool):
            if 0 <= level < len(self.levels):
                return int(level)
            raise GeographyError(f"level {level} out of range: the tree has levels 0..{self.depth} {list(self.levels)}")
        try:
            return self.levels.index(str(level))
        except ValueError:
            raise GeographyError(f"no level {level!r}: the tree's levels are {list(self.levels)}") from None

    def code_array(self, level: str | int) -> np.ndarray:
        """Full codes of a level's units, in order, as a numpy array of text (made once, then kept)."""
        d = self.level_index(level)
        if d not in self._full:
            own = self._values[d][self._ranks[d]]
            if self._joined and d > 1:
                up = self.code_array(d - 1)[self._parents[d]]
                own = np.char.add(np.char.add(up, self._separator) if self._separator else up, own)
            self._full[d] = own
        return self._full[d]

    def codes(self, level: str | int) -> tuple[str, ...]:
        """Codes of a level's units, in order (made once, then kept)."""
        d = self.level_index(level)
        if d not in self._tuples:
            self._tuples[d] = tuple(self.code_array(d).tolist())
        return self._tuples[d]

    def names(self, level: str | int) -> tuple[str, ...]:
        """Display names of a level's units (``""`` when none was given; made once, then kept)."""
        d = self.level_index(level)
        if d not in self._name_tuples:
            given = self._unit_names[d]
            self._name_tuples[d] = ("",) * self.sizes[d] if given is None else tuple(given[1][given[0]].tolist())
        return self._name_tuples[d]

    def parents(self, level: str | int) -> np.ndarray:
        """For each unit of ``level`` (not the root), the position of its parent in the level above."""
        d = self.level_index(level)
        if d == 0:
            raise GeographyError("the root has no parent")
        return self._parents[d]

    def child_bounds(self, level: str | int) -> np.ndarray:
        """Offsets (``size + 1``) of each unit's children in the next level: unit ``u`` has ``b[u]:b[u+1]``."""
        d = self.level_index(level)
        if d == self.depth:
            raise GeographyError(f"the finest level {self.levels[-1]!r} has no children")
        return self._child_bounds[d]

    def leaf_bounds(self, level: str | int) -> np.ndarray:
        """Offsets (``size + 1``) of each unit's leaves: unit ``u`` of ``level`` covers leaves ``b[u]:b[u+1]``."""
        return self._leaf_bounds[self.level_index(level)]

    def _lookup_table(self, d: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The full codes of level ``d`` sorted, and the order that sorts them (``None``: already sorted)."""
        if d not in self._sorted:
            full = self.code_array(d)
            if full.size < 2 or bool(np.all(full[:-1] < full[1:])):
                self._sorted[d] = (full, None)
            else:
                order = np.argsort(full, kind="stable")
                ordered = full[order]
                same = np.flatnonzero(ordered[:-1] == ordered[1:])
                if same.size:
                    raise GeographyError(
                        f"duplicate codes at level {self.levels[d]!r} {preview(ordered[same])}: every unit of a level "
                        "needs its own code (codes holding the separator '/' can make two units' codes equal)")
                self._sorted[d] = (ordered, order)
        return self._sorted[d]

    def _find(self, d: int, codes: np.ndarray) -> np.ndarray:
        ordered, order = self._lookup_table(d)
        pos = lookup(ordered, codes)
        return pos if order is None else np.where(pos >= 0, order[np.maximum(pos, 0)], -1)

    def index(self, level: str | int, code: object) -> int:
        """Position of the unit with ``code`` (its full code) at ``level``."""
        d = self.level_index(level)
        found = int(self._find(d, np.array([str(code)]))[0])
        if found < 0:
            raise GeographyError(
                f"code {str(code)!r} is not in the tree at level {self.levels[d]!r} (codes there look like "
                f"{preview(self.code_array(d)[:3])}); use a code of the tree or add the unit"
            )
        return found

    def leaf_index(self, codes: Iterable[object], weights: Iterable[float] | None = None) -> np.ndarray:
        """Leaf positions of leaf codes (e.g. a records column); unknown codes are refused.

        The message counts the records with unknown codes (``weights``: records per code, when
        ``codes`` are distinct codes) and shows a few of the tree's leaf codes, never a code of
        ``codes``: which codes the data hold is private.
        """
        if isinstance(codes, (pd.Series, pd.Index)):  # one binary search per code: no sort of the codes given
            text = codes.astype(str).to_numpy(dtype=str)
        else:
            text = np.array([str(c) for c in codes], dtype=str)
        out = self._find(self.depth, text).astype(np.intp)
        if np.any(out < 0):
            raise GeographyError(
                f"{records_phrase(out < 0, weights_array(weights, out.size))} leaf codes that are not leaves of the "
                f"tree (level {self.levels[-1]!r}, whose codes look like {preview(self.code_array(self.depth)[:3])}; the "
                "records' codes are not shown: which codes the data hold is private); use codes of the finest units "
                "or add them to the tree"
            )
        return out

    @property
    def columns(self) -> tuple[str, ...] | None:
        """The level columns of a tree made by :meth:`from_table` (``None`` otherwise)."""
        return self._columns

    @property
    def separator(self) -> str:
        """What joins the level codes into a unit's code (``""`` or ``"/"``, see :meth:`from_table`)."""
        return self._separator

    def locate(self, table, weights: Iterable[float] | None = None) -> np.ndarray:
        """Leaf positions of the rows of a table with the level columns of :meth:`from_table`.

        Each level's code is matched on its own, under the unit its coarser codes found: no
        string is joined. Refused, in this order, before any use of the rows: missing codes
        (a record with a block but no tract is named as such), codes of the wrong width for a
        level of fixed width, codes that do not nest (``prefixed`` levels), codes not in the
        tree. Messages count the records (``weights``: records per row, when the rows are
        distinct combinations of codes) and name the tree's units, never a code of the rows
        (which codes the data hold is private). Array operations only: 10 million records in
        seconds.
        """
        if self._columns is None:
            raise GeographyError("locate needs a tree built with from_table; use leaf_index with leaf codes")
        missing = [c for c in self._columns if c not in table.columns]
        if missing:
            raise GeographyError(f"the table has no column(s) {missing}; it has {list(table.columns)}")
        w = weights_array(weights, len(table))
        read = [read_codes(table[c]) for c in self._columns]
        _refuse_missing(self._columns, read, w, "records")
        self._refuse_widths(read, w)
        _refuse_unnested(self._columns, self._prefixed, read, w, "records")
        unit = np.zeros(len(table), dtype=np.int64)
        reached = np.zeros(len(table), dtype=np.int8)
        last = np.zeros(len(table), dtype=np.int64)
        for d, col in enumerate(read, start=1):
            K = max(self._values[d].size, 1)
            rank = np.append(lookup(self._values[d], col.values), -1)[col.ranks]
            key = np.where((unit >= 0) & (rank >= 0), unit * K + rank, -1)
            unit = lookup(self._parents[d].astype(np.int64) * K + self._ranks[d], key)
            ok = unit >= 0
            reached[ok] = d
            last[ok] = unit[ok]
        if np.any(unit < 0):
            raise GeographyError(self._outside(unit < 0, reached, last, w))
        return unit.astype(np.intp)

    def _refuse_widths(self, read, w: np.ndarray | None) -> None:
        for d, (c, col) in enumerate(zip(self._columns, read), start=1):
            widths = {len(v) for v in self._values[d].tolist()}
            if len(widths) != 1:
                continue  # a level of several widths: its codes are matched whole
            width = widths.pop()
            wrong = np.append(np.char.str_len(col.values) != width if col.values.size else np.zeros(0, bool),
                              False)[col.ranks]
            if wrong.any():
                raise GeographyError(
                    f"{records_phrase(wrong, w)} {self.levels[d]} codes of the wrong width (column {c!r}): the tree's "
                    f"{self.levels[d]} codes have {width} characters, e.g. {preview(self._values[d][:2])} (the records' "
                    "codes are not shown: which codes the data hold is private); write them with that width, "
                    "zero-padded as Census codes are, and read the level columns as text (numbers lose leading zeros)")

    def _outside(self, bad: np.ndarray, reached: np.ndarray, last: np.ndarray, w: np.ndarray | None) -> str:
        """Why records are not in the tree: their count, and the tree's unit under which the first of them (in
        the tree's order) leaves it. No code of the records is shown (it is private)."""
        rows = np.flatnonzero(bad)
        depth, unit = reached[rows].astype(np.intp), last[rows]
        start = np.zeros(rows.size, dtype=np.int64)
        for d in np.unique(depth).tolist():
            at = depth == d
            start[at] = self._leaf_bounds[d][unit[at]]
        first = np.lexsort((-depth, start))[0]
        depth, unit = int(depth[first]), int(unit[first])
        level = self.levels[depth + 1]
        where = "the tree" if depth == 0 else f"the tree under {self.label(depth, unit)}"
        return (f"{records_phrase(bad, w)} geography codes that are not in the tree: the first, in the tree's "
                f"order, has a {level} code that is not in {where} (the records' codes are not shown: which codes "
                "the data hold is private); fix those records' codes (column(s) "
                f"{list(self._columns)}) or add their units to the tree")

    def aggregate(self, level: str | int, X: np.ndarray) -> np.ndarray:
        """Totals of the rows of ``X`` (``leaves x k``) over each unit of ``level``: ``O(leaves k)``."""
        d = self.level_index(level)
        if d == self.depth:
            return np.array(X, dtype=float)
        return np.add.reduceat(X, self._leaf_bounds[d][:-1], axis=0)

    def spread(self, level: str | int, Y: np.ndarray) -> np.ndarray:
        """Each row of ``Y`` (one per unit of ``level``) repeated for every leaf of its unit (``S^T Y``)."""
        d = self.level_index(level)
        if d == self.depth:
            return np.array(Y, dtype=float)
        return np.repeat(Y, np.diff(self._leaf_bounds[d]), axis=0)

    def _code_of(self, d: int, unit: int) -> str:
        if not self._joined or d <= 1:
            return str(self._values[d][self._ranks[d][unit]])
        return self._code_of(d - 1, int(self._parents[d][unit])) + self._separator + str(
            self._values[d][self._ranks[d][unit]])

    def label(self, level: str | int, unit: int) -> str:
        """``"state=06 California"``: the level, the unit's code and its name (as given)."""
        d = self.level_index(level)
        given = self._unit_names[d]
        name = "" if given is None else str(given[1][given[0][unit]])
        text = " ".join(part for part in (self._code_of(d, int(unit)), name) if part)
        return f"{self.levels[d]}={text}" if text else self.levels[d]

    def __repr__(self) -> str:
        return "GeographyTree(" + ", ".join(f"{name}: {n:,}" for name, n in zip(self.levels, self.sizes)) + ")"

    def _key(self):
        return id(self)


def _refuse_missing(columns: Sequence[str], read, w: np.ndarray | None, what: str) -> None:
    """Rows without a code at some level: a gap under a finer code first (blocks without tracts), then any."""
    missing = [col.missing for col in read]
    if not any(m.any() for m in missing):
        return
    finer = np.zeros(missing[0].size, dtype=bool)
    below: list[np.ndarray] = [finer] * len(read)
    for d in range(len(read) - 1, -1, -1):
        below[d] = finer
        finer = finer | ~missing[d]
    phrase = (lambda bad: records_phrase(bad, w)) if what == "records" else (
        lambda bad: f"{int(bad.sum()):,} rows of the table of units have" if bad.sum() != 1 else
        "1 row of the table of units has")
    for d, c in enumerate(columns):
        gap = missing[d] & below[d]
        if gap.any():
            raise GeographyError(
                f"{phrase(gap)} no code in column(s) [{c!r}] but a code at a finer level "
                f"({list(columns[d + 1:])}): the levels do not nest (e.g. blocks without tracts); every unit needs "
                f"the code of its {c} (missing values are not codes)")
    empty = [c for c, m in zip(columns, missing) if m.any()]
    bad = np.logical_or.reduce(missing)
    raise GeographyError(f"{phrase(bad)} no code in column(s) {empty} (missing values): every "
                         f"{'record' if what == 'records' else 'row'} needs the code of its unit at every level")


def _refuse_unnested(columns: Sequence[str], prefixed: Sequence[str], read, w: np.ndarray | None,
                     what: str) -> None:
    """Rows whose code at a ``prefixed`` level does not begin with their parent level's code."""
    for level in prefixed:
        d = list(columns).index(level)
        if d == 0:
            continue  # the root's code is not part of the levels' codes
        up, own = read[d - 1], read[d]
        pairs, inverse = np.unique(up.ranks * max(own.values.size, 1) + own.ranks, return_inverse=True)
        p_up, p_own = pairs // max(own.values.size, 1), pairs % max(own.values.size, 1)
        ok = np.array([a.startswith(b) for a, b in zip(own.values[p_own].tolist(), up.values[p_up].tolist())],
                      dtype=bool)
        wrong = ~ok[np.asarray(inverse).ravel()]
        if wrong.any():
            count = records_phrase(wrong, w) if what == "records" else f"{int(wrong.sum()):,} {what} have"
            raise GeographyError(
                f"{count} a {level} code that does not begin with their {columns[d - 1]} code (column {level!r} "
                f"against {columns[d - 1]!r}): the levels do not nest (a Census block's code begins with its block "
                "group's digit); fix the codes or the order of the levels")
