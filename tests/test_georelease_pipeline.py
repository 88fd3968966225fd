"""The release steps written once (hdmm.georelease.pipeline): a local release written to files as it goes,
each partition's estimates kept on disk, gives the in-memory release answer for answer, and leaves nothing
behind but its output."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import hdmm
from hdmm.georelease import ArrayHistograms, geo_plan, release_geography
from hdmm.georelease.pipeline import LocalEngine
from hdmm.georelease.stores import DiskStore, MemoryAnswers, MemoryStore
from hdmm.matrix import Kronecker
from trees import small_country

pytest.importorskip("pyarrow")

DOMAIN = hdmm.Domain(["a", "b"], [2, 3])
WP = hdmm.product(DOMAIN, {"a": hdmm.Identity(2), "b": hdmm.Prefix(3)})
AP = Kronecker([hdmm.Identity(2), hdmm.Prefix(3)])


def _data(seed: int = 1):
    tree = small_country(seed, counties=(2, 5), tracts=(1, 4))
    rng = np.random.default_rng(2)
    H = sp.csr_matrix(rng.poisson(0.8, size=(tree.leaves, DOMAIN.size)).astype(float))
    return tree, H


def _invariants(tree, H, level: str) -> dict:
    b = tree.leaf_bounds(level)
    return {level: {code: float(H[b[u]:b[u + 1]].sum()) for u, code in enumerate(tree.codes(level))}}


@pytest.mark.parametrize("postprocess", [None, "nonnegative", "integer"])
@pytest.mark.parametrize("held", [None, "state", "county"])
@pytest.mark.parametrize("partition", ["nation", "state", "tract"])
def test_a_written_release_is_the_in_memory_release(tmp_path, postprocess, held, partition):
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition=partition,
                    invariants=None if held is None else _invariants(tree, H, held))
    memory = release_geography(plan, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=1)
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        written = release_geography(plan, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=workers,
                                    output=out)
        assert written.path == str(out) and not written.estimates
        for d in plan.levels:
            np.testing.assert_array_equal(written.answers(d), memory.answers(d))
        if postprocess is not None:
            assert written.change == pytest.approx(memory.change, rel=1e-12)
        assert written.provenance()["estimates"] == memory.provenance()["estimates"]
        # the estimates' work directory (under the output's parent) is gone
        assert sorted(os.listdir(tmp_path)) == [f"out{w}" for w in range(1, workers + 1)]


@pytest.mark.parametrize("held", [None, "state", "county", "tract"])
@pytest.mark.parametrize("values, level", [(30, None), (200, None), (10**6, None), (14, "tract")])
def test_a_release_by_ranges_of_siblings_is_the_release_by_units(tmp_path, held, values, level):
    """Partitions of several siblings (7 numbers a unit: 4, 28 or 2**14 units a partition: counties or states;
    2 tracts) give the answers of one partition per unit to rounding, in memory or written, on one or two
    processes."""
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="state",
                    invariants=None if held is None else _invariants(tree, H, held))
    assert not plan.partition_auto and not plan.ranged  # given: one state a partition
    base = release_geography(plan, ArrayHistograms(H), seed=7, workers=1)
    ranged = plan.with_partitions(values=values, level=level)
    assert level is None or ranged.partition_level == tree.level_index(level)
    assert ranged.ranged and any(ranged.partition(i).size > 1 for i in range(ranged.partitions))
    for workers, out in ((1, None), (2, tmp_path / f"out{values}")):
        got = release_geography(ranged, ArrayHistograms(H), seed=7, workers=workers, output=out)
        for d in plan.levels:
            np.testing.assert_allclose(got.answers(d), base.answers(d), rtol=1e-10, atol=1e-9)


def test_ranges_of_single_units_give_the_same_bits():
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="tract",
                    invariants=_invariants(tree, H, "county"))
    single = plan.with_partitions(values=1)  # every unit over the cap: one partition per tract
    assert single.partition_level == plan.partition_level and single.partitions == tree.sizes[3]
    base = release_geography(plan, ArrayHistograms(H), seed=7, workers=1)
    got = release_geography(single, ArrayHistograms(H), seed=7, workers=2)
    for d in plan.levels:
        np.testing.assert_array_equal(got.answers(d), base.answers(d))


@pytest.mark.parametrize("postprocess", [None, "nonnegative", "integer"])
def test_default_partitions_are_cut_for_the_release(monkeypatch, postprocess):
    """A plan's default partitions are cut at release, before any data are read: least squares into ranges of
    at most PARTITION_VALUES numbers, non-negative estimates into ranges a family projects in one piece, integer
    tables into single units at the level whose units fit; the release is the one on those partitions given,
    bit for bit, and its provenance says which. Given partitions are used as they are."""
    import hdmm.georelease.plan as geoplan
    from hdmm.georelease.pipeline import release_partitions

    monkeypatch.setattr(geoplan, "PARTITION_VALUES", 7 * 6)  # 7 numbers a unit: at most 6 units a partition
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    assert plan.partition_auto and not plan.ranged
    cut = release_partitions(plan, postprocess)
    sizes = np.array([cut.partition(i).size for i in range(cut.partitions)])
    assert cut.partition_auto and sizes.max() <= 6
    assert cut.ranged == (postprocess != "integer") and (sizes.max() > 1) == cut.ranged
    given = replace(cut, partition_auto=False)
    assert release_partitions(given, postprocess) is given
    got = release_geography(plan, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=2)
    want = release_geography(given, ArrayHistograms(H), seed=7, postprocess=postprocess, workers=1)
    for d in plan.levels:
        np.testing.assert_array_equal(got.answers(d), want.answers(d))
    assert got.plan.partitions == cut.partitions
    assert got.provenance()["partitions"] == {"level": tree.levels[cut.partition_level], "count": cut.partitions,
                                              "ranges_of_siblings": cut.ranged}


def test_default_partitions_stay_units_where_ranges_would_not_project(monkeypatch):
    """Non-negative estimates on default partitions: where the ranges would split a family into more pieces than
    project at once (check_partitions refuses them), the release keeps one unit a partition (each family then
    projected in groups inside its task) rather than refusing."""
    import hdmm.georelease.pipeline as pipeline
    from hdmm.georelease.pipeline import release_partitions

    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    assert release_partitions(plan, "nonnegative").ranged
    check = pipeline.check_partitions

    def refuse_ranges(p, postprocess):
        if p.ranged:
            raise hdmm.geography.GeographyError("too many or too large")
        check(p, postprocess)

    monkeypatch.setattr(pipeline, "check_partitions", refuse_ranges)
    assert release_partitions(plan, "nonnegative") is plan
    got = release_geography(plan, ArrayHistograms(H), seed=7, postprocess="nonnegative", workers=1)
    assert got.plan is plan and (got.answers("tract") >= 0).all()


def test_ranges_of_siblings_are_refused_where_not_wired_before_any_charge(monkeypatch):
    import hdmm.georelease.nonneg as nonneg

    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP).with_partitions(values=30)
    budget = hdmm.Budget(hdmm.PureDP(1.0))
    with pytest.raises(NotImplementedError, match="only so far"):
        release_geography(plan, ArrayHistograms(H), seed=7, postprocess="integer", budget=budget)
    monkeypatch.setattr(nonneg, "MAX_FAMILY_CELLS", DOMAIN.size)  # one unit at once: a split family cannot be
    with pytest.raises(hdmm.geography.GeographyError, match="too many or too large"):
        release_geography(plan.with_partitions(values=14, level="tract"), ArrayHistograms(H), seed=7,
                          postprocess="nonnegative", budget=budget)
    assert budget.spent == 0


@pytest.mark.parametrize("held", [None, "state", "county"])
def test_a_nonnegative_release_by_ranges_of_siblings(tmp_path, held):
    """Non-negative estimates by ranges of siblings: where no family is split, the unit partitions' answers to
    the projections' tolerance; where families are split (two tracts a partition), each split family projected in
    two stages (the partitions' sums, then each partition's children): non-negative, adding up, the invariants
    held, and about as close to least squares."""
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP,
                    invariants=None if held is None else _invariants(tree, H, held))
    units = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition=plan.partition_level,
                     invariants=plan.invariants)  # given: one unit a partition
    base = release_geography(units, ArrayHistograms(H), seed=7, postprocess="nonnegative", workers=1)
    whole = plan.with_partitions(values=10**6, level="county")  # every state's counties one partition
    assert whole.partitions == tree.sizes[1]
    got = release_geography(whole, ArrayHistograms(H), seed=7, postprocess="nonnegative", workers=2)
    for d in plan.levels:
        np.testing.assert_allclose(got.answers(d), base.answers(d), atol=1e-5)
    split = plan.with_partitions(values=14, level="tract")
    for out in (None, tmp_path / "split"):
        got = release_geography(split, ArrayHistograms(H), seed=7, postprocess="nonnegative", workers=2,
                                output=out)
        for d in range(tree.depth):
            children = np.add.reduceat(got.answers(d + 1), tree.child_bounds(d)[:-1], axis=0)
            np.testing.assert_allclose(got.answers(d), children, rtol=1e-9, atol=1e-7)
        for d in plan.levels:
            assert np.all(got.answers(d) >= -1e-9)
            assert got.change[d] <= 1.5 * base.change[d] + 0.1 * plan.expected_rmse(d), (d, got.change, base.change)
        np.testing.assert_allclose(got.answers(1), base.answers(1), atol=1e-5)  # above the split families
        if held is not None and out is None:  # (written files hold the queries, not the totals)
            np.testing.assert_allclose(got.totals(held), list(_invariants(tree, H, held)[held].values()), rtol=1e-9)


def test_a_written_release_copies_and_tabulates(tmp_path):
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    written = release_geography(plan, ArrayHistograms(H), seed=3, output=tmp_path / "a", work_dir=tmp_path)
    memory = release_geography(plan, ArrayHistograms(H), seed=3)
    assert written.table().equals(memory.table())
    written.save(tmp_path / "b")
    assert sorted(os.listdir(tmp_path / "b")) == sorted(os.listdir(tmp_path / "a"))
    with pytest.raises(FileExistsError):
        written.save(tmp_path / "a")
    with pytest.raises(ValueError, match="no total query"):
        written.totals("county")
    assert "written to" in repr(written)


class _Failing:
    """Histograms that fail on a given partition's leaves, after the first partitions were measured."""

    def __init__(self, H: sp.csr_matrix, fail_at: int):
        self.H, self.fail_at, self.person_cells = H, fail_at, H.shape[1]

    def leaf_totals(self) -> np.ndarray:
        return np.asarray(self.H.sum(axis=1)).ravel()

    def histograms(self, lo: int, hi: int) -> sp.csr_matrix:
        if lo <= self.fail_at < hi:
            raise OSError("the disk went away")
        return self.H[lo:hi]


