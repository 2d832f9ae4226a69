"""The sentences a user reads: every verdict's detail, and what else changed in the same
measurement.  Pure.

A verdict's detail is one plain sentence (what changed, how sure, what to do), then, after
``". "``, the figures behind it::

    inconclusive: the host ran 26% slower than at the save, enough to hide a change this
    size (+8.0%); rerun on a quieter runner or re-save. Readings: +8.0% at the fitted slope
    (0.41), +1.2% in proportion (since the save: the host-speed control 26% slower); +8.0%
    is within 0.5 x the host's change, what an error in the fitted slope could leave

A measurement of ``ddp_step_timer`` stores, beside the metrics it is judged by, the exact
collective counts of a step (``comm.<op>.calls``, ``comm.<op>.bytes``, ``comm.buckets``)
and the step's compute (measured) and exposed communication time (informational).  When one
of its metrics regresses (or improves, or cannot be told), the verdict's ``explanation``
carries the changes of the others, in words a person can act on::

    all_reduce calls/step 2 -> 18, bytes unchanged: smaller gradient buckets (bucket_cap_mb)?
    compute +14%, exposed communication unchanged
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pytest_distperf.common.peaksites import grew
from pytest_distperf.config import format_bytes
from pytest_distperf.records import (
    EXACT,
    IMPROVED,
    INCONCLUSIVE,
    PEAK_SITE,
    REGRESSED,
    Verdict,
)
from pytest_distperf.verdict.readings import (
    AS_MEASURED,
    FITTED,
    MEMORY,
    MEMORY_IN_PROPORTION,
    Reading,
    memory_alone,
    outlier_limit,
)
from pytest_distperf.verdict.store import TIME_UNITS, StoredMetric

if TYPE_CHECKING:
    from pytest_distperf.verdict.assessment import Assessment
    from pytest_distperf.verdict.readings import Detectable

#: The detail of a verdict that waits for another measurement (never a final one).
AWAITING = "awaiting confirmation"
_RESAVE = "re-save with --distperf-save"


def pct(change: float | None) -> str:
    """A relative change for a figure, to 0.1% ("?" for none; no "-0.0%")."""
    return "?" if change is None else f"{round(change, 3) + 0.0:+.1%}"


def _detail(sentence: str, *figures: str) -> str:
    """The sentence, then the figures that are not empty."""
    shown = [f for f in figures if f]
    return sentence + (". " + "; ".join(shown) if shown else "")


def _change_words(a: Assessment, unit: str) -> str:
    """``20.0% slower`` (a time), ``16.7% lower`` (anything else), or the two figures where
    there is no relative change."""
    if a.change is None:
        return f"{a.baseline:g} -> {a.current:g}"
    more, less = ("slower", "faster") if unit in TIME_UNITS else ("higher", "lower")
    return f"{abs(a.change):.1%} {more if a.change > 0 else less}"


def _host_words(change: float) -> str:
    return f"{abs(change):.0%} {'slower' if change > 0 else 'faster'}"


def _host(a: Assessment) -> str:
    """How the host moved since the save: by the compute control, or by the memory control
    where that moved further."""
    host = a.host_change or 0.0
    memory = next((r.host_change for r in a.readings if r.name in (MEMORY,
                                                                    MEMORY_IN_PROPORTION)), None)
    if memory is not None and abs(memory) > abs(host):
        return f"the host's memory ran {_host_words(memory)} than at the save"
    return f"the host ran {_host_words(host)} than at the save"


def _reading(r: Reading) -> str:
    slope = f" ({r.slope:.2f})" if r.name in (FITTED, MEMORY) else ""
    return f"{pct(r.change)} {r.name}{slope}"


def _readings(a: Assessment) -> str:
    """Every reading of a change with the control, and how the controls moved."""
    if not a.readings:
        return ""
    controls = [f"the host-speed control {_host_words(a.host_change or 0.0)}"]
    controls += [f"the memory control {_host_words(r.host_change)}" for r in a.readings
                 if r.name in (MEMORY, MEMORY_IN_PROPORTION)]
    return (f"Readings: {', '.join(_reading(r) for r in a.readings)} (since the save: "
            f"{', '.join(controls)})")


def _aside(a: Assessment) -> str:
    if not a.set_aside:
        return ""
    return (f"{a.set_aside} measurement(s) set aside: {outlier_limit():.0%} or "
            "more slower than another of this run relative to the host-speed control "
            "(something the noise probe does not see)")


def _noisy(a: Assessment) -> str:
    if not a.noisy or not a.readings:
        return ""
    return f"no measurement was quiet ({'; '.join(dict.fromkeys(a.noisy))})"


def improved(a: Assessment, base: StoredMetric, measurements: int) -> str:
    host = " with the host's speed taken out" if a.readings else ""
    return _detail(f"improved: {_change_words(a, base.unit)} than the baseline{host}, in "
                   f"{_count_of(measurements)}; {_RESAVE} to keep it", _readings(a))


def _count_of(measurements: int) -> str:
    return "its one measurement" if measurements == 1 else f"{measurements} measurements"


def regressed(a: Assessment, base: StoredMetric, measurements: int) -> str:
    host = " with the host's speed taken out" if a.readings else ""
    how = (f", confirmed by {measurements} measurements" if measurements > 1
           else " in its one measurement (this metric cannot be measured again)")
    return _detail(f"regressed: {_change_words(a, base.unit)} than the baseline{host}{how}; "
                   f"find the change that caused it, or {_RESAVE} if it is intended",
                   _readings(a), _aside(a))


def too_noisy(reasons: Sequence[str]) -> str:
    """Every measurement too noisy to judge (``reasons``: one per measurement)."""
    tell = (f"too noisy to tell in all {len(reasons)} measurements" if len(reasons) > 1
            else "too noisy to tell")
    return _detail(f"inconclusive: {tell}; rerun on a quieter runner",
                   f"Noise: {'; '.join(dict.fromkeys(reasons))}")


def not_clear(a: Assessment, base: StoredMetric, p: float | None, alpha: float) -> str:
    figure = f"Mann-Whitney p = {p:.3g} >= {alpha}" if p is not None else ""
    return _detail(f"inconclusive: {_change_words(a, base.unit)} than the baseline, but not "
                   "statistically clear; rerun to tell", figure, _readings(a), _noisy(a))


def host_hides(a: Assessment, base: StoredMetric, slope_error: float) -> str:
    """A change within what an error in the fitted slope could leave of the host's change."""
    return _detail(f"inconclusive: {_host(a)}, enough to hide a change this size "
                   f"({pct(a.change)}); rerun on a quieter runner or re-save",
                   _readings(a), f"{pct(a.change)} is within {slope_error:g} x the host's "
                   "change, what an error in the fitted slope could leave", _noisy(a))


