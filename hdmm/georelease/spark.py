r"""The Spark engine of a geography release: the steps of :mod:`hdmm.georelease.pipeline` as Spark stages.

The steps are those of :mod:`hdmm.georelease.pipeline`; :class:`SparkEngine` runs their tasks as
Spark stages. The plan and each step's inputs are broadcast. A partition's state (its units'
estimates) is a set of rows ``(kind, partition, level, unit, values)`` of a DataFrame:

* *measure*: the records are counted by partition, leaf and person values, the counts grouped by
  partition (``groupBy(partition).applyInPandas``), and each task builds its leaves' histograms
  and measures them. Data held on the driver (:class:`~hdmm.georelease.units.RecordHistograms`,
  :class:`~hdmm.georelease.units.ArrayHistograms`) are sent once, as a row per partition holding its
  histograms, never broadcast; any other picklable histogram source (one that draws or reads its
  histograms itself) is broadcast and called in ``mapInPandas`` over the partition ids. Partitions
  without any record are measured on the driver, with their own noise streams;
* *update*: the state rows grouped by partition again, one task per partition;
* *map*: the families above the partition level, ``mapInPandas`` over their ids.

A step's output (its partitions' new states, each task's result, pickled, and the released units'
answers, each row's ``kind`` saying which) is checkpointed in the executors
(``localCheckpoint``, on their local disks): computed once, so that the noise is drawn exactly once;
if an executor holding it is lost, the release fails instead of drawing that noise again. Nothing is
written to any shared file system but the output: the answers are appended to it by Spark's Parquet
writer, at whatever URL the session reaches (:mod:`hdmm.georelease.sparkfiles`). The results come
back to the driver: they hold the partitions' exact total histograms, so they live only in the
executors' block managers (encrypted on disk in the sessions :func:`spark_session` makes:
``spark.io.encryption.enabled``) and in the driver's memory, and the checkpoints are removed from the
executors when the release ends, whether it succeeded or failed.

Memory: ``groupBy(...).applyInArrow`` hands each task its whole group: its partition's distinct
(leaf, person values) counts, at most its leaves times the person cells however many people live
there (the partition level bounds its units: :func:`~hdmm.georelease.plan.default_partition`), and
then its units' strategy answers (units x strategy rows x 8 bytes, 1.35 GB for the 4,669 tracts of
the largest synthetic county under SF1). They come as Arrow batches (Spark's
``spark.sql.execution.arrow.maxBytesPerBatch``, 64 MB by default) and are gathered into one array
per level (a view of Arrow's buffer when they come in one batch, in unit order); a task's new state
goes to Arrow as its own arrays, without a copy, in batches of at most ``BATCH_VALUES`` doubles. A
task so holds its partition's state twice, and its step's work arrays (about two more states in the
least-squares passes), once per concurrent task; the top-down walk below the partition's units reads its
state row by row instead (a task function's ``reads_rows``: :class:`_Rows`), so holds it once, and its
families' arrays. Those arrays live in the Python workers, outside the
JVM's heap, which holds the shuffles and Arrow batches; a worker gives what its last task freed back
to the operating system as the next begins (:func:`~hdmm.georelease.workers.return_free_memory`).
A step's answers are written one level at a time, straight into that level's directory, so Spark's
writer streams them (a ``partitionBy`` write would first sort each task's rows in the JVM's heap); each
level's write reads the step's checkpoint again (a step gives answers of one level, or a few). A Spark
Connect session writes all the answers in one ``partitionBy`` job at the end instead (below).
:func:`~hdmm.georelease.session.spark_session`
gives a local session a 4 GB heap; on a cluster, size the executors' memory (heap and Python workers)
for the largest partition, or partition at a finer level.

Sessions: the session passed (``spark=``), else the active one, else one made by
:func:`~hdmm.georelease.session.spark_session` on the master Spark is configured with. A Spark
Connect session (``spark=`` one, or ``SPARK_REMOTE`` set) runs the steps too: values are shipped with
each step's functions instead of broadcast, progress is reported per finished partition, and the
answers are written in one job at the end (:class:`~hdmm.georelease.sparkfiles.SparkFiles`).

The histograms may also come from any picklable :class:`~hdmm.georelease.units.HistogramSource`
(a benchmark draws them instead of reading records); the measure step then runs over the partition ids.
With the same seed the local and Spark engines give the same release: each unit's noise stream
is derived from the seed and the unit's code, not from the order of work.

Spark is an optional extra (``pip install 'hdmm[spark]'``) and needs Java 17 or later.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..domain import Domain
from ..records import cell_index
from ..geography import GeographyError, GeographyTree
from .plan import GeoPlan
from .pipeline import Value
from .release import GeoRelease, Opened, release_geography
from .sparkfiles import SparkFiles, task_rows
from .nonneg import cell_space, dense_parts
from .session import quiet_pandas_warnings, require_spark, spark_session
from .units import ArrayHistograms, RecordHistograms, check_record_columns, check_source
from .workers import return_free_memory

__all__ = ["SparkGeoRelease", "SparkEngine", "release_spark", "require_spark", "spark_session", "leaf_totals", "LEAF",
           "PART"]

#: Columns the engine adds to the records: the leaf position and the partition unit.
LEAF, PART = "_hdmm_leaf", "_hdmm_partition"


@dataclass(frozen=True, eq=False)
class SparkGeoRelease(GeoRelease):
    """A geography release written by Spark (a :class:`~hdmm.georelease.release.GeoRelease` written to ``path``,
    its answers read back from the files), with the answers as a Spark DataFrame.

    Attributes
    ----------
    dataframe : pyspark.sql.DataFrame
        The answers, read back: ``level, code, name, query, answer, std_error``.
    """

    dataframe: object = None


def _records_frame(spark, plan: GeoPlan, data, domain: Domain, leaf_column: str | None, codes: bool):
    """The records with their leaf and partition, checked on the driver (distinct values only)."""
    from pyspark.sql import functions as F

    df, counts, leaf, totals = _leaf_counts(spark, plan.tree, data, leaf_column, domain, codes)
    lookup = spark.createDataFrame(pd.DataFrame({
        "_hdmm_code": counts["_hdmm_code"].astype(str), LEAF: leaf.astype(np.int64),
        PART: _partition_of_leaves(plan)[leaf].astype(np.int64)}),
        f"_hdmm_code string, {LEAF} long, {PART} long")  # the schema given: no records is no error
    return df.join(F.broadcast(lookup), on="_hdmm_code", how="inner").drop("_hdmm_code"), totals


def _leaf_counts(spark, tree: GeographyTree, data, leaf_column: str | None, domain: Domain | None = None,
                 codes: bool = False):
    """The records with a ``_hdmm_code`` column (their leaf's code), the records per code, each code's leaf and
    the records per leaf; records without a column the release reads (``domain``'s too, if given) are refused
    first, then codes not in the tree and, with ``domain``, values no attribute has (distinct values only)."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(os.fspath(data)) if isinstance(data, (str, os.PathLike)) else data
    check_record_columns(df.columns, tree, domain, leaf_column)
    if leaf_column is None:
        parts = [F.col(c).cast("string") for c in tree.columns]
        # concat (not concat_ws) is null when any level's code is: a missing code must not make up another
        code = F.concat(*[p for c in parts for p in (c, F.lit(tree.separator))][:-1])
    else:
        code = F.col(leaf_column).cast("string")
    df = df.withColumn("_hdmm_code", code)
    if leaf_column is None:  # each level's code too: the tree checks them one by one, as for local records
        counts = df.groupBy("_hdmm_code", *[p.alias(c) for p, c in zip(parts, tree.columns)]).count().toPandas()
        leaf = tree.locate(counts, weights=counts["count"])  # missing or unknown codes: counted, never listed
    else:
        counts = df.groupBy("_hdmm_code").count().toPandas()
        if counts["_hdmm_code"].isna().any():
            raise GeographyError("some records have no code in the leaf column (missing values): every record "
                                 "needs the code of its leaf")
        leaf = tree.leaf_index(counts["_hdmm_code"], weights=counts["count"])  # unknown codes: counted, not listed
    totals = np.zeros(tree.leaves)
    np.add.at(totals, leaf, counts["count"].to_numpy(dtype=float))
    for name in [] if domain is None else domain.names:  # every distinct value must be readable (checked once);
        values = df.groupBy(name).count().toPandas()       # errors count the records, never show the values
        cell_index(domain.project([name]), values[[name]], codes=codes, private=True, counts=values["count"])
    return df, counts, leaf, totals


def leaf_totals(tree: GeographyTree, data, *, leaf_column: str | None = None, spark=None,
                domain: Domain | None = None, codes: bool = False) -> np.ndarray:
    """The number of records in every leaf of ``tree`` (leaf order), counted by Spark.

    ``data`` is a Spark DataFrame of records or a Parquet path; the leaf of a record is read from
    ``leaf_column`` or, by default, the tree's level columns. Records whose codes are not in the tree
    are refused (counted, not listed: which codes the data hold is private); with ``domain`` (read
    with ``codes`` as :func:`release_spark` reads it), so are records with a value no attribute has:
    the checks of :func:`release_spark`, for refusing bad records before planning. For invariants
    declared from the data (``geo_plan(invariants=...)``): those totals are then published exactly,
    not protected.
    """
    require_spark()
    spark = spark_session() if spark is None else spark
    return _leaf_counts(spark, tree, data, leaf_column, domain, codes)[3]


def _partition_of_leaves(plan: GeoPlan) -> np.ndarray:
    bounds = plan.tree.leaf_bounds(plan.partition_level)
    if plan.partition_bounds is not None:  # ranges of siblings: their first units' first leaves
        bounds = bounds[plan.partition_bounds]
    return np.repeat(np.arange(bounds.size - 1), np.diff(bounds))


@dataclass(frozen=True)
class _Totals:
    totals: np.ndarray
    person_cells: int  # the person domain the records were read with, checked against the plan's

    def leaf_totals(self) -> np.ndarray:
        return self.totals


def release_spark(plan: GeoPlan, data, **options) -> SparkGeoRelease:
    """Run a geography release on Spark: :func:`~hdmm.georelease.release_geography` with ``engine="spark"``
    (module docstring). Besides that function's arguments (``seed``, ``postprocess``, ``budget``, ...):

    Parameters
    ----------
    plan
        From :func:`~hdmm.georelease.plan.geo_plan`.
    data
        A Spark DataFrame of records, a Parquet path of records (both need ``domain``), or a
        picklable :class:`~hdmm.georelease.units.HistogramSource`.
    seed
        ``None``: OS entropy (real releases). An int: per-unit streams (tests and research only).
    spark
        A SparkSession (default: the active one, or ``local[2]``).
    output
        The Parquet output directory (must not exist): any URL the session's Spark writes to
        (``hdfs://``, ``s3a://``, ``dbfs:``, ``file://``), or a path, which Spark resolves against its
        default file system; default: a new temporary directory.
    domain, leaf_column, codes
        How to read records: the person domain, the column of leaf codes (default: the tree's
        level columns), and whether person columns hold codes.
    budget, label
        A :class:`~hdmm.Budget` charged once, after the checks and before any noise, and the
        release's name in it.
    postprocess
        ``None`` (least squares) or ``"nonnegative"``: the top-down non-negative estimates of
        :mod:`hdmm.georelease.nonneg`, down to the partition level (at most) on the driver, then
        each partition's subtree in its task (the same answers as the local engine's).
    about
        What the provenance records of the release's inputs (see :func:`~hdmm.georelease.release_geography`).
    """
    return release_geography(plan, data, engine="spark", **options)


class SparkKind:
    """The Spark engine as :func:`~hdmm.georelease.release_geography` opens it (:class:`~hdmm.georelease.release.EngineKind`)."""

    options = ("spark", "output", "domain", "leaf_column", "codes")

    def partitioned(self, options: dict) -> bool:
        return True

    def open(self, plan: GeoPlan, data, options: dict) -> Opened:
        require_spark()
        quiet_pandas_warnings()  # also for a session the caller made
        spark = options.get("spark") or spark_session()
        if str(spark.conf.get("spark.io.encryption.enabled", "false")).lower() != "true":
            warnings.warn("spark.io.encryption.enabled is off in this Spark session: the steps' checkpoints on the "
                          "executors' disks hold exact partition totals in the clear until Spark removes them; "
                          "start the session with --conf spark.io.encryption.enabled=true (hdmm's own sessions "
                          "do)", RuntimeWarning, stacklevel=3)
        output = options.get("output")
        output = os.fspath(output) if output is not None else os.path.join(tempfile.mkdtemp(prefix="hdmm-"), "release")
        files = SparkFiles(spark, output, plan)  # refuses an output that exists, before any noise
        domain, codes = options.get("domain"), bool(options.get("codes", False))
        if hasattr(data, "histograms") and hasattr(data, "leaf_totals"):
            check_source(plan, data)
            engine = SparkEngine(spark, plan, files, source=data)
        else:
            if domain is None:
                raise TypeError("records need domain= (the person domain) to be read")
            records, totals = _records_frame(spark, plan, data, domain, options.get("leaf_column"), codes)
            check_source(plan, _Totals(totals, domain.size))
            engine = SparkEngine(spark, plan, files, records=records, domain=domain, codes=codes)

        def finish(result: GeoRelease) -> SparkGeoRelease:
            return SparkGeoRelease(**{f.name: getattr(result, f.name) for f in fields(GeoRelease) if f.init},
                                   dataframe=files.frame())

        return Opened(engine, files, engine.close, finish)


#: The registered Spark engine (``ENGINES["spark"]`` of :mod:`hdmm.georelease.release`).
SPARK = SparkKind()


def _schema():
    from pyspark.sql.types import ArrayType, BinaryType, DoubleType, IntegerType, LongType, StructField, StructType

    return StructType([
        StructField("kind", IntegerType()), StructField("partition", LongType()), StructField("level", IntegerType()),
        StructField("unit", LongType()), StructField("values", ArrayType(DoubleType())),
        StructField("payload", BinaryType()),
    ])


_COLUMNS = ["kind", "partition", "level", "unit", "values", "payload"]

#: Seconds between two reports of a running step's Spark tasks (:meth:`SparkEngine.observe`).
WATCH_SECONDS = 15.0

#: What a row of a step's output is (its ``kind``): a unit's estimates (the partition's state), the task's
#: result (pickled in ``payload``), a partition's extra input (pickled), or a released unit's answers.
STATE, RESULT, INPUT, ANSWERS = 0, 1, 2, 3


#: The most doubles in one Arrow batch of a task's output: a partition's state goes to Spark in batches of
#: at most this size (128 MB), not as one batch of all its units.
BATCH_VALUES = 2**24


def _arrow_schema():
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(_schema())


def _batches(schema, kind: int, i: int, level: int, units: np.ndarray, values: np.ndarray | None,
             payloads: list | None = None) -> Iterator:
    """Arrow batches of rows of one ``kind`` for partition ``i``: a row per unit, its values a row of ``values``
    (read from the array itself, without a copy, when it is contiguous), in batches of at most
    ``BATCH_VALUES`` doubles."""
    import pyarrow as pa

    n = len(units)
    if n == 0:
        return
    k = 0 if values is None else values.shape[1]
    step = n if k == 0 else max(1, BATCH_VALUES // k)
    for a in range(0, n, step):
        b = min(n, a + step)
        if values is None:
            column = pa.nulls(b - a, schema.field("values").type)
        else:
            flat = np.ascontiguousarray(values[a:b], dtype=float).reshape(-1)
            column = pa.ListArray.from_arrays(pa.array(np.arange(b - a + 1, dtype=np.int32) * k), pa.array(flat),
                                              type=schema.field("values").type)
        yield pa.RecordBatch.from_arrays([
            pa.array(np.full(b - a, kind, dtype=np.int32)), pa.array(np.full(b - a, i, dtype=np.int64)),
            pa.array(np.full(b - a, level, dtype=np.int32)), pa.array(np.asarray(units[a:b], dtype=np.int64)),
            column, pa.array(payloads[a:b] if payloads is not None else [None] * (b - a), type=pa.binary())],
            schema=schema)


def _rows(i: int, state: dict | None, result, answers: list):
    """A task's output as an Arrow table: its partition's state (a row per unit: ``unit`` is its place in the
    partition's level), its result (with whether the state changed and the levels it gave answers of) and its
    answers. The values are not copied into Python objects: each level's array is handed to Arrow as it is."""
    import pyarrow as pa

    schema = _arrow_schema()
    batches = [] if state is None else [batch for d, values in state.items()
                                         for batch in _batches(schema, STATE, i, d, np.arange(len(values)), values)]
    for d, units, values in answers:
        batches += _batches(schema, ANSWERS, i, d, units, values)
    levels = sorted({d for d, units, _ in answers if units.size})
    payload = pickle.dumps((state is not None, levels, result), protocol=pickle.HIGHEST_PROTOCOL)
    batches += _batches(schema, RESULT, i, -1, np.array([-1]), None, [payload])
    return pa.Table.from_batches(batches, schema=schema)


def _run(i: int, fn, *args, trim: bool = True):
    """``fn(*args)`` (a pipeline task: ``state, result``) as partition ``i``'s rows, with the answers its writers gave
    (in a Spark worker, the memory its earlier tasks freed given back first: :func:`~hdmm.georelease.workers.return_free_memory`;
    not on the driver, whose heap is the user's)."""
    if trim:
        return_free_memory()
    with task_rows() as answers:
        state, result = fn(*args)
    return _rows(i, state, result, answers)


class _Rows:
    """One level of a partition's state read row by row from Arrow's chunks (``rows[units]``: a new array of
    those units' rows), for a task that never needs the level whole (:meth:`Engine.update`'s ``reads_rows``):
    the level is then held once, in Arrow's buffers, instead of twice."""

    def __init__(self, flats: dict[int, np.ndarray], chunk: np.ndarray, start: np.ndarray, k: int) -> None:
        self.flats, self.chunk, self.start, self.k = flats, chunk, start, k
        self.shape = (len(chunk), k)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, units) -> np.ndarray:
        units = np.arange(len(self))[units]
        if units.ndim == 0:
            return self[units[None]][0]
        out = np.empty((units.size, self.k))
        for j, u in enumerate(units.tolist()):
            s = int(self.start[u])
            out[j] = self.flats[int(self.chunk[u])][s:s + self.k]
        return out


def _state(table, gather: bool = True) -> dict[int, np.ndarray | _Rows]:
    """A partition's state from its rows (an Arrow table). A level whose rows come in unit order, one after the
    other in one chunk, is a read-only view of Arrow's buffer (no copy); else it is gathered into one array, or,
    unless ``gather``, read row by row (:class:`_Rows`)."""
    kind = table.column("kind").to_numpy()
    level = table.column("level").to_numpy()
    unit = table.column("unit").to_numpy()
    column = table.column("values")
    sizes = [len(c) for c in column.chunks]
    chunk = np.repeat(np.arange(len(sizes)), sizes)
    row = np.concatenate([np.arange(n) for n in sizes]) if sizes else np.zeros(0, dtype=np.int64)
    flats, offsets = {}, {}

    def flat(c: int) -> np.ndarray:
        if c not in flats:
            array = column.chunk(c)
            offsets[c] = array.offsets.to_numpy()
            flats[c] = array.flatten().to_numpy(zero_copy_only=False)
            offsets[c] = offsets[c] - offsets[c][0]
        return flats[c]

    state = {}
    for d in np.unique(level[kind == STATE]).tolist():
        at = np.flatnonzero((kind == STATE) & (level == d))
        at = at[np.argsort(unit[at], kind="stable")]
        if not np.array_equal(unit[at], np.arange(at.size)):
            raise RuntimeError(f"partition state of level {d}: units missing or repeated")
        for c in np.unique(chunk[at]).tolist():
            flat(c)
        starts = np.array([offsets[c][r] for c, r in zip(chunk[at], row[at])])
        ends = np.array([offsets[c][r + 1] for c, r in zip(chunk[at], row[at])])
        k = int(ends[0] - starts[0])
        if not (ends - starts == k).all():
            raise RuntimeError(f"partition state of level {d}: rows of different lengths")
        c0 = int(chunk[at[0]])
        if (chunk[at] == c0).all() and (np.diff(starts) == k).all():
            state[d] = flats[c0][starts[0]:starts[0] + at.size * k].reshape(at.size, k)
        elif not gather:
            state[d] = _Rows(flats, chunk[at], starts, k)
        else:
            out = np.empty((at.size, k))
            for j, (c, s) in enumerate(zip(chunk[at].tolist(), starts.tolist())):
                out[j] = flats[c][s:s + k]
            state[d] = out
    return state


class _InBand:
    """A value pickled as the pickle of itself (one ``bytes``), read back as the value: PySpark writes an encrypted
    broadcast (``spark.io.encryption.enabled``) to a stream that cannot take the out-of-band buffers of pickle
    protocol 5 (numpy arrays of more than 64 KB)."""

    def __init__(self, value) -> None:
        self.value = value

    def __reduce__(self):
        return pickle.loads, (pickle.dumps(self.value, protocol=pickle.HIGHEST_PROTOCOL),)


def _context(spark):
    """The session's SparkContext, or ``None`` for a Spark Connect session (which has none)."""
    try:
        return spark.sparkContext
    except Exception:  # Spark Connect: PySparkNotImplementedError
        return None


class SparkEngine:
    """The :class:`~hdmm.georelease.pipeline.Engine` of Spark (module docstring): every step's output is
    checkpointed in the executors (``localCheckpoint``: computed once, its noise never drawn again), its
    results collected, its answers appended to ``files`` (:class:`~hdmm.georelease.sparkfiles.SparkFiles`).

    The data are ``records`` (a DataFrame with the columns ``LEAF`` and ``PART`` and the person
    ``domain``'s, read with ``codes``) or a picklable histogram ``source``.
    """

    name = "spark"
    #: A task's state is its own copy (gathered from Arrow's batches, or a read-only view of them): a step may
    #: overwrite a writable one (:func:`hdmm.georelease.pipeline.run_release`).
    fresh_states = True

    def __init__(self, spark, plan: GeoPlan, files: SparkFiles, *, records=None, source=None,
                 domain: Domain | None = None, codes: bool = False, postprocess: str | None = None) -> None:
        self.spark, self.sc, self.files = spark, _context(spark), files
        self.records, self.source, self.domain, self.codes = records, source, domain, codes
        self.partitions = plan.partitions
        _warm(plan, postprocess)
        self._shared: dict[int, tuple[object, object]] = {}
        self._plan = self.share(plan)  # the engine's own tasks read the tree from it
        self._state = None
        self._progress = None
        self._checkpoints: list = []  # the steps' checkpointed outputs, freed by close()

    def observe(self, progress) -> None:
        """Report, every ``WATCH_SECONDS`` while a step's Spark jobs run, the share of their active stages'
        tasks done (:meth:`hdmm.georelease.steps.Progress.within`), read from Spark's status tracker (a
        classic session's; Spark Connect reports each step's partitions as they finish only)."""
        self._progress = progress

    def _watched(self, action, tasks: int | None = None):
        """``action()``, with the status of its stages reported while it runs (:meth:`observe`): a job of
        ``tasks`` of the current step's tasks (``None``: all of them)."""
        if self._progress is None or self.sc is None:
            return action()
        stop, tracker = threading.Event(), self.sc.statusTracker()

        def watch() -> None:
            while not stop.wait(WATCH_SECONDS):
                done = total = 0
                for stage in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage)
                    if info is not None:
                        done, total = done + info.numCompletedTasks, total + info.numTasks
                if total:
                    self._progress.within(done / total, tasks)

        thread = threading.Thread(target=watch, name="hdmm-spark-progress", daemon=True)
        thread.start()
        try:
            return action()
        finally:
            stop.set()
            thread.join()

    def share(self, value):
        """A broadcast of ``value``, made once per object (the plan is broadcast once per release); on Spark
        Connect, which has no broadcasts, the value itself, shipped with each step's function."""
        key = id(value)
        if key not in self._shared:
            self._shared[key] = (value, Value(value) if self.sc is None else self.sc.broadcast(_InBand(value)))
        return self._shared[key][1]

    def _here(self, handle):
        """The value of a shared ``handle`` on the driver (the object itself: reading a broadcast back on the
        driver would unpickle it again)."""
        for value, shared in self._shared.values():
            if shared is handle:
                return value
        return handle.value

    def _persist(self, df, tasks: int | None = None) -> tuple[object, list]:
        """``df`` computed once and kept in the executors (a local checkpoint on their disks: if one is lost
        the release fails rather than draw its noise again); its answers appended to the output. Returns its
        state rows and its results in partition order (each with whether the state changed)."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        df = self._watched(lambda: df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY), tasks)
        self._checkpoints.append(df)
        rows = df.filter(F.col("kind") == RESULT).select("partition", "payload").toPandas()
        results = sorted((int(i), pickle.loads(bytes(b))) for i, b in zip(rows["partition"], rows["payload"]))
        levels = sorted({d for _, (_, written, _) in results for d in written})
        if levels:
            self._watched(lambda: self.files.write_units(
                df.filter(F.col("kind") == ANSWERS).select("level", "unit", "values"), self._plan, levels), tasks)
        return df.filter(F.col("kind") == STATE), [(i, (changed, result)) for i, (changed, _, result) in results]

    def _ids(self, n: int):
        """A DataFrame of the ids ``0 .. n-1`` (column ``partition``), spread over the executors."""
        return self._spread(self.spark.createDataFrame(pd.DataFrame({"partition": np.arange(n, dtype=np.int64)})), n)

    def _spread(self, df, n: int):
        """``df``'s ``n`` rows (one per partition id) in up to four Spark partitions per core, by id."""
        parallel = self.sc.defaultParallelism if self.sc is not None else 2
        return df.repartition(min(n, max(2, parallel * 4)), "partition")

    def measure(self, fn, shared: tuple, partitions: int) -> Iterator:
        plan_b, schema = self._plan, _schema()
        if isinstance(self.source, (RecordHistograms, ArrayHistograms)):  # data on the driver: sent, not broadcast
            plan = self._here(plan_b)
            rows = pd.DataFrame({"partition": np.arange(partitions, dtype=np.int64), "payload": [
                pickle.dumps(self.source.histograms(*plan.partition(i).leaves()),
                             protocol=pickle.HIGHEST_PROTOCOL) for i in range(partitions)]})
            held = self.spark.createDataFrame(rows, "partition long, payload binary")

            def run_held(batches):
                values = [h.value for h in shared]
                for batch in batches:
                    for i, payload in zip(batch.column("partition").to_pylist(), batch.column("payload").to_pylist()):
                        H = pickle.loads(payload)
                        lo = plan_b.value.partition(int(i)).leaves()[0]
                        yield from _run(int(i), fn, *values, int(i), lambda a, b, H=H, lo=lo: H[a - lo:b - lo]).to_batches()
                return_free_memory()  # this worker's last task's, before it waits

            df = self._spread(held, partitions).mapInArrow(run_held, schema)
        elif self.source is not None:  # a source that makes its histograms (small): broadcast
            source_b = self.share(self.source)

            def run_ids(batches):
                values = [h.value for h in shared]
                for batch in batches:
                    for i in batch.column("partition").to_pylist():
                        yield from _run(int(i), fn, *values, int(i), source_b.value.histograms).to_batches()
                return_free_memory()

            df = self._ids(partitions).mapInArrow(run_ids, schema)
        else:
            domain, codes = self.domain, self.codes
            names = list(domain.names)

            def run_records(table):
                pdf = table.to_pandas()
                p = plan_b.value
                i = int(pdf[PART].iloc[0])
                lo, hi = p.partition(i).leaves()
                cells = cell_index(domain, pdf[names], codes=codes, private=True)
                H = sp.csr_matrix((pdf["count"].to_numpy(dtype=float), (pdf[LEAF].to_numpy() - lo, cells)),
                                  shape=(hi - lo, domain.size))
                H.sum_duplicates()
                return _run(i, fn, *[h.value for h in shared], i, lambda a, b: H[a - lo:b - lo])

            # the records counted per leaf and person values first: a task holds its partition's distinct
            # (leaf, values) pairs, at most its leaves times the person cells, however many people live there
            counted = self.records.groupBy(PART, LEAF, *names).count()
            df = counted.groupBy(PART).applyInArrow(run_records, schema)
        state, results = self._persist(df)
        seen = {i for i, _ in results}
        extra = []
        plan = self._here(plan_b)
        here = [self._here(h) for h in shared]
        for i in sorted(set(range(partitions)) - seen):  # no records: measured here, with their own streams
            lo, hi = plan.partition(i).leaves()
            empty = sp.csr_matrix((hi - lo, plan.person.cells))
            out = _run(i, fn, *here, i, lambda a, b: empty[a - lo:b - lo], trim=False).to_pandas()
            extra.append(out[out["kind"] == STATE])
            changed, written, result = pickle.loads(out["payload"].iloc[-1])
            if written:  # the measure step writes no answers; were it to, they would be lost here
                raise RuntimeError("the measure step gave answers on the driver, which this engine does not write")
            results.append((i, (changed, result)))
        if extra:
            state = state.unionByName(self.spark.createDataFrame(pd.concat(extra, ignore_index=True), schema))
        self._state = state
        for _, (_, result) in sorted(results, key=lambda r: r[0]):
            yield result

    def update(self, fn, shared: tuple, partitions: int, inputs: Sequence | None = None) -> Iterator:
        df = self._state
        if inputs is not None:
            rows = pd.DataFrame([(INPUT, i, -1, -1, None, pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
                                 for i, x in enumerate(inputs)], columns=_COLUMNS)
            df = df.unionByName(self.spark.createDataFrame(rows, _schema()))

        rows_only = bool(getattr(fn, "reads_rows", False))

        def run(table):
            i = int(table.column("partition")[0].as_py())
            extra = ()
            if inputs is not None:
                at = np.flatnonzero(table.column("kind").to_numpy() == INPUT)[0]
                extra = (pickle.loads(table.column("payload")[int(at)].as_py()),)
            return _run(i, fn, *[h.value for h in shared], i, _state(table, not rows_only), *extra)

        state, results = self._persist(df.groupBy("partition").applyInArrow(run, _schema()))
        changed = {c for _, (c, _) in results}
        if len(results) != partitions or len(changed) > 1:
            raise RuntimeError(f"a step returned {len(results)} results for {partitions} partitions, or changed some "
                               "partitions' states and not others")
        if changed == {True}:
            self._state = state
        for _, (_, result) in results:
            yield result

    def map(self, fn, shared: tuple, items: Sequence) -> Iterator:
        if not items:
            return iter(())
        items_b = self.share(list(items))

        def run(batches):
            values = [h.value for h in shared]
            for batch in batches:
                for k in batch.column("partition").to_pylist():
                    yield from _run(int(k), lambda item: (None, fn(*values, item)), items_b.value[int(k)]).to_batches()
            return_free_memory()

        _, results = self._persist(self._ids(len(items)).mapInArrow(run, _schema()), len(items))
        return (result for _, (_, result) in results)

    def close(self) -> None:
        """Free the broadcasts and the steps' checkpoints (which hold exact totals) on every executor."""
        for _, handle in self._shared.values():
            if hasattr(handle, "destroy"):  # a classic broadcast (Spark Connect ships values with the steps)
                handle.destroy()
        for df in self._checkpoints:
            _free_checkpoint(df)
        self._state = None
        self._shared.clear()
        self._checkpoints.clear()


def _free_checkpoint(df) -> None:
    """Remove a local checkpoint's blocks from the executors now. PySpark has no public call for it: on a
    classic session the checkpointed RDD is reached through the JVM's plan (a ``LogicalRDD``); a Spark Connect
    server frees it once the client drops the DataFrame. Best effort: a failure leaves the blocks to Spark's
    cleaner (or the session's end), encrypted on disk in the sessions :func:`spark_session` makes."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return
    try:
        jdf.queryExecution().logical().rdd().unpersist(True)
    except Exception:  # noqa: BLE001 -- a plan of another shape: leave it to the cleaner
        pass


def _warm(plan: GeoPlan, postprocess: str | None) -> None:
    """Make what every task reads of the plan once, here, so that it ships with the plan."""
    if not plan.per_level:
        plan.passes  # noqa: B018
    for d in plan.levels:
        plan.variances(d, units=[0])
    plan.labels  # noqa: B018 -- every task writes them
    if postprocess is not None:  # every top-down task forms cells from measurements
        for d in range(max(plan.levels) + 1) if plan.per_level else (0,):
            cell_space(plan, d), dense_parts(plan, d)
        if not plan.per_level:
            plan.strategy_pinv, plan.total_parts  # noqa: B018
