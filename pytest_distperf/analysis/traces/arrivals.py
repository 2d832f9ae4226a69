"""Wait versus transfer, collective by collective.

On the merged clock (:func:`~pytest_distperf.analysis.traces.merge.merge_traces`), each
collective is matched across the ranks: by process group and position in that group's order
(the desync check has made sure every rank ran the same collectives in the same order).  A rank
*arrives* at a collective when it starts running it (its first kernel on a GPU, gloo's run on
CPU, else the call).  Then:

* the *transfer* time runs from the last rank's arrival to the end of the collective: the
  time the collective itself took, with nobody waiting any more;
* each rank's *wait* is the last arrival minus its own: time spent in the collective only
  because another rank was late;
* the *arrival skew* is the spread of the arrivals.

Ranks on one machine share one clock; ranks on different machines are as aligned as their
clocks (NTP: about a millisecond; PTP: microseconds), so skews below that say nothing there.
Pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pytest_distperf.analysis.traces.rank_timeline import CommOp, Timeline
from pytest_distperf.common.bandwidth import BUS_FACTORS, gbps
from pytest_distperf.common.names import P2P
from pytest_distperf.fixtures.results.profile import CollectiveTiming


def collective_timings(tls: Sequence[Timeline]) -> tuple[CollectiveTiming, ...]:
    """Every collective that all of ``tls``' ranks ran (send/recv left out: they pair
    differently), group by group in each group's order."""
    if len(tls) < 2:
        return ()
    per_rank: list[dict[str, list[CommOp]]] = []
    for tl in tls:
        groups: dict[str, list[CommOp]] = defaultdict(list)
        for op in tl.ops:
            if op.name not in P2P:
                groups[op.group].append(op)
        per_rank.append(groups)
    names = [tl.rank for tl in tls]
    out: list[CollectiveTiming] = []
    for group in sorted({g for groups in per_rank for g in groups}):
        sequences = [groups.get(group, []) for groups in per_rank]
        for index in range(min(len(s) for s in sequences)):
            ops = [s[index] for s in sequences]
            out.append(_timing(index, group, ops, names))
    return tuple(out)


def _timing(index: int, group: str, ops: Sequence[CommOp],
            names: Sequence[int]) -> CollectiveTiming:
    first = min(op.run_start_us for op in ops)
    arrivals = tuple((op.run_start_us - first) / 1e6 for op in ops)
    last = max(range(len(ops)), key=lambda i: (arrivals[i], -i))
    transfer = max(max(op.end_us for op in ops) - ops[last].run_start_us, 0.0) / 1e6
    name = ops[0].name
    nbytes = max(op.nbytes for op in ops)
    factor = BUS_FACTORS.get(name)
    busbw = (gbps(nbytes, transfer * 1e6) * factor(len(ops))
             if factor is not None and nbytes and transfer > 0 else math.nan)
    return CollectiveTiming(index=index, name=name, group=group, nbytes=nbytes,
                            arrivals_s=arrivals, last_rank=names[last], transfer_s=transfer,
                            busbw_gbps=busbw)
