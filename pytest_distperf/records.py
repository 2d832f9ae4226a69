"""Frozen dataclasses of plain values: what crosses a process boundary or is stored.

The shared types of both sides: the specs the controller sends to the ranks, the replies
and results they send back, the metrics and verdicts of a test, and the constants both
sides must agree on.  No torch, no pytest.  ``to_dict``/``from_dict`` give every record a
JSON round-trip; :func:`record_to_dict`/:func:`record_from_dict` do it for a whole test,
results included (for the JSON report and pytest-xdist).
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pytest_distperf.quantiles import median_or_nan, quantile_or_nan

T = TypeVar("T")


def to_dict(record: Any) -> Any:
    """A JSON-ready structure (dicts, lists, str, numbers, None) for a record tree.

    Fields marked ``metadata={"transient": True}`` (callables, live handles) are left out.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)
                if not f.metadata.get("transient")}
    if isinstance(record, dict):
        return {str(k): to_dict(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    if isinstance(record, str) and type(record) is not str:
        return str(record)  # torch's TorchVersion: plain data serialisers (execnet) refuse it
    return record


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a record of type ``cls`` from :func:`to_dict`'s output."""
    return typing.cast(T, _build(cls, data))


def _build(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        non_none = [a for a in args if a is not type(None)]
        return _build(non_none[0], data) if len(non_none) == 1 else data
    if dataclasses.is_dataclass(tp):
        upgrade = getattr(tp, "upgrade_dict", None)
        if upgrade is not None:  # a record whose JSON layout changed reads its older ones
            data = upgrade(data)
        hints = typing.get_type_hints(tp)
        kwargs = {
            f.name: _build(hints[f.name], data[f.name])
            for f in dataclasses.fields(tp)
            if f.name in data
        }
        return typing.cast(Any, tp)(**kwargs)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in data)
        return tuple(_build(a, v) for a, v in zip(args, data, strict=True))
    if origin is list:
        return [_build(args[0], v) for v in data]
    if origin is dict:
        return {_build(args[0], k) if args[0] is not str else k: _build(args[1], v)
                for k, v in data.items()}
    if tp is float and isinstance(data, int):
        return float(data)
    return data


@dataclasses.dataclass(frozen=True, slots=True)
class Environment:
    """What a baseline is keyed by: results are only compared within one environment."""

    backend: str
    device_type: str  # "cuda" or "cpu"
    device_model: str  # e.g. "NVIDIA H100 80GB HBM3", or the CPU model name
    device_count: int  # devices used by the group (ranks on GPU; 0 on CPU)
    world_size: int
    torch_version: str
    nccl_version: str  # "" where NCCL is not in use
    #: on CPU ranks: the cores the ranks may run on, and each rank's torch threads (0 on
    #: CUDA, where the device sets the pace): a 2-core and a 16-core runner of one CPU model
    #: are different machines
    cpu_cores: int = 0
    threads_per_rank: int = 0
    #: on CPU ranks: the cores each rank is bound to with ``--distperf-bind`` (0: not
    #: bound, the scheduler places them); a gloo collective ran 1.35-1.5x faster bound
    #: (docs/pool.md)
    bound_cores: int = 0

    def key(self) -> str:
        """A stable, readable key, e.g. ``gloo-cpu-w2-c2t1b1-torch2.13.0`` (2 cores, 1
        thread per rank, each rank bound to 1 core; the device model is separate)."""
        parts = [self.backend, self.device_type, f"w{self.world_size}"]
        if self.cpu_cores:
            bound = f"b{self.bound_cores}" if self.bound_cores else ""
            parts.append(f"c{self.cpu_cores}t{self.threads_per_rank}{bound}")
        parts.append(f"torch{self.torch_version.split('+')[0]}")
        if self.nccl_version:
            parts.append(f"nccl{self.nccl_version}")
        return "-".join(parts)

    def baselines_key(self) -> str:
        """The key this environment's baselines live under, as verdicts name it: :meth:`key`
        and the device model, e.g. ``gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc``."""
        model = re.sub(r"[^a-z0-9]+", "-", self.device_model.lower()).strip("-")
        return f"{self.key()}-{model or 'unknown'}"


@dataclasses.dataclass(frozen=True, slots=True)
class Metric:
    """One measured figure of a test, with what the verdict machinery needs to judge it.

    ``name`` is stable across runs (``all_reduce.16MiB.busbw_gbps``, ``step_time_s``);
    ``samples`` are the per-iteration values behind ``value`` (the estimator's input);
    ``threshold`` names the threshold that applies (``max_comm_overhead``,
    ``max_imbalance``, ``min_scaling_efficiency``, ``max_arrival_skew``) or is empty;
    ``ranks`` are the ranks a breach concerns (stragglers); ``hint`` is what to do about a
    breach; ``control``, for a time measured on CPU ranks, holds per sample the time of the
    host-speed control run right after it (:mod:`pytest_distperf.rank.clock`), with which
    the verdict takes the host's speed out, and ``memory_control`` the memory control's,
    run right after that (() in records older than it).
    """

    name: str
    value: float
    unit: str = ""
    higher_is_better: bool = False
    samples: tuple[float, ...] = ()
    threshold: str = ""
    ranks: tuple[int, ...] = ()
    hint: str = ""
    world_size: int = 0  # the group the metric was measured on (0: the test's group)
    control: tuple[float, ...] = ()  # seconds, one per sample; () when there is no control
    kind: str = ""  # MEASURED (""), EXACT or INFORMATIONAL: how the baseline judges it
    memory_control: tuple[float, ...] = ()  # seconds, one per sample, or ()

    @property
    def is_fraction(self) -> bool:
        """Fractions near zero are judged in absolute points as well as relatively."""
        return self.unit == "fraction"

    def as_samples(self) -> Samples:
        """The samples with their controls, as the verdict judges them."""
        return Samples(self.samples, self.control, self.memory_control)


@dataclasses.dataclass(frozen=True, slots=True)
class Samples:
    """A metric's per-iteration values, each with the host-speed control and the memory
    control timed right after it (() where there is none), and, for several measurements
    pooled into one, how many values each gave (``sizes``, in order; () for one)."""

    values: tuple[float, ...] = ()
    control: tuple[float, ...] = ()
    memory_control: tuple[float, ...] = ()
    sizes: tuple[int, ...] = ()


#: How a metric is judged against its baseline (:attr:`Metric.kind`):
#: a timing or a ratio of timings, judged statistically (re-measured, tested for noise);
MEASURED = ""
#: a count or a byte total that does not depend on the host's speed (collective calls per
#: step, bytes per step, gradient buckets): any change beyond the exact tolerance (default
#: 0) is a regression or an improvement, from one measurement;
EXACT = "exact"
#: a figure kept beside the others to explain their verdicts (compute and communication
#: time of a step, a profile's fractions from one call): compared and shown, never failing.
INFORMATIONAL = "informational"
METRIC_KINDS = (MEASURED, EXACT, INFORMATIONAL)


#: What a metric's comparison with its baseline can come to (:class:`Verdict`).
REGRESSED = "regressed"
IMPROVED = "improved"
UNCHANGED = "unchanged"
INCONCLUSIVE = "inconclusive"
NO_BASELINE = "no baseline"
NOT_COMPARABLE = "not comparable"
SAVED = "saved"
#: The verdict of an informational metric (:data:`INFORMATIONAL`) that has a baseline: its
#: change is shown, and never fails the test.
INFO = "informational"
#: The order verdicts are listed in (the summary shows regressions first).
VERDICT_ORDER = (REGRESSED, INCONCLUSIVE, IMPROVED, NOT_COMPARABLE, NO_BASELINE, UNCHANGED,
                 INFO, SAVED)


@dataclasses.dataclass(frozen=True, slots=True)
class Measured:
    """One measurement of a metric: its figure, its samples with their controls, and what
    the noise probe saw during it (None: not measured).  A verdict keeps every one, and a
    baseline its pooled one, so that a verdict can be judged again from the record
    (benchmarks/replay.py)."""

    value: float
    samples: Samples = Samples()
    steal: float | None = None
    wait: float | None = None
    other_load: float | None = None

    @staticmethod
    def upgrade_dict(data: dict[str, Any]) -> dict[str, Any]:
        """A measurement in the older JSON layout (samples and controls side by side, no
        value) in today's."""
        if not isinstance(data.get("samples", {}), list):
            return data
        values = data["samples"]
        samples = {"values": values, "control": data.get("control", []),
                   "memory_control": data.get("memory_control", [])}
        return {"value": median_or_nan(values), "samples": samples,
                **{k: data.get(k) for k in ("steal", "wait", "other_load")}}


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """How one metric compared with its baseline (see :mod:`pytest_distperf.verdict`).

    ``verdict``: regressed, improved, unchanged, inconclusive, no baseline, not comparable,
    or saved (with ``--distperf-save``).  ``change`` is relative, (current - baseline) /
    baseline, in the metric's own direction of numbers; ``confidence`` is 1 - p of the
    one-sided test in the verdict's direction; ``measurement_count`` counts the measurements
    behind ``current`` (1 + re-measurements); ``steal``, ``wait``, ``other_load`` and
    ``spread`` are the noise figures of the measurement reported; ``host_change`` is how
    much slower (positive) the host-speed control ran than when the baseline was saved,
    where the metric has one, and ``control_slope`` how strongly the metric follows it (0:
    not at all, 1: in proportion): the change is then judged with that part taken out.
    ``detail`` starts with one plain sentence (what changed, how sure, what to do), the
    figures after it.  ``explanation`` says what else changed in the same measurement
    (collective counts and bytes, compute and communication time), for a verdict that is
    not ``unchanged``; ``kind`` is the metric's (:attr:`Metric.kind`).  ``measurements``
    holds every measurement of a measured metric in this run, in order (the test's own,
    then each re-measurement), so that a verdict can be checked, or judged again by another
    rule; the baseline's are in the baseline file.
    """

    metric: str
    verdict: str
    environment: str = ""
    unit: str = ""
    higher_is_better: bool = False
    baseline: float | None = None
    current: float | None = None
    change: float | None = None
    confidence: float | None = None
    tolerance: float = 0.0
    measurement_count: int = 1
    steal: float | None = None
    wait: float | None = None
    spread: float | None = None
    detail: str = ""
    host_change: float | None = None
    control_slope: float | None = None
    explanation: str = ""
    kind: str = ""
    other_load: float | None = None
    measurements: tuple[Measured, ...] = ()

    @staticmethod
    def upgrade_dict(data: dict[str, Any]) -> dict[str, Any]:
        """A verdict in the older JSON layout (``windows`` for ``measurement_count``) in
        today's."""
        if "windows" not in data:
            return data
        return {("measurement_count" if k == "windows" else k): v for k, v in data.items()}


#: Repeats a measurement on the same ranks and returns fresh metrics of the same names.
Remeasure = Callable[[], Sequence[Metric]]


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """One measurement a fixture made in a test: its metrics, the typed result they came
    from (a :class:`CollectiveResult`, :class:`StepTiming`, ...; None for bare metrics) and
    how to repeat it (None: it cannot be), which the verdict uses to confirm a change.

    ``fresh_ranks``: the re-measurement sets up everything it needs (a ``ddp_step_timer``
    step), so it may run on freshly started ranks rather than on the pool's own, whose
    offset it would share (docs/baselines.md, item 9)."""

    label: str
    metrics: tuple[Metric, ...]
    result: Any = None
    remeasure: Remeasure | None = dataclasses.field(
        default=None, repr=False, compare=False, metadata={"transient": True})
    fresh_ranks: bool = False


def distinct(measurement: Measurement, earlier: Sequence[Measurement]) -> Measurement:
    """``measurement`` with a label and metric names that no ``earlier`` measurement of the
    test used: a repeat gets ``#2``, ``#3``, ... (``bench(all_reduce)#2``,
    ``all_reduce.16MiB.busbw_gbps#2``), and its re-measurement is renamed the same way, so
    that every measurement is judged and confirmed on its own.  The names depend only on the
    order of the calls in the test, so they are stable from run to run."""
    labels = {m.label for m in earlier}
    names = {x.name for m in earlier for x in m.metrics}
    label = _first_free(measurement.label, labels)
    renamed = {x.name: _first_free(x.name, names) for x in measurement.metrics}
    if label == measurement.label and all(k == v for k, v in renamed.items()):
        return measurement

    def rename(metrics: Sequence[Metric]) -> list[Metric]:
        return [dataclasses.replace(x, name=renamed.get(x.name, x.name)) for x in metrics]

    remeasure = measurement.remeasure
    again = None if remeasure is None else (lambda: rename(remeasure()))
    return Measurement(label, tuple(rename(measurement.metrics)), measurement.result, again,
                       measurement.fresh_ranks)


def _first_free(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    n = 2
    while f"{name}#{n}" in taken:
        n += 1
    return f"{name}#{n}"


@dataclasses.dataclass(slots=True)
class TestRecord:
    """What one test measured and how it was judged (filled in while the test runs)."""

    __test__ = False  # not a pytest test class

    nodeid: str
    world_size: int
    measurements: list[Measurement] = dataclasses.field(default_factory=list)
    breaches: list[str] = dataclasses.field(default_factory=list)
    verdicts: list[Verdict] = dataclasses.field(default_factory=list)

    @property
    def metrics(self) -> list[Metric]:
        """Every metric of every measurement, in the order they were recorded."""
        return [m for measurement in self.measurements for m in measurement.metrics]


@dataclasses.dataclass(frozen=True, slots=True)
class RankTimes:
    """One rank's reply to ``measure()``: seconds per timed iteration, and of the host-speed
    control after each (empty without one), and of the memory control after that."""

    samples: tuple[float, ...]
    control: tuple[float, ...] = ()
    memory_control: tuple[float, ...] = ()


def slowest_control(per_rank: Sequence[Sequence[float]], iterations: int) -> tuple[float, ...]:
    """The host-speed control per iteration, the slowest rank's (as the samples are); ()
    when some rank's controls do not pair with the ``iterations``."""
    if not per_rank or not all(len(r) == iterations for r in per_rank):
        return ()
    return tuple(max(float(v) for v in col) for col in zip(*per_rank, strict=True))


@dataclasses.dataclass(frozen=True, slots=True)
class MeasureResult:
    """What :meth:`DistGroup.measure` measured: per-rank samples and the per-iteration max."""

    name: str
    per_rank: tuple[tuple[float, ...], ...]  # seconds, [rank][iteration]
    samples: tuple[float, ...]  # seconds per iteration, slowest rank
    #: seconds of the host-speed control after each iteration, slowest rank; () without one
    control: tuple[float, ...] = ()
    #: seconds of the memory control after each iteration, slowest rank; () without one
    memory_control: tuple[float, ...] = ()

    @classmethod
    def from_per_rank(cls, name: str, per_rank: Sequence[Sequence[float]],
                      control_per_rank: Sequence[Sequence[float]] = (),
                      memory_per_rank: Sequence[Sequence[float]] = ()) -> MeasureResult:
        rows = tuple(tuple(float(v) for v in r) for r in per_rank)
        samples = tuple(max(col) for col in zip(*rows, strict=True)) if rows else ()
        return cls(name, rows, samples, slowest_control(control_per_rank, len(samples)),
                   slowest_control(memory_per_rank, len(samples)))

    @property
    def time_s(self) -> float:
        """Median over iterations of the slowest rank's time."""
        return median_or_nan(self.samples)

    def metrics(self) -> list[Metric]:
        return [Metric(f"{self.name}.time_s", self.time_s, "s", False, self.samples,
                       control=self.control, memory_control=self.memory_control)]


def gbps(nbytes: float, time_us: float) -> float:
    """Bytes moved in ``time_us`` microseconds as GB/s (1e9 bytes per second): nccl-tests'
    algbw; 0.0 for no time."""
    return nbytes / (time_us * 1e3) if time_us > 0 else 0.0


def _band(samples: Sequence[float], center: float) -> float:
    """(p90 - p10) / ``center``; 0.0 when there is nothing to spread."""
    if not samples or not center > 0:
        return 0.0
    return (quantile_or_nan(samples, 0.9) - quantile_or_nan(samples, 0.1)) / center


# -- nccl_group.bench / bench_pairs -----------------------------------------------------------
#: Ops whose buffer is split into one chunk per rank: S must hold a whole number of chunks.
CHUNKED_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
#: The root rank of the rooted ops (broadcast, reduce).
ROOT = 0


@dataclasses.dataclass(frozen=True, slots=True)
class BenchSpec:
    """What every rank is asked to measure (sent to the ranks by ``bench``)."""

    op: str
    labels: tuple[str, ...]  # the sizes as asked for, as written in metric names
    counts: tuple[int, ...]  # elements in S for each size (S: see CollectiveRow)
    dtype: str  # torch dtype name, e.g. "float32"
    element_size: int
    warmup: int
    iters: int
    world_size: int
    control: bool = False  # the host-speed control after every timed call (CPU ranks)
    #: more timed calls, until the size's timed loop took this long (at most ``max_iters``)
    min_time_s: float = 0.0
    max_iters: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class SizeOutcome:
    """One rank's reply for one size of ``bench``: seconds per timed iteration, and the
    correctness check (wrong elements, where the first one was); ``control``: seconds of the
    host-speed control after each iteration (CPU ranks; else ()), ``memory_control`` of the
    memory control after that."""

    samples: tuple[float, ...]
    wrong: int
    first_wrong: str = ""
    control: tuple[float, ...] = ()
    memory_control: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class PairOutcome:
    """One rank's reply to ``bench_pairs``: the round trips it timed as a sender, and the
    wrong elements it counted as a receiver, per (src, dst) pair."""

    sent: dict[tuple[int, int], tuple[float, ...]]
    received: dict[tuple[int, int], int]


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One size of a collective benchmark (one line of the nccl-tests-style table).

    ``size_bytes`` is S in nccl-tests' formulas (all_gather: the output, reduce_scatter: the
    input, all_to_all: one rank's buffer); ``label`` is the size as asked for and as written in
    metric names (``"16MiB"``); ``samples_us`` holds, per timed iteration, the slowest rank's
    time; ``wrong`` counts the elements that failed the correctness check, over all ranks.
    """

    label: str
    size_bytes: int
    count: int  # elements in size_bytes
    time_us: float  # median over iterations of the slowest rank's time
    algbw_gbps: float  # size_bytes / time, GB/s (1e9 bytes per second)
    busbw_gbps: float  # algbw * the op's bus factor
    wrong: int
    samples_us: tuple[float, ...]
    per_rank_us: tuple[tuple[float, ...], ...]  # [rank][iteration]
    first_wrong: str = ""  # where the first wrong element was seen, when wrong > 0
    #: per iteration, the slowest rank's host-speed control (seconds; () without one)
    control_s: tuple[float, ...] = ()
    #: per iteration, the slowest rank's memory control (seconds; () without one)
    memory_control_s: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """(p90 - p10) / median of the per-iteration samples: 0.1 means a 10% band."""
        return _band(self.samples_us, self.time_us)


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveResult:
    """What :meth:`DistGroup.bench` measured: one :class:`CollectiveRow` per size."""

    op: str
    world_size: int
    backend: str
    device_type: str
    dtype: str  # e.g. "float32"
    warmup: int
    iters: int
    bus_factor: float  # busbw = algbw * bus_factor (nccl-tests' definitions)
    rows: tuple[CollectiveRow, ...]
    #: the link's per-direction peak where known (pytest_distperf/hardware.py), else 0.0
    link_peak_gbps: float = 0.0
    link: str = ""  # e.g. "NVLink 4"

    def peak_fraction(self, row: CollectiveRow) -> float | None:
        """``row``'s busbw as a fraction of the link's peak (None where it is not known, or
        where no data crosses a link: one rank)."""
        if not self.link_peak_gbps > 0 or self.op == "barrier" or not self.bus_factor > 0:
            return None
        return row.busbw_gbps / self.link_peak_gbps

    @property
    def wrong(self) -> int:
        """Wrong elements over every size and rank (nccl-tests' ``#wrong``, summed)."""
        return sum(row.wrong for row in self.rows)

    def row(self, size: int | str) -> CollectiveRow:
        """The row of a size given as its label (``"16MiB"``) or its byte count."""
        for row in self.rows:
            if size in (row.label, row.size_bytes):
                return row
        raise KeyError(f"{self.op}: no row for size {size!r}; sizes: "
                       f"{', '.join(row.label for row in self.rows)}")

    def metrics(self) -> list[Metric]:
        """``<op>.<size>.busbw_gbps`` per size (higher is better); ``barrier.time_us``; and
        ``<op>.<size>.time_us`` where busbw is 0 by definition (all_reduce on one rank),
        informational: such a call moves no data, its time is the launch's."""
        out: list[Metric] = []
        for row in self.rows:
            if self.op == "barrier" or not self.bus_factor > 0:
                name = "barrier" if self.op == "barrier" else f"{self.op}.{row.label}"
                kind = MEASURED if self.op == "barrier" else INFORMATIONAL
                out.append(Metric(f"{name}.time_us", row.time_us, "us", False, row.samples_us,
                                  world_size=self.world_size, control=row.control_s,
                                  kind=kind, memory_control=row.memory_control_s))
                continue
            samples = tuple(gbps(row.size_bytes, t) * self.bus_factor for t in row.samples_us)
            out.append(Metric(f"{self.op}.{row.label}.busbw_gbps", row.busbw_gbps, "GB/s", True,
                              samples, world_size=self.world_size, control=row.control_s,
                              memory_control=row.memory_control_s))
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class PairRow:
    """One directed pair of a send/recv bandwidth matrix: ``src`` sends to ``dst``."""

    src: int
    dst: int
    time_us: float  # median per-iteration time of one transfer plus a one-element reply
    busbw_gbps: float  # size / time (send/recv: busbw = algbw)
    wrong: int
    samples_us: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(p90 - p10) / median of the round trips."""
        return _band(self.samples_us, self.time_us)


#: A pair is slow below this fraction of a typical (75th-percentile) pair's bandwidth.
SLOW_PAIR_RATIO = 0.7


@dataclasses.dataclass(frozen=True, slots=True)
class PairMatrix:
    """What :meth:`DistGroup.bench_pairs` measured: every ordered pair of ranks, one at a
    time, while the other ranks wait; a slow link or device shows up as slow pairs."""

    world_size: int
    backend: str
    device_type: str
    dtype: str
    label: str
    size_bytes: int
    warmup: int
    iters: int
    pairs: tuple[PairRow, ...]
    #: the matrix seen by node, when the ranks span nodes (docs/cluster.md)
    by_node: NodeSplit | None = None

    @property
    def bottlenecks(self) -> tuple[Bottleneck, ...]:
        """The findings about nodes and the links between them (none on one node)."""
        return self.by_node.bottlenecks if self.by_node is not None else ()

    @property
    def wrong(self) -> int:
        return sum(p.wrong for p in self.pairs)

    def matrix(self) -> list[list[float | None]]:
        """``[src][dst]`` bandwidth in GB/s; None on the diagonal."""
        grid: list[list[float | None]] = [[None] * self.world_size
                                          for _ in range(self.world_size)]
        for p in self.pairs:
            grid[p.src][p.dst] = p.busbw_gbps
        return grid

    @property
    def typical_gbps(self) -> float:
        """The 75th percentile of the pairs' bandwidths: what a healthy pair reaches."""
        return quantile_or_nan([p.busbw_gbps for p in self.pairs], 0.75)

    def slow_pairs(self, ratio: float = SLOW_PAIR_RATIO) -> list[PairRow]:
        """Pairs below ``ratio`` x the typical pair, slowest first."""
        limit = ratio * self.typical_gbps
        return sorted((p for p in self.pairs if p.busbw_gbps < limit),
                      key=lambda p: p.busbw_gbps)

    def suspect_ranks(self, ratio: float = SLOW_PAIR_RATIO) -> list[int]:
        """Ranks with at least 3/4 of their own pairs slow: a device or its link.

        One bad device or link slows every pair it is in (the other ranks see it only in
        their pairs with that rank); one bad cable between two ranks slows only that pair,
        and then no rank is named.  Needs at least 3 ranks to tell.
        """
        if self.world_size < 3:
            return []
        slow = {(p.src, p.dst) for p in self.slow_pairs(ratio)}
        own = 2 * (self.world_size - 1)  # pairs each rank is in (as sender or receiver)
        return [rank for rank in range(self.world_size)
                if 4 * sum(1 for pair in slow if rank in pair) >= 3 * own]

    def metrics(self) -> list[Metric]:
        """``pairs.<size>.min_busbw_gbps``: per iteration, the slowest pair (higher is
        better), so that a degraded link fails against its baseline; and, when the ranks span
        nodes, ``pairs.<size>.intra_node_busbw_gbps`` and ``.inter_node_busbw_gbps``."""
        if not self.pairs:
            return []
        per_iter = [min(gbps(self.size_bytes, p.samples_us[i]) for p in self.pairs)
                    for i in range(min(len(p.samples_us) for p in self.pairs))]
        value = min(p.busbw_gbps for p in self.pairs)
        by_node = self.by_node.metrics() if self.by_node is not None else []
        return [Metric(f"pairs.{self.label}.min_busbw_gbps", value, "GB/s", True,
                       tuple(per_iter), world_size=self.world_size), *by_node]


# -- ddp_step_timer: training-step timing, scaling, bottlenecks ------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class CommCall:
    """One communication call seen on one rank, e.g. the all-reduce of one DDP gradient bucket.

    ``time_s`` runs from the launch on this rank to its completion there, so it includes the
    time this rank waited for the others to join; ``start_s`` is the launch, in seconds after
    the step began.
    """

    op: str  # "all_reduce", "all_gather", "reduce_scatter", ...
    nbytes: int
    time_s: float
    rank: int = 0
    step: int = 0  # index of the timed step
    index: int = 0  # bucket (or call) index within the step
    start_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class CommCount:
    """The collectives of one kind issued in one training step (or one profiled call):
    exact figures, the same on any host.  ``calls`` and ``bytes`` are the most any rank
    issued (a message's bytes: nccl-tests' size, the largest buffer; 0 for a barrier);
    ``group`` is the process group's ranks where the trace lists them (``"ranks 0,1"``;
    "" where it does not, as on gloo, where every group is counted together)."""

    op: str  # canonical: all_reduce, all_gather, reduce_scatter, barrier, broadcast, ...
    calls: int
    bytes: int
    group: str = ""


def comm_count_metrics(counts: Sequence[CommCount], prefix: str, world_size: int,
                       per: str) -> list[Metric]:
    """``<prefix><op>.calls`` and ``<prefix><op>.bytes`` (none for a barrier) per kind of
    collective, exact; with several process groups the op carries the group's ranks:
    ``all_reduce[ranks 0,1]``."""
    several = len({c.group for c in counts}) > 1
    out: list[Metric] = []
    for c in counts:
        op = f"{c.op}[{c.group}]" if several and c.group else c.op
        out.append(Metric(f"{prefix}{op}.calls", float(c.calls), f"calls{per}", False,
                          world_size=world_size, kind=EXACT))
        if c.op != "barrier":
            out.append(Metric(f"{prefix}{op}.bytes", float(c.bytes), f"B{per}", False,
                              world_size=world_size, kind=EXACT))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class PhaseStats:
    """Order statistics of one phase's per-step samples, in seconds.

    ``spread`` is the interquartile range over the median (0.1: the middle half of the
    samples lies within a 10% band); 0.0 when there is nothing to spread.
    """

    count: int
    median_s: float
    min_s: float
    p25_s: float
    p75_s: float
    max_s: float
    spread: float


@dataclasses.dataclass(frozen=True, slots=True)
class RankStep:
    """What one rank measured in ``ddp_step_timer``: raw per-step samples, in seconds.

    Synchronised steps and steps without gradient synchronisation (``no_sync``) alternate;
    every step starts at a barrier.  ``comm`` holds the communication calls the comm hook
    saw during the synchronised steps (empty where there is no hook, e.g. FSDP2);
    ``comm_time_s`` is, per synchronised step, the time covered by those calls (the union of
    their intervals).
    """

    rank: int
    batch_size: int  # samples per step on this rank
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]  # includes waiting for gradient synchronisation
    optimizer_s: tuple[float, ...]
    step_s: tuple[float, ...]  # whole synchronised steps
    no_sync_step_s: tuple[float, ...]  # whole steps without gradient synchronisation
    comm: tuple[CommCall, ...] = ()
    comm_time_s: tuple[float, ...] = ()
    peak_memory_bytes: int = 0
    memory_source: str = ""  # "cuda_max_allocated" or "rss"
    memory_capacity_bytes: int = 0  # device memory, or this rank's share of host memory
    device: str = ""  # e.g. "cpu", "cuda:0"
    #: gradient buckets DDP reduced per synchronised step (None: no comm hook saw them)
    buckets: int | None = None
    #: seconds of the host-speed control run after every synchronised step (CPU; else ())
    control_s: tuple[float, ...] = ()
    #: seconds of the memory control run after each of those (CPU; else ())
    memory_control_s: tuple[float, ...] = ()
    #: FLOPs of one synchronised step on this rank (torch.utils.flop_counter; 0: not counted)
    flops: int = 0
    #: the Chrome trace (zlib) of one synchronised step run under torch.profiler after the
    #: timed ones, where the collectives are counted; b"" when not counted
    census: bytes = dataclasses.field(default=b"", repr=False,
                                      metadata={"transient": True})


@dataclasses.dataclass(frozen=True, slots=True)
class RankTiming:
    """One rank's figures in a :class:`StepTiming` (``per_rank``)."""

    rank: int
    batch_size: int
    step_time_s: float  # median synchronised step on this rank
    compute_time_s: float  # this rank's step without gradient synchronisation (low quartile)
    wait_time_s: float  # per step, time spent waiting for slower ranks
    idle_fraction: float  # wait_time_s / the group's step time
    comm_time_s: float | None  # per step, time covered by this rank's communication calls
    throughput: float  # samples/s this rank computes (batch_size / compute_time_s)
    peak_memory_bytes: int
    memory_source: str
    memory_capacity_bytes: int
    straggler: bool
    phases: dict[str, PhaseStats] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class CommSummary:
    """Communication of one collective type over every rank and step.

    Bandwidths are algorithm bandwidths (bytes / time) in GB/s (1e9 bytes per second); the
    time of a call includes waiting for the other ranks, so they are lower bounds.
    """

    op: str
    count: int
    total_bytes: int
    total_time_s: float
    avg_bandwidth_gbps: float  # total_bytes / total_time_s
    peak_bandwidth_gbps: float  # the best single call
    slowest: CommCall | None


@dataclasses.dataclass(frozen=True, slots=True)
class LoadBalance:
    """How evenly the ranks carry the work.

    ``imbalance`` = (max - min) / mean of the per-rank compute times; ``cv`` their coefficient
    of variation (population standard deviation / mean); ``stragglers`` the ranks whose
    compute exceeds the median by more than half the imbalance limit; ``missing`` the ranks
    that had no usable compute time (left out of every figure).
    """

    compute_s: tuple[float, ...]
    wait_s: tuple[float, ...]
    idle_fraction: tuple[float, ...]
    imbalance: float
    cv: float
    stragglers: tuple[int, ...]
    missing: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Bottleneck:
    """One finding of the analyzer: what limits the step, how badly, and what to do.

    ``kind``: ``communication``, ``low_overlap``, ``imbalance``, ``straggler``, ``memory``,
    ``launch_bound`` or ``low_scaling``, among others (``findings.KINDS``); ``severity``:
    ``low``, ``medium`` or ``high``; ``value`` and ``limit`` are the figure behind the
    finding and the limit it crossed.
    """

    kind: str
    severity: str
    ranks: tuple[int, ...]
    description: str
    suggestion: str
    value: float = 0.0
    limit: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class StepTiming:
    """What ``ddp_step_timer`` measured: the step, its phases, communication and balance.

    ``step_time_s``: median over synchronised steps of the slowest rank's step;
    ``compute_time_s``: the same for steps without gradient synchronisation;
    ``comm_overhead``: exposed communication / step time (0..1);
    ``comm_time_s``: per step, total communication time seen by the comm hook (None where
    there is none); ``overlap``: the part of it hidden behind computation (0..1, or None);
    ``throughput``: samples per second, all ranks together.  ``samples`` holds the per-step
    values behind the recorded metrics.
    """

    world_size: int
    wrapper: str  # "ddp" or "fsdp"
    steps: int
    step_time_s: float
    compute_time_s: float
    comm_overhead: float
    imbalance: float
    stragglers: list[int]
    per_rank: list[RankTiming]
    throughput: float
    bottlenecks: list[Bottleneck]
    recommendations: list[str]
    comm_time_s: float | None = None
    overlap: float | None = None
    imbalance_cv: float = 0.0
    batch_shares: tuple[float, ...] = ()  # suggested per-rank shares of the global batch
    phases: dict[str, PhaseStats] = dataclasses.field(default_factory=dict)
    communication: list[CommSummary] = dataclasses.field(default_factory=list)
    load_balance: LoadBalance | None = None
    samples: dict[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    raw: list[RankStep] = dataclasses.field(default_factory=list)
    #: collectives per synchronised step, by kind (exact; empty when not counted)
    comm_counts: tuple[CommCount, ...] = ()
    #: DDP gradient buckets per synchronised step (None: not seen, e.g. FSDP2)
    buckets: int | None = None
    #: FLOPs of one synchronised step, all ranks together (0: not counted)
    flops_per_step: int = 0
    #: on a GPU, the share of a step its kernels ran (their time in the counted step over
    #: ``step_time_s``); None on CPU ranks or without the count
    device_busy: float | None = None
    #: the peak FLOP/s of one device (pytest_distperf/hardware.py, or the test's
    #: ``peak_tflops``); 0.0 where it is not known
    peak_flops: float = 0.0

    @property
    def comm_overhead_by_cost(self) -> float:
        """``comm_overhead`` under the name that says how it is measured: what
        synchronising costs the step (the headroom method), not when communication ran (a
        profile's :attr:`ProfileReport.comm_overhead_in_trace`); docs/metrics.md."""
        return self.comm_overhead

    @property
    def overlap_by_cost(self) -> float | None:
        """``overlap`` under the name that says how it is measured: the share of the
        communication time the step does not pay for (see :attr:`comm_overhead_by_cost`)."""
        return self.overlap

    @property
    def achieved_flops(self) -> float:
        """FLOP/s all ranks together achieved: the step's FLOPs over the step time (0.0
        where the FLOPs were not counted)."""
        if not self.flops_per_step or not self.step_time_s > 0:
            return 0.0
        return self.flops_per_step / self.step_time_s

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation: achieved FLOP/s over the peak of the group's devices
        (None where the FLOPs or the peak are not known)."""
        if not self.achieved_flops or not self.peak_flops > 0:
            return None
        return self.achieved_flops / (self.world_size * self.peak_flops)


@dataclasses.dataclass(frozen=True, slots=True)
class ScalingPoint:
    """One world size of a scaling run.  ``speedup`` and ``efficiency`` are relative to the
    smallest world size (weak: throughput; strong: step time of the fixed global batch)."""

    world_size: int
    step_time_s: float
    throughput: float
    speedup: float
    efficiency: float
    comm_overhead: float = 0.0
    imbalance: float = 0.0
    samples: tuple[float, ...] = ()  # per-step efficiency samples
    step_samples: tuple[float, ...] = ()  # per-step step times (slowest rank), seconds


@dataclasses.dataclass(frozen=True, slots=True)
class ScalingResult:
    """What ``ddp_step_timer.scaling`` measured: one :class:`ScalingPoint` per world size."""

    mode: str  # "weak" (fixed per-rank batch) or "strong" (fixed global batch)
    points: list[ScalingPoint]
    bottlenecks: list[Bottleneck] = dataclasses.field(default_factory=list)
    recommendations: list[str] = dataclasses.field(default_factory=list)

    @property
    def efficiency(self) -> dict[int, float]:
        """World size -> scaling efficiency (1.0 at the smallest size)."""
        return {p.world_size: p.efficiency for p in self.points}

    def point(self, world_size: int) -> ScalingPoint:
        for p in self.points:
            if p.world_size == world_size:
                return p
        raise KeyError(f"no scaling point for world size {world_size}; measured: "
                       f"{', '.join(str(p.world_size) for p in self.points)}")


# -- dist_profiler: merged multi-rank traces and what they show ------------------------------
#: Name of the annotation the rank puts around the profiled call (the region the trace
#: analysis measures).
PROFILED_REGION = "distperf:profiled_call"
#: The prefix of the annotation around each step of a profiled call (``ProfilerStep#0``, ...):
#: torch.profiler's own name for steps, which Holistic Trace Analysis reads.
PROFILER_STEP = "ProfilerStep#"


@dataclasses.dataclass(frozen=True, slots=True)
class RankTrace:
    """One rank's reply to ``dist_profiler``: its Chrome trace JSON, zlib-compressed, and
    what the profiled function returned there."""

    trace: bytes
    result: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class RankProfile:
    """One rank's figures in a :class:`ProfileReport`, over the profiled call (seconds).

    ``compute_time_s`` is the time this rank did not spend in exposed communication (the time
    it did not wait on others); ``busy_compute_s`` the time some compute operator or kernel
    ran; ``overlap`` the part of the communication time during which compute ran (0..1);
    ``comm_overhead`` exposed communication / wall time.
    """

    rank: int
    wall_time_s: float
    compute_time_s: float
    busy_compute_s: float
    comm_time_s: float
    exposed_comm_s: float
    overlap: float
    comm_overhead: float
    collectives: int  # collectives issued (send/recv not counted)
    comm_bytes: int  # bytes of every collective and send/recv, nccl-tests' message sizes


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveTiming:
    """One collective of a profiled call, matched across the ranks on the merged clock: when
    each rank arrived (started running it), relative to the first arrival; ``transfer_s``
    from the last rank's arrival to the end (the collective's own time: nobody waits any
    more); each rank's wait is the last arrival minus its own; ``busbw_gbps`` nccl-tests' bus
    bandwidth over the transfer time (NaN for a barrier)."""

    index: int  # position in its process group's order, from 0
    name: str
    group: str
    nbytes: int
    arrivals_s: tuple[float, ...]  # per rank, in rank order
    last_rank: int
    transfer_s: float
    busbw_gbps: float

    @property
    def skew_s(self) -> float:
        """The spread of the arrivals: how long the first rank waited for the last."""
        return max(self.arrivals_s, default=0.0)

    @property
    def waits_s(self) -> tuple[float, ...]:
        return tuple(self.skew_s - a for a in self.arrivals_s)


@dataclasses.dataclass(frozen=True, slots=True)
class StepProfile:
    """One step of a profiled call (a ``ProfilerStep#<index>`` span on every rank), with the
    figures of the whole call computed over that step alone: ``wall_time_s`` is the longest
    rank's step, ``comm_overhead`` the reference rank's (the one that waited least),
    ``imbalance`` (max - min) / mean of the ranks' compute time, ``slowest_rank`` the rank
    with the most compute (the one the others waited for)."""

    index: int
    wall_time_s: float
    comm_overhead: float
    imbalance: float
    slowest_rank: int
    compute_time_s: tuple[float, ...]  # per rank, in rank order
    exposed_comm_s: tuple[float, ...]  # per rank, in rank order


@dataclasses.dataclass(frozen=True, slots=True)
class CollectiveStat:
    """One kind of collective in a profile: calls and bytes per rank (the most any rank had;
    a message's bytes are nccl-tests' size: the largest buffer), time summed over the calls
    (the mean over ranks, and per rank)."""

    name: str  # all_reduce, all_gather, reduce_scatter, broadcast, send, ...
    count: int
    bytes: int
    total_time_s: float
    per_rank_time_s: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class ProfileReport:
    """What ``dist_profiler`` found in the merged trace of one profiled call.

    ``comm_overhead`` and ``overlap`` are those of ``reference_rank``, the rank that waited
    least (the one the others waited for): waiting on a straggler shows up in ``imbalance``
    ((max - min) / mean of per-rank compute time), not twice.  ``desync`` is empty when every
    rank ran the same collectives in the same order; otherwise it says what differed and no
    figure is trusted (:meth:`metrics` is empty).  ``results`` are ``fn``'s return values by
    rank (not stored).
    """

    trace_path: str
    world_size: int
    comm_source: str  # "record_param_comms", "c10d ops" or "none"
    wall_time_s: float
    comm_overhead: float
    overlap: float
    imbalance: float
    stragglers: tuple[int, ...]
    reference_rank: int
    per_rank: tuple[RankProfile, ...]
    collectives: tuple[CollectiveStat, ...]
    desync: str
    bottlenecks: tuple[Bottleneck, ...]
    recommendations: tuple[str, ...]
    imbalance_cv: float = 0.0
    batch_shares: tuple[float, ...] = ()
    comm_counts: tuple[CommCount, ...] = ()  # collectives of the call by kind and group
    steps: tuple[StepProfile, ...] = ()  # the per-step view (one per ProfilerStep span)
    timings: tuple[CollectiveTiming, ...] = ()  # wait vs transfer, collective by collective
    results: tuple[Any, ...] = dataclasses.field(
        default=(), repr=False, compare=False, metadata={"transient": True})

    @property
    def comm_overhead_in_trace(self) -> float:
        """``comm_overhead`` under the name that says how it is measured: communication in
        the trace not covered by compute, over the call, not what it costs a step (the step
        timer's :attr:`StepTiming.comm_overhead_by_cost`); docs/metrics.md."""
        return self.comm_overhead

    @property
    def overlap_in_trace(self) -> float:
        """``overlap`` under the name that says how it is measured: the share of the
        communication that ran while compute ran (see :attr:`comm_overhead_in_trace`)."""
        return self.overlap

    def collective(self, name: str) -> CollectiveStat | None:
        """The stats of one collective (``"all_reduce"``), or None when it did not run."""
        return next((c for c in self.collectives if c.name == name), None)

    def waits_s(self) -> tuple[float, ...]:
        """Per rank (in rank order), the time it waited for the last rank to arrive, summed
        over the collectives of the call."""
        if not self.timings:
            return ()
        return tuple(sum(t.waits_s[i] for t in self.timings)
                     for i in range(len(self.timings[0].arrivals_s)))

    def latest_arrival(self) -> tuple[int, float] | None:
        """The rank that arrived last at most collectives, and the share of the collectives
        it did (the first such rank on a tie); None without matched collectives."""
        return _most_often([t.last_rank for t in self.timings])

    def persistent_straggler(self) -> tuple[int, float] | None:
        """The rank that was slowest in most steps, and the share of the steps it was (the
        first such rank on a tie); None without a per-step view."""
        return _most_often([s.slowest_rank for s in self.steps])

    def metrics(self, prefix: str = "profile", world_size: int = 0) -> list[Metric]:
        """``<prefix>.comm_overhead``, ``<prefix>.imbalance`` and, where there was
        communication, ``<prefix>.overlap``: informational (one call has no samples to
        test; their thresholds still apply); ``<prefix>.arrival_skew_s`` (the median over the
        collectives of the spread of the ranks' arrivals, the rank that arrived last most
        often as its rank), ``<prefix>.arrival_skew`` (the same spread as a share of the
        step, one sample per collective; threshold ``max_arrival_skew``, off by default) and
        ``<prefix>.step_time_s`` (one sample per step), informational; and, exact,
        ``<prefix>.comm.<op>.calls`` and ``.bytes`` of the call.  None when the ranks were
        out of step."""
        if self.desync:
            return []
        hints = {b.kind: b.suggestion for b in reversed(self.bottlenecks)}
        out = [
            Metric(f"{prefix}.comm_overhead", self.comm_overhead, "fraction", False,
                   threshold="max_comm_overhead", hint=hints.get("communication", ""),
                   world_size=world_size, kind=INFORMATIONAL),
            Metric(f"{prefix}.imbalance", self.imbalance, "fraction", False,
                   threshold="max_imbalance", ranks=self.stragglers,
                   hint=hints.get("imbalance", ""), world_size=world_size, kind=INFORMATIONAL),
        ]
        if any(p.comm_time_s > 0 for p in self.per_rank):
            out.append(Metric(f"{prefix}.overlap", self.overlap, "fraction", True,
                              hint=hints.get("low_overlap", ""), world_size=world_size,
                              kind=INFORMATIONAL))
        late = self.latest_arrival()
        if late is not None:
            skews = tuple(t.skew_s for t in self.timings)
            out.append(Metric(f"{prefix}.arrival_skew_s", median_or_nan(skews), "s", False,
                              samples=skews, ranks=(late[0],), world_size=world_size,
                              kind=INFORMATIONAL))
            step = (median_or_nan([s.wall_time_s for s in self.steps]) if self.steps
                    else self.wall_time_s)
            shares = tuple(min(1.0, v / step) for v in skews if math.isfinite(v))
            if step > 0 and shares:
                out.append(Metric(
                    f"{prefix}.arrival_skew", median_or_nan(shares), "fraction", False,
                    samples=shares, threshold="max_arrival_skew", ranks=(late[0],),
                    hint=(f"rank {late[0]} arrived last at {late[1]:.0%} of the collectives "
                          "and the others waited for it: look at what it does before them "
                          "(its input, its compute, its host); report.timings has every "
                          "collective's arrivals"),
                    world_size=world_size, kind=INFORMATIONAL))
        if self.steps:
            walls = tuple(s.wall_time_s for s in self.steps)
            out.append(Metric(f"{prefix}.step_time_s", median_or_nan(walls), "s", False,
                              samples=walls, world_size=world_size, kind=INFORMATIONAL))
        return out + comm_count_metrics(self.comm_counts, f"{prefix}.comm.", world_size, "")


def _most_often(ranks: Sequence[int]) -> tuple[int, float] | None:
    """The rank that occurs most often (the lowest on a tie) and its share; None for none."""
    if not ranks:
        return None
    rank = max(sorted(set(ranks)), key=list(ranks).count)
    return rank, list(ranks).count(rank) / len(ranks)


# -- bench_pairs seen by node (pytest_distperf/topology.py) ---------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class NodeLink:
    """The rank pairs that send from node ``src`` to node ``dst`` (within a node when
    ``src == dst``): the median of their bandwidths and round trips, and the link's
    best case (:data:`pytest_distperf.topology.FAST_QUANTILE` of every iteration's bandwidth)."""

    src: str
    dst: str
    pairs: int
    busbw_gbps: float
    time_us: float
    fast_gbps: float

    @property
    def inter_node(self) -> bool:
        return self.src != self.dst


@dataclasses.dataclass(frozen=True, slots=True)
class SlowNode:
    """A node whose links to the other nodes (``sends``) or from them (``receives``) are
    slow: ``best_gbps`` is the best case of its best link in that direction, against
    ``typical_gbps``, the typical best case of the links between the other nodes."""

    node: str
    ranks: tuple[int, ...]
    sends: bool
    receives: bool
    best_gbps: float
    typical_gbps: float

    @property
    def factor(self) -> float:
        """How many times slower than the links between the other nodes."""
        return self.typical_gbps / self.best_gbps if self.best_gbps > 0 else float("inf")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSplit:
    """``bench_pairs`` seen by node: intra-node and inter-node figures (the median of the
    pairs' bandwidths and round trips; ``None`` where no pair is of that kind), the links
    between nodes, the slow nodes (worst first) and slow links that no slow node explains,
    and the analyzer's findings."""

    label: str
    size_bytes: int
    world_size: int
    nodes: tuple[str, ...]  # the node of each rank
    intra_gbps: float | None
    inter_gbps: float | None
    intra_time_us: float | None
    inter_time_us: float | None
    intra_samples: tuple[float, ...]  # per iteration, the median bandwidth of the pairs
    inter_samples: tuple[float, ...]
    links: tuple[NodeLink, ...]
    slow_nodes: tuple[SlowNode, ...]
    slow_links: tuple[NodeLink, ...]
    typical_link_gbps: float  # the typical best case of the links no slow node explains
    bottlenecks: tuple[Bottleneck, ...] = ()

    def metrics(self) -> list[Metric]:
        """``pairs.<size>.intra_node_busbw_gbps`` and ``pairs.<size>.inter_node_busbw_gbps``
        (higher is better), each where there are pairs of that kind."""
        out = []
        for kind, value, samples in (("intra", self.intra_gbps, self.intra_samples),
                                     ("inter", self.inter_gbps, self.inter_samples)):
            if value is not None:
                out.append(Metric(f"pairs.{self.label}.{kind}_node_busbw_gbps", value, "GB/s",
                                  True, samples, world_size=self.world_size))
        return out


# -- a whole test, for the JSON report and pytest-xdist ----------------------------------------
#: The result types a measurement may carry, by name (how a result dict is typed again).
RESULT_TYPES: dict[str, type] = {cls.__name__: cls for cls in (
    MeasureResult, CollectiveResult, PairMatrix, StepTiming, ScalingResult, ProfileReport)}


def record_to_dict(record: TestRecord) -> dict[str, Any]:
    """A test's record as JSON-ready data: ``metrics`` (all of them, in order), ``results``
    (per measurement: ``label``, ``kind`` of result, how many of the metrics are its own, and
    the ``result``), ``breaches`` and ``verdicts``."""
    return {
        "nodeid": record.nodeid,
        "world_size": record.world_size,
        "metrics": [to_dict(m) for m in record.metrics],
        "results": [{"label": m.label,
                     "kind": type(m.result).__name__ if m.result is not None else "",
                     "metrics": len(m.metrics),
                     "result": to_dict(m.result)} for m in record.measurements],
        "breaches": list(record.breaches),
        "verdicts": [to_dict(v) for v in record.verdicts],
    }


def record_from_dict(data: dict[str, Any]) -> TestRecord:
    """The :class:`TestRecord` of :func:`record_to_dict`'s data, results typed again (a result
    of an unknown kind stays plain data; re-measurements do not travel)."""
    metrics = [from_dict(Metric, m) for m in data.get("metrics", [])]
    measurements = []
    start = 0
    for entry in data.get("results", []):
        count = int(entry.get("metrics", 0))
        kind = RESULT_TYPES.get(str(entry.get("kind", "")))
        result = entry.get("result")
        if kind is not None and isinstance(result, dict):
            result = from_dict(kind, result)
        measurements.append(Measurement(str(entry.get("label", "")),
                                        tuple(metrics[start:start + count]), result))
        start += count
    return TestRecord(str(data["nodeid"]), int(data["world_size"]), measurements,
                      [str(b) for b in data.get("breaches", [])],
                      [from_dict(Verdict, v) for v in data.get("verdicts", [])])
