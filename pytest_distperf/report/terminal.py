"""The session's report in the terminal: the summary grouped by test, nccl-tests-style tables,
verdict tables, and the figures as JUnit properties.  No torch, no pytest."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from pytest_distperf.analysis.topology import DIFFER, SLOW_PAIR_RATIO, slow_pairs, suspect_ranks
from pytest_distperf.config import GLOO_ON_GPU, format_bytes
from pytest_distperf.fixtures.results.group import CollectiveResult, PairMatrix
from pytest_distperf.records import (
    EXACT,
    IMPROVED,
    INCONCLUSIVE,
    INFO,
    MEASURED,
    REGRESSED,
    UNCHANGED,
    VERDICT_ORDER,
    Metric,
    TestRecord,
    Verdict,
)


class Line(NamedTuple):
    """One line of the terminal summary and how to colour it where the terminal can (pytest's
    markup names: ``red``, ``yellow``, ``green``; "" for none)."""

    text: str
    colour: str = ""
    bold: bool = False

    @property
    def markup(self) -> dict[str, bool]:
        """Keywords for pytest's ``write_line``: nothing for a plain line."""
        out = {self.colour: True} if self.colour else {}
        if self.bold:
            out["bold"] = True
        return out


#: The colour of a verdict (and of a test whose worst verdict it is) in the terminal.
VERDICT_COLOURS = {"regressed": "red", "inconclusive": "yellow", "improved": "green"}


def _verdict_rank(verdict: str) -> int:
    return VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER)


def _test_status(record: TestRecord) -> tuple[int, str, str]:
    """(sort rank, status word, colour) of a test: regressions first, then breaches, then
    inconclusive verdicts, then the rest."""
    regressed = any(v.verdict == "regressed" for v in record.verdicts)
    if record.breaches:
        return (0 if regressed else 1, "BREACH, REGRESSED" if regressed else "BREACH", "red")
    if regressed:
        return 0, "REGRESSED", "red"
    if any(v.verdict == "inconclusive" for v in record.verdicts):
        return 2, "INCONCLUSIVE", "yellow"
    return 3, "ok", ""


def summary(records: Sequence[TestRecord], *, quiet: bool = False,
            strict: bool = False) -> list[Line]:
    """The session's summary: one block per test that recorded metrics (tests with
    regressions first, then breaches), then the verdict counts and the verdicts worth a look.
    ``quiet`` (pytest's ``-q``) keeps the counts, the regressions and the breaches; the
    rest ends with the :func:`legend` of the verdicts it shows."""
    banner = nothing_compared_line(records)
    lines = [Line(banner, "yellow", bold=True)] if banner else []
    if quiet:
        return lines + verdict_summary(records, quiet=True, strict=strict)
    shown = [r for r in records if r.metrics or r.breaches or r.verdicts]
    for record in sorted(shown, key=lambda r: _test_status(r)[0]):
        lines.extend(test_block(record))
    lines += verdict_summary(records, strict=strict)
    entries = legend([v for r in records for v in r.verdicts])
    return lines + ([Line("legend:")] + [Line(f"  {e}") for e in entries] if entries else [])


#: The verdicts of a metric compared with its baseline: the ones the legend explains.
COMPARED = (REGRESSED, INCONCLUSIVE, IMPROVED, UNCHANGED, INFO)


