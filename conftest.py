"""Root conftest: the plugin's own tests drive pytest through pytester, in this process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch  # noqa: F401  (before any in-process run: torch cannot be imported twice)
from _pytest.pytester import SysModulesSnapshot

from pytest_distperf.pool.launcher import fork_server
from pytest_distperf.session import hands_out_tests

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from quick_runs import PLUGINS, SET, XDIST, not_under, quick_env

pytest_plugins = ("pytester",)


def pytest_configure(config: pytest.Config) -> None:
    """Start the ranks' fork server, which every in-process run's pools fork from: it
    imports torch and torch._dynamo (4 s) while pytest collects the suite, not while the
    first test waits.  Not in an xdist controller, which runs no test."""
    if hasattr(config, "workerinput") or not hands_out_tests(config):
        fork_server()


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """pytester, its runs in :func:`quick_env`: the verdict's pauses between measurements
    set to zero (tests/pytester_plugins/distperf_no_pauses.py), unused plugins off.

    ``runpytest`` runs in this process (2 s less than a subprocess: no new Python, no torch
    import); after it, only the modules of pytester's folders are forgotten, so the next run
    imports its own test modules again while torch, imported once, stays."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    env = quick_env()
    for key in SET:
        monkeypatch.setenv(key, env[key])
    for key in XDIST:
        monkeypatch.delenv(key, raising=False)
    keep = not_under(pytester.path.parent.parent)
    monkeypatch.setattr(pytester, "_Pytester__take_sys_modules_snapshot",
                        lambda: SysModulesSnapshot(preserve=keep))
    monkeypatch.setattr(pytester, "_sys_modules_snapshot", SysModulesSnapshot(preserve=keep))
    return pytester
