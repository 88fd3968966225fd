r"""The max-variance objective for any workload: total-error optimizers on reweighted terms (docs/math.md, section 4.11).

Where no exact program applies (Laplace noise, or queries within a Kronecker term of unequal
variance such as prefixes and ranges), the largest per-query variance is lowered by multiplicative
weights on the workload's Kronecker terms. Each round optimizes the *total* squared error of the
workload with term ``j`` scaled by :math:`\omega_j`, then measures every query's variance under the
resulting strategy on the workload itself, and raises the weights of the terms whose largest
variance is above the mean of the terms' largest:

.. math:: \omega_j \leftarrow \omega_j \,(v_j / \bar v)^{\eta}, \qquad v_j = \max_{q \in j} \mathrm{Var}(q),

with :math:`\eta` = ``STEP`` at first. The best round by largest variance is kept; a round whose
largest variance is not below the best's overshot, so the next weights are the best round's moved
again by its own variances with :math:`\eta` halved (and it stays halved). The search stops when
the terms' largest variances agree to ``BALANCED_RTOL`` (reweighting cannot then lower the
largest) or after ``rounds``. Every strategy a round returns is a valid strategy for the workload
itself; the weights only steer the optimizer.

A lower bound on the largest variance of any strategy is the mean variance's: the SVD bound
divided by the number of queries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ..error import per_query_variance
from ..kron_union import KronUnion, kron_union
from ..matrix import Kronecker, Matrix, VStack, Weighted
from ..privacy import Privacy

__all__ = ["ReweightedSolution", "reweighted_max_variance", "ROUNDS", "MAX_QUERIES"]

#: Rounds of reweighting by default.
ROUNDS = 8

#: Exponent of the multiplicative update at first (0.5 and 1.5 were no better on prefix, range and total mixes);
#: halved after each round that overshoots.
STEP = 1.0

#: The search stops once the terms' largest variances are within this relative spread.
BALANCED_RTOL = 1e-3

#: Every query's variance is computed each round; beyond this many queries the objective is refused.
MAX_QUERIES = 10_000_000


@dataclass(frozen=True)
class ReweightedSolution:
    """The best strategy found by reweighting, with its largest variance and the rounds' history.

    Attributes
    ----------
    strategy : Matrix
        The strategy of the best round.
    max_variance : float
        Its largest per-query variance under the privacy definition.
    weights : numpy.ndarray
        The term weights of the best round (relative; they steered the optimizer only).
    history : pandas.DataFrame
        One row per round: ``round``, ``max variance``, ``total squared error`` (on the workload
        itself), ``seconds``, ``optimizer`` (the total-error optimizer's winner).
    """

    strategy: Matrix
    max_variance: float
    weights: np.ndarray
    history: pd.DataFrame = field(repr=False)


def _reweighted(union: KronUnion, omega: np.ndarray) -> Matrix:
    """The workload's terms, in order, with term ``j``'s weight multiplied by ``omega[j]``."""
    terms = [union.term(j) for j in range(union.num_terms)]
    return VStack([Weighted(Kronecker(factors), weight * float(omega[j])) for j, (weight, factors) in enumerate(terms)])


def reweighted_max_variance(W: Matrix, privacy: Privacy, optimize_total: Callable[[Matrix], tuple[Matrix, str]],
                            rounds: int = ROUNDS, progress: Callable[[str], None] | None = None,
                            deadline: float | None = None) -> ReweightedSolution:
    """Lower the largest per-query variance of ``W`` under ``privacy`` by reweighting its terms (module docstring).

    ``optimize_total(W_weighted)`` returns a strategy for the reweighted workload (optimized for
    total squared error) and the name of the optimizer that found it; its strategies must have
    per-query variances in closed form or on a small domain (:func:`hdmm.error.per_query_variance`).
    No round starts after ``deadline`` (a ``time.perf_counter()`` value); the first always runs.

    Examples
    --------
    >>> import hdmm
    >>> from hdmm.optimizers.kron import opt_kron_union
    >>> from hdmm.kron_union import kron_union
    >>> W = hdmm.union([hdmm.Prefix(8), hdmm.Identity(8)], weights=[1.0, 4.0])
    >>> total = lambda Wr: (opt_kron_union(kron_union(Wr), hdmm.PureDP(1.0), rng=np.random.default_rng(0))[0], "opt_kron")
    >>> solution = reweighted_max_variance(W, hdmm.PureDP(1.0), total, rounds=3)
    >>> bool(solution.max_variance <= solution.history["max variance"].iloc[0])
    True
    """
    if W.shape[0] > MAX_QUERIES:
        raise ValueError(f"the max-variance objective computes every query's variance each round; this workload has "
                         f"{W.shape[0]:,} queries (limit {MAX_QUERIES:,}): optimize the total (objective='total')")
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    union = kron_union(W)
    rows = union.term_rows().astype(np.int64)
    live = (rows > 0) & (union.weights != 0)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    omega = np.ones(union.num_terms)
    best, history, step = None, [], STEP
    for round_ in range(rounds):
        start = time.perf_counter()
        A, name = optimize_total(_reweighted(union, omega))
        variances = per_query_variance(W, A, privacy)
        term_max = np.zeros(union.num_terms)
        nonempty = rows > 0
        term_max[nonempty] = np.maximum.reduceat(variances, starts[nonempty])  # each term's own rows
        term_max[~live] = 0.0  # terms of weight zero: zero queries, nothing to balance
        worst = float(term_max.max())
        history.append({"round": round_ + 1, "max variance": worst, "total squared error": float(np.sum(variances)),
                        "seconds": time.perf_counter() - start, "optimizer": name})
        if progress is not None:
            progress(f"max variance, round {round_ + 1}: {worst:.6g} ({name})")
        improved = best is None or worst < best[1]
        if improved:
            best = (A, worst, omega.copy(), term_max)
        level = float(np.mean(term_max[live]))
        if not np.isfinite(worst) or worst <= level * (1.0 + BALANCED_RTOL):
            break
        if not improved:  # overshot: step again from the best round, half as far
            step *= 0.5
            omega, term_max = best[2].copy(), best[3]
            level = float(np.mean(term_max[live]))
        if deadline is not None and time.perf_counter() >= deadline:
            break
        omega = np.where(live, omega * (term_max / level) ** step, omega)
        omega /= omega[live].max()
    A, worst, weights, _ = best
    return ReweightedSolution(A, worst, weights, pd.DataFrame(history))
