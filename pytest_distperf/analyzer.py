"""From per-rank records to findings: phase statistics, a communication summary, load
balance, bottlenecks and recommendations.  Pure functions: numpy at most, no torch, no pytest.

Conventions (see docs/metrics.md for the meaning of every figure):

* A figure that cannot be measured is ``None`` (optional fields) or ``0.0`` with the reason in
  a ``missing`` list; never NaN, never a division error.
* Noise on a shared machine only ever adds time.  Per-rank compute, which the imbalance is
  built from, is therefore a low quantile of the rank's samples (``COMPUTE_QUANTILE``);
  step times are medians of the slowest rank per step, as in nccl-tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from pytest_distperf.config import DEFAULT_THRESHOLDS
from pytest_distperf.records import (
    Bottleneck,
    CommCall,
    CommSummary,
    LoadBalance,
    PhaseStats,
    RankStep,
    RankTiming,
    ScalingPoint,
    ScalingResult,
    StepTiming,
)

#: Per-rank compute time is this quantile of the rank's steps without synchronisation.
COMPUTE_QUANTILE = 0.25
#: The smallest share of the global batch a rebalancing suggestion gives any rank.
MIN_BATCH_SHARE = 0.05
#: Below this overlap (hidden / total communication) a communication-heavy step is flagged.
MIN_OVERLAP = 0.5
#: Peak memory above this fraction of the capacity is a memory bottleneck.
MEMORY_LIMIT = 0.90
#: Bottleneck kinds, in the order the analyzer reports them.
KINDS = ("communication", "low_overlap", "imbalance", "straggler", "memory", "low_scaling")
PHASES = ("forward", "backward", "optimizer", "step", "no_sync_step")

GENERIC_SUGGESTIONS: dict[str, str] = {
    "communication": (
        "synchronise less per sample (a larger per-rank batch or gradient accumulation), "
        "shrink what is synchronised (a bf16/fp16 compression comm hook), let it overlap with "
        "backward (DDP bucket_cap_mb, avoid find_unused_parameters), and on GPUs check the "
        "links with nccl_group.bench"),
    "low_overlap": (
        "gradient communication waits for the end of backward: avoid "
        "find_unused_parameters=True, try static_graph=True and a smaller bucket_cap_mb so "
        "the first buckets leave early, and keep extra work out of backward hooks"),
    "imbalance": (
        "give every rank the same amount of work: equal batch shapes (padding, bucketing by "
        "sequence length), or per-rank batch shares proportional to measured throughput"),
    "straggler": (
        "look at what else runs on that rank's device or host (other processes, data "
        "loading, thermal throttling, a slower device or link); meanwhile give it a smaller "
        "share of the batch"),
    "memory": (
        "lower the peak: activation checkpointing, a smaller per-rank batch, mixed precision, "
        "or sharding parameters, gradients and optimizer state (FSDP)"),
    "low_scaling": (
        "find what grows with the world size: communication (see comm_overhead per world "
        "size), imbalance between ranks, or fixed per-step costs that more ranks cannot share"),
}


# -- small statistics ----------------------------------------------------------------------
def _clean(value: float | None) -> float | None:
    """The value as a finite float, or None."""
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _finite(values: Iterable[float | None]) -> np.ndarray:
    return np.array([c for c in map(_clean, values) if c is not None], dtype=float)


def quantile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q`` quantile (linear interpolation) of the finite values; None when there are none."""
    data = _finite(values)
    if data.size == 0:
        return None
    return float(np.quantile(data, q))


def median(values: Iterable[float | None]) -> float | None:
    return quantile(values, 0.5)


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
    p25, med, p75 = (float(v) for v in np.quantile(data, [0.25, 0.5, 0.75]))
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


