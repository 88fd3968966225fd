"""Random geography trees shared by the tests."""

from __future__ import annotations

import numpy as np

from hdmm.geography import GeographyTree


def random_tree(depth: int, rng: np.random.Generator, fanout: int = 3) -> GeographyTree:
    """A tree of ``depth`` levels below the root ``"r"``, each unit with 1 to ``fanout`` children."""
    pairs, frontier = {}, ["r"]
    for _ in range(depth):
        below = []
        for parent in frontier:
            for j in range(int(rng.integers(1, fanout + 1))):
                pairs[f"{parent}.{j}"] = parent
                below.append(f"{parent}.{j}")
        frontier = below
    return GeographyTree.from_parents(pairs, [f"L{d}" for d in range(depth + 1)])


def small_country(seed: int = 0, counties: tuple[int, int] = (1, 4), tracts: tuple[int, int] = (1, 3)
                  ) -> GeographyTree:
    """Nation, 3 states, ``counties`` (low, high exclusive) counties per state, ``tracts`` tracts per county."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for s in range(3):
        pairs[f"s{s}"] = "US"
        for c in range(int(rng.integers(*counties))):
            pairs[f"s{s}c{c}"] = f"s{s}"
            for t in range(int(rng.integers(*tracts))):
                pairs[f"s{s}c{c}t{t}"] = f"s{s}c{c}"
    return GeographyTree.from_parents(pairs, ["nation", "state", "county", "tract"])
