"""NVML readings of a GPU, and what in them can spoil a figure.  No torch, no pytest.

:func:`read` asks NVML (the optional ``nvidia-ml-py`` package: ``pip install
'pytest-distperf[gpu]'``) for one device's clocks, the reasons they are held down,
temperature, power, ECC errors, PCIe link and compute processes; a rank calls it while its
GPU is busy (:func:`pytest_distperf.doctor.loops.gpu_reading`), since an idle GPU lowers its
clocks by design.  :func:`gpu_advice` turns readings into warnings, each with what to do;
it is pure, and tested on recorded and hand-made readings.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pytest_distperf.doctor.model import Advice, GpuReading

#: NVML's clock event (throttle) reasons: bit -> name.
REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}
#: Reasons that say the hardware is held back: each a warning, with what to do.
ACTIONS: dict[int, str] = {
    0x2: "reset them (nvidia-smi -rac, and -rgc for locked clocks) or ask the runner's "
         "operator why they are set",
    0x8: "the GPU protects itself (heat or power): check the node's cooling and power "
         "supply, or ask for another machine",
    0x20: "the GPU is too hot: check the node's cooling, or ask for another machine",
    0x40: "the GPU is too hot: check the node's cooling, or ask for another machine",
    0x80: "the node's power supply holds the clocks down: ask the operator, or use another "
          "machine",
}
_POWER_CAP = 0x4
_IDLE = 0x1
#: Below this share of its maximum under load, with no reason given, something holds the
#: SM clock down (locked clocks).  A healthy GPU reports why it runs lower: an H200 and an
#: H100 under the check's matrix products read 1560-1605 of 1980 MHz with "software power
#: cap" set (benchmarks/doctor.md).
CLOCK_SHARE = 0.90


def reasons_text(mask: int) -> str:
    """The names of the bits set in ``mask``, or "none"."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    return ", ".join(names) or "none"


def gpu_advice(readings: Sequence[GpuReading]) -> list[Advice]:
    """A warning for each problem a reading shows."""
    out: list[Advice] = []
    for r in readings:
        out += _clock_advice(r)
        out += _ecc_advice(r)
        out += _process_advice(r)
        if (r.pcie_width is not None and r.pcie_width_max is not None
                and r.pcie_width < r.pcie_width_max):
            out.append(Advice("gpu", f"GPU {r.index}: PCIe link x{r.pcie_width} of "
                              f"x{r.pcie_width_max}: host transfers run at a fraction of "
                              "their speed", "reseat the card, or ask for another machine"))
    return out


def _clock_advice(r: GpuReading) -> list[Advice]:
    out = []
    mask = r.reasons or 0
    clock = _clock(r)
    for bit, action in ACTIONS.items():
        if mask & bit:
            out.append(Advice("gpu", f"GPU {r.index}: clocks held down by "
                              f"{REASONS[bit]}{clock}", action))
    limit, default_limit = r.power_limit_w, r.power_default_w
    if mask & _POWER_CAP and limit and default_limit and limit < 0.99 * default_limit:
        out.append(Advice("gpu", f"GPU {r.index}: at its power limit, {limit:.0f} W, below "
                          f"the default {default_limit:.0f} W{clock}",
                          f"restore it (nvidia-smi -pl {default_limit:.0f})"))
    explained = mask & ~_IDLE
    share = (r.sm_clock_mhz / r.sm_clock_max_mhz
             if r.sm_clock_mhz and r.sm_clock_max_mhz else None)
    if share is not None and share < CLOCK_SHARE and not explained:
        busy = " (NVML read it idle: the busy phase may have ended)" if mask & _IDLE else ""
        out.append(Advice("gpu", f"GPU {r.index}: SM clock {r.sm_clock_mhz} of "
                          f"{r.sm_clock_max_mhz} MHz under load, no reason given{busy}",
                          "look for locked clocks (nvidia-smi -q -d CLOCK) and reset them "
                          "(nvidia-smi -rgc)"))
    return out


def _clock(r: GpuReading) -> str:
    if r.sm_clock_mhz and r.sm_clock_max_mhz:
        return f" (SM clock {r.sm_clock_mhz} of {r.sm_clock_max_mhz} MHz under load)"
    return ""


def _ecc_advice(r: GpuReading) -> list[Advice]:
    out = []
    if r.ecc_uncorrected_volatile:
        out.append(Advice("gpu", f"GPU {r.index}: {r.ecc_uncorrected_volatile} uncorrected "
                          "ECC error(s) since the driver loaded: results on it may be wrong",
                          "drain the node and reset the GPU (nvidia-smi -r)"))
    elif r.ecc_uncorrected_aggregate:
        out.append(Advice("gpu", f"GPU {r.index}: {r.ecc_uncorrected_aggregate} uncorrected "
                          "ECC error(s) in its lifetime", "ask the operator to check the GPU's "
                          "memory health (nvidia-smi -q -d ECC,ROW_REMAPPER)"))
    if r.remapped_rows_pending:
        out.append(Advice("gpu", f"GPU {r.index}: a memory row remap is pending",
                          "reset the GPU (nvidia-smi -r) so that the remap takes effect"))
    return out


def _process_advice(r: GpuReading) -> list[Advice]:
    """Compute processes that are not the ranks.  NVML lists the host's pids: in a container
    none of them is a rank's, and only the count beyond the ranks tells."""
    others = len(r.processes) - r.ranks_here
    if others <= 0:
        return []
    used = sum(mib for _, mib in r.processes)
    return [Advice("gpu", f"GPU {r.index}: {others} other compute process(es) on it "
                   f"({len(r.processes)} in all, {used} MiB): the figures share the GPU with "
                   "them", "run the check, and the gate, on a GPU nothing else uses")]


