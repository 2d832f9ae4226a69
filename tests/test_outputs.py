"""The run's outputs end to end (issue 12): the grouped terminal summary, the JSON report
against its published schema, the Markdown summary and the CI job summary, the history
exports, the plots and the merged traces; all from one real run on 2 gloo ranks.

The run (module-scoped, reused by every test here): a bandwidth sweep, a DDP step with a
straggler, a weak-scaling sweep and a profiled call whose all_reduce count is the only figure
compared with a baseline.  That baseline is saved first with one all_reduce per call; the run
makes three, an exact regression (1 -> 3 calls) that no noise can hide or fake.  Every other
figure has no baseline and limits too wide to breach, so the outcome is always the same.
Beside it: extra.py (-q and a test that raises, run on their own) and a run under torchrun
(only rank 0 writes). The example CI workflow: test_ci_recipe.py.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from quick_runs import ONE_SAVE, pytest_here

from pytest_distperf.fixtures.results import record_to_dict
from pytest_distperf.report import jsonreport
from pytest_distperf.report import terminal as report

PERF = textwrap.dedent("""
    import pytest
    import torch
    from torch import nn

    pytestmark = pytest.mark.distperf(max_comm_overhead=2.0, max_imbalance=1e6,
                                      min_scaling_efficiency=0.0)

    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))

    def uneven(rank):  # rank 1 has four times the work: a straggler
        return torch.randn(256 * (4 if rank == 1 else 1), 64)

    def test_bench(nccl_group):
        nccl_group.bench("all_reduce", ["4KiB", "64KiB", "1MiB"], warmup=1, iters=5)

    @pytest.mark.distperf(max_imbalance=0.1)  # 4x the work on rank 1: a breach, always
    def test_step(ddp_step_timer):
        ddp_step_timer(make_model, uneven, steps=6, warmup=1)

    def test_scaling(ddp_step_timer):
        ddp_step_timer.scaling(make_model, lambda rank: torch.randn(64, 64),
                               world_sizes=(1, 2), steps=6, warmup=1)
""")

COUNTS = textwrap.dedent("""
    import os
    import pytest
    import torch
    import torch.distributed as dist

    @pytest.mark.distperf(max_comm_overhead=2.0, max_imbalance=1e6)
    def test_counts(dist_profiler):
        calls = int(os.environ["DISTPERF_TEST_CALLS"])

        def work():
            t = torch.ones(256)
            for _ in range(calls):
                dist.all_reduce(t)

        dist_profiler.warmup = 0
        dist_profiler(work)
""")

# Not collected by the main run (no test_ prefix); run by name. test_quiet: the same count
# regression, beside a second profile that does not change (its figures are per-metric rows
# that -q leaves out); test_raises: figures recorded, then the test raises.
EXTRA = textwrap.dedent("""
    import os
    import pytest
    import torch
    import torch.distributed as dist

    pytestmark = pytest.mark.distperf(max_comm_overhead=2.0, max_imbalance=1e6)

    def all_reduces(n):
        t = torch.ones(256)
        for _ in range(n):
            dist.all_reduce(t)

    def test_quiet(dist_profiler):
        dist_profiler.warmup = 0
        dist_profiler(all_reduces, int(os.environ["DISTPERF_TEST_CALLS"]))
        dist_profiler(all_reduces, 1)

    def test_raises(nccl_group):
        nccl_group.measure("tiny", lambda: None, warmup=0, iters=3)
        raise RuntimeError("raised after recording a figure")
