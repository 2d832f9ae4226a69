"""The timer's own cost: a step timed by ``ddp_step_timer`` vs the same step in a bare loop.

On one rank pool (gloo, CPU), for each model, rounds alternate between

* ``fixture``: ``DDPStepTimer.__call__`` exactly as the fixture runs it (barrier before every
  step, per-phase clocks, the timing comm hook, interleaved no-sync steps); the figure is
  its ``step_time_s`` (median over steps of the slowest rank);
* ``fixture, no hook``: the same with ``comm_timing=False`` (DDP's built-in all-reduce);
* ``bare``: the same model, DDP wrapper, batch and optimizer in a plain loop on the same
  ranks: one barrier, then ``steps`` back-to-back steps with only a timestamp between them;
  per step, the slowest rank's time.

* ``bare again``: a second bare series, an A/A control that shows how large a difference
  noise alone produces on the machine.

Kinds alternate within every round (order reversed on odd rounds).  The reported overhead is
the median over rounds of median(fixture) / median(bare) in the same round, minus 1 (goal:
within 5%); the ratio of the pooled medians is shown next to it.
Also reported: the wall time a fixture call costs per timed step (it runs a no-sync step
next to every timed one, plus warm-up), against a bare step.

    python benchmarks/ddp_overhead.py             # 9 rounds of 20 steps per model
    python benchmarks/ddp_overhead.py --quick     # 3 rounds of 10 steps
    python benchmarks/ddp_overhead.py --models tiny,wide --rounds 5
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


# -- the models (built on the ranks) ---------------------------------------------------------
def mlp() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def mlp_batch(rank: int) -> Any:
    import torch

    return torch.randn(128, 512)


def wide() -> Any:
    import torch

    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])


def wide_batch(rank: int) -> Any:
    import torch

    return torch.randn(16, 1024)


def conv() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def conv_batch(rank: int) -> Any:
    import torch

    return torch.randn(16, 3, 32, 32)


def tiny() -> Any:
    import torch

    return torch.nn.Linear(64, 64)


def tiny_batch(rank: int) -> Any:
    import torch

    return torch.randn(8, 64)


MODELS: dict[str, tuple[Callable[[], Any], Callable[[int], Any], str]] = {
    "tiny": (tiny, tiny_batch,
             "Linear(64), batch 8: a step of well under a millisecond, so that what the timer "
             "adds per step (clocks, the comm hook) shows as an absolute figure"),
    "mlp": (mlp, mlp_batch, "3 x Linear(512), batch 128: compute-bound, 2 MiB of gradients"),
    "conv": (conv, conv_batch,
             "2 x Conv2d(32) on 32x32 images, batch 16: compute-bound, 40 KiB of gradients"),
    "wide": (wide, wide_batch,
             "4 x Linear(1024), batch 16: 16 MiB of gradients, communication-bound"),
}


# -- measuring -------------------------------------------------------------------------------
def bare_loop_on_rank(spec: Any) -> list[float]:
    """On one rank: the step of ``spec`` (same model, DDP wrapper, batch and optimizer as
    the fixture, with DDP's built-in all-reduce) in a plain loop: one barrier, then
    ``spec.steps`` back-to-back steps with nothing but a timestamp between them."""
    import dataclasses
    import itertools

    import torch.distributed as dist

    from pytest_distperf.rank.ddp import build

    built = build(dataclasses.replace(spec, comm_timing=False))
    for _ in range(spec.warmup):
        built.train_step()
    dist.barrier()
    built.clock.synchronize()
    marks = [built.clock.now()]
    for _ in range(spec.steps):
        built.train_step()
        marks.append(built.clock.now())
    built.clock.synchronize()
    return [built.clock.seconds(a, b) for a, b in itertools.pairwise(marks)]


def bare_steps_s(pool: Any, model_fn: Any, batch_fn: Any, steps: int, warmup: int,
                 ranks: int) -> tuple[float, ...]:
    """Per step of the bare loop, the slowest rank's time."""
    from pytest_distperf.analysis.analyzer import per_step_max
    from pytest_distperf.rank.ddp import StepSpec

    spec = StepSpec(model_fn, batch_fn, steps=steps, warmup=warmup)
    per_rank = pool.execute(bare_loop_on_rank, (spec,), {}, ranks, "bare loop")
    return per_step_max(per_rank)


def bench_model(timer: Any, pool: Any, name: str, rounds: int, steps: int,
                warmup: int, ranks: int) -> dict[str, Any]:
    model_fn, batch_fn, _ = MODELS[name]
    kinds = ("fixture", "bare", "no_hook", "bare_again")
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    per_round: dict[str, list[float]] = {k: [] for k in kinds}
    wall: dict[str, list[float]] = {"fixture": [], "bare": []}
    for i in range(rounds):
        for kind in (kinds if i % 2 == 0 else kinds[::-1]):
            t0 = time.perf_counter()
            if kind.startswith("bare"):
                got = bare_steps_s(pool, model_fn, batch_fn, steps, warmup, ranks)
            else:
                got = timer(model_fn, batch_fn, steps=steps, warmup=warmup, world_size=ranks,
                            comm_timing=kind == "fixture").samples["step_s"]
            if kind in wall:
                wall[kind].append((time.perf_counter() - t0) / steps)
            samples[kind].extend(got)
            per_round[kind].append(statistics.median(got))
        print(f"  {name} on {ranks} round {i + 1}/{rounds}: median step "
              + ", ".join(f"{k} {v[-1] * 1e3:.2f} ms" for k, v in per_round.items()),
              file=sys.stderr)
    med = statistics.median
    bare = samples["bare"]

    def paired(kind: str) -> float:
        """Median over rounds of (this kind's median / the bare loop's median, same round)."""
        return med(a / b for a, b in zip(per_round[kind], per_round["bare"], strict=True)) - 1

    return {
        "model": name, "ranks": ranks, "steps": steps,
        "bare_ms": med(bare) * 1e3, "fixture_ms": med(samples["fixture"]) * 1e3,
        "no_hook_ms": med(samples["no_hook"]) * 1e3,
        "overhead": paired("fixture"), "overhead_no_hook": paired("no_hook"),
        "aa": paired("bare_again"),
        "overhead_pooled": med(samples["fixture"]) / med(bare) - 1,
        "bare_iqr": _iqr(bare) / med(bare),
        "added_us": (med(samples["fixture"]) - med(bare)) * 1e6,
        "wall_per_step_ms": med(wall["fixture"]) * 1e3,
        "bare_wall_per_step_ms": med(wall["bare"]) * 1e3,
    }


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f
                       if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, load average {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 10 steps")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    rounds, steps = (3, 10) if args.quick else (args.rounds, args.steps)

    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.fixtures.steptimer import DDPStepTimer
    from pytest_distperf.pool.launcher import RankPool

    pool = RankPool(args.ranks, "gloo", timeout_s=600)
    try:
        timer = DDPStepTimer(DistGroup(pool))
        rows = []
        for name in args.models.split(","):
            # the tiny step: 10x the steps, and also on one rank (no waiting for another)
            sizes = (1, args.ranks) if name == "tiny" else (args.ranks,)
            n = steps * 10 if name == "tiny" else steps
            rows += [bench_model(timer, pool, name, rounds, n, args.warmup, k) for k in sizes]
    finally:
        pool.close()

    print(f"\n{datetime.date.today()}, {machine()}; gloo; {rounds} rounds of {steps} steps "
          f"({steps * 10} for tiny), warm-up {args.warmup}\n")
    print("| model | ranks | bare step | fixture step_time_s | overhead (paired) | "
          "overhead (pooled) | without comm hook (paired) | A/A: bare vs bare (paired) | "
          "bare IQR / median | fixture wall per timed step | bare wall per step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['ranks']} | {r['bare_ms']:.3f} ms | "
              f"{r['fixture_ms']:.3f} ms | {r['overhead']:+.1%} | {r['overhead_pooled']:+.1%} | "
              f"{r['overhead_no_hook']:+.1%} | {r['aa']:+.1%} | {r['bare_iqr']:.0%} | "
              f"{r['wall_per_step_ms']:.1f} ms | {r['bare_wall_per_step_ms']:.1f} ms |")
    for name in args.models.split(","):
        print(f"\n- {name}: {MODELS[name][2]}", end="")
    print("\n\nAdded per step (fixture median - bare median): "
          + "; ".join(f"{r['model']} on {r['ranks']}: {r['added_us']:+.0f} us" for r in rows))


if __name__ == "__main__":
    main()
