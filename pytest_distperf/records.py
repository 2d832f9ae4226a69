"""The core data model: frozen dataclasses of plain values that cross a process boundary
or are stored.

A test's metrics, verdicts and record; the specs the controller sends to the ranks and the
replies they send back; the constants both sides must agree on.  No torch, no pytest.
``to_dict``/``from_dict`` give every record a JSON round-trip.  What each fixture returns is
in :mod:`pytest_distperf.fixtures.results`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

# every record's JSON round-trip, re-exported beside the records
from pytest_distperf.common.plaindata import from_dict as from_dict  # noqa: PLC0414
from pytest_distperf.common.plaindata import to_dict as to_dict  # noqa: PLC0414
from pytest_distperf.common.quantiles import median_or_nan

#: The fields of an :class:`Environment` that describe the machine rather than the run: a
#: pinned name (``--distperf-env-name``) stands for them in the key.
MACHINE_FIELDS = ("device_model", "cpu_cores", "driver_version", "interconnect")


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
    #: on NCCL ranks: the NVIDIA driver, torch's CUDA runtime, and how the GPUs are linked
    #: ("nvlink", "pcie", "mixed"; "" on one GPU or where NVML could not tell)
    driver_version: str = ""
    cuda_version: str = ""
    interconnect: str = ""
    #: the pinned environment name (``--distperf-env-name``), "" where none is pinned
    name: str = ""
    #: where ranks share GPUs (gloo-cuda, NCCL's several ranks per GPU), the most on one; 0
    #: with a rank per GPU, and on CPU ranks: shared GPUs give other figures
    ranks_per_gpu: int = 0

    def keyed(self) -> Environment:
        """This environment as baselines are keyed by it: under a pinned name, which stands
        for the machine, the machine's own details (:data:`MACHINE_FIELDS`) left blank."""
        if not self.name:
            return self
        return dataclasses.replace(self, device_model="", cpu_cores=0, driver_version="",
                                   interconnect="")

    def key(self) -> str:
        """A stable, readable key, e.g. ``gloo-cpu-w2-c2t1b1-torch2.13.0`` (2 cores, 1
        thread per rank, each rank bound to 1 core; the device model is separate) or
        ``nccl-cuda-w8-torch2.6.0-cuda12.4-nccl2.21.5-driver550.54.15-nvlink``; where ranks
        share GPUs, how many to one: ``gloo-cuda-w2-2pergpu-torch2.13.0-...``."""
        env = self.keyed()
        parts = [env.backend, env.device_type, f"w{env.world_size}"]
        if env.ranks_per_gpu > 1:
            parts.append(f"{env.ranks_per_gpu}pergpu")
        if env.cpu_cores or env.threads_per_rank:
            cores = f"c{env.cpu_cores}" if env.cpu_cores else ""
            bound = f"b{env.bound_cores}" if env.bound_cores else ""
            parts.append(f"{cores}t{env.threads_per_rank}{bound}")
        parts.append(f"torch{env.torch_version.split('+')[0]}")
        for prefix, value in (("cuda", env.cuda_version), ("nccl", env.nccl_version),
                              ("driver", env.driver_version), ("", env.interconnect)):
            if value:
                parts.append(f"{prefix}{value}")
        return "-".join(parts)

    def baselines_key(self) -> str:
        """The key this environment's baselines live under, as verdicts name it: :meth:`key`
        and the device model, e.g. ``gloo-cpu-w2-c2t1-torch2.13.0-amd-epyc``; or, under a
        pinned name, :meth:`key` ``@`` the name: ``gloo-cpu-w2-t1-torch2.13.0@ubuntu-latest``."""
        if self.name:
            return f"{self.key()}@{self.name}"
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
#: time of a step, a profile's fractions from one call): compared and shown, never failing;
INFORMATIONAL = "informational"
#: a peak of device memory: the host's speed does not move it, the allocator's rounding
#: barely does; judged from one measurement against a small relative bound.
PEAK = "peak"
#: What one site held at a GPU step's peak of device memory: ``peak_memory_bytes.at.<site>``
#: (informational; a site the save did not keep held 0 then).
PEAK_SITE = "peak_memory_bytes.at."
METRIC_KINDS = (MEASURED, EXACT, INFORMATIONAL, PEAK)
#: the kinds judged from one measurement, with no samples to store
SINGLE_MEASUREMENT_KINDS = (EXACT, PEAK)


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
    held: float | None = None  # share of the time a GPU was held below its clocks (NVML)
    sm_clock_mhz: int | None = None  # the lowest SM clock of the ranks' GPUs (NVML)

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
    offset it would share (benchmarks/log/statistics.md, item 9)."""

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
    every step starts at a barrier.  ``comm``: the calls the comm hook saw in the synchronised
    steps (none without a hook, e.g. FSDP2); ``comm_time_s``: per synchronised step, the
    union of their intervals."""

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
    #: steps timed back to back (a GPU): the host-speed control's seconds before and after
    #: the timed blocks, outside them (:func:`~pytest_distperf.rank.ddp._back_to_back`)
    host_control_s: tuple[float, ...] = ()
    #: FLOPs of one synchronised step on this rank (torch.utils.flop_counter; 0: not counted)
    flops: int = 0
    #: with a mesh, the collectives of the counted step by mesh dimension (exact), and the
    #: seconds that step took on this rank (it runs under the counters, slower than others)
    mesh_comm: tuple[DimComm, ...] = ()
    counted_step_s: float = 0.0
    calibration_s: tuple[float, ...] = ()  # batch_shares="auto": its no-sync calibration steps
    #: on a GPU, the sites that held the most device memory at the peak of one more step
    #: (``model.py:88:forward``, bytes), the largest first (:mod:`.common.peaksites`)
    peak_sites: tuple[tuple[str, int], ...] = ()
    #: the Chrome trace (zlib) of one synchronised step run under torch.profiler after the
    #: timed ones, where the collectives are counted; b"" when not counted
    census: bytes = dataclasses.field(default=b"", repr=False,
                                      metadata={"transient": True})