def legend(verdicts: Sequence[Verdict]) -> list[str]:
    """What the summary's verdicts and columns mean, one entry each, for ``verdicts``
    compared with a baseline (none: no legend): at what change a test fails and which
    statistic is compared, exact counts, confidence, pt, inconclusive and informational,
    each only where a verdict it explains is among them.  The figures are the verdict
    rule's (docs/verdict-rule.md, sentences 1, 2, 4, 7 and 11)."""
    shown = [v for v in verdicts if v.verdict in COMPARED and v.baseline is not None]
    judged = [v for v in shown if v.kind == MEASURED]
    out = []
    if judged:
        tolerances = ", ".join(f"{t * 100:g}%" for t in sorted({v.tolerance for v in judged}))
        out.append(f"fails (regressed): a confirmed change for the worse larger than its "
                   f"tolerance ({tolerances})")
        ways = []
        if any(v.host_change is None and v.unit != "fraction" for v in judged):
            ways.append("a time by the 5% quantile of its samples (a rate: the 95%)")
        if any(v.host_change is not None for v in judged):
            ways.append("a time with the host-speed control (CPU ranks) by its samples' 25% "
                        "quantile, the host's speed taken out")
        if any(v.unit == "fraction" for v in judged):
            ways.append("a fraction by its value, and by 0.05 pt at least")
        out.append("compared: " + "; ".join(ways))
    if any(v.kind == EXACT for v in shown):
        out.append("exact: a count fails on any change past its exact tolerance (0 unless set)")
    if any(v.confidence is not None for v in shown):
        out.append("confidence: 1 - p of the one-sided Mann-Whitney test the verdict used")
    if any(v.unit == "fraction" for v in shown):
        out.append("pt: percentage points, the change of a fraction (0..1)")
    if any(v.verdict == INCONCLUSIVE for v in shown):
        out.append("inconclusive: a change past the tolerance that the run could not confirm; "
                   "passes, fails under --distperf-strict")
    if any(v.verdict == INFO for v in shown):
        out.append("informational: compared and shown, never a failure")
    return out


def shown_value(metric: Metric | None, verdict: Verdict | None) -> float | None:
    """The one figure every output shows for a metric: the one its verdict judged and saved
    (a time: the estimator over its measurements, against a baseline with the host's change
    taken out; so ``baseline`` and ``change`` agree with it), else the metric's own value
    (its first measurement)."""
    if verdict is not None and verdict.current is not None:
        return verdict.current
    return metric.value if metric is not None else None


def test_block(record: TestRecord) -> list[Line]:
    """A test's figures: metric, its figure (:func:`shown_value`), then baseline, change and
    verdict where it was compared (worst verdict first); the analyzer's findings; the
    breaches."""
    _, status, colour = _test_status(record)
    lines = [Line(f"{record.nodeid} [{record.world_size} ranks] {status}", colour, bold=True)]
    verdicts = {v.metric: v for v in record.verdicts}
    rows: list[tuple[str, str, Verdict | None]] = [
        (m.name, format_value(shown_value(m, verdicts.get(m.name)), m.unit),
         verdicts.get(m.name)) for m in record.metrics]
    measured = {m.name for m in record.metrics}
    rows += [(v.metric, format_value(v.current, v.unit), v)
             for v in record.verdicts if v.metric not in measured]
    rows.sort(key=lambda row: _verdict_rank(row[2].verdict) if row[2] else len(VERDICT_ORDER))
    cells = [(name, value, *_compared(v)) for name, value, v in rows]
    if any(c[4] for c in cells):
        cells.insert(0, ("metric", "current", "baseline", "change", "verdict"))
    widths = [max((len(c[i]) for c in cells), default=0) for i in range(4)]
    for c in cells:
        verdict = c[4]
        text = f"    {c[0]:<{widths[0]}}  {c[1]:>{widths[1]}}"
        if verdict:
            text += f"  {c[2]:>{widths[2]}}  {c[3]:>{widths[3]}}  {verdict}"
        lines.append(Line(text.rstrip(), VERDICT_COLOURS.get(verdict, "")))
    lines.extend(Line(text) for text in finding_lines(record))
    lines.extend(Line(f"  ! {b}", "red") for b in record.breaches)
    return lines