def memory_hides(a: Assessment, base: StoredMetric) -> str:
    """A regression within the memory control's own move since the save."""
    own = memory_alone(a.readings)
    return _detail(f"inconclusive: the host's memory slowed {own:.0%} more than its compute "
                   f"since the save, enough to hide a change this size ({pct(a.change)}); "
                   "rerun on a quieter runner or re-save", _readings(a),
                   f"{pct(a.change)} is within the memory control's own move, of which this "
                   "metric may follow any part", _noisy(a))


def readings_disagree(a: Assessment, base: StoredMetric) -> str:
    """Past the line by some readings of the change, not by all."""
    worst = max(a.readings, key=lambda r: r.worse)
    moved = _change_words(dataclasses.replace(a, change=worst.change), base.unit)
    return _detail(f"inconclusive: up to {moved} than the baseline, but {_host(a)} and part "
                   "of the change may be the host's; rerun on a steadier runner or re-save",
                   _readings(a), _noisy(a))


def noisy_only(a: Assessment, base: StoredMetric) -> str:
    """Past the line, but in measurements none of which was quiet."""
    return _detail(f"inconclusive: {_change_words(a, base.unit)} than the baseline, but no "
                   "measurement was quiet enough to call it a regression; rerun on a quieter "
                   "runner", f"Noise: {'; '.join(dict.fromkeys(a.noisy))}", _readings(a))


