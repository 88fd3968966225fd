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

Each rule is a method of the privacy classes (:meth:`hdmm.privacy.Privacy.cost_of` of the total,
which asks the release for :meth:`~hdmm.privacy.Privacy.to_pure` or
:meth:`~hdmm.privacy.Privacy.to_zcdp`; :meth:`~hdmm.privacy.Privacy.epsilon_at` for the
:math:`(\epsilon, \delta)` statement): the budget asks them and never tests a class.

Sums are exact (rational arithmetic on the stored floats), and a charge fits when the sum exceeds
the total by at most a relative ``BUDGET_RTOL`` (1e-12), so that a total split into decimal parts
(``0.1 + 0.2 + 0.7``) is spent exactly; the overspend this allows is below 1e-12 of the total.

A budget kept in a file (:meth:`Budget.save`, :meth:`Budget.load`, ``hdmm budget create``) stays
attached to it: every charge is appended to the file and flushed to disk **before** the
measurement it pays for draws any noise. A measurement that fails after its charge was written (an
error, a crash, a killed process) therefore leaves a recorded charge: the budget may over-count,
never under-count. A charge is recorded as ``"charged"``; once the release is complete,
:meth:`Budget.settle` appends a mark that it was ``"released"`` (and where to); both count.

**The file** (:mod:`hdmm.ledger`) is JSON Lines: the total on the first line, then one line per
charge and per mark, each holding a hash of itself and the line before, so each line is chained
to the file's whole past and to its total. Appending a charge or a mark is O(1) in the number of
charges. Releases that charge one file at the same time (several processes, or several
:class:`Budget` objects) take turns under an exclusive advisory lock (``flock``) on the file's
directory: each reads the charges appended since it last read the file, checks their chain,
and is refused only if the budget, with them, truly cannot pay. The lock is POSIX; elsewhere
appends are not serialised. A :class:`Budget` object itself is not thread-safe: give each
thread its own (:meth:`Budget.load`).

**What a budget file protects against** (its trust model): reading it checks every line's
fields, each charge's cost against its privacy definition and the chain, so an accidental
damage, a charge deleted from the middle or moved, a cost edited, or a total raised is refused
with the line where it happened. It is not a defence against whoever can write the file: anyone
can recompute an unkeyed chain after editing it, and removing the last charges leaves a valid
shorter chain. A **keyed** file (``Budget.save(path, key=...)``, ``hdmm budget create FILE
--budget-key KEYFILE``) is chained with HMAC-SHA256 under a secret the file does not hold: edits
cannot be re-chained without the key, but cutting the last charges is still not visible; to see
it, keep the file's latest hash (:attr:`Budget.head`, printed by ``hdmm budget show``) elsewhere.
The budget only counts what is charged through it: it is an accounting tool for an honest
curator, not an access control.

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

import dataclasses
import datetime
import json
import math
import os
import warnings
from fractions import Fraction
from typing import Any, Mapping

from .ledger import Ledger, LedgerError
from .privacy import ZCDP, ApproxDP, Privacy, PureDP, exact_entry, read_exact, zcdp_epsilon, zcdp_rho  # noqa: F401 (doctests)
from .validation import is_finite_real

__all__ = ["Budget", "Charge", "BudgetError", "BudgetExceeded", "zcdp_epsilon", "settle_quietly", "BUDGET_RTOL",
           "MAX_BUDGET_BYTES", "BUDGET_FORMAT", "BUDGET_VERSION"]

#: A charge fits when the charges' exact sum exceeds the total by at most this relative amount.
BUDGET_RTOL = 1e-12

#: Largest budget file :meth:`Budget.load` reads (bytes): enough for about 200,000 charges.
MAX_BUDGET_BYTES = 64 * 1024**2

#: The ``format`` entry of a budget file.
BUDGET_FORMAT = "hdmm-budget"

#: The budget file version this hdmm writes (a hash-chained JSON Lines file); it reads version 1 too.
BUDGET_VERSION = 2

#: A charge's status: recorded before measuring, or known to have finished.
STATUSES = ("charged", "released")

