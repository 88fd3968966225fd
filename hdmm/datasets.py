"""Data sets shipped with hdmm, for examples, tests and benchmarks.

The files live in the package directory ``hdmm/data`` (see its ``README.md`` for
sources, licences and changes) and are read with :mod:`importlib.resources`, so they
work from an installed wheel as well as from a source checkout.

>>> from hdmm.datasets import load_adult
>>> df, domain = load_adult()
>>> df.shape, len(domain), int(domain.project(["sex"]).vectorize(df).sum())
((48842, 14), 14, 48842)
"""

from __future__ import annotations

from importlib import resources

import pandas as pd

from .domain import Domain

__all__ = ["load_adult"]


def load_adult() -> tuple[pd.DataFrame, Domain]:
    """The UCI Adult data set, discretised, with its domain.

    48,842 records extracted from the 1994 US Census database (the training and test
    parts of UCI *Adult* together), as discretised by the private-pgm project
    (Apache-2.0; see ``hdmm/data/README.md``).

    Returns
    -------
    df : pandas.DataFrame
        48,842 rows, one int64 column per attribute holding codes ``0..n-1``.
    domain : hdmm.Domain
        The 14 attributes, in column order, with their sizes (``age`` 85,
        ``workclass`` 9, ``fnlwgt`` 100, ``education-num`` 16, ``marital-status`` 7,
        ``occupation`` 15, ``relationship`` 6, ``race`` 5, ``sex`` 2,
        ``capital-gain`` 100, ``capital-loss`` 100, ``hours-per-week`` 99,
        ``native-country`` 42, ``income>50K`` 2) and no value labels: the codes are
        the values.  The full domain has about 6.4e17 cells, too many for a dense
        data vector, so vectorize a projection, e.g.
        ``domain.project(["age", "sex"]).vectorize(df)``.

    Raises
    ------
    ValueError
        If the shipped files disagree (a sign of a damaged installation).
    """
    data = resources.files(__package__) / "data"
    domain = Domain.from_json((data / "adult-domain.json").read_text(encoding="utf-8"))
    with (data / "adult.csv").open("rb") as f:
        df = pd.read_csv(f)
    if tuple(df.columns) != domain.names:
        raise ValueError(
            f"adult.csv has columns {list(df.columns)} but adult-domain.json has attributes "
            f"{list(domain.names)}; reinstall hdmm to restore the shipped files"
        )
    return df, domain
