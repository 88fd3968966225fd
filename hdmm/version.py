"""The hdmm version, in a module of its own so that any module can record it without importing the package."""

HDMM_VERSION = "0.1.0"

__all__ = ["HDMM_VERSION"]
