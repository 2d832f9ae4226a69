"""How long ``--distperf-save`` of 4 tests takes into a small module file and into a large one.

Each case runs pytest in a subprocess (2 gloo ranks, ``--distperf-save
--distperf-save-measurements 3``) on a module of 4 tests, each ``measure()`` of a 2 ms sleep,
whose baseline file holds beforehand either nothing (``small``) or other tests of 11
metrics each, about 14 MB: as version 1 (``v1``, as issue 39 measured it) or as version 2
(``v2``).  The wall time of the pytest run is printed per case.  ``--code DIR`` runs another
checkout's plugin (e.g. ``git archive`` of an older commit), which must read version 1.

    python benchmarks/save_speed.py                      # this checkout
    python benchmarks/save_speed.py --code /tmp/base --cases small v1 small v1

Results: benchmarks/save_speed.md.
"""

from __future__ import annotations

import argparse
import os
import random
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


def run_case(code: Path, case: str, other_tests: int) -> tuple[float, float]:
    """(seconds of the pytest run, MB of the file before it)."""
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
             "--gpus", "2", "--distperf-save", "--distperf-save-measurements", "3"],
            cwd=folder, env=env, capture_output=True, text=True, check=False)
        took = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"save_speed: {case} failed:\n{result.stdout[-3000:]}")
        return took, size


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
    for case in args.cases:
        took, size = run_case(args.code, case, args.other_tests)
        print(f"{case:>5}: file {size:5.1f} MB before, save of 4 tests {took:6.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
