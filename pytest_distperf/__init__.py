"""pytest-distperf: performance tests of distributed PyTorch training, gated in CI.

The plugin module (``pytest_distperf.plugin``) is loaded by pytest through the ``pytest11``
entry point; this package imports neither torch nor pytest at import time.
"""

from __future__ import annotations

from pytest_distperf.config import ConfigError, parse_size
from pytest_distperf.launcher import RankError, RankTimeout
from pytest_distperf.records import Environment, Metric

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Environment",
    "Metric",
    "RankError",
    "RankTimeout",
    "__version__",
    "parse_size",
]
