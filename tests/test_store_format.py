"""The baseline file a reviewer reads (schema_version 2), version 1 still read, and what a
save says moved: pure unit tests on the store, the judgement and the reports (no ranks)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf import verdict as bl
from pytest_distperf.records import (
    EXACT,
    Environment,
    Measurement,
    Metric,
    TestRecord,
    Verdict,
)
from pytest_distperf.report import markdown
from pytest_distperf.report import terminal as report
from pytest_distperf.verdict import storefile
from pytest_distperf.verdict.noise import NoiseFigures

DATA = Path(__file__).parent / "data"
#: A real version-1 file: one DDP step test of 11 metrics (``ddp_step_timer`` of a 2-layer
#: MLP on 2 gloo ranks, saved with --distperf-save before version 2).
V1_FILE = DATA / "baseline_v1_ddp_step.toml"
V1_TEST = "test_step"
QUIET = NoiseFigures(1.0, 0.05, 0.08)
CPU = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
TIMES = tuple(0.020 + 0.0002 * i for i in range(20))
STAMP = "2026-11-27T00:00:00Z"


def environment_of(file: bl.BaselineFile, env_id: str) -> Environment:
    table = file.environments()[env_id]
    return Environment(**{name: table[name] for name in (
        "backend", "device_type", "device_model", "device_count", "world_size",
        "torch_version", "nccl_version", "cpu_cores", "threads_per_rank", "bound_cores")})


def metrics_like(stored: dict[str, bl.StoredMetric], factor: float) -> list[Metric]:
    """A run that measured what ``stored`` holds, every figure ``factor`` times as large
    (the host-speed controls as they were)."""
    return [Metric(name, m.value * factor, m.unit, m.higher_is_better,
                   tuple(v * factor for v in m.samples.values), control=m.samples.control,
                   memory_control=m.samples.memory_control, kind=m.kind)
            for name, m in stored.items()]


def judged(file: bl.BaselineFile | None, metrics: list[Metric], env: Environment, *,
           save: bool = False, test: str = V1_TEST) -> Any:
    measurement = Measurement("m", tuple(metrics), None, lambda: list(metrics))
    j = bl.make_judgement(save=save, measurements=[measurement], environment=env,
                          first_noise=QUIET, tolerance=0.10, baseline=file, test=test)
    while j.wanted():  # every re-measurement gives the same figures
        j.add_measurement("m", metrics, QUIET)
    return j


@pytest.fixture
def v1(tmp_path: Path) -> tuple[Path, bl.BaselineFile, Environment]:
    path = tmp_path / "test_gate.toml"
    shutil.copy(V1_FILE, path)
    file = bl.load(path)
    assert file is not None
    (env_id,) = file.test_environments(V1_TEST)
    return path, file, environment_of(file, env_id)


def rewritten(path: Path, file: bl.BaselineFile, env: Environment) -> bl.BaselineFile:
    """The version-1 file after a save of another test into it: every test as version 2."""
    bl.save_test(path, "test_gate.py", "test_other", [bl.SaveEntry(env, {})], saved_at=STAMP)
    again = bl.load(path)
    assert again is not None and again.data["schema_version"] == 2
    return again


def test_a_version_1_file_loads_and_is_left_as_it_is(
        v1: tuple[Path, bl.BaselineFile, Environment]) -> None:
    path, file, env = v1
    before = path.read_bytes()
    stored = file.metrics(V1_TEST, bl.environment_id(env))
    assert stored is not None and len(stored) == 11
    assert {m.kind for m in stored.values()} == {"", EXACT, "informational"}
    judged(file, metrics_like(stored, 1.0), env).verdicts()
    assert path.read_bytes() == before  # loading and comparing never rewrite it


@pytest.mark.parametrize("factor", [1.0, 0.7, 1.3, 2.0])
def test_a_version_1_file_compares_as_its_version_2_rewrite(
        v1: tuple[Path, bl.BaselineFile, Environment], factor: float) -> None:
    """The same verdicts from the version-1 file (six significant digits) and from what a
    save rewrites it into (samples to four): the rounding changes no verdict."""
    path, file, env = v1
    stored = file.metrics(V1_TEST, bl.environment_id(env))
    assert stored is not None
    metrics = metrics_like(stored, factor)
    old = {v.metric: v.verdict for v in judged(file, metrics, env).verdicts()}
    new = {v.metric: v.verdict for v in judged(rewritten(path, file, env), metrics,
                                               env).verdicts()}
    assert old == new
    if factor == 1.0:
        assert "regressed" not in old.values()
    if factor == 2.0:  # twice the counts: every exact metric regressed
        assert {old[name] for name, m in stored.items() if m.kind == EXACT} == {"regressed"}


@pytest.mark.parametrize("factor", [1.0 + i / 100 for i in range(0, 21, 2)])
def test_rounding_to_four_digits_changes_no_verdict_near_the_line(factor: float) -> None:
    """Against a baseline of close samples (0.2 ms apart at 20 ms), every slowdown up to
    twice the tolerance gets the same verdict from the baseline as saved and as the file
    rounds it (the samples moved in their fifth digit first, so that the rounding bites)."""
    base = bl.StoredMetric("s", False, bl.Measured(TIMES[10], bl.Samples(TIMES)))
    four = storefile.rounded
    kept = bl.StoredMetric("s", False, bl.Measured(four(TIMES[10], 6), bl.Samples(
        tuple(four(v * 1.0001234, 4) for v in TIMES))))
    run = [bl.Measured(v[10], bl.Samples(v)) for v in
           [tuple(x * factor * (1 + 0.003 * (i % 3)) for x in TIMES) for i in range(4)]]
    assert (bl.decide(base, run, 0.10, can_confirm=False).verdict
            == bl.decide(kept, run, 0.10, can_confirm=False).verdict)


def test_a_ddp_step_test_fits_a_screen(
        v1: tuple[Path, bl.BaselineFile, Environment]) -> None:
    """One DDP step test of 11 metrics: under 120 lines, each metric's figures on one line
    before any sample."""
    path, file, env = v1
    stored = file.metrics(V1_TEST, bl.environment_id(env))
    assert stored is not None
    j = judged(None, metrics_like(stored, 1.0), env, save=True)
    path.unlink()
    bl.save_test(path, "test_gate.py", V1_TEST, j.save_entries(), saved_at=STAMP)
    lines = path.read_text().splitlines()
    assert len(lines) < 120, len(lines)
    head = lines.index(f'[tests.{V1_TEST}."{bl.environment_id(env)}".metrics]')
    figures = lines[head + 1: head + 12]
    assert [line.split(" = ")[0].strip('"') for line in figures] == sorted(stored)
    for line in figures:
        assert all(f"{key} = " in line for key in ("value", "unit", "kind", "tolerance"))
    assert lines.index(figures[-1]) < next(i for i, x in enumerate(lines) if "values = [" in x)


def test_saving_the_same_measurements_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    metrics = [Metric("b.time_s", TIMES[3], "s", False, TIMES, control=TIMES),
               Metric("a.calls", 3.0, "calls", False, kind=EXACT)]
    for path, order in ((one, metrics), (two, metrics[::-1])):
        entries = judged(None, order, CPU, save=True, test="t").save_entries()
        bl.save_test(path, "m.py", "t", entries, saved_at=STAMP)
        bl.save_test(path, "m.py", "u", entries, saved_at=STAMP)
    first = one.read_bytes()
    assert first == two.read_bytes()  # the order things were recorded in does not matter
    bl.save_test(one, "m.py", "t", entries, saved_at=STAMP)
    assert one.read_bytes() == first  # saved again: not a byte moves


def test_version_2_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    entries = judged(None, [Metric("w.time_s", TIMES[3], "s", False, TIMES, control=TIMES)],
                     CPU, save=True, test="t").save_entries()
    bl.save_test(path, "m.py", "t", entries, saved_at=STAMP)
    good = path.read_text()
    lines = good.splitlines()
    bad = {
        'kind = "measured"': ('kind = "measure"', "kind must be one of"),
        "control = [": ("control = [1.0, ", "control must be a list of positive numbers"),
    }
    for old, (new, words) in bad.items():
        line = next(i for i, x in enumerate(lines) if old in x) + 1
        path.write_text(good.replace(old, new))
        with pytest.raises(bl.BaselineError, match=f"test_x.toml:{line}: .*{words}"):
            bl.load(path)
    path.write_text(good + '\n[tests.t."e".samples."x.time_s"]\nvalues = [1.0]\n')
    with pytest.raises(bl.BaselineError, match="not described under"):
        bl.load(path)


def test_the_gpu_noise_figures_round_trip(tmp_path: Path) -> None:
    """A GPU measurement's held share and SM clock are kept in ``noise``, the clock as the
    whole MHz NVML read."""
    path = tmp_path / "test_x.toml"
    measured = bl.Measured(TIMES[3], bl.Samples(TIMES), 0.0, 0.1, 0.02, 0.0, 1560)
    bl.save_test(path, "m.py", "t", [bl.SaveEntry(CPU, {
        "w.time_s": bl.StoredMetric("s", False, measured)})], saved_at=STAMP)
    assert "gpu_held = 0.0, gpu_sm_clock_mhz = 1560}" in path.read_text()
    file = bl.load(path)
    assert file is not None
    stored = file.metrics("t", bl.environment_id(CPU))
    assert stored is not None and stored["w.time_s"].measured.sm_clock_mhz == 1560


@pytest.mark.parametrize("test", ['test_a["quoted"]', "test_b[a\\b]", "test_c[é\t\x7f]",
                                  "TestD::test_e[1-2]"])
def test_odd_test_names_round_trip(tmp_path: Path, test: str) -> None:
    path = tmp_path / "test_x.toml"
    entries = judged(None, [Metric("w.time_s", TIMES[3], "s", False, TIMES)], CPU,
                     save=True, test=test).save_entries()
    bl.save_test(path, "m.py", test, entries, saved_at=STAMP)
    file = bl.load(path)
    assert file is not None and file.tests() == [test]
    assert file.metrics(test, bl.environment_id(CPU)) is not None


# -- what a save says moved -----------------------------------------------------------------
def step(slower: float = 1.0, calls: float = 2.0, extra: bool = False,
         compute: bool = True) -> list[Metric]:
    out = [Metric("step_time_s", TIMES[10] * slower, "s", False,
                  tuple(v * slower for v in TIMES)),
           Metric("comm.all_reduce.calls", calls, "calls/step", False, kind=EXACT)]
    if compute:
        out.append(Metric("compute_time_s", TIMES[10], "s", False, TIMES))
    if extra:  # a collective not issued before (0 then), and a new metric
        out += [Metric("comm.barrier.calls", 1.0, "calls/step", False, kind=EXACT),
                Metric("load.time_s", TIMES[10], "s", False, TIMES)]
    return out


@pytest.fixture(scope="module")
def resaved(tmp_path_factory: pytest.TempPathFactory) -> list[Verdict]:
    """A re-save where the step is 30% slower, the all-reduces went from 2 to 3 a step, a
    barrier call and a load time are new and the compute time is no longer measured."""
    path = tmp_path_factory.mktemp("moved") / "test_x.toml"
    bl.save_test(path, "m.py", "t", judged(None, step(), CPU, save=True,
                                           test="t").save_entries(), saved_at=STAMP)
    file = bl.load(path)
    return list(judged(file, step(1.3, 3.0, extra=True, compute=False), CPU, save=True,
                       test="t").verdicts())


def test_a_save_says_what_moved_past_its_tolerance(resaved: list[Verdict]) -> None:
    rows = {v.metric: report.moved_row(v) for v in report.moved(resaved)}
    assert set(rows) == {"step_time_s", "comm.all_reduce.calls", "comm.barrier.calls",
                         "load.time_s", "compute_time_s"}
    assert rows["step_time_s"][2].startswith("+30.0%, tolerance 10%")
    assert rows["comm.all_reduce.calls"] == ("2 calls/step", "3 calls/step",
                                             "+1, exact tolerance 0")
    assert rows["comm.barrier.calls"] == ("0 calls/step", "1 calls/step",
                                          "+1, exact tolerance 0")
    assert rows["load.time_s"][0] == "new"
    assert rows["compute_time_s"][1] == "gone"
    unchanged = judged(None, step(), CPU, save=True, test="t")
    first = report.moved(unchanged.verdicts())  # nothing before: all new, said in one line
    assert {report.moved_row(v)[0] for v in first} == {"new"} and len(first) == 3
    lines = report.moved_lines([TestRecord("m.py::t", 2, verdicts=unchanged.verdicts())])
    assert lines[1:] == [f"  m.py::t  [{bl.environment_id(CPU)}]  new: 3 metric(s)"]


def test_the_terminal_and_the_markdown_show_the_same_table(resaved: list[Verdict]) -> None:
    record = TestRecord("m.py::t", 2, verdicts=resaved)
    quiet = TestRecord("m.py::u", 2, verdicts=[
        Verdict("x.time_s", "saved", "e", "s", False, 0.020, 0.0201, 0.005, tolerance=0.1)])
    text = "\n".join(line.text for line in report.summary([record, quiet], quiet=True))
    assert "what moved" in text
    assert "m.py::t  [" in text and "load.time_s" in text and "new -> 20.2 ms" in text
    assert "compute_time_s" in text and "20.2 ms -> gone" in text
    assert "1 test(s) saved with nothing moved past its tolerance" in text
    md = markdown.markdown_summary([record, quiet], header="h")
    assert "| test | metric | old | new | change |" in md
    assert "| `m.py::t` | `comm.all_reduce.calls` | 2 calls/step | 3 calls/step |" in md
    assert "| `m.py::t` | `compute_time_s` |" in md and "| gone |" in md
