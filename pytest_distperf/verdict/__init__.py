"""Verdicts: thresholds, baselines and the statistics that compare a run with them.  Pure.

The rule: modules here import :mod:`pytest_distperf.records`, the result types
(:mod:`pytest_distperf.fixtures.results`), :mod:`pytest_distperf.config` and
:mod:`pytest_distperf.common`, and neither torch nor pytest; they work on records and
files, so they test fast and run anywhere.

* :mod:`~pytest_distperf.verdict.thresholds`: the limits (defaults, ini, baseline file,
  marker) and the breach check;
* :mod:`~pytest_distperf.verdict.store`: baseline files: format, load, validate, save;
* :mod:`~pytest_distperf.verdict.stats`: estimators, spread, Mann-Whitney, the control's
  arithmetic;
* :mod:`~pytest_distperf.verdict.noise`: the noise probe (host steal, other processes' load,
  the ranks' CPU wait);
* :mod:`~pytest_distperf.verdict.rule`: one metric's measurements against its baseline;
* :mod:`~pytest_distperf.verdict.judgement`: one test's verdicts, compared or saved, and the
  re-measure loop.
"""

from __future__ import annotations

import importlib
from typing import Any

# Re-exported on first use (PEP 562): the plugin loads in every pytest run, and the rule and
# the statistics need numpy, which a run that judges nothing should not pay for.
_EXPORTS = {
    # records
    "IMPROVED": "pytest_distperf.records",
    "INCONCLUSIVE": "pytest_distperf.records",
    "NO_BASELINE": "pytest_distperf.records",
    "NOT_COMPARABLE": "pytest_distperf.records",
    "REGRESSED": "pytest_distperf.records",
    "SAVED": "pytest_distperf.records",
    "UNCHANGED": "pytest_distperf.records",
    "VERDICT_ORDER": "pytest_distperf.records",
    # judgement
    "Comparison": "pytest_distperf.verdict.judgement",
    "Judgement": "pytest_distperf.verdict.judgement",
    "Save": "pytest_distperf.verdict.judgement",
    "make_judgement": "pytest_distperf.verdict.judgement",
    "settle": "pytest_distperf.verdict.judgement",
    # noise
    "NoiseFigures": "pytest_distperf.verdict.noise",
    # rule
    "ALPHA": "pytest_distperf.verdict.rule",
    "CONFIRM_PAUSES_S": "pytest_distperf.verdict.rule",
    "CONFIRM_ROUNDS": "pytest_distperf.verdict.rule",
    "CONFIRMATIONS": "pytest_distperf.verdict.rule",
    "CONTROL_PAUSE_S": "pytest_distperf.verdict.rule",
    "CONTROL_IMPROVEMENT_WINDOWS": "pytest_distperf.verdict.rule",
    "CONTROL_SCREEN_FRACTION": "pytest_distperf.verdict.rule",
    "SLOPE_ERROR": "pytest_distperf.verdict.rule",
    "BETWEEN_SLOPE": "pytest_distperf.verdict.rule",
    "SPREAD_LIMIT": "pytest_distperf.verdict.rule",
    "SPREAD_RATIO": "pytest_distperf.verdict.rule",
    "CONTROL_WINDOWS": "pytest_distperf.verdict.rule",
    "DECISION_FRACTION": "pytest_distperf.verdict.rule",
    "MAX_ROUNDS": "pytest_distperf.verdict.rule",
    "NOISY_BACKOFF_S": "pytest_distperf.verdict.rule",
    "OUTLIER_FACTOR": "pytest_distperf.verdict.rule",
    "MEMORY_SLOPE_MAX": "pytest_distperf.verdict.rule",
    "memory_slope": "pytest_distperf.verdict.rule",
    "has_memory_control": "pytest_distperf.verdict.rule",
    "SAVE_CONTROL_WINDOWS": "pytest_distperf.verdict.rule",
    "SAVE_MAX_WINDOWS": "pytest_distperf.verdict.rule",
    "SAVE_PAUSE_S": "pytest_distperf.verdict.rule",
    "SAVE_WINDOWS": "pytest_distperf.verdict.rule",
    "Assessment": "pytest_distperf.verdict.rule",
    "Window": "pytest_distperf.verdict.rule",
    "assess": "pytest_distperf.verdict.rule",
    "control_slope": "pytest_distperf.verdict.rule",
    "controlled": "pytest_distperf.verdict.rule",
    "decide": "pytest_distperf.verdict.rule",
    "decide_exact": "pytest_distperf.verdict.rule",
    "noise_reasons": "pytest_distperf.verdict.rule",
    "spread_limit": "pytest_distperf.verdict.rule",
    "without_outliers": "pytest_distperf.verdict.rule",
    # stats
    "EXACT_PAIRS": "pytest_distperf.verdict.stats",
    "estimate": "pytest_distperf.verdict.stats",
    "mann_whitney_greater": "pytest_distperf.verdict.stats",
    "spread": "pytest_distperf.verdict.stats",
    # store
    "SCHEMA_VERSION": "pytest_distperf.verdict.store",
    "BaselineError": "pytest_distperf.verdict.store",
    "BaselineFile": "pytest_distperf.verdict.store",
    "same_environment": "pytest_distperf.verdict.store",
    "SaveEntry": "pytest_distperf.verdict.store",
    "StoredMetric": "pytest_distperf.verdict.store",
    "baseline_path": "pytest_distperf.verdict.store",
    "environment_id": "pytest_distperf.verdict.store",
    "load": "pytest_distperf.verdict.store",
    "save_test": "pytest_distperf.verdict.store",
    "split_nodeid": "pytest_distperf.verdict.store",
    # thresholds
    "Breach": "pytest_distperf.verdict.thresholds",
    "check_thresholds": "pytest_distperf.verdict.thresholds",
    "resolve_thresholds": "pytest_distperf.config",
}

