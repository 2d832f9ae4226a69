"""Does ``nccl_group.bench`` measure what a hand-written loop measures?

On the same ranks (one pool), alternate ``bench("all_reduce", SIZE)`` with a hand-written
``dist.all_reduce`` loop: barrier, then ``time.perf_counter()`` around each call on CPU, or
CUDA events around each call on GPU (a second, event-timed loop; never a host clock around
an asynchronous kernel).  Both take the slowest rank per iteration and the median over
iterations, and compute busbw with nccl-tests' formula written out here, independently of
the plugin.  Rounds alternate which goes first, so that a drift of the machine hits both;
rounds are short (default 2 timed iterations each, many rounds) so that the two sides of a
round see the same machine.

Pass: the pooled busbw ratio bench / hand-written (median of every iteration of each side)
is within 0.95 .. 1.05.  ``--aa`` runs the same comparison with the hand-written loop on both
sides: the noise floor of the comparison on this machine.

    python benchmarks/fidelity.py                   # 2 ranks, gloo on CPU, 16 MiB
    python benchmarks/fidelity.py --ranks 4 --rounds 12
    python benchmarks/fidelity.py --backend nccl    # one GPU per rank: also the CUDA-event loop
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
from typing import Any

LOW, HIGH = 0.95, 1.05


def hand_written_perf_counter(count: int, warmup: int, iters: int) -> list[float]:
    """The loop a user would write on CPU: seconds per all_reduce on this rank."""
    import time

    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.zeros(count, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    if device == "cuda":
        torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        if device == "cuda":
            torch.cuda.synchronize()  # a host clock needs the kernel finished
        out.append(time.perf_counter() - t0)
    return out


def hand_written_cuda_events(count: int, warmup: int, iters: int) -> list[float]:
    """The loop a user would write on GPU: CUDA events around each all_reduce."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(count, dtype=torch.float32, device="cuda")
    for _ in range(warmup):
        dist.all_reduce(tensor)
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        dist.barrier()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(tensor)
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def slowest_per_iteration(per_rank: list[list[float]]) -> list[float]:
    return [max(column) for column in zip(*per_rank, strict=True)]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def busbw_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests, all_reduce: algbw = S / t, busbw = algbw * 2 (n - 1) / n."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def main(argv: list[str] | None = None) -> int:
    from pytest_distperf.config import format_size, parse_size
    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.pool.launcher import RankPool

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--size", default="16MiB")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--quiet", action="store_true", help="no line per round")
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument("--aa", action="store_true",
                        help="A/A control: the hand-written perf_counter loop plays bench's part "
                             "too, so the ratio shows this machine's noise floor")
    args = parser.parse_args(argv)

    import torch

    backend = args.backend
    if backend == "auto":
        enough = torch.cuda.is_available() and torch.cuda.device_count() >= args.ranks
        backend = "nccl" if enough else "gloo"
    nbytes = parse_size(args.size)
    count = nbytes // 4
    pool = RankPool(args.ranks, backend)
    group = DistGroup(pool)
    loops: dict[str, Any] = {"perf_counter": hand_written_perf_counter}
    if backend == "nccl":
        loops["cuda_events"] = hand_written_cuda_events
    samples: dict[str, list[float]] = {"bench": [], **{name: [] for name in loops}}
    round_ratios: dict[str, list[float]] = {name: [] for name in loops}
    print(f"fidelity: {args.ranks} ranks, {backend}, all_reduce {format_size(nbytes)} float32, "
          f"{args.rounds} rounds x {args.iters} iterations (+{args.warmup} warm-up)"
          + ("  [A/A control: 'bench' is the hand-written loop]" if args.aa else ""))
    if not args.quiet:
        print(f"{'round':>5} {'bench busbw':>12} "
              + " ".join(f"{n + ' busbw':>18}" for n in loops) + "  ratio(s)")
    try:
        for round_ in range(args.rounds):
            medians: dict[str, float] = {}
            order = ["bench", *loops] if round_ % 2 == 0 else [*loops, "bench"]
            for name in order:
                if name == "bench" and args.aa:
                    times = slowest_per_iteration(group.run(
                        hand_written_perf_counter, count, args.warmup, args.iters))
                elif name == "bench":
                    # without the host-speed control: the hand-written loops have none
                    result = group.bench("all_reduce", [nbytes], warmup=args.warmup,
                                         iters=args.iters, control=False)
                    times = [t / 1e6 for t in result.rows[0].samples_us]
                else:
                    per_rank = group.run(loops[name], count, args.warmup, args.iters)
                    times = slowest_per_iteration(per_rank)
                samples[name].extend(times)
                medians[name] = statistics.median(times)
            bench_bw = busbw_gbps(nbytes, medians["bench"], args.ranks)
            others = {n: busbw_gbps(nbytes, medians[n], args.ranks) for n in loops}
            for n, bw in others.items():
                round_ratios[n].append(bench_bw / bw)
            ratios = " ".join(f"{bench_bw / bw:.3f}" for bw in others.values())
            if not args.quiet:
                print(f"{round_:>5} {bench_bw:>12.4f} "
                      + " ".join(f"{bw:>18.4f}" for bw in others.values()) + f"  {ratios}")
    finally:
        pool.close()

    ok = True
    pooled_bench = busbw_gbps(nbytes, statistics.median(samples["bench"]), args.ranks)
    print(f"\npooled over {len(samples['bench'])} iterations each (median of the slowest rank):")
    print(f"  bench                 busbw {pooled_bench:.4f} GB/s")
    for name in loops:
        pooled = busbw_gbps(nbytes, statistics.median(samples[name]), args.ranks)
        ratio = pooled_bench / pooled
        good = LOW <= ratio <= HIGH
        ok &= good
        print(f"  hand-written {name:<9} busbw {pooled:.4f} GB/s   ratio bench/hand = "
              f"{ratio:.3f}  {'PASS' if good else 'FAIL'} ({LOW}..{HIGH})")
        low = busbw_gbps(nbytes, quantile(samples["bench"], 0.1), args.ranks) / busbw_gbps(
            nbytes, quantile(samples[name], 0.1), args.ranks)
        print(f"  fastest-10% (p10) ratio vs {name}: {low:.3f} (noise on a shared machine only "
              f"adds time, so the fast end shows the timing path itself)")
        per_round = sorted(round_ratios[name])
        print(f"  per-round ratios vs {name}: median {statistics.median(per_round):.3f}, "
              f"range {per_round[0]:.3f} .. {per_round[-1]:.3f} (the machine's noise)")
    cpu = platform.processor() or platform.machine()
    now = datetime.datetime.now().isoformat(timespec="minutes")
    print(f"\nmachine: {platform.node()} {cpu}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, python {sys.version.split()[0]}; {now}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
