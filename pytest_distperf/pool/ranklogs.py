"""What the ranks print: each rank's output goes to a log file in the pool's folder, and the
controller forwards it to the test's captured output, bounded in memory and on disk.

- A call's output is read from the end: at most :data:`FORWARD_BYTES` per rank per call are
  read and forwarded (``[rank 1] ...`` lines); what is left out is said, in bytes.
- After each call the log is emptied (the rank writes with ``O_APPEND``, so it goes on at
  the new end), so logs never grow from one call to the next.
- While a call runs, a log past :data:`CAP_BYTES` is emptied at once (:meth:`RankLogs.trim`,
  about once a second): a print flood costs at most that much disk, and the last lines
  survive.
- torch.profiler's own notices (Kineto's ``USDT:``/``STAGE:``/``INFO:`` lines, printed from
  C++ on every profiled call, :data:`KINETO_NOTICE`) are left out of what is forwarded and
  shown: they are not the user's output.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys

#: Bytes of one rank's output read and forwarded per call (the end of it).
FORWARD_BYTES = 1 << 20
#: A rank's log is emptied during a call once it is this large.
CAP_BYTES = 16 << 20
#: Bytes of each rank's output shown in a failure.
TAIL_BYTES = 4000
#: A notice Kineto prints at every start and stop of torch.profiler, whatever
#: KINETO_LOG_LEVEL says (``USDT:2026-11-26 23:12:04 7341:7341
#: SyncActivityProfilerHandler.cpp:52] profiler_start``); its warnings and errors are kept.
KINETO_NOTICE = re.compile(r"(?:USDT|STAGE|INFO):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
                           r"\d+:\d+ \S+\.cpp:\d+\] ")


class RankLogs:
    """The log files of one pool's ranks, and how much of each was left out."""

    def __init__(self, folder: str, world_size: int) -> None:
        self.folder = folder
        self._dropped = [0] * world_size

    def path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.log")

    def trim(self, ranks: list[int]) -> None:
        """Empty the logs that passed :data:`CAP_BYTES` (a flood in a call still running)."""
        for rank in ranks:
            with contextlib.suppress(OSError):
                size = os.path.getsize(self.path(rank))
                if size > CAP_BYTES:
                    os.truncate(self.path(rank), 0)
                    self._dropped[rank] += size

    def take(self, ranks: list[int]) -> str:
        """Forward what ``ranks`` printed since the last call to this process's stdout (the
        test's captured output), empty their logs, and return the end of each rank's output
        for a failure report."""
        shown: list[str] = []
        for rank in ranks:
            try:
                data, dropped = self._read_end(rank)
            except OSError:
                continue
            text = "".join(line for line in data.decode("utf-8", "replace").splitlines(True)
                           if not KINETO_NOTICE.match(line))
            if not text and not dropped:
                continue
            lines = [f"[rank {rank}] {line}\n" for line in text.splitlines()]
            if dropped:
                note = (f"[rank {rank}] ... {dropped} bytes of this rank's output left out "
                        f"(distperf keeps the last {FORWARD_BYTES >> 20} MiB of a call) ...\n")
                lines.insert(0, note)
            sys.stdout.write("".join(lines))
            shown.append(f"output of rank {rank}:\n{text[-TAIL_BYTES:]}")
        return "\n".join(shown)

    def _read_end(self, rank: int) -> tuple[bytes, int]:
        """The last :data:`FORWARD_BYTES` of the log and how many bytes were left out; the
        log is emptied.  A rank that printed nothing costs one ``stat`` (every call runs
        this)."""
        path = self.path(rank)
        dropped, self._dropped[rank] = self._dropped[rank], 0
        if os.path.getsize(path) == 0:
            return b"", dropped
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - FORWARD_BYTES)
            f.seek(start)
            data = f.read(size - start)
        os.truncate(path, 0)
        dropped += start
        if start:  # cut at a line's start, so no line is shown half
            cut = data.find(b"\n")
            if 0 <= cut < len(data) - 1:
                dropped += cut + 1
                data = data[cut + 1:]
        return data, dropped
