"""Why ``bench("all_reduce")`` read 1-3 us less than the hand-written CUDA-event loop.

On one H200 with one NCCL rank (benchmarks/gpu.md) ``nccl_group.bench("all_reduce", size)``
read 0.93-0.98 of ``gpu_check.py``'s hand-written loop at every size.  On one rank NCCL moves
no data, so both time ~40-50 us of launch overhead, and *how* each loop is timed decides the
figure.  Read side by side, the two timed regions differ only in what comes before the start
event (the region of ``bench`` does strictly more host work, which cannot make it shorter):

* ``bench`` (``rank/clock.py``: ``time_with_control`` and ``Clock.elapsed``): ``barrier()``,
  then the start event at once;
* the hand loop (``gpu_check.all_reduce_loop``): ``barrier()``, ``torch.cuda.synchronize()``,
  then the start event.

Hypothesis H1 (GPU side): torch's NCCL barrier (``WorkNCCL::wait``, torch >= 2.6) makes the
current stream wait for the barrier's all-reduce with a ``cudaStreamWaitEvent`` and blocks the
host on the stream only ``if (isBarrierOp_ && !isCompleted())``; on one rank the all-reduce
has finished by then, so ``barrier()`` returns with that wait still queued on the current
stream.  Our start event queues behind it, gets its GPU timestamp late, and every sample is
short by that lag; the hand loop's synchronize drains the stream first.
Hypothesis H2 (host side): the device synchronize makes the launches after it slower on the
host (a cold driver path), so the hand loop's region is longer, not ours shorter.

Each variant times the same all-reduce (float32, in place) on the same ranks, rounds
alternating their order; per variant and size: median, mean, p10, p90 and ratios to ``hand``.

=================  =========================================================================
variant            what is timed
=================  =========================================================================
bench              ``DistGroup.bench("all_reduce", [size], warmup=5, iters=N, control=False)``
bench_w50          the same, 50 warm-up calls
hand               ``gpu_check.all_reduce_loop`` verbatim: barrier, synchronize, events
hand_nosync        the hand loop without the synchronize
clock              a copy of ``time_with_control`` + ``Clock.elapsed`` (should equal bench)
clock_devsync      clock with ``torch.cuda.synchronize()`` after the barrier
clock_streamsync   clock with ``torch.cuda.current_stream().synchronize()`` after the barrier
clock_spin         clock with 50 us of host spinning after the barrier, no CUDA call
bare               the hand loop with neither barrier nor synchronize
sync_only          the hand loop with the synchronize and no barrier
probe[_devsync]    clock (with the synchronize) and ``perf_counter`` after each event record:
                   the host's interval beside the GPU's; ``gpu-host`` = their difference
startlat[_devsync] after the barrier (and synchronize): the start event recorded, then polled
                   until the GPU has passed it: its host-seen latency (no all-reduce timed)
pending            after the barrier: is the current stream still busy (``query()``)?
b2b_marks          back to back: one barrier + synchronize, N calls, an event after each
b2b_pair           back to back: one event pair around blocks of 10 calls (per-call mean)
=================  =========================================================================

Reading it (the ``hints`` block prints these ratios per size):

* ``bench/clock`` ~1.00: the copy reproduces ``bench``; what moves ``clock`` moves ``bench``.
* H1 confirmed: ``clock/clock_devsync`` and ``hand_nosync/hand`` show the gap of
  ``bench/hand`` (0.93-0.98), ``clock/clock_spin`` too (time alone lets the GPU catch up),
  ``probe``'s gpu-host is lower than ``probe_devsync``'s by the 1-3 us while their host times
  agree, ``startlat`` > ``startlat_devsync``, ``pending`` > 0, and ``bare/sync_only`` ~1.00
  (no barrier: a synchronize changes nothing).
* H2 instead: the host time of ``probe_devsync`` exceeds ``probe``'s by the gap, gpu-host
  agrees, ``clock/clock_spin`` ~1.00 and ``bare/sync_only`` < 1 too.
* Neither (``clock/clock_devsync`` ~1.00): the gap is elsewhere: the statistic (``mean``
  ratios against ``median`` ones), warm-up (``bench_w50``), or the order of the rounds.

    python benchmarks/gpu_bench_diag.py --out /tmp/diag          # one GPU, NCCL, 1 rank
    python benchmarks/gpu_bench_diag.py --out /tmp/diag --cpu    # dry run: gloo, 2 ranks

Writes ``DIR/gpu_bench_diag.json`` (after every round, so a killed run leaves its rounds).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES = ("8B", "64KiB", "1MiB", "16MiB", "256MiB")
SIZES_CPU = ("8B", "64KiB", "1MiB")
VARIANTS = ("bench", "bench_w50", "hand", "hand_nosync", "clock", "clock_devsync",
            "clock_streamsync", "clock_spin", "bare", "sync_only", "probe", "probe_devsync",
            "startlat", "startlat_devsync", "pending", "b2b_marks", "b2b_pair")
#: Variants whose samples are not all-reduce times (no ratios to ``hand``).
PROBES = ("startlat", "startlat_devsync", "pending")
SPIN_S = 50e-6  # clock_spin: the host waits this long after the barrier (no CUDA call)
WARMUP = 5
BLOCK = 10  # calls per event pair in b2b_pair

Samples = dict[str, list[float]]


# -- on the ranks ------------------------------------------------------------------------------
def _device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Clock:
    """A copy of ``pytest_distperf.rank.clock.Clock``: CUDA events, else perf_counter."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"

    def now(self) -> Any:
        if self.on_cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        if self.on_cuda:
            return float(start.elapsed_time(end)) / 1e3
        return float(end - start)

    def synchronize(self) -> None:
        if self.on_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def elapsed(self, fn: Callable[[], Any]) -> float:
        start = self.now()
        fn()
        end = self.now()
        if self.on_cuda:
            end.synchronize()
        return self.seconds(start, end)


