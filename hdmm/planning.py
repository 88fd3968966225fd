r"""Release plans: every data-independent decision of a release, made once.

A :class:`Plan` fixes, before any data is seen, everything a release of workload ``W`` under a
privacy definition needs: the strategy :math:`A`, its sensitivity :math:`\Delta_p(A)` and the
noise scale it implies, the strategy's structure (:mod:`hdmm.structure`), the reconstruction
route, and the expected error with one variance per query,

.. math:: \mathrm{Var}(\hat a_i) = \mathrm{Var}(z)\,\big(W (A^TA)^+ W^T\big)_{ii}

(docs/math.md, section 1). None of it depends on the data, so a plan costs no privacy: an
agency makes it once, saves it (:meth:`Plan.save`), and measures it on many units with
:func:`hdmm.measure`, then :func:`hdmm.reconstruct`.

Weights given to :func:`hdmm.union` say how much each part of a workload matters to the
optimizer; a plan answers the queries themselves (:func:`hdmm.workload.unweighted`) and keeps
the weights only to show them.

>>> import hdmm
>>> W = hdmm.Prefix(8)
>>> p = hdmm.plan(W, hdmm.Identity(8), hdmm.PureDP(1.0))
>>> round(p.sensitivity, 6), p.method, p.structure.form
(1.0, 'kronecker', 'kronecker')
>>> round(p.rmse, 4)
3.0
"""

from __future__ import annotations

import functools
import math
import time
import warnings
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np
from tqdm import tqdm

from .exact import quantize
from .error import ErrorResult, expected_error, unit_query_variances
from .io import (FORMAT, MAX_BYTES, VERSION, check_checksum, decode_matrix, encode_matrix, read_archive,
                 with_checksum, workload_fingerprint, write_archive)
from .matrix import UNDERFLOW_MESSAGE, DenseLimitError, Kronecker, Matrix, Weighted
from .mechanism import RECONSTRUCTION_METHODS, reconstruction_method
from .noise import calibrate_grid, rounding_bound
from .optimizers import OptimizationResult, optimize
from .optimizers.kron import for_release
from .privacy import Privacy
from .structure import Structure, classify
from .version import HDMM_VERSION
from .workload import unweighted
from .threads import one_blas_thread

__all__ = ["Plan", "plan", "check_inputs", "strategy_plan", "union_variance_bound", "unit_variances_or_bounds", "plan_to_json", "plan_from_json",
           "SENSITIVITY_MARGIN", "ROUNDOFF_ALLOWANCE"]

#: Relative safety margin on every computed sensitivity: a plan calibrates its noise to
#: :math:`\Delta_p(A)\,(1 + 10^{-9})`. Sensitivities computed in floating point can fall a few
#: ulp (about 1e-15 relative) below the exact column norms; ``ROUNDOFF_ALLOWANCE`` (1e-12) of the
#: margin covers that many times over, and the rest holds the rounding bound of the noise grid
#: (at most a relative ``2**-30`` = 9.3e-10, :func:`hdmm.noise.grid_spacing`; should a tiny privacy
#: parameter coarsen the grid, the bound is added on top). It changes noise scales by a relative
#: 1e-9. Applied once, where a plan is made (:func:`plan`, :func:`strategy_plan`) or read back
#: (:func:`plan_from_json`).
SENSITIVITY_MARGIN = 1e-9

#: The part of ``SENSITIVITY_MARGIN`` kept for floating-point error in computed sensitivities.
ROUNDOFF_ALLOWANCE = 1e-12

#: Most queries a workload may have for :func:`plan` to store their variances (one float each, 2 GiB at this size):
#: a plan for a larger workload (e.g. a Kronecker product over a huge domain) holds none (``variances=None``).
MAX_QUERIES = 2**28


