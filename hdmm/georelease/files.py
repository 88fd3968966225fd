"""Release files: a Parquet dataset partitioned by level, written the same way by both engines.

``<output>/level=<name>/part-*.parquet`` hold one row per unit and query: ``code``, ``name``,
``query`` (dictionary encoded: a unit's code and a query's label are stored once per file),
``answer``, ``std_error`` and ``privacy`` (what the release spent, on every row, since a dataset
has many files). Every file carries the provenance as JSON in its key-value metadata (key
``hdmm``), and ``<output>/_provenance.json`` holds it once more. Files are written into
``<output>.partial`` and the directory is renamed at the end (:func:`finish_output`), so a
failed release leaves no output that looks complete. Needs ``pyarrow`` (``hdmm[parquet]``).

:func:`read_answers` reads one level back as a ``units x queries`` array in the tree's unit order and
the plan's query order (a unit's row is found by its code, a column by its label), checking that
every unit and query is there exactly once: the accuracy report reads a Spark release this way.
"""

from __future__ import annotations

import json
import os

import numpy as np

from ..files import sync_directory, sync_file, write_new
from .plan import GeoPlan

__all__ = ["check_output", "start_output", "release_table", "write_units", "finish_output", "publish", "partial_path",
           "read_answers", "positions_of", "level_index", "answers_at", "level_directory"]


def _arrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("writing Parquet needs pyarrow: pip install 'hdmm[parquet]'") from None
    return pa, pq


def level_directory(name: str) -> str:
    """The directory of level ``name``'s answers in a release, ``level=<name>``, on every engine (the name as it
    is: :func:`hdmm.geography.build.check_levels` refuses names this could not hold)."""
    return f"level={name}"


def _directory(path: str | os.PathLike) -> str:
    """``path`` without a trailing separator (``out/`` is the directory ``out``)."""
    return os.path.normpath(os.fspath(path))


def partial_path(path: str | os.PathLike) -> str:
    """Where a release is written before it is complete: ``<path>.partial`` beside it."""
    return _directory(path) + ".partial"


def check_output(path: str | os.PathLike) -> None:
    """Refuse an output directory that exists, or whose partial directory does (an interrupted run), or a URL
    (the local engine writes on this machine's file system; Spark's writes at URLs: :mod:`~hdmm.georelease.sparkfiles`)."""
    _arrow()
    if "://" in os.fspath(path):
        raise ValueError(f"{os.fspath(path)}: the local engine writes to a path on this machine, not a URL; give a "
                         "path, or use engine='spark', which writes at any URL Spark reaches")
    path = _directory(path)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: choose a new output directory (a release is never overwritten)")
    if os.path.exists(partial_path(path)):
        raise FileExistsError(f"{partial_path(path)} exists (left by an interrupted run?): remove it first")


def start_output(path: str | os.PathLike) -> str:
    """Check that ``path`` is new (:func:`check_output`) and create ``path.partial``; returns it."""
    check_output(path)
    partial = partial_path(path)
    os.makedirs(partial)
    return partial


def release_table(plan: GeoPlan, level: int, units: np.ndarray, answers: np.ndarray, std_errors: np.ndarray,
                  meta: dict, dictionary: bool = True):
    """The release rows of ``units`` (positions at ``level``) as an Arrow table: ``code, name, query, answer,
    std_error, privacy`` (one row per unit and query). ``dictionary``: string columns dictionary encoded (a
    unit's code and a query's label stored once), as the local engine writes them; plain strings for Spark."""
    pa, _ = _arrow()
    tree, q = plan.tree, answers.shape[1]
    units = np.asarray(units, dtype=np.int64)
    n = units.size
    all_codes, all_names = tree.codes(level), tree.names(level)
    codes = pa.array([all_codes[u] for u in units.tolist()], type=pa.string())
    names = pa.array([all_names[u] for u in units.tolist()], type=pa.string())
    labels = pa.array(plan.labels, type=pa.string())
    per_unit = pa.array(np.repeat(np.arange(n, dtype=np.int32), q))
    columns = {
        "code": pa.DictionaryArray.from_arrays(per_unit, codes),
        "name": pa.DictionaryArray.from_arrays(per_unit, names),
        "query": pa.DictionaryArray.from_arrays(pa.array(np.tile(np.arange(q, dtype=np.int32), n)), labels),
        "answer": pa.array(np.ascontiguousarray(answers, dtype=float).ravel()),
        "std_error": pa.array(np.ascontiguousarray(std_errors, dtype=float).ravel()),
        "privacy": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n * q, dtype=np.int32)),
                                                  pa.array([meta["privacy_description"]])),
    }
    if not dictionary:
        columns = {k: v.cast(pa.string()) if pa.types.is_dictionary(v.type) else v for k, v in columns.items()}
    return pa.table(columns)


