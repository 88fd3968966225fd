"""SYNTHETIC person records on the CPH schema, for examples, tests and benchmarks.

.. warning::

   **The records are SYNTHETIC.**  They are random draws from a simple model built
   from approximate *published marginal shares* of the 2010 Census.  They are not
   Census microdata, contain no real person, and reproduce only the few marginals and
   correlations listed below.  Do not use them to draw conclusions about the population.

The model
---------
Each record is drawn independently, attribute by attribute (codes as in
:func:`census_workloads.cph_domain`):

1. ``age`` from the 2010 age pyramid;
2. ``sex`` given age (sex ratio by age band);
3. ``hispanic`` given age (the Hispanic population is younger);
4. ``race`` given Hispanic origin (one of the 63 combinations of the six OMB races);
5. ``relationship`` given age (a modelled table, with structural zeros);
6. ``state`` (with ``states=True``) in proportion to the 2010 state populations,
   independently of the other attributes.

Race does not depend on age, relationship does not depend on sex, and no household
is assembled: a "Husband or wife" record has no householder record to match.

Sampling: the product of these conditionals is a probability for each of the 492,660
cells of ``cph_domain()``.  The cell counts of ``n`` independent records are drawn at
once (a multinomial draw), expanded into records (:func:`hdmm.records.to_records`) and put
in random order.  With ``states=True`` the state column, independent of the rest, is
drawn the same way and left sorted, so the rows come ordered by state.  Either way the
table has exactly the distribution of ``n`` independent draws from the model, in
about one second per ten million records.

Figures used (all approximate, 2010 Census, United States, 308.7 million people)
------------------------------------------------------------------------------------
* Age: the shares of the five-year age groups 0-4, ..., 95-99 and 100+
  (6.5, 6.6, 6.7, 7.1, 7.0, 6.8, 6.5, 6.5, 6.8, 7.4, 7.2, 6.4, 5.4, 4.0, 3.0, 2.4, 1.9,
  1.2, 0.5, 0.1 and 0.02 percent; Census Brief C2010BR-03, *Age and Sex Composition:
  2010*), spread evenly over the single years of each group; the 100+ share halves with
  each year up to 114.  About 24.0% are under 18 and 13.0% are 65 or over.
* Sex: males per 100 females by age band (104.6 under 20, 104 at 20-24, 101 at 25-34,
  99 at 35-44, 97 at 45-54, 93 at 55-64, 88 at 65-74, 74 at 75-84, 51 at 85+), giving
  about 49.2% male overall (C2010BR-03).
* Hispanic or Latino: 23.1% of those under 18, 15.7% at 18-64 and 6.9% at 65+, about
  16.3% overall (C2010BR-04, *The Hispanic Population: 2010*).
* Race alone by Hispanic origin, in thousands (C2010BR-02, *Overview of Race and
  Hispanic Origin: 2010*, Table 2): the table ``_RACE_THOUSANDS`` below.  Overall about 72.4%
  White alone, 12.6% Black alone, 0.9% AIAN alone, 4.8% Asian alone, 0.2% NHPI alone,
  6.2% Some Other Race alone and 2.9% two or more races.
* Two or more races: the eleven largest combinations, in thousands (C2010BR-13, *The
  Two or More Races Population: 2010*), ``_MULTIRACE_THOUSANDS`` below; the other
  combinations share the remaining 0.8 million with weights that fall by 4 for every
  further race.  The same mix is used for Hispanic and non-Hispanic people.
* State: the 2010 resident population of each state and DC (Census 2010, table P1;
  they add up to 308,745,538).
* Relationship: a modelled table of shares by age band (``_RELATIONSHIP_PERCENT`` below)
  calibrated to the 2010 totals of about 116.7 million householders (37.8% of people),
  56.5 million spouses, 7.7 million unmarried partners (C2010BR-14, *Households and
  Families: 2010*) and 8.0 million people in group quarters (2.6%), about half of them
  institutionalized (C2010SR-01, *The Group Quarters Population: 2010*).

Structural zeros
----------------
The schema documents (``schema.py`` and the SF1 notes) state no structural zeros, so
the generator imposes its own minimum ages, modelled on the Census edit rule that a
householder or spouse is at least 15 (see :data:`RELATIONSHIP_MIN_AGE`): no
householder, spouse, unmarried partner or son/daughter-in-law under 15, and no parent
or parent-in-law of the householder under 30.  Group-quarters people and relatives of
other kinds can have any age.
"""

