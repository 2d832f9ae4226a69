"""The device's side of a step (kernel launches, host syncs and their causes, host-device
bytes, kernel busy time), read from profiler traces recorded on NVIDIA GPUs.

Three kinds of input: the H200 trace in tests/data (kernels and copies, its CUDA calls cut
out), traces recorded on A100s that live in shared/ beside the checkout (their provenance is in
tests/data/README.md; the tests that read them skip where that folder is absent), and
hand-made traces shaped as Kineto writes those, for the cases no recorded trace holds.  A CPU
rank's real trace is read in test_traces.py, next to the gloo ranks that record it.
"""

from __future__ import annotations

import copy
import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from pytest_distperf.analysis.traces.census import counted_step
from pytest_distperf.analysis.traces.device import (
    rank_device_figures,
)
from pytest_distperf.fixtures.results.steps import DeviceFigures
from pytest_distperf.records import PROFILED_REGION, from_dict, to_dict

DATA = Path(__file__).parent / "data"
#: Recorded A100 traces, kept in the shared/ folder that sits beside the checkout.
RECORDED = Path(__file__).resolve().parents[2] / "shared" / "kineto-traces"

HOST, MAIN, BACKWARD, STREAM = 4242, 4242, 4250, 7


def _compressed(trace: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(trace).encode())


def _recorded(name: str) -> dict[str, Any]:
    path = RECORDED / name
    if not path.exists():
        pytest.skip(f"{path} is not there: the recorded A100 traces live in shared/kineto-traces "
                    f"beside the checkout (tests/data/README.md)")
    data: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    return data


# -- hand-made traces, shaped as Kineto writes them ------------------------------------------
def _op(name: str, ts: float, dur: float, tid: int = MAIN) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": HOST, "tid": tid, "ts": ts,
            "dur": dur, "args": {"External id": int(ts)}}


def _call(name: str, ts: float, corr: int, *, dur: float = 4, tid: int = MAIN,
          cat: str = "cuda_runtime") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": HOST, "tid": tid, "ts": ts, "dur": dur,
            "args": {"cbid": 0, "correlation": corr}}


def _kernel(ts: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>()", "pid": 0,
            "tid": STREAM, "ts": ts, "dur": 10,
            "args": {"device": 0, "stream": STREAM, "correlation": corr}}


COPY_NAMES = {"HtoD": "Memcpy HtoD (Pageable -> Device)",
              "DtoH": "Memcpy DtoH (Device -> Pageable)",
              "DtoD": "Memcpy DtoD (Device -> Device)"}


def _copy(kind: str, nbytes: int, ts: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "gpu_memcpy", "name": COPY_NAMES[kind], "pid": 0, "tid": STREAM,
            "ts": ts, "dur": 2,
            "args": {"device": 0, "stream": STREAM, "correlation": corr, "bytes": nbytes}}


def _step(*events: dict[str, Any], region: tuple[float, float] = (0, 1000)) -> dict[str, Any]:
    """A rank's trace of one counted step: the region annotation and ``events``."""
    start, end = region
    mark = {"ph": "X", "cat": "user_annotation", "name": PROFILED_REGION, "pid": HOST,
            "tid": MAIN, "ts": start, "dur": end - start, "args": {}}
    return {"schemaVersion": 1, "traceEvents": [mark, *events]}


def _item(ts: float, corr: int) -> list[dict[str, Any]]:
    """``loss.item()`` as recent torch runs it: a 4-byte copy to the host, then the wait."""
    return [_op("aten::item", ts, 40), _op("aten::_local_scalar_dense", ts + 2, 36),
            _call("cudaMemcpyAsync", ts + 5, corr), _copy("DtoH", 4, ts + 8, corr),
            _call("cudaStreamSynchronize", ts + 12, corr + 1, dur=20)]