""")

BASE = ("-p", "no:cacheprovider", "--distperf", "--gpus", "2")
#: The umask every run here has: new files get 0o666 & ~UMASK.
UMASK = 0o022
REGRESSED = "profile.comm.all_reduce.calls"


@dataclass
class Run:
    path: Path
    text: str  # the terminal output
    out: Path  # where the outputs went


def _pytest(folder: Path, *args: str, **env: str) -> str:
    """Run pytest in ``folder``, in this process (:func:`quick_runs.pytest_here`), with
    variables added to the environment; its output."""
    proc = pytest_here(folder, *args, umask=UMASK, **env)
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "test_perf.py").write_text(PERF)
    (folder / "test_counts.py").write_text(COUNTS)
    (folder / "extra.py").write_text(EXTRA)
    saved = _pytest(folder, *BASE, "--distperf-save", *ONE_SAVE, "test_counts.py",
                    "extra.py::test_quiet", DISTPERF_TEST_CALLS="1")
    assert "2 passed" in saved, saved
    out = folder / "out"
    summary = out / "step_summary.md"
    out.mkdir()
    summary.write_text("earlier step\n")
    # what an earlier run left: the merged trace compressed, the ranks' too, and a third rank
    stale = out / "traces" / "test_counts.py__test_counts.ranks"
    stale.mkdir(parents=True)
    for name in ("rank1.trace.json.gz", "rank2.trace.json", "notes.txt"):
        (stale / name).write_text("old")
    (out / "traces" / "test_counts.py__test_counts.trace.json.gz").write_text("old")
    text = _pytest(
        folder, *BASE, "-rA", "--color=yes", "--distperf-json", str(out / "report.json"),
        "--distperf-markdown", str(out / "summary.md"), "--distperf-plots", str(out / "plots"),
        "--distperf-export", "bmf", str(out / "bmf.json"),
        "--distperf-export", "gab", str(out / "gab.json"),
        "--distperf-trace", str(out / "traces"), "--junitxml", str(out / "junit.xml"),
        DISTPERF_TEST_CALLS="3", GITHUB_STEP_SUMMARY=str(summary),
        GITHUB_SERVER_URL="https://github.com", GITHUB_REPOSITORY="o/r", GITHUB_RUN_ID="42")
    assert re.search(r"2 failed, 2 passed", _plain(text)), text
    return Run(folder, text, out)


def _plain(text: str) -> str:
    """Terminal output without its colour codes."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _report(run: Run) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run.out / "report.json").read_text())
    return data


# -- 2: the JSON report and its schema -----------------------------------------------------------
def test_the_json_report_validates_against_its_schema_and_round_trips(run: Run) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    data = _report(run)
    jsonschema.Draft202012Validator.check_schema(jsonreport.load_schema())
    jsonschema.validate(data, jsonreport.load_schema(),
                        cls=jsonschema.Draft202012Validator)
    assert data["schema_version"] == jsonreport.SCHEMA_VERSION
    kinds = {r["kind"] for t in data["tests"] for r in t["results"]}
    assert kinds == {"CollectiveResult", "StepTiming", "ScalingResult", "ProfileReport"}
    (env,) = data["environments"]
    step = next(t for t in data["tests"] if t["nodeid"].endswith("test_step"))
    assert step["results"][0]["result"]["stragglers"] == [1]
    assert env["backend"] == "gloo" and env["world_size"] == 2
    counts = next(t for t in data["tests"] if t["nodeid"].endswith("test_counts"))
    verdict = next(v for v in counts["verdicts"] if v["metric"] == REGRESSED)
    assert (verdict["verdict"], verdict["baseline"], verdict["current"]) == ("regressed", 1, 3)
    assert verdict["environment"].startswith(env["key"])
    # read back typed, and written again: the same data
    _, records = jsonreport.read_json(run.out / "report.json")
    assert [record_to_dict(r) for r in records] == data["tests"]


def test_a_bad_report_is_refused_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    for text, words in (("{", "cannot read it as JSON"), ("[]", "no schema_version"),
                        ('{"schema_version": 99, "tests": []}', "schema_version 99")):
        path.write_text(text)
        with pytest.raises(jsonreport.ReportError, match=words) as info:
            jsonreport.read_json(path)
        assert str(path) in str(info.value)


