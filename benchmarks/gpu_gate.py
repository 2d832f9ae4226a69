"""Issue 47's proof on a GPU, as one script of under 6 minutes: the gate on a real GPT.

1. A throw-away project with one test: ``ddp_step_timer`` on a GPT-2-small-class model from a
   public repository (``--gpt``: nanoGPT's ``model.py``, which is not committed here) under
   bf16 autocast with fused AdamW; the step and its changes are
   ``benchmarks/gpu_gate_step.py``.
2. ``--distperf-save`` once, then ``--unchanged`` compares of the same code (each a fresh
   pytest process; any regressed verdict is a false alarm), then one compare per change: the
   model about 10% larger, one more all-reduce per step, a ``.item()`` per step, and every
   block's output kept until the next step (more peak memory, the same FLOPs).  Each change
   must be caught with its own cause (:data:`CAUSES`).
3. The step timer against a hand-written back-to-back loop of the same step (CUDA events
   between steps, one synchronize at the end), rounds alternating the order, with an A/A.
4. The runner check (``pytest --pyargs pytest_distperf.doctor``), full where the budget allows,
   else quick: its floor for the DDP step.
5. Everything to ``OUT/gpu_gate.json``, and a Markdown fragment for ``benchmarks/gpu.md`` to
   ``OUT/gpu_gate.md``.

The thresholds (``max_comm_overhead``, ``max_imbalance``) are set out of the way: what is
proved is the baseline verdicts.  Each step is cut to what is left of ``--budget``; an
unchanged compare runs only while the changes and the hand loop still fit after it.

    python benchmarks/gpu_gate.py --gpt .gate/model.py --out "$OUT"   # a GPU
    python benchmarks/gpu_gate.py --standin                                   # CPU smoke

``--standin`` is the CPU smoke run: 2 gloo ranks, a tiny stand-in model
(``benchmarks/gpu_gate_standin.py``), 2 unchanged compares.  It runs the script end to end
and proves nothing about a GPU; launches, host syncs and peak device memory are measured on
CUDA only, so its table says "not on this device" for them.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# this tree's pytest_distperf, in this process and its ranks as in the pytest runs
sys.path[:0] = [str(ROOT), str(HERE)]

from gpu_check import environment, nvidia_smi, slowest  # noqa: E402  (benchmarks/ is no package)

#: GPT-2 small (124M parameters, nanoGPT's vocabulary padded to 50304), 16 x 1024 tokens.
GPT2_SMALL = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 50304, "seq": 1024,
              "batch": 16, "steps": 20, "warmup": 3, "control": True}
#: The stand-in of the CPU smoke run; without the host-speed control, which would re-measure
#: on fresh ranks and take minutes.
STANDIN = {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 512, "seq": 64,
           "batch": 4, "steps": 6, "warmup": 1, "control": False}
CHANGES = ("larger", "collective", "item", "kept")
#: How much larger the ``larger`` change makes the model (in parameters, by whole layers).
LARGER = 0.10
#: Each change's cause, as the gate must name it.
CAUSES = {
    "larger": "flops_per_step and comm bytes regressed",
    "collective": "comm.all_reduce.calls regressed",
    "item": "device.syncs regressed, with a device.syncs.<op> naming aten::item",
    "kept": "peak_memory_bytes regressed, flops_per_step unchanged",
}
#: Columns of the table: (heading, which metrics, measured on CUDA only).
COLUMNS: tuple[tuple[str, Callable[[str], bool], bool], ...] = (
    ("step_time_s", lambda m: m == "step_time_s", False),
    ("device.launches", lambda m: m == "device.launches", True),
    ("device.syncs", lambda m: m == "device.syncs" or m.startswith("device.syncs."), True),
    ("peak_memory_bytes", lambda m: m == "peak_memory_bytes", True),
    ("comm.*.calls", lambda m: m.startswith("comm.") and m.endswith(".calls"), False),
    ("comm.*.bytes", lambda m: m.startswith("comm.") and m.endswith(".bytes"), False),
    ("flops_per_step", lambda m: m == "flops_per_step", False),
)
NOT_HERE = "not on this device"
#: Seconds the runner check needs, full and quick (a GPU took 55-63 s in all, full).
DOCTOR_S = {"full": 90.0, "quick": 35.0}
TEST_FILE = textwrap.dedent('''
    import json
    import os

    from gate_step import make_step

    SHAPE = json.loads(os.environ["GATE_SHAPE"])
    STEP = make_step(SHAPE, os.environ.get("GATE_CHANGE", ""))


    def test_gpt_step(ddp_step_timer):
        ddp_step_timer(**STEP, steps=SHAPE["steps"], warmup=SHAPE["warmup"],
                       control=SHAPE["control"])
''')


class Budget:
    """Wall-clock seconds for the whole script."""

    def __init__(self, seconds: float) -> None:
        self.started = time.monotonic()
        self.seconds = seconds

    def spent(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.seconds - self.spent()


# -- the project and its pytest runs (controller) ---------------------------------------------
def make_project(folder: Path, model_file: Path) -> None:
    shutil.copyfile(model_file, folder / "gate_gpt.py")
    shutil.copyfile(HERE / "gpu_gate_step.py", folder / "gate_step.py")
    (folder / "test_gate.py").write_text(TEST_FILE)
    (folder / "pytest.ini").write_text("[pytest]\n")  # the project is its own rootdir


def plugin_args() -> list[str]:
    """``-p pytest_distperf.plugin`` where its entry point is not installed."""
    import importlib.metadata as md

    installed = any(e.name == "distperf" for e in md.entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_distperf.plugin"]


def child_env(shape: dict[str, Any], change: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["GATE_SHAPE"] = json.dumps(shape)
    if change:
        env["GATE_CHANGE"] = change
    return env


def run_pytest(project: Path, args: list[str], env: dict[str, str], timeout: float,
               report: Path) -> dict[str, Any]:
    """One fresh pytest process; its exit status (None: stopped at ``timeout``), wall time,
    output's end and JSON report."""
    report.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", *plugin_args(), "-p", "no:cacheprovider", "-q",
           "--distperf-json", str(report), *args]
    started = time.monotonic()
    # its own process group: stopped at the budget, its rank processes go with it
    proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    stopped = False
    try:
        out, _ = proc.communicate(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        stopped = True
        out = stop(proc) + f"\n[stopped at the budget: {timeout:.0f} s]"
    try:
        data = json.loads(report.read_text()) if report.exists() else {}
    except (OSError, ValueError) as exc:  # a run stopped while writing it
        data, out = {}, f"{out}\n[its JSON report could not be read: {exc}]"
    return {"exit": None if stopped else proc.returncode,
            "wall_s": round(time.monotonic() - started, 1), "tail": out[-3000:], "report": data}


def stop(proc: subprocess.Popen[str]) -> str:
    """Interrupt ``proc``'s group (pytest closes its ranks), then kill what is left; its
    output."""
    for sig, wait in ((signal.SIGINT, 15.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.communicate(timeout=wait)[0] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


def gate_run(project: Path, name: str, kind: str, change: str, shape: dict[str, Any],
             ranks: int, timeout: float) -> dict[str, Any]:
    """The test saved (``kind`` "save") or compared, with ``change``: each metric's verdict."""
    args = ["--distperf", "--gpus", str(ranks), "-o", "distperf_max_comm_overhead=1",
            "-o", "distperf_max_imbalance=1", "test_gate.py"]
    if kind == "save":
        args.append("--distperf-save")
    got = run_pytest(project, args, child_env(shape, change), timeout, project / "report.json")
    tests = got.pop("report").get("tests", [])
    verdicts = {v["metric"]: {k: v.get(k) for k in ("verdict", "kind", "baseline", "current",
                                                     "change", "measurement_count", "detail",
                                                     "explanation")}
                for t in tests for v in t.get("verdicts", [])}
    return {"run": name, "kind": kind, "change": change, **got, "verdicts": verdicts}


# -- reading the verdicts ---------------------------------------------------------------------
def regressed(run: dict[str, Any]) -> list[str]:
    return [m for m, v in run["verdicts"].items() if v["verdict"] == "regressed"]


def verdict_of(run: dict[str, Any], metric: str) -> str | None:
    found = run["verdicts"].get(metric)
    return found["verdict"] if found else None


def cell(run: dict[str, Any], which: Callable[[str], bool], cuda_only: bool, cuda: bool) -> str:
    """One column's verdicts in a run: one word where they agree, else each moved metric."""
    mine: dict[str, str] = {m: v["verdict"] for m, v in run["verdicts"].items() if which(m)}
    if not mine:
        return NOT_HERE if cuda_only and not cuda else "-"
    words = set(mine.values())
    if len(words) == 1 and (len(mine) == 1 or words <= {"unchanged", "saved"}):
        return words.pop()
    moved = [f"{m} {v}" for m, v in sorted(mine.items()) if v not in ("unchanged", "saved")]
    return "; ".join(moved) + ("; the rest unchanged" if len(moved) < len(mine) else "")


def cause(change: str, run: dict[str, Any], cuda: bool) -> tuple[str, str]:
    """(``caught``, ``missed`` or ``not on this device``, the cause's sentence)."""
    v = run["verdicts"]
    if not v:
        return "missed", f"no verdicts (exit {run['exit']})"
    if change in ("item", "kept") and not cuda:
        return NOT_HERE, ("host syncs are counted" if change == "item" else
                          "device memory is measured") + " on CUDA only"
    flops = verdict_of(run, "flops_per_step")
    if change == "larger":
        bytes_up = [m for m in regressed(run) if m.startswith("comm.") and m.endswith(".bytes")]
        hit = flops == "regressed" and bool(bytes_up)
        names = ["flops_per_step", *bytes_up[:1]]
    elif change == "collective":
        names = [m for m in regressed(run) if m.startswith("comm.") and m.endswith(".calls")
                 and "all_reduce" in m]
        hit = bool(names)
    elif change == "item":
        ops = [m for m in v if m.startswith("device.syncs.") and "item" in m
               and v[m]["verdict"] in ("regressed", "no baseline")]
        hit = verdict_of(run, "device.syncs") == "regressed" and bool(ops)
        names = ["device.syncs", *ops]
    else:
        hit = verdict_of(run, "peak_memory_bytes") == "regressed" and flops == "unchanged"
        names = ["peak_memory_bytes"]
    said = next((v[m]["explanation"] for m in names if m in v and v[m]["explanation"]), "")
    return ("caught" if hit and run["exit"] == 1 else "missed"), said


def explanation(run: dict[str, Any], cuda: bool) -> str:
    if run["kind"] == "change":
        return cause(run["change"], run, cuda)[1]
    first = regressed(run)
    return (run["verdicts"][first[0]]["explanation"] or "") if first else ""


# -- the step timer against a hand-written loop (on the ranks) --------------------------------
def hand_loop(step: dict[str, Any], steps: int, warmup: int) -> list[float]:
    """The same step as a user writes it: DDP, the optimizer, ``steps`` steps back to back
    with a CUDA event between steps (``perf_counter`` on CPU) and one synchronize at the end;
    seconds per step on this rank.  Warm-up: as many steps as the timer's (a synchronised and
    a no-sync one per ``warmup``).  What it built is freed before it returns."""
    import gc

    import torch
    import torch.distributed as dist

    cuda = dist.get_backend() == "nccl"
    try:
        return _hand_steps(step, steps, warmup, cuda)
    finally:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


def _hand_steps(step: dict[str, Any], steps: int, warmup: int, cuda: bool) -> list[float]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DistributedDataParallel(step["model_fn"]().to(device),
                                    device_ids=[device.index] if cuda else None)
    optimizer = step["optimizer_fn"](list(model.parameters()))
    idx, targets = (t.to(device) for t in step["batch_fn"](dist.get_rank()))
    loss_fn = step["loss_fn"]

    def one() -> None:
        loss_fn(model(idx, targets)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2 * warmup):
        one()
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    if not cuda:
        marks = [time.perf_counter()]
        for _ in range(steps):
            one()
            marks.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(marks)]
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    events[0].record()
    for event in events[1:]:
        one()
        event.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(events)]


def against_hand_loop(project: Path, shape: dict[str, Any], ranks: int, rounds: int,
                      budget: Budget, reserve: float) -> dict[str, Any]:
    """``ddp_step_timer`` against :func:`hand_loop` and the loop against itself (A/A), in
    ``rounds`` rounds alternating the order; stops early when under ``reserve`` s are left.
    Medians of every step; the environment the ranks see."""
    import torch
    from gate_step import make_step

    from pytest_distperf.fixtures.group import DistGroup
    from pytest_distperf.fixtures.steptimer import DDPStepTimer
    from pytest_distperf.pool.launcher import RankPool

    cuda = torch.cuda.is_available()
    step = make_step(shape)
    pool = RankPool(ranks, "nccl" if cuda else "gloo", timeout_s=300)
    group = DistGroup(pool)
    timer = DDPStepTimer(group)
    kinds = ("timer", "hand", "hand_again")
    got: dict[str, list[float]] = {k: [] for k in kinds}
    done = 0
    try:
        env = group.run(environment)[0]
        for r in range(rounds):
            if done and budget.left() < reserve:
                print(f"  stopped after {done} of {rounds} rounds: the budget", flush=True)
                break
            t0 = time.monotonic()
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                if kind == "timer":
                    timing = timer(**step, steps=shape["steps"], warmup=shape["warmup"],
                                   control=False, count_collectives=False)
                    got[kind] += list(timing.samples["step_s"])
                else:
                    got[kind] += slowest(group.run(hand_loop, step, shape["steps"],
                                                   shape["warmup"]))
            done += 1
            print(f"  round {r + 1}: " + ", ".join(
                f"{k} {statistics.median(v) * 1e3:.3f} ms" for k, v in got.items())
                + f" ({time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        pool.close()
    med = {k: statistics.median(v) for k, v in got.items() if v}
    out: dict[str, Any] = {"environment": env, "rounds": done, "steps": shape["steps"],
                           "median_ms": {k: round(v * 1e3, 4) for k, v in med.items()}}
    if len(med) == len(kinds):
        out["ratio"] = med["timer"] / med["hand"]
        out["aa"] = med["hand_again"] / med["hand"]
    return out


# -- the runner check -------------------------------------------------------------------------
def runner_check(project: Path, ranks: int, quick: bool, timeout: float) -> dict[str, Any]:
    env = child_env({})
    if quick:
        env["DISTPERF_DOCTOR_QUICK"] = "1"
    got = run_pytest(project, ["--pyargs", "pytest_distperf.doctor", "--distperf", "--gpus",
                               str(ranks)], env, timeout, project / "doctor.json")
    check = got.pop("report").get("sections", {}).get("runner_check", {})
    floors = {f["kind"]: f.get("detectable") for f in check.get("floors", [])}
    fidelity = {f["name"]: {"ratio": f.get("ratio"), "aa": f.get("aa")}
                for f in check.get("fidelity", [])}
    return {**got, "quick": quick, "floors": floors, "fidelity": fidelity,
            "gate": check.get("gate", ""), "tail": got["tail"][-1500:]}


# -- the report -------------------------------------------------------------------------------
def table(runs: list[dict[str, Any]], cuda: bool) -> list[list[str]]:
    head = ["run", "exit", "wall", *(c[0] for c in COLUMNS), "explanation"]
    rows = [head]
    for run in runs:
        rows.append([run["run"], str(run["exit"]), f"{run['wall_s']:.0f} s",
                     *(cell(run, which, cuda_only, cuda) for _, which, cuda_only in COLUMNS),
                     explanation(run, cuda)])
    return rows


def summary(runs: list[dict[str, Any]], cuda: bool, unchanged_wanted: int) -> dict[str, Any]:
    """False alarms, catches and the exact gating of the device figures."""
    clean = [r for r in runs if r["kind"] == "unchanged"]
    alarms = [r["run"] for r in clean if regressed(r) or r["exit"] != 0]
    inconclusive = [r["run"] for r in clean
                    if any(v["verdict"] == "inconclusive" for v in r["verdicts"].values())]
    caught: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run["kind"] == "change":
            found, said = cause(run["change"], run, cuda)
            caught[run["change"]] = {"result": found, "cause": CAUSES[run["change"]],
                                     "said": said, "also_regressed": regressed(run)}

    def steady(metric_of: Callable[[str], bool]) -> str:
        """Whether these metrics were unchanged in every unchanged compare."""
        if not cuda:
            return NOT_HERE
        seen = [v["verdict"] for r in clean for m, v in r["verdicts"].items() if metric_of(m)]
        if not seen:
            return "not measured"
        return "unchanged in every compare" if set(seen) == {"unchanged"} else str(
            sorted(set(seen)))

    return {
        "unchanged_runs": len(clean), "unchanged_wanted": unchanged_wanted,
        "false_alarms": alarms, "inconclusive": inconclusive, "caught": caught,
        "launches_steady": steady(lambda m: m == "device.launches"),
        "syncs_steady": steady(lambda m: m.startswith("device.syncs")),
        "peak_steady": steady(lambda m: m == "peak_memory_bytes"),
    }


def goals(result: dict[str, Any], cuda: bool) -> list[tuple[str, str]]:
    """Issue 47's "done when", each with what this run found."""
    s = result["summary"]
    hand, doctor = result.get("hand_loop", {}), result.get("runner_check", {})
    caught = s["caught"]
    out = []
    ratio = hand.get("ratio")
    out.append(("step timer within 1% of a back-to-back hand loop",
                "failed (hand_loop.error in the JSON)" if "error" in hand else
                "not run" if ratio is None else
                f"{'met' if abs(ratio - 1) <= 0.01 else 'NOT met'}: {ratio:.4f} "
                f"(A/A {hand['aa']:.4f})" + ("" if cuda else "; CPU: steps start at barriers")))
    floor = doctor.get("floors", {}).get("step")
    out.append(("the runner check's DDP-step floor at most 3%",
                "not run" if not doctor else "no floor measured" if floor is None else
                f"{'met' if floor <= 0.03 else 'NOT met'}: {floor:.1%}"
                + (" (quick)" if doctor.get("quick") else "")))
    n = s["unchanged_runs"]
    out.append(("0 false alarms in at least 8 unchanged compares",
                f"{'met' if not s['false_alarms'] and n >= 8 else 'NOT met'}: "
                f"{len(s['false_alarms'])} in {n}"
                + (f" (cut from {s['unchanged_wanted']} by the budget)"
                   if n < s["unchanged_wanted"] else "")))
    three = [c for c in ("larger", "collective", "kept") if c in caught]
    hits = [c for c in three if caught[c]["result"] == "caught"]
    out.append(("the three changes caught (larger, extra collective, kept activations)",
                f"{len(hits)} of 3 caught with the right cause ({', '.join(hits) or 'none'})"
                + "".join(f"; {c}: {caught[c]['result']}" for c in three if c not in hits)))
    item = caught.get("item", {}).get("result", "not run")
    out.append(("host syncs and launches per step gated exactly",
                NOT_HERE if not cuda else
                f"launches {s['launches_steady']}, syncs {s['syncs_steady']}; .item(): {item}"))
    kept = caught.get("kept", {}).get("result", "not run")
    out.append(("peak device memory gated",
                NOT_HERE if not cuda else f"{s['peak_steady']}; kept activations: {kept}"))
    return out


def markdown(result: dict[str, Any], rows: list[list[str]], cuda: bool) -> str:
    env, hand, doctor = result["machine"], result.get("hand_loop", {}), result.get(
        "runner_check", {})
    shape = result["shape"]
    where = (f"{env.get('device', '?')} ({env.get('memory_gib', '?')} GiB), torch "
             f"{env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, NCCL {env.get('nccl', '?')}"
             if cuda else f"CPU ({result['ranks']} gloo ranks), torch {env.get('torch', '?')}")
    lines = [
        "## The gate on a GPT from a public repository (issue 47)" if cuda else
        "## The gate's smoke run on CPU (a stand-in model: no GPU figures)",
        "",
        f"`benchmarks/gpu_gate.py` on {where}, {result['date']}: {result['model']} "
        f"({result['parameters'] / 1e6:.1f}M parameters), bf16 autocast, "
        f"{'fused AdamW' if cuda else 'AdamW'}, batch "
        f"{shape['batch']} x {shape['seq']} tokens, {shape['steps']} steps a measurement, "
        f"{result['ranks']} rank(s); {result['wall_s']:.0f} s in all.",
        "",
        "| " + " | ".join(rows[0]) + " |",
        "| " + " | ".join("---" for _ in rows[0]) + " |",
        *("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows[1:]),
        "",
        f"The larger model: {result['larger']}.",
        "",
        *(f"- {goal}: {found}" for goal, found in result["goals"]),
    ]
    if hand.get("median_ms"):
        medians = ", ".join(f"{k.replace('_', ' ')} {v:.3f} ms"
                            for k, v in hand["median_ms"].items())
        lines.append(f"- step timer / hand loop, medians of {hand['rounds']} rounds of "
                     f"{hand['steps']} steps: {medians}")
    if doctor:
        floors = ", ".join(f"{k} {v:.1%}" for k, v in doctor["floors"].items()
                           if v is not None)
        ratios = ", ".join(f"{k} {v['ratio']:.3f} (A/A {v['aa']:.3f})"
                           for k, v in doctor["fidelity"].items() if v["ratio"] is not None)
        lines.append(f"- runner check ({'quick' if doctor['quick'] else 'full'}, "
                     f"{doctor['wall_s']:.0f} s): floors {floors}; plugin / bare loop "
                     f"{ratios}; {doctor['gate']}")
    return "\n".join(lines) + "\n"


def print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False))
              + "  " + row[-1][:160])


