"""``ddp_step_timer``'s rank side: build, wrap and time training steps on this rank (torch).

Runs inside a rank with torch.distributed initialised and the measured group as the default
group.  Synchronised steps and steps without gradient synchronisation (DDP ``no_sync()``,
FSDP2 ``set_requires_gradient_sync(False)``) are timed, so that the difference between the
two is the exposed communication (the headroom method) and the no-sync steps give each
rank's own compute time.

On CPU ranks the two alternate, each starting at a barrier and followed by the host-speed
control, and with DDP a comm hook times every gradient bucket's all-reduce (launch to
completion, so it includes waiting for the other ranks).  On a GPU the steps run as training
runs them (:func:`_back_to_back`): a block of synchronised steps, then a block of no-sync
ones, queued back to back with a CUDA event at each step's start and one synchronize per
block, so that the host's launch latency hides behind a full queue as it does in training.

Clock: :class:`~pytest_distperf.rank.clock.Clock` (CUDA events on GPU; ``time.perf_counter``
on CPU).  Memory: the CUDA caching allocator's peak on GPU, the process's resident set size
after each step on CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from pytest_distperf.common.intervals import union_length
from pytest_distperf.common.layout import Layout, data_index
from pytest_distperf.common.peaksites import Site
from pytest_distperf.common.shares import AUTO
from pytest_distperf.rank.clock import Clock, HostControls, rank_device
from pytest_distperf.rank.inputs import default_loss, prepare_batch, takes_module, target_of
from pytest_distperf.rank.memory import (
    memory_figures,
    note_model,
    recording_peak_sites,
    release_cached,
    rss_bytes,
)
from pytest_distperf.rank.phase import set_phase
from pytest_distperf.rank.shares import CALIBRATION_STEPS, Feed, calibrate
from pytest_distperf.records import PROFILED_REGION, CommCall, DimComm, RankStep

WRAPPERS = ("ddp", "fsdp")
#: Learning rate of the default optimizer (plain SGD): small, the values do not matter.
DEFAULT_LR = 1e-3


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What to measure: shipped (cloudpickled) from the controller to every rank."""

    model_fn: Callable[[], Any]
    batch_fn: Callable[[int], Any]
    steps: int = 20
    warmup: int = 3
    loss_fn: Callable[..., Any] | None = None
    wrapper: str = "ddp"
    optimizer_fn: Callable[[Any], Any] | None = None
    wrapper_kwargs: dict[str, Any] | None = None
    split_batch: bool = False  # strong scaling: keep this rank's share of batch_fn's batch
    #: time DDP's gradient buckets with a Python comm hook; None: on CPU ranks only (on a GPU
    #: its per-bucket callbacks slow the step by more than the timer's 5% budget)
    comm_timing: bool | None = None
    #: the user's DDP comm hook, as (state, hook); the timing hook calls it for every bucket
    comm_hook: tuple[Any, Callable[[Any, Any], Any]] | None = None
    count_collectives: bool = True  # one more step under torch.profiler, counting collectives
    #: FSDP2: which submodules get their own ``fully_shard`` (module classes, or a callable
    #: module -> bool); None: the blocks of every ModuleList/ModuleDict
    #: (:func:`~pytest_distperf.rank.fsdp.shard_targets`)
    fsdp_policy: Any = None
    #: the host-speed control (:func:`~pytest_distperf.rank.clock.control_kernel`): on CPU
    #: ranks after every synchronised step, as ``measure()`` has it; with the steps timed
    #: back to back, three times before and three after them (:func:`_host_check`)
    control: bool = True
    #: a mesh layout ((name, size), ...): the model is parallelised over a DeviceMesh
    #: (:mod:`~pytest_distperf.rank.mesh`) instead of wrapped over all ranks
    mesh: Layout = ()
    parallelize: Callable[[Any, Any], Any] | None = None  # the user's (model, mesh) -> model
    tp_plan: Any = None  # the built-in TP: parallelize_module's plan on the ``tp`` dimension
    #: each rank's share of batch_fn's global batch (:mod:`~pytest_distperf.rank.shares`),
    #: or "auto" (measured first); (): every rank trains on its batch_fn(rank)
    batch_shares: tuple[float, ...] | str = ()
    #: a context-manager factory entered around each step's forward, loss and backward
    #: (torchtitan's ``train_context``: ``loss_parallel`` for a vocabulary-sharded loss)
    train_context: Callable[[], Any] | None = None
    #: (data index) -> the loss's target: the loss is then ``loss_fn(output, target)``
    target_fn: Callable[[int], Any] | None = None
    #: time the steps back to back (:func:`_back_to_back`); None: on a GPU
    back_to_back: bool | None = None