def _compared(v: Verdict | None) -> tuple[str, str, str]:
    """(baseline, change, verdict) cells of a row: empty where there is nothing to compare
    (no verdict, or no baseline: the verdict lines below say so once per test)."""
    if v is None or v.verdict == "no baseline":
        return "", "", ""
    baseline = format_value(v.baseline, v.unit) if v.baseline is not None else "-"
    return baseline, format_change(v) if v.baseline is not None else "-", v.verdict


def junit_properties(record: TestRecord) -> list[tuple[str, str]]:
    """The test's figures as JUnit XML properties (pytest's ``user_properties``, written by
    ``--junitxml``): ``distperf.<metric>`` = its figure (:func:`shown_value`) and unit, and
    ``distperf.<metric>.verdict`` = its verdict, with the change where there is one."""
    verdicts = {v.metric: v for v in record.verdicts}
    out = [(f"distperf.{m.name}", format_value(shown_value(m, verdicts.get(m.name)), m.unit))
           for m in record.metrics]
    for v in record.verdicts:
        text = v.verdict
        if v.change is not None:
            text += f" ({format_change(v)})"
        out.append((f"distperf.{v.metric}.verdict", text))
    return out


def finding_lines(record: TestRecord) -> list[str]:
    """The analyzer's findings (``bottlenecks``) of the test's results, one line each; first
    the ranks' devices, where a result says they differ."""
    lines: list[str] = []
    for measurement in record.measurements:
        devices = getattr(measurement.result, "devices", "")
        if isinstance(devices, str) and devices.startswith(DIFFER):
            line = f"    devices: {devices}"
            lines += [line] if line not in lines else []
        for b in getattr(measurement.result, "bottlenecks", ()):
            where = f", ranks {', '.join(map(str, b.ranks))}" if b.ranks else ""
            lines.append(f"    finding: {b.kind} ({b.severity}{where}): {b.description}")
    return lines


# -- collective benchmarks: nccl-tests-style tables and the pair matrix ---------------------
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")


def collective_table(result: CollectiveResult) -> list[str]:
    """An nccl-tests-style table of one :class:`CollectiveResult`: one line per size."""
    r = result
    most = max((len(row.samples_us) for row in r.rows), default=r.iters)
    iters = f"{r.iters}" if most <= r.iters else f"{r.iters}..{most} (a time floor per size)"
    lines = [
        f"# {r.op}  {r.world_size} ranks  {r.backend}/{r.device_type}  warmup {r.warmup}  "
        f"iters {iters}" + ("" if r.op == "barrier" else f"  busbw = algbw x {r.bus_factor:.4g}"),
        f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>6} {'time':>10} "
        f"{'spread':>7} {'algbw':>8} {'busbw':>8} {'#wrong':>7}",
        f"#{'(B)':>11} {'(elements)':>13} {'':>9} {'':>7} {'':>6} {'(us)':>10} "
        f"{'(%)':>7} {'(GB/s)':>8} {'(GB/s)':>8}",
    ]
    if r.backend == "gloo" and r.device_type == "cuda":
        lines.insert(1, f"# {GLOO_ON_GPU}")
    redop = "sum" if r.op in _REDUCING else "none"
    root = "0" if r.op in _ROOTED else "-1"
    dtype = "-" if r.op == "barrier" else r.dtype
    for row in r.rows:
        bw = ((f"{'-':>8} {'-':>8}") if r.op == "barrier"
              else f"{row.algbw_gbps:>8.3f} {row.busbw_gbps:>8.3f}")
        lines.append(
            f"{row.size_bytes:>12} {row.count:>13} {dtype:>9} {redop:>7} {root:>6} "
            f"{row.time_us:>10.1f} {row.spread * 100:>7.1f} {bw} {row.wrong:>7}")
    if r.op != "barrier" and r.rows:
        average = sum(row.busbw_gbps for row in r.rows) / len(r.rows)
        lines.append(f"# Out of bounds values : {r.wrong} {'FAILED' if r.wrong else 'OK'}")
        lines.append(f"# Avg bus bandwidth    : {average:.4g} GB/s")
        best = max(r.rows, key=lambda row: row.busbw_gbps)
        fraction = r.peak_fraction(best)
        if fraction is not None:
            lines.append(f"# Link peak            : {r.link_peak_gbps:.4g} GB/s ({r.link}); "
                         f"best busbw {fraction:.0%} of it ({best.label})")
    lines.append("")
    return lines


