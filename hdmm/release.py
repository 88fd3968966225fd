r"""End to end: choose a strategy, measure it with noise, reconstruct, answer the workload.

:func:`run` returns a :class:`Release`: the workload answers :math:`W\hat x` with
:math:`\hat x = A^+ (Ax + z)`, their standard errors

.. math:: \mathrm{se}_i = \sqrt{\mathrm{Var}(z)\,\big(W (A^TA)^+ W^T\big)_{ii}}

(docs/math.md, section 1; the answers are unbiased because the strategy supports the workload),
confidence intervals, and everything needed to audit the release: the strategy, which
optimizer made it, the privacy guarantee, the sensitivity and noise scale, and timings.

Optional post-processing of :math:`\hat x` (non-negativity, integer counts) costs no privacy but
changes the answers; the change is measured and reported, and the standard errors and intervals
keep referring to the unprocessed least-squares estimate.

A release can build on earlier ones: ``run(W2, data, privacy, prior=release1)`` measures a new
strategy :math:`A_2` and reconstructs from *every* measurement taken so far by generalized least
squares, each weighted by its own noise: with :math:`s_j` the noise standard deviation of
measurement :math:`j`,

.. math:: \hat x = B^+ b, \qquad B = \begin{bmatrix} A_1/s_1 \\ A_2/s_2 \end{bmatrix}, \quad
          b = \begin{bmatrix} y_1/s_1 \\ y_2/s_2 \end{bmatrix},

the best linear unbiased estimate from both (Aitken). Every answer read off :math:`\hat x`
(:meth:`Release.answer` re-answers the first workload) is consistent with every other, and its
variance :math:`\mathrm{diag}(W (B^TB)^+ W^T)` is at most what either measurement alone gives.
Only the new measurement costs privacy; the earlier ones are post-processed.

A :class:`~hdmm.Budget` given to :func:`run` is charged before any noise is drawn, and the
release records the charge in its provenance.

A release records the fingerprint of its workload (:func:`hdmm.io.workload_fingerprint`, union
weights included), and :func:`run` refuses a :class:`~hdmm.planning.Plan` made for another workload. A
release file (:meth:`Release.save`) carries a SHA-256 checksum of everything in it
(:func:`hdmm.io.with_checksum`), which :meth:`Release.load` verifies: it detects damage and
edits made without recomputing it, not a forger (anyone can recompute a checksum that has no
secret key).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import norm

from .budget import Budget, Charge, settle_quietly
from .domain import Domain
from .error import exact_route, unit_query_variances
from .kernel import Counts, as_generator, measure
from .matrix import DENSE_LIMIT, DenseLimitError, Matrix, VStack, Weighted
from .mechanism import Measurement, least_squares, reconstruct, reconstruction_method
from .optimizers import OptimizationResult
from .planning import (Plan, check_inputs, plan_from_json, plan_to_json, strategy_plan, unit_variances_or_bounds,
                       union_variance_bound)
from .postprocess import nonnegative_least_squares, round_to_total
from .io import (FORMAT, MAX_BYTES, VERSION, check_checksum, decode_matrix, encode_matrix, read_archive,
                 with_checksum, workload_fingerprint, write_archive)
from .planning import plan as make_plan
from .distributions import Noise
from .privacy import Privacy
from .structure import Structure, classify
from .traces import SUPPORT_TOL, gram_inverse, squared_row_norms
from .workload import unweighted

__all__ = ["Release", "Answers", "Combined", "run", "combine", "POSTPROCESS_OPTIONS", "table_names"]

#: The values ``run(postprocess=...)`` accepts.
POSTPROCESS_OPTIONS = (None, "nonnegative", "integer")


def _postprocess(A: Matrix, noise_std: float, estimate: np.ndarray, kind: str) -> np.ndarray:
    nonnegative = nonnegative_least_squares(A, estimate, noise_std)
    return nonnegative if kind == "nonnegative" else round_to_total(nonnegative)


# ====================================================================== several measurements
def _same_matrix(A: Matrix, B: Matrix) -> bool:
    """Whether two strategies are the same matrix: the same object, or the same saved form (tree and arrays)."""
    if A is B:
        return True
    if A.shape != B.shape:
        return False
    try:
        arrays_a: dict[str, np.ndarray] = {}
        arrays_b: dict[str, np.ndarray] = {}
        if encode_matrix(A, arrays_a) != encode_matrix(B, arrays_b):
            return False
    except TypeError:  # a matrix class that cannot be saved: compared by identity only
        return False
    return all(np.array_equal(arrays_a[k], arrays_b[k]) for k in arrays_a)


@dataclass(frozen=True, eq=False)
class Combined:
    r"""Several measurements of the same data, reconstructed together by generalized least squares.

    Measurements of the same strategy are merged first (their answers averaged with weights
    :math:`1/s_j^2`, which is exact), so that the stacked strategy
    :math:`B = [\,A_g \sqrt{w_g}\,]_g`, :math:`w_g = \sum_{j \in g} s_j^{-2}`, has one block per
    distinct strategy and unit noise in every row.

    Attributes
    ----------
    measurements : tuple of Measurement
        Every measurement, oldest first (the release's own measurement last).
    stacked : Matrix
        :math:`B`, whose rows have noise of variance at most 1.
    answers : numpy.ndarray
        :math:`b`, the merged and scaled noisy answers: :math:`\hat x = B^+ b`.
    structure : Structure
        ``B``'s structure (:func:`hdmm.structure.classify`).
    method : str
        How :math:`B^+ b` is computed (``"kronecker"``, ``"marginals"`` or ``"lsmr"``).
    groups : tuple of (Matrix, float)
        Each distinct strategy with its weight :math:`w_g` (the sum of its measurements' inverse
        noise variances).
    members : tuple of int
        The group of each measurement (-1 for one without noise, left out).
    variances : numpy.ndarray
        The variance of each answer of the release's workload from the combined estimate.
    variance_exact : bool
        False when ``variances`` are upper bounds (see :func:`combine`).
    prior : dict
        The provenance of the release this one builds on (:meth:`Release.provenance`, which
        holds its own prior's in turn).
    """

    measurements: tuple[Measurement, ...]
    stacked: Matrix
    answers: np.ndarray
    structure: Structure
    method: str
    groups: tuple[tuple[Matrix, float], ...]
    members: tuple[int, ...]
    variances: np.ndarray
    variance_exact: bool
    prior: dict

    def with_last(self, measurement: Measurement) -> Combined:
        """The combination with its last measurement replaced by ``measurement`` (same strategy and noise), answers restacked.

        :func:`run` combines before it measures (to check, before any noise, that the
        measurements support the workload) and puts the real measurement in afterwards.
        """
        last = self.measurements[-1]
        if measurement.strategy is not last.strategy or measurement.noise_std != last.noise_std:
            raise ValueError("the measurement replacing the last one must be of the same strategy and noise")
        measurements = self.measurements[:-1] + (measurement,)
        totals = [np.zeros(A.shape[0]) for A, _ in self.groups]
        for m, k in zip(measurements, self.members):
            if k >= 0:
                totals[k] += m.answers / m.noise_std**2
        answers = np.concatenate([t / math.sqrt(weight) for t, (_, weight) in zip(totals, self.groups)])
        return dataclasses.replace(self, measurements=measurements, answers=answers)

    def variances_of(self, W: Matrix, known: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
        r"""Per-query variances of workload ``W`` (unweighted) answered from the combined estimate, and whether exact.

        Exact, :math:`\mathrm{diag}(W (B^TB)^+ W^T)`, when :math:`B`'s structure has a closed form
        (Kronecker, marginals algebra, residual bases), when the factor Grams of its terms
        diagonalise together (:mod:`hdmm.union_gram`: any two strategies of Kronecker products on
        the workload's attributes, OPT_+'s unions, at any domain size where the grids fit;
        :func:`hdmm.error.exact_route`), or when the domain is small enough (``N^2 <= DENSE_LIMIT``) for
        a dense inverse of :math:`B^TB`, computed once per combination (Cholesky, or the
        pseudo-inverse when singular; :func:`hdmm.traces.gram_inverse`) and reused by
        :meth:`Release.answer`. Otherwise an upper bound: least squares on all measurements (the
        best linear unbiased estimator) does at least as well as any one distinct strategy
        alone, or any single Kronecker term of :math:`B` alone, whose variances are exact and
        cheap; ``known`` adds variances known for ``W`` another way (a plan's). ``inf`` for a
        query nothing supports.
        """
        n = W.shape[1]
        if exact_route(W, self.stacked, structure=self.structure) != "dense":
            return unit_query_variances(W, self.stacked, self.structure), True
        if n * n <= DENSE_LIMIT:
            inverse, projector = gram_inverse(self.stacked)  # cached while the stacked strategy lives
            unit = _quadratic_diag(W, inverse)
            identity = np.eye(n)
            if not np.array_equal(projector, identity):  # rows outside B's row space are not supported
                outside = _quadratic_diag(W, identity - projector)
                unit = np.where(outside > SUPPORT_TOL * squared_row_norms(W), np.inf, unit)
            return unit, True
        best = union_variance_bound(W, self.structure)
        if known is not None:
            best = np.minimum(best, known)
        for A, weight in self.groups:
            try:
                best = np.minimum(best, unit_query_variances(W, A, classify(A)) / weight)
            except DenseLimitError:
                continue
        return best, False


#: Columns per block when :func:`_quadratic_diag` cannot form ``W`` densely.
QUADRATIC_BLOCK = 256


def _quadratic_diag(W: Matrix, X: np.ndarray) -> np.ndarray:
    r""":math:`\mathrm{diag}(W X W^T)` for a dense ``X``, in blocks of columns when ``W`` is too large to make dense.

    Block :math:`J` adds :math:`\sum_{j \in J} (WX)_{ij} W_{ij}` from the implicit products
    :math:`W X_{:,J}` and :math:`W I_{:,J}` (``m x QUADRATIC_BLOCK`` each).
    """
    try:
        return W.quadratic_diag(X)
    except DenseLimitError:
        pass
    n = W.shape[1]
    out = np.zeros(W.shape[0])
    for lo in range(0, n, QUADRATIC_BLOCK):
        hi = min(lo + QUADRATIC_BLOCK, n)
        columns = np.zeros((n, hi - lo))
        columns[np.arange(lo, hi), np.arange(hi - lo)] = 1.0
        out += np.sum((W @ X[:, lo:hi]) * (W @ columns), axis=1)
    return out


def combine(measurements: Sequence[Measurement], W: Matrix, *, prior: Mapping[str, Any] | None = None,
            known: np.ndarray | None = None) -> Combined:
    r"""Stack ``measurements`` of the same data for generalized least squares, with the variances of workload ``W``.

    Each measurement :math:`y_j = A_j x + z_j` with noise standard deviation :math:`s_j`
    (:attr:`Measurement.noise_std`, an upper bound of the discrete noise's, exact to a relative
    1e-18) becomes the rows :math:`A_j/s_j`, :math:`y_j/s_j`; measurements of the same strategy
    are merged. A measurement without noise (a zero strategy) carries no information and is
    left out. ``W`` is the workload released (unweighted), ``known`` its variances known
    otherwise (used only where the exact variances are out of reach), ``prior`` the provenance
    recorded as :attr:`Combined.prior`.

    Raises
    ------
    ValueError
        If the measurements are over different domains, or none has noise.
    """
    measurements = tuple(measurements)
    cells = {m.strategy.shape[1] for m in measurements}
    if len(cells) != 1 or W.shape[1] not in cells:
        raise ValueError(
            f"the measurements and the workload are over different domains ({sorted(cells | {W.shape[1]})} cells): a "
            "release can only build on releases of the same data over the same domain"
        )
    groups: list[tuple[Matrix, float]] = []
    members = []
    for m in measurements:
        std = m.noise_std
        if std == 0:
            members.append(-1)
            continue
        for k, (A, weight) in enumerate(groups):
            if _same_matrix(A, m.strategy):
                groups[k] = (A, weight + 1.0 / (std * std))
                members.append(k)
                break
        else:
            members.append(len(groups))
            groups.append((m.strategy, 1.0 / (std * std)))
    if not groups:
        raise ValueError("no measurement has noise (all strategies are zero): there is nothing to reconstruct from")
    blocks = [Weighted(A, math.sqrt(weight)) for A, weight in groups]
    stacked = blocks[0] if len(blocks) == 1 else VStack(blocks)
    structure = classify(stacked)
    combined = Combined(measurements=measurements, stacked=stacked, answers=np.zeros(0), structure=structure,
                        method=reconstruction_method(stacked, "auto", structure=structure), groups=tuple(groups),
                        members=tuple(members), variances=np.zeros(0), variance_exact=True, prior=dict(prior or {}))
    combined = combined.with_last(measurements[-1])
    variances, exact = combined.variances_of(W, known)
    _check_supported(W, variances, exact, stacked)
    return dataclasses.replace(combined, variances=variances, variance_exact=exact)


def _check_supported(W: Matrix, variances: np.ndarray, exact: bool, stacked: Matrix) -> None:
    bad = ~np.isfinite(variances)
    if not bad.any():
        return
    first = W.labels[int(np.flatnonzero(bad)[0])]
    if exact:
        raise ValueError(
            f"the measurements do not support the workload: {int(bad.sum()):,} of {W.shape[0]:,} queries (the first: "
            f"{first!r}) are not combinations of the measured queries, so they cannot be answered without bias"
        )
    raise ValueError(
        f"cannot verify that the measurements ({stacked!r}) support {int(bad.sum()):,} of the {W.shape[0]:,} queries "
        f"(the first: {first!r}) on {W.shape[1]:,} cells: no single measured strategy or Kronecker term supports "
        "them, and the exact check needs a dense pseudo-inverse"
    )


def _interval_method(noises: set[Noise], exact: bool) -> str:
    """How the intervals of measurements with these noise distributions are made (normal noise: exact)."""
    other = sorted(noise.title for noise in noises if not noise.normal)
    if not other:
        text = f"exact ({' and '.join(sorted(noise.title for noise in noises))} noise)"
    elif len(other) == len(noises):
        text = f"normal approximation ({' and '.join(other)} noise)"
    else:
        text = f"normal approximation ({' and '.join(other)} noise in some measurements)"
    if not exact:
        text += "; conservative (standard errors are upper bounds)"
    return text


def _intervals(answers: np.ndarray, std_errors: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(level, bool) or not (isinstance(level, numbers.Real) and 0 < level < 1):
        raise ValueError(f"level must be a number strictly between 0 and 1 (e.g. 0.95), got {level!r}")
    half = norm.ppf(0.5 + level / 2) * std_errors
    return answers - half, answers + half


def _table(W: Matrix, answers: np.ndarray, unprocessed: np.ndarray | None, std_errors: np.ndarray,
           weights: np.ndarray | None, level: float, attrs: dict[str, Any]) -> pd.DataFrame:
    """The columns of :meth:`Release.table` (``unprocessed`` only when post-processed)."""
    lower, upper = _intervals(answers if unprocessed is None else unprocessed, std_errors, level)
    columns: dict[str, Any] = {}
    tables = table_names(W)
    if tables is not None:
        columns["table"] = tables
    columns["query"] = list(W.labels)
    columns["answer"] = answers
    columns["std_error"] = std_errors
    columns["lower"] = lower
    columns["upper"] = upper
    if weights is not None:
        columns["weight"] = weights
    if unprocessed is not None:
        columns["unprocessed_answer"] = unprocessed
    df = pd.DataFrame(columns)
    df.attrs["level"] = level
    df.attrs.update(attrs)
    return df


@dataclass(frozen=True, eq=False)
class Answers:
    r"""Answers to a workload read off a release's estimate (:meth:`Release.answer`), free of privacy cost.

    Attributes
    ----------
    workload : Matrix
        The queries answered, without :func:`hdmm.union` weights.
    answers, unprocessed_answers : numpy.ndarray
        :math:`W\hat x` from the release's (post-processed) estimate, and from the least-squares
        estimate the standard errors refer to (the same array without post-processing).
    std_errors : numpy.ndarray
        Standard error of each unprocessed answer (upper bounds unless ``variance_exact``).
    variance_exact : bool
    interval_method : str
        How :meth:`intervals` are obtained (see :meth:`Release.intervals`).
    weights : numpy.ndarray or None
        Each query's :func:`hdmm.union` weight, if any.
    provenance : dict
        The release's :meth:`Release.provenance` (whose ``workload_fingerprint`` is the release's
        workload), with ``answered_workload_fingerprint``, that of the workload answered here.
    """

    workload: Matrix
    answers: np.ndarray
    unprocessed_answers: np.ndarray
    std_errors: np.ndarray
    variance_exact: bool
    interval_method: str
    weights: np.ndarray | None
    provenance: dict

    @property
    def rmse(self) -> float:
        """Expected root mean squared error per query of the unprocessed answers."""
        return float(np.sqrt(np.mean(self.std_errors**2)))

    def intervals(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Confidence intervals around the unprocessed answers, as :meth:`Release.intervals`."""
        return _intervals(self.unprocessed_answers, self.std_errors, level)

    def table(self, level: float = 0.95) -> pd.DataFrame:
        """The answers as a DataFrame with the columns of :meth:`Release.table`."""
        processed = self.answers is not self.unprocessed_answers
        return _table(self.workload, self.answers, self.unprocessed_answers if processed else None, self.std_errors,
                      self.weights, level, {"interval_method": self.interval_method, "provenance": self.provenance})


# ====================================================================== the release
def _calibrated_rho(privacy: Privacy) -> float | None:
    """The zCDP rho a Gaussian release's noise is calibrated to (None for pure DP: Laplace noise, calibrated to epsilon)."""
    zcdp = None if privacy.to_pure() is not None else privacy.to_zcdp()
    return None if zcdp is None else float(zcdp.rho)  # an exact rho stays in the privacy's own record (rho_exact)


def table_names(W: Matrix) -> np.ndarray | None:
    """The table each row of ``W`` belongs to, for a union with named parts (e.g. the Census tables), else None."""
    if isinstance(W, VStack) and W.names is not None:
        return np.repeat(np.array(W.names, dtype=object), [b.shape[0] for b in W.blocks])
    return None


@dataclass(frozen=True, eq=False)
class Release:
    r"""A differentially private release of a workload's answers, with its uncertainty.

    Attributes
    ----------
    plan : Plan
        The data-independent plan it was measured under: workload, strategy, privacy,
        sensitivity, noise scale, structure, reconstruction route and per-query variances.
    measurement : Measurement
        The strategy's noisy answers (with the privacy definition, sensitivity and noise scale).
    answers : numpy.ndarray
        The released answers, in the workload's row order: :math:`W\hat x` from the estimate
        (post-processed when ``postprocess`` is set).
    estimate : numpy.ndarray
        The data-vector estimate the answers come from (length ``N``).
    postprocess : str or None
        ``None``, ``"nonnegative"`` or ``"integer"`` (see :func:`run`).
    unprocessed_answers, unprocessed_estimate : numpy.ndarray
        :math:`W\hat x` and :math:`\hat x = A^+y` before post-processing (the same arrays as
        ``answers`` and ``estimate`` without it).
    timings : dict of str to float
        Seconds spent in each step: ``plan`` (choosing the strategy, optimization included, and
        its error), ``measure``, ``reconstruct``, ``answer`` and, when used, ``postprocess``. The
        time taken to check or vectorize the data is not kept: it grows with the number of
        records, which is private.
    combined : Combined or None
        For a release that builds on earlier ones (``run(..., prior=...)``): every measurement
        it was reconstructed from, and the variances of its answers from all of them. ``None``
        for a release from its own measurement alone.
    """

    plan: Plan
    measurement: Measurement
    answers: np.ndarray
    estimate: np.ndarray
    postprocess: str | None
    unprocessed_answers: np.ndarray
    unprocessed_estimate: np.ndarray
    timings: dict[str, float]
    combined: Combined | None = None

    # ------------------------------------------------------------------ provenance
    @property
    def workload(self) -> Matrix:
        """The released queries ``W`` (``m x N``), without :func:`hdmm.union` weights."""
        return self.plan.workload

    @property
    def variances(self) -> np.ndarray:
        r"""Variance of each unprocessed answer: :math:`\mathrm{Var}(z)\,\mathrm{diag}(W(A^TA)^+W^T)`, or from all
        measurements when the release builds on earlier ones (:attr:`combined`).

        Upper bounds when :attr:`variance_exact` is False.
        """
        return self.plan.variances if self.combined is None else self.combined.variances

    @property
    def std_errors(self) -> np.ndarray:
        r"""Standard error of each unprocessed answer, :math:`\sqrt{\mathrm{Var}(z)\,\mathrm{diag}(W(A^TA)^+W^T)}`.

        From all measurements when the release builds on earlier ones; an upper bound when
        :attr:`variance_exact` is False.
        """
        return np.sqrt(self.variances)

    @property
    def measurements(self) -> tuple[Measurement, ...]:
        """Every measurement the release rests on, oldest first (its own last): pass the release as ``prior=``."""
        return (self.measurement,) if self.combined is None else self.combined.measurements

    @property
    def charge(self) -> Charge | None:
        """What this release's own measurement was charged to a privacy budget, if one was given."""
        return self.measurement.charge

    @property
    def optimizer(self) -> str:
        """Who chose the strategy: an ``hdmm.optimize`` candidate's name, ``"user"``, or a file's record."""
        return self.plan.origin

    @property
    def method(self) -> str:
        """The reconstruction method (``"kronecker"``, ``"marginals"`` or ``"lsmr"``): the plan's, or the combination's."""
        return self.plan.method if self.combined is None else self.combined.method

    @property
    def variance_exact(self) -> bool:
        """True when the standard errors are exact; else upper bounds and the intervals are conservative."""
        return self.plan.variance_exact if self.combined is None else self.combined.variance_exact

    @property
    def strategy(self) -> Matrix:
        """The measured strategy ``A``."""
        return self.plan.strategy

    @property
    def privacy(self) -> Privacy:
        """The privacy definition spent by this release's own measurement (earlier ones were spent by their releases)."""
        return self.plan.privacy

    @property
    def privacy_description(self) -> str:
        """A readable statement of the guarantee, e.g. ``"pure DP, epsilon=1"``."""
        return self.privacy.description

    @property
    def seeded(self) -> bool:
        """Whether any measurement behind the release drew its noise from a seed (tests and research only)."""
        measurements = (self.measurement,) if self.combined is None else self.combined.measurements
        return any(m.seeded for m in measurements)

    def provenance(self) -> dict[str, Any]:
        """What every file written from this release records: privacy spent, strategy origin, versions.

        With a budget, ``charge`` is what the release's measurement was charged (see
        :class:`hdmm.budget.Charge`); for a release that builds on earlier ones, ``prior`` is the
        earlier release's provenance (holding its own prior's in turn) and ``measurements`` how
        many measurements it was reconstructed from (``reconstruction`` says how).
        ``workload_fingerprint`` identifies the workload released, union weights included
        (:func:`hdmm.io.workload_fingerprint`: compare it with that of the workload you meant).
        For Gaussian noise, ``calibrated_rho`` is the zCDP rho the noise is calibrated to:
        ``rho`` itself for :class:`~hdmm.ZCDP`, and for :class:`~hdmm.ApproxDP` the largest rho
        whose zCDP guarantee implies its (epsilon, delta) (:func:`hdmm.privacy.zcdp_rho`), which
        is also what it costs a zCDP budget.
        """
        out = {
            "privacy": self.privacy.to_dict(),
            "privacy_description": self.privacy_description,
            "calibrated_rho": _calibrated_rho(self.privacy),
            "workload_fingerprint": self.plan.fingerprint,
            "sensitivity": self.plan.sensitivity,
            "noise_scale": self.plan.noise_scale,
            "strategy": repr(self.strategy),
            "strategy_origin": self.plan.origin,
            "structure": self.plan.structure.form,
            "reconstruction": self.method,
            "expected_rmse": self.rmse,
            "standard_errors": "exact" if self.variance_exact else "upper bounds",
            "postprocess": self.postprocess,
            "hdmm_version": self.plan.version,
            "charge": None if self.charge is None else self.charge.to_dict(),
            "seeded": self.seeded,
        }
        if self.combined is not None:
            out.update(measurements=len(self.combined.measurements), prior=self.combined.prior)
        return out

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the release to ``path`` (a file name, written as given, or a binary file object).

        One hdmm archive (no pickle) with the plan (strategy, workload, privacy, sensitivity,
        variances), the noisy measurement, the answers and estimates, the post-processing and
        :meth:`provenance`; for a release that builds on earlier ones, also every earlier
        measurement (strategy, privacy and noisy answers), so that the loaded release can be a
        ``prior`` in turn. :meth:`load` reads it back.

        The file also holds a SHA-256 checksum of its header and every array
        (:func:`hdmm.io.archive_checksum`), which :meth:`load` verifies. It guards against accidents
        (a damaged or truncated copy, a script that changed a number, answers edited by hand);
        it does not prove who wrote the file: it has no secret key, so whoever edits the file and
        recomputes the checksum with hdmm is not detected. To prove a release's origin, sign the
        file with a key of your own, or publish its hash where readers can compare it.
        """
        arrays = {
            "measurement": self.measurement.answers,
            "answers": self.answers,
            "estimate": self.estimate,
            "unprocessed_answers": self.unprocessed_answers,
            "unprocessed_estimate": self.unprocessed_estimate,
        }
        info: dict[str, Any] = {"postprocess": self.postprocess, "timings": dict(self.timings),
                                "charge": None if self.charge is None else self.charge.to_dict(),
                                "seeded": self.measurement.seeded}
        if self.combined is not None:
            earlier = []
            for i, m in enumerate(self.combined.measurements[:-1]):
                arrays[f"prior_answers_{i}"] = m.answers
                earlier.append({"tree": encode_matrix(m.strategy, arrays), "privacy": m.privacy.to_dict(),
                                "sensitivity": m.sensitivity, "seeded": m.seeded,
                                "charge": None if m.charge is None else m.charge.to_dict()})
            info["prior"] = {"measurements": earlier, "provenance": self.combined.prior}
        header = {"format": FORMAT, "version": VERSION, "kind": "release", **plan_to_json(self.plan, arrays),
                  "release": info, "metadata": self.provenance()}
        write_archive(path, with_checksum(header, arrays), arrays)

    @staticmethod
    def load(path, *, max_bytes: int = MAX_BYTES) -> Release:
        """Read a release written by :meth:`save` (its plan validated as :meth:`hdmm.planning.Plan.load` does).

        A file larger than ``max_bytes`` is refused unread; the measurement, answers and
        estimates must be finite, one per strategy row, query and cell; earlier measurements
        are checked the same way, their sensitivities recomputed from their strategies. Then the
        file's checksum is recomputed and must match the one it records (:meth:`save` says what
        this does and does not protect against): a file whose answers, estimates, measurements
        or header were edited is refused. A file written before checksums were recorded is read
        with a warning. Last, the answers must be the workload's answers from the estimates.
        """
        header, arrays = read_archive(path, max_bytes=max_bytes)
        if header.get("kind") != "release":
            raise ValueError(f"{path} is not an hdmm release file (it holds a {header.get('kind', 'strategy')})")
        p = plan_from_json(header, arrays, source=str(path), max_bytes=max_bytes)
        try:
            info = header["release"]
            postprocess, timings = info["postprocess"], {str(k): float(v) for k, v in info["timings"].items()}
            charge = None if info.get("charge") is None else Charge.from_dict(info["charge"], str(path))
            seeded = _flag(info.get("seeded", False), "seeded")
            parts = {k: np.asarray(arrays[k], dtype=float) for k in
                     ("measurement", "answers", "estimate", "unprocessed_answers", "unprocessed_estimate")}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path} is not a valid hdmm release file: {exc}") from None
        if postprocess not in POSTPROCESS_OPTIONS:
            raise ValueError(f"{path}: unknown post-processing {postprocess!r}")
        sizes = {"measurement": p.strategy.shape[0], "answers": p.queries, "unprocessed_answers": p.queries,
                 "estimate": p.cells, "unprocessed_estimate": p.cells}
        for key, size in sizes.items():
            if parts[key].shape != (size,):
                raise ValueError(f"{path}: {key} has shape {parts[key].shape}, expected ({size},)")
            if not np.all(np.isfinite(parts[key])):
                raise ValueError(f"{path}: {key} holds NaN or infinite values; the file is damaged")
        measurement = Measurement(p.strategy, parts["measurement"], p.privacy, p.sensitivity, p.noise_scale,
                                  p.spacing, charge, seeded)
        combined = None
        if info.get("prior") is not None:
            earlier, provenance = _read_prior(info["prior"], arrays, str(path), p.cells, max_bytes)
            combined = combine(earlier + (measurement,), p.workload, prior=provenance, known=p.variances)
        check_checksum(header, arrays, path, "release")
        for answers, estimate in (("answers", "estimate"), ("unprocessed_answers", "unprocessed_estimate")):
            expected = np.asarray(p.workload @ parts[estimate], dtype=float)
            scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
            if not np.allclose(parts[answers], expected, rtol=0.0, atol=ANSWER_TOL * scale):
                raise ValueError(f"{path}: its {answers} are not the workload's answers from its {estimate}; the file "
                                 "is damaged or was edited")
        return Release(plan=p, measurement=measurement, answers=parts["answers"], estimate=parts["estimate"],
                       postprocess=postprocess, unprocessed_answers=parts["unprocessed_answers"],
                       unprocessed_estimate=parts["unprocessed_estimate"], timings=timings, combined=combined)

    # ------------------------------------------------------------------ error
    @property
    def expected_error(self) -> float:
        r"""Expected total squared error of the unprocessed answers, :math:`\sum_i \mathrm{se}_i^2`.

        The plan's, or from all measurements when the release builds on earlier ones.
        """
        return float(self.plan.error) if self.combined is None else float(np.sum(self.combined.variances))

    @property
    def rmse(self) -> float:
        """Root mean squared error per query of the unprocessed answers (expected)."""
        return self.plan.rmse if self.combined is None else math.sqrt(self.expected_error / self.plan.queries)

    @property
    def postprocess_change(self) -> float:
        """Root mean square change of the answers caused by post-processing (0 without it)."""
        return float(np.sqrt(np.mean((self.answers - self.unprocessed_answers) ** 2)))

    @property
    def interval_method(self) -> str:
        """How :meth:`intervals` are obtained: exact (Gaussian noise) or a normal approximation (Laplace)."""
        return _interval_method({m.privacy.noise for m in self.measurements}, self.variance_exact)

    def intervals(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        r"""Confidence intervals :math:`W\hat x \pm z_{(1+\text{level})/2}\,\mathrm{se}` for the true answers.

        The error :math:`W\hat x - Wx = WA^+z` is a linear combination of the noise. Under
        Gaussian noise (``ApproxDP``, ``ZCDP``) it is exactly normal, so the intervals have exactly
        the stated coverage. Under Laplace noise (``PureDP``) the same formula is a normal
        approximation: good when an answer combines many noisy measurements, while an answer
        read off a single Laplace draw has coverage about 94% at level 95% (the Laplace tail
        beyond 1.96 standard deviations is :math:`e^{-1.96\sqrt 2} \approx 6.3\%`), and the
        shortfall grows with the level: about 97.4% at 99% and 99.0% at 99.9% (ten times the
        nominal miss rate). For such answers the exact Laplace interval is
        :math:`\pm\,\mathrm{se}\,\ln(1/(1-\text{level}))/\sqrt 2`. See :attr:`interval_method`.

        The intervals are centred on the unprocessed answers, to which the standard errors
        refer; post-processing may move an answer relative to its interval.

        Returns
        -------
        (lower, upper) : tuple of numpy.ndarray
        """
        return _intervals(self.unprocessed_answers, self.std_errors, level)

    def answer(self, W: Matrix) -> Answers:
        r"""Answer another workload ``W`` from this release's estimate: post-processing, free of privacy cost.

        For a release that builds on earlier ones, ``release2.answer(W1)`` re-answers the first
        release's workload from every measurement: the answers agree with ``release2``'s
        wherever the queries overlap (both are read off one estimate), and their standard
        errors are at most ``release1``'s. ``release1`` itself is not changed (its answers may
        already be published); publish the new ones in their place if consistency matters.

        The standard errors are computed as the release's are (exact where the structure or a
        small domain allows, else upper bounds, flagged by ``variance_exact``).

        Raises
        ------
        ValueError
            If ``W`` is over another domain, or the measurements do not support it (some query
            cannot be answered without bias).
        """
        if not isinstance(W, Matrix):
            raise TypeError(f"the workload must be an hdmm matrix, got {type(W).__name__}")
        if W.shape[1] != self.plan.cells:
            raise ValueError(f"the workload has {W.shape[1]:,} columns but the release is over {self.plan.cells:,} "
                             "cells: answer queries over the release's domain")
        queries, weights = unweighted(W)
        if self.combined is None:
            own = combine(self.measurements, queries)  # refuses queries the measurement does not support
            variances, exact = own.variances, own.variance_exact
        else:
            variances, exact = self.combined.variances_of(queries)
            _check_supported(queries, variances, exact, self.combined.stacked)
        unprocessed = queries @ self.unprocessed_estimate
        answers = unprocessed if self.postprocess is None else queries @ self.estimate
        provenance = {**self.provenance(), "answered_workload_fingerprint": workload_fingerprint(W)}
        return Answers(workload=queries, answers=answers, unprocessed_answers=unprocessed,
                       std_errors=np.sqrt(variances), variance_exact=exact,
                       interval_method=_interval_method({m.privacy.noise for m in self.measurements}, exact),
                       weights=weights, provenance=provenance)

    # ------------------------------------------------------------------ views
    def table(self, level: float = 0.95) -> pd.DataFrame:
        """The release as a DataFrame, one row per workload query in row order.

        Columns: ``table`` (for a workload with named blocks, e.g. the Census tables),
        ``query`` (readable label), ``answer``, ``std_error``, ``lower`` and ``upper`` (the
        ``level`` confidence interval, see :meth:`intervals`), ``weight`` (each query's
        :func:`hdmm.union` weight, what it meant to the optimizer; the answer is the query's own
        count) when the workload has weights, and ``unprocessed_answer`` when post-processed.
        ``DataFrame.attrs`` records the level, :attr:`interval_method` and :meth:`provenance`.
        """
        return _table(self.workload, self.answers, None if self.postprocess is None else self.unprocessed_answers,
                      self.std_errors, self.plan.weights, level,
                      {"interval_method": self.interval_method, "provenance": self.provenance()})

    def summary(self) -> str:
        """A few readable lines: sizes, privacy, strategy, error, post-processing and timings."""
        m = self.measurement
        lines = [
            f"Release of {self.answers.size:,} queries over {self.workload.shape[1]:,} cells",
            f"  privacy: {self.privacy_description} ({self.privacy.noise.name} noise, sensitivity "
            f"{m.sensitivity:.6g}, scale {m.noise_scale:.6g})",
            f"  strategy: {self.strategy!r} from {self.optimizer}; reconstructed by {self.method}",
            f"  expected RMSE per query: {self.rmse:.6g}"
            + ("" if self.variance_exact else " (upper bound)"),
            f"  intervals: {self.interval_method}",
        ]
        if self.combined is not None:
            alone = "" if self.plan.variances is None else (
                f"; expected RMSE from this release's measurement alone {self.plan.rmse:.6g}")
            lines.insert(4, f"  built on earlier releases: reconstructed from {len(self.combined.measurements)} "
                         f"measurements by generalized least squares{alone}")
        if self.charge is not None:
            c = self.charge
            lines.insert(2, f"  budget charge {c.number}: {c.unit} {float(c.cost):.6g} ({c.status})")
        if self.seeded:
            lines.insert(2, "  noise: from a seed (reproducible, for tests and research only: not a private release)")
        if self.postprocess is not None:
            lines.append(
                f"  post-processing: {self.postprocess}; answers moved by {self.postprocess_change:.6g} RMS "
                f"({self.postprocess_change / self.rmse if self.rmse > 0 else math.inf:.3g} x the RMSE); "
                "standard errors and intervals refer to the unprocessed estimate"
            )
        lines.append("  seconds: " + ", ".join(f"{k} {v:.3g}" for k, v in self.timings.items()))
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        post = "" if self.postprocess is None else f", postprocess={self.postprocess!r}"
        return (
            f"Release({self.answers.size:,} answers; {self.privacy_description}; strategy from {self.optimizer}; "
            f"RMSE {self.rmse:.4g}{'' if self.variance_exact else ' (bound)'}{post})"
        )


def _read_prior(info: Any, arrays: dict[str, np.ndarray], source: str, cells: int,
                max_bytes: int = MAX_BYTES) -> tuple[tuple[Measurement, ...], dict]:
    """The earlier measurements and the prior's provenance a release file holds (see :meth:`Release.save`)."""
    try:
        entries, provenance = info["measurements"], info["provenance"]
        if not isinstance(entries, list) or not isinstance(provenance, dict):
            raise TypeError("'measurements' must be a list and 'provenance' an object")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{source} is not a valid hdmm release file: its earlier measurements are malformed ({exc})") \
            from None
    out = []
    for i, entry in enumerate(entries):
        where = f"{source}: earlier measurement {i + 1}"
        try:
            A = decode_matrix(entry["tree"], arrays, source=where, max_bytes=max_bytes)
            privacy = Privacy.from_dict(entry["privacy"])
            stored = float(entry["sensitivity"])
            answers = np.asarray(arrays[f"prior_answers_{i}"], dtype=float)
            charge = None if entry.get("charge") is None else Charge.from_dict(entry["charge"], where)
            seeded = _flag(entry.get("seeded", False), "seeded")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where} is not valid: {exc}") from None
        if A.shape[1] != cells:
            raise ValueError(f"{where} is over {A.shape[1]:,} cells, not the release's {cells:,}")
        if answers.shape != (A.shape[0],) or not np.all(np.isfinite(answers)):
            raise ValueError(f"{where}: its answers are not one finite number per strategy row")
        p = strategy_plan(A, privacy)  # the sensitivity and noise scale, recomputed from the strategy
        if not math.isclose(p.sensitivity, stored, rel_tol=1e-8):
            raise ValueError(f"{where}: the stored sensitivity {stored!r} is not the strategy's ({p.sensitivity!r}); "
                             "the file is damaged or was edited")
        out.append(Measurement(A, answers, privacy, p.sensitivity, p.noise_scale, p.spacing, charge, seeded))
    return tuple(out), provenance


