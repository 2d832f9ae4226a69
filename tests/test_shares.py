"""``ddp_step_timer(..., batch_shares=...)``: the shares checked, the batch split by them, the
gradient the same as an even split's, and ``"auto"`` rebalancing a slow rank.

The checks and the wording are pure unit tests; the rest runs real DDP on two gloo ranks in
one pytest run.  The slow rank is made slow by a sleep per sample (twice the other's),
an effect far beyond a shared host's noise.
"""

from __future__ import annotations

import ast
import json

import pytest

from pytest_distperf.analysis.findings import imbalance_suggestion
from pytest_distperf.analysis.topology import DIFFER, device_summary
from pytest_distperf.common.shares import (
    AUTO,
    batch_shares,
    check_shares,
    ema,
    pasteable,
    split_sizes,
)


# -- the checks ------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "error", "words"), [
    ([0.5, -0.5], ValueError, r"\[0.5, -0.5\].*rank 1's share -0.5 is negative"),
    ([0.6, 0.6], ValueError, r"\[0.6, 0.6\] sums to 1.2, not 1"),
    ([0.5, 0.3], ValueError, r"\[0.5, 0.3\] sums to 0.8, not 1"),
    ([1.0], ValueError, r"\[1.0\] has 1 shares for 2 ranks"),
    ([0.3, 0.3, 0.4], ValueError, r"\[0.3, 0.3, 0.4\] has 3 shares for 2 ranks"),
    ([0.98, 0.02], ValueError, r"\[0.98, 0.02\].*rank 1's share 0.02 is below the minimum 0.05"),
    (0.5, TypeError, r"must be a list of one share per rank.*got 0.5"),
    ("even", TypeError, r"or 'auto', got 'even'"),
    ({0: 0.5, 1: 0.5}, TypeError, r"got \{0: 0.5, 1: 0.5\}"),
    ([0.5, "0.5"], TypeError, r"'0.5' is not a finite number"),
    ([0.5, float("nan")], TypeError, r"nan is not a finite number"),
    ([True, False], TypeError, r"True is not a finite number"),
])
def test_bad_shares_are_refused_naming_the_value(value: object, error: type[Exception],
                                                  words: str) -> None:
    with pytest.raises(error, match=r"batch_shares.*" + words):
        check_shares(value, 2)


def test_good_shares_are_kept_and_normalised() -> None:
    assert check_shares(AUTO, 2) == AUTO
    assert check_shares([0.75, 0.25], 2) == (0.75, 0.25)
    assert check_shares((1 / 3, 1 / 3, 1 / 3), 3) == pytest.approx((1 / 3,) * 3)
    assert check_shares([0.1] * 10, 10) == pytest.approx((0.1,) * 10)
    # past 20 ranks the minimum is an even split's share
    assert len(check_shares([1 / 40] * 40, 40)) == 40


@pytest.mark.parametrize(("rows", "shares", "sizes"), [
    (24, (2 / 3, 1 / 3), (16, 8)),
    (24, (0.67, 0.33), (16, 8)),
    (10, (0.5, 0.5), (5, 5)),
    (7, (0.5, 0.5), (4, 3)),
    (3, (0.9, 0.05, 0.05), (1, 1, 1)),
    (100, (0.05, 0.95), (5, 95)),
])
def test_split_sizes_sum_to_the_batch(rows: int, shares: tuple[float, ...],
                                      sizes: tuple[int, ...]) -> None:
    assert split_sizes(rows, shares) == sizes
    assert sum(sizes) == rows and min(sizes) >= 1


def test_a_batch_smaller_than_the_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="over 3 ranks, but it has 2 rows"):
        split_sizes(2, (0.4, 0.3, 0.3))


def test_the_suggestion_pastes_into_the_fixture() -> None:
    for shares in [batch_shares([2.0, 1.0]), batch_shares([300.0, 100.0, 100.0]),
                   batch_shares([1000.0, 1.0])]:
        text = imbalance_suggestion([1], shares)
        pasted = text.split("batch_shares=", 1)[1].split(")", 1)[0]
        again = check_shares(ast.literal_eval(pasted), len(shares))
        assert again == pytest.approx(shares, abs=0.01)
    assert "batch_shares=[0.67, 0.33]" in imbalance_suggestion([1], batch_shares([2.0, 1.0]))
    assert pasteable(batch_shares([1000.0, 1.0])) == "[0.95, 0.05]"


