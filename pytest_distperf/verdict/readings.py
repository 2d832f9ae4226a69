"""The controlled rule's arithmetic: readings of a time's change with the host's speed taken
out.  Pure.

A time measured with a host-speed control (``measure()`` on CPU ranks: every sample is
followed by a fixed piece of work on all ranks, :mod:`pytest_distperf.rank.clock`) is
judged in logs with the part of its variation that follows the control taken out, as an
analysis of covariance does: each sample becomes ``log(time) - slope x log(its
measurement's control level)``.  The slope is fitted within the sides (the baseline's
measurements, this run's: :func:`control_slope`); between the sides, where the host may
have changed speed since the save, each reading takes the host's change out at a slope of
its own (:data:`FITTED`, :data:`IN_PROPORTION`, :data:`MEMORY`).  docs/verdict-rule.md
says which reading decides what.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np

from pytest_distperf.common.quantiles import median_or_nan, quantile_or_nan
from pytest_distperf.records import Measured
from pytest_distperf.verdict.measurements import (
    as_times,
    has_memory_control,
    parts,
    parts_of,
)
from pytest_distperf.verdict.stats import (
    MIN_SAMPLES,
    adjusted,
    adjusted_levels,
    control_points,
    mann_whitney_greater,
)
from pytest_distperf.verdict.store import StoredMetric

#: The readings: the host's change between the save and now taken out at the slope fitted
#: within the sides, ...
FITTED = "at the fitted slope"
#: ... in proportion (work on the host's CPU follows a slower host 1:1, whatever the fit saw
#: of the host's moves within the sides), ...
IN_PROPORTION = "in proportion"
#: ... and at the slope the memory control's change says (a time) ...
MEMORY = "at the memory control's slope"
#: ... or in proportion to the memory control (a bandwidth: a gloo collective copies and adds
#: buffers, as the memory control does); ...
MEMORY_IN_PROPORTION = "in proportion to the memory control"
#: ... and not at all (slope 0): a change seen only with the host's change taken out may be
#: a metric that does not follow the control.
AS_MEASURED = "as measured"

#: The adjusted samples are judged by this quantile: noise from other processes only pushes
#: times up, and the median carries it.
_CONTROL_ESTIMATOR_QUANTILE = 0.25
#: The slope of the in-proportion reading, and the least the memory reading takes.
_BETWEEN_SLOPE = 1.0
#: The most the memory reading takes: the memory control's change over the compute
#: control's, clipped, leaves out a memory control that moved alone.  Not where the host stole
#: CPU time in every measurement (:func:`stolen_since`).
_MEMORY_SLOPE_MAX = 1.5
#: A measurement this much slower than the fastest of its run's others (each relative to its
#: own control) was slowed by something the noise probe cannot see: a slowdown of the code
#: slows every measurement alike, whatever the tolerance.
_OUTLIER_LIMIT = 0.3
#: The median absolute deviation of normal figures times this (1.4826) is their standard
#: deviation.
_MAD_TO_SD = 1.0 / statistics.NormalDist().inv_cdf(0.75)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """A time's change (this run's pooled measurements against the baseline's) with the
    host's change between the sides taken out at one slope."""

    name: str  # FITTED, IN_PROPORTION, MEMORY or MEMORY_IN_PROPORTION
    change: float | None  # relative, in the metric's own terms (a rate: of the rate)
    worse: float  # the change in the bad direction (negative: better)
    slope: float  # the slope the host's change between the sides was taken out at
    host_change: float  # how much slower than at the save the control taken out ran
    #: one-sided Mann-Whitney of the adjusted samples (their normal approximation)
    p_worse: float
    p_better: float


def control_slope(base: StoredMetric, measurements: Sequence[Measured]) -> float:
    """How strongly the time follows the control: :func:`fitted_slope` over the baseline's
    measurements and ``measurements``; 0 (the plain comparison) with nothing to fit.

    Whole measurements, not single samples: a sample's control carries its own jitter,
    which would flatten the slope."""
    return fitted_slope((control_points(parts(base.samples)),
                         control_points(parts_of(measurements))))


def fitted_slope(sides: Sequence[Sequence[tuple[float, float, Sequence[float]]]],
                 clip: tuple[float, float] = (0.0, 1.0)) -> float:
    """The least-squares slope of y on x over the (x, y, ...) points of every side, each
    side centred on its own medians (so that a change between the sides does not enter
    it), clipped to ``clip``; 0 with under three points."""
    xs: list[float] = []
    ys: list[float] = []
    for points in sides:
        if not points:
            continue
        cx = median_or_nan([x for x, _, _ in points])
        cy = median_or_nan([y for _, y, _ in points])
        xs += [x - cx for x, _, _ in points]
        ys += [y - cy for _, y, _ in points]
    x, y = np.asarray(xs), np.asarray(ys)
    if len(x) < 3 or float(np.dot(x, x)) <= 0:
        return 0.0
    return float(np.clip(np.dot(x, y) / np.dot(x, x), *clip))


