"""Collective benchmarks: nccl-tests' measurements, run on the ranks of a group.

Two halves, kept apart so that the controller never needs torch to read a result:

* planning and assembling (controller): :func:`plan` checks the op, sizes and dtype and
  fixes the element counts; :func:`build_result` turns the ranks' samples into a
  :class:`~pytest_distperf.records.CollectiveResult` with nccl-tests' algbw and busbw.
* measuring (ranks): :func:`bench_on_rank` runs, per size, a warm-up and a barrier-aligned
  timed loop (:func:`pytest_distperf.timing.time_iterations`: CUDA events on GPU,
  ``perf_counter`` on CPU), then one correctness check; :func:`pairs_on_rank` times every
  ordered pair of ranks in turn.

torch is imported inside the functions that run on the ranks (and in :func:`plan`, to check a
dtype), never at import time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_distperf.config import format_size, parse_size
from pytest_distperf.records import CollectiveResult, CollectiveRow, PairMatrix, PairRow

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
#: Ops whose buffer is split into one chunk per rank: S must hold a whole number of chunks.
CHUNKED_OPS = frozenset({"all_gather", "reduce_scatter", "all_to_all"})
#: Ops that reduce (sum), and the root of the rooted ops: for the table's redop/root columns.
REDUCING_OPS = frozenset({"all_reduce", "reduce_scatter", "reduce"})
ROOT = 0

#: Default sweeps: 64 KiB .. 64 MiB by x4 on CPU, 64 KiB .. 1 GiB by x4 on GPU.
DEFAULT_SIZES_CPU = tuple(64 * 1024 * 4**i for i in range(6))
DEFAULT_SIZES_GPU = tuple(64 * 1024 * 4**i for i in range(8))
#: Default message of the pairwise matrix.
DEFAULT_PAIR_SIZE = {"cpu": 4 * 1024**2, "cuda": 64 * 1024**2}


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
@dataclasses.dataclass(frozen=True, slots=True)
class BenchSpec:
    """What every rank is asked to measure (sent to the ranks)."""

    op: str
    labels: tuple[str, ...]  # the sizes as asked for, as written in metric names
    counts: tuple[int, ...]  # elements in S for each size (S: see CollectiveRow)
    dtype: str  # torch dtype name, e.g. "float32"
    element_size: int
    warmup: int
    iters: int
    world_size: int


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


def plan(op: str, sizes: Any, dtype: Any, warmup: int, iters: int, *,
         world_size: int, device_type: str) -> BenchSpec:
    """Check every argument of ``bench`` before anything is sent to the ranks."""
    import torch

    check_op(op)
    for name, value, least in (("warmup", warmup, 0), ("iters", iters, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"bench({op!r}): {name} must be an int >= {least}, got {value!r}")
    if op == "send_recv" and world_size < 2:
        raise ValueError("bench('send_recv') needs at least 2 ranks (a ring: each rank sends "
                         "to rank+1 and receives from rank-1)")
    name = dtype_name(torch.float32 if dtype is None else dtype)
    element_size = getattr(torch, name).itemsize
    if op == "barrier":
        return BenchSpec(op, ("0B",), (0,), name, element_size, warmup, iters, world_size)
    resolved = resolve_sizes(sizes, device_type)
    counts = tuple(element_count(op, n, element_size, world_size) for _, n in resolved)
    return BenchSpec(op, tuple(label for label, _ in resolved), counts, name, element_size,
                     warmup, iters, world_size)


def build_result(spec: BenchSpec, per_rank: Sequence[Sequence[dict[str, Any]]], *,
                 backend: str, device_type: str) -> CollectiveResult:
    """The ranks' outcomes (``per_rank[rank][size]``) as rows with algbw and busbw."""
    factor = BUS_FACTORS[spec.op](spec.world_size)
    rows = []
    for i, (label, count) in enumerate(zip(spec.labels, spec.counts, strict=True)):
        outcomes = [rank_outcomes[i] for rank_outcomes in per_rank]
        per_rank_us = tuple(tuple(s * 1e6 for s in o["samples"]) for o in outcomes)
        samples_us = tuple(max(col) for col in zip(*per_rank_us, strict=True))
        time_us = statistics.median(samples_us)
        size_bytes = count * spec.element_size
        algbw = size_bytes / (time_us * 1e3) if time_us > 0 else 0.0  # bytes/us/1e3 = GB/s
        wrong = sum(int(o["wrong"]) for o in outcomes)
        first = next((o["first_wrong"] for o in outcomes if o["first_wrong"]), "")
        rows.append(CollectiveRow(label, size_bytes, count, time_us, algbw, algbw * factor,
                                  wrong, samples_us, per_rank_us, first))
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


