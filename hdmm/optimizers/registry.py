r"""The optimizers :func:`~hdmm.optimizers.optimize` compares, behind one small protocol.

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
``residual_bases``
    The optimal residual strategy with a basis per attribute (:mod:`.residual_bases`); applies
    under Gaussian noise to unions of Kronecker products whose factors on each attribute are
    one query matrix (e.g. Prefix on income in every term that has income) or totals, outside
    the marginals algebra. Each attribute's basis solves the one-attribute Gaussian program on
    its query matrix restricted to zero-sum rows (certified by its duality gap), and the noise
    is allocated across attribute subsets in closed form; the per-attribute optima are jointly
    optimal within the family, and its error is exact (the ``"residual"`` structure). When an
    attribute carries two different query matrices the family's optimum does not separate and
    it does not apply (``residual`` still does). Deterministic and fast, it runs before the
    iterative optimizers, so its exact error is the mark OPT_+'s check abandons against. Skipped
    by default when an attribute needing a solve has more than ``SOLVE_MAX_N`` values.
``opt_kron``
    OPT_(x), one Kronecker strategy (:mod:`.kron`).
``opt_marginals``
    OPT_M, weighted marginals (:mod:`.marginals`). Skipped by default beyond
    ``MARGINALS_MAX_CANDIDATES`` candidate marginals.
``opt_union``
    OPT_+, one Kronecker strategy per group of terms (:mod:`.union`); applies to workloads of
    several Kronecker terms. Skipped by default beyond ``UNION_MAX_SOLVES`` groups x attributes,
    and under Laplace noise on workloads of identities and totals, where OPT_M searches a family
    that contains its strategies (:func:`_union_skip`).

An optimizer may also say why it should not run on a problem by default (``skip``): its cost
estimate is out of proportion (OPT_M over hundreds of thousands of candidate marginals, OPT_+
over as many groups). ``optimize`` reports the reason instead of running it for minutes. And it
may state a ``lower_bound``: an error (at unit noise) below which none of its strategies can be
judged, computed without running it. ``optimize`` skips it when a strategy found already has no
more error than that, since it cannot win:

* OPT_M's weighted marginals have Grams in the marginals algebra, where the least error of any
  strategy under L2 sensitivity 1 is the optimal residual strategy's (:mod:`.marginals`); an L1
  sensitivity is at least the L2 one, so that bounds OPT_M under Laplace noise too, and under
  Gaussian noise the residual strategy itself attains it.

An optimizer's run may also stop itself once it cannot win, raising :class:`Abandoned` with
the reason (``optimize`` reports it). OPT_+ is judged by its exact error where an exact route
exists (:func:`hdmm.error.exact_route`; :mod:`hdmm.union_gram` for most of its strategies) and by
its upper bound :math:`(\sum_g e_g^{1/3})^3` (Laplace) or :math:`(\sum_g e_g^{1/2})^2` (Gaussian)
over its groups (:mod:`.union`) otherwise. Its exact error is at least :math:`\sum_g b_g`, the
groups' SVD bounds (the error of a strategy on a union of groups is the sum of its errors on each
group, and no strategy of sensitivity 1 does better on a group than the group's bound), but that
sum is at most the workload's own bound, below every candidate's error: it never rules OPT_+
out, so an exactly judged OPT_+ runs every group; then its exact error, a sum of non-negative terms
over the workload's terms, is summed largest grid first and it is abandoned as soon as the sum so far
exceeds the best error (:func:`_union_exact_check`). Once the strategy of the groups found so far has no
exact route for a reason that adding groups keeps, OPT_+ will be judged by its upper bound, and
since each group's OPT_(x) error :math:`e_g` is at least :math:`b_g`, the bound with the groups
still to come at :math:`b_g` is a floor under it (:func:`_union_check`).

Strategies are compared at unit noise (``privacy.unit_noise()``): under any privacy level of one
noise kind every error is the same multiple of its unit-noise error, so the ranking does not
depend on the level. A problem also evaluates each strategy's exact error under its own privacy
once (:meth:`Problem.expected_error`), so ``optimize`` reports and returns that result without
computing it again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

import numpy as np

from ..bound import factor_nuclear_norm, nuclear_norm
from ..error import ErrorResult, exact_route, expected_error
from ..kron_union import KronUnion, kron_union
from ..marginals import trace_spectrum
from ..matrix import DenseLimitError, Identity, Matrix, VStack
from ..privacy import Privacy
from ..structure import classify, in_marginal_algebra
from ..union_gram import factors_diagonalise, union_totals
from .kron import opt_kron_union
from .marginals import marginal_candidate_count, opt_marginals_strategy, residual_strategy
from .residual_bases import SOLVE_MAX_N, residual_bases_applies, residual_bases_solve_size, residual_bases_strategy
from .union import default_groups, opt_union_groups

__all__ = ["Abandoned", "Candidate", "Problem", "Optimizer", "REGISTRY", "register", "UNION_EXACT_MAX_N",
           "MARGINALS_MAX_CANDIDATES", "UNION_MAX_SOLVES", "BOUND_EXACT_LIMIT"]

#: OPT_+'s strategy has no closed-form error in general; where no exact route applies (its factor
#: Grams do not diagonalise together, :func:`hdmm.error.exact_route`) its error is computed through a
#: dense pseudo-inverse up to this many cells and OPT_+'s upper bound is used beyond.
UNION_EXACT_MAX_N = 1024

#: OPT_M is skipped by default beyond this many candidate marginals (its time grows about
#: linearly in them: 8 s for the 4,527 of all <= 3-way marginals of 30 attributes, so minutes
#: for the 166,752 of 100 attributes).
MARGINALS_MAX_CANDIDATES = 10_000

#: OPT_+ runs one OPT_(x) per group; it is skipped by default when groups x attributes (the
#: one-attribute solves of one round over all groups) exceed this. Where its strategy's error is
#: exact (its factor Grams diagonalise together, as on prefix marginals) no cheap floor stops it
#: early, so it runs every group: on the 0-3-way prefix marginals of 14 attributes, 6,580 solves,
#: that is more than the rest of ``optimize`` together.
UNION_MAX_SOLVES = 2_000

#: Lower bounds computed to decide skips (and ``optimize``'s own SVD bound) solve eigenvalue
#: blocks of up to this many columns exactly and bound larger ones from below, never estimating
#: them: a dense eigensolve of this size takes about a tenth of a second.
BOUND_EXACT_LIMIT = 1024


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
    deadline : float or None
        A ``time.perf_counter()`` value after which iterative optimizers stop at the end of their
        current step (OPT_(x) after its current round) and return what they have.
    abandon : bool
        Whether a run may stop once it can no longer win (:class:`Abandoned`).
    """

    workload: Matrix
    privacy: Privacy
    restarts: int | None = None
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    progress: Callable[[str], None] | None = None
    deadline: float | None = None
    abandon: bool = True
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

    def best_unit_error(self) -> float | None:
        """The least unit-noise error of the strategies evaluated so far (:meth:`expected_error`), or ``None``."""
        if not self._errors:
            return None
        return min(float(error) for _, error in self._errors.values()) / self.unit_variance

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
    lower_bound : callable
        ``lower_bound(problem) -> float | None``: a unit-noise error below which none of the
        optimizer's candidates can be judged (module docstring), or ``None`` when there is none
        to hand. ``optimize`` skips the optimizer by default when it has a candidate already at
        or below it.
    """

    name: str
    run: Callable[[Problem], Candidate]
    applies: Callable[[Problem], bool] = field(default=lambda problem: True)
    summary: str = ""
    skip: Callable[[Problem], str | None] = field(default=lambda problem: None)
    lower_bound: Callable[[Problem], float | None] = field(default=lambda problem: None)


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
    """OPT_+'s strategy ``A`` with its error: exact where an exact route applies (a closed form, or the factor
    Grams diagonalise together, :func:`hdmm.error.exact_route`) or the domain has at most
    ``UNION_EXACT_MAX_N`` cells, else its upper ``bound`` (at unit noise, from :func:`.union.opt_union_groups`)."""
    W = problem.workload
    if W.shape[1] <= UNION_EXACT_MAX_N or exact_route(W, A) != "dense":
        try:
            _union_exact_check(problem, A)
            return problem.candidate(A)
        except DenseLimitError:  # an unsupported term too large to check query by query: the bound judges
            if W.shape[1] <= UNION_EXACT_MAX_N:
                raise
    return Candidate(A, bound, False)


def _union_exact_check(problem: Problem, A: Matrix) -> None:
    """Raise :class:`Abandoned` when OPT_+'s strategy ``A``, judged by its exact error through
    :mod:`hdmm.union_gram`, cannot beat the best candidate so far.

    Its error is a sum over the workload's terms, each non-negative, so once the terms computed
    (largest first, :func:`hdmm.union_gram.union_totals`) add up to more than the best error, the
    whole does too. The terms computed are kept with the strategy, so when it does not stop,
    :meth:`Problem.candidate` completes the sum without computing them again.
    """
    best = problem.best_unit_error()
    if best is None or not problem.abandon:
        return
    structure = classify(A)
    if exact_route(problem.workload, A, structure=structure) != "union":
        return
    unit = problem.unit_variance
    # the noise grows with the sensitivity, so a lower bound on it keeps the partial sum a lower bound
    scale = problem.privacy.noise_variance(_sensitivity_floor(structure.union, problem.privacy.norm)) / unit
    limit = best * (1.0 + 1e-9) / scale
    values, supported = union_totals(problem.workload, structure.union, stop_above=limit)
    done = ~np.isnan(values)
    partial = math.inf if not supported[done].all() else float(np.sum(values[done]))
    if partial > limit:
        raise Abandoned(f"abandoned after its exact error on {int(done.sum())} of {len(values)} workload terms: at "
                        f"least {partial * scale * unit:.6g}, above the best so far ({best * unit:.6g})")


def _sensitivity_floor(union: KronUnion, p: int) -> float:
    r"""A lower bound on the ``L_p`` sensitivity of the union strategy ``union``: its largest column norm among a
    few columns (each term's column of its factors' largest norms).

    Column :math:`x` of :math:`\mathrm{VStack}_j c_j\bigotimes_i F_{ij}` has
    :math:`\|a_x\|_p^p = \sum_j |c_j|^p \prod_i \|F_{ij} e_{x_i}\|_p^p`, from the factors' column norms alone;
    the sensitivity is the largest over all :math:`x`, at least the largest over those tried. On OPT_+'s
    strategies, whose every column has the same norm, it is the sensitivity itself.
    """
    norms = [np.array([np.asarray(f.column_norm_powers(p).to_array(), dtype=float) for f in fs])
             for fs in union.factors]  # per attribute, factors x values
    scaled = np.abs(union.weights) ** p
    cells = {tuple(int(np.argmax(norms[i][k])) for i, k in enumerate(row)) for row in union.index}
    return max(float(scaled @ union.products([v[:, x] for v, x in zip(norms, cell)])) for cell in cells) ** (1.0 / p)


def _identity(problem: Problem) -> Candidate:
    return problem.candidate(Identity(problem.workload.shape[1]))


def _opt_kron(problem: Problem) -> Candidate:
    A, _ = opt_kron_union(problem.union, problem.privacy, None, problem.restarts, problem.rng,
                          progress=problem.progress, deadline=problem.deadline)
    return problem.candidate(A)


def _opt_marginals(problem: Problem) -> Candidate:
    A, _ = opt_marginals_strategy(problem.workload, problem.privacy, problem.restarts, problem.rng, problem.union)
    return problem.candidate(A)


class Abandoned(Exception):
    """Raised by an optimizer's run that stopped because it can no longer win; the message says why."""


