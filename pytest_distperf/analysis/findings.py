"""The analyzer's rules: what limits a step or a profiled call, and what to do about it.

One set of rules for every fixture: ``ddp_step_timer``
(:mod:`~pytest_distperf.analysis.analyzer`) and ``dist_profiler``
(:mod:`~pytest_distperf.analysis.traces.analysis`) report the same finding in the same words,
over a :class:`Span` that says what the figures cover (a training step, or the whole profiled
call).  Pure: no torch, no pytest.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from pytest_distperf.analysis.topology import SLOW_LINK_RATIO, ranks_by_node
from pytest_distperf.common.quantiles import median_or_nan
from pytest_distperf.common.shares import MIN_BATCH_SHARE, pasteable
from pytest_distperf.config import format_bytes, resolve_thresholds
from pytest_distperf.fixtures.results.findings import Bottleneck
from pytest_distperf.fixtures.results.group import NodeSplit
from pytest_distperf.fixtures.results.steps import (
    CommCount,
    LoadBalance,
    RankTiming,
    ScalingPoint,
)

#: Below this overlap (hidden / total communication) a communication-heavy span is flagged.
MIN_OVERLAP = 0.5
#: Exposed communication below this fraction of the span is never worth a low-overlap
#: finding (nor below half the max_comm_overhead limit).
NOTICEABLE_COMM = 0.05
#: Peak memory above this fraction of the capacity is a memory bottleneck.
MEMORY_LIMIT = 0.90
#: "Many small messages": at least this many calls of one collective, ...
SMALL_MESSAGE_CALLS = 16
#: ... averaging under this many bytes, ...
SMALL_MESSAGE_BYTES = 64 * 1024
#: ... taking at least this share of the communication time.
SMALL_MESSAGE_SHARE = 0.2
#: A GPU busy less than this share of a step leaves the step's time to the host.
MIN_DEVICE_BUSY = 0.5
#: A pipeline bubble this far above its schedule's theory is a finding even where the
#: utilisation holds: a few points are sends and per-microbatch overheads.
EXCESS_BUBBLE = 0.05
#: Bottleneck kinds, in the order findings are recommended at equal severity.
KINDS = ("desync", "communication", "tp_communication", "low_overlap", "imbalance",
         "straggler", "stage_imbalance", "pipeline_bubble", "memory", "launch_bound",
         "small_messages", "low_scaling", "slow_node", "slow_link")

GENERIC_SUGGESTIONS: dict[str, str] = {
    "communication": (
        "overlap it with compute (DDP gradient bucketing and a smaller bucket_cap_mb, "
        "async_op=True with a late wait(), no find_unused_parameters), send less (a bf16/fp16 "
        "compression comm hook), or synchronise less per sample (a larger per-rank batch, "
        "gradient accumulation under no_sync()); on GPUs check the links with "
        "nccl_group.bench"),
    "low_overlap": (
        "communication waits for the end of the work it could hide behind: issue collectives "
        "with async_op=True and wait() only where the result is needed; with DDP avoid "
        "find_unused_parameters=True, try static_graph=True and a smaller bucket_cap_mb so the "
        "first buckets leave during backward, and keep extra work out of backward hooks"),
    "imbalance": (
        "give every rank the same amount of work: equal batch shapes (padding, bucketing by "
        "sequence length), or per-rank batch shares proportional to measured throughput"),
    "straggler": (
        "look at what else runs on that rank's device or host (other processes, data "
        "loading, thermal throttling, a slower device or link); meanwhile give it a smaller "
        "share of the batch"),
    "memory": (
        "lower the peak: activation checkpointing, a smaller per-rank batch, mixed precision, "
        "or sharding parameters, gradients and optimizer state (FSDP)"),
    "launch_bound": (
        "give the GPU more work per launch (a larger per-rank batch or model), or launch less "
        "(torch.compile, CUDA graphs, fused optimizers such as foreach=True); until then the "
        "step's time is the host's Python and kernel launches, which vary from run to run, so "
        "gate on the exact counts rather than on its times"),
    "tp_communication": (
        "reduce the TP size (keep TP inside a node, on its fastest links), use sequence "
        "parallelism (a reduce-scatter and an all-gather in place of each all-reduce, with "
        "activations sharded between them), or overlap TP communication with compute "
        "(async TP, torch.compile's collective micro-pipelining)"),
    "stage_imbalance": (
        "move work from the slowest pipeline stage to the fastest (a different split "
        "point: fewer blocks on the slow stage)"),
    "pipeline_bubble": (
        "more microbatches per step (the schedule's bubble shrinks as (p - 1) / (m + p - 1)), "
        "an interleaved schedule (virtual stages), balanced stages, and cheaper sends "
        "between them"),
    "low_scaling": (
        "find what grows with the world size: communication (see comm_overhead per world "
        "size), imbalance between ranks, or fixed per-step costs that more ranks cannot share"),
    "desync": (
        "make every rank issue the same collectives in the same order (a mismatch hangs "
        "NCCL or silently mixes data); no other figure of this profile is trustworthy "
        "until then"),
    "slow_node": (
        "check that node's network: its NIC and cable, the switch port, the negotiated link "
        "speed and error counters (ethtool, ibstat), traffic shaping (tc qdisc show), and the "
        "interface NCCL or gloo picked (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); the links "
        "between the other nodes are the healthy reference"),
    "slow_link": (
        "check the path between those two nodes: cables, switch ports and routing between "
        "them, and both nodes' NICs"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """What the figures of a finding cover, as the words say it."""

    per: str  # after a time: " per step", or "" for one whole call
    whole: str  # "the step", "the profiled call"


STEP = Span(" per step", "the step")
PROFILED_CALL = Span("", "the profiled call")


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a finding's text (three significant digits)."""
    return f"{seconds * 1e3:.3g} ms"