def write_units(partial: str, plan: GeoPlan, level: int, units: np.ndarray, answers: np.ndarray,
                std_errors: np.ndarray, meta: dict, name: str) -> int:
    """Write the answers of ``units`` (positions at ``level``) as ``partial/level=<level>/<name>.parquet``
    (flushed to disk before it returns: :func:`finish_output` renames what is complete).

    Returns the number of rows written.
    """
    _, pq = _arrow()
    table = release_table(plan, level, units, answers, std_errors, meta)
    table = table.replace_schema_metadata({b"hdmm": json.dumps(meta).encode()})
    directory = os.path.join(partial, level_directory(plan.tree.levels[level]))
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.parquet")
    pq.write_table(table, path)
    sync_file(path)
    return table.num_rows


def finish_output(partial: str, path: str | os.PathLike, meta: dict) -> None:
    """Write ``_provenance.json``, flush the partial directory to disk and rename it to ``path`` (the release
    appears whole or not at all)."""
    write_new(os.path.join(partial, "_provenance.json"), json.dumps(meta, indent=2).encode())
    publish(partial, path, files_synced=True)


def publish(partial: str, path: str | os.PathLike, *, files_synced: bool = False) -> None:
    """Flush the directory tree ``partial`` to disk (its files too unless ``files_synced``: each was flushed when
    written) and rename it to ``path``, durably: the release appears whole or not at all, also after a crash."""
    for root, directories, files in os.walk(partial):
        if not files_synced:
            for f in files:
                sync_file(os.path.join(root, f))
        for d in directories:
            sync_directory(os.path.join(root, d))
    sync_directory(partial)
    os.rename(partial, _directory(path))
    sync_directory(os.path.dirname(os.path.abspath(_directory(path))))


def _positions(column, index: dict[str, int], what: str, level: str) -> np.ndarray:
    """Each row's position (``index`` of its string) from a string or dictionary column (chunk by chunk: the
    files' dictionaries differ)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = []
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        names = chunk.dictionary.to_pylist()
        unknown = [x for x in names if x not in index]
        if unknown:
            raise ValueError(f"level {level!r} holds {what} {unknown[:3]} that the plan does not have: were these "
                             "files written by another release?")
        lookup = np.array([index[x] for x in names], dtype=np.int64)
        out.append(lookup[chunk.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def positions_of(code, query, index: tuple[dict[str, int], dict[str, int]], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row's unit and query positions from its ``code`` and ``query`` (Arrow string or dictionary columns)
    and the level's lookups (:func:`level_index`); raises if a unit or query is not there. ``name``: the
    level's, for the errors."""
    units, queries = index
    return _positions(code, units, "units", name), _positions(query, queries, "queries", name)


def level_index(plan: GeoPlan, level: int) -> tuple[dict[str, int], dict[str, int]]:
    """The positions of ``level``'s unit codes and of the plan's query labels."""
    return {str(c): i for i, c in enumerate(plan.tree.codes(level))}, {x: j for j, x in enumerate(plan.labels)}


def answers_at(plan: GeoPlan, level: int, rows: np.ndarray, cols: np.ndarray, answer: np.ndarray,
               where: str) -> np.ndarray:
    """The ``units x queries`` array of one level from its rows' positions and answers; raises if a (unit,
    query) pair is missing or repeated. ``where`` names the files in the errors."""
    units, queries = plan.tree.sizes[level], plan.queries
    out = np.full((units, queries), np.nan)
    out[rows, cols] = answer
    if len(answer) != out.size or np.isnan(out).any():
        raise ValueError(f"{where}: {len(answer):,} answers for {units:,} units x {queries:,} queries; a "
                         "unit or query is missing or repeated (an incomplete or mixed release?)")
    return out


def read_answers(path: str | os.PathLike, plan: GeoPlan, level: str | int) -> np.ndarray:
    """The ``units x queries`` answers of ``level`` read back from the release directory ``path``.

    Rows follow ``plan.tree``'s units of the level, columns ``plan.labels``. Raises if the directory
    has no such level, holds a unit or query the plan does not have, or misses or repeats a
    (unit, query) pair.
    """
    import pyarrow as pa

    _, pq = _arrow()
    tree = plan.tree
    d = tree.level_index(level)
    name = tree.levels[d]
    directory = os.path.join(_directory(path), level_directory(name))
    files = sorted(f for f in os.listdir(directory) if f.endswith(".parquet")) if os.path.isdir(directory) else []
    if not files:
        raise FileNotFoundError(f"{directory}: no answers of level {name!r} (released levels have a 'level=<name>' "
                                "directory of Parquet files)")
    tables = [pq.read_table(os.path.join(directory, f), columns=["code", "query", "answer"]) for f in files]
    table = pa.concat_tables(tables, promote_options="permissive")
    rows, cols = positions_of(table.column("code"), table.column("query"), level_index(plan, d), name)
    return answers_at(plan, d, rows, cols, table.column("answer").to_numpy(), directory)
