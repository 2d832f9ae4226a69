"""What a rank pool leaves on the machine, and how it is cleared: its folder, and the processes
the ranks' code started.

A pool lives in a folder ``distperf-pool-*`` in the temporary directory (rank logs, stack
dumps) with a file ``owner`` naming the controller (pid and start time) and a file ``ranks``
naming its rank processes the same way.  The processes a test started on a rank are found in
three ways, so that one that escapes one way is caught by another:

* the marker: every rank process, and so every process that a rank's code starts, carries
  ``DISTPERF_POOL=<that folder>`` in its environment, unless it was started with an
  environment of its own (``env={}``);
* the session: every rank leads a session of its own, and what it starts stays in that
  session unless it calls ``setsid`` (``start_new_session=True``);
* the parent chain: what runs below a rank that is still alive.

They are killed when the pool closes.  A controller killed with ``SIGKILL`` cannot clear
anything: its ranks die with it (``PR_SET_PDEATHSIG``), and the next pool started on the
machine removes the folder and kills what still carries its marker or runs in the session of
one of its ranks.

Linux reads processes through ``/proc``; elsewhere only the folders are cleared.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

from pytest_distperf.common import procs
from pytest_distperf.rank.worker import POOL_MARKER as MARKER

#: The prefix of every pool folder in the temporary directory.
POOL_PREFIX = "distperf-pool-"
#: The file in a pool's folder that names its rank processes (a pid and start time a line).
RANKS_FILE = "ranks"
#: A folder without an owner file (an older version's, or one whose start was cut short) is
#: cleared once it is this old.
ORPHAN_AGE_S = 3600.0


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where unknown): with the pid,
    it names one process even after the pid is reused."""
    proc = procs.read(pid)
    return proc.start if proc is not None else ""


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive, and not ours to judge
        return True
    return not start or _start_time(pid) in ("", start)


def new_pool_dir() -> str:
    """Clear stale pools, then make this controller's pool folder and sign it."""
    clear_stale()
    path = tempfile.mkdtemp(prefix=POOL_PREFIX)
    pid = os.getpid()
    Path(path, "owner").write_text(f"{pid} {_start_time(pid)}\n")
    return path


def clear_stale(tmp: str | None = None) -> list[str]:
    """Remove the pool folders whose controller is gone, and kill the processes that still
    carry their marker; the folders removed."""
    import time

    root = Path(tmp or tempfile.gettempdir())
    removed: list[str] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(POOL_PREFIX)]
    except OSError:
        return removed
    for folder in candidates:
        try:
            owner = (folder / "owner").read_text().split()
        except OSError:
            owner = None
        if owner is None:
            try:
                stale = time.time() - folder.stat().st_mtime > ORPHAN_AGE_S
            except OSError:
                continue
        else:
            try:
                stale = not _alive(int(owner[0]), owner[1] if len(owner) > 1 else "")
            except (ValueError, IndexError):
                stale = True
        if stale:
            kill_leftovers(str(folder))
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


def marked(pool_dir: str) -> list[int]:
    """The pids of the processes that carry ``pool_dir``'s marker (Linux; [] elsewhere)."""
    needle = f"{MARKER}={pool_dir}".encode() + b"\0"
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as f:
                    environ = f.read() + b"\0"
            except OSError:  # gone, or not ours
                continue
            if needle in environ:
                found.append(int(entry.name))
    return found


def sign_ranks(pool_dir: str, pids: list[int]) -> None:
    """Write down the pool's rank processes: what they start is found through them, even
    after the controller is gone."""
    Path(pool_dir, RANKS_FILE).write_text("".join(f"{pid} {_start_time(pid)}\n"
                                                  for pid in pids))


def ranks_of(pool_dir: str) -> dict[int, str]:
    """The rank processes :func:`sign_ranks` wrote down: pid, start time."""
    ranks = {}
    with contextlib.suppress(OSError):
        for line in Path(pool_dir, RANKS_FILE).read_text().splitlines():
            pid, _, start = line.partition(" ")
            if pid.isdigit():
                ranks[int(pid)] = start.strip()
    return ranks


def started_by(ranks: dict[int, str]) -> dict[int, str]:
    """The processes that ``ranks`` (pid: start time) started, pid: start time: those in a
    rank's session (begun after the rank, while the session's leader is that rank or gone)
    and those below a rank that still runs."""
    table = procs.table()

    def is_rank(pid: int) -> bool:
        return pid in ranks and (not ranks[pid] or table[pid].start == ranks[pid])

    def later(start: str, rank_start: str) -> bool:
        return not (start.isdigit() and rank_start.isdigit()) or int(start) >= int(rank_start)

    below = set(procs.descendants([r for r in ranks if r in table and is_rank(r)], table))
    found = {}
    for pid, proc in table.items():
        if pid in ranks:
            continue
        in_session = (proc.sid in ranks and later(proc.start, ranks[proc.sid])
                      and (proc.sid not in table or is_rank(proc.sid)))
        if in_session or pid in below:
            found[pid] = proc.start
    return found


def kill_leftovers(pool_dir: str, also: dict[int, str] | None = None) -> list[int]:
    """SIGKILL what the ranks of ``pool_dir``'s pool started: every process that carries its
    marker or runs in the session of one of its ranks (see :func:`started_by`), and the
    processes of ``also`` (pid: start time, found earlier) that still run; their pids."""
    doomed = dict(started_by(ranks_of(pool_dir)))
    doomed.update({pid: start for pid, start in (also or {}).items()
                   if _start_time(pid) == start})
    doomed.update({pid: "" for pid in marked(pool_dir)})
    pids = sorted(pid for pid in doomed if pid != os.getpid())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids
