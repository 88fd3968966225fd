r"""The square-root strategy: near-optimal under Gaussian noise, in :math:`O(n \log n)` per product.

For a workload Gram :math:`V = Q\,\mathrm{diag}(\lambda)\,Q^T` let :math:`R = V^{1/2}` and
:math:`s_i = R_{ii}^{-1/2}`. The strategy

.. math:: A = \Lambda^{1/4} Q^T S, \qquad S = \mathrm{diag}(s),

has Gram :math:`X = A^TA = S R S` with a unit diagonal (L2 sensitivity exactly 1) and error

.. math:: \mathrm{tr}(X^{-1} V) = \mathrm{tr}(S^{-1} R^{-1} S^{-1} V)
          = \sum_k \lambda_k^{-1/2}\, (S^{-1}q_k)^T V (S^{-1}q_k).

When :math:`R` has a constant diagonal this is :math:`(\sum_k \sqrt{\lambda_k})^2 / n`, the SVD
bound (docs/math.md, section 5), so no strategy does better. In general ``X`` is the Lagrangian
minimiser of the convex program (docs/math.md, section 4) at unit dual weights, rescaled to be
feasible: the convex solver's first iterate. On prefix, all-range and range workloads it comes
close to the SVD bound, nearly as close as the certified optimum (figures in
``benchmarks/results/tuning-notes-optimizers.md``), so it is the Gaussian strategy of choice
where the convex program's :math:`O(n^3)` Newton iterations are too slow, and a fast one
whenever ``Q`` has a fast transform (:mod:`hdmm.spectral`: prefix and all-range Grams, at any
``n``). A Gram without one and too large for a dense eigensolver borrows a sine basis: the
square-root strategy of its pinching in that basis (:meth:`SquareRootStrategy.in_sine_basis`).

Everything goes through the basis: :math:`Ax = \lambda^{1/4} \circ Q^T(s \circ x)`,
:math:`A^{-1} = S^{-1} Q \Lambda^{-1/4}`, :math:`\mathrm{diag}(R)` is one cosine transform for
a sine basis, and :math:`\mathrm{tr}(X^{-1}G)` is :math:`O(n^2)` flops when ``G`` shares the
basis, else a walk over the columns of ``Q`` in blocks (:math:`O(n^2 \log n)` time, :math:`O(n)`
memory per column): never an ``n x n`` matrix with a fast basis.

Singular Grams. Eigenvalues below ``SINGULAR_TOL`` of the largest are raised to a floor
:math:`\theta`, so ``X`` is positive definite and the strategy supports every workload. The
floor matters: the rescaling ``S`` mixes the null space of ``V`` into its range, so a tiny
:math:`\theta` (the convex solver's :math:`10^{-8}` of the mean eigenvalue) costs several times the
optimum on width-k ranges, while :math:`10^{-4}`-:math:`10^{-3}` of the mean comes close to
it. :meth:`SquareRootStrategy.for_gram` picks :math:`\theta` by a golden-section search on
:math:`\log\theta` against the workload; without a workload the floor is ``THETA`` times the
mean eigenvalue.
"""

from __future__ import annotations

import math

import numpy as np

from ..matrix import KronVector, Matrix
from ..spectral import ROW_WALK, SineBasis, Spectrum, blocks, pinch, unit_columns
from ..validation import check_dense_size, check_norm, check_width
from ..traces import FACTOR_DENSE_LIMIT, compute_gram_inverse, factor_rows, factor_trace, gram_inverse
from .convex import SINGULAR_TOL

__all__ = ["SquareRootStrategy", "inverse_gram_trace"]

#: Floor of a singular Gram's eigenvalues, as a fraction of the mean eigenvalue, when no workload tunes it.
THETA = 1e-3

#: ``for_gram`` searches the floor over this range of ``log10(theta / mean eigenvalue)``.
LOG_THETA_RANGE = (-6.0, -1.0)

