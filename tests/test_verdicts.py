"""Baselines end to end: pytest runs of their own, real gloo ranks, real files.

Timing verdicts here use effects no noise can hide (a sleep made 3x longer or 0.4x as long);
the statistics themselves are unit-tested in test_baseline.py and measured on this machine by
benchmarks/verdict_quality.py.
"""

from __future__ import annotations

import collections
import json
import re
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest
import tomli_w
from quick_runs import NO_DYNAMO, pytest_here

from pytest_distperf import verdict as bl
from pytest_distperf.config import DEFAULT_SAVE_MEASUREMENTS
from pytest_distperf.verdict import judgement, rule
from pytest_distperf.verdict.storefile import flat_metrics

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

RUN = ("--distperf", "--gpus", "2", "-p", "no:cacheprovider", "-rA")
#: A save of three measurements of a metric with the control: these tests' saves are there
#: for what they test, with effects (3x, 2x) that three measurements tell;
#: test_a_save_takes_twelve_measurements_by_default checks the default.
SAVE_MEASUREMENTS = 3
SAVE = ("--distperf-save", f"--distperf-save-measurements={SAVE_MEASUREMENTS}")

NAPS = textwrap.dedent("""
    import os
    import time


    def nap(seconds):
        time.sleep(seconds)


    def scale(name):
        return float(os.environ.get("NAP_" + name.upper(), "1"))


    def test_slowed(nccl_group):
        nccl_group.measure("slowed", nap, 0.02 * scale("slowed"), iters=10, warmup=1)


    def test_faster(nccl_group):
        nccl_group.measure("faster", nap, 0.02 * scale("faster"), iters=10, warmup=1)


    def test_same(nccl_group):
        nccl_group.measure("same", nap, 0.02, iters=10, warmup=1)


    def test_murky(nccl_group):
        nccl_group.measure("murky", nap, 0.02, iters=10, warmup=1)
""")

#: Why test_murky is inconclusive: its baseline is not statistically clear (with the
#: figures a user reads), or, with a busy neighbour, its measurements are too noisy.
MURKY = r"(not statistically clear; rerun to tell. Mann-Whitney p = |too noisy to tell)"


def _make_murky(path: Path) -> None:
    """Rewrite test_murky's stored samples: a fast estimate, yet most samples far slower, so
    that a normal run is past the line but not statistically clear: inconclusive.  The
    stored control goes: such a baseline is judged by the plain rule."""
    data = tomllib.loads(path.read_text())
    (entry,) = data["tests"]["test_murky"].values()
    entry["metrics"]["murky.time_s"]["value"] = 1.0
    # no host-speed control: the plain rule (a save that kept one measurement lists no sizes)
    entry["samples"]["murky.time_s"] = {"values": [0.005] * 5 + [1.0] * 15}
    path.write_text(tomli_w.dumps(data))


