"""What the default tolerance passes and catches: every recorded clean run, slowed.

Each recorded clean compare run (``benchmarks/data``, every kind) is judged again by the
rule as it is at the plugin's default tolerance (10%: a confirmed change larger than it
fails), as recorded and with every sample of its measurements made ``c`` slower (a
bandwidth ``c`` lower in time: divided by 1 + c), for ``c`` from 0 to 50%.  The share called
regressed at each ``c`` is the catch curve: what a slowdown of that size meets in CI on this
kind of host.  The recorded slowed runs (+10%, +20% more work) are shown beside it.

    python benchmarks/catch_curve.py                  # every recording, the default 10%
    python benchmarks/catch_curve.py --tolerance 0.05 --only r44

Results: benchmarks/catch_curve.md.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replay

from pytest_distperf.config import DEFAULT_TOLERANCE

DATA = Path(__file__).resolve().parent / "data"
BUSBW = "all_reduce.4MiB.busbw_gbps"
#: (recording, metric, what it is)
RECORDINGS = (
    ("r42", "matmul.time_s", "measure(): a 22 ms matmul loop"),
    ("r44", "matmul.time_s", "measure(): a 22 ms matmul loop"),
    ("r45", "matmul.time_s", "measure(), a noisy neighbour"),
    ("r47", BUSBW, "bench(): a 4 MiB gloo all-reduce"),
    ("r52", BUSBW, "bench(): a 4 MiB gloo all-reduce"),
    ("r61", BUSBW, "bench(), both controls"),
    ("r69", BUSBW, "bench(), saves of twelve"),
    ("r59", "step_time_s", "a GPT's DDP step"),
    ("r59", "compute_time_s", "its compute"),
    ("r72", "py.time_s", "micro: 0.13 ms of Python, busy neighbours"),
    ("r72", "mm.time_s", "micro: a 64x64 matmul loop, busy neighbours"),
    ("r72", "ar.time_s", "micro: a 64 KiB gloo all-reduce, busy neighbours"),
    ("r73", "py.time_s", "micro, the quiet VM: Python"),
    ("r73", "mm.time_s", "micro, the quiet VM: the matmul loop"),
    ("r73", "ar.time_s", "micro, the quiet VM: the all-reduce"),
    ("r74", "py.time_s", "micro, the quiet VM again: Python"),
    ("r74", "mm.time_s", "micro, the quiet VM again: the matmul loop"),
    ("r74", "ar.time_s", "micro, the quiet VM again: the all-reduce"),
    ("r75", "py.time_s", "micro, the quiet VM a third time: Python"),
    ("r75", "mm.time_s", "micro, the quiet VM a third time: the matmul loop"),
    ("r75", "ar.time_s", "micro, the quiet VM a third time: the all-reduce"),
    ("r76", "py.time_s", "micro, the quiet VM a fourth time: Python"),
    ("r76", "mm.time_s", "micro, the quiet VM a fourth time: the matmul loop"),
    ("r76", "ar.time_s", "micro, the quiet VM a fourth time: the all-reduce"),
)
CHANGES = (0.0, 0.05, 0.10, 0.15, 0.20, 0.25, 0.35, 0.50)


def curve(name: str, metric: str) -> tuple[dict[float, collections.Counter[str]],
                                            dict[float, collections.Counter[str]]]:
    """(the clean runs at each slowdown, the recorded runs by their work)."""
    data = replay.load_runs(DATA / f"{name}.json.gz")
    rate = metric == BUSBW
    slowed: dict[float, collections.Counter[str]] = {}
    for c in CHANGES:
        # a slower rate is a lower one: the time it stands for 1 + c longer
        scale = 1.0 / (1.0 + c) - 1.0 if rate else c
        tally = replay.replay(data, metric, 0.0, 1.0, time_change=scale)
        slowed[c] = tally.get(0.0, collections.Counter())
    return slowed, replay.replay(data, metric, 0.0, 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"judge at this tolerance (default {DEFAULT_TOLERANCE})")
    parser.add_argument("--only", action="append", metavar="RECORDING",
                        help="these recordings (r44, ...; repeatable)")
    args = parser.parse_args(argv)
    replay.TOLERANCE = args.tolerance
    started = time.monotonic()
    print(f"tolerance {args.tolerance:g}: the share of clean runs called regressed when made "
          "c slower, and the recorded slowed runs\n")
    print("| recording | metric | what | clean | " + " | ".join(
        f"+{c:.0%}" for c in CHANGES[1:]) + " | recorded +10% | recorded +20% |")
    print("| --- " * (6 + len(CHANGES)) + "|")
    for name, metric, what in RECORDINGS:
        if args.only and name not in args.only:
            continue
        slowed, recorded = curve(name, metric)

        def share(counts: collections.Counter[str], key: str = "regressed") -> str:
            total = sum(counts.values())
            # a recording of runs that stopped early may hold fewer measurements than a
            # slowed run would take: those are short, not missed
            short = f" ({counts['wanted more']} short)" if counts["wanted more"] else ""
            return f"{counts[key]}/{total}{short}" if total else "-"

        clean = slowed[0.0]
        cells = [f"{share(clean)} (inc. {clean['inconclusive']})"]
        cells += [share(slowed[c]) for c in CHANGES[1:]]
        cells += [share(recorded.get(e, collections.Counter())) for e in (0.1, 0.2)]
        print(f"| {name} | `{metric}` | {what} | " + " | ".join(cells) + " |", flush=True)
    print(f"\n{time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