def test_a_failed_written_release_leaves_nothing_behind(tmp_path):
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="county")
    with pytest.raises(OSError, match="disk went away"):
        release_geography(plan, _Failing(H, tree.leaves - 1), seed=1, output=tmp_path / "out")
    assert os.listdir(tmp_path) == []


def test_a_written_release_refuses_an_existing_output_before_any_noise(tmp_path):
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    (tmp_path / "out").mkdir()
    budget = hdmm.Budget(hdmm.PureDP(1.0))
    with pytest.raises(FileExistsError, match="never overwritten"):
        release_geography(plan, ArrayHistograms(H), output=tmp_path / "out", budget=budget)
    assert budget.charges == ()
    with pytest.raises(FileNotFoundError, match="not an existing directory"):
        release_geography(plan, ArrayHistograms(H), output=tmp_path / "new", work_dir=tmp_path / "missing")


def test_stores_give_back_what_they_keep(tmp_path):
    vectors = {2: np.arange(6.0).reshape(2, 3), 3: np.ones((4, 3))}
    for store in (MemoryStore(), DiskStore(tmp_path)):
        store.accept(5, store.save(5, vectors))
        got = store.load(5)
        assert sorted(got) == [2, 3]
        for d in vectors:
            np.testing.assert_array_equal(got[d], vectors[d])
        store.accept(5, store.save(5, {3: np.zeros((4, 3))}))  # a later step replaces the partition's levels
        assert sorted(store.load(5)) == [3]
        store.close()
    assert os.listdir(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="not an existing directory"):
        DiskStore(tmp_path / "missing")


