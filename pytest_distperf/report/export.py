"""History for existing dashboards (``--distperf-export FORMAT PATH``): every figure of the run
as Bencher Metric Format (``bmf``) or github-action-benchmark (``gab``) JSON.  No torch, no
pytest.

* ``bmf``: ``{benchmark: {measure: {value, lower_value, upper_value}}}``, one benchmark per
  test and metric (``tests/test_x.py::test_step::step_time_s``).  Times go to Bencher's
  built-in ``latency`` measure in nanoseconds and samples per second to ``throughput``;
  other units get a measure of their own (``gb-per-s``, ``fraction``, ``calls-per-step``).
  ``lower_value``/``upper_value`` are the lowest and highest sample, where there are samples.
* ``gab``: the ``customSmallerIsBetter`` list (``[{name, unit, value, range, extra}]``) at
  PATH, and, where some figures are better when higher (bandwidth, throughput, scaling
  efficiency), the ``customBiggerIsBetter`` list beside it at ``<stem>.bigger<suffix>``
  (:func:`bigger_path`): github-action-benchmark takes one direction per file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.common.files import write_atomically
from pytest_distperf.common.quantiles import finite
from pytest_distperf.config import ConfigError
from pytest_distperf.records import Metric, TestRecord, Verdict
from pytest_distperf.report.terminal import format_change

FORMATS = {"bmf": "Bencher Metric Format", "gab": "github-action-benchmark"}

#: Units that map onto Bencher's built-in measures: (measure, factor to its unit).
_BMF_BUILT_IN = {"s": ("latency", 1e9), "us": ("latency", 1e3), "ms": ("latency", 1e6),
                 "samples/s": ("throughput", 1.0)}


def parse_format(value: object, source: str) -> str:
    """``bmf`` or ``gab``; :class:`ConfigError` naming the option and the source otherwise."""
    text = str(value).strip().lower()
    if text not in FORMATS:
        raise ConfigError(f"--distperf-export: unknown format {value!r} (from {source}); "
                          f"choose {' or '.join(f'{k} ({v})' for k, v in FORMATS.items())}")
    return text


def bmf(records: Sequence[TestRecord]) -> dict[str, dict[str, dict[str, float]]]:
    """Every finite figure as Bencher Metric Format."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for record, metric in _figures(records):
        measure, factor = _BMF_BUILT_IN.get(metric.unit, (_slug(metric.unit), 1.0))
        entry = {"value": metric.value * factor}
        samples = finite(metric.samples)
        if samples:
            entry["lower_value"] = min(samples) * factor
            entry["upper_value"] = max(samples) * factor
        out[f"{record.nodeid}::{metric.name}"] = {measure: entry}
    return out


def gab(records: Sequence[TestRecord]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every finite figure as github-action-benchmark custom entries: (smaller is better,
    bigger is better)."""
    smaller: list[dict[str, Any]] = []
    bigger: list[dict[str, Any]] = []
    for record, metric in _figures(records):
        verdict = next((v for v in record.verdicts if v.metric == metric.name), None)
        entry: dict[str, Any] = {"name": f"{record.nodeid}::{metric.name}",
                                 "unit": metric.unit or "value", "value": metric.value}
        samples = finite(metric.samples)
        if len(samples) > 1:
            entry["range"] = f"± {(max(samples) - min(samples)) / 2:.4g}"
        entry["extra"] = _extra(record, metric, verdict, len(samples))
        (bigger if metric.higher_is_better else smaller).append(entry)
    return smaller, bigger


def bigger_path(path: Path) -> Path:
    """Where ``gab`` puts the figures that are better when higher: ``x.json`` ->
    ``x.bigger.json``."""
    return path.with_name(f"{path.stem}.bigger{path.suffix}")


def write_export(fmt: str, path: Path, records: Sequence[TestRecord]) -> list[Path]:
    """Write one export atomically; the files written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "bmf":
        write_atomically(path, _dumps(bmf(records)))
        return [path]
    smaller, bigger = gab(records)
    write_atomically(path, _dumps(smaller))
    if not bigger:
        return [path]
    write_atomically(bigger_path(path), _dumps(bigger))
    return [path, bigger_path(path)]


def _figures(records: Sequence[TestRecord]) -> list[tuple[TestRecord, Metric]]:
    return [(r, m) for r in records for m in r.metrics
            if isinstance(m.value, (int, float)) and math.isfinite(m.value)]


def _extra(record: TestRecord, metric: Metric, verdict: Verdict | None, samples: int) -> str:
    lines = [f"{record.world_size} ranks"]
    if samples:
        lines.append(f"{samples} samples")
    if verdict is not None:
        change = f" ({format_change(verdict)})" if verdict.baseline is not None else ""
        lines.append(f"verdict: {verdict.verdict}{change}")
        if verdict.environment:
            lines.append(f"environment: {verdict.environment}")
    if metric.kind:
        lines.append(f"kind: {metric.kind}")
    return "\n".join(lines)


def _slug(unit: str) -> str:
    """A Bencher measure slug for a unit: ``GB/s`` -> ``gb-per-s``; ``value`` for none."""
    text = unit.lower().replace("/", "-per-")
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "value"


def _dumps(data: Any) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"
