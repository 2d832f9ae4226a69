"""Pure parts of the foundation: option parsers, rank placement, records, thresholds."""

from __future__ import annotations

import dataclasses
import fractions
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from pytest_distperf.config import (
    ConfigError,
    Placement,
    describe_devices,
    format_size,
    parse_backend,
    parse_env_name,
    parse_gpus,
    parse_path,
    parse_size,
    parse_timeout,
    parse_tolerance,
    place_ranks,
    placement_notes,
    resolve_thresholds,
    validate_marker_kwargs,
)
from pytest_distperf.fixtures.results import record_from_dict, record_to_dict
from pytest_distperf.fixtures.results.group import MeasureResult
from pytest_distperf.pool.launcher import host_cores
from pytest_distperf.records import Environment, Measurement, Metric, TestRecord, from_dict, to_dict
from pytest_distperf.verdict.thresholds import check_thresholds


@pytest.mark.parametrize(("text", "expected"), [("1", 1), ("4", 4), (" 8 ", 8), (2, 2)])
def test_parse_gpus(text: object, expected: int) -> None:
    assert parse_gpus(text, "cli") == expected


@pytest.mark.parametrize(("text", "match"), [
    ("0", "at least 1, got 0"), ("-2", "at least 1"), ("four", "got 'four'"), ("", "got ''"),
    ("2.5", "got '2.5'"),
])
def test_parse_gpus_rejects(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        parse_gpus(text, "the test")
    assert "--gpus" in str(info.value) and "(from the test)" in str(info.value)


def test_parse_backend() -> None:
    assert [parse_backend(b, "x") for b in ("auto", "NCCL", " gloo ", "Gloo-CUDA")] == [
        "auto", "nccl", "gloo", "gloo-cuda"]
    with pytest.raises(ConfigError, match="expected one of auto, nccl, gloo, gloo-cuda, got 'mpi'"):
        parse_backend("mpi", "x")


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "soon"])
def test_parse_timeout_rejects(bad: str) -> None:
    with pytest.raises(ConfigError, match="--distperf-timeout"):
        parse_timeout(bad, "x")
    assert parse_timeout("2.5", "x") == 2.5


@pytest.mark.parametrize(("value", "nbytes"), [
    (0, 0), (512, 512), ("512", 512), ("64KiB", 64 * 1024), ("64KB", 64 * 1024),
    ("16MiB", 16 * 2**20), ("1GiB", 2**30), ("1.5KiB", 1536), ("4 MiB", 4 * 2**20),
    ("8k", 8192),
])
def test_parse_size(value: object, nbytes: int) -> None:
    assert parse_size(value) == nbytes


@pytest.mark.parametrize("bad", ["16 megabytes", "MiB", "-4KiB", "1.3B", -1, True, 2.5, None])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize(("nbytes", "text"), [
    (16 * 2**20, "16MiB"), (64 * 1024, "64KiB"), (2**30, "1GiB"), (1536, "1536B"), (7, "7B"),
])
def test_format_size_round_trips(nbytes: int, text: str) -> None:
    assert format_size(nbytes) == text
    assert parse_size(text) == nbytes


def test_marker_keywords() -> None:
    assert validate_marker_kwargs({"world_size": 2, "max_imbalance": 0.2}, "t") == {
        "world_size": 2, "max_imbalance": 0.2}
    assert validate_marker_kwargs({"tolerance": None}, "t") == {}
    with pytest.raises(ConfigError, match="unknown keyword 'max_imbalanse'"):
        validate_marker_kwargs({"max_imbalanse": 0.2}, "t")
    with pytest.raises(ConfigError, match="world_size must be an int >= 1"):
        validate_marker_kwargs({"world_size": 0}, "t")
    with pytest.raises(ConfigError, match="max_comm_overhead: expected a number"):
        validate_marker_kwargs({"max_comm_overhead": "low"}, "t")


def _placed(p: Placement) -> tuple[int, str, tuple[int, ...]]:
    return p.world_size, p.backend, p.devices


