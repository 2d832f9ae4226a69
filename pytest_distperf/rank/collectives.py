"""The rank half of ``bench`` and ``bench_pairs``: nccl-tests' measurements on this rank.

:func:`bench_on_rank` runs, per size, a warm-up and a barrier-aligned timed loop, each call
followed by the host-speed control on CPU ranks
(:func:`~pytest_distperf.rank.clock.time_with_control`), then one correctness check, as
nccl-tests orders them; :func:`pairs_on_rank` times every ordered pair of ranks in turn.
Each op is one setup function in :data:`SETUPS`.  Replies are
:class:`~pytest_distperf.records.SizeOutcome` and
:class:`~pytest_distperf.records.PairOutcome`; the controller turns them into results
(:mod:`pytest_distperf.fixtures.collectives`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from pytest_distperf.rank.clock import Clock, rank_device, time_with_control
from pytest_distperf.rank.phase import set_phase
from pytest_distperf.records import CHUNKED_OPS, ROOT, BenchSpec, PairOutcome, SizeOutcome


def pattern(rank: Any, index: Any) -> Any:
    """The value rank ``rank`` contributes at global element ``index`` (int tensors): small
    whole numbers, exact in every dtype, that differ by rank and by position so that a
    misplaced chunk is caught as surely as a wrong sum."""
    return (rank % 8) + 1 + (index % 5)


def count_wrong(got: Any, expected: Any, world_size: int, where: str) -> tuple[int, str]:
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


@dataclasses.dataclass(frozen=True)
class _Ctx:
    """One size of one op on this rank: what every setup function needs."""

    op: str
    rank: int
    n: int  # ranks in the group
    count: int  # elements in S
    dtype: Any
    device: Any

    @property
    def chunk(self) -> int:
        return self.count // self.n if self.op in CHUNKED_OPS else self.count

    def index(self, length: int, start: int = 0) -> Any:
        import torch

        return torch.arange(start, start + length, dtype=torch.int32, device=self.device)

    def zeros(self, length: int) -> Any:
        import torch

        return torch.zeros(length, dtype=self.dtype, device=self.device)

    def summed(self, index: Any) -> Any:
        """What every rank's :func:`pattern` adds up to at ``index``."""
        return sum((k % 8) + 1 for k in range(self.n)) + self.n * (index % 5)


@dataclasses.dataclass(frozen=True)
class _Case:
    """One op at one size: ``run`` it (timed); ``fill`` the inputs with :func:`pattern`
    and ``expect()`` (the tensor to check, the expected ints), or None where this rank
    holds no defined result."""

    run: Callable[[], Any]
    buffers: tuple[Any, ...]
    fill: Callable[[], Any]
    expect: Callable[[], tuple[Any, Any] | None]


def _all_reduce(c: _Ctx) -> _Case:
    import torch.distributed as dist

    buf = c.zeros(c.count)
    return _Case(lambda: dist.all_reduce(buf), (buf,),
                 lambda: buf.copy_(pattern(c.rank, c.index(c.count))),
                 lambda: (buf, c.summed(c.index(c.count))))


