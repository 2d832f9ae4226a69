"""A GPU step that slowed while the device's work did not: the host's side.  Pure.

On a GPU a step measured by ``ddp_step_timer`` carries what the device had to do: the
kernels' time per step (``device_time_s``), the kernel launches and host syncs per step
(exact) and the device's busy share of the step.  A step (or compute) time called regressed
while the launches and syncs held, the kernels' time grew by less than half as much and the
busy share fell moved on the host's side: a launch-bound step whose host work grew, or a
host that ran slower.  The host-speed control timed before and after the steps, outside
them (``host_control_s``), tells the two apart:

* the control slower by at least half the step's change (or no control to tell): the host
  explains it, and the verdict is inconclusive;
* the control as fast as at the save: the step's own host work grew, and the regression
  stands, saying so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pytest_distperf.records import INCONCLUSIVE, REGRESSED, UNCHANGED, Verdict
from pytest_distperf.verdict.explain import pct

#: the times a GPU step is judged by, each with the device's figures of its measurement
TIMES = ("step_time_s", "compute_time_s")
FIGURES = ("device_time_s", "device_busy", "device.launches", "device.syncs", "host_control_s")


def host_side(verdicts: Sequence[Verdict], labels: Mapping[str, str]) -> list[Verdict]:
    """``verdicts`` with each regressed GPU step time the device did not see judged again
    (``labels``: metric -> the label of the measurement that recorded it)."""
    named = {(labels.get(v.metric, ""), v.metric): v for v in verdicts}
    out = []
    for v in verdicts:
        stem = _stem(v.metric) if v.verdict == REGRESSED else None
        if stem is None:
            out.append(v)
            continue
        prefix, suffix = stem
        label = labels.get(v.metric, "")
        out.append(_judged(v, *(named.get((label, f"{prefix}{name}{suffix}"))
                                for name in FIGURES)))
    return out


def _stem(name: str) -> tuple[str, str] | None:
    """(prefix, ``#n`` suffix) of a step or compute time's name; None for another metric."""
    head, sep, number = name.partition("#")
    for time in TIMES:
        if head.endswith(time):
            return head[:-len(time)], sep + number
    return None


def _judged(v: Verdict, device: Verdict | None, busy: Verdict | None,
            launches: Verdict | None, syncs: Verdict | None,
            host: Verdict | None) -> Verdict:
    """``v`` (regressed) judged again from its measurement's device figures."""
    if (v.change is None or device is None or device.change is None or busy is None
            or busy.current is None or busy.baseline is None or launches is None
            or syncs is None):
        return v  # not measured on a GPU, or against a baseline without these figures
    if (launches.verdict != UNCHANGED or syncs.verdict != UNCHANGED
            or device.change >= v.change / 2 or busy.current >= busy.baseline):
        return v  # the device had more to do, or stayed as busy: not the host's side
    seen = (f"the device's kernel time {pct(device.change)}, kernel launches and host "
            f"syncs per step unchanged, the device busy {busy.baseline:.2f} -> "
            f"{busy.current:.2f} of the step")
    if host is None or host.change is None or host.change >= v.change / 2:
        control = ("no host-speed control to tell" if host is None or host.change is None
                   else f"the host-speed control {pct(host.change)}")
        return dataclasses.replace(v, verdict=INCONCLUSIVE, detail=(
            f"inconclusive: {pct(v.change)}, all of it on the host's side, and the host ran "
            f"slower ({control}): a noisy host, not the step; re-run, or re-save on a "
            f"steadier runner. {seen}; judged alone: {v.detail}"))
    return dataclasses.replace(v, detail=(
        f"{v.detail}; host side: {seen}, the host-speed control {pct(host.change)}: the "
        "step's own host work grew (a launch-bound step: more Python, launches or "
        "synchronisation per step?)"))