def severity(value: float, limit: float, *, higher_is_worse: bool = True) -> str:
    """``low``, ``medium`` or ``high``: how far ``value`` is past ``limit`` (x1.25, x2)."""
    if higher_is_worse:
        ratio = value / limit if limit > 0 else (math.inf if value > 0 else 1.0)
    else:
        ratio = limit / value if value > 0 else math.inf
    if ratio >= 2.0:
        return "high"
    return "medium" if ratio >= 1.25 else "low"


def format_shares(shares: Sequence[float]) -> str:
    return ", ".join(f"rank {r}: {s:.0%}" for r, s in enumerate(shares))


# -- communication -----------------------------------------------------------------------------
def communication_bottlenecks(comm_overhead: float, span_s: float, comm_time_s: float | None,
                              overlap: float | None, limits: Mapping[str, float], *,
                              span: Span = STEP, where: str = "",
                              detail: str = "") -> list[Bottleneck]:
    """``communication`` when the exposed share reaches its limit; ``low_overlap`` when a
    span with a noticeable exposed share (half the limit) hides less than MIN_OVERLAP of its
    communication.  ``where`` names the rank the figures are from; ``detail`` ends the
    description (what the communication was)."""
    out: list[Bottleneck] = []
    limit = limits["max_comm_overhead"]
    exposed = comm_overhead * span_s
    if comm_overhead >= limit:
        total = f", {ms(comm_time_s)} in all" if comm_time_s else ""
        out.append(Bottleneck(
            "communication", severity(comm_overhead, limit), (),
            f"exposed communication (not hidden behind compute) is {comm_overhead:.0%} of "
            f"{span.whole}{where} ({ms(exposed)} of {ms(span_s)}{span.per}{total}); limit "
            f"{limit:.0%}{detail}",
            GENERIC_SUGGESTIONS["communication"], comm_overhead, limit))
    if (overlap is not None and overlap < MIN_OVERLAP and comm_time_s
            and comm_overhead >= max(limit / 2, NOTICEABLE_COMM)):
        out.append(Bottleneck(
            "low_overlap", severity(overlap, MIN_OVERLAP, higher_is_worse=False), (),
            f"only {overlap:.0%} of the {ms(comm_time_s)} of communication{span.per} is "
            f"hidden behind computation{where}", GENERIC_SUGGESTIONS["low_overlap"],
            overlap, MIN_OVERLAP))
    return out


def small_message_bottlenecks(collectives: Sequence[tuple[str, int, int, float]]
                              ) -> list[Bottleneck]:
    """``small_messages`` for a collective called often with small messages that takes a
    large share of the communication time; ``collectives``: (name, calls, bytes, seconds)."""
    total = sum(seconds for _, _, _, seconds in collectives)
    out: list[Bottleneck] = []
    for name, calls, nbytes, seconds in collectives:
        if (calls >= SMALL_MESSAGE_CALLS and nbytes / calls < SMALL_MESSAGE_BYTES
                and name != "barrier" and total > 0 and seconds >= SMALL_MESSAGE_SHARE * total):
            out.append(Bottleneck(
                "small_messages", "low", (),
                f"{calls} {name} calls of {format_bytes(nbytes / calls)} on average take "
                f"{seconds / total:.0%} of the communication time: small messages are bound "
                f"by latency, not bandwidth",
                f"fuse the {name} calls into fewer, larger ones (one flat buffer, DDP "
                f"buckets, torch.distributed's coalescing)", seconds / total,
                SMALL_MESSAGE_SHARE))
    return out


