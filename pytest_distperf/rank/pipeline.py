"""``ddp_step_timer.pipeline``'s rank side: build this rank's stages, run a schedule of
``torch.distributed.pipelining`` by name, and time each step and each stage's work (torch).

Every step starts at a barrier.  The rank's stages have their forward and backward chunk
methods wrapped (:class:`_ChunkTimer`): what they time is the compute of each microbatch,
without the schedule's waits for the neighbouring stages, so the rest of the schedule's
span on a rank is its bubble.  One more step, untimed, counts the collectives by mesh
dimension and the FLOPs (:func:`_counted_step`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from pytest_distperf.common.layout import Layout, data_index
from pytest_distperf.rank.clock import Clock, HostControls, rank_device
from pytest_distperf.rank.memory import memory_figures, rss_bytes
from pytest_distperf.rank.phase import set_phase
from pytest_distperf.records import PIPELINE_CHUNK, Chunk, DimComm, RankPipeline

#: A stage's methods that compute, and what each computes.
CHUNK_METHODS = (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
                 ("backward_weight_one_chunk", "weight"))


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    """What to measure: shipped (cloudpickled) from the controller to every rank."""

    stage_fn: Callable[[int, int], Any]  # (stage index, number of stages) -> module
    batch_fn: Callable[[int], Any]  # (data-parallel index) -> the batch the pipeline is fed
    mesh: Layout  # with a ``pp`` dimension
    schedule: str = "GPipe"
    microbatches: int = 4
    virtual: int = 1  # stages per rank: 2 or more for the interleaved schedules
    steps: int = 10
    warmup: int = 2
    loss_fn: Callable[..., Any] | None = None  # (output) -> loss, or (output, target)
    target_fn: Callable[[int], Any] | None = None  # (data-parallel index) -> the loss's target
    optimizer_fn: Callable[[Any], Any] | None = None
    parallelize: Callable[[Any, Any], Any] | None = None  # (stage module, mesh) -> module
    wrapper: str = "fsdp"  # the built-in wrapper on a ``dp`` dimension: "fsdp" or "ddp"
    wrapper_kwargs: dict[str, Any] | None = None
    fsdp_policy: Any = None
    control: bool = True
    count_collectives: bool = True


def _microbatch(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The microbatch a stage's chunk method was called for (its first argument)."""
    return int(args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", -1)))


@contextlib.contextmanager
def labelled_chunks() -> Iterator[None]:
    """While in it, every pipeline stage's forward, backward and weight-gradient chunk runs
    in a :data:`~pytest_distperf.records.PIPELINE_CHUNK` range (``pp stage 1 forward mb
    3``), which a profile's trace shows: the stage's methods are wrapped on the class."""
    from torch.distributed.pipelining.stage import _PipelineStageBase
    from torch.profiler import record_function

    originals = {method: getattr(_PipelineStageBase, method) for method, _ in CHUNK_METHODS
                 if hasattr(_PipelineStageBase, method)}

    def labelled(original: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def chunk(self: Any, *args: Any, **kwargs: Any) -> Any:
            name = PIPELINE_CHUNK.format(stage=self.stage_index, kind=kind,
                                         microbatch=_microbatch(args, kwargs))
            with record_function(name):
                return original(self, *args, **kwargs)

        return chunk

    kinds = dict(CHUNK_METHODS)
    for method, original in originals.items():
        setattr(_PipelineStageBase, method, labelled(original, kinds[method]))
    try:
        yield
    finally:
        for method, original in originals.items():
            setattr(_PipelineStageBase, method, original)


class _ChunkTimer:
    """Times every compute chunk of the stages it wraps (their methods, replaced on the
    instances) while ``active``: (kind, stage, microbatch, start, end) clock marks."""

    def __init__(self, clock: Clock, stages: list[Any]) -> None:
        self.clock = clock
        self.active = False
        self.marks: list[tuple[str, int, int, Any, Any]] = []
        for stage in stages:
            for method, kind in CHUNK_METHODS:
                original = getattr(stage, method, None)
                if original is not None:
                    setattr(stage, method, self._timed(original, kind, stage.stage_index))

    def _timed(self, original: Callable[..., Any], kind: str,
               index: int) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return original(*args, **kwargs)
            start = self.clock.now()
            try:
                return original(*args, **kwargs)
            finally:
                self.marks.append((kind, index, _microbatch(args, kwargs), start,
                                   self.clock.now()))

        return timed


@dataclasses.dataclass
class _Pipeline:
    """This rank's part of a pipeline, ready to step."""

    schedule: Any
    modules: list[Any]
    indices: list[int]
    optimizer: Any
    run: Callable[[], Any]  # one ``schedule.step`` with this rank's inputs
    batch_size: int
    clock: Clock
    timer: _ChunkTimer
    layout: Layout


def time_pipeline(spec: PipelineSpec) -> RankPipeline:
    """Build and time ``spec`` on this rank; the rank's raw samples."""
    import gc

    try:
        return _measure(spec)
    finally:
        set_phase("ddp_step_timer.pipeline: cleaning up")
        gc.collect()


def _stage_modules(spec: PipelineSpec, mesh: Any, device: Any) -> tuple[list[Any], list[int]]:
    """This rank's stage modules (``stage_fn``, then ``parallelize`` or the built-in
    wrapper on ``dp``) and their stage indices (rank, rank + p, ...: interleaved)."""
    import torch

    from pytest_distperf.rank.mesh import builtin_data_parallel, parallelized

    pp = mesh["pp"]
    p, here = pp.size(), pp.get_local_rank()
    total = p * spec.virtual
    indices = [here + p * v for v in range(spec.virtual)]
    data_parallel = builtin_data_parallel(spec.wrapper, spec.wrapper_kwargs or {},
                                          spec.fsdp_policy, device)
    modules = []
    for index in indices:
        set_phase(f"ddp_step_timer.pipeline: building stage {index} of {total}")
        torch.manual_seed(index)
        module = spec.stage_fn(index, total)
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ddp_step_timer.pipeline: stage_fn({index}, {total}) must return "
                            f"a torch.nn.Module, got {type(module).__name__}")
        modules.append(parallelized(module.to(device), mesh, spec.parallelize, None,
                                    data_parallel))
    return modules, indices


def _rows(tensor: Any, microbatches: int, what: str) -> None:
    """Refuse a tensor whose first dimension does not split into ``microbatches`` equal
    microbatches (torch's schedules split it with ``tensor_split``)."""
    rows = int(tensor.shape[0]) if tensor.dim() > 0 else 0
    if rows == 0 or rows % microbatches:
        raise ValueError(f"ddp_step_timer.pipeline: {what} has {rows} rows (shape "
                         f"{tuple(tensor.shape)}), which do not split into microbatches="
                         f"{microbatches} equal parts; give a multiple of {microbatches} "
                         f"rows, or microbatches= a divisor of {rows}")


def _inputs(spec: PipelineSpec, device: Any) -> tuple[tuple[Any, ...], Any, int]:
    """This rank's batch (the first stage's arguments), the loss's target and the batch
    size, each checked to split into the microbatches on every rank, before any stage."""
    import torch
    import torch.distributed as dist

    from pytest_distperf.rank.inputs import prepare_batch, target_of

    rank = dist.get_rank()
    index = data_index(spec.mesh, rank)
    batch, size = prepare_batch(spec.batch_fn(index), device, rank, dist.get_world_size(),
                                False)
    args = batch if isinstance(batch, tuple) else (batch,)
    for k, tensor in enumerate(args):
        _rows(tensor, spec.microbatches,
              f"batch_fn({index})" + (f"[{k}]" if len(args) > 1 else ""))
    if spec.target_fn is None:  # the schedule needs a target; the loss leaves it out
        return args, torch.zeros(size, device=device), size
    target = target_of(spec.target_fn, index, device, "ddp_step_timer.pipeline")
    _rows(target, spec.microbatches, f"target_fn({index})")
    return args, target, size


def _loss(spec: PipelineSpec) -> Callable[[Any, Any], Any]:
    """The schedule's ``loss_fn(output, target)``: the user's, or ``loss_fn(output)``
    without a ``target_fn``."""
    from pytest_distperf.rank.inputs import default_loss

    if spec.target_fn is not None:
        assert spec.loss_fn is not None  # plan() refuses a target without a loss_fn
        return spec.loss_fn
    loss_fn = spec.loss_fn or default_loss
    return lambda output, target: loss_fn(output)


def _build(spec: PipelineSpec) -> _Pipeline:
    """The stages, the schedule by name, the optimizer and this rank's step."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleSingle,
        get_schedule_class,
    )

    from pytest_distperf.rank.inputs import takes_module
    from pytest_distperf.rank.mesh import device_mesh

    device = rank_device()
    args, target, size = _inputs(spec, device)
    mesh = device_mesh(spec.mesh, device.type)
    modules, indices = _stage_modules(spec, mesh, device)
    total = mesh["pp"].size() * spec.virtual
    stages = [PipelineStage(m, i, total, device, group=mesh["pp"].get_group())
              for m, i in zip(modules, indices, strict=True)]
    timer = _ChunkTimer(Clock(device), stages)
    kind = get_schedule_class(spec.schedule)
    schedule = kind(stages[0] if issubclass(kind, PipelineScheduleSingle) else stages,
                    n_microbatches=spec.microbatches, loss_fn=_loss(spec))
    inputs = args if 0 in indices else ()
    last = {"target": target} if total - 1 in indices else {}
    params = [q for m in modules for q in m.parameters()]
    if spec.optimizer_fn is None:
        optimizer = torch.optim.SGD(params, lr=1e-3)
    else:
        optimizer = spec.optimizer_fn(modules[0] if takes_module(spec.optimizer_fn)
                                      else params)

    def run() -> Any:
        return schedule.step(*inputs, **last)

    return _Pipeline(schedule, modules, indices, optimizer, run, size, timer.clock, timer,
                     spec.mesh)


def _step(pipe: _Pipeline, what: str) -> tuple[float, float, list[Chunk]]:
    """One step from a barrier: (the schedule's span, the whole step) seconds, and the
    chunks it computed, in seconds after the step began."""
    import torch.distributed as dist

    clock, timer = pipe.clock, pipe.timer
    set_phase(f"{what}, waiting at the barrier")
    dist.barrier()
    clock.synchronize()
    set_phase(what)
    timer.marks.clear()
    timer.active = True
    t0 = clock.now()
    pipe.run()
    t1 = clock.now()
    pipe.optimizer.step()
    pipe.optimizer.zero_grad(set_to_none=True)
    t2 = clock.now()
    clock.synchronize()
    timer.active = False
    chunks = [(kind, stage, mb, clock.seconds(t0, start), clock.seconds(t0, end))
              for kind, stage, mb, start, end in timer.marks]
    return clock.seconds(t0, t1), clock.seconds(t0, t2), chunks


def _counted_step(pipe: _Pipeline) -> tuple[int, tuple[DimComm, ...], float]:
    """One more step under the flop counter and the collective counter: this rank's FLOPs
    (0 where the counter cannot follow), collectives by mesh dimension (with the seconds
    blocked in them, on CPU ranks) and the step's seconds."""
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    from pytest_distperf.rank.mesh import comm_counter, eager

    set_phase("ddp_step_timer.pipeline: counting collectives and FLOPs (one more step)")
    dist.barrier()
    flops = FlopCounterMode(display=False)
    by_dim = comm_counter(pipe.layout, timed=not pipe.clock.on_cuda)
    with eager(), flops, by_dim:  # in this order: a TP rank counts the FLOPs of its shard
        start = time.perf_counter()
        pipe.run()
        pipe.optimizer.step()
        pipe.optimizer.zero_grad(set_to_none=True)
        pipe.clock.synchronize()
        seconds = time.perf_counter() - start
    try:
        total = int(flops.get_total_flops())
    except Exception:  # a model the counter cannot follow: the FLOPs stay unknown
        total = 0
    return total, by_dim.result(), seconds


def blocks_of(module: Any) -> int:
    """A stage's repeated blocks: the children of its ``Sequential``, ``ModuleList`` and
    ``ModuleDict`` containers, outermost first; 0 where it has none."""
    import torch

    containers = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
    for m in module.modules():
        if isinstance(m, containers):
            return len(list(m.children()))
    return 0


def _measure(spec: PipelineSpec) -> RankPipeline:
    import torch.distributed as dist

    pipe = _build(spec)
    name = f"ddp_step_timer.pipeline ({spec.schedule}, {spec.microbatches} microbatches)"
    for i in range(spec.warmup):
        _step(pipe, f"{name}: warm-up {i + 1}/{spec.warmup}")
    check = HostControls(pipe.clock) if spec.control and not pipe.clock.on_cuda else None
    if check is not None:
        check.warm()
    spans: list[float] = []
    steps: list[float] = []
    busy: list[float] = []
    forward: list[float] = []
    backward: list[float] = []
    step_chunks: list[tuple[Chunk, ...]] = []
    peak_rss = rss_bytes()
    for k in range(spec.steps):
        span, whole, chunks = _step(pipe, f"{name}: step {k + 1}/{spec.steps}")
        spans.append(span)
        steps.append(whole)
        step_chunks.append(tuple(chunks))
        for out, kinds in ((busy, ("forward", "backward", "weight")), (forward, ("forward",)),
                           (backward, ("backward", "weight"))):
            out.append(sum(end - start for kind, _, _, start, end in chunks if kind in kinds))
        if check is not None:
            check.run(f"{name}: host-speed control {k + 1}/{spec.steps}")
        peak_rss = max(peak_rss, rss_bytes())
    peak, _, source = memory_figures(pipe.clock, peak_rss, dist.get_world_size())
    flops, mesh_comm, counted_s = (_counted_step(pipe) if spec.count_collectives
                                   else (0, (), 0.0))
    return RankPipeline(
        rank=dist.get_rank(), stages=tuple(pipe.indices),
        blocks=tuple(blocks_of(m) for m in pipe.modules), batch_size=pipe.batch_size,
        step_s=tuple(steps), schedule_s=tuple(spans), busy_s=tuple(busy),
        forward_s=tuple(forward), backward_s=tuple(backward), step_chunks=tuple(step_chunks),
        control_s=tuple(check.compute_s) if check is not None else (),
        memory_control_s=tuple(check.memory_s) if check is not None else (),
        peak_memory_bytes=peak, memory_source=source, device=str(pipe.clock.device),
        flops=flops, mesh_comm=mesh_comm, counted_step_s=counted_s)