def test_ema_weighs_the_newest_step() -> None:
    assert ema([], 0.5) is None
    assert ema([4.0], 0.5) == 4.0
    assert ema([4.0, 2.0, 2.0], 0.5) == 2.5


def test_device_summary_says_when_devices_differ() -> None:
    h100 = {"device_model": "NVIDIA H100 80GB HBM3", "device_memory_bytes": 80 * 2**30}
    a100 = {"device_model": "NVIDIA A100-SXM4-40GB", "device_memory_bytes": 40 * 2**30}
    same = device_summary([{"rank": 0, **h100}, {"rank": 1, **h100}])
    assert same == "2 x NVIDIA H100 80GB HBM3, 80 GiB"
    mixed = device_summary([{"rank": 0, **h100}, {"rank": 1, **a100}, {"rank": 2, **h100}])
    assert mixed.startswith(DIFFER)
    assert "2 x NVIDIA H100 80GB HBM3, 80 GiB (ranks 0, 2)" in mixed
    assert "1 x NVIDIA A100-SXM4-40GB, 40 GiB (rank 1)" in mixed
    assert "batch_shares='auto'" in mixed
    cpu = device_summary([{"rank": 0, "device_model": "Xeon"}, {"rank": 1, "device_model": "Xeon"}])
    assert cpu == "2 x Xeon"


def test_a_timing_with_shares_says_what_ran_and_names_differing_devices() -> None:
    from pytest_distperf.analysis.analyzer import analyze_steps
    from pytest_distperf.analysis.shares import with_shares
    from pytest_distperf.records import Measurement, RankStep, TestRecord
    from pytest_distperf.report.terminal import finding_lines

    def rank(r: int, rows: int, compute: float, calibration: float) -> RankStep:
        return RankStep(rank=r, batch_size=rows, forward_s=(0.01,) * 3, backward_s=(0.02,) * 3,
                        optimizer_s=(0.001,) * 3, step_s=(0.1,) * 3,
                        no_sync_step_s=(compute,) * 3, calibration_s=(calibration,) * 6)

    # calibrated on an even split (50 vs 100 ms), then still unbalanced with 16 and 8 rows
    timing = analyze_steps([rank(0, 16, 0.05, 0.05), rank(1, 8, 0.08, 0.1)])
    devices = device_summary([{"rank": 0, "device_model": "A"}, {"rank": 1, "device_model": "B"}])
    shared = with_shares(timing, shared=True, devices=devices)
    assert shared.shares_used == (16 / 24, 8 / 24)
    assert shared.imbalance_before == pytest.approx(0.05 / 0.075)
    (imbalance,) = [b for b in shared.bottlenecks if b.kind == "imbalance"]
    assert imbalance.description.endswith(devices)
    lines = finding_lines(TestRecord("t.py::t", 2, [Measurement("x", (), shared)], [], []))
    assert lines[0] == f"    devices: {devices}"
    plain = with_shares(timing, shared=False, devices="2 x A")
    assert plain.shares_used == () and plain.devices == "2 x A"
    assert not any(line.startswith("    devices") for line in finding_lines(
        TestRecord("t.py::t", 2, [Measurement("x", (), plain)], [], [])))


