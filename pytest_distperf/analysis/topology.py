"""Which node each rank runs on, the pair matrix of ``bench_pairs`` seen node by node, and
the devices of the ranks (:func:`device_summary`).

Ranks on one node talk through the node's own memory or loopback; ranks on different nodes
talk through the network.  :func:`split_by_node` keeps the two apart: intra-node and
inter-node figures, one :class:`NodeLink` per direction between two nodes, and the nodes
whose links are slow (:class:`SlowNode`).  The findings' wording is in
:mod:`pytest_distperf.analysis.findings`.  Pure: no torch, no pytest.

What a pair matrix can and cannot tell apart: a pair's round trip crosses both of its
nodes, so with two nodes every inter-node pair crosses both, and a slow network on either
one slows the same pairs.  Only the direction can differ (a node slow to send slows the
pairs it sends in; a delay slows both directions).  With three or more nodes the links
between the other nodes are the reference, and the node common to the slow links is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_distperf.common.bandwidth import gbps
from pytest_distperf.common.quantiles import median, median_or_nan, quantile_or_nan
from pytest_distperf.fixtures.results.group import (
    NodeLink,
    NodeSplit,
    PairMatrix,
    PairRow,
    SlowNode,
)

#: A rank's node rank where neither torchrun nor Slurm gave one: its host name names its node.
UNKNOWN_NODE_RANK = -1
#: A link's best-case bandwidth is this quantile of the per-iteration bandwidths of its rank
#: pairs: noise only slows a round trip down, so the fast end shows what the link can do.
FAST_QUANTILE = 0.75
#: A node is named slow when the best of its links in one direction reaches less than this
#: fraction of the typical link between the other nodes; a link is slow below this fraction
#: of the typical link.
SLOW_LINK_RATIO = 0.5


def node_names(rank_info: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """The node of each rank, as people read it: ``node 1 (gpu-17)`` from the node rank
    (torchrun's ``GROUP_RANK``, else Slurm's ``SLURM_NODEID``) and the host name, or the
    host name alone where no node rank was given.  Ranks share a node when they share a name.
    """
    names = []
    for info in rank_info:
        host = str(info.get("hostname", "") or "")
        node_rank = int(info.get("node_rank", UNKNOWN_NODE_RANK))
        if node_rank == UNKNOWN_NODE_RANK:
            names.append(host or "this host")
        else:
            names.append(f"node {node_rank} ({host})" if host else f"node {node_rank}")
    return tuple(names)


def ranks_by_node(nodes: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Node -> its ranks, in the order the nodes first appear."""
    out: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        out.setdefault(node, []).append(rank)
    return {node: tuple(ranks) for node, ranks in out.items()}


def spans_nodes(nodes: Sequence[str]) -> bool:
    return len(set(nodes)) > 1


def split_by_node(matrix: PairMatrix, nodes: Sequence[str]) -> NodeSplit:
    """The figures of :class:`NodeSplit` (without findings) for ``matrix``, whose rank r
    runs on ``nodes[r]``."""
    if len(nodes) < matrix.world_size:
        raise ValueError(f"the node of each of the {matrix.world_size} ranks is needed, "
                         f"got {len(nodes)}: {list(nodes)}")
    nodes = tuple(nodes[:matrix.world_size])
    intra = [p for p in matrix.pairs if nodes[p.src] == nodes[p.dst]]
    inter = [p for p in matrix.pairs if nodes[p.src] != nodes[p.dst]]
    by_link: dict[tuple[str, str], list[PairRow]] = {}
    for p in matrix.pairs:
        by_link.setdefault((nodes[p.src], nodes[p.dst]), []).append(p)
    links = tuple(_link(src, dst, rows, matrix.size_bytes)
                  for (src, dst), rows in by_link.items())
    slow_nodes = _slow_nodes([link for link in links if link.inter_node], nodes)
    named = {s.node for s in slow_nodes}
    rest = [link for link in links
            if link.inter_node and link.src not in named and link.dst not in named]
    typical = median(link.fast_gbps for link in rest) or 0.0
    slow_links = tuple(sorted((link for link in rest
                               if link.fast_gbps < SLOW_LINK_RATIO * typical),
                              key=lambda link: link.fast_gbps))
    return NodeSplit(
        matrix.label, matrix.size_bytes, matrix.world_size, nodes,
        median(p.busbw_gbps for p in intra), median(p.busbw_gbps for p in inter),
        median(p.time_us for p in intra), median(p.time_us for p in inter),
        _per_iteration(intra, matrix.size_bytes), _per_iteration(inter, matrix.size_bytes),
        links, slow_nodes, slow_links, typical)


