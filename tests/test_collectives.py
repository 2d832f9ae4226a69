"""nccl_group.bench / bench_pairs and the collective health-check suite.

Pure parts (planning, formulas, the pair analysis, the tables) are unit-tested here; the
measurements run on real gloo groups in one pytester run (2 and 4 ranks from one pool,
plus the suite through ``--pyargs``), and its outcomes, output and JSON report are checked.
No timing limit is asserted anywhere: only relations that hold on any machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any

import pytest

from pytest_distperf.analysis.topology import slow_pairs, suspect_ranks
from pytest_distperf.fixtures import collectives
from pytest_distperf.fixtures.collectives import OPS, build_result, plan
from pytest_distperf.fixtures.results import record_from_dict, record_to_dict
from pytest_distperf.fixtures.results.group import PairMatrix, PairRow
from pytest_distperf.records import INFORMATIONAL, BenchSpec, Measurement, SizeOutcome, TestRecord
from pytest_distperf.report import terminal as report

#: nccl-tests' bus factors, written out independently of common.bandwidth.BUS_FACTORS.
EXPECTED_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
KIB = 1024
MIB = 1024**2


# -- planning -------------------------------------------------------------------------------
@pytest.mark.parametrize("op", sorted(EXPECTED_FACTOR))
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_bus_factor_is_nccl_tests(op: str, n: int) -> None:
    assert collectives.bus_factor(op, n) == pytest.approx(EXPECTED_FACTOR[op](n), abs=0)


def test_unknown_op_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown collective 'allreduce'") as info:
        plan("allreduce", None, None, 5, 20, world_size=2, device_type="cpu")
    for op in OPS:
        assert op in str(info.value)


@pytest.mark.parametrize("bad", ["sixteen", "16 XB", "1.5B", "-4KiB", "", -1, 0, "0B", True,
                                 2.5, [1024, "lots"]])
def test_bad_sizes_are_clear_value_errors(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"size|sizes"):
        plan("all_reduce", bad, None, 1, 1, world_size=2, device_type="cpu")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"warmup": -1}, "warmup must be an int >= 0"),
    ({"iters": 0}, "iters must be an int >= 1"),
    ({"iters": 2.5}, "iters must be an int >= 1"),
    ({"dtype": "bool"}, "not supported"),
    ({"dtype": "complex64"}, "not supported"),
    ({"dtype": "floaty"}, "must be a torch dtype"),
])
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    args = {"warmup": 1, "iters": 1, "dtype": None} | kwargs
    with pytest.raises(ValueError, match=match):
        plan("all_reduce", "4KiB", args["dtype"], args["warmup"], args["iters"],
             world_size=2, device_type="cpu")


def test_send_recv_needs_two_ranks() -> None:
    with pytest.raises(ValueError, match="at least 2 ranks"):
        plan("send_recv", "4KiB", None, 1, 1, world_size=1, device_type="cpu")


def test_default_sweeps() -> None:
    cpu = plan("all_reduce", None, None, 1, 1, world_size=2, device_type="cpu")
    gpu = plan("all_reduce", None, None, 1, 1, world_size=2, device_type="cuda")
    assert cpu.labels == ("64KiB", "256KiB", "1MiB", "4MiB", "16MiB", "64MiB")
    assert gpu.labels[0] == "64KiB" and gpu.labels[-1] == "1GiB" and len(gpu.labels) == 8
    assert cpu.counts == tuple(n // 4 for n in (64 * KIB * 4**i for i in range(6)))


def test_sizes_sorted_deduplicated_and_rounded_per_rank() -> None:
    spec = plan("all_gather", ["1MiB", 1000, 1048576, "4KiB"], "float32", 1, 1,
                world_size=3, device_type="cpu")
    assert spec.labels == ("1000B", "4KiB", "1MiB")
    # whole elements, a whole number per rank (nccl-tests rounds down the same way)
    assert spec.counts == (83 * 3, 341 * 3, 87381 * 3)
    tiny = plan("all_to_all", [1], "float64", 1, 1, world_size=4, device_type="cpu")
    assert tiny.counts == (4,)  # at least one element per rank
    assert plan("all_reduce", "4KiB", "bfloat16", 1, 1, world_size=4,
                device_type="cpu").counts == (2048,)
    barrier = plan("barrier", ["1MiB"], None, 1, 1, world_size=4, device_type="cpu")
    assert barrier.counts == (0,)


def test_the_time_floor_is_planned() -> None:
    def spec(iters: Any, device: str = "cpu", **kw: Any) -> BenchSpec:
        return plan("all_reduce", "4KiB", None, 5, iters, world_size=2, device_type=device, **kw)

    default = spec(None)  # iters not given: 20, and on CPU ranks a floor of 1 s per size
    assert (default.iters, default.min_time_s) == (20, collectives.CPU_MIN_TIME_S)
    assert default.max_iters == collectives.MAX_ITERS
    assert (spec(7).iters, spec(7).min_time_s) == (7, 0.0)  # a given iters is exact
    assert spec(None, "cuda").min_time_s == 0.0  # GPUs: nccl-tests' fixed count
    assert spec(7, min_time_s=0.5).min_time_s == 0.5
    assert spec(None, min_time_s=0).min_time_s == 0.0
    assert spec(5000).max_iters == 5000  # the cap never cuts a count asked for
    for bad in (-1, math.nan, math.inf, "1", True):
        with pytest.raises(ValueError, match="min_time_s must be a number of seconds"):
            spec(None, min_time_s=bad)


def test_the_table_says_when_a_floor_added_calls() -> None:
    spec = dataclasses.replace(_spec("all_reduce", 2, (1024,)), iters=2)
    per_rank = [[SizeOutcome((1e-3, 2e-3, 3e-3, 4e-3), 0, "")]] * 2
    header = report.collective_table(build_result(spec, per_rank, backend="gloo",
                                                  device_type="cpu"))[0]
    assert "warmup 0  iters 2..4 (a time floor per size)" in header


def test_the_table_of_gloo_on_gpu_tensors_says_its_busbw_is_gloos() -> None:
    spec = _spec("all_reduce", 2, (1024,))
    per_rank = [[SizeOutcome((1e-3, 2e-3, 3e-3), 0, "")]] * 2
    lines = report.collective_table(build_result(spec, per_rank, backend="gloo",
                                                 device_type="cuda"))
    assert lines[0].startswith("# all_reduce  2 ranks  gloo/cuda")
    assert lines[1] == ("# gloo copies GPU tensors through host memory: its communication "
                        "figures (bench's busbw, a step's communication) are gloo's, not "
                        "NVLink's or PCIe's")
    for backend, device in (("gloo", "cpu"), ("nccl", "cuda")):
        table = report.collective_table(build_result(spec, per_rank, backend=backend,
                                                     device_type=device))
        assert not any("host memory" in line for line in table)


# -- formulas from samples ------------------------------------------------------------------
def _spec(op: str, n: int, counts: tuple[int, ...]) -> BenchSpec:
    return BenchSpec(op, tuple(f"{c * 4}B" for c in counts), counts, "float32", 4, 0, 3, n)


def test_time_is_median_of_slowest_rank_and_bandwidths_follow() -> None:
    spec = _spec("all_reduce", 2, (1024,))
    per_rank = [[SizeOutcome((1e-3, 5e-3, 2e-3,), 0, "")],
                [SizeOutcome((2e-3, 1e-3, 4e-3,), 0, "")]]
    row = build_result(spec, per_rank, backend="gloo", device_type="cpu").rows[0]
    assert row.samples_us == pytest.approx((2000.0, 5000.0, 4000.0))
    assert row.time_us == pytest.approx(4000.0)
    assert row.algbw_gbps == pytest.approx(4096 / 4000e-6 / 1e9)
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 1.0)  # 2(n-1)/n = 1 at n = 2
    assert row.spread == pytest.approx((4800 - 2400) / 4000)


def test_wrong_counts_add_up_and_stop_the_metrics() -> None:
    spec = _spec("reduce", 2, (16, 32))
    ok = SizeOutcome((1e-3,), 0, "")
    per_rank = [[ok, SizeOutcome((1e-3,), 3, "rank 0: element 7")],
                [ok, ok]]
    result = build_result(spec, per_rank, backend="gloo", device_type="cpu")
    assert [r.wrong for r in result.rows] == [0, 3]
    assert result.wrong == 3
    message = collectives.wrong_message(result)
    assert "#wrong = 3" in message and "128B: 3 wrong (rank 0: element 7)" in message


def test_metric_names_and_directions() -> None:
    spec = _spec("all_gather", 4, (4096, 4 * MIB))
    per_rank = [[SizeOutcome((1e-3, 2e-3,), 0, "")] * 2] * 4
    result = build_result(spec, per_rank, backend="gloo", device_type="cpu")
    metrics = result.metrics()
    assert [m.name for m in metrics] == ["all_gather.16384B.busbw_gbps",
                                         "all_gather.16777216B.busbw_gbps"]
    assert all(m.higher_is_better and m.unit == "GB/s" for m in metrics)
    assert metrics[0].value == result.rows[0].busbw_gbps
    # per-iteration busbw samples, from the per-iteration times
    assert metrics[0].samples == pytest.approx((16384 * 0.75 / 1e6, 16384 * 0.75 / 2e6))
    barrier = build_result(BenchSpec("barrier", ("0B",), (0,), "float32", 4, 0, 2, 2),
                           [[SizeOutcome((1e-5, 3e-5,), 0, "")]] * 2,
                           backend="gloo", device_type="cpu")
    (metric,) = barrier.metrics()
    assert (metric.name, metric.unit, metric.higher_is_better) == ("barrier.time_us", "us", False)
    assert metric.value == pytest.approx(20.0)


def test_one_rank_records_time_where_busbw_is_zero_by_definition() -> None:
    spec = _spec("all_reduce", 1, (4096,))
    result = build_result(spec, [[SizeOutcome((1e-5, 3e-5), 0, "")]], backend="nccl",
                          device_type="cuda")
    assert result.rows[0].busbw_gbps == 0.0 and result.rows[0].algbw_gbps > 0
    (metric,) = result.metrics()
    assert (metric.name, metric.unit, metric.higher_is_better) == (
        "all_reduce.16384B.time_us", "us", False)
    assert metric.value == pytest.approx(20.0)
    assert metric.samples == pytest.approx((10.0, 30.0))
    assert metric.kind == INFORMATIONAL  # no data moves: the launch's time, never a failure


# -- the pair matrix ------------------------------------------------------------------------
def _matrix(n: int, slow: dict[tuple[int, int], float]) -> PairMatrix:
    rows = []
    for src in range(n):
        for dst in range(n):
            if src != dst:
                bw = slow.get((src, dst), 10.0)
                rows.append(PairRow(src, dst, 1e3 / bw, bw, 0, (1e3 / bw,) * 3))
    return PairMatrix(n, "gloo", "cpu", "float32", "1MiB", MIB, 1, 3, tuple(rows))


def test_pair_matrix_points_at_a_slow_device() -> None:
    bad = {(s, d): 3.0 for s in range(4) for d in range(4) if s != d and 2 in (s, d)}
    m = _matrix(4, bad)
    assert m.matrix()[2][2] is None and m.matrix()[0][1] == 10.0 and m.matrix()[2][0] == 3.0
    assert len(slow_pairs(m)) == 6
    assert suspect_ranks(m) == [2]
    lines = report.pair_matrix_lines(m)
    assert any("suspect rank(s) 2" in line for line in lines)


def test_pair_matrix_points_at_a_slow_link_not_a_rank() -> None:
    m = _matrix(4, {(1, 3): 2.0, (3, 1): 2.5})
    assert [(p.src, p.dst) for p in slow_pairs(m)] == [(1, 3), (3, 1)]
    assert suspect_ranks(m) == []
    assert any("suspect the link" in line for line in report.pair_matrix_lines(m))
    healthy = _matrix(4, {})
    assert slow_pairs(healthy) == [] and suspect_ranks(healthy) == []
    (metric,) = m.metrics()
    assert metric.name == "pairs.1MiB.min_busbw_gbps" and metric.value == 2.0


# -- tables ---------------------------------------------------------------------------------
def test_table_survives_the_json_round_trip() -> None:
    spec = _spec("all_reduce", 4, (1024, 4096))
    per_rank = [[SizeOutcome((1e-3, 2e-3,), 0, "")] * 2] * 4
    result = build_result(spec, per_rank, backend="gloo", device_type="cpu")
    record = TestRecord("t.py::test", 4, [
        Measurement("bench(all_reduce)", tuple(result.metrics()), result),
        Measurement("bench_pairs(1MiB)", (), _matrix(3, {})),
        Measurement("other", (), {"anything": 1})])
    again = record_from_dict(json.loads(json.dumps(record_to_dict(record))))
    assert again.measurements[0].result == result  # typed again, by its kind
    assert again.measurements[2].result == {"anything": 1}
    assert again.metrics == record.metrics
    lines = report.collective_lines([again])
    text = "\n".join(lines)
    assert "# all_reduce  4 ranks  gloo/cpu" in text and "busbw = algbw x 1.5" in text
    assert "#wrong" in text and "# src/dst" in text
    data_rows = [line for line in lines if line.strip().startswith(("4096 ", "16384 "))]
    assert len(data_rows) == 2


# -- real gloo groups -----------------------------------------------------------------------
RANK_TESTS = r'''
import json, math, statistics
import pytest
import torch
import torch.distributed as dist
from pytest_distperf.fixtures.collectives import OPS, WrongResultError

FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "send_recv": lambda n: 1.0,
}
SIZES = ["4KiB", 1000, "16KiB"]


def check_every_op(group, n):
    assert group.world_size == n
    for op in OPS:
        result = group.bench(op, SIZES, warmup=1, iters=3)
        assert result.op == op and result.world_size == n and result.wrong == 0
        if op == "barrier":
            (row,) = result.rows
            assert row.time_us > 0 and len(row.samples_us) == 3
            continue
        assert [r.label for r in result.rows] == ["1000B", "4KiB", "16KiB"]
        sizes = [r.size_bytes for r in result.rows]
        assert sizes == sorted(sizes) and len(set(sizes)) == 3
        for row in result.rows:
            assert row.count * 4 == row.size_bytes
            assert len(row.per_rank_us) == n and all(len(s) == 3 for s in row.per_rank_us)
            slowest = [max(col) for col in zip(*row.per_rank_us)]
            assert list(row.samples_us) == slowest
            assert row.time_us == statistics.median(slowest)
            assert math.isclose(row.algbw_gbps, row.size_bytes / (row.time_us * 1e3),
                                rel_tol=1e-12)
            assert math.isclose(row.busbw_gbps, row.algbw_gbps * FACTOR[op](n), rel_tol=1e-12)
            if op in ("all_gather", "reduce_scatter", "all_to_all"):
                assert row.count % n == 0


def test_every_op_at_4_ranks(nccl_group):
    check_every_op(nccl_group, 4)


@pytest.mark.distperf(world_size=2)
def test_every_op_at_2_ranks(nccl_group):
    check_every_op(nccl_group, 2)


def test_other_dtypes_are_checked(nccl_group):
    for dtype in (torch.bfloat16, torch.float16, torch.int32, torch.float64, "int8"):
        for op in ("all_reduce", "reduce_scatter", "all_to_all"):
            result = nccl_group.bench(op, "2KiB", dtype=dtype, warmup=0, iters=1)
            assert result.wrong == 0, (dtype, op)


@pytest.mark.distperf(world_size=2)
def test_a_time_floor_adds_calls(nccl_group):
    import dataclasses
    from pytest_distperf.fixtures.collectives import plan
    from pytest_distperf.rank.collectives import bench_on_rank

    exact = nccl_group.bench("all_reduce", "4KiB", warmup=1, iters=2)
    assert len(exact.rows[0].samples_us) == 2  # a given iters is exactly that
    # 0.5 s of 4 KiB all-reduces: 2 calls only if one took 0.25 s
    (row,) = nccl_group.bench("all_reduce", "4KiB", warmup=1, iters=2, min_time_s=0.5).rows
    calls = len(row.samples_us)
    assert calls > 2 and len(row.control_s) == calls
    assert all(len(times) == calls for times in row.per_rank_us)  # every rank made them
    spec = plan("all_reduce", "4KiB", None, 0, 3, world_size=2, device_type="cpu",
                min_time_s=60.0)
    capped = nccl_group.run(bench_on_rank, dataclasses.replace(spec, max_iters=7))
    assert [len(outcomes[0].samples) for outcomes in capped] == [7, 7]


def test_bad_calls_are_clear(nccl_group):
    with pytest.raises(ValueError, match="valid ops: all_reduce, all_gather"):
        nccl_group.bench("allreduce")
    with pytest.raises(ValueError, match="bad size '16 potatoes'"):
        nccl_group.bench("all_reduce", ["4KiB", "16 potatoes"])


def test_pairs(nccl_group):
    m = nccl_group.bench_pairs("8KiB", warmup=1, iters=2)
    grid = m.matrix()
    assert len(grid) == 4 and all(grid[i][i] is None for i in range(4))
    assert len(m.pairs) == 12 and m.wrong == 0 and m.size_bytes == 8192
    assert all(grid[p.src][p.dst] == p.busbw_gbps > 0 for p in m.pairs)
    assert m.by_node is None and m.bottlenecks == ()  # one machine: no view by node
    assert [x.name for x in m.metrics()] == ["pairs.8KiB.min_busbw_gbps"]


def corrupt_all_reduce_on_rank_1():
    """A deliberately wrong reduction: rank 1 adds 1 to the first element it gets back."""
    original = dist.all_reduce

    def wrong(tensor, *args, **kwargs):
        work = original(tensor, *args, **kwargs)
        if dist.get_rank() == 1:
            tensor.view(-1)[0] += 1
        return work

    wrong.original = original
    dist.all_reduce = wrong


def restore_all_reduce():
    dist.all_reduce = getattr(dist.all_reduce, "original", dist.all_reduce)


def test_bench_with_the_host_speed_control(nccl_group):
    r = nccl_group.bench("all_reduce", ["64KiB"], iters=5, warmup=1)  # on by default on CPU
    (row,) = r.rows
    assert len(row.control_s) == 5 and min(row.control_s) > 0  # one per timed call
    (m,) = r.metrics()
    assert m.control == row.control_s and m.higher_is_better
    plain = nccl_group.bench("all_reduce", ["64KiB"], iters=5, warmup=1, control=False)
    assert plain.rows[0].control_s == () and plain.metrics()[0].control == ()


def test_wrong_reduction_is_counted(nccl_group):
    nccl_group.run(corrupt_all_reduce_on_rank_1)
    try:
        with pytest.raises(WrongResultError) as info:
            nccl_group.bench("all_reduce", ["4KiB", "8KiB"], warmup=0, iters=1)
        assert [r.wrong for r in info.value.result.rows] == [1, 1]
        assert "rank 1: element 0" in str(info.value)
        assert nccl_group.bench("broadcast", "4KiB", warmup=0, iters=1).wrong == 0
    finally:
        nccl_group.run(restore_all_reduce)
    assert nccl_group.bench("all_reduce", "4KiB", warmup=0, iters=1).wrong == 0


def test_wrong_reduction_fails_the_test(nccl_group):
    nccl_group.run(corrupt_all_reduce_on_rank_1)
    try:
        nccl_group.bench("all_reduce", "4KiB", warmup=0, iters=1)
    finally:
        nccl_group.run(restore_all_reduce)
'''


def test_bench_on_real_gloo_groups(pytester: pytest.Pytester,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One pool of 4 ranks: every op at 4 and at 2 ranks, dtypes, pairs, a wrong reduction,
    bad calls, and the ready-made suite through ``--pyargs`` with tiny sizes."""
    pytester.makepyfile(test_bench=RANK_TESTS)
    monkeypatch.setenv("DISTPERF_SUITE_SIZES", "4KiB,64KiB")
    monkeypatch.setenv("DISTPERF_SUITE_WARMUP", "1")
    monkeypatch.setenv("DISTPERF_SUITE_ITERS", "2")
    monkeypatch.setenv("DISTPERF_SUITE_PAIR_SIZE", "8KiB")
    json_path = pytester.path / "report.json"
    result = pytester.runpytest(
        "test_bench.py", "--pyargs", "pytest_distperf.suite", "--distperf", "--gpus", "4",
        "-p", "no:cacheprovider", f"--distperf-json={json_path}", "-rf")
    suite_tests = len(OPS) + 1
    result.assert_outcomes(passed=8 + suite_tests, failed=1)
    result.stdout.fnmatch_lines([
        "*test_wrong_reduction_fails_the_test*",
        "*all_reduce returned wrong values on 4 ranks (gloo, float32); #wrong = 1:",
        "*4KiB: 1 wrong (rank 1: element 0 is 11.0, expected 10.0)",
    ])
    # the nccl-tests-style tables and the pair matrix reach the terminal without -s
    result.stdout.fnmatch_lines([
        "*distperf collectives (nccl-tests style)*",
        "*test_collective_health.py::test_collective?all_reduce?",
        "# all_reduce  4 ranks  gloo/cpu  warmup 1  iters 2  busbw = algbw x 1.5",
        "#       size         count      type   redop   root       time  spread    algbw    busbw"
        "  #wrong",
        "        4096          1024   float32     sum     -1 *       0",
        "       65536         16384   float32     sum     -1 *       0",
        "# Out of bounds values : 0 OK",
    ])
    result.stdout.fnmatch_lines([
        "*test_pairwise_send_recv",
        "# send/recv between rank pairs, one pair at a time  8KiB float32  gloo/cpu  iters 2",
        "*",
        "# src/dst        0        1        2        3",
        "        0        -  *",
        "        3  *        -",
    ])
    # the failed test's table shows its #wrong
    result.stdout.fnmatch_lines(["*test_wrong_reduction_fails_the_test",
                                 "# all_reduce  4 ranks*", "*", "*",
                                 "        4096          1024   float32     sum     -1 *       1",
                                 "# Out of bounds values : 1 FAILED"])
    # metrics under stable names, with their directions, for the verdict machinery
    data = json.loads(json_path.read_text())
    metrics = {m["name"]: m for t in data["tests"] for m in t["metrics"]
               if t["nodeid"].endswith("test_collective[all_reduce]")
               or t["nodeid"].endswith("test_collective[barrier]")
               or t["nodeid"].endswith("test_pairwise_send_recv")}
    assert set(metrics) == {"all_reduce.4KiB.busbw_gbps", "all_reduce.64KiB.busbw_gbps",
                            "barrier.time_us", "pairs.8KiB.min_busbw_gbps"}
    assert metrics["all_reduce.64KiB.busbw_gbps"]["higher_is_better"] is True
    assert metrics["barrier.time_us"]["higher_is_better"] is False
    assert len(metrics["all_reduce.64KiB.busbw_gbps"]["samples"]) == 2
    failed = next(t for t in data["tests"] if t["nodeid"].endswith("fails_the_test"))
    assert failed["metrics"] == []  # a wrong collective records no bandwidth
    two = next(t for t in data["tests"] if t["nodeid"].endswith("test_every_op_at_2_ranks"))
    assert all(m["world_size"] == 2 for m in two["metrics"])
    assert math.isfinite(statistics.median(
        m["value"] for t in data["tests"] for m in t["metrics"]))


