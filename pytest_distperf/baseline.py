"""Baselines: load, compare, save; and the statistics of a verdict.  No torch, no pytest.

Storage: one TOML file per test module under the baseline folder (``perf_baselines/``),
``tests/perf/test_x.py`` -> ``perf_baselines/tests/perf/test_x.toml``.  Per test, per
environment (backend, device model and count, world size, torch and NCCL versions), per
metric: the direction, a few summary figures for reviewers, the noise seen while measuring,
and the samples the comparison needs.  Written with ``tomli_w`` (keys sorted, one sample per
line), atomically (temp file + ``os.replace``), read-merge-written under an exclusive lock of
the folder so that pytest-xdist workers saving at once lose nothing.  A file that cannot be
read is an error naming the file and the line, and is never written over.

The verdict rule (docs/baselines.md has the evidence behind each constant):

1. Estimator: noise on a shared machine only makes a run slower, never faster, so a metric is
   judged by its *good-side quantile* (``ESTIMATOR_QUANTILE`` of the samples for a time, the
   mirror quantile for a bandwidth) instead of the median, which carries the noise.
2. Decision line: the tolerance (default 10%) is the change the gate must catch.  A change is
   *suspected* when the estimate is worse by at least half of it (the midpoint between "no
   change" and "a change of the tolerance") and by the minimum absolute delta (fractions:
   ``MIN_FRACTION_POINTS`` points as well, so that 0.02 -> 0.04 is no regression).
3. Confirmation: a suspected regression is measured again on the same ranks
   (``CONFIRMATIONS`` times, growing pauses apart); the best window counts, since noise cannot make
   work faster.
4. Evidence: it is a *regression* only when the best of those windows is still past the
   line, a one-sided Mann-Whitney U test of the better halves of the samples says current is
   slower than the baseline at ``ALPHA``, and that window was quiet: the noise probe
   (:mod:`pytest_distperf.noise`: host steal, CPU wait of the ranks) under its limits and
   the sample spread under ``SPREAD_LIMIT``.  Past the line but never quiet or never
   significant: *inconclusive*, with the figures.

Times with a host-speed control (``measure()`` on CPU ranks: every sample has the time of a
fixed piece of work run right after it on all ranks, :mod:`pytest_distperf.timing`) are
judged after taking out the part of their variation that follows the control (an analysis
of covariance, as CUPED does for A/B tests):

* both sides pool ``CONTROL_WINDOWS`` measurements (the baseline keeps all of its
  measurements' samples, and their sizes);
* a measurement's control level is the 25% quantile of its controls (another process's
  time slices hit a few of them; a slower host all of them);
* the slope: how strongly the time follows the control, fitted on the measurements' median
  times against their control levels in log space, each side centred on its own median (so
  that a regression between the sides does not enter it), clipped to [0, 1].  0.3-1.0 for
  a matmul loop here (median 0.74), 0 for a sleep;
* each sample becomes ``log(time) - slope * log(control level)``; the change is the
  difference of the two sides' 25% quantiles, back in relative terms;
* a first measurement worse by a quarter of the tolerance is measured again until there are
  ``CONTROL_WINDOWS``; then it is a regression when the pooled change is past the line and a
  one-sided Mann-Whitney test of the adjusted samples agrees at ``ALPHA``.  The noise probe
  and the spread limit still set noisy measurements aside; and since another process can
  push an adjusted time either way, a noisy measurement clears and improves nothing: with
  no quiet one the verdict is inconclusive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_distperf.config import DEFAULT_THRESHOLDS
from pytest_distperf.files import write_atomically
from pytest_distperf.noise import NoiseFigures
from pytest_distperf.records import Environment, Metric, Verdict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

#: The layout version of a baseline file; a file of another version is refused, untouched.
SCHEMA_VERSION = 1
DEFAULT_DIRNAME = "perf_baselines"

REGRESSED = "regressed"
IMPROVED = "improved"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
NO_BASELINE = "no baseline"
NOT_COMPARABLE = "not comparable"
SAVED = "saved"
#: The order verdicts are listed in (the summary shows regressions first).
VERDICT_ORDER = (REGRESSED, INCONCLUSIVE, IMPROVED, NOT_COMPARABLE, NO_BASELINE, UNCHANGED,
                 SAVED)

#: Good-side quantile of the samples that a time is judged by (0.95 for higher-is-better):
#: all but the minimum, so that one odd sample cannot decide.
ESTIMATOR_QUANTILE = 0.05
#: A change is suspected at this fraction of the tolerance (the midpoint between 0 and it).
DECISION_FRACTION = 0.5
#: One-sided Mann-Whitney U significance a regression or an improvement needs.
ALPHA = 0.01
#: Fewer samples than this (in either side's better half, for the test): the metric's value
#: stands for them, and no test is made (point estimates and confirmation only).
MIN_SAMPLES = 5
#: A window whose samples spread more than this ((median - estimate) / estimate) is too noisy.
SPREAD_LIMIT = 0.5
#: Fractions (unit "fraction") must also move by this many absolute points.
MIN_FRACTION_POINTS = 0.05
#: Smallest absolute change that can count, by unit: microsecond noise never fails a build.
MIN_ABS_DELTA = {"s": 5e-6, "ms": 5e-3, "us": 5.0, "ns": 5e3}
#: Re-measurements that must all still be past the line before a regression is called:
#: this machine's host has slow spells of a few seconds (every timing 20-25% slower, with no
#: steal and no CPU wait to show for it); four measurements in a row rarely all fall in one.
CONFIRMATIONS = 3
#: Re-measurements at most to confirm (or clear) a suspected regression.
CONFIRM_ROUNDS = 3
#: Seconds before each confirming re-measurement: growing, so that the four measurements of
#: a regression span about 9 s, longer than this host's slow spells (4 s was not: 4 false
#: alarms in 30 clean runs).
CONFIRM_PAUSES_S = (1.0, 2.0, 4.0)
#: A saved baseline is the best of this many measurements...
SAVE_WINDOWS = 4
#: ... and of up to this many while the best one is too noisy...
SAVE_MAX_WINDOWS = 6
#: ... this many seconds apart...
SAVE_PAUSE_S = 0.5
#: ... or longer after a window that was too noisy (by round): another job's burst of work
#: often ends within seconds.
NOISY_BACKOFF_S = (0.5, 1.0, 2.0)
#: Times with a host-speed control: measurements pooled on each side (baseline and current)
#: before a regression is called.  Replayed on recorded windows of a matmul loop on this
#: machine (docs/baselines.md), six a side: 1-2% of clean comparisons false-alarmed and 90%
#: of 10% slowdowns were caught; four a side: 2% and 86%.
CONTROL_WINDOWS = 6
#: ... re-measured only when the first measurement is worse by this fraction of the tolerance
CONTROL_SCREEN_FRACTION = 0.25
#: ... this many seconds apart: the host's speed changes from one second to the next, and
#: measurements spread over a few seconds average over it.
CONTROL_PAUSE_S = 1.0
#: ... judged by this quantile of the adjusted samples (noise from other processes only
#: pushes times up, as for the plain rule; the median false-alarmed 4x as often on recorded
#: windows)...
CONTROL_ESTIMATOR_QUANTILE = 0.25
#: ... against this quantile of each measurement's controls (its host-speed level).
CONTROL_LEVEL_QUANTILE = 0.25
#: Re-measurement rounds of one test at most (confirmations, or a save's measurements).
MAX_ROUNDS = max(CONFIRM_ROUNDS, SAVE_MAX_WINDOWS, CONTROL_WINDOWS) + 1
#: Threshold keys an environment's ``thresholds`` table may hold.
THRESHOLD_KEYS = (*DEFAULT_THRESHOLDS, "tolerance")

_ENV_FIELDS: tuple[tuple[str, type], ...] = (
    ("backend", str), ("device_type", str), ("device_model", str), ("device_count", int),
    ("world_size", int), ("torch_version", str), ("nccl_version", str),
)


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the line."""

    def __init__(self, path: Path, line: int | None, problem: str, advice: str = "") -> None:
        where = f"{path}:{line}" if line else str(path)
        advice = advice or ("fix or delete it; the file was left unchanged (it is never "
                            "written over, not even by --distperf-save)")
        super().__init__(f"distperf: bad baseline file {where}: {problem}; {advice}")
        self.path = path
        self.line = line


