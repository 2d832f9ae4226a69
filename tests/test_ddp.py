"""``ddp_step_timer`` end to end: real DDP and FSDP2 on gloo ranks, driven through pytester.

One generated test module runs in one pytest run (one rank pool) to keep the suite
fast.  Timing verdicts rest only on effects no noise can hide: a rank made 4x slower by a
sleep, 16 MiB of gradients against a batch of one row, a per-step sleep that strong scaling
cannot shrink.  Tests expected to fail on a threshold print ``BODY-OK`` when their own
assertions passed, so that the failure is known to be the threshold's.
"""

from __future__ import annotations

import json

import pytest

MODULE = r'''
import json
import time

import pytest
import torch
import torch.distributed as dist

from pytest_distperf.fixtures.results.steps import StepTiming
from pytest_distperf.records import from_dict, to_dict

PHASES = {"forward", "backward", "optimizer", "step", "no_sync_step"}


class Sleepy(torch.nn.Module):
    """A step whose work is a sleep in forward: no noise of a shared machine can hide a 4x
    difference between ranks."""

    def __init__(self, base=0.05, slow_rank=None, slow=0.2):
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.base, self.slow_rank, self.slow = base, slow_rank, slow

    def forward(self, x):
        time.sleep(self.slow if dist.get_rank() == self.slow_rank else self.base)
        return self.lin(x)


def batch(rank):
    return torch.randn(8, 32)


def big_model():
    # 4 x (1024 x 1024 + 1024) float32 parameters: 16 MiB of gradients per step
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])


BIG_BYTES = 4 * (1024 * 1024 + 1024) * 4


def compute_model():
    # little to synchronise (130 KB), a lot to compute (8192 rows: ~150 ms a step here)
    return torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128))


def kinds(result):
    return [b.kind for b in result.bottlenecks]


def test_balanced(ddp_step_timer):
    t = ddp_step_timer(Sleepy, batch, steps=5, warmup=1)  # 50 ms on both ranks
    assert (t.world_size, t.wrapper, t.steps) == (2, "ddp", 5)
    assert t.stragglers == [] and t.imbalance < 0.10
    assert not {"imbalance", "straggler"} & set(kinds(t))
    assert t.step_time_s >= 0.05 and t.compute_time_s >= 0.05
    assert t.throughput == pytest.approx(16 / t.step_time_s)
    assert set(t.phases) == PHASES
    assert len(t.per_rank) == 2
    for r in t.per_rank:
        assert r.batch_size == 8 and not r.straggler
        assert r.compute_time_s >= 0.05 and r.phases["forward"].median_s >= 0.05
        assert r.peak_memory_bytes > 0 and r.memory_source == "rss"
        assert r.memory_capacity_bytes > 0
    (ar,) = t.communication
    assert ar.op == "all_reduce" and ar.count >= 2 * 5 and ar.total_bytes > 0
    assert ar.slowest is not None
    assert t.comm_time_s is not None and t.comm_time_s > 0
    assert 0.0 <= t.overlap <= 1.0
    # the names that say how the step timer measures (docs/metrics.md, "One vocabulary")
    assert (t.overlap_by_cost, t.comm_overhead_by_cost) == (t.overlap, t.comm_overhead)
    assert len(t.samples["step_s"]) == 5 and len(t.samples["imbalance"]) == 5
    assert from_dict(StepTiming, json.loads(json.dumps(to_dict(t)))) == t


def test_straggler(ddp_step_timer):
    # rank 1 sleeps 80 ms per step, rank 0 20 ms
    t = ddp_step_timer(lambda: Sleepy(0.02, slow_rank=1, slow=0.08), batch, steps=5, warmup=1)
    assert t.stragglers == [1]
    assert t.imbalance > 0.5
    assert "imbalance" in kinds(t) and "straggler" in kinds(t)
    (strag,) = [b for b in t.bottlenecks if b.kind == "straggler"]
    assert strag.ranks == (1,)
    r0, r1 = t.per_rank
    assert r1.straggler and not r0.straggler
    assert r1.compute_time_s > 2 * r0.compute_time_s
    assert r0.wait_time_s > r1.wait_time_s  # the rank the others wait for waits least
    assert t.batch_shares[0] > t.batch_shares[1] >= 0.05
    assert sum(t.batch_shares) == pytest.approx(1.0)
    assert any("rebalance" in line for line in t.recommendations)
    assert t.comm_overhead < 0.30  # waiting for a straggler is not communication
    print("BODY-OK straggler")


def test_back_to_back(nccl_group):
    """The GPU's timing forced on CPU ranks: each block of steps queued back to back, one
    drain per block.  Rank 1 sleeps 80 ms a step, rank 0 20 ms: rank 0's synchronised steps
    wait for rank 1 in every all-reduce, its no-sync steps do not, and rank 1 straggles."""
    from pytest_distperf.analysis.analyzer import analyze_steps
    from pytest_distperf.rank.ddp import StepSpec, time_steps

    spec = StepSpec(lambda: Sleepy(0.02, slow_rank=1, slow=0.08), batch, steps=5, warmup=1,
                    back_to_back=True, count_collectives=False)
    r0, r1 = nccl_group.run(time_steps, spec)
    assert len(r0.step_s) == len(r0.no_sync_step_s) == 5
    assert r0.control_s == () and r0.comm == ()  # no control, no hook between steps
    # the host-speed control outside the blocks: three readings before, three after
    assert len(r0.host_control_s) == len(r1.host_control_s) == 6
    assert all(0 < c < 1 for c in r0.host_control_s)
    assert min(r0.step_s) > 0.07 and max(r0.no_sync_step_s) < min(r1.no_sync_step_s)
    assert all(abs(f + b + o - s) < 1e-6 for f, b, o, s in zip(
        r0.forward_s, r0.backward_s, r0.optimizer_s, r0.step_s))  # the step's own parts
    timing = analyze_steps([r0, r1])
    assert timing.stragglers == [1]
    assert len(timing.samples["host_control_s"]) == 6 and "control_s" not in timing.samples


def test_comm_heavy(ddp_step_timer):
    t = ddp_step_timer(big_model, lambda rank: torch.randn(1, 1024), steps=4, warmup=1)
    assert t.comm_overhead > 0.5
    assert "communication" in kinds(t)
    (ar,) = t.communication
    assert ar.total_bytes == 2 * 4 * BIG_BYTES
    assert ar.avg_bandwidth_gbps > 0 and ar.peak_bandwidth_gbps >= ar.avg_bandwidth_gbps
    # counted from one step's trace: every gradient byte, once, in one call per bucket
    (count,) = t.comm_counts
    assert (count.op, count.bytes) == ("all_reduce", BIG_BYTES)
    assert count.calls == t.buckets == ar.count // (2 * 4)
    print("BODY-OK comm")


# CPU-bound ranks on a shared machine: noisy imbalance.  This model's exposed communication
# reads 0.01-0.15 of the step on 2 cores (the comm-heavy one: 0.7-0.8), and once 0.32, with
# the host stalling its synchronised steps: the limit sits between the two models
@pytest.mark.distperf(max_imbalance=10.0, max_comm_overhead=0.5)
def test_compute_heavy(ddp_step_timer):
    t = ddp_step_timer(compute_model, lambda rank: torch.randn(8192, 128), steps=5, warmup=1)
    assert t.comm_overhead < 0.5
    assert "communication" not in kinds(t)


@pytest.mark.distperf(max_imbalance=10.0, max_comm_overhead=2.0)
def test_fsdp(ddp_step_timer):
    t = ddp_step_timer(lambda: torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                                   torch.nn.Linear(64, 8)),
                       lambda rank: torch.randn(8, 64), steps=5, warmup=1, wrapper="fsdp")
    assert (t.world_size, t.wrapper, t.steps) == (2, "fsdp", 5)
    assert t.step_time_s > 0 and len(t.per_rank) == 2
    assert t.phases["backward"].count == 5
    assert t.communication == [] and t.comm_time_s is None and t.overlap is None


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.mlp = torch.nn.LayerNorm(32), torch.nn.Linear(32, 32)

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class GPTish(torch.nn.Module):
    """Blocks in a ModuleDict/ModuleList, as GPT- and HF-style models keep them: the
    containers have no forward, and fully_shard refuses them."""

    def __init__(self):
        super().__init__()
        self.transformer = torch.nn.ModuleDict({
            "wte": torch.nn.Embedding(64, 32),
            "h": torch.nn.ModuleList([Block() for _ in range(2)]),
            "ln_f": torch.nn.LayerNorm(32)})
        self.lm_head = torch.nn.Linear(32, 64)

    def forward(self, idx):
        x = self.transformer["wte"](idx)
        for block in self.transformer["h"]:
            x = block(x)
        return self.lm_head(self.transformer["ln_f"](x))

    def configure_optimizers(self, lr):
        return torch.optim.AdamW(self.parameters(), lr=lr)


@pytest.mark.distperf(max_imbalance=10.0, max_comm_overhead=2.0)
def test_fsdp_gpt_style(ddp_step_timer):
    tokens = lambda rank: torch.randint(0, 64, (4, 16))  # noqa: E731
    t = ddp_step_timer(GPTish, tokens, steps=3, warmup=1, wrapper="fsdp",
                       optimizer_fn=lambda model: model.configure_optimizers(1e-3))
    counts = {c.op: c for c in t.comm_counts}
    # the root and 4 blocks (wte, 2 x Block, ln_f) gather their parameters for forward and
    # backward and reduce-scatter their gradients: counted, every one
    assert {"all_gather", "reduce_scatter"} <= set(counts)
    assert counts["reduce_scatter"].calls == 5 and counts["all_gather"].calls >= 5
    # gloo runs each reduce-scatter as an all-reduce: counted as the reduce-scatter the
    # step called, never as an all-reduce of its own
    assert "all_reduce" not in counts
    only_blocks = ddp_step_timer(GPTish, tokens, steps=2, warmup=1, wrapper="fsdp",
                                 fsdp_policy=(Block,), name="blocks")
    gathers = {c.op: c.calls for c in only_blocks.comm_counts}
    assert gathers["reduce_scatter"] == 3  # the root and the two Blocks
    print("BODY-OK gpt")


class TiedGPT(GPTish):
    """The token embedding tied to the head, as nanoGPT and most HF models have it."""

    def __init__(self):
        super().__init__()
        self.transformer["wte"].weight = self.lm_head.weight


def presharded_gpt():
    from torch.distributed.fsdp import fully_shard

    model = TiedGPT()
    for block in model.transformer["h"]:  # the usual FSDP2 recipe: the blocks, then the root
        fully_shard(block)
    return model


@pytest.mark.distperf(max_imbalance=10.0, max_comm_overhead=2.0)
def test_fsdp_tied_weights(ddp_step_timer):
    tokens = lambda rank: torch.randint(0, 64, (4, 16))  # noqa: E731
    run = dict(steps=2, warmup=1, wrapper="fsdp", control=False)
    # the tied embedding stays with the root (and the head): the root, 2 Blocks and ln_f
    tied = ddp_step_timer(TiedGPT, tokens, **run)
    assert {c.op: c.calls for c in tied.comm_counts}["reduce_scatter"] == 4
    # blocks sharded in model_fn are kept as they are; the timer shards ln_f and the root
    pre = ddp_step_timer(presharded_gpt, tokens, name="pre", **run)
    assert {c.op: c.calls for c in pre.comm_counts}["reduce_scatter"] == 4
    # a policy that puts the tied weight in a group of its own is refused, with the way out
    with pytest.raises(Exception, match=r"tied parameters 'transformer.wte.weight' and "
                                        r"'lm_head.weight'.*fsdp_policy="):
        ddp_step_timer(TiedGPT, tokens, name="split", fsdp_policy=torch.nn.Embedding, **run)
    print("BODY-OK tied")


@pytest.mark.distperf(min_scaling_efficiency=0.25)  # a loaded 2-core machine: far from 1.0
def test_weak_scaling(ddp_step_timer):
    r = ddp_step_timer.scaling(Sleepy, batch, world_sizes=(2, 1), steps=4, warmup=1)
    assert r.mode == "weak"
    assert [p.world_size for p in r.points] == [1, 2]
    assert r.efficiency[1] == 1.0 and r.points[0].speedup == 1.0
    assert r.efficiency[2] > 0.25
    assert r.points[1].throughput > r.points[0].throughput


def test_strong_scaling(ddp_step_timer):
    # a fixed sleep per step: splitting the global batch over 2 ranks cannot make it faster
    r = ddp_step_timer.scaling(lambda: Sleepy(0.02), lambda rank: torch.randn(16, 32),
                               world_sizes=(1, 2), mode="strong", steps=6, warmup=1)
    assert r.efficiency[1] == 1.0
    assert r.efficiency[2] < 0.7
    for p in r.points:  # the global batch is the same at both sizes
        assert p.throughput * p.step_time_s == pytest.approx(16)
    assert [b.kind for b in r.bottlenecks] == ["low_scaling"]
    print("BODY-OK strong")


def test_refusals(ddp_step_timer):
    with pytest.raises(ValueError, match=r"asks for 4 ranks but only 2 are available "
                                         r"\(--gpus 2\)"):
        ddp_step_timer.scaling(Sleepy, batch, world_sizes=(1, 2, 4))
    with pytest.raises(ValueError, match=r"asks for 3 ranks but only 2 are available"):
        ddp_step_timer(Sleepy, batch, world_size=3)
    with pytest.raises(ValueError, match=r"mesh dp=2 x tp=3 asks for 6 ranks"):
        ddp_step_timer(Sleepy, batch, mesh={"dp": 2, "tp": 3}, tp_plan={}, wrapper="fsdp")
    with pytest.raises(TypeError, match="train_context must be a callable"):
        ddp_step_timer(Sleepy, batch, train_context=object())
    with pytest.raises(TypeError, match="target_fn= gives the loss a target, but no loss_fn"):
        ddp_step_timer(Sleepy, batch, target_fn=batch)
    with pytest.raises(ValueError, match="target_fn= and batch_shares= do not go together"):
        ddp_step_timer(Sleepy, batch, target_fn=batch, loss_fn=lambda o, t: o.sum(),
                       batch_shares="auto")
    with pytest.raises(ValueError, match="wrapper must be one of ddp, fsdp"):
        ddp_step_timer(Sleepy, batch, wrapper="zero")
    with pytest.raises(ValueError, match="mode must be one of weak, strong"):
        ddp_step_timer.scaling(Sleepy, batch, world_sizes=(1, 2), mode="diagonal")
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        ddp_step_timer(Sleepy, batch, steps=0)


def test_bad_batch(ddp_step_timer):
    ddp_step_timer(Sleepy, lambda rank: [1, 2, 3], steps=1, warmup=0)


class PartlyUsed(torch.nn.Module):
    """A layer forward never uses: DDP needs find_unused_parameters=True for it."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):
        return self.used(x)


@pytest.mark.distperf(max_imbalance=10.0, max_comm_overhead=2.0)
def test_ddp_options_reach_the_wrapper(ddp_step_timer):
    def counts(t):
        return {c.op: (c.calls, c.bytes) for c in t.comm_counts}

    run = dict(steps=2, warmup=1, control=False)
    plain = counts(ddp_step_timer(lambda: torch.nn.Linear(32, 32), batch, **run))
    # find_unused_parameters: the used-parameter map, one more small all-reduce per step;
    # the unused layer's gradients are synchronised too (zeros): twice the bytes
    unused = counts(ddp_step_timer(PartlyUsed, batch, name="unused",
                                   wrapper_kwargs={"find_unused_parameters": True}, **run))
    assert unused["all_reduce"][0] == plain["all_reduce"][0] + 1
    assert unused["all_reduce"][1] >= 2 * plain["all_reduce"][1]
    # static_graph: the same gradients, bucketed as ever
    static = counts(ddp_step_timer(lambda: torch.nn.Linear(32, 32), batch, name="static",
                                   wrapper_kwargs={"static_graph": True}, **run))
    assert static["all_reduce"][1] == plain["all_reduce"][1]
    # and an option DDP does not know is DDP's own error, from the ranks
    with pytest.raises(Exception, match="no_such_option"):
        ddp_step_timer(Sleepy, batch, steps=1, warmup=0, name="bad",
                       wrapper_kwargs={"no_such_option": 1})
    print("BODY-OK options", unused, static)
'''


