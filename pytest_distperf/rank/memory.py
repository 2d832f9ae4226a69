"""A rank's memory: the peak a timed step reports (the CUDA caching allocator's on GPU, the
largest resident set size seen after a step on CPU).
"""

from __future__ import annotations

import contextlib
import os

from pytest_distperf.rank.clock import Clock


def memory_figures(clock: Clock, peak_rss: int, world: int) -> tuple[int, int, str]:
    """(peak bytes, capacity bytes, source): the CUDA allocator's peak on GPU, the largest
    resident set size seen after a step on CPU."""
    if clock.on_cuda:
        import torch

        peak = int(torch.cuda.max_memory_allocated(clock.device))
        capacity = int(torch.cuda.get_device_properties(clock.device).total_memory)
        return peak, capacity, "cuda_max_allocated"
    return peak_rss, _host_memory_share(world), "rss"


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not available)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


def _host_memory_share(world: int) -> int:
    """Host memory divided evenly over the ranks of the group (0 when unknown)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    return int(total // max(1, local))
