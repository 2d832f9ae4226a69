"""The rank pool: spawn, rendezvous, command, gather, timeout, respawn.

Two engines with one method, ``execute(fn, args, kwargs, size, label) -> list``:

* :class:`RankPool` starts N rank processes once and keeps them for the session.  They are
  forks of multiprocessing's fork server, which imported torch once: a fresh pool takes a
  fraction of a second, not an import of torch per rank.  Each rank takes the controller's
  environment of the moment it starts.  The rendezvous store listens on a socket the
  controller bound to 127.0.0.1 and hands to ``TCPStore(master_listen_fd=...)``: no
  free-port race, nothing beyond loopback.
  A call that raises on a rank comes back as :class:`RankError` with the rank's traceback; a
  call that outlives its timeout comes back as :class:`RankTimeout` naming the ranks that did
  not finish, what each was doing and their Python stacks; then the pool is killed and the
  next call spawns a fresh one.  :meth:`RankPool.routed_to` sends the calls to another pool
  for a while (fresh ranks to repeat a measurement on), leaving this one as it is.
* :class:`~pytest_distperf.pool.torchrun.TorchrunEngine` uses the group torchrun built: ``fn``
  runs on this rank and the results are gathered with ``all_gather_object``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import shutil
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Iterable, Iterator
from multiprocessing.connection import wait
from typing import Any, NoReturn, Protocol

import cloudpickle

from pytest_distperf.common import procs
from pytest_distperf.pool import leftovers
from pytest_distperf.pool.ranklogs import RankLogs
from pytest_distperf.rank import worker
from pytest_distperf.rank.worker import host_cores

#: After one rank fails, how long the others get to finish before they count as stuck.
ERROR_GRACE_S = 3.0
#: What a rank raises because another rank failed first (gloo and NCCL lose their peer).
SECONDARY_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                    "NCCL communicator was aborted")


def is_secondary(error: str) -> bool:
    """Whether a rank's error reads as the consequence of another rank's failure."""
    first = error.split("\n", 1)[0]
    return any(marker in first for marker in SECONDARY_ERRORS)


#: The call id of a reply that could not be unpickled: it is the reply to the current call
#: (a rank answers one call at a time), not a late one to be dropped.
UNREADABLE = "unreadable reply"
#: What the fork server imports before it forks a rank: torch, and what a training step
#: imports on first use (torch._dynamo: 1.3 s), which fresh ranks would each pay again.
PRELOAD = ["torch", "torch._dynamo", "pytest_distperf.rank.worker"]
#: How often a waiting controller empties rank logs that passed their cap.
LOG_CHECK_S = 1.0


def fork_server() -> Any:
    """The start method of the ranks, its server started now (the server imports torch
    once, in the background while the controller goes on; every rank is a fork of it)."""
    import multiprocessing as mp
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    return ctx


class RankError(Exception):
    """A call failed on one or more ranks.  ``str()`` is the whole report."""

    def __init__(self, message: str, failed_ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks


class RankTimeout(RankError):
    """A call outlived its timeout; ``failed_ranks`` are the ranks that did not finish."""


class Engine(Protocol):
    world_size: int
    backend: str
    device_type: str
    mode: str  # "spawned" or "torchrun"

    def execute(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: int, label: str,
        timeout_s: float | None = None, groups: tuple[tuple[int, ...], ...] = (),
    ) -> list[Any]: ...

    def rank_info(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def threads_per_rank(world_size: int) -> int:
    """About cores / ranks, at least one: ranks must not fight over the cores."""
    return max(1, len(host_cores()) // world_size)


def _topology_order(cpu: int) -> tuple[int, int, int]:
    """(package, core, cpu): sorted by it, the hardware threads of one physical core sit
    side by side (Linux numbers them apart: 0 and 8 on an 8-core, 16-thread CPU)."""
    base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(base + "physical_package_id") as f:
            package = int(f.read())
        with open(base + "core_id") as f:
            core = int(f.read())
    except (OSError, ValueError):
        return (0, cpu, cpu)
    return (package, core, cpu)


def rank_cores(world_size: int, device_type: str) -> list[tuple[int, ...]] | None:
    """The cores each CPU rank is bound to with ``--distperf-bind``: rank r to the r-th run
    of :func:`threads_per_rank` of them, the hardware threads of a physical core side by side
    (so that ranks share no core where the counts allow); None (no binding) for GPU ranks
    (their host threads belong near their GPU, which only the machine's topology tells),
    where the ranks outnumber the cores, or where a process cannot be bound.

    Bound, a 4 MiB gloo all-reduce on 2 ranks of this project's 2-core host ran 1.35-1.5x
    faster, but a set of bound processes could keep a slow regime (1.6x) for many
    measurements, which made the verdicts on its bandwidth worse, so it is not the
    default (docs/pool.md, *Binding*; benchmarks/rank_binding.md)."""
    if device_type == "cuda" or not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(host_cores(), key=_topology_order)
    if world_size > len(cores):
        return None
    each = len(cores) // world_size
    return [tuple(cores[r * each:(r + 1) * each]) for r in range(world_size)]


class RankPool:
    """N rank processes with ``torch.distributed`` initialised, reused across calls; rank r
    on CUDA device ``devices[r]`` (NCCL ranks, or gloo ranks placed on GPUs), or on the CPU
    where ``devices`` is empty."""

    mode = "spawned"

    def __init__(
        self, world_size: int, backend: str, *, devices: tuple[int, ...] = (),
        timeout_s: float = 300.0, startup_timeout_s: float | None = None,
        bind: bool = False,
    ) -> None:
        if devices and len(devices) != world_size:
            raise ValueError(f"devices: one per rank, got {len(devices)} for {world_size}")
        self.world_size = world_size
        self.bind = bind  # bind each CPU rank to its own cores (rank_cores), where they fit
        self.backend = backend
        self.devices = devices
        self.device_type = "cuda" if devices else "cpu"
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s or max(timeout_s, 120.0)
        self.generation = 0  # how many times the pool was (re)spawned
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._phases: list[Any] = []
        self._info: list[dict[str, Any]] = []
        self._groups: set[tuple[int, ...]] = set()  # made on every rank (worker.make_groups)
        self._sys_path_sent: list[str] | None = None
        self._next_id = 0
        self._tmp: str | None = None
        self._logs: RankLogs | None = None
        self._store: Any = None
        self._sock: socket.socket | None = None
        self._route: RankPool | None = None  # routed_to(): the pool that takes the calls
        atexit.register(self.close)

    # -- life cycle -----------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    def pids(self) -> list[int]:
        """The ranks' process ids (those of the pool the calls are routed to, if any)."""
        if self._route is not None:
            return self._route.pids()
        return [p.pid for p in self._procs if p.pid is not None]

    def sibling(self) -> RankPool:
        """A new pool, not started, of the same size, backend, devices and time limits."""
        return RankPool(self.world_size, self.backend, devices=self.devices,
                        timeout_s=self.timeout_s, startup_timeout_s=self.startup_timeout_s,
                        bind=self.bind)

    @contextlib.contextmanager
    def routed_to(self, other: RankPool) -> Iterator[None]:
        """Send every call (and :meth:`pids`) to ``other`` for the duration: a measurement
        that sets up all it needs is repeated on fresh ranks, while this pool, and whatever
        earlier calls left on its ranks, stays as it is."""
        if other is self:
            raise ValueError("a pool cannot be routed to itself")
        self._route = other
        try:
            yield
        finally:
            self._route = None

    @property
    def folder(self) -> str | None:
        """The pool's folder (rank logs, stack dumps; see :mod:`pytest_distperf.pool.leftovers`)."""
        return self._tmp

    def start(self) -> None:
        import torch.distributed as dist

        self.close()
        self.generation += 1
        self._tmp = leftovers.new_pool_dir()
        self._logs = RankLogs(self._tmp, self.world_size)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(max(128, self.world_size * 4))
        self._sock = sock
        port = sock.getsockname()[1]
        self._store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", port, is_master=True, master_listen_fd=sock.fileno(),
            wait_for_workers=False, timeout=datetime.timedelta(seconds=self.startup_timeout_s),
        )
        ctx = fork_server()
        threads = threads_per_rank(self.world_size)
        cores = rank_cores(self.world_size, self.device_type) if self.bind else None
        for rank in range(self.world_size):
            parent_conn, child_conn = ctx.Pipe(duplex=True)
            phase = ctx.Array("c", 256, lock=False)
            phase.value = b"starting the process (it has not run distperf's code yet)"
            device = self.devices[rank] if self.devices else None
            proc = ctx.Process(
                target=worker.main,
                name=f"distperf-rank{rank}",
                args=(rank, self.world_size, self.backend, port, child_conn, phase,
                      self._stack_file(rank), self._logs.path(rank), device, threads,
                      self.timeout_s, dict(os.environ), cores[rank] if cores else ()),
                daemon=True,
            )
            proc.start()
            child_conn.close()
            self._procs.append(proc)
            self._conns.append(parent_conn)
            self._phases.append(phase)
        leftovers.sign_ranks(self._tmp, self.pids())
        try:
            replies = self._gather(list(range(self.world_size)), None, self.startup_timeout_s,
                                   "start-up")
        except RankError as exc:
            self.close()
            raise RankError(f"the rank pool failed to start: {exc}", exc.failed_ranks) from None
        self._info = [reply for reply in replies]

    def close(self, busy: Iterable[int] = ()) -> None:
        """Kill every rank and what the ranks started, and release the store; safe to call
        twice.  An idle rank is told to stop (it leaves its group and ends); a ``busy`` one,
        stuck in a call or interrupted in it, cannot read that, and is killed at once rather
        than after the idle ones' grace."""
        # what runs below the ranks now (it is reparented when they end)
        below = leftovers.started_by(leftovers.ranks_of(self._tmp)) if self._tmp else {}
        stuck = set(busy)
        for rank, proc in enumerate(self._procs):
            if rank in stuck:
                proc.kill()
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send_bytes(cloudpickle.dumps(("stop",)))
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.close()
        self._procs, self._conns, self._phases = [], [], []
        self._groups = set()
        self._sys_path_sent = None
        self._store = None
        if self._sock is not None:
            with contextlib.suppress(Exception):
                self._sock.close()
            self._sock = None
        if self._tmp is not None:
            # what the ranks' code started (a data loader's workers, a server, a subprocess)
            leftovers.kill_leftovers(self._tmp, also=below)
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
            self._logs = None

    def rank_info(self) -> list[dict[str, Any]]:
        self._ensure_started("the rank info")
        return list(self._info)

    def _ensure_started(self, what: str) -> None:
        """Start the pool if it is not running; say so once if it was and a rank died."""
        if self.alive:
            return
        if self._procs:
            warnings.warn(f"distperf: {self._lost()} between calls; a fresh pool is started "
                          f"for {what}", RuntimeWarning, stacklevel=3)
        self.start()

    # -- calls ----------------------------------------------------------------------------
    def _make_groups(self, wanted: tuple[tuple[int, ...], ...]) -> None:
        """Every rank makes ``wanted``, in order; a failure leaves the ranks with different
        groups, so the pool is closed and the next call starts a fresh one."""
        call_id = self._new_id()
        self._send(range(self.world_size), ("groups", call_id, wanted))
        try:
            self._gather(list(range(self.world_size)), call_id, self.timeout_s,
                         f"creating the process groups {', '.join(map(str, wanted))}")
        except RankError:
            self.close()
            raise
        self._groups.update(wanted)

    def execute(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: int, label: str,
        timeout_s: float | None = None, groups: tuple[tuple[int, ...], ...] = (),
    ) -> list[Any]:
        """Run ``fn`` on ranks 0..size-1, after every rank made the process groups the call
        needs: those ranks, and ``groups`` (a mesh's rows)."""
        __tracebackhide__ = True
        if self._route is not None:
            return self._route.execute(fn, args, kwargs, size, label, timeout_s, groups)
        try:
            payload = cloudpickle.dumps((fn, args, kwargs))
        except Exception as exc:
            raise TypeError(
                f"{label}: cannot send the function or its arguments to the ranks "
                f"({type(exc).__name__}: {exc}); define it in the test module or a module on "
                f"sys.path, and pass picklable arguments"
            ) from None
        self._ensure_started(label)
        try:
            wanted = [g for g in ((tuple(range(size)),) if size < self.world_size else ())
                      + groups if g not in self._groups]
            if wanted:
                self._make_groups(tuple(wanted))
            sys_path = list(sys.path)
            shipped = None if sys_path == self._sys_path_sent else sys_path
            self._sys_path_sent = sys_path
            call_id = self._new_id()
            self._send(range(size), ("call", call_id, payload, size, label, shipped))
            return self._gather(list(range(size)), call_id, timeout_s or self.timeout_s, label)
        except RankError:
            raise
        except BaseException as exc:
            # Interrupted in the controller (a signal handler that raises, pytest-timeout's
            # signal method, Ctrl-C): the ranks are still busy with this call, and the next
            # call would wait for them.  Kill them: the next call starts a fresh pool.
            self.close(busy=range(size))
            exc.add_note(f"distperf: {label} was interrupted in the controller; the rank "
                         f"pool was killed and the next call starts a fresh one")
            raise

    def _lost(self) -> str:
        """Which ranks of the pool died, and how."""
        dead = [f"rank {r} (exit code {p.exitcode})" for r, p in enumerate(self._procs)
                if not p.is_alive()]
        return f"{', '.join(dead)} of the pool died"

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _send(self, ranks: range, message: tuple[Any, ...]) -> None:
        data = cloudpickle.dumps(message)
        for rank in ranks:
            with contextlib.suppress(OSError):  # a dead rank is reported by _gather
                self._conns[rank].send_bytes(data)

    def _gather(self, ranks: list[int], call_id: int | None, timeout_s: float,
                label: str) -> list[Any]:
        """Replies from ``ranks`` in rank order, or a RankError/RankTimeout (pool killed)."""
        __tracebackhide__ = True
        results: dict[int, Any] = {}
        failures: dict[int, str] = {}  # what each rank that raised or died said, as it came in
        pending = set(ranks)
        ended = False  # a rank died, or said it can serve no more calls
        start = time.monotonic()
        deadline = start + timeout_s
        by_conn = {id(self._conns[r]): r for r in ranks}
        by_sentinel = {self._procs[r].sentinel: r for r in ranks}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waitables = [self._conns[r] for r in pending]
            waitables += [self._procs[r].sentinel for r in pending]
            ready_list = wait(waitables, timeout=min(remaining, LOG_CHECK_S))
            if not ready_list and self._logs is not None:  # a long call: a flood in it?
                self._logs.trim(sorted(pending))
            for ready in ready_list:
                rank = by_sentinel.get(ready) if isinstance(ready, int) else by_conn[id(ready)]
                if rank is None or rank not in pending:
                    continue
                conn = self._conns[rank]
                if isinstance(ready, int) and conn.poll():
                    continue  # its reply is waiting: read it through the connection
                reply = self._receive(conn) if not isinstance(ready, int) else None
                if reply is None:
                    code = self._procs[rank].exitcode
                    self._procs[rank].join(timeout=1.0)
                    code = self._procs[rank].exitcode if code is None else code
                    failures[rank] = f"rank {rank} died (exit code {code}) during {label}"
                    ended = True
                    pending.discard(rank)
                    deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
                    continue
                if reply[0] == "ready":
                    results[rank] = reply[1]
                elif reply[1] != call_id and reply[1] is not UNREADABLE:
                    continue  # a late reply to an earlier call
                elif reply[0] == "ok":
                    results[rank] = reply[2]
                else:
                    failures[rank] = f"rank {rank} raised {reply[2]}\n{reply[3]}".rstrip()
                    deadline = min(deadline, time.monotonic() + ERROR_GRACE_S)
                    ended |= reply[4:5] == (worker.FATAL,)
                pending.discard(rank)
        output = self._logs.take(ranks) if self._logs is not None else ""
        if not pending and not failures:
            return [results[r] for r in ranks]
        self._fail(label, failures, sorted(pending), output, time.monotonic() - start,
                   timeout_s, ended=ended)

    def _fail(self, label: str, failures: dict[int, str], stuck: list[int], output: str,
              waited: float, timeout_s: float, *, ended: bool = False) -> NoReturn:
        """Raise what went wrong in a call: RankTimeout when ranks only got stuck, RankError
        otherwise.

        ``failures`` holds what each rank that raised or died said, in the order it came in.
        The report gives the root cause first (the ranks that raised or died, the first one
        first), then the ranks that did not finish, with what they were doing, then the
        errors of the ranks that only lost a peer (:func:`is_secondary`).  A pool with stuck
        ranks, or with ranks that ended (``ended``: they died, or their group is gone), is
        killed first."""
        __tracebackhide__ = True
        parts = [text for text in failures.values() if not is_secondary(text)]
        if stuck:
            why = ("after another rank failed" if failures
                   else f"within the timeout of {timeout_s:g} s")
            parts.append(f"{label}: rank(s) {', '.join(map(str, stuck))} did not finish "
                         f"{why} (waited {waited:.1f} s)")
            parts += [self._describe_stuck(rank) for rank in stuck]
        parts += [text for text in failures.values() if is_secondary(text)]
        if output:
            parts.append(output)
        message = "\n\n".join(parts)
        if stuck or ended:
            self.close(busy=stuck)  # the group is in an unknown state: the next call respawns it
            message += "\n\n(the rank pool was killed; the next call starts a fresh one)"
        failed = tuple(sorted(set(failures) | set(stuck)))
        if stuck and not failures:
            raise RankTimeout(message, failed)
        raise RankError(message, failed)

    def _receive(self, conn: Any) -> tuple[Any, ...] | None:
        try:
            return tuple(cloudpickle.loads(conn.recv_bytes()))
        except (EOFError, OSError):
            return None
        except Exception as exc:  # a result that cannot be unpickled here
            return ("err", UNREADABLE, "its result could not be unpickled in the controller "
                    f"({type(exc).__name__}: {exc}): return plain values (numbers, strings, "
                    "lists, dicts, CPU tensors) or types the test process can import",
                    traceback.format_exc())

    def _describe_stuck(self, rank: int) -> str:
        phase = self._phases[rank].value.decode("utf-8", "replace") or "unknown"
        stacks = ""
        proc = self._procs[rank]
        halted = proc.pid is not None and procs.stopped(proc.pid)
        if proc.is_alive() and proc.pid is not None and not halted:
            path = self._stack_file(rank)
            with contextlib.suppress(OSError):
                before = os.path.getsize(path)
                os.kill(proc.pid, signal.SIGUSR1)
                deadline = time.monotonic() + 2.0
                size = before
                while time.monotonic() < deadline:
                    time.sleep(0.05)
                    new_size = os.path.getsize(path)
                    if new_size > before and new_size == size:
                        break
                    size = new_size
                with open(path, errors="replace") as f:
                    f.seek(before)
                    stacks = f.read().strip()
        text = f"rank {rank} was busy with: {phase}"
        if halted:
            text += " (its process is stopped, by SIGSTOP or a debugger: no Python stack)"
        if stacks:
            text += f"\nPython stacks of rank {rank} (most recent call first):\n{stacks}"
        return text

    def _stack_file(self, rank: int) -> str:
        assert self._tmp is not None
        return os.path.join(self._tmp, f"rank{rank}.stacks")
