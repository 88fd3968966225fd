"""The person-level schema of the Census of Population and Housing (CPH).

Attributes, in significance order (the first is the most significant digit of a cell index):

============  ====  =========================================================================
attribute     size  values
============  ====  =========================================================================
sex           2     male, female
hispanic      2     Hispanic or Latino, Not Hispanic or Latino
race          63    code ``k - 1`` is the bit mask ``k = 1..63`` of the six OMB race flags
                    (White = bit 0, ..., Some Other Race = bit 5)
relationship  17    relationship to householder, then the two group-quarters types
age           115   0, 1, ..., 113, "114 and over"
state         51    the 50 states and the District of Columbia in FIPS order (optional)
============  ====  =========================================================================

The national domain has 2 * 2 * 63 * 17 * 115 = 492,660 cells; with states, 25,125,660.
"""

from __future__ import annotations

from functools import lru_cache

from hdmm.domain import Domain

__all__ = [
    "SEX",
    "HISPANIC",
    "RACES",
    "RELATIONSHIP",
    "AGE_LABELS",
    "STATES",
    "race_mask",
    "race_label",
    "cph_domain",
]

#: Sex, in code order.
SEX: tuple[str, ...] = ("male", "female")

#: Hispanic origin, in code order.
HISPANIC: tuple[str, ...] = ("Hispanic or Latino", "Not Hispanic or Latino")

#: The six OMB race flags; race ``RACES[b]`` is bit ``b`` of a race mask.
RACES: tuple[str, ...] = (
    "White",
    "Black or African American",
    "American Indian and Alaska Native",
    "Asian",
    "Native Hawaiian and Other Pacific Islander",
    "Some Other Race",
)

#: Relationship to householder (with the group-quarters types), in code order.
RELATIONSHIP: tuple[str, ...] = (
    "Householder",
    "Husband or wife",
    "Biological son or daughter",
    "Adopted son or daughter",
    "Stepson or stepdaughter",
    "Brother or sister",
    "Father or mother",
    "Grandchild",
    "Parent-in-law",
    "Son-in-law or daughter-in-law",
    "Other relative",
    "Roomer or boarder",
    "Housemate or roommate",
    "Unmarried partner",
    "Other nonrelative",
    "Institutionalized group quarters population",
    "Noninstitutionalized group quarters population",
)

#: Age in years, in code order; the last value is top-coded.
AGE_LABELS: tuple[str, ...] = tuple(str(a) for a in range(114)) + ("114 and over",)

#: ``(FIPS code, name)`` of the 50 states and the District of Columbia, in FIPS code order.
STATES: tuple[tuple[str, str], ...] = (
    ("01", "Alabama"),
    ("02", "Alaska"),
    ("04", "Arizona"),
    ("05", "Arkansas"),
    ("06", "California"),
    ("08", "Colorado"),
    ("09", "Connecticut"),
    ("10", "Delaware"),
    ("11", "District of Columbia"),
    ("12", "Florida"),
    ("13", "Georgia"),
    ("15", "Hawaii"),
    ("16", "Idaho"),
    ("17", "Illinois"),
    ("18", "Indiana"),
    ("19", "Iowa"),
    ("20", "Kansas"),
    ("21", "Kentucky"),
    ("22", "Louisiana"),
    ("23", "Maine"),
    ("24", "Maryland"),
    ("25", "Massachusetts"),
    ("26", "Michigan"),
    ("27", "Minnesota"),
    ("28", "Mississippi"),
    ("29", "Missouri"),
    ("30", "Montana"),
    ("31", "Nebraska"),
    ("32", "Nevada"),
    ("33", "New Hampshire"),
    ("34", "New Jersey"),
    ("35", "New Mexico"),
    ("36", "New York"),
    ("37", "North Carolina"),
    ("38", "North Dakota"),
    ("39", "Ohio"),
    ("40", "Oklahoma"),
    ("41", "Oregon"),
    ("42", "Pennsylvania"),
    ("44", "Rhode Island"),
    ("45", "South Carolina"),
    ("46", "South Dakota"),
    ("47", "Tennessee"),
    ("48", "Texas"),
    ("49", "Utah"),
    ("50", "Vermont"),
    ("51", "Virginia"),
    ("53", "Washington"),
    ("54", "West Virginia"),
    ("55", "Wisconsin"),
    ("56", "Wyoming"),
)


def race_mask(code: int) -> int:
    """The bit mask of OMB race flags held by race code ``code`` (``0..62``).

    Parameters
    ----------
    code
        A race code of the CPH domain.

    Returns
    -------
    int
        The mask ``code + 1``; bit ``b`` set means race ``RACES[b]``.
    """
    return code + 1


def race_label(mask: int) -> str:
    """The races of a bit mask joined by ``"; "``, e.g. ``race_label(9) == "White; Asian"``.

    Parameters
    ----------
    mask
        A non-empty combination of race flags, ``1..63``.

    Returns
    -------
    str
        The race names in flag order.
    """
    return "; ".join(race for bit, race in enumerate(RACES) if mask >> bit & 1)


@lru_cache(maxsize=None)
def cph_domain(state: bool = False) -> Domain:
    """The person-level CPH domain.

    Parameters
    ----------
    state
        Append the ``state`` attribute (51 values, labelled by name in FIPS order).

    Returns
    -------
    hdmm.domain.Domain
        Attributes sex, hispanic, race, relationship, age (and state), with value labels;
        492,660 cells, or 25,125,660 with states.
    """
    values: dict[str, tuple[str, ...]] = {
        "sex": SEX,
        "hispanic": HISPANIC,
        "race": tuple(race_label(race_mask(code)) for code in range(2 ** len(RACES) - 1)),
        "relationship": RELATIONSHIP,
        "age": AGE_LABELS,
    }
    if state:
        values["state"] = tuple(name for _, name in STATES)
    return Domain(list(values), [len(v) for v in values.values()], values)