#: Largest difference, relative to the largest answer (at least 1), between a loaded release's answers and the
#: workload's answers recomputed from its estimate (floating-point rounding of the same product).
ANSWER_TOL = 1e-9


def _flag(value: Any, name: str) -> bool:
    """A true/false entry of a release file."""
    if not isinstance(value, bool):
        raise ValueError(f"'{name}' must be true or false, got {value!r}")
    return value


# ====================================================================== run
def _data_vector(data, domain: Domain | None, n: int) -> Counts:
    if domain is not None:
        if not isinstance(domain, Domain):
            raise TypeError(f"domain must be an hdmm.Domain, got {type(domain).__name__}")
        if domain.size != n:
            raise ValueError(
                f"the domain {domain!r} has {domain.size:,} cells but the workload has {n:,} columns; "
                "pass the domain the workload was built over"
            )
    if isinstance(data, pd.DataFrame):
        if domain is None:
            raise ValueError(
                "data is a DataFrame of records, so pass domain=<hdmm.Domain> to say how each record "
                "maps to a cell (or pass the data vector itself)"
            )
        data = domain.vectorize(data)
    return Counts.check(data, n)


def run(
    W: Matrix,
    data,
    privacy: Privacy,
    strategy: str | Matrix | OptimizationResult | Plan = "auto",
    domain: Domain | None = None,
    rng: None | int | np.random.Generator = None,
    *,
    method: str = "auto",
    postprocess: str | None = None,
    reconstruct_options: Mapping[str, Any] | None = None,
    budget: Budget | None = None,
    prior: Release | None = None,
    label: str | None = None,
) -> Release:
    r"""Release the answers to workload ``W`` on ``data`` under ``privacy`` (the matrix mechanism).

    Steps: check the data; make the data-independent plan (:func:`hdmm.plan`: the strategy,
    its sensitivity and structure, the check that it supports ``W`` and the per-query
    variances), all before any noise is drawn; measure :math:`y = Ax + z`
    (:func:`hdmm.measure`); reconstruct :math:`\hat x = A^+y` (:func:`hdmm.reconstruct`); answer
    :math:`W\hat x`; optionally post-process :math:`\hat x`. :func:`hdmm.union` weights steer the
    optimizer only: the release answers the queries themselves.

    Parameters
    ----------
    W
        The workload, an implicit ``m x N`` matrix.
    data
        The data vector (``N`` finite, non-negative counts, C order over the domain), or a
        pandas DataFrame of records (one row per record, one column per attribute), which
        needs ``domain``.
    privacy
        :class:`~hdmm.PureDP` (Laplace noise), :class:`~hdmm.ApproxDP` or :class:`~hdmm.ZCDP`
        (Gaussian noise). The whole budget is spent on one measurement of the strategy.
    strategy
        ``"auto"`` (default): run :func:`hdmm.optimize` (data independent, so free of privacy
        cost) and use its best strategy. An hdmm matrix: used as given (``optimizer="user"``).
        An :class:`~hdmm.optimizers.OptimizationResult`: its strategy and optimizer name (a warning if it
        was optimised for the other kind of noise). A :class:`~hdmm.planning.Plan` made for this
        workload and privacy (e.g. loaded with :meth:`hdmm.planning.Plan.load`): used as it is.
    domain
        The :class:`~hdmm.Domain` of the records; required for DataFrame input, checked against
        ``W`` when given.
    rng
        ``None`` (default): fresh OS entropy, as any real release must use. An int seed or a
        ``numpy.random.Generator`` makes the optimizer's random starts and the noise
        reproducible: for tests and reproducible research only (a known seed reveals the noise).
    method
        Reconstruction method (``"auto"``, ``"kronecker"``, ``"marginals"``, ``"lsmr"``); see
        :func:`~hdmm.mechanism.reconstruct`.
    postprocess
        ``None`` (default): release :math:`W\hat x`. ``"nonnegative"``: replace :math:`\hat x` by the
        non-negative data vector with the same total that best fits the noisy measurements,
        :math:`\arg\min \|A(v - \hat x)\|` over :math:`v \ge 0,\ \sum v = \sum \hat x`
        (:func:`nonnegative_least_squares`; a negative released total becomes 0). ``"integer"``:
        that vector, then largest-remainder rounding to non-negative integer counts that keep the
        rounded total (:func:`round_to_total`); each cell moves by less than 1, but on sparse
        data the roundings of many cells add up in large aggregates. Post-processing costs no privacy, but it biases
        the answers: :attr:`Release.postprocess_change` reports the RMS change it caused, and the
        standard errors and intervals still refer to the unprocessed answers (also kept in the
        release).
    reconstruct_options
        Extra keywords for :func:`~hdmm.mechanism.reconstruct` (``x0``, ``tol``, ``maxiter``); LSMR
        is stopped once more iterations move no workload answer by more than ``tol`` (default 1%)
        of its standard error.
    budget
        A :class:`~hdmm.Budget` to charge ``privacy`` to. Checked first (a release the budget
        cannot pay for, or whose privacy does not compose with it, is refused before any
        optimization), and charged by :func:`hdmm.measure` once the data is checked and before
        any noise is drawn (a budget file is written then). When the release is complete the
        charge is marked ``"released"`` (:meth:`hdmm.Budget.settle`); it is recorded in the
        release (:attr:`Release.charge`, :meth:`Release.provenance`).
    prior
        An earlier :class:`Release` **of the same data** to build on: the new measurement and
        every measurement the prior rests on are reconstructed together by generalized least
        squares (the module docstring), so the answers agree with :meth:`Release.answer` of any
        earlier workload and have smaller errors. Only the new measurement is charged to
        ``budget``. hdmm cannot check privately that the data is the same (it checks the
        domain size): reconstructing measurements of different data together gives
        meaningless answers. The reconstruction route is chosen for the stacked measurements
        (``method`` applies to the new plan); the new strategy must support ``W`` by itself.
    label
        What ``budget`` records as the release's workload (default: the workload's ``repr``).

    Returns
    -------
    Release

    Raises
    ------
    ValueError
        Bad data (shape, NaN, negative counts), a DataFrame without a domain, a strategy over
        another domain or that does not support the workload, an unknown ``method`` or
        ``postprocess``, a ``prior`` over another domain.
    hdmm.budget.BudgetError
        A release ``budget`` cannot pay for (:class:`~hdmm.budget.BudgetExceeded`) or whose
        privacy does not compose with it; nothing is measured.

    Notes
    -----
    The standard errors are exact for Kronecker, marginals-algebra and (on small domains) any
    strategies. For a union of Kronecker products on a domain too large for a dense
    pseudo-inverse they are upper bounds: least squares (the best linear unbiased estimator,
    by Gauss-Markov) does at least as well as answering each query from the single term of the
    union that does so best, whose variance is exact and cheap.
    """
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    check_inputs(W, privacy, method)
    if postprocess not in POSTPROCESS_OPTIONS:
        raise ValueError(f"postprocess must be one of {list(POSTPROCESS_OPTIONS)}, got {postprocess!r}")
    options = dict(reconstruct_options or {})
    unknown = set(options) - {"x0", "tol", "maxiter"}
    if unknown:
        raise TypeError(f"reconstruct_options takes x0, tol and maxiter, got {sorted(unknown)}")
    if budget is not None:
        if not isinstance(budget, Budget):
            raise TypeError(f"budget must be an hdmm.Budget, got {type(budget).__name__}")
        budget.check(privacy)  # refused now, before optimizing; charged by measure, before the noise
    if prior is not None:
        if not isinstance(prior, Release):
            raise TypeError(f"prior must be an hdmm Release (from hdmm.run or Release.load), got {type(prior).__name__}")
        if prior.plan.cells != W.shape[1]:
            raise ValueError(f"the prior release is over {prior.plan.cells:,} cells but the workload has "
                             f"{W.shape[1]:,} columns: a release can only build on releases of the same data over the "
                             "same domain")
    x = _data_vector(data, domain, W.shape[1])
    generator = as_generator(rng)
    clock = time.perf_counter()  # the time taken to read the data grows with the records: private, not kept
    if isinstance(strategy, Plan):
        chosen = _check_plan(strategy, W, privacy, method)
    elif prior is not None and isinstance(strategy, Matrix):
        chosen = _measurement_plan(W, strategy, privacy, method)
    else:
        chosen = make_plan(W, strategy, privacy, method=method, seed=generator)
    combined = None
    if prior is not None:  # before any noise: the measurements must support the workload together
        pending = Measurement(chosen.strategy, np.zeros(chosen.strategy.shape[0]), privacy, chosen.sensitivity,
                              chosen.noise_scale, chosen.spacing)
        combined = combine(prior.measurements + (pending,), chosen.workload, prior=prior.provenance(),
                           known=chosen.variances)
    chosen.fingerprint  # recorded in the release's provenance: computed now, so that it cannot fail after the noise
    lap("plan")
    # None: the OS's cryptographic source
    measurement = measure(chosen, x, None if rng is None else generator, budget=budget, label=label)
    lap("measure")
    if combined is None:
        estimate = reconstruct(chosen, measurement, **options)
        fit, fit_std = measurement.strategy, measurement.noise_std
    else:
        combined = combined.with_last(measurement)
        options.setdefault("x0", prior.unprocessed_estimate if combined.method == "lsmr" else None)
        estimate = least_squares(combined.stacked, combined.answers, combined.method, combined.structure,
                                 noise_std=1.0, workload=chosen.workload, std_errors=np.sqrt(combined.variances),
                                 **options)
        fit, fit_std = combined.stacked, 1.0
    lap("reconstruct")
    answers = chosen.workload @ estimate
    lap("answer")
    final_estimate, final_answers = estimate, answers
    if postprocess is not None:
        final_estimate = _postprocess(fit, fit_std, estimate, postprocess)
        final_answers = chosen.workload @ final_estimate
        lap("postprocess")
    if budget is not None:  # the release is complete: its charge (written before the noise) is marked so
        settled = settle_quietly(budget, measurement.charge)
        if settled is not None:
            measurement = dataclasses.replace(measurement, charge=settled)
            if combined is not None:
                combined = dataclasses.replace(combined, measurements=combined.measurements[:-1] + (measurement,))
    return Release(
        plan=chosen,
        measurement=measurement,
        answers=final_answers,
        estimate=final_estimate,
        postprocess=postprocess,
        unprocessed_answers=answers,
        unprocessed_estimate=estimate,
        timings=timings,
        combined=combined,
    )