# -- 1: the terminal summary ----------------------------------------------------------------------
def test_the_summary_is_grouped_by_test_with_regressions_first_in_colour(run: Run) -> None:
    coloured = run.text.split("distperf summary", 1)[1].splitlines()
    lines = [_plain(line) for line in coloured]
    heads = [i for i, line in enumerate(lines) if " ranks] " in line]
    # the regressed test comes first, in red, its regressed metric first with its figures
    assert lines[heads[0]] == "test_counts.py::test_counts [2 ranks] REGRESSED"
    assert "\x1b[31m" in coloured[heads[0]]
    table = lines[heads[0] + 1:heads[1]]
    assert table[0].split() == ["metric", "current", "baseline", "change", "verdict"]
    assert table[1].split() == [REGRESSED, "3", "calls", "1", "calls", "+200.0%", "regressed"]
    assert "\x1b[31m" in coloured[heads[0] + 2]
    # then the breach; tests without a baseline list their figures alone
    assert lines[heads[1]] == "test_perf.py::test_step [2 ranks] BREACH"
    assert lines[heads[1] + 1].split()[0] == "step_time_s"
    assert lines[heads[1] + 1].endswith(" ms")
    assert any(line.startswith("  ! imbalance = ") for line in lines[heads[1]:heads[2]])
    # the counts line and the regression, with what changed with it
    counts = next(line for line in lines if "distperf verdicts (per metric):" in line)
    assert "regressed" in counts and "no baseline" in counts
    assert any("REGRESSED" in line and REGRESSED in line for line in lines)


def test_the_summary_ends_with_a_legend_of_the_words_it_shows(run: Run) -> None:
    """The run's verdicts against baselines are exact counts and informational fractions:
    the legend says what those mean, and nothing about a measured figure it does not show;
    the Markdown summary ends with the same."""
    lines = [_plain(line) for line in run.text.split("distperf summary", 1)[1].splitlines()]
    start = lines.index("legend:")
    assert lines[start + 1:start + 4] == [
        "  exact: a count fails on any change past its exact tolerance (0 unless set)",
        "  pt: percentage points, the change of a fraction (0..1)",
        "  informational: compared and shown, never a failure"]
    assert lines[start + 4].startswith("distperf: ")  # where the outputs went
    assert (run.out / "summary.md").read_text().endswith(
        "Legend:\n\n- exact: a count fails on any change past its exact tolerance (0 unless "
        "set)\n- pt: percentage points, the change of a fraction (0..1)\n- informational: "
        "compared and shown, never a failure\n")


def test_quiet_keeps_the_regressions_and_the_counts(run: Run) -> None:
    _, records = jsonreport.read_json(run.out / "report.json")
    quiet = [line.text for line in report.summary(records, quiet=True)]
    loud = [line.text for line in report.summary(records)]
    assert quiet[0].startswith("distperf verdicts (per metric): ")
    assert [line.split()[:3] for line in quiet[1:] if not line.startswith("      ")] == [
        ["REGRESSED", "test_counts.py::test_counts", REGRESSED],
        ["REGRESSED", "test_counts.py::test_counts", "profile.comm.all_reduce.bytes"],
        ["BREACH", "test_perf.py::test_step", "imbalance"]]
    assert len(loud) > len(quiet) and quiet[0] in loud


@pytest.fixture(scope="module")
def quiet_run(run: Run) -> str:
    """extra.py's two tests with -q and --color=no, and a JUnit XML file: the output."""
    return _pytest(run.path, *BASE, "-q", "--color=no", "extra.py::test_quiet",
                   "extra.py::test_raises", "--junitxml", str(run.out / "raised.xml"),
                   DISTPERF_TEST_CALLS="3")


def test_quiet_through_the_plugin_keeps_regressions_and_counts_in_plain_text(
        quiet_run: str) -> None:
    """-q keeps the counts and the regressions and drops the per-metric rows (the unchanged
    second profile's among them); --color=no: no colour codes at all."""
    text = quiet_run
    assert "\x1b[" not in text
    assert "2 failed" in text, text  # test_quiet regressed, test_raises raised
    # the distperf section alone (with $CI set, pytest's short summary follows it with the
    # failure messages uncut)
    section = text.split("distperf summary", 1)[1].splitlines()[1:]
    summary = section[:next((i for i, line in enumerate(section) if line.startswith("=")),
                            len(section))]
    counts = next(line for line in summary if line.startswith("distperf verdicts (per metric):"))
    assert "2 regressed" in counts and "2 unchanged" in counts, counts
    assert [line.split()[:3] for line in summary if line.startswith("  REGRESSED")] == [
        ["REGRESSED", "extra.py::test_quiet", REGRESSED],
        ["REGRESSED", "extra.py::test_quiet", "profile.comm.all_reduce.bytes"]]
    # no block per test, no table, no rows of figures
    assert not [line for line in summary
                if " ranks] " in line or re.match(r"    \S", line)], summary


