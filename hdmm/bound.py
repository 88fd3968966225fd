r"""The SVD lower bound on the error of any strategy (MATH.md section 5).

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
3. Otherwise the attributes whose factor Grams all commute are diagonalised together: the
   Gram splits into one block per joint eigenvalue signature (identical blocks counted once,
   with their multiplicity), each a union over the remaining attributes. A block is solved
   exactly by a dense eigensolver on the smaller of its ``N_b x N_b`` Gram and its
   ``m_b x m_b`` row Gram (rows compressed to each factor's rank), else estimated by
   stochastic Lanczos quadrature, reported with its standard error.
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

from .marginals import in_marginal_algebra, trace_spectrum
from .matrix import Explicit, Identity, Kronecker, Matrix, Ones, Sum, Weighted
from .privacy import Privacy
from .slq import trace_sqrt
from .kron_union import KronUnion

__all__ = ["SVDBound", "svd_bound", "nuclear_norm"]

#: Largest per-attribute domain whose factor Grams are eigen-decomposed densely.
FACTOR_LIMIT = 8192
#: Largest number of eigenvalue blocks the commuting-attribute split may create.
BLOCK_LIMIT = 4096


@dataclass(frozen=True)
class SVDBound:
    """A lower bound on the expected total squared error of any strategy for a workload.

    Attributes
    ----------
    value : float
        The bound, in units of total squared error under ``privacy``.
    exact : bool
        Whether ``value`` is exact, or an estimate (stochastic Lanczos quadrature).
    stderr : float
        Standard error of the estimate (0 when exact).
    privacy : Privacy
        The privacy definition the bound is for.
    queries : int
        Number of workload queries (for :attr:`rmse`).
    method : str
        How the singular values were obtained.
    """

    value: float
    exact: bool
    stderr: float
    privacy: Privacy
    queries: int
    method: str

    def __float__(self) -> float:
        return self.value

    @property
    def rmse(self) -> float:
        """The bound expressed as a root mean squared error per query."""
        return math.sqrt(self.value / self.queries)

    def __repr__(self) -> str:
        est = "exact" if self.exact else f"estimate +/- {self.stderr:.3g}"
        return f"SVDBound({self.value:.6g}, {est}, {self.method}, {self.privacy.description})"


@dataclass(frozen=True)
class _Norm:
    """A nuclear norm (possibly estimated) with its standard error."""

    value: float
    stderr: float
    method: str


def _sqrt_sum(eigenvalues: np.ndarray) -> float:
    """The sum of the square roots of a PSD matrix's eigenvalues (rounding-level negatives count as 0)."""
    return float(np.sum(np.sqrt(np.clip(eigenvalues, 0.0, None))))


def _eig_sqrt_sum(M: np.ndarray) -> float:
    return _sqrt_sum(np.linalg.eigvalsh(M))


def _factor_gram(f: Matrix) -> np.ndarray:
    return f.gram().dense(max_entries=FACTOR_LIMIT**2)


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


def factor_nuclear_norm(f: Matrix) -> float:
    """``||f||_*`` of a one-attribute factor.

    Identities and totals in closed form; a factor with at most half as many rows as columns from
    its small row Gram :math:`ff^T`; otherwise from its Gram :math:`f^Tf`, by its closed-form
    spectrum (prefixes, all ranges), as a band (ranges of bounded width), or densely.
    """
    if isinstance(f, Identity):
        return float(f.shape[0])
    if isinstance(f, Ones):
        return math.sqrt(f.shape[0] * f.shape[1])
    m, n = f.shape
    if 2 * m <= n:
        F = f.dense(max_entries=FACTOR_LIMIT * n)
        return _eig_sqrt_sum(F @ F.T)
    G = f.gram()
    spectrum = G.spectrum()
    if spectrum is not None:
        return _sqrt_sum(spectrum.values)
    band = _band(G)
    if band is not None:
        return _sqrt_sum(scipy.linalg.eigvals_banded(band, check_finite=False))
    return _eig_sqrt_sum(G.dense(max_entries=FACTOR_LIMIT**2))


@dataclass
class _AttributeSplit:
    r"""One attribute's factor Grams split into common eigenvectors and an invariant rest.

    ``lam[k, c]`` is the eigenvalue of Gram ``k`` on class ``c`` of common eigenvectors
    (vectors that are eigenvectors of every Gram, grouped by their eigenvalue signature) and
    ``mult[c]`` the class's dimension. ``rest[k]`` is Gram ``k`` restricted to the orthogonal
    complement of all common eigenvectors (empty when the Grams commute), a subspace every
    Gram maps into itself.
    """

    lam: np.ndarray
    mult: np.ndarray
    rest: list[np.ndarray]

    @property
    def options(self) -> int:
        return self.mult.size + (1 if self.rest[0].size else 0)