def test_memory_answers_gather_rows_and_totals():
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    out = MemoryAnswers(plan)
    d = plan.levels[-1]
    writer = out.writer("t", plan)
    writer.write(d, np.array([1, 0]), np.ones((2, plan.queries)) * [[2.0], [1.0]], np.array([5.0, 4.0]))
    out.gather(writer.result())
    assert out.rows[d][0, -1] == 4.0 and out.rows[d][1, 0] == 2.0


def test_local_engine_runs_items_in_order_and_keeps_states():
    engine = LocalEngine(lambda lo, hi: np.arange(lo, hi), MemoryStore(), workers=2)
    k = (engine.share(10),)
    assert list(engine.map(lambda ten, x: -x * ten, k, [3, 1, 2])) == [-30, -10, -20]
    assert list(engine.map(lambda ten, x: x, k, [])) == []
    firsts = list(engine.measure(lambda ten, i, read: ({0: read(i, i + 2) * ten}, i), k, 3))
    assert firsts == [0, 1, 2] and engine.store.load(2)[0].tolist() == [20, 30]
    got = list(engine.update(lambda ten, i, state, extra: (None, int(state[0].sum()) + extra), k, 3, [100, 200, 300]))
    assert got == [110, 230, 350] and engine.store.load(1)[0].tolist() == [10, 20]  # kept as it was