def only_adjusted(a: Assessment, base: StoredMetric, raw: Reading) -> str:
    """Past the line with the host's change taken out, not as measured."""
    return _detail(f"inconclusive: {_change_words(a, base.unit)} than the baseline with the "
                   f"host's speed taken out, but {pct(raw.change)} {AS_MEASURED}: "
                   f"{_host(a)}, and this metric may not follow the host-speed control; "
                   "rerun, or re-save if the runner changed", _readings(a), _noisy(a))


def exact(verdict: str, baseline: float, current: float, exact_tolerance: float,
          unit: str) -> str:
    """An exact metric past its exact tolerance."""
    moved = (f"{_count(baseline)} -> {_count(current)} {unit}".rstrip()
             + f" ({current - baseline:+,.0f})")
    do = ("find the change that caused it, or " + _RESAVE + " if it is intended"
          if verdict == REGRESSED else _RESAVE + " if this is intended")
    return (f"{verdict}: {moved}, past the exact tolerance of {exact_tolerance:,.0f}; {do}")


def peak(verdict: str, baseline: float, current: float, bound: float) -> str:
    """A peak of device memory past its bound."""
    moved = (f"{format_bytes(baseline)} -> {format_bytes(current)} "
             f"({(current - baseline) / baseline:+.1%})" if baseline else
             f"{format_bytes(baseline)} -> {format_bytes(current)}")
    do = ("find what holds more memory (an activation checkpoint dropped, a reference kept "
          "past the step, a larger batch?), or " + _RESAVE + " if it is intended"
          if verdict == REGRESSED else _RESAVE + " if this is intended")
    return f"{verdict}: peak device memory {moved}, past its {bound:.0%} bound; {do}"


def _count(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.6g}"


def spread_reason(spread: float, limit: float) -> str:
    """Why a measurement's samples are too noisy."""
    return f"sample spread {spread:.0%} > {limit:.0%}"


def saved(count: int, *, fraction: bool) -> str:
    """How a save without the control chose what it stores."""
    return f"median of {count} measurement(s)" if fraction else f"best of {count} measurement(s)"


def saved_pooled(kept: int, count: int) -> str:
    """How many measurements a save with the control pooled of those it took."""
    aside = (f" ({count - kept} set aside: too noisy, slowed alone, or with a control "
             "reading its samples contradict)" if kept < count else "")
    return f"{kept} of {count} measurement(s) pooled, with the host-speed control{aside}"


def saved_exact(seen: Sequence[float], count: int) -> str:
    """An exact metric's save: deterministic, or not."""
    if len(seen) == 1:
        return "exact"
    return (f"exact; NOT deterministic: {len(seen)} values in {count} measurements "
            f"({', '.join(f'{v:g}' for v in seen)}); saved the first: raise exact_tolerance "
            "or make the step deterministic")


def saved_noisy(reasons: Sequence[str]) -> str:
    return f"saved from a noisy measurement ({', '.join(reasons)}): re-save on a quieter machine"


def detectable(d: Detectable | None, tolerance: float) -> str:
    """What a save says of the changes its comparisons can tell ("" without a figure)."""
    if d is None:
        return ""
    text = (f"its {d.measurements} measurements spread {d.spread:.1%}: a comparison tells "
            f"a change of {d.change:.1%} or more {d.power:.0%} of the time (from the save "
            "alone: what moves between runs adds to it)")
    if d.change > tolerance:
        text += (f"; more than the tolerance ({tolerance:.0%}): smaller changes will often "
                 "go unseen here; widen the test's tolerance "
                 "(`@pytest.mark.distperf(tolerance=...)`), or save on a quieter runner")
    return text


def not_a_number(value: float, doing: str) -> str:
    return f"its value is not a finite number ({value}): not {doing}"


def no_baseline_file() -> str:
    return "no baseline file for this test module yet: run with --distperf-save to create it"


def no_baseline_here() -> str:
    return "no baseline for this test in this environment: run with --distperf-save"


def other_environments(envs: Sequence[str], differs: str = "") -> str:
    closest = f"; the closest differs in {differs}" if differs else ""
    return (f"baselines exist only for other environments ({', '.join(envs)}){closest}; a "
            "baseline from another environment is never compared")


def environment_differs(differs: str) -> str:
    return f"the stored environment differs: {differs}"


