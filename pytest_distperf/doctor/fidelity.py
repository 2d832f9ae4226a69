"""Does the plugin time what a bare loop times, here?  ``bench``, ``measure()`` and the step
timer, each against a bare loop of the same work timed the same way, on the same ranks.

Rounds alternate three sides, the order turning every round so that a drift of the machine
hits all three (benchmarks/fidelity.md): the plugin, the bare loop, and the bare loop again,
whose ratio to the first (the A/A) is how far two identical loops read apart on this
machine now.  Each side's figure is the median over all its iterations of the slowest rank,
as the plugin reports them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence

from pytest_distperf.analysis.analyzer import per_step_max
from pytest_distperf.config import parse_size
from pytest_distperf.doctor import loops
from pytest_distperf.doctor.model import Fidelity
from pytest_distperf.doctor.plan import Plan
from pytest_distperf.fixtures.group import DistGroup
from pytest_distperf.fixtures.steptimer import DDPStepTimer

#: Why ``bench`` on one GPU is not judged against a bare loop (benchmarks/doctor.md: on an
#: H200 and an H100 bench read 0.92-0.96 of a bare loop, and 0.93 of a loop timed with the
#: plugin's own clock; benchmarks/gpu.md).
ONE_GPU = ("one rank: no data moves, both sides time the host's launch of a 30-55 us call, "
           "and any two loops read several percent apart; bandwidth needs 2 or more GPUs")
Side = Callable[[], Sequence[float]]  # one round of a side: seconds per iteration


def alternate(sides: dict[str, Side], rounds: int) -> dict[str, list[float]]:
    """Every side's seconds per iteration over ``rounds`` rounds, the order turning."""
    names = list(sides)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        turn = r % len(names)
        for name in names[turn:] + names[:turn]:
            out[name].extend(sides[name]())
    return out


def _fidelity(name: str, what: str, times: dict[str, list[float]]) -> Fidelity:
    med = statistics.median
    return Fidelity(name=name, what=what, plugin_s=med(times["plugin"]),
                    bare_s=med(times["bare"]), again_s=med(times["again"]),
                    iterations=len(times["plugin"]))


def bench(group: DistGroup, plan: Plan) -> Fidelity:
    """``bench("all_reduce")`` without the host-speed control (the bare loop has none, as in
    benchmarks/fidelity.md) against ``dist.all_reduce`` back to back."""
    nbytes = parse_size(plan.bench_size)

    def plugin() -> list[float]:
        result = group.bench("all_reduce", [nbytes], warmup=plan.warmup,
                             iters=plan.bench_iters, control=False)
        return [us / 1e6 for us in result.rows[0].samples_us]

    def bare() -> tuple[float, ...]:
        return per_step_max(group.run(loops.bare_all_reduce, nbytes, plan.warmup,
                                      plan.bench_iters))

    times = alternate({"plugin": plugin, "bare": bare, "again": bare}, plan.bench_rounds)
    found = _fidelity("bench", f"all_reduce {plan.bench_size}, {group.world_size} rank(s)",
                      times)
    if group.world_size == 1 and group.device_type == "cuda":
        return dataclasses.replace(found, note=ONE_GPU)
    return found


def measure(group: DistGroup, plan: Plan) -> Fidelity:
    """``measure()`` as a test calls it (with the host-speed control after each iteration on
    CPU ranks, outside the timed call) against the same matrix products in a bare loop."""
    reps = plan.reps

    def plugin() -> tuple[float, ...]:
        return group.measure("matmul", loops.matmuls, reps, warmup=plan.warmup,
                             iters=plan.measure_iters).samples

    def bare() -> tuple[float, ...]:
        return per_step_max(group.run(loops.bare_measure, reps, plan.warmup,
                                      plan.measure_iters))

    times = alternate({"plugin": plugin, "bare": bare, "again": bare}, plan.measure_rounds)
    return _fidelity("measure", f"{reps} matrix products per call, {group.world_size} "
                     "rank(s)", times)


def step(group: DistGroup, plan: Plan) -> Fidelity:
    """``ddp_step_timer`` as a test calls it (barrier before every step, no-sync steps
    between, the control on CPU ranks) against the same DDP step back to back
    (benchmarks/ddp_overhead.md); its ``step_s`` samples, the slowest rank's."""
    shape = plan.gpt
    timer = DDPStepTimer(group)

    def plugin() -> tuple[float, ...]:
        timing = timer(loops.model_of(shape), loops.batch_of(shape), steps=plan.step_steps,
                       warmup=plan.warmup, loss_fn=loops.gpt_loss, count_collectives=False)
        return timing.samples["step_s"]

    def bare() -> tuple[float, ...]:
        return per_step_max(group.run(loops.bare_ddp, shape, plan.step_steps, plan.warmup))

    times = alternate({"plugin": plugin, "bare": bare, "again": bare}, plan.step_rounds)
    return _fidelity("step", f"DDP step of a {shape.layers}-layer GPT (width {shape.dim}), "
                     f"{group.world_size} rank(s)", times)