def _link(src: str, dst: str, rows: Sequence[PairRow], size_bytes: int) -> NodeLink:
    every = [gbps(size_bytes, t) for p in rows for t in p.samples_us]
    return NodeLink(src, dst, len(rows), median_or_nan(p.busbw_gbps for p in rows),
                    median_or_nan(p.time_us for p in rows),
                    quantile_or_nan(every, FAST_QUANTILE))


def _per_iteration(rows: Sequence[PairRow], size_bytes: int) -> tuple[float, ...]:
    if not rows:
        return ()
    count = min(len(p.samples_us) for p in rows)
    return tuple(median_or_nan(gbps(size_bytes, p.samples_us[i]) for p in rows)
                 for i in range(count))


def _slow_nodes(links: Sequence[NodeLink], nodes: Sequence[str]) -> tuple[SlowNode, ...]:
    """The nodes whose every link in one direction is slow against the links between the
    other nodes, worst first.  Once a node is named its links are set aside, so a second
    node is named only on links that do not involve the first.  Needs three nodes: with
    two there are no links between other nodes to compare with."""
    by_node = ranks_by_node(nodes)
    named: list[SlowNode] = []
    while True:
        taken = {s.node for s in named}
        live = [link for link in links if link.src not in taken and link.dst not in taken]
        found: list[SlowNode] = []
        for node in by_node:
            if node in taken:
                continue
            others = [link.fast_gbps for link in live if node not in (link.src, link.dst)]
            typical = median(others)
            if typical is None or not typical > 0:
                continue
            slow = {}
            for direction, own in (("sends", [k for k in live if k.src == node]),
                                   ("receives", [k for k in live if k.dst == node])):
                best = max((link.fast_gbps for link in own), default=None)
                if best is not None and best < SLOW_LINK_RATIO * typical:
                    slow[direction] = best
            if slow:
                found.append(SlowNode(node, by_node[node], "sends" in slow, "receives" in slow,
                                      max(slow.values()), typical))
        if not found:
            return tuple(named)
        named.append(max(found, key=lambda s: s.factor))


#: A pair is slow below this fraction of a typical (75th-percentile) pair's bandwidth.
SLOW_PAIR_RATIO = 0.7


def slow_pairs(matrix: PairMatrix, ratio: float = SLOW_PAIR_RATIO) -> list[PairRow]:
    """Pairs below ``ratio`` x the typical pair, slowest first."""
    limit = ratio * matrix.typical_gbps
    return sorted((p for p in matrix.pairs if p.busbw_gbps < limit),
                  key=lambda p: p.busbw_gbps)


def suspect_ranks(matrix: PairMatrix, ratio: float = SLOW_PAIR_RATIO) -> list[int]:
    """Ranks with at least 3/4 of their own pairs slow: a device or its link.

    One bad device or link slows every pair it is in (the other ranks see it only in
    their pairs with that rank); one bad cable between two ranks slows only that pair,
    and then no rank is named.  Needs at least 3 ranks to tell.
    """
    if matrix.world_size < 3:
        return []
    slow = {(p.src, p.dst) for p in slow_pairs(matrix, ratio)}
    own = 2 * (matrix.world_size - 1)  # pairs each rank is in (as sender or receiver)
    return [rank for rank in range(matrix.world_size)
            if 4 * sum(1 for pair in slow if rank in pair) >= 3 * own]


# -- devices ---------------------------------------------------------------------------------
#: How a device summary begins when the ranks' devices are not all alike.
DIFFER = "the ranks' devices differ"


def device_summary(info: Sequence[Mapping[str, Any]]) -> str:
    """The ranks' devices in a line (``info``: each rank's facts, ``rank_info()``): each kind
    of device (model, memory where it is a GPU's) with how many ranks have it, and which
    ranks where they differ (:data:`DIFFER` begins the line then)."""
    kinds: dict[tuple[str, int], list[int]] = {}
    for i, facts in enumerate(info):
        key = (str(facts.get("device_model") or "unknown device"),
               int(facts.get("device_memory_bytes") or 0))
        kinds.setdefault(key, []).append(int(facts.get("rank", i)))
    parts = []
    for (model, memory), ranks in kinds.items():
        size = f", {memory / 2**30:.0f} GiB" if memory else ""
        which = f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        parts.append(f"{len(ranks)} x {model}{size}{which if len(kinds) > 1 else ''}")
    if len(kinds) < 2:
        return "".join(parts)
    return (f"{DIFFER}: {'; '.join(parts)}: their compute may differ as much "
            f"(batch_shares='auto' splits the batch by measured throughput)")