def test_junit_xml_holds_the_figures_of_a_test_that_raised(run: Run, quiet_run: str) -> None:
    from xml.etree import ElementTree

    assert "RuntimeError: raised after recording a figure" in quiet_run, quiet_run
    cases = {c.get("name"): c for c in ElementTree.parse(run.out / "raised.xml").iter("testcase")}
    case = cases["test_raises"]
    assert case.find("failure") is not None
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert set(props) == {"distperf.tiny.time_s"}, props
    assert props["distperf.tiny.time_s"].endswith("s")


# -- 3: Markdown and the job summary -------------------------------------------------------------
def test_the_markdown_summary_and_the_job_summary(run: Run) -> None:
    text = (run.out / "summary.md").read_text()
    assert text.startswith("## distperf: 2 regressed, 1 threshold breach(es)\n")
    assert ("| **regressed** | `test_counts.py::test_counts` | `profile.comm.all_reduce.calls`"
            " | 1 calls | 3 calls | +200.0% | - |") in text
    assert "- 2 ranks, gloo on cpu (" in text
    assert "[this run's artifacts](https://github.com/o/r/actions/runs/42#artifacts)" in text
    assert "JSON report `" in text and "plots `" in text
    # appended to $GITHUB_STEP_SUMMARY after what an earlier step wrote there
    assert (run.out / "step_summary.md").read_text() == "earlier step\n" + text + "\n"


# -- 5: JUnit XML ----------------------------------------------------------------------------------
def test_junit_xml_holds_the_figures_and_verdicts(run: Run) -> None:
    from xml.etree import ElementTree

    tree = ElementTree.parse(run.out / "junit.xml")
    props = {p.get("name"): p.get("value") for case in tree.iter("testcase")
             if case.get("name") == "test_counts" for p in case.iter("property")}
    assert props[f"distperf.{REGRESSED}"] == "3 calls"
    assert props[f"distperf.{REGRESSED}.verdict"] == "regressed (+200.0%)"


# -- 6: history exports ----------------------------------------------------------------------------
BMF_SCHEMA = {  # Bencher's published schema of the Bencher Metric Format
    "type": "object",
    "patternProperties": {".+": {"type": "object", "patternProperties": {".+": {
        "type": "object", "required": ["value"],
        "properties": {"value": {"type": "number"}, "lower_value": {"type": "number"},
                       "upper_value": {"type": "number"}}}}}}}
GAB_SCHEMA = {  # github-action-benchmark's customSmallerIsBetter / customBiggerIsBetter
    "type": "array", "minItems": 1,
    "items": {"type": "object", "required": ["name", "unit", "value"],
              "properties": {"name": {"type": "string"}, "unit": {"type": "string"},
                             "value": {"type": "number"}, "range": {"type": "string"},
                             "extra": {"type": "string"}}}}


def test_the_history_exports_parse(run: Run) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    bmf = json.loads((run.out / "bmf.json").read_text())
    jsonschema.validate(bmf, BMF_SCHEMA)
    step = bmf["test_perf.py::test_step::step_time_s"]["latency"]  # nanoseconds
    assert step["lower_value"] <= step["value"] <= step["upper_value"]
    assert bmf[f"test_counts.py::test_counts::{REGRESSED}"] == {"calls": {"value": 3}}
    smaller = json.loads((run.out / "gab.json").read_text())
    bigger = json.loads((run.out / "gab.bigger.json").read_text())
    jsonschema.validate(smaller, GAB_SCHEMA)
    jsonschema.validate(bigger, GAB_SCHEMA)
    names = {e["name"]: e for e in smaller}
    counts = names[f"test_counts.py::test_counts::{REGRESSED}"]
    assert "verdict: regressed (+200.0%)" in counts["extra"]
    assert {e["name"] for e in bigger} >= {"test_perf.py::test_bench::all_reduce.1MiB.busbw_gbps",
                                           "test_perf.py::test_scaling::scaling_efficiency.w2"}
    assert len(names) + len(bigger) == len(bmf)


