r"""The error of a workload factor under a strategy factor (docs/math.md, sections 1.3, 1.4, 2.4 and 2.6).

For a Kronecker strategy :math:`A = c \bigotimes_i A_i` and a union of Kronecker products
:math:`W = \mathrm{VStack}_j\, c_j \bigotimes_i W_i^{(j)}`, the error, the per-query variances
and the support condition all factorise over the attributes (docs/math.md, section 2.4). What is
left to compute is, for one strategy factor ``A`` (``k x n``, Gram :math:`X = A^TA`) and one
workload factor ``f`` (``m x n``, Gram :math:`G = f^Tf`):

* :func:`factor_trace`: :math:`\mathrm{tr}(X^+ G)` and whether ``f`` is supported, i.e. whether
  its rows lie in the row space of ``A`` (:math:`f X^+ X = f`, section 1.3);
* :func:`factor_rows`: per row :math:`w` of ``f``, the variance :math:`w^T X^+ w`, whether the
  row is unsupported and whether it is non-zero.

Both are generic functions (:func:`functools.singledispatch` on the type of the strategy
factor). The default forms the ``n x n`` Gram densely (up to ``FACTOR_DENSE_LIMIT`` entries) and
inverts it once per strategy factor (:func:`gram_inverse`, cached while the factor lives: an
optimizer evaluates one strategy factor against many workload factors). Structured strategy
factors register faster exact implementations: :class:`~hdmm.matrix.Identity` and
:class:`~hdmm.block_diagonal.BlockDiagonal` here, the p-Identity and square-root strategies in
their own modules (:mod:`hdmm.optimizers.pidentity`, :mod:`hdmm.optimizers.root`), so that this
module depends only on the matrix layer.

Support is decided with the relative tolerance ``SUPPORT_TOL``: a workload factor (or row) is
supported when the part of its squared norm outside the row space of ``A``,
:math:`\mathrm{tr}(G) - \mathrm{tr}(G X^+X)`, is at most ``SUPPORT_TOL`` times
:math:`\mathrm{tr}(G)`.
"""

from __future__ import annotations

import weakref
from functools import singledispatch

import numpy as np
import scipy.linalg

from .block_diagonal import BlockDiagonal, fold
from .matrix import SINGULAR_RTOL, Identity, Matrix
from .spectral import ROW_WALK, blocks, unit_columns
from .validation import check_dense_size, check_width

__all__ = [
    "FACTOR_DENSE_LIMIT",
    "SUPPORT_TOL",
    "PINV_RCOND",
    "gram_pinv",
    "gram_inverse",
    "compute_gram_inverse",
    "factor_trace",
    "factor_rows",
    "squared_row_norms",
    "row_projections",
]

#: Largest one-attribute Gram a strategy factor inverts densely (8192 x 8192).
FACTOR_DENSE_LIMIT = 2**26

#: Relative tolerance for deciding that a query is not in a strategy's row space.
SUPPORT_TOL = 1e-8

#: Eigenvalues of a Gram below this fraction of the largest are treated as zero by the
#: pseudo-inverse (numpy's default, about 1e-15, inverts rounding noise): the square of
#: :data:`hdmm.matrix.SINGULAR_RTOL`, where reconstruction cuts the strategy's singular values.
PINV_RCOND = SINGULAR_RTOL**2