def desync_bottleneck(desync: str, ranks: Sequence[int]) -> list[Bottleneck]:
    """``desync`` when the ranks ran different collectives (``desync`` says how)."""
    if not desync:
        return []
    return [Bottleneck("desync", "high", tuple(ranks), desync, GENERIC_SUGGESTIONS["desync"])]


# -- balance ---------------------------------------------------------------------------------
def balance_bottlenecks(balance: LoadBalance, shares: Sequence[float],
                        limits: Mapping[str, float], *, span: Span = STEP,
                        ranks: Sequence[int] = ()) -> list[Bottleneck]:
    """``imbalance`` for the group and one ``straggler`` per straggling rank.

    ``balance`` holds per-position figures; ``ranks`` names the rank at each position (by
    default position i is rank i).
    """
    limit = limits["max_imbalance"]
    if balance.imbalance < limit or len(balance.compute_s) < 2:
        return []
    name = list(ranks) if ranks else list(range(len(balance.compute_s)))
    valid = [i for i in range(len(balance.compute_s)) if i not in balance.missing]
    computes = [balance.compute_s[i] for i in valid]
    slowest = valid[max(range(len(computes)), key=lambda k: computes[k])]
    involved = balance.stragglers or (slowest,)
    waiting = [i for i in valid if i not in involved and balance.wait_s[i] > 0]
    wait_text = ""
    if waiting:
        worst = max(waiting, key=lambda i: balance.wait_s[i])
        wait_text = (f"; rank {name[worst]} waits {ms(balance.wait_s[worst])}{span.per} "
                     f"({balance.idle_fraction[worst]:.0%} of {span.whole})")
    slow = ", ".join(str(name[i]) for i in balance.stragglers)
    named = f"; straggler: rank {slow}" if slow else ""
    out = [Bottleneck(
        "imbalance", severity(balance.imbalance, limit), tuple(name[i] for i in involved),
        f"per-rank compute differs by {balance.imbalance:.0%} of the mean (cv "
        f"{balance.cv:.2f}; fastest {ms(min(computes))}, slowest {ms(max(computes))}"
        f"{span.per}){named}{wait_text}; limit {limit:.0%}",
        imbalance_suggestion([name[i] for i in involved], shares),
        balance.imbalance, limit)]
    for i in balance.stragglers:
        others = [balance.compute_s[o] for o in valid if o not in balance.stragglers]
        mid = median_or_nan(others or computes)
        slower = (balance.compute_s[i] - mid) / mid if mid > 0 else 0.0
        out.append(Bottleneck(
            "straggler", severity(balance.imbalance, limit), (name[i],),
            f"rank {name[i]} computes {slower:.0%} longer than the other ranks' median "
            f"({ms(balance.compute_s[i])} vs {ms(mid)}{span.per}) and waits least "
            f"({ms(balance.wait_s[i])}{span.per}): the other ranks wait for it",
            f"look at what else runs on rank {name[i]}'s device or host (other processes, "
            f"data loading, thermal throttling, a slower device or link)"
            + (f"; meanwhile shift work away from it ({format_shares(shares)})"
               if shares else ""),
            slower, limit / 2))
    return out


def imbalance_suggestion(ranks: Sequence[int], shares: Sequence[float]) -> str:
    """What to do about an imbalance: the batch shares, and where to look."""
    text = ""
    if shares:
        text = (f"rebalance the per-rank batch to {format_shares(shares)} of the global batch "
                f"(proportional to measured throughput, each at least "
                f"{MIN_BATCH_SHARE:.0%}: ddp_step_timer(..., batch_shares={pasteable(shares)}), "
                f"or batch_shares='auto' to measure them first); ")
    who = ", ".join(map(str, ranks))
    if not ranks:
        return text + GENERIC_SUGGESTIONS["imbalance"]
    return text + (f"or find why rank(s) {who} compute longer (other processes, data loading, "
                   f"thermal throttling, uneven inputs, a slower device)")


