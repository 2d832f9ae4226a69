"""The plugin on a GPU, against hand-written CUDA-event loops on the same ranks.

One script, so that a lent GPU machine runs every check in one call:

1. ``bench``: ``nccl_group.bench("all_reduce", size)`` against a hand-written loop (a barrier,
   then CUDA events around each call) for a sweep of sizes, rounds alternating which goes
   first; the ratio of median times per size (goal 0.97..1.03) and the small-message latency.
2. ``ddp_step_timer``: DDP and FSDP2 steps of a small GPT-style model in bf16 against a bare
   loop of the same model, wrapper, batch and optimizer timed with CUDA events back to back;
   the ratio of medians (goal within 5%), peak memory, FLOPs per step and MFU.
3. ``dist_profiler``: three DDP steps profiled on every rank; the kernels and the NCCL
   metadata (``record_param_comms``) in the trace; our overlap and communication share; the
   rank traces opened with Holistic Trace Analysis (where installed) and its overlap beside
   ours.

Everything goes to stdout and, with ``--out DIR``, to ``DIR/gpu_check.json`` and the traces.
On a machine without a GPU it runs on gloo (a dry run of the script itself).

    python benchmarks/gpu_check.py --out /tmp/gpu            # every GPU, NCCL
    python benchmarks/gpu_check.py --ranks 2 --quick         # dry run on CPU (gloo)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

SIZES = ("8B", "64KiB", "1MiB", "16MiB", "256MiB")


# -- the model (built on the ranks) ----------------------------------------------------------
def gpt(layers: int = 6, width: int = 1024, heads: int = 16, vocab: int = 8192) -> Any:
    """A GPT-style decoder (pre-norm blocks in a ModuleList), bf16 on a GPU."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                    nn.Linear(4 * width, width))

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).unbind(2)
            y = nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.ff(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    model = GPT()
    return model.to(torch.bfloat16) if torch.cuda.is_available() else model


def gpt_small() -> Any:
    return gpt(layers=2, width=128, heads=4, vocab=512)


def tokens(rank: int, batch: int = 8, seq: int = 1024, vocab: int = 8192) -> Any:
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(rank))


def tokens_small(rank: int) -> Any:
    return tokens(rank, batch=4, seq=64, vocab=512)


def mean_loss(out: Any) -> Any:
    return out.float().mean()


# -- hand-written loops (run on the ranks) ---------------------------------------------------
def all_reduce_loop(count: int, warmup: int, iters: int) -> list[float]:
    """The loop a user writes: a barrier, then CUDA events (perf_counter on CPU) around each
    all_reduce; seconds per call on this rank."""
    import torch
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    tensor = torch.ones(max(count, 1), dtype=torch.float32, device="cuda" if cuda else "cpu")
    for _ in range(warmup):
        dist.all_reduce(tensor)
    out = []
    for _ in range(iters):
        dist.barrier()
        if cuda:
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
    return out


def bare_steps(spec: Any, synced: bool = False) -> list[float]:
    """``spec``'s step (same model, wrapper, batch, optimizer, loss) in a plain loop: one
    barrier, then back-to-back steps with a CUDA event (perf_counter on CPU) between them;
    ``synced``: each step from a barrier and an idle device, as the step timer starts one."""
    import itertools

    import torch.distributed as dist

    from pytest_distperf.rank.ddp import build

    built = build(dataclasses.replace(spec, comm_timing=False))
    for _ in range(spec.warmup):
        built.train_step()
    built.clock.synchronize()
    dist.barrier()
    times = []
    if synced:
        for _ in range(spec.steps):
            dist.barrier()
            built.clock.synchronize()
            start = built.clock.now()
            built.train_step()
            end = built.clock.now()
            built.clock.synchronize()
            times.append(built.clock.seconds(start, end))
    else:
        marks = [built.clock.now()]
        for _ in range(spec.steps):
            built.train_step()
            marks.append(built.clock.now())
        built.clock.synchronize()
        times = [built.clock.seconds(a, b) for a, b in itertools.pairwise(marks)]
    del built
    import gc

    gc.collect()
    return times


