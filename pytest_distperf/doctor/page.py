"""Every sentence the runner check says, built in one place: the page's lines, the
verdict on a gate, and the warnings of the fidelity and the load.  No torch, no pytest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pytest_distperf.doctor.model import Advice, Check, Fidelity, Floor, GpuReading, Load
from pytest_distperf.doctor.nvml import reasons_text
from pytest_distperf.doctor.verdict_api import DETECTABLE_POWER, OTHER_LOAD_LIMIT

#: How far the plugin may read from a bare loop: the goals of benchmarks/fidelity.md
#: (0.95-1.05, met at 1.018 on an idle machine) and benchmarks/ddp_overhead.md (5%).
FIDELITY_BAND = 0.05
QUICK = ("quick configuration (DISTPERF_DOCTOR_QUICK): too few measurements and rounds to "
         "act on; run the full check before setting tolerances")
#: One other process using this much of a core is "a neighbour busy on one core": one that
#: spins on a core beside 2 ranks on 2 cores got 0.48-0.79 of it (benchmarks/doctor.md).
NEIGHBOUR_CORES = 0.4
LABELS = {"bench": "bench", "measure": "measure()", "step": "the step timer"}
FLOOR_LABELS = {"bench": "bench's bus bandwidth", "measure": "measure() times",
                "step": "the DDP step"}
#: Where widening is not the only way: what else to gate on (docs/baselines.md).
ELSE = {"step": "gate it on its counts, comm.* and flops_per_step",
        "bench": "compare it with the base commit's in the same job",
        "measure": "compare it with the base commit's in the same job"}


def pct(value: float | None, digits: int = 1) -> str:
    return "?" if value is None or not math.isfinite(value) else f"{value:.{digits}%}"


def one_rank(floor: Floor) -> bool:
    """A ``bench`` floor of a time, not a bandwidth: one rank, where no data moves."""
    return floor.kind == "bench" and not floor.unit.startswith("GB")


def floor_label(floor: Floor) -> str:
    if one_rank(floor):
        return "bench's time (one rank: no data moves)"
    return FLOOR_LABELS.get(floor.kind, floor.kind)


def instead(floor: Floor) -> str:
    """What else to do than widening the tolerance."""
    if one_rank(floor):
        return "gate bandwidth on 2 or more GPUs"
    return ELSE.get(floor.kind, "compare it with the base commit's in the same job")


def widened(change: float) -> float:
    """The tolerance that covers ``change``: the next whole 5% above it."""
    return math.ceil(change * 20 - 1e-9) / 20


def gate_sentence(floors: Sequence[Floor], tolerance: float) -> str:
    """"a 10% gate is trustworthy here for X, not for Y (widen Y's tolerance to Z or ...)"."""
    gate = f"a {tolerance:.0%} gate"
    good = [floor_label(f) for f in floors
            if f.detectable is not None and f.detectable <= tolerance]
    bad = [f for f in floors if f.detectable is not None and f.detectable > tolerance]
    unknown = [floor_label(f) for f in floors if f.detectable is None]
    if not good and not bad:
        return f"{gate}: no floor could be measured here"
    fixes = [f"{floor_label(f)} (widen its tolerance to {widened(f.detectable or 0):.0%}, or "
             f"{instead(f)})" for f in bad]
    text = (f"{gate} is trustworthy here for {_joined(good)}" if good else
            f"{gate} is trustworthy here for none of them")
    if fixes:
        text += f", not for {_joined(fixes, ' nor ')}"
    if unknown:
        text += f"; unknown for {_joined(unknown)}"
    return text


def gate_line(check: Check) -> str:
    """The gate sentence as the page says it: with what it was measured under."""
    text = gate_sentence(check.floors, check.tolerance)
    if check.quick:
        return f"{text} (the quick configuration's figures: not to act on)."
    if load_problem(check.load):
        return (f"{text}; measured while other processes were busy (the load line): rerun "
                "when the runner is quiet.")
    return f"{text}."


def _joined(items: Sequence[str], last: str = " and ") -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + last + items[-1]


def load_problem(load: Load | None) -> str:
    """What other processes did, in a sentence; "" when they took less than the noise
    probe's limit (``OTHER_LOAD_LIMIT``: a tenth of the machine, which a neighbour busy
    30% of the time reaches on 2 cores: benchmarks/verdict_quality.md)."""
    if load is None or load.other_load is None or load.other_load <= OTHER_LOAD_LIMIT:
        return ""
    cores = load.other_load * load.cpus
    top = load.busiest[0] if load.busiest else None
    if top is not None and top.cores >= NEIGHBOUR_CORES:
        n = max(1, round(top.cores))
        who = f"a neighbour busy on about {'one core' if n == 1 else f'{n} cores'}"
    else:
        who = f"other processes worth about {cores:.1f} cores"
    named = ", ".join(f"pid {b.pid} {b.name} {b.cores:.2f} cores" for b in load.busiest)
    wait = ("" if load.wait is None else
            f"; the ranks waited for a CPU {load.wait:.0%} of the time")
    return (f"other processes used {load.other_load:.0%} of the {load.cpus} CPUs: {who}"
            f"{' (busiest: ' + named + ')' if named else ''}{wait}")


def load_advice(load: Load | None) -> list[Advice]:
    problem = load_problem(load)
    if not problem:
        return []
    noisy = (" (the noise probe calls such measurements too noisy: a comparison under that "
             "load comes out inconclusive, not failed)" if load is not None and load.noisy
             else "")
    return [Advice("load", f"during the check {problem}: every figure on this page is this "
                   f"machine's under that load{noisy}", "rerun the check when the runner is "
                   "quiet, and keep other jobs off it while gates run")]


def fidelity_advice(fid: Fidelity, busy: bool = False) -> list[Advice]:
    """A warning where the plugin reads outside the band around a bare loop: put down to the
    machine where the gap is within the A/A's own (twice it when other processes were busy,
    ``busy``) and the band, else to the plugin."""
    if fid.note or not math.isfinite(fid.ratio) or abs(fid.ratio - 1) <= FIDELITY_BAND:
        return []
    side = "longer" if fid.ratio > 1 else "shorter"
    problem = (f"{LABELS.get(fid.name, fid.name)} reads {abs(fid.ratio - 1):.1%} {side} than "
               f"a bare loop ({fid.what}: ratio {fid.ratio:.3f}, the bare loop against "
               f"itself {fid.aa:.3f})")
    noise = abs(fid.aa - 1) if math.isfinite(fid.aa) else math.inf
    # one A/A is one draw of a spread that other processes widen: twice it when they were busy
    if abs(fid.ratio - 1) <= (2 if busy else 1) * noise + FIDELITY_BAND:
        action = ("two identical loops read nearly as far apart here"
                  f"{', with other processes busy' if busy else ''}: the machine's noise; "
                  "rerun the check on a quiet runner before blaming the plugin")
    else:
        action = ("far beyond what two identical loops read apart"
                  f"{' (other processes were busy: rerun when quiet)' if busy else ''}: "
                  "rerun to confirm, then report it with this page "
                  "(benchmarks/fidelity.md shows how to dig)")
    return [Advice("fidelity", problem, action)]


def all_advice(check: Check) -> list[Advice]:
    """Every warning of the page, the environment's and the GPUs' first.  The quick
    configuration's ratios are too short to warn on."""
    out = list(check.advice) + load_advice(check.load)
    if not check.quick:
        for fid in check.fidelity:  # busy: during that part, else the whole check
            out += fidelity_advice(fid, busy=bool(load_problem(fid.load or check.load)))
    return out


