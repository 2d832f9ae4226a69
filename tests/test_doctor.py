"""The runner check (``pytest --pyargs pytest_distperf.doctor``): its pure parts on hand-made
figures and on NVML readings recorded on an H200, and the check itself on real gloo ranks,
in its quick configuration, with a neighbour busy on one core."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_distperf.common.procs import Proc
from pytest_distperf.doctor import load, nvml, page, system
from pytest_distperf.doctor.fidelity import alternate
from pytest_distperf.doctor.floors import floor_of
from pytest_distperf.doctor.model import (
    Busy,
    Check,
    Fidelity,
    Floor,
    GpuReading,
    Load,
    System,
    check_to_dict,
)
from pytest_distperf.doctor.plan import plan_for
from pytest_distperf.doctor.verdict_api import detectable
from pytest_distperf.records import Metric, from_dict
from pytest_distperf.report import jsonreport

DATA = Path(__file__).parent / "data"


def healthy(**changes: Any) -> GpuReading:
    """A GPU under load with nothing wrong, changed by ``changes``."""
    return dataclasses.replace(GpuReading(
        index=0, name="NVIDIA H100 80GB HBM3", sm_clock_mhz=1980, sm_clock_max_mhz=1980,
        reasons=0, temperature_c=50, power_w=400.0, power_limit_w=700.0,
        power_default_w=700.0, ecc_uncorrected_volatile=0, ecc_uncorrected_aggregate=0,
        remapped_rows_pending=False, pcie_gen=5, pcie_gen_max=5, pcie_width=16,
        pcie_width_max=16, processes=(), ranks_here=0), **changes)


# -- NVML ----------------------------------------------------------------------------------
def test_recorded_readings_warn_of_nothing() -> None:
    """Two readings of a healthy H200 and one of a healthy H100 under the check's load: SM
    clocks at 79-81% of their maximum, with the software power cap as the reason, at the
    default power limit."""
    recorded = json.loads((DATA / "nvml_recorded.json").read_text())["readings"]
    readings = [from_dict(GpuReading, r) for r in recorded]
    assert [r.name for r in readings] == ["NVIDIA H200"] * 2 + ["NVIDIA H100 80GB HBM3"]
    assert [r.reasons for r in readings] == [0x4] * 3
    assert all(r.sm_clock_mhz and r.sm_clock_mhz < 0.9 * 1980 for r in readings)
    assert nvml.gpu_advice(readings) == []


@pytest.mark.parametrize(("changes", "problem", "action"), [
    ({"reasons": 0x40, "sm_clock_mhz": 1400}, "hardware thermal slowdown (SM clock 1400 of",
     "cooling"),
    ({"reasons": 0x20}, "software thermal slowdown", "cooling"),
    ({"reasons": 0x8}, "hardware slowdown", "power supply"),
    ({"reasons": 0x80}, "hardware power brake", "power supply"),
    ({"reasons": 0x2}, "applications clocks setting", "nvidia-smi -rac"),
    ({"reasons": 0x4, "power_limit_w": 400.0}, "power limit, 400 W, below the default 700 W",
     "nvidia-smi -pl 700"),
    ({"sm_clock_mhz": 1200}, "SM clock 1200 of 1980 MHz under load, no reason given",
     "nvidia-smi -rgc"),
    ({"sm_clock_mhz": 1200, "reasons": 0x1}, "NVML read it idle", "locked clocks"),
    ({"ecc_uncorrected_volatile": 3}, "3 uncorrected ECC error(s) since the driver loaded",
     "drain the node"),
    ({"ecc_uncorrected_aggregate": 2}, "2 uncorrected ECC error(s) in its lifetime",
     "ROW_REMAPPER"),
    ({"remapped_rows_pending": True}, "a memory row remap is pending", "nvidia-smi -r"),
    ({"processes": ((4242, 512), (4343, 30000)), "ranks_here": 1},
     "1 other compute process(es) on it (2 in all, 30512 MiB)", "nothing else uses"),
    ({"processes": ((4242, 512),)}, "1 other compute process(es)", "nothing else uses"),
    ({"pcie_width": 8}, "PCIe link x8 of x16", "reseat"),
])
def test_each_problem_is_one_warning_with_what_to_do(changes: dict[str, Any], problem: str,
                                                     action: str) -> None:
    (advice,) = nvml.gpu_advice([healthy(**changes)])
    assert advice.topic == "gpu"
    assert problem in advice.problem
    assert action in advice.action


def test_a_healthy_gpu_and_a_power_cap_at_the_default_limit_warn_of_nothing() -> None:
    assert nvml.gpu_advice([healthy(), healthy(reasons=0x4 | 0x10, sm_clock_mhz=1500)]) == []
    assert nvml.reasons_text(0x4 | 0x40) == "software power cap, hardware thermal slowdown"
    assert nvml.reasons_text(0) == "none"


def test_the_ranks_own_processes_are_left_out_where_nvml_sees_their_pids() -> None:
    mine = nvml.with_processes(healthy(processes=((10, 900), (11, 100)), ranks_here=1), [10])
    assert (mine.processes, mine.ranks_here) == (((11, 100),), 0)
    # another pid namespace (a container): nothing matches, the count decides
    theirs = nvml.with_processes(healthy(processes=((77, 900),), ranks_here=1), [10])
    assert (theirs.processes, theirs.ranks_here) == (((77, 900),), 1)
    assert nvml.gpu_advice([theirs]) == []


class _NVMLError(Exception):
    pass


def _fake_nvml(**broken: bool) -> types.SimpleNamespace:
    """NVML's Python API as nvidia-ml-py spells it, answering for one H100; ``broken``
    names functions that raise NVMLError (not supported here)."""
    answers: dict[str, Any] = {
        "nvmlDeviceGetName": "NVIDIA H100 80GB HBM3",
        "nvmlDeviceGetClockInfo": 1755, "nvmlDeviceGetMaxClockInfo": 1980,
        "nvmlDeviceGetCurrentClocksEventReasons": 0x4,
        "nvmlDeviceGetTemperature": 61, "nvmlDeviceGetPowerUsage": 650_000,
        "nvmlDeviceGetEnforcedPowerLimit": 700_000,
        "nvmlDeviceGetPowerManagementDefaultLimit": 700_000,
        "nvmlDeviceGetTotalEccErrors": 0, "nvmlDeviceGetRemappedRows": (0, 0, 0, 0),
        "nvmlDeviceGetCurrPcieLinkGeneration": 5, "nvmlDeviceGetMaxPcieLinkGeneration": 5,
        "nvmlDeviceGetCurrPcieLinkWidth": 16, "nvmlDeviceGetMaxPcieLinkWidth": 16,
        "nvmlDeviceGetComputeRunningProcesses": [
            types.SimpleNamespace(pid=10, usedGpuMemory=3 * 2**30),
            types.SimpleNamespace(pid=99, usedGpuMemory=None)],
    }

    def answer(name: str, value: Any) -> Any:
        def call(*args: Any) -> Any:
            if broken.get(name):
                raise _NVMLError(f"{name}: Not Supported")
            return value
        return call

    module = types.SimpleNamespace(**{k: answer(k, v) for k, v in answers.items()})
    module.NVMLError = _NVMLError
    module.nvmlDeviceGetCurrentClocksThrottleReasons = answer("old", 0)
    for name in ("NVML_CLOCK_SM", "NVML_TEMPERATURE_GPU", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED",
                 "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC"):
        setattr(module, name, 0)
    return module


def test_a_reading_maps_what_nvml_answers_and_leaves_out_what_it_cannot() -> None:
    reading = nvml._reading(_fake_nvml(nvmlDeviceGetRemappedRows=True), "handle", 0, 1)
    assert (reading.sm_clock_mhz, reading.sm_clock_max_mhz, reading.reasons) == (1755, 1980, 4)
    assert (reading.power_w, reading.power_limit_w, reading.power_default_w) == (650, 700, 700)
    assert reading.remapped_rows_pending is None  # not supported: unknown, never guessed
    assert reading.processes == ((10, 3072), (99, 0))
    (advice,) = nvml.gpu_advice([nvml.with_processes(reading, [10])])  # the power cap is not
    assert "1 other compute process(es) on it (1 in all, 0 MiB)" in advice.problem


def test_without_nvidia_ml_py_the_page_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml.read(0, "", []) == ("nvidia-ml-py is not installed "
                                    "(pip install 'pytest-distperf[gpu]')")


def test_without_a_driver_nvml_says_why() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    found = nvml.read(0, "", [])
    assert isinstance(found, str) and found.startswith("NVML did not start: ")


# -- the environment ------------------------------------------------------------------------
def test_the_variables_listed_and_the_settings_that_spoil_a_figure() -> None:
    found = system.variables({"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo", "PATH": "/bin",
                              "CUDA_LAUNCH_BLOCKING": "1", "TORCH_DISTRIBUTED_DEBUG": "OFF",
                              "NCCL_ALGO": "Ring", "OMP_NUM_THREADS": "1", "HOME": "/root"})
    assert [k for k, _ in found] == ["CUDA_LAUNCH_BLOCKING", "NCCL_ALGO", "NCCL_DEBUG",
                                     "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS",
                                     "TORCH_DISTRIBUTED_DEBUG"]
    problems = [a.problem for a in system.variable_advice(found)]
    assert [p.split(":")[0] for p in problems] == [
        "CUDA_LAUNCH_BLOCKING=1", "NCCL_DEBUG=INFO", "NCCL_ALGO=Ring"]
    assert system.variable_advice([("NCCL_DEBUG", "WARN"), ("NCCL_P2P_DISABLE", "0")]) == []
    (shared,) = system.variable_advice([("NCCL_MULTI_RANK_GPU_ENABLE", "1")])
    assert shared.problem.startswith("NCCL_MULTI_RANK_GPU_ENABLE=1: ranks may share a GPU")
    assert shared.action == "unset it on a runner with a GPU per rank"


def _sys_tree(root: Path, governor: str | None, siblings: str) -> None:
    for cpu in (0, 1):
        (root / f"cpu{cpu}/topology").mkdir(parents=True)
        (root / f"cpu{cpu}/topology/thread_siblings_list").write_text(siblings + "\n")
        if governor is not None:
            (root / f"cpu{cpu}/cpufreq").mkdir()
            (root / f"cpu{cpu}/cpufreq/scaling_governor").write_text(governor + "\n")


def test_governor_and_hardware_threads_from_sys(tmp_path: Path) -> None:
    _sys_tree(tmp_path, "powersave", "0-1")
    assert system.read_governor([0, 1], str(tmp_path)) == "powersave"
    assert system.read_smt([0, 1], str(tmp_path)) == "2 thread(s) per core"
    assert system.parse_cpu_list("0-3,8, 10") == [0, 1, 2, 3, 8, 10]
    bare = tmp_path / "vm"
    _sys_tree(bare, None, "0")
    assert system.read_governor([0, 1], str(bare)) == ""
    assert system.read_smt([0], str(bare)) == "1 thread(s) per core"


def _system(**changes: Any) -> System:
    return dataclasses.replace(System(
        hostname="ci", backend="gloo", device_type="cpu", device_model="EPYC", world_size=2,
        torch_version="2.13.0", nccl_version="", cpu_model="EPYC", cores=2, threads_per_rank=1,
        smt="1 thread(s) per core", governor=""), **changes)


def test_cpu_advice_a_moving_clock_and_ranks_that_outnumber_the_cores() -> None:
    assert system.cpu_advice(_system()) == []
    assert system.cpu_advice(_system(governor="performance")) == []
    governor, crowded = system.cpu_advice(_system(governor="powersave", world_size=4))
    assert "governor powersave" in governor.problem and "performance" in governor.action
    assert crowded.problem.startswith("4 ranks x 1 thread(s) on 2 core(s)")


# -- the page --------------------------------------------------------------------------------
def floor(kind: str, detectable: float | None, unit: str = "s") -> Floor:
    return Floor(kind=kind, metric="m", what="w", unit=unit, value=0.02, measurements=12,
                 spread=None if detectable is None else detectable / 2,
                 detectable=detectable, controlled=True)


def test_the_gate_sentence_names_what_a_10_percent_gate_can_trust() -> None:
    floors = [floor("measure", 0.011), floor("bench", 0.129, "GB/s"), floor("step", 0.079)]
    assert page.gate_sentence(floors, 0.10) == (
        "a 10% gate is trustworthy here for measure() times and the DDP step, not for "
        "bench's bus bandwidth (widen its tolerance to 15%, or compare it with the base "
        "commit's in the same job)")
    assert page.gate_sentence([floor("step", 0.31), floor("bench", None, "GB/s")], 0.10) == (
        "a 10% gate is trustworthy here for none of them, not for the DDP step (widen its "
        "tolerance to 35%, or gate it on its counts, comm.* and flops_per_step); unknown for "
        "bench's bus bandwidth")
    assert "gate bandwidth on 2 or more GPUs" in page.gate_sentence([floor("bench", 0.6, "us")],
                                                                    0.10)
    assert page.gate_sentence([floor("measure", 0.12)], 0.15).startswith(
        "a 15% gate is trustworthy here for measure() times")
    assert [page.widened(v) for v in (0.10, 0.101, 0.129, 0.15)] == [0.10, 0.15, 0.15, 0.15]


def quiet(other: float = 0.01) -> Load:
    return Load(seconds=60.0, cpus=2, steal=0.0, wait=0.3, other_load=other)


def test_a_neighbour_is_named_and_a_quiet_machine_is_not_blamed() -> None:
    assert page.load_problem(quiet()) == ""
    assert page.load_advice(quiet(0.10)) == []
    busy = Load(seconds=60.0, cpus=2, steal=0.0, wait=0.41, other_load=0.46,
                busiest=(Busy(4242, "python3", 0.91), Busy(7, "sshd", 0.06)))
    assert page.load_problem(busy) == (
        "other processes used 46% of the 2 CPUs: a neighbour busy on about one core (busiest: "
        "pid 4242 python3 0.91 cores, pid 7 sshd 0.06 cores); the ranks waited for a CPU 41% "
        "of the time")
    spread = dataclasses.replace(busy, busiest=(Busy(5, "make", 0.2),))
    assert "other processes worth about 0.9 cores" in page.load_problem(spread)
    (advice,) = page.load_advice(busy)
    assert advice.topic == "load" and "rerun the check when the runner is quiet" in advice.action


def fid(ratio: float, aa: float, note: str = "") -> Fidelity:
    return Fidelity(name="bench", what="all_reduce 16MiB, 2 rank(s)", plugin_s=ratio,
                    bare_s=1.0, again_s=aa, iterations=60, note=note)


def test_fidelity_warns_outside_the_band_and_says_whose_fault_it_may_be() -> None:
    assert page.fidelity_advice(fid(1.04, 0.99)) == []
    assert page.fidelity_advice(fid(0.93, 1.0, note="one rank")) == []
    (plugin,) = page.fidelity_advice(fid(1.12, 1.01))
    assert plugin.problem.startswith("bench reads 12.0% longer than a bare loop")
    assert plugin.action.startswith("far beyond what two identical loops read apart: rerun")
    (machine,) = page.fidelity_advice(fid(0.92, 0.96))
    assert "the machine's noise" in machine.action
    (busy,) = page.fidelity_advice(fid(0.63, 1.05), busy=True)
    assert "far beyond" in busy.action and "other processes were busy" in busy.action
    (loaded,) = page.fidelity_advice(fid(0.777, 0.875), busy=True)  # run E, benchmarks/doctor.md
    assert "with other processes busy: the machine's noise" in loaded.action
    assert "far beyond" in page.fidelity_advice(fid(0.777, 0.875))[0].action


def whole_check(quick: bool = False, other: float = 0.01) -> Check:
    check = Check(tolerance=0.10, quick=quick, system=_system(variables=(("A", "1"),)),
                  fidelity=[fid(1.01, 0.99), fid(1.2, 1.0)],
                  floors=[floor("measure", 0.011), floor("bench", 0.129, "GB/s")],
                  load=quiet(other), seconds=95.0)
    check.advice += system.cpu_advice(_system(world_size=4))
    return check


def test_the_page_line_by_line() -> None:
    text = page.lines(whole_check())
    assert text[0] == "95 s, full configuration"
    assert text[1].startswith("host ci: 2 rank(s), gloo on cpu, torch 2.13.0, gloo")
    assert any(line.startswith("load: other processes used 1% of the 2 CPUs (quiet enough")
               for line in text)
    assert any(line.startswith("  bench            1.010   A/A  0.990") for line in text)
    assert "a 10% gate is trustworthy here for measure() times, not for bench's bus " \
           "bandwidth (widen its tolerance to 15%, or compare it with the base commit's in " \
           "the same job)." in text
    assert text[-3] == "2 warning(s):"
    assert text[-2].startswith("  ! 4 ranks x 1 thread(s) on 2 core(s)")
    assert text[-1].startswith("  ! bench reads 20.0% longer than a bare loop")
    quick = page.lines(whole_check(quick=True))
    assert quick[0].startswith("95 s, quick configuration (DISTPERF_DOCTOR_QUICK)")
    assert quick[-2] == "1 warning(s):"  # the quick run's ratios are not warned on
    assert any(line.endswith("(the quick configuration's figures: not to act on).")
               for line in quick)
    one_rank = page.lines(dataclasses.replace(whole_check(), floors=[floor("bench", 0.2, "us")]))
    assert any(line.startswith("  bench's time (one rank: no data moves)   20.0%")
               for line in one_rank)
    busy = page.lines(whole_check(other=0.4))
    assert any("measured while other processes were busy" in line for line in busy)


def test_the_json_section_is_the_page_and_fits_the_reports_schema() -> None:
    check = whole_check()
    check.fidelity.append(Fidelity("step", "x", 1.0, 0.0, 1.0, 3))  # a ratio of no bare time
    section = check_to_dict(check, page.sentences(check))
    assert section["fidelity"][0]["ratio"] == pytest.approx(1.01)
    assert math.isnan(section["fidelity"][2]["ratio"])
    assert section["gate"].startswith("a 10% gate is trustworthy here for measure() times")
    assert [w["topic"] for w in section["warnings"]] == ["environment", "fidelity"]
    data = json.loads(jsonreport.dumps(jsonreport.document(
        [], header="h", sections={"runner_check": section})))
    jsonschema.validate(data, jsonreport.load_schema(), cls=jsonschema.Draft202012Validator)
    assert data["sections"]["runner_check"]["fidelity"][2]["ratio"] is None
    assert "note" not in data


# -- the figures -----------------------------------------------------------------------------
def test_the_detectable_change_of_measurements_without_a_control() -> None:
    """Each measurement read by its 25% quantile; the spread of their logs as the median
    absolute deviation; z(0.99) + z(0.9) of it over sqrt(1/6 + 1/B)."""
    levels = [1.0, 1.02, 0.98, 1.01, 0.99, 1.0]
    parts = [((v, v, v, v), ()) for v in levels]
    spread, change = detectable(parts, unit="s", higher_is_better=False) or (0.0, 0.0)
    logs = [math.log(v) for v in levels]
    centre = sorted(logs)[2] / 2 + sorted(logs)[3] / 2
    mad = sorted(abs(x - centre) for x in logs)
    expect_spread = (mad[2] + mad[3]) / 2 / 0.6744897501960817
    assert spread == pytest.approx(expect_spread)
    assert change == pytest.approx(math.expm1((2.326347874 + 1.281551566) * expect_spread
                                              * math.sqrt(1 / 6 + 1 / 6)), rel=1e-6)
    rate = detectable([((1 / v,) * 4, ()) for v in levels], unit="GB/s", higher_is_better=True)
    assert rate is not None and 0 < rate[1] < change  # a drop of a rate: smaller in its terms
    assert detectable(parts[:2], unit="s", higher_is_better=False) is None


def test_the_detectable_change_with_the_control_is_the_saves() -> None:
    parts = [(tuple(0.020 * (1 + 0.01 * k) * (1 + 0.003 * i) for i in range(20)),
              tuple(0.0025 * (1 + 0.003 * i) for i in range(20))) for k in (0, 2, -1, 1, -2, 0)]
    found = detectable(parts, unit="s", higher_is_better=False)
    assert found is not None and 0 < found[1] < 0.10
    wider = detectable([(tuple(v * (1 + 0.04 * k) for v in s), c)
                        for k, (s, c) in zip((0, 2, -1, 1, -2, 0), parts, strict=True)],
                       unit="s", higher_is_better=False)
    assert wider is not None and wider[1] > found[1]


def test_a_floor_takes_the_planned_measurements_a_pause_apart() -> None:
    plan = plan_for("cpu", {})
    assert (plan.measurements, plan.pause_s, plan.quick) == (12, 0.5, False)
    slept: list[float] = []
    values = iter([0.020, 0.021, 0.019] * 4)

    def take() -> Metric:
        v = next(values)
        return Metric("step_time_s", v, "s", False, (v,) * 10, control=(0.0025,) * 10)

    found = floor_of("step", "what", take, plan, sleep=slept.append)
    assert slept == [0.5] * 11
    assert (found.measurements, found.metric, found.value, found.controlled) == (
        12, "step_time_s", 0.020, True)
    quick = plan_for("cuda", {"DISTPERF_DOCTOR_QUICK": "1"})
    assert (quick.quick, quick.measurements, quick.gpt.layers, quick.reps) == (True, 3, 1, 2)
    assert plan_for("cuda", {"DISTPERF_DOCTOR_QUICK": "0"}).gpt.bf16


def test_rounds_turn_the_order_of_the_sides() -> None:
    order: list[str] = []

    def side(name: str) -> Any:
        return lambda: order.append(name) or [1.0]

    times = alternate({"a": side("a"), "b": side("b"), "c": side("c")}, 3)
    assert "".join(order) == "abcbcacab"
    assert times == {"a": [1.0] * 3, "b": [1.0] * 3, "c": [1.0] * 3}


# -- other processes ------------------------------------------------------------------------
def test_the_busiest_other_processes_from_two_tables() -> None:
    before = {1: Proc(0, 1, 100, "5"), 2: Proc(0, 2, 0, "6"), 3: Proc(1, 3, 50, "7"),
              4: Proc(1, 4, 10, "8")}
    after = {1: Proc(0, 1, 300, "5"), 2: Proc(0, 2, 400, "6"), 3: Proc(1, 3, 52, "7"),
             4: Proc(1, 4, 30, "99"), 5: Proc(1, 5, 60, "100")}
    found = load.busiest(before, after, ours={2}, seconds=2.0, hz=100)
    # 2 is ours; 3 used 0.01 cores (not named); 4 is a new process under an old pid
    assert [(b.pid, b.cores) for b in found] == [(1, 1.0), (5, 0.3), (4, 0.15)]


@contextlib.contextmanager
def neighbour() -> Iterator[int]:
    """A process spinning on one core that is not this one's descendant (the check counts
    its own descendants as its own work): started through a parent that exits at once (the
    spinner's output goes nowhere, so that the parent's pipe closes), and killed by its pid
    at the end."""
    starter = subprocess.run(
        [sys.executable, "-c", "import subprocess as s, sys; print(s.Popen([sys.executable, "
         "'-c', 'while True: pass'], start_new_session=True, stdout=s.DEVNULL, "
         "stderr=s.DEVNULL).pid)"],
        capture_output=True, text=True, check=True)
    pid = int(starter.stdout)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_busy_neighbour_is_seen_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # every busy process named: the suite's other xdist worker may keep three busier
    monkeypatch.setattr(load, "NAMED_MAX", 100)
    with neighbour() as pid:
        watch = load.Watch([])
        time.sleep(1.5)
        seen = watch.load()
    assert pid in [b.pid for b in seen.busiest]
    assert seen.other_load is not None and seen.other_load > 0.10


# -- the check on real ranks ---------------------------------------------------------------
def test_the_quick_check_on_gloo_ranks_reports_a_busy_neighbour(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole check through ``--pyargs`` on 2 gloo ranks, quick, with another process
    spinning on one core: every part runs, the page and its JSON section say what they
    measured, and the neighbour is named.  No figure is asserted."""
    monkeypatch.setenv("DISTPERF_DOCTOR_QUICK", "1")
    monkeypatch.setattr(load, "NAMED_MAX", 100)  # as above: the neighbour among them all
    json_path = pytester.path / "runner.json"
    with neighbour() as pid:
        result = pytester.runpytest(
            "--pyargs", "pytest_distperf.doctor", "--distperf", "--gpus", "2",
            "-p", "no:cacheprovider", f"--distperf-json={json_path}")
    result.assert_outcomes(passed=7, skipped=1)
    result.stdout.fnmatch_lines([
        "*= distperf runner check =*",
        "* s, quick configuration (DISTPERF_DOCTOR_QUICK)*",
        "host *: 2 rank(s), gloo on cpu, torch *",
        "CPU *: * core(s) for the ranks, *",
        "variables (NCCL_*, TORCH_*, GLOO_*, CUDA, threads): *",
        f"load: other processes used *pid {pid} *",
        "fidelity: the plugin's time / a bare loop's *",
        "  bench    * A/A * all_reduce 1MiB, 2 rank(s), 8 iterations a side*",
        "  measure()* A/A * 20 matrix products per call, 2 rank(s), 6 iterations a side*",
        "  the step timer * A/A * DDP step of a 1-layer GPT (width 128), 2 rank(s), 3 *",
        "noise floors: *",
        "  measure() times * (3 measurements of matmul.time_s, *",
        "  bench's bus bandwidth * (3 measurements of all_reduce.1MiB.busbw_gbps, *",
        "  the DDP step * (3 measurements of step_time_s, *",
        "a 10% gate is trustworthy here for *(the quick configuration's figures: not to act on).",
        "* warning(s):",
        f"  ! during the check other processes used *pid {pid} *: rerun the check *",
    ])
    data = json.loads(json_path.read_text())
    jsonschema.validate(data, jsonreport.load_schema(), cls=jsonschema.Draft202012Validator)
    assert data["tests"] == []  # the check's measurements are judged by no baseline
    section = data["sections"]["runner_check"]
    assert [f["name"] for f in section["fidelity"]] == ["bench", "measure", "step"]
    assert [(f["kind"], f["measurements"]) for f in section["floors"]] == [
        ("measure", 3), ("bench", 3), ("step", 3)]
    assert str(pid) in section["load_sentence"]
    assert section["system"]["world_size"] == 2 and section["quick"] is True
    assert section["errors"] == [] and section["gpus"] == []


