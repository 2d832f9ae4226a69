"""How long each fault of the fault suite takes to report, how long the pool takes to serve
again, and what is left behind: the figures of docs/reliability.md's table.

For every fault of ``tests/fault_cases.py`` on a warm 2-rank gloo pool, whose ranks first
start two processes each (one in a session of its own, one with ``env={}``):

* ``reported after``: from the call to the error in the controller (for hangs: the call
  timeout, 6 s, plus the grace and the stack dump);
* ``next call after``: the next call (an all-reduce), including the respawn when the pool was
  killed;
* ``left behind``: rank processes of the faulty pool still running, processes its ranks
  started still running, and whether its folder is still there (all three must be none).

Then the faults of the pool itself, as tests/test_faults.py makes them: a rank that never
joins (stopped with SIGSTOP before it runs Python; a 6 s start-up timeout), a call
interrupted in the controller (a SIGALRM handler that raises, 1 s into a 30 s call), a rank
killed between calls, a pool started from a thread that ends, a print flood (100 MB from
rank 1), and processes started by the ranks (in a session of their own, with ``env={}``, and
both) when the pool closes.

Then the controller faults: pytest (2 ranks, a test whose ranks started processes of their
own) sent SIGINT, SIGTERM or SIGKILL: how long until it exited, and what was left behind
(for SIGKILL, after the next pool start cleared it).

    python benchmarks/faults.py            # about 1.5 minutes on 2 idle cores

Prints a Markdown table; the latest one is in benchmarks/faults.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing.context
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from fault_cases import (  # noqa: E402
    FAULTS,
    HELD_TEST,
    alive,
    floods,
    starts_a_hidden_process,
    starts_a_process,
    wait_gone,
)

from pytest_distperf.pool import leftovers  # noqa: E402
from pytest_distperf.pool.launcher import RankError, RankPool  # noqa: E402
from pytest_distperf.pool.ranklogs import CAP_BYTES  # noqa: E402

Row = tuple[str, str, str, str, str]


def all_reduce_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def call(pool: RankPool, fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0) -> Any:
    return pool.execute(fn, args, {}, 2, f"run({fn.__name__})", timeout_s=timeout_s)


def start_processes(pool: RankPool, both: bool = True) -> list[int]:
    """On each rank: a process in a session of its own (found by the marker), one with
    ``env={}`` (found in the rank's session), and, with ``both``, one with both (found below
    the rank, so only while the rank lives: left out where a rank dies)."""
    started = [*call(pool, starts_a_process), *call(pool, starts_a_hidden_process)]
    return started + (call(pool, starts_a_hidden_process, True) if both else [])


def left_behind(pids: list[int], started: list[int], folders: list[str]) -> str:
    parts = []
    ranks = wait_gone(pids, timeout=10)
    children = wait_gone(started, timeout=10)
    if ranks:
        parts.append(f"{len(ranks)} rank(s)")
    if children:
        parts.append(f"{len(children)} started process(es)")
    if any(os.path.exists(folder) for folder in folders):
        parts.append("the pool folder")
    return ", ".join(parts) or "none"


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def report(row: Row) -> Row:
    print(f"  {row[0]}: {row[1]}; reported after {row[2]}, next call after {row[3]}, left "
          f"behind: {row[4]}", file=sys.stderr)
    return row


def rank_faults() -> list[Row]:
    rows = []
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    for fault in FAULTS:
        if not pool.alive:
            pool.start()
        started = start_processes(pool, both=False)
        pids, folder = pool.pids(), pool.folder or ""
        t0 = time.perf_counter()
        try:
            pool.execute(fault.fn, (), {}, 2, f"run({fault.fn.__name__})",
                         timeout_s=fault.timeout_s)
            seen = "no error (WRONG)"
        except RankError as exc:
            seen = type(exc).__name__
        reported = time.perf_counter() - t0
        _, recovered = timed(lambda: call(pool, all_reduce_sum))
        if fault.respawn:
            leftover = left_behind(pids, started, [folder])
        else:  # the pool is kept: its ranks and what they started live on, as they should
            leftover = "(pool kept)"
            for pid in started:
                os.kill(pid, signal.SIGKILL)
        rows.append(report((fault.name, seen, f"{reported:.1f} s", f"{recovered:.1f} s",
                            leftover)))
    pool.close()
    return rows


def never_joins() -> Row:
    """Rank 1 is stopped before it runs any Python; the start-up timeout is 6 s."""
    spawned: list[int] = []
    original = multiprocessing.context.ForkServerProcess.start

    def start_then_stop(self: Any) -> None:
        original(self)
        spawned.append(self.pid)
        if self.name == "distperf-rank1":
            os.kill(self.pid, signal.SIGSTOP)

    before = set(Path(tempfile.gettempdir()).glob(f"{leftovers.POOL_PREFIX}*"))
    pool = RankPool(2, "gloo", timeout_s=60, startup_timeout_s=6)
    multiprocessing.context.ForkServerProcess.start = start_then_stop  # type: ignore[method-assign]
    t0 = time.perf_counter()
    try:
        pool.start()
        seen = "no error (WRONG)"
    except RankError as exc:
        seen = "RankError: " + str(exc).split(":", 1)[0]
    finally:
        multiprocessing.context.ForkServerProcess.start = original  # type: ignore[method-assign]
    reported = time.perf_counter() - t0
    new = set(Path(tempfile.gettempdir()).glob(f"{leftovers.POOL_PREFIX}*")) - before
    _, recovered = timed(lambda: call(pool, all_reduce_sum))
    leftover = left_behind(spawned, [], [str(p) for p in new])
    pool.close()
    return report(("a rank never joins (SIGSTOP, 6 s start-up timeout)", seen,
                   f"{reported:.1f} s", f"{recovered:.1f} s (fresh pool)", leftover))


class Interrupted(Exception):
    pass


def sleeps() -> str:
    time.sleep(30)
    return "slept"


def interrupted() -> Row:
    """A SIGALRM handler raises 1 s into a 30 s call (as pytest-timeout's signal method)."""
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    started = start_processes(pool)
    pids, folder = pool.pids(), pool.folder or ""
    fired: list[float] = []

    def interrupt(signum: int, frame: Any) -> None:
        fired.append(time.perf_counter())
        raise Interrupted("timeout")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        call(pool, sleeps)
        seen = "no error (WRONG)"
    except Interrupted as exc:
        noted = any("was interrupted in the controller" in note
                    for note in getattr(exc, "__notes__", []))
        seen = "the exception, with the note" if noted else "the exception, no note (WRONG)"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    reported = time.perf_counter() - fired[0]
    _, recovered = timed(lambda: call(pool, all_reduce_sum, timeout_s=10))
    leftover = left_behind(pids, started, [folder])
    pool.close()
    return report(("run() interrupted in the controller", seen,
                   f"{reported:.1f} s after the signal", f"{recovered:.1f} s (fresh pool)",
                   leftover))


def died_between_calls() -> Row:
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    started = start_processes(pool, both=False)
    pids, folder = pool.pids(), pool.folder or ""
    os.kill(pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pool.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, recovered = timed(lambda: call(pool, all_reduce_sum))
    said = any("died between calls" in str(w.message) for w in caught)
    seen = "RuntimeWarning" if said else "no warning (WRONG)"
    leftover = left_behind(pids, started, [folder])
    pool.close()
    return report(("a rank dies between calls (SIGKILL)", seen, "at the next call",
                   f"{recovered:.1f} s (fresh pool)", leftover))


def started_from_a_thread() -> Row:
    pool = RankPool(2, "gloo", timeout_s=60)
    starter = threading.Thread(target=pool.start)
    starter.start()
    starter.join()
    pids, folder = pool.pids(), pool.folder or ""
    time.sleep(0.5)  # PR_SET_PDEATHSIG would kill the ranks when the thread ended
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, first = timed(lambda: call(pool, all_reduce_sum))
    kept = pool.pids() == pids and not any("died between calls" in str(w.message)
                                           for w in caught)
    pool.close()
    leftover = left_behind(pids, [], [folder])
    return report(("a pool started from a thread that ends",
                   "nothing (the ranks live on)" if kept else "a fresh pool (WRONG)", "-",
                   f"{first:.2f} s (pool kept)", leftover))


def print_flood(megabytes: int = 100) -> Row:
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()

    def flood_on_one() -> int:
        import torch.distributed as dist

        return floods(megabytes) if dist.get_rank() == 1 else 0

    out = io.StringIO()
    tracemalloc.start()
    try:
        with contextlib.redirect_stdout(out):
            _, took = timed(lambda: pool.execute(flood_on_one, (), {}, 2,
                                                       "run(flood_on_one)"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = out.getvalue()
    log = os.path.getsize(os.path.join(pool.folder or "", "rank1.log"))
    _, recovered = timed(lambda: call(pool, all_reduce_sum))
    left_out = "bytes of this rank's output left out" in text
    seen = (f"{len(text) / 1024:.1f} KiB of output" + (", '... N bytes ... left out'"
                                                       if left_out else " (WRONG)"))
    pids, folder = pool.pids(), pool.folder or ""
    pool.close()
    leftover = left_behind(pids, [], [folder])
    return report((f"a print flood ({megabytes} MB from rank 1)", seen,
                   f"{took:.1f} s (the call)", f"{recovered:.2f} s (pool kept)",
                   f"{leftover}; the log: emptied during the call (past {CAP_BYTES >> 20} MiB), "
                   f"{log} bytes after it; the controller peaked at {peak / 1024:.0f} KiB"))


def started_processes() -> Row:
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    started = start_processes(pool)
    pids, folder = pool.pids(), pool.folder or ""
    running = sum(alive(p) for p in started)
    _, closed = timed(pool.close)
    return report(("processes started by the ranks, at close", "nothing",
                   "-", f"the pool closes in {closed:.1f} s",
                   f"{left_behind(pids, started, [folder])} ({running} started: in a "
                   f"session of their own, with env={{}}, and both)"))


def controller_fault(how: str) -> Row:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "test_hold.py").write_text(HELD_TEST)
        env = dict(os.environ, DISTPERF_TEST_OUT=tmp, DISTPERF_TEST_HOLD="600",
                   PYTHONPATH=os.pathsep.join([str(HERE.parent / "tests"),
                                               os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--distperf", "--gpus",
             "2", "test_hold.py"], cwd=tmp, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (out / "pids.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        info: dict[str, Any] = json.loads((out / "pids.json").read_text())
        t0 = time.perf_counter()
        os.kill(proc.pid, getattr(signal, how))
        code = proc.wait(timeout=60)
        ended = time.perf_counter() - t0
        if how == "SIGKILL":
            leftovers.clear_stale()  # what the next pool start does
        leftover = left_behind(info["ranks"], info["started"], [info["folder"]])
        assert not any(alive(p) for p in info["ranks"])
        return report((f"pytest is sent {how}", f"exit status {code}", f"{ended:.1f} s", "-",
                       leftover + (" (after the next pool start)" if how == "SIGKILL"
                                   else "")))


def main() -> None:
    rows = rank_faults()
    rows += [never_joins(), interrupted(), died_between_calls(), started_from_a_thread(),
             print_flood(), started_processes()]
    rows += [controller_fault(how) for how in ("SIGINT", "SIGTERM", "SIGKILL")]
    print("| fault | the user sees | reported after | next call after | left behind |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
