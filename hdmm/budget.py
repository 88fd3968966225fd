r"""A privacy budget across releases: a total, the charges made against it, and a file that keeps them.

One release spends its privacy definition once (:mod:`hdmm.privacy`). Several releases about the
same people compose, and :class:`Budget` does the accounting: it holds a **total**, pure DP
(``PureDP(epsilon)``) or zCDP (``ZCDP(rho)``), and the list of **charges** made against it. A
release given ``budget=`` (:func:`hdmm.run`, :func:`hdmm.measure`) is charged before any noise
is drawn, and refused (:class:`BudgetExceeded`) when the charge would take the spent amount
above the total.

Composition rules (what one release costs):

==================================  ==========================  =================================
release                             pure-DP budget (epsilon)    zCDP budget (rho)
==================================  ==========================  =================================
``PureDP(epsilon)``                 ``epsilon``                 ``epsilon**2 / 2``
``ZCDP(rho)``                       refused                     ``rho``
``ApproxDP(epsilon, delta)``        refused                     ``zcdp_rho(epsilon, delta)``
==================================  ==========================  =================================

* Pure DP composes by adding epsilons (Dwork, McSherry, Nissim & Smith 2006); zCDP by adding
  rho (Bun & Steinke 2016, Lemma 2.3).
* An epsilon-DP release is ``epsilon**2 / 2``-zCDP (Bun & Steinke 2016, Proposition 1.4).
* hdmm's ``ApproxDP(epsilon, delta)`` adds discrete Gaussian noise calibrated through zCDP: it is
  :math:`\rho^*`-zCDP with :math:`\rho^*` = :func:`hdmm.privacy.zcdp_rho` ``(epsilon, delta)``
  (Canonne, Kamath & Steinke 2020, Theorem 14; its noise is a hair larger than that rho needs),
  and this rho is what a zCDP budget is charged.
* Gaussian releases (``ZCDP``, ``ApproxDP``) are not pure DP for any epsilon, so a pure-DP budget
  refuses them (:class:`BudgetError`); an ``(epsilon, delta)`` total does not compose by
  addition either, so a budget is never kept in ``(epsilon, delta)``: make a zCDP budget whose
  total implies the ``(epsilon, delta)`` you want with :meth:`Budget.from_approx_dp`.
* A zCDP budget reports what it has spent as ``(epsilon, delta)``-DP by the same conversion
  (:meth:`Budget.epsilon_at`, :func:`zcdp_epsilon`; Canonne, Kamath & Steinke 2020, Corollary 13).

Sums are exact (rational arithmetic on the stored floats), and a charge fits when the sum exceeds
the total by at most a relative ``BUDGET_RTOL`` (1e-12), so that a total split into decimal parts
(``0.1 + 0.2 + 0.7``) is spent exactly; the overspend this allows is below 1e-12 of the total.

A budget kept in a file (:meth:`Budget.save`, :meth:`Budget.load`, ``hdmm budget create``) stays
attached to it: every charge is written to the file, atomically (a temporary file, flushed to
disk, then renamed over the old one), **before** the measurement it pays for draws any noise.
A measurement that fails after its charge was written (an error, a crash, a killed process)
therefore leaves a recorded charge: the budget may over-count, never under-count. A charge is
recorded with status ``"charged"`` and marked ``"released"`` by :meth:`Budget.settle` once the
release is complete; both count. A file changed by someone else since it was read (say, two
releases at once) is refused rather than overwritten: the file is read, checked against what this
budget last read or wrote, and replaced under an exclusive advisory lock (``flock``) on its
directory, so no two writers can both pass the check and one of their charges be lost. The lock is
POSIX; elsewhere only the check is made. A :class:`Budget` object itself is not thread-safe: give
each thread its own (:meth:`Budget.load`).

>>> b = Budget(PureDP(3.0))
>>> b.charge(PureDP(1.0), workload="sf1").cost
1.0
>>> b.spent, b.remaining
(1.0, 2.0)
>>> z = Budget(ZCDP(1.0))
>>> z.cost(PureDP(1.0))
0.5
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import tempfile
import time
import warnings
from fractions import Fraction
from typing import Any, Iterator, Mapping

try:
    import fcntl
except ImportError:  # not POSIX (Windows): the digest check alone guards the file
    fcntl = None

from .privacy import ZCDP, ApproxDP, Privacy, PureDP, zcdp_delta, zcdp_rho
from .validation import is_finite_real

__all__ = ["Budget", "Charge", "BudgetError", "BudgetExceeded", "zcdp_epsilon", "settle_quietly", "BUDGET_RTOL",
           "MAX_BUDGET_BYTES", "BUDGET_FORMAT", "BUDGET_VERSION"]

#: A charge fits when the charges' exact sum exceeds the total by at most this relative amount.
BUDGET_RTOL = 1e-12

#: Largest budget file :meth:`Budget.load` reads (bytes): enough for about 200,000 charges.
MAX_BUDGET_BYTES = 64 * 1024**2

#: The ``format`` entry of a budget file.
BUDGET_FORMAT = "hdmm-budget"

#: The budget file version this hdmm writes and reads.
BUDGET_VERSION = 1

#: Seconds a budget write waits for another process's budget write in the same directory to finish.
LOCK_TIMEOUT = 60.0

#: A charge's status: recorded before measuring, or known to have finished.
STATUSES = ("charged", "released")

_CHARGE_KEYS = {"number", "time", "workload", "privacy", "charge", "unit", "status", "output"}
_TOP_KEYS = {"format", "version", "total", "delta", "created", "charges"}


class BudgetError(ValueError):
    """A release that cannot be charged to a budget (it does not compose with it), or a budget misused."""


class BudgetExceeded(BudgetError):
    """A release whose charge would take a budget's spending above its total."""


