"""The baseline file on disk: its two layouts, reading and validating them, and writing the
current one.  Pure: the text in, the text out; :mod:`~pytest_distperf.verdict.store` does
the files, the locks and the merging.

Version 2, written since the files became something reviewers read: per test and
environment, first the figures a reviewer checks, one line per metric in ``metrics`` (value,
unit, kind, the tolerance in force when it was saved, the direction); then per metric in
``samples`` what the comparison needs, one line each (the samples, their controls and
sizes rounded to 4 significant digits, the noise figures).  Version 1 (a table per metric,
one sample per line) is still read, and is rewritten as version 2 by the next save.

Both are read into *flat tables*, one per metric, with version 1's keys: ``unit``,
``higher_is_better``, ``value``, ``kind``, ``tolerance``, ``samples``, ``control``,
``memory_control``, ``measurements``, ``steal``, ``cpu_wait``, ``other_load``, ``gpu_held``,
``gpu_sm_clock_mhz``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.config import DEFAULT_THRESHOLDS, is_int, is_number, shown
from pytest_distperf.records import (
    EXACT,
    INFORMATIONAL,
    MEASURED,
    PEAK,
    SINGLE_MEASUREMENT_KINDS,
    Samples,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The layout version written; a file of a version not in READABLE is refused, untouched.
SCHEMA_VERSION = 2
READABLE = (1, 2)
#: Units of a time: never negative in a baseline.
TIME_UNITS = ("s", "ms", "us", "ns")
#: How deeply tables and arrays may nest in a baseline file (its layout needs 7 levels).
MAX_NESTING = 32
#: Threshold keys an environment's ``thresholds`` table may hold.
THRESHOLD_KEYS = (*DEFAULT_THRESHOLDS, "tolerance", "exact_tolerance")
ENV_FIELDS: tuple[tuple[str, type], ...] = (
    ("backend", str), ("device_type", str), ("device_model", str), ("device_count", int),
    ("world_size", int), ("torch_version", str), ("nccl_version", str),
)
#: Environment fields a file written before they existed lacks (0 or "" there); the
#: strings and ``ranks_per_gpu`` are written only when set (a GPU's driver, CUDA runtime and
#: links; a pinned name; ranks sharing a GPU).
OPTIONAL_ENV_FIELDS: tuple[tuple[str, type], ...] = (
    ("cpu_cores", int), ("threads_per_rank", int), ("bound_cores", int),
    ("driver_version", str), ("cuda_version", str), ("interconnect", str), ("name", str),
    ("ranks_per_gpu", int),
)
#: A metric's kind as version 2 spells it (version 1 and the records say "" for measured).
KIND_NAMES = {MEASURED: "measured", EXACT: "exact", INFORMATIONAL: INFORMATIONAL, PEAK: PEAK}
_KINDS = {name: kind for kind, name in KIND_NAMES.items()}
#: Significant digits: a samples array's, and a metric's value (well below any noise).
SAMPLE_DIGITS = 4
VALUE_DIGITS = 6
_ARRAYS = (("samples", "values"), ("control", "control"),
           ("memory_control", "memory_control"))
_NOISE = ("steal", "cpu_wait", "other_load", "gpu_held", "gpu_sm_clock_mhz")


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the line."""

    def __init__(self, path: Path, line: int | None, problem: str, advice: str = "") -> None:
        where = f"{path}:{line}" if line else str(path)
        advice = advice or ("fix or delete it; the file was left unchanged (it is never "
                            "written over, not even by --distperf-save)")
        super().__init__(f"distperf: bad baseline file {where}: {problem}; {advice}")
        self.path = path
        self.line = line


def rounded(value: float, digits: int) -> float:
    """``value`` to ``digits`` significant digits (inf and nan as they are)."""
    return float(f"{value:.{digits}g}") if math.isfinite(value) else float(value)


# -- reading ---------------------------------------------------------------------------------
def stored_samples(samples: Samples) -> Samples:
    """``samples`` as a saved file keeps them: each value rounded to SAMPLE_DIGITS."""
    def kept(values: tuple[float, ...]) -> tuple[float, ...]:
        return tuple(rounded(v, SAMPLE_DIGITS) for v in values)

    return Samples(kept(samples.values), kept(samples.control), kept(samples.memory_control),
                   samples.sizes)