def sentences(check: Check) -> dict[str, Any]:
    """The page's verdicts as data, for the JSON section."""
    return {"gate": gate_line(check),
            "load_sentence": load_problem(check.load),
            "warnings": [{"topic": a.topic, "problem": a.problem, "action": a.action}
                         for a in all_advice(check)]}


def lines(check: Check) -> list[str]:
    """The page, line by line."""
    out = [f"{check.seconds:.0f} s, {QUICK if check.quick else 'full configuration'}"]
    if check.system is not None:
        out += _system_lines(check)
    out.append("load: " + (load_problem(check.load) or _quiet(check.load)))
    if check.fidelity:
        out.append(f"fidelity: the plugin's time / a bare loop's (same work, same ranks, timed "
                   f"the same way; goal {1 - FIDELITY_BAND:.2f}-{1 + FIDELITY_BAND:.2f}):")
        out += [f"  {LABELS.get(f.name, f.name):<15} {f.ratio:6.3f}   A/A {f.aa:6.3f}   "
                f"{f.what}, {f.iterations} iterations a side{_others(f.load)}"
                + (f" (not judged: {f.note})" if f.note else "") for f in check.fidelity]
    if check.floors:
        out.append(f"noise floors: the smallest change a comparison tells "
                   f"{DETECTABLE_POWER:.0%} of the time, against a save of these measurements:")
        out += [_floor_line(f) for f in check.floors]
        out.append(gate_line(check))
    out += [_gpu_line(g) for g in check.gpus]
    if check.nvml:
        out.append(f"NVML: {check.nvml}")
    out += [f"error: {e}" for e in check.errors]
    warnings = all_advice(check)
    out.append(f"{len(warnings)} warning(s)" + (":" if warnings else ""))
    out += [f"  ! {a.problem}: {a.action}" for a in warnings]
    return out


