"""Bound or not: how binding each CPU rank to its own cores changes what the ranks measure.

The plugin binds every rank of a gloo pool to its own cores where the ranks fit on them
(``pytest_distperf.pool.launcher.rank_cores``; ``--distperf-no-bind`` leaves them to the
scheduler).  This measures why, on this machine: fresh pairs of gloo ranks, alternately
bound (rank r on core r) and unbound, each taking several measurements of

- a 4 MiB all-reduce (what ``bench`` times),
- the host-speed control (``control_kernel``) and
- a matmul loop (what ``measure()`` in verdict_quality.py times: 60 products of two 256x256
  float32 matrices),

each call after a barrier, as the plugin's timing loop does.  Per measurement the 25%
quantile of the calls (the controlled rule's estimator) is kept; the report gives, per
workload and binding, the median over all measurements, the spread between the
measurements of one pool (standard deviation of their logs, averaged over the pools), the
spread between pools (of each pool's median measurement) and the two together.

    python benchmarks/rank_binding.py                 # 6 pools each way, 6 measurements
    python benchmarks/rank_binding.py --pools 10 --calls 200

Results: benchmarks/rank_binding.md.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from typing import Any

WORKLOADS = ("all_reduce", "control", "matmul")
#: per binding (bound: True), per pool, per workload: each measurement's 25% quantile
Results = dict[bool, list[dict[str, list[float]]]]


def _rank(rank: int, port: int, bind: bool, measurements: int, calls: int, queue: Any) -> None:
    if bind:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    import torch
    import torch.distributed as dist

    from pytest_distperf.rank.clock import control_kernel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tensor = torch.ones(1024 * 1024)  # 4 MiB of float32
        a, b = torch.randn(256, 256), torch.randn(256, 256)

        def matmul() -> None:
            for _ in range(60):
                torch.mm(a, b)

        work = {"all_reduce": lambda: dist.all_reduce(tensor), "control": control_kernel(),
                "matmul": matmul}
        for fn in work.values():
            for _ in range(5):
                fn()
        out: dict[str, list[float]] = {name: [] for name in work}
        for _ in range(measurements):
            times: dict[str, list[float]] = {name: [] for name in work}
            for _ in range(calls):
                for name, fn in work.items():
                    if name == "matmul" and len(times[name]) * 5 >= calls:
                        continue  # a fifth as many calls: it takes 10x as long
                    dist.barrier()
                    started = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - started)
            for name, values in times.items():
                values.sort()
                out[name].append(values[len(values) // 4])
            time.sleep(0.3)
        if rank == 0:
            queue.put(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_pools(pools: int, measurements: int, calls: int) -> Results:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results: Results = {True: [], False: []}
    for p in range(2 * pools):
        bind = p % 2 == 1
        queue = ctx.Queue()
        port = 29800 + (os.getpid() + p) % 2000
        procs = [ctx.Process(target=_rank, args=(r, port, bind, measurements, calls, queue))
                 for r in range(2)]
        for proc in procs:
            proc.start()
        out = queue.get(timeout=600)
        for proc in procs:
            proc.join()
        results[bind].append(out)
        print(f"pool {p + 1}/{2 * pools} ({'bound' if bind else 'unbound'}): "
              + "  ".join(f"{k} " + " ".join(f"{v * 1e3:.2f}" for v in out[k]) + " ms"
                          for k in WORKLOADS), flush=True)
    return results


def report(results: Results) -> None:
    print("\n| workload | ranks | 25% quantile, median (ms) | between measurements of a pool "
          "| between pools | all measurements |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in WORKLOADS:
        for bind in (False, True):
            logs = [[math.log(v) for v in pool[name]] for pool in results[bind]]
            flat = [x for pool in logs for x in pool]
            within = statistics.mean(statistics.stdev(pool) for pool in logs)
            between = statistics.stdev(statistics.median(pool) for pool in logs)
            print(f"| {name} | {'bound' if bind else 'unbound'} | "
                  f"{math.exp(statistics.median(flat)) * 1e3:.3f} | {within:.3f} | "
                  f"{between:.3f} | {statistics.stdev(flat):.3f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pools", type=int, default=6, help="fresh rank pairs each way")
    parser.add_argument("--measurements", type=int, default=6, help="per pool")
    parser.add_argument("--calls", type=int, default=150,
                        help="calls of the all-reduce and the control per measurement")
    args = parser.parse_args(argv)
    if min(args.pools, args.measurements, args.calls) < 2:
        parser.error("--pools, --measurements and --calls must be at least 2")
    if not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("rank_binding: needs Linux and at least 2 cores (one per rank)")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"rank_binding: {platform.node()}, {len(os.sched_getaffinity(0))} cores, "
          f"Python {platform.python_version()}, {when}")
    report(run_pools(args.pools, args.measurements, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
