"""``hdmm release --geography``: a Parquet dataset by level, and bad input refused before any noise."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from cli_files import fails, geography_release_args, write_geography_files

from hdmm.cli import main

pytest.importorskip("pyarrow")

@pytest.fixture
def files(tmp_path):
    return write_geography_files(tmp_path)


_release = geography_release_args


def test_geography_release_writes_every_level(files, capsys):
    out = files / "out"
    code = main(_release(files, "--data", str(files / "people.csv"), "--invariants", "state", "--output", str(out)))
    text = capsys.readouterr().out
    assert code == 0, text
    assert "not protected" in text and "expected RMSE" in text and "600" not in text and "read data" not in text
    states, nation = pd.read_parquet(out / "level=state"), pd.read_parquet(out / "level=nation")
    assert len(states) == 2 * 16 and len(nation) == 16 and len(pd.read_parquet(out / "level=county")) == 3 * 16
    meta = json.loads((out / "_provenance.json").read_text())
    assert meta["privacy"]["rho"] == 0.5 and meta["seeded"] is True
    summed = states.groupby("query", observed=True)["answer"].sum()  # the nation is the sum of its states
    np.testing.assert_allclose(nation.set_index("query")["answer"].loc[summed.index], summed, rtol=1e-9)


def test_geography_release_of_integer_tables(files, capsys):
    out = files / "int"
    args = ("--data", str(files / "people.csv"), "--invariants", "state", "--postprocess", "integer")
    code = main(_release(files, *args, "--output", str(out)))
    text = capsys.readouterr().out
    assert code == 0, text
    assert "integer estimates (top down) moved the answers" in text
    levels = {level: pd.read_parquet(out / f"level={level}") for level in ("nation", "state", "county")}
    for table in levels.values():
        assert (table["answer"] == np.rint(table["answer"])).all() and (table["answer"] >= 0).all()
    summed = levels["state"].groupby("query", observed=True)["answer"].sum()  # exactly the nation's
    np.testing.assert_array_equal(levels["nation"].set_index("query")["answer"].loc[summed.index], summed)
    assert json.loads((out / "_provenance.json").read_text())["estimates"].startswith("integer")


def test_workers_change_nothing_in_the_files(files, capsys):
    args = ("--data", str(files / "people.csv"), "--invariants", "state", "--postprocess", "integer")
    for workers in ("1", "2"):
        assert main(_release(files, *args, "--workers", workers, "--output", str(files / workers))) == 0
    capsys.readouterr()
    for level in ("nation", "state", "county"):
        pd.testing.assert_frame_equal(pd.read_parquet(files / "1" / f"level={level}"),
                                      pd.read_parquet(files / "2" / f"level={level}"))
    assert "--workers 0: give a positive" in fails(_release(files, *args, "--workers", "0", "--output",
                                                            str(files / "o")), capsys)
    assert "leave out --workers" in fails(_release(files, *args, "--engine", "spark", "--workers", "2", "--output",
                                                   str(files / "o")), capsys)
    assert not (files / "o").exists()


def test_built_in_synthetic_states(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["release", "--workload", "sf1", "--epsilon", "1", "--geography", "state", "--people", "2000",
                 "--noise-seed", "1", "--output", str(out)]) == 0
    assert "2,000 built-in SYNTHETIC people" in capsys.readouterr().out
    assert len(pd.read_parquet(out / "level=state")) == 51 * 4151


@pytest.mark.parametrize("extra, message", [
    (["--workload", "sf1-states", "--geography", "state"], "has a 'state' attribute"),
    (["--workload", "sf1", "--geography", "state", "--tree", "units.txt"], "expected a .csv or .parquet table"),
    (["--workload", "sf1", "--geography", "county"], "built-in geography has the levels"),
    (["--workload", "sf1", "--geography", "state", "--invariants", "tract"], "no level 'tract'"),
])
def test_geography_refusals(tmp_path, capsys, extra, message):
    code = main(["release", "--epsilon", "1", "--strategy", "identity", "--people", "1000", *extra,
                 "--output", str(tmp_path / "o")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_records_outside_the_tree_are_refused_before_noise(files, capsys):
    people = pd.read_csv(files / "people.csv", dtype={"state": str, "county": str})
    people.loc[5, "county"] = "999"
    people.to_csv(files / "bad.csv", index=False)
    assert main(_release(files, "--data", str(files / "bad.csv"), "--output", str(files / "o"))) == 2
    err = capsys.readouterr().err
    assert "1 record has geography codes that are not in the tree" in err and not (files / "o").exists()
    assert "999" not in err  # issue 22.4: a code only the data hold is private


def test_geography_output_must_be_new(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    assert main(["release", "--workload", "sf1", "--epsilon", "1", "--geography", "state", "--output",
                 str(tmp_path / "o")]) == 2
    assert "exists" in capsys.readouterr().err


def test_a_leftover_partial_output_is_refused_before_any_budget_is_charged(files, capsys):
    (files / "o.partial").mkdir()  # left by an interrupted run
    budget = files / "budget.json"
    assert main(["budget", "create", str(budget), "--rho", "0.8"]) == 0
    before = budget.read_bytes()
    assert main(_release(files, "--data", str(files / "people.csv"), "--budget", str(budget), "--output",
                         str(files / "o"))) == 2
    assert "o.partial exists" in capsys.readouterr().err and budget.read_bytes() == before


def test_geography_release_charges_a_budget_file(files, capsys):
    budget = files / "budget.json"
    assert main(["budget", "create", str(budget), "--rho", "0.8"]) == 0
    out = files / "out"
    assert main(_release(files, "--data", str(files / "people.csv"), "--budget", str(budget), "--output",
                         str(out))) == 0
    assert "charged rho 0.5" in capsys.readouterr().out
    assert json.loads((out / "_provenance.json").read_text())["charge"]["charge"] == 0.5
    assert main(_release(files, "--data", str(files / "people.csv"), "--budget", str(budget), "--output",
                         str(files / "again"))) == 2
    assert "cannot pay" in capsys.readouterr().err and not (files / "again").exists()


def test_a_strategy_file_serves_a_geography_release(files, capsys):
    # load_strategy returns (strategy, metadata): the geography path used the pair as the strategy
    strategy = files / "s.npz"
    assert main(["optimize", "--workload", str(files / "w.json"), "--rho", "0.5", "--output", str(strategy)]) == 0
    out = files / "out"
    code = main(_release(files, "--data", str(files / "people.csv"), "--strategy", str(strategy), "--output", str(out)))
    assert code == 0, capsys.readouterr()
    assert json.loads((out / "_provenance.json").read_text())["privacy"]["rho"] == 0.5


def _budget(files, capsys):
    budget = files / "budget.json"
    assert main(["budget", "create", str(budget), "--rho", "0.8"]) == 0
    capsys.readouterr()
    return budget


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_records_without_the_level_columns_are_refused_before_any_charge(files, capsys, suffix):
    # issue 22.1: a raw KeyError traceback from records.astype, after the budget was read
    people = pd.read_csv(files / "people.csv")[["age", "sex"]]
    data = files / f"agesex{suffix}"
    people.to_csv(data, index=False) if suffix == ".csv" else people.to_parquet(data, index=False)
    budget = _budget(files, capsys)
    before = budget.read_bytes()
    err = fails(_release(files, "--data", str(data), "--budget", str(budget), "--output", str(files / "o")), capsys)
    assert "no column(s) ['state', 'county']" in err and "--geography" in err and "rename" in err
    assert budget.read_bytes() == before and not (files / "o").exists() and not (files / "o.partial").exists()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")
def test_an_output_that_cannot_be_created_is_refused_before_any_charge(files, capsys):
    # issue 22.2: /proc passed the os.access check and failed after the noise, the charge left unfinished
    budget = _budget(files, capsys)
    before = budget.read_bytes()
    err = fails(_release(files, "--data", str(files / "people.csv"), "--budget", str(budget), "--output",
                         "/proc/hdmm-geo-out/"), capsys)
    assert "--output /proc/hdmm-geo-out" in err and "cannot write in /proc" in err
    assert budget.read_bytes() == before


def test_empty_records_are_refused_on_the_geography_path(files, capsys):
    pd.read_csv(files / "people.csv").head(0).to_csv(files / "empty.csv", index=False)
    budget = _budget(files, capsys)
    before = budget.read_bytes()
    err = fails(_release(files, "--data", str(files / "empty.csv"), "--budget", str(budget), "--output",
                         str(files / "o")), capsys)
    assert "holds no records" in err and budget.read_bytes() == before and not (files / "o").exists()


@pytest.mark.parametrize("extra", [["--invariants", "state"], ["--engine", "spark"], ["--engine", "local"],
                                   ["--tree", "units.csv"], ["--levels", "state"], ["--workers", "2"]])
def test_geography_options_without_geography_are_refused(files, capsys, extra):
    err = fails(["release", "--workload", str(files / "w.json"), "--rho", "0.5", "--data", str(files / "people.csv"),
                 *extra], capsys)
    assert f"{extra[0]} only apply to a geography release" in err and "--geography" in err


@pytest.mark.parametrize("name", ["x.csv", "x.json"])
def test_a_file_name_is_refused_as_the_geography_output(files, capsys, name):
    err = fails(_release(files, "--data", str(files / "people.csv"), "--output", str(files / name)), capsys)
    assert "give a directory name" in err and not (files / name).exists()


def test_a_tree_of_finer_units_than_the_levels_is_explained(files, capsys):
    # issue 22.3: --tree tracts.csv with --geography state,county said "duplicate codes"
    pd.DataFrame({"state": ["01", "01", "01", "02"], "county": ["001", "001", "003", "001"],
                  "tract": ["01", "02", "01", "01"]}).to_csv(files / "units.csv", index=False)
    err = fails(_release(files, "--data", str(files / "people.csv"), "--output", str(files / "o")), capsys)
    assert "--geography state,county,tract" in err and "one row per unit" in err and "duplicate" not in err


def test_geography_provenance_records_the_workload_the_data_and_the_time(files, capsys):
    # issue 22.12: _provenance.json recorded neither the workload nor the data source nor when it was made
    import datetime

    from hdmm.catalog import load_workload
    from hdmm.io import workload_fingerprint

    out = files / "out"
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    assert main(_release(files, "--data", str(files / "people.csv"), "--output", str(out))) == 0
    meta = json.loads((out / "_provenance.json").read_text())
    W, domain = load_workload(str(files / "w.json"))
    assert meta["workload"]["name"] == str(files / "w.json")
    assert meta["workload"]["fingerprint"] == workload_fingerprint(W) == meta["workload_fingerprint"]
    assert meta["workload"]["fingerprint_with_domain"] == workload_fingerprint(W, domain)
    assert meta["data"] == {"source": str(files / "people.csv"), "records": None}  # the count is private
    assert meta["tree"] == str(files / "units.csv") and meta["noise_seed"] == 3
    created = datetime.datetime.fromisoformat(meta["created"])
    assert before <= created <= datetime.datetime.now(datetime.timezone.utc)
    import pyarrow.parquet as pq

    part = next((out / "level=county").glob("*.parquet"))
    assert json.loads(pq.read_schema(part).metadata[b"hdmm"])["workload"] == meta["workload"]


@pytest.mark.parametrize("column, values, message", [
    ("sex", ["Femle", "mael"], "column 'sex' holds unknown values <2 records; values not shown: private>"),
    ("age", ["99", "-4"], "column 'age' holds codes <2 records; values not shown: private> outside [0, 8)"),
    ("age", ["2.5", "3.5"], "column 'age' holds non-integer numbers <2 records; values not shown: private>"),
    ("age", [None, None], "column 'age' has 2 missing value(s) (NaN/None); drop"),
])
def test_person_values_from_the_data_are_never_shown(files, capsys, column, values, message):
    people = pd.read_csv(files / "people.csv", dtype=str)
    people.loc[[4, 7], column] = values
    people.to_csv(files / "bad.csv", index=False)
    err = fails(_release(files, "--data", str(files / "bad.csv"), "--output", str(files / "o")), capsys)
    assert message in err and not (files / "o").exists()
    assert not any(str(v) in err for v in values if v is not None) and "rows [" not in err, err


def test_the_production_mechanism_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["release", "--workload", "pl94-2020", "--rho", "0.5", "--geography", "state", "--strategy",
                 "production", "--postprocess", "integer", "--people", "20000", "--noise-seed", "1",
                 "--output", str(out)]) == 0
    assert "person strategies per level (estimated top down)" in capsys.readouterr().out
    states = pd.read_parquet(out / "level=state")
    assert len(states) == 51 * 298
    provenance = json.loads((out / "_provenance.json").read_text())
    assert set(provenance["person_strategy"]) == {"nation", "state"}
    assert provenance["strategy"] == "production"
    assert provenance["estimates"].startswith("integer (top down; std_error: each level's own")


@pytest.mark.parametrize("extra, message", [
    (["--workload", "sf1", "--epsilon", "1", "--geography", "state", "--postprocess", "integer"], "pl94-2020"),
    (["--workload", "pl94-2020", "--rho", "0.5", "--geography", "state"], "--postprocess integer"),
    (["--workload", "pl94-2020", "--rho", "0.5", "--geography", "county", "--postprocess", "integer"],
     "must be production's first levels in order: nation,state"),
    (["--workload", "pl94-2020", "--rho", "0.5", "--postprocess", "integer"], "add --geography"),
])
def test_the_production_mechanism_is_refused_where_it_does_not_apply(tmp_path, capsys, extra, message):
    out = tmp_path / ("o" if "--geography" in extra else "o.csv")
    error = fails(["release", "--strategy", "production", "--people", "1000", *extra, "--output", str(out)], capsys)
    assert message in error
    assert not out.exists()
