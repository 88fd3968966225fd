"""Checks of the command line's inputs shared by plain and geography releases (``hdmm release``).

One place for each: the error type of bad arguments (:class:`UsageError`), that a file can be
created in a directory (:func:`probe_directory`), that Parquet can be read or written
(:func:`need_pyarrow`), and the records of a ``--data`` file (:func:`read_records`: one column per
name, at least one record). Each refuses with one message naming the problem and the fix, before
any noise is drawn or any budget is charged. No message shows a value read from the records: which
values (e.g. which units' codes) the data hold is private.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import pandas as pd

from .files import check_parent_directory

__all__ = ["UsageError", "probe_directory", "need_pyarrow", "read_records", "check_records_count"]


class UsageError(ValueError):
    """A problem with the command line's arguments."""


def probe_directory(path: str, option: str) -> None:
    """Raise unless a new file can be created in the directory of ``path`` (tries one)."""
    problem = check_parent_directory(path)
    if problem is not None:
        raise UsageError(f"{option} {path}: {problem}")


def need_pyarrow(doing: str, option: str) -> None:
    """Refuse, naming the extra to install, when pyarrow (Parquet) is missing."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UsageError(f"{option}: {doing} Parquet needs pyarrow: pip install 'hdmm[parquet]' (or use a .csv "
                         "file)") from None


def check_records_count(path: str, rows: int) -> None:
    """Refuse a ``--data`` file of no records (a release of no data publishes noise only)."""
    if rows == 0:
        raise UsageError(f"--data {path} holds no records (a header only?); a release of no data would publish "
                         "noise only, so nothing was measured")


def read_records(path: str, text_columns: Sequence[str] = ()) -> pd.DataFrame:
    """The records of a CSV or Parquet ``--data`` file, with the ``text_columns`` present read as text.

    Refused: a CSV header naming a column twice (pandas would rename the second one and the first
    would be released) and a file of no records (:func:`check_records_count`).
    """
    if path.endswith(".parquet"):
        need_pyarrow("reading", "--data")
        records = pd.read_parquet(path)
        present = [name for name in text_columns if name in records.columns]
        records = records.astype({name: str for name in present}) if present else records
    else:
        header = pd.read_csv(path, header=None, nrows=1, dtype=str).iloc[0].tolist() if os.path.getsize(path) else []
        repeated = sorted({str(c) for c in header if header.count(c) > 1})
        if repeated:  # pandas would rename the second "sex" to "sex.1" and release the first
            raise UsageError(f"--data {path} names column(s) {repeated} more than once: keep one column per attribute")
        present = [name for name in text_columns if name in header]
        records = pd.read_csv(path, dtype={name: str for name in present} or None)
    check_records_count(path, len(records))
    return records
