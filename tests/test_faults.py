"""The fault suite: what ranks, test code and CI runners do to the pool, on real gloo ranks.

Each fault is bounded in time (call timeouts of a few seconds, subprocess deadlines), and
each test checks what the user sees, that the pool recovers, and that nothing is left behind
(rank processes, processes the ranks started, the pool's folder).  The recovery times are
measured by benchmarks/faults.py and written down in docs/reliability.md.
"""

from __future__ import annotations

import multiprocessing.context
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_cases import (
    CUDA_OOM,
    FAULTS,
    Fault,
    alive,
    floods,
    start_held_run,
    starts_a_hidden_process,
    starts_a_process,
    stop_held_run,
    wait_gone,
)

from pytest_distperf.pool import leftovers
from pytest_distperf.pool.launcher import RankError, RankPool
from pytest_distperf.pool.ranklogs import CAP_BYTES, FORWARD_BYTES
from pytest_distperf.rank import memory
from pytest_distperf.session import SIGTERM_STATUS


def all_reduce_sum() -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return float(t.item())


#: The call timeout of the hang faults here (the benchmark's is HANG_TIMEOUT_S): the calls
#: they hang in take milliseconds.
QUICK_HANG_S = 3.0


def call(pool: RankPool, fn: Any, timeout_s: float = 60.0) -> list[Any]:
    return pool.execute(fn, (), {}, pool.world_size, f"run({fn.__name__})", timeout_s=timeout_s)


@pytest.fixture(scope="module")
def pool() -> Iterator[RankPool]:
    pool = RankPool(2, "gloo", timeout_s=60)
    pool.start()
    yield pool
    folder = pool.folder
    pool.close()
    assert folder is not None and not os.path.exists(folder)


@pytest.mark.parametrize("fault", FAULTS, ids=[f.fn.__name__ for f in FAULTS])
def test_fault(pool: RankPool, fault: Fault) -> None:
    if not pool.alive:
        pool.start()
    pids, folder = pool.pids(), pool.folder
    assert folder is not None
    with pytest.raises(RankError) as info:  # a hang here is over after 3 s, not 6
        call(pool, fault.fn, min(fault.timeout_s, QUICK_HANG_S))
    assert type(info.value).__name__ == fault.error
    assert re.search(fault.says, str(info.value)), str(info.value)
    if fault.respawn:
        assert "the rank pool was killed; the next call starts a fresh one" in str(info.value)
        assert not pool.alive
        assert wait_gone(pids) == []
        assert not os.path.exists(folder)
        assert leftovers.marked(folder) == []
    else:
        assert pool.pids() == pids
    assert call(pool, all_reduce_sum) == [3.0, 3.0]  # the next call works
    assert (pool.pids() == pids) is not fault.respawn


#: Tests that run out of memory on every rank, in a run() call and in the step timer's
#: model_fn, batch_fn and loss; then a test that must run on the same ranks.
OUT_OF_MEMORY_TESTS = r'''
import os
import pytest
import torch
import torch.distributed as dist
from fault_cases import runs_out_of_memory

PIDS = []

def model():
    return torch.nn.Linear(32, 32)  # 4224 bytes of parameters

def batch(rank):
    return torch.randn(8, 32)

def test_run(nccl_group):
    PIDS.extend(nccl_group.run(os.getpid))
    nccl_group.run(runs_out_of_memory)

def test_model_fn(ddp_step_timer):
    ddp_step_timer(runs_out_of_memory, batch, steps=1, warmup=1)

def test_batch_fn(ddp_step_timer):
    ddp_step_timer(model, runs_out_of_memory, steps=1, warmup=1)

def test_loss(ddp_step_timer):
    ddp_step_timer(model, batch, loss_fn=runs_out_of_memory, steps=1, warmup=1)

@pytest.mark.distperf(max_comm_overhead=10, max_imbalance=10)  # a tiny model on shared cores
def test_the_next_test(nccl_group, ddp_step_timer):
    assert nccl_group.run(os.getpid) == PIDS
    t = torch.ones(1)
    assert nccl_group.run(lambda: dist.all_reduce(t) or t.item()) == [2.0, 2.0]
    ddp_step_timer(model, batch, steps=1, warmup=1, count_collectives=False)
'''

#: The start of every failure: the cause, on whichever rank the controller heard first.
OOM_CAUSE = (r"rank [01] raised OutOfMemoryError on cpu: asked for 2\.00 GiB; free and peak "
             r"memory unknown \(torch counts them on CUDA devices only\)")
OOM_ADVICE = r"\. Make the batch or the model smaller, or shard the model over the ranks \(FSDP\)$"


