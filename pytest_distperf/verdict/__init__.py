"""Verdicts: thresholds, baselines and the statistics that compare a run with them.  Pure.

The rule: modules here import :mod:`pytest_distperf.records`, the result types
(:mod:`pytest_distperf.fixtures.results`), :mod:`pytest_distperf.config` and
:mod:`pytest_distperf.common`, and neither torch nor pytest; they work on records and
files, so they test fast and run anywhere.
docs/verdict-rule.md states the verdict rule; each of its sentences names the code here.

* :mod:`~pytest_distperf.verdict.thresholds`: the limits (defaults, ini, baseline file,
  marker) and the breach check;
* :mod:`~pytest_distperf.verdict.environment`: the environment key: built from the ranks'
  facts, compared with a stored one, what a save warns about it;
* :mod:`~pytest_distperf.verdict.store`: baseline files: where, what they hold, load, save;
* :mod:`~pytest_distperf.verdict.storefile`: a baseline file's layout: versions 1 and 2
  read and validated, version 2 written;
* :mod:`~pytest_distperf.verdict.stats`: estimators, spread, Mann-Whitney, the control's
  arithmetic;
* :mod:`~pytest_distperf.verdict.noise`: the noise probe (host steal, other processes' load,
  the ranks' CPU wait);
* :mod:`~pytest_distperf.verdict.measurements`: one metric's measurements, pooled and split;
* :mod:`~pytest_distperf.verdict.readings`: a time's change with the host's speed taken out;
* :mod:`~pytest_distperf.verdict.assessment`: what comparing one metric found;
* :mod:`~pytest_distperf.verdict.rule`: one metric's measurements against its baseline;
* :mod:`~pytest_distperf.verdict.explain`: every sentence a verdict says;
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
    "Measured": "pytest_distperf.records",
    "Samples": "pytest_distperf.records",
    # judgement
    "MAX_ROUNDS": "pytest_distperf.verdict.judgement",
    "Comparison": "pytest_distperf.verdict.judgement",
    "Judgement": "pytest_distperf.verdict.judgement",
    "Save": "pytest_distperf.verdict.judgement",
    "make_judgement": "pytest_distperf.verdict.judgement",
    "settle": "pytest_distperf.verdict.judgement",
    # measurements
    "has_memory_control": "pytest_distperf.verdict.measurements",
    "measured_of": "pytest_distperf.verdict.measurements",
    "pooled": "pytest_distperf.verdict.measurements",
    # noise
    "NoiseFigures": "pytest_distperf.verdict.noise",
    # readings
    "Reading": "pytest_distperf.verdict.readings",
    "control_slope": "pytest_distperf.verdict.readings",
    "memory_slope": "pytest_distperf.verdict.readings",
    "without_outliers": "pytest_distperf.verdict.readings",
    # rule
    "Assessment": "pytest_distperf.verdict.assessment",
    "Decision": "pytest_distperf.verdict.rule",
    "assess": "pytest_distperf.verdict.rule",
    "controlled": "pytest_distperf.verdict.rule",
    "decide": "pytest_distperf.verdict.rule",
    "decide_exact": "pytest_distperf.verdict.rule",
    "noise_reasons": "pytest_distperf.verdict.rule",
    "spread_limit": "pytest_distperf.verdict.rule",
    # stats
    "estimate": "pytest_distperf.verdict.stats",
    "mann_whitney_greater": "pytest_distperf.verdict.stats",
    "spread": "pytest_distperf.verdict.stats",
    # store
    "SCHEMA_VERSION": "pytest_distperf.verdict.store",
    "BaselineError": "pytest_distperf.verdict.store",
    "BaselineFile": "pytest_distperf.verdict.store",
    "same_environment": "pytest_distperf.verdict.environment",
    "SaveEntry": "pytest_distperf.verdict.store",
    "SessionFiles": "pytest_distperf.verdict.store",
    "StoredMetric": "pytest_distperf.verdict.store",
    "baseline_path": "pytest_distperf.verdict.store",
    "environment_id": "pytest_distperf.verdict.environment",
    "load": "pytest_distperf.verdict.store",
    "save_test": "pytest_distperf.verdict.store",
    "save_tests": "pytest_distperf.verdict.store",
    "split_nodeid": "pytest_distperf.verdict.store",
    # thresholds
    "Breach": "pytest_distperf.verdict.thresholds",
    "check_thresholds": "pytest_distperf.verdict.thresholds",
    "resolve_thresholds": "pytest_distperf.config",
}

__all__ = [
    "IMPROVED",
    "INCONCLUSIVE",
    "MAX_ROUNDS",
    "NOT_COMPARABLE",
    "NO_BASELINE",
    "REGRESSED",
    "SAVED",
    "SCHEMA_VERSION",
    "UNCHANGED",
    "VERDICT_ORDER",
    "Assessment",
    "BaselineError",
    "BaselineFile",
    "Breach",
    "Comparison",
    "Decision",
    "Judgement",
    "Measured",
    "NoiseFigures",
    "Reading",
    "Samples",
    "Save",
    "SaveEntry",
    "SessionFiles",
    "StoredMetric",
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
    "measured_of",
    "memory_slope",
    "noise_reasons",
    "pooled",
    "resolve_thresholds",
    "same_environment",
    "save_test",
    "save_tests",
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