def test_save_then_compare_regression_improvement_mismatch_strict(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_naps=NAPS)
    stored = pytester.path / "perf_baselines" / "test_naps.toml"

    # 1. save: every metric is written, once, under this environment
    result = pytester.runpytest(*RUN, *SAVE)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*distperf verdicts (per metric): 4 saved*"])
    data = tomllib.loads(stored.read_text())
    assert data["schema_version"] == bl.SCHEMA_VERSION
    (env_id,) = data["environments"]
    assert re.match(r"gloo-cpu-w2-c\d+t\d+-torch", env_id)  # cores and threads per rank
    assert sorted(data["tests"]) == ["test_faster", "test_murky", "test_same", "test_slowed"]
    same = (flat_metrics(data, "test_same", env_id) or {})["same.time_s"]
    # the save's quiet measurements pooled (as many as asked for, more where some were
    # noisy, fewer where the noise probe dropped some), each sample with its control
    sizes = same.get("measurements", [10])
    assert len(same["samples"]) == len(same["control"]) == len(same["memory_control"]) \
        == sum(sizes)
    assert set(sizes) == {10} and 1 <= len(sizes) <= max(
        SAVE_MEASUREMENTS, judgement._SAVE_MAX_MEASUREMENTS)
    _make_murky(stored)
    saved = stored.read_bytes()

    # 2. compare: 3x slower fails with a table; 0.4x is reported as improved; same passes
    monkeypatch.setenv("NAP_SLOWED", "3")
    monkeypatch.setenv("NAP_FASTER", "0.4")
    result = pytester.runpytest(*RUN)
    # beside a busy neighbour no measurement of ``slowed`` may be quiet, and the rule then
    # calls no regression: inconclusive for that reason only
    busy = int(bool(re.search(r"slowed\.time_s: inconclusive: [^\n]*" + NOT_QUIET,
                              result.stdout.str())))
    result.assert_outcomes(passed=3 + busy, failed=1 - busy)
    if not busy:
        result.stdout.fnmatch_lines([
            "*distperf: regressed in test_naps.py::test_slowed (tolerance 10%):",
            "*metric*baseline*current*change*confidence*verdict",
            "*slowed.time_s*ms*ms*+*%*%*regressed",
            f"*slowed.time_s: regressed: *confirmed by {rule._CONTROL_MEASUREMENTS} "
            "measurements*host-speed control *vs the baseline's, followed with slope *",
        ])
    # ``same`` sleeps as long as at the save; on a host that got faster since (its control
    # quicker), that is also what CPU work slowed by as much would read, so the rule may not
    # tell it (docs/verdict-rule.md, sentence 9): unchanged, or inconclusive for that reason only,
    # never a failure.  The host's speed between two pytest runs is not the test's to set.
    # The same holds for ``faster`` on a host more than 40% faster since the save: 0.4x the
    # sleep is then what CPU work slower by as much would read (CI met such a host once).
    # Beside a busy neighbour ``faster``'s measurements may all be noisy and its change not
    # significant: then it passes as unchanged.
    out = result.stdout.str()
    verdicts = dict(re.findall(r"^ {4}(\w+)\.time_s .* (\w+)$", out, re.MULTILINE))
    assert verdicts["slowed"] == ("inconclusive" if busy else "regressed"), verdicts
    assert verdicts["murky"] == "inconclusive", verdicts
    assert verdicts["same"] in ("unchanged", "inconclusive"), verdicts
    assert verdicts["faster"] in ("improved", "unchanged", "inconclusive"), verdicts
    for name in ("same", "faster"):
        if verdicts[name] == "inconclusive":
            result.stdout.fnmatch_lines([
                # the host, or its memory where that moved further
                f"*INCONCLUSIVE*test_naps.py::test_{name}*{name}.time_s*the host* ran * faster "
                "than at the save*in proportion*"])
    counts = collections.Counter(verdicts.values())
    result.stdout.fnmatch_lines([
        "*distperf verdicts (per metric): " + ", ".join(
            f"{counts[k]} {k}" for k in ("regressed", "inconclusive", "improved", "unchanged")
            if counts[k])])
    if not busy:
        result.stdout.fnmatch_lines(["*REGRESSED*test_naps.py::test_slowed*slowed.time_s*"])
    # murky is inconclusive: not statistically clear, or too noisy to tell under load
    result.stdout.re_match_lines([f".*INCONCLUSIVE.*test_naps.py::test_murky.*{MURKY}"])
    if verdicts["faster"] == "improved":
        result.stdout.fnmatch_lines([
            "*IMPROVED*test_naps.py::test_faster*faster.time_s*re-save with --distperf-save*"])
    result.stdout.fnmatch_lines(["*PytestWarning: distperf: inconclusive*murky.time_s*"])
    assert ("FAILED test_naps.py::test_slowed" in result.stdout.str()) == (not busy)
    assert stored.read_bytes() == saved  # comparing never writes

    # 3. another environment (1 rank, not 2) is never compared against
    monkeypatch.delenv("NAP_SLOWED")
    result = pytester.runpytest("--distperf", "--gpus", "1", "-p",
                                "no:cacheprovider")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines([
        "*distperf verdicts (per metric): 4 not comparable",
        f"*NOT COMPARABLE*gloo-cpu-w1-*baselines exist only for other environments "
        f"({env_id})*",
    ])
    assert "regressed" not in result.stdout.str()
    assert stored.read_bytes() == saved

    # 4. --distperf-strict: inconclusive fails, with its figures
    result = pytester.runpytest(*RUN, "--distperf-strict", "-k", "murky")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*distperf: inconclusive in test_naps.py::test_murky*",
        "*murky.time_s*inconclusive",
    ])
    result.stdout.re_match_lines([f".*murky.time_s: inconclusive: .*{MURKY}"])


