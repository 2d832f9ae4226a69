"""Counting collectives: calls and bytes by kind (and process group), from the ranks'
profiler traces.  Pure: stdlib only.

These are the exact figures of a step: they do not depend on the host's speed, so a
baseline judges them exactly (:data:`~pytest_distperf.records.EXACT`), and a change found
on a 2-core CPU runner is the same change on a GPU cluster (DDP's buckets, FSDP's
all-gathers and reduce-scatters, a stray barrier or all-reduce in the step).

``ddp_step_timer`` runs one synchronised step under ``torch.profiler`` after its timed
steps and sends its trace (:func:`pytest_distperf.rank.ddp._census`), read by
:func:`counted_step` with the device's figures (:mod:`~.device`); ``dist_profiler``
counts the collectives of its profiled call.  Both read the collectives with
:func:`~pytest_distperf.analysis.traces.rank_timeline.timeline`, the same reader the trace analysis
uses.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence

from pytest_distperf.analysis.traces.device import busy_seconds, rank_device_figures
from pytest_distperf.analysis.traces.merge import load_trace
from pytest_distperf.analysis.traces.rank_timeline import CommOp, timeline
from pytest_distperf.fixtures.results.steps import CommCount, DeviceFigures


def count_ops(per_rank: Sequence[Sequence[CommOp]]) -> tuple[CommCount, ...]:
    """Calls and bytes per (process group, collective), the most any rank issued, sorted
    by group and name.  Send/recv count too (as ``send``/``recv``)."""
    totals: dict[tuple[str, str], tuple[int, int]] = {}
    for ops in per_rank:
        mine: dict[tuple[str, str], tuple[int, int]] = {}
        for op in ops:
            key = (group_key(op), op.name)
            calls, nbytes = mine.get(key, (0, 0))
            mine[key] = (calls + 1, nbytes + op.nbytes)
        for key, (calls, nbytes) in mine.items():
            seen = totals.get(key, (0, 0))
            totals[key] = (max(seen[0], calls), max(seen[1], nbytes))
    return tuple(CommCount(op=name, calls=calls, bytes=nbytes, group=group)
                 for (group, name), (calls, nbytes) in sorted(totals.items()))


def group_key(op: CommOp) -> str:
    """A process group as a stable key: its ranks (``"ranks 0,1"``) where the trace lists
    them; "" where it does not.  Not the group's name: names count the groups a process has
    made, which depends on the tests that ran before in a reused rank process."""
    return "ranks " + ",".join(map(str, op.group_ranks)) if op.group_ranks else ""


@dataclasses.dataclass(frozen=True, slots=True)
class CountedStep:
    """What the counted step's traces say: its collectives, and on GPUs the seconds each
    rank's device ran kernels and what each rank's host asked of its device."""

    comm: tuple[CommCount, ...]
    busy_s: tuple[float, ...]
    device: tuple[DeviceFigures, ...]


def counted_step(traces: Sequence[bytes]) -> CountedStep:
    """:class:`CountedStep` from the ranks' zlib-compressed traces (empty ones are skipped:
    a rank that did not count), each decompressed and parsed once."""
    loaded = [(rank, load_trace(zlib.decompress(t))) for rank, t in enumerate(traces) if t]
    lines = [timeline(trace, rank) for rank, trace in loaded]
    device = [rank_device_figures(trace, rank) for rank, trace in loaded]
    return CountedStep(count_ops([line.ops for line in lines]), busy_seconds(lines),
                       tuple(f for f in device if f is not None))