def interval_union(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals (overlaps counted once)."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted((s, e) for s, e in intervals if e > s):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def severity(value: float, limit: float, *, higher_is_worse: bool = True) -> str:
    """``low``, ``medium`` or ``high``: how far ``value`` is past ``limit`` (x1.25, x2)."""
    if higher_is_worse:
        ratio = value / limit if limit > 0 else (math.inf if value > 0 else 1.0)
    else:
        ratio = limit / value if value > 0 else math.inf
    if ratio >= 2.0:
        return "high"
    return "medium" if ratio >= 1.25 else "low"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


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
                 *, step_time_s: float = 0.0,
                 limit: float = DEFAULT_THRESHOLDS["max_imbalance"]) -> LoadBalance:
    """Imbalance, coefficient of variation, stragglers and idle time from per-rank figures.

    ``compute_s[r]`` is rank r's compute time per step (None or NaN: missing, left out);
    ``wait_s[r]`` the time it waited for others per step.  A straggler is a rank whose compute
    exceeds the median rank's by more than ``limit / 2`` of it, in a group whose imbalance
    reaches ``limit`` (with two ranks: the slower one, exactly when imbalance >= limit).
    """
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
        if imbalance >= limit and imbalance > 0:
            mid = float(np.median(np.array(values)))
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


def batch_shares(throughput: Sequence[float | None],
                 min_share: float = MIN_BATCH_SHARE) -> tuple[float, ...]:
    """Per-rank shares of the global batch proportional to measured throughput, each at least
    ``min_share``, summing to 1.

    Ranks without a usable throughput get the mean of the others'; with none usable, or when
    ``min_share`` leaves no room (n * min_share >= 1), the shares are equal.
    """
    n = len(throughput)
    if n == 0:
        return ()
    values = [float(t) if t is not None and math.isfinite(float(t)) and float(t) > 0 else None
              for t in throughput]
    known = [v for v in values if v is not None]
    if not known or n * min_share >= 1.0:
        return tuple([1.0 / n] * n)
    fill = sum(known) / len(known)
    weights = np.array([v if v is not None else fill for v in values], dtype=float)
    fixed = np.zeros(n, dtype=bool)
    shares = weights / weights.sum()
    while True:
        low = (shares < min_share) & ~fixed
        if not low.any():
            break
        fixed |= low
        free = ~fixed
        shares[fixed] = min_share
        shares[free] = weights[free] / weights[free].sum() * (1.0 - min_share * fixed.sum())
    return tuple(float(s) for s in shares)


def format_shares(shares: Sequence[float]) -> str:
    return ", ".join(f"rank {r}: {s:.0%}" for r, s in enumerate(shares))


# -- bottlenecks and recommendations ---------------------------------------------------------
def communication_bottlenecks(comm_overhead: float, step_time_s: float,
                              comm_time_s: float | None, overlap: float | None,
                              limits: Mapping[str, float]) -> list[Bottleneck]:
    """``communication`` when the exposed share reaches its limit; ``low_overlap`` when a
    step with a noticeable exposed share (half the limit) hides less than MIN_OVERLAP of it."""
    out: list[Bottleneck] = []
    limit = limits["max_comm_overhead"]
    exposed = comm_overhead * step_time_s
    if comm_overhead >= limit:
        total = f", {_ms(comm_time_s)} in all" if comm_time_s else ""
        out.append(Bottleneck(
            "communication", severity(comm_overhead, limit), (),
            f"exposed communication is {comm_overhead:.0%} of the step "
            f"({_ms(exposed)} of {_ms(step_time_s)} per step{total}); limit {limit:.0%}",
            GENERIC_SUGGESTIONS["communication"], comm_overhead, limit))
    if (overlap is not None and overlap < MIN_OVERLAP and comm_time_s
            and comm_overhead >= limit / 2):
        out.append(Bottleneck(
            "low_overlap", severity(overlap, MIN_OVERLAP, higher_is_worse=False), (),
            f"only {overlap:.0%} of the {_ms(comm_time_s)} of communication per step is "
            f"hidden behind computation", GENERIC_SUGGESTIONS["low_overlap"],
            overlap, MIN_OVERLAP))
    return out


