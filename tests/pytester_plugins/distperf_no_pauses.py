"""Loaded into every pytester run of the plugin's tests (conftest.py): the verdict's pauses
between measurements go to zero.  They spread a real gate's measurements over a few seconds
of a host's speed; a test proves a behaviour with effects no pause changes, and
tests/test_baseline.py checks the pauses themselves."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_distperf.verdict import judgement

_PAUSES = ("_CONFIRM_PAUSES_S", "_CONTROL_PAUSE_S", "_SAVE_PAUSE_S", "_NOISY_BACKOFF_S")
_saved: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    for name in _PAUSES:
        value = getattr(judgement, name)
        _saved[name] = value
        setattr(judgement, name, (0.0,) * len(value) if isinstance(value, tuple) else 0.0)


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _saved.items():
        setattr(judgement, name, value)
