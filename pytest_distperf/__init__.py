"""pytest-distperf: performance tests of distributed PyTorch training, gated in CI.

The plugin module (``pytest_distperf.plugin``) is loaded by pytest through the ``pytest11``
entry point; this package imports neither torch nor pytest at import time.
"""

from __future__ import annotations

from pytest_distperf.collectives import OPS, WrongResultError
from pytest_distperf.config import ConfigError, parse_size
from pytest_distperf.launcher import RankError, RankTimeout
from pytest_distperf.records import (
    CollectiveResult,
    CollectiveRow,
    Environment,
    Metric,
    PairMatrix,
)

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "CollectiveResult",
    "CollectiveRow",
    "ConfigError",
    "Environment",
    "Metric",
    "PairMatrix",
    "RankError",
    "RankTimeout",
    "WrongResultError",
    "__version__",
    "parse_size",
]
