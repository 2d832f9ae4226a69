"""The files a run writes at its end: the JSON report, plots, history exports, the Markdown
summary and the CI job summary.  No torch, no pytest.

:class:`Outputs` says which were asked for; :func:`write_outputs` writes them (each
atomically; the job summary is appended in one write) and returns one line per file for the
terminal.  A file that cannot be written is a line that says so, never a traceback, and the
others are still written.  The plugin calls it on rank 0 only, and on pytest-xdist's
controller only.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_distperf.common.files import append_text, write_atomically
from pytest_distperf.records import Environment, TestRecord
from pytest_distperf.report.export import FORMATS, write_export
from pytest_distperf.report.jsonreport import write_json
from pytest_distperf.report.markdown import markdown_summary, run_url


@dataclasses.dataclass(frozen=True, slots=True)
class Outputs:
    """Which files to write (None / empty: not asked for)."""

    json_path: Path | None = None
    markdown_path: Path | None = None
    plots_dir: Path | None = None
    exports: tuple[tuple[str, Path], ...] = ()
    #: ``$GITHUB_STEP_SUMMARY``: the Markdown summary is appended to it
    step_summary: Path | None = None
    trace_dir: Path | None = None  # listed among the artifacts


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    text: str
    error: bool = False


class _Writer:
    """Writes one output after another: a line for each, and the artifacts to link."""

    def __init__(self, start_dir: Path | None) -> None:
        self.start_dir = start_dir
        self.messages: list[Message] = []
        self.artifacts: list[tuple[str, str]] = []

    def shown(self, path: Path) -> str:
        if self.start_dir is not None and path.is_relative_to(self.start_dir):
            return str(path.relative_to(self.start_dir))
        return str(path)

    def attempt(self, what: str, where: Path, write: Callable[[], Sequence[Path] | None]
                ) -> Sequence[Path] | None:
        """The files ``write`` wrote, or None when it failed (and a line that says why)."""
        try:
            return write() or []
        except (OSError, ValueError, RuntimeError) as exc:
            self.messages.append(Message(f"distperf: cannot write the {what} to {where}: {exc}",
                                         error=True))
            return None

    def say(self, text: str) -> None:
        self.messages.append(Message(text))


def write_outputs(outputs: Outputs, records: Sequence[TestRecord], *, header: str,
                  environments: Sequence[Environment] = (), env: Mapping[str, str] | None = None,
                  start_dir: Path | None = None,
                  sections: Mapping[str, Any] | None = None) -> list[Message]:
    """Write every output asked for; a line for each.  ``env``: the process environment (for
    the CI run's link); ``start_dir``: where pytest was started (paths are shown relative to
    it); ``sections``: named sections for the JSON report."""
    env = os.environ if env is None else env
    out = _Writer(start_dir)
    plots = outputs.plots_dir
    if plots is not None:
        from pytest_distperf.report.plots import write_plots

        drawn = out.attempt("plots", plots, lambda: write_plots(plots, records))
        if drawn is not None:
            names = ", ".join(p.name for p in drawn) or "none: nothing to plot"
            out.say(f"distperf: plots written to {plots}: {names}")
            if drawn:
                out.artifacts.append(("plots", out.shown(plots)))
    for fmt, path in outputs.exports:
        files = out.attempt(f"{FORMATS[fmt]} export", path,
                            functools.partial(write_export, fmt, path, records))
        if files is not None:
            out.say(f"distperf: {FORMATS[fmt]} export written to "
                    + " and ".join(str(p) for p in files))
            out.artifacts.append((f"{fmt} export", out.shown(path)))
    json_path = outputs.json_path
    # asked for: written even when nothing was measured
    if json_path is not None and out.attempt("JSON report", json_path, lambda: write_json(
            json_path, records, header=header, environments=environments,
            sections=sections)) is not None:
        out.say(f"distperf: JSON report written to {json_path}")
        out.artifacts.append(("JSON report", out.shown(json_path)))
    if outputs.trace_dir is not None and outputs.trace_dir.is_dir():
        out.artifacts.append(("traces", out.shown(outputs.trace_dir)))
    if outputs.markdown_path is not None or (outputs.step_summary is not None and records):
        text = markdown_summary(records, header=header, environments=environments,
                                artifacts=out.artifacts, url=run_url(env))
        _write_summaries(out, outputs, text, bool(records))
    return out.messages


def _write_summaries(out: _Writer, outputs: Outputs, text: str, measured: bool) -> None:
    """The Markdown summary, to its file and to the CI job's summary, as asked."""
    if outputs.markdown_path is not None:
        path = outputs.markdown_path

        def write_markdown() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, text)

        if out.attempt("Markdown summary", path, write_markdown) is not None:
            out.say(f"distperf: Markdown summary written to {path}")
    if outputs.step_summary is not None and measured:
        summary = outputs.step_summary
        if out.attempt("job summary ($GITHUB_STEP_SUMMARY)", summary,
                       lambda: append_text(summary, text + "\n")) is not None:
            out.say(f"distperf: summary appended to $GITHUB_STEP_SUMMARY ({summary})")