def memory_bottlenecks(per_rank: Sequence[RankTiming],
                       limit: float = MEMORY_LIMIT) -> list[Bottleneck]:
    """``memory`` when a rank's peak reaches ``limit`` of its capacity (where it is known)."""
    fractions = {r.rank: r.peak_memory_bytes / r.memory_capacity_bytes
                 for r in per_rank if r.memory_capacity_bytes > 0 and r.peak_memory_bytes > 0}
    high = {r: f for r, f in fractions.items() if f >= limit}
    if not high:
        return []
    worst = max(high, key=lambda r: high[r])
    frac = high[worst]
    level = "high" if frac >= 0.97 else "medium" if frac >= 0.93 else "low"
    source = next((r.memory_source for r in per_rank if r.rank == worst), "")
    return [Bottleneck(
        "memory", level, tuple(sorted(high)),
        f"peak memory reaches {frac:.0%} of the capacity on rank {worst} ({source}); "
        f"limit {limit:.0%}", GENERIC_SUGGESTIONS["memory"], frac, limit)]


def launch_bottlenecks(device_busy: float | None, step_time_s: float,
                       limit: float = MIN_DEVICE_BUSY) -> list[Bottleneck]:
    """``launch_bound`` when the GPU runs kernels for less than ``limit`` of the step."""
    if device_busy is None or device_busy >= limit:
        return []
    return [Bottleneck(
        "launch_bound", severity(device_busy, limit, higher_is_worse=False), (),
        f"the GPU runs kernels {device_busy:.0%} of the step ({ms(device_busy * step_time_s)} "
        f"of {ms(step_time_s)}): the rest is the host launching them; limit {limit:.0%}",
        GENERIC_SUGGESTIONS["launch_bound"], device_busy, limit)]


# -- tensor parallelism ------------------------------------------------------------------------
def tp_bottlenecks(share: float | None, step_time_s: float, counts: Sequence[CommCount],
                   limits: Mapping[str, float]) -> list[Bottleneck]:
    """``tp_communication`` when the ranks are blocked in TP collectives for
    ``max_tp_comm_share`` of the step or more; ``counts``: the ``tp`` dimension's."""
    limit = limits["max_tp_comm_share"]
    if share is None or share < limit:
        return []
    what = ", ".join(f"{c.calls} {c.op} of {format_bytes(c.bytes / c.calls)}"
                     for c in counts if c.calls)
    advice = GENERIC_SUGGESTIONS["tp_communication"]
    if any(c.op == "reduce_scatter" and c.calls for c in counts):  # sequence parallel runs
        advice = ("reduce the TP size (keep TP inside a node, on its fastest links) or overlap "
                  "TP communication with compute (async TP, torch.compile's collective "
                  "micro-pipelining); the tp reduce-scatters show sequence parallelism runs")
    return [Bottleneck(
        "tp_communication", severity(share, limit), (),
        f"tensor-parallel collectives block {share:.0%} of the step ({ms(share * step_time_s)} "
        f"of {ms(step_time_s)} per step: {what or 'none counted'}); limit {limit:.0%}",
        advice, share, limit)]


# -- pipelines -------------------------------------------------------------------------------
def stage_bottlenecks(busy: Mapping[int, tuple[float, int]], imbalance: float,
                      limits: Mapping[str, float],
                      ranks: Sequence[int] = ()) -> list[Bottleneck]:
    """``stage_imbalance`` when the pipeline's stages (``busy``: ``pp`` coordinate ->
    (busy seconds per step, its blocks)) differ by ``max_imbalance`` of their mean: the
    slowest named, and how many of its blocks to move to the fastest."""
    limit = limits["max_imbalance"]
    if len(busy) < 2 or imbalance < limit:
        return []
    slow = max(busy, key=lambda k: busy[k][0])
    fast = min(busy, key=lambda k: busy[k][0])
    (slow_s, blocks), fast_s = busy[slow], busy[fast][0]
    ratio = slow_s / fast_s if fast_s > 0 else math.inf
    if blocks >= 2:
        # moving k blocks of b = slow_s / blocks each evens the two when slow - k b = fast + k b
        k = min(blocks - 1, max(1, round((slow_s - fast_s) / (2 * slow_s / blocks))))
        move = f"move {k} of its {blocks} blocks to stage {fast}"
    else:
        move = (f"move about {(slow_s - fast_s) / (2 * slow_s):.0%} of its work to stage "
                f"{fast} (a different split point)")
    return [Bottleneck(
        "stage_imbalance", severity(imbalance, limit), tuple(ranks),
        f"pipeline stage {slow} takes {ratio:.2f}x stage {fast} ({ms(slow_s)} vs "
        f"{ms(fast_s)} of forward and backward per step): every other stage waits for it; "
        f"the stages differ by {imbalance:.0%} of their mean, limit {limit:.0%}",
        f"stage {slow} takes {ratio:.1f}x stage {fast}: {move}", imbalance, limit)]


