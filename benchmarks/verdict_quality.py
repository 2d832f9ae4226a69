"""How good are the baseline verdicts on this machine?  False alarms and detection power.

Runs pytest-distperf end to end, the way CI does: a throw-away project with one test that
times a CPU matmul loop on 2 real gloo ranks (``nccl_group.measure``), ``--distperf-save``
once per block, then many separate ``pytest --distperf`` compare runs, each a fresh process
with a fresh rank pool, in shuffled order.  The test measures the loop twice, as two metrics
judged in the same run: ``matmul`` with the host-speed control (the default) and ``plain``
without it (``control=False``), so that both rules meet the same host.  The runs:

* clean runs (the same work as the baseline): any "regressed" is a false alarm;
* runs with 10% and 20% more matmuls (extra *work*, proportional to the base, not a sleep):
  "regressed" is a catch, anything else a miss.

For every run and metric it records the verdict, the change, the confidence, the number of
measurements (1 + confirmations), the noise probe's figures for the measurement reported
(host steal, CPU wait of the ranks, sample spread), how much slower the host-speed control
ran than at the save, and the host steal over the whole run from /proc/stat.

    python benchmarks/verdict_quality.py                     # 2 blocks: 30 clean, 10+10 slow
    python benchmarks/verdict_quality.py --blocks 1 --clean 2 --slow 1   # a smoke run
    python benchmarks/verdict_quality.py --json runs.json    # keep every run's figures
    python benchmarks/verdict_quality.py --hog 0.3           # with a noisy neighbour
    python benchmarks/verdict_quality.py --no-plain          # the controlled metric only
    python benchmarks/verdict_quality.py --kind bench        # bench()'s bus bandwidth
    python benchmarks/verdict_quality.py --kind micro --slow 0   # micro-work, unchanged
    python benchmarks/verdict_quality.py --kind ddp          # a GPT step (ddp_verdicts.py)
    python benchmarks/verdict_quality.py --kind profile      # its profile's exact counts

Results and method: benchmarks/verdict_quality.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

TEST_FILE = textwrap.dedent('''
    import os

    import torch

    BASE_REPS = int(os.environ.get("VQ_REPS", "60"))
    EXTRA = float(os.environ.get("VQ_EXTRA", "0"))
    N = 256


    def matmuls(a, b, reps):
        for _ in range(reps):
            a @ b


    def test_matmul(nccl_group):
        torch.manual_seed(0)
        a, b = torch.randn(N, N), torch.randn(N, N)
        reps = round(BASE_REPS * (1 + EXTRA))
        nccl_group.measure("matmul", matmuls, a, b, reps)
        if os.environ.get("VQ_PLAIN") == "1":
            nccl_group.measure("plain", matmuls, a, b, reps, control=False)
''')

#: ``--kind bench``: a 4 MiB all-reduce benchmarked with ``nccl_group.bench`` (bus
#: bandwidth, higher is better), with the control (the default) and, as ``#2``, without it.
#: A slow run makes every all-reduce VQ_EXTRA longer than it took: each rank, after the
#: call, spins for VQ_EXTRA of the call's own time (a proportional slowdown of the timed
#: call, whatever the host's speed; R17 sent VQ_EXTRA of the buffer once more instead,
#: which cost 30-45%, not 10-20%).  The slowdown is installed by BENCH_HOOK, a
#: ``sitecustomize`` on the ranks' path, so that every rank process has it from its start:
#: the session's pool and the fresh ranks a re-measurement runs on (until R24 the test
#: installed it with ``nccl_group.run``, on the session's ranks only).
BENCH_FILE = textwrap.dedent('''
    import os


    def test_bench(nccl_group):
        nccl_group.bench("all_reduce", ["4MiB"])
        if os.environ.get("VQ_PLAIN") == "1":
            nccl_group.bench("all_reduce", ["4MiB"], control=False)
''')
BENCH_HOOK = textwrap.dedent('''
    import os

    EXTRA = float(os.environ.get("VQ_EXTRA", "0"))
    if EXTRA:
        import time

        import torch.distributed as dist

        ORIGINAL = dist.all_reduce

        def longer(*args, **kwargs):
            start = time.perf_counter()
            out = ORIGINAL(*args, **kwargs)
            took = time.perf_counter() - start
            end = time.perf_counter() + took * EXTRA
            while time.perf_counter() < end:
                pass
            return out

        dist.all_reduce = longer  # in every process started with this on its path
''')

#: ``--kind micro``: three pieces of micro-work (30 us to 1 ms) in one test, each timed by
#: ``measure()`` with the control: a pure-Python sum, a small matmul loop, a 64 KiB gloo
#: all-reduce.  A slow run does VQ_EXTRA more of each (the all-reduce: spins for VQ_EXTRA of
#: its own time after each call, as BENCH_HOOK does).
MICRO_FILE = textwrap.dedent('''
    import os
    import time

    import torch
    import torch.distributed as dist

    EXTRA = float(os.environ.get("VQ_EXTRA", "0"))


    def python_sum(n):
        return sum(range(n))


    def matmuls(a, reps):
        for _ in range(reps):
            a @ a


    def all_reduce(buffer):
        start = time.perf_counter()
        dist.all_reduce(buffer)
        end = time.perf_counter() + (time.perf_counter() - start) * EXTRA
        while time.perf_counter() < end:
            pass


    def test_micro(nccl_group):
        nccl_group.measure("py", python_sum, round(5000 * (1 + EXTRA)))
        torch.manual_seed(0)
        nccl_group.measure("mm", matmuls, torch.randn(64, 64), round(10 * (1 + EXTRA)))
        nccl_group.measure("ar", all_reduce, torch.zeros(16 * 1024))
''')

STEAL_COLUMN = 7


def cpu_line() -> list[int]:
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def steal_between(before: list[int], after: list[int]) -> float:
    deltas = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(deltas[:8])
    return deltas[STEAL_COLUMN] / total if total > 0 else 0.0


def busy_between(before: list[int], after: list[int]) -> float:
    """Share of all CPU time that was not idle (anyone's work, ours included)."""
    deltas = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(deltas[:8])
    return (total - deltas[3] - deltas[4] - deltas[STEAL_COLUMN]) / total if total else 0.0


HOG = textwrap.dedent('''
    import random, sys, time
    duty, seed = float(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    while True:  # bursts of busy CPU (0.1-2 s) with idle gaps, busy `duty` of the time
        burst = rng.uniform(0.1, 2.0)
        end = time.monotonic() + burst
        while time.monotonic() < end:
            pass
        time.sleep(burst * (1 - duty) / duty)
''')


METRICS = ("matmul.time_s", "plain.time_s")
KINDS = {"measure": (TEST_FILE, METRICS),
         "bench": (BENCH_FILE, ("all_reduce.4MiB.busbw_gbps", "all_reduce.4MiB.busbw_gbps#2")),
         "micro": (MICRO_FILE, ("py.time_s", "mm.time_s", "ar.time_s"))}
#: kinds whose second metric is the first without the control (``--no-plain`` drops it)
PLAIN_PAIRS = ("measure", "bench")
KIND = "measure"
#: ``sitecustomize`` modules of a kind (see BENCH_HOOK), put on the path of every process
HOOKS = {"bench": BENCH_HOOK}
HOOK = ""
FIELDS = ("verdict", "baseline", "current", "change", "confidence", "measurement_count", "steal",
          "wait", "other_load", "spread", "host_change", "control_slope", "detail",
          "measurements")  # every measurement's samples and controls: to judge again


def run_pytest(project: Path, extra: float, save: bool, reps: int,
               plain: bool) -> dict[str, Any]:
    report = project / "report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark",
           "-p", "no:hypothesispytest", "-q", "--distperf",
           "--gpus", "2", "--distperf-json", str(report), "test_vq.py"]
    if save:
        cmd.append("--distperf-save")
    env = dict(os.environ, VQ_EXTRA=str(extra), VQ_REPS=str(reps), VQ_PLAIN=str(int(plain)))
    if (project / "hook").is_dir():  # every process, the ranks' included, starts with it
        env["PYTHONPATH"] = os.pathsep.join(
            [str(project / "hook"), *filter(None, [os.environ.get("PYTHONPATH")])])
    before, started = cpu_line(), time.monotonic()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True,
                          check=False)
    seconds, after = time.monotonic() - started, cpu_line()
    out: dict[str, Any] = {
        "extra": extra, "save": save, "rc": proc.returncode, "seconds": round(seconds, 1),
        "run_steal": round(steal_between(before, after), 4),
        "run_busy": round(busy_between(before, after), 4),
    }
    try:
        data = json.loads(report.read_text())
        verdicts = {v["metric"]: v for v in data["tests"][0]["verdicts"]}
        for name in METRICS[: 2 if plain else 1] if KIND in PLAIN_PAIRS else METRICS:
            out[name] = {k: verdicts[name].get(k) for k in FIELDS}
    except (OSError, ValueError, KeyError, IndexError):
        out["error"] = proc.stdout[-3000:] + proc.stderr[-2000:]
    if save:  # what the compare runs are judged against (noisy measurements left out)
        out["baseline_files"] = ddp_verdicts().baseline_files(project)
    return out


