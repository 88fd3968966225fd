"""The 2020 DAS PL94 person histogram (2,016 cells) and the PL94-171 person tables over it.

The 2020 Census Disclosure Avoidance System measured the redistricting data on a histogram of
four attributes (schema ``PL94_2020_SCHEMA``; facts and their source files in
``census_workloads/data/das2020_pl94.md``), in this order (the first most significant):

=========  ====  ===============================================================================
attribute  size  values (the DAS's codes)
=========  ====  ===============================================================================
hhgq       8     0 household, 1-4 institutional group quarters types, 5-7 noninstitutional
votingage  2     0 "17 and under", 1 "18 and over"
hispanic   2     0 "Not Hispanic or Latino", 1 "Hispanic or Latino"
cenrace    63    the race combinations ordered by number of races (0 white, ..., 62 all six)
=========  ====  ===============================================================================

:func:`das_query` gives the DAS's named queries on it (``"hispanic * cenrace"``, ``"detailed"``,
...), each a 0/1 partition of the cells (one answer per cell of the marginal), and
:func:`pl94_2020_tables` the published 2020 person tables P1-P5.

Correspondence with :mod:`census_workloads.pl94` (over the 492,660-cell CPH domain)
-----------------------------------------------------------------------------------
P1-P4 are the same queries, in the same order, on both domains; a row's label states the same
conditions on both, in each domain's attribute order (``"White alone, 18 years and over"`` on the
CPH, ``"18 years and over, White alone"`` here).
:func:`cph_to_pl94_2020` is the 0/1 matrix ``M`` (2,016 x 492,660, one 1 per column) that
takes a CPH histogram to the DAS one: sex is summed out, age becomes voting age (18 and over),
the Hispanic codes swap (the CPH has Hispanic first), the race codes are permuted (CPH code
``k - 1`` is the bit mask ``k``; the DAS orders by number of races) and relationship becomes
hhgq: the 15 household relationships go to household. The CPH records only whether a group
quarters person is institutionalized, not the facility type, so institutional and
noninstitutional persons go to one chosen type each (by default "Other institutional
facilities" and "Other noninstitutional facilities"). Hence, for every CPH histogram ``x``,

* ``pl94_tables()[t] @ x == pl94_2020_tables()[t] @ (M @ x)`` for ``t`` in P1-P4;
* P5's three totals (group quarters, institutionalized, noninstitutionalized:
  :data:`P5_CPH_ROWS`) equal :func:`p5_cph` ``@ x``; its seven facility-type rows cannot be
  expressed on the CPH domain (they count whatever type ``M`` chose);
* every DAS query except those that split hhgq below its three ``hhinstlevels`` is a query
  on the CPH domain (``das_query(q) @ M``); ``"hhgq"`` and ``"detailed"`` are not.

>>> from census_workloads.pl94_2020 import pl94_2020_domain, pl94_2020
>>> pl94_2020_domain().size, pl94_2020().shape
(2016, (298, 2016))
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from typing import Mapping

import numpy as np
import pandas as pd
import scipy.sparse as sp
from hdmm.domain import Domain
from hdmm.matrix import Kronecker, Matrix, VStack
from hdmm.workload import Predicates, Total

from .predicates import race2
from .schema import RACES, RELATIONSHIP, cph_domain, race_label
from .tables import weighted_union

__all__ = [
    "HHGQ", "VOTING_AGE", "DAS_HISPANIC", "CENRACE_MASKS", "DAS_QUERIES", "PL94_2020_TABLES", "P5_CPH_ROWS",
    "pl94_2020_domain", "das_query", "pl94_2020_tables", "pl94_2020", "cph_to_pl94_2020", "p5_cph", "PL94Histograms",
    "pl94_2020_records",
]

#: The DAS's hhgq values (``hhgq_person_simple.py``), in code order.
HHGQ: tuple[str, ...] = (
    "Household",
    "Correctional facilities for adults",
    "Juvenile facilities",
    "Nursing facilities/Skilled-nursing facilities",
    "Other institutional facilities",
    "College/University student housing",
    "Military quarters",
    "Other noninstitutional facilities",
)
_INSTITUTIONAL, _NONINSTITUTIONAL = (1, 2, 3, 4), (5, 6, 7)

#: Voting age, in the DAS's code order.
VOTING_AGE: tuple[str, ...] = ("17 and under", "18 and over")

#: Hispanic origin in the DAS's code order (the reverse of the CPH's :data:`~census_workloads.HISPANIC`).
DAS_HISPANIC: tuple[str, ...] = ("Not Hispanic or Latino", "Hispanic or Latino")

#: The race bit mask (bit ``b`` = ``RACES[b]``) of each DAS cenrace code: by number of races, then in flag order.
CENRACE_MASKS: tuple[int, ...] = tuple(
    sum(1 << b for b in combo) for k in range(1, len(RACES) + 1) for combo in combinations(range(len(RACES)), k)
)

#: The DAS's query names of the production PL94 strategy (``strategies.py``), "detailed" last.
DAS_QUERIES: tuple[str, ...] = (
    "total", "cenrace", "hispanic", "votingage", "hhinstlevels", "hhgq", "hispanic * cenrace",
    "votingage * cenrace", "votingage * hispanic", "votingage * hispanic * cenrace", "detailed",
)

#: The 2020 PL94-171 person tables, in order (P5, group quarters by type, is new in 2020).
PL94_2020_TABLES: tuple[str, ...] = ("P1", "P2", "P3", "P4", "P5")

#: P5's rows, in table order (2020 PL94-171 technical documentation; the types are the DAS's hhgq 1-7).
_P5_ROWS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("Total group quarters population", _INSTITUTIONAL + _NONINSTITUTIONAL),
    ("Institutionalized population", _INSTITUTIONAL),
    *((HHGQ[t], (t,)) for t in _INSTITUTIONAL),
    ("Noninstitutionalized population", _NONINSTITUTIONAL),
    *((HHGQ[t], (t,)) for t in _NONINSTITUTIONAL),
)

#: The rows of P5 that are also queries on the CPH domain (see :func:`p5_cph`).
P5_CPH_ROWS: tuple[int, ...] = (0, 1, 6)

_ATTRIBUTES = ("hhgq", "votingage", "hispanic", "cenrace")


@lru_cache(maxsize=None)
def pl94_2020_domain() -> Domain:
    """The DAS 2020 PL94 person histogram: hhgq 8 x votingage 2 x hispanic 2 x cenrace 63 = 2,016 cells.

    Returns
    -------
    hdmm.domain.Domain
        Value labels as in the module docstring; race labels as the CPH's (``"White; Asian"``).
    """
    values = {"hhgq": HHGQ, "votingage": VOTING_AGE, "hispanic": DAS_HISPANIC,
              "cenrace": tuple(race_label(mask) for mask in CENRACE_MASKS)}
    return Domain(list(values), [len(v) for v in values.values()], values)


def _partition(groups: Mapping[str, tuple[int, ...]], n: int) -> Matrix:
    """A 0/1 predicate set over ``n`` values, one row per labelled group."""
    rows = np.zeros((len(groups), n))
    for i, members in enumerate(groups.values()):
        rows[i, list(members)] = 1.0
    return Predicates(rows, labels=list(groups))


def _identity(attribute: str) -> Matrix:
    domain = pl94_2020_domain()
    return Predicates(np.eye(domain[attribute]), labels=[str(v) for v in domain.values(attribute)])


def _factor(attribute: str) -> Matrix:
    """The factor of one term of a DAS query name: an attribute, or the recode ``hhinstlevels``."""
    if attribute == "hhinstlevels":
        return _partition({"Household": (0,), "Institutional facility": _INSTITUTIONAL,
                           "Non-institutional facility": _NONINSTITUTIONAL}, len(HHGQ))
    return _identity(attribute)


@lru_cache(maxsize=None)
def das_query(name: str) -> Kronecker:
    """One of the DAS's named PL94 queries (:data:`DAS_QUERIES`) over :func:`pl94_2020_domain`.

    ``"total"`` is one count, ``"detailed"`` every cell, and ``"a * b"`` the marginal of the named
    attributes (``hhinstlevels`` groups hhgq as household, institutional, noninstitutional). Each
    is a 0/1 partition of the cells: every cell is counted by exactly one of its rows.

    >>> [das_query(q).shape[0] for q in DAS_QUERIES]
    [1, 63, 2, 2, 3, 8, 126, 126, 4, 252, 2016]
    """
    if name not in DAS_QUERIES:
        raise ValueError(f"unknown DAS query {name!r}; the PL94 queries are {list(DAS_QUERIES)}")
    domain = pl94_2020_domain()
    terms = {} if name == "total" else {a: a for a in _ATTRIBUTES} if name == "detailed" else {
        ("hhgq" if t == "hhinstlevels" else t): t for t in name.split(" * ")}
    factors = [_factor(terms[a]) if a in terms else Total(domain[a]) for a in _ATTRIBUTES]
    return Kronecker(factors, sep=", ")


@lru_cache(maxsize=None)
def _race2() -> Matrix:
    """:func:`census_workloads.race2` (70 rows, same labels) over the DAS's cenrace codes."""
    cph = race2()
    return Predicates(cph.dense()[:, [mask - 1 for mask in CENRACE_MASKS]], labels=list(cph.labels))


