"""One-attribute predicate sets of the SF1 and PL94-171 person tables.

Each set is an hdmm matrix over the values of one attribute of
:func:`~census_workloads.schema.cph_domain`, with row labels worded like the published tables
("Under 5 years", "White alone", "Two or More Races", ...). Totals are ``hdmm.workload.Total``,
whose rows carry no condition, so a Kronecker product leaves them out of its labels.

Every set is built once and cached: tables and their unions share the very same factor
objects, which lets hdmm do per-factor work (Grams, traces) once per distinct factor.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np
from hdmm.matrix import Explicit, Ones, VStack
from hdmm.workload import Predicates, Total

from .schema import RACES, cph_domain, race_label, race_mask

__all__ = [
    "total",
    "identity",
    "identity_total",
    "hispanic",
    "not_hispanic",
    "race1",
    "race2",
    "white_alone",
    "adult",
    "age1",
    "age3",
]

_MASKS = np.array([race_mask(code) for code in range(2 ** len(RACES) - 1)])
_RACE_COUNTS = np.array([mask.bit_count() for mask in _MASKS.tolist()])
_AGES = np.arange(cph_domain()["age"])
_AGE1_BOUNDS = (
    0, 5, 10, 15, 18, 20, 21, 22, 25, 30, 35, 40, 45, 50, 55, 60, 62, 65, 67, 70, 75, 80, 85, _AGES.size
)
_AGE3_BOUNDS = (*range(101), 105, 110, _AGES.size)
_ADULT_BOUNDS = (18, _AGES.size)
_NUMBERS = ("one", "two", "three", "four", "five", "six")
_TWO_OR_MORE = "Two or More Races"


def _predicates(rows: Sequence[tuple[str, np.ndarray]]) -> Explicit:
    """A 0/1 predicate matrix from ``(label, boolean membership over the values)`` rows."""
    matrix = np.array([member for _, member in rows], dtype=float)
    return Predicates(matrix, labels=[label for label, _ in rows])


@lru_cache(maxsize=None)
def total(attribute: str) -> Ones:
    """The single query counting every value of ``attribute``.

    Parameters
    ----------
    attribute
        An attribute of ``cph_domain(state=True)``.

    Returns
    -------
    hdmm.matrix.Ones
        A ``1 x n`` all-ones matrix (its row has no condition in labels).
    """
    return Total(cph_domain(state=True)[attribute])


@lru_cache(maxsize=None)
def identity(attribute: str) -> Explicit:
    """One query per value of ``attribute``, labelled by the value (e.g. ``"female"``).

    Parameters
    ----------
    attribute
        An attribute of ``cph_domain(state=True)``.

    Returns
    -------
    hdmm.matrix.Explicit
        The ``n x n`` identity as a labelled predicate matrix.
    """
    domain = cph_domain(state=True)
    return Predicates(np.eye(domain[attribute]), labels=[str(v) for v in domain.values(attribute)])


@lru_cache(maxsize=None)
def identity_total(attribute: str) -> VStack:
    """:func:`identity` followed by :func:`total` (``n + 1`` queries).

    Parameters
    ----------
    attribute
        An attribute of ``cph_domain(state=True)``.

    Returns
    -------
    hdmm.matrix.VStack
        The per-value queries, then the unconditioned total.
    """
    return VStack([identity(attribute), total(attribute)])


@lru_cache(maxsize=None)
def _hispanic_value(code: int) -> Explicit:
    """The single query "hispanic == code", labelled by the value."""
    return _predicates([(str(cph_domain().values("hispanic")[code]), np.arange(2) == code)])


def hispanic() -> Explicit:
    """The single query "Hispanic or Latino".

    Returns
    -------
    hdmm.matrix.Explicit
        A ``1 x 2`` predicate matrix.
    """
    return _hispanic_value(0)


def not_hispanic() -> Explicit:
    """The single query "Not Hispanic or Latino".

    Returns
    -------
    hdmm.matrix.Explicit
        A ``1 x 2`` predicate matrix.
    """
    return _hispanic_value(1)


def _race_group(mask: int) -> str:
    """The published label of one race combination: "White alone" or "White; Asian"."""
    return f"{race_label(mask)} alone" if mask.bit_count() == 1 else race_label(mask)


def _races(k: int) -> str:
    """The published label of "exactly ``k`` races"."""
    return "Population of one race" if k == 1 else f"{_NUMBERS[k - 1].capitalize()} races"


@lru_cache(maxsize=None)
def race1() -> Explicit:
    """The six races alone and "Two or More Races" (7 queries, a partition of the 63 codes).

    Returns
    -------
    hdmm.matrix.Explicit
        A ``7 x 63`` predicate matrix.
    """
    alone = [(_race_group(1 << bit), _MASKS == 1 << bit) for bit in range(len(RACES))]
    return _predicates(alone + [(_TWO_OR_MORE, _RACE_COUNTS >= 2)])


@lru_cache(maxsize=None)
def race2() -> Explicit:
    """Race detail (70 queries).

    The 63 combinations (a partition), the six counts "exactly k races" (a partition), then
    "Two or More Races".

    Returns
    -------
    hdmm.matrix.Explicit
        A ``70 x 63`` predicate matrix.
    """
    combinations = [(_race_group(int(mask)), _MASKS == mask) for mask in _MASKS]
    counts = [(_races(k), _RACE_COUNTS == k) for k in range(1, len(RACES) + 1)]
    return _predicates(combinations + counts + [(_TWO_OR_MORE, _RACE_COUNTS >= 2)])


@lru_cache(maxsize=None)
def white_alone() -> Explicit:
    """The single query "White alone" (race mask 1).

    Returns
    -------
    hdmm.matrix.Explicit
        A ``1 x 63`` predicate matrix.
    """
    return _predicates([(_race_group(1), _MASKS == 1)])


def _years(n: int) -> str:
    return f"{n} year" if n == 1 else f"{n} years"


def _age_label(lo: int, hi: int) -> str:
    """The published label of the ages ``[lo, hi)``, e.g. "Under 5 years", "18 and 19 years"."""
    if lo == 0:
        return f"Under {_years(hi)}"
    if hi == _AGES.size:
        return f"{lo} years and over"
    if hi - lo == 1:
        return _years(lo)
    if hi - lo == 2:
        return f"{lo} and {lo + 1} years"
    return f"{lo} to {hi - 1} years"


def _age_ranges(bounds: Sequence[int]) -> Explicit:
    """The consecutive age ranges ``[bounds[i], bounds[i + 1])`` as labelled predicates."""
    return _predicates(
        [(_age_label(lo, hi), (_AGES >= lo) & (_AGES < hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]
    )


@lru_cache(maxsize=None)
def adult() -> Explicit:
    """The single query "18 years and over".

    Returns
    -------
    hdmm.matrix.Explicit
        A ``1 x 115`` predicate matrix.
    """
    return _age_ranges(_ADULT_BOUNDS)


@lru_cache(maxsize=None)
def age1() -> Explicit:
    """The 23 age ranges of P12, "Under 5 years" to "85 years and over" (a partition).

    Returns
    -------
    hdmm.matrix.Explicit
        A ``23 x 115`` predicate matrix.
    """
    return _age_ranges(_AGE1_BOUNDS)


@lru_cache(maxsize=None)
def age3() -> Explicit:
    """The 103 ages of PCT12: "Under 1 year", ..., "99 years", then three 5-year ranges.

    The last range is "110 years and over"; the set is a partition.

    Returns
    -------
    hdmm.matrix.Explicit
        A ``103 x 115`` predicate matrix.
    """
    return _age_ranges(_AGE3_BOUNDS)