#: NCCL versions on either side of the first that lets ranks share a GPU.
OLD_NCCL, SHARING_NCCL = (2, 28, 3), (2, 30, 1)


class TestPlaceRanks:
    def test_cpu_default_is_two_gloo_ranks(self) -> None:
        p = place_ranks("auto", None, 0, False)
        assert _placed(p) == (2, "gloo", ())
        assert (p.device_type, p.ranks_per_gpu) == ("cpu", 0)

    def test_auto_takes_nccl_with_a_gpu_per_rank(self) -> None:
        p = place_ranks("auto", None, 8, True)
        assert _placed(p) == (8, "nccl", tuple(range(8)))
        assert (p.device_type, p.ranks_per_gpu) == ("cuda", 1)
        assert place_ranks("auto", 4, 4, True).backend == "nccl"

    @pytest.mark.parametrize(("backend", "gpus", "visible", "nccl", "placed"), [
        ("auto", 4, 0, False, (4, "gloo", ())),  # no GPU: CPU ranks
        ("auto", 4, 2, False, (4, "gloo", ())),  # GPUs but no NCCL in this torch: CPU ranks
        ("gloo", 4, 8, True, (4, "gloo", ())),  # asked for
        ("gloo", None, 8, True, (8, "gloo", ())),
    ])
    def test_cpu_ranks_where_no_gpu_can_take_them_or_gloo_is_asked_for(
            self, backend: str, gpus: int | None, visible: int, nccl: bool,
            placed: tuple[int, str, tuple[int, ...]]) -> None:
        assert _placed(place_ranks(backend, gpus, visible, nccl)) == placed

    @pytest.mark.parametrize(("backend", "gpus", "visible", "slot", "words"), [
        ("auto", 4, 1, (0, 1), "--gpus 4 needs 4 GPUs (one per rank) but 1 is visible; with "
         "GPUs visible, --distperf-backend auto does not fall back to CPU ranks; use --gpus 1 "
         "to run on the GPUs, or --distperf-backend gloo to run 4 ranks on the CPU on purpose, "
         "or --distperf-backend gloo-cuda to run them on the GPU with gloo"),
        ("auto", 4, 2, (0, 1), "--gpus 4 needs 4 GPUs (one per rank) but 2 are visible"),
        ("nccl", 4, 2, (0, 1), "--distperf-backend nccl needs 4 GPUs (one per rank) but 2 are "
         "visible; use --gpus 2 to run on the GPUs, or --distperf-backend gloo to run 4 ranks"),
        ("auto", 4, 6, (1, 2), "--gpus 4 needs 8 GPUs (one per rank for xdist worker gw1 of 2, "
         "which takes devices 4..7) but 6 are visible; with GPUs visible, --distperf-backend "
         "auto does not fall back to CPU ranks; use --gpus 3 to run on the GPUs (3 GPUs for "
         "each of 2 workers), or fewer xdist workers, or --distperf-backend gloo"),
        ("nccl", 4, 6, (1, 2), "--distperf-backend nccl needs 8 GPUs (one per rank for xdist "
         "worker gw1 of 2, which takes devices 4..7) but 6 are visible"),
        ("auto", None, 2, (3, 4), "4 xdist workers of one rank each need 4 GPUs (one per rank "
         "for xdist worker gw3 of 4, which takes devices 3..3) but 2 are visible; with GPUs "
         "visible, --distperf-backend auto does not fall back to CPU ranks; use fewer xdist "
         "workers, or --distperf-backend gloo to run 1 rank on the CPU on purpose"),
    ])
    def test_too_few_gpus_is_an_error_that_names_both_numbers_and_the_ways_out(
            self, backend: str, gpus: int | None, visible: int, slot: tuple[int, int],
            words: str) -> None:
        with pytest.raises(ConfigError) as info:
            place_ranks(backend, gpus, visible, True, *slot)
        assert str(info.value).startswith(words)

    @pytest.mark.parametrize(("version", "said"), [(SHARING_NCCL, True), (OLD_NCCL, False)])
    def test_too_few_gpus_names_nccl_sharing_where_this_nccl_has_it(
            self, version: tuple[int, ...], said: bool) -> None:
        with pytest.raises(ConfigError) as info:
            place_ranks("nccl", 2, 1, True, nccl_version=version)
        assert ("NCCL_MULTI_RANK_GPU_ENABLE=1 to put up to 2 NCCL ranks on a GPU "
                "(experimental)" in str(info.value)) is said
        assert "--distperf-backend gloo-cuda to run them on the GPU with gloo" in str(info.value)

    def test_xdist_workers_split_the_devices(self) -> None:
        # 8 GPUs, --gpus 4, two workers: gw0 takes 0..3, gw1 takes 4..7
        assert place_ranks("nccl", 4, 8, True, 0, 2).devices == (0, 1, 2, 3)
        assert place_ranks("nccl", 4, 8, True, 1, 2).devices == (4, 5, 6, 7)
        # without --gpus each worker gets its share of the visible devices
        assert _placed(place_ranks("auto", None, 8, True, 3, 4)) == (2, "nccl", (6, 7))

    def test_nccl_without_cuda(self) -> None:
        with pytest.raises(ConfigError, match="no CUDA/NCCL support"):
            place_ranks("nccl", 2, 0, False)

    # -- several ranks on one GPU -------------------------------------------------------------
    @pytest.mark.parametrize(("gpus", "visible", "slot", "devices"), [
        (2, 1, (0, 1), (0, 0)),  # one GPU, two gloo ranks
        (3, 1, (0, 1), (0, 0, 0)),  # gloo puts as many on a GPU as it takes
        (4, 2, (0, 1), (0, 1, 0, 1)),  # round robin over two GPUs
        (2, 8, (0, 1), (0, 1)),  # a GPU each where they suffice
        (None, 1, (0, 1), (0, 0)),  # a gloo-cuda run is at least two ranks
        (None, 4, (0, 1), (0, 1, 2, 3)),
        (2, 4, (1, 2), (2, 3)),  # xdist worker gw1 of 2: the second half of the GPUs
        (2, 1, (1, 2), (0, 0)),  # more workers than GPUs: they share it
    ])
    def test_gloo_cuda_puts_gloo_ranks_round_robin_on_the_workers_gpus(
            self, gpus: int | None, visible: int, slot: tuple[int, int],
            devices: tuple[int, ...]) -> None:
        p = place_ranks("gloo-cuda", gpus, visible, True, *slot)
        assert _placed(p) == (len(devices), "gloo", devices)
        assert p.device_type == "cuda"
        assert p.ranks_per_gpu == max(devices.count(d) for d in devices)

    def test_gloo_cuda_needs_no_nccl_but_a_gpu(self) -> None:
        assert place_ranks("gloo-cuda", 2, 1, False).devices == (0, 0)
        with pytest.raises(ConfigError) as info:
            place_ranks("gloo-cuda", 2, 0, False)
        assert str(info.value) == (
            "--distperf-backend gloo-cuda: no CUDA device is visible (this torch has no CUDA "
            "support, or CUDA_VISIBLE_DEVICES hides every GPU); use --distperf-backend gloo "
            "for CPU ranks")

    @pytest.mark.parametrize(("backend", "gpus", "visible", "slot", "devices"), [
        ("nccl", 2, 1, (0, 1), (0, 0)),  # two ranks share the one GPU
        ("auto", 2, 1, (0, 1), (0, 0)),
        ("nccl", 4, 2, (0, 1), (0, 1, 0, 1)),  # round robin, two on each
        ("nccl", 3, 2, (0, 1), (0, 1, 0)),
        ("nccl", 4, 4, (0, 1), (0, 1, 2, 3)),  # enough GPUs: one each, as without sharing
        ("nccl", 4, 4, (1, 2), (2, 3, 2, 3)),  # gw1 of 2 shares its two GPUs
    ])
    def test_nccl_2_30_shares_a_gpu_between_at_most_two_ranks(
            self, backend: str, gpus: int, visible: int, slot: tuple[int, int],
            devices: tuple[int, ...]) -> None:
        p = place_ranks(backend, gpus, visible, True, *slot, nccl_version=SHARING_NCCL,
                        shared_gpus=True)
        assert _placed(p) == (gpus, "nccl", devices)

    @pytest.mark.parametrize("version", [OLD_NCCL, (2, 29, 9), ()])
    def test_nccl_before_2_30_refuses_to_share_a_gpu_naming_its_version(
            self, version: tuple[int, ...]) -> None:
        with pytest.raises(ConfigError) as info:
            place_ranks("nccl", 2, 1, True, nccl_version=version, shared_gpus=True)
        found = ".".join(map(str, version)) or "unknown"
        assert str(info.value) == (
            f"NCCL_MULTI_RANK_GPU_ENABLE=1: several ranks per GPU need NCCL 2.30 or later, and "
            f"this torch has NCCL {found}; use --distperf-backend gloo-cuda to run 2 gloo ranks "
            f"on the GPU (their collectives go through host memory), or a torch built with "
            f"NCCL 2.30 or later")

    @pytest.mark.parametrize(("gpus", "visible", "words"), [
        (3, 1, "NCCL_MULTI_RANK_GPU_ENABLE=1: 3 ranks on 1 GPU would put 3 on one, and NCCL "
         "2.30.1 lets at most 2 share a GPU; use --gpus 2 or fewer, or --distperf-backend "
         "gloo-cuda to run 3 gloo ranks on the GPU"),
        (5, 2, "NCCL_MULTI_RANK_GPU_ENABLE=1: 5 ranks on 2 GPUs would put 3 on one, and NCCL "
         "2.30.1 lets at most 2 share a GPU; use --gpus 4 or fewer"),
    ])
    def test_three_ranks_on_a_gpu_are_refused(self, gpus: int, visible: int,
                                               words: str) -> None:
        with pytest.raises(ConfigError) as info:
            place_ranks("nccl", gpus, visible, True, nccl_version=SHARING_NCCL,
                        shared_gpus=True)
        assert str(info.value).startswith(words)

    def test_sharing_is_only_for_the_gpus_nccl_lacks(self) -> None:
        # gloo asked for stays on the CPU; without NCCL there is nothing to share
        assert place_ranks("gloo", 2, 1, True, nccl_version=SHARING_NCCL,
                           shared_gpus=True).devices == ()
        with pytest.raises(ConfigError, match="no CUDA/NCCL support"):
            place_ranks("nccl", 2, 0, False, nccl_version=SHARING_NCCL, shared_gpus=True)


