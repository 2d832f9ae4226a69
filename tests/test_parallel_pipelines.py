"""Pipelines end to end on gloo ranks, driven through pytester: each named schedule, an
unbalanced split, microbatch counts, slow sends, targets for the loss, and a stage that
hangs.  Stages sleep, so what is asserted holds on any shared host.
"""

from __future__ import annotations

import json

import pytest
from quick_runs import ONE_SAVE

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


#: Stages whose work is a sleep in forward and in backward: no noise of a shared host hides
#: a 40 ms microbatch, and each stage's time is known.
STAGES = r"""
import os
import time

import pytest
import torch


class Nap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class Stage(torch.nn.Module):
    def __init__(self, seconds, blocks=4):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(blocks)])
        self.seconds = seconds

    def forward(self, x):
        return Nap.apply(self.blocks(x), self.seconds)


def batch(index):
    return torch.randn(8, 16)


def counts(timing):
    return {(c.group, c.op): (c.calls, c.bytes) for c in timing.mesh_counts}


MICROBATCH_BYTES = 2 * 16 * 4  # 8 rows in 4 microbatches
"""

TWO_PIPES = ("--distperf", "--gpus", "2", "-p", "no:cacheprovider", "-rA")

PIPELINES = STAGES + r"""

@pytest.mark.distperf(max_imbalance=100)
def test_balanced_gpipe_is_near_its_theory(ddp_step_timer):
    t = ddp_step_timer.pipeline(lambda i, n: Stage(0.04), batch, schedule="GPipe",
                                microbatches=4, steps=4, warmup=1)
    assert (t.schedule, t.stages, t.microbatches) == ("GPipe", 2, 4)
    assert t.bubble_theory == pytest.approx(1 / 5)  # (p - 1) / (m + p - 1)
    # 80 ms of naps per microbatch and stage against a few ms of sends: a few points at most
    assert abs(t.bubble - t.bubble_theory) < 0.05, (t.bubble, t.per_stage)
    assert t.utilisation == pytest.approx(1 - t.bubble)
    for s in t.per_stage:
        assert s.busy_s >= 4 * 0.08 and s.blocks == 4
    assert counts(t) == {("pp", "send"): (4, 4 * MICROBATCH_BYTES),
                         ("pp", "recv"): (4, 4 * MICROBATCH_BYTES)}
    assert t.throughput * t.step_time_s == pytest.approx(8)  # one batch through both stages
    assert not [b for b in t.bottlenecks if b.kind == "pipeline_bubble"]
    print("BODY-OK gpipe", t.bubble, t.bubble_theory)


@pytest.mark.distperf(max_imbalance=100, min_pipeline_utilisation=0)
@pytest.mark.parametrize(("schedule", "theory", "sends"), [
    ("1F1B", 1 / 5, 4),
    ("Interleaved1F1B", 1 / 9, 12),  # two stages a rank: 3 boundaries, 4 microbatches
])
def test_each_schedule(ddp_step_timer, schedule, theory, sends):
    t = ddp_step_timer.pipeline(lambda i, n: Stage(0.01), batch, schedule=schedule,
                                microbatches=4, steps=2, warmup=1, control=False)
    assert t.schedule == schedule and t.bubble_theory == pytest.approx(theory)
    assert counts(t)[("pp", "send")][0] == sends
    assert 0.0 <= t.bubble <= 1.0 and t.schedule_time_s > 4 * 0.02


def test_an_unbalanced_split_is_named(ddp_step_timer):
    # stage 1 naps twice as long as stage 0, in 4 blocks each
    t = ddp_step_timer.pipeline(lambda i, n: Stage(0.02 if i == 0 else 0.04), batch,
                                microbatches=4, steps=3, warmup=1)
    assert t.slowest_stage == 1 and t.stage_ratio > 1.5
    (stage,) = [b for b in t.bottlenecks if b.kind == "stage_imbalance"]
    assert stage.ranks == (1,)
    assert stage.suggestion.startswith("stage 1 takes ")  # about 2x: 160 ms of naps vs 320
    assert stage.suggestion.endswith("x stage 0: move 1 of its 4 blocks to stage 0")
    print("BODY-OK unbalanced")


@pytest.mark.distperf(max_imbalance=100, min_pipeline_utilisation=0)
def test_microbatch_count(ddp_step_timer):
    m = int(os.environ.get("MICROBATCHES", "4"))
    ddp_step_timer.pipeline(lambda i, n: Stage(0.002), batch, microbatches=m, steps=3,
                            warmup=1, control=False)


def slow_sends(index, total):
    # a stage on a rank whose forward sends each take 30 ms more (a slow link): torch's
    # schedules post their sends through _sorted_batch_p2p.  Last in the module: the ranks
    # keep the patch.
    from torch.distributed.pipelining import schedules

    post = schedules._sorted_batch_p2p

    def slow(ops, desc=None):
        if desc == "fwd_send":
            time.sleep(0.03)
        return post(ops, desc=desc)

    if not getattr(post, "slow", False):
        slow.slow = True
        schedules._sorted_batch_p2p = slow
    return Stage(0.01)


@pytest.mark.distperf(max_imbalance=100, min_pipeline_utilisation=0)
def test_slow_sends_are_exposed_communication(ddp_step_timer):
    t = ddp_step_timer.pipeline(slow_sends, batch, microbatches=4, steps=3, warmup=1,
                                control=False)
    # stage 0 idles 30 ms after each of its first 3 forwards, stage 1 waits 30 ms for each
    # of its 4 inputs: 105 ms a step on average
    assert t.exposed_comm_s >= 0.07, (t.exposed_comm_s, t.per_stage)
    assert t.per_stage[1].exposed_comm_s >= 0.09
    print("BODY-OK slow sends", t.exposed_comm_s)
"""