def memory_slope(host_log: float, memory_log: float, *, capped: bool = True) -> float:
    """The slope of the memory reading: the memory control's change over the compute
    control's (both logs), clipped to [``_BETWEEN_SLOPE``, ``_MEMORY_SLOPE_MAX``] (not
    ``capped``: not above); ``_BETWEEN_SLOPE`` where the two moved apart or the compute
    control did not move."""
    if abs(host_log) < 1e-9 or memory_log / host_log <= _BETWEEN_SLOPE:
        return _BETWEEN_SLOPE
    return min(memory_log / host_log, _MEMORY_SLOPE_MAX) if capped else memory_log / host_log


def stolen_since(base: StoredMetric, measurements: Sequence[Measured]) -> bool:
    """Whether the host stole CPU time in every one of ``measurements``, more than in the
    save's worst measurement (the steal a baseline keeps): other guests of the host were
    busy since the save, and a memory control slower than the compute one is their traffic,
    not a move of its own.  False where a steal is unknown."""
    saved = base.measured.steal
    return (saved is not None and bool(measurements)
            and all(m.steal is not None and m.steal > saved for m in measurements))


def memory_alone(readings: Sequence[Reading]) -> float:
    """How much slower than the compute control the memory control ran since the save
    (relative; negative: faster), from a time's readings (the fitted one first); 0 without
    a time's memory reading (a rate's takes the memory control's change out itself)."""
    memory = next((r for r in readings if r.name == MEMORY), None)
    if memory is None:
        return 0.0
    own = (1.0 + memory.host_change) / (1.0 + readings[0].host_change) - 1.0
    return own if math.isfinite(own) else 0.0


def _host_log(base_points: Sequence[tuple[float, float, Sequence[float]]],
              cur_points: Sequence[tuple[float, float, Sequence[float]]]) -> float:
    """log of how much slower a control ran now than at the save (the medians of the
    measurements' control levels)."""
    return (median_or_nan([x for x, _, _ in cur_points])
            - median_or_nan([x for x, _, _ in base_points]))


def read(base: StoredMetric, used: Sequence[Measured], every: Sequence[Measured], *,
         rate: bool = False) -> list[Reading]:
    """The readings of this run's measurements ``used`` (pooled; those of ``every`` its
    verdict rests on) against ``base``, all of them times: at the fitted slope; in
    proportion, where the fit is under 1 and the host moved; at the memory control's slope,
    where the baseline and every measurement carry the memory control (not capped where
    :func:`stolen_since` holds for ``every``); as measured, where the fitted slope and the
    host moved.  ``rate``: they are a rate's, as the times it stands for
    (:func:`~.measurements.as_times`), its change given in its own terms."""
    fitted = control_slope(base, used)
    base_points = control_points(parts(base.samples))
    cur_points = control_points(parts_of(used))
    host_log = _host_log(base_points, cur_points)
    q = _CONTROL_ESTIMATOR_QUANTILE
    rb, rc = adjusted(base_points, fitted), adjusted(cur_points, fitted)

    def reading(name: str, slope: float, shift: float, shown_log: float) -> Reading:
        cur = [r - shift for r in rc]  # the current side at the baseline's host speed
        change = math.exp(quantile_or_nan(cur, q) - quantile_or_nan(rb, q)) - 1.0
        if rate:  # 10% more time is 9.1% less bandwidth
            change = 1.0 / (1.0 + change) - 1.0 if change > -1.0 else math.nan
        worse = -change if rate else change
        return Reading(name=name, change=None if math.isnan(change) else change,
                       worse=0.0 if math.isnan(worse) else worse, slope=slope,
                       host_change=math.exp(shown_log) - 1.0,
                       p_worse=mann_whitney_greater(cur, rb, exact=False),
                       p_better=mann_whitney_greater(rb, cur, exact=False))

    out = [reading(FITTED, fitted, 0.0, host_log)]
    if fitted < _BETWEEN_SLOPE and math.exp(host_log) - 1.0 != 0.0:
        out.append(reading(IN_PROPORTION, _BETWEEN_SLOPE,
                           (_BETWEEN_SLOPE - fitted) * host_log, host_log))
    if has_memory_control(base, every):
        memory_log = _host_log(control_points(parts(base.samples, memory=True)),
                               control_points(parts_of(used, memory=True)))
        # the cap is for a memory control that moved alone; under steal, neighbours moved it
        capped = not stolen_since(base, every)
        out.append(reading(*_memory_between(host_log, memory_log, fitted, rate,
                                            capped=capped), memory_log))
    if fitted > 0.0 and math.exp(host_log) - 1.0 != 0.0:
        out.append(reading(AS_MEASURED, 0.0, -fitted * host_log, host_log))
    return out


def _memory_between(host_log: float, memory_log: float, fitted: float,
                    rate: bool, *, capped: bool = True) -> tuple[str, float, float]:
    """(name, slope, shift of the current side's adjusted logs) of the memory reading: a
    time's at :func:`memory_slope` (``capped``: as it says); a rate's with the memory
    control's own change taken out 1:1."""
    if rate:
        return MEMORY_IN_PROPORTION, _BETWEEN_SLOPE, memory_log - fitted * host_log
    slope = memory_slope(host_log, memory_log, capped=capped)
    return MEMORY, slope, (slope - fitted) * host_log