def build_pairs(spec: BenchSpec, per_rank: Sequence[dict[str, Any]], *, backend: str,
                device_type: str) -> PairMatrix:
    """Merge the senders' samples and the receivers' checks into a :class:`PairMatrix`."""
    samples: dict[tuple[int, int], list[float]] = {}
    wrong: dict[tuple[int, int], int] = {}
    for outcome in per_rank:
        for (src, dst), values in outcome["sent"].items():
            samples[(src, dst)] = values
        for (src, dst), count in outcome["received"].items():
            wrong[(src, dst)] = count
    rows = []
    for (src, dst) in sorted(samples):
        us = tuple(s * 1e6 for s in samples[(src, dst)])
        t = statistics.median(us)
        size_bytes = spec.counts[0] * spec.element_size
        rows.append(PairRow(src, dst, t, size_bytes / (t * 1e3) if t > 0 else 0.0,
                            wrong.get((src, dst), 0), us))
    return PairMatrix(len(per_rank), backend, device_type, spec.dtype, spec.labels[0],
                      spec.counts[0] * spec.element_size, spec.warmup, spec.iters, tuple(rows))


# -- measuring (ranks) ----------------------------------------------------------------------
def _pattern(rank: Any, index: Any) -> Any:
    """The value rank ``rank`` contributes at global element ``index`` (int tensors): small
    whole numbers, exact in every dtype, that differ by rank and by position so that a
    misplaced chunk is caught as surely as a wrong sum."""
    return (rank % 8) + 1 + (index % 5)


def _rank_sum(world_size: int) -> int:
    return sum((k % 8) + 1 for k in range(world_size))


def _count_wrong(got: Any, expected: Any, world_size: int, where: str) -> tuple[int, str]:
    """Elements of ``got`` that differ from ``expected`` (exact ints), with the first one.

    Floating point sums are allowed ``world_size`` ulps of relative error (the order of a
    reduction may differ); integers must match exactly (after the dtype's wrap-around).
    """
    import torch

    dtype = got.dtype
    if dtype.is_floating_point:
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        want = expected.to(compute)
        tolerance = world_size * torch.finfo(dtype).eps
        bad = ~((got.to(compute) - want).abs() <= tolerance * want.abs())
    else:
        want = expected.to(dtype)
        bad = got != want
    wrong = int(bad.sum().item())
    if not wrong:
        return 0, ""
    index = int(torch.nonzero(bad.reshape(-1))[0].item())
    return wrong, (f"{where}: element {index} is {got.reshape(-1)[index].item()!r}, "
                   f"expected {want.reshape(-1)[index].item()!r}")


