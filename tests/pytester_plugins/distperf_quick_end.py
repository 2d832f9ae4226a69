"""Loaded into every pytest run the plugin's tests start (tests/quick_runs.py): no garbage
collections at the end of the run.  pytest's unraisable-exception plugin collects 5 times
before it reports what it caught; with torch (and torch._dynamo) imported that is 0.15-0.4 s
each, 1-2 s a run, on four ranks at once under torchrun.  pytester's in-process runs leave
them out the same way; no test here is about an unraisable exception."""

from __future__ import annotations

import pytest
from _pytest.unraisableexception import gc_collect_iterations_key


def pytest_configure(config: pytest.Config) -> None:
    config.stash[gc_collect_iterations_key] = 0
