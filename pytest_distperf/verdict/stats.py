"""The statistics of a verdict: estimators, the sample spread and the Mann-Whitney test,
and the arithmetic of the host-speed control.  Pure: numpy at most.

benchmarks/log/statistics.md has the evidence behind each constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pytest_distperf.common.quantiles import median_or_nan, quantile_or_nan

#: Good-side quantile of the samples that a time is judged by (0.95 for higher-is-better):
#: all but the minimum, so that one odd sample cannot decide.
_ESTIMATOR_QUANTILE = 0.05
#: Fewer samples than this (in either side's better half, for the test): the metric's value
#: stands for them, and no test is made (point estimates and confirmation only).
MIN_SAMPLES = 5
#: Fractions (unit "fraction") must also move by this many absolute points.
_MIN_FRACTION_POINTS = 0.05
#: A fraction's spread is relative to at least this: a fraction near zero is then too noisy
#: only when its median sits well above its estimate, not for a relative spread of tiny
#: figures.
_FRACTION_SPREAD_FLOOR = 0.1
#: Smallest absolute change that can count, by unit: microsecond noise never fails a build.
_MIN_ABS_DELTA = {"s": 5e-6, "ms": 5e-3, "us": 5.0, "ns": 5e3}
#: A measurement's host-speed level: this quantile of its controls (another process's time
#: slice hits a few of them, a slower host all of them).
_CONTROL_LEVEL_QUANTILE = 0.25
#: Up to this many pairs without ties the Mann-Whitney p-value is exact: the normal
#: approximation doubles the far tail at 5 vs 5 samples, where a significance level of 0.01
#: sits.
_EXACT_PAIRS = 2500


def estimate(samples: Sequence[float], value: float, higher_is_better: bool,
             fraction: bool, *, floor: bool = True) -> float:
    """The figure a metric is judged by.

    Times and bandwidths: the good-side quantile of the samples (noise only pushes one way),
    with ``floor`` never past the second-best sample (:func:`estimator_quantile`).
    Fractions, and metrics with fewer than ``MIN_SAMPLES`` samples: the metric's own value
    (a ratio of two noisy times has no good side).
    """
    if fraction or len(samples) < MIN_SAMPLES:
        return float(value)
    q = estimator_quantile(len(samples)) if floor else _ESTIMATOR_QUANTILE
    return quantile_or_nan(samples, 1.0 - q if higher_is_better else q)


def estimator_quantile(n: int) -> float:
    """The good-side quantile that judges ``n`` samples: ``_ESTIMATOR_QUANTILE``, but never
    below the second-best sample (1 / (n - 1)): at 5-10 samples the 5% quantile gives the
    best sample 80-55% of its weight, and one odd fast sample would decide."""
    return max(_ESTIMATOR_QUANTILE, 1.0 / (n - 1)) if n > 1 else _ESTIMATOR_QUANTILE


def selection_figure(samples: Sequence[float], value: float, higher_is_better: bool,
                     fraction: bool) -> float:
    """What the measurements of a save are ranked by: the median of the better half of the
    samples (the 25% quantile of a time), or the value where there are too few."""
    if fraction or len(samples) < MIN_SAMPLES:
        return float(value)
    q = 0.75 if higher_is_better else 0.25
    return quantile_or_nan(samples, q)


def spread(samples: Sequence[float], higher_is_better: bool, fraction: bool = False, *,
           floor: bool = True) -> float | None:
    """How far the median sits from the estimate (:func:`estimate`, with or without its
    ``floor``), relative: (median - estimate) / estimate for a time, the mirror for a rate.
    A fraction is measured against ``_FRACTION_SPREAD_FLOOR`` where its estimate is smaller
    (a comm_overhead of 0.002 with a median of 0.02 is not 900% noisy).  None with too few
    samples."""
    if len(samples) < MIN_SAMPLES:
        return None
    good = estimate(samples, 0.0, higher_is_better, False, floor=floor)
    scale = max(abs(good), _FRACTION_SPREAD_FLOOR) if fraction else abs(good)
    if scale == 0:
        return None
    return abs(median_or_nan(samples) - good) / scale


def good_half(samples: Sequence[float], higher_is_better: bool) -> list[float]:
    """The better half of the samples (the faster for a time), which the test compares:
    the slow half of a time is where the noise lives, and it would drown the signal."""
    ordered = sorted(samples, reverse=higher_is_better)
    return ordered[: (len(ordered) + 1) // 2]


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n with ties averaged, and the sizes of the tie groups."""
    _, group, sizes = np.unique(values, return_inverse=True, return_counts=True)
    first = np.cumsum(sizes) - sizes  # the 0-based position where each tie group starts
    ranks = (first + (sizes - 1) / 2 + 1)[group]
    return ranks.astype(float), sizes.astype(float)


