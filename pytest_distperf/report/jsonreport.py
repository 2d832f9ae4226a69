"""The ``--distperf-json`` report: build it, write it, read it back.  No torch, no pytest.

The document's layout is published as a JSON Schema, ``schema.json`` beside this
module (:data:`SCHEMA_PATH`), which the tests validate every report against.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.common.files import write_atomically
from pytest_distperf.fixtures.results import record_from_dict, record_to_dict
from pytest_distperf.records import Environment, TestRecord, to_dict

#: Changes only when a field changes meaning or is removed; new fields may come in any version.
SCHEMA_VERSION = 1
#: The published JSON Schema of the report (package data).
SCHEMA_PATH = Path(__file__).with_name("schema.json")

NOTHING_MEASURED = ("no test recorded a distperf metric in this run (none was selected, or "
                    "none used a distperf fixture)")


class ReportError(ValueError):
    """A file that is not a pytest-distperf JSON report of a version this one reads."""


def load_schema() -> dict[str, Any]:
    """The published JSON Schema of the report, as a dict."""
    schema: dict[str, Any] = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def environment_dict(env: Environment) -> dict[str, Any]:
    """An environment as the report lists it: its fields and its ``key``, the one its
    baselines live under and its verdicts name (:meth:`Environment.baselines_key`)."""
    return {"key": env.baselines_key(), **to_dict(env)}


def document(records: Sequence[TestRecord], *, header: str,
             environments: Sequence[Environment] = (),
             sections: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report as JSON-ready data.  A figure that is NaN or infinite becomes null: JSON has
    no such numbers, and a report other tools cannot parse is no report.  ``sections``: named
    parts added by a conftest or a plugin (``pytest_distperf_report_sections``)."""
    data: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "header": header,
        "environments": [environment_dict(e) for e in environments],
        "tests": [record_to_dict(r) for r in records],
    }
    if sections:
        data["sections"] = dict(sections)
    if not records and not sections:
        data["note"] = NOTHING_MEASURED
    finite: dict[str, Any] = _finite(data)
    return finite


def dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def write_json(path: Path, records: Sequence[TestRecord], *, header: str,
               environments: Sequence[Environment] = (),
               sections: Mapping[str, Any] | None = None) -> None:
    """Write the report atomically (a temp file renamed into place), creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, dumps(document(records, header=header, environments=environments,
                                          sections=sections)))


def read_json(path: Path) -> tuple[dict[str, Any], list[TestRecord]]:
    """A report written by :func:`write_json`: the document, and its tests as typed records
    (results typed again).  :class:`ReportError` names the file and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ReportError(f"{path}: not a pytest-distperf JSON report (no schema_version)")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ReportError(f"{path}: schema_version {data['schema_version']!r}; this version of "
                          f"pytest-distperf reads {SCHEMA_VERSION}")
    tests = data.get("tests")
    if not isinstance(tests, list):
        raise ReportError(f"{path}: 'tests' is not a list")
    try:
        records = [record_from_dict(t) for t in tests]
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: a test entry is malformed: {exc!r}") from None
    return data, records


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
