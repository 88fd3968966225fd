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
