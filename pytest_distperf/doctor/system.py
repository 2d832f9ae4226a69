"""The environment and topology the check reports, and what in them can spoil a figure.
No torch, no pytest.

Read from ``/sys`` (the CPU frequency governor, hardware threads per core) and from the
ranks' environment variables (NCCL_*, TORCH_*, GLOO_* and a few CUDA and thread ones), as
the ranks see them; each setting known to change what a timing measures is an
:class:`~pytest_distperf.doctor.model.Advice` that says why and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_distperf.doctor.model import Advice, System

PREFIXES = ("NCCL_", "TORCH_", "GLOO_")
NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS",
         "OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTORCH_CUDA_ALLOC_CONF")
_ON = ("1", "true", "yes", "on")

#: (variable, values that matter (empty: any value), what it does to a figure, what to do).
#: From NCCL's and PyTorch's documentation of each variable.
SETTINGS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("CUDA_LAUNCH_BLOCKING", _ON, "every kernel launch waits for the GPU, so each timing "
     "holds the host's wait too", "unset it for performance runs"),
    ("NCCL_DEBUG", ("info", "trace"), "NCCL logs every communicator (TRACE: every call), "
     "which slows the collectives it logs", "unset it, or set WARN"),
    ("NCCL_P2P_DISABLE", _ON, "GPUs do not talk directly (no NVLink or PCIe peer access): "
     "bandwidth goes through host memory", "unset it unless the machine needs it"),
    ("NCCL_SHM_DISABLE", _ON, "no shared-memory transport inside a node",
     "unset it unless the machine needs it"),
    ("NCCL_IB_DISABLE", _ON, "no InfiniBand: traffic between nodes goes over sockets",
     "unset it on a machine with InfiniBand"),
    ("NCCL_NVLS_ENABLE", ("0",), "NVLink SHARP is off: all-reduces inside an NVSwitch node "
     "are slower", "unset it unless the machine needs it"),
    ("NCCL_ALGO", (), "NCCL's algorithm is forced, not chosen per size",
     "unset it, unless the gate is meant for that algorithm"),
    ("NCCL_PROTO", (), "NCCL's protocol is forced, not chosen per size",
     "unset it, unless the gate is meant for that protocol"),
    ("TORCH_DISTRIBUTED_DEBUG", ("detail",), "every collective is checked against the other "
     "ranks' first (extra collectives per call)", "unset it, or set OFF"),
    ("TORCH_NCCL_BLOCKING_WAIT", _ON, "the host blocks on every collective it waits for",
     "unset it for performance runs"),
    ("NCCL_MULTI_RANK_GPU_ENABLE", _ON, "ranks may share a GPU (experimental, NCCL 2.30 or "
     "later) wherever the GPUs are fewer than the ranks: shared, a GPU's times are not a "
     "rank's own", "unset it on a runner with a GPU per rank"),
)


def variables(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The variables the page lists, sorted by name."""
    return tuple(sorted((k, v) for k, v in environ.items()
                        if k.startswith(PREFIXES) or k in NAMES))


def variable_advice(found: Sequence[tuple[str, str]]) -> list[Advice]:
    """A warning for each setting of :data:`SETTINGS` that is in force."""
    values = dict(found)
    out = []
    for name, bad, what, action in SETTINGS:
        value = values.get(name)
        if value is None or value.strip() == "":
            continue
        if bad and value.strip().lower() not in bad:
            continue
        out.append(Advice("environment", f"{name}={value}: {what}", action))
    return out


def read_governor(cores: Sequence[int], root: str = "/sys/devices/system/cpu") -> str:
    """The frequency governors of ``cores`` (one word, or several joined by "/"); "" where
    ``/sys`` does not show them (a VM usually does not)."""
    seen = []
    for core in cores:
        try:
            with open(f"{root}/cpu{core}/cpufreq/scaling_governor") as f:
                seen.append(f.read().strip())
        except OSError:
            continue
    return "/".join(dict.fromkeys(seen))


def read_smt(cores: Sequence[int], root: str = "/sys/devices/system/cpu") -> str:
    """"N threads per core" from the first core's siblings list; "" where unreadable."""
    for core in cores[:1]:
        try:
            with open(f"{root}/cpu{core}/topology/thread_siblings_list") as f:
                text = f.read().strip()
        except OSError:
            return ""
        return f"{len(parse_cpu_list(text))} thread(s) per core"
    return ""


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> [0, 1, 2, 3, 8]."""
    out: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        out += range(int(low), int(high or low) + 1)
    return out


def build_system(info: Sequence[Mapping[str, Any]], *, backend: str, device_type: str,
                 found: Sequence[tuple[str, str]], devices: Sequence[str],
                 cores: Sequence[int], cpu_model: str,
                 root: str = "/sys/devices/system/cpu") -> System:
    """The :class:`System` of the ranks' info (``rank_info()``: hostname, torch, NCCL,
    threads, device model), rank 0's ``cores`` (its affinity) and what ``/sys`` shows of
    them."""
    first = info[0] if info else {}
    return System(
        hostname=str(first.get("hostname", "")), backend=backend, device_type=device_type,
        device_model=str(first.get("device_model", "")), world_size=len(info),
        torch_version=str(first.get("torch_version", "")),
        nccl_version=str(first.get("nccl_version", "")),
        cpu_model=cpu_model, cores=int(first.get("cores", len(cores))),
        threads_per_rank=int(first.get("threads", 0)),
        smt=read_smt(cores, root), governor=read_governor(cores, root),
        variables=tuple(found), devices=tuple(devices))


def cpu_advice(system: System) -> list[Advice]:
    """Warnings about the CPUs: a governor that moves the clock, ranks that outnumber the
    cores."""
    out = []
    if system.governor and system.governor != "performance":
        out.append(Advice(
            "environment", f"CPU frequency governor {system.governor}: the clock follows the "
            "load, so short steps time the governor too",
            "set the performance governor on the runner (cpupower frequency-set -g "
            "performance, or pyperf system tune)"))
    wanted = system.world_size * max(1, system.threads_per_rank)
    if system.device_type == "cpu" and system.cores and wanted > system.cores:
        # benchmarks/fidelity.md: 4 ranks on 2 cores read bench 6-12% under a bare loop
        out.append(Advice(
            "environment", f"{system.world_size} ranks x {max(1, system.threads_per_rank)} "
            f"thread(s) on {system.cores} core(s): the ranks take turns on the cores, and "
            "their timings carry the turns (bench read 6-12% slower than a bare loop with 4 "
            "ranks on 2 cores)", "run as many ranks as the runner has cores, or fewer"))
    return out
