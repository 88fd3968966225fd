"""Argument checks shared across hdmm (matrix classes, privacy, budgets): one place for each rule and its message.

Every check raises with a message that names the problem and the fix, before any work is
done (and, in a release, before any noise is drawn).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["DENSE_LIMIT", "PREVIEW_LIMIT", "ZERO_RTOL", "DenseLimitError", "check_dense_size", "check_norm",
           "check_width", "positive_int", "is_finite_real", "preview"]

#: Largest number of entries ``dense()`` and the dense fall-backs will materialise
#: (2**25 entries = 256 MiB of float64).
DENSE_LIMIT = 2**25


#: Relative cut-off below which a quantity that is zero in exact arithmetic (an eigenvalue of a
#: Gram relative to the largest, a trace relative to its total) counts as zero. The structure
#: classifier, the error formulas, the reconstruction and the SVD bound all use it, so they
#: agree on which directions a strategy measures (re-exported by :mod:`hdmm.structure`).
ZERO_RTOL = 1e-12


#: How many offending values an error message shows (see :func:`preview`).
PREVIEW_LIMIT = 5


def preview(values, limit: int = PREVIEW_LIMIT) -> str:
    """Up to ``limit`` values for an error message, as a list's ``repr`` (numpy scalars as Python's).

    >>> preview([1, "a", np.int64(3)]), preview(range(10))
    ("[1, 'a', 3]", '[0, 1, 2, 3, 4, ...]')
    """
    shown = []
    for i, v in enumerate(values):
        if i == limit:
            shown.append("...")
            break
        shown.append(repr(v.item() if isinstance(v, np.generic) else v))
    return "[" + ", ".join(shown) + "]"


def is_finite_real(value) -> bool:
    """Whether ``value`` is a finite real number (bools excluded, numpy's too).

    >>> is_finite_real(0.5), is_finite_real(True), is_finite_real(float("nan")), is_finite_real(10**400)
    (True, False, False, False)
    """
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the doubles (10**400)
        return False


class DenseLimitError(ValueError):
    """Raised when an operation would materialise a matrix larger than allowed."""


def check_dense_size(rows: int, cols: int, what: str, limit: int | None = None) -> None:
    """Refuse to form a dense ``rows x cols`` array above ``limit`` entries (default ``DENSE_LIMIT``)."""
    limit = DENSE_LIMIT if limit is None else limit
    if rows * cols > limit:
        raise DenseLimitError(
            f"{what} would form a dense {rows:,} x {cols:,} matrix ({rows * cols:,} entries), "
            f"above the limit of {limit:,} entries. Use the implicit operations "
            "(@, gram(), trace(), sensitivity(), to_linear_operator()) instead, or raise the "
            "limit explicitly (e.g. dense(max_entries=...)) if you have the memory."
        )


def check_norm(p: int) -> None:
    """Refuse a sensitivity norm other than 1 (Laplace noise) or 2 (Gaussian noise)."""
    if p not in (1, 2):
        raise ValueError(f"sensitivity norm p must be 1 (Laplace) or 2 (Gaussian), got {p!r}")


def check_width(f, A) -> None:
    """Refuse a workload factor ``f`` whose cells are not the strategy factor ``A``'s."""
    if f.shape[1] != A.shape[1]:
        raise ValueError(f"the workload has {f.shape[1]:,} cells but the strategy has {A.shape[1]:,}")


def positive_int(value, what: str) -> int:
    """``value`` as an ``int`` if it is a whole number >= 1 (bools refused), else a ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)
