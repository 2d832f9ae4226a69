"""The loop inside one rank process: receive a command, run it, send back the result.

Started by :mod:`pytest_distperf.pool.launcher`: a fork of the fork server, which imported
torch (this module imports it only inside functions); :func:`main` sets the controller's
environment and the thread limits first.  Knows nothing of pytest.

Protocol (cloudpickled tuples over a duplex pipe):
  controller -> rank: ("call", call_id, payload, group_size, label, sys_path | None)
                      ("groups", call_id, ((rank, ...), ...))
                      ("stop",)
  rank -> controller: ("ready", info) once after init
                      ("ok", call_id, result) | ("err", call_id, summary, traceback_text)
                      ("err", call_id, summary, "", "fatal") when the code it ran destroyed
                      the process group: the rank then ends
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import os
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator
from typing import Any

import cloudpickle

from pytest_distperf.rank.clock import use_device
from pytest_distperf.rank.gpu import gpu_facts
from pytest_distperf.rank.memory import (
    forget_model,
    is_out_of_memory,
    out_of_memory,
    release_cached,
)
from pytest_distperf.rank.phase import attach, set_phase

#: The environment variable that marks a pool's rank processes and their children
#: (:mod:`pytest_distperf.pool.leftovers` finds them by it).
POOL_MARKER = "DISTPERF_POOL"


def _die_with_parent() -> None:
    """Make sure this rank never outlives its parent (the controller's fork server, which
    ends with the controller), however it ends."""
    parent_pid = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:  # fallback where there is no parent-death signal
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="distperf-parent-watch", daemon=True).start()


@contextlib.contextmanager
def as_default_group(group: Any) -> Iterator[None]:
    """Make ``group`` torch.distributed's default group for the duration of a call.

    So that ``fn`` written for "the group" (``dist.get_world_size()``, collectives without a
    ``group=`` argument, DDP with no process group) runs on the first k ranks of the pool.
    The subgroup holds ranks 0..k-1, so global and group ranks coincide.
    """
    if group is None:
        yield
        return
    from torch.distributed import distributed_c10d as c10d

    previous = c10d._world.default_pg
    c10d._world.default_pg = group
    try:
        yield
    finally:
        if c10d._world.default_pg is group:  # None after a dist.destroy_process_group()
            c10d._world.default_pg = previous


def main(
    rank: int,
    world_size: int,
    backend: str,
    store_port: int,
    conn: Any,
    phase_buffer: Any,
    stack_file: str,
    log_file: str,
    device_index: int | None,
    threads: int,
    timeout_s: float,
    environ: dict[str, str],
    cores: tuple[int, ...] = (),
) -> None:
    """The rank process: guard, join the group, serve the controller's calls until told to
    stop (or the controller goes away)."""
    attach(phase_buffer)
    _die_with_parent()
    os.environ.clear()  # the controller's variables now, not the fork server's
    os.environ.update(environ)
    # Processes this rank's code starts inherit the marker and stay in this rank's session:
    # the controller finds them so, and kills them with the pool
    # (pytest_distperf/pool/leftovers.py).
    with contextlib.suppress(OSError):
        os.setsid()
    os.environ[POOL_MARKER] = os.path.dirname(log_file)
    # What a rank prints goes to its own log; the controller forwards it to the test's output.
    log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    # every profile a rank runs is one cycle: torch's warning about cycles is noise here
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
    stacks = open(stack_file, "w")  # noqa: SIM115 - stays open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    cores_here = len(host_cores())
    bound = _bind(cores)
    _join(rank, world_size, backend, store_port, device_index, threads, timeout_s)
    info = describe(rank, backend, device_index)
    info.update(cores=cores_here, bound_cores=bound)
    conn.send_bytes(cloudpickle.dumps(("ready", info)))
    set_phase("idle")
    _serve(conn, rank, world_size)


def _bind(cores: tuple[int, ...]) -> int:
    """Bind this process (and the threads torch starts later) to ``cores``; how many it is
    bound to (0: not bound, where none are given or the system refuses)."""
    if not cores:
        return 0
    try:
        os.sched_setaffinity(0, cores)
    except (AttributeError, OSError, ValueError) as exc:
        print(f"distperf: rank not bound to cores {list(cores)}: {exc}", flush=True)
        return 0
    return len(cores)


def _join(rank: int, world_size: int, backend: str, store_port: int,
          device_index: int | None, threads: int, timeout_s: float) -> None:
    """Limit the threads, import torch, and join the process group through the controller's
    store (a client of the TCPStore the controller bound to 127.0.0.1)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    set_phase("importing torch")
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(max(1, threads))

    set_phase("joining the rendezvous")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", store_port, is_master=False, timeout=timeout)
    kwargs: dict[str, Any] = {}
    if device_index is not None:  # NCCL ranks, and gloo ranks on GPUs
        use_device(device_index)
    if backend == "nccl":
        assert device_index is not None
        kwargs["device_id"] = torch.device("cuda", device_index)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timeout, **kwargs
    )