class _BucketTimer:
    """A DDP comm hook timing every bucket: it does what the default all-reduce hook does,
    or calls the user's hook (``inner``, as (state, hook)) and times its future."""

    def __init__(self, clock: Clock, group: Any,
                 inner: tuple[Any, Callable[[Any, Any], Any]] | None = None) -> None:
        import torch.distributed as dist

        self.clock = clock
        self.group = group
        self.world = dist.get_world_size(group)
        self.inner = inner
        self.active = False
        self.calls: list[tuple[int, int, Any, Any]] = []  # (bucket, bytes, start, end)

    def hook(self, state: Any, bucket: Any) -> Any:
        import torch.distributed as dist

        buffer = bucket.buffer()
        index = bucket.index()
        nbytes = buffer.numel() * buffer.element_size()
        start = self.clock.now() if self.active else None
        if self.inner is not None:
            future = self.inner[1](self.inner[0], bucket)
        else:
            buffer.div_(self.world)
            future = dist.all_reduce(buffer, group=self.group, async_op=True).get_future()

        def done(fut: Any) -> Any:
            if start is not None:
                self.calls.append((index, nbytes, start, self.clock.now()))
            value = fut.value()
            return value[0] if isinstance(value, list) else value

        return future.then(done)


def time_steps(spec: StepSpec) -> RankStep:
    """Build, wrap and time ``spec`` on this rank; the rank's raw samples.

    The model, its wrapper and the optimizer are released before returning, so that the
    next test on this rank starts from the same memory.
    """
    try:
        return _measure(spec)
    finally:
        set_phase("ddp_step_timer: cleaning up")
        release_cached()


