"""The engine under ``torchrun``: the group torchrun built, ``fn`` run on this rank and the
results gathered with ``all_gather_object`` (the spawned pool's counterpart,
:class:`~pytest_distperf.pool.launcher.RankPool`)."""

from __future__ import annotations

import contextlib
import datetime
import os
import traceback
from typing import Any

from pytest_distperf.pool.launcher import RankError, threads_per_rank
from pytest_distperf.rank import worker
from pytest_distperf.rank.clock import use_device
from pytest_distperf.rank.memory import is_out_of_memory, release_cached
from pytest_distperf.rank.phase import set_phase

#: What follows a destroyed group under torchrun: the group is the job's, built once.
TORCHRUN_DESTROYED = ("torchrun's group cannot be rebuilt inside the job, so this test and "
                      "every later test of this run fail")


class TorchrunEngine:
    """The group torchrun built: ``fn`` runs on this rank, results are all-gathered.

    As in the pool, what a call changes in this process (working directory, environment,
    torch's thread count) is put back after it.  A call that destroys the group fails its
    test, and every later call fails at once with the reason: torchrun's group cannot be
    rebuilt inside the job.
    """

    mode = "torchrun"

    def __init__(self, backend: str, timeout_s: float) -> None:
        import torch
        import torch.distributed as dist

        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ["WORLD_SIZE"])
        #: this rank's CUDA device (NCCL, or gloo-cuda: local rank mod the GPUs); None: CPU
        self.device_index: int | None = None
        #: whether this engine made the group (then it destroys it in :meth:`close`)
        self.made_group = not dist.is_initialized()
        if self.made_group:
            kwargs: dict[str, Any] = {}
            if backend in ("nccl", "gloo-cuda"):
                self.device_index = (self.local_rank if backend == "nccl"
                                     else self.local_rank % torch.cuda.device_count())
                use_device(self.device_index)
            if backend == "nccl":
                kwargs["device_id"] = torch.device("cuda", self.local_rank)
            dist.init_process_group(
                "gloo" if backend == "gloo-cuda" else backend,
                timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
        elif dist.get_backend() == "nccl":  # the job's own group
            self.device_index = torch.cuda.current_device()
        self.backend = dist.get_backend()
        self.device_type = "cpu" if self.device_index is None else "cuda"
        torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        self._info: list[dict[str, Any]] | None = None
        #: Why this rank can run no more calls (its group was destroyed); '' while it can.
        self._broken = ""

    def execute(
        self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], size: int, label: str,
        timeout_s: float | None = None, groups: tuple[tuple[int, ...], ...] = (),
    ) -> list[Any]:
        __tracebackhide__ = True
        import torch.distributed as dist

        if self._broken:
            raise RankError(f"{label} was not run: an earlier call broke the group of this "
                            f"rank: {self._broken}", (self.rank,))
        first = tuple(range(size))
        worker.make_groups(((first,) if size < self.world_size else ()) + groups)
        reply: tuple[Any, ...] = ("skip",)
        if self.rank < size:
            set_phase(label)
            freed = False
            try:
                group = worker.GROUPS[first] if size < self.world_size else None
                reply = ("ok", worker.run_here(fn, args, kwargs, group))
            except Exception as exc:  # every rank must still reach the gather below
                reply = ("err", worker.summary(exc), traceback.format_exc())
                freed = is_out_of_memory(exc)
            if freed:  # what the failed call held is garbage now that its traceback is gone
                release_cached()
            self._broken = worker.destroyed(self.rank, TORCHRUN_DESTROYED)
            if self._broken:  # this rank cannot reach the gather
                raise RankError(self._broken, (self.rank,))
        gathered: list[Any] = [None] * self.world_size
        try:
            dist.all_gather_object(gathered, reply)
        except Exception as exc:  # another rank destroyed its group, or died
            self._broken = (f"RuntimeError: gathering the results failed on rank {self.rank} "
                            f"({type(exc).__name__}: {exc}); another rank destroyed the "
                            f"process group or died, and {TORCHRUN_DESTROYED}")
            raise RankError(self._broken, (self.rank,)) from None
        errors = [(r, g) for r, g in enumerate(gathered[:size]) if g[0] == "err"]
        if errors:
            raise RankError(
                "\n\n".join(f"rank {r} raised {g[1]}\n{g[2]}" for r, g in errors),
                tuple(r for r, _ in errors),
            )
        return [g[1] for g in gathered[:size]]

    def rank_info(self) -> list[dict[str, Any]]:
        if self._info is None:
            import torch.distributed as dist

            mine = worker.describe(self.rank, self.backend, self.device_index)
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, mine)
            self._info = gathered
        return list(self._info)

    def close(self) -> None:
        """Destroy the group, subgroups included, where this engine made it (a group the
        job made before pytest is the job's).  A rank that exits with its gloo group alive
        can abort in the group's teardown ("terminate called without an active exception"),
        failing a job whose tests passed; destroyed here, the rank also exits sooner."""
        import torch.distributed as dist

        if self.made_group and dist.is_initialized():
            with contextlib.suppress(Exception):  # a peer gone: nothing left to release
                dist.destroy_process_group()
        worker.GROUPS.clear()
