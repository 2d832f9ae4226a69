"""One rank's timeline from its profiler trace: the collectives it issued, and when it
communicated and computed (microseconds on the merged clock).  Stdlib only.

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
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_distperf.analysis.traces.merge import base_time_ns, trace_events
from pytest_distperf.analysis.traces.stages import TraceChunk, stage_chunks
from pytest_distperf.common.intervals import clip_intervals, merge_intervals, union_length
from pytest_distperf.common.names import (
    ALIASES,
    COMM_OP_PREFIXES,
    NOT_COLLECTIVES,
    RUN_AS,
    canonical_collective,
    canonical_dtype,
)
from pytest_distperf.config import format_bytes
from pytest_distperf.records import PROFILED_REGION, PROFILER_STEP

#: Name of the annotation around the profiled call: the region a timeline covers.
REGION_NAME = PROFILED_REGION


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
    # when it started running on this rank (its first kernel or gloo run; else the call) and
    # when it ended (its last one): a rank "arrives" at a collective when it starts running
    run_start_us: float = 0.0
    end_us: float = 0.0

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
    steps: tuple[tuple[float, float], ...] = ()  # the ProfilerStep spans, in order
    chunks: tuple[TraceChunk, ...] = ()  # pipeline stages' labelled chunks, in order

    def window(self, start: float, end: float) -> Timeline:
        """This timeline cut to ``[start, end]``: the collectives issued in it, the
        communication and compute intervals clipped to it."""
        return dataclasses.replace(
            self, region=(start, end),
            ops=tuple(op for op in self.ops if start <= op.start_us < end),
            comm=tuple(clip_intervals(self.comm, start, end)),
            compute=tuple(clip_intervals(self.compute, start, end)), steps=(),
            chunks=tuple(c for c in self.chunks if start <= c[3] < end))


@dataclasses.dataclass(slots=True)
class Event:
    """One complete (``X``) event of a trace, times in microseconds on the merged clock."""

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
    event: Event
    name: str
    nelems: int
    dtype: str
    itemsize: int
    group: str
    group_size: int
    group_ranks: tuple[int, ...]
    seq: int | None
    source: str
    execs: list[Event] = dataclasses.field(default_factory=list)


Exec = tuple[Event, int | None, str]  # an execution: (event, the call it is linked to, name)


def timeline(trace: Mapping[str, Any], rank: int = 0, *, shift_us: float = 0.0) -> Timeline:
    """One rank's collectives and its communication and compute intervals.

    ``shift_us`` moves the trace onto a shared clock (see
    :func:`~pytest_distperf.analysis.traces.merge.merge_traces`).
    """
    evs = complete_events(trace, shift_us)
    region = region_of(evs)
    drafts, source = _calls(evs)
    kernels = [e for e in evs if e.cat == "kernel"]
    coalesced: list[Event] = []
    if kernels:
        comm_execs, compute, coalesced = _split_kernels(kernels, drafts, evs)
    else:
        comm_execs, compute = _split_cpu_ops(evs, drafts)
    _attribute(drafts, comm_execs)
    ops = sorted((_freeze(d) for d in drafts), key=lambda op: op.start_us)
    if not ops:
        source = "none"
    comm_spans = [(e.start, e.end) for e, _, _ in comm_execs]
    comm_spans += [(k.start, k.end) for k in coalesced]
    comm_spans += [(d.event.start, d.event.end) for d in drafts if not d.execs]
    return Timeline(
        rank=rank,
        region=region,
        ops=tuple(ops),
        comm=tuple(clip_intervals(merge_intervals(comm_spans), *region)),
        compute=tuple(clip_intervals(merge_intervals(compute), *region)),
        source=source,
        device=bool(kernels),
        steps=_steps(evs, region),
        chunks=stage_chunks((e.name, e.cat, e.start, e.end) for e in evs),
    )


def _steps(evs: Sequence[Event], region: tuple[float, float]) -> tuple[tuple[float, float], ...]:
    """The ``ProfilerStep#<n>`` spans inside the region, in order (the outermost of each;
    the host's spans: a GPU timeline's copy of the annotation is not a step of its own)."""
    spans = [e for e in evs if e.name.startswith(PROFILER_STEP) and not e.cat.startswith("gpu")
             and e.cat != "kernel" and e.start >= region[0] and e.end <= region[1]]
    return tuple((e.start, e.end) for e in outermost(spans))


def _calls(evs: Sequence[Event]) -> tuple[list[_Draft], str]:
    """The collective calls the rank issued, and where they were read from: the
    ``record_param_comms`` metadata where there is any, else the ``c10d::`` operators."""
    rpc = [e for e in evs if e.name == "record_param_comms" and e.cat != "kernel"
           and canonical_collective(str(e.args.get("Collective name", "")))
           not in NOT_COLLECTIVES]
    if rpc:
        return _unique_calls(_draft_from_metadata(e) for e in outermost(rpc)), \
            "record_param_comms"
    c10d = [e for e in evs if e.cat != "kernel" and e.name.startswith(COMM_OP_PREFIXES)
            and canonical_collective(e.name) in ALIASES.values()]
    return [_draft_from_operator(e) for e in outermost(c10d)], "c10d ops"


def _split_kernels(kernels: Sequence[Event], drafts: Sequence[_Draft], evs: Sequence[Event]
                   ) -> tuple[list[Exec], list[tuple[float, float]], list[Event]]:
    """GPU kernels as communication (linked to a call, or carrying collective metadata),
    coalesced communication, or compute.

    A coalesced group (``batch_isend_irecv``, FSDP's coalesced all-gathers) records its
    calls one by one with their metadata but launches one kernel for all of them from a
    ``record_param_comms`` event named ``coalesced``, and on some versions that kernel
    carries no metadata of its own.  Such kernels are communication, not attributed to
    any one call of the group (which keep their host-side duration)."""
    # Everything a collective call did on its own thread belongs to communication.
    calls_by_thread = by_thread([d.event for d in drafts])
    groups = [e for e in evs if e.name == "record_param_comms" and e.cat != "kernel"
              and canonical_collective(str(e.args.get("Collective name", ""))) == "coalesced"]
    groups_by_thread = by_thread(groups)
    ext_to_op: dict[Any, int] = {}
    corr_to_op: dict[Any, int] = {}
    group_ext: set[Any] = set()
    group_corr: set[Any] = set()
    op_index = {id(d.event): i for i, d in enumerate(drafts)}
    runtime = ("cuda_runtime", "cuda_driver", "runtime")
    for e in evs:
        container = enclosing(calls_by_thread, e)
        if container is not None:
            i = op_index[id(container)]
            if e.cat != "kernel" and "External id" in e.args:
                ext_to_op.setdefault(e.args["External id"], i)
            if "correlation" in e.args and e.cat in runtime:
                corr_to_op[e.args["correlation"]] = i
        elif enclosing(groups_by_thread, e) is not None:
            if e.cat != "kernel" and "External id" in e.args:
                group_ext.add(e.args["External id"])
            if "correlation" in e.args and e.cat in runtime:
                group_corr.add(e.args["correlation"])
    comm_execs: list[Exec] = []
    compute: list[tuple[float, float]] = []
    coalesced: list[Event] = []
    for k in kernels:
        linked = ext_to_op.get(k.args.get("External id"))
        if linked is None:
            linked = corr_to_op.get(k.args.get("correlation"))
        meta_name = k.args.get("Collective name")
        meta = canonical_collective(str(meta_name)) if meta_name is not None else None
        is_comm_meta = meta is not None and meta not in NOT_COLLECTIVES
        if linked is not None or is_comm_meta:
            name = (str(meta) if is_comm_meta
                    else drafts[linked].name if linked is not None else "")
            comm_execs.append((k, linked, name))
        elif (meta == "coalesced" or k.args.get("External id") in group_ext
              or k.args.get("correlation") in group_corr):
            coalesced.append(k)
        else:
            compute.append((k.start, k.end))
    return comm_execs, compute, coalesced


def _split_cpu_ops(evs: Sequence[Event], drafts: Sequence[_Draft]
                   ) -> tuple[list[Exec], list[tuple[float, float]]]:
    """No kernels (gloo on CPU): gloo's ``gloo:<collective>`` runs are communication; CPU
    operators outside every collective call and gloo run are compute."""
    gloo = [e for e in evs if e.cat != "kernel" and e.name.startswith("gloo:")]
    comm_execs: list[Exec] = [(e, None, canonical_collective(e.name)) for e in gloo]
    busy_by_thread = by_thread([d.event for d in drafts] + gloo)
    compute = [(e.start, e.end) for e in evs
               if e.cat == "cpu_op" and e.name != "record_param_comms"
               and not e.name.startswith(COMM_OP_PREFIXES)
               and enclosing(busy_by_thread, e) is None]
    return comm_execs, compute


def complete_events(trace: Mapping[str, Any], shift_us: float = 0.0) -> list[Event]:
    """The trace's complete events with a numeric time, by start (the longest first)."""
    out: list[Event] = []
    for e in trace_events(trace):
        if e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur", 0)
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        args = e.get("args")
        start = float(ts) + shift_us
        out.append(Event(str(e.get("name", "")), str(e.get("cat", "")), e.get("pid"),
                         e.get("tid"), start, start + max(float(dur), 0.0),
                         args if isinstance(args, dict) else {}))
    out.sort(key=lambda e: (e.start, -e.end))
    return out


def region_of(evs: Sequence[Event]) -> tuple[float, float]:
    """The profiled region: the longest :data:`REGION_NAME` event, else the whole trace."""
    marked = [e for e in evs if e.name == REGION_NAME]
    if marked:
        best = max(marked, key=lambda e: e.dur)
        return best.start, best.end
    if not evs:
        return 0.0, 0.0
    return min(e.start for e in evs), max(e.end for e in evs)


def by_thread(evs: Iterable[Event]) -> dict[tuple[Any, Any], tuple[list[float], list[Event]]]:
    """Per thread, outermost events sorted by start (and their starts, for bisect)."""
    groups: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    for e in evs:
        groups[(e.pid, e.tid)].append(e)
    out: dict[tuple[Any, Any], tuple[list[float], list[Event]]] = {}
    for key, items in groups.items():
        outer = outermost(items)
        out[key] = ([e.start for e in outer], outer)
    return out


def enclosing(index: Mapping[tuple[Any, Any], tuple[list[float], list[Event]]],
              e: Event) -> Event | None:
    """The outermost indexed event on ``e``'s thread that contains ``e`` (or is ``e``)."""
    entry = index.get((e.pid, e.tid))
    if entry is None:
        return None
    starts, items = entry
    i = bisect.bisect_right(starts, e.start) - 1
    if i >= 0 and items[i].start <= e.start and e.end <= items[i].end:
        return items[i]
    return None


def outermost(evs: Iterable[Event]) -> list[Event]:
    """Events not nested inside another of them on the same thread, by start time."""
    kept: list[Event] = []
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


def _draft_from_metadata(e: Event) -> _Draft:
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


def _draft_from_operator(e: Event) -> _Draft:
    nelems, dtype, itemsize = _operator_shape(e.args)
    return _Draft(event=e, name=canonical_collective(e.name), nelems=nelems, dtype=dtype,
                  itemsize=itemsize, group="", group_size=0, group_ranks=(), seq=None,
                  source="c10d")


def _attribute(drafts: list[_Draft], execs: Sequence[Exec]) -> None:
    """Give each execution (a kernel, a gloo run) to the call it belongs to.

    Linked ones (External id, launch correlation) are exact; the rest go to the oldest call of
    the same collective and message size still waiting for one (else the oldest of the same
    collective), issued before it ran: execution is in issue order per group, but gloo runs
    two collectives of one step on two threads, and the second may start first.  A
    collective the backend runs as another (:data:`~pytest_distperf.common.names.RUN_AS`:
    gloo's reduce-scatter is an all-reduce) goes to the call it implements, so that the
    call is counted once, at the level the code issued it.  An execution no call claims (a
    collective issued from C++) becomes a call of its own.
    """
    waiting: dict[str, list[int]] = defaultdict(list)
    linked_ops = {i for _, i, _ in execs if i is not None}
    for i, d in enumerate(drafts):
        if i not in linked_ops:
            waiting[d.name].append(i)
    for e, link, name in sorted(execs, key=lambda x: x[0].start):
        nelems, dtype, itemsize = _operator_shape(e.args)
        target = link if link is not None else _claim(drafts, waiting, e, name, nelems)
        if target is None:
            drafts.append(_draft_from_execution(e, name))
            target = len(drafts) - 1
        d = drafts[target]
        d.execs.append(e)
        if d.source in ("c10d", "execution"):
            # gloo's annotation knows the dtype where a tensor list hid it, and the dims
            # where the operator's were not recorded
            if not d.nelems:
                d.nelems = nelems
            if not d.itemsize and itemsize and nelems == d.nelems:
                d.dtype, d.itemsize = dtype, itemsize


def _claim(drafts: Sequence[_Draft], waiting: Mapping[str, list[int]], e: Event, name: str,
           nelems: int) -> int | None:
    """The waiting call an unlinked execution ``e`` of ``name`` belongs to, taken off its
    queue: a call issued before it ran, of the same collective and size, else one the
    backend runs as ``name`` of that size, then any of the same collective, then any run as
    ``name``; a call issued after it ran only where none was issued before; None where none
    waits."""
    queues = [waiting.get(name, [])] + [waiting.get(call, []) for call in RUN_AS.get(name, ())]
    for before in (True, False):
        for same_size in (True, False):
            for queue in queues:
                found = next((i for i in queue
                              if (not before or drafts[i].event.start <= e.start)
                              and (not same_size or drafts[i].nelems == nelems)), None)
                if found is not None:
                    queue.remove(found)
                    return found
    return None


def _draft_from_execution(e: Event, name: str) -> _Draft:
    a = e.args
    if "Collective name" in a:
        d = _draft_from_metadata(e)
        d.source = "execution"
        return d
    nelems, dtype, itemsize = _operator_shape(a)
    return _Draft(event=e, name=name, nelems=nelems, dtype=dtype, itemsize=itemsize, group="",
                  group_size=0, group_ranks=(), seq=None, source="execution")


def _freeze(d: _Draft) -> CommOp:
    # how long it ran: its kernels or gloo's runs where seen, else the call itself
    time_us = union_length((x.start, x.end) for x in d.execs) if d.execs else d.event.dur
    nbytes = 0 if d.name == "barrier" else d.nelems * d.itemsize
    runs = d.execs or [d.event]
    return CommOp(name=d.name, nelems=d.nelems, nbytes=nbytes, dtype=d.dtype, group=d.group,
                  group_size=d.group_size, group_ranks=d.group_ranks, seq=d.seq,
                  start_us=d.event.start, time_us=time_us, source=d.source,
                  run_start_us=min(x.start for x in runs), end_us=max(x.end for x in runs))


def timelines(traces: Sequence[Mapping[str, Any]],
              ranks: Sequence[int] | None = None) -> list[Timeline]:
    """Each rank's timeline on the clock of
    :func:`~pytest_distperf.analysis.traces.merge.merge_traces` (the smallest base time)."""
    ranks = list(range(len(traces))) if ranks is None else list(ranks)
    bases = [base_time_ns(t) for t in traces]
    common = min(bases) if bases else 0
    return [timeline(t, r, shift_us=(b - common) / 1000.0)
            for t, r, b in zip(traces, ranks, bases, strict=True)]