def pct(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value * 100:.{digits}f}%"


def describe(run: dict[str, Any]) -> str:
    parts = [f"+{run['extra']:.0%} work  {run['seconds']:.0f}s  steal(run) "
             f"{pct(run['run_steal'])}"]
    for name in METRICS:
        v = run.get(name)
        if v is None:
            continue
        current = v.get("current")
        shown = ("-" if current is None else f"{current:.3f} GB/s" if "busbw" in name
                 else f"{current * 1e3:.2f} ms")
        parts.append(
            f"  {name.split('.')[0]:<6} {v.get('verdict', '?'):<12} "
            f"change {pct(v.get('change')):>7} conf {pct(v.get('confidence'), 2):>7} "
            f"current {shown:>9} "
            f"meas {v.get('measurement_count') or '-'} host {pct(v.get('host_change')):>6} "
            f"steal {pct(v.get('steal'))} wait {pct(v.get('wait'))} "
            f"other {pct(v.get('other_load'))} spread {pct(v.get('spread'))}")
    return "".join(parts)


def summarize(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    compares = [r for r in runs if not r["save"] and not r.get("bare")]
    for name in METRICS:
        judged = [r for r in compares if name in r]
        if not judged:
            continue
        rule = ("plain rule (no control)" if KIND in PLAIN_PAIRS and name == METRICS[1]
                else "with the host-speed control")
        lines.append(f"{name} ({rule}):")
        for extra in sorted({r["extra"] for r in judged}):
            group = [r[name] for r in judged if r["extra"] == extra]
            counts: dict[str, int] = {}
            for v in group:
                counts[v.get("verdict", "error")] = counts.get(v.get("verdict", "error"), 0) + 1
            label = "clean" if extra == 0 else f"+{extra:.0%} work"
            caught = counts.get("regressed", 0)
            headline = (f"false alarms {caught}/{len(group)}" if extra == 0
                        else f"caught {caught}/{len(group)}")
            changes = [v["change"] for v in group if v.get("change") is not None]
            lines.append(f"  {label:>10}: {headline}; verdicts "
                         + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                         + (f"; change median {statistics.median(changes):+.1%}, range "
                            f"{min(changes):+.1%} to {max(changes):+.1%}" if changes else ""))
        noisy = [r for r in judged if r[name].get("verdict") == "inconclusive"]
        lines.append(f"  inconclusive: {len(noisy)}/{len(judged)} compare runs")
        lines += ceiling(name, judged)
    errors = [r for r in compares if "error" in r]
    steals = [r["run_steal"] for r in compares]
    waits = [r[METRICS[0]]["wait"] for r in compares
             if r.get(METRICS[0], {}).get("wait") is not None]
    others = [r[METRICS[0]]["other_load"] for r in compares
              if r.get(METRICS[0], {}).get("other_load") is not None]
    hosts = [r[METRICS[0]]["host_change"] for r in compares
             if r.get(METRICS[0], {}).get("host_change") is not None]
    if steals:
        lines.append(f"host steal over the runs: median {statistics.median(steals):.1%}, max "
                     f"{max(steals):.1%}" + (f"; CPU wait of the ranks: median "
                                             f"{statistics.median(waits):.1%}, max "
                                             f"{max(waits):.1%}" if waits else "")
                     + (f"; other processes' load: median {statistics.median(others):.1%}, "
                        f"max {max(others):.1%}" if others else ""))
    if hosts:
        lines.append(f"host-speed control vs the baseline's: median "
                     f"{statistics.median(hosts):+.1%}, range {min(hosts):+.1%} to "
                     f"{max(hosts):+.1%}")
    bare = [r["seconds"] for r in runs if r.get("bare")]
    clean = [r["seconds"] for r in compares if r["extra"] == 0]
    if bare and clean:
        lines.append(f"cost: a clean compare run {statistics.median(clean):.1f} s (median) "
                     f"against {statistics.median(bare):.1f} s with no baseline file "
                     f"({statistics.median(clean) / statistics.median(bare):.2f}x)")
    if errors:
        lines.append(f"errors: {len(errors)} runs (see --json)")
    return lines


def ceiling(name: str, judged: list[dict[str, Any]]) -> list[str]:
    """What any threshold on the reported changes could have done: the best one that raises
    no false alarm (just above the worst clean change) and the slowed runs past it.  When
    that falls short of a goal, the measurement did not separate clean from slowed on this
    day, and no decision rule on these figures could meet it (an optimistic figure: the
    threshold is chosen after the fact, knowing every clean run)."""
    sign = -1.0 if "busbw" in name else 1.0  # a bandwidth's regression is a negative change

    def worse(r: dict[str, Any]) -> float | None:
        change = r[name].get("change")
        return None if change is None else sign * change

    clean = [w for r in judged if r["extra"] == 0 and (w := worse(r)) is not None]
    if not clean:
        return []
    line = max(clean)
    parts = []
    for extra in sorted({r["extra"] for r in judged} - {0.0}):
        slowed = [worse(r) for r in judged if r["extra"] == extra]
        parts.append(f"+{extra:.0%} {sum(w is not None and w > line for w in slowed)}/"
                     f"{len(slowed)}")
    return [f"  best threshold after the fact (the worst clean change, {sign * line:+.1%}): "
            f"caught {', '.join(parts)}"] if parts else []


#: The kinds measured on a real training step, with the communication changes of a real
#: model: benchmarks/ddp_verdicts.py runs them (its own options: --clean, --changed, --comm).
STEP_KINDS = ("ddp", "profile")


def ddp_verdicts() -> Any:
    """benchmarks/ddp_verdicts.py as a module: it runs the kinds of STEP_KINDS, and its
    ``baseline_files`` serves both benchmarks."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "ddp_verdicts", Path(__file__).with_name("ddp_verdicts.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--kind", default="measure")
    if first.parse_known_args(argv)[0].kind in STEP_KINDS:
        ddp_verdicts().main(argv)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=2,
                        help="blocks, each: save a baseline, then its compare runs (default 2)")
    parser.add_argument("--clean", type=int, default=15, help="clean runs per block")
    parser.add_argument("--slow", type=int, default=5,
                        help="runs per block at +10%% and, as many, at +20%% work")
    parser.add_argument("--reps", type=int, default=60,
                        help="matmuls (256x256) per timed iteration (default 60: ~22 ms)")
    parser.add_argument("--save-attempts", type=int, default=3,
                        help="re-save while the saved baseline is flagged noisy (default 3)")
    parser.add_argument("--save-pause", type=float, default=20.0,
                        help="seconds to wait before re-saving a noisy baseline")
    parser.add_argument("--bare", type=int, default=2,
                        help="runs with no baseline file first, the cost reference (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hog", type=float, default=0.0, metavar="DUTY",
                        help="also run a noisy neighbour: one process that keeps a CPU busy "
                             "this share of the time, in random bursts (default 0: none)")
    parser.add_argument("--no-plain", action="store_true",
                        help="measure only the metric with the host-speed control")
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--kind", choices=sorted(KINDS) + list(STEP_KINDS), default="measure",
                        help="measure: a matmul loop timed by measure() (default); bench: a "
                             "4 MiB all-reduce's bus bandwidth from bench(); ddp: a GPT "
                             "step's step_time_s, comm_overhead and exact counts from "
                             "ddp_step_timer; profile: the same step's exact counts from "
                             "dist_profiler (the last two run benchmarks/ddp_verdicts.py); "
                             "micro: three pieces of micro-work (30 us to 1 ms) by measure()")
    args = parser.parse_args(argv)
    global TEST_FILE, METRICS, HOOK, KIND
    TEST_FILE, METRICS = KINDS[args.kind]
    KIND = args.kind
    HOOK = HOOKS.get(args.kind, "")

    rng = random.Random(args.seed)
    started = datetime.datetime.now().astimezone()
    runs: list[dict[str, Any]] = []
    print(f"verdict_quality: {started:%Y-%m-%d %H:%M %Z}, {platform.node()}, "
          f"{os.cpu_count()} CPUs, python {platform.python_version()}", flush=True)
    hog = None
    if args.hog > 0:
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(args.hog), str(args.seed)])
        print(f"noisy neighbour: pid {hog.pid}, busy {args.hog:.0%} of the time", flush=True)
    try:
        run_all(args, rng, runs)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    finished = datetime.datetime.now().astimezone()
    print(f"--- summary ({(finished - started).total_seconds() / 60:.1f} min)")
    for line in summarize(runs):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"started": started.isoformat(),
                                         "finished": finished.isoformat(),
                                         "hog": args.hog, "runs": runs}, indent=1))
    return 0


def run_all(args: argparse.Namespace, rng: random.Random, runs: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory(prefix="distperf-vq-") as tmp:
        project = Path(tmp)
        (project / "test_vq.py").write_text(TEST_FILE)
        if HOOK:
            (project / "hook").mkdir()
            (project / "hook" / "sitecustomize.py").write_text(HOOK)
        (project / "conftest.py").write_text("")
        # The cost reference: the same test with no baseline file yet (nothing to judge, no
        # re-measurement), against which a clean compare run's time is set.
        for _ in range(args.bare):
            bare = run_pytest(project, 0.0, False, args.reps, not args.no_plain)
            bare["bare"] = True
            runs.append(bare)
            print(f"no baseline yet (the cost reference): {bare['seconds']:.1f} s", flush=True)
        for block in range(args.blocks):
            # As the plugin advises: a baseline saved from a noisy measurement is re-saved
            # (after a pause) on a quieter machine, at most --save-attempts times.
            for attempt in range(1, args.save_attempts + 1):
                saved = run_pytest(project, 0.0, True, args.reps, not args.no_plain)
                saved["block"], saved["attempt"] = block + 1, attempt
                runs.append(saved)
                if "error" in saved:
                    print(saved["error"], flush=True)
                    raise SystemExit(f"block {block + 1}: the save failed")
                metrics = [saved[n] for n in METRICS if n in saved]
                print(f"block {block + 1}: saved baseline (attempt {attempt}) "
                      + "; ".join(f"{m.get('current') or 0:.4g} ({m.get('detail')}, "
                                  f"CPU wait {pct(m.get('wait'))}, other load "
                                  f"{pct(m.get('other_load'))})" for m in metrics)
                      + f"; steal(run) {saved['run_steal']:.1%}", flush=True)
                if not any("saved from a noisy measurement" in str(m.get("detail"))
                           for m in metrics):
                    break
                time.sleep(args.save_pause)
            order = [0.0] * args.clean + [0.1] * args.slow + [0.2] * args.slow
            rng.shuffle(order)
            for extra in order:
                run = run_pytest(project, extra, False, args.reps, not args.no_plain)
                run["block"] = block + 1
                runs.append(run)
                print(describe(run), flush=True)
                if "error" in run:
                    print(run["error"], flush=True)


if __name__ == "__main__":
    sys.exit(main())