def _device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _setup(op: str, count: int, dtype: Any, device: Any
           ) -> tuple[Callable[[], Any], Callable[[], tuple[int, str]]]:
    """(run the op once, check it once) for one size on this rank.

    The buffers start zeroed, so that the timed loop (in place, repeated) neither overflows
    nor meets infinities.  The check fills them with :func:`_pattern`, runs the op, counts the
    wrong elements and zeroes them again.
    """
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    chunk = count // n if op in CHUNKED_OPS else count

    def arange(length: int, start: int = 0) -> Any:
        return torch.arange(start, start + length, dtype=torch.int32, device=device)

    def empty(length: int) -> Any:
        return torch.zeros(length, dtype=dtype, device=device)

    where = f"rank {rank}"
    fn: Callable[[], Any]
    fill: Callable[[], None]
    expect: Callable[[], tuple[Any, Any] | None]  # (tensor to check, expected int tensor)

    if op == "all_reduce":
        buf = empty(count)
        fn = lambda: dist.all_reduce(buf)  # noqa: E731
        fill = lambda: buf.copy_(_pattern(rank, arange(count)))  # noqa: E731
        expect = lambda: (buf, _rank_sum(n) + n * (arange(count) % 5))  # noqa: E731
        buffers = [buf]
    elif op == "all_gather":
        inp, out = empty(chunk), empty(count)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        fn = lambda: gather(out, inp)  # noqa: E731
        fill = lambda: inp.copy_(_pattern(rank, arange(chunk, rank * chunk)))  # noqa: E731
        expect = lambda: (out, _pattern(arange(count) // chunk, arange(count)))  # noqa: E731
        buffers = [inp, out]
    elif op == "reduce_scatter":
        inp, out = empty(count), empty(chunk)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        fn = lambda: scatter(out, inp)  # noqa: E731
        fill = lambda: inp.copy_(_pattern(rank, arange(count)))  # noqa: E731
        expect = lambda: (out, _rank_sum(n) + n * (arange(chunk, rank * chunk) % 5))  # noqa: E731
        buffers = [inp, out]
    elif op == "broadcast":
        buf = empty(count)
        fn = lambda: dist.broadcast(buf, src=ROOT)  # noqa: E731

        def fill() -> None:
            if rank == ROOT:
                buf.copy_(_pattern(ROOT, arange(count)))
            else:
                buf.zero_()

        expect = lambda: (buf, _pattern(ROOT, arange(count)))  # noqa: E731
        buffers = [buf]
    elif op == "reduce":
        buf = empty(count)
        fn = lambda: dist.reduce(buf, dst=ROOT)  # noqa: E731
        fill = lambda: buf.copy_(_pattern(rank, arange(count)))  # noqa: E731
        # only the root's buffer is defined afterwards
        expect = lambda: ((buf, _rank_sum(n) + n * (arange(count) % 5))  # noqa: E731
                          if rank == ROOT else None)
        buffers = [buf]
    elif op == "all_to_all":
        inp, out = empty(count), empty(count)
        fn = lambda: dist.all_to_all_single(out, inp)  # noqa: E731
        fill = lambda: inp.copy_(_pattern(rank, arange(count)))  # noqa: E731
        # chunk s of the output is chunk `rank` of rank s's input
        expect = lambda: (out, _pattern(arange(count) // chunk,  # noqa: E731
                                        rank * chunk + arange(count) % chunk))
        buffers = [inp, out]
    elif op == "send_recv":
        send, recv = empty(count), empty(count)
        nxt, prev = (rank + 1) % n, (rank - 1) % n

        def fn() -> None:
            ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        fill = lambda: send.copy_(_pattern(rank, arange(count)))  # noqa: E731
        expect = lambda: (recv, _pattern(prev, arange(count)))  # noqa: E731
        buffers = [send, recv]
    else:  # barrier
        fn = dist.barrier
        fill = lambda: None  # noqa: E731
        expect = lambda: None  # noqa: E731
        buffers = []

    def check() -> tuple[int, str]:
        for b in buffers:
            b.zero_()
        fill()
        fn()
        pair = expect()
        outcome = (0, "") if pair is None else _count_wrong(pair[0], pair[1], n, where)
        for b in buffers:
            b.zero_()
        return outcome

    return fn, check


def bench_on_rank(spec: BenchSpec) -> list[dict[str, Any]]:
    """What :meth:`DistGroup.bench` runs on every rank: per size, the warm-up and the timed
    loop (on zeroed buffers), then one correctness check, as nccl-tests orders them: the timed
    calls follow nothing but warm-up calls of the same op.  Returns per size
    ``{"samples": [s, ...], "wrong": n, "first_wrong": text}``."""
    import torch

    from pytest_distperf.timing import time_iterations
    from pytest_distperf.worker import set_phase

    dtype = getattr(torch, spec.dtype)
    device = _device()
    out: list[dict[str, Any]] = []
    for label, count in zip(spec.labels, spec.counts, strict=True):
        phase = f"bench {spec.op} {label}"
        set_phase(f"{phase}: allocating")
        fn, check = _setup(spec.op, count, dtype, device)
        samples = time_iterations(fn, warmup=spec.warmup, iters=spec.iters, phase=phase)
        set_phase(f"{phase}: checking the result")
        wrong, first = check()
        out.append({"samples": samples, "wrong": wrong, "first_wrong": first})
        del fn, check
    return out


def pairs_on_rank(count: int, dtype: str, warmup: int, iters: int) -> dict[str, Any]:
    """What :meth:`DistGroup.bench_pairs` runs on every rank.

    Every ordered pair (src, dst) in turn, the others waiting at a barrier: src sends
    ``count`` elements and waits for a one-element reply; each iteration's time is that round
    trip, timed on the sender (CUDA events on GPU).  The receiver checks the data once.
    Returns ``{"sent": {(src, dst): [s, ...]}, "received": {(src, dst): wrong}}``.
    """
    import torch
    import torch.distributed as dist

    from pytest_distperf.worker import set_phase

    rank, n = dist.get_rank(), dist.get_world_size()
    device = _device()
    on_cuda = device.type == "cuda"
    torch_dtype = getattr(torch, dtype)
    index = torch.arange(count, dtype=torch.int32, device=device)
    send = _pattern(rank, index).to(torch_dtype)
    recv = torch.zeros(count, dtype=torch_dtype, device=device)
    ack = torch.zeros(1, dtype=torch_dtype, device=device)
    sent: dict[tuple[int, int], list[float]] = {}
    received: dict[tuple[int, int], int] = {}
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            set_phase(f"bench_pairs {src}->{dst}: waiting for the other pairs")
            dist.barrier()
            if rank == src:
                set_phase(f"bench_pairs {src}->{dst}: sending")
                samples: list[float] = []
                for i in range(warmup + iters):
                    if on_cuda:
                        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                        start.record()
                        dist.send(send, dst)
                        dist.recv(ack, dst)
                        end.record()
                        end.synchronize()
                        seconds = start.elapsed_time(end) / 1e3
                    else:
                        t0 = time.perf_counter()
                        dist.send(send, dst)
                        dist.recv(ack, dst)
                        seconds = time.perf_counter() - t0
                    if i >= warmup:
                        samples.append(seconds)
                sent[(src, dst)] = samples
            elif rank == dst:
                set_phase(f"bench_pairs {src}->{dst}: receiving")
                recv.zero_()
                for _ in range(warmup + iters):
                    dist.recv(recv, src)
                    dist.send(ack, src)
                received[(src, dst)], _ = _count_wrong(recv, _pattern(src, index), n,
                                                       f"rank {dst} from {src}")
    set_phase("bench_pairs: done")
    dist.barrier()
    return {"sent": sent, "received": received}