def dropped() -> str:
    return "gone: this run did not record it, and the save dropped it from the baseline"


def new_metric() -> str:
    return "a new metric: no baseline for it yet"


def changed_meaning(base: StoredMetric, unit: str, higher_is_better: bool) -> str:
    return (f"the metric changed meaning (unit {base.unit!r} -> {unit!r}, higher_is_better "
            f"{base.higher_is_better} -> {higher_is_better}): re-save")


def informational() -> str:
    return "informational: shown to explain the other verdicts, never a failure"


def fresh_ranks(detail: str, remeasurements: int) -> str:
    """``detail`` saying that its re-measurements ran on fresh ranks."""
    return "; ".join(filter(None, (detail, f"{remeasurements} re-measurement(s) on fresh "
                                           "ranks")))


#: The verdicts that get an explanation.
EXPLAINED = (REGRESSED, IMPROVED, INCONCLUSIVE)
#: Bytes that move by less than this fraction (with more calls) are a small extra message.
_SMALL_EXTRA = 0.01
_COMM = re.compile(r"comm\.(?P<op>.+)\.(?P<what>calls|bytes)(?:#\d+)?$")
_BUCKETS = re.compile(r"comm\.buckets(?:#\d+)?$")
_SUFFIX = re.compile(r"#\d+$")
_MESH = re.compile(r"(?:^|\.)mesh\.(?P<dim>\w+)$")
_THEORY = "pipeline.bubble_theory"
_DEVICE = re.compile(r"(?:^|\.)(?:device\.(?P<what>launches|graph_launches|syncs|h2d_bytes|"
                     r"d2h_bytes)(?:\.(?P<op>.+))?|(?P<peak>peak_memory_bytes))$")
#: What one site held at the peak of device memory (``peak_memory_bytes.at.<site>``).
_PEAK_SITE = re.compile(r"(?:^|\.)" + re.escape(PEAK_SITE) + r"(?P<site>.+)$")
#: The device figures' words in an explanation, and whether they are bytes.
_DEVICE_WORDS = {"launches": ("kernel launches/step", False),
                 "graph_launches": ("CUDA graph launches/step", False),
                 "h2d_bytes": ("host-to-device bytes/step", True),
                 "d2h_bytes": ("device-to-host bytes/step", True),
                 None: ("peak device memory", True)}
#: The metrics that say where a step's time went, and their words.
PHASES = (("compute_time_s", "compute"), ("exposed_comm_s", "exposed communication"))


def explain(verdicts: Sequence[Verdict], labels: Mapping[str, str],
            tolerance: float) -> list[Verdict]:
    """``verdicts`` with ``explanation`` filled in where the verdict is one of
    ``EXPLAINED``: the changes of the other metrics of the same measurement (``labels``:
    metric -> the label of the measurement that recorded it).  ``tolerance``: a phase that
    moved by no more than it is "unchanged"."""
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault(labels.get(v.metric, ""), []).append(v)
    out = []
    for v in verdicts:
        if v.verdict in EXPLAINED and labels.get(v.metric):
            others = [w for w in groups[labels[v.metric]] if w.metric != v.metric]
            text = "; ".join(_describe(v, others, tolerance))
            out.append(dataclasses.replace(v, explanation=text))
        else:
            out.append(v)
    return out


def _describe(v: Verdict, others: Sequence[Verdict], tolerance: float) -> list[str]:
    layout = setup_changes(others)  # then the counts moved with it: no guess at a cause
    if match := _DEVICE.search(v.metric):
        return layout + (peak_growth(v, others) if match["peak"] else []) + device_changes(others)
    if v.kind == EXACT:
        return layout + comm_changes([v, *others], only=_op_of(v.metric), guess=not layout)
    parts = layout + comm_changes(others, guess=not layout) + device_changes(others)
    if not parts and any(w.kind == EXACT for w in others):
        parts = ["collective calls and bytes unchanged"]
    phases = phase_changes(others, tolerance)
    return parts + ([phases] if phases else [])


