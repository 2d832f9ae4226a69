"""Merge the traces of several ranks into one Chrome/Perfetto trace.  Stdlib only.

Time: a Kineto event's ``ts`` (microseconds) counts from the trace's own
``baseTimeNanoseconds``, which may differ between ranks; every rank is moved onto the
smallest base of the set, in integer nanoseconds first so that no precision is lost.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Thread ids given to a rank's non-host timelines (GPU streams, profiler spans) in the merge;
#: far above any Linux thread id (pid_max <= 2**22).
_EXTRA_TID_BASE = 1_000_000_000


def load_trace(data: bytes | str | Mapping[str, Any]) -> dict[str, Any]:
    """A trace as a dict: from JSON text or bytes, or a dict (a bare event list is wrapped)."""
    if isinstance(data, Mapping):
        return dict(data)
    if isinstance(data, bytes):
        data = data.decode("utf-8")
    parsed = json.loads(data)
    if isinstance(parsed, list):
        return {"traceEvents": parsed}
    if not isinstance(parsed, dict):
        raise ValueError(f"not a Chrome trace: top level is {type(parsed).__name__}")
    return parsed


def base_time_ns(trace: Mapping[str, Any]) -> int:
    """The trace's ``baseTimeNanoseconds`` (0 when absent: ``ts`` is then taken as is)."""
    try:
        return int(trace.get("baseTimeNanoseconds", 0) or 0)
    except (TypeError, ValueError):
        return 0


def trace_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    events = trace.get("traceEvents", [])
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def merge_traces(traces: Sequence[Mapping[str, Any]],
                 ranks: Sequence[int] | None = None) -> dict[str, Any]:
    """One Chrome/Perfetto trace of all ranks: one process per rank.

    Every rank becomes process ``pid = rank`` named ``rank N``; its host threads keep their
    thread ids, its other timelines (GPU streams, profiler spans) become threads of the same
    process with their original names.  Times move onto the smallest ``baseTimeNanoseconds``
    of the set (written as the merged trace's own); flow and async ids are made unique per
    rank; global instant events become process-scoped.
    """
    ranks = list(range(len(traces))) if ranks is None else list(ranks)
    if len(ranks) != len(traces):
        raise ValueError(f"{len(traces)} traces but {len(ranks)} ranks")
    bases = [base_time_ns(t) for t in traces]
    common = min(bases) if bases else 0
    out: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    for index, (rank, trace, base) in enumerate(zip(ranks, traces, bases, strict=True)):
        events, info = _one_rank(trace, rank, index, len(traces), base, common)
        out.extend(events)
        infos.append(info)
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": common,
        "traceEvents": out,
        "distperf": {"ranks": infos},
    }


def rank_trace(trace: Mapping[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """One rank's own trace, as Holistic Trace Analysis and TraceLens read a folder of them:
    with ``distributedInfo`` holding its ``rank`` (added, with ``world_size``, where the
    profiler did not write it; torch writes it whenever a process group exists), first in
    the file: HTA takes the first ``"rank"`` it finds as the file's."""
    info = trace.get("distributedInfo")
    info = dict(info) if isinstance(info, Mapping) else {}
    info.setdefault("rank", rank)
    info.setdefault("world_size", world_size)
    return {"distributedInfo": info, **{k: v for k, v in trace.items()
                                        if k != "distributedInfo"}}


def _one_rank(trace: Mapping[str, Any], rank: int, index: int, count: int, base: int,
              common: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One rank's events as process ``rank`` of the merged trace (shifted onto the common
    base, ids made unique by ``index`` of ``count``), and what the merge notes about it."""
    shift_us = (base - common) / 1000.0
    events = trace_events(trace)
    host = _host_pid(events)
    names = _timeline_names(events)
    extra_tids: dict[tuple[Any, Any], int] = {}

    def tid_for(pid: Any, tid: Any) -> Any:
        if pid == host and isinstance(tid, int):
            return tid
        if (pid, tid) not in extra_tids:
            extra_tids[(pid, tid)] = _EXTRA_TID_BASE + len(extra_tids)
        return extra_tids[(pid, tid)]

    out: list[dict[str, Any]] = []
    for event in events:
        ph = event.get("ph")
        pid, tid = event.get("pid"), event.get("tid")
        if ph == "M":
            if event.get("name") in ("process_name", "process_labels", "process_sort_index"):
                continue  # replaced by this rank's own below
            if pid != host:
                continue  # extra timelines get their names below
        new = dict(event)
        new["pid"] = rank
        new["tid"] = tid_for(pid, tid)
        if ph != "M" and isinstance(new.get("ts"), (int, float)):
            new["ts"] = new["ts"] + shift_us
        for key in ("id", "bind_id"):
            if key in new:
                new[key] = _unique_id(new[key], index, count)
        if isinstance(new.get("id2"), dict) and "global" in new["id2"]:
            new["id2"] = {"global": _unique_id(new["id2"]["global"], index, count)}
        if ph in ("i", "I") and new.get("s") == "g":
            new["s"] = "p"
        out.append(new)
    info = {"rank": rank, "host_pid": host, "host_name": trace.get("host_name", ""),
            "baseTimeNanoseconds": base}
    for key in ("distributedInfo", "deviceProperties", "traceName"):
        if key in trace:
            info[key] = trace[key]
    label = f"rank {rank}"
    if host is not None:
        label += f" (pid {host}" + (f" on {info['host_name']})" if info["host_name"] else ")")
    out.append(_meta("process_name", rank, 0, {"name": f"rank {rank}"}))
    out.append(_meta("process_labels", rank, 0, {"labels": label}))
    out.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
    for (pid, tid), new_tid in extra_tids.items():
        name = " ".join(p for p in (names.get((pid, None), str(pid)),
                                    names.get((pid, tid), str(tid))) if p) or "profiler"
        out.append(_meta("thread_name", rank, new_tid, {"name": name}))
        out.append(_meta("thread_sort_index", rank, new_tid, {"sort_index": new_tid}))
    return out, info


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "args": args}


def _unique_id(value: Any, index: int, count: int) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value >= 0:
        return value * count + index
    return f"{value}@{index}"


def _host_pid(events: Iterable[Mapping[str, Any]]) -> Any:
    """The pid of the rank's own process: the one whose threads ran the CPU operators."""
    counts: dict[Any, int] = defaultdict(int)
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in ("cpu_op", "user_annotation"):
            counts[event.get("pid")] += 1
    if not counts:
        for event in events:
            if event.get("ph") == "X" and isinstance(event.get("pid"), int):
                counts[event.get("pid")] += 1
    return max(counts, key=lambda p: counts[p]) if counts else None


def _timeline_names(events: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, Any], str]:
    """(pid, None) -> process name, (pid, tid) -> thread name, from metadata events."""
    names: dict[tuple[Any, Any], str] = {}
    for event in events:
        if event.get("ph") != "M":
            continue
        args = event.get("args") or {}
        if event.get("name") == "process_name":
            names[(event.get("pid"), None)] = str(args.get("name", "")).strip()
        elif event.get("name") == "thread_name":
            names[(event.get("pid"), event.get("tid"))] = str(args.get("name", "")).strip()
    return names
