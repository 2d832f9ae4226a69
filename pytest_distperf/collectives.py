"""Collective benchmarks, the controller half: plan the measurement, assemble the result.

:func:`plan` checks the op, sizes and dtype and fixes the element counts (a
:class:`~pytest_distperf.records.BenchSpec` sent to the ranks); the ranks measure
(:mod:`pytest_distperf.rank.collectives`); :func:`build_result` turns their samples into a
:class:`~pytest_distperf.records.CollectiveResult` with nccl-tests' algbw and busbw, the one
place busbw is computed.  torch is imported only in :func:`plan`, to check a dtype.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pytest_distperf.config import format_size, parse_size, require_int
from pytest_distperf.records import (
    CHUNKED_OPS,
    BenchSpec,
    CollectiveResult,
    CollectiveRow,
    PairMatrix,
    PairOutcome,
    PairRow,
    SizeOutcome,
    gbps,
    slowest_control,
)

#: The ops of ``bench``, in the order the suite runs them.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
       "send_recv", "barrier")

#: busbw = algbw * factor(n): nccl-tests' doc/PERFORMANCE.md.
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
#: Default sweeps: 64 KiB .. 64 MiB by x4 on CPU, 64 KiB .. 1 GiB by x4 on GPU.
DEFAULT_SIZES_CPU = tuple(64 * 1024 * 4**i for i in range(6))
DEFAULT_SIZES_GPU = tuple(64 * 1024 * 4**i for i in range(8))
#: Default message of the pairwise matrix.
DEFAULT_PAIR_SIZE = {"cpu": 4 * 1024**2, "cuda": 64 * 1024**2}
#: Timed calls per size when ``iters`` is not given (nccl-tests' ``-n 20``)...
DEFAULT_ITERS = 20
#: ... and, on CPU ranks, as many more as fit in this many seconds per size: a gloo
#: all-reduce's calls spread by 30-80% (interquartile range over the median) on a 2-core
#: runner, so that the 25% quantile of 20 calls moves by about 11% from one measurement to
#: the next, as much as the 10% the gate must see; 200 calls (about 1 s of a 4 MiB
#: all-reduce with its host-speed control) bring that to about 4% (benchmarks/
#: verdict_quality.md, R22).  On GPUs (NCCL, CUDA events) the calls are steady: exactly
#: ``iters``.
CPU_MIN_TIME_S = 1.0
#: ... but never more than this many timed calls per size.
MAX_ITERS = 2000


class WrongResultError(AssertionError):
    """A collective returned wrong values (nccl-tests' ``#wrong`` > 0).

    ``result`` is the :class:`~pytest_distperf.records.CollectiveResult` (or
    :class:`~pytest_distperf.records.PairMatrix`) with the count per size.
    """

    def __init__(self, message: str, result: CollectiveResult | PairMatrix) -> None:
        super().__init__(message)
        self.result = result


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus bandwidth factor of ``op`` on ``world_size`` ranks."""
    return BUS_FACTORS[check_op(op)](world_size)


def check_op(op: object) -> str:
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"unknown collective {op!r}; valid ops: {', '.join(OPS)}")
    return op


# -- planning (controller) ----------------------------------------------------------------
def dtype_name(dtype: Any) -> str:
    """``torch.float32`` or ``"float32"`` -> ``"float32"``; ValueError for what cannot be
    summed and checked (bool, complex) or is not a dtype."""
    import torch

    if isinstance(dtype, str):
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
    else:
        resolved = dtype
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"dtype must be a torch dtype such as torch.float32, got {dtype!r}")
    if resolved is torch.bool or resolved.is_complex:
        raise ValueError(f"dtype {resolved} is not supported: use a real floating point or "
                         f"integer dtype (e.g. torch.float32, torch.bfloat16, torch.int32)")
    return str(resolved).removeprefix("torch.")


