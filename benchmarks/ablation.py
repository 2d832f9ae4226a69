"""Every part of the controlled verdict rule earns its place: remove one idea at a time.

For each idea of the rule with the host-speed control (docs/verdict-rule.md; the code in
``pytest_distperf/verdict/``: ``rule.py``, ``readings.py``, ``stats.py``, ``noise.py``) a
named switch takes it out by patching the package's functions or constants from here (the
package is not changed), and
every recorded run in ``benchmarks/data/`` is judged again (``benchmarks/replay.py``: the
sequential screen included, a run that wants more measurements than it recorded takes them
from the other runs of its block with the same work) against the same replay with no idea
removed:

* every recording with its controlled metric (``matmul.time_s``: R42, R44, R45;
  ``all_reduce.4MiB.busbw_gbps``: R47, R52, R61, R69; ``step_time_s`` and
  ``compute_time_s``: R59);
* as recorded, and on a host 10% slower and 10% faster at every compare run than at the
  save (``replay.py --host-change``: every control and time scaled together; a bandwidth
  divided where a time is multiplied, as ``--time-change`` allows), and for R59 the drift
  two watchers measured on 2026-11-24 as well (the compute control 12.6% slower, the memory
  control 17.1%, the step 21.2%: ``tests/test_replay.py``);
* two ways for the ideas that act in a save too (the outlier set-aside, the spread limit,
  the noise probe, the quantiles): ``stored``, each run judged against its baseline as
  stored (the idea removed from the compare runs), and ``saves``, each baseline rebuilt from
  its save's recorded measurements as a save stores them (``replay.rebuilt``), with and
  without the idea (the idea removed from the save and the compare runs; the reference is
  then the rebuilt baselines with every idea).

A verdict that moves is counted by its work: a clean run (false alarm: regressed; false
improvement: improved; inconclusive) or a slowed one (+10%, +20%: caught when regressed);
a move is *worse* when it goes away from the goal (clean: unchanged, then inconclusive,
then improved, then regressed; slowed: regressed, then inconclusive, unchanged, improved).

    python benchmarks/ablation.py                     # every switch, a markdown table
    python benchmarks/ablation.py --only screen --only slope-error --jobs 2
    python benchmarks/ablation.py --list
    python benchmarks/ablation.py --json ablation.json   # every verdict, per run

Results: benchmarks/ablation.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import math
import multiprocessing
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay

from pytest_distperf.records import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Measured
from pytest_distperf.verdict import measurements, noise, readings, rule, stats
from pytest_distperf.verdict.judgement import MAX_ROUNDS

DATA = Path(__file__).resolve().parent / "data"
BUSBW = "all_reduce.4MiB.busbw_gbps"
TOLERANCE = replay.TOLERANCE

#: verdict_quality.py --kind micro: 0.13 ms of Python, a 64x64 matmul, a 64 KiB all-reduce
MICRO = ("py.time_s", "mm.time_s", "ar.time_s")
#: (file, its metrics): a recording of ddp_verdicts.py holds the step and its compute.
RECORDINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("r42", ("matmul.time_s",)),
    ("r44", ("matmul.time_s",)),
    ("r45", ("matmul.time_s",)),
    ("r47", (BUSBW,)),
    ("r52", (BUSBW,)),
    ("r61", (BUSBW,)),
    ("r69", (BUSBW,)),
    ("r59", ("step_time_s", "compute_time_s")),
    ("r72", MICRO),
    ("r73", MICRO),
    ("r74", MICRO),
    ("r75", MICRO),
    ("r76", MICRO),
)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    host: float  # the compute control this much slower at the compare runs
    memory: float | None = None  # the memory control (default: as the host)
    time: float | None = None  # the times (default: as the host; a rate: the inverse)
    only: tuple[str, ...] = ()  # the recordings it is replayed for (default: every one)


SCENARIOS = (
    Scenario("0", 0.0),
    Scenario("+10%", 0.1),
    Scenario("-10%", -0.1),
    Scenario("drift", 0.126, 0.171, 0.212, only=("r59",)),
)

# ---------------------------------------------------------------------------------------------
# The switches


_ORIG: dict[str, Any] = {"_controlled_assessments": rule._controlled_assessments,
                         "_memory_between": readings._memory_between}
_MEMORY = (readings.MEMORY, readings.MEMORY_IN_PROPORTION)


def _without_readings(names: tuple[str, ...], regression: bool,
                      improvement: bool) -> Callable[..., Any]:
    """``rule._controlled_assessments`` with the readings ``names`` left out of the
    regression's assessment, the improvement's, or both."""
    def patched(base: Any, measured: Any, tolerance: float) -> tuple[Any, Any]:
        worse, better = _ORIG["_controlled_assessments"](base, measured, tolerance)

        def strip(a: Any) -> Any:
            return dataclasses.replace(a, readings=tuple(r for r in a.readings
                                                         if r.name not in names))
        return strip(worse) if regression else worse, strip(better) if improvement else better
    return patched


def _memory_like_time(host_log: float, memory_log: float, fitted: float, rate: bool, *,
                      capped: bool = True) -> tuple[str, float, float]:
    """``readings._memory_between`` with a bandwidth's memory reading at the ratio of the
    controls' changes, as a time's (not the memory control's change 1:1)."""
    return _ORIG["_memory_between"](host_log, memory_log, fitted, False, capped=capped)


def _control_slope(clip: tuple[float, float] = (0.0, 1.0), centre: bool = True,
                   fixed: float | None = None) -> Callable[..., float]:
    """``readings.control_slope`` as it is (checked against it), clipped to ``clip``, each
    side centred on its own median or (``centre`` false) both on the median of all;
    ``fixed``: that slope, no fit."""
    def patched(base: Any, measured: Sequence[Measured]) -> float:
        if fixed is not None:
            return fixed
        sides = [stats.control_points(measurements.parts(base.samples)),
                 stats.control_points(measurements.parts_of(measured))]
        if not centre:
            sides = [[p for side in sides for p in side]]
        return readings.fitted_slope(sides, clip)
    return patched


def _always(value: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: value


Patch = tuple[Any, str, Any]  # (module or class, attribute, value)


@dataclasses.dataclass(frozen=True)
class Switch:
    name: str
    idea: str
    patches: tuple[Patch, ...] = ()  # in the compare runs (and in saves, with ``saves``)
    save_only: tuple[Patch, ...] = ()  # in the saves alone (``saves`` mode only)
    saves: bool = False  # replayed with the baselines rebuilt as well
    stored: bool = True  # replayed against the baselines as stored
    alternative: bool = False  # not a removal: another rule in the idea's place


INF = math.inf
_BETWEEN = (readings.IN_PROPORTION,)
SWITCHES: tuple[Switch, ...] = (
    # the memory control
    Switch("memory-end", "the memory control's veto (the memory end), both directions",
           ((rule, "_controlled_assessments", _without_readings(_MEMORY, True, True)),)),
    Switch("memory-end-regression", "the memory end of a regression",
           ((rule, "_controlled_assessments", _without_readings(_MEMORY, True, False)),)),
    Switch("memory-end-improvement", "the memory end of an improvement",
           ((rule, "_controlled_assessments", _without_readings(_MEMORY, False, True)),)),
    Switch("memory-slope-ratio", "a time's memory end at the ratio of the two controls' "
           "changes (_MEMORY_SLOPE_MAX = 1: the memory end of a time is the 1:1 end)",
           ((readings, "_MEMORY_SLOPE_MAX", 1.0),)),
    Switch("memory-slope-max", "the cap of that ratio (_MEMORY_SLOPE_MAX = inf)",
           ((readings, "_MEMORY_SLOPE_MAX", INF),)),
    Switch("memory-rate-1:1", "a bandwidth's memory end 1:1 on the memory control's change "
           "(judged at the ratio of the controls' changes, as a time)",
           ((readings, "_memory_between", _memory_like_time),)),
    # the host's change between the sides
    Switch("between-slope", "the 1:1 end (_BETWEEN_SLOPE), both directions",
           ((rule, "_controlled_assessments", _without_readings(_BETWEEN, True, True)),)),
    Switch("between-slope-regression", "the 1:1 end of a regression",
           ((rule, "_controlled_assessments", _without_readings(_BETWEEN, True, False)),)),
    Switch("between-slope-improvement", "the 1:1 end of an improvement",
           ((rule, "_controlled_assessments", _without_readings(_BETWEEN, False, True)),)),
    Switch("slope-error", "the slope-error floor (_SLOPE_ERROR = 0)",
           ((rule, "_SLOPE_ERROR", 0.0),)),
    Switch("memory-alone", "the memory control's own move as a floor (a change within how "
           "much more than the compute control it slowed is inconclusive)",
           ((rule, "memory_alone", _always(0.0)),)),
    # the fit
    Switch("slope-clip", "the clipping of the fitted slope to [0, 1]",
           ((readings, "control_slope", _control_slope(clip=(-INF, INF))),)),
    Switch("fit-centring", "each side centred on its own median in the fit (one centre)",
           ((readings, "control_slope", _control_slope(centre=False)),)),
    Switch("fit=1", "the fit: every time taken out 1:1 against its control (slope 1)",
           ((readings, "control_slope", _control_slope(fixed=1.0)),), alternative=True),
    Switch("fit=0", "the fit: slope 0 within the sides (the 1:1 end between them stays)",
           ((readings, "control_slope", _control_slope(fixed=0.0)),), alternative=True),
    Switch("control-level-quantile", "a measurement's control level at the 25% quantile of "
           "its controls (_CONTROL_LEVEL_QUANTILE = 0.5: the median)",
           ((stats, "_CONTROL_LEVEL_QUANTILE", 0.5),)),
    Switch("control-estimator-quantile", "the adjusted samples judged by their 25% quantile "
           "(_CONTROL_ESTIMATOR_QUANTILE = 0.5: the median)",
           ((readings, "_CONTROL_ESTIMATOR_QUANTILE", 0.5),), saves=True),
    # the outliers (those slowed alone; an improvement's set-aside is gone)
    Switch("outliers", "the outlier set-aside in compare runs (_OUTLIER_LIMIT = inf)",
           ((rule, "without_outliers", lambda measured, tolerance, **_: list(measured)),)),
    Switch("outliers-save", "the outlier set-aside in saves",
           save_only=((readings, "_OUTLIER_LIMIT", INF),), saves=True, stored=False),
    Switch("outliers-everywhere", "the outlier set-aside in saves and compare runs",
           ((readings, "_OUTLIER_LIMIT", INF),), saves=True, stored=False),
    # the improvement
    Switch("improvement-windows", "an improvement's two measurements, the last one past the "
           "line alone (_IMPROVEMENT_MEASUREMENTS = 1)",
           ((rule, "_IMPROVEMENT_MEASUREMENTS", 1), (rule, "_better_alone", _always(True)))),
    Switch("better-alone", "an improvement's last measurement past the line alone (two "
           "measurements still)", ((rule, "_better_alone", _always(True)),)),
    # noise
    Switch("spread-limit", "the spread limit (_SPREAD_LIMIT = inf; _SPREAD_RATIO with it)",
           ((rule, "_SPREAD_LIMIT", INF),), saves=True),
    Switch("spread-ratio", "the spread limit relative to the baseline's spread "
           "(_SPREAD_RATIO = 0: _SPREAD_LIMIT alone)", ((rule, "_SPREAD_RATIO", 0.0),),
           saves=True),
    Switch("noise-probe", "the noise probe (no measurement too noisy by it)",
           ((noise.NoiseFigures, "too_noisy", lambda self: []),), saves=True),
    Switch("other-load-limit", "the other processes' load limit (_OTHER_LOAD_LIMIT = inf)",
           ((noise, "_OTHER_LOAD_LIMIT", INF),), saves=True),
    # the screen and the tests
    Switch("screen", "the sequential screen (_SCREEN_FRACTION = -inf: always "
           "_CONTROL_MEASUREMENTS measurements for a verdict other than improved)",
           ((rule, "_SCREEN_FRACTION", -INF),)),
    Switch("screen-at-line", "the screen's own fraction (_SCREEN_FRACTION = 1: unchanged "
           "as soon as the pooled change is under the line, the tolerance)",
           ((rule, "_SCREEN_FRACTION", 1.0),), alternative=True),
    Switch("mann-whitney", "the Mann-Whitney gate at _ALPHA (_ALPHA = inf)",
           ((rule, "_ALPHA", INF),)),
)
BY_NAME = {s.name: s for s in SWITCHES}
REFERENCE = Switch("reference", "nothing removed")


@contextlib.contextmanager
def patched(patches: Sequence[Patch]) -> Iterator[None]:
    saved = [(target, attr, getattr(target, attr)) for target, attr, _ in patches]
    try:
        for target, attr, value in patches:
            setattr(target, attr, value)
        yield
    finally:
        for target, attr, value in reversed(saved):
            setattr(target, attr, value)


# ---------------------------------------------------------------------------------------------
# The replay


_DATA: dict[str, dict[str, Any]] = {}


def recording(name: str) -> dict[str, Any]:
    if name not in _DATA:
        _DATA[name] = replay.load_runs(DATA / f"{name}.json.gz")
    return _DATA[name]


def _order(run: replay.Run, pool: list[dict[str, Any]]) -> list[int]:
    """Positions in ``pool`` of the run's measurements and then the others', to
    ``rule.MAX_ROUNDS``: replay.padded's order (the same shuffle of the same count), as
    positions, so that a step and its compute are padded with the same measurements."""
    own = [next(i for i, m in enumerate(pool) if m is x) for x in run.measurements]
    spare = [i for i, m in enumerate(pool) if m not in run.measurements]
    random.Random(repr(replay._values(run.measurements[0])[:3])).shuffle(spare)
    return (own + spare)[:MAX_ROUNDS]


def judge(base: Any, measured: list[Measured]) -> tuple[str, float | None, int]:
    """(verdict, change, measurements used), the rule asked one measurement at a time."""
    for k in range(1, len(measured) + 1):
        verdict, a, _, more = rule.decide(base, measured[:k], TOLERANCE, can_confirm=True)
        if not more:
            return verdict, a.change, k
    return "wanted more", None, len(measured)


def replay_one(switch: Switch, mode: str, name: str, scenario: Scenario
               ) -> dict[str, list[tuple[float, str]]]:
    """Per metric of recording ``name``: (slowdown, verdict) of every compare run, with
    ``switch``'s idea removed, its baselines as stored or (``mode`` "saves") rebuilt."""
    data = recording(name)
    metrics = dict(RECORDINGS)[name]
    out: dict[str, list[tuple[float, str]]] = {}
    first: list[replay.Run] | None = None
    first_pool: dict[tuple[int, float], list[dict[str, Any]]] = {}
    for metric in metrics:
        runs = list(replay.compare_runs(data, metric))
        pool: dict[tuple[int, float], list[dict[str, Any]]] = collections.defaultdict(list)
        for run in runs:
            pool[(run.block, run.extra)] += run.measurements
        if first is None:
            first, first_pool = runs, pool
        assert len(runs) == len(first)
        rate = runs[0].base.higher_is_better
        time_change = scenario.time
        if time_change is None and rate:
            time_change = 1.0 / (1.0 + scenario.host) - 1.0  # a slower host: less bandwidth
        rebuilt: dict[int, Any] = {}
        verdicts = []
        for run, lead in zip(runs, first, strict=True):
            base = run.base
            if mode == "saves":
                key = id(run.base)
                if key not in rebuilt:
                    with patched(switch.patches + switch.save_only):
                        rebuilt[key] = replay.rebuilt(run.base, run.saved,
                                                      list(range(len(run.saved))),
                                                      run.save_level)
                base = rebuilt[key]
            # a DDP step's order for its compute too: they come from the same measurements
            here = pool[(run.block, run.extra)]
            order = (_order(lead, first_pool[(lead.block, lead.extra)])
                     if metric in replay.DDP_KEYS else _order(run, here))
            chosen = [here[i] for i in order]
            assert chosen[: len(run.measurements)] == run.measurements
            measured = replay.measurements(
                chosen, 1.0 + scenario.host, 1.0,
                None if scenario.memory is None else 1.0 + scenario.memory,
                None if time_change is None else 1.0 + time_change)
            with patched(switch.patches):
                verdict, _, _ = judge(base, measured)
            verdicts.append((run.extra, verdict))
        out[metric] = verdicts
    return out


def _task(args: tuple[str, str, str, Scenario]
          ) -> tuple[tuple[str, str, str, str], dict[str, list[tuple[float, str]]]]:
    switch_name, mode, name, scenario = args
    switch = REFERENCE if switch_name == REFERENCE.name else BY_NAME[switch_name]
    return (switch_name, mode, name, scenario.name), replay_one(switch, mode, name, scenario)


# ---------------------------------------------------------------------------------------------
# Counting


#: How far a verdict is from the goal, by the run's work (clean; slowed).
CLEAN_RANK = {UNCHANGED: 0, INCONCLUSIVE: 1, IMPROVED: 2, REGRESSED: 3}
SLOWED_RANK = {REGRESSED: 0, INCONCLUSIVE: 1, UNCHANGED: 2, IMPROVED: 3}
SHORT = {UNCHANGED: "unch", INCONCLUSIVE: "inc", IMPROVED: "imp", REGRESSED: "reg"}


def _work(extra: float) -> str:
    return "clean" if extra == 0 else f"+{extra:.0%}"


def _rank(extra: float, verdict: str) -> int:
    return (CLEAN_RANK if extra == 0 else SLOWED_RANK).get(verdict, 4)


@dataclasses.dataclass
class Effect:
    """What removing an idea did to the verdicts of some replays."""

    changed: int = 0
    better: int = 0
    worse: int = 0
    false_alarms: int = 0  # change in the clean runs called regressed
    false_improvements: int = 0
    inconclusive: int = 0  # change in the clean runs called inconclusive
    caught10: int = 0  # change in the +10% runs called regressed
    caught20: int = 0
    moves: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    def add(self, before: list[tuple[float, str]], after: list[tuple[float, str]]) -> None:
        for (extra, b), (_, a) in zip(before, after, strict=True):
            if a == b:
                continue
            self.changed += 1
            if _rank(extra, a) > _rank(extra, b):
                self.worse += 1
            else:
                self.better += 1
            self.moves[f"{_work(extra)} {SHORT.get(b, b)}>{SHORT.get(a, a)}"] += 1
            if extra == 0:
                self.false_alarms += (a == REGRESSED) - (b == REGRESSED)
                self.false_improvements += (a == IMPROVED) - (b == IMPROVED)
                self.inconclusive += (a == INCONCLUSIVE) - (b == INCONCLUSIVE)
            elif abs(extra - 0.1) < 1e-9:
                self.caught10 += (a == REGRESSED) - (b == REGRESSED)
            else:
                self.caught20 += (a == REGRESSED) - (b == REGRESSED)

    def goals(self) -> str:
        figures = [("false alarms", self.false_alarms),
                   ("false improvements", self.false_improvements),
                   ("clean inconclusive", self.inconclusive),
                   ("10% caught", self.caught10), ("20% caught", self.caught20)]
        shown = [f"{label} {value:+d}" for label, value in figures if value]
        if not self.changed:
            return "none"
        return ", ".join(shown) or "none (the moves cancel)"


def _label(name: str, metric: str) -> str:
    short = {"step_time_s": "step", "compute_time_s": "compute"}.get(metric, "")
    return f"{name}{'/' + short if short else ''}"


def tasks_for(switches: Sequence[Switch]) -> list[tuple[str, str, str, Scenario]]:
    modes = {"stored": any(s.stored for s in switches),
             "saves": any(s.saves for s in switches)}
    out = []
    for s in (REFERENCE, *switches):
        for mode in ("stored", "saves"):
            if not modes[mode] or (s is not REFERENCE and not (
                    s.stored if mode == "stored" else s.saves)):
                continue
            for name, _ in RECORDINGS:
                for scenario in SCENARIOS:
                    if scenario.only and name not in scenario.only:
                        continue
                    out.append((s.name, mode, name, scenario))
    return out


def decision(effect: Effect) -> tuple[str, str]:
    """(keep or remove, why) by the issue's rule."""
    if not effect.changed:
        return "remove", "changes no recorded verdict"
    if not effect.worse:
        return "remove", f"its removal only makes verdicts better ({effect.better})"
    severe = (effect.false_alarms > 0 or effect.false_improvements > 0
              or effect.caught10 < 0 or effect.caught20 < 0)
    lost = [m for m in effect.moves if (m.startswith("clean") and m.endswith((">reg", ">imp")))
            or (not m.startswith("clean") and " reg>" in m)]
    why = (f"its removal makes {effect.worse} verdict(s) worse"
           + (f" ({', '.join(sorted(lost))})" if lost else " (inconclusive, never false)")
           + (f" and {effect.better} better" if effect.better else ""))
    return "keep", why + ("" if severe or lost else "; only inconclusive ones: a judgement call")


def _progress(items: Iterator[Any], total: int) -> Iterator[Any]:
    """``items``, with a line on stderr every 50 of them."""
    started = time.monotonic()
    for i, item in enumerate(items, 1):
        if i % 50 == 0 or i == total:
            print(f"ablation: {i}/{total} replays, {time.monotonic() - started:.0f} s",
                  file=sys.stderr, flush=True)
        yield item


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", metavar="SWITCH",
                        help="these switches (repeatable; default: every one)")
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--list", action="store_true", help="list the switches and stop")
    parser.add_argument("--json", type=Path, help="write every verdict here")
    args = parser.parse_args(argv)
    if args.list:
        for s in SWITCHES:
            print(f"{s.name:28} {s.idea}")
        return 0
    unknown = [n for n in args.only or [] if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"ablation: no switch {', '.join(unknown)} (--list)")
    switches = [BY_NAME[n] for n in args.only] if args.only else list(SWITCHES)
    tasks = tasks_for(switches)
    started = time.monotonic()
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as workers:
            results = dict(_progress(workers.imap_unordered(_task, tasks), len(tasks)))
    else:
        results = dict(_progress(map(_task, tasks), len(tasks)))
    seconds = time.monotonic() - started
    if args.json:
        args.json.write_text(json.dumps({"|".join(k): v for k, v in results.items()}))

    def verdicts(switch: str, mode: str) -> Iterator[tuple[str, str, list, list]]:
        for (s, m, name, scen), per_metric in sorted(results.items()):
            if s != switch or m != mode:
                continue
            for metric, after in per_metric.items():
                before = results[(REFERENCE.name, mode, name, scen)][metric]
                yield _label(name, metric), scen, before, after

    print(f"# {len(tasks)} replays in {seconds:.0f} s\n")
    print("## The reference: every idea (verdicts per work, all replays)\n")
    print("| mode | recording | host | clean | +10% | +20% |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (s, mode, name, scen), per_metric in sorted(results.items()):
        if s != REFERENCE.name:
            continue
        for metric, vs in per_metric.items():
            cells = []
            for extra in (0.0, 0.1, 0.2):
                c = collections.Counter(v for e, v in vs if abs(e - extra) < 1e-9)
                cells.append(", ".join(f"{SHORT.get(k, k)} {n}" for k, n in sorted(c.items()))
                             or "-")
            print(f"| {mode} | {_label(name, metric)} | {scen} | {' | '.join(cells)} |")
    print("\n## Each idea removed\n")
    print("| idea | switch | mode | verdicts changed (recording@host: n) | effect on goals "
          "(as recorded; host moved) | moves | keep or remove |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for s in switches:
        for mode in ("stored", "saves"):
            if not (s.stored if mode == "stored" else s.saves):
                continue
            total, recorded, moved = Effect(), Effect(), Effect()
            cells = []
            for label, scen, before, after in verdicts(s.name, mode):
                e = Effect()
                e.add(before, after)
                total.add(before, after)
                (recorded if scen == "0" else moved).add(before, after)
                if e.changed:
                    cells.append(f"{label}@{scen}: {e.changed}")
            keep, why = decision(total)
            if s.alternative:
                keep = "(an alternative)"
            moves = "; ".join(f"{m} {n}" for m, n in sorted(total.moves.items())) or "-"
            print(f"| {s.idea} | `{s.name}` | {mode} | {', '.join(cells) or 'none'} "
                  f"({total.changed}: {total.worse} worse, {total.better} better) | "
                  f"{recorded.goals()}; {moved.goals()} | {moves} | **{keep}**: {why} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
