"""From the ranks of a pipeline to its figures: the span, each stage's busy time, the
bubble against its schedule's theory, the slowest stage.  Pure: no torch, no pytest.

* The span of a step is the slowest rank's ``schedule.step()`` (every rank starts at a
  barrier); a rank's bubble is its idle share of it, 1 - busy / span, where busy is the
  time its forward and backward chunks computed (:mod:`pytest_distperf.rank.pipeline`).
* The pipeline's bubble is the mean of its ranks' bubbles, a median over steps; its
  utilisation is 1 - bubble.
* A rank's exposed communication is the time it idled with its next chunk's input
  computed already (:func:`exposed_comm`): the sends and receives between stages, and the
  schedule's own work between microbatches, that no compute hides.
* The theory (GPipe and 1F1B: (p - 1) / (m + p - 1); interleaved 1F1B with v stages per
  rank: (p - 1) / (v * m + p - 1)) assumes equal stages and free sends: the excess over it
  is what an unbalanced split, slow send/recv or per-microbatch overheads cost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pytest_distperf.analysis.analyzer import per_step_max
from pytest_distperf.analysis.findings import pipeline_bottlenecks, recommendations
from pytest_distperf.analysis.mesh import (
    dimension_counts,
    flops_per_step,
    samples_per_step,
    tp_communication,
)
from pytest_distperf.common.layout import Layout, coordinates
from pytest_distperf.common.quantiles import median
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.results.pipeline import PipelineTiming, StageTiming
from pytest_distperf.records import Chunk, RankPipeline


def bubble_theory(stages: int, microbatches: int, virtual: int = 1) -> float:
    """The idle share of a step that the schedule itself leaves: (p - 1) / (v * m + p - 1)
    for ``stages`` = p ranks with ``virtual`` = v stages each and m microbatches."""
    p, m, v = max(1, stages), max(1, microbatches), max(1, virtual)
    return (p - 1) / (v * m + p - 1)


def microbatches_for(stages: int, utilisation: float, virtual: int = 1) -> int:
    """The fewest microbatches whose theoretical bubble leaves ``utilisation`` of the step
    (v * m >= (p - 1) * u / (1 - u)); a utilisation of 1 or more is read as 0.99 (no
    number of microbatches reaches it)."""
    if stages <= 1:
        return 1
    u = min(max(utilisation, 0.0), 0.99)
    need = (stages - 1) * u / (1.0 - u) / max(1, virtual)
    return max(1, math.ceil(need - 1e-9))


def _producer(kind: str, stage: int, microbatch: int,
              last: int) -> tuple[str, int, int] | None:
    """The chunk whose output a chunk starts from: the previous stage's forward of the same
    microbatch; the next stage's backward (the last stage's own forward); a weight
    gradient's own backward.  None for the first stage's forwards."""
    if kind == "forward":
        return ("forward", stage - 1, microbatch) if stage > 0 else None
    if kind == "backward" and stage < last:
        return ("backward", stage + 1, microbatch)
    return ("forward" if kind == "backward" else "backward", stage, microbatch)


def exposed_comm(ranks: Sequence[Sequence[Chunk]], stages: int) -> list[float]:
    """Per rank of one pipeline (``ranks``: each rank's chunks of one step, in seconds
    after the step began), the seconds it idled with its next chunk's input computed
    already: from when both its previous chunk and the chunk it depends on had ended to
    when it began.  That is the sends and receives between stages and the schedule's own
    work between microbatches, which no compute hid; the rest of a rank's idle time is
    waiting for other stages to compute (the bubble proper)."""
    ends = {(kind, stage, mb): end for chunks in ranks for kind, stage, mb, _, end in chunks}
    out = []
    for chunks in ranks:
        free = idle = 0.0
        for kind, stage, mb, start, end in sorted(chunks, key=lambda c: c[3]):
            needs = _producer(kind, stage, mb, stages - 1)
            ready = max(free, ends.get(needs, 0.0) if needs else 0.0)
            idle += max(0.0, start - ready)
            free = max(free, end)
        out.append(idle)
    return out


def _exposed_by_rank(ranks: Sequence[RankPipeline], layout: Layout,
                     stages: int) -> dict[int, list[float]]:
    """Per rank, its :func:`exposed_comm` of every timed step, each data-parallel replica
    of the pipeline on its own (its ranks share every coordinate but ``pp``)."""
    replicas: dict[tuple[tuple[str, int], ...], list[RankPipeline]] = {}
    for r in ranks:
        where = coordinates(layout, r.rank)
        replicas.setdefault(tuple((n, c) for n, c in where.items() if n != "pp"), []).append(r)
    out: dict[int, list[float]] = {r.rank: [] for r in ranks}
    for members in replicas.values():
        for k in range(min(len(r.step_chunks) for r in members)):
            idle = exposed_comm([r.step_chunks[k] for r in members], stages)
            for r, seconds in zip(members, idle, strict=True):
                out[r.rank].append(seconds)
    return out


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 and math.isfinite(num / den) else 0.0


def _idle(r: RankPipeline, spans: Sequence[float]) -> list[float]:
    """Per step, the rank's idle share of the pipeline's span: 1 - busy / span."""
    return [1.0 - min(1.0, _ratio(b, s)) for b, s in zip(r.busy_s, spans, strict=False)]


def _stage_timings(ranks: Sequence[RankPipeline], layout: Layout, spans: Sequence[float],
                   exposed: Mapping[int, Sequence[float]]) -> list[StageTiming]:
    """Per rank its :class:`StageTiming`: medians over the steps."""
    out = []
    for r in ranks:
        out.append(StageTiming(
            rank=r.rank, pp_rank=coordinates(layout, r.rank).get("pp", 0), stages=r.stages,
            busy_s=median(r.busy_s) or 0.0, forward_s=median(r.forward_s) or 0.0,
            backward_s=median(r.backward_s) or 0.0, bubble=median(_idle(r, spans)) or 0.0,
            blocks=sum(r.blocks), exposed_comm_s=median(exposed.get(r.rank, ())) or 0.0))
    return out


def _per_step_mean(rows: Sequence[Sequence[float]]) -> tuple[float, ...]:
    """Per step, the mean over the rows (ranks) that have it."""
    steps = max((len(row) for row in rows), default=0)
    out = []
    for k in range(steps):
        values = [row[k] for row in rows if k < len(row)]
        out.append(sum(values) / len(values))
    return tuple(out)


def _by_pp_rank(per_stage: Sequence[StageTiming]) -> dict[int, tuple[float, int]]:
    """Per ``pp`` coordinate: the busiest of its data-parallel replicas, and its blocks."""
    out: dict[int, tuple[float, int]] = {}
    for s in per_stage:
        seen = out.get(s.pp_rank)
        if seen is None or s.busy_s > seen[0]:
            out[s.pp_rank] = (s.busy_s, s.blocks)
    return dict(sorted(out.items()))


def _controls(ranks: Sequence[RankPipeline], steps: int) -> dict[str, tuple[float, ...]]:
    """The slowest rank's host-speed controls per step, where every rank has one a step."""
    out: dict[str, tuple[float, ...]] = {}
    for key in ("control_s", "memory_control_s"):
        rows = [getattr(r, key) for r in ranks]
        if steps and all(len(row) == steps for row in rows):
            out[key] = per_step_max(rows)
    return out