@dataclasses.dataclass
class Built:
    """A model ready to train on this rank: what :func:`build` made of a :class:`StepSpec`."""

    wrapped: Any  # the DDP or FSDP2 module
    no_sync: Callable[[], Any]  # a context manager factory that turns gradient sync off
    optimizer: Any
    forward: Callable[[], Any]  # forward pass and loss on this rank's batch: the loss
    feed: Feed  # this rank's batch, its rows and its loss's weight
    clock: Clock
    timer: _BucketTimer | None  # the bucket-timing comm hook, where there is one
    layout: Layout = ()  # the mesh layout of ``mesh=``, () without one
    context: Callable[[], Any] = contextlib.nullcontext  # around forward and backward

    @property
    def batch_size(self) -> int:
        return self.feed.size

    def train_step(self) -> None:
        """One plain step: forward, backward, optimizer step."""
        with self.context():
            self.forward().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def build(spec: StepSpec) -> Built:
    """Build, move and wrap the model, the batch and the optimizer of ``spec`` on this rank
    (seeded identically on every rank)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    clock = Clock(device)

    set_phase("ddp_step_timer: building the model")
    torch.manual_seed(0)
    model = spec.model_fn()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"ddp_step_timer: model_fn() must return a torch.nn.Module, got "
                        f"{type(model).__name__}")
    note_model(model)
    model = model.to(device)
    set_phase("ddp_step_timer: building the batch")
    # with a mesh, the ranks of a TP or PP group share one batch: batch_fn(data-parallel index)
    which = data_index(spec.mesh, rank) if spec.mesh else rank
    feed = _feed(spec, spec.batch_fn(which), device, rank, world)
    mesh = None
    if spec.mesh:
        wrapped, no_sync, mesh = _parallelize(model, spec, device)
    else:
        set_phase(f"ddp_step_timer: wrapping the model ({spec.wrapper})")
        wrapped, no_sync = _wrap(model, spec.wrapper, device, spec.wrapper_kwargs or {},
                                 spec.fsdp_policy)
    timer: _BucketTimer | None = None
    timed = (spec.comm_timing if spec.comm_timing is not None else not clock.on_cuda) and (
        mesh is None)
    if spec.wrapper == "ddp" and timed:
        hook = _BucketTimer(clock, wrapped.process_group, spec.comm_hook)
        timer = hook
        # DDP checks a hook's annotations against the real classes; a lambda has none.
        wrapped.register_comm_hook(None, lambda state, bucket: hook.hook(state, bucket))  # noqa: PLW0108
    elif spec.wrapper == "ddp" and spec.comm_hook is not None:
        wrapped.register_comm_hook(*spec.comm_hook)
    params = list(wrapped.parameters())
    if spec.optimizer_fn is None:
        optimizer = torch.optim.SGD(params, lr=DEFAULT_LR)
    elif takes_module(spec.optimizer_fn):
        optimizer = spec.optimizer_fn(wrapped)
    else:
        optimizer = spec.optimizer_fn(params)
    loss_fn: Callable[..., Any] = spec.loss_fn or default_loss
    target = None if spec.target_fn is None else target_of(spec.target_fn, which, device)

    def forward() -> Any:
        batch = feed.batch
        out = wrapped(*batch) if isinstance(batch, tuple) else wrapped(batch)
        loss = loss_fn(out) if target is None else loss_fn(out, target)
        return loss * feed.weight if feed.weight != 1.0 else loss

    return Built(wrapped, no_sync, optimizer, forward, feed, clock, timer, spec.mesh,
                 spec.train_context or contextlib.nullcontext)


def _feed(spec: StepSpec, batch: Any, device: Any, rank: int, world: int) -> Feed:
    """This rank's batch: ``batch`` as it is, its even part (strong scaling), or its share of
    it (``batch_shares``; "auto" starts even)."""
    if not spec.batch_shares:
        return Feed(*prepare_batch(batch, device, rank, world, spec.split_batch))
    shares = ((1.0 / world,) * world if isinstance(spec.batch_shares, str)
              else spec.batch_shares)
    whole, _ = prepare_batch(batch, device, rank, world, False)
    return Feed.shared(whole, shares, rank, mean_loss=spec.loss_fn is not None)


def _rebalance(built: Built, rank: int) -> tuple[float, ...]:
    """``batch_shares="auto"``: time the calibration steps, cut this rank's batch by the
    shares they give, and warm up once at the new shapes; this rank's calibration times."""
    shares, times = calibrate(lambda k: _timed_step(built, False, k, CALIBRATION_STEPS)[0][3],
                              built.batch_size, built.clock.device)
    built.feed.reshare(shares, rank)
    _warm_up(built, 1)
    return times


def _parallelize(model: Any, spec: StepSpec, device: Any) -> tuple[Any, Callable[[], Any], Any]:
    """The model parallelised over the mesh of ``spec.mesh``, the switch that turns its
    data-parallel gradient sync off, and the mesh."""
    from pytest_distperf.rank.mesh import (
        builtin_data_parallel,
        device_mesh,
        gradient_sync_switch,
        parallelized,
    )

    set_phase(f"ddp_step_timer: building the mesh {dict(spec.mesh)}")
    mesh = device_mesh(spec.mesh, device.type)
    set_phase("ddp_step_timer: parallelising the model over the mesh")
    data_parallel = builtin_data_parallel(spec.wrapper, spec.wrapper_kwargs or {},
                                          spec.fsdp_policy, device)
    model = parallelized(model, mesh, spec.parallelize, spec.tp_plan, data_parallel)
    no_sync, _ = gradient_sync_switch(model)
    return model, no_sync, mesh