#: Golden-section steps of that search (the bracket shrinks to 0.618**STEPS of its width).
THETA_STEPS = 10


def is_singular(values: np.ndarray) -> bool:
    """Whether a Gram with these eigenvalues counts as singular (smallest below ``SINGULAR_TOL`` of the largest)."""
    return bool(values.min() < SINGULAR_TOL * values.max())


class SquareRootStrategy(Matrix):
    r"""The strategy :math:`A = \Lambda^{1/4} Q^T S` whose Gram is the unit-diagonal rescaling of :math:`V^{1/2}`.

    Parameters
    ----------
    spectrum
        The eigendecomposition of the workload Gram ``V``: ``G.spectrum()`` for structured
        Grams, or :meth:`hdmm.spectral.Spectrum.of_dense` for a dense one.
        :meth:`for_workload` and :meth:`for_gram` build it (and tune ``theta``) for you.
    theta
        Floor for the eigenvalues (module docstring). ``None``: 0 for a nonsingular Gram, else
        ``THETA`` times the mean eigenvalue.

    Raises
    ------
    ValueError
        When the eigenvalues are not finite, are all zero, or are clearly negative (``V`` is not
        positive semidefinite), or ``theta`` is negative, not finite, or 0 for a singular Gram.
    """

    fast_pinv = True

    def __init__(self, spectrum: Spectrum, theta: float | None = None):
        values = np.asarray(spectrum.values, dtype=float)
        if values.ndim != 1 or values.size != spectrum.basis.n or not np.all(np.isfinite(values)):
            raise ValueError("the spectrum must have one finite eigenvalue per basis vector")
        top = float(values.max(initial=0.0))
        if not top > 0 or values.min() < -1e-8 * top:
            raise ValueError(f"the workload Gram must be positive semidefinite and non-zero, but its eigenvalues run "
                             f"from {values.min():.6g} to {values.max():.6g}")
        if theta is None:
            theta = THETA * float(values.clip(0.0).mean()) if is_singular(values) else 0.0
        if not (math.isfinite(theta) and theta >= 0) or (theta == 0 and is_singular(values)):
            raise ValueError(f"theta must be finite and non-negative (positive for a singular Gram), got {theta}")
        self.gram_spectrum, self.theta = spectrum, float(theta)  # as given (what save_strategy writes)
        self.basis, self.values = spectrum.basis, np.maximum(values, theta)
        self.quarter = self.values**0.25
        self._root_diag = self.basis.diag_of(np.sqrt(self.values))  # diag(R), R = V^{1/2}
        self.scale = 1.0 / np.sqrt(self._root_diag)
        n = values.size
        self.shape = (n, n)

    @classmethod
    def for_workload(cls, W: Matrix) -> SquareRootStrategy:
        """The square-root strategy of workload ``W`` (see :meth:`for_gram`)."""
        return cls.for_gram(W.gram())

    @classmethod
    def for_gram(cls, G: Matrix) -> SquareRootStrategy:
        """The square-root strategy for workload Gram ``G``, with the floor ``theta`` tuned to ``G``.

        The spectrum is ``G.spectrum()`` when it has a closed form; otherwise ``G`` is made dense
        (refused above ``FACTOR_DENSE_LIMIT`` entries) and decomposed by a dense eigensolver,
        ``O(n^3)``. A singular ``G`` gets the floor minimising ``tr(X^{-1} G)`` (module
        docstring) over ``LOG_THETA_RANGE``, found in ``THETA_STEPS + 2`` evaluations; a Gram of
        very low rank (a single total) may want a floor slightly below the range.
        """
        spectrum = G.spectrum()
        if spectrum is None:
            spectrum = Spectrum.of_dense(G.dense(max_entries=FACTOR_DENSE_LIMIT))
        return cls._tuned(spectrum, G)

    @classmethod
    def in_sine_basis(cls, G: Matrix) -> SquareRootStrategy:
        r"""The square-root strategy of ``G``'s pinching in the sine basis that keeps most of it.

        For a Gram with no closed-form spectrum and too many values for a dense eigensolver.
        The pinching :math:`\tilde V` of ``G`` in the prefix or the all-range basis
        (:func:`hdmm.spectral.pinch`, whichever keeps the larger share of
        :math:`\|G\|_F^2`) stands in for ``G``: the strategy is :math:`\tilde V`'s square-root
        strategy, its floor tuned and its error computed against ``G`` itself. Every product
        stays :math:`O(n \log n)` per vector. Unions of prefixes, ranges and the identity keep
        nearly all of it and land close to the convex optimum; a Gram far from both bases (the
        prefixes of a shuffled domain) keeps under half and does badly, so
        callers compare the result with another strategy
        (:func:`hdmm.optimizers.kron.factor_candidates`).
        """
        spectrum, _ = max((pinch(SineBasis(G.shape[0], kind), G) for kind in ("prefix", "allrange")),
                          key=lambda pair: pair[1])
        return cls._tuned(spectrum, G)

    @classmethod
    def _tuned(cls, spectrum: Spectrum, G: Matrix) -> SquareRootStrategy:
        """The strategy of ``spectrum``, its floor tuned against the workload Gram ``G`` when singular."""
        if not is_singular(spectrum.values):
            return cls(spectrum)
        mean = float(spectrum.values.clip(0.0).mean())
        errors: dict[float, float] = {}

        def error(log_theta: float) -> float:
            if log_theta not in errors:
                errors[log_theta] = inverse_gram_trace(cls(spectrum, mean * 10.0**log_theta), G)
            return errors[log_theta]

        lo, hi = LOG_THETA_RANGE
        ratio = (math.sqrt(5.0) - 1.0) / 2.0
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        for _ in range(THETA_STEPS):
            if error(a) <= error(b):
                hi, b = b, a
                a = hi - ratio * (hi - lo)
            else:
                lo, a = a, b
                b = lo + ratio * (hi - lo)
        return cls(spectrum, mean * 10.0 ** min((a, b), key=error))

    def _matmat(self, X):
        return self.quarter[:, None] * self.basis.apply_transpose(self.scale[:, None] * X)

    def _rmatmat(self, Y):
        return self.scale[:, None] * self.basis.apply(self.quarter[:, None] * Y)

    def column_norm_powers(self, p):
        """Squared L2 column norms: :math:`s_j^2 R_{jj}` (1 up to rounding; one diagonal). L1: a walk over the rows of ``Q``."""
        check_norm(p)
        if p == 2:
            return KronVector.from_array(self.scale**2 * self._root_diag)
        out = np.empty(self.shape[1])
        for cells, Qt in self.basis.rows():  # Qt[k, j] = Q[j, k]: column j of A is s_j lambda^{1/4} Q[j, :]
            out[cells] = self.quarter @ np.abs(Qt)
        return KronVector.from_array(out * self.scale)

    def pinv(self):
        return _SquareRootInverse(self)

    def describe(self, row, name=None, values=None):
        return f"{name or 'value'}: square-root query {row}"

    def __repr__(self):
        return f"SquareRootStrategy(n={self.shape[1]}, {self.basis!r})"


