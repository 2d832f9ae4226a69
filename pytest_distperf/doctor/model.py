"""The runner check's page as frozen data, and its JSON.  No torch, no pytest.

Each test of the check fills one part (:class:`Fidelity`, :class:`Floor`, ...) into a
:class:`Check`; the page (:mod:`~pytest_distperf.doctor.page`) and the JSON section are made
from it.  Times are seconds, shares are fractions (0.25 is 25%).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytest_distperf.records import to_dict


@dataclasses.dataclass(frozen=True, slots=True)
class Advice:
    """One warning: what is wrong, with its figure, and what to do about it."""

    topic: str  # "environment", "gpu", "load", "fidelity", "floor"
    problem: str
    action: str


@dataclasses.dataclass(frozen=True, slots=True)
class Busy:
    """One other process's share of the CPUs during a span: ``cores`` worth of CPU time."""

    pid: int
    name: str
    cores: float


@dataclasses.dataclass(frozen=True, slots=True)
class Load:
    """What the noise probe saw during a span (None: could not be read)."""

    seconds: float
    cpus: int
    steal: float | None
    wait: float | None  # s/s a rank waited for a CPU
    other_load: float | None  # share of all the CPUs other processes used
    noisy: tuple[str, ...] = ()  # the probe's reasons, as a verdict would give them
    busiest: tuple[Busy, ...] = ()  # the other processes that used the most CPU


@dataclasses.dataclass(frozen=True, slots=True)
class Fidelity:
    """The plugin's figure against a bare loop timed the same way, and the bare loop against
    itself (the A/A: how far two identical loops read apart here)."""

    name: str  # "bench", "measure", "step"
    what: str  # what was timed, e.g. "all_reduce 16MiB, 2 ranks"
    plugin_s: float  # median over every iteration, slowest rank
    bare_s: float
    again_s: float  # the second bare series
    iterations: int  # per side
    load: Load | None = None
    note: str = ""  # why the ratio is not judged, where it is not

    @property
    def ratio(self) -> float:
        """The plugin's time over the bare loop's (1.03: the plugin reads 3% longer)."""
        return self.plugin_s / self.bare_s if self.bare_s > 0 else float("nan")

    @property
    def aa(self) -> float:
        """The second bare series over the first."""
        return self.again_s / self.bare_s if self.bare_s > 0 else float("nan")


@dataclasses.dataclass(frozen=True, slots=True)
class Floor:
    """A kind of metric measured as a save measures it, and the change a comparison tells."""

    kind: str  # "measure", "bench", "step"
    metric: str  # the metric's name, e.g. "all_reduce.4MiB.busbw_gbps"
    what: str  # what was measured
    unit: str
    value: float  # the median of the measurements' medians
    measurements: int
    spread: float | None  # of the measurements' figures (a standard deviation of logs)
    detectable: float | None  # the smallest change told 9 times in 10; None: unknown
    controlled: bool  # with the host-speed control taken out (CPU ranks)
    fresh_ranks: bool = False  # each measurement on freshly started ranks, as a save's
    load: Load | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GpuReading:
    """What NVML said of one GPU, read while the GPU was busy (None: not readable)."""

    index: int
    name: str
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    reasons: int | None = None  # the clocks' event (throttle) reasons, NVML's bit mask
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None  # the default power limit
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_pending: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    #: compute processes (pid, MiB): all of them where NVML's pids are not the ranks' (a
    #: container), else the others
    processes: tuple[tuple[int, int], ...] = ()
    ranks_here: int = 1  # the ranks among ``processes``


@dataclasses.dataclass(frozen=True, slots=True)
class System:
    """The environment and topology."""

    hostname: str
    backend: str
    device_type: str
    device_model: str
    world_size: int
    torch_version: str
    nccl_version: str  # "" on gloo
    cpu_model: str
    cores: int  # the cores the ranks may run on
    threads_per_rank: int
    smt: str  # e.g. "2 threads per core", "" where unreadable
    governor: str  # the CPU frequency governor, "" where unreadable
    variables: tuple[tuple[str, str], ...] = ()  # NCCL_*, TORCH_*, ... as the ranks see them
    devices: tuple[str, ...] = ()  # per rank: its device


@dataclasses.dataclass(slots=True)
class Check:
    """The whole page, filled in test by test."""

    tolerance: float
    quick: bool
    system: System | None = None
    fidelity: list[Fidelity] = dataclasses.field(default_factory=list)
    floors: list[Floor] = dataclasses.field(default_factory=list)
    gpus: list[GpuReading] = dataclasses.field(default_factory=list)
    nvml: str = ""  # why NVML was not read, where it was not
    advice: list[Advice] = dataclasses.field(default_factory=list)
    load: Load | None = None  # the whole check
    seconds: float = 0.0
    errors: list[str] = dataclasses.field(default_factory=list)  # parts that failed


def check_to_dict(check: Check, sentences: dict[str, Any]) -> dict[str, Any]:
    """The JSON section: every figure, the ratios, and the sentences of the page
    (``sentences``: :func:`~pytest_distperf.doctor.page.sentences`)."""
    data: dict[str, Any] = to_dict(check)
    for entry, fid in zip(data["fidelity"], check.fidelity, strict=True):
        entry["ratio"] = fid.ratio
        entry["aa"] = fid.aa
    data.update(sentences)
    return data
