r"""Eigendecompositions of workload Grams: dense, or fast for the structured range Grams.

A :class:`Spectrum` is :math:`V = Q\,\mathrm{diag}(\lambda)\,Q^T` with an orthogonal ``Q`` that
is never formed when it has a fast transform. Two Grams have one in closed form (0-based
cells ``i, j`` of a domain of ``n`` values):

*All ranges*, :math:`V_{ij} = (\min(i,j)+1)(n-\max(i,j))`. With :math:`a = i + 1`,
:math:`V = (n+1)K^{-1}` for the second-difference matrix :math:`K = \mathrm{tridiag}(-1, 2, -1)`,
so

.. math:: Q_{ik} = \sqrt{\tfrac{2}{n+1}}\,\sin\frac{\pi k a}{n+1}, \qquad
          \lambda_k = \frac{n+1}{4\sin^2\big(\pi k / (2(n+1))\big)}, \qquad k = 1..n,

and ``Q`` (symmetric) is the orthonormal DST-I.

*Prefixes*, :math:`V_{ij} = n - \max(i,j)`. With :math:`a = n - i`, :math:`V_{ij} = \min(a_i, a_j)`,
the inverse of ``K`` with its last diagonal entry replaced by 1, so

.. math:: Q_{ik} = \tfrac{2}{\sqrt{2n+1}}\,\sin\frac{(2k-1)\pi a}{2n+1}, \qquad
          \lambda_k = \frac{1}{4\sin^2\big((2k-1)\pi / (2(2n+1))\big)},

the odd frequencies of a DST-I of length ``2n`` (the input padded with ``n`` zeros).

Either way a product with ``Q`` or ``Q^T`` costs :math:`O(n \log n)`, so a function of the Gram
(:math:`V^{1/2}`, :math:`V^{-1/4}`, ...) is applied without an ``n x n`` matrix. Products of
sines are sums of cosines, which gives two more closed forms (:meth:`SineBasis.diag_of`,
:meth:`SineBasis.congruence_norm`): the diagonal of :math:`Q\,\mathrm{diag}(f)\,Q^T` is one
cosine transform, and :math:`B = Q^T \mathrm{diag}(u)\, Q` is a Toeplitz minus a Hankel
matrix, :math:`B_{lk} = c_{|l-k|} - c_{l+k}`, from one cosine transform ``c`` of ``u``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import scipy.fft
import scipy.linalg as la

__all__ = ["Spectrum", "SineBasis", "DenseBasis", "ROW_WALK", "blocks", "pinch", "unit_columns"]

#: Entries of one block of columns (of ``Q``, of a workload, of an identity) formed at once when
#: walking through ``n`` of them: 16 MB, so the walks need ``O(n)`` memory, not ``O(n^2)``.
BLOCK_ENTRIES = 2**21


#: Per-query variances walk a workload's rows in blocks when it has at most this many queries
#: per cell; beyond (all ranges: n^2 / 2 queries) a dense inverse Gram and ``quadratic_diag`` win.
ROW_WALK = 4


def blocks(n: int, length: int | None = None) -> Iterator[slice]:
    """Consecutive slices covering ``range(n)``, each ``BLOCK_ENTRIES / length`` long (``length`` defaults to ``n``)."""
    step = max(1, BLOCK_ENTRIES // max(1, n if length is None else length))
    for lo in range(0, n, step):
        yield slice(lo, min(lo + step, n))


def unit_columns(n: int, block: slice) -> np.ndarray:
    """The columns ``block`` of the ``n x n`` identity, as a Fortran-ordered ``n x k`` array."""
    k = block.stop - block.start
    E = np.zeros((n, k), order="F")
    E[np.arange(block.start, block.stop), np.arange(k)] = 1.0
    return E


class SineBasis:
    r"""The orthogonal eigenvectors of the all-range or prefix Gram on ``n`` values (module docstring).

    Products take and return 2-D ``n x k`` arrays.

    Parameters
    ----------
    n
        Number of values (a positive integer).
    kind
        ``"allrange"`` or ``"prefix"``.
    """

    def __init__(self, n: int, kind: str):
        if kind not in ("allrange", "prefix"):
            raise ValueError(f"kind must be 'allrange' or 'prefix', got {kind!r}")
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        self.n, self.kind = int(n), kind

    def eigenvalues(self) -> np.ndarray:
        """The Gram's eigenvalue for each basis vector, in basis order (module docstring)."""
        n = self.n
        if self.kind == "allrange":
            return (n + 1) / (4.0 * np.sin(np.pi * np.arange(1, n + 1) / (2 * (n + 1))) ** 2)
        return 1.0 / (4.0 * np.sin((2 * np.arange(1, n + 1) - 1) * np.pi / (2 * (2 * n + 1))) ** 2)

    def apply(self, Y: np.ndarray) -> np.ndarray:
        """``Q @ Y`` for an ``n x k`` array ``Y`` (spectral coefficients to cell values)."""
        n = self.n
        if self.kind == "allrange":
            return scipy.fft.dst(Y, type=1, norm="ortho", axis=0)
        padded = np.zeros((2 * n, Y.shape[1]))
        padded[0::2] = Y
        return scipy.fft.dst(padded, type=1, axis=0)[n - 1::-1] / np.sqrt(2 * n + 1)

    def apply_transpose(self, X: np.ndarray) -> np.ndarray:
        """``Q^T @ X`` for an ``n x k`` array ``X`` (cell values to spectral coefficients)."""
        n = self.n
        if self.kind == "allrange":
            return scipy.fft.dst(X, type=1, norm="ortho", axis=0)
        padded = np.zeros((2 * n, X.shape[1]))
        padded[:n] = X[::-1]
        return scipy.fft.dst(padded, type=1, axis=0)[0::2] / np.sqrt(2 * n + 1)

    def _cosines(self, v: np.ndarray, period: int) -> np.ndarray:
        r""":math:`\sum_j v_j \cos(2\pi j m / \mathrm{period})` for ``m = 0 .. period - 1`` (one FFT)."""
        padded = np.zeros(period)
        padded[: v.size] = v
        return scipy.fft.fft(padded).real

    def diag_of(self, f: np.ndarray) -> np.ndarray:
        r""":math:`\mathrm{diag}(Q\,\mathrm{diag}(f)\,Q^T)` in :math:`O(n \log n)`.

        :math:`Q_{ik}^2 = \tfrac{1}{n+1}(1 - \cos\frac{2\pi k a}{n+1})` (all ranges) or
        :math:`\tfrac{2}{2n+1}(1 - \cos\frac{2\pi(2k-1)a}{2n+1})` (prefixes).
        """
        n = self.n
        if self.kind == "allrange":
            v = np.concatenate([[0.0], f])                      # frequency k at index k
            return (f.sum() - self._cosines(v, n + 1)[1 : n + 1]) / (n + 1)
        v = np.zeros(2 * n)
        v[1::2] = f                                             # frequency 2k - 1 at index 2k - 1
        cells = (f.sum() - self._cosines(v, 2 * n + 1)[1 : n + 1]) * 2 / (2 * n + 1)  # a = 1 .. n
        return cells[::-1]                                      # cell i has a = n - i

    def congruence_norm(self, u: np.ndarray, w: np.ndarray, mu: np.ndarray) -> float:
        r""":math:`\sum_{lk} w_l\,\mu_k\,B_{lk}^2` for :math:`B = Q^T \mathrm{diag}(u)\, Q`, in :math:`O(n^2)` flops.

        All ranges: :math:`B_{lk} = c_{|l-k|} - c_{l+k}` with
        :math:`c_m = \tfrac{1}{n+1}\sum_a u_a \cos\frac{\pi m a}{n+1}`; prefixes:
        :math:`B_{lk} = c_{2|l-k|} - c_{2(l+k-1)}` with
        :math:`c_m = \tfrac{2}{2n+1}\sum_a u_{n-a} \cos\frac{\pi m a}{2n+1}` (``k, l = 1..n``).
        """
        n = self.n
        k = np.arange(1, n + 1)
        if self.kind == "allrange":
            c = self._cosines(np.concatenate([[0.0], u]), 2 * (n + 1)) / (n + 1)
            gap, far = (lambda j: np.abs(j[:, None] - k)), (lambda j: j[:, None] + k)
        else:
            c = self._cosines(np.concatenate([[0.0], u[::-1]]), 2 * (2 * n + 1)) * 2 / (2 * n + 1)
            gap, far = (lambda j: 2 * np.abs(j[:, None] - k)), (lambda j: 2 * (j[:, None] + k - 1))
        total = 0.0
        for block in blocks(n):
            B = c[gap(k[block])] - c[far(k[block])]
            total += float(w[block] @ (B * B) @ mu)
        return total

    def entries(self, cells: slice, vectors: slice) -> np.ndarray:
        r"""``Q[cells, vectors]`` from the closed form (module docstring).

        The sine's argument is reduced exactly in integers, :math:`\pi m / L` with
        :math:`m = k a \bmod 2L` (``L = n + 1``, or ``2n + 1`` and odd frequencies for
        prefixes), and read from a table of ``2L`` sines: no transform, no large arguments.
        """
        n = self.n
        a = np.arange(n)[cells] + 1                                  # all ranges: a = i + 1
        k = np.arange(1, n + 1)[vectors]
        if self.kind == "allrange":
            period, scale = n + 1, np.sqrt(2.0 / (n + 1))
        else:
            a, k = n - (a - 1), 2 * k - 1                            # prefixes: a = n - i, odd frequencies
            period, scale = 2 * n + 1, 2.0 / np.sqrt(2 * n + 1)
        table = scale * np.sin(np.pi * np.arange(2 * period) / period)
        return table[np.multiply.outer(k, a) % (2 * period)].T  # column-major: fast sums down columns

    def rows(self) -> Iterator[tuple[slice, np.ndarray]]:
        """Blocks ``(cells, Q[cells, :].T)`` covering every row of ``Q`` (see :func:`blocks`)."""
        for block in blocks(self.n):
            yield block, self.entries(block, slice(None)).T

    def columns(self) -> Iterator[tuple[slice, np.ndarray]]:
        """Blocks ``(indices, Q[:, indices])`` covering every column of ``Q`` (see :func:`blocks`)."""
        for block in blocks(self.n):
            yield block, self.entries(slice(None), block)

    def same_as(self, other: object) -> bool:
        return isinstance(other, SineBasis) and (other.n, other.kind) == (self.n, self.kind)

    def __repr__(self) -> str:
        return f"SineBasis(n={self.n}, {self.kind!r})"


