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
"""

from __future__ import annotations

import math
import numbers
import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.stats import norm

from .domain import Domain
from .kernel import as_generator, check_data_vector, measure
from .matrix import Matrix, VStack
from .mechanism import Measurement, reconstruct
from .optimizers import OptimizationResult
from .planning import Plan
from .planning import plan as make_plan
from .privacy import Privacy

__all__ = [
    "Release",
    "run",
    "POSTPROCESS_OPTIONS",
    "nonnegative_least_squares",
    "project_nonnegative",
    "round_to_total",
]

#: The values ``run(postprocess=...)`` accepts.
POSTPROCESS_OPTIONS = (None, "nonnegative", "integer")


# ====================================================================== post-processing
#: Non-negative least squares stops when a step moves the fitted strategy answers by less than
#: this many noise standard deviations (root mean square over the answers) ...
NONNEGATIVE_TOL = 1e-3

#: ... or after this many accelerated projected-gradient steps (with a warning).
NONNEGATIVE_MAXITER = 3000


def project_nonnegative(x: np.ndarray, total: float | None = None) -> np.ndarray:
    r"""The closest non-negative vector with a given total (Euclidean projection).

    Solves :math:`\min_v \|v - x\|_2` subject to :math:`v \ge 0,\ \sum_j v_j = t` with
    :math:`t = \max(\text{total}, 0)` (``total`` defaults to :math:`\sum_j x_j`). The solution
    is :math:`v = \max(x - \theta, 0)` for the unique :math:`\theta` giving the total, found by
    Michelot's algorithm: :math:`\theta = (\sum_{j \in S} x_j - t)/|S|` over the cells
    :math:`S = \{j: x_j \ge \theta\}` not below it, repeated until :math:`S` stops shrinking
    (:math:`\theta` only grows, so it ends after a few passes of :math:`O(N)`).
    """
    x = np.asarray(x, dtype=np.float64)
    t = max(float(np.sum(x) if total is None else total), 0.0)
    if t == 0.0:
        return np.zeros_like(x)
    count, kept = x.size, float(np.sum(x))
    while True:
        theta = (kept - t) / count
        above = x >= theta  # never empty: theta is at most the mean of the cells kept
        if int(above.sum()) == count:
            return np.maximum(x - theta, 0.0)
        count, kept = int(above.sum()), float(np.sum(x[above]))


def _largest_gram_eigenvalue(A: Matrix, iterations: int = 30) -> float:
    r"""An estimate of :math:`\|A\|_2^2` by power iteration on :math:`A^TA` (from below, so padded)."""
    u = np.random.default_rng(0).random(A.shape[1]) + 1.0  # data independent
    lam = 0.0
    for _ in range(iterations):
        u = A.T @ (A @ (u / np.linalg.norm(u)))
        lam = float(np.linalg.norm(u))
        if lam == 0.0:
            break
    return 1.1 * lam


def nonnegative_least_squares(
    A: Matrix, estimate: np.ndarray, noise_std: float, tol: float = NONNEGATIVE_TOL, maxiter: int = NONNEGATIVE_MAXITER
) -> np.ndarray:
    r"""The non-negative data vector with the released total that best fits the measurements.

    .. math:: v = \arg\min_v \|A(v - \hat x)\|_2 \quad \text{s.t.} \quad v \ge 0,\;
              \textstyle\sum_j v_j = t = \max(\sum_j \hat x_j, 0),

    which is least squares on the noisy answers, :math:`\|Av - y\|^2 = \|A(v - \hat x)\|^2 +
    \text{const}`, restricted to valid data vectors. Measuring the distance through ``A`` (not
    cell by cell) moves the well-measured directions, and so the workload answers, far less than
    a Euclidean projection of :math:`\hat x` would: that one shifts and clips every noisy cell,
    which biases large aggregates of sparse cells badly. Solved by accelerated projected
    gradient (FISTA with adaptive restart, step :math:`1/\|A\|_2^2`), projecting onto the
    constraints with :func:`project_nonnegative`; it stops when one step moves the fitted
    strategy answers by at most ``tol`` noise standard deviations (root mean square per answer),
    and warns if ``maxiter`` steps come first.
    """
    t = max(float(np.sum(estimate)), 0.0)
    v = project_nonnegative(estimate, t)
    L = _largest_gram_eigenvalue(A)
    if t == 0.0 or L == 0.0:
        return v
    target = A @ estimate
    Av = A @ v
    f = 0.5 * float(np.sum((Av - target) ** 2))
    w, Aw, momentum = v, Av, 1.0
    threshold = tol * noise_std * math.sqrt(A.shape[0])
    change = math.inf  # stays so if no step ever descends
    for _ in range(maxiter):
        step = project_nonnegative(w - (A.T @ (Aw - target)) / L, t)
        A_step = A @ step
        f_step = 0.5 * float(np.sum((A_step - target) ** 2))
        if f_step > f:  # no descent: drop the momentum; if a plain step fails, the step size was too long
            if w is v:
                L *= 2.0
            w, Aw, momentum = v, Av, 1.0
            continue
        change = float(np.linalg.norm(A_step - Av))
        following = (1.0 + math.sqrt(1.0 + 4.0 * momentum**2)) / 2.0
        beta = (momentum - 1.0) / following
        w, Aw = step + beta * (step - v), A_step + beta * (A_step - Av)
        v, Av, f, momentum = step, A_step, f_step, following
        if change <= threshold:
            return v
    warnings.warn(
        f"non-negative least squares stopped after {maxiter:,} steps with the last step moving the fitted "
        f"strategy answers by {change / math.sqrt(A.shape[0]) / noise_std:.3g} noise standard deviations "
        f"(RMS; target {tol:g}); the post-processed answers are valid but not fully optimised",
        RuntimeWarning,
        stacklevel=3,
    )
    return v


def round_to_total(x: np.ndarray) -> np.ndarray:
    r"""Integers from non-negative ``x`` by largest-remainder rounding, keeping the rounded total.

    Every cell gets :math:`\lfloor x_j \rfloor`; the :math:`\mathrm{round}(\sum_j x_j) - \sum_j
    \lfloor x_j \rfloor` cells with the largest remainders :math:`x_j - \lfloor x_j \rfloor` get one
    more. Each cell moves by less than 1 and the total becomes the rounded total.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.any(x < 0):
        raise ValueError("largest-remainder rounding needs non-negative values; project them first")
    floor = np.floor(x)
    missing = int(round(float(np.sum(x)))) - int(np.sum(floor))
    if missing > 0:
        floor[np.argpartition(floor - x, missing - 1)[:missing]] += 1.0
    return floor


