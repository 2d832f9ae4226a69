"""Baseline storage, the verdict statistics and the noise probe: pure unit tests (no ranks)."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import random
import re
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tomli_w

from pytest_distperf import verdict as bl
from pytest_distperf.config import DEFAULT_SAVE_MEASUREMENTS
from pytest_distperf.records import (
    EXACT,
    Environment,
    Measured,
    Measurement,
    Metric,
    Samples,
    TestRecord,
    Verdict,
    from_dict,
    to_dict,
)
from pytest_distperf.report import terminal as report
from pytest_distperf.verdict import judgement as jm
from pytest_distperf.verdict import readings, rule, stats
from pytest_distperf.verdict.measurements import figures, measured_of, noise_of, pooled
from pytest_distperf.verdict.noise import NoiseFigures, Snapshot, between

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CPU = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "")
CPU4 = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 4, "2.13.0+cpu", "")
H100 = Environment("nccl", "cuda", "NVIDIA H100 80GB HBM3", 8, 8, "2.6.0+cu124", "2.21.5")
QUIET = NoiseFigures(1.0, 0.05, 0.08)
#: Another process took 40% of the machine while the ranks waited: too noisy to judge.
BUSY = NoiseFigures(1.0, 0.02, 0.60, 0.40)
BUSY_REASON = "other processes used 40% of the CPUs > 10%, the ranks waiting 60%"
TIMES = tuple(0.020 + 0.0002 * i for i in range(20))  # 20.0 .. 23.8 ms
#: Measurements a regression needs: the test's own and every confirmation.
REG = rule._CONFIRMATIONS + 1


def scaled(factor: float, samples: tuple[float, ...] = TIMES) -> tuple[float, ...]:
    return tuple(v * factor for v in samples)


def stored(samples: tuple[float, ...] = TIMES, unit: str = "s", hib: bool = False,
           value: float | None = None) -> bl.StoredMetric:
    return bl.StoredMetric(unit, hib, Measured(
        samples[len(samples) // 2] if value is None else value, Samples(samples)))


def window(samples: tuple[float, ...], noise: NoiseFigures | None = QUIET,
           value: float | None = None) -> Measured:
    """One measurement of ``samples``, with the noise probe's figures ``noise``."""
    return Measured(samples[len(samples) // 2] if value is None and samples else value or 0.0,
                    Samples(samples), *figures(noise))


def stored_with(unit: str, hib: bool, value: float, samples: tuple[float, ...],
                control: tuple[float, ...] = (), memory: tuple[float, ...] = (),
                sizes: tuple[int, ...] = ()) -> bl.StoredMetric:
    """A baseline of ``samples`` with their controls (``sizes``: pooled measurements)."""
    return bl.StoredMetric(unit, hib, Measured(value, Samples(samples, control, memory, sizes)))


def without_memory(base: bl.StoredMetric) -> bl.StoredMetric:
    """``base`` as saved before the memory control."""
    samples = dataclasses.replace(base.samples, memory_control=())
    return dataclasses.replace(base, measured=dataclasses.replace(base.measured,
                                                                  samples=samples))


def point(value: float, noise: NoiseFigures | None = QUIET) -> Measured:
    """A measurement of a figure without samples."""
    return Measured(value, Samples(), *figures(noise))


# -- names and places ------------------------------------------------------------------------
@pytest.mark.parametrize(("nodeid", "path", "test"), [
    ("tests/test_x.py::test_a", "tests/test_x.toml", "test_a"),
    ("test_x.py::TestA::test_b[1-x]", "test_x.toml", "TestA::test_b[1-x]"),
    ("../other/test_y.py::test_c", "__/other/test_y.toml", "test_c"),
])
def test_one_file_per_module(tmp_path: Path, nodeid: str, path: str, test: str) -> None:
    assert bl.baseline_path(tmp_path, nodeid) == tmp_path / path
    assert bl.split_nodeid(nodeid)[1] == test


def test_environment_ids_keep_hardware_apart() -> None:
    assert bl.environment_id(CPU) == "gloo-cpu-w2-torch2.13.0-amd-epyc-7r13"
    assert bl.environment_id(H100) == "nccl-cuda-w8-torch2.6.0-nccl2.21.5-nvidia-h100-80gb-hbm3"
    a100 = Environment("nccl", "cuda", "NVIDIA A100-SXM4-80GB", 8, 8, "2.6.0+cu124", "2.21.5")
    two = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
    sixteen = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 16, 8)
    assert bl.environment_id(sixteen) == "gloo-cpu-w2-c16t8-torch2.13.0-amd-epyc-7r13"
    bound = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1, 1)
    assert bl.environment_id(bound) == "gloo-cpu-w2-c2t1b1-torch2.13.0-amd-epyc-7r13"
    ids = {bl.environment_id(e) for e in (CPU, CPU4, H100, a100, two, sixteen, bound)}
    assert len(ids) == 7


def test_a_baseline_from_before_core_counts_is_read_and_not_compared(tmp_path: Path) -> None:
    """A file written before environments had core counts is valid; its baselines are
    not compared with a runner whose cores are known, and the verdict says why."""
    path = tmp_path / "test_x.toml"
    save(path, "test_a", CPU, **{"w.time_s": stored()})
    text = path.read_text()
    old = (text.replace("cpu_cores = 0\n", "").replace("threads_per_rank = 0\n", "")
           .replace("bound_cores = 0\n", ""))
    assert old != text
    path.write_text(old)
    file = bl.load(path)
    assert file is not None
    assert bl.same_environment(file.environments()[bl.environment_id(CPU)], CPU) == ""
    counted = Environment("gloo", "cpu", "AMD EPYC 7R13", 0, 2, "2.13.0+cpu", "", 2, 1)
    differs = bl.same_environment(file.environments()[bl.environment_id(CPU)], counted)
    assert differs == "cpu_cores 0 there, 2 here; threads_per_rank 0 there, 1 here"


# -- the file: round trip, ordering, merging -------------------------------------------------
def save(path: Path, test: str, env: Environment, **metrics: bl.StoredMetric) -> None:
    bl.save_test(path, "tests/test_x.py", test, [bl.SaveEntry(env, metrics)],
                 saved_at="2025-01-02T03:04:05Z")


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "b" / "test_x.toml"
    metric = stored(TIMES)
    save(path, "test_a", CPU, **{"work.time_s": metric})
    loaded = bl.load(path)
    assert loaded is not None
    env_id = bl.environment_id(CPU)
    got = loaded.metrics("test_a", env_id)
    assert got is not None
    assert got["work.time_s"].samples.values == pytest.approx(TIMES)
    assert got["work.time_s"].unit == "s" and not got["work.time_s"].higher_is_better
    text = path.read_text()
    assert text.startswith("schema_version = 2\nmodule = \"tests/test_x.py\"\n")
    assert "pickle" not in text and "values = [" in text


