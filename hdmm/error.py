r"""Expected error of answering a workload with a strategy (docs/math.md, sections 1, 2, 3 and 6).

The matrix mechanism measures :math:`y = Ax + z` and answers :math:`W A^+ y`. Its error is
data independent:

.. math:: \mathrm{TSE}(W, A) = \mathrm{Var}(z)\,\mathrm{tr}\big((A^TA)^+ W^TW\big), \qquad
          \mathrm{Var}(z) = \text{noise variance at sensitivity } \Delta_p(A),

per query :math:`\mathrm{Var}(z)\,\mathrm{diag}(W (A^TA)^+ W^T)`, and
:math:`\mathrm{RMSE} = \sqrt{\mathrm{TSE}/m}`. It is finite only when ``A`` supports ``W``
(:math:`W A^+ A = W`).

Five exact routes, one per form of ``A`` (:func:`hdmm.structure.classify`), never forming an
``N x N`` matrix:

* **Kronecker strategy** :math:`A = \bigotimes_i A_i` (the identity included) and any union
  of Kronecker products :math:`W = \mathrm{VStack}_j\, c_j \bigotimes_i W_i^{(j)}`:
  :math:`\mathrm{tr} = \sum_j c_j^2 \prod_i \mathrm{tr}\big((A_i^TA_i)^+ G_i^{(j)}\big)`,
  one small trace per distinct factor.
* **Marginals-algebra strategy** (weighted marginals, or any union whose factor Grams are
  :math:`aI + bJ`): :math:`(A^TA)^+ = \sum_T E_T / \lambda_T`, so
  :math:`\mathrm{tr} = \sum_T \mathrm{tr}(E_T W^TW) / \lambda_T` over the subsets where the
  workload has weight (:mod:`hdmm.marginals`).
* **Residual strategy with per-attribute bases** (:mod:`hdmm.residual_bases`):
  :math:`(A^TA)^+ = \sum_T \kappa_T^{-1} \bigotimes_{i \in T} X_i^+ \bigotimes_{i \notin T} P_i`, so
  the trace is a sum over subsets of products of per-attribute traces.
* **Union strategy** whose factor Grams diagonalise together on every attribute (OPT_+'s
  strategies, :mod:`hdmm.union_gram`): :math:`(A^TA)^+` from per-attribute congruences and a
  grid of eigenvalues per workload term, at any domain size where the grids stay small.
* Anything else on a small domain: dense pseudo-inverse.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import gamma

from .kron_union import KronUnion, kron_union, outer_rows
from .marginals import trace_spectrum
from .residual_bases import residual_form, residual_query_variances, residual_traces
from .matrix import DENSE_LIMIT, DenseLimitError, Matrix
from .privacy import Privacy
from .structure import ZERO_RTOL, Structure, aligned_unions, classify
from .traces import SUPPORT_TOL, factor_rows, factor_trace, gram_pinv, row_projections
from .union_gram import term_variances, union_route, union_terms, union_totals

__all__ = [
    "ErrorResult",
    "exact_route",
    "expected_error",
    "rmse",
    "per_query_variance",
    "lp_error",
    "noise_variance",
    "unit_query_variances",
]



class ErrorResult(float):
    """A float (the error) that also carries how it was obtained.

    Attributes
    ----------
    measure : str
        ``"total squared error"`` or ``"rmse"``.
    privacy : Privacy
        The privacy definition the noise was calibrated for.
    queries : int
        Number of workload queries.
    reason : str or None
        Why the error is infinite (the strategy does not support the workload), else ``None``.
    structure : Structure or None
        The strategy's structure (:func:`hdmm.structure.classify`) the error was computed with.
    sensitivity : float or None
        The strategy's sensitivity in the norm of ``privacy`` that set the noise.
    """

    def __new__(cls, value: float, *, measure: str, privacy: Privacy, queries: int, reason: str | None = None,
                structure: Structure | None = None, sensitivity: float | None = None):
        obj = super().__new__(cls, value)
        obj.measure = measure
        obj.privacy = privacy
        obj.queries = queries
        obj.reason = reason
        obj.structure = structure
        obj.sensitivity = sensitivity
        return obj

    @property
    def supported(self) -> bool:
        """Whether the strategy supports the workload (the error is finite)."""
        return self.reason is None

    def __reduce__(self):
        return (_rebuild_error, (float(self), dict(self.__dict__)))

    def __repr__(self) -> str:
        if self.reason:
            return f"ErrorResult(inf, {self.measure}; unsupported: {self.reason})"
        return f"ErrorResult({float(self):.6g}, {self.measure}, {self.privacy.description})"


def _rebuild_error(value: float, attributes: dict) -> ErrorResult:
    return ErrorResult(value, **attributes)


@dataclass
class _Traces:
    """Per-term traces ``c_j^2 tr((A^TA)^+ G_j)`` of a workload union and why any are infinite."""

    union: KronUnion
    terms: np.ndarray
    reason: str | None


def _check_inputs(W: Matrix, A: Matrix, privacy: Privacy) -> None:
    if not isinstance(W, Matrix) or not isinstance(A, Matrix):
        raise TypeError("W and A must be hdmm matrices (see hdmm.matrix and hdmm.workload)")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    if W.shape[1] != A.shape[1]:
        raise ValueError(
            f"the workload has {W.shape[1]:,} columns (domain cells) but the strategy has "
            f"{A.shape[1]:,}: they must be over the same domain"
        )


def noise_variance(A: Matrix, privacy: Privacy, *, sensitivity: float | None = None) -> float:
    """Variance of each noisy strategy answer: the noise calibrated to ``A``'s sensitivity.

    ``sensitivity`` passes ``A``'s sensitivity in the norm of ``privacy`` when it is known
    already (a release plan computes it once), else it is computed here.
    """
    if sensitivity is None:
        sensitivity = privacy.noise.sensitivity(A)
    return privacy.noise_variance(sensitivity)


def _resolve(A: Matrix, privacy: Privacy, structure: Structure | None,
             sensitivity: float | None) -> tuple[Structure, float]:
    """The strategy's structure and sensitivity: the ones given, else computed (once)."""
    if structure is None:
        structure = classify(A)
    elif not isinstance(structure, Structure):
        raise TypeError(f"structure must be an hdmm.structure.Structure, got {type(structure).__name__}")
    if sensitivity is None:
        sensitivity = privacy.noise.sensitivity(A)
    return structure, float(sensitivity)


