"""``dist_profiler``'s rank side: one call of a function under ``torch.profiler`` (torch).

The controller (:mod:`pytest_distperf.fixtures.profiler`) merges what every rank sends back and
analyses it (:mod:`pytest_distperf.analysis.traces`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import zlib
from collections.abc import Callable
from typing import Any

from pytest_distperf.common.layout import Layout
from pytest_distperf.rank.clock import Clock
from pytest_distperf.rank.phase import set_phase
from pytest_distperf.records import PROFILED_REGION, PROFILER_STEP, RankTrace


def profile_on_rank(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                    warmup: int, record_shapes: bool, with_stack: bool,
                    profile_memory: bool, setup: Callable[[], Any] | None = None,
                    steps: int = 1, layout: Layout = ()) -> RankTrace:
    """What every rank runs: ``setup()`` once (when given; its result becomes ``fn``'s first
    argument), ``warmup`` plain calls, a barrier, then ``steps`` calls under the profiler.

    The profiled calls are wrapped in a ``distperf:profiled_call`` annotation (the region the
    analysis measures), and each in a ``ProfilerStep#<n>`` annotation (the per-step view;
    torch.profiler's own name for steps). On CUDA the device is synchronised at the end of
    each step, so that a step's span covers the kernels it launched.  The result is that of
    the last call.  With a mesh ``layout`` the profiled calls run under the collective
    counter (:func:`pytest_distperf.rank.mesh.comm_counter`): each collective is counted by
    its mesh dimension and wrapped in a ``mesh.<dim>.<op>`` range the trace shows.  Where
    ``torch.distributed.pipelining`` is in use, each stage's chunks are labelled with their
    stage, kind and microbatch (:func:`pytest_distperf.rank.pipeline.labelled_chunks`).
    """
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    clock = Clock()
    if setup is not None:
        set_phase("dist_profiler: setup (not profiled)")
        state = setup()
        args = (state, *args)
    for i in range(warmup):
        set_phase(f"dist_profiler: warm-up call {i + 1}/{warmup}")
        fn(*args, **kwargs)
    clock.synchronize()
    set_phase("dist_profiler: barrier before the profiled call")
    dist.barrier()
    activities = [ProfilerActivity.CPU]
    if clock.on_cuda:
        activities.append(ProfilerActivity.CUDA)
    result = None
    counter: Any = None
    compiled: Any = contextlib.nullcontext()
    if layout:
        from pytest_distperf.rank.mesh import comm_counter, eager

        # torch.compile does not trace under the counter: compiled code runs eagerly
        counter, compiled = comm_counter(layout, label=True), eager()
    with (compiled, profile(activities=activities, record_shapes=record_shapes,
                            with_stack=with_stack, profile_memory=profile_memory) as prof,
          record_function(PROFILED_REGION), counter or contextlib.nullcontext(),
          _pipeline_labels()):
        for step in range(steps):
            set_phase(f"dist_profiler: profiled step {step + 1}/{steps}")
            with record_function(f"{PROFILER_STEP}{step}"):
                result = fn(*args, **kwargs)
                clock.synchronize()
    set_phase("dist_profiler: exporting the trace")
    return RankTrace(exported(prof), result,
                     counter.result() if counter is not None else ())


def _pipeline_labels() -> Any:
    """The pipeline stages' chunk labels where the profiled code has imported
    ``torch.distributed.pipelining`` (in ``setup`` or before); else nothing."""
    if "torch.distributed.pipelining" not in sys.modules:
        return contextlib.nullcontext()
    from pytest_distperf.rank.pipeline import labelled_chunks

    return labelled_chunks()


def exported(prof: Any) -> bytes:
    """A finished profiler's Chrome trace JSON, zlib-compressed (what crosses to the
    controller)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="distperf-trace-") as tmp:
        path = os.path.join(tmp, f"rank{dist.get_rank()}.json")
        prof.export_chrome_trace(path)
        with open(path, "rb") as f:
            data = f.read()
    return zlib.compress(data, 1)