def _docs_engine_example() -> str:
    """The thread engine of docs/engines.md, as written there."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "engines.md").read_text()
    start = text.index("```python\nfrom concurrent.futures")
    return text[start + len("```python\n"):text.index("```", start + 10)]


def test_an_engine_is_one_module_and_one_registry_line(monkeypatch):
    from hdmm.georelease import release as R

    monkeypatch.setattr(R, "ENGINES", dict(R.ENGINES))  # the example's registry line is undone afterwards
    exec(compile(_docs_engine_example(), "docs/engines.md", "exec"), {})
    assert "threads" in R.ENGINES
    tree, H = _data()
    b = tree.leaf_bounds("state")
    held = {"state": {code: float(H[b[u]:b[u + 1]].sum()) for u, code in enumerate(tree.codes("state"))}}
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="county", invariants=held)
    for postprocess in (None, "integer"):
        local = release_geography(plan, ArrayHistograms(H), seed=5, postprocess=postprocess)
        threads = release_geography(plan, ArrayHistograms(H), seed=5, postprocess=postprocess, engine="threads",
                                    threads=3)
        for d in plan.levels:
            np.testing.assert_array_equal(threads.estimates[d], local.estimates[d])
    with pytest.raises(TypeError, match="threads engine takes only the options \\['threads'\\]"):
        release_geography(plan, ArrayHistograms(H), engine="threads", workers=2)
    with pytest.raises(ValueError, match="unknown engine 'dask'"):
        release_geography(plan, ArrayHistograms(H), engine="dask")


class _Steps:
    def __init__(self):
        self.seen: dict[str, list[tuple[int, int]]] = {}

    def __call__(self, text):  # lines: not for a step reporter
        raise AssertionError(f"a step reporter got a line: {text!r}")

    def step(self, name, done, total):
        self.seen.setdefault(name, []).append((done, total))


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_counts_every_step_from_the_engine(workers, tmp_path):
    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="county")
    steps = _Steps()
    release_geography(plan, ArrayHistograms(H), seed=1, postprocess="integer", progress=steps, workers=workers)
    partitions, families = tree.sizes[2], sum(tree.sizes[:-1])
    assert list(steps.seen) == ["measure", "estimate", "integer"]
    assert steps.seen["measure"][0] == (0, partitions) and steps.seen["measure"][-1] == (partitions, partitions)
    assert steps.seen["estimate"][-1] == (partitions, partitions)
    assert steps.seen["integer"][-1] == (families, families)
    done = [d for d, _ in steps.seen["integer"]]
    assert done == sorted(done)
    lines: list[str] = []
    release_geography(plan, ArrayHistograms(H), seed=1, progress=lines.append, workers=workers,
                      output=tmp_path / "o")
    assert any(line.startswith(f"  measure: {partitions}/{partitions} partitions") and "/s" in line for line in lines)
    assert any(line.startswith(f"  answers: {partitions}/{partitions} partitions") for line in lines)


def test_results_that_come_back_after_the_engine_reported_its_tasks_never_move_the_report_back():
    """Spark reports a step's tasks while they run (``within``); its results come back together afterwards, so
    their counts neither move a bar backwards nor print a rate (1 of 53 after 50 s is no rate of work)."""
    from hdmm.georelease.steps import Progress

    steps = _Steps()
    progress = Progress(steps)
    progress.start("measure", 53, "partition")
    progress.within(0.88)
    for done in range(1, 54):
        progress.done("measure", done)
    counts = [d for d, _ in steps.seen["measure"]]
    assert counts == sorted(counts) and counts[1] == 46 and counts[-1] == 53
    lines: list[str] = []
    progress = Progress(lines.append)
    progress.start("measure", 53, "partition")
    progress.within(0.5)
    for done in range(1, 54):
        progress.done("measure", done, "x")
    assert lines[0].startswith("  measure: 49% of its tasks done, about")  # 26 of 53
    assert lines[1:] == [lines[-1]] and lines[-1].startswith("  measure: 53/53 partitions (x), ")
    assert "left" not in lines[-1]


def test_a_step_of_several_jobs_is_reported_job_by_job():
    """A non-negative step runs a Spark job per family level: each job's share counts its own tasks, after the
    results of the jobs before it, so the report neither stalls at one job's share nor runs ahead."""
    from hdmm.georelease.steps import Progress

    steps = _Steps()
    progress = Progress(steps)
    progress.start("non-negative", 1000, "family")
    progress.within(0.96, tasks=52)  # the first job: 52 families
    for done in range(1, 53):
        progress.done("non-negative", done)
    progress.within(0.5, tasks=948)  # the second: the rest
    for done in range(53, 1001):
        progress.done("non-negative", done)
    counts = [d for d, _ in steps.seen["non-negative"]]
    assert counts[1] == 49 and 52 + 474 in counts and counts == sorted(counts) and counts[-1] == 1000
    progress.start("non-negative", 10, "family")  # a new step starts from nothing
    assert steps.seen["non-negative"][-1] == (0, 10)


