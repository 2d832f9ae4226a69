"""PNG plots of a run's results (``--distperf-plots DIR``), drawn with matplotlib (the
``plot`` extra).  No torch, no pytest; matplotlib is imported only when plots are drawn.

* ``busbw.png``: bus bandwidth against message size (log scale) per collective, with the
  link's peak where it is known (:data:`pytest_distperf.analysis.hardware.LINK_PEAKS`);
* ``scaling.png``: speedup against world size, with ideal scaling;
* ``steps-<test>.png``: per-rank step time split into compute, exposed communication and
  waiting for other ranks, stragglers marked;
* ``regressions.png``: baseline against current for every regressed metric.

A plot with nothing to draw is not written.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.common.files import file_stem, write_atomically
from pytest_distperf.config import format_bytes
from pytest_distperf.fixtures.results.group import CollectiveResult
from pytest_distperf.fixtures.results.steps import ScalingResult, StepTiming
from pytest_distperf.records import TestRecord, Verdict
from pytest_distperf.report.terminal import format_change, format_value

INSTALL = "pip install 'pytest-distperf[plot]'"


_COLOURS = {"compute": "#4C72B0", "communication": "#DD8452", "wait": "#C0C0C0",
            "baseline": "#8C8C8C", "current": "#C44E52", "ideal": "#555555"}


class PlotError(RuntimeError):
    """Plots were asked for and cannot be drawn (matplotlib is missing)."""


def require_matplotlib() -> None:
    """Raise :class:`PlotError`, saying how to install it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotError(f"--distperf-plots needs matplotlib, which is not installed: {INSTALL} "
                        f"(or leave out --distperf-plots)") from None


