"""What the step timer adds to a TP step and a pipeline step: the fixture's ``step_time_s``
against a hand-written loop of the same model on the same ranks.

On one rank pool (gloo, CPU), for each model, rounds alternate between

* ``fixture``: ``ddp_step_timer(mesh={"tp": 2}, parallelize=...)`` or
  ``ddp_step_timer.pipeline(...)`` as a test calls them (a barrier before every step, the
  clocks, the chunk timers of a pipeline); the figure is its ``step_time_s``;
* ``hand``: the same model, parallelisation, batch and optimizer written as a training
  script would (``parallelize_module`` on a mesh of the world group, or ``PipelineStage``
  and ``ScheduleGPipe``): one barrier, then back-to-back steps with a timestamp between
  them; per step, the slowest rank's time;
* ``hand again``: a second hand series, an A/A control: how large a difference noise alone
  makes on the machine.

Overhead = median over rounds of median(fixture) / median(hand) in the same round, minus 1
(goal: within 3%).

    python benchmarks/parallel_overhead.py             # 7 rounds of 20 steps per model
    python benchmarks/parallel_overhead.py --quick     # 3 rounds of 10 steps
    python benchmarks/parallel_overhead.py --decompose  # also the hand loop with the
                                                        # fixture's work between steps
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import statistics
import sys
import time
from typing import Any

WIDTH, ROWS = 512, 64


def block() -> Any:
    """An MLP block in the shape TP splits (column-wise, then row-wise)."""
    import torch

    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(),
                               torch.nn.Linear(4 * WIDTH, WIDTH))


def tp_model() -> Any:
    import torch

    return torch.nn.Sequential(*[block() for _ in range(4)])


def tp_parallelize(model: Any, mesh: Any) -> Any:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {f"{i}.{j}": style for i in range(4)
            for j, style in (("0", ColwiseParallel()), ("2", RowwiseParallel()))}
    return parallelize_module(model, mesh["tp"], plan)


def stage(index: int, stages: int) -> Any:
    import torch

    return torch.nn.Sequential(*[block() for _ in range(2)])


def batch(index: int) -> Any:
    import torch

    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(index))


def _timed_loop(step: Any, steps: int, warmup: int, between: str = "") -> list[float]:
    """``steps`` back-to-back calls of ``step`` after ``warmup`` and one barrier.

    ``between`` (``--decompose``) adds the fixture's work between steps, one piece at a
    time: ``barrier`` (each step timed from a barrier, as the fixture does), ``compute`` or
    ``memory`` (that host-speed control after each step, from a barrier of its own),
    ``both`` (the two controls, as the fixture runs them on CPU ranks).
    """
    import torch.distributed as dist

    from pytest_distperf.rank.clock import control_kernel, memory_kernel

    for _ in range(warmup):
        step()
    dist.barrier()
    if not between:
        marks = [time.perf_counter()]
        for _ in range(steps):
            step()
            marks.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(marks)]
    controls = {"barrier": [], "compute": [control_kernel()], "memory": [memory_kernel()],
                "both": [control_kernel(), memory_kernel()]}[between]
    samples = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        samples.append(time.perf_counter() - start)
        if controls:
            dist.barrier()
            for control in controls:
                control()
    return samples


def hand_tp(steps: int, warmup: int, between: str = "") -> list[float]:
    """On one rank: the TP step as a training script writes it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("tp",))
    torch.manual_seed(0)
    model = tp_parallelize(tp_model(), mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = batch(0)

    def step() -> None:
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_loop(step, steps, warmup, between)


def hand_pp(steps: int, warmup: int, microbatches: int, between: str = "") -> list[float]:
    """On one rank: a GPipe step of two stages as a training script writes it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    module = stage(rank, world)
    schedule = ScheduleGPipe(PipelineStage(module, rank, world, torch.device("cpu")),
                             n_microbatches=microbatches, loss_fn=lambda out, t: out.sum())
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    x, target = batch(0), torch.zeros(ROWS)

    def step() -> None:
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            schedule.step(target=target)
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _timed_loop(step, steps, warmup, between)


CONTROL = True  # --no-control: the fixture without the host-speed control after each step
DECOMPOSE_ON = False  # --decompose: also the hand loop with the fixture's work between steps
DECOMPOSE = ("hand+barrier", "hand+compute", "hand+memory", "hand+both")


def one(kind: str, model: str, timer: Any, pool: Any, steps: int, warmup: int) -> list[float]:
    """Per step, the slowest rank's seconds, of one kind of run."""
    from pytest_distperf.analysis.analyzer import per_step_max

    if kind.startswith("hand"):
        between = kind.partition("+")[2]
        fn, args = ((hand_tp, (steps, warmup, between)) if model == "tp"
                    else (hand_pp, (steps, warmup, 4, between)))
        return list(per_step_max(pool.execute(fn, args, {}, 2, f"{kind} {model}")))
    if model == "tp":
        t = timer(tp_model, batch, mesh={"tp": 2}, parallelize=tp_parallelize, steps=steps,
                  warmup=warmup, control=CONTROL)
    else:
        t = timer.pipeline(stage, batch, schedule="GPipe", microbatches=4, steps=steps,
                           warmup=warmup, control=CONTROL)
    return list(t.samples["step_s"])


def bench(model: str, timer: Any, pool: Any, rounds: int, steps: int,
          warmup: int) -> dict[str, Any]:
    kinds = ("fixture", "hand", "hand_again") + (DECOMPOSE if DECOMPOSE_ON else ())
    per_round: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(rounds):
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            per_round[kind].append(statistics.median(one(kind, model, timer, pool, steps,
                                                         warmup)))
        print(f"  {model} round {i + 1}/{rounds}: "
              + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in per_round.items()),
              file=sys.stderr)
    med = statistics.median

    def paired(kind: str) -> float:
        return med(a / b for a, b in zip(per_round[kind], per_round["hand"], strict=True)) - 1

    return {"model": model, "hand_ms": med(per_round["hand"]) * 1e3,
            "fixture_ms": med(per_round["fixture"]) * 1e3, "overhead": paired("fixture"),
            "aa": paired("hand_again"),
            "parts": {k: paired(k) for k in kinds if k.startswith("hand+")}}


