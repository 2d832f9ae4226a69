"""Time intervals ``(start, end)``: merge, clip, measure.  Stdlib only.

The one implementation of interval arithmetic, shared by the rank side (the time a step's
gradient buckets covered) and the trace analysis (communication and compute on a
timeline, their overlap).  Intervals with ``end <= start`` are empty and ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Span = tuple[float, float]


def merge_intervals(spans: Iterable[Span]) -> list[Span]:
    """Sorted, non-overlapping intervals covering the same time as ``spans``."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def clip_intervals(spans: Iterable[Span], lo: float, hi: float) -> list[Span]:
    """The parts of ``spans`` inside ``[lo, hi]``."""
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def total_length(spans: Iterable[Span]) -> float:
    """The summed length of ``spans`` (overlaps counted as often as they occur)."""
    return sum(e - s for s, e in spans)


def union_length(spans: Iterable[Span]) -> float:
    """Time covered by ``spans``, overlaps counted once."""
    return total_length(merge_intervals(spans))


def intersection_length(a: Sequence[Span], b: Sequence[Span]) -> float:
    """Time covered by both of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