def _split_attribute(grams: list[np.ndarray], rng: np.random.Generator, eig: _Eigen) -> _AttributeSplit:
    """Find the common eigenvectors of symmetric matrices by diagonalising a random mix.

    Every common eigenvector is an eigenvector of ``sum_k r_k G_k``; for random ``r`` its
    eigenvectors are common eigenvectors exactly when their residuals vanish. The remaining
    eigenvectors span the orthogonal complement, which is invariant under every ``G_k``. Equal
    Grams are their own mix: their eigendecomposition is kept in ``eig`` for reuse.
    """
    scale = max(float(np.abs(G).max()) for G in grams) or 1.0
    n = grams[0].shape[0]
    if all(np.array_equal(G, grams[0]) for G in grams[1:]):
        _, V = eig(grams[0])
    else:
        _, V = np.linalg.eigh(sum(rng.uniform(1.0, 2.0) * G for G in grams))
    images = [G @ V for G in grams]
    lam = np.stack([np.einsum("ij,ij->j", V, GV) for GV in images])
    residual = np.max([np.linalg.norm(GV - V * l, axis=0) for GV, l in zip(images, lam)], axis=0)
    common = residual <= 1e-9 * scale * n
    signature = np.round(lam[:, common] / (1e-8 * scale), 0)
    if signature.shape[1]:
        _, first, inverse = np.unique(signature, axis=1, return_index=True, return_inverse=True)
        classes = lam[:, common][:, first]
        mult = np.bincount(inverse.ravel(), minlength=first.size).astype(float)
    else:
        classes, mult = np.zeros((len(grams), 0)), np.zeros(0)
    U = V[:, ~common]
    return _AttributeSplit(classes, mult, [U.T @ G @ U for G in grams])


class _Eigen:
    """``eigh`` of dense symmetric matrices, remembered by content: an attribute's Gram is
    decomposed once however many blocks (or equal factors) of the union it appears in."""

    def __init__(self):
        self._seen: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        G = np.ascontiguousarray(G)
        key = (G.shape, hashlib.blake2b(memoryview(G).cast("B"), digest_size=16).digest())
        if key not in self._seen:
            self._seen[key] = np.linalg.eigh(G)
        return self._seen[key]


def _compressed(G: np.ndarray, eig: _Eigen) -> np.ndarray:
    """``R`` with ``R^T R = G`` and one row per non-zero eigenvalue."""
    vals, vecs = eig(G)
    keep = vals > 1e-12 * max(vals.max(), 1e-300)
    return (vecs[:, keep] * np.sqrt(vals[keep])).T


def _block_norm(w2: np.ndarray, index: np.ndarray, grams: list[list[np.ndarray]], exact_limit: int,
                probes: int, steps: int, rng: np.random.Generator, eig: _Eigen) -> _Norm:
    """Nuclear norm of ``(sum_j w2_j (x)_i grams[i][index[j, i]])^(1/2)``'s trace."""
    live = w2 > 0
    w2, index = w2[live], index[live]
    if index.shape[1] == 0:
        return _Norm(math.sqrt(float(w2.sum())), 0.0, "closed form")
    sizes = [g[0].shape[0] for g in grams]
    cols = math.prod(sizes)
    factors = [[_compressed(G, eig) for G in gs] for gs in grams]
    row_counts = [np.array([R.shape[0] for R in Rs]) for Rs in factors]
    rows = int(sum(math.prod(row_counts[i][k] for i, k in enumerate(ix)) for ix in index))
    if min(cols, rows) <= exact_limit:
        if cols <= rows:
            M = sum(w * reduce(np.kron, [grams[i][k] for i, k in enumerate(ix)]) for w, ix in zip(w2, index))
            return _Norm(_eig_sqrt_sum(M), 0.0, f"dense eigenvalues ({cols:,} x {cols:,} Gram)")
        cross = [[[Ra @ Rb.T for Rb in Rs] for Ra in Rs] for Rs in factors]
        blocks = [
            [math.sqrt(wa * wb) * reduce(np.kron, [cross[i][a][b] for i, (a, b) in enumerate(zip(ia, ib))])
             for wb, ib in zip(w2, index)]
            for wa, ia in zip(w2, index)
        ]
        return _Norm(_eig_sqrt_sum(np.block(blocks)), 0.0, f"dense eigenvalues ({rows:,} x {rows:,} row Gram)")
    gram = Sum([Weighted(Kronecker([Explicit(grams[i][k]) for i, k in enumerate(ix)]), w) for w, ix in zip(w2, index)])
    est = trace_sqrt(gram._matmat, cols, probes=probes, max_steps=steps, rng=rng)
    # the quadrature bracket's half-width bounds the Lanczos bias; add it to the sampling error
    error = math.hypot(est.stderr, (est.upper - est.lower) / 2)
    return _Norm(est.value, error, f"stochastic Lanczos quadrature ({probes} probes, {est.steps} steps)")