@pytest.mark.parametrize(("devices", "visible", "words"), [
    ((0, 1, 2, 3), 8, "devices 0..3 of 8 visible"),
    ((4, 5), 8, "devices 4..5 of 8 visible"),
    ((0, 0), 1, "2 ranks per GPU on device 0 of 1 visible"),
    ((0, 1, 0), 2, "2 ranks per GPU on devices 0, 1 of 2 visible"),
])
def test_the_header_says_each_ranks_gpu(devices: tuple[int, ...], visible: int,
                                        words: str) -> None:
    assert describe_devices(devices, visible) == words


def test_the_header_says_when_gpus_are_shared_or_gloo_runs_on_them() -> None:
    assert placement_notes("nccl", (0, 1), SHARING_NCCL) == []
    assert placement_notes("gloo", (), ()) == []
    gloo, shared = placement_notes("gloo", (0, 0), ())
    assert gloo.startswith("distperf: gloo ranks with their tensors on the GPU: gloo copies "
                           "GPU tensors through host memory")
    assert "not NVLink's or PCIe's" in gloo
    assert shared.startswith("distperf: 2 ranks share a GPU: they share its SMs and memory")
    [nccl] = placement_notes("nccl", (0, 0), SHARING_NCCL)
    assert nccl.startswith("distperf: 2 ranks share a GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL "
                           "2.30.1, experimental)")
    assert nccl.endswith("their baselines are kept apart (2pergpu in the key)")


