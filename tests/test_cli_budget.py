"""``hdmm budget`` and ``hdmm release --budget``: a budget file charged before any noise, refused when exhausted."""

from __future__ import annotations

import json

import pytest
from cli_files import GEO_SPEC, block_work, fails, write_workload_and_records

import hdmm.kernel
import hdmm.privacy
from hdmm.budget import Budget
from hdmm.cli import main
from hdmm.privacy import ApproxDP, zcdp_rho


@pytest.fixture
def files(tmp_path):
    return write_workload_and_records(tmp_path, GEO_SPEC, 200)


def release(workload, data, *more, privacy=("--epsilon", "1")):
    return ["release", "--workload", workload, "--data", data, *privacy, "--strategy", "identity", *more]


@pytest.fixture
def no_work(monkeypatch):
    block_work(monkeypatch, ("optimize", "plan", "run", "_records"),
               "the CLI started work before the budget was checked")


def test_create_release_show_and_refuse_when_exhausted(files, capsys, monkeypatch):
    tmp, workload, data = files
    budget = str(tmp / "budget.json")
    assert main(["budget", "create", budget, "--epsilon", "1.5"]) == 0
    assert "created" in capsys.readouterr().out
    out = tmp / "r.csv"
    assert main(release(workload, data, "--budget", budget, "--output", str(out), "--noise-seed", "1")) == 0
    printed = capsys.readouterr().out
    assert "budget charge 1: epsilon 1 (released)" in printed and "spent 1 of 1.5, 0.5 left" in printed
    (charge,) = Budget.load(budget).charges
    assert charge.status == "released" and charge.output == str(out) and charge.workload == workload
    provenance = json.loads((tmp / "r.csv.json").read_text())
    assert provenance["charge"] == charge.to_dict()
    assert provenance["budget"] == {"file": budget, "total": {"type": "PureDP", "epsilon": 1.5}, "spent": 1.0,
                                    "remaining": 0.5, "unit": "epsilon"}
    assert main(["budget", "show", budget]) == 0
    shown = capsys.readouterr().out
    assert "spent epsilon = 1 in 1 charge(s); remaining 0.5" in shown and str(out) in shown
    before = open(budget, "rb").read()
    # refused before reading the data or planning
    block_work(monkeypatch, ("optimize", "plan", "run", "_records"), "work started")
    again = ("--output", str(tmp / "r2.csv"))
    assert "cannot pay" in fails(release(workload, data, "--budget", budget, *again), capsys)
    assert "pure-DP budget" in fails(release(workload, data, "--budget", budget, *again, privacy=("--rho", "0.01")),
                                     capsys)
    assert open(budget, "rb").read() == before


def test_an_approximate_dp_budget_is_kept_in_zcdp(files, capsys):
    tmp, workload, data = files
    budget = str(tmp / "budget.json")
    assert main(["budget", "create", budget, "--epsilon", "3", "--delta", "1e-6"]) == 0
    assert "implies (epsilon=3, delta=1e-06)-DP" in capsys.readouterr().out
    assert main(release(workload, data, "--budget", budget, "--output", str(tmp / "r.csv"),
                        privacy=("--epsilon", "1", "--delta", "1e-6"))) == 0
    capsys.readouterr()
    loaded = Budget.load(budget)
    assert loaded.unit == "rho" and loaded.charges[0].cost == zcdp_rho(1.0, 1e-6)
    assert loaded.charges[0].privacy == ApproxDP(1.0, 1e-6)
    assert main(["budget", "show", budget, "--delta", "1e-9"]) == 0
    assert "at delta = 1e-09" in capsys.readouterr().out


def test_the_charge_is_on_disk_before_the_noise(files, monkeypatch):
    tmp, workload, data = files
    budget = str(tmp / "budget.json")
    assert main(["budget", "create", budget, "--rho", "1"]) == 0

    def crash(*args, **kwargs):
        assert len(Budget.load(budget).charges) == 1
        raise KeyboardInterrupt

    monkeypatch.setattr(hdmm.kernel, "draw", crash)
    with pytest.raises(KeyboardInterrupt):
        main(release(workload, data, "--budget", budget, "--output", str(tmp / "r.csv"), privacy=("--rho", "0.5")))
    (charge,) = Budget.load(budget).charges
    assert charge.status == "charged" and charge.output is None and charge.cost == 0.5
    assert not (tmp / "r.csv").exists()


def test_budget_file_problems_are_one_line(files, no_work, capsys):
    tmp, workload, data = files
    missing = str(tmp / "none.json")
    out = ("--output", str(tmp / "r.csv"))
    assert "hdmm budget create" in fails(release(workload, data, "--budget", missing, *out), capsys)
    bad = tmp / "bad.json"
    bad.write_text('{"format": "hdmm-budget", "version": 1, "total": {"type": "PureDP", "epsilon": "lots"}}')
    assert str(bad) in fails(release(workload, data, "--budget", str(bad), *out), capsys)
    assert str(bad) in fails(["budget", "show", str(bad)], capsys)
    assert "never replaced" in fails(["budget", "create", str(bad), "--epsilon", "1"], capsys)
    assert "give a privacy budget" in fails(["budget", "create", str(tmp / "new.json")], capsys)
    # a geography release reads and checks its budget first too
    assert "hdmm budget create" in fails(release(workload, data, "--budget", missing, "--geography", "state",
                                                 "--output", str(tmp / "g")), capsys)


