"""Geography releases: a person workload for every unit of nation, states, counties, tracts, consistent.

* :func:`geo_plan` (:mod:`hdmm.georelease.plan`): the data-independent plan (person strategy,
  level weights optimized by :mod:`hdmm.georelease.levels`, sensitivity, invariants).
* :func:`release_geography` (:mod:`hdmm.georelease.release`): measure every unit through the
  kernel and estimate by the tree passes (:mod:`hdmm.georelease.passes`), in the steps of
  :mod:`hdmm.georelease.pipeline`, on one machine (``engine="local"``, in memory or written as it
  goes with ``output=``) or on Apache Spark (``engine="spark"``, :mod:`hdmm.georelease.spark`; its
  session and master: :mod:`hdmm.georelease.session`); engines are registered in ``ENGINES``
  (docs/engines.md).
* :class:`RecordHistograms`, :class:`ArrayHistograms` (:mod:`hdmm.georelease.units`): the data.
* :class:`Invariants` (:mod:`hdmm.georelease.invariants`): public totals held exactly.
* :func:`accuracy_report`, :func:`true_answers` (:mod:`hdmm.georelease.report`): errors of the
  outputs against the truth per level, table and unit size; plots in :mod:`hdmm.georelease.report_plots`.
"""

from .invariants import Invariants
from .levels import optimize_level_weights
from .plan import GeoPlan, geo_plan
from .release import GeoRelease, release_geography
from .report import AccuracyReport, TrueAnswers, accuracy_report, true_answers
from .units import ArrayHistograms, RecordHistograms

__all__ = [
    "AccuracyReport",
    "ArrayHistograms",
    "GeoPlan",
    "GeoRelease",
    "Invariants",
    "RecordHistograms",
    "TrueAnswers",
    "accuracy_report",
    "geo_plan",
    "optimize_level_weights",
    "release_geography",
    "true_answers",
]
