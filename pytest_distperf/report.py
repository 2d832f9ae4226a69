"""The session's report: terminal summary lines and the JSON file.  No torch, no pytest."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.records import (
    SLOW_PAIR_RATIO,
    CollectiveResult,
    PairMatrix,
    TestRecord,
    from_dict,
    to_dict,
)

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


# -- collective benchmarks: nccl-tests-style tables and the pair matrix ---------------------
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")


def collective_table(result: CollectiveResult) -> list[str]:
    """An nccl-tests-style table of one :class:`CollectiveResult`: one line per size."""
    r = result
    lines = [
        f"# {r.op}  {r.world_size} ranks  {r.backend}/{r.device_type}  warmup {r.warmup}  "
        f"iters {r.iters}" + ("" if r.op == "barrier" else f"  busbw = algbw x {r.bus_factor:.4g}"),
        f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>6} {'time':>10} "
        f"{'spread':>7} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>6} {'(us)':>10} "
        f"{'(%)':>7} {'(GB/s)':>8} {'(GB/s)':>8}",
    ]
    redop = "sum" if r.op in _REDUCING else "none"
    root = "0" if r.op in _ROOTED else "-1"
    dtype = "-" if r.op == "barrier" else r.dtype
    for row in r.rows:
        bw = ((f"{'-':>8} {'-':>8}") if r.op == "barrier"
              else f"{row.algbw_gbps:>8.3f} {row.busbw_gbps:>8.3f}")
        lines.append(
            f"{row.size_bytes:>12} {row.count:>13} {dtype:>9} {redop:>7} {root:>6} "
            f"{row.time_us:>10.1f} {row.spread * 100:>7.1f} {bw} {row.wrong:>7}")
    if r.op != "barrier" and r.rows:
        average = sum(row.busbw_gbps for row in r.rows) / len(r.rows)
        lines.append(f"# Out of bounds values : {r.wrong} {'FAILED' if r.wrong else 'OK'}")
        lines.append(f"# Avg bus bandwidth    : {average:.4g} GB/s")
    lines.append("")
    return lines


def pair_matrix_lines(result: PairMatrix) -> list[str]:
    """The send/recv bandwidth matrix (row: sender, column: receiver) and what it points at."""
    r = result
    n = r.world_size
    lines = [
        f"# send/recv between rank pairs, one pair at a time  {r.label} {r.dtype}  "
        f"{r.backend}/{r.device_type}  iters {r.iters}",
        "# GB/s, median round trip (message there, one element back); row: sender, "
        "column: receiver",
        "#" + f"{'src/dst':>8}" + "".join(f"{d:>9}" for d in range(n)),
    ]
    grid = r.matrix()
    for src in range(n):
        cells = "".join(f"{'-':>9}" if v is None else f"{v:>9.3f}" for v in grid[src])
        lines.append(f" {src:>8}{cells}")
    slow = r.slow_pairs()
    typical = r.typical_gbps
    lines.append(f"# typical pair (75th percentile): {typical:.3f} GB/s; slowest: "
                 + (f"{min(p.busbw_gbps for p in r.pairs):.3f} GB/s" if r.pairs else "-"))
    if not slow:
        lines.append(f"# no slow pair (none below {SLOW_PAIR_RATIO:.0%} of typical)")
    else:
        listed = ", ".join(f"{p.src}->{p.dst} {p.busbw_gbps:.3f} GB/s "
                           f"({p.busbw_gbps / typical:.2f}x)" for p in slow[:8])
        more = f" and {len(slow) - 8} more" if len(slow) > 8 else ""
        lines.append(f"# slow pairs (below {SLOW_PAIR_RATIO:.0%} of typical): {listed}{more}")
        suspects = r.suspect_ranks()
        if suspects:
            lines.append(f"# suspect rank(s) {', '.join(map(str, suspects))}: most pairs with "
                         f"them are slow; check that device and its link")
        elif n >= 3:
            lines.append("# no rank is in most slow pairs: suspect the link(s) of those pairs")
    spreads = sorted(p.spread for p in r.pairs)
    noise = spreads[len(spreads) // 2] if spreads else 0.0
    if slow and noise > NOISY_PAIR_SPREAD:
        lines.append(f"# the round trips are noisy (median spread p10..p90 {noise:.0%} of the "
                     f"median): re-run with more iterations before blaming the hardware")
    if r.wrong:
        lines.append(f"# WRONG DATA: {r.wrong} element(s) arrived wrong")
    lines.append("")
    return lines


#: Above this spread (p10..p90 over the median) of a typical pair, slow pairs may be noise.
NOISY_PAIR_SPREAD = 0.25


def _as_collective(data: Any) -> CollectiveResult | PairMatrix | None:
    """Rebuild a bench result from a record's stored result (a to_dict() dict), if it is one."""
    if isinstance(data, (CollectiveResult, PairMatrix)):
        return data
    if not isinstance(data, dict):
        return None
    try:
        if {"op", "rows", "bus_factor"} <= data.keys():
            return from_dict(CollectiveResult, data)
        if {"pairs", "size_bytes", "label"} <= data.keys():
            return from_dict(PairMatrix, data)
    except (KeyError, TypeError, ValueError):
        return None
    return None


def collective_lines(records: Sequence[TestRecord]) -> list[str]:
    """The tables of every ``bench``/``bench_pairs`` result, test by test."""
    lines: list[str] = []
    for record in records:
        results = [r for r in (_as_collective(e.get("result")) for e in record.results) if r]
        if not results:
            continue
        lines.append(f"{record.nodeid}")
        for result in results:
            if isinstance(result, CollectiveResult):
                lines.extend(collective_table(result))
            else:
                lines.extend(pair_matrix_lines(result))
    if lines:
        lines[:0] = ["time: median over iterations of the slowest rank's time; spread: p10..p90 "
                     "of those times, in % of the median; GB/s = 1e9 bytes/s", ""]
    return lines