def test_a_save_measures_until_its_measurements_tell_the_tolerance(
        pytester: pytest.Pytester) -> None:
    """A save of a metric with the control takes measurements until at least four it keeps
    tell a change of the tolerance nine times in ten, DEFAULT_SAVE_MEASUREMENTS (12) at
    most; the report and the baseline file say how many it took and kept.  The report gives
    the change a comparison can tell, the figure the stored baseline gives
    (rule.detectable), where the noise probe left 3 quiet measurements or more."""
    pytester.makepyfile(test_quick="""
        import time


        def nap(seconds):
            time.sleep(seconds)


        def test_quick(nccl_group):
            nccl_group.measure("quick", nap, 0.001, iters=10, warmup=1)
    """)
    result = pytester.runpytest(*RUN, "--distperf-save")
    result.assert_outcomes(passed=1)
    taken = re.search(r"quick\.time_s: (\d+) of (\d+) measurement\(s\) pooled, with the "
                      r"host-speed control", result.stdout.str())
    assert taken is not None, result.stdout.str()
    kept, count = int(taken[1]), int(taken[2])
    assert kept <= count <= DEFAULT_SAVE_MEASUREMENTS == 12
    assert count >= 4  # at least four, whatever they tell
    data = tomllib.loads((pytester.path / "perf_baselines" / "test_quick.toml").read_text())
    (env_id,) = data["tests"]["test_quick"]
    quick = (flat_metrics(data, "test_quick", env_id) or {})["quick.time_s"]
    sizes = quick.get("measurements", [10])  # the ones it kept
    assert set(sizes) == {10} and len(sizes) == kept
    assert len(quick["samples"]) == len(quick["control"]) == sum(sizes)
    # the detail gives the change a comparison can tell, as the stored baseline says
    stored = bl.load(pytester.path / "perf_baselines" / "test_quick.toml")
    assert stored is not None
    found = (stored.metrics("test_quick", env_id) or {})["quick.time_s"]
    d = rule.detectable(found)
    told = re.search(r"quick\.time_s: .*its (\d+) measurements spread ([\d.]+)%: a comparison "
                     r"tells a change of ([\d.]+)% or more 90% of the time", result.stdout.str())
    if len(sizes) < 3:  # the noise probe left too few quiet measurements to tell a spread
        assert d is None and told is None, result.stdout.str()
        return
    assert d is not None and d.measurements == len(sizes)
    assert told is not None, result.stdout.str()
    assert int(told[1]) == d.measurements
    assert float(told[2]) == pytest.approx(100 * d.spread, abs=0.051)
    assert float(told[3]) == pytest.approx(100 * d.change, abs=0.051)


BAD = {
    "test_corrupt": ('schema_version = 1\nmodule = "test_corrupt.py"\n[tests\n', 3,
                     "not valid TOML"),
    "test_empty": ("", 1, "the file is empty"),
    "test_foreign": ('[tool.black]\nline-length = 88\n', 1,
                     "not a pytest-distperf baseline file"),
    "test_stale": ("schema_version = 0\n", 1, "stale schema version 0"),
}


def test_bad_baseline_files_are_refused_and_never_changed(pytester: pytest.Pytester) -> None:
    folder = pytester.path / "perf_baselines"
    folder.mkdir()
    before = {}
    for name, (text, _, _) in BAD.items():
        pytester.makepyfile(**{name: textwrap.dedent("""
            def test_it(nccl_group):
                nccl_group.measure("noop", lambda: None, iters=5, warmup=0)
        """)})
        (folder / f"{name}.toml").write_text(text)
        before[name] = (folder / f"{name}.toml").read_bytes()
    # not even --distperf-save writes over them (comparing reads them the same way)
    result = pytester.runpytest(*RUN, *SAVE)
    result.assert_outcomes(failed=len(BAD))
    for name, (_, line, words) in BAD.items():
        result.stdout.fnmatch_lines(
            [f"*distperf: bad baseline file {folder / name}.toml:{line}: {words}*"])
        assert (folder / f"{name}.toml").read_bytes() == before[name], name
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.toml" for n in BAD)


def test_test_files_outside_the_rootdir_keep_their_own_baselines(
        pytester: pytest.Pytester) -> None:
    """pytest names a test in a file outside the rootdir ``::test_it``, with no module: the
    baselines are keyed by the file's path relative to the rootdir instead, so two such files
    with a test of the same name keep two baselines (they all went to ``tests.toml``)."""
    root = pytester.path / "root"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    for name in ("one", "two"):
        folder = pytester.path / name
        folder.mkdir()
        (folder / f"test_{name}.py").write_text(textwrap.dedent(f"""
            def test_it(nccl_group):
                nccl_group.measure("{name}", lambda: None, iters=5, warmup=0)
        """))
    result = pytester.runpytest(
        *RUN, *SAVE, "--rootdir", str(root), "-c", str(root / "pytest.ini"),
        str(pytester.path / "one"), str(pytester.path / "two"))
    result.assert_outcomes(passed=2)
    for name in ("one", "two"):
        path = root / "perf_baselines" / "__" / name / f"test_{name}.toml"
        data = tomllib.loads(path.read_text())
        assert data["module"] == f"../{name}/test_{name}.py"
        (entry,) = data["tests"]["test_it"].values()
        assert list(entry["metrics"]) == [f"{name}.time_s"]
    assert not (root / "perf_baselines" / "tests.toml").exists()


