"""The faults of the fault suite: what a rank (or the code a test runs on it) can do to the
pool, and what the user must see.  Shared by tests/test_faults.py (which asserts it) and
benchmarks/faults.py (which times it for docs/reliability.md).

Each fault runs on rank 1 of a 2-rank gloo pool; rank 0 does what a correct rank would do
(usually wait for rank 1 in a collective), so the fault is seen the way it is in real runs.
Out of memory is the exception: every rank runs out, as a model too large for every GPU does.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

#: Every hang-like fault runs with this call timeout (seconds).
HANG_TIMEOUT_S = 6.0


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def _then_all_reduce(fault: Callable[[], Any]) -> Any:
    """Rank 1 does ``fault``; rank 0 waits for it in an all-reduce."""
    import torch
    import torch.distributed as dist

    if _rank() == 1:
        fault()
    dist.all_reduce(torch.ones(1))
    return "finished"


def raises() -> Any:
    def fault() -> None:
        raise KeyError("only rank one is broken")
    return _then_all_reduce(fault)


def exits() -> Any:
    return _then_all_reduce(lambda: os._exit(3))


def segfaults() -> Any:
    return _then_all_reduce(lambda: ctypes.string_at(0))


def is_killed() -> Any:
    return _then_all_reduce(lambda: os.kill(os.getpid(), signal.SIGKILL))


def skips_a_collective() -> Any:
    """Rank 1 returns without the all-reduce rank 0 waits in: a hang in a collective."""
    import torch
    import torch.distributed as dist

    if _rank() == 0:
        dist.all_reduce(torch.ones(1))
    return "finished"


def hangs_in_python() -> Any:
    return _then_all_reduce(lambda: time.sleep(600))


def destroys_the_group() -> Any:
    import torch.distributed as dist

    dist.destroy_process_group()
    return "cleaned up"


#: How torch's CUDA allocator says that an allocation failed (its first sentences).
CUDA_OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.06 GiB is free.")


def runs_out_of_memory(*_: Any) -> Any:
    """Raise torch's out-of-memory error as a failed CUDA allocation does (a CPU rank cannot
    run out of device memory); any arguments, so it stands in for a model_fn, a batch_fn or
    a loss too."""
    import torch

    raise torch.OutOfMemoryError(CUDA_OOM)


class Unreadable:
    """Pickles on the rank; rebuilding it in the controller raises."""

    def __reduce__(self) -> Any:
        return (_refuse, ())


def _refuse() -> None:
    raise ValueError("not in this process")


def unreadable_result() -> Any:
    return Unreadable()


def unpicklable_result() -> Any:
    import threading

    return threading.Lock()


def starts_a_process() -> int:
    """Starts a process in a session of its own (so not in the rank's process group) and
    leaves it running: the pool must kill it when it closes."""
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return child.pid


def starts_a_hidden_process(new_session: bool = False) -> int:
    """Starts a process with an environment of its own (so without the pool's marker), in
    the rank's session or in one of its own, and leaves it running: the pool must kill it
    when it closes."""
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env={},
                             start_new_session=new_session)
    return child.pid


def floods(megabytes: int) -> int:
    """Prints ``megabytes`` MB, then waits (up to 60 s) for the controller to cap the log;
    the log's size when it did (or after 60 s)."""
    import sys

    line = "x" * 1023 + "\n"
    for _ in range(megabytes * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    from pytest_distperf.pool.ranklogs import CAP_BYTES

    deadline = time.monotonic() + 60
    size = os.fstat(1).st_size
    while size > CAP_BYTES and time.monotonic() < deadline:
        time.sleep(0.1)
        size = os.fstat(1).st_size
    print("the last line of the flood", flush=True)
    return size


@dataclasses.dataclass(frozen=True)
class Fault:
    name: str                # as the reliability table names it
    fn: Callable[[], Any]    # runs on every rank
    error: str               # "RankError", "RankTimeout" or "" (the call succeeds)
    says: str                # a regular expression the error must match (\A: begin with)
    respawn: bool            # the pool must be killed and started afresh
    timeout_s: float = 60.0


FAULTS = [
    Fault("a rank raises", raises, "RankError",
          r"\Arank 1 raised KeyError: 'only rank one is broken'(.|\n)*rank\(s\) 0 did not "
          r"finish after another rank failed", respawn=True),
    Fault("a rank exits (os._exit)", exits, "RankError",
          r"\Arank 1 died \(exit code 3\)", respawn=True),
    Fault("a rank segfaults", segfaults, "RankError",
          r"\Arank 1 died \(exit code -11\)", respawn=True),
    Fault("a rank is killed (SIGKILL)", is_killed, "RankError",
          r"\Arank 1 died \(exit code -9\)", respawn=True),
    Fault("a hang in a collective", skips_a_collective, "RankTimeout",
          r"rank\(s\) 0 did not finish within the timeout.*\n(.|\n)*rank 0 was busy with: "
          r"run\(skips_a_collective\)", respawn=True, timeout_s=HANG_TIMEOUT_S),
    Fault("a hang in Python", hangs_in_python, "RankTimeout",
          r"rank\(s\) 0, 1 did not finish(.|\n)*Python stacks of rank 1(.|\n)*"
          r"in hangs_in_python", respawn=True, timeout_s=HANG_TIMEOUT_S),
    Fault("the code destroys the process group", destroys_the_group, "RankError",
          r"the process group was destroyed on rank 0", respawn=True),
    Fault("every rank runs out of memory", runs_out_of_memory, "RankError",
          r"\Arank [01] raised OutOfMemoryError on cpu: asked for 2\.00 GiB; free and peak "
          r"memory unknown", respawn=False),
    Fault("a result the controller cannot read", unreadable_result, "RankError",
          r"its result could not be unpickled in the controller \(ValueError: not in this",
          respawn=False),
    Fault("a result that cannot be pickled", unpicklable_result, "RankError",
          r"the result of rank 0 cannot be sent back", respawn=False),
]


def wait_gone(pids: list[int], timeout: float = 20.0) -> list[int]:
    """The pids of ``pids`` still running after up to ``timeout`` s (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return "Z" not in line.split(":", 1)[1]
    except OSError:
        return False
    return False


#: A test that reports its pids, its ranks' pool folder and processes its ranks started, then
#: holds the group for DISTPERF_TEST_HOLD seconds: the controller is signalled meanwhile.
HELD_TEST = r'''
import json, os, time
from fault_cases import starts_a_hidden_process, starts_a_process

def test_hold_the_group(nccl_group):
    pids = nccl_group.run(os.getpid)
    started = nccl_group.run(starts_a_process) + nccl_group.run(starts_a_hidden_process)
    folder = nccl_group.run(lambda: os.environ["DISTPERF_POOL"])[0]
    out = os.environ["DISTPERF_TEST_OUT"]
    with open(os.path.join(out, "pids.json.tmp"), "w") as f:
        json.dump({"controller": os.getpid(), "ranks": pids, "started": started,
                   "folder": folder}, f)
    os.replace(os.path.join(out, "pids.json.tmp"), os.path.join(out, "pids.json"))
    time.sleep(float(os.environ.get("DISTPERF_TEST_HOLD", "0")))
'''


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """Start the held run with SIGINT as a terminal's Ctrl-C finds it.  A shell starts
    background jobs with SIGINT ignored (``nohup pytest ... &``), a child inherits an ignored
    signal across exec, and Python then installs no KeyboardInterrupt handler: the SIGINT
    case slept on, three times, when this suite ran in the background.  A handled signal is
    reset to its default in the child."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_held_run(pytester: Any, out: Path, hold: float,
                   gpus: str = "2") -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start pytest on :data:`HELD_TEST`; its process and what the test reported."""
    import json
    import sys

    import pytest
    from quick_runs import NO_DYNAMO  # the held test trains no model

    test_file = pytester.makepyfile(test_hold=HELD_TEST)
    here = str(Path(__file__).parent)
    # PYTHONFAULTHANDLER: a run that hangs prints every thread's stack on SIGABRT
    # (:func:`stop_held_run`)
    env = dict(os.environ, DISTPERF_TEST_OUT=str(out), DISTPERF_TEST_HOLD=str(hold),
               PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
               PYTHONFAULTHANDLER="1")
    with _sigint_not_ignored():
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NO_DYNAMO, "--distperf",
             "--gpus", gpus, str(test_file)],
            cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while not (out / "pids.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            output = proc.stdout.read().decode() if proc.stdout else ""
            pytest.fail(f"the held run did not report its pids:\n{output}")
        time.sleep(0.2)
    return proc, json.loads((out / "pids.json").read_text())


def stop_held_run(proc: subprocess.Popen[bytes], sig: int,
                  timeout_s: float = 60.0) -> tuple[int, str]:
    """Send ``sig`` to a held run and wait for it to end: (its exit code, its output).

    A run that outlives ``timeout_s`` is sent SIGABRT, on which faulthandler prints every
    thread's Python stack, and the test fails with that output: a hang says where it hung."""
    import signal

    import pytest

    os.kill(proc.pid, sig)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(timeout=10)
        finally:
            proc.kill()
            proc.wait()
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        pytest.fail(f"the run did not end within {timeout_s:.0f} s of "
                    f"{signal.Signals(sig).name}; its output and stacks:\n{output[-20000:]}")
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    return code, output
