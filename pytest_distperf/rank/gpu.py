"""What a GPU rank tells about its GPU's setting for the environment key: the NVIDIA
driver, torch's CUDA runtime and the GPU's active NVLinks.

NVML (the optional ``nvidia-ml-py`` package) gives the driver and the links; without it the
driver comes from ``/proc/driver/nvidia/version`` and the links are unknown (-1).  The
readers of NVML's answers take the module as an argument, so that they are tested on a
fake one.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

#: The kernel module's line of ``/proc/driver/nvidia/version``, e.g. ``NVRM version: NVIDIA
#: UNIX x86_64 Kernel Module  550.54.15  Tue Mar 5 ...`` (or ``Open Kernel Module for``).
_PROC_DRIVER = re.compile(r"^NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s", re.MULTILINE)
PROC_DRIVER_FILE = "/proc/driver/nvidia/version"


def gpu_facts(device_index: int) -> dict[str, Any]:
    """``driver_version``, ``cuda_version``, ``nvlinks`` (active NVLinks of this rank's
    GPU; -1 where NVML cannot tell) and ``uuid`` ("GPU-...", NVML's spelling) for the rank
    on ``cuda:device_index``."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    uuid = str(getattr(props, "uuid", "") or "")
    uuid = uuid if not uuid or uuid.startswith("GPU-") else f"GPU-{uuid}"
    facts: dict[str, Any] = {"cuda_version": str(torch.version.cuda or ""),
                             "driver_version": "", "nvlinks": -1, "uuid": uuid}
    with contextlib.suppress(ImportError):
        import pynvml

        facts.update(nvml_facts(pynvml, device_index, uuid))
    if not facts["driver_version"]:
        with contextlib.suppress(OSError), open(PROC_DRIVER_FILE) as f:
            facts["driver_version"] = driver_from_proc(f.read())
    return facts


def nvml_facts(nv: Any, index: int, uuid: str) -> dict[str, Any]:
    """The driver and the active NVLinks of device ``uuid`` (CUDA's, ``GPU-...``; NVML's
    ``index`` where it has none) as NVML module ``nv`` answers; {} where NVML does not
    start."""
    try:
        nv.nvmlInit()
    except nv.NVMLError:
        return {}
    facts: dict[str, Any] = {}
    try:
        driver = nv.nvmlSystemGetDriverVersion()
        facts["driver_version"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        handle = None
        if uuid:
            with contextlib.suppress(nv.NVMLError):
                handle = nv.nvmlDeviceGetHandleByUUID(uuid)
        if handle is None:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        facts["nvlinks"] = active_nvlinks(nv, handle)
    except nv.NVMLError:
        pass  # what was read stays; the rest is unknown
    finally:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
    return facts


def active_nvlinks(nv: Any, handle: Any) -> int:
    """How many of the device's NVLinks are up (0 on a GPU without NVLink: NVML answers
    "not supported" for each link)."""
    count = 0
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        with contextlib.suppress(nv.NVMLError):
            count += nv.nvmlDeviceGetNvLinkState(handle, link) == nv.NVML_FEATURE_ENABLED
    return count


def driver_from_proc(text: str) -> str:
    """The driver's version in the text of ``/proc/driver/nvidia/version``, or ""."""
    match = _PROC_DRIVER.search(text)
    return match.group(1) if match else ""