def hand_loop(count: int, warmup: int, iters: int, barrier: bool = True,
              sync: bool = True) -> Samples:
    """``gpu_check.all_reduce_loop`` verbatim (barrier and sync as given): a barrier, then
    CUDA events (perf_counter on CPU) around each all_reduce."""
    import torch
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    tensor = torch.ones(max(count, 1), dtype=torch.float32, device="cuda" if cuda else "cpu")
    for _ in range(warmup):
        dist.all_reduce(tensor)
    out = []
    for _ in range(iters):
        if barrier:
            dist.barrier()
        if cuda:
            if sync:
                torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(tensor)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            dist.all_reduce(tensor)
            out.append(time.perf_counter() - t0)
    return {"t": out}


def _spin() -> None:
    until = time.perf_counter() + SPIN_S
    while time.perf_counter() < until:
        pass


def _after_barrier(how: str, cuda: bool) -> Callable[[], None]:
    """What follows the barrier: nothing, a device synchronize, a stream synchronize or
    (``spin``) host time without any CUDA call."""
    import torch

    if how == "spin":
        return _spin
    if not cuda or how == "":
        return lambda: None
    if how == "devsync":
        return torch.cuda.synchronize
    if how == "streamsync":
        return lambda: torch.cuda.current_stream().synchronize()
    raise ValueError(how)


def clock_loop(count: int, warmup: int, iters: int, after: str = "") -> Samples:
    """``rank/collectives.py``'s all-reduce case timed by a copy of ``time_with_control``
    (``control=False``), with ``after`` ("", "devsync", "streamsync", "spin") after each
    barrier."""
    import torch
    import torch.distributed as dist

    from pytest_distperf import set_phase

    device = _device()
    clock = _Clock(device)
    buf = torch.zeros(count, dtype=torch.float32, device=device)

    def run() -> None:
        dist.all_reduce(buf)

    then = _after_barrier(after, clock.on_cuda)
    prefix = f"diag clock{after} {count}: "
    for i in range(warmup):
        set_phase(f"{prefix}warm-up {i + 1}/{warmup}")
        run()
    clock.synchronize()
    samples: list[float] = []
    for i in range(iters):
        set_phase(f"{prefix}timed iteration {i + 1}/{iters}")
        dist.barrier()
        if after:  # "": nothing at all between the barrier and the start event, as in bench
            then()
        samples.append(clock.elapsed(run))
    dist.barrier()
    return {"t": samples}