def write_plots(folder: Path, records: Sequence[TestRecord]) -> list[Path]:
    """Draw every plot the records have data for into ``folder``; the files written."""
    require_matplotlib()
    folder.mkdir(parents=True, exist_ok=True)
    drawn: list[tuple[str, Any]] = []
    collectives = [(r, m.result) for r in records for m in r.measurements
                   if isinstance(m.result, CollectiveResult) and m.result.op != "barrier"
                   and m.result.rows]
    if collectives:
        drawn.append(("busbw.png", busbw_figure(collectives)))
    scaling = [(r, m.result) for r in records for m in r.measurements
               if isinstance(m.result, ScalingResult) and m.result.points]
    if scaling:
        drawn.append(("scaling.png", scaling_figure(scaling)))
    for r in records:
        timings = [m.result for m in r.measurements
                   if isinstance(m.result, StepTiming) and m.result.per_rank]
        for i, timing in enumerate(timings, 1):
            suffix = f"-{i}" if i > 1 else ""
            drawn.append((f"steps-{file_stem(r.nodeid)}{suffix}.png", steps_figure(r, timing)))
    regressed = [(r.nodeid, v) for r in records for v in r.verdicts
                 if v.verdict == "regressed" and v.current is not None]
    if regressed:
        drawn.append(("regressions.png", regressions_figure(regressed)))
    written = []
    for name, figure in drawn:
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=110)
        write_atomically(folder / name, buffer.getvalue())
        written.append(folder / name)
    return written


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def busbw_figure(results: Sequence[tuple[TestRecord, CollectiveResult]]) -> Any:
    """busbw by message size per collective; the link's peak (``link_peak_gbps``, which
    ``bench`` sets where it is known) as a dashed line."""
    fig = _figure(8, 5)
    ax = fig.add_subplot()
    ops = [res.op for _, res in results]
    for record, res in results:
        label = res.op if ops.count(res.op) == 1 else f"{res.op} ({_short(record.nodeid)})"
        sizes = [row.size_bytes for row in res.rows]
        ax.plot(sizes, [row.busbw_gbps for row in res.rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    every = sorted({row.size_bytes for _, res in results for row in res.rows})
    ax.set_xticks(every, [format_bytes(s).replace(" ", "") for s in every],
                  rotation=45 if len(every) > 6 else 0)
    ax.minorticks_off()
    peaks = {(res.link_peak_gbps, res.link) for _, res in results if res.link_peak_gbps > 0}
    for gbps, link in sorted(peaks):
        ax.axhline(gbps, linestyle="--", color=_COLOURS["ideal"],
                   label=f"{link} peak {gbps:g} GB/s")
    first = results[0][1]
    known = bool(peaks)
    ax.set_title(f"Bus bandwidth by message size ({first.world_size} ranks, {first.backend}/"
                 f"{first.device_type}{'' if known else '; link peak unknown'})")
    ax.set_xlabel("message size")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def scaling_figure(results: Sequence[tuple[TestRecord, ScalingResult]]) -> Any:
    fig = _figure(7, 5)
    ax = fig.add_subplot()
    sizes = sorted({p.world_size for _, res in results for p in res.points})
    smallest = sizes[0]
    ax.plot(sizes, [s / smallest for s in sizes], linestyle="--", color=_COLOURS["ideal"],
            label="ideal")
    for record, res in results:
        points = sorted(res.points, key=lambda p: p.world_size)
        xs = [p.world_size for p in points]
        line = ax.plot(xs, [p.speedup for p in points], marker="o",
                       label=f"{_short(record.nodeid)} ({res.mode})")
        for p in points:
            ax.annotate(f"{p.efficiency:.0%}", (p.world_size, p.speedup),
                        textcoords="offset points", xytext=(6, -12),
                        color=line[0].get_color())
    ax.set_xticks(sizes)
    ax.margins(x=0.12)
    ax.set_title("Scaling: speedup against ideal (labels: efficiency)")
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel(f"speedup over {smallest} rank{'s' if smallest > 1 else ''}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def steps_figure(record: TestRecord, timing: StepTiming) -> Any:
    """Each rank's step as its compute, the group's exposed communication and its wait for
    the other ranks; the exposed communication is the figure the title and the
    ``exposed_comm_s`` metric give (``comm_overhead`` x ``step_time_s``: the headroom
    method measures it for the group), not what a rank's median step leaves over."""
    fig = _figure(max(6.5, 1.2 * len(timing.per_rank) + 3), 5)
    ax = fig.add_subplot()
    ranks = [p.rank for p in timing.per_rank]
    ms = 1e3
    exposed_s = timing.comm_overhead * timing.step_time_s
    compute = [p.compute_time_s * ms for p in timing.per_rank]
    wait = [max(0.0, p.wait_time_s) * ms for p in timing.per_rank]
    comm = [exposed_s * ms for _ in timing.per_rank]
    ax.bar(ranks, compute, color=_COLOURS["compute"], label="compute")
    ax.bar(ranks, comm, bottom=compute, color=_COLOURS["communication"],
           label="exposed communication")
    tops = [c + x for c, x in zip(compute, comm, strict=True)]
    ax.bar(ranks, wait, bottom=tops, color=_COLOURS["wait"], label="waiting for other ranks")
    highest = max((t + w for t, w in zip(tops, wait, strict=True)), default=0.0)
    for p, top, w in zip(timing.per_rank, tops, wait, strict=True):
        if p.straggler:
            ax.bar([p.rank], [top + w], fill=False, edgecolor="red", linewidth=2.5)
            ax.annotate(f"straggler: rank {p.rank}", (p.rank, top + w),
                        textcoords="offset points",
                        xytext=(0, 4), ha="center", color="red", fontweight="bold")
    ax.set_xticks(ranks, [f"rank {r}" for r in ranks])
    ax.set_ylim(0, highest * 1.15 if highest > 0 else 1)
    ax.set_ylabel("step on the rank (ms): compute + exposed communication + wait")
    stragglers = ", ".join(map(str, timing.stragglers)) or "none"
    ax.set_title(f"{_short(record.nodeid)}\n{timing.wrapper.upper()} step "
                 f"{format_value(timing.step_time_s, 's')}, exposed communication "
                 f"{timing.comm_overhead:.0%} ({format_value(exposed_s, 's')}), imbalance "
                 f"{timing.imbalance:.0%}, stragglers: {stragglers}", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    return fig


def regressions_figure(regressed: Sequence[tuple[str, Verdict]]) -> Any:
    shown = regressed[:12]
    cols = min(3, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig = _figure(4.2 * cols, 3.4 * rows)
    fig.suptitle("Regressed metrics: baseline against current"
                 + (f" (first 12 of {len(regressed)})" if len(regressed) > 12 else ""))
    for i, (nodeid, v) in enumerate(shown):
        ax = fig.add_subplot(rows, cols, i + 1)
        values = [v.baseline or 0.0, v.current or 0.0]
        bars = ax.bar(["baseline", "current"], values,
                      color=[_COLOURS["baseline"], _COLOURS["current"]])
        for bar, value in zip(bars, (v.baseline, v.current), strict=True):
            ax.annotate(format_value(value, v.unit), (bar.get_x() + bar.get_width() / 2,
                                                     bar.get_height()),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=9)
        ax.set_ylim(0, max(values) * 1.25 if max(values) > 0 else 1)
        ax.set_title(f"{_wrap(v.metric)}\n{_short(nodeid)}  ({format_change(v)})", fontsize=9)
        ax.set_ylabel(v.unit or "value", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    return fig


def _short(nodeid: str) -> str:
    """The test's name without its folders: ``test_x.py::test_y``."""
    return nodeid.rsplit("/", 1)[-1]


def _wrap(text: str, width: int = 38) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."

