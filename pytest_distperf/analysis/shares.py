"""A step timed with per-rank batch shares: the shares it ran with, its imbalance before
and after, and the devices that may explain an imbalance.  Pure: no torch, no pytest.
"""

from __future__ import annotations

import dataclasses

from pytest_distperf.analysis.analyzer import paired_steps
from pytest_distperf.analysis.topology import DIFFER
from pytest_distperf.fixtures.results.steps import StepTiming


def with_shares(timing: StepTiming, *, shared: bool, devices: str = "") -> StepTiming:
    """``timing`` with the batch shares it ran with (each rank's rows over the batch's, where
    ``shared``), the imbalance of its calibration steps (``batch_shares="auto"``), and the
    ranks' ``devices``; the imbalance finding names the devices where they differ."""
    ranks = sorted(timing.raw, key=lambda r: r.rank)
    total = sum(r.batch_size for r in ranks)
    used = tuple(r.batch_size / total for r in ranks) if shared and total > 0 else ()
    paired = paired_steps([r.calibration_s for r in ranks]) if any(
        r.calibration_s for r in ranks) else None
    found = [dataclasses.replace(b, description=f"{b.description}; {devices}")
             if b.kind == "imbalance" and devices.startswith(DIFFER) else b
             for b in timing.bottlenecks]
    return dataclasses.replace(timing, shares_used=used, devices=devices, bottlenecks=found,
                               imbalance_before=paired.imbalance if paired else None)
