"""Why a verdict came out as it did: what else changed in the same measurement.  Pure.

A measurement of ``ddp_step_timer`` stores, beside the metrics it is judged by, the exact
collective counts of a step (``comm.<op>.calls``, ``comm.<op>.bytes``, ``comm.buckets``)
and the step's compute (measured) and exposed communication time (informational).  When one
of its metrics regresses (or improves, or cannot be told), the verdict carries the changes
of the others, in words a person can act on::

    all_reduce calls/step 2 -> 18, bytes unchanged: smaller gradient buckets (bucket_cap_mb)?
    compute +14%, exposed communication unchanged
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from pytest_distperf.config import format_bytes
from pytest_distperf.records import (
    EXACT,
    IMPROVED,
    INCONCLUSIVE,
    REGRESSED,
    Verdict,
)

#: The verdicts that get an explanation.
EXPLAINED = (REGRESSED, IMPROVED, INCONCLUSIVE)
#: Bytes that move by less than this fraction (with more calls) are a small extra message.
SMALL_EXTRA = 0.01
_COMM = re.compile(r"comm\.(?P<op>.+)\.(?P<what>calls|bytes)(?:#\d+)?$")
_BUCKETS = re.compile(r"comm\.buckets(?:#\d+)?$")
_SUFFIX = re.compile(r"#\d+$")
#: The metrics that say where a step's time went, and their words.
PHASES = (("compute_time_s", "compute"), ("exposed_comm_s", "exposed communication"))


def explain(verdicts: Sequence[Verdict], labels: Mapping[str, str],
            tolerance: float) -> list[Verdict]:
    """``verdicts`` with ``explanation`` filled in where the verdict is one of
    ``EXPLAINED``: the changes of the other metrics of the same measurement (``labels``:
    metric -> the label of the measurement that recorded it).  ``tolerance``: a phase that
    moved by less than half of it is "unchanged"."""
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault(labels.get(v.metric, ""), []).append(v)
    out = []
    for v in verdicts:
        if v.verdict in EXPLAINED and labels.get(v.metric):
            others = [w for w in groups[labels[v.metric]] if w.metric != v.metric]
            text = "; ".join(_describe(v, others, tolerance))
            out.append(dataclasses.replace(v, explanation=text))
        else:
            out.append(v)
    return out


def _describe(v: Verdict, others: Sequence[Verdict], tolerance: float) -> list[str]:
    if v.kind == EXACT:
        return comm_changes([v, *others], only=_op_of(v.metric))
    parts = comm_changes(others)
    if not parts and any(w.kind == EXACT for w in others):
        parts = ["collective calls and bytes unchanged"]
    phases = phase_changes(others, tolerance)
    return parts + ([phases] if phases else [])


def _op_of(name: str) -> str | None:
    match = _COMM.search(name)
    if match:
        return match["op"]
    return "buckets" if _BUCKETS.search(name) else None


def comm_changes(verdicts: Sequence[Verdict], only: str | None = None) -> list[str]:
    """One phrase per collective whose calls or bytes per step changed (``only``: that one
    collective, or ``"buckets"``)."""
    ops: dict[str, dict[str, Verdict]] = {}
    buckets = None
    for v in verdicts:
        if v.kind != EXACT:
            continue
        match = _COMM.search(v.metric)
        if match:
            ops.setdefault(match["op"], {})[match["what"]] = v
        elif _BUCKETS.search(v.metric):
            buckets = v
    parts = [text for op, pair in ops.items() if only in (None, op)
             for text in [_op_change(op, pair.get("calls"), pair.get("bytes"))] if text]
    if buckets is not None and only in (None, "buckets") and _moved(buckets):
        parts.append(f"gradient buckets/step {_n(buckets.baseline)} -> {_n(buckets.current)}"
                     + (": smaller buckets (bucket_cap_mb)?"
                        if (buckets.current or 0) > (buckets.baseline or 0) else ""))
    return parts


def _moved(v: Verdict | None) -> bool:
    return v is not None and v.verdict in (REGRESSED, IMPROVED)


def _op_change(op: str, calls: Verdict | None, nbytes: Verdict | None) -> str:
    if not _moved(calls) and not _moved(nbytes):
        return ""
    c0, c1 = _values(calls)
    b0, b1 = _values(nbytes)
    # ddp_step_timer counts per step (unit "calls/step"); dist_profiler per profiled call
    unit = next((v.unit for v in (calls, nbytes) if v is not None), "")
    per, where = ((" per profiled call", "call") if unit in ("calls", "B")
                  else ("/step", "step"))
    if calls is not None and c0 == 0:
        return f"{op}: new, {_n(c1)} call(s){per}" + (
            f": an extra barrier in the {where}?" if op == "barrier" else
            f": a new collective in the {where}?")
    if calls is not None and c1 == 0:
        return f"{op}: no longer issued (was {_n(c0)} call(s){per})"
    if _moved(calls) and not _moved(nbytes):
        text = f"{op} calls{per} {_n(c0)} -> {_n(c1)}"
        if nbytes is not None:
            text += ", bytes unchanged"
            if c1 > c0:
                text += (": smaller gradient buckets (bucket_cap_mb)?" if op == "all_reduce"
                         else ": the same data in more, smaller messages?")
        return text
    size = f"bytes{per} {format_bytes(b0)} -> {format_bytes(b1)}"
    if b0:
        size += f" ({(b1 - b0) / b0:+.1%})"
    if not _moved(calls):
        return (f"{op} {size}, calls unchanged: "
                + ("more data per call (a larger model?)" if b1 > b0 else
                   "less data per call (a smaller model, or compression?)"))
    text = f"{op} calls{per} {_n(c0)} -> {_n(c1)}, {size}"
    if c1 > c0 and b0 and 0 < (b1 - b0) / b0 < SMALL_EXTRA:
        text += (f": a small extra message per {where} (find_unused_parameters' "
                 "used-parameter map? a new all_reduce of a scalar?)" if op == "all_reduce"
                 else f": a small extra message per {where}")
    elif c1 > c0 and b1 > b0:
        text += (f": more data in more calls (a larger model, or a new collective in the "
                 f"{where}?)")
    return text


def _values(v: Verdict | None) -> tuple[float, float]:
    if v is None:
        return 0.0, 0.0
    return float(v.baseline or 0.0), float(v.current or 0.0)


def _n(value: float | None) -> str:
    return f"{value or 0:,.0f}"


def phase_changes(verdicts: Sequence[Verdict], tolerance: float) -> str:
    """``compute +14%, exposed communication unchanged`` from the phase metrics among
    ``verdicts`` (``compute_time_s``, measured, and ``exposed_comm_s``, informational; ""
    when there are none with a baseline)."""
    words = []
    for suffix, word in PHASES:
        v = next((w for w in verdicts if w.kind != EXACT
                  and _SUFFIX.sub("", w.metric).endswith(suffix)
                  and w.baseline is not None and w.current is not None), None)
        if v is None:
            continue
        change, b, c = v.change, float(v.baseline or 0.0), float(v.current or 0.0)
        if change is None and c != b:
            words.append(f"{word} {b * 1e3:.3g} -> {c * 1e3:.3g} ms")
        elif change is None or abs(change) < tolerance / 2:
            words.append(f"{word} unchanged")
        else:
            words.append(f"{word} {change:+.0%}")
    return ", ".join(words)
