"""nccl-tests' bandwidth definitions: algbw from bytes and time, and busbw's factor per op.
Stdlib only."""

from __future__ import annotations

from collections.abc import Callable


def gbps(nbytes: float, time_us: float) -> float:
    """Bytes moved in ``time_us`` microseconds as GB/s (1e9 bytes per second): nccl-tests'
    algbw; 0.0 for no time."""
    return nbytes / (time_us * 1e3) if time_us > 0 else 0.0


#: busbw = algbw * factor(n): nccl-tests' doc/PERFORMANCE.md.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
