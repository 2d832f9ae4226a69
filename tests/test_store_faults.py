"""Saves that stay fast and clean, and a gate that says when it went dark (issue 39): the
store's side by unit tests, the plugin's side by one save and two compare runs of pytest in
a subprocess on 2 gloo ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from quick_runs import ONE_SAVE, pytest_here, quick_env

from pytest_distperf import verdict as bl
from pytest_distperf.records import Environment, Measurement, Metric, TestRecord, Verdict
from pytest_distperf.report import markdown
from pytest_distperf.report import terminal as report
from pytest_distperf.verdict import store

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

CPU = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
TIMES = tuple(0.020 + 0.0002 * i for i in range(20))


def entries(scale: float = 1.0) -> list[bl.SaveEntry]:
    values = tuple(v * scale for v in TIMES)
    return [bl.SaveEntry(CPU, {"w.time_s": bl.StoredMetric("s", False, bl.Measured(
        values[10], bl.Samples(values)))})]


# -- one read and one write per module per session ------------------------------------------
def test_a_session_reads_a_module_file_once_and_writes_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = bl.SessionFiles(tmp_path)
    key = "tests/test_x.py::test_0"
    bl.save_test(files.path(key), "tests/test_x.py", "test_old", entries())
    counts = {"read": 0, "write": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(store, "load", counted("read", store.load))
    monkeypatch.setattr(store, "write_atomically", counted("write", store.write_atomically))
    for i in range(4):  # each test reads its limits, then saves
        files.file(f"tests/test_x.py::test_{i}")
        files.save(f"tests/test_x.py::test_{i}", entries())
        assert files.write(keep=f"tests/test_x.py::test_{i + 1}") == []  # not yet
    assert counts == {"read": 1, "write": 0}
    assert files.write() == []
    assert counts == {"read": 1, "write": 1}
    written = bl.load(files.path(key))
    assert written is not None
    assert written.tests() == ["test_0", "test_1", "test_2", "test_3", "test_old"]


def test_a_file_another_process_wrote_meanwhile_is_read_again(tmp_path: Path) -> None:
    files = bl.SessionFiles(tmp_path)
    files.file("test_x.py::test_a")  # none yet
    files.save("test_x.py::test_a", entries())
    bl.save_test(files.path("test_x.py::test_a"), "test_x.py", "test_b", entries())  # xdist
    assert files.write() == []
    written = bl.load(files.path("test_x.py::test_a"))
    assert written is not None and written.tests() == ["test_a", "test_b"]


# -- bad files: refused in one clear line -------------------------------------------------
@pytest.mark.parametrize("version", [1, 2])
def test_a_kind_that_is_not_a_string_is_refused_clearly(tmp_path: Path, version: int) -> None:
    path = tmp_path / "test_x.toml"
    bl.save_test(path, "test_x.py", "test_a", entries())
    data = tomllib.loads(path.read_text())
    (entry,) = data["tests"]["test_a"].values()
    table = entry["metrics"]["w.time_s"]
    if version == 1:  # version 1: the metric's own table, with its samples
        data["schema_version"], table["samples"] = 1, list(TIMES)
        entry.pop("samples")
    table["kind"] = []  # a hand edit: it was a TypeError from deep inside the check
    path.write_text(tomli_w.dumps(data))
    with pytest.raises(bl.BaselineError, match=r"kind must be one of .*, got \[\]"):
        bl.load(path)


# -- temporary files of killed saves --------------------------------------------------------
_KILLED_SAVE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from pytest_distperf.records import Environment, Measured, Samples
    from pytest_distperf.verdict import store

    os.fsync = lambda fd: (print("WRITING", flush=True), time.sleep(60))  # killed here
    env = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
    metric = store.StoredMetric("s", False, Measured(0.02, Samples((0.02,) * 20)))
    store.save_test(Path(sys.argv[1]), "tests/test_x.py", "test_a",
                    [store.SaveEntry(env, {"w.time_s": metric})])
""")


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout


