"""Verdicts: thresholds, baselines and the statistics that compare a run with them.  Pure.

The rule: no torch, no pytest; everything here works on records
(:mod:`pytest_distperf.records`) and files, so it tests fast and runs anywhere.

* :mod:`~pytest_distperf.verdict.thresholds`: the limits (defaults, ini, baseline file,
  marker) and the breach check;
* :mod:`~pytest_distperf.verdict.store`: baseline files: format, load, validate, save;
* :mod:`~pytest_distperf.verdict.stats`: estimators, spread, Mann-Whitney, the control's
  arithmetic;
* :mod:`~pytest_distperf.verdict.noise`: the noise probe (host steal, the ranks' CPU wait);
* :mod:`~pytest_distperf.verdict.rule`: one metric's measurements against its baseline;
* :mod:`~pytest_distperf.verdict.judgement`: one test's verdicts, compared or saved, and the
  re-measure loop.
"""

from __future__ import annotations

from pytest_distperf.records import (
    IMPROVED,
    INCONCLUSIVE,
    NO_BASELINE,
    NOT_COMPARABLE,
    REGRESSED,
    SAVED,
    UNCHANGED,
    VERDICT_ORDER,
)
from pytest_distperf.verdict.judgement import (
    Comparison,
    Judgement,
    Save,
    make_judgement,
    settle,
)
from pytest_distperf.verdict.noise import NoiseFigures
from pytest_distperf.verdict.rule import (
    ALPHA,
    CONFIRM_PAUSES_S,
    CONFIRM_ROUNDS,
    CONFIRMATIONS,
    CONTROL_PAUSE_S,
    CONTROL_SCREEN_FRACTION,
    CONTROL_WINDOWS,
    DECISION_FRACTION,
    MAX_ROUNDS,
    NOISY_BACKOFF_S,
    SAVE_MAX_WINDOWS,
    SAVE_PAUSE_S,
    SAVE_WINDOWS,
    Assessment,
    Window,
    assess,
    control_slope,
    controlled,
    decide,
)
from pytest_distperf.verdict.stats import estimate, mann_whitney_greater, spread
from pytest_distperf.verdict.store import (
    SCHEMA_VERSION,
    BaselineError,
    BaselineFile,
    SaveEntry,
    StoredMetric,
    baseline_path,
    environment_id,
    load,
    save_test,
    split_nodeid,
)
from pytest_distperf.verdict.thresholds import Breach, check_thresholds, resolve_thresholds

__all__ = [
    "ALPHA",
    "CONFIRMATIONS",
    "CONFIRM_PAUSES_S",
    "CONFIRM_ROUNDS",
    "CONTROL_PAUSE_S",
    "CONTROL_SCREEN_FRACTION",
    "CONTROL_WINDOWS",
    "DECISION_FRACTION",
    "IMPROVED",
    "INCONCLUSIVE",
    "MAX_ROUNDS",
    "NOISY_BACKOFF_S",
    "NOT_COMPARABLE",
    "NO_BASELINE",
    "REGRESSED",
    "SAVED",
    "SAVE_MAX_WINDOWS",
    "SAVE_PAUSE_S",
    "SAVE_WINDOWS",
    "SCHEMA_VERSION",
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
    "environment_id",
    "estimate",
    "load",
    "make_judgement",
    "mann_whitney_greater",
    "resolve_thresholds",
    "save_test",
    "settle",
    "split_nodeid",
    "spread",
]