# -- on real ranks ---------------------------------------------------------------------------
MODULE = r'''
import json
import time

import pytest
import torch
import torch.distributed as dist

from pytest_distperf.rank.ddp import StepSpec, build

ROWS = 24
SECONDS_PER_SAMPLE = 0.004  # rank 0; rank 1 takes twice as long per sample


class PerSample(torch.nn.Module):
    """A step whose work is a sleep per sample, rank 1 twice as long as rank 0."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x):
        slow = 2 if dist.get_rank() == 1 else 1
        time.sleep(slow * SECONDS_PER_SAMPLE * x.shape[0])
        return self.lin(x)


def global_batch(rank=0):
    return torch.randn(ROWS, 8, generator=torch.Generator().manual_seed(1))


def test_auto_rebalances_the_slow_rank(ddp_step_timer):
    t = ddp_step_timer(PerSample, global_batch, batch_shares="auto", steps=4, warmup=1)
    print("SHARES", json.dumps({"used": t.shares_used, "before": t.imbalance_before,
                                "after": t.imbalance, "sizes": [r.batch_size for r in t.per_rank]}))
    fast, slow = t.shares_used
    assert 0.2 <= slow <= 0.45 and fast + slow == pytest.approx(1.0)
    assert sum(r.batch_size for r in t.per_rank) == ROWS
    assert t.imbalance_before > 0.3  # even split: rank 1 computes about twice as long
    assert t.imbalance < 0.10 and t.stragglers == []
    assert all(len(r.calibration_s) == 6 for r in t.raw)
    assert t.devices.startswith("2 x ")


def test_pasted_shares_balance_the_slow_rank(ddp_step_timer):
    t = ddp_step_timer(PerSample, global_batch, batch_shares=[0.67, 0.33], steps=4, warmup=1,
                       name="pasted")
    assert [r.batch_size for r in t.per_rank] == [16, 8]
    assert t.shares_used == (16 / 24, 8 / 24) and t.imbalance_before is None
    assert t.imbalance < 0.10


def test_bad_shares_are_refused_before_anything_runs(ddp_step_timer):
    with pytest.raises(ValueError, match=r"batch_shares=\[0.7, 0.2\] sums to 0.9, not 1"):
        ddp_step_timer(PerSample, global_batch, batch_shares=[0.7, 0.2])
    with pytest.raises(TypeError, match=r"or 'auto', got 'fast'"):
        ddp_step_timer(PerSample, global_batch, batch_shares="fast")
    with pytest.raises(ValueError, match=r"batch_shares=\[0.5, 0.5\] splits the batch over"):
        ddp_step_timer(PerSample, global_batch, batch_shares=[0.5, 0.5], mesh={"dp": 2})


def one_step(shares, loss_fn):
    """One DDP step on this rank, batch_shares as the step timer builds it: the parameters
    before and after."""
    spec = StepSpec(lambda: torch.nn.Linear(8, 4), global_batch, loss_fn=loss_fn,
                    optimizer_fn=lambda p: torch.optim.SGD(p, lr=1.0), batch_shares=shares)
    built = build(spec)
    before = [p.detach().clone().tolist() for p in built.wrapped.parameters()]
    built.train_step()
    return before, [p.detach().clone().tolist() for p in built.wrapped.parameters()]


def mean_loss(out):
    return out.pow(2).mean()


@pytest.mark.parametrize("loss", ["mean", "sum"])
def test_weighted_losses_give_the_whole_batch_gradient(nccl_group, loss):
    loss_fn = mean_loss if loss == "mean" else None
    (before, after), (_, other) = nccl_group.run(one_step, (0.75, 0.25), loss_fn)
    assert after == other  # DDP: the same update on both ranks
    # one process, the whole batch: the mean loss as it is; DDP averages a sum over 2 ranks
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    assert [p.tolist() for p in model.parameters()] == before
    out = model(global_batch())
    (mean_loss(out) if loss == "mean" else out.pow(1).sum() / 2).backward()
    for p, got in zip(model.parameters(), after):
        expected = p.detach() - p.grad
        assert torch.allclose(torch.tensor(got), expected, rtol=1e-5, atol=1e-6), loss
    if loss == "mean":  # unweighted, the rank of 6 rows would count as much as the one of 18
        grads = []
        for rows in (slice(0, 18), slice(18, 24)):
            model.zero_grad()
            mean_loss(model(global_batch()[rows])).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        naive = [(a + b) / 2 for a, b in zip(*grads)]
        first = torch.tensor(before[0]) - naive[0]
        assert not torch.allclose(torch.tensor(after[0]), first, rtol=1e-3, atol=1e-4)
'''


def test_batch_shares_on_real_ranks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_gen=MODULE)
    result = pytester.runpytest("--distperf", "--gpus", "2", "-p",
                                "no:cacheprovider", "-rA", "-s")
    result.assert_outcomes(passed=5)
    line = next(x for x in result.outlines if "SHARES {" in x)
    figures = json.loads(line.split("SHARES ", 1)[1])
    assert figures["sizes"][1] < figures["sizes"][0]