def device_changes(verdicts: Sequence[Verdict]) -> list[str]:
    """What moved of what the host asked of the GPU per step: the ops that made it wait,
    the kernels it launched, the bytes it copied, the peak of device memory."""
    parts, waits = [], []
    for w in verdicts:
        if not _moved(w) or not (match := _DEVICE.search(_SUFFIX.sub("", w.metric))):
            continue
        what, op = match["what"], match["op"]
        was, now = _values(w)
        if what == "syncs" and op:
            waits.append(f"host syncs/step in {op} {_n(was)} -> {_n(now)}")
        elif what in _DEVICE_WORDS:
            word, bytes_ = _DEVICE_WORDS[what]
            shown = (f"{format_bytes(was)} -> {format_bytes(now)}" if bytes_
                     else f"{_n(was)} -> {_n(now)}")
            parts.append(f"{word} {shown}")
    if waits:
        grew = any(_values(w)[1] > _values(w)[0] for w in verdicts
                   if _moved(w) and (m := _DEVICE.search(w.metric)) and m["op"])
        parts.insert(0, ", ".join(waits) + (
            ": a .item(), .cpu(), print(tensor) or nonzero() in the step?" if grew else ""))
    return parts


def peak_growth(peak: Verdict, verdicts: Sequence[Verdict]) -> list[str]:
    """For a peak of device memory that grew, the sites that held more of it than at the
    save (``peak_memory_bytes.at.<site>``), where the save recorded them."""
    if peak.baseline is None or peak.current is None or peak.current <= peak.baseline:
        return []
    before, after = [], []
    compared = False  # a baseline saved without the sites: nothing to tell growth from
    for w in verdicts:
        match = _PEAK_SITE.search(_SUFFIX.sub("", w.metric))
        if match is None or w.current is None:
            continue
        after.append((match["site"], int(w.current)))
        compared = compared or w.baseline is not None
        if w.baseline:  # 0: a site the save did not keep
            before.append((match["site"], int(w.baseline)))
    if not compared:
        return []
    sites = [f"{_site(site)} " + (
        f"+{format_bytes(now - was)} ({format_bytes(was)} -> {format_bytes(now)})"
        if was is not None else f"{format_bytes(now)} (not among the largest at the save)")
        for site, was, now in grew(before, after)]
    return ["grew at the peak: " + ", ".join(sites)] if sites else []


def _site(site: str) -> str:
    """``model.py:88:forward`` as ``model.py:88 in forward``."""
    where, _, function = site.rpartition(":")
    return f"{where} in {function}" if where and function else site


def setup_changes(verdicts: Sequence[Verdict]) -> list[str]:
    """The mesh's sizes and the pipeline schedule's theoretical bubble, where they changed
    since the save: what the test itself asked for differently."""
    mesh, parts = [], []
    for v in verdicts:
        name = _SUFFIX.sub("", v.metric)
        match = _MESH.search(name) if v.unit == "ranks" else None
        if ((match is None and not name.endswith(_THEORY)) or v.baseline is None
                or v.current is None or v.baseline == v.current):
            continue  # a baseline saved before these metrics were recorded says nothing
        shown = "{:g}" if match is not None else "{:.3f}"
        was, now = shown.format(v.baseline), shown.format(v.current)
        if match is not None:
            mesh.append(f"{match['dim']} {was} -> {now}")
        else:
            parts.append(f"the schedule's bubble in theory {was} -> {now} (microbatches "
                         f"or stages changed)")
    return ([f"mesh {', '.join(mesh)}"] if mesh else []) + parts


def _op_of(name: str) -> str | None:
    match = _COMM.search(name)
    if match:
        return match["op"]
    return "buckets" if _BUCKETS.search(name) else None


def comm_changes(verdicts: Sequence[Verdict], only: str | None = None,
                 guess: bool = True) -> list[str]:
    """One phrase per collective whose calls or bytes per step changed (``only``: that one
    collective, or ``"buckets"``), with a guess at the cause unless ``guess`` is false."""
    ops: dict[str, dict[str, Verdict]] = {}
    buckets = None
    for v in verdicts:
        if v.kind != EXACT:
            continue
        match = _COMM.search(v.metric)
        if match:
            ops.setdefault(match["op"], {})[match["what"]] = v
        elif _BUCKETS.search(v.metric):
            buckets = v
    parts = [text + (hint if guess else "") for op, pair in ops.items() if only in (None, op)
             for text, hint in [_op_change(op, pair.get("calls"), pair.get("bytes"))] if text]
    if buckets is not None and only in (None, "buckets") and _moved(buckets):
        parts.append(f"gradient buckets/step {_n(buckets.baseline)} -> {_n(buckets.current)}"
                     + (": smaller buckets (bucket_cap_mb)?"
                        if (buckets.current or 0) > (buckets.baseline or 0) else ""))
    return parts