def outlier_limit() -> float:
    """How much slower than another of its run a measurement is set aside (relative)."""
    return _OUTLIER_LIMIT


def without_outliers(measurements: Sequence[Measured], *, higher_is_better: bool = False,
                     typical: bool = False) -> list[Measured]:
    """The measurements of one run with the control (3 or more) less those slower than the
    fastest of the others by more than ``_OUTLIER_LIMIT`` (:func:`outlier_limit`), each
    measurement's 25% quantile taken over its control's: noise only slows a time, and a
    slowdown of the code slows every measurement.  ``typical``: than the median of the
    others instead (a save, whose measurements must stand for the host's usual speed:
    against the fastest, a metric that spreads 30% from one measurement to the next would
    keep only its fastest few).  ``higher_is_better``: the samples are rates."""
    if len(measurements) < 3:
        return list(measurements)
    q = _CONTROL_ESTIMATOR_QUANTILE

    def level(m: Measured) -> float:
        values = m.samples.values
        time = (-math.log(quantile_or_nan(values, 1.0 - q)) if higher_is_better
                else math.log(quantile_or_nan(values, q)))
        return time - math.log(quantile_or_nan(m.samples.control, q))

    levels = [level(m) for m in measurements]
    limit = math.log1p(outlier_limit())
    reference = median_or_nan if typical else min
    return [m for i, m in enumerate(measurements)
            if not levels[i] - reference(levels[:i] + levels[i + 1:]) > limit]


def control_level(m: Measured) -> float:
    """The log of a measurement's control level (:func:`~.stats.control_points`)."""
    return control_points([(m.samples.values, m.samples.control)])[0][0]


def contradicted(measurements: Sequence[Measured], save_level: float,
                 tolerance: float) -> list[bool]:
    """Per measurement of one metric in a save: whether its control level sits more than
    the tolerance from ``save_level`` (the median log control level of every measurement
    of the save) while the median of its samples sits within it of the metric's usual
    (their median over ``measurements``): the control read a moment its metric did not
    see, and stored, it would move every later comparison by as much, past the line."""
    limit = math.log1p(tolerance)
    levels = [math.log(median_or_nan(m.samples.values)) for m in measurements]
    usual = median_or_nan(levels)
    return [abs(control_level(m) - save_level) > limit and abs(level - usual) <= limit
            for m, level in zip(measurements, levels, strict=True)]


@dataclasses.dataclass(frozen=True, slots=True)
class Detectable:
    """What a baseline's own measurements say about the changes a comparison can tell."""

    spread: float  # of the measurements' adjusted 25% quantiles (logs; MAD as a std. dev.)
    measurements: int  # the baseline's measurements it was taken over
    change: float  # the smallest change told ``power`` of the time (relative)
    power: float


def detectable_change(base: StoredMetric, *, compared: int, alpha: float,
                      power: float) -> Detectable | None:
    """The smallest change that a one-sided test at ``alpha`` of ``compared`` measurements
    against this baseline's would tell ``power`` of the time, with the measurements as the
    units (each one figure, its adjusted 25% quantile) and their spread taken from the
    baseline's own: exp((z(1 - alpha) + z(power)) x s x sqrt(1 / compared + 1 / B)) - 1,
    with s the median absolute deviation of the B measurements' figures as a standard
    deviation (a save in a drift of the host has a few measurements far off, which the
    rule's quantiles and rank tests shrug off and a standard deviation would not).

    An estimate from the save alone, neither a floor nor a promise: what moves between a
    save and a compare run adds to it.  A rate's is a drop of the rate.  None without a
    control or with fewer than 3 measurements."""
    times = as_times(base, [])[0] if base.higher_is_better else base
    if not len(times.samples.control) == len(times.samples.values) >= MIN_SAMPLES:
        return None
    points = control_points(parts(times.samples))
    if len(points) < 3:
        return None
    levels = adjusted_levels(points, control_slope(times, []), _CONTROL_ESTIMATOR_QUANTILE)
    if not all(math.isfinite(v) for v in levels):
        return None
    return change_told(levels, base.higher_is_better, compared=compared, alpha=alpha,
                       power=power)


def change_told(levels: Sequence[float], higher_is_better: bool, *, compared: int,
                alpha: float, power: float) -> Detectable:
    """:func:`detectable_change` from the measurements' figures (logs) themselves."""
    centre = statistics.median(levels)
    s = _MAD_TO_SD * statistics.median(abs(v - centre) for v in levels)
    normal = statistics.NormalDist()
    z = normal.inv_cdf(1.0 - alpha) + normal.inv_cdf(power)
    log_change = z * s * math.sqrt(1.0 / compared + 1.0 / len(levels))
    # in the metric's own terms: a time that much longer, a rate that much lower
    change = -math.expm1(-log_change) if higher_is_better else math.expm1(log_change)
    return Detectable(s, len(levels), change, power)
