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
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.stats import norm

from .domain import Domain
from .kernel import Counts, as_generator, measure
from .matrix import Matrix, VStack
from .mechanism import Measurement, reconstruct
from .optimizers import OptimizationResult
from .planning import Plan, check_inputs, plan_from_json, plan_to_json
from .postprocess import nonnegative_least_squares, round_to_total
from .io import FORMAT, MAX_BYTES, VERSION, read_archive, write_archive
from .planning import plan as make_plan
from .privacy import Privacy

__all__ = ["Release", "run", "POSTPROCESS_OPTIONS", "table_names"]

#: The values ``run(postprocess=...)`` accepts.
POSTPROCESS_OPTIONS = (None, "nonnegative", "integer")


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

    # ------------------------------------------------------------------ files
    def save(self, path) -> None:
        """Write the release to ``path`` (a file name, written as given, or a binary file object).

        One hdmm archive (no pickle) with the plan (strategy, workload, privacy, sensitivity,
        variances), the noisy measurement, the answers and estimates, the post-processing and
        :meth:`provenance`. :meth:`load` reads it back.
        """
        arrays = {
            "measurement": self.measurement.answers,
            "answers": self.answers,
            "estimate": self.estimate,
            "unprocessed_answers": self.unprocessed_answers,
            "unprocessed_estimate": self.unprocessed_estimate,
        }
        header = {"format": FORMAT, "version": VERSION, "kind": "release", **plan_to_json(self.plan, arrays),
                  "release": {"postprocess": self.postprocess, "timings": dict(self.timings)},
                  "metadata": self.provenance()}
        write_archive(path, header, arrays)

    @staticmethod
    def load(path, *, max_bytes: int = MAX_BYTES) -> Release:
        """Read a release written by :meth:`save` (its plan validated as :meth:`hdmm.Plan.load` does).

        A file larger than ``max_bytes`` is refused unread; the measurement, answers and
        estimates must be finite, one per strategy row, query and cell.
        """
        header, arrays = read_archive(path, max_bytes=max_bytes)
        if header.get("kind") != "release":
            raise ValueError(f"{path} is not an hdmm release file (it holds a {header.get('kind', 'strategy')})")
        p = plan_from_json(header, arrays, source=str(path))
        try:
            info = header["release"]
            postprocess, timings = info["postprocess"], {str(k): float(v) for k, v in info["timings"].items()}
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
        measurement = Measurement(p.strategy, parts["measurement"], p.privacy, p.sensitivity, p.noise_scale)
        return Release(plan=p, measurement=measurement, answers=parts["answers"], estimate=parts["estimate"],
                       postprocess=postprocess, unprocessed_answers=parts["unprocessed_answers"],
                       unprocessed_estimate=parts["unprocessed_estimate"], timings=timings)

    # ------------------------------------------------------------------ error
    @property
    def expected_error(self) -> float:
        r"""Expected total squared error of the unprocessed answers, :math:`\sum_i \mathrm{se}_i^2` (the plan's)."""
        return float(self.plan.error)

    @property
    def rmse(self) -> float:
        """Root mean squared error per query of the unprocessed answers (expected; the plan's)."""
        return self.plan.rmse

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

    check_inputs(W, privacy, method)
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
    measurement = measure(chosen, x, None if rng is None else generator)  # None: the OS's cryptographic source
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