def flat_metrics(data: Mapping[str, Any], test: str, env_id: str
                 ) -> dict[str, dict[str, Any]] | None:
    """The flat table of every metric of ``test`` in ``env_id``; None without an entry."""
    entry = data.get("tests", {}).get(test, {}).get(env_id)
    return None if entry is None else flat_entry(data.get("schema_version"), entry)


def flat_entry(version: Any, entry: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The flat table of every metric of one entry of a file of ``version``."""
    if version == 1:
        return dict(entry.get("metrics", {}))
    samples = entry.get("samples", {})
    return {name: _flat(line, samples.get(name, {}))
            for name, line in entry.get("metrics", {}).items()}


def _flat(line: Mapping[str, Any], samples: Mapping[str, Any]) -> dict[str, Any]:
    """A version-2 metric (its line and its samples table) as a flat table."""
    table = {k: line[k] for k in ("unit", "higher_is_better", "value", "tolerance")
             if k in line}
    kind = line.get("kind")
    table["kind"] = _KINDS.get(kind, kind) if isinstance(kind, str) else kind
    for key, stored_as in (*_ARRAYS, ("measurements", "measurements")):
        if stored_as in samples:
            table[key] = samples[stored_as]
    noise = samples.get("noise", {})
    table.update({k: noise[k] for k in _NOISE if isinstance(noise, dict) and k in noise})
    return table


def parse(path: Path, raw: bytes) -> dict[str, Any]:
    """The validated data of a baseline file's bytes; BaselineError (file and line) when bad."""
    if not raw.strip():
        raise BaselineError(path, 1, "the file is empty (a baseline file starts with "
                                     f"schema_version = {SCHEMA_VERSION})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(path, raw[: exc.start].count(b"\n") + 1, "not UTF-8 text") from None
    data = loads(path, text)
    validate(path, text, data)
    return data


def loads(path: Path, text: str) -> dict[str, Any]:
    """The TOML of ``text``, not yet validated; BaselineError (file and line) when bad."""
    too_deep = (f"nested too deeply to read (arrays or tables more than {MAX_NESTING} "
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
    if _nesting(data) > MAX_NESTING:
        raise BaselineError(path, None, too_deep)
    return data


#: A key as :func:`entry_text` writes it: bare, or a basic string.
KEY_TEXT = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\\n]|\\.)*")'
#: The header of a test's entry in one environment, as :func:`entry_text` writes it.
ENTRY_HEAD = re.compile(rf"^\[tests\.{KEY_TEXT}\.{KEY_TEXT}\]$", re.MULTILINE)
#: The keys of a table's header, ``[tests.test_a."gloo-..."]``.
_HEADER_KEYS = re.compile(rf"({KEY_TEXT})(?:\.|\]$)")
#: A bare key in an inline table (``{value = 0.02, ...}``): what keeps a value from JSON.
_INLINE_KEY = re.compile(r"([{,] ?)([A-Za-z0-9_-]+) = ")


def as_written(body: str) -> tuple[str, str, dict[str, Any]] | None:
    """The test, environment and entry of one entry's text where it is what a save writes
    for them: read as JSON but for the keys (6x faster than TOML), then written again, which
    must give ``body`` (so TOML reads it the same); None where it is not."""
    entry: dict[str, Any] = {}
    try:
        for table in body.strip("\n").split("\n\n"):
            header, *lines = table.split("\n")
            keys = [json.loads(k) if k[0] == '"' else k for k in _HEADER_KEYS.findall(header)]
            where = entry
            for key in keys[3:]:
                where = where.setdefault(key, {})
            for line in lines:
                key, _, value = line.partition(" = ")
                where[json.loads(key) if key[:1] == '"' else key] = json.loads(
                    _INLINE_KEY.sub(r'\1"\2": ', value))
        canonical = entry_v2(str(entry.get("saved", "")), flat_entry(SCHEMA_VERSION, entry))
        if entry_text(keys[1], keys[2], canonical) == body:
            return keys[1], keys[2], canonical
    except (ValueError, TypeError, LookupError, AttributeError):
        pass  # not as a save writes it
    return None


#: A key of more dotted parts than MAX_NESTING allows, at the start of a line or a header.
_LONG_DOTTED_KEY = re.compile(
    r"""^[ \t]*\[*[ \t]*(?:(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')[ \t]*\.[ \t]*)"""
    rf"{{{MAX_NESTING},}}", re.MULTILINE)


def _nesting(data: Any) -> int:
    """How many levels of tables and arrays ``data`` has, counted without recursion (and
    only up to one level past :data:`MAX_NESTING`)."""
    deepest, stack = 0, [(data, 1)]
    while stack and deepest <= MAX_NESTING:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1)
                         for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _line_of(text: str, keys: Sequence[str]) -> int | None:
    """Best effort: the line where the key path ``keys`` appears (1-based)."""
    lines = text.splitlines()
    start, found = 0, None
    for key in keys:
        # the key as a whole dotted component of a header, or as an assignment
        pattern = re.compile(r'(^|[.\[\s"{,])' + re.escape(key) + r'($|[.\]\s"=])')
        for i in range(start, len(lines)):
            if pattern.search(lines[i]):
                found, start = i + 1, i  # the next key may sit on the same header line
                break
        else:
            break
    return found


