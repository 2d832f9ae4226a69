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


def write_outputs(outputs: Outputs, records: Sequence[TestRecord], *, header: str,
                  environments: Sequence[Environment] = (), env: Mapping[str, str] | None = None,
                  start_dir: Path | None = None) -> list[Message]:
    """Write every output asked for; a line for each.  ``env``: the process environment (for
    the CI run's link); ``start_dir``: where pytest was started (paths are shown relative to
    it)."""
    env = os.environ if env is None else env
    messages: list[Message] = []
    artifacts: list[tuple[str, str]] = []

    def shown(path: Path) -> str:
        if start_dir is not None and path.is_relative_to(start_dir):
            return str(path.relative_to(start_dir))
        return str(path)

    def attempt(what: str, where: Path, write: Callable[[], Sequence[Path] | None]
                ) -> Sequence[Path] | None:
        """The files ``write`` wrote, or None when it failed (and a line that says why)."""
        try:
            return write() or []
        except (OSError, ValueError, RuntimeError) as exc:
            messages.append(Message(f"distperf: cannot write the {what} to {where}: {exc}",
                                    error=True))
            return None

    plots = outputs.plots_dir
    if plots is not None:
        from pytest_distperf.report.plots import write_plots

        drawn = attempt("plots", plots, lambda: write_plots(plots, records))
        if drawn is not None:
            names = ", ".join(p.name for p in drawn) or "none: nothing to plot"
            messages.append(Message(f"distperf: plots written to {plots}: {names}"))
            if drawn:
                artifacts.append(("plots", shown(plots)))
    for fmt, path in outputs.exports:
        files = attempt(f"{FORMATS[fmt]} export", path,
                        functools.partial(write_export, fmt, path, records))
        if files is not None:
            listed = " and ".join(str(p) for p in files)
            messages.append(Message(f"distperf: {FORMATS[fmt]} export written to {listed}"))
            artifacts.append((f"{fmt} export", shown(path)))
    json_path = outputs.json_path
    # asked for: written even when nothing was measured
    if json_path is not None and attempt("JSON report", json_path, lambda: write_json(
            json_path, records, header=header, environments=environments)) is not None:
        messages.append(Message(f"distperf: JSON report written to {json_path}"))
        artifacts.append(("JSON report", shown(json_path)))
    if outputs.trace_dir is not None and outputs.trace_dir.is_dir():
        artifacts.append(("traces", shown(outputs.trace_dir)))
    if outputs.markdown_path is None and (outputs.step_summary is None or not records):
        return messages
    text = markdown_summary(records, header=header, environments=environments,
                            artifacts=artifacts, url=run_url(env))
    if outputs.markdown_path is not None:
        path = outputs.markdown_path

        def write_markdown() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, text)

        if attempt("Markdown summary", path, write_markdown) is not None:
            messages.append(Message(f"distperf: Markdown summary written to {path}"))
    if outputs.step_summary is not None and records:
        summary = outputs.step_summary
        if attempt("job summary ($GITHUB_STEP_SUMMARY)", summary,
                   lambda: append_text(summary, text + "\n")) is not None:
            messages.append(Message(f"distperf: summary appended to $GITHUB_STEP_SUMMARY "
                                    f"({summary})"))
    return messages
