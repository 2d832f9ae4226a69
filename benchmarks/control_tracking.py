"""What the host-speed control follows, and what it does not: candidate controls beside real
work, under neighbours that slow the host in different ways.

The verdict takes out of a time the part that follows the host-speed control
(``pytest_distperf.rank.clock.control_kernel``: 40 products of two 128x128 float32
matrices, cache-resident).  That works while whatever slows the host slows the time and the
control alike.  This script measures, in one process with one thread (as a rank runs),
interleaved sample by sample:

* ``step``: a training step of the small GPT-style model of ``ddp_verdicts.py`` (forward,
  backward, SGD), without DDP;
* ``control``: the control kernel itself;
* ``mem2M``: 8 copies and adds of a 2 MiB buffer (what a gloo all-reduce of the gradients
  does to memory), a candidate memory control;
* ``mem32M``: one copy of a 32 MiB buffer (past the last-level cache), another candidate;
* ``loop``: 500k iterations of an empty Python loop (what ``--slowdown spin`` used to run);
* ``mm_unit``: 8 products of ``ddp_verdicts.MM_UNIT_SHAPE`` (what ``--slowdown matmul``
  runs);

under four conditions, each ``--rounds`` times, interleaved: ``quiet``; ``pyloop``, a busy
Python loop in another process (a neighbour that uses a core and little else); ``memhog``,
another process copying 64 MiB arrays (a neighbour that uses memory bandwidth and the
shared cache); ``cachehog``, another process copying 2 MiB arrays (its own core's cache).
On this 2-core VM the neighbour gets the other core, so the time-sharing of the CPU is not
what is measured: what moves is what the two cores share.  It prints each figure's median
under each condition, as a ratio to ``quiet``.

``--pools N`` measures instead, in N fresh pairs of gloo ranks, a 4 MiB all-reduce's median
time beside the control's and the memory candidates', and prints how they correlate across
pools (does any of them follow the pool-to-pool moves of the all-reduce that ``bench``
sees?).

    python benchmarks/control_tracking.py              # the four conditions, 3 rounds each
    python benchmarks/control_tracking.py --pools 14   # across fresh rank pools
    python benchmarks/control_tracking.py --watch 20   # 20 minutes of the host as it drifts

``--watch M`` samples the step, the control and ``mem2M`` (10 of each, interleaved) every
few seconds for M minutes, with no neighbour, and prints how the step's moves over time
split between the two: the least-squares fit of log step on log control alone, on log
``mem2M`` alone and on both, the same fits on minute means (the host's slower moves, what
lies between a save and a compare run), and how much slower each figure ran in the slow
spells (the control 5% or more above its usual).  Run it when the host drifts (a compare
run's control far from its save's with the noise probe reading nothing) to see whether
memory is what moved; one per core, as two ranks load the host:

    taskset -c 0 python benchmarks/control_tracking.py --watch 20 --json w0.json &
    taskset -c 1 python benchmarks/control_tracking.py --watch 20 --json w1.json

Results: benchmarks/control_tracking.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

NEIGHBOURS = {
    "quiet": None,
    "pyloop": "while True: pass",
    "memhog": ("import numpy as np\na = np.ones(64 * 1024 * 1024 // 8)\nb = np.empty_like(a)\n"
               "while True: np.copyto(b, a)"),
    "cachehog": ("import numpy as np\na = np.ones(2 * 1024 * 1024 // 8)\nb = np.empty_like(a)\n"
                 "while True: np.copyto(b, a)"),
}
FIGURES = ("step", "control", "mem2M", "mem32M", "loop", "mm_unit")


def memory_candidates() -> dict[str, Callable[[], Any]]:
    """The two candidate memory controls, built once: ``mem2M``, the plugin's memory
    control since R59 (:func:`memory_kernel`), and ``mem32M``."""
    import torch

    from pytest_distperf.rank.clock import memory_kernel

    big = torch.randn(8 * 1024 * 1024)
    big_out = torch.empty_like(big)

    def mem32m() -> None:
        big_out.copy_(big)

    return {"mem2M": memory_kernel(), "mem32M": mem32m}


def workloads() -> dict[str, Callable[[], Any]]:
    """The timed pieces of work, built once (torch, one thread)."""
    import torch

    from pytest_distperf.rank.clock import control_kernel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddp_verdicts import MM_UNIT_SHAPE, mm_product

    torch.set_num_threads(1)
    torch.manual_seed(0)
    vocab, dim = 512, 128
    layer = torch.nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True,
                                             norm_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, dim),
                                torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                torch.nn.Linear(dim, vocab))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tokens = torch.randint(0, vocab, (20, 32))

    def step() -> None:
        opt.zero_grad()
        model(tokens).float().logsumexp(-1).mean().backward()
        opt.step()

    def loop() -> None:
        for _ in range(500_000):
            pass

    product = mm_product(*MM_UNIT_SHAPE)

    def mm_unit() -> None:
        for _ in range(8):
            product()

    return {"step": step, "control": control_kernel(), **memory_candidates(), "loop": loop,
            "mm_unit": mm_unit}


def conditions(rounds: int, samples: int) -> dict[str, list[dict[str, float]]]:
    work = workloads()
    for _ in range(5):  # warm-up
        for fn in work.values():
            fn()
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in NEIGHBOURS}
    for r in range(rounds):
        for name, code in NEIGHBOURS.items():
            neighbour = subprocess.Popen([sys.executable, "-c", code]) if code else None
            try:
                time.sleep(0.5)
                for _ in range(samples):
                    row = {}
                    for figure, fn in work.items():
                        started = time.perf_counter()
                        fn()
                        row[figure] = time.perf_counter() - started
                    rows[name].append(row)
            finally:
                if neighbour is not None:
                    neighbour.kill()
                    neighbour.wait()
            print(f"round {r + 1}/{rounds}: {name} done", flush=True)
    return rows


def report_conditions(rows: dict[str, list[dict[str, float]]]) -> None:
    medians = {name: {f: statistics.median(row[f] for row in mine) for f in FIGURES}
               for name, mine in rows.items()}
    quiet = medians["quiet"]
    print(f"\n{'neighbour':<10}" + "".join(f"{f:>9}" for f in FIGURES)
          + "   (median, ratio to quiet)")
    for name, figures in medians.items():
        print(f"{name:<10}" + "".join(f"{figures[f] / quiet[f]:>9.3f}" for f in FIGURES))
    print(f"{'quiet, ms':<10}" + "".join(f"{quiet[f] * 1e3:>9.2f}" for f in FIGURES))
    mm = [row["control"] / row["mm_unit"] for mine in rows.values() for row in mine]
    print(f"mm_unit products per control (x8): median {statistics.median(mm) * 8:.2f} over all "
          "conditions; by condition: " + ", ".join(
              f"{name} {statistics.median(r['control'] / r['mm_unit'] for r in mine) * 8:.2f}"
              for name, mine in rows.items()))


def watch(minutes: float, every: float = 3.0) -> list[dict[str, float]]:
    work = workloads()
    names = ("step", "control", "mem2M")
    for _ in range(5):
        for name in names:
            work[name]()
    rows, end = [], time.monotonic() + 60 * minutes
    while time.monotonic() < end:
        started = time.monotonic()
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(10):
            for name in names:
                t0 = time.perf_counter()
                work[name]()
                times[name].append(time.perf_counter() - t0)
        rows.append({name: statistics.median(v) for name, v in times.items()})
        if len(rows) % 20 == 0:
            print(f"{time.strftime('%H:%M:%S', time.gmtime())} "
                  + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in rows[-1].items()), flush=True)
        time.sleep(max(0.0, every - (time.monotonic() - started)))
    return rows


def report_watch(rows: list[dict[str, float]], every: float = 3.0) -> None:
    import numpy as np

    logs = {k: np.log([r[k] for r in rows]) for k in rows[0]}
    print(f"\n{len(rows)} points; max/min of each over the watch: " + ", ".join(
        f"{k} {math.exp(v.max() - v.min()):.3f}" for k, v in logs.items()))
    _fits("", logs)
    # the host's moves over a minute, which is what lies between a save and a compare run
    # (single points also carry each figure's own sampling jitter, which dilutes a fit)
    k = max(1, round(60 / every))
    if len(rows) > 2 * k:
        _fits("minute means: ", {name: np.convolve(v, np.ones(k) / k, mode="valid")
                                 for name, v in logs.items()})
    # the slow spells: the control 5% or more above its usual (its 10% quantile)
    excess = {name: v - np.quantile(v, 0.1) for name, v in logs.items()}
    slow = excess["control"] >= math.log(1.05)
    if slow.any():
        print(f"slow spells ({int(slow.sum())} of {len(rows)} points, the control 5% or more "
              "above its 10% quantile): each slower by " + ", ".join(
                  f"{name} {math.exp(float(v[slow].mean())) - 1:+.1%}"
                  for name, v in excess.items()))


def _fits(label: str, logs: dict[str, Any]) -> None:
    """Least-squares fits of log step on log control, log mem2M and both (centred)."""
    import numpy as np

    step = logs["step"] - logs["step"].mean()
    for name, keys in (("control", ["control"]), ("mem2M", ["mem2M"]),
                       ("both", ["control", "mem2M"])):
        x = np.column_stack([logs[k] - logs[k].mean() for k in keys])
        coef, *_ = np.linalg.lstsq(x, step, rcond=None)
        resid = step - x @ coef
        r2 = 1 - float(resid @ resid) / float(step @ step) if float(step @ step) else 0.0
        print(f"{label}log step on {name}: slopes "
              + ", ".join(f"{k} {c:.2f}" for k, c in zip(keys, coef, strict=True))
              + f"; share of the step's variance explained {r2:.2f}")


def _pool_rank(rank: int, port: int, calls: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from pytest_distperf.rank.clock import control_kernel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tensor = torch.ones(1024 * 1024)  # 4 MiB
        work = {"all_reduce": lambda: dist.all_reduce(tensor), "control": control_kernel(),
                **memory_candidates()}
        for _ in range(5):
            for fn in work.values():
                fn()
        times: dict[str, list[float]] = {name: [] for name in work}
        for _ in range(calls):
            for name, fn in work.items():
                dist.barrier()
                started = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - started)
        if rank == 0:
            queue.put({name: statistics.median(v) for name, v in times.items()})
        dist.barrier()
    finally:
        dist.destroy_process_group()


def pools(n: int, calls: int) -> list[dict[str, float]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = []
    for p in range(n):
        queue = ctx.Queue()
        port = 29600 + (os.getpid() + p) % 2000
        procs = [ctx.Process(target=_pool_rank, args=(r, port, calls, queue)) for r in range(2)]
        for proc in procs:
            proc.start()
        out.append(queue.get(timeout=300))
        for proc in procs:
            proc.join()
        print(f"pool {p + 1}/{n}: "
              + "  ".join(f"{k} {v * 1e3:.3f} ms" for k, v in out[-1].items()), flush=True)
    return out


def report_pools(rows: list[dict[str, float]]) -> None:
    logs = {k: [math.log(r[k]) for r in rows] for k in rows[0]}
    corr = {k: statistics.correlation(logs["all_reduce"], v) for k, v in logs.items()
            if k != "all_reduce"}
    print("\nacross pools, correlation of log medians with the all-reduce's: "
          + ", ".join(f"{k} {c:+.2f}" for k, c in corr.items()))
    print("max/min of the pool medians: " + ", ".join(
        f"{k} {max(r[k] for r in rows) / min(r[k] for r in rows):.2f}" for k in rows[0]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the four conditions")
    parser.add_argument("--samples", type=int, default=30, help="samples per condition a round")
    parser.add_argument("--pools", type=int, default=0,
                        help="measure across this many fresh rank pools instead")
    parser.add_argument("--calls", type=int, default=30, help="all-reduces per pool")
    parser.add_argument("--watch", type=float, default=0.0,
                        help="watch the host for this many minutes instead")
    parser.add_argument("--json", help="--watch: write the points here as well")
    args = parser.parse_args(argv)
    if min(args.rounds, args.samples, args.calls) < 1 or min(args.pools, args.watch) < 0:
        parser.error("--rounds, --samples and --calls must be at least 1, --pools and "
                     "--watch at least 0")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}", flush=True)
    if args.watch:
        rows = watch(args.watch)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"every_s": 3.0, "points": rows}, f)
        report_watch(rows)
    elif args.pools:
        report_pools(pools(args.pools, args.calls))
    else:
        report_conditions(conditions(args.rounds, args.samples))


if __name__ == "__main__":
    main()
