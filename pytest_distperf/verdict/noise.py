"""The noise probe: how much CPU the measured processes were denied while they were measured.

Three figures per measurement, all read from Linux's ``/proc`` (no torch, no pytest):

* **host steal**: the share of all CPU time during the measurement that the hypervisor gave
  to other guests (the ``steal`` column of the ``cpu`` line of ``/proc/stat``).  Cloud CI
  runners lose 5-15% this way at idle and more under load;
* **CPU wait**: per measured process (the ranks), the time its threads were ready to run but
  waited for a CPU (the second field of ``/proc/<pid>/task/<tid>/schedstat``), per second of
  the measurement.  Other jobs on the same machine show up here: on a 2-core machine where
  another process keeps one core busy, the ranks wait about half of the time and every
  timing doubles, even the fastest one.  But the ranks also wait for *each other*: gloo's
  worker threads and the ranks of a collective share the cores, so on a 2-core runner the
  ranks of an idle machine wait 0.45-0.65 s/s in any collective.  The wait alone cannot
  tell a neighbour from the measurement itself;
* **other load**: the share of the machine's CPU time (all cores) that went to processes
  other than the measured ones and this one: the busy time of ``/proc/stat`` minus the
  ``utime + stime`` of the measured processes and of the controller (``/proc/<pid>/stat``).
  An idle machine reads 0 (within the tick accounting, about -0.07..+0.02 here); a
  neighbour that keeps one of 2 cores busy reads 0.3-0.5.

A measurement is too noisy when other processes took more than ``_OTHER_LOAD_LIMIT`` of
the machine while it ran; the host steal and the CPU wait are reported with it (the steal
also says whether the host's neighbours got busy since the save:
:func:`~pytest_distperf.verdict.readings.stolen_since`).

Where a figure cannot be read (not Linux, no schedstat, a process born during the measurement) it
is ``None``: unknown, never guessed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable

from pytest_distperf.common import procs

#: Above this share of the machine's CPU time used by other processes a measurement is too
#: noisy: a tenth of the machine.  An idle 2-core machine reads about 0; a neighbour busy
#: 30% of the time reads 0.10-0.14 and costs a CPU-bound measurement about as much.
_OTHER_LOAD_LIMIT = 0.10

_STEAL_COLUMN = 7  # user nice system idle iowait irq softirq steal guest guest_nice


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """Counters at one moment: machine-wide CPU jiffies and, per pid, the run-queue wait
    and the CPU time (the measured processes', then this process's)."""

    monotonic: float
    cpu: tuple[int, ...]  # the cpu line of /proc/stat; () when unreadable
    wait_ns: tuple[tuple[int, int], ...]  # (pid, total run-queue wait of its threads in ns)
    ticks: tuple[tuple[int, int], ...] = ()  # (pid, utime + stime in clock ticks)
    cpus: int = 0  # the CPUs the cpu line sums; 0: unknown
    #: per GPU of the ranks, ns held below its clocks since its driver loaded (NVML); None:
    #: not on GPUs, or not readable
    held_ns: tuple[int, ...] | None = None
    #: per GPU of the ranks, its SM clock (MHz, NVML); None: not on GPUs, or not readable
    sm_clock_mhz: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class NoiseFigures:
    """What the probe saw during one measurement.  ``None``: could not be measured."""

    seconds: float
    steal: float | None  # share of all CPU time stolen by the host, 0..1
    wait: float | None  # mean seconds a measured process waited for a CPU, per second
    other_load: float | None = None  # share of all CPU time used by other processes, 0..1
    #: the most of the time any GPU of the ranks was held below its clocks (heat, its
    #: board's or its reliability limit: NVML's violation counters), 0..1
    held: float | None = None
    #: the lowest SM clock (MHz) NVML read of a GPU of the ranks at the end: shown, not
    #: judged (the violation counters in ``held`` say whether the GPU was held down)
    sm_clock_mhz: int | None = None

    def too_noisy(self) -> list[str]:
        """Why the measurement cannot be trusted (empty when it can): other processes'
        load, or a GPU held below its clocks at all (NVBench sets a throttled measurement
        aside too).

        An other load that could not be read is no reason: the sample spread (judged by
        :mod:`pytest_distperf.verdict.rule`) is then the only guard.
        """
        out = []
        if self.other_load is not None and self.other_load > _OTHER_LOAD_LIMIT:
            waited = "" if self.wait is None else f", the ranks waiting {self.wait:.0%}"
            out.append(f"other processes used {self.other_load:.0%} of the CPUs > "
                       f"{_OTHER_LOAD_LIMIT:.0%}{waited}")
        if self.held:
            out.append(f"a GPU was held below its clocks (heat, or its board's limits) "
                       f"{self.held:.1%} of the time")
        return out


def pooled_noise(figures: list[NoiseFigures]) -> NoiseFigures | None:
    """The figures of several measurements taken as one, noisy exactly when one of them
    was: the worst host steal, and the CPU wait and other load of one measurement together
    (the first noisy one, else the one with the most other load): the two decide together,
    and the worst of each taken from two quiet measurements could read as noisy."""
    if not figures:
        return None
    worst = next((f for f in figures if f.too_noisy()), None) or max(
        figures, key=lambda f: (f.other_load or 0.0, f.wait or 0.0))
    steals = [f.steal for f in figures if f.steal is not None]
    held = [f.held for f in figures if f.held is not None]
    clocks = [f.sm_clock_mhz for f in figures if f.sm_clock_mhz is not None]
    return NoiseFigures(sum(f.seconds for f in figures), max(steals, default=None),
                        worst.wait, worst.other_load, max(held, default=None),
                        min(clocks, default=None))


def _read_cpu_lines() -> tuple[tuple[int, ...], int]:
    """The ``cpu`` line of ``/proc/stat`` (all CPUs together) and the number of CPUs it
    sums (its ``cpuN`` lines: the online CPUs, whatever ``os.cpu_count()`` says);
    ((), 0) when unreadable."""
    try:
        with open("/proc/stat") as f:
            lines = [line.split() for line in f if line.startswith("cpu")]
    except OSError:
        return (), 0
    if not lines or lines[0][0] != "cpu":
        return (), 0
    return tuple(int(v) for v in lines[0][1:]), len(lines) - 1


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


def siblings(table: dict[int, procs.Proc] | None = None) -> list[int]:
    """This process and the others of its parent: under torchrun, the local ranks (the agent
    starts them all), which are the measurement, not neighbours.  Only this process when the
    parent is init or ``/proc`` cannot be listed.  ``table``: :func:`procs.table`, if read."""
    me, parent = os.getpid(), os.getppid()
    if parent <= 1:
        return [me]
    table = procs.table() if table is None else table
    return [me, *sorted(pid for pid, proc in table.items()
                        if proc.ppid == parent and pid != me)]


def snapshot(pids: Iterable[int] = (), *, local_ranks: bool = False,
             held_ns: tuple[int, ...] | None = None,
             sm_clock_mhz: tuple[int, ...] | None = None) -> Snapshot:
    """The counters now, for the measured processes ``pids`` (with ``local_ranks``, also
    :func:`siblings`: the local ranks under torchrun).  Their CPU time is counted with this
    process's (the controller) and every descendant's: all of it is the test's.  One pass
    over ``/proc`` for all of it.  ``held_ns`` and ``sm_clock_mhz``: the GPUs' counters and
    clocks, as the caller read them (:func:`~pytest_distperf.doctor.nvml.clocks`)."""
    table = procs.table()
    pids = list(dict.fromkeys([*pids, *(siblings(table) if local_ranks else ())]))
    waits = []
    for pid in pids:
        value = _wait_ns(pid)
        if value is not None:
            waits.append((pid, value))
    # the controller's and every descendant's CPU time is the test's too (a rank's
    # DataLoader workers, the processes a test starts): not neighbours
    ticks = tuple((pid, table[pid].ticks)
                  for pid in procs.descendants([*pids, os.getpid()], table) if pid in table)
    cpu, cpus = _read_cpu_lines()
    return Snapshot(time.monotonic(), cpu, tuple(waits), ticks, cpus, held_ns, sm_clock_mhz)


def _other_load(start: Snapshot, end: Snapshot, seconds: float) -> float | None:
    """The share of the machine's CPU time during the measurement that processes other than the
    measured ones, this one and their descendants used; None when it cannot be read.  A
    process of theirs born during it counts from 0; one that ended in it is lost, and
    its CPU time reads as other load.  Clipped at 0 (tick accounting puts the difference a
    few percent either side of the truth)."""
    if (len(start.cpu) <= _STEAL_COLUMN or len(end.cpu) != len(start.cpu) or seconds <= 0
            or not start.ticks):
        return None
    before = dict(start.ticks)
    deltas = [b - a for a, b in zip(start.cpu, end.cpu, strict=True)]
    # user nice system irq softirq: time the CPUs ran something (idle, iowait and steal not)
    busy = deltas[0] + deltas[1] + deltas[2] + deltas[5] + deltas[6]
    ours = sum(max(0, ticks - before.get(pid, 0)) for pid, ticks in end.ticks)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    capacity = seconds * hz * (end.cpus or os.cpu_count() or 1)
    return max(0.0, (busy - ours) / capacity)


def between(start: Snapshot, end: Snapshot) -> NoiseFigures:
    """The figures of the measurement from ``start`` to ``end``.

    CPU wait is averaged over the processes seen at both ends (a process that appeared in
    between, such as a pool spawned during the measurement, has no starting figure and is left
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
    held: float | None = None
    if (start.held_ns is not None and end.held_ns is not None and seconds > 0
            and len(start.held_ns) == len(end.held_ns)):
        held = min(1.0, max((max(0, b - a) for a, b in zip(start.held_ns, end.held_ns,
                                                            strict=True)), default=0) / 1e9
                   / seconds)
    # at the end, right after the work: at the start an idle GPU runs low clocks by design
    return NoiseFigures(seconds, steal, wait, _other_load(start, end, seconds), held,
                        min(end.sm_clock_mhz or (), default=None))
