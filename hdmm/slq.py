r"""Stochastic Lanczos quadrature (SLQ) for spectral traces :math:`\operatorname{tr} f(M)`.

For a symmetric positive semi-definite :math:`M \in \mathbb{R}^{n \times n}` that is only
available through products :math:`X \mapsto M X`, SLQ combines two approximations:

1. **Hutchinson.** For Rademacher probes :math:`v \in \{-1, +1\}^n`,
   :math:`\mathbb{E}[v^\top f(M) v] = \operatorname{tr} f(M)`, so the mean of
   :math:`v_i^\top f(M) v_i` over independent probes is unbiased.
2. **Gauss quadrature.** With :math:`M = U \Lambda U^\top`,
   :math:`v^\top f(M) v = \lVert v \rVert^2 \int f \, d\mu` for the spectral measure
   :math:`\mu = \sum_i \mu_i \delta_{\lambda_i}`, :math:`\mu_i = (u_i^\top v)^2 / \lVert v \rVert^2`.
   :math:`m` Lanczos steps started at :math:`q_1 = v / \lVert v \rVert` produce a
   tridiagonal :math:`T_m = S \Theta S^\top`, and the :math:`m`-point Gauss rule
   :math:`G_m = e_1^\top f(T_m) e_1 = \sum_j \tau_j^2 f(\theta_j)`, :math:`\tau_j = S_{1j}`,
   is exact for polynomials of degree :math:`\le 2m - 1`.

Quadrature bracket
------------------
Gauss quadrature alone is biased, and the bias does not average out over probes. Following
Golub and Meurant (*Matrices, Moments and Quadrature with Applications*, 2010, ch. 6) each
probe also gets a Gauss–Radau rule with a prescribed node :math:`a \le \lambda_{\min}(M)`
(``node``; :math:`a = 0` is valid for every PSD :math:`M`). With the next Lanczos
coefficient :math:`\beta_{m+1}` (the norm of the last residual), the extended tridiagonal

.. math::
    \tilde T_{m+1} = \begin{pmatrix} T_m & \beta_{m+1} e_m \\
                                      \beta_{m+1} e_m^\top & \phi \end{pmatrix}, \qquad
    \phi = a + \beta_{m+1}^2 \, e_m^\top (T_m - a I)^{-1} e_m,

has :math:`a` as an eigenvalue (the last pivot of :math:`\tilde T_{m+1} - aI` vanishes),
and :math:`R_m = e_1^\top f(\tilde T_{m+1}) e_1` is the :math:`(m+1)`-point rule with one
node at :math:`a`, exact for degree :math:`\le 2m`. The errors are

.. math::
    \int f \, d\mu - G_m = \frac{f^{(2m)}(\eta)}{(2m)!} \int \prod_{j=1}^m (\lambda - \theta_j)^2 \, d\mu,
    \qquad
    \int f \, d\mu - R_m = \frac{f^{(2m+1)}(\xi)}{(2m+1)!}
        \int (\lambda - a) \prod_{j=1}^m (\lambda - x_j)^2 \, d\mu,

for some :math:`\eta, \xi \in (a, \lambda_{\max})`, where :math:`x_j` are the other nodes;
both integrals are non-negative. Hence :math:`R_m \le \int f \, d\mu \le G_m` whenever
:math:`f^{(2m)} \le 0 \le f^{(2m+1)}` on :math:`(a, \lambda_{\max})`, as for
:math:`f(t) = t^p`, :math:`0 < p < 1` (:math:`f^{(k)}` has the sign of :math:`(-1)^{k+1}`;
at :math:`a = 0` apply the bound to :math:`t \mapsto (t + \epsilon)^p` and let
:math:`\epsilon \to 0`), and :math:`G_m \le \int f \, d\mu \le R_m` for completely
monotone :math:`f` such as :math:`e^{-t}`. Each probe's bracket is
:math:`[\min(R_m, G_m), \max(R_m, G_m)]` and its estimate the midpoint, whose quadrature
error is at most half the bracket width. When the sign conditions hold at every order,
:math:`G_m` decreases and :math:`R_m` increases with :math:`m`. In floating point the
Radau rule needs care when a Ritz value has converged onto an eigenvalue at the node, as
on the null space of a rank-deficient :math:`M` with :math:`a = 0`; ``_quadrature_bracket``
then deflates it so that, for the square root, rounding lowers :math:`R_m`.
:func:`trace_sqrt` uses the bracket to choose the number of Lanczos steps.

The main use in ``hdmm`` is the nuclear norm
:math:`\lVert W \rVert_* = \operatorname{tr}\bigl((W^\top W)^{1/2}\bigr)` of a huge implicit
workload, which enters the SVD lower bound on the error of any strategy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
from scipy.linalg import eigh_tridiagonal

__all__ = ["SLQEstimate", "probe_brackets", "trace_function", "trace_sqrt"]

#: Largest Lanczos basis (bytes) kept in memory at once; probes are processed in chunks
#: so that ``chunk * steps * n * 8`` stays below this.
_BASIS_BYTES = 1.5e9

#: A probe's recurrence stops once :math:`\beta_{k+1} \le` this times a running estimate of
#: :math:`\lVert T_k \rVert`: the Krylov space is then (numerically) invariant under ``M``.
_BREAKDOWN_RTOL = 1e-10

#: Ritz values within this many times their accuracy of the Gauss-Radau node are deflated
#: onto the node (see ``_quadrature_bracket``).
_RESOLVED = 100.0

#: Vectors of length ``n`` per probe that the plain recurrence (no reorthogonalisation) and a
#: product with ``M`` hold at once, for chunking probes within ``_BASIS_BYTES``.
_PLAIN_VECTORS = 8

#: Step count of the first bracket check in :func:`trace_sqrt`; later checks double it.
_FIRST_STEPS = 60


@dataclass(frozen=True)
class SLQEstimate:
    r"""Result of :func:`trace_function` and :func:`trace_sqrt`.

    For probe :math:`i` let :math:`[\ell_i, u_i]` be its quadrature bracket for
    :math:`v_i^\top f(M) v_i` (see the module docstring) and :math:`c_i = (\ell_i + u_i)/2`.

    Attributes
    ----------
    value : float
        Mean of the bracket midpoints, :math:`\hat t = \frac1p \sum_i c_i = (L + U)/2`.
    stderr : float
        Hutchinson standard error :math:`s / \sqrt{p}`, with :math:`s` the sample standard
        deviation (``ddof=1``) of the :math:`c_i`. It does not include the quadrature bias,
        which (for ``f`` in the bracketed class) is at most :math:`(U - L)/2`.
    probes : int
        Number of probe vectors :math:`p`.
    steps : int
        Maximum number of Lanczos steps per probe (after capping at ``n``).
    lower : float
        :math:`L = \frac1p \sum_i \ell_i`, the mean lower quadrature bound (Gauss–Radau for
        :math:`f = \sqrt{\cdot}`).
    upper : float
        :math:`U = \frac1p \sum_i u_i`, the mean upper quadrature bound (Gauss for
        :math:`f = \sqrt{\cdot}`). ``lower == upper`` when ``node=None``.
    """

    value: float
    stderr: float
    probes: int
    steps: int
    lower: float
    upper: float

    def __float__(self) -> float:
        return self.value


def trace_function(
    matvec: Callable[[np.ndarray], np.ndarray],
    n: int,
    f: Callable[[np.ndarray], np.ndarray] = np.sqrt,
    *,
    probes: int = 30,
    steps: int = 60,
    rng: np.random.Generator | int | None = None,
    block: bool = True,
    node: float | None = 0.0,
) -> SLQEstimate:
    r"""Estimate :math:`\operatorname{tr} f(M)` by stochastic Lanczos quadrature.

    Parameters
    ----------
    matvec : callable
        ``matvec(X)`` returns :math:`M X` for an ``(n, k)`` array ``X``, where :math:`M` is
        symmetric positive semi-definite. It is called with ``k`` equal to the number of
        probes of the current chunk still iterating (``k = 1`` throughout when
        ``block=False``); a 1-D result is accepted for ``k = 1``.
    n : int
        Dimension of :math:`M`.
    f : callable, default ``np.sqrt``
        Vectorised scalar function applied to quadrature nodes, which are clipped to
        :math:`[0, \infty)` first (they can be slightly negative from roundoff). The default
        gives :math:`\operatorname{tr} M^{1/2}`, the nuclear norm of :math:`W` when
        :math:`M = W^\top W`.
    probes : int, default 30
        Number :math:`p \ge 2` of Rademacher probe vectors.
    steps : int, default 60
        Maximum Lanczos steps :math:`m` per probe; capped at ``n``. With ``m = n`` each
        probe's quadrature is exact, so only the Hutchinson variance remains.
    rng : numpy.random.Generator, int or None
        Source of the probes. Each probe draws from its own child generator
        (``Generator.spawn``), so the result does not depend on ``block`` or on chunking.
    block : bool, default True
        Run the recurrences of many probes together, with one ``matvec`` call on an
        ``(n, k)`` block per step. Probes are split into chunks only as needed to keep the
        bases within ~1.5 GB. If False, probes are processed one at a time.
    node : float or None, default 0.0
        Prescribed node :math:`a` of the Gauss–Radau rule; it must satisfy
        :math:`a \le \lambda_{\min}(M)` for the bracket to be certified. None skips the
        Radau rule, so every bracket collapses to the Gauss value.

    Returns
    -------
    SLQEstimate
        Mean bracket :math:`[L, U]`, the midpoint ``value`` and its Hutchinson standard
        error, where probe :math:`i`'s bracket is spanned by
        :math:`n R_m^{(i)}` and :math:`n G_m^{(i)}` (the squared norm of a Rademacher
        probe is :math:`n`).

    Raises
    ------
    ValueError
        If ``n < 1``, ``probes < 2``, ``steps < 1``, ``node`` is neither None nor a finite
        number, or ``matvec`` returns an array of the wrong size.

    Notes
    -----
    Each recurrence uses full reorthogonalisation, so a probe costs :math:`O(m n)` memory
    and :math:`O(m^2 n)` flops besides its :math:`m` products with :math:`M`. A recurrence
    that breaks down (:math:`\beta_{k+1} \approx 0`) has found an invariant subspace, on
    which its Gauss rule is exact; it stops there while the others continue, and its
    bracket shrinks to the Gauss value (up to rounding, see ``_quadrature_bracket``).
    """
    n, probes = _check_size(n, "n", 1), _check_size(probes, "probes", 2)
    steps = min(_check_size(steps, "steps", 1), n)
    node = None if node is None else _check_real(node, "node")
    lower, upper, used = _probe_brackets(matvec, n, f, probes, [steps], 0.0, node, rng, block)
    return _summary(lower, upper, used)


def trace_sqrt(
    matvec: Callable[[np.ndarray], np.ndarray],
    n: int,
    *,
    probes: int = 30,
    rel_gap: float = 0.02,
    max_steps: int = 480,
    rng: np.random.Generator | int | None = None,
    node: float = 0.0,
) -> SLQEstimate:
    r"""Estimate :math:`\operatorname{tr} M^{1/2}` with as many Lanczos steps as its bracket needs.

    The bracket :math:`[L, U]` of :func:`trace_function` (for :math:`f = \sqrt{\cdot}`) is
    evaluated after :math:`m = 60, 120, 240, \dots` steps and after ``max_steps``, from
    the prefixes :math:`T_m` and :math:`\beta_{m+1}` of one Lanczos run on fixed probes, and
    the recurrence stops at the first :math:`m` with

    .. math:: U - L \le \text{rel\_gap} \cdot \frac{L + U}{2},

    or at ``max_steps``. The quadrature bias of the returned ``value`` is then at most
    ``rel_gap / 2`` of it, on top of the Hutchinson error measured by ``stderr``.

    Parameters
    ----------
    matvec : callable
        Block product with the PSD matrix :math:`M`, as for :func:`trace_function`.
    n : int
        Dimension of :math:`M`.
    probes : int, default 30
        Number :math:`p \ge 2` of Rademacher probe vectors.
    rel_gap : float, default 0.02
        Target relative width :math:`\rho > 0` of the mean bracket.
    max_steps : int, default 480
        Largest number of Lanczos steps per probe; capped at ``n``.
    rng : numpy.random.Generator, int or None
        Source of the probes, as for :func:`trace_function`.
    node : float, default 0.0
        Gauss–Radau node :math:`a \le \lambda_{\min}(M)`.

    Returns
    -------
    SLQEstimate
        As from ``trace_function(matvec, n, np.sqrt, steps=m, ...)`` with the same probes,
        where ``steps`` is the :math:`m` at which the recurrence stopped.

    Raises
    ------
    ValueError
        If ``n < 1``, ``probes < 2``, ``max_steps < 1``, ``rel_gap`` is not a positive
        number, ``node`` is not a finite number, or ``matvec`` returns an array of the wrong
        size.

    Notes
    -----
    When the bases of all probes for some :math:`m` do not fit in memory together, the
    probes run in chunks, and each check beyond the last :math:`m` that fits reruns them
    from the start with the larger step count.
    """
    n, probes = _check_size(n, "n", 1), _check_size(probes, "probes", 2)
    max_steps = min(_check_size(max_steps, "max_steps", 1), n)
    if _check_real(rel_gap, "rel_gap") <= 0:
        raise ValueError(f"rel_gap must be positive, got {rel_gap!r}")
    node = _check_real(node, "node")
    levels = [min(_FIRST_STEPS, max_steps)]
    while levels[-1] < max_steps:
        levels.append(min(2 * levels[-1], max_steps))
    lower, upper, used = _probe_brackets(matvec, n, np.sqrt, probes, levels, float(rel_gap), node, rng, True)
    return _summary(lower, upper, used)


def probe_brackets(
    matvec: Callable[[np.ndarray], np.ndarray],
    n: int,
    levels: Sequence[int],
    *,
    probes: int = 30,
    f: Callable[[np.ndarray], np.ndarray] = np.sqrt,
    rng: np.random.Generator | int | None = None,
    node: float = 0.0,
    reorthogonalize: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Each probe's quadrature bracket for :math:`v_i^\top f(M) v_i` after each of several step counts.

    One Lanczos recurrence per probe, read at every level, so a caller can combine the probes
    (a control variate on the same probes, say) and see how the rules move with the steps.

    Parameters
    ----------
    matvec, n, f, rng, node
        As for :func:`trace_function`; the probes are the same for equal ``rng`` seeds.
    levels : sequence of int
        Increasing step counts, each at most ``n``.
    probes : int, default 30
        Number of Rademacher probes (at least 1).
    reorthogonalize : bool, default True
        ``False`` runs the plain three-term recurrence: a few vectors per probe instead of the
        whole basis (``m n`` numbers) and no :math:`O(m^2 n)` projections, for a huge ``n`` or
        many steps. In floating point the basis then loses orthogonality once Ritz values
        converge and the recurrence makes extra copies of them; the Gauss rule of such a run
        is still that of a measure close to the true one (Greenbaum; Knizhnerman), so the
        rules stay close, but the bracket is no longer guaranteed.

    Returns
    -------
    lower, upper : ndarray, shape (len(levels), probes)
        :math:`n \min(R_m, G_m)` and :math:`n \max(R_m, G_m)` per level and probe, as in
        :func:`trace_function` (whose mean over probes is its ``lower`` and ``upper``).
    """
    n, probes = _check_size(n, "n", 1), _check_size(probes, "probes", 1)
    levels = [_check_size(m, "level", 1) for m in levels]
    if not levels or any(b <= a for a, b in zip(levels, levels[1:])) or levels[-1] > n:
        raise ValueError(f"levels must be increasing step counts of at most n = {n}, got {levels!r}")
    node = _check_real(node, "node")
    signs = _probe_signs(rng, probes, n)
    width = levels[-1] if reorthogonalize else _PLAIN_VECTORS
    chunk = int(max(1, min(probes, _BASIS_BYTES // (8 * width * n))))
    lower, upper = np.empty((len(levels), probes)), np.empty((len(levels), probes))
    for first in range(0, probes, chunk):
        index = np.arange(first, min(first + chunk, probes))
        start = (2.0 * signs[index] - 1.0) / np.sqrt(n)
        for row, prefixes in enumerate(_lanczos(matvec, start, levels, reorthogonalize)):
            for i, prefix in zip(index, prefixes):
                lower[row, i], upper[row, i] = _scaled_bracket(prefix, f, node, n)
    return lower, upper


def _probe_signs(rng: np.random.Generator | int | None, probes: int, n: int) -> np.ndarray:
    """The Rademacher probes as 0/1 bytes (probe ``i`` is ``2 * signs[i] - 1``), one child generator each
    (``Generator.spawn``), so equal seeds give equal probes whatever the chunking or the caller."""
    children = np.random.default_rng(rng).spawn(probes)
    return np.stack([g.integers(0, 2, size=n, dtype=np.int8) for g in children])


def _scaled_bracket(prefix: tuple[np.ndarray, np.ndarray, float], f, node: float | None, n: int
                    ) -> tuple[float, float]:
    """One probe's bracket ``n * min(R_m, G_m), n * max(R_m, G_m)`` from its Lanczos prefix."""
    rules = _quadrature_bracket(*prefix, f, node)
    return n * min(rules), n * max(rules)


def _check_size(value: int, name: str, least: int) -> int:
    """Return ``value`` as an ``int`` after checking it is an integer ``>= least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def _check_real(value: float, name: str) -> float:
    """Return ``value`` as a ``float`` after checking it is a finite real number."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (real and np.isfinite(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def _summary(lower: np.ndarray, upper: np.ndarray, steps: int) -> SLQEstimate:
    """Collect per-probe brackets ``[lower_i, upper_i]`` into an :class:`SLQEstimate`."""
    mid = (lower + upper) / 2.0
    return SLQEstimate(
        value=float(mid.mean()),
        stderr=float(mid.std(ddof=1) / np.sqrt(mid.size)),
        probes=int(mid.size),
        steps=int(steps),
        lower=float(lower.mean()),
        upper=float(upper.mean()),
    )


def _probe_brackets(
    matvec: Callable[[np.ndarray], np.ndarray],
    n: int,
    f: Callable[[np.ndarray], np.ndarray],
    probes: int,
    levels: Sequence[int],
    rel_gap: float,
    node: float | None,
    rng: np.random.Generator | int | None,
    block: bool,
) -> tuple[np.ndarray, np.ndarray, int]:
    r"""Per-probe quadrature brackets for :math:`v_i^\top f(M) v_i` at the first adequate level.

    The brackets are evaluated after ``levels[0] < levels[1] < ...`` Lanczos steps; the
    first level :math:`m` with :math:`\bar u - \bar\ell \le \rho \lvert (\bar\ell + \bar u)/2 \rvert`
    (means over probes, :math:`\rho` = ``rel_gap``) or the last level ends the run. The
    levels whose bases fit in memory for all probes at once share one recurrence, which is
    stopped as soon as a level passes; each later level reruns the probes in chunks.

    Returns
    -------
    lower, upper : ndarray, shape (probes,)
        :math:`\ell_i = n \min(R_m, G_m)` and :math:`u_i = n \max(R_m, G_m)` for probe ``i``.
    steps : int
        The level :math:`m` used.
    """
    # Probe i is 2 * signs[i] - 1; one byte per entry keeps all probes for reruns.
    signs = _probe_signs(rng, probes, n)
    lower, upper = np.empty(probes), np.empty(probes)

    def start(index: np.ndarray) -> np.ndarray:
        r"""Unit start vectors :math:`v_i / \sqrt n` of the probes ``index``, one per row."""
        return (2.0 * signs[index] - 1.0) / np.sqrt(n)

    def evaluate(index: np.ndarray, prefixes: list[tuple[np.ndarray, np.ndarray, float]]) -> None:
        """Store the brackets of the probes ``index`` from their Lanczos prefixes."""
        for i, prefix in zip(index, prefixes):
            lower[i], upper[i] = _scaled_bracket(prefix, f, node, n)

    def passes(level: int) -> bool:
        """Whether the mean bracket meets the ``rel_gap`` criterion, or ``level`` is the last."""
        width = upper.mean() - lower.mean()
        return level == levels[-1] or width <= rel_gap * abs(upper.mean() + lower.mean()) / 2.0

    def sweeps() -> Iterator[int]:
        """Fill ``lower`` and ``upper`` for every probe at each level in turn, yielding it."""
        everyone = np.arange(probes)
        together = [m for m in levels if block and probes * m * n * 8 <= _BASIS_BYTES]
        if together:
            for level, prefixes in zip(together, _lanczos(matvec, start(everyone), together)):
                evaluate(everyone, prefixes)
                yield level
        for level in levels[len(together) :]:
            chunk = int(max(1, min(probes, _BASIS_BYTES // (8 * level * n)))) if block else 1
            for first in range(0, probes, chunk):
                index = everyone[first : first + chunk]
                (prefixes,) = _lanczos(matvec, start(index), [level])
                evaluate(index, prefixes)
            yield level

    steps = next(level for level in sweeps() if passes(level))
    return lower, upper, steps


def _apply(matvec: Callable[[np.ndarray], np.ndarray], q: np.ndarray) -> np.ndarray:
    r"""Return :math:`(M Q^\top)^\top` for the row-stacked vectors ``q`` of shape ``(k, n)``.

    ``matvec`` receives the ``(n, k)`` view ``q.T``; the result is a C-contiguous array
    that never aliases ``q``, so the caller may update it in place.
    """
    k, n = q.shape
    out = np.asarray(matvec(q.T), dtype=float)
    if out.shape != (n, k) and not (k == 1 and out.shape == (n,)):
        raise ValueError(f"matvec returned shape {out.shape} for an input of shape ({n}, {k})")
    w = np.ascontiguousarray(out.reshape(n, k).T)
    return w.copy() if np.may_share_memory(w, q) else w


def _lanczos(
    matvec: Callable[[np.ndarray], np.ndarray], q: np.ndarray, checkpoints: Sequence[int],
    reorthogonalize: bool = True,
) -> Iterator[list[tuple[np.ndarray, np.ndarray, float]]]:
    r"""Run independent Lanczos recurrences, one per row of ``q``, sharing ``matvec`` calls.

    For each unit start vector :math:`q_1` (and :math:`\beta_1 q_0 = 0`) step :math:`k` is

    .. math::
        \alpha_k = q_k^\top M q_k, \qquad
        r = M q_k - \alpha_k q_k - \beta_k q_{k-1}, \qquad
        r \leftarrow r - Q_k (Q_k^\top r), \qquad
        \beta_{k+1} = \lVert r \rVert, \quad q_{k+1} = r / \beta_{k+1},

    with :math:`Q_k = [q_1, \dots, q_k]`. The projection is full reorthogonalisation: in
    exact arithmetic :math:`Q_k^\top r = 0`, and in floating point it removes the drift
    that would otherwise create spurious copies of converged Ritz values. Following
    Kahan and Parlett ("twice is enough"), it is repeated once whenever it shrinks some
    probe's :math:`\lVert r \rVert` by more than a factor :math:`1/\sqrt 2`, i.e. when
    :math:`r` was nearly inside :math:`\operatorname{span} Q_k`. After :math:`m` steps,
    :math:`T_m = \operatorname{tridiag}(\beta_{2:m}, \alpha_{1:m}, \beta_{2:m})` and the
    last residual norm :math:`\beta_{m+1}` (computed with the same reorthogonalisation)
    extends it for the Gauss–Radau rule. A breakdown, :math:`\beta_{k+1} \le`
    ``_BREAKDOWN_RTOL`` times a running bound on :math:`\lVert T_k \rVert_\infty`, ends
    that recurrence with :math:`\beta_{k+1}` recorded as 0 (its Krylov space is invariant).

    Parameters
    ----------
    matvec : callable
        Block product with :math:`M`, see :func:`trace_function`.
    q : ndarray, shape (c, n)
        Unit-norm start vectors, one per row.
    checkpoints : sequence of int
        Increasing step counts :math:`m \le n`; the last is the maximum number of steps.
    reorthogonalize : bool, default True
        ``False``: the plain three-term recurrence, keeping three vectors per probe instead of
        the whole basis (see :func:`probe_brackets`).

    Yields
    ------
    list of (alpha, beta, beta_next)
        After step :math:`m` of each checkpoint, for each row: the diagonal (length
        :math:`m_i`) and off-diagonal (length :math:`m_i - 1`) of :math:`T_{m_i}`, and
        :math:`\beta_{m_i + 1}`, where :math:`m_i = m` unless the row broke down after
        :math:`m_i < m` steps (then :math:`\beta_{m_i + 1} = 0`). The arrays are views that
        later steps do not modify. Closing the generator stops the recurrence.
    """
    c, n = q.shape
    steps = checkpoints[-1]
    basis = np.empty((steps, c, n)) if reorthogonalize else None  # basis[:, i] holds Q_k of probe i
    alphas = np.zeros((c, steps))
    betas = np.zeros((c, steps))  # betas[:, k] = beta_{k+2}, the residual norm of step k (0-based)
    lengths = np.full(c, steps)  # number of steps before a breakdown
    active = np.arange(c)  # original row of each probe still iterating
    q_prev = np.zeros_like(q)
    beta_prev = np.zeros(c)
    norm_t = np.zeros(c)  # running bound on ||T_k||_inf, the scale for breakdown
    stops = set(checkpoints)
    for k in range(steps):
        if active.size:
            if basis is not None:
                basis[k, active] = q
            r = _apply(matvec, q)
            alpha = np.einsum("cn,cn->c", q, r)
            alphas[active, k] = alpha
            r -= alpha[:, None] * q
            r -= beta_prev[:, None] * q_prev
            beta = np.linalg.norm(r, axis=1)
            for _ in range(2 if basis is not None else 0):
                before = np.linalg.norm(r, axis=1)
                for i, r_i in zip(active, r):  # per probe: two BLAS gemv, faster than batched einsum
                    q_i = basis[: k + 1, i]  # Q_k of probe i, shape (k + 1, n)
                    r_i -= (q_i @ r_i) @ q_i
                beta = np.linalg.norm(r, axis=1)
                if np.all(beta >= before / np.sqrt(2.0)):
                    break
            norm_t = np.maximum(norm_t, np.abs(alpha) + beta_prev + beta)
            done = beta <= _BREAKDOWN_RTOL * norm_t
            betas[active, k] = np.where(done, 0.0, beta)
            lengths[active[done]] = k + 1
            keep = ~done
            if not keep.all():  # (indexing copies: only when a recurrence stops)
                active, r, q, beta, norm_t = (x[keep] for x in (active, r, q, beta, norm_t))
            r /= beta[:, None]  # r is this step's own array (_apply never aliases)
            q_prev, q = q, r
            beta_prev = beta
        if k + 1 in stops:
            yield [
                (alphas[i, :m], betas[i, : m - 1], float(betas[i, m - 1]))
                for i, m in enumerate(np.minimum(lengths, k + 1))
            ]


def _quadrature_bracket(
    alpha: np.ndarray,
    beta: np.ndarray,
    beta_next: float,
    f: Callable[[np.ndarray], np.ndarray],
    node: float | None,
) -> tuple[float, float]:
    r"""Gauss–Radau and Gauss rules :math:`(R_m, G_m)` for one probe with unit start vector.

    With :math:`T_m = S \Theta S^\top` (diagonal ``alpha``, off-diagonal ``beta``), the
    Gauss rule is :math:`G_m = \sum_j S_{1j}^2 f(\theta_j)`. In the Ritz basis,
    :math:`\operatorname{diag}(S, 1)^\top \tilde T_{m+1} \operatorname{diag}(S, 1)` is the
    arrowhead matrix with diagonal :math:`(\Theta, \phi)`, last row and column
    :math:`\rho_j = \beta_{m+1} S_{mj}` (:math:`\lvert \rho_j \rvert` is the residual norm
    of Ritz pair :math:`j`), and :math:`e_1` becomes :math:`(S_{1,:}, 0)`; there

    .. math::
        \phi = a + \beta_{m+1}^2 \, e_m^\top (T_m - aI)^{-1} e_m
             = a + \sum_j \frac{\rho_j^2}{\theta_j - a}.

    Rounding makes this ill-conditioned exactly when :math:`T_m - aI` is nearly singular:
    Ritz values carry absolute errors of order
    :math:`\varepsilon = m u (\lVert \Theta \rVert_\infty + \lvert a \rvert + \beta_{m+1})`
    (:math:`u` the unit roundoff), so a Ritz value that has converged onto an eigenvalue at
    :math:`a` (a null space of :math:`M` when :math:`a = 0`) has an unresolved gap
    :math:`\theta_j - a`, and its term in :math:`\phi` is arbitrary (the exact one is
    bounded, :math:`\rho_j^2 / (\theta_j - a) \le \lambda_{\max} - \theta_j` by the
    Kato–Temple inequality). A rule built from it puts nodes on both sides of :math:`a`,
    where :math:`\sqrt{\cdot}` is not even Lipschitz, and can overshoot the true value.
    Such pairs, :math:`\theta_j - a \le` ``_RESOLVED`` :math:`\cdot \varepsilon`, are
    therefore deflated: their weight :math:`S_{1j}^2` is put on the node :math:`a`, and
    their row and column (and term of :math:`\phi`) are removed from the arrowhead, which is
    then diagonalised densely; with nothing deflated, :math:`\tilde T_{m+1}` itself is
    diagonalised as a tridiagonal. Deflation moves weight down to :math:`a` and lowers
    :math:`\phi`, which for an operator-monotone :math:`f` such as the square root (its
    rule has :math:`\partial R_m / \partial \phi = e_1^\top Df(\tilde T_{m+1})[e_{m+1}
    e_{m+1}^\top] e_1 \ge 0`) lowers :math:`R_m`, keeping it a lower bound; the loss
    vanishes as the rest of the spectrum converges. Finally each Radau node is moved
    towards :math:`a` (not past it) by its own accuracy
    :math:`\varepsilon + m u \lvert \phi \rvert`.

    Both rules evaluate ``f`` at nodes clipped to :math:`[0, \infty)`. If ``node`` is None
    the pair is :math:`(G_m, G_m)`; after a breakdown (:math:`\beta_{m+1} = 0`, so
    :math:`G_m` is exact) the extra node decouples with zero weight and :math:`R_m` equals
    :math:`G_m` up to the rounding adjustments above.
    """
    theta, s = eigh_tridiagonal(alpha, beta)
    gauss = _rule(theta, s[0], f)
    if node is None:
        return gauss, gauss
    unit = alpha.size * np.finfo(float).eps
    accuracy = unit * (np.abs(theta).max() + abs(node) + beta_next)
    kept = theta - node > _RESOLVED * accuracy
    residuals = beta_next * s[-1, kept]
    phi = node + float(np.sum(residuals**2 / (theta[kept] - node)))
    if kept.all():
        nodes, vectors = eigh_tridiagonal(np.append(alpha, phi), np.append(beta, beta_next))
        first = vectors[0]
    else:
        arrow = np.diag(np.append(theta[kept], phi))
        arrow[-1, :-1] = arrow[:-1, -1] = residuals
        nodes, vectors = np.linalg.eigh(arrow)
        first = s[0, kept] @ vectors[:-1]
    nodes = np.maximum(nodes - accuracy - unit * abs(phi), node)
    deflated = np.count_nonzero(~kept)
    radau = _rule(np.append(nodes, np.full(deflated, node)), np.append(first, s[0, ~kept]), f)
    return radau, gauss


def _rule(
    nodes: np.ndarray, first: np.ndarray, f: Callable[[np.ndarray], np.ndarray]
) -> float:
    r"""Quadrature :math:`\sum_j w_j f(\max(x_j, 0))` with weights :math:`w_j` = ``first**2``.

    ``nodes`` are the eigenvalues :math:`x_j` of a Jacobi matrix and ``first`` the first
    components of its unit eigenvectors, so the weights sum to one.
    """
    return float(first**2 @ np.asarray(f(np.maximum(nodes, 0.0)), dtype=float))