def test_a_key_that_holds_the_machine_is_said_and_a_pinned_name_joins_the_machines(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GitHub-hosted runner (its variables set here) beside a baseline of another CPU
    model: the comparison is not comparable and advises a pinned name, the save warns twice
    (the CPU model in the key; an entry that differs in the machine alone), and a save under
    a pinned name keys the baseline by the name, which a runner of another CPU model meets."""
    import torch

    from pytest_distperf.pool.launcher import host_cores, threads_per_rank
    from pytest_distperf.rank.worker import describe
    from pytest_distperf.verdict.environment import environment_of

    pytester.makepyfile(test_key=textwrap.dedent("""
        def test_it(nccl_group):
            nccl_group.measure("noop", lambda: None, iters=5, warmup=0)
    """))
    here = {**describe(0, "gloo", None), "cores": len(host_cores()),
            "threads": threads_per_rank(2), "torch_version": torch.__version__}
    other = environment_of([{**here, "device_model": "Other CPU 9000"}] * 2, "gloo", "cpu", 2)
    path = pytester.path / "perf_baselines" / "test_key.toml"
    base = bl.StoredMetric("s", False, bl.Measured(1e-6, bl.Samples((1e-6,) * 5)))
    bl.save_test(path, "test_key.py", "test_it", [bl.SaveEntry(other, {"noop.time_s": base})])
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("RUNNER_ENVIRONMENT", "github-hosted")

    result = pytester.runpytest(*RUN)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        f"*NOT COMPARABLE*noop.time_s*baselines exist only for other environments "
        f"({bl.environment_id(other)})*device_model 'Other CPU 9000' there*those baselines differ "
        "from this run in the machine's details alone: if these runners are of one type, pin a "
        "name for the runner type*"
        "--distperf-env-name NAME (ini distperf_env_name)*"])

    result = pytester.runpytest(*RUN, *SAVE)
    result.assert_outcomes(passed=1)
    text = " ".join(result.stdout.str().split())  # the warnings summary wraps long lines
    assert f"distperf: these baselines are keyed by the CPU model {here['device_model']!r}, " \
           "which GitHub-hosted runners of one label do not keep from run to run" in text
    assert f"distperf: {path} already holds baselines of this test for " \
           f"{bl.environment_id(other)}, which differs from this run only in the machine's " \
           "details (device_model 'Other CPU 9000' there" in text

    pytester.makeini("[pytest]\ndistperf_env_name = ci-box\n")
    result = pytester.runpytest(*RUN, *SAVE)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["distperf: environment name 'ci-box' (pinned: *"])
    assert "keyed by the CPU model" not in result.stdout.str()
    file = bl.load(path)
    assert file is not None
    pinned = environment_of([here] * 2, "gloo", "cpu", 2, "ci-box")
    assert bl.environment_id(pinned) in file.test_environments("test_it")
    assert bl.environment_id(pinned).endswith("@ci-box")
    # a runner of another CPU model under the same name meets that baseline
    elsewhere = environment_of([{**here, "device_model": "Other CPU 9000"}] * 2, "gloo", "cpu",
                               2, "ci-box")
    assert file.metrics("test_it", bl.environment_id(elsewhere)) is not None
    assert bl.same_environment(file.environments()[bl.environment_id(elsewhere)],
                               elsewhere) == ""


def test_concurrent_saves_from_xdist_workers_lose_nothing(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_many=textwrap.dedent("""
        import time

        import pytest


        @pytest.mark.parametrize("i", range(3))
        def test_it(nccl_group, i):
            nccl_group.measure(f"nap{i}", time.sleep, 0.002, iters=5, warmup=0)
    """))
    # xdist: a new process; its tests train no model (NO_DYNAMO).  Fewer tests than twice
    # the workers are dealt out one by one: both workers save into the one file at their end
    result = pytester.runpytest_subprocess(*RUN, *SAVE, *NO_DYNAMO, "-n", "2")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*distperf verdicts (per metric): 3 saved*"])
    data = tomllib.loads((pytester.path / "perf_baselines" / "test_many.toml").read_text())
    assert sorted(data["tests"]) == sorted(f"test_it[{i}]" for i in range(3))
    for i in range(3):
        (entry,) = data["tests"][f"test_it[{i}]"].values()
        assert list(entry["metrics"]) == [f"nap{i}.time_s"]


def test_cpu_work_made_twice_as_long_is_caught_with_the_host_speed_control(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real CPU-bound work (not a sleep) through the control path: every sample carries its
    control into the baseline file and the JSON report; twice the work is a regression
    whatever the host's speed (only the unmistakable direction is asserted: a clean run's
    verdict is the benchmark's business, benchmarks/verdict_quality.md)."""
    pytester.makepyfile(test_work=textwrap.dedent("""
        import os

        import torch


        def work(a, reps):
            for _ in range(reps):
                a @ a


        def test_work(nccl_group):
            a = torch.randn(128, 128)
            reps = 150 * int(os.environ.get("WORK_SCALE", "1"))  # about 10 ms
            nccl_group.measure("work", work, a, reps, iters=10, warmup=1)
    """))
    result = pytester.runpytest(*RUN, *SAVE)
    result.assert_outcomes(passed=1)
    data = tomllib.loads((pytester.path / "perf_baselines" / "test_work.toml").read_text())
    (env_id,) = data["tests"]["test_work"]
    table = (flat_metrics(data, "test_work", env_id) or {})["work.time_s"]
    # the quiet ones of the save's measurements, pooled (the noise probe may drop a few)
    assert len(table["control"]) == len(table["samples"]) == sum(table.get("measurements", [10]))
    assert set(table.get("measurements", [10])) == {10}
    assert all(c > 0 for c in table["control"])
    # and the memory control after each, a few hundred microseconds to a few milliseconds
    assert len(table["memory_control"]) == len(table["samples"])
    assert all(1e-5 < c < 1.0 for c in table["memory_control"])

    monkeypatch.setenv("WORK_SCALE", "2")
    report = pytester.path / "report.json"
    result = pytester.runpytest(*RUN, "--distperf-json", str(report), "--distperf-strict")
    result.assert_outcomes(failed=1)
    (verdict,) = json.loads(report.read_text())["tests"][0]["verdicts"]
    slower(verdict)
    if verdict["verdict"] == bl.REGRESSED:
        result.stdout.fnmatch_lines([
            "*work.time_s*regressed",
            "*work.time_s: regressed: *confirmed by * measurements*host-speed control*"])
    assert verdict["measurement_count"] == rule._CONTROL_MEASUREMENTS
    # twice the work, about +100%: past the tolerance even against a save a busy host slowed
    assert verdict["change"] > 0.1
    assert verdict["host_change"] is not None
    assert 0.0 <= verdict["control_slope"] <= 1.0


UNEVEN = textwrap.dedent("""
    import time

    import pytest
    import torch.distributed as dist


    def uneven():
        time.sleep(0.01 if dist.get_rank() == 0 else 0.04)  # rank 1 is made 4x slower


    @pytest.mark.distperf(tolerance=1.0)  # the verdict is not what this test is about
    def test_uneven(dist_profiler):
        report = dist_profiler(uneven)
        print("FINDINGS", sorted(b.kind for b in report.bottlenecks))
""")


def test_the_baseline_files_limits_reach_the_fixtures_findings(pytester: pytest.Pytester) -> None:
    """One table of limits per test: a threshold set for this environment in the baseline
    file changes what the fixture's analysis finds, as it changes the breach check."""
    pytester.makepyfile(test_uneven=UNEVEN)
    saved = pytester.runpytest(*RUN, "-s", *SAVE)
    # default limits: rank 1's 4x slowness is an imbalance finding and a breach
    saved.assert_outcomes(failed=1)
    saved.stdout.fnmatch_lines(["FINDINGS *'imbalance'*",
                                "*profile.imbalance = * exceeds max_imbalance = 0.100*"])
    path = pytester.path / "perf_baselines" / "test_uneven.toml"
    data = tomllib.loads(path.read_text())
    (env_id,) = data["environments"]
    data["environments"][env_id]["thresholds"] = {"max_imbalance": 1e6}
    path.write_text(tomli_w.dumps(data))

    compared = pytester.runpytest(*RUN, "-s")
    compared.assert_outcomes(passed=1)
    findings = next(line for line in compared.outlines if line.startswith("FINDINGS"))
    assert "imbalance" not in findings and "straggler" not in findings


TWO_BENCHES = textwrap.dedent("""
    import os
    import time

    import torch.distributed as dist

    ORIGINAL = dist.all_reduce


    def slow_4kib(tensor, *args, **kwargs):
        if tensor.numel() * tensor.element_size() == 4096:
            time.sleep(0.003)  # ~10x a 4 KiB all_reduce on gloo
        return ORIGINAL(tensor, *args, **kwargs)


    def install():
        dist.all_reduce = slow_4kib  # on this rank, for the rest of this pytest run


    def test_three_benches_of_one_op(nccl_group):
        if os.environ.get("SLOW_FIRST"):
            nccl_group.run(install)
        nccl_group.bench("all_reduce", ["4KiB"], iters=10, warmup=1)
        nccl_group.bench("all_reduce", ["8KiB"], iters=10, warmup=1)
        nccl_group.bench("all_reduce", ["8KiB"], iters=10, warmup=1)
""")


def test_every_bench_call_of_one_op_is_judged_and_confirmed_on_its_own(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three bench() calls of one op in a test: each gets its own label and metric names,
    is stored, and is re-measured through its own call.  It used to be re-measured through
    the last call's label: the first call's slowdown was never measured again and passed as
    'awaiting confirmation'.  Whether 10x comes out regressed or inconclusive is the noise
    probe's call on a busy host (another process taking the CPUs); that it was measured
    again, through its own call, is not."""
    pytester.makepyfile(test_benches=TWO_BENCHES)
    pytester.runpytest(*RUN, *SAVE).assert_outcomes(passed=1)
    data = tomllib.loads((pytester.path / "perf_baselines" / "test_benches.toml").read_text())
    (entry,) = data["tests"]["test_three_benches_of_one_op"].values()
    assert set(entry["metrics"]) == {"all_reduce.4KiB.busbw_gbps",
                                     "all_reduce.8KiB.busbw_gbps",
                                     "all_reduce.8KiB.busbw_gbps#2"}

    monkeypatch.setenv("SLOW_FIRST", "1")
    report = pytester.path / "report.json"
    result = pytester.runpytest(*RUN, f"--distperf-json={report}")
    (test,) = json.loads(report.read_text())["tests"]
    assert [r["label"] for r in test["results"]] == [
        "bench(all_reduce)", "bench(all_reduce)#2", "bench(all_reduce)#3"]
    verdicts = {v["metric"]: v for v in test["verdicts"]}
    first = verdicts["all_reduce.4KiB.busbw_gbps"]
    # measured again, through its own call (with the host-speed control: to six pooled)
    assert first["measurement_count"] == rule._CONTROL_MEASUREMENTS
    assert first["change"] < -0.5 and first["detail"] != "awaiting confirmation"
    assert first["verdict"] in (bl.REGRESSED, bl.INCONCLUSIVE)
    assert result.ret == (1 if first["verdict"] == bl.REGRESSED else 0)


STEP_CHANGES = textwrap.dedent("""
    import os
    import time

    import torch
    import torch.distributed as dist


    def model():
        return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])


    def loss(out):
        if os.environ.get("EXTRA_BARRIER") == "1":
            dist.barrier()
        time.sleep(float(os.environ.get("COMPUTE_NAP", "0")))  # in every step
        return out.sum()


    def slow_hook(state, bucket):  # the default all-reduce, completing a nap later
        time.sleep(float(os.environ["COMM_NAP"]))
        buffer = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buffer, async_op=True).get_future().then(
            lambda fut: fut.value()[0])


    def test_step(ddp_step_timer):
        cap = float(os.environ.get("BUCKET_CAP_MB", "25"))
        ddp_step_timer(model, lambda rank: torch.randn(8, 64), steps=4, warmup=1,
                       loss_fn=loss, wrapper_kwargs={"bucket_cap_mb": cap},
                       comm_hook=slow_hook if "COMM_NAP" in os.environ else None)