def test_a_budget_needs_an_output_to_keep_what_it_pays_for(files, no_work, capsys):
    tmp, workload, data = files
    budget = str(tmp / "budget.json")
    assert main(["budget", "create", budget, "--epsilon", "2"]) == 0
    capsys.readouterr()
    assert "give --output FILE" in fails(release(workload, data, "--budget", budget), capsys)
    assert Budget.load(budget).charges == ()


def test_charges_made_by_others_meanwhile_do_not_stop_a_release_from_being_marked_released(tmp_path):
    # a second release charged the file after this one was charged: settling re-reads it and keeps both
    path = tmp_path / "budget.json"
    Budget(hdmm.privacy.PureDP(3.0)).save(path)
    mine, other = Budget.load(path), Budget.load(path)
    charge = mine.charge(hdmm.privacy.PureDP(1.0), workload="mine")
    other = Budget.load(path)
    other.charge(hdmm.privacy.PureDP(1.0), workload="other")
    settled = mine.settle(charge, output="out.csv")
    on_disk = Budget.load(path).charges
    assert [(c.workload, c.status) for c in on_disk] == [("mine", "released"), ("other", "charged")]
    assert settled.output == "out.csv" and mine.spent == 2.0


def test_a_budget_file_gone_after_the_charge_does_not_lose_the_release(tmp_path):
    import os

    import numpy as np

    import hdmm
    path = tmp_path / "budget.json"
    Budget(hdmm.privacy.PureDP(2.0)).save(path)
    budget = Budget.load(path)
    real = hdmm.kernel.draw

    def draw_then_lose_the_file(*args, **kwargs):
        os.remove(path)
        return real(*args, **kwargs)

    import pytest as _pytest
    with _pytest.MonkeyPatch.context() as m:
        m.setattr(hdmm.kernel, "draw", draw_then_lose_the_file)
        with _pytest.warns(RuntimeWarning, match="could not be marked released"):
            release = hdmm.run(hdmm.Prefix(4), np.array([3.0, 1.0, 4.0, 1.0]), hdmm.privacy.PureDP(1.0),
                               strategy=hdmm.Identity(4), budget=budget)
    assert release.answers.shape == (4,) and release.charge.status == "charged"


def test_show_refuses_a_delta_outside_0_1(files, capsys):
    tmp, _, _ = files
    budget = str(tmp / "budget.json")
    assert main(["budget", "create", budget, "--epsilon", "2"]) == 0
    capsys.readouterr()
    for delta in ("2", "0", "-1e-6", "nan"):
        assert "--delta must be a number in (0, 1)" in fails(["budget", "show", budget, f"--delta={delta}"], capsys)
    assert main(["budget", "show", budget, "--delta", "1e-6"]) == 0
    assert "latest hash: sha256:" in capsys.readouterr().out


def test_a_keyed_budget_file_through_the_cli(files, no_work, capsys):
    tmp, workload, data = files
    budget, key = str(tmp / "budget.json"), tmp / "budget.key"
    key.write_bytes(b"s" * 32)
    assert main(["budget", "create", budget, "--epsilon", "2", "--budget-key", str(key)]) == 0
    assert "signed with the key" in capsys.readouterr().out
    assert main(["budget", "show", budget, "--budget-key", str(key)]) == 0
    assert "latest hash: hmac-sha256:" in capsys.readouterr().out
    out = ("--output", str(tmp / "r.csv"))
    assert "(--budget-key FILE)" in fails(["budget", "show", budget], capsys)
    assert "(--budget-key FILE)" in fails(release(workload, data, "--budget", budget, *out), capsys)
    assert "give --budget FILE too" in fails(release(workload, data, "--budget-key", str(key), *out), capsys)
    (tmp / "short.key").write_bytes(b"x")
    assert "16 to 4096 bytes" in fails(["budget", "show", budget, "--budget-key", str(tmp / "short.key")], capsys)


def _release_in_a_process(args, ready, outcomes) -> None:
    import contextlib
    import io
    charge = Budget.charge

    def charge_together(self, *a, **k):  # every release has read the budget file before any of them charges it
        ready.wait(20)
        return charge(self, *a, **k)

    Budget.charge = charge_together
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code
    outcomes.put((code, err.getvalue().strip()[-300:]))


def test_four_concurrent_releases_with_room_for_four_all_succeed(files):
    # 'hdmm release --budget' in 4 processes at once, each having read the budget before any charges it: all four
    # are charged and marked released (before: 1 succeeded, 3 were refused, 'changed since it was read')
    import multiprocessing
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork (POSIX) to start processes quickly")
    context = multiprocessing.get_context("fork")
    tmp, workload, data = files
    budget = str(tmp / "budget.json")
    Budget(hdmm.privacy.PureDP(4.0)).save(budget)
    ready, outcomes = context.Barrier(4), context.Queue()
    runs = [release(workload, data, "--budget", budget, "--output", str(tmp / f"r{i}.csv")) for i in range(4)]
    processes = [context.Process(target=_release_in_a_process, args=(args, ready, outcomes)) for args in runs]
    for process in processes:
        process.start()
    results = [outcomes.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(10)
    assert [code for code, _ in results] == [0] * 4, results
    after = Budget.load(budget)
    assert after.spent == 4.0 and [c.status for c in after.charges] == ["released"] * 4
    assert sorted(c.output for c in after.charges) == [str(tmp / f"r{i}.csv") for i in range(4)]
