"""Pipeline stages in a profile: the chunks each rank's stages computed, read from their
``pp stage <s> <kind> mb <m>`` ranges (:data:`~pytest_distperf.records.PIPELINE_CHUNK`, put
there by :func:`pytest_distperf.rank.pipeline.labelled_chunks`).  Stdlib only."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pytest_distperf.records import PIPELINE_CHUNK

_NAME = re.compile(PIPELINE_CHUNK.format(stage=r"(\d+)", kind=r"(forward|backward|weight)",
                                         microbatch=r"(-?\d+)"))
#: One chunk on a rank's trace: (kind, stage, microbatch, start, end), microseconds.
TraceChunk = tuple[str, int, int, float, float]


def stage_chunks(events: Iterable[tuple[str, str, float, float]]) -> tuple[TraceChunk, ...]:
    """The labelled chunks among ``events`` ((name, category, start, end); the host's
    annotations, not a GPU timeline's copies), in order of their start."""
    out = []
    for name, cat, start, end in events:
        found = _NAME.fullmatch(name) if cat == "user_annotation" else None
        if found is not None:
            stage, kind, microbatch = found.groups()
            out.append((kind, int(stage), int(microbatch), start, end))
    return tuple(sorted(out, key=lambda c: c[3]))
