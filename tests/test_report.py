"""The session summary's wording (report.py), when and where the JSON report is written, the
Markdown summary (a snapshot), and the pure parts of plots and exports.  The outputs of a real
run are tested in test_outputs.py."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

import pytest

from pytest_distperf.config import ConfigError
from pytest_distperf.records import Environment, Measurement, Metric, TestRecord, Verdict
from pytest_distperf.report import export, jsonreport, markdown, plots
from pytest_distperf.report import terminal as report


def test_no_baseline_is_one_line_per_test() -> None:
    why = "no baseline file for this test module yet: run with --distperf-save to create it"
    a = TestRecord("t.py::test_a", 4, verdicts=[
        Verdict(name, "no baseline", "gloo-cpu-w4", detail=why) for name in ("x", "y", "z")])
    b = TestRecord("t.py::test_b", 2, verdicts=[
        Verdict("only", "no baseline", "gloo-cpu-w2", detail=why),
        Verdict("slow", "regressed", "gloo-cpu-w2", "s", False, 1.0, 2.0, 1.0, 0.999)])
    lines = [line.text for line in report.verdict_summary([a, b])]
    assert lines[0] == "distperf verdicts (per metric): 1 regressed, 4 no baseline"
    assert lines[1].split()[:3] == ["REGRESSED", "t.py::test_b", "slow"]
    assert lines[2:] == [
        f"  NO BASELINE    t.py::test_a  3 metrics  [gloo-cpu-w4] {why}",
        f"  NO BASELINE    t.py::test_b  only  [gloo-cpu-w2] {why}",
    ]


def test_the_json_report_is_written_when_asked_even_with_nothing_measured(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative --distperf-json is relative to where pytest was started, like
    --junitxml (not to the rootdir), and the file is written even when no test measured
    anything, saying so."""
    pytester.makeini("[pytest]\n")  # the rootdir: pytester's folder
    pytester.makepyfile(test_plain="def test_x():\n    pass\n")
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.runpytest("--distperf", "--distperf-json", "out.json",
                                str(pytester.path / "test_plain.py"),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    data = json.loads((sub / "out.json").read_text())
    assert data["tests"] == [] and "no test recorded a distperf metric" in data["note"]
    assert not (pytester.path / "out.json").exists()
    result.stdout.fnmatch_lines([f"distperf: JSON report written to {sub / 'out.json'}"])


def test_a_relative_trace_folder_is_relative_to_where_pytest_was_started(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\n")  # the rootdir: pytester's folder
    pytester.makepyfile(test_profiled=(
        "import pytest\nimport torch.distributed as dist\n\n"
        "@pytest.mark.distperf(max_comm_overhead=1.5, max_imbalance=1e6)\n"
        "def test_p(dist_profiler):\n    dist_profiler(dist.barrier)\n"))
    sub = pytester.mkdir("sub")
    monkeypatch.chdir(sub)
    result = pytester.runpytest("--distperf", "--gpus", "2", "--distperf-trace",
                                "traces", str(pytester.path / "test_profiled.py"),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert any((sub / "traces").glob("*.trace.json"))
    assert not (pytester.path / "traces").exists()


def test_a_first_run_says_first_that_it_compared_nothing(pytester: pytest.Pytester) -> None:
    """No baselines yet: the loud line opens the terminal summary and the Markdown."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_first=(
        "import time\n\ndef test_m(nccl_group):\n"
        "    nccl_group.measure('m', time.sleep, 0.001, iters=3, warmup=0, control=False)\n"))
    result = pytester.runpytest("--distperf", "--gpus", "2", "--distperf-markdown", "s.md",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= distperf summary =*", "distperf: NOTHING WAS COMPARED: "
                                 "no baseline for this run's environment (gloo-cpu-w2-*) for "
                                 "any of its 1 test(s), so only thresholds gated this run; *"],
                                consecutive=True)
    md = (pytester.path / "s.md").read_text().splitlines()
    assert md[0] == "## distperf: nothing compared"
    assert md[2] == "> [!WARNING]"
    assert md[3].startswith("> **NOTHING WAS COMPARED: no baseline for this run's environment "
                            "(gloo-cpu-w2-") and md[3].endswith("and save under it**")


def test_the_json_report_of_a_run_with_nothing_measured_validates(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    path = tmp_path / "deep" / "r.json"
    jsonreport.write_json(path, [], header="distperf: 2 ranks")
    data = json.loads(path.read_text())
    jsonschema.validate(data, jsonreport.load_schema(), cls=jsonschema.Draft202012Validator)
    assert data["tests"] == [] and data["note"] == jsonreport.NOTHING_MEASURED


def test_a_figure_that_is_not_a_number_is_null_in_the_json(tmp_path: Path) -> None:
    record = TestRecord("t.py::test_a", 2, [Measurement("m", (Metric("x.time_s", math.nan, "s"),))])
    path = tmp_path / "r.json"
    jsonreport.write_json(path, [record], header="h")
    assert json.loads(path.read_text())["tests"][0]["metrics"][0]["value"] is None


CPU = Environment("gloo", "cpu", "AMD EPYC 7B13", 0, 2, "2.13.0+cpu", "", 2, 1)
SNAPSHOT_RECORDS = [
    TestRecord("tests/test_a.py::test_step", 2, [Measurement("ddp", (
        Metric("step_time_s", 0.0123, "s"), Metric("comm.all_reduce.calls", 4.0, "calls/step",
                                                   kind="exact")))],
        breaches=["imbalance = 0.250 exceeds max_imbalance = 0.100 (ranks involved: 1)\n"
                  "    suggestion: rebalance the per-rank batch"],
        verdicts=[Verdict("step_time_s", "unchanged", "gloo-cpu-w2", "s", False, 0.0121, 0.0123,
                          0.0165, 0.6, 0.1, host_change=0.02, control_slope=0.8),
                  Verdict("comm.all_reduce.calls", "regressed", "gloo-cpu-w2", "calls/step",
                          False, 2.0, 4.0, 1.0, None, 0.1, detail="exact: 2 -> 4",
                          explanation="smaller gradient buckets (bucket_cap_mb)?",
                          kind="exact")]),
    TestRecord("tests/test_b.py::test_bw", 2, [Measurement("bench", (
        Metric("all_reduce.16MiB.busbw_gbps", 2.5, "GB/s", True),))],
        verdicts=[Verdict("all_reduce.16MiB.busbw_gbps", "improved", "gloo-cpu-w2", "GB/s", True,
                          2.0, 2.5, 0.25, 0.999, 0.1, host_change=0.01, control_slope=0.5,
                          detail="confirmed by 3 measurements")]),
]
SNAPSHOT = """\
## distperf: 1 regressed, 1 threshold breach(es)

- 2 ranks, gloo on cpu (AMD EPYC 7B13, 2 cores, 1 thread(s) per rank), torch 2.13.0+cpu; \
baselines key `gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc-7b13`

2 test(s), 3 figure(s): 1 regressed, 1 improved, 1 unchanged.

| | test | metric | baseline | current | change | confidence |
| --- | --- | --- | --- | --- | --- | --- |
| **regressed** | `tests/test_a.py::test_step` | `comm.all_reduce.calls` | 2 calls/step | \
4 calls/step | +100.0% | - |
| improved | `tests/test_b.py::test_bw` | `all_reduce.16MiB.busbw_gbps` | 2 GB/s | 2.5 GB/s | \
+25.0% | 99.90% |

What changed with them:

- `comm.all_reduce.calls` in `tests/test_a.py::test_step`: exact: 2 -> 4; with it: smaller \
gradient buckets (bucket_cap_mb)?
- `all_reduce.16MiB.busbw_gbps` in `tests/test_b.py::test_bw`: confirmed by 3 measurements

Threshold breaches:

- `tests/test_a.py::test_step`: imbalance = 0.250 exceeds max\\_imbalance = 0.100 (ranks \
involved: 1) suggestion: rebalance the per-rank batch

<details><summary>Every figure</summary>

| test | metric | current | verdict |
| --- | --- | --- | --- |
| `tests/test_a.py::test_step` | `step_time_s` | 12.3 ms | unchanged |
| `tests/test_a.py::test_step` | `comm.all_reduce.calls` | 4 calls/step | regressed |
| `tests/test_b.py::test_bw` | `all_reduce.16MiB.busbw_gbps` | 2.5 GB/s | improved |

</details>

Artifacts: JSON report `out/report.json`; plots `out/plots`; \
[this run's artifacts](https://github.com/o/r/actions/runs/7#artifacts)

Legend:

- fails (regressed): a confirmed change for the worse larger than its tolerance (10%)
- compared: a time with the host-speed control (CPU ranks) by its samples' 25% quantile, the \
host's speed taken out
- exact: a count fails on any change past its exact tolerance (0 unless set)
- confidence: 1 - p of the one-sided Mann-Whitney test the verdict used
"""


def test_the_markdown_summary_snapshot() -> None:
    url = markdown.run_url({"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
                            "GITHUB_RUN_ID": "7"})
    text = markdown.markdown_summary(
        SNAPSHOT_RECORDS, header="distperf: 2 ranks", environments=[CPU],
        artifacts=[("JSON report", "out/report.json"), ("plots", "out/plots")], url=url)
    assert text == SNAPSHOT
    assert markdown.run_url({}) == ""
    empty = markdown.markdown_summary([], header="distperf: 2 ranks, backend gloo")
    assert empty == ("## distperf: no regression\n\n- 2 ranks, backend gloo\n\n"
                     "No test recorded a distperf metric in this run.\n")


def test_the_markdown_summary_says_ranks_share_a_gpu_and_whose_bandwidth_it_is() -> None:
    gloo = Environment("gloo", "cuda", "NVIDIA H200", 1, 2, "2.13.0+cu130", "",
                       driver_version="580.1", cuda_version="13.0", ranks_per_gpu=2)
    text = markdown.markdown_summary([], header="h", environments=[gloo])
    assert ("- 2 ranks, gloo on cuda (1 x NVIDIA H200, 2 ranks per GPU), torch 2.13.0+cu130; "
            "baselines key `gloo-cuda-w2-2pergpu-torch2.13.0-cuda13.0-driver580.1-nvidia-h200`\n"
            "  (gloo copies GPU tensors through host memory: its communication figures (bench's "
            "busbw, a step's communication) are gloo's, not NVLink's or PCIe's)\n") in text
    nccl = dataclasses.replace(gloo, backend="nccl", nccl_version="2.30.1")
    text = markdown.markdown_summary([], header="h", environments=[nccl])
    assert "(1 x NVIDIA H200, 2 ranks per GPU), torch 2.13.0+cu130, NCCL 2.30.1;" in text
    assert "host memory" not in text


def test_the_terminal_summary_puts_regressions_first_and_colours_them() -> None:
    lines = report.summary(SNAPSHOT_RECORDS)
    heads = [line for line in lines if " ranks] " in line.text]
    assert [h.text for h in heads] == ["tests/test_a.py::test_step [2 ranks] BREACH, REGRESSED",
                                       "tests/test_b.py::test_bw [2 ranks] ok"]
    assert heads[0].markup == {"red": True, "bold": True}
    rows = [line for line in lines if line.text.startswith("    ") and "calls" in line.text]
    assert rows[0].text.split() == ["comm.all_reduce.calls", "4", "calls/step", "2",
                                    "calls/step", "+100.0%", "regressed"]
    assert rows[0].colour == "red"
    improved = next(line for line in lines if line.text.startswith("  IMPROVED"))
    assert improved.colour == "green"
    assert report.Line("plain").markup == {}


KEY = "gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc"


def _verdicts(*kinds: str) -> list[TestRecord]:
    """One test per verdict kind, each with one metric."""
    return [TestRecord(f"t.py::test_{i}", 2, verdicts=[Verdict("m", kind, KEY, "s")])
            for i, kind in enumerate(kinds)]


@pytest.mark.parametrize(("kinds", "loud"), [
    (("no baseline", "no baseline"), True),           # the first run on this runner
    (("not comparable",), True),                      # the key went dark: a torch upgrade
    (("no baseline", "not comparable"), True),
    (("no baseline", "unchanged"), False),            # a new test beside compared ones
    (("not comparable", "inconclusive"), False),
    (("informational",), False),                      # compared, shown, never a failure
    (("saved", "saved"), False),                      # a save compares nothing by design
    ((), False),                                      # nothing measured: said otherwise
])
def test_a_run_that_compared_nothing_says_so_first(kinds: tuple[str, ...], loud: bool) -> None:
    records = _verdicts(*kinds)
    line = report.nothing_compared_line(records)
    terminal = report.summary(records)
    md = markdown.markdown_summary(records, header="distperf: 2 ranks").splitlines()
    if not loud:
        assert line == "" and "nothing compared" not in md[0]
        assert all("NOTHING WAS COMPARED" not in t.text for t in terminal)
        return
    assert line.startswith("distperf: NOTHING WAS COMPARED: no baseline for this run's "
                           f"environment ({KEY}) for any of its {len(kinds)} test(s)")
    assert "--distperf-save" in line and "--distperf-env-name NAME" in line
    assert terminal[0] == report.Line(line, "yellow", bold=True)
    assert md[0].startswith("## distperf: nothing compared")
    assert md[2:4] == ["> [!WARNING]", f"> **{line.removeprefix('distperf: ')}**"]


def _verdict(verdict: str, unit: str = "s", **fields: object) -> Verdict:
    return dataclasses.replace(Verdict("m", verdict, KEY, unit, False, 1.0, 1.2, 0.2,
                                       tolerance=0.1), **fields)


@pytest.mark.parametrize(("verdicts", "words"), [
    # a plain time, unchanged: what fails, and by which statistic
    ([_verdict("unchanged")],
     ["fails (regressed): a confirmed change for the worse larger than its tolerance (10%)",
      "compared: a time by the 5% quantile of its samples (a rate: the 95%)"]),
    # with the control, regressed, with a confidence; two tolerances in one run
    ([_verdict("regressed", host_change=0.02, confidence=0.999),
      dataclasses.replace(_verdict("unchanged"), tolerance=0.2)],
     ["fails (regressed): a confirmed change for the worse larger than its tolerance "
      "(10%, 20%)",
      "compared: a time by the 5% quantile of its samples (a rate: the 95%); a time with the "
      "host-speed control (CPU ranks) by its samples' 25% quantile, the host's speed taken out",
      "confidence: 1 - p of the one-sided Mann-Whitney test the verdict used"]),
    # a fraction, inconclusive
    ([_verdict("inconclusive", "fraction")],
     ["fails (regressed): a confirmed change for the worse larger than its tolerance (10%)",
      "compared: a fraction by its value, and by 0.05 pt at least",
      "pt: percentage points, the change of a fraction (0..1)",
      "inconclusive: a change past the tolerance that the run could not confirm; passes, "
      "fails under --distperf-strict"]),
    # exact and informational only (a profile's counts and fractions): nothing measured fails
    ([_verdict("regressed", "calls", kind="exact"),
      _verdict("informational", "fraction", kind="informational")],
     ["exact: a count fails on any change past its exact tolerance (0 unless set)",
      "pt: percentage points, the change of a fraction (0..1)",
      "informational: compared and shown, never a failure"]),
    # nothing compared with a baseline: no legend
    ([_verdict("saved"), Verdict("m", "no baseline", KEY), Verdict("m", "not comparable", KEY)],
     []),
])
def test_the_legend_explains_what_the_summary_shows(verdicts: list[Verdict],
                                                    words: list[str]) -> None:
    assert report.legend(verdicts) == words
    records = [TestRecord("t.py::test_a", 2, verdicts=verdicts)]
    lines = [line.text for line in report.summary(records)]
    md = markdown.markdown_summary(records, header="distperf: 2 ranks")
    if not words:
        assert "legend:" not in lines and "Legend:" not in md
        return
    # the terminal summary ends with it, the Markdown too; -q leaves it out
    assert lines[-len(words) - 1:] == ["legend:", *(f"  {w}" for w in words)]
    assert md.endswith("Legend:\n\n" + "".join(
        f"- {markdown._escape(w)}\n" for w in words))
    assert "legend:" not in [line.text for line in report.summary(records, quiet=True)]


def test_the_legend_gives_the_figures_of_the_rule() -> None:
    """The report cannot import the verdict's constants (its room's rule): its words are
    checked against them here."""
    from pytest_distperf.verdict import readings, stats

    text = " ".join(report.legend([_verdict("unchanged"), _verdict("unchanged", "fraction"),
                                   _verdict("unchanged", host_change=0.0)]))
    assert f"the {stats._ESTIMATOR_QUANTILE:.0%} quantile" in text
    assert f"the {1 - stats._ESTIMATOR_QUANTILE:.0%}" in text
    assert f"{readings._CONTROL_ESTIMATOR_QUANTILE:.0%} quantile" in text
    assert f"{stats.min_abs_delta('fraction') * 100:g} pt at least" in text


def _row(lines: list[report.Line], name: str) -> list[str]:
    return next(line.text.split() for line in lines if line.text.split()[:1] == [name])


def test_every_output_shows_the_figure_the_verdict_judged(tmp_path: Path) -> None:
    """A row's figure, its baseline and its change come from one estimator: the test's own
    first measurement (raw, 428 ms and 518.8 ms here) is not the figure shown beside a
    pooled, host-corrected baseline; a save shows what it stored, in its table and on its
    SAVED line alike."""
    compared = TestRecord("t.py::test_a", 2, [Measurement("ddp", (
        Metric("step_time_s", 0.428, "s"), Metric("throughput", 37.38, "samples/s", True)))],
        verdicts=[Verdict("step_time_s", "unchanged", "e", "s", False, 0.3916, 0.38416,
                          -0.019, 0.3),
                  Verdict("throughput", "informational", "e", "samples/s", True, 42.57, 43.46,
                          0.021, None)])
    saved = TestRecord("t.py::test_b", 2, [Measurement("ddp", (
        Metric("step_time_s", 0.5188, "s"),))],
        verdicts=[Verdict("step_time_s", "saved", "e", "s", False, current=0.3916)])
    lines = report.summary([compared, saved])
    assert _row(lines[:4], "step_time_s") == ["step_time_s", "384.2", "ms", "391.6", "ms",
                                              "-1.9%", "unchanged"]
    assert _row(lines, "throughput")[1:2] == ["43.46"]
    header = next(line.text.split() for line in lines if line.text.split()[:1] == ["metric"])
    assert header == ["metric", "current", "baseline", "change", "verdict"]
    saved_rows = [line.text.split() for line in lines if "391.6" in line.text]
    assert ["step_time_s", "391.6", "ms", "-", "-", "saved"] in saved_rows  # its table
    assert any(r[:4] == ["SAVED", "t.py::test_b", "step_time_s", "391.6"] for r in saved_rows)
    assert "428" not in "\n".join(line.text for line in lines)
    assert "518.8" not in "\n".join(line.text for line in lines)
    text = markdown.markdown_summary([compared, saved], header="h")
    assert "| `t.py::test_a` | `step_time_s` | 384.2 ms | unchanged |" in text
    assert "| `t.py::test_b` | `step_time_s` | 391.6 ms | saved |" in text
    assert ("distperf.step_time_s", "384.2 ms") in report.junit_properties(compared)
    path = tmp_path / "r.json"
    jsonreport.write_json(path, [compared], header="h", environments=[CPU])
    data = json.loads(path.read_text())
    (test,) = data["tests"]
    assert test["verdicts"][0]["current"] == 0.38416  # what the outputs show
    assert test["metrics"][0]["value"] == 0.428  # raw, and the schema says so
    # the environment's key is the one its baselines live under and its verdicts name
    assert data["environments"][0]["key"] == "gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc-7b13"


def test_the_steps_plot_shows_the_exposed_communication_its_title_gives() -> None:
    from pytest_distperf.analysis.analyzer import analyze_steps
    from pytest_distperf.records import RankStep

    pytest.importorskip("matplotlib")
    jitter = (1.0, 1.3, 0.9, 1.2, 1.05, 0.95, 1.4, 1.0)

    def rank(r: int, step: float, no_sync: float) -> RankStep:
        steps = tuple(step * j for j in jitter)
        return RankStep(r, 8, steps, steps, steps, steps,
                        tuple(no_sync * j for j in reversed(jitter)))

    timing = analyze_steps([rank(0, 0.50, 0.44), rank(1, 0.52, 0.40)])
    (ax,) = plots.steps_figure(TestRecord("t.py::test_a", 2), timing).axes
    exposed = timing.comm_overhead * timing.step_time_s
    bars = [bar.get_height() for bar in ax.containers[1]]  # compute, exposed, wait
    assert bars == pytest.approx([exposed * 1e3] * 2)
    assert f"{timing.comm_overhead:.0%} ({report.format_value(exposed, 's')})" in ax.get_title()


def test_plots_without_matplotlib_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plots.PlotError, match=r"pip install 'pytest-distperf\[plot\]'"):
        plots.require_matplotlib()


def test_exports_refuse_an_unknown_format() -> None:
    with pytest.raises(ConfigError, match=r"unknown format 'xml' \(from the ini\); choose bmf"):
        export.parse_format("xml", "the ini")
    assert export.parse_format(" GAB ", "x") == "gab"
    assert export.bigger_path(Path("a/gab.json")) == Path("a/gab.bigger.json")


def test_records_become_plain_data() -> None:
    """A str subclass (torch's TorchVersion in the rank info) becomes a plain str: execnet,
    which carries xdist workers' records, refuses anything else."""
    from pytest_distperf.records import Environment, to_dict

    class Version(str):
        pass

    env = Environment("gloo", "cpu", "cpu", 0, 2, Version("2.13.0+cpu"), "")
    data = to_dict(env)
    assert data["torch_version"] == "2.13.0+cpu" and type(data["torch_version"]) is str


def test_the_schema_lists_every_field_of_every_record_and_no_other() -> None:
    """Each object of the report is a record dataclass (or the test entry and the result
    entry of record_to_dict): the schema requires every field it writes and refuses any
    other, so a field added to a record and not to the schema fails here, not in a user's
    validation."""
    import dataclasses
    import typing

    from pytest_distperf import records
    from pytest_distperf.fixtures import results
    from pytest_distperf.fixtures.results.findings import Bottleneck
    from pytest_distperf.fixtures.results.steps import CommCount, DeviceFigures

    schema = jsonreport.load_schema()
    defs = schema["$defs"]
    names = {records.Environment: "environment", records.Metric: "metric",
             records.Verdict: "verdict", Bottleneck: "bottleneck",
             CommCount: "comm_count", DeviceFigures: "device_figures",
             records.Measured: "measured"}
    seen: set[str] = set()
    todo: list[type] = [records.Environment, records.Metric, records.Verdict,
                        *results.RESULT_TYPES.values()]
    while todo:
        cls = todo.pop()
        name = names.get(cls, cls.__name__)
        if name in seen:
            continue
        seen.add(name)
        fields = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("transient")]
        if cls is records.Environment:
            fields.insert(0, "key")
        spec = defs[name]
        assert list(spec["properties"]) == fields, name
        assert spec["required"] == fields and spec["additionalProperties"] is False, name
        hints = typing.get_type_hints(cls)
        todo += [t for f in dataclasses.fields(cls) for t in _dataclasses_in(hints[f.name])]
    assert {k for k, v in defs.items() if v.get("type") == "object"} == seen | {"test", "result"}
    entry = results.record_to_dict(SNAPSHOT_RECORDS[0])
    for name, data in (("test", entry), ("result", entry["results"][0])):
        assert defs[name]["required"] == list(data) == list(defs[name]["properties"])
        assert defs[name]["additionalProperties"] is False
    document = jsonreport.document(SNAPSHOT_RECORDS, header="h", environments=[CPU])
    assert set(document) <= set(schema["properties"]) and schema["additionalProperties"] is False


def _dataclasses_in(tp: object) -> list[type]:
    import dataclasses
    import typing

    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return [tp]
    return [d for arg in typing.get_args(tp) for d in _dataclasses_in(arg)]


def test_the_schema_refuses_a_field_it_does_not_know() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    document = jsonreport.document(SNAPSHOT_RECORDS, header="h", environments=[CPU])
    schema = jsonreport.load_schema()
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
    document["tests"][0]["metrics"][0]["surprise"] = 1
    with pytest.raises(jsonschema.ValidationError, match="surprise"):
        jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
