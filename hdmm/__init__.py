"""hdmm: the High-Dimensional Matrix Mechanism.

Answer large sets of linear counting queries under differential privacy with the least error:
describe a workload implicitly (Kronecker products, unions, marginals), compute the exact
expected error of a strategy and the SVD lower bound, without any ``N x N`` matrix; plan a
release once (:func:`plan`), measure it on data (:func:`measure`, the only step that touches
data and draws noise) and reconstruct (:func:`reconstruct`), or do all of it with :func:`run`;
account for several releases with a :class:`Budget`, and build on earlier releases with
``run(..., prior=release)``.
The composite matrix classes (``VStack``, ``Weighted``, ``Sum``, ``Product``, ``Transpose``)
live in :mod:`hdmm.matrix`.

>>> import hdmm
>>> dom = hdmm.Domain(["sex", "age"], [2, 115])
>>> W = hdmm.product(dom, {"sex": hdmm.Identity(2), "age": hdmm.Prefix(115)})
>>> round(float(hdmm.rmse(W, hdmm.Identity(dom.size), hdmm.PureDP(1.0))), 3)
10.77
"""

from .block_diagonal import BlockDiagonal
from .bound import SVDBound, svd_bound
from .budget import Budget, BudgetError, BudgetExceeded
from .datasets import load_adult
from .domain import Domain
from .geography import GeographyTree, LevelTotals, TreeStrategy, geography_workload
from .error import ErrorResult, expected_error, lp_error, per_query_variance, rmse
from .io import load_strategy, save_strategy, workload_fingerprint
from .kernel import measure
from .mechanism import Measurement, reconstruct
from .marginals import AllMarginals, DimKMarginals, Marginal, Marginals, Residuals
from .matrix import (
    DenseLimitError,
    Diagonal,
    Explicit,
    Identity,
    Kronecker,
    Matrix,
    Ones,
)
from .optimizers import (
    OptimizationResult,
    PIdentity,
    SquareRootStrategy,
    opt0,
    opt_kron,
    opt_marginals,
    opt_residual,
    opt_union,
    optimize,
)
from .privacy import ZCDP, ApproxDP, Privacy, PureDP
from .planning import Plan, plan
from .release import Release, run
from . import catalog  # named workloads and JSON workload files: hdmm.catalog.load_workload(...)
from . import strategies  # the baselines, as a namespace: hdmm.strategies.hb(64), ...
from .version import HDMM_VERSION
from .workload import (
    AllRange,
    IdentityTotal,
    Predicates,
    Prefix,
    Ranges,
    Total,
    WidthKRange,
    product,
    union,
)

__version__ = HDMM_VERSION

__all__ = [
    "AllMarginals",
    "AllRange",
    "ApproxDP",
    "BlockDiagonal",
    "Budget",
    "BudgetError",
    "BudgetExceeded",
    "DenseLimitError",
    "Diagonal",
    "DimKMarginals",
    "Domain",
    "ErrorResult",
    "GeographyTree",
    "Explicit",
    "Identity",
    "IdentityTotal",
    "Kronecker",
    "LevelTotals",
    "Marginal",
    "Marginals",
    "Matrix",
    "Measurement",
    "Ones",
    "OptimizationResult",
    "PIdentity",
    "Plan",
    "Predicates",
    "Prefix",
    "Privacy",
    "PureDP",
    "Ranges",
    "Release",
    "Residuals",
    "SVDBound",
    "SquareRootStrategy",
    "Total",
    "TreeStrategy",
    "WidthKRange",
    "ZCDP",
    "expected_error",
    "geography_workload",
    "load_adult",
    "load_strategy",
    "lp_error",
    "measure",
    "opt0",
    "opt_kron",
    "opt_marginals",
    "opt_residual",
    "opt_union",
    "optimize",
    "per_query_variance",
    "plan",
    "product",
    "reconstruct",
    "rmse",
    "run",
    "save_strategy",
    "catalog",
    "strategies",
    "svd_bound",
    "union",
    "workload_fingerprint",
]