def _warm_up(built: Built, steps: int) -> None:
    """``steps`` synchronised and no-sync steps, untimed; then the CUDA peak is reset."""
    for i in range(steps):
        for sync in (True, False):
            set_phase(f"ddp_step_timer: warm-up {i + 1}/{steps} "
                      f"({'sync' if sync else 'no_sync'})")
            with contextlib.nullcontext() if sync else built.no_sync(), built.context():
                built.forward().backward()
            built.optimizer.step()
            built.optimizer.zero_grad(set_to_none=True)
    built.clock.synchronize()
    if built.clock.on_cuda:
        import torch

        torch.cuda.reset_peak_memory_stats(built.clock.device)


Bucket = tuple[int, int, float, float]  # (bucket index, bytes, launch, seconds)


def _timed_step(built: Built, sync: bool, k: int,
                steps: int) -> tuple[tuple[float, float, float, float], list[Bucket]]:
    """One step from a barrier: (forward, backward, optimizer, whole step) seconds, and the
    gradient buckets the comm hook timed, launches in seconds after the step began."""
    import torch.distributed as dist

    clock, timer = built.clock, built.timer
    what = f"ddp_step_timer: step {k + 1}/{steps} ({'sync' if sync else 'no_sync'})"
    set_phase(f"{what}, waiting at the barrier")
    dist.barrier()
    clock.synchronize()
    set_phase(what)
    if timer is not None:
        timer.calls.clear()
        timer.active = sync
    t0, t1, t2 = _stamped_step(built, sync)
    t3 = clock.now()
    clock.synchronize()
    buckets: list[Bucket] = []
    if timer is not None:
        timer.active = False
        buckets = [(index, nbytes, clock.seconds(t0, start), clock.seconds(start, end))
                   for index, nbytes, start, end in timer.calls]
    phases = (clock.seconds(t0, t1), clock.seconds(t1, t2), clock.seconds(t2, t3),
              clock.seconds(t0, t3))
    return phases, buckets


