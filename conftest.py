"""Root conftest: the plugin's own tests drive pytest in subprocesses through pytester."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

_PLUGINS = Path(__file__).parent / "tests" / "pytester_plugins"


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, with the verdict's pauses between measurements set to zero in its runs
    (tests/pytester_plugins/distperf_no_pauses.py)."""
    monkeypatch.syspath_prepend(str(_PLUGINS))  # in-process runs
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (str(_PLUGINS), path))))
    monkeypatch.setenv("PYTEST_PLUGINS", "distperf_no_pauses")
    return pytester