def balance_bottlenecks(balance: LoadBalance, shares: Sequence[float],
                        limits: Mapping[str, float]) -> list[Bottleneck]:
    """``imbalance`` for the group and one ``straggler`` per straggling rank."""
    limit = limits["max_imbalance"]
    if balance.imbalance < limit or len(balance.compute_s) < 2:
        return []
    valid = [r for r in range(len(balance.compute_s)) if r not in balance.missing]
    computes = [balance.compute_s[r] for r in valid]
    slowest = valid[int(np.argmax(computes))]
    ranks = balance.stragglers or (slowest,)
    waiting = [r for r in valid if r not in ranks and balance.wait_s[r] > 0]
    wait_text = ""
    if waiting:
        worst = max(waiting, key=lambda r: balance.wait_s[r])
        wait_text = (f"; rank {worst} waits {_ms(balance.wait_s[worst])} per step "
                     f"({balance.idle_fraction[worst]:.0%} of the step)")
    suggestion = imbalance_suggestion(ranks, shares)
    out = [Bottleneck(
        "imbalance", severity(balance.imbalance, limit), tuple(ranks),
        f"per-rank compute differs by {balance.imbalance:.0%} of the mean (cv "
        f"{balance.cv:.2f}; fastest {_ms(min(computes))}, slowest {_ms(max(computes))} per "
        f"step){wait_text}; limit {limit:.0%}",
        suggestion, balance.imbalance, limit)]
    for r in balance.stragglers:
        others = [balance.compute_s[o] for o in valid if o not in balance.stragglers]
        mid = float(np.median(np.array(others))) if others else float(np.median(computes))
        slower = _ratio(balance.compute_s[r] - mid, mid)
        out.append(Bottleneck(
            "straggler", severity(balance.imbalance, limit), (r,),
            f"rank {r} computes {slower:.0%} longer than the other ranks' median "
            f"({_ms(balance.compute_s[r])} vs {_ms(mid)} per step) and waits least "
            f"({_ms(balance.wait_s[r])} per step): the other ranks wait for it",
            f"look at what else runs on rank {r}'s device or host (other processes, data "
            f"loading, thermal throttling, a slower device or link)"
            + (f"; meanwhile shift work away from it ({format_shares(shares)})"
               if shares else ""),
            slower, limit / 2))
    return out


def imbalance_suggestion(ranks: Sequence[int], shares: Sequence[float]) -> str:
    """What to do about an imbalance: the batch shares, and where to look."""
    text = ""
    if shares:
        text = (f"rebalance the per-rank batch to {format_shares(shares)} of the global batch "
                f"(proportional to measured throughput, each at least "
                f"{MIN_BATCH_SHARE:.0%}); ")
    who = ", ".join(map(str, ranks))
    if not ranks:
        return text + GENERIC_SUGGESTIONS["imbalance"]
    return text + (f"or find why rank(s) {who} compute longer (other processes, data loading, "
                   f"thermal throttling, uneven inputs, a slower device)")


def memory_bottlenecks(per_rank: Sequence[RankTiming],
                       limit: float = MEMORY_LIMIT) -> list[Bottleneck]:
    """``memory`` when a rank's peak reaches ``limit`` of its capacity (where it is known)."""
    fractions = {r.rank: r.peak_memory_bytes / r.memory_capacity_bytes
                 for r in per_rank if r.memory_capacity_bytes > 0 and r.peak_memory_bytes > 0}
    high = {r: f for r, f in fractions.items() if f >= limit}
    if not high:
        return []
    worst = max(high, key=lambda r: high[r])
    frac = high[worst]
    level = "high" if frac >= 0.97 else "medium" if frac >= 0.93 else "low"
    source = next((r.memory_source for r in per_rank if r.rank == worst), "")
    return [Bottleneck(
        "memory", level, tuple(sorted(high)),
        f"peak memory reaches {frac:.0%} of the capacity on rank {worst} ({source}); "
        f"limit {limit:.0%}", GENERIC_SUGGESTIONS["memory"], frac, limit)]


_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def recommendations(bottlenecks: Sequence[Bottleneck],
                    shares: Sequence[float] = ()) -> list[str]:
    """One line per distinct suggestion, most severe first; the batch shares when suggested."""
    out: list[str] = []
    ordered = sorted(bottlenecks, key=lambda b: (_SEVERITY_ORDER.get(b.severity, 3),
                                                 KINDS.index(b.kind) if b.kind in KINDS else 9))
    for b in ordered:
        where = f" (ranks {', '.join(map(str, b.ranks))})" if b.ranks else ""
        line = f"{b.kind}{where}: {b.suggestion}"
        if line not in out:
            out.append(line)
    if shares and not any("rebalance the per-rank batch" in line for line in out):
        out.append(f"batch shares: {format_shares(shares)}")
    return out