def zcdp_epsilon(rho: float, delta: float) -> float:
    r"""The smallest epsilon for which :math:`\rho`-zCDP implies :math:`(\epsilon, \delta)`-DP by :func:`hdmm.privacy.zcdp_delta`.

    The inverse in epsilon of the conversion of Canonne, Kamath & Steinke (2020, Corollary 13),
    found by bisection (the delta it gives decreases with epsilon) and rounded up: the epsilon
    returned always satisfies ``zcdp_delta(rho, epsilon) <= delta``. It is at most the classical
    :math:`\rho + 2\sqrt{\rho \ln(1/\delta)}` (Bun & Steinke 2016). ``rho = 0`` gives 0.

    >>> eps = zcdp_epsilon(0.5, 1e-6)
    >>> round(eps, 3), zcdp_delta(0.5, eps) <= 1e-6
    (5.222, True)
    """
    if not (is_finite_real(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite number >= 0, got {rho!r}")
    if not (is_finite_real(delta) and 0 < delta < 1):
        raise ValueError(f"delta must be a number in (0, 1), got {delta!r}")
    if rho == 0:
        return 0.0
    hi = rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))
    while zcdp_delta(rho, hi) > delta:  # the classical bound is never tighter; guard against rounding
        hi *= 2.0
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi or hi - lo <= 1e-15 * hi:
            break
        if mid > 0 and zcdp_delta(rho, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def _entries_problem(d: Mapping, allowed: set, required: set) -> str:
    """``"unknown entries [...]"`` or ``"missing entries [...]"`` for a JSON object's keys, or ``""``."""
    unknown, missing = set(d) - allowed, required - set(d)
    if unknown:
        return f"unknown entries {sorted(unknown)}"
    return f"missing entries {sorted(missing)}" if missing else ""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _amount(privacy: Privacy) -> float:
    """The parameter a budget of this kind is counted in."""
    return privacy.epsilon if isinstance(privacy, PureDP) else privacy.rho


# ====================================================================== charges
@dataclasses.dataclass(frozen=True)
class Charge:
    """One charge against a budget: what was released, under which privacy, and what it cost.

    Attributes
    ----------
    number : int
        Its place in the budget's list (1, 2, ...).
    time : str
        When it was charged (ISO 8601, UTC), before the measurement drew its noise.
    workload : str
        What was released (a workload name or description).
    privacy : Privacy
        The release's privacy definition.
    cost : float
        What it cost, in the budget's unit (``"epsilon"`` or ``"rho"``; see :class:`Budget`).
    unit : str
        ``"epsilon"`` (a pure-DP budget) or ``"rho"`` (a zCDP budget).
    status : str
        ``"charged"`` (recorded before the measurement; a release that failed or is still running
        stays so) or ``"released"`` (the release finished, :meth:`Budget.settle`). Both count.
    output : str or None
        Where the release was written, if it was (set by :meth:`Budget.settle`).
    """

    number: int
    time: str
    workload: str
    privacy: Privacy
    cost: float
    unit: str
    status: str = "charged"
    output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The charge as a budget file lists it (``charge`` is the cost)."""
        return {"number": self.number, "time": self.time, "workload": self.workload,
                "privacy": self.privacy.to_dict(), "charge": self.cost, "unit": self.unit, "status": self.status,
                "output": self.output}

    @staticmethod
    def from_dict(d: Any, source: str = "the budget file") -> Charge:
        """A charge from :meth:`to_dict` output, checked field by field (one ``ValueError`` naming ``source``)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: a charge must be a JSON object, got {type(d).__name__}")
        problem = _entries_problem(d, _CHARGE_KEYS, _CHARGE_KEYS - {"output"})
        if problem:
            raise ValueError(f"{source}: a charge has {problem}")
        number, cost = d["number"], d["charge"]
        if not (isinstance(number, int) and not isinstance(number, bool) and number >= 1):
            raise ValueError(f"{source}: a charge's number must be a whole number >= 1, got {number!r}")
        if not (is_finite_real(cost) and cost >= 0):
            raise ValueError(f"{source}: charge {number}'s cost must be a finite number >= 0, got {cost!r}")
        for key in ("time", "workload"):
            if not isinstance(d[key], str):
                raise ValueError(f"{source}: charge {number}'s {key} must be text, got {d[key]!r}")
        if d["unit"] not in ("epsilon", "rho"):
            raise ValueError(f"{source}: charge {number}'s unit must be 'epsilon' or 'rho', got {d['unit']!r}")
        if d["status"] not in STATUSES:
            raise ValueError(f"{source}: charge {number}'s status must be one of {list(STATUSES)}, got {d['status']!r}")
        output = d.get("output")
        if output is not None and not isinstance(output, str):
            raise ValueError(f"{source}: charge {number}'s output must be text or null, got {output!r}")
        privacy = _privacy_from(d["privacy"], f"{source}: charge {number}'s privacy")
        return Charge(number=number, time=d["time"], workload=d["workload"], privacy=privacy, cost=float(cost),
                      unit=d["unit"], status=d["status"], output=output)


def _same_charge(a: Charge, b: Charge) -> bool:
    """Whether two records are of the same charge (its status and output may differ)."""
    return (a.number, a.time, a.workload, a.privacy, a.cost) == (b.number, b.time, b.workload, b.privacy, b.cost)


def _privacy_from(d: Any, where: str) -> Privacy:
    if not isinstance(d, Mapping):
        raise ValueError(f"{where} must be a JSON object such as {{\"type\": \"PureDP\", \"epsilon\": 1}}, got {d!r}")
    try:
        return Privacy.from_dict(d)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} is not valid: {exc}") from None