def _hispanic_rows(codes: tuple[int, ...]) -> Matrix:
    """The DAS hispanic values ``codes`` as single-value queries, labelled by value."""
    return Predicates(np.eye(2)[list(codes)], labels=[DAS_HISPANIC[c] for c in codes])


def _kron(product: Mapping[str, Matrix]) -> Kronecker:
    domain = pl94_2020_domain()
    return Kronecker([product.get(a, Total(domain[a])) for a in _ATTRIBUTES], sep=", ")


def _adult() -> Matrix:
    return Predicates(np.array([[0.0, 1.0]]), labels=["18 years and over"])


@lru_cache(maxsize=None)
def _tables() -> dict[str, VStack]:
    race = [{}, {"cenrace": _race2()}]
    # the CPH's P2 order: Hispanic first, then not Hispanic, then not Hispanic by race
    by_race = [{}, {"hispanic": _hispanic_rows((1, 0))}, {"hispanic": _hispanic_rows((0,)), "cenrace": _race2()}]
    adults = [[{**p, "votingage": _adult()} for p in products] for products in (race, by_race)]
    p5 = _partition(dict(_P5_ROWS), len(HHGQ))
    products = {"P1": race, "P2": by_race, "P3": adults[0], "P4": adults[1], "P5": [{"hhgq": p5}]}
    return {name: VStack([_kron(p) for p in ps]) for name, ps in products.items()}


