"""Profiler traces of several ranks: merge them into one Chrome/Perfetto trace and analyse it.

Pure (no torch, no pytest).  Input is what ``torch.profiler`` exports per rank (Kineto's
Chrome trace JSON); output is one merged trace (one process per rank) and a
:class:`~pytest_distperf.records.ProfileReport`, whose load balance, severities and
recommendations come from :mod:`pytest_distperf.analyzer` as for ``ddp_step_timer``.

Time: a Kineto event's ``ts`` (microseconds) counts from the trace's own
``baseTimeNanoseconds``, which may differ between ranks; every rank is moved onto the
smallest base of the set, in integer nanoseconds first so that no precision is lost.

Communication is recognised by what the profiler says it is, never by kernel-name patterns:

* ``record_param_comms`` events and their metadata ("Collective name", "In msg nelems",
  "Out msg nelems", "dtype", "Group size", "Process Group Name", "Seq"), written by the
  NCCL process group; GPU kernels count as communication when they carry that metadata or
  were launched from inside such an event (``External id`` or the launch's ``correlation``);
* otherwise the ``c10d::`` / ``_c10d_functional::`` operator events (what gloo on CPU gives in
  torch 2.13), with gloo's ``gloo:<collective>`` annotations on its worker threads as the time
  the collective actually ran.
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import json
import math
import re
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_distperf.analyzer import (
    MIN_OVERLAP,
    batch_shares,
    imbalance_suggestion,
    load_balance,
    recommendations,
    severity,
)
from pytest_distperf.config import DEFAULT_THRESHOLDS
from pytest_distperf.records import Bottleneck, CollectiveStat, ProfileReport, RankProfile

#: Name of the annotation the rank-side profiler puts around the profiled call.
REGION_NAME = "distperf:profiled_call"

#: Exposed communication below this fraction of the wall time is not worth a low-overlap
#: finding (below half the max_comm_overhead limit it is not either).
NOTICEABLE_COMM = 0.05
#: "Many small messages": at least this many calls of one collective, ...
SMALL_MESSAGE_CALLS = 16
#: ... averaging under this many bytes, ...
SMALL_MESSAGE_BYTES = 64 * 1024
#: ... taking at least this share of the communication time.
SMALL_MESSAGE_SHARE = 0.2
#: Thread ids given to a rank's non-host timelines (GPU streams, profiler spans) in the merge;
#: far above any Linux thread id (pid_max <= 2**22).
_EXTRA_TID_BASE = 1_000_000_000


class DesyncError(Exception):
    """The ranks ran different collectives (or in a different order): no figure is trusted."""

    def __init__(self, message: str, report: ProfileReport | None = None) -> None:
        super().__init__(message)
        self.report = report


# -- names and sizes ---------------------------------------------------------------------------
_ALIASES = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "all_gather": "all_gather",
    "allgather_base": "all_gather",
    "allgather_into_tensor": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_base": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_coalesced",
    "all_gather_into_tensor_coalesced": "all_gather_coalesced",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_coalesced",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "alltoallv": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "recvanysource": "recv",
}
#: record_param_comms names that are bookkeeping, not a collective.
_NOT_COLLECTIVES = frozenset({"wait", "init", "coalesced", "wait_tensor", "start_coalescing",
                              "end_coalescing", ""})
_P2P = frozenset({"send", "recv"})
#: Collectives whose message is the same size on every rank (so the desync check compares it).
_SAME_SIZE_EVERYWHERE = frozenset({"all_reduce", "all_reduce_coalesced", "broadcast", "reduce",
                                   "all_gather", "all_gather_coalesced", "reduce_scatter",
                                   "reduce_scatter_coalesced", "barrier"})
_COMM_OP_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")

_DTYPES: dict[str, tuple[str, int]] = {}
for _names, _canonical, _size in (
    (("float", "float32"), "float32", 4),
    (("double", "float64"), "float64", 8),
    (("half", "float16"), "float16", 2),
    (("bfloat16",), "bfloat16", 2),
    (("long", "long int", "int64", "int64_t", "long long", "long long int"), "int64", 8),
    (("int", "int32", "int32_t"), "int32", 4),
    (("short", "short int", "int16"), "int16", 2),
    (("char", "signed char", "int8"), "int8", 1),
    (("byte", "unsigned char", "uint8"), "uint8", 1),
    (("bool",), "bool", 1),
    (("uint16", "unsigned short"), "uint16", 2),
    (("uint32", "unsigned int"), "uint32", 4),
    (("uint64", "unsigned long", "unsigned long int"), "uint64", 8),
    (("complexhalf", "complex<half>", "complex32"), "complex32", 4),
    (("complexfloat", "complex<float>", "complex64"), "complex64", 8),
    (("complexdouble", "complex<double>", "complex128"), "complex128", 16),
    (("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"), "float8", 1),
):
    for _name in _names:
        _DTYPES[_name] = (_canonical, _size)


def canonical_collective(name: str) -> str:
    """``c10d::allreduce_``, ``allreduce``, ``gloo:all_reduce`` -> ``all_reduce``; other names
    come back lower-cased without namespace and underscores at the ends."""
    base = name.rsplit("::", 1)[-1].rsplit(":", 1)[-1].strip("_").lower()
    return _ALIASES.get(base, base)


def canonical_dtype(name: object) -> tuple[str, int]:
    """(torch-style dtype name, bytes per element) from a profiler's spelling of a dtype:
    ``"Float"`` (record_param_comms), ``"float"``, ``"c10::BFloat16"`` (operator inputs).
    Unknown: ``("", 0)``."""
    text = str(name or "").strip().strip('"').lower().replace("c10::", "")
    return _DTYPES.get(text, ("", 0))


def format_bytes(nbytes: float) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= factor:
            return f"{nbytes / factor:.3g} {unit}"
    return f"{nbytes:.0f} B"


# -- loading -----------------------------------------------------------------------------------
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


def _events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    events = trace.get("traceEvents", [])
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


# -- merging -----------------------------------------------------------------------------------
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
        shift_us = (base - common) / 1000.0
        events = _events(trace)
        host = _host_pid(events)
        names = _timeline_names(events)
        extra_tids: dict[tuple[Any, Any], int] = {}

        def tid_for(pid: Any, tid: Any, _host: Any = host,
                    _extra: dict[tuple[Any, Any], int] = extra_tids) -> Any:
            if pid == _host and isinstance(tid, int):
                return tid
            key = (pid, tid)
            if key not in _extra:
                _extra[key] = _EXTRA_TID_BASE + len(_extra)
            return _extra[key]

        for event in events:
            ph = event.get("ph")
            pid, tid = event.get("pid"), event.get("tid")
            if ph == "M":
                if event.get("name") in ("process_name", "process_labels",
                                         "process_sort_index"):
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
                    new[key] = _unique_id(new[key], index, len(traces))
            if isinstance(new.get("id2"), dict) and "global" in new["id2"]:
                new["id2"] = {"global": _unique_id(new["id2"]["global"], index, len(traces))}
            if ph in ("i", "I") and new.get("s") == "g":
                new["s"] = "p"
            out.append(new)
        info = {"rank": rank, "host_pid": host, "host_name": trace.get("host_name", ""),
                "baseTimeNanoseconds": base}
        for key in ("distributedInfo", "deviceProperties", "traceName"):
            if key in trace:
                info[key] = trace[key]
        infos.append(info)
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
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": common,
        "traceEvents": out,
        "distperf": {"ranks": infos},
    }


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


# -- one rank's timeline -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class CommOp:
    """One collective (or send/recv) issued on one rank, with where its time went."""

    name: str  # canonical: all_reduce, all_gather, ...
    nelems: int  # elements of the largest buffer (nccl-tests' message size)
    nbytes: int  # 0 where the dtype is unknown, and for barriers
    dtype: str
    group: str  # process group name ("" where the trace does not say)
    group_size: int
    group_ranks: tuple[int, ...]
    seq: int | None
    start_us: float  # when it was issued (on the merged clock)
    time_us: float  # how long it ran (its kernels or gloo's execution; else the call itself)
    source: str  # "record_param_comms", "c10d", or "execution" (seen running, not issued)

    def describe(self) -> str:
        parts = [self.name]
        if self.nbytes:
            parts.append(format_bytes(self.nbytes))
        elif self.nelems and self.name != "barrier":
            parts.append(f"{self.nelems} elements")
        if self.dtype:
            parts.append(self.dtype)
        if self.group:
            parts.append(f"group {self.group!r}")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True, slots=True)
class Timeline:
    """What the analysis needs from one rank's trace (microseconds on the merged clock)."""

    rank: int
    region: tuple[float, float]
    ops: tuple[CommOp, ...]
    comm: tuple[tuple[float, float], ...]  # merged intervals in which communication ran
    compute: tuple[tuple[float, float], ...]  # merged intervals in which compute ran
    source: str  # "record_param_comms", "c10d ops", or "none"
    device: bool  # compute and communication are GPU kernels


