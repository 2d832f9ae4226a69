"""What other processes did to the machine during the check, and who they were.  No torch,
no pytest.

The figures are the noise probe's (:mod:`pytest_distperf.verdict.noise`: host steal, the
ranks' CPU wait, the share of the CPUs other processes used), read over each part of the
check and over the whole of it; beside them, from the same ``/proc`` tables
(:mod:`pytest_distperf.common.procs`), the other processes that used the most CPU, so that a
neighbour is named, not guessed.  Ours are the ranks, this process and their descendants.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pytest_distperf.common import procs
from pytest_distperf.doctor.model import Busy, Load
from pytest_distperf.doctor.verdict_api import Snapshot, between, snapshot

#: Other processes using less than this many cores' worth are not named (a shell, a
#: logger): 5% of a core.
NAMED_CORES = 0.05
#: At most this many other processes are named.
NAMED_MAX = 3


class Watch:
    """The probe's counters and the process table at the start of a span; :meth:`load`
    gives the span's :class:`Load` up to now.  ``pids``: the ranks."""

    def __init__(self, pids: Sequence[int], *, local_ranks: bool = False) -> None:
        self.pids = list(pids)
        self.local_ranks = local_ranks
        self.table = procs.table()
        self.start: Snapshot = snapshot(self.pids, local_ranks=local_ranks)

    def load(self) -> Load:
        end = snapshot(self.pids, local_ranks=self.local_ranks)
        table = procs.table()
        figures = between(self.start, end)
        ours = set(procs.descendants([*self.pids, os.getpid()], table))
        seconds = max(end.monotonic - self.start.monotonic, 1e-9)
        return Load(seconds=figures.seconds, cpus=end.cpus or os.cpu_count() or 1,
                    steal=figures.steal, wait=figures.wait, other_load=figures.other_load,
                    noisy=tuple(figures.too_noisy()),
                    busiest=busiest(self.table, table, ours, seconds))


def busiest(before: dict[int, procs.Proc], after: dict[int, procs.Proc], ours: set[int],
            seconds: float, hz: int | None = None) -> tuple[Busy, ...]:
    """The other processes that used the most CPU between the two tables, busiest first
    (:data:`NAMED_MAX` at most, none under :data:`NAMED_CORES`).  A process born in the span
    counts from 0; one that ended in it is not seen."""
    hz = hz or (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
    found = []
    for pid, proc in after.items():
        if pid in ours or pid == os.getpid():
            continue
        old = before.get(pid)
        # the same pid with another start time is a new process
        used = proc.ticks - (old.ticks if old is not None and old.start == proc.start else 0)
        cores = used / hz / seconds
        if cores >= NAMED_CORES:
            found.append(Busy(pid, process_name(pid), round(cores, 3)))
    found.sort(key=lambda b: -b.cores)
    return tuple(found[:NAMED_MAX])


def process_name(pid: int) -> str:
    """The process's command name (``/proc/<pid>/comm``), "?" when it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"

