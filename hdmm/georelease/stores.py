"""Where a geography release keeps each partition's estimates between stages, and where its answers go.

A release works partition by partition (a unit of the partition level and its subtree: a county
or a tract and everything below it). Between its stages (measure, estimate, answer) each
partition's estimates, ``{level: units x k}``, are kept by a *store*:

* :class:`MemoryStore` keeps them in this process (a release of a state or two);
* :class:`DiskStore` keeps them as one ``.npz`` file per partition in a private work
  directory, so that memory follows the largest partition, not the country. The files hold noisy
  estimates only (never the data's exact counts) and the directory is removed when the release
  ends, whether it succeeds or fails.

A task may run in a forked worker process: :meth:`save` runs there and returns what must travel
back, :meth:`accept` takes it in the calling process (the memory store's vectors; nothing for
the disk store, whose worker wrote the files itself).

The answers go to an *output*: :class:`MemoryAnswers` (the arrays of an in-memory
:class:`~hdmm.georelease.release.GeoRelease`) or :class:`ParquetAnswers` (the release files of
:mod:`hdmm.georelease.files`, written by the tasks themselves). A task takes a writer from
:meth:`~MemoryAnswers.writer` (``writer(tag, plan)``: ``tag`` names its files), calls
``write(level, units, answers, totals)`` and returns
``writer.result()``; the caller hands that to :meth:`~MemoryAnswers.gather`.

>>> store = MemoryStore()
>>> store.accept(3, store.save(3, {2: np.zeros((2, 4))}))
>>> store.load(3)[2].shape
(2, 4)
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from .files import check_output, finish_output, partial_path, publish, read_answers, start_output, write_units
from .plan import GeoPlan

__all__ = ["MemoryStore", "DiskStore", "MemoryAnswers", "ParquetAnswers", "ReleaseFiles", "copy_release", "UNITS_PER_FILE"]

#: Units per release file (each unit is ``queries`` rows).
UNITS_PER_FILE = 1024


class MemoryStore:
    """Every partition's estimates in this process (module docstring)."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[int, np.ndarray]] = {}

    def save(self, unit: int, vectors: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
        return vectors

    def accept(self, unit: int, token) -> None:
        self._parts[unit] = token

    def load(self, unit: int) -> dict[int, np.ndarray]:
        return self._parts[unit]

    def close(self) -> None:
        self._parts.clear()


class DiskStore:
    """Every partition's estimates as files in a new private directory under ``parent`` (module docstring).

    ``parent`` must exist; the store's own subdirectory (mode 0700) is made here and removed by
    :meth:`close`.
    """

    def __init__(self, parent: str | os.PathLike) -> None:
        parent = os.fspath(parent)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"work directory {parent} is not an existing directory")
        self.path = tempfile.mkdtemp(prefix="hdmm-estimates-", dir=parent)

    def _file(self, unit: int) -> str:
        return os.path.join(self.path, f"{unit:08d}.npz")

    def save(self, unit: int, vectors: dict[int, np.ndarray]) -> None:
        with open(self._file(unit), "wb") as fh:  # replaces the partition's file of an earlier stage
            np.savez(fh, **{f"level{d}": np.ascontiguousarray(v) for d, v in vectors.items()})

    def accept(self, unit: int, token) -> None:
        return None

    def load(self, unit: int) -> dict[int, np.ndarray]:
        with np.load(self._file(unit), allow_pickle=False) as data:
            return {int(name[5:]): data[name] for name in data.files}

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class _Collected:
    def __init__(self) -> None:
        self.parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def write(self, level: int, units: np.ndarray, answers: np.ndarray, totals: np.ndarray) -> None:
        self.parts.append((level, np.asarray(units), np.asarray(answers), np.asarray(totals)))

    def result(self) -> list:
        return self.parts


class MemoryAnswers:
    """Every released unit's answers and total, as ``level -> units x (queries + 1)`` arrays (:attr:`rows`)."""

    def __init__(self, plan: GeoPlan) -> None:
        self.rows = {d: np.full((plan.tree.sizes[d], plan.queries + 1), np.nan) for d in plan.levels}

    def writer(self, tag: str, plan: GeoPlan) -> _Collected:
        return _Collected()

    def gather(self, result: list) -> None:
        for level, units, answers, totals in result:
            self.rows[level][units, :-1] = answers
            self.rows[level][units, -1] = totals


class _Files:
    def __init__(self, partial: str, plan: GeoPlan, meta: dict, tag: str) -> None:
        self.partial, self.plan, self.meta, self.tag, self.rows = partial, plan, meta, tag, 0

    def write(self, level: int, units: np.ndarray, answers: np.ndarray, totals: np.ndarray) -> None:
        units = np.asarray(units)
        for first in range(0, units.size, UNITS_PER_FILE):
            chunk = units[first:first + UNITS_PER_FILE]
            self.rows += write_units(self.partial, self.plan, level, chunk, answers[first:first + UNITS_PER_FILE],
                                     np.sqrt(self.plan.variances(level, chunk)), self.meta,
                                     f"part-{self.tag}-{int(chunk[0]):09d}")

    def result(self) -> int:
        return self.rows


class ParquetAnswers:
    """Answers written as release files into the partial directory ``partial`` (:mod:`hdmm.georelease.files`),
    with their standard errors and the provenance ``meta``; :attr:`rows` counts the rows written. (It holds
    no plan: a task's writer gets the plan the task has.)"""

    def __init__(self, partial: str, meta: dict) -> None:
        self.partial, self.meta, self.rows = partial, meta, 0

    def writer(self, tag: str, plan: GeoPlan) -> _Files:
        return _Files(self.partial, plan, self.meta, tag)

    def gather(self, result: int) -> None:
        self.rows += result


class ReleaseFiles:
    """The release files at ``path`` on this machine's file system (:mod:`hdmm.georelease.files`), checked
    (new, no partial directory left by an interrupted run) when made, before any noise.

    An engine's output target: :meth:`answers` starts the partial directory and gives the output the
    tasks write to, :meth:`finish` renames it complete, :meth:`abort` removes it, :meth:`read` reads a
    level back and :meth:`copy` writes the release again elsewhere. (Spark's, at any URL:
    :class:`hdmm.georelease.sparkfiles.SparkFiles`.)
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.path.normpath(os.fspath(path))
        check_output(self.path)

    def answers(self, meta: dict) -> ParquetAnswers:
        return ParquetAnswers(start_output(self.path), meta)

    def finish(self, answers: ParquetAnswers, meta: dict) -> None:
        finish_output(answers.partial, self.path, meta)

    def abort(self) -> None:
        shutil.rmtree(partial_path(self.path), ignore_errors=True)

    def read(self, plan: GeoPlan, level: int) -> np.ndarray:
        return read_answers(self.path, plan, level)

    def copy(self, path: str | os.PathLike, meta: dict) -> None:
        copy_release(self.path, path)


def copy_release(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Copy the written release ``source`` to the new directory ``path``, durably and whole or not at all."""
    check_output(path)
    shutil.copytree(source, partial_path(path))
    publish(partial_path(path), path)
