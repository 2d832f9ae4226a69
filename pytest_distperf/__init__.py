"""pytest-distperf: performance tests of distributed PyTorch training, gated in CI.

The plugin module (``pytest_distperf.plugin``) is loaded by pytest through the ``pytest11``
entry point; this package imports neither torch nor numpy at import time.
"""

from __future__ import annotations

from typing import Any

from pytest_distperf.analysis.topology import slow_pairs, suspect_ranks
from pytest_distperf.config import ConfigError, parse_size
from pytest_distperf.fixtures.collectives import OPS, WrongResultError
from pytest_distperf.fixtures.results.findings import Bottleneck
from pytest_distperf.fixtures.results.group import (
    CollectiveResult,
    CollectiveRow,
    MeasureResult,
    PairMatrix,
)
from pytest_distperf.fixtures.results.profile import CollectiveStat, ProfileReport, RankProfile
from pytest_distperf.fixtures.results.steps import ScalingPoint, ScalingResult, StepTiming
from pytest_distperf.pool.launcher import RankError, RankTimeout
from pytest_distperf.rank.phase import set_phase
from pytest_distperf.records import Environment, Metric, Verdict

__version__ = "0.1.0"

__all__ = [
    "OPS",
    "Bottleneck",
    "CollectiveResult",
    "CollectiveRow",
    "CollectiveStat",
    "ConfigError",
    "DesyncError",
    "Environment",
    "MeasureResult",
    "Metric",
    "PairMatrix",
    "ProfileReport",
    "RankError",
    "RankProfile",
    "RankTimeout",
    "ScalingPoint",
    "ScalingResult",
    "StepTiming",
    "Verdict",
    "WrongResultError",
    "__version__",
    "parse_size",
    "set_phase",
    "slow_pairs",
    "suspect_ranks",
]


def __getattr__(name: str) -> Any:
    # DesyncError lives with the trace analysis, which needs numpy: imported on first use so
    # that loading the plugin stays cheap in every pytest run.
    if name == "DesyncError":
        from pytest_distperf.analysis.traces.desync import DesyncError

        return DesyncError
    raise AttributeError(f"module 'pytest_distperf' has no attribute {name!r}")