@pytest.mark.parametrize(("value", "name"), [
    ("ubuntu-latest", "ubuntu-latest"), (" h100x8 ", "h100x8"), ("gh.4core_x86", "gh.4core_x86"),
    ("a" * 64, "a" * 64),
])
def test_an_environment_name_is_a_short_plain_name(value: str, name: str) -> None:
    assert parse_env_name(value, "test") == name


@pytest.mark.parametrize("bad", ["", "  ", "my runner", "-x", "a" * 65, "gpu/8", "x@y", "é"])
def test_an_environment_name_that_is_not_is_refused_with_what_a_name_may_hold(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"^--distperf-env-name: expected a name of letters, "
                                          r"digits.*e\.g\. ubuntu-latest or h100x8 \(from test\)"):
        parse_env_name(bad, "test")


def test_records_round_trip_through_json() -> None:
    env = Environment("gloo", "cpu", "Some CPU", 0, 4, "2.13.0+cpu", "")
    metric = Metric("all_reduce.16MiB.busbw_gbps", 1.5, "GB/s", True, (1.4, 1.5, 1.6),
                    ranks=(1,), hint="look at rank 1")
    measured = Measurement("x", (metric,), {"a": 1}, lambda: [metric])  # remeasure: not sent
    record = TestRecord("t.py::test", 4, [measured])
    data = json.loads(json.dumps(record_to_dict(record)))
    assert "remeasure" not in json.dumps(data)
    back = record_from_dict(data)
    assert back.metrics == [metric] and back.measurements == record.measurements
    assert back.measurements[0].remeasure is None
    assert from_dict(Environment, to_dict(env)) == env
    assert env.key() == "gloo-cpu-w4-torch2.13.0"  # cores unknown (a file from before them)
    many = dataclasses.replace(env, cpu_cores=16, threads_per_rank=4)
    assert many.key() == "gloo-cpu-w4-c16t4-torch2.13.0"
    assert from_dict(Environment, to_dict(many)) == many


