"""What the release steps share: the coarse levels' measurements, the invariants' multipliers, the provenance
and the progress reports.

See :mod:`hdmm.georelease.pipeline` for the order of the steps.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp

from ..version import HDMM_VERSION
from .plan import GeoPlan
from .units import SPACES, measure_units

__all__ = ["measure_top", "invariant_multipliers", "provenance", "progress_printer",
           "Progress"]


def measure_top(plan: GeoPlan, roots: np.ndarray, seed: int | None, space: str = "answers") -> dict[int, np.ndarray]:
    """Measure the units of the measured levels above the partition level from the partitions' total histograms
    (``partitions x cells``, sparse or dense; a partition's total is the sum of its units')."""
    tree, P = plan.tree, plan.partition_level
    own, X = {}, sp.csr_matrix(roots)  # sparse: the driver never holds partitions x cells densely
    for d in range(P - 1, -1, -1):
        bounds = tree.child_bounds(d)
        if d == P - 1 and plan.partition_bounds is not None:  # ranges of siblings: each one's parent
            bounds = np.searchsorted(plan.partition_bounds, bounds)
        parent = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
        X = sp.csr_matrix((np.ones(parent.size), (parent, np.arange(parent.size))),
                          shape=(bounds.size - 1, parent.size)) @ X
        if plan.level_weights[d] > 0:
            own[d] = measure_units(plan, d, 0, X, seed, space)
    return own


def invariant_multipliers(plan: GeoPlan, estimates: dict[int, np.ndarray], space: str = "answers"
                          ) -> dict[int, np.ndarray] | None:
    r"""The invariants' multipliers :math:`\lambda` per level (``None`` without invariants), from the
    least-squares estimates of (at least) the invariant levels' units: in the ``"answers"`` space a
    unit's total is its last entry, in the ``"measurements"`` space :math:`u^Tz` with
    :math:`u = (A_p^+)^T\mathbf 1`."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, got {space!r}")
    inv = plan.invariants
    if inv is None:
        return None
    estimated = np.empty(inv.units)
    for d in np.unique(inv.levels).tolist():
        mask = inv.levels == d
        rows = estimates[d][inv.units_at[mask]]
        estimated[mask] = rows[:, -1] if space == "answers" else rows @ plan.total_parts[0]
    return inv.multipliers(plan.tree, plan.solver, estimated, plan.total_direction[1])


def provenance(plan: GeoPlan, seeded: bool, charge=None, postprocess: str | None = None,
               about: dict | None = None) -> dict:
    """The release's record of what it spent and how (JSON-able), with its budget charge if any, its
    post-processing (``None``: least squares), the fingerprint of the person workload it answers
    (:func:`hdmm.io.workload_fingerprint`, weights included) and ``about`` (what the caller records of
    the release's inputs, e.g. the creation time, the workload's name and the data source)."""
    tree = plan.tree
    return {
        "hdmm_version": HDMM_VERSION,
        "workload_fingerprint": plan.person.fingerprint,
        "privacy": plan.privacy.to_dict(),
        "privacy_description": plan.privacy.description,
        "sensitivity": plan.sensitivity,
        "noise_scale": plan.noise_scale,
        "levels": [tree.levels[d] for d in plan.levels],
        "level_weights": {tree.levels[d]: float(plan.level_weights[d]) for d in plan.measured},
        "person_strategy": repr(plan.person.strategy) if not plan.per_level else
        {tree.levels[d]: repr(plan.person_plan(d).strategy) for d in plan.measured},
        "origin": plan.origin,
        "partitions": {"level": tree.levels[plan.partition_level], "count": plan.partitions,
                       "ranges_of_siblings": plan.ranged},
        "invariants": None if plan.invariants is None else {
            "public_not_private": True, "units": plan.invariants.units,
            "levels": {tree.levels[d]: int(n)
                       for d, n in zip(*np.unique(plan.invariants.levels, return_counts=True))}},
        "seeded": seeded,
        "seed_note": "noise from a seed is reproducible and for tests and research only" if seeded else
        "noise from fresh OS entropy",
        "variance_exact": plan.variance_exact,
        "estimates": "least squares" if postprocess is None else
        f"{postprocess} (top down; std_error: " + ("each level's own measurements)" if plan.per_level else
                                                    "least squares)"),
        "charge": None if charge is None else charge.to_dict(),
        **(about or {}),
    }