# -- 4: plots -------------------------------------------------------------------------------------
def test_each_plot_is_a_png_made_from_the_runs_results(run: Run) -> None:
    files = sorted(p.name for p in (run.out / "plots").iterdir())
    assert files == ["busbw.png", "regressions.png", "scaling.png",
                     "steps-test_perf.py__test_step.png"]
    for name in files:
        data = (run.out / "plots" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", name
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 400 and height >= 300, name
        assert os.stat(run.out / "plots" / name).st_mode & 0o777 == 0o666 & ~UMASK


def _plotted(run: Run) -> list[Any]:
    pytest.importorskip("matplotlib")
    _, records = jsonreport.read_json(run.out / "report.json")
    return records


def test_the_busbw_plot_has_a_log_size_axis_and_the_link_peak_where_known(run: Run) -> None:
    import dataclasses

    from pytest_distperf.fixtures.results.group import CollectiveResult
    from pytest_distperf.report import plots

    records = _plotted(run)
    (record, result), = [(r, m.result) for r in records for m in r.measurements
                         if isinstance(m.result, CollectiveResult)]
    assert result.link_peak_gbps == 0  # gloo on CPU: no known link

    def peak_lines(fig: Any) -> list[Any]:
        return [line for line in fig.axes[0].get_lines() if "peak" in line.get_label()]

    unknown = plots.busbw_figure([(record, result)])
    (ax,) = unknown.axes
    assert ax.get_xscale() == "log"
    assert [line.get_label() for line in ax.get_lines()] == ["all_reduce"]
    assert list(ax.get_lines()[0].get_xdata()) == [4096, 65536, 1 << 20]
    assert not peak_lines(unknown) and "link peak unknown" in ax.get_title()
    nvlink = dataclasses.replace(result, link_peak_gbps=450.0, link="NVLink 4")
    known = plots.busbw_figure([(record, nvlink)])
    (line,) = peak_lines(known)
    assert line.get_label() == "NVLink 4 peak 450 GB/s" and line.get_linestyle() == "--"
    assert set(line.get_ydata()) == {450.0}
    assert "unknown" not in known.axes[0].get_title()


def test_the_steps_plot_marks_the_straggler_by_its_rank(run: Run) -> None:
    from pytest_distperf.fixtures.results.steps import StepTiming
    from pytest_distperf.report import plots

    records = _plotted(run)
    (record, timing), = [(r, m.result) for r in records for m in r.measurements
                         if isinstance(m.result, StepTiming)]
    assert timing.stragglers == [1]
    (ax,) = plots.steps_figure(record, timing).axes
    assert [t.get_text() for t in ax.texts] == ["straggler: rank 1"]
    (mark,) = ax.texts
    assert mark.xy[0] == 1  # above rank 1's bar
    (outline,) = (p for p in ax.patches if not p.get_fill())  # one bar outlined: rank 1's
    assert outline.get_x() < 1 < outline.get_x() + outline.get_width()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["rank 0", "rank 1"]


def test_the_scaling_plot_has_ideal_scaling(run: Run) -> None:
    from pytest_distperf.fixtures.results.steps import ScalingResult
    from pytest_distperf.report import plots

    records = _plotted(run)
    scaling = [(r, m.result) for r in records for m in r.measurements
               if isinstance(m.result, ScalingResult)]
    (ax,) = plots.scaling_figure(scaling).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    ideal = lines["ideal"]
    assert list(ideal.get_xdata()) == [1, 2] and list(ideal.get_ydata()) == [1.0, 2.0]
    (measured,) = (line for label, line in lines.items() if label != "ideal")
    assert list(measured.get_xdata()) == [1, 2]
    assert len(ax.texts) == 2 and all(t.get_text().endswith("%") for t in ax.texts)


def test_the_regressions_plot_has_baseline_and_current_bars(run: Run) -> None:
    from pytest_distperf.report import plots

    records = _plotted(run)
    regressed = [(r.nodeid, v) for r in records for v in r.verdicts if v.verdict == "regressed"]
    fig = plots.regressions_figure(regressed)
    assert len(fig.axes) == len(regressed) == 2
    for ax, (_, verdict) in zip(fig.axes, regressed, strict=True):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "current"]
        assert [bar.get_height() for bar in ax.patches] == [verdict.baseline, verdict.current]
        assert verdict.metric in ax.get_title()
    assert [t.get_text() for t in fig.axes[0].texts] == ["1 calls", "3 calls"]


