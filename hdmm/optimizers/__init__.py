"""Strategy optimizers: OPT_0 (p-Identity), the Gaussian convex program, OPT_(x), OPT_+, OPT_M."""