# -- reading (needs nvidia-ml-py and a driver) -----------------------------------------------
def read(index: int, uuid: str, own_pids: Sequence[int], ranks_here: int = 1
         ) -> GpuReading | str:
    """Device ``uuid`` (CUDA's, "GPU-..."; NVML's ``index`` where it has none) now; a
    sentence saying why where NVML cannot be read."""
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py is not installed (pip install 'pytest-distperf[gpu]')"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML did not start: {exc}"
    try:
        handle = _handle(pynvml, index, uuid)
        return with_processes(_reading(pynvml, handle, index, ranks_here), own_pids)
    except pynvml.NVMLError as exc:
        return f"NVML could not read GPU {index}: {exc}"
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


#: NVML's performance policies whose violation time is a GPU held below its clocks by heat
#: (1), its board's limit (3) or its reliability limit (5); not its power cap (0), where a GPU
#: under load runs steadily (an H100 and an H200 at 1560-1605 of 1980 MHz, benchmarks/doctor.md)
HELD_POLICIES = (1, 3, 5)


@dataclasses.dataclass(frozen=True, slots=True)
class Clocks:
    """Per GPU of the ranks, in their order: the ns it has been held below its clocks
    (:data:`HELD_POLICIES`) since its driver loaded, and its SM clock now (MHz); either None
    where NVML cannot tell."""

    held_ns: tuple[int, ...] | None
    sm_clock_mhz: tuple[int, ...] | None


def clocks(gpus: Sequence[tuple[int, str]]) -> Clocks:
    """:class:`Clocks` of the GPUs ``gpus`` (each its index and CUDA uuid, "GPU-..."), in one
    NVML session: the noise probe reads them at both ends of every measurement."""
    try:
        import pynvml
    except ImportError:
        return Clocks(None, None)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return Clocks(None, None)
    try:
        handles = [_handle(pynvml, index, uuid) for index, uuid in gpus]

        def held(h: Any) -> int:
            return sum(int(pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime)
                       for policy in HELD_POLICIES)

        def sm_clock(h: Any) -> int:
            return int(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))

        return Clocks(_each(pynvml, handles, held), _each(pynvml, handles, sm_clock))
    except (pynvml.NVMLError, AttributeError, TypeError):
        return Clocks(None, None)  # a GPU NVML does not know, or a pynvml that reads it not
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _each(nv: Any, handles: Sequence[Any], read_one: Callable[[Any], int]
          ) -> tuple[int, ...] | None:
    try:
        return tuple(read_one(h) for h in handles)
    except (nv.NVMLError, AttributeError, TypeError):
        return None  # not counted on this device or driver


def _handle(nv: Any, index: int, uuid: str) -> Any:
    if uuid:
        with contextlib.suppress(nv.NVMLError):
            return nv.nvmlDeviceGetHandleByUUID(uuid)
    return nv.nvmlDeviceGetHandleByIndex(index)


def _reading(nv: Any, h: Any, index: int, ranks_here: int) -> GpuReading:
    def get(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(h, *args)
        except (nv.NVMLError, AttributeError, TypeError):
            return None  # not supported on this device or driver

    reasons = get(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                  or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
    rows = get(nv.nvmlDeviceGetRemappedRows)
    power, limit = get(nv.nvmlDeviceGetPowerUsage), get(nv.nvmlDeviceGetEnforcedPowerLimit)
    default = get(nv.nvmlDeviceGetPowerManagementDefaultLimit)
    procs = get(nv.nvmlDeviceGetComputeRunningProcesses) or []
    name = get(nv.nvmlDeviceGetName)
    return GpuReading(
        index=index, name=name.decode() if isinstance(name, bytes) else str(name or ""),
        sm_clock_mhz=get(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        sm_clock_max_mhz=get(nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM),
        reasons=reasons,
        temperature_c=get(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        power_default_w=None if default is None else default / 1000.0,
        ecc_uncorrected_volatile=get(nv.nvmlDeviceGetTotalEccErrors,
                                     nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
        ecc_uncorrected_aggregate=get(nv.nvmlDeviceGetTotalEccErrors,
                                      nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      nv.NVML_AGGREGATE_ECC),
        remapped_rows_pending=None if rows is None else bool(rows[2]),
        pcie_gen=get(nv.nvmlDeviceGetCurrPcieLinkGeneration),
        pcie_gen_max=get(nv.nvmlDeviceGetMaxPcieLinkGeneration),
        pcie_width=get(nv.nvmlDeviceGetCurrPcieLinkWidth),
        pcie_width_max=get(nv.nvmlDeviceGetMaxPcieLinkWidth),
        processes=tuple((int(p.pid), int((p.usedGpuMemory or 0) // 2**20)) for p in procs),
        ranks_here=ranks_here)


def with_processes(reading: GpuReading, own_pids: Sequence[int]) -> GpuReading:
    """``reading`` with the ranks' own processes left out, where NVML's pids are theirs."""
    mine = set(own_pids)
    if not any(pid in mine for pid, _ in reading.processes):
        return reading
    others = tuple(p for p in reading.processes if p[0] not in mine)
    return dataclasses.replace(reading, processes=others, ranks_here=0)
