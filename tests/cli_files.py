"""Shared by the CLI tests: a JSON workload file and a CSV of records over its domain."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd


def write_workload_and_records(tmp_path, spec: dict, count: int) -> tuple:
    """Write ``spec`` to ``w.json`` and ``count`` random (age, sex) records to ``people.csv``."""
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(spec))
    rng = np.random.default_rng(0)
    data = tmp_path / "people.csv"
    ages = rng.integers(0, 8, count)
    pd.DataFrame({"age": ages, "sex": rng.choice(["female", "male"], count)}).to_csv(data, index=False)
    return tmp_path, str(workload), str(data)
