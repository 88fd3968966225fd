"""The privacy budget across releases: composition, refusal before any noise, and the budget file."""

from __future__ import annotations

import json
import math
import os
import warnings

import numpy as np
import pytest

import hdmm
import hdmm.kernel
from hdmm.budget import Budget, BudgetError, BudgetExceeded, Charge, zcdp_epsilon
from hdmm.privacy import ZCDP, ApproxDP, PureDP, zcdp_delta, zcdp_rho

X = np.array([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])


@pytest.fixture
def draws(monkeypatch):
    """Counts the kernel's noise draws (hdmm.noise.draw as the kernel calls it)."""
    calls = []
    real = hdmm.kernel.draw

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(hdmm.kernel, "draw", counting)
    return calls


def _plan(privacy):
    return hdmm.plan(hdmm.Prefix(6), hdmm.Identity(6), privacy)


# ---------------------------------------------------------------------------------- composition
def test_pure_dp_adds_epsilons_and_refuses_beyond_the_total():
    b = Budget(PureDP(1.0))
    for part in (0.1, 0.2, 0.7):  # decimal parts whose doubles add up to a hair above 1
        b.charge(PureDP(part), workload="part")
    assert b.spent == pytest.approx(1.0) and len(b.charges) == 3
    assert [c.number for c in b.charges] == [1, 2, 3] and all(c.unit == "epsilon" for c in b.charges)
    with pytest.raises(BudgetExceeded, match="cannot pay"):
        b.charge(PureDP(1e-6))
    assert len(b.charges) == 3  # a refused charge records nothing


def test_zcdp_adds_rho_and_converts_pure_and_approximate_dp():
    b = Budget(ZCDP(1.0))
    assert b.charge(ZCDP(0.25)).cost == 0.25
    assert b.charge(PureDP(0.5)).cost == pytest.approx(0.125)  # eps^2 / 2
    rho = zcdp_rho(1.0, 1e-6)
    assert b.charge(ApproxDP(1.0, 1e-6)).cost == rho  # the rho the discrete Gaussian was calibrated to
    assert b.spent == pytest.approx(0.375 + rho)
    assert b.remaining == pytest.approx(1.0 - 0.375 - rho)
    with pytest.raises(BudgetExceeded):
        b.check(ZCDP(0.7))


def test_approximate_dp_release_noise_satisfies_the_rho_charged():
    privacy = ApproxDP(1.0, 1e-6)
    sigma = privacy.noise_scale(1.0)
    assert 1.0 / (2 * sigma**2) <= Budget(ZCDP(1.0)).cost(privacy)


def test_combinations_that_do_not_compose_are_refused():
    pure = Budget(PureDP(5.0))
    for privacy in (ZCDP(0.1), ApproxDP(1.0, 1e-6)):
        with pytest.raises(BudgetError, match="cannot be charged to a pure-DP budget"):
            pure.charge(privacy)
    with pytest.raises(BudgetError, match="from_approx_dp"):
        Budget(ApproxDP(1.0, 1e-6))
    with pytest.raises(BudgetError, match="zCDP budgets only"):
        Budget(PureDP(1.0), delta=1e-6)
    with pytest.raises(TypeError):
        Budget(1.0)


def test_epsilon_delta_reports_by_the_standard_conversion():
    b = Budget.from_approx_dp(2.0, 1e-6)
    assert b.total.rho == zcdp_rho(2.0, 1e-6) and b.delta == 1e-6
    assert b.epsilon_at(total=True) == pytest.approx(2.0, rel=1e-6) and b.epsilon_at(total=True) <= 2.0
    assert b.epsilon_at() == 0.0
    b.charge(ApproxDP(1.0, 1e-6))
    assert b.epsilon_at() == pytest.approx(1.0, rel=1e-6)
    # two (1, 1e-6) releases: rho adds, so together they cost less than 2 epsilon at the same delta
    b.charge(ApproxDP(1.0, 1e-6))
    assert 1.0 < b.epsilon_at() < 2.0
    assert Budget(PureDP(3.0)).epsilon_at(1e-6, total=True) == 3.0
    with pytest.raises(BudgetError, match="delta"):
        Budget(ZCDP(1.0)).epsilon_at()