""")
#: The model's gradients: 4 x (64 x 64 + 64) float32.
STEP_BYTES = 4 * (64 * 64 + 64) * 4
#: A tiny model's fractions are noise on a shared host: no threshold may fail these runs.
NO_LIMITS = ("-o", "distperf_max_comm_overhead=1", "-o", "distperf_max_imbalance=100")
SAME_RANKS = "--distperf-same-ranks"


STRICT = "--distperf-strict"


#: What an inconclusive verdict says when beside a busy neighbour no measurement was quiet.
NOT_QUIET = "no measurement was quiet enough to call it a regression"


def slower(verdict: dict) -> None:
    """A timing verdict of a change several times the tolerance: regressed, or beside a busy
    neighbour inconclusive (too noisy, no quiet measurement, or a host that moved as much);
    never unchanged or improved."""
    assert verdict["verdict"] in (bl.REGRESSED, bl.INCONCLUSIVE), verdict


@pytest.fixture(scope="module")
def step_baseline(tmp_path_factory: pytest.TempPathFactory) -> str:
    """STEP_CHANGES saved once for the module's step tests: the baseline file's text."""
    folder = tmp_path_factory.mktemp("step_save")
    (folder / "test_step.py").write_text(STEP_CHANGES)
    run = pytest_here(folder, *RUN, *SAVE, *NO_LIMITS, SAME_RANKS)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return (folder / "perf_baselines" / "test_step.toml").read_text()


def with_step_baseline(pytester: pytest.Pytester, baseline: str) -> dict:
    """STEP_CHANGES and its saved baseline in ``pytester``'s project: the baseline's data."""
    pytester.makepyfile(test_step=STEP_CHANGES)
    folder = pytester.mkdir("perf_baselines")
    (folder / "test_step.toml").write_text(baseline)
    return tomllib.loads(baseline)


def compare_step(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                 *options: str, **env: str) -> tuple[pytest.RunResult, dict[str, dict]]:
    """A compare run of STEP_CHANGES with ``env`` set (and more command-line ``options``):
    its result and verdicts by metric."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    report = pytester.path / "report.json"
    result = pytester.runpytest(*RUN, f"--distperf-json={report}", *NO_LIMITS,
                                f"--junitxml={pytester.path / 'junit.xml'}",
                                *options)
    for key in env:
        monkeypatch.delenv(key)
    (test,) = json.loads(report.read_text())["tests"]
    return result, {v["metric"]: v for v in test["verdicts"]}


