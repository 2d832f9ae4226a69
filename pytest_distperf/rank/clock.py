"""The rank's one clock, and the barrier-aligned timing loop every measurement uses (torch).

:class:`Clock` gives timestamps that subtract to seconds: CUDA events on the rank's device
when it has one (NCCL ranks, gloo ranks on GPUs: no host clock around asynchronous kernels),
``time.perf_counter`` on CPU.  :func:`time_with_control` starts every iteration from a
barrier so that the samples of all ranks belong to the same iteration; the controller takes
the slowest rank per iteration.

The host-speed control (CPU only): after each timed iteration every rank runs the same fixed
piece of work (:func:`control_kernel`, about 2-3 ms of float32 matmuls) at once, timed the
same way.  Shared hosts change speed by 20-25% from one second to the next, with no steal
to show for it (the ranks' vCPUs land on SMT siblings of one core, or not); the control
slows down with them, and the verdict takes out the part of a time that follows it
(docs/baselines.md, benchmarks/verdict_quality.md).  Right after it comes the memory control
(:func:`memory_kernel`, about 1 ms of copies and adds of a 2 MiB buffer): the compute control
stays in the core's own cache, and is blind to what slows a training step's memory traffic
(another VM streaming memory; the host's drifts, when a step slowed 1.4-1.6x as much as the
compute control and 1.2x as much as this one: benchmarks/control_tracking.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pytest_distperf.rank.phase import set_phase
from pytest_distperf.records import RankTimes

#: The control's work: CONTROL_REPS products of two CONTROL_N x CONTROL_N float32 matrices.
#: Never change these without a new baseline: the control is compared with the stored one.
CONTROL_N = 128
CONTROL_REPS = 40
#: The memory control's work: MEMORY_REPS copies and adds of MEMORY_ELEMENTS float32 (2 MiB).
MEMORY_ELEMENTS = 512 * 1024
MEMORY_REPS = 8


#: The CUDA device this process was placed on (by the pool or the torchrun engine), if any.
_PLACED: dict[str, int] = {}


def use_device(index: int) -> None:
    """Place this rank on ``cuda:index``: torch's current device, and :func:`rank_device`'s
    answer (also for gloo ranks, whose backend does not say where their tensors are)."""
    import torch

    torch.cuda.set_device(index)
    _PLACED["cuda"] = index


def rank_device() -> Any:
    """This rank's device: the GPU it was placed on (NCCL ranks, and gloo ranks on GPUs), the
    current CUDA device of an NCCL group distperf did not place, else the CPU."""
    import torch
    import torch.distributed as dist

    if "cuda" in _PLACED:
        return torch.device("cuda", _PLACED["cuda"])
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Clock:
    """Timestamps that subtract to seconds: CUDA events on a CUDA device, perf_counter else."""

    def __init__(self, device: Any = None) -> None:
        self.device = rank_device() if device is None else device
        self.on_cuda = self.device.type == "cuda"

    def now(self) -> Any:
        """A timestamp: a recorded CUDA event (on the device's current stream, also from a
        collective's callback thread, where the future's stream guard makes that stream wait
        for the collective), or ``perf_counter()``."""
        if self.on_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        """Seconds between two timestamps (CUDA: once ``end`` has completed)."""
        if self.on_cuda:
            return float(start.elapsed_time(end)) / 1e3
        return float(end - start)

    def synchronize(self) -> None:
        """Wait for the device's queued work (nothing on CPU)."""
        if self.on_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def elapsed(self, fn: Callable[[], Any]) -> float:
        """Seconds ``fn()`` takes, including the device work it queued."""
        start = self.now()
        fn()
        end = self.now()
        if self.on_cuda:
            end.synchronize()
        return self.seconds(start, end)


def control_kernel() -> Callable[[], Any]:
    """The host-speed control: a fixed CPU workload, the same on every rank and every run."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(CONTROL_N, CONTROL_N, generator=generator)
    b = torch.randn(CONTROL_N, CONTROL_N, generator=generator)
    out = torch.empty(CONTROL_N, CONTROL_N)

    def run() -> None:
        for _ in range(CONTROL_REPS):
            torch.mm(a, b, out=out)

    return run


def memory_kernel() -> Callable[[], Any]:
    """The memory control: copies and adds of 2 MiB buffers (6 MiB in all: past the core's
    own cache, within the shared one, as a step's gradients and activations are), the same
    on every rank."""
    import torch

    source = torch.randn(MEMORY_ELEMENTS, generator=torch.Generator().manual_seed(1))
    out, other = source.clone(), source.clone()

    def run() -> None:
        for _ in range(MEMORY_REPS):
            out.copy_(source)
            out.add_(other)

    return run


class HostControls:
    """Both host-speed controls, built once, run after each timed iteration from a barrier:
    the compute control, then the memory control (CPU ranks only)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.compute = control_kernel()
        self.memory = memory_kernel()
        self.compute_s: list[float] = []
        self.memory_s: list[float] = []

    def warm(self) -> None:
        self.compute()
        self.memory()

    def run(self, phase: str) -> None:
        """Time both controls once (``phase``: what the hang reporter shows)."""
        import torch.distributed as dist

        set_phase(phase)
        dist.barrier()
        self.compute_s.append(self.clock.elapsed(self.compute))
        self.memory_s.append(self.clock.elapsed(self.memory))


def time_iterations(fn: Callable[[], Any], *, warmup: int, iters: int,
                    phase: str = "") -> list[float]:
    """Seconds per iteration of ``fn`` on this rank, after ``warmup`` untimed calls.

    ``phase`` prefixes what the hang reporter shows (e.g. ``"all_reduce 16MiB"``).
    """
    return time_with_control(fn, warmup=warmup, iters=iters, phase=phase, control=False)[0]


def time_with_control(fn: Callable[[], Any], *, warmup: int, iters: int, phase: str = "",
                      control: bool = True) -> tuple[list[float], list[float], list[float]]:
    """(seconds per iteration of ``fn``, seconds of the compute control after each
    iteration, seconds of the memory control after each).

    The control lists are empty when ``control`` is false or the work runs on CUDA (where
    the host's speed is not what the timed kernels depend on; see :func:`control_kernel`).
    """
    import torch.distributed as dist

    clock = Clock()
    prefix = f"{phase}: " if phase else ""
    check = HostControls(clock) if control and not clock.on_cuda else None
    for i in range(warmup):
        set_phase(f"{prefix}warm-up {i + 1}/{warmup}")
        fn()
    if check is not None:
        check.warm()
    clock.synchronize()
    samples: list[float] = []
    for i in range(iters):
        set_phase(f"{prefix}timed iteration {i + 1}/{iters}")
        dist.barrier()
        samples.append(clock.elapsed(fn))
        if check is not None:
            check.run(f"{prefix}host-speed control {i + 1}/{iters}")
    # No rank may start other work (a correctness check that fills large buffers, say) while
    # another is still in its last timed call: on shared cores that work would slow the last
    # iteration of the slower rank, and the slowest rank's time is the sample.
    dist.barrier()
    if check is None:
        return samples, [], []
    return samples, check.compute_s, check.memory_s


def measure_on_rank(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    warmup: int, iters: int, control: bool = True) -> RankTimes:
    """What :meth:`DistGroup.measure` runs on every rank."""
    samples, controls, memory = time_with_control(lambda: fn(*args, **kwargs), warmup=warmup,
                                                  iters=iters, control=control)
    return RankTimes(tuple(samples), tuple(controls), tuple(memory))
