"""The command line checks every input and output before it measures (issue 11, defects 2-7).

A mistake found after the noise was drawn makes the user run the release again and spend the
privacy budget twice, so each check here runs with the measuring functions replaced by ones
that fail the test if they are reached.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import pandas as pd
import pytest
from cli_files import GEO_SPEC, block_work, fails, write_workload_and_records

import hdmm
import hdmm.cli as cli
from hdmm.cli import main
from hdmm.io import save_strategy

REGIONS = {"domain": {"region": [str(k) for k in range(1, 10)], "sex": ["f", "m"]},
           "queries": [{"name": "region by sex", "region": "identity", "sex": "identity"}]}
SPEC = GEO_SPEC


@pytest.fixture
def files(tmp_path):
    """A workload file and 200 records over its domain."""
    return write_workload_and_records(tmp_path, SPEC, 200)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if the CLI optimizes, plans or measures."""
    block_work(monkeypatch, ("optimize", "plan", "run", "svd_bound"), "the CLI started work before all checks were done")


def release(workload, data, *more):
    return ["release", "--workload", workload, "--data", data, "--epsilon", "1", "--strategy", "identity", *more]


# ------------------------------------------------------------------ D3: outputs checked first
def test_bad_outputs_are_refused_before_any_work(files, no_work, capsys):
    tmp, workload, data = files
    before = sorted(p.name for p in tmp.iterdir())
    assert "does not exist; create it first" in fails(release(workload, data, "--output", str(tmp / "no" / "r.csv")),
                                                      capsys)
    blocker = tmp / "people.csv" / "r.csv"  # a "directory" that is a file
    assert "does not exist" in fails(release(workload, data, "--output", str(blocker)), capsys)
    assert "use a .csv or .parquet file name" in fails(release(workload, data, "--output", str(tmp / "r.xlsx")),
                                                       capsys)
    (tmp / "dir.csv").mkdir()
    assert "is a directory" in fails(release(workload, data, "--output", str(tmp / "dir.csv")), capsys)
    strategy = ["optimize", "--workload", workload, "--epsilon", "1", "--output"]
    assert "use a .npz file name" in fails([*strategy, str(tmp / "s.np")], capsys)
    assert "does not exist" in fails([*strategy, str(tmp / "no" / "s.npz")], capsys)
    after = sorted(p.name for p in tmp.iterdir())
    assert after == sorted([*before, "dir.csv"])  # nothing written, not even a temporary file


def test_an_existing_release_is_not_replaced_without_overwrite(files, no_work, capsys):
    tmp, workload, data = files
    out = tmp / "r.csv"
    out.write_text("an earlier release\n")
    message = fails(release(workload, data, "--output", str(out)), capsys)
    assert "exists" in message and "--overwrite" in message
    assert out.read_text() == "an earlier release\n"
    (tmp / "s.csv.json").write_text("{}")  # the provenance file of another release counts too
    assert "s.csv.json exists" in fails(release(workload, data, "--output", str(tmp / "s.csv")), capsys)


def test_parquet_output_without_pyarrow_is_refused_first(files, no_work, monkeypatch, capsys):
    tmp, workload, data = files
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    message = fails(release(workload, data, "--output", str(tmp / "r.parquet")), capsys)
    assert "needs pyarrow: pip install 'hdmm[parquet]'" in message
    assert not (tmp / "r.parquet").exists()


def test_plot_without_matplotlib_names_the_extra(files, no_work, monkeypatch, capsys):
    tmp, workload, _ = files
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    argv = ["error", "--workload", workload, "--epsilon", "1", "--strategy", "identity", "--plot", str(tmp / "e.png")]
    assert "--plot needs matplotlib: pip install 'hdmm[plot]'" in fails(argv, capsys)


def test_error_without_plot_needs_no_matplotlib(files, monkeypatch, capsys):
    tmp, workload, _ = files
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["error", "--workload", workload, "--epsilon", "1", "--strategy", "identity"]) == 0
    out = capsys.readouterr().out
    assert "rmse (identity)" in out and "RMSE ratio to the bound" in out
    assert not any(p.suffix == ".png" for p in tmp.iterdir())


def test_plot_file_type_is_checked_first(files, no_work, capsys):
    tmp, workload, _ = files
    argv = ["error", "--workload", workload, "--epsilon", "1", "--strategy", "identity", "--plot", str(tmp / "e.xyz")]
    message = fails(argv, capsys)
    assert "--plot" in message and ".png" in message


