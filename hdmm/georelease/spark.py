r"""The Spark engine of a geography release: the steps of :mod:`hdmm.georelease.release` as Spark stages.

The plan is made on the driver and broadcast. Then:

1. *stage 1* (one task per partition, e.g. a state): the partition's records are grouped with
   ``groupBy(partition).applyInPandas``; the task builds its leaves' histograms, measures every
   unit of the partition through the kernel (:func:`hdmm.georelease.units.measure_partition`) and
   takes the first tree pass. Its output (every unit's own estimate, the partition's first-pass
   vector and its total histogram) is written to Parquet and read back, so that the noise is drawn
   exactly once even if Spark recomputes a lost partition.
2. *driver*: the levels above the partition level are measured from the partitions' totals and
   the top passes run (``units above P`` vectors).
3. *stage 2* (again per partition): the second pass gives every unit's least-squares estimate.
4. *driver*: the invariants' multipliers (:mod:`hdmm.georelease.invariants`), one number per unit.
5. *stage 3* (``mapInPandas``): every unit's answers, corrected and labelled with their standard
   errors, written as a Parquet dataset partitioned by level.

Non-negative estimates (``postprocess="nonnegative"``, :mod:`hdmm.georelease.nonneg`) keep every
unit's estimate in the strategy's measurement space through stages 1 and 2; the driver then walks
the top of the tree (the root's family, or for integer tables the held region, rounded at once), one
task per unit below that (e.g. a state), level by level, projects its family down to the partition
level (or to the deepest released level, if that is coarser), and stage 3
(``groupBy(partition).applyInPandas``, each partition receiving its root's non-negative cells as one
more row) walks each partition's subtree and writes its units' answers.
The answers are the local engine's.

Memory: ``groupBy(...).applyInPandas`` hands each task its whole group, so one partition's units
(every unit's strategy answers: units x strategy rows x 8 bytes, 1.2 GB for the 4,011 tracts of the
largest synthetic county under SF1) are held at once by Spark's JVM and by the Python worker, once
per concurrent task. :func:`~hdmm.georelease.session.spark_session` gives a local session 8 GB; on a
cluster, size the executors' memory for the largest partition, or partition at a finer level.

Files: the output and the work directory are ordinary paths: the driver creates and removes them
with ``os``, Spark writes the stages into the work directory, and in stage 3 the tasks write their
answers into the output with pyarrow (not through Spark's writers). On a cluster both must be on
a file system that the driver and every executor mount at the same path (NFS, a mounted object
store); an ``hdfs://`` or ``s3://`` URL is not supported. The work directory holds exact
partition totals until the release ends, so keep it where only the release can read it.

The histograms may also come from any picklable :class:`~hdmm.georelease.units.HistogramSource`
(a benchmark draws them instead of reading records); stage 1 then runs over the partition ids.
With the same seed the local and Spark engines give the same release: each unit's noise stream
is derived from the seed and the unit's code, not from the order of work.

Spark is an optional extra (``pip install 'hdmm[spark]'``) and needs Java 17 or later.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..domain import Domain
from ..geography import GeographyError, GeographyTree
from .report import total_query
from .passes import Partition, partition_down, partition_up, top_passes
from .plan import GeoPlan
from .files import check_output, finish_output, read_answers, start_output, write_units
from .nonneg import POSTPROCESS, TopDown, change_rmse, check_nonnegative, integer_totals
from .roundtree import held_region
from .session import require_spark, spark_session
from .steps import correct, created_now, invariant_multipliers, measure_top, progress_printer, provenance
from .units import check_record_columns, check_source, measure_partition

__all__ = ["SparkGeoRelease", "release_spark", "require_spark", "spark_session", "leaf_totals", "LEAF", "PART"]

#: Columns the engine adds to the records: the leaf position and the partition unit.
LEAF, PART = "_hdmm_leaf", "_hdmm_partition"


@dataclass(frozen=True, eq=False)
class SparkGeoRelease:
    """A geography release written by Spark: the Parquet dataset at ``path``, partitioned by level.

    Attributes
    ----------
    plan : GeoPlan
    path : str
        The output directory (``level=<name>/`` parts and ``_provenance.json``).
    dataframe : pyspark.sql.DataFrame
        The answers, read back: ``level, code, name, query, answer, std_error``.
    seeded : bool
    timings : dict
    charge : Charge or None
    postprocess : str or None
        ``"nonnegative"`` for the top-down non-negative estimates (:mod:`hdmm.georelease.nonneg`).
    change : dict or None
        With ``postprocess``: per level, the RMSE of the answers' change from least squares.
    about : dict
        What the provenance records of the release's inputs (``release_geography(about=...)``).
    """

    plan: GeoPlan
    path: str
    dataframe: object
    seeded: bool
    timings: dict[str, float] = field(default_factory=dict)
    charge: object = None
    postprocess: str | None = None
    change: dict[int, float] | None = None
    about: dict = field(default_factory=dict)
    _read: dict = field(default_factory=dict, repr=False)

    def provenance(self) -> dict:
        """What the release's files record (privacy spent, sensitivity, levels, weights, charge)."""
        return provenance(self.plan, self.seeded, self.charge, self.postprocess, self.about)

    def answers(self, level: str | int) -> np.ndarray:
        """``units x queries`` answers of a released level, read back from the files (:func:`read_answers`)."""
        key = self.plan.tree.levels[self.plan.tree.level_index(level)]
        if key not in self._read:  # the last level read is kept (answers, then totals, of one level)
            self._read.clear()
            self._read[key] = read_answers(self.path, self.plan, key)
        return self._read[key]

    def totals(self, level: str | int) -> np.ndarray:
        """Every unit's total of a released level: its answer to the workload's total query (the files hold
        the queries only)."""
        q = self.plan.memo("total query", lambda: total_query(self.plan.person.workload))
        if q is None:
            raise ValueError("the release's files hold the workload's queries only, and the workload has no total "
                             "query: add a total row to the workload to read the units' totals back")
        return self.answers(level)[:, q]


