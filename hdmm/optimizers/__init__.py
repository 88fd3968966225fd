"""Strategy optimizers: OPT_0 (p-Identity, convex program, square root), OPT_(x), OPT_+, OPT_M, residuals, and ``optimize``."""

from .optimize import OptimizationResult, opt0, opt_kron, opt_marginals, opt_residual, opt_union, optimize
from .pidentity import PIdentity
from .root import SquareRootStrategy

__all__ = ["OptimizationResult", "PIdentity", "SquareRootStrategy", "opt0", "opt_kron", "opt_marginals", "opt_residual", "opt_union", "optimize"]
