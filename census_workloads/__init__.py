"""Census person workloads for hdmm: the 2010 SF1 person tables, SF1+ and PL94-171.

The 2020 PL94-171 tables over the DAS's 2,016-cell histogram, and the 2020 production budget
(:data:`PL94_2020`), are in :mod:`census_workloads.pl94_2020` and :mod:`census_workloads.das2020`.

The workloads are unions of Kronecker products over the person-level CPH domain
(:func:`cph_domain`: sex, hispanic, race, relationship, age and optionally state), built from
one-attribute predicate sets (:mod:`census_workloads.predicates`) that are created once and
shared by every table. Nothing is ever dense over the full domain.

>>> from census_workloads import cph_domain, sf1_persons, sf1_plus, pl94
>>> cph_domain().size, sf1_persons().shape[0], sf1_plus().shape[0], pl94().shape[0]
(492660, 4151, 215852, 288)
>>> sf1_persons().labels[-1]
'PCT12A-O: Not Hispanic or Latino, Two or More Races'

Weighting
---------
A weight ``c`` on a workload multiplies its rows by ``c``, so in HDMM's objective, the total
squared error ``tr((A^T A)^+ W^T W)``, its Gram enters with ``c**2`` (its queries' squared
errors count ``c**2`` times).

* Per table: ``sf1_persons(weights={"P1": 2.0})`` (also :func:`sf1_plus` and :func:`pl94`);
  tables not named keep weight 1, unknown names raise ``ValueError``.
* PL94 inside SF1, the tutorial's ``c * PL94 + SF1``::

      hdmm.workload.union([sf1_persons(), pl94()], weights=[1.0, c])

  appends the 288 PL94 queries, multiplied by ``c``, to SF1. PL94's queries are also SF1
  queries (P1-P4 of PL94 are the queries of SF1's P8, P9, P10 and P11), so in this union they
  carry ``1 + c**2`` times their weight in SF1 alone; ``c = 0`` gives SF1 back.
"""

from .das2020 import PL94_2020, ProductionConfig, production_pl94
from .pl94 import PL94_TABLES, pl94, pl94_tables
from .pl94_2020 import PL94_2020_TABLES, pl94_2020, pl94_2020_domain, pl94_2020_tables
from .predicates import (
    adult,
    age1,
    age3,
    hispanic,
    identity,
    identity_total,
    not_hispanic,
    race1,
    race2,
    total,
    white_alone,
)
from .schema import AGE_LABELS, HISPANIC, RACES, RELATIONSHIP, SEX, STATES, cph_domain, race_label, race_mask
from .sf1 import SF1_TABLES, sf1_persons, sf1_plus, sf1_tables
from .synthetic import synthetic_persons

__all__ = [
    "AGE_LABELS",
    "HISPANIC",
    "PL94_2020",
    "PL94_2020_TABLES",
    "PL94_TABLES",
    "ProductionConfig",
    "RACES",
    "RELATIONSHIP",
    "SEX",
    "SF1_TABLES",
    "STATES",
    "adult",
    "age1",
    "age3",
    "cph_domain",
    "hispanic",
    "identity",
    "identity_total",
    "not_hispanic",
    "pl94",
    "pl94_2020",
    "pl94_2020_domain",
    "pl94_2020_tables",
    "pl94_tables",
    "race1",
    "race2",
    "race_label",
    "race_mask",
    "sf1_persons",
    "sf1_plus",
    "sf1_tables",
    "synthetic_persons",
    "total",
    "production_pl94",
    "white_alone",
]
