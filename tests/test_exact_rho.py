"""An exact rho (fractions.Fraction) in ZCDP, budgets and provenance (issue 23, item 4)."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest

import hdmm
from hdmm.budget import Budget, BudgetExceeded, Charge
from hdmm.privacy import ZCDP, Privacy, exact_entry, read_exact
from hdmm.release import Release

RHO = Fraction(293764, 114921)  # the 2020 Census PL94 person rho, (542/339)**2
SHARES = (104, 1440, 447, 687, 1256, 165)  # out of 4099


def test_zcdp_keeps_a_fraction_and_floats_stay_floats():
    z = ZCDP(RHO)
    assert isinstance(z.rho, Fraction) and z.rho == RHO
    assert isinstance(ZCDP(1).rho, float) and isinstance(ZCDP(0.5).rho, float)
    assert z.noise_scale(1.0) == 1.0 / math.sqrt(float(2 * RHO))
    assert z.noise_variance(2.0) == pytest.approx(4.0 / (2 * float(RHO)), rel=1e-15)
    assert ZCDP(Fraction(1, 2)) == ZCDP(0.5) and hash(ZCDP(Fraction(1, 2))) == hash(ZCDP(0.5))
    assert "293764/114921" in z.description


@pytest.mark.parametrize("bad", [Fraction(0), Fraction(-1, 3)])
def test_zcdp_refuses_a_non_positive_fraction(bad):
    with pytest.raises(ValueError, match="rho must be a finite number > 0"):
        ZCDP(bad)


def test_to_dict_writes_the_fraction_and_its_double_and_reads_back():
    d = ZCDP(RHO).to_dict()
    assert d == {"type": "ZCDP", "rho": float(RHO), "rho_exact": "293764/114921"}
    back = Privacy.from_dict(json.loads(json.dumps(d)))
    assert isinstance(back.rho, Fraction) and back.rho == RHO
    assert ZCDP(0.5).to_dict() == {"type": "ZCDP", "rho": 0.5}  # float rhos are written as before
    assert exact_entry("rho", 0.5) == {}


@pytest.mark.parametrize("text, approx, match", [
    ("293764/114921", 2.5, "not the double nearest"),
    ("293764/0", 1.0, "zero denominator"),
    ("1/-2", -0.5, "written 'p/q'"),
    ("0.5", 0.5, "written 'p/q'"),
    (0.5, 0.5, "written 'p/q'"),
    ("1/2/3", 0.5, "written 'p/q'"),
])
def test_read_exact_refuses_damaged_records(text, approx, match):
    with pytest.raises(ValueError, match=match):
        read_exact("rho", text, approx)
    with pytest.raises(ValueError):
        Privacy.from_dict({"type": "ZCDP", "rho": approx, "rho_exact": text})


def test_level_shares_compose_exactly_to_the_total():
    b = Budget(ZCDP(RHO))
    for share in SHARES:
        c = b.charge(ZCDP(RHO * share / 4099), workload=f"level {share}")
        assert isinstance(c.cost, Fraction)
    assert sum(SHARES) == 4099
    assert b.spent_exact == RHO and b.remaining_exact == 0 and b.remaining == 0.0
    with pytest.raises(BudgetExceeded):
        b.charge(ZCDP(Fraction(1, 10**6)))
    # the float shares do not add up exactly: the exact sum differs from RHO
    f = Budget(ZCDP(float(RHO)))
    for share in SHARES:
        f.charge(ZCDP(float(RHO) * share / 4099))
    assert f.spent_exact != RHO


def test_budget_file_keeps_exact_charges(tmp_path):
    path = tmp_path / "b.jsonl"
    b = Budget(ZCDP(RHO))
    b.save(path)
    b.charge(ZCDP(RHO * 104 / 4099), workload="nation")
    b.charge(ZCDP(0.25), workload="a float")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["total"] == {"type": "ZCDP", "rho": float(RHO), "rho_exact": "293764/114921"}
    assert lines[1]["charge_exact"] == f"{RHO.numerator * 104}/{RHO.denominator * 4099}" or \
        Fraction(lines[1]["charge_exact"]) == RHO * 104 / 4099
    assert "charge_exact" not in lines[2]
    again = Budget.load(path)
    assert again.total.rho == RHO and isinstance(again.total.rho, Fraction)
    assert again.charges[0].cost == RHO * 104 / 4099 and isinstance(again.charges[0].cost, Fraction)
    assert again.spent_exact == RHO * 104 / 4099 + Fraction(0.25)
    assert "293764/114921" in again.summary()


def test_a_charge_whose_fraction_disagrees_with_its_float_is_refused():
    d = Charge(1, "t", "w", ZCDP(RHO), RHO, "rho").to_dict()
    assert Charge.from_dict(d).cost == RHO
    with pytest.raises(ValueError, match="damaged or edited"):
        Charge.from_dict({**d, "charge": 2.5})
    b = Budget(ZCDP(RHO))
    with pytest.raises(ValueError, match="costs"):  # a cost that is not what the privacy costs
        b._checked(Charge(1, "t", "w", ZCDP(RHO), RHO / 2, "rho"), "here")


def test_a_release_records_the_exact_rho_in_its_provenance(tmp_path):
    budget = Budget(ZCDP(RHO))
    r = hdmm.run(hdmm.Prefix(4), np.array([3, 1, 4, 1]), ZCDP(RHO), strategy=hdmm.Identity(4), rng=1,
                 budget=budget)
    prov = json.loads(json.dumps(r.provenance()))
    assert prov["privacy"] == {"type": "ZCDP", "rho": float(RHO), "rho_exact": "293764/114921"}
    assert prov["calibrated_rho"] == float(RHO)
    assert prov["charge"]["charge_exact"] == "293764/114921"
    assert r.plan.noise_scale == pytest.approx(r.plan.sensitivity / math.sqrt(2 * float(RHO)), rel=1e-15)
    r.save(tmp_path / "r.npz")
    back = Release.load(tmp_path / "r.npz")
    assert back.privacy.rho == RHO and isinstance(back.privacy.rho, Fraction)
    assert back.charge.cost == RHO


def test_a_geography_release_records_the_exact_rho():
    import scipy.sparse as sp

    from hdmm.geography import GeographyTree
    from hdmm.georelease import ArrayHistograms, geo_plan, release_geography

    tree = GeographyTree.from_parents({"a": "US", "b": "US", "a1": "a", "a2": "a", "b1": "b"},
                                      ["nation", "state", "county"])
    p = geo_plan(tree, hdmm.Identity(3), ZCDP(RHO), strategy=hdmm.Identity(3))
    budget = Budget(ZCDP(RHO))
    r = release_geography(p, ArrayHistograms(sp.csr_matrix(np.arange(9.0).reshape(3, 3))), seed=1, budget=budget)
    prov = json.loads(json.dumps(r.provenance()))
    assert prov["privacy"]["rho_exact"] == "293764/114921"
    assert budget.remaining_exact == 0


def test_cli_takes_an_exact_rho(tmp_path, capsys):
    from hdmm.cli import main

    path = str(tmp_path / "b.jsonl")
    assert main(["budget", "create", path, "--rho", "293764/114921"]) == 0
    assert "293764/114921" in capsys.readouterr().out
    assert Budget.load(path).total.rho == RHO
    with pytest.raises(SystemExit):
        main(["budget", "create", str(tmp_path / "c.jsonl"), "--rho", "1/0"])
    assert "not a fraction" in capsys.readouterr().err