def _all_gather(c: _Ctx) -> _Case:
    import torch.distributed as dist

    inp, out = c.zeros(c.chunk), c.zeros(c.count)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return _Case(lambda: gather(out, inp), (inp, out),
                 lambda: inp.copy_(pattern(c.rank, c.index(c.chunk, c.rank * c.chunk))),
                 lambda: (out, pattern(c.index(c.count) // c.chunk, c.index(c.count))))


def _reduce_scatter(c: _Ctx) -> _Case:
    import torch.distributed as dist

    inp, out = c.zeros(c.count), c.zeros(c.chunk)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return _Case(lambda: scatter(out, inp), (inp, out),
                 lambda: inp.copy_(pattern(c.rank, c.index(c.count))),
                 lambda: (out, c.summed(c.index(c.chunk, c.rank * c.chunk))))


def _broadcast(c: _Ctx) -> _Case:
    import torch.distributed as dist

    buf = c.zeros(c.count)

    def fill() -> None:
        if c.rank == ROOT:
            buf.copy_(pattern(ROOT, c.index(c.count)))
        else:
            buf.zero_()

    return _Case(lambda: dist.broadcast(buf, src=ROOT), (buf,), fill,
                 lambda: (buf, pattern(ROOT, c.index(c.count))))


def _reduce(c: _Ctx) -> _Case:
    import torch.distributed as dist

    buf = c.zeros(c.count)
    # only the root's buffer is defined afterwards
    return _Case(lambda: dist.reduce(buf, dst=ROOT), (buf,),
                 lambda: buf.copy_(pattern(c.rank, c.index(c.count))),
                 lambda: (buf, c.summed(c.index(c.count))) if c.rank == ROOT else None)


def _all_to_all(c: _Ctx) -> _Case:
    import torch.distributed as dist

    inp, out = c.zeros(c.count), c.zeros(c.count)
    # chunk s of the output is chunk `rank` of rank s's input
    return _Case(lambda: dist.all_to_all_single(out, inp), (inp, out),
                 lambda: inp.copy_(pattern(c.rank, c.index(c.count))),
                 lambda: (out, pattern(c.index(c.count) // c.chunk,
                                       c.rank * c.chunk + c.index(c.count) % c.chunk)))


def _send_recv(c: _Ctx) -> _Case:
    import torch.distributed as dist

    send, recv = c.zeros(c.count), c.zeros(c.count)
    nxt, prev = (c.rank + 1) % c.n, (c.rank - 1) % c.n

    def ring() -> None:
        ops = [dist.P2POp(dist.isend, send, nxt), dist.P2POp(dist.irecv, recv, prev)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return _Case(ring, (send, recv), lambda: send.copy_(pattern(c.rank, c.index(c.count))),
                 lambda: (recv, pattern(prev, c.index(c.count))))


def _barrier(c: _Ctx) -> _Case:
    import torch.distributed as dist

    return _Case(dist.barrier, (), lambda: None, lambda: None)


#: How each op of ``bench`` is set up on a rank (the ops of
#: :data:`pytest_distperf.fixtures.collectives.OPS`).
SETUPS: dict[str, Callable[[_Ctx], _Case]] = {
    "all_reduce": _all_reduce,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_to_all": _all_to_all,
    "send_recv": _send_recv,
    "barrier": _barrier,
}


def _check(ctx: _Ctx, case: _Case) -> tuple[int, str]:
    """Run the op once on :func:`pattern` inputs and count the wrong elements.

    The buffers start and end zeroed, so that the timed loop (in place, repeated) neither
    overflows nor meets infinities.
    """
    for b in case.buffers:
        b.zero_()
    case.fill()
    case.run()
    pair = case.expect()
    outcome = (0, "") if pair is None else count_wrong(pair[0], pair[1], ctx.n,
                                                       f"rank {ctx.rank}")
    for b in case.buffers:
        b.zero_()
    return outcome


def bench_on_rank(spec: BenchSpec) -> list[SizeOutcome]:
    """What :meth:`DistGroup.bench` runs on every rank: per size, the warm-up and the timed
    loop (on zeroed buffers), then one correctness check, as nccl-tests orders them: the timed
    calls follow nothing but warm-up calls of the same op."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, spec.dtype)
    device = rank_device()
    rank, n = dist.get_rank(), dist.get_world_size()
    out: list[SizeOutcome] = []
    for label, count in zip(spec.labels, spec.counts, strict=True):
        phase = f"bench {spec.op} {label}"
        set_phase(f"{phase}: allocating")
        ctx = _Ctx(spec.op, rank, n, count, dtype, device)
        case = SETUPS[spec.op](ctx)
        started = time.perf_counter()
        samples, controls, memory = time_with_control(
            case.run, warmup=spec.warmup, iters=spec.iters, phase=phase, control=spec.control)
        more = extra_iters(spec, time.perf_counter() - started, device)
        if more:
            extra = time_with_control(case.run, warmup=0, iters=more, phase=f"{phase} (more)",
                                      control=spec.control)
            samples, controls, memory = (samples + extra[0], controls + extra[1],
                                         memory + extra[2])
        set_phase(f"{phase}: checking the result")
        wrong, first = _check(ctx, case)
        out.append(SizeOutcome(tuple(samples), wrong, first, tuple(controls), tuple(memory)))
        del case
    return out


def extra_iters(spec: BenchSpec, took_s: float, device: Any) -> int:
    """How many more timed calls fill the size's ``min_time_s`` (at most ``max_iters`` in
    all), from how long the first ``warmup + iters`` took on the slowest rank: every rank
    gets the same figure (an all-reduce of it), so that all make the same calls."""
    if spec.min_time_s <= 0 or spec.max_iters <= spec.iters:
        return 0
    import torch
    import torch.distributed as dist

    slowest = torch.tensor([took_s], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_call = float(slowest.item()) / max(1, spec.warmup + spec.iters)
    wanted = math.ceil(spec.min_time_s / per_call) if per_call > 0 else spec.max_iters
    return max(0, min(wanted, spec.max_iters) - spec.iters)


def pairs_on_rank(count: int, dtype: str, warmup: int, iters: int) -> PairOutcome:
    """What :meth:`DistGroup.bench_pairs` runs on every rank.

    Every ordered pair (src, dst) in turn, the others waiting at a barrier: src sends
    ``count`` elements and waits for a one-element reply; each iteration's time is that round
    trip, timed on the sender (:class:`~pytest_distperf.rank.clock.Clock`).  The receiver
    checks the data once.
    """
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    clock = Clock()
    torch_dtype = getattr(torch, dtype)
    index = torch.arange(count, dtype=torch.int32, device=clock.device)
    send = pattern(rank, index).to(torch_dtype)
    recv = torch.zeros(count, dtype=torch_dtype, device=clock.device)
    ack = torch.zeros(1, dtype=torch_dtype, device=clock.device)
    sent: dict[tuple[int, int], tuple[float, ...]] = {}
    received: dict[tuple[int, int], int] = {}
    for src in range(n):
        for dst in range(n):
            if src == dst:
                continue
            set_phase(f"bench_pairs {src}->{dst}: waiting for the other pairs")
            dist.barrier()
            if rank == src:
                set_phase(f"bench_pairs {src}->{dst}: sending")

                def round_trip(peer: int = dst) -> None:
                    dist.send(send, peer)
                    dist.recv(ack, peer)

                times = [clock.elapsed(round_trip) for _ in range(warmup + iters)]
                sent[(src, dst)] = tuple(times[warmup:])
            elif rank == dst:
                set_phase(f"bench_pairs {src}->{dst}: receiving")
                recv.zero_()
                for _ in range(warmup + iters):
                    dist.recv(recv, src)
                    dist.send(ack, src)
                received[(src, dst)], _ = count_wrong(recv, pattern(src, index), n,
                                                      f"rank {dst} from {src}")
    set_phase("bench_pairs: done")
    dist.barrier()
    return PairOutcome(sent, received)