# -- names and places ------------------------------------------------------------------------
def split_nodeid(nodeid: str) -> tuple[str, str]:
    """``("tests/test_x.py", "TestA::test_b[1]")`` from a pytest node id."""
    module, _, test = nodeid.partition("::")
    return module, test or module


def baseline_path(root: Path, nodeid: str) -> Path:
    """The file holding the baselines of ``nodeid``'s module, under ``root``."""
    module, _ = split_nodeid(nodeid)
    parts = [("__" if p == ".." else p) for p in Path(module).parts if p not in ("/", ".")]
    relative = Path(*parts) if parts else Path("tests")
    return root / relative.with_suffix(".toml")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def environment_id(env: Environment) -> str:
    """The key an environment's baselines live under, e.g.
    ``gloo-cpu-w2-torch2.13.0-amd-epyc`` or ``nccl-cuda-w8-torch2.6.0-nccl2.21.5-nvidia-h100``.
    """
    return f"{env.key()}-{_slug(env.device_model)}"


def _env_table(env: Environment) -> dict[str, Any]:
    return {name: getattr(env, name) for name, _ in _ENV_FIELDS}


def _same_environment(stored: Mapping[str, Any], env: Environment) -> str:
    """Empty when ``stored`` describes ``env``; else what differs."""
    differences = []
    for name, _ in _ENV_FIELDS:
        mine, theirs = getattr(env, name), stored.get(name)
        if name == "torch_version":  # the local build tag (+cpu, +cu124) is not compared
            mine, theirs = str(mine).split("+")[0], str(theirs).split("+")[0]
        if mine != theirs:
            differences.append(f"{name} {theirs!r} there, {mine!r} here")
    return "; ".join(differences)


# -- the stored figures ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class StoredMetric:
    """One metric's baseline: what the comparison needs (the rest of its table is for
    reviewers and is recomputed from the samples)."""

    unit: str
    higher_is_better: bool
    value: float
    samples: tuple[float, ...] = ()
    steal: float | None = None
    wait: float | None = None
    control: tuple[float, ...] = ()  # the host-speed control, one per sample, or ()
    measurements: tuple[int, ...] = ()  # sizes of the pooled measurements (sum: len(samples))

    @property
    def is_fraction(self) -> bool:
        return self.unit == "fraction"

    def parts(self) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
        """(samples, control) of each pooled measurement (all of them as one without sizes)."""
        return _split(self.samples, self.control, self.measurements)


@dataclasses.dataclass(frozen=True, slots=True)
class Window:
    """One measurement of a metric, with what the noise probe saw during it."""

    value: float
    samples: tuple[float, ...] = ()
    noise: NoiseFigures | None = None
    control: tuple[float, ...] = ()  # one per sample, or ()
    sizes: tuple[int, ...] = ()  # the measurements a pooled window is made of, or ()

    @classmethod
    def of(cls, metric: Metric, noise: NoiseFigures | None) -> Window:
        """The metric's figures (samples that are not finite numbers are left out, with
        their controls; a control that is not a positive number drops the control)."""
        if metric.control and len(metric.control) == len(metric.samples):
            pairs = [(v, c) for v, c in zip(metric.samples, metric.control, strict=True)
                     if math.isfinite(v) and math.isfinite(c)]
            if all(c > 0 for _, c in pairs):
                return cls(metric.value, tuple(v for v, _ in pairs), noise,
                           tuple(c for _, c in pairs))
        return cls(metric.value, tuple(v for v in metric.samples if math.isfinite(v)), noise)


