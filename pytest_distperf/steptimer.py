"""The ``ddp_step_timer`` fixture's object: time training steps, and scaling curves.

Controller side, no torch at import: the measuring runs on the ranks
(:func:`pytest_distperf.rank.ddp.time_steps`), the figures come from the pure
:mod:`pytest_distperf.analyzer`, and every result is recorded under the test with the
metrics its verdict judges:

* ``step_time_s`` (s, lower is better; on CPU ranks with the host-speed control run after
  every synchronised step, unless ``control=False``) and ``compute_time_s`` (the same step
  without gradient synchronisation, with the same control; a step regressed by less than
  the tolerance while its compute was not is inconclusive: :mod:`pytest_distperf.verdict.parts`);
* ``comm_overhead`` (fraction, threshold ``max_comm_overhead``);
* ``imbalance`` (fraction, threshold ``max_imbalance``, naming the straggling ranks);
* exact, from one more step run under ``torch.profiler``: ``comm.<op>.calls`` and
  ``comm.<op>.bytes`` per step for every kind of collective, and ``comm.buckets`` (DDP's
  gradient buckets per step);
* informational, to explain the others' verdicts: ``exposed_comm_s`` (step - compute); and
  ``throughput`` (samples/s), the inverse of ``step_time_s``, which is judged in its place;
* from ``.scaling``: ``scaling_efficiency.w<N>`` (fraction, threshold
  ``min_scaling_efficiency``) for every world size above the smallest, and
  ``scaling_throughput.w<N>`` (samples/s) for every world size.

With ``name="x"`` every metric name gets the prefix ``x.`` (to time several models in one
test).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pytest_distperf import analyzer
from pytest_distperf.config import is_int, is_number, require_int
from pytest_distperf.findings import hint, scaling_cause
from pytest_distperf.group import DistGroup
from pytest_distperf.hardware import peak_flops
from pytest_distperf.rank.ddp import WRAPPERS, StepSpec
from pytest_distperf.records import (
    EXACT,
    INFORMATIONAL,
    MEASURED,
    Metric,
    ScalingResult,
    StepTiming,
    comm_count_metrics,
)
from pytest_distperf.verdict.thresholds import resolve_thresholds

SCALING_MODES = ("weak", "strong")


class DDPStepTimer:
    """``ddp_step_timer(model_fn, batch_fn, ...) -> StepTiming``;
    ``ddp_step_timer.scaling(model_fn, batch_fn, world_sizes=..., mode=...) -> ScalingResult``.

    ``model_fn()`` builds the module on every rank (seeded identically); the timer moves it
    to the rank's device and wraps it (``wrapper="ddp"``: DistributedDataParallel,
    ``"fsdp"``: FSDP2 ``fully_shard`` on every block of the model's ModuleLists and
    ModuleDicts (else on every direct child with parameters; a block whose parameters are
    tied to a module outside it stays with the root), then the root; ``fsdp_policy`` picks
    the blocks instead: module classes or a callable module -> bool; a model ``model_fn``
    sharded itself is used as it is, and blocks it sharded are kept).  ``optimizer_fn`` gets the
    parameters, or the wrapped module when its first parameter is named ``model`` or
    ``module`` (``lambda model: model.module.configure_optimizers(...)``).
    ``batch_fn(rank)`` returns that rank's input, a tensor or a tuple of tensors for
    ``model(*batch)``; the loss is ``loss_fn(output)`` or ``output.sum()``; the optimizer is
    ``optimizer_fn(parameters)`` or SGD.  ``wrapper_kwargs`` go to the wrapper (DDP:
    ``bucket_cap_mb``, ``find_unused_parameters``, ``static_graph``, ...; FSDP2:
    ``fully_shard``'s keywords); ``comm_hook=hook`` or ``(state, hook)`` registers a DDP
    comm hook (the timing hook calls it for every bucket); ``comm_timing`` times DDP's
    buckets with that Python hook (default: on CPU ranks only, since on a GPU its callbacks
    slow the step; False leaves DDP's own all-reduce, or ``comm_hook``, untimed: no
    per-bucket figures, no overlap); ``count_collectives=False`` skips the extra profiled
    step that counts the collectives (no ``comm.*`` metrics); ``control=False`` leaves out
    the host-speed control after every synchronised step on CPU ranks (``step_time_s`` is
    then judged by the plain rule).
    """

    def __init__(self, group: DistGroup, limits: Mapping[str, float] | None = None) -> None:
        self._group = group
        self._limits = resolve_thresholds(limits)

    @property
    def world_size(self) -> int:
        """The test's group size (the default ``world_size``)."""
        return self._group.world_size

    @property
    def available(self) -> int:
        """The ranks of the pool (``--gpus``): the largest world size a call may ask for."""
        return int(self._group.engine.world_size)

    def __repr__(self) -> str:
        return f"<ddp_step_timer on {self._group!r}>"

    # -- one configuration ------------------------------------------------------------------
    def __call__(
        self, model_fn: Callable[[], Any], batch_fn: Callable[[int], Any], *,
        steps: int = 20, warmup: int = 3, world_size: int | None = None,
        loss_fn: Callable[[Any], Any] | None = None, wrapper: str = "ddp",
        optimizer_fn: Callable[[Any], Any] | None = None,
        wrapper_kwargs: Mapping[str, Any] | None = None, comm_timing: bool | None = None,
        comm_hook: Any = None, count_collectives: bool = True, fsdp_policy: Any = None,
        control: bool = True, name: str = "", peak_tflops: float | None = None,
    ) -> StepTiming:
        __tracebackhide__ = True
        peak = self._peak_flops(peak_tflops)
        spec = dataclasses.replace(
            _spec(model_fn, batch_fn, steps, warmup, loss_fn, wrapper, optimizer_fn,
                  wrapper_kwargs, comm_timing, comm_hook, fsdp_policy),
            count_collectives=bool(count_collectives), control=bool(control))
        size = self.world_size if world_size is None else world_size
        self._check_sizes([size], "world_size")
        prefix = _prefix(name)
        label = f"ddp_step_timer({prefix}{wrapper}, {size} ranks)"

        def once() -> StepTiming:
            return dataclasses.replace(self._measure(spec, size, label), peak_flops=peak)

        timing = once()
        # its step and compute, with the host-speed control, are re-measured on fresh ranks
        # (docs/baselines.md, item 9); a plain save keeps the best measurement, which on
        # fresh ranks would be the fastest of several pools
        self._group.record(label, step_metrics(timing, prefix), timing,
                           lambda: step_metrics(once(), prefix), fresh_ranks=spec.control)
        return timing

    # -- a scaling curve --------------------------------------------------------------------
    def scaling(
        self, model_fn: Callable[[], Any], batch_fn: Callable[[int], Any], *,
        world_sizes: Iterable[int] = (1, 2, 4), mode: str = "weak", steps: int = 20,
        warmup: int = 3, loss_fn: Callable[[Any], Any] | None = None, wrapper: str = "ddp",
        optimizer_fn: Callable[[Any], Any] | None = None,
        wrapper_kwargs: Mapping[str, Any] | None = None, comm_timing: bool | None = None,
        comm_hook: Any = None, fsdp_policy: Any = None, name: str = "",
    ) -> ScalingResult:
        """Time the step on the first N ranks for every N in ``world_sizes``.

        ``mode="weak"``: every rank keeps ``batch_fn(rank)`` (fixed per-rank batch);
        ``mode="strong"``: ``batch_fn(rank)`` is the global batch, split along dim 0 over the
        N ranks (fixed global batch).  Efficiency is 1.0 at the smallest world size.
        """
        __tracebackhide__ = True
        if mode not in SCALING_MODES:
            raise ValueError(f"ddp_step_timer.scaling: mode must be one of "
                             f"{', '.join(SCALING_MODES)}, got {mode!r}")
        sizes = _world_sizes(world_sizes)
        self._check_sizes(sizes, "world_sizes")
        spec = dataclasses.replace(
            _spec(model_fn, batch_fn, steps, warmup, loss_fn, wrapper, optimizer_fn,
                  wrapper_kwargs, comm_timing, comm_hook, fsdp_policy),
            split_batch=mode == "strong",
            count_collectives=False, control=False)  # the curve: throughputs, no counts
        prefix = _prefix(name)

        def once() -> ScalingResult:
            timings = [self._measure(spec, n, f"ddp_step_timer.scaling({prefix}{mode}, "
                                              f"{n} of {', '.join(map(str, sizes))} ranks)")
                       for n in sizes]
            return analyzer.scaling_result(timings, mode, limits=self._limits)

        result = once()
        self._group.record(f"ddp_step_timer.scaling({prefix}{mode})",
                           scaling_metrics(result, prefix, self._limits), result,
                           lambda: scaling_metrics(once(), prefix, self._limits))
        return result

    # -- helpers ----------------------------------------------------------------------------
    def _peak_flops(self, peak_tflops: float | None) -> float:
        """FLOP/s of one device at most: the test's ``peak_tflops``, else the data-sheet
        figure of the ranks' GPU (pytest_distperf/hardware.py), else 0.0 (unknown; CPUs)."""
        if peak_tflops is not None:
            if not is_number(peak_tflops) or not peak_tflops > 0:
                raise ValueError(f"ddp_step_timer: peak_tflops must be a number > 0 (TFLOP/s "
                                 f"of one device), got {peak_tflops!r}")
            return float(peak_tflops) * 1e12
        if self._group.device_type != "cuda":
            return 0.0
        return peak_flops(self._group.device_model)

    def _measure(self, spec: StepSpec, size: int, label: str) -> StepTiming:
        from pytest_distperf.rank.ddp import time_steps
        from pytest_distperf.traces.census import census, device_busy_s

        per_rank = self._group.call(time_steps, (spec,), {}, label, world_size=size)
        traces = [r.census for r in per_rank]
        per_rank = [dataclasses.replace(r, census=b"") for r in per_rank]
        return analyzer.analyze_steps(per_rank, wrapper=spec.wrapper, limits=self._limits,
                                      comm_counts=census(traces),
                                      device_busy_s=device_busy_s(traces))

    def _check_sizes(self, sizes: Sequence[int], what: str) -> None:
        bad = [n for n in sizes if not is_int(n) or n < 1]
        if bad:
            raise ValueError(f"ddp_step_timer: {what} must be whole numbers >= 1, got {bad!r}")
        too_big = [n for n in sizes if n > self.available]
        if too_big:
            raise ValueError(
                f"ddp_step_timer: {what} asks for {', '.join(map(str, too_big))} ranks but only "
                f"{self.available} are available (--gpus {self.available}); ask for at most "
                f"{self.available} or run with --gpus {max(too_big)}")


def _prefix(name: str) -> str:
    if name and (any(c.isspace() for c in name) or name.startswith(".")):
        raise ValueError(f"ddp_step_timer: name must be a word without spaces, got {name!r}")
    return f"{name}." if name else ""


def _world_sizes(world_sizes: Iterable[int]) -> list[int]:
    sizes = list(world_sizes)
    if not sizes:
        raise ValueError("ddp_step_timer.scaling: world_sizes is empty")
    bad = [n for n in sizes if not is_int(n) or n < 1]
    if bad:
        raise ValueError(f"ddp_step_timer.scaling: world_sizes must be whole numbers >= 1, "
                         f"got {bad!r}")
    return sorted(set(sizes))


def _spec(model_fn: Any, batch_fn: Any, steps: int, warmup: int, loss_fn: Any, wrapper: str,
          optimizer_fn: Any, wrapper_kwargs: Mapping[str, Any] | None,
          comm_timing: bool | None, comm_hook: Any = None,
          fsdp_policy: Any = None) -> StepSpec:
    for label, fn in (("model_fn", model_fn), ("batch_fn", batch_fn)):
        if not callable(fn):
            raise TypeError(f"ddp_step_timer: {label} must be callable, got {fn!r}")
    for label, fn in (("loss_fn", loss_fn), ("optimizer_fn", optimizer_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"ddp_step_timer: {label} must be callable or None, got {fn!r}")
    if wrapper not in WRAPPERS:
        raise ValueError(f"ddp_step_timer: wrapper must be one of {', '.join(WRAPPERS)}, "
                         f"got {wrapper!r}")
    require_int(steps, "ddp_step_timer: steps", 1)
    require_int(warmup, "ddp_step_timer: warmup", 0)
    if fsdp_policy is not None and wrapper != "fsdp":
        raise ValueError(f"ddp_step_timer: fsdp_policy is for wrapper='fsdp', not {wrapper!r}")
    return StepSpec(model_fn, batch_fn, steps, warmup, loss_fn, wrapper, optimizer_fn,
                    dict(wrapper_kwargs or {}), comm_timing=comm_timing,
                    comm_hook=_comm_hook(comm_hook, wrapper), fsdp_policy=fsdp_policy)


def _comm_hook(hook: Any, wrapper: str) -> tuple[Any, Callable[[Any, Any], Any]] | None:
    """``comm_hook=hook`` or ``(state, hook)`` as (state, hook); DDP only."""
    if hook is None:
        return None
    if wrapper != "ddp":
        raise ValueError(f"ddp_step_timer: comm_hook is a DDP comm hook; wrapper={wrapper!r} "
                         "has none")
    state, fn = hook if isinstance(hook, tuple) and len(hook) == 2 else (None, hook)
    if not callable(fn):
        raise TypeError(f"ddp_step_timer: comm_hook must be a DDP comm hook hook(state, "
                        f"bucket) or a (state, hook) pair, got {hook!r}")
    return state, fn


def _paired(control: tuple[float, ...], times: tuple[float, ...]) -> tuple[float, ...]:
    """``control`` where it has one figure per time (the step's or the no-sync steps'),
    else ()."""
    return control if len(control) == len(times) else ()


def step_metrics(timing: StepTiming, prefix: str = "") -> list[Metric]:
    """The metrics a :class:`StepTiming` is judged by (thresholds and baselines): the
    measured ones (the step, and its compute: the no-sync steps, each with the host-speed
    control where the step has it; :mod:`pytest_distperf.verdict.parts` checks the one
    against the other), the exact communication counts (:func:`comm_count_metrics`) and,
    to explain their verdicts, the exposed communication time.

    ``imbalance`` is informational against its baseline where the step carries the
    host-speed control (CPU ranks): there, ranks sharing a few cores are unbalanced by the
    host from one run to the next by as much as the change a baseline would judge (20
    clean runs of one block read 0.025-0.111, against a line 0.05 points above the
    baseline: benchmarks/ddp_verdicts.md, R70 and R71), and ``max_imbalance`` still fails
    a test whose imbalance crosses it."""
    samples = timing.samples
    w = timing.world_size
    steps = samples.get("step_s", ())
    no_sync = samples.get("no_sync_step_s", ())
    control = samples.get("control_s", ())
    memory = samples.get("memory_control_s", ())
    return [
        Metric(f"{prefix}step_time_s", timing.step_time_s, "s", False, steps, world_size=w,
               control=_paired(control, steps), memory_control=_paired(memory, steps)),
        Metric(f"{prefix}throughput", timing.throughput, "samples/s", True,
               samples.get("throughput", ()), world_size=w, kind=INFORMATIONAL),
        Metric(f"{prefix}comm_overhead", timing.comm_overhead, "fraction", False,
               samples.get("comm_overhead", ()), threshold="max_comm_overhead",
               hint=_hint(timing, "communication"), world_size=w),
        Metric(f"{prefix}imbalance", timing.imbalance, "fraction", False,
               samples.get("imbalance", ()), threshold="max_imbalance",
               ranks=_imbalance_ranks(timing), hint=_hint(timing, "imbalance"),
               world_size=w, kind=INFORMATIONAL if control else MEASURED),
        Metric(f"{prefix}compute_time_s", timing.compute_time_s, "s", False, no_sync,
               world_size=w, control=_paired(control, no_sync),
               memory_control=_paired(memory, no_sync)),
        # judged and shown by its value, as comm_overhead is: per-step differences of two
        # noisy times, clamped at 0, put a good-side estimator at 0 beside a real overhead
        Metric(f"{prefix}exposed_comm_s", timing.comm_overhead * timing.step_time_s, "s",
               False, world_size=w, kind=INFORMATIONAL),
        *comm_count_metrics(timing.comm_counts, f"{prefix}comm.", w, "/step"),
        *([Metric(f"{prefix}comm.buckets", float(timing.buckets), "buckets/step", False,
                  world_size=w, kind=EXACT)] if timing.buckets is not None else []),
        *flops_metrics(timing, prefix),
    ]


def flops_metrics(timing: StepTiming, prefix: str = "") -> list[Metric]:
    """Where the step's FLOPs were counted: ``flops_per_step`` (all ranks together, exact: a
    change of model or batch shows in it), ``achieved_tflops`` and, where the devices' peak
    is known, ``mfu`` (informational)."""
    if not timing.flops_per_step:
        return []
    w = timing.world_size
    steps = timing.samples.get("step_s", ())
    out = [Metric(f"{prefix}flops_per_step", float(timing.flops_per_step), "FLOP/step", False,
                  world_size=w, kind=EXACT),
           Metric(f"{prefix}achieved_tflops", timing.achieved_flops / 1e12, "TFLOP/s", True,
                  tuple(timing.flops_per_step / s / 1e12 for s in steps if s > 0),
                  world_size=w, kind=INFORMATIONAL)]
    if timing.mfu is not None:
        out.append(Metric(f"{prefix}mfu", timing.mfu, "fraction", True, world_size=w,
                          kind=INFORMATIONAL))
    return out


def _hint(timing: StepTiming, kind: str) -> str:
    return hint(timing.bottlenecks, kind, stragglers=timing.stragglers,
                shares=timing.batch_shares)


def _imbalance_ranks(timing: StepTiming) -> tuple[int, ...]:
    """The stragglers; else the slowest rank (what a breach under another limit concerns)."""
    if timing.stragglers:
        return tuple(timing.stragglers)
    if len(timing.per_rank) < 2:
        return ()
    return (max(timing.per_rank, key=lambda r: r.compute_time_s).rank,)


def scaling_metrics(result: ScalingResult, prefix: str = "",
                    limits: Mapping[str, float] | None = None) -> list[Metric]:
    """``scaling_throughput.w<N>`` per world size, ``scaling_efficiency.w<N>`` above the
    smallest one."""
    lim = resolve_thresholds(limits)
    out: list[Metric] = []
    if not result.points:
        return out
    base = result.points[0]
    for p in result.points:
        batch = p.throughput * p.step_time_s
        out.append(Metric(f"{prefix}scaling_throughput.w{p.world_size}", p.throughput,
                          "samples/s", True,
                          tuple(batch / s if s > 0 else 0.0 for s in p.step_samples),
                          world_size=p.world_size))
        if p is base:
            continue
        cause, suggestion = scaling_cause(p, base, result.mode, lim)
        out.append(Metric(f"{prefix}scaling_efficiency.w{p.world_size}", p.efficiency,
                          "fraction", True, p.samples, threshold="min_scaling_efficiency",
                          hint=f"{cause}: {suggestion}", world_size=p.world_size))
    return out