def pl94_2020_tables() -> dict[str, Matrix]:
    """The 2020 PL94-171 person tables over :func:`pl94_2020_domain`, by name.

    P1-P4 have 71, 73, 71 and 73 queries, those of :func:`census_workloads.pl94_tables` (module docstring);
    P5 (group quarters population by major type, 10 queries) counts hhgq groups.
    """
    return dict(_tables())


def pl94_2020(weights: Mapping[str, float] | None = None) -> Matrix:
    """The 2020 PL94-171 person workload, P1-P5 (298 queries over 2,016 cells), labels ``"PL94 P5: ..."``.

    Parameters
    ----------
    weights
        Optional weight per table name (``"P1"`` to ``"P5"``); other tables get 1.

    Raises
    ------
    ValueError
        If ``weights`` names an unknown table.
    """
    return weighted_union(pl94_2020_tables(), weights, prefix="PL94 ")


def _hhgq_of_relationship(institutional: int, noninstitutional: int) -> np.ndarray:
    if institutional not in _INSTITUTIONAL or noninstitutional not in _NONINSTITUTIONAL:
        raise ValueError(f"institutional must be one of {list(_INSTITUTIONAL)} and noninstitutional one of "
                         f"{list(_NONINSTITUTIONAL)} (codes of HHGQ), got {institutional!r} and {noninstitutional!r}")
    hhgq = np.zeros(len(RELATIONSHIP), dtype=np.int64)  # the 15 household relationships: household
    hhgq[RELATIONSHIP.index("Institutionalized group quarters population")] = institutional
    hhgq[RELATIONSHIP.index("Noninstitutionalized group quarters population")] = noninstitutional
    return hhgq


def _das_race() -> np.ndarray:
    """The DAS cenrace code of each CPH race code (CPH code ``k - 1`` is the race bit mask ``k``)."""
    das_race = np.empty(len(CENRACE_MASKS), dtype=np.int64)
    das_race[[mask - 1 for mask in CENRACE_MASKS]] = np.arange(len(CENRACE_MASKS))
    return das_race


