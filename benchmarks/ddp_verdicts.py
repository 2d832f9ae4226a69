"""The gate on a real training step: does it see slowdowns and communication changes, and
does it false-alarm?

Runs pytest-distperf end to end, the way CI does: a throw-away project with one test that
times the training step of a small GPT-style transformer (token embedding, 2 pre-norm
encoder layers, a vocabulary head) under DDP on 2 real gloo ranks with ``ddp_step_timer``;
``--distperf-save`` once, then separate ``pytest --distperf`` compare runs, each a fresh
process with a fresh rank pool, in shuffled order:

* ``clean``: the same code as the baseline; any exact verdict other than unchanged is a
  false alarm (and so is a regressed timing);
* ``buckets``: ``bucket_cap_mb=0.25`` instead of DDP's default 25;
* ``unused``: ``find_unused_parameters=True``;
* ``barrier``: an extra ``dist.barrier()`` in every step (in the loss);
* ``larger10``, ``larger25``: the model 10% and 25% larger (parameters and gradient bytes):
  its feed-forward layers, half of its parameters, 20% and 50% wider;
* ``wider10``, ``wider25``: the feed-forward layers 10% and 25% wider (the model 5% and 12.5%
  larger; the changes of the earlier runs);
* ``slower10``, ``slower20``: the step 10% and 20% slower, by CPU work and nothing else:
  every rank runs float32 products (``MM_UNIT_SHAPE``) in the loss for 10% (20%) of the saved
  baseline's step, counted in host-speed control units (the saved step over its control,
  times how many units one control takes, measured in this process right after the save),
  so the work grows and shrinks with the host's speed as the model's own does and is 10%
  whatever speed the host ran at when it was sized; the same parameters, buckets and bytes
  (``flops_per_step`` does move: the products are FLOPs).  ``--slowdown spin`` spins an empty
  Python loop instead, sized from its rate (which moved 53-93 M/s from one moment to the
  next while the control moved by under 15%: R46's "10%" read +3.3%); ``--slowdown rows``
  makes them 10% and 20% more *model* compute (2 or 4 more rows of the 20-row batch through
  forward and backward), which moves this step by less (about half of it is communication);
* ``commslow10``, ``commslow20``: the communication slower by 10% (20%) of the saved step:
  a DDP comm hook (``comm_hook=``) runs the all-reduce and the same work (products; the
  loop under ``--slowdown spin``) before its future completes, as a compressing or a slower
  transport's hook would; compute, counts and bytes unchanged.  Caught when
  ``comm_overhead`` or ``step_time_s`` is regressed.

``--kind profile`` runs the same model's DDP step under ``dist_profiler`` (``setup`` builds
the DDP model, 3 profiled steps) instead: its exact metrics are ``profile.comm.<op>.calls``
and ``.bytes``; its timing figures are informational (one profiled call, no samples to test),
so the slowdowns are not run for it.

A communication change is *caught* when the run fails with an exact metric regressed; a
slowdown when ``step_time_s`` or ``compute_time_s`` (the same step without gradient
synchronisation, a metric of its own) is regressed.  For every
run it records the verdict of every metric, the explanation of the first exact regression,
and the wall time; the cost of the verdicts is a clean compare run's wall time against a run
with no baseline file (the same measurements, nothing to compare or confirm).

    python benchmarks/ddp_verdicts.py                      # 30 clean, 10 of each change
    python benchmarks/ddp_verdicts.py --clean 2 --changed 1   # a smoke run
    python benchmarks/ddp_verdicts.py --json runs.json     # keep every run's figures
                                                           # (the save first, kind "save")
    python benchmarks/ddp_verdicts.py --no-control         # step_time_s by the plain rule
    python benchmarks/ddp_verdicts.py --kind profile       # dist_profiler's exact counts

Results: benchmarks/ddp_verdicts.md.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

TEST_FILE = textwrap.dedent('''
    import os

    import torch
    import torch.distributed as dist

    VOCAB, DIM, SEQ, BATCH = 512, 128, 32, 20
    EXTRA_ROWS = int(os.environ.get("EQ_EXTRA_ROWS", "0"))
    SPIN = int(os.environ.get("EQ_SPIN", "0"))
    COMM_SPIN = int(os.environ.get("EQ_COMM_SPIN", "0"))
    # the spins count products of this (rows, inner, cols) shape, not loop iterations
    MM = [int(v) for v in os.environ.get("EQ_MM", "").split(",") if v]
    FF = int(4 * DIM * (1 + float(os.environ.get("EQ_WIDER", "0"))))
    BARRIER = os.environ.get("EQ_BARRIER") == "1"


    class TinyGPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, DIM)
            layer = torch.nn.TransformerEncoderLayer(DIM, 4, FF, dropout=0.0,
                                                     batch_first=True, norm_first=True)
            self.blocks = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(DIM, VOCAB)

        def forward(self, tokens):
            if EXTRA_ROWS:  # more compute, the same parameters and gradients
                tokens = torch.cat([tokens, tokens[:EXTRA_ROWS]])
            return self.head(self.blocks(self.embed(tokens)))


    def batch(rank):
        g = torch.Generator().manual_seed(rank)
        return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


    if MM:  # built once, as mm_product() in ddp_verdicts.py builds it
        _G = torch.Generator().manual_seed(1)
        _X, _W = torch.randn(MM[0], MM[1], generator=_G), torch.randn(MM[1], MM[2], generator=_G)
        _OUT = torch.empty(MM[0], MM[2])


    def spin(n):
        if MM:
            for _ in range(n):
                torch.mm(_X, _W, out=_OUT)
        else:
            for _ in range(n):
                pass


    def loss(logits):
        if BARRIER:
            dist.barrier()
        spin(SPIN)  # a slower step: CPU work that scales with the host's speed
        return logits.float().logsumexp(-1).mean()


    def ddp_kwargs():
        kwargs = {"bucket_cap_mb": float(os.environ.get("EQ_BUCKET_MB", "25"))}
        if os.environ.get("EQ_UNUSED") == "1":
            kwargs["find_unused_parameters"] = True
        return kwargs


    def slow_all_reduce(state, bucket):  # the default hook, then a slower completion
        buffer = bucket.buffer().div_(dist.get_world_size())
        fut = dist.all_reduce(buffer, async_op=True).get_future()

        def finish(f):
            spin(COMM_SPIN)
            return f.value()[0]

        return fut.then(finish)


    def test_gpt_step(ddp_step_timer):
        ddp_step_timer(TinyGPT, batch, steps=10, warmup=2, loss_fn=loss,
                       wrapper_kwargs=ddp_kwargs(), control=os.environ.get("EQ_CONTROL") != "0",
                       comm_hook=slow_all_reduce if COMM_SPIN else None)


    def build():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(TinyGPT(), **ddp_kwargs())
        return model, torch.optim.SGD(model.parameters(), lr=0.01), batch(dist.get_rank())


    def train_step(state):
        model, opt, tokens = state
        opt.zero_grad()
        loss(model(tokens)).backward()
        opt.step()


    def test_gpt_profile(dist_profiler):
        dist_profiler.warmup = 2  # DDP rebuilds its buckets in its second step: not profiled
        dist_profiler(train_step, setup=build, steps=3)
''')

CHANGES: dict[str, dict[str, str]] = {
    "clean": {},
    "buckets": {"EQ_BUCKET_MB": "0.25"},
    "unused": {"EQ_UNUSED": "1"},
    "barrier": {"EQ_BARRIER": "1"},
    "larger10": {"EQ_WIDER": "0.2"},  # the feed-forward layers are half the parameters
    "larger25": {"EQ_WIDER": "0.5"},
    "wider10": {"EQ_WIDER": "0.1"},
    "wider25": {"EQ_WIDER": "0.25"},
    "slower10": {"EQ_EXTRA_ROWS": "2"},  # --slowdown rows; spin: set after the save
    "slower20": {"EQ_EXTRA_ROWS": "4"},
    "commslow10": {},  # sized after the save
    "commslow20": {},
}
SLOWDOWNS = {"slower10": 0.10, "slower20": 0.20}
#: slower communication by this share of the saved step (sized after the save)
COMM_SLOWDOWNS = {"commslow10": 0.10, "commslow20": 0.20}


#: --slowdown matmul's unit of work: a (rows x inner) @ (inner x cols) float32 product.
MM_UNIT_SHAPE = (160, 128, 512)


def mm_units_per_control(rounds: int = 40) -> float:
    """How many of the matmul slowdown's units take as long as one host-speed control.

    The units are sized from the saved step *in control units* (its time over its control's):
    both are float32 matmuls, so this ratio holds whatever speed the host runs at (7.6-8.0
    products of MM_UNIT_SHAPE per control alone, beside a busy core and beside a memory-bound
    one: benchmarks/control_tracking.md), where the empty loop's rate moved from 53 to 93 M/s
    with the control within 15%.
    """
    import torch

    from pytest_distperf.rank.clock import control_kernel

    torch.set_num_threads(1)  # as every rank runs (threads_per_rank 1 on this host)
    product, control = mm_product(*MM_UNIT_SHAPE), control_kernel()
    ratios = []
    for i in range(rounds + 5):
        started = time.perf_counter()
        for _ in range(8):
            product()
        unit = (time.perf_counter() - started) / 8
        started = time.perf_counter()
        control()
        if i >= 5:  # warm-up
            ratios.append((time.perf_counter() - started) / unit)
    return statistics.median(ratios)


def saved_step_in_controls(project: Path, test: str) -> float:
    """The saved ``step_time_s`` in units of its host-speed control (the median control)."""
    (data,) = baseline_files(project).values()
    (env,) = data["tests"][test].values()
    step = env["metrics"]["step_time_s"]
    return float(step["estimate"]) / statistics.median(step["control"])


def loop_rate(rounds: int = 20, pause: float = 0.1) -> float:
    """Iterations per second of the empty Python loop the ``spin`` slowdown runs.

    The best of ``rounds`` timings spread over a couple of seconds: a slow moment only ever
    slows the loop, and one right after the save (its rank processes still exiting) once read
    50.6 M/s where the host ran 66-72 M/s, which sized R46's "10%" slowdowns at about 7%.
    """
    n, best = 2_000_000, float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(n):
            pass
        best = min(best, time.perf_counter() - started)
        time.sleep(pause)
    return n / best


def mm_product(rows: int, inner: int, cols: int) -> Callable[[], Any]:
    """One unit of the matmul slowdown: a (rows x inner) @ (inner x cols) float32 product
    into a preallocated output (fixed inputs, seeded)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, inner, generator=generator)
    w = torch.randn(inner, cols, generator=generator)
    out = torch.empty(rows, cols)
    return lambda: torch.mm(x, w, out=out)


