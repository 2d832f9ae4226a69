"""2-D and 3-D parallel training end to end: real TP, FSDP2 + TP on a 2 x 2 mesh and
pipelines on gloo ranks, driven through pytester.

What is asserted is exact (collective counts by mesh dimension, samples and FLOPs per step)
or made of sleeps no shared host can hide; timings are left to the benchmarks.  Each
generated module runs in one pytest subprocess (one rank pool): 2 ranks, and 4 only where
the 2 x 2 mesh or 4 stages is the point.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

RUN = ("-p", "no:cacheprovider", "-rA", "-o", "distperf_max_comm_overhead=1",
       "-o", "distperf_max_imbalance=100")

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


RUN = dict(steps=3, warmup=1, control=False)
'''

TWO_RANKS = MODELS + r'''

def test_tensor_parallel(ddp_step_timer):
    tp = ddp_step_timer(mlp, batch, mesh={"tp": 2}, tp_plan=PLAN, name="tp", **RUN)
    assert counts(tp) == {("tp", "all_reduce"): (1, OUTPUT_BYTES)}
    # the TP group shares one batch: 8 samples a step, not 16
    assert tp.throughput * tp.step_time_s == pytest.approx(ROWS)
    dp = ddp_step_timer(mlp, batch, mesh={"dp": 2}, wrapper="fsdp", name="dp", **RUN)
    assert set(counts(dp)) == {("dp", "all_gather"), ("dp", "reduce_scatter")}
    assert dp.throughput * dp.step_time_s == pytest.approx(2 * ROWS)
    # each TP rank counts the global op: one of them counts for the group
    assert dp.flops_per_step == 2 * tp.flops_per_step > 0

    def own(model, mesh):  # the user's parallelize: the same TP, written by hand
        return parallelize_module(model, mesh["tp"], PLAN)

    mine = ddp_step_timer(mlp, batch, mesh={"tp": 2}, parallelize=own, name="own", **RUN)
    assert counts(mine) == counts(tp) and mine.wrapper == "parallelize"
    print("BODY-OK tp")
'''

FOUR_RANKS = MODELS + r'''

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
    # FSDP2 over 4 ranks without TP gathers the whole parameters; with tp=2 half of them
    dp_only = ddp_step_timer(mlp, batch, mesh={"dp": 4}, wrapper="fsdp", name="dp4", **RUN)
    whole, split = counts(dp_only)[("dp", "all_gather")], builtin[("dp", "all_gather")]
    assert whole[0] == split[0] and split[1] < 0.6 * whole[1]
    assert dp_only.throughput * dp_only.step_time_s == pytest.approx(4 * ROWS)
    print("BODY-OK 2x2")


def test_tp_size(ddp_step_timer):
    tp = int(os.environ.get("TP_SIZE", "1"))
    ddp_step_timer(mlp, batch, mesh={"dp": 4 // tp, "tp": tp}, tp_plan=PLAN, wrapper="fsdp",
                   **RUN)
'''


def test_tensor_parallel_counts_and_normalisation_on_two_ranks(
        pytester: pytest.Pytester) -> None:
    """TP (ColwiseParallel/RowwiseParallel) on 2 gloo ranks: one all-reduce of the output
    per step on the ``tp`` dimension, the TP group's shared batch counted once, and the
    user's own ``parallelize`` measured as the built-in plan is."""
    pytester.makepyfile(test_two=TWO_RANKS)
    result = pytester.runpytest_subprocess("--distperf", "--gpus", "2", *RUN, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*BODY-OK tp*"])


def test_fsdp_with_tp_on_a_2x2_mesh_and_a_tp_size_change_explained(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP2 on ``dp`` and TP on ``tp`` of a 2 x 2 mesh on 4 gloo ranks: counts on each
    dimension, two batches a step.  Then a baseline saved with tp=1 (dp=4) fails exactly
    against tp=2 (dp=2), and the failure names the dimensions that changed."""
    pytester.makepyfile(test_four=FOUR_RANKS)
    four = ("--distperf", "--gpus", "4", *RUN)
    result = pytester.runpytest_subprocess(*four, "-s", "--distperf-save",
                                           "--distperf-same-ranks")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*BODY-OK 2x2*"])
    monkeypatch.setenv("TP_SIZE", "2")
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess(*four, "-k", "test_tp_size", "--distperf-same-ranks",
                                           f"--distperf-json={report}")
    result.assert_outcomes(failed=1)
    (test,) = json.loads(report.read_text())["tests"]
    verdicts = {v["metric"]: v for v in test["verdicts"]}
    assert verdicts["comm.tp.all_reduce.calls"]["baseline"] in (0, None)
    gathered = verdicts["comm.dp.all_gather.bytes"]
    assert gathered["verdict"] == "improved" and gathered["current"] < 0.6 * gathered["baseline"]
    result.stdout.fnmatch_lines(["*dp.all_gather bytes/step*calls unchanged*"])
