"""The local engine on every core: partitions handed to forked worker processes, results in order.

A geography release's heavy steps work partition by partition (a county and everything below it):
measuring the units (:func:`hdmm.georelease.units.measure_partition`) and walking the subtree top
down (:class:`hdmm.georelease.nonneg.TopDown`). :func:`map_partitions` runs ``fn(i)`` for every
partition ``i`` in ``workers`` processes forked from the caller, so they share, without copying or
pickling, everything the caller holds (the plan and its cached matrices, the data source, the
estimates); only each partition's result travels back, and results come back in partition order.

The answers do not depend on the number of workers: every unit's noise comes either from the
operating system's generator (``os.urandom`` is read afresh on every draw, nothing is buffered
across the fork) or, with a seed, from a stream derived from the seed and the unit's code
(:func:`hdmm.georelease.units.unit_seed`), never from the order of work. Each worker limits BLAS
to one thread (``threadpoolctl``): the parallelism is over partitions.

Forking is what makes the sharing free, so the pool is used only where ``fork`` is available
(Linux; elsewhere the partitions run one after another in the calling process).

A worker lives for many tasks (here, and Spark's reused Python workers), and the allocators keep
what a task freed for the next one: glibc's ``malloc`` its fragmented heap, Arrow's pool its
segments. A worker that has ended a large task would so hold that task's memory while it waits or
does small work, beside the other workers' tasks. :func:`return_free_memory`, called as each task
starts (and as a Spark task's output ends), hands it back to the operating system.

>>> list(map_partitions(lambda i: i * i, 4, workers=2))
[0, 1, 4, 9]
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

__all__ = ["map_partitions", "default_workers", "check_workers", "return_free_memory", "POOL_UNITS"]

T = TypeVar("T")

#: What the forked workers run (set by the caller just before the pool starts; inherited by the fork).
_TASK: dict[str, Callable] = {}


def default_workers() -> int:
    """The cores this process may run on (its CPU affinity where the system reports it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


#: A release of fewer units than this runs in one process unless workers are asked for: forking and
#: sending results back would cost more than they save.
POOL_UNITS = 2000


def check_workers(workers: int | None, units: int = POOL_UNITS) -> int:
    """``workers`` checked (a positive int); for ``None``, :func:`default_workers` if the release has at
    least ``POOL_UNITS`` units, else 1."""
    if workers is None:
        return default_workers() if units >= POOL_UNITS else 1
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int (processes for the local engine) or None (every core), "
                         f"got {workers!r}")
    return workers


def _malloc_trim():
    """glibc's ``malloc_trim`` on Linux, or ``None`` (other systems; a C library without it, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except (OSError, TypeError):
        return None


_TRIM = _malloc_trim()


def return_free_memory() -> None:
    """Give the memory this process has freed but its allocators keep back to the operating system (module
    docstring): Arrow's pool (if Arrow is loaded) and glibc's heap. Live objects are untouched; a call costs
    milliseconds."""
    arrow = sys.modules.get("pyarrow")
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


def _single_thread() -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _run(i: int):
    return_free_memory()  # what the worker's last task freed
    return _TASK["fn"](i)


def map_partitions(fn: Callable[[int], T], n: int, workers: int = 1) -> Iterator[T]:
    """``fn(0), ..., fn(n - 1)`` in order, computed by up to ``workers`` forked processes.

    With one worker, one partition, or no ``fork`` on this system, they run here one by one.
    An exception in ``fn`` is raised here, and the remaining partitions are cancelled.
    """
    if workers <= 1 or n <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for i in range(n):
            yield fn(i)
        return
    if _TASK:
        raise RuntimeError("map_partitions does not nest: a worker may not start its own pool")
    _TASK["fn"] = fn
    try:
        with ProcessPoolExecutor(max_workers=min(workers, n), mp_context=multiprocessing.get_context("fork"),
                                 initializer=_single_thread) as pool:
            futures = [pool.submit(_run, i) for i in range(n)]
            try:
                for future in futures:
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()
    finally:
        _TASK.clear()
