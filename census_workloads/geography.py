"""A SYNTHETIC United States geography (state, county, tract, block group, block) and SYNTHETIC people in it.

.. warning::

   Only the state populations, the number of counties per state and the national numbers of
   tracts, block groups and blocks are facts. County, tract, block group and block
   populations, which county holds how many tracts, and so on down, are **made up** (seeded
   random draws and apportionments, see below): the geography has the shape of the United
   States for demos, tests and benchmarks, not its real counties, tracts or blocks.

Facts (50 states and DC):

* county equivalents per state, 3,143 in all (2010 Census, ``data/counties_2010.csv``;
  Virginia's 134 include its independent cities, Alaska's 29 are boroughs and census areas, DC
  is one; 2020 also had 3,143);
* state populations (2010 Census, :data:`census_workloads.synthetic.STATE_POPULATION_2010`,
  308,745,538 people);
* the 2020 Census numbers of tracts, block groups and blocks: :data:`TRACTS_2020` = 84,414,
  :data:`BLOCK_GROUPS_2020` = 239,780, :data:`BLOCKS_2020` = 8,132,968 (U.S. Census Bureau,
  2020 Census geographic entity tallies, 50 states and DC; 8,180,866 blocks with Puerto Rico
  and the Island Areas; the 2010 Census had 11,078,297 blocks).

Synthetic (every number below is a modelling choice, not a measurement):

* **counties**: each state's population is split among its counties by log-normal shares
  (``sigma = 1.4``, so a few counties hold most people, as in the real country);
* **tracts**: the 84,414 tracts are apportioned to the 3,143 counties in proportion to their
  populations (largest remainders, at least one per county; about 3,660 people per tract,
  where real tracts were designed for about 4,000); a county's tracts share its people
  equally;
* **block groups**: the 239,780 block groups are apportioned to the tracts in proportion to
  population (largest remainders, at least one and at most nine per tract, since a block
  group's code is one digit); a tract's block groups share its people equally;
* **blocks**: the 8,132,968 blocks are apportioned to the block groups in proportion to
  log-normal weights (``sigma = 0.5``; at least one and at most 999 per block group, about 34
  on average). Each block is empty with probability :data:`EMPTY_BLOCK_SHARE` = 0.4 (a block
  group keeps at least one block with people); a block group's people are split among its
  other blocks by log-normal shares (``sigma = 1.2``). So about 40% of blocks are empty and
  about four in five hold fewer than 50 people, as most real blocks do; the 40% is chosen
  for the model, not a published 2020 figure.

Codes are FIPS-like, fixed width per level: state ``"06"``, county ``"001"``, ``"003"``, ...
(3 digits), tract ``"000100"``, ``"000200"``, ... (6 digits), block group ``"1"`` ... ``"9"``
(1 digit) and block 4 digits whose first digit is its block group's (``"1000"``, ``"1001"``,
... in block group 1), as Census block codes are. A unit's code is the concatenation
(``"060010001001000"``, the GEOID of a block).

>>> table = us_geography()
>>> len(table), table["state"].nunique(), table.groupby(["state", "county"]).ngroups
(84414, 51, 3143)
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

__all__ = ["us_geography", "us_tree", "synthetic_persons_in", "SyntheticHistograms", "PEOPLE_PER_TRACT", "LEVELS",
           "TRACTS_2020", "BLOCK_GROUPS_2020", "BLOCKS_2020", "EMPTY_BLOCK_SHARE"]

#: Census tracts in the 50 states and DC, 2020 Census (U.S. Census Bureau geographic tallies): a fact.
TRACTS_2020 = 84_414
#: Census block groups in the 50 states and DC, 2020 Census (geographic tallies): a fact.
BLOCK_GROUPS_2020 = 239_780
#: Census tabulation blocks in the 50 states and DC, 2020 Census (geographic tallies): a fact.
BLOCKS_2020 = 8_132_968
#: Chance that a synthetic block is empty: a modelling choice, not a published figure.
EMPTY_BLOCK_SHARE = 0.4
#: People per synthetic tract, rounded (308,745,538 people / 84,414 tracts).
PEOPLE_PER_TRACT = 3658
#: The levels of the synthetic geography below the nation; ``levels`` arguments are prefixes of it.
LEVELS = ("state", "county", "tract", "block_group", "block")

_COUNTY_SIGMA = 1.4
_BLOCK_SIGMA = 0.5
_PEOPLE_SIGMA = 1.2
_LEVELS = LEVELS[:3]


def _counties_per_state() -> dict[str, int]:
    text = resources.files("census_workloads").joinpath("data/counties_2010.csv").read_text()
    rows = [line.split(",") for line in text.strip().splitlines()[1:]]
    return {abbr: int(n) for abbr, n in rows}


def _apportion(total: int, weights: np.ndarray, cap: int) -> np.ndarray:
    """``total`` whole units given out in proportion to ``weights``, at least 1 and at most ``cap`` each
    (largest remainders: everyone gets the floor of their quota, clipped, and the remaining units go to the
    largest remainders; units taken back, if the floors of 1 overshoot, from the smallest)."""
    if not weights.size <= total <= cap * weights.size:
        raise ValueError(f"cannot give {total} units to {weights.size} parents with 1 to {cap} each")
    quota = total * weights / weights.sum()
    out = np.clip(np.floor(quota), 1, cap).astype(np.int64)
    while (rest := total - int(out.sum())) != 0:
        remainder = quota - out
        if rest > 0:
            remainder[out >= cap] = -np.inf
            out[np.argsort(-remainder, kind="stable")[:rest]] += 1
        else:
            remainder[out <= 1] = np.inf
            out[np.argsort(remainder, kind="stable")[:-rest]] -= 1
    return out


def _split(total: int, shares: np.ndarray) -> np.ndarray:
    """Whole numbers in proportion to ``shares`` that add up to ``total`` (largest remainders)."""
    exact = total * shares
    out = np.floor(exact).astype(np.int64)
    out[np.argsort(out - exact)[: total - int(out.sum())]] += 1
    return out


def _split_groups(totals: np.ndarray, weights: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`_split` of each group's total among its items (``sizes[g]`` consecutive items, ``weights``),
    for all groups at once: whole numbers, in proportion to the weights, adding up to each total."""
    group = np.repeat(np.arange(sizes.size), sizes)
    wsum = np.bincount(group, weights=weights, minlength=sizes.size)
    exact = totals[group] * weights / np.where(wsum > 0, wsum, 1.0)[group]
    out = np.floor(exact + 1e-9).astype(np.int64)
    missing = totals - np.bincount(group, weights=out, minlength=sizes.size).astype(np.int64)
    remainder = np.clip(exact - out, 0.0, 1.0)  # groups are consecutive: sort by group, then largest remainder
    order = np.argsort(group + 0.5 * (1.0 - remainder), kind="stable")
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size) - start[group[order]]
    out[rank < missing[group]] += 1
    return out


