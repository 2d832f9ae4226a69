"""The analyzer on synthetic per-rank records: every bottleneck kind and the edge cases.

Pure: no torch, no ranks.  Times are in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from pytest_distperf.analysis import analyzer, findings, topology
from pytest_distperf.analysis.analyzer import (
    analyze_steps,
    batch_shares,
    communication_summary,
    load_balance,
    paired_steps,
    phase_stats,
    scaling_result,
)
from pytest_distperf.analysis.findings import MIN_BATCH_SHARE, recommendations, severity
from pytest_distperf.common.intervals import union_length as interval_union
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.results.findings import Bottleneck
from pytest_distperf.fixtures.results.group import PairMatrix, PairRow
from pytest_distperf.fixtures.results.steps import CommCount, ScalingResult, StepTiming
from pytest_distperf.fixtures.steptimer import comm_count_metrics, scaling_metrics, step_metrics
from pytest_distperf.records import CommCall, RankStep, from_dict, to_dict
from pytest_distperf.verdict.thresholds import check_thresholds

N_STEPS = 10
JITTER = (1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.03, 0.97, 1.0, 1.01)


def series(value: float, n: int = N_STEPS) -> tuple[float, ...]:
    return tuple(value * JITTER[k % len(JITTER)] for k in range(n))


def rank_step(rank: int, step: float, no_sync: float, *, batch: int = 8,
              comm_time: float | None = None, buckets: int = 2, bucket_bytes: int = 1 << 20,
              peak: int = 0, capacity: int = 0, n: int = N_STEPS) -> RankStep:
    """A rank whose synchronised steps take ``step`` and no-sync steps ``no_sync``."""
    calls: tuple[CommCall, ...] = ()
    if comm_time is not None:
        per = comm_time / buckets
        calls = tuple(CommCall("all_reduce", bucket_bytes, per, rank, k, b,
                               no_sync * 0.5 + b * per)
                      for k in range(n) for b in range(buckets))
    return RankStep(
        rank=rank, batch_size=batch,
        forward_s=series(no_sync * 0.4, n), backward_s=series(step - no_sync * 0.6, n),
        optimizer_s=series(no_sync * 0.2, n), step_s=series(step, n),
        no_sync_step_s=series(no_sync, n), comm=calls,
        comm_time_s=series(comm_time, n) if comm_time is not None else (),
        peak_memory_bytes=peak, memory_source="rss" if peak else "",
        memory_capacity_bytes=capacity)


def kinds(timing: StepTiming | ScalingResult) -> list[str]:
    return [b.kind for b in timing.bottlenecks]


# -- small statistics ------------------------------------------------------------------------
def test_phase_stats_orders_and_spread() -> None:
    stats = phase_stats([0.4, 0.1, 0.2, 0.3, float("nan"), None])  # type: ignore[list-item]
    assert stats.count == 4
    assert stats.min_s == 0.1 and stats.max_s == 0.4
    assert stats.median_s == pytest.approx(0.25)
    assert stats.p25_s == pytest.approx(0.175) and stats.p75_s == pytest.approx(0.325)
    assert stats.spread == pytest.approx(0.15 / 0.25)


@pytest.mark.parametrize("samples", [[], [float("nan")], [0.0, 0.0]])
def test_phase_stats_of_nothing_or_zeros_is_zero(samples: list[float]) -> None:
    stats = phase_stats(samples)
    assert stats.median_s == 0.0 and stats.spread == 0.0


@pytest.mark.parametrize(("intervals", "expected"), [
    ([], 0.0),
    ([(0.0, 1.0)], 1.0),
    ([(0.0, 1.0), (0.5, 2.0)], 2.0),
    ([(0.0, 1.0), (2.0, 3.0)], 2.0),
    ([(2.0, 3.0), (0.0, 1.0), (0.2, 0.4)], 2.0),
    ([(1.0, 1.0), (3.0, 2.0)], 0.0),  # empty and reversed intervals cover nothing
])
def test_interval_union(intervals: list[tuple[float, float]], expected: float) -> None:
    assert interval_union(intervals) == pytest.approx(expected)


@pytest.mark.parametrize(("value", "limit", "worse", "expected"), [
    (0.11, 0.10, True, "low"), (0.13, 0.10, True, "medium"), (0.25, 0.10, True, "high"),
    (0.70, 0.80, False, "low"), (0.60, 0.80, False, "medium"), (0.30, 0.80, False, "high"),
    (0.5, 0.0, True, "high"), (0.0, 0.8, False, "high"),
])
def test_severity(value: float, limit: float, worse: bool, expected: str) -> None:
    assert severity(value, limit, higher_is_worse=worse) == expected


# -- communication summary -----------------------------------------------------------------
def test_communication_summary_per_collective_type() -> None:
    calls = [
        CommCall("all_reduce", 1_000_000, 0.001, rank=0),  # 1 GB/s
        CommCall("all_reduce", 1_000_000, 0.004, rank=1, step=3, index=1),  # the slowest
        CommCall("all_gather", 500_000, 0.0005, rank=0),
        CommCall("all_gather", 500_000, 0.0, rank=1),  # not timed: counted, no bandwidth
    ]
    summary = {s.op: s for s in communication_summary(calls)}
    ar = summary["all_reduce"]
    assert (ar.count, ar.total_bytes) == (2, 2_000_000)
    assert ar.total_time_s == pytest.approx(0.005)
    assert ar.avg_bandwidth_gbps == pytest.approx(2_000_000 / 0.005 / 1e9)
    assert ar.peak_bandwidth_gbps == pytest.approx(1.0)
    assert ar.slowest is not None and (ar.slowest.rank, ar.slowest.step) == (1, 3)
    ag = summary["all_gather"]
    assert (ag.count, ag.total_bytes) == (2, 1_000_000)
    assert ag.avg_bandwidth_gbps == pytest.approx(1.0)
    # most time first
    assert [s.op for s in communication_summary(calls)] == ["all_reduce", "all_gather"]


def test_communication_summary_of_nothing_and_of_untimed_calls() -> None:
    assert communication_summary([]) == []
    (only,) = communication_summary([CommCall("broadcast", 10, 0.0)])
    assert only.count == 1 and only.avg_bandwidth_gbps == 0.0 and only.slowest is None


# -- load balance --------------------------------------------------------------------------
def test_balanced_ranks_have_no_stragglers() -> None:
    lb = load_balance([0.100, 0.102, 0.099, 0.101])
    assert lb.imbalance == pytest.approx(0.003 / 0.1005)
    assert lb.stragglers == () and lb.missing == ()


def test_one_slow_rank_of_two_is_the_straggler() -> None:
    lb = load_balance([0.02, 0.08], [0.06, 0.0], step_time_s=0.08)
    assert lb.imbalance == pytest.approx(0.06 / 0.05)
    assert lb.cv == pytest.approx(0.03 / 0.05)
    assert lb.stragglers == (1,)
    assert lb.idle_fraction == pytest.approx((0.75, 0.0))


def test_one_slow_rank_of_four_is_the_only_straggler() -> None:
    lb = load_balance([0.10, 0.10, 0.13, 0.10])
    assert lb.stragglers == (2,)


def test_one_fast_rank_is_imbalance_without_stragglers() -> None:
    lb = load_balance([0.10, 0.10, 0.05, 0.10])
    assert lb.imbalance >= 0.10
    assert lb.stragglers == ()


def test_two_ranks_just_below_the_limit_have_no_straggler() -> None:
    lb = load_balance([0.100, 0.109], limit=0.10)
    assert lb.imbalance < 0.10 and lb.stragglers == ()


@pytest.mark.parametrize("compute", [[0.05], [], [0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
def test_one_rank_no_rank_or_zero_times_are_balanced(compute: list[float]) -> None:
    lb = load_balance(compute, step_time_s=0.0)
    assert lb.imbalance == 0.0 and lb.cv == 0.0 and lb.stragglers == ()
    assert all(f == 0.0 for f in lb.idle_fraction)


def test_missing_ranks_are_left_out_and_named() -> None:
    lb = load_balance([0.02, None, float("nan"), 0.08], [0.06, None, float("inf"), -1.0],
                      step_time_s=0.08)
    assert lb.missing == (1, 2)
    assert lb.compute_s == (0.02, 0.0, 0.0, 0.08)
    assert lb.wait_s == (0.06, 0.0, 0.0, 0.0)  # missing and negative waits read as none
    assert lb.stragglers == (3,)


# -- batch shares --------------------------------------------------------------------------
def test_batch_shares_are_proportional_to_throughput() -> None:
    shares = batch_shares([300.0, 100.0])
    assert shares == pytest.approx((0.75, 0.25))


def test_batch_shares_give_every_rank_at_least_the_minimum() -> None:
    shares = batch_shares([1000.0, 1000.0, 1.0, 10.0])
    assert sum(shares) == pytest.approx(1.0)
    assert min(shares) >= MIN_BATCH_SHARE - 1e-12
    assert shares[2] == pytest.approx(MIN_BATCH_SHARE)
    assert shares[3] == pytest.approx(MIN_BATCH_SHARE)
    assert shares[0] == pytest.approx(shares[1])


@pytest.mark.parametrize(("throughput", "expected"), [
    ([], ()),
    ([None, 0.0], (0.5, 0.5)),  # nothing usable: equal shares
    ([float("nan"), 100.0, 100.0], (1 / 3, 1 / 3, 1 / 3)),  # missing: the others' mean
    ([5.0] * 25, tuple([1 / 25] * 25)),  # 25 x 5% > 100%: equal shares
])
def test_batch_shares_edge_cases(throughput: list[float | None],
                                 expected: tuple[float, ...]) -> None:
    assert batch_shares(throughput) == pytest.approx(expected)


# -- the step analysis: one synthetic group per bottleneck kind ------------------------------
def test_balanced_compute_bound_group_has_no_bottleneck() -> None:
    t = analyze_steps([rank_step(0, 0.052, 0.050, comm_time=0.002),
                       rank_step(1, 0.052, 0.050, comm_time=0.002)])
    assert t.world_size == 2 and t.steps == N_STEPS
    assert t.step_time_s == pytest.approx(0.052, rel=0.03)
    assert t.compute_time_s == pytest.approx(0.050, rel=0.03)
    assert t.comm_overhead < 0.1
    assert t.imbalance < 0.01 and t.stragglers == []
    assert t.bottlenecks == [] and t.recommendations == [] and t.batch_shares == ()
    assert t.throughput == pytest.approx(16 / t.step_time_s)
    assert set(t.phases) == set(analyzer.PHASES)
    assert t.communication[0].op == "all_reduce"
    assert t.communication[0].count == 2 * 2 * N_STEPS
    assert len(t.per_rank) == 2 and not any(r.straggler for r in t.per_rank)


def test_communication_bound_group() -> None:
    t = analyze_steps([rank_step(0, 0.040, 0.010, comm_time=0.031),
                       rank_step(1, 0.040, 0.010, comm_time=0.030)])
    assert t.comm_overhead == pytest.approx(0.75, abs=0.03)
    assert t.comm_time_s == pytest.approx(0.030, rel=0.03)  # the least-waiting rank's
    assert t.overlap == pytest.approx(0.0)
    assert kinds(t) == ["communication", "low_overlap"]
    comm = t.bottlenecks[0]
    assert comm.severity == "high" and comm.limit == 0.30
    assert "75%" in comm.description and "bucket" in comm.suggestion
    assert any(line.startswith("communication") for line in t.recommendations)


def test_overlapped_communication_is_not_low_overlap() -> None:
    # 30 ms of communication, 14 ms of it exposed: 53% hidden behind backward
    t = analyze_steps([rank_step(0, 0.040, 0.026, comm_time=0.030),
                       rank_step(1, 0.040, 0.026, comm_time=0.030)])
    assert t.overlap == pytest.approx(1 - 0.014 / 0.030, abs=0.03)
    assert kinds(t) == ["communication"]


def test_straggler_group() -> None:
    # rank 1 computes 80 ms, rank 0 20 ms; both finish synchronised steps at ~82 ms
    t = analyze_steps([rank_step(0, 0.082, 0.020, comm_time=0.062),
                       rank_step(1, 0.082, 0.080, comm_time=0.002)])
    assert t.stragglers == [1]
    assert t.imbalance == pytest.approx(0.06 / 0.05, rel=0.05)
    assert kinds(t) == ["imbalance", "straggler"]
    imb, strag = t.bottlenecks
    assert imb.ranks == (1,) and imb.severity == "high"
    assert "rank 0 waits" in imb.description
    assert strag.ranks == (1,) and "rank 1" in strag.description
    # the rank the others wait for waits least
    r0, r1 = t.per_rank
    assert r1.straggler and not r0.straggler
    assert r0.wait_time_s == pytest.approx(0.060, rel=0.05)
    assert r1.wait_time_s == pytest.approx(0.0, abs=1e-9)
    assert r0.idle_fraction > 0.5
    # shares proportional to throughput (8 samples in 20 ms vs in 80 ms): 80% / 20%
    assert t.batch_shares == pytest.approx((0.8, 0.2), abs=0.01)
    assert "rank 0: 80%, rank 1: 20%" in imb.suggestion
    assert any("rebalance" in line for line in t.recommendations)
    # exposed communication excludes the wait: this group is not communication-bound
    assert t.comm_overhead < 0.1


def test_straggler_shares_respect_the_minimum() -> None:
    t = analyze_steps([rank_step(0, 1.0, 0.001), rank_step(1, 1.0, 1.0)])
    assert t.batch_shares[1] == pytest.approx(MIN_BATCH_SHARE)
    assert sum(t.batch_shares) == pytest.approx(1.0)


def test_memory_bound_group() -> None:
    gib = 1 << 30
    t = analyze_steps([rank_step(0, 0.05, 0.05, peak=int(7.9 * gib), capacity=8 * gib),
                       rank_step(1, 0.05, 0.05, peak=2 * gib, capacity=8 * gib)])
    assert kinds(t) == ["memory"]
    (mem,) = t.bottlenecks
    assert mem.ranks == (0,) and mem.severity == "high" and "99%" in mem.description
    assert "checkpointing" in mem.suggestion


def test_memory_without_capacity_is_not_judged() -> None:
    t = analyze_steps([rank_step(0, 0.05, 0.05, peak=1 << 40, capacity=0)])
    assert t.bottlenecks == []


@pytest.mark.parametrize(("busy_s", "expected", "found"), [
    ((0.003, 0.004), 0.07, ["launch_bound"]),  # the examples' MLP at 256 rows on an H200
    ((0.045, 0.046), 0.91, []),  # the same at 65,536 rows
    ((), None, []),  # CPU ranks: no kernels, no figure
])
def test_a_gpu_busy_less_than_half_the_step_is_launch_bound(
        busy_s: tuple[float, ...], expected: float | None, found: list[str]) -> None:
    t = analyze_steps([rank_step(0, 0.05, 0.05), rank_step(1, 0.05, 0.05)],
                      device_busy_s=busy_s)
    assert t.device_busy == (None if expected is None else pytest.approx(expected))
    assert kinds(t) == found
    if found:
        (launch,) = t.bottlenecks
        assert launch.severity == "high" and launch.limit == findings.MIN_DEVICE_BUSY
        assert "kernels 7% of the step (3.5 ms of 50 ms)" in launch.description
        assert "CUDA graphs" in launch.suggestion and "exact counts" in launch.suggestion


def test_thresholds_from_the_marker_move_the_findings() -> None:
    records = [rank_step(0, 0.040, 0.010, comm_time=0.03), rank_step(1, 0.040, 0.011,
                                                                     comm_time=0.03)]
    assert "communication" in kinds(analyze_steps(records))
    relaxed = analyze_steps(records, limits={"max_comm_overhead": 0.9})
    assert "communication" not in kinds(relaxed)


# -- the step analysis: edge cases -----------------------------------------------------------
def test_one_rank() -> None:
    t = analyze_steps([rank_step(0, 0.05, 0.049, comm_time=0.001)])
    assert t.world_size == 1 and t.imbalance == 0.0 and t.imbalance_cv == 0.0
    assert t.stragglers == [] and t.batch_shares == ()
    assert t.per_rank[0].wait_time_s == 0.0


def test_zero_times_give_zeros_not_division_errors() -> None:
    t = analyze_steps([rank_step(0, 0.0, 0.0, comm_time=0.0),
                       rank_step(1, 0.0, 0.0, comm_time=0.0)])
    assert (t.step_time_s, t.compute_time_s, t.comm_overhead, t.imbalance) == (0, 0, 0, 0)
    assert t.throughput == 0.0 and t.overlap is None
    assert t.bottlenecks == []
    assert all(r.throughput == 0.0 and r.idle_fraction == 0.0 for r in t.per_rank)
    assert all(math.isfinite(v) for vs in t.samples.values() for v in vs)


def test_no_records_is_an_error() -> None:
    with pytest.raises(ValueError, match="no per-rank records"):
        analyze_steps([])


def test_missing_no_sync_samples_mean_no_exposed_overhead() -> None:
    r = rank_step(0, 0.05, 0.05)
    bare = RankStep(rank=0, batch_size=4, forward_s=(), backward_s=(), optimizer_s=(),
                    step_s=r.step_s, no_sync_step_s=())
    t = analyze_steps([bare, RankStep(1, 4, (), (), (), r.step_s, ())])
    assert t.step_time_s > 0 and t.compute_time_s == t.step_time_s
    assert t.comm_overhead == 0.0 and t.imbalance == 0.0
    assert t.load_balance is not None and t.load_balance.missing == (0, 1)
    assert t.phases["forward"].count == 0
    assert t.comm_time_s is None and t.overlap is None and t.communication == []


def test_a_rank_without_samples_is_missing_and_the_rest_still_judged() -> None:
    empty = RankStep(rank=2, batch_size=8, forward_s=(), backward_s=(), optimizer_s=(),
                     step_s=(), no_sync_step_s=())
    t = analyze_steps([rank_step(0, 0.082, 0.020), rank_step(1, 0.082, 0.080), empty])
    assert t.load_balance is not None and t.load_balance.missing == (2,)
    assert t.stragglers == [1]
    assert t.per_rank[2].compute_time_s == 0.0


def test_ranks_in_any_order_and_with_gaps() -> None:
    t = analyze_steps([rank_step(3, 0.082, 0.080), rank_step(0, 0.082, 0.020)])
    assert [r.rank for r in t.per_rank] == [0, 3]
    assert t.stragglers == [3]
    assert t.load_balance is not None and t.load_balance.missing == (1, 2)


def test_step_timing_round_trips_through_json() -> None:
    t = analyze_steps([rank_step(0, 0.082, 0.020, comm_time=0.06, peak=10, capacity=100),
                       rank_step(1, 0.082, 0.080, comm_time=0.002, peak=10, capacity=100)])
    data = json.loads(json.dumps(to_dict(t)))
    assert from_dict(StepTiming, data) == t


# -- recommendations and hints -----------------------------------------------------------------
def test_recommendations_dedupe_and_order_by_severity() -> None:
    low = Bottleneck("memory", "low", (0,), "d", "use less memory")
    high = Bottleneck("communication", "high", (), "d", "talk less")
    lines = recommendations([low, high, high], shares=(0.6, 0.4))
    assert lines == ["communication: talk less", "memory (ranks 0): use less memory",
                     "batch shares: rank 0: 60%, rank 1: 40%"]
    assert recommendations([]) == []


def test_hints_fall_back_to_generic_suggestions() -> None:
    t = analyze_steps([rank_step(0, 0.05, 0.05), rank_step(1, 0.05, 0.05)])
    assert findings.hint(t.bottlenecks, "communication") == \
        findings.GENERIC_SUGGESTIONS["communication"]
    assert findings.hint(t.bottlenecks, "imbalance") == findings.GENERIC_SUGGESTIONS["imbalance"]


# -- scaling -------------------------------------------------------------------------------
def timing_at(world: int, step: float, *, per_rank_batch: int = 8,
              comm_overhead: float = 0.0, straggle: bool = False) -> StepTiming:
    no_sync = step * (1 - comm_overhead)
    ranks = [rank_step(r, step, no_sync * (3.0 if straggle and r == 1 else 1.0),
                       batch=per_rank_batch) for r in range(world)]
    return analyze_steps(ranks)


def test_weak_scaling_efficiency_is_one_at_the_smallest_size() -> None:
    result = scaling_result([timing_at(2, 0.11), timing_at(1, 0.10), timing_at(4, 0.125)],
                            "weak")
    assert [p.world_size for p in result.points] == [1, 2, 4]
    assert result.efficiency[1] == 1.0
    assert result.efficiency[2] == pytest.approx(0.10 / 0.11, rel=0.02)
    assert result.efficiency[4] == pytest.approx(0.10 / 0.125, rel=0.02)
    assert result.point(4).speedup == pytest.approx(4 * 0.10 / 0.125, rel=0.02)
    assert result.bottlenecks == []
    with pytest.raises(KeyError, match="measured: 1, 2, 4"):
        result.point(8)


def test_strong_scaling_uses_step_times_of_the_fixed_global_batch() -> None:
    # global batch 16: 16 rows on 1 rank, 8 per rank on 2
    result = scaling_result([timing_at(1, 0.10, per_rank_batch=16),
                             timing_at(2, 0.08, per_rank_batch=8)], "strong")
    p = result.point(2)
    assert p.speedup == pytest.approx(0.10 / 0.08, rel=0.02)
    assert p.efficiency == pytest.approx(0.10 / (2 * 0.08), rel=0.02)
    assert kinds(result) == ["low_scaling"]
    (low,) = result.bottlenecks
    assert "at 2 ranks" in low.description and "strong" in low.description
    assert "neither communication nor imbalance" in low.description
    assert len(p.samples) == N_STEPS and len(p.step_samples) == N_STEPS


@pytest.mark.parametrize(("later", "cause"), [
    (timing_at(2, 0.30, comm_overhead=0.6), "communication grows"),
    (timing_at(2, 0.30, straggle=True), "unbalanced"),
])
def test_low_scaling_names_its_cause(later: StepTiming, cause: str) -> None:
    result = scaling_result([timing_at(1, 0.10), later], "weak")
    (low,) = result.bottlenecks
    assert cause in low.description
    assert result.recommendations and result.recommendations[0].startswith("low_scaling")


def test_scaling_with_a_zero_time_has_no_division_error() -> None:
    result = scaling_result([timing_at(1, 0.0), timing_at(2, 0.0)], "weak")
    assert result.efficiency == {1: 1.0, 2: 0.0}
    assert "not measured" in result.bottlenecks[0].description
    one = scaling_result([timing_at(2, 0.1)], "strong")
    assert one.efficiency == {2: 1.0} and one.bottlenecks == []


def test_scaling_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="weak' or 'strong"):
        scaling_result([timing_at(1, 0.1)], "sideways")
    with pytest.raises(ValueError, match="no step timings"):
        scaling_result([], "weak")


def test_scaling_result_round_trips_through_json() -> None:
    result = scaling_result([timing_at(1, 0.10), timing_at(2, 0.3, comm_overhead=0.6)], "weak")
    assert from_dict(ScalingResult, json.loads(json.dumps(to_dict(result)))) == result


# -- the metrics the fixture records, and how a breach reads ---------------------------------
def test_step_metrics_names_units_thresholds_and_breach_text() -> None:
    t = analyze_steps([rank_step(0, 0.082, 0.020, comm_time=0.06),
                       rank_step(1, 0.082, 0.080, comm_time=0.002)])
    metrics = {m.name: m for m in step_metrics(t)}
    assert list(metrics) == ["step_time_s", "throughput", "comm_overhead", "imbalance",
                             "compute_time_s", "exposed_comm_s"]
    assert {m.kind for m in metrics.values()} == {"", "informational"}
    assert metrics["throughput"].higher_is_better and metrics["throughput"].unit == "samples/s"
    assert metrics["comm_overhead"].threshold == "max_comm_overhead"
    imb = metrics["imbalance"]
    assert (imb.threshold, imb.unit, imb.ranks) == ("max_imbalance", "fraction", (1,))
    assert len(imb.samples) == N_STEPS and len(metrics["step_time_s"].samples) == N_STEPS
    (breach,) = check_thresholds(metrics.values(), resolve_thresholds())
    text = breach.describe()
    assert "imbalance = 1.2" in text and "max_imbalance = 0.100" in text
    assert "ranks involved: 1" in text and "rank 0: 80%, rank 1: 20%" in text
    named = [m.name for m in step_metrics(t, "resnet.")]
    assert named[0] == "resnet.step_time_s"


def test_exposed_communication_is_shown_as_comm_overhead_gives_it() -> None:
    """``exposed_comm_s`` is ``comm_overhead`` x ``step_time_s`` and is judged, saved and
    shown by that value: the per-step differences of a synchronised and a no-sync step,
    clamped at 0, put the good-side estimate at 0 us beside a comm_overhead of 0.2."""
    from pytest_distperf.verdict.stats import estimate

    step = (0.100, 0.100, 0.100, 0.150, 0.150, 0.150, 0.150, 0.150, 0.150, 0.150)
    no_sync = (0.160, 0.160, 0.160, 0.090, 0.090, 0.090, 0.090, 0.140, 0.140, 0.140)
    ranks = [RankStep(r, 8, step, step, step, step, no_sync) for r in (0, 1)]
    t = analyze_steps(ranks)
    assert t.comm_overhead == pytest.approx(0.2)
    exposed = {m.name: m for m in step_metrics(t)}["exposed_comm_s"]
    shown = estimate(exposed.samples, exposed.value, exposed.higher_is_better,
                     exposed.is_fraction)
    assert shown == pytest.approx(t.comm_overhead * t.step_time_s) == pytest.approx(0.03)


def test_imbalance_is_informational_against_its_baseline_on_cpu_ranks() -> None:
    """Where the step carries the host-speed control (CPU ranks), ``imbalance`` is compared
    with its baseline for information only: the host unbalances ranks sharing a few cores
    from one run to the next by as much as the change it would be judged by (R70, R71).
    Its threshold still applies; without the control (GPUs, ``control=False``) it is
    judged as before."""
    t = analyze_steps([rank_step(0, 0.082, 0.020, comm_time=0.06),
                       rank_step(1, 0.082, 0.080, comm_time=0.002)])
    plain = {m.name: m for m in step_metrics(t)}
    assert plain["imbalance"].kind == ""
    steps = t.samples["step_s"]
    cpu = dataclasses.replace(t, samples={**t.samples, "control_s": (0.0025,) * len(steps)})
    metrics = {m.name: m for m in step_metrics(cpu)}
    assert metrics["imbalance"].kind == "informational"
    assert metrics["step_time_s"].control and metrics["step_time_s"].kind == ""
    (breach,) = check_thresholds(metrics.values(), resolve_thresholds())
    assert breach.metric == "imbalance"


def test_imbalance_pairs_the_ranks_step_by_step() -> None:
    """The host flips speed between steps and both ranks flip with it (10 ms fast, 20 ms
    slow), rank 0 in 6 fast steps of 20, rank 1 in 4: each rank's own 25% quantile says
    10 ms against 20 ms, a 0.67 "imbalance" with a false straggler; step by step the
    ranks are even."""
    host = [0.010 if k in (0, 5, 10, 15) else 0.020 for k in range(20)]
    r0 = [0.010 if k in (0, 5, 10, 15, 7, 12) else v for k, v in enumerate(host)]

    def rank(i: int, no_sync: list[float]) -> RankStep:
        return dataclasses.replace(rank_step(i, 0.03, 0.02, n=20), no_sync_step_s=tuple(no_sync))

    t = analyze_steps([rank(0, r0), rank(1, host)])
    assert t.imbalance == 0.0 and t.stragglers == []
    assert "straggler" not in kinds(t) and "imbalance" not in kinds(t)
    unpaired = load_balance([t.per_rank[0].compute_time_s, t.per_rank[1].compute_time_s])
    assert unpaired.imbalance == pytest.approx(2 / 3) and unpaired.stragglers == (1,)
    # a real straggler stands out in every step, whatever the host does
    slow = [v * 1.5 for v in host]
    t = analyze_steps([rank(0, host), rank(1, slow), rank(2, host)])
    assert t.stragglers == [1] and t.imbalance == pytest.approx(0.5 / (3.5 / 3))
    assert paired_steps([host]) is None and paired_steps([[], []]) is None


def test_counted_collectives_become_exact_metrics_per_kind_and_group() -> None:
    counts = (CommCount("all_reduce", 18, 4_000_000), CommCount("barrier", 1, 0))
    t = analyze_steps([rank_step(0, 0.08, 0.05), rank_step(1, 0.08, 0.05)],
                      comm_counts=counts)
    exact = {m.name: m for m in step_metrics(t, "gpt.") if m.kind == "exact"}
    assert {n: (m.value, m.unit) for n, m in exact.items()} == {
        "gpt.comm.all_reduce.calls": (18.0, "calls/step"),
        "gpt.comm.all_reduce.bytes": (4e6, "B/step"),
        "gpt.comm.barrier.calls": (1.0, "calls/step")}  # a barrier carries no bytes
    assert not any(m.higher_is_better or m.samples for m in exact.values())
    # several process groups: the op carries the group's ranks
    two = comm_count_metrics((CommCount("all_reduce", 2, 8, "ranks 0,1"),
                              CommCount("all_reduce", 1, 4, "ranks 0,1,2,3")), "comm.", 4, "")
    assert [m.name for m in two] == [
        "comm.all_reduce[ranks 0,1].calls", "comm.all_reduce[ranks 0,1].bytes",
        "comm.all_reduce[ranks 0,1,2,3].calls", "comm.all_reduce[ranks 0,1,2,3].bytes"]


def test_scaling_metrics_record_efficiency_above_the_smallest_size() -> None:
    result = scaling_result([timing_at(1, 0.10), timing_at(2, 0.30, comm_overhead=0.6)],
                            "weak")
    metrics = {m.name: m for m in scaling_metrics(result)}
    assert list(metrics) == ["scaling_throughput.w1", "scaling_throughput.w2",
                             "scaling_efficiency.w2"]
    eff = metrics["scaling_efficiency.w2"]
    assert eff.threshold == "min_scaling_efficiency" and eff.higher_is_better
    assert eff.world_size == 2
    (breach,) = check_thresholds(metrics.values(), resolve_thresholds())
    assert "is below min_scaling_efficiency = 0.800" in breach.describe()
    assert "communication grows" in breach.describe()


# -- the pair matrix by node (analysis.topology, analyzer.pairs_by_node) ---------------------
PAIR_BYTES = 64 * 1024


def pair_matrix(nodes: list[str], gbps_of: dict[tuple[str, str], float],
                noisy: dict[tuple[int, int], float] | None = None) -> PairMatrix:
    """A bench_pairs matrix whose pair (src, dst) runs at ``gbps_of[(node of src, node of
    dst)]`` in every iteration but one (a 3x hiccup); ``noisy[(src, dst)]`` slows a whole
    pair by that factor."""
    rows = []
    n = len(nodes)
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            t = PAIR_BYTES / (gbps_of[(nodes[src], nodes[dst])] * 1e3)
            t *= (noisy or {}).get((src, dst), 1.0)
            samples = (*(t * j for j in JITTER[:7]), 3 * t)
            rows.append(PairRow(src, dst, t, PAIR_BYTES / (t * 1e3), 0, samples))
    return PairMatrix(n, "gloo", "cpu", "float32", "64KiB", PAIR_BYTES, 2, 8, tuple(rows))


def links(nodes: list[str], intra: float, inter: float,
          **slow: float) -> dict[tuple[str, str], float]:
    """Every link at ``intra`` or ``inter`` GB/s, except ``slow={"A_B": gbps}`` (A to B)."""
    out = {(a, b): intra if a == b else inter for a in set(nodes) for b in set(nodes)}
    for key, value in slow.items():
        a, b = key.split("_")
        out[(a, b)] = value
    return out


def test_node_names_come_from_the_node_rank_or_the_host_name() -> None:
    info = [{"node_rank": 0, "hostname": "gpu-1"}, {"node_rank": 1, "hostname": "gpu-2"},
            {"node_rank": -1, "hostname": "laptop"}, {}]
    assert topology.node_names(info) == ("node 0 (gpu-1)", "node 1 (gpu-2)", "laptop",
                                         "this host")
    assert topology.ranks_by_node(("b", "a", "b")) == {"b": (0, 2), "a": (1,)}


def test_one_node_has_no_split() -> None:
    nodes = ["A", "A"]
    assert analyzer.pairs_by_node(pair_matrix(nodes, links(nodes, 1.0, 1.0)), nodes) is None


def test_two_nodes_report_intra_and_inter_node_figures_as_metrics() -> None:
    nodes = ["A", "A", "B", "B"]
    split = analyzer.pairs_by_node(pair_matrix(nodes, links(nodes, 2.0, 0.5)), nodes)
    assert split is not None
    assert split.intra_gbps == pytest.approx(2.0) and split.inter_gbps == pytest.approx(0.5)
    assert split.intra_time_us == pytest.approx(PAIR_BYTES / 2e3)
    assert {(k.src, k.dst): k.pairs for k in split.links} == {
        ("A", "A"): 2, ("A", "B"): 4, ("B", "A"): 4, ("B", "B"): 2}
    metrics = {m.name: m for m in split.metrics()}
    assert list(metrics) == ["pairs.64KiB.intra_node_busbw_gbps",
                             "pairs.64KiB.inter_node_busbw_gbps"]
    inter = metrics["pairs.64KiB.inter_node_busbw_gbps"]
    assert inter.higher_is_better and inter.unit == "GB/s" and inter.world_size == 4
    assert len(inter.samples) == 8 and inter.samples[0] == pytest.approx(0.5)
    # slower inter-node links are what networks are like: no finding from that alone
    assert split.slow_nodes == () and split.slow_links == () and split.bottlenecks == ()
    assert from_dict(type(split), json.loads(json.dumps(to_dict(split)))) == split


def test_two_nodes_cannot_say_which_node_a_delay_is_on() -> None:
    # a delay on either node slows both directions alike: nothing to compare with
    nodes = ["A", "A", "B", "B"]
    split = analyzer.pairs_by_node(pair_matrix(nodes, links(nodes, 2.0, 0.01)), nodes)
    assert split is not None and split.bottlenecks == ()


def test_two_nodes_name_a_one_way_slow_link_but_not_a_node() -> None:
    nodes = ["A", "A", "B", "B"]
    split = analyzer.pairs_by_node(pair_matrix(nodes, links(nodes, 2.0, 0.5, A_B=0.01)),
                                   nodes)
    assert split is not None and split.slow_nodes == ()
    (finding,) = split.bottlenecks
    assert finding.kind == "slow_link" and finding.ranks == (0, 1, 2, 3)
    assert "the link from A to B" in finding.description
    assert "cannot be pinned on one of them (A slow to send, or B slow to receive)" in \
        finding.description


def test_three_nodes_name_the_delayed_node_and_its_ranks() -> None:
    nodes = ["A", "B", "C", "C"]
    gbps = links(nodes, 2.0, 0.5, C_A=0.005, C_B=0.005, A_C=0.005, B_C=0.005)
    split = analyzer.pairs_by_node(pair_matrix(nodes, gbps), nodes)
    assert split is not None
    (slow,) = split.slow_nodes
    assert (slow.node, slow.ranks, slow.sends, slow.receives) == ("C", (2, 3), True, True)
    assert slow.factor == pytest.approx(100)
    assert split.intra_gbps == pytest.approx(2.0)  # C's own pair is not slow
    (finding,) = split.bottlenecks
    assert (finding.kind, finding.severity, finding.ranks) == ("slow_node", "high", (2, 3))
    assert finding.description.startswith(
        "C with ranks 2, 3 is slow to send to and receive from the other nodes: its best link "
        "reaches 0.00501 GB/s, 100x below the 0.501 GB/s of the links between the other "
        "nodes (best case of every round trip, 64KiB messages)")
    assert "NIC" in finding.suggestion
    assert "slow_node (ranks 2, 3): check that node's network" in \
        recommendations(split.bottlenecks)[0]


def test_three_nodes_name_a_node_slow_to_send_and_not_a_noisy_bystander() -> None:
    # C's sends are rate-limited; the pair B -> A is slowed 20x by noise. A then receives
    # slowly from both nodes, but once C is named its links are set aside, and A has no
    # other node to be compared with.
    nodes = ["A", "B", "C", "C"]
    gbps = links(nodes, 2.0, 0.5, C_A=0.002, C_B=0.002)
    split = analyzer.pairs_by_node(pair_matrix(nodes, gbps, noisy={(1, 0): 20.0}), nodes)
    assert split is not None
    assert [(s.node, s.sends, s.receives) for s in split.slow_nodes] == [("C", True, False)]
    assert split.bottlenecks[0].description.startswith("C with ranks 2, 3 is slow to send to ")


def test_three_nodes_point_at_a_slow_path_between_two_healthy_nodes() -> None:
    nodes = ["A", "B", "C"]
    gbps = links(nodes, 2.0, 0.5, A_B=0.01, B_A=0.01)
    split = analyzer.pairs_by_node(pair_matrix(nodes, gbps), nodes)
    assert split is not None and split.slow_nodes == ()
    assert [(k.src, k.dst) for k in split.slow_links] == [("A", "B"), ("B", "A")]
    assert all(b.kind == "slow_link" and b.ranks == (0, 1) for b in split.bottlenecks)
    assert "suspect the path between them" in split.bottlenecks[0].description
    assert split.intra_gbps is None and [m.name for m in split.metrics()] == [
        "pairs.64KiB.inter_node_busbw_gbps"]


def test_healthy_nodes_with_hiccups_have_no_findings() -> None:
    nodes = ["A", "B", "C", "C"]
    noisy = {(0, 1): 1.8, (2, 0): 1.5, (3, 1): 1.9}  # under 2x: not slow
    split = analyzer.pairs_by_node(pair_matrix(nodes, links(nodes, 2.0, 0.5), noisy), nodes)
    assert split is not None and split.bottlenecks == ()


def test_the_node_of_every_rank_is_needed() -> None:
    nodes = ["A", "B", "C"]
    with pytest.raises(ValueError, match="the node of each of the 3 ranks is needed"):
        topology.split_by_node(pair_matrix(nodes, links(nodes, 1.0, 1.0)), ["A", "B"])
