"""The optimizers :func:`~hdmm.optimizers.optimize` compares, behind one small protocol.

An optimizer is an :class:`Optimizer`: a name, an ``applies(problem)`` check and a
``run(problem)`` that returns a :class:`Candidate` (its strategy, the strategy's expected total
squared error at unit noise variance, and whether that error is exact or an upper bound). The
:class:`Problem` carries what every optimizer reads: the workload (and its Kronecker union,
computed once), the privacy definition, the random starts, the random generator and the
progress callback. :data:`REGISTRY` holds the built-in optimizers in the order ``optimize``
runs them (that order fixes which random numbers each one draws, so it is part of the results
for a given seed; ``identity`` and ``residual`` draw none):

``identity``
    The identity strategy, the reference every optimizer should beat.
``residual``
    The optimal residual strategy (:mod:`.marginals`); applies under Gaussian noise. Closed
    form and deterministic (it draws no random numbers), so it runs early: on a workload in the
    marginals algebra it reaches the SVD bound, and ``optimize`` stops there.
``opt_kron``
    OPT_(x), one Kronecker strategy (:mod:`.kron`).
``opt_marginals``
    OPT_M, weighted marginals (:mod:`.marginals`). Skipped by default beyond
    ``MARGINALS_MAX_CANDIDATES`` candidate marginals.
``opt_union``
    OPT_+, one Kronecker strategy per group of terms (:mod:`.union`); applies to workloads of
    several Kronecker terms. Skipped by default beyond ``UNION_MAX_SOLVES`` groups x attributes.

An optimizer may also say why it should not run on a problem by default (``skip``): its cost
estimate is out of proportion (OPT_M over hundreds of thousands of candidate marginals, OPT_+
over as many groups). ``optimize`` reports the reason instead of running it for minutes.

Strategies are compared at unit noise (``privacy.unit_noise()``): under any privacy level of one
noise kind every error is the same multiple of its unit-noise error, so the ranking does not
depend on the level. A problem also evaluates each strategy's exact error under its own privacy
once (:meth:`Problem.expected_error`), so ``optimize`` reports and returns that result without
computing it again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from ..error import ErrorResult, exact_route, expected_error
from ..kron_union import KronUnion, kron_union
from ..matrix import Identity, Matrix
from ..privacy import Privacy
from .kron import opt_kron_union
from .marginals import marginal_candidate_count, opt_marginals_strategy, residual_strategy
from .union import default_groups, opt_union_groups

__all__ = ["Candidate", "Problem", "Optimizer", "REGISTRY", "register", "UNION_EXACT_MAX_N",
           "MARGINALS_MAX_CANDIDATES", "UNION_MAX_SOLVES"]

#: OPT_+'s strategy has no closed-form error in general; it is computed exactly through a dense
#: pseudo-inverse up to this many cells and OPT_+'s upper bound is used beyond.
UNION_EXACT_MAX_N = 1024

#: OPT_M is skipped by default beyond this many candidate marginals (its time grows about
#: linearly in them: 8 s for the 4,527 of all <= 3-way marginals of 30 attributes, so minutes
#: for the 166,752 of 100 attributes).
MARGINALS_MAX_CANDIDATES = 10_000

#: OPT_+ runs one OPT_(x) per group; it is skipped by default when groups x attributes (the
#: one-attribute solves of one round over all groups) exceed this.
UNION_MAX_SOLVES = 20_000


@dataclass(frozen=True)
class Candidate:
    """What an optimizer returns.

    Attributes
    ----------
    strategy : Matrix
        The strategy, at sensitivity 1 in the norm of the problem's privacy.
    unit_error : float
        Its expected total squared error on the workload at unit noise variance (the error under
        ``privacy.unit_noise()``); an upper bound when ``exact`` is false.
    exact : bool
        Whether ``unit_error`` is the exact error rather than an upper bound.
    """

    strategy: Matrix
    unit_error: float
    exact: bool


@dataclass(frozen=True, eq=False)
class Problem:
    """One optimization problem: what every optimizer in the registry reads.

    Parameters
    ----------
    workload : Matrix
        The workload.
    privacy : Privacy
        The privacy definition: its kind of noise decides the optimizers' norm, and errors are
        evaluated under it.
    restarts : int or None
        Random starts per optimizer (``None``: each optimizer's default).
    rng : numpy.random.Generator
        Shared by the optimizers in turn.
    progress : callable or None
        Receives status lines (e.g. OPT_(x)'s rounds).
    """

    workload: Matrix
    privacy: Privacy
    restarts: int | None = None
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    progress: Callable[[str], None] | None = None
    _errors: dict = field(default_factory=dict, init=False, repr=False)

    @cached_property
    def union(self) -> KronUnion:
        """The workload as a union of Kronecker products (computed once)."""
        return kron_union(self.workload)

    @cached_property
    def unit_variance(self) -> float:
        """The noise variance of ``privacy`` at sensitivity 1: the error under it per unit-noise error."""
        return self.privacy.noise_variance(1.0)

    def expected_error(self, A: Matrix) -> ErrorResult:
        """``hdmm.error.expected_error(workload, A, privacy)``, computed once per strategy."""
        key = id(A)
        if key not in self._errors:
            self._errors[key] = (A, expected_error(self.workload, A, self.privacy))
        return self._errors[key][1]

    def candidate(self, A: Matrix) -> Candidate:
        """``A`` with its exact unit-noise error (from :meth:`expected_error`)."""
        return Candidate(A, float(self.expected_error(A)) / self.unit_variance, True)

    def total_error(self, candidate: Candidate) -> float:
        """The candidate's expected total squared error under ``privacy`` (an upper bound when not exact)."""
        if candidate.exact:
            return float(self.expected_error(candidate.strategy))
        return self.unit_variance * candidate.unit_error

    def error_result(self, candidate: Candidate) -> ErrorResult:
        """:meth:`total_error` as an :class:`~hdmm.error.ErrorResult`: :meth:`expected_error` itself when exact."""
        if candidate.exact:
            return self.expected_error(candidate.strategy)
        return ErrorResult(self.total_error(candidate), measure="total squared error", privacy=self.privacy,
                           queries=self.workload.shape[0])


@dataclass(frozen=True)
class Optimizer:
    """A registered optimizer.

    Attributes
    ----------
    name : str
        The name ``optimize(..., optimizers=[...])`` and its report use.
    run : callable
        ``run(problem) -> Candidate``.
    applies : callable
        ``applies(problem) -> bool``: whether the optimizer can run on the problem.
    summary : str
        One line for people.
    skip : callable
        ``skip(problem) -> str | None``: why the optimizer should not run on the problem by
        default (its cost would explode), or ``None``. ``optimize`` runs it anyway when it is
        named in ``optimizers=`` or with ``exhaustive=True``.
    """

    name: str
    run: Callable[[Problem], Candidate]
    applies: Callable[[Problem], bool] = field(default=lambda problem: True)
    summary: str = ""
    skip: Callable[[Problem], str | None] = field(default=lambda problem: None)


#: The optimizers :func:`~hdmm.optimizers.optimize` knows, by name, in the order it runs them.
REGISTRY: dict[str, Optimizer] = {}


def register(optimizer: Optimizer) -> Optimizer:
    """Add ``optimizer`` to :data:`REGISTRY` (after those already there); returns it."""
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"register takes an Optimizer, got {type(optimizer).__name__}")
    if optimizer.name in REGISTRY:
        raise ValueError(f"an optimizer named {optimizer.name!r} is registered already")
    REGISTRY[optimizer.name] = optimizer
    return optimizer


def union_candidate(problem: Problem, A: Matrix, bound: float) -> Candidate:
    """OPT_+'s strategy ``A`` with its error: exact where a closed form applies or the domain has at most
    ``UNION_EXACT_MAX_N`` cells, else its upper ``bound`` (at unit noise, from :func:`.union.opt_union_groups`)."""
    W = problem.workload
    if W.shape[1] <= UNION_EXACT_MAX_N or exact_route(W, A) != "dense":
        return problem.candidate(A)
    return Candidate(A, bound, False)


def _identity(problem: Problem) -> Candidate:
    return problem.candidate(Identity(problem.workload.shape[1]))


def _opt_kron(problem: Problem) -> Candidate:
    A, _ = opt_kron_union(problem.union, problem.privacy, None, problem.restarts, problem.rng,
                          progress=problem.progress)
    return problem.candidate(A)


def _opt_marginals(problem: Problem) -> Candidate:
    A, _ = opt_marginals_strategy(problem.workload, problem.privacy, problem.restarts, problem.rng, problem.union)
    return problem.candidate(A)


def _opt_union(problem: Problem) -> Candidate:
    groups = default_groups(problem.workload, problem.union)
    A, bound = opt_union_groups(problem.union, groups, problem.privacy, None, problem.restarts, problem.rng,
                                problem.progress)
    return union_candidate(problem, A, bound)


def _residual(problem: Problem) -> Candidate:
    A, _ = residual_strategy(problem.workload, problem.union)
    return problem.candidate(A)


def _marginals_skip(problem: Problem) -> str | None:
    """Why OPT_M should not run by default: more than ``MARGINALS_MAX_CANDIDATES`` candidates."""
    try:
        count = marginal_candidate_count(problem.union)
    except ValueError as error:  # the workload's subsets cannot even be enumerated
        return f"skipped: {error}"
    if count > MARGINALS_MAX_CANDIDATES:
        return (f"skipped: OPT_M over {count:,} candidate marginals would take minutes (limit "
                f"{MARGINALS_MAX_CANDIDATES:,}; name it in optimizers= to run it)")
    return None


def _union_skip(problem: Problem) -> str | None:
    """Why OPT_+ should not run by default: its groups times attributes exceed ``UNION_MAX_SOLVES``."""
    groups = len(default_groups(problem.workload, problem.union))
    solves = groups * problem.union.dim
    if solves > UNION_MAX_SOLVES:
        return (f"skipped: OPT_+ over {groups:,} groups of {problem.union.dim} attributes ({solves:,} one-attribute "
                f"solves a round, limit {UNION_MAX_SOLVES:,}) would take minutes; name it in optimizers= to run it")
    return None


register(Optimizer("identity", _identity, summary="the identity strategy (reference)"))
register(Optimizer("residual", _residual, applies=lambda problem: problem.privacy.noise == "gaussian",
                   summary="the optimal residual strategy (Gaussian noise)"))
register(Optimizer("opt_kron", _opt_kron, summary="OPT_(x): one Kronecker strategy"))
register(Optimizer("opt_marginals", _opt_marginals, summary="OPT_M: weighted marginals", skip=_marginals_skip))
register(Optimizer("opt_union", _opt_union, applies=lambda problem: problem.union.num_terms > 1,
                   summary="OPT_+: one Kronecker strategy per group of terms (several Kronecker terms)",
                   skip=_union_skip))
