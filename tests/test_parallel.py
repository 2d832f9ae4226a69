"""2-D and 3-D parallel training end to end: real TP, FSDP2 + TP on a 2 x 2 mesh, a
pipeline with data parallelism and profiles by mesh dimension on gloo ranks, driven through
pytester (more pipelines: test_parallel_pipelines.py).

What is asserted is exact (collective counts by mesh dimension, samples and FLOPs per step)
or made of sleeps no shared host can hide; timings are left to the benchmarks.  Each
generated module runs in one pytest run (one rank pool): 2 ranks, and 4 only where
the 2 x 2 mesh or 4 stages is the point.
"""

from __future__ import annotations

import json

import pytest
from quick_runs import ONE_SAVE

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

RUN = ("-p", "no:cacheprovider", "-rA", "-o", "distperf_max_comm_overhead=2",
       "-o", "distperf_max_imbalance=100", "-o", "distperf_min_pipeline_utilisation=0",
       "-o", "distperf_max_tp_comm_share=2")  # 2: past any share (a max passes below it)

#: A two-layer MLP in the shape TP splits: column-wise, then row-wise (one all-reduce of
#: the output per forward; the input needs no gradient, so backward adds none).
MODELS = r'''
import pytest
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

ROWS, WIDTH, HIDDEN = 8, 16, 64
PLAN = {"0": ColwiseParallel(), "2": RowwiseParallel()}
OUTPUT_BYTES = ROWS * WIDTH * 4  # the row-wise layer's output, all-reduced over tp


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, WIDTH))


def batch(index):
    return torch.randn(ROWS, WIDTH) + index


def tp_then_fsdp(model, mesh):
    """torchtitan's order: TP on the tp dimension, then FSDP2 on dp."""
    parallelize_module(model, mesh["tp"], PLAN)
    return fully_shard(model, mesh=mesh["dp"])


def counts(timing):
    return {(c.group, c.op): (c.calls, c.bytes) for c in timing.mesh_counts}


RUN = dict(steps=2, warmup=1, control=False)
'''