def _census(built: Built) -> tuple[bytes, int, tuple[DimComm, ...], float]:
    """One more synchronised step, from a barrier, under ``torch.profiler`` (CPU events
    with shapes: every collective and its message size; on a GPU its kernels too), inside
    the region annotation the trace analysis counts in, and under
    ``torch.utils.flop_counter`` (the step's FLOPs on this rank: forward, backward,
    optimizer); with a mesh, under a dispatch mode that counts the collectives by mesh
    dimension too; compiled code runs eagerly in it (the counters cannot follow it).  The
    trace, compressed, the FLOPs (0 where they could not be counted),
    the counts by dimension and the step's seconds (under all of that: only the blocked
    share of its collectives is read against it)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils.flop_counter import FlopCounterMode

    from pytest_distperf.rank.mesh import comm_counter, eager
    from pytest_distperf.rank.profile import exported

    set_phase("ddp_step_timer: counting collectives and FLOPs (one step under torch.profiler)")
    dist.barrier()
    built.clock.synchronize()
    counter = FlopCounterMode(display=False)
    # on a GPU the kernels too: how busy the device is in a step (a launch-bound step)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if built.clock.on_cuda else [])
    by_dim = None
    if built.layout:
        by_dim = comm_counter(built.layout, timed=not built.clock.on_cuda)
    # the collective counter inside the flop counter: DTensor splits each op before the flop
    # counter sees it, so a TP rank counts the FLOPs of its shard
    with eager(), profile(activities=activities, record_shapes=True) as prof:
        start = time.perf_counter()
        with (record_function(PROFILED_REGION), counter,
              by_dim or contextlib.nullcontext()):
            built.train_step()
        # outside the counted region: the step's own host syncs are what it counts
        built.clock.synchronize()
        seconds = time.perf_counter() - start
    try:
        flops = int(counter.get_total_flops())
    except Exception:  # a model the counter cannot follow: the FLOPs stay unknown
        flops = 0
    return exported(prof), flops, by_dim.result() if by_dim is not None else (), seconds


def _peak_sites(built: Built) -> tuple[Site, ...]:
    """On a GPU, one more step with the allocator's history on: what held its peak of device
    memory (:func:`~pytest_distperf.rank.memory.recording_peak_sites`).  A step of its own:
    the history's Python stacks slow every allocation, and no timed or counted step may
    pay for them."""
    if not built.clock.on_cuda:
        return ()
    set_phase("ddp_step_timer: what holds the peak of device memory (one step)")
    with recording_peak_sites(built.clock) as sites:
        built.train_step()
        built.clock.synchronize()
    return tuple(sites)


def _measure(spec: StepSpec) -> RankStep:
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    built = build(spec)
    _warm_up(built, spec.warmup)
    calibration = _rebalance(built, rank) if spec.batch_shares == AUTO else ()
    back_to_back = (spec.back_to_back if spec.back_to_back is not None
                    else built.clock.on_cuda)
    peak_rss = rss_bytes()
    host_control: list[float] = []
    if back_to_back:
        check = _host_check(spec)
        _run_host_check(check, "before")
        phases = _back_to_back(built, True, spec.steps)
        no_sync_s = [p[3] for p in _back_to_back(built, False, spec.steps)]
        _run_host_check(check, "after")
        timed = _Timed(phases, no_sync_s)
        host_control = check.compute_s if check is not None else []
    else:
        timed = _from_barriers(built, spec, rank)
    if not built.clock.on_cuda:
        peak_rss = max(peak_rss, timed.peak_rss, rss_bytes())
    peak, capacity, source = memory_figures(built.clock, peak_rss, world)
    census, flops, mesh_comm, counted_s = (_census(built) if spec.count_collectives
                                           else (b"", 0, (), 0.0))
    sites = _peak_sites(built) if spec.count_collectives else ()
    phases = timed.phases
    return RankStep(
        rank=rank, batch_size=built.batch_size, forward_s=tuple(p[0] for p in phases),
        backward_s=tuple(p[1] for p in phases), optimizer_s=tuple(p[2] for p in phases),
        step_s=tuple(p[3] for p in phases), no_sync_step_s=tuple(timed.no_sync_s),
        comm=tuple(timed.comm), comm_time_s=tuple(timed.comm_time_s), peak_memory_bytes=peak,
        memory_source=source, memory_capacity_bytes=capacity, device=str(built.clock.device),
        buckets=max(timed.buckets) if timed.buckets else None, census=census,
        control_s=tuple(timed.control_s), memory_control_s=tuple(timed.memory_control_s),
        flops=flops, mesh_comm=mesh_comm, counted_step_s=counted_s, calibration_s=calibration,
        host_control_s=tuple(host_control), peak_sites=sites)


Phases = tuple[float, float, float, float]  # forward, backward, optimizer, whole step


@dataclasses.dataclass
class _Timed:
    """What the timed steps gave on this rank."""

    phases: list[Phases]  # per synchronised step
    no_sync_s: list[float]  # per step without gradient sync
    comm: list[CommCall] = dataclasses.field(default_factory=list)
    comm_time_s: list[float] = dataclasses.field(default_factory=list)
    buckets: list[int] = dataclasses.field(default_factory=list)
    control_s: list[float] = dataclasses.field(default_factory=list)
    memory_control_s: list[float] = dataclasses.field(default_factory=list)
    peak_rss: int = 0


def _back_to_back(built: Built, sync: bool, steps: int) -> list[Phases]:
    """``steps`` steps (``sync``: with gradient sync) queued back to back as training runs
    them: a timestamp at each step's start and after its forward and backward, none drained
    until the block ends (one synchronize, then the events are read).  A step is from its
    start to the next one's, so each rank's includes its wait for the others in the step's
    collectives.  The block starts at a barrier, outside the timed run."""
    import torch.distributed as dist

    clock = built.clock
    what = f"ddp_step_timer: {steps} {'synchronised' if sync else 'no_sync'} steps back to back"
    set_phase(f"{what}, waiting at the barrier")
    dist.barrier()
    clock.synchronize()
    set_phase(what)
    marks = [_stamped_step(built, sync) for _ in range(steps)]
    end = clock.now()
    clock.synchronize()
    starts = [m[0] for m in marks] + [end]
    return [(clock.seconds(t0, t1), clock.seconds(t1, t2), clock.seconds(t2, nxt),
             clock.seconds(t0, nxt)) for (t0, t1, t2), nxt in zip(marks, starts[1:],
                                                                   strict=True)]


#: host-speed control readings before, and as many after, the back-to-back blocks
_HOST_READINGS = 3


def _host_check(spec: StepSpec) -> HostControls | None:
    """The host-speed control for steps timed back to back (``spec.control``), timed on the
    host's clock: the host's speed, which a GPU step's launches depend on."""
    if not spec.control:
        return None
    import torch

    check = HostControls(Clock(torch.device("cpu")))
    check.warm()
    return check


