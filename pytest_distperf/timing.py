"""Timing loops that run on the ranks (torch): per-iteration samples aligned by a barrier.

On CUDA, CUDA events bracket the work (no host clock around asynchronous kernels); on CPU,
``time.perf_counter``.  Every iteration starts from a barrier so that the samples of all
ranks belong to the same iteration; the controller takes the slowest rank per iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def time_iterations(fn: Callable[[], Any], *, warmup: int, iters: int,
                    phase: str = "") -> list[float]:
    """Seconds per iteration of ``fn`` on this rank, after ``warmup`` untimed calls.

    ``phase`` prefixes what the hang reporter shows (e.g. ``"all_reduce 16MiB"``).
    """
    import torch
    import torch.distributed as dist

    from pytest_distperf.worker import set_phase

    on_cuda = dist.get_backend() == "nccl" and torch.cuda.is_available()
    prefix = f"{phase}: " if phase else ""
    for i in range(warmup):
        set_phase(f"{prefix}warm-up {i + 1}/{warmup}")
        fn()
    if on_cuda:
        torch.cuda.synchronize()
    samples: list[float] = []
    for i in range(iters):
        set_phase(f"{prefix}timed iteration {i + 1}/{iters}")
        dist.barrier()
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    # No rank may start other work (a correctness check that fills large buffers, say) while
    # another is still in its last timed call: on shared cores that work would slow the last
    # iteration of the slower rank, and the slowest rank's time is the sample.
    dist.barrier()
    return samples


def measure_on_rank(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    warmup: int, iters: int) -> list[float]:
    """What :meth:`DistGroup.measure` runs on every rank."""
    return time_iterations(lambda: fn(*args, **kwargs), warmup=warmup, iters=iters)