from __future__ import annotations

import numbers
from functools import lru_cache

import numpy as np
import pandas as pd

from hdmm.records import to_records

from .schema import AGE_LABELS, RACES, RELATIONSHIP, cph_domain

__all__ = ["RELATIONSHIP_MIN_AGE", "synthetic_persons"]

#: Minimum age of each relationship category that has one; the generator never
#: draws a younger person in that category (structural zeros).
RELATIONSHIP_MIN_AGE: dict[str, int] = {
    "Householder": 15,
    "Husband or wife": 15,
    "Unmarried partner": 15,
    "Son-in-law or daughter-in-law": 15,
    "Father or mother": 30,
    "Parent-in-law": 30,
}

_AGES = len(AGE_LABELS)  # 115: 0..113 and "114 and over"

# Percent of the population in the five-year age groups 0-4, ..., 95-99 and in 100+.
_AGE_GROUP_PERCENT = np.array(
    [6.5, 6.6, 6.7, 7.1, 7.0, 6.8, 6.5, 6.5, 6.8, 7.4, 7.2, 6.4, 5.4, 4.0, 3.0, 2.4, 1.9,
     1.2, 0.5, 0.1, 0.02]
)  # fmt: skip

# Males per 100 females, by age band [edge_k, edge_k+1).
_SEX_RATIO_EDGES = (0, 20, 25, 35, 45, 55, 65, 75, 85, _AGES)
_SEX_RATIO = np.array([104.6, 104.0, 101.0, 99.0, 97.0, 93.0, 88.0, 74.0, 51.0])

# Percent Hispanic or Latino, by age band.
_HISPANIC_EDGES = (0, 18, 65, _AGES)
_HISPANIC_PERCENT = np.array([23.1, 15.7, 6.9])

#: Race alone (White, Black, AIAN, Asian, NHPI, Some Other Race) and "two or more
#: races", in thousands, for the Hispanic (row 0) and not Hispanic (row 1) populations.
_RACE_THOUSANDS = np.array(
    [[26_736, 1_243, 685, 209, 58, 18_503, 3_043],
     [196_818, 37_686, 2_247, 14_465, 482, 604, 5_966]]
)  # fmt: skip

#: The largest combinations of two or more races (tuples of ``RACES`` indices: White 0,
#: Black 1, AIAN 2, Asian 3, NHPI 4, Some Other Race 5), in thousands, and the total.
_MULTIRACE_THOUSANDS: dict[tuple[int, ...], int] = {
    (0, 1): 1_834,
    (0, 5): 1_741,
    (0, 3): 1_623,
    (0, 2): 1_432,
    (1, 5): 315,
    (1, 2): 270,
    (3, 5): 234,
    (0, 1, 2): 231,
    (1, 3): 186,
    (0, 4): 170,
    (3, 4): 166,
}
_MULTIRACE_TOTAL_THOUSANDS = 9_009
# Weight of an unlisted combination relative to one with one race fewer.
_MULTIRACE_DECAY = 0.25

# 2010 resident population of the states and DC, in the order of ``STATES`` (FIPS).
_STATE_POPULATION = np.array(
    [4_779_736, 710_231, 6_392_017, 2_915_918, 37_253_956, 5_029_196, 3_574_097, 897_934,
     601_723, 18_801_310, 9_687_653, 1_360_301, 1_567_582, 12_830_632, 6_483_802,
     3_046_355, 2_853_118, 4_339_367, 4_533_372, 1_328_361, 5_773_552, 6_547_629,
     9_883_640, 5_303_925, 2_967_297, 5_988_927, 989_415, 1_826_341, 2_700_551,
     1_316_470, 8_791_894, 2_059_179, 19_378_102, 9_535_483, 672_591, 11_536_504,
     3_751_351, 3_831_074, 12_702_379, 1_052_567, 4_625_364, 814_180, 6_346_105,
     25_145_561, 2_763_885, 625_741, 8_001_024, 6_724_540, 1_852_994, 5_686_986, 563_626]
)  # fmt: skip
_STATE_SHARES = _STATE_POPULATION / _STATE_POPULATION.sum()

