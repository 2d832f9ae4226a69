"""The noise probe: how much CPU the measured processes were denied while they were measured.

Two figures per measurement window, both read from Linux's ``/proc`` (no torch, no pytest):

* **host steal**: the share of all CPU time in the window that the hypervisor gave to other
  guests (the ``steal`` column of the ``cpu`` line of ``/proc/stat``).  Cloud CI runners lose
  5-15% this way at idle and more under load;
* **CPU wait**: per measured process (the ranks), the time its threads were ready to run but
  waited for a CPU (the second field of ``/proc/<pid>/task/<tid>/schedstat``), per second of
  the window.  Other jobs on the same machine show up here: on a 2-core machine where another
  process keeps one core busy, the ranks wait about half of the time and every timing doubles,
  even the fastest one.

Where a figure cannot be read (not Linux, no schedstat, a process born during the window) it
is ``None``: unknown, never guessed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable

#: Above this host steal a window is too noisy to call a regression on.  Normal steal on
#: shared runners is 5-15% (docs/background.md); a window must not be thrown away for that alone.
STEAL_LIMIT = 0.20
#: Above this CPU wait (seconds waited per second, per rank) a window is too noisy.  Ranks
#: that have the machine to themselves wait 0.05-0.11 s/s here (their own helper threads and
#: the controller share the cores); another busy process pushes it to 0.3-0.9.
WAIT_LIMIT = 0.25

_STEAL_COLUMN = 7  # user nice system idle iowait irq softirq steal guest guest_nice


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters at one moment: machine-wide CPU jiffies and, per pid, the run-queue wait."""

    monotonic: float
    cpu: tuple[int, ...]  # the cpu line of /proc/stat; () when unreadable
    wait_ns: tuple[tuple[int, int], ...]  # (pid, total run-queue wait of its threads in ns)


@dataclasses.dataclass(frozen=True, slots=True)
class NoiseFigures:
    """What the probe saw during one window.  ``None``: could not be measured."""

    seconds: float
    steal: float | None  # share of all CPU time stolen by the host, 0..1
    wait: float | None  # mean seconds a measured process waited for a CPU, per second

    def too_noisy(self) -> list[str]:
        """Why the window cannot be trusted (empty when it can).

        A figure that could not be measured is no reason: the sample spread (judged by
        :mod:`pytest_distperf.verdict.rule`) is then the only guard.
        """
        reasons: list[str] = []
        if self.steal is not None and self.steal > STEAL_LIMIT:
            reasons.append(f"host steal {self.steal:.0%} > {STEAL_LIMIT:.0%}")
        if self.wait is not None and self.wait > WAIT_LIMIT:
            reasons.append(f"CPU wait {self.wait:.0%} > {WAIT_LIMIT:.0%}")
        return reasons

    def describe(self) -> str:
        steal = "?" if self.steal is None else f"{self.steal:.1%}"
        wait = "?" if self.wait is None else f"{self.wait:.1%}"
        return f"host steal {steal}, CPU wait {wait}"


def _read_cpu_line() -> tuple[int, ...]:
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return ()
    if not first or first[0] != "cpu":
        return ()
    return tuple(int(v) for v in first[1:])


def _wait_ns(pid: int) -> int | None:
    """Total run-queue wait of all threads of ``pid``; None when unreadable."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return total


def snapshot(pids: Iterable[int] = ()) -> Snapshot:
    waits = []
    for pid in pids:
        value = _wait_ns(pid)
        if value is not None:
            waits.append((pid, value))
    return Snapshot(time.monotonic(), _read_cpu_line(), tuple(waits))


def between(start: Snapshot, end: Snapshot) -> NoiseFigures:
    """The figures of the window from ``start`` to ``end``.

    CPU wait is averaged over the processes seen at both ends (a process that appeared in
    between, such as a pool spawned during the window, has no starting figure and is left
    out; with none left the figure is unknown).
    """
    seconds = max(end.monotonic - start.monotonic, 0.0)
    steal: float | None = None
    if len(start.cpu) > _STEAL_COLUMN and len(end.cpu) == len(start.cpu):
        deltas = [b - a for a, b in zip(start.cpu, end.cpu, strict=True)]
        total = sum(deltas[:8])  # guest time is already counted in user
        if total > 0:
            steal = max(0.0, deltas[_STEAL_COLUMN] / total)
    wait: float | None = None
    before = dict(start.wait_ns)
    common = [(before[pid], value) for pid, value in end.wait_ns if pid in before]
    if common and seconds > 0:
        waited = sum(max(0, b - a) for a, b in common) / 1e9
        wait = waited / (seconds * len(common))
    return NoiseFigures(seconds, steal, wait)
