"""The decision rule: one metric's measurements against its baseline.  Pure.

docs/verdict-rule.md states the rule in numbered sentences; each names the function or the
constant that does it, here or in :mod:`~.stats` (estimates, the test), :mod:`~.noise` (the
probe) and :mod:`~.readings` (the control's arithmetic).  The sentences a user reads are
built in :mod:`~.explain`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.records import (
    IMPROVED,
    INCONCLUSIVE,
    NO_BASELINE,
    NOT_COMPARABLE,
    PEAK,
    REGRESSED,
    SAVED,
    UNCHANGED,
    Measured,
    Metric,
    Verdict,
)
from pytest_distperf.verdict import explain
from pytest_distperf.verdict.assessment import Assessment
from pytest_distperf.verdict.measurements import (
    as_times,
    carries_control,
    noise_of,
    parts,
    pooled,
)
from pytest_distperf.verdict.readings import (
    AS_MEASURED,
    FITTED,
    IN_PROPORTION,
    Detectable,
    Reading,
    change_told,
    detectable_change,
    memory_alone,
    read,
    without_outliers,
)
from pytest_distperf.verdict.stats import (
    MIN_SAMPLES,
    estimate,
    good_half,
    mann_whitney_greater,
    min_abs_delta,
    spread,
)
from pytest_distperf.verdict.store import StoredMetric

T = TypeVar("T")

#: One-sided Mann-Whitney U significance a regression or an improvement needs.
_ALPHA = 0.01
#: A measurement whose samples spread more than this ((median - estimate) / estimate) is
#: too noisy, ...
_SPREAD_LIMIT = 0.5
#: ... or, for a metric whose own samples always spread more, more than this many times its
#: typical spread: the limit is there to see another process's time slices, not a metric's
#: own spread (a gloo all-reduce's calls spread by 70-80% in quiet measurements).
_SPREAD_RATIO = 1.5
#: Re-measurements that must all still be past the line before a regression without the
#: control is called: the host has slow spells of a few seconds, and four measurements in a
#: row rarely all fall in one.
_CONFIRMATIONS = 3
#: Re-measurements at most to confirm (or clear) a suspected regression without the control.
_CONFIRM_ROUNDS = 3
#: With the control, measurements pooled before a regression is called: six a side catch a
#: 10% slowdown nine times in ten, for 1-2% of clean runs false-alarmed.
_CONTROL_MEASUREMENTS = 6
#: ... taken only while the pooled change is worse by this fraction of the tolerance: a
#: clean run rarely needs more than two.
_SCREEN_FRACTION = 0.5
#: An improvement with the control needs this many measurements, the last one better than
#: the line on its own: one set of rank processes runs a few percent faster than another.
_IMPROVEMENT_MEASUREMENTS = 2
#: ... and any change must be past this share of the host's change since the save: an
#: error e in the fitted slope leaves e x the host's change in the adjusted time.
_SLOPE_ERROR = 0.5
#: A peak of device memory may move by this share of itself and be unchanged: the caching
#: allocator rounds blocks to 512 bytes, so the same code on the same device peaks alike.
PEAK_TOLERANCE = 0.01
#: A save states the smallest change its comparisons tell this often.
_DETECTABLE_POWER = 0.9
#: The most measurements a comparison takes.
MOST_MEASUREMENTS = max(_CONFIRM_ROUNDS + 1, _CONTROL_MEASUREMENTS)


class Decision(NamedTuple):
    verdict: str
    assessment: Assessment
    detail: str  # one plain sentence, then the figures (:mod:`~.explain`)
    more: bool  # whether to measure again


def _past(worse: float, tolerance: float) -> bool:
    """Sentence 2: a change larger than the tolerance (in the bad direction; the better
    direction with ``-worse``)."""
    return worse > tolerance


def _significant(p: float | None) -> bool:
    """Sentence 4 (None: too few samples to test; the line and the confirmations decide)."""
    return p is None or p < _ALPHA


def noise_reasons(m: Measured, higher_is_better: bool, fraction: bool = False,
                  limit: float = _SPREAD_LIMIT, *, floor: bool = True) -> list[str]:
    """Sentence 3: why a measurement is too noisy to judge (empty when it can be): the noise
    probe's reasons, or samples spread past ``limit`` (:func:`spread_limit`; ``floor``: the
    spread against the estimate of sentence 1, else against the bare 5% quantile)."""
    noise = noise_of(m)
    noisy = list(noise.too_noisy()) if noise is not None else []
    spr = spread(m.samples.values, higher_is_better, fraction, floor=floor)
    if spr is not None and spr > limit:
        noisy.append(explain.spread_reason(spr, limit))
    return noisy


def spread_limit(measurements: Sequence[Sequence[float]], higher_is_better: bool,
                 fraction: bool = False, *, floor: bool = True) -> float:
    """The sample spread past which a measurement of a metric is too noisy:
    ``_SPREAD_LIMIT``, or ``_SPREAD_RATIO`` x the median spread of ``measurements`` (the
    baseline's, or a save's own) where that is more."""
    spreads = [s for samples in measurements
               if (s := spread(samples, higher_is_better, fraction, floor=floor)) is not None]
    if not spreads:
        return _SPREAD_LIMIT
    return max(_SPREAD_LIMIT, _SPREAD_RATIO * median_or_nan(spreads))


def assess(base: StoredMetric, m: Measured, tolerance: float) -> Assessment:
    """One measurement against the baseline, by the estimates of sentence 1 and the test of
    sentence 4 (the better halves of the samples)."""
    hib, fraction = base.higher_is_better, base.is_fraction
    b = estimate(base.samples.values, base.value, hib, fraction)
    c = estimate(m.samples.values, m.value, hib, fraction)
    delta = c - b
    change = delta / abs(b) if b != 0 else None
    sign = -1.0 if hib else 1.0
    if change is not None:
        worse = sign * change
    else:
        worse = math.copysign(math.inf, sign * delta) if delta else 0.0
    big_enough = abs(delta) >= min_abs_delta(base.unit) and abs(delta) > 0
    p_worse = p_better = None
    cur, old = good_half(m.samples.values, hib), good_half(base.samples.values, hib)
    if len(cur) >= MIN_SAMPLES and len(old) >= MIN_SAMPLES:
        up, down = mann_whitney_greater(cur, old), mann_whitney_greater(old, cur)
        p_worse, p_better = (down, up) if hib else (up, down)
    limit = spread_limit([values for values, _ in parts(base.samples)], hib, fraction)
    return Assessment(baseline=b, current=c, change=change, worse=worse,
                      worse_like=big_enough and _past(worse, tolerance),
                      better_like=big_enough and _past(-worse, tolerance),
                      p_worse=p_worse, p_better=p_better,
                      spread=spread(m.samples.values, hib, fraction), measured=m,
                      noisy=tuple(noise_reasons(m, hib, fraction, limit)))


def controlled(base: StoredMetric, measurements: Sequence[Measured]) -> bool:
    """Sentence 6: whether a metric is judged with its host-speed control: a time or a rate
    (not a fraction, every sample positive) with a control for every sample, in the
    baseline and in every measurement."""
    samples = base.samples
    return (len(samples.control) == len(samples.values) >= MIN_SAMPLES
            and all(v > 0 for v in samples.values)
            and carries_control(base.is_fraction, measurements))


def decide(base: StoredMetric, measurements: Sequence[Measured], tolerance: float, *,
           can_confirm: bool) -> Decision:
    """The verdict of a measured metric, the assessment it reports, its detail and whether
    to measure again (``can_confirm``: the metric can be measured again)."""
    if controlled(base, measurements):
        return decide_controlled(base, measurements, tolerance, can_confirm=can_confirm)
    return decide_plain(base, measurements, tolerance, can_confirm=can_confirm)


def decide_plain(base: StoredMetric, measurements: Sequence[Measured], tolerance: float, *,
                 can_confirm: bool) -> Decision:
    """Sentence 5: without the control, improved by the best measurement; regressed when a
    quiet, significant measurement past the line holds through ``_CONFIRMATIONS``
    re-measurements, the best of them (a fraction: the median one) still past it."""
    assessments = [assess(base, m, tolerance) for m in measurements]
    best = _representative(assessments, base.is_fraction)
    n = len(measurements)
    confirmed = n > _CONFIRMATIONS or not can_confirm
    rounds_left = can_confirm and n <= max(_CONFIRM_ROUNDS, _CONFIRMATIONS)
    if best.better_like and _significant(best.p_better):
        return Decision(IMPROVED, best, explain.improved(best, base, n), False)
    if not best.worse_like:
        return Decision(UNCHANGED, best, "", False)
    evidence = [a for a in assessments if a.trusted and _significant(a.p_worse)]
    if evidence and confirmed:
        chosen = _representative(evidence, base.is_fraction)
        return Decision(REGRESSED, chosen, explain.regressed(chosen, base, n), False)
    if evidence:  # seen once, in a quiet measurement: measure again before calling it
        return Decision(INCONCLUSIVE, best, explain.AWAITING, rounds_left)
    if all(a.noisy for a in assessments):
        return Decision(INCONCLUSIVE, best,
                        explain.too_noisy([", ".join(a.noisy) for a in assessments]),
                        rounds_left)
    p = min((a.p_worse for a in assessments if a.trusted and a.p_worse is not None),
            default=None)
    return Decision(INCONCLUSIVE, best, explain.not_clear(best, base, p, _ALPHA),
                    rounds_left)


def decide_controlled(base: StoredMetric, measurements: Sequence[Measured],
                      tolerance: float, *, can_confirm: bool) -> Decision:
    """Sentences 6-10: a time (or a rate, as the time it stands for) with the host-speed
    control, by its readings (:func:`~.readings.read`)."""
    regression, improvement = _controlled_assessments(base, measurements, tolerance)
    n = len(measurements)
    more = can_confirm and n < _CONTROL_MEASUREMENTS
    host = abs(regression.host_change or 0.0)
    improving = _all_past(improvement.readings, tolerance, better=True)
    if improving and more and not _borne_out(base, measurements, tolerance):
        return Decision(INCONCLUSIVE, regression, explain.AWAITING, True)
    if (improving and _beyond_host(improvement, host)
            and _significant(improvement.p_better)):
        return Decision(IMPROVED, improvement, explain.improved(improvement, base, n),
                        False)
    if more and not _screened_out(regression, tolerance):
        return Decision(INCONCLUSIVE, regression, explain.AWAITING, True)
    moved = regression.worse_like or regression.better_like
    if moved and not _beyond_host(regression, host):
        return Decision(INCONCLUSIVE, regression,
                        explain.host_hides(regression, base, _SLOPE_ERROR), False)
    if not any(_past(r.worse, tolerance) for r in _host_readings(regression)):
        return Decision(UNCHANGED, regression, "", False)
    if not _all_past(regression.readings, tolerance):
        raw = next((r for r in regression.readings if r.name == AS_MEASURED), None)
        if raw is not None and _all_past([r for r in regression.readings if r is not raw],
                                         tolerance):
            return Decision(INCONCLUSIVE, regression,
                            explain.only_adjusted(regression, base, raw), False)
        return Decision(INCONCLUSIVE, regression,
                        explain.readings_disagree(regression, base), False)
    if not _beyond_memory(regression):
        return Decision(INCONCLUSIVE, regression, explain.memory_hides(regression, base), False)
    if _significant(regression.p_worse) and regression.noisy:
        return Decision(INCONCLUSIVE, regression, explain.noisy_only(regression, base), False)
    if _significant(regression.p_worse):
        return Decision(REGRESSED, regression,
                        explain.regressed(regression, base, n), False)
    return Decision(INCONCLUSIVE, regression,
                    explain.not_clear(regression, base, regression.p_worse, _ALPHA), False)


def _all_past(readings: Sequence[Reading], tolerance: float, *, better: bool = False) -> bool:
    """Every reading past the line (``better``: in the better direction)."""
    return all(_past(-r.worse if better else r.worse, tolerance) for r in readings)


def _controlled_assessments(base: StoredMetric, measurements: Sequence[Measured],
                            tolerance: float) -> tuple[Assessment, Assessment]:
    """Sentence 7: (the regression's assessment, the improvement's): the quiet measurements
    pooled (all of them when none is quiet: then ``noisy`` holds why), the regression's
    less those slowed alone."""
    times, timed = (as_times(base, measurements) if base.higher_is_better
                    else (base, list(measurements)))
    limit = spread_limit([values for values, _ in parts(times.samples)], False, floor=False)
    reasons = [noise_reasons(m, False, limit=limit, floor=False) for m in timed]
    quiet = [m for m, why in zip(timed, reasons, strict=True) if not why]
    noisy = () if quiet else tuple(", ".join(why) for why in reasons)
    kept = without_outliers(quiet)
    regression = _pooled_assessment(base, times, kept or timed, timed, tolerance, noisy,
                                    len(quiet) - len(kept))
    if len(kept) == len(quiet):
        return regression, regression
    return regression, _pooled_assessment(base, times, quiet, timed, tolerance, noisy, 0)


def _pooled_assessment(base: StoredMetric, times: StoredMetric, used: Sequence[Measured],
                       every: Sequence[Measured], tolerance: float, noisy: tuple[str, ...],
                       set_aside: int) -> Assessment:
    """``used`` pooled against the baseline, read every way (``times``, ``used``, ``every``:
    a rate's as times); it reports the reading at the fitted slope, at the baseline's
    host speed, and the test of the least significant reading that takes the host's change
    out (sentence 10)."""
    readings = read(times, used, every, rate=base.higher_is_better)
    fitted, cur = readings[0], pooled(used)
    tested = [r for r in readings if r.name != AS_MEASURED]  # that one only vetoes
    b = estimate(base.samples.values, base.value, base.higher_is_better, False)
    c = b * (1.0 + fitted.change) if fitted.change is not None else math.nan
    return Assessment(baseline=b, current=c, change=fitted.change, worse=fitted.worse,
                      worse_like=_past(fitted.worse, tolerance),
                      better_like=_past(-fitted.worse, tolerance),
                      p_worse=max(r.p_worse for r in tested),
                      p_better=max(r.p_better for r in tested),
                      spread=spread(cur.samples.values, False, floor=False), measured=cur,
                      noisy=noisy, host_change=fitted.host_change, control_slope=fitted.slope,
                      set_aside=set_aside, readings=tuple(readings))


def _host_readings(a: Assessment) -> list[Reading]:
    """The readings by the host-speed control alone (the memory reading only vetoes)."""
    return [r for r in a.readings if r.name in (FITTED, IN_PROPORTION)]


def _screened_out(a: Assessment, tolerance: float) -> bool:
    """Sentence 8: the measurements so far are near the baseline by every host reading."""
    return max(r.worse for r in _host_readings(a)) < tolerance * _SCREEN_FRACTION


def _beyond_host(a: Assessment, host: float) -> bool:
    """Sentence 9: the change is past what an error in the fitted slope could leave of the
    host's change since the save."""
    return abs(a.worse) >= _SLOPE_ERROR * host


def _beyond_memory(a: Assessment) -> bool:
    """Sentence 9: a time's regression is past the memory control's own move since the save
    (how much more than the compute control it slowed): how much of that a metric follows is
    not known."""
    return a.worse > memory_alone(a.readings)


def _borne_out(base: StoredMetric, measurements: Sequence[Measured], tolerance: float) -> bool:
    """Sentence 10: an improvement has ``_IMPROVEMENT_MEASUREMENTS`` and its last one is
    better than the line on its own."""
    return (len(measurements) >= _IMPROVEMENT_MEASUREMENTS
            and _better_alone(base, measurements[-1], tolerance))


def _better_alone(base: StoredMetric, m: Measured, tolerance: float) -> bool:
    """One measurement, on its own, better than the line by every host reading."""
    alone = _controlled_assessments(base, [m], tolerance)[0]
    return _all_past(_host_readings(alone), tolerance, better=True)


def representative(items: Sequence[T], badness: Callable[[T], float], fraction: bool) -> T:
    """The measurement that speaks for several (a save's, a confirmation's): the best one,
    by ``badness`` (noise only slows a time down), or for a fraction the median one (the
    lower middle of an even count, in the better direction): a ratio of two noisy times is
    pushed either way, and the best of several sits at the low end of its spread."""
    ordered = sorted(items, key=badness)
    return ordered[(len(ordered) - 1) // 2] if fraction else ordered[0]


def _representative(assessments: Sequence[Assessment], fraction: bool) -> Assessment:
    return representative(assessments, lambda a: a.worse, fraction)


def decide_exact(base: StoredMetric, m: Measured,
                 exact_tolerance: float) -> tuple[str, Assessment, str]:
    """Sentence 11: an exact metric (a count or a byte total) is regressed or improved by
    any change beyond ``exact_tolerance`` (absolute), from this one measurement: a count
    does not depend on the host's speed.  A peak of device memory (kind ``peak``) by a
    change beyond ``PEAK_TOLERANCE`` of it."""
    b, c = base.value, m.value
    delta = c - b
    sign = -1.0 if base.higher_is_better else 1.0
    change = delta / abs(b) if b else None
    worse = sign * change if change is not None else (
        math.copysign(math.inf, sign * delta) if delta else 0.0)
    peak = base.kind == PEAK
    past = abs(delta) > (PEAK_TOLERANCE * abs(b) if peak else exact_tolerance)
    a = Assessment(baseline=b, current=c, change=change, worse=worse,
                   worse_like=past and sign * delta > 0, better_like=past and sign * delta < 0,
                   measured=m)
    if not past:
        return UNCHANGED, a, ""
    verdict = REGRESSED if a.worse_like else IMPROVED
    if peak:
        return verdict, a, explain.peak(verdict, b, c, PEAK_TOLERANCE)
    return verdict, a, explain.exact(verdict, b, c, exact_tolerance, base.unit)


def detectable(base: StoredMetric) -> Detectable | None:
    """What a save can tell: the smallest change a comparison of ``_CONTROL_MEASUREMENTS``
    measurements against it tells ``_DETECTABLE_POWER`` of the time at ``_ALPHA``
    (:func:`~.readings.detectable_change`)."""
    return detectable_change(base, compared=_CONTROL_MEASUREMENTS, alpha=_ALPHA,
                             power=_DETECTABLE_POWER)


def tells_the_line(told: Detectable | None, tolerance: float) -> bool:
    """Whether a save's measurements tell a change of the tolerance (the decision line,
    sentence 2) as often as :func:`detectable` asks; False where they say nothing."""
    return told is not None and told.change <= tolerance


def detectable_levels(levels: Sequence[float], higher_is_better: bool) -> Detectable:
    """:func:`detectable` from measurements' figures (logs) without a control."""
    return change_told(levels, higher_is_better, compared=_CONTROL_MEASUREMENTS,
                       alpha=_ALPHA, power=_DETECTABLE_POWER)


def _confidence(verdict: str, a: Assessment) -> float | None:
    """1 - p of the one-sided Mann-Whitney test the decision used (sentences 4 and 10)."""
    p = a.p_better if verdict == IMPROVED else a.p_worse
    if p is None or verdict in (UNCHANGED, NO_BASELINE, NOT_COMPARABLE, SAVED):
        return None
    return 1.0 - p


def make_verdict(metric: Metric, verdict: str, env_id: str, assessment: Assessment | None,
                 *, tolerance: float, measurement_count: int, detail: str) -> Verdict:
    """The record of one metric's verdict (``assessment`` None: nothing was compared)."""
    a = assessment
    m = a.measured if a is not None else None
    return Verdict(
        metric=metric.name, verdict=verdict, environment=env_id, unit=metric.unit,
        higher_is_better=metric.higher_is_better,
        baseline=a.baseline if a is not None else None,
        current=a.current if a is not None else metric.value,
        change=a.change if a is not None else None,
        confidence=_confidence(verdict, a) if a is not None else None,
        tolerance=tolerance, measurement_count=measurement_count,
        steal=m.steal if m is not None else None,
        wait=m.wait if m is not None else None,
        other_load=m.other_load if m is not None else None,
        spread=a.spread if a is not None else None,
        detail=detail,
        host_change=a.host_change if a is not None else None,
        control_slope=a.control_slope if a is not None else None,
        kind=metric.kind,
    )