def _u_distribution(m: int, n: int) -> np.ndarray:
    """How many of the C(m + n, m) orderings of m x's and n y's give U = 0, 1, ..., m * n
    (U: the pairs with the x above the y), by the recurrence
    c(m, n; u) = c(m - 1, n; u - n) + c(m, n - 1; u), as float64 (exact to 2**53)."""
    # rows[j]: the counts for (i, j) as i grows, one array per j
    rows = [np.ones(1) for _ in range(n + 1)]  # i = 0: U = 0 in one way
    for i in range(1, m + 1):
        new = [np.ones(1)]  # j = 0: U = 0 in one way
        for j in range(1, n + 1):
            c = np.zeros(i * j + 1)
            c[j:j + len(rows[j])] += rows[j]  # the largest is an x: above all j y's
            c[:len(new[j - 1])] += new[j - 1]  # the largest is a y
            new.append(c)
        rows = new
    return rows[n]


def mann_whitney_greater(x: Sequence[float], y: Sequence[float], *,
                         exact: bool = True) -> float:
    """One-sided p-value that ``x`` tends to be larger than ``y`` (Mann-Whitney U): with
    ``exact``, exact where there are no ties and at most ``_EXACT_PAIRS`` pairs (the
    distribution of U, counted); else the normal approximation with tie and continuity
    corrections."""
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        return 1.0
    ranks, ties = _average_ranks(np.concatenate([np.asarray(x, float), np.asarray(y, float)]))
    u = float(ranks[:nx].sum()) - nx * (nx + 1) / 2
    if exact and nx * ny <= _EXACT_PAIRS and not (ties > 1).any():
        counts = _u_distribution(nx, ny)
        return float(counts[round(u):].sum() / counts.sum())
    n = nx + ny
    tie_term = float((ties**3 - ties).sum()) / (n * (n - 1)) if n > 1 else 0.0
    variance = nx * ny / 12 * ((n + 1) - tie_term)
    if variance <= 0:
        return 0.5
    z = (u - nx * ny / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


def min_abs_delta(unit: str) -> float:
    """The smallest absolute change of a metric in ``unit`` that can count."""
    if unit == "fraction":
        return _MIN_FRACTION_POINTS
    return _MIN_ABS_DELTA.get(unit, 0.0)


def split_parts(samples: Sequence[float], control: Sequence[float],
                sizes: Sequence[int]) -> list[tuple[tuple[float, ...], tuple[float, ...]]]:
    """(samples, control) of each pooled measurement, cut by ``sizes``; all of them as one
    when the sizes do not add up to the samples."""
    if not sizes or sum(sizes) != len(samples):
        return [(tuple(samples), tuple(control))]
    out, start = [], 0
    for n in sizes:
        out.append((tuple(samples[start:start + n]), tuple(control[start:start + n])))
        start += n
    return out


def control_points(parts: Sequence[tuple[Sequence[float], Sequence[float]]]
                   ) -> list[tuple[float, float, Sequence[float]]]:
    """Per measurement: (log of its control level, log of its median time, its samples).

    The control level is the ``_CONTROL_LEVEL_QUANTILE`` of the measurement's controls: a
    slower host slows all of them, while another process's time slice lands on a few, and
    a 2.5 ms control hit by a 3 ms slice would count double."""
    return [(math.log(quantile_or_nan(c, _CONTROL_LEVEL_QUANTILE)),
             math.log(median_or_nan(v)), v)
            for v, c in parts if len(v) and len(c)]


def adjusted_levels(points: Sequence[tuple[float, float, Sequence[float]]], slope: float,
                    q: float) -> list[float]:
    """Per measurement: the ``q`` quantile of its :func:`adjusted` samples (one figure per
    measurement, the unit a test across measurements counts)."""
    return [quantile_or_nan(adjusted([point], slope), q) for point in points]


def adjusted(points: Sequence[tuple[float, float, Sequence[float]]],
             slope: float) -> list[float]:
    """log(time) - slope * log(its measurement's control level), per sample."""
    return [math.log(v) - slope * x for x, _, samples in points for v in samples]
