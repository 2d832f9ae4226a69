"""The ``dist_profiler`` fixture end to end: real pytest runs with two real gloo ranks; and the
fixture object's bookkeeping (trace file, metric names, desync, re-measurement) on traces
handed to it by a stand-in group."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.analysis.traces import REGION_NAME, DesyncError
from pytest_distperf.fixtures.profiler import DistProfiler
from pytest_distperf.fixtures.results.profile import ProfileReport
from pytest_distperf.rank.profile import profile_on_rank
from pytest_distperf.records import Metric, RankTrace

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

BASE = ("-p", "no:cacheprovider", "--distperf", "--gpus", "2")

# One generated module, one pytest run, one pool: the trace layout, the report's structure, a
# second profile and a one-rank subgroup, and a straggler that fails the test's verdict.
PROFILE_TESTS = r'''
import json, os, time
from pathlib import Path
import pytest
import torch
import torch.distributed as dist

TRACE_DIR = Path(os.environ["DISTPERF_TRACE_DIR"])
LENIENT = pytest.mark.distperf(max_comm_overhead=1.5, max_imbalance=1e6)

def step():
    t = torch.ones(1 << 14)
    x = torch.randn(128, 128)
    dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    for _ in range(4):
        x = (x @ x).tanh()
    work.wait()
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    return dist.get_rank()

@LENIENT
def test_profile_structure(dist_profiler):
    report = dist_profiler(step)
    assert report.results == (0, 1)
    assert report.desync == "" and report.world_size == 2
    assert report.comm_source == "c10d ops"
    path = Path(report.trace_path)
    assert path.parent == TRACE_DIR and path.is_file()
    events = json.loads(path.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    assert sorted(e["args"]["name"] for e in events
                  if e["ph"] == "M" and e["name"] == "process_name") == ["rank 0", "rank 1"]
    assert {e["pid"] for e in events if e.get("name") == "gloo:all_reduce"} == {0, 1}
    all_reduce = report.collective("all_reduce")
    assert (all_reduce.count, all_reduce.bytes) == (3, 3 * 4 * (1 << 14))
    assert report.collective("broadcast").count == 1
    assert 0.0 <= report.overlap <= 1.0 and 0.0 <= report.comm_overhead <= 1.0
    assert (report.overlap_in_trace, report.comm_overhead_in_trace) == (
        report.overlap, report.comm_overhead)
    assert [p.rank for p in report.per_rank] == [0, 1]
    assert all(p.collectives == 4 for p in report.per_rank)

@LENIENT
def test_second_profile_and_one_rank(dist_profiler):
    dist_profiler.warmup = 0
    dist_profiler(step)
    one = dist_profiler(lambda: dist.get_world_size(), world_size=1)
    assert one.results == (1,) and one.world_size == 1 and one.collectives == ()
    assert one.trace_path.endswith(".2.trace.json")

@pytest.mark.distperf(max_comm_overhead=1.5)
def test_straggler_fails_the_verdict(dist_profiler):
    def uneven():
        t = torch.ones(16)
        for _ in range(3):
            time.sleep(0.2 if dist.get_rank() == 1 else 0.05)
            dist.all_reduce(t)
    dist_profiler.warmup = 0
    report = dist_profiler(uneven)
    assert report.stragglers == (1,)
    imbalance = next(b for b in report.bottlenecks if b.kind == "imbalance")
    assert imbalance.ranks == (1,)
    assert report.batch_shares[0] > report.batch_shares[1]

@LENIENT
def test_setup_and_steps(dist_profiler):
    def build():  # DDP broadcasts the parameters here: that must not be in the profile
        return torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    def train_step(ddp):
        time.sleep(0.12 if dist.get_rank() == 1 else 0.03)  # rank 1: 4x the work, every step
        ddp(torch.randn(8, 64)).sum().backward()
        return dist.get_rank()
    # the default warm-up covers DDP's bucket rebuild (two small broadcasts in its step 2)
    report = dist_profiler(train_step, setup=build, steps=3)
    assert report.results == (0, 1)
    assert report.collective("broadcast") is None
    assert report.collective("all_reduce").count == 3  # one gradient bucket per step
    assert [s.index for s in report.steps] == [0, 1, 2]
    assert [s.slowest_rank for s in report.steps] == [1, 1, 1]
    assert report.persistent_straggler() == (1, 1.0)
    assert report.latest_arrival() == (1, 1.0)  # rank 1 came last to every all-reduce
    assert all(t.waits_s[0] >= 0.05 for t in report.timings)  # rank 0 waited ~90 ms each time
    assert all(s.compute_time_s[1] > 2 * s.compute_time_s[0] for s in report.steps)
    assert all(s.wall_time_s >= 0.12 for s in report.steps)
    events = json.loads(Path(report.trace_path).read_text())["traceEvents"]
    steps = sorted((e["pid"], e["name"]) for e in events
                   if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == [(r, f"ProfilerStep#{i}") for r in (0, 1) for i in range(3)]

@pytest.mark.distperf(max_comm_overhead=1.5, max_imbalance=1e6, max_arrival_skew=0.1)
def test_a_late_rank_breaches_max_arrival_skew(dist_profiler):
    def late():  # rank 1 reaches every all-reduce ~90 ms after rank 0, in a ~130 ms step
        time.sleep(0.12 if dist.get_rank() == 1 else 0.03)
        dist.all_reduce(torch.ones(16))
    dist_profiler.warmup = 0
    report = dist_profiler(late, steps=3)
    assert report.latest_arrival()[0] == 1
'''

DEFAULT_DIR_TEST = r'''
from pathlib import Path
import pytest
import torch
import torch.distributed as dist

@pytest.mark.distperf(max_comm_overhead=1.5, max_imbalance=1e6)
def test_trace_in_tmp_path(dist_profiler, tmp_path):
    dist_profiler.warmup = 0
    report = dist_profiler(lambda: dist.all_reduce(torch.ones(4)))
    assert Path(report.trace_path).parent == tmp_path and Path(report.trace_path).is_file()
'''


def test_dist_profiler_end_to_end(pytester: pytest.Pytester, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trace_dir = tmp_path / "traces"
    report_json = tmp_path / "report.json"
    monkeypatch.setenv("DISTPERF_TRACE_DIR", str(trace_dir))
    pytester.makepyfile(test_profiled=PROFILE_TESTS)
    result = pytester.runpytest(*BASE, "--distperf-trace", str(trace_dir),
                                "--distperf-json", str(report_json))
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(["*test_straggler_fails_the_verdict*",
                                 "*profile.imbalance*max_imbalance*"])
    failure = result.stdout.str().split("test_straggler_fails_the_verdict", 1)[1]
    assert "ranks involved: 1" in failure or "rank 1" in failure
    # the failures show what the ranks printed, without the profiler's own notices
    result.stdout.fnmatch_lines(["*Captured stdout call*", "distperf: merged trace of 2 *"])
    assert "SyncActivityProfilerHandler" not in result.stdout.str()
    # off by default (test_setup_and_steps has a rank 90 ms late too, and passes); set, a
    # breach names the rank that arrived last
    result.stdout.fnmatch_lines([
        "*test_a_late_rank_breaches_max_arrival_skew*",
        "*profile.arrival_skew = 0.* exceeds max_arrival_skew = 0.100 (ranks involved: 1)",
        "*suggestion: rank 1 arrived last at *% of the collectives and the others waited*"])

    files = sorted(p.name for p in trace_dir.iterdir() if p.is_file())
    assert files == ["test_profiled.py__test_a_late_rank_breaches_max_arrival_skew.trace.json",
                     "test_profiled.py__test_profile_structure.trace.json",
                     "test_profiled.py__test_second_profile_and_one_rank.2.trace.json",
                     "test_profiled.py__test_second_profile_and_one_rank.trace.json",
                     "test_profiled.py__test_setup_and_steps.trace.json",
                     "test_profiled.py__test_straggler_fails_the_verdict.trace.json"]

    tests = {t["nodeid"].split("::")[-1]: t for t in json.loads(report_json.read_text())["tests"]}
    second = tests["test_second_profile_and_one_rank"]
    metrics = {m["name"]: m for m in second["metrics"]}
    assert {"profile.comm_overhead", "profile.imbalance", "profile.overlap",
            "profile2.comm_overhead", "profile2.imbalance"} <= set(metrics)
    assert "profile2.overlap" not in metrics  # one rank: nothing communicated
    assert metrics["profile2.imbalance"]["world_size"] == 1
    stored = second["results"][0]["result"]
    assert stored["trace_path"].endswith(".trace.json") and "results" not in stored
    straggler = {m["name"]: m for m in tests["test_straggler_fails_the_verdict"]["metrics"]}
    assert straggler["profile.imbalance"]["ranks"] == [1]
    stepped = {m["name"]: m for m in tests["test_setup_and_steps"]["metrics"]}
    assert len(stepped["profile.step_time_s"]["samples"]) == 3
    assert stepped["profile.step_time_s"]["kind"] == "informational"
    steps = tests["test_setup_and_steps"]["results"][0]["result"]["steps"]
    assert [s["slowest_rank"] for s in steps] == [1, 1, 1]


def test_default_trace_dir_is_the_tests_tmp_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_default_dir=DEFAULT_DIR_TEST)
    # one rank is enough here, and cheaper to start
    result = pytester.runpytest("-p", "no:cacheprovider", "--distperf", "--gpus", "1")
    result.assert_outcomes(passed=1)


# -- the fixture object, fed hand-made traces by a stand-in group --------------------------------
def _trace(rank: int, comms: Sequence[str]) -> dict[str, Any]:
    """A minimal gloo-shaped trace: one c10d call and its gloo run per collective."""
    ev: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": REGION_NAME,
                                 "pid": 10, "tid": 10, "ts": 0, "dur": 1000, "args": {}}]
    for i, name in enumerate(comms):
        ts = 100 + 200 * i
        ev.append({"ph": "X", "cat": "cpu_op", "name": f"c10d::{name.replace('_', '')}_",
                   "pid": 10, "tid": 10, "ts": ts, "dur": 5,
                   "args": {"Input Dims": [[[256]]], "Input type": ["TensorList"]}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"gloo:{name}", "pid": 10,
                   "tid": 11, "ts": ts + 2, "dur": 50,
                   "args": {"Input Dims": [[256]], "Input type": ["float"]}})
    return {"baseTimeNanoseconds": 10**18, "traceEvents": ev,
            "distributedInfo": {"rank": rank, "world_size": 2}}


class StandInGroup:
    """Answers ``call`` with prepared traces, as the ranks would; keeps what is recorded."""

    world_size = 2

    def __init__(self, *per_rank: Sequence[str]) -> None:
        self.per_rank = per_rank
        self.calls: list[tuple[Any, str, int | None]] = []
        self.recorded: list[tuple[str, list[Metric], Any, Callable[[], Any] | None]] = []

    def call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], label: str,
             world_size: int | None = None) -> list[Any]:
        self.calls.append((fn, label, world_size))
        size = world_size or self.world_size
        return [RankTrace(zlib.compress(json.dumps(_trace(r, self.per_rank[r])).encode()),
                          r * 10) for r in range(size)]

    def record(self, label: str, metrics: Sequence[Metric], result: Any = None,
               remeasure: Callable[[], Any] | None = None) -> None:
        self.recorded.append((label, list(metrics), result, remeasure))


def _profiler(group: StandInGroup, tmp_path: Path) -> DistProfiler:
    return DistProfiler(group, trace_dir=tmp_path, nodeid="t.py::test_x",  # type: ignore[arg-type]
                        limits={"max_comm_overhead": 0.3, "max_imbalance": 0.1})


def test_profiler_writes_records_and_remeasures(tmp_path: Path) -> None:
    group = StandInGroup(["all_reduce", "broadcast"], ["all_reduce", "broadcast"])
    profiler = _profiler(group, tmp_path)
    report = profiler(lambda: None)
    assert isinstance(report, ProfileReport) and report.results == (0, 10)
    fn, label, size = group.calls[0]
    assert fn is profile_on_rank and label.startswith("dist_profiler(") and size == 2
    assert Path(report.trace_path) == tmp_path / "t.py__test_x.trace.json"
    merged = json.loads(Path(report.trace_path).read_text())
    assert {e["pid"] for e in merged["traceEvents"]} == {0, 1}
    label, metrics, result, remeasure = group.recorded[0]
    assert result is report
    assert [(m.name, m.kind) for m in metrics] == [
        ("profile.comm_overhead", "informational"), ("profile.imbalance", "informational"),
        ("profile.overlap", "informational"), ("profile.arrival_skew_s", "informational"),
        ("profile.arrival_skew", "informational"),
        ("profile.comm.all_reduce.calls", "exact"), ("profile.comm.all_reduce.bytes", "exact"),
        ("profile.comm.broadcast.calls", "exact"), ("profile.comm.broadcast.bytes", "exact")]
    skew = metrics[4]
    assert skew.threshold == "max_arrival_skew" and skew.unit == "fraction"
    assert 0 <= skew.value <= 1 and len(skew.samples) == 2  # one per collective
    # one call of each, 256 float32 elements each
    assert [m.value for m in metrics[5:]] == [1, 1024, 1, 1024]
    assert remeasure is not None
    assert [m.name for m in remeasure()] == [m.name for m in metrics]
    assert len([p for p in tmp_path.iterdir() if p.is_file()]) == 1  # re-measuring writes no trace

    second = profiler(lambda: None, world_size=1)
    label2, metrics2, _, _ = group.recorded[-1]
    assert label2.startswith("dist_profiler#2(") and group.calls[-1][2] == 1
    assert {m.name for m in metrics2 if m.kind == "informational"} == {
        "profile2.comm_overhead", "profile2.imbalance", "profile2.overlap"}  # one rank: no skew
    assert all(m.world_size == 1 for m in metrics2)
    assert second.trace_path.endswith("t.py__test_x.2.trace.json")


def test_profiler_raises_on_desync_and_records_nothing_to_judge(tmp_path: Path) -> None:
    group = StandInGroup(["all_reduce", "broadcast"], ["all_reduce", "all_gather"])
    profiler = _profiler(group, tmp_path)
    with pytest.raises(DesyncError, match=r"collective #2.*broadcast.*all_gather") as info:
        profiler(lambda: None)
    assert "merged trace:" in str(info.value)
    assert info.value.report is not None and info.value.report.desync
    assert group.recorded[-1][1] == []  # shown in the report, never judged

    profiler.check_desync = False
    report = profiler(lambda: None)
    assert report.desync and group.recorded[-1][1] == []


@pytest.mark.parametrize(("setting", "value", "error"), [
    ("warmup", -1, ValueError), ("warmup", 1.5, ValueError),
])
def test_profiler_rejects_bad_settings(tmp_path: Path, setting: str, value: Any,
                                       error: type[Exception]) -> None:
    profiler = _profiler(StandInGroup([], []), tmp_path)
    setattr(profiler, setting, value)
    with pytest.raises(error, match=setting):
        profiler(lambda: None)
    with pytest.raises(TypeError, match="callable"):
        _profiler(StandInGroup([], []), tmp_path)(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="steps"):
        _profiler(StandInGroup([], []), tmp_path)(lambda: None, steps=0)
    with pytest.raises(TypeError, match="setup must be a callable"):
        _profiler(StandInGroup([], []), tmp_path)(lambda: None, setup=42)  # type: ignore[arg-type]


def test_an_unwritable_trace_folder_says_which_file_and_option(tmp_path: Path) -> None:
    from pytest_distperf.fixtures.profiler import write_trace

    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    with pytest.raises(OSError, match=r"dist_profiler: cannot write the merged trace .*a_file/"
                                      r"t.trace.json .*--distperf-trace"):
        write_trace(blocked / "t.trace.json", {"traceEvents": []})


def _real_cpu_trace(tmp_path: Path) -> dict[str, Any]:
    """A trace as torch.profiler exports it for a little CPU work (no process group)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("ProfilerStep#0"):
        torch.randn(64, 64) @ torch.randn(64, 64)
    prof.export_chrome_trace(str(tmp_path / "raw.json"))
    trace: dict[str, Any] = json.loads((tmp_path / "raw.json").read_text())
    return trace


