"""The runner check's state across its tests: the page being filled, what the noise probe
saw over the whole check and over each part, and the readings taken from the ranks.
No torch at import.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, TypeVar

from pytest_distperf.doctor import loops, nvml, system
from pytest_distperf.doctor.load import Watch
from pytest_distperf.doctor.model import Check, Fidelity, Floor, GpuReading
from pytest_distperf.doctor.plan import Plan
from pytest_distperf.fixtures.group import DistGroup

Part = TypeVar("Part", Fidelity, Floor)


def rank_pids(group: DistGroup) -> list[int]:
    """The ranks' process ids, as the pool reports them."""
    return [int(info["pid"]) for info in group.engine.rank_info()[:group.world_size]]


class Doctor:
    """One check: ``plan`` says how much to measure; :attr:`check` is the page."""

    def __init__(self, plan: Plan, tolerance: float) -> None:
        self.plan = plan
        self.check = Check(tolerance=tolerance, quick=plan.quick)
        self.started = time.monotonic()
        self.watch: Watch | None = None
        self.finished = False

    def begin(self, group: DistGroup) -> None:
        """Start watching the whole check at its first part (the pool is up by then)."""
        if self.watch is None:
            self.started = time.monotonic()
            self.watch = Watch(rank_pids(group), local_ranks=group.engine.mode == "torchrun")

    def part(self, what: str, group: DistGroup,
             measure: Callable[[DistGroup, Plan], Part]) -> Part:
        """``measure(group, plan)``, with the noise probe's figures of its span as its
        ``load``; a failure is noted on the page, then raised."""
        watch = Watch(rank_pids(group), local_ranks=group.engine.mode == "torchrun")
        try:
            found = measure(group, self.plan)
        except Exception as exc:
            self.check.errors.append(f"{what}: {type(exc).__name__}: {exc}".splitlines()[0])
            raise
        return dataclasses.replace(found, load=watch.load())

    def environment(self, group: DistGroup) -> None:
        """The environment and topology, and the warnings about them."""
        seen: list[dict[str, Any]] = group.run(loops.rank_environment)
        first = seen[0]
        found = tuple((str(k), str(v)) for k, v in first["variables"])
        sys_ = system.build_system(group.engine.rank_info()[:group.world_size],
                                   backend=group.backend, device_type=group.device_type,
                                   found=found, devices=[str(s["device"]) for s in seen],
                                   cores=list(first["cores"]),
                                   cpu_model=str(first["cpu_model"]))
        self.check.system = sys_
        self.check.advice += system.variable_advice(found) + system.cpu_advice(sys_)

    def gpus(self, group: DistGroup) -> None:
        """NVML's readings of every rank's GPU under load, and the warnings about them."""
        pids = rank_pids(group)
        replies: list[GpuReading | str] = group.run(loops.gpu_reading, pids)
        readings = [r for r in replies if isinstance(r, GpuReading)]
        # two ranks on one GPU read it twice: once is enough
        unique = list({r.index: r for r in readings}.values())
        self.check.gpus = unique
        self.check.nvml = next((r for r in replies if isinstance(r, str)), "")
        self.check.advice += nvml.gpu_advice(unique)

    def finish(self) -> Check:
        """The page, with the whole check's load and duration (once)."""
        if not self.finished and self.watch is not None:
            self.finished = True
            self.check.load = self.watch.load()
            self.check.seconds = time.monotonic() - self.started
        return self.check
