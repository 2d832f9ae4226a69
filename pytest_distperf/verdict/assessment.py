"""What comparing one metric with its baseline found: the figures a verdict reports and
its detail's sentences are built from.  Pure."""

from __future__ import annotations

import dataclasses

from pytest_distperf.records import Measured
from pytest_distperf.verdict.readings import Reading


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Assessment:
    """One metric's measurement (or, with the control, its pooled measurements) compared
    with the baseline: what a verdict reports."""

    baseline: float  # the baseline's estimate
    current: float  # this run's (with the control: at the baseline's host speed)
    change: float | None  # (current - baseline) / |baseline|; None when the baseline is 0
    worse: float  # the change in the bad direction (negative: better)
    worse_like: bool  # past the decision line in the bad direction (sentence 2)
    better_like: bool
    #: one-sided Mann-Whitney (with the control: the least significant reading's), what the
    #: decision and the confidence use; None with too few samples
    p_worse: float | None = None
    p_better: float | None = None
    spread: float | None = None
    measured: Measured | None = None  # the measurement judged (pooled, with the control)
    noisy: tuple[str, ...] = ()  # why the measurement cannot be trusted
    host_change: float | None = None  # how much slower the host-speed control ran
    control_slope: float | None = None  # how strongly the time follows the control
    set_aside: int = 0  # measurements set aside as slowed alone
    readings: tuple[Reading, ...] = ()  # with the control: every reading of the change

    @property
    def trusted(self) -> bool:
        return not self.noisy