@dataclass(frozen=True, eq=False)
class Plan:
    r"""A data-independent release plan (see the module docstring).

    Attributes
    ----------
    workload : Matrix
        The queries released (``m x N``), without :func:`hdmm.union` weights.
    strategy : Matrix
        The strategy ``A`` measured with noise.
    privacy : Privacy
        The privacy definition one measurement spends.
    sensitivity : float
        The sensitivity the noise is calibrated to: :math:`\Delta_p(A)` in the norm of
        ``privacy``, computed from ``A`` and raised by a relative ``SENSITIVITY_MARGIN`` (1e-9),
        which covers floating-point rounding in the computed norms and the rounding bound of the
        noise grid (:func:`hdmm.noise.rounding_bound`: ``k * spacing`` in L1, ``sqrt(k) * spacing``
        in L2 for ``k`` the strategy's largest column support, :meth:`hdmm.matrix.Matrix.column_support`,
        at most a relative ``2**-30``; added on top if a tiny
        privacy parameter coarsens the grid).
    noise_scale : float
        Scale of the discrete Laplace or discrete Gaussian noise of each strategy answer, in the
        data's units (``noise_scale / spacing`` grid steps).
    structure : Structure
        The strategy's form and Kronecker union (:func:`hdmm.structure.classify`).
    method : str
        Reconstruction route: ``"kronecker"``, ``"marginals"`` or ``"lsmr"``.
    variances : numpy.ndarray or None
        Variance of each released answer (``None`` for a plan that only measures a strategy,
        see :func:`strategy_plan`).
    variance_exact : bool
        False when ``variances`` are upper bounds (a union strategy on a domain too large for
        the exact formula).
    origin : str
        Who chose the strategy: an optimizer's name, ``"user"``, or what a strategy file says.
    weights : numpy.ndarray or None
        Each query's :func:`hdmm.union` weight (what it meant to the optimizer), if any.
    seconds : float
        Time spent making the plan (optimization included).
    version : str
        The hdmm version that made the plan.
    spacing : float
        The noise grid: a power of two :math:`s`; each answer is released as
        :math:`s\,(\operatorname{round}(a/s) + Z)` with integer noise :math:`Z`
        (:func:`hdmm.noise.calibrate_grid`).
    """

    workload: Matrix
    strategy: Matrix
    privacy: Privacy
    sensitivity: float
    noise_scale: float
    structure: Structure
    method: str
    variances: np.ndarray | None
    variance_exact: bool
    origin: str
    weights: np.ndarray | None = None
    seconds: float = 0.0
    version: str = ""
    spacing: float = 0.0

    # ------------------------------------------------------------------ identity
    @functools.cached_property
    def fingerprint(self) -> str:
        """The fingerprint of the workload the plan was made for, weights included.

        Computed from :attr:`workload` and :attr:`weights` (so it always describes what the plan
        answers; :func:`hdmm.io.workload_fingerprint`), recorded in plan and release files and in
        :meth:`hdmm.release.Release.provenance`;
        :func:`hdmm.run` refuses the plan for a workload whose fingerprint differs.
        """
        return workload_fingerprint(self.workload, row_weights=self.weights)

    # ------------------------------------------------------------------ error
    @property
    def queries(self) -> int:
        """Number of released queries."""
        return self.workload.shape[0]

    @property
    def cells(self) -> int:
        """Number of domain cells ``N``."""
        return self.strategy.shape[1]

    @property
    def std_errors(self) -> np.ndarray:
        """Standard error of each released answer (an upper bound unless ``variance_exact``)."""
        self._need_variances()
        return np.sqrt(self.variances)

    @property
    def error(self) -> ErrorResult:
        """Expected total squared error of the released answers (the sum of ``variances``)."""
        self._need_variances()
        return ErrorResult(float(np.sum(self.variances)), measure="total squared error", privacy=self.privacy,
                           queries=self.queries, structure=self.structure, sensitivity=self.sensitivity)

    @property
    def rmse(self) -> float:
        """Expected root mean squared error per released query (the counts, unweighted).

        Not :func:`hdmm.rmse` of a weighted workload, which weighs each row (the optimizer's
        objective); the two agree when the workload has no weights.
        """
        return math.sqrt(float(self.error) / self.queries)

    def _need_variances(self) -> None:
        if self.variances is None:
            raise ValueError("this plan holds no per-query variances: it only measures a strategy (make one with "
                             "hdmm.plan(W, ...)), or its workload has more than hdmm.planning.MAX_QUERIES queries")

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the plan to ``path`` (a file name, written as given, or a binary file object).

        The file is hdmm's versioned strategy archive (no pickle): the strategy, the workload
        and its fingerprint, the privacy definition, sensitivity, structure, route, origin and
        the per-query variances, and a SHA-256 checksum of all of it (:func:`hdmm.io.with_checksum`:
        it detects a damaged file or an edit made without recomputing it, not a forger, since it
        has no secret key). :func:`hdmm.io.load_strategy` reads its strategy too.
        """
        arrays: dict[str, np.ndarray] = {}
        header = {"format": FORMAT, "version": VERSION, "kind": "plan", **plan_to_json(self, arrays),
                  "metadata": {"privacy": self.privacy.to_dict(), "optimizer": self.origin}}
        write_archive(path, with_checksum(header, arrays), arrays)

    @staticmethod
    @one_blas_thread
    def load(path, *, max_bytes: int = MAX_BYTES, progress: bool | Callable[[str], None] = False) -> Plan:
        """Read a plan written by :meth:`save`, validating it against its own strategy.

        Every array is checked as :func:`hdmm.io.load_strategy` checks it, and a file larger
        than ``max_bytes`` is refused unread. The sensitivity, structure and reconstruction
        route are recomputed from the stored strategy and must match what the file says (a
        file that does not is refused: the noise scale rests on them); the variances must be
        one finite, non-negative number per query. The workload's fingerprint
        (:attr:`fingerprint`) is recomputed from the stored workload and weights and must match
        the one recorded. A file written before fingerprints were recorded is accepted without
        a warning about them: its fingerprint is computed from the stored workload and weights,
        which is what a newer file records, so :func:`hdmm.run` checks it the same way. Last, the
        file's checksum (:meth:`save`) must match its contents, which also catches edits the
        checks above cannot see (say, two variances changed keeping their total); a file
        written before checksums were recorded is read with a ``UserWarning``.

        Each check is computed the cheap way: the sensitivity from the strategy's column norms, the
        error from per-attribute traces (a union strategy's through :mod:`hdmm.union_gram`), a dense
        pseudo-inverse only for a strategy with no structure on a small domain. ``progress=True``
        shows each step on the console (:func:`tqdm.tqdm.write`); a callable receives the lines
        instead (as :func:`hdmm.optimize`'s ``progress``).
        """
        say = _reporter(progress)
        say(f"reading the plan {path}")
        header, arrays = read_archive(path, max_bytes=max_bytes)
        if header.get("kind") != "plan":
            raise ValueError(f"{path} holds a strategy, not a plan: make one with hdmm.plan(W, strategy, privacy)")
        p = plan_from_json(header, arrays, source=str(path), max_bytes=max_bytes, progress=say)
        say("checking the file's checksum")
        check_checksum(header, arrays, path, "plan")
        return p

    # ------------------------------------------------------------------ display
    def summary(self) -> str:
        """A few readable lines: sizes, privacy, strategy and expected error."""
        lines = [
            f"Plan for {self.queries:,} queries over {self.cells:,} cells",
            f"  privacy: {self.privacy.description} ({self.privacy.noise.name} noise, sensitivity "
            f"{self.sensitivity:.6g}, scale {self.noise_scale:.6g})",
            f"  strategy: {self.strategy!r} ({self.structure.form}) from {self.origin}; reconstructed by {self.method}",
        ]
        if self.variances is not None:
            lines.append(f"  expected RMSE per query: {self.rmse:.6g}" + ("" if self.variance_exact else " (upper bound)"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        error = "" if self.variances is None else f"; RMSE {self.rmse:.4g}{'' if self.variance_exact else ' (bound)'}"
        return (f"Plan({self.queries:,} queries; {self.privacy.description}; {self.structure.form} strategy from "
                f"{self.origin}; {self.method}{error})")


# ====================================================================== variances
def union_variance_bound(W: Matrix, structure: Structure) -> np.ndarray:
    r"""Per-query variance upper bounds (at unit noise) from the single Kronecker terms of a union strategy.

    Answering query ``i`` from term ``j``'s measurements alone, :math:`w_i (A_j)^+ y_j`, is
    unbiased when :math:`A_j` supports it, with unit-noise variance
    :math:`w_i (A_j^TA_j)^+ w_i^T` (exact and cheap per term). Least squares over the whole
    union is the best linear unbiased estimator (Gauss-Markov: uncorrelated noise of equal
    variance, Laplace or Gaussian), so its variance is at most the smallest of these. ``inf``
    where no single term supports the query.
    """
    union = structure.union
    best = np.full(W.shape[0], np.inf)
    if union is None:
        return best
    for j in range(union.num_terms):
        weight, factors = union.term(j)
        term = Weighted(Kronecker(factors), weight)
        try:
            best = np.minimum(best, unit_query_variances(W, term, classify(term)))
        except DenseLimitError:
            continue
    return best


def unit_variances_or_bounds(W: Matrix, A: Matrix, structure: Structure) -> tuple[np.ndarray, bool]:
    """Per-query variances at unit noise (``inf`` where unsupported) and whether they are exact: exact where a
    closed form or a dense pseudo-inverse applies, else upper bounds (:func:`union_variance_bound`)."""
    try:
        return unit_query_variances(W, A, structure), True
    except DenseLimitError:
        return union_variance_bound(W, structure), False


def _unit_variances(W: Matrix, A: Matrix, structure: Structure) -> tuple[np.ndarray, bool]:
    """Per-query variances at unit noise and whether exact; raises if the strategy does not support ``W``."""
    unit, exact = unit_variances_or_bounds(W, A, structure)
    bad = ~np.isfinite(unit)
    if not bad.any():
        return unit, exact
    first = int(np.flatnonzero(bad)[0])
    if exact:
        raise ValueError(
            f"the strategy does not support the workload: {int(bad.sum()):,} of {W.shape[0]:,} queries "
            f"(the first: {W.labels[first]!r}) are not in the row space of the strategy, so they cannot be "
            "answered without bias from it (W A^+ A != W); use a strategy that supports the workload "
            "(e.g. add the identity or the workload's own queries)"
        )
    raise ValueError(
        f"cannot verify that the strategy {A!r} supports the workload on {W.shape[1]:,} cells: no single "
        f"Kronecker term of it supports {int(bad.sum()):,} of the {W.shape[0]:,} queries (the first: "
        f"{W.labels[first]!r}), and the exact least-squares variance needs a dense {W.shape[1]:,}-cell "
        "pseudo-inverse; use a Kronecker, marginals or residuals strategy, or a union whose every "
        "workload query is supported by one of its terms (as opt_union builds)"
    )


# ====================================================================== making a plan
def _choose(W: Matrix, privacy: Privacy, strategy, seed, progress) -> tuple[Matrix, str, Structure | None]:
    """The strategy, its origin, and its structure when an optimizer classified it.

    The sensitivity is always computed again from the strategy (milliseconds even for unions of
    Kronecker products): an optimization result is a plain record, and one paired with another
    strategy must not lend it its sensitivity.
    """
    if isinstance(strategy, str):
        if strategy != "auto":
            raise ValueError(
                f"strategy must be 'auto', an hdmm matrix or an OptimizationResult, got the string {strategy!r}"
            )
        with for_release():  # only strategies a release can measure exactly (hdmm.exact)
            strategy = optimize(W, privacy, seed=seed, progress=progress)
    if isinstance(strategy, OptimizationResult):
        if strategy.privacy.noise != privacy.noise:
            warnings.warn(
                f"the strategy was optimised for {strategy.privacy.noise.name} noise ({strategy.privacy.description}) "
                f"but is released with {privacy.noise.name} noise ({privacy.description}); it is still correct "
                "and private, but probably not the best strategy: optimise for the privacy definition you use",
                stacklevel=4,
            )
        structure = getattr(strategy.error, "structure", None)
        return strategy.strategy, strategy.optimizer, structure
    if isinstance(strategy, Matrix):
        return strategy, "user", None
    raise TypeError(
        f"strategy must be 'auto', an hdmm matrix or an OptimizationResult, got {type(strategy).__name__}"
    )


def _check_sensitivity(sensitivity: float, A: Matrix) -> float:
    """The computed sensitivity times ``1 + SENSITIVITY_MARGIN`` (before the grid's rounding bound)."""
    if not (math.isfinite(sensitivity) and sensitivity >= 0):
        raise ValueError(
            f"the strategy {A!r} has sensitivity {sensitivity!r}, not a finite number: its entries overflow; "
            "rescale the strategy (it measures the same queries at any scale)"
        )
    calibrated = float(sensitivity) * (1.0 + SENSITIVITY_MARGIN)
    if not math.isfinite(calibrated):
        raise ValueError(f"the strategy {A!r} has sensitivity {sensitivity!r}, too large to calibrate noise to; "
                         "rescale the strategy")
    return calibrated


#: Plans made here (:func:`plan`, :func:`strategy_plan`, :func:`plan_from_json`), their noise calibrated to
#: their own strategy; any other plan is checked once by :func:`check_calibration` before it is measured.
_CALIBRATED: weakref.WeakSet = weakref.WeakSet()


def _calibrated(p: Plan) -> Plan:
    _CALIBRATED.add(p)
    return p


def check_calibration(p: Plan) -> None:
    """Refuse a plan whose noise is smaller than its strategy needs (checked before any noise is drawn).

    A plan is a frozen record, but ``dataclasses.replace`` (or a hand-built ``Plan``) can pair a
    strategy with a sensitivity or noise scale that was not computed for it. The plan's
    sensitivity must cover its strategy's with the rounding of the column norms and of its noise
    grid (as where plans are made; a larger one, as in a geography unit's plan, only adds noise)
    and its noise scale must be at least what its privacy definition needs at that sensitivity.
    Plans made by this module are known to pass; others are checked once.
    """
    if p in _CALIBRATED:
        return
    computed = p.privacy.noise.sensitivity(p.strategy)
    _check_sensitivity(computed, p.strategy)  # a finite number
    # what the plan's sensitivity must cover: the column norms' rounding and the grid's (a coarser grid
    # moves the rounded answers further apart), as where plans are made (_noise_grid)
    needed = 0.0 if computed == 0 else (
        computed * (1.0 + ROUNDOFF_ALLOWANCE) + rounding_bound(p.spacing, p.strategy.column_support(), p.privacy.norm))
    if not (p.sensitivity >= needed * (1.0 - 1e-12)
            and p.noise_scale >= p.privacy.noise_scale(p.sensitivity) * (1.0 - 1e-12)):
        raise ValueError(
            f"the plan's noise is not calibrated to its strategy (sensitivity {p.sensitivity!r}, noise scale "
            f"{p.noise_scale!r}; the strategy needs sensitivity {needed!r}): was it edited? make it again with "
            "hdmm.plan or hdmm.planning.strategy_plan; nothing was measured"
        )
    _CALIBRATED.add(p)


def _noise_grid(sensitivity: float, A: Matrix, privacy: Privacy) -> tuple[float, float]:
    """``(spacing, calibrated sensitivity)`` for a sensitivity from :func:`_check_sensitivity`.

    The margin beyond ``ROUNDOFF_ALLOWANCE`` holds the grid's rounding bound (docs/privacy.md).
    """
    if sensitivity == 0:  # a zero strategy: its answers are 0 whatever the data, and need no noise
        probe = np.random.default_rng(0).random(A.shape[1]) + 1.0  # data independent; any non-zero column shows
        if np.any(np.asarray(A @ probe) != 0.0):
            raise ValueError(f"the strategy {A!r} has computed sensitivity 0 but is not zero: {UNDERFLOW_MESSAGE}")
        return 1.0, 0.0
    computed = sensitivity / (1.0 + SENSITIVITY_MARGIN)
    headroom = sensitivity - computed * (1.0 + ROUNDOFF_ALLOWANCE)
    return calibrate_grid(sensitivity, A.column_support(), privacy.norm, privacy.noise_scale, headroom=headroom)


def check_inputs(W: Matrix, privacy: Privacy, method: str = "auto") -> None:
    """Refuse a workload that is not an hdmm matrix, an unknown privacy definition or reconstruction method."""
    if not isinstance(W, Matrix):
        raise TypeError(f"the workload must be an hdmm matrix, got {type(W).__name__}")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    if method not in RECONSTRUCTION_METHODS:
        raise ValueError(f"unknown reconstruction method {method!r}; choose one of {list(RECONSTRUCTION_METHODS)}")


@one_blas_thread
def plan(W: Matrix, strategy: str | Matrix | OptimizationResult, privacy: Privacy, *, method: str = "auto",
         origin: str | None = None, seed=None, progress: bool | Callable[[str], None] = False) -> Plan:
    r"""Make the data-independent plan for releasing workload ``W`` under ``privacy``.

    Parameters
    ----------
    W
        The workload (``m x N``); :func:`hdmm.union` weights steer the optimizer only.
    strategy
        ``"auto"``: run :func:`hdmm.optimize` and take its best strategy. An hdmm matrix:
        measured as given. An :class:`~hdmm.optimizers.OptimizationResult`: its strategy (a warning if it
        was optimised for the other kind of noise).
    privacy
        :class:`~hdmm.PureDP`, :class:`~hdmm.ApproxDP` or :class:`~hdmm.ZCDP`: what one
        measurement under the plan spends.
    method
        Reconstruction route: ``"auto"`` (exact when the structure allows, else LSMR),
        ``"kronecker"``, ``"marginals"`` or ``"lsmr"``.
    origin
        Who chose the strategy, recorded in the plan (default: the optimizer's name, or
        ``"user"`` for a matrix).
    seed
        Seed of the optimizer's random starts (``strategy="auto"`` only): for reproducible
        research; a plan holds no noise, so the seed reveals nothing about the data.
    progress
        Passed to :func:`hdmm.optimize`; ``True`` or a callable also gets a line for each later step
        (as :meth:`Plan.load`'s ``progress``).

    Returns
    -------
    Plan

    Notes
    -----
    The noise is calibrated to the strategy's sensitivity times ``1 + SENSITIVITY_MARGIN``
    (a relative 1e-9), which covers floating-point rounding in the computed column norms, plus
    the rounding bound of the noise grid (:func:`hdmm.noise.calibrate_grid`; docs/privacy.md).

    Raises
    ------
    ValueError
        A strategy over another domain, one that does not support the workload (checked here,
        before any data is touched), a zero strategy, or an unknown ``method``.
    """
    check_inputs(W, privacy, method)
    start = time.perf_counter()
    A, chosen_by, structure = _choose(W, privacy, strategy, seed, progress)
    if A.shape[1] != W.shape[1]:
        raise ValueError(
            f"the strategy has {A.shape[1]:,} columns but the workload has {W.shape[1]:,}: both must be "
            "over the same domain"
        )
    quantized = quantize(A)  # the plan measures the dyadic strategy exactly (hdmm.exact)
    if structure is None or quantized is not A:
        A, structure = quantized, classify(quantized)
    spacing, sensitivity = _noise_grid(_check_sensitivity(privacy.noise.sensitivity(A), A), A, privacy)
    resolved = reconstruction_method(A, method, structure=structure)
    queries, weights = unweighted(W)
    say = _reporter(progress)
    say(f"plan: per-query variances of {W.shape[0]:,} queries under a {structure.form} strategy")
    if W.shape[0] > MAX_QUERIES:  # too many to hold one variance each (a 1e100-cell Kronecker workload)
        unit, exact = None, False
    else:
        unit, exact = _unit_variances(queries, A, structure)
    return _calibrated(Plan(
        workload=queries,
        strategy=A,
        privacy=privacy,
        sensitivity=sensitivity,
        noise_scale=privacy.noise_scale(sensitivity),
        structure=structure,
        method=resolved,
        variances=None if unit is None else privacy.noise_variance(sensitivity) * unit,
        variance_exact=exact,
        origin=chosen_by if origin is None else str(origin),
        weights=weights,
        seconds=time.perf_counter() - start,
        version=HDMM_VERSION,
        spacing=spacing,
    ))


def strategy_plan(A: Matrix, privacy: Privacy, *, origin: str = "user") -> Plan:
    """A plan that only measures strategy ``A`` (no workload, no variances).

    What :func:`hdmm.measure` builds for the earlier form ``measure(A, x, privacy)``; its
    sensitivity (with the margin ``SENSITIVITY_MARGIN``) and structure are computed here, once.
    """
    if not isinstance(A, Matrix):
        raise TypeError(f"the strategy must be an hdmm matrix, got {type(A).__name__}")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    W, A = A, quantize(A)  # the plan measures the dyadic strategy exactly (hdmm.exact)
    structure = classify(A)
    spacing, sensitivity = _noise_grid(_check_sensitivity(privacy.noise.sensitivity(A), A), A, privacy)
    return _calibrated(Plan(
        workload=W, strategy=A, privacy=privacy, sensitivity=sensitivity,
        noise_scale=privacy.noise_scale(sensitivity), structure=structure,
        method=reconstruction_method(A, "auto", structure=structure), variances=None, variance_exact=True,
        origin=origin, version=HDMM_VERSION, spacing=spacing,
    ))


# ====================================================================== files
def plan_to_json(p: Plan, arrays: dict[str, np.ndarray]) -> dict:
    """The plan as JSON entries (``tree``, ``workload``, ``plan``); its arrays are added to ``arrays``."""
    arrays["plan_variances"] = np.zeros(0) if p.variances is None else np.asarray(p.variances)
    if p.weights is not None:
        arrays["plan_weights"] = np.asarray(p.weights)
    return {
        "tree": encode_matrix(p.strategy, arrays),
        "workload": encode_matrix(p.workload, arrays),
        "plan": {
            "privacy": p.privacy.to_dict(),
            "sensitivity": p.sensitivity,
            "noise_scale": p.noise_scale,
            "structure": p.structure.form,
            "method": p.method,
            "has_variances": p.variances is not None,
            "variance_exact": p.variance_exact,
            "origin": p.origin,
            "seconds": p.seconds,
            "version": p.version,
            "spacing": p.spacing,
            "fingerprint": p.fingerprint,
        },
    }


def _reporter(progress: bool | Callable[[str], None] | None) -> Callable[[str], None]:
    """``progress`` as a function of one line: the console for ``True`` (``tqdm.write``), nothing for ``False``."""
    if progress is True:
        return tqdm.write
    if progress is False or progress is None:
        return lambda line: None
    if not callable(progress):
        raise TypeError(f"progress must be True, False or a function of one line, got {type(progress).__name__}")
    return progress


def plan_from_json(header: dict, arrays: dict[str, np.ndarray], source: str = "the file", *,
                   max_bytes: int = MAX_BYTES, progress: bool | Callable[[str], None] = False) -> Plan:
    """The plan written by :func:`plan_to_json`, validated against its own strategy (within ``max_bytes`` of memory).

    ``progress`` as in :meth:`Plan.load`.
    """
    say = _reporter(progress)
    missing = [key for key in ("plan", "tree", "workload") if key not in header]
    if missing:
        raise ValueError(f"{source} is not a valid hdmm plan file: no {missing[0]!r} entry")
    A = decode_matrix(header["tree"], arrays, source=source, max_bytes=max_bytes)
    W = decode_matrix(header["workload"], arrays, source=source, max_bytes=max_bytes)
    try:
        info = header["plan"]
        privacy = Privacy.from_dict(info["privacy"])
        stored = float(info["sensitivity"])
        has_variances = bool(info["has_variances"])
        variances = np.asarray(arrays["plan_variances"], dtype=float) if has_variances else None
        weights = np.asarray(arrays["plan_weights"], dtype=float) if "plan_weights" in arrays else None
        stated = (str(info["structure"]), str(info["method"]), bool(info["variance_exact"]), str(info["origin"]))
        seconds, version = float(info.get("seconds", 0.0)), str(info.get("version", ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source} is not a valid hdmm plan file: {exc}") from None
    if A.shape[1] != W.shape[1]:
        raise ValueError(f"{source}: the stored strategy and workload are over different domains")
    say(f"checking the strategy ({A.shape[0]:,} x {A.shape[1]:,}): grid, structure and sensitivity")
    if quantize(A) is not A:
        raise ValueError(f"{source}: the stored strategy is not on the dyadic grid hdmm measures exactly (a plan "
                         "saved before hdmm 'quantized' strategies, or an edited file): make the plan again")
    structure = classify(A)
    computed = _check_sensitivity(privacy.noise.sensitivity(A), A)
    spacing, sensitivity = _noise_grid(computed, A, privacy)
    # files written before the noise grid store the sensitivity without its rounding bound
    if not any(abs(value - stored) <= 4 * SENSITIVITY_MARGIN * max(abs(value), 1e-300) for value in (sensitivity, computed)):
        raise ValueError(
            f"{source}: the stored sensitivity {stored!r} is not the strategy's ({sensitivity!r}); the file is "
            "damaged or was edited: make the plan again"
        )
    form, method, exact, origin = stated
    if form != structure.form or reconstruction_method(A, method, structure=structure) != method:
        raise ValueError(f"{source}: the stored structure or reconstruction route does not fit the strategy")
    if variances is not None and (variances.shape != (W.shape[0],) or not np.all(np.isfinite(variances))
                                  or np.any(variances < 0)):
        raise ValueError(f"{source}: the stored variances are not one finite, non-negative number per query")
    if weights is not None and weights.shape != (W.shape[0],):
        raise ValueError(f"{source}: the stored weights are not one number per query")
    # files written before fingerprints were recorded hold the same workload and weights it is computed from
    fingerprint = workload_fingerprint(W, row_weights=weights)
    if info.get("fingerprint", fingerprint) != fingerprint:
        raise ValueError(f"{source}: the stored workload fingerprint {info.get('fingerprint')!r} is not that of the "
                         f"stored workload ({fingerprint}); the file is damaged or was edited: make the plan again")
    if variances is not None:  # their total against the strategy's error, computed again (cheap: traces)
        say(f"checking the {W.shape[0]:,} stored variances against the strategy's expected error")
        try:
            total = float(expected_error(W, A, privacy, structure=structure, sensitivity=sensitivity))
        except DenseLimitError:
            total = None
        stored_total = float(np.sum(variances))
        if total is not None and math.isfinite(total) and (
                stored_total < total * (1 - 1e-6) or (exact and stored_total > total * (1 + 1e-6))):
            raise ValueError(f"{source}: the stored variances add up to {stored_total:.6g}, but the strategy's "
                             f"expected error is {total:.6g}; the file is damaged or was edited: make the plan again")
    return _calibrated(Plan(workload=W, strategy=A, privacy=privacy, sensitivity=sensitivity,
                            noise_scale=privacy.noise_scale(sensitivity), structure=structure, method=method,
                            variances=variances, variance_exact=exact, origin=origin, weights=weights,
                            seconds=seconds, version=version, spacing=spacing))
