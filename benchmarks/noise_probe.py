"""What the noise probe reads, and how much a gloo collective moves between rank pools.

Two measurements behind the noise probe's limits (pytest_distperf/verdict/noise.py) and the
bench verdicts' figures (benchmarks/verdict_quality.md, R18):

* ``probe``: 2 gloo ranks (1 thread each) run one kind of work in a loop: ``all_reduce``
  (4 MiB), ``matmul`` (256x256) or ``sleep`` (20 ms naps); after 3 s the probe reads 2 s of
  it (``noise.snapshot`` / ``noise.between``, as the plugin does around a measurement): the
  ranks' CPU wait, the other processes' load, and whether that is too noisy.  With
  ``--hogs``, each kind runs again beside a neighbour busy that share of the time (10 ms
  periods).
* ``pools``: N fresh pairs of ranks in turn, each timing 40 barrier-aligned 4 MiB
  all-reduces; the median's bus bandwidth per pair and their coefficient of variation: how
  much the same code moves from one pytest run to the next.

    python benchmarks/noise_probe.py                       # both, hogs 0 0.3 0.6 1.0, 8 pools
    python benchmarks/noise_probe.py probe --hogs 0 1.0
    python benchmarks/noise_probe.py pools --pools 16

Results: benchmarks/verdict_quality.md (R18).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pytest_distperf.verdict import noise

HOG = ("import sys, time\n"
       "duty, end = float(sys.argv[1]), time.time() + float(sys.argv[2])\n"
       "while time.time() < end:\n"
       "    t = time.time()\n"
       "    while time.time() - t < 0.01 * duty:\n"
       "        pass\n"
       "    time.sleep(0.01 * (1 - duty))\n")
MIB4 = 1 << 20  # float32 elements in 4 MiB


def _loop(rank: int, kind: str, seconds: float, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    x, a = torch.ones(MIB4), torch.randn(256, 256)
    dist.barrier()
    end = time.time() + seconds
    while time.time() < end:
        if kind == "all_reduce":
            dist.all_reduce(x)
        elif kind == "matmul":
            a @ a
        else:
            time.sleep(0.02)
    dist.barrier()
    dist.destroy_process_group()


def _neighbour(duty: float) -> int:
    """The pid of a busy neighbour, started through a shell that exits at once: no
    descendant of this process (the probe counts those as the measurement's own)."""
    out = subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(HOG)} "
                          f"{duty} 9 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True)
    return int(out.stdout.strip())


def probe(kind: str, hog: float, port: int) -> noise.NoiseFigures:
    ctx = mp.get_context("spawn")
    neighbour = _neighbour(hog) if hog > 0 else None
    ranks = [ctx.Process(target=_loop, args=(r, kind, 6.0, port)) for r in range(2)]
    for p in ranks:
        p.start()
    try:
        time.sleep(3.0)
        pids = [p.pid for p in ranks if p.pid is not None]
        start = noise.snapshot(pids)
        time.sleep(2.0)
        return noise.between(start, noise.snapshot(pids))
    finally:
        for p in ranks:
            p.join(30)
        if neighbour is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(neighbour, signal.SIGKILL)


def _timed(rank: int, port: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    x = torch.ones(MIB4)
    for _ in range(5):
        dist.all_reduce(x)
    times = []
    for _ in range(40):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def pools(count: int, port: int) -> list[float]:
    """Bus bandwidth (GB/s) of the median 4 MiB all-reduce of ``count`` fresh rank pairs;
    for 2 ranks the bus factor 2(n-1)/n is 1."""
    ctx = mp.get_context("spawn")
    out = []
    for i in range(count):
        queue = ctx.Queue()
        ranks = [ctx.Process(target=_timed, args=(r, port + i, queue)) for r in range(2)]
        for p in ranks:
            p.start()
        out.append(4 * MIB4 / queue.get(timeout=120) / 1e9)
        for p in ranks:
            p.join(30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("probe", "pools", "both"), default="both")
    parser.add_argument("--hogs", type=float, nargs="+", default=[0.0, 0.3, 0.6, 1.0],
                        help="neighbour duty cycles to run the probe beside (0: none)")
    parser.add_argument("--pools", type=int, default=8, help="fresh rank pairs to time")
    parser.add_argument("--port", type=int, default=29650)
    args = parser.parse_args()
    print(f"noise_probe: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
          f"{platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}", flush=True)
    port = args.port
    if args.what in ("probe", "both"):
        print(f"{'neighbour':>9}  {'work':<10} {'ranks wait':>10} {'other load':>10}  noisy")
        for hog in args.hogs:
            for kind in ("all_reduce", "matmul", "sleep"):
                f = probe(kind, hog, port)
                port += 1
                why = "; ".join(f.too_noisy()) or "no"
                wait = "?" if f.wait is None else f"{f.wait:.0%}"
                other = "?" if f.other_load is None else f"{f.other_load:.0%}"
                print(f"{hog:>9.0%}  {kind:<10} {wait:>10} {other:>10}  {why}", flush=True)
    if args.what in ("pools", "both"):
        gbps = pools(args.pools, port + 100)
        cv = statistics.stdev(gbps) / statistics.mean(gbps) if len(gbps) > 1 else 0.0
        print(f"4 MiB all-reduce, {len(gbps)} fresh rank pairs: busbw "
              + " ".join(f"{g:.2f}" for g in gbps)
              + f" GB/s; median {statistics.median(gbps):.2f}, coefficient of variation "
              f"{cv:.1%}", flush=True)


if __name__ == "__main__":
    main()
