"""The noise floor of each kind of metric: measured as a save measures it, and the smallest
change a comparison against such a save tells nine times in ten.

A save pools twelve measurements, half a second apart (``SAVE_PAUSE_S``), and states the
change its comparisons can tell from their spread (the verdict's ``detectable_change``,
through :mod:`~pytest_distperf.doctor.verdict_api`).  Here the same is done for a
``measure()`` kernel, an all-reduce's bus bandwidth and a small DDP step.  All on the pool's
own ranks: a save re-measures a DDP step on fresh ranks, which adds the 1.6-2.5% offset
between sets of rank processes (benchmarks/pool_offsets.md), so the step's floor here is
a little lower than a save's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from pytest_distperf.config import parse_size
from pytest_distperf.doctor import loops
from pytest_distperf.doctor.model import Floor
from pytest_distperf.doctor.plan import Plan
from pytest_distperf.doctor.verdict_api import detectable
from pytest_distperf.fixtures.group import DistGroup
from pytest_distperf.fixtures.steptimer import DDPStepTimer, step_metrics
from pytest_distperf.records import Metric


def floor_of(kind: str, what: str, take: Callable[[], Metric], plan: Plan,
             sleep: Callable[[float], None] = time.sleep) -> Floor:
    """``plan.measurements`` of the metric ``take()`` measures, ``plan.pause_s`` apart."""
    metrics = []
    for i in range(plan.measurements):
        if i:
            sleep(plan.pause_s)
        metrics.append(take())
    first = metrics[0]
    parts = [(m.samples, m.control) for m in metrics]
    found = detectable(parts, unit=first.unit, higher_is_better=first.higher_is_better)
    return Floor(kind=kind, metric=first.name, what=what, unit=first.unit,
                 value=statistics.median(m.value for m in metrics),
                 measurements=len(metrics), spread=None if found is None else found[0],
                 detectable=None if found is None else found[1],
                 controlled=all(m.control for m in metrics))


def measure(group: DistGroup, plan: Plan) -> Floor:
    """``measure()`` of the matrix products, with its default iterations and control."""
    def take() -> Metric:
        return group.measure("matmul", loops.matmuls, plan.reps,
                             iters=plan.floor_iters).metrics()[0]

    return floor_of("measure", f"measure(): {plan.reps} matrix products per call", take, plan)


def bench(group: DistGroup, plan: Plan) -> Floor:
    """``bench("all_reduce")`` of one size, as a test calls it: its bus bandwidth (on one
    rank, where no data moves, its time)."""
    nbytes = parse_size(plan.floor_size)

    def take() -> Metric:
        result = group.bench("all_reduce", [nbytes], min_time_s=plan.floor_seconds)
        return result.metrics()[0]

    return floor_of("bench", f"bench(): all_reduce {plan.floor_size}, "
                    f"{plan.floor_seconds:g} s of calls", take, plan)


def step(group: DistGroup, plan: Plan) -> Floor:
    """``ddp_step_timer``'s ``step_time_s`` for the small GPT."""
    shape = plan.gpt
    timer = DDPStepTimer(group)

    def take() -> Metric:
        timing = timer(loops.model_of(shape), loops.batch_of(shape), steps=plan.floor_steps,
                       warmup=plan.warmup, loss_fn=loops.gpt_loss, count_collectives=False)
        return next(m for m in step_metrics(timing) if m.name == "step_time_s")

    return floor_of("step", f"ddp_step_timer: {shape.layers}-layer GPT (width {shape.dim}), "
                    f"{plan.floor_steps} steps", take, plan)