CASES = [
    pytest.param([_call("cudaLaunchKernel", 10, 1), _kernel(20, 1),
                  _call("cudaLaunchKernelExC", 30, 2), _call("cuLaunchKernel", 40, 3,
                                                                cat="cuda_driver"),
                  _call("cuLaunchKernelEx", 50, 4, cat="cuda_driver"),
                  _call("cudaLaunchCooperativeKernel", 60, 5),
                  _call("cudaLaunchKernel", 70, 6, tid=BACKWARD)],
                 {"launches": 6}, id="every-launch-call-on-every-thread"),
    pytest.param([_call("cudaLaunchKernel", 10, 1, dur=10),
                  _call("cuLaunchKernel", 12, 2, dur=5, cat="cuda_driver")],
                 {"launches": 1}, id="a-driver-launch-inside-a-runtime-launch-is-one"),
    pytest.param([_call("cudaGraphLaunch", 10, 1), _kernel(20, 1), _kernel(40, 1)],
                 {"launches": 0, "graph_launches": 1}, id="a-graph-launch-apart"),
    pytest.param(_item(100, 7), {"syncs": ("aten::item",), "d2h_bytes": 4},
                 id="item-is-one-sync-named-by-its-op"),
    pytest.param([_op("aten::to", 10, 60), _op("aten::_to_copy", 11, 58),
                  _op("aten::copy_", 12, 56), _call("cudaMemcpyAsync", 14, 1),
                  _copy("HtoD", 4096, 20, 1), _call("cudaStreamSynchronize", 30, 2)],
                 {"syncs": ("aten::to",), "h2d_bytes": 4096}, id="a-pageable-upload-waits"),
    pytest.param([_op("aten::copy_", 10, 20), _call("cudaMemcpyAsync", 12, 1),
                  _copy("DtoD", 1 << 20, 20, 1), _call("cudaStreamWaitEvent", 40, 2),
                  _call("cudaEventRecord", 50, 3), _call("cudaEventQuery", 60, 4)],
                 {"syncs": (), "h2d_bytes": 0, "d2h_bytes": 0},
                 id="device-copies-and-stream-waits-do-not-block"),
    pytest.param([_op("my_ext::read_back", 10, 30), _call("cudaMemcpy", 12, 1, dur=20),
                  _copy("DtoH", 8, 15, 1), _call("cudaMemcpy", 50, 2), _copy("HtoD", 16, 52, 2)],
                 {"syncs": ("my_ext::read_back",), "d2h_bytes": 8, "h2d_bytes": 16},
                 id="a-synchronous-download-blocks-an-upload-does-not"),
    pytest.param([_call("cudaDeviceSynchronize", 10, 1), _call("cudaEventSynchronize", 20, 2),
                  _op("autograd::engine::evaluate_function: MulBackward0", 30, 20, BACKWARD),
                  _call("cudaStreamSynchronize", 35, 3, tid=BACKWARD)],
                 {"syncs": ("cudaDeviceSynchronize", "cudaEventSynchronize",
                            "autograd::engine::evaluate_function: MulBackward0")},
                 id="bare-syncs-named-by-their-call"),
]