def test_measure_result_takes_the_slowest_rank_per_iteration() -> None:
    r = MeasureResult.from_per_rank("x", [[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]])
    assert r.samples == (3.0, 5.0, 2.5)
    assert r.time_s == 3.0
    (metric,) = r.metrics()
    assert (metric.name, metric.higher_is_better, metric.samples) == ("x.time_s", False,
                                                                      (3.0, 5.0, 2.5))
    assert math.isnan(MeasureResult.from_per_rank("y", []).time_s)
    assert metric.control == ()  # no control was measured
    c = MeasureResult.from_per_rank("x", [[1.0, 5.0], [3.0, 1.0]], [[0.2, 0.1], [0.1, 0.3]])
    assert c.control == (0.2, 0.3) and c.metrics()[0].control == (0.2, 0.3)
    ragged = MeasureResult.from_per_rank("x", [[1.0, 5.0], [3.0, 1.0]], [[0.2], [0.1, 0.3]])
    assert ragged.control == ()  # a control that does not pair with the samples is dropped


def test_thresholds() -> None:
    limits = resolve_thresholds({"max_imbalance": 0.5}, {"min_scaling_efficiency": 0.9})
    assert limits == {"max_comm_overhead": 0.30, "max_imbalance": 0.5,
                      "min_scaling_efficiency": 0.9, "max_arrival_skew": math.inf,
                      "min_pipeline_utilisation": 0.70, "max_tp_comm_share": 0.40}
    metrics = [
        Metric("comm_overhead", 0.30, "fraction", threshold="max_comm_overhead"),  # not < 0.30
        Metric("imbalance", 0.49, "fraction", threshold="max_imbalance"),
        Metric("scaling_efficiency.w2", 0.9, "fraction", True, threshold="min_scaling_efficiency"),
        Metric("scaling_efficiency.w4", 0.7, "fraction", True, threshold="min_scaling_efficiency",
               ranks=(3,), hint="check rank 3"),
        Metric("step_time_s", 10.0, "s"),  # no threshold: never a breach
    ]
    breaches = check_thresholds(metrics, limits)
    assert [b.metric for b in breaches] == ["comm_overhead", "scaling_efficiency.w4"]
    text = breaches[1].describe()
    assert "scaling_efficiency.w4 = 0.700 is below min_scaling_efficiency = 0.900" in text
    assert "ranks involved: 3" in text and "suggestion: check rank 3" in text
    assert "exceeds max_comm_overhead = 0.300" in breaches[0].describe()