@dataclasses.dataclass(slots=True)
class _Ev:
    name: str
    cat: str
    pid: Any
    tid: Any
    start: float
    end: float
    args: dict[str, Any]

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclasses.dataclass(slots=True)
class _Draft:
    event: _Ev
    name: str
    nelems: int
    dtype: str
    itemsize: int
    group: str
    group_size: int
    group_ranks: tuple[int, ...]
    seq: int | None
    source: str
    execs: list[_Ev] = dataclasses.field(default_factory=list)


def timeline(trace: Mapping[str, Any], rank: int = 0, *, shift_us: float = 0.0) -> Timeline:
    """One rank's collectives and its communication and compute intervals.

    ``shift_us`` moves the trace onto a shared clock (see :func:`merge_traces`).
    """
    evs = _complete_events(trace, shift_us)
    region = _region(evs)
    rpc = [e for e in evs if e.name == "record_param_comms" and e.cat != "kernel"
           and canonical_collective(str(e.args.get("Collective name", "")))
           not in _NOT_COLLECTIVES]
    if rpc:
        source = "record_param_comms"
        drafts = _unique_calls(_draft_from_metadata(e) for e in _outermost(rpc))
    else:
        c10d = [e for e in evs if e.cat != "kernel" and e.name.startswith(_COMM_OP_PREFIXES)
                and canonical_collective(e.name) in _ALIASES.values()]
        drafts = [_draft_from_operator(e) for e in _outermost(c10d)]
        source = "c10d ops"

    # Everything a collective call did on its own thread belongs to communication.
    calls_by_thread = _by_thread([d.event for d in drafts])
    ext_to_op: dict[Any, int] = {}
    corr_to_op: dict[Any, int] = {}
    op_index = {id(d.event): i for i, d in enumerate(drafts)}
    for e in evs:
        container = _container(calls_by_thread, e)
        if container is None:
            continue
        i = op_index[id(container)]
        if e.cat != "kernel" and "External id" in e.args:
            ext_to_op.setdefault(e.args["External id"], i)
        if "correlation" in e.args and e.cat in ("cuda_runtime", "cuda_driver", "runtime"):
            corr_to_op[e.args["correlation"]] = i

    kernels = [e for e in evs if e.cat == "kernel"]
    device = bool(kernels)
    comm_execs: list[tuple[_Ev, int | None, str]] = []  # (event, linked op, canonical name)
    compute: list[tuple[float, float]] = []
    if device:
        for k in kernels:
            linked = ext_to_op.get(k.args.get("External id"))
            if linked is None:
                linked = corr_to_op.get(k.args.get("correlation"))
            meta_name = k.args.get("Collective name")
            is_comm_meta = (meta_name is not None
                            and canonical_collective(str(meta_name)) not in _NOT_COLLECTIVES)
            if linked is not None or is_comm_meta:
                name = (canonical_collective(str(meta_name)) if is_comm_meta
                        else drafts[linked].name if linked is not None else "")
                comm_execs.append((k, linked, name))
            else:
                compute.append((k.start, k.end))
    else:
        gloo = [e for e in evs if e.cat != "kernel" and e.name.startswith("gloo:")]
        comm_execs = [(e, None, canonical_collective(e.name)) for e in gloo]
        busy_by_thread = _by_thread([d.event for d in drafts] + gloo)
        for e in evs:
            if e.cat != "cpu_op" or e.name == "record_param_comms" \
                    or e.name.startswith(_COMM_OP_PREFIXES):
                continue
            if _container(busy_by_thread, e) is None:
                compute.append((e.start, e.end))

    _attribute(drafts, comm_execs)
    ops = sorted((_freeze(d) for d in drafts), key=lambda op: op.start_us)
    if not ops:
        source = "none"
    comm_spans = [(e.start, e.end) for e, _, _ in comm_execs]
    comm_spans += [(d.event.start, d.event.end) for d in drafts if not d.execs]
    clip = region
    return Timeline(
        rank=rank,
        region=region,
        ops=tuple(ops),
        comm=tuple(clip_intervals(merge_intervals(comm_spans), *clip)),
        compute=tuple(clip_intervals(merge_intervals(compute), *clip)),
        source=source,
        device=device,
    )


