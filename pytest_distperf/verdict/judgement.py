"""One test's verdicts: compare its metrics with their baselines, or save them as new ones,
asking for re-measurements until every verdict is settled.  Pure: no torch, no pytest.

Two paths, one class each: :class:`Comparison` (the default) and :class:`Save`
(``--distperf-save``); :func:`make_judgement` picks one.  Both keep every measurement of
every metric and say which measurements they want repeated; :func:`settle` runs the
re-measure loop with whatever callables the caller gives it (the plugin gives the test's
own measurements and the noise probe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence

from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.config import DEFAULT_SAVE_MEASUREMENTS
from pytest_distperf.records import (
    EXACT,
    INFO,
    INFORMATIONAL,
    MEASURED,
    NO_BASELINE,
    NOT_COMPARABLE,
    PEAK,
    PEAK_SITE,
    SAVED,
    SINGLE_MEASUREMENT_KINDS,
    Environment,
    Measured,
    Measurement,
    Metric,
    Verdict,
)
from pytest_distperf.verdict import explain
from pytest_distperf.verdict.hostside import host_side
from pytest_distperf.verdict.measurements import carries_control, measured_of, pooled
from pytest_distperf.verdict.noise import NoiseFigures
from pytest_distperf.verdict.readings import (
    Detectable,
    contradicted,
    control_level,
    without_outliers,
)
from pytest_distperf.verdict.rule import (
    MOST_MEASUREMENTS,
    PEAK_TOLERANCE,
    assess,
    decide,
    decide_exact,
    detectable,
    make_verdict,
    noise_reasons,
    representative,
    spread_limit,
    tells_the_line,
)
from pytest_distperf.verdict.stats import selection_figure, spread
from pytest_distperf.verdict.store import (
    BaselineFile,
    SaveEntry,
    StoredMetric,
    environment_id,
    same_environment,
)
from pytest_distperf.verdict.storefile import stored_samples

#: What a re-measurement gives back: fresh metrics and the noise probe's figures.
Remeasured = tuple[Sequence[Metric], NoiseFigures | None]

#: Seconds before each confirming re-measurement without the control: growing, so that the
#: four measurements of a regression span longer than the host's slow spells.
_CONFIRM_PAUSES_S = (1.0, 2.0, 4.0)
#: Seconds between measurements with the control: measurements spread over a few seconds
#: average over the host's speed, which changes from one second to the next.
_CONTROL_PAUSE_S = 1.0
#: A save with the control pools at least this many measurements (and takes more while they
#: cannot tell a change at the decision line): four such tell as much as twelve on every
#: recording in benchmarks/data (benchmarks/save_stop.md).
_SAVE_MIN_KEPT = 4
#: A saved baseline without the control is the best of this many measurements (a
#: fraction: the median one), ...
_SAVE_MEASUREMENTS = 4
#: ... and of up to this many while the one it keeps is too noisy, ...
_SAVE_MAX_MEASUREMENTS = 6
#: ... this many seconds apart, ...
_SAVE_PAUSE_S = 0.5
#: ... or longer after a measurement that was too noisy (by round): another job's burst of
#: work often ends within seconds.
_NOISY_BACKOFF_S = (0.5, 1.0, 2.0)
#: Re-measurement rounds of one test at most (confirmations, or a save's measurements).
MAX_ROUNDS = max(MOST_MEASUREMENTS, _SAVE_MAX_MEASUREMENTS) + 1


class Judgement:
    """What both paths share: the test's metrics, every measurement of each, and the loop's
    bookkeeping.  The caller loops: ``labels = j.wanted()``; re-measure each label;
    ``j.add_measurement(...)``; until ``wanted()`` is empty; then ``verdicts()``.

    A metric is re-measured through the measurement that recorded it, by its label: the
    plugin gives every measurement of a test its own label and metric names
    (:func:`~pytest_distperf.records.distinct`); were two to share one, the later counts.
    """

    def __init__(self, *, measurements: Sequence[Measurement], environment: Environment,
                 first_noise: NoiseFigures | None, tolerance: float,
                 baseline: BaselineFile | None, test: str,
                 exact_tolerance: float = 0.0,
                 save_measurements: int = DEFAULT_SAVE_MEASUREMENTS) -> None:
        metrics = [m for measurement in measurements for m in measurement.metrics]
        #: a metric whose value is not a finite number is neither compared nor saved
        self.unusable = {m.name: m for m in metrics if not math.isfinite(m.value)}
        self.metrics = {m.name: m for m in metrics if m.name not in self.unusable}
        self.labels = {m.name: measurement.label for measurement in measurements
                       for m in measurement.metrics if m.name in self.metrics}
        self.remeasurable = {m.label for m in measurements if m.remeasure is not None}
        #: labels whose every re-measurement ran on fresh ranks (the caller says so, after
        #: :func:`settle`): their verdicts say so
        self.fresh_labels: set[str] = set()
        self.env = environment
        self.env_id = environment_id(environment)
        self.tolerance = tolerance
        self.exact_tolerance = exact_tolerance
        #: measurements a save pools for a metric with the host-speed control
        self.save_measurements = save_measurements
        self.file = baseline
        self.test = test
        self.measured: dict[str, list[Measured]] = {
            m.name: [measured_of(m, first_noise)] for m in self.metrics.values()}
        #: the test's baselines in this environment; None where the file has no entry
        self.stored = (baseline.metrics(test, self.env_id) if baseline is not None else None)
        #: per metric: its baseline here, or None and (verdict, detail) saying why there is none
        self.base = {name: self._lookup(name) for name in self.metrics}

    # -- the loop --------------------------------------------------------------------------
    def wants_more(self, name: str) -> bool:
        """Whether metric ``name`` needs another measurement."""
        raise NotImplementedError

    def delay(self, name: str) -> float:
        """Seconds to wait before metric ``name``'s next measurement."""
        raise NotImplementedError

    def can_confirm(self, name: str) -> bool:
        """Whether ``name`` can be measured again: a measured metric (not an exact or an
        informational one) of a measurement that can be repeated."""
        return (self.metrics[name].kind == MEASURED
                and self.labels[name] in self.remeasurable)

    def wanted(self) -> list[str]:
        """Labels to re-measure now (empty: the verdicts are ready)."""
        return sorted({self.labels[n] for n in self.metrics if self.wants_more(n)})

    def backoff(self) -> float:
        """Seconds to wait before the next round of re-measurements (0: none is wanted)."""
        return max((self.delay(n) for n in self.metrics if self.wants_more(n)), default=0.0)

    def add_measurement(self, label: str, metrics: Sequence[Metric],
                        noise: NoiseFigures | None) -> None:
        for metric in metrics:
            if metric.name in self.measured and self.labels[metric.name] == label:
                self.measured[metric.name].append(measured_of(metric, noise))

    # -- shared by both paths --------------------------------------------------------------
    def has_control(self, name: str) -> bool:
        metric = self.metrics[name]
        return carries_control(metric.is_fraction, self.measured[name])

    def noise_of(self, name: str, m: Measured) -> list[str]:
        """Why a measurement is too noisy to keep (empty: it is quiet enough), its spread
        judged against the metric's other measurements in this run
        (:func:`~.rule.spread_limit`; with the control, against the bare 5% quantile)."""
        metric = self.metrics[name]
        floor = not self.has_control(name)
        limit = spread_limit([x.samples.values for x in self.measured[name]],
                             metric.higher_is_better, metric.is_fraction, floor=floor)
        return noise_reasons(m, metric.higher_is_better, metric.is_fraction, limit,
                             floor=floor)

    def trusted(self, name: str, m: Measured) -> bool:
        return not self.noise_of(name, m)

    def verdicts(self) -> list[Verdict]:
        """One verdict per metric (the unusable ones first), each explained by what else
        changed in its measurement (:func:`~pytest_distperf.verdict.explain.explain`)."""
        doing = "saved" if isinstance(self, Save) else "compared"
        out = [make_verdict(m, NOT_COMPARABLE, self.env_id, None, tolerance=self.tolerance,
                            measurement_count=1, detail=explain.not_a_number(m.value, doing))
               for m in self.unusable.values()]
        out += [self._with_measurements(self.verdict(name)) for name in self.metrics]
        gone = self.vanished()
        labels = {**self.labels, **{v.metric: label for v, label in gone}}
        out = [dataclasses.replace(v, detail=explain.fresh_ranks(v.detail,
                                                                 v.measurement_count - 1))
               if v.measurement_count > 1 and labels.get(v.metric) in self.fresh_labels
               else v for v in out + [v for v, _ in gone]]
        return explain.explain(host_side(out, labels), labels, self.tolerance)

    def verdict(self, name: str) -> Verdict:
        raise NotImplementedError

    def _with_measurements(self, v: Verdict) -> Verdict:
        """``v`` with the samples (and controls) of every measurement of its metric in this
        run, a measured metric's (an exact or informational one has nothing to re-judge)."""
        if self.metrics[v.metric].kind != MEASURED:
            return v
        return dataclasses.replace(v, measurements=tuple(self.measured[v.metric]))

    def vanished(self) -> list[tuple[Verdict, str]]:
        """(verdict, the label of its measurement) of the exact metrics the baseline has and
        this run did not record, where this run compared others of their family: a
        collective no longer issued."""
        return []

    def _family_present(self, name: str) -> str:
        """The label of a measurement of this run that recorded exact metrics of ``name``'s
        family (``comm.`` with the same prefix and ``#n``) and has a baseline for them here
        (so the environments match), or ""."""
        family = exact_family(name)
        return next((self.labels[n] for n, m in self.metrics.items()
                     if m.kind == EXACT and exact_family(n) == family
                     and self.base[n][0] is not None), "")

    def _closest_difference(self, env_ids: Sequence[str]) -> str:
        """What differs between this run's environment and the closest of ``env_ids``."""
        stored = self.file.environments() if self.file is not None else {}
        return min((same_environment(stored.get(e, {}), self.env) for e in env_ids),
                   key=lambda differs: differs.count(";"))

    def _lookup(self, name: str) -> tuple[StoredMetric | None, tuple[str, str]]:
        metric = self.metrics[name]
        if self.file is None:
            return None, (NO_BASELINE, explain.no_baseline_file())
        stored = self.stored
        if stored is None:
            others = self.file.test_environments(self.test)
            if others:
                return None, (NOT_COMPARABLE, explain.other_environments(
                    others, self._closest_difference(others)))
            return None, (NO_BASELINE, explain.no_baseline_here())
        differs = same_environment(self.file.environments().get(self.env_id, {}), self.env)
        if differs:
            return None, (NOT_COMPARABLE, explain.environment_differs(differs))
        base = stored.get(name)
        if base is None and metric.kind == EXACT and any(
                exact_family(n) == exact_family(name) and m.kind == EXACT
                for n, m in stored.items()):
            # a collective the baseline's step did not issue: it issued 0 of them
            return StoredMetric(metric.unit, metric.higher_is_better, Measured(0.0),
                                EXACT), ("", "")
        head, site, _ = name.partition(PEAK_SITE)
        if base is None and site and any(n.startswith(head + PEAK_SITE) for n in stored):
            # a site the save did not keep among the largest (or whose line moved): 0 then
            return StoredMetric(metric.unit, metric.higher_is_better, Measured(0.0),
                                INFORMATIONAL), ("", "")
        if base is None:
            return None, (NO_BASELINE, explain.new_metric())
        if base.unit != metric.unit or base.higher_is_better != metric.higher_is_better:
            return None, (NOT_COMPARABLE, explain.changed_meaning(base, metric.unit,
                                                                  metric.higher_is_better))
        return base, ("", "")