def test_max_arrival_skew_is_off_until_set() -> None:
    skew = Metric("profile.arrival_skew", 0.7, "fraction", threshold="max_arrival_skew",
                  ranks=(1,))
    assert math.isinf(resolve_thresholds()["max_arrival_skew"])
    assert check_thresholds([skew], resolve_thresholds()) == []
    (breach,) = check_thresholds([skew], resolve_thresholds({"max_arrival_skew": 0.1}))
    assert breach.describe() == ("profile.arrival_skew = 0.700 exceeds max_arrival_skew = "
                                 "0.100 (ranks involved: 1)")


def test_a_breach_the_noise_could_have_made_is_inconclusive() -> None:
    """With the noise probe past its limits, a fraction over its limit in the median step
    but within it in the good quarter of the steps is inconclusive; one over it in every
    step stands; without noise, both stand."""
    limits = resolve_thresholds()
    borderline = (0.2, 0.22, 0.25, 0.35, 0.4, 0.45, 0.5, 0.55)  # value 0.375, p25 0.2425
    clear = (0.5, 0.55, 0.6, 0.62, 0.64, 0.66, 0.7, 0.75)
    metrics = [Metric("a.comm_overhead", 0.375, "fraction", samples=borderline,
                      threshold="max_comm_overhead"),
               Metric("b.comm_overhead", 0.63, "fraction", samples=clear,
                      threshold="max_comm_overhead"),
               Metric("c.comm_overhead", 0.5, "fraction", samples=(0.1, 0.5),  # too few
                      threshold="max_comm_overhead")]
    noisy = check_thresholds(metrics, limits, ["CPU wait 40% > 25%"])
    assert [(b.metric, bool(b.inconclusive)) for b in noisy] == [
        ("a.comm_overhead", True), ("b.comm_overhead", False), ("c.comm_overhead", False)]
    assert "inconclusive: the noise probe saw CPU wait 40% > 25%, and a quarter of the " \
           "steps were within the limit (0.242)" in noisy[0].describe()
    assert not any(b.inconclusive for b in check_thresholds(metrics, limits))


def test_values_that_would_quietly_switch_the_gate_off_are_refused() -> None:
    """A tolerance typed as a percentage (10 for 10%), a hang timeout shorter than any
    call, and a size unit without its prefix are errors that say what was meant."""
    with pytest.raises(ConfigError, match=r"a fraction \(0.10 means 10%\), got '10'; for 10% "
                                          r"write 0.1"):
        parse_tolerance("10", "--distperf-tolerance", "the command line")
    assert parse_tolerance("0.25", "x", "y") == 0.25 and parse_tolerance("1", "x", "y") == 1
    with pytest.raises(ConfigError, match="tolerance is a fraction"):
        validate_marker_kwargs({"tolerance": 15}, "t.py::test_x")
    assert validate_marker_kwargs({"exact_tolerance": 64}, "t.py::test_x") == {
        "exact_tolerance": 64.0}
    with pytest.raises(ConfigError, match="too short for any call on the ranks"):
        parse_timeout("1e-9", "the command line")
    for bad in ("64iB", "iB", "1.5 iB"):
        with pytest.raises(ValueError, match="bad size"):
            parse_size(bad)
    assert parse_size("64KiB") == parse_size("64K") == parse_size("64kb") == 65536


