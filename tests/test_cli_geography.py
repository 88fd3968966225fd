"""``hdmm release --geography``: a Parquet dataset by level, and bad input refused before any noise."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hdmm.cli import main

pytest.importorskip("pyarrow")


def test_geography_release_writes_every_level(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["release", "--workload", "sf1", "--epsilon", "1", "--geography", "state", "--people", "20000",
                 "--strategy", "identity", "--noise-seed", "3", "--invariants", "state", "--output", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "not protected" in text and "expected RMSE" in text
    states = pd.read_parquet(out / "level=state")
    nation = pd.read_parquet(out / "level=nation")
    assert len(states) == 51 * 4151 and len(nation) == 4151
    meta = json.loads((out / "_provenance.json").read_text())
    assert meta["privacy"]["epsilon"] == 1.0 and meta["seeded"] is True
    # consistency: the nation's answers are the sums of the states'
    summed = states.groupby("query", observed=True)["answer"].sum()
    pd.testing.assert_series_equal(nation.set_index("query")["answer"].loc[summed.index], summed,
                                   check_names=False, rtol=1e-9)


@pytest.mark.parametrize("extra, message", [
    (["--workload", "sf1-states", "--geography", "state"], "has a 'state' attribute"),
    (["--workload", "sf1", "--geography", "state", "--data", "people.csv"], "--tree FILE is needed"),
    (["--workload", "sf1", "--geography", "county"], "built-in geography has the levels"),
    (["--workload", "sf1", "--geography", "state", "--invariants", "tract"], "no level 'tract'"),
])
def test_geography_refusals(tmp_path, capsys, extra, message):
    code = main(["release", "--epsilon", "1", "--strategy", "identity", "--people", "1000", *extra,
                 "--output", str(tmp_path / "o")])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_geography_output_must_be_new(tmp_path, capsys):
    (tmp_path / "o").mkdir()
    assert main(["release", "--workload", "sf1", "--epsilon", "1", "--geography", "state", "--output",
                 str(tmp_path / "o")]) == 2
    assert "exists" in capsys.readouterr().err
