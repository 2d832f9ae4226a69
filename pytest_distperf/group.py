"""The ``nccl_group`` fixture's handle: a group of ranks a test can run code on.

Controller side only; the work happens on the ranks through an engine
(:mod:`pytest_distperf.launcher`).  Results that a fixture wants judged are passed to the
test's recorder as :class:`~pytest_distperf.records.Metric` values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pytest_distperf.config import require_int
from pytest_distperf.launcher import Engine
from pytest_distperf.records import (
    CollectiveResult,
    MeasureResult,
    Metric,
    PairMatrix,
    Remeasure,
)

#: ``recorder(label, metrics, result, remeasure, fresh_ranks)``: ``remeasure()`` repeats the
#: measurement and returns fresh metrics of the same names (used to confirm a regression);
#: ``fresh_ranks``: it may do so on freshly started ranks (it sets up all it needs).
Recorder = Callable[[str, Sequence[Metric], Any, "Remeasure | None", bool], None]
Checked = TypeVar("Checked", CollectiveResult, PairMatrix)


class DistGroup:
    """A live process group of ``world_size`` ranks, kept across tests.

    ``run(fn, *args, **kwargs)`` calls ``fn`` once on every rank, with torch.distributed
    initialised there and this group as the default group, and returns the results in rank
    order.  An exception on a rank raises :class:`~pytest_distperf.launcher.RankError` (the
    rank and its traceback); a call past the timeout raises
    :class:`~pytest_distperf.launcher.RankTimeout`.
    """

    def __init__(
        self, engine: Engine, world_size: int | None = None, *,
        recorder: Recorder | None = None, module: types.ModuleType | None = None,
    ) -> None:
        size = engine.world_size if world_size is None else world_size
        if size > engine.world_size:
            raise ValueError(
                f"world_size={size} is larger than the {engine.world_size} ranks available "
                f"(--gpus {engine.world_size}); ask for at most {engine.world_size} or run with "
                f"--gpus {size}"
            )
        if size < 1:
            raise ValueError(f"world_size must be at least 1, got {size}")
        self._engine = engine
        self._size = size
        self._recorder = recorder
        self._module = module
        if module is not None:
            _pickle_by_value(module)

    @property
    def world_size(self) -> int:
        return self._size

    @property
    def backend(self) -> str:
        return self._engine.backend

    @property
    def device_type(self) -> str:
        return self._engine.device_type

    @property
    def engine(self) -> Engine:
        return self._engine

    def __repr__(self) -> str:
        return (f"<DistGroup world_size={self._size} backend={self.backend} "
                f"device={self.device_type} ({self._engine.mode})>")

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        __tracebackhide__ = True
        if not callable(fn):
            raise TypeError(f"run() needs a callable, got {fn!r}")
        label = f"run({getattr(fn, '__qualname__', repr(fn))})"
        return self._engine.execute(fn, args, kwargs, self._size, label)

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             label: str, world_size: int | None = None) -> list[Any]:
        """Like :meth:`run` with an explicit label (shown when it hangs) and group size."""
        __tracebackhide__ = True
        size = self._size if world_size is None else world_size
        if size > self._engine.world_size:
            raise ValueError(
                f"world_size={size} is larger than the {self._engine.world_size} ranks "
                f"available (--gpus {self._engine.world_size})"
            )
        return self._engine.execute(fn, args, kwargs, size, label)

    def record(self, label: str, metrics: Sequence[Metric], result: Any = None,
               remeasure: Remeasure | None = None, *, fresh_ranks: bool = False) -> None:
        """Hand metrics (and the result they came from) to the test's verdict.

        ``remeasure``, when given, repeats the measurement and returns fresh metrics; the
        verdict calls it to confirm a suspected regression before failing the test.
        ``fresh_ranks=True`` says that it sets up everything it needs, so that the verdict
        may run it on freshly started ranks (docs/baselines.md, item 9).
        """
        if self._recorder is not None:
            self._recorder(label, metrics, result, remeasure, fresh_ranks)

    @property
    def device_model(self) -> str:
        """The ranks' device model, as rank 0 reports it (a GPU's name, or the CPU's)."""
        return str(self.engine.rank_info()[0].get("device_model", ""))

    def measure(self, name: str, fn: Callable[..., Any], *args: Any, warmup: int = 3,
                iters: int = 20, control: bool = True, **kwargs: Any) -> MeasureResult:
        """Time ``fn(*args, **kwargs)`` on every rank, ``iters`` times after ``warmup``.

        Each iteration starts at a barrier; its time is the slowest rank's.  Records the
        metric ``<name>.time_s`` (lower is better) with the per-iteration samples.  On CPU
        ranks each iteration is followed by the host-speed control (about 2-3 ms, the same
        on all ranks; ``control=False`` leaves it out), with which the baseline verdict
        takes the host's changing speed out of the comparison (docs/baselines.md).
        """
        __tracebackhide__ = True
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"measure(): name must be a non-empty word, got {name!r}")
        require_int(warmup, "measure(): warmup", 0)
        require_int(iters, "measure(): iters", 1)
        from pytest_distperf.rank.clock import measure_on_rank

        label = f"measure({name})"

        def once() -> MeasureResult:
            per_rank = self.call(measure_on_rank, (fn, args, kwargs, warmup, iters, control),
                                 {}, label)
            return MeasureResult.from_per_rank(name, [r.samples for r in per_rank],
                                               [r.control for r in per_rank],
                                               [r.memory_control for r in per_rank])

        result = once()
        self.record(label, result.metrics(), result, lambda: once().metrics())
        return result

    def bench(self, op: str, sizes: Any = None, *, dtype: Any = None, warmup: int = 5,
              iters: int | None = None, control: bool = True,
              min_time_s: float | None = None) -> CollectiveResult:
        """Benchmark one collective over a sweep of message sizes, the way nccl-tests does.

        ``op``: one of :data:`pytest_distperf.collectives.OPS`; ``sizes``: byte counts or
        strings (``"64KiB"``, ``"16MiB"``), default 64 KiB .. 64 MiB by x4 on CPU, .. 1 GiB on
        GPU; ``dtype``: a torch dtype (default ``torch.float32``).  Per size: ``warmup``
        untimed calls, ``iters`` barrier-aligned timed calls, one correctness check.
        ``iters`` not given: 20, and on CPU ranks as many more as fill ``min_time_s`` (default
        1 s per size, at most 2000 calls: a gloo collective's calls spread too much for 20 to
        judge a 10% change); a given ``iters`` is exactly that many calls unless
        ``min_time_s`` is given too.  Records
        ``<op>.<size>.busbw_gbps`` per size (``barrier.time_us`` for the barrier).  Wrong
        values raise :class:`~pytest_distperf.collectives.WrongResultError`.
        On CPU ranks each timed call is followed by the host-speed control, as in
        :meth:`measure`, and the verdict judges the bandwidth with it (``control=False``: the
        plain rule, which caught 2 of 10 10% slowdowns of a gloo all-reduce on a 2-core
        runner, against 9 of 10 with the control; benchmarks/verdict_quality.md, R22).
        """
        __tracebackhide__ = True
        from pytest_distperf import collectives, hardware
        from pytest_distperf.rank.collectives import bench_on_rank

        spec = collectives.plan(op, sizes, dtype, warmup, iters, world_size=self._size,
                                device_type=self.device_type, control=control,
                                min_time_s=min_time_s)
        label = f"bench({op})"
        peak = hardware.link_peak(self.backend, self.device_type, self.device_model)

        def once() -> CollectiveResult:
            per_rank = self.call(bench_on_rank, (spec,), {},
                                 f"bench({op}, {len(spec.labels)} size(s))")
            result = collectives.build_result(spec, per_rank, backend=self.backend,
                                              device_type=self.device_type)
            if peak is None:
                return result
            return dataclasses.replace(result, link_peak_gbps=peak[0], link=peak[1])

        return self._record_checked(label, once)

    def bench_pairs(self, size: int | str | None = None, *, dtype: Any = None,
                    warmup: int = 3, iters: int = 10) -> PairMatrix:
        """Send/recv bandwidth of every ordered pair of ranks, one pair at a time.

        ``size`` defaults to 4 MiB on CPU, 64 MiB on GPU.  The matrix points at a slow link
        (one slow pair) or a slow device (every pair with one rank slow).  Records
        ``pairs.<size>.min_busbw_gbps`` (the slowest pair, higher is better).  When the ranks
        span nodes (torchrun across machines), the matrix's ``by_node`` view splits it into
        intra-node and inter-node figures (also recorded) and names a slow node or link
        (docs/cluster.md).
        """
        __tracebackhide__ = True
        from pytest_distperf import collectives, topology
        from pytest_distperf.rank.collectives import pairs_on_rank

        if self._size < 2:
            raise ValueError("bench_pairs() needs at least 2 ranks")
        spec = collectives.plan("send_recv", collectives.DEFAULT_PAIR_SIZE[self.device_type]
                                if size is None else [size], dtype, warmup, iters,
                                world_size=self._size, device_type=self.device_type)
        label = f"bench_pairs({spec.labels[0]})"

        def once() -> PairMatrix:
            per_rank = self.call(pairs_on_rank,
                                 (spec.counts[0], spec.dtype, warmup, iters), {}, label)
            matrix = collectives.build_pairs(spec, per_rank, backend=self.backend,
                                             device_type=self.device_type)
            return collectives.with_nodes(matrix, nodes)

        nodes = topology.node_names(self.engine.rank_info()[:self._size])
        return self._record_checked(label, once)

    def _record_checked(self, label: str, once: Callable[[], Checked]) -> Checked:
        """Run a collective measurement, failing on wrong values, and record it.

        ``once()`` measures and returns a result with ``wrong`` (the #wrong count) and
        ``metrics()``.  Wrong values raise WrongResultError, after recording the result
        without metrics so that its table still shows the count.  Otherwise the metrics are
        recorded with a re-measurement that checks the values again.
        """
        __tracebackhide__ = True
        from pytest_distperf import collectives

        def checked() -> Checked:
            __tracebackhide__ = True
            result = once()
            if result.wrong:
                raise collectives.WrongResultError(collectives.wrong_message(result), result)
            return result

        try:
            result = checked()
        except collectives.WrongResultError as exc:
            self.record(label, [], exc.result)
            raise
        self.record(label, result.metrics(), result, lambda: checked().metrics())
        return result


def _pickle_by_value(module: types.ModuleType) -> None:
    """Ship the test module's functions by value: ranks need not import the test file."""
    import cloudpickle

    name = getattr(module, "__name__", None)
    if name and sys.modules.get(name) is module:
        # not registrable: pickled by reference through the shipped sys.path instead
        with contextlib.suppress(ValueError):
            cloudpickle.register_pickle_by_value(module)