def machine() -> str:
    import torch

    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, load average {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 steps")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", default="tp,pp")
    parser.add_argument("--no-control", action="store_true",
                        help="the fixture without the host-speed control")
    parser.add_argument("--decompose", action="store_true",
                        help="also the hand loop with a barrier before each step, and with "
                             "each host-speed control after it")
    args = parser.parse_args()
    global CONTROL, DECOMPOSE_ON
    CONTROL, DECOMPOSE_ON = not args.no_control, args.decompose
    rounds, steps = (3, 10) if args.quick else (args.rounds, args.steps)

    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.fixtures.steptimer import DDPStepTimer
    from pytest_distperf.pool.launcher import RankPool

    before = machine()
    pool = RankPool(2, "gloo", timeout_s=600)
    try:
        timer = DDPStepTimer(DistGroup(pool), {"max_imbalance": 100, "max_comm_overhead": 1,
                                               "min_pipeline_utilisation": 0})
        rows = [bench(m, timer, pool, rounds, steps, args.warmup)
                for m in args.models.split(",")]
    finally:
        pool.close()
    print(f"\n{datetime.date.today()}; before: {before}; after: load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; gloo, 2 ranks; {rounds} rounds "
          f"of {steps} steps, warm-up {args.warmup}"
          f"{'; the fixture without the control' if not CONTROL else ''}\n")
    print("| model | hand-written loop | fixture step_time_s | overhead (paired) | "
          "A/A: hand vs hand (paired) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['hand_ms']:.2f} ms | {r['fixture_ms']:.2f} ms | "
              f"{r['overhead']:+.1%} | {r['aa']:+.1%} |")
    if DECOMPOSE_ON:
        print("\n| model | " + " | ".join(DECOMPOSE) + " |  (paired, against hand)")
        print("|---|" + "---|" * len(DECOMPOSE))
        for r in rows:
            print(f"| {r['model']} | " + " | ".join(f"{r['parts'][k]:+.1%}" for k in DECOMPOSE)
                  + " |")


if __name__ == "__main__":
    main()