@pytest.mark.parametrize("delta", [2.0, 0.0, -1e-6, 1.0, float("nan"), float("inf"), True, "1e-6"])
@pytest.mark.parametrize("total", [PureDP(3.0), ZCDP(1.0)])
def test_epsilon_at_refuses_a_delta_outside_0_1_for_every_budget(total, delta):
    # a pure-DP budget returned its epsilon for any delta, 2 included (a zCDP budget refused it)
    with pytest.raises(BudgetError, match=r"delta must be a number in \(0, 1\)"):
        Budget(total).epsilon_at(delta)


@pytest.mark.parametrize("rho, delta", [(1e-4, 1e-9), (0.01, 1e-6), (0.5, 1e-6), (3.0, 1e-3), (50.0, 1e-10)])
def test_zcdp_epsilon_inverts_the_conversion(rho, delta):
    eps = zcdp_epsilon(rho, delta)
    assert zcdp_delta(rho, eps) <= delta
    assert zcdp_delta(rho, eps * (1 - 1e-9)) > delta * (1 - 1e-6)  # tight
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))  # at most the classical bound
    assert zcdp_rho(eps * (1 + 1e-9), delta) >= rho * (1 - 1e-6)


# ---------------------------------------------------------------------------------- refusal before noise
def test_measure_charges_before_the_noise_and_refuses_without_drawing(draws):
    b = Budget(PureDP(1.5))
    p = _plan(PureDP(1.0))
    m = hdmm.measure(p, X, budget=b, label="prefix")
    assert len(draws) == 1 and m.charge == b.charges[0] and m.charge.workload == "prefix"
    with pytest.raises(BudgetExceeded, match="nothing was measured"):
        hdmm.measure(p, X, budget=b)
    with pytest.raises(BudgetError, match="pure-DP budget"):
        hdmm.measure(_plan(ZCDP(0.01)), X, budget=b)
    assert len(draws) == 1 and len(b.charges) == 1


def test_run_refuses_an_exhausted_budget_before_planning(draws, monkeypatch):
    b = Budget(ZCDP(0.1))
    planned = []
    monkeypatch.setattr(hdmm.release, "make_plan", lambda *a, **k: planned.append(a))
    with pytest.raises(BudgetExceeded):
        hdmm.run(hdmm.Prefix(6), X, ZCDP(0.2), budget=b)
    assert not draws and not planned and not b.charges


def test_bad_data_is_refused_before_the_charge(draws):
    b = Budget(PureDP(1.0))
    with pytest.raises(ValueError, match="negative"):
        hdmm.measure(_plan(PureDP(1.0)), -X, budget=b)
    assert not b.charges and not draws


def test_run_records_and_settles_its_charge():
    b = Budget(ZCDP(1.0))
    release = hdmm.run(hdmm.Prefix(6), X, PureDP(1.0), strategy=hdmm.Identity(6), rng=0, budget=b, label="ages")
    (charge,) = b.charges
    assert charge.status == "released" and charge.cost == 0.5 and charge.workload == "ages"
    assert release.charge == charge and release.provenance()["charge"] == charge.to_dict()
    assert "budget charge 1" in release.summary()
    plain = hdmm.run(hdmm.Prefix(6), X, PureDP(1.0), strategy=hdmm.Identity(6), rng=0)
    assert plain.charge is None and plain.provenance()["charge"] is None