def _measurement_plan(W: Matrix, A: Matrix, privacy: Privacy, method: str) -> Plan:
    """The plan of a release that builds on earlier ones with strategy ``A``.

    ``A`` need only support ``W`` together with the earlier measurements (checked by
    :func:`combine` before any noise). The plan's variances are those of ``A`` alone when it
    supports ``W`` by itself (exact, or upper bounds as :func:`hdmm.plan` computes them), else
    ``None``; the release's come from all measurements.
    """
    if A.shape[1] != W.shape[1]:
        raise ValueError(f"the strategy has {A.shape[1]:,} columns but the workload has {W.shape[1]:,}: both must be "
                         "over the same domain")
    p = strategy_plan(A, privacy)
    queries, weights = unweighted(W)
    resolved = reconstruction_method(A, method, structure=p.structure)
    unit, exact = unit_variances_or_bounds(queries, A, p.structure)
    variances = privacy.noise_variance(p.sensitivity) * unit if np.all(np.isfinite(unit)) else None
    return dataclasses.replace(p, workload=queries, weights=weights, method=resolved, variances=variances,
                               variance_exact=exact)


def _check_plan(p: Plan, W: Matrix, privacy: Privacy, method: str) -> Plan:
    """A plan passed to :func:`run` must be for this workload and this privacy definition.

    The workload is compared by fingerprint (:func:`hdmm.io.workload_fingerprint`: queries, labels,
    weights and the number of cells; for a Kronecker workload its factors and attribute names),
    so a plan made for another workload of the same shape, or over another domain of the same
    size, is refused before any noise.
    """
    if p.workload.shape[1] != W.shape[1] or p.queries != W.shape[0]:
        raise ValueError(
            f"the plan is for {p.queries:,} queries over {p.cells:,} cells but the workload has "
            f"{W.shape[0]:,} queries over {W.shape[1]:,} cells: make the plan for this workload"
        )
    if p.strategy.shape[1] != W.shape[1]:
        raise ValueError(f"the plan's strategy {p.strategy!r} is over {p.strategy.shape[1]:,} cells but the workload "
                         f"has {W.shape[1]:,}: the strategy was made for another domain; make the plan again with "
                         "hdmm.plan(W, strategy, privacy) and a strategy over this domain; nothing was measured")
    given = workload_fingerprint(W)
    if p.fingerprint != given:
        raise ValueError(
            f"the plan was made for another workload: it answers {p.workload!r} (workload fingerprint "
            f"{p.fingerprint}) but the release is of {W!r} (fingerprint {given}), with other queries, labels or "
            "weights; make the plan for this workload (hdmm.plan(W, plan.strategy, privacy)), or release the "
            "workload the plan was made for; nothing was measured"
        )
    if p.privacy != privacy:
        raise ValueError(
            f"the plan was made for {p.privacy.description} but the release asks for {privacy.description}; "
            "make a plan for the privacy you spend (hdmm.plan(W, plan.strategy, privacy))"
        )
    if method not in ("auto", p.method):
        raise ValueError(f"the plan reconstructs by {p.method!r}; method={method!r} contradicts it")
    return p
