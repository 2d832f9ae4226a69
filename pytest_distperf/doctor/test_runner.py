"""The runner check: ``pytest --pyargs pytest_distperf.doctor --distperf --gpus N``.

Each test measures one part of the page (:mod:`pytest_distperf.doctor`); none asserts a
timing: a figure is reported, with what it means, never failed on.  A test fails only where
its part could not be measured.
"""

from __future__ import annotations

import pytest

from pytest_distperf.doctor import fidelity, floors
from pytest_distperf.doctor.state import Doctor
from pytest_distperf.fixtures.group import DistGroup


def test_environment(group: DistGroup, doctor: Doctor) -> None:
    doctor.environment(group)
    assert doctor.check.system is not None


def test_gpus(group: DistGroup, doctor: Doctor) -> None:
    if group.device_type != "cuda":
        pytest.skip("no GPU: the ranks run on CPU")
    doctor.gpus(group)


@pytest.mark.parametrize("name", ["bench", "measure", "step"])
def test_fidelity(group: DistGroup, doctor: Doctor, name: str) -> None:
    found = doctor.part(f"fidelity of {name}", group, getattr(fidelity, name))
    doctor.check.fidelity.append(found)


@pytest.mark.parametrize("name", ["measure", "bench", "step"])
def test_floor(group: DistGroup, doctor: Doctor, name: str) -> None:
    found = doctor.part(f"noise floor of {name}", group, getattr(floors, name))
    doctor.check.floors.append(found)