def _round(value: float) -> float:
    """Six significant digits: well below any noise, and short lines in the file."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def stored_metric_table(metric: StoredMetric) -> dict[str, Any]:
    """The TOML table of one metric (keys in a fixed, readable order)."""
    table: dict[str, Any] = {
        "unit": metric.unit,
        "higher_is_better": metric.higher_is_better,
        "value": _round(metric.value),
    }
    if len(metric.samples) >= 1:
        samples = np.asarray(metric.samples, dtype=float)
        table["estimate"] = _round(estimate(metric.samples, metric.value,
                                            metric.higher_is_better, metric.is_fraction))
        table["median"] = _round(float(np.median(samples)))
        table["min"] = _round(float(samples.min()))
        table["max"] = _round(float(samples.max()))
        table["n"] = len(metric.samples)
    if metric.steal is not None:
        table["steal"] = round(metric.steal, 4)
    if metric.wait is not None:
        table["cpu_wait"] = round(metric.wait, 4)
    table["samples"] = [_round(v) for v in metric.samples]
    if metric.control:
        table["control"] = [_round(v) for v in metric.control]
    if len(metric.measurements) > 1:
        table["measurements"] = list(metric.measurements)
    return table


# -- reading ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class BaselineFile:
    """A parsed, validated baseline file."""

    path: Path
    data: dict[str, Any]

    def environments(self) -> dict[str, dict[str, Any]]:
        return dict(self.data.get("environments", {}))

    def thresholds(self, env_id: str) -> dict[str, float]:
        """The environment's ``thresholds`` table (threshold overrides and ``tolerance``)."""
        table = self.data.get("environments", {}).get(env_id, {}).get("thresholds", {})
        return {k: float(v) for k, v in table.items()}

    def test_environments(self, test: str) -> list[str]:
        return sorted(self.data.get("tests", {}).get(test, {}))

    def metrics(self, test: str, env_id: str) -> dict[str, StoredMetric] | None:
        entry = self.data.get("tests", {}).get(test, {}).get(env_id)
        if entry is None:
            return None
        out = {}
        for name, table in entry.get("metrics", {}).items():
            out[name] = StoredMetric(
                unit=table["unit"], higher_is_better=table["higher_is_better"],
                value=float(table["value"]),
                samples=tuple(float(v) for v in table.get("samples", ())),
                steal=_opt_float(table.get("steal")), wait=_opt_float(table.get("cpu_wait")),
                control=tuple(float(v) for v in table.get("control", ())),
                measurements=tuple(int(v) for v in table.get("measurements", ())))
        return out


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _line_of(text: str, keys: Sequence[str]) -> int | None:
    """Best effort: the line where the key path ``keys`` appears (1-based)."""
    lines = text.splitlines()
    start, found = 0, None
    for key in keys:
        # the key as a whole dotted component of a header, or as an assignment
        pattern = re.compile(r'(^|[.\[\s"])' + re.escape(key) + r'($|[.\]\s"=])')
        for i in range(start, len(lines)):
            if pattern.search(lines[i]):
                found, start = i + 1, i  # the next key may sit on the same header line
                break
        else:
            break
    return found


