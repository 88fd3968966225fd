r"""The private kernel: the one place where data is touched and noise is drawn for a release.

:func:`measure` takes a :class:`~hdmm.planning.Plan` (made without the data) and a data vector
:math:`x` and returns :math:`y = s\,(\operatorname{round}(Ax/s) + Z)` on the plan's grid of
spacing :math:`s` (a power of two), with :math:`\operatorname{round}(Ax/s)` computed exactly for
the integer counts (:mod:`hdmm.exact`: the plan's strategy is dyadic, the product error-free), and
:math:`Z` i.i.d. integer noise drawn exactly by :mod:`hdmm.noise`, calibrated by the plan's
privacy definition to the strategy's sensitivity plus the grid's rounding bound (computed when the plan was made): discrete Laplace of scale
:math:`b = \Delta_1/\epsilon` for pure DP, discrete Gaussian for approximate DP and zCDP
(docs/math.md, section 1; docs/privacy.md). The random bits come from the operating system's
cryptographic generator unless a seed is given. Given a :class:`~hdmm.Budget`, it charges the
budget (and writes a budget file) after the data is checked and before any noise is drawn, and
refuses a measurement the budget cannot pay for. Everything before it (the plan) and after it
(reconstruction, answers, post-processing) is data independent or post-processing of
:math:`y`, which costs no privacy.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import InitVar, dataclass

import numpy as np

from .budget import Budget
from .matrix import Matrix
from .mechanism import Measurement
from .exact import exact_centres, exact_centres_many, on_grid_exact
from .noise import draw, random_bits
from .planning import Plan, check_calibration, strategy_plan
from .privacy import Privacy
from .threads import one_blas_thread

__all__ = ["measure", "measure_many", "Counts", "as_generator", "check_data_vector", "MAX_COUNT"]

#: Largest count a data vector may hold (1e15, below 2**53 ~ 9.0e15 where doubles stop
#: holding every whole number): larger counts are refused before any noise is drawn, as are
#: data whose strategy answers ``A @ x`` overflow.
MAX_COUNT = 1e15


@dataclass(frozen=True, eq=False)
class Counts:
    """A data vector checked once (:func:`check_data_vector`): ``N`` finite, non-negative counts.

    :func:`hdmm.run` checks the data before it plans (so that bad data is refused before any
    optimization), and hands the checked counts to :func:`measure`, which then need not scan
    them again. Make one with :meth:`check`; it refers to the checked array (no copy), which
    must not change until it is measured. Built directly, ``Counts(x)`` checks ``x`` too (as
    ``len(x)`` counts; ``Counts(x, n)`` as ``n``), so no unchecked data reaches the kernel.
    """

    values: np.ndarray
    n: InitVar[int | None] = None

    def __post_init__(self, n: int | None) -> None:  # the one scan of the data
        object.__setattr__(self, "values", check_data_vector(self.values, np.size(self.values) if n is None else n))

    @classmethod
    def check(cls, x, n: int) -> Counts:
        """Check ``x`` as ``n`` counts."""
        return cls(x, n)


@one_blas_thread
def measure(plan: Plan | Matrix, x, *args, rng: None | int | np.random.Generator = None, budget: Budget | None = None,
            label: str | None = None) -> Measurement:
    r"""Answer the plan's strategy queries on data ``x`` with calibrated noise: :math:`y = Ax + z`.

    Called as ``measure(plan, x, rng=None, budget=None, label=None)``.

    Parameters
    ----------
    plan
        A :class:`~hdmm.planning.Plan` from :func:`hdmm.plan` (or loaded from a file). Its strategy,
        privacy definition and sensitivity set the noise; nothing is decided here.
    x
        The data vector: ``N`` finite, non-negative counts of at most ``MAX_COUNT`` (C order
        over the domain), or :class:`Counts` checked already.
    rng
        ``None`` (default) draws the noise from the operating system's cryptographic generator
        (``os.urandom``), as a real release must. An int seed or a ``numpy.random.Generator``
        makes the noise reproducible: for tests and reproducible research only, since anyone who
        knows the seed can regenerate the noise and subtract it.
    budget
        A :class:`~hdmm.Budget` to charge the plan's privacy to (:meth:`hdmm.Budget.charge`):
        charged once the data is checked and before any noise is drawn (a budget kept in a file
        writes it first), and a measurement the budget cannot pay for is refused with
        :class:`~hdmm.budget.BudgetExceeded` without drawing anything. The charge is recorded
        in the measurement (:attr:`Measurement.charge`). If anything fails after the charge (a
        crash, an interrupt, an unexpected error), the charge stays: a budget over-counts, never
        under-counts.
    label
        What the budget records as the release's workload (default: the plan's workload).

    Returns
    -------
    Measurement

    Notes
    -----
    The earlier form ``measure(A, x, privacy, rng=None)`` with a strategy matrix still works:
    it makes the strategy-only plan :func:`hdmm.planning.strategy_plan` first.

    Raises
    ------
    TypeError
        If ``plan`` is neither a plan nor a strategy matrix with a privacy definition.
    ValueError
        If ``x`` is not a 1-D vector of ``N`` finite, non-negative counts of at most
        ``MAX_COUNT``, or the strategy's answers on it overflow (checked before any noise).
    hdmm.budget.BudgetError
        If ``budget`` cannot pay for the measurement (:class:`~hdmm.budget.BudgetExceeded`) or
        the plan's privacy does not compose with it (checked before any noise).

    Examples
    --------
    >>> import hdmm
    >>> budget = hdmm.Budget(hdmm.PureDP(1.5))
    >>> p = hdmm.plan(hdmm.Prefix(4), hdmm.Identity(4), hdmm.PureDP(1.0))
    >>> hdmm.measure(p, [3, 1, 4, 1], budget=budget, label="prefix").charge.cost
    1.0
    >>> hdmm.measure(p, [3, 1, 4, 1], budget=budget)
    Traceback (most recent call last):
    ...
    hdmm.budget.BudgetExceeded: the privacy budget cannot pay for this release: it costs epsilon = 1 (pure DP, epsilon=1), but 0.5 of the total epsilon = 1.5 is left after 1 charge(s); nothing was measured
    """
    if isinstance(plan, Matrix):  # the earlier form measure(A, x, privacy, rng=None)
        privacy = args[0] if args else None
        if not isinstance(privacy, Privacy):
            raise TypeError(
                "measure(A, x, privacy, rng) needs a privacy definition (PureDP, ApproxDP or ZCDP) as its third "
                f"argument, got {type(privacy).__name__}; or make a plan with hdmm.plan and call measure(plan, x, rng)"
            )
        if len(args) > 2 or (len(args) == 2 and rng is not None):
            raise TypeError("measure(A, x, privacy, rng) takes at most four arguments")
        plan, rng = strategy_plan(plan, privacy), (args[1] if len(args) == 2 else rng)
    elif args:
        if len(args) > 1 or rng is not None:
            raise TypeError("measure(plan, x, rng) takes three arguments")
        rng = args[0]
    if not isinstance(plan, Plan):
        raise TypeError(f"measure needs a Plan (from hdmm.plan) or an hdmm matrix strategy and a privacy definition, got {type(plan).__name__}")
    A = plan.strategy
    x = x.values if isinstance(x, Counts) and x.values.shape == (A.shape[1],) else check_data_vector(x, A.shape[1])
    source = random_bits(rng)
    if not plan.spacing > 0:
        raise ValueError("the plan has no noise grid (spacing 0): make it with hdmm.plan or hdmm.planning.strategy_plan")
    check_calibration(plan)
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be an hdmm.Budget, got {type(budget).__name__}")
    if x.sum() == 0:
        warnings.warn("the data vector is all zeros (no records): the release is pure noise", stacklevel=2)
    centres = exact_centres(A, x, plan.spacing)  # round(A x / s), exactly (hdmm.exact); refused before any charge
    charge = None
    if budget is not None:  # the last step before the noise: refused here, nothing is drawn
        charge = budget.charge(plan.privacy, repr(plan.workload) if label is None else label)
    if plan.noise_scale > 0:
        steps = draw(plan.privacy.noise, plan.noise_scale / plan.spacing, A.shape[0], source)
    else:  # a zero strategy (sensitivity 0): its answers are 0 for every data vector
        steps = np.zeros(A.shape[0], dtype=np.int64)
    noisy = on_grid_exact(centres, plan.spacing, steps)
    return Measurement(A, noisy, plan.privacy, plan.sensitivity, plan.noise_scale, plan.spacing, charge,
                       seeded=not source.secure)


def measure_many(plan: Plan, X, rngs) -> list[Measurement]:
    r""":func:`measure` of every row of ``X`` (``k x N`` counts), row ``i`` with the noise of ``rngs[i]``.

    The same checks, exact answers and noise as ``k`` calls of :func:`measure` with those ``rng``
    (``None``: the operating system's cryptographic generator), but the exact answers of all rows
    are computed at once (:func:`hdmm.exact.exact_centres_many`): many small units (the blocks of a
    geography release) cost about one product each. It charges no budget (the caller charges the
    release once) and does not warn of empty rows (which units are empty is private).
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"measure_many needs a Plan (from hdmm.plan), got {type(plan).__name__}")
    A = plan.strategy
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != A.shape[1] or len(rngs) != X.shape[0]:
        raise ValueError(f"measure_many needs k x {A.shape[1]} counts and k noise sources, got {X.shape} and "
                         f"{len(rngs)}")
    rows = np.vstack([check_data_vector(x, A.shape[1]) for x in X]) if len(X) else X
    sources = [random_bits(rng) for rng in rngs]
    if not plan.spacing > 0:
        raise ValueError("the plan has no noise grid (spacing 0): make it with hdmm.plan or "
                         "hdmm.planning.strategy_plan")
    check_calibration(plan)
    centres = exact_centres_many(A, rows, plan.spacing)  # refused before any noise
    out = []
    for c, source in zip(centres, sources):
        if plan.noise_scale > 0:
            steps = draw(plan.privacy.noise, plan.noise_scale / plan.spacing, A.shape[0], source)
        else:
            steps = np.zeros(A.shape[0], dtype=np.int64)
        out.append(Measurement(A, on_grid_exact(c, plan.spacing, steps), plan.privacy, plan.sensitivity,
                               plan.noise_scale, plan.spacing, None, seeded=not source.secure))
    return out


