"""The ``hdmm`` command line: the main jobs end to end, and one-line errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
from cli_files import fails, write_workload_and_records

from hdmm.cli import main
from hdmm.io import load_strategy, workload_fingerprint

SPEC = {
    "domain": {"age": 8, "sex": ["female", "male"]},
    "queries": [{"name": "age by sex", "age": "prefix", "sex": "identity"}, {"age": "width-3"}],
}


@pytest.fixture
def files(tmp_path):
    """A JSON workload file and a CSV of 500 records over its domain."""
    return write_workload_and_records(tmp_path, SPEC, 500)


def test_release_from_files_writes_a_labelled_table(files, capsys):
    tmp, workload, data = files
    out = tmp / "release.csv"
    assert main(["release", "--workload", workload, "--data", data, "--epsilon", "1", "--strategy", "identity",
                 "--noise-seed", "3", "--output", str(out)]) == 0
    table = pd.read_csv(out)
    assert list(table.columns[:4]) == ["table", "query", "answer", "std_error"]
    assert len(table) == 16 + 6 and table["query"][0] == "age by sex: age=0 & sex=female"
    assert f"wrote 22 rows to {out}" in capsys.readouterr().out


def test_optimize_then_release_and_error_with_the_saved_strategy(files, capsys):
    tmp, workload, data = files
    strategy = str(tmp / "s.npz")
    assert main(["optimize", "--workload", workload, "--rho", "0.5", "--seed", "0", "--output", strategy]) == 0
    assert "saved to" in capsys.readouterr().out
    assert main(["release", "--workload", workload, "--data", data, "--rho", "0.5", "--strategy", strategy]) == 0
    assert "zCDP" in capsys.readouterr().out
    plot = tmp / "error.png"
    assert main(["error", "--workload", workload, "--rho", "0.5", "--strategy", strategy, "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rmse (identity)" in capsys.readouterr().out


def test_release_on_built_in_sf1_data(capsys):
    assert main(["release", "--workload", "sf1", "--epsilon", "1", "--strategy", "identity", "--people", "20000",
                 "--noise-seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "4,151 queries over 492,660 cells" in out and "RMSE against the true answers" in out
    assert "PCT12A-O" in out


@pytest.mark.parametrize("argv, message", [
    (["--workload", "sf2", "--epsilon", "1"], "unknown workload 'sf2'"),
    (["--workload", "sf1", "--epsilon", "-1"], "epsilon"),
    (["--workload", "sf1", "--epsilon", "nan"], "epsilon"),
    (["--workload", "sf1", "--epsilon", "1", "--delta", "2"], "delta"),
    (["--workload", "sf1", "--epsilon", "1", "--rho", "0.5"], "not both"),
    (["--workload", "sf1"], "give a privacy budget"),
    (["--workload", "sf1", "--epsilon", "1", "--output", "out.txt"], ".csv or .parquet"),
    (["--workload", "sf1", "--epsilon", "1", "--data", "adult", "--strategy", "identity"], "adult workload"),
])
def test_bad_arguments_give_one_line(argv, message, capsys):
    assert message in fails(["release", *argv], capsys)


def test_bad_data_gives_one_line(files, capsys):
    tmp, workload, data = files
    base = ["release", "--workload", workload, "--epsilon", "1", "--strategy", "identity", "--data"]
    assert "No such file" in fails([*base, str(tmp / "missing.csv")], capsys)
    assert ".csv or .parquet" in fails([*base, str(tmp / "people.txt")], capsys)
    pd.DataFrame({"age": [1, 2]}).to_csv(tmp / "nosex.csv", index=False)
    assert "sex" in fails([*base, str(tmp / "nosex.csv")], capsys)
    pd.DataFrame({"age": [1, 9], "sex": ["male", "male"]}).to_csv(tmp / "outside.csv", index=False)
    assert "age" in fails([*base, str(tmp / "outside.csv")], capsys)
    pd.DataFrame({"age": [1, 2], "sex": ["male", "other"]}).to_csv(tmp / "badlabel.csv", index=False)
    assert "other" in fails([*base, str(tmp / "badlabel.csv")], capsys)
    (tmp / "bad.json").write_text("{")
    assert "not valid JSON" in fails(["release", "--workload", str(tmp / "bad.json"), "--epsilon", "1"], capsys)


def test_a_strategy_for_another_domain_is_refused(files, capsys):
    tmp, workload, data = files
    strategy = str(tmp / "s.npz")
    assert main(["optimize", "--workload", workload, "--epsilon", "1", "--seed", "0", "--output", strategy]) == 0
    capsys.readouterr()
    message = fails(["release", "--workload", "sf1", "--epsilon", "1", "--strategy", strategy], capsys)
    assert "16 columns" in message and "hdmm optimize" in message


def test_the_console_entry_point_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "hdmm", "release", "--workload", "sf1", "--epsilon", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("hdmm: error:") and "Traceback" not in done.stderr


def test_parquet_in_and_out(files, capsys):
    tmp, workload, data = files
    records = tmp / "people.parquet"
    pd.read_csv(data).to_parquet(records, index=False)
    out = tmp / "release.parquet"
    assert main(["release", "--workload", workload, "--data", str(records), "--epsilon", "1", "--strategy",
                 "identity", "--output", str(out)]) == 0
    table = pd.read_parquet(out)
    assert len(table) == 22 and table["query"][0] == "age by sex: age=0 & sex=female"


def test_optimize_with_a_time_limit_says_what_was_skipped(files, capsys):
    tmp, workload, _ = files
    strategy = str(tmp / "limited.npz")
    assert main(["optimize", "--workload", workload, "--epsilon", "1", "--seed", "0", "--time-limit", "1e-9",
                 "--output", strategy]) == 0
    out = capsys.readouterr().out
    assert "best: identity" in out and "skipped: the time limit of 1e-09 s was reached" in out
    assert main(["optimize", "--workload", workload, "--epsilon", "1", "--time-limit", "-1",
                 "--output", str(tmp / "bad.npz")]) != 0
    assert "time_limit must be a positive number of seconds" in capsys.readouterr().err


def test_a_csv_naming_a_column_twice_is_refused(tmp_path, capsys):
    # pandas renames the second "sex" to "sex.1": the release would have used the first one silently
    from cli_files import fails

    data = tmp_path / "d.csv"
    data.write_text("age,sex,sex\n1,0,1\n2,1,0\n")
    message = fails(["release", "--workload", "adult", "--data", str(data), "--epsilon", "1"], capsys)
    assert "['sex'] more than once" in message


def test_an_output_that_appears_while_the_release_runs_is_not_replaced(tmp_path, capsys, monkeypatch):
    # another process writes release.csv after the start-up check: this release goes next to it instead
    import hdmm.cli as cli

    out = tmp_path / "release.csv"
    real = cli._write

    def meanwhile(table, path, provenance, overwrite=True):
        out.write_text("someone else's release\n")
        return real(table, path, provenance, overwrite)

    monkeypatch.setattr(cli, "_write", meanwhile)
    assert cli.main(["release", "--workload", "sf1", "--epsilon", "1", "--strategy", "identity",
                     "--output", str(out), "--noise-seed", "1"]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == "someone else's release\n" and "appeared while the release ran" in printed
    (mine,) = [p for p in tmp_path.glob("release.*-1.csv")]
    assert (tmp_path / (mine.name + ".json")).exists() and not (tmp_path / "release.csv.json").exists()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_release_file_records_its_workload_fingerprint_and_calibrated_rho(files, suffix):
    # issue 22 item 12: the workload was recorded only as the path typed, and an (epsilon, delta) release did not
    # say which rho its noise is calibrated to
    import json

    import pyarrow.parquet as pq

    import hdmm
    from hdmm.catalog import load_workload

    tmp, workload, data = files
    out = tmp / f"release{suffix}"
    assert main(["release", "--workload", workload, "--data", data, "--epsilon", "1", "--delta", "1e-6",
                 "--strategy", "identity", "--noise-seed", "0", "--output", str(out)]) == 0
    if suffix == ".csv":
        provenance = json.loads((tmp / "release.csv.json").read_text())
    else:
        provenance = json.loads(pq.read_schema(out).metadata[b"hdmm"])
    W, domain = load_workload(workload)
    assert provenance["workload_fingerprint"] == provenance["workload"]["fingerprint"] == workload_fingerprint(W)
    assert provenance["workload"]["fingerprint_with_domain"] == workload_fingerprint(W, domain)
    assert provenance["calibrated_rho"] == hdmm.privacy.zcdp_rho(1.0, 1e-6)
    assert provenance["noise"] == "gaussian"  # the noise's name, as before it was an object (hdmm.distributions)


def test_a_strategy_file_records_its_workload_and_notes_another(files, capsys):
    import json

    from hdmm.catalog import load_workload

    tmp, workload, data = files
    strategy = str(tmp / "s.npz")
    assert main(["optimize", "--workload", workload, "--epsilon", "1", "--seed", "0", "--restarts", "1",
                 "--output", strategy]) == 0
    W, domain = load_workload(workload)
    metadata = load_strategy(strategy)[1]
    assert metadata["workload_fingerprint"] == workload_fingerprint(W)
    assert metadata["workload_fingerprint_with_domain"] == workload_fingerprint(W, domain)
    capsys.readouterr()
    assert main(["release", "--workload", workload, "--data", data, "--epsilon", "1", "--strategy", strategy]) == 0
    assert "optimised for another" not in capsys.readouterr().err
    other = tmp / "other.json"                                   # the same 16 cells, other queries
    other.write_text(json.dumps({"domain": SPEC["domain"], "queries": [{"age": "identity", "sex": "identity"}]}))
    out = tmp / "r.csv"
    assert main(["release", "--workload", str(other), "--data", data, "--epsilon", "1", "--strategy", strategy,
                 "--output", str(out)]) == 0
    assert "optimised for another workload or domain" in capsys.readouterr().err
    provenance = json.loads((tmp / "r.csv.json").read_text())
    assert provenance["strategy"]["workload_fingerprint"] == workload_fingerprint(W)
    assert provenance["workload_fingerprint"] == workload_fingerprint(load_workload(str(other))[0])