def pair_matrix_lines(result: PairMatrix) -> list[str]:
    """The send/recv bandwidth matrix (row: sender, column: receiver) and what it points at."""
    r = result
    n = r.world_size
    lines = [
        f"# send/recv between rank pairs, one pair at a time  {r.label} {r.dtype}  "
        f"{r.backend}/{r.device_type}  iters {r.iters}",
        "# GB/s, median round trip (message there, one element back); row: sender, "
        "column: receiver",
        "#" + f"{'src/dst':>8}" + "".join(f"{d:>9}" for d in range(n)),
    ]
    grid = r.matrix()
    for src in range(n):
        cells = "".join(f"{'-':>9}" if v is None else f"{v:>9.3f}" for v in grid[src])
        lines.append(f" {src:>8}{cells}")
    slow = slow_pairs(r)
    typical = r.typical_gbps
    lines.append(f"# typical pair (75th percentile): {typical:.3f} GB/s; slowest: "
                 + (f"{min(p.busbw_gbps for p in r.pairs):.3f} GB/s" if r.pairs else "-"))
    if not slow:
        lines.append(f"# no slow pair (none below {SLOW_PAIR_RATIO:.0%} of typical)")
    else:
        listed = ", ".join(f"{p.src}->{p.dst} {p.busbw_gbps:.3f} GB/s "
                           f"({p.busbw_gbps / typical:.2f}x)" for p in slow[:8])
        more = f" and {len(slow) - 8} more" if len(slow) > 8 else ""
        lines.append(f"# slow pairs (below {SLOW_PAIR_RATIO:.0%} of typical): {listed}{more}")
        suspects = suspect_ranks(r)
        if suspects:
            lines.append(f"# suspect rank(s) {', '.join(map(str, suspects))}: most pairs with "
                         f"them are slow; check that device and its link")
        elif n >= 3:
            lines.append("# no rank is in most slow pairs: suspect the link(s) of those pairs")
    spreads = sorted(p.spread for p in r.pairs)
    noise = spreads[len(spreads) // 2] if spreads else 0.0
    if slow and noise > NOISY_PAIR_SPREAD:
        lines.append(f"# the round trips are noisy (median spread p10..p90 {noise:.0%} of the "
                     f"median): re-run with more iterations before blaming the hardware")
    if r.wrong:
        lines.append(f"# WRONG DATA: {r.wrong} element(s) arrived wrong")
    lines.append("")
    return lines


#: Above this spread (p10..p90 over the median) of a typical pair, slow pairs may be noise.
NOISY_PAIR_SPREAD = 0.25


def collective_lines(records: Sequence[TestRecord]) -> list[str]:
    """The tables of every ``bench``/``bench_pairs`` result, test by test."""
    lines: list[str] = []
    for record in records:
        results = [m.result for m in record.measurements
                   if isinstance(m.result, (CollectiveResult, PairMatrix))]
        if not results:
            continue
        lines.append(f"{record.nodeid}")
        for result in results:
            if isinstance(result, CollectiveResult):
                lines.extend(collective_table(result))
            else:
                lines.extend(pair_matrix_lines(result))
    if lines:
        lines[:0] = ["time: median over iterations of the slowest rank's time; spread: p10..p90 "
                     "of those times, in % of the median; GB/s = 1e9 bytes/s", ""]
    return lines


# -- baseline verdicts -----------------------------------------------------------------------


def format_value(value: float | None, unit: str) -> str:
    """A metric's value for people: times scaled to s/ms/us, fractions as 0.123."""
    if value is None:
        return "-"
    if unit == "s":
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us")):
            if abs(value) >= scale or name == "us":
                return f"{value / scale:.4g} {name}"
    if unit == "fraction":
        return f"{value:.3f}"
    if unit == "B" or unit.startswith("B/"):
        return format_bytes(value) + unit[1:]
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{value:,.0f} {unit}".rstrip()
    return f"{value:.4g} {unit}".rstrip()


def format_change(v: Verdict) -> str:
    """A verdict's change for people: ``+12.0%``, with points for a fraction."""
    if v.change is None:
        if v.unit == "fraction" and v.baseline is not None and v.current is not None:
            return f"{(v.current - v.baseline) * 100:+.1f} pt"
        return "-"
    text = f"{v.change:+.1%}"
    if v.unit == "fraction" and v.baseline is not None and v.current is not None:
        text += f" ({(v.current - v.baseline) * 100:+.1f} pt)"
    return text


def _noise(v: Verdict) -> str:
    parts = []
    if v.steal is not None:
        parts.append(f"host steal {v.steal:.1%}")
    if v.wait is not None:
        parts.append(f"CPU wait {v.wait:.1%}")
    if v.other_load is not None:
        parts.append(f"other load {v.other_load:.1%}")
    held = [m.held for m in v.measurements if m.held is not None]
    if held:
        parts.append(f"GPU held {max(held):.1%}")
    clocks = [m.sm_clock_mhz for m in v.measurements if m.sm_clock_mhz is not None]
    if clocks:
        parts.append(f"SM clock {min(clocks)} MHz")
    if v.spread is not None:
        parts.append(f"spread {v.spread:.1%}")
    if v.host_change is not None:
        follows = "" if v.control_slope is None else f", followed with slope {v.control_slope:.2f}"
        parts.append(f"host-speed control {v.host_change:+.1%} vs the baseline's{follows}")
    return ", ".join(parts)


def verdict_table(verdicts: Sequence[Verdict]) -> list[str]:
    """metric, baseline, current, change %, confidence, verdict; then each one's details."""
    rows = [("metric", "baseline", "current", "change", "confidence", "verdict")]
    for v in verdicts:
        confidence = "-" if v.confidence is None else f"{v.confidence:.2%}"
        rows.append((v.metric, format_value(v.baseline, v.unit),
                     format_value(v.current, v.unit), format_change(v), confidence, v.verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  " + "  ".join(c.ljust(w) if i in (0, 5) else c.rjust(w)
                              for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
             for r in rows]
    for v in verdicts:
        count = "" if "measurement" in v.detail else f"{v.measurement_count} measurement(s)"
        facts = "; ".join(x for x in (v.detail, count, _noise(v),
                                      f"environment {v.environment}") if x)
        lines.append(f"    {v.metric}: {facts}")
        if v.explanation:
            lines.append(f"      what changed with it: {v.explanation}")
    return lines


def verdict_report(verdicts: Sequence[Verdict], nodeid: str, path: Path) -> list[str]:
    """What a test shows in its output about its baseline verdicts."""
    if not verdicts:
        return []
    ordered = sorted(verdicts, key=lambda v: _verdict_rank(v.verdict))
    return [f"distperf verdicts for {nodeid} (baselines: {path}):", *verdict_table(ordered)]


def verdict_summary(records: Sequence[TestRecord], *, quiet: bool = False,
                    strict: bool = False) -> list[Line]:
    """Counts of the verdicts, then one line per verdict worth a look, regressions first;
    ``quiet``: the counts, the regressions and the threshold breaches only."""
    verdicts = [(r.nodeid, v) for r in records for v in r.verdicts]
    breaches = [Line(f"  {'BREACH':<14} {r.nodeid}  {b}", "red") for r in records
                for b in r.breaches]
    if not verdicts:
        return breaches if quiet else []
    counts = {k: sum(1 for _, v in verdicts if v.verdict == k) for k in VERDICT_ORDER}
    colour = next((VERDICT_COLOURS[k] for k in VERDICT_ORDER
                   if counts[k] and k in VERDICT_COLOURS), "")
    lines = [Line("distperf verdicts (per metric): " + ", ".join(
        f"{n} {k}" for k, n in counts.items() if n), colour, bold=True)]
    lines += [Line(text, "yellow") for text in dark_lines(records, strict=strict)]
    lines += [Line(text) for text in moved_lines(records)]
    for kind in VERDICT_ORDER:
        if kind in ("unchanged", "informational") or (quiet and kind != "regressed"):
            continue
        if kind == "no baseline":  # one line per test: they all say the same
            lines.extend(Line(text) for text in _no_baseline_lines(verdicts))
            continue
        for nodeid, v in verdicts:
            if v.verdict == kind:
                lines.extend(_attention(nodeid, v))
    return lines + breaches if quiet else lines




def moved(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The saved verdicts a reviewer of the new baselines looks at: metrics new to the
    baseline (no ``baseline``), gone from it (no ``current``), and those that moved past the
    tolerance in force (an exact metric's: that many units)."""
    out = []
    for v in verdicts:
        if v.verdict != "saved":
            continue
        if v.baseline is None or v.current is None:
            out.append(v)
        elif v.kind == "exact":
            if abs(v.current - v.baseline) > v.tolerance:
                out.append(v)
        elif abs(v.change) > v.tolerance if v.change is not None else v.current != v.baseline:
            out.append(v)
    return out


def moved_row(v: Verdict) -> tuple[str, str, str]:
    """(old, new, how much) of a :func:`moved` verdict, for people."""
    old, new = format_value(v.baseline, v.unit), format_value(v.current, v.unit)
    if v.baseline is None:
        return "new", new, ""
    if v.current is None:
        return old, "gone", ""
    if v.kind == "exact":
        return old, new, f"{v.current - v.baseline:+g}, exact tolerance {v.tolerance:g}"
    return old, new, f"{format_change(v)}, tolerance {v.tolerance:.0%}"


def moved_lines(records: Sequence[TestRecord]) -> list[str]:
    """What a save moved, per test: old -> new for each metric past its tolerance, and the
    metrics that are new or gone; one line for the tests where nothing moved."""
    saved = [r for r in records if any(v.verdict == "saved" for v in r.verdicts)]
    if not saved:
        return []
    lines = ["distperf baselines saved: what moved (old -> new, past the tolerance in force)"]
    still = 0
    for record in saved:
        rows = [(v.metric, *moved_row(v)) for v in moved(record.verdicts)]
        if not rows:
            still += 1
            continue
        env = next(v.environment for v in record.verdicts if v.verdict == "saved")
        if all(v.baseline is None for v in record.verdicts if v.verdict == "saved"):
            lines.append(f"  {record.nodeid}  [{env}]  new: {len(rows)} metric(s)")
            continue
        lines.append(f"  {record.nodeid}  [{env}]")
        width = max(len(r[0]) for r in rows)
        lines += [f"    {name:<{width}}  {old} -> {new}" + (f"  ({how})" if how else "")
                  for name, old, new, how in rows]
    if still:
        lines.append(f"  {still} test(s) saved with nothing moved past its tolerance")
    return lines


def dark(records: Sequence[TestRecord]) -> list[TestRecord]:
    """The tests the gate went dark for: baselines exist, but every verdict is not
    comparable (another environment: a torch upgrade, another runner type)."""
    return [r for r in records if r.verdicts
            and all(v.verdict == "not comparable" for v in r.verdicts)]


def dark_lines(records: Sequence[TestRecord], *, strict: bool = False) -> list[str]:
    """Say that the gate compared nothing for some tests, why, and how to re-save."""
    tests = dark(records)
    if not tests:
        return []
    reasons = list(dict.fromkeys(v.detail for r in tests for v in r.verdicts))
    env = tests[0].verdicts[0].environment
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return [f"distperf: the gate is dark for {len(tests)} test(s): no baseline comparable "
            f"with this run's environment ({env}), so nothing of theirs was compared"
            + ("; --distperf-strict fails the run" if strict else ""),
            *(f"  {reason}" for reason in reasons[:3]),
            *([f"  {more.strip()}"] if more else []),
            "  if this environment is the one to gate on now, re-save the baselines on this "
            "runner: pytest --distperf --distperf-save"]


#: The verdicts of a metric that was never compared with a baseline.
UNCOMPARED = ("no baseline", "not comparable")


def nothing_compared_line(records: Sequence[TestRecord]) -> str:
    """One line for the top of the summaries when the run compared no metric with a baseline
    (every verdict no baseline or not comparable: a first run, or a key gone dark): what
    happened, under which environment key, and what to do; "" otherwise."""
    verdicts = [v for r in records for v in r.verdicts]
    if not verdicts or any(v.verdict not in UNCOMPARED for v in verdicts):
        return ""
    keys = ", ".join(dict.fromkeys(v.environment for v in verdicts))
    tests = sum(1 for r in records if r.verdicts)
    return (f"distperf: NOTHING WAS COMPARED: no baseline for this run's environment ({keys}) "
            f"for any of its {tests} test(s), so only thresholds gated this run; save baselines on "
            f"this runner (pytest --distperf --distperf-save), or pin one environment name "
            f"for a fleet of like runners (--distperf-env-name NAME) and save under it")


def _attention(nodeid: str, v: Verdict) -> list[Line]:
    """``  REGRESSED  <test>  <metric>  <figures>  [details]`` and what changed with it."""
    kind = v.verdict
    head = f"  {kind.upper():<14} {nodeid}  {v.metric}"
    colour = VERDICT_COLOURS.get(kind, "")
    if kind == "saved":
        now = format_value(v.current, v.unit) if v.current is not None else "gone"
        return [Line(f"{head}  {now}"
                     + (f"  (was {format_value(v.baseline, v.unit)}, {format_change(v)})"
                        if v.baseline is not None else "")
                     + (f"  [{v.detail}]" if "noisy" in v.detail else ""))]
    if kind in ("no baseline", "not comparable"):
        return [Line(f"{head}  [{v.environment}] {v.detail}")]
    figures = (f"{format_value(v.baseline, v.unit)} -> {format_value(v.current, v.unit)} "
               f"({format_change(v)}" + (f", confidence {v.confidence:.2%}"
                                   if v.confidence is not None else "") + ")")
    extra = v.detail or ""
    if kind == "inconclusive" and _noise(v):
        extra = f"{extra}; {_noise(v)}" if extra else _noise(v)
    lines = [Line(f"{head}  {figures}" + (f"  [{extra}]" if extra else ""), colour)]
    if v.explanation:
        lines.append(Line(f"      what changed with it: {v.explanation}"))
    return lines


def _no_baseline_lines(verdicts: Sequence[tuple[str, Verdict]]) -> list[str]:
    """``NO BASELINE  <test>  N metrics [environment] why``, one line per test."""
    by_test: dict[str, list[Verdict]] = {}
    for nodeid, v in verdicts:
        if v.verdict == "no baseline":
            by_test.setdefault(nodeid, []).append(v)
    lines = []
    for nodeid, group in by_test.items():
        environments = ", ".join(dict.fromkeys(v.environment for v in group))
        details = list(dict.fromkeys(v.detail for v in group))
        what = (group[0].metric if len(group) == 1 else f"{len(group)} metrics")
        why = details[0] if len(details) == 1 else "; ".join(details)
        lines.append(f"  {'NO BASELINE':<14} {nodeid}  {what}  [{environments}] {why}")
    return lines
