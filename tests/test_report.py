"""The session summary's wording (pure: report.py)."""

from __future__ import annotations

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
