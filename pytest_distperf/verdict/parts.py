"""A training step's verdict, checked against its parts.  Pure.

``ddp_step_timer`` times the synchronised step (``step_time_s``) and the same step without
gradient synchronisation (``compute_time_s``), alternating, in one measurement; the
difference is the exposed communication, judged by ``comm_overhead``.  The compute part is
steady where the transport is not: on CPU ranks a gloo all-reduce's time moves by about 9%
from one second to the next (benchmarks/ddp_verdicts.md), and half of a small model's step
can be one.  So a step called *regressed* while its compute, in the same measurements, was
judged not slower (*unchanged* or *improved*) grew in its exposed communication alone; that
part has its own verdict (``comm_overhead``, and the exact counts for a change of calls or
bytes), and judging the same noise twice doubles the false alarms.  Such a step verdict
becomes *inconclusive*, with the figures; a step whose compute regressed, or could not be
told, keeps its verdict.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from pytest_distperf.records import IMPROVED, INCONCLUSIVE, REGRESSED, UNCHANGED, Verdict

#: A step metric's name: an optional ``name.`` prefix, ``step_time_s``, an optional ``#n``.
_STEP = re.compile(r"^(?P<prefix>(?:.+\.)?)step_time_s(?P<suffix>(?:#\d+)?)$")
#: Verdicts of the compute part that clear it.
CLEARED = (UNCHANGED, IMPROVED)


def compute_of(name: str) -> str | None:
    """The name of the compute metric of step metric ``name`` (None: not a step time)."""
    match = _STEP.match(name)
    if match is None:
        return None
    return f"{match['prefix']}compute_time_s{match['suffix']}"


def by_parts(verdicts: Sequence[Verdict], labels: Mapping[str, str]) -> list[Verdict]:
    """``verdicts``, with every regressed step time whose compute (the metric of
    :func:`compute_of`, recorded by the same measurement: ``labels`` maps a metric to its
    measurement's label) was judged not slower made *inconclusive*."""
    by_name = {v.metric: v for v in verdicts}
    out = []
    for v in verdicts:
        name = compute_of(v.metric) if v.verdict == REGRESSED else None
        part = by_name.get(name) if name is not None else None
        if (part is None or part.verdict not in CLEARED
                or labels.get(part.metric) != labels.get(v.metric)):
            out.append(v)
            continue
        out.append(dataclasses.replace(v, verdict=INCONCLUSIVE, detail=(
            f"the step is {_pct(v.change)} but its compute, measured with it, is "
            f"{part.verdict} ({_pct(part.change)}): the change is in the exposed "
            f"communication, which comm_overhead and the collective counts judge "
            f"(the step alone: {v.detail})")))
    return out


def _pct(change: float | None) -> str:
    return "?" if change is None else f"{change:+.1%}"
