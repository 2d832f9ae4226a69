"""Root conftest: the plugin's own tests drive pytest in subprocesses through pytester."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from quick_runs import PLUGINS, quick_env

pytest_plugins = ("pytester",)

_SET = ("PYTHONPATH", "PYTEST_PLUGINS", "PYTEST_ADDOPTS")


@pytest.fixture(scope="session")
def run_environment() -> dict[str, str]:
    """The environment for a pytest run of a module-scoped fixture (:func:`quick_env`)."""
    return quick_env()


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, its runs in :func:`quick_env`: the verdict's pauses between measurements
    set to zero (tests/pytester_plugins/distperf_no_pauses.py), unused plugins off."""
    monkeypatch.syspath_prepend(str(PLUGINS))  # in-process runs
    env = quick_env()
    for key in _SET:
        monkeypatch.setenv(key, env[key])
    return pytester
