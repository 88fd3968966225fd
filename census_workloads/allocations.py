r"""Production's allocation of the 2020 PL94 budget against hdmm's, side by side, at the same rho.

:func:`compare_allocations` takes a geography (any top part of nation, state, county, tract,
block_group, block) and reports, per level, the expected error of the PL94-171 person tables
(:func:`~census_workloads.pl94_2020.pl94_2020`, 298 queries per unit) under

* **production**: the 2020 per-level strategies and shares (:data:`~census_workloads.das2020.PL94_2020`),
  each level estimated from its own measurements by least squares: the error of production's
  noisy measurements themselves, before its top-down post-processing (which adds the upper
  levels' information through the parent constraint, and the bias of non-negativity);
* **hdmm, production's level shares**: hdmm's person strategy for the tables (one for every
  level) with production's level shares :math:`g_l`, estimated by least squares over the whole
  tree (:func:`hdmm.georelease.geo_plan`);
* **hdmm**: hdmm's person strategy with level weights optimized for the level-weighted error.

**The same rho.** Production counts *bounded* neighbours (one person's record changed, its
geography included). A changed record moves a strategy's answers by :math:`a_i - a_j` in every
level at which the person stays in its unit, and by :math:`a_i` and :math:`-a_j` in two units
where it moves, so the squared bounded sensitivity of the tree strategy is

.. math:: \Delta_b^2 = \Big(\sum_l w_l^2\Big) \max\Big(\max_{i \ne j} G_{ii} + G_{jj} - 2G_{ij},\;
          2\max_i G_{ii}\Big), \qquad G = A_p^TA_p,

against :math:`\Delta_2^2 = (\sum_l w_l^2)\max_i G_{ii}` for hdmm's add/remove neighbours. A
strategy that is :math:`\rho'`-zCDP for add/remove neighbours is thus :math:`\rho'\beta`-zCDP for
bounded ones, :math:`\beta = \Delta_b^2/\Delta_2^2 \in [2, 4]` (:func:`bounded_factor`): 2 for
production's stacks of partitions (so production's :math:`\rho` is hdmm's ``ZCDP(rho / 2)``),
more for residual strategies, whose Helmert factors have negative Gram entries. hdmm is
compared at ``ZCDP(rho / beta)``: the same bounded guarantee as production's.

**Level-weighted error.** Every level's mean squared error per query counts the same (the
default level weights of :func:`~hdmm.georelease.geo_plan`, :math:`1/\sqrt{\text{units}}`);
the summary row gives the root of their mean.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
from hdmm.georelease import geo_plan
from hdmm.matrix import Matrix, VStack, Weighted
from hdmm.planning import plan
from hdmm.privacy import ZCDP

from .das2020 import PL94_2020, ProductionConfig
from .pl94_2020 import das_query, pl94_2020

__all__ = ["bounded_factor", "compare_allocations", "total_first"]

#: Largest person domain whose strategy Gram is formed densely for :func:`bounded_factor`.
MAX_DENSE_CELLS = 4096


def bounded_factor(strategy: Matrix) -> float:
    r""":math:`\beta`: the squared sensitivity for bounded neighbours over that for add/remove ones (module docstring).

    >>> from census_workloads.das2020 import PL94_2020
    >>> round(bounded_factor(PL94_2020.strategy("county")), 12)
    2.0
    """
    n = strategy.shape[1]
    if n > MAX_DENSE_CELLS:
        raise ValueError(f"bounded_factor forms the {n:,} x {n:,} Gram densely; at most {MAX_DENSE_CELLS:,} cells")
    G = np.asarray(strategy.gram().dense(), dtype=float)
    d = np.diag(G)
    changed = d[:, None] + d[None, :] - 2.0 * G
    np.fill_diagonal(changed, 0.0)
    return float(max(changed.max(), 2.0 * d.max()) / d.max())


def _total_row(W: Matrix) -> int:
    labels = [str(x) for x in W.labels]
    return next(i for i, label in enumerate(labels) if label.lower().endswith("p1: total"))


def total_first(workload: Matrix, weight: float) -> Matrix:
    """``workload`` under a row of total population weighted ``weight``: it steers an optimizer toward the
    total (as production's shares do), and is not released (answer ``workload`` with the strategy found)."""
    return VStack([Weighted(das_query("total"), float(weight)), workload])


def compare_allocations(tree, config: ProductionConfig = PL94_2020, *, workload: Matrix | None = None,
                        steer: Matrix | None = None, seed: int = 0) -> pd.DataFrame:
    """Expected error per level of production's allocation and of hdmm's, at the same (bounded) rho.

    Parameters
    ----------
    tree
        A :class:`~hdmm.geography.GeographyTree` whose levels are a top part of ``config``'s
        (``nation``, ``state``, ...). With fewer levels than production's six, production's
        budget is that of those levels, :math:`\\rho\\sum_{l} g_l`, shares renormalized.
    config
        The production configuration (default the 2020 PL94 persons).
    workload
        The person workload whose error is reported (default :func:`~census_workloads.pl94_2020.pl94_2020`).
    steer
        The workload hdmm's person strategy is optimized for (default ``workload``), e.g.
        :func:`total_first` to weigh total population as production does.
    seed
        For hdmm's strategy optimization.

    Returns
    -------
    pandas.DataFrame
        One row per level (and a last row ``"level-weighted"``): units, and for each allocation
        the expected RMSE per query and the standard deviation of a unit's total population,
        with the ratio of hdmm's RMSE to production's. ``attrs["privacy"]`` states the rho used.
    """
    W = pl94_2020() if workload is None else workload
    levels = list(tree.levels)
    if levels != list(config.level_names[: len(levels)]):
        raise ValueError(f"the tree's levels {levels} must be a top part of {list(config.level_names)}")
    shares = {name: config.level(name).share for name in levels}
    rho = config.rho * sum(shares.values())
    total = _total_row(W)
    rows = {name: {"level": name, "units": tree.sizes[d]} for d, name in enumerate(levels)}
    for name in levels:  # production: each level from its own measurements
        own = plan(W, config.strategy(name), ZCDP(rho * shares[name] / sum(shares.values()) / 2))
        rows[name]["production RMSE"] = own.rmse
        rows[name]["production total sd"] = float(np.sqrt(own.variances[total]))
    weights = {name: math.sqrt(shares[name] / sum(shares.values())) for name in levels}
    person = plan(W if steer is None else steer, "auto", ZCDP(rho / 2), seed=seed).strategy
    first = geo_plan(tree, W, ZCDP(rho / 2), strategy=person, level_weights=weights)
    beta = Fraction(bounded_factor(person)).limit_denominator(10**6)
    privacy = ZCDP(rho / beta)
    columns = {}
    for label, level_weights in (("hdmm, production shares", weights), ("hdmm", "auto")):
        p = geo_plan(tree, W, privacy, strategy=person, level_weights=level_weights)
        for d, name in enumerate(levels):
            mean_unit = float(np.mean(p.unit_variances(d)))
            rows[name][f"{label} RMSE"] = p.expected_rmse(d)
            rows[name][f"{label} total sd"] = float(np.sqrt(p.noise_variance * mean_unit * p.query_variances[total]))
        columns[label] = p
    out = pd.DataFrame(list(rows.values()))
    summary = {"level": "level-weighted", "units": int(out["units"].sum())}
    for key in ("production", "hdmm, production shares", "hdmm"):
        summary[f"{key} RMSE"] = float(np.sqrt(np.mean(out[f"{key} RMSE"] ** 2)))
    out = pd.concat([out, pd.DataFrame([summary])], ignore_index=True)
    out["hdmm / production"] = out["hdmm RMSE"] / out["production RMSE"]
    out.attrs["privacy"] = (f"production: rho = {rho} (bounded neighbours); hdmm: ZCDP({privacy.rho}) for add/remove "
                            f"neighbours, the same rho for bounded ones (bounded factor {float(beta):.4g})")
    out.attrs["strategy"] = repr(first.person.strategy)
    return out