def resolve_sizes(sizes: Any, device_type: str) -> list[tuple[str, int]]:
    """(label, bytes) for each requested size, ascending, duplicates dropped."""
    if sizes is None:
        raw: list[Any] = list(DEFAULT_SIZES_GPU if device_type == "cuda" else DEFAULT_SIZES_CPU)
    elif isinstance(sizes, (int, str)):
        raw = [sizes]
    elif isinstance(sizes, (list, tuple, range)):
        raw = list(sizes)
    else:
        raise ValueError(f"sizes must be a size, a list of sizes or None, got {sizes!r} "
                         f"(a size is a byte count or a string like '64KiB', '16MiB')")
    if not raw:
        raise ValueError("sizes is empty: give at least one size, or None for the default sweep")
    out: dict[int, str] = {}
    for value in raw:
        nbytes = parse_size(value)
        if nbytes < 1:
            raise ValueError(f"bad size {value!r}: a message needs at least 1 byte")
        out.setdefault(nbytes, format_size(nbytes))
    return [(out[n], n) for n in sorted(out)]


def element_count(op: str, nbytes: int, element_size: int, world_size: int) -> int:
    """Elements in S for a requested size: whole elements, and for the chunked ops a whole
    number per rank (nccl-tests rounds down the same way); at least one of each."""
    unit = world_size if op in CHUNKED_OPS else 1
    return max(1, nbytes // (element_size * unit)) * unit


def plan(op: str, sizes: Any, dtype: Any, warmup: int, iters: int | None, *,
         world_size: int, device_type: str, control: bool = False,
         min_time_s: float | None = None) -> BenchSpec:
    """Check every argument of ``bench`` before anything is sent to the ranks.

    ``iters`` None: :data:`DEFAULT_ITERS`, and on CPU ranks a time floor of
    :data:`CPU_MIN_TIME_S` per size unless ``min_time_s`` says otherwise; a given ``iters``
    is exactly that many timed calls unless ``min_time_s`` is given too."""
    import torch

    check_op(op)
    floor = min_time(op, min_time_s, iters, device_type)
    if iters is None:
        iters = DEFAULT_ITERS
    for name, value, least in (("warmup", warmup, 0), ("iters", iters, 1)):
        require_int(value, f"bench({op!r}): {name}", least)
    if op == "send_recv" and world_size < 2:
        raise ValueError("bench('send_recv') needs at least 2 ranks (a ring: each rank sends "
                         "to rank+1 and receives from rank-1)")
    name = dtype_name(torch.float32 if dtype is None else dtype)
    element_size = getattr(torch, name).itemsize
    if op == "barrier":
        return BenchSpec(op, ("0B",), (0,), name, element_size, warmup, iters, world_size,
                         bool(control), floor, max(MAX_ITERS, iters))
    resolved = resolve_sizes(sizes, device_type)
    counts = tuple(element_count(op, n, element_size, world_size) for _, n in resolved)
    return BenchSpec(op, tuple(label for label, _ in resolved), counts, name, element_size,
                     warmup, iters, world_size, bool(control), floor, max(MAX_ITERS, iters))


def min_time(op: str, min_time_s: Any, iters: int | None, device_type: str) -> float:
    """The seconds of timed calls ``bench`` takes per size at least (0: exactly ``iters``)."""
    if min_time_s is None:
        return CPU_MIN_TIME_S if iters is None and device_type == "cpu" else 0.0
    if (isinstance(min_time_s, bool) or not isinstance(min_time_s, (int, float))
            or not math.isfinite(min_time_s) or min_time_s < 0):
        raise ValueError(f"bench({op!r}): min_time_s must be a number of seconds, 0 or more, "
                         f"got {min_time_s!r}")
    return float(min_time_s)


def build_result(spec: BenchSpec, per_rank: Sequence[Sequence[SizeOutcome]], *,
                 backend: str, device_type: str) -> CollectiveResult:
    """The ranks' outcomes (``per_rank[rank][size]``) as rows with algbw and busbw."""
    factor = BUS_FACTORS[spec.op](spec.world_size)
    rows = []
    for i, (label, count) in enumerate(zip(spec.labels, spec.counts, strict=True)):
        outcomes = [rank_outcomes[i] for rank_outcomes in per_rank]
        per_rank_us = tuple(tuple(s * 1e6 for s in o.samples) for o in outcomes)
        samples_us = tuple(max(col) for col in zip(*per_rank_us, strict=True))
        time_us = statistics.median(samples_us)
        size_bytes = count * spec.element_size
        algbw = gbps(size_bytes, time_us)
        wrong = sum(o.wrong for o in outcomes)
        first = next((o.first_wrong for o in outcomes if o.first_wrong), "")
        control = slowest_control([o.control for o in outcomes], len(samples_us))
        memory = slowest_control([o.memory_control for o in outcomes], len(samples_us))
        rows.append(CollectiveRow(label, size_bytes, count, time_us, algbw, algbw * factor,
                                  wrong, samples_us, per_rank_us, first, control, memory))
    return CollectiveResult(spec.op, spec.world_size, backend, device_type, spec.dtype,
                            spec.warmup, spec.iters, factor, tuple(rows))


def wrong_message(result: CollectiveResult | PairMatrix) -> str:
    """Why a result with wrong values fails the test."""
    if isinstance(result, PairMatrix):
        bad = [f"{p.src}->{p.dst}: {p.wrong}" for p in result.pairs if p.wrong]
        return (f"send/recv between rank pairs delivered wrong data ({result.wrong} wrong "
                f"element(s); pairs {', '.join(bad)}) at {result.label} {result.dtype}: suspect "
                f"the devices or the link between them; no bandwidth was recorded")
    parts = [f"{row.label}: {row.wrong} wrong ({row.first_wrong})"
             for row in result.rows if row.wrong]
    return (f"{result.op} returned wrong values on {result.world_size} ranks "
            f"({result.backend}, {result.dtype}); #wrong = {result.wrong}:\n  "
            + "\n  ".join(parts)
            + "\n(the collective is broken, not slow: suspect the backend, a device or a link; "
              "its bandwidth was not recorded)")


def build_pairs(spec: BenchSpec, per_rank: Sequence[PairOutcome], *, backend: str,
                device_type: str) -> PairMatrix:
    """Merge the senders' samples and the receivers' checks into a :class:`PairMatrix`."""
    samples: dict[tuple[int, int], list[float]] = {}
    wrong: dict[tuple[int, int], int] = {}
    for outcome in per_rank:
        for (src, dst), values in outcome.sent.items():
            samples[(src, dst)] = list(values)
        for (src, dst), count in outcome.received.items():
            wrong[(src, dst)] = count
    rows = []
    for (src, dst) in sorted(samples):
        us = tuple(s * 1e6 for s in samples[(src, dst)])
        t = statistics.median(us)
        size_bytes = spec.counts[0] * spec.element_size
        rows.append(PairRow(src, dst, t, gbps(size_bytes, t),
                            wrong.get((src, dst), 0), us))
    return PairMatrix(len(per_rank), backend, device_type, spec.dtype, spec.labels[0],
                      spec.counts[0] * spec.element_size, spec.warmup, spec.iters, tuple(rows))


def with_nodes(matrix: PairMatrix, nodes: Sequence[str]) -> PairMatrix:
    """``matrix`` with its view by node (``by_node``: intra-node and inter-node figures,
    findings naming a slow node or link with its ranks) when the ranks span nodes;
    ``nodes[r]`` is rank r's node (:func:`pytest_distperf.topology.node_names`)."""
    from pytest_distperf.analyzer import pairs_by_node  # numpy: only when it is used

    split = pairs_by_node(matrix, nodes)
    return dataclasses.replace(matrix, by_node=split) if split is not None else matrix
