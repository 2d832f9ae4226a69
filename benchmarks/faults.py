"""How long each fault of the fault suite takes to report, how long the pool takes to serve
again, and what is left behind: the figures of docs/reliability.md's table.

For every fault of ``tests/fault_cases.py`` on a warm 2-rank gloo pool:

* ``reported after``: from the call to the error in the controller (for hangs: the call
  timeout, 6 s, plus the grace and the stack dump);
* ``next call after``: the next call (an all-reduce), including the respawn when the pool was
  killed;
* ``left behind``: rank processes of the faulty pool still running, processes its ranks
  started still running, and whether its folder is still there (all three must be none).

Then the controller faults: pytest (2 ranks, a test whose ranks started a process of their
own) sent SIGINT, SIGTERM or SIGKILL: how long until it exited, and what was left behind
(for SIGKILL, after the next pool start cleared it).

    python benchmarks/faults.py            # about 2 minutes on 2 cores

Prints a Markdown table; the latest one is in benchmarks/faults.md.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from fault_cases import FAULTS, HELD_TEST, alive, starts_a_process, wait_gone  # noqa: E402

from pytest_distperf import leftovers  # noqa: E402
from pytest_distperf.launcher import RankError, RankPool  # noqa: E402


def all_reduce_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return float(t.item())


def left_behind(pids: list[int], started: list[int], folder: str) -> str:
    parts = []
    ranks = wait_gone(pids, timeout=10)
    children = wait_gone(started, timeout=10)
    if ranks:
        parts.append(f"{len(ranks)} rank(s)")
    if children:
        parts.append(f"{len(children)} started process(es)")
    if os.path.exists(folder):
        parts.append("the pool folder")
    return ", ".join(parts) or "none"


def rank_faults() -> list[tuple[str, str, str, str, str]]:
    rows = []
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    for fault in FAULTS:
        if not pool.alive:
            pool.start()
        started = pool.execute(starts_a_process, (), {}, 2, "run(starts_a_process)")
        pids, folder = pool.pids(), pool.folder or ""
        t0 = time.perf_counter()
        try:
            pool.execute(fault.fn, (), {}, 2, f"run({fault.fn.__name__})",
                         timeout_s=fault.timeout_s)
            seen = "no error (WRONG)"
        except RankError as exc:
            seen = type(exc).__name__
        reported = time.perf_counter() - t0
        t1 = time.perf_counter()
        pool.execute(all_reduce_sum, (), {}, 2, "run(all_reduce_sum)")
        recovered = time.perf_counter() - t1
        if fault.respawn:
            leftover = left_behind(pids, started, folder)
        else:  # the pool is kept: its ranks and what they started live on, as they should
            leftover = "(pool kept)"
            for pid in started:
                os.kill(pid, signal.SIGKILL)
        rows.append((fault.name, seen, f"{reported:.1f} s", f"{recovered:.1f} s", leftover))
        print(f"  {fault.name}: {seen} after {reported:.1f} s, next call {recovered:.1f} s, "
              f"left behind: {leftover}", file=sys.stderr)
    pool.close()
    return rows


def controller_fault(how: str) -> tuple[str, str, str, str, str]:
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
        leftover = left_behind(info["ranks"], info["started"], info["folder"])
        assert not any(alive(p) for p in info["ranks"])
        return (f"pytest is sent {how}", f"exit status {code}", f"{ended:.1f} s", "-",
                leftover + (" (after the next pool start)" if how == "SIGKILL" else ""))


def main() -> None:
    rows = rank_faults()
    rows += [controller_fault(how) for how in ("SIGINT", "SIGTERM", "SIGKILL")]
    print("| fault | the user sees | reported after | next call after | left behind |")
    print("|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