def _schema_units():
    from pyspark.sql.types import ArrayType, DoubleType, IntegerType, LongType, StructField, StructType

    return StructType([
        StructField("partition", LongType()), StructField("level", IntegerType()), StructField("unit", LongType()),
        StructField("index", ArrayType(LongType())), StructField("values", ArrayType(DoubleType())),
    ])


#: ``level`` markers of stage 1's extra rows (the first-pass vector and the total histogram) and of the
#: rows that carry a partition root's non-negative cells to its task (non-negative estimates).
G_ROW, ROOT_ROW, CELLS_ROW = -1, -2, -3


_NO_INDEX = np.zeros(0, dtype=np.int64)

#: Units per file in the answers stage (each unit is ``queries`` rows).
UNITS_PER_FILE = 1024


def _unit_rows(partition: int, vectors: dict[int, np.ndarray], part: Partition) -> list[dict]:
    rows = []
    for d, values in vectors.items():
        lo = part.range(d)[0]
        rows += [{"partition": partition, "level": d, "unit": lo + i, "index": _NO_INDEX, "values": v}
                 for i, v in enumerate(values)]
    return rows


def _own_from_rows(pdf: pd.DataFrame) -> dict[int, np.ndarray]:
    own = {}
    for d, group in pdf[pdf["level"] >= 0].groupby("level"):
        group = group.sort_values("unit")
        own[int(d)] = np.vstack(group["values"].to_numpy())
    return own