# ====================================================================== Kronecker strategies
@dataclass
class _KroneckerStrategy:
    """A Kronecker strategy ``weight * (x)_i A_i``; the traces of its factors come from :mod:`hdmm.traces`."""

    weight: float
    factors: list[Matrix]

    def factor_trace(self, i: int, f: Matrix) -> tuple[float, float, bool]:
        """``tr(X_i^+ G)``, ``tr(G)`` and whether ``f`` is supported, for ``G = f^T f``."""
        trace, supported = factor_trace(self.factors[i], f)
        return trace, f.column_norm_powers(2).sum(), supported

    def factor_rows(self, i: int, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row of ``f``: ``diag(f X_i^+ f^T)``, whether it is unsupported, whether it is non-zero."""
        return factor_rows(self.factors[i], f)


def _unsupported_reason(union: KronUnion, bad_terms: np.ndarray) -> str:
    j = int(np.flatnonzero(bad_terms)[0])
    return (
        f"{int(bad_terms.sum())} of the workload's {union.num_terms} Kronecker terms (the first is "
        f"term {j}) are not in the row space of the strategy, so W A^+ A != W; use a strategy "
        "that supports the workload (e.g. add the identity or the workload's own queries)"
    )


def _traces_result(union: KronUnion, t: np.ndarray, bad: np.ndarray) -> _Traces:
    t = np.where(bad, np.inf, t)
    return _Traces(union, t, _unsupported_reason(union, bad) if bad.any() else None)


def _kronecker_traces(w_union: KronUnion, strategy: _KroneckerStrategy) -> _Traces:
    stats = [np.array([strategy.factor_trace(i, f) for f in fs]).reshape(-1, 3) for i, fs in enumerate(w_union.factors)]
    traces = w_union.products([s[:, 0] for s in stats])
    nonzero = (w_union.products([(s[:, 1] > 0).astype(float) for s in stats]) > 0) & (w_union.weights != 0)
    supported = w_union.products([(s[:, 2] != 0).astype(float) for s in stats]) > 0
    if strategy.weight == 0:
        return _traces_result(w_union, np.zeros(w_union.num_terms), nonzero)
    return _traces_result(w_union, traces * (w_union.weights / strategy.weight) ** 2, nonzero & ~supported)



def _term_variances_kronecker(w_union: KronUnion, a_union: KronUnion) -> np.ndarray:
    strategy = _kronecker_strategy(a_union)
    rows = [[strategy.factor_rows(i, f) for f in fs] for i, fs in enumerate(w_union.factors)]
    out = []
    for j in range(w_union.num_terms):
        parts = [rows[i][k] for i, k in enumerate(w_union.index[j])]
        nonzero = outer_rows([nz for _, _, nz in parts], np.logical_and) & (w_union.weights[j] != 0)
        if strategy.weight == 0:  # a zero strategy measures nothing
            out.append(np.where(nonzero, np.inf, 0.0))
            continue
        bad = nonzero & outer_rows([b for _, b, _ in parts], np.logical_or)
        variance = outer_rows([d for d, _, _ in parts], np.multiply) * (w_union.weights[j] / strategy.weight) ** 2
        out.append(np.where(bad, np.inf, variance))
    return np.concatenate(out)


# ====================================================================== marginals-algebra strategies
def _spectral_traces(w_union: KronUnion, a_union: KronUnion) -> tuple[_Traces, tuple]:
    strategy = trace_spectrum(a_union)
    lam = strategy.eigenvalues
    lam = np.where(lam > ZERO_RTOL * lam.max(initial=0.0), lam, 0.0)
    spectrum, (term_ids, position, values) = trace_spectrum(w_union, with_terms=True)
    lam_w = strategy.lookup(spectrum.keys, lam)
    missing = lam_w[position] <= 0
    contrib = np.where(missing, 0.0, values / np.where(missing, 1.0, lam_w[position]))
    t = np.bincount(term_ids, weights=contrib, minlength=w_union.num_terms)
    bad = np.zeros(w_union.num_terms, dtype=bool)
    bad[term_ids[missing & (values > 0)]] = True
    return _traces_result(w_union, t, bad), (spectrum, term_ids, position, lam_w)


def _row_projections(f: Matrix) -> tuple[np.ndarray, np.ndarray]:
    r"""Per-row ``(diag(f P f^T)/n, diag(f Q f^T)/n)`` of a one-attribute factor, rounding-level ``Q`` parts as 0."""
    n = f.shape[1]
    p, q = row_projections(f)
    q = np.where(q <= ZERO_RTOL * (p + q), 0.0, q)
    return p / n, q / n


def _term_variances_spectral(w_union: KronUnion, a_union: KronUnion) -> np.ndarray:
    traces, (spectrum, term_ids, position, lam_w) = _spectral_traces(w_union, a_union)
    proj = [[_row_projections(f) for f in fs] for fs in w_union.factors]
    uniform = w_union.gather(
        [np.array([np.ptp(p) == 0 and np.ptp(q) == 0 for p, q in fs], dtype=float) for fs in proj]
    ).all(axis=1)
    rows = w_union.term_rows()
    out = []
    for j in range(w_union.num_terms):
        if uniform[j]:
            out.append(np.full(int(rows[j]), traces.terms[j] / rows[j]))
            continue
        c2 = w_union.weights[j] ** 2
        variance = np.zeros(int(rows[j]))
        unsupported = np.zeros(int(rows[j]))
        for pos in position[term_ids == j]:
            members = spectrum.members[pos]
            weight = outer_rows([proj[i][k][1 if members[i] else 0] for i, k in enumerate(w_union.index[j])], np.multiply)
            if lam_w[pos] > 0:
                variance += c2 / lam_w[pos] * weight
            else:
                unsupported += weight
        out.append(np.where(unsupported > 0, np.inf, variance))
    return np.concatenate(out)


# ====================================================================== dense fall-back
def _dense_traces(W: Matrix, A: Matrix) -> tuple[_Traces, np.ndarray, np.ndarray]:
    """Traces from a dense pseudo-inverse, with ``X^+`` and the per-row support of ``W``."""
    n = A.shape[1]
    if n * n > DENSE_LIMIT:
        raise DenseLimitError(
            f"no exact structured error formula applies to this strategy ({A!r}) and the domain has "
            f"{n:,} cells, too many for a dense pseudo-inverse. Use a Kronecker, identity or "
            "weighted-marginals strategy (their errors are computed exactly at any size)."
        )
    X = A.gram().dense()
    Xp = gram_pinv(X)
    Wd = W.dense()
    residual = np.linalg.norm(Wd - Wd @ Xp @ X, axis=1)
    bad_rows = residual > math.sqrt(SUPPORT_TOL) * np.maximum(np.linalg.norm(Wd, axis=1), 1e-300)
    union = KronUnion.single([W])
    traces = _traces_result(union, np.array([float(np.sum((Wd @ Xp) * Wd))]), np.array([bad_rows.any()]))
    return traces, Xp, bad_rows


# ====================================================================== union strategies, jointly diagonal
def _union_grids(W: Matrix, structure: Structure) -> list | None:
    """The workload's terms under a union strategy whose Grams diagonalise together, or ``None`` (no such route)."""
    if structure.form != "general" or structure.union is None:
        return None
    try:
        return union_terms(W, structure.union)
    except DenseLimitError:
        return None


def _union_traces(W: Matrix, structure: Structure) -> _Traces | None:
    """The per-term traces under a union strategy whose Grams diagonalise together, or ``None`` (no such route)."""
    if structure.form != "general" or structure.union is None or not union_route(W, structure.union):
        return None
    t, supported = union_totals(W, structure.union)  # a support check too large to make raises, as it says
    return _traces_result(kron_union(W), t, ~supported)


def _kronecker_strategy(a_union: KronUnion) -> _KroneckerStrategy:
    return _KroneckerStrategy(*a_union.term(0))


def exact_route(W: Matrix, A: Matrix, *, structure: Structure | None = None) -> str:
    """How :func:`expected_error` computes the error of ``A`` on ``W``.

    ``"kronecker"``, ``"spectral"`` (the marginals algebra) or ``"residual"`` (residual bases):
    closed forms, at any domain size;
    ``"union"``: a union strategy whose factor Grams diagonalise together (:mod:`hdmm.union_gram`),
    at any domain size where every workload term's grid of eigenvalues fits (deciding it
    diagonalises the strategy's factors, once per strategy union);
    ``"dense"``: a dense pseudo-inverse of ``A^TA``, for at most a few thousand cells.
    ``structure`` is ``A``'s (:func:`hdmm.structure.classify`) when known.
    """
    structure = classify(A) if structure is None else structure
    form = aligned_unions(W, structure)[0]
    route = {"kronecker": "kronecker", "marginals": "spectral", "residual": "residual"}.get(form)
    if route is not None:
        return route
    return "union" if union_route(W, structure.union) else "dense"


def _traces(W: Matrix, A: Matrix, structure: Structure) -> _Traces:
    route, w_union, a_union = aligned_unions(W, structure)
    if route == "kronecker":
        return _kronecker_traces(w_union, _kronecker_strategy(a_union))
    if route == "marginals":
        return _spectral_traces(w_union, a_union)[0]
    if route == "residual":
        return _traces_result(w_union, *residual_traces(w_union, residual_form(a_union)))
    traces = _union_traces(W, structure)
    if traces is not None:
        return traces
    return _dense_traces(W, A)[0]


# ====================================================================== public functions
def expected_error(W: Matrix, A: Matrix, privacy: Privacy, *, structure: Structure | None = None,
                   sensitivity: float | None = None) -> ErrorResult:
    r"""Expected total squared error :math:`\mathrm{Var}(z)\,\mathrm{tr}((A^TA)^+W^TW)`.

    Parameters
    ----------
    W
        The workload (``m x N``).
    A
        The strategy (``k x N``); its sensitivity sets the noise scale.
    privacy
        :class:`~hdmm.PureDP` (Laplace noise, L1 sensitivity), :class:`~hdmm.ApproxDP` or
        :class:`~hdmm.ZCDP` (Gaussian noise, L2 sensitivity).
    structure, sensitivity
        ``A``'s structure (:func:`hdmm.structure.classify`) and its sensitivity in the norm of
        ``privacy``, when already known (a release plan passes them); computed otherwise.

    Returns
    -------
    ErrorResult
        A float; ``inf`` with ``.reason`` set when ``A`` does not support ``W``. It carries the
        structure and sensitivity it was computed with.
    """
    _check_inputs(W, A, privacy)
    structure, sensitivity = _resolve(A, privacy, structure, sensitivity)
    traces = _traces(W, A, structure)
    value = math.inf if traces.reason else privacy.noise_variance(sensitivity) * float(np.sum(traces.terms))
    return ErrorResult(value, measure="total squared error", privacy=privacy, queries=W.shape[0],
                       reason=traces.reason, structure=structure, sensitivity=sensitivity)


def rmse(W: Matrix, A: Matrix, privacy: Privacy, *, structure: Structure | None = None,
         sensitivity: float | None = None) -> ErrorResult:
    r"""Root mean squared error per row of ``W`` as given, :math:`\sqrt{\mathrm{TSE}/m}`, weights included.

    This is the optimizer's objective. For a weighted workload (``hdmm.union(..., weights=...)``)
    it is **not** the error of the released counts: a row of weight ``w`` counts ``w**2`` times its
    query's variance. The error of the counts a release answers is :attr:`hdmm.planning.Plan.rmse` (the
    plan's "expected RMSE per query"), which equals ``rmse(hdmm.workload.unweighted(W)[0], A,
    privacy)``; both are the same figure when ``W`` has no weights.
    """
    total = expected_error(W, A, privacy, structure=structure, sensitivity=sensitivity)
    return ErrorResult(math.sqrt(total / W.shape[0]), measure="rmse", privacy=privacy, queries=W.shape[0],
                       reason=total.reason, structure=total.structure, sensitivity=total.sensitivity)


def unit_query_variances(W: Matrix, A: Matrix, structure: Structure) -> np.ndarray:
    r"""Per-query :math:`\mathrm{diag}(W(A^TA)^+W^T)` (the variances at unit noise), ``inf`` if unsupported.

    Raises :class:`~hdmm.matrix.DenseLimitError` when no closed form applies and the domain is too
    large for a dense pseudo-inverse.
    """
    route, w_union, a_union = aligned_unions(W, structure)
    if route == "kronecker":
        return _term_variances_kronecker(w_union, a_union)
    if route == "marginals":
        return _term_variances_spectral(w_union, a_union)
    if route == "residual":
        return residual_query_variances(w_union, residual_form(a_union))
    grids = _union_grids(W, structure)
    if grids is not None:
        return np.concatenate([term_variances(grid) for grid in grids])
    _, Xp, bad_rows = _dense_traces(W, A)
    return np.where(bad_rows, np.inf, W.quadratic_diag(Xp))


def per_query_variance(W: Matrix, A: Matrix, privacy: Privacy, *, structure: Structure | None = None,
                       sensitivity: float | None = None) -> np.ndarray:
    r"""Variance of each workload answer, :math:`\mathrm{Var}(z)\,\mathrm{diag}(W(A^TA)^+W^T)`.

    In the workload's row order; ``inf`` for queries the strategy does not support. Computed
    per Kronecker term from per-factor diagonals; ``W`` is never formed. ``structure`` and
    ``sensitivity`` as in :func:`expected_error`. For the largest variance, per-term summaries or
    workloads too large to hold one number per query, see :mod:`hdmm.query_variances`.
    """
    _check_inputs(W, A, privacy)
    structure, sensitivity = _resolve(A, privacy, structure, sensitivity)
    unit = unit_query_variances(W, A, structure)
    finite = np.isfinite(unit)
    return np.where(finite, privacy.noise_variance(sensitivity) * np.where(finite, unit, 0.0), np.inf)


def lp_error(W: Matrix, A: Matrix, privacy: Privacy, p: float) -> float:
    r"""The :math:`\ell_p^p` error :math:`(E\|M(x) - Wx\|_p^p)^{1/p}` (docs/math.md, section 6).

    Under Gaussian noise each answer's error is :math:`N(0, v_i)`, so
    :math:`E\|e\|_p^p = \sum_i v_i^{p/2}\, 2^{p/2}\,\Gamma((p+1)/2)/\sqrt{\pi}` exactly.
    Under Laplace noise the answer errors are not Gaussian and only ``p = 2`` is exact.
    """
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (math.isfinite(p) and p >= 1):
        raise ValueError(f"p must be a finite number >= 1, got {p!r}")
    v = per_query_variance(W, A, privacy)
    if not privacy.noise.normal and p != 2:  # non-normal answer errors: only the second moment is exact
        raise ValueError(
            "the l_p^p error is exact only under Gaussian noise (ApproxDP or ZCDP) or for p = 2; "
            "under PureDP use p=2 (total squared error)"
        )
    moment = 2 ** (p / 2) * gamma((p + 1) / 2) / math.sqrt(math.pi)
    return float(np.sum(v ** (p / 2)) * moment) ** (1.0 / p)