_CHARGE_KEYS = {"number", "time", "workload", "privacy", "charge", "charge_exact", "unit", "status", "output"}
_TOP_KEYS = {"format", "version", "total", "delta", "created", "charges"}  # a version-1 file
_HEADER_KEYS = {"format", "version", "total", "delta", "created", "keyed", "hash"}
_RECORD_KEYS = {"charge": {"record", "number", "time", "workload", "privacy", "charge", "charge_exact", "unit", "hash"},
                "released": {"record", "number", "time", "output", "hash"}}


class BudgetError(ValueError):
    """A release that cannot be charged to a budget (it does not compose with it), or a budget misused."""


class BudgetExceeded(BudgetError):
    """A release whose charge would take a budget's spending above its total."""


def _entries_problem(d: Mapping, allowed: set, required: set) -> str:
    """``"unknown entries [...]"`` or ``"missing entries [...]"`` for a JSON object's keys, or ``""``."""
    unknown, missing = set(d) - allowed, required - set(d)
    if unknown:
        return f"unknown entries {sorted(unknown)}"
    return f"missing entries {sorted(missing)}" if missing else ""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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
    cost : float or fractions.Fraction
        What it cost, in the budget's unit (``"epsilon"`` or ``"rho"``; see :class:`Budget`): a
        Fraction for a ``ZCDP`` release with an exact rho, written ``"charge_exact": "p/q"`` next
        to the float ``"charge"`` in files.
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
    cost: float | Fraction
    unit: str
    status: str = "charged"
    output: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The charge as a budget file lists it (``charge`` is the cost)."""
        return {"number": self.number, "time": self.time, "workload": self.workload,
                "privacy": self.privacy.to_dict(), "charge": float(self.cost), **exact_entry("charge", self.cost),
                "unit": self.unit, "status": self.status, "output": self.output}

    @staticmethod
    def from_dict(d: Any, source: str = "the budget file") -> Charge:
        """A charge from :meth:`to_dict` output, checked field by field (one ``ValueError`` naming ``source``)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"{source}: a charge must be a JSON object, got {type(d).__name__}")
        problem = _entries_problem(d, _CHARGE_KEYS, _CHARGE_KEYS - {"output", "charge_exact"})
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
        if "charge_exact" in d:
            try:
                cost = read_exact("charge", d["charge_exact"], cost)
            except ValueError as exc:
                raise ValueError(f"{source}: charge {number}: {exc}") from None
        else:
            cost = float(cost)
        return Charge(number=number, time=d["time"], workload=d["workload"], privacy=privacy, cost=cost,
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

    __slots__ = ("_total", "_delta", "_charges", "_spent", "_created", "_path", "_ledger", "_legacy")

    def __init__(self, total: Privacy, *, delta: float | None = None) -> None:
        if not isinstance(total, Privacy):
            raise TypeError(f"a budget's total must be PureDP(epsilon) or ZCDP(rho), got {type(total).__name__}")
        if total.budget_unit is None:  # (epsilon, delta): no parameter that adds up
            params = ", ".join(f"{value:g}" for key, value in total.to_dict().items() if key != "type")
            raise BudgetError(
                f"a budget cannot be kept in (epsilon, delta): {total.description} totals do not add up; make a "
                f"zCDP budget that implies it, Budget.from_approx_dp({params})"
            )
        if delta is not None:
            if total.to_pure() is not None:
                raise BudgetError("delta applies to zCDP budgets only (a pure-DP budget is (epsilon, 0)-DP)")
            if not (is_finite_real(delta) and 0 < delta < 1):
                raise BudgetError(f"delta must be a number in (0, 1), got {delta!r}")
            delta = float(delta)
        self._total: Privacy = total
        self._delta = delta
        self._charges: list[Charge] = []
        self._spent = Fraction(0)  # the exact sum of the charges' costs
        self._created = _now()
        self._path: str | None = None
        self._ledger: Ledger | None = None
        self._legacy: bytes | None = None  # a version-1 file as read, rewritten in this version at the first write

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
        return self._total.budget_unit

    @property
    def delta(self) -> float | None:
        """The delta of the budget's ``(epsilon, delta)`` statement (zCDP budgets made by :meth:`from_approx_dp`)."""
        return self._delta

    @property
    def charges(self) -> tuple[Charge, ...]:
        """Every charge so far, oldest first."""
        return tuple(self._charges)

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
        return float(self.remaining_exact)

    @property
    def spent_exact(self) -> Fraction:
        """:attr:`spent` as the exact sum of the charges (exact rhos as given, floats as the doubles they are)."""
        return self._exact_spent()

    @property
    def remaining_exact(self) -> Fraction:
        """:attr:`remaining` exactly: the total (as a Fraction) minus :attr:`spent_exact`.

        >>> from fractions import Fraction
        >>> b = Budget(ZCDP(Fraction(293764, 114921)))
        >>> for share in (104, 1440, 447, 687, 1256, 165):
        ...     _ = b.charge(ZCDP(Fraction(293764, 114921) * share / 4099))
        >>> b.spent_exact, b.remaining_exact
        (Fraction(293764, 114921), Fraction(0, 1))
        """
        return Fraction(self._total.amount) - self._exact_spent()

    def _exact_spent(self) -> Fraction:
        return self._spent

    # ------------------------------------------------------------------ charging
    def cost(self, privacy: Privacy) -> float | Fraction:
        """What a release under ``privacy`` costs this budget, in its unit (see the module's table).

        A ``ZCDP`` release with an exact rho (a :class:`fractions.Fraction`) costs that Fraction.

        Raises
        ------
        BudgetError
            For a release that does not compose with this budget (Gaussian noise, ``ZCDP`` or
            ``ApproxDP``, against a pure-DP budget).
        """
        if not isinstance(privacy, Privacy):
            raise TypeError(f"privacy must be PureDP, ApproxDP or ZCDP, got {type(privacy).__name__}")
        cost = self._total.cost_of(privacy)  # the composition rule is the total's (hdmm.privacy)
        if cost is not None:
            return cost
        if self._total.to_pure() is not None:
            title = privacy.noise.title
            raise BudgetError(
                f"a {privacy.description} release ({title} noise) cannot be charged to a pure-DP budget: {title} "
                f"noise is not pure DP for any epsilon; keep a zCDP budget for {title} releases (Budget(ZCDP(rho)), "
                "Budget.from_approx_dp, or hdmm budget create FILE --rho R)"
            )
        raise BudgetError(f"no composition rule for {type(privacy).__name__} releases")

    def check(self, privacy: Privacy) -> float | Fraction:
        """The cost of a release under ``privacy``, if it fits in what is left; else :class:`BudgetExceeded`.

        Nothing is recorded: :meth:`charge` does that.
        """
        cost = self.cost(privacy)
        total = Fraction(self._total.amount)
        spent = self._exact_spent()
        if spent + Fraction(cost) > total * (1 + Fraction(BUDGET_RTOL)):
            where = "" if self._path is None else f" ({self._path})"
            raise BudgetExceeded(
                f"the privacy budget{where} cannot pay for this release: it costs {self.unit} = {float(cost):.6g} "
                f"({privacy.description}), but {float(total - spent):.6g} of the total {self.unit} = "
                f"{float(total):.6g} is left after {len(self._charges)} charge(s); nothing was measured"
            )
        return cost

    def charge(self, privacy: Privacy, workload: str = "") -> Charge:
        """Record a release under ``privacy`` (of ``workload``, a name or description): call it before measuring.

        A budget kept in a file appends the charge to it and flushes it to disk (``fsync``) before
        returning, so the charge is on disk before any noise is drawn. Under the file's lock, the
        charges other releases appended since this budget read the file are read first, and the
        charge is checked again with them: it is refused only if the budget, as it is now, cannot
        pay.

        Returns
        -------
        Charge

        Raises
        ------
        BudgetExceeded
            If the charge does not fit (:meth:`check`); nothing is recorded.
        BudgetError
            If the release does not compose with the budget, or the budget's file was replaced or
            cut since it was read (not only appended to), or the lines appended meanwhile break
            its chain, or another process held the lock for over ``hdmm.ledger.LOCK_TIMEOUT``.
        OSError
            If the file cannot be written (nothing is recorded: a partly written line is cut off).
        """
        self.check(privacy)
        if not isinstance(workload, str):
            raise TypeError(f"workload must be text (a name or description), got {type(workload).__name__}")

        def record() -> dict[str, Any]:
            cost = self.check(privacy)  # again, with what other releases charged meanwhile
            entry = Charge(number=len(self._charges) + 1, time=_now(), workload=workload, privacy=privacy, cost=cost,
                           unit=self.unit)
            return _charge_record(entry)

        self._write(record)
        return self._charges[-1]

    def settle(self, charge: Charge, output: str | None = None) -> Charge:
        """Mark ``charge`` as released (its release finished), with where it was written; returns the new record.

        The charge keeps counting either way; this only tells a finished release from one that
        failed after it was charged. A budget kept in a file appends one record to it (O(1),
        whatever the number of charges), after reading the charges other releases made since
        (this budget then holds them too).
        """
        if output is not None and not isinstance(output, str):
            raise TypeError(f"output must be text (where the release was written), got {type(output).__name__}")
        index = charge.number - 1

        def record() -> dict[str, Any]:
            if not (0 <= index < len(self._charges)) or not _same_charge(self._charges[index], charge):
                where = "this budget" if self._path is None else self._path
                raise BudgetError(f"charge {charge.number} was not made against {where} (or is no longer there as it "
                                  "was made); the charge still counts")
            return {"record": "released", "number": charge.number, "time": _now(), "output": output}

        self._write(record)
        return self._charges[index]

    def _write(self, record) -> None:
        """Apply the record ``record()`` returns, after writing it to the budget's file (if any).

        In a file, ``record()`` runs under the file's lock, after the records other processes
        appended since this budget last read it have been checked and applied: it sees the budget
        as it is now, and may refuse (raise) with nothing written.
        """
        if self._path is None:
            self._apply(record(), 0, "this budget")
            return
        written: list[dict[str, Any]] = []

        def entries() -> list[dict[str, Any]]:
            written.append(record())
            if self._legacy is not None:  # a version-1 file: rewritten whole in this version, then appended to
                return self._entries() + written
            return written

        def catch_up(data: bytes, base: int) -> None:
            self._ledger.parse(data, lambda entry, line: self._apply(entry, line, self._path), self._path, base)

        try:
            if self._legacy is not None:
                try:
                    self._ledger.replace(self._legacy, entries())
                    self._legacy = None
                except LedgerError:  # changed since read: upgraded by another release meanwhile? then append to it
                    if not self._adopt_upgrade():
                        raise
                    written.clear()
            if not written:
                self._ledger.append(catch_up, entries)
        except LedgerError as exc:
            raise BudgetError(f"{exc}; nothing was charged or marked") from None
        self._apply(written[0], self._ledger.lines, self._path)

    def _adopt_upgrade(self) -> bool:
        """Whether this budget's version-1 file, changed since it was read, is now its chained version.

        That is the file another release wrote when it upgraded the file at its own charge: the
        same total and creation time, this budget's charges first. If so, this budget takes the
        file's state (its charges, its chain) and appends to it like to any file; if not (another
        budget, or charges missing), ``False``: nothing is written.
        """
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                fresh = Budget.load(self._path)
        except (ValueError, OSError):
            return False
        mine, theirs = self._charges, fresh._charges
        if (fresh._legacy is not None or (fresh._total, fresh._delta, fresh._created) !=
                (self._total, self._delta, self._created) or len(theirs) < len(mine)
                or not all(_same_charge(a, b) for a, b in zip(mine, theirs))):
            return False
        self._charges, self._spent, self._ledger, self._legacy = theirs, fresh._spent, fresh._ledger, None
        return True

    def _apply(self, entry: Mapping[str, Any], line: int, source: str) -> None:
        """Check one record of a budget file (line ``line`` of ``source``) and apply it to the charges."""
        kind = entry.get("record")
        where = f"{source}, line {line}" if line else source
        if kind not in _RECORD_KEYS:
            raise ValueError(f"{where}: a record must be a 'charge' or 'released', got {kind!r}")
        problem = _entries_problem(entry, _RECORD_KEYS[kind], _RECORD_KEYS[kind] - {"hash", "charge_exact"})
        if problem:
            raise ValueError(f"{where}: a {kind} record has {problem}")
        if kind == "charge":
            fields = {k: v for k, v in entry.items() if k not in ("record", "hash")}
            c = Charge.from_dict({**fields, "status": "charged"}, where)
            self._charges.append(self._checked(c, where))
            self._spent += Fraction(c.cost)
            return
        number, output = entry["number"], entry["output"]
        if not (isinstance(number, int) and not isinstance(number, bool) and 1 <= number <= len(self._charges)):
            raise ValueError(f"{where}: marks released a charge {number!r} that is not before it")
        if not isinstance(entry["time"], str):
            raise ValueError(f"{where}: the time must be text, got {entry['time']!r}")
        if output is not None and not isinstance(output, str):
            raise ValueError(f"{where}: the output must be text or null, got {output!r}")
        settled = dataclasses.replace(self._charges[number - 1], status="released", output=output)
        self._charges[number - 1] = settled

    def _checked(self, c: Charge, where: str) -> Charge:
        """``c`` if it can be the budget's next charge (its number, unit and cost), else a ``ValueError``."""
        if c.number != len(self._charges) + 1:
            raise ValueError(f"{where}: the charges are not numbered 1, 2, ... in order (charge "
                             f"{len(self._charges) + 1} is numbered {c.number}); the file is damaged or was edited")
        if c.unit != self.unit:
            raise ValueError(f"{where}: charge {c.number} is in {c.unit} but the budget counts {self.unit}")
        try:
            expected = self.cost(c.privacy)
        except BudgetError as exc:
            raise ValueError(f"{where}: charge {c.number} cannot belong to this budget: {exc}") from None
        exact = isinstance(c.cost, Fraction) or isinstance(expected, Fraction)
        if (c.cost != expected) if exact else not math.isclose(c.cost, expected, rel_tol=1e-12, abs_tol=0.0):
            raise ValueError(f"{where}: charge {c.number} records a cost of {c.cost!r} {c.unit} but "
                             f"{c.privacy.description} costs {expected!r}; the file is damaged or was edited")
        return c

    # ------------------------------------------------------------------ reports
    def epsilon_at(self, delta: float | None = None, *, total: bool = False) -> float:
        r"""What has been spent (or, with ``total=True``, the total), stated as :math:`(\epsilon, \delta)`-DP.

        A pure-DP budget is :math:`(\epsilon, 0)`-DP, hence :math:`(\epsilon, \delta)`-DP for every
        delta: its epsilon is returned as it is. A zCDP budget of rho is
        :math:`(\epsilon, \delta)`-DP for ``epsilon = zcdp_epsilon(rho, delta)``.

        Parameters
        ----------
        delta
            Defaults to the budget's :attr:`delta` (zCDP budgets made by :meth:`from_approx_dp`);
            a number in (0, 1) for every budget (:class:`BudgetError` otherwise).
        total
            State the total instead of what has been spent.
        """
        if delta is not None and not (is_finite_real(delta) and 0 < delta < 1):
            raise BudgetError(f"delta must be a number in (0, 1), got {delta!r}")
        amount = self._total.amount if total else self.spent
        try:
            return self._total.epsilon_at(amount, self._delta if delta is None else delta)
        except ValueError as exc:  # a zCDP budget without a delta
            raise BudgetError(str(exc)) from None

    def charged(self, charge: Charge) -> str:
        """One line for a release just charged: its cost, what is spent of the total and what is left."""
        return (f"budget {self._path}: charged {self.unit} {float(charge.cost):.6g}; spent {self.spent:.6g} of "
                f"{float(self._total.amount):g}, {self.remaining:.6g} left")

    def summary(self) -> str:
        """A few readable lines: the total, what is spent and left, and every charge."""
        unit = self.unit
        lines = [f"privacy budget: {self._total.description}"
                 + ("" if self._path is None else f" ({self._path})"),
                 f"  spent {unit} = {self.spent:.6g} in {len(self._charges)} charge(s); remaining {self.remaining:.6g}"]
        if self._delta is not None:
            lines.append(f"  as (epsilon, delta)-DP at delta = {self._delta:g}: spent epsilon = "
                         f"{self.epsilon_at():.6g} of {self.epsilon_at(total=True):.6g} (CKS 2020, Corollary 13)")
        if self.head is not None:
            lines.append(f"  latest hash: {self.head} (keep a copy elsewhere to detect charges cut from the end)")
        for c in self._charges:
            state = "released" if c.status == "released" else "charged (release not recorded as finished)"
            lines.append(f"  {c.number:>4}. {c.time}  {unit} {float(c.cost):.6g}  {c.privacy.description}  "
                         f"{c.workload or '(no name)'}  [{state}]" + ("" if c.output is None else f" -> {c.output}"))
        return "\n".join(lines)

    __str__ = summary

    def __repr__(self) -> str:
        return (f"Budget({self._total!r}: spent {self.unit} {self.spent:.6g}, remaining {self.remaining:.6g}, "
                f"{len(self._charges)} charge(s))")

    # ------------------------------------------------------------------ files
    @property
    def head(self) -> str | None:
        """The hash of the last line of the budget's file as read or written (``None`` without a file).

        Every charge and mark changes it. Keep it somewhere else (``hdmm budget show`` prints it)
        to detect later that charges were cut from the end of the file, which the chain alone
        cannot show (see :mod:`hdmm.ledger`).
        """
        return None if self._ledger is None or self._legacy is not None else self._ledger.head

    def to_dict(self) -> dict[str, Any]:
        """The budget as a JSON object: its total, ``delta``, creation time and every charge with its status."""
        return {"format": BUDGET_FORMAT, "version": BUDGET_VERSION, "total": self._total.to_dict(),
                "delta": self._delta, "created": self._created, "charges": [c.to_dict() for c in self._charges]}

    def _header(self, keyed: bool) -> dict[str, Any]:
        return {"format": BUDGET_FORMAT, "version": BUDGET_VERSION, "total": self._total.to_dict(),
                "delta": self._delta, "created": self._created, "keyed": keyed}

    def _entries(self) -> list[dict[str, Any]]:
        """The budget's file as records: its header, each charge and, for a released one, its mark."""
        out = [self._header(self._ledger is not None and self._ledger.key is not None)]
        for c in self._charges:
            out.append(_charge_record(c))
            if c.status == "released":
                out.append({"record": "released", "number": c.number, "time": c.time, "output": c.output})
        return out

    def save(self, path: str | os.PathLike, *, key: bytes | None = None) -> None:
        """Write the budget to a new file ``path`` and keep it there: every later charge is written to it first.

        The file is a chain of hashed records (:mod:`hdmm.ledger`): one line for the total, one per
        charge, one per release marked finished. ``key`` (secret bytes kept outside the file)
        makes the hashes keyed (HMAC-SHA256): without the key, nobody can edit the file and
        recompute the chain; the same key must then be given to :meth:`load`.

        Raises
        ------
        BudgetError
            If ``path`` exists and is not this budget's own file (a budget file is never
            replaced: the charges in it would be forgotten).
        OSError
            If the file cannot be written.
        """
        path = os.path.abspath(os.fspath(path))
        if path == self._path:
            return  # every charge is in it already
        if os.path.lexists(path):
            raise BudgetError(f"{path} exists: a budget file is never replaced (its charges would be forgotten); "
                              "choose another name, or load it with Budget.load")
        file = Ledger(path, _check_key(key))
        entries = [self._header(key is not None)] + self._entries()[1:]
        try:
            file.create(entries)
        except FileExistsError as exc:
            raise BudgetError(f"{exc}") from None
        self._path, self._ledger, self._legacy = path, file, None

    @staticmethod
    def load(path: str | os.PathLike, *, max_bytes: int = MAX_BUDGET_BYTES, key: bytes | None = None) -> Budget:
        """Read a budget file written by :meth:`save`; the budget stays attached to it.

        Every line is checked: the chain of hashes (:mod:`hdmm.ledger`: a deleted, reordered or
        edited line, or a changed total, breaks it), the format and version, the total, each
        charge's fields, their numbering, each charge's cost against its privacy definition,
        and each mark. Any problem raises one ``ValueError`` naming the file and line.

        What this cannot detect: without ``key``, a file rewritten with its chain recomputed
        (anyone can compute SHA-256); with or without ``key``, charges cut from its end (what is
        left is a valid shorter chain: compare :attr:`head` with a copy kept elsewhere). A file
        saved with a ``key`` must be loaded with it, and a ``key`` given for a file saved without
        one is refused, so a keyed file rewritten as unkeyed is caught as long as the key is
        always given. A file written by hdmm before budget files were chained (version 1) is read
        with a warning, checked as before (fields, numbering, costs) but without a chain, and
        rewritten in this version (unkeyed) at its next charge or mark; a release that read it
        before another one rewrote it appends to the rewritten file if it still holds the charges
        it read.
        """
        path = os.path.abspath(os.fspath(path))
        data = _read_file(path, max_bytes)
        budget = Budget._parse(data, path, _check_key(key))
        budget._path = path
        if budget._ledger is None:  # a version-1 file
            warnings.warn(f"{path} was written by an earlier hdmm (budget file version 1, without a chain of hashes "
                          "that shows deleted or edited charges); it is rewritten in the current version at its next "
                          "charge or mark", UserWarning, stacklevel=2)
            budget._ledger, budget._legacy = Ledger(path, None), data
        return budget

    @staticmethod
    def from_text(data: bytes | str, source: str = "the budget file", *, key: bytes | None = None) -> Budget:
        """The budget a file's text describes (see :meth:`load`), not attached to any file."""
        budget = Budget._parse(data.encode("utf-8") if isinstance(data, str) else data, source, _check_key(key))
        budget._ledger = None
        return budget

    @staticmethod
    def _parse(data: bytes, source: str, key: bytes | None) -> Budget:
        first = data.split(b"\n", 1)[0]
        try:
            header = json.loads(first.decode("utf-8"), parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError, RecursionError):
            header = None
        if not (isinstance(header, dict) and header.get("version") != 1 and "charges" not in header):
            if key is not None:
                raise ValueError(f"{source} is a budget file of version 1, which has no keyed chain; load it without "
                                 "a key")
            return _from_version_1(data, source)
        _version_problem(header, source)  # a newer hdmm's file is named so before its chain is checked
        if header.get("keyed") is True and key is None:  # likewise a key forgotten, or given for an unkeyed file
            raise ValueError(f"{source}: the file was saved with a key and must be loaded with it (key=..., or "
                             "--budget-key FILE)")
        if header.get("keyed") is False and key is not None:
            raise ValueError(f"{source}: the file was saved without a key, but a key was given: load it without one")
        file = Ledger(source, key)
        state: dict[str, Budget] = {}

        def check(entry: dict[str, Any], line: int) -> None:
            if line == 1:
                state["budget"] = _from_header(entry, source, key)
            else:
                state["budget"]._apply(entry, line, source)

        if not data.endswith(b"\n") and b"\n" not in data:
            raise ValueError(f"{source} is not an hdmm budget file (its first line is not complete)")
        try:
            file.parse(data, check, source)
        except LedgerError as exc:
            if "budget" not in state and header.get("format") != BUDGET_FORMAT:
                raise ValueError(f"{source} is not an hdmm budget file (format {header.get('format')!r}, expected "
                                 f"{BUDGET_FORMAT!r})") from None
            raise ValueError(str(exc)) from None
        budget = state["budget"]
        budget._ledger = file
        return budget


def _check_key(key: Any) -> bytes | None:
    if key is None:
        return None
    if not isinstance(key, (bytes, bytearray)) or len(key) < 16:
        raise ValueError("a budget file's key must be bytes, at least 16 of them (e.g. os.urandom(32), kept in a file "
                         "only its owner can read)")
    return bytes(key)


def _charge_record(c: Charge) -> dict[str, Any]:
    """A charge as its line in a budget file (its status comes from later 'released' records)."""
    d = c.to_dict()
    del d["status"], d["output"]
    return {"record": "charge", **d}


def _version_problem(d: Mapping, source: str) -> None:
    if not isinstance(d, dict) or d.get("format") != BUDGET_FORMAT:
        found = d.get("format") if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{source} is not an hdmm budget file (format {found!r}, expected {BUDGET_FORMAT!r})")
    version = d.get("version")
    if not (isinstance(version, int) and not isinstance(version, bool)):
        raise ValueError(f"{source}: the budget file version must be a whole number, got {version!r}")
    if version > BUDGET_VERSION:
        raise ValueError(f"{source} was written by a newer hdmm (budget file version {version}; this hdmm reads "
                         f"{BUDGET_VERSION}); upgrade hdmm")


def _new_budget(d: Mapping, source: str) -> Budget:
    total = _privacy_from(d["total"], f"{source}: the total")
    if not isinstance(d["created"], str):
        raise ValueError(f"{source}: 'created' must be text, got {d['created']!r}")
    try:
        budget = Budget(total, delta=d["delta"])
    except (BudgetError, TypeError) as exc:
        raise ValueError(f"{source} is not a valid hdmm budget file: {exc}") from None
    budget._created = d["created"]
    return budget


def _from_header(d: dict[str, Any], source: str, key: bytes | None) -> Budget:
    """The budget of a version-2 file's first line, without charges."""
    _version_problem(d, source)
    if d["version"] != BUDGET_VERSION:
        raise ValueError(f"{source}: a budget file of version {d['version']} must be one JSON document, not lines")
    problem = _entries_problem(d, _HEADER_KEYS, _HEADER_KEYS)
    if problem:
        raise ValueError(f"{source} is not a valid hdmm budget file: its first line has {problem}")
    if not isinstance(d["keyed"], bool):
        raise ValueError(f"{source}: 'keyed' must be true or false, got {d['keyed']!r}")
    return _new_budget(d, source)


def _from_version_1(data: bytes, source: str) -> Budget:
    """A budget file of version 1 (one JSON document, no chain), checked field by field."""
    try:
        d = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{source} is not an hdmm budget file (its JSON is nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{source} is not an hdmm budget file (not valid JSON: {exc})") from None
    _version_problem(d, source)
    problem = _entries_problem(d, _TOP_KEYS, _TOP_KEYS)
    if problem:
        raise ValueError(f"{source} is not a valid hdmm budget file: it has {problem}")
    budget = _new_budget(d, source)
    if not isinstance(d["charges"], list):
        raise ValueError(f"{source}: 'charges' must be a list, got {type(d['charges']).__name__}")
    for c in d["charges"]:
        charge = budget._checked(Charge.from_dict(c, source), source)
        budget._charges.append(charge)
        budget._spent += Fraction(charge.cost)
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


def settle_quietly(budget: Budget, charge: Charge, output: str | None = None) -> Charge | None:
    """:meth:`Budget.settle`, warning instead of raising: a finished release must not be lost because its
    charge (on disk, and counting either way) could not be marked released. Returns the new record or ``None``."""
    try:
        return budget.settle(charge, output=output)
    except (ValueError, OSError) as exc:  # a BudgetError, or a budget file now missing or damaged
        warnings.warn(f"the release is complete, but its budget charge {charge.number} could not be marked "
                      f"released ({exc}); the charge counts either way", RuntimeWarning, stacklevel=3)
        return None
