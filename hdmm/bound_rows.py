r"""The row Gram of a union of Kronecker products, applied without forming it (docs/math.md, section 5.4).

A block of the SVD bound's common-eigenvector split is a Gram

.. math:: M = \sum_j w_j \bigotimes_i G_{i,k_{ji}}

over a few attributes, where ``k_{ji}`` says which of attribute ``i``'s Grams term ``j`` uses.
Write each Gram as :math:`G = R^TR` with ``R`` compressed to the Gram's rank: its rows are
:math:`\sqrt{\lambda}\,v^T` over the non-zero eigenpairs, so :math:`RR^T = \operatorname{diag}(\lambda)`.
Then :math:`M = BB^T` with

.. math:: B = \big[\sqrt{w_1}\textstyle\bigotimes_i R_{i,k_{1i}}^T, \;\dots,\;
          \sqrt{w_J}\bigotimes_i R_{i,k_{Ji}}^T\big],

and :math:`\operatorname{tr} M^{1/2} = \|B\|_* = \operatorname{tr}(B^TB)^{1/2}`. The *row Gram*
:math:`B^TB` has one row per term and rank index, :math:`\sum_j \prod_i \operatorname{rank}
G_{i,k_{ji}}` in all, which is far fewer than the columns of ``M`` when terms put a rank-one Gram
(a total, :math:`J = \mathbf 1\mathbf 1^T`) on most attributes. Its block ``(a, b)`` is

.. math:: (B^TB)_{ab} = \sqrt{w_aw_b}\,\bigotimes_i C_i(k_{ai}, k_{bi}), \qquad
          C_i(k, l) = R_{i,k}R_{i,l}^T,

a Kronecker product of small *cross factors*: :math:`\operatorname{diag}(\lambda)` for equal
Grams, a column (row) when one of the two has rank one, a scalar when both have. On a vector of
term ``b``'s rows, a tensor with one axis per attribute, the block is a mode product per attribute:
it *contracts* the axes where term ``a`` has the lower rank, scales or rotates the axes of equal
rank, and *expands* the axes where term ``a`` has the higher rank. So a product with :math:`B^TB`
costs a few passes over each term's rows per term pair, and nothing of the size of ``M`` is made.

:class:`RowGram` orders the work so that the large tensors are touched few times: the
contractions of each input term are remembered and reused by every output term that needs them;
and an output term's contributions are summed *before* their expansions, grouped by the axes
(and factors) they expand, expanding one axis at a time (a Horner scheme over the axes), so an
output term with ``d`` axes costs about ``d`` full passes, however many terms feed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .slq import probe_brackets

__all__ = ["RowGram", "RowEstimate", "row_plan", "trace_sqrt_rows"]

#: Row-side estimates take ``probes * ROW_PROBE_ROWS / rows`` probes (at least 2, at most
#: ``probes``) and at least ``ROW_MIN_STEPS`` Lanczos steps (:func:`row_plan`).
ROW_PROBE_ROWS = 2**13
ROW_MIN_STEPS = 60

#: A key of the contractions or expansions still to apply: ``((axis, Gram index), ...)``, sorted.
_Key = tuple


class RowGram:
    r"""The row Gram :math:`B^TB` of :math:`M = \sum_j w_j \bigotimes_i R_{i,k_{ji}}^TR_{i,k_{ji}}`.

    Parameters
    ----------
    w2 : ndarray, shape (terms,)
        Non-negative term weights :math:`w_j` (squared weights of the workload's terms).
    index : ndarray of int, shape (terms, attributes)
        ``index[j, i]`` is the Gram of attribute ``i`` that term ``j`` uses.
    factors : list of list of ndarray
        ``factors[i][k]`` is :math:`R_{i,k}`, of shape ``(rank, n_i)``, with
        :math:`R_{i,k}R_{i,k}^T = \operatorname{diag}(\text{values}[i][k])`.
    values : list of list of ndarray
        The non-zero eigenvalues of each Gram, one per row of its ``R``.
    """

    def __init__(self, w2: np.ndarray, index: np.ndarray, factors: Sequence[Sequence[np.ndarray]],
                 values: Sequence[Sequence[np.ndarray]]):
        w2 = np.asarray(w2, dtype=float)
        index = np.asarray(index, dtype=np.intp)
        if index.ndim != 2 or index.shape[0] != w2.size or index.shape[1] != len(factors):
            raise ValueError(f"index must have shape (terms, attributes) = ({w2.size}, {len(factors)}), "
                             f"got {index.shape}")
        if np.any(w2 < 0):
            raise ValueError("term weights must be non-negative")
        for i, (Rs, vs) in enumerate(zip(factors, values)):
            for k, (R, v) in enumerate(zip(Rs, vs)):
                if R.ndim != 2 or R.shape[0] != np.size(v):
                    raise ValueError(f"attribute {i}, Gram {k}: R has shape {R.shape} but {np.size(v)} eigenvalues")
        self.root = np.sqrt(w2)
        self.index = index
        self.factors = [[np.asarray(R, dtype=float) for R in Rs] for Rs in factors]
        self.values = [[np.asarray(v, dtype=float) for v in vs] for vs in values]
        self.rank = [[R.shape[0] for R in Rs] for Rs in self.factors]
        self.shapes = [tuple(self.rank[i][k] for i, k in enumerate(ix)) for ix in index]
        sizes = [math.prod(s) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)
        self.n = int(self.offsets[-1])
        self._cross: dict[tuple[int, int, int], np.ndarray] = {}
        self._pairs = [self._plan(a) for a in range(len(self.shapes))]

    def _plan(self, a: int) -> list[tuple]:
        """How each input term reaches output term ``a``: ``(b, axes to contract, (axis, factor) to
        rotate, scale, axes still to expand)``; axes are classified by the ranks of the two Grams."""
        ka = self.index[a]
        plan = []
        for b, kb in enumerate(self.index):
            if self.root[b] == 0.0 or self.root[a] == 0.0:
                continue
            shrink, same, turn, grow = [], [], [], []
            for i, (k, m) in enumerate(zip(ka, kb)):
                ra, rb = self.rank[i][k], self.rank[i][m]
                (shrink if ra < rb else grow if ra > rb else same if k == m else turn).append((i, int(k)))
            plan.append((b, tuple(shrink), [(i, self.cross(i, k, kb[i])) for i, k in turn],
                         self._scale(a, b, tuple(same)), tuple((i, int(kb[i])) for i, _ in grow)))
        return plan

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.n

    def cross(self, i: int, k: int, m: int) -> np.ndarray:
        """:math:`C_i(k, m) = R_{i,k}R_{i,m}^T` (``rank_k x rank_m``); not used for ``k == m`` (diagonal)."""
        key = (i, k, m)
        if key not in self._cross:
            self._cross[key] = self.factors[i][k] @ self.factors[i][m].T
        return self._cross[key]

    def _scale(self, a: int, b: int, axes: _Key) -> np.ndarray | float:
        """Block ``(a, b)``'s weight times the eigenvalues of its equal Grams on ``axes``."""
        return self.root[a] * self.root[b] * self._diagonal(a, axes)

    def _diagonal(self, a: int, axes: _Key) -> np.ndarray | float:
        """The outer product of the eigenvalues on ``axes`` (equal Grams), shaped to broadcast on term ``a``'s tensor."""
        d = len(self.shapes[a])
        out: np.ndarray | float = 1.0
        for i, k in axes:  # axis 0 is the probes'
            shape = [1] * (d + 1)
            shape[i + 1] = self.rank[i][k]
            out = out * self.values[i][k].reshape(shape)
        return out

    @staticmethod
    def _mode(C: np.ndarray, T: np.ndarray, axis: int) -> np.ndarray:
        """The mode product of ``T`` with ``C`` on attribute ``axis`` (``C``'s columns against it;
        ``T``'s axis 0 runs over the probes)."""
        axis += 1
        if C.shape[1] == 1:  # an expansion from a rank-one axis: a broadcast product
            shape = [1] * T.ndim
            shape[axis] = C.shape[0]
            return T * C[:, 0].reshape(shape)
        return np.moveaxis(np.tensordot(C, T, axes=([1], [axis])), 0, axis)

    def _matmat(self, X: np.ndarray) -> np.ndarray:
        # one tensor per term, probes first: X arrives as (n, p) with its probes' columns contiguous
        XT = X.T
        p = XT.shape[0]
        terms = len(self.shapes)
        inputs = [XT[:, self.offsets[b]:self.offsets[b + 1]].reshape((p,) + self.shapes[b]) for b in range(terms)]
        contracted: dict[tuple[int, _Key], np.ndarray] = {}
        out = np.empty((p, self.n))
        for a in range(terms):
            groups: dict[_Key, np.ndarray] = {}  # every array here is this product's own: added to in place
            for b, shrink, turn, scale, key in self._pairs[a]:
                T = self._contract(inputs, contracted, b, shrink)
                for i, C in turn:
                    T = self._mode(C, T, i)
                T = T * scale  # the weights and the equal Grams' eigenvalues
                if key in groups:
                    groups[key] += T
                else:
                    groups[key] = T
            Y = self._expand(a, groups)
            block = out[:, self.offsets[a]:self.offsets[a + 1]].reshape((p,) + self.shapes[a])
            if Y is None:
                block[...] = 0.0
            else:
                block[...] = Y
        return out.T

    def _contract(self, inputs: list[np.ndarray], contracted: dict[tuple[int, _Key], np.ndarray], b: int,
                  key: _Key) -> np.ndarray:
        """Term ``b``'s input contracted on ``key``'s axes (against the output term's Grams), remembered
        in ``contracted`` for the other output terms of the same product."""
        if not key:
            return inputs[b]
        if (b, key) not in contracted:
            (i, k), rest = key[-1], key[:-1]
            contracted[(b, key)] = self._mode(self.cross(i, k, self.index[b, i]),
                                              self._contract(inputs, contracted, b, rest), i)
        return contracted[(b, key)]

    def _expand(self, a: int, groups: dict[_Key, np.ndarray]) -> np.ndarray | None:
        """The sum of the groups, each expanded on its key's axes to term ``a``'s ranks (a Horner
        scheme: the groups sharing the last axis's factor are summed before it is expanded)."""
        if not groups:
            return None
        if list(groups) == [()]:
            return groups[()]
        axis = max(i for key in groups for i, _ in key)
        ka = self.index[a]
        parts: dict[int | None, dict[_Key, np.ndarray]] = {}
        for key, T in groups.items():
            m = dict(key).get(axis)
            rest = tuple(e for e in key if e[0] != axis)
            sub = parts.setdefault(m, {})
            if rest in sub:
                sub[rest] += T
            else:
                sub[rest] = T
        total = None
        for m, sub in parts.items():
            T = self._expand(a, sub)
            if m is not None:
                T = self._mode(self.cross(axis, ka[axis], m), T, axis)
            if total is None:
                total = T
            elif np.broadcast_shapes(total.shape, T.shape) == total.shape:
                total += T  # the groups' arrays and the expansions are this product's own
            else:
                total = total + T
        return total

    def matmat(self, X: np.ndarray) -> np.ndarray:
        """:math:`B^TB X` for ``X`` of shape ``(n, p)`` (or ``(n,)``)."""
        X = np.asarray(X, dtype=float)
        if X.shape[0] != self.n:
            raise ValueError(f"X has {X.shape[0]} rows, the row Gram {self.n}")
        if X.ndim == 1:
            return self._matmat(X[:, None])[:, 0]
        return self._matmat(X)

    def diagonal(self) -> np.ndarray:
        """The row Gram's diagonal: :math:`w_a` times the outer product of term ``a``'s eigenvalues."""
        parts = []
        for a, ka in enumerate(self.index):
            d = self._diagonal(a, tuple((i, int(k)) for i, k in enumerate(ka)))
            parts.append((self.root[a] ** 2 * np.broadcast_to(d, (1,) + self.shapes[a])).ravel())
        return np.concatenate(parts)

    def dense(self) -> np.ndarray:
        """The row Gram as a dense array, from its Kronecker blocks (for tests and small blocks)."""
        if self.n > 20000:
            raise ValueError(f"the row Gram has {self.n:,} rows: too many to form densely")
        blocks = []
        for a, ka in enumerate(self.index):
            row = []
            for b, kb in enumerate(self.index):
                block = np.ones((1, 1)) * self.root[a] * self.root[b]
                for i, (k, m) in enumerate(zip(ka, kb)):
                    block = np.kron(block, np.diag(self.values[i][k]) if k == m else self.cross(i, k, m))
                row.append(block)
            blocks.append(row)
        return np.block(blocks)


def row_plan(rows: int, probes: int, steps: int, lanczos_work: float) -> tuple[int, int] | None:
    r"""Probes and Lanczos steps of a row-side estimate within ``lanczos_work`` (probes x steps x rows),
    or ``None`` when even the fewest (2 probes, ``ROW_MIN_STEPS`` steps) exceed it.

    Hutchinson's variance is :math:`2\|A^{1/2}\|_F^2` less the diagonal's share, which relative to
    :math:`(\operatorname{tr} A^{1/2})^2` falls like ``1/rows`` for a spread spectrum: ``probes``
    is scaled down by ``ROW_PROBE_ROWS / rows`` (at least 2). Probes are cut first, then steps."""
    m = min(steps, rows)
    p = int(min(probes, max(2, math.ceil(probes * ROW_PROBE_ROWS / rows))))
    while p > 2 and p * m * rows > lanczos_work:
        p -= 1
    while m > min(ROW_MIN_STEPS, rows) and p * m * rows > lanczos_work:
        m = max(min(ROW_MIN_STEPS, rows), m // 2)
    return (p, m) if p * m * rows <= lanczos_work else None


@dataclass(frozen=True)
class RowEstimate:
    """:func:`trace_sqrt_rows`'s estimate of :math:`\\operatorname{tr}(B^TB)^{1/2}`.

    ``stderr`` is ``hypot(sampling, truncation)``: the probes' standard error and the estimated
    Lanczos error (the changes of the estimate over the last two doublings of the steps; 0 when
    the quadrature is exact).
    """

    value: float
    stderr: float
    sampling: float
    truncation: float
    probes: int
    steps: int


def trace_sqrt_rows(op: RowGram, *, probes: int, steps: int, seed: int, reorthogonalize: bool) -> RowEstimate:
    r"""Estimate :math:`\operatorname{tr}(B^TB)^{1/2}` by stochastic Lanczos quadrature with the diagonal as control variate.

    The row Gram :math:`A = B^TB` of a block coupling several query attributes has eigenvalues
    spread over many decades (products of each attribute's, down to its null space), where
    Gauss quadrature of :math:`\sqrt{\cdot}` converges slowly: after ``m`` steps its bias falls
    roughly like ``1/m``. Most of the small eigenvalues belong to rows that the rank-one totals
    barely couple, so :math:`A` is close to its diagonal :math:`D` there, and the quadrature of
    :math:`D` from the same probe, with the same number of steps, makes nearly the same error;
    :math:`D`'s is known exactly, since :math:`v^TD^{1/2}v = \operatorname{tr}D^{1/2}` for a
    sign vector ``v``. Each probe's estimate is therefore

    .. math:: \operatorname{tr}D^{1/2} + q_m(A, v) - q_m(D, v),

    with :math:`q_m` the midpoint of the Gauss and Gauss-Radau rules after ``m`` steps: unbiased
    up to the difference of the two quadrature errors, with the same sampling variance as
    Hutchinson's estimator on :math:`A`. The Lanczos error left is *estimated*, as the sum of the
    changes of the mean over the last two doublings of the steps (``m/4 -> m/2 -> m``). That is
    no certified bracket: the Gauss and Gauss-Radau rules of :math:`A` alone bracket the truth,
    but after hundreds of steps on such spectra their gap is several times the value, while the
    corrected estimate moves by a few percent per doubling. On prefix-marginal blocks solved
    densely the corrected estimate converged from above and the sum of the last two changes was
    1.5 to 4 times its actual Lanczos error at 60 to 960 steps; where the estimate keeps moving at
    the same pace over several doublings (a slowly converging tail) it can fall short
    (docs/math.md, section 5.7).

    Parameters
    ----------
    op
        The row Gram.
    probes
        Number of Rademacher probes (at least 2).
    steps
        Lanczos steps per probe (capped at the row count).
    seed
        The probes' seed: the same probes serve ``A`` and ``D``.
    reorthogonalize
        Full reorthogonalisation (exact quadrature once ``steps`` reaches the row count);
        without it the recurrence holds a few vectors per probe (for millions of rows).
    """
    n = op.n
    m = min(steps, n)
    levels = sorted({max(1, m // 4), max(1, m // 2), m})
    d = op.diagonal()
    low_a, up_a = probe_brackets(op.matmat, n, levels, probes=probes, rng=seed, reorthogonalize=reorthogonalize)
    low_d, up_d = probe_brackets(lambda X: d[:, None] * X, n, levels, probes=probes, rng=seed,
                                 reorthogonalize=reorthogonalize)
    corrected = float(np.sum(np.sqrt(d))) + (low_a + up_a) / 2 - (low_d + up_d) / 2
    value = float(corrected[-1].mean())
    sampling = float(corrected[-1].std(ddof=1) / math.sqrt(probes))
    exact = reorthogonalize and m == n
    means = corrected.mean(axis=1)
    truncation = 0.0 if exact else float(np.sum(np.abs(np.diff(means))))
    return RowEstimate(value, math.hypot(sampling, truncation), sampling, truncation, probes, m)
