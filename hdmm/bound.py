r"""The SVD lower bound on the error of any strategy (docs/math.md, section 5).

For every strategy ``A`` (Li & Miklau),

.. math:: \Delta_2(A)^2\,\mathrm{tr}\big(W^TW (A^TA)^+\big) \;\ge\; \frac{\|W\|_*^2}{N},
          \qquad \|W\|_* = \sum_i \sigma_i(W) = \mathrm{tr}\big((W^TW)^{1/2}\big),

so no strategy answers ``W`` with total squared error below
``noise_variance(1) * ||W||_*^2 / N``; it bounds Laplace noise too, since
:math:`\Delta_1 \ge \Delta_2`.

How :math:`\|W\|_*` is computed, from the structure of ``W = VStack_j c_j (x)_i W_i^(j)``:

1. One Kronecker product: :math:`\|W\|_* = |c| \prod_i \|W_i\|_*` (exact).
2. Marginals algebra (every factor Gram :math:`aI + bJ`): the eigenvalues are read off the
   :math:`E_T` basis (exact, :mod:`hdmm.marginals`).

In the other cases equal factor Grams are kept once per attribute and equal terms merged first
(workload builders make a new query matrix per marginal), then:

3. Marginal-type unions whose query Grams fix the ones vector (per attribute one query Gram
   :math:`G_i` with :math:`G_i\mathbf{1} = g_i\mathbf{1}`, or a total): exact, from each
   attribute's eigenvalues, over the subsets of the downward closure (:func:`_subset_route`).
4. Otherwise each attribute's factor Grams are split into their common eigenvectors and an
   invariant rest: the Gram splits into one block per joint eigenvalue signature (identical
   blocks counted once, with their multiplicity), each a union over the attributes that kept
   a rest. Grams that are all diagonal, or all :math:`a_k I + b_k B` for one shared ``B``
   (an attribute with the identity, a total and one range workload, say), split from ``B``'s
   eigenvalues alone (closed form or banded for ranges); other attributes are split by a
   dense eigensolver when that pays (small, or reused by many blocks) and kept whole
   otherwise. Blocks that are scalars are summed in one vectorised pass; the others are
   solved exactly by a dense eigensolver on the cheaper of their ``N_b x N_b`` Gram and their
   ``m_b x m_b`` row Gram (rows compressed to each factor's rank), else estimated by
   stochastic Lanczos quadrature on the smaller of the two (the row Gram through its Kronecker
   cross factors, :mod:`hdmm.bound_rows`, docs/math.md section 5.7: on Adult prefix-marginals
   the block of the five prefix attributes has 8.4e9 columns but 9.1e6 rows), reported with
   its standard error, or (without estimates, too large to probe, past the estimate's work
   budget or past a cap on the dense work) bounded from below by its Kronecker row blocks.
   Blocks whose term weights are proportional are solved once.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import dataclass
from functools import reduce

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from .marginals import trace_spectrum
from .matrix import Explicit, Identity, Kronecker, Matrix, Ones, Sum, Weighted
from .privacy import Privacy
from .bound_rows import RowGram, row_plan, trace_sqrt_rows
from .slq import trace_sqrt
from .spectral import blocks
from .kron_union import KronUnion, kron_union
from .structure import ZERO_RTOL, classify
from .threads import one_blas_thread

__all__ = ["SVDBound", "svd_bound", "nuclear_norm"]

#: Largest per-attribute domain whose factor Grams are eigen-decomposed densely.
FACTOR_LIMIT = 8192
#: Largest number of eigenvalue blocks needing a solve of their own that the commuting-attribute split may create.
BLOCK_LIMIT = 4096
#: Largest (scalar blocks) x (union terms) summed in the vectorised pass of the split (work),
#: and largest number of entries it holds at once (memory: union terms times all but the
#: largest attribute's classes).
SCALAR_WORK_LIMIT = 2**31
SCALAR_TAIL_LIMIT = 2**25
#: Largest block (in columns) whose trace square root is estimated by stochastic Lanczos
#: quadrature (its probes hold a few vectors of this length each); a larger block contributes
#: the lower bound :math:`\|W\|_* \ge (\sum_j \|W_j\|_*^2)^{1/2}` over its Kronecker terms
#: :math:`W_j` instead (docs/math.md, section 5.4), and the bound is no longer exact.
SLQ_MAX_N = 2**21
#: Largest row Gram (in rows, the sum over terms of the product of their factors' ranks) whose
#: trace square root is estimated on the row side (:mod:`hdmm.bound_rows`) when it has fewer rows
#: than the block has columns; each probe holds about eight vectors of this length.
ROW_SLQ_MAX_N = 2**24
#: Row-side estimates reorthogonalise up to ``ROW_REORTHOGONALIZE_N`` rows (their probes and
#: steps: :func:`hdmm.bound_rows.row_plan`).
ROW_REORTHOGONALIZE_N = 2**13
#: Default largest work (probes x steps x rows) of one row-side estimate: about a minute of
#: products at one BLAS thread; past it probes, then steps are cut (to 2 and ``ROW_MIN_STEPS``),
#: and a block needing more gets the row-block lower bound.
LANCZOS_WORK = 2**32

#: Largest block solved by a dense eigensolver by default (the solve costs the cube of the block
#: size); larger blocks are estimated.
EXACT_LIMIT = 8192
#: Attributes whose Grams share no base are split into common eigenvectors (a dense
#: eigendecomposition with eigenvectors) up to ``SPLIT_MAX_N`` values: always up to
#: ``SPLIT_ALWAYS_N``, beyond only when at least ``SPLIT_MIN_BLOCKS`` blocks would use the
#: split or the blocks would otherwise be too large to solve exactly.
SPLIT_MAX_N = 4096
SPLIT_ALWAYS_N = 512
SPLIT_MIN_BLOCKS = 8


@dataclass(frozen=True)
class SVDBound:
    """A lower bound on the expected total squared error of any strategy for a workload.

    Attributes
    ----------
    value : float
        The bound, in units of total squared error under ``privacy``.
    exact : bool
        Whether ``value`` is exact, or an estimate (stochastic Lanczos quadrature), or a weaker
        but still valid lower bound (blocks too large to estimate; ``method`` says so).
    stderr : float
        Standard error of the estimate (0 when exact).
    privacy : Privacy
        The privacy definition the bound is for.
    queries : int
        Number of workload queries (for :attr:`rmse`).
    method : str
        How the singular values were obtained.
    lower : bool
        Whether ``value``, though not exact, is certainly a lower bound (no estimated block).
    """

    value: float
    exact: bool
    stderr: float
    privacy: Privacy
    queries: int
    method: str
    lower: bool = False

    @property
    def certain(self) -> bool:
        """Whether ``value`` is certainly a lower bound: exact, or a weaker bound (not an estimate)."""
        return self.exact or self.lower

    def __float__(self) -> float:
        return self.value

    @property
    def rmse(self) -> float:
        """The bound expressed as a root mean squared error per query."""
        return math.sqrt(self.value / self.queries)

    def __repr__(self) -> str:
        est = "exact" if self.exact else "weaker lower bound" if self.lower else f"estimate +/- {self.stderr:.3g}"
        return (f"SVDBound(total squared error {self.value:.6g}, RMSE {self.rmse:.6g}, {est}, {self.method}, "
                f"{self.privacy.description})")


@dataclass(frozen=True)
class _Norm:
    """A nuclear norm (possibly estimated) with its standard error, or a lower bound on it (``lower``)."""

    value: float
    stderr: float
    method: str
    lower: bool = False
    work: float = 0.0  # the cube of the dense eigensolve's size, if one was made


def _sqrt_sum(eigenvalues: np.ndarray) -> float:
    """The sum of the square roots of a PSD matrix's eigenvalues (rounding-level negatives count as 0)."""
    return float(np.sum(np.sqrt(np.clip(eigenvalues, 0.0, None))))


