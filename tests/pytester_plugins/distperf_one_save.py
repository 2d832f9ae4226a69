"""Loaded with ``-p distperf_one_save`` into the pytester runs that save a baseline only for
its exact metrics (collective counts and bytes): a save keeps one measurement of each timing
instead of 4-6, which those runs never compare.  tests/test_baseline.py checks the saves'
own measurement counts."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_distperf.verdict import judgement

_COUNTS = {"_SAVE_MEASUREMENTS": 1, "_SAVE_MAX_MEASUREMENTS": 1}
_saved: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in _COUNTS.items():
        _saved[name] = getattr(judgement, name)
        setattr(judgement, name, value)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved.items():
        setattr(judgement, name, value)