#: Relationship to householder by age band (rows: 0-14, 15-17, 18-24, 25-34, ..., 75-84,
#: 85+), in percent (rows are normalised).  Columns follow ``RELATIONSHIP``:
#: householder, husband or wife, biological, adopted and step child, brother or sister,
#: father or mother, grandchild, parent-in-law, son/daughter-in-law, other relative,
#: roomer or boarder, housemate, unmarried partner, other nonrelative,
#: institutionalized and noninstitutionalized group quarters.
_RELATIONSHIP_EDGES = (0, 15, 18, 25, 35, 45, 55, 65, 75, 85, _AGES)
_RELATIONSHIP_PERCENT = np.array(
    [
        #   HH spou  bio adop step  sib  par  gch p-il c-il orel room mate prtn nrel inst ninst
        [   0,   0,  84, 2.2, 4.5, 0.6,   0,   6,   0,   0, 1.3, 0.1, 0.1,   0, 1.4,0.05, 0.1],
        [ 0.2, 0.1,  83, 2.4,   5, 0.8,   0, 4.5,   0,0.05, 1.5, 0.2, 0.2, 0.2, 1.4, 0.5, 0.3],
        [  16,   5,  42, 0.8,   2, 2.5,   0, 2.5,   0, 0.6, 2.5, 1.5, 4.5, 5.5, 2.5, 1.3, 9.5],
        [  45,  22,  12, 0.2, 0.5,   2,0.05, 0.5,   0, 1.2, 1.8, 1.1, 3.5, 5.5, 2.3, 1.6,   1],
        [  53,  30,   5, 0.1, 0.2, 1.6, 0.1, 0.1,0.05, 0.8, 1.4, 0.9,   2, 3.6, 1.5, 1.3, 0.3],
        [56.5,  30, 3.2,0.05, 0.1, 1.5, 0.3,0.05, 0.2, 0.4, 1.2, 0.8, 1.6, 2.6, 1.1,   1, 0.3],
        [59.5,  30, 1.7,0.02,0.05, 1.4,   1,   0, 0.5, 0.2, 1.1, 0.6, 1.2, 1.8, 0.9, 0.8, 0.3],
        [61.5,  30, 0.8,   0,   0, 1.2, 2.5,   0,   1, 0.1, 1.2, 0.4, 0.9, 1.3, 0.6, 1.3, 0.3],
        [  66,  22, 0.3,   0,   0, 1.1,   4,   0, 1.8,   0, 1.4, 0.3, 0.6, 0.8, 0.5,   4, 0.4],
        [  58,   8, 0.1,   0,   0, 0.9,   6,   0, 2.5,   0, 1.8, 0.3, 0.4, 0.4, 0.6,  16,   1],
    ]
)  # fmt: skip