def gram_pinv(X: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of a symmetric positive semi-definite Gram, rounding noise cut at ``PINV_RCOND``."""
    return np.linalg.pinv(X, rcond=PINV_RCOND, hermitian=True)


# ====================================================================== the inverse Gram of a strategy factor
#: ``(X^+, X^+ X)`` per strategy factor, dropped with the factor (keys are the matrix objects).
_GRAM_INVERSES: weakref.WeakKeyDictionary[Matrix, tuple[np.ndarray, np.ndarray]] = weakref.WeakKeyDictionary()


@singledispatch
def compute_gram_inverse(A: Matrix) -> tuple[np.ndarray, np.ndarray]:
    r"""``(X^+, X^+ X)`` for :math:`X = A^TA`, densely: the pseudo-inverse and the row-space projector.

    Uncached; call :func:`gram_inverse` instead. The default forms ``X`` (refused above
    ``FACTOR_DENSE_LIMIT`` entries) and tries a Cholesky inverse first: a strategy factor of full
    column rank (the usual case) has a positive definite Gram, :math:`X^+ = X^{-1}` and the
    projector is the identity. The Cholesky inverse is accepted when it is finite and
    :math:`\|X^{-1}X - I\|_F < 10^{-6} n`; otherwise (singular or badly conditioned ``X``) the
    eigenvalue pseudo-inverse :func:`gram_pinv` is used. Strategy classes with a structural
    inverse Gram register their own implementation.
    """
    X = A.gram().dense(max_entries=FACTOR_DENSE_LIMIT)
    try:  # the residual test also turns away Grams past the pseudo-inverse's cut (condition above ~1e10)
        factor = scipy.linalg.cho_factor(X)
        Xinv = scipy.linalg.cho_solve(factor, np.eye(X.shape[0]))
        if np.all(np.isfinite(Xinv)) and np.linalg.norm(Xinv @ X - np.eye(X.shape[0])) < 1e-6 * X.shape[0]:
            return Xinv, np.eye(X.shape[0])
    except np.linalg.LinAlgError:
        pass
    Xp = gram_pinv(X)
    return Xp, Xp @ X


@compute_gram_inverse.register
def _(A: Identity) -> tuple[np.ndarray, np.ndarray]:
    return np.eye(A.n), np.eye(A.n)


def gram_inverse(A: Matrix) -> tuple[np.ndarray, np.ndarray]:
    r"""``(X^+, X^+ X)`` for :math:`X = A^TA`, computed once per strategy factor (:func:`compute_gram_inverse`).

    The result is kept as long as ``A`` lives (a weak-keyed cache; nothing is stored on ``A``)
    and must not be modified.
    """
    try:
        return _GRAM_INVERSES[A]
    except KeyError:
        pass
    value = compute_gram_inverse(A)
    _GRAM_INVERSES[A] = value
    return value


# ====================================================================== total error of a factor
@singledispatch
def factor_trace(A: Matrix, f: Matrix) -> tuple[float, bool]:
    r""":math:`\mathrm{tr}\big((A^TA)^+ f^Tf\big)` and whether the rows of ``f`` lie in the row space of ``A``.

    The error of workload factor ``f`` under strategy factor ``A`` (docs/math.md, section 2.4).
    The default uses the cached dense inverse Gram (:func:`gram_inverse`): with
    :math:`G = f^Tf` and the projector :math:`P = X^+X`, the trace is :math:`\mathrm{tr}(G X^+)`
    and ``f`` is supported when :math:`\mathrm{tr}(G) - \mathrm{tr}(GP) \le`
    ``SUPPORT_TOL`` :math:`\mathrm{tr}(G)` (docs/math.md, section 1.3).

    Parameters
    ----------
    A
        The strategy factor (``k x n``).
    f
        The workload factor (``m x n``); only its Gram and column norms are used.

    Returns
    -------
    trace : float
        :math:`\mathrm{tr}(X^+ G)`; finite even when ``f`` is not supported.
    supported : bool
        Whether ``A`` supports ``f``.
    """
    check_width(f, A)
    Xp, projector = gram_inverse(A)
    G = f.gram()
    total = f.column_norm_powers(2).sum()
    kept = float(np.trace(G @ projector))
    return float(np.trace(G @ Xp)), total - kept <= SUPPORT_TOL * total


@factor_trace.register
def _(A: Identity, f: Matrix) -> tuple[float, bool]:
    r""":math:`\mathrm{tr}(f^Tf)`, the sum of the squared column norms; the identity supports everything."""
    check_width(f, A)
    return f.column_norm_powers(2).sum(), True


@factor_trace.register
def _(A: BlockDiagonal, f: Matrix) -> tuple[float, bool]:
    r""":math:`\mathrm{tr}(X_m^+\,\mathrm{fold}_m(f^Tf))` plus the tail's diagonal (docs/math.md, section 2.6).

    ``f`` is supported when the fold lies in the row space of the block ``A_m`` (the tail is
    measured by the identity, which supports everything).
    """
    check_width(f, A)
    Xp, projector = gram_inverse(A.block)
    G = f.gram()
    F = fold(G, A.block.shape[1]).dense()
    total = float(np.trace(F))
    kept = float(np.sum(F * projector.T))
    tail = float(np.sum(G.diag()[A.shape[1] - A.tail:])) if A.tail else 0.0
    return float(np.sum(F * Xp.T)) + tail, total - kept <= SUPPORT_TOL * total


# ====================================================================== per-query error of a factor
@singledispatch
def factor_rows(A: Matrix, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Per row :math:`w` of ``f``: :math:`w^T X^+ w`, whether the row is unsupported, whether it is non-zero.

    The per-query variances of workload factor ``f`` under strategy factor ``A`` at unit noise
    (:math:`\mathrm{diag}(f X^+ f^T)`, docs/math.md, section 2.4). A row is unsupported when
    :math:`w^T(I - P)w >` ``SUPPORT_TOL`` :math:`\|w\|^2` with the projector :math:`P = X^+X`.
    The default uses the cached dense inverse Gram and ``f.quadratic_diag``.

    Returns
    -------
    variances, unsupported, nonzero : np.ndarray
        Three arrays of length ``m`` (floats, booleans, booleans).
    """
    check_width(f, A)
    Xp, projector = gram_inverse(A)
    n = f.shape[1]
    norms = f.quadratic_diag(np.eye(n))
    residual = f.quadratic_diag(np.eye(n) - projector)
    return f.quadratic_diag(Xp), residual > SUPPORT_TOL * norms, norms > 0


def squared_row_norms(f: Matrix) -> np.ndarray:
    r""":math:`\|w\|_2^2` for each row :math:`w` of ``f`` (:math:`\mathrm{diag}(f f^T)`), in bounded memory.

    Up to ``FACTOR_DENSE_LIMIT`` entries in ``n x n`` this is ``f.quadratic_diag`` of the
    identity; above it the rows are walked in blocks (:func:`hdmm.spectral.blocks`, ``O(n)``
    memory per row) when ``f`` has at most ``ROW_WALK`` rows per column, and refused up front
    with :class:`~hdmm.matrix.DenseLimitError` otherwise.
    """
    rows, n = f.shape
    if n * n <= FACTOR_DENSE_LIMIT:
        return f.quadratic_diag(np.eye(n))
    if rows > ROW_WALK * n:
        check_dense_size(n, n, "the squared row norms of a workload factor", FACTOR_DENSE_LIMIT)
    out = np.empty(rows)
    for block in blocks(rows, n):
        V = f.T @ unit_columns(rows, block)  # rows of f in this block, as columns
        out[block] = np.einsum("ij,ij->j", V, V)
    return out


def row_projections(f: Matrix) -> tuple[np.ndarray, np.ndarray]:
    r"""Per row ``w`` of a one-attribute factor: :math:`(w^TPw, w^TQw)` with :math:`P = J/n` (the mean)
    and :math:`Q = I - P`, i.e. ``((w . 1)^2 / n, |w|^2 - (w . 1)^2 / n)``, the second clipped at 0."""
    n = f.shape[1]
    p = (f @ np.ones(n)) ** 2 / n
    return p, np.maximum(squared_row_norms(f) - p, 0.0)


@factor_rows.register
def _(A: Identity, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r""":math:`\|w\|^2` per row (:func:`squared_row_norms`); every row is supported."""
    check_width(f, A)
    norms = squared_row_norms(f)
    return norms, np.zeros(norms.size, dtype=bool), norms > 0


@factor_rows.register
def _(A: BlockDiagonal, f: Matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Per row :math:`w` (blocks :math:`w_b`, tail :math:`w_t`): :math:`\sum_b w_b^T X_m^+ w_b + \|w_t\|^2`.

    With :math:`(A^TA)^+ = \mathrm{diag}(I_B \otimes X_m^+, I_t)` (docs/math.md, section 2.6).
    Up to ``ROW_WALK`` queries per cell the rows of ``f`` are walked in blocks
    (:func:`hdmm.spectral.blocks`), in ``O(n + m^2)`` memory per block; more queries (all
    ranges) go through ``f.quadratic_diag`` of the dense block-diagonal inverse Gram (refused
    above ``FACTOR_DENSE_LIMIT`` entries).
    """
    check_width(f, A)
    Xp, projector = gram_inverse(A.block)
    residual_projector = np.eye(projector.shape[0]) - projector
    rows, n = f.shape
    if rows > ROW_WALK * n:
        check_dense_size(n, n, "per-query variances of a block-diagonal strategy", FACTOR_DENSE_LIMIT)
        eye, tail = np.eye(A.copies), np.eye(A.tail)
        norms = f.quadratic_diag(np.eye(n))
        residual = f.quadratic_diag(scipy.linalg.block_diag(np.kron(eye, residual_projector), 0 * tail))
        variances = f.quadratic_diag(scipy.linalg.block_diag(np.kron(eye, Xp), tail))
        return variances, residual > SUPPORT_TOL * norms, norms > 0
    variances, residual, norms = np.empty(rows), np.empty(rows), np.empty(rows)
    width = A.block.shape[1]
    for block in blocks(rows, n):
        k = block.stop - block.start
        V = f.T @ unit_columns(rows, block)                 # rows of f in this block, as columns
        W = A.block_columns(V, width)                       # m x (B k): one column per (block, query)

        def per(M: np.ndarray) -> np.ndarray:
            return np.einsum("ij,ij->j", W, M @ W).reshape(A.copies, k).sum(axis=0)

        tail = np.einsum("ij,ij->j", V[n - A.tail:], V[n - A.tail:])
        variances[block], residual[block] = per(Xp) + tail, per(residual_projector)
        norms[block] = per(np.eye(width)) + tail
    return variances, residual > SUPPORT_TOL * norms, norms > 0