class Comparison(Judgement):
    """Compare every metric with its baseline; a suspected change is measured again."""

    def wants_more(self, name: str) -> bool:
        base = self.base[name][0]
        if not self.can_confirm(name) or base is None:
            return False
        return decide(base, self.measured[name], self.tolerance, can_confirm=True).more

    def vanished(self) -> list[tuple[Verdict, str]]:
        out = []
        for name, base in (self.stored or {}).items():
            if name in self.metrics or name in self.unusable or base.kind != EXACT:
                continue
            label = self._family_present(name)
            if not label:
                continue
            metric = Metric(name, 0.0, base.unit, base.higher_is_better, kind=EXACT)
            verdict, a, detail = decide_exact(base, Measured(0.0), self.exact_tolerance)
            out.append((make_verdict(metric, verdict, self.env_id, a,
                                     tolerance=self.tolerance, measurement_count=1,
                                     detail=detail), label))
        return out

    def delay(self, name: str) -> float:
        if self.has_control(name):
            return _CONTROL_PAUSE_S
        done = len(self.measured[name]) - 1  # re-measurements so far
        return _CONFIRM_PAUSES_S[min(done, len(_CONFIRM_PAUSES_S) - 1)]

    def verdict(self, name: str) -> Verdict:
        metric = self.metrics[name]
        count = len(self.measured[name])
        base, (verdict, detail) = self.base[name]
        if base is None:
            return make_verdict(metric, verdict, self.env_id, None, tolerance=self.tolerance,
                                measurement_count=count, detail=detail)
        if metric.kind in SINGLE_MEASUREMENT_KINDS:
            verdict, chosen, detail = decide_exact(base, self.measured[name][0],
                                                   self.exact_tolerance)
            return make_verdict(metric, verdict, self.env_id, chosen,
                                tolerance=self.tolerance, measurement_count=1, detail=detail)
        if metric.kind == INFORMATIONAL:
            best = min((assess(base, m, self.tolerance) for m in self.measured[name]),
                       key=lambda a: a.worse)
            return make_verdict(metric, INFO, self.env_id, best, tolerance=self.tolerance,
                                measurement_count=count, detail=explain.informational())
        decision = decide(base, self.measured[name], self.tolerance,
                          can_confirm=self.can_confirm(name))
        return make_verdict(metric, decision.verdict, self.env_id, decision.assessment,
                            tolerance=self.tolerance, measurement_count=count,
                            detail=decision.detail)


