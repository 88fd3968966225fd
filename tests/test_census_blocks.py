"""census_workloads.geography down to the block (issue 23 item 1): the 2020 tallies exactly, FIPS-like codes of
fixed width, blocks numbered inside their block group, populations that add up, sparse synthetic blocks."""

from __future__ import annotations

import numpy as np
import pytest

from census_workloads.geography import (BLOCK_GROUPS_2020, BLOCKS_2020, LEVELS, TRACTS_2020, us_geography,
                                        us_tree)


def test_the_2020_tallies_are_facts():
    assert (TRACTS_2020, BLOCK_GROUPS_2020, BLOCKS_2020) == (84_414, 239_780, 8_132_968)


def test_tracts_and_block_groups_match_the_2020_counts_and_nest():
    tracts = us_geography()
    groups = us_geography(LEVELS[:4])
    assert len(tracts) == TRACTS_2020 and len(groups) == BLOCK_GROUPS_2020
    assert tracts.groupby(["state", "county"]).ngroups == 3143
    assert int(groups["population"].sum()) == int(tracts["population"].sum()) == 308_745_538
    for level, width in zip(LEVELS[:4], (2, 3, 6, 1)):
        assert set(groups[level].str.len()) == {width}
    per_tract = groups.groupby(["state", "county", "tract"], sort=True)
    assert per_tract.ngroups == TRACTS_2020 and per_tract.size().between(1, 9).all()
    assert np.array_equal(per_tract["population"].sum().to_numpy(), tracts["population"].to_numpy())
    numbered = groups["block_group"].astype(int) - 1 == per_tract.cumcount()
    assert numbered.all()  # block groups 1, 2, ... in each tract
    counties = us_geography(LEVELS[:2])  # the county populations did not change with the tracts
    assert np.array_equal(tracts.groupby(["state", "county"])["population"].sum().to_numpy(),
                          counties["population"].to_numpy())


def test_the_default_tree_is_unchanged_in_shape():
    tree = us_tree()
    assert tree.levels == ("nation", "state", "county", "tract") and tree.sizes == (1, 51, 3143, TRACTS_2020)
    with pytest.raises(ValueError, match="prefix of"):
        us_geography(("state", "tract"))
    with pytest.raises(ValueError, match="prefix of"):
        us_tree(("county",))


@pytest.mark.slow
def test_blocks_match_the_2020_count_and_look_like_blocks():
    blocks = us_geography(LEVELS)
    groups = us_geography(LEVELS[:4])
    assert len(blocks) == BLOCKS_2020
    assert set(blocks["block"].str.len()) == {4}
    assert (blocks["block"].str[0] == blocks["block_group"]).all()  # a block's first digit is its block group
    per_group = blocks.groupby(list(LEVELS[:4]), sort=True)
    assert per_group.ngroups == BLOCK_GROUPS_2020 and per_group.size().max() <= 999
    assert np.array_equal(per_group["population"].sum().to_numpy(), groups["population"].to_numpy())
    people = blocks["population"].to_numpy()
    assert 0.38 < np.mean(people == 0) < 0.42       # synthetic: EMPTY_BLOCK_SHARE = 0.4
    assert np.mean(people < 50) > 0.7                 # most blocks hold fewer than 50 people
    assert (per_group["population"].max().to_numpy() > 0).all()  # every block group has a block with people


@pytest.mark.slow
def test_the_block_tree_of_a_state():
    tree = us_tree(LEVELS, states=("11",))
    table = us_geography(LEVELS, states=("11",))
    assert tree.levels == ("nation", *LEVELS) and tree.leaves == len(table)
    assert tree.leaf_codes[0] == "1100100010011000" and tree.widths == (None, 2, 3, 6, 1, 4)
    assert np.array_equal(tree.locate(table), np.arange(len(table)))
