r"""Stochastic Lanczos quadrature (SLQ) for spectral traces :math:`\operatorname{tr} f(M)`.

For a symmetric positive semi-definite :math:`M \in \mathbb{R}^{n \times n}` that is only
available through products :math:`X \mapsto M X`, SLQ combines two approximations:

1. **Hutchinson.** For Rademacher probes :math:`v \in \{-1, +1\}^n`,
   :math:`\mathbb{E}[v^\top f(M) v] = \operatorname{tr} f(M)`, so the mean of
   :math:`v_i^\top f(M) v_i` over independent probes is unbiased.
2. **Gauss quadrature.** With :math:`M = U \Lambda U^\top`,
   :math:`v^\top f(M) v = \lVert v \rVert^2 \sum_i \mu_i f(\lambda_i)` where
   :math:`\mu_i = (u_i^\top v)^2 / \lVert v \rVert^2`; this is a Riemann–Stieltjes integral
   against a spectral measure. :math:`m` Lanczos steps started at
   :math:`q_1 = v / \lVert v \rVert` produce a tridiagonal
   :math:`T_m = S \Theta S^\top`, and the :math:`m`-point Gauss rule
   :math:`v^\top f(M) v \approx \lVert v \rVert^2 \sum_j \tau_j^2 f(\theta_j)`,
   :math:`\tau_j = S_{1j}`, is exact for polynomials of degree :math:`\le 2m - 1`.

The main use in ``hdmm`` is the nuclear norm
:math:`\lVert W \rVert_* = \operatorname{tr}\bigl((W^\top W)^{1/2}\bigr)` of a huge implicit
workload, which enters the SVD lower bound on the error of any strategy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.linalg import eigh_tridiagonal

__all__ = ["SLQEstimate", "trace_function"]

#: Largest Lanczos basis (bytes) kept in memory at once; probes are processed in chunks
#: so that ``chunk * steps * n * 8`` stays below this.
_BASIS_BYTES = 1.5e9

#: A probe's recurrence stops once :math:`\beta_{k+1} \le` this times a running estimate of
#: :math:`\lVert T_k \rVert`: the Krylov space is then (numerically) invariant under ``M``.
_BREAKDOWN_RTOL = 1e-10


@dataclass(frozen=True)
class SLQEstimate:
    r"""Result of :func:`trace_function`.

    Attributes
    ----------
    value : float
        Mean of the per-probe quadrature estimates, :math:`\hat t = \frac1p \sum_i \hat t_i`.
    stderr : float
        Standard error of the mean, :math:`s / \sqrt{p}` with :math:`s` the sample standard
        deviation (``ddof=1``) of the :math:`\hat t_i`.
    probes : int
        Number of probe vectors :math:`p`.
    steps : int
        Maximum number of Lanczos steps per probe (after capping at ``n``).
    """

    value: float
    stderr: float
    probes: int
    steps: int

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
        Vectorised scalar function applied to Ritz values, which are clipped to
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

    Returns
    -------
    SLQEstimate
        Mean and standard error of the per-probe estimates
        :math:`\hat t_i = \lVert v_i \rVert^2 \sum_j \tau_{ij}^2 f(\max(\theta_{ij}, 0))`.

    Raises
    ------
    ValueError
        If ``n < 1``, ``probes < 2``, ``steps < 1``, or ``matvec`` returns an array of the
        wrong size.

    Notes
    -----
    Each recurrence uses full reorthogonalisation, so a probe costs :math:`O(m n)` memory
    and :math:`O(m^2 n)` flops besides its :math:`m` products with :math:`M`. A recurrence
    that breaks down (:math:`\beta_{k+1} \approx 0`) has found an invariant subspace, on
    which its Gauss rule is exact; it stops there while the others continue.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(probes, bool) or not isinstance(probes, (int, np.integer)) or probes < 2:
        raise ValueError(f"probes must be an integer >= 2 (needed for a standard error), got {probes!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    n, probes, steps = int(n), int(probes), min(int(steps), int(n))

    probe_rngs = np.random.default_rng(rng).spawn(probes)
    if block:
        chunk = int(max(1, min(probes, _BASIS_BYTES // (8 * steps * n))))
    else:
        chunk = 1

    estimates = np.empty(probes)
    for start in range(0, probes, chunk):
        stop = min(start + chunk, probes)
        # Rademacher probes, one row per probe: ||v||^2 = n.
        v = np.stack([2.0 * g.integers(0, 2, size=n) - 1.0 for g in probe_rngs[start:stop]])
        for i, (alpha, beta) in enumerate(_lanczos(matvec, v / np.sqrt(n), steps), start=start):
            estimates[i] = n * _gauss_quadrature(alpha, beta, f)

    return SLQEstimate(
        value=float(estimates.mean()),
        stderr=float(estimates.std(ddof=1) / np.sqrt(probes)),
        probes=probes,
        steps=steps,
    )


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
    matvec: Callable[[np.ndarray], np.ndarray], q: np.ndarray, steps: int
) -> list[tuple[np.ndarray, np.ndarray]]:
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
    :math:`r` was nearly inside :math:`\operatorname{span} Q_k`. Finally
    :math:`T_m = \operatorname{tridiag}(\beta_{2:m}, \alpha_{1:m}, \beta_{2:m})`.

    Parameters
    ----------
    matvec : callable
        Block product with :math:`M`, see :func:`trace_function`.
    q : ndarray, shape (c, n)
        Unit-norm start vectors, one per row.
    steps : int
        Maximum number of steps :math:`m \le n`.

    Returns
    -------
    list of (alpha, beta)
        For each row, the diagonal (length :math:`m_i`) and off-diagonal (length
        :math:`m_i - 1`) of :math:`T_{m_i}`; :math:`m_i < m` after a breakdown.
    """
    c, n = q.shape
    basis = np.empty((steps, c, n))  # basis[:, i] holds Q_k of probe i
    alphas = np.zeros((c, steps))
    betas = np.zeros((c, steps))  # betas[:, k] couples steps k and k + 1 (0-based)
    lengths = np.full(c, steps)
    active = np.arange(c)  # original row of each probe still iterating
    q_prev = np.zeros_like(q)
    beta_prev = np.zeros(c)
    norm_t = np.zeros(c)  # running bound on ||T_k||_inf, the scale for breakdown
    for k in range(steps):
        basis[k, active] = q
        r = _apply(matvec, q)
        alpha = np.einsum("cn,cn->c", q, r)
        alphas[active, k] = alpha
        if k == steps - 1:
            break
        r -= alpha[:, None] * q + beta_prev[:, None] * q_prev
        for _ in range(2):
            before = np.linalg.norm(r, axis=1)
            for i, r_i in zip(active, r):  # per probe: two BLAS gemv, faster than batched einsum
                q_i = basis[: k + 1, i]  # Q_k of probe i, shape (k + 1, n)
                r_i -= (q_i @ r_i) @ q_i
            beta = np.linalg.norm(r, axis=1)
            if np.all(beta >= before / np.sqrt(2.0)):
                break
        norm_t = np.maximum(norm_t, np.abs(alpha) + beta_prev + beta)
        betas[active, k] = beta
        done = beta <= _BREAKDOWN_RTOL * norm_t
        if done.any():
            lengths[active[done]] = k + 1
            keep = ~done
            if not keep.any():
                break
            active, r, q, beta, norm_t = (x[keep] for x in (active, r, q, beta, norm_t))
        q_prev, q = q, r / beta[:, None]
        beta_prev = beta
    return [(alphas[i, : lengths[i]], betas[i, : lengths[i] - 1]) for i in range(c)]


def _gauss_quadrature(
    alpha: np.ndarray, beta: np.ndarray, f: Callable[[np.ndarray], np.ndarray]
) -> float:
    r"""Gauss rule :math:`\sum_j \tau_j^2 f(\max(\theta_j, 0))` from :math:`T = S \Theta S^\top`.

    :math:`\theta_j` are the eigenvalues (Ritz values) of the tridiagonal matrix with
    diagonal ``alpha`` and off-diagonal ``beta``, and :math:`\tau_j = S_{1j}` the first
    components of its unit eigenvectors; the weights :math:`\tau_j^2` sum to one.
    """
    theta, s = eigh_tridiagonal(alpha, beta)
    tau2 = s[0] ** 2
    return float(tau2 @ np.asarray(f(np.maximum(theta, 0.0)), dtype=float))