class Save(Judgement):
    """Measure every metric a few times and store the best (or, with a host-speed control,
    the quiet measurements pooled) as its new baseline."""

    def wants_more(self, name: str) -> bool:
        """Without the control: ``_SAVE_MEASUREMENTS``, more while the one kept is noisy.
        With it: until ``_SAVE_MIN_KEPT`` are kept and they tell a change at the decision
        line (:func:`~.rule.tells_the_line`), ``save_measurements`` at most."""
        if not self.can_confirm(name):
            return False
        count = len(self.measured[name])
        if not self.has_control(name):
            if count < _SAVE_MEASUREMENTS:
                return True
            return count < _SAVE_MAX_MEASUREMENTS and not self.trusted(name, self._kept(name))
        kept = self._pooled_ones(name)
        told = self._told(name, pooled(kept)) if kept else None
        return not save_done(count, len(kept), told, self.tolerance, self.save_measurements)

    def delay(self, name: str) -> float:
        delay = _CONTROL_PAUSE_S if self.has_control(name) else _SAVE_PAUSE_S
        if not self.trusted(name, self.measured[name][-1]):
            done = len(self.measured[name]) - 1
            delay = max(delay, _NOISY_BACKOFF_S[min(done, len(_NOISY_BACKOFF_S) - 1)])
        return delay

    def _kept(self, name: str) -> Measured:
        """The measurement to store: the one whose better half is best (its median), not the
        one with the best few samples, which may be a slow spell with a fast moment in it:
        its better half would be slower than most clean runs, and no test could tell.

        A fraction (``comm_overhead``, ``imbalance``: a ratio of two noisy times) has no
        good side, so it keeps its median measurement instead (the lower middle one of an
        even count, in the better direction): kept at its best, the baseline would sit at
        the low end of its own spread, below most clean runs."""
        metric = self.metrics[name]
        sign = -1.0 if metric.higher_is_better else 1.0
        return representative(self.measured[name], lambda m: sign * selection_figure(
            m.samples.values, m.value, metric.higher_is_better, metric.is_fraction),
            metric.is_fraction)

    def _stored(self, name: str) -> Measured:
        """What a save stores: an exact metric's first measurement; with a host-speed
        control, the quiet measurements pooled (all of them when none is quiet: the
        comparison pools too); otherwise the best one (a fraction: the median one)."""
        if self.metrics[name].kind in SINGLE_MEASUREMENT_KINDS:
            return self.measured[name][0]
        if not self.has_control(name):
            return self._kept(name)
        return pooled(self._pooled_ones(name) or self.measured[name])

    def _pooled_ones(self, name: str) -> list[Measured]:
        """:func:`save_pool` of ``name``'s measurements, the save's control level taken
        over every metric with the control: the same fixed work follows each."""
        metric, every = self.metrics[name], self.measured[name]
        limit = spread_limit([m.samples.values for m in every], metric.higher_is_better,
                             floor=False)
        level = median_or_nan([control_level(m) for n in self.metrics
                               if self.has_control(n) for m in self.measured[n]])
        return save_pool(every, save_level=level, tolerance=self.tolerance,
                         higher_is_better=metric.higher_is_better, spread_limit=limit)

    def _told(self, name: str, m: Measured) -> Detectable | None:
        """:func:`told` of ``m`` stored as ``name``'s baseline."""
        return told(self._to_store(name, m)) if self.metrics[name].kind == MEASURED else None

    def _to_store(self, name: str, m: Measured) -> StoredMetric:
        metric = self.metrics[name]
        return StoredMetric(metric.unit, metric.higher_is_better, m, metric.kind,
                            self._tolerance_of(metric.kind))

    def _tolerance_of(self, kind: str) -> float:
        """The tolerance in force for a metric of ``kind``: what a change must pass."""
        if kind == PEAK:
            return PEAK_TOLERANCE
        return self.exact_tolerance if kind == EXACT else self.tolerance

    def vanished(self) -> list[tuple[Verdict, str]]:
        """The metrics the baseline had here that this save did not record: dropped from
        it (``current`` None)."""
        return [(Verdict(metric=name, verdict=SAVED, environment=self.env_id, unit=base.unit,
                         higher_is_better=base.higher_is_better, baseline=base.figure,
                         tolerance=self._tolerance_of(base.kind), measurement_count=0,
                         detail=explain.dropped(), kind=base.kind), "")
                for name, base in sorted((self.stored or {}).items())
                if name not in self.metrics and name not in self.unusable]

    def verdict(self, name: str) -> Verdict:
        metric = self.metrics[name]
        m = self._stored(name)
        new = self._to_store(name, m)
        count = len(self.measured[name])
        if metric.kind in SINGLE_MEASUREMENT_KINDS:
            detail = explain.saved_exact(sorted({x.value for x in self.measured[name]}), count)
        elif self.has_control(name):
            detail = explain.saved_pooled(len(m.samples.sizes or (0,)), count)
        else:
            detail = explain.saved(count, fraction=metric.is_fraction)
        told = self._told(name, m)  # None without the control or 3 measurements
        # a count does not depend on the host: no advice to re-save it on a quieter one
        noisy = self.noise_of(name, m) if metric.kind not in SINGLE_MEASUREMENT_KINDS else []
        detail = "; ".join(filter(None, (
            detail, explain.detectable(told, self.tolerance),
            explain.saved_noisy(noisy) if noisy else "")))
        values = new.samples.values
        current = new.figure
        previous = change = None
        base = self.base[name][0]
        if base is not None:
            previous = base.figure
            change = (current - previous) / abs(previous) if previous else None
        return Verdict(metric=name, verdict=SAVED, environment=self.env_id, unit=metric.unit,
                       higher_is_better=metric.higher_is_better, baseline=previous,
                       current=current, change=change,
                       tolerance=self._tolerance_of(metric.kind),
                       measurement_count=count, steal=m.steal, wait=m.wait,
                       other_load=m.other_load,
                       spread=spread(values, new.higher_is_better, new.is_fraction,
                                     floor=not self.has_control(name)),
                       detail=detail, kind=metric.kind)

    def save_entries(self) -> list[SaveEntry]:
        """What every metric stores (:meth:`_stored`), for this environment."""
        return [SaveEntry(self.env, {name: self._to_store(name, self._stored(name))
                                     for name in self.metrics})]