def test_saving_is_stable_and_sorted(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    save(path, "test_b", CPU, **{"z.time_s": stored(), "a.time_s": stored()})
    save(path, "test_a", CPU, **{"m.time_s": stored()})
    first = path.read_bytes()
    save(path, "test_a", CPU, **{"m.time_s": stored()})  # the same again: no diff at all
    assert path.read_bytes() == first
    text = first.decode()
    assert text.index("[tests.test_a.") < text.index("[tests.test_b.")
    assert text.index('"a.time_s" = {') < text.index('"z.time_s" = {')


def test_saving_merges_and_keeps_the_thresholds_table(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    save(path, "test_a", CPU, **{"w.time_s": stored()})
    save(path, "test_b", CPU, **{"w.time_s": stored()})
    data = tomllib.loads(path.read_text())
    data["environments"][bl.environment_id(CPU)]["thresholds"] = {"max_imbalance": 0.2,
                                                                  "tolerance": 0.15}
    path.write_text(tomli_w.dumps(data))
    save(path, "test_a", CPU4, **{"w.time_s": stored()})  # another environment
    save(path, "test_a", CPU, **{"w.time_s": stored(scaled(1.5))})  # a re-save
    loaded = bl.load(path)
    assert loaded is not None
    assert loaded.test_environments("test_a") == sorted(
        [bl.environment_id(CPU), bl.environment_id(CPU4)])
    assert loaded.metrics("test_b", bl.environment_id(CPU)) is not None
    assert loaded.thresholds(bl.environment_id(CPU)) == {"max_imbalance": 0.2, "tolerance": 0.15}
    got = loaded.metrics("test_a", bl.environment_id(CPU))
    assert got is not None and got["w.time_s"].samples.values[0] == pytest.approx(0.030)


def _save_many(args: tuple[str, int]) -> None:
    path, worker = args
    for i in range(15):
        save(Path(path), f"test_{worker}_{i}", CPU, **{"w.time_s": stored()})


def test_concurrent_saves_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        pool.map(_save_many, [(str(path), w) for w in range(4)])
    loaded = bl.load(path)
    assert loaded is not None
    assert len(loaded.data["tests"]) == 60
    assert not [p for p in tmp_path.iterdir() if p.name != "test_x.toml"]  # no temp left over


# -- bad files: refused with file and line, never changed ------------------------------------
GOOD_HEAD = 'schema_version = 1\nmodule = "tests/test_x.py"\n'
BAD_FILES = {
    "empty": ("", 1, "empty"),
    "blank": ("\n  \n", 1, "empty"),
    "corrupt": (GOOD_HEAD + "[tests\nx = 1\n", 3, "not valid TOML"),
    "binary": (GOOD_HEAD + "# \udcff\n", None, ""),
    "foreign": ('[tool.black]\nline-length = 88\n', 1, "not a pytest-distperf baseline"),
    "stale": ("schema_version = 0\n", 1, "stale schema version 0"),
    "newer": ("module = 'x'\nschema_version = 7\n", 2, "newer pytest-distperf"),
    "bad_metric": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\ndevice_type = "cpu"\n'
                   'device_model = "m"\ndevice_count = 0\nworld_size = 2\n'
                   'torch_version = "2"\nnccl_version = ""\n'
                   '[tests.t.e.metrics."w.time_s"]\nunit = "s"\nhigher_is_better = "no"\n'
                   'value = 1.0\n', 13, "higher_is_better must be true or false"),
    "unknown_env": (GOOD_HEAD + '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n', 3,
                    "not described under [environments]"),
    "bad_threshold": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\ndevice_type = "cpu"\n'
                      'device_model = "m"\ndevice_count = 0\nworld_size = 2\n'
                      'torch_version = "2"\nnccl_version = ""\n'
                      '[environments.e.thresholds]\nmax_imbalanse = 0.2\n', 12,
                      "unknown threshold 'max_imbalanse'"),
    "percent_tolerance": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                          'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                          'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                          '[environments.e.thresholds]\ntolerance = 10\n', 12,
                          "tolerance is a fraction (0.10 means 10%)"),
    "bad_kind": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\ndevice_type = "cpu"\n'
                 'device_model = "m"\ndevice_count = 0\nworld_size = 2\n'
                 'torch_version = "2"\nnccl_version = ""\n'
                 '[tests.t.e.metrics."w.calls"]\nunit = "calls"\nhigher_is_better = false\n'
                 'value = 1\nkind = "exactly"\n', 15, "kind must be one of 'exact', "),
    "bad_control": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\ndevice_type = "cpu"\n'
                    'device_model = "m"\ndevice_count = 0\nworld_size = 2\n'
                    'torch_version = "2"\nnccl_version = ""\n'
                    '[tests.t.e.metrics."w.time_s"]\nunit = "s"\nhigher_is_better = false\n'
                    'value = 1.0\nsamples = [1.0, 2.0]\ncontrol = [0.5]\n', 16,
                    "control must be a list of positive numbers, one per sample"),
    "bad_memory_control": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                           'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                           'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                           '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                           'higher_is_better = false\nvalue = 1.0\nsamples = [1.0, 2.0]\n'
                           'control = [0.5, 0.5]\nmemory_control = [0.1, -0.1]\n', 17,
                           "memory_control must be a list of positive numbers, one per "
                           "sample"),
    "bad_measurements": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                         'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                         'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                         '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                         'higher_is_better = false\nvalue = 1.0\nsamples = [1.0, 2.0]\n'
                         'measurements = [1, 2]\n', 16,
                         "measurements must list the sizes of the pooled measurements"),
    "negative_time": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                      'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                      'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                      '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                      'higher_is_better = false\nvalue = 1.0\nsamples = [1.0, -2.0]\n', 15,
                      "a time (s) cannot be negative"),
    "bool_measurements": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                          'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                          'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                          '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                          'higher_is_better = false\nvalue = 1.0\nsamples = [1.0, 2.0]\n'
                          'measurements = [true, true]\n', 16,
                          "measurements must list the sizes"),
    "string_measurements": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                            'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                            'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                            '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                            'higher_is_better = false\nvalue = 1.0\nsamples = [1.0, 2.0]\n'
                            'measurements = ["1", "1"]\n', 16,
                            "measurements must list the sizes"),
    "too_deep": (GOOD_HEAD + "x = " + "[" * 5000 + "]" * 5000 + "\n", None,
                 "nested too deeply to read"),
    # found by tests/test_fuzz.py: read, then a save died in a RecursionError
    "deep_dotted_key": (GOOD_HEAD + "x." + "a." * 3000 + "b = 1\n", 3,
                        "nested too deeply to read"),
    "deep_but_readable": (GOOD_HEAD + "x = " + "[" * 100 + "]" * 100 + "\n", None,
                          "nested too deeply to read"),
    # found by tests/test_fuzz.py: a raw ValueError, then OverflowErrors
    "too_many_digits": (GOOD_HEAD + "x = 1" + "0" * 5000 + "\n", 3,
                        "a number of more than 4300 digits"),
    "huge_value": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\n'
                   'device_type = "cpu"\ndevice_model = "m"\ndevice_count = 0\n'
                   'world_size = 2\ntorch_version = "2"\nnccl_version = ""\n'
                   '[tests.t.e.metrics."w.time_s"]\nunit = "s"\n'
                   'higher_is_better = false\nvalue = 1' + "0" * 400 + "\n", 14,
                   "value must be a finite number, got 1000"),
    "huge_threshold": (GOOD_HEAD + '[environments.e]\nbackend = "gloo"\ndevice_type = "cpu"\n'
                       'device_model = "m"\ndevice_count = 0\nworld_size = 2\n'
                       'torch_version = "2"\nnccl_version = ""\n'
                       '[environments.e.thresholds]\nmax_imbalance = 1' + "0" * 400 + "\n", 12,
                       "max_imbalance must be a number >= 0, got 1000"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_files_are_refused_and_left_unchanged(tmp_path: Path, kind: str) -> None:
    text, line, words = BAD_FILES[kind]
    path = tmp_path / "test_x.toml"
    raw = text.encode("utf-8", "surrogateescape")
    path.write_bytes(raw)
    with pytest.raises(bl.BaselineError) as info:
        bl.load(path)
    message = str(info.value)
    assert str(path) in message and words in message
    if line is not None:
        assert f"{path}:{line}:" in message
    with pytest.raises(bl.BaselineError):
        save(path, "test_a", CPU, **{"w.time_s": stored()})
    assert path.read_bytes() == raw
    assert [p.name for p in tmp_path.iterdir()] == ["test_x.toml"]


def test_a_bad_file_is_one_line_of_error_whatever_its_keys_hold(tmp_path: Path) -> None:
    """Found by tests/test_fuzz.py: a test name with a newline split the error in two."""
    path = tmp_path / "test_x.toml"
    path.write_text(BAD_FILES["bad_metric"][0].replace("[tests.t.", '[tests."a\\nb".'))
    with pytest.raises(bl.BaselineError) as info:
        bl.load(path)
    assert "\n" not in str(info.value) and "metric 'a\\nb' / e / w.time_s" in str(info.value)


# -- statistics ------------------------------------------------------------------------------
def test_mann_whitney_matches_the_textbook() -> None:
    # exact: one ordering in C(10, 5) = 252 puts every x above every y
    assert bl.mann_whitney_greater([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1 / 252)
    assert bl.mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == 1.0
    assert bl.mann_whitney_greater([1.0] * 6, [1.0] * 6) == 0.5  # all tied: no evidence


@pytest.mark.parametrize(("nx", "ny"), [(1, 1), (3, 2), (5, 5), (4, 9), (10, 10), (7, 20),
                                        (25, 25), (50, 50), (60, 60)])
def test_mann_whitney_agrees_with_scipy(nx: int, ny: int) -> None:
    """Exact without ties up to _EXACT_PAIRS pairs, asymptotic (tie and continuity
    corrections) beyond them and with ties: scipy's own methods, to rounding."""
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(nx * 100 + ny)
    for shift in (0.0, 0.5, 1.5):
        x = [rng.gauss(shift, 1) for _ in range(nx)]
        y = [rng.gauss(0, 1) for _ in range(ny)]
        method = "exact" if nx * ny <= stats._EXACT_PAIRS else "asymptotic"
        want = scipy_stats.mannwhitneyu(x, y, alternative="greater", method=method).pvalue
        assert bl.mann_whitney_greater(x, y) == pytest.approx(want, rel=1e-9, abs=1e-300)
        tied = [round(v, 1) for v in x], [round(v, 1) for v in y]
        want = scipy_stats.mannwhitneyu(*tied, alternative="greater",
                                        method="asymptotic").pvalue
        if len(set(tied[0] + tied[1])) < nx + ny:  # ties: the normal approximation
            assert bl.mann_whitney_greater(*tied) == pytest.approx(want, rel=1e-9)


def test_estimate_takes_the_side_noise_cannot_reach() -> None:
    stalled = (*TIMES[:-1], 0.5)  # one iteration hit by a 500 ms stall
    # 20 samples: the second-fastest (the 5% quantile would be 0.02019, mostly the fastest)
    assert bl.estimate(stalled, 0.0214, False, False) == pytest.approx(0.0202)
    gbps = tuple(10.0 + 0.1 * i for i in range(20))
    collapsed = (0.5, *gbps[1:])  # a bandwidth sample that noise pushed down
    assert bl.estimate(collapsed, 11.0, True, False) == pytest.approx(11.8)  # second-best
    assert bl.estimate(stalled, 0.3, False, True) == 0.3  # a fraction: its own value
    assert bl.estimate(stalled[:3], 0.7, False, False) == 0.7  # too few samples: the value


def decide(base: bl.StoredMetric, *wins: Measured, tolerance: float = 0.10,
           can_confirm: bool = True) -> tuple[str, bl.Assessment, str, bool]:
    return bl.decide(base, list(wins), tolerance, can_confirm=can_confirm)


def test_the_same_work_is_unchanged() -> None:
    verdict, a, _, more = decide(stored(), window(scaled(1.01)))
    assert (verdict, more) == (bl.UNCHANGED, False)
    assert a.change == pytest.approx(0.01, abs=1e-6)


def test_a_regression_needs_every_confirmation() -> None:
    wins = [window(scaled(2.0))] * (REG - 1) + [window(scaled(1.9))]
    for n in range(1, REG):
        verdict, _, detail, more = decide(stored(), *wins[:n])
        assert (verdict, more) == (bl.INCONCLUSIVE, True) and "confirmation" in detail
    verdict, a, detail, more = decide(stored(), *wins)
    assert (verdict, more) == (bl.REGRESSED, False)
    assert a.change == pytest.approx(0.9, abs=1e-6)  # the best window is reported
    assert f"confirmed by {REG} measurements" in detail
    assert a.p_worse is not None and a.p_worse < 1e-3


def test_a_slow_window_that_was_noise_is_cleared_by_the_confirmation() -> None:
    verdict, _, _, more = decide(stored(), window(scaled(1.8), BUSY), window(scaled(1.0)))
    assert (verdict, more) == (bl.UNCHANGED, False)
    slow_spell = [window(scaled(1.2))] * (REG - 1)  # quiet by the probe, yet slow
    assert decide(stored(), *slow_spell, window(scaled(1.01)))[0] == bl.UNCHANGED


def test_too_noisy_to_tell_is_inconclusive_with_the_figures() -> None:
    wins = [window(scaled(1.8), BUSY) for _ in range(rule._CONFIRM_ROUNDS + 1)]
    verdict, _, detail, more = decide(stored(), *wins[:2])
    assert (verdict, more) == (bl.INCONCLUSIVE, True)
    verdict, _, detail, more = decide(stored(), *wins)
    assert (verdict, more) == (bl.INCONCLUSIVE, False)
    assert detail.startswith(f"inconclusive: too noisy to tell in all {rule._CONFIRM_ROUNDS + 1}"
                             " measurements; rerun on a quieter runner. Noise: ")
    assert BUSY_REASON in detail
    # a GPU held below its clocks makes it noisy too: a throttled step is no regression
    held = NoiseFigures(1.0, 0.0, 0.0, 0.0, held=0.2)
    verdict, _, detail, _ = decide(stored(), *[window(scaled(1.8), held)] * (REG + 1))
    assert verdict == bl.INCONCLUSIVE and "a GPU was held below its clocks" in detail
    # the host's steal and the ranks' wait alone make no measurement noisy
    steal = NoiseFigures(1.0, 0.4, 0.9)
    assert decide(stored(), window(scaled(1.8), steal), can_confirm=False)[0] == bl.REGRESSED
    wide = (*TIMES[:5], *scaled(3.0)[5:])  # the median far from the fast samples
    assert "sample spread" in decide(stored(), window(scaled(1.8, wide)), can_confirm=False)[2]


def test_a_metric_that_always_spreads_is_judged_against_its_own_spread() -> None:
    wide = (0.010,) * 8 + (0.025,) * 12  # like a gloo all-reduce's calls, quiet or not
    assert bl.spread(wide, False) == pytest.approx(1.5)  # > SPREAD_LIMIT
    base = stored(wide)
    assert bl.spread_limit([wide], False) == pytest.approx(
        rule._SPREAD_RATIO * bl.spread(wide, False))
    assert bl.spread_limit([TIMES, TIMES], False) == rule._SPREAD_LIMIT  # a steady metric's
    assert bl.spread_limit([], False) == rule._SPREAD_LIMIT
    # as spread as ever and twice as slow: a regression, not "too noisy to tell"
    verdict, _, detail, _ = decide(base, *[window(scaled(2.0, wide))] * REG)
    assert verdict == bl.REGRESSED, detail
    assert decide(base, window(wide), can_confirm=False)[0] == bl.UNCHANGED
    # far past its usual spread (another process's time slices): too noisy all the same
    wider = (0.018,) * 4 + (0.09,) * 16
    verdict, _, detail, _ = decide(base, window(wider), can_confirm=False)
    assert verdict == bl.INCONCLUSIVE and "sample spread" in detail


def test_not_statistically_clear_is_inconclusive() -> None:
    base = stored((0.010,) * 5 + (1.0,) * 15)  # fast estimate, but most samples slow
    verdict, _, detail, _ = decide(base, *[window(TIMES)] * REG)
    assert verdict == bl.INCONCLUSIVE and "not statistically clear" in detail


def test_faster_is_improved_without_confirmation() -> None:
    verdict, a, detail, more = decide(stored(), window(scaled(0.5)))
    assert (verdict, more) == (bl.IMPROVED, False) and "re-save" in detail
    assert a.p_better is not None and a.p_better < 1e-3


@pytest.mark.parametrize(("factor", "verdict"), [(0.5, bl.REGRESSED), (2.0, bl.IMPROVED),
                                                 (0.98, bl.UNCHANGED)])
def test_higher_is_better_is_judged_the_other_way(factor: float, verdict: str) -> None:
    gbps = tuple(10.0 + 0.1 * i for i in range(20))
    base = stored(gbps, unit="GB/s", hib=True)
    assert decide(base, *[window(scaled(factor, gbps))] * REG)[0] == verdict


@pytest.mark.parametrize(("before", "after", "verdict"), [
    (0.02, 0.04, bl.UNCHANGED),  # +100% but 2 points: no regression
    (0.10, 0.30, bl.REGRESSED),
    (0.00, 0.20, bl.REGRESSED),  # from zero: judged in points alone
    (0.90, 0.60, bl.IMPROVED),
])
def test_fractions_are_judged_in_points_as_well(before: float, after: float,
                                                verdict: str) -> None:
    base = stored((), unit="fraction", value=before)
    got, a, _, _ = decide(base, *[point(after)] * REG)
    assert got == verdict
    assert a.p_worse is None  # no samples: point estimates and confirmation only


def test_a_fraction_is_confirmed_by_its_median_measurement() -> None:
    """A time's confirmation keeps its best measurement (noise only slows it down); a
    fraction's its median one (the lower middle of an even count): one low reading in four
    no longer clears a communication share that three of them put past the line."""
    base = stored((), unit="fraction", value=0.15)
    wins = [point(v) for v in (0.22, 0.14, 0.23, 0.24)]
    verdict, a, _, _ = decide(base, *wins)
    assert verdict == bl.REGRESSED and a.current == 0.22  # 0.14 < [0.22] < 0.23 < 0.24
    wins = [point(v) for v in (0.22, 0.14, 0.15, 0.24)]
    assert decide(base, *wins)[0] == bl.UNCHANGED  # two of four near the baseline
    # a time: the best measurement clears it
    times = [window(scaled(f)) for f in (1.3, 1.0, 1.3, 1.3)]
    assert decide(stored(), *times)[0] == bl.UNCHANGED


def test_tolerance_sets_the_line_and_tiny_deltas_never_count() -> None:
    """Issue 46: a confirmed change larger than the tolerance fails, a smaller one passes."""
    wins = [window(scaled(1.12))] * REG
    assert decide(stored(), *wins, tolerance=0.10)[0] == bl.REGRESSED  # past 10%
    assert decide(stored(), *wins, tolerance=0.15)[0] == bl.UNCHANGED
    assert decide(stored(), *[window(scaled(1.05))] * REG, tolerance=0.10)[0] == bl.UNCHANGED
    assert decide(stored(), *[window(scaled(1.35))] * REG, tolerance=0.10)[0] == bl.REGRESSED
    micro = tuple(1e-6 + 1e-9 * i for i in range(20))
    assert decide(stored(micro), *[window(scaled(2.0, micro))] * REG)[0] == bl.UNCHANGED


# -- one test's judgement --------------------------------------------------------------------
def judgement(file: bl.BaselineFile | None, *metrics: Metric, save: bool = False,
              env: Environment = CPU) -> Any:
    measured = Measurement("measure(w)", metrics, None, lambda: list(metrics))
    return bl.make_judgement(save=save, measurements=[measured], environment=env,
                             first_noise=QUIET, tolerance=0.10, baseline=file, test="test_a")


def test_judgement_asks_for_confirmation_then_decides(tmp_path: Path) -> None:
    path = tmp_path / "test_x.toml"
    save(path, "test_a", CPU, **{"w.time_s": stored()})
    file = bl.load(path)
    slow = Metric("w.time_s", 0.04, "s", False, scaled(2.0))
    j = judgement(file, slow)
    for i in range(rule._CONFIRMATIONS):
        assert j.wanted() == ["measure(w)"] and j.backoff() == jm._CONFIRM_PAUSES_S[i]
        j.add_measurement("measure(w)", [slow], QUIET)
    assert j.wanted() == [] and j.backoff() == 0.0
    (verdict,) = j.verdicts()
    assert verdict.verdict == bl.REGRESSED and verdict.measurement_count == REG
    assert verdict.confidence is not None and verdict.confidence > 0.99
    saving = judgement(file, slow, save=True)
    assert saving.backoff() == jm._SAVE_PAUSE_S
    saving.measured["w.time_s"][0] = window(scaled(2.0), BUSY, 0.04)
    assert saving.backoff() == max(jm._NOISY_BACKOFF_S[0], jm._SAVE_PAUSE_S)


def test_settle_enters_each_round_and_counts_its_start_towards_the_pause(
        tmp_path: Path) -> None:
    """settle() wraps every round of re-measurements in ``each_round(labels)`` (where the
    plugin starts fresh ranks), re-measures inside it, and sleeps only what is left of the
    pause after the seconds it took."""
    import contextlib

    path = tmp_path / "test_x.toml"
    save(path, "test_a", CPU, **{"w.time_s": stored()})
    slow = Metric("w.time_s", 0.04, "s", False, scaled(2.0))
    j = judgement(bl.load(path), slow)
    events: list[Any] = []

    @contextlib.contextmanager
    def each_round(labels: list[str]) -> Any:
        events.append(("enter", tuple(labels)))
        yield 0.75  # seconds spent getting ready
        events.append(("exit",))

    def remeasure(label: str) -> Any:
        events.append(("measure", label))
        return [slow], QUIET

    bl.settle(j, remeasure, sleep=lambda s: events.append(("sleep", s)),
              each_round=each_round)
    expected = []
    for pause in jm._CONFIRM_PAUSES_S[:rule._CONFIRMATIONS]:
        expected += [("enter", ("measure(w)",)), ("sleep", max(0.0, pause - 0.75)),
                     ("measure", "measure(w)"), ("exit",)]
    assert events == expected
    assert j.verdicts()[0].verdict == bl.REGRESSED


def test_judgement_without_a_baseline_passes_and_says_why(tmp_path: Path) -> None:
    metric = Metric("w.time_s", 0.02, "s", False, TIMES)
    (v,) = judgement(None, metric).verdicts()
    assert v.verdict == bl.NO_BASELINE and "--distperf-save" in v.detail
    path = tmp_path / "test_x.toml"
    save(path, "test_a", CPU4, **{"w.time_s": stored()})
    (v,) = judgement(bl.load(path), metric).verdicts()  # only another environment is stored
    assert v.verdict == bl.NOT_COMPARABLE and bl.environment_id(CPU4) in v.detail
    save(path, "test_a", CPU, **{"other.time_s": stored()})
    (v,) = judgement(bl.load(path), metric).verdicts()
    assert v.verdict == bl.NO_BASELINE and "new metric" in v.detail
    save(path, "test_a", CPU, **{"w.time_s": stored(unit="ms")})
    j = judgement(bl.load(path), metric)
    assert j.wanted() == []
    (v,) = j.verdicts()
    assert v.verdict == bl.NOT_COMPARABLE and "changed meaning" in v.detail


def test_a_metric_that_is_not_a_number_is_neither_compared_nor_saved() -> None:
    good = Metric("w.time_s", 0.02, "s", False, (*TIMES[:-1], float("inf")))
    bad = Metric("eff", float("nan"), "fraction", True)
    j = judgement(None, good, bad, save=True)
    j.add_measurement("measure(w)", [good], QUIET)
    (entry,) = j.save_entries()
    assert list(entry.metrics) == ["w.time_s"]
    assert entry.metrics["w.time_s"].samples.values == TIMES[:-1]
    verdicts = {v.metric: v for v in j.verdicts()}
    assert verdicts["eff"].verdict == bl.NOT_COMPARABLE and "not saved" in verdicts["eff"].detail
    assert verdicts["w.time_s"].verdict == bl.SAVED


def test_saving_keeps_the_best_window(tmp_path: Path) -> None:
    first = Metric("w.time_s", 0.03, "s", False, scaled(1.5))
    j = judgement(None, first, save=True)
    for i in range(1, jm._SAVE_MEASUREMENTS):
        assert j.wanted() == ["measure(w)"]
        factor = 1.0 if i == 2 else 1.3
        j.add_measurement("measure(w)", [Metric("w.time_s", 0.02, "s", False, scaled(factor))],
                     QUIET)
    assert j.wanted() == []
    (entry,) = j.save_entries()
    assert entry.metrics["w.time_s"].samples.values == TIMES
    (v,) = j.verdicts()
    assert v.verdict == bl.SAVED and f"best of {jm._SAVE_MEASUREMENTS}" in v.detail
    spell = judgement(None, Metric("w.time_s", 0.02, "s", False, TIMES), save=True)
    mixed = (0.0195, 0.0195, *scaled(1.25)[2:])  # a slow spell with a fast moment in it
    for _ in range(1, jm._SAVE_MEASUREMENTS):
        spell.add_measurement("measure(w)", [Metric("w.time_s", 0.025, "s", False, mixed)], QUIET)
    (entry,) = spell.save_entries()
    assert entry.metrics["w.time_s"].samples.values == TIMES  # not the one with the fastest samples
    noisy = judgement(None, Metric("w.time_s", 0.02, "s", False, TIMES), save=True)
    noisy.measured["w.time_s"][0] = window(TIMES, BUSY, 0.02)
    for _ in range(jm._SAVE_MAX_MEASUREMENTS - 1):
        assert noisy.wanted() == ["measure(w)"]
        noisy.add_measurement("measure(w)", [Metric("w.time_s", 0.02, "s", False, scaled(1.1))],
                         BUSY)
    assert noisy.wanted() == []
    (v,) = noisy.verdicts()
    assert f"saved from a noisy measurement ({BUSY_REASON})" in v.detail
    counted = judgement(None, Metric("comm.all_reduce.calls", 1.0, "calls/step", False, (1.0,),
                                     kind=EXACT), save=True)
    counted.measured["comm.all_reduce.calls"][0] = window((1.0,), BUSY, 1.0)
    (v,) = counted.verdicts()
    assert v.verdict == bl.SAVED and "noisy" not in v.detail  # a count needs no quiet host


def test_a_save_judges_a_spread_against_its_own_measurements() -> None:
    """A metric whose every measurement spreads past SPREAD_LIMIT (a gloo all-reduce's
    calls) is saved from SAVE_WINDOWS quiet measurements, not flagged noisy and measured
    SAVE_MAX_WINDOWS times; one that spreads far past its siblings is still noisy."""
    wide = (0.010,) * 8 + (0.025,) * 12  # spread 150%
    j = judgement(None, Metric("w.time_s", 0.025, "s", False, wide), save=True)
    for _ in range(1, jm._SAVE_MEASUREMENTS):
        j.add_measurement("measure(w)", [Metric("w.time_s", 0.025, "s", False, wide)], QUIET)
    assert j.wanted() == []
    (v,) = j.verdicts()
    assert v.verdict == bl.SAVED and "noisy" not in v.detail
    assert j.trusted("w.time_s", window(wide, QUIET, 0.025))
    assert not j.trusted("w.time_s", window((0.010,) * 4 + (0.09,) * 16, QUIET, 0.09))


def test_saving_keeps_the_median_window_of_a_fraction() -> None:
    """A fraction has no good side: the save keeps its median measurement (the lower middle
    one of four), where the best of four sat at the low end of its spread."""
    def overhead(value: float) -> Metric:
        return Metric("comm_overhead", value, "fraction", False, tuple([value] * 20))

    j = judgement(None, overhead(0.30), save=True)
    for value in (0.10, 0.20, 0.40):
        assert j.wanted() == ["measure(w)"]
        j.add_measurement("measure(w)", [overhead(value)], QUIET)
    assert j.wanted() == []
    (entry,) = j.save_entries()
    assert entry.metrics["comm_overhead"].value == 0.20  # 0.10 < [0.20] < 0.30 < 0.40
    (v,) = j.verdicts()
    assert f"median of {jm._SAVE_MEASUREMENTS}" in v.detail
    # the better direction for a fraction where higher is better
    eff = judgement(None, Metric("eff", 0.5, "fraction", True, tuple([0.5] * 20)), save=True)
    for value in (0.9, 0.7, 0.6):
        eff.add_measurement("measure(w)", [Metric("eff", value, "fraction", True,
                                             tuple([value] * 20))], QUIET)
    (entry,) = eff.save_entries()
    assert entry.metrics["eff"].value == 0.7  # 0.9 > [0.7] > 0.6 > 0.5


# -- the host-speed control -----------------------------------------------------------------
CONTROL = tuple(0.0025 + 0.00001 * (i % 7) for i in range(20))  # 2.50 .. 2.56 ms, jittered
#: Measurements a controlled regression needs: the test's own and the re-measurements.
CREG = rule._CONTROL_MEASUREMENTS
#: The host's speed during each of a baseline's measurements (1.1: everything 10% slower).
HOST = (0.9, 1.0, 1.1, 0.95, 1.05, 1.15)


MEMORY = tuple(0.0009 + 0.00001 * (i % 5) for i in range(20))  # the memory control, ~0.9 ms


def controlled(samples: tuple[float, ...] = TIMES, control: tuple[float, ...] = CONTROL,
               noise: NoiseFigures | None = QUIET,
               memory: tuple[float, ...] = ()) -> Measured:
    return Measured(samples[len(samples) // 2], Samples(samples, control, memory),
                    *figures(noise))


def stored_controlled(follows: float = 1.0, memory: bool = False) -> bl.StoredMetric:
    """A baseline of six measurements at the speeds of HOST, the time following the control
    with slope ``follows`` (1: CPU-bound work; 0: a sleep); ``memory``: with a memory
    control that moved with the host too."""
    samples: list[float] = []
    control: list[float] = []
    mem: list[float] = []
    for h in HOST:
        samples += scaled(h ** follows)
        control += scaled(h, CONTROL)
        mem += scaled(h, MEMORY)
    return stored_with("s", False, TIMES[10], tuple(samples), tuple(control),
                       tuple(mem) if memory else (), (len(TIMES),) * len(HOST))


@pytest.mark.parametrize("follows", [0.0, 0.5, 1.0, 2.0])
def test_the_slope_says_how_strongly_the_time_follows_the_control(follows: float) -> None:
    slope = bl.control_slope(stored_controlled(follows), [controlled()])
    assert slope == pytest.approx(min(follows, 1.0), abs=1e-6)  # clipped to [0, 1]
    flat = stored_with("s", False, TIMES[10], TIMES, CONTROL)  # one measurement
    assert bl.control_slope(flat, [controlled()]) == 0.0  # nothing to fit: the plain rule


def test_a_slower_host_is_not_a_regression_with_the_control() -> None:
    host_slow = controlled(scaled(1.25), scaled(1.25, CONTROL))  # everything 25% slower
    verdict, a, _, more = decide(stored_controlled(), host_slow)
    assert (verdict, more) == (bl.UNCHANGED, False)  # cleared by the first measurement
    assert a.change == pytest.approx(0.0, abs=1e-9) and a.control_slope == pytest.approx(1.0)
    assert a.host_change is not None and a.host_change > 0.15
    # the plain rule cannot tell: without a control the same figures are a suspect
    assert decide(stored(), window(scaled(1.25)))[3] is True


def test_work_that_does_not_follow_the_control_is_not_judged_by_it() -> None:
    """A sleep takes as long on a slow host: dividing by the control would turn the host's
    speed into false regressions and improvements.  On a host that got faster the same
    times could also be work that follows it 1:1 and got slower by as much (BETWEEN_SLOPE):
    never a regression, but not told either; ``control=False`` is for work that waits."""
    verdict, a, _, more = decide(stored_controlled(follows=0.0),
                                 controlled(TIMES, scaled(1.25, CONTROL)))
    assert (verdict, more) == (bl.UNCHANGED, False)
    assert a.control_slope == 0.0 and a.change == pytest.approx(0.0, abs=1e-9)
    faster = controlled(TIMES, scaled(0.8 * 1.025, CONTROL))  # 20% faster than the save
    verdict, a, detail, _ = decide(stored_controlled(follows=0.0), *[faster] * CREG)
    assert verdict == bl.INCONCLUSIVE and a.change == pytest.approx(0.0, abs=1e-9)
    assert detail.startswith("inconclusive: up to 25.0% slower than the baseline, but the host "
                             "ran 20% faster than at the save")
    assert "Readings: +0.0% at the fitted slope (0.00), +25.0% in proportion" in detail


def test_a_host_change_between_the_sides_is_taken_out_at_the_fit_and_in_proportion() -> None:
    """The fit sees the host's moves within each side; between the save and now a time on
    the host's CPU can follow the host 1:1 where the fit says less (R33: fits 0.24-0.46, six
    false alarms in 45 clean runs on a host 7-10% slower).  A verdict must hold at both."""
    base = stored_controlled(follows=0.3)  # within the save, the time followed at 0.3
    # the save's median host is 1.025 (its time 1.025 ** 0.3); now the host is 25% slower
    # and the same work follows it 1:1
    host, time = 1.25 * 1.025, 1.25 * 1.025 ** 0.3
    same = controlled(scaled(time), scaled(host, CONTROL))
    assert bl.control_slope(base, [same]) == pytest.approx(0.3, abs=0.02)
    verdict, a, detail, more = decide(base, *[same] * CREG)
    assert (verdict, more) == (bl.INCONCLUSIVE, False)  # the old rule: a false regression
    assert a.change == pytest.approx(1.25 ** 0.7 - 1, abs=0.005)  # +16.9% at the fit
    assert "the host ran 25% slower than at the save" in detail
    assert "+16.9% at the fitted slope (0.30), +0.0% in proportion" in detail
    # a real slowdown on that host holds at both ends: a regression
    slow = controlled(scaled(time * 1.2), scaled(host, CONTROL))
    verdict, a, detail, _ = decide(base, *[slow] * CREG)
    assert verdict == bl.REGRESSED
    assert "+20.0% in proportion" in detail
    # on a host 25% faster a 25% slowdown reads +6.9% at the fit, +25% in proportion: not
    # cleared early (the screen looks at both ends), then not told
    fast = controlled(scaled(1.025 ** 0.3 / 1.25 * 1.25), scaled(1.025 / 1.25, CONTROL))
    assert decide(base, fast)[3] is True
    verdict, a, detail, _ = decide(base, *[fast] * CREG)
    assert verdict == bl.INCONCLUSIVE and "in proportion" in detail
    # where the host held its speed the two ends agree and nothing changes
    verdict, a, _, more = decide(base, controlled(scaled(1.025 ** 0.3), scaled(1.025, CONTROL)))
    assert (verdict, more) == (bl.UNCHANGED, False) and abs(a.change or 0.0) < 1e-9


def test_a_verdict_must_hold_at_the_slope_the_memory_control_says() -> None:
    """In the host's drifts a training step slowed 1.4-1.6x as much as the compute control,
    the memory control 1.25-1.35x as much (benchmarks/control_tracking.md): a regression or
    an improvement must hold with the host's change taken out at the slope the memory
    control's change says as well (clipped to [1, MEMORY_SLOPE_MAX]), a veto that never
    turns an unchanged run into anything else."""
    assert bl.memory_slope(math.log(1.1), math.log(1.1 ** 1.3)) == pytest.approx(1.3)
    assert bl.memory_slope(math.log(1.1), math.log(1.05)) == 1.0  # moved less: 1:1
    assert bl.memory_slope(math.log(1.1), math.log(0.95)) == 1.0  # the other way
    assert bl.memory_slope(0.0, math.log(1.15)) == 1.0  # a pool's own memory speed
    assert bl.memory_slope(math.log(1.01), math.log(1.15)) == readings._MEMORY_SLOPE_MAX
    base = stored_controlled(memory=True)
    host = 1.025  # the save's median host speed
    # a drift: the compute control 20% slower, the memory control 1.33x that, the time
    # 34.4% slower: +12% with the host's change taken out 1:1
    drift = controlled(scaled(host * 1.344), scaled(host * 1.2, CONTROL),
                       memory=scaled(host * 1.2 ** 1.33, MEMORY))
    verdict, a, detail, _ = decide(base, *[drift] * CREG)
    assert verdict == bl.INCONCLUSIVE and a.change == pytest.approx(0.12, abs=0.005)
    assert "the host's memory ran 27% slower than at the save" in detail
    assert "+5.5% at the memory control's slope (1.33)" in detail
    assert "the memory control 27% slower" in detail
    # without the memory control (a baseline saved before it) the same runs regress
    old = without_memory(base)
    assert decide(old, *[drift] * CREG)[0] == bl.REGRESSED
    # a slowdown of the code on a steady host holds at every end
    slow = controlled(scaled(host * 1.2), scaled(host, CONTROL), memory=scaled(host, MEMORY))
    verdict, _, detail, _ = decide(base, *[slow] * CREG)
    assert verdict == bl.REGRESSED and "+20.0% at the memory control's slope" in detail
    # ... and with one set of processes' memory control 15% slower alone
    odd = controlled(scaled(host * 1.2), scaled(host, CONTROL),
                     memory=scaled(host * 1.15, MEMORY))
    assert decide(base, *[odd] * CREG)[0] == bl.REGRESSED
    # the memory control 15% faster, the time and the compute control as at the save
    same = controlled(scaled(host), scaled(host, CONTROL), memory=scaled(host * 0.85, MEMORY))
    verdict, a, _, more = decide(base, same)
    assert (verdict, more) == (bl.UNCHANGED, False) and abs(a.change or 0.0) < 1e-9
    # an improvement that the host's speed-up explains at the memory control's slope is none
    quick = controlled(scaled(host * 0.688), scaled(host * 0.8, CONTROL),
                       memory=scaled(host * 0.8 ** 1.4, MEMORY))
    assert decide(base, *[quick] * CREG)[0] != bl.IMPROVED
    assert decide(without_memory(base), *[quick] * CREG)[0] \
        == bl.IMPROVED


def test_a_bandwidth_must_hold_in_proportion_to_the_memory_control() -> None:
    """A bandwidth (bytes moved: a gloo collective on CPU copies and adds buffers, as the
    memory control does) must hold with the memory control's change taken out 1:1, even
    where the compute control did not move (R61 in benchmarks/verdict_quality.md)."""
    def rates(factor: float) -> tuple[float, ...]:
        return tuple(4.0 / (t * 100 * factor) for t in TIMES)  # GB/s

    samples: list[float] = []
    control: list[float] = []
    mem: list[float] = []
    for h in HOST:
        samples += rates(h)
        control += scaled(h, CONTROL)
        mem += scaled(h, MEMORY)
    base = stored_with("GB/s", True, rates(1.0)[10], tuple(samples), tuple(control),
                       tuple(mem), (len(TIMES),) * len(HOST))
    host = 1.025
    # the memory control 15% slower, the compute one steady, the bandwidth 13% lower
    slow_memory = controlled(rates(host * 1.15), scaled(host, CONTROL),
                             memory=scaled(host * 1.15, MEMORY))
    verdict, a, detail, _ = decide(base, *[slow_memory] * CREG)
    assert verdict == bl.INCONCLUSIVE and a.change == pytest.approx(1 / 1.15 - 1, abs=0.005)
    assert "+0.0% in proportion to the memory control" in detail
    assert decide(without_memory(base), *[slow_memory] * CREG)[0] \
        == bl.REGRESSED
    # a slower collective with the memory control as at the save: a regression
    slow = controlled(rates(host * 1.2), scaled(host, CONTROL), memory=scaled(host, MEMORY))
    verdict, _, detail, _ = decide(base, *[slow] * CREG)
    assert verdict == bl.REGRESSED and "-16.7% in proportion to the memory control" in detail


def test_a_slowdown_is_caught_with_the_control_after_pooling() -> None:
    base = stored_controlled()
    slow = controlled(scaled(1.2))
    for n in range(1, CREG):
        verdict, _, detail, more = decide(base, *[slow] * n)
        assert (verdict, more) == (bl.INCONCLUSIVE, True) and "confirmation" in detail
    verdict, a, detail, more = decide(base, *[slow] * CREG)
    assert (verdict, more) == (bl.REGRESSED, False)
    assert f"confirmed by {CREG} measurements" in detail
    assert a.change == pytest.approx(0.2, rel=1e-6)
    assert a.current == pytest.approx(a.baseline * 1.2)  # at the baseline's host speed
    assert a.p_worse is not None and a.p_worse < 1e-6
    # half hidden by a faster host: 30% more work, the host 10% faster
    hidden = controlled(scaled(1.3 * 0.9), scaled(0.9, CONTROL))
    verdict, a, _, _ = decide(base, *[hidden] * CREG)
    assert verdict == bl.REGRESSED and a.change == pytest.approx(0.3, rel=1e-6)
    assert a.host_change is not None and a.host_change < -0.05


def test_no_regression_from_the_host_adjustment_alone() -> None:
    """Sentence 10: a time that did not move while its control ran 20% faster is +25% with
    the host's change taken out, and unchanged as measured: the metric may not follow the
    control (micro-work does not), so it is inconclusive, never regressed, and says so."""
    base = stored_controlled()
    unmoved = controlled(TIMES, scaled(0.8, CONTROL))
    verdict, a, detail, _ = decide(base, *[unmoved] * CREG)
    assert verdict == bl.INCONCLUSIVE and a.change == pytest.approx(0.25, rel=1e-6)
    assert re.match(r"inconclusive: 25\.0% slower than the baseline with the host's speed "
                    r"taken out, but -?\d\.\d% as measured: the host ran 22% faster", detail)
    raw = next(r for r in a.readings if r.name == readings.AS_MEASURED)
    assert raw.change is not None and abs(raw.change) < 0.05


def test_a_measurement_slowed_alone_is_set_aside() -> None:
    """One measurement of six at half the speed of its siblings, with its control as quick
    as theirs (R52: a gloo all-reduce's slow regime, which the probe does not see), is set
    aside: the five others say unchanged; so are five of six when the sixth ran that much
    faster (R56).  A slowdown of every measurement is no outlier: still caught, however
    far."""
    base = stored_controlled()
    odd = controlled(scaled(2.0))
    verdict, a, _, _ = decide(base, odd, *[controlled()] * (CREG - 1))
    assert verdict == bl.UNCHANGED and abs(a.change or 0.0) < 1e-9
    assert len(bl.without_outliers([odd, controlled(), controlled()])) == 2
    verdict, a, _, _ = decide(base, *[odd] * (CREG - 1), controlled())
    assert verdict == bl.UNCHANGED and abs(a.change or 0.0) < 1e-9
    # within _OUTLIER_LIMIT of the fastest sibling: kept
    near = controlled(scaled(1 + readings._OUTLIER_LIMIT * 0.9))
    assert len(bl.without_outliers([near, controlled(), controlled()])) == 3
    # slower relative to its own control only: a host that slowed, not an outlier
    host = controlled(scaled(2.0), scaled(2.0, CONTROL))
    assert len(bl.without_outliers([host, controlled(), controlled()])) == 3
    # two measurements say nothing about which is odd
    assert len(bl.without_outliers([odd, controlled()])) == 2
    verdict, a, _, _ = decide(base, *[controlled(scaled(3.0))] * CREG)
    assert verdict == bl.REGRESSED and a.change == pytest.approx(2.0, rel=1e-6)
    # a regression says what it set aside, so that a person can weigh it
    slow = controlled(scaled(1.2))
    verdict, a, detail, _ = decide(base, controlled(scaled(2.4)), *[slow] * (CREG - 1))
    assert verdict == bl.REGRESSED and a.change == pytest.approx(0.2, rel=1e-6)
    assert "1 measurement(s) set aside: 30% or more slower than another" in detail
    assert "set aside" not in decide(base, *[slow] * CREG)[2]


def test_the_control_screens_then_pools() -> None:
    base = stored_controlled()
    line = 0.10
    screen = 0.10 * rule._SCREEN_FRACTION
    assert decide(base, controlled(scaled(1 + screen / 2)))[3] is False  # unchanged at once
    just_over = controlled(scaled(1 + (screen + line) / 2))  # past the screen, under the line
    assert decide(base, just_over)[3] is True
    assert decide(base, *[just_over] * CREG)[0] == bl.UNCHANGED
    # the slow first measurement was a spell: the pooled median is what counts
    spell = [controlled(scaled(1.3))] + [controlled(TIMES)] * (CREG - 1)
    assert decide(base, *spell)[0] == bl.UNCHANGED
    # ... and the screen is sequential: once the pooled measurements are back near the
    # baseline it stops, unchanged, without waiting for all of them
    verdict, _, _, more = decide(base, controlled(scaled(1.3)), controlled(TIMES),
                                 controlled(TIMES))
    assert (verdict, more) == (bl.UNCHANGED, False)
    # a noisy measurement near the baseline stops nothing
    assert decide(base, controlled(scaled(1.3)), controlled(TIMES, noise=BUSY))[3] is True
    # an improvement needs a second measurement that bears it out on its own: one fast
    # measurement is measured again; two fast ones improve; a fast first one that the next
    # ones do not bear out is measured again until the pooled ones are back near the
    # baseline (sooner the less it was off: the pooled 25% quantile): unchanged
    fast = controlled(scaled(0.7))
    assert decide(base, fast)[:4:3] == (bl.INCONCLUSIVE, True)
    assert rule._IMPROVEMENT_MEASUREMENTS == 2
    assert decide(base, fast, fast)[:4:3] == (bl.IMPROVED, False)
    assert decide(base, controlled(TIMES), fast)[:4:3] == (bl.IMPROVED, False)
    assert decide(base, fast, controlled(TIMES))[:4:3] == (bl.INCONCLUSIVE, True)
    fluke = [controlled(scaled(0.9))] + [controlled(TIMES)] * 2
    assert decide(base, *fluke)[:4:3] == (bl.UNCHANGED, False)
    fluke = [fast] + [controlled(TIMES)] * (CREG - 1)
    assert decide(base, *fluke)[:4:3] == (bl.UNCHANGED, False)
    assert decide(base, *[fast] * CREG)[0] == bl.IMPROVED
    assert decide(base, controlled(scaled(0.7)), can_confirm=False)[0] == bl.IMPROVED
    assert decide(base, controlled(scaled(1.2)), can_confirm=False)[0] == bl.REGRESSED


def test_a_change_within_what_the_slope_could_leave_of_the_host_is_not_told() -> None:
    """The further the host ran from the save's speed, the less the fitted slope is to be
    trusted: a change within SLOPE_ERROR x the host's change is inconclusive, with the
    figure; past it, it is judged (a sleep-like 3x slowdown on a slower host, say)."""
    base = stored_controlled()
    host = 1.025 * 1.5  # the baseline's median host is 1.025: the host 50% slower
    line = 0.10
    within = 1 + (line + rule._SLOPE_ERROR * 0.5) / 2  # past the line, within SLOPE_ERROR x 50%
    w = controlled(scaled(host * within), scaled(host, CONTROL))
    verdict, a, detail, more = decide(base, *[w] * CREG)
    assert (verdict, more) == (bl.INCONCLUSIVE, False)
    assert a.host_change == pytest.approx(0.5, abs=0.01)
    assert a.change == pytest.approx(within - 1, rel=1e-6)
    assert detail.startswith("inconclusive: the host ran 50% slower than at the save, enough to "
                             "hide a change this size (+17.5%); rerun on a quieter runner or "
                             "re-save. Readings: ")
    assert f"within {rule._SLOPE_ERROR:g} x the host's change" in detail
    w = controlled(scaled(host / within), scaled(host, CONTROL))  # nor a small improvement
    assert decide(base, *[w] * CREG)[0] == bl.INCONCLUSIVE
    for factor, told in ((1.3, bl.REGRESSED), (0.5, bl.IMPROVED)):  # past it: judged
        w = controlled(scaled(host * factor), scaled(host, CONTROL))
        assert decide(base, *[w] * CREG)[0] == told
    # on a host near the save's speed the same change is a regression
    near = controlled(scaled(1.025 * within), scaled(1.025, CONTROL))
    assert decide(base, *[near] * CREG)[0] == bl.REGRESSED


def test_noisy_measurements_are_left_out_of_the_pool() -> None:
    """Noisy measurements are set aside while a quiet one is left; with none quiet, all of
    them are pooled and judged all the same, but a slowdown seen only in noisy measurements
    is at most inconclusive (noise only slows work down, and micro-work slows under another
    process's load far more than the control does); unchanged and improved still stand."""
    base = stored_controlled()
    busy = controlled(scaled(1.8), noise=BUSY)  # another job: slower, and the probe saw it
    verdict, _, _, _ = decide(base, *[busy] * 2, *[controlled(TIMES)] * (CREG - 2))
    assert verdict == bl.UNCHANGED
    verdict, _, detail, _ = decide(base, *[busy] * CREG)
    assert verdict == bl.INCONCLUSIVE
    assert detail.startswith("inconclusive: 80.0% slower than the baseline, but no "
                             "measurement was quiet enough to call it a regression")
    assert f"Noise: {BUSY_REASON}" in detail
    busy_same = controlled(TIMES, noise=BUSY)
    assert decide(base, busy_same)[:4:3] == (bl.UNCHANGED, False)  # screened out at once
    assert decide(base, *[controlled(scaled(0.5), noise=BUSY)] * 2)[0] == bl.IMPROVED


def _rates(times: tuple[float, ...]) -> tuple[float, ...]:
    """Bandwidths (GB/s) of moving 64 MB in ``times`` (s): what ``bench`` records."""
    return tuple(0.064 / t for t in times)


def test_a_bandwidth_is_judged_with_the_control_as_the_time_it_stands_for() -> None:
    timed = stored_controlled()
    base = stored_with("GB/s", True, 0.064 / TIMES[10], _rates(timed.samples.values),
                       timed.samples.control, sizes=timed.samples.sizes)

    def rate_window(times: tuple[float, ...], control: tuple[float, ...] = CONTROL,
                    noise: NoiseFigures | None = QUIET) -> Measured:
        return controlled(_rates(times), control, noise)

    # the host 25% slower: 20% less bandwidth, and the control says why
    host_slow = rate_window(scaled(1.25), scaled(1.25, CONTROL))
    verdict, a, _, more = decide(base, host_slow)
    assert (verdict, more) == (bl.UNCHANGED, False)
    assert a.change == pytest.approx(0.0, abs=1e-9)
    # the plain rule cannot tell: the same bandwidths without a control are a suspect
    plain = stored_with("GB/s", True, base.value, base.samples.values)
    assert decide(plain, window(host_slow.samples.values))[3] is True
    # the collective itself 20% slower at the same host speed: 1/1.2 of the bandwidth
    slow = rate_window(scaled(1.2))
    verdict, a, detail, _ = decide(base, *[slow] * CREG)
    assert verdict == bl.REGRESSED and f"confirmed by {CREG}" in detail
    assert a.change == pytest.approx(1 / 1.2 - 1, rel=1e-6)  # in the bandwidth's terms
    assert a.current == pytest.approx(a.baseline / 1.2)
    assert a.worse == pytest.approx(1 - 1 / 1.2)
    # and 30% faster is an improvement, once a second measurement bears it out
    assert decide(base, rate_window(scaled(1 / 1.3)))[:4:3] == (bl.INCONCLUSIVE, True)
    assert decide(base, *[rate_window(scaled(1 / 1.3))] * 2)[0] == bl.IMPROVED


def test_a_baseline_without_a_control_is_judged_by_the_plain_rule() -> None:
    assert not bl.controlled(stored(), [controlled()])
    assert not bl.controlled(stored_controlled(), [window(TIMES)])
    short = stored_with("s", False, 0.02, TIMES[:3], CONTROL[:3])
    assert not bl.controlled(short, [controlled()])
    assert not bl.controlled(stored_controlled(), [controlled((0.0, *TIMES[1:]))])  # no log
    assert bl.controlled(stored_controlled(), [controlled()])
    verdict, _, detail, _ = decide(stored(), *[controlled(scaled(2.0))] * REG)
    assert verdict == bl.REGRESSED and f"confirmed by {REG} measurements" in detail


@pytest.mark.parametrize("factors", [
    (2.0, 2.01, 2.02, 2.03, 2.04, 2.05), (1.07, 1.09, 1.11, 1.13, 1.15, 1.17),
    (1.04, 1.05, 1.06, 1.07, 1.08, 1.09), (0.8, 0.82, 0.84, 0.86, 0.88, 0.9)])
def test_the_confidence_shown_is_the_test_the_decision_used(factors: tuple[float, ...]
                                                             ) -> None:
    """Sentences 4 and 10: with the control, the confidence is 1 - p of the least
    significant reading that takes the host out, the test that decided; a regression or an
    improvement never shows one below 1 - the rule's significance level.  Cross-checked
    against scipy's normal approximation on the adjusted samples."""
    scipy_stats = pytest.importorskip("scipy.stats")
    levels = (1.0, 1.02, 1.04, 1.06, 1.08, 1.10)
    base = stored_with("s", False, TIMES[10], tuple(v for f in levels for v in scaled(f)),
                       CONTROL * 6, sizes=(20,) * 6)
    metric = Metric("w.time_s", 0.04, "s", False, TIMES)
    measured = [controlled(scaled(f)) for f in factors]
    verdict, a, detail, _ = decide(base, *measured)
    v = rule.make_verdict(metric, verdict, "env", a, tolerance=0.10,
                          measurement_count=len(measured), detail=detail)
    p = a.p_better if verdict == bl.IMPROVED else a.p_worse
    assert p is not None
    assert v.confidence == (None if verdict == bl.UNCHANGED else pytest.approx(1 - p))
    if verdict in (bl.REGRESSED, bl.IMPROVED):
        assert v.confidence is not None and v.confidence >= 1 - rule._ALPHA
    # the host held its speed: one reading, the adjusted samples' test
    base_logs = [math.log(x) for f in levels for x in scaled(f)]
    now_logs = [math.log(x) for f in factors for x in scaled(f)]
    assert [r.name for r in a.readings] == [readings.FITTED]
    assert a.p_worse == pytest.approx(float(scipy_stats.mannwhitneyu(
        now_logs, base_logs, alternative="greater", method="asymptotic").pvalue), rel=1e-6)


def test_a_baseline_says_what_change_its_measurements_can_tell() -> None:
    """``rule.detectable``: the spread of a baseline's measurements (each one's
    adjusted 25% quantile, in logs; their median absolute deviation as a standard
    deviation) and the smallest change a test of _CONTROL_MEASUREMENTS measurements against them
    tells at ALPHA, DETECTABLE_POWER of the time; cross-checked against scipy's MAD and
    normal quantiles.  One measurement far off moves it far less than a standard
    deviation.  A rate's is the same spread, read as a rate (a 10% longer time is a 9.1%
    lower bandwidth).  None with under 3 measurements or without the control."""
    scipy_stats = pytest.importorskip("scipy.stats")
    q = readings._CONTROL_ESTIMATOR_QUANTILE
    factors = (1.0, 1.08, 0.95, 1.12, 1.03, 0.9, 1.05, 1.0, 0.97, 1.1, 0.93, 1.02)

    def base_of(fs: tuple[float, ...], rate: bool = False) -> bl.StoredMetric:
        samples = tuple(v for f in fs for v in scaled(f))
        if rate:
            samples = tuple(1.0 / v for v in samples)
        return stored_with("GB/s" if rate else "s", rate, samples[10], samples,
                           CONTROL * len(fs), sizes=(20,) * len(fs))

    levels = np.array([math.log(float(np.quantile(scaled(f), q))) for f in factors])
    s = float(scipy_stats.median_abs_deviation(levels, scale="normal"))
    z = (scipy_stats.norm.ppf(1 - rule._ALPHA)
         + scipy_stats.norm.ppf(rule._DETECTABLE_POWER))
    want = math.exp(z * s * math.sqrt(1 / rule._CONTROL_MEASUREMENTS + 1 / len(factors))) - 1
    d = rule.detectable(base_of(factors))
    assert d is not None and d.measurements == 12
    assert d.spread == pytest.approx(s) and d.change == pytest.approx(want)  # 14.5%
    rate = rule.detectable(base_of(factors, rate=True))
    assert rate is not None and rate.spread == pytest.approx(s)
    assert rate.change == pytest.approx(1 - 1 / (1 + want))
    drift = (*factors[:-1], 2.0)  # a save with one measurement in a drift of the host
    far = rule.detectable(base_of(drift))
    sd = float(np.std([math.log(float(np.quantile(scaled(f), q))) for f in drift], ddof=1))
    assert far is not None and far.spread < 0.5 * sd  # 9.5% against 20.9%
    assert rule.detectable(base_of(factors[:2])) is None
    assert rule.detectable(stored(TIMES * 3)) is None  # no control


def test_a_save_whose_measurements_spread_too_far_for_its_tolerance_says_so() -> None:
    """A save's detail gives the change its comparisons can tell; where that is more than
    the tolerance (measurements spread 7.5% here: 14.5%, against a 10% tolerance), it says
    that smaller changes will often go unseen and what to do; quiet measurements (0.1%)
    say only the figure."""
    def detail_of(factors: tuple[float, ...]) -> str:
        def metric(f: float) -> Metric:
            return Metric("w.time_s", 0.02 * f, "s", False, scaled(f), control=CONTROL)
        j = judgement(None, metric(factors[0]), save=True)
        for f in factors[1:]:
            j.add_measurement("measure(w)", [metric(f)], QUIET)
        assert not j.wanted()
        (v,) = j.verdicts()
        assert v.verdict == bl.SAVED
        return str(v.detail)

    noisy = detail_of((1.0, 1.08, 0.95, 1.12, 1.03, 0.9, 1.05, 1.0, 0.97, 1.1, 0.93, 1.02))
    assert ("its 12 measurements spread 7.5%: a comparison tells a change of 14.5% or more "
            "90% of the time") in noisy
    assert "more than the tolerance (10%): smaller changes will often go unseen" in noisy
    quiet = detail_of(tuple(1.0 + 0.001 * (i % 3) for i in range(12)))
    assert "spread 0.1%: a comparison tells a change of 0.3% or more 90% of the time" in quiet
    assert "more than the tolerance" not in quiet


def _save_of(factors: Sequence[float], noises: Sequence[NoiseFigures] = (),
             controls: Sequence[float] = ()) -> tuple[Any, int]:
    """A save of ``w.time_s`` fed measurements at ``factors`` (with the probe's
    ``noises`` and the control at ``controls``, each 1 where not given) for as long as it
    asks; the judgement and the measurements it took."""
    def metric(i: int) -> Metric:
        f, c = factors[i], controls[i] if i < len(controls) else 1.0
        return Metric("w.time_s", 0.02 * f, "s", False, scaled(f), control=scaled(c, CONTROL))

    j = judgement(None, metric(0), save=True)
    taken = 1
    while j.wanted() == ["measure(w)"]:
        assert taken < len(factors), "the save asked for more than the test gives"
        j.add_measurement("measure(w)", [metric(taken)],
                          noises[taken] if taken < len(noises) else QUIET)
        taken += 1
    return j, taken


def test_a_save_stops_once_its_measurements_tell_the_line(tmp_path: Path) -> None:
    """With the control a save takes measurements until ``_SAVE_MIN_KEPT`` quiet ones are
    pooled and they tell a change at the decision line (rule.tells_the_line); a noisy one
    does not count.  The file keeps what was pooled, and reads back unchanged."""
    steady = [1.0 + i / 200 for i in range(DEFAULT_SAVE_MEASUREMENTS)]  # 0.5% apart
    j, taken = _save_of(steady)
    assert taken == jm._SAVE_MIN_KEPT
    (v,) = j.verdicts()
    assert v.verdict == bl.SAVED and "4 of 4 measurement(s) pooled" in v.detail
    busy = [QUIET, BUSY]  # the second one noisy: one more to keep four
    j, taken = _save_of([1.0, 1.5, *steady[2:]], busy)
    assert taken == jm._SAVE_MIN_KEPT + 1
    (entry,) = j.save_entries()
    kept = entry.metrics["w.time_s"]
    assert kept.samples.sizes == (20,) * 4 and max(kept.samples.values) < 0.03
    (v,) = j.verdicts()
    assert "4 of 5 measurement(s) pooled, with the host-speed control (1 set aside" in v.detail
    path = tmp_path / "test_x.toml"
    bl.save_test(path, "test_x.py", "test_a", j.save_entries())
    back = bl.load(path)
    assert back is not None
    again = back.metrics("test_a", bl.environment_id(CPU))
    assert again is not None and again["w.time_s"].samples.control == kept.samples.control
    (v,) = judgement(back, Metric("w.time_s", 0.02, "s", False, TIMES,
                                  control=CONTROL)).verdicts()
    assert v.verdict == bl.UNCHANGED and v.host_change == pytest.approx(0.0, abs=1e-9)


def test_a_save_whose_measurements_spread_takes_them_all() -> None:
    """Measurements 8% apart cannot tell a change at the line (5% at a 10% tolerance): the
    save takes ``DEFAULT_SAVE_MEASUREMENTS`` and says what its comparisons can tell."""
    wide = [1.0, 1.08, 0.95, 1.12, 1.03, 0.9, 1.05, 1.0, 0.97, 1.1, 0.93, 1.02]
    j, taken = _save_of(wide)
    assert taken == DEFAULT_SAVE_MEASUREMENTS == len(wide)
    (v,) = j.verdicts()
    assert "12 of 12 measurement(s) pooled" in v.detail
    assert "more than the tolerance" in v.detail


def test_a_save_sets_aside_a_control_its_samples_contradict() -> None:
    """Issue 49's save: a measurement whose control read 57% slower than every other of the
    save while its samples did not move is set aside (stored, it would read every later run
    as a host 34% faster, and an unmoved time as +48%); measured again in its place.  A
    measurement whose samples moved with its control is kept: that is the host."""
    steady = [1.0, 1.0, 1.005, 1.0, 0.995, 1.0, 1.0]
    j, taken = _save_of(steady, controls=[1.0, 1.57])
    assert taken == jm._SAVE_MIN_KEPT + 1
    (entry,) = j.save_entries()
    assert max(entry.metrics["w.time_s"].samples.control) < 1.01 * max(CONTROL)
    (v,) = j.verdicts()
    assert "4 of 5 measurement(s) pooled" in v.detail
    j, taken = _save_of([1.0, 1.57, 1.0, 1.0, 1.0, 1.0, 1.0], controls=[1.0, 1.57])
    (entry,) = j.save_entries()
    assert max(entry.metrics["w.time_s"].samples.control) > 1.5 * max(CONTROL)


def test_the_save_measurements_are_the_callers_to_set() -> None:
    """``--distperf-save-measurements`` (the judgement's ``save_measurements``) sets how many
    measurements a save takes of a metric with the control at most (and at least, where
    fewer than ``_SAVE_MIN_KEPT``); a plain one keeps its own count."""
    timed = Metric("w.time_s", 0.02, "s", False, TIMES, control=CONTROL)
    plain = Metric("p.time_s", 0.02, "s", False, TIMES)
    for asked in (1, 3, 20):
        j = bl.make_judgement(
            save=True, environment=CPU, first_noise=QUIET, tolerance=0.10, baseline=None,
            test="test_a", save_measurements=asked,
            measurements=[Measurement("t", (timed,), None, lambda: [timed]),
                          Measurement("p", (plain,), None, lambda: [plain])])
        taken = {"t": 1, "p": 1}
        while wanted := j.wanted():
            for label in wanted:
                taken[label] += 1
                j.add_measurement(label, [timed if label == "t" else plain], QUIET)
        expected = min(asked, jm._SAVE_MIN_KEPT)  # the same samples every time: told at once
        assert taken == {"t": expected, "p": jm._SAVE_MEASUREMENTS}
        (entry,) = j.save_entries()
        assert len(entry.metrics["w.time_s"].samples.values) == 20 * expected


def test_a_save_leaves_out_a_measurement_slowed_alone() -> None:
    """A save's measurement half as fast as its quiet siblings (a rate: a bus bandwidth),
    with its control as quick as theirs, is left out of the baseline as a compare run
    leaves it out (R57: a save half in a gloo slow regime read later runs as improved)."""
    def metric(factor: float) -> Metric:
        return Metric("bw", 2.0 * factor, "GB/s", True, scaled(factor), control=CONTROL)

    j = judgement(None, metric(1.0), save=True)
    for i in range(1, CREG):
        j.add_measurement("measure(w)", [metric(0.5 if i == 2 else 1.0)], QUIET)
    (entry,) = j.save_entries()
    kept = entry.metrics["bw"]
    assert kept.samples.sizes == (20,) * (CREG - 1)  # the slow one left out
    assert min(kept.samples.values) >= min(TIMES)


def test_verdicts_travel_with_the_record_and_render() -> None:
    v = Verdict("w.time_s", bl.REGRESSED, "env", "s", False, 0.02, 0.04, 1.0, 0.9999, 0.1, 2,
                0.01, 0.08, 0.03, "confirmed by 2 measurements")
    record = TestRecord("t.py::test_a", 2, verdicts=[v])
    assert from_dict(TestRecord, to_dict(record)).verdicts == [v]
    table = report.verdict_table([v])
    assert table[0].split() == ["metric", "baseline", "current", "change", "confidence",
                                "verdict"]
    assert table[1].split() == ["w.time_s", "20", "ms", "40", "ms", "+100.0%", "99.99%",
                                "regressed"]
    lines = [line.text for line in report.verdict_summary([record, TestRecord(
        "t.py::test_b", 2, verdicts=[Verdict("x", bl.IMPROVED, change=-0.5)])])]
    assert lines[0] == "distperf verdicts (per metric): 1 regressed, 1 improved"
    assert lines[1].split()[0] == "REGRESSED" and lines[2].split()[0] == "IMPROVED"
    record.measurements.append(Measurement("m", (Metric("w.time_s", 0.04, "s"),)))
    assert report.junit_properties(record) == [
        ("distperf.w.time_s", "40 ms"), ("distperf.w.time_s.verdict", "regressed (+100.0%)")]


def test_a_report_and_a_baseline_file_written_before_the_rename_still_load(
        tmp_path: Path) -> None:
    """A JSON report's verdict of the older layout (``windows``; each measurement's samples
    and controls side by side, without its value) reads as today's; a baseline file of
    pooled measurements with both controls reads into one Samples."""
    old = {"metric": "w.time_s", "verdict": "regressed", "windows": 6, "detail": "d",
           "measurements": [{"samples": [0.02, 0.03, 0.01], "control": [1.0, 1.0, 1.0],
                             "steal": 0.01, "wait": None, "other_load": 0.0,
                             "memory_control": []}]}
    record = from_dict(TestRecord, {"nodeid": "t.py::test_a", "world_size": 2,
                                    "verdicts": [old]})
    (v,) = record.verdicts
    assert v.measurement_count == 6 and v.detail == "d"
    (m,) = v.measurements
    assert m == Measured(0.02, Samples((0.02, 0.03, 0.01), (1.0, 1.0, 1.0)), 0.01, None, 0.0)
    assert from_dict(TestRecord, to_dict(record)) == record
    path = tmp_path / "test_x.toml"
    path.write_text(textwrap.dedent("""\
        schema_version = 1
        module = "tests/test_x.py"

        [environments.e]
        backend = "gloo"
        device_type = "cpu"
        device_model = "AMD EPYC 7R13"
        device_count = 0
        world_size = 2
        torch_version = "2.13.0+cpu"
        nccl_version = ""

        [tests.test_a.e]
        saved = "2025-01-02T03:04:05Z"

        [tests.test_a.e.metrics."w.time_s"]
        unit = "s"
        higher_is_better = false
        value = 0.021
        estimate = 0.02
        cpu_wait = 0.08
        samples = [0.02, 0.021, 0.022, 0.023]
        control = [0.0025, 0.0025, 0.0026, 0.0026]
        memory_control = [0.0009, 0.0009, 0.0009, 0.0009]
        measurements = [2, 2]
        """))
    file = bl.load(path)
    assert file is not None
    stored = (file.metrics("test_a", "e") or {})["w.time_s"]
    assert stored.samples == Samples((0.02, 0.021, 0.022, 0.023),
                                     (0.0025, 0.0025, 0.0026, 0.0026), (0.0009,) * 4, (2, 2))
    assert (stored.value, stored.measured.wait, stored.measured.steal) == (0.021, 0.08, None)


# -- the rule, sentence by sentence (docs/verdict-rule.md) ---------------------------------
@pytest.mark.parametrize(("samples", "value", "hib", "fraction", "want"), [
    (TIMES, 0.03, False, False, TIMES[1]),  # 20 samples: never below the second-best
    (TIMES * 3, 0.03, False, False, 0.02019),  # 60: the 5% quantile
    (TIMES, 0.03, True, False, TIMES[18]),  # a rate: the mirror, the second-best
    (TIMES, 0.3, False, True, 0.3),  # a fraction: its own value
    (TIMES[:4], 0.7, False, False, 0.7),  # too few samples: the value
])
def test_sentence_1_the_estimate(samples: tuple[float, ...], value: float, hib: bool,
                                 fraction: bool, want: float) -> None:
    assert bl.estimate(samples, value, hib, fraction) == pytest.approx(want)


@pytest.mark.parametrize(("worse", "tolerance", "past"), [
    (0.1001, 0.10, True), (0.10, 0.10, False), (0.05, 0.10, False), (0.51, 0.50, True),
    (-0.2, 0.10, False), (math.inf, 0.10, True), (0.0, 0.0, False), (1e-9, 0.0, True),
])
def test_sentence_2_the_decision_line(worse: float, tolerance: float, past: bool) -> None:
    assert rule._past(worse, tolerance) is past


@pytest.mark.parametrize(("unit", "delta"), [
    ("s", 5e-6), ("ms", 5e-3), ("us", 5.0), ("fraction", 0.05), ("GB/s", 0.0), ("", 0.0),
])
def test_sentence_2_the_smallest_delta_without_the_control(unit: str, delta: float) -> None:
    assert stats.min_abs_delta(unit) == delta


@pytest.mark.parametrize(("noise", "samples", "limit", "said"), [
    (QUIET, TIMES, 0.5, []),
    (BUSY, TIMES, 0.5, [BUSY_REASON]),
    (NoiseFigures(1.0, 0.5, 0.9, None), TIMES, 0.5, []),  # steal and wait: reported only
    (QUIET, (0.01,) * 5 + (0.03,) * 15, 0.5, ["sample spread 200% > 50%"]),
    (QUIET, (0.01,) * 5 + (0.03,) * 15, 2.5, []),  # a metric that always spreads so
    (None, TIMES[:3], 0.5, []),  # too few samples for a spread, nothing probed
])
def test_sentence_3_what_makes_a_measurement_too_noisy(
        noise: NoiseFigures | None, samples: tuple[float, ...], limit: float,
        said: list[str]) -> None:
    assert rule.noise_reasons(window(samples, noise), False, limit=limit) == said


@pytest.mark.parametrize(("p", "significant"), [
    (None, True), (0.0, True), (0.0099, True), (0.01, False), (0.5, False),
])
def test_sentence_4_significance(p: float | None, significant: bool) -> None:
    assert rule._significant(p) is significant


@pytest.mark.parametrize(("factors", "can_confirm", "verdict", "more"), [
    ((1.01,), True, bl.UNCHANGED, False),
    ((0.5,), True, bl.IMPROVED, False),  # improved at once
    ((2.0,), True, bl.INCONCLUSIVE, True),  # seen once: measured again
    ((2.0,) * 4, True, bl.REGRESSED, False),  # 3 re-measurements bear it out
    ((2.0, 2.0, 2.0, 1.0), True, bl.UNCHANGED, False),  # the best one clears it
    ((2.0,), False, bl.REGRESSED, False),  # cannot be measured again
])
def test_sentence_5_without_the_control(factors: tuple[float, ...], can_confirm: bool,
                                        verdict: str, more: bool) -> None:
    got = decide(stored(), *[window(scaled(f)) for f in factors], can_confirm=can_confirm)
    assert (got.verdict, got.more) == (verdict, more), got.detail


def test_sentence_6_which_metrics_are_judged_with_the_control() -> None:
    base = stored_controlled()
    cases = [(base, [controlled()], True), (stored(), [controlled()], False),
             (base, [window(TIMES)], False), (base, [controlled(), window(TIMES)], False),
             (stored_with("s", False, 0.02, TIMES[:3], CONTROL[:3]), [controlled()], False),
             (base, [controlled((0.0, *TIMES[1:]))], False),
             (stored_with("fraction", False, 0.02, TIMES, CONTROL), [controlled()], False)]
    assert [bl.controlled(b, ms) for b, ms, _ in cases] == [want for _, _, want in cases]


@pytest.mark.parametrize(("factors", "set_aside"), [
    ((1.0, 1.0, 1.0), 0), ((2.0, 1.0, 1.0), 1), ((2.0, 1.0), 0), ((2.0, 2.0, 1.0), 2),
    ((1.2, 1.2, 1.2), 0),
])
def test_sentence_7_a_measurement_slowed_alone_is_set_aside_for_a_regression(
        factors: tuple[float, ...], set_aside: int) -> None:
    measured = [controlled(scaled(f)) for f in factors]
    regression, improvement = rule._controlled_assessments(stored_controlled(), measured, 0.10)
    assert (regression.set_aside, improvement.set_aside) == (set_aside, 0)
    assert (regression is improvement) == (set_aside == 0)


@pytest.mark.parametrize(("worse", "screened"), [
    ((0.0, 0.0), True), ((0.049, 0.01), True), ((0.05, 0.0), False), ((0.0, 0.06), False),
])
def test_sentence_8_the_screen_looks_at_both_host_readings(worse: tuple[float, float],
                                                          screened: bool) -> None:
    readings_ = tuple(readings.Reading(name=name, change=w, worse=w, slope=1.0,
                                       host_change=0.0, p_worse=1.0, p_better=1.0)
                      for name, w in zip((readings.FITTED, readings.IN_PROPORTION), worse,
                                         strict=True))
    a = rule.Assessment(baseline=1.0, current=1.0, change=0.0, worse=worse[0],
                        worse_like=False, better_like=False, readings=readings_)
    assert rule._screened_out(a, 0.10) is screened


@pytest.mark.parametrize(("host", "memory", "rate", "names"), [
    (1.1, False, False, [readings.FITTED, readings.IN_PROPORTION, readings.AS_MEASURED]),
    (1.1, True, False, [readings.FITTED, readings.IN_PROPORTION, readings.MEMORY,
                        readings.AS_MEASURED]),
    (1.1, True, True, [readings.FITTED, readings.IN_PROPORTION,
                       readings.MEMORY_IN_PROPORTION, readings.AS_MEASURED]),
])
def test_sentence_9_the_readings_of_a_change(host: float, memory: bool, rate: bool,
                                             names: list[str]) -> None:
    base = stored_controlled(follows=0.3, memory=memory)
    now = controlled(scaled(1.1), scaled(1.025 * host, CONTROL),
                     memory=scaled(1.025 * host, MEMORY) if memory else ())
    got = readings.read(base, [now], [now], rate=rate)
    assert [r.name for r in got] == names
    assert got[0].slope == pytest.approx(0.3, abs=0.02)
    # where the host held its speed, the fitted reading is the only one
    same = stored_with("s", False, TIMES[10], TIMES, CONTROL)
    assert [r.name for r in readings.read(same, [controlled()], [controlled()])] == [
        readings.FITTED]


@pytest.mark.parametrize(("worse", "host", "beyond"), [
    (0.10, 0.10, True), (0.05, 0.10, True), (0.049, 0.10, False), (-0.06, 0.10, True),
    (0.01, 0.0, True),
])
def test_sentence_9_a_change_within_what_the_slope_could_leave(worse: float, host: float,
                                                              beyond: bool) -> None:
    a = rule.Assessment(baseline=1.0, current=1.0, change=worse, worse=worse,
                        worse_like=False, better_like=False)
    assert rule._beyond_host(a, host) is beyond


@pytest.mark.parametrize(("worse", "compute", "memory", "name", "beyond"), [
    (0.148, -0.03, 0.16, readings.MEMORY, False),  # R74: 19.6% slower than the compute one
    (0.25, -0.03, 0.16, readings.MEMORY, True),  # past its own move
    (0.148, 0.16, 0.16, readings.MEMORY, True),  # the two moved together: no own move
    (0.148, -0.03, 0.16, readings.MEMORY_IN_PROPORTION, True),  # a rate's reading takes it
])
def test_sentence_9_a_regression_within_the_memory_controls_own_move(
        worse: float, compute: float, memory: float, name: str, beyond: bool) -> None:
    def reading(name: str, host: float) -> readings.Reading:
        return readings.Reading(name=name, change=worse, worse=worse, slope=1.0,
                                host_change=host, p_worse=0.5, p_better=0.5)

    a = rule.Assessment(baseline=1.0, current=1.0, change=worse, worse=worse,
                        worse_like=True, better_like=False,
                        readings=(reading(readings.FITTED, compute), reading(name, memory)))
    assert rule._beyond_memory(a) is beyond


def test_sentence_9_a_regression_within_the_memory_controls_own_move_says_so() -> None:
    """The headline gives the figure that decides, how much more the memory control slowed
    than the compute one, not whichever control moved most (here the compute one)."""
    from pytest_distperf.verdict import explain as ex

    def reading(name: str, host: float) -> readings.Reading:
        return readings.Reading(name=name, change=0.148, worse=0.148, slope=1.0,
                                host_change=host, p_worse=0.001, p_better=0.999)

    a = rule.Assessment(baseline=1.0, current=1.148, change=0.148, worse=0.148,
                        worse_like=True, better_like=False, host_change=-0.10,
                        readings=(reading(readings.FITTED, -0.10),
                                  reading(readings.MEMORY, 0.05)))
    assert not rule._beyond_memory(a)
    assert ex.memory_hides(a, stored_controlled()).startswith(
        "inconclusive: the host's memory slowed 17% more than its compute since the save, "
        "enough to hide a change this size (+14.8%)")


@pytest.mark.parametrize(("factors", "borne_out"), [
    ((0.7,), False),  # one measurement: never
    ((0.7, 0.7), True), ((1.0, 0.7), True),  # the last one better on its own
    ((0.7, 0.96), False), ((0.7, 1.2), False),
])
def test_sentence_10_an_improvement_borne_out_by_its_last_measurement(
        factors: tuple[float, ...], borne_out: bool) -> None:
    measured = [controlled(scaled(f)) for f in factors]
    assert rule._borne_out(stored_controlled(), measured, 0.10) is borne_out


@pytest.mark.parametrize(("before", "after", "tolerance", "hib", "verdict"), [
    (2, 2, 0, False, bl.UNCHANGED), (2, 3, 0, False, bl.REGRESSED),
    (3, 2, 0, False, bl.IMPROVED), (2, 3, 1, False, bl.UNCHANGED),
    (0, 1, 0, False, bl.REGRESSED), (2, 3, 0, True, bl.IMPROVED),
])
def test_sentence_11_an_exact_metric(before: float, after: float, tolerance: float,
                                     hib: bool, verdict: str) -> None:
    base = bl.StoredMetric("calls/step", hib, Measured(float(before)), "exact")
    got, _, detail = bl.decide_exact(base, Measured(float(after)), tolerance)
    assert got == verdict
    assert detail.startswith(f"{verdict}: ") if verdict != bl.UNCHANGED else detail == ""


@pytest.mark.parametrize(("base", "measured", "head"), [
    (stored(), [window(scaled(2.0))] * REG, "regressed: 100.0% slower than the baseline, "
                                            "confirmed by 4 measurements; find the change"),
    (stored(), [window(scaled(0.5))], "improved: 50.0% faster than the baseline, in its one "
                                      "measurement; re-save with --distperf-save"),
    (stored(), [window(scaled(1.8), BUSY)] * REG, "inconclusive: too noisy to tell in all 4 "
                                                  "measurements; rerun on a quieter runner."),
    (stored(tuple(10.0 + 0.1 * i for i in range(20)), "GB/s", True),
     [window(tuple(5.0 + 0.05 * i for i in range(20)))] * REG,
     "regressed: 50.0% lower than the baseline, confirmed by 4 measurements"),
    (stored_controlled(), [controlled(scaled(1.2))] * CREG,
     "regressed: 20.0% slower than the baseline with the host's speed taken out, confirmed "
     "by 6 measurements; find the change that caused it, or re-save with --distperf-save if "
     "it is intended. Readings: +20.0% at the fitted slope"),
])
def test_a_verdict_says_one_plain_sentence_before_its_figures(
        base: bl.StoredMetric, measured: list[Measured], head: str) -> None:
    detail = rule.decide(base, measured, 0.10, can_confirm=True).detail
    assert detail.startswith(head), detail
    assert "slope fitted" not in detail.split(". ")[0]  # no rule internals in the sentence


@pytest.mark.parametrize(("value", "unit", "text"), [
    (0.0213, "s", "21.3 ms"), (2.5e-5, "s", "25 us"), (1.5, "s", "1.5 s"),
    (0.1234, "fraction", "0.123"), (12.5, "GB/s", "12.5 GB/s"), (None, "s", "-"),
    (2105344, "B/step", "2.01 MiB/step"), (512, "B", "512 B"), (8, "calls/step", "8 calls/step"),
])
def test_values_are_shown_in_readable_units(value: float | None, unit: str, text: str) -> None:
    assert report.format_value(value, unit) == text


# -- the noise probe -------------------------------------------------------------------------
def test_noise_figures_from_counters() -> None:
    start = Snapshot(10.0, (100, 0, 50, 800, 0, 0, 0, 50, 0, 0), ((1, 0), (2, 0), (3, 7)))
    end = Snapshot(12.0, (300, 0, 100, 1000, 0, 0, 0, 100, 0, 0),
                   ((1, int(0.4e9)), (2, int(0.6e9)), (4, 5)))
    figures = between(start, end)
    assert figures.steal == pytest.approx(50 / 500)
    assert figures.wait == pytest.approx((0.4 + 0.6) / (2.0 * 2))  # pid 3 gone, 4 new: left out
    assert figures.too_noisy() == []
    assert figures.other_load is None  # no CPU times of the measured processes: unknown
    unknown = between(Snapshot(0.0, (), ()), Snapshot(1.0, (), ()))
    assert (unknown.steal, unknown.wait, unknown.other_load) == (None, None, None)
    assert unknown.too_noisy() == []


def test_a_gpu_held_below_its_clocks_makes_a_measurement_noisy() -> None:
    """The most of the time any GPU of the ranks was held down (NVML's counters, ns) over
    the measurement: any of it sets the measurement aside, as NVBench does."""
    start = Snapshot(10.0, (), (), held_ns=(1_000, 5_000))
    seen = between(start, Snapshot(12.0, (), (), held_ns=(1_000, 5_000 + int(0.3e9))))
    assert seen.held == pytest.approx(0.15)
    assert seen.too_noisy() == ["a GPU was held below its clocks (heat, or its board's "
                                   "limits) 15.0% of the time"]
    steady = between(start, Snapshot(12.0, (), (), held_ns=start.held_ns))
    assert steady.held == 0 and steady.too_noisy() == []
    # not read at one end (CPU ranks, a pool started within the window): unknown
    assert between(Snapshot(10.0, (), ()), Snapshot(12.0, (), (), held_ns=(9,))).held is None
    # kept with the measurement, and judged from it again
    m = measured_of(Metric("x", 1.0, "s", False, (1.0,) * 5), seen)
    assert m.held == pytest.approx(0.15) and noise_of(m) is not None
    assert noise_of(m).too_noisy() == seen.too_noisy()  # type: ignore[union-attr]


def test_the_sm_clock_is_the_lowest_read_at_the_end_and_shown_not_judged() -> None:
    """The lowest SM clock NVML read of any GPU of the ranks at the end of the measurement
    (at its start an idle GPU runs low by design): kept with it and shown with a verdict's
    noise figures; the violation counters, not the clock, decide whether it was held down
    (a power-capped clock is a steady state)."""
    start = Snapshot(10.0, (), (), held_ns=(0, 0), sm_clock_mhz=(345, 1605))
    seen = between(start, Snapshot(12.0, (), (), held_ns=(0, 0), sm_clock_mhz=(1560, 1980)))
    assert seen.sm_clock_mhz == 1560 and seen.too_noisy() == []
    assert between(Snapshot(10.0, (), ()), Snapshot(12.0, (), ())).sm_clock_mhz is None
    # kept with the measurement, shown with the verdict; a pooled measurement keeps the
    # lowest of its parts
    m = measured_of(Metric("x", 1.0, "s", False, (1.0,) * 5), seen)
    assert m.sm_clock_mhz == 1560 and noise_of(m) == dataclasses.replace(seen, seconds=0.0)
    shown = report._noise(Verdict(metric="x", verdict="unchanged", measurements=(m,)))
    assert shown.endswith("GPU held 0.0%, SM clock 1560 MHz"), shown
    assert "SM clock" not in report._noise(Verdict(metric="x", verdict="unchanged"))
    other = measured_of(Metric("x", 1.0, "s", False, (1.0,) * 5),
                        NoiseFigures(1.0, 0.0, 0.0, 0.0, 0.0, 1410))
    assert pooled([m, other]).sm_clock_mhz == 1410
    assert pooled([m, measured_of(Metric("x", 1.0, "s", False, (1.0,) * 5), None)]
                  ).sm_clock_mhz == 1560


def test_other_load_is_the_machine_busy_time_the_measured_processes_did_not_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # the CPUs /proc/stat sums count
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    #        user nice system idle iowait irq softirq steal guest guest_nice
    start = Snapshot(0.0, (100, 0, 50, 800, 0, 0, 0, 0, 0, 0), (), ((1, 10), (2, 20)), 2)
    end = Snapshot(2.0, (300, 0, 100, 850, 0, 0, 10, 0, 0, 0), (), ((1, 90), (2, 100)), 2)
    # busy 200 + 50 + 10 = 260 ticks of 2 s x 2 CPUs x 100 = 400; the measured: 160
    assert between(start, end).other_load == pytest.approx(100 / 400)
    # ticks lost to accounting never make it negative
    assert between(start, Snapshot(2.0, start.cpu, (), ((1, 50), (2, 60)), 2)).other_load == 0
    # a process of the test's born in the window counts from 0 (a DataLoader worker)
    born = Snapshot(2.0, end.cpu, (), ((1, 90), (2, 100), (3, 40)), 2)
    assert between(start, born).other_load == pytest.approx(60 / 400)


def test_pooled_noise_is_noisy_only_when_one_measurement_was() -> None:
    from pytest_distperf.verdict.noise import pooled_noise

    # each quiet: a neighbour under the limit; ranks waiting for each other alone
    a, b = NoiseFigures(1.0, 0.0, 0.02, 0.08), NoiseFigures(1.0, 0.0, 0.40, 0.0)
    assert not a.too_noisy() and not b.too_noisy()
    quiet = pooled_noise([a, b])
    assert quiet is not None and quiet.too_noisy() == [] and quiet.seconds == 2.0
    noisy = NoiseFigures(1.0, 0.3, 0.30, 0.30)
    both = pooled_noise([a, noisy, b])
    assert both is not None and (both.steal, both.wait, both.other_load) == (0.3, 0.30, 0.30)
    assert pooled_noise([]) is None


@pytest.mark.parametrize(("steal", "wait", "other", "noisy"), [
    (0.0, 0.55, 0.0, False),  # gloo ranks waiting for each other on an idle machine
    (0.0, 0.0, 0.5, True),    # a neighbour took half the machine
    (0.0, 0.30, 0.30, True),
    (0.0, None, 0.30, True),  # the wait unknown: the other load decides
    (0.0, 0.30, 0.08, False),  # under the limit
    (0.0, 0.90, None, False),  # the other load unknown: the spread is the only guard
    (0.40, 0.0, 0.0, False),  # the host's steal is reported, not judged
])
def test_a_measurement_is_noisy_when_other_processes_took_the_cpus(
        steal: float, wait: float | None, other: float | None, noisy: bool) -> None:
    reasons = NoiseFigures(1.0, steal, wait, other).too_noisy()
    assert bool(reasons) == noisy, reasons
    if noisy and other is not None:
        assert f"other processes used {other:.0%} of the CPUs" in reasons[0]


def test_the_probe_reads_this_machine() -> None:
    import os

    from pytest_distperf.verdict import noise

    figures = noise.between(noise.snapshot([os.getpid()]), noise.snapshot([os.getpid()]))
    if Path("/proc/stat").exists():
        assert figures.wait is not None and figures.wait >= 0


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the probe reads Linux's /proc")
def test_under_torchrun_the_measured_processes_are_the_agents_children() -> None:
    """Local ranks are the children of one torchrun agent: each finds itself and the other
    (so neither counts the other as a neighbour), and not the agent."""
    import json
    import subprocess

    agent = textwrap.dedent("""
        import json, subprocess, sys
        rank = ("import json, time; from pytest_distperf.verdict import noise; "
                "time.sleep(1.0); seen = sorted(noise.siblings()); time.sleep(1.0); "
                "print(json.dumps(seen))")  # each looks while the other is surely alive
        procs = [subprocess.Popen([sys.executable, "-c", rank], stdout=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        seen = [json.loads(p.communicate()[0]) for p in procs]
        print(json.dumps({"ranks": sorted(p.pid for p in procs), "seen": seen}))
    """)
    out = subprocess.run([sys.executable, "-c", agent], capture_output=True, text=True,
                         check=True, timeout=60)
    result = json.loads(out.stdout)
    assert result["seen"] == [result["ranks"], result["ranks"]], result


def _detached(code: str) -> int:
    """The pid of ``python -c code`` started through a shell that exits at once: the process
    is no descendant of this one (which the probe counts as the test's own)."""
    import shlex
    import subprocess

    out = subprocess.run(["sh", "-c", f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} "
                          ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True)
    return int(out.stdout.strip())


def _other_load_around(measured: list[int]) -> float:
    import time

    from pytest_distperf.verdict import noise

    time.sleep(0.3)
    start = noise.snapshot(measured)
    time.sleep(1.5)
    figures = noise.between(start, noise.snapshot(measured))
    assert figures.other_load is not None
    return figures.other_load


def _kill(pid: int) -> None:
    import contextlib
    import os
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the probe reads Linux's /proc")
def test_a_busy_child_of_a_measured_process_is_not_a_neighbour() -> None:
    """A rank's DataLoader worker, a process a test starts: its CPU time is the test's.  The
    same busy loop reads as far less other load as the child of a measured process than as a
    stranger; asserted on the two readings less what the machine's other processes took
    (a busy neighbour, another test run) just before."""
    from pytest_distperf.common import procs

    background = _other_load_around([])
    loop = "while True: pass"
    rank = _detached(f"import subprocess, sys; subprocess.run([sys.executable, '-c', {loop!r}])")
    try:
        as_child = _other_load_around([rank])
    finally:
        for pid, proc in procs.table().items():  # the busy child, before orphaned
            if proc.ppid == rank:
                _kill(pid)
        _kill(rank)
    stranger = _detached(loop)
    try:
        as_stranger = _other_load_around([])
    finally:
        _kill(stranger)
    if as_stranger - background < 0.2:  # every CPU already taken: no reading can tell
        pytest.skip(f"the machine was saturated ({background:.0%} other load before)")
    assert as_child - background < (as_stranger - background) / 2, (
        background, as_child, as_stranger)


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the probe reads Linux's /proc")
def test_the_probe_sees_a_real_neighbour_that_takes_a_cpu() -> None:
    """A busy process that is not the test's takes a whole CPU: at least a tenth of any
    machine of up to 10 CPUs."""
    import os

    from pytest_distperf.verdict import noise

    hog = _detached("while True: pass")
    try:
        other = _other_load_around([os.getpid()])
    finally:
        _kill(hog)
    assert other > min(noise._OTHER_LOAD_LIMIT, 0.9 / (os.cpu_count() or 1))


# -- the spread of a fraction near zero ------------------------------------------------------
NEAR_ZERO = (0.001,) * 10 + (0.02,) * 10  # comm_overhead: 0.1% at best, 1.05% at the median


def test_a_fraction_near_zero_is_not_called_noisy_for_its_relative_spread() -> None:
    # relative to its estimate (0.001) the median is 950% away; in points it is 0.0095,
    # far less than the smallest change a fraction can make (MIN_FRACTION_POINTS)
    assert bl.spread(NEAR_ZERO, False) == pytest.approx(9.5)
    assert bl.spread(NEAR_ZERO, False, fraction=True) == pytest.approx(0.095)
    assert not bl.noise_reasons(window(NEAR_ZERO), False, fraction=True)
    # a fraction whose median is 0.2 points above its estimate is noisy all the same
    wide = (0.0,) * 4 + (0.2,) * 16
    assert bl.spread(wide, False, fraction=True) == pytest.approx(2.0)
    assert bl.noise_reasons(window(wide), False, fraction=True)
    # a fraction far from zero keeps its relative spread
    high = (0.5,) * 10 + (0.6,) * 10
    assert bl.spread(high, False, fraction=True) == bl.spread(high, False) == pytest.approx(0.1)


def test_a_quiet_save_of_a_fraction_near_zero_takes_the_usual_measurements() -> None:
    metric = Metric("comm_overhead", 0.01, "fraction", False, NEAR_ZERO)
    j = judgement(None, metric, save=True)
    for _ in range(jm._SAVE_MEASUREMENTS - 1):
        assert j.wanted() == ["measure(w)"]
        j.add_measurement("measure(w)", [metric], QUIET)
    assert j.wanted() == []  # not SAVE_MAX_WINDOWS: nothing was too noisy
    (verdict,) = j.verdicts()
    assert "noisy" not in verdict.detail and verdict.spread == pytest.approx(0.095)


def test_the_estimator_never_rests_on_the_single_best_sample() -> None:
    """At 5-10 samples the 5% quantile is mostly the minimum; the estimator takes the
    second-best sample there, and the 5% quantile from 21 samples on."""
    odd = (0.010, 0.020, 0.021, 0.022, 0.023)  # one odd fast sample
    assert bl.estimate(odd, 0.0, False, False) == 0.020
    assert bl.estimate([1 / v for v in odd], 0.0, True, False) == pytest.approx(1 / 0.020)
    many = tuple(0.020 + 0.001 * i for i in range(41))
    assert bl.estimate(many, 0.0, False, False) == pytest.approx(0.022)  # the 5% quantile
