"""One metric's measurements: read from a fixture's metric, pooled, cut back into their
parts, and a rate turned into the times it stands for.  Pure.

A measurement is a :class:`~pytest_distperf.records.Measured`: the metric's figure, its
:class:`~pytest_distperf.records.Samples` (each sample with the host-speed control and the
memory control timed right after it) and what the noise probe saw while it ran.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.records import Measured, Metric, Samples
from pytest_distperf.verdict.noise import NoiseFigures, pooled_noise
from pytest_distperf.verdict.stats import MIN_SAMPLES, split_parts
from pytest_distperf.verdict.store import StoredMetric

#: (samples, control) of one measurement, as the control's arithmetic takes them.
Part = tuple[tuple[float, ...], tuple[float, ...]]


def measured_of(metric: Metric, noise: NoiseFigures | None) -> Measured:
    """The metric as one measurement, with the noise probe's figures: samples that are not
    finite numbers are left out with their controls; a control that is not a positive
    number drops the control, a memory control that is not drops the memory control."""
    return Measured(metric.value, _usable(metric.as_samples()), *figures(noise))


def _usable(samples: Samples) -> Samples:
    n = len(samples.values)
    if not samples.control or len(samples.control) != n:
        return Samples(tuple(v for v in samples.values if math.isfinite(v)))
    has_memory = len(samples.memory_control) == n
    memory = samples.memory_control if has_memory else (math.nan,) * n
    rows = [(v, c, m) for v, c, m in zip(samples.values, samples.control, memory, strict=True)
            if math.isfinite(v) and math.isfinite(c)]
    if not all(c > 0 for _, c, _ in rows):
        return Samples(tuple(v for v in samples.values if math.isfinite(v)))
    kept = tuple(m for _, _, m in rows)
    usable = has_memory and all(math.isfinite(m) and m > 0 for m in kept)
    return Samples(tuple(v for v, _, _ in rows), tuple(c for _, c, _ in rows),
                   kept if usable else ())


def figures(noise: NoiseFigures | None
            ) -> tuple[float | None, float | None, float | None, float | None, int | None]:
    """(steal, wait, other load, GPU held, SM clock) of the noise probe's figures, as a
    measurement keeps them."""
    if noise is None:
        return None, None, None, None, None
    return noise.steal, noise.wait, noise.other_load, noise.held, noise.sm_clock_mhz


def noise_of(m: Measured) -> NoiseFigures | None:
    """What the noise probe saw during ``m`` (None: nothing was read)."""
    if all(f is None for f in (m.steal, m.wait, m.other_load, m.held, m.sm_clock_mhz)):
        return None
    return NoiseFigures(0.0, m.steal, m.wait, m.other_load, m.held, m.sm_clock_mhz)


def pooled(measurements: Sequence[Measured]) -> Measured:
    """Several measurements as one: samples and controls end to end, each one's size kept,
    the noise figures of the noisiest (the value is the median of the samples)."""
    values = tuple(v for m in measurements for v in m.samples.values)
    control = tuple(c for m in measurements for c in m.samples.control)
    sizes = tuple(n for m in measurements
                  for n in (m.samples.sizes or (len(m.samples.values),)))
    memory = (tuple(c for m in measurements for c in m.samples.memory_control)
              if all(len(m.samples.memory_control) == len(m.samples.values)
                     for m in measurements) else ())
    noise = pooled_noise([f for m in measurements if (f := noise_of(m)) is not None])
    value = median_or_nan(values) if values else measurements[0].value
    return Measured(value, Samples(values, control, memory, sizes), *figures(noise))


def parts(samples: Samples, memory: bool = False) -> list[Part]:
    """(samples, control) of each pooled measurement (all of them as one without sizes);
    ``memory``: with the memory control instead of the compute one."""
    return split_parts(samples.values, samples.memory_control if memory else samples.control,
                       samples.sizes)


def parts_of(measurements: Sequence[Measured], memory: bool = False) -> list[Part]:
    """:func:`parts` of every measurement, in order."""
    return [p for m in measurements for p in parts(m.samples, memory)]


def carries_control(fraction: bool, measurements: Sequence[Measured]) -> bool:
    """Whether measurements of a metric can be judged with their control: a time or a rate
    (a bandwidth is judged as the time it stands for), every sample with a control, every
    sample positive (judged in log space)."""
    return (not fraction
            and all(len(m.samples.control) == len(m.samples.values) >= MIN_SAMPLES
                    for m in measurements)
            and all(v > 0 for m in measurements for v in m.samples.values))


def has_memory_control(base: StoredMetric, measurements: Sequence[Measured]) -> bool:
    """Whether the baseline and every measurement carry the memory control (records made
    before it was added do not)."""
    return (len(base.samples.memory_control) == len(base.samples.values) > 0
            and all(len(m.samples.memory_control) == len(m.samples.values) > 0
                    for m in measurements))


def _inverse(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(1.0 / v if v > 0 else math.nan for v in values)


def as_time(m: Measured) -> Measured:
    """A rate's measurement as the time it stands for (its inverse: a bandwidth of 2 GB/s
    is 0.5 s per GB), controls unchanged."""
    return dataclasses.replace(m, value=_inverse([m.value])[0], samples=dataclasses.replace(
        m.samples, values=_inverse(m.samples.values)))


def as_times(base: StoredMetric, measurements: Sequence[Measured]
             ) -> tuple[StoredMetric, list[Measured]]:
    """A rate's baseline and measurements as times, so that the control's arithmetic, made
    for times, judges them."""
    times = StoredMetric("", False, as_time(base.measured), base.kind)
    return times, [as_time(m) for m in measurements]