TWO_RANKS = MODELS + r'''

def test_tensor_parallel(ddp_step_timer):
    tp = ddp_step_timer(mlp, batch, mesh={"tp": 2}, tp_plan=PLAN, name="tp", **RUN)
    assert counts(tp) == {("tp", "all_reduce"): (1, OUTPUT_BYTES)}
    # the ranks wait in that all-reduce (gloo, CPU): a share of the step, timed on the ranks
    assert 0 < tp.tp_comm_share <= 1
    # the TP group shares one batch: 8 samples a step, not 16
    assert tp.throughput * tp.step_time_s == pytest.approx(ROWS)
    dp = ddp_step_timer(mlp, batch, mesh={"dp": 2}, wrapper="fsdp", name="dp", **RUN)
    assert set(counts(dp)) == {("dp", "all_gather"), ("dp", "reduce_scatter")}
    assert dp.throughput * dp.step_time_s == pytest.approx(2 * ROWS)
    # each TP rank counts the FLOPs of its shard: the two count the model once
    assert dp.flops_per_step == 2 * tp.flops_per_step > 0

    def own(model, mesh):  # the user's parallelize: the same TP, written by hand
        return parallelize_module(model, mesh["tp"], PLAN)

    mine = ddp_step_timer(mlp, batch, mesh={"tp": 2}, parallelize=own, name="own", **RUN)
    assert counts(mine) == counts(tp) and mine.wrapper == "parallelize"
    print("BODY-OK tp")


def test_a_collective_dtensor_issues_inside_an_op(ddp_step_timer):
    # the output stays sharded on its last dimension; the loss's logsumexp over it makes
    # DTensor gather it inside the op, where no hook of the TP plan sees it
    t = ddp_step_timer(lambda: torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN)), batch,
                       mesh={"tp": 2}, tp_plan={"0": ColwiseParallel(use_local_output=False)},
                       loss_fn=lambda out: out.logsumexp(-1).mean(), name="inside", **RUN)
    assert counts(t)[("tp", "all_gather")] == (1, ROWS * HIDDEN * 4)
    print("BODY-OK inside an op")


def test_a_vocabulary_sharded_loss_in_its_train_context(ddp_step_timer):
    from torch.distributed.tensor.parallel import loss_parallel

    def labels(index):  # the target of the TP group's batch
        assert index == 0
        return torch.arange(ROWS) % HIDDEN

    # the cross-entropy's backward needs loss_parallel too: it runs outside loss_fn
    t = ddp_step_timer(lambda: torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN)), batch,
                       mesh={"tp": 2}, tp_plan={"0": ColwiseParallel(use_local_output=False)},
                       loss_fn=torch.nn.functional.cross_entropy, target_fn=labels,
                       train_context=loss_parallel, name="lp", **RUN)
    assert ("tp", "all_reduce") in counts(t)  # the softmax's statistics, not the logits
    assert ("tp", "all_gather") not in counts(t)
    print("BODY-OK loss_parallel")


def test_a_model_compiled_with_fullgraph(ddp_step_timer):
    # the counted step runs it eagerly: torch.compile does not trace under the counters
    t = ddp_step_timer(lambda: torch.compile(mlp(), fullgraph=True, backend="eager"), batch,
                       name="compiled", **RUN)
    assert t.flops_per_step == ddp_step_timer(mlp, batch, name="plain", **RUN).flops_per_step
    assert t.flops_per_step > 0 and {c.op for c in t.comm_counts} == {"all_reduce"}
    print("BODY-OK compiled")


def test_a_mesh_whose_groups_were_not_made_first_is_refused(nccl_group):
    # made on the ranks of one row alone, torch would name the next group differently
    from pytest_distperf.pool.launcher import RankError
    from pytest_distperf.rank.mesh import device_mesh

    with pytest.raises(RankError, match=r"group of ranks \(0,\) was not made before"):
        nccl_group.run(device_mesh, (("dp", 1), ("tp", 2)), "cpu")
    print("BODY-OK groups first")
'''

FOUR_RANKS = MODELS + r'''

def test_a_smaller_group_first(ddp_step_timer):
    # the pool makes the group of ranks 0 and 1; the meshes below must still build
    assert ddp_step_timer(mlp, batch, world_size=2, **RUN).world_size == 2


def makes_a_group():
    group = dist.new_group([0, 1])
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    return total.item()


@pytest.mark.distperf(world_size=2)
def test_a_group_made_by_the_code_of_a_test_on_two_ranks(nccl_group):
    # ranks 2 and 3 made no such group: the meshes below must still build
    assert nccl_group.run(makes_a_group) == [2.0, 2.0]


def test_fsdp_and_tp_on_a_2x2_mesh(ddp_step_timer):
    two_d = ddp_step_timer(mlp, batch, mesh={"dp": 2, "tp": 2}, parallelize=tp_then_fsdp,
                           name="two_d", **RUN)
    found = counts(two_d)
    assert set(found) == {("dp", "all_gather"), ("dp", "reduce_scatter"), ("tp", "all_reduce")}
    assert found[("tp", "all_reduce")] == (1, OUTPUT_BYTES)
    assert two_d.throughput * two_d.step_time_s == pytest.approx(2 * ROWS)  # two dp batches
    # the built-in conveniences: the same TP, and FSDP2 on every child as well as the root
    # (more, smaller all-gathers), so the same gradient bytes reduce-scattered
    builtin = counts(ddp_step_timer(mlp, batch, mesh={"dp": 2, "tp": 2}, tp_plan=PLAN,
                                    wrapper="fsdp", name="builtin", **RUN))
    assert builtin[("tp", "all_reduce")] == found[("tp", "all_reduce")]
    assert builtin[("dp", "reduce_scatter")][1] == found[("dp", "reduce_scatter")][1]
    # FSDP2 over dp=4 without TP (test_tp_size, TP_SIZE=1) gathers the whole parameters,
    # with tp=2 half of them: the outer test reads that from the tp-size comparison
    print("BODY-OK 2x2")


def test_pipeline_and_data_parallel(ddp_step_timer):
    def stage(index, total):
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())

    t = ddp_step_timer.pipeline(stage, batch, mesh={"pp": 2, "dp": 2}, microbatches=2,
                                **RUN)
    found = counts(t)
    assert found[("pp", "send")] == (2, ROWS * WIDTH * 4)  # two microbatches of 4 rows
    assert {("dp", "all_gather"), ("dp", "reduce_scatter")} <= set(found)  # FSDP2 on dp
    assert t.throughput * t.step_time_s == pytest.approx(2 * ROWS)  # one batch per replica
    assert sorted(s.pp_rank for s in t.per_stage) == [0, 0, 1, 1]
    print("BODY-OK pp x dp")


def test_tp_size(ddp_step_timer):
    tp = int(os.environ.get("TP_SIZE", "1"))
    t = ddp_step_timer(mlp, batch, mesh={"dp": 4 // tp, "tp": tp}, tp_plan=PLAN,
                       wrapper="fsdp", **RUN)
    assert t.throughput * t.step_time_s == pytest.approx(4 // tp * ROWS)  # dp batches
    assert (("tp", "all_reduce") in counts(t)) == (tp > 1)
    print("BODY-OK tp size", tp)
'''