@pytest.mark.parametrize(("events", "expected"), CASES)
def test_hand_made_step(events: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    figures = rank_device_figures(_step(*events), rank=3)
    assert figures is not None and figures.rank == 3
    assert {key: getattr(figures, key) for key in expected} == expected


def test_outside_the_region_nothing_counts() -> None:
    """Calls before and after the region, and a copy issued before it that runs inside it."""
    inside = [_call("cudaLaunchKernel", 10, 1), *_item(100, 7)]
    outside = [_call("cudaLaunchKernel", -50, 20), _call("cudaMemcpyAsync", -40, 21),
               _copy("HtoD", 512, 5, 21), _call("cudaDeviceSynchronize", 1100, 22)]
    figures = rank_device_figures(_step(*inside, *outside))
    assert figures == DeviceFigures(rank=0, launches=1, graph_launches=0, syncs=("aten::item",),
                                    h2d_bytes=0, d2h_bytes=4)


def test_ranks_in_order_and_those_without_cuda_calls_left_out() -> None:
    gpu = _compressed(_step(_call("cudaLaunchKernel", 10, 1)))
    no_calls = _compressed(_step(_op("aten::mm", 10, 20)))
    assert [f.rank for f in counted_step([gpu, b"", no_calls, gpu]).device] == [0, 3]
    assert counted_step([]).device == () and counted_step([b"", no_calls]).device == ()


def test_figures_travel_as_plain_data() -> None:
    figures = rank_device_figures(_step(*_item(100, 7)))
    assert figures is not None
    assert from_dict(DeviceFigures, json.loads(json.dumps(to_dict(figures)))) == figures


# -- the H200 trace in tests/data --------------------------------------------------------------
def test_h200_trace_busy_time_and_no_figures_without_its_cuda_calls() -> None:
    """A DDP step of a GPT profiled on one H200 (tests/data, kernels, copies and annotations
    kept, its CUDA calls cut out): its GPU ran kernels 31.5 ms of the 46.6 ms profiled region,
    three steps.  Without the host's calls nothing says what the step asked: no figures."""
    raw = gzip.decompress((DATA / "h200_ddp_gpt_rank0.trace.json.gz").read_bytes())
    counted = counted_step([zlib.compress(raw)])
    (busy,) = counted.busy_s
    assert busy == pytest.approx(0.0315, abs=0.0005)
    assert counted.device == ()
    cpu = {"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": PROFILED_REGION,
                            "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0}]}
    assert counted_step([_compressed(cpu)]).busy_s == ()


# -- recorded A100 traces (shared/kineto-traces) ---------------------------------------------
def test_recorded_event_sync_trace() -> None:
    """``a100_event_sync.trace.json.gz``, counted by event name: 4 ``cudaLaunchKernel``; one
    ``if tensor:`` (``aten::is_nonzero`` > ``aten::item`` > ``aten::_local_scalar_dense`` >
    ``cudaMemcpyAsync``, a 1-byte ``Memcpy DtoH (Device -> Pageable)``, then
    ``cudaStreamSynchronize``); one ``cudaEventSynchronize``, one ``cudaDeviceSynchronize``
    (no op around either); one ``cudaEventQuery`` (its ``Event Sync`` device event is no wait
    of the host).  No region annotation: the whole trace counts."""
    figures = rank_device_figures(_recorded("a100_event_sync.trace.json.gz"))
    assert figures == DeviceFigures(
        rank=0, launches=4, graph_launches=0,
        syncs=("aten::is_nonzero", "cudaEventSynchronize", "cudaDeviceSynchronize"),
        h2d_bytes=0, d2h_bytes=1)


def test_recorded_alexnet_trace() -> None:
    """``a100_alexnet.trace.json.gz``, counted by event name: 79 ``cudaLaunchKernel``; 16
    weights moved to the GPU, each ``aten::to`` > ``aten::_to_copy`` > ``aten::copy_`` >
    ``cudaMemcpyAsync`` (a ``Memcpy HtoD (Pageable -> Device)``, 244,403,360 bytes in all) then
    ``cudaStreamSynchronize``; 5 ``cudaDeviceSynchronize`` with no op around them; 34
    ``cudaStreamWaitEvent`` that do not block."""
    figures = rank_device_figures(_recorded("a100_alexnet.trace.json.gz"))
    assert figures == DeviceFigures(rank=0, launches=79, graph_launches=0,
                                    syncs=("aten::to",) * 16 + ("cudaDeviceSynchronize",) * 5,
                                    h2d_bytes=244_403_360, d2h_bytes=0)


def test_recorded_alexnet_trace_cut_to_one_forward() -> None:
    """The same trace with the region annotation put around its last ``measure|forward``
    annotation (36,356 us): inside it, by event name, 39 ``cudaLaunchKernel`` and 2
    ``cudaDeviceSynchronize``; the uploads and the rest of the run fall outside."""
    trace = copy.deepcopy(_recorded("a100_alexnet.trace.json.gz"))
    forwards = [e for e in trace["traceEvents"] if e.get("name", "").endswith("|measure|forward]")]
    last = max(forwards, key=lambda e: e["ts"])
    trace["traceEvents"].append({**last, "name": PROFILED_REGION, "args": {}})
    figures = rank_device_figures(trace, rank=1)
    assert figures == DeviceFigures(rank=1, launches=39, graph_launches=0,
                                    syncs=("cudaDeviceSynchronize",) * 2, h2d_bytes=0,
                                    d2h_bytes=0)


def test_recorded_triton_trace() -> None:
    """``a100_triton.trace.json.gz``: a Triton kernel launched with the driver's
    ``cuLaunchKernel`` (category ``cuda_driver``), then one ``cudaDeviceSynchronize``."""
    figures = rank_device_figures(_recorded("a100_triton.trace.json.gz"))
    assert figures is not None
    assert (figures.launches, figures.syncs) == (1, ("cudaDeviceSynchronize",))
