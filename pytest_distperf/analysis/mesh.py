"""A step on a mesh, by dimension: exact collective counts per mesh dimension, and the
step's samples and FLOPs each counted once.  Pure: no torch, no pytest.

* Counts: every rank counts its collectives by the process group they ran on
  (:func:`pytest_distperf.rank.mesh.comm_counter`); per (dimension, collective) the most any
  rank issued, as for the whole step (:func:`~pytest_distperf.analysis.traces.census.count_ops`).
* Samples: the ranks of a TP, PP or CP group share one batch
  (:data:`~pytest_distperf.common.layout.MODEL_DIMS`), so a step's samples are the batches
  of the ranks at coordinate 0 on those dimensions: dp x tp = 2 x 2 with 8 rows a rank
  trains 16 samples a step, not 32.
* FLOPs: every rank counts the FLOPs it computed (a TP rank those of its shard: the
  collective counter lets DTensor split each op before the flop counter sees it), so a
  step's FLOPs are the sum over the ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pytest_distperf.analysis.findings import recommendations, tp_bottlenecks
from pytest_distperf.common.layout import Layout, counted_once
from pytest_distperf.common.names import canonical_collective
from pytest_distperf.common.quantiles import median
from pytest_distperf.config import resolve_thresholds
from pytest_distperf.fixtures.results.findings import Bottleneck
from pytest_distperf.fixtures.results.steps import CommCount, StepTiming
from pytest_distperf.records import DimComm, RankPipeline, RankStep


def dimension_counts(per_rank: Sequence[Sequence[DimComm]],
                     layout: Layout = ()) -> tuple[CommCount, ...]:
    """Calls and bytes per (mesh dimension, collective), the most any rank issued; the
    dimension is the count's ``group``.  In the layout's order of dimensions (then
    ``other``), by collective name."""
    totals: dict[tuple[str, str], tuple[int, int]] = {}
    for counts in per_rank:
        mine: dict[tuple[str, str], tuple[int, int]] = {}
        for c in counts:
            key = (c.dim, canonical_collective(c.op))
            calls, nbytes = mine.get(key, (0, 0))
            mine[key] = (calls + c.calls, nbytes + c.bytes)
        for key, (calls, nbytes) in mine.items():
            seen = totals.get(key, (0, 0))
            totals[key] = (max(seen[0], calls), max(seen[1], nbytes))
    order = [name for name, _ in layout]

    def place(key: tuple[str, str]) -> tuple[int, str, str]:
        dim, op = key
        return (order.index(dim) if dim in order else len(order), dim, op)

    return tuple(CommCount(op=op, calls=calls, bytes=nbytes, group=dim)
                 for (dim, op), (calls, nbytes) in sorted(totals.items(),
                                                          key=lambda kv: place(kv[0])))


def samples_per_step(layout: Layout, batch_sizes: Sequence[tuple[int, int]]) -> int:
    """The samples one step trains, each once: the batches of the ranks that stand for
    their TP/PP/CP group.  ``batch_sizes``: (rank, its batch size)."""
    return sum(max(0, size) for rank, size in batch_sizes if counted_once(layout, rank))


def flops_per_step(flops: Sequence[tuple[int, int]]) -> int:
    """A step's FLOPs: the sum of what each rank computed; 0 where some rank's FLOPs were
    not counted.  ``flops``: (rank, its count)."""
    if not flops or not all(count for _, count in flops):
        return 0
    return sum(count for _, count in flops)


def tp_communication(ranks: Sequence[RankStep | RankPipeline], counts: Sequence[CommCount],
                     step_time_s: float, limits: Mapping[str, float]
                     ) -> tuple[float | None, list[Bottleneck]]:
    """``tp_comm_share``: the share of the counted step the median rank is blocked in TP
    collectives (issuing them and waiting for their results), each rank's against its own
    counted step (the counters slow it, so no other step's time is comparable), at most 1;
    None where no rank timed any (GPU ranks, or no TP collective).  With its finding."""
    shares = [sum(c.seconds for c in r.mesh_comm if c.dim == "tp") / r.counted_step_s
              for r in ranks if r.counted_step_s > 0]
    share = min(1.0, median(shares) or 0.0) if any(shares) else None
    return share, tp_bottlenecks(share, step_time_s, [c for c in counts if c.group == "tp"],
                                 limits)


def on_mesh(timing: StepTiming, layout: Layout,
            limits: Mapping[str, float] | None = None) -> StepTiming:
    """``timing`` (from :func:`~pytest_distperf.analysis.analyzer.analyze_steps`) with the
    layout, the counts by dimension, throughput and FLOPs counted once per sample, and
    the TP communication share (and its finding)."""
    ranks = timing.raw
    counts = dimension_counts([r.mesh_comm for r in ranks], layout)
    share, found = tp_communication(ranks, counts, timing.step_time_s,
                                    resolve_thresholds(limits))
    samples = samples_per_step(layout, [(r.rank, r.batch_size) for r in ranks])
    steps = timing.samples.get("step_s", ())
    per_step = {**timing.samples,
                "throughput": tuple(samples / s if s > 0 else 0.0 for s in steps)}
    return dataclasses.replace(
        timing, mesh=layout, mesh_counts=counts, tp_comm_share=share,
        bottlenecks=timing.bottlenecks + found,
        recommendations=recommendations(timing.bottlenecks + found, timing.batch_shares),
        throughput=samples / timing.step_time_s if timing.step_time_s > 0 else 0.0,
        samples=per_step, flops_per_step=flops_per_step([(r.rank, r.flops) for r in ranks]))
