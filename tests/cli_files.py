"""Shared by the CLI tests: a JSON workload file and a CSV of records over its domain, a runner for
expected failures, and a guard that the CLI started no work."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

import hdmm.cli as cli


def fails(argv, capsys) -> str:
    """Run the CLI expecting a bad-input failure; returns its one error line."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hdmm: error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def block_work(monkeypatch, names, message: str) -> None:
    """Make each of the CLI's functions ``names`` fail the test with ``message`` if it is reached."""
    def reached(*args, **kwargs):
        raise AssertionError(message)

    for name in names:
        monkeypatch.setattr(cli, name, reached)


def write_workload_and_records(tmp_path, spec: dict, count: int) -> tuple:
    """Write ``spec`` to ``w.json`` and ``count`` random (age, sex) records to ``people.csv``."""
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(spec))
    rng = np.random.default_rng(0)
    data = tmp_path / "people.csv"
    ages = rng.integers(0, 8, count)
    pd.DataFrame({"age": ages, "sex": rng.choice(["female", "male"], count)}).to_csv(data, index=False)
    return tmp_path, str(workload), str(data)


GEO_SPEC = {"domain": {"age": 8, "sex": ["female", "male"]},
            "queries": [{"name": "age by sex", "age": "prefix", "sex": "identity"}]}


def write_geography_files(tmp_path):
    """A JSON person workload ``w.json``, a public table of units ``units.csv`` (2 states, 3 counties)
    and 600 people in them (``people.csv``, ``people.parquet``)."""
    (tmp_path / "w.json").write_text(json.dumps(GEO_SPEC))
    units = pd.DataFrame({"state": ["01", "01", "02"], "county": ["001", "003", "001"]})
    units.to_csv(tmp_path / "units.csv", index=False)
    rng = np.random.default_rng(0)
    people = units.sample(600, replace=True, random_state=1).reset_index(drop=True).assign(
        age=rng.integers(0, 8, 600), sex=rng.choice(["female", "male"], 600))
    people.to_csv(tmp_path / "people.csv", index=False)
    people.to_parquet(tmp_path / "people.parquet", index=False)
    return tmp_path


def geography_release_args(tmp_path, *more) -> list[str]:
    """``hdmm release`` of the files of :func:`write_geography_files` by state and county."""
    return ["release", "--workload", str(tmp_path / "w.json"), "--rho", "0.5", "--geography", "state,county",
            "--tree", str(tmp_path / "units.csv"), "--noise-seed", "3", *more]