def _new_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# -- 7: traces ------------------------------------------------------------------------------------
def test_each_ranks_own_trace_is_kept_beside_the_merged_one(run: Run) -> None:
    traces = run.out / "traces"
    merged = traces / "test_counts.py__test_counts.trace.json"
    assert sorted(p.name for p in traces.iterdir()) == ["test_counts.py__test_counts.ranks",
                                                        merged.name]
    assert json.loads(merged.read_text())["traceEvents"]  # small: plain JSON
    folder = traces / "test_counts.py__test_counts.ranks"
    # the stale traces of an earlier run are gone (the merged .json.gz, rank1's .json.gz,
    # rank 2 of a larger world); a file the plugin did not name stays
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "rank0.trace.json",
                                                        "rank1.trace.json"]
    for rank in (0, 1):
        path = folder / f"rank{rank}.trace.json"
        trace = json.loads(path.read_text())
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        assert any(e.get("name") == "gloo:all_reduce" for e in trace["traceEvents"])


def test_every_file_of_the_run_has_the_mode_a_new_file_gets(run: Run) -> None:
    """0o644 under umask 022, as any file a program creates, though each was first a temp
    file (which mkstemp makes 0o600)."""
    files = [p for p in run.out.rglob("*") if p.is_file() and p.name != "step_summary.md"]
    names = {p.relative_to(run.out).as_posix() for p in files}
    assert {"report.json", "summary.md", "bmf.json", "gab.json", "gab.bigger.json",
            "plots/busbw.png", "traces/test_counts.py__test_counts.trace.json",
            "traces/test_counts.py__test_counts.ranks/rank0.trace.json",
            "traces/test_counts.py__test_counts.ranks/rank1.trace.json"} <= names
    modes = {p.relative_to(run.out).as_posix(): oct(p.stat().st_mode & 0o777) for p in files}
    assert set(modes.values()) == {oct(0o644)}, modes


def test_a_file_that_exists_keeps_its_mode(tmp_path: Path) -> None:
    from pytest_distperf.common.files import write_atomically

    path = tmp_path / "report.json"
    path.write_text("old")
    path.chmod(0o600)
    write_atomically(path, "new")
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600


def test_a_large_trace_is_written_gzip_compressed(tmp_path: Path) -> None:
    from pytest_distperf.fixtures.profiler import rank_trace_dir, write_trace

    trace = {"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1}
                             for i in range(2000)]}
    small = write_trace(tmp_path / "t.trace.json", trace)
    assert small == tmp_path / "t.trace.json" and json.loads(small.read_text()) == trace
    large = write_trace(tmp_path / "u.trace.json", trace, gzip_above=1000)
    assert large == tmp_path / "u.trace.json.gz"
    with gzip.open(large, "rt", encoding="utf-8") as f:
        assert json.load(f) == trace
    assert large.stat().st_size < small.stat().st_size / 5
    assert large.stat().st_mode & 0o777 == _new_file_mode()
    assert rank_trace_dir(large) == rank_trace_dir(small).with_name("u.ranks")


def test_a_compressed_trace_replaces_the_plain_one_and_fewer_ranks_drop_the_others(
        tmp_path: Path) -> None:
    from pytest_distperf.fixtures.profiler import rank_trace_dir, remove_stale_traces, write_trace

    trace = {"traceEvents": [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1}
                             for i in range(200)]}
    merged = tmp_path / "t.trace.json"
    folder = rank_trace_dir(merged)
    # an earlier run: plain JSON, four ranks
    written = [write_trace(merged, trace)]
    written += [write_trace(folder / f"rank{r}.trace.json", trace) for r in range(4)]
    remove_stale_traces(written)
    (folder / "rank0.trace.json.txt").write_text("not a trace this module names")
    # this run: compressed, two ranks
    written = [write_trace(merged, trace, gzip_above=100)]
    written += [write_trace(folder / f"rank{r}.trace.json", trace, gzip_above=100)
                for r in range(2)]
    remove_stale_traces(written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.ranks", "t.trace.json.gz"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank0.trace.json.gz", "rank0.trace.json.txt", "rank1.trace.json.gz"]