def probe_loop(count: int, warmup: int, iters: int, after: str = "") -> Samples:
    """clock_loop with ``perf_counter`` right after each event's record: the host's interval
    (``host``) beside the GPU's (``t``), and their difference on this rank (``offset``)."""
    import torch
    import torch.distributed as dist

    device = _device()
    cuda = device.type == "cuda"
    buf = torch.zeros(count, dtype=torch.float32, device=device)

    def run() -> None:
        dist.all_reduce(buf)

    then = _after_barrier(after, cuda)
    for _ in range(warmup):
        run()
    if cuda:
        torch.cuda.synchronize(device)
    out: list[float] = []
    host: list[float] = []
    for _ in range(iters):
        dist.barrier()
        then()
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(device))
            h0 = time.perf_counter()
            run()
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(device))
            h1 = time.perf_counter()
            end.synchronize()
            out.append(float(start.elapsed_time(end)) / 1e3)
        else:
            h0 = time.perf_counter()
            run()
            h1 = time.perf_counter()
            out.append(h1 - h0)
        host.append(h1 - h0)
    dist.barrier()
    return {"t": out, "host": host, "offset": [a - b for a, b in zip(out, host, strict=True)]}


def startlat_loop(count: int, warmup: int, iters: int, after: str = "") -> Samples:
    """After each barrier (and ``after``): a start event recorded as the clock does, then
    polled until the GPU has passed it; ``t``: the host-seen latency (CUDA only), then one
    untimed all-reduce, waited for as the clock waits for its end event."""
    import torch
    import torch.distributed as dist

    device = _device()
    cuda = device.type == "cuda"
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    then = _after_barrier(after, cuda)
    for _ in range(warmup):
        dist.all_reduce(buf)
    out: list[float] = []
    for _ in range(iters):
        dist.barrier()
        then()
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(device))
            h0 = time.perf_counter()
            while not start.query():
                pass
            out.append(time.perf_counter() - h0)
            dist.all_reduce(buf)
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(device))
            end.synchronize()
        else:
            dist.all_reduce(buf)
    dist.barrier()
    return {"t": out}


def pending_loop(count: int, warmup: int, iters: int) -> Samples:
    """Per iteration: the barrier's host time (``t``), whether the current stream still had
    work right after it (``pending``, 1/0), the synchronize that followed (``sync``), then
    one untimed all-reduce waited for as the clock waits for its end event."""
    import torch
    import torch.distributed as dist

    device = _device()
    cuda = device.type == "cuda"
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    out: list[float] = []
    pending: list[float] = []
    sync: list[float] = []
    for _ in range(iters):
        h0 = time.perf_counter()
        dist.barrier()
        h1 = time.perf_counter()
        if cuda:
            busy = not torch.cuda.current_stream(device).query()
            h2 = time.perf_counter()
            torch.cuda.synchronize(device)
            sync.append(time.perf_counter() - h2)
            pending.append(1.0 if busy else 0.0)
        out.append(h1 - h0)
        dist.all_reduce(buf)
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(device))
            end.synchronize()
    dist.barrier()
    return {"t": out, "pending": pending, "sync": sync}