def cph_to_pl94_2020(institutional: int = 4, noninstitutional: int = 7) -> sp.csr_matrix:
    """The 0/1 matrix ``M`` (2,016 x 492,660) taking a CPH histogram to the DAS PL94 histogram.

    See the module docstring. ``institutional`` and ``noninstitutional`` are the hhgq codes the
    CPH's two group quarters relationships go to (the CPH has no facility type).

    >>> M = cph_to_pl94_2020()
    >>> M.shape, M.nnz, bool((M.sum(axis=0) == 1).all())
    ((2016, 492660), 492660, True)
    """
    cph = cph_domain()
    sex, hispanic, race, relationship, age = np.unravel_index(np.arange(cph.size), cph.shape)
    del sex
    das_race = _das_race()
    rows = np.ravel_multi_index(
        (_hhgq_of_relationship(institutional, noninstitutional)[relationship], (age >= 18).astype(np.int64),
         1 - hispanic, das_race[race]),
        pl94_2020_domain().shape,
    )
    return sp.csr_matrix((np.ones(cph.size), (rows, np.arange(cph.size))), shape=(pl94_2020_domain().size, cph.size))


def pl94_2020_records(records: pd.DataFrame, institutional: int = 4, noninstitutional: int = 7) -> pd.DataFrame:
    """CPH person records (columns sex, hispanic, race, relationship, age, labelled as
    :func:`census_workloads.cph_domain`'s values) as records of the DAS PL94 histogram (hhgq, votingage,
    hispanic, cenrace, labelled as :func:`pl94_2020_domain`'s): the map of :func:`cph_to_pl94_2020`
    record by record. Other columns (e.g. the geography's) are kept.

    >>> from census_workloads import synthetic_persons
    >>> list(pl94_2020_records(synthetic_persons(3, seed=0)).columns)
    ['hhgq', 'votingage', 'hispanic', 'cenrace']
    """
    cph = cph_domain()
    codes = {}
    for name in ("hispanic", "race", "relationship", "age"):
        index = pd.Index(cph.values(name))
        codes[name] = index.get_indexer(records[name].astype(object))
        if np.any(codes[name] < 0):
            raise ValueError(f"column {name!r} holds values that are not {name} values of the CPH domain")
    das_race = _das_race()
    das = pl94_2020_domain()
    columns = {
        "hhgq": _hhgq_of_relationship(institutional, noninstitutional)[codes["relationship"]],
        "votingage": (np.asarray(cph.values("age"))[codes["age"]].astype(np.int64) >= 18).astype(np.int64),
        "hispanic": 1 - codes["hispanic"],
        "cenrace": das_race[codes["race"]],
    }
    out = pd.DataFrame({name: pd.Categorical.from_codes(c, categories=list(das.values(name)))
                        for name, c in columns.items()}, index=records.index)
    rest = [c for c in records.columns if c not in ("sex", "hispanic", "race", "relationship", "age")]
    return pd.concat([out, records[rest]], axis=1)


@dataclass(frozen=True, eq=False)
class PL94Histograms:
    """A CPH-domain histogram source (e.g. :class:`census_workloads.geography.SyntheticHistograms`) seen over
    the 2,016 DAS PL94 cells through :func:`cph_to_pl94_2020` (a :class:`hdmm.georelease.units.HistogramSource`).

    The group quarters persons of the CPH go to one facility type each (``cph_to_pl94_2020``'s defaults),
    so P5's facility-type rows of a release from it count those types only.
    """

    source: object

    @property
    def person_cells(self) -> int:
        return pl94_2020_domain().size

    def leaf_totals(self) -> np.ndarray:
        return self.source.leaf_totals()

    def histograms(self, lo: int, hi: int) -> sp.csr_matrix:
        return (self.source.histograms(lo, hi) @ _cph_map().T).tocsr()


@lru_cache(maxsize=1)
def _cph_map() -> sp.csr_matrix:
    return cph_to_pl94_2020()


def p5_cph() -> Kronecker:
    """The rows :data:`P5_CPH_ROWS` of P5 over the CPH domain: group quarters, institutionalized, noninstitutional."""
    groups = {label: tuple(RELATIONSHIP.index(r) for r in relationships) for label, relationships in (
        (_P5_ROWS[0][0], ("Institutionalized group quarters population",
                          "Noninstitutionalized group quarters population")),
        (_P5_ROWS[1][0], ("Institutionalized group quarters population",)),
        (_P5_ROWS[6][0], ("Noninstitutionalized group quarters population",)),
    )}
    cph = cph_domain()
    return Kronecker([_partition(groups, n) if a == "relationship" else Total(n) for a, n in zip(cph.names, cph.shape)], sep=", ")