@lru_cache(maxsize=2)
def _tracts(seed: int) -> pd.DataFrame:
    """One row per synthetic tract: state, state_name, county, tract, population."""
    rng = np.random.default_rng(seed)
    counties = list(_counties_per_state().values())  # same order as STATES (FIPS)
    county_people, county_state = [], []
    for s, (n_counties, people) in enumerate(zip(counties, STATE_POPULATION_2010.tolist())):
        shares = rng.lognormal(0.0, _COUNTY_SIGMA, n_counties)
        county_people.append(_split(people, shares / shares.sum()))
        county_state.append(np.full(n_counties, s))
    people = np.concatenate(county_people)
    state = np.concatenate(county_state)
    county_code = np.concatenate([2 * np.arange(n) + 1 for n in counties])
    tracts = _apportion(TRACTS_2020, people.astype(float), cap=9999)
    tract_people = _split_groups(people, np.ones(int(tracts.sum())), tracts)
    county_of = np.repeat(np.arange(people.size), tracts)
    number = np.arange(county_of.size) - np.repeat(np.cumsum(tracts) - tracts, tracts) + 1
    fips = np.array([f for f, _ in STATES], dtype=object)
    names = np.array([n for _, n in STATES], dtype=object)
    counties_text = np.array([f"{c:03d}" for c in range(1, 2 * max(counties) + 1)], dtype=object)
    tract_text = np.array([f"{t * 100:06d}" for t in range(1, int(tracts.max()) + 1)], dtype=object)
    return pd.DataFrame({"state": fips[state[county_of]], "state_name": names[state[county_of]],
                         "county": counties_text[county_code[county_of] - 1], "tract": tract_text[number - 1],
                         "population": tract_people})


def _children(parents: pd.DataFrame, counts: np.ndarray, people: np.ndarray, level: str, codes: np.ndarray,
              number: np.ndarray) -> pd.DataFrame:
    """The rows of ``parents`` repeated ``counts`` times, with a column ``level`` of codes and their people."""
    out = parents.drop(columns="population").iloc[np.repeat(np.arange(len(parents)), counts)].reset_index(drop=True)
    out[level] = codes[number]
    out["population"] = people
    return out