def _postprocess(measurement: Measurement, estimate: np.ndarray, kind: str) -> np.ndarray:
    nonnegative = nonnegative_least_squares(measurement.strategy, estimate, measurement.noise_std)
    return nonnegative if kind == "nonnegative" else round_to_total(nonnegative)


# ====================================================================== the release
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
        Seconds spent in each step: ``data`` (checking or vectorizing it), ``plan`` (choosing
        the strategy, optimization included, and its error), ``measure``, ``reconstruct``,
        ``answer`` and, when used, ``postprocess``.
    """

    plan: Plan
    measurement: Measurement
    answers: np.ndarray
    estimate: np.ndarray
    postprocess: str | None
    unprocessed_answers: np.ndarray
    unprocessed_estimate: np.ndarray
    timings: dict[str, float]

    # ------------------------------------------------------------------ provenance
    @property
    def workload(self) -> Matrix:
        """The released queries ``W`` (``m x N``), without :func:`hdmm.union` weights."""
        return self.plan.workload

    @property
    def std_errors(self) -> np.ndarray:
        r"""Standard error of each unprocessed answer, :math:`\sqrt{\mathrm{Var}(z)\,\mathrm{diag}(W(A^TA)^+W^T)}`.

        An upper bound when :attr:`variance_exact` is False.
        """
        return self.plan.std_errors

    @property
    def optimizer(self) -> str:
        """Who chose the strategy: an ``hdmm.optimize`` candidate's name, ``"user"``, or a file's record."""
        return self.plan.origin

    @property
    def method(self) -> str:
        """The reconstruction method (``"kronecker"``, ``"marginals"`` or ``"lsmr"``)."""
        return self.plan.method

    @property
    def variance_exact(self) -> bool:
        """True when the standard errors are exact; else upper bounds and the intervals are conservative."""
        return self.plan.variance_exact

    @property
    def strategy(self) -> Matrix:
        """The measured strategy ``A``."""
        return self.plan.strategy

    @property
    def privacy(self) -> Privacy:
        """The privacy definition spent by this release (the whole budget, spent once)."""
        return self.plan.privacy

    @property
    def privacy_description(self) -> str:
        """A readable statement of the guarantee, e.g. ``"pure DP, epsilon=1"``."""
        return self.privacy.description

    def provenance(self) -> dict[str, Any]:
        """What every file written from this release records: privacy spent, strategy origin, versions."""
        return {
            "privacy": self.privacy.to_dict(),
            "privacy_description": self.privacy_description,
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
        }

    # ------------------------------------------------------------------ error
    @property
    def expected_error(self) -> float:
        r"""Expected total squared error of the unprocessed answers, :math:`\sum_i \mathrm{se}_i^2`."""
        return float(np.sum(self.std_errors**2))

    @property
    def rmse(self) -> float:
        """Root mean squared error per query of the unprocessed answers (expected)."""
        return math.sqrt(self.expected_error / self.answers.size)

    @property
    def postprocess_change(self) -> float:
        """Root mean square change of the answers caused by post-processing (0 without it)."""
        return float(np.sqrt(np.mean((self.answers - self.unprocessed_answers) ** 2)))

    @property
    def interval_method(self) -> str:
        """How :meth:`intervals` are obtained: exact (Gaussian noise) or a normal approximation (Laplace)."""
        if self.privacy.noise == "gaussian":
            text = "exact (Gaussian noise)"
        else:
            text = "normal approximation (Laplace noise)"
        if not self.variance_exact:
            text += "; conservative (standard errors are upper bounds)"
        return text

    def intervals(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        r"""Confidence intervals :math:`W\hat x \pm z_{(1+\text{level})/2}\,\mathrm{se}` for the true answers.

        The error :math:`W\hat x - Wx = WA^+z` is a linear combination of the noise. Under
        Gaussian noise (``ApproxDP``, ``ZCDP``) it is exactly normal, so the intervals have exactly
        the stated coverage. Under Laplace noise (``PureDP``) the same formula is a normal
        approximation: good when an answer combines many noisy measurements, while an answer
        read off a single Laplace draw has coverage about 94% at level 95% (the Laplace tail
        beyond 1.96 standard deviations is :math:`e^{-1.96\sqrt 2} \approx 6.3\%`). See
        :attr:`interval_method`.

        The intervals are centred on the unprocessed answers, to which the standard errors
        refer; post-processing may move an answer relative to its interval.

        Returns
        -------
        (lower, upper) : tuple of numpy.ndarray
        """
        if isinstance(level, bool) or not (isinstance(level, numbers.Real) and 0 < level < 1):
            raise ValueError(f"level must be a number strictly between 0 and 1 (e.g. 0.95), got {level!r}")
        half = norm.ppf(0.5 + level / 2) * self.std_errors
        return self.unprocessed_answers - half, self.unprocessed_answers + half

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
        lower, upper = self.intervals(level)
        columns: dict[str, Any] = {}
        W = self.workload
        tables = table_names(W)
        if tables is not None:
            columns["table"] = tables
        columns["query"] = list(W.labels)
        columns["answer"] = self.answers
        columns["std_error"] = self.std_errors
        columns["lower"] = lower
        columns["upper"] = upper
        if self.plan.weights is not None:
            columns["weight"] = self.plan.weights
        if self.postprocess is not None:
            columns["unprocessed_answer"] = self.unprocessed_answers
        df = pd.DataFrame(columns)
        df.attrs["level"] = level
        df.attrs["interval_method"] = self.interval_method
        df.attrs["provenance"] = self.provenance()
        return df

    def summary(self) -> str:
        """A few readable lines: sizes, privacy, strategy, error, post-processing and timings."""
        m = self.measurement
        lines = [
            f"Release of {self.answers.size:,} queries over {self.workload.shape[1]:,} cells",
            f"  privacy: {self.privacy_description} ({self.privacy.noise} noise, sensitivity "
            f"{m.sensitivity:.6g}, scale {m.noise_scale:.6g})",
            f"  strategy: {self.strategy!r} from {self.optimizer}; reconstructed by {self.method}",
            f"  expected RMSE per query: {self.rmse:.6g}"
            + ("" if self.variance_exact else " (upper bound)"),
            f"  intervals: {self.interval_method}",
        ]
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


# ====================================================================== run
def _data_vector(data, domain: Domain | None, n: int) -> np.ndarray:
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
        return domain.vectorize(data)
    return check_data_vector(data, n)


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
        An :class:`~hdmm.OptimizationResult`: its strategy and optimizer name (a warning if it
        was optimised for the other kind of noise). A :class:`~hdmm.Plan` made for this
        workload and privacy (e.g. loaded with :meth:`hdmm.Plan.load`): used as it is.
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

    Returns
    -------
    Release

    Raises
    ------
    ValueError
        Bad data (shape, NaN, negative counts), a DataFrame without a domain, a strategy over
        another domain or that does not support the workload, an unknown ``method`` or
        ``postprocess``.

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

    if not isinstance(W, Matrix):
        raise TypeError(f"the workload must be an hdmm matrix, got {type(W).__name__}")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    if postprocess not in POSTPROCESS_OPTIONS:
        raise ValueError(f"postprocess must be one of {list(POSTPROCESS_OPTIONS)}, got {postprocess!r}")
    options = dict(reconstruct_options or {})
    unknown = set(options) - {"x0", "tol", "maxiter"}
    if unknown:
        raise TypeError(f"reconstruct_options takes x0, tol and maxiter, got {sorted(unknown)}")
    x = _data_vector(data, domain, W.shape[1])
    generator = as_generator(rng)
    lap("data")
    if isinstance(strategy, Plan):
        chosen = _check_plan(strategy, W, privacy, method)
    else:
        chosen = make_plan(W, strategy, privacy, method=method, seed=generator)
    lap("plan")
    measurement = measure(chosen, x, generator)
    lap("measure")
    estimate = reconstruct(chosen, measurement, **options)
    lap("reconstruct")
    answers = chosen.workload @ estimate
    lap("answer")
    final_estimate, final_answers = estimate, answers
    if postprocess is not None:
        final_estimate = _postprocess(measurement, estimate, postprocess)
        final_answers = chosen.workload @ final_estimate
        lap("postprocess")
    return Release(
        plan=chosen,
        measurement=measurement,
        answers=final_answers,
        estimate=final_estimate,
        postprocess=postprocess,
        unprocessed_answers=answers,
        unprocessed_estimate=estimate,
        timings=timings,
    )


def _check_plan(p: Plan, W: Matrix, privacy: Privacy, method: str) -> Plan:
    """A plan passed to :func:`run` must be for this workload's domain and this privacy definition."""
    if p.workload.shape[1] != W.shape[1] or p.queries != W.shape[0]:
        raise ValueError(
            f"the plan is for {p.queries:,} queries over {p.cells:,} cells but the workload has "
            f"{W.shape[0]:,} queries over {W.shape[1]:,} cells: make the plan for this workload"
        )
    if p.privacy != privacy:
        raise ValueError(
            f"the plan was made for {p.privacy.description} but the release asks for {privacy.description}; "
            "make a plan for the privacy you spend (hdmm.plan(W, plan.strategy, privacy))"
        )
    if method not in ("auto", p.method):
        raise ValueError(f"the plan reconstructs by {p.method!r}; method={method!r} contradicts it")
    return p