def analyze_pipeline(per_rank: Sequence[RankPipeline], *, layout: Layout, schedule: str,
                     microbatches: int, virtual: int = 1,
                     limits: Mapping[str, float] | None = None) -> PipelineTiming:
    """Everything ``ddp_step_timer.pipeline`` reports, from the ranks' raw samples."""
    if not per_rank:
        raise ValueError("analyze_pipeline: no per-rank records to analyse")
    lim = resolve_thresholds(limits)
    ranks = sorted(per_rank, key=lambda r: r.rank)
    spans = per_step_max([r.schedule_s for r in ranks])
    steps = per_step_max([r.step_s for r in ranks])
    p = dict(layout).get("pp", 1)
    exposed = _exposed_by_rank(ranks, layout, p * virtual)
    per_stage = _stage_timings(ranks, layout, spans, exposed)
    bubbles = _per_step_mean([_idle(r, spans) for r in ranks])
    exposed_steps = _per_step_mean(list(exposed.values()))
    bubble, exposed_s = median(bubbles) or 0.0, median(exposed_steps) or 0.0
    theory = bubble_theory(p, microbatches, virtual)
    busy = _by_pp_rank(per_stage)
    slowest = max(busy, key=lambda k: busy[k][0])
    fastest = min(busy, key=lambda k: busy[k][0])
    mean = sum(b for b, _ in busy.values()) / len(busy)
    imbalance = _ratio(busy[slowest][0] - busy[fastest][0], mean)
    step_time = median(steps) or 0.0
    samples = samples_per_step(layout, [(r.rank, r.batch_size) for r in ranks])
    found = pipeline_bottlenecks(
        bubble=bubble, theory=theory, stages=p, microbatches=microbatches, virtual=virtual,
        schedule=schedule, busy=busy, imbalance=imbalance, limits=lim,
        needed=microbatches_for(p, lim["min_pipeline_utilisation"], virtual),
        ranks=tuple(s.rank for s in per_stage if s.pp_rank == slowest),
        exposed_s=exposed_s)
    counts = dimension_counts([r.mesh_comm for r in ranks], layout)
    share, tp_found = tp_communication(ranks, counts, step_time, lim)
    found += tp_found
    return PipelineTiming(
        world_size=len(ranks), mesh=layout, schedule=schedule, microbatches=microbatches,
        virtual=virtual, steps=len(steps), step_time_s=step_time,
        schedule_time_s=median(spans) or 0.0, throughput=_ratio(samples, step_time),
        bubble=bubble, utilisation=1.0 - bubble, bubble_theory=theory,
        exposed_comm_s=exposed_s,
        excess_bubble=bubble - theory, stage_ratio=_ratio(busy[slowest][0], busy[fastest][0]),
        stage_imbalance=imbalance, slowest_stage=slowest, per_stage=per_stage,
        bottlenecks=found, recommendations=recommendations(found),
        mesh_counts=counts, tp_comm_share=share,
        flops_per_step=flops_per_step([(r.rank, r.flops) for r in ranks]),
        samples={"step_s": steps, "schedule_s": spans, "bubble": tuple(bubbles),
                 "utilisation": tuple(1.0 - b for b in bubbles),
                 "throughput": tuple(_ratio(samples, s) for s in steps),
                 "exposed_comm_s": exposed_steps,
                 **_controls(ranks, len(steps))},
        raw=list(ranks))