def b2b_loop(count: int, warmup: int, iters: int, block: int = 0) -> Samples:
    """Back to back after one barrier and synchronize: ``block`` 0: an event after every
    call, the gaps as samples; else one event pair around each ``block`` calls (each block
    from a barrier and a synchronize), the per-call mean as the sample."""
    import torch
    import torch.distributed as dist

    device = _device()
    clock = _Clock(device)
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    out: list[float] = []
    if block <= 0:
        dist.barrier()
        clock.synchronize()
        marks = [clock.now()]
        for _ in range(iters):
            dist.all_reduce(buf)
            marks.append(clock.now())
        clock.synchronize()
        out = [clock.seconds(a, b) for a, b in itertools.pairwise(marks)]
    else:
        for _ in range(max(1, iters // block)):
            dist.barrier()
            clock.synchronize()
            start = clock.now()
            for _ in range(block):
                dist.all_reduce(buf)
            end = clock.now()
            clock.synchronize()
            out.append(clock.seconds(start, end) / block)
    dist.barrier()
    return {"t": out}


def environment() -> dict[str, Any]:
    """Versions, the device and the settings that change launch latency, on this rank."""
    import platform

    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {"torch": torch.__version__, "backend": dist.get_backend(),
                            "python": platform.python_version(),
                            "affinity": len(os.sched_getaffinity(0))
                            if hasattr(os, "sched_getaffinity") else None,
                            "env": {k: v for k, v in os.environ.items()
                                    if k.startswith(("NCCL_", "TORCH_NCCL", "CUDA_"))}}
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(device=props.name, cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


# -- the controller ----------------------------------------------------------------------------
def make_group(ranks: int, backend: str) -> tuple[Any, Any]:
    """(pool, group): the plugin's own engine and ``nccl_group`` handle, as gpu_check.py
    builds them (the package exports neither from its top level)."""
    try:
        from pytest_distperf.fixtures.group import DistGroup
        from pytest_distperf.pool.launcher import RankPool
    except ImportError as exc:  # the package is being reorganised: say where to look
        raise SystemExit(f"gpu_bench_diag: cannot import the rank pool or DistGroup ({exc}); "
                         f"update make_group() to their new modules") from None
    pool = RankPool(ranks, backend, timeout_s=120)
    return pool, DistGroup(pool)


def slowest(per_rank: list[Samples]) -> Samples:
    """``t`` as the slowest rank per iteration (as bench takes it); the rest from rank 0."""
    got = dict(per_rank[0])
    if len(per_rank) > 1 and all(r["t"] for r in per_rank):
        got["t"] = [max(col) for col in zip(*(r["t"] for r in per_rank), strict=True)]
    return got


def measure(group: Any, variant: str, nbytes: int, iters: int) -> Samples:
    """One call of ``variant`` at ``nbytes`` on every rank."""
    count = max(1, nbytes // 4)
    if variant.startswith("bench"):
        result = group.bench("all_reduce", [nbytes], warmup=50 if variant == "bench_w50"
                             else WARMUP, iters=iters, control=False)
        return {"t": [t / 1e6 for t in result.rows[0].samples_us]}
    calls: dict[str, tuple[Callable[..., Samples], dict[str, Any]]] = {
        "hand": (hand_loop, {}),
        "hand_nosync": (hand_loop, {"sync": False}),
        "bare": (hand_loop, {"barrier": False, "sync": False}),
        "sync_only": (hand_loop, {"barrier": False}),
        "clock": (clock_loop, {}),
        "clock_devsync": (clock_loop, {"after": "devsync"}),
        "clock_streamsync": (clock_loop, {"after": "streamsync"}),
        "clock_spin": (clock_loop, {"after": "spin"}),
        "probe": (probe_loop, {}),
        "probe_devsync": (probe_loop, {"after": "devsync"}),
        "startlat": (startlat_loop, {}),
        "startlat_devsync": (startlat_loop, {"after": "devsync"}),
        "pending": (pending_loop, {}),
        "b2b_marks": (b2b_loop, {}),
        "b2b_pair": (b2b_loop, {"block": BLOCK}),
    }
    fn, kwargs = calls[variant]
    return slowest(group.run(fn, count, WARMUP, iters, **kwargs))


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(rounds: list[Samples]) -> dict[str, Any]:
    """Statistics (us) of one variant at one size over its rounds; ``first10``: the median
    of each round's first 10 samples, ``rest``: of the others (drift after warm-up)."""
    t = [x * 1e6 for r in rounds for x in r["t"]]
    if not t:
        return {"n": 0}
    first = [x * 1e6 for r in rounds for x in r["t"][:10]]
    rest = [x * 1e6 for r in rounds for x in r["t"][10:]]
    row: dict[str, Any] = {"n": len(t), "median": statistics.median(t),
                           "mean": statistics.fmean(t), "p10": quantile(t, 0.1),
                           "p90": quantile(t, 0.9), "min": min(t),
                           "first10": statistics.median(first),
                           "rest": statistics.median(rest) if rest else None}
    host = [x * 1e6 for r in rounds for x in r.get("host", [])]
    if host:
        row["host_median"] = statistics.median(host)
        row["gpu_minus_host_median"] = statistics.median(
            [x * 1e6 for r in rounds for x in r["offset"]])
    pending = [x for r in rounds for x in r.get("pending", [])]
    if pending:
        row["pending_share"] = statistics.fmean(pending)
    sync = [x * 1e6 for r in rounds for x in r.get("sync", [])]
    if sync:
        row["sync_median"] = statistics.median(sync)
    return row


def ratio(stats: dict[str, dict[str, Any]], a: str, b: str, key: str = "median") -> float | None:
    if a in PROBES or b in PROBES:
        return None
    x, y = stats.get(a, {}).get(key), stats.get(b, {}).get(key)
    return x / y if x and y else None


def diff(stats: dict[str, dict[str, Any]], a: str, b: str, key: str) -> float | None:
    x, y = stats.get(a, {}).get(key), stats.get(b, {}).get(key)
    return x - y if x is not None and y is not None else None


#: (line, how): the per-size figures the hints block prints.
HINTS: tuple[tuple[str, Callable[[dict[str, dict[str, Any]]], float | None]], ...] = (
    ("bench/hand, medians (the gap: 0.93-0.98 on the H200)",
     lambda s: ratio(s, "bench", "hand")),
    ("bench/hand, means", lambda s: ratio(s, "bench", "hand", "mean")),
    ("bench/clock (the copy; ~1.00)", lambda s: ratio(s, "bench", "clock")),
    ("clock/clock_devsync (H1 or H2: the sync after the barrier)",
     lambda s: ratio(s, "clock", "clock_devsync")),
    ("clock/clock_streamsync (stream sync enough?)",
     lambda s: ratio(s, "clock", "clock_streamsync")),
    ("clock/clock_spin (H1 if < 1: 50 us of host time, no CUDA call)",
     lambda s: ratio(s, "clock", "clock_spin")),
    ("hand_nosync/hand", lambda s: ratio(s, "hand_nosync", "hand")),
    ("bare/sync_only (sync without a barrier; H2 if < 1)",
     lambda s: ratio(s, "bare", "sync_only")),
    ("gpu-host us, probe - probe_devsync (H1 if < 0)",
     lambda s: diff(s, "probe", "probe_devsync", "gpu_minus_host_median")),
    ("host us, probe_devsync - probe (H2 if > 0)",
     lambda s: diff(s, "probe_devsync", "probe", "host_median")),
    ("start latency us, startlat - startlat_devsync (H1 if > 0)",
     lambda s: diff(s, "startlat", "startlat_devsync", "median")),
    ("stream busy right after the barrier (share; H1 if > 0)",
     lambda s: s.get("pending", {}).get("pending_share")),
    ("bench_w50/bench (warm-up)", lambda s: ratio(s, "bench_w50", "bench")),
    ("b2b_marks/hand (back to back, event per call)", lambda s: ratio(s, "b2b_marks", "hand")),
    ("b2b_pair/hand (back to back, pair per 10 calls)", lambda s: ratio(s, "b2b_pair", "hand")),
)


def fmt(value: Any, width: int = 8, digits: int = 1) -> str:
    if value is None:
        return "-".rjust(width)
    return f"{value:{width}.{digits}f}"


def hints_of(stats: dict[str, dict[str, dict[str, Any]]],
             sizes: tuple[str, ...]) -> dict[str, dict[str, float | None]]:
    """The :data:`HINTS` figures, per line and size."""
    return {line: {label: how(stats[label]) for label in sizes} for line, how in HINTS}


def report(stats: dict[str, dict[str, dict[str, Any]]], sizes: tuple[str, ...]) -> None:
    """Print the table and the hints."""
    head = (f"{'size':>7} {'variant':<17} {'n':>5} {'median':>8} {'mean':>8} {'p10':>8} "
            f"{'p90':>8} {'first10':>8} {'med/hand':>8} {'mean/hd':>8} {'host':>8} "
            f"{'gpu-host':>8} {'pending':>7}")
    print("\nall_reduce, us per call (slowest rank per iteration)\n" + head + "\n"
          + "-" * len(head))
    for label in sizes:
        by = stats[label]
        for variant in VARIANTS:
            row = by.get(variant, {"n": 0})
            if not row["n"]:
                continue
            print(f"{label:>7} {variant:<17} {row['n']:>5} {fmt(row['median'])} "
                  f"{fmt(row['mean'])} {fmt(row['p10'])} {fmt(row['p90'])} "
                  f"{fmt(row['first10'])} {fmt(ratio(by, variant, 'hand'), 8, 3)} "
                  f"{fmt(ratio(by, variant, 'hand', 'mean'), 8, 3)} "
                  f"{fmt(row.get('host_median'))} {fmt(row.get('gpu_minus_host_median'))} "
                  f"{fmt(row.get('pending_share'), 7, 2)}")
    print("(pending: its median is the barrier's host time; startlat: the start event's "
          "latency seen from the host)")
    print("\nhints" + " " * 61 + "".join(f"{label:>9}" for label in sizes))
    for line, values in hints_of(stats, sizes).items():
        digits = 3 if "/" in line.split(" ")[0] else 2
        print(f"  {line:<64}" + "".join(fmt(values[label], 9, digits) for label in sizes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-bench-diag"))
    parser.add_argument("--cpu", action="store_true", help="dry run on gloo, CPU ranks")
    parser.add_argument("--ranks", type=int, default=0, help="default 1 on GPU, 2 on CPU")
    parser.add_argument("--rounds", type=int, default=0, help="default 8 (GPU), 2 (CPU)")
    parser.add_argument("--iters", type=int, default=0, help="timed calls per variant and "
                        "round; default 100 (GPU), 10 (CPU)")
    parser.add_argument("--budget-s", type=float, default=0.0,
                        help="no new round after this; default 95 (GPU), 35 (CPU)")
    parser.add_argument("--sizes", default="", help="comma-separated, e.g. 8B,1MiB")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    import torch

    from pytest_distperf import parse_size

    cpu = args.cpu or not torch.cuda.is_available()
    backend = "gloo" if cpu else "nccl"
    ranks = args.ranks or (2 if cpu else 1)
    rounds = args.rounds or (2 if cpu else 8)
    iters = args.iters or (10 if cpu else 100)
    budget = args.budget_s or (35.0 if cpu else 95.0)
    sizes = tuple(args.sizes.split(",")) if args.sizes else (SIZES_CPU if cpu else SIZES)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_bench_diag.json"
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "ranks": ranks, "backend": backend, "iters": iters,
                              "warmup": WARMUP, "sizes": sizes, "variants": VARIANTS}
    print(f"gpu_bench_diag: {ranks} rank(s), {backend}, {iters} calls x up to {rounds} "
          f"rounds, sizes {', '.join(sizes)}", flush=True)
    pool, group = make_group(ranks, backend)
    raw: dict[str, dict[str, list[Samples]]] = {s: {v: [] for v in VARIANTS} for s in sizes}
    try:
        result["environment"] = group.run(environment)[0]
        print(f"environment: {result['environment']}", flush=True)
        result["startup_s"] = round(time.perf_counter() - started, 1)
        done = 0
        for r in range(rounds):
            t0 = time.perf_counter()
            shift = (r * 5) % len(VARIANTS)
            order = VARIANTS[shift:] + VARIANTS[:shift]
            order = order[::-1] if r % 2 else order
            for label in sizes:
                nbytes = parse_size(label)
                for variant in order:
                    raw[label][variant].append(measure(group, variant, nbytes, iters))
            done = r + 1
            took = time.perf_counter() - t0
            result["rounds"] = done
            result["raw_us"] = {s: {v: [[round(x * 1e6, 3) for x in rr["t"]] for rr in rs]
                                    for v, rs in by.items()} for s, by in raw.items()}
            stats = {s: {v: summarize(rs) for v, rs in by.items()} for s, by in raw.items()}
            result["stats_us"] = stats
            result["hints"] = hints_of(stats, sizes)
            path.write_text(json.dumps(result, default=str))
            elapsed = time.perf_counter() - started
            print(f"  round {done}: {took:.1f} s (total {elapsed:.1f} s)", flush=True)
            if elapsed + took > budget:
                print(f"  stopping after {done} rounds: the next would pass {budget:.0f} s",
                      flush=True)
                break
    finally:
        pool.close()
    stats = {s: {v: summarize(rs) for v, rs in by.items()} for s, by in raw.items()}
    report(stats, sizes)
    result["total_s"] = round(time.perf_counter() - started, 1)
    path.write_text(json.dumps(result, default=str))
    print(f"\nwritten {path} ({result['total_s']} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sys.exit(main())