def test_ranges_of_siblings_keep_the_partition_level_off_the_driver_in_the_memory_check():
    from hdmm.georelease.nonneg import held_measurements

    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP, partition="tract")
    rows = AP.shape[0]
    assert held_measurements(plan, partitioned=True) == sum(tree.sizes) * rows  # the driver holds every tract
    ranged = plan.with_partitions(values=14, level="tract")
    assert held_measurements(ranged, partitioned=True) == sum(tree.sizes[:3]) * rows  # only the levels above


def test_a_range_of_siblings_with_many_leaves_is_measured_unit_by_unit(monkeypatch):
    import hdmm.georelease.units as units

    tree, H = _data()
    plan = geo_plan(tree, WP, hdmm.PureDP(0.5), strategy=AP)
    base = release_geography(plan, ArrayHistograms(H), seed=7)
    ranged = plan.with_partitions(values=10**6)  # the states, in one partition
    assert ranged.partition_level == 1 and ranged.partitions == 1
    calls, original = [], units._measure_subtree

    def measured(plan, part, *rest):
        if part.size == 1:  # one unit's subtree
            calls.append((part.level, part.unit))
        return original(plan, part, *rest)

    monkeypatch.setattr(units, "LEAVES_PER_READ", 2)  # too many leaves to read at once: state by state
    monkeypatch.setattr(units, "_measure_subtree", measured)
    got = release_geography(ranged, ArrayHistograms(H), seed=7)
    assert (1, 0) in calls and (1, 2) in calls
    for d in plan.levels:
        np.testing.assert_allclose(got.answers(d), base.answers(d), rtol=1e-10, atol=1e-9)