def _eig_sqrt_sum(M: np.ndarray) -> float:
    return _sqrt_sum(np.linalg.eigvalsh(M))


#: A sparse factor Gram whose bandwidth is at most this fraction of its size is eigen-decomposed as a band.
BAND_FRACTION = 1 / 16


def _band(G: Matrix) -> np.ndarray | None:
    """The upper band of a sparse banded Gram in LAPACK form (``eigvals_banded``), or ``None``.

    Local workloads (ranges of bounded width) have banded Grams: their eigenvalues cost
    ``O(n^2 u)`` for bandwidth ``u`` instead of a dense ``O(n^3)``.
    """
    if not (isinstance(G, Explicit) and G.is_sparse):
        return None
    coo = sp.coo_array(G.matrix)
    n = G.shape[0]
    upper = coo.col >= coo.row
    width = int((coo.col - coo.row).max(initial=0))
    if width > BAND_FRACTION * n:
        return None
    band = np.zeros((width + 1, n))
    band[width + coo.row[upper] - coo.col[upper], coo.col[upper]] = coo.data[upper]
    return band


def _eigen_route(G: Matrix) -> str:
    """How :func:`_gram_eigenvalues` gets a factor Gram's eigenvalues: ``"closed form"``, ``"band"`` or ``"dense"``."""
    if isinstance(G, Weighted):
        return _eigen_route(G.base)
    if isinstance(G, (Identity, Ones)) or G.spectrum() is not None:
        return "closed form"
    return "dense" if _band(G) is None else "band"


def _gram_eigenvalues(G: Matrix, dense: np.ndarray | None = None) -> np.ndarray:
    """The eigenvalues of a factor Gram: closed form (identity, all-ones, prefixes, all ranges,
    their multiples), banded solver (ranges of bounded width) or dense (``dense``, when already
    formed)."""
    n = G.shape[0]
    route = _eigen_route(G)
    if isinstance(G, Weighted) and route != "dense":
        return G.weight * _gram_eigenvalues(G.base)
    if route == "closed form":
        if isinstance(G, Identity):
            return np.ones(n)
        if isinstance(G, Ones):
            return np.concatenate([[float(n)], np.zeros(n - 1)])
        return G.spectrum().values
    if route == "band":
        return scipy.linalg.eigvals_banded(_band(G), check_finite=False)
    return np.linalg.eigvalsh(G.dense(max_entries=FACTOR_LIMIT**2) if dense is None else dense)


def factor_nuclear_norm(f: Matrix) -> float:
    """``||f||_*`` of a one-attribute factor.

    Identities and totals in closed form; a factor with at most half as many rows as columns from
    its small row Gram :math:`ff^T`; otherwise from the eigenvalues of its Gram :math:`f^Tf`
    (:func:`_gram_eigenvalues`).
    """
    if isinstance(f, Identity):
        return float(f.shape[0])
    if isinstance(f, Ones):
        return math.sqrt(f.shape[0] * f.shape[1])
    m, n = f.shape
    if 2 * m <= n:
        F = f.dense(max_entries=FACTOR_LIMIT * n)
        return _eig_sqrt_sum(F @ F.T)
    return _sqrt_sum(_gram_eigenvalues(f.gram()))


