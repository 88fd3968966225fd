"""Successive halving: the starts of a non-convex local search race, the best going on with more iterations.

A start far behind after a few iterations rarely wins, so with successive halving extra starts cost
a few iterations each instead of a full search (the figures behind each optimizer's schedule are in
``benchmarks/results/tuning-notes-optimizers.md``).
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

__all__ = ["successive_halving"]

Point = TypeVar("Point")


def successive_halving(starts: Sequence[Point], run: Callable[[Point, int], tuple[Point, float]], first: int,
                       keep: int, growth: int, budget: int | None = None) -> tuple[Point, int]:
    """Race ``starts`` and return the survivor and the iterations each surviving start has run.

    Each rung runs ``run(start, iterations) -> (point, value)`` from every start left, keeps the
    ``1 / keep`` with the least values (at least one) as the next rung's starts, and multiplies
    the iterations by ``growth``; the first rung runs ``first``. The race ends when one start is
    left or when the next rung would bring the iterations to ``budget``. The caller runs the
    survivor on to convergence.

    >>> successive_halving([3.0, 1.0, 2.0, 5.0], lambda x, k: (x / 2, x), first=1, keep=2, growth=2)
    (0.25, 3)
    """
    starts, rung, used = list(starts), first if budget is None else min(first, budget), 0
    while len(starts) > 1 and (budget is None or used + rung < budget):
        runs = sorted((run(start, rung) for start in starts), key=lambda result: result[1])
        starts = [point for point, _ in runs[:max(1, len(runs) // keep)]]
        used += rung
        rung *= growth
    return starts[0], used
