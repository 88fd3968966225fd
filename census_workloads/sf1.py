"""The 2010 Census Summary File 1 (SF1) person tables, and SF1+ (SF1 by state).

Twelve tables, 4,151 predicate counting queries over the national CPH domain
(:func:`sf1_persons`); crossed with the state IdentityTotal they give SF1+, 4,151 * 52 =
215,852 queries over the domain with states (:func:`sf1_plus`). Row labels read like
``"P12: female, 22 to 24 years"``; in SF1+ the state comes last
(``"P12: female, 22 to 24 years, Alabama"``) and the national rows simply omit it
(``"P12: female, 22 to 24 years"``), like every other total.
"""

from __future__ import annotations

from typing import Mapping

from hdmm.matrix import Matrix

from .predicates import (
    age1,
    age3,
    hispanic,
    identity,
    identity_total,
    not_hispanic,
    race1,
    race2,
    white_alone,
)
from .tables import ProductSpec, adults, table, weighted_union

__all__ = ["SF1_TABLES", "sf1_tables", "sf1_persons", "sf1_plus"]

#: The SF1 person tables, in order.
SF1_TABLES: tuple[str, ...] = (
    "P1", "P3", "P4", "P5", "P8", "P9", "P10", "P11", "P12", "P12A-I", "PCT12", "PCT12A-O"
)


def _sex_by_age(age: Matrix, groups: list[ProductSpec]) -> list[ProductSpec]:
    """Sex by age within each group: ``(Identity, group, age) + (IdentityTotal, group, Total)``."""
    return [
        product
        for group in groups
        for product in (
            {**group, "sex": identity("sex"), "age": age},
            {**group, "sex": identity_total("sex")},
        )
    ]


def _products() -> dict[str, list[ProductSpec]]:
    """The products of every SF1 person table (SF1_PERSONS.md), by table name."""
    total_population: list[ProductSpec] = [{}]
    by_hispanic = {"hispanic": identity("hispanic")}
    race_detail = [{"race": race2()}, *total_population]
    hispanic_by_race = [by_hispanic, {"hispanic": not_hispanic(), "race": race2()}, *total_population]
    groups = [{"race": race1()}, {"hispanic": hispanic()}]
    return {
        "P1": total_population,
        "P3": [{"race": race1()}, *total_population],
        "P4": [by_hispanic, *total_population],
        "P5": [{**by_hispanic, "race": race1()}, {"hispanic": identity_total("hispanic")}],
        "P8": race_detail,
        "P9": hispanic_by_race,
        "P10": adults(race_detail),
        "P11": adults(hispanic_by_race),
        "P12": _sex_by_age(age1(), [{}]),
        "P12A-I": _sex_by_age(age1(), [*groups, {"hispanic": not_hispanic(), "race": white_alone()}]),
        "PCT12": _sex_by_age(age3(), [{}]),
        "PCT12A-O": _sex_by_age(age3(), [*groups, {"hispanic": not_hispanic(), "race": race1()}]),
    }


def sf1_tables(state: bool = False) -> dict[str, Matrix]:
    """Every SF1 person table by name, in :data:`SF1_TABLES` order.

    Parameters
    ----------
    state
        Build over ``cph_domain(state=True)``, each product crossed with the state
        IdentityTotal (52 times the queries).

    Returns
    -------
    dict of str to hdmm.matrix.Matrix
        ``{"P1": ..., "P3": ..., ..., "PCT12A-O": ...}``; each a VStack of Kronecker products
        with 1, 8, 3, 17, 71, 73, 71, 73, 49, 441, 209 and 3,135 queries (without state).
    """
    return {name: table(products, state) for name, products in _products().items()}


def sf1_persons(weights: Mapping[str, float] | None = None) -> Matrix:
    """The SF1 person workload: the union of :func:`sf1_tables` (4,151 queries).

    Parameters
    ----------
    weights
        Optional weight per table name, e.g. ``{"P1": 2.0}``; other tables get 1.

    Returns
    -------
    hdmm.matrix.Matrix
        4,151 x 492,660, rows in table order, labels like ``"P12: female, 22 to 24 years"``.

    Raises
    ------
    ValueError
        If ``weights`` names an unknown table.
    """
    return weighted_union(sf1_tables(), weights)


def sf1_plus(weights: Mapping[str, float] | None = None) -> Matrix:
    """SF1+: every SF1 product crossed with the state IdentityTotal (215,852 queries).

    Parameters
    ----------
    weights
        Optional weight per table name, as for :func:`sf1_persons`.

    Returns
    -------
    hdmm.matrix.Matrix
        215,852 x 25,125,660 over ``cph_domain(state=True)``; labels like
        ``"P12: female, 22 to 24 years, Alabama"``, national rows without a state.

    Raises
    ------
    ValueError
        If ``weights`` names an unknown table.
    """
    return weighted_union(sf1_tables(state=True), weights)
