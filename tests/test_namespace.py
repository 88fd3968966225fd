"""The public ``hdmm`` namespace: what a user needs, pinned, so that it grows only on purpose."""

from __future__ import annotations

import importlib
import inspect

import pytest

import hdmm

#: The top level of hdmm (issue 24: cut from 62 names). Adding a name is a decision: add it here too.
PUBLIC = {
    "Domain", "load_adult",
    "AllMarginals", "AllRange", "DimKMarginals", "Identity", "Prefix", "Total", "WidthKRange", "product", "union",
    "ApproxDP", "Budget", "PureDP", "ZCDP",
    "expected_error", "optimize", "rmse", "svd_bound",
    "measure", "plan", "reconstruct", "run",
}


def test_all_is_pinned():
    assert len(hdmm.__all__) == len(set(hdmm.__all__)), "a name is listed twice in hdmm.__all__"
    assert set(hdmm.__all__) == PUBLIC


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_exists_and_has_a_docstring(name):
    obj = getattr(hdmm, name)
    doc = inspect.getdoc(obj)
    assert doc and len(doc.split()) >= 3, f"hdmm.{name} has no docstring"


def test_star_import_gives_exactly_all():
    namespace: dict = {}
    exec("from hdmm import *", namespace)
    assert set(namespace) - {"__builtins__"} == PUBLIC


@pytest.mark.parametrize("name", sorted(hdmm._MOVED))
def test_a_moved_name_lives_in_its_submodule_and_the_top_level_says_where(name):
    module = hdmm._MOVED[name]
    assert getattr(importlib.import_module(f"hdmm.{module}"), name) is getattr(getattr(hdmm, module), name)
    with pytest.raises(AttributeError, match=rf"use hdmm\.{module}\.{name} \(from hdmm\.{module} import {name}\)"):
        getattr(hdmm, name)
    assert not hasattr(hdmm, name)


def test_unknown_names_get_the_usual_error():
    with pytest.raises(AttributeError, match="module 'hdmm' has no attribute 'nope'"):
        hdmm.nope  # noqa: B018
    assert not set(hdmm._MOVED) & PUBLIC
