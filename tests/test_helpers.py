"""The shared pure helpers: one quantile, one interval arithmetic, one set of finding rules.

Pure: no torch, no ranks.
"""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest

from pytest_distperf.common.intervals import (
    clip_intervals,
    intersection_length,
    merge_intervals,
    union_length,
)
from pytest_distperf.common.quantiles import (
    finite,
    median,
    median_or_nan,
    quantile,
    quantile_or_nan,
)


@pytest.mark.parametrize("seed", range(8))
def test_quantile_is_numpys_linear_quantile_to_the_last_bit(seed: int) -> None:
    # stored baselines were computed with numpy: the figures must not move by one ulp
    rng = random.Random(seed)
    for n in (1, 2, 3, 5, 10, 20, 57):
        values = [rng.lognormvariate(-5, 1) for _ in range(n)]
        for q in (0.0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0):
            assert quantile(values, q) == float(np.quantile(values, q))
        assert median(values) == float(np.median(values))


def test_quantile_leaves_out_what_is_not_a_number() -> None:
    assert finite([1.0, None, math.nan, math.inf, 2]) == [1.0, 2.0]
    assert quantile([3.0, None, math.nan, 1.0], 0.5) == 2.0
    assert quantile([], 0.5) is None and median([None, math.nan]) is None
    assert math.isnan(quantile_or_nan([], 0.25)) and math.isnan(median_or_nan([]))


def test_interval_arithmetic() -> None:
    spans = [(5.0, 7.0), (0.0, 2.0), (1.0, 3.0), (4.0, 4.0), (6.0, 6.5)]
    assert merge_intervals(spans) == [(0.0, 3.0), (5.0, 7.0)]
    assert union_length(spans) == 5.0
    assert clip_intervals(merge_intervals(spans), 2.0, 6.0) == [(2.0, 3.0), (5.0, 6.0)]
    assert intersection_length([(0.0, 3.0), (5.0, 7.0)], [(2.0, 6.0)]) == 2.0
    assert union_length([]) == 0.0


def test_a_repeated_measurement_gets_its_own_label_and_metric_names() -> None:
    from pytest_distperf.records import Measurement, Metric, distinct

    def bench(size: str, value: float) -> Measurement:
        metric = Metric(f"all_reduce.{size}.busbw_gbps", value, "GB/s", True)
        return Measurement("bench(all_reduce)", (metric,), None,
                           lambda: [dataclasses.replace(metric, value=value + 1)])

    first = bench("4KiB", 1.0)
    assert distinct(first, []) is first  # nothing to rename
    second = distinct(bench("8KiB", 2.0), [first])
    assert second.label == "bench(all_reduce)#2"
    assert [m.name for m in second.metrics] == ["all_reduce.8KiB.busbw_gbps"]
    third = distinct(bench("8KiB", 3.0), [first, second])
    assert third.label == "bench(all_reduce)#3"
    assert [m.name for m in third.metrics] == ["all_reduce.8KiB.busbw_gbps#2"]
    assert third.remeasure is not None
    (again,) = third.remeasure()  # a re-measurement is renamed the same way
    assert again.name == "all_reduce.8KiB.busbw_gbps#2" and again.value == 4.0