# ====================================================================== the budget
class Budget:
    r"""A privacy budget across releases: a total in pure DP or zCDP and the charges against it.

    See the module docstring for the composition rules. A budget's total never changes; its
    charges only grow, by :meth:`charge` (which :func:`hdmm.run` and :func:`hdmm.measure` call
    when given ``budget=``, before any noise is drawn).

    Parameters
    ----------
    total
        ``PureDP(epsilon)``: a pure-DP budget of ``epsilon``. ``ZCDP(rho)``: a zCDP budget of
        ``rho``. For an ``(epsilon, delta)`` total use :meth:`from_approx_dp`.
    delta
        zCDP budgets only: the delta at which :meth:`summary` and :meth:`epsilon_at` state the
        budget as ``(epsilon, delta)``-DP (set by :meth:`from_approx_dp`).

    Raises
    ------
    BudgetError
        For an ``ApproxDP`` total, or a ``delta`` with a pure-DP total.

    Examples
    --------
    >>> b = Budget.from_approx_dp(3.0, 1e-6)
    >>> b.total == ZCDP(zcdp_rho(3.0, 1e-6)), b.unit
    (True, 'rho')
    >>> charge = b.charge(ApproxDP(1.0, 1e-6), workload="adult")
    >>> round(charge.cost, 5), round(b.epsilon_at(), 3) <= 3.0
    (0.02436, True)
    >>> Budget(PureDP(1.0)).charge(ZCDP(0.1))
    Traceback (most recent call last):
    ...
    hdmm.budget.BudgetError: a zCDP, rho=0.1 release (Gaussian noise) cannot be charged to a pure-DP budget: Gaussian noise is not pure DP for any epsilon; keep a zCDP budget for Gaussian releases (Budget(ZCDP(rho)), Budget.from_approx_dp, or hdmm budget create FILE --rho R)
    """

    __slots__ = ("_total", "_delta", "_charges", "_created", "_path", "_digest")

    def __init__(self, total: Privacy, *, delta: float | None = None) -> None:
        if isinstance(total, ApproxDP):
            raise BudgetError(
                f"a budget cannot be kept in (epsilon, delta): {total.description} totals do not add up; make a "
                f"zCDP budget that implies it, Budget.from_approx_dp({total.epsilon:g}, {total.delta:g})"
            )
        if not isinstance(total, (PureDP, ZCDP)):
            raise TypeError(f"a budget's total must be PureDP(epsilon) or ZCDP(rho), got {type(total).__name__}")
        if delta is not None:
            if isinstance(total, PureDP):
                raise BudgetError("delta applies to zCDP budgets only (a pure-DP budget is (epsilon, 0)-DP)")
            if not (is_finite_real(delta) and 0 < delta < 1):
                raise BudgetError(f"delta must be a number in (0, 1), got {delta!r}")
            delta = float(delta)
        self._total: Privacy = total
        self._delta = delta
        self._charges: tuple[Charge, ...] = ()
        self._created = _now()
        self._path: str | None = None
        self._digest: str | None = None

    @classmethod
    def from_approx_dp(cls, epsilon: float, delta: float) -> Budget:
        r"""A zCDP budget whose total implies :math:`(\epsilon, \delta)`-DP: rho = :func:`hdmm.privacy.zcdp_rho`.

        Releases of any kind charged to it (pure DP, zCDP, ``ApproxDP``) together satisfy
        :math:`(\epsilon, \delta)`-DP while it is not exceeded.
        """
        return cls(ZCDP(zcdp_rho(epsilon, delta)), delta=delta)

    # ------------------------------------------------------------------ state
    @property
    def total(self) -> Privacy:
        """The total: ``PureDP(epsilon)`` or ``ZCDP(rho)``."""
        return self._total

    @property
    def unit(self) -> str:
        """``"epsilon"`` for a pure-DP budget, ``"rho"`` for a zCDP budget."""
        return "epsilon" if isinstance(self._total, PureDP) else "rho"

    @property
    def delta(self) -> float | None:
        """The delta of the budget's ``(epsilon, delta)`` statement (zCDP budgets made by :meth:`from_approx_dp`)."""
        return self._delta

    @property
    def charges(self) -> tuple[Charge, ...]:
        """Every charge so far, oldest first."""
        return self._charges

    @property
    def path(self) -> str | None:
        """The file the budget is kept in (every charge is written there first), or ``None``."""
        return self._path

    @property
    def spent(self) -> float:
        """The sum of the charges' costs, in the budget's unit."""
        return float(self._exact_spent())

    @property
    def remaining(self) -> float:
        """What is left, in the budget's unit (negative if a file's total was lowered below its charges)."""
        return float(Fraction(_amount(self._total)) - self._exact_spent())

    def _exact_spent(self) -> Fraction:
        return sum((Fraction(c.cost) for c in self._charges), Fraction(0))

    # ------------------------------------------------------------------ charging
    def cost(self, privacy: Privacy) -> float:
        """What a release under ``privacy`` costs this budget, in its unit (see the module's table).

        Raises
        ------
        BudgetError
            For a release that does not compose with this budget (Gaussian noise, ``ZCDP`` or
            ``ApproxDP``, against a pure-DP budget).
        """
        if not isinstance(privacy, Privacy):
            raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
        if isinstance(self._total, PureDP):
            if isinstance(privacy, PureDP):
                return privacy.epsilon
            raise BudgetError(
                f"a {privacy.description} release (Gaussian noise) cannot be charged to a pure-DP budget: Gaussian "
                "noise is not pure DP for any epsilon; keep a zCDP budget for Gaussian releases (Budget(ZCDP(rho)), "
                "Budget.from_approx_dp, or hdmm budget create FILE --rho R)"
            )
        if isinstance(privacy, PureDP):
            return privacy.epsilon**2 / 2.0
        if isinstance(privacy, ZCDP):
            return privacy.rho
        if isinstance(privacy, ApproxDP):
            return zcdp_rho(privacy.epsilon, privacy.delta)
        raise BudgetError(f"no composition rule for {type(privacy).__name__} releases")

    def check(self, privacy: Privacy) -> float:
        """The cost of a release under ``privacy``, if it fits in what is left; else :class:`BudgetExceeded`.

        Nothing is recorded: :meth:`charge` does that.
        """
        cost = self.cost(privacy)
        total = Fraction(_amount(self._total))
        spent = self._exact_spent()
        if spent + Fraction(cost) > total * (1 + Fraction(BUDGET_RTOL)):
            where = "" if self._path is None else f" ({self._path})"
            raise BudgetExceeded(
                f"the privacy budget{where} cannot pay for this release: it costs {self.unit} = {cost:.6g} "
                f"({privacy.description}), but {float(total - spent):.6g} of the total {self.unit} = "
                f"{float(total):.6g} is left after {len(self._charges)} charge(s); nothing was measured"
            )
        return cost

    def charge(self, privacy: Privacy, workload: str = "") -> Charge:
        """Record a release under ``privacy`` (of ``workload``, a name or description): call it before measuring.

        A budget kept in a file writes the file (atomically) before returning, so the charge is
        on disk before any noise is drawn.

        Returns
        -------
        Charge

        Raises
        ------
        BudgetExceeded
            If the charge does not fit (:meth:`check`); nothing is recorded.
        BudgetError
            If the release does not compose with the budget, or the budget's file changed since
            it was read.
        OSError
            If the file cannot be written (nothing is recorded).
        """
        cost = self.check(privacy)
        if not isinstance(workload, str):
            raise TypeError(f"workload must be text (a name or description), got {type(workload).__name__}")
        entry = Charge(number=len(self._charges) + 1, time=_now(), workload=workload, privacy=privacy, cost=cost,
                       unit=self.unit)
        self._commit(self._charges + (entry,))
        return entry

    def settle(self, charge: Charge, output: str | None = None) -> Charge:
        """Mark ``charge`` as released (its release finished), with where it was written; returns the new record.

        The charge keeps counting either way; this only tells a finished release from one that
        failed after it was charged. A budget kept in a file re-reads the file under its lock and
        changes only this charge: charges that other releases made since are kept (and this
        budget then holds them too).
        """
        index = charge.number - 1
        if not (0 <= index < len(self._charges)) or not _same_charge(self._charges[index], charge):
            raise BudgetError(f"charge {charge.number} was not made against this budget")
        if output is not None and not isinstance(output, str):
            raise TypeError(f"output must be text (where the release was written), got {type(output).__name__}")
        settled = dataclasses.replace(self._charges[index], status="released", output=output)
        if self._path is None:
            self._charges = self._charges[:index] + (settled,) + self._charges[index + 1:]
            return settled

        def mark(current: Budget) -> tuple[Charge, ...]:
            # other releases may have charged the file since: keep their charges, change only this one
            if not (index < len(current._charges) and _same_charge(current._charges[index], charge)):
                raise BudgetError(f"charge {charge.number} is no longer in {self._path} as it was made (was the file "
                                  "edited?); the charge still counts")
            return current._charges[:index] + (settled,) + current._charges[index + 1:]

        self._charges, self._digest = _update_file(self._path, mark, self._text)
        return settled

    def _commit(self, charges: tuple[Charge, ...]) -> None:
        """Write the charges to the budget's file (if any), then keep them."""
        if self._path is not None:
            self._digest = _replace_file(self._path, self._text(charges), self._digest)
        self._charges = charges

    # ------------------------------------------------------------------ reports
    def epsilon_at(self, delta: float | None = None, *, total: bool = False) -> float:
        r"""What has been spent (or, with ``total=True``, the total), stated as :math:`(\epsilon, \delta)`-DP.

        A pure-DP budget is :math:`(\epsilon, 0)`-DP, hence :math:`(\epsilon, \delta)`-DP for every
        delta: its epsilon is returned as it is. A zCDP budget of rho is
        :math:`(\epsilon, \delta)`-DP for ``epsilon = zcdp_epsilon(rho, delta)``.

        Parameters
        ----------
        delta
            Defaults to the budget's :attr:`delta` (zCDP budgets made by :meth:`from_approx_dp`).
        total
            State the total instead of what has been spent.
        """
        amount = _amount(self._total) if total else self.spent
        if isinstance(self._total, PureDP):
            return amount
        delta = self._delta if delta is None else delta
        if delta is None:
            raise BudgetError("give the delta at which to state this zCDP budget as (epsilon, delta)-DP")
        return zcdp_epsilon(amount, delta)

    def charged(self, charge: Charge) -> str:
        """One line for a release just charged: its cost, what is spent of the total and what is left."""
        return (f"budget {self._path}: charged {self.unit} {charge.cost:.6g}; spent {self.spent:.6g} of "
                f"{_amount(self._total):g}, {self.remaining:.6g} left")

    def summary(self) -> str:
        """A few readable lines: the total, what is spent and left, and every charge."""
        unit = self.unit
        lines = [f"privacy budget: {self._total.description}"
                 + ("" if self._path is None else f" ({self._path})"),
                 f"  spent {unit} = {self.spent:.6g} in {len(self._charges)} charge(s); remaining {self.remaining:.6g}"]
        if self._delta is not None:
            lines.append(f"  as (epsilon, delta)-DP at delta = {self._delta:g}: spent epsilon = "
                         f"{self.epsilon_at():.6g} of {self.epsilon_at(total=True):.6g} (CKS 2020, Corollary 13)")
        for c in self._charges:
            state = "released" if c.status == "released" else "charged (release not recorded as finished)"
            lines.append(f"  {c.number:>4}. {c.time}  {unit} {c.cost:.6g}  {c.privacy.description}  "
                         f"{c.workload or '(no name)'}  [{state}]" + ("" if c.output is None else f" -> {c.output}"))
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return (f"Budget({self._total!r}: spent {self.unit} {self.spent:.6g}, remaining {self.remaining:.6g}, "
                f"{len(self._charges)} charge(s))")

    # ------------------------------------------------------------------ files
    def to_dict(self, charges: tuple[Charge, ...] | None = None) -> dict[str, Any]:
        """The budget as its file holds it."""
        return {"format": BUDGET_FORMAT, "version": BUDGET_VERSION, "total": self._total.to_dict(),
                "delta": self._delta, "created": self._created,
                "charges": [c.to_dict() for c in (self._charges if charges is None else charges)]}

    def _text(self, charges: tuple[Charge, ...]) -> str:
        return json.dumps(self.to_dict(charges), indent=2, allow_nan=False) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        """Write the budget to a new file ``path`` and keep it there: every later charge is written to it first.

        Raises
        ------
        BudgetError
            If ``path`` exists and is not this budget's own file (a budget file is never
            replaced: the charges in it would be forgotten).
        OSError
            If the file cannot be written.
        """
        path = os.path.abspath(os.fspath(path))
        if path != self._path and os.path.lexists(path):
            raise BudgetError(f"{path} exists: a budget file is never replaced (its charges would be forgotten); "
                              "choose another name, or load it with Budget.load")
        digest = _replace_file(path, self._text(self._charges), self._digest if path == self._path else None,
                               new=path != self._path)
        self._path, self._digest = path, digest

    @staticmethod
    def load(path: str | os.PathLike, *, max_bytes: int = MAX_BUDGET_BYTES) -> Budget:
        """Read a budget file written by :meth:`save`; the budget stays attached to it.

        Every entry is checked: the format and version, the total, each charge's fields, their
        numbering, and each charge's cost against its privacy definition (a file whose costs
        were edited is refused). Any problem raises one ``ValueError`` naming the file.
        """
        path = os.path.abspath(os.fspath(path))
        data = _read_file(path, max_bytes)
        budget = Budget.from_text(data, source=path)
        budget._path, budget._digest = path, hashlib.sha256(data).hexdigest()
        return budget

    @staticmethod
    def from_text(data: bytes | str, source: str = "the budget file") -> Budget:
        """The budget a file's text describes (see :meth:`load`), not attached to any file."""
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            d = json.loads(text, parse_constant=_no_constant)
        except RecursionError:
            raise ValueError(f"{source} is not an hdmm budget file (its JSON is nested too deeply)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"{source} is not an hdmm budget file (not valid JSON: {exc})") from None
        if not isinstance(d, dict) or d.get("format") != BUDGET_FORMAT:
            found = d.get("format") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"{source} is not an hdmm budget file (format {found!r}, expected {BUDGET_FORMAT!r})")
        version = d.get("version")
        if not (isinstance(version, int) and not isinstance(version, bool)):
            raise ValueError(f"{source}: the budget file version must be a whole number, got {version!r}")
        if version > BUDGET_VERSION:
            raise ValueError(f"{source} was written by a newer hdmm (budget file version {version}; this hdmm reads "
                             f"{BUDGET_VERSION}); upgrade hdmm")
        problem = _entries_problem(d, _TOP_KEYS, _TOP_KEYS)
        if problem:
            raise ValueError(f"{source} is not a valid hdmm budget file: it has {problem}")
        total = _privacy_from(d["total"], f"{source}: the total")
        if not isinstance(d["created"], str):
            raise ValueError(f"{source}: 'created' must be text, got {d['created']!r}")
        try:
            budget = Budget(total, delta=d["delta"])
        except (BudgetError, TypeError) as exc:
            raise ValueError(f"{source} is not a valid hdmm budget file: {exc}") from None
        budget._created = d["created"]
        if not isinstance(d["charges"], list):
            raise ValueError(f"{source}: 'charges' must be a list, got {type(d['charges']).__name__}")
        charges = tuple(Charge.from_dict(c, source) for c in d["charges"])
        for i, c in enumerate(charges, 1):
            if c.number != i:
                raise ValueError(f"{source}: the charges are not numbered 1, 2, ... in order (entry {i} is number "
                                 f"{c.number}); the file is damaged or was edited")
            if c.unit != budget.unit:
                raise ValueError(f"{source}: charge {i} is in {c.unit} but the budget counts {budget.unit}")
            try:
                expected = budget.cost(c.privacy)
            except BudgetError as exc:
                raise ValueError(f"{source}: charge {i} cannot belong to this budget: {exc}") from None
            if not math.isclose(c.cost, expected, rel_tol=1e-12, abs_tol=0.0):
                raise ValueError(f"{source}: charge {i} records a cost of {c.cost!r} {c.unit} but "
                                 f"{c.privacy.description} costs {expected!r}; the file is damaged or was edited")
        budget._charges = charges
        return budget


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a budget can hold")


