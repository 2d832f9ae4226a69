"""Processes as Linux lists them in ``/proc``: one pass over ``/proc/<pid>/stat`` gives each
process's parent, session, CPU time and start time.  Used by the noise probe (whose CPU time
is the test's) and by the pool's clean-up (what the ranks started).  Elsewhere every table is
empty.  No torch, no pytest."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple


class Proc(NamedTuple):
    """One process's line in ``/proc/<pid>/stat``, the fields this package reads."""

    ppid: int
    sid: int
    ticks: int  # utime + stime of all its threads, in clock ticks
    start: str  # start time in clock ticks since boot: with the pid, it names one process


def read(pid: int | str) -> Proc | None:
    """``pid``'s figures; None when it is gone or cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ')'
        return Proc(int(fields[1]), int(fields[3]), int(fields[11]) + int(fields[12]),
                    fields[19])
    except (OSError, IndexError, ValueError):
        return None


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, Ctrl-Z, a debugger): it runs no signal handler,
    so it cannot show its stack, until it is continued."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def table() -> dict[int, Proc]:
    """Every process ``/proc`` lists (empty when it cannot be listed)."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    out = {}
    for entry in entries:
        if entry.isdigit() and (proc := read(entry)) is not None:  # else: it just ended
            out[int(entry)] = proc
    return out


def descendants(roots: Iterable[int], procs: dict[int, Proc]) -> list[int]:
    """``roots`` and all their descendants in ``procs``, roots first."""
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    seen = dict.fromkeys(roots)
    todo = list(seen)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen[child] = None
                todo.append(child)
    return list(seen)