def test_a_change_in_the_collectives_of_a_step_fails_exactly_and_says_why(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, step_baseline: str) -> None:
    """Real DDP steps on gloo: smaller buckets (more all-reduces, the same bytes) and an
    extra barrier per step are regressions of exact counts, whatever the host's speed; the
    failure names the change beside it.  Only exact verdicts are asserted: the timings of
    this tiny model are left to the noise (and re-measured on the pool's own ranks, which
    is quicker: exact counts are measured once)."""
    data = with_step_baseline(pytester, step_baseline)
    (entry,) = data["tests"]["test_step"].values()
    metrics = entry["metrics"]
    assert metrics["comm.all_reduce.bytes"] == {"unit": "B/step", "higher_is_better": False,
                                                "value": STEP_BYTES, "kind": "exact",
                                                "tolerance": 0}
    assert metrics["comm.all_reduce.calls"]["value"] == metrics["comm.buckets"]["value"] == 1

    def compare(**env: str) -> tuple[pytest.RunResult, dict[str, dict]]:
        return compare_step(pytester, monkeypatch, SAME_RANKS, **env)

    # a 4 KiB bucket cap: one all-reduce per layer, the same bytes
    result, verdicts = compare(BUCKET_CAP_MB=str(4 * 1024 / 2**20))
    assert result.ret == 1
    calls = verdicts["comm.all_reduce.calls"]
    assert (calls["verdict"], calls["baseline"], calls["current"]) == (bl.REGRESSED, 1, 4)
    assert verdicts["comm.buckets"]["verdict"] == bl.REGRESSED
    assert verdicts["comm.all_reduce.bytes"]["verdict"] == bl.UNCHANGED
    # the figures and verdicts reach CI systems that read JUnit XML
    junit = ElementTree.parse(pytester.path / "junit.xml")
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert properties["distperf.comm.all_reduce.calls"] == "4 calls/step"
    assert properties["distperf.comm.all_reduce.bytes"] == f"{STEP_BYTES / 1024:.3g} KiB/step"
    assert properties["distperf.comm.all_reduce.calls.verdict"] == "regressed (+300.0%)"
    result.stdout.fnmatch_lines([
        "*comm.all_reduce.calls: regressed: 1 -> 4 calls/step (+3), past the exact tolerance*",
        "*what changed with it: all_reduce calls/step 1 -> 4, bytes unchanged: smaller "
        "gradient buckets (bucket_cap_mb)?*"])

    # an extra barrier in every step: a collective the baseline never issued
    result, verdicts = compare(EXTRA_BARRIER="1")
    assert result.ret == 1
    barrier = verdicts["comm.barrier.calls"]
    assert (barrier["verdict"], barrier["baseline"], barrier["current"]) == (bl.REGRESSED, 0, 1)
    assert barrier["explanation"] == "barrier: new, 1 call(s)/step: an extra barrier in the step?"
    assert verdicts["comm.all_reduce.calls"]["verdict"] == bl.UNCHANGED
    # (the same step's counts unchanged: test_a_slower_step_is_judged_by_the_part_that_grew)