class _SquareRootInverse(Matrix):
    r""":math:`A^{-1} = S^{-1} Q \Lambda^{-1/4}` of a :class:`SquareRootStrategy` (square and invertible)."""

    def __init__(self, A: SquareRootStrategy):
        self.A = A
        self.shape = A.shape

    def _matmat(self, X):
        A = self.A
        return A.basis.apply(X / A.quarter[:, None]) / A.scale[:, None]

    def _rmatmat(self, Y):
        A = self.A
        return A.basis.apply_transpose(Y / A.scale[:, None]) / A.quarter[:, None]

    def pinv(self):
        return self.A

    def __repr__(self):
        return f"inverse of {self.A!r}"


# ====================================================================== error of a workload factor (hdmm.traces)
def inverse_gram_trace(A: SquareRootStrategy, G: Matrix) -> float:
    r""":math:`\mathrm{tr}(X^{-1} G) = \sum_k \lambda_k^{-1/2} (S^{-1}q_k)^T G\, (S^{-1}q_k)` for a Gram ``G``.

    With :math:`X^{-1} = S^{-1} Q \Lambda^{-1/2} Q^T S^{-1}` (module docstring). When
    :math:`G = Q\,\mathrm{diag}(\mu)\,Q^T` in the same basis this is
    :math:`\sum_{kl} \lambda_k^{-1/2} \mu_l B_{lk}^2` with :math:`B = Q^T S^{-1} Q`
    (:meth:`~hdmm.spectral.SineBasis.congruence_norm`, :math:`O(n^2)` flops); otherwise the
    columns of ``Q`` are walked in blocks (:func:`hdmm.spectral.blocks`), one product with ``G``
    each.
    """
    inverse_root = 1.0 / np.sqrt(A.values)
    other = G.spectrum()
    if other is not None and other.basis.same_as(A.basis):
        return A.basis.congruence_norm(1.0 / A.scale, inverse_root, other.values)
    total = 0.0
    for block, Q in A.basis.columns():
        Y = Q / A.scale[:, None]
        total += float(inverse_root[block] @ np.einsum("ij,ij->j", Y, G @ Y))
    return total