def _quiet(load: Load | None) -> str:
    if load is None or load.other_load is None:
        return "not readable here"
    return (f"other processes used {load.other_load:.0%} of the {load.cpus} CPUs (quiet "
            f"enough: under {OTHER_LOAD_LIMIT:.0%})")


def _system_lines(check: Check) -> list[str]:
    s = check.system
    assert s is not None
    comm = f"NCCL {s.nccl_version}" if s.nccl_version else "gloo (bundled with torch)"
    governor = s.governor or "not readable (a VM usually hides it)"
    variables = ", ".join(f"{k}={v}" for k, v in s.variables) or "none set"
    out = [f"host {s.hostname}: {s.world_size} rank(s), {s.backend} on {s.device_type}, "
           f"torch {s.torch_version}, {comm}",
           f"CPU {s.cpu_model or '?'}: {s.cores} core(s) for the ranks, "
           f"{s.smt or 'hardware threads not readable'}, {s.threads_per_rank} torch "
           f"thread(s) per rank, frequency governor {governor}"]
    out += [f"  rank {i}: {d}" for i, d in enumerate(s.devices) if s.device_type == "cuda"]
    out.append(f"variables (NCCL_*, TORCH_*, GLOO_*, CUDA, threads): {variables}")
    return out


def _floor_line(f: Floor) -> str:
    value = (f"{f.value * 1e3:.3f} ms" if f.unit == "s" else f"{f.value:.4g} {f.unit}")
    how = "with the host-speed control" if f.controlled else "no control"
    return (f"  {floor_label(f):<22} {pct(f.detectable):>7}   "
            f"({f.measurements} measurements of {f.metric}, {value}, spread {pct(f.spread)}, "
            f"{how}; {f.what}{_others(f.load)})")


def _others(load: Load | None) -> str:
    """The part's own load, where the probe read it."""
    if load is None or load.other_load is None:
        return ""
    return f"; other processes {load.other_load:.0%} of the CPUs"


def _gpu_line(g: GpuReading) -> str:
    clock = (f"SM clock {g.sm_clock_mhz} of {g.sm_clock_max_mhz} MHz under load"
             if g.sm_clock_mhz and g.sm_clock_max_mhz else "SM clock ?")
    power = (f"{g.power_w:.0f} of {g.power_limit_w:.0f} W" if g.power_w is not None
             and g.power_limit_w is not None else "power ?")
    link = (f"PCIe gen{g.pcie_gen} x{g.pcie_width} (max gen{g.pcie_gen_max} "
            f"x{g.pcie_width_max})" if g.pcie_gen is not None else "PCIe ?")
    return (f"GPU {g.index} {g.name}: {clock}, clock reasons: {reasons_text(g.reasons or 0)}, "
            f"{_known(g.temperature_c)} C, {power}, uncorrected ECC "
            f"{_known(g.ecc_uncorrected_volatile)}, {link}, compute processes "
            f"{len(g.processes)}")


def _known(value: object) -> str:
    return "?" if value is None else str(value)
