"""What one training step asked of each rank's GPU, from the ranks' profiler traces: kernel
launches, host-device synchronisations (and the op that caused each), bytes copied between
host and device, and how long the GPU ran kernels.  Pure: stdlib only.

The API (:func:`~pytest_distperf.analysis.traces.census.counted_step` reads the counted step
of ``ddp_step_timer`` with both, each rank's trace parsed once):

* :func:`rank_device_figures` (one parsed trace, its rank) ->
  :class:`~pytest_distperf.fixtures.results.steps.DeviceFigures`, or None where the rank ran
  no CUDA call (a CPU rank: never zeros that a baseline would gate);
* :func:`busy_seconds` (the ranks' timelines) -> per rank, the seconds the GPU ran kernels;
  () on CPU.

The counts are exact (the same code asks the same of the device on any run); the busy time
is a measurement, read from the same step, and is kept apart for that reason.

What Kineto records with ``ProfilerActivity.CUDA``, as read from traces recorded on NVIDIA
GPUs (A100s, 2023-2025; an H200 with CUDA 13, whose trace in tests/data keeps only the
device's side; tests/data/README.md lists them):

* each CUDA runtime call of the process, as a complete event of category ``cuda_runtime`` on
  the calling thread, with ``args.correlation``: ``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ``cudaMemcpy``, ``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, ``cudaEventRecord``, ``cudaEventQuery``, ``cudaStreamWaitEvent``,
  ``cudaMalloc``, ...; a driver call the code makes itself as ``cuda_driver`` (Triton's
  ``cuLaunchKernel``);
* the device's work as ``kernel``, ``gpu_memcpy`` (``Memcpy HtoD (Pageable -> Device)``,
  ``Memcpy DtoH (Device -> Pageable)``, ``Memcpy DtoD (Device -> Device)``, with
  ``args.bytes``) and ``gpu_memset`` events, each with the ``correlation`` of the call that
  issued it (and an ``ac2g`` flow event pair with that id);
* where CUDA sync events are on, ``cuda_sync`` events on the device (``Stream Sync``,
  ``Event Sync``, ``Context Sync``, ``Stream Wait Event``).  Not read here: they are not
  always recorded, and ``cudaEventQuery``, which does not block, gets an ``Event Sync`` too;
* ``.item()`` (and ``if tensor:``) as ``aten::item`` > ``aten::_local_scalar_dense`` >
  ``cudaMemcpyAsync`` (a few bytes' ``Memcpy DtoH``) then ``cudaStreamSynchronize``; ``.to()``
  from pageable memory as ``aten::to`` > ``aten::_to_copy`` > ``aten::copy_`` >
  ``cudaMemcpyAsync`` then ``cudaStreamSynchronize``.  No CUDA graph launch
  (``cudaGraphLaunch``) was in the traces read; it is counted by its name.

How each figure is read, for the calls inside the profiled region (the
:data:`~pytest_distperf.records.PROFILED_REGION` annotation; the whole trace without one):

* a launch is a call in :data:`KERNEL_LAUNCHES` (a graph launch one in
  :data:`GRAPH_LAUNCHES`), counted once where one launch call runs inside another;
* a synchronisation is a call in :data:`HOST_SYNCS`, or a synchronous copy
  (:data:`BLOCKING_COPIES`) whose copy ran device-to-host.  An asynchronous copy is never one
  by itself: the stream sync after it is the point where the host waits, so an ``.item()``
  counts once.  ``cudaStreamWaitEvent`` and ``cudaEventQuery`` do not block the host;
* its cause is the outermost ``cpu_op`` enclosing the call on its thread (``aten::item``;
  ``aten::is_nonzero`` for ``if tensor:``), else the call's own name (``torch.cuda.synchronize()``
  is a bare ``cudaDeviceSynchronize``);
* bytes are those of the ``gpu_memcpy`` events that a call inside the region issued, by
  direction from the event's name (``Memcpy HtoD``, ``Memcpy DtoH``); copies between
  devices (``DtoD``, ``PtoP``) do not cross the host's link and are left out;
* a trace without one CUDA call gives no figures: a CPU rank, or a trace cut down to its
  device's events (nothing says what the host asked).

``ddp_step_timer``'s counted step drains the device with ``torch.cuda.synchronize()`` after
its region: the syncs counted are the step's own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_distperf.analysis.traces.rank_timeline import (
    Event,
    Timeline,
    by_thread,
    complete_events,
    enclosing,
    outermost,
    region_of,
)
from pytest_distperf.common.intervals import union_length
from pytest_distperf.fixtures.results.steps import DeviceFigures

#: Categories of the host's calls into CUDA.
CUDA_CALLS = frozenset({"cuda_runtime", "cuda_driver"})
#: Calls that launch one kernel.
KERNEL_LAUNCHES = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice"})
#: Calls that launch a CUDA graph: one launch each, whatever the graph holds.
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
#: Calls that return only when the device has done the work they wait for.
HOST_SYNCS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"})
#: Synchronous copies: a device-to-host one returns when the data is on the host.
BLOCKING_COPIES = frozenset({
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cuMemcpy", "cuMemcpyDtoH",
    "cuMemcpyDtoH_v2"})
_TO_DEVICE, _TO_HOST = "Memcpy HtoD", "Memcpy DtoH"


def rank_device_figures(trace: Mapping[str, Any], rank: int = 0) -> DeviceFigures | None:
    """One rank's :class:`DeviceFigures` for its profiled region, or None where the trace
    holds no CUDA call."""
    evs = complete_events(trace)
    calls = [e for e in evs if e.cat in CUDA_CALLS]
    if not calls:
        return None
    start, end = region_of(evs)
    mine = [e for e in calls if start <= e.start and e.end <= end]
    copies = _copies_by_call(evs, {e.args.get("correlation") for e in mine} - {None})
    launches = outermost(e for e in mine if e.name in KERNEL_LAUNCHES)
    blocking = outermost(e for e in mine if e.name in HOST_SYNCS or (
        e.name in BLOCKING_COPIES
        and any(c.name.startswith(_TO_HOST) for c in copies.get(e.args.get("correlation"), ()))))
    ops = by_thread(e for e in evs if e.cat == "cpu_op")
    return DeviceFigures(
        rank=rank,
        launches=len(launches),
        graph_launches=len([e for e in mine if e.name in GRAPH_LAUNCHES]),
        syncs=tuple(_cause(ops, e) for e in blocking),
        h2d_bytes=_bytes(copies, _TO_DEVICE),
        d2h_bytes=_bytes(copies, _TO_HOST))


def busy_seconds(lines: Sequence[Timeline]) -> tuple[float, ...]:
    """Per rank, the seconds its GPU ran kernels in the counted step (compute and
    communication together); () where the timelines hold no kernels (CPU ranks)."""
    if not lines or not all(line.device for line in lines):
        return ()
    return tuple(union_length([*line.comm, *line.compute]) / 1e6 for line in lines)


def _copies_by_call(evs: Sequence[Event], correlations: set[Any]) -> dict[Any, list[Event]]:
    """The device's copies issued by the calls of ``correlations``, by correlation."""
    out: dict[Any, list[Event]] = {}
    for e in evs:
        if e.cat == "gpu_memcpy" and e.args.get("correlation") in correlations:
            out.setdefault(e.args["correlation"], []).append(e)
    return out


def _bytes(copies: Mapping[Any, Sequence[Event]], direction: str) -> int:
    return sum(int(c.args.get("bytes", 0) or 0) for found in copies.values() for c in found
               if c.name.startswith(direction))


def _cause(ops: Mapping[tuple[Any, Any], tuple[list[float], list[Event]]], call: Event) -> str:
    """The op that made the host wait: the outermost ``cpu_op`` around the call on its
    thread, else the CUDA call itself."""
    op = enclosing(ops, call)
    return op.name if op is not None else call.name
