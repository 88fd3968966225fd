"""Strategy optimizers: OPT_0 (p-Identity), OPT_(x), OPT_+, OPT_M, residuals, and ``optimize``."""

from .optimize import OptimizationResult, opt0, opt_kron, opt_marginals, opt_residual, opt_union, optimize
from .pidentity import PIdentity

__all__ = ["OptimizationResult", "PIdentity", "opt0", "opt_kron", "opt_marginals", "opt_residual", "opt_union", "optimize"]