Fail = Callable[..., BaselineError]


def validate(path: Path, text: str, data: dict[str, Any]) -> None:
    """``data``, read from ``text``, as a baseline file; BaselineError (file, line)."""
    def fail(keys: Sequence[str], problem: str, advice: str = "") -> BaselineError:
        return BaselineError(path, _line_of(text, keys) or 1, problem, advice)

    version = data.get("schema_version")
    if version is None:
        raise fail([], "not a pytest-distperf baseline file (no schema_version key)")
    if not is_int(version):
        raise fail(["schema_version"],
                   f"schema_version must be an integer, got {shown(version)}")
    if version < min(READABLE):
        raise fail(["schema_version"],
                   f"stale schema version {shown(version)} (this pytest-distperf reads versions "
                   f"{', '.join(map(str, READABLE))})",
                   "move it aside and run with --distperf-save to write current baselines; "
                   "the file was left unchanged")
    if version > SCHEMA_VERSION:
        raise fail(["schema_version"],
                   f"schema version {shown(version)} was written by a newer pytest-distperf "
                   f"(this one reads versions {', '.join(map(str, READABLE))})",
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
            if env_id not in envs:
                raise fail([test, env_id], f"test {test!r} has results for environment "
                                           f"{env_id!r}, which is not described under "
                                           "[environments]")
            _validate_entry(fail, version, test, env_id, entry)


def _validate_entry(fail: Fail, version: int, test: str, env_id: str, entry: Any) -> None:
    """One test's entry in one environment, in the layout of ``version``."""
    where = [test, env_id]
    metrics = entry.get("metrics") if isinstance(entry, dict) else None
    if not isinstance(metrics, dict):
        raise fail(where, f"test {test!r}, environment {env_id!r}: no metrics table")
    samples: Any = entry.get("samples", {}) if version > 1 else {}
    if not isinstance(samples, dict) or not all(isinstance(s, dict) for s in samples.values()):
        raise fail([*where, "samples"], f"test {test!r}, environment {env_id!r}: samples "
                                        "must be a table of tables, one per metric")
    for name in samples:
        if name not in metrics:
            raise fail([*where, "samples", name], f"test {test!r}, environment {env_id!r}: "
                                                  f"samples of {name!r}, which is not under "
                                                  "its metrics")
    for name, table in metrics.items():
        label = " / ".join(k if k.isprintable() else repr(k) for k in (*where, name))
        if version == 1:
            _validate_metric(fail, _v1_keys(where, name), label, table)
            continue
        if not isinstance(table, dict):
            raise fail([*where, "metrics", name], f"metric {label} must be a table")
        sample_table = samples.get(name, {})
        if not isinstance(sample_table.get("noise", {}), dict):
            raise fail([*where, "samples", name, "noise"], f"metric {label}: noise must be "
                                                            "a table")
        _validate_metric(fail, _v2_keys(where, name), label, _flat(table, sample_table))


def _v1_keys(where: list[str], name: str) -> Callable[[str], list[str]]:
    """Where a flat table's key sits in version 1: in the metric's own table."""
    return lambda key: [*where, name, key]


def _v2_keys(where: list[str], name: str) -> Callable[[str], list[str]]:
    """Where a flat table's key sits in version 2: the metric's line, or its samples."""
    stored_as = {**dict(_ARRAYS), "measurements": "measurements",
                 **{k: "noise" for k in _NOISE}}

    def keys(key: str) -> list[str]:
        if key in stored_as:
            return [*where, "samples", name, stored_as[key]]
        return [*where, "metrics", name]
    return keys


def _validate_environments(fail: Fail, envs: Any) -> None:
    """The ``environments`` table: each one's fields and ``thresholds``."""
    if not isinstance(envs, dict):
        raise fail(["environments"], "'environments' must be a table")
    for env_id, env in envs.items():
        if not isinstance(env, dict):
            raise fail(["environments", env_id], f"environment {env_id!r} must be a table")
        for name, kind in (*ENV_FIELDS, *OPTIONAL_ENV_FIELDS):
            value = env.get(name)
            if value is None and (name, kind) in OPTIONAL_ENV_FIELDS:
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
            _validate_threshold(fail, ["environments", env_id, "thresholds", key],
                                f"environment {env_id!r}", key, value)


def _validate_threshold(fail: Fail, keys: list[str], label: str, key: str, value: Any) -> None:
    if key not in THRESHOLD_KEYS:
        raise fail(keys, f"{label}: unknown threshold {key!r} (valid: "
                         f"{', '.join(THRESHOLD_KEYS)})")
    if not is_number(value) or not value >= 0:
        raise fail(keys, f"{label}: {key} must be a number >= 0, got {shown(value)}")
    if key == "tolerance" and value > 1:
        raise fail(keys, f"{label}: tolerance is a fraction (0.10 means 10%), got "
                         f"{shown(value)}")


def _validate_metric(fail: Fail, at: Callable[[str], list[str]], label: str,
                     table: Any) -> None:
    """One metric's flat table; ``at(key)`` is where ``key`` sits in the file."""
    if not isinstance(table, dict):
        raise fail(at("unit"), f"metric {label} must be a table")
    if not isinstance(table.get("unit"), str):
        raise fail(at("unit"), f"metric {label}: unit must be a string")
    if not isinstance(table.get("higher_is_better"), bool):
        raise fail(at("higher_is_better"),
                   f"metric {label}: higher_is_better must be true or false")
    if not is_number(table.get("value")):
        raise fail(at("value"), f"metric {label}: value must be a finite number, "
                                f"got {shown(table.get('value'))}")
    if not isinstance(table.get("kind", ""), str) or table.get("kind", "") not in KIND_NAMES:
        raise fail(at("kind"), f"metric {label}: kind must be one of "
                               f"{', '.join(repr(k) for k in sorted(_KINDS))}, "
                               f"got {shown(table.get('kind'))}")
    if "tolerance" in table:
        _validate_threshold(fail, at("tolerance"), f"metric {label}", "tolerance",
                            table["tolerance"])
    samples = table.get("samples", [])
    if not isinstance(samples, list) or not all(is_number(v) for v in samples):
        raise fail(at("samples"), f"metric {label}: samples must be a list of numbers")
    if table["unit"] in TIME_UNITS and (table["value"] < 0 or any(v < 0 for v in samples)):
        raise fail(at("value" if table["value"] < 0 else "samples"),
                   f"metric {label}: a time ({table['unit']}) cannot be negative")
    for key in _NOISE:
        if key in table and not is_number(table[key]):
            raise fail(at(key), f"metric {label}: {key} must be a number")
    for key in ("control", "memory_control"):
        control = table.get(key)
        if control is not None and (not isinstance(control, list)
                                    or len(control) != len(samples)
                                    or not all(is_number(v) and v > 0 for v in control)):
            raise fail(at(key), f"metric {label}: {key} must be a list of positive "
                                "numbers, one per sample")
    sizes = table.get("measurements")
    if sizes is not None and (not isinstance(sizes, list)
                              or not all(is_int(v) and v > 0 for v in sizes)
                              or sum(sizes) != len(samples)):
        raise fail(at("measurements"), f"metric {label}: measurements must list the sizes "
                                       "of the pooled measurements, adding up to the "
                                       "number of samples")


# -- writing ---------------------------------------------------------------------------------
def entry_v2(saved: str, flat: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A version-2 entry of one test in one environment, from flat tables: every number
    rounded as the file keeps it, keys distperf does not know left out."""
    metrics: dict[str, Any] = {}
    samples: dict[str, Any] = {}
    for name, table in sorted(flat.items()):
        kind = table.get("kind", MEASURED)
        line: dict[str, Any] = {"value": _value(table["value"], kind), "unit": table["unit"],
                                "kind": KIND_NAMES[kind]}
        if "tolerance" in table:
            line["tolerance"] = rounded(float(table["tolerance"]), VALUE_DIGITS)
        line["higher_is_better"] = table["higher_is_better"]
        metrics[name] = line
        if kind not in SINGLE_MEASUREMENT_KINDS:  # a count or a peak: no samples, no noise
            kept = _samples_v2(table)
            if kept:
                samples[name] = kept
    return {"saved": saved, "metrics": metrics, **({"samples": samples} if samples else {})}


def _value(value: float, kind: str) -> float | int:
    if kind in SINGLE_MEASUREMENT_KINDS and float(value).is_integer():
        return int(value)
    return rounded(float(value), VALUE_DIGITS)


def _samples_v2(table: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, stored_as in _ARRAYS:
        if table.get(key):
            out[stored_as] = [rounded(float(v), SAMPLE_DIGITS) for v in table[key]]
    sizes = table.get("measurements")
    if sizes and len(sizes) > 1:
        out["measurements"] = [int(v) for v in sizes]
    noise = {k: v if isinstance(v := table[k], int) else round(float(v), 4)
             for k in _NOISE if table.get(k) is not None}
    if noise:
        out["noise"] = noise
    return out


def head_text(data: Mapping[str, Any]) -> str:
    """The text of a version-2 file before its tests (version, module, environments)."""
    parts = [f"schema_version = {SCHEMA_VERSION}\nmodule = {_string(str(data['module']))}\n"]
    for env_id, env in sorted(data.get("environments", {}).items()):
        head = f"environments.{_key(env_id)}"
        fields = [(n, env[n]) for n, _ in (*ENV_FIELDS, *OPTIONAL_ENV_FIELDS) if n in env]
        parts.append(_table(head, fields))
        if "thresholds" in env:
            parts.append(_table(f"{head}.thresholds", sorted(env["thresholds"].items())))
    return "".join(parts)


def entry_text(test: str, env_id: str, entry: Mapping[str, Any]) -> str:
    """The text of ``test``'s version-2 entry in ``env_id``."""
    head = f"tests.{_key(test)}.{_key(env_id)}"
    parts = [_table(head, [("saved", entry.get("saved", ""))]),
             _table(f"{head}.metrics", sorted(entry["metrics"].items()))]
    for name, table in sorted(entry.get("samples", {}).items()):
        parts.append(_table(f"{head}.samples.{_key(name)}", list(table.items())))
    return "".join(parts)


def _table(head: str, items: Sequence[tuple[str, Any]]) -> str:
    lines = [f"\n[{head}]"] + [f"{_key(k)} = {_toml(v)}" for k, v in items]
    return "\n".join(lines) + "\n"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
            "\r": "\\r"}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _string(text: str) -> str:
    return '"' + _NEEDS_ESCAPE.sub(
        lambda m: _ESCAPES.get(m.group(), f"\\u{ord(m.group()):04x}"), text) + '"'


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_toml(v) for v in value) + "]"
