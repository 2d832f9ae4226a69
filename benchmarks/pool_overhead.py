"""What the warm rank pool saves: one run() on a warm pool vs a fresh group per test.

Three measurements, each at 2 and 4 ranks on gloo:

1. ``warm run()``: controller-side wall time of ``RankPool.execute`` of a trivial function on
   a pool that is already up (pickle, pipe to every rank, run, pipe back, unpickle).
2. ``fresh group``: start the ranks, rendezvous, init the process group, run the same
   function, tear down (forks of the fork server, which imported torch once).
3. ``12 tests vs 1``: the wall time of a pytest run of a file with 12 distributed tests over
   that of a file with one (both through the real plugin, pool started once per run).

Goals: warm run() under 5 ms; 12 tests at most 1.5x the wall time of 1.

    python benchmarks/pool_overhead.py            # prints a Markdown table
    python benchmarks/pool_overhead.py --quick    # fewer repetitions
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def trivial() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def warm_run_ms(world_size: int, calls: int) -> list[float]:
    from pytest_distperf.pool.launcher import RankPool

    pool = RankPool(world_size, "gloo", timeout_s=120)
    try:
        pool.execute(trivial, (), {}, world_size, "warm-up")
        samples = []
        for _ in range(calls):
            t0 = time.perf_counter()
            pool.execute(trivial, (), {}, world_size, "bench")
            samples.append((time.perf_counter() - t0) * 1e3)
        return samples
    finally:
        pool.close()


def fresh_group_s(world_size: int, repeats: int) -> list[float]:
    from pytest_distperf.pool.launcher import RankPool

    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        pool = RankPool(world_size, "gloo", timeout_s=120)
        pool.execute(trivial, (), {}, world_size, "bench")
        pool.close()
        samples.append(time.perf_counter() - t0)
    return samples


TEST_BODY = '''
def test_{i}(nccl_group):
    import torch, torch.distributed as dist
    def step():
        t = torch.ones(1024)
        dist.all_reduce(t)
        return t[0].item()
    assert nccl_group.run(step) == [float(nccl_group.world_size)] * nccl_group.world_size
'''


def pytest_file_s(world_size: int, n_tests: int, repeats: int) -> list[float]:
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, f"test_{n_tests}_tests.py")
        path.write_text("".join(TEST_BODY.format(i=i) for i in range(n_tests)))
        Path(tmp, "pytest.ini").write_text("[pytest]\n")
        for _ in range(repeats):
            t0 = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--distperf",
                 "--gpus", str(world_size), str(path)],
                cwd=tmp, capture_output=True, text=True, check=False,
            )
            samples.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise SystemExit(f"pytest run failed:\n{proc.stdout}\n{proc.stderr}")
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    calls, fresh, files = (50, 2, 1) if args.quick else (200, 5, 3)
    rows = []
    for world in (2, 4):
        warm = warm_run_ms(world, calls)
        spawn = fresh_group_s(world, fresh)
        one = pytest_file_s(world, 1, files)
        twelve = pytest_file_s(world, 12, files)
        rows.append((world, warm, spawn, one, twelve))
        print(f"# {world} ranks done", file=sys.stderr)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, date {time.strftime('%Y-%m-%d')}")
    print()
    print("| ranks | warm run() median | warm run() p90 | fresh group per test (median) | "
          "fresh / warm | pytest file, 1 test | pytest file, 12 tests | 12 / 1 |")
    print("|---|---|---|---|---|---|---|---|")
    for world, warm, spawn, one, twelve in rows:
        warm_med = statistics.median(warm)
        p90 = sorted(warm)[int(0.9 * (len(warm) - 1))]
        spawn_med = statistics.median(spawn)
        one_med, twelve_med = statistics.median(one), statistics.median(twelve)
        print(f"| {world} | {warm_med:.2f} ms | {p90:.2f} ms | {spawn_med:.2f} s | "
              f"{spawn_med * 1e3 / warm_med:.0f}x | {one_med:.2f} s | {twelve_med:.2f} s | "
              f"{twelve_med / one_med:.2f}x |")


if __name__ == "__main__":
    main()
