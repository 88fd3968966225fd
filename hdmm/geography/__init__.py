"""Geography as a first-class attribute: hierarchies of units, their totals, and strategies over them.

* :class:`GeographyTree` (:mod:`hdmm.geography.tree`): a validated tree of units with any number
  of named levels, built from a table of codes or from child -> parent pairs; its leaves (the
  finest units, in depth-first order by code) are the values of the geography attribute. It is
  kept as arrays and built and searched with array operations (:mod:`hdmm.geography.build`,
  :mod:`hdmm.geography.codes`): the 8.1 million blocks of the United States in seconds.
* :class:`LevelTotals`, :func:`geography_workload` (:mod:`hdmm.geography.blocks`): the totals of
  the units at chosen levels, as implicit one-attribute matrices over the leaves.
* :class:`TreeStrategy` (:mod:`hdmm.geography.strategy`): one weight per level, with exact
  sensitivity, pseudo-inverse, expected error and per-query variances by tree recursion
  (:mod:`hdmm.geography.solver`, docs/math.md section 8).
"""

from .blocks import LevelTotals, TreeGram, geography_workload
from .strategy import TreePinv, TreeStrategy
from .tree import GeographyError, GeographyTree

__all__ = [
    "GeographyError",
    "GeographyTree",
    "LevelTotals",
    "TreeGram",
    "TreePinv",
    "TreeStrategy",
    "geography_workload",
]