#: torch.distributed.pipelining's loss_fn(output, target) with a target per data index, and
#: batches or targets whose rows do not split into the microbatches.
TARGETS = STAGES + r"""

def ids(index):  # the target of row r is r: 8 rows in 4 microbatches of 2
    return torch.arange(8)


def regress(output, target):
    assert target.tolist() in ([0, 1], [2, 3], [4, 5], [6, 7]), target
    return ((output - target[:, None]) ** 2).mean()


@pytest.mark.distperf(max_imbalance=100, min_pipeline_utilisation=0)
def test_a_target_for_the_loss(ddp_step_timer):
    t = ddp_step_timer.pipeline(lambda i, n: Stage(0.001), batch, loss_fn=regress,
                                target_fn=ids, microbatches=4, steps=2, warmup=1,
                                control=False)
    assert counts(t)[("pp", "send")][0] == 4
    print("BODY-OK target")


def test_rows_that_do_not_split(ddp_step_timer):
    ddp_step_timer.pipeline(lambda i, n: Stage(0.001), lambda i: torch.randn(4, 16),
                            schedule="Interleaved1F1B", microbatches=3, steps=1, warmup=0)


def test_a_target_that_does_not_split(ddp_step_timer):
    ddp_step_timer.pipeline(lambda i, n: Stage(0.001), batch, loss_fn=regress,
                            target_fn=lambda i: torch.arange(6), steps=1, warmup=0)
"""


def test_pipelines_on_two_ranks(pytester: pytest.Pytester) -> None:
    """GPipe, 1F1B and interleaved 1F1B on 2 gloo ranks: a balanced GPipe bubble within a
    few points of (p - 1) / (m + p - 1), each schedule's sends counted, an unbalanced split
    named with the blocks to move (and failing ``max_imbalance``), slow sends measured as
    the ``pp`` dimension's exposed communication.  A target given to the loss in
    microbatches; a batch or target whose rows do not split into them refused by name."""
    pytester.makepyfile(test_pipes=PIPELINES, test_targets=TARGETS)
    result = pytester.runpytest(*TWO_PIPES, "-s", "-k", "not test_microbatch_count")
    result.assert_outcomes(passed=5, failed=3)
    result.stdout.fnmatch_lines(["*BODY-OK gpipe*", "*BODY-OK unbalanced*",
                                 "*BODY-OK slow sends*", "*BODY-OK target*"])
    result.stdout.fnmatch_lines([
        "*raised ValueError: ddp_step_timer.pipeline: batch_fn(0) has 4 rows (shape (4, 16)), "
        "which do not split into microbatches=3 equal parts; give a multiple of 3 rows, or "
        "microbatches= a divisor of 4*",
        "*raised ValueError: ddp_step_timer.pipeline: target_fn(0) has 6 rows*"])
    result.stdout.no_fnmatch_line("*arg_mbs*")
    result.stdout.fnmatch_lines([
        "*threshold breach(es) in *test_an_unbalanced_split_is_named*",
        "*pipeline.stage_imbalance = * exceeds max_imbalance = 0.100 (ranks involved: 1)*",
        "*suggestion: stage 1 takes *x stage 0: move 1 of its 4 blocks to stage 0*"])


def test_a_microbatch_count_change_fails_exactly(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipeline's baseline saved with 4 microbatches fails exactly against 8: twice the
    sends, the same bytes."""
    pytester.makepyfile(test_pipes=PIPELINES)
    only = (*TWO_PIPES, "-k", "test_microbatch_count", "--distperf-same-ranks")
    pytester.runpytest(*only, "--distperf-save", *ONE_SAVE).assert_outcomes(passed=1)
    monkeypatch.setenv("MICROBATCHES", "8")
    report = pytester.path / "report.json"
    # the timings are not the point: at a tolerance of 100% they are not measured again
    result = pytester.runpytest(*only, "--distperf-tolerance", "1",
                                f"--distperf-json={report}")
    result.assert_outcomes(failed=1)
    (test,) = json.loads(report.read_text())["tests"]
    verdicts = {v["metric"]: v for v in test["verdicts"]}
    sends = verdicts["comm.pp.send.calls"]
    assert (sends["verdict"], sends["baseline"], sends["current"]) == ("regressed", 4, 8)
    assert verdicts["comm.pp.send.bytes"]["verdict"] == "unchanged"
    result.stdout.fnmatch_lines(["*pp.send calls/step 4 -> 8, bytes unchanged*"])


HANG = STAGES + r"""

def test_a_stage_that_never_returns(ddp_step_timer):
    def stage(index, total):
        return Stage(3600 if index == 1 else 0.001)  # stage 1 never finishes a forward

    ddp_step_timer.pipeline(stage, batch, microbatches=2, steps=1, warmup=0, control=False)


@pytest.mark.distperf(max_imbalance=100, min_pipeline_utilisation=0)
def test_the_next_test_gets_a_fresh_pool(ddp_step_timer):
    t = ddp_step_timer.pipeline(lambda i, n: Stage(0.001), batch, microbatches=2, steps=1,
                                warmup=0, control=False)
    assert counts(t)[("pp", "send")][0] == 2
"""


def test_a_pipeline_that_hangs_is_reported_like_any_hang(pytester: pytest.Pytester) -> None:
    """A stage stuck in its forward: the pool's timeout names the stuck ranks with what
    they were doing, and the next test runs on a fresh pool."""
    pytester.makepyfile(test_hang=HANG)
    # the stuck call is over after 8 s; the others take a second or two, under load too
    result = pytester.runpytest(*TWO_PIPES, "--distperf-timeout", "8")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ddp_step_timer.pipeline(GPipe, 2 microbatches, pp=2)*"
                                 "did not finish*"])
