"""From per-rank records to figures: phase statistics, a communication summary, load
balance, the step timer's whole analysis and scaling curves; the findings come from the
rules in :mod:`~pytest_distperf.analysis.findings`.  Pure functions: numpy at most, no torch, no
pytest.

Conventions (see docs/metrics.md for the meaning of every figure):

* A figure that cannot be measured is ``None`` (optional fields) or ``0.0`` with the reason in
  a ``missing`` list; never NaN, never a division error.
* Noise on a shared machine only ever adds time.  Per-rank compute, which the imbalance is
  built from, is therefore a low quantile of the rank's samples (``COMPUTE_QUANTILE``);
  step times are medians of the slowest rank per step, as in nccl-tests.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from pytest_distperf.analysis.findings import (
    balance_bottlenecks,
    communication_bottlenecks,
    launch_bottlenecks,
    memory_bottlenecks,
    node_bottlenecks,
    recommendations,
    scaling_bottlenecks,
)
from pytest_distperf.analysis.topology import spans_nodes, split_by_node
from pytest_distperf.common.quantiles import (
    finite,
    median,
    median_or_nan,
    quantile,
    quantile_or_nan,
)
from pytest_distperf.common.shares import batch_shares
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.results.group import NodeSplit, PairMatrix
from pytest_distperf.fixtures.results.steps import (
    CommCount,
    CommSummary,
    DeviceFigures,
    LoadBalance,
    RankTiming,
    ScalingPoint,
    ScalingResult,
    StepTiming,
)
from pytest_distperf.records import CommCall, PhaseStats, RankStep

#: Per-rank compute time is this quantile of the rank's steps without synchronisation.
COMPUTE_QUANTILE = 0.25
PHASES = ("forward", "backward", "optimizer", "step", "no_sync_step")


# -- small statistics ----------------------------------------------------------------------
def _clean(value: float | None) -> float | None:
    """The value as a finite float, or None."""
    kept = finite([value])
    return kept[0] if kept else None


def _finite(values: Iterable[float | None]) -> np.ndarray:
    return np.array(finite(values), dtype=float)


def _clamp01(value: float) -> float:
    return min(1.0, max(0.0, value))


def _ratio(num: float, den: float) -> float:
    """num / den, 0.0 when the denominator is not positive or the result is not finite."""
    if not den > 0:
        return 0.0
    out = num / den
    return out if math.isfinite(out) else 0.0


def phase_stats(samples: Iterable[float | None]) -> PhaseStats:
    """Median, extremes, quartiles and relative spread of one phase's samples (seconds)."""
    data = _finite(samples)
    if data.size == 0:
        return PhaseStats(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    p25, med, p75 = (quantile_or_nan(data, q) for q in (0.25, 0.5, 0.75))
    return PhaseStats(int(data.size), med, float(data.min()), p25, p75, float(data.max()),
                      _ratio(p75 - p25, med))


def per_step_max(rows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per step, the slowest rank's value (over the ranks that have a sample of that step)."""
    length = max((len(r) for r in rows), default=0)
    out: list[float] = []
    for k in range(length):
        column = _finite(r[k] for r in rows if k < len(r))
        if column.size:
            out.append(float(column.max()))
    return tuple(out)


# -- communication ---------------------------------------------------------------------------
def communication_summary(calls: Iterable[CommCall]) -> list[CommSummary]:
    """Per collective type: count, bytes, time, average and peak bandwidth, the slowest call.

    Most time first.  Calls with a zero, negative or unknown time count towards ``count`` and
    ``total_bytes`` but not towards the time and the bandwidths.
    """
    by_op: dict[str, list[CommCall]] = {}
    for call in calls:
        by_op.setdefault(call.op, []).append(call)
    out: list[CommSummary] = []
    for op, group in by_op.items():
        total_bytes = sum(max(0, c.nbytes) for c in group)
        timed = [c for c in group if math.isfinite(c.time_s) and c.time_s > 0]
        total_time = sum(c.time_s for c in timed)
        peak = max((c.nbytes / c.time_s / 1e9 for c in timed), default=0.0)
        slowest = max(timed, key=lambda c: c.time_s) if timed else None
        timed_bytes = sum(max(0, c.nbytes) for c in timed)
        out.append(CommSummary(op, len(group), total_bytes, total_time,
                               _ratio(timed_bytes, total_time) / 1e9, peak, slowest))
    return sorted(out, key=lambda s: (-s.total_time_s, s.op))


# -- load balance --------------------------------------------------------------------------
def load_balance(compute_s: Sequence[float | None], wait_s: Sequence[float | None] = (),
                 *, step_time_s: float = 0.0, limit: float | None = None,
                 paired: Paired | None = None) -> LoadBalance:
    """Imbalance, coefficient of variation, stragglers and idle time from per-rank figures.

    ``compute_s[r]`` is rank r's compute time per step (None or NaN: missing, left out);
    ``wait_s[r]`` the time it waited for others per step.  A straggler is a rank whose compute
    exceeds the median rank's by more than ``limit / 2`` of it, in a group whose imbalance
    reaches ``limit`` (with two ranks: the slower one, exactly when imbalance >= limit);
    ``limit`` defaults to the ``max_imbalance`` threshold.  ``paired`` (from
    :func:`paired_steps`, for ranks whose steps start together) gives the imbalance and
    each rank's excess step by step instead: the host's speed changes between steps,
    and comparing each rank's own quantile mistakes that for imbalance.
    """
    if limit is None:
        limit = resolve_thresholds()["max_imbalance"]
    n = len(compute_s)
    cleaned = [_clean(c) for c in compute_s]
    valid = [r for r in range(n) if (cleaned[r] or 0.0) >= 0 and cleaned[r] is not None]
    missing = tuple(r for r in range(n) if r not in valid)
    values = [float(cleaned[r] or 0.0) for r in valid]
    imbalance = cv = 0.0
    stragglers: tuple[int, ...] = ()
    if len(values) >= 2:
        mean = sum(values) / len(values)
        imbalance = _ratio(max(values) - min(values), mean)
        cv = _ratio(float(np.std(np.array(values))), mean)
        if paired is not None:
            imbalance = paired.imbalance
            if imbalance >= limit and imbalance > 0:
                stragglers = tuple(r for r in valid if r < len(paired.excess)
                                   and (paired.excess[r] or 0.0) > limit / 2.0)
        elif imbalance >= limit and imbalance > 0:
            mid = median_or_nan(values)
            cut = mid * (1.0 + limit / 2.0)
            stragglers = tuple(r for r, v in zip(valid, values, strict=True)
                               if v > cut and v > mid)
    waits: list[float] = []
    for r in range(n):
        w = _clean(wait_s[r]) if r < len(wait_s) else None
        waits.append(max(0.0, w) if w is not None else 0.0)
    compute = tuple(float(cleaned[r] or 0.0) if r in valid else 0.0 for r in range(n))
    idle = tuple(_clamp01(_ratio(w, step_time_s)) for w in waits)
    return LoadBalance(compute, tuple(waits), idle, imbalance, cv, stragglers, missing)


@dataclasses.dataclass(frozen=True, slots=True)
class Paired:
    """Load balance step by step: the median over steps of (max - min) / mean of the ranks'
    times, and per rank the median over steps of its time's excess over the step's median
    rank ((t - median) / median; None for a rank without steps)."""

    imbalance: float
    excess: tuple[float | None, ...]


def paired_steps(rows: Sequence[Sequence[float]]) -> Paired | None:
    """:class:`Paired` from per-rank step times (``rows[r][k]``: rank r's step k; the steps
    of all ranks start together, at a barrier).  None with fewer than two ranks or no step
    every rank has."""
    length = min((len(r) for r in rows), default=0)
    if len(rows) < 2 or length == 0:
        return None
    excess: list[list[float]] = [[] for _ in rows]
    for k in range(length):
        column = [float(r[k]) for r in rows]
        if not all(math.isfinite(v) and v >= 0 for v in column):
            continue
        mid = median_or_nan(column)
        for r, v in enumerate(column):
            excess[r].append(_ratio(v - mid, mid))
    if not excess[0]:
        return None
    # the same per-step figures as the imbalance metric's samples
    return Paired(median_or_nan(_imbalance_per_step(rows)),
                  tuple(median_or_nan(e) if e else None for e in excess))


# -- the step timer ------------------------------------------------------------------------
def analyze_steps(per_rank: Sequence[RankStep], *, wrapper: str = "ddp",
                  limits: Mapping[str, float] | None = None,
                  comm_counts: Sequence[CommCount] = (),
                  device_busy_s: Sequence[float] = (),
                  device: Sequence[DeviceFigures] = ()) -> StepTiming:
    """Everything ``ddp_step_timer`` reports, from the ranks' raw samples.

    * step time: median over steps of the slowest rank's synchronised step;
    * compute time: the same over steps without gradient synchronisation;
    * comm overhead: (step - compute) / step, clamped to 0..1 (0 without no-sync samples),
      from the ``COMPUTE_QUANTILE`` of both per-step series rather than their medians;
    * per rank: compute = the ``COMPUTE_QUANTILE`` of its no-sync steps; blocked = the median
      of (synchronised - no-sync step); wait = blocked - the least blocked rank's;
    * total communication: the least-waiting rank's per-step comm time (comm hook); overlap =
      1 - exposed / total; buckets: the most any rank's comm hook saw in a step;
    * ``comm_counts``: one step's collectives, counted from its trace, kept as they are;
    * ``device_busy_s``: per rank, the seconds its GPU ran kernels in that step; their median
      is the device time, over the step time the busy share (``launch_bound`` below half);
    * ``device``: per rank, what its host asked of its GPU in that step, kept as it is.
    """
    if not per_rank:
        raise ValueError("analyze_steps: no per-rank records to analyse")
    lim = resolve_thresholds(limits)
    ranks = sorted(per_rank, key=lambda r: r.rank)
    steps_s = per_step_max([r.step_s for r in ranks])
    no_sync_s = per_step_max([r.no_sync_step_s for r in ranks])
    step_time = median(steps_s) or 0.0
    compute_time = median(no_sync_s)
    if compute_time is None:
        compute_time = step_time
    comm_overhead = _exposed_share(steps_s, no_sync_s)
    compute, balance = _rank_balance(ranks, step_time, lim["max_imbalance"])
    comm_times = [median(r.comm_time_s) for r in ranks]
    comm_time, overlap = _comm_and_overlap(comm_times, comm_overhead * step_time)

    total_batch = sum(max(0, r.batch_size) for r in ranks)
    by_rank = {r.rank: r for r in ranks}
    rank_throughput = [None if c is None else _ratio(by_rank[k].batch_size, c)
                       for k, c in enumerate(compute)]
    shares = (batch_shares(rank_throughput)
              if len(ranks) >= 2 and balance.imbalance >= lim["max_imbalance"] else ())
    per_rank_timing = _rank_timings(ranks, balance, comm_times, rank_throughput)
    busy = median(device_busy_s)
    device_busy = _clamp01(busy / step_time) if busy is not None and step_time > 0 else None
    bottlenecks = (communication_bottlenecks(comm_overhead, step_time, comm_time, overlap, lim)
                   + balance_bottlenecks(balance, shares, lim)
                   + memory_bottlenecks(per_rank_timing)
                   + launch_bottlenecks(device_busy, step_time))
    return StepTiming(
        world_size=len(ranks), wrapper=wrapper, steps=len(steps_s), step_time_s=step_time,
        compute_time_s=compute_time, comm_overhead=comm_overhead,
        imbalance=balance.imbalance, stragglers=list(balance.stragglers),
        per_rank=per_rank_timing, throughput=_ratio(total_batch, step_time),
        bottlenecks=bottlenecks, recommendations=recommendations(bottlenecks, shares),
        comm_time_s=comm_time, overlap=overlap, imbalance_cv=balance.cv, batch_shares=shares,
        phases=_group_phases(ranks, steps_s, no_sync_s),
        communication=communication_summary(c for r in ranks for c in r.comm),
        load_balance=balance, samples=_step_samples(ranks, steps_s, no_sync_s, total_batch),
        raw=list(by_rank.values()), comm_counts=tuple(comm_counts),
        buckets=max((r.buckets for r in ranks if r.buckets is not None), default=None),
        flops_per_step=sum(r.flops for r in ranks) if all(r.flops for r in ranks) else 0,
        device_busy=device_busy, device_time_s=busy, device=tuple(device))


def _comm_and_overlap(comm_times: Sequence[float | None], exposed_s: float
                      ) -> tuple[float | None, float | None]:
    """The least-waiting rank's communication time, and the share of it hidden behind
    compute (None, None without a comm hook's figures)."""
    known = [c for c in comm_times if c is not None]
    comm_time = min(known) if known else None
    if comm_time is None or comm_time <= 0:
        return comm_time, None
    return comm_time, _clamp01(1.0 - exposed_s / comm_time)


def _rank_timings(ranks: Sequence[RankStep], balance: LoadBalance,
                  comm_times: Sequence[float | None],
                  throughput: Sequence[float | None]) -> list[RankTiming]:
    """One :class:`RankTiming` per rank, in rank order."""
    return [
        RankTiming(
            rank=r.rank, batch_size=r.batch_size,
            step_time_s=median(r.step_s) or 0.0,
            compute_time_s=balance.compute_s[r.rank],
            wait_time_s=balance.wait_s[r.rank], idle_fraction=balance.idle_fraction[r.rank],
            comm_time_s=comm_times[i], throughput=throughput[r.rank] or 0.0,
            peak_memory_bytes=r.peak_memory_bytes, memory_source=r.memory_source,
            memory_capacity_bytes=r.memory_capacity_bytes,
            straggler=r.rank in balance.stragglers, phases=_rank_phases(r))
        for i, r in enumerate(ranks)]


def _exposed_share(steps_s: Sequence[float], no_sync_s: Sequence[float]) -> float:
    """(step - compute) / step from the fast ends of both distributions, clamped to 0..1:
    noise only adds time, and it adds it to both kinds of step; the medians' difference
    carries that noise."""
    fast_step = quantile(steps_s, COMPUTE_QUANTILE) or 0.0
    fast_no_sync = quantile(no_sync_s, COMPUTE_QUANTILE)
    if fast_no_sync is None:
        fast_no_sync = fast_step
    return _clamp01(_ratio(fast_step - fast_no_sync, fast_step))


def _rank_balance(ranks: Sequence[RankStep], step_time: float,
                  limit: float) -> tuple[list[float | None], LoadBalance]:
    """(per-rank compute, the load balance) on dense per-rank lists (index = rank number;
    a rank without a record is missing there)."""
    size = max(r.rank for r in ranks) + 1
    compute: list[float | None] = [None] * size
    blocked: list[float | None] = [None] * size
    for r in ranks:
        compute[r.rank] = quantile(r.no_sync_step_s, COMPUTE_QUANTILE)
        pairs = zip(r.step_s, r.no_sync_step_s, strict=False)
        blocked[r.rank] = median(max(0.0, s - u) for s, u in pairs)
    known_blocked = [b for b in blocked if b is not None]
    least = min(known_blocked) if known_blocked else 0.0
    waits: list[float | None] = [None if b is None else b - least for b in blocked]
    paired = None
    if [r.rank for r in ranks] == list(range(size)):  # every rank: steps pair up
        paired = paired_steps([r.no_sync_step_s for r in ranks])
    return compute, load_balance(compute, waits, step_time_s=step_time, limit=limit,
                                 paired=paired)


def _group_phases(ranks: Sequence[RankStep], steps_s: Sequence[float],
                  no_sync_s: Sequence[float]) -> dict[str, PhaseStats]:
    return {
        "forward": phase_stats(per_step_max([r.forward_s for r in ranks])),
        "backward": phase_stats(per_step_max([r.backward_s for r in ranks])),
        "optimizer": phase_stats(per_step_max([r.optimizer_s for r in ranks])),
        "step": phase_stats(steps_s),
        "no_sync_step": phase_stats(no_sync_s),
    }


def _step_samples(ranks: Sequence[RankStep], steps_s: Sequence[float],
                  no_sync_s: Sequence[float], total_batch: int) -> dict[str, tuple[float, ...]]:
    """The per-step values behind the recorded metrics."""
    return {
        "step_s": tuple(steps_s),
        "no_sync_step_s": tuple(no_sync_s),
        "throughput": tuple(_ratio(total_batch, s) for s in steps_s),
        "comm_overhead": tuple(_clamp01(_ratio(s - u, s)) for s, u in
                               zip(steps_s, no_sync_s, strict=False)),
        "exposed_comm_s": tuple(max(0.0, s - u) for s, u in
                                zip(steps_s, no_sync_s, strict=False)),
        "imbalance": _imbalance_per_step([r.no_sync_step_s for r in ranks]),
        **({"control_s": per_step_max([r.control_s for r in ranks])}
           if all(len(r.control_s) == len(r.step_s) > 0 for r in ranks) else {}),
        **({"memory_control_s": per_step_max([r.memory_control_s for r in ranks])}
           if all(len(r.memory_control_s) == len(r.step_s) > 0 for r in ranks) else {}),
        **({"host_control_s": per_step_max([r.host_control_s for r in ranks])}
           if all(r.host_control_s for r in ranks) else {}),
    }


def _rank_phases(r: RankStep) -> dict[str, PhaseStats]:
    return {"forward": phase_stats(r.forward_s), "backward": phase_stats(r.backward_s),
            "optimizer": phase_stats(r.optimizer_s), "step": phase_stats(r.step_s),
            "no_sync_step": phase_stats(r.no_sync_step_s)}


def _imbalance_per_step(rows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per step, (max - min) / mean over the ranks that have that step (0 with one rank)."""
    length = min((len(r) for r in rows), default=0)
    out = []
    for k in range(length):
        column = _finite(r[k] for r in rows)
        if column.size >= 2:
            out.append(_ratio(float(column.max() - column.min()), float(column.mean())))
        else:
            out.append(0.0)
    return tuple(out)


# -- scaling ----------------------------------------------------------------------------------
def scaling_result(timings: Sequence[StepTiming], mode: str = "weak", *,
                   limits: Mapping[str, float] | None = None) -> ScalingResult:
    """Speedup and efficiency per world size, relative to the smallest one (s).

    weak (fixed per-rank batch): efficiency_N = (throughput_N / N) / (throughput_s / s);
    strong (fixed global batch): efficiency_N = (s * T_s) / (N * T_N), T the step time.
    A point whose time is zero or missing has efficiency 0.0 (and is reported).
    """
    if mode not in ("weak", "strong"):
        raise ValueError(f"scaling mode must be 'weak' or 'strong', got {mode!r}")
    if not timings:
        raise ValueError("scaling_result: no step timings to compare")
    lim = resolve_thresholds(limits)
    ordered = sorted(timings, key=lambda t: t.world_size)
    base = ordered[0]
    s = base.world_size
    points: list[ScalingPoint] = []
    for t in ordered:
        n = t.world_size
        steps = t.samples.get("step_s", ())
        if t is base:
            speedup = efficiency = 1.0
            eff_samples = tuple(1.0 for _ in steps)
        elif mode == "weak":
            speedup = _ratio(t.throughput, base.throughput)
            efficiency = speedup * s / n
            batch = t.throughput * t.step_time_s
            eff_samples = tuple(_ratio(_ratio(batch, x) * s, n * base.throughput) for x in steps)
        else:
            speedup = _ratio(base.step_time_s, t.step_time_s)
            efficiency = speedup * s / n
            eff_samples = tuple(_ratio(s * base.step_time_s, n * x) for x in steps)
        points.append(ScalingPoint(n, t.step_time_s, t.throughput, speedup, efficiency,
                                   t.comm_overhead, t.imbalance, eff_samples, tuple(steps)))
    found = scaling_bottlenecks(points, mode, lim)
    return ScalingResult(mode, points, found, recommendations(found))


# -- the pair matrix by node ------------------------------------------------------------------
def pairs_by_node(matrix: PairMatrix, nodes: Sequence[str]) -> NodeSplit | None:
    """``bench_pairs`` seen by node, with its findings (slow nodes, slow links between
    nodes); None when every rank runs on one node.  ``nodes[r]`` is rank r's node
    (:func:`pytest_distperf.analysis.topology.node_names`)."""
    if not spans_nodes(nodes[:matrix.world_size]):
        return None
    split = split_by_node(matrix, nodes)
    return dataclasses.replace(split, bottlenecks=tuple(node_bottlenecks(split)))
