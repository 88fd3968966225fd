"""Shared machinery: person tables as unions of Kronecker products over the CPH domain.

A table is written as a list of *products*, each a mapping ``{attribute: predicate set}``;
attributes a product does not name get :func:`~census_workloads.predicates.total`, except the
optional ``state`` attribute, which gets the state IdentityTotal (one query per state, then
the national total) so that every product is crossed with geography.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hdmm.matrix import Kronecker, Matrix, VStack
from hdmm.workload import union

from .predicates import adult, identity_total, total
from .schema import cph_domain

__all__ = ["ProductSpec", "kron", "table", "adults", "weighted_union"]

#: One Kronecker product: the predicate set of each conditioned attribute.
ProductSpec = Mapping[str, Matrix]


def _default(attribute: str) -> Matrix:
    """The factor of an attribute a product does not name."""
    return identity_total(attribute) if attribute == "state" else total(attribute)


def kron(product: ProductSpec, state: bool = False) -> Kronecker:
    """The Kronecker product of ``product`` over the whole CPH domain.

    Parameters
    ----------
    product
        Predicate sets of the conditioned attributes.
    state
        Work over ``cph_domain(state=True)``, crossing the product with the state IdentityTotal.

    Returns
    -------
    hdmm.matrix.Kronecker
        Factors in domain order, labels joined by ``", "`` without attribute names.
    """
    names = cph_domain(state).names
    unknown = set(product) - set(names)
    if unknown:
        raise ValueError(f"unknown attributes {sorted(unknown)}; the attributes are {list(names)}")
    return Kronecker([product[name] if name in product else _default(name) for name in names], sep=", ")


def table(products: Sequence[ProductSpec], state: bool = False) -> VStack:
    """A table: the rows of its products, in order.

    Parameters
    ----------
    products
        The table's products.
    state
        See :func:`kron`.

    Returns
    -------
    hdmm.matrix.VStack
        One block per product.
    """
    return VStack([kron(product, state) for product in products])


def adults(products: Sequence[ProductSpec]) -> list[ProductSpec]:
    """The same products restricted to "18 years and over".

    Parameters
    ----------
    products
        Products that place no condition on age.

    Returns
    -------
    list of ProductSpec
        Each product with the age factor :func:`~census_workloads.predicates.adult`.
    """
    return [{**product, "age": adult()} for product in products]


def weighted_union(
    tables: Mapping[str, Matrix], weights: Mapping[str, float] | None = None, prefix: str = ""
) -> Matrix:
    """The union of named tables, each optionally weighted, rows in table order.

    Parameters
    ----------
    tables
        Tables by name.
    weights
        Weight of some tables by name (others get 1): the table's rows are multiplied by it.
    prefix
        Put before each table name in the row labels (e.g. ``"PL94 "``).

    Returns
    -------
    hdmm.matrix.Matrix
        A :class:`~hdmm.matrix.VStack` whose row labels read ``"<prefix><name>: <query>"``.

    Raises
    ------
    ValueError
        If ``weights`` names a table that is not in ``tables``.
    """
    weights = {} if weights is None else dict(weights)
    unknown = [name for name in weights if name not in tables]
    if unknown:
        raise ValueError(f"unknown table name(s) {unknown}; the tables are {list(tables)}")
    return union(
        list(tables.values()),
        weights=[float(weights.get(name, 1.0)) for name in tables],
        names=[f"{prefix}{name}" for name in tables],
    )