def _by_age(edges: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """Expand per-band rows (band ``k`` covers ages ``edges[k]..edges[k+1]-1``) to per-age rows."""
    return np.repeat(rows, np.diff(edges), axis=0)


def _normalised(weights: np.ndarray) -> np.ndarray:
    """Weights scaled so that each row (last axis) sums to one."""
    return weights / weights.sum(axis=-1, keepdims=True)


def _age_distribution() -> np.ndarray:
    """Weights of the single years of age 0..114 (see the module notes)."""
    five_year = np.repeat(_AGE_GROUP_PERCENT[:-1] / 5, 5)
    top = 0.5 ** np.arange(_AGES - five_year.size)
    return np.concatenate([five_year, _AGE_GROUP_PERCENT[-1] * top / top.sum()])


def _race_distribution() -> np.ndarray:
    """Weights of the 63 race codes (code = mask - 1) for Hispanic (row 0) and not (row 1)."""
    masks = np.arange(1, 2 ** len(RACES))
    bits = np.array([bin(m).count("1") for m in masks])
    multi = _MULTIRACE_DECAY ** (bits - 2.0) * (bits >= 2)
    listed = np.array([sum(1 << r for r in races) for races in _MULTIRACE_THOUSANDS]) - 1
    multi[listed] = 0.0
    multi *= (_MULTIRACE_TOTAL_THOUSANDS - sum(_MULTIRACE_THOUSANDS.values())) / multi.sum()
    multi[listed] = list(_MULTIRACE_THOUSANDS.values())
    alone = (1 << np.arange(len(RACES))) - 1  # the codes of the six single races
    weights = _RACE_THOUSANDS[:, -1:] * _normalised(multi)
    weights[:, alone] = _RACE_THOUSANDS[:, :-1]
    return weights


def _relationship_distribution() -> np.ndarray:
    """Weights of the 17 relationship codes for each age 0..114, structural zeros applied."""
    weights = _by_age(_RELATIONSHIP_EDGES, _RELATIONSHIP_PERCENT)
    for category, min_age in RELATIONSHIP_MIN_AGE.items():
        weights[:min_age, RELATIONSHIP.index(category)] = 0.0
    return weights


@lru_cache(maxsize=1)
def _cell_probabilities() -> np.ndarray:
    """Probability of each cell of ``cph_domain()``, a read-only array of its shape.

    The product of the model's conditionals:
    ``p(sex, hispanic, race, relationship, age) = p(age) p(sex | age) p(hispanic | age)
    p(race | hispanic) p(relationship | age)``.
    """
    sex = np.column_stack([_SEX_RATIO, np.full_like(_SEX_RATIO, 100.0)])
    hispanic = np.column_stack([_HISPANIC_PERCENT, 100.0 - _HISPANIC_PERCENT])
    probabilities = np.einsum(
        "a,as,ah,hr,al->shrla",
        _normalised(_age_distribution()),
        _normalised(_by_age(_SEX_RATIO_EDGES, sex)),
        _normalised(_by_age(_HISPANIC_EDGES, hispanic)),
        _normalised(_race_distribution()),
        _normalised(_relationship_distribution()),
        optimize=True,
    )
    probabilities.flags.writeable = False
    return probabilities


def cell_probabilities() -> np.ndarray:
    """The model's probability of each cell of ``cph_domain()`` (read only, the domain's shape).

    >>> p = cell_probabilities()
    >>> p.shape, round(float(p.sum()), 12)
    ((2, 2, 63, 17, 115), 1.0)
    """
    return _cell_probabilities()


#: 2010 resident population of the 50 states and DC, in the order of ``STATES`` (FIPS).
STATE_POPULATION_2010: np.ndarray = _STATE_POPULATION


def synthetic_persons(
    n: int, seed: int | np.random.Generator | None = None, states: bool = False
) -> pd.DataFrame:
    """A SYNTHETIC person table on the CPH schema, drawn from 2010 Census marginal shares.

    The records are random draws from the model described in
    :mod:`census_workloads.synthetic`, not Census microdata.

    Parameters
    ----------
    n
        Number of person records (rows).
    seed
        Seed of the random generator (anything ``numpy.random.default_rng`` accepts,
        e.g. an int or a ``Generator``); the same int gives the same table.  ``None``
        (the default) seeds from operating-system entropy.
    states
        Add a ``state`` column (the 50 states and DC, in proportion to their 2010
        populations).

    Returns
    -------
    pandas.DataFrame
        ``n`` rows; columns ``sex``, ``hispanic``, ``race``, ``relationship``, ``age``
        (and ``state``), each a pandas Categorical whose categories are the value labels
        of :func:`census_workloads.cph_domain` (``cph_domain(states)``) in code order, so
        ``cph_domain(states).vectorize(df)`` gives the data vector, and ``.cat.codes``
        the codes.  About 6 bytes per record (7 with states).

    Raises
    ------
    TypeError, ValueError
        If ``n`` is not a non-negative int or ``states`` is not a bool.

    Examples
    --------
    >>> from census_workloads import cph_domain, synthetic_persons
    >>> df = synthetic_persons(1000, seed=0)
    >>> list(df.columns)
    ['sex', 'hispanic', 'race', 'relationship', 'age']
    >>> float(cph_domain().vectorize(df).sum())
    1000.0
    """
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
        raise TypeError(f"n must be a non-negative int (number of people), got {n!r}")
    if n < 0:
        raise ValueError(f"n must be a non-negative int (number of people), got {n}")
    if not isinstance(states, (bool, np.bool_)):
        raise TypeError(f"states must be True or False, got {states!r}")
    n = int(n)
    rng = np.random.default_rng(seed)
    national = cph_domain()
    counts = rng.multinomial(n, _cell_probabilities().ravel())
    persons = to_records(national, counts).take(rng.permutation(n))
    persons.index = pd.RangeIndex(n)
    if states:
        state = cph_domain(state=True).project(["state"])
        persons["state"] = to_records(state, rng.multinomial(n, _STATE_SHARES))["state"]
    return persons
