"""How long ``--distperf-save`` of 4 tests takes into a small module file and into a large one.

Each case runs pytest in a subprocess (2 gloo ranks, ``--distperf-save
--distperf-save-measurements 3``) on a module of 4 tests, each ``measure()`` of a 2 ms sleep,
whose baseline file holds beforehand either nothing (``small``) or other tests of 11
metrics each, about 14 MB: as version 1 (``v1``, as issue 39 measured it) or as version 2
(``v2``).  Printed per run: its wall time, split into the 4 tests' calls (their
measurements: how many the saves took, how many the noise probe called noisy, which the other
processes' load decides) and the rest (the pool's start, the file's read and its write);
then each large case against the small runs.  ``--code DIR`` runs another checkout's plugin
(e.g. ``git archive`` of an older commit), which must read version 1.

    python benchmarks/save_speed.py                      # this checkout
    python benchmarks/save_speed.py --code /tmp/base --cases small v1 small v1

Results: benchmarks/save_speed.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
TESTS = "\n".join(f"""
def test_{i}(nccl_group):
    nccl_group.measure("nap{i}", time.sleep, 0.002, iters=10, warmup=1)
""" for i in range(4))
#: Other processes' share of the CPUs past which the noise probe calls a measurement noisy.
NOISY = 0.10
ENV_ID = "gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc"
ENV = {"backend": "gloo", "device_type": "cpu", "device_model": "AMD EPYC",
       "device_count": 0, "world_size": 2, "torch_version": "2.13.0+cpu", "nccl_version": "",
       "cpu_cores": 2, "threads_per_rank": 1, "bound_cores": 0}


def v1_metric(rng: random.Random, n: int) -> dict[str, Any]:
    """A controlled time of ``n`` samples as version 1 stored it (six digits)."""
    samples = [round(rng.uniform(0.02, 0.03), 6) for _ in range(n)]
    return {"unit": "s", "higher_is_better": False, "value": samples[0], "estimate": samples[0],
            "median": samples[0], "min": min(samples), "max": max(samples), "n": n,
            "steal": 0.0, "cpu_wait": 0.1, "other_load": 0.0, "samples": samples,
            "control": [round(rng.uniform(0.002, 0.003), 6) for _ in range(n)],
            "memory_control": [round(rng.uniform(0.001, 0.002), 6) for _ in range(n)],
            "measurements": [20] * (n // 20)}


def v1_file(tests: int) -> str:
    """A version-1 module file of ``tests`` DDP-step-like tests (11 metrics: two times of
    240 samples with controls, four of 20, five exact counts)."""
    rng = random.Random(39)
    data: dict[str, Any] = {"schema_version": 1, "module": "test_speed.py",
                            "environments": {ENV_ID: ENV}, "tests": {}}
    for t in range(tests):
        metrics = {f"time{k}_s": v1_metric(rng, 240 if k < 2 else 20) for k in range(6)}
        metrics.update({f"comm.op{k}.calls": {"unit": "calls/step", "higher_is_better": False,
                                              "value": k, "kind": "exact"}
                        for k in range(5)})
        data["tests"][f"test_other_{t}"] = {ENV_ID: {"saved": "2026-11-01T00:00:00Z",
                                                     "metrics": metrics}}
    return tomli_w.dumps(data)


def as_v2(path: Path) -> None:
    """Rewrite the version-1 file at ``path`` as version 2 (this checkout's store)."""
    sys.path.insert(0, str(ROOT))
    from pytest_distperf.verdict import store

    store.save_tests(path, "test_speed.py", [])  # a save of nothing rewrites it as version 2


@dataclasses.dataclass(frozen=True)
class Run:
    """One pytest run of a case: its seconds, and where they went."""

    case: str
    mb: float  # the size of the file before the run
    seconds: float  # the whole pytest run
    calls: float  # the 4 tests' calls: their measurements and re-measurements
    first_setup: float  # the first test's setup: the rank pool started, the file read
    last_teardown: float  # the last test's teardown: the file written
    measurements: int  # taken by the 4 saves together
    noisy: int  # of them, those the noise probe called noisy (other processes' load)

    @property
    def outside(self) -> float:
        """The seconds outside the calls: what the file's size can change."""
        return self.seconds - self.calls

    def line(self) -> str:
        return (f"{self.case:>5}: file {self.mb:5.1f} MB, run {self.seconds:5.1f} s = calls "
                f"{self.calls:5.1f} s ({self.measurements} measurements, {self.noisy} noisy) "
                f"+ outside them {self.outside:4.1f} s (first setup {self.first_setup:.1f} s, "
                f"last teardown {self.last_teardown:.1f} s)")


def durations(out: str) -> dict[tuple[str, str], float]:
    """``--durations=0``'s lines: (phase, test) -> seconds."""
    return {(phase, test): float(secs) for secs, phase, test in
            re.findall(r"^([0-9.]+)s (setup|call|teardown) +\S+::(\S+)$", out, re.MULTILINE)}


def measurements(report: Path) -> tuple[int, int]:
    """(measurements, noisy ones) of the saves in a ``--distperf-json`` report."""
    taken = [m for test in json.loads(report.read_text())["tests"]
             for verdict in test["verdicts"] for m in verdict["measurements"]]
    return len(taken), sum((m.get("other_load") or 0.0) > NOISY for m in taken)


def run_case(code: Path, case: str, other_tests: int) -> Run:
    """One pytest run of ``case``."""
    with tempfile.TemporaryDirectory(prefix="distperf-save-speed-") as tmp:
        folder = Path(tmp)
        (folder / "pytest.ini").write_text("[pytest]\n")
        (folder / "test_speed.py").write_text("import time\n" + TESTS)
        baselines = folder / "perf_baselines" / "test_speed.toml"
        baselines.parent.mkdir()
        if case != "small":  # as many tests as make about 14 MB in the case's version
            baselines.write_text(v1_file(other_tests if case == "v1" else other_tests * 10 // 7))
            if case == "v2":
                as_v2(baselines)
        size = baselines.stat().st_size / 1e6 if baselines.exists() else 0.0
        env = {**os.environ, "PYTHONPATH": str(code)}
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--distperf",
             "--gpus", "2", "--distperf-save", "--distperf-save-measurements", "3",
             "--durations=0", f"--distperf-json={folder / 'report.json'}"],
            cwd=folder, env=env, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"save_speed: {case} failed:\n{result.stdout[-3000:]}")
        phases = durations(result.stdout)
        taken, noisy = measurements(folder / "report.json")
        return Run(case, size, took, sum(v for (ph, _), v in phases.items() if ph == "call"),
                   phases.get(("setup", "test_0"), 0.0),
                   phases.get(("teardown", "test_3"), 0.0), taken, noisy)


def summary(runs: list[Run]) -> list[str]:
    """Each large case against the small runs: the whole runs (their medians), and like for
    like: the file's cost (the medians of the time outside the calls, one less the other)
    added to the small run with the fewest measurements, against that run.  The calls take
    what the other processes' load makes the saves re-measure, whatever the file."""
    small = [r for r in runs if r.case == "small"]
    if not small:
        return []
    quiet = min(small, key=lambda r: (r.measurements, r.seconds))
    lines = []
    for case in sorted({r.case for r in runs} - {"small"}):
        large = [r for r in runs if r.case == case]
        cost = (statistics.median(r.outside for r in large)
                - statistics.median(r.outside for r in small))
        whole = statistics.median(r.seconds for r in large) / statistics.median(
            r.seconds for r in small)
        lines.append(f"{case} / small: runs {whole:.2f}x (medians of {len(large)} and "
                     f"{len(small)}); the file costs {cost:+.1f} s outside the calls: "
                     f"{(quiet.seconds + cost) / quiet.seconds:.2f}x the small run of "
                     f"{quiet.measurements} measurements ({quiet.seconds:.1f} s)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout to run")
    parser.add_argument("--cases", nargs="+", default=["small", "v2", "small", "v2", "v1"],
                        choices=["small", "v1", "v2"], help="run in this order (repeats: "
                        "a shared machine's load moves the figures)")
    parser.add_argument("--other-tests", type=int, default=530,
                        help="tests in the large version-1 file (530: 14 MB; version 2: "
                             "10/7 as many, 14 MB too)")
    args = parser.parse_args(argv)
    runs = []
    for case in args.cases:
        runs.append(run_case(args.code, case, args.other_tests))
        print(runs[-1].line(), flush=True)
    for line in summary(runs):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
