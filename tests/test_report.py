"""The session summary's wording (report.py), and when and where the JSON report is written."""

from __future__ import annotations

import json

import pytest

from pytest_distperf import report
from pytest_distperf.records import TestRecord, Verdict


def test_no_baseline_is_one_line_per_test() -> None:
    why = "no baseline file for this test module yet: run with --distperf-save to create it"
    a = TestRecord("t.py::test_a", 4, verdicts=[
        Verdict(name, "no baseline", "gloo-cpu-w4", detail=why) for name in ("x", "y", "z")])
    b = TestRecord("t.py::test_b", 2, verdicts=[
        Verdict("only", "no baseline", "gloo-cpu-w2", detail=why),
        Verdict("slow", "regressed", "gloo-cpu-w2", "s", False, 1.0, 2.0, 1.0, 0.999)])
    lines = report.verdict_summary_lines([a, b])
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
    result = pytester.runpytest_subprocess("--distperf", "--distperf-json", "out.json",
                                           str(pytester.path / "test_plain.py"),
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    data = json.loads((sub / "out.json").read_text())
    assert data["tests"] == [] and "no test recorded a distperf metric" in data["note"]
    assert not (pytester.path / "out.json").exists()
    result.stdout.fnmatch_lines([f"distperf: JSON report written to {sub / 'out.json'}"])
