"""Root conftest: the plugin's own tests drive pytest in subprocesses through pytester."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

_PLUGINS = Path(__file__).parent / "tests" / "pytester_plugins"
#: Plugins of the outer suite that a run of the plugin never uses: 0.8 s a start.
_UNUSED = ("hypothesispytest", "benchmark", "anyio")


def _run_environment() -> dict[str, str]:
    """What a run of pytest inside a test gets: the verdict's pauses between measurements
    set to zero (tests/pytester_plugins/distperf_no_pauses.py), the unused plugins off."""
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(filter(None, (str(_PLUGINS), path))),
            "PYTEST_PLUGINS": "distperf_no_pauses",
            "PYTEST_ADDOPTS": " ".join(f"-p no:{name}" for name in _UNUSED)}


@pytest.fixture(scope="session")
def run_environment() -> dict[str, str]:
    """The environment for a pytest run of a module-scoped fixture: the process's own, with
    what :func:`pytester` sets."""
    return {**os.environ, **_run_environment()}


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, its runs in :func:`_run_environment`."""
    monkeypatch.syspath_prepend(str(_PLUGINS))  # in-process runs
    for key, value in _run_environment().items():
        monkeypatch.setenv(key, value)
    return pytester