def _complete_events(trace: Mapping[str, Any], shift_us: float) -> list[_Ev]:
    out: list[_Ev] = []
    for e in _events(trace):
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        args = e.get("args")
        start = float(ts) + shift_us
        out.append(_Ev(str(e.get("name", "")), str(e.get("cat", "")), e.get("pid"), e.get("tid"),
                       start, start + max(float(dur), 0.0),
                       args if isinstance(args, dict) else {}))
    out.sort(key=lambda e: (e.start, -e.end))
    return out


def _region(evs: Sequence[_Ev]) -> tuple[float, float]:
    marked = [e for e in evs if e.name == REGION_NAME]
    if marked:
        best = max(marked, key=lambda e: e.dur)
        return best.start, best.end
    if not evs:
        return 0.0, 0.0
    return min(e.start for e in evs), max(e.end for e in evs)


def _by_thread(evs: Iterable[_Ev]) -> dict[tuple[Any, Any], tuple[list[float], list[_Ev]]]:
    """Per thread, outermost events sorted by start (and their starts, for bisect)."""
    groups: dict[tuple[Any, Any], list[_Ev]] = defaultdict(list)
    for e in evs:
        groups[(e.pid, e.tid)].append(e)
    out: dict[tuple[Any, Any], tuple[list[float], list[_Ev]]] = {}
    for key, items in groups.items():
        outer = _outermost(items)
        out[key] = ([e.start for e in outer], outer)
    return out


