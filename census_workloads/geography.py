"""A SYNTHETIC United States geography (states, counties, tracts) and SYNTHETIC people placed in it.

.. warning::

   Only the state populations and the number of counties per state are facts. County
   populations and tracts are **made up** (seeded random draws, see below): the geography has
   the shape of the 2010 United States (51 states with DC, 3,143 counties, about 72,500 tracts)
   for demos, tests and benchmarks, not its real counties or tracts.

Facts (2010 Census):

* county equivalents per state, 3,143 in all (``data/counties_2010.csv``; Virginia's 134
  include its independent cities, Alaska's 29 are boroughs and census areas, DC is one);
* state populations (:data:`census_workloads.synthetic.STATE_POPULATION_2010`, 308.7 million).

Synthetic, approximate: each state's population is split among its counties by log-normal
shares (``sigma = 1.4``, so a few counties hold most people, as in the real country); each
county gets ``round(population / 4,258)`` tracts, at least one (tracts were designed for about
4,000 people; 4,258 makes about 72,500 tracts in all, the 2010 count). Codes are FIPS-like
(state ``"06"``, county ``"001"``, ``"003"``, ..., tract ``"000100"``, ...), so a unit's code is
the concatenation (``"06001000100"``).

>>> table = us_geography()
>>> len(table), table["state"].nunique(), table.groupby(["state", "county"]).ngroups
(72665, 51, 3143)
>>> int(table["population"].sum())
308745538
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

from .schema import STATES, cph_domain
from .synthetic import STATE_POPULATION_2010, cell_probabilities, synthetic_persons

__all__ = ["us_geography", "us_tree", "synthetic_persons_in", "SyntheticHistograms", "PEOPLE_PER_TRACT"]

#: People per synthetic tract (308.7 million / about 72,500 tracts).
PEOPLE_PER_TRACT = 4258

_COUNTY_SIGMA = 1.4
_LEVELS = ("state", "county", "tract")


def _counties_per_state() -> dict[str, int]:
    text = resources.files("census_workloads").joinpath("data/counties_2010.csv").read_text()
    rows = [line.split(",") for line in text.strip().splitlines()[1:]]
    return {abbr: int(n) for abbr, n in rows}


@lru_cache(maxsize=4)
def _geography(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    counties = list(_counties_per_state().values())  # same order as STATES (FIPS)
    rows = []
    for (fips, name), n_counties, people in zip(STATES, counties, STATE_POPULATION_2010.tolist()):
        shares = rng.lognormal(0.0, _COUNTY_SIGMA, n_counties)
        county_people = _split(people, shares / shares.sum())
        for c, cp in enumerate(county_people.tolist()):
            tracts = max(1, round(cp / PEOPLE_PER_TRACT))
            tract_people = _split(cp, np.full(tracts, 1.0 / tracts))
            for t, tp in enumerate(tract_people.tolist()):
                rows.append((fips, name, f"{2 * c + 1:03d}", f"{(t + 1) * 100:06d}", tp))
    return pd.DataFrame(rows, columns=["state", "state_name", "county", "tract", "population"])


def _split(total: int, shares: np.ndarray) -> np.ndarray:
    """Whole numbers in proportion to ``shares`` that add up to ``total`` (largest remainders)."""
    exact = total * shares
    out = np.floor(exact).astype(np.int64)
    out[np.argsort(out - exact)[: total - int(out.sum())]] += 1
    return out


def us_geography(levels: tuple[str, ...] = _LEVELS, seed: int = 2010, states: tuple[str, ...] | None = None
                 ) -> pd.DataFrame:
    """The synthetic geography as a table: one row per finest unit, with its (synthetic) population.

    Parameters
    ----------
    levels
        ``("state",)``, ``("state", "county")`` or ``("state", "county", "tract")`` (default).
    seed
        Seed of the synthetic county populations and tracts (the default is the published one).
    states
        Only these states (FIPS codes, e.g. ``("06",)`` for California); default all.
    """
    levels = tuple(levels)
    if levels not in (_LEVELS[:1], _LEVELS[:2], _LEVELS):
        raise ValueError(f"levels must be a prefix of {list(_LEVELS)}, got {list(levels)}")
    table = _geography(int(seed))
    if states is not None:
        unknown = sorted(set(states) - set(table["state"]))
        if unknown:
            raise ValueError(f"unknown state codes {unknown}: use FIPS codes such as '06'")
        table = table[table["state"].isin(states)]
    keep = ["state", "state_name", *levels[1:]]
    return table.groupby(keep, sort=True, as_index=False)["population"].sum()


def us_tree(levels: tuple[str, ...] = _LEVELS, seed: int = 2010, states: tuple[str, ...] | None = None):
    """The synthetic geography as a :class:`hdmm.geography.GeographyTree` (root ``nation``, code ``"US"``)."""
    from hdmm.geography import GeographyTree

    return GeographyTree.from_table(us_geography(levels, seed, states), list(levels), root_code="US",
                                    root_name="United States", names={"state": "state_name"})


def synthetic_persons_in(n: int, levels: tuple[str, ...] = _LEVELS, seed: int | None = None,
                         geography_seed: int = 2010) -> pd.DataFrame:
    """``n`` SYNTHETIC persons (:func:`synthetic_persons`) placed in the synthetic geography.

    Each person's unit is drawn in proportion to the units' populations, independently of the
    person attributes; the rows come sorted by unit. Columns: the person attributes and the
    geography ``levels`` (codes as text).

    >>> people = synthetic_persons_in(1000, levels=("state", "county"), seed=0)
    >>> list(people.columns)
    ['sex', 'hispanic', 'race', 'relationship', 'age', 'state', 'county']
    """
    rng = np.random.default_rng(seed)
    persons = synthetic_persons(n, seed=rng)
    table = us_geography(levels, geography_seed)
    counts = rng.multinomial(n, table["population"].to_numpy() / table["population"].sum())
    units = np.repeat(np.arange(len(table)), counts)
    for level in levels:
        persons[level] = table[level].to_numpy()[units]
    return persons


@dataclass(frozen=True, eq=False)
class SyntheticHistograms:
    """Each tract's (or finest unit's) histogram over the CPH domain, drawn directly (no records).

    For benchmarks at scale: ``people`` synthetic persons are spread over the leaves of the
    geography (of ``states`` only, if given) in proportion to their populations, and each leaf's histogram is drawn from the
    model of :mod:`census_workloads.synthetic` when asked for, from a stream seeded by ``seed``
    and the leaf, so any engine and any order of work sees the same data. A
    :class:`hdmm.georelease.units.HistogramSource`.
    """

    people: int
    levels: tuple[str, ...] = _LEVELS
    seed: int = 0
    geography_seed: int = 2010
    states: tuple[str, ...] | None = None
    _totals: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        table = us_geography(self.levels, self.geography_seed, self.states)
        rng = np.random.default_rng([self.seed, 0])
        shares = table["population"].to_numpy() / table["population"].sum()
        object.__setattr__(self, "_totals", rng.multinomial(self.people, shares).astype(float))

    def leaf_totals(self) -> np.ndarray:
        return self._totals

    def histograms(self, lo: int, hi: int):
        import scipy.sparse as sp

        cumulative = _cumulative()
        rows, cols = [], []
        for leaf in range(lo, hi):
            n = int(self._totals[leaf])
            draws = np.searchsorted(cumulative, np.random.default_rng([self.seed, 1, leaf]).random(n), side="right")
            rows.append(np.full(n, leaf - lo))
            cols.append(np.minimum(draws, cumulative.size - 1))
        rows, cols = np.concatenate(rows), np.concatenate(cols)
        H = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(hi - lo, cph_domain().size))
        H.sum_duplicates()
        return H


@lru_cache(maxsize=1)
def _cumulative() -> np.ndarray:
    c = np.cumsum(cell_probabilities().ravel())
    return c / c[-1]
