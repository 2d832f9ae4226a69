"""Judge recorded compare runs again with today's verdict rule, on a host that moved.

``verdict_quality.py --json runs.json`` keeps, for every run, each measurement's samples and
host-speed controls, and after each save the baseline files as stored.  This replays the
controlled metric's verdicts from them with the rule in ``pytest_distperf/verdict/rule.py``
as it is now (the sequential screen included: the rule asks for one measurement at a time),
and, with ``--host-change``, as if the host had run that much slower (negative: faster) at
every compare run than at the save: each compare run's times and controls scaled together,
both controls (compute and memory) by ``1 + change``, the times by ``(1 + change) **
follow`` (``--follow 1``: work on the host's CPU, which follows a slower host 1:1; 0: work
that waits).  That is the case a same-run control cannot
learn from within the runs: a host whose speed moved between the save and the compare runs,
not within them (benchmarks/verdict_quality.md, R33).

A run that wants more measurements than it recorded (it stopped earlier under the rule it
ran with) takes them from the other recorded runs of its block with the same work, in a
fixed order: each from a fresh rank pool, as a re-measurement is not, so a replay is a
close model of a run, not a copy.  The figures are printed per work (clean, +10%, +20%).

    python benchmarks/replay.py benchmarks/data/r42.json.gz
    python benchmarks/replay.py benchmarks/data/r42.json.gz --host-change 0.1 --host-change -0.1
    python benchmarks/replay.py runs.json --metric matmul.time_s --follow 0
    python benchmarks/replay.py ddp.json --metric step_time_s --host-change 0.126 \
        --memory-change 0.171 --time-change 0.212    # a ddp_verdicts.py file, a drift
    python benchmarks/replay.py runs.json --metric all_reduce.4MiB.busbw_gbps \
        --save-pick 0,1,2 --save-pick 3,4,5    # baselines of three of the save's six

``--save-now`` rebuilds each baseline as a save takes it now (judgement.save_pool, stopping
where judgement.save_done says).  ``--save-pick`` rebuilds each block's baseline from those
of its save's recorded measurements (by index), as a save stores them (the quiet ones
pooled, less those set aside): how the verdicts depend on the number of measurements a save
takes (R65 in verdict_quality.md).

Results: benchmarks/verdict_quality.md (R42-R47).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.config import DEFAULT_SAVE_MEASUREMENTS
from pytest_distperf.records import Measured, Samples, from_dict
from pytest_distperf.verdict import judgement, readings, rule
from pytest_distperf.verdict.judgement import MAX_ROUNDS
from pytest_distperf.verdict.measurements import pooled
from pytest_distperf.verdict.store import BaselineFile, StoredMetric

#: The tolerance the recordings are judged at: their line (5%) when they were recorded,
#: half their 10% tolerance then; the tolerance is the line now (``--tolerance``).
TOLERANCE = 0.05


def load_runs(path: Path) -> dict[str, Any]:
    """A ``--json`` file of verdict_quality.py (gzipped or not)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            return dict(json.load(f))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"replay: cannot read {path}: {exc}") from exc


def stored_metric(files: dict[str, Any], metric: str) -> StoredMetric | None:
    """``metric``'s baseline in a save's recorded baseline files (name: parsed TOML), read
    the way the plugin reads a baseline file."""
    for name, data in files.items():
        stored = BaselineFile(Path(name), data)
        for test in data.get("tests", {}):
            for env_id in stored.test_environments(test):
                found = (stored.metrics(test, env_id) or {}).get(metric)
                if found is not None:
                    return found
    return None


@dataclasses.dataclass
class Run:
    block: int
    extra: float
    base: StoredMetric
    verdict: str  # as recorded
    measurements: list[dict[str, Any]]
    #: the recorded measurements of the save the baseline came from (recorded from R33 on)
    saved: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the save's control level: over every measurement with a control of every metric
    save_level: float = float("nan")


#: ddp_verdicts.py's ``--json`` keeps a run's step and compute verdicts under these keys.
DDP_KEYS = {"step_time_s": "step", "compute_time_s": "compute"}


