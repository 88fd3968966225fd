"""The GeographyTree of hdmm before issue 23 (dicts of Python strings, one loop per row), kept as the reference
that tests/test_geography_arrays.py checks the array-based tree against at small sizes. Not used by the package."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

__all__ = ["GeographyError", "GeographyTree"]

_SHOW = 5


class GeographyError(ValueError):
    """A geography that is not a valid tree, or a code that is not in it."""


def _preview(items: Iterable) -> str:
    items = list(items)
    shown = ", ".join(repr(i) for i in items[:_SHOW])
    return f"[{shown}{', ...' if len(items) > _SHOW else ''}]"


def _records(bad: np.ndarray, weights: Iterable[float] | None) -> str:
    """``"3 records have"``: the number of records flagged ``bad`` (``weights`` records per entry, when given)."""
    n = int(bad.sum()) if weights is None else int(np.asarray(list(weights), dtype=float)[bad].sum())
    return "1 record has" if n == 1 else f"{n:,} records have"


def _check_levels(levels: Sequence[str]) -> tuple[str, ...]:
    levels = tuple(str(name) for name in levels)
    seen: set[str] = set()
    for name in levels:
        if name in seen:
            raise GeographyError(f"level {name!r} is named twice in {list(levels)}: give every level its own name")
        seen.add(name)
    return levels


def _repeated_leaf(table, columns: tuple[str, ...], raw: list[list[str]], path: tuple[str, ...], separator: str,
                   names: Mapping[str, str]) -> str:
    """What is wrong with a table of units in which a finest unit has several rows: most often a table of
    finer units (tracts) given with fewer levels (state, county). The table is public: its codes may be shown."""
    level, code = columns[-1], separator.join(path)
    rows = sum(all(raw[d][r] == path[d] for d in range(len(path))) for r in range(len(table)))
    finer = [str(c) for c in table.columns if str(c) not in columns and str(c) not in set(names.values())]
    message = (f"{level} {code!r} is in {rows} rows of the table of units, which must have one row per unit of the "
               f"finest level ({level!r})")
    if finer:
        return (message + f"; the table has other columns {finer}: if its rows are finer units, give their level "
                f"too, e.g. levels {[*columns, finer[0]]} (hdmm release: --geography "
                f"{','.join([*columns, finer[0]])}), or give a table with one row per {level}")
    return message + f": its rows repeat (duplicate codes); list each {level} once"


class GeographyTree:
    """A frozen tree of geographic units, built with :meth:`from_table` or :meth:`from_parents`.

    Attributes
    ----------
    levels : tuple of str
        Level names, root level first.
    sizes : tuple of int
        Number of units per level.
    """

    def __init__(self, levels: Sequence[str], nodes: Mapping[object, tuple[object, str, str]],
                 columns: tuple[str, ...] | None = None, separator: str = ""):
        """Build from ``nodes``: ``key -> (parent key or None, code, name)``; use the class methods instead."""
        levels = _check_levels(levels)
        if not nodes:
            raise GeographyError("the geography is empty: give at least one unit")
        roots = [k for k, (parent, _, _) in nodes.items() if parent is None]
        if len(roots) != 1:
            raise GeographyError(f"a geography has exactly one root (unit without a parent), found {len(roots)}")
        children: dict[object, list[object]] = {k: [] for k in nodes}
        for key, (parent, _, _) in nodes.items():
            if parent is not None:
                children[parent].append(key)
        order: list[list[object]] = [[roots[0]]]
        reached = 1
        while True:
            below = [c for k in order[-1] for c in sorted(children[k], key=lambda c: nodes[c][1])]
            if not below:
                break
            if len(order) == len(levels):
                raise GeographyError(
                    f"the tree is deeper than its {len(levels)} levels {list(levels)}: unit "
                    f"{nodes[below[0]][1]!r} would be at level {len(levels)}; name one level per depth"
                )
            order.append(below)
            reached += len(below)
        if reached != len(nodes):
            raise GeographyError("some units are not below the root (a cycle in the child -> parent pairs)")
        if len(order) != len(levels):
            raise GeographyError(
                f"the tree has {len(order)} levels but {len(levels)} level names {list(levels)} were given"
            )
        for depth, keys in enumerate(order[:-1]):
            short = [k for k in keys if not children[k]]
            if short:
                raise GeographyError(
                    f"{len(short)} units of level {levels[depth]!r} have no units below them (the first: "
                    f"{nodes[short[0]][1]!r}), but every path must reach the finest level {levels[-1]!r}; "
                    "give each such unit one child at every finer level (e.g. a unit that is its own county)"
                )
        self.levels = levels
        self._codes = [tuple(nodes[k][1] for k in keys) for keys in order]
        self._names = [tuple(nodes[k][2] for k in keys) for keys in order]
        self.sizes = tuple(len(keys) for keys in order)
        self._columns = columns
        self._separator = separator
        position = [{k: i for i, k in enumerate(keys)} for keys in order]
        self._parents = [np.zeros(0, dtype=np.intp)] + [
            np.array([position[d - 1][nodes[k][0]] for k in keys], dtype=np.intp) for d, keys in enumerate(order) if d
        ]
        self._child_bounds = [
            np.concatenate([[0], np.cumsum(np.bincount(self._parents[d + 1], minlength=self.sizes[d]))]).astype(np.intp)
            for d in range(len(levels) - 1)
        ]
        counts = [np.ones(self.sizes[-1], dtype=np.intp)]
        for d in range(len(levels) - 2, -1, -1):
            counts.insert(0, np.bincount(self._parents[d + 1], weights=counts[0], minlength=self.sizes[d]).astype(np.intp))
        self._leaf_bounds = [np.concatenate([[0], np.cumsum(c)]).astype(np.intp) for c in counts]
        self._lookup = [{code: i for i, code in enumerate(codes)} for codes in self._codes]
        for d, codes in enumerate(self._codes):
            if len(self._lookup[d]) != len(codes):
                repeated = sorted({c for c in codes if codes.count(c) > 1}) if len(codes) < 10**4 else []
                raise GeographyError(
                    f"duplicate codes at level {levels[d]!r} {_preview(repeated)}: every unit of a level needs its "
                    "own code"
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_parents(cls, pairs: Mapping[object, object] | Iterable[tuple[object, object]], levels: Sequence[str],
                     names: Mapping[object, str] | None = None) -> GeographyTree:
        """A tree from ``child -> parent`` pairs (a mapping or ``(child, parent)`` pairs).

        The root is the unit whose parent is ``None``, or else the one parent that is never a
        child. Codes are compared as strings. ``names`` maps codes to display names.

        >>> GeographyTree.from_parents({"CA": "US", "OR": "US", "06001": "CA", "41001": "OR"},
        ...                            ["nation", "state", "county"]).sizes
        (1, 2, 2)
        """
        items = list(pairs.items()) if isinstance(pairs, Mapping) else [tuple(p) for p in pairs]
        if not items:
            raise GeographyError("the geography is empty: give at least one child -> parent pair")
        parent_of: dict[str, str | None] = {}
        for child, parent in items:
            child = str(child)
            if child in parent_of:
                raise GeographyError(f"duplicate codes: unit {child!r} is given a parent twice; list each unit once")
            parent_of[child] = None if parent is None else str(parent)
        orphans = sorted({p for p in parent_of.values() if p is not None and p not in parent_of})
        explicit_roots = [c for c, p in parent_of.items() if p is None]
        if len(orphans) + len(explicit_roots) > 1:
            raise GeographyError(
                f"units without a parent: {_preview(explicit_roots + orphans)} (a tree has one root); give each "
                "of them a parent with another child -> parent pair"
            )
        if not orphans and not explicit_roots:
            raise GeographyError("no root: every unit has a parent, so the child -> parent pairs form a cycle")
        for code in orphans:
            parent_of[code] = None
        for start in parent_of:
            seen, code = set(), start
            while code is not None and code not in seen:
                seen.add(code)
                code = parent_of[code]
            if code is not None:
                raise GeographyError(f"the child -> parent pairs form a cycle through unit {code!r}; break it")
        names = {} if names is None else {str(k): str(v) for k, v in names.items()}
        nodes = {c: (p, c, names.get(c, "")) for c, p in parent_of.items()}
        return cls(levels, nodes)

    @classmethod
    def from_table(cls, table, levels: Sequence[str], *, root: str = "nation", root_code: str = "",
                   root_name: str = "", names: Mapping[str, str] | None = None) -> GeographyTree:
        """A tree from a table of codes: one row per finest unit, one column per level below the root.

        A unit's code is the concatenation of its ancestors' codes and its own (Census GEOIDs,
        ``"06" + "001"`` -> ``"06001"``), joined by ``"/"`` instead when the codes of some level
        differ in length. Rows may repeat a unit of a coarser level, not a finest unit.

        Parameters
        ----------
        table
            A pandas DataFrame (or anything with those columns).
        levels
            The level columns, coarsest first (e.g. ``["state", "county", "tract"]``).
        root, root_code, root_name
            The root level's name and the root unit's code and name.
        names
            Optional ``level -> column`` of display names (e.g. ``{"state": "state_name"}``).
        """
        columns = _check_levels([root, *levels])[1:]
        if not columns:
            raise GeographyError("from_table needs at least one level column below the root")
        names = dict(names or {})
        missing = [c for c in list(columns) + list(names.values()) if c not in table.columns]
        if missing:
            raise GeographyError(f"the table has no column(s) {missing}; it has {list(table.columns)}")
        unknown = [level for level in names if level not in columns]
        if unknown:
            raise GeographyError(f"names given for levels {unknown} that are not among {list(columns)}")
        if len(table) == 0:
            raise GeographyError("the geography is empty: the table has no rows")
        raw = [[str(v) for v in table[c].tolist()] for c in columns]
        for c, values in zip(columns, raw):
            if table[c].isna().any():
                raise GeographyError(f"column {c!r} has missing codes; every row needs a code at every level")
        separator = "" if all(len({len(v) for v in values}) == 1 for values in raw) else "/"
        label_columns = {c: [str(v) for v in table[names[c]].tolist()] for c in columns if c in names}
        nodes: dict[object, tuple[object, str, str]] = {(): (None, root_code, root_name)}
        for row in range(len(table)):
            path: tuple[str, ...] = ()
            for depth, c in enumerate(columns):
                parent, path = path, path + (raw[depth][row],)
                name = label_columns[c][row] if c in label_columns else ""
                known = nodes.get(path)
                if known is None:
                    nodes[path] = (parent, separator.join(path), name)
                elif depth == len(columns) - 1:
                    raise GeographyError(_repeated_leaf(table, columns, raw, path, separator, names))
                elif known[2] != name:
                    raise GeographyError(
                        f"{c} {separator.join(path)!r} is named both {known[2]!r} and {name!r}; give it one name"
                    )
        return cls([root, *columns], nodes, columns=columns, separator=separator)

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
        return self._codes[-1]

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

    def codes(self, level: str | int) -> tuple[str, ...]:
        """Codes of a level's units, in order."""
        return self._codes[self.level_index(level)]

    def names(self, level: str | int) -> tuple[str, ...]:
        """Display names of a level's units (``""`` when none was given)."""
        return self._names[self.level_index(level)]

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

    def index(self, level: str | int, code: object) -> int:
        """Position of the unit with ``code`` at ``level``."""
        d = self.level_index(level)
        try:
            return self._lookup[d][str(code)]
        except KeyError:
            raise GeographyError(
                f"code {str(code)!r} is not in the tree at level {self.levels[d]!r} (codes there look like "
                f"{_preview(self._codes[d][:3])}); use a code of the tree or add the unit"
            ) from None

    def leaf_index(self, codes: Iterable[object], weights: Iterable[float] | None = None) -> np.ndarray:
        """Leaf positions of leaf codes (e.g. a records column); unknown codes are refused.

        The message counts the records with unknown codes (``weights``: records per code, when
        ``codes`` are distinct codes) and shows a few of the tree's leaf codes, never a code of
        ``codes``: which codes the data hold is private.
        """
        lookup = self._lookup[-1]
        codes = [str(c) for c in codes]
        out = np.fromiter((lookup.get(c, -1) for c in codes), dtype=np.intp, count=len(codes))
        if np.any(out < 0):
            raise GeographyError(
                f"{_records(out < 0, weights)} leaf codes that are not leaves of the tree (level "
                f"{self.levels[-1]!r}, whose codes look like {_preview(self._codes[-1][:3])}; the records' codes are "
                "not shown: which codes the data hold is private); use codes of the finest units or add them to the "
                "tree"
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

        Rows not in the tree are refused: the message counts them (``weights``: records per row, when
        the rows are distinct combinations of codes) and names the tree's unit under which the first
        of them leaves the tree, never a code of the rows (which codes the data hold is private).
        """
        if self._columns is None:
            raise GeographyError("locate needs a tree built with from_table; use leaf_index with leaf codes")
        missing = [c for c in self._columns if c not in table.columns]
        if missing:
            raise GeographyError(f"the table has no column(s) {missing}; it has {list(table.columns)}")
        empty = [c for c in self._columns if table[c].isna().any()]
        if empty:
            raise GeographyError(f"some records have no code in column(s) {empty} (missing values): every record "
                                 "needs the code of its unit at every level")
        raw = [table[c].astype(str).tolist() for c in self._columns]
        lookup = self._lookup[-1]
        out = np.fromiter((lookup.get(self._separator.join(parts), -1) for parts in zip(*raw)), dtype=np.intp,
                          count=len(table))
        if not self._separator:  # codes joined without a separator: ("010", "01") must not read as ("01", "001")
            ends = [len(self._codes[d][0]) for d in range(1, len(self.levels))]
            for d, values in enumerate(raw):
                width = ends[d] - (ends[d - 1] if d else 0)
                out[np.fromiter(map(len, values), dtype=np.intp, count=len(values)) != width] = -1
        if np.any(out < 0):
            raise GeographyError(self._outside(raw, out < 0, weights))
        return out

    def _outside(self, raw: list[list[str]], bad: np.ndarray, weights: Iterable[float] | None) -> str:
        """Why records (level codes ``raw``) are not in the tree: their count, and the tree's unit under which
        the first of them (in the tree's order) leaves it. No code of the records is shown (it is private)."""
        first = None
        for row in np.flatnonzero(bad).tolist():
            parts = [raw[d][row] for d in range(len(raw))]
            depth, unit = 0, 0  # the deepest unit of the tree on the record's path
            for d in range(1, len(parts)):
                found = self._lookup[d].get(self._separator.join(parts[:d]))
                if found is None:
                    break
                depth, unit = d, found
            key = (self._leaf_bounds[depth][unit], -depth)
            if first is None or key < first[0]:
                first = (key, depth, unit)
        _, depth, unit = first
        level = self.levels[depth + 1]
        where = "the tree" if depth == 0 else f"the tree under {self.label(depth, unit)}"
        return (f"{_records(bad, weights)} geography codes that are not in the tree: the first, in the tree's "
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

    def label(self, level: str | int, unit: int) -> str:
        """``"state=06 California"``: the level, the unit's code and its name (as given)."""
        d = self.level_index(level)
        code, name = self._codes[d][unit], self._names[d][unit]
        text = " ".join(part for part in (code, name) if part)
        return f"{self.levels[d]}={text}" if text else self.levels[d]

    def __repr__(self) -> str:
        return "GeographyTree(" + ", ".join(f"{name}: {n:,}" for name, n in zip(self.levels, self.sizes)) + ")"

    def _key(self):
        return id(self)