@dataclass
class _AttributeSplit:
    r"""One attribute's factor Grams split into common eigenvectors and an invariant rest.

    ``lam[k, c]`` is the eigenvalue of Gram ``k`` on class ``c`` of common eigenvectors
    (vectors that are eigenvectors of every Gram, grouped by their eigenvalues) and
    ``mult[c]`` the class's dimension. ``rest[k]`` is Gram ``k`` restricted to the orthogonal
    complement of all common eigenvectors (empty when the Grams commute), a subspace every
    Gram maps into itself; ``rest_ops[k]`` is the same as an implicit matrix, for products:
    the Gram itself (fast for prefixes and ranges) when the attribute is kept whole.
    """

    lam: np.ndarray
    mult: np.ndarray
    rest: list[np.ndarray]
    rest_ops: list[Matrix]

    @classmethod
    def whole(cls, grams: list[np.ndarray], ops: list[Matrix]) -> _AttributeSplit:
        """No common eigenvectors: every Gram is its own rest."""
        return cls(np.zeros((len(grams), 0)), np.zeros(0), grams, ops)

    @classmethod
    def commuting(cls, lam: np.ndarray, grams: list[np.ndarray]) -> _AttributeSplit:
        """Every eigenvector common, with eigenvalues ``lam`` (one row per Gram): no rest."""
        classes, mult = _classes(_clean(lam, grams))
        return cls(classes, mult, [np.zeros((0, 0))] * len(grams), [])

    @property
    def options(self) -> int:
        return self.mult.size + (1 if self.rest[0].size else 0)


def _nonzero(values: np.ndarray) -> np.ndarray:
    """Which eigenvalues of one Gram count as non-zero (``ZERO_RTOL``)."""
    return values > ZERO_RTOL * max(values.max(initial=0.0), 1e-300)


def _clean(lam: np.ndarray, grams: list[np.ndarray]) -> np.ndarray:
    """Eigenvalues (one row per Gram) with the rounding-level ones (``ZERO_RTOL`` of their own
    Gram's largest) set to 0: a zero is a zero in any product."""
    top = np.array([max(float(np.abs(G).max(initial=0.0)), float(np.abs(row).max(initial=0.0)))
                    for G, row in zip(grams, lam)])
    return np.where(lam > ZERO_RTOL * top[:, None], lam, 0.0)


#: Common eigenvectors whose eigenvalues agree to this relative tolerance on every Gram share a class.
CLASS_RTOL = 1e-10


