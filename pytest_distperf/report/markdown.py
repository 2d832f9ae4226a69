"""The Markdown summary (``--distperf-markdown``, and ``$GITHUB_STEP_SUMMARY``): what a CI job
summary or a pull-request comment shows.  No torch, no pytest.

Compact on purpose: the environment, the verdict counts, a table of the regressions,
improvements and inconclusive verdicts with what changed with each, the threshold breaches,
every figure folded away, where the other outputs are, and a legend of the verdicts' words.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_distperf.config import GLOO_ON_GPU
from pytest_distperf.records import (
    VERDICT_ORDER,
    Environment,
    TestRecord,
    Verdict,
)
from pytest_distperf.report.terminal import (
    dark,
    dark_lines,
    format_change,
    format_value,
    legend,
    moved,
    moved_row,
    nothing_compared_line,
    shown_value,
)

#: Verdicts the summary lists one by one (the rest are counted, and folded into the details).
NOTEWORTHY = ("regressed", "inconclusive", "improved")
#: Rows of the folded table of every figure; a huge suite is cut there (GitHub caps a job
#: summary at 1 MiB).
MAX_FIGURES = 300


def run_url(env: Mapping[str, str]) -> str:
    """The GitHub Actions run's page (its artifacts are listed there), from the variables
    every job has; "" outside GitHub Actions."""
    parts = [env.get(k, "") for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID")]
    return "{}/{}/actions/runs/{}".format(*parts) if all(parts) else ""


def markdown_summary(records: Sequence[TestRecord], *, header: str,
                     environments: Sequence[Environment] = (),
                     artifacts: Sequence[tuple[str, str]] = (), url: str = "") -> str:
    """The summary as Markdown text.  ``artifacts``: (what, where) of the other outputs;
    ``url``: the CI run's page, linked for its artifacts."""
    verdicts = [(r.nodeid, v) for r in records for v in r.verdicts]
    counts = {k: sum(1 for _, v in verdicts if v.verdict == k) for k in VERDICT_ORDER}
    breaches = [(r.nodeid, b) for r in records for b in r.breaches]
    figures = sum(len(r.metrics) for r in records)
    unlit = len(dark(records))
    banner = nothing_compared_line(records)
    headline = _headline(counts, len(breaches), compared=not banner) + (
        f"; the gate is dark for {unlit} test(s) (no comparable baseline)" if unlit else "")
    out = [f"## distperf: {headline}", ""]
    if banner:  # GitHub shows an alert block as a coloured box
        out += ["> [!WARNING]", f"> **{_escape(banner.removeprefix('distperf: '))}**", ""]
    out += _environment(header, environments)
    if not records:
        out += ["No test recorded a distperf metric in this run.", ""]
    else:
        out += [f"{len(records)} test(s), {figures} figure(s): "
                + (", ".join(f"{n} {k}" for k, n in counts.items() if n) or "no verdicts")
                + ".", ""]
    out += _dark(records)
    out += _moved(records)
    noteworthy = sorted((x for x in verdicts if x[1].verdict in NOTEWORTHY),
                        key=lambda x: NOTEWORTHY.index(x[1].verdict))
    if noteworthy:
        out += ["| | test | metric | baseline | current | change | confidence |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        out += [_verdict_row(nodeid, v) for nodeid, v in noteworthy]
        out.append("")
        explained = [(nodeid, v) for nodeid, v in noteworthy if v.explanation or v.detail]
        if explained:
            out += ["What changed with them:", ""]
            out += [f"- `{v.metric}` in `{nodeid}`: " + "; ".join(
                x for x in (v.detail, v.explanation and f"with it: {v.explanation}") if x)
                for nodeid, v in explained]
            out.append("")
    if breaches:
        out += ["Threshold breaches:", ""]
        out += [f"- `{nodeid}`: {_escape(text)}" for nodeid, text in breaches]
        out.append("")
    if figures:
        out += _all_figures(records)
    if artifacts or url:
        out += ["Artifacts: " + "; ".join(
            [f"{what} `{where}`" for what, where in artifacts]
            + ([f"[this run's artifacts]({url}#artifacts)"] if url else [])), ""]
    entries = legend([v for _, v in verdicts])
    if entries:
        out += ["Legend:", "", *(f"- {_escape(e)}" for e in entries), ""]
    return "\n".join(out)


def _headline(counts: Mapping[str, int], breaches: int, *, compared: bool = True) -> str:
    bad = [f"{counts['regressed']} regressed"] if counts["regressed"] else []
    if breaches:
        bad.append(f"{breaches} threshold breach(es)")
    if counts["inconclusive"]:
        bad.append(f"{counts['inconclusive']} inconclusive")
    if bad:
        return ", ".join(bad)
    if counts["improved"]:
        return f"no regression, {counts['improved']} improved"
    return "no regression" if compared else "nothing compared"


def _environment(header: str, environments: Sequence[Environment]) -> list[str]:
    lines = []
    for env in environments:
        shared = f", {env.ranks_per_gpu} ranks per GPU" if env.ranks_per_gpu else ""
        device = (f"{env.device_count} x {env.device_model}{shared}" if env.device_type == "cuda"
                  else f"{env.device_model}, {env.cpu_cores} cores, "
                       f"{env.threads_per_rank} thread(s) per rank"
                       + (f" bound to {env.bound_cores} core(s)" if env.bound_cores else ""))
        versions = f"torch {env.torch_version}" + (f", NCCL {env.nccl_version}"
                                                     if env.nccl_version else "")
        lines.append(f"- {env.world_size} ranks, {env.backend} on {env.device_type} "
                     f"({device}), {versions}; baselines key `{env.baselines_key()}`")
        if env.backend == "gloo" and env.device_type == "cuda":
            lines.append(f"  ({GLOO_ON_GPU})")
    if not lines and header:
        lines.append(f"- {header.splitlines()[0].removeprefix('distperf: ')}")
    return [*lines, ""] if lines else []


def _dark(records: Sequence[TestRecord]) -> list[str]:
    """The dark gate, said as the terminal says it."""
    lines = dark_lines(records)
    if not lines:
        return []
    return [f"**{_escape(lines[0].removeprefix('distperf: '))}**", "",
            *(f"- {_escape(text)}" for text in lines[1:]), ""]


def _moved(records: Sequence[TestRecord]) -> list[str]:
    """What a save moved: the table the terminal shows, for the pull request that refreshes
    the baselines."""
    rows = [f"| `{r.nodeid}` | `{v.metric}` | " + " | ".join(moved_row(v)) + " |"
            for r in records for v in moved(r.verdicts)]
    saved = sum(1 for r in records if any(v.verdict == "saved" for v in r.verdicts))
    if not saved:
        return []
    if not rows:
        return [f"Baselines saved for {saved} test(s): nothing moved past its tolerance.", ""]
    return [f"Baselines saved for {saved} test(s); what moved past the tolerance in force:",
            "", "| test | metric | old | new | change |", "| --- | --- | --- | --- | --- |",
            *rows, ""]


def _verdict_row(nodeid: str, v: Verdict) -> str:
    mark = {"regressed": "**regressed**", "improved": "improved",
            "inconclusive": "inconclusive"}[v.verdict]
    confidence = "-" if v.confidence is None else f"{v.confidence:.2%}"
    return (f"| {mark} | `{nodeid}` | `{v.metric}` | {format_value(v.baseline, v.unit)} | "
            f"{format_value(v.current, v.unit)} | {format_change(v)} | {confidence} |")


def _all_figures(records: Sequence[TestRecord]) -> list[str]:
    rows = []
    for record in records:
        verdicts = {v.metric: v for v in record.verdicts}
        for m in record.metrics:
            v = verdicts.get(m.name)
            shown = format_value(shown_value(m, v), m.unit)
            rows.append(f"| `{record.nodeid}` | `{m.name}` | {shown} | "
                        f"{v.verdict if v else '-'} |")
    more = len(rows) - MAX_FIGURES
    rows = rows[:MAX_FIGURES] + ([f"| ... and {more} more | | | |"] if more > 0 else [])
    return ["<details><summary>Every figure</summary>", "",
            "| test | metric | current | verdict |", "| --- | --- | --- | --- |",
            *rows, "", "</details>", ""]


def _escape(text: str) -> str:
    """One line of plain text that Markdown shows as written (no table or emphasis marks)."""
    return " ".join(text.split()).replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")