__all__ = [
    "ALPHA",
    "BETWEEN_SLOPE",
    "CONFIRMATIONS",
    "CONFIRM_PAUSES_S",
    "CONFIRM_ROUNDS",
    "CONTROL_IMPROVEMENT_WINDOWS",
    "CONTROL_PAUSE_S",
    "CONTROL_SCREEN_FRACTION",
    "CONTROL_WINDOWS",
    "DECISION_FRACTION",
    "EXACT_PAIRS",
    "IMPROVED",
    "INCONCLUSIVE",
    "MAX_ROUNDS",
    "MEMORY_SLOPE_MAX",
    "NOISY_BACKOFF_S",
    "NOT_COMPARABLE",
    "NO_BASELINE",
    "OUTLIER_FACTOR",
    "REGRESSED",
    "SAVED",
    "SAVE_CONTROL_WINDOWS",
    "SAVE_MAX_WINDOWS",
    "SAVE_PAUSE_S",
    "SAVE_WINDOWS",
    "SCHEMA_VERSION",
    "SLOPE_ERROR",
    "SPREAD_LIMIT",
    "SPREAD_RATIO",
    "UNCHANGED",
    "VERDICT_ORDER",
    "Assessment",
    "BaselineError",
    "BaselineFile",
    "Breach",
    "Comparison",
    "Judgement",
    "NoiseFigures",
    "Save",
    "SaveEntry",
    "StoredMetric",
    "Window",
    "assess",
    "baseline_path",
    "check_thresholds",
    "control_slope",
    "controlled",
    "decide",
    "decide_exact",
    "environment_id",
    "estimate",
    "has_memory_control",
    "load",
    "make_judgement",
    "mann_whitney_greater",
    "memory_slope",
    "noise_reasons",
    "resolve_thresholds",
    "same_environment",
    "save_test",
    "settle",
    "split_nodeid",
    "spread",
    "spread_limit",
    "without_outliers",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pytest_distperf.verdict' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
