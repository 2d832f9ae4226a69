"""What a rank pool leaves on the machine, and how it is cleared: its folder, and the processes
the ranks' code started.

A pool lives in a folder ``distperf-pool-*`` in the temporary directory (rank logs, stack
dumps) with a file ``owner`` naming the controller (pid and start time).  Every rank process,
and so every process that a rank's code starts, carries ``DISTPERF_POOL=<that folder>`` in
its environment.  That marker is how the processes a test started on a rank are found and
killed when the pool closes, even those that left the rank's process group.  A controller
killed with ``SIGKILL`` cannot clear anything: its ranks die with it (``PR_SET_PDEATHSIG``),
and the next pool started on the machine removes the folder and kills what still carries its
marker.

Linux reads processes through ``/proc``; elsewhere only the folders are cleared.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path

#: The prefix of every pool folder in the temporary directory.
POOL_PREFIX = "distperf-pool-"
#: The environment variable that marks the rank processes of a pool, and their children.
MARKER = "DISTPERF_POOL"
#: A folder without an owner file (an older version's, or one whose start was cut short) is
#: cleared once it is this old.
ORPHAN_AGE_S = 3600.0


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where unknown): with the pid,
    it names one process even after the pid is reused."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


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
            kill_marked(str(folder))
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


def kill_marked(pool_dir: str) -> list[int]:
    """SIGKILL every process that carries ``pool_dir``'s marker; their pids."""
    pids = [pid for pid in marked(pool_dir) if pid != os.getpid()]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return pids
