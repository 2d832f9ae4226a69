"""Profiler traces of several ranks: merge them into one trace, and analyse it.  Pure.

The rule: everything here reads Kineto's Chrome-trace JSON (as ``torch.profiler`` exports it
per rank) and plain records; no torch, no pytest.

* :mod:`~pytest_distperf.analysis.traces.merge`: one Chrome/Perfetto trace of all ranks, one clock;
* :mod:`~pytest_distperf.analysis.traces.rank_timeline`: one rank's collectives, communication and
  compute intervals;
* :mod:`~pytest_distperf.analysis.traces.stages`: pipeline stages' labelled chunks;
* :mod:`~pytest_distperf.analysis.traces.desync`: did the ranks run the same collectives in order;
* :mod:`~pytest_distperf.analysis.traces.census`: one step's collectives, counted, with
  its device figures (each trace read once);
* :mod:`~pytest_distperf.analysis.traces.device`: what one step asked of each rank's GPU
  (kernel launches, host syncs and their causes, host-device bytes, kernel busy time);
* :mod:`~pytest_distperf.analysis.traces.analysis`: per-rank figures, collective statistics and the
  findings, as a :class:`~pytest_distperf.fixtures.results.profile.ProfileReport`.
"""

from __future__ import annotations

from pytest_distperf.analysis.traces.analysis import (
    analyse,
    collective_stats,
    profile_metrics,
    rank_profile,
    trace_file_name,
)
from pytest_distperf.analysis.traces.desync import DesyncError, check_desync
from pytest_distperf.analysis.traces.merge import base_time_ns, load_trace, merge_traces
from pytest_distperf.analysis.traces.rank_timeline import (
    REGION_NAME,
    CommOp,
    Timeline,
    timeline,
    timelines,
)
from pytest_distperf.common.intervals import clip_intervals, intersection_length, merge_intervals
from pytest_distperf.common.names import canonical_collective, canonical_dtype

__all__ = [
    "REGION_NAME",
    "CommOp",
    "DesyncError",
    "Timeline",
    "analyse",
    "base_time_ns",
    "canonical_collective",
    "canonical_dtype",
    "check_desync",
    "clip_intervals",
    "collective_stats",
    "intersection_length",
    "load_trace",
    "merge_intervals",
    "merge_traces",
    "profile_metrics",
    "rank_profile",
    "timeline",
    "timelines",
    "trace_file_name",
]
