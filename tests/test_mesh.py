"""Mesh layouts, counts by dimension and per-dimension normalisation: pure unit tests.

The same figures from real TP, FSDP2 + TP and pipeline ranks on gloo are in
tests/test_parallel.py.  Pure: no torch, no ranks.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_distperf.analysis.analyzer import analyze_steps
from pytest_distperf.analysis.mesh import (
    dimension_counts,
    flops_per_step,
    on_mesh,
    samples_per_step,
)
from pytest_distperf.common.layout import (
    coordinates,
    counted_once,
    data_index,
    dimension_of,
    mesh_groups,
)
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.mesh import check_parallelisation, layout_of
from pytest_distperf.fixtures.results.steps import CommCount, StepTiming
from pytest_distperf.fixtures.steptimer import step_metrics
from pytest_distperf.records import DimComm, RankStep, from_dict, to_dict
from pytest_distperf.report.jsonreport import load_schema
from pytest_distperf.verdict.thresholds import check_thresholds

STEP = (0.1,) * 6
DP = (("dp", 4),)
TP = (("tp", 4),)
PP = (("pp", 4),)
DP_TP = (("dp", 2), ("tp", 2))
PP_DP = (("pp", 2), ("dp", 2))


def test_a_mesh_is_made_of_each_row_of_each_dimension() -> None:
    assert mesh_groups(DP_TP) == ((0, 2), (1, 3), (0, 1), (2, 3))
    assert mesh_groups((("pp", 2), ("dp", 1))) == ((0,), (1,))  # all of 0..n-1 left out
    assert mesh_groups(TP) == ()


def test_coordinates_are_row_major_as_init_device_mesh_lays_ranks_out() -> None:
    # init_device_mesh("cpu", (2, 2), ("dp", "tp")): [[0, 1], [2, 3]]
    assert [coordinates(DP_TP, r) for r in range(4)] == [
        {"dp": 0, "tp": 0}, {"dp": 0, "tp": 1}, {"dp": 1, "tp": 0}, {"dp": 1, "tp": 1}]
    three = (("pp", 2), ("dp", 2), ("tp", 2))
    assert coordinates(three, 5) == {"pp": 1, "dp": 0, "tp": 1}


@pytest.mark.parametrize(("layout", "indices", "stand_for_their_group"), [
    (DP, [0, 1, 2, 3], [0, 1, 2, 3]),  # every rank its own batch
    (TP, [0, 0, 0, 0], [0]),  # one batch, shared by the TP group
    (PP, [0, 0, 0, 0], [0]),  # one batch, passed through all stages
    (DP_TP, [0, 0, 1, 1], [0, 2]),  # a batch per TP group
    (PP_DP, [0, 1, 0, 1], [0, 1]),  # a batch per data-parallel pipeline
])
def test_which_batch_a_rank_trains_on(layout: tuple[tuple[str, int], ...], indices: list[int],
                                      stand_for_their_group: list[int]) -> None:
    assert [data_index(layout, r) for r in range(4)] == indices
    assert [r for r in range(4) if counted_once(layout, r)] == stand_for_their_group


@pytest.mark.parametrize(("layout", "ranks", "dim"), [
    (DP_TP, (0, 1), "tp"), (DP_TP, (2, 3), "tp"), (DP_TP, (0, 2), "dp"), (DP_TP, (3, 1), "dp"),
    (DP_TP, (0, 1, 2, 3), "dp_tp"),  # the whole 2-D mesh: both dimensions' names
    ((("dp_replicate", 2), ("dp_shard", 2)), (0, 1, 2, 3), "dp"),  # torchtitan's flattened dp
    ((("dp_shard", 2), ("cp", 2), ("tp", 2)), (0, 2, 4, 6), "dp_shard_cp"),
    ((("dp", 2), ("dp_shard", 2)), (0, 1, 2, 3), "dp_dp_shard"),  # 'dp' is taken
    (DP_TP, (0, 3), "other"), (DP_TP, (0, 1, 2), "other"), (DP_TP, (4, 5), "other"),
    (PP, (0, 1, 2, 3), "pp"),  # a 1-D mesh: the world group is its dimension's
    ((("dp", 4), ("tp", 1)), (2,), "tp"),  # a TP group of one rank
])
def test_a_process_group_is_mapped_to_its_dimension_by_its_ranks(
        layout: tuple[tuple[str, int], ...], ranks: tuple[int, ...], dim: str) -> None:
    assert dimension_of(layout, ranks) == dim


def rank(r: int, batch: int = 8, flops: int = 1000, comm: tuple[DimComm, ...] = (),
         counted_s: float = 0.1) -> RankStep:
    return RankStep(r, batch, STEP, STEP, STEP, STEP, STEP, flops=flops, mesh_comm=comm,
                    counted_step_s=counted_s)


@pytest.mark.parametrize(("layout", "samples"), [
    (DP, 32),  # 4 batches of 8
    (TP, 8),  # one batch
    (PP, 8),  # one batch through every stage
    (DP_TP, 16),  # two batches, two TP groups
    (PP_DP, 16),
])
def test_throughput_and_flops_count_each_sample_once(
        layout: tuple[tuple[str, int], ...], samples: int) -> None:
    ranks = [rank(r) for r in range(4)]
    # every rank counts what it computed: its batch, its stage's layers, its TP shard
    flops = 4000
    assert samples_per_step(layout, [(r.rank, r.batch_size) for r in ranks]) == samples
    assert flops_per_step([(r.rank, r.flops) for r in ranks]) == flops
    timing = on_mesh(analyze_steps(ranks), layout)
    assert timing.throughput == pytest.approx(samples / 0.1)
    assert timing.samples["throughput"] == pytest.approx((samples / 0.1,) * 6)
    assert timing.flops_per_step == flops
    assert timing.mesh == layout
    # MFU: the FLOPs counted once over the peak of every device of the mesh
    peak = dataclasses.replace(timing, peak_flops=1e5)
    assert peak.achieved_flops == pytest.approx(flops / 0.1)
    assert peak.mfu == pytest.approx(flops / 0.1 / (4 * 1e5))


def test_flops_unknown_on_one_rank_are_unknown() -> None:
    assert flops_per_step([(0, 10), (1, 0), (2, 10), (3, 10)]) == 0


def test_counts_by_dimension_take_the_most_any_rank_issued_with_canonical_names() -> None:
    per_rank = [
        (DimComm("dp", "_allgather_base_", 4, 4000), DimComm("tp", "all_reduce", 1, 512),
         DimComm("dp", "_reduce_scatter_base_", 2, 2000)),
        (DimComm("tp", "all_reduce", 1, 512), DimComm("dp", "_allgather_base_", 4, 4000),
         DimComm("dp", "_reduce_scatter_base_", 2, 2000), DimComm("other", "barrier", 1, 0)),
        (DimComm("pp", "send", 3, 300), DimComm("pp", "recv_", 1, 100),
         DimComm("pp", "recv_", 2, 200)),  # one op name from two rows: summed on a rank
    ]
    counts = dimension_counts(per_rank, (("pp", 2), ("dp", 2), ("tp", 2)))
    assert counts == (
        CommCount("recv", 3, 300, "pp"), CommCount("send", 3, 300, "pp"),
        CommCount("all_gather", 4, 4000, "dp"), CommCount("reduce_scatter", 2, 2000, "dp"),
        CommCount("all_reduce", 1, 512, "tp"), CommCount("barrier", 1, 0, "other"))


def test_metrics_on_a_mesh_name_the_dimension() -> None:
    comm = (DimComm("dp", "_reduce_scatter_base_", 2, 2000), DimComm("tp", "all_reduce", 1, 512))
    timing = on_mesh(analyze_steps([rank(r, comm=comm) for r in range(4)]), DP_TP)
    names = {m.name: m.value for m in step_metrics(timing)}
    assert names["comm.tp.all_reduce.calls"] == 1 and names["comm.tp.all_reduce.bytes"] == 512
    assert names["comm.dp.reduce_scatter.bytes"] == 2000
    assert not any(n.startswith("comm.all_reduce") for n in names)
    assert from_dict(StepTiming, json.loads(json.dumps(to_dict(timing)))) == timing
    jsonschema = pytest.importorskip("jsonschema")
    schema = {"$defs": load_schema()["$defs"], "$ref": "#/$defs/StepTiming"}
    jsonschema.validate(to_dict(timing), schema, cls=jsonschema.Draft202012Validator)


def test_a_layout_is_checked_before_any_rank_is_busy() -> None:
    assert layout_of({"dp": 2, "tp": 2}) == DP_TP
    assert layout_of(None) == ()
    for bad, match in (({}, "dict of dimension name"), ({"DP": 2}, "lower-case words"),
                       ({"dp": 0}, "whole numbers"), ({"dp": True}, "whole numbers"),
                       ([("dp", 2)], "dict of dimension name")):
        with pytest.raises((TypeError, ValueError), match=match):
            layout_of(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"world_size": 2}, "spans 4 ranks"),
    ({"parallelize": lambda m, mesh: m, "tp_plan": {}}, "not both"),
    ({}, "has a 'tp' dimension but nothing uses it"),
    ({"tp_plan": {}, "wrapper": "ddp"}, "DDP does not take tensor-parallel"),
    ({"tp_plan": {}, "comm_hook": print}, "comm_hook is for DDP"),
    ({"parallelize": 3}, "must be a callable"),
])
def test_a_parallelisation_the_mesh_cannot_run_is_refused(kwargs: dict[str, object],
                                                          match: str) -> None:
    args: dict[str, object] = {"parallelize": None, "tp_plan": None, "wrapper": "fsdp",
                               "comm_hook": None, "world_size": None, **kwargs}
    with pytest.raises((TypeError, ValueError), match=match):
        check_parallelisation(DP_TP, **args)  # type: ignore[arg-type]
    assert check_parallelisation(DP_TP, None, {}, "fsdp", None, None) == 4
    with pytest.raises(ValueError, match="has none"):
        check_parallelisation((("dp", 2),), None, {}, "fsdp", None, None)
    # torchtitan's names: the built-in wrapper runs on 'dp' only, your parallelize on any
    hsdp = (("dp_shard", 2), ("tp", 2))
    with pytest.raises(ValueError, match="nothing uses 'dp_shard'"):
        check_parallelisation(hsdp, None, {}, "fsdp", None, None)
    assert check_parallelisation(hsdp, lambda m, mesh: m, None, "fsdp", None, None) == 4


def test_the_tp_communication_share_is_the_median_ranks_blocked_time() -> None:
    tp = (DimComm("tp", "all_reduce", 16, 4 << 20, 0.05), DimComm("dp", "all_gather", 9, 1, 9.0))
    slow = (DimComm("tp", "all_reduce", 16, 4 << 20, 0.07),)
    ranks = [rank(r, comm=tp if r < 3 else slow) for r in range(4)]
    timing = on_mesh(analyze_steps(ranks), DP_TP)  # a step of 0.1 s
    assert timing.tp_comm_share == pytest.approx(0.5)  # median of 0.05, 0.05, 0.05, 0.07
    (found,) = [b for b in timing.bottlenecks if b.kind == "tp_communication"]
    assert found.description == (
        "tensor-parallel collectives block 50% of the step (50 ms of 100 ms per step: 16 "
        "all_reduce of 256 KiB); limit 40%")
    assert "use sequence parallelism" in found.suggestion
    # with sequence parallelism (reduce-scatters on tp) the advice does not ask for it
    sp = (DimComm("tp", "reduce_scatter", 8, 1 << 20, 0.03), DimComm("tp", "_allgather_base",
                                                                      8, 1 << 20, 0.03))
    (with_sp,) = on_mesh(analyze_steps([rank(r, comm=sp) for r in range(4)]),
                         DP_TP).bottlenecks
    assert "use sequence parallelism" not in with_sp.suggestion
    assert "sequence parallelism runs" in with_sp.suggestion
    share = {m.name: m for m in step_metrics(timing)}["tp_comm_share"]
    assert share.threshold == "max_tp_comm_share" and share.hint == found.suggestion
    # no tp dimension, or nothing timed (GPU ranks): no share, no finding
    assert on_mesh(analyze_steps([rank(r) for r in range(4)]), DP).tp_comm_share is None
    # each rank's blocked time against its own counted step, which the counters slow
    # (here 3x the plain 0.1 s step): a sixth of it, not half of the plain step
    slowed = [rank(r, comm=tp, counted_s=0.3) for r in range(4)]
    assert on_mesh(analyze_steps(slowed), DP_TP).tp_comm_share == pytest.approx(1 / 6)


def test_exposed_communication_by_dimension_and_data_parallel_efficiency() -> None:
    # synchronised steps of 100 ms, 75 ms without the gradient synchronisation; ranks
    # blocked 20 ms a step in TP all-reduces
    tp = (DimComm("tp", "all_reduce", 4, 1 << 20, 0.02),)
    ranks = [RankStep(r, 8, STEP, STEP, STEP, STEP, (0.075,) * 6, mesh_comm=tp,
                      counted_step_s=0.1)
             for r in range(4)]
    plain = analyze_steps(ranks)
    assert plain.comm_overhead == pytest.approx(0.25)
    assert plain.dp_efficiency == pytest.approx(0.75) and plain.exposed_comm_by_dim == {}
    two_d = on_mesh(plain, DP_TP)
    assert two_d.dp_efficiency == pytest.approx(0.75)
    assert two_d.exposed_comm_by_dim == pytest.approx({"dp": 0.025, "tp": 0.02})
    shard = on_mesh(plain, (("dp_shard", 2), ("tp", 2)))  # any dimension but tp, pp, cp
    assert shard.dp_efficiency == pytest.approx(0.75)
    assert shard.exposed_comm_by_dim == pytest.approx({"dp": 0.025, "tp": 0.02})
    tp_only = on_mesh(plain, TP)  # no data-parallel dimension: no data-parallel figure
    assert tp_only.dp_efficiency is None
    assert tp_only.exposed_comm_by_dim == pytest.approx({"tp": 0.02})


def test_the_tp_communication_limit_is_040_and_settable_like_the_others() -> None:
    tp = (DimComm("tp", "all_reduce", 16, 4 << 20, 0.05),)
    timing = on_mesh(analyze_steps([rank(r, comm=tp) for r in range(4)]), DP_TP)  # share 0.5
    (breach,) = check_thresholds(step_metrics(timing), resolve_thresholds())
    assert breach.describe().startswith(
        "tp_comm_share = 0.500 exceeds max_tp_comm_share = 0.400")
    assert "sequence parallelism" in breach.describe()
    # a marker's (or the ini file's, or a baseline file's) limit: the same layers as any
    assert check_thresholds(step_metrics(timing), resolve_thresholds(
        {"max_tp_comm_share": 0.6})) == []
    wider = on_mesh(analyze_steps([rank(r, comm=tp) for r in range(4)]), DP_TP,
                    {"max_tp_comm_share": 0.6})
    assert not [b for b in wider.bottlenecks if b.kind == "tp_communication"]