def hint(timing: StepTiming, kind: str) -> str:
    """The suggestion for a metric's breach: the analyzer's finding, or a generic one."""
    for b in timing.bottlenecks:
        if b.kind == kind:
            return b.suggestion
    if kind == "imbalance":
        return imbalance_suggestion(timing.stragglers, timing.batch_shares)
    return GENERIC_SUGGESTIONS.get(kind, "")


# -- the step timer ------------------------------------------------------------------------
def analyze_steps(per_rank: Sequence[RankStep], *, wrapper: str = "ddp",
                  limits: Mapping[str, float] | None = None) -> StepTiming:
    """Everything ``ddp_step_timer`` reports, from the ranks' raw samples.

    * step time: median over steps of the slowest rank's synchronised step;
    * compute time: the same over steps without gradient synchronisation;
    * comm overhead: (step - compute) / step, clamped to 0..1 (0 without no-sync samples),
      from the ``COMPUTE_QUANTILE`` of both per-step series rather than their medians;
    * per rank: compute = the ``COMPUTE_QUANTILE`` of its no-sync steps; blocked = the median
      of (its synchronised step - its no-sync step); wait = blocked - the least blocked rank's
      (the rank the others wait for waits least);
    * total communication: the least-waiting rank's per-step comm time (comm hook); overlap =
      1 - exposed / total.
    """
    if not per_rank:
        raise ValueError("analyze_steps: no per-rank records to analyse")
    lim = {**DEFAULT_THRESHOLDS, **(limits or {})}
    ranks = sorted(per_rank, key=lambda r: r.rank)
    n = len(ranks)
    steps_s = per_step_max([r.step_s for r in ranks])
    no_sync_s = per_step_max([r.no_sync_step_s for r in ranks])
    step_time = median(steps_s) or 0.0
    compute_time = median(no_sync_s)
    if compute_time is None:
        compute_time = step_time
    # The exposed share from the fast ends of both distributions: noise only adds time, and
    # it adds it to both kinds of step; the medians' difference carries that noise.
    fast_step = quantile(steps_s, COMPUTE_QUANTILE) or 0.0
    fast_no_sync = quantile(no_sync_s, COMPUTE_QUANTILE)
    if fast_no_sync is None:
        fast_no_sync = fast_step
    comm_overhead = _clamp01(_ratio(fast_step - fast_no_sync, fast_step))
    exposed = comm_overhead * step_time

    # Load balance works on dense per-rank lists (index = rank number); a rank without a
    # record is missing there.
    size = max(r.rank for r in ranks) + 1
    by_rank = {r.rank: r for r in ranks}
    compute: list[float | None] = [None] * size
    blocked: list[float | None] = [None] * size
    for r in ranks:
        compute[r.rank] = quantile(r.no_sync_step_s, COMPUTE_QUANTILE)
        pairs = zip(r.step_s, r.no_sync_step_s, strict=False)
        blocked[r.rank] = median(max(0.0, s - u) for s, u in pairs)
    known_blocked = [b for b in blocked if b is not None]
    least = min(known_blocked) if known_blocked else 0.0
    waits: list[float | None] = [None if b is None else b - least for b in blocked]
    balance = load_balance(compute, waits, step_time_s=step_time, limit=lim["max_imbalance"])

    comm_times = [median(r.comm_time_s) for r in ranks]
    known_comm = [c for c in comm_times if c is not None]
    comm_time = min(known_comm) if known_comm else None
    overlap = (_clamp01(1.0 - exposed / comm_time)
               if comm_time is not None and comm_time > 0 else None)

    total_batch = sum(max(0, r.batch_size) for r in ranks)
    throughput = _ratio(total_batch, step_time)
    rank_throughput: list[float | None] = [None] * size
    for r in ranks:
        c = compute[r.rank]
        rank_throughput[r.rank] = _ratio(r.batch_size, c) if c is not None else None
    shares = (batch_shares(rank_throughput)
              if n >= 2 and balance.imbalance >= lim["max_imbalance"] else ())

    per_rank_timing = [
        RankTiming(
            rank=r.rank, batch_size=r.batch_size,
            step_time_s=median(r.step_s) or 0.0,
            compute_time_s=balance.compute_s[r.rank],
            wait_time_s=balance.wait_s[r.rank], idle_fraction=balance.idle_fraction[r.rank],
            comm_time_s=comm_times[i], throughput=rank_throughput[r.rank] or 0.0,
            peak_memory_bytes=r.peak_memory_bytes, memory_source=r.memory_source,
            memory_capacity_bytes=r.memory_capacity_bytes,
            straggler=r.rank in balance.stragglers, phases=_rank_phases(r))
        for i, r in enumerate(ranks)]
    group_phases = {
        "forward": phase_stats(per_step_max([r.forward_s for r in ranks])),
        "backward": phase_stats(per_step_max([r.backward_s for r in ranks])),
        "optimizer": phase_stats(per_step_max([r.optimizer_s for r in ranks])),
        "step": phase_stats(steps_s),
        "no_sync_step": phase_stats(no_sync_s),
    }
    bottlenecks = (communication_bottlenecks(comm_overhead, step_time, comm_time, overlap, lim)
                   + balance_bottlenecks(balance, shares, lim)
                   + memory_bottlenecks(per_rank_timing))
    samples = {
        "step_s": steps_s,
        "no_sync_step_s": no_sync_s,
        "throughput": tuple(_ratio(total_batch, s) for s in steps_s),
        "comm_overhead": tuple(_clamp01(_ratio(s - u, s)) for s, u in
                               zip(steps_s, no_sync_s, strict=False)),
        "imbalance": _imbalance_per_step([r.no_sync_step_s for r in ranks]),
    }
    return StepTiming(
        world_size=n, wrapper=wrapper, steps=len(steps_s), step_time_s=step_time,
        compute_time_s=compute_time, comm_overhead=comm_overhead,
        imbalance=balance.imbalance, stragglers=list(balance.stragglers),
        per_rank=per_rank_timing, throughput=throughput, bottlenecks=bottlenecks,
        recommendations=recommendations(bottlenecks, shares), comm_time_s=comm_time,
        overlap=overlap, imbalance_cv=balance.cv, batch_shares=shares,
        phases=group_phases,
        communication=communication_summary(c for r in ranks for c in r.comm),
        load_balance=balance, samples=samples, raw=list(by_rank.values()))


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
    lim = {**DEFAULT_THRESHOLDS, **(limits or {})}
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


