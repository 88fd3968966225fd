"""hdmm: the High-Dimensional Matrix Mechanism.

Answer large sets of linear counting queries under differential privacy with the least error:
describe a workload implicitly (Kronecker products, unions, marginals), compute the exact
expected error of a strategy and the SVD lower bound, without any ``N x N`` matrix; plan a
release once (:func:`plan`), measure it on data (:func:`measure`, the only step that touches
data and draws noise) and reconstruct (:func:`reconstruct`), or do all of it with :func:`run`;
account for several releases with a :class:`Budget`, and build on earlier releases with
``run(..., prior=release)``.

The top level holds what a user needs for that (``__all__``); everything else lives in its
submodule, all of which ``import hdmm`` loads:

* :mod:`hdmm.matrix`: the implicit matrix classes (``Kronecker``, ``Explicit``, ``Ones``,
  ``Diagonal``, ``VStack``, ``Weighted``, ...) and ``DenseLimitError``;
* :mod:`hdmm.workload` and :mod:`hdmm.marginals`: more workload blocks (``IdentityTotal``,
  ``Ranges``, ``Predicates``, ``Marginal``, ``Marginals``, ``Residuals``);
* :mod:`hdmm.optimizers`: the optimizers behind :func:`optimize` (``opt0``, ``opt_kron``,
  ``opt_union``, ``opt_marginals``, ``opt_residual``) and their strategies (``PIdentity``,
  ``SquareRootStrategy``, ``OptimizationResult``); :mod:`hdmm.strategies`: the baselines;
* :mod:`hdmm.planning` (``Plan``), :mod:`hdmm.mechanism` (``Measurement``), :mod:`hdmm.release`
  (``Release``), :mod:`hdmm.error` (``per_query_variance``, ``lp_error``),
  :mod:`hdmm.query_variances` (``variance_summary``, ``query_variance_blocks``), :mod:`hdmm.bound`,
  :mod:`hdmm.privacy` (``Privacy``), :mod:`hdmm.budget` (``BudgetExceeded``, ``BudgetError``);
* :mod:`hdmm.io` (``save_strategy``, ``load_strategy``, ``workload_fingerprint``),
  :mod:`hdmm.records` (records to data vectors), :mod:`hdmm.catalog` (named workloads);
* :mod:`hdmm.geography` (``GeographyTree``, ``TreeStrategy``) and :mod:`hdmm.georelease`
  (geography releases; imported on its own).

>>> import hdmm
>>> dom = hdmm.Domain(["sex", "age"], [2, 115])
>>> W = hdmm.product(dom, {"sex": hdmm.Identity(2), "age": hdmm.Prefix(115)})
>>> round(float(hdmm.rmse(W, hdmm.Identity(dom.size), hdmm.PureDP(1.0))), 3)
10.77
"""

# the submodules named above, loaded so that hdmm.<module>.<name> works after ``import hdmm``
from . import block_diagonal, bound, budget, catalog, error, geography, io, marginals, matrix  # noqa: F401
from . import mechanism, optimizers, planning, privacy, query_variances, records, release, strategies, workload  # noqa: F401
from .bound import svd_bound
from .budget import Budget
from .datasets import load_adult
from .domain import Domain
from .error import expected_error, rmse
from .kernel import measure
from .marginals import AllMarginals, DimKMarginals
from .matrix import Identity
from .mechanism import reconstruct
from .optimizers import optimize
from .planning import plan
from .privacy import ZCDP, ApproxDP, PureDP
from .release import run
from .version import HDMM_VERSION
from .workload import AllRange, Prefix, Total, WidthKRange, product, union

__version__ = HDMM_VERSION

__all__ = [
    # the data domain
    "Domain",
    "load_adult",
    # workloads
    "AllMarginals",
    "AllRange",
    "DimKMarginals",
    "Identity",
    "Prefix",
    "Total",
    "WidthKRange",
    "product",
    "union",
    # privacy and its accounting
    "ApproxDP",
    "Budget",
    "PureDP",
    "ZCDP",
    # strategies and their error
    "expected_error",
    "optimize",
    "rmse",
    "svd_bound",
    # releases
    "measure",
    "plan",
    "reconstruct",
    "run",
]

#: Names the top level held before it was cut to ``__all__`` (issue 24), and the submodule each lives in now.
_MOVED = {
    "BlockDiagonal": "block_diagonal",
    "BudgetError": "budget",
    "BudgetExceeded": "budget",
    "DenseLimitError": "matrix",
    "Diagonal": "matrix",
    "ErrorResult": "error",
    "Explicit": "matrix",
    "GeographyTree": "geography",
    "IdentityTotal": "workload",
    "Kronecker": "matrix",
    "LevelTotals": "geography",
    "Marginal": "marginals",
    "Marginals": "marginals",
    "Matrix": "matrix",
    "Measurement": "mechanism",
    "Ones": "matrix",
    "OptimizationResult": "optimizers",
    "PIdentity": "optimizers",
    "Plan": "planning",
    "Predicates": "workload",
    "Privacy": "privacy",
    "Ranges": "workload",
    "Release": "release",
    "Residuals": "marginals",
    "SVDBound": "bound",
    "SquareRootStrategy": "optimizers",
    "TreeStrategy": "geography",
    "geography_workload": "geography",
    "load_strategy": "io",
    "lp_error": "error",
    "opt0": "optimizers",
    "opt_kron": "optimizers",
    "opt_marginals": "optimizers",
    "opt_residual": "optimizers",
    "opt_union": "optimizers",
    "per_query_variance": "error",
    "save_strategy": "io",
    "workload_fingerprint": "io",
}


def __getattr__(name: str):
    """Refuse a name that moved off the top level with one error naming its new place."""
    if name in _MOVED:
        raise AttributeError(
            f"hdmm.{name} is not at the top level of hdmm; use hdmm.{_MOVED[name]}.{name} "
            f"(from hdmm.{_MOVED[name]} import {name})"
        )
    raise AttributeError(f"module 'hdmm' has no attribute {name!r}")
