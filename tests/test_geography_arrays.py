"""GeographyTree as arrays (issue 23): the same trees as the old dict-based construction, fixed code widths per
level, and the errors for codes of the wrong width, levels that do not nest and records without tracts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geography_reference import GeographyTree as OldTree
from hdmm.geography import GeographyError, GeographyTree


def assert_same_tree(new: GeographyTree, old: OldTree) -> None:
    assert new.levels == old.levels and new.sizes == old.sizes and repr(new) == repr(old)
    assert new.separator == old.separator and new.columns == old.columns
    for d in range(len(new.levels)):
        assert new.codes(d) == old.codes(d) and new.names(d) == old.names(d)
        assert np.array_equal(new.leaf_bounds(d), old.leaf_bounds(d))
        if d:
            assert np.array_equal(new.parents(d), old.parents(d))
        if d < new.depth:
            assert np.array_equal(new.child_bounds(d), old.child_bounds(d))
        for u in {0, new.sizes[d] - 1, new.sizes[d] // 2}:
            assert new.label(d, u) == old.label(d, u)
            assert new.index(d, new.codes(d)[u]) == old.index(d, old.codes(d)[u])
    assert new.leaf_codes == old.leaf_codes
    assert np.array_equal(new.leaf_index(list(old.leaf_codes)[::-1]), old.leaf_index(list(old.leaf_codes)[::-1]))


@st.composite
def tables(draw):
    """A random table of units: 1-4 levels, each level's codes of one width (or, sometimes, of several)."""
    depth = draw(st.integers(1, 4))
    widths = [draw(st.integers(1, 3)) for _ in range(depth)]
    mixed = draw(st.booleans()) and draw(st.booleans())
    rows: list[tuple[str, ...]] = [()]
    for d in range(depth):
        alphabet = "0123456789" if d % 2 == 0 else "0123456789AB"
        code = st.text(alphabet, min_size=1 if mixed else widths[d], max_size=widths[d])
        rows = [r + (c,) for r in rows for c in draw(st.sets(code, min_size=1, max_size=3))]
    table = pd.DataFrame(rows, columns=[f"l{d}" for d in range(depth)])
    table = table.sample(frac=1.0, random_state=draw(st.integers(0, 99))).reset_index(drop=True)
    table["name"] = ["n" + str(code) for code in table["l0"]]
    return table


@settings(max_examples=60, deadline=None)
@given(tables())
def test_from_table_builds_the_same_tree_as_before(table):
    levels = [c for c in table.columns if c != "name"]
    new = GeographyTree.from_table(table, levels, root_code="US", names={"l0": "name"})
    old = OldTree.from_table(table, levels, root_code="US", names={"l0": "name"})
    assert_same_tree(new, old)
    records = table.iloc[np.random.default_rng(0).integers(0, len(table), 20)]
    assert np.array_equal(new.locate(records), old.locate(records))
    assert np.array_equal(new.locate(records, weights=np.ones(20)), old.locate(records))


@settings(max_examples=40, deadline=None)
@given(tables())
def test_from_parents_builds_the_same_tree_as_before(table):
    levels = [c for c in table.columns if c != "name"]
    pairs = {}
    for row in table[levels].itertuples(index=False):
        for d in range(len(row)):
            pairs["/".join(row[:d + 1])] = "/".join(row[:d]) or "USA"
    items = list(pairs.items())[::-1]
    names = {code: f"unit {code}" for code in list(pairs)[::2]}
    assert_same_tree(GeographyTree.from_parents(items, ["nation", *levels], names=names),
                     OldTree.from_parents(items, ["nation", *levels], names=names))


def test_the_old_errors_are_the_new_ones():
    for pairs, levels in [({"a": "US", "b": "US", "a1": "a"}, ["nation", "state", "county"]),
                          ({"a": "US", "a1": "a"}, ["nation", "state"]), ({"a": "US"}, ["n", "s", "c"]),
                          ({"a": "b", "b": "a", "c": "US"}, ["nation", "state"])]:
        with pytest.raises(Exception) as old:
            OldTree.from_parents(pairs, levels)
        with pytest.raises(GeographyError) as new:
            GeographyTree.from_parents(pairs, levels)
        assert str(new.value) == str(old.value)


# ====================================================================== widths, nesting, missing codes
STATES = pd.DataFrame({"state": ["01", "10"], "county": ["001", "001"]})