def save_pool(every: Sequence[Measured], *, save_level: float, tolerance: float,
              higher_is_better: bool, spread_limit: float) -> list[Measured]:
    """The measurements a save pools with the control: the quiet ones (``spread_limit``:
    :func:`~.rule.noise_reasons`), less those whose control the metric contradicts
    (:func:`~.readings.contradicted`; first, as the next step reads each time against its
    control) and those slowed alone against the save's usual (a baseline half in a slow
    spell reads every later run as an improvement)."""
    quiet = [m for m in every
             if not noise_reasons(m, higher_is_better, limit=spread_limit, floor=False)]
    if not quiet:
        return []
    aside = contradicted(quiet, save_level, tolerance)
    agreed = [m for m, out in zip(quiet, aside, strict=True) if not out]
    return without_outliers(agreed, higher_is_better=higher_is_better, typical=True)


def save_done(taken: int, kept: int, told_now: Detectable | None, tolerance: float,
              most: int) -> bool:
    """Whether a save with the control has measured enough: ``most`` taken, or
    ``_SAVE_MIN_KEPT`` kept that tell a change at the decision line."""
    if taken >= most:
        return True
    return kept >= min(_SAVE_MIN_KEPT, most) and tells_the_line(told_now, tolerance)


def told(stored: StoredMetric) -> Detectable | None:
    """What comparisons against ``stored`` can tell (:func:`~.rule.detectable`), from the
    samples as the file keeps them: what every later comparison meets."""
    m = stored.measured
    return detectable(dataclasses.replace(stored, measured=dataclasses.replace(
        m, samples=stored_samples(m.samples))))


