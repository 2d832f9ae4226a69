"""What a save's own measurements say the gate can tell, against what it told.

For every save in recordings of ``verdict_quality.py --json`` or ``ddp_verdicts.py --json``
(benchmarks/data/), the baseline as stored: the spread of its measurements (the median
absolute deviation of each one's adjusted 25% quantile, in logs, read as a standard
deviation) and the smallest change that a test of six measurements against them would tell
nine times in ten (``pytest_distperf.verdict.rule.detectable``, which a save reports
in its detail), beside what the block's compare runs did: false alarms among the clean runs
and the slowdowns caught.

    python benchmarks/detectable.py benchmarks/data/r44.json.gz benchmarks/data/r69.json.gz
    python benchmarks/detectable.py benchmarks/data/r59.json.gz --metric step_time_s

Results: benchmarks/verdict_quality.md (R69).
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay

from pytest_distperf.verdict import rule

#: The controlled metric of each kind of recording, tried in this order.
METRICS = ("matmul.time_s", "all_reduce.4MiB.busbw_gbps", "step_time_s", "compute_time_s")


def blocks(data: dict[str, Any], metric: str) -> list[dict[str, Any]]:
    """Per save of ``metric``: its block, its baseline's detectable change, and the tally
    of the compare runs judged against it (by slowdown: verdict -> count)."""
    out: list[dict[str, Any]] = []
    tally: dict[float, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for run in replay.compare_runs(data, metric):
        if not out or run.base is not out[-1]["base"]:
            tally = collections.defaultdict(collections.Counter)
            out.append({"block": run.block, "base": run.base, "tally": tally,
                        "detectable": rule.detectable(run.base)})
        tally[run.extra][run.verdict] += 1
    return out


def line(name: str, metric: str, block: dict[str, Any]) -> str:
    d = block["detectable"]
    if d is None:
        told = "no controlled baseline"
    else:
        told = (f"{d.measurements:>2} measurements, spread {d.spread:6.1%}, "
                f"detectable {d.change:6.1%}")
    runs = []
    for extra, counts in sorted(block["tally"].items()):
        total = sum(counts.values())
        if extra == 0:
            runs.append(f"false alarms {counts['regressed']}/{total}")
        else:
            runs.append(f"{extra:+.0%} caught {counts['regressed']}/{total}")
    return f"{name:<12} {metric:<28} block {block['block']}: {told}; " + ", ".join(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="--json recordings (.gz too)")
    parser.add_argument("--metric", help="the metric (default: the recording's controlled "
                                          "one, the first of " + ", ".join(METRICS) + ")")
    args = parser.parse_args(argv)
    for path in args.runs:
        data = replay.load_runs(path)
        names = [args.metric] if args.metric else list(METRICS)
        found = False
        for metric in names:
            for block in blocks(data, metric):
                found = True
                print(line(path.name.split(".")[0], metric, block))
            if found and not args.metric:
                break
        if not found:
            print(f"{path.name}: no compare run of {' or '.join(names)} with a baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
