r"""Release files written by Spark, at any URL Spark can reach: no file system shared with the driver is assumed.

A Spark release is written where the user's Spark session writes: ``hdfs://``, ``s3a://``,
``dbfs:``, ``file://``, or a path without a scheme, which Spark resolves against its default file
system (``fs.defaultFS``; the driver's disk only in local mode). So the driver never touches the
output with ``os``: the answers are written by Spark's Parquet data source, and the few operations
on whole files (does the output exist, write ``_provenance.json``, rename, delete) go through
Hadoop's ``FileSystem`` of the session's configuration (:class:`HadoopFiles`).

The layout is that of :mod:`hdmm.georelease.files`: ``<output>/level=<name>/part-*.parquet`` with the
columns ``code, name, query, answer, std_error, privacy`` and ``<output>/_provenance.json``, written
into ``<output>.partial`` and renamed when complete (a failed release's partial directory is
deleted). Spark's writer cannot add the provenance to every file's metadata as the local engine
does; every row carries the privacy spent, and ``_provenance.json`` the rest.

Answers travel as rows: a task's writer (:class:`SparkAnswers`) hands each unit's answers to the
Spark engine, which writes them after the step (:func:`release_rows` makes the release rows, with
their standard errors, inside Spark). Answers written on the driver (the levels above the partition
level) go the same way through a small DataFrame.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import numpy as np

from .files import answers_at, level_directory, level_index, positions_of, release_table
from .plan import GeoPlan
from .workers import return_free_memory

__all__ = ["HadoopFiles", "SparkFiles", "SparkAnswers", "release_rows", "RELEASE_SCHEMA", "task_rows"]

#: The schema of the release rows Spark writes (``level`` becomes the ``level=<name>`` directories).
RELEASE_SCHEMA = ("level string, code string, name string, query string, answer double, std_error double, "
                  "privacy string")


class HadoopFiles:
    """Whole-file operations through the Hadoop ``FileSystem`` of ``spark``'s configuration (the one its
    readers and writers use), so that any URL Spark reaches works, and a path without a scheme means what
    it means to Spark. A classic session's only (:meth:`of` gives ``None`` for Spark Connect, whose client
    has no JVM)."""

    def __init__(self, spark) -> None:
        self._jvm = spark._jvm
        self._conf = spark._jsparkSession.sessionState().newHadoopConf()

    @classmethod
    def of(cls, spark) -> HadoopFiles | None:
        return cls(spark) if getattr(spark, "_jvm", None) is not None else None

    def _fs(self, url: str):
        path = self._jvm.org.apache.hadoop.fs.Path(url)
        return path.getFileSystem(self._conf), path

    def qualified(self, url: str) -> str:
        """``url`` with its file system's scheme and authority (a path without a scheme: Spark's default)."""
        fs, path = self._fs(url)
        return str(fs.makeQualified(path).toString())

    def exists(self, url: str) -> bool:
        fs, path = self._fs(url)
        return bool(fs.exists(path))

    def delete(self, url: str) -> None:
        fs, path = self._fs(url)
        if fs.exists(path):
            fs.delete(path, True)

    def rename(self, source: str, target: str) -> None:
        fs, path = self._fs(source)
        if not fs.rename(path, self._jvm.org.apache.hadoop.fs.Path(target)):
            raise OSError(f"could not rename {source} to {target}")

    def write_text(self, url: str, text: str) -> None:
        """Create the file ``url`` (never overwriting one) holding ``text``; closed (flushed) before it returns."""
        fs, path = self._fs(url)
        stream = fs.create(path, False)
        try:
            stream.write(bytearray(text.encode()))
            stream.hsync()
        finally:
            stream.close()


class SparkFiles:
    """The release files of a Spark release at ``url`` (module docstring): checked (new, no partial directory
    left by an interrupted run) when made, before any noise.

    On a Spark Connect session (no file operations on the client) the answers of every step are kept in the
    executors until :meth:`finish`, which writes them in one job straight to ``url`` (Spark's committer
    publishes a job's files together, so a failed release writes nothing), then ``_provenance.json`` as a
    one-line text dataset (a directory holding one ``part-*`` file).
    """

    def __init__(self, spark, url: str, plan: GeoPlan | None = None) -> None:
        self.spark, self.fs, self.plan, self.meta = spark, HadoopFiles.of(spark), plan, None
        url = url.rstrip("/") or url
        self.path = url if self.fs is None else self.fs.qualified(url)
        self.partial = self.path + ".partial"
        self._pending: list = []  # Spark Connect: the answers until finish
        if self._exists(self.path):
            raise FileExistsError(f"{self.path} exists: choose a new output directory (a release is never "
                                  "overwritten)")
        if self._exists(self.partial):
            raise FileExistsError(f"{self.partial} exists (left by an interrupted run?): remove it first")

    def _exists(self, url: str) -> bool:
        if self.fs is not None:
            return self.fs.exists(url)
        from pyspark.errors import AnalysisException

        try:  # Spark Connect: a path Spark cannot list does not exist
            self.spark.read.format("binaryFile").load(url).limit(1).collect()
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" in str(exc) or "Path does not exist" in str(exc):
                return False
            raise
        return True

    def answers(self, meta: dict) -> SparkAnswers:
        """The output the release's tasks write to; the provenance ``meta`` is also what :meth:`write_units`
        writes with."""
        self.meta = meta
        return SparkAnswers(meta, self.write_parts)

    def write(self, rows, level: str | None = None) -> None:
        """Append a DataFrame of release rows (:data:`RELEASE_SCHEMA`) to the partial directory (Spark Connect:
        keep it for :meth:`finish`).

        Rows all of one ``level`` are written straight into its directory
        (:func:`~hdmm.georelease.files.level_directory`, the local engine's too). Spark sorts the rows of a
        ``partitionBy`` write by the partition column first, holding a task's rows in the JVM's heap (and
        spilling them), which a write of one level does not need. (Spark Connect's :meth:`finish` writes all
        the levels in one ``partitionBy`` job: a failed release then writes nothing.)"""
        if self.fs is None:
            self._pending.append(rows)
        elif level is None:
            rows.write.mode("append").partitionBy("level").parquet(self.partial)
        else:
            rows.drop("level").write.mode("append").parquet(f"{self.partial}/{level_directory(level)}")

    def write_parts(self, parts: list) -> None:
        """Append answers held on the driver (``(level, units, answers)`` parts), one level at a time."""
        import pyarrow as pa

        parts = [(d, units, answers) for d, units, answers in parts if np.size(units)]
        for d in sorted({d for d, _, _ in parts}):
            tables = [_level_rows(self.plan, d, units, answers, self.meta) for e, units, answers in parts if e == d]
            self.write(self.spark.createDataFrame(pa.concat_tables(tables)), self.plan.tree.levels[d])

    def write_units(self, rows, plan, levels: list[int]) -> None:
        """Append a DataFrame of ``level, unit, values`` rows (units' answers of ``levels``, made in tasks) as
        release rows, one level at a time; ``plan`` is what the tasks read it from (a broadcast, or the plan)."""
        from pyspark.sql import functions as F

        meta, names = self.meta, self.plan.tree.levels
        for d in levels:
            self.write(rows.filter(F.col("level") == d).mapInArrow(
                lambda batches: release_rows(plan.value, meta, batches), RELEASE_SCHEMA), names[d])

    def finish(self, answers: SparkAnswers | None, meta: dict) -> None:
        """Write ``_provenance.json`` and rename the partial directory to the output (Spark Connect: write the
        answers, then the provenance)."""
        text = json.dumps(meta, indent=2)
        if self.fs is not None:
            self.fs.write_text(self.partial + "/_provenance.json", text)
            self.fs.rename(self.partial, self.path)
            return
        rows = self._pending[0]
        for more in self._pending[1:]:
            rows = rows.unionByName(more)
        rows.write.mode("error").partitionBy("level").parquet(self.path)
        self._pending.clear()
        self.spark.createDataFrame([(json.dumps(meta),)], "value string").coalesce(1).write.text(
            self.path + "/_provenance.json")

    def abort(self) -> None:
        if self.fs is not None:
            self.fs.delete(self.partial)
        self._pending.clear()

    def frame(self):
        """The release's answers as a Spark DataFrame (``level`` a string, whatever its names look like)."""
        return self.spark.read.schema(RELEASE_SCHEMA).parquet(self.path)

    def read(self, plan: GeoPlan, level: int) -> np.ndarray:
        """The ``units x queries`` answers of ``level``, read back through Spark: each row's unit and query
        positions found in the executors (only positions and answers reach the driver, 16 bytes a row)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        name = plan.tree.levels[level]
        index = level_index(plan, level)

        def positions(batches):
            for batch in batches:
                rows, cols = positions_of(batch.column("code"), batch.column("query"), index, name)
                yield pa.RecordBatch.from_pydict({"row": rows.astype(np.int32), "col": cols.astype(np.int32),
                                                  "answer": batch.column("answer")})

        table = (self.frame().where(F.col("level") == name).select("code", "query", "answer")
                 .mapInArrow(positions, "row int, col int, answer double").toArrow())
        if table.num_rows == 0:
            raise FileNotFoundError(f"{self.path}: no answers of level {name!r}")
        return answers_at(plan, level, table.column("row").to_numpy(), table.column("col").to_numpy(),
                          table.column("answer").to_numpy(), self.path)

    def copy(self, path: str, meta: dict) -> None:
        """Write the release again at ``path`` (new), through Spark."""
        from pyspark.sql import functions as F

        target = SparkFiles(self.spark, path, self.plan)
        frame = self.frame()
        for name in meta["levels"]:  # the released levels, each into its own directory
            target.write(frame.where(F.col("level") == name), name)
        target.finish(None, meta)


# ---------------------------------------------------------------------------------------------- answers as rows
_TASK = threading.local()  # the rows of the Spark task running in this thread (task_rows)


class task_rows:
    """While a Spark task runs its step's function: the answers its writers give (``level, units, answers``)."""

    def __enter__(self) -> list:
        _TASK.rows = []
        return _TASK.rows

    def __exit__(self, *exc) -> None:
        _TASK.rows = None


class _Rows:
    def __init__(self) -> None:
        self.parts: list[tuple[int, np.ndarray, np.ndarray]] = []

    def write(self, level: int, units: np.ndarray, answers: np.ndarray, totals: np.ndarray) -> None:
        self.parts.append((int(level), np.asarray(units, dtype=np.int64), np.asarray(answers, dtype=float)))

    def result(self):
        rows = getattr(_TASK, "rows", None)
        if rows is None:  # on the driver: the answers themselves, which gather writes
            return self.parts
        rows.extend(self.parts)  # in a task: the engine writes them with the step's other rows
        return sum(units.size for _, units, _ in self.parts)


class SparkAnswers:
    """The answers output of a Spark release (:mod:`hdmm.georelease.stores`' protocol): writers in tasks hand
    their rows to the engine (module docstring); answers written on the driver are written by ``write``."""

    def __init__(self, meta: dict, write: Callable | None = None) -> None:
        self.meta, self.rows, self._write = meta, 0, write

    def __getstate__(self) -> dict:  # shipped to tasks without the driver's writer
        return {"meta": self.meta, "rows": 0, "_write": None}

    def writer(self, tag: str, plan: GeoPlan) -> _Rows:
        return _Rows()

    def gather(self, result) -> None:
        if isinstance(result, list):
            if result:
                self._write(result)
            self.rows += sum(units.size for _, units, _ in result)
        else:
            self.rows += int(result)


def _level_rows(plan: GeoPlan, d: int, units: np.ndarray, answers: np.ndarray, meta: dict):
    """The release rows (:data:`RELEASE_SCHEMA`) of ``units`` of level ``d``, with their standard errors."""
    import pyarrow as pa

    table = release_table(plan, d, units, answers, np.sqrt(plan.variances(d, units)), meta, dictionary=False)
    return table.add_column(0, "level", pa.array([plan.tree.levels[d]] * table.num_rows, type=pa.string()))


def release_rows(plan: GeoPlan, meta: dict, batches: Iterator) -> Iterator:
    """Arrow batches of release rows (:data:`RELEASE_SCHEMA`) from batches of ``level, unit, values`` (a unit's
    answers): what Spark writes (``mapInArrow``). The worker's earlier tasks' freed memory is given back first
    (:func:`~hdmm.georelease.workers.return_free_memory`): this runs after a step's tasks, which may be large."""
    return_free_memory()
    for batch in batches:
        if batch.num_rows == 0:
            continue
        levels = batch.column("level").to_numpy()
        units = batch.column("unit").to_numpy()
        values = batch.column("values")
        q = plan.queries
        answers = values.flatten().to_numpy().reshape(batch.num_rows, q)
        for d in np.unique(levels).tolist():
            at = np.flatnonzero(levels == d)
            order = at[np.argsort(units[at], kind="stable")]
            yield from _level_rows(plan, d, units[order], answers[order], meta).to_batches()
