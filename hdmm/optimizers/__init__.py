"""Strategy optimizers: OPT_0 (p-Identity, convex program, square root), OPT_(x), OPT_+, OPT_M, residuals, and ``optimize``.

The public functions live in :mod:`.api`; :mod:`.registry` holds the protocol and the registry
of optimizers that :func:`optimize` compares.
"""

from .api import OptimizationResult, opt0, opt_kron, opt_marginals, opt_residual, opt_union, optimize
from .pidentity import PIdentity
from .registry import REGISTRY, Candidate, Optimizer, Problem, register
from .root import SquareRootStrategy

__all__ = ["Candidate", "OptimizationResult", "Optimizer", "PIdentity", "Problem", "REGISTRY", "SquareRootStrategy",
           "opt0", "opt_kron", "opt_marginals", "opt_residual", "opt_union", "optimize", "register"]
