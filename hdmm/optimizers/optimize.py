"""The public optimizers and ``optimize``, which runs every one that applies and keeps the best.

Every optimizer takes ``noise="laplace" | "gaussian"`` and ``seed=`` (for reproducible
research; without a seed the random starts come from fresh OS entropy) and returns an
implicit strategy matrix normalised to sensitivity 1 in the norm of its noise (L1 for
Laplace, L2 for Gaussian) that supports the workload.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..bound import SVDBound, svd_bound
from ..error import ErrorResult, exact_route, expected_error
from ..matrix import Identity, Matrix
from ..privacy import ZCDP, Privacy, PureDP
from .kron import opt_kron_union
from .marginals import opt_marginals_strategy, residual_strategy
from .union import check_groups, default_groups, opt_union_groups

__all__ = ["opt0", "opt_kron", "opt_union", "opt_marginals", "opt_residual", "optimize", "OptimizationResult"]

_NORMS = {"laplace": 1, "gaussian": 2}

#: OPT_+'s strategy has no closed-form error in general; it is computed exactly through a dense
#: pseudo-inverse up to this many cells (about a second) and OPT_+'s upper bound is used beyond.
UNION_EXACT_MAX_N = 1024

#: A privacy definition per sensitivity norm with unit noise variance, to compare strategies.
_UNIT = {1: PureDP(math.sqrt(2.0)), 2: ZCDP(0.5)}


def _norm(noise: str) -> int:
    if noise not in _NORMS:
        raise ValueError(f"noise must be 'laplace' or 'gaussian', got {noise!r}")
    return _NORMS[noise]


def _union_error(W: Matrix, A: Matrix, bound: float, privacy: Privacy) -> tuple[ErrorResult, bool]:
    """OPT_+'s error under ``privacy`` and whether it is exact: exact where a closed form applies
    or the domain has at most ``UNION_EXACT_MAX_N`` cells, else the upper ``bound`` (at unit noise)."""
    if W.shape[1] <= UNION_EXACT_MAX_N or exact_route(W, A) != "dense":
        return expected_error(W, A, privacy), True
    unit = privacy.noise_variance(1.0)
    return ErrorResult(unit * bound, measure="total squared error", privacy=privacy, queries=W.shape[0]), False


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


def opt0(W: Matrix, p: int | None = None, noise: str = "laplace", restarts: int = 1, seed=None,
         progress: Callable[[str], None] | None = None) -> Matrix:
    """OPT_0: the best strategy for a one-attribute (or small explicit) workload.

    Laplace noise: a p-Identity strategy with ``p`` extra queries (default ``n/8`` up to 64,
    128 beyond 1024 values; :func:`~hdmm.optimizers.pidentity.default_p`), by projected L-BFGS
    from a dyadic hierarchy; ``restarts > 1`` adds a block-partition start and random starts
    (:func:`~hdmm.optimizers.pidentity.optimize_pidentity`). Gaussian noise: the global optimum of
    the convex program (:func:`hdmm.optimizers.convex.solve_convex`) up to 2048 values; beyond,
    the square-root strategy (:class:`~hdmm.optimizers.root.SquareRootStrategy`, within about 2%
    of the SVD bound on range workloads) when the Gram has a closed-form spectrum (prefixes, all
    ranges) or up to 4096 values, else the square-root strategy of the Gram's pinching in a sine
    basis (:meth:`~hdmm.optimizers.root.SquareRootStrategy.in_sine_basis`), compared with
    p-Identity with L2-normalised columns. Beyond 2048
    values, a local workload (its Gram folded onto blocks is sparse) is also measured in blocks
    of at most 2048 values (:mod:`hdmm.block_diagonal`), in place of a whole-domain p-Identity
    (:func:`~hdmm.optimizers.kron.factor_candidates`). The best candidate
    by exact error is returned, the identity itself when nothing beats it.
    Multi-attribute workloads are treated as one attribute over the whole domain; use
    :func:`opt_kron` for them. ``p`` and ``restarts`` shape the p-Identity searches only (so
    under Gaussian noise they matter only where p-Identity is a candidate). ``progress`` (e.g.
    ``print``) receives a line per Newton step of the convex program.
    """
    _check(W, p, restarts)
    union = W.kron_union()
    if union.dim != 1:
        union = union.align((W.shape[1],))
    A, _ = opt_kron_union(union, _norm(noise), p, restarts, _rng(seed), max_rounds=1, progress=progress)
    return A.factors[0]


def opt_kron(W: Matrix, noise: str = "laplace", p: int | None = None, restarts: int | None = None, seed=None,
             progress: Callable[[str], None] | None = None) -> Matrix:
    """OPT_(x): one Kronecker strategy for a union of Kronecker workloads (see :mod:`.kron`).

    ``restarts``: p-Identity starts per attribute in the first round (default
    :func:`~hdmm.optimizers.pidentity.default_restarts`: 8 up to 512 values, 3 beyond).
    """
    _check(W, p, restarts)
    A, _ = opt_kron_union(W.kron_union(), _norm(noise), p, restarts, _rng(seed), progress=progress)
    return A


def opt_union(W: Matrix, noise: str = "laplace", groups: Sequence[Sequence[int]] | None = None,
              p: int | None = None, restarts: int | None = None, seed=None,
              progress: Callable[[str], None] | None = None) -> Matrix:
    """OPT_+: a union of Kronecker strategies, one per group of workload terms (see :mod:`.union`).

    ``groups`` lists term indices of ``W.kron_union()``, each term in exactly one group. By
    default: one group per top-level block of a union (e.g. per Census table), else one per
    Kronecker term; but as separate groups cannot share measurements (on marginal workloads one
    group per marginal is often several times worse than the identity), the OPT_(x) strategy of
    all terms together is returned instead when its error is smaller (OPT_+'s exact error where
    affordable, else its upper bound; see ``UNION_EXACT_MAX_N``).
    """
    _check(W, p, restarts)
    union = W.kron_union()
    norm, rng = _norm(noise), _rng(seed)
    if groups is not None:
        return opt_union_groups(union, check_groups(groups, union.num_terms), norm, p, restarts, rng, progress)[0]
    groups = default_groups(W, union)
    A, bound = opt_union_groups(union, groups, norm, p, restarts, rng, progress)
    if len(groups) == 1:
        return A
    K, value = opt_kron_union(union, norm, p, restarts, rng, progress=progress)
    privacy = _UNIT[norm]
    return K if value < float(_union_error(W, A, bound, privacy)[0]) else A


def opt_marginals(W: Matrix, noise: str = "laplace", restarts: int | None = None, seed=None) -> Matrix:
    """OPT_M: weighted marginals (see :mod:`.marginals`); any union of Kronecker workloads."""
    _check(W, restarts=restarts)
    A, _ = opt_marginals_strategy(W, _norm(noise), restarts, _rng(seed))
    return A


def opt_residual(W: Matrix, noise: str = "gaussian", seed=None) -> Matrix:
    """The optimal residual strategy for Gaussian noise (closed form; the SVD bound on marginals).

    Deterministic: there are no random starts, and ``seed`` is accepted only so that every
    optimizer takes the same keywords. Residual strategies are calibrated to L2 sensitivity;
    under Laplace noise use :func:`opt_marginals` or :func:`opt_kron`.
    """
    _check(W)
    if _norm(noise) != 2:
        raise ValueError("residual strategies are optimal for Gaussian noise only; under Laplace noise use "
                         "opt_marginals or opt_kron")
    return residual_strategy(W)[0]


@dataclass
class OptimizationResult:
    """The outcome of :func:`optimize`.

    Attributes
    ----------
    strategy : Matrix
        The best strategy found.
    optimizer : str
        Which optimizer produced it.
    error : ErrorResult
        Its expected total squared error under ``privacy`` (exact, or OPT_+'s upper bound on large
        domains; see ``report``).
    privacy : Privacy
    bound : SVDBound
        The SVD lower bound for the workload.
    report : pandas.DataFrame
        One row per candidate: expected error, RMSE, whether exact, seconds, ratio to the bound.
    """

    strategy: Matrix
    optimizer: str
    error: ErrorResult
    privacy: Privacy
    bound: SVDBound
    report: pd.DataFrame = field(repr=False)

    @property
    def rmse(self) -> float:
        return float(np.sqrt(self.error / self.error.queries))


def optimize(W: Matrix, privacy: Privacy, *, restarts: int | None = None, seed=None,
             optimizers: Sequence[str] | None = None, progress: bool | Callable[[str], None] = False) -> OptimizationResult:
    """Run every optimizer that applies to ``W`` under ``privacy`` and keep the best strategy.

    Candidates: ``identity`` (reference), ``opt_kron`` (OPT_(x)), ``opt_marginals`` (OPT_M),
    ``opt_union`` (OPT_+, when the workload has several Kronecker terms; its exact error up to
    ``UNION_EXACT_MAX_N`` cells or when a closed form applies, else the upper bound of
    :mod:`.union`, marked ``exact=False`` in the report), and ``residual`` (Gaussian noise
    only). ``optimizers`` names a subset of them (one name or a list). ``restarts``: random
    starts per optimizer; by default p-Identity makes 8 per attribute of up to 512 values and 3
    beyond in OPT_(x) (:func:`~hdmm.optimizers.pidentity.default_restarts`), 3 in each OPT_+
    group (:data:`~hdmm.optimizers.union.GROUP_RESTARTS`), and OPT_M 3, or 128 on cheap
    problems (:mod:`.marginals`). Deterministic given
    ``seed``. ``progress=True`` shows a progress bar over the candidates (with each
    optimizer's own steps, such as OPT_(x)'s rounds, as its status); a callable receives those
    status lines instead.
    """
    _check(W, restarts=restarts)
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    norm = privacy.norm
    rng = _rng(seed)
    union = W.kron_union()
    available = ["identity", "opt_kron", "opt_marginals"]
    if union.num_terms > 1:
        available.append("opt_union")
    if norm == 2:
        available.append("residual")
    if isinstance(optimizers, str):
        optimizers = [optimizers]
    if optimizers is not None and len(optimizers) == 0:
        raise ValueError(f"optimizers is empty: name at least one of {available}, or pass None for all")
    chosen = available if optimizers is None else [o for o in optimizers if o in available]
    unknown = [] if optimizers is None else [o for o in optimizers if o not in available]
    if unknown:
        raise ValueError(f"optimizers {unknown} do not apply here; available: {available}")
    bar = tqdm(chosen, desc="optimize", unit="optimizer", disable=progress is not True)
    say = bar.set_postfix_str if progress is True else (progress or None)
    rows, best = [], None
    for name in bar:
        bar.set_description(f"optimize: {name}")
        start = time.perf_counter()
        exact = True
        if name == "identity":
            A = Identity(W.shape[1])
            error = expected_error(W, A, privacy)
        elif name == "opt_kron":
            A, value = opt_kron_union(union, norm, None, restarts, rng, progress=say)
            error = expected_error(W, A, privacy)
        elif name == "opt_marginals":
            A, value = opt_marginals_strategy(W, norm, restarts, rng)
            error = expected_error(W, A, privacy)
        elif name == "opt_union":
            A, value = opt_union_groups(union, default_groups(W, union), norm, None, restarts, rng, say)
            error, exact = _union_error(W, A, value, privacy)
        else:
            A, value = residual_strategy(W)
            error = expected_error(W, A, privacy)
        seconds = time.perf_counter() - start
        rows.append({"optimizer": name, "total squared error": float(error), "exact": exact, "seconds": seconds, "strategy": A})
        if say:
            say(f"{name}: total squared error {float(error):.6g} ({seconds:.2f} s)")
        if best is None or error < best[2]:
            best = (name, A, error)
    bound = svd_bound(W, privacy, seed=0)
    report = pd.DataFrame(rows).drop(columns="strategy")
    report["rmse"] = np.sqrt(report["total squared error"] / W.shape[0])
    report["ratio to SVD bound"] = report["total squared error"] / bound.value
    name, A, error = best
    return OptimizationResult(A, name, error, privacy, bound, report)