@compute_gram_inverse.register
def _(A: SquareRootStrategy) -> tuple[np.ndarray, np.ndarray]:
    r"""``(X^{-1}, I)`` densely: :math:`X^{-1} = S^{-1} Q \Lambda^{-1/2} Q^T S^{-1}` (refused above ``FACTOR_DENSE_LIMIT``)."""
    n = A.shape[1]
    check_dense_size(n, n, "the inverse Gram of a square-root strategy", FACTOR_DENSE_LIMIT)
    inner = A.basis.apply(A.basis.apply_transpose(np.eye(n)) / np.sqrt(A.values)[:, None])
    unscale = 1.0 / A.scale
    inner *= unscale[:, None]
    inner *= unscale[None, :]
    return (inner + inner.T) / 2, np.eye(n)


@factor_trace.register
def _(A: SquareRootStrategy, f: Matrix) -> tuple[float, bool]:
    """``(tr(X^{-1} f^T f), True)``: ``X`` is positive definite, so every workload is supported."""
    check_width(f, A)
    return inverse_gram_trace(A, f.gram()), True


@factor_rows.register
def _(A: SquareRootStrategy, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Per query ``w`` of ``f``: :math:`w^TX^{-1}w = \|A^{-T}w\|^2`, all supported, and whether ``w`` is non-zero.

    Up to ``ROW_WALK`` queries per cell the rows of ``f`` are taken in blocks
    (:func:`hdmm.spectral.blocks`) and mapped through :math:`A^{-T} = \Lambda^{-1/4}Q^TS^{-1}`,
    in ``O(n)`` memory; more queries (all ranges) go through the cached inverse Gram
    (:func:`hdmm.traces.gram_inverse`) and ``f.quadratic_diag``.
    """
    check_width(f, A)
    m, n = f.shape
    if m > ROW_WALK * n:
        Xinv, identity = gram_inverse(A)
        return f.quadratic_diag(Xinv), np.zeros(m, dtype=bool), f.quadratic_diag(identity) > 0
    inverse_transpose = A.pinv().T
    variances, norms = np.empty(m), np.empty(m)
    for block in blocks(m, n):
        rows = f.T @ unit_columns(m, block)                 # rows of f in this block, as columns
        Z = inverse_transpose @ rows
        variances[block] = np.einsum("ij,ij->j", Z, Z)
        norms[block] = np.einsum("ij,ij->j", rows, rows)
    return variances, np.zeros(m, dtype=bool), norms > 0
