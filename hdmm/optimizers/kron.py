r"""OPT_(x): one Kronecker strategy for a union of Kronecker workloads (docs/math.md, section 4).

For :math:`A = \bigotimes_i A_i` and :math:`W = \mathrm{VStack}_j c_j \bigotimes_i W_i^{(j)}`
the error is a sum of products of per-attribute traces,

.. math:: \sum_j c_j^2 \prod_i t_i^{(j)}, \qquad t_i^{(j)} = \mathrm{tr}\big((A_i^TA_i)^{-1} G_i^{(j)}\big).

Fixing every factor but ``i`` leaves an OPT_0 problem on the effective Gram
:math:`\sum_j c_j^2 \big(\prod_{l \ne i} t_l^{(j)}\big) G_i^{(j)}`; cycling over the attributes
never increases the objective (a factor is only replaced by a better one), and stops when a
full cycle improves it by less than ``tol``.

The functions here take the privacy definition (:class:`~hdmm.privacy.PureDP`,
:class:`~hdmm.privacy.ApproxDP` or :class:`~hdmm.privacy.ZCDP`); only its kind of noise matters
(its sensitivity norm, ``privacy.norm``, is what the p-Identity algebra needs), never its level.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import time
from typing import Callable, Iterator

import numpy as np
from scipy.optimize import minimize_scalar

from ..block_diagonal import BlockDiagonal, fold, is_local
from ..kron_union import KronUnion
from ..matrix import Explicit, Identity, Kronecker, Matrix, Ones, Sum, Weighted
from ..privacy import Privacy
from ..traces import factor_trace
from .convex import ConvexProgress, solve_convex
from .pidentity import T_MAX, PIdentity, default_p, default_restarts, optimize_pidentity
from .root import SquareRootStrategy

__all__ = ["factor_method", "optimize_factor", "factor_candidates", "identity_and_total", "exchangeable_parts",
           "opt_kron_union"]


#: Under Gaussian noise, attributes up to this size get the convex program's global optimum.
CONVEX_MAX_N = 2048

#: Under Gaussian noise, larger attributes get the square-root strategy: with a fast eigenbasis
#: at any size, else from a dense eigensolver up to this size (a dense eigendecomposition costs
#: O(n^3)), else in the sine basis that best diagonalises the Gram
#: (``SquareRootStrategy.in_sine_basis``).
ROOT_DENSE_MAX_N = 4096

#: Beyond this many values a block-diagonal candidate joins the search: the same strategy on
#: blocks of at most this many consecutive values (at least an eighth of it), when the folded
#: Gram is sparse (a local workload; see :mod:`hdmm.block_diagonal`).
TILE_BLOCK_N = 2048

#: Effective Grams of several terms on at most this many values are summed densely.
DENSE_EFFECTIVE_N = 512

#: After the first round, each p-Identity search starts from the attribute's current strategy and
#: runs at most this many iterations: the effective Gram has moved a little, so has the optimum.
WARM_MAXITER = 100

#: First-round solutions are shared through ``memo`` for effective Grams of at most this many values.
MEMO_MAX_N = 4096

#: Under Laplace noise with several attributes, each first-round p-Identity search warms its default
#: start with this many iterations under L2 column norms (``l2_warmup`` of
#: :func:`.pidentity.optimize_pidentity`). One attribute alone does without: its hierarchy start
#: did as well or better on the one-attribute benchmarks.
L2_WARMUP = 100


#: Whether the strategy being optimized is to be released (:func:`for_release`).
_RELEASE: contextvars.ContextVar[bool] = contextvars.ContextVar("hdmm_release", default=False)


@contextlib.contextmanager
def for_release() -> Iterator[None]:
    """Optimize, inside the block, only strategies that a release can measure exactly (:mod:`hdmm.exact`).

    A square-root strategy over more than ``CONVEX_MAX_N`` values is a sine transform with no
    exact product (its dense matrix would be too large to quantize), so under Gaussian noise
    p-Identity with L2-normalised columns (and, for local workloads, the block strategy) stands
    in for it. :func:`hdmm.plan` optimizes inside this block; :func:`hdmm.optimize` alone, for
    comparing strategies, still considers the square root.
    """
    token = _RELEASE.set(True)
    try:
        yield
    finally:
        _RELEASE.reset(token)


def factor_method(G: Matrix, privacy: Privacy) -> str:
    """How :func:`optimize_factor` optimizes Gram ``G``: ``"convex"``, ``"square root"``, ``"sine basis"`` or ``"p-identity"``.

    Gaussian noise: the convex program's global optimum (:mod:`.convex`) on up to
    ``CONVEX_MAX_N`` values; beyond, the square-root strategy (:mod:`.root`, close to the SVD
    bound on range workloads), of ``G`` itself when it has a closed-form spectrum or at
    most ``ROOT_DENSE_MAX_N`` values, else of its pinching in a sine basis. Laplace noise:
    p-Identity.
    """
    n = G.shape[0]
    if not privacy.noise.l2:  # L1 sensitivity: the objective is not smooth, only p-Identity applies
        return "p-identity"
    if n <= CONVEX_MAX_N:
        return "convex"
    if _RELEASE.get():  # no exact product for a square-root strategy this large (for_release)
        return "p-identity"
    if n <= ROOT_DENSE_MAX_N or G.spectrum() is not None:
        return "square root"
    return "sine basis"


def _pidentity(G: Matrix, privacy: Privacy, p: int | None, restarts: int | None, rng: np.random.Generator,
               warm: Matrix | None, maxiter: int | None = None, l2_warmup: int = 0) -> tuple[PIdentity, float]:
    """The p-Identity strategy for ``G`` and its error at unit noise (``warm`` seeds a start;
    ``maxiter`` caps the search, default :data:`.pidentity.MAXITER`, after ``l2_warmup`` iterations
    of its warm-up, as in :func:`.pidentity.optimize_pidentity`).

    ``p`` and ``restarts`` default to :func:`.pidentity.default_p` and
    :func:`.pidentity.default_restarts` of ``G``'s size. The columns are normalised in the
    sensitivity norm of ``privacy``.
    """
    norm = privacy.norm
    p = default_p(G.shape[0]) if p is None else p
    restarts = default_restarts(G.shape[0]) if restarts is None else restarts
    seed = warm.params if isinstance(warm, PIdentity) and warm.params.shape[0] == p else None
    T, value = optimize_pidentity(G, p, norm, restarts, rng, maxiter, start=seed, l2_warmup=l2_warmup)
    return PIdentity(T, norm), value


def optimize_factor(G: Matrix, privacy: Privacy, p: int | None, restarts: int, rng: np.random.Generator,
                    warm: Matrix | None = None, progress: Callable[[str], None] | None = None,
                    maxiter: int | None = None, l2_warmup: int = 0) -> Matrix:
    """The best one-attribute strategy found for Gram ``G``, by :func:`factor_method`.

    A p-Identity strategy has ``p`` extra rows (:func:`.pidentity.default_p`); ``warm`` (a
    previous :class:`PIdentity`) seeds one of its starts, ``maxiter`` caps its search and
    ``l2_warmup`` is passed to :func:`.pidentity.optimize_pidentity`.
    ``progress`` receives a line per
    Newton step of the convex program (the long runs: minutes for singular Grams of 2048 values).
    """
    method = factor_method(G, privacy)
    if method == "convex":
        callback = None if progress is None else _convex_reporter(G.shape[0], progress)
        return solve_convex(G.dense(), callback=callback).strategy
    if method == "square root":
        return SquareRootStrategy.for_gram(G)
    if method == "sine basis":
        return SquareRootStrategy.in_sine_basis(G)
    return _pidentity(G, privacy, p, restarts, rng, warm, maxiter, l2_warmup)[0]


def _convex_reporter(n: int, progress: Callable[[str], None]) -> Callable[[ConvexProgress], None]:
    """A :func:`solve_convex` callback that reports each Newton step to ``progress``."""
    def report(step: ConvexProgress) -> None:
        gap = "" if step.dual_bound is None else f", relative gap {1 - step.dual_bound / step.objective:.1e}"
        progress(f"convex program on {n} values: Newton step {step.iteration}, objective {step.objective:.6g}{gap}")
    return report


def _tiling(n: int) -> tuple[int, int, int]:
    """Block size ``m``, copies ``B`` and tail ``t`` (``n = B m + t``) for a domain beyond ``TILE_BLOCK_N``.

    The largest divisor of ``n`` in ``[TILE_BLOCK_N / 8, TILE_BLOCK_N]`` when there is one (no
    tail); otherwise ``B = ceil(n / TILE_BLOCK_N)`` blocks of ``floor(n / B)`` values and a tail
    of fewer than ``B`` values.
    """
    for m in range(TILE_BLOCK_N, TILE_BLOCK_N // 8 - 1, -1):
        if n % m == 0:
            return m, n // m, 0
    copies = -(-n // TILE_BLOCK_N)
    m = n // copies
    return m, copies, n - copies * m


def _block_candidate(G: Matrix, privacy: Privacy, p: int | None, restarts: int, rng: np.random.Generator,
                     warm: Matrix | None, maxiter: int | None = None, l2_warmup: int = 0) -> BlockDiagonal | None:
    """The block-diagonal strategy for a local ``G`` beyond ``TILE_BLOCK_N`` values, else ``None``."""
    n = G.shape[0]
    if n <= TILE_BLOCK_N:
        return None
    m, copies, tail = _tiling(n)
    if not is_local(G, m):
        return None
    F = fold(G, m)
    if not F.is_sparse:
        return None
    if privacy.noise.l2:
        block = SquareRootStrategy.for_gram(F)
    else:
        block = optimize_factor(F, privacy, p, restarts, rng, warm.block if isinstance(warm, BlockDiagonal) else None,
                                maxiter=maxiter, l2_warmup=l2_warmup)
    return BlockDiagonal(block, copies, tail)


def factor_candidates(G: Matrix, privacy: Privacy, p: int | None, restarts: int, rng: np.random.Generator,
                      warm: Matrix | None = None, progress: Callable[[str], None] | None = None,
                      maxiter: int | None = None, l2_warmup: int = 0) -> list[Matrix]:
    """Strategies for Gram ``G`` worth comparing: :func:`optimize_factor`'s, a block-diagonal one, p-Identity.

    Beyond ``TILE_BLOCK_N`` values, ``G`` is folded onto blocks of ``m`` consecutive values
    (:func:`_tiling`, :func:`hdmm.block_diagonal.fold`); when the fold is sparse (only local
    workloads, whose queries stay within a few cells, have sparse folds), the block strategy is
    optimized on it (the square-root strategy under Gaussian noise, :func:`optimize_factor`
    under Laplace) and repeated along the diagonal, with identity cells for any tail. It then
    replaces a p-Identity over the whole domain, whose ``default_p`` rows cannot cover a long
    domain at the scale of a local workload; a convex or square-root strategy over the whole
    domain stays a candidate. A square-root strategy in a borrowed sine basis
    (``"sine basis"``) rests on an approximation of ``G`` that may miss what matters to the
    error (prefixes of a shuffled domain), so without a block candidate p-Identity joins it.
    The caller keeps whichever candidate has the least exact error; ``progress``, ``maxiter``
    (the p-Identity searches' cap) and ``l2_warmup`` are passed to :func:`optimize_factor`.

    Under Laplace noise a Gram invariant under permutations of the values, :math:`aI + bJ` (the
    effective Gram of an attribute whose workload factors are identities and totals, as in
    marginal workloads), gets :func:`identity_and_total` instead of a p-Identity search: the
    best identity with one weighted total row, in closed form.
    """
    method = factor_method(G, privacy)
    if method == "p-identity":
        parts = exchangeable_parts(G)
        if parts is not None:
            return [identity_and_total(G.shape[0], *parts)]
    block = _block_candidate(G, privacy, p, restarts, rng, warm, maxiter, l2_warmup)
    found = [] if method == "p-identity" and block is not None else [
        optimize_factor(G, privacy, p, restarts, rng, warm, progress, maxiter, l2_warmup)]
    if method == "sine basis" and block is None:
        found.append(_pidentity(G, privacy, p, restarts, rng, warm, maxiter, l2_warmup)[0])
    return found + ([] if block is None else [block])


def exchangeable_parts(G: Matrix) -> tuple[float, float] | None:
    """``(a, b)`` when ``G = aI + bJ`` (to rounding), else ``None``: from the diagonal, the row sums and one
    product with a fixed vector. A false match could only cost optimality: every candidate's error is
    computed exactly on the workload's own factors.

    Examples
    --------
    >>> import hdmm
    >>> exchangeable_parts(hdmm.Identity(4).gram() + 2 * hdmm.Total(4).gram())
    (1.0, 2.0)
    >>> exchangeable_parts(hdmm.Prefix(4).gram()) is None
    True
    """
    n = G.shape[0]
    if n < 2:
        return None
    diag = np.asarray(G.diag(), dtype=float)
    sums = np.asarray(G @ np.ones(n), dtype=float).ravel()
    scale = float(np.abs(sums).max())
    if not scale > 0 or np.ptp(diag) > 1e-12 * scale or np.ptp(sums) > 1e-12 * scale:
        return None
    b = (sums[0] - diag[0]) / (n - 1)
    a = diag[0] - b
    x = np.sin(np.arange(1.0, n + 1.0))
    if np.abs(np.asarray(G @ x).ravel() - (a * x + b * x.sum())).max() > 1e-10 * scale * max(1.0, np.abs(x).sum()):
        return None
    return float(a), float(b)


def identity_and_total(n: int, a: float, b: float) -> PIdentity:
    r"""The best p-Identity strategy ``[I; t 1^T] / (1 + t)`` for the Gram :math:`aI + bJ` under Laplace noise.

    With one extra row :math:`t\mathbf{1}^T`, :math:`X = (I + t^2 J)/(1+t)^2` and (Sherman-Morrison)

    .. math:: \mathrm{tr}(X^{-1}(aI + bJ)) = (1+t)^2\, n \Big((a + b) - \frac{t^2 (a + nb)}{1 + nt^2}\Big),

    minimised over :math:`0 \le t \le T_{MAX}` (bounded scalar search; ``t = 0`` is the identity).
    On a grid of sizes and mixes it equals or beats an 8-start p-Identity search, which can stop
    at the identity where a small total row pays (tests).
    """
    def error(t: float) -> float:
        return (1.0 + t) ** 2 * n * ((a + b) - t * t * (a + n * b) / (1.0 + n * t * t))

    found = minimize_scalar(error, bounds=(0.0, T_MAX), method="bounded", options={"xatol": 1e-10})
    t = float(found.x) if found.fun < error(0.0) else 0.0
    return PIdentity(np.full((1, n), t), 1)


def _total_supports(factors: list[Matrix], total: Matrix | None = None) -> bool:
    r"""Whether measuring only the total supports the factors (all their rows multiples of 1^T).

    That holds exactly when each Gram :math:`G = f^Tf` is a multiple of :math:`11^T`. For a
    positive semidefinite ``G``, :math:`\mathrm{tr}(G) \ge \lambda_{\max} \ge 1^TG1/n`, with
    equality exactly then: two cheap numbers rule out every factor that is not nearly a total,
    and only those left get the exact support test (against ``total``, the factors' total row,
    when given: its inverse Gram is computed once per object).
    """
    for f in factors:
        G = f.gram()
        ones = np.ones(G.shape[0])
        along = float(ones @ (G @ ones)) / G.shape[0]
        row = total if total is not None else Ones(1, f.shape[1])
        if G.trace() > along * (1.0 + 1e-6) or not factor_trace(row, f)[1]:
            return False
    return True


def _effective_gram(grams: list[Matrix], coef: np.ndarray) -> Matrix:
    """``sum_k coef_k grams[k]`` over the positive coefficients; dense when small and of several terms.

    A workload may carry several different factors on one attribute (a prefix, an identity and a
    total), or equal ones that do not compare equal (explicit matrices built term by term): a small
    dense sum makes every product one matrix multiplication instead of one pass per term.
    """
    terms = [Weighted(G, c) for G, c in zip(grams, coef) if c > 0]
    G = Sum(terms)
    if len(terms) > 1 and G.shape[0] <= DENSE_EFFECTIVE_N:
        return Explicit(G.dense())
    return G


def _trace_key(A: Matrix) -> tuple[str, int] | int:
    """A key for a strategy factor's traces: by size for an identity or a total row (every such factor has the
    same traces), else the object itself (its ``id``; the cache keeps it alive and checks it)."""
    if type(A) is Identity:
        return ("identity", A.shape[1])
    if type(A) is Ones and A.shape[0] == 1:
        return ("total", A.shape[1])
    return id(A)


def _fingerprint(G: Matrix) -> bytes | None:
    """A key equal for Grams equal up to a positive scale (to 12 digits), for small Grams only."""
    if G.shape[0] > MEMO_MAX_N:
        return None
    D = G.dense()
    top = float(np.abs(D).max())
    if not top > 0:
        return None
    return hashlib.sha1(np.round(D / top, 12).tobytes()).digest()


def opt_kron_union(
    union: KronUnion, privacy: Privacy, p: int | None = None, restarts: int | None = None,
    rng: np.random.Generator | None = None, max_rounds: int = 30, tol: float = 1e-4,
    progress: Callable[[str], None] | None = None, memo: dict | None = None, deadline: float | None = None,
) -> tuple[Kronecker, float]:
    """Cycle per-attribute OPT_0 on effective Grams; returns the strategy and its unit-noise error.

    The strategy has sensitivity 1 in the norm of ``privacy``; the error is the workload's
    expected total squared error under unit noise variance (``privacy.unit_noise()``).

    An attribute whose terms all use totals gets the total (optimal for them, the identity
    aside). One Kronecker product separates by attribute, so it gets one round. First-round
    one-attribute solutions are reused for effective Grams equal up to scale (the scale does not
    change the best strategy): between attributes (AllRange on each axis of a cube is solved
    once) and, through ``memo`` (a dict shared by several calls), between OPT_+'s groups.
    With several attributes under Laplace noise, the first round's p-Identity searches warm their
    first start under L2 column norms (``L2_WARMUP``); later rounds start from the current factors.
    After ``deadline`` (a ``time.perf_counter()`` value) no new round starts.
    """
    rng = np.random.default_rng() if rng is None else rng
    shared = memo is not None
    memo = {} if memo is None else memo
    d = union.dim
    w2 = union.weights**2
    if np.count_nonzero(w2) == 1:
        max_rounds = 1
    grams = [[f.gram() for f in fs] for fs in union.factors]
    strategy: list[Matrix] = [Identity(n) for n in union.sizes]

    # per strategy factor and attribute, the traces; per list of workload factors, _total_supports: shared
    # with the other calls through ``memo`` (the objects are kept, so their ids stay theirs)
    known = memo.setdefault("traces", {})
    totals = memo.setdefault("totals", {})  # one total row per attribute size, its inverse Gram computed once

    def traces_of(i: int, A: Matrix) -> np.ndarray:
        fs = union.factors[i]
        key = (_trace_key(A), id(fs))
        hit = known.get(key)
        if hit is None or hit[0] is not fs or (isinstance(key[0], int) and hit[1] is not A):
            hit = known[key] = (fs, A, np.array([factor_trace(A, f)[0] for f in fs]))
        return hit[2]

    traces = [traces_of(i, strategy[i]) for i in range(d)]

    def objective() -> float:
        return float(np.sum(w2 * union.products(traces)))

    value = objective()
    for round_ in range(max_rounds if d > 1 else 1):  # one attribute: nothing to cycle
        start_value = value
        for i in range(d):
            others = union.products(traces, exclude=i) * w2
            coef = np.bincount(union.index[:, i], weights=others, minlength=len(grams[i]))
            used = [f for f, c in zip(union.factors[i], coef) if c > 0]
            candidates: list[Matrix] = [Identity(union.sizes[i])]
            total = totals.setdefault(union.sizes[i], Ones(1, union.sizes[i]))
            supports_key = ("total supports",) + tuple(id(f) for f in used)
            hit = known.get(supports_key)
            if hit is None or any(a is not b for a, b in zip(hit[0], used)):
                hit = known[supports_key] = (used, _total_supports(used, total))
            if hit[1]:
                candidates.append(total)
            else:
                G_eff = _effective_gram(grams[i], coef)
                warmup = L2_WARMUP if round_ == 0 and d > 1 and not privacy.noise.l2 else 0
                key = None
                if round_ == 0 and (d > 1 or shared):  # one attribute alone has no one to share with
                    fingerprint = _fingerprint(G_eff)
                    key = None if fingerprint is None else (fingerprint, privacy.norm, p, restarts, warmup)
                if key is not None and key in memo:
                    found = memo[key]
                else:
                    found = factor_candidates(G_eff, privacy, p, restarts if round_ == 0 else 1, rng, strategy[i],
                                              progress, None if round_ == 0 else WARM_MAXITER, warmup)
                    if key is not None:
                        memo[key] = found
                candidates = found + candidates
            for A in candidates:
                t = traces_of(i, A)
                if coef @ t < coef @ traces[i]:
                    strategy[i], traces[i] = A, t
            value = objective()
        if progress is not None:
            progress(f"OPT_(x) round {round_ + 1}: error {value:.6g} at unit noise variance")
        if start_value - value <= tol * start_value:
            break
        if deadline is not None and time.perf_counter() >= deadline:
            if progress is not None:
                progress("OPT_(x): time limit reached, stopping after this round")
            break
    return Kronecker(strategy), value
