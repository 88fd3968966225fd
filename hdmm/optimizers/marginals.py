r"""OPT_M (weighted marginals) and the optimal residual strategy (docs/math.md, sections 3 and 4).

Both strategies have Grams in the marginals algebra, :math:`X = \sum_T \mu_T E_T`, so the error
of *any* union-of-Kronecker workload under them is exact and cheap:

.. math:: \mathrm{tr}(X^+ W^TW) = \sum_T \tau_T / \lambda_T, \qquad
          \tau_T = \mathrm{tr}(E_T W^TW)/N, \quad \lambda_T = \mu_T / N,

with :math:`\tau` the workload's trace spectrum (:func:`hdmm.marginals.trace_spectrum`). A
workload outside the marginals algebra is thereby not approximated at all: only the strategy
is restricted.

**OPT_M.** Marginals :math:`M_S` weighted by :math:`\theta_S \ge 0` give
:math:`\lambda_T = \sum_{S \supseteq T} \theta_S^2 / \prod_{i \in S} n_i` (a superset sum, a
sparse matrix ``Z`` with ``Z[T, S] = 1/prod_{i in S} n_i``), sensitivity
:math:`D_1 = \sum_S \theta_S` (Laplace) or :math:`D_2^2 = \sum_S \theta_S^2` (Gaussian), and
objective :math:`D^2 \sum_T \tau_T/\lambda_T`. With :math:`r = \tau/\lambda^2`,
:math:`\partial \lambda\text{-part}/\partial\theta_S = -2\theta_S (Z^T r)_S`. Under Gaussian noise
the objective is convex in :math:`u = \theta^2`, and L-BFGS-B on :math:`\theta \ge 0` reaches
its optimum. Under Laplace noise it has many local optima, and weights are searched as
:math:`\theta = v^2` over unconstrained ``v`` instead, because from the same starts the best
optimum found that way is better on the benchmark workloads (single starts can end worse; the
figures are in ``benchmarks/results/tuning-notes-optimizers.md``). A step that loses support
has infinite objective and is refused by the line search. The objective costs only
``O(nnz(Z))``, so small problems get at least ``MIN_STARTS`` starts.

**Residuals (Gaussian).** Measuring :math:`\sqrt{\lambda_T} R_T` with :math:`R_T^TR_T = E_T`
gives :math:`D_2^2 = \sum_T \lambda_T \mathrm{tr}(E_T)` (normalised) and error
:math:`D_2^2 \sum_T \tau_T/\lambda_T`, minimised by Cauchy-Schwarz at
:math:`\lambda_T \propto \sqrt{\tau_T/\mathrm{tr}(E_T)}` with value
:math:`(\sum_T \sqrt{\tau_T \mathrm{tr}(E_T)})^2`: exactly the SVD bound for marginal-algebra
workloads (ResidualPlanner, Xiao et al. 2023), and the best residual strategy for any other.
Only subsets with :math:`\tau_T > 0` (the downward closure of the workload's marginals) are
enumerated.

The optimizers take the privacy definition; only its kind of noise matters (its sensitivity norm
``privacy.norm`` enters the objective), never its level.
"""

from __future__ import annotations

import itertools

import numpy as np
import scipy.sparse as sp
from scipy.optimize import Bounds, minimize

from ..kron_union import KronUnion, kron_union
from ..marginals import Marginals, Residuals, subset_keys, trace_spectrum, workload_domain
from ..matrix import Matrix
from ..privacy import Privacy
from .racing import successive_halving

__all__ = ["MarginalsProblem", "marginal_candidate_count", "optimize_marginal_weights", "opt_marginals_strategy",
           "residual_strategy"]

#: Problems whose superset matrix ``Z`` has at most this many non-zeros are cheap: they get at
#: least ``MIN_STARTS`` starts (Laplace OPT_M's optimum varies a lot between starts).
CHEAP_NNZ = 100_000

#: Starts of a problem that is not cheap, by default.
STARTS = 3

#: Fewest starts for a cheap problem: enough that the best optimum found no longer depends on the
#: seed on the benchmark workloads, where the starts of a cheap problem cost well under a second.
MIN_STARTS = 128

#: More starts than ``SCREEN_KEEP`` are first screened by ``SCREEN_ITER`` batched descent steps
#: (:func:`_screen`), and ``SCREEN_KEEP`` of them go on to the L-BFGS-B searches.
SCREEN_ITER = 20
SCREEN_KEEP = 32

#: L-BFGS-B iterations of a search run to convergence (at most).
MAXITER = 2000

#: Successive halving of the starts (:func:`optimize_marginal_weights`): every start first runs
#: ``RUNG_ITER`` iterations; each rung keeps the best ``1 / RUNG_KEEP`` and multiplies the
#: iterations by ``RUNG_GROWTH``.
RUNG_ITER = 10
RUNG_KEEP = 4
RUNG_GROWTH = 3