def _group_floors(problem: Problem, groups: list[np.ndarray]) -> list[float]:
    """Each group's SVD bound at unit noise: its squared nuclear norm over the cells (exact or from below)."""
    W, union = problem.workload, problem.union
    floors = []
    for terms in groups:
        if terms.size == 1:  # one Kronecker product: its nuclear norm is the product of its factors'
            weight, factors = union.term(int(terms[0]))
            norm = abs(weight) * math.prod(factor_nuclear_norm(f) for f in factors)
        else:
            group = KronUnion(union.factors, union.index[terms], union.weights[terms])
            norm = nuclear_norm(group, exact_limit=BOUND_EXACT_LIMIT, estimate=False).value
        floors.append(norm**2 / W.shape[1])
    return floors


def _union_check(problem: Problem, groups: list[np.ndarray]) -> Callable[[list[Matrix], list[float]], None] | None:
    """A check for OPT_+ after each group: raise :class:`Abandoned` once it cannot beat the best candidate so far.

    Where OPT_+ will be judged by its exact error, nothing cheap rules it out: the groups' SVD
    bounds add up to at most the workload's, which is below every candidate's error, the best
    one's included. Once the factor Grams of the groups so far do not diagonalise together on
    some attribute (:func:`hdmm.union_gram.factors_diagonalise`) and their stack has no
    closed-form error (:func:`hdmm.error.exact_route`), the whole will not have an exact route
    either (the groups share the workload's attribute sizes, a congruence diagonalising every
    Gram diagonalises any of them, and a factor outside the closed forms stays in the stack), so
    the whole is judged by its upper bound: that bound with the groups still to come at their SVD
    bounds is a floor, rising as groups are found.

    The groups' factors are taken in as they come, and an attribute's Grams are diagonalised
    again only when a new distinct factor appears there, and only once the floor would abandon. Up to ``UNION_EXACT_MAX_N`` cells OPT_+ is judged exactly and cheaply: no check
    (``None``), nor for fewer than two groups.
    """
    W, union = problem.workload, problem.union
    # the groups as opt_union_groups measures them: terms of weight zero, and groups of only those, left out
    groups = [terms[union.weights[terms] != 0] for terms in groups]
    groups = [terms for terms in groups if terms.size]
    if not problem.abandon or W.shape[1] <= UNION_EXACT_MAX_N or len(groups) < 2:
        return None
    floors: list[float] = []
    seen: list[dict[Matrix, None]] = [{} for _ in range(union.dim)]  # per attribute, the distinct factors so far
    state = {"taken": 0, "diagonal": True, "exact": True}

    def exact_possible(parts: list[Matrix]) -> bool:
        """Whether the stack of ``parts`` may still have an exact route (False is final)."""
        if not state["exact"]:
            return False
        for part in parts[state["taken"]:]:
            factors = kron_union(part).factors
            if len(factors) != union.dim or any(len(fs) != 1 or fs[0].shape[1] != n
                                                for fs, n in zip(factors, union.sizes)):
                state["exact"] = None  # not one product on the workload's attributes: no claim either way
                return True
            for i, (f,) in enumerate(factors):
                if f not in seen[i]:
                    seen[i][f] = None
                    state["diagonal"] = state["diagonal"] and factors_diagonalise(list(seen[i]))
        state["taken"] = len(parts)
        if state["diagonal"] or exact_route(W, VStack(list(parts))) != "dense":
            return True
        state["exact"] = False
        return False

    def check(parts: list[Matrix], errors: list[float]) -> None:
        best = problem.best_unit_error()
        if best is None:
            return
        if not floors:
            floors.extend(_group_floors(problem, groups))
        e = np.array(list(errors) + floors[len(errors):])
        floor = float(np.sum(np.cbrt(e)) ** 3) if problem.privacy.norm == 1 else float(np.sum(np.sqrt(e)) ** 2)
        if floor < best * (1.0 + 1e-9) or state["exact"] is None or exact_possible(parts):
            return
        unit = problem.unit_variance
        raise Abandoned(f"abandoned after {len(errors)} of {len(groups)} groups: its error bound, which judges it "
                        f"here, is at least {floor * unit:.6g}, above the best so far ({best * unit:.6g})")

    return check