def make_judgement(*, save: bool, measurements: Sequence[Measurement],
                   environment: Environment, first_noise: NoiseFigures | None,
                   tolerance: float, baseline: BaselineFile | None, test: str,
                   exact_tolerance: float = 0.0,
                   save_measurements: int = DEFAULT_SAVE_MEASUREMENTS) -> Judgement:
    """A :class:`Save` with ``--distperf-save``, else a :class:`Comparison`."""
    cls = Save if save else Comparison
    return cls(measurements=measurements, environment=environment, first_noise=first_noise,
               tolerance=tolerance, baseline=baseline, test=test,
               exact_tolerance=exact_tolerance, save_measurements=save_measurements)


def exact_family(name: str) -> str:
    """The family of an exact metric: its name up to ``comm.`` and its ``#n``, if any
    (``gpt.comm.all_reduce.calls#2`` -> ``gpt.comm.#2``), or up to ``device.syncs``, the
    total and the ops behind it (``device.syncs.aten::item`` -> ``device.syncs.``); "" for
    any other name.  A collective, or an op that made the host wait, missing from one side
    of a family was issued 0 times."""
    stem, _, number = name.partition("#")
    suffix = f"#{number}" if number else ""
    head, sep, tail = stem.rpartition("device.syncs")
    if sep and (not tail or tail.startswith(".")):
        return f"{head}device.syncs.{suffix}"
    head, sep, _ = stem.rpartition("comm.")
    return f"{head}comm.{suffix}" if sep else ""