def run_pytest(project: Path, env_extra: dict[str, str], *, save: bool = False,
               test: str = "test_gpt_step") -> dict[str, Any]:
    report = project / "report.json"
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--distperf",
           "--gpus", "2", "-o", "distperf_max_comm_overhead=1", "-o",
           "distperf_max_imbalance=1", "--distperf-json", str(report), f"test_eq.py::{test}"]
    if save:
        cmd.append("--distperf-save")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EQ_")}
    env.update(env_extra)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.monotonic() - started
    if not report.exists():
        raise SystemExit(f"pytest wrote no report (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (test,) = json.loads(report.read_text())["tests"]
    verdicts = {v["metric"]: v for v in test["verdicts"]}
    return {"exit": proc.returncode, "wall_s": wall, "verdicts": verdicts}


def summarise(kind: str, run: dict[str, Any]) -> dict[str, Any]:
    verdicts = run["verdicts"]
    exact = {m: v for m, v in verdicts.items() if v.get("kind") == "exact"}
    moved = {m: v["verdict"] for m, v in exact.items() if v["verdict"] != "unchanged"}
    regressed = [m for m, v in exact.items() if v["verdict"] == "regressed"]
    timing = {m: v["verdict"] for m, v in verdicts.items() if v.get("kind", "") == ""}
    first = exact[regressed[0]] if regressed else None
    step = verdicts.get("step_time_s", {})
    compute = verdicts.get("compute_time_s", {})
    if kind in SLOWDOWNS:  # the step, or its compute
        caught = "regressed" in (step.get("verdict"), compute.get("verdict"))
    elif kind in COMM_SLOWDOWNS:  # the communication's share, or the step
        caught = "regressed" in (verdicts.get("comm_overhead", {}).get("verdict"),
                                 step.get("verdict"))
    else:
        caught = bool(regressed) and run["exit"] == 1
    return {"kind": kind, "exit": run["exit"], "wall_s": round(run["wall_s"], 2),
            "exact_moved": moved, "caught": caught,
            "step": {k: step.get(k) for k in ("verdict", "change", "measurement_count",
                                              "host_change", "control_slope", "detail",
                                              "steal", "wait", "other_load", "measurements")},
            "compute": {k: compute.get(k) for k in ("verdict", "change", "measurement_count",
                                                    "host_change", "control_slope", "detail",
                                                    "measurements")},
            "details": {m: v.get("detail", "") for m, v in verdicts.items()
                        if v["verdict"] not in ("unchanged", "informational")},
            "timing": timing,
            "explanation": first["explanation"] if first else "",
            "step_explanation": verdicts.get("step_time_s", {}).get("explanation", ""),
            **{name: {k: verdicts.get(name, {}).get(k)
                      for k in ("verdict", "change", "measurement_count", "explanation",
                                "baseline", "current", "detail")}
               for name in ("comm_overhead", "imbalance")}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", type=int, default=30, help="clean compare runs")
    parser.add_argument("--changed", type=int, default=10, help="runs of each slowdown")
    parser.add_argument("--comm", type=int, default=5,
                        help="runs of each communication change")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every run's figures here")
    parser.add_argument("--no-control", action="store_true",
                        help="ddp_step_timer(control=False): step_time_s by the plain rule")
    parser.add_argument("--slowdown", choices=("matmul", "spin", "rows"), default="matmul",
                        help="matmul: the step 10%%/20%% slower by float32 products sized to "
                             "the saved step in host-speed control units (default); "
                             "spin: by a Python loop sized to the saved step from the loop's "
                             "rate; rows: 10%%/20%% more model compute")
    parser.add_argument("--kinds", default="",
                        help="comma-separated changes to run besides clean (default: all): "
                             + ", ".join(k for k in CHANGES if k != "clean"))
    parser.add_argument("--kind", choices=("ddp", "profile"), default="ddp",
                        help="ddp: ddp_step_timer (default); profile: dist_profiler's exact "
                             "counts (no slowdown runs: its timings are informational)")
    args = parser.parse_args(argv)
    if args.no_control and args.slowdown != "spin":
        parser.error(f"--slowdown {args.slowdown} sizes its slowdowns (rows: the communication "
                     "ones) in host-speed control units, which --no-control does not record: "
                     "add --slowdown spin")
    if args.no_control:
        for env in CHANGES.values():
            env["EQ_CONTROL"] = "0"
    test = "test_gpt_profile" if args.kind == "profile" else "test_gpt_step"
    if args.kind == "profile":
        args.changed = 0
    wanted = [k for k in args.kinds.split(",") if k] or [k for k in CHANGES if k != "clean"]
    unknown = sorted(set(wanted) - set(CHANGES))
    if unknown:
        parser.error(f"--kinds: unknown change(s) {', '.join(unknown)}")
    started = datetime.datetime.now(datetime.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="distperf-ddpv-") as tmp:
        project = Path(tmp)
        (project / "test_eq.py").write_text(TEST_FILE)
        spin_loop = args.kind == "ddp" and args.slowdown == "spin"
        rate_before = loop_rate() if spin_loop else 0.0
        print("baseline: no file yet (the cost reference) ...", flush=True)
        bare = [run_pytest(project, CHANGES["clean"], test=test)["wall_s"] for _ in range(2)]
        print("saving the baseline ...", flush=True)
        saved = run_pytest(project, CHANGES["clean"], save=True, test=test)
        if saved["exit"] != 0:
            raise SystemExit(f"the save failed: {saved}")
        rate = 0.0
        if args.kind == "ddp":
            step = saved["verdicts"]["step_time_s"]["current"]
            if spin_loop:  # the best of before the bare runs and after the save
                rate = max(rate_before, loop_rate())
            else:  # matmul units per second of the saved step: step x rate = its units
                rate = saved_step_in_controls(project, test) * mm_units_per_control() / step
            spins = {**({} if args.slowdown == "rows" else
                        {k: ("EQ_SPIN", extra) for k, extra in SLOWDOWNS.items()}),
                     **{k: ("EQ_COMM_SPIN", extra) for k, extra in COMM_SLOWDOWNS.items()}}
            mm = {} if spin_loop else {"EQ_MM": ",".join(map(str, MM_UNIT_SHAPE))}
            for kind, (var, extra) in spins.items():
                CHANGES[kind] = {**CHANGES["clean"], **mm,
                                 var: str(round(extra * step * rate))}
            print(f"saved step {step * 1e3:.1f} ms; "
                  f"{'matmul units' if mm else 'loop iterations'} per step: "
                  f"{ {k: CHANGES[k][v] for k, (v, _) in spins.items()} } "
                  f"({rate:.4g}/s)", flush=True)
        timed = {*SLOWDOWNS, *COMM_SLOWDOWNS}
        order = ["clean"] * args.clean + [
            k for k in wanted if k != "clean" and (args.kind == "ddp" or k not in timed)
            for _ in range(args.changed if k in timed else args.comm)]
        random.Random(args.seed).shuffle(order)
        # the save first (kind "save"), with every measurement's samples and controls, as
        # every compare run has them: a rule can be replayed on a block from its --json
        runs = [{**summarise("save", saved), "baseline_files": baseline_files(project),
                 "slowdown_rate": rate if args.kind == "ddp" else None}]
        for i, kind in enumerate(order, 1):
            run = summarise(kind, run_pytest(project, CHANGES[kind], test=test))
            runs.append(run)
            change, comm = run["step"]["change"], run["comm_overhead"]
            print(f"[{i}/{len(order)}] {kind:<10} exit {run['exit']}  {run['wall_s']:.1f} s  "
                  f"step_time_s {run['step']['verdict']} "
                  f"({_pct(change)}, "
                  f"{run['step']['measurement_count']} meas.)  compute_time_s "
                  f"{run['compute']['verdict']} ({_pct(run['compute']['change'])})"
                  f"  exact: {run['exact_moved'] or 'unchanged'}"
                  f"  comm_overhead {comm['verdict']} ({_pct(comm['change'])})"
                  f"  timing: {sorted(set(run['timing'].values()))}", flush=True)
    report(runs, bare, started, args)


def baseline_files(project: Path) -> dict[str, Any]:
    """The project's baseline files, parsed: a replay of the block needs the baseline as
    stored (noisy measurements left out), not the save's every measurement."""
    from pytest_distperf.verdict.store import load

    files = {p.name: load(p) for p in sorted((project / "perf_baselines").glob("*.toml"))}
    return {name: f.data for name, f in files.items() if f is not None}


def _pct(change: float | None) -> str:
    return "-" if change is None else f"{change:+.1%}"


def report(runs: list[dict[str, Any]], bare: list[float], started: datetime.datetime,
           args: argparse.Namespace) -> None:
    print(f"\n{started:%Y-%m-%d}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, python {platform.python_version()}, --kind {args.kind}, "
          f"--slowdown {args.slowdown}")
    print("caught: step_time_s or compute_time_s regressed (slowdowns), comm_overhead or "
          "step_time_s regressed (commslow), "
          "an exact metric regressed (the rest); timing regr/inconcl: any measured metric")
    print(f"{'kind':<11} {'runs':>4} {'caught':>7} {'exact moved':>12} {'timing regr':>12} "
          f"{'timing inconcl':>15} {'median wall':>12}")
    for kind in CHANGES:
        mine = [r for r in runs if r["kind"] == kind]
        if not mine:
            continue
        caught = sum(r["caught"] for r in mine)
        moved = sum(bool(r["exact_moved"]) for r in mine)
        regr = sum("regressed" in r["timing"].values() for r in mine)
        inconcl = sum("inconclusive" in r["timing"].values() for r in mine)
        wall = statistics.median(r["wall_s"] for r in mine)
        print(f"{kind:<11} {len(mine):>4} {caught:>7} {moved:>12} {regr:>12} {inconcl:>15} "
              f"{wall:>10.1f} s")
    clean = [r["wall_s"] for r in runs if r["kind"] == "clean"]
    if clean:
        print(f"cost: a clean compare run {statistics.median(clean):.1f} s against "
              f"{statistics.median(bare):.1f} s with no baseline file "
              f"({statistics.median(clean) / statistics.median(bare):.2f}x)")
    for kind in CHANGES:
        example = next((r for r in runs if r["kind"] == kind and r["explanation"]), None)
        if example:
            print(f"  {kind}: {example['explanation']}")
    if args.json:
        args.json.write_text(json.dumps({"bare_s": bare, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