def test_busbw_as_a_fraction_of_the_links_peak() -> None:
    from pytest_distperf.analysis import hardware
    from pytest_distperf.report.terminal import collective_table

    spec = _spec("all_reduce", 8, (1 << 20, 1 << 26))
    per_rank = [[SizeOutcome((1e-3, 1e-3), 0, ""), SizeOutcome((2e-4, 2e-4), 0, "")]] * 8
    plain = build_result(spec, per_rank, backend="nccl", device_type="cuda")
    assert plain.peak_fraction(plain.rows[0]) is None  # unknown: nothing said
    assert not any("Link peak" in line for line in collective_table(plain))
    peak = hardware.link_peak("nccl", "cuda", "NVIDIA H100 80GB HBM3")
    assert peak == (450.0, "NVLink 4")
    assert hardware.link_peak("nccl", "cuda", "NVIDIA H100 PCIe") is None
    assert hardware.link_peak("gloo", "cpu", "NVIDIA H100 80GB HBM3") is None
    result = dataclasses.replace(plain, link_peak_gbps=peak[0], link=peak[1])
    best = result.rows[1]  # the larger size, 5x faster
    assert result.peak_fraction(best) == pytest.approx(best.busbw_gbps / 450.0)
    (line,) = [x for x in collective_table(result) if x.startswith("# Link peak")]
    assert line == (f"# Link peak            : 450 GB/s (NVLink 4); best busbw "
                    f"{best.busbw_gbps / 450:.0%} of it ({best.label})")
    one = build_result(_spec("all_reduce", 1, (1 << 20,)), [[SizeOutcome((1e-5,), 0, "")]],
                       backend="nccl", device_type="cuda")
    one = dataclasses.replace(one, link_peak_gbps=450.0, link="NVLink 4")
    assert one.peak_fraction(one.rows[0]) is None  # one rank: no data crosses a link
    assert not any("Link peak" in line for line in collective_table(one))