def run_module(pytester: pytest.Pytester) -> tuple[pytest.RunResult, dict]:
    pytester.makepyfile(test_gen=MODULE)
    # a project-wide threshold from the ini file (markers still override it)
    pytester.makeini("[pytest]\ndistperf_min_scaling_efficiency = 0.75\n")
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        "--distperf", "--gpus", "2", "-p", "no:cacheprovider", "-rA",
        "--distperf-json", str(report))
    data = json.loads(report.read_text()) if report.exists() else {}
    return result, data


def test_ddp_step_timer_end_to_end(pytester: pytest.Pytester) -> None:
    result, data = run_module(pytester)
    result.assert_outcomes(passed=9, failed=4)
    out = result.stdout

    # balanced, compute-heavy, FSDP2 and weak scaling pass on their thresholds
    for name in ("test_balanced", "test_back_to_back", "test_compute_heavy", "test_fsdp",
                 "test_fsdp_gpt_style",
                 "test_fsdp_tied_weights", "test_weak_scaling", "test_refusals",
                 "test_ddp_options_reach_the_wrapper"):
        out.fnmatch_lines([f"PASSED test_gen.py::{name}*"])

    # the straggler is named and fails max_imbalance with the ranks and the batch shares
    out.fnmatch_lines([
        "*_ test_straggler _*",
        "distperf: 1 threshold breach(es) in test_gen.py::test_straggler:",
        "  imbalance = * exceeds max_imbalance = 0.100 (ranks involved: 1)",
        "    suggestion: rebalance the per-rank batch to rank 0: *%, rank 1: *% of the "
        "global batch*",
        "*BODY-OK straggler*",
    ])
    # a large model with tiny compute fails max_comm_overhead
    out.fnmatch_lines([
        "*_ test_comm_heavy _*",
        "  comm_overhead = * exceeds max_comm_overhead = 0.300",
        "    suggestion: *",
        "*BODY-OK comm*",
    ])
    # scaling efficiency is recorded and checked against its threshold (here the ini's)
    out.fnmatch_lines([
        "*_ test_strong_scaling _*",
        "  scaling_efficiency.w2 = * is below min_scaling_efficiency = 0.750",
        "    suggestion: *",
        "*BODY-OK strong*",
    ])
    # an error on the ranks comes back with the rank and the reason
    out.fnmatch_lines(["*rank 0 raised TypeError: ddp_step_timer: batch_fn(rank) must "
                       "return a tensor or a tuple of tensors, got int, int, int*"])
    assert "AssertionError" not in out.str()

    # the summary and the JSON report carry the metrics and the results
    out.fnmatch_lines(["*distperf summary*"])
    out.fnmatch_lines(["test_gen.py::test_balanced [[]2 ranks[]] ok",
                       "    step_time_s *", "    throughput * samples/s",
                       "    comm_overhead *", "    imbalance *"])
    out.fnmatch_lines(["test_gen.py::test_straggler [[]2 ranks[]] BREACH*",
                       "    finding: imbalance (high, ranks 1): per-rank compute differs by *",
                       "    finding: straggler (high, ranks 1): rank 1 computes *"])
    out.fnmatch_lines(["test_gen.py::test_weak_scaling [[]2 ranks[]] ok",
                       "    scaling_throughput.w1 *", "    scaling_throughput.w2 *",
                       "    scaling_efficiency.w2 *"])
    tests = {t["nodeid"].split("::")[1]: t for t in data["tests"]}
    straggler = tests["test_straggler"]
    assert straggler["results"][0]["result"]["stragglers"] == [1]
    imbalance = next(m for m in straggler["metrics"] if m["name"] == "imbalance")
    assert imbalance["threshold"] == "max_imbalance" and imbalance["ranks"] == [1]
    assert len(imbalance["samples"]) == 5
    # the host-speed control after every synchronised step, one per step time
    step = next(m for m in straggler["metrics"] if m["name"] == "step_time_s")
    assert len(step["control"]) == len(step["samples"]) == 5 and min(step["control"]) > 0
    # and the memory control after each of those
    assert len(step["memory_control"]) == 5 and min(step["memory_control"]) > 0
    kinds = {m["name"]: m["kind"] for m in tests["test_balanced"]["metrics"]}
    assert kinds == {"step_time_s": "", "throughput": "informational", "comm_overhead": "",
                     "imbalance": "informational",  # on CPU ranks, with the control
                     "compute_time_s": "", "exposed_comm_s": "informational",
                     "comm.all_reduce.calls": "exact", "comm.all_reduce.bytes": "exact",
                     "comm.buckets": "exact", "flops_per_step": "exact",
                     "achieved_tflops": "informational"}  # no mfu: a CPU has no known peak
    values = {m["name"]: m["value"] for m in tests["test_balanced"]["metrics"]}
    # Sleepy's Linear(32, 32): 1056 float32 gradients in one bucket
    assert values["comm.all_reduce.bytes"] == 1056 * 4
    assert values["comm.all_reduce.calls"] == values["comm.buckets"] == 1
    # its FLOPs on a batch of 8, per rank: 2*8*32*32 forward, the same again for the
    # weight's gradient (the input needs none); 2 ranks
    assert values["flops_per_step"] == 2 * (2 * 8 * 32 * 32) * 2


