"""The pure trace code: merging ranks' traces and reading communication, overlap, imbalance and
desync out of them.

Two kinds of input: hand-made traces shaped like Kineto's (the NCCL ``record_param_comms``
path, which this CPU machine cannot produce, and gloo's ``c10d::`` path), and real traces
profiled on two gloo ranks during this test run.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pytest_distperf.analysis import traces as T
from pytest_distperf.analysis.analyzer import analyze_steps
from pytest_distperf.analysis.traces.census import count_ops
from pytest_distperf.fixtures.results.profile import ProfileReport
from pytest_distperf.fixtures.results.steps import CommCount
from pytest_distperf.records import RankStep, from_dict, to_dict

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

HOST_PID = 4242
MAIN_TID = 4242
GPU_STREAM = 7  # compute stream
NCCL_STREAM = 20  # NCCL's own stream


# -- builders of Kineto-shaped traces ------------------------------------------------------------
def _x(name: str, cat: str, ts: float, dur: float, *, pid: Any = HOST_PID, tid: Any = MAIN_TID,
       **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _meta(kind: str, pid: Any, tid: Any, **args: Any) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "ts": 0, "args": args}


NCCL_NAMES = {"all_reduce": ("allreduce", "AllReduce_Sum_f32_RING_LL"),
              "all_gather": ("_allgather_base", "AllGather_RING_LL"),
              "broadcast": ("broadcast", "Broadcast_RING_LL")}


def nccl_trace(rank: int, *, base_ns: int = 1_700_000_000_000_000_000,
               comms: Sequence[tuple[str, int, float, float]] = (),
               compute: Sequence[tuple[float, float]] = (), region: tuple[float, float] = (0, 1000),
               group_size: int = 2, kernel_metadata: bool = True) -> dict[str, Any]:
    """One rank's trace as Kineto writes it for NCCL on a GPU (torch 2.x).

    ``comms``: (collective, elements, kernel start, kernel duration) in microseconds; each is
    issued from the host as c10d op > record_param_comms > nccl:<op> > cudaLaunchKernel and runs
    as a kernel on NCCL's stream.  ``compute``: (start, duration) of GEMM kernels on the compute
    stream.  ``kernel_metadata=False`` leaves the collective metadata off the kernels (older
    Kineto), so that only the launch correlation links a kernel to its collective.
    """
    ev: list[dict[str, Any]] = [
        _meta("process_name", HOST_PID, 0, name="python"),
        _meta("process_labels", HOST_PID, 0, labels="CPU"),
        _meta("thread_name", HOST_PID, MAIN_TID, name=f"thread {MAIN_TID} (python)"),
        _meta("process_name", 0, 0, name="GPU 0"),
        _meta("process_labels", 0, 0, labels="GPU 0"),
        _meta("thread_name", 0, GPU_STREAM, name=f"stream {GPU_STREAM} "),
        _meta("thread_name", 0, NCCL_STREAM, name=f"stream {NCCL_STREAM} "),
        _x(T.REGION_NAME, "user_annotation", region[0], region[1] - region[0],
           **{"External id": 1}),
        _x("PyTorch Profiler (0)", "Trace", region[0] - 5, region[1] - region[0] + 10,
           pid="Spans", tid="PyTorch Profiler"),
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": region[0] - 5},
    ]
    ext, corr = 10, 5000
    for i, (start, dur) in enumerate(compute):
        ext += 1
        corr += 1
        host = max(region[0] + 1, start - 20)
        ev.append(_x("aten::mm", "cpu_op", host, 4, **{"External id": ext}))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", host + 1, 2,
                     **{"External id": ext, "correlation": corr, "cbid": 211}))
        ev.append(_x(f"sm90_xmma_gemm_f32f32_{i}", "kernel", start, dur, pid=0, tid=GPU_STREAM,
                     **{"External id": ext, "correlation": corr, "device": 0,
                        "stream": GPU_STREAM}))
    for seq, (name, nelems, start, dur) in enumerate(comms, start=1):
        raw, kernel = NCCL_NAMES[name]
        ext += 3
        corr += 1
        host = max(region[0] + 1, start - 15)
        out_nelems = nelems * group_size if name == "all_gather" else nelems
        meta = {"Collective name": raw, "dtype": "Float", "In msg nelems": nelems,
                "Out msg nelems": out_nelems, "Group size": group_size,
                "In split size": "[]", "Out split size": "[]", "Global rank start": 0,
                "Global rank stride": 1, "Process Group Name": "0",
                "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(range(group_size)))}
        ev.append(_x(f"c10d::{raw.strip('_')}_", "cpu_op", host, 10, **{"External id": ext - 2}))
        ev.append(_x("record_param_comms", "cpu_op", host + 1, 8,
                     **{"External id": ext - 1, "Rank": rank, "Seq": seq, **meta}))
        ev.append(_x(f"nccl:{name}", "user_annotation", host + 2, 6, **{"External id": ext}))
        ev.append(_x("cudaLaunchKernel", "cuda_runtime", host + 3, 2,
                     **{"External id": ext, "correlation": corr, "cbid": 211}))
        ev.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": MAIN_TID, "ts": host + 3,
                   "cat": "ac2g", "name": "ac2g"})
        ev.append({"ph": "f", "id": corr, "pid": 0, "tid": NCCL_STREAM, "ts": start,
                   "cat": "ac2g", "name": "ac2g", "bp": "e"})
        kernel_args = {"External id": ext, "correlation": corr, "device": 0,
                       "stream": NCCL_STREAM, "grid": [2, 1, 1], "block": [640, 1, 1]}
        if kernel_metadata:
            kernel_args.update(meta)
        ev.append(_x(f"ncclDevKernel_{kernel}(ncclDevComm*, unsigned long, ncclWork*)",
                     "kernel", start, dur, pid=0, tid=NCCL_STREAM, **kernel_args))
        ev.append(_x(f"nccl:{name}", "gpu_user_annotation", start, dur, pid=0,
                     tid=NCCL_STREAM, **{"External id": ext}))
        # the wait() on the work object: bookkeeping, not a collective
        ev.append(_x("record_param_comms", "cpu_op", host + 12, 1,
                     **{"Collective name": "wait", "dtype": "Byte", "In msg nelems": 0,
                        "Out msg nelems": 0, "Group size": group_size, "Seq": seq,
                        "Process Group Name": "0"}))
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": group_size},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": base_ns,
        "traceEvents": ev,
    }


def gloo_trace(rank: int, *, base_ns: int = 1_700_000_000_000_000_000,
               comms: Sequence[tuple[str, int, float, float, float]] = (),
               compute: Sequence[tuple[float, float]] = (),
               region: tuple[float, float] = (0, 1000)) -> dict[str, Any]:
    """One rank's trace as torch 2.13 writes it for gloo on CPU: ``c10d::`` ops on the calling
    thread, ``gloo:<op>`` annotations on gloo's worker thread, no ``record_param_comms``.

    ``comms``: (collective, elements, issue time, run start, run duration); ``compute``:
    (start, duration) of ``aten::mm`` on the main thread.
    """
    gloo_tid = MAIN_TID + 7
    ops = {"all_reduce": ("c10d::allreduce_", "TensorList"),
           "all_gather": ("c10d::_allgather_base_", "float"),
           "broadcast": ("c10d::broadcast_", "TensorList"),
           "barrier": ("c10d::barrier", "unsigned char"),
           "reduce_scatter": ("c10d::_reduce_scatter_base_", "float")}
    runs_as = {"reduce_scatter": "all_reduce"}  # gloo has no reduce-scatter of its own
    ev: list[dict[str, Any]] = [
        _meta("process_name", HOST_PID, 0, name="python"),
        _meta("thread_name", HOST_PID, MAIN_TID, name=f"thread {MAIN_TID} (python)"),
        _meta("thread_name", HOST_PID, gloo_tid, name=f"thread {gloo_tid} (pt_gloo_runloop)"),
        _x(T.REGION_NAME, "user_annotation", region[0], region[1] - region[0]),
    ]
    for start, dur in compute:
        ev.append(_x("aten::matmul", "cpu_op", start, dur))
        ev.append(_x("aten::mm", "cpu_op", start + dur * 0.1, dur * 0.8))
    for name, nelems, issue, run, dur in comms:
        op, in_type = ops[name]
        if name == "all_gather":
            dims: list[Any] = [[nelems * 2], [nelems], [], [], []]
            types = ["float", "float", "", "Scalar", "Scalar"]
        elif name == "reduce_scatter":
            dims = [[nelems // 2], [nelems], [], [], []]
            types = ["float", "float", "", "Scalar", "Scalar"]
        elif name == "barrier":
            dims, types = [[1], [], [], [], []], ["unsigned char", "", "ScalarList", "", ""]
        else:
            dims, types = [[[nelems]], [], [], [], [], []], [in_type, "", "", "", "Scalar", ""]
        ev.append(_x(op, "cpu_op", issue, 5, **{"Input Dims": dims, "Input type": types}))
        ev.append(_x("aten::empty", "cpu_op", issue + 1, 1))  # inside the call: not compute
        gloo_args = {} if name == "barrier" else {"Input Dims": [[nelems]],
                                                  "Input type": ["float"]}
        ev.append(_x(f"gloo:{runs_as.get(name, name)}", "user_annotation", run, dur,
                     tid=gloo_tid, **gloo_args))
    return {"schemaVersion": 1, "baseTimeNanoseconds": base_ns,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "traceEvents": ev}


# -- names, sizes, intervals ---------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "canonical"), [
    ("c10d::allreduce_", "all_reduce"),
    ("allreduce", "all_reduce"),
    ("gloo:all_reduce", "all_reduce"),
    ("_allgather_base", "all_gather"),
    ("c10d::_allgather_base_", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather_coalesced"),
    ("_reduce_scatter_base", "reduce_scatter"),
    ("c10d::alltoall_base_", "all_to_all"),
    ("_c10d_functional::all_reduce", "all_reduce"),
    ("c10d::broadcast_", "broadcast"),
    ("c10d::barrier", "barrier"),
    ("c10d::recv_any_source_", "recv"),
    ("wait", "wait"),
])
def test_canonical_collective(raw: str, canonical: str) -> None:
    assert T.canonical_collective(raw) == canonical


@pytest.mark.parametrize(("raw", "expected"), [
    ("Float", ("float32", 4)), ("float", ("float32", 4)), ("c10::BFloat16", ("bfloat16", 2)),
    ("BFloat16", ("bfloat16", 2)), ("Half", ("float16", 2)), ("long int", ("int64", 8)),
    ("unsigned char", ("uint8", 1)), ("TensorList", ("", 0)), ("", ("", 0)),
])
def test_canonical_dtype(raw: str, expected: tuple[str, int]) -> None:
    assert T.canonical_dtype(raw) == expected


@pytest.mark.parametrize(("a", "b", "merged_a", "both"), [
    ([(0, 10), (5, 20), (30, 40)], [(15, 35)], [(0, 20), (30, 40)], 10.0),
    ([(0, 10)], [(10, 20)], [(0, 10)], 0.0),
    ([(0, 10), (2, 3)], [(0, 100)], [(0, 10)], 10.0),
    ([], [(0, 1)], [], 0.0),
])
def test_intervals(a: list[tuple[float, float]], b: list[tuple[float, float]],
                   merged_a: list[tuple[float, float]], both: float) -> None:
    ma, mb = T.merge_intervals(a), T.merge_intervals(b)
    assert ma == merged_a
    assert T.intersection_length(ma, mb) == both
    assert T.clip_intervals([(0, 10), (20, 30)], 5, 25) == [(5, 10), (20, 25)]


def test_trace_file_name_is_safe() -> None:
    name = T.trace_file_name("tests/test_x.py::test_y[a/b-2]", 3)
    assert name.endswith(".3.trace.json") and "/" not in name and "[" not in name
    assert len(T.trace_file_name("t.py::" + "x" * 500)) < 200


def test_trace_file_names_never_collide() -> None:
    """Ids that read alike get different files; a plain id keeps its readable name."""
    ids = ["t.py::test[a/b]", "t.py::test[a b]", "t.py::test[a_b]", "a/b.py::t", "a_b.py::t",
           "t.py::" + "x" * 200, "t.py::" + "x" * 201]
    names = [T.trace_file_name(i) for i in ids]
    assert len(set(names)) == len(ids), names
    assert T.trace_file_name("t.py::test_x") == "t.py__test_x.trace.json"
    assert T.trace_file_name("t.py::test_x") == T.trace_file_name("t.py::test_x")


# -- merging -------------------------------------------------------------------------------------
def test_merge_one_process_per_rank_on_one_clock() -> None:
    base = 1_700_000_000_000_000_000
    # rank 1's profiler counts from a base 2.5 ms later: its ts 100 is the merged ts 2600
    ranks = [nccl_trace(0, base_ns=base, comms=[("all_reduce", 1024, 100, 50)]),
             nccl_trace(1, base_ns=base + 2_500_000, comms=[("all_reduce", 1024, 100, 50)])]
    merged = T.merge_traces(ranks)
    events = merged["traceEvents"]
    assert merged["baseTimeNanoseconds"] == base
    assert {e["pid"] for e in events} == {0, 1}
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    kernels = {e["pid"]: e for e in events if e.get("cat") == "kernel"}
    assert kernels[0]["ts"] == 100 and kernels[1]["ts"] == pytest.approx(2600)
    # the GPU stream lives in the rank's process, as a named thread of its own
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads[(1, kernels[1]["tid"])] == "GPU 0 stream 20"
    assert threads[(0, MAIN_TID)] == f"thread {MAIN_TID} (python)"
    # flow ids are unique per rank, and a flow's two ends still match
    flows = [(e["pid"], e["ph"], e["id"]) for e in events if e["ph"] in ("s", "f")]
    ids = {pid: {i for p, _, i in flows if p == pid} for pid in (0, 1)}
    assert len(ids[0]) == 1 and ids[0].isdisjoint(ids[1])
    assert not [e for e in events if e.get("s") == "g"]  # instants scoped to their rank
    assert [r["rank"] for r in merged["distperf"]["ranks"]] == [0, 1]
    json.dumps(merged)  # writable as JSON


# -- the record_param_comms path (NCCL on GPU, hand-made) ----------------------------------------
def test_record_param_comms_path_classifies_by_metadata() -> None:
    # per rank: one all_reduce kernel [100, 200) half covered by a GEMM [150, 250), and one
    # all_gather kernel [400, 450) with no compute under it; region 0..1000
    comms = [("all_reduce", 1 << 20, 100, 100), ("all_gather", 1 << 18, 400, 50)]
    trace = nccl_trace(0, comms=comms, compute=[(150, 100)])
    tl = T.timeline(trace)
    assert tl.source == "record_param_comms" and tl.device
    assert [op.name for op in tl.ops] == ["all_reduce", "all_gather"]  # "wait" left out
    ar, ag = tl.ops
    assert (ar.nbytes, ar.dtype, ar.group, ar.group_size, ar.seq) == (4 << 20, "float32", "0",
                                                                     2, 1)
    assert ag.nbytes == 2 * (1 << 18) * 4  # all_gather: the output buffer, as in nccl-tests
    assert (ar.time_us, ag.time_us) == (100, 50)
    assert tl.comm == ((100, 200), (400, 450))
    assert tl.compute == ((150, 250),)
    p = T.rank_profile(tl)
    assert p.comm_time_s == pytest.approx(150e-6)
    assert p.overlap == pytest.approx(50 / 150)
    assert p.exposed_comm_s == pytest.approx(100e-6)
    assert p.comm_overhead == pytest.approx(100 / 1000)


def test_record_param_comms_kernels_linked_by_launch_without_metadata() -> None:
    """Older Kineto puts no metadata on kernels: the launch correlation links them."""
    comms = [("all_reduce", 256, 100, 100)]
    tl = T.timeline(nccl_trace(0, comms=comms, compute=[(150, 100)], kernel_metadata=False))
    assert tl.comm == ((100, 200),) and tl.compute == ((150, 250),)
    assert tl.ops[0].time_us == 100


def test_a_collective_recorded_twice_counts_once() -> None:
    """Two layers of the process group may both record the same call (same Seq)."""
    trace = nccl_trace(0, comms=[("all_reduce", 256, 100, 10)])
    first = next(e for e in trace["traceEvents"] if e["name"] == "record_param_comms")
    trace["traceEvents"].append({**first, "ts": first["ts"] + 20, "dur": 2})
    assert [op.name for op in T.timeline(trace).ops] == ["all_reduce"]


def test_kernel_names_do_not_make_communication() -> None:
    """A kernel named like NCCL's but with no metadata and no link to a collective is compute:
    classification never relies on kernel names."""
    trace = nccl_trace(0, compute=[(100, 50)])
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
    tl = T.timeline(trace)
    assert tl.comm == () and tl.compute == ((100, 150),) and tl.ops == ()


def test_nccl_report_straggler_and_metrics() -> None:
    # rank 1 computes 4x longer before the all_reduce; rank 0's kernel waits for it
    r0 = nccl_trace(0, comms=[("all_reduce", 1 << 20, 200, 620)], compute=[(0, 200)])
    r1 = nccl_trace(1, comms=[("all_reduce", 1 << 20, 800, 20)], compute=[(0, 800)])
    report = T.analyse([r0, r1], trace_path="merged.json")
    assert report.desync == "" and report.comm_source == "record_param_comms"
    assert report.stragglers == (1,)
    assert report.reference_rank == 1  # it waited least
    assert report.comm_overhead == pytest.approx(20 / 1000)
    assert report.imbalance == pytest.approx((980 - 380) / 680)
    kinds = [b.kind for b in report.bottlenecks]
    assert "imbalance" in kinds and "communication" not in kinds
    imbalance = next(b for b in report.bottlenecks if b.kind == "imbalance")
    assert imbalance.ranks == (1,) and "rank 1" in imbalance.description
    assert len(report.batch_shares) == 2 and report.batch_shares[0] > report.batch_shares[1]
    ar = report.collective("all_reduce")
    assert ar is not None and (ar.count, ar.bytes) == (1, 4 << 20)
    assert ar.per_rank_time_s == pytest.approx((620e-6, 20e-6))
    # wait vs transfer: rank 1 arrived 600 us late; the transfer itself took 20 us
    (timing,) = report.timings
    assert timing.arrivals_s == pytest.approx((0.0, 600e-6)) and timing.last_rank == 1
    assert timing.transfer_s == pytest.approx(20e-6)
    assert timing.waits_s == pytest.approx((600e-6, 0.0))
    assert timing.busbw_gbps == pytest.approx((4 << 20) / 20e-6 / 1e9)  # factor 2(n-1)/n = 1
    assert report.waits_s() == pytest.approx((600e-6, 0.0))
    assert report.latest_arrival() == (1, 1.0)
    metrics = {m.name: m for m in T.profile_metrics(report)}
    assert set(metrics) == {"profile.comm_overhead", "profile.imbalance", "profile.overlap",
                            "profile.arrival_skew_s", "profile.arrival_skew",
                            "profile.comm.all_reduce.calls", "profile.comm.all_reduce.bytes"}
    assert metrics["profile.comm.all_reduce.bytes"].value == 4 << 20
    assert metrics["profile.comm.all_reduce.calls"].kind == "exact"
    skew = metrics.pop("profile.arrival_skew_s")
    assert skew.value == pytest.approx(600e-6) and skew.ranks == (1,) and skew.unit == "s"
    share = metrics.pop("profile.arrival_skew")  # of the call (no steps): 600 us of its wall
    assert share.value == pytest.approx(600e-6 / report.wall_time_s) and share.ranks == (1,)
    assert share.threshold == "max_arrival_skew" and "rank 1 arrived last" in share.hint
    metrics = {n: m for n, m in metrics.items() if m.kind == "informational"}
    assert len(metrics) == 3
    assert metrics["profile.imbalance"].threshold == "max_imbalance"
    assert metrics["profile.imbalance"].ranks == (1,)
    assert metrics["profile.imbalance"].hint
    assert metrics["profile.comm_overhead"].threshold == "max_comm_overhead"
    assert metrics["profile.overlap"].higher_is_better
    assert all(m.unit == "fraction" for m in metrics.values())


def test_exposed_communication_is_a_bottleneck_with_a_hint() -> None:
    # both ranks spend 600 of 1000 us in a collective with nothing to overlap it
    ranks = [nccl_trace(r, comms=[("all_reduce", 1 << 22, 300, 600)], compute=[(0, 250)])
             for r in (0, 1)]
    report = T.analyse(ranks, limits={"max_comm_overhead": 0.3})
    assert report.comm_overhead == pytest.approx(0.6)
    assert report.overlap == 0.0
    kinds = [b.kind for b in report.bottlenecks]
    assert kinds[:2] == ["communication", "low_overlap"]
    assert "all_reduce" in report.bottlenecks[0].description
    assert report.recommendations and report.recommendations[0].startswith("communication")
    hint = {m.name: m.hint for m in T.profile_metrics(report)}["profile.comm_overhead"]
    assert "async_op" in hint


def test_many_small_collectives_are_reported() -> None:
    comms = [("all_reduce", 256, 10 + 20 * i, 10) for i in range(20)]
    report = T.analyse([nccl_trace(r, comms=comms) for r in (0, 1)])
    small = [b for b in report.bottlenecks if b.kind == "small_messages"]
    assert small and "20 all_reduce calls" in small[0].description


# -- the c10d path (gloo on CPU, hand-made) ------------------------------------------------------
def test_c10d_path_takes_time_from_gloo_and_dtype_from_its_annotation() -> None:
    comms = [("all_reduce", 1000, 100, 110, 100),  # issued at 100, runs [110, 210)
             ("all_gather", 500, 300, 300, 50),
             ("barrier", 1, 500, 500, 10)]
    tl = T.timeline(gloo_trace(0, comms=comms, compute=[(150, 100)]))
    assert tl.source == "c10d ops" and not tl.device
    assert [(op.name, op.nbytes, op.dtype) for op in tl.ops] == [
        ("all_reduce", 4000, "float32"),  # the tensor list hid the dtype; gloo's run told it
        ("all_gather", 4000, "float32"),  # output buffer: 2 ranks x 500
        ("barrier", 0, "uint8"),
    ]
    assert [op.time_us for op in tl.ops] == [100, 50, 10]
    assert tl.comm == ((110, 210), (300, 350), (500, 510))
    # aten::empty inside the c10d call is not compute; matmul/mm are
    assert tl.compute == ((150, 250),)
    p = T.rank_profile(tl)
    assert p.overlap == pytest.approx(60 / 160)


def test_gloo_runs_issued_from_cpp_count_too() -> None:
    """A gloo run with no c10d call before it (issued from C++) is a collective of its own."""
    trace = gloo_trace(0, comms=[("all_reduce", 10, 100, 110, 10)])
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["name"] != "c10d::allreduce_"]
    tl = T.timeline(trace)
    assert [(op.name, op.source, op.nbytes) for op in tl.ops] == [("all_reduce", "execution",
                                                                   40)]
    assert tl.source == "c10d ops"
    assert T.timeline(gloo_trace(0, compute=[(0, 10)])).source == "none"


def test_gloos_reduce_scatter_counts_as_the_reduce_scatter_the_code_called() -> None:
    """gloo runs a reduce-scatter as an all-reduce of the whole input: one call, counted at
    the level the code issued it (FSDP2's gradients), with the all-reduce's run as its time;
    an all-reduce the code called itself is still its own."""
    comms = [("reduce_scatter", 1000, 100, 110, 100), ("all_reduce", 1000, 300, 310, 40)]
    tl = T.timeline(gloo_trace(0, comms=comms))
    assert [(op.name, op.source, op.nbytes, op.time_us) for op in tl.ops] == [
        ("reduce_scatter", "c10d", 4000, 100), ("all_reduce", "c10d", 4000, 40)]
    assert count_ops([tl.ops]) == (CommCount("all_reduce", 1, 4000),
                                   CommCount("reduce_scatter", 1, 4000))


# -- desync --------------------------------------------------------------------------------------
AR = ("all_reduce", 1024, 100, 100, 50)
BC = ("broadcast", 1024, 300, 300, 50)
AG = ("all_gather", 1024, 300, 300, 50)
BC_FIRST, AR_SECOND = ("broadcast", 1024, 100, 100, 50), ("all_reduce", 1024, 300, 300, 50)


@pytest.mark.parametrize(("rank0", "rank1", "expected"), [
    ([AR, BC], [AR, AG], ["collective #2", "rank 0: broadcast", "rank 1: all_gather"]),
    ([AR, BC], [AR], ["collective #2", "rank 1: nothing", "rank 0: 2", "rank 1: 1"]),
    ([AR], [("all_reduce", 2048, 100, 100, 50)], ["collective #1", "4 KiB", "8 KiB"]),
    ([BC_FIRST, AR_SECOND], [AR, BC], ["collective #1", "rank 0: broadcast"]),
])
def test_desync_is_reported(rank0: list[Any], rank1: list[Any], expected: list[str]) -> None:
    report = T.analyse([gloo_trace(0, comms=rank0), gloo_trace(1, comms=rank1)])
    assert report.desync.startswith("ranks ran different collectives")
    for text in expected:
        assert text in report.desync
    assert report.bottlenecks[0].kind == "desync"
    assert T.profile_metrics(report) == []  # no figure is trusted


def test_desync_on_the_metadata_path_names_the_group() -> None:
    r0 = nccl_trace(0, comms=[("all_reduce", 64, 100, 10), ("broadcast", 64, 200, 10)])
    r1 = nccl_trace(1, comms=[("all_reduce", 64, 100, 10), ("all_gather", 64, 200, 10)])
    desync = T.analyse([r0, r1]).desync
    assert "process group '0'" in desync and "seq 2" in desync


def test_same_collectives_are_not_a_desync() -> None:
    ranks = [gloo_trace(r, comms=[AR, BC, AG]) for r in (0, 1)]
    assert T.analyse(ranks).desync == ""


def test_report_round_trips_through_json() -> None:
    ranks = [nccl_trace(r, comms=[("all_reduce", 64, 100, 10)]) for r in (0, 1)]
    report = T.analyse(ranks, trace_path="x.json", results=[object(), object()])
    data = json.loads(json.dumps(to_dict(report)))
    assert "results" not in data
    back = from_dict(ProfileReport, data)
    assert back == report and back.per_rank == report.per_rank


# -- real traces: two gloo ranks profiled in this run --------------------------------------------
def _workload() -> int:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    t = torch.ones(1 << 14)
    x = torch.randn(128, 128)
    dist.all_reduce(t)  # synchronous
    work = dist.all_reduce(t, async_op=True)  # overlapped with the matmuls
    for _ in range(4):
        x = (x @ x).tanh()
    work.wait()
    dist.all_gather_into_tensor(torch.empty(2 * (1 << 10)), torch.ones(1 << 10))
    dist.broadcast(t, 0)
    return rank


@pytest.fixture(scope="module")
def real_traces() -> Iterator[list[dict[str, Any]]]:
    from pytest_distperf.pool.launcher import RankPool
    from pytest_distperf.rank.profile import profile_on_rank

    pool = RankPool(2, "gloo", timeout_s=120)
    try:
        replies = pool.execute(profile_on_rank, (_workload, (), {}, 1, True, False, False), {},
                               2, "profile")
    finally:
        pool.close()
    assert [reply.result for reply in replies] == [0, 1]
    yield [T.load_trace(zlib.decompress(reply.trace)) for reply in replies]


def test_real_gloo_trace_is_read_through_c10d_ops(real_traces: list[dict[str, Any]]) -> None:
    tls = T.timelines(real_traces)
    for tl in tls:
        assert tl.source == "c10d ops" and not tl.device
        assert [(op.name, op.nbytes) for op in tl.ops] == [
            ("all_reduce", 4 << 14), ("all_reduce", 4 << 14), ("all_gather", 8 << 10),
            ("broadcast", 4 << 14)]
        assert all(op.source == "c10d" and op.dtype == "float32" for op in tl.ops)
        assert tl.comm and tl.compute
        lo, hi = tl.region
        assert all(lo <= s < e <= hi for s, e in tl.comm + tl.compute)
    report = T.analyse(real_traces)
    assert report.desync == ""
    assert report.world_size == 2 and [p.rank for p in report.per_rank] == [0, 1]
    assert 0.0 <= report.overlap <= 1.0 and 0.0 <= report.comm_overhead <= 1.0
    assert report.imbalance >= 0.0
    for p in report.per_rank:
        assert 0.0 <= p.overlap <= 1.0 and p.collectives == 4
        assert p.exposed_comm_s <= p.comm_time_s <= p.wall_time_s
    stats = {c.name: c for c in report.collectives}
    assert (stats["all_reduce"].count, stats["all_reduce"].bytes) == (2, 2 * (4 << 14))
    assert stats["broadcast"].count == 1 and stats["all_gather"].count == 1


def test_real_cpu_traces_have_no_device_figures(real_traces: list[dict[str, Any]]) -> None:
    """gloo ranks on CPU call no CUDA: no figures and no busy time, never zeros to gate."""
    from pytest_distperf.analysis.traces.census import counted_step

    counted = counted_step([zlib.compress(json.dumps(t).encode()) for t in real_traces])
    assert counted.device == () and counted.busy_s == ()
    assert counted.comm  # their collectives are counted all the same


def test_real_traces_merge_on_one_clock(real_traces: list[dict[str, Any]]) -> None:
    merged = T.merge_traces(real_traces)
    events = merged["traceEvents"]
    assert {e["pid"] for e in events} == {0, 1}
    names = sorted(e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "process_name")
    assert names == ["rank 0", "rank 1"]
    common = merged["baseTimeNanoseconds"]
    for rank, trace in enumerate(real_traces):
        shift = (T.base_time_ns(trace) - common) / 1000
        original = next(e for e in trace["traceEvents"] if e.get("name") == T.REGION_NAME)
        moved = next(e for e in events if e.get("name") == T.REGION_NAME and e["pid"] == rank)
        assert moved["ts"] == pytest.approx(original["ts"] + shift)


def test_real_trace_with_a_collective_removed_is_a_desync(
        real_traces: list[dict[str, Any]]) -> None:
    rank1 = json.loads(json.dumps(real_traces[1]))
    rank1["traceEvents"] = [e for e in rank1["traceEvents"]
                            if e.get("name") not in ("c10d::broadcast_", "gloo:broadcast")]
    desync = T.analyse([real_traces[0], rank1]).desync
    assert "collective #4" in desync and "rank 0: broadcast" in desync
    assert "rank 1: nothing" in desync


# -- one set of rules ---------------------------------------------------------------------
def _rank(rank: int, no_sync: float) -> RankStep:
    steps = tuple(no_sync * (1 + 0.01 * k) for k in range(8))
    return RankStep(rank=rank, batch_size=8, forward_s=steps, backward_s=steps,
                    optimizer_s=steps, step_s=steps, no_sync_step_s=steps)


def test_step_timer_and_profiler_find_an_imbalance_in_the_same_words() -> None:
    timing = analyze_steps([_rank(0, 0.010), _rank(1, 0.040)])
    profile = T.analyse([
        nccl_trace(0, comms=[("all_reduce", 1 << 20, 200, 620)], compute=[(0, 200)]),
        nccl_trace(1, comms=[("all_reduce", 1 << 20, 800, 20)], compute=[(0, 800)])])
    for found in (timing.bottlenecks, profile.bottlenecks):
        (imbalance,) = [b for b in found if b.kind == "imbalance"]
        (straggler,) = [b for b in found if b.kind == "straggler"]
        assert imbalance.description.startswith("per-rank compute differs by ")
        assert "straggler: rank 1" in imbalance.description
        assert straggler.description.startswith("rank 1 computes ")
        assert straggler.ranks == (1,)
    step_text = next(b.description for b in timing.bottlenecks if b.kind == "imbalance")
    profile_text = next(b.description for b in profile.bottlenecks if b.kind == "imbalance")
    assert " per step" in step_text and " per step" not in profile_text


def _coalesced_group(trace: dict[str, Any], *, start: float, dur: float,
                     kernel_metadata: bool) -> None:
    """Append a coalesced group, as FSDP's all-gathers or batch_isend_irecv record it: two
    all_gather calls with their metadata and no kernel of their own, then one
    record_param_comms "coalesced" that launches the group's single kernel."""
    ev = trace["traceEvents"]
    for seq, host in ((101, start - 60), (102, start - 50)):
        ev.append(_x("record_param_comms", "cpu_op", host, 4, **{
            "External id": 900 + seq, "Collective name": "_allgather_base", "dtype": "Float",
            "In msg nelems": 1024, "Out msg nelems": 2048, "Group size": 2, "Seq": seq,
            "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}))
    ev.append(_x("record_param_comms", "cpu_op", start - 30, 10, **{
        "External id": 999, "Collective name": "coalesced", "dtype": "Float",
        "In msg nelems": 0, "Out msg nelems": 0, "Group size": 2,
        "Process Group Name": "0"}))
    ev.append(_x("cudaLaunchKernel", "cuda_runtime", start - 25, 2,
                 **{"External id": 999, "correlation": 7777, "cbid": 211}))
    args: dict[str, Any] = {"correlation": 7777, "device": 0, "stream": NCCL_STREAM}
    if kernel_metadata:
        args["Collective name"] = "coalesced"
    ev.append(_x("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                 "kernel", start, dur, pid=0, tid=NCCL_STREAM, **args))


@pytest.mark.parametrize("kernel_metadata", [True, False])
def test_a_coalesced_kernel_is_communication_not_compute(kernel_metadata: bool) -> None:
    """The single kernel of a coalesced group counts as communication, whether it carries
    the "coalesced" metadata or only its launch links it to the group; the group's calls
    are counted one by one, and no "coalesced" collective appears."""
    trace = nccl_trace(0, compute=[(100, 200)])
    _coalesced_group(trace, start=500, dur=300, kernel_metadata=kernel_metadata)
    tl = T.timeline(trace, 0)
    assert [op.name for op in tl.ops] == ["all_gather", "all_gather"]
    assert [op.nbytes for op in tl.ops] == [2048 * 4, 2048 * 4]
    assert (500.0, 800.0) in tl.comm
    assert tl.compute == ((100.0, 300.0),)  # the GEMM only: the 300 us kernel is not compute
    assert count_ops([tl.ops]) == (CommCount("all_gather", 2, 2 * 2048 * 4, "ranks 0,1"),)


# -- the per-step view ---------------------------------------------------------------------------
def _with_steps(trace: dict[str, Any], spans: Sequence[tuple[float, float]],
                gpu_copy: bool = False) -> dict[str, Any]:
    """``trace`` with ``ProfilerStep#<i>`` host annotations over ``spans`` (and, like Kineto on
    CUDA, a copy of each on a GPU stream, which is not a step of its own)."""
    for i, (start, end) in enumerate(spans):
        trace["traceEvents"].append(_x(f"ProfilerStep#{i}", "user_annotation", start,
                                       end - start))
        if gpu_copy:
            trace["traceEvents"].append(_x(f"ProfilerStep#{i}", "gpu_user_annotation", start + 3,
                                           end - start, pid=0, tid=GPU_STREAM))
    return trace


def test_the_per_step_view_cuts_each_rank_at_its_steps() -> None:
    spans = [(0, 500), (500, 1000)]
    # step 0: rank 1 computes 400 us while rank 0 computes 100 us and then waits in the
    # all-reduce; step 1: the other way round
    traces = [
        _with_steps(nccl_trace(0, compute=[(0, 100), (500, 400)],
                               comms=[("all_reduce", 1024, 150, 340),
                                      ("all_reduce", 1024, 900, 90)]), spans, gpu_copy=True),
        _with_steps(nccl_trace(1, compute=[(0, 400), (500, 100)],
                               comms=[("all_reduce", 1024, 400, 90),
                                      ("all_reduce", 1024, 600, 390)]), spans, gpu_copy=True),
    ]
    report = T.analyse(traces)
    assert [s.index for s in report.steps] == [0, 1]
    assert [s.slowest_rank for s in report.steps] == [1, 0]
    assert report.persistent_straggler() == (0, 0.5)
    first = report.steps[0]
    assert first.wall_time_s == pytest.approx(500e-6)
    assert first.exposed_comm_s == pytest.approx((340e-6, 90e-6))
    assert first.compute_time_s == pytest.approx((160e-6, 410e-6))
    assert first.imbalance > 0.5
    step_metric = next(m for m in T.profile_metrics(report) if m.name == "profile.step_time_s")
    assert step_metric.samples == pytest.approx((500e-6, 500e-6))
    assert step_metric.kind == "informational"


def test_no_per_step_view_when_the_ranks_marked_different_steps() -> None:
    traces = [_with_steps(nccl_trace(0), [(0, 500), (500, 1000)]),
              _with_steps(nccl_trace(1), [(0, 1000)])]
    report = T.analyse(traces)
    assert report.steps == () and report.persistent_straggler() is None
    assert "profile.step_time_s" not in {m.name for m in T.profile_metrics(report)}