def _serve(conn: Any, rank: int, world_size: int) -> None:
    """The command loop (see the protocol in the module's docstring)."""
    import torch.distributed as dist

    while True:
        try:
            message = cloudpickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            break
        kind = message[0]
        if kind == "stop":
            break
        if kind == "groups":
            _, call_id, wanted = message
            set_phase(f"creating the process groups {', '.join(map(str, wanted))}")
            reply = _guarded(call_id, functools.partial(make_groups, wanted))
        else:
            _, call_id, payload, size, label, sys_path = message
            if sys_path is not None:
                sys.path[:] = sys_path
            set_phase(label)
            reply = _guarded(call_id, functools.partial(_call, payload, size, world_size))
            gone = destroyed(rank, "the ranks are restarted for the next test")
            if gone:
                # This rank can serve no more calls.  Say so, and end: the controller starts
                # a new pool for the next call.
                _send(conn, ("err", call_id, gone, "", FATAL), rank)
                break
        set_phase("idle")
        _send(conn, reply, rank)

    with contextlib.suppress(Exception):
        dist.destroy_process_group()


#: The last element of an error reply after which the rank ends (its group is gone).
FATAL = "fatal"
#: What a rank says when the code it ran destroyed the process group.
DESTROYED = ("RuntimeError: the process group was destroyed on rank {rank} "
             "(dist.destroy_process_group() in "
             "the code this test ran, such as a DDP example's cleanup()?): distperf owns the "
             "group, so leave that call out of code run through it; {then}")


def destroyed(rank: int, then: str) -> str:
    """What this rank says when the code it ran called ``dist.destroy_process_group()``
    (the cleanup() of many DDP examples), ending with ``then`` (what happens next); '' while
    the group lives."""
    import torch.distributed as dist

    return "" if dist.is_initialized() else DESTROYED.format(rank=rank, then=then)