def _run_host_check(check: HostControls | None, when: str) -> None:
    if check is None:
        return
    for k in range(_HOST_READINGS):
        check.run(f"ddp_step_timer: host-speed control {when} the timed steps "
                  f"{k + 1}/{_HOST_READINGS}")


def _stamped_step(built: Built, sync: bool) -> tuple[Any, Any, Any]:
    """One training step (``sync``: with gradient sync), and the clock's timestamps at its
    start, after its forward and after its backward (the optimizer runs last)."""
    clock = built.clock
    t0 = clock.now()
    with contextlib.nullcontext() if sync else built.no_sync(), built.context():
        loss = built.forward()
        t1 = clock.now()
        loss.backward()
        t2 = clock.now()
    built.optimizer.step()
    built.optimizer.zero_grad(set_to_none=True)
    return t0, t1, t2


def _from_barriers(built: Built, spec: StepSpec, rank: int) -> _Timed:
    """CPU ranks: synchronised and no-sync steps alternating, each from a barrier, the
    host-speed control after each synchronised one, the comm hook's buckets."""
    timed = _Timed([], [])
    check = HostControls(built.clock) if spec.control and not built.clock.on_cuda else None
    if check is not None:
        check.warm()
    for k in range(spec.steps):
        for sync in ((True, False) if k % 2 == 0 else (False, True)):
            times, buckets = _timed_step(built, sync, k, spec.steps)
            if not sync:
                timed.no_sync_s.append(times[3])
            else:
                timed.phases.append(times)
                if check is not None:
                    check.run(f"ddp_step_timer: host-speed control {k + 1}/{spec.steps}")
            if sync and built.timer is not None:
                calls = [CommCall("all_reduce", nbytes, seconds, rank, k, index, start)
                         for index, nbytes, start, seconds in buckets]
                timed.comm.extend(calls)
                timed.comm_time_s.append(union_length((c.start_s, c.start_s + c.time_s)
                                                      for c in calls))
                timed.buckets.append(len(calls))
            if not built.clock.on_cuda:
                timed.peak_rss = max(timed.peak_rss, rss_bytes())
    if check is not None:
        timed.control_s, timed.memory_control_s = check.compute_s, check.memory_s
    return timed


def _wrap(model: Any, wrapper: str, device: Any, kwargs: dict[str, Any],
          policy: Any = None) -> tuple[Any, Callable[[], Any]]:
    """The wrapped model and a context-manager factory that turns gradient sync off."""
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        if device.type == "cuda":
            kwargs = {"device_ids": [device.index], **kwargs}
        ddp = DistributedDataParallel(model, **kwargs)
        return ddp, ddp.no_sync
    if wrapper == "fsdp":
        from pytest_distperf.rank.fsdp import no_sync_of, shard

        sharded = shard(model, policy, kwargs)
        return sharded, no_sync_of(sharded)
    raise ValueError(f"ddp_step_timer: wrapper must be one of {', '.join(WRAPPERS)}, "
                     f"got {wrapper!r}")
