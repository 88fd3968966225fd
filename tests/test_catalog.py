"""Named workloads and JSON workload files."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import hdmm
from hdmm.catalog import WORKLOADS, load_workload, named_workload, workload_from_spec

SPEC = {
    "domain": {"age": 6, "sex": ["female", "male"], "income": 2},
    "queries": [
        {"name": "age by sex", "age": "prefix", "sex": "identity"},
        {"age": "width-2"},
        {"marginals": 2},
    ],
    "weights": [1.0, 2.0, 1.0],
}


def test_a_workload_file_builds_the_union_it_describes(tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(SPEC))
    W, domain = load_workload(path)
    assert domain.names == ("age", "sex", "income") and domain.size == 24
    assert W.names == ("age by sex", "age (width-2)", "2-way marginals")
    expected = np.vstack([
        np.kron(np.kron(hdmm.Prefix(6).dense(), np.eye(2)), np.ones((1, 2))),
        2.0 * np.kron(hdmm.WidthKRange(6, 2).dense(), np.ones((1, 4))),
        hdmm.DimKMarginals(domain, 2).dense(),
    ])
    np.testing.assert_allclose(W.dense(), expected)
    assert W.labels[1] == "age by sex: age=0 & sex=male"


@pytest.mark.parametrize("change, message", [
    ({"queries": [{"age": "median"}]}, "unknown query block 'median'"),
    ({"queries": [{"height": "prefix"}]}, "not in the domain"),
    ({"queries": [{"age": "width-9"}]}, "width between 1 and 6"),
    ({"queries": [{"marginals": 4}]}, "between 1 and 3"),
    ({"queries": []}, "non-empty list"),
    ({"weights": [1.0]}, "one number per query part"),
    ({"queries": ["age"]}, "must be an object"),
    ({"queries": [{"marginals": True}]}, "between 1 and 3"),
    ({"queries": [{"age": "prefix", "name": None}]}, "'name' must be non-empty text"),
])
def test_bad_workload_files_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        workload_from_spec({**SPEC, **change})


def test_malformed_json_is_a_value_error(tmp_path):
    path = tmp_path / "w.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_workload(path)


@pytest.mark.parametrize("text, message", [
    ('{"domain": [1, 2], "queries": [{"age": "prefix"}]}', "not a valid workload file"),
    ('{"domain": {"age": 4}, "queries": [{"age": "prefix", "name": "f\\ud800"}]}', "not valid Unicode"),
    ("[" * 100000 + "]" * 100000, "nested too deeply|not valid JSON"),
])
def test_workload_files_that_would_fail_later_are_refused_when_read(tmp_path, text, message):
    # a lone surrogate in a label made the release fail after its noise was drawn, when the table was written
    path = tmp_path / "w.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_workload(path)


def test_named_workloads():
    assert set(WORKLOADS) == {"sf1", "sf1-states", "pl94", "pl94-states", "pl94-2020", "adult"}
    pl94_2020 = named_workload("pl94-2020")
    assert pl94_2020.workload.shape == (298, 2016) and pl94_2020.data == "synthetic-persons-pl94-2020"
    sf1 = named_workload("sf1")
    assert sf1.workload.shape == (4151, 492660) and sf1.domain.size == 492660 and sf1.data == "synthetic-persons"
    adult = named_workload("adult")
    assert adult.workload.shape[1] == adult.domain.size and adult.data == "adult"
    with pytest.raises(ValueError, match="unknown workload 'sf2'"):
        named_workload("sf2")


def test_catalog_is_reachable_from_the_package():
    # In a fresh interpreter: other tests import hdmm.catalog, which sets the attribute as a side effect.
    done = subprocess.run([sys.executable, "-c", "import hdmm; print(len(hdmm.catalog.WORKLOADS))"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1:]
    assert int(done.stdout) == len(WORKLOADS)


def test_unnamed_parts_get_names_made_from_their_spec():
    # issue 22 item 13: they were called queries[0], queries[1], ...
    spec = {"domain": {"age": 4, "sex": 2}, "queries": [
        {"age": "prefix", "sex": "identity"}, {}, {"marginals": 1}, {"age": "prefix", "sex": "identity"}]}
    W, _ = hdmm.catalog.workload_from_spec(spec)
    assert W.names == ("age (prefix) by sex", "total", "1-way marginals", "age (prefix) by sex (query 4)")
    assert W.labels[0].startswith("age (prefix) by sex: ")
