"""``dist_profiler``, the controller half: profile a function on every rank, merge the ranks'
traces into one Chrome/Perfetto trace and analyse it.

The ranks run :func:`~pytest_distperf.rank.profile.profile_on_rank` and send their traces
back as compressed JSON; :class:`DistProfiler` merges them
(:func:`~pytest_distperf.traces.merge_traces`), writes the one file and analyses them
(:func:`~pytest_distperf.traces.analyse`).  Importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_distperf.config import require_int
from pytest_distperf.files import write_atomically
from pytest_distperf.records import Metric, ProfileReport
from pytest_distperf.traces import (
    DesyncError,
    analyse,
    load_trace,
    merge_traces,
    trace_file_name,
)
from pytest_distperf.traces.merge import rank_trace

if TYPE_CHECKING:
    from pytest_distperf.group import DistGroup

#: Untimed calls of ``fn`` before the profiled one: first calls pay for connection set-up,
#: allocator growth and lazy initialisation, which is not what a profile should show; and
#: DDP rebuilds its gradient buckets at the start of its second step (two broadcasts), so
#: that the profiled steps of a DDP model hold only its gradient all-reduces.
DEFAULT_WARMUP = 2
#: A trace file larger than this is written gzip-compressed (``.json.gz``, which Perfetto,
#: chrome://tracing, Holistic Trace Analysis and TraceLens open as they are): profiles of
#: real training steps run to hundreds of MiB of JSON, about a tenth of that compressed.
GZIP_ABOVE_BYTES = 8 << 20


class DistProfiler:
    """The ``dist_profiler`` fixture: ``dist_profiler(fn, *args, world_size=None, setup=None,
    steps=1, **kwargs)``.

    Each call runs ``setup()`` once when given (outside the profile; its result becomes
    ``fn``'s first argument), then ``fn(*args, **kwargs)`` on the first ``world_size`` ranks
    (default: the test's group) ``warmup`` times, then ``steps`` times under
    ``torch.profiler``, each a ``ProfilerStep#<n>``; merges the ranks' traces into one file in
    ``trace_dir`` (one process per rank) and returns its
    :class:`~pytest_distperf.records.ProfileReport` (``steps``: the per-step view).  The
    report's metrics are recorded for the test's verdict: ``profile.comm_overhead``
    (threshold ``max_comm_overhead``), ``profile.imbalance`` (``max_imbalance``, stragglers as
    ranks), ``profile.overlap`` (higher is better), ``profile.step_time_s``,
    ``profile.arrival_skew_s`` and ``profile.arrival_skew`` (``max_arrival_skew``, off by
    default; the late rank as its rank), and the exact ``profile.comm.<op>.calls`` and
    ``.bytes``; the n-th call of a test records ``profile<n>.*``.

    Settings (attributes, change them before calling): ``warmup`` (default 2: past DDP's
    bucket rebuild),
    ``record_shapes`` (True: gives the message sizes of gloo collectives), ``with_stack``,
    ``profile_memory`` (False), ``check_desync`` (True: ranks that ran different collectives
    raise :class:`~pytest_distperf.traces.DesyncError`; False: the report says so in
    ``desync`` and nothing is recorded).
    """

    def __init__(self, group: DistGroup, *, trace_dir: Path, nodeid: str,
                 limits: Mapping[str, float] | None = None, write: bool = True) -> None:
        self._group = group
        self._trace_dir = Path(trace_dir)
        self._nodeid = nodeid
        self._limits = dict(limits or {})
        self._write = write
        self.warmup = DEFAULT_WARMUP
        self.record_shapes = True
        self.with_stack = False
        self.profile_memory = False
        self.check_desync = True
        self.reports: list[ProfileReport] = []

    @property
    def trace_dir(self) -> Path:
        return self._trace_dir

    def __repr__(self) -> str:
        return f"<DistProfiler {self._group!r} traces in {self._trace_dir}>"

    def __call__(self, fn: Callable[..., Any], *args: Any, world_size: int | None = None,
                 setup: Callable[[], Any] | None = None, steps: int = 1,
                 **kwargs: Any) -> ProfileReport:
        __tracebackhide__ = True
        if not callable(fn):
            raise TypeError(f"dist_profiler() needs a callable, got {fn!r}")
        if setup is not None and not callable(setup):
            raise TypeError(f"dist_profiler(): setup must be a callable (run once on every "
                            f"rank, its result passed to fn), got {setup!r}")
        require_int(self.warmup, "dist_profiler.warmup", 0)
        require_int(steps, "dist_profiler(): steps", 1)
        size = self._group.world_size if world_size is None else int(world_size)
        if size < 1:
            raise ValueError(f"dist_profiler(): world_size must be at least 1, got {world_size}")
        index = len(self.reports) + 1
        prefix = "profile" if index == 1 else f"profile{index}"
        metric_size = 0 if size == self._group.world_size else size
        name = getattr(fn, "__qualname__", repr(fn))
        label = f"dist_profiler({name})" if index == 1 else f"dist_profiler#{index}({name})"
        path = self._trace_dir / trace_file_name(self._nodeid, index) if self._write else None

        options = (setup, steps)
        report = self._profile(fn, args, kwargs, size, label, path, options)
        self.reports.append(report)
        if report.desync and self.check_desync:
            self._group.record(label, [], report)
            where = f"\nmerged trace: {report.trace_path}" if report.trace_path else ""
            raise DesyncError(f"{label}: {report.desync}{where}", report)

        def remeasure() -> list[Metric]:
            return self._profile(fn, args, kwargs, size, label, None,
                                 options).metrics(prefix, metric_size)

        self._group.record(label, report.metrics(prefix, metric_size), report, remeasure)
        return report

    def _profile(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 size: int, label: str, path: Path | None,
                 options: tuple[Callable[[], Any] | None, int]) -> ProfileReport:
        __tracebackhide__ = True
        from pytest_distperf.rank.profile import profile_on_rank

        setup, steps = options
        replies = self._group.call(
            profile_on_rank,
            (fn, args, kwargs, self.warmup, self.record_shapes, self.with_stack,
             self.profile_memory, setup, steps),
            {}, label, world_size=size)
        traces = [load_trace(zlib.decompress(reply.trace)) for reply in replies]
        results = [reply.result for reply in replies]
        if path is not None:
            path = write_traces(path, traces)
            sys.stdout.write(f"distperf: merged trace of {len(traces)} ranks written to "
                             f"{path} (each rank's own in {rank_trace_dir(path).name}/)\n")
        return analyse(traces, limits=self._limits, trace_path=str(path) if path else "",
                       results=results)


def write_traces(path: Path, traces: Sequence[Mapping[str, Any]]) -> Path:
    """Write the ranks' traces merged at ``path`` and each rank's own in the folder beside it
    (:func:`rank_trace_dir`), and remove what an earlier run left there; the merged trace's
    path (``.gz`` added where it was compressed)."""
    path = write_trace(path, merge_traces(traces))
    folder = rank_trace_dir(path)
    written = [path]
    for rank, trace in enumerate(traces):
        # spaced JSON: HTA finds a file's rank with the pattern '"rank":\s+(\d+)'
        written.append(write_trace(folder / f"rank{rank}.trace.json",
                                   rank_trace(trace, rank, len(traces)),
                                   what=f"trace of rank {rank}", separators=(", ", ": ")))
    remove_stale_traces(written)
    return path


def rank_trace_dir(merged: Path) -> Path:
    """The folder beside a merged trace that holds each rank's own trace, ``rank<N>.trace.json``
    (what Holistic Trace Analysis and TraceLens take as a trace folder):
    ``x.trace.json`` -> ``x.ranks/``."""
    name = merged.name.removesuffix(".gz").removesuffix(".json").removesuffix(".trace")
    return merged.with_name(f"{name}.ranks")


#: A rank's own trace in the folder beside the merged one, as :class:`DistProfiler` names it.
_RANK_TRACE = re.compile(r"rank[0-9]+\.trace\.json(\.gz)?")


def remove_stale_traces(written: Sequence[Path]) -> None:
    """Remove what an earlier run left beside a trace just written: the merged trace's twin
    (``.json`` beside a new ``.json.gz``, or the other way round) and, in its ``.ranks/``
    folder, every rank trace not written now (the other suffix, or ranks beyond this world
    size).  ``written``: the merged trace first, then the ranks' own.  Only files named as
    this module names them are touched; one that cannot be removed is left."""
    merged = written[0]
    twin = (merged.with_name(merged.name.removesuffix(".gz")) if merged.suffix == ".gz"
            else merged.with_name(merged.name + ".gz"))
    stale = [twin]
    folder = rank_trace_dir(merged)
    with contextlib.suppress(OSError):
        stale += [p for p in folder.iterdir()
                  if _RANK_TRACE.fullmatch(p.name) and p not in written]
    for path in stale:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def write_trace(path: Path, trace: Mapping[str, Any],
                gzip_above: int = GZIP_ABOVE_BYTES, what: str = "merged trace",
                separators: tuple[str, str] = (",", ":")) -> Path:
    """Write a trace atomically, creating the folder, as ``path`` or, when its JSON is larger
    than ``gzip_above`` bytes, gzip-compressed as ``path`` + ``.gz``; the path written.  An
    OSError (an unwritable or missing folder, a full disk) becomes one that names the file and
    the option."""
    data = json.dumps(trace, separators=separators).encode("utf-8")
    if len(data) > gzip_above:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, compresslevel=6, mtime=0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as exc:
        raise OSError(exc.errno, f"dist_profiler: cannot write the {what} {path} "
                                 f"({exc.strerror or exc}); choose a writable folder with "
                                 f"--distperf-trace") from None
    return path