def test_a_bad_ini_threshold_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ndistperf_max_imbalance = lots\n")
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distperf_max_imbalance: expected a number, got 'lots' "
                                 "(from distperf_max_imbalance in *tox.ini)*"])
    assert "Traceback" not in result.stderr.str()


def test_ddp_step_timer_is_skipped_without_distperf(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_skip="""
        def test_timer(ddp_step_timer):
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*--distperf*"])


# -- the controller side alone: recording and remeasuring (no ranks) --------------------------
class RecordingGroup:
    """Stands in for the DistGroup (not for torch.distributed): hands out synthetic rank
    records and keeps what the timer records."""

    def __init__(self, world_size: int = 2, available: int = 2) -> None:
        from types import SimpleNamespace

        self.world_size = world_size
        self.device_type = "cpu"
        self.flops = 0  # per rank and step, as the ranks would count them
        self.engine = SimpleNamespace(world_size=available, rank_info=lambda: [
            {"rank": r, "device_model": "cpu"} for r in range(available)])
        self.calls: list[tuple[str, int]] = []
        self.recorded: list[tuple[str, list, object, object]] = []
        self.fresh_ranks: list[bool] = []  # whether each may be re-measured on fresh ranks

    def call(self, fn, args, kwargs, label, world_size=None, groups=()):  # type: ignore[no-untyped-def]
        from pytest_distperf.records import RankStep

        size = world_size or self.world_size
        self.calls.append((label, size))
        slow = 0.04 * (1 + len(self.calls) % 2)  # changes between calls: a fresh measurement
        return [RankStep(rank=r, batch_size=4, forward_s=(0.01,) * 3, backward_s=(0.02,) * 3,
                         optimizer_s=(0.001,) * 3, step_s=(slow + 0.01,) * 3,
                         no_sync_step_s=(slow,) * 3, flops=self.flops) for r in range(size)]

    def record(self, label, metrics, result=None, remeasure=None,  # type: ignore[no-untyped-def]
               *, fresh_ranks=False):
        self.recorded.append((label, list(metrics), result, remeasure))
        self.fresh_ranks.append(fresh_ranks)


def test_timer_records_metrics_and_a_remeasure_of_the_same_names() -> None:
    from pytest_distperf.fixtures.steptimer import DDPStepTimer

    group = RecordingGroup()
    timer = DDPStepTimer(group)  # type: ignore[arg-type]
    t = timer(lambda: None, lambda rank: None, steps=3, name="m")
    (label, metrics, result, remeasure) = group.recorded[0]
    assert result is t and label == "ddp_step_timer(m.ddp, 2 ranks)"
    names = [m.name for m in metrics]
    assert names == ["m.step_time_s", "m.throughput", "m.comm_overhead", "m.imbalance",
                     "m.compute_time_s", "m.exposed_comm_s"]  # no counts: no census trace
    again = remeasure()
    assert [m.name for m in again] == names
    assert again[0].value != metrics[0].value  # measured again, not replayed
    assert len(group.calls) == 2
    # it sets up all it needs, and its step is controlled: fresh ranks can repeat it
    assert group.fresh_ranks == [True]

    r = timer.scaling(lambda: None, lambda rank: None, world_sizes=(2, 1), steps=3)
    assert [size for _, size in group.calls[2:]] == [1, 2]
    label, metrics, result, remeasure = group.recorded[1]
    assert result is r and label == "ddp_step_timer.scaling(weak)"
    assert [m.name for m in remeasure()] == [m.name for m in metrics] == [
        "scaling_throughput.w1", "scaling_throughput.w2", "scaling_efficiency.w2"]
    # the scaling curve (the plain rule) and a step without the control stay on the ranks
    timer(lambda: None, lambda rank: None, steps=3, control=False)
    assert group.fresh_ranks == [True, False, False]


def test_timer_refuses_before_running_anything() -> None:
    from pytest_distperf.fixtures.steptimer import DDPStepTimer

    group = RecordingGroup(available=2)
    timer = DDPStepTimer(group)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"asks for 4, 8 ranks but only 2 are available"):
        timer.scaling(lambda: None, lambda rank: None, world_sizes=(1, 4, 8))
    with pytest.raises(ValueError, match="world_sizes is empty"):
        timer.scaling(lambda: None, lambda rank: None, world_sizes=())
    with pytest.raises(ValueError, match=r"whole numbers >= 1, got \[0\]"):
        timer.scaling(lambda: None, lambda rank: None, world_sizes=(0, 1))
    with pytest.raises(TypeError, match="model_fn must be callable"):
        timer("not a function", lambda rank: None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        timer(lambda: None, lambda rank: None, warmup=-1)
    with pytest.raises(ValueError, match="name must be a word"):
        timer(lambda: None, lambda rank: None, name="two words")
    with pytest.raises(ValueError, match=r"world_size must be whole numbers >= 1, got \['2'\]"):
        timer(lambda: None, lambda rank: None, world_size="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fsdp_policy is for wrapper='fsdp'"):
        timer(lambda: None, lambda rank: None, fsdp_policy=(object,))
    for bad in (0, -1.0, float("nan"), float("inf"), 10**400, "989", True):
        with pytest.raises(ValueError, match="peak_tflops must be a number > 0"):
            timer(lambda: None, lambda rank: None, peak_tflops=bad)  # type: ignore[arg-type]
    assert group.calls == [] and group.recorded == []


def test_flops_achieved_and_mfu() -> None:
    from pytest_distperf.fixtures.steptimer import DDPStepTimer

    group = RecordingGroup()
    group.flops = 3 * 10**9
    t = DDPStepTimer(group)(lambda: None, lambda rank: None, steps=3,  # type: ignore[arg-type]
                            peak_tflops=0.5)
    assert t.flops_per_step == 2 * 3 * 10**9  # both ranks
    assert t.achieved_flops == pytest.approx(6e9 / t.step_time_s)
    assert t.mfu == pytest.approx(t.achieved_flops / (2 * 0.5e12))
    metrics = {m.name: m for m in group.recorded[0][1]}
    assert (metrics["flops_per_step"].value, metrics["flops_per_step"].kind) == (6e9, "exact")
    assert metrics["achieved_tflops"].value == pytest.approx(t.achieved_flops / 1e12)
    assert metrics["mfu"].kind == "informational" and metrics["mfu"].higher_is_better
    # no peak on a CPU unless the test gives one: no mfu
    DDPStepTimer(group)(lambda: None, lambda rank: None, steps=3)  # type: ignore[arg-type]
    assert "mfu" not in {m.name for m in group.recorded[1][1]}


def test_fsdp_shards_the_blocks_of_containers_or_what_the_policy_names() -> None:
    torch = pytest.importorskip("torch")
    from pytest_distperf.rank.fsdp import shard_targets, split_tied
    from pytest_distperf.rank.inputs import takes_module

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

    model = torch.nn.Module()
    model.transformer = torch.nn.ModuleDict({  # type: ignore[assignment]
        "wte": torch.nn.Embedding(8, 4), "h": torch.nn.ModuleList([Block(), Block()]),
        "drop": torch.nn.Dropout()})
    model.head = torch.nn.Linear(4, 8)  # type: ignore[assignment]
    h = model.transformer["h"]
    # the blocks of every container, innermost first; never a container, never a module
    # without parameters
    assert shard_targets(model) == [h[1], h[0], model.transformer["wte"]]
    assert shard_targets(model, Block) == [h[1], h[0]]
    assert shard_targets(model, lambda m: isinstance(m, torch.nn.Linear)) == [
        model.head, h[1].lin, h[0].lin]
    flat = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    assert shard_targets(flat) == [flat[2], flat[0]]  # no containers: the direct children
    with pytest.raises(TypeError, match="fsdp_policy must be module classes or a callable"):
        shard_targets(model, "Block")
    # a token embedding tied to the head (GPT, most HF models): it stays with the root, in
    # one group with the head; a policy that names it splits the tied weight
    model.transformer["wte"].weight = model.head.weight
    assert shard_targets(model) == [h[1], h[0]]
    assert split_tied(model, shard_targets(model)) == ""
    assert split_tied(model, [model.transformer["wte"]]) == (
        "'transformer.wte.weight' and 'head.weight'")
    assert takes_module(lambda model: model) and takes_module(lambda module, lr=1: module)
    assert not takes_module(lambda params: params) and not takes_module(print)


#: Rank 1 sleeps 0.2 s in every other step's forward, 0.02 s otherwise: half the steps far
#: out of balance, half in it.
ALTERNATING = r'''
import time

import pytest
import torch
import torch.distributed as dist


class Alternating(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        slow = dist.get_rank() == 1 and self.calls % 2 == 0
        # the even steps 0.1 s on both ranks: a few ms of a busy host's jitter stay well
        # under the 10% imbalance limit
        time.sleep(0.4 if slow else 0.1)
        return self.lin(x)


# the imbalance is the breach here; rank 0's wait for rank 1 sits near 30% of a step
@pytest.mark.distperf(max_comm_overhead=2.0)
def test_alternating(ddp_step_timer):
    ddp_step_timer(Alternating, lambda rank: torch.randn(4, 8), steps=8, warmup=1,
                   control=False)
'''

#: The noise probe's verdict, forced: the probe itself is tested in test_baseline.py; this
#: is what the plugin does with a noisy one.
FORCED_NOISE = r'''
from pytest_distperf.verdict import noise

REAL = noise.NoiseFigures.too_noisy

def pytest_configure(config):
    noise.NoiseFigures.too_noisy = lambda self: ["CPU wait 40% > 25% (forced by the test)"]

def pytest_unconfigure(config):  # the run is in the suite's process
    noise.NoiseFigures.too_noisy = REAL
'''


@pytest.mark.parametrize("strict", [False, True])
def test_a_breach_the_noise_could_have_made_warns_and_fails_only_when_strict(
        pytester: pytest.Pytester, strict: bool) -> None:
    """A per-step fraction over its limit in the median step, within it in a quarter of the
    steps, measured while the noise probe was past its limits: inconclusive, a warning and
    a pass; a failure under --distperf-strict.  (Over it with a quiet probe it fails:
    test_straggler above.)"""
    pytester.makepyfile(test_alt=ALTERNATING)
    pytester.makeconftest(FORCED_NOISE)
    report = pytester.path / "report.json"
    result = pytester.runpytest(
        "--distperf", "--gpus", "2", "-p", "no:cacheprovider", "-rA",
        "--distperf-json", str(report), *(["--distperf-strict"] if strict else []))
    (test,) = json.loads(report.read_text())["tests"]
    imbalance = next(m for m in test["metrics"] if m["name"] == "imbalance")
    samples = sorted(imbalance["samples"])
    # the premise: the median step over the limit, the good quarter within it
    assert imbalance["value"] > 0.1 and samples[len(samples) // 4] < 0.1, samples
    said = ("imbalance = * exceeds max_imbalance = 0.100*inconclusive: the noise probe saw "
            "CPU wait 40% > 25% (forced by the test), and a quarter of the steps were within "
            "the limit*")
    if strict:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*distperf: 1 threshold breach(es) in *test_alternating*",
                                     f"*{said}"])
    else:
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"*threshold breach too noisy to tell*{said}"])
    assert test["breaches"] and "inconclusive" in test["breaches"][0]


@pytest.mark.parametrize(("steps", "again"), [(1, 1), (5, 5), (9, 5), (10, 5), (20, 10)])
def test_a_re_measurement_times_half_the_steps_and_five_at_least(steps: int,
                                                                  again: int) -> None:
    from pytest_distperf.fixtures.steptimer import again_steps

    assert again_steps(steps) == again