def created_now() -> str:
    """The time a release is made, as its provenance records it (UTC, ISO 8601, to the second)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def progress_printer(progress) -> Callable[[str], None]:
    """``progress`` as a function of a line: itself if callable, ``print`` if true, else nothing."""
    if callable(progress):
        return progress
    if progress:
        return lambda text: print(text, flush=True)
    return lambda text: None


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def _plural(unit: str) -> str:
    """``"partitions"``, ``"families"``."""
    return unit[:-1] + "ies" if unit.endswith("y") and unit[-2:-1] not in tuple("aeiou") else unit + "s"


class Progress:
    """What a release reports as it goes, read from its steps (never parsed from text).

    ``progress`` is what :func:`~hdmm.georelease.release_geography` was given: ``False`` (nothing),
    ``True`` (lines printed), a function of a line, or an object with a method
    ``step(name, done, total)``, which then gets every step's count of tasks done instead of lines
    (the command line draws its bars from it). Lines come at most every hundredth task of a step,
    with the rate and the time left at that rate. Once an engine has reported a step from inside
    (:meth:`within`: the share of a job's tasks done, before its results come back together), the
    results' own counts never move the report back, and only the last is a line: their rate would be
    no rate of work. A step may run several such jobs one after another (a family level each).

    >>> lines = []
    >>> p = Progress(lines.append)
    >>> p.start("measure", 2, "partition")
    >>> p.done("measure", 1, "Alabama")
    >>> p.done("measure", 2, "Alaska")
    >>> lines[-1].split(",")[0]
    '  measure: 2/2 partitions (Alaska)'
    >>> p.start("non-negative", 1, "family")
    >>> p.done("non-negative", 1)
    >>> lines[-1].split(",")[0]
    '  non-negative: 1/1 families'
    """

    def __init__(self, progress) -> None:
        self._step = getattr(progress, "step", None)
        self._say = (lambda text: None) if self._step is not None else progress_printer(progress)
        self._steps: dict[str, tuple[int, str, float]] = {}
        self._inside: dict[str, int] = {}  # tasks done per step, as the engine last reported them (within)
        self._done: dict[str, int] = {}  # tasks done per step, as their results came back (done)

    def say(self, text: str) -> None:
        """A line of text (not shown to a ``step`` reporter)."""
        self._say(text)

    def start(self, name: str, total: int, unit: str) -> None:
        """Step ``name`` begins ``total`` tasks, each one ``unit`` (a partition, a family)."""
        self._steps[name] = (total, unit, time.perf_counter())
        self._inside.pop(name, None)
        self._done.pop(name, None)
        if self._step is not None:
            self._step(name, 0, total)

    def within(self, share: float, tasks: int | None = None) -> None:
        """An engine's view of the current step while its results have not come back: ``share`` of the tasks
        of its current job are done, a job of ``tasks`` of the step's tasks (``None``: all of them), the
        step's earlier jobs' results having come back (Spark reports a stage's tasks; a line each time)."""
        if not self._steps:
            return
        name = next(reversed(self._steps))
        total, unit, began = self._steps[name]
        base = self._done.get(name, 0) if tasks is not None else 0
        now = min(total, base + int(share * (total if tasks is None else tasks)))
        self._inside[name] = max(self._inside.get(name, 0), now)
        if self._step is not None:
            self._step(name, self._inside[name], total)
            return
        part = self._inside[name] / total if total else 1.0
        elapsed = time.perf_counter() - began
        left = f", about {_duration(elapsed * (1 - part) / part)} left" if 0 < part < 1 else ""
        self._say(f"  {name}: {100 * part:.0f}% of its tasks done{left}")

    def done(self, name: str, done: int, where: str = "") -> None:
        """``done`` of step ``name``'s tasks are done (the last one at ``where``)."""
        total, unit, began = self._steps[name]
        self._done[name] = done
        inside = self._inside.get(name)
        if self._step is not None:
            self._step(name, done if inside is None else max(done, inside), total)
            return
        if done != total and (inside is not None or done % max(1, total // 100)):
            return
        elapsed = time.perf_counter() - began
        rate = done / elapsed if elapsed > 0 else float("inf")
        left = "" if done == total or rate == 0 else f", about {_duration((total - done) / rate)} left"
        self._say(f"  {name}: {done:,}/{total:,} {_plural(unit)}" + (f" ({where})" if where else "") +
                  f", {rate:.3g}/s{left}")
