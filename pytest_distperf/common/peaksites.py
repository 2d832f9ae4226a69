"""Device memory at its peak, by the code that allocated it.  Pure; standard library only.

:func:`sites_at_peak` reads a CUDA caching allocator snapshot as
``torch.cuda.memory._snapshot()`` returns it with the allocation history on
(``_record_memory_history``): ``segments`` (each ``device`` and ``blocks``, each block
``address``, ``size``, ``state`` and ``frames``) hold the state when it was taken, and
``device_traces[device]`` every action since the history was cleared, oldest first (``alloc``,
``free_requested``, ``free_completed``, ``segment_*``, ...: ``addr``, ``size``, ``frames``,
innermost frame first).  It finds the moment the most bytes were allocated and the blocks live
then, each named by the first frame of its stack in the user's code.  :func:`grew` compares
two such lists.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: One site and the bytes its blocks held at the peak: ``model.py:88:forward``.
Site = tuple[str, int]

#: Blocks allocated before the history was cleared: held from an earlier step (parameters,
#: gradients, optimizer state, or a reference kept past the step).
BEFORE = "(from before the step)"
#: Blocks allocated with no Python frame (autograd's backward runs in its own C++ thread).
NO_FRAME = "(no Python frame)"
#: How many sites a list keeps, the largest first.
TOP = 4


def sites_at_peak(snapshot: Mapping[str, Any], device: int,
                  skip: Callable[[str], bool] = lambda filename: False,
                  top: int = TOP) -> tuple[Site, ...]:
    """The ``top`` sites holding the most bytes at the peak of allocated memory on
    ``device`` over the recorded history, the largest first.  A block's site is its first
    frame whose file ``skip`` does not take for a library's (torch, the plugin, the standard
    library: :func:`under`): the user's line that asked for it; else its innermost frame,
    :data:`NO_FRAME` without one, and :data:`BEFORE` for a block allocated before the
    history began."""
    traces = snapshot.get("device_traces") or []
    trace = traces[device] if 0 <= device < len(traces) else []
    live = _live_at_start(snapshot, device, trace)
    total = best = sum(size for size, _ in live.values())
    best_at = -1
    for i, entry in enumerate(trace):
        total += _step(live, entry)
        if total > best:
            best, best_at = total, i
    live = _live_at_start(snapshot, device, trace)
    for entry in trace[:best_at + 1]:
        _step(live, entry)
    held: dict[str, int] = {}
    for size, site in live.values():
        where = _site(site, skip) if site is not None else BEFORE
        held[where] = held.get(where, 0) + size
    return tuple(sorted(held.items(), key=lambda s: (-s[1], s[0]))[:top])


def _live_at_start(snapshot: Mapping[str, Any], device: int, trace: Sequence[Mapping[str, Any]]
                   ) -> dict[int, tuple[int, list[Any] | None]]:
    """address -> (size, frames) of the blocks allocated when the history began: the
    snapshot's allocated blocks with the trace undone, newest action first.  Their frames are
    None: what allocated them is not in the history."""
    live: dict[int, tuple[int, list[Any] | None]] = {
        int(b["address"]): (int(b["size"]), None)
        for seg in snapshot.get("segments", ()) if seg.get("device", device) == device
        for b in seg.get("blocks", ()) if b.get("state") == "active_allocated"}
    for entry in reversed(trace):
        action = entry.get("action")
        if action == "alloc":
            live.pop(int(entry["addr"]), None)
        elif action == "free_requested":
            live[int(entry["addr"])] = (int(entry["size"]), None)
    return live


def _step(live: dict[int, tuple[int, list[Any] | None]], entry: Mapping[str, Any]) -> int:
    """Apply one action to ``live``; the change of allocated bytes.  A block stops counting
    at ``free_requested``, as torch's allocated bytes do (its memory may wait for a stream)."""
    action = entry.get("action")
    if action == "alloc":
        live[int(entry["addr"])] = (int(entry["size"]), list(entry.get("frames") or ()))
        return int(entry["size"])
    if action == "free_requested":
        gone = live.pop(int(entry["addr"]), None)
        return -gone[0] if gone is not None else 0
    return 0


def _site(frames: Sequence[Mapping[str, Any]], skip: Callable[[str], bool]) -> str:
    if not frames:
        return NO_FRAME
    mine = next((f for f in frames if not _library(str(f.get("filename", "")), skip)),
                frames[0])
    name = os.path.basename(str(mine.get("filename", "?")))
    return f"{name}:{mine.get('line', 0)}:{mine.get('name', '?')}"


def _library(filename: str, skip: Callable[[str], bool]) -> bool:
    return filename.startswith("<") or skip(filename)  # "<frozen ...>", "<string>": not a file


def under(filename: str, folders: Iterable[str]) -> bool:
    """Whether ``filename`` lies in one of ``folders``."""
    return any(filename.startswith(folder.rstrip(os.sep) + os.sep) for folder in folders)


def grew(before: Sequence[Site], after: Sequence[Site], top: int = 3
         ) -> list[tuple[str, int | None, int]]:
    """(site, bytes before or None where it was not among the sites kept, bytes now) of
    the sites that hold more now, the most grown first, ``top`` of them."""
    was = dict(before)
    out = [(site, was.get(site), now) for site, now in after if now > was.get(site, 0)]
    return sorted(out, key=lambda s: (-(s[2] - (s[1] or 0)), s[0]))[:top]