# -- main -------------------------------------------------------------------------------------
def larger_layers(shape: dict[str, Any]) -> tuple[int, float, int]:
    """(layers to add for about ``LARGER`` more parameters, the growth, the parameters)."""
    from gate_step import parameters

    base = parameters(shape)
    per_layer = parameters(shape, 1) - base
    extra = max(1, round(LARGER * base / per_layer))
    return extra, extra * per_layer / base, base


def plan_runs(unchanged: int) -> Iterable[tuple[str, str, str]]:
    yield "save", "save", ""
    for i in range(unchanged):
        yield f"unchanged {i + 1}", "unchanged", ""
    for change in CHANGES:
        yield change, "change", change


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--gpt", type=Path,
                       help="a model file with GPTConfig and GPT(config), forward(idx, targets) "
                            "-> (logits, loss): nanoGPT's model.py")
    model.add_argument("--standin", action="store_true",
                       help="the CPU smoke run's stand-in model (no GPU figures)")
    parser.add_argument("--gpt-source", default="",
                        help="where the model file came from, for the report "
                             "(karpathy/nanoGPT model.py at <commit>)")
    parser.add_argument("--out", type=Path, default=Path("gpu-gate-out"))
    parser.add_argument("--unchanged", type=int, help="unchanged compares (8; smoke: 2)")
    parser.add_argument("--budget", type=float, default=340.0,
                        help="seconds for the whole script (default 340)")
    parser.add_argument("--rounds", type=int, help="hand-loop rounds (4; smoke: 2)")
    parser.add_argument("--batch", type=int, help="sequences per step (16; smoke: 4)")
    parser.add_argument("--ranks", type=int, help="default: 1 on a GPU, 2 gloo ranks on CPU")
    parser.add_argument("--doctor", choices=("auto", "full", "quick", "off"), default="auto",
                        help="the runner check; auto: full on a GPU where it fits in the "
                             "budget, else quick")
    parser.add_argument("--keep", action="store_true", help="keep the throw-away project")
    args = parser.parse_args(argv)

    import torch

    budget = Budget(args.budget)
    cuda = torch.cuda.is_available()
    if args.gpt and not args.gpt.is_file():
        parser.error(f"--gpt {args.gpt}: no such file; fetch nanoGPT's model.py first "
                     "(benchmarks/gpu.md says how)")
    shape = dict(STANDIN if args.standin else GPT2_SMALL)
    if args.batch:
        shape["batch"] = args.batch
    ranks = args.ranks or (1 if cuda else 2)
    unchanged = args.unchanged if args.unchanged is not None else (2 if args.standin else 8)
    rounds = args.rounds or (2 if args.standin else 4)
    doctor = "quick" if args.doctor == "auto" and not cuda else args.doctor
    args.out.mkdir(parents=True, exist_ok=True)
    project = Path(tempfile.mkdtemp(prefix="distperf-gate-"))
    make_project(project, HERE / "gpu_gate_standin.py" if args.standin else args.gpt)
    sys.path.insert(0, str(project))
    extra, growth, params = larger_layers(shape)
    shape["extra_layers"] = extra
    model_name = ("the STAND-IN model (benchmarks/gpu_gate_standin.py)" if args.standin
                  else args.gpt_source or f"the GPT of {args.gpt}")
    print(f"gpu_gate: {model_name}, {params / 1e6:.2f}M parameters, shape {shape}; "
          f"{ranks} rank(s), {'NCCL' if cuda else 'gloo'}; budget {args.budget:.0f} s; "
          f"package {__import__('pytest_distperf').__file__}\n{nvidia_smi() if cuda else ''}",
          flush=True)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": model_name,
        "parameters": params, "shape": shape, "ranks": ranks, "cuda": cuda,
        "larger": f"{extra} more layer(s), {growth:.1%} more parameters",
        "nvidia_smi": nvidia_smi() if cuda else "", "runs": []}
    runs: list[dict[str, Any]] = result["runs"]
    hand_reserve = 60.0 if cuda else 40.0
    try:
        for name, kind, change in plan_runs(unchanged):
            # a compare's wall time, as far as seen (the save's, longer, before the first)
            est = max((r["wall_s"] for r in runs if r["kind"] != "save"),
                      default=runs[0]["wall_s"] if runs else 0.0)
            later = len(CHANGES) - sum(r["kind"] == "change" for r in runs)
            need = est * (1 + (later if kind == "unchanged" else 0)) + (
                hand_reserve if kind == "unchanged" else 0.0)
            if kind != "save" and budget.left() < max(need, 10.0):
                print(f"[{budget.spent():5.0f} s] skipped {name}: {budget.left():.0f} s left, "
                      f"{need:.0f} s needed", flush=True)
                continue
            run = gate_run(project, name, kind, change, shape, ranks, budget.left())
            runs.append(run)
            print(f"[{budget.spent():5.0f} s] {name}: exit {run['exit']}, {run['wall_s']} s; "
                  f"regressed: {regressed(run) or 'none'}", flush=True)
            if kind == "save" and run["exit"] != 0:
                print(f"the save failed:\n{run['tail']}", flush=True)
                break
        if runs and runs[0]["exit"] == 0 and budget.left() > 20:
            print(f"[{budget.spent():5.0f} s] the step timer against a hand loop", flush=True)
            try:
                result["hand_loop"] = against_hand_loop(project, shape, ranks, rounds, budget,
                                                        reserve=30.0)
            except Exception:  # the verdicts above are still reported
                traceback.print_exc()
                result["hand_loop"] = {"error": traceback.format_exc()[-3000:]}
        # auto: the full check where it fits, else the quick one
        fits = [m for m in (("full", "quick") if doctor == "auto" else (doctor,))
                if m != "off" and budget.left() >= DOCTOR_S[m]]
        if fits:
            print(f"[{budget.spent():5.0f} s] the runner check ({fits[0]})", flush=True)
            result["runner_check"] = runner_check(project, ranks, fits[0] == "quick",
                                                  budget.left())
        elif doctor != "off":
            print(f"[{budget.spent():5.0f} s] runner check skipped: {budget.left():.0f} s "
                  f"left", flush=True)
    finally:
        baselines = sorted((project / "perf_baselines").glob("*.toml"))
        result["baseline_file"] = baselines[0].read_text()[-20000:] if baselines else ""
        if not args.keep:
            shutil.rmtree(project, ignore_errors=True)
    result["machine"] = result.get("hand_loop", {}).get("environment", {"torch": torch.__version__})
    result["wall_s"] = budget.spent()
    result["summary"] = summary(runs, cuda, unchanged)
    result["goals"] = goals(result, cuda)
    rows = table(runs, cuda)
    print()
    print_table(rows)
    print()
    for goal, found in result["goals"]:
        print(f"{goal}: {found}")
    for change, got in result["summary"]["caught"].items():
        print(f"  {change}: {got['result']} ({got['cause']}): {got['said'][:200]}")
    (args.out / "gpu_gate.json").write_text(json.dumps(result, indent=1, default=str))
    (args.out / "gpu_gate.md").write_text(markdown(result, rows, cuda))
    print(f"\nwritten {args.out / 'gpu_gate.json'} and {args.out / 'gpu_gate.md'} "
          f"({budget.spent():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