def test_out_of_memory_fails_its_test_cause_first(pytester: pytest.Pytester) -> None:
    """Each test that runs out of memory fails with the cause first (the model's parameters
    where the step timer built the model), and the next test runs on the same ranks."""
    pytester.makepyfile(test_oom=OUT_OF_MEMORY_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", "--gpus", "2")
    result.assert_outcomes(passed=1, failed=4)
    text = result.stdout.str()
    model = "; the model's parameters take 4.12 KiB"
    for test, known in (("test_run", ""), ("test_model_fn", ""), ("test_batch_fn", model),
                        ("test_loss", model)):
        failure = text.split(f"_ {test} _")[1]
        first = next(line for line in failure.splitlines() if "RankError: " in line)
        cause = first.split("RankError: ", 1)[1]
        assert re.fullmatch(OOM_CAUSE + re.escape(known) + OOM_ADVICE, cause), first
        assert f"OutOfMemoryError: {CUDA_OOM}" in failure  # torch's words, in the traceback
    assert "1 passed" in text.splitlines()[-1]


@pytest.mark.parametrize(("message", "asked"), [
    (CUDA_OOM, "2.00 GiB"),
    ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 3 has ...", "20.00 MiB"),
    ("CUDA out of memory. Tried to allocate 512 bytes.", "512 bytes"),
    ("XPU out of memory.", "an amount torch did not say"),
])
def test_out_of_memory_says_what_was_asked(message: str, asked: str) -> None:
    import torch

    memory.forget_model()
    said = memory.out_of_memory(torch.OutOfMemoryError(message))
    assert said.startswith(f"OutOfMemoryError on cpu: asked for {asked}; "), said
    assert "parameters" not in said


def test_out_of_memory_names_the_models_parameters() -> None:
    import torch

    memory.note_model(torch.nn.Linear(1024, 1024, dtype=torch.float16))
    try:
        said = memory.out_of_memory(torch.OutOfMemoryError(CUDA_OOM))
    finally:
        memory.forget_model()
    assert "; the model's parameters take 2.00 MiB. Make" in said, said


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: an illegal memory access"),
                                   MemoryError(), KeyError("out of memory")])
def test_other_errors_are_not_out_of_memory(error: BaseException) -> None:
    assert memory.out_of_memory(error) == ""