def compare_runs(data: dict[str, Any], metric: str) -> Iterator[Run]:
    """The recorded compare runs of ``metric``, each with the baseline it was judged by
    (a ddp_verdicts.py file: its clean runs and its ``slowerNN`` ones, one block)."""
    base: StoredMetric | None = None
    saved: list[dict[str, Any]] = []
    level = float("nan")
    for run in data["runs"]:
        if run.get("bare"):
            continue
        ddp = "kind" in run
        v = run.get(DDP_KEYS.get(metric, metric) if ddp else metric)
        if (run["kind"] == "save") if ddp else run["save"]:
            base = stored_metric(run.get("baseline_files") or {}, metric)
            saved = list((v or {}).get("measurements") or [])
            level = save_level(run)
            continue
        if base is None or v is None or not v.get("measurements"):
            continue
        if ddp:
            kind = run["kind"]
            if kind != "clean" and not (kind.startswith("slower") and kind[6:].isdigit()):
                continue  # a communication change: not a slowdown of the work
            extra = 0.0 if kind == "clean" else int(kind[6:]) / 100
            yield Run(0, extra, base, v["verdict"], list(v["measurements"]), saved, level)
            continue
        yield Run(run["block"], run["extra"], base, v["verdict"], list(v["measurements"]),
                  saved, level)


def save_level(run: dict[str, Any]) -> float:
    """The median log control level of every recorded measurement with a control in a save
    run, whatever its metric (judgement.Save's level)."""
    levels = [readings.control_level(m) for v in run.values() if isinstance(v, dict)
              for m in measurements(v.get("measurements") or [], 1.0, 1.0)
              if m.samples.control and len(m.samples.control) == len(m.samples.values)]
    return median_or_nan(levels)


def rebuilt(base: StoredMetric, saved: list[dict[str, Any]], pick: list[int],
            level: float) -> StoredMetric:
    """``base`` rebuilt from the save's measurements ``pick`` (indices), as a save stores a
    metric with the control (judgement.save_pool; all of them when it keeps none), the
    save's control level ``level`` (:func:`save_level`; NaN: these measurements')."""
    chosen = [saved[i] for i in pick if i < len(saved)]
    if not chosen:
        raise SystemExit(f"replay: --save-pick {pick}: the save recorded {len(saved)} "
                         "measurement(s)")
    every = measurements(chosen, 1.0, 1.0)
    return dataclasses.replace(base, measured=pooled(_pool(base, every, level) or every))


def _pool(base: StoredMetric, every: list[Measured], level: float) -> list[Measured]:
    hib = base.higher_is_better
    if math.isnan(level):
        level = median_or_nan([readings.control_level(m) for m in every])
    limit = rule.spread_limit([m.samples.values for m in every], hib, floor=False)
    return judgement.save_pool(every, save_level=level, tolerance=TOLERANCE,
                               higher_is_better=hib, spread_limit=limit)


def saved_now(base: StoredMetric, saved: list[dict[str, Any]],
              level: float) -> tuple[StoredMetric, int]:
    """``base`` as a save takes it now: the recorded measurements in order until
    judgement.save_done, pooled as :func:`rebuilt` does; and how many it took."""
    every = measurements(saved, 1.0, 1.0)
    for k in range(1, len(every) + 1):
        kept = _pool(base, every[:k], level)
        stored = dataclasses.replace(base, measured=pooled(kept or every[:k]))
        if judgement.save_done(k, len(kept), judgement.told(stored) if kept else None,
                               TOLERANCE, DEFAULT_SAVE_MEASUREMENTS):
            break
    return stored, k