def test_a_slower_step_is_judged_by_the_part_that_grew(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, step_baseline: str) -> None:
    """Real DDP steps on gloo, made several times slower in one part: a sleep in the loss
    (compute: every step, synchronised or not) or in the comm hook (communication: the
    synchronised steps only).  Compute is its own measured metric, and the failure says
    which part grew.  Re-measured on the pool's own ranks (quicker; fresh ranks are
    tested below)."""
    data = with_step_baseline(pytester, step_baseline)
    (env_id,) = data["tests"]["test_step"]
    compute = (flat_metrics(data, "test_step", env_id) or {})["compute_time_s"]
    assert compute["kind"] == "" and len(compute["control"]) == len(compute["samples"]), compute

    # 30 ms more compute per step: the compute regressed, and the step with it
    result, verdicts = compare_step(pytester, monkeypatch, SAME_RANKS, STRICT,
                                    COMPUTE_NAP="0.03")
    assert result.ret == 1, verdicts
    compute, step = verdicts["compute_time_s"], verdicts["step_time_s"]
    slower(compute)
    slower(step)
    assert compute["change"] > 1.0, compute
    assert re.search(r"compute \+\d+%", step["explanation"]), step["explanation"]
    exact = {v["metric"]: v["verdict"] for v in verdicts.values() if v["kind"] == "exact"}
    assert set(exact.values()) == {bl.UNCHANGED}, exact

    # 30 ms more in the comm hook: communication grew, the compute did not
    result, verdicts = compare_step(pytester, monkeypatch, SAME_RANKS, STRICT, COMM_NAP="0.03")
    assert result.ret == 1, verdicts
    overhead = verdicts["comm_overhead"]
    slower(overhead)
    assert "exposed communication" in overhead["explanation"]
    step, compute = verdicts["step_time_s"], verdicts["compute_time_s"]
    exposed = verdicts["exposed_comm_s"]
    # the 30 ms went to the exposed communication, not to the compute (whose sub-millisecond
    # steps can run 70% slower between naps: cold caches, not work)
    assert exposed["current"] - exposed["baseline"] > 0.02, exposed
    assert compute["current"] - compute["baseline"] < 0.01, compute
    assert step["change"] > 1.0, step
    # the step's own verdict stands, whatever its compute did
    slower(step)
    assert "exposed communication" in step["explanation"], step
    assert "exposed communication unchanged" not in step["explanation"], step