def test_more_ranks_than_cores_is_said_in_the_header(pytester: pytest.Pytester) -> None:
    cores = os.cpu_count() or 1
    # the header comes before any pool starts: the ranks, more than the cores, are not
    # started here (4 ranks on 2 cores run in tests/test_parallel.py)
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--distperf", "--gpus", str(cores + 1),
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"distperf: warning: {cores + 1} ranks on {cores} CPU cores: *"])


def test_bind_reaches_the_ranks(pytester: pytest.Pytester) -> None:
    """``--distperf-bind`` reaches the pool: each rank runs on a core of its own, the header
    says so, and the environment key has its ``b`` part (binding itself, and the default,
    unbound: tests/test_pool.py)."""
    if len(host_cores()) < 2 or not hasattr(os, "sched_setaffinity"):
        pytest.skip("binding ranks needs a core per rank")
    pytester.makepyfile(test_x=(
        "import os\n"
        "def test_x(nccl_group):\n"
        "    got = nccl_group.run(lambda: sorted(os.sched_getaffinity(0)))\n"
        "    assert len(got[0]) == len(got[1]) == 1 and got[0] != got[1], got\n"
        "    nccl_group.measure('nap', lambda: None, iters=5)\n"))
    result = pytester.runpytest("--distperf", "--gpus", "2", "--distperf-bind",
                                "--distperf-json", "r.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*pool: *each rank bound to its own cores*"])
    key = json.loads((pytester.path / "r.json").read_text())["environments"][0]["key"]
    assert re.fullmatch(r"gloo-cpu-w2-c\d+t1b1-torch.*", key), key


def test_what_the_fuzzer_found_in_option_and_marker_values() -> None:
    """Minimal examples from tests/test_fuzz.py: each was a raw exception, a wrong value or
    a value that could not work."""
    with pytest.raises(ConfigError, match="max_imbalance: expected a finite number >= 0"):
        validate_marker_kwargs({"max_imbalance": 10**400}, "t")  # was an OverflowError
    with pytest.raises(ConfigError, match="expected a finite number >= 0"):
        parse_tolerance(fractions.Fraction(10**400, 3), "tolerance", "x")
    with pytest.raises(ConfigError, match="longer than any call should wait; use at most "
                                          "604800"):
        parse_timeout("1e300", "the command line")  # was accepted, then an OverflowError
    assert parse_timeout("604800", "x") == 604800.0
    with pytest.raises(ConfigError, match="1025 ranks are more than one machine runs"):
        parse_gpus("1025", "the command line")  # would have started 1025 processes
    assert parse_gpus("1024", "x") == 1024
    with pytest.raises(ConfigError) as info:
        parse_gpus("9" * 5000, "the command line")
    assert len(str(info.value)) < 200 and "(5002 characters)" in str(info.value)


def test_what_the_fuzzer_found_in_sizes() -> None:
    assert parse_size("9007199254740993") == 9007199254740993  # was 9007199254740992
    assert parse_size(str(2**63 - 1)) == 2**63 - 1
    for too_big in ("1" + "0" * 400, "9" * 5000, 2**63):  # was an OverflowError
        with pytest.raises(ValueError, match="size"):
            parse_size(too_big)
    assert parse_size("0") == 0 and parse_size("0.5KiB") == 512
    assert parse_size(np.int64(1024)) == 1024  # numpy's integers are byte counts too
    for not_ascii in ("\u0663", "\uff12KiB", "4\u212a"):  # Arabic 3, fullwidth 2, Kelvin K
        with pytest.raises(ValueError, match="bad size"):
            parse_size(not_ascii)


def test_a_path_option_is_a_path_or_an_error_naming_the_option() -> None:
    assert parse_path("~/x.json", "--distperf-json", "x") == Path.home() / "x.json"
    assert parse_path("out/x.json", "--distperf-json", "x") == Path("out/x.json")
    for bad, words in (("~nosuchuser_zz/x.json", "cannot expand '~nosuchuser_zz/x.json'"),
                       ("", "expected a path, got ''"), ("a\0b", "expected a path")):
        with pytest.raises(ConfigError, match=f"--distperf-json: {words}"):
            parse_path(bad, "--distperf-json", "the command line")