def test_fsdp_with_tp_on_a_2x2_mesh_and_a_tp_size_change_explained(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2 on ``dp`` and TP on ``tp`` of a 2 x 2 mesh on 4 gloo ranks: counts on each
    dimension, two batches a step; a pipeline over ``pp`` with FSDP2 on ``dp``.  And a
    baseline saved with tp=1 (dp=4) fails exactly against tp=2 (dp=2), and the failure names
    the dimensions that changed: the same all-gathers on ``dp``, of half the bytes."""
    pytester.makepyfile(test_four=FOUR_RANKS)
    four = ("--distperf", "--gpus", "4", *RUN, "-s", "--distperf-same-ranks")
    # one measurement of each timing saved: the comparison is of the exact metrics
    result = pytester.runpytest(*four, "-k", "test_tp_size", "--distperf-save",
                                *ONE_SAVE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*BODY-OK tp size 1*"])
    monkeypatch.setenv("TP_SIZE", "2")
    report = pytester.path / "report.json"
    # the 2 x 2 tests have no baseline; test_tp_size's timings are not the point: at a
    # tolerance of 100% they are not measured again
    result = pytester.runpytest(*four, "--distperf-tolerance", "1",
                                f"--distperf-json={report}")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*BODY-OK 2x2*", "*BODY-OK pp x dp*", "*BODY-OK tp size 2*"])
    result.stdout.fnmatch_lines(["FAILED test_four.py::test_tp_size - *"])
    result.stdout.fnmatch_lines(["*what changed with it: mesh dp 4 -> 2, tp 1 -> 2; *"])
    (test,) = [t for t in json.loads(report.read_text())["tests"]
               if t["nodeid"].endswith("::test_tp_size")]
    verdicts = {v["metric"]: v for v in test["verdicts"]}
    assert verdicts["comm.tp.all_reduce.calls"]["baseline"] in (0, None)
    assert verdicts["comm.tp.all_reduce.calls"]["verdict"] == "regressed"
    # FSDP2 over 4 ranks without TP gathers the whole parameters; with tp=2 half of them
    gathered = verdicts["comm.dp.all_gather.bytes"]
    assert gathered["verdict"] == "improved" and gathered["current"] < 0.6 * gathered["baseline"]
    assert verdicts["comm.dp.all_gather.calls"]["verdict"] == "unchanged"
    result.stdout.fnmatch_lines(["*dp.all_gather bytes/step*calls unchanged*"])


PROFILED = MODELS + r'''

def test_a_profile_by_mesh_dimension(dist_profiler):
    def setup():
        from torch.distributed.device_mesh import init_device_mesh

        # the user's own mesh: its groups are mapped to dimensions by their ranks
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(mlp(), mesh["tp"], PLAN)
        return model, batch(0)

    def step(state):
        model, x = state
        model(x).sum().backward()

    dist_profiler.mesh = {"dp": 1, "tp": 2}
    report = dist_profiler(step, setup=setup, steps=2)
    assert {(c.group, c.op): (c.calls, c.bytes) for c in report.mesh_counts} == {
        ("tp", "all_reduce"): (2, 2 * OUTPUT_BYTES)}  # one a step, two steps
    trace = json.load(open(report.trace_path))
    labels = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("mesh.")}
    assert labels == {"mesh.tp.all_reduce"}
    print("BODY-OK profile")


def test_a_profile_of_a_pipeline(dist_profiler):
    def setup():
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        rank = dist.get_rank()
        stage = PipelineStage(torch.nn.Linear(WIDTH, WIDTH), rank, 2, torch.device("cpu"))
        return ScheduleGPipe(stage, n_microbatches=4, loss_fn=lambda out, target: out.sum())

    def step(schedule):
        if dist.get_rank() == 0:
            schedule.step(batch(0))
        else:
            schedule.step(target=torch.zeros(ROWS, WIDTH))

    report = dist_profiler(step, setup=setup, steps=2)
    assert len(report.steps) == 2
    for s in report.steps:  # each stage's microbatches, step by step
        for index in (0, 1):
            chunks = s.stage(index)
            assert [(c.kind, c.microbatch) for c in chunks] == [
                (kind, mb) for kind in ("forward", "backward") for mb in range(4)]
            assert {c.rank for c in chunks} == {index}
            assert all(0 <= c.start_s <= c.end_s for c in chunks)
        # a microbatch's forward on stage 1 starts from stage 0's output
        for first, second in zip(s.stage(0)[:4], s.stage(1)[:4], strict=True):
            assert second.start_s >= first.end_s
    trace = json.load(open(report.trace_path))
    assert "pp stage 1 backward mb 3" in {e.get("name") for e in trace["traceEvents"]}
    print("BODY-OK pipeline profile")
'''


def test_tensor_parallel_and_its_profile_by_mesh_dimension_on_two_ranks(
        pytester: pytest.Pytester) -> None:
    """TP (ColwiseParallel/RowwiseParallel) on 2 gloo ranks: one all-reduce of the output
    per step on the ``tp`` dimension, the TP group's shared batch counted once, the
    user's own ``parallelize`` measured as the built-in plan is, a collective DTensor
    issues inside an op counted, ``loss_parallel`` as the ``train_context``, and a model
    compiled with ``fullgraph=True`` counted eagerly.

    ``dist_profiler.mesh``: the collectives of a TP step counted on the ``tp`` dimension of
    the user's own mesh, recorded as ``profile.comm.tp.*``, and labelled in the merged
    trace.  A GPipe schedule's profile: each stage's microbatches in the per-step view, and
    labelled in the trace.  One run, one pool."""
    pytester.makepyfile(test_two=TWO_RANKS, test_prof="import json\n" + PROFILED)
    result = pytester.runpytest("--distperf", "--gpus", "2", *RUN, "-s")
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines(["*BODY-OK tp*", "*BODY-OK inside an op*",
                                 "*BODY-OK loss_parallel*", "*BODY-OK compiled*",
                                 "*BODY-OK groups first*"])
    result.stdout.fnmatch_lines(["*BODY-OK profile*", "*profile.comm.tp.all_reduce.calls*"])
    result.stdout.fnmatch_lines(["*BODY-OK pipeline profile*"])
