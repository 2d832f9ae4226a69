"""The pipeline analysis on synthetic per-rank records: the schedule's theory, the bubble,
the slowest stage and why a bubble is above its theory.  Pure: no torch, no ranks.

The same on real pipelines (GPipe, 1F1B, interleaved 1F1B on gloo ranks) is in
tests/test_parallel.py.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_distperf.analysis.pipeline import (
    analyze_pipeline,
    bubble_theory,
    exposed_comm,
    microbatches_for,
)
from pytest_distperf.analysis.traces.stages import stage_chunks
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.pipeline import pipeline_metrics, plan
from pytest_distperf.fixtures.results.pipeline import PipelineTiming
from pytest_distperf.records import Chunk, DimComm, RankPipeline, from_dict, to_dict
from pytest_distperf.report.jsonreport import load_schema
from pytest_distperf.verdict.thresholds import check_thresholds

PP2 = (("pp", 2),)


@pytest.mark.parametrize(("p", "m", "v", "theory"), [
    (2, 4, 1, 1 / 5), (4, 4, 1, 3 / 7), (4, 16, 1, 3 / 19), (2, 4, 2, 1 / 9), (1, 4, 1, 0.0)])
def test_the_schedules_own_bubble(p: int, m: int, v: int, theory: float) -> None:
    assert bubble_theory(p, m, v) == pytest.approx(theory)


@pytest.mark.parametrize(("p", "u", "v", "m"), [(4, 0.7, 1, 7), (2, 0.7, 1, 3), (4, 0.7, 2, 4),
                                                  (1, 0.9, 1, 1), (2, 1.0, 1, 99)])
def test_the_fewest_microbatches_for_a_utilisation(p: int, u: float, v: int, m: int) -> None:
    assert microbatches_for(p, u, v) == m
    if p > 1 and u < 1:
        assert 1 - bubble_theory(p, m, v) >= u - 1e-9 > 1 - bubble_theory(p, m - 1, v) - 1e-9


def rank(r: int, busy: float, span: float, *, blocks: int = 4, steps: int = 6,
         stages: tuple[int, ...] | None = None, chunks: tuple[Chunk, ...] = (),
         flops: int = 0) -> RankPipeline:
    return RankPipeline(
        rank=r, stages=stages if stages is not None else (r,), blocks=(blocks,), batch_size=8,
        step_s=(span * 1.05,) * steps, schedule_s=(span,) * steps, busy_s=(busy,) * steps,
        forward_s=(busy / 2,) * steps, backward_s=(busy / 2,) * steps,
        step_chunks=(chunks,) * steps if chunks else (), flops=flops,
        mesh_comm=(DimComm("pp", "send", 4, 512),))


def analysed(ranks: list[RankPipeline], m: int = 4, layout: tuple[tuple[str, int], ...] = PP2,
             **limits: float) -> PipelineTiming:
    return analyze_pipeline(ranks, layout=layout, schedule="GPipe", microbatches=m,
                            limits=resolve_thresholds(limits))


def test_a_balanced_pipeline_at_its_theory_has_no_finding() -> None:
    # 4 microbatches of 0.1 s per stage, span (m + p - 1) slots: bubble 1/5
    t = analysed([rank(0, 0.4, 0.5), rank(1, 0.4, 0.5)])
    assert t.bubble == pytest.approx(0.2) and t.utilisation == pytest.approx(0.8)
    assert t.excess_bubble == pytest.approx(0.0) and t.stage_ratio == pytest.approx(1.0)
    assert t.bottlenecks == [] and t.throughput == pytest.approx(8 / 0.525)
    assert [s.bubble for s in t.per_stage] == pytest.approx([0.2, 0.2])
    # the span is the slowest rank's: a rank whose schedule returns early idles the rest
    early = analysed([rank(0, 0.4, 0.5), rank(1, 0.4, 0.45)])
    assert early.per_stage[1].bubble == pytest.approx(0.2)


def test_an_unbalanced_split_names_the_slowest_stage_and_the_blocks_to_move() -> None:
    t = analysed([rank(0, 0.3, 1.0, blocks=6), rank(1, 0.54, 1.0, blocks=6)])
    assert (t.slowest_stage, t.stage_ratio) == (1, pytest.approx(1.8))
    kinds = {b.kind: b for b in t.bottlenecks}
    assert kinds["stage_imbalance"].ranks == (1,)
    # 6 blocks of 90 ms: moving 1 leaves 450 vs 390 ms, the closest whole number (k = 1.33)
    assert kinds["stage_imbalance"].suggestion == (
        "stage 1 takes 1.8x stage 0: move 1 of its 6 blocks to stage 0")
    assert "why: an unbalanced stage split" in kinds["pipeline_bubble"].description


def test_too_few_microbatches_is_said_with_how_many_would_do() -> None:
    # 4 stages, 4 microbatches: the theory alone idles 3/7 of the step
    ranks = [rank(r, 0.4, 0.7) for r in range(4)]
    t = analysed(ranks, layout=(("pp", 4),))
    (bubble,) = [b for b in t.bottlenecks if b.kind == "pipeline_bubble"]
    assert "too few microbatches: the schedule alone idles 43%" in bubble.description
    assert bubble.suggestion.startswith("use at least 7 microbatches")
    breaches = check_thresholds(pipeline_metrics(t), resolve_thresholds())
    assert [b.threshold for b in breaches] == ["min_pipeline_utilisation"]
    assert breaches[0].hint == bubble.suggestion
    assert "pipeline.utilisation = 0.571 is below min_pipeline_utilisation = 0.700" in (
        breaches[0].describe())
    # a lower limit (marker, ini or baseline file): no breach, and no finding
    assert check_thresholds(pipeline_metrics(t), resolve_thresholds(
        {"min_pipeline_utilisation": 0.4})) == []
    lower = analysed(ranks, layout=(("pp", 4),), min_pipeline_utilisation=0.4)
    assert not [b for b in lower.bottlenecks if b.kind == "pipeline_bubble"]


def test_an_excess_the_split_does_not_explain_points_at_the_sends() -> None:
    t = analysed([rank(0, 0.4, 0.6), rank(1, 0.4, 0.6)])  # theory 0.2, measured 1/3
    (bubble,) = t.bottlenecks
    assert bubble.kind == "pipeline_bubble" and bubble.severity == "low"  # utilisation holds
    assert "the sends between stages or per-microbatch overheads" in bubble.description


def test_with_data_parallel_replicas_a_stage_is_its_busiest_replica() -> None:
    layout = (("pp", 2), ("dp", 2))  # ranks 0, 1: stage 0; ranks 2, 3: stage 1
    ranks = [rank(0, 0.3, 1.0), rank(1, 0.2, 1.0), rank(2, 0.6, 1.0), rank(3, 0.2, 1.0)]
    t = analysed(ranks, layout=layout)
    assert [s.pp_rank for s in t.per_stage] == [0, 0, 1, 1]
    assert t.slowest_stage == 1 and t.stage_ratio == pytest.approx(2.0)
    assert t.throughput * t.step_time_s == pytest.approx(16)  # one batch per replica


def test_metrics_round_trip_and_validate() -> None:
    t = analysed([rank(0, 0.4, 0.5), rank(1, 0.4, 0.5)])
    names = {m.name for m in pipeline_metrics(t, "x.")}
    assert {"x.step_time_s", "x.pipeline.utilisation", "x.pipeline.bubble_theory",
            "x.comm.pp.send.calls", "x.comm.pp.send.bytes"} <= names
    assert from_dict(PipelineTiming, json.loads(json.dumps(to_dict(t)))) == t
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"$defs": load_schema()["$defs"], "$ref": "#/$defs/PipelineTiming"}
    jsonschema.validate(to_dict(t), schema, cls=jsonschema.Draft202012Validator)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"schedule": "ZBV"}, "schedule must be one of GPipe, 1F1B, Interleaved1F1B"),
    ({"mesh": {"dp": 2}}, "has no 'pp' dimension"),
    ({"virtual_stages": 2}, "GPipe runs one stage per rank"),
    ({"microbatches": 0}, "microbatches must be an int >= 1"),
    ({"schedule": "1F1B", "microbatches": 1},
     "1F1B needs a microbatch per stage at least, got microbatches=1 on pp=2; use "
     "microbatches=2 or more"),
    # torch's rounds: max(1, 5 // 2) = 2, and 5 is not a multiple of 2
    ({"schedule": "Interleaved1F1B", "microbatches": 5},
     "in 2 equal rounds .* use a multiple of 2: microbatches=4 or 6"),
    ({"mesh": {"pp": 2, "tp": 2}}, "has a 'tp' dimension but nothing uses it; pass "
                                   "parallelize="),
    ({"mesh": {"pp": 2, "dp_shard": 2}}, "nothing uses 'dp_shard'"),  # no gradient sync
])
def test_a_pipeline_is_checked_before_any_rank_is_busy(kwargs: dict[str, object],
                                                       match: str) -> None:
    args: dict[str, object] = {"schedule": "GPipe", "microbatches": 4, "mesh": None,
                               "virtual_stages": None, "world_size": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        plan(print, print, **args)  # type: ignore[arg-type]
    spec = plan(print, print, schedule="interleaved1f1b", microbatches=4, mesh=None,
                virtual_stages=None, world_size=2)
    assert (spec.schedule, spec.virtual, spec.mesh) == ("Interleaved1F1B", 2, PP2)
    # what torch's schedules take: 3 microbatches in one round; TP by the user's parallelize
    assert plan(print, print, schedule="Interleaved1F1B", microbatches=3, mesh=None,
                virtual_stages=None, world_size=2).microbatches == 3
    assert plan(print, print, schedule="1F1B", microbatches=2, mesh={"pp": 2, "tp": 2},
                virtual_stages=None, world_size=4, parallelize=print).mesh == (*PP2, ("tp", 2))
    # a dimension of size 1 needs no wrapper
    assert plan(print, print, schedule="GPipe", microbatches=2, mesh={"pp": 2, "dp_shard": 1},
                virtual_stages=None, world_size=2).mesh == (*PP2, ("dp_shard", 1))


def loss(output: object, target: object) -> object:
    return output


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"target_fn": print}, r"target_fn= gives the loss a target, but no loss_fn= takes it; "
                           r"pass loss_fn=\(output, target\) -> loss"),
    ({"target_fn": print, "loss_fn": lambda output: output},
     "the loss is loss_fn.output, target., but loss_fn=<lambda> does not take 2 arguments"),
    ({"loss_fn": loss}, r"loss_fn=loss does not take \(output\) alone; pass target_fn="),
    ({"target_fn": 3, "loss_fn": loss}, "target_fn must be callable, got 3"),
])
def test_a_loss_and_its_target_are_checked_before_any_rank_is_busy(
        kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        plan(print, print, schedule="GPipe", microbatches=4, mesh=None, virtual_stages=None,
             world_size=2, **kwargs)
    spec = plan(print, print, schedule="GPipe", microbatches=4, mesh=None,
                virtual_stages=None, world_size=2, loss_fn=loss, target_fn=print)
    assert (spec.loss_fn, spec.target_fn) == (loss, print)


def gpipe(transfer: float) -> tuple[tuple[Chunk, ...], tuple[Chunk, ...]]:
    """The chunks of GPipe on 2 stages, 2 microbatches of 10 ms forward and 10 ms backward,
    each send taking ``transfer`` seconds: (stage 0's, stage 1's)."""
    t, c = transfer, 0.010
    first = (("forward", 0, 0, 0.0, c), ("forward", 0, 1, c, 2 * c))
    f0 = c + t
    f1 = max(f0 + c, 2 * c + t)
    last = (("forward", 1, 0, f0, f0 + c), ("forward", 1, 1, f1, f1 + c),
            ("backward", 1, 0, f1 + c, f1 + 2 * c), ("backward", 1, 1, f1 + 2 * c, f1 + 3 * c))
    b0 = f1 + 2 * c + t
    b1 = max(b0 + c, f1 + 3 * c + t)
    return (*first, ("backward", 0, 0, b0, b0 + c), ("backward", 0, 1, b1, b1 + c)), last


def test_exposed_communication_is_the_idle_time_with_the_input_computed_already() -> None:
    # stage 1's first forward waits 5 ms for its input in flight, stage 0's first backward as
    # long; the second microbatch's sends run while the receiver computes: hidden
    first, last = gpipe(0.005)
    assert exposed_comm([first, last], 2) == pytest.approx([0.005, 0.005])
    # the rest of a rank's idle time is waiting for the other stage to compute: not counted
    assert exposed_comm([first, last], 2)[0] < 0.070 - 0.040
    assert exposed_comm([gpipe(0.0)[0], gpipe(0.0)[1]], 2) == pytest.approx([0.0, 0.0])
    t = analysed([rank(0, 0.04, 0.07, chunks=first), rank(1, 0.04, 0.07, chunks=last)], m=2)
    assert t.exposed_comm_s == pytest.approx(0.005)
    assert t.exposed_comm_by_dim == pytest.approx({"pp": 0.005})
    assert [s.exposed_comm_s for s in t.per_stage] == pytest.approx([0.005, 0.005])
    assert t.samples["exposed_comm_s"] == pytest.approx((0.005,) * 6)
    metric = {m.name: m for m in pipeline_metrics(t)}["pipeline.exposed_comm_s"]
    assert metric.value == pytest.approx(0.005) and metric.unit == "s"
    # 4/7 busy against a theory of 1/3 with equal stages: the finding gives the idle time
    (bubble,) = t.bottlenecks
    assert "a stage idled 5 ms a step on average with its next input computed already" in (
        bubble.description)


def test_exposed_communication_pairs_the_stages_of_each_data_parallel_replica() -> None:
    layout = (("pp", 2), ("dp", 2))  # replicas: ranks 0 and 2, ranks 1 and 3
    fast, slow = gpipe(0.005), gpipe(0.015)
    ranks = [rank(0, 0.04, 0.09, chunks=fast[0]), rank(1, 0.04, 0.09, chunks=slow[0]),
             rank(2, 0.04, 0.09, chunks=fast[1]), rank(3, 0.04, 0.09, chunks=slow[1])]
    t = analysed(ranks, m=2, layout=layout)
    assert [s.exposed_comm_s for s in t.per_stage] == pytest.approx([0.005, 0.015, 0.005, 0.015])
    assert t.exposed_comm_s == pytest.approx(0.010)


@pytest.mark.parametrize(("layout", "flops", "samples"), [
    ((("pp", 4),), 4000, 8),  # one batch through 4 stages, each counting its own layers
    ((("pp", 2), ("dp", 2)), 4000, 16),  # a batch per data-parallel replica
])
def test_a_pipelines_throughput_and_mfu_count_each_sample_and_flop_once(
        layout: tuple[tuple[str, int], ...], flops: int, samples: int) -> None:
    t = analysed([rank(r, 0.4, 0.5, flops=1000) for r in range(4)], layout=layout)
    assert t.throughput * t.step_time_s == pytest.approx(samples)
    assert t.flops_per_step == flops
    mfu = dataclasses.replace(t, peak_flops=1e5).mfu
    assert mfu == pytest.approx(flops / t.step_time_s / (4 * 1e5))


def test_a_profiles_stage_chunks_are_read_from_their_labels() -> None:
    events = [("pp stage 1 backward mb 3", "user_annotation", 50.0, 60.0),
              ("pp stage 1 forward mb 0", "user_annotation", 10.0, 20.0),
              ("pp stage 1 forward mb 0", "gpu_user_annotation", 11.0, 19.0),  # a GPU copy
              ("pp stage x forward mb 0", "user_annotation", 0.0, 1.0),
              ("Forward 0", "user_annotation", 9.0, 21.0)]  # torch's own GPipe label
    assert stage_chunks(events) == (("forward", 1, 0, 10.0, 20.0),
                                    ("backward", 1, 3, 50.0, 60.0))


def test_a_pipeline_with_tp_has_its_tp_communication_share() -> None:
    """pp x tp: the TP collectives' blocked share of the counted step, gated and shown per
    dimension as for a step on a mesh (each rank against its own counted step)."""
    layout = (("pp", 2), ("tp", 2))
    ranks = [dataclasses.replace(rank(r, 0.4, 0.5, stages=(r // 2,)), counted_step_s=1.0,
                                 mesh_comm=(DimComm("tp", "all_reduce", 8, 4096, 0.5),))
             for r in range(4)]
    t = analysed(ranks, layout=layout)
    assert t.tp_comm_share == pytest.approx(0.5)
    assert t.exposed_comm_by_dim["tp"] == pytest.approx(0.5 * t.step_time_s)
    assert [b.kind for b in t.bottlenecks] == ["tp_communication"]  # past the 0.40 limit
    share = {m.name: m for m in pipeline_metrics(t)}["tp_comm_share"]
    assert share.threshold == "max_tp_comm_share" and share.value == pytest.approx(0.5)
    assert analysed([rank(0, 0.4, 0.5), rank(1, 0.4, 0.5)]).tp_comm_share is None  # no tp