def _container(index: Mapping[tuple[Any, Any], tuple[list[float], list[_Ev]]],
               e: _Ev) -> _Ev | None:
    """The outermost indexed event on ``e``'s thread that contains ``e`` (or is ``e``)."""
    entry = index.get((e.pid, e.tid))
    if entry is None:
        return None
    starts, items = entry
    i = bisect.bisect_right(starts, e.start) - 1
    if i >= 0 and items[i].start <= e.start and e.end <= items[i].end:
        return items[i]
    return None


def _outermost(evs: Iterable[_Ev]) -> list[_Ev]:
    """Events not nested inside another of them on the same thread, by start time."""
    kept: list[_Ev] = []
    open_end: dict[tuple[Any, Any], float] = {}
    for e in sorted(evs, key=lambda e: (e.start, -e.end)):
        key = (e.pid, e.tid)
        if key in open_end and e.end <= open_end[key]:
            continue
        open_end[key] = e.end
        kept.append(e)
    return kept


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _ranks(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            value = ast.literal_eval(value.strip() or "[]")
        except (ValueError, SyntaxError):
            return ()
    if isinstance(value, (list, tuple)):
        return tuple(_int(v) for v in value)
    return ()


def _draft_from_metadata(e: _Ev) -> _Draft:
    a = e.args
    dtype, itemsize = canonical_dtype(a.get("dtype"))
    seq = a.get("Seq")
    return _Draft(
        event=e, name=canonical_collective(str(a.get("Collective name", ""))),
        nelems=max(_int(a.get("In msg nelems")), _int(a.get("Out msg nelems"))),
        dtype=dtype, itemsize=itemsize,
        group=str(a.get("Process Group Name", "") or ""),
        group_size=_int(a.get("Group size")), group_ranks=_ranks(a.get("Process Group Ranks")),
        seq=_int(seq) if seq is not None else None, source="record_param_comms",
    )


def _unique_calls(drafts: Iterable[_Draft]) -> list[_Draft]:
    """One call per (collective, group, sequence number): a collective recorded twice (by
    two layers of the process group) counts once."""
    seen: set[tuple[str, str, int]] = set()
    out: list[_Draft] = []
    for d in drafts:
        if d.seq is not None:
            key = (d.name, d.group, d.seq)
            if key in seen:
                continue
            seen.add(key)
        out.append(d)
    return out


def _elements(dims: Any) -> int:
    """Elements in one operator input as the profiler records its dims: ``[a, b]`` (a tensor),
    ``[[a], [b]]`` (a tensor list, summed), ``[]`` (not a tensor)."""
    if not isinstance(dims, list) or not dims:
        return 0
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    return sum(_elements(d) for d in dims)


def _operator_shape(args: Mapping[str, Any]) -> tuple[int, str, int]:
    """(elements of the largest input, its dtype, itemsize) from an operator's recorded inputs."""
    dims = args.get("Input Dims") or []
    types = args.get("Input type") or []
    best, dtype, itemsize = 0, "", 0
    for i, d in enumerate(dims if isinstance(dims, list) else []):
        n = _elements(d)
        if n > best:
            best = n
            dtype, itemsize = canonical_dtype(types[i] if i < len(types) else "")
    return best, dtype, itemsize


def _draft_from_operator(e: _Ev) -> _Draft:
    nelems, dtype, itemsize = _operator_shape(e.args)
    return _Draft(event=e, name=canonical_collective(e.name), nelems=nelems, dtype=dtype,
                  itemsize=itemsize, group="", group_size=0, group_ranks=(), seq=None,
                  source="c10d")


def _attribute(drafts: list[_Draft], execs: Sequence[tuple[_Ev, int | None, str]]) -> None:
    """Give each execution (a kernel, a gloo run) to the call it belongs to.

    Linked ones (External id, launch correlation) are exact; the rest go to the oldest call of
    the same collective still waiting for one (execution is in issue order per group).  An
    execution no call claims (a collective issued from C++) becomes a call of its own.
    """
    waiting: dict[str, deque[int]] = defaultdict(deque)
    linked_ops = {i for _, i, _ in execs if i is not None}
    for i, d in enumerate(drafts):
        if i not in linked_ops:
            waiting[d.name].append(i)
    for e, link, name in sorted(execs, key=lambda x: x[0].start):
        target = link
        if target is None:
            queue = waiting.get(name)
            if queue:
                target = queue.popleft()
            else:
                drafts.append(_draft_from_execution(e, name))
                target = len(drafts) - 1
        d = drafts[target]
        d.execs.append(e)
        if d.source in ("c10d", "execution"):
            # gloo's annotation knows the dtype where a tensor list hid it, and its own dims
            nelems, dtype, itemsize = _operator_shape(e.args)
            d.nelems = max(d.nelems, nelems)
            if not d.itemsize and itemsize:
                d.dtype, d.itemsize = dtype, itemsize


def _draft_from_execution(e: _Ev, name: str) -> _Draft:
    a = e.args
    if "Collective name" in a:
        d = _draft_from_metadata(e)
        d.source = "execution"
        return d
    nelems, dtype, itemsize = _operator_shape(a)
    return _Draft(event=e, name=name, nelems=nelems, dtype=dtype, itemsize=itemsize, group="",
                  group_size=0, group_ranks=(), seq=None, source="execution")


def _freeze(d: _Draft) -> CommOp:
    if d.execs:
        time_us = total_length(merge_intervals((x.start, x.end) for x in d.execs))
    else:
        time_us = d.event.dur
    nbytes = 0 if d.name == "barrier" else d.nelems * d.itemsize
    return CommOp(name=d.name, nelems=d.nelems, nbytes=nbytes, dtype=d.dtype, group=d.group,
                  group_size=d.group_size, group_ranks=d.group_ranks, seq=d.seq,
                  start_us=d.event.start, time_us=time_us, source=d.source)


# -- intervals ---------------------------------------------------------------------------------
def merge_intervals(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering the same time as ``spans``."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def clip_intervals(spans: Iterable[tuple[float, float]], lo: float,
                   hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def total_length(spans: Iterable[tuple[float, float]]) -> float:
    return sum(e - s for s, e in spans)


def intersection_length(a: Sequence[tuple[float, float]],
                        b: Sequence[tuple[float, float]]) -> float:
    """Time covered by both of two merged interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


# -- desync ------------------------------------------------------------------------------------
def check_desync(sequences: Mapping[int, Sequence[CommOp]]) -> str:
    """Empty when the ranks ran the same collectives in the same order; else what differs.

    Compared per process group (where the trace names it), collectives only (send/recv pair
    differently by design): the collective's name, and its size and dtype where the size is
    the same on every rank by definition (not all_to_all, gather, scatter).
    """
    profiled = sorted(sequences)
    by_group: dict[str, dict[int, list[CommOp]]] = defaultdict(lambda: defaultdict(list))
    members: dict[str, set[int]] = defaultdict(set)
    for rank in profiled:
        for op in sequences[rank]:
            if op.name in _P2P:
                continue
            by_group[op.group][rank].append(op)
            members[op.group].add(rank)
            members[op.group].update(r for r in op.group_ranks if r in sequences)
    problems: list[str] = []
    for group in sorted(by_group):
        ranks = sorted(members[group])
        if group == "" or len(ranks) < 2:
            # unnamed group (the c10d path), or a group only one rank named: all profiled ranks
            sizes = {op.group_size for ops in by_group[group].values() for op in ops}
            if group == "" or sizes == {len(profiled)}:
                ranks = profiled
        if len(ranks) < 2:
            continue
        seqs = {r: by_group[group].get(r, []) for r in ranks}
        problem = _first_difference(seqs)
        if problem:
            where = f" in process group {group!r}" if group else ""
            problems.append(f"ranks ran different collectives{where}: {problem}")
    return "\n".join(problems)


def _same(a: CommOp, b: CommOp) -> bool:
    """Whether two ranks' calls are the same collective (size and dtype where comparable)."""
    if a.name != b.name:
        return False
    if a.name not in _SAME_SIZE_EVERYWHERE or a.name == "barrier":
        return True
    # a size or dtype that one trace could not tell is not a difference
    same_size = not a.nelems or not b.nelems or a.nelems == b.nelems
    return same_size and (not a.dtype or not b.dtype or a.dtype == b.dtype)


def _first_difference(seqs: Mapping[int, Sequence[CommOp]]) -> str:
    ranks = sorted(seqs)
    longest = max(len(s) for s in seqs.values())
    for i in range(longest):
        ops = {r: (seqs[r][i] if i < len(seqs[r]) else None) for r in ranks}
        first = ops[ranks[0]]
        if all(op is not None and first is not None and _same(op, first)
               for op in ops.values()):
            continue
        said = "; ".join(f"rank {r}: {op.describe() if op else 'nothing (it had stopped)'}"
                         for r, op in ops.items())
        text = f"collective #{i + 1} differs ({said})"
        counts = {r: len(s) for r, s in seqs.items()}
        if len(set(counts.values())) > 1:
            text += "; collectives per rank: " + ", ".join(
                f"rank {r}: {n}" for r, n in counts.items())
        return text
    return ""


# -- analysis ----------------------------------------------------------------------------------
def timelines(traces: Sequence[Mapping[str, Any]],
              ranks: Sequence[int] | None = None) -> list[Timeline]:
    """Each rank's timeline on the clock of :func:`merge_traces` (the smallest base time)."""
    ranks = list(range(len(traces))) if ranks is None else list(ranks)
    bases = [base_time_ns(t) for t in traces]
    common = min(bases) if bases else 0
    return [timeline(t, r, shift_us=(b - common) / 1000.0)
            for t, r, b in zip(traces, ranks, bases, strict=True)]


def rank_profile(tl: Timeline) -> RankProfile:
    wall = max(tl.region[1] - tl.region[0], 0.0)
    comm = total_length(tl.comm)
    overlapped = intersection_length(tl.comm, tl.compute)
    exposed = max(comm - overlapped, 0.0)
    collectives = [op for op in tl.ops if op.name not in _P2P]
    return RankProfile(
        rank=tl.rank,
        wall_time_s=wall / 1e6,
        compute_time_s=max(wall - exposed, 0.0) / 1e6,
        busy_compute_s=total_length(tl.compute) / 1e6,
        comm_time_s=comm / 1e6,
        exposed_comm_s=exposed / 1e6,
        overlap=overlapped / comm if comm > 0 else 0.0,
        comm_overhead=exposed / wall if wall > 0 else 0.0,
        collectives=len(collectives),
        comm_bytes=sum(op.nbytes for op in tl.ops),
    )


def collective_stats(tls: Sequence[Timeline]) -> tuple[CollectiveStat, ...]:
    """Per collective (and send/recv): calls and bytes per rank, and time (mean over ranks)."""
    names = sorted({op.name for tl in tls for op in tl.ops})
    stats: list[CollectiveStat] = []
    for name in names:
        per_rank = [[op for op in tl.ops if op.name == name] for tl in tls]
        times = tuple(sum(op.time_us for op in ops) / 1e6 for ops in per_rank)
        stats.append(CollectiveStat(
            name=name,
            count=max(len(ops) for ops in per_rank),
            bytes=max(sum(op.nbytes for op in ops) for ops in per_rank),
            total_time_s=sum(times) / len(times) if times else 0.0,
            per_rank_time_s=times,
        ))
    stats.sort(key=lambda s: -s.total_time_s)
    return tuple(stats)


def analyse(traces: Sequence[Mapping[str, Any]], *, ranks: Sequence[int] | None = None,
            limits: Mapping[str, float] | None = None, trace_path: str = "",
            results: Sequence[Any] = ()) -> ProfileReport:
    """The :class:`ProfileReport` of the ranks' traces (rank order unless ``ranks`` says).

    ``limits``: the thresholds (``max_comm_overhead``, ``max_imbalance``) the bottleneck rules
    use; CONTRACT.md's defaults where missing.
    """
    limits = {**DEFAULT_THRESHOLDS, **(limits or {})}
    tls = timelines(traces, ranks)
    per_rank = tuple(rank_profile(tl) for tl in tls)
    collectives = collective_stats(tls)
    desync = check_desync({tl.rank: tl.ops for tl in tls})
    sources = {tl.source for tl in tls} - {"none"}
    source = " + ".join(sorted(sources)) if sources else "none"

    with_comm = [p for p in per_rank if p.comm_time_s > 0]
    # The rank that waits least shows the cost of communication itself; the others add the
    # time they waited for it, which is imbalance (reported as such), not communication.
    reference = min(with_comm, key=lambda p: (p.comm_overhead, p.rank)) if with_comm \
        else (per_rank[0] if per_rank else None)
    comm_overhead = reference.comm_overhead if reference else 0.0
    overlap = reference.overlap if reference else 0.0

    wall = max((p.wall_time_s for p in per_rank), default=0.0)
    balance = load_balance([p.compute_time_s for p in per_rank],
                           [p.exposed_comm_s for p in per_rank], step_time_s=wall,
                           limit=limits["max_imbalance"])
    # load_balance counts positions; the profiled ranks may not be 0..n-1
    stragglers = tuple(per_rank[i].rank for i in balance.stragglers)
    shares = batch_shares([1.0 / p.compute_time_s if p.compute_time_s > 0 else None
                           for p in per_rank]) if stragglers else ()
    found = _bottlenecks(per_rank=per_rank, reference=reference, comm_overhead=comm_overhead,
                         overlap=overlap, imbalance=balance.imbalance, stragglers=stragglers,
                         shares=shares, collectives=collectives, desync=desync, limits=limits)
    return ProfileReport(
        trace_path=trace_path,
        world_size=len(per_rank),
        comm_source=source,
        wall_time_s=wall,
        comm_overhead=comm_overhead,
        overlap=overlap,
        imbalance=balance.imbalance,
        stragglers=stragglers,
        reference_rank=reference.rank if reference else 0,
        per_rank=per_rank,
        collectives=collectives,
        desync=desync,
        bottlenecks=tuple(found),
        recommendations=tuple(recommendations(found)),
        imbalance_cv=balance.cv,
        batch_shares=tuple(shares),
        results=tuple(results),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _bottlenecks(*, per_rank: Sequence[RankProfile], reference: RankProfile | None,
                 comm_overhead: float, overlap: float, imbalance: float,
                 stragglers: Sequence[int], shares: Sequence[float],
                 collectives: Sequence[CollectiveStat], desync: str,
                 limits: Mapping[str, float]) -> list[Bottleneck]:
    """What limits the profiled call, each with what to do: simple rules on measured figures."""
    found: list[Bottleneck] = []
    all_ranks = tuple(p.rank for p in per_rank)
    if desync:
        found.append(Bottleneck(
            "desync", "high", all_ranks, desync,
            "make every rank issue the same collectives in the same order (a mismatch hangs "
            "NCCL or silently mixes data); no other figure of this profile is trustworthy "
            "until then"))
    if reference is None:
        return found
    comm_limit = limits["max_comm_overhead"]
    if comm_overhead >= comm_limit:
        top = collectives[0] if collectives else None
        text = (f"exposed communication (not overlapped by compute) is {comm_overhead:.0%} of "
                f"the profiled time on rank {reference.rank}, the rank that waited least "
                f"({_ms(reference.exposed_comm_s)} of {_ms(reference.wall_time_s)}); "
                f"limit {comm_limit:.0%}")
        if top is not None:
            text += (f"; most of the communication is {top.name} ({top.count} calls, "
                     f"{format_bytes(top.bytes)}, {_ms(top.total_time_s)})")
        found.append(Bottleneck(
            "communication", severity(comm_overhead, comm_limit), (), text,
            "overlap communication with compute (async_op=True and a late wait(), DDP "
            "gradient bucketing), send less (bf16/fp16 communication hooks, gradient "
            "compression), or synchronise less often (gradient accumulation under no_sync())",
            comm_overhead, comm_limit))
    if overlap < MIN_OVERLAP and reference.comm_time_s > 0 \
            and comm_overhead >= max(comm_limit / 2, NOTICEABLE_COMM):
        found.append(Bottleneck(
            "low_overlap", severity(overlap, MIN_OVERLAP, higher_is_worse=False), (),
            f"only {overlap:.0%} of the {_ms(reference.comm_time_s)} of communication on rank "
            f"{reference.rank} ran while compute ran",
            "issue collectives with async_op=True and wait() only where the result is needed; "
            "with DDP keep gradient bucketing on (a smaller bucket_cap_mb lets the first "
            "buckets leave during backward)", overlap, MIN_OVERLAP))
    limit = limits["max_imbalance"]
    if stragglers and imbalance >= limit:
        computes = ", ".join(f"rank {p.rank} {_ms(p.compute_time_s)}" for p in per_rank)
        slow = ", ".join(map(str, stragglers))
        found.append(Bottleneck(
            "imbalance", severity(imbalance, limit), tuple(stragglers),
            f"load imbalance {imbalance:.0%} of the mean compute time; straggler: rank {slow} "
            f"(compute per rank, time not spent waiting on others: {computes}); "
            f"limit {limit:.0%}",
            imbalance_suggestion(stragglers, shares), imbalance, limit))
    comm_total = sum(c.total_time_s for c in collectives)
    for c in collectives:
        if c.count >= SMALL_MESSAGE_CALLS and c.bytes / c.count < SMALL_MESSAGE_BYTES \
                and c.name != "barrier" and comm_total > 0 \
                and c.total_time_s >= SMALL_MESSAGE_SHARE * comm_total:
            found.append(Bottleneck(
                "small_messages", "low", (),
                f"{c.count} {c.name} calls of {format_bytes(c.bytes / c.count)} on average "
                f"take {c.total_time_s / comm_total:.0%} of the communication time: small "
                f"messages are bound by latency, not bandwidth",
                f"fuse the {c.name} calls into fewer, larger ones (one flat buffer, DDP "
                f"buckets, torch.distributed's coalescing)", c.total_time_s / comm_total,
                SMALL_MESSAGE_SHARE))
    return found


_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def trace_file_name(nodeid: str, index: int = 1) -> str:
    """A file name for a test's merged trace: ``tests_test_x.py__test_y_2.3.trace.json``."""
    stem = _SAFE.sub("_", nodeid.replace("::", "__").replace("/", "_")).strip("_") or "trace"
    if len(stem) > 150:
        import hashlib

        stem = stem[:130] + "-" + hashlib.sha1(stem.encode()).hexdigest()[:10]
    suffix = f".{index}" if index > 1 else ""
    return f"{stem}{suffix}.trace.json"
