"""A rank's memory: the peak a timed step reports, what held it, and what an out-of-memory
error says (torch, inside functions).

Peak: the CUDA caching allocator's on GPU, the largest resident set size seen after a step
on CPU.  What held it (:func:`recording_peak_sites`, GPU only): the allocator's history over
one step, read by :func:`~pytest_distperf.common.peaksites.sites_at_peak`.
An out-of-memory error (``torch.OutOfMemoryError``) is reported with its cause
first: the allocation it asked for, the device's free and peak memory, and the parameters
of the model the call built (:func:`note_model`); then the rank frees what the failed call
held (:func:`release_cached`) and serves the next call.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sysconfig
from collections.abc import Callable, Iterator
from typing import Any

from pytest_distperf.common.peaksites import Site, sites_at_peak, under
from pytest_distperf.rank.clock import Clock

#: torch's words for the allocation that failed (``Tried to allocate 2.00 GiB``).
_ASKED = re.compile(r"Tried to allocate (\d+(?:\.\d+)? (?:bytes|KiB|MiB|GiB))")
#: What to do about an out-of-memory error, whatever the call was.
_ADVICE = "Make the batch or the model smaller, or shard the model over the ranks (FSDP)"

#: The parameter bytes of the model the current call built (None: it built none).
_model_bytes: int | None = None


def memory_figures(clock: Clock, peak_rss: int, world: int) -> tuple[int, int, str]:
    """(peak bytes, capacity bytes, source): the CUDA allocator's peak on GPU, the largest
    resident set size seen after a step on CPU."""
    if clock.on_cuda:
        import torch

        peak = int(torch.cuda.max_memory_allocated(clock.device))
        capacity = int(torch.cuda.get_device_properties(clock.device).total_memory)
        return peak, capacity, "cuda_max_allocated"
    return peak_rss, _host_memory_share(world), "rss"


@contextlib.contextmanager
def recording_peak_sites(clock: Clock) -> Iterator[list[Site]]:
    """Record the CUDA allocator's history over the ``with`` body; the list it gives holds,
    after it, the sites that held the most memory at the body's peak (none on CPU, or where
    the snapshot API fails: what held the peak is a hint, never a reason to fail a step)."""
    import torch

    sites: list[Site] = []
    if not (clock.on_cuda and torch.cuda.is_available()):
        yield sites
        return
    memory = torch.cuda.memory
    try:
        memory._record_memory_history("all", context="alloc", stacks="python",
                                      clear_history=True)
    except Exception:  # an allocator without history (another backend, an old torch)
        yield sites
        return
    try:
        yield sites
        try:
            sites.extend(_sites(memory._snapshot(), clock))
        except Exception:  # a snapshot torch could not take or we could not read: no sites
            sites.clear()
    finally:
        with contextlib.suppress(Exception):
            memory._record_memory_history(None)


def _sites(snapshot: Any, clock: Clock) -> tuple[Site, ...]:
    import torch

    index = clock.device.index
    return sites_at_peak(snapshot, torch.cuda.current_device() if index is None else index,
                         library_file(os.path.dirname(torch.__file__)))


def library_file(torch_folder: str) -> Callable[[str], bool]:
    """Whether a frame's file is torch's, this plugin's or the standard library's: the
    user's line is the first frame outside them.  Installed packages are the user's (the
    standard library's folder holds site-packages on pyenv, conda and most images)."""
    paths = sysconfig.get_paths()
    ours = (torch_folder, os.path.dirname(os.path.dirname(__file__)))
    packages = (paths["purelib"], paths["platlib"])

    def skip(filename: str) -> bool:
        return under(filename, ours) or (under(filename, (paths["stdlib"],))
                                         and not under(filename, packages))

    return skip


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not available)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return 0


def _host_memory_share(world: int) -> int:
    """Host memory divided evenly over the ranks of the group (0 when unknown)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    return int(total // max(1, local))


def note_model(model: Any) -> None:
    """Remember the parameter bytes of ``model`` (a ``torch.nn.Module``), the model this
    call trains, for an out-of-memory error to name."""
    global _model_bytes
    _model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())


def forget_model() -> None:
    """A new call: it has built no model yet."""
    global _model_bytes
    _model_bytes = None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's out-of-memory error (CUDA's, or another device's)."""
    import torch

    return isinstance(exc, torch.OutOfMemoryError)


def out_of_memory(exc: BaseException) -> str:
    """What a call's out-of-memory error says first (the allocation asked, the device's free
    and peak memory, the model's parameters where the call built one, what to do); '' for
    any other error."""
    if not is_out_of_memory(exc):
        return ""
    found = _ASKED.search(str(exc))
    device, memory = _device_memory()
    parts = [f"asked for {found.group(1) if found else 'an amount torch did not say'}",
             memory]
    if _model_bytes is not None:
        parts.append(f"the model's parameters take {_size(_model_bytes)}")
    return f"OutOfMemoryError on {device}: {'; '.join(parts)}. {_ADVICE}"


def _device_memory() -> tuple[str, str]:
    """(this rank's device, its free and peak memory in words): CUDA's figures, or unknown
    where the call used no CUDA device."""
    import torch

    unknown = "free and peak memory unknown (torch counts them on CUDA devices only)"
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return "cpu", unknown
    device = torch.cuda.current_device()
    try:
        free, total = torch.cuda.mem_get_info(device)
        peak = torch.cuda.max_memory_allocated(device)
    except Exception:  # a device the error left unusable: the error still goes back
        return f"cuda:{device}", unknown
    return (f"cuda:{device}",
            f"{_size(free)} free of {_size(total)}, peak {_size(peak)} allocated by torch")


def _size(nbytes: int) -> str:
    """Bytes as torch's allocator writes them in its errors (``2.00 GiB``, ``512 bytes``),
    so that they read alike beside the size torch asked for."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes > factor:
            return f"{nbytes / factor:.2f} {unit}"
    return f"{nbytes} bytes"


def release_cached() -> None:
    """Collect what a finished or failed call left unreachable, and give the CUDA caching
    allocator's free blocks back to the device."""
    gc.collect()
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
