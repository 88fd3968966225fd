"""The README's Python examples run as written, in order, in a fresh directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


def _python_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Using it from Python"):text.index("The pieces:")]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.slow  # skip locally with -m "not slow"; CI runs it
def test_the_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = _python_blocks()
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["W"].labels[3] == "sex=male & age in [0, 4)"
    release = namespace["release"]
    assert "weight" in release.table() and (tmp_path / "release.npz").exists()
    assert namespace["answers"].shape == (namespace["W"].shape[0],)


def test_the_readme_geography_example_runs(tmp_path, monkeypatch):
    text = README.read_text()
    section = text[text.index("## Geography releases"):text.index("## Layout")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], str(README), "exec"), namespace)
    geo = namespace["geo"]
    assert namespace["plan"].variance_exact
    assert len(geo.table("county")) == 3 * namespace["W"].shape[0]
    totals = geo.totals("state")
    assert totals.tolist() == pytest.approx(list(namespace["state_totals"].values()))