def scaling_bottlenecks(points: Sequence[ScalingPoint], mode: str,
                        limits: Mapping[str, float]) -> list[Bottleneck]:
    """``low_scaling`` for each world size below ``min_scaling_efficiency``, with the likely
    cause: growing communication, imbalance, or neither (fixed per-step costs)."""
    if not points:
        return []
    limit = limits["min_scaling_efficiency"]
    base = points[0]
    out: list[Bottleneck] = []
    for p in points[1:]:
        if p.efficiency >= limit:
            continue
        cause, suggestion = scaling_cause(p, base, mode, limits)
        out.append(Bottleneck(
            "low_scaling", severity(p.efficiency, limit, higher_is_worse=False), (),
            f"{mode} scaling efficiency at {p.world_size} ranks is {p.efficiency:.2f} "
            f"(speedup {p.speedup:.2f}x over {base.world_size}); limit {limit:.2f}; {cause}",
            suggestion, p.efficiency, limit))
    return out


def scaling_cause(point: ScalingPoint, base: ScalingPoint, mode: str,
                  limits: Mapping[str, float]) -> tuple[str, str]:
    """Why ``point`` scales worse than ``base``, and what to do: (cause, suggestion)."""
    lim = {**DEFAULT_THRESHOLDS, **limits}
    if not point.step_time_s > 0:
        return ("its step time was not measured",
                "measure again: no step time was recorded at this world size")
    if point.comm_overhead - base.comm_overhead >= 0.1:
        return (f"communication grows from {base.comm_overhead:.0%} to "
                f"{point.comm_overhead:.0%} of the step", GENERIC_SUGGESTIONS["communication"])
    if point.imbalance >= lim["max_imbalance"]:
        return (f"the ranks are unbalanced ({point.imbalance:.0%})",
                GENERIC_SUGGESTIONS["imbalance"])
    if mode == "strong":
        cause = ("neither communication nor imbalance explains it: per-step work that does not "
                 "shrink with more ranks (fixed costs, a per-rank batch too small to keep a "
                 "device busy)")
    else:
        cause = ("neither communication nor imbalance explains it: shared host resources "
                 "(cores, memory bandwidth, data loading) or fixed per-step costs")
    return cause, GENERIC_SUGGESTIONS["low_scaling"]