def _moved(v: Verdict | None) -> bool:
    return v is not None and v.verdict in (REGRESSED, IMPROVED)


def _op_change(op: str, calls: Verdict | None, nbytes: Verdict | None) -> tuple[str, str]:
    """What changed of one collective, and a guess at why (``": a larger model?"``)."""
    if not _moved(calls) and not _moved(nbytes):
        return "", ""
    c0, c1 = _values(calls)
    b0, b1 = _values(nbytes)
    # ddp_step_timer counts per step (unit "calls/step"); dist_profiler per profiled call
    unit = next((v.unit for v in (calls, nbytes) if v is not None), "")
    per, where = ((" per profiled call", "call") if unit in ("calls", "B")
                  else ("/step", "step"))
    if calls is not None and c0 == 0:
        return f"{op}: new, {_n(c1)} call(s){per}", (
            f": an extra barrier in the {where}?" if op == "barrier" else
            f": a new collective in the {where}?")
    if calls is not None and c1 == 0:
        return f"{op}: no longer issued (was {_n(c0)} call(s){per})", ""
    if _moved(calls) and not _moved(nbytes):
        text = f"{op} calls{per} {_n(c0)} -> {_n(c1)}"
        if nbytes is None:
            return text, ""
        return text + ", bytes unchanged", (
            "" if c1 <= c0 else ": smaller gradient buckets (bucket_cap_mb)?"
            if op == "all_reduce" else ": the same data in more, smaller messages?")
    size = f"bytes{per} {format_bytes(b0)} -> {format_bytes(b1)}"
    if b0:
        size += f" ({(b1 - b0) / b0:+.1%})"
    if not _moved(calls):
        return f"{op} {size}, calls unchanged", (
            ": more data per call (a larger model?)" if b1 > b0 else
            ": less data per call (a smaller model, or compression?)")
    text = f"{op} calls{per} {_n(c0)} -> {_n(c1)}, {size}"
    if c1 > c0 and b0 and 0 < (b1 - b0) / b0 < _SMALL_EXTRA:
        return text, (f": a small extra message per {where} (find_unused_parameters' "
                      "used-parameter map? a new all_reduce of a scalar?)"
                      if op == "all_reduce" else f": a small extra message per {where}")
    if c1 > c0 and b1 > b0:
        return text, (f": more data in more calls (a larger model, or a new collective in "
                      f"the {where}?)")
    return text, ""


def _values(v: Verdict | None) -> tuple[float, float]:
    if v is None:
        return 0.0, 0.0
    return float(v.baseline or 0.0), float(v.current or 0.0)


def _n(value: float | None) -> str:
    return f"{value or 0:,.0f}"


def phase_changes(verdicts: Sequence[Verdict], tolerance: float) -> str:
    """``compute +14%, exposed communication unchanged`` from the phase metrics among
    ``verdicts`` (``compute_time_s``, measured, and ``exposed_comm_s``, informational; ""
    when there are none with a baseline)."""
    words = []
    for suffix, word in PHASES:
        v = next((w for w in verdicts if w.kind != EXACT
                  and _SUFFIX.sub("", w.metric).endswith(suffix)
                  and w.baseline is not None and w.current is not None), None)
        if v is None:
            continue
        change, b, c = v.change, float(v.baseline or 0.0), float(v.current or 0.0)
        if change is None and c != b:
            words.append(f"{word} {b * 1e3:.3g} -> {c * 1e3:.3g} ms")
        elif change is None or abs(change) <= tolerance:
            words.append(f"{word} unchanged")
        else:
            words.append(f"{word} {change:+.0%}")
    return ", ".join(words)