def test_a_killed_save_leaves_nothing_a_commit_picks_up_and_the_next_run_clears_it(
        tmp_path: Path) -> None:
    root = tmp_path / "perf_baselines"
    path = root / "tests" / "test_x.toml"
    env = quick_env({**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_SAVE, str(path)], env=env,
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdout.readline().strip() == "WRITING"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    left = [p for p in root.rglob("*") if p.is_file()]
    assert left and all(store.TMP_DIRNAME in p.parts for p in left)  # half a file, aside
    old = root / ".test_y.toml.k2j4_x.tmp"  # what a killed save of an older version left
    old.write_text("half a file")
    _git(tmp_path, "init", "-q")
    added = _git(tmp_path, "add", "--dry-run", "perf_baselines")
    assert store.TMP_DIRNAME not in added  # the CI workflow's add-paths never commits it
    files = bl.SessionFiles(root)
    assert files.file("tests/test_x.py::test_a") is None  # the first use clears them
    assert not [p for p in root.rglob("*") if p.is_file()] and not old.exists()


# -- symlinked baseline files ---------------------------------------------------------------
def test_a_save_writes_through_a_symlinked_file(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "test_x.toml"
    shared.parent.mkdir()
    bl.save_test(shared, "test_x.py", "test_old", entries())
    link = tmp_path / "perf_baselines" / "test_x.toml"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(shared, link.parent))
    bl.save_test(link, "test_x.py", "test_new", entries(2.0))
    assert link.is_symlink()  # the link is kept, and the file it points to has both
    written = bl.load(shared)
    assert written is not None and written.tests() == ["test_new", "test_old"]
    assert sorted(p.name for p in link.parent.iterdir()) == ["test_x.toml"]


# -- the dark gate --------------------------------------------------------------------------
def test_a_baseline_only_for_another_torch_says_what_differs(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    old = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.12.0+cpu", "", 2, 1)
    bl.save_test(path, "test_x.py", "test_a", [bl.SaveEntry(old, entries()[0].metrics)])
    file = bl.load(path)
    metric = Metric("w.time_s", TIMES[10], "s", False, TIMES)
    j = bl.make_judgement(save=False, measurements=[Measurement("m", (metric,), None)],
                          environment=CPU, first_noise=None, tolerance=0.1, baseline=file,
                          test="test_a")
    (v,) = j.verdicts()
    assert v.verdict == bl.NOT_COMPARABLE
    assert "torch_version '2.12.0' there, '2.13.0' here" in v.detail
    records = [TestRecord("test_x.py::test_a", 2, verdicts=[v]),
               TestRecord("test_x.py::test_b", 2, verdicts=[
                   Verdict("w.time_s", "unchanged", bl.environment_id(CPU))])]
    lines = report.dark_lines(records, strict=True)
    assert lines[0].startswith("distperf: the gate is dark for 1 test(s)")
    assert "--distperf-strict fails the run" in lines[0]
    assert any("torch_version" in line for line in lines)
    assert "--distperf-save" in lines[-1]
    md = markdown.markdown_summary(records, header="h")
    assert "the gate is dark for 1 test(s)" in md.splitlines()[0]
    assert "torch\\_version" in md


RUN = ("--distperf", "--gpus", "2", "-p", "no:cacheprovider", "-q")
TWO_TESTS = textwrap.dedent("""
    import time


    def test_a(nccl_group):
        nccl_group.measure("a", time.sleep, 0.002, iters=5, warmup=0, control=False)


    def test_b(nccl_group):
        nccl_group.measure("b", time.sleep, 0.002, iters=5, warmup=0, control=False)
""")


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return pytest_here(folder, *RUN, *args)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One save of a module of two tests (one measurement each: what is saved, not how well,
    is the point), shared by the tests below."""
    folder = tmp_path_factory.mktemp("gate")
    (folder / "test_two.py").write_text(TWO_TESTS)
    (folder / "pytest.ini").write_text("[pytest]\n")
    result = _pytest(folder, "--distperf-save", *ONE_SAVE)
    assert result.returncode == 0, result.stdout + result.stderr
    return folder, result.stdout


def test_a_save_prints_what_moved(saved_run: tuple[Path, str]) -> None:
    folder, out = saved_run
    assert "distperf baselines saved: what moved" in out
    assert "test_two.py::test_a  [" in out and "new: 1 metric(s)" in out
    data = tomllib.loads((folder / "perf_baselines" / "test_two.toml").read_text())
    assert data["schema_version"] == 2 and sorted(data["tests"]) == ["test_a", "test_b"]
    assert not (folder / "perf_baselines" / store.TMP_DIRNAME).exists()


def test_the_gate_gone_dark_says_so_and_fails_under_strict(
        saved_run: tuple[Path, str], tmp_path: Path) -> None:
    folder, _ = saved_run
    path = folder / "perf_baselines" / "test_two.toml"
    data = tomllib.loads(path.read_text())
    (env_id,) = data["environments"]  # as after a torch upgrade: the key and its field
    old_id = env_id.replace("-torch", "-torch0.")
    data["environments"] = {old_id: {**data["environments"][env_id], "torch_version": "0.1"}}
    data["tests"] = {t: {old_id: e[env_id]} for t, e in data["tests"].items()}
    (folder / "old.toml").write_text(tomli_w.dumps(data))
    os.replace(folder / "old.toml", path)
    md = tmp_path / "summary.md"
    result = _pytest(folder, "--distperf-strict", f"--distperf-markdown={md}")
    out = result.stdout
    assert result.returncode == 1, out
    assert "2 passed" in out  # every test passed: the run fails for the dark gate alone
    assert "the gate is dark for 2 test(s)" in out and "--distperf-strict fails" in out
    assert "torch_version '0.1' there" in out
    summary = md.read_text().splitlines()
    assert "nothing compared; the gate is dark for 2 test(s)" in summary[0]
    assert summary[3].startswith("> **NOTHING WAS COMPARED: no baseline for this run's ")
    top = out.split("distperf summary", 1)[1].splitlines()[1]
    assert top.startswith("distperf: NOTHING WAS COMPARED: "), out
    lenient = _pytest(folder)  # without --distperf-strict it passes, and says so
    assert lenient.returncode == 0 and "the gate is dark for 2 test(s)" in lenient.stdout
