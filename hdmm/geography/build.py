"""Building a :class:`~hdmm.geography.GeographyTree` level by level with array operations.

A table of units (one row per finest unit, one column of codes per level) becomes, level by
level, the arrays the tree keeps: each unit's parent position and the rank of its own code
among the level's sorted distinct codes. A row's unit at level ``d`` is the pair (its unit at
level ``d - 1``, its code at ``d``), written as the integer key ``parent * K + rank`` (``K``
distinct codes at ``d``); ``np.unique`` of the keys numbers the units in depth-first order
(parent first, then code) and gives every row its unit. Each level costs one sort of the rows:
the 8.1 million blocks of the United States are read in seconds, with no Python object per unit.

A tree from child -> parent pairs (:func:`parents_levels`) is read the same way once each unit's
depth is known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from .codes import CodeColumn, GeographyError, preview

__all__ = ["check_levels", "check_table", "build_level", "unit_names", "parents_levels"]


#: Characters a level name may not hold: a release writes each level's answers in a directory named
#: ``level=<name>`` (the Hive layout that Spark, pyarrow and pandas read), where these would be escaped, or
#: would split the path or the ``key=value`` pair (or are not allowed in a file name on Windows).
UNSAFE_IN_LEVEL = frozenset('"#%\'*/:=?\\{[]^<>|') | frozenset(map(chr, [*range(32), 127]))


def _level_name_problem(name: str) -> str | None:
    bad = sorted(set(name) & UNSAFE_IN_LEVEL)
    if bad:
        return f"holds {bad}"
    if not name.strip():
        return "is empty"
    if name != name.strip() or name.endswith("."):
        return "starts or ends with a space, or ends with '.'"
    if name == "__HIVE_DEFAULT_PARTITION__":
        return "is what Hive-style readers take for a missing value"
    return None


def check_levels(levels: Sequence[str]) -> tuple[str, ...]:
    """The level names as a tuple. Refused: a name that ``level=<name>`` directories could not hold as it is
    (empty, with a character of ``UNSAFE_IN_LEVEL``, with a space at either end or a final ``.``), and names
    that are the same but for case (one directory on file systems that ignore case)."""
    levels = tuple(str(name) for name in levels)
    seen: set[str] = set()
    for name in levels:
        problem = _level_name_problem(name)
        if problem is not None:
            raise GeographyError(f"level name {name!r} {problem}: releases are written in directories named "
                                 "level=<name>, so use letters, digits, inner spaces, '_', '-' or '.' (rename the "
                                 "level, or the table's column)")
        if name.casefold() in seen:
            raise GeographyError(f"level {name!r} is named twice in {list(levels)} (case aside): give every level "
                                 "its own name")
        seen.add(name.casefold())
    return levels


def check_table(table, columns: tuple[str, ...], names: Mapping[str, str], prefixed: Sequence[str]) -> None:
    """Refuse a table of units without the columns it needs, or without rows."""
    if not columns:
        raise GeographyError("from_table needs at least one level column below the root")
    missing = [c for c in list(columns) + list(names.values()) if c not in table.columns]
    if missing:
        raise GeographyError(f"the table has no column(s) {missing}; it has {list(table.columns)}")
    unknown = [level for level in names if level not in columns]
    if unknown:
        raise GeographyError(f"names given for levels {unknown} that are not among {list(columns)}")
    unknown = [level for level in prefixed if level not in columns or level == columns[0]]
    if unknown:
        raise GeographyError(f"prefixed levels {unknown} must be levels below the first of {list(columns)}")
    if len(table) == 0:
        raise GeographyError("the geography is empty: the table has no rows")


def _row_code(read: Sequence[CodeColumn], row: int, separator: str) -> str:
    return separator.join(str(col.values[col.ranks[row]]) for col in read)


def build_level(row_unit: np.ndarray, col: CodeColumn, last: bool, table, columns: tuple[str, ...],
                read: Sequence[CodeColumn], separator: str, names: Mapping[str, str]):
    """``(parent, rank, row_unit)`` of the next level: its units' parents and code ranks, and each row's unit.

    At the finest level every row must be its own unit: a repeated one says what is wrong.
    """
    K = max(col.values.size, 1)
    key = row_unit * K + col.ranks
    keys, first, inverse, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    if last and keys.size != key.size:
        row = int(first[counts > 1].min())
        raise GeographyError(_repeated_leaf(table, columns, read, row, int(counts[inverse[row]]), separator, names))
    return (keys // K).astype(np.intp), keys % K, np.asarray(inverse, dtype=np.int64).ravel()


def _repeated_leaf(table, columns: tuple[str, ...], read, row: int, rows: int, separator: str,
                   names: Mapping[str, str]) -> str:
    """What is wrong with a table of units in which a finest unit has several rows: most often a table of
    finer units (tracts) given with fewer levels (state, county). The table is public: its codes may be shown."""
    level, code = columns[-1], _row_code(read, row, separator)
    finer = [str(c) for c in table.columns if str(c) not in columns and str(c) not in set(names.values())]
    message = (f"{level} {code!r} is in {rows} rows of the table of units, which must have one row per unit of the "
               f"finest level ({level!r})")
    if finer:
        return (message + f"; the table has other columns {finer}: if its rows are finer units, give their level "
                f"too, e.g. levels {[*columns, finer[0]]} (hdmm release: --geography "
                f"{','.join([*columns, finer[0]])}), or give a table with one row per {level}")
    return message + f": its rows repeat (duplicate codes); list each {level} once"


def unit_names(column, row_unit: np.ndarray, units: int, level: str, read: Sequence[CodeColumn],
               separator: str) -> tuple[np.ndarray, np.ndarray]:
    """Display names of a level's units (``(ranks, values)``) from a column of the table; a unit named in two
    ways is refused."""
    fac, distinct = pd.factorize(column, use_na_sentinel=False)
    values, inverse = np.unique(np.array([str(v) for v in distinct], dtype=str), return_inverse=True)
    row_name = np.asarray(inverse, dtype=np.int64).ravel()[fac]
    named = np.zeros(units, dtype=np.int64)
    named[row_unit] = row_name
    clash = np.flatnonzero(named[row_unit] != row_name)
    if clash.size:
        row = int(clash[0])
        raise GeographyError(f"{level} {_row_code(read, row, separator)!r} is named both "
                             f"{str(values[named[row_unit[row]]])!r} and {str(values[row_name[row]])!r}; give it one "
                             "name")
    return named, values


def parents_levels(pairs: Mapping[object, object] | Iterable[tuple[object, object]], levels: tuple[str, ...],
                   names: Mapping[object, str] | None):
    """``(parents, ranks, values, names)`` of a tree given by child -> parent pairs (see
    :meth:`GeographyTree.from_parents`), after checking it is one tree with one depth per level."""
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
            f"units without a parent: {preview(explicit_roots + orphans)} (a tree has one root); give each "
            "of them a parent with another child -> parent pair"
        )
    if not orphans and not explicit_roots:
        raise GeographyError("no root: every unit has a parent, so the child -> parent pairs form a cycle")
    for code in orphans:
        parent_of[code] = None
    codes = np.array(list(parent_of), dtype=str)
    position = {c: i for i, c in enumerate(parent_of)}
    up = np.array([-1 if p is None else position[p] for p in parent_of.values()], dtype=np.int64)
    depth = np.full(codes.size, -1, dtype=np.int64)
    depth[up < 0] = 0
    for d in range(1, codes.size + 1):
        new = (depth < 0) & (depth[np.maximum(up, 0)] == d - 1) & (up >= 0)
        if not new.any():
            break
        depth[new] = d
    if np.any(depth < 0):
        start = str(codes[np.flatnonzero(depth < 0)[0]])
        seen, code = set(), start
        while code not in seen:
            seen.add(code)
            code = parent_of[code]
        raise GeographyError(f"the child -> parent pairs form a cycle through unit {code!r}; break it")
    height = int(depth.max()) + 1
    if height > len(levels):
        first = _ordered_units(codes, up, depth, len(levels))[len(levels)][0]
        raise GeographyError(
            f"the tree is deeper than its {len(levels)} levels {list(levels)}: unit {str(codes[first])!r} would be "
            f"at level {len(levels)}; name one level per depth")
    if height != len(levels):
        raise GeographyError(f"the tree has {height} levels but {len(levels)} level names {list(levels)} were given")
    ordered = _ordered_units(codes, up, depth, height)
    has_child = np.zeros(codes.size, dtype=bool)
    has_child[up[up >= 0]] = True
    for d, nodes in enumerate(ordered[:-1]):
        short = nodes[~has_child[nodes]]
        if short.size:
            raise GeographyError(
                f"{short.size} units of level {levels[d]!r} have no units below them (the first: "
                f"{str(codes[short[0]])!r}), but every path must reach the finest level {levels[-1]!r}; "
                "give each such unit one child at every finer level (e.g. a unit that is its own county)"
            )
    names = {} if names is None else {str(k): str(v) for k, v in names.items()}
    label = np.array([names.get(str(c), "") for c in codes.tolist()], dtype=str)
    slot = np.zeros(codes.size, dtype=np.int64)
    parents, ranks, values, unit_names_ = [], [], [], []
    for d, nodes in enumerate(ordered):
        slot[nodes] = np.arange(nodes.size)
        parents.append(slot[up[nodes]].astype(np.intp) if d else np.zeros(0, dtype=np.intp))
        level_values, rank = np.unique(codes[nodes], return_inverse=True)
        values.append(level_values)
        ranks.append(np.asarray(rank, dtype=np.int64).ravel())
        name_values, name_rank = np.unique(label[nodes], return_inverse=True)
        unit_names_.append((np.asarray(name_rank, dtype=np.int64).ravel(), name_values))
    return parents, ranks, values, unit_names_


def _ordered_units(codes: np.ndarray, up: np.ndarray, depth: np.ndarray, height: int) -> list[np.ndarray]:
    """The units of each depth in depth-first order: by their parent's position, then by code."""
    out = [np.flatnonzero(depth == 0)]
    slot = np.zeros(codes.size, dtype=np.int64)
    slot[out[0]] = 0
    for d in range(1, height + 1):
        nodes = np.flatnonzero(depth == d)
        if not nodes.size:
            break
        nodes = nodes[np.lexsort((codes[nodes], slot[up[nodes]]))]
        slot[nodes] = np.arange(nodes.size)
        out.append(nodes)
    return out