def as_generator(rng: None | int | np.random.Generator) -> np.random.Generator:
    """A numpy Generator for the data-independent randomness of a release (the optimizer's starts).

    ``None`` gives one seeded from fresh OS entropy, else the seeded or given generator. Noise is
    not drawn from it when ``rng`` is ``None``: :func:`measure` then uses the operating system's
    cryptographic generator.
    """
    if rng is None:
        return np.random.default_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)):
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be None (fresh OS entropy, for real releases), an int seed or a "
        f"numpy.random.Generator, got {type(rng).__name__}"
    )


def check_data_vector(x, n: int) -> np.ndarray:
    """``x`` as a float vector of ``n`` finite, non-negative counts of at most ``MAX_COUNT``, or a ``ValueError`` saying why not."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"the data vector must be numeric counts, got {type(x).__name__} that numpy cannot read as "
            f"float ({exc}); pass a numpy array, or a DataFrame of records together with domain=..."
        ) from None
    if arr.ndim != 1:
        raise ValueError(
            f"the data vector must be 1-D (one count per domain cell), got shape {arr.shape}; flatten "
            "a data cube with x.ravel() (C order: first attribute most significant)"
        )
    if arr.size != n:
        raise ValueError(
            f"the data vector has {arr.size:,} entries but the domain has {n:,} cells; build it over "
            "the same domain as the workload and strategy (Domain.vectorize does this for records)"
        )
    bad = ~np.isfinite(arr)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"the data vector holds {int(bad.sum()):,} NaN or infinite entries (the first at index {i}); "
            "counts must be finite: fill or drop the missing cells first"
        )
    negative = arr < 0
    if negative.any():
        i = int(np.flatnonzero(negative)[0])
        raise ValueError(
            f"the data vector holds {int(negative.sum()):,} negative entries (e.g. {arr[i]:g} at index {i}); "
            "it must hold the true, non-negative record counts (not a noisy estimate)"
        )
    large = arr > MAX_COUNT
    if large.any():
        i = int(np.flatnonzero(large)[0])
        raise ValueError(
            f"the data vector holds {int(large.sum()):,} counts above hdmm.kernel.MAX_COUNT = {MAX_COUNT:g} (e.g. "
            f"{arr[i]:g} at index {i}), beyond what floating point holds exactly; counts of records cannot be this "
            "large: check the data (a weight or an identifier in the count column?)"
        )
    return arr
