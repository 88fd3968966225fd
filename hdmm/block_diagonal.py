r"""Block-diagonal strategies: one small strategy repeated on consecutive blocks of a large domain.

Split ``n = B m`` cells into ``B`` blocks of ``m`` consecutive cells and measure each with the
same ``m``-cell strategy ``A_m``: :math:`A = I_B \otimes A_m`. Then
:math:`(A^TA)^+ = I_B \otimes X_m^+` with :math:`X_m = A_m^TA_m`, and for any workload Gram ``G``

.. math:: \mathrm{tr}\big((A^TA)^+ G\big) = \mathrm{tr}\big(X_m^+\,\mathrm{fold}_m(G)\big),
          \qquad \mathrm{fold}_m(G) = \sum_{b=1}^{B} G_{bb},

the sum of the ``m x m`` diagonal blocks of ``G``: the error of ``A`` is the error of ``A_m`` on
the folded workload, so the best ``A_m`` is an ``m``-cell OPT_0 problem, however large ``n`` is.
The sensitivity of ``A`` is that of ``A_m``. For local workloads (every query within a few
cells, such as width-32 ranges) only the few queries that straddle a block edge pay for the
split, so this is nearly as good as a strategy over the whole domain at a fraction of the cost;
for global workloads (prefixes, all ranges) it is poor, and the optimizer keeps the better one.

A domain that ``m`` does not divide ends in a *tail* of ``t`` cells after the ``B`` blocks, each
measured once by the identity: the strategy is :math:`\mathrm{diag}(I_B \otimes A_m, I_t)`, and
the tail adds :math:`\sum_{i \ge Bm} G_{ii}` to the error (``t < B`` when the optimizer picks
:math:`m = \lfloor n/B \rfloor`, so a few cells at most).

The error of a workload factor under a block-diagonal strategy factor (the fold above, and
the per-query variances) is computed in :mod:`hdmm.traces`.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .matrix import Explicit, Identity, KronVector, Matrix
from .matrix import cheap_pinv
from .validation import check_norm, positive_int
from .spectral import blocks, unit_columns

__all__ = ["BlockDiagonal", "fold", "is_local"]

#: A folded Gram with at most this fraction of non-zeros is kept sparse.
SPARSE_DENSITY = 0.1


def is_local(G: Matrix, m: int) -> bool:
    """Whether ``G`` looks local at block size ``m``: a cheap test before :func:`fold`.

    One product with ``G``: the column at the start of the middle block must have at most
    ``SPARSE_DENSITY * m`` non-zeros within its block. That column is part of the fold (Gram
    entries of counting workloads are non-negative, so blocks do not cancel), so a global
    workload, whose fold is dense, is recognised without folding it.
    """
    n = G.shape[0]
    m = positive_int(m, "block size m")
    start = (n // m // 2) * m
    column = (G @ unit_columns(n, slice(start, start + 1)))[start: start + m, 0]
    return np.count_nonzero(column) <= SPARSE_DENSITY * m


def fold(G: Matrix, m: int) -> Explicit:
    r""":math:`\mathrm{fold}_m(G) = \sum_b G_{bb}`, the sum of the complete ``m x m`` diagonal blocks of ``G``.

    Uses only products of ``G`` with blocks of unit vectors (``n`` columns in all, in blocks of
    :func:`hdmm.spectral.blocks`), so an implicit ``G`` is never made dense. The result is sparse
    when it is mostly zero.

    Cells after the last complete block (``n mod m`` of them) are left out.

    Raises
    ------
    ValueError
        When ``G`` is not square or smaller than one block.
    """
    n = G.shape[0]
    m = positive_int(m, "block size m")
    if G.shape != (n, n) or n < m:
        raise ValueError(f"cannot fold a {G.shape[0]} x {G.shape[1]} matrix into blocks of {m}: "
                         "it must be square and at least one block long")
    out = np.zeros((m, m))
    for start in range(0, n - n % m, m):
        for block in blocks(m, n):
            columns = slice(start + block.start, start + block.stop)
            out[:, block] += (G @ unit_columns(n, columns))[start: start + m]
    out = (out + out.T) / 2
    if np.count_nonzero(out) <= SPARSE_DENSITY * out.size:
        return Explicit(sp.csr_array(out))
    return Explicit(out)


class BlockDiagonal(Matrix):
    r"""``copies`` copies of ``block`` along the diagonal, then ``tail`` identity cells (module docstring).

    Parameters
    ----------
    block
        The strategy ``A_m`` for one block of ``m`` consecutive cells.
    copies
        The number of blocks ``B``.
    tail
        Cells after the blocks, each measured once (default 0); the strategy covers
        ``B m + tail`` cells.
    """

    def __init__(self, block: Matrix, copies: int, tail: int = 0):
        if not isinstance(block, Matrix):
            raise TypeError(f"block must be an hdmm matrix, got {type(block).__name__}")
        self.block = block
        self.copies = positive_int(copies, "copies")
        if not isinstance(tail, (int, np.integer)) or isinstance(tail, bool) or tail < 0:
            raise ValueError(f"tail must be a non-negative integer, got {tail!r}")
        self.tail = int(tail)
        self.shape = (self.copies * block.shape[0] + self.tail, self.copies * block.shape[1] + self.tail)

    @property
    def fast_pinv(self) -> bool:
        """Whether the block's pseudo-inverse is cheap (structural, or small enough to form densely)."""
        return cheap_pinv(self.block)

    def block_columns(self, X: np.ndarray, width: int) -> np.ndarray:
        """The first ``B width`` rows of ``X`` (``B`` = ``copies``) as ``width x (B k)``: one column per (block, column) pair."""
        k = X.shape[1]
        head = X[: self.copies * width]
        return head.reshape(self.copies, width, k).transpose(1, 0, 2).reshape(width, self.copies * k)

    def _apply(self, X: np.ndarray, product, width: int) -> np.ndarray:
        k = X.shape[1]
        Y = product(self.block_columns(X, width))
        head = Y.reshape(Y.shape[0], self.copies, k).transpose(1, 0, 2).reshape(-1, k)
        return np.vstack([head, X[self.copies * width:]]) if self.tail else head

    def _matmat(self, X):
        return self._apply(X, self.block._matmat, self.block.shape[1])

    def column_support(self):
        return max(self.block.column_support(), 1 if self.tail else 0)

    def _rmatmat(self, Y):
        return self._apply(Y, self.block._rmatmat, self.block.shape[0])

    @property
    def T(self):
        return BlockDiagonal(self.block.T, self.copies, self.tail)

    def gram(self):
        return BlockDiagonal(self.block.gram(), self.copies, self.tail)

    def column_norm_powers(self, p):
        head = KronVector.from_array(np.ones(self.copies)).kron(self.block.column_norm_powers(p))
        if not self.tail:
            return head
        return KronVector.from_array(np.concatenate([head.to_array(), np.ones(self.tail)]))

    def sensitivity(self, p=1):
        r"""The block's sensitivity, or 1 if the tail's identity columns are larger: :math:`O(1)` in ``copies``.

        Every column of a block-diagonal matrix is a column of the block (padded with zeros) or
        a unit column of the tail, so no length-``N`` vector is formed.
        """
        check_norm(p)
        return max(float(self.block.sensitivity(p)), 1.0 if self.tail else 0.0)

    def diag(self):
        return np.concatenate([np.tile(self.block.diag(), self.copies), np.ones(self.tail)])

    def pinv(self):
        return BlockDiagonal(self.block.pinv(), self.copies, self.tail)

    def describe(self, row, name=None, values=None):
        """The block's query, on the cells of its block (labelled by ``values``, else by index)."""
        b, r = divmod(row, self.block.shape[0])
        m = self.block.shape[1]
        if b >= self.copies:  # a tail cell
            return Identity(self.shape[1]).describe(self.copies * m + row - self.copies * self.block.shape[0], name, values)
        cells = range(b * m, (b + 1) * m)
        labels = [values[c] for c in cells] if values is not None else list(cells)
        inner = self.block.describe(r, name, labels)
        return inner if inner is not None else f"{name or 'value'} in [{labels[0]}, {labels[-1]}]"

    def __repr__(self):
        tail = f", tail={self.tail}" if self.tail else ""
        return f"BlockDiagonal({self.block!r}, copies={self.copies}{tail})"

    def _key(self):
        return ("BlockDiagonal", self.copies, self.tail, self.block._key())