def environment() -> dict[str, Any]:
    """Versions and the device, as this rank sees them."""
    import torch
    import torch.distributed as dist

    info: dict[str, Any] = {"torch": torch.__version__, "backend": dist.get_backend(),
                            "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    sms=props.multi_processor_count, cuda=torch.version.cuda,
                    nccl=".".join(map(str, torch.cuda.nccl.version())))
    return info


# -- the checks (controller) -----------------------------------------------------------------
def slowest(per_rank: list[list[float]]) -> list[float]:
    return [max(col) for col in zip(*per_rank, strict=True)]


def check_bench(group: Any, sizes: tuple[str, ...], rounds: int, iters: int) -> list[dict]:
    from pytest_distperf.config import parse_size

    rows = []
    for label in sizes:
        nbytes = parse_size(label)
        ours: list[float] = []
        hand: list[float] = []
        for r in range(rounds):
            for kind in (("bench", "hand") if r % 2 == 0 else ("hand", "bench")):
                if kind == "bench":
                    res = group.bench("all_reduce", [nbytes], warmup=5, iters=iters,
                                      control=False)
                    ours += [t / 1e6 for t in res.rows[0].samples_us]
                else:
                    hand += slowest(group.run(all_reduce_loop, max(nbytes // 4, 1), 5, iters))
        row = {"size": label, "bytes": nbytes, "bench_us": statistics.median(ours) * 1e6,
               "hand_us": statistics.median(hand) * 1e6,
               "ratio": statistics.median(ours) / statistics.median(hand),
               "bench_p10_us": statistics.quantiles(ours, n=10)[0] * 1e6,
               "hand_p10_us": statistics.quantiles(hand, n=10)[0] * 1e6,
               "algbw_gbps": nbytes / statistics.median(ours) / 1e9}
        print(f"  all_reduce {label:>7}: bench {row['bench_us']:10.1f} us  hand-written "
              f"{row['hand_us']:10.1f} us  ratio {row['ratio']:.3f}  "
              f"(p10 {row['bench_p10_us']:.1f} / {row['hand_p10_us']:.1f} us)  "
              f"algbw {row['algbw_gbps']:.1f} GB/s", flush=True)
        rows.append(row)
    return rows


def check_steps(group: Any, model: tuple[Callable, Callable], rounds: int,
                steps: int) -> list[dict]:
    from pytest_distperf.fixtures.steptimer import DDPStepTimer
    from pytest_distperf.rank.ddp import StepSpec

    timer = DDPStepTimer(group)
    model_fn, batch_fn = model
    rows = []
    for wrapper in ("ddp", "fsdp"):
        kinds = ("ours", "bare", "bare_again") + (("ours_hook",) if wrapper == "ddp" else ())
        got: dict[str, list[float]] = {k: [] for k in kinds}
        timing = None
        spec = StepSpec(model_fn, batch_fn, steps=steps, warmup=3, loss_fn=mean_loss,
                        wrapper=wrapper)
        for r in range(rounds):
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                if kind.startswith("ours"):
                    this = timer(model_fn, batch_fn, steps=steps, warmup=3, loss_fn=mean_loss,
                                 wrapper=wrapper, comm_timing=True if kind == "ours_hook" else None)
                    got[kind] += list(this.samples["step_s"])
                    timing = this if kind == "ours" else timing
                else:
                    got[kind] += slowest(group.run(bare_steps, spec))
        assert timing is not None
        ours, bare = got["ours"], got["bare"]
        medians_ms = {k: round(statistics.median(v) * 1e3, 3) for k, v in got.items()}
        counts = {f"{c.op}": (c.calls, c.bytes) for c in timing.comm_counts}
        row = {"wrapper": wrapper, "step_ms": statistics.median(ours) * 1e3,
               "bare_ms": statistics.median(bare) * 1e3,
               "ratio": statistics.median(ours) / statistics.median(bare),
               "compute_ms": timing.compute_time_s * 1e3,
               "comm_overhead": timing.comm_overhead, "overlap": timing.overlap,
               "peak_memory_gib": max(p.peak_memory_bytes for p in timing.per_rank) / 2**30,
               "flops_per_step": timing.flops_per_step,
               "achieved_tflops": timing.achieved_flops / 1e12, "mfu": timing.mfu,
               "peak_tflops": timing.peak_flops / 1e12, "counts": counts,
               "buckets": timing.samples.get("buckets"), "medians_ms": medians_ms}
        print(f"  {wrapper}: medians {medians_ms}", flush=True)
        print(f"  {wrapper}: step {row['step_ms']:.3f} ms (bare loop {row['bare_ms']:.3f} ms, "
              f"ratio {row['ratio']:.3f}); compute {row['compute_ms']:.3f} ms; comm_overhead "
              f"{row['comm_overhead']:.3f}; peak memory {row['peak_memory_gib']:.2f} GiB; "
              f"{row['flops_per_step'] / 1e12:.3f} TFLOP/step, {row['achieved_tflops']:.1f} "
              f"TFLOP/s, MFU {row['mfu']} (peak {row['peak_tflops']:.0f}); counts {counts}",
              flush=True)
        rows.append(row)
    return rows


def build_ddp_state(model_fn: Callable, batch_fn: Callable) -> Callable[[], Any]:
    def setup() -> Any:
        import torch
        import torch.distributed as dist

        cuda = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu"
        model = torch.nn.parallel.DistributedDataParallel(
            model_fn().to(device), device_ids=[device] if cuda else None)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        return model, opt, batch_fn(dist.get_rank()).to(device)

    return setup


def train_step(state: Any) -> None:
    model, opt, batch = state
    opt.zero_grad(set_to_none=True)
    mean_loss(model(batch)).backward()
    opt.step()


def check_profile(group: Any, model: tuple[Callable, Callable], out: Path) -> dict:
    import gzip

    from pytest_distperf.fixtures.profiler import DistProfiler, rank_trace_dir

    prof = DistProfiler(group, trace_dir=out, nodeid="gpu_check.py::profile")
    prof.warmup = 2
    report = prof(train_step, setup=build_ddp_state(*model), steps=3)
    path = Path(report.trace_path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    events = json.loads(raw)["traceEvents"]
    cats: dict[str, int] = {}
    for e in events:
        cats[e.get("cat", "")] = cats.get(e.get("cat", ""), 0) + 1
    row = {"comm_source": report.comm_source, "overlap": report.overlap,
           "comm_overhead": report.comm_overhead, "wall_ms": report.wall_time_s * 1e3,
           "categories": cats,
           "record_param_comms": sum(e.get("name") == "record_param_comms" for e in events),
           "collectives": [(c.name, c.count, c.bytes) for c in report.collectives],
           "steps": len(report.steps), "trace": str(path)}
    print(f"  trace {path.name}: {len(events)} events, categories {cats}", flush=True)
    print(f"  comm source {row['comm_source']}; record_param_comms events "
          f"{row['record_param_comms']}; overlap {report.overlap:.3f}; comm_overhead "
          f"{report.comm_overhead:.3f}; collectives {row['collectives']}", flush=True)
    rank0 = json.loads((rank_trace_dir(path) / "rank0.trace.json").read_bytes())
    row["device_busy"] = device_busy(rank0["traceEvents"])
    print(f"  device busy per profiled step: {row['device_busy']}", flush=True)
    row["hta"] = hta_overlap(rank_trace_dir(path))
    row["launch"] = check_launch_bound(group, Path("/tmp/gpu-check-launch"))
    return row


def device_busy(events: list[dict]) -> list[float]:
    """Per ProfilerStep span (CPU side), the share of it some kernel, copy or memset ran."""
    work = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    shares = []
    for step in events:
        if step.get("cat") != "user_annotation" or not step.get("name", "").startswith(
                "ProfilerStep"):
            continue
        a, b = step["ts"], step["ts"] + step["dur"]
        busy, end = 0.0, a
        for start, stop in work:
            lo, hi = max(start, end), min(stop, b)
            if hi > lo:
                busy += hi - lo
                end = hi
        shares.append(round(busy / step["dur"], 3) if step["dur"] else 0.0)
    return shares


def mlp() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 256))


def check_launch_bound(group: Any, out: Path) -> dict:
    """The examples' MLP step profiled at a CPU-sized and a GPU-sized batch: how much of
    each step the device is busy (a launch-bound step times the host, not the device)."""
    from pytest_distperf.fixtures.profiler import DistProfiler, rank_trace_dir

    got = {}
    for rows in (256, 65536):
        def batch(rank: int, rows: int = rows) -> Any:
            import torch

            return torch.randn(rows, 256)

        prof = DistProfiler(group, trace_dir=out, nodeid=f"launch{rows}")
        prof.warmup = 2
        report = prof(train_step, setup=build_ddp_state(mlp, batch), steps=5)
        path = rank_trace_dir(Path(report.trace_path)) / "rank0.trace.json"
        got[rows] = device_busy(json.loads(path.read_bytes())["traceEvents"])
        print(f"  MLP step, batch {rows}: device busy per step {got[rows]}", flush=True)
    return got


def hta_overlap(folder: Path) -> dict:
    """Holistic Trace Analysis on the rank traces: the ranks it loaded, its overlap."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        print(f"  HTA not installed ({exc})")
        return {"error": f"not installed: {exc}"}
    try:
        analysis = TraceAnalysis(trace_dir=str(folder))
        ranks = sorted(analysis.t.traces)
        got: dict[str, Any] = {"ranks": ranks}
        try:
            overlap = analysis.get_comm_comp_overlap(visualize=False)
            got["comm_comp_overlap_pctg"] = overlap.to_dict(orient="records")
        except Exception as exc:  # CPU-only traces have no kernels to overlap
            got["overlap_error"] = repr(exc)
        try:
            breakdown = analysis.get_temporal_breakdown(visualize=False)
            got["temporal_breakdown"] = breakdown.to_dict(orient="records")
        except Exception as exc:
            got["breakdown_error"] = repr(exc)
        print(f"  HTA: {json.dumps(got, default=str)[:1500]}", flush=True)
        return got
    except Exception as exc:
        traceback.print_exc()
        return {"error": repr(exc)}


def check_finding(group: Any) -> dict:
    """The step timer on the examples' MLP at a CPU-sized and a GPU-sized batch: the
    device's busy share it reports and the findings it raises."""
    from pytest_distperf.fixtures.steptimer import DDPStepTimer

    timer = DDPStepTimer(group)
    got = {}
    for rows in (256, 65536):
        def batch(rank: int, rows: int = rows) -> Any:
            import torch

            return torch.randn(rows, 256)

        timing = timer(mlp, batch, steps=10, warmup=3)
        got[rows] = {"step_ms": timing.step_time_s * 1e3, "device_busy": timing.device_busy,
                     "findings": [b.kind for b in timing.bottlenecks],
                     "launch": [b.description for b in timing.bottlenecks
                                if b.kind == "launch_bound"]}
        print(f"  MLP, batch {rows}: {got[rows]}", flush=True)
    return got


def nvidia_smi() -> str:
    try:
        query = "name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu"
        return subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv"],
                              capture_output=True, text=True, timeout=20,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=0, help="default: every GPU (else 2)")
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--quick", action="store_true", help="small model, few rounds")
    parser.add_argument("--only", default="bench,steps,profile,finding")
    args = parser.parse_args(argv)

    import torch

    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.pool.launcher import RankPool

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus else "gloo"
    ranks = args.ranks or gpus or 2
    model = (gpt_small, tokens_small) if args.quick or not gpus else (gpt, tokens)
    rounds = 2 if args.quick else 8
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "ranks": ranks, "backend": backend, "nvidia_smi": nvidia_smi()}
    print(f"gpu_check: {ranks} ranks, {backend}\n{result['nvidia_smi']}", flush=True)
    pool = RankPool(ranks, backend, timeout_s=300)
    group = DistGroup(pool)
    checks: dict[str, Callable[[], Any]] = {
        "bench": lambda: check_bench(group, SIZES[:3] if args.quick else SIZES, rounds,
                                     10 if args.quick else 50),
        "steps": lambda: check_steps(group, model, rounds, 10 if args.quick else 20),
        "profile": lambda: check_profile(group, model, args.out),
        "finding": lambda: check_finding(group),
    }
    failed = 0
    try:
        result["environment"] = group.run(environment)[0]
        print(f"environment: {result['environment']}", flush=True)
        for name in args.only.split(","):
            print(f"\n== {name}", flush=True)
            t0 = time.perf_counter()
            try:
                result[name] = checks[name]()
            except Exception as exc:
                failed += 1
                traceback.print_exc()
                result[name] = {"error": repr(exc)}
            print(f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    finally:
        pool.close()
    (args.out / "gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwritten {args.out / 'gpu_check.json'}; {failed} checks failed")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
