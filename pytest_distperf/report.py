"""The session's report: terminal summary lines and the JSON file.  No torch, no pytest."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pytest_distperf.records import TestRecord, to_dict

JSON_SCHEMA_VERSION = 1


def summary_lines(records: Sequence[TestRecord]) -> list[str]:
    """One block per test that recorded metrics: its figures, then any breach."""
    lines: list[str] = []
    for record in records:
        if not record.metrics and not record.breaches:
            continue
        status = "BREACH" if record.breaches else "ok"
        lines.append(f"{record.nodeid} [{record.world_size} ranks] {status}")
        for metric in record.metrics:
            unit = f" {metric.unit}" if metric.unit and metric.unit != "fraction" else ""
            lines.append(f"    {metric.name:<40} {metric.value:>14.6g}{unit}")
        lines.extend(f"  ! {b}" for b in record.breaches)
    return lines


def write_json(path: Path, records: Sequence[TestRecord], *, header: str) -> None:
    """Write the report atomically (a temp file renamed into place)."""
    data = {
        "schema_version": JSON_SCHEMA_VERSION,
        "header": header,
        "tests": [to_dict(r) for r in records],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True