def _read_file(path: str, max_bytes: int) -> bytes:
    if not (isinstance(max_bytes, int) and not isinstance(max_bytes, bool) and max_bytes > 0):
        raise ValueError(f"max_bytes must be a positive whole number, got {max_bytes!r}")
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise ValueError(f"the budget file {path} {what}; create one with Budget(...).save(path) or "
                         "'hdmm budget create PATH --epsilon E' (or --rho R)")
    with open(path, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is larger than {max_bytes:,} bytes: not a budget file hdmm reads (raise max_bytes "
                         "for a file you trust)")
    return data


@contextlib.contextmanager
def _directory_locked(directory: str) -> Iterator[None]:
    """Hold an exclusive advisory lock (``flock``) on ``directory`` for the duration of the block.

    Every budget write takes it around reading, checking and replacing its file, so writes to
    budget files in one directory happen one at a time across processes (each lasts
    milliseconds for budgets of thousands of charges; marking a charge released parses the file
    under the lock, about 0.4 ms a charge). The lock goes with the descriptor: a process that
    dies releases it. Waits at most ``LOCK_TIMEOUT`` seconds, then raises :class:`BudgetError`;
    without ``fcntl`` (not POSIX) it does nothing.
    """
    if fcntl is None:
        yield
        return
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise BudgetError(f"another process has been writing a budget file in {directory} for over "
                                      f"{LOCK_TIMEOUT:g} s; nothing was charged: retry once it has finished") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(descriptor)


def settle_quietly(budget: Budget, charge: Charge, output: str | None = None) -> Charge | None:
    """:meth:`Budget.settle`, warning instead of raising: a finished release must not be lost because its
    charge (on disk, and counting either way) could not be marked released. Returns the new record or ``None``."""
    try:
        return budget.settle(charge, output=output)
    except (ValueError, OSError) as exc:  # a BudgetError, or a budget file now missing or damaged
        warnings.warn(f"the release is complete, but its budget charge {charge.number} could not be marked "
                      f"released ({exc}); the charge counts either way", RuntimeWarning, stacklevel=3)
        return None


def _locked_write(path: str, contents, new: bool = False) -> str:
    """Under :func:`_directory_locked`, write the bytes ``contents()`` returns to ``path`` atomically; returns
    their digest. ``contents`` runs under the lock, so it may read the file as it is now."""
    directory = os.path.dirname(path) or os.curdir
    with _directory_locked(directory):
        data = contents()
        _write_and_rename(path, data, new)
    _sync_directory(directory)
    return hashlib.sha256(data).hexdigest()


def _update_file(path: str, change, text_of) -> tuple[tuple[Charge, ...], str]:
    """Read the budget file as it is now, change its charges and write it back, all under the lock.

    ``change(budget)`` returns the new charges from the file's current :class:`Budget`;
    ``text_of(charges)`` gives the file's text. Returns the charges written and the digest.
    """
    written: list[tuple[Charge, ...]] = []

    def contents() -> bytes:
        written.append(change(Budget.from_text(_read_file(path, MAX_BUDGET_BYTES), source=path)))
        return text_of(written[0]).encode("utf-8")

    digest = _locked_write(path, contents)
    return written[0], digest


def _replace_file(path: str, text: str, digest: str | None, *, new: bool = False) -> str:
    """Write ``text`` to ``path`` atomically; returns its digest.

    ``digest`` is that of the file as it was last read or written by this budget: a file that
    differs now (another process charged it) is refused. ``new``: the file must not exist. The
    check and the replacement happen under :func:`_directory_locked`.
    """
    def contents() -> bytes:
        if not new:
            try:
                with open(path, "rb") as file:
                    current = hashlib.sha256(file.read()).hexdigest()
            except FileNotFoundError:
                current = None
            if current != digest:
                raise BudgetError(f"the budget file {path} changed since it was read (another release, or an "
                                  "edit?); nothing was charged: load it again with Budget.load and retry")
        return text.encode("utf-8")

    return _locked_write(path, contents, new)


def _write_and_rename(path: str, data: bytes, new: bool) -> None:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk and rename it over ``path``."""
    directory, name = os.path.split(path)
    directory = directory or os.curdir
    try:  # the file keeps its permissions; a new one gets the umask's, as open() would give it
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mask = os.umask(0o022)
        os.umask(mask)
        mode = 0o666 & ~mask
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        if new and os.path.lexists(path):
            raise BudgetError(f"{path} appeared while the budget was being saved; nothing was replaced")
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def _sync_directory(directory: str) -> None:
    """Make a rename in ``directory`` durable (POSIX); not possible everywhere, so failures are ignored."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