def pipeline_bottlenecks(*, bubble: float, theory: float, stages: int, microbatches: int,
                         virtual: int, schedule: str, busy: Mapping[int, tuple[float, int]],
                         imbalance: float, limits: Mapping[str, float], needed: int,
                         ranks: Sequence[int] = (), exposed_s: float = 0.0) -> list[Bottleneck]:
    """``stage_imbalance`` (:func:`stage_bottlenecks`), and ``pipeline_bubble`` when the
    utilisation (1 - ``bubble``) is below ``min_pipeline_utilisation`` or the bubble exceeds
    the schedule's ``theory`` by ``EXCESS_BUBBLE``, saying why: an unbalanced split, the
    sends and per-microbatch overheads, or too few microbatches (``needed`` reach the
    limit in theory)."""
    out = stage_bottlenecks(busy, imbalance, limits, ranks)
    limit = limits["min_pipeline_utilisation"]
    excess = bubble - theory
    if 1.0 - bubble >= limit and excess < EXCESS_BUBBLE:
        return out
    if excess >= EXCESS_BUBBLE and out:
        cause, what = ("an unbalanced stage split", out[0].suggestion)
    elif excess >= EXCESS_BUBBLE:
        cause, what = ("neither the schedule nor the split: the sends between stages or "
                       f"per-microbatch overheads (a stage idled {ms(exposed_s)} a step on "
                       "average with its next input computed already)",
                       "look at comm.pp.* (bytes per microbatch) and what each microbatch "
                       "costs besides its compute; fewer, larger microbatches if that is it")
    else:
        cause, what = (f"too few microbatches: the schedule alone idles {theory:.0%}",
                       f"use at least {needed} microbatches (the theory's bubble is then "
                       f"within {1 - limit:.0%}), or an interleaved schedule (virtual stages)")
    per_rank = f", {virtual} stages per rank" if virtual > 1 else ""
    level = (severity(1.0 - bubble, limit, higher_is_worse=False) if 1.0 - bubble < limit
             else "low")
    out.append(Bottleneck(
        "pipeline_bubble", level, tuple(ranks) if out else (),
        f"pipeline utilisation is {1 - bubble:.0%}: the stages idle {bubble:.0%} of the "
        f"step; {schedule}'s theory for {stages} stages{per_rank} and {microbatches} "
        f"microbatches is {theory:.0%}, {excess * 100:+.0f} points; why: {cause}; limit "
        f"{limit:.0%}", what, 1.0 - bubble, limit))
    return out


# -- scaling ---------------------------------------------------------------------------------
def scaling_bottlenecks(points: Sequence[ScalingPoint], mode: str,
                        limits: Mapping[str, float]) -> list[Bottleneck]:
    """``low_scaling`` for each world size below ``min_scaling_efficiency``, with the likely
    cause: growing communication, imbalance, or neither (fixed per-step costs)."""
    if not points:
        return []
    limit = limits["min_scaling_efficiency"]
    base = points[0]
    out: list[Bottleneck] = []
    for p in points[1:]:
        if p.efficiency >= limit:
            continue
        cause, suggestion = scaling_cause(p, base, mode, limits)
        out.append(Bottleneck(
            "low_scaling", severity(p.efficiency, limit, higher_is_worse=False), (),
            f"{mode} scaling efficiency at {p.world_size} ranks is {p.efficiency:.2f} "
            f"(speedup {p.speedup:.2f}x over {base.world_size}); limit {limit:.2f}; {cause}",
            suggestion, p.efficiency, limit))
    return out