def nuclear_norm(union: KronUnion, *, exact_limit: int = 4096, probes: int = 30, steps: int = 480,
                 seed: int | None = None) -> _Norm:
    r""":math:`\|W\|_*` of a union of Kronecker products (see the module docstring, route 3).

    Each attribute is split into classes of common eigenvectors of its factor Grams (a scalar
    per Gram) and an invariant rest (small matrices). The union's Gram is then block diagonal
    with one block per choice of class-or-rest on every attribute: a block is a union over the
    attributes that chose their rest, its terms scaled by the chosen eigenvalues, and it occurs
    with the product of the classes' dimensions as multiplicity.
    """
    rng = np.random.default_rng(seed)
    grams = [[_factor_gram(f) for f in fs] for fs in union.factors]
    eig = _Eigen()
    splits = [_split_attribute(gs, rng, eig) for gs in grams]
    whole = [_AttributeSplit(np.zeros((len(gs), 0)), np.zeros(0), gs) for gs in grams]
    # keep the block count bounded: attributes with the most classes stay whole first
    while math.prod(s.options for s in splits) > BLOCK_LIMIT:
        i = max(range(union.dim), key=lambda k: splits[k].options)
        splits[i] = whole[i]
    w2 = union.weights**2
    total, var, methods = 0.0, 0.0, set()
    choices = [list(range(s.mult.size)) + ([None] if s.rest[0].size else []) for s in splits]
    for combo in itertools.product(*choices):
        scale, mult = w2.copy(), 1.0
        rest_attrs = []
        for i, c in enumerate(combo):
            if c is None:
                rest_attrs.append(i)
            else:
                scale = scale * splits[i].lam[union.index[:, i], c]
                mult *= splits[i].mult[c]
        if not np.any(scale > 1e-12 * w2.max()):
            continue
        norm = _block_norm(
            scale, union.index[:, rest_attrs], [splits[i].rest for i in rest_attrs], exact_limit, probes, steps, rng, eig
        )
        total += float(mult * norm.value)
        var += float(mult * norm.stderr) ** 2
        methods.add(norm.method)
    return _Norm(total, math.sqrt(var), "common-eigenvector split; " + "; ".join(sorted(methods)))


def svd_bound(W: Matrix, privacy: Privacy, *, exact_limit: int = 4096, probes: int = 30, steps: int = 480,
              seed: int | None = None) -> SVDBound:
    r"""The SVD lower bound ``noise_variance(1) * ||W||_*^2 / N`` on any strategy's total squared error.

    Parameters
    ----------
    W
        The workload.
    privacy
        Privacy definition (sets the noise variance at unit sensitivity).
    exact_limit
        Largest dense eigenproblem solved exactly; beyond it the nuclear norm is estimated by
        stochastic Lanczos quadrature with ``probes`` probe vectors and up to ``steps`` Lanczos
        steps (doubled from 60 until the Gauss / Gauss-Radau bracket is within 2%), seeded by
        ``seed`` (for reproducible research). The reported ``stderr`` combines the sampling
        error with the bracket's half-width.

    Returns
    -------
    SVDBound
        ``.value`` (``float()`` gives it), ``.exact``, ``.stderr`` and ``.method``.
    """
    if not isinstance(W, Matrix):
        raise TypeError("W must be an hdmm matrix")
    if not isinstance(privacy, Privacy):
        raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
    unit = privacy.noise_variance(1.0)
    union = W.kron_union()
    common = dict(privacy=privacy, queries=W.shape[0])
    if union.num_terms == 1:
        weight, factors = union.term(0)
        # ||W||_*^2 / N = c^2 prod_i ||W_i||_*^2 / n_i, with no overflow for huge N
        value = weight**2 * math.prod(factor_nuclear_norm(f) ** 2 / f.shape[1] for f in factors)
        return SVDBound(unit * value, True, 0.0, method="Kronecker product of factor bounds", **common)
    if in_marginal_algebra(union):
        spectrum = trace_spectrum(union)
        root = float(np.sum(np.sqrt(spectrum.trace_E * spectrum.tau)))
        return SVDBound(unit * root**2, True, 0.0, method="marginals algebra (E_T basis)", **common)
    norm = nuclear_norm(union, exact_limit=exact_limit, probes=probes, steps=steps, seed=seed)
    N = W.shape[1]
    return SVDBound(
        unit * norm.value**2 / N,
        norm.stderr == 0.0,
        unit * 2 * norm.value * norm.stderr / N,
        method=norm.method,
        **common,
    )
