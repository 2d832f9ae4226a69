"""Threshold checks: a metric past its limit fails the test.  Pure: no torch, no pytest.

Limits are the defaults (docs/contract.md), overridden by the ini file, per environment (the
baseline file's thresholds table) and per test (the ``distperf`` marker), in that order.  The
plugin resolves them once per test (:func:`resolve_thresholds`); the analyzers' findings and
the breach check use the same table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from pytest_distperf.config import DEFAULT_THRESHOLDS
from pytest_distperf.records import Metric


@dataclasses.dataclass(frozen=True, slots=True)
class Breach:
    metric: str
    threshold: str  # e.g. "max_imbalance"
    limit: float
    value: float
    ranks: tuple[int, ...]
    hint: str

    def describe(self) -> str:
        relation = "exceeds" if self.threshold.startswith("max_") else "is below"
        text = (f"{self.metric} = {self.value:.3f} {relation} {self.threshold} "
                f"= {self.limit:.3f}")
        if self.ranks:
            text += f" (ranks involved: {', '.join(map(str, self.ranks))})"
        if self.hint:
            text += f"\n    suggestion: {self.hint}"
        return text


def resolve_thresholds(*layers: Mapping[str, float] | None) -> dict[str, float]:
    """The defaults overridden by each layer in turn (ini, environment, marker); keys that
    are not thresholds (``tolerance``, ``world_size``) are left out."""
    out = dict(DEFAULT_THRESHOLDS)
    for layer in layers:
        if layer:
            out.update({k: float(v) for k, v in layer.items() if k in DEFAULT_THRESHOLDS})
    return out


def check_thresholds(metrics: Iterable[Metric], limits: Mapping[str, float]) -> list[Breach]:
    """The breaches among ``metrics``: ``max_*`` limits are strict upper bounds
    (value < limit passes), ``min_*`` limits are inclusive lower bounds (value >= limit)."""
    breaches: list[Breach] = []
    for metric in metrics:
        if not metric.threshold or metric.threshold not in limits:
            continue
        limit = limits[metric.threshold]
        if metric.threshold.startswith("max_"):
            bad = not metric.value < limit
        else:
            bad = not metric.value >= limit
        if bad:
            breaches.append(Breach(metric.name, metric.threshold, limit, metric.value,
                                   metric.ranks, metric.hint))
    return breaches