def scaling_cause(point: ScalingPoint, base: ScalingPoint, mode: str,
                  limits: Mapping[str, float]) -> tuple[str, str]:
    """Why ``point`` scales worse than ``base``, and what to do: (cause, suggestion)."""
    lim = resolve_thresholds(limits)
    if not point.step_time_s > 0:
        return ("its step time was not measured",
                "measure again: no step time was recorded at this world size")
    if point.comm_overhead - base.comm_overhead >= 0.1:
        return (f"communication grows from {base.comm_overhead:.0%} to "
                f"{point.comm_overhead:.0%} of the step", GENERIC_SUGGESTIONS["communication"])
    if point.imbalance >= lim["max_imbalance"]:
        return (f"the ranks are unbalanced ({point.imbalance:.0%})",
                GENERIC_SUGGESTIONS["imbalance"])
    if mode == "strong":
        cause = ("neither communication nor imbalance explains it: per-step work that does not "
                 "shrink with more ranks (fixed costs, a per-rank batch too small to keep a "
                 "device busy)")
    else:
        cause = ("neither communication nor imbalance explains it: shared host resources "
                 "(cores, memory bandwidth, data loading) or fixed per-step costs")
    return cause, GENERIC_SUGGESTIONS["low_scaling"]


# -- nodes and the links between them ----------------------------------------------------------
def node_bottlenecks(split: NodeSplit) -> list[Bottleneck]:
    """``slow_node`` for each node :func:`~pytest_distperf.analysis.topology.split_by_node` named,
    naming its ranks; ``slow_link`` for each slow link between nodes that no slow node
    explains.  With two nodes a slow link cannot be pinned on either node, and says so."""
    out: list[Bottleneck] = []
    limit = 1 / SLOW_LINK_RATIO
    for s in split.slow_nodes:
        way = {(True, False): "send to", (False, True): "receive from"}.get(
            (s.sends, s.receives), "send to and receive from")
        out.append(Bottleneck(
            "slow_node", severity(s.factor, limit), s.ranks,
            f"{s.node} with {_ranks(s.ranks)} is slow to {way} the other nodes: its best link "
            f"reaches {s.best_gbps:.3g} GB/s, {s.factor:.3g}x below the {s.typical_gbps:.3g} "
            f"GB/s of the links between the other nodes (best case of every round trip, "
            f"{split.label} messages)", GENERIC_SUGGESTIONS["slow_node"], s.factor, limit))
    two_nodes = len(set(split.nodes)) == 2
    by_node = ranks_by_node(split.nodes)
    for link in split.slow_links:
        factor = (split.typical_link_gbps / link.fast_gbps if link.fast_gbps > 0
                  else math.inf)
        ranks = tuple(sorted(by_node[link.src] + by_node[link.dst]))
        if two_nodes:
            why = (f"; with two nodes this cannot be pinned on one of them ({link.src} slow "
                   f"to send, or {link.dst} slow to receive): a third node tells them apart")
        else:
            why = "; the other links of both nodes are not slow: suspect the path between them"
        out.append(Bottleneck(
            "slow_link", severity(factor, limit), ranks,
            f"the link from {link.src} to {link.dst} reaches {link.fast_gbps:.3g} GB/s, "
            f"{factor:.3g}x below the typical link between nodes "
            f"({split.typical_link_gbps:.3g} GB/s; best case of every round trip, "
            f"{split.label} messages){why}", GENERIC_SUGGESTIONS["slow_link"], factor, limit))
    return out


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


# -- what to do --------------------------------------------------------------------------------
_SEVERITY_ORDER = {"high": 0, "medium": 1, "low": 2}


def recommendations(bottlenecks: Sequence[Bottleneck],
                    shares: Sequence[float] = ()) -> list[str]:
    """One line per distinct suggestion, most severe first; the batch shares when suggested."""
    out: list[str] = []
    ordered = sorted(bottlenecks, key=lambda b: (_SEVERITY_ORDER.get(b.severity, 3),
                                                 KINDS.index(b.kind) if b.kind in KINDS else 9))
    for b in ordered:
        where = f" (ranks {', '.join(map(str, b.ranks))})" if b.ranks else ""
        line = f"{b.kind}{where}: {b.suggestion}"
        if line not in out:
            out.append(line)
    if shares and not any("rebalance the per-rank batch" in line for line in out):
        out.append(f"batch shares: {format_shares(shares)}")
    return out


def hint(bottlenecks: Sequence[Bottleneck], kind: str, *, stragglers: Sequence[int] = (),
         shares: Sequence[float] = ()) -> str:
    """The suggestion for a metric's breach: the finding of that kind, or a generic one."""
    for b in bottlenecks:
        if b.kind == kind:
            return b.suggestion
    if kind == "imbalance":
        return imbalance_suggestion(stragglers, shares)
    return GENERIC_SUGGESTIONS.get(kind, "")
