"""The runner check's pytest hooks: its shared state, the page at the end of the terminal
summary, and the page as the ``runner_check`` section of the ``--distperf-json`` report."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_distperf.config import DEFAULT_TOLERANCE, ConfigError, parse_tolerance
from pytest_distperf.doctor import page
from pytest_distperf.doctor.model import check_to_dict
from pytest_distperf.doctor.plan import plan_for
from pytest_distperf.doctor.state import Doctor
from pytest_distperf.fixtures.group import DistGroup

DOCTOR_KEY = pytest.StashKey[Doctor]()


def tolerance_of(config: pytest.Config) -> float:
    """The run's tolerance, as the plugin resolves it: the option, else the ini file."""
    for value, source in ((config.getoption("distperf_tolerance", None), "the command line"),
                          (config.getini("distperf_tolerance"), "the ini file")):
        if value not in (None, "", []):
            try:
                return parse_tolerance(value, "--distperf-tolerance", source)
            except ConfigError as exc:
                raise pytest.UsageError(str(exc)) from None
    return DEFAULT_TOLERANCE


@pytest.fixture
def doctor(request: pytest.FixtureRequest, nccl_group: Any) -> Doctor:
    """The check, one for the session (kept in the config's stash: the plan needs the
    group's device, which a session fixture cannot ask for)."""
    if nccl_group.backend == "gloo" and nccl_group.device_type == "cuda":
        pytest.skip("the runner check measures ranks as CI runs them, NCCL ranks on GPUs or "
                    "gloo ranks on CPUs; gloo ranks on a GPU (--distperf-backend gloo-cuda) "
                    "are for development: run it with --distperf-backend nccl or gloo")
    config = request.config
    found = config.stash.get(DOCTOR_KEY, None)
    if found is None:
        found = Doctor(plan_for(nccl_group.device_type), tolerance_of(config))
        config.stash[DOCTOR_KEY] = found
    return found


@pytest.fixture
def group(nccl_group: Any, doctor: Doctor) -> DistGroup:
    """The test's ranks, unrecorded: the check's measurements are no test's figures, to be
    judged against a baseline or saved as one."""
    unrecorded = DistGroup(nccl_group.engine, nccl_group.world_size)
    doctor.begin(unrecorded)
    return unrecorded


@pytest.hookimpl(trylast=True)  # after the plugin's summary: the page ends the output
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    found = config.stash.get(DOCTOR_KEY, None)
    if found is None:
        return
    terminalreporter.write_sep("=", "distperf runner check")
    for line in page.lines(found.finish()):
        terminalreporter.write_line(line, yellow=line.lstrip().startswith("!"))


def pytest_distperf_report_sections(config: pytest.Config) -> dict[str, Any]:
    found = config.stash.get(DOCTOR_KEY, None)
    if found is None:
        return {}
    check = found.finish()
    return {"runner_check": check_to_dict(check, page.sentences(check))}