def _ready(labels: list[str]) -> contextlib.AbstractContextManager[float]:
    return contextlib.nullcontext(0.0)


def settle(judgement: Judgement | None, remeasure: Callable[[str], Remeasured], *,
           agree: Callable[[list[str]], list[str]] = list,
           sleep: Callable[[float], None] = time.sleep,
           each_round: Callable[[list[str]], contextlib.AbstractContextManager[float]]
           = _ready, rounds: int = MAX_ROUNDS) -> None:
    """Re-measure what ``judgement`` wants until it wants nothing (``rounds`` at most: a
    save of more measurements than a comparison takes needs one per measurement; every
    process of a job must pass the same).

    ``remeasure(label)`` repeats the measurement ``label`` and returns its fresh metrics with
    the noise probe's figures; ``agree(labels)`` makes every process of a job agree on what to
    re-measure (under torchrun every rank must take part, and only rank 0 has a judgement:
    ``judgement`` is None on the others).  ``each_round(labels)`` is entered around each
    round of re-measurements (the plugin starts fresh ranks in it) and gives the seconds it
    took to get ready, which count towards the pause before the round.
    """
    for _ in range(rounds):
        labels = agree(judgement.wanted() if judgement is not None else [])
        if not labels:
            return
        with each_round(labels) as spent:
            if judgement is not None:
                sleep(max(0.0, judgement.backoff() - spent))
            for label in labels:
                fresh, figures = remeasure(label)
                if judgement is not None:
                    judgement.add_measurement(label, fresh, figures)
