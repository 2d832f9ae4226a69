"""From the ranks' traces to a :class:`~pytest_distperf.fixtures.results.profile.ProfileReport`:
per-rank figures, per-collective statistics, the desync check and the findings (the
analyzer's rules, :mod:`~pytest_distperf.analysis.findings`, over the profiled call), and the
metrics a profile records.  Pure: numpy at most.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_distperf.analysis.analyzer import load_balance
from pytest_distperf.analysis.findings import (
    PROFILED_CALL,
    balance_bottlenecks,
    communication_bottlenecks,
    desync_bottleneck,
    ms,
    recommendations,
    small_message_bottlenecks,
)
from pytest_distperf.analysis.traces.arrivals import collective_timings
from pytest_distperf.analysis.traces.census import count_ops
from pytest_distperf.analysis.traces.desync import check_desync
from pytest_distperf.analysis.traces.rank_timeline import Timeline, timelines
from pytest_distperf.common.files import file_stem
from pytest_distperf.common.intervals import intersection_length, total_length
from pytest_distperf.common.names import P2P
from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.common.shares import batch_shares
from pytest_distperf.config import format_bytes, resolve_thresholds
from pytest_distperf.fixtures.results.findings import Bottleneck
from pytest_distperf.fixtures.results.profile import (
    CollectiveStat,
    ProfileReport,
    RankProfile,
    StageChunk,
    StepProfile,
)
from pytest_distperf.fixtures.results.steps import comm_count_metrics, dimension_count_metrics
from pytest_distperf.records import INFORMATIONAL, Metric


def rank_profile(tl: Timeline) -> RankProfile:
    wall = max(tl.region[1] - tl.region[0], 0.0)
    comm = total_length(tl.comm)
    overlapped = intersection_length(tl.comm, tl.compute)
    exposed = max(comm - overlapped, 0.0)
    collectives = [op for op in tl.ops if op.name not in P2P]
    return RankProfile(
        rank=tl.rank,
        wall_time_s=wall / 1e6,
        compute_time_s=max(wall - exposed, 0.0) / 1e6,
        busy_compute_s=total_length(tl.compute) / 1e6,
        comm_time_s=comm / 1e6,
        exposed_comm_s=exposed / 1e6,
        overlap=overlapped / comm if comm > 0 else 0.0,
        comm_overhead=exposed / wall if wall > 0 else 0.0,
        collectives=len(collectives),
        comm_bytes=sum(op.nbytes for op in tl.ops),
    )


def reference_rank(per_rank: Sequence[RankProfile]) -> RankProfile | None:
    """The rank that waited least: it shows the cost of communication itself; the others add
    the time they waited for it, which is imbalance (reported as such), not communication."""
    with_comm = [p for p in per_rank if p.comm_time_s > 0]
    if with_comm:
        return min(with_comm, key=lambda p: (p.comm_overhead, p.rank))
    return per_rank[0] if per_rank else None


def step_profiles(tls: Sequence[Timeline]) -> tuple[StepProfile, ...]:
    """The per-step view: the figures of each ``ProfilerStep`` span across the ranks; none
    when the ranks marked different numbers of steps (or none)."""
    counts = {len(tl.steps) for tl in tls}
    if len(counts) != 1 or counts == {0}:
        return ()
    out = []
    for index in range(counts.pop()):
        per_rank = [rank_profile(tl.window(*tl.steps[index])) for tl in tls]
        reference = reference_rank(per_rank)
        wall = max(p.wall_time_s for p in per_rank)
        compute = tuple(p.compute_time_s for p in per_rank)
        exposed = tuple(p.exposed_comm_s for p in per_rank)
        balance = load_balance(compute, exposed, step_time_s=wall)  # only its imbalance
        slowest = max(per_rank, key=lambda p: (p.compute_time_s, -p.rank))
        out.append(StepProfile(
            index=index, wall_time_s=wall,
            comm_overhead=reference.comm_overhead if reference else 0.0,
            imbalance=balance.imbalance, slowest_rank=slowest.rank,
            compute_time_s=compute, exposed_comm_s=exposed,
            chunks=_step_chunks([tl.window(*tl.steps[index]) for tl in tls])))
    return tuple(out)


def _step_chunks(windows: Sequence[Timeline]) -> tuple[StageChunk, ...]:
    """The pipeline stages' chunks of one step on every rank, in seconds after the step's
    earliest start, by stage and start."""
    begin = min(tl.region[0] for tl in windows)
    chunks = [StageChunk(tl.rank, stage, kind, mb, (start - begin) / 1e6, (end - begin) / 1e6)
              for tl in windows for kind, stage, mb, start, end in tl.chunks]
    return tuple(sorted(chunks, key=lambda c: (c.stage, c.start_s)))


def collective_stats(tls: Sequence[Timeline]) -> tuple[CollectiveStat, ...]:
    """Per collective (and send/recv): calls and bytes per rank, and time (mean over ranks)."""
    names = sorted({op.name for tl in tls for op in tl.ops})
    stats: list[CollectiveStat] = []
    for name in names:
        per_rank = [[op for op in tl.ops if op.name == name] for tl in tls]
        times = tuple(sum(op.time_us for op in ops) / 1e6 for ops in per_rank)
        stats.append(CollectiveStat(
            name=name,
            count=max(len(ops) for ops in per_rank),
            bytes=max(sum(op.nbytes for op in ops) for ops in per_rank),
            total_time_s=sum(times) / len(times) if times else 0.0,
            per_rank_time_s=times,
        ))
    stats.sort(key=lambda s: -s.total_time_s)
    return tuple(stats)


def analyse(traces: Sequence[Mapping[str, Any]], *, ranks: Sequence[int] | None = None,
            limits: Mapping[str, float] | None = None, trace_path: str = "",
            results: Sequence[Any] = ()) -> ProfileReport:
    """The :class:`ProfileReport` of the ranks' traces (rank order unless ``ranks`` says).

    ``limits``: the thresholds (``max_comm_overhead``, ``max_imbalance``) the findings use;
    the defaults where missing.
    """
    lim = resolve_thresholds(limits)
    tls = timelines(traces, ranks)
    per_rank = tuple(rank_profile(tl) for tl in tls)
    collectives = collective_stats(tls)
    desync = check_desync({tl.rank: tl.ops for tl in tls})
    sources = {tl.source for tl in tls} - {"none"}
    source = " + ".join(sorted(sources)) if sources else "none"

    reference = reference_rank(per_rank)
    comm_overhead = reference.comm_overhead if reference else 0.0
    overlap = reference.overlap if reference else 0.0

    wall = max((p.wall_time_s for p in per_rank), default=0.0)
    balance = load_balance([p.compute_time_s for p in per_rank],
                           [p.exposed_comm_s for p in per_rank], step_time_s=wall,
                           limit=lim["max_imbalance"])
    # load_balance counts positions; the profiled ranks may not be 0..n-1
    names = [p.rank for p in per_rank]
    stragglers = tuple(names[i] for i in balance.stragglers)
    shares = batch_shares([1.0 / p.compute_time_s if p.compute_time_s > 0 else None
                           for p in per_rank]) if stragglers else ()
    found = desync_bottleneck(desync, names)
    if reference is not None:
        found += _communication_findings(reference, collectives, lim)
        found += balance_bottlenecks(balance, shares, lim, span=PROFILED_CALL, ranks=names)
        found += small_message_bottlenecks([(c.name, c.count, c.bytes, c.total_time_s)
                                            for c in collectives])
    return ProfileReport(
        trace_path=trace_path,
        world_size=len(per_rank),
        comm_source=source,
        wall_time_s=wall,
        comm_overhead=comm_overhead,
        overlap=overlap,
        imbalance=balance.imbalance,
        stragglers=stragglers,
        reference_rank=reference.rank if reference else 0,
        per_rank=per_rank,
        collectives=collectives,
        desync=desync,
        bottlenecks=tuple(found),
        recommendations=tuple(recommendations(found)),
        imbalance_cv=balance.cv,
        batch_shares=tuple(shares),
        results=tuple(results),
        comm_counts=count_ops([tl.ops for tl in tls]),
        steps=step_profiles(tls),
        timings=collective_timings(tls) if not desync else (),
    )


def _communication_findings(reference: RankProfile, collectives: Sequence[CollectiveStat],
                            limits: Mapping[str, float]) -> list[Bottleneck]:
    """The communication rules on the rank that waited least, naming the collective that
    took most of the time."""
    top = collectives[0] if collectives else None
    detail = ""
    if top is not None:
        detail = (f"; most of the communication is {top.name} ({top.count} calls, "
                  f"{format_bytes(top.bytes)}, {ms(top.total_time_s)})")
    return communication_bottlenecks(
        reference.comm_overhead, reference.wall_time_s,
        reference.comm_time_s if reference.comm_time_s > 0 else None, reference.overlap,
        limits, span=PROFILED_CALL, detail=detail,
        where=f" on rank {reference.rank}, the rank that waited least")


def trace_file_name(nodeid: str, index: int = 1) -> str:
    """A file name for a test's merged trace: ``test_x.py__test_y.3.trace.json`` (its
    ``index``-th profile; see :func:`~pytest_distperf.common.files.file_stem`)."""
    stem = file_stem(nodeid)
    suffix = f".{index}" if index > 1 else ""
    return f"{stem}{suffix}.trace.json"


def profile_metrics(report: ProfileReport, prefix: str = "profile", world_size: int = 0
                    ) -> list[Metric]:
    """The metrics of a profiled call: ``<prefix>.comm_overhead``, ``<prefix>.imbalance`` and,
    where there was communication, ``<prefix>.overlap``: informational (one call has no samples to
    test; their thresholds still apply); ``<prefix>.arrival_skew_s`` (the median over the
    collectives of the spread of the ranks' arrivals, the rank that arrived last most
    often as its rank), ``<prefix>.arrival_skew`` (the same spread as a share of the
    step, one sample per collective; threshold ``max_arrival_skew``, off by default) and
    ``<prefix>.step_time_s`` (one sample per step), informational; and, exact,
    ``<prefix>.comm.<op>.calls`` and ``.bytes`` of the call (with a mesh, by dimension:
    ``<prefix>.comm.<dim>.<op>.*``).  None when the ranks were out of step."""
    if report.desync:
        return []
    hints = {b.kind: b.suggestion for b in reversed(report.bottlenecks)}
    out = [
        Metric(f"{prefix}.comm_overhead", report.comm_overhead, "fraction", False,
               threshold="max_comm_overhead", hint=hints.get("communication", ""),
               world_size=world_size, kind=INFORMATIONAL),
        Metric(f"{prefix}.imbalance", report.imbalance, "fraction", False,
               threshold="max_imbalance", ranks=report.stragglers,
               hint=hints.get("imbalance", ""), world_size=world_size, kind=INFORMATIONAL),
    ]
    if any(p.comm_time_s > 0 for p in report.per_rank):
        out.append(Metric(f"{prefix}.overlap", report.overlap, "fraction", True,
                          hint=hints.get("low_overlap", ""), world_size=world_size,
                          kind=INFORMATIONAL))
    late = report.latest_arrival()
    if late is not None:
        skews = tuple(t.skew_s for t in report.timings)
        out.append(Metric(f"{prefix}.arrival_skew_s", median_or_nan(skews), "s", False,
                          samples=skews, ranks=(late[0],), world_size=world_size,
                          kind=INFORMATIONAL))
        step = (median_or_nan([s.wall_time_s for s in report.steps]) if report.steps
                else report.wall_time_s)
        shares = tuple(min(1.0, v / step) for v in skews if math.isfinite(v))
        if step > 0 and shares:
            out.append(Metric(
                f"{prefix}.arrival_skew", median_or_nan(shares), "fraction", False,
                samples=shares, threshold="max_arrival_skew", ranks=(late[0],),
                hint=(f"rank {late[0]} arrived last at {late[1]:.0%} of the collectives "
                      "and the others waited for it: look at what it does before them "
                      "(its input, its compute, its host); report.timings has every "
                      "collective's arrivals"),
                world_size=world_size, kind=INFORMATIONAL))
    if report.steps:
        walls = tuple(s.wall_time_s for s in report.steps)
        out.append(Metric(f"{prefix}.step_time_s", median_or_nan(walls), "s", False,
                          samples=walls, world_size=world_size, kind=INFORMATIONAL))
    if report.mesh_counts:  # by mesh dimension: profile.comm.tp.all_reduce.calls
        return out + dimension_count_metrics(report.mesh_counts, f"{prefix}.comm.", world_size,
                                             "")
    return out + comm_count_metrics(report.comm_counts, f"{prefix}.comm.", world_size, "")
