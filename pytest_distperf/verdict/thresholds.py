"""Threshold checks: a metric past its limit fails the test.  Pure: no torch, no pytest.

Limits are the defaults (docs/contract.md), overridden by the ini file, per environment (the
baseline file's thresholds table) and per test (the ``distperf`` marker), in that order.  The
plugin resolves them once per test (:func:`resolve_thresholds`); the analyzers' findings and
the breach check use the same table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

from pytest_distperf.common.quantiles import quantile_or_nan
from pytest_distperf.records import Metric

#: Fewer per-step samples than this: a breach is judged on the value alone (the verdict's
#: own minimum, ``stats.MIN_SAMPLES``; not imported: this module loads with the plugin,
#: without numpy).
_MIN_SAMPLES = 5


#: A breach is certain, whatever the noise, when even this good-side quantile of the
#: metric's per-step samples is past the limit (the 25% quantile of a ``max_`` fraction).
_CERTAIN_QUANTILE = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class Breach:
    metric: str
    threshold: str  # e.g. "max_imbalance"
    limit: float
    value: float
    ranks: tuple[int, ...]
    hint: str
    #: why the breach cannot be told from noise ("" when it can): the noise probe was past
    #: its limits and the samples' good side was within the limit
    inconclusive: str = ""

    def describe(self) -> str:
        relation = "exceeds" if self.threshold.startswith("max_") else "is below"
        text = (f"{self.metric} = {self.value:.3f} {relation} {self.threshold} "
                f"= {self.limit:.3f}")
        if self.ranks:
            text += f" (ranks involved: {', '.join(map(str, self.ranks))})"
        if self.inconclusive:
            text += f"; inconclusive: {self.inconclusive}"
        if self.hint:
            text += f"\n    suggestion: {self.hint}"
        return text


def _past(value: float, threshold: str, limit: float) -> bool:
    """``max_*`` limits are strict upper bounds (value < limit passes), ``min_*`` limits
    inclusive lower bounds (value >= limit passes)."""
    return not value < limit if threshold.startswith("max_") else not value >= limit


def check_thresholds(metrics: Iterable[Metric], limits: Mapping[str, float],
                     noisy: Sequence[str] = ()) -> list[Breach]:
    """The breaches among ``metrics``.

    ``noisy``: the noise probe's reasons during the measurement (empty: it was quiet).  Then
    a breach whose per-step samples' good side (``_CERTAIN_QUANTILE`` of a ``max_`` metric,
    its mirror for a ``min_`` one) is within the limit is *inconclusive*: another process
    can push a ratio of times either way, and the steps it did not touch say the limit
    holds.  A breach that holds in the good quarter of the steps stands whatever the noise.
    """
    breaches: list[Breach] = []
    for metric in metrics:
        if not metric.threshold or metric.threshold not in limits:
            continue
        limit = limits[metric.threshold]
        if not _past(metric.value, metric.threshold, limit):
            continue
        why = ""
        samples = [v for v in metric.samples if math.isfinite(v)]
        if noisy and len(samples) >= _MIN_SAMPLES:
            q = _CERTAIN_QUANTILE if metric.threshold.startswith("max_") else 1 - _CERTAIN_QUANTILE
            good = quantile_or_nan(samples, q)
            if not _past(good, metric.threshold, limit):
                why = (f"the noise probe saw {', '.join(noisy)}, and a quarter of the steps "
                       f"were within the limit ({good:.3f})")
        breaches.append(Breach(metric.name, metric.threshold, limit, metric.value,
                               metric.ranks, metric.hint, why))
    return breaches