# -- 2-D and 3-D parallel training ------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class DimComm:
    """The collectives of one kind one rank issued in a counted step on the process group
    of one mesh dimension (``other`` for a group outside the mesh:
    :mod:`pytest_distperf.common.layout`); ``bytes`` as
    :class:`~pytest_distperf.fixtures.results.steps.CommCount` has them."""

    dim: str
    op: str
    calls: int
    bytes: int
    seconds: float = 0.0  # blocked in them, issuing and waiting (CPU ranks; else 0)


#: One action of a pipeline stage in a step: (``forward``/``backward``/``weight``, stage
#: index, microbatch, start, end), seconds after the step began.
Chunk = tuple[str, int, int, float, float]


@dataclasses.dataclass(frozen=True, slots=True)
class RankPipeline:
    """What one rank measured in ``ddp_step_timer.pipeline``, per timed step from a barrier:
    ``schedule_s`` the schedule's ``step()`` (the pipeline's span on this rank), ``step_s``
    that and the optimizer step, ``busy_s`` its stages' forward and backward chunks."""

    rank: int
    stages: tuple[int, ...]  # the stage indices this rank holds (several: interleaved)
    blocks: tuple[int, ...]  # per stage, its repeated blocks (0: none found)
    batch_size: int  # rows of the batch this rank's pipeline is fed per step
    step_s: tuple[float, ...]
    schedule_s: tuple[float, ...]
    busy_s: tuple[float, ...]
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    step_chunks: tuple[tuple[Chunk, ...], ...] = ()  # per timed step, its actions in order
    control_s: tuple[float, ...] = ()  # the host-speed control after each step (CPU)
    memory_control_s: tuple[float, ...] = ()
    peak_memory_bytes: int = 0
    memory_source: str = ""
    device: str = ""
    flops: int = 0  # of one counted step on this rank (0: not counted)
    mesh_comm: tuple[DimComm, ...] = ()  # of the counted step, by mesh dimension
    counted_step_s: float = 0.0  # the counted step's seconds on this rank


# -- dist_profiler: merged multi-rank traces and what they show ------------------------------
#: Name of the annotation the rank puts around the profiled call (the region the trace
#: analysis measures).
PROFILED_REGION = "distperf:profiled_call"
#: The range around each forward, backward or weight chunk of a pipeline stage in a profile.
PIPELINE_CHUNK = "pp stage {stage} {kind} mb {microbatch}"
#: The prefix of the annotation around each step of a profiled call (``ProfilerStep#0``, ...):
#: torch.profiler's own name for steps, which Holistic Trace Analysis reads.
PROFILER_STEP = "ProfilerStep#"


@dataclasses.dataclass(frozen=True, slots=True)
class RankTrace:
    """One rank's reply to ``dist_profiler``: its Chrome trace JSON, zlib-compressed, and
    what the profiled function returned there."""

    trace: bytes
    result: Any = None
    mesh_comm: tuple[DimComm, ...] = ()  # with ``dist_profiler.mesh``: by mesh dimension
