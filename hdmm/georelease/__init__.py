"""Geography releases: a person workload for every unit of nation, states, counties, tracts, consistent.

* :func:`geo_plan` (:mod:`hdmm.georelease.plan`): the data-independent plan (person strategy,
  level weights optimized by :mod:`hdmm.georelease.levels`, sensitivity, invariants).
* :func:`release_geography` (:mod:`hdmm.georelease.release`): measure every unit through the
  kernel and estimate by the tree passes (:mod:`hdmm.georelease.passes`), on one machine
  (``engine="local"``) or on Apache Spark (``engine="spark"``, :mod:`hdmm.georelease.spark`).
* :class:`RecordHistograms`, :class:`ArrayHistograms` (:mod:`hdmm.georelease.units`): the data.
* :class:`Invariants` (:mod:`hdmm.georelease.invariants`): public totals held exactly.
"""

from .invariants import Invariants
from .levels import optimize_level_weights
from .plan import GeoPlan, geo_plan
from .release import GeoRelease, release_geography
from .units import ArrayHistograms, RecordHistograms

__all__ = [
    "ArrayHistograms",
    "GeoPlan",
    "GeoRelease",
    "Invariants",
    "RecordHistograms",
    "geo_plan",
    "optimize_level_weights",
    "release_geography",
]
