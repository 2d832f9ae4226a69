"""Baseline files: their format, reading and validating them, and writing them.  Pure.

One TOML file per test module under the baseline folder (``perf_baselines/``),
``tests/perf/test_x.py`` -> ``perf_baselines/tests/perf/test_x.toml``.  Per test, per
environment (backend, device model and count, world size, torch and NCCL versions), per
metric: the direction, a few summary figures for reviewers, the noise seen while measuring,
and the samples the comparison needs.  Written with ``tomli_w`` (keys sorted, one sample per
line), atomically (temp file + ``os.replace``), read-merge-written under an exclusive lock of
the folder so that pytest-xdist workers saving at once lose nothing.  A file that cannot be
read is an error naming the file and the line, and is never written over.
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

from pytest_distperf.common.files import write_atomically
from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.config import DEFAULT_THRESHOLDS, is_int, is_number, shown
from pytest_distperf.records import EXACT, METRIC_KINDS, Environment, Measured, Samples
from pytest_distperf.verdict.stats import estimate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

#: The layout version of a baseline file; a file of another version is refused, untouched.
SCHEMA_VERSION = 1
#: Units of a time: never negative in a baseline.
TIME_UNITS = ("s", "ms", "us", "ns")
#: How deeply tables and arrays may nest in a baseline file (its layout needs 7 levels):
#: far deeper ones could be read but not written back (the writer recurses).
_MAX_NESTING = 32
#: Threshold keys an environment's ``thresholds`` table may hold.
THRESHOLD_KEYS = (*DEFAULT_THRESHOLDS, "tolerance", "exact_tolerance")
_ENV_FIELDS: tuple[tuple[str, type], ...] = (
    ("backend", str), ("device_type", str), ("device_model", str), ("device_count", int),
    ("world_size", int), ("torch_version", str), ("nccl_version", str),
)
#: Environment fields a file written before they existed lacks: 0 there (not compared
#: equal to a CPU runner's count, so such a baseline is not comparable, and says why).
_OPTIONAL_ENV_FIELDS: tuple[tuple[str, type], ...] = (
    ("cpu_cores", int), ("threads_per_rank", int), ("bound_cores", int),
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


def environment_id(env: Environment) -> str:
    """The key an environment's baselines live under, e.g.
    ``gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc`` or
    ``nccl-cuda-w8-torch2.6.0-nccl2.21.5-nvidia-h100`` (:meth:`Environment.baselines_key`).
    """
    return env.baselines_key()


def _env_table(env: Environment) -> dict[str, Any]:
    return {name: getattr(env, name) for name, _ in (*_ENV_FIELDS, *_OPTIONAL_ENV_FIELDS)}


def same_environment(stored: Mapping[str, Any], env: Environment) -> str:
    """Empty when ``stored`` describes ``env``; else what differs."""
    differences = []
    for name, _ in (*_ENV_FIELDS, *_OPTIONAL_ENV_FIELDS):
        mine, theirs = getattr(env, name), stored.get(name)
        if theirs is None and (name, int) in _OPTIONAL_ENV_FIELDS:
            theirs = 0
        if name == "torch_version":  # the local build tag (+cpu, +cu124) is not compared
            mine, theirs = str(mine).split("+")[0], str(theirs).split("+")[0]
        if mine != theirs:
            differences.append(f"{name} {theirs!r} there, {mine!r} here")
    return "; ".join(differences)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredMetric:
    """One metric's baseline: its unit, direction and kind, and the measurement it stores
    (several pooled, with the host-speed control); the rest of its table is for reviewers
    and is recomputed from the samples."""

    unit: str
    higher_is_better: bool
    measured: Measured
    kind: str = ""  # the metric's kind (records.METRIC_KINDS): "", "exact", "informational"

    @property
    def is_fraction(self) -> bool:
        return self.unit == "fraction"

    @property
    def value(self) -> float:
        return self.measured.value

    @property
    def samples(self) -> Samples:
        return self.measured.samples


def _round(value: float) -> float:
    """Six significant digits: well below any noise, and short lines in the file."""
    return float(f"{value:.6g}") if math.isfinite(value) else value


def stored_metric_table(metric: StoredMetric) -> dict[str, Any]:
    """The TOML table of one metric (keys in a fixed, readable order)."""
    m, samples = metric.measured, metric.samples
    table: dict[str, Any] = {
        "unit": metric.unit,
        "higher_is_better": metric.higher_is_better,
        "value": _round(m.value),
    }
    if metric.kind:
        table["kind"] = metric.kind
    if metric.kind == EXACT:  # a count, to the unit: not rounded, no samples, no noise
        table["value"] = int(m.value) if float(m.value).is_integer() else m.value
        return table
    values = samples.values
    if len(values) >= 1:
        table["estimate"] = _round(estimate(values, m.value, metric.higher_is_better,
                                            metric.is_fraction))
        table["median"] = _round(median_or_nan(values))
        table["min"] = _round(min(values))
        table["max"] = _round(max(values))
        table["n"] = len(values)
    if m.steal is not None:
        table["steal"] = round(m.steal, 4)
    if m.wait is not None:
        table["cpu_wait"] = round(m.wait, 4)
    if m.other_load is not None:
        table["other_load"] = round(m.other_load, 4)
    table["samples"] = [_round(v) for v in values]
    if samples.control:
        table["control"] = [_round(v) for v in samples.control]
    if samples.memory_control:
        table["memory_control"] = [_round(v) for v in samples.memory_control]
    if len(samples.sizes) > 1:
        table["measurements"] = list(samples.sizes)
    return table


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
        return {name: _stored_metric(table)
                for name, table in entry.get("metrics", {}).items()}


def _stored_metric(table: Mapping[str, Any]) -> StoredMetric:
    """One metric's table of a validated file (:func:`stored_metric_table`'s keys)."""
    def floats(key: str) -> tuple[float, ...]:
        return tuple(float(v) for v in table.get(key, ()))

    samples = Samples(floats("samples"), floats("control"), floats("memory_control"),
                      tuple(int(v) for v in table.get("measurements", ())))
    measured = Measured(float(table["value"]), samples, _opt_float(table.get("steal")),
                        _opt_float(table.get("cpu_wait")),
                        _opt_float(table.get("other_load")))
    return StoredMetric(table["unit"], table["higher_is_better"], measured,
                        str(table.get("kind", "")))


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
    too_deep = (f"nested too deeply to read (arrays or tables more than {_MAX_NESTING} "
                "levels inside each other)")
    long_key = _LONG_DOTTED_KEY.search(text)
    if long_key:  # refused before tomllib, which takes time quadratic in a key's parts
        raise BaselineError(path, text[: long_key.start()].count("\n") + 1, too_deep)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise BaselineError(path, int(match.group(1)) if match else None,
                            f"not valid TOML ({exc})") from None
    except ValueError:  # int() refuses numbers of that many digits (not a TOMLDecodeError)
        limit = sys.get_int_max_str_digits()
        match = re.search(rf"[0-9][0-9_]{{{limit},}}", text)
        raise BaselineError(path, text[: match.start()].count("\n") + 1 if match else None,
                            f"a number of more than {limit} digits") from None
    except RecursionError:
        raise BaselineError(path, None, too_deep) from None
    if _nesting(data) > _MAX_NESTING:
        raise BaselineError(path, None, too_deep)
    _validate(path, text, data)
    return BaselineFile(path, data)


#: A key of more dotted parts than _MAX_NESTING allows, at the start of a line or a header.
_LONG_DOTTED_KEY = re.compile(
    r"""^[ \t]*\[*[ \t]*(?:(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')[ \t]*\.[ \t]*)"""
    rf"{{{_MAX_NESTING},}}", re.MULTILINE)


def _nesting(data: Any) -> int:
    """How many levels of tables and arrays ``data`` has, counted without recursion (and
    only up to one level past :data:`_MAX_NESTING`)."""
    deepest, stack = 0, [(data, 1)]
    while stack and deepest <= _MAX_NESTING:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _validate(path: Path, text: str, data: dict[str, Any]) -> None:
    def fail(keys: Sequence[str], problem: str, advice: str = "") -> BaselineError:
        return BaselineError(path, _line_of(text, keys) or 1, problem, advice)

    version = data.get("schema_version")
    if version is None:
        raise fail([], "not a pytest-distperf baseline file (no schema_version key)")
    if not is_int(version):
        raise fail(["schema_version"],
                   f"schema_version must be an integer, got {shown(version)}")
    if version < SCHEMA_VERSION:
        raise fail(["schema_version"],
                   f"stale schema version {shown(version)} (this pytest-distperf reads version "
                   f"{SCHEMA_VERSION})",
                   "move it aside and run with --distperf-save to write current baselines; "
                   "the file was left unchanged")
    if version > SCHEMA_VERSION:
        raise fail(["schema_version"],
                   f"schema version {shown(version)} was written by a newer pytest-distperf "
                   f"(this one reads version {SCHEMA_VERSION})",
                   "upgrade pytest-distperf; the file was left unchanged")
    envs = data.get("environments", {})
    _validate_environments(fail, envs)
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
                label = " / ".join(k if k.isprintable() else repr(k) for k in (*where, name))
                _validate_metric(fail, [*where, name], label, table)


def _validate_environments(fail: Any, envs: Any) -> None:
    """The ``environments`` table: each one's fields and ``thresholds``."""
    if not isinstance(envs, dict):
        raise fail(["environments"], "'environments' must be a table")
    for env_id, env in envs.items():
        if not isinstance(env, dict):
            raise fail(["environments", env_id], f"environment {env_id!r} must be a table")
        for name, kind in (*_ENV_FIELDS, *_OPTIONAL_ENV_FIELDS):
            value = env.get(name)
            if value is None and (name, kind) in _OPTIONAL_ENV_FIELDS:
                continue
            if isinstance(value, bool) or not isinstance(value, kind):
                raise fail(["environments", env_id],
                           f"environment {env_id!r}: {name} must be a {kind.__name__}, "
                           f"got {shown(value)}")
        limits = env.get("thresholds", {})
        if not isinstance(limits, dict):
            raise fail(["environments", env_id, "thresholds"],
                       f"environment {env_id!r}: thresholds must be a table")
        for key, value in limits.items():
            if key not in THRESHOLD_KEYS:
                raise fail(["environments", env_id, "thresholds", key],
                           f"environment {env_id!r}: unknown threshold {key!r} (valid: "
                           f"{', '.join(THRESHOLD_KEYS)})")
            if not is_number(value) or not value >= 0:
                raise fail(["environments", env_id, "thresholds", key],
                           f"environment {env_id!r}: {key} must be a number >= 0, got "
                           f"{shown(value)}")
            if key == "tolerance" and value > 1:
                raise fail(["environments", env_id, "thresholds", key],
                           f"environment {env_id!r}: tolerance is a fraction (0.10 means 10%), "
                           f"got {shown(value)}")


def _validate_metric(fail: Any, keys: list[str], label: str, table: Any) -> None:
    if not isinstance(table, dict):
        raise fail(keys, f"metric {label} must be a table")
    if not isinstance(table.get("unit"), str):
        raise fail([*keys, "unit"], f"metric {label}: unit must be a string")
    if not isinstance(table.get("higher_is_better"), bool):
        raise fail([*keys, "higher_is_better"],
                   f"metric {label}: higher_is_better must be true or false")
    if not is_number(table.get("value")):
        raise fail([*keys, "value"], f"metric {label}: value must be a finite number, "
                                     f"got {shown(table.get('value'))}")
    if table.get("kind", "") not in METRIC_KINDS:
        raise fail([*keys, "kind"], f"metric {label}: kind must be one of "
                                    f"{', '.join(repr(k) for k in METRIC_KINDS if k)}, "
                                    f"got {shown(table.get('kind'))}")
    samples = table.get("samples", [])
    if not isinstance(samples, list) or not all(is_number(v) for v in samples):
        raise fail([*keys, "samples"], f"metric {label}: samples must be a list of numbers")
    if table["unit"] in TIME_UNITS and (table["value"] < 0 or any(v < 0 for v in samples)):
        raise fail([*keys, "value" if table["value"] < 0 else "samples"],
                   f"metric {label}: a time ({table['unit']}) cannot be negative")
    for key in ("steal", "cpu_wait", "other_load"):
        if key in table and not is_number(table[key]):
            raise fail([*keys, key], f"metric {label}: {key} must be a number")
    for key in ("control", "memory_control"):
        control = table.get(key)
        if control is not None and (not isinstance(control, list)
                                    or len(control) != len(samples)
                                    or not all(is_number(v) and v > 0 for v in control)):
            raise fail([*keys, key], f"metric {label}: {key} must be a list of positive "
                                     "numbers, one per sample")
    sizes = table.get("measurements")
    if sizes is not None and (not isinstance(sizes, list)
                              or not all(is_int(v) and v > 0 for v in sizes)
                              or sum(sizes) != len(samples)):
        raise fail([*keys, "measurements"], f"metric {label}: measurements must list the "
                                            "sizes of the pooled measurements, adding up to "
                                            "the number of samples")


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
