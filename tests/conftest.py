"""Shared pytest configuration for the hdmm tests.

Makes ``tests/strategies.py`` (the hypothesis strategies shared by the test modules)
importable as ``strategies`` whatever pytest import mode is used.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