def test_each_ranks_trace_says_its_rank_as_hta_reads_it(tmp_path: Path) -> None:
    from pytest_distperf.fixtures.profiler import rank_trace_dir, write_traces

    trace = _real_cpu_trace(tmp_path)
    trace["distributedInfo"] = {"backend": "gloo", "rank": 0, "world_size": 2}
    other = {**trace, "distributedInfo": {"backend": "gloo", "rank": 1, "world_size": 2}}
    merged = write_traces(tmp_path / "t.trace.json", [trace, other])
    # Holistic Trace Analysis takes the first match of this pattern as the file's rank
    hta_rank = re.compile(r'"rank":\s+(\d+)')
    for rank in (0, 1):
        text = (rank_trace_dir(merged) / f"rank{rank}.trace.json").read_text()
        found = hta_rank.search(text)
        assert found is not None and int(found.group(1)) == rank


def test_hta_loads_every_ranks_trace(tmp_path: Path) -> None:
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    from pytest_distperf.fixtures.profiler import rank_trace_dir, write_traces

    trace = _real_cpu_trace(tmp_path)
    merged = write_traces(tmp_path / "t.trace.json", [trace, trace])
    analysis = TraceAnalysis(trace_dir=str(rank_trace_dir(merged)))
    assert sorted(analysis.t.traces) == [0, 1]
    assert all(len(df) > 0 for df in analysis.t.traces.values())