def test_a_record_with_state_1_and_county_0001_is_never_in_state_10():
    # "1" + "0001" is "10001", the joined code of county 001 of state 10: the widths of each level are checked
    tree = GeographyTree.from_table(STATES, ["state", "county"])
    assert tree.widths == (None, 2, 3) and tree.separator == ""
    with pytest.raises(GeographyError, match="1 record has state codes of the wrong width") as caught:
        tree.locate(pd.DataFrame({"state": ["10", "1"], "county": ["001", "0001"]}))
    assert "0001" not in str(caught.value)  # the records' codes are private
    with pytest.raises(GeographyError, match="county codes of the wrong width"):
        tree.locate(pd.DataFrame({"state": ["10"], "county": ["01"]}))
    with pytest.raises(GeographyError, match="5 records have county codes of the wrong width"):
        tree.locate(pd.DataFrame({"state": ["10", "10"], "county": ["001", "1"]}), weights=[2, 5])
    assert tree.locate(pd.DataFrame({"state": ["10", "01"], "county": ["001", "001"]})).tolist() == [1, 0]


def test_codes_joined_by_a_slash_are_never_matched_through_the_joined_string():
    # a level of several widths: full codes are joined by "/"; the old tree matched records through that joined
    # string, so a record (state "1/0", county "01") landed in county "0/01" of state "1", a unit it is not in
    tree = GeographyTree.from_table(pd.DataFrame({"state": ["1", "10"], "county": ["0/01", "01"]}),
                                    ["state", "county"])
    assert tree.separator == "/" and tree.leaf_codes == ("1/0/01", "10/01") and tree.widths == (None, None, None)
    record = pd.DataFrame({"state": ["1/0"], "county": ["01"]})
    old = OldTree.from_table(pd.DataFrame({"state": ["1", "10"], "county": ["0/01", "01"]}), ["state", "county"])
    assert old.locate(record).tolist() == [0]  # the bug, kept in the reference: counted in another unit
    with pytest.raises(GeographyError, match="1 record has geography codes that are not in the tree"):
        tree.locate(record)
    with pytest.raises(GeographyError, match="a state code that is not in the tree"):
        tree.locate(pd.DataFrame({"state": ["01"], "county": ["01"]}))  # "01" is no state, "1" is


def test_records_without_tracts_are_refused_by_name():
    table = pd.DataFrame({"state": ["01", "01"], "county": ["001", "001"], "tract": ["000100", "000200"],
                          "block": ["1000", "1000"]})
    tree = GeographyTree.from_table(table, ["state", "county", "tract", "block"])
    records = table.copy().astype(object)
    records.loc[1, "tract"] = None
    with pytest.raises(GeographyError, match=r"1 record has no code in column\(s\) \['tract'\] but a code at a finer "
                                             r"level \(\['block'\]\): the levels do not nest \(e.g. blocks without"):
        tree.locate(records)
    records.loc[1, "tract"] = " "  # blank is no code
    with pytest.raises(GeographyError, match="no code in column"):
        tree.locate(records)
    records.loc[1, ["tract", "block"]] = None  # nothing finer: the plain message
    with pytest.raises(GeographyError, match=r"1 record has no code in column\(s\) \['tract', 'block'\] \(missing"):
        tree.locate(records)
    broken = table.astype(object)
    broken.loc[0, "county"] = np.nan
    with pytest.raises(GeographyError, match=r"1 row of the table of units has no code in column\(s\) \['county'\] "
                                             "but a code at a finer level"):
        GeographyTree.from_table(broken, ["state", "county", "tract", "block"])


def test_blocks_that_do_not_begin_with_their_block_group_do_not_nest():
    table = pd.DataFrame({"tract": ["000100"] * 3, "block_group": ["1", "1", "2"], "block": ["1000", "1001", "2000"]})
    tree = GeographyTree.from_table(table, ["tract", "block_group", "block"], prefixed=["block"])
    assert tree.locate(table).tolist() == [0, 1, 2]
    with pytest.raises(GeographyError, match="1 record has a block code that does not begin with their block_group "
                                             "code .*the levels do not nest") as caught:
        tree.locate(pd.DataFrame({"tract": ["000100"], "block_group": ["1"], "block": ["2000"]}))
    assert "2000" not in str(caught.value)
    bad = table.assign(block=["1000", "2001", "2000"])
    with pytest.raises(GeographyError, match="1 rows of the table of units have a block code that does not begin"):
        GeographyTree.from_table(bad, ["tract", "block_group", "block"], prefixed=["block"])
    with pytest.raises(GeographyError, match="prefixed levels"):
        GeographyTree.from_table(table, ["tract", "block_group", "block"], prefixed=["tract"])


def test_many_levels_and_a_wide_tree():
    rng = np.random.default_rng(3)
    levels = [f"l{d}" for d in range(7)]
    n = 5000
    table = pd.DataFrame({c: rng.integers(0, 4, n).astype(str) for c in levels}).drop_duplicates()
    tree = GeographyTree.from_table(table, levels)
    assert len(tree.levels) == 8 and tree.leaves == len(table)
    assert tree.leaf_codes == tuple(sorted("".join(r) for r in table.itertuples(index=False)))
    assert np.array_equal(tree.leaf_index(tree.leaf_codes), np.arange(tree.leaves))
    located = tree.locate(table)
    assert np.array_equal(np.array(tree.leaf_codes)[located], table.agg("".join, axis=1).to_numpy())