#: Above this many attributes, OPT_M's candidates are the workload's downward closure and the
#: full data cube (which alone gives the identity's error).
ALL_SUBSETS_MAX_DIM = 12


def marginal_candidate_count(union: KronUnion) -> int:
    """How many candidate marginals :class:`MarginalsProblem` would search for ``union`` by default.

    All ``2^d`` subsets up to ``ALL_SUBSETS_MAX_DIM`` attributes, else the workload's downward
    closure and the full data cube (from the trace spectrum, which the optimizers share).
    """
    if union.dim <= ALL_SUBSETS_MAX_DIM:
        return 2**union.dim
    members = trace_spectrum(union).members
    return members.shape[0] + int(not members.all(axis=1).any())


def _closure_and_cube(closure: np.ndarray) -> np.ndarray:
    """The workload's downward closure (boolean ``(subsets, d)``) with the full data cube added."""
    return np.unique(np.vstack([closure, np.ones((1, closure.shape[1]), dtype=bool)]), axis=0)


class MarginalsProblem:
    r"""The OPT_M objective for one workload: candidate subsets, :math:`\tau` and ``Z``.

    Parameters
    ----------
    union
        The workload as a union of Kronecker products.
    candidates
        Boolean ``(subsets, d)`` candidate marginals; by default all ``2^d`` subsets when
        ``d <= ALL_SUBSETS_MAX_DIM``, else the downward closure of the workload and the full
        data cube.
    """

    def __init__(self, union: KronUnion, candidates: np.ndarray | None = None):
        spectrum = trace_spectrum(union)
        d = union.dim
        if candidates is None:
            if d <= ALL_SUBSETS_MAX_DIM:
                grid = np.array(list(itertools.product([False, True], repeat=d)), dtype=bool).reshape(-1, d)
                candidates = grid
            else:
                candidates = _closure_and_cube(spectrum.members)
        self.sizes = union.sizes
        self.closure = spectrum.members
        self.members = np.asarray(candidates, dtype=bool)
        keys = subset_keys(self.members)
        order = np.argsort(keys)
        self.members, keys = self.members[order], keys[order]
        self.keys = keys
        self.tau = spectrum.lookup(keys, spectrum.tau)
        if not np.isclose(self.tau.sum(), spectrum.tau.sum(), rtol=1e-9):
            raise ValueError("the candidate marginals do not cover the workload's subsets")
        self.Z = self._superset_matrix(keys)

    def _superset_matrix(self, keys: np.ndarray) -> sp.csr_array:
        """``Z[T, S] = 1/prod_{i in S} n_i`` for candidates ``T`` inside candidates ``S``.

        The subsets of ``S`` are enumerated and looked up, or, when ``S`` has more subsets than
        there are candidates (the full data cube of many attributes), every candidate is tested.
        """
        sizes = np.array(self.sizes, dtype=float)
        scale = 1.0 / np.prod(np.where(self.members, sizes, 1.0), axis=1)
        rows, cols = [], []
        for s, member in enumerate(self.members):
            inside = np.flatnonzero(member)
            if 2 ** min(inside.size, 62) > keys.size:
                found = np.flatnonzero(~self.members[:, ~member].any(axis=1))
                rows.append(found)
                cols.append(np.full(found.size, s))
                continue
            subs = np.zeros((2 ** inside.size, member.size), dtype=bool)
            for m in range(2 ** inside.size):
                subs[m, inside[[(m >> b) & 1 == 1 for b in range(inside.size)]]] = True
            pos = np.searchsorted(keys, subset_keys(subs))
            found = keys[np.minimum(pos, keys.size - 1)] == subset_keys(subs)
            rows.append(pos[found])
            cols.append(np.full(int(found.sum()), s))
        rows, cols = np.concatenate(rows), np.concatenate(cols)
        return sp.csr_array((scale[cols], (rows, cols)), shape=(keys.size, keys.size))

    def embed(self, other: MarginalsProblem, theta: np.ndarray, floor: float = 1e-4) -> np.ndarray:
        """Weights ``theta`` of ``other`` (whose candidates are among these) as weights here.

        Candidates ``other`` lacks get ``floor`` times the largest weight, so a search from the
        result can still move weight onto them.
        """
        out = np.full(self.keys.size, floor * theta.max())
        out[np.searchsorted(self.keys, other.keys)] = theta
        return out

    def objectives(self, theta: np.ndarray, norm: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`objective` for many weight vectors at once: the columns of ``theta`` (``k x m``).

        Returns the ``m`` values (``inf`` where a weight vector loses support) and the ``k x m`` gradients.
        """
        lam = self.Z @ theta**2
        live = self.tau > 0
        tau = self.tau[live, None]
        lam_live = lam[live]
        lost = np.any(lam_live <= 0, axis=0)
        lam_live = np.where(lam_live > 0, lam_live, np.inf)
        F = np.sum(tau / lam_live, axis=0)
        r = np.zeros_like(lam)
        r[live] = tau / lam_live**2
        dF = -2.0 * theta * (self.Z.T @ r)
        s = theta.sum(axis=0) if norm == 1 else np.einsum("ij,ij->j", theta, theta)
        values = (s**2 if norm == 1 else s) * F
        grads = (2.0 * s * F + s**2 * dF) if norm == 1 else (2.0 * theta * F + s * dF)
        values[lost] = np.inf
        return values, grads

    def objective(self, theta: np.ndarray, norm: int) -> tuple[float, np.ndarray]:
        r"""Error (at unit noise) of weights ``theta`` and its gradient in ``theta``.

        ``norm`` is the sensitivity norm (``privacy.norm``): the strategy's sensitivity is
        :math:`\sum_S \theta_S` (1, Laplace) or :math:`(\sum_S \theta_S^2)^{1/2}` (2, Gaussian).
        """
        lam = self.Z @ theta**2
        live = self.tau > 0
        if np.any(lam[live] <= 0):
            return np.inf, np.zeros_like(theta)
        F = float(np.sum(self.tau[live] / lam[live]))
        r = np.zeros_like(lam)
        r[live] = self.tau[live] / lam[live] ** 2
        dF = -2.0 * theta * (self.Z.T @ r)
        if norm == 1:
            s = theta.sum()
            return s**2 * F, 2.0 * s * F + s**2 * dF
        s2 = float(theta @ theta)
        return s2 * F, 2.0 * theta * F + s2 * dF


def _descend(problem: MarginalsProblem, privacy: Privacy, theta0: np.ndarray,
             maxiter: int = MAXITER) -> tuple[np.ndarray, float]:
    """One local search of the OPT_M objective from ``theta0`` (at most ``maxiter`` L-BFGS-B
    iterations); returns ``(theta, objective)``, ``theta`` scaled to sensitivity 1 (the objective
    does not depend on the scale)."""
    norm = privacy.norm
    if norm == 1:
        def squared(v: np.ndarray) -> tuple[float, np.ndarray]:
            value, gradient = problem.objective(v * v, norm)
            return value, 2.0 * v * gradient

        result = minimize(squared, np.sqrt(theta0), jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
        theta = result.x**2
        return theta / theta.sum(), float(result.fun)
    result = minimize(problem.objective, theta0, args=(norm,), jac=True, method="L-BFGS-B",
                      bounds=Bounds(0.0, np.inf), options={"maxiter": maxiter})
    return result.x / np.sqrt(result.x @ result.x), float(result.fun)


def _screen(problem: MarginalsProblem, norm: int, starts: list[np.ndarray]) -> list[np.ndarray]:
    """``SCREEN_ITER`` batched descent steps from every start; the first two and the last start (the
    deterministic ones) and the best others, ``SCREEN_KEEP`` in all, as weights to search on from.

    The weights are searched as ``theta = v^2``; each start takes normalised gradient steps in ``v``
    of its own length, which grows by half after a step that lowers its objective and shrinks to
    0.3 of itself (the step refused) after one that does not. All starts' objectives are one sparse
    product (:meth:`MarginalsProblem.objectives`).
    """
    V = np.sqrt(np.column_stack(starts))
    V /= np.linalg.norm(V, axis=0)
    theta = V * V
    values, grads = problem.objectives(theta, norm)
    grads = 2.0 * V * grads
    step = np.full(V.shape[1], 0.1)
    for _ in range(SCREEN_ITER):
        trial = V - step * grads / (np.linalg.norm(grads, axis=0) + np.finfo(float).tiny)
        trial_values, trial_grads = problem.objectives(trial * trial, norm)
        better = trial_values < values
        V[:, better], values[better] = trial[:, better], trial_values[better]
        grads[:, better] = 2.0 * trial[:, better] * trial_grads[:, better]
        step = np.where(better, 1.5 * step, 0.3 * step)
    fixed = [0, 1, len(starts) - 1]
    rest = [j for j in np.argsort(values, kind="stable") if j not in fixed]
    return [V[:, j] ** 2 for j in fixed + rest[:SCREEN_KEEP - len(fixed)]]


def optimize_marginal_weights(problem: MarginalsProblem, privacy: Privacy, restarts: int | None,
                              rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """Minimise the OPT_M objective over ``theta >= 0``; returns ``(theta, objective)``.

    Starts: every candidate weighted equally, (nearly) the full data cube only, then uniform
    random weights, ``restarts`` in all (default ``STARTS``), or ``MIN_STARTS`` for a cheap
    problem; and always (nearly) the full data cube with the workload's own marginals and their
    sub-marginals. With more than ``SCREEN_KEEP`` starts, all of them first take ``SCREEN_ITER``
    steps of a batched gradient descent (:func:`_screen`), and only the three deterministic ones and
    the best of the rest, ``SCREEN_KEEP`` in all, go on. These race by successive halving: all run
    ``RUNG_ITER`` L-BFGS-B iterations, the best ``1 / RUNG_KEEP`` of them run on ``RUNG_GROWTH``
    times as many, and so on until one is left, which runs to convergence. A start far behind
    after a few iterations rarely wins, so most of them cost a few iterations instead of a full
    search.
    """
    k = problem.members.shape[0]
    restarts = STARTS if restarts is None else restarts
    starts = max(restarts, MIN_STARTS) if problem.Z.nnz <= CHEAP_NNZ else max(1, restarts)
    full = np.full(k, 1e-4)
    full[np.argmax(problem.members.sum(axis=1))] = 1.0
    candidates = ([np.ones(k), full] + [rng.random(k) for _ in range(starts - 2)])[:starts]
    candidates.append(np.where(problem.tau > 0, 1.0, full))
    if len(candidates) > SCREEN_KEEP:
        candidates = _screen(problem, privacy.norm, candidates)
    best, _ = successive_halving(candidates, lambda theta0, k: _descend(problem, privacy, theta0, k),
                                 RUNG_ITER, RUNG_KEEP, RUNG_GROWTH)
    return _descend(problem, privacy, best)


def opt_marginals_strategy(W: Matrix, privacy: Privacy, restarts: int | None, rng: np.random.Generator,
                           union: KronUnion | None = None) -> tuple[Marginals, float]:
    """OPT_M for workload ``W``: the weighted-marginals strategy and its unit-noise error.

    The strategy has sensitivity 1 in the norm of ``privacy``; ``union`` is ``kron_union(W)``
    when the caller has it already.
    """
    union = kron_union(W) if union is None else union
    norm = privacy.norm
    problem = MarginalsProblem(union)
    theta, value = optimize_marginal_weights(problem, privacy, restarts, rng)
    if norm == 1 and problem.members.shape[0] > problem.closure.shape[0] + 1:
        # Laplace's local optima: also solve on the closure and the cube alone (the candidates
        # beyond ALL_SUBSETS_MAX_DIM attributes), then search all candidates from there
        small = MarginalsProblem(union, _closure_and_cube(problem.closure))
        small_theta = optimize_marginal_weights(small, privacy, restarts, rng)[0]
        warm, warm_value = _descend(problem, privacy, problem.embed(small, small_theta))
        if warm_value < value:
            theta, value = warm, warm_value
    # drop negligible marginals (they only make the strategy ill-conditioned) if the error holds
    keep = theta > 1e-4 * theta.max()
    pruned = np.where(keep, theta, 0.0)
    pruned /= pruned.sum() if norm == 1 else np.sqrt(pruned @ pruned)
    pruned_value, _ = problem.objective(pruned, norm)
    if pruned_value <= value * (1 + 1e-6):
        theta, value = pruned, pruned_value
    else:
        keep[:] = True
    strategy = Marginals.from_members(workload_domain(W, union.sizes), problem.members[keep], theta[keep])
    return strategy, value


def residual_strategy(W: Matrix, union: KronUnion | None = None) -> tuple[Residuals, float]:
    r"""The optimal residual strategy under Gaussian noise and its unit-noise error.

    :math:`\lambda_T \propto \sqrt{\tau_T / \mathrm{tr}(E_T)}` on the workload's subsets,
    scaled to L2 sensitivity 1; the error is :math:`(\sum_T \sqrt{\tau_T\,\mathrm{tr}(E_T)})^2`.
    ``union`` is ``kron_union(W)`` when the caller has it already.
    """
    union = kron_union(W) if union is None else union
    spectrum = trace_spectrum(union)
    trace_E = spectrum.trace_E
    live = (spectrum.tau > 0) & (trace_E > 0)
    members, tau, trace_E = spectrum.members[live], spectrum.tau[live], trace_E[live]
    lam_normalised = np.sqrt(tau / trace_E)
    lam_normalised /= float(lam_normalised @ trace_E)  # sum_T lambda'_T tr(E_T) = 1: D_2 = 1
    N = float(np.prod(np.array(union.sizes, dtype=float)))
    strategy = Residuals.from_members(workload_domain(W, union.sizes), members, np.sqrt(lam_normalised * N))
    return strategy, spectrum.residual_error