@lru_cache(maxsize=1)
def _block_groups(seed: int) -> pd.DataFrame:
    tracts = _tracts(seed)
    people = tracts["population"].to_numpy()
    counts = _apportion(BLOCK_GROUPS_2020, people.astype(float), cap=9)
    number = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    codes = np.array([str(k) for k in range(1, 10)], dtype=object)
    return _children(tracts, counts, _split_groups(people, np.ones(number.size), counts), "block_group", codes,
                     number)


@lru_cache(maxsize=1)
def _block_arrays(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Blocks per block group, and each block's number in its block group and people (all states, arrays)."""
    groups = _block_groups(seed)
    rng = np.random.default_rng([seed, 2020])
    counts = _apportion(BLOCKS_2020, rng.lognormal(0.0, _BLOCK_SIGMA, len(groups)), cap=999)
    n = int(counts.sum())
    first = np.cumsum(counts) - counts
    number = (np.arange(n) - np.repeat(first, counts)).astype(np.int16)
    weights = rng.lognormal(0.0, _PEOPLE_SIGMA, n) * (rng.random(n) >= EMPTY_BLOCK_SHARE)
    group_weight = np.add.reduceat(weights, first)
    weights[first[group_weight == 0]] = 1.0  # every block group keeps one block with people
    people = _split_groups(groups["population"].to_numpy(), weights, counts).astype(np.int32)
    return counts, number, people


def _blocks(seed: int, states: tuple[str, ...] | None) -> pd.DataFrame:
    """One row per block (of ``states`` only, if given): the block groups' columns, block, population."""
    groups = _block_groups(seed)
    counts, number, people = _block_arrays(seed)
    keep = np.ones(len(groups), dtype=bool) if states is None else groups["state"].isin(states).to_numpy()
    rows = np.repeat(keep, counts)
    parent = np.repeat(np.flatnonzero(keep), counts[keep])
    out = {c: groups[c].to_numpy()[parent] for c in groups.columns if c != "population"}
    bg = groups["block_group"].to_numpy().astype(np.int64)[parent]
    codes = np.array([f"{k:04d}" for k in range(10_000)], dtype=object)
    out["block"] = codes[bg * 1000 + number[rows]]
    out["population"] = people[rows].astype(np.int64)
    return pd.DataFrame(out)


def _check_levels(levels) -> tuple[str, ...]:
    levels = tuple(levels)
    if not levels or levels != LEVELS[:len(levels)]:
        raise ValueError(f"levels must be a prefix of {list(LEVELS)}, got {list(levels)}")
    return levels


def us_geography(levels: tuple[str, ...] = _LEVELS, seed: int = 2010, states: tuple[str, ...] | None = None
                 ) -> pd.DataFrame:
    """The synthetic geography as a table: one row per finest unit, with its (synthetic) population.

    Parameters
    ----------
    levels
        A prefix of :data:`LEVELS`: ``("state",)`` up to ``("state", "county", "tract", "block_group",
        "block")``; default ``("state", "county", "tract")``.
    seed
        Seed of the synthetic populations and apportionments (the default is the published one).
    states
        Only these states (FIPS codes, e.g. ``("06",)`` for California); default all.

    >>> groups = us_geography(LEVELS[:4])  # the 239,780 block groups (8,132,968 blocks: tests/test_census_blocks.py)
    >>> len(groups), groups.iloc[0, :5].tolist()
    (239780, ['01', 'Alabama', '001', '000100', '1'])
    """
    levels = _check_levels(levels)
    seed = int(seed)
    if states is not None:
        states = tuple(states)
        unknown = sorted(set(states) - {f for f, _ in STATES})
        if unknown:
            raise ValueError(f"unknown state codes {unknown}: use FIPS codes such as '06'")
    if "block" in levels:
        table = _blocks(seed, states)
    else:
        table = _block_groups(seed) if "block_group" in levels else _tracts(seed)
        table = table if states is None else table[table["state"].isin(states)]
    keep = ["state", "state_name", *levels[1:]]
    if len(keep) == table.shape[1] - 1:  # the finest level of the table: one row per unit already
        return table.reset_index(drop=True)
    return table.groupby(keep, sort=True, as_index=False)["population"].sum()


def us_tree(levels: tuple[str, ...] = _LEVELS, seed: int = 2010, states: tuple[str, ...] | None = None):
    """The synthetic geography as a :class:`hdmm.geography.GeographyTree` (root ``nation``, code ``"US"``).

    With the block level, a block's code must begin with its block group's digit (``prefixed``).
    """
    from hdmm.geography import GeographyTree

    levels = _check_levels(levels)
    return GeographyTree.from_table(us_geography(levels, seed, states), list(levels), root_code="US",
                                    root_name="United States", names={"state": "state_name"},
                                    prefixed=("block",) if "block" in levels else ())


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