def _opt_union(problem: Problem) -> Candidate:
    groups = default_groups(problem.workload, problem.union)
    A, bound = opt_union_groups(problem.union, groups, problem.privacy, None, problem.restarts, problem.rng,
                                problem.progress, _union_check(problem, groups))
    return union_candidate(problem, A, bound)


def _residual(problem: Problem) -> Candidate:
    A, _ = residual_strategy(problem.workload, problem.union)
    return problem.candidate(A)


def _residual_bases(problem: Problem) -> Candidate:
    A, _, _ = residual_bases_strategy(problem.workload, problem.union)
    return problem.candidate(A)


def _residual_bases_applies(problem: Problem) -> bool:
    """Gaussian noise, a workload outside the marginals algebra (there ``residual`` is optimal) with one
    query matrix or totals per attribute."""
    return (problem.privacy.noise.l2 and not in_marginal_algebra(problem.union)
            and residual_bases_applies(problem.union))


def _residual_bases_skip(problem: Problem) -> str | None:
    """Why ``residual_bases`` should not run by default: a workload of one Kronecker product, or an attribute's
    convex solve beyond ``SOLVE_MAX_N`` values.

    On one product :math:`\bigotimes_i W_i` the family's error separates into a product over the attributes of
    the error of the one-attribute strategy (the basis and a total row, optimally weighted) on :math:`W_i`,
    never below the one-attribute Gaussian optimum that OPT_(x) reaches there (it solves the same program
    without the zero-sum restriction): the family cannot win, and its solves would only cost time.
    """
    if problem.union.num_terms == 1:
        return ("skipped: on one Kronecker product OPT_(x)'s per-attribute optima are at least as good (name it in "
                "optimizers= to run it)")
    n = residual_bases_solve_size(problem.union)
    if n > SOLVE_MAX_N:
        return (f"skipped: the convex solve for an attribute of {n:,} values would take minutes (limit "
                f"{SOLVE_MAX_N:,}; name it in optimizers= to run it)")
    return None


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
    """Why OPT_+ should not run by default: its groups times attributes exceed ``UNION_MAX_SOLVES``, or,
    under Laplace noise on a workload of identities and totals, OPT_M searches all its strategies.

    There every effective Gram is :math:`aI + bJ`, so each group's strategy is a Kronecker product of
    identities, totals and identities with a total row: a stack of weighted marginals. The stack of
    all groups is then one too, with some marginals repeated; merging the repeats (weights
    :math:`\theta_1, \theta_2` into :math:`(\theta_1^2 + \theta_2^2)^{1/2}`) keeps the Gram and lowers
    the L1 sensitivity, so a weighted-marginals strategy does at least as well.
    """
    if (not problem.privacy.noise.l2 and _marginals_skip(problem) is None
            and classify(problem.workload).form == "marginals"):
        return ("skipped: on identities and totals its strategies are weighted marginals, which OPT_M "
                "searches (name it in optimizers= to run it)")
    groups = len(default_groups(problem.workload, problem.union))
    solves = groups * problem.union.dim
    if solves > UNION_MAX_SOLVES:
        return (f"skipped: OPT_+ over {groups:,} groups of {problem.union.dim} attributes ({solves:,} one-attribute "
                f"solves a round, above the default limit of {UNION_MAX_SOLVES:,}); name it in optimizers= to "
                f"run it")
    return None


def _marginals_lower_bound(problem: Problem) -> float:
    """The optimal residual strategy's unit-noise error: no weighted marginals do better (module docstring)."""
    return trace_spectrum(problem.union).residual_error


register(Optimizer("identity", _identity, summary="the identity strategy (reference)"))
register(Optimizer("residual", _residual, applies=lambda problem: problem.privacy.noise.l2,
                   summary="the optimal residual strategy (Gaussian noise)"))
register(Optimizer("residual_bases", _residual_bases, applies=_residual_bases_applies,
                   summary="residual measurements with an optimized basis per attribute (Gaussian noise)",
                   skip=_residual_bases_skip))
register(Optimizer("opt_kron", _opt_kron, summary="OPT_(x): one Kronecker strategy"))
register(Optimizer("opt_marginals", _opt_marginals, summary="OPT_M: weighted marginals", skip=_marginals_skip,
                   lower_bound=_marginals_lower_bound))
register(Optimizer("opt_union", _opt_union, applies=lambda problem: problem.union.num_terms > 1,
                   summary="OPT_+: one Kronecker strategy per group of terms (several Kronecker terms)",
                   skip=_union_skip))
