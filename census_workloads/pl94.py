"""The PL94-171 redistricting person tables P1-P4 (288 queries).

Row labels carry a ``"PL94 "`` prefix (``"PL94 P2: Not Hispanic or Latino, White alone"``) so
that they stay distinct from SF1's tables of the same name in a combined workload.
"""

from __future__ import annotations

from typing import Mapping

from hdmm.matrix import Matrix

from .predicates import identity, not_hispanic, race2
from .tables import ProductSpec, adults, table, weighted_union

__all__ = ["PL94_TABLES", "pl94_tables", "pl94"]

#: The PL94-171 person tables, in order.
PL94_TABLES: tuple[str, ...] = ("P1", "P2", "P3", "P4")


def _products() -> dict[str, list[ProductSpec]]:
    """The products of every PL94-171 person table (SF1_PERSONS.md), by table name."""
    race = [{}, {"race": race2()}]
    hispanic_by_race = [{}, {"hispanic": identity("hispanic")}, {"hispanic": not_hispanic(), "race": race2()}]
    return {"P1": race, "P2": hispanic_by_race, "P3": adults(race), "P4": adults(hispanic_by_race)}


def pl94_tables(state: bool = False) -> dict[str, Matrix]:
    """The PL94-171 person tables by name, in :data:`PL94_TABLES` order.

    Parameters
    ----------
    state
        Build over ``cph_domain(state=True)``, each product crossed with the state
        IdentityTotal (52 times the queries).

    Returns
    -------
    dict of str to hdmm.matrix.Matrix
        ``{"P1": ..., "P4": ...}`` with 71, 73, 71 and 73 queries (without state).
    """
    return {name: table(products, state) for name, products in _products().items()}


def pl94(weights: Mapping[str, float] | None = None, state: bool = False) -> Matrix:
    """The PL94-171 person workload: the union of :func:`pl94_tables` (288 queries).

    Parameters
    ----------
    weights
        Optional weight per table name (``"P1"`` to ``"P4"``); other tables get 1.
    state
        See :func:`pl94_tables`.

    Returns
    -------
    hdmm.matrix.Matrix
        288 x 492,660 (without state), labels like ``"PL94 P1: White alone"``.

    Raises
    ------
    ValueError
        If ``weights`` names an unknown table.
    """
    return weighted_union(pl94_tables(state), weights, prefix="PL94 ")
