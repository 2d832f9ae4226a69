"""The doctor's one door into :mod:`pytest_distperf.verdict`: the change a save says it can
tell, and the noise probe.  No torch, no pytest.

Every name the doctor takes from the verdict room is imported here, so that a rename there
is an edit here alone.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pytest_distperf.common.quantiles import quantile
from pytest_distperf.records import Measured, Samples
from pytest_distperf.verdict import noise, rule
from pytest_distperf.verdict.noise import NoiseFigures, Snapshot, between, snapshot
from pytest_distperf.verdict.store import StoredMetric

#: The noise probe's limit and the power a save's figure is stated at, shown on the page.
OTHER_LOAD_LIMIT: float = noise._OTHER_LOAD_LIMIT
DETECTABLE_POWER: float = rule._DETECTABLE_POWER

__all__ = ["DETECTABLE_POWER", "OTHER_LOAD_LIMIT", "NoiseFigures", "Snapshot", "between",
           "detectable", "snapshot"]

#: The quantile each measurement is read by, as the controlled rule reads its figures.
_LEVEL_QUANTILE = 0.25

Part = tuple[tuple[float, ...], tuple[float, ...]]  # one measurement: (samples, control)


def detectable(parts: Sequence[Part], *, unit: str,
               higher_is_better: bool) -> tuple[float, float] | None:
    """(spread, change) of measurements taken as a save takes them: the change a comparison
    of measurements against them tells ``DETECTABLE_POWER`` of the time.

    With the host-speed control (every part's control as long as its samples) it is the
    figure a save states (:func:`~pytest_distperf.verdict.rule.detectable`); without
    one (GPU ranks), the same formula on each measurement's 25% quantile, with nothing taken
    out.  None for fewer than 3 measurements."""
    if len(parts) < 3:
        return None
    if all(part[1] and len(part[0]) == len(part[1]) for part in parts):
        samples = Samples(values=tuple(v for part in parts for v in part[0]),
                          control=tuple(c for part in parts for c in part[1]),
                          sizes=tuple(len(part[0]) for part in parts))
        measured = Measured(value=statistics.median(samples.values), samples=samples)
        base = StoredMetric(unit=unit, higher_is_better=higher_is_better, measured=measured)
        found = rule.detectable(base)
        return None if found is None else (found.spread, found.change)
    return _plain(parts, higher_is_better)


def _plain(parts: Sequence[Part], higher_is_better: bool) -> tuple[float, float] | None:
    """:func:`detectable` for measurements without a control."""
    levels = []
    for samples, _ in parts:
        # a rate's good side is its high end, a time's its low end
        level = quantile(samples, 1 - _LEVEL_QUANTILE if higher_is_better else _LEVEL_QUANTILE)
        if level is None or not level > 0:
            return None
        levels.append(math.log(level))
    found = rule.detectable_levels(levels, higher_is_better)
    return found.spread, found.change
