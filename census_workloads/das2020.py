r"""The 2020 Census production settings for the PL94-171 persons, as a named configuration.

:data:`PL94_2020` (also :func:`production_pl94`) holds the budget of the Census Bureau's 2020
redistricting run for persons in the United States, read from its public production code (files
and commit in ``census_workloads/data/das2020_pl94.md``; the tests check every number):

* total :math:`\rho = (542/339)^2 = 293764/114921 \approx 2.5562` (``global_scale = 339/542``),
  held as an exact :class:`fractions.Fraction`;
* six levels, US, State, County, Tract, Block_Group, Block (hdmm's ``nation``, ``state``,
  ``county``, ``tract``, ``block_group``, ``block``), with shares :math:`g_l` of :math:`\rho`
  out of 4099: 104, 1440, 447, 687, 1256, 165;
* per level, the queries of :data:`~census_workloads.pl94_2020.DAS_QUERIES` (US without
  ``total``) with shares :math:`s_{lq}` summing to 1 (strategy class
  ``ProductionCandidate20210527US_mult8_add02_dsepJune3``).

The noise, in production's terms and in hdmm's
-----------------------------------------------
Production measures query :math:`q` (a 0/1 partition of the 2,016 cells, :func:`das_query`) of
every unit of level :math:`l` with exact discrete Gaussian noise of parameter

.. math:: \sigma_{lq}^2 = 1/\rho_{lq}, \qquad \rho_{lq} = \rho\, g_l\, s_{lq}

(``inverse_scale`` in its engine). It counts privacy for **bounded** neighbours (one person's
record changed): a changed record leaves one cell and enters another, so a partition query's
answers move by :math:`e_i - e_j`, L2 sensitivity :math:`\sqrt 2`, and the query is
:math:`2/(2\sigma^2) = \rho_{lq}`-zCDP (Canonne, Kamath & Steinke 2020, Theorem 14). Units of a
level hold disjoint people; levels and queries compose: the run is :math:`\sum \rho_{lq} = \rho`-zCDP.

hdmm's :class:`~hdmm.ZCDP` counts **add/remove** neighbours (one person added or removed: one
cell moves by one; docs/privacy.md) and adds :math:`\sigma^2 = \Delta_2^2/(2\rho')`. The level's
strategy here (:meth:`ProductionConfig.strategy`) stacks the queries, each scaled by
:math:`\sqrt{s_{lq}}`:

.. math:: A_l = \begin{bmatrix} \sqrt{s_{l1}}\,Q_1 \\ \vdots \\ \sqrt{s_{lk}}\,Q_k \end{bmatrix},
          \qquad \Delta_2(A_l)^2 = \sum_q s_{lq} = 1

(each cell is in one row of every :math:`Q_q`). Measured under ``ZCDP(rho_l')``, every row gets
:math:`\sigma^2 = 1/(2\rho_l')`, so the answers of :math:`Q_q` (the rows divided by
:math:`\sqrt{s_{lq}}`) have variance :math:`1/(2\rho_l' s_{lq})`. This equals production's
:math:`1/(\rho g_l s_{lq})` exactly when

.. math:: \rho_l' = \rho\, g_l / 2, \qquad \sum_l \rho_l' = \rho/2 = 146882/114921

(:meth:`ProductionConfig.hdmm_rho`). Both numbers describe the same noise: a changed record
moves a strategy's answers by :math:`a_i - a_j` (two columns), and
:math:`\lVert a_i - a_j\rVert_2^2 = G_{ii} + G_{jj} - 2G_{ij} \le 2\Delta_2^2` when the Gram
matrix :math:`G = A^TA` has no negative entry (every strategy with non-negative entries:
marginals, p-Identity, these stacks), so a release that is :math:`\rho'`-zCDP for add/remove
neighbours is then :math:`2\rho'`-zCDP for bounded ones, with equality for stacks of 0/1
partitions (:math:`A(e_i - e_j)` has norm :math:`\sqrt 2\,\Delta_2` for a record that changes
every attribute and moves to another unit: the geography is part of a record). Production's :math:`\rho` in its accounting is thus hdmm's ``ZCDP(rho / 2)``,
and "the same rho" for comparing allocations means ``ZCDP(Fraction(146882, 114921))`` in hdmm,
for strategies with a non-negative Gram. A strategy whose Gram has negative entries (residuals
with Helmert factors: :math:`H^TH = I - J/n`) can move further under a change, up to
:math:`2\Delta_2` (:math:`4\rho'`); compare it only after computing
:math:`\max_{i \ne j} G_{ii} + G_{jj} - 2G_{ij}`. All six levels at once: level weights
:math:`w_l = \sqrt{g_l}` (:meth:`ProductionConfig.level_weights`, :math:`\sum w_l^2 = 1`) on the
tree strategy and ``ZCDP(rho / 2)`` (:meth:`ProductionConfig.hdmm_privacy`).

What differs: production's noise lies on the integers, hdmm's on its fine grid (spacing far below
:math:`\sigma`), and hdmm raises sensitivities by a relative :math:`10^{-9}`. The variances agree
to that margin: the discrete Gaussian's variance is below :math:`\sigma^2` by a relative
:math:`4 \times 10^{-9}` at production's smallest parameter (State ``total``,
:math:`\sigma^2 = 1.209`), and far less elsewhere.

Measurement sigma of total population
-------------------------------------
The ``total`` query of a unit has :math:`\sigma = 1/\sqrt{\rho\, g_l\, s_{l,\text{total}}}`
(:meth:`ProductionConfig.sigma`): with :math:`\rho = 2.5562`,

===========  ===========  =============  =============================  ======
level        :math:`g_l`  total's share  :math:`\rho_{l,\text{total}}`  sigma
===========  ===========  =============  =============================  ======
State        1440/4099    3773/4097      0.82700                        1.0996
County       447/4099     3126/4097      0.21269                        2.1683
Tract        687/4099     1567/4102      0.16366                        2.4719
Block_Group  1256/4099    1705/4099      0.32580                        1.7519
Block        165/4099     5/4097         0.00012558                     89.237
===========  ===========  =============  =============================  ======

(US measures no ``total``: the state totals are invariant.) The best unbiased estimate of a
unit's total from *all* its level's queries (generalized least squares over the 2,016 cells,
:meth:`ProductionConfig.combined_total_sigma`) is a little better: State 1.098, County 2.162,
Tract 2.452, Block_Group 1.745, Block 49.09, US 34.99.

>>> from census_workloads.das2020 import PL94_2020
>>> PL94_2020.rho, [round(PL94_2020.sigma(l, "total"), 2) for l in ("county", "tract", "block_group")]
(Fraction(293764, 114921), [2.17, 2.47, 1.75])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction as Fr
from functools import lru_cache

import numpy as np
import pandas as pd
from hdmm.geography import GeographyTree
from hdmm.georelease import GeoPlan, geo_plan
from hdmm.matrix import Matrix, VStack, Weighted
from hdmm.budget import zcdp_epsilon
from hdmm.privacy import ZCDP, Privacy

from .pl94_2020 import DAS_QUERIES, das_query, pl94_2020

__all__ = ["LevelAllocation", "ProductionConfig", "PL94_2020", "production_pl94", "SOURCE"]

#: Where the facts come from: repository and commit (file paths in data/das2020_pl94.md).
SOURCE = "uscensusbureau/DAS_2020_Redistricting_Production_Code@289ee463936a6f0efcf2e378abe410ec01d0e140"


@dataclass(frozen=True)
class LevelAllocation:
    """One level of a production run: its names, its share of rho and its queries' shares.

    Attributes
    ----------
    das_name : str
        The level's name in the DAS (``"Block_Group"``).
    level : str
        hdmm's name of the level (``"block_group"``).
    share : Fraction
        :math:`g_l`, the level's share of the total rho.
    queries : tuple of str
        The DAS query names measured at the level (:func:`~census_workloads.pl94_2020.das_query`).
    query_shares : tuple of Fraction
        :math:`s_{lq}`, each query's share of the level's rho, in the order of ``queries``.
    """

    das_name: str
    level: str
    share: Fr
    queries: tuple[str, ...]
    query_shares: tuple[Fr, ...]

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.query_shares) or sum(self.query_shares) != 1:
            raise ValueError(f"level {self.das_name}: one query share per query, adding up to 1 exactly")
        unknown = set(self.queries) - set(DAS_QUERIES)
        if unknown:
            raise ValueError(f"level {self.das_name}: unknown queries {sorted(unknown)}")


@dataclass(frozen=True)
class ProductionConfig:
    """A named production budget: total rho (exact), levels and their query shares (module docstring).

    Attributes
    ----------
    name : str
    rho : Fraction
        Total rho, counted for bounded neighbours as production does (hdmm's is half, :meth:`hdmm_rho`).
    delta : float
        The delta production states its (epsilon, delta) guarantee at.
    levels : tuple of LevelAllocation
        Top-down.
    source : str
        Repository and commit the facts were read from.
    """

    name: str
    rho: Fr
    delta: float
    levels: tuple[LevelAllocation, ...]
    source: str = SOURCE

    def __post_init__(self) -> None:
        if not isinstance(self.rho, Fr) or self.rho <= 0 or sum(a.share for a in self.levels) != 1:
            raise ValueError("rho must be a positive Fraction and the level shares must add up to 1 exactly")

    # ------------------------------------------------------------------ lookup
    def level(self, name: str) -> LevelAllocation:
        """The level named ``name``, in hdmm's spelling (``"block_group"``) or the DAS's (``"Block_Group"``)."""
        for a in self.levels:
            if name in (a.level, a.das_name):
                return a
        raise ValueError(f"unknown level {name!r}; the levels are {[a.level for a in self.levels]}")

    @property
    def level_names(self) -> tuple[str, ...]:
        """hdmm's level names, top-down."""
        return tuple(a.level for a in self.levels)

    # ------------------------------------------------------------------ production's accounting
    def level_rho(self, level: str) -> Fr:
        """:math:`\\rho g_l`, the level's rho in production's (bounded) accounting."""
        return self.rho * self.level(level).share

    def query_rho(self, level: str, query: str) -> Fr:
        """:math:`\\rho_{lq} = \\rho g_l s_{lq}` (bounded); 0 for a query the level does not measure."""
        a = self.level(level)
        if query not in DAS_QUERIES:
            raise ValueError(f"unknown DAS query {query!r}; the PL94 queries are {list(DAS_QUERIES)}")
        return self.level_rho(level) * dict(zip(a.queries, a.query_shares)).get(query, Fr(0))

    def variance(self, level: str, query: str) -> Fr:
        """:math:`\\sigma_{lq}^2 = 1/\\rho_{lq}`, the noise parameter of each answer of ``query`` at ``level``."""
        rho = self.query_rho(level, query)
        if rho == 0:
            raise ValueError(f"level {level!r} does not measure {query!r}")
        return 1 / rho

    def sigma(self, level: str, query: str = "total") -> float:
        """:math:`\\sigma_{lq}`, in persons, of each answer of ``query`` at ``level``."""
        return math.sqrt(self.variance(level, query))

    def combined_total_sigma(self, level: str) -> float:
        """Sigma of the best unbiased estimate of a unit's total from all the level's queries.

        The generalized least squares estimate from noisy answers :math:`Q_q x + z_q`,
        :math:`z_q \\sim \\sigma_{lq}^2 I`, has variance :math:`1^T P^{-1} 1` with precision
        :math:`P = \\sum_q \\rho_{lq} Q_q^T Q_q` (2,016 x 2,016, positive definite as ``detailed``
        is measured at every level).
        """
        a = self.level(level)
        return _combined_total_sigma(tuple(a.queries), tuple(float(self.query_rho(level, q)) for q in a.queries))

    def epsilon(self) -> float:
        """The run's :math:`(\\epsilon, \\delta)` statement at :attr:`delta`, for bounded neighbours (production's).

        :math:`\\rho`-zCDP implies :math:`(\\epsilon, \\delta)`-DP by Canonne, Kamath & Steinke (2020,
        Corollary 13), the conversion of the DAS's ``curve.py`` and of :func:`hdmm.budget.zcdp_epsilon`:
        17.14 at :math:`\\delta = 10^{-10}` for the PL94 persons.
        """
        return zcdp_epsilon(float(self.rho), self.delta)

    # ------------------------------------------------------------------ hdmm's terms
    def hdmm_rho(self, level: str | None = None) -> Fr:
        """hdmm's rho (add/remove neighbours) for production's noise: half of :meth:`level_rho` (or of the total)."""
        return (self.rho if level is None else self.level_rho(level)) / 2

    def hdmm_privacy(self, level: str | None = None) -> ZCDP:
        """``ZCDP(hdmm_rho(level))`` with the exact Fraction: one level measured alone, or the whole run."""
        return ZCDP(self.hdmm_rho(level))

    def level_weights(self) -> dict[str, float]:
        """:math:`w_l = \\sqrt{g_l}` by hdmm level name: the weights of the tree strategy (squares add up to 1)."""
        return {a.level: math.sqrt(a.share) for a in self.levels}

    def strategy(self, level: str) -> Matrix:
        """The level's production strategy over the 2,016 cells: the queries, query ``q`` scaled by :math:`\\sqrt{s_{lq}}`.

        Its L2 sensitivity (add/remove) is 1; under ``hdmm_privacy(level)`` each query's answers
        get production's noise variance (module docstring). The blocks are named by query.
        """
        a = self.level(level)
        return VStack([Weighted(das_query(q), math.sqrt(s)) for q, s in zip(a.queries, a.query_shares)],
                      names=list(a.queries))

    def check_levels(self, names: Sequence[str]) -> None:
        """Refuse (``ValueError``) levels that are not production's first levels in order, in hdmm's names.

        >>> PL94_2020.check_levels(["nation", "state", "county"])
        >>> PL94_2020.check_levels(["nation", "county"])
        Traceback (most recent call last):
        ...
        ValueError: the levels nation,county must be production's first levels in order: nation,state
        """
        names = list(names)
        known = list(self.level_names[:len(names)])
        if names != known:
            raise ValueError(f"the levels {','.join(names)} must be production's first levels in order: "
                             f"{','.join(known)}")

    def geo_plan(self, tree: GeographyTree, *, workload: Matrix | None = None, privacy: Privacy | None = None,
                 levels: Sequence[str] | None = None, invariants: Mapping[str, Mapping[object, float]] | None = None,
                 partition: str | None = None) -> GeoPlan:
        """Production's own mechanism on ``tree`` as an hdmm plan, to release and compare with hdmm's.

        Every level of ``tree`` (the first of production's levels, in hdmm's names) measures its
        production strategy (:meth:`strategy`) with level weight :math:`\\sqrt{g_l}`, under production's
        rho of those levels (``ZCDP`` of half of it: add/remove neighbours, module docstring). So every
        answer of query ``q`` at level ``l`` gets production's :math:`\\sigma_{lq}^2` when all six levels
        are released (and the same rho split over fewer). The plan has per-level strategies: it is
        estimated top down from each level's own measurements, as production is, and releases
        non-negative or integer tables (:mod:`hdmm.georelease.plan`). ``workload`` defaults to the
        PL94-171 tables (:func:`~census_workloads.pl94_2020.pl94_2020`); ``privacy`` replaces
        production's rho (production's shares at another budget); ``levels`` (released), ``invariants`` and
        ``partition`` as for :func:`hdmm.georelease.geo_plan` (production holds the state totals).
        """
        names = list(tree.levels)
        self.check_levels(names)
        shares = sum(self.level(name).share for name in names)
        return geo_plan(tree, pl94_2020() if workload is None else workload,
                        ZCDP(self.rho * shares / 2) if privacy is None else privacy, levels=levels,
                        strategy={name: self.strategy(name) for name in names},
                        level_weights={name: math.sqrt(self.level(name).share) for name in names},
                        invariants=invariants, partition=partition)

    def allocation(self) -> pd.DataFrame:
        """One row per level and query: shares, rho (production's and hdmm's) and sigma of each answer."""
        rows = []
        for a in self.levels:
            for q, s in zip(a.queries, a.query_shares):
                rho = self.query_rho(a.level, q)
                rows.append({"level": a.level, "das_level": a.das_name, "query": q, "level_share": a.share,
                             "query_share": s, "rho": rho, "hdmm_rho": rho / 2, "sigma": math.sqrt(1 / rho)})
        return pd.DataFrame(rows)


@lru_cache(maxsize=None)
def _combined_total_sigma(queries: tuple[str, ...], rhos: tuple[float, ...]) -> float:
    r""":math:`(1^T P^{-1} 1)^{1/2}`, solved on the three orbits of the queries' symmetries.

    Every query treats the values of votingage, hispanic and cenrace alike, and those of hhgq alike
    within each ``hhinstlevels`` group, so :math:`P` commutes with these permutations and
    :math:`P^{-1}1` is constant on their orbits, the three hhinstlevels groups: with :math:`B` the
    2,016 x 3 orbit indicator, :math:`P^{-1}1 = B c` where :math:`B^TPB\,c = B^T 1`.
    """
    B = das_query("hhinstlevels").dense().T  # cell -> its hhinstlevels group
    reduced = sum(rho * (das_query(q) @ B).T @ (das_query(q) @ B) for q, rho in zip(queries, rhos))
    c = np.linalg.solve(reduced, B.sum(axis=0))
    return math.sqrt(B.sum(axis=0) @ c)


def _shares(*fractions: tuple[int, int]) -> tuple[Fr, ...]:
    return tuple(Fr(p, q) for p, q in fractions)


_BELOW_US = DAS_QUERIES
_US = DAS_QUERIES[1:]

#: The 2020 PL94-171 person run for the United States (``person_US.ini``, ``person_default.ini``).
PL94_2020 = ProductionConfig(
    name="DAS 2020 PL94-171 persons, US (ProductionCandidate20210527US_mult8_add02_dsepJune3)",
    rho=Fr(542, 339) ** 2,
    delta=1e-10,
    levels=(
        LevelAllocation("US", "nation", Fr(104, 4099), _US, _shares(
            (52, 4097), (26, 4097), (26, 4097), (26, 4097), (26, 4097), (130, 4097), (130, 4097), (26, 4097),
            (26, 241), (189, 241))),
        LevelAllocation("State", "state", Fr(1440, 4099), _BELOW_US, _shares(
            (3773, 4097), (6, 4097), (6, 4097), (6, 4097), (6, 4097), (6, 4097), (12, 4097), (12, 4097), (6, 4097),
            (2, 241), (230, 4097))),
        LevelAllocation("County", "county", Fr(447, 4099), _BELOW_US, _shares(
            (3126, 4097), (10, 4097), (10, 4097), (10, 4097), (10, 4097), (10, 4097), (28, 4097), (28, 4097),
            (10, 4097), (101, 4097), (754, 4097))),
        LevelAllocation("Tract", "tract", Fr(687, 4099), _BELOW_US, _shares(
            (1567, 4102), (4, 2051), (5, 4102), (5, 4102), (5, 4102), (5, 4102), (1933, 4102), (10, 2051), (5, 4102),
            (67, 4102), (241, 2051))),
        LevelAllocation("Block_Group", "block_group", Fr(1256, 4099), _BELOW_US, _shares(
            (1705, 4099), (3, 4099), (3, 4099), (3, 4099), (3, 4099), (3, 4099), (1055, 4099), (9, 4099), (3, 4099),
            (24, 4099), (1288, 4099))),
        LevelAllocation("Block", "block", Fr(165, 4099), _BELOW_US, _shares(
            (5, 4097), (9, 4097), (5, 4097), (5, 4097), (5, 4097), (5, 4097), (21, 4097), (21, 4097), (5, 4097),
            (71, 4097), (3945, 4097))),
    ),
)


def production_pl94() -> ProductionConfig:
    """:data:`PL94_2020`, the 2020 production budget of the PL94-171 persons."""
    return PL94_2020