def _send(conn: Any, reply: tuple[Any, ...], rank: int) -> None:
    """Flush this rank's output, then send ``reply`` (an error when it cannot be pickled)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        data = cloudpickle.dumps(reply)
    except Exception as exc:  # the result could not be pickled
        data = cloudpickle.dumps(
            ("err", reply[1], f"the result of rank {rank} cannot be sent back: {exc!r}",
             traceback.format_exc())
        )
    conn.send_bytes(data)


#: The process groups this rank took part in making, by their ranks: the first k ranks a
#: test runs on, and the rows of its meshes (:func:`make_groups`).
GROUPS: dict[tuple[int, ...], Any] = {}


def _call(payload: bytes, size: int, world_size: int) -> Any:
    fn, args, kwargs = cloudpickle.loads(payload)
    return run_here(fn, args, kwargs, GROUPS[tuple(range(size))] if size < world_size else None)


def make_groups(wanted: Any) -> None:
    """Make each group of ``wanted`` (rank tuples) not made yet, in its order, on every rank
    of the world: torch names a group by how many its rank made before, so every rank must
    make the same groups in the same order, members or not, from the same count (code a test
    ran on some ranks may have made groups there: the ranks agree on the highest count)."""
    import torch
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from pytest_distperf.rank.clock import rank_device

    todo = [tuple(ranks) for ranks in wanted if tuple(ranks) not in GROUPS]
    if not todo:
        return
    count = torch.tensor([c10d._world.group_count], device=rank_device())
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    c10d._world.group_count = int(count.item())
    for ranks in todo:
        GROUPS[ranks] = dist.new_group(list(ranks))


def run_here(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], group: Any) -> Any:
    """Run a call's function in this process (a pool's rank, or a torchrun rank): with
    ``group`` as the default group, and this process's state put back afterwards."""
    forget_model()
    with as_default_group(group), process_state_kept():
        return fn(*args, **kwargs)


@contextlib.contextmanager
def process_state_kept() -> Iterator[None]:
    """Put back what a call changed in this rank process that later calls would inherit:
    the working directory, the environment and torch's intra-op thread count (which
    silently changes every later measurement)."""
    import torch

    cwd, environ, threads = os.getcwd(), dict(os.environ), torch.get_num_threads()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        if os.environ != environ:
            os.environ.clear()
            os.environ.update(environ)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _guarded(call_id: int, thunk: Any) -> tuple[Any, ...]:
    try:
        return ("ok", call_id, thunk())
    except BaseException as exc:  # everything goes back to the controller
        reply = ("err", call_id, summary(exc), _user_traceback(exc))
        freed = is_out_of_memory(exc)
    if freed:  # what the failed call held is garbage now that its traceback is gone
        release_cached()
    return reply


def summary(exc: BaseException) -> str:
    """The first line of a failed call's report: an out-of-memory error's cause
    (:func:`~pytest_distperf.rank.memory.out_of_memory`), else the error's type and message."""
    return out_of_memory(exc) or f"{type(exc).__name__}: {exc}"


def _user_traceback(exc: BaseException) -> str:
    """The traceback without this module's own frames (they say nothing about the test)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def describe(rank: int, backend: str, device_index: int | None) -> dict[str, Any]:
    """This rank's facts: versions, threads, device (``device_index``: its CUDA device, -1 on
    CPU), and the node it runs on (``node_rank``: torchrun's ``GROUP_RANK``, else Slurm's
    ``SLURM_NODEID``, else -1; and ``hostname``)."""
    import platform
    import socket

    import torch

    node_rank = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID") or ""
    info: dict[str, Any] = {
        "rank": rank,
        "hostname": socket.gethostname(),
        "node_rank": int(node_rank) if node_rank.isdigit() else -1,
        "pid": os.getpid(),
        "torch_version": str(torch.__version__),  # a str subclass: plain str travels
        "threads": torch.get_num_threads(),
        "cores": len(host_cores()),
        "bound_cores": 0,
        "nccl_version": "",
        "device_model": _cpu_model() or platform.processor() or platform.machine(),
        "device_memory_bytes": 0,  # a GPU's memory; 0 on CPU ranks, which share the host's
        "device_index": -1 if device_index is None else device_index,
    }
    if device_index is not None:
        info["device_model"] = torch.cuda.get_device_name(device_index)
        info["device_memory_bytes"] = int(
            torch.cuda.get_device_properties(device_index).total_memory)
        info.update(gpu_facts(device_index))  # the driver, the CUDA runtime, the NVLinks
    if backend == "nccl":
        with contextlib.suppress(Exception):
            info["nccl_version"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    return info


def host_cores() -> list[int]:
    """The CPU cores this process may run on (its affinity; all of them where unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return list(range(os.cpu_count() or 1))


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return ""
