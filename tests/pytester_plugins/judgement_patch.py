"""What the pytester plugins beside this file share: set names of the verdict's judgement
module for one pytest run, and put them back after it."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_distperf.verdict import judgement


class JudgementPatch:
    """``values`` (name -> value, or a function of the current value) for one run."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values
        self.saved: dict[str, Any] = {}

    def pytest_configure(self, config: pytest.Config) -> None:
        for name, value in self.values.items():
            self.saved[name] = getattr(judgement, name)
            setattr(judgement, name, value(self.saved[name]) if callable(value) else value)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        for name, value in self.saved.items():
            setattr(judgement, name, value)