def _stage1(plan: GeoPlan, unit: int, histograms, seed: int | None, space: str) -> pd.DataFrame:
    part = Partition.of(plan.tree, plan.partition_level, unit)
    own, root = measure_partition(plan, part, histograms, seed, space)
    rows = _unit_rows(unit, own, part)
    rows.append({"partition": unit, "level": G_ROW, "unit": unit, "index": [],
                 "values": partition_up(plan.passes, part, own).ravel().tolist()})
    total = sp.csr_matrix(root[None, :])
    rows.append({"partition": unit, "level": ROOT_ROW, "unit": unit, "index": total.indices.astype(np.int64).tolist(),
                 "values": total.data.astype(float).tolist()})
    return pd.DataFrame(rows, columns=["partition", "level", "unit", "index", "values"])


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
        domain.project([name]).cell_index(values[[name]], codes=codes, private=True, counts=values["count"])
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
    return np.repeat(np.arange(bounds.size - 1), np.diff(bounds))


@dataclass(frozen=True)
class _Totals:
    totals: np.ndarray
    person_cells: int  # the person domain the records were read with, checked against the plan's

    def leaf_totals(self) -> np.ndarray:
        return self.totals


def release_spark(plan: GeoPlan, data, *, seed: int | None = None, progress: bool | Callable[[str], None] = False,
                  spark=None, output: str | os.PathLike | None = None, domain: Domain | None = None,
                  leaf_column: str | None = None, codes: bool = False, work_dir: str | None = None,
                  budget=None, label: str = "", postprocess: str | None = None,
                  about: dict | None = None) -> SparkGeoRelease:
    """Run a geography release on Spark (module docstring).

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
        The Parquet output directory (must not exist); default: a new temporary directory.
    domain, leaf_column, codes
        How to read records: the person domain, the column of leaf codes (default: the tree's
        level columns), and whether person columns hold codes.
    work_dir
        An existing directory in which a new subdirectory holds the intermediate stages (default:
        ``output`` + ``.work``, which must not exist). The stages hold exact partition totals, so
        the subdirectory is removed when the release ends, whether it succeeds or fails; nothing
        else in ``work_dir`` is touched.
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
    with warnings.catch_warnings():
        # PySpark 4 warns on every pandas conversion that pandas 3 is not yet fully supported;
        # the conversions used here (numbers, strings, arrays of doubles) are tested
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
        warnings.filterwarnings("ignore", message="The copy keyword is deprecated", module="pyspark")
        output = (os.path.normpath(os.fspath(output)) if output is not None
                  else os.path.join(tempfile.mkdtemp(prefix="hdmm-"), "release"))
        check_output(output)
        about = {"created": created_now(), **(about or {})}
        work = _work_directory(output, work_dir)  # before any charge: an existing one is refused
        try:
            return _run(plan, data, seed=seed, progress=progress, spark=spark, output=output, domain=domain,
                        leaf_column=leaf_column, codes=codes, work=work, budget=budget, label=label,
                        postprocess=postprocess, about=about)
        finally:  # stage 1 holds exact partition totals: never left behind
            shutil.rmtree(work, ignore_errors=True)


def _work_directory(output: str, work_dir: str | os.PathLike | None) -> str:
    """Create and return the directory of the intermediate stages (see :func:`release_spark`)."""
    if work_dir is None:
        work = output + ".work"
        try:
            os.makedirs(work)
        except FileExistsError:
            raise FileExistsError(f"{work} exists (left by an interrupted run?): remove it first") from None
        return work
    work_dir = os.fspath(work_dir)
    if not os.path.isdir(work_dir):
        raise FileNotFoundError(f"work_dir {work_dir} is not an existing directory")
    return tempfile.mkdtemp(prefix="hdmm-", dir=work_dir)


def _run(plan: GeoPlan, data, *, seed, progress, spark, output, domain, leaf_column, codes, work, budget, label,
         postprocess, about) -> SparkGeoRelease:
    require_spark()
    from pyspark.sql import functions as F

    if postprocess not in POSTPROCESS:
        raise ValueError(f"postprocess must be one of {list(POSTPROCESS)}, got {postprocess!r}")
    space = "answers" if postprocess is None else "measurements"
    if postprocess is not None:
        check_nonnegative(plan, partitioned=True)
    if postprocess == "integer":
        integer_totals(plan, "spark")
    say = progress_printer(progress)
    spark = spark_session() if spark is None else spark
    tree, P = plan.tree, plan.partition_level
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # ---------------------------------------------------------------- checks, before any noise
    is_source = hasattr(data, "histograms") and hasattr(data, "leaf_totals")
    if is_source:
        check_source(plan, data)
    else:
        if domain is None:
            raise TypeError("records need domain= (the person domain) to be read")
        records, totals = _records_frame(spark, plan, data, domain, leaf_column, codes)
        check_source(plan, _Totals(totals, domain.size))
    charge = None if budget is None else budget.charge(plan.privacy, label)  # on disk before any noise
    sc = spark.sparkContext
    plan.passes  # noqa: B018 -- made once here and shipped with the plan, with the variances' factors
    for d in plan.levels:
        plan.variances(d, units=[0])
    plan.labels  # noqa: B018 -- every task writes them
    if postprocess is not None:  # every non-negative task forms cells from measurements
        plan.strategy_pinv, plan.total_parts  # noqa: B018
    plan_b = sc.broadcast(plan)
    timings["checks"] = time.perf_counter() - start
    # ---------------------------------------------------------------- stage 1
    start = time.perf_counter()
    schema = _schema_units()
    if is_source:
        source_b = sc.broadcast(data)

        def stage1_source(batches):
            p = plan_b.value
            for pdf in batches:
                for unit in pdf["partition"].tolist():
                    yield _stage1(p, int(unit), source_b.value.histograms, seed, space)

        ids = spark.createDataFrame(pd.DataFrame({"partition": np.arange(tree.sizes[P], dtype=np.int64)}))
        ids = ids.repartition(min(tree.sizes[P], max(2, sc.defaultParallelism * 4)), "partition")
        stage1 = ids.mapInPandas(stage1_source, schema)
    else:
        names = list(domain.names)

        def stage1_records(pdf: pd.DataFrame) -> pd.DataFrame:
            p = plan_b.value
            unit = int(pdf[PART].iloc[0])
            part = Partition.of(p.tree, p.partition_level, unit)
            lo, hi = part.leaves()
            cells = domain.cell_index(pdf[names], codes=codes, private=True)
            H = sp.csr_matrix((np.ones(len(pdf)), (pdf[LEAF].to_numpy() - lo, cells)), shape=(hi - lo, domain.size))
            H.sum_duplicates()
            return _stage1(p, unit, H, seed, space)

        stage1 = records.select(PART, LEAF, *names).groupBy(PART).applyInPandas(stage1_records, schema)
    stage1.write.parquet(os.path.join(work, "stage1"))
    stage1 = spark.read.parquet(os.path.join(work, "stage1"))
    timings["stage 1 (measure)"] = time.perf_counter() - start
    say(f"  stage 1: measured {tree.sizes[P]:,} partitions in {timings['stage 1 (measure)']:.1f} s")
    # ---------------------------------------------------------------- driver: top
    start = time.perf_counter()
    extra = stage1.filter(F.col("level") < 0).toPandas()
    k = plan.queries + 1 if space == "answers" else plan.person.strategy.shape[0]
    g_own = np.zeros((tree.sizes[P], k))
    roots = np.zeros((tree.sizes[P], plan.person.cells))
    seen = set()
    for row in extra.itertuples(index=False):
        if row.level == G_ROW:
            g_own[row.partition] = np.asarray(row.values)
            seen.add(int(row.partition))
        else:
            roots[row.partition, np.asarray(row.index, dtype=np.intp)] = np.asarray(row.values)
    passes = plan.passes
    missing = sorted(set(range(tree.sizes[P])) - seen)
    local_own = {}
    for unit in missing:  # partitions without records: measured here, with their own streams
        part = Partition.of(tree, P, unit)
        lo, hi = part.leaves()
        own, _ = measure_partition(plan, part, sp.csr_matrix((hi - lo, plan.person.cells)), seed, space)
        local_own[unit] = own
        g_own[unit] = partition_up(passes, part, own).ravel()
    c, t = top_passes(passes, P, g_own, measure_top(plan, roots, seed, space))
    timings["top"] = time.perf_counter() - start
    # ---------------------------------------------------------------- stage 2
    start = time.perf_counter()
    ct_b = sc.broadcast((c, t))

    def stage2(pdf: pd.DataFrame) -> pd.DataFrame:
        p = plan_b.value
        unit = int(pdf["partition"].iloc[0])
        part = Partition.of(p.tree, p.partition_level, unit)
        cc, tt = ct_b.value
        est = partition_down(p.passes, part, _own_from_rows(pdf),
                             cc[unit:unit + 1], tt[unit:unit + 1])
        return pd.DataFrame(_unit_rows(unit, est, part), columns=["partition", "level", "unit", "index", "values"])

    stage2_df = stage1.filter(F.col("level") >= 0).groupBy("partition").applyInPandas(stage2, schema)
    stage2_df.write.parquet(os.path.join(work, "stage2"))
    extra_rows = []
    for unit, own in local_own.items():
        part = Partition.of(tree, P, unit)
        extra_rows += _unit_rows(unit, partition_down(passes, part, own, c[unit:unit + 1], t[unit:unit + 1]), part)
    estimates_df = spark.read.parquet(os.path.join(work, "stage2"))
    if extra_rows:
        estimates_df = estimates_df.unionByName(spark.createDataFrame(pd.DataFrame(extra_rows), schema))
    timings["stage 2 (estimate)"] = time.perf_counter() - start
    # ---------------------------------------------------------------- driver: coarse levels, invariants
    start = time.perf_counter()
    wanted = estimates_df.filter(F.col("level") == P)
    inv = plan.invariants
    if inv is not None:
        for d in np.unique(inv.levels):
            if d > P:
                wanted = wanted.unionByName(estimates_df.filter(F.col("level") == int(d)))
    small = wanted.toPandas()
    estimates = {}
    for d in sorted(set(small["level"].tolist()) | {P}):
        rows = small[small["level"] == d].sort_values("unit")
        block = np.full((tree.sizes[d], k), np.nan)
        block[rows["unit"].to_numpy()] = np.vstack(rows["values"].to_numpy())
        estimates[int(d)] = block
    for d in range(P - 1, -1, -1):
        estimates[d] = np.add.reduceat(estimates[d + 1], tree.child_bounds(d)[:-1], axis=0)
    if space == "measurements":
        timings["invariants"] = time.perf_counter() - start
        return _nonnegative(plan, plan_b, spark, estimates, estimates_df, seed, output, charge, timings, say, work,
                            about, postprocess)
    coarse = {d: estimates[d].copy() for d in range(P)}
    lam = invariant_multipliers(plan, estimates)
    if lam is None:
        lam = {d: np.zeros(tree.sizes[d]) for d in range(passes.finest + 1)}
    else:
        correct(plan, coarse, lam)
    timings["invariants"] = time.perf_counter() - start
    # ---------------------------------------------------------------- stage 3: labelled answers
    # every task writes its units' answers straight to Parquet with dictionary-encoded labels
    # (through Spark's row conversion the strings cost as much time as measuring)
    start = time.perf_counter()
    released = list(plan.levels)
    meta = provenance(plan, seed is not None, charge, about=about)
    partial = start_output(output)
    aux_b = sc.broadcast((lam, inv is not None, meta, partial))

    def stage3(batches):
        from pyspark import TaskContext

        p = plan_b.value
        lam_, held, meta_, partial_ = aux_b.value
        task = TaskContext.get().partitionId()
        written = 0
        for b, pdf in enumerate(batches):
            for d, group in pdf.groupby("level"):
                d = int(d)
                for first in range(0, len(group), UNITS_PER_FILE):
                    chunk = group.iloc[first:first + UNITS_PER_FILE]
                    units = chunk["unit"].to_numpy()
                    values = np.vstack(chunk["values"].to_numpy())[:, :-1]
                    if held:
                        values = values - np.outer(lam_[d][units], p.total_direction[0])
                    written += write_units(partial_, p, d, units, values, np.sqrt(p.variances(d, units)), meta_,
                                           f"part-{task:05d}-{b:05d}-{first:07d}")
        yield pd.DataFrame({"rows": [written]})

    fine = estimates_df.filter(F.col("level") >= P).filter(F.col("level").isin(released))
    rows = int(fine.mapInPandas(stage3, "rows long").groupBy().sum("rows").collect()[0][0] or 0)
    for d in released:
        if d < P:
            rows += write_units(partial, plan, d, np.arange(tree.sizes[d]), coarse[d][:, :-1],
                                np.sqrt(plan.variances(d)), meta, "part-driver")
    finish_output(partial, output, meta)
    timings["stage 3 (answers)"] = time.perf_counter() - start
    say(f"  stage 3: wrote {rows:,} answers in {timings['stage 3 (answers)']:.1f} s")
    return SparkGeoRelease(plan, output, spark.read.parquet(output), seeded=seed is not None, timings=timings,
                           charge=charge, about=about)


def _families_to(plan: GeoPlan, plan_b, spark, d: int, cells: dict[int, np.ndarray], children: np.ndarray, lam,
                 meta: dict, partial: str, integer: bool) -> tuple[dict[int, np.ndarray], int, float]:
    """The families below the units of level ``d`` (whose cells are ``cells``), one task per unit: the cells of
    every unit of level ``d + 1`` (whose estimates are ``children``), the answer rows written and the squared
    change of the answers from least squares."""
    tree = plan.tree
    bounds = tree.child_bounds(d)
    items = [(u, x, children[bounds[u]:bounds[u + 1]]) for u, x in sorted(cells.items())]
    aux_b = spark.sparkContext.broadcast((lam, meta, partial, integer))

    def task(item):
        unit, x_plus, own = item
        p = plan_b.value
        lam_, meta_, partial_, integer_ = aux_b.value
        lo = int(p.tree.child_bounds(d)[unit])
        counts = [0]

        def write_task(level: int, units: np.ndarray, answers: np.ndarray, totals=None) -> None:
            counts[0] += write_units(partial_, p, level, units, answers, np.sqrt(p.variances(level, units)), meta_,
                                     f"part-{p.tree.levels[d]}-{unit:07d}-{units[0]:09d}")

        walk = TopDown(p, lambda level, units: own[units - lo], lam_, sink=write_task, batch=UNITS_PER_FILE,
                       integer=integer_)
        reached: dict[int, np.ndarray] = {}
        walk.descend(d, unit, x_plus, d + 1, reached)
        walk.flush()
        return reached, counts[0], walk.squared.get(d + 1, 0.0)

    done = spark.sparkContext.parallelize(items, len(items)).map(task).collect()
    reached, rows, squared = {}, 0, 0.0
    for cells_, count, sq in done:
        reached.update(cells_)
        rows += count
        squared += sq
    return reached, rows, squared


def _nonnegative(plan: GeoPlan, plan_b, spark, estimates: dict[int, np.ndarray], estimates_df, seed, output: str,
                 charge, timings: dict[str, float], say, work: str, about: dict,
                 postprocess: str = "nonnegative") -> SparkGeoRelease:
    """Non-negative (or integer) estimates: the top-down walk on the driver to the partition level (or the
    deepest released level, if coarser), then one task per partition for its subtree, which writes its
    units' answers (least-squares standard errors) in files of at most ``UNITS_PER_FILE`` units."""
    from pyspark.sql import functions as F

    P = plan.partition_level
    start = time.perf_counter()
    lam = invariant_multipliers(plan, estimates, "measurements")
    meta = provenance(plan, seed is not None, charge, postprocess, about)
    integer = postprocess == "integer"
    partial = start_output(output)
    written = []

    def write(d: int, units: np.ndarray, answers: np.ndarray, totals=None) -> None:
        written.append(write_units(partial, plan, d, units, answers, np.sqrt(plan.variances(d, units)), meta,
                                   f"part-driver-{len(written):05d}"))

    walk = TopDown(plan, lambda d, units: estimates[d][units], lam, sink=write, batch=UNITS_PER_FILE,
                   integer=integer)
    cells: dict[int, np.ndarray] = {}
    stop = min(P, walk.deepest)  # the released levels may all lie above the partition level
    middle = max(held_region(plan.tree, integer_totals(plan, "spark"))) if integer else 0
    middle = max(middle, 1)  # the driver walks to here (the held region is rounded at once, on the driver) ...
    if middle >= stop:
        walk.start(stop=stop, reached=cells)
    else:
        walk.start(stop=middle, reached=cells)
    walk.flush()
    squared = dict(walk.squared)
    rows = sum(written)
    timings["non-negative (driver)"] = time.perf_counter() - start
    if middle < stop:  # ... then, level by level, one task per unit projects its family, to the partition level
        start = time.perf_counter()
        for d in range(middle, stop):
            cells, more, more_squared = _families_to(plan, plan_b, spark, d, cells, estimates[d + 1], lam, meta,
                                                     partial, integer)
            rows += more
            if d + 1 in squared:  # a released level
                squared[d + 1] += more_squared
        timings["non-negative (to the partition level)"] = time.perf_counter() - start
    start = time.perf_counter()
    if walk.deepest > P:
        aux_b = spark.sparkContext.broadcast((lam, meta, partial, integer))

        def stage3(pdf: pd.DataFrame) -> pd.DataFrame:
            p = plan_b.value
            lam_, meta_, partial_, integer_ = aux_b.value
            unit = int(pdf["partition"].iloc[0])
            part = Partition.of(p.tree, p.partition_level, unit)
            own = _own_from_rows(pdf)
            x_plus = np.asarray(pdf.loc[pdf["level"] == CELLS_ROW, "values"].iloc[0], dtype=float)
            counts = {}

            def write_task(d: int, units: np.ndarray, answers: np.ndarray, totals=None) -> None:
                errors = np.sqrt(p.variances(d, units))
                counts[d] = counts.get(d, 0) + write_units(partial_, p, d, units, answers, errors, meta_,
                                                           f"part-{unit:07d}-{units[0]:09d}")

            task = TopDown(p, lambda d, units: own[d][units - part.range(d)[0]], lam_, sink=write_task,
                           batch=UNITS_PER_FILE, integer=integer_)
            task.descend(p.partition_level, unit, x_plus)
            task.flush()
            levels = [d for d in p.levels if d > p.partition_level]
            return pd.DataFrame({"level": levels, "rows": [counts.get(d, 0) for d in levels],
                                 "squared": [task.squared[d] for d in levels]})

        rows_of_cells = spark.createDataFrame(pd.DataFrame([
            {"partition": v, "level": CELLS_ROW, "unit": v, "index": _NO_INDEX, "values": x}
            for v, x in sorted(cells.items())], columns=["partition", "level", "unit", "index", "values"]),
            _schema_units())
        below = estimates_df.filter(F.col("level") >= P).unionByName(rows_of_cells)
        done = below.groupBy("partition").applyInPandas(stage3, "level int, rows long, squared double").toPandas()
        for d in plan.levels:
            squared[d] += float(done.loc[done["level"] == d, "squared"].sum())
        rows += int(done["rows"].sum())
    finish_output(partial, output, meta)
    timings["stage 3 (non-negative answers)"] = time.perf_counter() - start
    say(f"  stage 3: wrote {rows:,} {'integer' if integer else 'non-negative'} answers in "
        f"{timings['stage 3 (non-negative answers)']:.1f} s")
    return SparkGeoRelease(plan, output, spark.read.parquet(output), seeded=seed is not None, timings=timings,
                           charge=charge, postprocess=postprocess, change=change_rmse(plan, squared), about=about)