# ------------------------------------------------------------------ D4: empty data, extreme sizes
def test_empty_data_is_refused(files, no_work, capsys):
    tmp, workload, _ = files
    (tmp / "header.csv").write_text("age,sex\n")
    message = fails(release(workload, str(tmp / "header.csv")), capsys)
    assert "holds no records" in message and "nothing was measured" in message


@pytest.mark.parametrize("people", ["0", "-5", "2.5", "many"])
def test_people_must_be_a_positive_whole_number(people, capsys):
    with pytest.raises(SystemExit) as done:
        main(["release", "--workload", "pl94", "--epsilon", "1", "--people", people])
    assert done.value.code == 2
    assert "--people" in capsys.readouterr().err


def test_too_many_people_is_refused_before_drawing_them(no_work, monkeypatch, capsys):
    monkeypatch.setattr(cli, "_available_memory", lambda: 8 * 10**9)
    message = fails(["release", "--workload", "pl94", "--epsilon", "1", "--people", "1e10"], capsys)
    assert "10,000,000,000 needs about 480 GB" in message and "use at most 166,666,666 people" in message


def test_people_accepts_readable_numbers():
    assert [cli._people(t) for t in ("1e3", "20_000", "1,000,000", "12345678901234567")] == [
        1000, 20000, 1000000, 12345678901234567]


@pytest.mark.parametrize("privacy", [["--epsilon", "1e-300"], ["--rho", "1e-300"], ["--epsilon", "1e-120"]])
def test_a_budget_too_small_to_compute_with_is_one_line(privacy, no_work, capsys):
    message = fails(["release", "--workload", "pl94", *privacy], capsys)
    assert "too small" in message


# ------------------------------------------------------------------ D7: strategy names
def test_an_unknown_strategy_lists_the_names(files, no_work, capsys):
    tmp, workload, data = files
    for argv in (["release", "--workload", workload, "--data", data, "--epsilon", "1"],
                 ["error", "--workload", workload, "--epsilon", "1"]):
        message = fails([*argv, "--strategy", "best"], capsys)
        assert "--strategy best" in message and "auto" in message and "identity" in message
        assert "'hdmm optimize' (.npz)" in message


# ------------------------------------------------------------------ D6: provenance
def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"hdmm {hdmm.__version__}"


def test_csv_release_records_its_provenance_next_to_it(files, capsys):
    tmp, workload, data = files
    out = tmp / "r.csv"
    assert main(release(workload, data, "--noise-seed", "1", "--output", str(out))) == 0
    assert f"privacy, strategy and hdmm version to {out}.json" in capsys.readouterr().out
    record = json.loads((tmp / "r.csv.json").read_text())
    assert record["privacy"] == {"type": "PureDP", "epsilon": 1.0}
    assert record["strategy"]["origin"] == "identity" and record["hdmm_version"] == hdmm.__version__
    assert record["data"]["records"] is None and record["noise_seed"] == 1  # the record count is private
    assert record["workload"]["queries"] == 16 and record["noise_scale"] == pytest.approx(1.0)
    assert not [p for p in tmp.iterdir() if p.name.startswith(".")]  # no temporary files left
    # --overwrite replaces both files
    argv = ["release", "--workload", workload, "--data", data, "--rho", "0.5", "--strategy", "identity",
            "--output", str(out), "--overwrite"]
    assert main(argv) == 0
    assert json.loads((tmp / "r.csv.json").read_text())["privacy"] == {"type": "ZCDP", "rho": 0.5}


def test_parquet_release_records_its_provenance_in_its_metadata(files, capsys):
    pq = pytest.importorskip("pyarrow.parquet")
    tmp, workload, data = files
    out = tmp / "r.parquet"
    assert main(release(workload, data, "--output", str(out))) == 0
    record = json.loads(pq.read_schema(out).metadata[b"hdmm"])
    assert record["privacy"]["type"] == "PureDP" and record["strategy"]["origin"] == "identity"
    assert record["hdmm_version"] == hdmm.__version__
    assert len(pd.read_parquet(out)) == 16 and not (tmp / "r.parquet.json").exists()


def test_a_strategy_file_is_credited_to_its_optimizer(files, capsys):
    tmp, workload, data = files
    strategy = tmp / "s.npz"
    save_strategy(hdmm.Identity(16), strategy, {"optimizer": "opt_kron", "privacy": {"type": "PureDP", "epsilon": 1.0}})
    out = tmp / "r.csv"
    argv = ["release", "--workload", workload, "--data", data, "--epsilon", "1", "--strategy", str(strategy),
            "--output", str(out)]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert f"from opt_kron from strategy file {strategy}" in summary and "from user" not in summary
    record = json.loads((tmp / "r.csv.json").read_text())
    assert record["strategy"]["optimizer"] == "opt_kron" and len(record["strategy"]["sha256"]) == 64