def _violations(per_gpu: dict[str, dict[int, int]], broken: bool = False,
                sm_mhz: dict[str, int] | None = None) -> Any:
    """An NVML module whose violation counters are ``per_gpu`` (uuid -> policy -> ns) and
    whose SM clocks are ``sm_mhz`` (uuid -> MHz; None: no clock to read)."""
    def status(handle: str, policy: int) -> Any:
        if broken:
            raise _NVMLError("Not Supported")
        return types.SimpleNamespace(referenceTime=0, violationTime=per_gpu[handle][policy])

    def clock(handle: str, which: int) -> int:
        if sm_mhz is None or which != 1:
            raise _NVMLError("Not Supported")
        return sm_mhz[handle]

    return types.SimpleNamespace(
        NVMLError=_NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: uuid, NVML_CLOCK_SM=1,
        nvmlDeviceGetViolationStatus=status, nvmlDeviceGetClockInfo=clock)


def test_held_counts_heat_and_the_boards_limits_not_the_power_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Per GPU, the ns NVML says it was held below its clocks by heat (1), its board (3) or
    its reliability limit (5); a power cap (0), a GPU's steady state under load, is not."""
    counters = {"GPU-a": {0: 9_000, 1: 100, 3: 20, 5: 3}, "GPU-b": {0: 0, 1: 0, 3: 0, 5: 0}}
    monkeypatch.setitem(sys.modules, "pynvml", _violations(counters))
    assert nvml.clocks([(0, "GPU-a"), (1, "GPU-b")]).held_ns == (123, 0)
    monkeypatch.setitem(sys.modules, "pynvml", _violations(counters, broken=True))
    assert nvml.clocks([(0, "GPU-a")]).held_ns is None  # not counted on this device: unknown
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert nvml.clocks([(0, "GPU-a")]) == nvml.Clocks(None, None)


def test_the_sm_clocks_are_read_with_the_counters_each_unknown_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each GPU's SM clock (NVML_CLOCK_SM, MHz) comes in the same NVML session as its
    counters; a device that reads one and not the other keeps the one."""
    counters = {"GPU-a": {0: 0, 1: 0, 3: 0, 5: 0}, "GPU-b": {0: 0, 1: 7, 3: 0, 5: 0}}
    clocks = {"GPU-a": 1980, "GPU-b": 1560}
    monkeypatch.setitem(sys.modules, "pynvml", _violations(counters, sm_mhz=clocks))
    assert nvml.clocks([(0, "GPU-a"), (1, "GPU-b")]) == nvml.Clocks((0, 7), (1980, 1560))
    monkeypatch.setitem(sys.modules, "pynvml", _violations(counters, broken=True, sm_mhz=clocks))
    assert nvml.clocks([(1, "GPU-b")]) == nvml.Clocks(None, (1560,))
    monkeypatch.setitem(sys.modules, "pynvml", _violations(counters))
    assert nvml.clocks([(1, "GPU-b")]) == nvml.Clocks((7,), None)