def test_a_fresh_pool_takes_the_variables_set_since_the_last(
        pool: RankPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks are forks of a server started with the first pool: each new rank still
    gets the controller's environment of the moment."""
    monkeypatch.setenv("DISTPERF_PROBE", "set after the first pool")
    pool.close()
    pool.start()
    assert call(pool, lambda: os.environ.get("DISTPERF_PROBE")) == [
        "set after the first pool"] * 2


def test_the_fork_servers_imports_leave_cuda_alone() -> None:
    """A process that has touched CUDA cannot fork ranks that use it ("Cannot re-initialize
    CUDA in forked subprocess"): what the server imports must not ask CUDA anything."""
    script = (
        "import importlib, torch, torch.cuda\n"
        "def refuse(*a, **k): raise RuntimeError('CUDA touched while importing')\n"
        "for name in ('is_available', 'device_count', 'init', '_lazy_init', "
        "'current_device'):\n"
        "    setattr(torch.cuda, name, refuse)\n"
        "from pytest_distperf.pool.launcher import PRELOAD\n"
        "for module in PRELOAD: importlib.import_module(module)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]


def test_processes_started_by_a_rank_end_with_the_pool() -> None:
    pool = RankPool(2, "gloo", timeout_s=60)
    try:
        # in a session of their own (found by the marker), with an environment of their own
        # (found in the rank's session), and both (found below the rank)
        started = call(pool, starts_a_process) + call(pool, starts_a_hidden_process)
        started += pool.execute(starts_a_hidden_process, (True,), {}, 2, "run(both)")
        folder = pool.folder
        assert all(alive(p) for p in started)
    finally:
        pool.close()
    assert wait_gone(started) == []
    assert folder is not None and not os.path.exists(folder)


def test_a_print_flood_is_capped_in_memory_and_on_disk(
        pool: RankPool, capsys: pytest.CaptureFixture[str]) -> None:
    megabytes = 100

    def flood_on_one() -> int:
        import torch.distributed as dist

        return floods(megabytes) if dist.get_rank() == 1 else 0

    tracemalloc.start()
    try:
        sizes = pool.execute(flood_on_one, (), {}, 2, "run(flood_on_one)")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sizes[1] <= CAP_BYTES  # the controller emptied the log while the rank flooded
    # the controller read only the end of the flood: 100 MB in would show as >= 100 MB here
    assert peak < 8 * FORWARD_BYTES, f"the controller peaked at {peak / 2**20:.0f} MiB"
    out = capsys.readouterr().out
    assert re.search(r"\[rank 1\] \.\.\. \d+ bytes of this rank's output left out", out)
    assert "[rank 1] the last line of the flood" in out
    assert os.path.getsize(os.path.join(pool.folder or "", "rank1.log")) == 0


class Interrupted(Exception):
    pass


def sleeps() -> str:
    time.sleep(30)
    return "slept"


def test_a_call_interrupted_in_the_controller(pool: RankPool) -> None:
    """A signal handler that raises (pytest-timeout's signal method does) leaves the ranks
    busy: the pool is killed, so the next call is not stuck behind them."""
    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted("timeout")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(Interrupted) as info:
            call(pool, sleeps)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert any("run(sleeps) was interrupted in the controller" in note
               for note in getattr(info.value, "__notes__", []))
    # Without the fix this call would wait for run(sleeps) and time out (10 s).
    assert call(pool, all_reduce_sum, timeout_s=10) == [3.0, 3.0]


def test_a_pool_started_from_a_thread_outlives_the_thread() -> None:
    pool = RankPool(2, "gloo", timeout_s=60)
    try:
        starter = threading.Thread(target=pool.start)
        starter.start()
        starter.join()
        pids = pool.pids()
        time.sleep(0.5)  # PR_SET_PDEATHSIG would have killed the ranks when the thread ended
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "died between calls" would be an error here
            assert call(pool, all_reduce_sum) == [3.0, 3.0]
        assert pool.pids() == pids
    finally:
        pool.close()


def _kill_rank_1(pool: RankPool) -> None:
    if not pool.alive:
        pool.start()
    os.kill(pool.pids()[1], signal.SIGKILL)
    deadline = time.monotonic() + 30  # until the pool can see it (all its threads ended)
    while pool.alive and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_pool_that_died_between_calls_is_said(pool: RankPool) -> None:
    _kill_rank_1(pool)
    with pytest.warns(RuntimeWarning, match=r"rank 1 \(exit code -9\) of the pool died "
                                            r"between calls; a fresh pool is started"):
        assert call(pool, all_reduce_sum) == [3.0, 3.0]


def test_a_rank_that_died_before_the_rank_info_is_said(pool: RankPool) -> None:
    """A test's fixture asks for the rank info first: the death is said there, once."""
    _kill_rank_1(pool)
    with pytest.warns(RuntimeWarning, match=r"rank 1 \(exit code -9\) of the pool died "
                                            r"between calls; a fresh pool is started for "
                                            r"the rank info"):
        assert len(pool.rank_info()) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert call(pool, all_reduce_sum) == [3.0, 3.0]


def test_a_rank_that_never_joins(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[int] = []
    original = multiprocessing.context.SpawnProcess.start

    def start_then_stop(self: Any) -> None:  # rank 1 freezes before it runs any Python
        original(self)
        if self.name == "distperf-rank1":
            os.kill(self.pid, signal.SIGSTOP)
            stopped.append(self.pid)

    monkeypatch.setattr(multiprocessing.context.ForkServerProcess, "start", start_then_stop)
    # rank 0 is joining within milliseconds of its fork: 3 s are plenty, under load too
    pool = RankPool(2, "gloo", timeout_s=60, startup_timeout_s=3)
    with pytest.raises(RankError) as info:
        pool.start()
    text = str(info.value)
    assert text.startswith("the rank pool failed to start")
    assert "rank 1 was busy with: starting the process" in text
    assert "its process is stopped, by SIGSTOP or a debugger: no Python stack" in text
    assert "rank 0 was busy with: joining the rendezvous" in text
    assert not pool.alive and pool.folder is None
    assert wait_gone(stopped) == []


def test_stale_pool_folders_are_cleared(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = tmp_path / f"{leftovers.POOL_PREFIX}stale"
    stale.mkdir()
    (stale / "owner").write_text(f"{gone.pid} 1\n")
    (stale / "rank0.log").write_bytes(b"x" * 1000)
    live = tmp_path / f"{leftovers.POOL_PREFIX}live"
    live.mkdir()
    (live / "owner").write_text(f"{os.getpid()} {leftovers._start_time(os.getpid())}\n")
    other = tmp_path / "something-else"
    other.mkdir()
    orphan = subprocess.Popen(["sleep", "600"],
                              env=dict(os.environ, **{leftovers.MARKER: str(stale)}))
    try:
        assert leftovers.clear_stale(str(tmp_path)) == [str(stale)]
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()
    assert not stale.exists() and live.exists() and other.exists()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_the_controller_is_signalled(pytester: pytest.Pytester, tmp_path: Path,
                                     how: str) -> None:
    proc, pids = start_held_run(pytester, tmp_path, hold=600)
    ranks, started, folder = pids["ranks"], pids["started"], pids["folder"]
    assert all(alive(p) for p in [*ranks, *started]) and os.path.isdir(folder)
    code, output = stop_held_run(proc, getattr(signal, how))
    assert wait_gone(ranks) == [], output
    if how == "SIGKILL":  # nothing can run in the controller: the next pool clears up
        assert os.path.isdir(folder)
        assert str(Path(folder)) in leftovers.clear_stale(str(Path(folder).parent))
    elif how == "SIGINT":  # Ctrl-C: pytest reports the interruption and stops cleanly
        assert "KeyboardInterrupt" in output
    else:
        assert "distperf: SIGTERM received: the session stops here" in output
        assert code == SIGTERM_STATUS
    assert wait_gone(started) == [], output
    assert not os.path.exists(folder), output