def _classes(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group common eigenvectors (columns of ``lam``, one eigenvalue per Gram) whose eigenvalues
    agree on every Gram (``CLASS_RTOL``): each group's mean eigenvalues and its size."""
    if not lam.shape[1]:
        return np.zeros((lam.shape[0], 0)), np.zeros(0)
    ordered = lam[:, np.lexsort(lam[::-1])]
    gap = np.abs(np.diff(ordered, axis=1))
    new = np.any(gap > CLASS_RTOL * np.maximum(np.abs(ordered[:, 1:]), np.abs(ordered[:, :-1])), axis=0)
    group = np.concatenate([[0], np.cumsum(new)])
    size = np.bincount(group).astype(float)
    return np.stack([np.bincount(group, weights=row) for row in ordered]) / size, size


def _shared_base_split(grams: list[np.ndarray], ops: list[Matrix]) -> _AttributeSplit | None:
    r"""The split when the Grams are all diagonal, or all :math:`a_k I + b_k B` for one shared Gram ``B``.

    Then every eigenvector of ``B`` is common to all, with eigenvalues :math:`a_k + b_k\lambda`,
    so only ``B``'s eigenvalues are needed (:func:`_gram_eigenvalues`: closed form or banded
    for range workloads, so a Gram with such a route is the preferred ``B``), no eigenvectors.
    ``None`` when the Grams are not of that form.
    """
    n = grams[0].shape[0]
    moving = [k for k, G in enumerate(grams) if not _is_diagonal(G)]
    if not moving:  # all diagonal: the unit vectors are the common eigenvectors
        return _AttributeSplit.commuting(np.stack([np.diagonal(G) for G in grams]), grams)
    base = min(moving, key=lambda k: _eigen_route(ops[k]) == "dense")
    B = grams[base]
    off = np.abs(B)
    np.fill_diagonal(off, 0.0)
    peak = np.unravel_index(np.argmax(off), (n, n))
    del off
    coefs = []
    for G in grams:
        b = G[peak] / B[peak]
        a = float(np.mean(np.diagonal(G) - b * np.diagonal(B)))
        rest = G - b * B
        rest[np.diag_indices(n)] -= a
        if np.abs(rest).max() > ZERO_RTOL * max(np.abs(G).max(), 1e-300):
            return None
        coefs.append((a, b))
    values = _gram_eigenvalues(ops[base], B)
    return _AttributeSplit.commuting(np.stack([a + b * values for a, b in coefs]), grams)


def _split_attribute(grams: list[np.ndarray], ops: list[Matrix], rng: np.random.Generator) -> _AttributeSplit:
    """Find the common eigenvectors of symmetric matrices by diagonalising a random mix.

    Every common eigenvector is an eigenvector of ``sum_k r_k G_k``; for random ``r`` its
    eigenvectors are common eigenvectors exactly when their residuals vanish. The remaining
    eigenvectors span the orthogonal complement, which is invariant under every ``G_k``.
    """
    scale = max(float(np.abs(G).max()) for G in grams) or 1.0
    n = grams[0].shape[0]
    _, V = np.linalg.eigh(sum(rng.uniform(1.0, 2.0) * G for G in grams))
    images = [G @ V for G in ops]  # implicit products: banded, prefix and range Grams are cheap
    lam = np.stack([np.einsum("ij,ij->j", V, GV) for GV in images])
    residual = np.max([np.linalg.norm(GV - V * values, axis=0) for GV, values in zip(images, lam)], axis=0)
    common = residual <= 1e-9 * scale * n
    classes, mult = _classes(_clean(lam[:, common], grams))
    U = V[:, ~common]
    rest = [(R + R.T) / 2 for R in (U.T @ GV[:, ~common] for GV in images)]
    return _AttributeSplit(classes, mult, rest, [Explicit(R) for R in rest])


class _Eigen:
    """Eigenvalues (``values``) and eigendecompositions (``__call__``) of dense symmetric
    matrices, remembered by content: an attribute's Gram is decomposed once however many
    blocks (or equal factors) of the union it appears in. A diagonal matrix is its own
    decomposition (eigenvalues unsorted)."""

    def __init__(self):
        self._values: dict[tuple, np.ndarray] = {}
        self._pairs: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._ops: dict[tuple, Matrix] = {}
        self._seen: dict[int, tuple[np.ndarray, tuple]] = {}  # id -> (the array, kept alive; its key)

    def register(self, G: np.ndarray, op: Matrix) -> None:
        """Remember that ``G`` is the dense form of ``op``: its eigenvalues may have a cheap route."""
        self._ops.setdefault(self._key(G), op)

    @staticmethod
    def content(G: np.ndarray) -> tuple:
        """A key equal for arrays of equal shape and content."""
        G = np.ascontiguousarray(G)
        return G.shape, hashlib.blake2b(memoryview(G).cast("B"), digest_size=16).digest()

    def _key(self, G: np.ndarray) -> tuple:
        # the same array is looked up once per block it appears in: hash it once (the arrays are
        # never written to after they are made)
        seen = self._seen.get(id(G))
        if seen is None or seen[0] is not G:
            seen = self._seen[id(G)] = (G, self.content(G))
        return seen[1]

    def values(self, G: np.ndarray) -> np.ndarray:
        key = self._key(G)
        if key in self._pairs:
            return self._pairs[key][0]
        if key not in self._values:
            if key in self._ops:
                self._values[key] = _gram_eigenvalues(self._ops[key], G)
            else:
                self._values[key] = np.diagonal(G).copy() if _is_diagonal(G) else np.linalg.eigvalsh(G)
        return self._values[key]

    def __call__(self, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = self._key(G)
        if key not in self._pairs:
            self._pairs[key] = (np.diagonal(G).copy(), np.eye(G.shape[0])) if _is_diagonal(G) else np.linalg.eigh(G)
        return self._pairs[key]


def _is_diagonal(G: np.ndarray) -> bool:
    return np.count_nonzero(G) == np.count_nonzero(np.diagonal(G))


def _rank(G: np.ndarray, eig: _Eigen) -> int:
    return int(np.count_nonzero(_nonzero(eig.values(G))))


def _compressed(G: np.ndarray, eig: _Eigen) -> np.ndarray:
    """``R`` with ``R^T R = G`` and one row per non-zero eigenvalue (:func:`_rank` many)."""
    return _compressed_pair(G, eig)[0]


def _compressed_pair(G: np.ndarray, eig: _Eigen) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_compressed`'s ``R`` and the eigenvalues of its rows (``R R^T`` is their diagonal)."""
    vals, vecs = eig(G)
    keep = _nonzero(vals)
    return (vecs[:, keep] * np.sqrt(vals[keep])).T, vals[keep]


def _kron(scale: float, factors: list[np.ndarray]) -> np.ndarray:
    """``scale`` times the Kronecker product of ``factors``, the ``1 x 1`` ones multiplied in as scalars."""
    out = None
    for f in factors:
        if f.shape == (1, 1):
            scale *= float(f[0, 0])
        else:
            out = f if out is None else np.kron(out, f)
    return np.full((1, 1), scale) if out is None else scale * out


def _row_estimate(w2: np.ndarray, index: np.ndarray, grams: list[list[np.ndarray]], eig: _Eigen, probes: int,
                  steps: int, rng: np.random.Generator) -> _Norm:
    """A block's trace square root estimated on its row Gram (:mod:`hdmm.bound_rows`)."""
    pairs = [[_compressed_pair(G, eig) for G in gs] for gs in grams]
    op = RowGram(w2, index, [[R for R, _ in ps] for ps in pairs], [[v for _, v in ps] for ps in pairs])
    est = trace_sqrt_rows(op, probes=probes, steps=steps, seed=int(rng.integers(2**63)),
                          reorthogonalize=op.n <= ROW_REORTHOGONALIZE_N)
    return _Norm(est.value, est.stderr, f"stochastic Lanczos quadrature on the {op.n:,}-row Gram, diagonal control "
                                        f"variate ({est.probes} probes, {est.steps} steps)")


def _block_norm(w2: np.ndarray, index: np.ndarray, parts: list[_AttributeSplit], exact_limit: int,
                probes: int, steps: int, rng: np.random.Generator, eig: _Eigen, estimate: bool = True,
                lanczos_work: float = math.inf) -> _Norm:
    """The trace of ``(sum_j w2_j (x)_i parts[i].rest[index[j, i]])^(1/2)`` (or, for a block beyond
    ``exact_limit`` when ``estimate`` is false, the lower bound from its Kronecker row blocks)."""
    grams = [part.rest for part in parts]
    live = w2 > 0
    index, merged = np.unique(index[live], axis=0, return_inverse=True)  # equal terms of the block are one
    w2 = np.bincount(merged.ravel(), weights=w2[live], minlength=len(index))
    if w2.size == 1:  # one Kronecker product: the product of its factors' norms
        value = math.sqrt(float(w2[0])) * math.prod(_sqrt_sum(eig.values(grams[i][k])) for i, k in enumerate(index[0]))
        return _Norm(value, 0.0, "Kronecker product of factor norms")
    sizes = [g[0].shape[0] for g in grams]
    cols = math.prod(sizes)
    # the row route decomposes every factor Gram (rank, then eigenvectors): take it when cheaper
    factor_cost = sum(3 * n**3 * len(g) for n, g in zip(sizes, grams))
    if cols <= exact_limit and cols**3 <= factor_cost:
        rows = cols
    else:
        ranks = [[_rank(G, eig) for G in gs] for gs in grams]
        rows = int(sum(math.prod(ranks[i][k] for i, k in enumerate(ix)) for ix in index))
    if min(cols, rows) <= exact_limit:
        if cols <= exact_limit and cols**3 <= rows**3 + factor_cost:
            M = sum(w * reduce(np.kron, [grams[i][k] for i, k in enumerate(ix)]) for w, ix in zip(w2, index))
            return _Norm(_eig_sqrt_sum(M), 0.0, f"dense eigenvalues ({cols:,} x {cols:,} Gram)", work=float(cols)**3)
        factors = [[_compressed(G, eig) for G in gs] for gs in grams]
        cross = [[[Ra @ Rb.T for Rb in Rs] for Ra in Rs] for Rs in factors]
        blocks = [
            [_kron(math.sqrt(wa * wb), [cross[i][a][b] for i, (a, b) in enumerate(zip(ia, ib))])
             for wb, ib in zip(w2, index)]
            for wa, ia in zip(w2, index)
        ]
        M = np.block(blocks)
        return _Norm(_eig_sqrt_sum(M), 0.0, f"dense eigenvalues ({M.shape[0]:,} x {M.shape[0]:,} row Gram)",
                     work=float(M.shape[0])**3)
    if estimate and rows < cols and rows <= ROW_SLQ_MAX_N:
        plan = row_plan(rows, probes, steps, lanczos_work)
        if plan is not None:
            return _row_estimate(w2, index, grams, eig, *plan, rng)
    if cols > SLQ_MAX_N or not estimate or rows < cols and rows <= ROW_SLQ_MAX_N:
        # too large to probe (or no estimate wanted): a valid lower bound from the row blocks (one per term), exact=False
        term_norms = [math.sqrt(float(w)) * math.prod(_sqrt_sum(eig.values(grams[i][k])) for i, k in enumerate(ix))
                      for w, ix in zip(w2, index)]
        why = "; past lanczos_work" if estimate and rows < cols and rows <= ROW_SLQ_MAX_N else ""
        return _Norm(math.sqrt(sum(v * v for v in term_norms)), 0.0,
                     f"lower bound from its {len(term_norms)} Kronecker row blocks ({cols:,} columns{why})", lower=True)
    gram = Sum([Weighted(Kronecker([parts[i].rest_ops[k] for i, k in enumerate(ix)]), w) for w, ix in zip(w2, index)])
    est = trace_sqrt(gram._matmat, cols, probes=probes, max_steps=steps, rng=rng)
    # the quadrature bracket's half-width bounds the Lanczos bias; add it to the sampling error
    error = math.hypot(est.stderr, (est.upper - est.lower) / 2)
    return _Norm(est.value, error, f"stochastic Lanczos quadrature ({probes} probes, {est.steps} steps)")


def _scalar_blocks(w2: np.ndarray, index: np.ndarray, splits: list[_AttributeSplit]) -> float:
    r"""The blocks where every attribute chose a class of common eigenvectors, all at once.

    Each is a scalar :math:`s_c = \sum_j w_j^2 \prod_i \lambda_i[k_{ji}, c_i]` of multiplicity
    :math:`\prod_i m_i[c_i]`, contributing :math:`\sqrt{s_c}` per dimension. The attribute
    with the most classes is walked in chunks against the outer product of the others'.
    """
    order = sorted(range(len(splits)), key=lambda i: splits[i].mult.size)
    lead = splits[order[-1]]
    tail, tail_mult = w2[:, None], np.ones(1)
    for i in order[:-1]:
        tail = (tail[:, :, None] * splits[i].lam[index[:, i]][:, None, :]).reshape(len(w2), -1)
        tail_mult = np.outer(tail_mult, splits[i].mult).ravel()
    lam = lead.lam[index[:, order[-1]]]  # eigenvalues are clean (_clean): no rounding-level ones
    total = 0.0
    for chunk in blocks(lam.shape[1], tail.shape[1]):
        values = lam[:, chunk].T @ tail
        total += float(lead.mult[chunk] @ np.sqrt(np.clip(values, 0.0, None)) @ tail_mult)
    return total


def _distinct(grams: list[list[np.ndarray]], ops: list[list[Matrix]], index: np.ndarray,
              w2: np.ndarray) -> tuple[list[list[np.ndarray]], list[list[Matrix]], np.ndarray, np.ndarray]:
    r"""The union's Gram with equal factor Grams kept once per attribute and equal terms merged.

    A union's factors are distinct as objects, not always as matrices (``Prefix(100)`` built
    once per marginal): equal Grams are found by content, and terms that then use the same
    Grams on every attribute are one term whose squared weight is the sum of theirs (the
    Gram :math:`\sum_j w_j^2 \bigotimes_i G_i^{(j)}` is unchanged).
    """
    new_grams, new_ops, remap = [], [], []
    for gs, os in zip(grams, ops):
        seen: dict[tuple, int] = {}
        lookup = np.empty(len(gs), dtype=np.intp)
        kept_g, kept_o = [], []
        for k, (G, op) in enumerate(zip(gs, os)):
            key = _Eigen.content(G)
            if key not in seen:
                seen[key] = len(kept_g)
                kept_g.append(G)
                kept_o.append(op)
            lookup[k] = seen[key]
        new_grams.append(kept_g)
        new_ops.append(kept_o)
        remap.append(lookup)
    index = np.stack([lookup[index[:, i]] for i, lookup in enumerate(remap)], axis=1) if remap else index
    terms, inverse = np.unique(index, axis=0, return_inverse=True)
    return new_grams, new_ops, terms, np.bincount(inverse.ravel(), weights=w2, minlength=len(terms))


#: The subset route (:func:`_subset_route`) enumerates, per term, every subset of the attributes
#: where it has its query matrix; beyond this many subsets in all it is not taken.
SUBSET_LIMIT = 2**22


def _subset_route(grams: list[list[np.ndarray]], ops: list[list[Matrix]], index: np.ndarray,
                  w2: np.ndarray) -> float | None:
    r"""The exact nuclear norm of a marginal-type union whose query Grams fix the ones vector, or ``None``.

    Applies when on every attribute ``i`` each factor Gram is a multiple of one query Gram
    :math:`G_i` or of :math:`J = \mathbf{1}\mathbf{1}^T` (a total), and :math:`G_i\mathbf{1} =
    g_i\mathbf{1}` (identities, circulant queries, ...). With :math:`S_j` the attributes where
    term ``j`` has its query Gram (times :math:`s_{ij}`; :math:`t_{ij}J` elsewhere), the Gram is
    block diagonal over the subsets ``T`` of the downward closure, block ``T`` being
    :math:`c_T \bigotimes_{i\in T} QG_iQ` on :math:`\bigotimes_{i\in T}\mathbf{1}^\perp`, where
    :math:`c_T = \sum_{j: S_j\supseteq T} w_j^2 \prod_{i\in S_j} s_{ij}
    \prod_{i\in S_j\setminus T} g_i \prod_{i\notin S_j} t_{ij}n_i`, so
    :math:`\|W\|_* = \sum_T c_T^{1/2}\prod_{i\in T}\tau_i` with :math:`\tau_i` the sum of the
    square roots of :math:`G_i`'s eigenvalues less :math:`g_i^{1/2}` (docs/math.md, section 5.4).
    """
    d = len(grams)
    query = np.zeros(index.shape, dtype=bool)  # the term has its attribute's query Gram there
    scale = np.ones(index.shape)  # s_ij on a query Gram, t_ij n_i on a total
    g, tau = np.zeros(d), np.zeros(d)
    for i, gs in enumerate(grams):
        n = gs[0].shape[0]
        base, factor, is_query = None, [], []
        for k, G in enumerate(gs):
            peak = float(np.abs(G).max(initial=0.0))
            if np.all(np.abs(G - G[0, 0]) <= ZERO_RTOL * peak):  # t J (t = 0 for a zero factor)
                factor.append(float(G[0, 0]) * n)
                is_query.append(False)
                continue
            if base is None:
                base = G
                row = G.sum(axis=1)
                g[i] = float(row.mean())
                if np.abs(row - g[i]).max() > ZERO_RTOL * n * peak:
                    return None  # the query Gram does not fix the ones vector
                values = _gram_eigenvalues(ops[i][k], G)
                values = np.where(_nonzero(values), values, 0.0)  # rounding-level: zero (its root would not be)
                if g[i] <= ZERO_RTOL * float(values.max(initial=0.0)):
                    g[i] = 0.0
                tau[i] = max(_sqrt_sum(values) - math.sqrt(max(g[i], 0.0)), 0.0)
            ratio = float(np.vdot(base, G) / np.vdot(base, base))
            if np.abs(G - ratio * base).max() > ZERO_RTOL * peak:
                return None  # two different query Grams on one attribute
            factor.append(ratio)
            is_query.append(True)
        query[:, i] = np.asarray(is_query)[index[:, i]]
        scale[:, i] = np.asarray(factor)[index[:, i]]
    sizes = query.sum(axis=1)
    if float(np.sum(2.0**sizes)) > SUBSET_LIMIT:
        return None
    coef = w2 * np.prod(scale, axis=1)
    subsets, weights = [], []
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        attrs = np.nonzero(query[rows])[1].reshape(len(rows), size)  # S_j, in order
        for r in range(size + 1):
            for chosen in itertools.combinations(range(size), r):
                rest = [p for p in range(size) if p not in chosen]
                T = np.zeros((len(rows), d), dtype=bool)
                T[np.arange(len(rows))[:, None], attrs[:, list(chosen)]] = True
                subsets.append(np.packbits(T, axis=1))
                weights.append(coef[rows] * np.prod(g[attrs[:, rest]], axis=1))
    packed = np.concatenate(subsets)
    keys, which = np.unique(packed, axis=0, return_inverse=True)
    c = np.bincount(which.ravel(), weights=np.concatenate(weights), minlength=len(keys))
    T = np.unpackbits(keys, axis=1, count=d).astype(bool)
    return float(np.sqrt(np.clip(c, 0.0, None)) @ np.prod(np.where(T, tau, 1.0), axis=1))


def nuclear_norm(union: KronUnion, *, exact_limit: int = EXACT_LIMIT, probes: int = 30, steps: int = 480,
                 seed: int | None = None, estimate: bool = True, work_limit: float | None = None,
                 lanczos_work: float = LANCZOS_WORK) -> _Norm:
    r""":math:`\|W\|_*` of a union of Kronecker products (see the module docstring, route 3).

    Each attribute is split into classes of common eigenvectors of its factor Grams (a scalar
    per Gram) and an invariant rest (small matrices). The union's Gram is then block diagonal
    with one block per choice of class-or-rest on every attribute: a block is a union over the
    attributes that chose their rest, its terms scaled by the chosen eigenvalues, and it occurs
    with the product of the classes' dimensions as multiplicity. Blocks where no attribute chose
    its rest are scalars, summed in one vectorised pass (:func:`_scalar_blocks`); the others
    are solved one by one (:func:`_block_norm`). Once the dense eigensolves made add up to
    ``work_limit`` (the sum of their sizes cubed; ``None``: no limit), the blocks left are
    bounded from below by their Kronecker row blocks instead (the result is then ``lower``).
    Marginal-type unions whose query Grams fix the ones vector take the closed form of
    :func:`_subset_route` instead of the split.
    """
    rng = np.random.default_rng(seed)
    ops = [[f.gram() for f in fs] for fs in union.factors]
    grams = [[G.dense(max_entries=FACTOR_LIMIT**2) for G in gs] for gs in ops]
    grams, ops, index, w2 = _distinct(grams, ops, union.index, union.weights**2)
    closed = _subset_route(grams, ops, index, w2)
    if closed is not None:
        return _Norm(closed, 0.0, "subset basis (query Grams fixing the ones vector)")
    eig = _Eigen()
    for gs, os in zip(grams, ops):
        for G, op in zip(gs, os):
            eig.register(G, op)
    whole = [_AttributeSplit.whole(gs, os) for gs, os in zip(grams, ops)]
    shared = [_shared_base_split(gs, os) for gs, os in zip(grams, ops)]
    splits = [whole[i] if s is None else s for i, s in enumerate(shared)]
    # a general split costs a few dense n x n eigensolves; it pays on small attributes, when
    # enough blocks (choices on the other attributes) reuse it, or when it may bring a block
    # the attribute is whole in down to an exact size
    for i in sorted((i for i, s in enumerate(shared) if s is None), key=lambda i: union.sizes[i]):
        others = [splits[j] for j in range(union.dim) if j != i]
        blocks_using = math.prod(s.options for s in others)
        block_size = union.sizes[i] * math.prod(s.rest[0].shape[0] or 1 for s in others)
        pays = union.sizes[i] <= SPLIT_ALWAYS_N or blocks_using >= SPLIT_MIN_BLOCKS or block_size > exact_limit
        if pays and union.sizes[i] <= SPLIT_MAX_N:
            splits[i] = _split_attribute(grams[i], ops[i], rng)

    def too_much() -> bool:
        classes = sorted(s.mult.size for s in splits)
        solves = math.prod(s.options for s in splits) - math.prod(classes)
        scalar_work = math.prod(classes) * w2.size
        tail = math.prod(classes[:-1]) * w2.size  # memory of _scalar_blocks
        return solves > BLOCK_LIMIT or scalar_work > SCALAR_WORK_LIMIT or tail > SCALAR_TAIL_LIMIT

    # keep the work bounded: attributes with the most classes stay whole first
    while too_much():
        i = max(range(union.dim), key=lambda k: splits[k].options)
        splits[i] = whole[i]
    total, var, methods, lower = 0.0, 0.0, set(), False
    if all(s.mult.size for s in splits):
        total += _scalar_blocks(w2, index, splits)
        methods.add("closed form")
    split_rest = [i for i, s in enumerate(splits) if s.rest[0].size]
    # blocks whose term weights are proportional are one block scaled: solved once, their
    # multiplicities (times the square root of the scale) added up
    solved: dict[tuple, list] = {}
    work = 0.0
    for r in range(1, len(split_rest) + 1):
        for rest_attrs in itertools.combinations(split_rest, r):
            others = [i for i in range(union.dim) if i not in rest_attrs]
            for classes in itertools.product(*(range(splits[i].mult.size) for i in others)):
                scale, mult = w2.copy(), 1.0
                for i, c in zip(others, classes):
                    scale = scale * splits[i].lam[index[:, i], c]
                    mult *= splits[i].mult[c]
                if not np.any(scale > 0):  # the eigenvalues are clean: zero means zero
                    continue
                top = float(scale.max())
                live = scale > 0
                shape = (scale[live] / top).round(12)
                key = (rest_attrs, shape.tobytes(), index[live][:, list(rest_attrs)].tobytes())
                if key not in solved:
                    spent = work_limit is not None and work >= work_limit
                    solved[key] = [_block_norm(scale / top, index[:, list(rest_attrs)],
                                               [splits[i] for i in rest_attrs], 0 if spent else exact_limit, probes,
                                               steps, rng, eig, estimate and not spent, lanczos_work), 0.0]
                    work += solved[key][0].work
                solved[key][1] += mult * math.sqrt(top)
    for norm, mult in solved.values():
        total += float(mult * norm.value)
        var += float(mult * norm.stderr) ** 2  # a block reused is one estimate: its errors add up
        methods.add(norm.method)
        lower = lower or norm.lower
    return _Norm(total, math.sqrt(var), "common-eigenvector split; " + "; ".join(sorted(methods)), lower)


@one_blas_thread
def svd_bound(W: Matrix, privacy: Privacy, *, exact_limit: int = EXACT_LIMIT, probes: int = 30, steps: int = 480,
              seed: int | None = None, estimate: bool = True, work_limit: float | None = None,
              lanczos_work: float = LANCZOS_WORK) -> SVDBound:
    r"""The SVD lower bound ``noise_variance(1) * ||W||_*^2 / N`` on any strategy's total squared error.

    Parameters
    ----------
    W
        The workload.
    privacy
        Privacy definition (sets the noise variance at unit sensitivity).
    exact_limit
        Largest eigenvalue block solved exactly by a dense eigensolver (default ``EXACT_LIMIT``,
        8192; the solve costs the cube of the block size, so lower it for speed); beyond it the nuclear norm is estimated by
        stochastic Lanczos quadrature with ``probes`` probe vectors and up to ``steps`` Lanczos
        steps (doubled from 60 until the Gauss / Gauss-Radau bracket is within 2%), seeded by
        ``seed`` (for reproducible research). The reported ``stderr`` combines the sampling
        error with the bracket's half-width. A block with fewer rows than columns (up to
        ``ROW_SLQ_MAX_N`` rows) is estimated on its row Gram instead (see ``lanczos_work``).
    estimate
        ``False``: no stochastic estimate; a block beyond ``exact_limit`` contributes the lower
        bound from its Kronecker row blocks, so the result is exact or a certain (weaker) lower
        bound (``lower=True``), and cheap when ``exact_limit`` is small.
    work_limit
        Largest total work of the dense eigensolves (the sum of their sizes cubed; ``None``, the
        default: no limit). The blocks left once it is reached are bounded from below by their
        Kronecker row blocks, as with ``estimate=False``, so the time stays bounded whatever the
        workload (``optimize`` passes one) and the result still depends on nothing but the
        workload.
    lanczos_work
        Largest work of one row-side estimate (probes x Lanczos steps x rows of the block's row
        Gram; default ``LANCZOS_WORK``, about a minute at one BLAS thread). Row-side estimates
        take ``probes * ROW_PROBE_ROWS / rows`` probes (at least 2) and ``steps`` steps; past the
        budget the probes are cut (to 2), then the steps (to ``ROW_MIN_STEPS``; both constants of
        :mod:`hdmm.bound_rows`), and a block that
        still does not fit gets the certain row-block lower bound instead (docs/math.md, 5.7).
        Their ``stderr`` combines the sampling error with an *estimated* Lanczos error (the
        changes of the estimate over the last two doublings of the steps), not a certified
        bracket.

    Returns
    -------
    SVDBound
        ``.value`` (``float()`` gives it), ``.exact``, ``.stderr`` and ``.method``.

    Examples
    --------
    The identity on ``n`` cells has ``n`` unit singular values, so at unit noise variance
    (zCDP with :math:`\rho = 1/2`) the bound is :math:`n^2/n = n`, which the identity itself attains:

    >>> from hdmm.bound import svd_bound
    >>> from hdmm.matrix import Identity
    >>> from hdmm.privacy import ZCDP
    >>> bound = svd_bound(Identity(4), ZCDP(0.5))
    >>> float(bound), bound.exact
    (4.0, True)
    """
    if not isinstance(W, Matrix):
        raise TypeError("W must be an hdmm matrix")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    unit = privacy.noise_variance(1.0)
    structure = classify(W)
    union = structure.union if structure.union is not None else kron_union(W)  # the latter says why not
    common = dict(privacy=privacy, queries=W.shape[0])
    if structure.form == "kronecker":
        weight, factors = union.term(0)
        # ||W||_*^2 / N = c^2 prod_i ||W_i||_*^2 / n_i, with no overflow for huge N
        value = weight**2 * math.prod(factor_nuclear_norm(f) ** 2 / f.shape[1] for f in factors)
        return SVDBound(unit * value, True, 0.0, method="Kronecker product of factor bounds", **common)
    if structure.form == "marginals":
        return SVDBound(unit * trace_spectrum(union).residual_error, True, 0.0, method="marginals algebra (E_T basis)",
                        **common)
    norm = nuclear_norm(union, exact_limit=exact_limit, probes=probes, steps=steps, seed=seed, estimate=estimate,
                        work_limit=work_limit, lanczos_work=lanczos_work)
    N = W.shape[1]
    return SVDBound(
        unit * norm.value**2 / N,
        norm.stderr == 0.0 and not norm.lower,
        unit * 2 * norm.value * norm.stderr / N,
        method=norm.method,
        lower=norm.stderr == 0.0 and norm.lower,
        **common,
    )