def test_the_summary_reports_the_cli_s_own_optimization_time(files, monkeypatch, capsys):
    tmp, workload, data = files
    real = hdmm.optimize

    def slow_optimize(W, privacy, **options):
        time.sleep(0.3)
        return real(W, privacy, optimizers=["identity"])

    monkeypatch.setattr(cli, "optimize", slow_optimize)
    assert main(["release", "--workload", workload, "--data", data, "--epsilon", "1"]) == 0
    out = capsys.readouterr().out
    seconds = float(out.split("optimize and plan ")[1].split(",")[0])
    assert seconds >= 0.3
    assert "from identity (hdmm.optimize, this run)" in out


# ------------------------------------------------------------------ D5: units of error ratios
def test_error_ratios_are_labelled_rmse_ratios(files, monkeypatch, capsys):
    tmp, workload, _ = files
    real = hdmm.optimize
    monkeypatch.setattr(cli, "optimize", lambda W, privacy, **options: real(W, privacy, optimizers=["identity"]))
    assert main(["optimize", "--workload", workload, "--epsilon", "1", "--output", str(tmp / "s.npz")]) == 0
    out = capsys.readouterr().out
    assert "RMSE / SVD bound RMSE" in out and "ratio to SVD bound" not in out
    assert "RMSE ratio to the bound" in out and "optimized in" in out
    result = real(hdmm.catalog.load_workload(workload)[0], hdmm.PureDP(1.0), optimizers=["identity"])
    row = out.splitlines()[2].split()
    assert row[0] == "identity" and float(row[2]) == pytest.approx(result.rmse / result.bound.rmse, abs=1e-3)


# ------------------------------------------------------------------ D2: labels that spell numbers
def test_labels_that_spell_numbers_in_a_csv(tmp_path, capsys):
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(REGIONS))
    ambiguous = tmp_path / "ambiguous.csv"
    ambiguous.write_text("region,sex\n1,f\n2,m\n8,f\n")
    base = ["release", "--workload", str(workload), "--epsilon", "1e6", "--strategy", "identity", "--data"]
    message = fails([*base, str(ambiguous)], capsys)
    assert "column 'region' is ambiguous" in message and "--labels" in message and "--codes" in message

    def counts(argv):
        out = tmp_path / "out.csv"
        assert main([*argv, "--output", str(out), "--overwrite"]) == 0
        table = pd.read_csv(out)
        return dict(zip(table["query"], np.round(table["answer"]).astype(int)))

    as_labels = counts([*base, str(ambiguous), "--labels"])
    assert as_labels["region by sex: region=1 & sex=f"] == 1 and as_labels["region by sex: region=8 & sex=f"] == 1
    codes = tmp_path / "codes.csv"
    codes.write_text("region,sex\n1,0\n2,1\n8,0\n")
    shifted = counts([*base, str(codes), "--codes"])
    assert shifted["region by sex: region=2 & sex=f"] == 1 and shifted["region by sex: region=9 & sex=f"] == 1
    # 9 can only be a label: read as labels without being told
    unambiguous = tmp_path / "nine.csv"
    unambiguous.write_text("region,sex\n1,f\n9,m\n")
    plain = counts([*base, str(unambiguous)])
    assert plain["region by sex: region=1 & sex=f"] == 1 and plain["region by sex: region=9 & sex=m"] == 1


def test_run_on_an_empty_dataframe_warns():
    domain = hdmm.Domain(["a"], [3])
    records = pd.DataFrame({"a": pd.Series([], dtype=int)})
    with pytest.warns(UserWarning, match="no records"):
        hdmm.run(hdmm.Identity(3), records, hdmm.PureDP(1.0), strategy=hdmm.Identity(3), domain=domain, rng=0)


def test_real_data_releases_print_nothing_private(files, capsys):
    tmp, workload, data = files
    assert main(release(workload, data, "--noise-seed", "1")) == 0
    out = capsys.readouterr().out
    assert "200" not in out.split("Release of")[0] and "is private and not shown" in out
    assert "true answers" not in out and "read data" not in out
    assert main(release(workload, data, "--noise-seed", "1", "--evaluate")) == 0
    out = capsys.readouterr().out
    assert "200 records" in out and "NOT private" in out and "RMSE against the true answers" in out