def load(path: Path) -> BaselineFile | None:
    """The baseline file at ``path``; None when there is none; BaselineError when bad."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BaselineError(path, None, f"cannot be read ({exc.strerror or exc})") from None
    return parse(path, raw)


def parse(path: Path, raw: bytes) -> BaselineFile:
    """Validate the bytes of a baseline file; BaselineError (file and line) when bad."""
    if not raw.strip():
        raise BaselineError(path, 1, "the file is empty (a baseline file starts with "
                                     f"schema_version = {SCHEMA_VERSION})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(path, raw[: exc.start].count(b"\n") + 1, "not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise BaselineError(path, int(match.group(1)) if match else None,
                            f"not valid TOML ({exc})") from None
    _validate(path, text, data)
    return BaselineFile(path, data)


def _validate(path: Path, text: str, data: dict[str, Any]) -> None:
    def fail(keys: Sequence[str], problem: str, advice: str = "") -> BaselineError:
        return BaselineError(path, _line_of(text, keys) or 1, problem, advice)

    version = data.get("schema_version")
    if version is None:
        raise fail([], "not a pytest-distperf baseline file (no schema_version key)")
    if isinstance(version, bool) or not isinstance(version, int):
        raise fail(["schema_version"], f"schema_version must be an integer, got {version!r}")
    if version < SCHEMA_VERSION:
        raise fail(["schema_version"],
                   f"stale schema version {version} (this pytest-distperf reads version "
                   f"{SCHEMA_VERSION})",
                   "move it aside and run with --distperf-save to write current baselines; "
                   "the file was left unchanged")
    if version > SCHEMA_VERSION:
        raise fail(["schema_version"],
                   f"schema version {version} was written by a newer pytest-distperf (this "
                   f"one reads version {SCHEMA_VERSION})",
                   "upgrade pytest-distperf; the file was left unchanged")
    envs = data.get("environments", {})
    if not isinstance(envs, dict):
        raise fail(["environments"], "'environments' must be a table")
    for env_id, env in envs.items():
        if not isinstance(env, dict):
            raise fail(["environments", env_id], f"environment {env_id!r} must be a table")
        for name, kind in _ENV_FIELDS:
            value = env.get(name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise fail(["environments", env_id],
                           f"environment {env_id!r}: {name} must be a {kind.__name__}, "
                           f"got {value!r}")
        limits = env.get("thresholds", {})
        if not isinstance(limits, dict):
            raise fail(["environments", env_id, "thresholds"],
                       f"environment {env_id!r}: thresholds must be a table")
        for key, value in limits.items():
            if key not in THRESHOLD_KEYS:
                raise fail(["environments", env_id, "thresholds", key],
                           f"environment {env_id!r}: unknown threshold {key!r} (valid: "
                           f"{', '.join(THRESHOLD_KEYS)})")
            if not _is_number(value) or not value >= 0:
                raise fail(["environments", env_id, "thresholds", key],
                           f"environment {env_id!r}: {key} must be a number >= 0, got {value!r}")
    tests = data.get("tests", {})
    if not isinstance(tests, dict):
        raise fail(["tests"], "'tests' must be a table")
    for test, per_env in tests.items():
        if not isinstance(per_env, dict):
            raise fail(["tests", test], f"test {test!r} must be a table of environments")
        for env_id, entry in per_env.items():
            where = [test, env_id]
            if env_id not in envs:
                raise fail(where, f"test {test!r} has results for environment {env_id!r}, "
                                  "which is not described under [environments]")
            metrics = entry.get("metrics") if isinstance(entry, dict) else None
            if not isinstance(metrics, dict):
                raise fail(where, f"test {test!r}, environment {env_id!r}: no metrics table")
            for name, table in metrics.items():
                _validate_metric(fail, [*where, name], f"{test} / {env_id} / {name}", table)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _validate_metric(fail: Any, keys: list[str], label: str, table: Any) -> None:
    if not isinstance(table, dict):
        raise fail(keys, f"metric {label} must be a table")
    if not isinstance(table.get("unit"), str):
        raise fail([*keys, "unit"], f"metric {label}: unit must be a string")
    if not isinstance(table.get("higher_is_better"), bool):
        raise fail([*keys, "higher_is_better"],
                   f"metric {label}: higher_is_better must be true or false")
    if not _is_number(table.get("value")):
        raise fail([*keys, "value"], f"metric {label}: value must be a finite number, "
                                     f"got {table.get('value')!r}")
    samples = table.get("samples", [])
    if not isinstance(samples, list) or not all(_is_number(v) for v in samples):
        raise fail([*keys, "samples"], f"metric {label}: samples must be a list of numbers")
    for key in ("steal", "cpu_wait"):
        if key in table and not _is_number(table[key]):
            raise fail([*keys, key], f"metric {label}: {key} must be a number")
    control = table.get("control")
    if control is not None and (not isinstance(control, list) or len(control) != len(samples)
                                or not all(_is_number(v) and v > 0 for v in control)):
        raise fail([*keys, "control"], f"metric {label}: control must be a list of positive "
                                       "numbers, one per sample")
    sizes = table.get("measurements")
    if sizes is not None and (not isinstance(sizes, list) or sum(sizes) != len(samples)
                              or not all(isinstance(v, int) and v > 0 for v in sizes)):
        raise fail([*keys, "measurements"], f"metric {label}: measurements must list the "
                                            "sizes of the pooled measurements, adding up to "
                                            "the number of samples")


# -- writing ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class SaveEntry:
    """What one test measured in one environment, to be written as its baseline there."""

    environment: Environment
    metrics: Mapping[str, StoredMetric]


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory`` (flock on its descriptor: no lock files to commit).

    Where there is no ``fcntl`` (Windows) saves are not serialised between processes.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def save_test(path: Path, module: str, test: str, entries: Sequence[SaveEntry],
              saved_at: str | None = None) -> None:
    """Write ``test``'s baselines for the given environments into ``path``.

    Read-merge-write under the folder's lock: other tests, other environments and every
    environment's ``thresholds`` table are kept.  A file that cannot be read raises
    BaselineError and is not touched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = saved_at or datetime.datetime.now(datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    with _locked(path.parent):
        current = load(path)
        data: dict[str, Any] = dict(current.data) if current is not None else {}
        data["schema_version"] = SCHEMA_VERSION
        data["module"] = module
        envs: dict[str, Any] = dict(data.get("environments", {}))
        tests: dict[str, Any] = dict(data.get("tests", {}))
        per_env: dict[str, Any] = dict(tests.get(test, {}))
        for entry in entries:
            env_id = environment_id(entry.environment)
            table = _env_table(entry.environment)
            if "thresholds" in envs.get(env_id, {}):
                table["thresholds"] = envs[env_id]["thresholds"]
            envs[env_id] = table
            per_env[env_id] = {
                "saved": stamp,
                "metrics": {name: stored_metric_table(m)
                            for name, m in sorted(entry.metrics.items())},
            }
        tests[test] = per_env
        data["environments"] = envs
        data["tests"] = tests
        write_atomically(path, tomli_w.dumps(_sorted(data)))


def _sorted(data: dict[str, Any]) -> dict[str, Any]:
    """Stable ordering: the file's header keys first, then sorted environments and tests;
    a metric table keeps its own readable order."""
    out: dict[str, Any] = {"schema_version": data["schema_version"], "module": data["module"]}
    for key in sorted(k for k in data if k not in ("schema_version", "module", "environments",
                                                   "tests")):
        out[key] = data[key]
    out["environments"] = {
        env_id: {**{k: v for k, v in env.items() if k != "thresholds"},
                 **({"thresholds": dict(sorted(env["thresholds"].items()))}
                    if "thresholds" in env else {})}
        for env_id, env in sorted(data["environments"].items())
    }
    out["tests"] = {
        test: {env_id: {"saved": entry.get("saved", ""),
                        "metrics": dict(sorted(entry["metrics"].items()))}
               for env_id, entry in sorted(per_env.items())}
        for test, per_env in sorted(data["tests"].items())
    }
    return out


# -- statistics ------------------------------------------------------------------------------
def estimate(samples: Sequence[float], value: float, higher_is_better: bool,
             fraction: bool) -> float:
    """The figure a metric is judged by.

    Times and bandwidths: the good-side quantile of the samples (noise only pushes one way).
    Fractions, and metrics with fewer than ``MIN_SAMPLES`` samples: the metric's own value
    (a ratio of two noisy times has no good side).
    """
    if fraction or len(samples) < MIN_SAMPLES:
        return float(value)
    q = 1.0 - ESTIMATOR_QUANTILE if higher_is_better else ESTIMATOR_QUANTILE
    return float(np.quantile(np.asarray(samples, dtype=float), q))


def selection_figure(window: Window, higher_is_better: bool, fraction: bool) -> float:
    """What the windows of a save are ranked by: the median of the better half of the
    samples (the 25% quantile of a time), or the value where there are too few."""
    if fraction or len(window.samples) < MIN_SAMPLES:
        return float(window.value)
    q = 0.75 if higher_is_better else 0.25
    return float(np.quantile(np.asarray(window.samples, dtype=float), q))


def spread(samples: Sequence[float], higher_is_better: bool) -> float | None:
    """How far the median sits from the estimate, relative: (median - p10) / p10 for a time.
    None with too few samples."""
    if len(samples) < MIN_SAMPLES:
        return None
    good = estimate(samples, 0.0, higher_is_better, False)
    if good == 0:
        return None
    return abs(float(np.median(np.asarray(samples, dtype=float))) - good) / abs(good)


def good_half(samples: Sequence[float], higher_is_better: bool) -> list[float]:
    """The better half of the samples (the faster for a time), which the test compares:
    the slow half of a time is where the noise lives, and it would drown the signal."""
    ordered = sorted(samples, reverse=higher_is_better)
    return ordered[: (len(ordered) + 1) // 2]


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n with ties averaged, and the sizes of the tie groups."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    ranks = np.empty(len(values), dtype=float)
    ties = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        ties.append(j - i + 1)
        i = j + 1
    return ranks, np.asarray(ties, dtype=float)


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value that ``x`` tends to be larger than ``y`` (Mann-Whitney U, normal
    approximation with tie and continuity corrections; fine from 5 samples a side)."""
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return 1.0
    ranks, ties = _average_ranks(np.concatenate([np.asarray(x, float), np.asarray(y, float)]))
    u = float(ranks[:nx].sum()) - nx * (nx + 1) / 2
    n = nx + ny
    tie_term = float((ties**3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    variance = nx * ny / 12 * ((n + 1) - tie_term)
    if variance <= 0:
        return 0.5
    z = (u - nx * ny / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def min_abs_delta(unit: str) -> float:
    if unit == "fraction":
        return MIN_FRACTION_POINTS
    return MIN_ABS_DELTA.get(unit, 0.0)


@dataclasses.dataclass(frozen=True, slots=True)
class Assessment:
    """One window compared with the baseline."""

    baseline: float
    current: float
    change: float | None  # (current - baseline) / |baseline|; None when the baseline is 0
    worse: float  # the change in the bad direction (negative: better)
    worse_like: bool  # past the decision line and the minimum delta, in the bad direction
    better_like: bool
    p_worse: float | None  # one-sided Mann-Whitney; None when there are too few samples
    p_better: float | None
    spread: float | None
    noise: NoiseFigures | None
    noisy: tuple[str, ...]  # why this window cannot be trusted
    host_change: float | None = None  # how much slower the host-speed control ran
    control_slope: float | None = None  # how strongly the time follows the control

    @property
    def trusted(self) -> bool:
        return not self.noisy


def noise_reasons(window: Window, higher_is_better: bool) -> list[str]:
    """Why a measurement is too noisy to judge (empty when it can be): the noise probe's
    figures past their limits, or samples spread past ``SPREAD_LIMIT``."""
    noisy = list(window.noise.too_noisy()) if window.noise is not None else []
    spr = spread(window.samples, higher_is_better)
    if spr is not None and spr > SPREAD_LIMIT:
        noisy.append(f"sample spread {spr:.0%} > {SPREAD_LIMIT:.0%}")
    return noisy


def assess(base: StoredMetric, window: Window, tolerance: float) -> Assessment:
    hib = base.higher_is_better
    b = estimate(base.samples, base.value, hib, base.is_fraction)
    c = estimate(window.samples, window.value, hib, base.is_fraction)
    delta = c - b
    change = delta / abs(b) if b != 0 else None
    sign = -1.0 if hib else 1.0
    if change is not None:
        worse = sign * change
    else:
        worse = math.copysign(math.inf, sign * delta) if delta else 0.0
    line = tolerance * DECISION_FRACTION
    big_enough = abs(delta) >= min_abs_delta(base.unit) and abs(delta) > 0
    worse_like = big_enough and worse >= line
    better_like = big_enough and -worse >= line
    p_worse = p_better = None
    cur, old = good_half(window.samples, hib), good_half(base.samples, hib)
    if len(cur) >= MIN_SAMPLES and len(old) >= MIN_SAMPLES:
        up, down = mann_whitney_greater(cur, old), mann_whitney_greater(old, cur)
        p_worse, p_better = (down, up) if hib else (up, down)
    return Assessment(b, c, change, worse, worse_like, better_like, p_worse, p_better,
                      spread(window.samples, hib), window.noise,
                      tuple(noise_reasons(window, hib)))


# -- times with a host-speed control ---------------------------------------------------------
def controlled(base: StoredMetric, windows: Sequence[Window]) -> bool:
    """Whether a metric is judged with its host-speed control: a time (lower is better, not
    a fraction, every sample positive) with a control for every sample, in the baseline and
    in every measurement.  A baseline saved without one (or a run with ``control=False``) is
    judged by the plain rule."""
    return (len(base.control) == len(base.samples) >= MIN_SAMPLES
            and all(v > 0 for v in base.samples)
            and carries_control(base.higher_is_better, base.is_fraction, windows))


def carries_control(higher_is_better: bool, fraction: bool, windows: Sequence[Window]) -> bool:
    """Whether measurements of a metric can be judged with their control: a time, every
    sample with a control, every sample positive (judged in log space)."""
    return (not higher_is_better and not fraction
            and all(len(w.control) == len(w.samples) >= MIN_SAMPLES for w in windows)
            and all(v > 0 for w in windows for v in w.samples))


def pooled(windows: Sequence[Window]) -> Window:
    """Several measurements as one: samples and controls end to end, the worst noise figures
    (the value is the median of the samples)."""
    samples = tuple(v for w in windows for v in w.samples)
    control = tuple(c for w in windows for c in w.control)
    figures = [w.noise for w in windows if w.noise is not None]
    noise = None
    if figures:
        steals = [f.steal for f in figures if f.steal is not None]
        waits = [f.wait for f in figures if f.wait is not None]
        noise = NoiseFigures(sum(f.seconds for f in figures), max(steals, default=None),
                             max(waits, default=None))
    value = float(np.median(samples)) if samples else windows[0].value
    sizes = tuple(n for w in windows for n in (w.sizes or (len(w.samples),)))
    return Window(value, samples, noise, control, sizes)


def _split(samples: Sequence[float], control: Sequence[float],
           sizes: Sequence[int]) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    if not sizes or sum(sizes) != len(samples):
        return [(tuple(samples), tuple(control))]
    out, start = [], 0
    for n in sizes:
        out.append((tuple(samples[start:start + n]), tuple(control[start:start + n])))
        start += n
    return out


def _points(parts: Sequence[tuple[Sequence[float], Sequence[float]]]
            ) -> list[tuple[float, float, Sequence[float]]]:
    """Per measurement: (log of its control level, log of its median time, its samples).

    The control level is the ``CONTROL_LEVEL_QUANTILE`` of the measurement's controls: a
    slower host slows all of them, while another process's time slice lands on a few, and
    a 2.5 ms control hit by a 3 ms slice would count double."""
    return [(math.log(float(np.quantile(np.asarray(c, dtype=float), CONTROL_LEVEL_QUANTILE))),
             math.log(float(np.median(np.asarray(v, dtype=float)))), v)
            for v, c in parts if len(v) and len(c)]


def _parts_of(windows: Sequence[Window]) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    return [p for w in windows for p in _split(w.samples, w.control, w.sizes)]


def control_slope(base: StoredMetric, windows: Sequence[Window]) -> float:
    """How strongly the time follows the control: the least-squares slope of log(median
    time) on log(control level) over the measurements, each side (baseline, current) centred
    on its own median, clipped to [0, 1].  0 (the plain comparison) when there is nothing to
    fit.

    Whole measurements, not single samples: a sample's control carries its own jitter,
    which would flatten the slope (0.3 instead of 0.7 for a matmul loop here)."""
    xs: list[float] = []
    ys: list[float] = []
    for points in (_points(base.parts()), _points(_parts_of(windows))):
        if not points:
            continue
        cx = float(np.median([x for x, _, _ in points]))
        cy = float(np.median([y for _, y, _ in points]))
        xs += [x - cx for x, _, _ in points]
        ys += [y - cy for _, y, _ in points]
    x, y = np.asarray(xs), np.asarray(ys)
    if len(x) < 3 or float(np.dot(x, x)) <= 0:
        return 0.0
    return float(np.clip(np.dot(x, y) / np.dot(x, x), 0.0, 1.0))


def _adjusted(points: Sequence[tuple[float, float, Sequence[float]]],
              slope: float) -> list[float]:
    """log(time) - slope * log(its measurement's control level), per sample."""
    return [math.log(v) - slope * x for x, _, samples in points for v in samples]


def assess_controlled(base: StoredMetric, windows: Sequence[Window],
                      tolerance: float) -> Assessment:
    """The quiet measurements (all of them when none is quiet), pooled, against the baseline,
    with the part of the variation that follows the host-speed control taken out (see the
    module's docstring).  ``baseline`` is the baseline's estimate; ``current`` is that times
    (1 + change): the time the current code would take at the baseline's host speed."""
    reasons = [noise_reasons(w, False) for w in windows]
    quiet = [w for w, why in zip(windows, reasons, strict=True) if not why]
    use = quiet or list(windows)
    cur = pooled(use)
    slope = control_slope(base, use)
    base_points, cur_points = _points(base.parts()), _points(_parts_of(use))
    rb, rc = _adjusted(base_points, slope), _adjusted(cur_points, slope)
    q = CONTROL_ESTIMATOR_QUANTILE
    change = math.exp(float(np.quantile(rc, q)) - float(np.quantile(rb, q))) - 1.0
    b = estimate(base.samples, base.value, False, False)
    c = b * (1.0 + change)
    line = tolerance * DECISION_FRACTION
    big_enough = abs(c - b) >= min_abs_delta(base.unit) and c != b
    host = math.exp(float(np.median([x for x, _, _ in cur_points]))
                    - float(np.median([x for x, _, _ in base_points]))) - 1.0
    noisy = () if quiet else tuple(", ".join(why) for why in reasons)
    return Assessment(b, c, change, change, big_enough and change >= line,
                      big_enough and -change >= line, mann_whitney_greater(rc, rb),
                      mann_whitney_greater(rb, rc), spread(cur.samples, False), cur.noise,
                      noisy, host, slope)


def decide_controlled(base: StoredMetric, windows: Sequence[Window], tolerance: float, *,
                      can_confirm: bool) -> tuple[str, Assessment, str, bool]:
    """:func:`decide` for a time with a host-speed control (see the module's docstring)."""
    a = assess_controlled(base, windows, tolerance)
    n = len(windows)
    # Unlike a plain time, an adjusted one can be pushed either way by another process (its
    # time slices inflate the control too): noisy measurements clear nothing and improve
    # nothing, they are measured again and, with no quiet one, too noisy to tell.
    if a.trusted and a.better_like and _significant(a.p_better):
        return IMPROVED, a, "better than the baseline: re-save with --distperf-save", False
    screened_out = n == 1 and a.trusted and a.worse < tolerance * CONTROL_SCREEN_FRACTION
    if can_confirm and n < CONTROL_WINDOWS and not screened_out:
        return INCONCLUSIVE, a, "awaiting confirmation", True
    if not a.trusted:
        detail = (f"too noisy to tell in all {n} measurements" if n > 1
                  else "too noisy to tell")
        return INCONCLUSIVE, a, f"{detail} ({'; '.join(a.noisy)})", False
    if not a.worse_like:
        return UNCHANGED, a, "", False
    if _significant(a.p_worse):
        how = (f"confirmed by {n} measurements" if n > 1
               else "not confirmed: no re-measurement is available for this metric")
        return REGRESSED, a, how, False
    return INCONCLUSIVE, a, ("slower, but not statistically clear (Mann-Whitney p = "
                             f"{a.p_worse:.3g} >= {ALPHA})"), False


def _significant(p: float | None) -> bool:
    return p is None or p < ALPHA


def decide(base: StoredMetric, windows: Sequence[Window], tolerance: float, *,
           can_confirm: bool) -> tuple[str, Assessment, str, bool]:
    """(verdict, the assessment it reports, detail, whether to measure again)."""
    if controlled(base, windows):
        return decide_controlled(base, windows, tolerance, can_confirm=can_confirm)
    assessments = [assess(base, w, tolerance) for w in windows]
    best = min(assessments, key=lambda a: a.worse)
    confirmed = len(windows) > CONFIRMATIONS or not can_confirm
    rounds_left = can_confirm and len(windows) <= max(CONFIRM_ROUNDS, CONFIRMATIONS)
    if best.better_like and _significant(best.p_better):
        return IMPROVED, best, "better than the baseline: re-save with --distperf-save", False
    if not best.worse_like:
        return UNCHANGED, best, "", False
    evidence = [a for a in assessments if a.trusted and _significant(a.p_worse)]
    if evidence and confirmed:
        chosen = min(evidence, key=lambda a: a.worse)
        how = (f"confirmed by {len(windows)} measurements" if len(windows) > 1
               else "not confirmed: no re-measurement is available for this metric")
        return REGRESSED, chosen, how, False
    if evidence:  # seen once, in a quiet window: measure again before calling it
        return INCONCLUSIVE, best, "awaiting confirmation", rounds_left
    if all(a.noisy for a in assessments):
        figures = "; ".join(", ".join(a.noisy) for a in assessments)
        detail = (f"too noisy to tell in all {len(windows)} measurements ({figures})"
                  if len(windows) > 1 else f"too noisy to tell ({figures})")
    else:
        p = min((a.p_worse for a in assessments if a.trusted and a.p_worse is not None),
                default=None)
        detail = ("slower, but not statistically clear"
                  + (f" (Mann-Whitney p = {p:.3g} >= {ALPHA})" if p is not None else ""))
    return INCONCLUSIVE, best, detail, rounds_left


def _confidence(verdict: str, a: Assessment) -> float | None:
    p = a.p_better if verdict == IMPROVED else a.p_worse
    if p is None or verdict in (UNCHANGED, NO_BASELINE, NOT_COMPARABLE, SAVED):
        return None
    return 1.0 - p


def make_verdict(metric: Metric, verdict: str, env_id: str, assessment: Assessment | None,
                 *, tolerance: float, windows: int, detail: str) -> Verdict:
    """The record of one metric's verdict (``assessment`` None: nothing was compared)."""
    a = assessment
    noise = a.noise if a is not None else None
    return Verdict(
        metric=metric.name, verdict=verdict, environment=env_id, unit=metric.unit,
        higher_is_better=metric.higher_is_better,
        baseline=a.baseline if a is not None else None,
        current=a.current if a is not None else metric.value,
        change=a.change if a is not None else None,
        confidence=_confidence(verdict, a) if a is not None else None,
        tolerance=tolerance, windows=windows,
        steal=noise.steal if noise is not None else None,
        wait=noise.wait if noise is not None else None,
        spread=a.spread if a is not None else None,
        detail=detail,
        host_change=a.host_change if a is not None else None,
        control_slope=a.control_slope if a is not None else None,
    )


# -- one test's judgement --------------------------------------------------------------------
class Judgement:
    """The verdicts of one test: compare (or save) its metrics, asking for re-measurements.

    The caller loops: ``labels = j.wanted()``; re-measure each label; ``j.add_window(...)``;
    until ``wanted()`` is empty; then ``verdicts()`` (and ``save_entries()`` when saving).
    """

    def __init__(self, *, metrics: Sequence[Metric], labels: Mapping[str, str],
                 environments: Mapping[str, Environment], first_noise: NoiseFigures | None,
                 tolerance: float, save: bool, baseline: BaselineFile | None, test: str,
                 remeasurable: Sequence[str]) -> None:
        #: a metric whose value is not a finite number is neither compared nor saved
        self.unusable = {m.name: m for m in metrics if not math.isfinite(m.value)}
        self.metrics = {m.name: m for m in metrics if m.name not in self.unusable}
        self.labels = {name: labels.get(name, "") for name in self.metrics}
        self.envs = dict(environments)
        self.tolerance = tolerance
        self.save = save
        self.file = baseline
        self.test = test
        self.remeasurable = set(remeasurable)
        self.windows: dict[str, list[Window]] = {
            m.name: [Window.of(m, first_noise)] for m in self.metrics.values()}
        self._base: dict[str, StoredMetric | None] = {}
        self._why_not: dict[str, tuple[str, str]] = {}
        for name, metric in self.metrics.items():
            self._base[name] = self._lookup(name, metric)

    def _lookup(self, name: str, metric: Metric) -> StoredMetric | None:
        env = self.envs[name]
        env_id = environment_id(env)
        if self.file is None:
            self._why_not[name] = (NO_BASELINE, "no baseline file for this test module yet: "
                                                "run with --distperf-save to create it")
            return None
        stored = self.file.metrics(self.test, env_id)
        if stored is None:
            others = self.file.test_environments(self.test)
            if others:
                self._why_not[name] = (NOT_COMPARABLE, (
                    f"baselines exist only for other environments ({', '.join(others)}); "
                    "a baseline from another environment is never compared"))
            else:
                self._why_not[name] = (NO_BASELINE, "no baseline for this test in this "
                                                    "environment: run with --distperf-save")
            return None
        differs = _same_environment(self.file.environments().get(env_id, {}), env)
        if differs:
            self._why_not[name] = (NOT_COMPARABLE, f"the stored environment differs: {differs}")
            return None
        base = stored.get(name)
        if base is None:
            self._why_not[name] = (NO_BASELINE, "a new metric: no baseline for it yet")
            return None
        if base.unit != metric.unit or base.higher_is_better != metric.higher_is_better:
            self._why_not[name] = (NOT_COMPARABLE, (
                f"the metric changed meaning (unit {base.unit!r} -> {metric.unit!r}, "
                f"higher_is_better {base.higher_is_better} -> {metric.higher_is_better}): "
                "re-save"))
            return None
        return base

    # -- the loop ------------------------------------------------------------------------
    def _can_confirm(self, name: str) -> bool:
        return self.labels[name] in self.remeasurable

    def _best_window(self, name: str) -> Window:
        """The window to store: the one whose better half is best (its median), not the one
        with the best few samples, which may be a slow spell with a fast moment in it: its
        better half would be slower than most clean runs, and no test could tell."""
        metric = self.metrics[name]
        wins = self.windows[name]
        key = [selection_figure(w, metric.higher_is_better, metric.is_fraction) for w in wins]
        pick = int(np.argmax(key) if metric.higher_is_better else np.argmin(key))
        return wins[pick]

    def _window_trusted(self, name: str, window: Window) -> bool:
        return not noise_reasons(window, self.metrics[name].higher_is_better)

    def _has_control(self, name: str) -> bool:
        metric = self.metrics[name]
        return carries_control(metric.higher_is_better, metric.is_fraction, self.windows[name])

    def _save_window(self, name: str) -> Window:
        """What a save stores: with a host-speed control, the quiet measurements pooled (all
        of them when none is quiet: the comparison pools too); otherwise the best one."""
        if not self._has_control(name):
            return self._best_window(name)
        wins = self.windows[name]
        quiet = [w for w in wins if self._window_trusted(name, w)]
        return pooled(quiet or wins)

    def _wants_more(self, name: str) -> bool:
        if not self._can_confirm(name):
            return False
        count = len(self.windows[name])
        if self.save:
            if count < (CONTROL_WINDOWS if self._has_control(name) else SAVE_WINDOWS):
                return True
            return (count < SAVE_MAX_WINDOWS
                    and not self._window_trusted(name, self._best_window(name)))
        base = self._base[name]
        if base is None:
            return False
        return decide(base, self.windows[name], self.tolerance, can_confirm=True)[3]

    def wanted(self) -> list[str]:
        """Labels to re-measure now (empty: the verdicts are ready)."""
        return sorted({self.labels[n] for n in self.metrics if self._wants_more(n)})

    def backoff(self) -> float:
        """Seconds to wait before the next round of re-measurements (0: none is wanted)."""
        delays = []
        for name in self.metrics:
            if not self._wants_more(name):
                continue
            done = len(self.windows[name]) - 1  # re-measurements so far
            if self.save:
                delay = CONTROL_PAUSE_S if self._has_control(name) else SAVE_PAUSE_S
                if not self._window_trusted(name, self.windows[name][-1]):
                    delay = max(delay, NOISY_BACKOFF_S[min(done, len(NOISY_BACKOFF_S) - 1)])
            elif self._has_control(name):
                delay = CONTROL_PAUSE_S
            else:
                delay = CONFIRM_PAUSES_S[min(done, len(CONFIRM_PAUSES_S) - 1)]
            delays.append(delay)
        return max(delays, default=0.0)

    def add_window(self, label: str, metrics: Sequence[Metric],
                   noise: NoiseFigures | None) -> None:
        for metric in metrics:
            if metric.name in self.windows and self.labels[metric.name] == label:
                self.windows[metric.name].append(Window.of(metric, noise))

    # -- results ---------------------------------------------------------------------------
    def verdicts(self) -> list[Verdict]:
        out = [make_verdict(m, NOT_COMPARABLE, environment_id(self.envs[m.name]), None,
                            tolerance=self.tolerance, windows=1,
                            detail=f"its value is not a finite number ({m.value}): not "
                                   + ("saved" if self.save else "compared"))
               for m in self.unusable.values()]
        for name, metric in self.metrics.items():
            env_id = environment_id(self.envs[name])
            windows = len(self.windows[name])
            base = self._base[name]
            if self.save:
                out.append(self._saved_verdict(metric, env_id, base))
                continue
            if base is None:
                verdict, detail = self._why_not[name]
                out.append(make_verdict(metric, verdict, env_id, None, tolerance=self.tolerance,
                                        windows=windows, detail=detail))
                continue
            verdict, chosen, detail, _ = decide(base, self.windows[name], self.tolerance,
                                                can_confirm=self._can_confirm(name))
            out.append(make_verdict(metric, verdict, env_id, chosen, tolerance=self.tolerance,
                                    windows=windows, detail=detail))
        return out

    def _saved_verdict(self, metric: Metric, env_id: str, base: StoredMetric | None) -> Verdict:
        name = metric.name
        window = self._save_window(name)
        stored = self._stored(name, window)
        noisy = noise_reasons(window, stored.higher_is_better)
        spr = spread(window.samples, stored.higher_is_better)
        count = len(self.windows[name])
        detail = (f"{count} measurement(s) pooled, with the host-speed control"
                  if stored.control else f"best of {count} measurement(s)")
        if noisy:
            detail += (f"; saved from a noisy measurement ({', '.join(noisy)}): re-save on a "
                       "quieter machine")
        current = estimate(stored.samples, stored.value, stored.higher_is_better,
                           stored.is_fraction)
        previous = change = None
        if base is not None:
            previous = estimate(base.samples, base.value, base.higher_is_better,
                                base.is_fraction)
            change = (current - previous) / abs(previous) if previous else None
        return Verdict(metric=name, verdict=SAVED, environment=env_id, unit=metric.unit,
                       higher_is_better=metric.higher_is_better, baseline=previous,
                       current=current, change=change, tolerance=self.tolerance,
                       windows=len(self.windows[name]),
                       steal=window.noise.steal if window.noise else None,
                       wait=window.noise.wait if window.noise else None,
                       spread=spr, detail=detail)

    def _stored(self, name: str, window: Window) -> StoredMetric:
        metric = self.metrics[name]
        return StoredMetric(unit=metric.unit, higher_is_better=metric.higher_is_better,
                            value=window.value, samples=window.samples,
                            steal=window.noise.steal if window.noise else None,
                            wait=window.noise.wait if window.noise else None,
                            control=window.control,
                            measurements=window.sizes if window.control else ())

    def save_entries(self) -> list[SaveEntry]:
        """What every metric stores (:meth:`_save_window`), grouped by environment."""
        grouped: dict[str, tuple[Environment, dict[str, StoredMetric]]] = {}
        for name in self.metrics:
            env = self.envs[name]
            _, table = grouped.setdefault(environment_id(env), (env, {}))
            table[name] = self._stored(name, self._save_window(name))
        return [SaveEntry(env, table) for env, table in grouped.values()]