class DenseBasis:
    """An orthogonal ``n x n`` matrix ``Q`` held as a dense array (from a dense eigensolver)."""

    def __init__(self, Q: np.ndarray):
        self.Q = np.asarray(Q, dtype=float)
        self.n = self.Q.shape[0]

    def apply(self, Y: np.ndarray) -> np.ndarray:
        return self.Q @ Y

    def apply_transpose(self, X: np.ndarray) -> np.ndarray:
        return self.Q.T @ X

    def rows(self) -> Iterator[tuple[slice, np.ndarray]]:
        for block in blocks(self.n):
            yield block, self.Q[block].T

    def columns(self) -> Iterator[tuple[slice, np.ndarray]]:
        for block in blocks(self.n):
            yield block, self.Q[:, block]

    def diag_of(self, f: np.ndarray) -> np.ndarray:
        return np.einsum("ik,k,ik->i", self.Q, f, self.Q)

    def same_as(self, other: object) -> bool:
        """Always ``False``: a dense basis belongs to one decomposition and is never shared."""
        return False

    def __repr__(self) -> str:
        return f"DenseBasis(n={self.n})"


@dataclass(frozen=True, eq=False)
class Spectrum:
    r"""A symmetric matrix :math:`Q\,\mathrm{diag}(\lambda)\,Q^T` with ``Q`` held by ``basis``.

    Attributes
    ----------
    basis : SineBasis or DenseBasis
        The orthogonal eigenvectors, applied by :meth:`~SineBasis.apply` and
        :meth:`~SineBasis.apply_transpose`.
    values : numpy.ndarray
        The eigenvalue of each basis vector, in basis order (not sorted).
    """

    basis: SineBasis | DenseBasis
    values: np.ndarray

    @classmethod
    def of_dense(cls, V: np.ndarray) -> Spectrum:
        """The eigendecomposition of a dense symmetric matrix (``O(n^3)``)."""
        values, Q = la.eigh(V, driver="evd", check_finite=False)
        return cls(DenseBasis(Q), values)

    @classmethod
    def sine(cls, n: int, kind: str) -> Spectrum:
        """The closed-form spectrum of the all-range (``"allrange"``) or prefix (``"prefix"``) Gram."""
        basis = SineBasis(n, kind)
        return cls(basis, basis.eigenvalues())

    def scaled(self, c: float) -> Spectrum:
        """The spectrum of ``c`` times this matrix."""
        return Spectrum(self.basis, c * self.values)

    def shifted(self, c: float) -> Spectrum:
        """The spectrum of this matrix plus ``c`` times the identity (diagonal in every basis)."""
        return Spectrum(self.basis, self.values + c)

    def plus(self, other: Spectrum) -> Spectrum | None:
        """The spectrum of the sum, or ``None`` when the two bases differ."""
        if not self.basis.same_as(other.basis):
            return None
        return Spectrum(self.basis, self.values + other.values)


def pinch(basis: SineBasis | DenseBasis, G) -> tuple[Spectrum, float]:
    r"""The pinching of a symmetric ``G`` in ``basis``, and the share of ``G`` it keeps.

    The pinching :math:`Q\,\mathrm{diag}(\mathrm{diag}(Q^TGQ))\,Q^T` is the matrix diagonal in
    ``Q`` closest to ``G`` in Frobenius norm; it equals ``G`` when ``Q`` diagonalises it. The
    share kept is :math:`\sum_k (q_k^TGq_k)^2 / \|G\|_F^2` (1 when exact). The columns of ``Q``
    are walked in blocks (:func:`blocks`), one product with ``G`` each: ``O(n)`` memory, and
    :math:`O(n^2 \log n)` time for a sine basis and a Gram with fast products.
    """
    values = np.empty(basis.n)
    total = 0.0
    for block, Q in basis.columns():
        GQ = G @ Q
        values[block] = np.einsum("ij,ij->j", Q, GQ)
        total += float(np.einsum("ij,ij->", GQ, GQ))
    kept = float(values @ values) / total if total > 0 else 1.0
    return Spectrum(basis, values), kept