# -- under torchrun, only rank 0 writes -----------------------------------------------------------
TORCHRUN_SUITE = textwrap.dedent("""
    import pytest
    import torch
    import torch.distributed as dist

    pytestmark = pytest.mark.distperf(max_comm_overhead=2.0, max_imbalance=1e6)

    def test_bench(nccl_group):
        nccl_group.bench("all_reduce", ["4KiB", "64KiB"], warmup=1, iters=3)

    def test_profiled(dist_profiler):
        def work():
            dist.all_reduce(torch.ones(256))

        dist_profiler.warmup = 0
        dist_profiler(work)

    def test_pairs_and_measure(nccl_group):  # the other kinds of result, for the schema
        nccl_group.bench_pairs("4KiB", warmup=1, iters=2)
        nccl_group.measure("noop", lambda: None, warmup=0, iters=2)
""")


def test_under_torchrun_only_rank_zero_writes_the_outputs(tmp_path: Path) -> None:
    """Every rank runs pytest with the same options and inherits $GITHUB_STEP_SUMMARY; the
    files are written, and the job summary appended to, once."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_torchrun_outputs.py").write_text(TORCHRUN_SUITE)
    out = tmp_path / "out"
    out.mkdir()
    summary = out / "step_summary.md"
    plots = importlib.util.find_spec("matplotlib") is not None
    args = ["--distperf-json", "out/report.json", "--distperf-markdown", "out/summary.md",
            "--distperf-export", "bmf", "out/bmf.json", "--distperf-export", "gab", "out/gab.json",
            "--distperf-trace", "out/traces", *(["--distperf-plots", "out/plots"] if plots else [])]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "--tee", "3", "-m", "pytest", "-p", "no:cacheprovider", "--distperf", "-rA", *args],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS="1", GITHUB_STEP_SUMMARY=str(summary)))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert output.count("3 passed") == 2, output  # both ranks ran the suite
    # one rank wrote, once each
    for line in ("distperf: JSON report written to", "distperf: Markdown summary written to",
                 "distperf: Bencher Metric Format export written to",
                 "distperf: github-action-benchmark export written to",
                 "distperf: summary appended to $GITHUB_STEP_SUMMARY",
                 "distperf: merged trace of 2 ranks written to",
                 *(["distperf: plots written to"] if plots else [])):
        assert output.count(line) == 1, (line, output)
    text = summary.read_text()
    assert text.count("## distperf") == 1, text
    assert text == (out / "summary.md").read_text() + "\n"
    data, records = jsonreport.read_json(out / "report.json")
    if importlib.util.find_spec("jsonschema") is not None:
        import jsonschema

        jsonschema.validate(data, jsonreport.load_schema(), cls=jsonschema.Draft202012Validator)
    assert [r.nodeid.split("::")[1] for r in records] == [
        "test_bench", "test_profiled", "test_pairs_and_measure"]
    assert {type(m.result).__name__ for r in records for m in r.measurements} == {
        "CollectiveResult", "ProfileReport", "PairMatrix", "MeasureResult"}
    assert json.loads((out / "bmf.json").read_text())
    assert json.loads((out / "gab.json").read_text())
    traces = out / "traces"
    stem = "test_torchrun_outputs.py__test_profiled"
    assert sorted(p.name for p in traces.iterdir()) == [f"{stem}.ranks", f"{stem}.trace.json"]
    assert sorted(p.name for p in (traces / f"{stem}.ranks").iterdir()) == [
        "rank0.trace.json", "rank1.trace.json"]
    if plots:
        assert [p.name for p in (out / "plots").iterdir()] == ["busbw.png"]
    # no temp file left behind by a write that lost a race
    assert not [p for p in out.rglob(".*") if p.is_file()], list(out.rglob(".*"))