FRESH_RANKS = textwrap.dedent("""
    import os
    import sys
    from pathlib import Path

    import torch


    def model():  # built on the ranks at every measurement: note which process built it
        Path(os.environ["PIDS"], str(os.getpid())).touch()
        return torch.nn.Linear(16, 16)


    def keep(value):  # on the rank process, for the session (not in this module's
        sys.distperf_kept = value  # globals: the test module is shipped anew with each call)


    def kept():
        return getattr(sys, "distperf_kept", None)


    def test_step(ddp_step_timer, nccl_group):
        nccl_group.run(keep, "set up by the test")
        ddp_step_timer(model, lambda rank: torch.randn(4, 16), steps=10, warmup=1)


    def test_the_pool_keeps_what_earlier_calls_left(nccl_group):
        assert nccl_group.run(kept) == ["set up by the test"] * 2
""")


#: A conftest for the project of a run in which fresh ranks cannot start.
NO_FRESH_RANKS = textwrap.dedent("""
    from pytest_distperf.pool import launcher


    class Unstartable(launcher.RankPool):
        def start(self):
            raise launcher.RankError("no fresh ranks today")


    def pytest_configure(config):
        launcher.RankPool.sibling = lambda pool: Unstartable(pool.world_size, pool.backend)
""")


@pytest.mark.parametrize("how", ["fresh", "same", "unstartable"])
def test_a_save_measures_a_step_again_on_fresh_ranks(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A save measures a controlled metric --distperf-save-measurements times (here 3; 12 by
    default, test_save_then_compare_...).  On CPU ranks every re-measurement of
    a ddp_step_timer step runs on a pool of fresh ranks, started for it and closed after (a
    set of processes runs a few percent faster or slower than another for as long as it
    lives); the session's own pool, and what the test left on its ranks, stay.
    --distperf-same-ranks keeps them all on the pool's ranks, and so does a failure to start
    fresh ones, with a warning."""
    pytester.makepyfile(test_fresh=FRESH_RANKS)
    if how == "unstartable":
        pytester.makeconftest(NO_FRESH_RANKS)
    pids = pytester.mkdir("pids")
    monkeypatch.setenv("PIDS", str(pids))
    args = ["--distperf-same-ranks"] if how == "same" else []
    report = pytester.path / "report.json"
    saves = 3
    result = pytester.runpytest(*RUN, "--distperf-save", *NO_LIMITS, *args,
                                f"--distperf-save-measurements={saves}",
                                f"--distperf-json={report}")
    result.assert_outcomes(passed=2)
    test = next(t for t in json.loads(report.read_text())["tests"]
                if t["nodeid"].endswith("test_step"))
    step = next(v for v in test["verdicts"] if v["metric"] == "step_time_s")
    # as many as asked, or up to SAVE_MAX_WINDOWS where a plain metric of the step (measured
    # with it) was too noisy to save from fewer
    taken = step["measurement_count"]
    assert saves <= taken <= judgement._SAVE_MAX_MEASUREMENTS, taken
    builders = {p.name for p in pids.iterdir()}
    # two ranks per set of processes: the pool's own, and one fresh set per re-measurement
    assert len(builders) == (2 * taken if how == "fresh" else 2), builders
    # every measurement's samples and controls, for anyone to check the verdict with; a
    # re-measurement times half the steps (it adds one more set of ranks' level)
    assert len(step["measurements"]) == taken
    assert [len(m["samples"]["values"]) for m in step["measurements"]] == [10] + [5] * (taken - 1)
    assert all(len(m["samples"]["values"]) == len(m["samples"]["control"])
               == len(m["samples"]["memory_control"]) for m in step["measurements"])
    # the verdicts say where they were measured
    said = f"{taken - 1} re-measurement(s) on fresh ranks"
    assert (said in step["detail"]) == (how == "fresh"), step["detail"]
    warned = "fresh ranks to re-measure on did not start (no fresh ranks today)"
    assert result.stdout.str().count(warned) == (how == "unstartable")  # once a session
