"""The public optimizers and :func:`optimize`, which runs every registered optimizer that applies and keeps the best.

Every optimizer takes the workload, the privacy definition (:class:`~hdmm.privacy.PureDP`,
:class:`~hdmm.privacy.ApproxDP` or :class:`~hdmm.privacy.ZCDP`) and ``seed=`` (for reproducible
research; without a seed the random starts come from fresh OS entropy), and returns an implicit
strategy matrix normalised to sensitivity 1 in the norm of the privacy's noise (L1 for Laplace,
L2 for Gaussian) that supports the workload. Only the kind of noise matters: the strategy does
not depend on :math:`\\epsilon`, :math:`\\delta` or :math:`\\rho`. Without a privacy definition
the optimizers plan for Laplace noise (``opt_residual``: Gaussian noise), as before.

``noise="laplace" | "gaussian"`` (or that string as the second argument) is a deprecated alias
for ``hdmm.PureDP(...)`` / a Gaussian privacy definition; it warns with a
:class:`DeprecationWarning` and will be removed.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..bound import SVDBound, svd_bound
from ..error import ErrorResult
from ..kron_union import kron_union
from ..marginals import subset_keys
from ..matrix import Matrix
from ..distributions import GAUSSIAN, LAPLACE, Noise, noise_named
from ..privacy import ZCDP, Privacy, PureDP
from .kron import opt_kron_union
from .marginals import opt_marginals_strategy, residual_strategy
from .max_variance import MaxVarianceProblem, max_variance_residual
from .max_variance_bases import max_variance_bases
from .residual_bases import SOLVE_MAX_N, residual_bases_applies, residual_bases_solve_size
from .reweight import reweighted_max_variance
from .registry import BOUND_EXACT_LIMIT, REGISTRY, Abandoned, Problem, union_candidate
from .union import check_groups, default_groups, opt_union_groups
from ..threads import one_blas_thread

__all__ = ["opt0", "opt_kron", "opt_union", "opt_marginals", "opt_residual", "optimize", "OptimizationResult"]

#: A candidate whose exact error is within this relative tolerance of an exact SVD lower bound is
#: optimal up to rounding (the two are computed by different formulas).
OPTIMAL_RTOL = 1e-8

#: ``optimize``'s SVD bound makes dense eigensolves of at most this much work in all (the sum of
#: their sizes cubed: about a second at one BLAS thread) and bounds the blocks left from below,
#: so the bound is never the slow step, whatever the workload (docs/math.md, section 5.6).
BOUND_WORK_LIMIT = 1e10

#: The privacy definition a deprecated ``noise`` string stands for, per distribution: its unit noise
#: (the level does not matter), and the replacement the deprecation warning names.
_NOISE: dict[Noise, tuple[Privacy, str]] = {
    LAPLACE: (PureDP(1.0).unit_noise(), "hdmm.PureDP(1.0)"),
    GAUSSIAN: (ZCDP(0.5).unit_noise(), "hdmm.ZCDP(0.5) or hdmm.ApproxDP(1.0, 1e-6)"),
}


def _privacy(caller: str, privacy: Privacy | str | None, noise: str | None, default: Noise = LAPLACE) -> Privacy:
    """The privacy definition an optimizer plans for, from its ``privacy`` and deprecated ``noise`` arguments."""
    if isinstance(privacy, str):  # the old positional noise argument
        if noise is not None:
            raise TypeError(f"{caller} got the noise twice ({privacy!r} and noise={noise!r}); pass the privacy "
                            "definition only")
        privacy, noise = None, privacy
    if noise is not None:
        if privacy is not None:
            raise TypeError(f"{caller} takes privacy or the deprecated noise={noise!r}, not both; pass the privacy "
                            "definition only")
        try:
            unit, example = _NOISE[noise_named(noise)]  # the one place the alias is read
        except (ValueError, KeyError):
            raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}; better, pass the privacy "
                             f"definition, e.g. {caller}(W, hdmm.PureDP(1.0))") from None
        warnings.warn(f"{caller}(W, noise={noise!r}) is deprecated: pass the privacy definition instead, e.g. "
                      f"{caller}(W, {example})", DeprecationWarning, stacklevel=3)
        return unit
    if privacy is None:
        return _NOISE[default][0]
    if not isinstance(privacy, Privacy):
        raise TypeError(f"{caller}'s second argument is the privacy definition (hdmm.PureDP, hdmm.ApproxDP or "
                        f"hdmm.ZCDP), got {type(privacy).__name__}; pass other settings by keyword")
    return privacy


def _rng(seed) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _check(W: Matrix, p: int | None = None, restarts: int | None = None) -> None:
    """Validate the arguments every optimizer shares: the workload, ``p`` and ``restarts``."""
    if not isinstance(W, Matrix):
        raise TypeError(f"the workload must be an hdmm matrix, got {type(W).__name__}")
    if not W.sensitivity(2) > 0:
        raise ValueError("the workload is zero (no query has a nonzero coefficient): every strategy answers it "
                         "with no error, so there is nothing to optimize")
    for name, value, least in (("p", p, 0), ("restarts", restarts, 1)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def opt0(W: Matrix, privacy: Privacy | None = None, p: int | None = None, restarts: int = 1, seed=None,
         progress: Callable[[str], None] | None = None, *, noise: str | None = None) -> Matrix:
    """OPT_0: the best strategy for a one-attribute (or small explicit) workload.

    Laplace noise (:class:`~hdmm.privacy.PureDP`, the default): a p-Identity strategy with ``p``
    extra queries (default ``n/8`` up to 64, 128 beyond 1024 values;
    :func:`~hdmm.optimizers.pidentity.default_p`), by projected L-BFGS from a dyadic hierarchy;
    ``restarts > 1`` adds a block-partition start and random starts
    (:func:`~hdmm.optimizers.pidentity.optimize_pidentity`). Gaussian noise
    (:class:`~hdmm.privacy.ApproxDP`, :class:`~hdmm.privacy.ZCDP`): the global optimum of the
    convex program (:func:`hdmm.optimizers.convex.solve_convex`) up to 2048 values; beyond, the
    square-root strategy (:class:`~hdmm.optimizers.root.SquareRootStrategy`, close to the SVD
    bound on range workloads) when the Gram has a closed-form spectrum (prefixes, all ranges) or
    up to 4096 values, else the square-root strategy of the Gram's pinching in a sine basis
    (:meth:`~hdmm.optimizers.root.SquareRootStrategy.in_sine_basis`), compared with p-Identity
    with L2-normalised columns. Beyond 2048 values, a local workload (its Gram folded onto
    blocks is sparse) is also measured in blocks of at most 2048 values
    (:mod:`hdmm.block_diagonal`), in place of a whole-domain p-Identity
    (:func:`~hdmm.optimizers.kron.factor_candidates`). The best candidate by exact error is
    returned, the identity itself when nothing beats it. Multi-attribute workloads are treated
    as one attribute over the whole domain; use :func:`opt_kron` for them. ``p`` and
    ``restarts`` shape the p-Identity searches only (so under Gaussian noise they matter only
    where p-Identity is a candidate). ``progress`` (e.g. ``print``) receives a line per Newton
    step of the convex program. ``noise`` is the deprecated alias (module docstring).
    """
    privacy = _privacy("opt0", privacy, noise)
    _check(W, p, restarts)
    union = kron_union(W)
    if union.dim != 1:
        union = union.align((W.shape[1],))
    A, _ = opt_kron_union(union, privacy, p, restarts, _rng(seed), max_rounds=1, progress=progress)
    return A.factors[0]


def opt_kron(W: Matrix, privacy: Privacy | None = None, p: int | None = None, restarts: int | None = None,
             seed=None, progress: Callable[[str], None] | None = None, *, noise: str | None = None) -> Matrix:
    """OPT_(x): one Kronecker strategy for a union of Kronecker workloads (see :mod:`.kron`).

    ``privacy``: the privacy definition planned for (default: Laplace noise). ``restarts``:
    p-Identity starts per attribute in the first round (default
    :func:`~hdmm.optimizers.pidentity.default_restarts`: 8 up to 512 values, 3 beyond).
    ``noise`` is the deprecated alias (module docstring).
    """
    privacy = _privacy("opt_kron", privacy, noise)
    _check(W, p, restarts)
    A, _ = opt_kron_union(kron_union(W), privacy, p, restarts, _rng(seed), progress=progress)
    return A


def opt_union(W: Matrix, privacy: Privacy | None = None, groups: Sequence[Sequence[int]] | None = None,
              p: int | None = None, restarts: int | None = None, seed=None,
              progress: Callable[[str], None] | None = None, *, noise: str | None = None) -> Matrix:
    """OPT_+: a union of Kronecker strategies, one per group of workload terms (see :mod:`.union`).

    ``privacy``: the privacy definition planned for (default: Laplace noise). ``groups`` lists
    term indices of ``hdmm.kron_union.kron_union(W)``, each term in exactly one group. By default: one group per
    top-level block of a union (e.g. per Census table), else one per Kronecker term; but as
    separate groups cannot share measurements (on marginal workloads one group per marginal is
    often several times worse than the identity), the OPT_(x) strategy of all terms together is
    returned instead when its error is smaller (OPT_+'s exact error where an exact route applies,
    :func:`hdmm.error.exact_route`, or the domain is small, else its upper bound; see
    :data:`~hdmm.optimizers.registry.UNION_EXACT_MAX_N`), both at unit noise.
    ``noise`` is the deprecated alias (module docstring).
    """
    privacy = _privacy("opt_union", privacy, noise)
    _check(W, p, restarts)
    union = kron_union(W)
    rng = _rng(seed)
    if groups is not None:
        return opt_union_groups(union, check_groups(groups, union.num_terms), privacy, p, restarts, rng, progress)[0]
    groups = default_groups(W, union)
    A, bound = opt_union_groups(union, groups, privacy, p, restarts, rng, progress)
    if len(groups) == 1:
        return A
    K, value = opt_kron_union(union, privacy, p, restarts, rng, progress=progress)
    unit = Problem(W, privacy.unit_noise())
    return K if value < unit.total_error(union_candidate(unit, A, bound)) else A


def opt_marginals(W: Matrix, privacy: Privacy | None = None, restarts: int | None = None, seed=None, *,
                  noise: str | None = None) -> Matrix:
    """OPT_M: weighted marginals (see :mod:`.marginals`); any union of Kronecker workloads.

    ``privacy``: the privacy definition planned for (default: Laplace noise). ``noise`` is the
    deprecated alias (module docstring).
    """
    privacy = _privacy("opt_marginals", privacy, noise)
    _check(W, restarts=restarts)
    A, _ = opt_marginals_strategy(W, privacy, restarts, _rng(seed))
    return A


def opt_residual(W: Matrix, privacy: Privacy | None = None, seed=None, *, noise: str | None = None) -> Matrix:
    """The optimal residual strategy for Gaussian noise (closed form; the SVD bound on marginals).

    ``privacy`` must be Gaussian (:class:`~hdmm.privacy.ApproxDP` or :class:`~hdmm.privacy.ZCDP`;
    the default). Deterministic: there are no random starts, and ``seed`` is accepted only so
    that every optimizer takes the same keywords. Residual strategies are calibrated to L2
    sensitivity; under Laplace noise use :func:`opt_marginals` or :func:`opt_kron`. ``noise`` is
    the deprecated alias (module docstring).
    """
    privacy = _privacy("opt_residual", privacy, noise, default=GAUSSIAN)
    _check(W)
    if not privacy.noise.l2:  # the residual strategy minimises the L2 objective
        raise ValueError(f"residual strategies are optimal for Gaussian noise only; under {privacy.noise.title} noise "
                         "use opt_marginals or opt_kron")
    return residual_strategy(W)[0]


@dataclass(frozen=True)
class OptimizationResult:
    """The outcome of :func:`optimize`.

    Attributes
    ----------
    strategy : Matrix
        The best strategy found.
    optimizer : str
        Which optimizer produced it.
    error : ErrorResult
        Its expected total squared error under ``privacy``: ``hdmm.error.expected_error(W,
        strategy, privacy)`` as computed during the search (OPT_+'s upper bound instead when that
        error is not exact on a large domain; see ``report``).
    privacy : Privacy
    bound : SVDBound
        The SVD lower bound for the workload, under ``privacy``.
    report : pandas.DataFrame
        One row per candidate: total squared error, whether it is exact, seconds, RMSE,
        ``RMSE / SVD bound RMSE`` (a ratio of RMSEs, at least 1) and a note: ``"optimal"`` for a
        strategy certified optimal, ``"skipped: ..."`` with the reason for an optimizer that did
        not run (its error and RMSE are then NaN).
    optimal : bool
        Whether the strategy is certified optimal: its exact error equals the exact SVD lower
        bound (to a relative ``OPTIMAL_RTOL``), so no strategy of any kind does better.
    objective : str
        ``"total"`` (total squared error) or ``"max_variance"`` (the largest per-query variance).
    max_variance : float or None
        Under ``objective="max_variance"``: the strategy's largest per-query variance under
        ``privacy`` (``error`` is still its total squared error).
    """

    strategy: Matrix
    optimizer: str
    error: ErrorResult
    privacy: Privacy
    bound: SVDBound
    report: pd.DataFrame = field(repr=False)
    optimal: bool = False
    objective: str = "total"
    max_variance: float | None = None

    @property
    def rmse(self) -> float:
        return float(np.sqrt(self.error / self.error.queries))


@one_blas_thread
def optimize(W: Matrix, privacy: Privacy, *, restarts: int | None = None, seed=None,
             optimizers: Sequence[str] | None = None, progress: bool | Callable[[str], None] = False,
             exhaustive: bool = False, objective: str = "total",
             time_limit: float | None = None) -> OptimizationResult:
    """Run every registered optimizer that applies to ``W`` under ``privacy`` and keep the best strategy.

    The candidates (:data:`~hdmm.optimizers.registry.REGISTRY`, in this order): ``identity``
    (reference), ``residual`` (Gaussian noise only), ``residual_bases`` (Gaussian noise, a basis
    per attribute, outside the marginals algebra), ``opt_kron`` (OPT_(x)), ``opt_marginals``
    (OPT_M) and ``opt_union`` (OPT_+, when the workload has several Kronecker terms; its exact
    error where an exact route applies (a closed form, or factor Grams that diagonalise together,
    :mod:`hdmm.union_gram`) or up to :data:`~hdmm.optimizers.registry.UNION_EXACT_MAX_N` cells,
    else the upper bound of :mod:`.union`, marked ``exact=False`` in the report). Each
    candidate's error is computed once, under ``privacy``; the best one's is the result's
    ``error``. ``optimizers`` names a subset of them (one name or a list). ``restarts``: random
    starts per optimizer; by default p-Identity makes 8 per attribute of up to 512 values and 3
    beyond in OPT_(x) (:func:`~hdmm.optimizers.pidentity.default_restarts`), 3 in each OPT_+
    group (:data:`~hdmm.optimizers.union.GROUP_RESTARTS`), and OPT_M 3, or 128 on cheap problems
    (:mod:`.marginals`). Deterministic given ``seed``. ``progress=True`` shows a progress bar
    over the candidates (with each optimizer's own steps, such as OPT_(x)'s rounds, as its
    status); a callable receives those status lines instead.

    The SVD bound (:func:`hdmm.bound.svd_bound`) is computed first, without estimates: eigenvalue
    blocks beyond :data:`~hdmm.optimizers.registry.BOUND_EXACT_LIMIT` columns, and all blocks once
    the dense eigensolves reach :data:`BOUND_WORK_LIMIT`, are bounded from below instead, so
    ``result.bound`` is exact or a certain, weaker lower bound (``svd_bound`` itself estimates
    them). **Certified early exit**: when a candidate's exact error equals the
    bound (to a relative ``OPTIMAL_RTOL``), no strategy can do better: ``optimize`` stops, marks
    it ``"optimal"`` in the report (and ``result.optimal``) and lists the optimizers left as
    skipped. **Certified skips**: an optimizer that states a lower bound on the error it can be
    judged by (:attr:`~hdmm.optimizers.registry.Optimizer.lower_bound`: OPT_M) is skipped when a
    candidate found already has no more error, with both figures in the report. An optimizer whose cost would explode on this workload (OPT_M over too many
    candidate marginals, OPT_+ over too many groups, ``residual_bases`` on an attribute too large
    to solve; :attr:`~hdmm.optimizers.registry.Optimizer.skip`) is skipped by default with the reason in
    the report. Naming an optimizer in ``optimizers`` runs it despite both kinds of skip;
    ``exhaustive=True`` runs every chosen optimizer regardless. An optimizer may also abandon its
    own run once it can no longer win (OPT_+ on large domains, group by group;
    :class:`~hdmm.optimizers.registry.Abandoned`); the report says so, with the figures.

    ``time_limit`` (seconds): no optimizer starts once it has passed, and OPT_(x) starts no new
    round after it; the best strategy found by then is returned, the rest are reported as
    skipped. The identity always runs, so there is a result; an optimizer that has started
    finishes its current step, so the limit can be overrun by one step. ``None`` (the default):
    no limit.

    ``objective="max_variance"`` minimizes the largest per-query variance instead of the total
    (agencies publish per-table accuracy). Union weights scale the terms' variances, so they set
    per-table targets. Under Gaussian noise, for workloads whose queries within each Kronecker term
    share their variance (marginals, identities, totals): the best residual strategy, from a small
    convex program with a certified duality gap (:mod:`.max_variance`); the report compares it with
    the total-error residual strategy. Under Gaussian noise, for other unions whose factors on each
    attribute are one query matrix or totals (prefix and range marginals): the residual strategy
    with the total-error optimal per-attribute bases and the noise allocation minimising the largest
    variance, certified (duality gap in the report) over the allocation *with those bases fixed*,
    not over other bases or strategies (:mod:`.max_variance_bases`); ``exhaustive=True`` also runs
    the reweighting below (without ``residual_bases``, which cannot beat the program) and keeps the
    lower. Otherwise (Laplace noise, an attribute with several
    query matrices, any union of Kronecker products of at most
    :data:`~hdmm.optimizers.reweight.MAX_QUERIES` queries), uncertified: the
    total-error optimizers (identity, residual, residual_bases, OPT_(x), OPT_M) on the workload with
    its terms reweighted round by round towards the terms of largest variance (:mod:`.reweight`); the
    report has one row per round, the first being the total-error optimum. ``result.max_variance``
    is the strategy's largest variance, and ``result.bound`` the SVD bound, which divided by the
    number of queries bounds every strategy's mean, hence largest, variance (the report's last
    ratio column). ``seed``, ``restarts``, ``progress`` and ``time_limit`` (no round starts after it)
    apply to the reweighted search.
    """
    _check(W, restarts=restarts)
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    if time_limit is not None and (isinstance(time_limit, bool) or not isinstance(time_limit, (int, float))
                                   or not time_limit > 0 or not np.isfinite(time_limit)):
        raise ValueError(f"time_limit must be a positive number of seconds (or None for no limit), got {time_limit!r}")
    started = time.perf_counter()
    deadline = None if time_limit is None else started + float(time_limit)
    if objective == "max_variance":
        if optimizers is not None:
            raise ValueError("objective='max_variance' chooses its own optimizers; optimizers= does not apply")
        say = (lambda line: tqdm.write(line)) if progress is True else (progress or None)
        return _optimize_max_variance(W, privacy, restarts, seed, say, deadline, exhaustive)
    if objective != "total":
        raise ValueError(f"objective must be 'total' or 'max_variance', got {objective!r}")
    bar = None
    say = (lambda line: bar.set_postfix_str(line)) if progress is True else (progress or None)
    problem = Problem(W, privacy, restarts, _rng(seed), say, deadline, abandon=not exhaustive and optimizers is None)
    available = [name for name, optimizer in REGISTRY.items() if optimizer.applies(problem)]
    if isinstance(optimizers, str):
        optimizers = [optimizers]
    if optimizers is not None and len(optimizers) == 0:
        raise ValueError(f"optimizers is empty: name at least one of {available}, or pass None for all")
    chosen = available if optimizers is None else [o for o in optimizers if o in available]
    unknown = [] if optimizers is None else [o for o in optimizers if o not in available]
    if unknown:
        raise ValueError(f"optimizers {unknown} do not apply here; available: {available}")
    bound = _optimize_bound(W, privacy)
    bar = tqdm(chosen, desc="optimize", unit="optimizer", disable=progress is not True)
    rows, best, best_error, optimal = [], None, None, None
    for name in bar:
        bar.set_description(f"optimize: {name}")
        note = f"skipped: {optimal} is optimal (its error equals the SVD lower bound)" if optimal else None
        if note is None and best is not None and deadline is not None and time.perf_counter() >= deadline:
            note = f"skipped: the time limit of {time_limit:g} s was reached"
        if note is None and not exhaustive and optimizers is None:
            note = REGISTRY[name].skip(problem)
        if note is None and not exhaustive and optimizers is None and best is not None:
            floor = REGISTRY[name].lower_bound(problem)
            if floor is not None and best_error <= floor * problem.unit_variance * (1.0 + OPTIMAL_RTOL):
                note = (f"skipped: cannot beat {best[0]} (total squared error {best_error:.6g}): its error is at "
                        f"least {floor * problem.unit_variance:.6g} here")
        if note is not None:
            rows.append({"optimizer": name, "total squared error": np.nan, "exact": False, "seconds": 0.0,
                         "note": note})
            if say:
                say(f"{name}: {note}")
            continue
        start = time.perf_counter()
        try:
            candidate = REGISTRY[name].run(problem)
        except Abandoned as stop:
            rows.append({"optimizer": name, "total squared error": np.nan, "exact": False,
                         "seconds": time.perf_counter() - start, "note": str(stop)})
            if say:
                say(f"{name}: {stop}")
            continue
        error = problem.total_error(candidate)
        seconds = time.perf_counter() - start
        certified = candidate.exact and bound.certain and error <= bound.value * (1.0 + OPTIMAL_RTOL)
        rows.append({"optimizer": name, "total squared error": error, "exact": candidate.exact, "seconds": seconds,
                     "note": "optimal" if certified else ""})
        if say:
            say(f"{name}: total squared error {error:.6g} ({seconds:.2f} s)" + (", optimal" if certified else ""))
        if best is None or error < best_error:
            best, best_error = (name, candidate), error
        if certified and not exhaustive:
            optimal = name
    if best is None:
        raise ValueError("every optimizer chosen was skipped: " + "; ".join(f"{r['optimizer']} {r['note']}" for r in rows))
    report = pd.DataFrame(rows)
    report["rmse"] = np.sqrt(report["total squared error"] / W.shape[0])
    report["RMSE / SVD bound RMSE"] = report["rmse"] / bound.rmse if bound.rmse > 0 else np.inf
    report = report[["optimizer", "total squared error", "exact", "seconds", "rmse", "RMSE / SVD bound RMSE", "note"]]
    name, candidate = best
    is_optimal = bool(report.loc[report["optimizer"] == name, "note"].iloc[0] == "optimal")
    return OptimizationResult(candidate.strategy, name, problem.error_result(candidate), privacy, bound, report,
                              is_optimal)


def _optimize_max_variance(W: Matrix, privacy: Privacy, restarts: int | None = None, seed=None,
                           progress: Callable[[str], None] | None = None,
                           deadline: float | None = None, exhaustive: bool = False) -> OptimizationResult:
    """``optimize(..., objective="max_variance")``: the exact residual programs where they apply, else reweighting
    (``exhaustive``: the reweighting too after the residual-bases program, keeping the lower)."""
    problem = Problem(W, privacy)
    if privacy.noise.l2:
        try:
            exact = MaxVarianceProblem(problem.union)
        except ValueError:
            pass
        else:
            return _max_variance_residual(W, privacy, problem, exact)
        if residual_bases_applies(problem.union) and residual_bases_solve_size(problem.union) <= SOLVE_MAX_N:
            bound = _optimize_bound(W, privacy)
            try:
                certified = _max_variance_residual_bases(W, privacy, problem, bound)
            except ValueError as why:  # a program too large, or a basis that misses some query
                if progress:
                    progress(f"max_variance_bases: {why}; reweighting instead")
                return _max_variance_reweighted(W, privacy, problem, restarts, seed, progress, deadline, bound=bound)
            if not exhaustive:
                return certified
            # reweighting residual_bases cannot win: its bases do not depend on the term weights, so every round is
            # an allocation over the bases the certified program already optimised over
            searched = _max_variance_reweighted(W, privacy, problem, restarts, seed, progress, deadline,
                                                exclude=("residual_bases",), bound=bound)
            report = pd.concat([certified.report, searched.report], ignore_index=True)
            best = certified if certified.max_variance <= searched.max_variance else searched
            return dataclasses.replace(best, report=report)
    return _max_variance_reweighted(W, privacy, problem, restarts, seed, progress, deadline)


def _optimize_bound(W: Matrix, privacy: Privacy):
    """The SVD bound as ``optimize`` uses it: certain (no estimates), under ``BOUND_WORK_LIMIT``, and seeded (the
    split's random mix of Grams would otherwise move it in its 9th digit from run to run)."""
    return svd_bound(W, privacy, exact_limit=BOUND_EXACT_LIMIT, estimate=False, work_limit=BOUND_WORK_LIMIT, seed=0)


def _with_rmse_and_bound_ratio(report: pd.DataFrame, W: Matrix, bound) -> pd.DataFrame:
    """``report`` with each row's RMSE and its largest variance over the SVD bound's mean variance."""
    report["rmse"] = np.sqrt(report["total squared error"] / W.shape[0])
    mean_bound = bound.value / W.shape[0]
    report["max variance / SVD mean-variance bound"] = report["max variance"] / mean_bound if mean_bound > 0 else np.inf
    return report


def _max_variance_report(rows: list[dict], W: Matrix, bound) -> pd.DataFrame:
    """The max-variance report's table: ``rows`` with each row's RMSE and its largest variance over the SVD
    bound's mean variance (a lower bound on every strategy's largest variance)."""
    report = _with_rmse_and_bound_ratio(pd.DataFrame(rows), W, bound)
    return report[["optimizer", "max variance", "total squared error", "seconds", "rmse",
                   "max variance / SVD mean-variance bound", "note"]]


def _max_variance_residual_bases(W: Matrix, privacy: Privacy, problem: Problem, bound) -> OptimizationResult:
    """The allocation over the total-error optimal residual bases minimising the largest variance (Gaussian
    noise, one query matrix or totals per attribute), certified over the allocation with the bases fixed;
    ``bound`` is :func:`_optimize_bound`'s."""
    unit = problem.unit_variance
    start = time.perf_counter()
    solution = max_variance_bases(W, problem.union)
    seconds = time.perf_counter() - start
    error = problem.expected_error(solution.strategy)
    rows = [{"optimizer": "residual_bases (total)", "max variance": unit * solution.total_value,
             "total squared error": np.nan, "seconds": np.nan, "note": "the total-error optimum over these bases"},
            {"optimizer": "max_variance_bases", "max variance": unit * solution.value,
             "total squared error": float(error), "seconds": seconds,
             "note": f"certified over the noise allocation with the per-attribute bases fixed (relative duality gap "
                     f"{solution.gap:.1e}); not over other bases"}]
    report = _max_variance_report(rows, W, bound)
    return OptimizationResult(solution.strategy, "max_variance_bases", error, privacy, bound, report, False,
                              "max_variance", unit * solution.value)


def _max_variance_reweighted(W: Matrix, privacy: Privacy, problem: Problem, restarts: int | None, seed,
                             progress: Callable[[str], None] | None, deadline: float | None,
                             exclude: tuple[str, ...] = (), bound=None) -> OptimizationResult:
    """The max-variance objective by reweighting the workload's terms (:mod:`.reweight`), without the
    total-error optimizers named in ``exclude``; ``bound`` is :func:`_optimize_bound`'s if already made."""
    bound = _optimize_bound(W, privacy) if bound is None else bound
    # optimizers whose strategies have per-query variances in closed form, unless their cost would explode
    names = [name for name in ("identity", "residual", "residual_bases", "opt_kron", "opt_marginals")
             if name not in exclude and REGISTRY[name].applies(problem) and REGISTRY[name].skip(problem) is None]
    rng = _rng(seed)

    def total(weighted: Matrix) -> tuple[Matrix, str]:
        result = optimize(weighted, privacy, restarts=restarts, seed=rng, optimizers=names)
        return result.strategy, result.optimizer

    solution = reweighted_max_variance(W, privacy, total, progress=progress, deadline=deadline)
    report = solution.history.rename(columns={"optimizer": "total-error optimizer"})
    best = int(report["max variance"].idxmin())
    report.insert(0, "optimizer", [f"reweighted, round {r}" for r in report["round"]])
    report = _with_rmse_and_bound_ratio(report, W, bound)
    report["note"] = ["the total-error optimum" if i == 0 else "" for i in range(len(report))]
    report.loc[best, "note"] = ((report.loc[best, "note"] + "; " if report.loc[best, "note"] else "")
                                + "best (uncertified: a heuristic search)")
    report = report[["optimizer", "max variance", "total squared error", "seconds", "rmse",
                     "max variance / SVD mean-variance bound", "total-error optimizer", "note"]]
    error = problem.expected_error(solution.strategy)
    return OptimizationResult(solution.strategy, "reweighted", error, privacy, bound, report, False, "max_variance",
                              solution.max_variance)


def _max_variance_residual(W: Matrix, privacy: Privacy, problem: Problem,
                           reference: MaxVarianceProblem) -> OptimizationResult:
    """The best residual strategy for the largest variance (Gaussian noise, equal variances within terms);
    ``reference`` is the workload's :class:`MaxVarianceProblem`."""
    unit = problem.unit_variance
    bound = svd_bound(W, privacy, seed=0)
    rows = []
    start = time.perf_counter()
    total_strategy, _ = residual_strategy(W, problem.union)
    lam = np.asarray(total_strategy.weights) ** 2  # residual weights are sqrt(lambda_T N)
    rows.append({"optimizer": "residual (total)", "max variance": np.nan, "total squared error":
                 float(problem.expected_error(total_strategy)), "seconds": time.perf_counter() - start,
                 "note": "the total-error optimum"})
    rows[-1]["max variance"] = unit * reference.objective(_inverse_levels(reference, total_strategy, lam))
    start = time.perf_counter()
    solution = max_variance_residual(W, problem.union, problem=reference)
    error = problem.expected_error(solution.strategy)
    rows.append({"optimizer": "max_variance", "max variance": unit * solution.value, "total squared error":
                 float(error), "seconds": time.perf_counter() - start,
                 "note": f"optimal among residual strategies (relative duality gap {solution.gap:.1e})"})
    report = _max_variance_report(rows, W, bound)
    return OptimizationResult(solution.strategy, "max_variance", error, privacy, bound, report, False,
                              "max_variance", unit * solution.value)


def _inverse_levels(problem: MaxVarianceProblem, strategy: Matrix, lam: np.ndarray) -> np.ndarray:
    """``x_T = 1 / lambda_T`` of a residual strategy on the problem's subsets (normalised by ``N``)."""
    keys = subset_keys(strategy.members)
    order = np.argsort(keys)
    wanted = problem.spectrum.keys[problem.subsets]
    pos = order[np.searchsorted(keys[order], wanted)]
    N = float(np.prod(np.array(problem.union.sizes, dtype=float)))
    return N / lam[pos]