# ---------------------------------------------------------------------------------- the budget file
def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_budget_file_round_trip(tmp_path):
    path = tmp_path / "budget.json"
    b = Budget.from_approx_dp(3.0, 1e-6)
    b.save(path)
    assert b.path == str(path)
    b.charge(PureDP(0.5), workload="sf1")
    b.settle(b.charges[0], output="/out/sf1.csv")
    b.charge(ApproxDP(1.0, 1e-6), workload="pl94")
    loaded = Budget.load(path)
    assert loaded.total == b.total and loaded.delta == 1e-6 and loaded.charges == b.charges
    assert loaded.spent == b.spent and loaded.charges[0].output == "/out/sf1.csv"
    assert loaded.head == b.head and loaded.head.startswith("sha256:")
    listed = _lines(path)  # one readable JSON object per line: the total, each charge, each mark
    assert [d.get("record") for d in listed] == [None, "charge", "released", "charge"]
    assert [set(d) >= {"time", "workload", "privacy", "charge"} for d in listed if d.get("record") == "charge"] == [
        True, True]
    assert "pl94" in loaded.summary() and "epsilon" in loaded.summary()


def test_each_charge_is_on_disk_before_the_noise_is_drawn(tmp_path, monkeypatch):
    path = tmp_path / "budget.json"
    Budget(PureDP(2.0)).save(path)
    b = Budget.load(path)
    seen = []

    def draw(*args, **kwargs):
        seen.append(len(Budget.load(path).charges))
        raise RuntimeError("power cut")

    monkeypatch.setattr(hdmm.kernel, "draw", draw)
    with pytest.raises(RuntimeError, match="power cut"):
        hdmm.measure(_plan(PureDP(1.5)), X, budget=b)
    assert seen == [1]
    after = Budget.load(path)  # the failed measurement left its charge: over-counted, never under-counted
    assert after.spent == 1.5 and after.charges[0].status == "charged"
    with pytest.raises(BudgetExceeded):
        hdmm.measure(_plan(PureDP(1.0)), X, budget=after)