def padded(run: Run, others: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The run's measurements, then the other runs' (same block, same work), to
    ``MAX_ROUNDS`` in all, in an order fixed by the run's first sample."""
    spare = [m for m in others if m not in run.measurements]
    random.Random(repr(_values(run.measurements[0])[:3])).shuffle(spare)
    return (run.measurements + spare)[:MAX_ROUNDS]


def _values(recorded: dict[str, Any]) -> list[float]:
    """A recorded measurement's samples (either JSON layout of a measurement)."""
    samples = recorded["samples"]
    return list(samples["values"] if isinstance(samples, dict) else samples)


def measurements(recorded: list[dict[str, Any]], scale: float, follow: float,
                 memory_scale: float | None = None,
                 time_scale: float | None = None) -> list[Measured]:
    """The recorded measurements as the rule takes them, the compute control scaled by
    ``scale``, the memory control by ``memory_scale`` (default: ``scale``), the times by
    ``time_scale`` (default: ``scale ** follow``).  The noise probe's figures come with
    them (recorded from R44 on; before, none, and the replay cannot set a noisy measurement
    aside as the run did)."""
    times = scale ** follow if time_scale is None else time_scale
    memory = scale if memory_scale is None else memory_scale
    out = []
    for raw in recorded:
        m = from_dict(Measured, raw)
        values = tuple(v * times for v in m.samples.values)
        samples = Samples(values, tuple(c * scale for c in m.samples.control),
                          tuple(c * memory for c in m.samples.memory_control))
        out.append(dataclasses.replace(m, value=median_or_nan(values), samples=samples))
    return out


def judge(base: StoredMetric, measured: list[Measured]) -> tuple[str, int, str]:
    """(verdict, measurements used, detail): the rule asked one measurement at a time, as
    the plugin does (a measurement that can be repeated: ``can_confirm``)."""
    for k in range(1, len(measured) + 1):
        verdict, _, detail, more = rule.decide(base, measured[:k], TOLERANCE,
                                               can_confirm=True)
        if not more:
            return verdict, k, detail
    return "wanted more", len(measured), ""


def replay(data: dict[str, Any], metric: str, host_change: float, follow: float,
           memory_change: float | None = None, time_change: float | None = None,
           save_pick: list[int] | None = None, save_now: bool = False
           ) -> dict[float, collections.Counter[str]]:
    runs = list(compare_runs(data, metric))
    pool: dict[tuple[int, float], list[dict[str, Any]]] = collections.defaultdict(list)
    for run in runs:
        pool[(run.block, run.extra)] += run.measurements
    tally: dict[float, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for run in runs:
        measured = measurements(padded(run, pool[(run.block, run.extra)]), 1.0 + host_change,
                                follow, None if memory_change is None else 1.0 + memory_change,
                                None if time_change is None else 1.0 + time_change)
        base = (saved_now(run.base, run.saved, run.save_level)[0] if save_now
                else run.base if save_pick is None
                else rebuilt(run.base, run.saved, save_pick, run.save_level))
        tally[run.extra][judge(base, measured)[0]] += 1
    return tally


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, help="a --json file of verdict_quality.py (.gz too)")
    parser.add_argument("--metric", default="matmul.time_s",
                        help="the metric to replay (default: the controlled matmul loop)")
    parser.add_argument("--host-change", type=float, action="append", metavar="H",
                        help="the host this much slower at every compare run than at the "
                             "save (0.1: 10%% slower; negative: faster); repeatable "
                             "(default: 0, as recorded)")
    parser.add_argument("--follow", type=float, default=1.0,
                        help="how the times follow the host's change: 1 (default) in "
                             "proportion, 0 not at all")
    parser.add_argument("--memory-change", type=float, metavar="M",
                        help="the memory control this much slower (default: as the host)")
    parser.add_argument("--time-change", type=float, metavar="T",
                        help="the times this much slower (default: the host's change "
                             "followed at --follow)")
    parser.add_argument("--save-pick", action="append", metavar="I,J,...",
                        help="rebuild each baseline from these of its save's measurements "
                             "(indices from 0); repeatable (default: the baseline as stored)")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="judge at this tolerance (default 0.05: the line the "
                             "recordings were judged at)")
    parser.add_argument("--save-now", action="store_true",
                        help="rebuild each baseline as a save takes it now: its recorded "
                             "measurements in order until the save would stop")
    args = parser.parse_args(argv)
    global TOLERANCE
    TOLERANCE = args.tolerance
    picks: list[list[int] | None] = [None]
    if args.save_pick:
        try:
            picks = [[int(i) for i in p.split(",")] for p in args.save_pick]
        except ValueError:
            raise SystemExit(f"replay: --save-pick {args.save_pick}: indices, such as "
                             "0,1,2") from None
        if any(i < 0 for p in picks if p for i in p):
            raise SystemExit("replay: --save-pick: indices count from 0")
    for name in ("memory_change", "time_change"):
        value = getattr(args, name)
        if value is not None and value <= -1.0:
            raise SystemExit(f"replay: --{name.replace('_', '-')} {value} would leave "
                             "nothing at all")
    data = load_runs(args.runs)
    if not any(True for _ in compare_runs(data, args.metric)):
        raise SystemExit(f"replay: no compare run of {args.metric} with its measurements in "
                         f"{args.runs} (recorded before R33, or another --kind?)")
    print(f"replay of {args.runs} ({data.get('started', '?')}), {args.metric}, "
          f"follow {args.follow:g}")
    for h in args.host_change or [0.0]:
        if h <= -1.0:
            raise SystemExit(f"replay: --host-change {h} would leave no time at all")
        for pick in picks:
            tally = replay(data, args.metric, h, args.follow, args.memory_change,
                           args.time_change, pick, args.save_now)
            saved = ("  saved now" if args.save_now else "" if pick is None
                     else f"  save {','.join(map(str, pick))}")
            for extra in sorted(tally):
                counts = tally[extra]
                label = "clean" if extra == 0 else f"+{extra:.0%} work"
                total = sum(counts.values())
                key = (f"false alarms {counts['regressed']}/{total}" if extra == 0
                       else f"caught {counts['regressed']}/{total}")
                print(f"host {h:+.0%}{saved}  {label:>9}: {key}; "
                      + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