def test_a_failed_write_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    import hdmm.ledger
    path = tmp_path / "budget.json"
    b = Budget(PureDP(2.0))
    b.save(path)
    b.charge(PureDP(0.5))
    before = path.read_bytes()

    def fail(descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(hdmm.ledger.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        b.charge(PureDP(0.5))
    monkeypatch.undo()
    assert path.read_bytes() == before and len(b.charges) == 1  # neither file nor budget changed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["budget.json"]  # no temporary left behind
    b.charge(PureDP(0.5))
    assert Budget.load(path).spent == 1.0


def test_an_unfinished_append_never_counts_and_is_removed(tmp_path):
    path = tmp_path / "budget.json"
    b = Budget(PureDP(2.0))
    b.save(path)
    b.charge(PureDP(0.5))
    with open(path, "ab") as file:  # a crash in the middle of writing a charge's line
        file.write(b'{"record": "charge", "number": 2, "ti')
    assert Budget.load(path).spent == 0.5
    b.charge(PureDP(1.0))
    assert [c.cost for c in Budget.load(path).charges] == [0.5, 1.0]


def test_a_file_charged_by_someone_else_meanwhile_is_read_before_charging(tmp_path):
    # the charge is checked against the file as it is under the lock: both fit, so both succeed (they were
    # refused before: 'changed since it was read'); a charge that no longer fits is refused
    path = tmp_path / "budget.json"
    Budget(PureDP(2.0)).save(path)
    first, second = Budget.load(path), Budget.load(path)
    first.charge(PureDP(1.0), workload="first")
    second.charge(PureDP(0.5), workload="second")
    assert [c.workload for c in second.charges] == ["first", "second"] and second.spent == 1.5
    with pytest.raises(BudgetExceeded, match="0.5 of the total"):
        first.charge(PureDP(1.0))
    second.settle(second.charges[1], output="o.csv")
    first.settle(first.charges[0])
    after = Budget.load(path)
    assert after.spent == 1.5 and [c.status for c in after.charges] == ["released", "released"]


def test_a_file_replaced_meanwhile_is_not_written(tmp_path):
    path = tmp_path / "budget.json"
    Budget(PureDP(2.0)).save(path)
    b = Budget.load(path)
    b.charge(PureDP(0.5))
    other = tmp_path / "other.json"
    Budget(PureDP(9.0)).save(other)
    os.replace(other, path)
    with pytest.raises(BudgetError, match="changed other than by appended records"):
        b.charge(PureDP(0.5))
    assert Budget.load(path).charges == ()


def test_save_never_replaces_another_budget(tmp_path):
    path = tmp_path / "budget.json"
    Budget(PureDP(1.0)).save(path)
    with pytest.raises(BudgetError, match="never replaced"):
        Budget(PureDP(5.0)).save(path)
    assert Budget.load(path).total == PureDP(1.0)


def _valid_lines() -> list[dict]:
    b = Budget(ZCDP(1.0))
    b.charge(ZCDP(0.25), workload="w")
    entries = b._entries()
    b.settle(b.charges[0], output="out.csv")
    return entries + [{"record": "released", "number": 1, "time": "t", "output": "out.csv"}]


def _text(entries, rehash=True) -> str:
    """A budget file of these entries, its chain computed again (so that the entries' own checks are reached)."""
    from hdmm.ledger import chain_hash
    lines, head = [], ""
    for entry in entries:
        entry = {k: v for k, v in entry.items() if k != "hash"}
        head = chain_hash(head, entry) if rehash else "sha256:0"
        lines.append(json.dumps({**entry, "hash": head}))
    return "\n".join(lines) + "\n"


def _edit(line=0, rehash=True, **changes):
    def make():
        entries = _valid_lines()
        for key, value in changes.items():
            entries[line][key] = value
        return _text(entries, rehash)
    return make


def _version_1(**changes):
    def make():
        d = {"format": "hdmm-budget", "version": 1, "total": {"type": "ZCDP", "rho": 1.0}, "delta": None,
             "created": "t", "charges": [{"number": 1, "time": "t", "workload": "w", "privacy": {"type": "ZCDP",
                                          "rho": 0.25}, "charge": 0.25, "unit": "rho", "status": "charged"}]}
        for key, value in changes.items():
            if key.startswith("charge_"):
                d["charges"][0][key[len("charge_"):]] = value
            else:
                d[key] = value
        return json.dumps(d, indent=2)
    return make


HOSTILE = {
    "empty": lambda: "",
    "not json": lambda: "{budget",
    "a list": lambda: "[1, 2]",
    "nan": lambda: _text(_valid_lines()).replace('"charge": 0.25', '"charge": NaN'),
    "deep": lambda: "[" * 100_000 + "]" * 100_000,
    "deep line": lambda: _text(_valid_lines()) + "[" * 100_000 + "]" * 100_000 + "\n",
    "huge int": lambda: _text(_valid_lines()).replace('"charge": 0.25', '"charge": ' + "9" * 5000),
    "int beyond doubles": _edit(1, charge=10**400),
    "wrong format": _edit(format="hdmm-strategy"),
    "version text": _edit(version="2"),
    "newer version": _edit(version=99),
    "unknown entry": _edit(extra=1),
    "total approx": _edit(total={"type": "ApproxDP", "epsilon": 1.0, "delta": 1e-6}),
    "total unknown": _edit(total={"type": "Renyi", "alpha": 2}),
    "total negative": _edit(total={"type": "ZCDP", "rho": -1}),
    "total text": _edit(total="rho=1"),
    "keyed": _edit(keyed=True),
    "keyed text": _edit(keyed="no"),
    "bad delta": _edit(delta=2.0),
    "record kind": _edit(1, record="refund"),
    "cost edited": _edit(1, charge=0.01),
    "cost negative": _edit(1, charge=-0.25),
    "cost text": _edit(1, charge="0.25"),
    "number": _edit(1, number=2),
    "number bool": _edit(1, number=True),
    "unit": _edit(1, unit="epsilon"),
    "privacy": _edit(1, privacy={"type": "ZCDP"}),
    "privacy kind": _edit(1, privacy={"type": "PureDP", "epsilon": 1.0, "extra": 2}),
    "time": _edit(1, time=17),
    "status in a charge": _edit(1, status="released"),
    "mark of no charge": _edit(2, number=2),
    "mark output": _edit(2, output=[1]),
    "mark time": _edit(2, time=None),
    "raised total, chain kept": _edit(0, rehash=False, total={"type": "ZCDP", "rho": 9.0}),
    "cost edited, chain kept": _edit(1, rehash=False, charge=0.01),
    "a charge deleted": lambda: "".join(_text(_valid_lines()).splitlines(True)[i] for i in (0, 2)),
    "lines swapped": lambda: "".join(_text(_valid_lines()).splitlines(True)[i] for i in (0, 2, 1)),
    "version 1: cost edited": _version_1(charge_charge=0.01),
    "version 1: number": _version_1(charge_number=2),
    "version 1: status": _version_1(charge_status="refunded"),
    "version 1: output": _version_1(charge_output=[1]),
    "version 1: charges dict": _version_1(charges={}),
    "version 1: unknown entry": _version_1(extra=1),
    "binary": lambda: b"\xff\xfe\x00garbage",
}


def test_the_valid_file_of_the_hostile_cases_loads(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(_text(_valid_lines()))
    assert Budget.load(path).charges[0].output == "out.csv"
    path.write_text(_version_1()())
    with pytest.warns(UserWarning, match="version 1"):
        assert Budget.load(path).spent == 0.25


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_or_malformed_file_gives_one_clear_error(tmp_path, name):
    path = tmp_path / "budget.json"
    content = HOSTILE[name]()
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # version 1 files are read with a warning
        Budget.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_directory_and_oversized_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist.*hdmm budget create"):
        Budget.load(tmp_path / "none.json")
    with pytest.raises(ValueError, match="is a directory"):
        Budget.load(tmp_path)
    path = tmp_path / "budget.json"
    Budget(PureDP(1.0)).save(path)
    with pytest.raises(ValueError, match="larger than 10 bytes"):
        Budget.load(path, max_bytes=10)


def test_charge_records_round_trip():
    c = Charge(number=3, time="2024-01-01T00:00:00+00:00", workload="sf1", privacy=ApproxDP(1.0, 1e-6), cost=0.1,
               unit="rho", status="released", output="out.csv")
    assert Charge.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_two_writers_at_once_are_serialised_and_both_charged(tmp_path, monkeypatch):
    # the first writer pauses inside the lock, just before its line reaches the disk; the second must wait
    # for it (the directory lock), then read the first's charge and append its own after it
    import threading

    import hdmm.ledger as L
    path = tmp_path / "budget.json"
    Budget(PureDP(2.0)).save(path)
    first, second = Budget.load(path), Budget.load(path)
    inside, go_on = threading.Event(), threading.Event()
    fsync = os.fsync

    def paused_fsync(descriptor):
        if threading.current_thread().name == "first":
            inside.set()
            assert go_on.wait(10)
        fsync(descriptor)

    monkeypatch.setattr(L.os, "fsync", paused_fsync)
    outcome = {}

    def charge(budget, name):
        try:
            outcome[name] = budget.charge(PureDP(0.5), workload=name)
        except BudgetError as exc:
            outcome[name] = exc

    threads = {name: threading.Thread(target=charge, args=(b, name), name=name)
               for name, b in [("first", first), ("second", second)]}
    threads["first"].start()
    assert inside.wait(10)
    threads["second"].start()
    threads["second"].join(0.3)
    assert threads["second"].is_alive()          # waiting for the lock, not writing
    go_on.set()
    for thread in threads.values():
        thread.join(10)
    assert outcome["first"].number == 1 and outcome["second"].number == 2
    assert [c.workload for c in Budget.load(path).charges] == ["first", "second"]


def _charge_in_a_process(path: str, ready, outcomes) -> None:
    b = Budget.load(path)  # every process reads the budget before any of them charges it
    ready.wait(20)
    try:
        b.settle(b.charge(PureDP(1.0), workload="w"), output="o")
        outcomes.put("charged")
    except BudgetExceeded:
        outcomes.put("refused")
    except BudgetError as exc:
        outcomes.put(f"error: {exc}")


def test_concurrent_processes_that_fit_all_succeed(tmp_path):
    # four processes with room for three, all having read the budget before any charges: three charges, one
    # refusal, nothing lost (before: 'changed since it was read' refused all but the first). The processes are
    # forked (hdmm is imported already), so the test takes well under a second even on a loaded machine.
    import multiprocessing
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork (POSIX) to start processes quickly")
    context = multiprocessing.get_context("fork")
    path = tmp_path / "budget.json"
    Budget(PureDP(3.0)).save(path)
    ready, outcomes = context.Barrier(4), context.Queue()
    processes = [context.Process(target=_charge_in_a_process, args=(str(path), ready, outcomes)) for _ in range(4)]
    for process in processes:
        process.start()
    results = sorted(outcomes.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(10)
    assert results == ["charged"] * 3 + ["refused"]
    after = Budget.load(path)
    assert after.spent == 3.0 and [c.status for c in after.charges] == ["released"] * 3


def test_a_budget_write_waits_for_the_lock_only_so_long(tmp_path, monkeypatch):
    fcntl = pytest.importorskip("fcntl")
    import hdmm.ledger as L
    path = tmp_path / "budget.json"
    Budget(PureDP(2.0)).save(path)
    b = Budget.load(path)
    monkeypatch.setattr(L, "LOCK_TIMEOUT", 0.05)
    holder = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(BudgetError, match="another process has been writing a budget file"):
            b.charge(PureDP(0.5))
    finally:
        os.close(holder)
    assert Budget.load(path).charges == () and b.charges == ()
    b.charge(PureDP(0.5))
    assert len(Budget.load(path).charges) == 1


# ---------------------------------------------------------------------------------- chain, keys, versions
KEY = b"k" * 32


def test_a_keyed_file_needs_its_key_and_cannot_be_rechained_without_it(tmp_path):
    from hdmm.ledger import chain_hash
    path = tmp_path / "budget.json"
    b = Budget(PureDP(2.0))
    b.save(path, key=KEY)
    b.charge(PureDP(0.5), workload="w")
    assert b.head.startswith("hmac-sha256:")
    assert Budget.load(path, key=KEY).spent == 0.5
    with pytest.raises(ValueError, match="saved with a key"):
        Budget.load(path)
    with pytest.raises(ValueError, match="chain of hashes breaks at line 1.*key is wrong"):
        Budget.load(path, key=b"x" * 32)
    # an unkeyed re-chain of an edited file (what anyone can compute) does not pass the keyed check
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    entries[0]["total"] = {"type": "PureDP", "epsilon": 9.0}
    head, lines = "", []
    for entry in entries:
        entry.pop("hash")
        head = chain_hash(head, entry)
        lines.append(json.dumps({**entry, "hash": head}))
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="chain of hashes breaks at line 1"):
        Budget.load(path, key=KEY)
    Budget(PureDP(1.0)).save(tmp_path / "plain.json")
    with pytest.raises(ValueError, match="saved without a key"):
        Budget.load(tmp_path / "plain.json", key=KEY)
    with pytest.raises(ValueError, match="at least 16"):
        Budget(PureDP(1.0)).save(tmp_path / "short.json", key=b"short")


def test_a_version_1_file_is_read_with_a_warning_and_rewritten_chained_at_its_next_charge(tmp_path):
    path = tmp_path / "budget.json"
    old = {"format": "hdmm-budget", "version": 1, "total": {"type": "PureDP", "epsilon": 2.0}, "delta": None,
           "created": "2024-01-01T00:00:00+00:00",
           "charges": [{"number": 1, "time": "t", "workload": "w", "privacy": {"type": "PureDP", "epsilon": 0.5},
                        "charge": 0.5, "unit": "epsilon", "status": "released", "output": "o.csv"}]}
    path.write_text(json.dumps(old, indent=2) + "\n")
    with pytest.warns(UserWarning, match="version 1"):
        b = Budget.load(path)
    assert b.spent == 0.5 and b.head is None
    b.charge(PureDP(1.0), workload="new")
    after = Budget.load(path)  # no warning: version 2 now
    assert [(c.workload, c.status) for c in after.charges] == [("w", "released"), ("new", "charged")]
    assert after.charges[0].output == "o.csv" and after.head == b.head


def test_marking_a_charge_released_reads_only_the_end_of_the_file(tmp_path, monkeypatch):
    # O(1) per mark: the file is read from the last line this budget verified, not from its start
    import hdmm.ledger as L
    path = tmp_path / "budget.json"
    b = Budget(PureDP(1e6))
    for _ in range(300):  # in memory, then saved at once (one fsync, not 300)
        b.charge(PureDP(1.0), workload="w")
    b.save(path)
    size = path.stat().st_size
    b = Budget.load(path)
    read = []
    parse = L.Ledger.parse

    def counting(self, data, *args, **kwargs):
        read.append(len(data))
        return parse(self, data, *args, **kwargs)

    monkeypatch.setattr(L.Ledger, "parse", counting)
    b.settle(b.charges[150], output="o.csv")
    b.charge(PureDP(1.0))
    assert max(read) < 1000 < size
    assert Budget.load(path).charges[150].status == "released"


def test_two_releases_on_a_version_1_file_both_charge_while_one_of_them_upgrades_it(tmp_path):
    # both read the version-1 file; the first charge rewrites it chained; the second then finds the file changed:
    # it reads the upgraded file (which must still hold its charges) and appends (before: refused, 'changed since
    # it was read', although the budget could pay)
    path = tmp_path / "budget.json"
    old = {"format": "hdmm-budget", "version": 1, "total": {"type": "PureDP", "epsilon": 2.0}, "delta": None,
           "created": "2024-01-01T00:00:00+00:00",
           "charges": [{"number": 1, "time": "t", "workload": "w", "privacy": {"type": "PureDP", "epsilon": 0.5},
                        "charge": 0.5, "unit": "epsilon", "status": "charged"}]}
    path.write_text(json.dumps(old, indent=2) + "\n")
    with pytest.warns(UserWarning, match="version 1"):
        first, second = Budget.load(path), Budget.load(path)
    first.charge(PureDP(1.0), workload="first")
    second.settle(second.charge(PureDP(0.5), workload="second"), output="o.csv")
    assert [c.workload for c in second.charges] == ["w", "first", "second"] and second.head is not None
    with pytest.raises(BudgetExceeded):
        first.charge(PureDP(0.5))
    after = Budget.load(path)
    assert after.spent == 2.0 and [c.status for c in after.charges] == ["charged", "charged", "released"]


def test_a_version_1_file_replaced_by_another_budget_meanwhile_is_not_written(tmp_path):
    path = tmp_path / "budget.json"
    old = {"format": "hdmm-budget", "version": 1, "total": {"type": "PureDP", "epsilon": 2.0}, "delta": None,
           "created": "t", "charges": [{"number": 1, "time": "t", "workload": "w", "privacy": {"type": "PureDP",
                                        "epsilon": 0.5}, "charge": 0.5, "unit": "epsilon", "status": "charged"}]}
    path.write_text(json.dumps(old) + "\n")
    with pytest.warns(UserWarning, match="version 1"):
        b = Budget.load(path)
    path.unlink()
    Budget(PureDP(9.0)).save(path)  # another budget, chained, without the charge b read
    with pytest.raises(BudgetError, match="changed since it was read"):
        b.charge(PureDP(0.5))
    assert Budget.load(path).charges == ()


def test_an_earlier_line_edited_in_place_while_a_release_runs_is_found_by_the_next_load(tmp_path):
    # what docs/privacy.md states: an append checks only what was appended since its budget read the file
    path = tmp_path / "budget.json"
    b = Budget(PureDP(3.0))
    b.save(path)
    b.charge(PureDP(1.0), workload="aaaa")
    b.charge(PureDP(0.5), workload="last")  # the line the running release compares before it appends
    running = Budget.load(path)
    path.write_text(path.read_text().replace('"aaaa"', '"bbbb"'))  # same length: the offsets do not move
    running.charge(PureDP(1.0))
    with pytest.raises(ValueError, match="chain of hashes breaks at line 2"):
        Budget.load(path)
